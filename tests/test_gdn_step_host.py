"""CPU check of cuda_src/gdn_step.cu (the exact GDN recurrence, its fused conv and the decode epilogue): the kernel
text compiled by g++ under the CUDA emulation prelude of tests/host/gdn_emu.cpp (one std::thread per CUDA thread,
real barriers and warp exchanges, NaN-filled shared memory, NaN-poisoned outputs), driven by
tests/host/gdn_step_driver.cpp. Without a GPU this checks the index arithmetic, the barriers, partial column tiles,
empty segments and three invariants:

- gdn_decode's single launch (the epilogue in gdn_step, last-arrival counters) equals its two-launch form
  (gdn_step + gdn_step_post) bitwise, with and without snapshots;
- the fused path (``gdn_decode``'s two launches) matches the NumPy reference (conv, l2norm, gates, recurrence,
  gated RMSNorm) and leaves the reference's recurrent and conv states;
- it equals the unfused path (conv -> ``gdn_step<CONV=false>`` -> gated norm) bitwise, states included;
- a multi-token segment (exact prefill) equals the same tokens fed as decode calls bitwise (float32 state);
- gdn_decode's cluster kernel (gdn_step_cl: the column tiles of a value head as one cluster, run concurrently with
  their own NaN-filled shared memory, exchanging o through emulated distributed shared memory and mbarriers)
  equals the launches above bitwise, with and without snapshots, decode calls and multi-token segments; so does
  its persistent form (gdn_step_clp) on 3 clusters and on 1, each taking the (sequence, value head) items in turn
  with the next item's state slice staged into shared memory;
- every kernel of this file equals the kernel text of BASE (before gdn_step_cl and the shared per-token functions)
  bitwise, run through the same driver (skipped where git or that commit is not available).

The GPU tests in test_cuda_ops.py and test_cuda_gdn_decode.py check the same kernels on the device.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator, rel_error, words

from ninfer.formats import bf16_decode, bf16_round
from ninfer.reference import ops

F32 = np.float32
EPS = 1e-6


BASE = "bd39706"  # main before gdn_step_cl: gdn_step.cu's kernels as they were (the bitwise reference)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(
        tmp_path_factory, "gdn_step_emu", ["gdn_emu.cpp", "gdn_step.cu", "emu_io.cpp", "gdn_step_driver.cpp"]
    )


def _base_source(name: str, seen: set[str]) -> str:
    """cuda_src/``name`` at BASE with its local includes inlined once (as loader.source_text does)."""
    proc = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{BASE}:cuda_src/{name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        pytest.skip(f"git show {BASE}:cuda_src/{name} failed: {proc.stderr.strip()[:200]}")

    def sub(m: re.Match[str]) -> str:
        if m.group(1) in seen:
            return ""
        seen.add(m.group(1))
        return _base_source(m.group(1), seen)

    return re.sub(r'#include "([^"]+)"', sub, proc.stdout).replace("#pragma once", "")


@pytest.fixture(scope="module")
def emu_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same driver over BASE's gdn_step.cu (no gdn_step_cl: EMU_NO_CL)."""
    text = _base_source("gdn_step.cu", set())
    return build_emulator(
        tmp_path_factory,
        "gdn_step_base_emu",
        ["gdn_emu.cpp", text, "emu_io.cpp", "#define EMU_NO_CL 1", "gdn_step_driver.cpp"],
    )


CASES = (  # hk, hv, dk, dv, lens, bf16 activations, bf16 state
    (2, 4, 32, 32, [1, 3, 0], False, False),  # an empty last segment (its start is the row count)
    (1, 3, 16, 48, [5, 0, 1], False, True),  # ratio 3, a partial second column tile, an empty segment
    (2, 4, 64, 64, [2, 4], True, True),
    (1, 2, 128, 32, [1, 1, 6], True, False),  # the 27B's head dim: 8 warps
    (2, 2, 16, 16, [7], False, False),  # the tiny test model's heads: half a column tile
    (1, 2, 32, 128, [3, 1], True, False),  # every tile of a cluster live (the 27B's value head width)
    (2, 2, 16, 96, [2, 0, 5], False, True),  # three live tiles and a dead one
)


