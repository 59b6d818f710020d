"""Matrix products ``y = x · Wᵀ`` against stored-format weights (cuda_src/gemv.cu, cuda_src/gemm.cu).

- :func:`gemv`: decode, 1..8 activation rows; fp32 accumulation in a fixed order, so each row's result is bitwise
  the same whatever the number of rows in the launch.
- :func:`gemv_experts`: MoE decode dispatch, one (token row, expert) pair per slot.
- :func:`gemm`: prefill chunks on tensor cores with exact operands: weights as bf16-exact codes times the format's
  scale (applied to the fp32 sums), bf16 activations as is, float32 activations split into two bf16 halves
  (relative representation error <= 2^-17); fp32 accumulation in a fixed order per K.
- :func:`gemm_experts`: MoE prefill, the rows of each expert (slots sorted by expert) as one grouped GEMM.
- :func:`linear`: gemv for up to 8 rows, else gemm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, act_type, check_array, check_rows, grid_1d
from ninfer.cuda.loader import kernel
from ninfer.cuda.weights import FORMAT_STRUCTS, DeviceWeight

__all__ = [
    "gemv",
    "gemv_experts",
    "gemv_geometry",
    "gemm",
    "gemm_experts",
    "linear",
    "SOURCES",
    "GEMV_MAX_ROWS",
    "GEMV_KV",
]

GEMV_MAX_ROWS = 8  # GEMV_MAXB in gemv.cu
_GEMV_THREADS = 256  # GEMV_THREADS in gemv.cu
_GEMV_R = 4  # GEMV_R: output rows per row group
_GEMV_NB = (1, 2, 4, 8)  # activation-row instances; a launch takes the smallest that holds its rows


_GEMV_U = 2  # GEMV_U: chunks per thread in flight
_GEMM_TILE, _GEMM_THREADS = 128, 256  # GM_BM = GM_BN and GM_THREADS in gemm.cu
# weights per lane chunk (F::KV in wformat.cuh): one 16-byte load of the main plane. Only the launch geometry
# depends on it; a mismatch would cost speed, never correctness (the kernel loops over K by its own KV).
GEMV_KV = {
    "BF16": 8,
    "FP8E4M3_F32ROW": 16,
    "FP8E4M3_F32T": 16,
    "NVFP4G16_E4M3S": 32,
    "Q4G64_F16S": 32,
    "Q5G64_F16S": 32,
    "Q6G64_F16S": 32,
    "W8G32_F16S": 16,
}
_TYPES = ("float", "bf16")
_FMTS = tuple(FORMAT_STRUCTS.values())
SOURCES: dict[str, tuple[str, ...]] = {
    "gemv.cu": tuple(f"gemv<{f}, {t}, {nb}>" for f in _FMTS for t in _TYPES for nb in _GEMV_NB)
    + tuple(f"gemv_experts<{f}, {t}>" for f in _FMTS for t in _TYPES),
    "gemm.cu": tuple(f"{k}<{f}, {t}>" for k in ("gemm", "gemm_experts") for f in _FMTS for t in _TYPES),
}


def _prep(x: Any, w: DeviceWeight, out: Any, what: str) -> tuple[str, int, int, int]:
    if not isinstance(w, DeviceWeight):
        raise KernelError(f"{what}: w must be a DeviceWeight, got {type(w).__name__}")
    t = act_type(x, "x")
    m, k, ldx = check_rows(x, "x", w.cols, vec8=True)
    if k % 8:
        raise KernelError(f"{what}: K={k} must be a multiple of 8")
    return t, m, k, ldx


def _out(x: Any, out: Any, rows: int, n: int) -> tuple[Any, int]:
    import cupy

    if out is None:
        out = cupy.empty((rows, n), dtype=x.dtype)
    if out.dtype != x.dtype:
        raise KernelError(f"out: dtype {out.dtype} differs from x ({x.dtype})")
    _, _, ld = check_rows(out, "out", n)
    if out.shape[0] != rows:
        raise KernelError(f"out: needs {rows} rows, got {out.shape[0]}")
    return out, ld


def gemv_geometry(fmt: str, k: int) -> tuple[int, int]:
    """(threads per row group, output rows per block) of the GEMV for format ``fmt`` and width ``k``.

    A row group's threads split K; the group is the smallest power of two >= 32 threads that covers the row's
    chunks in one round of GEMV_U chunks per thread, at most the whole block. It depends on the format and K
    only (never on the number of activation rows), so the reduction order, hence every result bit, does too.
    """
    chunks = -(-k // GEMV_KV[fmt])
    want = -(-chunks // _GEMV_U)
    tpr = 32
    while tpr < want and tpr < _GEMV_THREADS:
        tpr *= 2
    return tpr, _GEMV_THREADS // tpr * _GEMV_R


def gemv(x: Any, w: DeviceWeight, out: Any = None, *, row0: int = 0, n: int | None = None) -> Any:
    """``out[b] = x[b] · W[row0 : row0+n]ᵀ`` for ``x[B, K]``; ``n`` defaults to all rows of ``w``. Decode takes
    B <= 8; more rows run as 8-row blocks of one launch, each row bitwise its decode result."""
    t, b, k, ldx = _prep(x, w, out, "gemv")
    n = w.rows - row0 if n is None else n
    if not (1 <= b <= GEMV_MAX_ROWS * 65535):
        raise KernelError(f"gemv: x has {b} rows; take 1..{GEMV_MAX_ROWS * 65535}")
    if row0 < 0 or n <= 0 or row0 + n > w.rows:
        raise KernelError(f"gemv: rows [{row0}, {row0 + n}) outside the weight's {w.rows} rows")
    out, ldy = _out(x, out, b, n)
    nb = next((v for v in _GEMV_NB if v >= b), GEMV_MAX_ROWS)  # same arithmetic per row in every instance
    fn = kernel("gemv.cu", SOURCES["gemv.cu"], f"gemv<{w.struct}, {t}, {nb}>")
    tpr, per_block = gemv_geometry(w.fmt, k)
    p0, p1, p2 = w.planes()
    fn(
        (grid_1d(n, per_block), grid_1d(b, nb)),
        (_GEMV_THREADS,),
        (
            p0,
            p1,
            p2,
            x,
            out,
            np.int32(n),
            np.int32(k),
            np.int32(b),
            np.int64(ldx),
            np.int64(ldy),
            np.int64(row0),
            np.int32(tpr),
        ),
    )
    return out


def gemv_experts(x: Any, w: DeviceWeight, ids: Any, xrow: Any, n: int, out: Any = None) -> Any:
    """MoE decode: ``out[s] = x[xrow[s]] · W_e[ids[s]]ᵀ`` with ``w`` the fused ``[E*n, K]`` expert weight."""
    t, _, k, ldx = _prep(x, w, out, "gemv_experts")
    check_array(ids, "ids", dtype=np.int32, shape=(None,))
    slots = ids.shape[0]
    check_array(xrow, "xrow", dtype=np.int32, shape=(slots,))
    if n <= 0 or w.rows % n:
        raise KernelError(f"gemv_experts: weight rows {w.rows} are not a whole number of experts of {n} rows")
    out, ldy = _out(x, out, slots, n)
    if slots == 0:
        return out
    fn = kernel("gemv.cu", SOURCES["gemv.cu"], f"gemv_experts<{w.struct}, {t}>")
    tpr, per_block = gemv_geometry(w.fmt, k)
    p0, p1, p2 = w.planes()
    fn(
        (grid_1d(n, per_block), slots),
        (_GEMV_THREADS,),
        (
            p0,
            p1,
            p2,
            x,
            out,
            ids,
            xrow,
            np.int32(n),
            np.int32(k),
            np.int64(ldx),
            np.int64(ldy),
            np.int32(tpr),
        ),
    )
    return out


def gemm(x: Any, w: DeviceWeight, out: Any = None) -> Any:
    """``out = x · Wᵀ`` for ``x[M, K]`` on tensor cores (exact weight operands, float32 ``x`` split into two bf16
    halves, fp32 accumulation); ``x`` and ``out`` may be row-strided views."""
    t, m, k, ldx = _prep(x, w, out, "gemm")
    n = w.rows
    out, ldy = _out(x, out, m, n)
    if m == 0:
        return out
    fn = kernel("gemm.cu", SOURCES["gemm.cu"], f"gemm<{w.struct}, {t}>")
    p0, p1, p2 = w.planes()
    fn(
        (grid_1d(n, _GEMM_TILE), grid_1d(m, _GEMM_TILE)),
        (_GEMM_THREADS,),
        (p0, p1, p2, x, out, np.int32(m), np.int32(n), np.int32(k), np.int64(ldx), np.int64(ldy)),
    )
    return out


def gemm_experts(x: Any, w: DeviceWeight, ids: Any, n: int, out: Any = None) -> Any:
    """MoE prefill: ``out[s] = x[s] · W_e[ids[s]]ᵀ`` for slots sorted by expert (``ids`` int32, non-decreasing),
    ``w`` the fused ``[E*n, K]`` expert weight. The tile table is built on the device (no host sync): expert e owns
    rows ``off[e] .. off[e+1]`` and ``ceil(count_e / 128)`` tiles; the grid is sized by the bound ``S/128 + E``."""
    import cupy

    t, m, k, ldx = _prep(x, w, out, "gemm_experts")
    check_array(ids, "ids", dtype=np.int32, shape=(m,))
    if n <= 0 or w.rows % n:
        raise KernelError(f"gemm_experts: weight rows {w.rows} are not a whole number of experts of {n} rows")
    out, ldy = _out(x, out, m, n)
    if m == 0:
        return out
    e = w.rows // n
    off = cupy.searchsorted(ids, cupy.arange(e + 1, dtype=np.int32), side="left").astype(np.int32)
    tiles = (off[1:] - off[:-1] + _GEMM_TILE - 1) // _GEMM_TILE
    tile_end = cupy.cumsum(tiles)
    bound = -(-m // _GEMM_TILE) + e
    i = cupy.arange(bound, dtype=tile_end.dtype)
    tile_e = cupy.minimum(cupy.searchsorted(tile_end, i, side="right"), e - 1)
    tile_s0 = off[tile_e] + (i - (tile_end[tile_e] - tiles[tile_e])) * _GEMM_TILE
    ntiles = tile_end[-1:].astype(np.int32)
    fn = kernel("gemm.cu", SOURCES["gemm.cu"], f"gemm_experts<{w.struct}, {t}>")
    p0, p1, p2 = w.planes()
    fn(
        (grid_1d(n, _GEMM_TILE), bound),
        (_GEMM_THREADS,),
        (p0, p1, p2, x, out, off, tile_e.astype(np.int32), tile_s0.astype(np.int32), ntiles, np.int32(n),
         np.int32(k), np.int64(ldx), np.int64(ldy)),
    )  # fmt: skip
    return out


def linear(x: Any, w: DeviceWeight, out: Any = None) -> Any:
    """gemv for up to 8 rows (decode), gemm above."""
    return gemv(x, w, out) if x.shape[0] <= GEMV_MAX_ROWS else gemm(x, w, out)
