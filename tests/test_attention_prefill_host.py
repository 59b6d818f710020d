"""CPU check of the prefill-attention kernels themselves: cuda_src/attention_prefill.cu compiled by g++ under the
attention emulation prelude (tests/host/attn_emu.cpp, plus tests/host/attn_prefill_emu.cpp: ldmatrix on its PTX
fragment layout; cp.async copies synchronously). One std::thread per CUDA thread, NaN-filled shared memory per
block, NaN-poisoned output, blocks in a shuffled order. Checks the GQA kernel (query heads of a KV head packed into
one block, double-buffered K/V tiles, ldmatrix fragments) against the NumPy reference on D = 256 and D = 32, GQA
groups 1, 6 and 8, several sequences per launch, positions crossing tiles and pages, float and bf16 q; that it is
bitwise the one-head kernel (same arithmetic per row); and that a row's bits depend neither on the block order,
the other rows of the launch, their order, nor on how the prompt is chunked. The GPU tests
(tests/test_cuda_attention_prefill.py) check the same on the device.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator
from test_cuda_attention_prefill import TOL, _err, _problem

from ninfer.formats import bf16_decode, bf16_encode

F32 = np.float32
VARIANT = {"gqa": 0, "head": 1}


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    parts = [
        "attn_emu.cpp",
        "attn_prefill_emu.cpp",
        "attention_prefill.cu",
        "emu_io.cpp",
        "attn_prefill_driver.cpp",
    ]
    return build_emulator(tmp_path_factory, "attn_prefill_emu", parts, timeout=900)


def _run(emu: Path, tmp: Path, pr: dict, t: str, rows: np.ndarray | None = None, *, variant: str = "gqa",
         seed: int = 1, split_keys: int = 0) -> np.ndarray:  # fmt: skip
    """The kernel's output for launch rows ``rows`` (default: all, in order) of problem ``pr``."""
    rows = np.arange(pr["q"].shape[0]) if rows is None else rows
    q = pr["q"][rows]
    r, hq, d = q.shape
    kc, table = pr["kc"], pr["table"]
    files = {"q": bf16_encode(q) if t == "bf16" else q.astype(F32), "kc": kc, "vc": pr["vc"], "pt": table,
             "seq": pr["row_seq"][rows], "pos": pr["row_pos"][rows]}  # fmt: skip
    for name, arr in files.items():
        np.ascontiguousarray(arr).tofile(tmp / f"{name}.bin")
    scale = repr(float(F32(float(d) ** -0.5)))
    args = [VARIANT[variant], int(t == "bf16"), d, r, hq, kc.shape[2], kc.shape[0], kc.shape[1], table.shape[1],
            table.shape[0], scale, seed, split_keys, pr["max_len"]]  # fmt: skip
    proc = subprocess.run([str(emu), str(tmp), *map(str, args)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    raw = np.fromfile(tmp / "o.bin", dtype=np.uint16 if t == "bf16" else F32).reshape(r, hq, d)
    return bf16_decode(raw) if t == "bf16" else raw


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


# (t, (HQ, HKV, D, page size, start positions, new rows per sequence)): groups 6 (27B), 8 (35B-A3B) and 1; rows of
# two sequences sharing a block (a segment boundary inside it); positions across 16/32/64-key tiles and pages.
CASES = (
    ("float", (6, 1, 256, 16, [5, 0], [30, 12])),
    ("bf16", (16, 2, 256, 16, [0, 40], [20, 9])),
    ("float", (12, 2, 32, 8, [3, 0, 70], [50, 1, 20])),
    ("bf16", (2, 2, 32, 4, [0], [140])),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-hq{c[1][0]}hkv{c[1][1]}d{c[1][2]}")
def test_gqa_emulated_matches_reference_and_one_head_kernel(emu: Path, tmp_path: Path, case: tuple) -> None:
    t, shape = case
    pr = _problem(np.random.default_rng(CASES.index(case)), shape, t)
    got = _run(emu, tmp_path, pr, t)
    err = _err(got, pr["ref"])
    assert err <= TOL[t], f"normalised max error {err:.3e} > {TOL[t]:.1e}"
    assert _same(_run(emu, tmp_path, pr, t, variant="head"), got), (
        "the GQA kernel's bits differ from the one-head's"
    )
    assert _same(_run(emu, tmp_path, pr, t, seed=9), got), "the block order changed results"


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gqa_emulated_rows_independent(emu: Path, tmp_path: Path, t: str) -> None:
    """A row's bits are the same in the full launch, with the rows shuffled, with its sequence alone, alone, and
    when its sequence's prompt is split into chunks (each chunk a launch of its own rows)."""
    rng = np.random.default_rng(11)
    pr = _problem(rng, (6, 1, 256, 16, [0, 7], [40, 25]), t)
    full = _run(emu, tmp_path, pr, t)
    perm = rng.permutation(full.shape[0])
    assert _same(_run(emu, tmp_path, pr, t, perm), full[perm]), "row order changed results"
    seq1 = np.arange(40, 65)
    assert _same(_run(emu, tmp_path, pr, t, seq1), full[seq1]), (
        "sequence alone differs from the packed launch"
    )
    for chunk in (np.arange(0, 17), np.arange(17, 33), np.arange(33, 40), np.array([38])):
        assert _same(_run(emu, tmp_path, pr, t, chunk), full[chunk]), f"chunk {chunk[0]}..{chunk[-1]} differs"


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gqa_emulated_key_splits(emu: Path, tmp_path: Path, t: str) -> None:
    """Key splits (the launch of few blocks over a long prefix): split_keys = 32 and 64 over rows up to position 150
    (2-5 splits): the merged output within fp32 rounding of the unsplit one (and of the reference); the rows whose
    keys all fall in split 0 bitwise the unsplit bits; no output left unwritten; the block order changes nothing."""
    pr = _problem(np.random.default_rng(21), (6, 1, 256, 16, [0, 100], [40, 51]), t)
    full = _run(emu, tmp_path, pr, t)
    pos = pr["row_pos"]
    for sk in (32, 64):
        got = _run(emu, tmp_path, pr, t, split_keys=sk)
        assert _err(got, pr["ref"]) <= TOL[t], f"split_keys={sk}: against the reference"
        assert _err(got, full) <= (1e-5 if t == "float" else TOL[t]), f"split_keys={sk}: against the unsplit"
        one = pos < sk
        assert one.any() and (~one).any()
        assert _same(got[one], full[one]), f"split_keys={sk}: one-split rows changed bits"
        assert _same(_run(emu, tmp_path, pr, t, split_keys=sk, seed=5), got), "block order changed results"
