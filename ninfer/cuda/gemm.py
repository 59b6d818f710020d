"""Prefill matrix products ``y = x · Wᵀ`` on tensor cores against stored-format weights (cuda_src/gemm_sm90.cu,
cuda_src/gemm_sm90_ws.cu, cuda_src/gemm.cu); the decode products are ninfer/cuda/linear.py's.

- :func:`gemm`: prefill chunks with exact operands: weights as bf16-exact codes times the format's scale (applied
  to the fp32 sums), bf16 activations as is, float32 activations split into two bf16 halves (relative
  representation error <= 2^-17); fp32 accumulation in a fixed order per K. On compute capability 9.0 the wgmma
  kernel (cuda_src/gemm_sm90.cu, compiled for sm_90a), elsewhere mma.sync (cuda_src/gemm.cu). On Hopper, float32
  ``x`` of at least ``PAIR_MIN_ROWS`` rows against BF16, FP8 or NVFP4 weights takes the pair mode
  (ninfer/cuda/gemm_pair.py: split and weight dequantization once per GEMM, a copy + wgmma main loop), bitwise the
  in-loop kernel's result; ``inputs="fp16"`` its fp16 mode (docs/cuda.md, "Prefill GEMM inputs"). ``impl``:
  ``auto`` (that dispatch), ``wgmma`` (the in-loop kernel, A/B comparisons), ``pair`` (pair mode at any row
  count), ``mma`` (the mma.sync kernel, the non-Hopper path).
- :func:`gemm_experts`: MoE prefill, the rows of each expert (slots sorted by expert) as one grouped GEMM;
  :func:`expert_tiles` its tile table.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import numpy as np

from ninfer.cuda._common import (
    F16Rows,
    KernelError,
    MadeF16Rows,
    act_type,
    check_array,
    check_rows,
    f16_rows_checked,
    grid_1d,
    matrix_args,
    matrix_out,
)
from ninfer.cuda.gemm_bf16 import BF16_SM90_INSTANCES, BF16_WS_INSTANCES, bf16_f16_ok, gemm_bf16_f16
from ninfer.cuda.gemm_group import GROUP_SM90_INSTANCES, GROUP_WS_INSTANCES, gemm_group_f16, group_f16_ok
from ninfer.cuda.gemm_pair import (
    F16_VARIANTS,
    PAIR_INSTANCES,
    PAIR_MIN_ROWS,
    PAIR_STRUCTS,
    WS_INSTANCES,
    f16_foldable,
    f16_rows,
    f16_token_rows,
    gemm_pair,
    pair_foldable,
)
from ninfer.cuda.gemm_swiglu import SwigluRows, gate_up_swiglu, swiglu_f16_rows, swiglu_shape_ok
from ninfer.cuda.launch import capturing
from ninfer.cuda.loader import compute_capability, kernel, target_arch
from ninfer.cuda.weights import FORMAT_STRUCTS, DeviceWeight

__all__ = [
    "gemm",
    "hopper_gemm",
    "f16_rows_input",
    "swiglu_gemm_ok",
    "gemm_gate_up_swiglu",
    "gemm_experts",
    "experts_kernel",
    "expert_tiles",
    "EXPERTS_LAUNCHES",
    "GEMM_INPUTS",
    "GEMM_IMPLS",
    "DQ_STRUCTS",
    "PAIR_MIN_ROWS",
    "SOURCES",
]

_GEMM_TILE, _GEMM_THREADS = 128, 256  # GM_BM = GM_BN and GM_THREADS in gemm.cu
# format id -> the Hopper GEMM's weight-tile struct (cuda_src/wdq.cuh) and its CTA columns (D::BN: the group
# formats keep a partial accumulator beside the result, so their tiles are half as wide)
DQ_STRUCTS = {
    "BF16": ("DqBF16", 256),
    "FP8E4M3_F32ROW": ("DqFP8<true>", 256),
    "FP8E4M3_F32T": ("DqFP8<false>", 256),
    "NVFP4G16_E4M3S": ("DqNVFP4<false>", 256),
    "NVFP4G16_E4M3S_ROWG": ("DqNVFP4<true>", 256),
    "Q4G64_F16S": ("DqQG64<4>", 128),
    "Q5G64_F16S": ("DqQG64<5>", 128),
    "Q6G64_F16S": ("DqQG64<6>", 128),
    "W8G32_F16S": ("DqW8G32", 128),
}
# GS_BM, GS_THREADS, GS_SMEM in gemm_sm90.cu / wdq.cuh: every instance takes the opt-in maximum of shared memory
_GS_BM, _GS_THREADS, _GS_SMEM = 128, 256, 232448
_TYPES = ("float", "bf16")
_FMTS = tuple(FORMAT_STRUCTS.values())
SOURCES: dict[str, tuple[str, ...]] = {
    "gemm.cu": tuple(f"{k}<{f}, {t}>" for k in ("gemm", "gemm_experts") for f in _FMTS for t in _TYPES),
    "gemm_sm90.cu": (
        *(
            f"{k}<{d}, {t}>"
            for k in ("gemm90", "gemm90_experts")
            for d, _ in DQ_STRUCTS.values()
            for t in _TYPES
        ),
        *PAIR_INSTANCES,
        *GROUP_SM90_INSTANCES,
        *BF16_SM90_INSTANCES,
    ),
    "gemm_sm90_ws.cu": (*WS_INSTANCES, *GROUP_WS_INSTANCES, *BF16_WS_INSTANCES),
}


GEMM_IMPLS = ("auto", "wgmma", "pair", "mma")


@functools.cache
def _sm90a(device: int) -> bool:
    """Whether the loader builds gemm_sm90.cu for sm_90a on CUDA device ``device`` (the current one)."""
    return target_arch("gemm_sm90.cu", compute_capability()).endswith("a")


def _hopper(impl: str) -> bool:
    """The wgmma GEMM applies: ``impl`` is not ``mma`` and the loader builds gemm_sm90.cu for sm_90a on this
    device (asked ~6 times per layer of an eager prefill chunk: the answer cached per device)."""
    if impl not in GEMM_IMPLS:
        raise KernelError(f"impl={impl!r}: one of {', '.join(GEMM_IMPLS)}")
    import cupy

    return impl != "mma" and _sm90a(cupy.cuda.Device().id)


def hopper_gemm() -> bool:
    """Whether ``gemm(impl="auto")`` runs the Hopper kernels (and so the pair and fp16 modes) on this device."""
    return _hopper("auto")


def _sm90_kernel(name: str) -> Any:
    src = "gemm_sm90_ws.cu" if name.startswith("gemm90_f16_ws") else "gemm_sm90.cu"
    return kernel(src, SOURCES[src], name)


def _use_pair(impl: str, fmt: str, t: str, m: int) -> bool:
    """Pair mode for this Hopper GEMM: forced (``pair``; an error where it cannot apply), or under ``auto`` for
    float32 x of at least PAIR_MIN_ROWS rows and a foldable format, outside graph capture (the pair scratch is
    reallocated when a larger GEMM comes; prefill runs eagerly, captured decode takes the GEMV)."""
    if impl == "pair":
        if not pair_foldable(fmt, t):
            raise KernelError(
                f"gemm: impl='pair' needs float32 x and BF16, FP8 or NVFP4 weights (got {t}, {fmt})"
            )
        if capturing():
            raise KernelError("gemm: impl='pair' cannot be captured into a CUDA graph")
        return True
    return impl == "auto" and m >= PAIR_MIN_ROWS and pair_foldable(fmt, t) and not capturing()


def _gs_kernel(name: str) -> Any:
    """A gemm_sm90.cu tile kernel (gs_tile), opted in to the shared memory every instance is launched with."""
    fn = _sm90_kernel(name)
    if fn.max_dynamic_shared_size_bytes < _GS_SMEM:
        fn.max_dynamic_shared_size_bytes = _GS_SMEM
    return fn


def _gemm90(name: str, w: DeviceWeight, t: str) -> tuple[Any, int]:
    """The Hopper kernel ``name`` for ``w``'s format and activation type ``t``, and its CTA columns."""
    struct, bn = DQ_STRUCTS[w.fmt]
    return _gs_kernel(f"{name}<{struct}, {t}>"), bn


