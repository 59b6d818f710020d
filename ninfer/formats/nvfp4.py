"""E2M1 codec and ``NVFP4G16_E4M3S`` (layout ``nvfp4-rows-k128-v1``), docs/formats.md §5 and §6.

E2M1: sign, 2-bit exponent (bias 1), 1-bit mantissa; magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0;
rounding is RNE on this grid, saturating at 6 (ModelOpt's thresholds .25/.75/1.25/1.75/2.5/3.5/5 with ties at
.75, 1.75, 3.5 rounding up are the same function).

NVFP4 for ``[N, K]`` (rank > 2: ``prod(shape[:-1])`` rows), all arithmetic float32:
- ``g = amax(|W|) / (6 * 448)`` over the whole tensor (stored f32);
- per 16-column block b of a row: ``s_b = e4m3(amax_b / (6 * g))`` (RNE, saturating at 448); an all-zero or
  padding block has scale code 0; any other block's scale is at least 2^-9 (code 1);
- ``d_b = f32(s_b * g)``, ``c = e2m1(x / d_b)``; decode ``w = e2m1(c) * d_b``.
- A tensor with ``0 < amax < 2^-100`` is encoded as all zeros (its d_b would leave float32's normal range).
Planes (each 256-aligned): codes u8 ``[N, K_pad/2]`` (even column in the low nibble) @0, e4m3 scales u8
``[N, K_pad/16]`` @ ``align_up(N*K_pad/2, 256)``, f32 global @ ``sc + align_up(N*K_pad/16, 256)``;
``K_pad = align_up(K, 128)``; padding columns have code 0. Total = global offset + 4.

Error bound (tested): per element ``|w - x| <= d_b + max(0, |x| - 6 * d_b)`` (half the widest grid step, plus
saturation); for blocks whose scale is an e4m3 normal (``amax_b >= 2^-6 * 6g``) this gives
``|w - x| <= amax_b * (1 + 2^-4) / 6 + amax_b / 16`` and exact values at zero. Non-finite input is rejected.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .common import Buffer, Format, align_up, padded_row_chunks
from .fp8 import e4m3_decode, e4m3_encode

__all__ = ["e2m1_encode", "e2m1_decode", "E2M1_VALUES", "NVFP4Format"]

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
E2M1_VALUES.flags.writeable = False
_BLOCK = 16
_FLUSH = np.float32(2.0**-100)


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """float -> e2m1 codes (uint8, 0..15): RNE on the grid, saturating at 6; sign kept (-0 -> code 8)."""
    xf = np.asarray(x, dtype=np.float32)
    a = np.abs(xf)
    # Each comparison adds one grid step; '>' at a midpoint whose lower neighbour has an even mantissa (tie goes
    # down), '>=' where the upper neighbour is even (tie goes up).
    mag = (
        (a > 0.25).astype(np.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    )
    return mag.astype(np.uint8) | (np.signbit(xf).astype(np.uint8) << 3)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """e2m1 codes (low 4 bits) -> float32, exact."""
    return E2M1_VALUES[np.asarray(codes, dtype=np.uint8) & 0xF]


class NVFP4Format(Format):
    id = "NVFP4G16_E4M3S"
    layout = "nvfp4-rows-k128-v1"
    min_rank = 2

    def geometry(self, shape: Sequence[int]) -> dict[str, int]:
        rows, cols = self.rows_cols(shape)
        kpad = align_up(cols, 128)
        sc = align_up(rows * kpad // 2, 256)
        gl = sc + align_up(rows * kpad // _BLOCK, 256)
        return {"rows": rows, "cols": cols, "kpad": kpad, "sc": sc, "gl": gl, "total": gl + 4}

    def encoded_size(self, shape: Sequence[int]) -> int:
        return self.geometry(shape)["total"]

    def views(self, buf: Buffer, shape: Sequence[int]) -> dict[str, np.ndarray]:
        """Plane views: ``codes`` u8 ``[N, K_pad/2]``, ``scale`` u8 e4m3 ``[N, K_pad/16]``, ``global`` <f4 ``[1]``."""
        geo = self.geometry(shape)
        b = self.as_bytes(buf, shape)
        n, kp = geo["rows"], geo["kpad"]
        return {
            "codes": b[: n * kp // 2].reshape(n, kp // 2),
            "scale": b[geo["sc"] : geo["sc"] + n * kp // _BLOCK].reshape(n, kp // _BLOCK),
            "global": b[geo["gl"] : geo["total"]].view("<f4"),
        }

    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        arr = self.as_input(x, shape)
        self.check_finite(arr)
        geo = self.geometry(arr.shape)
        out = np.zeros(geo["total"], dtype=np.uint8)
        v = self.views(out, arr.shape)
        x2 = arr.reshape(geo["rows"], geo["cols"])
        amax = np.float32(np.abs(x2).max())
        if amax < _FLUSH:
            return out  # all scales, codes and g are zero
        g = np.float32(amax / np.float32(6 * 448))
        v["global"][0] = g
        six_g = np.float32(6) * g
        kp = geo["kpad"]
        for a, blk in padded_row_chunks(x2, kp):
            b = a + blk.shape[0]
            blocks = blk.reshape(blk.shape[0], kp // _BLOCK, _BLOCK)
            amax_b = np.abs(blocks).max(axis=-1)
            sc = e4m3_encode(amax_b / six_g)
            sc = np.where(amax_b == 0, np.uint8(0), np.maximum(sc, np.uint8(1)))  # clamp >= 2^-9
            d = e4m3_decode(sc) * g
            c = e2m1_encode(blocks / np.where(d == 0, np.float32(1), d)[..., None])
            c = np.where((d == 0)[..., None], np.uint8(0), c).reshape(blk.shape[0], kp)
            v["scale"][a:b] = sc
            v["codes"][a:b] = c[:, 0::2] | (c[:, 1::2] << 4)
        return out

    def decode_rows(self, buf: Buffer, shape: Sequence[int], r0: int, r1: int) -> np.ndarray:
        _, cols = self.check_row_range(shape, r0, r1)
        v = self.views(buf, shape)
        g = v["global"].astype(np.float32)[0]
        packed = v["codes"][r0:r1]
        c = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
        c[:, 0::2] = packed & 0xF
        c[:, 1::2] = packed >> 4
        d = e4m3_decode(v["scale"][r0:r1]) * g
        w = e2m1_decode(c).reshape(d.shape[0], d.shape[1], _BLOCK) * d[..., None]
        return w.reshape(d.shape[0], packed.shape[1] * 2)[:, :cols]
