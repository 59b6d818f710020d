"""FP8 e4m3fn codec and the FP8 weight formats ``FP8E4M3_F32ROW`` / ``FP8E4M3_F32T``.

E4M3 (e4m3fn): sign, 4-bit exponent (bias 7), 3-bit mantissa; no inf; ``S.1111.111`` is NaN; max 448, min normal
2^-6, min subnormal 2^-9. ``e4m3_encode`` rounds to nearest, ties to even, saturates finite and infinite
magnitudes to 448 and maps NaN to the NaN code of its sign.

Formats (our identities, docs/formats.md §6; rows = ``prod(shape[:-1])``, rank >= 2):
- ``FP8E4M3_F32ROW``, layout ``fp8-rows-v1``: u8 codes ``[N, K]`` @0, f32 LE row scales ``[N]`` @
  ``align_up(N*K, 256)``. ``scale = amax_row / 448`` (f32), ``code = e4m3(x / scale)``, ``w = e4m3(code)*scale``.
  An all-zero row has scale 0 and zero codes.
- ``FP8E4M3_F32T``, layout ``fp8-tensor-v1``: u8 codes ``[N*K]`` @0, one f32 scale @ ``align_up(N*K, 256)``,
  ``scale = amax / 448`` over the whole tensor.

Error bound (tested): ``|w - x| <= 2^-4 * |x| + 2^-10 * scale`` (+ float32 rounding of the divide/multiply):
relative 2^-4 for scaled magnitudes >= 2^-6, absolute half a subnormal step below that.
Non-finite input is rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np

from .common import CHUNK_ELEMS, Buffer, Format, align_up

__all__ = ["e4m3_encode", "e4m3_decode", "e4m3_table", "FP8RowFormat", "FP8TensorFormat", "E4M3_MAX"]

E4M3_MAX = 448.0
_E4M3_NAN = 0x7F
_E4M3_MAXCODE = 0x7E
_TINY = np.float32(2.0**-149)  # rescue for a scale that underflows float32 while amax > 0


@cache
def e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn codes (codes 0x7F/0xFF are NaN). Read-only."""
    c = np.arange(256, dtype=np.int64)
    e, m = (c >> 3) & 0xF, c & 7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * np.exp2(e - 7.0))
    val = np.where(c >= 128, -mag, mag)
    out = val.astype(np.float32)
    out[(e == 15) & (m == 7)] = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)  # signed NaNs
    out.flags.writeable = False
    return out


@cache
def _midpoints() -> np.ndarray:
    pos = e4m3_table()[: _E4M3_MAXCODE + 1].astype(np.float64)  # 0 .. 448, increasing
    out = (pos[:-1] + pos[1:]) / 2
    out.flags.writeable = False
    return out


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> e4m3fn codes (uint8): RNE, saturating at 448, NaN -> NaN code."""
    xf = np.asarray(x, dtype=np.float32)
    a = np.abs(xf)
    mids = _midpoints()
    idx = np.searchsorted(mids, a, side="left")  # mids[idx-1] < a <= mids[idx]: value idx unless a tie
    tie = (idx < mids.size) & (mids[np.minimum(idx, mids.size - 1)] == a) & (idx % 2 == 1)
    code = (idx + tie).astype(np.uint8)  # a tie goes to the even code (mantissa lsb 0)
    code[np.isnan(a)] = _E4M3_NAN
    return code | (np.signbit(xf).astype(np.uint8) << 7)


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    """e4m3fn codes (uint8) -> float32, exact."""
    return e4m3_table()[np.asarray(codes, dtype=np.uint8)]


def _row_scales(amax: np.ndarray) -> np.ndarray:
    scale = (amax / np.float32(E4M3_MAX)).astype(np.float32)
    return np.where((scale == 0) & (amax > 0), _TINY, scale).astype(np.float32)


def _scaled_codes(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """e4m3 codes of ``x / scale`` (scale broadcast per row); zero scale gives zero codes."""
    safe = np.where(scale == 0, np.float32(1), scale)
    q = e4m3_encode(x / safe)
    return np.where(scale == 0, np.uint8(0), q)


class _FP8(Format):
    min_rank = 2

    def _planes(self, rows: int, cols: int) -> tuple[int, int]:
        """(scale plane offset, total size)."""
        off = align_up(rows * cols, 256)
        return off, off + 4 * self._nscales(rows)

    def _nscales(self, rows: int) -> int:
        raise NotImplementedError

    def encoded_size(self, shape: Sequence[int]) -> int:
        return self._planes(*self.rows_cols(shape))[1]

    def views(self, buf: Buffer, shape: Sequence[int]) -> dict[str, np.ndarray]:
        """Plane views: ``codes`` u8 ``[N, K]`` and ``scale`` f32 (``[N]`` or ``[1]``)."""
        rows, cols = self.rows_cols(shape)
        b = self.as_bytes(buf, shape)
        off, end = self._planes(rows, cols)
        return {"codes": b[: rows * cols].reshape(rows, cols), "scale": b[off:end].view("<f4")}

    def decode_rows(self, buf: Buffer, shape: Sequence[int], r0: int, r1: int) -> np.ndarray:
        self.check_row_range(shape, r0, r1)
        v = self.views(buf, shape)
        scale = self._scale_rows(v["scale"].astype(np.float32), r0, r1)
        return e4m3_decode(v["codes"][r0:r1]) * scale

    def _scale_rows(self, plane: np.ndarray, r0: int, r1: int) -> np.ndarray:
        raise NotImplementedError

    def _encode_rows(self, x: np.ndarray, scale_of_rows: np.ndarray | np.float32) -> np.ndarray:
        rows, cols = x.shape
        off, end = self._planes(rows, cols)
        out = np.zeros(end, dtype=np.uint8)
        codes = out[: rows * cols].reshape(rows, cols)
        step = max(1, CHUNK_ELEMS // cols)
        for a in range(0, rows, step):  # row chunks bound the temporaries
            s = scale_of_rows[a : a + step, None] if np.ndim(scale_of_rows) else scale_of_rows
            codes[a : a + step] = _scaled_codes(x[a : a + step], s)
        out[off:end] = np.atleast_1d(np.asarray(scale_of_rows, dtype="<f4")).view(np.uint8)
        return out


class FP8RowFormat(_FP8):
    id = "FP8E4M3_F32ROW"
    layout = "fp8-rows-v1"

    def _nscales(self, rows: int) -> int:
        return rows

    def _scale_rows(self, plane: np.ndarray, r0: int, r1: int) -> np.ndarray:
        return plane[r0:r1, None]

    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        arr = self.as_input(x, shape)
        self.check_finite(arr)
        x2 = arr.reshape(-1, arr.shape[-1])
        return self._encode_rows(x2, _row_scales(np.abs(x2).max(axis=1)))


class FP8TensorFormat(_FP8):
    id = "FP8E4M3_F32T"
    layout = "fp8-tensor-v1"

    def _nscales(self, rows: int) -> int:
        return 1

    def _scale_rows(self, plane: np.ndarray, r0: int, r1: int) -> np.ndarray:
        return plane[0]

    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        arr = self.as_input(x, shape)
        self.check_finite(arr)
        x2 = arr.reshape(-1, arr.shape[-1])
        return self._encode_rows(x2, _row_scales(np.abs(x2).max(keepdims=True).reshape(()))[()])