GEMM_INPUTS = ("exact", "fp16")


def gemm(
    x: Any,
    w: DeviceWeight,
    out: Any = None,
    *,
    impl: str = "auto",
    inputs: str = "exact",
    variant: str = "auto",
    swiglu: bool = False,
    gate: tuple[Any, int] | None = None,
    operands: Any = None,
) -> Any:
    """``out = x · Wᵀ`` for ``x[M, K]`` on tensor cores (exact weight operands, float32 ``x`` split into two bf16
    halves, fp32 accumulation); ``x`` and ``out`` may be row-strided views. ``impl``: see the module docstring
    (every Hopper choice gives bitwise the same result). ``inputs="fp16"``: where the pair mode would run and the
    format's operands are exact in fp16 (FP8, NVFP4), the fp16 mode instead (gemm_pair.py: each float32 row scaled
    by a power of two and rounded to fp16, one MMA per product; gemm_experts likewise); so do the group-int formats
    (gemm_group.py: the codes as fp16 operands, the group scales on partial sums) and BF16 weights of at least
    gemm_plan.BF16_F16_MIN_ELEMS with an operand store (gemm_bf16.py: rows scaled into exact fp16); every other
    GEMM stays exact. The choice depends only on the format and M, never on other rows' values. In the fp16 mode
    ``impl="wgmma"`` takes the in-loop weight conversion instead of the scratch (the same bits, slower: gemm_pair).
    ``variant`` (gemm_plan.F16_VARIANTS): the fp16 scratch kernel's main loop, ``cp`` (cp.async), ``ws`` (TMA +
    warp specialization, cuda_src/gemm_sm90_ws.cu, split over K where gemm_plan.splitk_splits says so), ``ws<S>``
    (S splits forced; ``ws1`` never splits) or ``auto`` (by rows and shape, the default); unsplit, every kernel
    gives the same bits, a split GEMM's depend on its (M, N, K) too. GEMMs that do not run the fp16 scratch kernel
    ignore it. ``swiglu``: ``x`` holds [gate | up] rows ``[M, 2K]`` and the
    product is of their SwiGLU (the fp16 mode applies it in its row split; elsewhere the swiglu kernel runs first:
    the same values either way). ``gate=(qg, head_dim)``: the product is of ``x * sigmoid(gate)``, the attention
    output gate read in place from the q|gate projection ``qg[M, 2K]`` ([query | gate] per head; applied by the
    fp16 mode's row split, ``split_f16row_gate``, elsewhere by the sigmoid_gate kernel first: the same values
    either way). ``operands`` (``operands.OperandStore``): the fp16 mode's scratch kernels read the weight's kept
    fp16 operand instead of dequantizing it per call (ninfer/cuda/operands.py; the same results)."""
    if inputs not in GEMM_INPUTS:
        raise KernelError(f"inputs={inputs!r}: one of {', '.join(GEMM_INPUTS)}")
    if variant not in F16_VARIANTS:
        raise KernelError(f"variant={variant!r}: one of {', '.join(F16_VARIANTS)}")
    if isinstance(x, SwigluRows):  # gemm_gate_up_swiglu's output: the fp16 rows in one pass
        x = swiglu_f16_rows(x, _sm90_kernel)
    if isinstance(x, F16Rows):
        return _gemm_f16rows(x, w, out, impl, inputs, variant, swiglu or gate is not None, operands)
    if swiglu and gate is not None:
        raise KernelError("gemm: swiglu and gate are exclusive input transforms")
    x, swiglu = _apply_swiglu(x, w, impl, inputs, swiglu)
    x, gate = _apply_gate(x, w, impl, inputs, gate)
    t, m, k, ldx = _transformed_args(x, w, out, "gemm", swiglu)
    n = w.rows
    out, ldy = matrix_out(x, out, m, n)
    if m == 0:
        return out
    p0, p1, p2 = w.planes()
    args = (p0, p1, p2, x, out, np.int32(m), np.int32(n), np.int32(k), np.int64(ldx), np.int64(ldy))
    hopper = _hopper(impl)
    if impl == "pair" and not hopper:
        raise KernelError(
            "gemm: impl='pair' needs the sm_90a wgmma kernels (a compute capability 9.0 device)"
        )
    if hopper:
        f16 = inputs == "fp16" and f16_foldable(w.fmt)
        # the switches first (gemm_plan.GROUP_F16 / BF16_F16): off, no capture query is added to the GEMM
        if inputs == "fp16" and impl == "auto" and group_f16_ok(w.fmt, t, m, n, k) and not capturing():
            gemm_group_f16(x, w, out, (m, n, k, ldx, ldy), _sm90_kernel, variant=variant, operands=operands)
            return out
        if inputs == "fp16" and impl == "auto" and bf16_f16_ok(w.fmt, t, m, n, k) and not capturing():
            dims = (m, n, k, ldx, ldy)
            if gemm_bf16_f16(x, w, out, dims, _sm90_kernel, variant=variant, operands=operands):
                return out
        if _use_pair(impl, w.fmt, t, m):
            dims = (m, n, k, ldx, ldy)
            v = variant if f16 else "cp"
            gemm_pair(
                x, w, out, dims, _sm90_kernel, f16=f16, variant=v, swiglu=swiglu, gate=gate, operands=operands
            )
            return out
        if f16 and impl == "wgmma" and _use_pair("auto", w.fmt, t, m):  # the fp16 mode's in-loop kernel
            gemm_pair(x, w, out, (m, n, k, ldx, ldy), _sm90_kernel, f16=True, inloop=True)
            return out
        fn, bn = _gemm90("gemm90", w, t)
        fn((grid_1d(m, _GS_BM) * grid_1d(n, bn),), (_GS_THREADS,), args, shared_mem=_GS_SMEM)
        return out
    fn = kernel("gemm.cu", SOURCES["gemm.cu"], f"gemm<{w.struct}, {t}>")
    fn(
        (grid_1d(n, _GEMM_TILE), grid_1d(m, _GEMM_TILE)),
        (_GEMM_THREADS,),
        args,
    )
    return out


