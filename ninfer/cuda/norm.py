"""RMS norms (cuda_src/norm.cu): offset ``(1+w)`` and plain weights, optionally fused with the residual add,
and the GDN gated norm. Norm weights are float32 device vectors; math is fp32, rounded once on store."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ninfer.cuda._common import (
    F16Rows,
    KernelError,
    MadeF16Rows,
    act_type,
    check_array,
    check_rows,
    grid_1d,
    matrix_out,
)
from ninfer.cuda.launch import launch
from ninfer.cuda.loader import kernel

__all__ = ["rmsnorm", "gated_rmsnorm", "MoeCombine", "moe_combine_rmsnorm", "Folded", "Normed", "SOURCES"]

_T = ("float", "bf16")
_B = ("true", "false")
# gated_rmsnorm_f16r's instances: (registers per lane and head, heads per warp); GN_F16_WARPS = 8 warps per token
_GN_RESIDENT = {4: (1, 2, 4, 6, 8), 8: (1, 2, 4)}
_GN_WARPS = 8
SOURCES: dict[str, tuple[str, ...]] = {
    "norm.cu": tuple(f"rmsnorm<{t}, {o}, {r}, {v}>" for t in _T for o in _B for r in _B for v in _B)
    + tuple(f"gated_rmsnorm<{t}>" for t in _T)
    + tuple(f"moe_combine_rmsnorm<{t}, {o}, {v}>" for t in _T for o in _B for v in _B)
    + tuple(f"rmsnorm_f16<{o}, {r}>" for o in _B for r in _B)
    + tuple(f"moe_combine_rmsnorm_f16<{o}>" for o in _B)
    + ("gated_rmsnorm_f16",)
    + tuple(f"gated_rmsnorm_f16r<{r}, {h}>" for r, hs in _GN_RESIDENT.items() for h in hs)
}
# rows the F16 outputs (f16=True) keep in registers (norm.cu: RMS_NV * 8 * RMS_NT), and the gated norm's heads of
# at most 32 * GN_REG
F16_MAX_H = 4 * 8 * 256
_GN_HEADS, _GN_D = 1 << 16, 32 * 8


def _gated_f16_kernel(heads: int, d: int) -> str:
    """The fp16-row GDN norm for ``heads`` heads of width ``d``: ``gated_rmsnorm_f16r<R, HPW>`` (a token's values
    in registers) where an instance holds the heads, else the two-pass ``gated_rmsnorm_f16``; the same bits."""
    r = 4 if d <= 128 else 8
    per_warp = -(-heads // _GN_WARPS)
    fit = [h for h in _GN_RESIDENT[r] if h >= per_warp]
    return f"gated_rmsnorm_f16r<{r}, {fit[0]}>" if fit else "gated_rmsnorm_f16"


def gated_f16_ok(heads: int, d: int) -> bool:
    """Whether the GDN output norm of ``heads`` heads of width ``d`` can write fp16 GEMM rows itself."""
    return 0 < heads <= _GN_HEADS and 0 < d <= _GN_D


def f16_out_ok(h: int) -> bool:
    """Whether a norm over rows of ``h`` floats can write the fp16 GEMM mode's rows itself (``f16=True``)."""
    return h % 8 == 0 and 0 < h <= F16_MAX_H


def _f16_out(rows: int, h: int) -> F16Rows:
    import cupy

    if not f16_out_ok(h):
        raise KernelError(f"f16 rows: H={h} must be a multiple of 8 and at most {F16_MAX_H}")
    return MadeF16Rows(cupy.empty((rows, h), dtype=np.uint16), cupy.empty(rows, dtype=np.float32))


