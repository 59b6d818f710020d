"""Gated full attention over a paged KV cache (cuda_src/attention.cu).

Cache per layer: ``k_cache, v_cache[num_pages, page_size, HKV, D]`` (bf16 words as uint16, float32, or e4m3fn
codes as uint8); a token at position p of sequence b lives in page ``page_table[b, p // page_size]`` at offset
``p % page_size`` (its "slot" is ``page * page_size + offset``).

An fp8 (uint8) cache needs ``k_scale, v_scale[num_pages, page_size, HKV]`` float32: one scale per (token, KV head),
value = ``e4m3_decode(code) * scale``, written as the reference runner's ``PagedKVStore._encode`` does
(``scale = amax / 448``, ``code = e4m3_encode(x / (scale or 1))``), bitwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.cuda._common import (
    KernelError,
    act_type,
    arrival_counters,
    check_array,
    check_rows,
    grid_1d,
    sm_count,
)
from ninfer.cuda.launch import launch
from ninfer.cuda.loader import kernel

__all__ = [
    "qk_norm_rope_kv_write", "attention", "split_plan", "SplitPlan", "group_size", "workspace_bytes",
    "rows_per_launch", "split_blocks", "smem_bytes", "page_shift", "SOURCES", "HEAD_DIMS", "MAX_GROUP", "VARIANTS",
    "DEFAULT_VARIANT", "Variant",
]  # fmt: skip

_T = ("float", "bf16")
_C = ("float", "bf16", "e4m3")  # cache element types
_CACHE_TYPES = {np.dtype(np.float32): "float", np.dtype(np.uint16): "bf16", np.dtype(np.uint8): "e4m3"}
HEAD_DIMS = (32, 64, 128, 256)
MAX_GROUP = 8  # query heads per KV head: the 8 columns of the tensor-core tile (attn_frag.cuh)
ATT_TILE = 16  # positions per warp step: a chunk is rounded up to a multiple of this
WS_CAP = 256 << 20  # bytes of split partials per launch; more rows run as several launches (row-independent)


@dataclass(frozen=True)
class Variant:
    """Kernel configuration of ``attention``: ``nw`` warps per block (part of the arithmetic: which positions a warp
    takes and the order the block merges its warps) and the load pipeline ``pipe`` (0: next tile's K after S and V
    after PV, each behind a page-table read; 1: page table two tiles ahead, next tile's loads issued chunk by chunk
    as the current tile's leave the registers, S in two mma chains; 2: as 1, and the row's splits merged in one level
    by the last block to finish, its staging double-buffered). docs/cuda.md "Decode attention"."""

    nw: int
    pipe: int

    def instance(self, t: str, c: str, d: int) -> str:
        return f"attention<{t}, {c}, {d}, {self.nw}, {self.pipe}>"


# Fixed per name (never chosen per launch: a row's bits depend on the variant). "base" is the kernel before the
# pipelined loads (kept for perf/bench_attention_decode.py's side-by-side), "pipe4" the pipeline at 4 warps,
# "pipe8m1" the single-level merge.
VARIANTS: dict[str, Variant] = {
    "base": Variant(4, 0),
    "pipe4": Variant(4, 1),
    "pipe8": Variant(8, 1),
    "pipe8m1": Variant(8, 2),
}
DEFAULT_VARIANT = "pipe4"
SOURCES: dict[str, tuple[str, ...]] = {
    "attention.cu": tuple(f"qk_norm_rope_kv_write<{t}, {c}, {d}>" for t in _T for c in _C for d in HEAD_DIMS)
    + tuple(VARIANTS[DEFAULT_VARIANT].instance(t, c, d) for t in _T for c in _C for d in HEAD_DIMS)
}


def _cache_type(
    k_cache: Any, v_cache: Any, hkv: int, d: int, k_scale: Any, v_scale: Any
) -> tuple[str, Any, Any]:
    """(C++ cache type, k scale arg, v scale arg): the scales are checked for an fp8 cache and must be absent
    otherwise, where the kernel never reads them and the cache itself stands in for the pointer."""
    c = _CACHE_TYPES.get(np.dtype(k_cache.dtype))
    if c is None:
        raise KernelError(
            f"k_cache: dtype must be uint16 (bf16), float32 or uint8 (e4m3), got {k_cache.dtype}"
        )
    check_array(k_cache, "k_cache", shape=(None, None, hkv, d))
    check_array(v_cache, "v_cache", dtype=k_cache.dtype, shape=k_cache.shape)
    if c != "e4m3":
        if k_scale is not None or v_scale is not None:
            raise KernelError(f"k_scale/v_scale: only an fp8 (uint8) cache has scales, got a {c} cache")
        return c, k_cache, v_cache
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if sc is None:
            raise KernelError(f"{name}: required with an fp8 (uint8) cache")
        check_array(sc, name, dtype=np.float32, shape=k_cache.shape[:3])
    return c, k_scale, v_scale


def qk_norm_rope_kv_write(
    qg: Any,
    k: Any,
    v: Any,
    q_norm: Any,
    k_norm: Any,
    positions: Any,
    slots: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    rotary_dim: int,
    theta: float,
    mrope_section: Sequence[int],
    interleaved: bool = True,
    eps: float = 1e-6,
    q_out: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
) -> Any:
    """Offset-RMSNorm q (from ``qg[T, Hq·2D]``, [query | gate] per head) and ``k[T, HKV·D]``, rotate dims
    [0, rotary_dim) (NeoX pairs, MRoPE axes from ``positions[3, T]``), write k and raw ``v[T, HKV·D]`` to the cache
    at ``slots[T]`` (int64) and return the rotated queries ``[T, Hq, D]``. An fp8 cache also gets the rows'
    scales in ``k_scale``/``v_scale``."""
    import cupy

    t = act_type(qg, "qg")
    d = head_dim
    if d not in HEAD_DIMS:
        raise KernelError(f"head_dim={d} has no kernel instance (have {HEAD_DIMS})")
    rows, _, ldq = check_rows(qg, "qg", heads * 2 * d)
    _, _, ldk = check_rows(k, "k", kv_heads * d)
    _, _, ldv = check_rows(v, "v", kv_heads * d)
    for name, arr in (("k", k), ("v", v)):
        if arr.dtype != qg.dtype or arr.shape[0] != rows:
            raise KernelError(f"{name}: must be {qg.dtype} [{rows}, {kv_heads * d}]")
    check_array(q_norm, "q_norm", dtype=np.float32, shape=(d,))
    check_array(k_norm, "k_norm", dtype=np.float32, shape=(d,))
    check_array(positions, "positions", dtype=np.int32, shape=(3, rows))
    check_array(slots, "slots", dtype=np.int64, shape=(rows,))
    c, ks, vs = _cache_type(k_cache, v_cache, kv_heads, d, k_scale, v_scale)
    sec = tuple(int(s) for s in mrope_section)
    if rotary_dim % 2 or rotary_dim > d or len(sec) != 3 or 2 * sum(sec) != rotary_dim:
        raise KernelError(
            f"rotary_dim={rotary_dim}, mrope_section={list(sec)}: sections must sum to rotary_dim/2"
        )
    if q_out is None:  # contiguous [rows, heads, d] by construction
        q_out = cupy.empty((rows, heads, d), dtype=qg.dtype)
    else:
        check_array(q_out, "q_out", dtype=qg.dtype, shape=(rows, heads, d))
    n_rows = rows * (heads + kv_heads)
    if n_rows:
        fn = kernel("attention.cu", SOURCES["attention.cu"], f"qk_norm_rope_kv_write<{t}, {c}, {d}>")
        launch(  # attention.cu waits (pdl_wait) before its first read
            fn,
            (grid_1d(n_rows, 8),),
            (256,),
            (
                qg,
                k,
                v,
                q_norm,
                k_norm,
                positions,
                slots,
                q_out,
                k_cache,
                v_cache,
                ks,
                vs,
                np.int32(rows),
                np.int32(heads),
                np.int32(kv_heads),
                np.int32(rotary_dim),
                np.int32(sec[1]),
                np.int32(sec[2]),
                np.int32(bool(interleaved)),
                np.float32(theta),
                np.float32(eps),
                np.int64(ldq),
                np.int64(2 * d),
                np.int64(ldk),
                np.int64(ldv),
            ),
        )
    return q_out


def paged_query(q: Any, k_cache: Any) -> tuple[str, tuple[int, int, int], int]:
    """Checks shared by the paged attention wrappers: ``q[R, Hq, D]`` with a kernel instance for D. Returns
    (q's kernel type, (R, Hq, D), the cache's KV heads, -1 when the cache is not 4-D)."""
    t = act_type(q, "q")
    check_array(q, "q", shape=(None, None, None))
    d = q.shape[2]
    if d not in HEAD_DIMS:
        raise KernelError(f"q: head_dim {d} has no kernel instance (have {HEAD_DIMS})")
    return t, q.shape, k_cache.shape[2] if k_cache.ndim == 4 else -1


def paged_rows(page_table: Any, row_seq: Any, row_pos: Any, rows: int, page_size: int, max_len: int) -> int:
    """Checks the page table and the rows' sequence and position arrays, and that ``max_len`` fits the table;
    returns the page size."""
    check_array(page_table, "page_table", dtype=np.int32, shape=(None, None))
    check_array(row_seq, "row_seq", dtype=np.int32, shape=(rows,))
    check_array(row_pos, "row_pos", dtype=np.int32, shape=(rows,))
    if max_len > page_table.shape[1] * page_size:
        raise KernelError(
            f"max_len={max_len} exceeds the page table's {page_table.shape[1]} pages of {page_size}"
        )
    return page_size


def attention_out(q: Any, out: Any) -> Any:
    """The output ``[R, Hq, D]`` in q's dtype: ``out`` checked, or a new array."""
    import cupy

    if out is None:  # q's shape, contiguous, by construction
        return cupy.empty(q.shape, dtype=q.dtype)
    check_array(out, "out", dtype=q.dtype, shape=q.shape)
    return out


