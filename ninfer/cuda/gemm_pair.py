"""The Hopper prefill GEMM's pair mode (cuda_src/gemm_sm90.cu ``gemm90_pair``): float32 activations split once per
GEMM into bf16 hi / lo arrays (``split_hilo``), weights of the exactly foldable formats dequantized once per GEMM
into a bf16 scratch (``dequant90``), then a main loop of cp.async copies and wgmma only (docs/cuda.md, "Prefill
GEMM on Hopper").

The result is bitwise the in-loop kernel's (``gemm90<D, float>``): the same split (split8), the same operand values
(the format's own make()), the same tiles, MMA order and epilogue. So the row threshold below only moves time, never
values: a row's result depends only on K, on either side of it.

Used by :func:`ninfer.cuda.gemm.gemm`; the kernels come from its compiled gemm_sm90.cu module (``kernel_of``), so
this module does not import gemm (no cycle).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ninfer.cuda._common import F16Rows, KernelError, grid_1d
from ninfer.cuda.launch import launch_ex
from ninfer.cuda.tensor_map import encode, map_params

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

# format id -> (the pair kernel's weight struct in cuda_src/wdq.cuh, the dequant90 struct or None). Only formats
# whose operand tile is the stored weight times a fixed power of two (FP8: e4m3 codes, NVFP4: e2m1 x e4m3 block
# scale x 2^-7; both exact in bf16, tests/test_gemm_pair_host.py enumerates them) fold; their per-row or per-tensor
# fp32 factors stay in the epilogue. The group-int formats (code x f16 group scale: up to 19 significant bits) keep
# the in-loop kernel.
PAIR_STRUCTS: dict[str, tuple[str, str | None]] = {
    "BF16": ("DqBF16", None),
    "FP8E4M3_F32ROW": ("DqFolded<DqFP8<true>>", "DqFP8<true>"),
    "FP8E4M3_F32T": ("DqFolded<DqFP8<false>>", "DqFP8<false>"),
    "NVFP4G16_E4M3S": ("DqFolded<DqNVFP4<false>>", "DqNVFP4<false>"),
    "NVFP4G16_E4M3S_ROWG": ("DqFolded<DqNVFP4<true>>", "DqNVFP4<true>"),
}
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
# The fp16 mode's scratch kernel (``variant``): "cp" gemm90_f16 (cp.async ring, every thread copies and computes),
# "ws" gemm90_f16_ws (cuda_src/gemm_sm90_ws.cu: TMA ring, producer warpgroup, persistent CTAs), bitwise the same
# results; "auto" (the default) picks by rows. Measured on the H200 at 855128a (perf/results/bench_gemm_855128a.txt,
# NVFP4, the 27B's projections): ws / cp at 2048 rows 1.14-1.31x, at 8192 1.24-1.33x (ws 82-95% of cuBLAS bf16);
# at 384-512 rows 0.95-1.18x (the wide MLP projections gain, o_proj and the GDN qkv lose up to 5%); at 256 rows
# 0.86-1.12x. From F16_WS_ROWS rows the MLP projections' gain outweighs the narrow ones' loss. A wide weight (at
# least F16_WS_WIDE_ELEMS = N x K elements) takes ws from F16_WS_WIDE_ROWS already: at 256 rows ws / cp was 1.12x on
# the 17408 x 5120 up projection and 1.09x on the 5120 x 17408 down projection (89M elements each), 0.99x on the
# 10240 x 5120 GDN qkv (52M) and 0.86x on the 5120 x 6144 o_proj (31M): the gain grows with the weight. A 256-token
# follow-up turn of the 27B runs most of its FLOPs in its gate|up and down projections.
# Split-K (below): "ws" takes the rule's S (splitk_splits), "ws1" .. "ws16" force S (benchmarks and tests; "ws1" is
# the unsplit kernel, bitwise "cp"). With split-K the ws kernel also takes the GEMMs that the rule splits from
# F16_WS_SPLIT_ROWS rows (the fp16 mode's floor): there the cp kernel runs one CTA per tile on a fraction of the
# SMs (the 27B's o-projections at 256 rows: 40 of 132), the split ws kernel ~one full wave. Measured on the H200
# (8cf0e04, `python -m perf.bench_gemm --splitk --rows 256,512`, NVFP4 with kept operands, perf/results/
# bench_gemm_splitk_8cf0e04.json; TFLOP/s, cp / ws at the S shown): the down projection (K 17408, 272 K steps) at
# 256 rows 187 / 334 (S 3), at 512 350 / 530 (S 3); the o-projection (K 6144, 96 steps) lost at every S (256 rows:
# 161 / 115-134), so a split needs SPLITK_MIN_KSTEPS = 64 K steps per unit (the o-projections keep cp below 384
# rows). With kept operands (no dequant pass in either kernel) the unsplit ws kernel lost to cp at 256 rows on the
# 73-84M-element q|k|v|gate and GDN in-projections (0.78-0.81x) and won on gate|up (178M, 1.28x): hence
# F16_WS_WIDE_ELEMS = 128M. At 512 rows ws1 wins on all but the o-projection (0.87x).
SPLITK_FORCE_MAX = 16
F16_VARIANTS = ("auto", "cp", "ws", *(f"ws{s}" for s in range(1, SPLITK_FORCE_MAX + 1)))
F16_WS_ROWS = 384
F16_WS_WIDE_ROWS = 256
F16_WS_WIDE_ELEMS = 128 << 20
F16_WS_SPLIT_ROWS = 128
WS_INSTANCES: tuple[str, ...] = tuple(
    f"{kern}<{s}>"
    for kern in ("gemm90_f16_ws", "gemm90_f16_ws_reduce", "gemm90_f16_ws_swiglu")
    for s, d in PAIR_STRUCTS.values()
    if d is not None
)
# Split-K of the ws kernel (cuda_src/ws_sched.cuh: work units = output tile x K split; split s of S covers K tiles
# [s T / S, (s + 1) T / S) of T = ceil(K / 64); partials to a [S, M, N] fp32 workspace, then gemm90_f16_ws_reduce
# adds them in split order and applies the epilogue). S is a function of the tile counts (ceil(M / 128),
# ceil(N / 256), T) only, never of the device: SPLITK_WAVE is the H200's 132 SMs as a constant, so a row's bits do
# not change with the GPU it runs on. The rule: S = 1 from SPLITK_WAVE tiles (one full wave already; the 2K-8K-row
# prefill chunks keep the unsplit kernel and its bits), else the S <= SPLITK_MAX, with every split at least
# SPLITK_MIN_KSTEPS K tiles long, that minimizes an estimated time in K-tile steps of one CTA:
#   rounds(S) x (ceil(T / S) + SPLITK_UNIT_KSTEPS) + SPLITK_REDUCE_KSTEPS + 2 S tiles 128 KiB / SPLITK_KSTEP_BYTES
# rounds = ceil(tiles S / SPLITK_WAVE) (units are all one length, so a partial last round costs a whole one: 40
# tiles take S = 3, one round of T / 3, not S = 4, two rounds of T / 4); the last term is the partials' traffic
# (written, then read by the reduction; tile-padded) against the bytes the GPU moves in one K step (~0.7 us per
# 128 x 256 x 64 step at ~790 TFLOP/s, at ~3 TB/s). At S = 1 the estimate is T + SPLITK_UNIT_KSTEPS.
SPLITK_WAVE = 132
SPLITK_MAX = 8
SPLITK_MIN_KSTEPS = 64
SPLITK_UNIT_KSTEPS = 2.0  # a unit's fixed cost (ring fill, epilogue) in K steps: estimate
SPLITK_REDUCE_KSTEPS = 4.0  # the reduction launch's fixed cost in K steps: estimate
SPLITK_KSTEP_BYTES = 2 << 20  # partial traffic that costs one K step: estimate
_WS_THREADS, _WS_BN = 384, 256  # WS_THREADS, WS_BN in cuda_src/ws_sched.cuh
_REDUCE_THREADS = 256  # gemm90_f16_ws_reduce's columns per block (gemm_sm90_ws.cu)

# Rows from which a float32 GEMM takes the pair mode. Below one full 128-row tile the GEMM is one partial wave of
# M-independent tiles while the pre-passes cost fixed memory traffic (dequant: read the stored bytes and write 2 per
# weight, ~N*K*2.6 B at ~3.5 TB/s, e.g. 65 us for the 17408 x 5120 MLP up projection; the pair GEMM then reads 2 B
# per weight instead of 0.56). Estimated from the H200 figures (perf/results/bench_kernels.txt, 20761f5): with
# float x the in-loop kernel spends ~3.4 us per CTA and K tile (NVFP4, 161 TFLOP/s over 132 SMs), copy + wgmma at
# the bf16 path's tensor rate ~2 us, so even a single wave saves ~1.4 us x K/64, more than the dequant pass costs
# for N below ~30k. 128 keeps a margin (not measured below 2048 rows; `python -m perf.bench_gemm --rows 128,512`
# compares both paths there). Results are bitwise the same on either side.
PAIR_MIN_ROWS = 128
# The fp16 mode's in-loop kernel (gemm90_f16il: every CTA converts its own weight tiles in the main loop instead of
# one dequant pass into the fp16 scratch) is bitwise the scratch kernel but slower at every row count measured on the
# H200 at 855128a (perf/results/bench_gemm_855128a.txt, NVFP4, the 27B's projections: 0.89-1.02x of the scratch
# path at 256 rows, 0.74-0.82x at 2048-8192): the conversion's CUDA-core work per row tile costs more than the dequant
# pass's ~4.6 B per weight. It runs only where asked for (``inloop=True``; gemm.gemm's ``impl="wgmma"``).
_BM, _BN, _THREADS, _SMEM = 128, 256, 256, 232448  # GS_BM, DqBF16::BN, GS_THREADS, GS_SMEM
# Scratch caps (bytes): the bf16 weight copy (the 27B's largest fused projection, gate|up 34816 x 5120, is 340 MiB;
# larger weights run in row chunks of the cap) and the hi / lo activations (4 B per element: 8192 rows of the 27B's
# 17408-wide down projection input are 544 MiB; more rows run in row chunks). Row independence makes any chunking
# bitwise equal to one launch.
_W_CAP, _X_CAP = 384 << 20, 640 << 20
_SPLIT_THREADS = 256
# split_f16row_in keeps a row's transformed inputs in shared memory up to this many bytes (the 27B's 17408-wide
# down-projection rows: 68 KB, three blocks per SM), else reads them twice
_SPLIT_KEEP_BYTES = 96 << 10
# (device, stream, kind) -> grow-only uint16 buffer: sized by the largest call so far (at most the caps above), then
# reused without allocating; one per stream, so GEMMs on different streams never share one.
_SCRATCH: dict[tuple[int, int, str], Any] = {}


def f16_auto_ws(m: int, n: int, k: int) -> bool:
    """``variant="auto"``: whether an ``m``-row fp16-mode GEMM with an ``n`` x ``k`` weight takes the ws kernel
    (the rules above: by rows and weight size, bitwise the cp kernel there; and wherever split-K applies from
    F16_WS_SPLIT_ROWS rows, a function of (m, n, k) as well)."""
    if m >= F16_WS_ROWS or (m >= F16_WS_WIDE_ROWS and n * k >= F16_WS_WIDE_ELEMS):
        return True
    return m >= F16_WS_SPLIT_ROWS and splitk_splits(m, n, k) > 1


@functools.lru_cache(maxsize=4096)
def splitk_splits(m: int, n: int, k: int) -> int:
    """The ws kernel's K splits S for an ``m`` x ``n`` x ``k`` GEMM (the rule above; 1: unsplit). Depends on the
    tile counts only."""
    tiles, nk = -(-m // _BM) * -(-n // _WS_BN), -(-k // 64)
    if tiles >= SPLITK_WAVE:
        return 1
    best, cost = 1, nk + SPLITK_UNIT_KSTEPS
    for s in range(2, SPLITK_MAX + 1):
        if nk // s < SPLITK_MIN_KSTEPS:
            break
        rounds = -(-tiles * s // SPLITK_WAVE)
        c = rounds * (-(-nk // s) + SPLITK_UNIT_KSTEPS) + SPLITK_REDUCE_KSTEPS
        c += 2 * s * tiles * _BM * _WS_BN * 4 / SPLITK_KSTEP_BYTES
        if c < cost:
            best, cost = s, c
    return best


def splitk_scratch_bytes(rows: int, shapes: Iterable[tuple[int, int]]) -> int:
    """Upper bound of the split-K workspace after fp16-mode GEMMs of at most ``rows`` rows against weights of
    ``shapes`` ((N, K) each): the largest S x M x N x 4 the rule gives (S depends on M only through its row tiles,
    so the top of each 128-row band is the band's largest). Counted as if every such GEMM took the ws kernel."""
    most = 0
    for n, k in shapes:
        for tm in range(1, -(-rows // _BM) + 1):
            m = min(rows, tm * _BM)
            s = splitk_splits(m, n, k) if m >= PAIR_MIN_ROWS else 1
            if s > 1:
                most = max(most, 4 * s * m * n)
    return most


def pair_foldable(fmt: str, t: str) -> bool:
    """Whether a GEMM of float ``t`` activations against format ``fmt`` can take the pair mode."""
    return t == "float" and fmt in PAIR_STRUCTS


def f16_foldable(fmt: str) -> bool:
    """Whether format ``fmt`` has the fp16 mode (``inputs="fp16"``): its operand values are exact in fp16."""
    return fmt in PAIR_STRUCTS and PAIR_STRUCTS[fmt][1] is not None


def _chunks(total: int, cap: int, unit: int) -> int:
    """Balanced chunk length (a multiple of ``unit``) covering ``total`` with chunks of at most ``cap``."""
    cap = max(unit, cap // unit * unit)
    per = -(-total // -(-total // cap))  # ceil(total / number of chunks)
    return min(cap, -(-per // unit) * unit)


def _plan(fmt: str, m: int, n: int, k: int) -> tuple[int, int]:
    """(activation rows per chunk, weight rows per chunk)."""
    mx = _chunks(m, _X_CAP // (4 * k), _BM)
    nw = n if PAIR_STRUCTS[fmt][1] is None else _chunks(n, _W_CAP // (2 * k), _BN)
    return min(mx, m), min(nw, n)


def pair_scratch_bytes(rows: int, k_max: int, weight_max: int) -> int:
    """Upper bound of the pair scratch after GEMMs of at most ``rows`` rows, ``k_max`` columns and ``weight_max``
    weight elements (the memory plan's prefill workspace): hi / lo of one row chunk, one weight chunk."""
    if rows < PAIR_MIN_ROWS:
        return 0
    act = min(4 * rows * k_max, max(_X_CAP, 4 * _BM * k_max))
    return act + min(2 * weight_max, max(_W_CAP, 2 * _BN * k_max))


def _scratch(kind: str, elems: int) -> Any:
    import cupy

    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, kind)
    buf = _SCRATCH.get(key)
    if buf is None or buf.size < elems:
        _SCRATCH.pop(key, None)  # the pool reuses the old block (stream-ordered) for the new one
        buf = _SCRATCH[key] = cupy.empty(elems, dtype=np.uint16)
    return buf[:elems]


def release_scratch() -> None:
    """Drop the cached scratch buffers (tests, or to give the memory back to the pool)."""
    _SCRATCH.clear()


def f16_rows(
    x: Any,
    ldx: int,
    kernel_of: Callable[[str], Any],
    *,
    rows: Any = None,
    swiglu: bool = False,
    gate: tuple[Any, int] | None = None,
) -> tuple[Any, Any]:
    """The fp16 mode's activation rows for a kernel that reads them itself (the MoE prefill GEMM): ``split_f16row``
    of float32 ``x[M, K]`` (row stride ``ldx``, M > 0) into the scratch, as (fp16 words ``[M, K]`` as uint16, one
    float32 factor per row). Input transforms, bitwise the same as applying them first (``split_f16row_in``):
    ``rows`` (int32 ``[M']`` on the device), row m is ``x[rows[m]]``; ``swiglu``, ``x`` holds [gate | up] rows of
    width 2K and row m is their SwiGLU; ``gate=(qg, D)`` (alone), row m is ``x[m] * sigmoid(gate)`` with the gate
    read in place from the q|gate projection ``qg[M, 2K]`` ([query D | gate D] per head; D % 8 == 0, 16-byte
    aligned rows: ``split_f16row_gate``), sigmoid_gate's values. Not for graph capture (the scratch may be
    reallocated)."""
    m = x.shape[0] if rows is None else rows.shape[0]
    k = x.shape[1] // 2 if swiglu else x.shape[1]
    xh, rowf = f16_scratch(m, k)
    if gate is not None:
        if rows is not None or swiglu:
            raise ValueError("f16_rows: the gate is the only transform of its rows")
        _split_gate(x, ldx, kernel_of("split_f16row_gate"), gate, xh, rowf)
        return xh, rowf
    if rows is None and not swiglu:
        kernel_of("split_f16row")(
            (m,), (_SPLIT_THREADS,), (x, xh, rowf, np.int32(m), np.int32(k), np.int64(ldx))
        )
        return xh, rowf
    fn = kernel_of(f"split_f16row_in<{str(rows is not None).lower()}, {str(swiglu).lower()}>")
    # the row's inputs kept in shared memory between the kernel's two passes
    keep = 4 * k <= _SPLIT_KEEP_BYTES
    if keep and fn.max_dynamic_shared_size_bytes < 4 * k:
        fn.max_dynamic_shared_size_bytes = _SPLIT_KEEP_BYTES
    ptr = rows if rows is not None else np.uint64(0)
    args = (x, ptr, xh, rowf, np.int32(m), np.int32(k), np.int64(ldx), np.int32(keep))
    fn((m,), (_SPLIT_THREADS,), args, shared_mem=4 * k if keep else 0)
    return xh, rowf


def f16_scratch(m: int, k: int) -> tuple[Any, Any]:
    """The fp16 row scratch of ``m`` rows of ``k``: (fp16 words, flat ``[m k]`` uint16; ``m`` float32 factors)."""
    buf = _scratch("x", m * k + 2 * m)
    return buf[: m * k], buf[m * k : m * k + 2 * m].view(np.float32)


def f16_token_rows(x: Any, ldx: int, kernel_of: Callable[[str], Any], rows: Any) -> tuple[Any, Any]:
    """The fp16 rows of a GEMM whose slot s reads token row ``rows[s]`` in place (gemm90_experts_f16g):
    ``split_f16row`` of the tokens' float32 ``x[T, K]`` (row stride ``ldx``, T > 0) into the scratch, as (fp16 words
    ``[T, K]`` as uint16, one float32 factor per SLOT: its token row's factor, gathered by ``take``). Each
    token's row is split once, not once per slot: its words depend only on that row, so the GEMM's operands are
    bitwise those of ``f16_rows(x, ldx, kernel_of, rows=rows)``. Not for graph capture (the scratch may be
    reallocated)."""
    t, k, s = x.shape[0], x.shape[1], rows.shape[0]
    buf = _scratch("x", t * k + 2 * t + 2 * s)
    xh, rowf = buf[: t * k], buf[t * k : t * k + 2 * t].view(np.float32)
    rowf_s = buf[t * k + 2 * t : t * k + 2 * t + 2 * s].view(np.float32)
    kernel_of("split_f16row")((t,), (_SPLIT_THREADS,), (x, xh, rowf, np.int32(t), np.int32(k), np.int64(ldx)))
    rowf.take(rows, out=rowf_s)  # one small launch: the slots' factors
    return xh, rowf_s


def _split_gate(x: Any, ldx: int, fn: Any, gate: tuple[Any, int], xh: Any, rowf: Any) -> None:
    """split_f16row_gate (``fn``) of ``x[M, K]`` with the gate of ``gate=(qg, D)`` into ``xh``, ``rowf``: the kernel
    reads the gate as sigmoid_gate does, from head 0's first gate element ``qg[:, D:]`` with qg's row stride; the
    row's gated values kept in shared memory between its two passes as split_f16row_in's are."""
    (m, k), (qg, d) = x.shape, gate
    keep = 4 * k <= _SPLIT_KEEP_BYTES
    if keep and fn.max_dynamic_shared_size_bytes < 4 * k:
        fn.max_dynamic_shared_size_bytes = _SPLIT_KEEP_BYTES
    args = (x, qg[:, d:], xh, rowf, np.int32(m), np.int32(k), np.int64(ldx), np.int32(d),
            np.int64(qg.strides[0] // 4), np.int32(keep))  # fmt: skip
    fn((m,), (_SPLIT_THREADS,), args, shared_mem=4 * k if keep else 0)


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
    wbuf = _scratch("w", nw * k) if dqfn is not None and kept is None else None
    xbuf = None if f16 else _scratch("x", 2 * mx * k)  # hi, lo (the fp16 rows: f16_rows, the same scratch)

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


def knobs() -> tuple[int, ...]:
    """The module's tunables that the chunk and kernel rules read (tests and benchmarks patch them): part of the
    key of every cache of those rules' results."""
    return (_X_CAP, _W_CAP, F16_WS_ROWS, F16_WS_WIDE_ROWS, F16_WS_WIDE_ELEMS, F16_WS_SPLIT_ROWS)


@functools.lru_cache(maxsize=4096)
def _pair_plan(
    fmt: str, m: int, n: int, k: int, f16: bool, inloop: bool, variant: str, transform: bool, _knobs: tuple
) -> tuple[bool, int, int, int, tuple[str, str | None, str | None]]:
    """gemm_pair's launch decisions, a function of its scalar arguments and the tunables (``_knobs``: the cache
    key only) (cached: its rules and kernel names cost ~10 us of host time per GEMM, perf/profile_host.py): (ws
    kernel, K splits, activation rows per chunk, weight rows per chunk, the names of (the GEMM kernel, its dequant
    pass or None, the split-K reduction or None)). Raises for the argument combinations gemm_pair refuses
    (``transform``: swiglu or gate)."""
    wstruct, dq = PAIR_STRUCTS[fmt]
    if f16 and dq is None:
        raise ValueError(f"gemm_pair: {fmt} has no fp16 mode (its operand values are not exact in fp16)")
    if transform and not f16:
        raise ValueError("gemm_pair: swiglu and gate are the fp16 mode's input transforms")
    if not f16 and inloop:
        raise ValueError("gemm_pair: inloop is the fp16 mode's choice")
    if variant not in F16_VARIANTS or (variant.startswith("ws") and not f16):
        raise KernelError(
            f"gemm_pair: variant={variant!r} (one of {F16_VARIANTS}; 'ws' in the fp16 mode only)"
        )
    ws = f16 and not inloop and (variant.startswith("ws") or (variant == "auto" and f16_auto_ws(m, n, k)))
    # S of the whole call, kept by every row / weight chunk (a partial depends on K and S only): the result is
    # the same chunked or not, from the scratch or a kept operand
    forced = int(variant[2:]) if variant.startswith("ws") and variant != "ws" else None
    splits = 1 if not ws else forced if forced is not None else splitk_splits(m, n, k)
    mx, nw = _plan(fmt, m, n, k)
    if inloop:
        nw = n  # the stored planes, read whole: no weight scratch
        name = f"gemm90_f16il<{dq}>"
    else:
        name = f"gemm90_f16{'_ws' if ws else ''}<{wstruct}>" if f16 else f"gemm90_pair<{wstruct}>"
    dq_name = None
    if dq is not None and not inloop:
        dq_name = f"dequant90<{dq}, true>" if f16 else f"dequant90<{dq}>"
    red_name = f"gemm90_f16_ws_reduce<{wstruct}>" if ws and splits > 1 else None
    return ws, splits, mx, nw, (name, dq_name, red_name)


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
    buf = operands.lookup(w, kind)
    if buf is None:
        n, k = w.rows, w.cols
        if not operands.admit(2 * n * k):
            return None
        import cupy

        buf = cupy.empty(n * k, dtype=np.uint16)
        _dequant(dqfn, planes, buf, 0, n, k)
        operands.keep(w, buf, kind)
    return [buf, *planes[1:]]


@functools.cache
def _sm_count(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=1024)
def _map(ptr: int, rows: int, k: int, box_rows: int) -> Any:
    """The tensor map of ``[rows, k]`` fp16 words (row stride k) at ``ptr``: a map holds an address and a layout,
    nothing owned, so one encoded for the same (address, layout) serves whatever buffer lives there now. Cached:
    two encodes per GEMM cost ~10 us each on the host, 1-2 ms of an eager 27B prefill chunk (perf/profile_host.py)."""
    return encode(ptr, map_params(rows, k, k, box_rows))


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
) -> None:
    """gemm90_f16_ws on fp16 rows ``xh`` [M, K] (row stride K), their factors ``rowf``, fp16 weight rows
    ``planes[0]`` [N, K] (row stride K) with the format's row-scale planes, into ``y`` (row stride ``ldy``);
    ``dims`` = (M, N, K, ldy). A persistent grid of one CTA per SM at most (the result does not depend on it).
    ``splits`` = S > 1: split-K, the S partials into the "part" scratch ([S, M, N] fp32), then ``reduce_fn``
    (gemm90_f16_ws_reduce of the same format) sums them in split order into ``y``."""
    import cupy

    m, n, k, ldy = dims
    p0, p1, p2 = planes
    ma, mb = _map(xh.data.ptr, m, k, _BM), _map(p0.data.ptr, n, k, _WS_BN)
    units = grid_1d(m, _BM) * grid_1d(n, _WS_BN) * splits
    grid = min(units, _sm_count(cupy.cuda.Device().id))
    part = _scratch("part", 2 * splits * m * n).view(np.float32) if splits > 1 else None
    args = (ma.arg, mb.arg, p1, p2, rowf, y, np.int32(m), np.int32(n), np.int32(k), np.int64(ldy),
            np.uint64(0) if part is None else part, np.int32(splits))  # fmt: skip
    launch_ex(fn, (grid,), (_WS_THREADS,), args, shared_mem=_SMEM)
    if part is not None:
        reduce_fn((m, grid_1d(n, _REDUCE_THREADS)), (_REDUCE_THREADS,),
                  (part, p1, p2, rowf, y, np.int32(m), np.int32(n), np.int32(splits), np.int64(ldy)))  # fmt: skip
