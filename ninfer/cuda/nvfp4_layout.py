"""NVFP4 on the device: the artifact's planes rearranged once at upload for the decode GEMV's reads.

The artifact stores e2m1 codes row-major (``[rows, Kp/2]`` bytes, even column in the low nibble) and e4m3 block
scales ``[rows, Kp/16]`` (Kp = K rounded up to 128). On the device both planes are

* **tiled**: rows in groups of 16 (the plane padded with zero rows to a multiple of 16), each group stored K-tile
  by K-tile (128 k: 64 code bytes and 8 scale bytes per row), so the 16 rows x 128 k a warp reads per tile are one
  contiguous 1 KiB block of codes and 128 bytes of scales (measured on the H200, perf/gemv_variants.py: 5-12%
  faster decode GEMVs than 64-byte pieces of 32 rows); byte (row n, tile T, b) of the codes sits at
  ``(n - n % 16) * Kp/2 + T * 1024 + (n % 16) * 64 + b`` and of the scales at
  ``(n - n % 16) * Kp/16 + T * 128 + (n % 16) * 8 + b``;
* **bit-permuted** within each 32-bit word of 8 codes c0..c7 (word order and byte order otherwise kept), so that
  the bf16 pair (c_i, c_(i+4)) the GEMV multiplies comes out of a word in 1-2 integer operations (cuda_src/
  wformat.cuh ``nv4_pair``; the natural nibble order needs ~4): code c_j, j = i + 4h, keeps its magnitude bits
  (m, e0, e1) and sign at bits ``POS[i] + 16 h`` below.

Every device reader (wfrag.cuh, wdq.cuh, wformat.cuh) reads this layout; the reference backend and the artifact
keep the natural one. The group-int formats' scales have a tiled device layout of their own (qg64_layout.py), which
:func:`to_device_layout` applies too. Array code here is generic over numpy and cupy (``xp``) so the host tests use it too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ninfer.cuda import qg64_layout
from ninfer.cuda._common import array_module, padded_rows, tile_rows

__all__ = [
    "POS",
    "array_module",
    "device_planes",
    "has_device_layout",
    "natural_planes",
    "padded_rows",
    "tile_rows",
    "to_device_layout",
    "to_natural_layout",
]

TILE = 128
# pair i -> bit positions (in the low half) of its code's magnitude bits m, e0, e1 and its sign; the high half's
# code is the same + 16. Pairs 0-2: one shift (0, 3, 6 left) and the mask 0x81C081C0 place both codes as bf16
# e2m1 * 2^-126; pair 3 takes the 8 bits left over.
POS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))


def _perm() -> np.ndarray:
    """perm[natural bit] = device bit of a 32-bit word (natural: code j at bits 4j..4j+3)."""
    p = np.empty(32, np.int64)
    for j in range(8):
        i, h = j % 4, j // 4
        for t in range(4):
            p[4 * j + t] = POS[i][t] + 16 * h
    assert sorted(p) == list(range(32))
    return p


def _luts(perm: np.ndarray) -> np.ndarray:
    """[4, 256] uint32: the word bits byte b of value v contributes under ``perm``."""
    v = np.arange(256, dtype=np.uint32)
    out = np.zeros((4, 256), np.uint32)
    for b in range(4):
        for k in range(8):
            out[b] |= ((v >> np.uint32(k)) & np.uint32(1)) << perm[8 * b + k].astype(np.uint32)
    return out


_FWD = _luts(_perm())
_INV = _luts(np.argsort(_perm()))


def _permute_words(xp: Any, words: Any, luts: np.ndarray) -> Any:
    lut = xp.asarray(luts)
    out = lut[0][words & 0xFF]
    for b in range(1, 4):
        out |= lut[b][(words >> (8 * b)) & 0xFF]
    return out


def _fold_scale_signs(codes: Any, scales: Any) -> tuple[Any, Any]:
    """A negative block scale's sign moved into its 16 codes (value-exact: (-c) * |s| = c * s), so the device's
    scales are nonnegative (the decode GEMV places the scale's 7 magnitude bits only, cuda_src/wfrag.cuh). Quantizers
    write nonnegative scales: this only ever changes hostile or hand-made planes."""
    neg = (scales & np.uint8(0x80)) != 0
    if not bool(neg.any()):
        return codes, scales
    # both nibbles' sign bits of each of the block's 8 code bytes
    flip = neg.astype(np.uint8) * np.uint8(0x88)
    codes = (codes.reshape(-1, 8) ^ flip[:, None]).reshape(-1)
    return codes, scales & np.uint8(0x7F)


def device_planes(xp: Any, codes: Any, scales: Any, rows: int) -> tuple[Any, Any]:
    """Natural code and scale planes (flat uint8) of ``rows`` rows -> the device layout (flat, padded); negative
    block scales are folded into their codes (:func:`_fold_scale_signs`), everything else is a permutation."""
    codes, scales = _fold_scale_signs(codes, scales)
    words = tile_rows(xp, codes, rows, TILE // 2, False).view(np.uint32)
    return _permute_words(xp, words, _FWD).view(np.uint8), tile_rows(xp, scales, rows, TILE // 16, False)


def natural_planes(xp: Any, codes: Any, scales: Any, rows: int) -> tuple[Any, Any]:
    """The inverse of :func:`device_planes` (for planes without negative scales; folded signs stay in the codes)."""
    words = _permute_words(xp, codes.view(np.uint32), _INV).view(np.uint8)
    return tile_rows(xp, words, rows, TILE // 2, True), tile_rows(xp, scales, rows, TILE // 16, True)


def _rebuild(w: Any, to_device: bool) -> Any:
    """``w`` (an NVFP4 or NVFP4 row-global DeviceWeight) with its code and scale planes converted; planes are
    laid out codes, scales, global (the codec's order) at their new sizes."""
    xp, rows, data = array_module(w.data), w.rows, w.data
    kp = -(-w.cols // TILE) * TILE
    r_in = rows if to_device else padded_rows(rows)
    o0, o1, o2 = w.offsets
    codes, scales = data[o0 : o0 + r_in * kp // 2], data[o1 : o1 + r_in * kp // 16]
    conv = device_planes if to_device else natural_planes
    c, s = conv(xp, codes, scales, rows)
    # planes 256-byte aligned, as the codec lays them out (so the natural result is the codec's own bytes)
    pc, ps = xp.zeros(-c.size % 256, dtype=np.uint8), xp.zeros(-s.size % 256, dtype=np.uint8)
    out = xp.concatenate([c, pc, s, ps, data[o2:]])
    o1n = int(c.size + pc.size)
    return dataclasses.replace(w, data=out, offsets=(0, o1n, o1n + int(s.size + ps.size)))


def has_device_layout(fmt: str) -> bool:
    """Whether :func:`to_device_layout` rearranges weights of ``fmt`` (NVFP4, and Q4/Q5/Q6's scales)."""
    return fmt.startswith("NVFP4") or fmt in qg64_layout.TILED_FORMATS


def to_device_layout(w: Any) -> Any:
    """A weight in the artifact's layout -> the device layout: NVFP4's planes as above, Q4G64 / Q5G64 / Q6G64's
    tiled scales (ninfer/cuda/qg64_layout.py), other formats unchanged."""
    return _rebuild(w, True) if w.fmt.startswith("NVFP4") else qg64_layout.scales_to_device(w)


def to_natural_layout(w: Any) -> Any:
    """The inverse of :func:`to_device_layout` (fused projections concatenate natural rows, ninfer/cuda/fuse.py)."""
    return _rebuild(w, False) if w.fmt.startswith("NVFP4") else qg64_layout.scales_to_natural(w)