def f16_rows_input(w: Any, m: int) -> bool:
    """Whether ``gemm(x, w, inputs="fp16")`` over ``m`` float32 rows runs the fp16 mode's row split, so that the
    producer of ``x`` may hand it over as ``F16Rows`` instead (norm.rmsnorm(..., f16=True)): a single-format
    foldable weight, the Hopper kernels, the pair threshold, outside graph capture."""
    # _f16_input("auto", "fp16", w, "float") and _use_pair("auto", w.fmt, "float", m), the cheap terms first and
    # the capture state read once (asked ~6 times per dense layer of a prefill chunk: perf/profile_host.py); or
    # the group formats' fp16 path (gemm_group.group_f16_ok)
    if not isinstance(w, DeviceWeight) or m < PAIR_MIN_ROWS:
        return False
    ok = f16_foldable(w.fmt) or group_f16_ok(w.fmt, "float", m, int(w.rows), int(w.cols))
    return ok and hopper_gemm() and not capturing()


def swiglu_gemm_ok(w_gu: Any, w_dn: Any, m: int) -> bool:
    """Whether the MLP pair ``gemm(swiglu(gemm(x, w_gu)), w_dn)`` over ``m`` float32 rows in the fp16 mode may run
    as ``gemm(gemm_gate_up_swiglu(x, w_gu), w_dn)`` (the SwiGLU in the gate | up epilogue, ninfer/cuda/
    gemm_swiglu.py; bitwise the same output): both products take the fp16 row split, ``w_gu`` is [gate | up] of
    ``w_dn``'s input width, and its GEMM is the unsplit ws kernel over the whole weight."""
    # f16_rows_input of both weights, the device and capture state asked once
    if not (isinstance(w_gu, DeviceWeight) and isinstance(w_dn, DeviceWeight)) or m < PAIR_MIN_ROWS:
        return False
    if not (f16_foldable(w_gu.fmt) and f16_foldable(w_dn.fmt)) or w_gu.rows != 2 * w_dn.cols:
        return False
    return swiglu_shape_ok(w_gu.fmt, int(w_gu.rows), int(w_gu.cols), m) and hopper_gemm() and not capturing()