@dataclass(frozen=True)
class SplitPlan:
    """Launch geometry of ``attention`` for a call: the chunk in positions (a multiple of ``ATT_TILE``), the splits
    of the longest row, and the most level-1 groups any row can have (the kernel's two-level merge)."""

    chunk: int
    nsplit: int
    ngmax: int


def group_size(ns: int) -> int:
    """Splits per level-1 merge group of a row with ``ns`` non-empty splits (attention.cu ``att_group``): the
    smallest power of two ``gs`` with ``gs * gs >= ns``, so a row has ``ceil(ns / gs) <= ceil(sqrt(ns))`` groups."""
    gs = 1
    while gs * gs < ns:
        gs <<= 1
    return gs


def split_plan(max_len: int, chunk: int | None) -> SplitPlan:
    """``chunk=None``: one split covering ``max_len`` (rounded up to a tile)."""
    c = max(1, max_len) if chunk is None else chunk
    if c < 1:
        raise KernelError(f"chunk={chunk}: must be positive")
    c = -(-c // ATT_TILE) * ATT_TILE
    nsplit = max(1, -(-max_len // c))
    return SplitPlan(chunk=c, nsplit=nsplit, ngmax=math.isqrt(nsplit - 1) + 1)


def workspace_bytes(rows: int, hq: int, d: int, plan: SplitPlan) -> int:
    """fp32 partials of ``rows`` rows (splits and groups, o plus (m, l) per head); 0 with a single split."""
    if plan.nsplit == 1:
        return 0
    return rows * hq * (plan.nsplit + plan.ngmax) * (d + 2) * 4


def rows_per_launch(rows: int, hq: int, d: int, plan: SplitPlan) -> int:
    """Rows of one launch: all of them unless their partials exceed ``WS_CAP`` (and at most gridDim.z)."""
    per = workspace_bytes(1, hq, d, plan)
    return max(1, min(rows, 65535, WS_CAP // per if per else rows))


def split_blocks(rows: int, hkv: int, nsplit: int, sms: int, nw: int = 4) -> int:
    """gridDim.z: blocks per (KV head, row), each striding over the row's splits. About 16 warps per SM in all (8
    resident at a time: 2 blocks of 4 warps or one of 8) whatever ``max_len``: a decode graph sized for the pool's
    capacity launches no storm of blocks past the rows' positions. Only the spread of the work depends on it, never
    a result."""
    return max(1, min(nsplit, -(-16 * sms // (nw * hkv * rows))))


def smem_bytes(d: int, nw: int = 4) -> int:
    """Dynamic shared memory of ``attention<*, *, d, nw, *>`` (its layout: Q fragments, warp partials, flag)."""
    return d // 16 * 512 + nw * 8 * d * 4 + nw * 16 * 4 + 16


def page_shift(page_size: int) -> int:
    """log2(page_size) for a power of two (the kernel shifts), else -1 (it divides)."""
    return page_size.bit_length() - 1 if page_size & (page_size - 1) == 0 else -1


def attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    page_table: Any,
    row_seq: Any,
    row_pos: Any,
    *,
    max_len: int,
    chunk: int | None = None,
    scale: float | None = None,
    out: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    variant: str = DEFAULT_VARIANT,
) -> Any:
    """Causal GQA attention of ``q[R, Hq, D]``: row r (sequence ``row_seq[r]``) attends positions
    ``0..row_pos[r]`` of its pages in ``page_table[B, max_pages]``. ``max_len`` bounds ``row_pos + 1``.

    ``chunk`` splits the KV length into fixed chunks by absolute position (rounded up to 16), computed by blocks of
    one (KV head, row) striding over its splits, the partials merged in split order in the same launch. ``None``
    runs one split per row.
    Either way a row's result depends only on its own inputs (never on the other rows, ``max_len`` or the launch).
    An fp8 (uint8) cache reads its scales from ``k_scale``/``v_scale`` ``[num_pages, page_size, HKV]``.
    ``variant`` names the kernel configuration (``VARIANTS``; the others than the default are for benchmarks).
    """
    import cupy

    if variant not in VARIANTS:
        raise KernelError(f"variant={variant!r}: one of {', '.join(VARIANTS)}")
    var = VARIANTS[variant]
    t, (r, hq, d), hkv = paged_query(q, k_cache)
    c, ks, vs = _cache_type(k_cache, v_cache, hkv, d, k_scale, v_scale)
    if hq % hkv or hq // hkv > MAX_GROUP:
        raise KernelError(f"q: {hq} heads over {hkv} KV heads must form groups of at most {MAX_GROUP}")
    page_size = paged_rows(page_table, row_seq, row_pos, r, k_cache.shape[1], max_len)
    plan = split_plan(max_len, chunk)
    scale = float(d) ** -0.5 if scale is None else scale
    out = attention_out(q, out)
    if r == 0:
        return out
    name = var.instance(t, c, d)
    fn = kernel("attention.cu", SOURCES["attention.cu"] if variant == DEFAULT_VARIANT else (name,), name)
    smem = smem_bytes(d, var.nw)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    step = rows_per_launch(r, hq, d, plan)
    nws = workspace_bytes(step, hq, d, plan) // 4
    ws = cupy.empty(max(nws, 1), dtype=np.float32)
    no, ng = step * hq * plan.nsplit * d, step * hq * plan.ngmax * d  # o parts, then (m, l) parts
    ws_o, wg_o = ws[:no], ws[no : no + ng]
    ws_ml, wg_ml = ws[no + ng : no + ng + 2 * no // d], ws[no + ng + 2 * no // d :]
    cnt = ws  # unused with one split
    if plan.nsplit > 1:
        cnt = arrival_counters(step * hkv * (plan.ngmax + 1))
    qk_scale = np.float32(scale * math.log2(math.e))
    sms = sm_count(cupy.cuda.Device().id)
    for r0 in range(0, r, step):
        n = min(step, r - r0)
        launch(
            fn,
            (hkv, n, split_blocks(n, hkv, plan.nsplit, sms, var.nw)),
            (32 * var.nw,),
            (
                q[r0 : r0 + n], k_cache, v_cache, ks, vs, page_table, row_seq[r0 : r0 + n], row_pos[r0 : r0 + n],
                out[r0 : r0 + n], ws_o, ws_ml, wg_o, wg_ml, cnt, np.int32(hq), np.int32(hkv),
                np.int32(page_size), np.int32(page_shift(page_size)), np.int64(page_table.shape[1]),
                np.int32(plan.chunk), np.int32(plan.nsplit), np.int32(plan.ngmax), qk_scale,
            ),
            smem,
        )  # fmt: skip
    return out