class MoeCombine(NamedTuple):
    """An MoE layer's output not yet combined (the combine runs inside the next norm: ``moe_combine_rmsnorm``).

    Row ``t``'s value is ``sum_j ew[t, j] * dn[where[t, j]] + sigmoid(sg[t * ldsg]) * sh[t]``, fp32 in that order,
    rounded to the activation dtype. ``dn``: ``[slots, H]`` contiguous expert outputs; ``where``/``ew``: int32 /
    float32 ``[T, k]``; ``sh``: ``[T, H]`` shared-expert output (any row stride); ``sg``: float32 1-D gate logits,
    row ``t`` at ``t * ldsg``.

    ``down`` (decode, ``CudaQwen36.moe_combine_fused``): ``dn`` is not written yet; ``down`` = (gate|up rows, the
    fused down weight, slot ids, slot rows) is the expert launch that writes it, which ``model_layers.combine_norm``
    runs with the combine and the norm in its tail (``gemv_experts.gemv_experts_down_combine``), or alone first
    (``model_layers.settle``)."""

    dn: Any
    where: Any
    ew: Any
    sh: Any
    sg: Any
    ldsg: int
    down: tuple[Any, Any, Any, Any] | None = None

    @property
    def rows(self) -> int:
        return int(self.where.shape[0])


class Folded(NamedTuple):
    """A block output that its producing GEMV already added into the residual (norm folding, docs/cuda.md): only
    the producer's partial sums of squares remain, float32 ``[row blocks, T]`` (``part[p, t]``: the squares of row
    ``t``'s residual over the producer's row block ``p``)."""

    part: Any


class Normed(NamedTuple):
    """``rmsnorm(res, w, eps, offset=offset)`` not materialized: the consuming GEMVs stage it from the residual
    ``res`` (float32 ``[T, H]``, already holding ``x + r``) and the producer's partials ``part`` (``Folded``), each
    block recomputing ``1 / rms`` per row from the partials in row-block order (gemv.cu, ``GV_NORM``). Stands for a
    float32 ``[T, H]`` activation (``shape``, ``dtype``) wherever only GEMVs read it."""

    res: Any
    part: Any
    w: Any
    eps: float
    offset: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.res.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def materialize(self) -> Any:
        """The normed rows as an array (the standalone norm without the residual add; tests and fallbacks)."""
        return rmsnorm(self.res, self.w, self.eps, offset=self.offset)


def _aligned16(a: Any, ld: int) -> bool:
    """Every row of ``a`` (row stride ``ld`` elements) starts on a 16-byte boundary."""
    return a.data.ptr % 16 == 0 and (ld * a.dtype.itemsize) % 16 == 0


def rmsnorm(
    x: Any,
    w: Any,
    eps: float,
    *,
    offset: bool = True,
    residual: Any = None,
    out: Any = None,
    f16: bool = False,
) -> Any:
    """``y = r·rsqrt(mean(r²)+eps)·(1+w or w)`` per row of ``x[T, H]``.

    With ``residual`` (float32 ``[T, H]``): first ``residual += x`` in place, then ``r = residual``.
    One block per row, the row held in registers; 16-byte accesses when every row is 16-byte aligned and ``H`` a
    multiple of 8, else scalar ones in the same order (the same bits either way). ``f16`` (float32 rows,
    ``f16_out_ok(H)``): returns ``F16Rows``, bitwise split_f16row of ``y``, instead of ``y`` (for an fp16-mode GEMM).
    """
    t = act_type(x, "x")
    rows, h, ldx = check_rows(x, "x")
    check_array(w, "w", dtype=np.float32, shape=(h,))
    ldr = 0
    if residual is not None:
        _, _, ldr = check_rows(residual, "residual", h)
        if residual.dtype != np.float32 or residual.shape[0] != rows:
            raise KernelError(
                f"residual: must be float32 [{rows}, {h}], got {residual.dtype} {list(residual.shape)}"
            )
    if f16:
        return _rmsnorm_f16(x, w, eps, offset, residual, ldx, ldr)
    out, ldy = matrix_out(x, out, rows, h)
    if rows == 0:
        return out
    res = residual if residual is not None else out  # unused pointer when not fused
    vec = h % 8 == 0 and _aligned16(x, ldx) and _aligned16(out, ldy) and _aligned16(w, 0)
    vec = vec and (residual is None or _aligned16(residual, ldr))
    flags = ", ".join("true" if f else "false" for f in (offset, residual is not None, vec))
    fn = kernel("norm.cu", SOURCES["norm.cu"], f"rmsnorm<{t}, {flags}>")
    launch(  # norm.cu waits (pdl_wait) before its first read
        fn,
        (rows,),
        (256,),
        (x, res, w, out, np.int32(h), np.float32(eps), np.int64(ldx), np.int64(ldr), np.int64(ldy)),
    )
    return out


