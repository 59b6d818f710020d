"""Decode matrix products ``y = x · Wᵀ`` against stored-format weights (cuda_src/gemv.cu); the prefill GEMMs are
ninfer/cuda/gemm.py's.

- :func:`gemv`: decode, 1..8 activation rows on tensor cores (``mma.sync``, the rows as the 8 columns): weights
  dequantized in registers into exact bf16 operands, float32 activations split into two bf16 halves (relative
  representation error <= 2^-18), fp32 accumulation in a fixed order; each row's result is bitwise the same
  whatever the number of rows in the launch (an mma column depends only on its own activations).
- :func:`gemv_experts`: MoE decode dispatch, one (token row, expert) pair per slot; bitwise the plain gemv's rows.
- :func:`gemv_expert_lanes`: MoE prefill of short chunks, up to 4 or 8 rows of one expert per slot from a device
  slot table (ninfer/cuda/moe_lanes.py); every row bitwise its :func:`gemv_experts` result.
- :func:`linear`: gemv for up to 8 rows, else :func:`ninfer.cuda.gemm.gemm`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.cuda._common import (
    KernelError,
    act_type,
    arrival_counters,
    check_array,
    check_rows,
    matrix_out,
)
from ninfer.cuda.gemm import gemm
from ninfer.cuda.launch import capturing, launch_ex
from ninfer.cuda.loader import kernel
from ninfer.cuda.norm import Normed
from ninfer.cuda.weights import DeviceWeight

__all__ = [
    "gemv",
    "gemv_experts",
    "gemv_experts_routed",
    "gemv_experts_down_combine",
    "gemv_expert_lanes",
    "gemv_plan",
    "GemvPlan",
    "linear",
    "SOURCES",
    "GEMV_MAX_ROWS",
    "FRAG_STRUCTS",
    "GV_CLUSTER",
    "GV_CLUSTER_MAX",
]

GEMV_MAX_ROWS = 8  # the mma's N

# format id -> the tensor-core GEMV's fragment reader (cuda_src/wfrag.cuh), its 16-row m-tiles per warp (F::MT)
# and its 16-byte shared-memory vectors per lane and pipeline stage (F::VECS)
FRAG_STRUCTS = {
    "BF16": ("FragBF16", 1, 8),
    "FP8E4M3_F32ROW": ("FragFP8<true>", 2, 8),
    "FP8E4M3_F32T": ("FragFP8<false>", 2, 8),
    "NVFP4G16_E4M3S": ("FragNVFP4", 2, 5),
    "NVFP4G16_E4M3S_ROWG": ("FragNVFP4RowG", 2, 5),
    "Q4G64_F16S": ("FragQG64<4>", 2, 7),
    "Q5G64_F16S": ("FragQG64<5>", 2, 7),
    "Q6G64_F16S": ("FragQG64<6>", 2, 7),
    "W8G32_F16S": ("FragW8G32", 2, 10),
}
_GV_WARPS, _GV_THREADS, _GV_STAGES = 4, 128, 4  # GV_WARPS, GV_STAGES in gemv.cu
# lane-block instances: one activation row, up to 4, up to 8 (same arithmetic per row: a row's bits never depend on
# the instance). The 4-row one stages half the 8-row one's activations per tile; the staging is what made 2-8 rows
# cost up to 1.45x one row (float activations: split, converted and stored per block), so 2-4 rows (a speculative
# verify of k = 3 at one lane, 2-4 lanes of decode) run it.
_GV_NB = (1, 4, 8)
_GV_TILE = 128  # K per tile
# Splits are picked from (format, N, K) only, never from the GPU or the number of rows, so results are the same
# on every device and for every batch. K is split across blocks to give every matrix about one wave of blocks on a
# 132-SM H200 (4 resident blocks of 4 warps per SM: 528; the dequantization needs ~16 warps per SM to hide its
# latency), keeping >= 4 tiles per split; split s of S takes tiles [s T / S, (s + 1) T / S). Measured (H200, NVFP4,
# one row, perf/bench_gemv.py): a grid 6% over one wave (560 blocks, the down projection) ran 8% slower than 520,
# while 3% over (544, gate|up) beat the half-empty single split by 13%, hence a 5% allowance then; fewer than 4
# tiles per split was slower on every shape. Those timings were taken while the 1-lane NVFP4 block fitted only 3 per
# SM (see below); with 4 per SM, gate|up does better still as several waves (below), and no other shape of the 27B
# or the 35B-A3B used the allowance, so a wave is now exactly 528 blocks. The
# activations are staged in double-buffered chunks of GV_CHUNK tiles, so shared memory does not grow with K.
# 2-8 lanes stage 2 tiles per chunk (8 KB per buffer of float activations): with 4 their 72 KB block left room
# for 3 blocks per SM, not 4 (228 KB per SM, 1 KB of it reserved per block), like the 1-lane NVFP4 block did with
# a 4-byte static flag beside its 56 KB (gemv.cu now keeps it in the dynamic buffer).
_GV_WAVE_BLOCKS, _GV_MIN_TILES, _GV_CHUNK, _GV_CHUNK4, _GV_CHUNK1 = 528, 4, 2, 4, 16  # 4 x 132; gemv.cu's
# A grid that one wave would fill to less than 3/4 (a wide matrix whose row blocks alone are more than half a wave)
# takes splits of _GV_MULTI_TILES tiles instead, when that makes at least two waves: measured on the H200 at d82349e
# (perf/gemv_variants.py gu3/gu5/gu8, perf/results/device_run_d82349e.txt), the 27B gate|up (272 row blocks) at one
# row took 44.0 us as 2 splits (544 blocks: 16 of them a second wave; 1 split, 272 blocks: 55.2 us), 41.4 as 3,
# 40.6 as 5 (8 tiles each), 42.8 as 8. It is the only 27B or 35B-A3B shape the rule changes.
_GV_WAVE_FILL, _GV_MULTI_TILES = 0.75, 8
# Stream-K (one wave of equal blocks over the row-major (row block, K-tile) units) was tried instead of the splits
# and removed: on the H200 at 7fefbde (perf/gemv_variants.py, 27B NVFP4) only gate|up gained (39.9 vs 41.2 us at
# one row); a block's pieces crossing row blocks restart the activation staging and the pipeline, which cost more
# than the partial wave saved (gdn qkv|z 22.3 vs 19.9 us at one row, 43.7 vs 33.8 at eight; lm_head 236 vs 224).
# Decode GEMVs captured into CUDA graphs are launched with programmatic dependent launch (ninfer/cuda/launch.py): a
# GEMV's blocks start streaming their weights while the kernel before it finishes (measured on the H200 with
# perf/gemv_variants.py: 1-row NVFP4 GEMVs 4-15% faster in a chain; 27B decode x1 110 -> 120 tok/s).
_GV_PDL = True
# The K-split reduction (gemv.cu gv_store): "counter", each split's partials through a global workspace and the last
# block to arrive at a per-tile counter adds them; "cluster" (gv_store_cl), a row block's splits launched as one
# thread-block cluster (dims (1, splits, 1)) whose rank 0 adds the others' partials from their shared memory
# (DSMEM), no workspace, counter or atomic. Both add the same floats in the same order: the outputs are bitwise the
# same (tests/test_gemv_lanes_host.py, tests/test_cuda_gemv_cluster.py), so the choice may differ per launch.
# GV_CLUSTER: "off" (the counter everywhere), "graph" (clusters for launches captured into CUDA graphs, which go
# through cuLaunchKernelEx anyway; eager launches stay plain CuPy launches with the counter: a ctypes launch costs
# more host time than the reduction saves, see launch.capturing) or "always" (eager launches too, through ctypes).
# Splits above GV_CLUSTER_MAX keep the counter (16: the non-portable cluster limit of sm_90, launch.py). Measured
# slower on the H200 (5853ba7, perf/gemv_variants.py --variants nocl,base,cluster: +5-10 us per GEMV, clusters of up
# to 13 blocks do not all fit at once; 27B decode x1 137.3 -> 110.5 tok/s with "graph"), so "off".
GV_CLUSTER = "off"
GV_CLUSTER_MAX = 16
_TYPES = ("float", "bf16")
# formats whose next product the GEMV can prefetch into L2 (gemv.cu gemv_mma_pf: the NVFP4 device layout)
_PF_FORMATS = frozenset(f for f, (s, _, _) in FRAG_STRUCTS.items() if s.startswith("FragNVFP4"))
SOURCES: dict[str, tuple[str, ...]] = {
    "gemv.cu": tuple(
        f"gemv_mma<{s}, {t}, {nb}>" for s, _, _ in FRAG_STRUCTS.values() for t in _TYPES for nb in _GV_NB
    )
    + tuple(
        f"gemv_mma_pf<{FRAG_STRUCTS[f][0]}, {t}, {nb}>"
        for f in sorted(_PF_FORMATS)
        for t in _TYPES
        for nb in _GV_NB
    )
    + tuple(dict.fromkeys(f"gemv_mma_rt<{s}, float, 1>" for s, _, _ in FRAG_STRUCTS.values()))
    + tuple(dict.fromkeys(f"gemv_mma_cb<{s}, float, 1>" for s, _, _ in FRAG_STRUCTS.values())),
}


@dataclass(frozen=True, slots=True)
class GemvPlan:
    """Launch geometry of the tensor-core GEMV for one (format, N, K): ``rows`` weight rows per block,
    ``blocks_x`` row blocks, ``splits`` balanced K-splits of the ``ntiles`` 128-wide tiles."""

    rows: int
    blocks_x: int
    splits: int
    ntiles: int
    stage_bytes: int  # one warp's pipeline stage of weights

    def tiles(self, split: int) -> range:
        """The K-tiles of ``split`` (gemv.cu: [s T / S, (s + 1) T / S))."""
        return range(split * self.ntiles // self.splits, (split + 1) * self.ntiles // self.splits)

    def smem_bytes(self, nb: int, t: str) -> int:
        """Two activation chunk buffers (per tile 8 steps x nb lanes x 4 threads x 8|16 bytes), then GV_STAGES
        weight stages per warp."""
        chunk = _GV_CHUNK1 if nb == 1 else (_GV_CHUNK4 if nb <= 4 else _GV_CHUNK)
        act = 2 * chunk * 8 * nb * 4 * (16 if t == "float" else 8)
        return act + _GV_WARPS * _GV_STAGES * self.stage_bytes


@functools.cache
def gemv_plan(fmt: str, n: int, k: int) -> GemvPlan:
    """The GEMV's geometry for a weight of format ``fmt`` with ``n`` rows and ``k`` columns (see _GV_* above)."""
    _, mt, vecs = FRAG_STRUCTS[fmt]
    rows = _GV_WARPS * mt * 16
    ntiles, bx = -(-k // _GV_TILE), -(-n // rows)
    splits = max(1, min(_GV_WAVE_BLOCKS // bx, ntiles // _GV_MIN_TILES))
    many = ntiles // _GV_MULTI_TILES
    if bx * splits < _GV_WAVE_FILL * _GV_WAVE_BLOCKS and bx * many >= 2 * _GV_WAVE_BLOCKS:
        splits = many  # one wave would leave SMs idle: several waves of small blocks balance themselves
    return GemvPlan(rows=rows, blocks_x=bx, splits=splits, ntiles=ntiles, stage_bytes=vecs * 512)


@dataclass(frozen=True, slots=True)
class _Input:
    """The GEMV's activation operand: ``x`` rows of stride ``ldx`` read from column 0, optionally transformed while
    staging (gemv.cu: 0 plain, 1 SwiGLU with the up half at ``x2``, 2 output gate read from ``x2`` per head of
    ``gd`` columns, 3|4 folded RMS norm: ``x`` the float32 residual, ``x2`` the norm weight, ``part`` the
    producer's ``npart`` partial sums of squares per row, row stride ``ldp``)."""

    x: Any
    ldx: int
    xf: int = 0
    x2: Any = None
    ldx2: int = 0
    gd: int = 8
    part: Any = None
    ldp: int = 0
    npart: int = 0
    eps: float = 0.0


def _normed(h: Normed, k: int, what: str) -> tuple[str, int, _Input]:
    """The operand of a GEMV reading a folded norm (float32 only)."""
    m, _, ldr = check_rows(h.res, "residual", k, vec8=True)
    if h.res.dtype != np.float32:
        raise KernelError(f"{what}: a folded norm's residual must be float32, got {h.res.dtype}")
    check_array(h.w, "norm weight", dtype=np.float32, shape=(k,))
    check_array(h.part, "partials", dtype=np.float32, shape=(None, m))  # [producer row blocks, rows]
    if h.part.shape[0] < 1:
        raise KernelError(f"{what}: partials of no row block")
    a = _Input(h.res, ldr, 3 if h.offset else 4, h.w, 0, 8, h.part, m, int(h.part.shape[0]), float(h.eps))
    return "float", m, a


def _input(
    x: Any, w: DeviceWeight, what: str, swiglu: bool, gate: tuple[Any, int] | None
) -> tuple[str, int, _Input]:
    """(activation type, rows, operand) of a GEMV input; checks shapes, dtypes and alignment."""
    if not isinstance(w, DeviceWeight):
        raise KernelError(f"{what}: w must be a DeviceWeight, got {type(w).__name__}")
    k = w.cols
    if k % 8:
        raise KernelError(f"{what}: K={k} must be a multiple of 8")
    if isinstance(x, Normed):
        if swiglu or gate is not None:
            raise KernelError(f"{what}: a folded norm takes no other input transform")
        return _normed(x, k, what)
    t = act_type(x, "x")
    if swiglu:
        m, _, ldx = check_rows(x, "x", 2 * k, vec8=True)
        return t, m, _Input(x, ldx, 1, x[:, k:], ldx, 8)
    m, _, ldx = check_rows(x, "x", k, vec8=True)
    if gate is None:
        return t, m, _Input(x, ldx)
    qg, d = gate
    if d % 8 or k % d:
        raise KernelError(f"{what}: head_dim={d} must be a multiple of 8 dividing K={k}")
    if qg.dtype != x.dtype or qg.shape[0] != m:
        raise KernelError(f"gate: must be {x.dtype} [{m}, {2 * k}]")
    _, _, ldq = check_rows(qg, "gate", 2 * k, vec8=True)
    return t, m, _Input(x, ldx, 2, qg[:, d:], ldq, d)


def _gemv_launch(
    a: _Input, w: DeviceWeight, out: Any, lanes: int, ldy: int, *, ids: Any, xrow: Any, n: int, row0: int,
    nb: int, t: str, table: bool = False, fold: Any = None, prefetch: Any = None, pf: tuple[Any, ...] = (),
    route: tuple[Any, ...] = (), combine: tuple[Any, ...] = (),
) -> None:  # fmt: skip
    import cupy

    k = w.cols
    plan = gemv_plan(w.fmt, n, k)
    pf = pf or _prefetch_args(w, prefetch)
    kind = "_rt" if route else "_cb" if combine else "_pf" if pf else ""
    name = f"gemv_mma{kind}<{FRAG_STRUCTS[w.fmt][0]}, {t}, {nb}>"
    fn = kernel("gemv.cu", SOURCES["gemv.cu"], name)
    smem = plan.smem_bytes(nb, t)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    gz = lanes if ids is not None else -(-lanes // nb)
    zin = gz if ids is None and gz > 1 and plan.blocks_x * gz < 2**31 else 0
    null = cupy.empty(0, dtype=np.int32)  # pointer arguments the launch never reads
    ws = cnt = null
    graph = capturing()
    cluster = _cluster(plan, graph)
    if plan.splits > 1 and not cluster:
        ws = cupy.empty(gz * plan.blocks_x * plan.splits * plan.rows * 8, dtype=np.float32)
        cnt = arrival_counters(gz * plan.blocks_x)
    p0, p1, p2 = w.planes()
    part = fold if fold is not None else (a.part if a.part is not None else null)
    ldp = lanes if fold is not None else a.ldp
    args = (
        p0, p1, p2, a.x, a.x if a.x2 is None else a.x2, out, null if ids is None or route else ids,  # routed: ids is the output
        null if xrow is None else xrow, ws, cnt, np.int32(n), np.int32(k), np.int32(lanes), np.int64(a.ldx),
        np.int64(a.ldx2), np.int64(ldy), np.int64(row0), np.int32(2 if table else ids is not None), np.int32(a.xf),
        np.int32(a.gd), np.int32(zin), part, np.int64(ldp), np.int32(a.npart), np.float32(a.eps),
        np.int32(fold is not None), *pf, *route, *combine,
    )  # fmt: skip
    # several lane blocks of a dense product: lane blocks innermost (zin), one pass over the weights through L2
    grid = (plan.blocks_x * gz, plan.splits, 1) if zin else (plan.blocks_x, plan.splits, gz)
    pdl = _GV_PDL and graph  # gemv.cu waits (pdl_wait) before reading anything an earlier kernel writes
    if pdl or cluster:  # a cluster's blocks: the splits of one (row block, lane block | slot), rank = split
        launch_ex(
            fn, grid, (_GV_THREADS,), args, smem, pdl=pdl, cluster=(1, plan.splits, 1) if cluster else None
        )
    else:
        fn(grid, (_GV_THREADS,), args, shared_mem=smem)


def _cluster(plan: GemvPlan, graph: bool) -> bool:
    """Whether this launch reduces its K splits through a cluster (GV_CLUSTER above) rather than the counter."""
    if GV_CLUSTER not in ("off", "graph", "always"):
        raise KernelError(f"GV_CLUSTER={GV_CLUSTER!r}: take 'off', 'graph' or 'always'")
    on = GV_CLUSTER == "always" or (GV_CLUSTER == "graph" and graph)
    return on and 1 < plan.splits <= GV_CLUSTER_MAX


def _prefetch_args(w: DeviceWeight, nxt: Any) -> tuple[Any, ...]:
    """gemv_mma_pf's (q0, q1, qn, qk, qbx, qsplits): the next product's planes and grid; empty (gemv_mma, no
    prefetch) unless both weights are NVFP4 (the same rows per block)."""
    if nxt is None or w.fmt not in _PF_FORMATS or nxt.fmt not in _PF_FORMATS:
        return ()
    plan = gemv_plan(nxt.fmt, nxt.rows, nxt.cols)
    q0, q1, _ = nxt.planes()
    return (q0, q1, np.int32(nxt.rows), np.int32(nxt.cols), np.int32(plan.blocks_x), np.int32(plan.splits))


def gemv(
    x: Any,
    w: DeviceWeight,
    out: Any = None,
    *,
    row0: int = 0,
    n: int | None = None,
    swiglu: bool = False,
    gate: tuple[Any, int] | None = None,
    fold: Any = None,
    prefetch: DeviceWeight | None = None,
) -> Any:
    """``out[b] = x[b] · W[row0 : row0+n]ᵀ`` for ``x[B, K]``; ``n`` defaults to all rows of ``w``. Decode takes
    B <= 8 (the 1-, 4- or 8-row instance); more rows run as 8-row blocks of one launch, each row bitwise its decode
    result.

    Fused input steps (bitwise the product of the standalone kernel's output, activation.py): ``swiglu``: ``x`` is
    a ``[B, 2K]`` [gate | up] row and the product's input is ``silu(gate) * up``; ``gate=(qg, head_dim)``: the
    input is ``x * sigmoid(gate)`` with the gate read from the q|gate projection ``qg[B, 2K]`` ([query | gate] per
    head). ``x`` a ``norm.Normed``: the input is that folded RMS norm (docs/cuda.md, "Norm folding").

    ``fold`` (norm folding, producer side; float32 only, all rows of ``w``): ``out`` is the float32 residual
    ``[B, N]`` and receives ``out += x · Wᵀ`` in place; ``fold`` (float32 ``[gemv_plan(...).blocks_x, B]``) receives
    each row block's sum of squares of the updated residual per row, for the next GEMV's ``Normed`` input.

    ``prefetch``: the weight of the product launched next (a decode chain): the blocks that finish last fetch the
    first K-tiles of its first wave into L2 while this launch drains (gemv.cu, gv_prefetch_next; NVFP4 weights
    only, otherwise ignored). A hint: the result is bitwise the same."""
    t, b, a = _input(x, w, "gemv", swiglu, gate)
    n = w.rows - row0 if n is None else n
    if not (1 <= b <= GEMV_MAX_ROWS * 65535):
        raise KernelError(f"gemv: x has {b} rows; take 1..{GEMV_MAX_ROWS * 65535}")
    if row0 < 0 or n <= 0 or row0 + n > w.rows:
        raise KernelError(f"gemv: rows [{row0}, {row0 + n}) outside the weight's {w.rows} rows")
    if fold is not None:
        _check_fold(fold, out, t, w, b, n)
    out, ldy = matrix_out(x, out, b, n)
    nb = (
        next(c for c in _GV_NB if b <= c) if b <= GEMV_MAX_ROWS else GEMV_MAX_ROWS
    )  # 1 | 2-4 | 5-8, blocks of 8
    if prefetch is not None and not isinstance(prefetch, DeviceWeight):
        raise KernelError(f"gemv: prefetch must be a DeviceWeight, got {type(prefetch).__name__}")
    _gemv_launch(
        a, w, out, b, ldy, ids=None, xrow=None, n=n, row0=row0, nb=nb, t=t, fold=fold, prefetch=prefetch
    )
    return out


def _check_fold(part: Any, out: Any, t: str, w: DeviceWeight, b: int, n: int) -> None:
    """The producer side of norm folding: float32 activations, the whole weight, ``out`` the float32 residual and
    ``part`` one float32 partial per (row block, row)."""
    if t != "float" or n != w.rows:
        raise KernelError("gemv: fold takes float32 activations and all rows of the weight")
    if out is None or out.dtype != np.float32:
        raise KernelError("gemv: fold needs out, the float32 residual [B, N]")
    check_array(part, "fold", dtype=np.float32, shape=(gemv_plan(w.fmt, n, w.cols).blocks_x, b))


def gemv_experts(
    x: Any,
    w: DeviceWeight,
    ids: Any,
    xrow: Any,
    n: int,
    out: Any = None,
    *,
    swiglu: bool = False,
    prefetch: DeviceWeight | None = None,
) -> Any:
    """MoE decode: ``out[s] = x[xrow[s]] · W_e[ids[s]]ᵀ`` with ``w`` the fused ``[E*n, K]`` expert weight
    (``swiglu``: ``x`` rows are [gate | up], as in :func:`gemv`). ``prefetch``: the next expert product's fused
    weight (the down projection ``[E*n2, K2]``): each slot's blocks fetch its expert's rows of it into L2 at their
    start (gemv.cu, gv_prefetch_expert; NVFP4 weights only, otherwise ignored). A hint: the result is bitwise the
    same."""
    t, _, a = _input(x, w, "gemv_experts", swiglu, None)
    check_array(ids, "ids", dtype=np.int32, shape=(None,))
    slots = ids.shape[0]
    check_array(xrow, "xrow", dtype=np.int32, shape=(slots,))
    if n <= 0 or w.rows % n:
        raise KernelError(f"gemv_experts: weight rows {w.rows} are not a whole number of experts of {n} rows")
    if slots > 65535:
        raise KernelError(f"gemv_experts: {slots} slots; take at most 65535 per launch")
    out, ldy = matrix_out(x, out, slots, n)
    if slots == 0:
        return out
    pf = _prefetch_expert_args(w, n, prefetch)
    _gemv_launch(a, w, out, slots, ldy, ids=ids, xrow=xrow, n=n, row0=0, nb=1, t=t, pf=pf)
    return out


def gemv_experts_routed(
    x: Any,
    w: DeviceWeight,
    logits: Any,
    top_k: int,
    xrow: Any,
    n: int,
    out: Any,
    ids: Any,
    weights: Any,
    *,
    shared: int | None = None,
    prefetch: DeviceWeight | None = None,
) -> Any:
    """MoE decode with the routing inside the expert launch (gemv.cu ``gemv_mma_rt``): the product of
    :func:`gemv_experts` for the slots that ``router.moe_route(logits[:, :E], top_k, shared)`` would list, which it
    also writes: ``ids`` (int32 ``[T*k]``, or ``[T*k + T]`` with the shared expert's slots, one per token) and
    ``weights`` (float32 ``[T, k]``), the same bits as moe_route's. ``logits``: float32 ``[T, >= E]`` rows (the
    router's product; E = ``w.rows // n`` routed experts, or one less with ``shared``, the shared expert's id E),
    ``xrow`` the slots' token rows (routed slot s is choice s % k of token xrow[s]). One launch instead of two."""
    import cupy

    t, _, a = _input(x, w, "gemv_experts_routed", False, None)
    if t != "float":
        raise KernelError("gemv_experts_routed: float32 activations only")
    tok, _, lde = check_rows(logits, "logits")
    if logits.dtype != np.float32:
        raise KernelError(f"logits: float32 router rows, got {logits.dtype}")
    e = w.rows // n - (shared is not None)
    if n <= 0 or w.rows % n or not (1 <= e <= 256) or (shared is not None and shared != e):
        raise KernelError(f"gemv_experts_routed: {w.rows} weight rows of {n} per expert (shared={shared})")
    if not (1 <= top_k <= min(e, 32)) or logits.shape[1] < e:
        raise KernelError(f"gemv_experts_routed: top_k={top_k}, logits {tuple(logits.shape)} for {e} experts")
    slots = tok * top_k + (tok if shared is not None else 0)
    check_array(ids, "ids", dtype=np.int32, shape=(slots,))
    check_array(weights, "weights", dtype=np.float32, shape=(tok, top_k))
    check_array(xrow, "xrow", dtype=np.int32, shape=(slots,))
    if slots > 65535:
        raise KernelError(f"gemv_experts_routed: {slots} slots; take at most 65535 per launch")
    out, ldy = matrix_out(x, out, slots, n)
    if tok == 0:
        return out
    none = cupy.empty(0, dtype=np.uint8)  # a null pointer: no hint
    pf = _prefetch_expert_args(w, n, prefetch)[:4] or (none, none, np.int32(0), np.int32(0))
    route = (logits, np.int64(lde), np.int32(e), np.int32(top_k), np.int32(tok * top_k), np.int32(-1 if shared is None else shared), ids, weights)  # fmt: skip
    _gemv_launch(a, w, out, slots, ldy, ids=ids, xrow=xrow, n=n, row0=0, nb=1, t=t, pf=pf, route=route)
    return out


def gemv_experts_down_combine(
    gu: Any,
    w: DeviceWeight,
    ids: Any,
    slot: Any,
    dn: Any,
    *,
    where: Any,
    ew: Any,
    sh: Any,
    sg: Any,
    ldsg: int,
    residual: Any,
    weight: Any,
    eps: float,
    offset: bool,
    out: Any,
) -> bool:
    """A decode MoE layer's down projection with the combine and the next RMS norm in its tail (gemv.cu
    ``gemv_mma_cb``): ``dn = gemv_experts(gu, w, ids, slot, H, swiglu=True)``, then, as ``norm.moe_combine_rmsnorm``
    with the same bits, ``residual += combine`` and ``out = rmsnorm(residual)`` per token, by the last of the token's
    blocks. The slots are the decode tables': routed slot s is choice s % k of token s // k (``where`` = that slot
    order), then one shared-expert slot per token when ``sh`` is ``dn``'s tail. Returns False without launching
    when the launch does not apply (not float32, H > 2048 or not a multiple of 8, K splits, rows not 16-byte
    aligned): the caller runs the two launches."""
    t, _, a = _input(gu, w, "gemv_experts_down_combine", True, None)
    slots, h, lddn = check_rows(dn, "dn")
    ldsh, ldr, ldo = (
        check_rows(x, name, h)[2] for x, name in ((sh, "sh"), (residual, "residual"), (out, "out"))
    )
    tok, k = where.shape
    per = slots // tok if tok else 0
    aligned = all(int(x.data.ptr) % 16 == 0 and ld % 4 == 0
                  for x, ld in ((dn, lddn), (sh, ldsh), (residual, ldr), (out, ldo), (weight, 0)))  # fmt: skip
    plan = gemv_plan(w.fmt, h, w.cols)
    if (
        t != "float" or dn.dtype != np.float32 or lddn != h or h % 8 or h > 2048 or not aligned or plan.splits != 1
        or tok == 0 or per not in (k, k + 1) or slots != tok * per or slots > 65535 or w.rows % h
    ):  # fmt: skip
        return False
    check_array(where, "where", dtype=np.int32, shape=(tok, k))
    check_array(ew, "ew", dtype=np.float32, shape=(tok, k))
    check_array(weight, "weight", dtype=np.float32, shape=(h,))
    combine = (
        arrival_counters(tok), np.int32(plan.blocks_x * per), np.int32(k), np.int32(tok * k), where, ew, sh,
        np.int64(ldsh), sg, np.int64(ldsg), residual, np.int64(ldr), weight, out, np.int64(ldo), np.float32(eps),
        np.int32(offset),
    )  # fmt: skip
    _gemv_launch(a, w, dn, slots, lddn, ids=ids, xrow=slot, n=h, row0=0, nb=1, t=t, combine=combine)
    return True


def _prefetch_expert_args(w: DeviceWeight, n: int, nxt: Any) -> tuple[Any, ...]:
    """gemv_mma_pf's trailing arguments for an expert launch: the next expert weight's planes, its rows per expert
    and its K (qbx, qsplits unused); empty unless both weights are NVFP4."""
    if nxt is None:
        return ()
    if not isinstance(nxt, DeviceWeight):
        raise KernelError(f"prefetch: expected a DeviceWeight, got {type(nxt).__name__}")
    if w.fmt not in _PF_FORMATS or nxt.fmt not in _PF_FORMATS:
        return ()
    experts = w.rows // n
    if nxt.rows % experts or (nxt.rows // experts) % 16:
        raise KernelError(f"prefetch: {nxt.rows} rows are not {experts} experts of a multiple of 16 rows")
    q0, q1, _ = nxt.planes()
    return (q0, q1, np.int32(nxt.rows // experts), np.int32(nxt.cols), np.int32(0), np.int32(0))


def gemv_expert_lanes(
    x: Any, w: DeviceWeight, sid: Any, table: Any, n: int, out: Any, *, nb: int, swiglu: bool = False
) -> Any:
    """MoE prefill, expert lanes (gemv.cu, experts == 2): slot ``z`` multiplies up to ``nb`` (4 or 8) rows by expert
    ``sid[z]`` (-1: an empty slot), lane ``g`` reading ``x[table[z, 0, g]]`` and writing ``out[table[z, 1, g]]``
    (-1 past the slot's rows); ``table`` int32 ``[Z * 2 * nb]`` from ``moe_lanes.expert_lanes``, whose rows must lie
    inside ``x`` and ``out`` (device data: not checked here). ``swiglu`` as in :func:`gemv`. Each row is bitwise
    its :func:`gemv_experts` product."""
    t, _, a = _input(x, w, "gemv_expert_lanes", swiglu, None)
    if nb not in (4, 8):
        raise KernelError(f"gemv_expert_lanes: nb={nb}; the 4- or 8-lane instance")
    check_array(sid, "sid", dtype=np.int32, shape=(None,))
    slots = sid.shape[0]
    check_array(table, "table", dtype=np.int32, shape=(slots * 2 * nb,))
    if n <= 0 or w.rows % n:
        raise KernelError(
            f"gemv_expert_lanes: weight rows {w.rows} are not a whole number of experts of {n} rows"
        )
    if slots > 65535:
        raise KernelError(f"gemv_expert_lanes: {slots} slots; take at most 65535 per launch")
    if out is None or out.dtype != x.dtype:
        raise KernelError(f"gemv_expert_lanes: out must be a {x.dtype} array addressed by the table")
    _, _, ldy = check_rows(out, "out", n)
    if slots:
        _gemv_launch(a, w, out, slots, ldy, ids=sid, xrow=table, n=n, row0=0, nb=nb, t=t, table=True)
    return out


def linear(x: Any, w: DeviceWeight, out: Any = None) -> Any:
    """gemv for up to 8 rows (decode), gemm above."""
    return gemv(x, w, out) if x.shape[0] <= GEMV_MAX_ROWS else gemm(x, w, out)
