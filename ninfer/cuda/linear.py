"""Decode matrix products ``y = x · Wᵀ`` against stored-format weights (cuda_src/gemv.cu); the prefill GEMMs are
ninfer/cuda/gemm.py's.

- :func:`gemv`: decode, 1..8 activation rows on tensor cores (``mma.sync``, the rows as the 8 columns): weights
  dequantized in registers into exact bf16 operands, float32 activations split into two bf16 halves (relative
  representation error <= 2^-18), fp32 accumulation in a fixed order; each row's result is bitwise the same
  whatever the number of rows in the launch (an mma column depends only on its own activations).
- :func:`linear`: gemv for up to 8 rows, else :func:`ninfer.cuda.gemm.gemm`.

The launch geometry (instances, splits, shared memory) is ninfer/cuda/gemv_geometry.py's; the MoE expert launches
(``gemv_experts``, ``gemv_experts_routed``, ``gemv_experts_down_combine``, ``gemv_expert_lanes``) are
ninfer/cuda/gemv_experts.py's, through this module's operand checks (``_input``) and launch (``_gemv_launch``),
which read the launch switches below (``GV_CLUSTER``, ``_GV_PDL``) at every call.
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
from ninfer.cuda.gemv_geometry import (
    _GV_NB,
    _PF_FORMATS,
    FRAG_STRUCTS,
    GEMV_MAX_ROWS,
    SOURCES,
    GemvPlan,
    gemv_plan,
    w8_plan,
)
from ninfer.cuda.launch import capturing, launch_ex
from ninfer.cuda.loader import kernel
from ninfer.cuda.norm import Normed
from ninfer.cuda.weights import DeviceWeight

__all__ = [
    "gemv",
    "gemv_plan",
    "replan",
    "swiglu_out_ok",
    "GemvPlan",
    "w8_plan",
    "linear",
    "SOURCES",
    "GEMV_MAX_ROWS",
    "FRAG_STRUCTS",
    "GV_CLUSTER",
    "GV_CLUSTER_MAX",
    "GV_W8",
    "GV_W8_ONE",
    "GV_BULK",
]

# Decode GEMVs captured into CUDA graphs are launched with programmatic dependent launch (ninfer/cuda/launch.py): a
# GEMV's blocks start streaming their weights while the kernel before it finishes (measured on the H200 with
# perf/gemv_variants.py: 1-row NVFP4 GEMVs 4-15% faster in a chain; 27B decode x1 110 -> 120 tok/s).
_GV_PDL = True
# The K-split reduction (gemv.cu gv_store): "counter", each split's partials through a global workspace and the last
# block to arrive at a per-tile counter adds them; "cluster" (gv_store_cl), a row block's splits launched as one
# thread-block cluster (dims (1, splits, 1)) whose rank 0 adds the others' partials from their shared memory
# (DSMEM), no workspace, counter or atomic. Both add the same floats in the same order: the outputs are bitwise the
# same (tests/test_gemv_dense_host.py, tests/test_cuda_gemv_cluster.py), so the choice may differ per launch.
# GV_CLUSTER: "off" (the counter everywhere), "graph" (clusters for launches captured into CUDA graphs, which go
# through cuLaunchKernelEx anyway; eager launches stay plain CuPy launches with the counter: a ctypes launch costs
# more host time than the reduction saves, see launch.capturing) or "always" (eager launches too, through ctypes).
# Splits above GV_CLUSTER_MAX keep the counter (16: the non-portable cluster limit of sm_90, launch.py). Measured
# slower on the H200 (5853ba7, perf/gemv_variants.py --variants nocl,base,cluster: +5-10 us per GEMV, clusters of up
# to 13 blocks do not all fit at once; 27B decode x1 137.3 -> 110.5 tok/s with "graph"), so "off".
GV_CLUSTER = "off"
GV_CLUSTER_MAX = 16
# GV_W8: dense 5-8-lane products with float activations (no prefetch hint, no cluster) run gemv_w8.cu's 8-warp
# blocks: half the activation bytes per weight byte (docs/cuda.md, "Eight lanes"), the same bits. On: H100, 1aa242f,
# `python -m perf.bench_fold --toggle w8 --steps 100`, graph decode at 8K: 27B x8 14.03 -> 12.61 ms/step (1.11x),
# 35B-A3B x8 6.38 -> 6.19 (1.03x), x1 unchanged.
GV_W8 = True
# GV_W8_ONE: formats whose dense one-lane float products also take gemv_w8.cu's 8-warp blocks (the same bits: the
# 4-warp plan's splits). Measured (`python -m perf.gemv_variants --variants w8,w8one --rows 1`, 27B shapes, with the
# group-int cross-lane copies, H100 at 68cdc39+, perf/results/gemv_w8one_xlane_h100.txt): Q6G64 faster at every
# shape (q|gate 41.0 -> 35.0 us, gate|up 107.9 -> 99.3, down 54.8 -> 47.6, lm_head 608.6 -> 532.5); Q4G64 mixed
# (gate|up 60.0 -> 65.7, down 34.9 -> 30.1: a GDN layer's four products 142.3 -> 140.2), W8G32 and NVFP4 slower
# (H200, perf/results/gemv_w8one_h200.txt). So Q6G64 only.
GV_W8_ONE: frozenset[str] = frozenset({"Q6G64_F16S"})
# GV_BULK: NVFP4 launches (plain kernel, no cluster) fill their weight ring by bulk copies (gemv_bulk.cu,
# gemv_w8_bulk.cu; docs/cuda.md, "Bulk-copy weight ring"): the same bits. Off until measured.
GV_BULK = False


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
    route: tuple[Any, ...] = (), combine: tuple[Any, ...] = (), swiglu_out: bool = False,
    route_tail: tuple[Any, ...] = (),
) -> None:  # fmt: skip
    import cupy

    k = w.cols
    pf = () if swiglu_out or route_tail else pf or _prefetch_args(w, prefetch)  # those instances take no hint
    kind = (
        "_rt"
        if route
        else "_cb"
        if combine
        else "_gu"
        if swiglu_out
        else "_rr"
        if route_tail
        else "_pf"
        if pf
        else ""
    )
    graph = capturing()
    # the launch switches are read at every call (tests flip them), so they are part of the geometry's key
    bulk_rows = row0 % 16 == 0 and (n if ids is not None else 0) % 16 == 0
    plan, family, name, smem, cluster = _geometry(
        w.fmt, n, k, kind, graph, nb, t, ids is None, bulk_rows, GV_CLUSTER, GV_W8, GV_BULK, GV_W8_ONE
    )
    fn = kernel(family, SOURCES[family], name)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    gz = lanes if ids is not None else -(-lanes // nb)
    zin = gz if ids is None and gz > 1 and plan.blocks_x * gz < 2**31 else 0
    ws = cnt = null = _NULL  # pointer arguments the launch never reads
    split = plan.splits > 1 and not cluster
    # the split sums' counters, then (routing tail) one per lane block: one stream buffer
    if split or route_tail:
        counters = arrival_counters(gz * plan.blocks_x + (gz if route_tail else 0))
    if split:
        ws = cupy.empty(gz * plan.blocks_x * plan.splits * plan.rows * 8, dtype=np.float32)
        cnt = counters
    if route_tail:
        route_tail = (counters[gz * plan.blocks_x :], *route_tail)
    p0, p1, p2 = w.planes()
    part = fold if fold is not None else (a.part if a.part is not None else null)
    ldp = lanes if fold is not None else a.ldp
    mode = 2 if table else int(ids is not None)
    args = (
        p0, p1, p2, a.x, a.x if a.x2 is None else a.x2, out, null if ids is None or route else ids,  # routed: ids is the output
        null if xrow is None else xrow, ws, cnt,
        *_scalars(n, k, lanes, a.ldx, a.ldx2, ldy, row0, mode, a.xf, a.gd, zin), part,
        *_tail(ldp, a.npart, a.eps, int(fold is not None)), *pf, *route, *combine, *route_tail,
    )  # fmt: skip
    # several lane blocks of a dense product: lane blocks innermost (zin), one pass over the weights through L2
    grid = (plan.blocks_x * gz, plan.splits, 1) if zin else (plan.blocks_x, plan.splits, gz)
    pdl = _GV_PDL and graph  # gemv.cu waits (pdl_wait) before reading anything an earlier kernel writes
    if pdl or cluster:  # a cluster's blocks: the splits of one (row block, lane block | slot), rank = split
        c = (1, plan.splits, 1) if cluster else None
        launch_ex(fn, grid, (32 * plan.warps,), args, smem, pdl=pdl, cluster=c)
    else:
        fn(grid, (32 * plan.warps,), args, shared_mem=smem)


# A null device pointer for the arguments a launch never reads: the 8 bytes of 0 that an empty CuPy array's
# pointer is (it was ``cupy.empty(0)`` per launch, an allocation call each time).
_NULL = np.uint64(0)


@functools.lru_cache(maxsize=4096)
def _scalars(n: int, k: int, lanes: int, ldx: int, ldx2: int, ldy: int, row0: int, mode: int, xf: int, gd: int,
             zin: int) -> tuple[Any, ...]:  # fmt: skip
    """gemv.cu's scalar arguments from ``n`` to ``zin`` as the kernel's types (cached: the same few tuples recur
    every layer, and boxing 11 NumPy scalars costs more than the lookup)."""
    return (np.int32(n), np.int32(k), np.int32(lanes), np.int64(ldx), np.int64(ldx2), np.int64(ldy), np.int64(row0),
            np.int32(mode), np.int32(xf), np.int32(gd), np.int32(zin))  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _tail(ldp: int, npart: int, eps: float, fold: int) -> tuple[Any, ...]:
    """gemv.cu's scalars after ``part``: (ldp, npart, eps, fold) as the kernel's types (cached as ``_scalars``)."""
    return np.int64(ldp), np.int32(npart), np.float32(eps), np.int32(fold)


@functools.lru_cache(maxsize=4096)
def _geometry(
    fmt: str, n: int, k: int, kind: str, graph: bool, nb: int, t: str, dense: bool, bulk_rows: bool,
    gv_cluster: str, gv_w8: bool, gv_bulk: bool, gv_w8_one: frozenset[str] = frozenset(),
) -> tuple[GemvPlan, str, str, int, bool]:  # fmt: skip
    """A GEMV launch's (plan, family, kernel name, dynamic shared memory, cluster reduction), a function of these
    arguments only (``gv_*``: the switches GV_CLUSTER, GV_W8, GV_BULK; ``bulk_rows``: row0 and the rows per expert
    are multiples of 16; ``dense``: no expert ids). Cached: ~5 us of host time per launch otherwise."""
    plan = gemv_plan(fmt, n, k, dense)
    cluster = _cluster(plan, graph, gv_cluster)
    family = "gemv.cu"
    lanes_ok = nb == 8 or (nb == 1 and fmt in gv_w8_one)
    if gv_w8 and lanes_ok and t == "float" and kind in ("", "_gu") and dense and not cluster:
        family, plan = "gemv_w8.cu", w8_plan(plan, n)  # the fold's partials stay per 4-warp row block
    if kind in ("_gu", "_rr") and family == "gemv.cu":  # the experiments' instances: a family of their own
        family = "gemv_fused.cu"
    if gv_bulk and _bulk(fmt, kind, cluster, bulk_rows):
        family = _BULK_FAMILY[family]
    name = f"gemv_mma{kind}<{FRAG_STRUCTS[fmt][0]}, {t}, {nb}>"
    return plan, family, name, plan.smem_bytes(nb, t), cluster


def replan() -> None:
    """Drops every cached GEMV plan and launch geometry, for a benchmark or test that changes one of
    gemv_geometry's split-plan constants between launches."""
    gemv_plan.cache_clear()
    _geometry.cache_clear()


