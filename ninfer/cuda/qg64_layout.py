"""Groupwise-int scales in a tiled device layout: an experiment of the decode GEMV (``GV_QG64_TSC``, off).

Q4G64 / Q5G64 / Q6G64 store their f16 group scales row-major (``[rows, Kp/64]``, Kp = K rounded up to 128), so
the GEMV's per-tile copy of a row's two scales (4 bytes) is one 32-byte sector per row: 8 sectors per warp
instruction for 32 useful bytes (measured with Nsight Compute, docs/cuda.md "Groupwise-integer weights": the L2
read 1.36x the DRAM bytes for Q4G64, 1.05x for NVFP4's tiled layout). Tiled as NVFP4's scales are (rows in groups
of 16, each group stored K-tile by K-tile), the 16 rows' scales of a tile are 64 contiguous bytes: byte (row n,
tile T, b) at ``((n >> 4) * Kp/128 + T) * 64 + (n & 15) * 4 + b``.

Only the decode GEMV built with ``#define GV_QG64_TSC 1`` (cuda_src/wfrag.cuh) reads this plane; the upload keeps
the row-major one, which the prefill kernels read, so :func:`with_tiled_scales` is for the GEMV's A/B
(perf/gemv_variants.py "tsc") and its tests. Generic over numpy and cupy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ninfer.cuda._common import array_module
from ninfer.cuda.nvfp4_layout import tile_rows

__all__ = ["TILED_FORMATS", "tiled_scales", "with_tiled_scales"]

TILED_FORMATS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S")
_TILE_BYTES = 4  # a row's scales of one 128-wide K-tile: two f16


def tiled_scales(xp: Any, plane: Any, rows: int) -> Any:
    """A row-major scale plane (flat uint8, ``rows`` rows) -> the tiled order (flat uint8, rows padded to 16 with
    zero scales: the GEMV clamps rows past the last to it, so the padding is never read)."""
    return tile_rows(xp, plane, rows, _TILE_BYTES, False)


def with_tiled_scales(w: Any) -> Any:
    """``w`` (a Q4G64 / Q5G64 / Q6G64 DeviceWeight) with its scale plane (p2) replaced by the tiled one, appended
    after the existing bytes 256-byte aligned; the code planes are unchanged."""
    if w.fmt not in TILED_FORMATS:
        raise ValueError(f"{w.fmt}: tiled group scales are for {', '.join(TILED_FORMATS)}")
    xp, rows, data = array_module(w.data), w.rows, w.data
    kp = -(-w.cols // 128) * 128
    o2 = w.offsets[2]
    plane = data[o2 : o2 + rows * (kp // 64) * 2]
    tiled = tiled_scales(xp, plane, rows)
    pad = xp.zeros(-data.size % 256, dtype=np.uint8)
    out = xp.concatenate([data, pad, tiled])
    return dataclasses.replace(w, data=out, offsets=(w.offsets[0], w.offsets[1], int(data.size + pad.size)))
