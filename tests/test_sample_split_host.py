"""CPU check of sample_rows' split path (cuda_src/sample_split.cuh: split_max, split_hist, split_gather and
their last blocks' resolve_row): the kernel text compiled by g++ under the CUDA emulation prelude of
tests/host/attn_emu.cpp (std::thread per CUDA thread, block and warp barriers, blocks in a shuffled order), driven
by tests/host/sample_split_driver.cpp with the launch sequence of ``ninfer.cuda.sampling._split_launches``. Every
row's token must be the NumPy sampler's (``ninfer.engine.sampler.sample``, -1 for ``MaskError``) over temperatures
0.3-1.5 (and greedy), top-k 0/1/20/50/1024/5000, top-p 1/0.95/0.5/tiny, min-p 0/0.05, masks, a token limit, NaN
and infinities, ties, all-equal rows, peaked LM-like rows and flat random ones, and the kernel's last state must
hold the exact cumulative mass the draw ended on; two launches on the same workspaces in the first cases (the
histograms, list counts and arrival counters must be zero again after each); small bin counts and sort caps that
force several gather rounds and the radix fallback for a bin larger than the cap; and a row alone gives the token
it gives in a batch. The GPU tests (tests/test_cuda_sampling.py) run the same kernels on the device.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator
from test_argmax_split_host import PRELUDE

from ninfer.engine.core import SamplingParams
from ninfer.engine.sampler import MaskError, distribution, packed_mask, sample

F32 = np.float32
TEMPS, TOPKS, TOPPS, MINPS = (
    (0.3, 0.6, 1.0, 1.5),
    (0, 1, 20, 50, 1024, 5000),
    (1.0, 0.95, 0.5, 1e-9),
    (0.0, 0.05),
)
COMBOS = list(itertools.product(TEMPS, TOPKS, TOPPS, MINPS))
KINDS = ("flat", "peaked", "ties", "equal", "inf")


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    parts = ["attn_emu.cpp", PRELUDE, "sampling.cu", "emu_io.cpp", "sample_split_driver.cpp"]
    return build_emulator(tmp_path_factory, "sample_split_emu", parts)


def make_row(rng: np.random.Generator, v: int, kind: str) -> np.ndarray:
    """One logits row of a kind: flat normal, peaked LM-like (a few strong ids over a long tail), a coarse grid
    (ties, both zeros, NaN), all equal, or with infinities (+inf twice: only those can be drawn)."""
    if kind == "flat":
        return rng.standard_normal(v).astype(F32)
    if kind == "peaked":
        x = (rng.standard_normal(v) * 2.5 - 12).astype(F32)
        x[rng.integers(0, v, 40)] = rng.uniform(-4, 6, 40).astype(F32)
        x[rng.integers(0, v, 4)] = rng.uniform(6, 14, 4).astype(F32)
        return x
    if kind == "ties":
        x = np.round(rng.standard_normal(v) * 2).astype(F32) / F32(2)
        x[1::7] = np.where(x[1::7] == 0, F32(-0.0), x[1::7])
        x[rng.integers(0, v, 3)] = np.nan
        return x
    if kind == "equal":
        return np.full(v, F32(rng.choice([0.0, -3.25, 7.5])))
    x = rng.standard_normal(v).astype(F32)
    x[rng.integers(0, v, 3)] = -np.inf
    x[rng.integers(0, v, 2)] = np.nan
    if rng.random() < 0.5:
        x[rng.integers(0, v, 2)] = np.inf
    return x


def make_case(rng: np.random.Generator, rows: int, v: int, masked: bool) -> tuple:
    """Rows, their params (one row greedy, one with nothing allowed when masked), packed masks or None."""
    x = np.stack([make_row(rng, v, KINDS[int(rng.integers(0, len(KINDS)))]) for _ in range(rows)])
    params = []
    for i in range(rows):
        t, k, tp, mp = COMBOS[int(rng.integers(0, len(COMBOS)))]
        params.append(SamplingParams(temperature=0.0 if i == 5 else t, top_k=k, top_p=tp, min_p=mp))
    masks = None
    if masked:
        masks = np.full((rows, -(-v // 32)), -1, np.int32)
        for i in range(1, rows, 2):
            bits = rng.random(v) < (0.0 if i == 3 else 0.02 if i == 5 else 0.6)
            masks[i] = packed_mask(bits, v)
    return x, params, masks


def want_tokens(x: np.ndarray, params: list, masks: np.ndarray | None, seeds: np.ndarray, pos: np.ndarray,
                limit: int | None) -> list[int]:  # fmt: skip
    got = []
    for i, p in enumerate(params):
        try:
            mask = None if masks is None else masks[i]
            got.append(sample(x[i], p, seed=int(seeds[i]), position=int(pos[i]), counts={}, token_limit=limit,
                              mask=mask))  # fmt: skip
        except MaskError:
            got.append(-1)
    return got


def run_emu(emu: Path, d: Path, x: np.ndarray, params: list, masks: np.ndarray | None, seeds: np.ndarray,
            pos: np.ndarray, limit: int, sizes: tuple[int, int, int], launches: int = 2) -> tuple:  # fmt: skip
    d.mkdir(parents=True, exist_ok=True)
    x.tofile(d / "x.bin")
    if masks is not None:
        masks.tofile(d / "mask.bin")
    np.array([[p.temperature, p.top_p, p.min_p] for p in params], np.float64).tofile(d / "params.bin")
    np.array([p.top_k for p in params], np.int32).tofile(d / "topk.bin")
    np.concatenate([seeds, pos]).astype(np.uint64).tofile(d / "seedpos.bin")
    rows, v = x.shape
    args = [rows, v, limit, *sizes, int(masks is not None), launches]
    proc = subprocess.run([str(emu), str(d), *map(str, args)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    out = np.fromfile(d / "out.bin", np.int32).reshape(launches, rows)
    st = np.fromfile(d / "st.bin", np.uint64).reshape(rows, 8)
    return out, np.fromfile(d / "zero.bin", np.uint64), np.fromfile(d / "cnt.bin", np.int32), st


def drawn_prefix_mass(
    x: np.ndarray, p: SamplingParams, mask: np.ndarray | None, limit: int | None, tok: int
) -> int:
    """The exact cumulative mass of the kept distribution up to and including ``tok`` (the kernel's last state)."""
    ids, q = distribution(x, p, counts={}, token_limit=limit, mask=mask)
    return int(np.cumsum(q, dtype=np.uint64)[int(np.flatnonzero(ids == tok)[0])])


SIZES = (  # chunk, bins, cap
    (1024, 256, 256),  # one gather round for most rows
    (512, 32, 64),  # coarse bins, small lists: several rounds
    (2048, 4, 16),  # a bin over the cap on nearly every row: the radix fallback
)


def test_hist_span_matches_the_driver() -> None:
    from ninfer.cuda.sampling import HIST_SPAN

    assert HIST_SPAN == 4, "tests/host/sample_split_driver.cpp launches split_hist with chunk * 4"


@pytest.mark.parametrize("case", range(9))
def test_split_sampler_emulated(emu: Path, tmp_path: Path, case: int) -> None:
    rng = np.random.default_rng([case, 77])
    sizes = SIZES[case % len(SIZES)]
    rows, v = 8, (3000, 5003, 6100)[case % 3]
    masked = case % 2 == 1
    limit = v - 97 if case % 4 == 2 else None
    x, params, masks = make_case(rng, rows, v, masked)
    seeds, pos = rng.integers(0, 2**63, rows, dtype=np.uint64), rng.integers(0, 2**30, rows, dtype=np.uint64)
    launches = 2 if case < 3 else 1  # a second launch on the same workspaces in the first cases
    lim = v if limit is None else limit
    out, zero, cnt, st = run_emu(emu, tmp_path, x, params, masks, seeds, pos, lim, sizes, launches)
    want = want_tokens(x, params, masks, seeds, pos, limit)
    bad = [(i, params[i], out[0, i], want[i]) for i in range(rows) if out[0, i] != want[i]]
    assert not bad, f"{len(bad)} rows differ from the NumPy sampler: {bad}"
    for i, p in enumerate(params):  # the exact mass the draw ended on (ST_MASS), not just the same token
        if p.temperature > 0 and want[i] >= 0:
            m = None if masks is None else masks[i]
            assert int(st[i, 5]) == drawn_prefix_mass(x[i], p, m, limit, want[i]), f"row {i}: kept mass"
    assert (out == out[0]).all(), "a second launch on the same workspaces must give the same tokens"
    assert not zero.any() and not cnt.any(), "histograms, list counts and arrival counters must be zero again"
    if masked:
        assert want[3] == -1, "the cases must cover a row with nothing allowed"


def test_split_sampler_batch_invariant(emu: Path, tmp_path: Path) -> None:
    """Each row alone gives the token it gives in the batch (and the NumPy sampler's)."""
    rng = np.random.default_rng(5)
    rows, v = 4, 4000
    x = np.stack([make_row(rng, v, k) for k in ("flat", "peaked", "ties", "inf")])
    params = [SamplingParams(temperature=0.6, top_k=20, top_p=0.95), SamplingParams(temperature=1.0, top_p=0.95),
              SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, min_p=0.05)]  # fmt: skip
    seeds, pos = rng.integers(0, 2**63, rows, dtype=np.uint64), rng.integers(0, 2**30, rows, dtype=np.uint64)
    sizes = SIZES[1]
    batch, _, _, _ = run_emu(emu, tmp_path / "b", x, params, None, seeds, pos, v, sizes, launches=1)
    assert batch[0].tolist() == want_tokens(x, params, None, seeds, pos, None)
    for i in range(rows):
        one, _, _, _ = run_emu(emu, tmp_path / f"r{i}", x[i : i + 1], params[i : i + 1], None, seeds[i : i + 1],
                            pos[i : i + 1], v, sizes, launches=1)  # fmt: skip
        assert one[0, 0] == batch[0, i], f"row {i}: alone {one[0, 0]}, in the batch {batch[0, i]}"
