"""The Hopper prefill GEMM's pair and fp16 modes: which formats fold, and the rules that plan a call (docs/cuda.md,
"Prefill GEMM on Hopper", "Prefill GEMM inputs"): the row thresholds, the fp16 mode's kernel (``variant``: cp or ws,
:func:`f16_auto_ws`), the ws kernel's K splits (:func:`splitk_splits`), the scratch chunks and caps (:func:`_plan`)
and the scratch bounds the memory plan counts; :func:`_pair_plan` turns them into gemm_pair's launch decisions.

The tunables below and every rule that reads them live here, so a test or benchmark patches them in this module
(gemm_pair.py re-exports the names, but its copies are not read); every cache of a rule's result is keyed on them
(:func:`knobs`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from ninfer.cuda._common import KernelError

__all__ = [
    "PAIR_STRUCTS",
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
    "knobs",
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
_WS_THREADS, _WS_BN, _WSG_BN = 384, 256, 128  # WS_THREADS, WS_BN, WSG_BN in cuda_src/ws_sched.cuh
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
# The group-int formats' fp16 mode (ninfer/cuda/gemm_group.py: gemm90_f16_wsg, the codes as fp16 operands and the
# group scales on partial sums). On since its GPU tests and perf.bench_gemm ran (H100, 7a13526: 3.2-4.4x the exact
# in-loop kernel on the 27B's projections at 2048-8192 rows, perf/results/bench_gemm_group_7a13526_h100.txt); off,
# gemm(..., inputs="fp16") keeps these formats on the exact in-loop kernel.
GROUP_F16 = True
# The Q4/Q5/Q6 fp16 kernel with each K tile's group scaling deferred until the next tile's wgmmas are issued
# (gemm90_f16_wsgd<1>: bitwise gemm90_f16_wsg<1>). Off: measured 0.81-0.89x of the undeferred kernel (H200, 27B
# projections, perf.bench_gemm f16gd vs f16gk, perf/results/bench_gemm_group_defer_68cdc39_h200.txt).
GROUP_DEFER = False
# BF16 weights in the fp16 mode (ninfer/cuda/gemm_bf16.py: each weight row scaled by a power of two into exact fp16,
# kept operands only). On since the same run (1.6-2.1x the exact pair mode). Only for weights of at least
# BF16_F16_MIN_ELEMS: the tensors every profile keeps BF16 because they are small or precision-critical (the MoE
# router, the GDN a / b projections, the shared-expert gate: artifact/registry.py) stay on the exact path, where
# their GEMMs cost next to nothing.
BF16_F16 = True
BF16_F16_MIN_ELEMS = 1 << 22
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


def f16_auto_ws(m: int, n: int, k: int) -> bool:
    """``variant="auto"``: whether an ``m``-row fp16-mode GEMM with an ``n`` x ``k`` weight takes the ws kernel
    (the rules above: by rows and weight size, bitwise the cp kernel there; and wherever split-K applies from
    F16_WS_SPLIT_ROWS rows, a function of (m, n, k) as well)."""
    if m >= F16_WS_ROWS or (m >= F16_WS_WIDE_ROWS and n * k >= F16_WS_WIDE_ELEMS):
        return True
    return m >= F16_WS_SPLIT_ROWS and splitk_splits(m, n, k) > 1


def splitk_splits(m: int, n: int, k: int) -> int:
    """The ws kernel's K splits S for an ``m`` x ``n`` x ``k`` GEMM (the rule above; 1: unsplit). Depends on the
    tile counts only, and on the SPLITK_* tunables as they are now (:func:`_splitk_knobs`: passed to the cached
    rule, so a patched tunable takes effect without clearing a cache)."""
    return _splitk_rule(m, n, k, _splitk_knobs())


def _splitk_knobs() -> tuple[float, ...]:
    """The split rule's tunables, in :func:`_splitk_rule`'s order."""
    return (
        SPLITK_WAVE,
        SPLITK_MAX,
        SPLITK_MIN_KSTEPS,
        SPLITK_UNIT_KSTEPS,
        SPLITK_REDUCE_KSTEPS,
        SPLITK_KSTEP_BYTES,
    )


@functools.lru_cache(maxsize=4096)
def _splitk_rule(m: int, n: int, k: int, knobs: tuple[float, ...]) -> int:
    """splitk_splits with its tunables as arguments (``knobs``: :func:`_splitk_knobs`), so the cache is keyed on
    everything the result depends on."""
    wave, most, min_ksteps, unit_ksteps, reduce_ksteps, kstep_bytes = knobs
    tiles, nk = -(-m // _BM) * -(-n // _WS_BN), -(-k // 64)
    if tiles >= wave:
        return 1
    best, cost = 1, nk + unit_ksteps
    for s in range(2, int(most) + 1):
        if nk // s < min_ksteps:
            break
        rounds = -(-tiles * s // wave)
        c = rounds * (-(-nk // s) + unit_ksteps) + reduce_ksteps
        c += 2 * s * tiles * _BM * _WS_BN * 4 / kstep_bytes
        if c < cost:
            best, cost = s, c
    return best


def splitk_scratch_bytes(rows: int, shapes: Iterable[tuple[int, int]], group: bool = True) -> int:
    """Upper bound of the split-K workspace after fp16-mode GEMMs of at most ``rows`` rows against weights of
    ``shapes`` ((N, K) each): the largest S x M x N x 4 the rule gives (S depends on M only through its row tiles,
    so the top of each 128-row band is the band's largest). Counted as if every such GEMM took the ws kernel, and with
    GROUP_F16 also as the group kernel (its rule sees twice the tiles: gemm_group.gemm_group_f16) unless ``group`` is
    False (no weight in a group format)."""
    most = 0
    for n, k in shapes:
        for tm in range(1, -(-rows // _BM) + 1):
            m = min(rows, tm * _BM)
            s = splitk_splits(m, n, k) if m >= PAIR_MIN_ROWS else 1
            # the group kernel's 128-column tiles (gemm_group.py)
            if group and GROUP_F16 and m >= PAIR_MIN_ROWS:
                s = max(s, splitk_splits(m, 2 * n, k))
            if s > 1:
                most = max(most, 4 * s * m * n)
    return most


def forced_splits(variant: str) -> int | None:
    """The K splits S that a ``ws<S>`` variant forces; None for the others (the split rule decides)."""
    return int(variant[2:]) if variant.startswith("ws") and variant != "ws" else None


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


def knobs() -> tuple[float, ...]:
    """The module's tunables that the chunk and kernel rules read (tests and benchmarks patch them), the split
    rule's among them (:func:`_splitk_knobs`: ``ws``'s S and ``auto``'s kernel depend on them): part of the key of
    every cache of those rules' results."""
    return (
        _X_CAP,
        _W_CAP,
        F16_WS_ROWS,
        F16_WS_WIDE_ROWS,
        F16_WS_WIDE_ELEMS,
        F16_WS_SPLIT_ROWS,
        *_splitk_knobs(),
    )


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
    forced = forced_splits(variant)
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
