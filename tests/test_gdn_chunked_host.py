"""CPU check of the ``gdn_chunked`` CUDA kernels themselves: cuda_src/gdn_chunk.cu (the chunk-parallel pass
``gdn_chunk_prep`` and both variants of the sequential state pass over a NaN-filled scratch: ``gdn_chunk_state``
on fp32 FMAs and ``gdn_chunk_state_mma`` on emulated 3xTF32 mma.sync) compiled by g++
under a prelude that emulates the CUDA built-ins it uses with std::thread (tests/host/gdn_emu.cpp: one thread per
CUDA thread, block and warp barriers, NaN-filled shared memory, NaN-poisoned output), run on fresh random inputs
and compared with the NumPy token-by-token recurrence. This checks the kernels' index arithmetic, barriers, ragged
chunks, the chunk-to-block map over several sequences, column slices (16 and 32 columns per state-pass block: the
same bits, in each variant; the staged "tcs" and the warp-specialized "wsp" / "wspq" passes bitwise the "tc"
one, "wsp2" (two chains per product) within the tolerances, "wspb" (a bf16 scratch) bitwise "wsp" over the "tc"
scratch rounded to bf16 and within the bf16 tolerances of the recurrence), the mma variant's fragment layouts and hi/lo split (the emulated mma reads only the
operands' tf32 bits: 1xTF32 products fail these tolerances, 6e-4 against 1e-4) and the wrapper's shared-memory
sizes (the kernels trap on too little) without a GPU; the GPU tests in test_cuda_ops.py check the same kernels on
the device.

``test_gdn_conv_prep_emulated``: the tc prep with the causal conv fused (``gdn_chunk_prep_tc_conv`` over the raw
in-projection rows, a strided view) against gdn.cu's ``causal_conv`` followed by ``gdn_chunk_prep_tc``, both
emulated: every scratch word, the "tcs" state pass's outputs and recurrent states and the carried conv states
bitwise (the conv states also equal the NumPy reference's), over sequences that start inside a chunk-sized row
tile, several sequences per call, one- and two-token sequences (their new conv state mixes the old), empty ones,
nonzero incoming conv states and sequences over several chunks.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator, rel_error, words

from ninfer.cuda.gdn import (
    prep_smem_bytes,
    prep_tc_conv_smem_bytes,
    prep_tc_smem_bytes,
    state_mma_smem_bytes,
    state_smem_bytes,
    state_wsp_smem_bytes,
)
from ninfer.cuda.loader import source_text
from ninfer.formats import bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

F32 = np.float32


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(
        tmp_path_factory, "gdn_emu", ["gdn_emu.cpp", "gdn_chunk.cu", "emu_io.cpp", "gdn_emu_driver.cpp"]
    )


CASES = (  # hk, hv, dk, dv, lens, bf16 activations, bf16 state
    (2, 4, 32, 32, [1, 5, 63, 64, 65], False, False),
    (1, 2, 64, 96, [130, 0, 3], False, True),
    (1, 3, 64, 64, [200], True, True),
    (2, 4, 128, 128, [70, 2], True, False),
    (1, 2, 16, 16, [66, 9], False, False),  # the tiny test model's heads
    (2, 4, 32, 40, [260, 0, 1, 129], False, False),  # > 3 chunks, several sequences, dv not a multiple of 16
)


def _rule_inputs(rng: np.random.Generator, cols: int, case: tuple) -> tuple[dict, dict]:
    """A case's random inputs, drawn in this order: rows ``x [T, cols]``, a, b, A_log, dt_bias, the states; then its
    sequences. Returns (name -> values, name -> what the emulators read: bf16 words where the case asks)."""
    hk, hv, dk, dv, lens, tb, sb = case
    n, nseq = sum(lens), len(lens)
    rnd = (lambda *s: bf16_round(rng.standard_normal(s).astype(F32))) if tb else (
        lambda *s: rng.standard_normal(s).astype(F32))  # fmt: skip
    x, a, b = rnd(n, cols), rnd(n, hv), rnd(n, hv)
    a_log, dt_bias = rng.uniform(-2, 1, hv).astype(F32), rng.uniform(-1, 1, hv).astype(F32)
    state = (rng.standard_normal((nseq + 1, hv, dk, dv)) * 0.1).astype(F32)
    state = bf16_round(state) if sb else state
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    slots = (np.arange(nseq, dtype=np.int32)[::-1] + 1).copy()  # slot 0 is never touched
    vals = dict(x=x, a=a, b=b, alog=a_log, dtb=dt_bias, state=state, starts=starts, slots=slots)
    return vals, vals | {"x": words(x, tb), "a": words(a, tb), "b": words(b, tb), "state": words(state, sb)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hk{c[0]}hv{c[1]}dk{c[2]}dv{c[3]}T{sum(c[4])}")
def test_gdn_chunked_emulated(emu: Path, tmp_path: Path, case: tuple) -> None:
    hk, hv, dk, dv, lens, tb, sb = case
    rng = np.random.default_rng(sum(lens) + dk)
    n, nseq, width = sum(lens), len(lens), 2 * hk * dk + hv * dv
    v, files = _rule_inputs(rng, width, case)
    qkv, a, b, a_log, dt_bias, state, starts, slots = (v[k] for k in ("x", "a", "b", "alog", "dtb", "state",
                                                                       "starts", "slots"))  # fmt: skip
    files["qkv"] = files.pop("x")
    for name, arr in files.items():
        arr.tofile(tmp_path / f"{name}.bin")
    smem = [prep_smem_bytes(dk), state_smem_bytes(dk, 16), state_smem_bytes(dk, 32)]
    smem += [state_mma_smem_bytes(dk, 16), state_mma_smem_bytes(dk, 32), prep_tc_smem_bytes(dk)]
    smem += [state_mma_smem_bytes(dk, 16, staged=True), state_mma_smem_bytes(dk, 32, staged=True)]
    smem += [state_wsp_smem_bytes(dk, 16), state_wsp_smem_bytes(dk, 32), state_wsp_smem_bytes(dk, 32, True)]
    args = [n, hk, hv, dk, dv, nseq, nseq + 1, int(tb), int(sb), *smem]
    proc = subprocess.run(
        [str(emu), str(tmp_path), *map(str, args)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    otol, stol = (1.2e-2 if tb else 1e-4), (1.2e-2 if sb else 1e-4)
    for o_name, s_name, o32_name, s32_name in (
        ("o.bin", "state_out.bin", "o32.bin", "state32.bin"),  # fp32 FMAs
        ("o_mma16.bin", "state_mma16.bin", "o_mma32.bin", "state_mma32.bin"),  # 3xTF32 mma
    ):
        o_raw = np.fromfile(tmp_path / o_name, dtype=np.uint16 if tb else F32).reshape(n, hv * dv)
        s_raw = np.fromfile(tmp_path / s_name, dtype=np.uint16 if sb else F32).reshape(state.shape)
        # 32 value columns per state-pass block: the same bits as 16
        assert np.array_equal(np.fromfile(tmp_path / o32_name, dtype=o_raw.dtype).reshape(o_raw.shape), o_raw)
        assert np.array_equal(np.fromfile(tmp_path / s32_name, dtype=s_raw.dtype).reshape(s_raw.shape), s_raw)
        got_o = bf16_decode(o_raw) if tb else o_raw
        got_s = bf16_decode(s_raw) if sb else s_raw
        np.testing.assert_array_equal(got_s[0], state[0])
        _check(got_o, got_s, qkv, a, b, a_log, dt_bias, state, starts, slots, case, (otol, stol), o_name)
    # the "tc" prep (the solve as a blocked inverse and a 3xTF32 product) under the same state pass
    o_raw = np.fromfile(tmp_path / "o_tc16.bin", dtype=np.uint16 if tb else F32).reshape(n, hv * dv)
    s_raw = np.fromfile(tmp_path / "state_tc16.bin", dtype=np.uint16 if sb else F32).reshape(state.shape)
    got_o, got_s = (bf16_decode(o_raw) if tb else o_raw), (bf16_decode(s_raw) if sb else s_raw)
    np.testing.assert_array_equal(got_s[0], state[0])
    _check(got_o, got_s, qkv, a, b, a_log, dt_bias, state, starts, slots, case, (otol, stol), "o_tc16.bin")
    _check_tc_scratch(tmp_path, n, hk, hv, dk, dv, starts)
    # the "split" state pass (the walk for the states, a chunk-parallel pass for the outputs): the same bits
    for got, want in (("state_split.bin", s_raw), ("o_split.bin", o_raw)):
        split = np.fromfile(tmp_path / got, dtype=want.dtype).reshape(want.shape)
        assert np.array_equal(split, want), f"split state pass: {got} differs from the tc variant's"
    # the 8-warp state pass ("tc8"; half a warp's columns each): the 4-warp pass's bits at either column count
    mma_o, mma_s = (
        np.fromfile(tmp_path / f, dtype=x.dtype)
        for f, x in (("o_mma32.bin", o_raw), ("state_mma32.bin", s_raw))
    )
    for name, want_o, want_s in (
        ("tc8_16", o_raw, s_raw),
        ("tc8_32", o_raw, s_raw),
        ("mma8_32", mma_o, mma_s),
    ):
        for got, want in ((f"o_{name}.bin", want_o), (f"state_{name}.bin", want_s)):
            eight = np.fromfile(tmp_path / got, dtype=want.dtype).reshape(want.shape)
            assert np.array_equal(eight, want.reshape(eight.shape)), f"8 warps: {got} differs from 4 warps"
    # W and Q rows staged in shared memory ("tcs"): the tc variant's bits at either column count
    for name in ("tcs16", "tcs32"):
        for got, want in ((f"o_{name}.bin", o_raw), (f"state_{name}.bin", s_raw)):
            staged = np.fromfile(tmp_path / got, dtype=want.dtype).reshape(want.shape)
            assert np.array_equal(staged, want), f"staged W and Q: {got} differs from the tc variant's"
    # the walk and the outputs on two warp groups ("wsp", Q rows staged "wspq"): the tc variant's bits
    for name in ("wsp16", "wsp32", "wspq32"):
        for got, want in ((f"o_{name}.bin", o_raw), (f"state_{name}.bin", s_raw)):
            wsp = np.fromfile(tmp_path / got, dtype=want.dtype).reshape(want.shape)
            assert np.array_equal(wsp, want), f"warp-specialized: {got} differs from the tc variant's"
    # two chains per product ("wsp2"): its own rounding, against the recurrence; 16 and 32 columns the same bits
    w2 = [(np.fromfile(tmp_path / f"o_wsp2_{c}.bin", dtype=o_raw.dtype).reshape(o_raw.shape),
           np.fromfile(tmp_path / f"state_wsp2_{c}.bin", dtype=s_raw.dtype).reshape(s_raw.shape)) for c in (16, 32)]  # fmt: skip
    assert np.array_equal(w2[0][0], w2[1][0]) and np.array_equal(w2[0][1], w2[1][1]), "wsp2: 16 vs 32 columns"
    got_o, got_s = (bf16_decode(w2[1][0]) if tb else w2[1][0]), (bf16_decode(w2[1][1]) if sb else w2[1][1])
    np.testing.assert_array_equal(got_s[0], state[0])
    _check(got_o, got_s, qkv, a, b, a_log, dt_bias, state, starts, slots, case, (otol, stol), "o_wsp2_32.bin")
    _check_bf16_scratch(tmp_path, case, o_raw, s_raw)
    got = [np.fromfile(tmp_path / f"{p}_wspb32.bin", dtype=x.dtype).reshape(x.shape) for p, x in (("o", o_raw),
                                                                                                ("state", s_raw))]  # fmt: skip
    got_o, got_s = (bf16_decode(got[0]) if tb else got[0]), (bf16_decode(got[1]) if sb else got[1])
    np.testing.assert_array_equal(got_s[0], state[0])
    _check(
        got_o, got_s, qkv, a, b, a_log, dt_bias, state, starts, slots, case, (1.2e-2, 1.2e-2), "o_wspb32.bin"
    )


def _check_bf16_scratch(d: Path, case: tuple, o_raw: np.ndarray, s_raw: np.ndarray) -> None:
    """The bf16 scratch ("wspb"): its prep's q|k, W and A words are the tc prep's values rounded to bf16 (U and γ
    bitwise the tc prep's), and its state pass gives, at 16 and 32 columns, the bits of "wsp" run over the tc
    scratch with those three sections rounded to bf16 in place (the exact tf32 operands' dropped mma adds zeros)."""
    hk, hv, dk, dv, lens = case[:5]
    n = sum(lens)
    shapes = {"qk": (n, hk, 2 * dk), "w": (n, hv, dk), "a": (n, hv, 64), "u": (n, hv, dv), "g": (n, hv)}
    for p, shape in shapes.items():
        tc = np.fromfile(d / f"{p}_tc.bin", F32).reshape(shape)
        if p in ("u", "g"):
            np.testing.assert_array_equal(np.fromfile(d / f"{p}_b16.bin", F32).reshape(shape), tc, err_msg=p)
        else:
            got = np.fromfile(d / f"{p}_b16.bin", np.uint16).reshape(shape)
            np.testing.assert_array_equal(got, bf16_encode(tc), err_msg=f"bf16 scratch: {p}")
    for what, want in (("o", o_raw), ("state", s_raw)):
        ref = np.fromfile(d / f"{what}_wspr32.bin", dtype=want.dtype).reshape(want.shape)
        for cols in (16, 32):
            got = np.fromfile(d / f"{what}_wspb{cols}.bin", dtype=want.dtype).reshape(want.shape)
            assert np.array_equal(got, ref), f"wspb{cols}: {what} differs from wsp over the rounded scratch"


def _check_tc_scratch(d: Path, n: int, hk: int, hv: int, dk: int, dv: int, starts: np.ndarray) -> None:
    """The "tc" prep's scratch against the "mma" prep's over each chunk's rows: normed q|k, γ and A bitwise (the
    same expressions), U and W within fp32 noise of the forward substitution (and written on every row)."""
    shapes = {"qk": (n, hk, 2 * dk), "w": (n, hv, dk), "a": (n, hv, 64), "u": (n, hv, dv), "g": (n, hv)}
    got = {p: (np.fromfile(d / f"{p}_tc.bin", F32).reshape(s), np.fromfile(d / f"{p}_mma.bin", F32).reshape(s))
           for p, s in shapes.items()}  # fmt: skip
    for p in ("qk", "a", "g"):
        np.testing.assert_array_equal(got[p][0], got[p][1], err_msg=f"tc prep: {p} differs from the mma prep")
    for p in ("u", "w"):
        tc, mm = got[p]
        assert not np.isnan(tc).any(), f"tc prep: {p} has unwritten rows"
        err = rel_error(tc, mm)
        assert err <= 2e-5, f"tc prep: {p} {err:.2e} from the forward substitution"


def _check(
    got_o: np.ndarray, got_s: np.ndarray, qkv: np.ndarray, a: np.ndarray, b: np.ndarray, a_log: np.ndarray,
    dt_bias: np.ndarray, state: np.ndarray, starts: np.ndarray, slots: np.ndarray, case: tuple,
    tols: tuple[float, float], what: str,
) -> None:  # fmt: skip
    """Outputs and states of every sequence against the NumPy token-by-token recurrence."""
    hk, hv, dk, dv, lens = case[:5]
    otol, stol = tols
    for s in range(len(lens)):
        z = slice(starts[s], starts[s + 1])
        q = ops.l2norm(qkv[z, : hk * dk].reshape(-1, hk, dk))
        k = ops.l2norm(qkv[z, hk * dk : 2 * hk * dk].reshape(-1, hk, dk))
        v = qkv[z, 2 * hk * dk :].reshape(-1, hv, dv)
        beta, g = ops.gdn_gates(a[z], b[z], a_log, dt_bias)
        o, new = ops.gdn_recurrent(q, k, v, g, beta, state[slots[s]])
        if lens[s]:
            err = rel_error(got_o[z], o.reshape(lens[s], hv * dv))
            assert err <= otol, f"{what} seq {s} (T={lens[s]}): output error {err:.2e} > {otol:.1e}"
        err = rel_error(got_s[slots[s]], new)
        assert err <= stol, f"{what} seq {s} (T={lens[s]}): state error {err:.2e} > {stol:.1e}"


def _conv_text() -> str:
    """gdn.cu's causal_conv without the shared headers (gdn_chunk.cu inlines them) and the serial kernel."""
    text = source_text("gdn.cu")
    head, sep, rest = text.partition("// ---- gdn_common.cuh ----")
    _, sep2, rest = rest.partition("// ---- end gdn_common.cuh ----")
    body, sep3, _ = rest.partition("// ---- chunked prefill form")
    assert sep and sep2 and sep3 and "causal_conv" in body, "gdn.cu's layout changed"
    return head + body


@pytest.fixture(scope="module")
def conv_emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(
        tmp_path_factory,
        "gdn_conv_emu",
        ["gdn_emu.cpp", "gdn_chunk.cu", _conv_text(), "emu_io.cpp", "gdn_convprep_driver.cpp"],
    )


CONV_CASES = (  # hk, hv, dk, dv, lens, bf16 activations, bf16 state
    (2, 4, 32, 32, [1, 2, 61, 64, 65, 0, 130], False, False),  # short, empty, chunk-sized, longer sequences
    (1, 2, 64, 96, [130, 3], True, True),  # dv > dk + 2: the conv kernel's grown shared memory
    (2, 4, 128, 128, [70, 5], False, False),  # the served head dims
    (1, 3, 16, 16, [66, 9, 2], True, False),  # the tiny test model's heads, three value heads per key head
    (2, 4, 32, 40, [200, 0, 1, 129], False, True),  # dv not a multiple of 8
)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"hk{c[0]}hv{c[1]}dk{c[2]}dv{c[3]}T{sum(c[4])}")
def test_gdn_conv_prep_emulated(conv_emu: Path, tmp_path: Path, case: tuple) -> None:
    hk, hv, dk, dv, lens, tb, sb = case
    rng = np.random.default_rng(7 * sum(lens) + dv)
    n, nseq, c = sum(lens), len(lens), 2 * hk * dk + hv * dv
    ldx = c + 24  # the model's q|k|v rows are a view of the wider in-projection rows
    v, files = _rule_inputs(rng, ldx, case)
    x, starts, slots = v["x"], v["starts"], v["slots"]
    conv_w = (rng.standard_normal((c, 4)) * 0.5).astype(F32)
    conv_st = rng.standard_normal((nseq + 1, c, 3)).astype(F32)
    files |= {"convw": conv_w, "convst": conv_st}
    for name, arr in files.items():
        arr.tofile(tmp_path / f"{name}.bin")
    smem = [prep_tc_smem_bytes(dk), prep_tc_conv_smem_bytes(dk, dv)]
    smem.append(state_mma_smem_bytes(dk, 32, staged=True))
    args = [n, hk, hv, dk, dv, nseq, nseq + 1, int(tb), int(sb), ldx, *smem]
    proc = subprocess.run(
        [str(conv_emu), str(tmp_path), *map(str, args)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    # every scratch word (as bits: the unwritten words stay NaN in both), outputs and states bitwise
    for part in ("qk", "w", "a", "u", "g", "conv", "o", "state"):
        dt = np.uint16 if (part == "o" and tb) or (part == "state" and sb) else np.uint32
        ref, got = (np.fromfile(tmp_path / f"{part}_{k}.bin", dtype=dt) for k in ("ref", "fused"))
        assert ref.size and np.array_equal(got, ref), (
            f"{part}: {np.count_nonzero(got != ref)} of {ref.size} words differ from causal_conv + gdn_chunk_prep_tc"
        )
    for part in ("qk", "w", "a", "u", "g"):  # every scratch word written (the GPU test compares them all)
        words_ = np.fromfile(tmp_path / f"{part}_fused.bin", dtype=F32)
        assert not np.isnan(words_).any(), f"{part}: unwritten words"
    conv = np.fromfile(tmp_path / "conv_fused.bin", dtype=F32).reshape(conv_st.shape)
    np.testing.assert_array_equal(conv[0], conv_st[0])
    for s in range(nseq):  # the carried raw inputs: the reference conv's new state
        _, new = ops.conv1d_causal(x[starts[s] : starts[s + 1], :c], conv_st[slots[s]], conv_w)
        np.testing.assert_array_equal(conv[slots[s]], new, f"seq {s}: carried conv state")