_BULK_FAMILY = {"gemv.cu": "gemv_bulk.cu", "gemv_w8.cu": "gemv_w8_bulk.cu"}


def _bulk(fmt: str, kind: str, cluster: bool, bulk_rows: bool) -> bool:
    """Whether a launch can take the bulk-copy weight ring (GV_BULK): NVFP4, the plain kernel (no prefetch,
    routing or combine tail) without clusters, and whole 16-row groups of the device layout per m-tile
    (``bulk_rows``: row0 and the rows per expert multiples of 16)."""
    return fmt in _PF_FORMATS and not kind and not cluster and bulk_rows


def _cluster(plan: GemvPlan, graph: bool, mode: str) -> bool:
    """Whether this launch reduces its K splits through a cluster (``mode``: GV_CLUSTER above) rather than the
    counter."""
    if mode not in ("off", "graph", "always"):
        raise KernelError(f"GV_CLUSTER={mode!r}: take 'off', 'graph' or 'always'")
    on = mode == "always" or (mode == "graph" and graph)
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
    swiglu_out: bool = False,
    route: tuple[int, int, int | None, Any, Any] | None = None,
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
    only, otherwise ignored). A hint: the result is bitwise the same.

    ``swiglu_out`` (the SwiGLU epilogue, gemv.cu gemv_mma_gu; float32 activations, ``w`` a fused [gate | up]
    weight of 2 I rows, ``swiglu_out_ok``): ``out[b] = silu(gate) * up`` ``[B, I]``, the bits a ``swiglu=True``
    product of the plain ``[B, 2 I]`` output would stage, so the next product reads half the activation bytes and
    applies no transform. ``prefetch`` is ignored there.

    ``route=(experts, top_k, shared, ids, weights)`` (the MoE router product with the routing in its tail, gemv.cu
    gemv_mma_rr; float32 rows): besides ``out``, writes what ``router.moe_route(out[:, :experts], top_k, shared)``
    returns into ``ids`` (int32, flat: ``[B * top_k]``, or ``[B * top_k + B]`` with the shared expert's id) and
    ``weights`` (float32 ``[B, top_k]``), the same bits, without a launch of its own. ``prefetch`` is ignored."""
    t, b, a = _input(x, w, "gemv", swiglu, gate)
    if swiglu_out and (
        t != "float" or fold is not None or row0 or n not in (None, w.rows) or not swiglu_out_ok(w)
    ):
        raise KernelError(
            f"gemv: swiglu_out takes float32 rows and all rows of a [gate | up] weight, no fold ({w.fmt} {w.shape})"
        )
    n = w.rows - row0 if n is None else n
    rt = () if route is None else _route_tail(route, t, b, n, fold, swiglu_out)
    if not (1 <= b <= GEMV_MAX_ROWS * 65535):
        raise KernelError(f"gemv: x has {b} rows; take 1..{GEMV_MAX_ROWS * 65535}")
    if row0 < 0 or n <= 0 or row0 + n > w.rows:
        raise KernelError(f"gemv: rows [{row0}, {row0 + n}) outside the weight's {w.rows} rows")
    if fold is not None:
        _check_fold(fold, out, t, w, b, n)
    out, ldy = matrix_out(x, out, b, n // 2 if swiglu_out else n)
    nb = (
        next(c for c in _GV_NB if b <= c) if b <= GEMV_MAX_ROWS else GEMV_MAX_ROWS
    )  # 1 | 2-4 | 5-8, blocks of 8
    if prefetch is not None and not isinstance(prefetch, DeviceWeight):
        raise KernelError(f"gemv: prefetch must be a DeviceWeight, got {type(prefetch).__name__}")
    _gemv_launch(
        a, w, out, b, ldy, ids=None, xrow=None, n=n, row0=row0, nb=nb, t=t, fold=fold, prefetch=prefetch,
        swiglu_out=swiglu_out, route_tail=rt,
    )  # fmt: skip
    return out


def _route_tail(
    route: tuple[Any, ...], t: str, b: int, n: int, fold: Any, swiglu_out: bool
) -> tuple[Any, ...]:
    """gemv_mma_rr's routing arguments after its counters (E, K, rows, shared, ids, weights), checked."""
    e, k, shared, ids, weights = route
    if t != "float" or fold is not None or swiglu_out:
        raise KernelError("gemv: route takes float32 rows, no fold and no swiglu_out")
    if not (1 <= e <= min(n, 256)) or not (1 <= k <= min(e, 32)):
        raise KernelError(
            f"gemv: route over {e} of {n} columns, top {k}: take E in 1..min(N, 256), k in 1..min(E, 32)"
        )
    check_array(ids, "ids", dtype=np.int32, shape=(b * k + (0 if shared is None else b),))
    check_array(weights, "weights", dtype=np.float32, shape=(b, k))
    return np.int32(e), np.int32(k), np.int32(b), np.int32(-1 if shared is None else shared), ids, weights


def swiglu_out_ok(w: Any) -> bool:
    """Whether ``gemv(x, w, swiglu_out=True)`` applies: one format, and every row block of the 4- and the 8-warp
    geometry (``w8_plan``: twice the rows) holds whole features (half its rows gate, half up; gemv.cu gv_wrow)."""
    return isinstance(w, DeviceWeight) and w.rows % (2 * gemv_plan(w.fmt, w.rows, w.cols).rows) == 0


def _check_fold(part: Any, out: Any, t: str, w: DeviceWeight, b: int, n: int) -> None:
    """The producer side of norm folding: float32 activations, the whole weight, ``out`` the float32 residual and
    ``part`` one float32 partial per (row block, row)."""
    if t != "float" or n != w.rows:
        raise KernelError("gemv: fold takes float32 activations and all rows of the weight")
    if out is None or out.dtype != np.float32:
        raise KernelError("gemv: fold needs out, the float32 residual [B, N]")
    check_array(part, "fold", dtype=np.float32, shape=(gemv_plan(w.fmt, n, w.cols).blocks_x, b))


def linear(x: Any, w: DeviceWeight, out: Any = None) -> Any:
    """gemv for up to 8 rows (decode), gemm above."""
    return gemv(x, w, out) if x.shape[0] <= GEMV_MAX_ROWS else gemm(x, w, out)
