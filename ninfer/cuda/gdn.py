"""Gated DeltaNet kernels (cuda_src/gdn.cu): causal conv with carried state (+SiLU) and the delta-rule recurrence
with fused l2norm and gates, over packed sequences (``starts[b]..starts[b+1]`` rows, state slot ``slots[b]``).

``gdn_recurrent`` is the exact token-by-token recurrence (decode, and prefill when results must not depend on
chunking); ``gdn_chunked`` is the chunked form (chunks of 64 tokens per sequence), equal to it within fp32 noise
and much faster on long prompts."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, act_type, check_array, check_rows, grid_1d
from ninfer.cuda.loader import kernel

__all__ = [
    "causal_conv",
    "gdn_recurrent",
    "gdn_chunked",
    "chunk_slice",
    "chunk_smem_bytes",
    "SOURCES",
    "HEAD_DIMS",
]

_T = ("float", "bf16")
_S = ("float", "bf16")
HEAD_DIMS = (16, 32, 64, 128)  # key head dims with a compiled instance
CHUNK = 64  # GDN_CHUNK in gdn.cu
_SLICES = (32, 64)  # value columns per block of gdn_chunked (DVS)
SOURCES: dict[str, tuple[str, ...]] = {
    "gdn.cu": tuple(f"causal_conv<{t}, 4>" for t in _T)
    + tuple(f"gdn_recurrent<{t}, {s}, {d}>" for t in _T for s in _S for d in HEAD_DIMS)
    + tuple(f"gdn_chunked<{t}, {s}, {d}, {v}>" for t in _T for s in _S for d in HEAD_DIMS for v in _SLICES)
}


def _seqs(starts: Any, slots: Any, rows: int, n_slots: int) -> int:
    check_array(starts, "starts", dtype=np.int32, shape=(None,))
    nseq = starts.shape[0] - 1
    if nseq < 0:
        raise KernelError("starts: needs nseq + 1 entries")
    check_array(slots, "slots", dtype=np.int32, shape=(nseq,))
    return nseq


def causal_conv(x: Any, w: Any, state: Any, starts: Any, slots: Any, out: Any = None) -> Any:
    """``silu(depthwise causal conv)`` of ``x[T, C]`` with ``w[C, 4]`` (tap 3 = current token) and carried raw
    inputs ``state[S, C, 3]`` (float32, updated in place for the slots used)."""
    import cupy

    t = act_type(x, "x")
    rows, c, ldx = check_rows(x, "x")
    check_array(w, "w", dtype=np.float32, shape=(c, 4))
    check_array(state, "state", dtype=np.float32, shape=(None, c, 3))
    nseq = _seqs(starts, slots, rows, state.shape[0])
    if out is None:
        out = cupy.empty((rows, c), dtype=x.dtype)
    _, _, ldy = check_rows(out, "out", c)
    if nseq:
        fn = kernel("gdn.cu", SOURCES["gdn.cu"], f"causal_conv<{t}, 4>")
        fn(
            (grid_1d(c, 128), nseq),
            (128,),
            (x, w, state, out, starts, slots, np.int32(c), np.int64(ldx), np.int64(ldy)),
        )
    return out


def _gdn_args(
    qkv: Any, a: Any, b: Any, a_log: Any, dt_bias: Any, state: Any, starts: Any, slots: Any, hk: int, out: Any
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Checks shared by both GDN kernels: (out, the kernel's trailing scalar arguments, names for the instance)."""
    import cupy

    t = act_type(qkv, "qkv")
    rows, width, ldq = check_rows(qkv, "qkv")
    if state.ndim != 4:
        raise KernelError(f"state: must be [S, HV, dk, dv], got shape {list(state.shape)}")
    st = {np.dtype(np.float32): "float", np.dtype(np.uint16): "bf16"}.get(np.dtype(state.dtype))
    if st is None:
        raise KernelError(f"state: dtype must be float32 or uint16 (bf16), got {state.dtype}")
    check_array(state, "state")
    _, hv, dk, dv = state.shape
    if hk <= 0 or hv % hk:
        raise KernelError(f"n_k_heads={hk}: HV={hv} must be a multiple of it")
    if dk not in HEAD_DIMS:
        raise KernelError(f"state: key head dim {dk} has no kernel instance (have {HEAD_DIMS})")
    if width != 2 * hk * dk + hv * dv:
        raise KernelError(f"qkv: width {width} != 2·{hk}·{dk} + {hv}·{dv}")
    _, _, lda = check_rows(a, "a", hv)
    _, _, ldb = check_rows(b, "b", hv)
    for name, arr in (("a", a), ("b", b)):
        if arr.dtype != qkv.dtype or arr.shape[0] != rows:
            raise KernelError(f"{name}: must be {qkv.dtype} [{rows}, {hv}]")
    check_array(a_log, "a_log", dtype=np.float32, shape=(hv,))
    check_array(dt_bias, "dt_bias", dtype=np.float32, shape=(hv,))
    nseq = _seqs(starts, slots, rows, state.shape[0])
    if out is None:
        out = cupy.empty((rows, hv * dv), dtype=qkv.dtype)
    _, _, ldo = check_rows(out, "out", hv * dv)
    scalars = tuple(np.int32(x) for x in (hk, hv, dv)) + tuple(np.int64(x) for x in (ldq, lda, ldb, ldo))
    return out, scalars, {"t": t, "st": st, "nseq": nseq, "hv": hv, "dk": dk, "dv": dv}


