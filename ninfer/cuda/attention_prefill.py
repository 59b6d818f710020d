"""Causal prefill attention on tensor cores over a bf16 paged KV cache (cuda_src/attention_prefill.cu).

Same meaning as :func:`ninfer.cuda.attention.attention` (paged cache ``[num_pages, page_size, HKV, D]``, row r of
sequence ``row_seq[r]`` attends positions ``0..row_pos[r]``, GQA, fp32 online softmax, output in q's dtype), with
exact operands on ``mma.sync`` (float q split into two bf16 halves, the probabilities likewise). Every row's result
depends only on its own inputs (fixed reduction order over KV tiles in ascending order), but it is not bitwise the
decode kernel's: the exact mode (``prefill_gemm=False``) keeps :func:`attention` for prefill.

Three kernels, the same softmax and product order per row: ``variant="gqa"`` packs a KV head's query heads into one
block (the K/V tiles loaded once per group, double-buffered by ``cp.async``, fragments by ``ldmatrix``, products
on ``mma.sync``); ``variant="wg"`` is the same block with its two products per tile on Hopper's ``wgmma``
(cuda_src/attention_wg.cu: sm_90a, D = 256); ``variant="head"`` is the earlier one-query-head-per-block kernel,
kept for comparison (perf/bench_attention.py). ``"gqa"`` and ``"head"`` give the same bits; ``"wg"`` gave them too
on every shape measured on the H200 (perf/bench_attention.py, the head-256 model test), which its kernel test does
not require (it allows fp32 rounding against ``"gqa"``). ``variant="auto"``
(the default) is ``"wg"`` wherever it compiles (``"ws"``, its warp-specialized form with the same bits, at precision
``"bf16"``) and ``"gqa"`` elsewhere: a choice made by the head size, the precision and the
device only, never by the launch, so a row's bits stay independent of the rows beside it and of the chunking.
docs/cuda.md gives the arithmetic.

``precision`` (the wgmma kernel's): ``"exact"`` multiplies float q and the fp32 probabilities P as bf16 hi + lo pairs
(two MMAs per product); ``"p-bf16"`` rounds P to bf16 for P V (one MMA; the softmax sum stays that of the fp32 P);
``"bf16"`` rounds float q to bf16 too, and walks the keys in 64-key tiles (the shared memory of q's lo half holds
the larger K / V tiles). The measured fidelity and speed: docs/cuda.md "Prefill attention precision".
Under ``variant="auto"`` a device without the wgmma kernel computes ``"exact"`` whatever the precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, check_array, grid_1d, sm_count
from ninfer.cuda.attention import HEAD_DIMS, attention_out, paged_query, paged_rows
from ninfer.cuda.loader import kernel

__all__ = [
    "attention_prefill",
    "SOURCES",
    "HEAD_DIMS",
    "BLOCK_ROWS",
    "GQA_SLOTS",
    "VARIANTS",
    "PRECISIONS",
    "block_keys",
    "gqa_rows",
    "smem_bytes",
    "key_splits",
    "SPLIT_SCRATCH_BYTES",
]

_T = ("float", "bf16")
BLOCK_ROWS = 64  # query rows per block of the one-head kernel (AP_BM)
GQA_SLOTS = 128  # (row, query head) slots per block of the GQA kernel (AG_SLOTS)
VARIANTS = ("auto", "gqa", "head", "wg", "ws")
_THREADS = {"gqa": 256, "head": 128, "wg": 256, "ws": 384}
_NAMES = {
    "gqa": "attention_prefill_gqa",
    "head": "attention_prefill",
    "wg": "attention_prefill_wg",
    "ws": "attention_prefill_ws",
}
_FILES = {
    "gqa": "attention_prefill.cu",
    "head": "attention_prefill.cu",
    "wg": "attention_wg.cu",
    "ws": "attention_ws.cu",
}
# The warp-specialized kernel (attention_ws.cu: the "wg" kernel at precision "bf16" with a producer warpgroup and
# mbarriers; the same bits): its (OV, PP) options, intra-warpgroup overlap of a tile's softmax with the previous
# tile's P V and ping-pong turns of the two consumer warpgroups, and whether "auto" takes it at precision "bf16".
# Module switches read at launch (perf/bench_attention.py times the options against "wg").
WS_OPTIONS = (False, True)
WS_AUTO = True
_WS_OPTIONS = ((False, False), (False, True), (True, False), (True, True))
WG_HEAD_DIM = 256  # the wgmma kernel's P V product is m64n256: the served models' head size
WG_KEYS = 32  # its KV tile (AW_BN) ...
WG_KEYS_ROUNDED = 64  # ... and the rounded-q kernel's (precision "bf16")
SOURCES: dict[str, tuple[str, ...]] = {
    "attention_prefill.cu": tuple(
        f"{n}<{t}, {d}>"
        for n in ("attention_prefill_gqa", "attention_prefill", "attention_prefill_combine")
        for t in _T
        for d in HEAD_DIMS
    ),
    "attention_wg.cu": (
        *(f"attention_prefill_wg<{t}, {WG_HEAD_DIM}>" for t in _T),
        *(f"attention_prefill_wg<{t}, {WG_HEAD_DIM}, true, false>" for t in _T),
        *(f"attention_prefill_wg<{t}, {WG_HEAD_DIM}, false, false, {WG_KEYS_ROUNDED}>" for t in _T),
    ),
    "attention_ws.cu": tuple(
        f"attention_prefill_ws<{t}, {WG_HEAD_DIM}, {str(ov).lower()}, {str(pp).lower()}>"
        for t in _T
        for ov, pp in _WS_OPTIONS
    ),
}
# precision -> the wgmma kernel's (QLO, PLO[, BN]) template arguments: the lo halves of float q / of P in the
# products, and the 64-key tiles that fit without q's lo half
PRECISIONS = ("exact", "p-bf16", "bf16")
_WG_LO = {"exact": None, "p-bf16": "true, false", "bf16": f"false, false, {WG_KEYS_ROUNDED}"}
# Key splits (GQA kernel): a launch of few blocks (a follow-up turn's few hundred rows over a long prefix: 52 blocks
# of the 27B at 256 rows, each walking all 8K keys, on 132 SMs) splits every row's keys at multiples of split_keys,
# one block per (row tile, KV head, split), and merges the splits' partial states in a second launch. Up to
# SPLIT_WAVES waves of blocks, splits of at least SPLIT_MIN_KEYS keys, partials within SPLIT_SCRATCH_BYTES (the
# memory plan counts it); a row with one split keeps the unsplit kernel's bits.
SPLIT_WAVES, SPLIT_MIN_KEYS, SPLIT_SCRATCH_BYTES = 2, 512, 64 << 20


def block_keys(d: int, variant: str = "gqa", precision: str = "exact") -> int:
    """Keys per KV tile (ApCfg<D>::BN; the wgmma kernel's AW_BN is the same at its D = 256, except at precision
    ``"bf16"``: 64)."""
    if variant == "ws" or (variant == "wg" and precision == "bf16"):
        return WG_KEYS_ROUNDED
    return 32 if d == 256 else 64


def pick_variant(d: int, group: int, precision: str = "exact") -> str:
    """``"auto"``'s kernel for head size ``d``, ``group`` query heads per KV head and ``precision`` on the current
    device (never the launch's rows: a row's bits must not depend on the rows beside it)."""
    from ninfer.cuda.loader import compute_capability, family_supported

    if group > GQA_SLOTS:
        return "head"
    if d == WG_HEAD_DIM and family_supported("attention_wg.cu", compute_capability()):
        return "ws" if WS_AUTO and precision == "bf16" else "wg"
    return "gqa"


def gqa_rows(group: int) -> int:
    """Query rows per block of the GQA kernel: 128 (row, head) slots over ``group`` heads per KV head."""
    return GQA_SLOTS // group


def smem_bytes(d: int, t: str, variant: str = "gqa", precision: str = "exact") -> int:
    """Dynamic shared memory of one block, bf16 words of rows padded to D+8. One-head kernel: Qh (+ Ql for float
    q) [64][D+8], Ks and Vs [BN][D+8]. GQA kernel: Qh (+ Ql) [128][D+8], Ks and Vs [2][BN][D+8], then the rows'
    sequence and position (2 x 128 int32). The wgmma kernel stages Ql only at precision ``"exact"`` / ``"p-bf16"``."""
    ld, halves = d + 8, 2 if t == "float" and precision != "bf16" else 1
    if variant in ("wg", "ws"):  # swizzled tiles of 64-element rows (no padding), 1024-byte aligned
        bn = block_keys(d, variant, precision)
        bars = 64 if variant == "ws" else 0  # its 8 mbarriers
        return 1024 + 2 * d * (GQA_SLOTS * halves + 4 * bn) + 8 * GQA_SLOTS + bars
    if variant == "head":
        return 2 * ld * (BLOCK_ROWS * halves + 2 * block_keys(d))
    return 2 * ld * (GQA_SLOTS * halves + 4 * block_keys(d)) + 8 * GQA_SLOTS


def key_splits(rows: int, hq: int, hkv: int, d: int, max_len: int, sms: int, bn: int | None = None) -> int:
    """Keys per split (a multiple of the KV tile, ``bn``: :func:`block_keys` of the GQA kernel by default) for a GQA
    launch of ``rows`` rows whose positions are below ``max_len``, or 0 for one split: only where the unsplit grid
    fills less than one wave of ``sms`` blocks."""
    base = -(-rows // gqa_rows(hq // hkv)) * hkv
    n = min(
        SPLIT_WAVES * sms // base, max_len // SPLIT_MIN_KEYS, SPLIT_SCRATCH_BYTES // (rows * hq * (d + 2) * 4)
    )
    if base >= sms or n < 2:
        return 0
    bn = bn or block_keys(d)
    return -(-max_len // (n * bn)) * bn


def _check_aligned(a: Any, name: str) -> None:
    if a.data.ptr % 16:
        raise KernelError(
            f"{name}: the kernel reads 16-byte vectors; the base pointer must be 16-byte aligned"
        )


def attention_prefill(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    page_table: Any,
    row_seq: Any,
    row_pos: Any,
    *,
    max_len: int,
    scale: float | None = None,
    out: Any = None,
    variant: str = "auto",
    split_keys: int | None = None,
    precision: str = "exact",
) -> Any:
    """Causal GQA attention of ``q[R, Hq, D]`` (float32 or bf16 words) over bf16 (uint16) caches: row r
    (sequence ``row_seq[r]``) attends positions ``0..row_pos[r]`` of its pages in ``page_table[B, max_pages]``;
    ``max_len`` bounds ``row_pos + 1``. Rows of several sequences may share a launch (any order). ``variant``:
    ``"auto"`` (:func:`pick_variant`), ``"gqa"`` (query heads of a KV head in one block), ``"wg"`` (that block on
    wgmma; sm_90a, D = 256), ``"ws"`` (the ``"wg"`` kernel at precision ``"bf16"``, warp-specialized: the same
    bits; :data:`WS_OPTIONS`) or ``"head"`` (the earlier one-head blocks).
    ``split_keys`` (GQA kernel; None: :func:`key_splits`, 0: none): keys per split of each row's keys; rows with
    keys in several splits are merged from the splits' partial states (within fp32 rounding of the unsplit
    result), the others keep its bits. ``precision`` (:data:`PRECISIONS`, the module's docstring): the wgmma
    kernel's operand rounding; another explicit variant computes ``"exact"`` only."""
    if variant not in VARIANTS:
        raise KernelError(f"variant: {variant!r} is not one of {VARIANTS}")
    if precision not in PRECISIONS:
        raise KernelError(f"precision: {precision!r} is not one of {PRECISIONS}")
    if variant == "ws" and precision != "bf16":
        raise KernelError(f"variant 'ws' computes precision 'bf16' only, not {precision!r}")
    if precision != "exact" and variant not in ("auto", "wg", "ws"):
        raise KernelError(
            f"precision {precision!r}: the wgmma kernels' (variant 'wg', 'ws' or 'auto'), not {variant!r}"
        )

    t, (r, hq, d), hkv = paged_query(q, k_cache)
    check_array(k_cache, "k_cache", dtype=np.uint16, shape=(None, None, hkv, d))
    check_array(v_cache, "v_cache", dtype=np.uint16, shape=k_cache.shape)
    if hkv <= 0 or hq % hkv:
        raise KernelError(f"q: {hq} heads must be a multiple of the {hkv} KV heads")
    page_size = paged_rows(page_table, row_seq, row_pos, r, k_cache.shape[1], max_len)
    scale = float(d) ** -0.5 if scale is None else scale
    out = attention_out(q, out)
    for a, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        _check_aligned(a, name)
    if r == 0:
        return out
    group = hq // hkv
    if variant == "auto":
        variant = pick_variant(d, group, precision)
    if group > GQA_SLOTS:  # more heads per KV head than a block's slots: one head per block
        variant = "head"
    if variant in ("wg", "ws") and d != WG_HEAD_DIM:
        raise KernelError(f"variant {variant!r} computes D = {WG_HEAD_DIM} only, not {d}")
    name = f"{_NAMES[variant]}<{t}, {d}>"
    if variant not in ("wg", "ws"):
        precision = "exact"  # "auto" on a device without the wgmma kernel
    if variant == "wg" and precision != "exact":  # bf16 q has no lo half: "bf16" differs by its 64-key tiles
        name = f"{_NAMES[variant]}<{t}, {d}, {_WG_LO[precision]}>"
    if variant == "ws":
        ov, pp = WS_OPTIONS
        name = f"{_NAMES[variant]}<{t}, {d}, {str(ov).lower()}, {str(pp).lower()}>"
    bn = block_keys(d, variant, precision)
    fn = kernel(_FILES[variant], SOURCES[_FILES[variant]], name)
    smem = smem_bytes(d, t, variant, precision)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    args = (q, k_cache, v_cache, page_table, row_seq, row_pos, out, np.int32(r), np.int32(hq), np.int32(hkv),
            np.int32(page_size), np.int64(page_table.shape[1]), np.float32(scale))  # fmt: skip
    if variant == "head":
        fn((-(-r // BLOCK_ROWS), hq), (_THREADS[variant],), args, shared_mem=smem)
        return out
    import cupy

    if split_keys is None:
        split_keys = key_splits(r, hq, hkv, d, max_len, sm_count(cupy.cuda.Device().id), bn)
    if split_keys < 0 or split_keys % bn:
        raise KernelError(f"split_keys={split_keys}: a non-negative multiple of {bn}")
    grid = (-(-r // gqa_rows(group)), hkv)
    if not split_keys or split_keys >= max_len:
        fn(grid, (_THREADS[variant],), (*args, np.int32(0), np.uint64(0)), shared_mem=smem)
        return out
    n = -(-max_len // split_keys)
    part = cupy.empty(n * r * hq * (d + 2), dtype=np.float32)
    fn((*grid, n), (_THREADS[variant],), (*args, np.int32(split_keys), part), shared_mem=smem)
    comb = kernel(
        "attention_prefill.cu", SOURCES["attention_prefill.cu"], f"attention_prefill_combine<{t}, {d}>"
    )
    comb(
        (grid_1d(r * hq * d, 256),),
        (256,),
        (part, row_pos, out, np.int32(r), np.int32(hq), np.int32(split_keys)),
    )
    return out