def gemm_gate_up_swiglu(x: Any, w: DeviceWeight, *, operands: Any = None) -> SwigluRows:
    """The fp16-mode gate | up product of float32 ``x`` [M, K] (or its ``F16Rows``) with the SwiGLU applied in the
    epilogue (where :func:`swiglu_gemm_ok` holds): ``SwigluRows`` for ``gemm(..., inputs="fp16")`` of the down
    projection, whose result is then bitwise ``gemm(gemm(x, w, inputs="fp16"), w_dn, inputs="fp16",
    swiglu=True)``. ``operands``: as :func:`gemm`'s."""
    if not isinstance(x, F16Rows):
        if act_type(x, "x") != "float":
            raise KernelError("gemm_gate_up_swiglu: x must be float32 rows or F16Rows")
        m, k, ldx = check_rows(x, "x", w.cols)
        xh, rowf = f16_rows(x, ldx, _sm90_kernel)
        x = MadeF16Rows(xh.reshape(m, k), rowf)
    return gate_up_swiglu(x, w, _sm90_kernel, operands=operands)


def _gemm_f16rows(
    x: F16Rows, w: DeviceWeight, out: Any, impl: str, inputs: str, variant: str, swiglu: bool, operands: Any
) -> Any:
    """gemm() of rows already split for the fp16 mode (bitwise the same GEMM as of the float rows they came from)."""
    m, k = x.shape
    if swiglu or inputs != "fp16" or impl != "auto" or not f16_rows_input(w, m):
        raise KernelError(
            "gemm: F16Rows input needs inputs='fp16', impl='auto', no transform and the fp16 mode"
        )
    if w.cols != k:
        raise KernelError(f"gemm: x has K={k}, the weight {w.cols}")
    f16_rows_checked(x, m, k)
    out, ldy = matrix_out(x, out, m, w.rows)
    if m and not f16_foldable(w.fmt):  # a group format (f16_rows_input: gemm_group.group_f16_ok)
        gemm_group_f16(x, w, out, (m, w.rows, k, k, ldy), _sm90_kernel, variant=variant, operands=operands)
    elif m:
        gemm_pair(
            x, w, out, (m, w.rows, k, k, ldy), _sm90_kernel, f16=True, variant=variant, operands=operands
        )
    return out