def _rmsnorm_f16(x: Any, w: Any, eps: float, offset: bool, residual: Any, ldx: int, ldr: int) -> F16Rows:
    rows, h = x.shape
    if x.dtype != np.float32 or _out_of_line(x, ldx, w, residual, ldr):
        raise KernelError("rmsnorm(f16=True): float32 rows, every row and the weight 16-byte aligned")
    y = _f16_out(rows, h)
    if rows == 0:
        return y
    flags = f"{_B[not offset]}, {_B[residual is None]}"
    fn = kernel("norm.cu", SOURCES["norm.cu"], f"rmsnorm_f16<{flags}>")
    res = residual if residual is not None else x  # unused pointer when not fused
    args = (x, res, w, y.xh, y.rowf, np.int32(h), np.float32(eps), np.int64(ldx), np.int64(ldr))
    launch(fn, (rows,), (256,), args)
    return y


def _out_of_line(x: Any, ldx: int, w: Any, residual: Any, ldr: int) -> bool:
    """Whether any row of ``x`` or ``residual`` or the weight ``w`` misses a 16-byte boundary."""
    return not (_aligned16(x, ldx) and _aligned16(w, 0) and (residual is None or _aligned16(residual, ldr)))


def gated_rmsnorm(o: Any, z: Any, w: Any, eps: float, out: Any = None, *, f16: bool = False) -> Any:
    """GDN output norm: per row of width D (= head dim), ``(o·rsqrt(mean(o²)+eps))·w·silu(z)``.

    ``o``: ``[rows, D]`` (tokens × heads flattened to rows); ``z``: the same ``[rows, D]``, or ``[tokens, heads·D]``
    with any row stride (a column slice of the fused GDN projection); same dtype; ``w`` float32 ``[D]``. ``f16``
    (float32, ``z`` as ``[tokens, heads·D]``, ``gated_f16_ok``): returns the token rows ``[tokens, heads·D]`` as
    ``F16Rows``, bitwise split_f16row of the float output (the out-projection's fp16-mode input).
    """
    import cupy

    t = act_type(o, "o")
    rows, d, ldo = check_rows(o, "o")
    zrows, zw, ldz = check_rows(z, "z")
    zheads = zw // d if d and zw % d == 0 else 0
    if z.dtype != o.dtype or zheads < 1 or zrows * zheads != rows:
        raise KernelError(
            f"z: must be {o.dtype} [{rows}, {d}] or [tokens, heads·{d}] with tokens·heads = {rows}"
        )
    check_array(w, "w", dtype=np.float32, shape=(d,))
    if f16:
        if t != "float" or not gated_f16_ok(zheads, d):
            raise KernelError(
                f"gated_rmsnorm(f16=True): float32, at most {_GN_HEADS} heads of at most {_GN_D}"
            )
        y = MadeF16Rows(cupy.empty((zrows, zw), dtype=np.uint16), cupy.empty(zrows, dtype=np.float32))
        if zrows:
            fn = kernel("norm.cu", SOURCES["norm.cu"], _gated_f16_kernel(zheads, d))
            args = (o, z, w, y.xh, y.rowf, np.int32(zheads), np.int32(d), np.float32(eps), np.int64(ldo))
            fn((zrows,), (256,), (*args, np.int64(ldz)))
        return y
    if out is None:
        out = cupy.empty((rows, d), dtype=o.dtype)
    _, _, ldy = check_rows(out, "out", d)
    if rows:
        fn = kernel("norm.cu", SOURCES["norm.cu"], f"gated_rmsnorm<{t}>")
        fn(
            (grid_1d(rows, 8),),
            (256,),
            (
                o,
                z,
                w,
                out,
                np.int32(rows),
                np.int32(d),
                np.float32(eps),
                np.int64(ldo),
                np.int64(ldz),
                np.int64(ldy),
                np.int32(zheads),
            ),
        )
    return out


