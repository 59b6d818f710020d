"""RMS norms (cuda_src/norm.cu): offset ``(1+w)`` and plain weights, optionally fused with the residual add,
and the GDN gated norm. Norm weights are float32 device vectors; math is fp32, rounded once on store."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, act_type, check_array, check_rows, grid_1d
from ninfer.cuda.loader import kernel

__all__ = ["rmsnorm", "gated_rmsnorm", "SOURCES"]

_T = ("float", "bf16")
_B = ("true", "false")
SOURCES: dict[str, tuple[str, ...]] = {
    "norm.cu": tuple(f"rmsnorm<{t}, {o}, {r}, {v}>" for t in _T for o in _B for r in _B for v in _B)
    + tuple(f"gated_rmsnorm<{t}>" for t in _T)
}


def _aligned16(a: Any, ld: int) -> bool:
    """Every row of ``a`` (row stride ``ld`` elements) starts on a 16-byte boundary."""
    return a.data.ptr % 16 == 0 and (ld * a.dtype.itemsize) % 16 == 0


def rmsnorm(x: Any, w: Any, eps: float, *, offset: bool = True, residual: Any = None, out: Any = None) -> Any:
    """``y = r·rsqrt(mean(r²)+eps)·(1+w or w)`` per row of ``x[T, H]``.

    With ``residual`` (float32 ``[T, H]``): first ``residual += x`` in place, then ``r = residual``.
    One block per row, the row held in registers; 16-byte accesses when every row is 16-byte aligned and ``H`` a
    multiple of 8, else scalar ones in the same order (the same bits either way).
    """
    import cupy

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
    if out is None:
        out = cupy.empty((rows, h), dtype=x.dtype)
    _, _, ldy = check_rows(out, "out", h)
    if out.dtype != x.dtype or out.shape[0] != rows:
        raise KernelError(f"out: must be {x.dtype} [{rows}, {h}]")
    if rows == 0:
        return out
    res = residual if residual is not None else out  # unused pointer when not fused
    vec = h % 8 == 0 and _aligned16(x, ldx) and _aligned16(out, ldy) and _aligned16(w, 0)
    vec = vec and (residual is None or _aligned16(residual, ldr))
    flags = ", ".join("true" if f else "false" for f in (offset, residual is not None, vec))
    fn = kernel("norm.cu", SOURCES["norm.cu"], f"rmsnorm<{t}, {flags}>")
    fn(
        (rows,),
        (256,),
        (x, res, w, out, np.int32(h), np.float32(eps), np.int64(ldx), np.int64(ldr), np.int64(ldy)),
    )
    return out


def gated_rmsnorm(o: Any, z: Any, w: Any, eps: float, out: Any = None) -> Any:
    """GDN output norm: per row of width D (= head dim), ``(o·rsqrt(mean(o²)+eps))·w·silu(z)``.

    ``o``: ``[rows, D]`` (tokens × heads flattened to rows); ``z``: the same ``[rows, D]``, or ``[tokens, heads·D]``
    with any row stride (a column slice of the fused GDN projection); same dtype; ``w`` float32 ``[D]``.
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