def gdn_recurrent(
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
) -> Any:
    """Delta rule over the conv output ``qkv[T, 2·HK·dk + HV·dv]`` (q | k | v), gate inputs ``a, b[T, HV]``,
    ``a_log, dt_bias[HV]`` float32 and state ``[S, HV, dk, dv]`` (float32 or bf16 words, updated in place).
    q and k are l2-normed and q scaled by 1/√dk inside. Returns ``o[T, HV·dv]``."""
    out, scalars, k = _gdn_args(qkv, a, b, a_log, dt_bias, state, starts, slots, n_k_heads, out)
    if k["nseq"]:
        fn = kernel("gdn.cu", SOURCES["gdn.cu"], f"gdn_recurrent<{k['t']}, {k['st']}, {k['dk']}>")
        fn(
            (k["nseq"], k["hv"], grid_1d(k["dv"], 4)),
            (128,),
            (qkv, a, b, a_log, dt_bias, state, out, starts, slots, *scalars),
        )
    return out


def chunk_smem_bytes(dk: int, dvs: int) -> int:
    """Dynamic shared memory of ``gdn_chunked<., ., dk, dvs>``: mirrors ``GdnChunkSmem::FLOATS`` in gdn.cu (the
    kernel traps when it gets less; tests/test_gdn_chunked_host.py runs it with this size)."""
    kst, sst, vst, mst = dk + 1, dvs + 16, dvs + dvs // 8, CHUNK + 1
    return 4 * (2 * CHUNK * kst + dk * sst + CHUNK * vst + 2 * CHUNK * mst + 4 * CHUNK)


def chunk_slice(dv: int) -> int:
    """Value columns per block (DVS): 64 (fewer key-side recomputations) unless the head has at most 32."""
    return 32 if dv <= 32 else 64


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
) -> Any:
    """``gdn_recurrent`` in the chunked form (docs/model-math.md §4.6, reference ``ops.gdn_chunked``): same
    arguments, checks, result and state update within fp32 noise. Each sequence runs in chunks of 64 tokens
    counted from its first row in this call, so results depend (at fp32 noise) on how a prompt is split."""
    out, scalars, k = _gdn_args(qkv, a, b, a_log, dt_bias, state, starts, slots, n_k_heads, out)
    if k["nseq"]:
        dvs = chunk_slice(k["dv"])
        smem = chunk_smem_bytes(k["dk"], dvs)
        fn = kernel("gdn.cu", SOURCES["gdn.cu"], f"gdn_chunked<{k['t']}, {k['st']}, {k['dk']}, {dvs}>")
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        fn(
            (k["nseq"], k["hv"], -(-k["dv"] // dvs)),
            (256,),
            (qkv, a, b, a_log, dt_bias, state, out, starts, slots, *scalars),
            shared_mem=smem,
        )
    return out