def moe_combine_rmsnorm(
    c: MoeCombine,
    w: Any,
    eps: float,
    *,
    residual: Any,
    offset: bool = True,
    out: Any = None,
    f16: bool = False,
) -> Any:
    """``residual += combine(c)`` in place, then ``rmsnorm(residual)`` (``offset``: ``1+w``): one launch with the same
    bits as the combine kernel followed by ``rmsnorm(..., residual=residual)``; ``f16`` as ``rmsnorm``'s. ``c``'s
    expert rows must be written (no pending ``down``: ``model_layers.combine_norm`` handles those)."""
    import cupy

    if c.down is not None:
        raise KernelError(
            "moe_combine_rmsnorm: the down launch is still pending (model_layers.combine_norm runs it)"
        )
    t = act_type(c.dn, "dn")
    slots, h, lddn = check_rows(c.dn, "dn")
    rows, k = c.rows, int(c.where.shape[1]) if c.where.ndim == 2 else -1
    if lddn != h:
        raise KernelError(f"dn: rows must be contiguous (row stride {lddn}, width {h})")
    check_array(c.where, "where", dtype=np.int32, shape=(rows, k))
    check_array(c.ew, "ew", dtype=np.float32, shape=(rows, k))
    srows, _, ldsh = check_rows(c.sh, "sh", h)
    if c.sh.dtype != c.dn.dtype or srows != rows:
        raise KernelError(f"sh: must be {c.dn.dtype} [{rows}, {h}]")
    if c.sg.ndim != 1 or c.sg.dtype != np.float32 or (rows and c.sg.shape[0] <= (rows - 1) * c.ldsg):
        raise KernelError(f"sg: must be float32 1-D holding {rows} gates {c.ldsg} apart")
    check_array(w, "w", dtype=np.float32, shape=(h,))
    _, _, ldr = check_rows(residual, "residual", h)
    if residual.dtype != np.float32 or residual.shape[0] != rows:
        raise KernelError(f"residual: must be float32 [{rows}, {h}]")
    if f16:
        return _combine_f16(c, w, eps, offset, residual, ldsh, ldr)
    if out is None:
        out = cupy.empty((rows, h), dtype=c.dn.dtype)
    _, _, ldy = check_rows(out, "out", h)
    if out.dtype != c.dn.dtype or out.shape[0] != rows:
        raise KernelError(f"out: must be {c.dn.dtype} [{rows}, {h}]")
    if rows == 0:
        return out
    vec = h % 8 == 0 and all(
        _aligned16(a, ld) for a, ld in ((c.dn, h), (c.sh, ldsh), (residual, ldr), (out, ldy))
    )
    vec = vec and _aligned16(w, 0)
    fn = kernel("norm.cu", SOURCES["norm.cu"], f"moe_combine_rmsnorm<{t}, {_B[not offset]}, {_B[not vec]}>")
    args = (c.dn, c.where, c.ew, c.sh, c.sg, np.int32(k), np.int64(ldsh), np.int64(c.ldsg), residual, w, out)
    launch(fn, (rows,), (256,), (*args, np.int32(h), np.float32(eps), np.int64(ldr), np.int64(ldy)))
    return out


def _combine_f16(
    c: MoeCombine, w: Any, eps: float, offset: bool, residual: Any, ldsh: int, ldr: int
) -> F16Rows:
    rows, h = c.rows, int(c.dn.shape[1])
    k = int(c.where.shape[1])
    if c.dn.dtype != np.float32 or not all(_aligned16(a, ld) for a, ld in ((c.dn, h), (c.sh, ldsh))):
        raise KernelError("moe_combine_rmsnorm(f16=True): float32 rows, 16-byte aligned")
    if _out_of_line(residual, ldr, w, None, 0):
        raise KernelError("moe_combine_rmsnorm(f16=True): the residual's rows and the weight 16-byte aligned")
    y = _f16_out(rows, h)
    if rows == 0:
        return y
    fn = kernel("norm.cu", SOURCES["norm.cu"], f"moe_combine_rmsnorm_f16<{_B[not offset]}>")
    args = (c.dn, c.where, c.ew, c.sh, c.sg, np.int32(k), np.int64(ldsh), np.int64(c.ldsg), residual, w)
    launch(fn, (rows,), (256,), (*args, y.xh, y.rowf, np.int32(h), np.float32(eps), np.int64(ldr)))
    return y
