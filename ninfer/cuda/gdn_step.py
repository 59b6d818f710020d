"""GDN's exact recurrence and causal conv (cuda_src/gdn_step.cu, gdn.cu's causal_conv), with the argument checks
the chunked form (gdn_chunk.py) shares; ninfer/cuda/gdn.py re-exports all of it.

``causal_conv`` is the depthwise causal conv with carried state (+SiLU). ``gdn_recurrent`` is the exact
token-by-token delta-rule recurrence with fused l2norm and gates, over packed sequences (``starts[b]..starts[b+1]``
rows, state slot ``slots[b]``); ``gdn_decode`` is the same recurrence fused with the causal conv and the gated
RMSNorm (one launch instead of three: a cluster of a value head's column tiles exchanges o through distributed
shared memory, or the last arriving blocks run the epilogue; bitwise equal to ``causal_conv`` -> ``gdn_recurrent``
-> ``gated_rmsnorm``): the model's decode and exact-prefill path, where a token's result must not depend on
chunking."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ninfer.cuda._common import (
    KernelError,
    act_type,
    arrival_counters,
    check_array,
    check_rows,
    grid_1d,
    matrix_out,
    sm_count,
)
from ninfer.cuda.launch import launch
from ninfer.cuda.loader import kernel

__all__ = [
    "causal_conv",
    "gdn_recurrent",
    "gdn_decode",
    "step_smem_bytes",
    "step_cl_smem_bytes",
    "step_clp_smem_bytes",
    "DECODE_VARIANTS",
    "CONV_SOURCES",
    "STEP_SOURCES",
    "HEAD_DIMS",
]

_T = ("float", "bf16")
_S = ("float", "bf16")
HEAD_DIMS = (16, 32, 64, 128)  # key head dims with a compiled instance
CONV_TILE = 64  # CONV_TILE in gdn.cu: packed rows per causal_conv thread
STEP_COLS = 32  # value columns per block of gdn_step (GdnStep::CT)
STEP_CLUSTER = 4  # column tiles per cluster of gdn_step_cl (GDN_CL): value heads of up to 128 columns
# gdn_decode's single launch: "cluster" gdn_step_cl (the gated norm through distributed shared memory, the default
# where dv <= STEP_CLUSTER * STEP_COLS), "counter" gdn_step<., ., ., true> with its epilogue by the last arriving
# column tile (the kernel before; kept to time both in one run and as the fallback for wider heads). The same bits.
# "persist": gdn_step_clp, gdn_step_cl's clusters made persistent (as many as stay resident, each taking the
# (sequence, value head) items in turn and copying the next item's state slice while it runs the current one).
DECODE_VARIANTS = ("auto", "cluster", "counter", "persist")
# "auto": the cluster kernel up to this many sequences per call, the counter one above. Measured (H200, 8cf0e04,
# perf/bench_gdn_decode.py, fp32 state, us per call, cluster / counter): 27B heads 1 sequence 6.07 / 6.60, 8
# sequences 28.6 / 26.7; 35B-A3B 5.50 / 6.76 and 19.4 / 19.7. 2-4 sequences not measured. Both give the same bits,
# so the switch changes no lane's result.
STEP_CLUSTER_MAX_SEQS = 4
# "auto" above STEP_CLUSTER_MAX_SEQS: the persistent clusters ("persist") where this is on, else the counter kernel
# (a module switch read at every launch, for perf/bench_fold's --toggle gdnp; the same bits either way).
STEP_PERSIST = False
# the instances of gdn.cu's causal_conv and of gdn_step.cu (gdn.py's SOURCES: compiled at warm-up)
CONV_SOURCES = tuple(f"causal_conv<{t}, 4>" for t in _T)
STEP_SOURCES = (
    tuple(
        f"gdn_step<{t}, {s}, {d}, {c}>" for t in _T for s in _S for d in HEAD_DIMS for c in ("false", "true")
    )
    + tuple(f"gdn_step_post<{t}>" for t in _T)
    + tuple(f"gdn_step_cl<{t}, {s}, {d}>" for t in _T for s in _S for d in HEAD_DIMS)
    + tuple(f"gdn_step_clp<{t}, {s}, {d}>" for t in _T for s in _S for d in HEAD_DIMS)
)
CLP_BLOCKS_PER_SM = 2  # GDN_CLP_MIN_BLOCKS in gdn_step.cu: gdn_step_clp's grid is this many blocks per SM


_STATE_TYPES = {np.dtype(np.float32): "float", np.dtype(np.uint16): "bf16"}  # GDN state dtype -> C++ type


def _seqs(starts: Any, slots: Any, rows: int, n_slots: int) -> int:
    check_array(starts, "starts", dtype=np.int32, shape=(None,))
    nseq = starts.shape[0] - 1
    if nseq < 0:
        raise KernelError("starts: needs nseq + 1 entries")
    check_array(slots, "slots", dtype=np.int32, shape=(nseq,))
    return nseq


def causal_conv(x: Any, w: Any, state: Any, starts: Any, slots: Any, out: Any = None) -> Any:
    """``silu(depthwise causal conv)`` of ``x[T, C]`` with ``w[C, 4]`` (tap 3 = current token) and carried raw
    inputs ``state[S, C, 3]`` (float32, updated in place for the slots used). ``out`` must not overlap ``x``: the
    kernel's token tiles run in parallel and read their predecessors' raw inputs."""
    import cupy

    t = act_type(x, "x")
    rows, c, ldx = check_rows(x, "x")
    check_array(w, "w", dtype=np.float32, shape=(c, 4))
    check_array(state, "state", dtype=np.float32, shape=(None, c, 3))
    nseq = _seqs(starts, slots, rows, state.shape[0])
    out, ldy = matrix_out(x, out, rows, c)  # a caller's out: x's dtype, [rows, C]
    if cupy.may_share_memory(out, x):
        raise KernelError("causal_conv: out overlaps x (the token tiles read earlier rows of x)")
    if nseq and rows:
        fn = kernel("gdn.cu", CONV_SOURCES, f"causal_conv<{t}, 4>")
        fn(
            (grid_1d(c, 128), -(-rows // CONV_TILE)),
            (128,),
            (x, w, state, out, starts, slots, np.int32(c), np.int64(ldx), np.int64(ldy), np.int32(nseq)),
        )
    return out


def _gdn_args(
    qkv: Any, a: Any, b: Any, a_log: Any, dt_bias: Any, state: Any, starts: Any, slots: Any, hk: int, out: Any
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Checks shared by both GDN kernels: (out, the kernel's trailing scalar arguments, names for the instance)."""
    t = act_type(qkv, "qkv")
    rows, width, ldq = check_rows(qkv, "qkv")
    if state.ndim != 4:
        raise KernelError(f"state: must be [S, HV, dk, dv], got shape {list(state.shape)}")
    st = _STATE_TYPES.get(state.dtype)
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
    out, ldo = matrix_out(qkv, out, rows, hv * dv)  # a caller's out: qkv's dtype, [rows, HV·dv]
    names = {"t": t, "st": st, "nseq": nseq, "hv": hv, "dk": dk, "dv": dv}
    return out, _gdn_scalars(hk, hv, dv, ldq, lda, ldb, ldo), names


