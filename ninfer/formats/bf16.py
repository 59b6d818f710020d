"""Direct formats (layout ``contiguous-le-v1``): ``BF16``, ``FP32``, ``I32``.

C order, little-endian, no padding; size ``prod(shape) * {2, 4, 4}``. Words are bit-exact (NaN payloads, -0).
NumPy has no bfloat16, so BF16 words are kept as ``<u2`` and widened with ``(u32 << 16).view(f32)``.

BF16 encoding rounds float32 to nearest, ties to even, overflowing to +-inf like IEEE; a NaN stays a NaN of the
same sign (its top payload bits are kept and the quiet bit is set so truncation cannot turn it into an inf).
Error bound: ``|bf16_round(x) - x| <= 2^-8 * |x|`` for normal x (8 significant bits).

``I32`` decodes to int32 (not float32: token-id tables exceed float32's 24-bit integers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .common import Buffer, Format, FormatError

__all__ = ["bf16_encode", "bf16_decode", "bf16_round", "BF16Format", "FP32Format", "I32Format"]

CONTIGUOUS = "contiguous-le-v1"


def bf16_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 words (uint16), round to nearest even, NaN preserved."""
    xf = np.ascontiguousarray(x, dtype=np.float32)
    u = xf.view(np.uint32)
    # Adding 0x7FFF + lsb carries into bit 16 exactly when the dropped half is > 0.5 ulp or == 0.5 ulp with
    # an odd kept lsb; NaNs (which could wrap around) are replaced below.
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(xf)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | np.uint32(0x0040)).astype(np.uint16), rounded)
    return rounded


def bf16_decode(w: np.ndarray) -> np.ndarray:
    """bf16 words (uint16) -> float32, exact."""
    return (np.asarray(w, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 value (as float32)."""
    return bf16_decode(bf16_encode(x))


class _Direct(Format):
    layout = CONTIGUOUS
    word: np.dtype

    def encoded_size(self, shape: Sequence[int]) -> int:
        dims = self.check_shape(shape)
        return math.prod(dims) * self.word.itemsize

    def words(self, buf: Buffer, shape: Sequence[int]) -> np.ndarray:
        """The stored words as a view of ``shape`` (``<u2`` for BF16)."""
        return self.as_bytes(buf, shape).view(self.word).reshape(self.check_shape(shape))

    def decode(self, buf: Buffer, shape: Sequence[int]) -> np.ndarray:
        return self._widen(self.words(buf, shape))

    def decode_rows(self, buf: Buffer, shape: Sequence[int], r0: int, r1: int) -> np.ndarray:
        rows, cols = self.check_row_range(shape, r0, r1)
        flat = self.as_bytes(buf, shape)
        step = cols * self.word.itemsize
        return self._widen(flat[r0 * step : r1 * step].view(self.word).reshape(r1 - r0, cols))

    def _widen(self, w: np.ndarray) -> np.ndarray:
        return np.array(w, dtype=self.word.newbyteorder("="))


class BF16Format(_Direct):
    id = "BF16"
    word = np.dtype("<u2")

    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        arr = self.as_input(x, shape)
        return bf16_encode(arr).astype("<u2").reshape(-1).view(np.uint8)

    def _widen(self, w: np.ndarray) -> np.ndarray:
        return bf16_decode(w)


class FP32Format(_Direct):
    id = "FP32"
    word = np.dtype("<f4")

    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        return self.as_input(x, shape).astype("<f4").reshape(-1).view(np.uint8)


class I32Format(_Direct):
    id = "I32"
    word = np.dtype("<i4")

    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        arr = np.asarray(x)
        if arr.dtype.kind not in "iu":
            raise FormatError(f"I32: needs an integer array, got dtype {arr.dtype}")
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise FormatError("I32: value outside the int32 range")
        return self.as_input(arr, shape, dtype=np.int64).astype("<i4").reshape(-1).view(np.uint8)