def _run(
    emu: Path, d: Path, case: tuple, mode: int, extra: int = 0, keep: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """``extra`` zero state slots after the case's (snapshot room); ``keep``: only the first ``keep`` tokens of
    every sequence (the same inputs otherwise)."""
    hk, hv, dk, dv, lens, tb, sb = case
    rng = np.random.default_rng(sum(lens) + dk + hv)
    n, nseq = sum(lens), len(lens)
    c, w = 2 * hk * dk + hv * dv, hv * dv

    def rnd(*s: int, scale: float = 1.0) -> np.ndarray:
        x = (rng.standard_normal(s) * scale).astype(F32)
        return bf16_round(x) if tb else x

    state = (rng.standard_normal((nseq + 1, hv, dk, dv)) * 0.1).astype(F32)
    inp = {
        "qkv": rnd(n, c),
        "convw": (rng.standard_normal((c, 4)) * 0.5).astype(F32),
        "conv": rng.standard_normal((nseq + 1, c, 3)).astype(F32),
        "a": rnd(n, hv),
        "b": rnd(n, hv),
        "alog": rng.uniform(-2, 1, hv).astype(F32),
        "dtb": rng.uniform(-1, 1, hv).astype(F32),
        "state": bf16_round(state) if sb else state,
        "starts": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
        "slots": (np.arange(nseq, dtype=np.int32)[::-1] + 1).copy(),  # slot 0 is never touched
        "z": rnd(n, w, scale=2.0),
        "normw": (1 + rng.standard_normal(dv) * 0.2).astype(F32),
    }
    if extra:
        inp["state"] = np.concatenate([inp["state"], np.zeros((extra, *state.shape[1:]), F32)])
        inp["conv"] = np.concatenate([inp["conv"], np.zeros((extra, c, 3), F32)])
        inp["snap"] = (nseq + 1 + np.concatenate([[0], np.cumsum(lens)[:-1]])).astype(np.int32)
    if keep is not None:
        rows = np.concatenate(
            [np.arange(s0, s0 + min(n_, keep)) for s0, n_ in zip(inp["starts"], lens, strict=False)]
        )
        for name in ("qkv", "a", "b", "z"):
            inp[name] = inp[name][rows.astype(np.int64)]
        lens = [min(n_, keep) for n_ in lens]
        inp["starts"] = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        n = sum(lens)
    for name, arr in inp.items():
        bf = (tb and name in ("qkv", "a", "b", "z")) or (sb and name == "state")
        (arr if arr.dtype == np.int32 else words(arr, bf)).tofile(d / f"{name}.bin")
    args = [n, hk, hv, dk, dv, nseq, nseq + 1 + extra, int(tb), int(sb), mode, EPS]
    proc = subprocess.run([str(emu), str(d), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    y = np.fromfile(d / "y.bin", dtype=np.uint16 if tb else F32).reshape(n, w)
    st = np.fromfile(d / "state_out.bin", dtype=np.uint16 if sb else F32).reshape(inp["state"].shape)
    cv = np.fromfile(d / "conv_out.bin", dtype=F32).reshape(inp["conv"].shape)
    return y, st, cv, inp


def _reference(case: tuple, inp: dict, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gdn_block's mixer core for sequence s in NumPy: y, new recurrent state, new conv state."""
    hk, hv, dk, dv, lens, tb, _ = case
    z = slice(inp["starts"][s], inp["starts"][s + 1])
    slot = inp["slots"][s]
    y, conv = ops.conv1d_causal(inp["qkv"][z], inp["conv"][slot], inp["convw"])
    y = ops.silu(y)
    y = bf16_round(y) if tb else y  # the conv output is stored as an activation
    q = ops.l2norm(y[:, : hk * dk].reshape(-1, hk, dk))
    k = ops.l2norm(y[:, hk * dk : 2 * hk * dk].reshape(-1, hk, dk))
    v = y[:, 2 * hk * dk :].reshape(-1, hv, dv)
    beta, g = ops.gdn_gates(inp["a"][z], inp["b"][z], inp["alog"], inp["dtb"])
    o, new = ops.gdn_recurrent(q, k, v, g, beta, inp["state"][slot])
    o = bf16_round(o) if tb else o
    out = ops.gated_rmsnorm(o, inp["normw"], inp["z"][z].reshape(-1, hv, dv), EPS)
    return out.reshape(-1, hv * dv), new, conv


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hk{c[0]}hv{c[1]}dk{c[2]}dv{c[3]}T{sum(c[4])}")
def test_gdn_step_emulated(emu: Path, tmp_path: Path, case: tuple) -> None:
    _, _, _, _, lens, tb, sb = case
    runs = {}
    for mode in (0, 1, 2, 10, 12, 20, 22, 30, 32, 40, 42):
        d = tmp_path / str(mode)
        d.mkdir()
        runs[mode] = _run(emu, d, case, mode)
    # gdn_decode's single launch (counters: 10, 12; cluster: 20, 22; persistent clusters: 30, 32 on 3 clusters,
    # 40, 42 on 1) == the two launches, bitwise
    for one, two in ((10, 0), (12, 2), (20, 0), (22, 2), (30, 0), (32, 2), (40, 0), (42, 2)):
        for got, ref, what in zip(
            runs[one][:3], runs[two][:3], ("output", "state", "conv state"), strict=True
        ):
            np.testing.assert_array_equal(got, ref, err_msg=f"mode {one} (one launch) vs {two}: {what}")
    y, st, cv, inp = runs[0]
    got_y = bf16_decode(y) if tb else y
    got_s = bf16_decode(st) if sb else st
    np.testing.assert_array_equal(st[0], words(inp["state"][0], sb))  # slot 0 untouched
    np.testing.assert_array_equal(cv[0], inp["conv"][0])
    otol, stol = (1.2e-2 if tb else 1e-4), (1.2e-2 if sb else 1e-4)
    for s in range(len(lens)):
        ref_y, ref_s, ref_c = _reference(case, inp, s)
        z, slot = slice(inp["starts"][s], inp["starts"][s + 1]), inp["slots"][s]
        if lens[s]:
            err = rel_error(got_y[z], ref_y)
            assert err <= otol, f"seq {s} (T={lens[s]}): output error {err:.2e} > {otol:.1e}"
        err = rel_error(got_s[slot], ref_s)
        assert err <= stol, f"seq {s} (T={lens[s]}): state error {err:.2e} > {stol:.1e}"
        np.testing.assert_array_equal(cv[slot], ref_c, err_msg=f"seq {s}: conv state")
    # fused == unfused bitwise (output, recurrent and conv states)
    for got, ref, what in zip(runs[0][:3], runs[1][:3], ("output", "state", "conv state"), strict=True):
        np.testing.assert_array_equal(got, ref, err_msg=f"fused vs unfused: {what}")
    # exact prefill == decode calls: bitwise with a float32 state (a bf16 state is rounded once per call)
    dy, dst, dcv, _ = runs[2]
    np.testing.assert_array_equal(dcv, cv, err_msg="prefill vs decode: conv state")
    if not sb:
        np.testing.assert_array_equal(dy, y, err_msg="prefill vs decode: output")
        np.testing.assert_array_equal(dst, st, err_msg="prefill vs decode: state")
    else:
        got_d = bf16_decode(dy) if tb else dy
        for s in range(len(lens)):
            z = slice(inp["starts"][s], inp["starts"][s + 1])
            if lens[s]:
                assert rel_error(got_d[z], _reference(case, inp, s)[0]) <= 1.2e-2


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hk{c[0]}hv{c[1]}dk{c[2]}dv{c[3]}T{sum(c[4])}")
def test_gdn_step_snapshots_emulated(emu: Path, tmp_path: Path, case: tuple) -> None:
    """Snapshots (the speculative verify's rollback, docs/speculative.md): with ``snap`` the outputs and final
    states are bitwise those without, and the snapshot before token i of a sequence is bitwise the state (recurrent
    and conv) that a call over its first i tokens leaves."""
    lens = case[4]
    extra = sum(lens)
    runs = {}
    for mode in (0, 3, 13, 23, 33, 43):
        d = tmp_path / f"m{mode}"
        d.mkdir()
        runs[mode] = _run(emu, d, case, mode, extra)
    for one in (13, 23, 33, 43):  # the counter, the cluster and the persistent cluster single launch
        for got, ref, what in zip(runs[one][:3], runs[3][:3], ("output", "state", "conv state"), strict=True):
            np.testing.assert_array_equal(got, ref, err_msg=f"snapshots, mode {one} vs two launches: {what}")
    inp = runs[3][3]
    base = len(lens) + 1
    for got, ref, what in zip(runs[3][:3], runs[0][:3], ("output", "state", "conv state"), strict=True):
        part = slice(None) if what == "output" else slice(0, base)
        np.testing.assert_array_equal(got[part], ref[part], err_msg=f"snapshots change the {what}")
    np.testing.assert_array_equal(runs[0][1][base:], 0 * runs[0][1][base:], err_msg="slots past the case's")
    for i in range(max(lens)):
        d = tmp_path / f"keep{i}"
        d.mkdir()
        _, st, cv, _ = _run(emu, d, case, 0, extra, keep=i)
        for s in range(len(lens)):
            if i < lens[s]:
                slot, at = inp["slots"][s], inp["snap"][s] + i
                np.testing.assert_array_equal(runs[3][1][at], st[slot], err_msg=f"seq {s} token {i}: state")
                np.testing.assert_array_equal(runs[3][2][at], cv[slot], err_msg=f"seq {s} token {i}: conv")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hk{c[0]}hv{c[1]}dk{c[2]}dv{c[3]}T{sum(c[4])}")
def test_gdn_step_equals_base_emulated(emu: Path, emu_base: Path, tmp_path: Path, case: tuple) -> None:
    """Every gdn_step.cu path of this tree == BASE's kernels bitwise on the same inputs: the unfused recurrence
    (gdn_step<CONV = false>), both epilogue forms and the cluster kernel against BASE's single launch, decode calls
    and snapshots included."""
    extra = sum(case[4])
    pairs = (
        (1, 1),
        (0, 0),
        (10, 10),
        (20, 10),
        (22, 12),
        (13, 13),
        (23, 13),
        (30, 10),
        (42, 12),
        (33, 13),
    )  # (this tree's mode, BASE's mode)
    for new, old in pairs:
        got = _run(emu, _mkdir(tmp_path / f"new{new}"), case, new, extra)
        ref = _run(emu_base, _mkdir(tmp_path / f"base{new}"), case, old, extra)
        for g, r, what in zip(got[:3], ref[:3], ("output", "state", "conv state"), strict=True):
            np.testing.assert_array_equal(g, r, err_msg=f"mode {new} vs BASE mode {old}: {what}")


def _mkdir(d: Path) -> Path:
    d.mkdir()
    return d
