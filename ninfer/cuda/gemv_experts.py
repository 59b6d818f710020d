"""MoE decode and short-prefill products on the decode GEMV (cuda_src/gemv.cu's expert modes, launched through
ninfer/cuda/linear.py's operand checks and launch):

- :func:`gemv_experts`: MoE decode dispatch, one (token row, expert) pair per slot; bitwise the plain gemv's rows.
- :func:`gemv_experts_routed`: the same with the routing (top-k of the router's logits) inside the launch.
- :func:`gemv_experts_down_combine`: the down projection with the MoE combine and the next RMS norm in its tail.
- :func:`gemv_expert_lanes`: MoE prefill of short chunks, up to 4 or 8 rows of one expert per slot from a device
  slot table (ninfer/cuda/moe_lanes.py); every row bitwise its :func:`gemv_experts` result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, arrival_counters, check_array, check_rows, matrix_out
from ninfer.cuda.gemv_geometry import _PF_FORMATS, gemv_plan
from ninfer.cuda.linear import _gemv_launch, _input
from ninfer.cuda.weights import DeviceWeight

__all__ = [
    "gemv_experts",
    "experts_swiglu_out_ok",
    "gemv_experts_routed",
    "gemv_experts_down_combine",
    "gemv_expert_lanes",
]


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
    swiglu_out: bool = False,
) -> Any:
    """MoE decode: ``out[s] = x[xrow[s]] · W_e[ids[s]]ᵀ`` with ``w`` the fused ``[E*n, K]`` expert weight
    (``swiglu``: ``x`` rows are [gate | up], as in :func:`gemv`). ``prefetch``: the next expert product's fused
    weight (the down projection ``[E*n2, K2]``): each slot's blocks fetch its expert's rows of it into L2 at their
    start (gemv.cu, gv_prefetch_expert; NVFP4 weights only, otherwise ignored). A hint: the result is bitwise the
    same. ``swiglu_out`` (float32 rows; each expert's n rows are [gate | up], ``experts_swiglu_out_ok``): ``out[s]``
    is ``silu(gate) * up`` ``[slots, n / 2]``, as :func:`gemv`'s ``swiglu_out`` (gemv.cu gemv_mma_gu; no hint)."""
    t, _, a = _input(x, w, "gemv_experts", swiglu, None)
    if swiglu_out and (t != "float" or not experts_swiglu_out_ok(w, n)):
        raise KernelError(
            f"gemv_experts: swiglu_out takes float32 rows and [gate | up] experts ({w.fmt}, n={n})"
        )
    check_array(ids, "ids", dtype=np.int32, shape=(None,))
    slots = ids.shape[0]
    check_array(xrow, "xrow", dtype=np.int32, shape=(slots,))
    if n <= 0 or w.rows % n:
        raise KernelError(f"gemv_experts: weight rows {w.rows} are not a whole number of experts of {n} rows")
    if slots > 65535:
        raise KernelError(f"gemv_experts: {slots} slots; take at most 65535 per launch")
    out, ldy = matrix_out(x, out, slots, n // 2 if swiglu_out else n)
    if slots == 0:
        return out
    pf = () if swiglu_out else _prefetch_expert_args(w, n, prefetch)
    _gemv_launch(
        a, w, out, slots, ldy, ids=ids, xrow=xrow, n=n, row0=0, nb=1, t=t, pf=pf, swiglu_out=swiglu_out
    )
    return out


def experts_swiglu_out_ok(w: Any, n: int) -> bool:
    """Whether ``gemv_experts(..., swiglu_out=True)`` applies to the fused expert weight ``w`` of ``n`` rows per
    expert: every row block holds whole features (n a multiple of twice the row block; gemv.cu gv_wrow)."""
    return (
        isinstance(w, DeviceWeight)
        and n > 0
        and w.rows % n == 0
        and n % (2 * gemv_plan(w.fmt, n, w.cols).rows) == 0
    )


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
