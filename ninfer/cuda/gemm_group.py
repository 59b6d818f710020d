"""The group-int formats' fp16-mode prefill GEMM (cuda_src/gemm_sm90_ws.cu ``gemm90_f16_wsg<GPT>``; docs/cuda.md,
"Groupwise-integer weights").

Q4/Q5/Q6 g64 and W8 g32 weights are a code times an f16 scale per group of 64 (32) k: a product code x scale has up
to 19 significant bits, so it is not an fp16 operand, and these formats took the in-loop exact kernel (``gemm90<D,
float>``: float rows split into two bf16 halves, codes converted inside the main loop, two MMAs per product). The
codes alone are small integers, exact in fp16. So this path is the warp-specialized fp16 GEMM (TMA ring, producer
warpgroup, persistent CTAs) with the codes as the weight operand and the scales on the partial sums:

- operands, once per weight (kept in the ``OperandStore`` like the folded formats' fp16 rows, else per call into
  the pair mode's weight scratch, in row chunks under its cap): the codes as fp16 rows ``[N, K]`` (``dequant90<D, true>``: the format's own make()) and the scales
  as float32 ``[groups, N]`` (``group_scales_t``, from Q4/Q5/Q6's tiled device plane, ninfer/cuda/qg64_layout.py), which the producer copies with the K tile (a third TMA box);
- activations: the fp16 mode's row split (``split_f16row``: a power of two per row, rounded to fp16);
- per K tile and group each consumer warpgroup sums the group's k16 steps into a partial accumulator and adds
  ``scale(column) * partial`` to its accumulators (the in-loop kernel's gs_issue / gs_scale order), 128 columns per
  tile (64 accumulators and one partial of 64 per thread, two for W8's two groups per K tile and for the deferred
  scaling, ``gemm_plan.GROUP_DEFER``); the epilogue multiplies by the row factor.

What differs from the exact path is the fp16 rounding of the activations, as for NVFP4 and FP8 in the fp16 mode.
``gemm_plan.GROUP_F16`` (on) routes ``gemm(..., inputs="fp16")`` here (its schedule, tensor maps and descriptor
addressing are also checked on the CPU by tests/test_gemm_ws_host.py); the memory plan reserves its scales scratch
(:func:`group_scratch_bytes`) and its split-K partials (gemm_plan.splitk_scratch_bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ninfer.cuda import gemm_plan, gemm_rows
from ninfer.cuda._common import grid_1d
from ninfer.cuda.gemm_pair import launch_ws
from ninfer.cuda.gemm_plan import _WSG_BN, PAIR_MIN_ROWS, forced_splits, splitk_splits
from ninfer.cuda.qg64_layout import TILED_FORMATS

__all__ = [
    "GROUP_STRUCTS",
    "GROUP_WS_INSTANCES",
    "GROUP_SM90_INSTANCES",
    "group_f16_ok",
    "group_operands",
    "group_operand_extra",
    "group_scratch_bytes",
    "gemm_group_f16",
]

# format id -> (its gemm_sm90.cu weight struct, scale groups per 64-k K tile)
GROUP_STRUCTS: dict[str, tuple[str, int]] = {
    "Q4G64_F16S": ("DqQG64<4>", 1),
    "Q5G64_F16S": ("DqQG64<5>", 1),
    "Q6G64_F16S": ("DqQG64<6>", 1),
    "W8G32_F16S": ("DqW8G32", 2),
}
GROUP_WS_INSTANCES: tuple[str, ...] = (
    "gemm90_f16_wsg<1>",
    "gemm90_f16_wsg<2>",
    "gemm90_f16_wsgd<1>",
    "gemm90_f16_ws_reduce<WsGroup<1>>",
)
GROUP_SM90_INSTANCES: tuple[str, ...] = (
    *(f"dequant90<{d}, true>" for d, _ in GROUP_STRUCTS.values()),
    "group_scales_t",
)
_GBN = _WSG_BN  # the group kernel's columns per tile, and dequant90's rows per block for these formats


def group_f16_ok(fmt: str, t: str, m: int, n: int, k: int) -> bool:
    """Whether ``gemm(x, w, inputs="fp16")`` takes this path: ``gemm_plan.GROUP_F16`` on, a group format, float32
    rows, at least the fp16 mode's row floor, TMA's 16-byte row strides (K % 8, N % 4)."""
    return (
        gemm_plan.GROUP_F16
        and fmt in GROUP_STRUCTS
        and t == "float"
        and m >= PAIR_MIN_ROWS
        and k % 8 == 0
        and n % 4 == 0
    )


def group_operands(fmt: str) -> bool:
    """Whether the fp16 mode keeps operands of format ``fmt`` on this path (the memory plan's resident operands)."""
    return gemm_plan.GROUP_F16 and fmt in GROUP_STRUCTS


def group_operand_extra(fmt: str, n: int, k: int) -> int:
    """Bytes a kept operand holds beside its fp16 rows: the float32 scales of a group format, else none."""
    return 4 * n * _groups(fmt, k) if fmt in GROUP_STRUCTS else 0


def group_scratch_bytes(rows: int, shapes: Any, group: bool = True) -> int:
    """Upper bound of the "gs" scratch (a weight chunk's float32 scales, built per call when its operands are not
    kept) after group-format GEMMs of at most ``rows`` rows against weights of ``shapes`` ((N, K) each), counted as
    W8's 32-wide groups (the most per row); 0 with GROUP_F16 off, below the fp16 mode's row floor or with ``group``
    False (no weight in a group format). The chunk's codes use the pair mode's weight scratch, under the same cap
    (gemm_plan.pair_scratch_bytes counts it)."""
    if not (group and gemm_plan.GROUP_F16) or rows < PAIR_MIN_ROWS:
        return 0
    return max((4 * _groups("W8G32_F16S", k) * _chunk_rows(n, k) for n, k in shapes), default=0)


def _chunk_rows(n: int, k: int) -> int:
    """Weight rows per call-time operand chunk of an ``n`` x ``k`` weight: the pair scratch's cap on the fp16 codes
    (gemm_plan._W_CAP), in 256-row units."""
    return min(n, gemm_plan._chunks(n, gemm_plan._W_CAP // (2 * k), 256))


def _groups(fmt: str, k: int) -> int:
    """Groups per weight row in the stored layout: the K padding to 128 over the group length."""
    return -(-k // 128) * 128 // (64 // GROUP_STRUCTS[fmt][1])


def _build(w: Any, kernel_of: Callable[[str], Any], codes: Any, scales: Any, n0: int, rows: int) -> None:
    """Weight rows [n0, n0 + rows) of ``w``: their codes as fp16 into ``codes`` [rows, K] and their scales as
    float32 into ``scales`` [groups, rows]."""
    k, gpr = int(w.cols), _groups(w.fmt, int(w.cols))
    p0, p1, p2 = w.planes()
    struct = GROUP_STRUCTS[w.fmt][0]
    kernel_of(f"dequant90<{struct}, true>")(
        (grid_1d(k, 64), grid_1d(rows, _GBN)),
        (256,),
        (p0, p1, p2, codes, np.int32(rows), np.int32(k), np.int64(n0)),
    )
    kernel_of("group_scales_t")(
        (grid_1d(gpr, 32), grid_1d(rows, 32)),
        (256,),
        (p2, scales, np.int32(rows), np.int32(gpr), np.int64(n0), np.int32(w.fmt in TILED_FORMATS)),
    )


def _kept(w: Any, kernel_of: Callable[[str], Any], operands: Any) -> tuple[Any, Any] | None:
    """(fp16 codes ``[N, K]``, float32 scales ``[groups, N]``) of ``w`` kept in ``operands``, built on first use if
    its budget admits both; None: the caller builds them per call into the scratch."""
    if operands is None:
        return None
    hit = operands.lookup(w, "codes"), operands.lookup(w, "gscales")
    if hit[0] is not None and hit[1] is not None:
        return hit
    n, k = int(w.rows), int(w.cols)
    gpr = _groups(w.fmt, k)
    if not operands.admit(2 * n * k + 4 * gpr * n):
        return None
    import cupy

    codes, scales = cupy.empty(n * k, dtype=np.uint16), cupy.empty(gpr * n, dtype=np.float32)
    _build(w, kernel_of, codes, scales, 0, n)
    operands.keep(w, codes, "codes")
    operands.keep(w, scales, "gscales")
    return codes, scales


def gemm_group_f16(
    x: Any,
    w: Any,
    out: Any,
    dims: tuple[int, int, int, int, int],
    kernel_of: Callable[[str], Any],
    *,
    variant: str = "auto",
    operands: Any = None,
) -> None:
    """``out = x · Wᵀ`` for a group-format ``w`` in the fp16 mode (where :func:`group_f16_ok`): ``x`` float32 rows
    (or ``F16Rows``), ``dims`` = (M, N, K, ldx, ldy) as gemm.gemm checked them. ``variant`` ``ws<S>`` forces S
    K splits; otherwise the split rule's S for 128-column tiles (twice the 256-column tiles of the same N), a
    function of (M, N, K) only, as gemm_pair's."""
    m, n, k, ldx, ldy = dims
    gpt = GROUP_STRUCTS[w.fmt][1]
    xh, rowf = gemm_rows.f16_input(x, ldx, kernel_of)
    # S of the whole call (kept by every weight chunk: a partial depends on K and S only, as in gemm_pair)
    forced = forced_splits(variant)
    splits = forced if forced is not None else splitk_splits(m, 2 * n, k)
    # gemm_plan.GROUP_DEFER: one group per K tile with its scaling deferred by a tile (the same bits)
    fn = kernel_of("gemm90_f16_wsgd<1>" if gpt == 1 and gemm_plan.GROUP_DEFER else f"gemm90_f16_wsg<{gpt}>")
    red = kernel_of("gemm90_f16_ws_reduce<WsGroup<1>>") if splits > 1 else None
    groups = _groups(w.fmt, k)
    kept = _kept(w, kernel_of, operands)
    # not kept: the operands of weight rows [n0, n0 + nw) at a time, in the pair mode's weight scratch (the same
    # chunk cap, so the memory plan's reservation covers the codes; the scales are 1/16 of that or less)
    nw = n if kept is not None else _chunk_rows(n, k)
    for n0 in range(0, n, nw):
        cols = min(nw, n - n0)
        if kept is not None:
            codes, scales = kept
        else:
            codes = gemm_rows._scratch("w", cols * k)
            scales = gemm_rows._scratch("gs", 2 * groups * cols).view(np.float32)
            _build(w, kernel_of, codes, scales, n0, cols)
        y = out if cols == n else out[:, n0 : n0 + cols]
        launch_ws(fn, xh, rowf, (codes, None, None), y, (m, cols, k, ldy), splits=splits, reduce_fn=red,
                  scales=(scales, groups, gpt))  # fmt: skip
