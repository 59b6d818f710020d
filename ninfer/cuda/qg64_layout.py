"""Groupwise-int scales on the device: Q4G64 / Q5G64 / Q6G64's f16 group scales tiled once at upload.

The artifact stores a row's scales row-major (``[rows, Kp/64]`` f16, Kp = K rounded up to 128), so the decode
GEMV's per-tile copy of a row's two scales (4 bytes) was one 32-byte sector per row: 8 sectors per warp instruction
for 32 useful bytes (Nsight Compute: the L2 read 1.36x the DRAM bytes of Q4G64's gate | up GEMV, 1.05x for NVFP4's
tiled planes). On the device the plane is tiled as NVFP4's scales are: rows in groups of 16 (padded with zero
rows to a multiple of 16), each group stored K-tile by K-tile, so the 16 rows' scales of a 128-k tile are 64
contiguous bytes: byte (row n, tile T, b) at ``((n >> 4) * Kp/128 + T) * 64 + (n & 15) * 4 + b``
(cuda_src/wformat.cuh ``qg_scale_word``, which every device reader uses). Measured on the H100 (docs/cuda.md,
"Groupwise-integer weights"): a 27B layer's Q4G64 / Q5G64 / Q6G64 decode GEMVs at one row in 0.89 / 0.85 / 0.91 of
the row-major plane's time.

The code planes and W8G32 (its own GEMV reads 8-byte scale runs) keep the artifact's layout. A 3-D expert stack
tiles its flattened rows, so an expert of a multiple of 16 rows keeps the byte range it had. Array code here is
generic over numpy and cupy (``xp``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ninfer.cuda._common import array_module, padded_rows, tile_rows

__all__ = ["TILED_FORMATS", "natural_scales", "scales_to_device", "scales_to_natural", "tiled_scales"]

TILED_FORMATS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S")
_TILE_BYTES = 4  # a row's scales of one 128-wide K-tile: two f16


def tiled_scales(xp: Any, plane: Any, rows: int) -> Any:
    """A row-major scale plane (flat uint8, ``rows`` rows) -> the tiled order (flat uint8, rows padded to 16 with
    zero scales: no reader asks for a padding row's scales)."""
    return tile_rows(xp, plane, rows, _TILE_BYTES, False)


def natural_scales(xp: Any, plane: Any, rows: int) -> Any:
    """The inverse of :func:`tiled_scales` (the padding rows dropped)."""
    return tile_rows(xp, plane, rows, _TILE_BYTES, True)


def _rebuild(w: Any, to_device: bool) -> Any:
    if w.fmt not in TILED_FORMATS:
        return w
    xp, rows, data = array_module(w.data), w.rows, w.data
    kp = -(-w.cols // 128) * 128
    o2 = w.offsets[2]
    # the scale plane is the codec's last (formats/groupint.py): the code planes keep their bytes and offsets
    have = (rows if to_device else padded_rows(rows)) * (kp // 64) * 2
    if data.size - o2 != have:
        raise ValueError(
            f"{w.fmt} {list(w.shape)}: {data.size - o2} scale bytes, not the {have} of {rows} rows"
        )
    conv = tiled_scales if to_device else natural_scales
    return dataclasses.replace(w, data=xp.concatenate([data[:o2], conv(xp, data[o2:], rows)]))


def scales_to_device(w: Any) -> Any:
    """A Q4G64 / Q5G64 / Q6G64 weight in the artifact's layout -> its scales tiled (other formats unchanged)."""
    return _rebuild(w, True)


def scales_to_natural(w: Any) -> Any:
    """The inverse of :func:`scales_to_device` (fused projections concatenate natural rows, ninfer/cuda/fuse.py)."""
    return _rebuild(w, False)
