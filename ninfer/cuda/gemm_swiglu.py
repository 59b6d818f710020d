"""The dense MLP's prefill with the SwiGLU in the gate | up GEMM's epilogue (docs/cuda.md "SwiGLU in the gate | up
epilogue"): ``gemm90_f16_ws_swiglu`` (cuda_src/gemm_sm90_ws.cu) writes ``h = silu(gate) * up`` [M, I] and each row's
largest ``|h|`` per 128-column tile instead of the [M, 2I] gate | up array, and ``split_f16row_max``
(cuda_src/gemm_sm90.cu) turns ``h`` into the down projection's fp16 rows in one pass.

Bitwise contract: ``h`` is the SwiGLU of what ``gemm(x, w_gu, inputs="fp16")`` writes, and the fp16 rows are
those ``split_f16row_in<false, true>`` makes of that array (the same row max: max is order-free), so the down
projection's output is bitwise ``gemm(gu, w_dn, inputs="fp16", swiglu=True)``'s. Only the unsplit ws kernel has the
epilogue; :func:`swiglu_shape_ok` says where it applies, everything else keeps the two-array path.

Measured reason (H200, 27B, 4096-token chunk, perf/results/timeline_prefill_session18.txt): the split of the
[gate | up] rows (``split_f16row_in<false, true>``) read 570 MB and wrote 143 MB per layer, 12.6 ms of a 388 ms
chunk at the copy rate, and the gate | up GEMM wrote the 570 MB first.

Like gemm_pair.py, the kernels come through ``kernel_of`` (gemm.py's compiled modules), so this module does not
import gemm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ninfer.cuda._common import F16Rows, KernelError, MadeF16Rows, check_array, f16_rows_checked, sm_count
from ninfer.cuda.gemm_pair import (
    _BM,
    _SMEM,
    _SPLIT_THREADS,
    _WS_THREADS,
    PAIR_STRUCTS,
    _dequant,
    _kept_operand,
    _map,
    _plan,
    _scratch,
    f16_auto_ws,
    f16_foldable,
    f16_scratch,
    knobs,
    splitk_splits,
)
from ninfer.cuda.launch import launch_ex

__all__ = ["SwigluRows", "SWIGLU_TILE", "swiglu_shape_ok", "gate_up_swiglu", "swiglu_f16_rows"]

SWIGLU_TILE = 128  # h columns per ws column tile (WS_BN / 2): the gate rows' count must be a multiple


class SwigluRows(NamedTuple):
    """The SwiGLU'd MLP activation ``h`` float32 ``[M, I]`` (contiguous rows) and ``tmax`` float32
    ``[M, I / SWIGLU_TILE]`` (each row's largest ``|h|`` per column tile); only an fp16-mode GEMM reads it
    (gemm.gemm turns it into ``F16Rows`` by :func:`swiglu_f16_rows`)."""

    h: Any
    tmax: Any

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.h.shape[0]), int(self.h.shape[1]))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)


def swiglu_shape_ok(fmt: str, rows: int, cols: int, m: int) -> bool:
    """Whether an ``m``-row fp16-mode GEMM with a [gate | up] weight of format ``fmt``, ``rows`` x ``cols``, runs
    the epilogue: a foldable format, gate rows a multiple of SWIGLU_TILE, the ws kernel unsplit (the rules of
    gemm_plan: f16_auto_ws, splitk_splits) over the whole weight (no weight-row chunks)."""
    return _swiglu_shape_ok(fmt, rows, cols, m, knobs())


@functools.lru_cache(maxsize=4096)
def _swiglu_shape_ok(fmt: str, rows: int, cols: int, m: int, _knobs: tuple) -> bool:
    """swiglu_shape_ok, cached per gemm_plan's tunables (``_knobs``: the cache key only); asked twice per dense
    layer of a prefill chunk."""
    if not f16_foldable(fmt) or rows % (2 * SWIGLU_TILE) or m <= 0:
        return False
    if not f16_auto_ws(m, rows, cols) or splitk_splits(m, rows, cols) != 1:
        return False
    return _plan(fmt, m, rows, cols)[1] == rows


def gate_up_swiglu(
    x: F16Rows, w: Any, kernel_of: Callable[[str], Any], *, operands: Any = None, out: Any = None
) -> SwigluRows:
    """``SwigluRows`` of the fp16 rows ``x`` [M, K] against the [gate | up] weight ``w`` [2I, K] (where
    :func:`swiglu_shape_ok` holds): one gemm90_f16_ws_swiglu launch over the weight's kept fp16 operand, or its
    dequant into the scratch. ``out``: a float32 [M, I] array with contiguous rows for ``h`` (else allocated)."""
    import cupy

    m, k = x.shape
    n = int(w.rows)
    if w.cols != k or not swiglu_shape_ok(w.fmt, n, k, m):
        raise KernelError(f"gate_up_swiglu: {m} x {n} x {k} {w.fmt} has no SwiGLU epilogue (swiglu_shape_ok)")
    f16_rows_checked(x, m, k)
    half = n // 2
    h = out
    if h is None:  # contiguous rows by construction
        h = cupy.empty((m, half), dtype=np.float32)
    else:
        check_array(h, "out", dtype=np.float32, shape=(m, half))
        if h.strides != (4 * half, 4):
            raise KernelError("gate_up_swiglu: out must have contiguous rows")
    tmax = cupy.empty((m, half // SWIGLU_TILE), dtype=np.float32)
    wstruct, dq = PAIR_STRUCTS[w.fmt]
    planes = list(w.planes())
    dqfn = kernel_of(f"dequant90<{dq}, true>")
    p = _kept_operand(w, planes, dqfn, operands, "f16")
    if p is None:  # the whole weight into the scratch (swiglu_shape_ok: no row chunks)
        wbuf = _scratch("w", n * k)
        _dequant(dqfn, planes, wbuf, 0, n, k)
        p = [wbuf, *planes[1:]]
    fn = kernel_of(f"gemm90_f16_ws_swiglu<{wstruct}>")
    if fn.max_dynamic_shared_size_bytes < _SMEM:
        fn.max_dynamic_shared_size_bytes = _SMEM
    ma, mb = _map(x.xh.data.ptr, m, k, _BM), _map(p[0].data.ptr, n, k, SWIGLU_TILE)
    grid = min(-(-m // _BM) * (half // SWIGLU_TILE), sm_count(cupy.cuda.Device().id))
    args = (ma.arg, mb.arg, p[1], p[2], x.rowf, h, tmax, np.int32(m), np.int32(half), np.int32(k),
            np.int64(half))  # fmt: skip
    launch_ex(fn, (grid,), (_WS_THREADS,), args, shared_mem=_SMEM)
    return SwigluRows(h, tmax)


def swiglu_f16_rows(s: SwigluRows, kernel_of: Callable[[str], Any]) -> F16Rows:
    """The fp16 mode's rows of ``s.h`` (split_f16row_max: the row max from ``s.tmax``, one pass), into the fp16
    row scratch as gemm_rows.f16_rows does; bitwise f16_rows of the [gate | up] rows with ``swiglu=True``."""
    m, half = s.shape
    tn = half // SWIGLU_TILE
    check_array(s.tmax, "tmax", dtype=np.float32, shape=(m, tn))
    xh, rowf = f16_scratch(m, half)
    xh = xh.reshape(m, half)
    if m:
        kernel_of("split_f16row_max")(
            (m,), (_SPLIT_THREADS,), (s.h, s.tmax, xh, rowf, np.int32(m), np.int32(half), np.int32(tn))
        )
    return MadeF16Rows(xh, rowf)
