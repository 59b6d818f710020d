"""The MoE routed experts' prefill with the SwiGLU in the gate | up GEMM's epilogue (docs/cuda.md "SwiGLU in the
expert gate | up epilogue"), the grouped-GEMM twin of gemm_swiglu.py's dense MLP fold.

``gemm90_experts_f16g_swiglu`` (cuda_src/gemm_sm90.cu, cuda_src/gate_up.cuh) is ``gemm90_experts_f16g`` (slot s reads
its token's fp16 row in place) whose column tile holds 128 gate rows of the slot's expert and the same features' 128
up rows: it writes ``h = silu(gate) * up`` [S, I] and each slot's largest ``|h|`` per 128 features instead of the
[S, 2I] gate | up array, and ``split_f16row_max`` makes the down projection's per-slot fp16 rows from them in one
pass (gemm_swiglu.swiglu_f16_rows) for the unchanged ``gemm90_experts_f16``.

Bitwise contract: ``h`` is the SwiGLU (split_f16row_in<false, true>'s expression) of what ``gemm_experts(x, w_gu,
ids, 2I, inputs="fp16", rows=r)`` writes (the same operands, MMA and K order per output: host test
tests/test_gemm_gate_up_host.py), the row max over the tile maxima is that split's row max (order-free), so the
fp16 rows, their factors and the down projection's output are bitwise ``gemm_experts(gu, w_dn, ids, hid,
inputs="fp16", swiglu=True)``'s. :func:`experts_swiglu_ok` says where it applies (formats and shapes only); the
two-array path stays everywhere else. Measured reason (H200, 35B-A3B 4096-token chunk, 40 MoE layers of 32768
slots): split_f16row_in<false, true> took 3.5 ms re-reading the [S, 2I] floats the gate | up GEMM wrote. The fold's
speed is not yet measured on the device.

The gemm module's helpers are read through the module at call time (``gm.``), as its tests patch them there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ninfer.cuda.gemm as gm
from ninfer.cuda._common import KernelError, act_type, check_array, grid_1d, matrix_args, matrix_out
from ninfer.cuda.gemm_pair import PAIR_STRUCTS, f16_foldable, f16_token_rows
from ninfer.cuda.gemm_swiglu import SWIGLU_TILE, SwigluRows, swiglu_f16_rows
from ninfer.cuda.weights import DeviceWeight

__all__ = [
    "experts_swiglu_shape_ok",
    "experts_swiglu_ok",
    "gemm_experts_gate_up_swiglu",
    "gemm_experts_down",
]

_BN = 2 * SWIGLU_TILE  # the expert kernel's D::BN: one column tile = 128 gate + 128 up rows


def experts_swiglu_shape_ok(fmt: str, n: int) -> bool:
    """Whether the routed experts' [gate | up] weight of format ``fmt`` with ``n`` = 2I rows per expert has the
    epilogue: a foldable format (the fp16 mode's; the kernel converts its stored rows in the main loop) and I a
    multiple of SWIGLU_TILE (every column tile holds whole gate and up rows)."""
    return f16_foldable(fmt) and n > 0 and n % _BN == 0


def experts_swiglu_ok(
    x: Any, w_gu: Any, w_dn: Any, n: int, *, inputs: str = "fp16", impl: str = "auto"
) -> bool:
    """Whether the pair ``gemm_experts(gemm_experts(x, w_gu, ids, n, rows=r), w_dn, ids, n_dn, swiglu=True)``
    (``inputs``, ``impl`` for both) may run as ``gemm_experts_down(gemm_experts_gate_up_swiglu(x, w_gu, ids, n,
    rows=r), w_dn, ids, n_dn)``, bitwise the same output: both products in the fp16 mode (float32 ``x``, foldable
    formats, the Hopper kernels, no graph capture: gemm._f16_input), ``w_gu`` [gate | up] experts of ``n`` rows
    (:func:`experts_swiglu_shape_ok`) over ``w_dn``'s input width. Formats and shapes only, never values."""
    if not (isinstance(w_gu, DeviceWeight) and isinstance(w_dn, DeviceWeight)) or act_type(x, "x") != "float":
        return False
    if not (gm._f16_input(impl, inputs, w_gu, "float") and gm._f16_input(impl, inputs, w_dn, "float")):
        return False
    return experts_swiglu_shape_ok(w_gu.fmt, n) and w_gu.rows % n == 0 and 2 * w_dn.cols == n


def gemm_experts_gate_up_swiglu(x: Any, w: DeviceWeight, ids: Any, n: int, *, rows: Any) -> SwigluRows:
    """The MoE gate | up product in the fp16 mode with the SwiGLU in its epilogue (where :func:`experts_swiglu_ok`
    holds): slot s reads token row ``x[rows[s]]`` (float32 ``[T, K]``, each token's row split once as
    ``gemm_experts(..., rows=)`` does) against expert ``ids[s]``'s ``n`` = 2I [gate | up] rows of ``w`` (slots
    sorted by expert). Returns ``SwigluRows`` (``h`` [S, I], per-tile maxima [S, I / 128]) for
    :func:`gemm_experts_down`. Counted in gemm.EXPERTS_LAUNCHES."""
    import cupy

    if not (gm._f16_input("auto", "fp16", w, act_type(x, "x")) and experts_swiglu_shape_ok(w.fmt, n)):
        raise KernelError(f"gemm_experts_gate_up_swiglu: {w.fmt}, {x.dtype} x, {n}-row experts: no epilogue")
    _, _, k, ldx = matrix_args(x, w, None, "gemm_experts_gate_up_swiglu")
    s, half = int(rows.shape[0]), n // 2
    check_array(ids, "ids", dtype=np.int32, shape=(s,))
    check_array(rows, "rows", dtype=np.int32, shape=(s,))
    if w.rows % n:
        raise KernelError(f"gemm_experts_gate_up_swiglu: weight rows {w.rows} are not experts of {n} rows")
    h = cupy.empty((s, half), dtype=np.float32)
    tmax = cupy.empty((s, half // SWIGLU_TILE), dtype=np.float32)
    if s == 0:
        return SwigluRows(h, tmax)
    off, tile_e, tile_s0, ntiles, bound = gm.expert_tiles(ids, w.rows // n)
    # xh: the T token rows' fp16 words, rowf: one factor per slot (its token's)
    xh, rowf = f16_token_rows(x, ldx, gm._sm90_kernel, rows)
    name = f"gemm90_experts_f16g_swiglu<{PAIR_STRUCTS[w.fmt][1]}>"
    gm.EXPERTS_LAUNCHES[name] += 1
    p0, p1, p2 = w.planes()
    args = (p0, p1, p2, xh, rows, rowf, h, tmax, off, tile_e, tile_s0, ntiles, np.int32(n), np.int32(k),
            np.int64(k), np.int64(half))  # fmt: skip
    gm._gs_kernel(name)((n // _BN, bound), (gm._GS_THREADS,), args, shared_mem=gm._GS_SMEM)
    return SwigluRows(h, tmax)


def gemm_experts_down(hs: SwigluRows, w: DeviceWeight, ids: Any, n: int, out: Any = None) -> Any:
    """The down projection of :func:`gemm_experts_gate_up_swiglu`'s rows: ``out[s] = h[s] · W_e[ids[s]]ᵀ`` (``w``
    the fused ``[E n, I]`` experts) from the per-slot fp16 rows split_f16row_max makes of (h, tile maxima), through
    the kernel ``gemm_experts(gu, w, ids, n, inputs="fp16", swiglu=True)`` launches on split_f16row_in's rows of
    the [gate | up] array (gemm.experts_kernel): bitwise its output. Counted in gemm.EXPERTS_LAUNCHES."""
    m, k = hs.shape
    if not gm._f16_input("auto", "fp16", w, "float"):
        raise KernelError(f"gemm_experts_down: {w.fmt} has no fp16 mode here")
    if w.cols != k or n <= 0 or w.rows % n:
        raise KernelError(f"gemm_experts_down: rows of {k} against {w.rows} x {w.cols} in experts of {n}")
    check_array(ids, "ids", dtype=np.int32, shape=(m,))
    out, ldy = matrix_out(hs, out, m, n)
    if m == 0:
        return out
    off, tile_e, tile_s0, ntiles, bound = gm.expert_tiles(ids, w.rows // n)
    xh, rowf = swiglu_f16_rows(hs, gm._sm90_kernel)
    name = gm.experts_kernel(w.fmt, "float", f16=True, hopper=True, rows=False, swiglu=True)
    gm.EXPERTS_LAUNCHES[name] += 1
    p0, p1, p2 = w.planes()
    args = (p0, p1, p2, xh, rowf, out, off, tile_e, tile_s0, ntiles, np.int32(n), np.int32(k), np.int64(k),
            np.int64(ldy))  # fmt: skip
    bn = gm.DQ_STRUCTS[w.fmt][1]
    gm._gs_kernel(name)((grid_1d(n, bn), bound), (gm._GS_THREADS,), args, shared_mem=gm._GS_SMEM)
    return out
