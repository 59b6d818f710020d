"""The Hopper prefill GEMM's pair mode (cuda_src/gemm_sm90.cu ``gemm90_pair``): float32 activations split once per
GEMM into bf16 hi / lo arrays (``split_hilo``), weights of the exactly foldable formats dequantized once per GEMM
into a bf16 scratch (``dequant90``), then a main loop of cp.async copies and wgmma only (docs/cuda.md, "Prefill
GEMM on Hopper").

The result is bitwise the in-loop kernel's (``gemm90<D, float>``): the same split (split8), the same operand values
(the format's own make()), the same tiles, MMA order and epilogue. So the row threshold (gemm_plan.PAIR_MIN_ROWS)
only moves time, never values: a row's result depends only on K, on either side of it.

Used by :func:`ninfer.cuda.gemm.gemm`; the kernels come from its compiled gemm_sm90.cu module (``kernel_of``), so
this module does not import gemm (no cycle). Here: the launches (:func:`gemm_pair`, the ws kernel's
:func:`launch_ws`, the weight's dequant pass or kept operand) and the kernel instances gemm.py compiles. The rules
that plan a call, its tunables and the format table: gemm_plan.py; the fp16 row split and the scratch: gemm_rows.py.
Their names are re-exported here for the modules, benchmarks and tests that import them from this module (``x as x``:
the ones not read here); patch the tunables in gemm_plan and ``_scratch`` in gemm_rows, where their readers are (a
tunable patched here is read by nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ninfer.cuda import gemm_rows
from ninfer.cuda._common import F16Rows, grid_1d, sm_count
from ninfer.cuda.gemm_plan import (
    _BM,
    _BN,
    _REDUCE_THREADS,
    _SMEM,
    _THREADS,
    _WS_BN,
    _WS_THREADS,
    _WSG_BN,
    F16_VARIANTS,
    F16_WS_ROWS,
    F16_WS_SPLIT_ROWS,
    F16_WS_WIDE_ELEMS,
    F16_WS_WIDE_ROWS,
    PAIR_MIN_ROWS,
    PAIR_STRUCTS,
    SPLITK_MAX,
    SPLITK_WAVE,
    _pair_plan,
    f16_auto_ws,
    f16_foldable,
    knobs,
    pair_foldable,
    pair_scratch_bytes,
    splitk_scratch_bytes,
    splitk_splits,
)
from ninfer.cuda.gemm_plan import _W_CAP as _W_CAP
from ninfer.cuda.gemm_plan import _X_CAP as _X_CAP
from ninfer.cuda.gemm_plan import SPLITK_MIN_KSTEPS as SPLITK_MIN_KSTEPS
from ninfer.cuda.gemm_plan import _plan as _plan
from ninfer.cuda.gemm_rows import _SCRATCH as _SCRATCH
from ninfer.cuda.gemm_rows import _SPLIT_KEEP_BYTES as _SPLIT_KEEP_BYTES
from ninfer.cuda.gemm_rows import _SPLIT_THREADS as _SPLIT_THREADS
from ninfer.cuda.gemm_rows import _scratch as _scratch
from ninfer.cuda.gemm_rows import f16_rows, f16_token_rows, release_scratch
from ninfer.cuda.gemm_rows import f16_scratch as f16_scratch
from ninfer.cuda.launch import launch_ex
from ninfer.cuda.tensor_map import encode, map_params, scale_map_params

__all__ = [
    "PAIR_STRUCTS",
    "PAIR_INSTANCES",
    "WS_INSTANCES",
    "F16_VARIANTS",
    "PAIR_MIN_ROWS",
    "F16_WS_ROWS",
    "F16_WS_WIDE_ROWS",
    "F16_WS_WIDE_ELEMS",
    "F16_WS_SPLIT_ROWS",
    "SPLITK_WAVE",
    "SPLITK_MAX",
    "f16_auto_ws",
    "splitk_splits",
    "splitk_scratch_bytes",
    "pair_foldable",
    "f16_foldable",
    "pair_scratch_bytes",
    "gemm_pair",
    "f16_rows",
    "f16_token_rows",
    "release_scratch",
]

# the plane holding one fp32 factor per weight row (offset with the weight's row chunk), if any
_ROW_PLANE = {"FP8E4M3_F32ROW": 1, "NVFP4G16_E4M3S_ROWG": 2}
PAIR_INSTANCES: tuple[str, ...] = (
    *(f"gemm90_pair<{s}>" for s, _ in PAIR_STRUCTS.values()),
    *(f"dequant90<{d}>" for _, d in PAIR_STRUCTS.values() if d is not None),
    "split_hilo",
    # fp16 mode (``inputs="fp16"``): the folded formats only (their operand values are exact in fp16; BF16 weights
    # are not, and keep the pair mode)
    *(f"gemm90_f16<{s}>" for s, d in PAIR_STRUCTS.values() if d is not None),
    *(f"dequant90<{d}, true>" for _, d in PAIR_STRUCTS.values() if d is not None),
    *(f"gemm90_f16il<{d}>" for _, d in PAIR_STRUCTS.values() if d is not None),  # the in-loop fp16 kernel
    *(f"gemm90_experts_f16<{d}>" for _, d in PAIR_STRUCTS.values() if d is not None),  # the MoE prefill's
    # ... reading the slots' token rows in place (the gate | up product: one split per token, f16_token_rows)
    *(f"gemm90_experts_f16g<{d}>" for _, d in PAIR_STRUCTS.values() if d is not None),
    # ... with the SwiGLU in its epilogue (h and tile maxima for split_f16row_max: gemm_swiglu.py)
    *(f"gemm90_experts_f16g_swiglu<{d}>" for _, d in PAIR_STRUCTS.values() if d is not None),
    "split_f16row",
    "split_f16row_max",  # the SwiGLU'd rows of gemm90_f16_ws_swiglu (gemm_swiglu.py)
    # its input transforms (a gather index, the SwiGLU of [gate | up] rows, both): the MoE and MLP prefill inputs
    *(f"split_f16row_in<{r}, {g}>" for r, g in (("true", "false"), ("false", "true"), ("true", "true"))),
    "split_f16row_gate",  # the attention output gate: the o-projection's input
)
WS_INSTANCES: tuple[str, ...] = tuple(
    f"{kern}<{s}>"
    for kern in ("gemm90_f16_ws", "gemm90_f16_ws_reduce", "gemm90_f16_ws_swiglu")
    for s, d in PAIR_STRUCTS.values()
    if d is not None
)


def gemm_pair(
    x: Any,
    w: Any,
    out: Any,
    dims: tuple[int, int, int, int, int],
    kernel_of: Callable[[str], Any],
    *,
    f16: bool = False,
    inloop: bool = False,
    variant: str = "auto",
    swiglu: bool = False,
    gate: tuple[Any, int] | None = None,
    operands: Any = None,
) -> None:
    """``out = x · Wᵀ`` in pair mode. ``dims`` = (M, N, K, ldx, ldy) as checked by gemm.gemm; ``x`` float32,
    ``w.fmt`` in :data:`PAIR_STRUCTS`; ``kernel_of(name)`` the compiled gemm_sm90.cu instance. Not for graph
    capture (the scratch may be reallocated between calls; gemm.gemm keeps captured GEMMs on the in-loop kernel).

    ``f16`` (``f16_foldable`` formats): the fp16 mode instead, one MMA per product: each row of ``x`` scaled by a
    power of two and rounded to fp16 (``split_f16row``; ``ninfer.reference.ops.round_fp16_rows`` is its NumPy
    twin), the weights as exact fp16 operands, the row's power of two undone in the epilogue. ``inloop`` (fp16
    mode): the weights converted inside the main loop (``gemm90_f16il``) rather than once into the scratch.
    ``variant`` (:data:`F16_VARIANTS`, fp16 mode): the scratch kernel's main loop, ``auto`` by rows
    and weight size (:func:`f16_auto_ws`; the in-loop kernel has one loop), ``ws`` with the split-K rule's S per
    call (:func:`splitk_splits` of its M, N, K; every chunk keeps it), ``ws<S>`` with S forced. Bitwise the same
    result every way at S = 1; with S > 1 a function of (K, S) per output (the splits' sum order).
    ``swiglu`` (fp16 mode): ``x`` holds [gate | up] rows of width 2K, and the product is of their SwiGLU, applied
    by the row split (``f16_rows``) instead of a separate kernel's [M, K] array (``dims[2]`` is K). ``gate=(qg, D)``
    (fp16 mode): the product is of ``x * sigmoid(gate)``, the attention output gate read in place from ``qg``
    (``f16_rows``), instead of sigmoid_gate's array.
    ``operands`` (an ``operands.OperandStore``, fp16 mode): the weight's fp16 operand kept there, or filled there on
    first use if its budget admits it, replaces the per-call dequant pass (the same values: the same results)."""
    m, n, k, _, ldy = dims
    transform = swiglu or gate is not None
    ws, splits, mx, nw, names = _pair_plan(w.fmt, m, n, k, f16, inloop, variant, transform, knobs())
    planes = list(w.planes())
    fn = kernel_of(names[0])
    if fn.max_dynamic_shared_size_bytes < _SMEM:
        fn.max_dynamic_shared_size_bytes = _SMEM
    split = None if f16 else kernel_of("split_hilo")
    dqfn = None if names[1] is None else kernel_of(names[1])
    red = None if names[2] is None else kernel_of(names[2])
    kept = _kept_operand(w, planes, dqfn, operands, "f16" if f16 else "bf16") if dqfn is not None else None
    if kept is not None:
        nw = n
    wbuf = gemm_rows._scratch("w", nw * k) if dqfn is not None and kept is None else None
    # hi, lo (the fp16 rows: f16_rows, the same scratch)
    xbuf = None if f16 else gemm_rows._scratch("x", 2 * mx * k)

    def weight_chunk(n0: int, rows: int) -> list[Any]:
        """Planes of weight rows [n0, n0 + rows) as the pair kernel reads them (the scratch filled for them)."""
        if dqfn is None:  # BF16, or the in-loop fp16 kernel: the stored rows themselves (one chunk)
            return planes
        _dequant(dqfn, planes, wbuf, n0, rows, k)
        p = [wbuf, *planes[1:]]
        if w.fmt in _ROW_PLANE:
            p[_ROW_PLANE[w.fmt]] = planes[_ROW_PLANE[w.fmt]][4 * n0 :]
        return p

    whole = kept if kept is not None else (weight_chunk(0, n) if nw == n else None)
    for m0 in range(0, m, mx):
        rows = min(mx, m - m0)
        if isinstance(x, F16Rows):  # split by their producer (norm.rmsnorm(..., f16=True))
            # one row chunk (the usual case): the arrays themselves, the same addresses as the slices
            xa, xb = (x.xh, x.rowf) if rows == m else (x.xh[m0 : m0 + rows], x.rowf[m0 : m0 + rows])
        elif f16:  # xh: the rows' fp16 words, then one float factor per row
            xm, g = x, gate  # one row chunk: the arrays themselves
            if rows != m:
                xm, g = x[m0 : m0 + rows], None if gate is None else (gate[0][m0 : m0 + rows], gate[1])
            xa, xb = f16_rows(xm, dims[3], kernel_of, swiglu=swiglu, gate=g)
        else:  # hi, lo
            xa, xb = xbuf[: rows * k], xbuf[rows * k : 2 * rows * k]
            split((grid_1d(rows * (k // 8), _SPLIT_THREADS),), (_SPLIT_THREADS,),
                  (x[m0 : m0 + rows], xa, xb, np.int32(rows), np.int32(k), np.int64(dims[3])))  # fmt: skip
        for n0 in range(0, n, nw):
            cols = min(nw, n - n0)
            p0, p1, p2 = whole if whole is not None else weight_chunk(n0, cols)
            y = out if rows == m and cols == n else out[m0 : m0 + rows, n0 : n0 + cols]
            if ws:
                launch_ws(fn, xa, xb, (p0, p1, p2), y, (rows, cols, k, ldy), splits=splits, reduce_fn=red)
                continue
            fn((grid_1d(rows, _BM) * grid_1d(cols, _BN),), (_THREADS,),
               (p0, p1, p2, xa, xb, y, np.int32(rows), np.int32(cols), np.int32(k), np.int64(k), np.int64(ldy)),
               shared_mem=_SMEM)  # fmt: skip


def _dequant(dqfn: Any, planes: list[Any], buf: Any, n0: int, rows: int, k: int) -> None:
    """Weight rows [n0, n0 + rows) as operand values into ``buf`` [rows, K] (each element from its own code)."""
    dqfn((grid_1d(k, 64), grid_1d(rows, _BN)), (_THREADS,), (*planes, buf, np.int32(rows), np.int32(k),
         np.int64(n0)))  # fmt: skip


def _kept_operand(w: Any, planes: list[Any], dqfn: Any, operands: Any, kind: str) -> list[Any] | None:
    """The planes of ``w``'s kept fp16 operand (ninfer/cuda/operands.py), dequantized into a buffer of its own now
    if the store has none yet and its budget admits it; None: the per-call scratch. The whole weight from row 0, so
    the planes are those ``weight_chunk(0, n)`` returns with the scratch: the same operand values."""
    if operands is None:
        return None
    n, k = w.rows, w.cols

    def build() -> Any:
        import cupy

        buf = cupy.empty(n * k, dtype=np.uint16)
        _dequant(dqfn, planes, buf, 0, n, k)
        return buf

    buf = operands.obtain(w, kind, 2 * n * k, build)
    return None if buf is None else [buf, *planes[1:]]


@functools.lru_cache(maxsize=1024)
def _map(ptr: int, rows: int, k: int, box_rows: int) -> Any:
    """The tensor map of ``[rows, k]`` fp16 words (row stride k) at ``ptr``: a map holds an address and a layout,
    nothing owned, so one encoded for the same (address, layout) serves whatever buffer lives there now. Cached:
    two encodes per GEMM cost ~10 us each on the host, 1-2 ms of an eager 27B prefill chunk (perf/profile_host.py)."""
    return encode(ptr, map_params(rows, k, k, box_rows))


@functools.lru_cache(maxsize=1024)
def _scale_map(ptr: int, groups: int, n: int, gpt: int) -> Any:
    """The group kernel's scale map of float32 ``[groups, n]`` at ``ptr`` (cached as :func:`_map`)."""
    return encode(ptr, scale_map_params(groups, n, gpt))


def launch_ws(
    fn: Any,
    xh: Any,
    rowf: Any,
    planes: tuple[Any, Any, Any],
    y: Any,
    dims: tuple[int, int, int, int],
    *,
    splits: int = 1,
    reduce_fn: Any = None,
    scales: tuple[Any, int, int] | None = None,
) -> None:
    """gemm90_f16_ws on fp16 rows ``xh`` [M, K] (row stride K), their factors ``rowf``, fp16 weight rows
    ``planes[0]`` [N, K] (row stride K) with the format's row-scale planes, into ``y`` (row stride ``ldy``);
    ``dims`` = (M, N, K, ldy). A persistent grid of one CTA per SM at most (the result does not depend on it).
    ``splits`` = S > 1: split-K, the S partials into the "part" scratch ([S, M, N] fp32), then ``reduce_fn``
    (gemm90_f16_ws_reduce of the same format) sums them in split order into ``y``. ``scales`` = (float32
    ``[groups, N]``, groups, GPT): gemm90_f16_wsg instead (the group formats, gemm_group.py): ``planes[0]`` the
    codes, 128-column tiles, the scales' map in the row-scale planes' place (which are then unused)."""
    import cupy

    m, n, k, ldy = dims
    p0, p1, p2 = planes
    bn = _WS_BN if scales is None else _WSG_BN
    if fn.max_dynamic_shared_size_bytes < _SMEM:
        fn.max_dynamic_shared_size_bytes = _SMEM
    ma, mb = _map(xh.data.ptr, m, k, _BM), _map(p0.data.ptr, n, k, bn)
    if scales is None:
        mid = (p1, p2)
    else:  # the reduction's row scale is 1 (WsGroup): no planes
        p1 = p2 = np.uint64(0)
        mid = (_scale_map(scales[0].data.ptr, scales[1], n, scales[2]).arg,)
    units = grid_1d(m, _BM) * grid_1d(n, bn) * splits
    grid = min(units, sm_count(cupy.cuda.Device().id))
    part = gemm_rows._scratch("part", 2 * splits * m * n).view(np.float32) if splits > 1 else None
    args = (ma.arg, mb.arg, *mid, rowf, y, np.int32(m), np.int32(n), np.int32(k), np.int64(ldy),
            np.uint64(0) if part is None else part, np.int32(splits))  # fmt: skip
    launch_ex(fn, (grid,), (_WS_THREADS,), args, shared_mem=_SMEM)
    if part is not None:
        reduce_fn((m, grid_1d(n, _REDUCE_THREADS)), (_REDUCE_THREADS,),
                  (part, p1, p2, rowf, y, np.int32(m), np.int32(n), np.int32(splits), np.int64(ldy)))  # fmt: skip
