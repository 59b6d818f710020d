"""MoE router (cuda_src/router.cu): fp32 softmax over all experts, top-k with ties to the lower id, renormalised."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, act_type, check_array, check_rows, grid_1d
from ninfer.cuda.launch import launch
from ninfer.cuda.loader import kernel

__all__ = ["moe_route", "moe_sort", "expert_tiles", "SOURCES", "MAX_EXPERTS"]

MAX_EXPERTS = 256  # 32 lanes x MAXE=8
SOURCES: dict[str, tuple[str, ...]] = {
    "router.cu": (*(f"moe_route<{t}, 8>" for t in ("float", "bf16")), "moe_sort", "expert_tiles")
}
_SORT_THREADS = 1024  # MS_NT in cuda_src/router.cu
_TILE_THREADS, _TILE_EXPERTS = 256, 1024  # ET_NT, ET_NT * ET_PER


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


def moe_sort(flat: Any, n: int, top_k: int, experts: int) -> tuple[Any, Any, Any]:
    """A prefill chunk's slots sorted by expert, in one launch (router.cu ``moe_sort``): for the routed pairs
    ``flat[:n]`` (int32, pair i = token i // top_k, ids in ``[0, experts)``) ordered by id, ties by position (the
    order of a stable argsort), ``(ids, xrow, where)``: each slot's expert and token row and each pair's slot; the
    entries ``flat[n:]`` (the shared expert's, one per token) follow unsorted with rows 0, 1, ... (``ids`` and
    ``xrow`` have ``flat.size`` entries, ``where`` n)."""
    import cupy

    check_array(flat, "flat", dtype=np.int32)
    ns = flat.shape[0]
    if flat.ndim != 1 or not (0 <= n <= ns) or top_k < 1 or n % top_k:
        raise KernelError(f"moe_sort: flat of {flat.shape}, n={n}, top_k={top_k}")
    if not (1 <= experts <= MAX_EXPERTS):
        raise KernelError(f"moe_sort: {experts} experts (1..{MAX_EXPERTS})")
    ids, xrow = cupy.empty(ns, np.int32), cupy.empty(ns, np.int32)
    where = cupy.empty(n, np.int32)
    if ns:
        fn = kernel("router.cu", SOURCES["router.cu"], "moe_sort")
        args = (flat, ids, xrow, where, np.int32(n), np.int32(ns), np.int32(top_k), np.int32(experts))
        fn((1,), (_SORT_THREADS,), args, shared_mem=32 * 4 * experts)
    return ids, xrow, where


def expert_tiles(ids: Any, e: int, bm: int) -> tuple[Any, Any, Any, Any, int]:
    """The grouped expert GEMM's tile table for slots sorted by expert (``ids`` int32 on the device, non-decreasing
    in ``[0, e)``), in one launch without a host sync (router.cu ``expert_tiles``): (row offset per expert
    ``[e + 1]``, expert and first slot of each of the ``bound`` = ceil(S / bm) + e tiles, the tile count ``[1]``,
    bound). Expert e owns slots ``off[e] .. off[e + 1]`` in ``ceil(count / bm)`` tiles of ``bm`` rows."""
    import cupy

    check_array(ids, "ids", dtype=np.int32)
    if ids.ndim != 1 or not (1 <= e <= _TILE_EXPERTS) or bm < 1:
        raise KernelError(f"expert_tiles: ids {ids.shape}, {e} experts (1..{_TILE_EXPERTS}), bm={bm}")
    s = int(ids.shape[0])
    bound = -(-s // bm) + e
    off, ntiles = cupy.empty(e + 1, np.int32), cupy.empty(1, np.int32)
    tile_e, tile_s0 = cupy.empty(bound, np.int32), cupy.empty(bound, np.int32)
    fn = kernel("router.cu", SOURCES["router.cu"], "expert_tiles")
    args = (ids, np.int32(s), np.int32(e), np.int32(bm), np.int32(bound), off, tile_e, tile_s0, ntiles)
    fn((1,), (_TILE_THREADS,), args)  # a plain launch: it reads ids without pdl_wait
    return off, tile_e, tile_s0, ntiles, bound
