"""GDN's chunked prefill (cuda_src/gdn_chunk.cu; docs/model-math.md §4.6): the two-pass ``gdn_chunked`` (the
chunk-parallel intra-chunk work into a float32 scratch, then a short sequential state pass), its kernel variants and
instances, shared-memory and scratch sizes, and the older one-pass kernel of gdn.cu (a benchmark variant);
ninfer/cuda/gdn.py re-exports all of it. ``gdn_chunked`` is equal to the exact recurrence (gdn_step.py) within fp32
noise and much faster on long prompts; its argument checks are the recurrence's."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, check_array, check_rows, sm_count
from ninfer.cuda.gdn_step import _S, _T, HEAD_DIMS, _gdn_args, causal_conv
from ninfer.cuda.loader import kernel

__all__ = [
    "gdn_chunked",
    "chunk_instances",
    "chunk_slice",
    "chunk_smem_bytes",
    "chunk_scratch_bytes",
    "prep_smem_bytes",
    "prep_tc_smem_bytes",
    "prep_tc_conv_smem_bytes",
    "state_smem_bytes",
    "state_mma_smem_bytes",
    "state_wsp_smem_bytes",
    "state_cols",
    "STATE_VARIANTS",
    "SCRATCH_BF16",
    "PREFILL_GDN",
    "DEFAULT_VARIANT",
    "SERIAL_SOURCES",
]

CHUNK = 64  # GDN_CHUNK in gdn.cu, GC_CHUNK in gdn_chunk.cu
_SLICES = (32, 64)  # value columns per block of the serial variant gdn_chunked in gdn.cu (DVS)
STATE_COLS = (16, 32)  # value columns per block of gdn_chunk_state (its DVS; the same bits for either)
# the two-pass gdn_chunked's kernels: "mma" gdn_chunk_prep<., ., true> (K Kᵀ, Q Kᵀ) and gdn_chunk_state_mma (W S,
# Q S, A V', the state update) with their products as 3xTF32 mma.sync; "tc" the same state pass after
# gdn_chunk_prep_tc (gdn_prep_tc.cuh: the solve as a blocked inverse and a 3xTF32 product, 2 blocks per SM);
# "fp32" gdn_chunk_prep<., ., false> and gdn_chunk_state on fp32 FMAs; "serial" is the older one-pass kernel of
# gdn.cu (benchmarks only)
# "split": the tc prep, then the state pass split in two (gdn_state_split.cuh: gdn_chunk_state_h walks the chunks for
# V' and the states only, storing each chunk's starting state; gdn_chunk_out computes every chunk's output at
# once), bitwise the "tc" variant's results, with a per-chunk state array in the scratch; a benchmark variant:
# 1.5x slower than tc's state pass on the H200 (230d001, perf/results/bench_gdn_230d001.txt)
# "tc8": the tc prep, then gdn_chunk_state_mma with 8 warps per block instead of 4 (each warp half the columns of
# its 16 chunk rows and half as many state tiles: twice the warps per SM to hide the scratch loads and the mma
# chains), bitwise the "tc" variant's results; a benchmark variant: slower than tc's state pass on the 27B's heads
# (H200, 1c26c7b, perf/results/bench_gdn_1c26c7b.txt: 1.55 vs 1.04 ms at 32 columns, 4096 rows)
# "tcs": the tc prep, then gdn_chunk_state_mma reading each chunk's W and Q rows from shared memory, copied there by
# cp.async while the previous chunk's A V' and state update run (STG; +64 KB per block at dk = 128, still two blocks
# per SM), bitwise the "tc" variant's results
STATE_VARIANTS = {
    "tc": "gdn_chunk_state_mma",
    "mma": "gdn_chunk_state_mma",
    "fp32": "gdn_chunk_state",
    "split": "gdn_chunk_state_h",
    "tc8": "gdn_chunk_state_mma",
    "tcs": "gdn_chunk_state_mma",
    "wsp": "gdn_chunk_state_wsp",
    "wspq": "gdn_chunk_state_wsp",
    "wsp2": "gdn_chunk_state_wsp",
    "wspb": "gdn_chunk_state_wsp",
}
# "wsp": the tc prep, then the state pass on two warp groups (gdn_state_wsp.cuh): warps 0-3 walk the chunks for V'
# and the state (W rows staged as in "tcs"), warps 4-7 compute each chunk's output e^γ Q S + A V' beside them, so
# the walk no longer waits for the outputs; bitwise the "tc" variant's results. "wspq": the output warps' Q rows
# staged in shared memory too and the walk's K rows loaded early (+32 KB: one block per SM at dk = 128; a benchmark
# variant: within 5% of wsp's state launch on the 35B-A3B's heads, slower on the 27B's). "wsp2": wsp with each
# dk-deep product (W S, Q S) accumulated in two chains (even / odd 16-blocks, summed at the end): half the dependent
# mmas per chain, its own rounding (within fp32 noise of tc, not its bits; ptxas spills 4 bytes at 32 columns).
# Built in session 32 (host emulation, tests/test_gdn_chunked_host.py); on an H100 in session 33 its GPU tests pass
# and it times as wsp (perf/results/bench_gdn_wsp2_7ecae20_h100.txt): a benchmark variant
# "wspb": wsp over a bf16 scratch (cuda_src/gdn_scratch.cuh): the prep rounds the normed q and k, W and A to bf16
# as it stores them (U and γ stay float) and the state pass reads half the bytes; a bf16 value is exact in tf32, so
# its products on those operands take two mmas instead of three: the bits of wsp over a scratch rounded to bf16
# (host test), which is ``ops_gdn.gdn_chunked(scratch=bf16_round)``'s form; its fidelity cost is measured in
# docs/cuda.md "The bf16 scratch's fidelity, measured"
# the variants after gdn_chunk_prep_tc
_TC_PREP = ("tc", "split", "tc8", "tcs", "wsp", "wspq", "wsp2", "wspb")
# warps per state-pass block where not 4 (tc8's NWARP; the wsp kernels' two warp groups)
_STATE_WARPS = {"tc8": 8, "wsp": 8, "wspq": 8, "wsp2": 8, "wspb": 8}
_STAGED = ("tcs",)  # the state pass with its W and Q rows staged in shared memory (template argument STG)
# gdn_chunk_state_wsp<T, S, dk, cols, QSTG, CH, SC>
_WSP = {"wsp": "", "wspq": ", true", "wsp2": ", false, 2", "wspb": ", false, 1, bf16"}
SCRATCH_BF16 = ("wspb",)  # the variants whose q|k, W and A scratch sections are bf16
# "mma" (855128a): 1.53x the fp32 variant on one 8192-token sequence of the 27B's heads. "tc" (6688cc6, H200,
# perf/bench_gdn.py, perf/results/bench_gdn_6688cc6.txt; its GPU tests pass): the prep 1.028 -> 0.642 ms (27B heads)
# and 0.716 -> 0.468 ms (35B-A3B) on a 4096-token chunk, 1.6x at every batch shape measured; the outputs within
# 1.3e-6 of max |ref| of the one-pass kernel (mma: 1.2e-6)
# "tcs" (H200, 91528b4, perf/bench_gdn.py --batches 1x4096,1x8192; GPU tests pass): the state launch at 32 columns
# 27B heads 1.053 -> 1.005 ms (4096 rows), 2.107 -> 2.038 (8192); 35B-A3B 0.800 -> 0.762, 1.616 -> 1.515; the same
# bits (at 16 columns it is slower, 1.03 -> 1.64 ms: two blocks per SM instead of three; state_cols takes 32)
# "wsp" (H100, session 32, perf/bench_gdn.py --variants tc,tcs,wsp,wspq; GPU tests pass, bitwise tc): the state launch
# at 32 columns 27B heads 1.000 -> 0.931 ms (4096 rows), 2.046 -> 1.889 (8192); 35B-A3B 0.762 -> 0.600, 1.512 ->
# 1.181; whole-model prefill (ninfer-perf --gdn-variant) 35B-A3B 8K 38,702 -> 40,588 tok/s, 32K 33,931 -> 35,387,
# the 27B's within run-to-run noise (9,698 -> 9,716). Its fragment stores ordered by lane (f94fc38, LANE_ORDER of
# gsm_put_block in gdn_state_mma.cuh: no 2-way bank conflict; the same bits by host emulation): the state launch at
# 8192 rows and 32 columns 1.182 -> 1.102 ms (35B-A3B heads), 1.908 -> 1.758 (27B), H100,
# perf/results/bench_gdn_put_f94fc38_h100.txt
DEFAULT_VARIANT = "wsp"
# the model's chunked GDN prefill by its scratch precision (CudaQwen36(prefill_gdn=...), ninfer serve --prefill-gdn)
PREFILL_GDN = {"exact": DEFAULT_VARIANT, "bf16": "wspb"}


def _chunk_names(variant: str, t: str, st: str, dk: int, cols: int) -> tuple[str, str]:
    """The (prep, state) kernel instances of a two-pass variant."""
    mma = "true" if variant == "mma" else "false"
    sc = ", bf16" if variant in SCRATCH_BF16 else ""
    prep = f"gdn_chunk_prep_tc<{t}, {dk}{sc}>" if variant in _TC_PREP else f"gdn_chunk_prep<{t}, {dk}, {mma}>"
    tail = ""  # the template arguments past the defaults: NWARP (4), then STG (false); wsp's QSTG (false)
    if variant in _WSP:
        tail = _WSP[variant]
    elif variant in _STATE_WARPS or variant in _STAGED:
        tail = f", {_STATE_WARPS.get(variant, 4)}" + (", true" if variant in _STAGED else "")
    return prep, f"{STATE_VARIANTS[variant]}<{t}, {st}, {dk}, {cols}{tail}>"


def _conv_prep_name(t: str, dk: int, variant: str = DEFAULT_VARIANT) -> str:
    """The tc prep over the raw in-projection rows with the causal conv fused (gdn_prep_tc.cuh)."""
    return f"gdn_chunk_prep_tc_conv<{t}, {dk}{', bf16' if variant in SCRATCH_BF16 else ''}>"


def _out_name(t: str, dk: int, cols: int) -> str:
    """The output pass of the "split" variant."""
    return f"gdn_chunk_out<{t}, {dk}, {cols}>"


@functools.cache  # looked up on every chunked call: built once per variant
def chunk_instances(variant: str) -> tuple[str, ...]:
    """Every gdn_chunk.cu instance of a two-pass variant (the default's are compiled at warm-up, the other's on
    first use; tests/test_cuda_compile.py compiles both)."""
    prep = tuple(_chunk_names(variant, t, "float", d, 16)[0] for t in _T for d in HEAD_DIMS)
    if variant in _TC_PREP:  # the tc prep with the causal conv fused (gdn_chunked(conv=...))
        prep += tuple(_conv_prep_name(t, d, variant) for t in _T for d in HEAD_DIMS)
    state = tuple(
        _chunk_names(variant, t, s, d, c)[1] for t in _T for s in _S for d in HEAD_DIMS for c in STATE_COLS
    )
    out = (
        tuple(_out_name(t, d, c) for t in _T for d in HEAD_DIMS for c in STATE_COLS)
        if variant == "split"
        else ()
    )
    return prep + state + out


# the one-pass kernel gdn_chunked in gdn.cu (one block per sequence slice walks all chunks): a benchmark variant
# only (gdn_chunked(variant="serial")), compiled on first use, not at warm-up
SERIAL_SOURCES = tuple(
    f"gdn_chunked<{t}, {s}, {d}, {v}>" for t in _T for s in _S for d in HEAD_DIMS for v in _SLICES
)


def chunk_smem_bytes(dk: int, dvs: int) -> int:
    """Dynamic shared memory of the serial variant ``gdn_chunked<., ., dk, dvs>`` (gdn.cu): mirrors
    ``GdnChunkSmem::FLOATS`` there (the kernel traps when it gets less)."""
    kst, sst, vst, mst = dk + 1, dvs + 16, dvs + dvs // 8, CHUNK + 1
    return 4 * (2 * CHUNK * kst + dk * sst + CHUNK * vst + 2 * CHUNK * mst + 4 * CHUNK)


def chunk_slice(dv: int) -> int:
    """Value columns per block of the serial variant (DVS): 64 unless the head has at most 32."""
    return 32 if dv <= 32 else 64


def prep_smem_bytes(dk: int) -> int:
    """Dynamic shared memory of ``gdn_chunk_prep<., dk, .>``: mirrors ``GdnPrepSmem::FLOATS`` in gdn_chunk.cu (the
    kernel traps when it gets less; tests/test_gdn_chunked_host.py runs it with this size)."""
    return 4 * (2 * CHUNK * (dk + 4) + 3 * CHUNK * (CHUNK + 4) + 3 * CHUNK)


def prep_tc_smem_bytes(dk: int) -> int:
    """Dynamic shared memory of ``gdn_chunk_prep_tc<., dk>``: mirrors ``GdnPrepTcSmem::FLOATS`` in gdn_prep_tc.cuh
    (k rows, q rows whose space L and the block products reuse, T, the gates): 85.5 KB at dk = 128."""
    kst, mst = dk + 4, CHUNK + 4
    return 4 * (CHUNK * kst + max(CHUNK * kst, CHUNK * mst + 3 * 256) + CHUNK * mst + 3 * CHUNK)


def prep_tc_conv_smem_bytes(dk: int, dv: int) -> int:
    """Dynamic shared memory of ``gdn_chunk_prep_tc_conv<., dk>``: mirrors ``GdnPrepTcSmem::floats_conv(gpt_vst(dv))``
    in gdn_prep_tc.cuh: ``prep_tc_smem_bytes(dk)`` with the q region grown to hold a value head's 64 conv rows of
    ``gpt_vst(dv)`` floats where they need more (not at dk = dv = 128: 85.5 KB there too)."""
    kst, mst, vst = dk + 4, CHUNK + 4, -(-dv // 8) * 8 + 2
    qr = max(CHUNK * kst, CHUNK * mst + 3 * 256, CHUNK * vst)
    return 4 * (CHUNK * kst + qr + CHUNK * mst + 3 * CHUNK)


def state_smem_bytes(dk: int, cols: int) -> int:
    """Dynamic shared memory of ``gdn_chunk_state<., ., dk, cols>``: mirrors ``GdnStateSmem::FLOATS`` in
    gdn_chunk.cu."""
    sst = vst = 24 if cols == 16 else 48
    return 4 * (dk * sst + 2 * CHUNK * (dk + 4) + CHUNK * (CHUNK + 4) + CHUNK * vst + 2 * CHUNK)


def state_mma_smem_bytes(dk: int, cols: int, staged: bool = False) -> int:
    """Dynamic shared memory of ``gdn_chunk_state_mma<., ., dk, cols>``: mirrors ``GdnStateMmaSmem::FLOATS`` in
    gdn_state_mma.cuh (the state and V' as split B fragments, the gates of two chunks): 2·cols·(dk + 64) + 256
    floats, 50.2 KB at dk = 128 and 32 columns; ``staged`` (``STAGED``, variant "tcs"): + a chunk's W and Q rows,
    2·64·dk floats (113 KB in all at dk = 128: two blocks fill an H200 SM's 228 KB)."""
    return 4 * (2 * cols * (dk + CHUNK) + 4 * CHUNK + (2 * CHUNK * dk if staged else 0))


def state_wsp_smem_bytes(dk: int, cols: int, qstaged: bool = False) -> int:
    """Dynamic shared memory of ``gdn_chunk_state_wsp<., ., dk, cols, qstaged>``: mirrors ``GdnStateWspSmem::FLOATS``
    in gdn_state_wsp.cuh (the state fragments, V' fragments of two chunks, the gates of two chunks, a chunk's W rows
    and with ``qstaged`` its Q rows): 97 KB at dk = 128 and 32 columns (two blocks per SM), 129 KB staged."""
    return 4 * (2 * cols * dk + 4 * CHUNK * cols + 4 * CHUNK + (2 if qstaged else 1) * CHUNK * dk)


def state_cols(nseq: int, hv: int, dv: int, sms: int) -> int:
    """Value columns per state-pass block: 32 (half the scratch reads per column of 16) unless the head has at
    most 16. Results do not depend on it. Measured (H200, 6688cc6, perf/bench_gdn.py, the mma state pass): 32
    columns are faster at every shape, even with fewer blocks than SMs (27B heads 1 x 4096: 1.022 against 1.080
    ms, 1 x 8192 2.05 / 2.26; 35B-A3B 1 x 4096 0.761 / 0.959, 2 x 2048 0.503 / 1.105): each block re-reads its
    chunk's q, k, W and A rows, so the narrower slice's extra L2 traffic costs more than its extra blocks gain
    (``nseq`` and ``sms`` are kept for the callers; the choice no longer depends on them)."""
    return 16 if dv <= 16 else 32


def _scratch_parts(
    rows: int, hk: int, hv: int, dk: int, dv: int, nseq: int = 1, variant: str = DEFAULT_VARIANT
) -> tuple[int, ...]:
    """Floats of the scratch sections in order (qk, w, a, u, g; gdn_chunk.cu's layout; "split" adds h, one state
    per chunk of at most ``rows // 64 + nseq``): every section but a and g starts 16-byte aligned (the passes
    read qk, w and h rows as float4). The bf16 scratch variants (``SCRATCH_BF16``) hold qk, w and a in half the
    floats (dk and 64 are multiples of 16: the alignments hold)."""
    h = 2 if variant in SCRATCH_BF16 else 1
    parts = (rows * hk * 2 * dk // h, rows * hv * dk // h, rows * hv * CHUNK // h, rows * hv * dv, rows * hv)
    if variant == "split":
        pad = -sum(parts) % 4  # g padded so that h starts 16-byte aligned
        parts = (*parts[:-1], parts[-1] + pad, (rows // CHUNK + nseq) * hv * dk * dv)
    return parts


def chunk_scratch_bytes(
    rows: int, hk: int, hv: int, dk: int, dv: int, nseq: int = 1, variant: str = DEFAULT_VARIANT
) -> int:
    """Device scratch of one ``gdn_chunked`` call over ``rows`` tokens of ``nseq`` sequences (float32, freed back
    to CuPy's pool after the call): 4·rows·(2·hk·dk + hv·(dk + 64 + dv + 1)) bytes, ~640 MB for 8192 rows of the
    27B's heads; the "split" variant adds a dk x dv state per chunk and value head (+ 400 MB there); the bf16
    scratch ("wspb") 4·rows·(hk·dk + hv·(dk/2 + 32 + dv + 1)), ~420 MB there."""
    return 4 * sum(_scratch_parts(rows, hk, hv, dk, dv, nseq, variant))


def gdn_chunked(
    qkv: Any,
    a: Any,
    b: Any,
    a_log: Any,
    dt_bias: Any,
    state: Any,
    starts: Any,
    slots: Any,
    *,
    n_k_heads: int,
    out: Any = None,
    variant: str = DEFAULT_VARIANT,
    cols: int | None = None,
    conv: tuple[Any, Any] | None = None,
) -> Any:
    """``gdn_recurrent`` in the chunked form (docs/model-math.md §4.6, reference ``ops.gdn_chunked``): same
    arguments, checks, result and state update within fp32 noise. Each sequence runs in chunks of 64 tokens
    counted from its first row in this call, so results depend (at fp32 noise) on how a prompt is split.

    Two launches over a scratch of ``chunk_scratch_bytes`` (allocated per call from CuPy's pool):
    ``gdn_chunk_prep``, one block per (chunk, key head), and the state pass, one block per (sequence, value head,
    ``cols`` = 16 or 32 value columns, by default ``state_cols``) walking the chunks in order. ``variant="mma"``:
    both passes' products as 3xTF32 mma.sync (``gdn_chunk_state_mma``); ``"tc"``: the same with the prep's solve
    on tensor cores too (``gdn_chunk_prep_tc``); ``"tc8"``: "tc" with 8 warps per state-pass block instead of 4
    (the same bits); ``"tcs"``: "tc" with each chunk's W and Q rows staged in shared memory (the same bits);
    ``"wsp"`` / ``"wspq"``: "tc" with the walk over the chunks and the outputs on two warp groups (the same bits);
    ``"split"``: "tc" with the state pass split in two (the same bits); ``"fp32"``: on fp32 FMAs
    (``gdn_chunk_state``);
    ``"serial"``: the older one-pass kernel (one block per sequence slice does all of each chunk's work;
    benchmarks only). The variants other than ``DEFAULT_VARIANT`` are compiled on first use.

    ``conv = (conv_w, conv_state)`` (taps ``[C, 4]`` and carried raw inputs ``[S, C, 3]``, float32, as
    ``causal_conv``): ``qkv`` is the raw in-projection rows and the call is ``causal_conv`` (its conv state update
    included) followed by ``gdn_chunked`` on its output, bitwise. The tc prep variants (``"tc"``, ``"tcs"``,
    ``"wsp"``, ``"wspq"``, ``"tc8"``, ``"split"``) run ``gdn_chunk_prep_tc_conv``, which computes the conv of the rows it reads itself
    (the conv output is never stored); the others run ``causal_conv`` first."""
    import cupy

    if variant not in (*STATE_VARIANTS, "serial"):
        raise KernelError(f"variant: one of {(*STATE_VARIANTS, 'serial')}, got {variant!r}")
    if cols not in (None, *STATE_COLS):
        raise KernelError(f"cols: one of {STATE_COLS}, got {cols}")
    if conv is not None:
        _, width, _ = check_rows(qkv, "qkv")
        check_array(conv[0], "conv_w", dtype=np.float32, shape=(width, 4))
        check_array(conv[1], "conv_state", dtype=np.float32, shape=(None, width, 3))
        if variant not in _TC_PREP:  # no fused prep: the conv's own kernel, then the usual passes
            qkv, conv = causal_conv(qkv, conv[0], conv[1], starts, slots), None
    out, scalars, k = _gdn_args(qkv, a, b, a_log, dt_bias, state, starts, slots, n_k_heads, out)
    if not k["nseq"]:
        return out
    if variant == "serial":
        _serial(k, (qkv, a, b, a_log, dt_bias, state, out, starts, slots, *scalars))
        return out
    hk_, hv_, dv_, ldq, lda, ldb, ldo = scalars  # the kernels' int32 / int64 arguments
    rows, hv, dv = qkv.shape[0], k["hv"], k["dv"]
    dk, t, nseq = k["dk"], k["t"], k["nseq"]
    cols = cols or state_cols(nseq, hv, dv, sm_count(cupy.cuda.Device().id))
    parts = _scratch_parts(rows, n_k_heads, hv, dk, dv, nseq, variant)
    buf = cupy.empty(max(sum(parts), 1), dtype=np.float32)
    offs = tuple(itertools.accumulate(parts, initial=0))  # Python ints: no NumPy call per GDN layer
    qk_s, w_s, a_s, u_s, g_s = (buf[offs[i] : offs[i + 1]] for i in range(5))
    nchunks = rows // CHUNK + nseq  # gdn_chunk_prep's grid: blocks past the last chunk exit
    names = _chunk_names(variant, t, k["st"], dk, cols)
    inst = chunk_instances(variant)  # the default's are gdn.py's SOURCES["gdn_chunk.cu"]: compiled at warm-up
    pargs = (qkv, a, b, a_log, dt_bias, qk_s, w_s, a_s, u_s, g_s, starts, np.int32(nseq), hk_, hv_, dv_,
             ldq, lda, ldb)  # fmt: skip
    if conv is not None:  # the tc prep over the raw rows, the conv fused (and its state updated there)
        prep = kernel("gdn_chunk.cu", inst, _conv_prep_name(t, dk, variant))
        _launch_smem(prep, (nchunks, n_k_heads), 256, prep_tc_conv_smem_bytes(dk, dv), (*pargs, *conv, slots))
    else:
        prep = kernel("gdn_chunk.cu", inst, names[0])
        psmem = prep_tc_smem_bytes(dk) if variant in _TC_PREP else prep_smem_bytes(dk)
        _launch_smem(prep, (nchunks, n_k_heads), 256, psmem, pargs)
    st = kernel("gdn_chunk.cu", inst, names[1])
    if variant == "split":
        h_s, smem = buf[offs[5] : offs[6]], state_mma_smem_bytes(dk, cols)
        _launch_smem(st, (nseq, hv, -(-dv // cols)), 128, smem,
                     (qk_s, w_s, a_s, u_s, g_s, h_s, state, starts, slots, hk_, hv_, dv_))  # fmt: skip
        fo = kernel("gdn_chunk.cu", inst, _out_name(t, dk, cols))
        _launch_smem(fo, (nchunks, hv, -(-dv // cols)), 128, smem,
                     (qk_s, a_s, u_s, g_s, h_s, out, starts, np.int32(nseq), hk_, hv_, dv_, ldo))  # fmt: skip
        return out
    if variant in _WSP:
        threads, smem = 256, state_wsp_smem_bytes(dk, cols, variant == "wspq")
    elif variant == "fp32":
        threads, smem = 8 * cols, state_smem_bytes(dk, cols)
    else:
        threads, smem = 32 * _STATE_WARPS.get(variant, 4), state_mma_smem_bytes(dk, cols, variant in _STAGED)
    _launch_smem(st, (nseq, hv, -(-dv // cols)), threads, smem,
                 (qk_s, w_s, a_s, u_s, g_s, state, out, starts, slots, hk_, hv_, dv_, ldo))  # fmt: skip
    return out


def _launch_smem(fn: Any, grid: tuple[int, ...], threads: int, smem: int, args: tuple[Any, ...]) -> None:
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    fn(grid, (threads,), args, shared_mem=smem)


def _serial(k: dict[str, Any], args: tuple[Any, ...]) -> None:
    """The one-pass variant (gdn.cu's gdn_chunked): one block of 256 threads per (sequence, value head, slice)."""
    dvs = chunk_slice(k["dv"])
    fn = kernel("gdn.cu", SERIAL_SOURCES, f"gdn_chunked<{k['t']}, {k['st']}, {k['dk']}, {dvs}>")
    _launch_smem(fn, (k["nseq"], k["hv"], -(-k["dv"] // dvs)), 256, chunk_smem_bytes(k["dk"], dvs), args)