@functools.lru_cache(maxsize=1024)
def _gdn_scalars(hk: int, hv: int, dv: int, ldq: int, lda: int, ldb: int, ldo: int) -> tuple[Any, ...]:
    """The GDN kernels' trailing scalars as the kernel's types (cached: the same tuple every GDN layer of a call;
    NumPy scalars are immutable)."""
    return (
        np.int32(hk),
        np.int32(hv),
        np.int32(dv),
        np.int64(ldq),
        np.int64(lda),
        np.int64(ldb),
        np.int64(ldo),
    )


def step_smem_bytes(dk: int) -> int:
    """Dynamic shared memory of ``gdn_step<., ., dk, .>``: mirrors ``GdnStep::FLOATS`` in gdn_step.cu (the kernel
    traps when it gets less)."""
    return 4 * (2 * dk + STEP_COLS + 2 * (dk // 16) * STEP_COLS)


def step_cl_smem_bytes(dk: int) -> int:
    """Dynamic shared memory of ``gdn_step_cl<., ., dk>``: mirrors ``GdnStepCl::FLOATS`` in gdn_step.cu (two
    mbarriers and a flag, the o exchange of two tokens, then gdn_step's layout; the kernel traps when it gets less)."""
    return 4 * (8 + 2 * STEP_CLUSTER * STEP_COLS) + step_smem_bytes(dk)


def step_clp_smem_bytes(dk: int) -> int:
    """Dynamic shared memory of ``gdn_step_clp<., ., dk>``: mirrors ``GdnStepClp::FLOATS`` (gdn_step_cl's layout
    rounded up to 16 bytes, then two float32 state buffers of dk x 32; the kernel traps when it gets less)."""
    return -(-step_cl_smem_bytes(dk) // 16) * 16 + 2 * 4 * dk * STEP_COLS


# gdn_step's epilogue arguments when it has none (cnt, z, nw, y: null pointers; ldz, ldy, eps)
_NO_POST = (np.uint64(0), np.uint64(0), np.uint64(0), np.uint64(0), np.int64(0), np.int64(0), np.float32(0))


def _step(k: dict[str, Any], conv: bool, args: tuple[Any, ...]) -> None:
    """Launch ``gdn_step``: one block of 2·dk threads (dk/16 warps of 16 state rows) per (sequence, value head,
    32 value columns)."""
    name = f"gdn_step<{k['t']}, {k['st']}, {k['dk']}, {'true' if conv else 'false'}>"
    fn = kernel("gdn_step.cu", STEP_SOURCES, name)
    grid = (k["nseq"], k["hv"], -(-k["dv"] // STEP_COLS))
    launch(fn, grid, (2 * k["dk"],), args, step_smem_bytes(k["dk"]))  # gdn_step.cu waits (pdl_wait) first


def _step_cl(k: dict[str, Any], args: tuple[Any, ...]) -> None:
    """Launch ``gdn_step_cl``: clusters of the STEP_CLUSTER column tiles of one (sequence, value head), the grid's z
    exactly STEP_CLUSTER (the kernel's compile-time cluster dims)."""
    name = f"gdn_step_cl<{k['t']}, {k['st']}, {k['dk']}>"
    fn = kernel("gdn_step.cu", STEP_SOURCES, name)
    launch(fn, (k["nseq"], k["hv"], STEP_CLUSTER), (2 * k["dk"],), args, step_cl_smem_bytes(k["dk"]))


def _step_clp(k: dict[str, Any], args: tuple[Any, ...]) -> None:
    """Launch ``gdn_step_clp``: as many clusters of STEP_CLUSTER column tiles as stay resident (CLP_BLOCKS_PER_SM
    blocks per SM), at most one per (sequence, value head) item."""
    import cupy

    name = f"gdn_step_clp<{k['t']}, {k['st']}, {k['dk']}>"
    fn = kernel("gdn_step.cu", STEP_SOURCES, name)
    clusters = CLP_BLOCKS_PER_SM * sm_count(cupy.cuda.Device().id) // STEP_CLUSTER
    grid = (min(k["nseq"] * k["hv"], clusters), 1, STEP_CLUSTER)
    launch(fn, grid, (2 * k["dk"],), (*args, np.int32(k["nseq"])), step_clp_smem_bytes(k["dk"]))


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
    if k["nseq"]:  # no conv: a_log stands in for the conv weight and state pointers, which are never read
        _step(k, False, (qkv, a_log, a_log, a, b, a_log, dt_bias, state, out, starts, slots, *scalars,
                         slots, np.int32(0), *_NO_POST))  # fmt: skip
    return out


def gdn_decode(
    qkv: Any,
    conv_w: Any,
    conv_state: Any,
    a: Any,
    b: Any,
    a_log: Any,
    dt_bias: Any,
    state: Any,
    starts: Any,
    slots: Any,
    z: Any,
    norm_w: Any,
    eps: float,
    *,
    n_k_heads: int,
    out: Any = None,
    snap: Any = None,
    fused: bool = True,
    variant: str = "auto",
) -> Any:
    """The GDN mixer core in one launch (``fused=False``: two, the epilogue in ``gdn_step_post``; the same bits):
    the causal conv of the raw ``in_proj_qkv`` rows ``qkv`` (taps ``conv_w[C, 4]``, carried raw inputs ``conv_state[S, C, 3]`` float32), the exact delta rule (arguments as
    ``gdn_recurrent``) and the gated RMSNorm with ``z[T, HV·dv]`` (``in_proj_z`` output, same dtype) and
    ``norm_w[dv]``. Returns ``y[T, HV·dv]`` (``out`` if given: it also holds the un-normed output in between).

    Bitwise equal to ``causal_conv`` -> ``gdn_recurrent`` -> ``gated_rmsnorm``, states included. Segments of
    several tokens run token by token (exact prefill): with a float32 state each token gives the bits of its own
    decode call.

    ``snap[nseq]`` int32 (speculative verify): before each token ``t`` of sequence ``b`` the recurrent and conv
    states are also stored into state slot ``snap[b] + (t - starts[b])`` (slots of the same ``state`` and
    ``conv_state`` arrays, distinct from every ``slots`` entry), i.e. the state after the tokens before ``t``. Stores
    only: outputs and the final states are the same bits as without ``snap``.

    ``variant`` (``DECODE_VARIANTS``, one launch): ``"cluster"`` (``gdn_step_cl``; heads wider than 128 columns
    fall back to ``"counter"``), ``"counter"`` (``gdn_step``'s last-arrival epilogue), ``"persist"``
    (``gdn_step_clp``, the resident clusters taking the (sequence, value head) items in turn; wider heads fall back
    to ``"counter"``) or ``"auto"`` (cluster up to ``STEP_CLUSTER_MAX_SEQS`` sequences): the same bits. The cluster
    kernel reads ``starts``, ``slots``, ``snap`` and the weights before it waits for the kernel ahead (PDL): no
    kernel of the same captured launch chain may write them (the decode graphs upload them by copy)."""
    rows, c, ldx = check_rows(qkv, "qkv")
    check_array(conv_w, "conv_w", dtype=np.float32, shape=(c, 4))
    check_array(conv_state, "conv_state", dtype=np.float32, shape=(None, c, 3))
    out, scalars, k = _gdn_args(qkv, a, b, a_log, dt_bias, state, starts, slots, n_k_heads, out)
    hv, dv = k["hv"], k["dv"]
    _, _, ldz = check_rows(z, "z", hv * dv)
    if z.dtype != qkv.dtype or z.shape[0] != rows:
        raise KernelError(f"z: must be {qkv.dtype} [{rows}, {hv * dv}]")
    check_array(norm_w, "norm_w", dtype=np.float32, shape=(dv,))
    if k["nseq"] >= 65535:  # gdn_step_post's grid rows: 1 + nseq
        raise KernelError(f"starts: {k['nseq']} sequences in one call, at most 65534")
    if snap is not None:
        check_array(snap, "snap", dtype=np.int32, shape=(k["nseq"],))
    if variant not in DECODE_VARIANTS:
        raise KernelError(f"variant: one of {DECODE_VARIANTS}, got {variant!r}")
    if not k["nseq"]:
        return out
    sn = (slots, np.int32(0)) if snap is None else (snap, np.int32(1))
    qkc, ldo = 2 * n_k_heads * k["dk"], scalars[-1]
    head = (qkv, conv_w, conv_state, a, b, a_log, dt_bias, state, out, starts, slots, *scalars, *sn)
    if fused:  # counters per sequence and value / QK head (the cluster kernel uses the QK heads' only)
        cnt = arrival_counters(k["nseq"] * (hv + n_k_heads))
        tail = (cnt, z, norm_w, out, np.int64(ldz), ldo, np.float32(eps))
        cluster = variant == "cluster" or (variant == "auto" and k["nseq"] <= STEP_CLUSTER_MAX_SEQS)
        persist = variant == "persist" or (variant == "auto" and not cluster and STEP_PERSIST)
        if persist and dv <= STEP_CLUSTER * STEP_COLS and state.data.ptr % 16 == 0:
            _step_clp(k, (*head, *tail))
        elif cluster and dv <= STEP_CLUSTER * STEP_COLS:
            _step_cl(k, (*head, *tail))
        else:
            _step(k, True, (*head, *tail))
        return out
    _step(k, True, (*head, *_NO_POST))
    post = kernel("gdn_step.cu", STEP_SOURCES, f"gdn_step_post<{k['t']}>")
    post(
        (max(grid_1d(rows * hv, 4), grid_1d(qkc, 128)), 1 + k["nseq"]),
        (128,),
        (out, z, norm_w, out, qkv, conv_state, starts, slots, np.int32(rows), np.int32(hv), np.int32(dv),
         np.int32(qkc), np.int32(c), np.float32(eps), ldo, np.int64(ldz), ldo, np.int64(ldx), *sn),
    )  # fmt: skip
    return out
