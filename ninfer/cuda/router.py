"""MoE router (cuda_src/router.cu): fp32 softmax over all experts, top-k with ties to the lower id, renormalised."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, act_type, check_rows, grid_1d
from ninfer.cuda.launch import launch
from ninfer.cuda.loader import kernel

__all__ = ["moe_route", "SOURCES", "MAX_EXPERTS"]

MAX_EXPERTS = 256  # 32 lanes x MAXE=8
SOURCES: dict[str, tuple[str, ...]] = {"router.cu": tuple(f"moe_route<{t}, 8>" for t in ("float", "bf16"))}


def moe_route(logits: Any, top_k: int, shared: int | None = None) -> tuple[Any, Any]:
    """Expert ids ``[T, k]`` (int32, best first) and weights ``[T, k]`` (float32, summing to 1) for ``logits[T, E]``.

    NaN probabilities rank last: ids are always k distinct experts in ``[0, E)``; a row that selects one gets NaN
    weights (the expert kernels index weights by these ids, so an id is never out of range). With ``shared`` (the
    shared expert's slot id, E) the ids are one flat ``[T * k + T]`` slot list instead: the routed ids row-major,
    then ``shared`` once per row."""
    import cupy

    t = act_type(logits, "logits")
    rows, e, ld = check_rows(logits, "logits")
    if not (1 <= e <= MAX_EXPERTS):
        raise KernelError(f"logits: {e} experts; the router handles 1..{MAX_EXPERTS}")
    if not (1 <= top_k <= min(e, 32)):
        raise KernelError(f"top_k={top_k} must be in 1..min(E, 32)")
    if shared is not None and not (0 <= shared < 2**31):
        raise KernelError(f"shared={shared}: must be a non-negative expert id")
    ids = cupy.empty((rows, top_k) if shared is None else (rows * (top_k + 1),), dtype=np.int32)
    weights = cupy.empty((rows, top_k), dtype=np.float32)
    if rows:
        fn = kernel("router.cu", SOURCES["router.cu"], f"moe_route<{t}, 8>")
        sh = np.int32(-1 if shared is None else shared)
        launch(  # router.cu waits (pdl_wait) before its first read
            fn,
            (grid_1d(rows, 4),),
            (128,),
            (logits, ids, weights, np.int32(rows), np.int32(e), np.int32(top_k), np.int64(ld), sh),
        )
    return ids, weights
