"""GPU sampling building blocks (cuda_src/sampling.cu): masked greedy argmax and the counter-based uniform that
``ninfer.engine.sampler`` uses, bit for bit. Penalties, top-k/top-p/min-p sorting: not yet on the GPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import act_type, check_array, check_rows, grid_1d
from ninfer.cuda.loader import kernel

__all__ = ["argmax_masked", "counter_uniform", "SOURCES"]

SOURCES: dict[str, tuple[str, ...]] = {
    "sampling.cu": tuple(f"argmax_masked<{t}>" for t in ("float", "bf16")) + ("counter_uniform",)
}


def argmax_masked(logits: Any, mask: Any = None, *, limit: int | None = None) -> Any:
    """Greedy ids ``[B]`` (int32) of ``logits[B, V]`` over ids < ``limit`` allowed by the packed int32 bitmask
    ``mask[B, ceil(V/32)]``; ties to the lowest id; -1 where nothing is allowed."""
    import cupy

    t = act_type(logits, "logits")
    rows, v, ld = check_rows(logits, "logits")
    limit = v if limit is None else min(int(limit), v)
    ldm = 0
    if mask is not None:
        check_array(mask, "mask", dtype=np.int32, shape=(rows, -(-v // 32)))
        ldm = mask.shape[1]
    out = cupy.empty((rows,), dtype=np.int32)
    if rows:
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], f"argmax_masked<{t}>")
        null = np.uint64(0)  # a null pointer: no mask
        fn((rows,), (256,), (logits, mask if mask is not None else null, out, np.int32(v), np.int32(limit),
                             np.int64(ld), np.int64(ldm)))  # fmt: skip
    return out


def counter_uniform(seeds: Any, positions: Any) -> Any:
    """float64 uniforms in [0, 1) for uint64 ``seeds[n]`` and ``positions[n]`` (engine.sampler.uniform)."""
    import cupy

    check_array(seeds, "seeds", dtype=np.uint64, shape=(None,))
    n = seeds.shape[0]
    check_array(positions, "positions", dtype=np.uint64, shape=(n,))
    out = cupy.empty((n,), dtype=np.float64)
    if n:
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], "counter_uniform")
        fn((grid_1d(n, 256),), (256,), (seeds, positions, out, np.int32(n)))
    return out