def _f16_input(impl: str, inputs: str, w: DeviceWeight, t: str) -> bool:
    """Whether a GEMM of float rows ``t`` against ``w`` runs in the fp16 mode's row split (Hopper, fp16 inputs, a
    foldable format, outside graph capture): where the input transforms can be applied by ``f16_rows``."""
    return _hopper(impl) and inputs == "fp16" and t == "float" and f16_foldable(w.fmt) and not capturing()


def _apply_swiglu(x: Any, w: DeviceWeight, impl: str, inputs: str, swiglu: bool) -> tuple[Any, bool]:
    """A GEMM's SwiGLU input (``x`` = [gate | up] rows): kept for the fp16 mode's row split to apply
    (``split_f16row_in``), else applied now by the swiglu kernel (the same values either way)."""
    if not swiglu:
        return x, False
    if _f16_input(impl, inputs, w, act_type(x, "x")) and _use_pair(impl, w.fmt, "float", x.shape[0]):
        return x, True
    from ninfer.cuda.activation import swiglu as swiglu_kernel

    return swiglu_kernel(x), False


def _apply_gate(
    x: Any, w: DeviceWeight, impl: str, inputs: str, gate: tuple[Any, int] | None
) -> tuple[Any, tuple[Any, int] | None]:
    """A GEMM's gated input ``x * sigmoid(gate)`` (``gate=(qg, head_dim)``): kept for the fp16 mode's row split to
    apply (``split_f16row_gate``) where it runs and can read the gate with 16-byte loads, else applied now by the
    sigmoid_gate kernel, which also checks the arguments (the same values either way)."""
    if gate is None:
        return x, None
    qg, d = gate
    if _f16_input(impl, inputs, w, act_type(x, "x")) and _use_pair(impl, w.fmt, "float", x.shape[0]):
        m, k = x.shape if x.ndim == 2 else (0, 0)
        if k and d > 0 and d % 8 == 0 and k % d == 0 and qg.dtype == x.dtype and qg.shape == (m, 2 * k):
            _, _, ldq = check_rows(qg, "gate", 2 * k)
            if qg.data.ptr % 16 == 0 and ldq % 4 == 0:
                return x, gate
    from ninfer.cuda.activation import sigmoid_gate

    return sigmoid_gate(x, qg, x.shape[1] // d if d > 0 else 0, d), None


def _transformed_args(
    x: Any, w: DeviceWeight, out: Any, what: str, swiglu: bool
) -> tuple[str, int, int, int]:
    """matrix_args for ``x`` as read, [gate | up] rows of width 2K when ``swiglu``: (type, M, K, row stride)."""
    if not swiglu:
        return matrix_args(x, w, out, what)
    m, _, ldx = check_rows(x, "x", 2 * w.cols, vec8=True)
    if w.cols % 8:
        raise KernelError(f"{what}: K={w.cols} must be a multiple of 8")
    return act_type(x, "x"), m, w.cols, ldx


# gemm_experts' launches by kernel name (experts_kernel), counted for the tests: which path a call took
EXPERTS_LAUNCHES: Counter[str] = Counter()


def experts_kernel(fmt: str, t: str, *, f16: bool, hopper: bool, rows: bool, swiglu: bool) -> str:
    """The kernel :func:`gemm_experts` launches for weight format ``fmt`` and (transformed) activation type ``t``:
    ``f16`` (the fp16 mode applies: :func:`_f16_input`) with ``rows`` and no ``swiglu`` reads the tokens' split rows
    in place (``gemm90_experts_f16g``, one split per token); other fp16 calls read the row split's per-slot rows
    (``gemm90_experts_f16``, after ``split_f16row_in`` applied the transforms); else the exact kernels (Hopper or
    mma.sync), whose inputs the caller gathered / SwiGLU'd first."""
    if f16:
        d = PAIR_STRUCTS[fmt][1]
        return f"gemm90_experts_f16g<{d}>" if rows and not swiglu else f"gemm90_experts_f16<{d}>"
    if hopper:
        return f"gemm90_experts<{DQ_STRUCTS[fmt][0]}, {t}>"
    return f"gemm_experts<{FORMAT_STRUCTS[fmt]}, {t}>"


def gemm_experts(
    x: Any,
    w: DeviceWeight,
    ids: Any,
    n: int,
    out: Any = None,
    *,
    impl: str = "auto",
    inputs: str = "exact",
    rows: Any = None,
    swiglu: bool = False,
) -> Any:
    """MoE prefill: ``out[s] = x[s] · W_e[ids[s]]ᵀ`` for slots sorted by expert (``ids`` int32, non-decreasing),
    ``w`` the fused ``[E*n, K]`` expert weight. The tile table is built on the device (no host sync): expert e owns
    rows ``off[e] .. off[e+1]`` and ``ceil(count_e / 128)`` tiles; the grid is sized by the bound ``S/128 + E``.
    ``inputs="fp16"`` (float32 ``x``, FP8 / NVFP4 weights, Hopper, outside graph capture): each slot's row rounded
    to fp16 under a power-of-two scale as :func:`gemm` does (``gemm90_experts_f16``); otherwise exact. Input
    transforms, the same values as applying them first: ``rows`` (int32 on the device), slot s reads ``x[rows[s]]``
    (``x`` the tokens' rows; no gathered copy in the fp16 mode: each token's row is split once and the GEMM reads
    it in place per slot, ``gemm90_experts_f16g``); ``swiglu``, ``x``'s rows are [gate | up] of width 2K and the
    product is of their SwiGLU (with ``rows`` too, the fp16 row split applies both per slot).
    :data:`EXPERTS_LAUNCHES` counts the kernels launched (:func:`experts_kernel`)."""
    if impl == "pair":
        raise KernelError("gemm_experts: no pair mode (auto, wgmma or mma)")
    if inputs not in GEMM_INPUTS:
        raise KernelError(f"inputs={inputs!r}: one of {', '.join(GEMM_INPUTS)}")
    f16 = _f16_input(impl, inputs, w, act_type(x, "x"))
    if not f16 and (rows is not None or swiglu):  # the fp16 mode's row split applies them itself
        import cupy

        from ninfer.cuda.activation import swiglu as swiglu_kernel

        x = swiglu_kernel(x) if swiglu else x
        x, rows, swiglu = (x if rows is None else cupy.take(x, rows, axis=0)), None, False
    t, xm, k, ldx = _transformed_args(x, w, out, "gemm_experts", swiglu)
    m = xm if rows is None else rows.shape[0]
    check_array(ids, "ids", dtype=np.int32, shape=(m,))
    if rows is not None:
        check_array(rows, "rows", dtype=np.int32, shape=(m,))
    if n <= 0 or w.rows % n:
        raise KernelError(f"gemm_experts: weight rows {w.rows} are not a whole number of experts of {n} rows")
    out, ldy = matrix_out(x, out, m, n)
    if m == 0:
        return out
    e = w.rows // n
    off, tile_e, tile_s0, ntiles, bound = expert_tiles(ids, e)
    p0, p1, p2 = w.planes()
    args = (p0, p1, p2, x, out, off, tile_e, tile_s0, ntiles, np.int32(n), np.int32(k), np.int64(ldx),
            np.int64(ldy))  # fmt: skip
    hopper = f16 or _hopper(impl)
    name = experts_kernel(w.fmt, t, f16=f16, hopper=hopper, rows=rows is not None, swiglu=swiglu)
    EXPERTS_LAUNCHES[name] += 1
    if f16:
        fn = _gs_kernel(name)
        if name.startswith("gemm90_experts_f16g"):  # the tokens' rows split once, read in place per slot
            xh, rowf = f16_token_rows(x, ldx, _sm90_kernel, rows)
            args = (p0, p1, p2, xh, rows, rowf, out, off, tile_e, tile_s0, ntiles, np.int32(n), np.int32(k),
                    np.int64(k), np.int64(ldy))  # fmt: skip
        else:
            xh, rowf = f16_rows(x, ldx, _sm90_kernel, rows=rows, swiglu=swiglu)
            args = (p0, p1, p2, xh, rowf, out, off, tile_e, tile_s0, ntiles, np.int32(n), np.int32(k),
                    np.int64(k), np.int64(ldy))  # fmt: skip
        fn((grid_1d(n, DQ_STRUCTS[w.fmt][1]), bound), (_GS_THREADS,), args, shared_mem=_GS_SMEM)
        return out
    if hopper:  # same 128-row tiles (GS_BM == GM_BM)
        fn = _gs_kernel(name)
        fn((grid_1d(n, DQ_STRUCTS[w.fmt][1]), bound), (_GS_THREADS,), args, shared_mem=_GS_SMEM)
        return out
    fn = kernel("gemm.cu", SOURCES["gemm.cu"], name)
    fn((grid_1d(n, _GEMM_TILE), bound), (_GEMM_THREADS,), args)
    return out


def expert_tiles(ids: Any, e: int) -> tuple[Any, Any, Any, Any, int]:
    """The grouped expert GEMM's tile table for slots sorted by expert (``ids`` int32 on the device, non-decreasing;
    ``e`` experts), built on the device without a host sync: (row offset per expert [e + 1], expert and first slot
    of each of the ``bound`` = ceil(S / 128) + e tiles, the tile count [1], bound). One launch (router.cu
    ``expert_tiles``); it was ~12 CuPy launches per GEMM, ~960 per 35B-A3B prefill chunk (the host's time)."""
    from ninfer.cuda.router import expert_tiles as tiles

    return tiles(ids, e, _GEMM_TILE)
