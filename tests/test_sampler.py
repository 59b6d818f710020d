"""The engine's sampler definition (ninfer/engine/sampler.py docstring): greedy ties, top-k/top-p/min-p
boundaries (ties in x included), masks, the token limit, penalties, seeded determinism, the distribution, and
MaskError. Then the GPU kernel's arithmetic checked on the host: tests/sampling_host.cu runs the sample_rows
algorithm with the kernel's own __host__ __device__ pieces, compiled by nvcc (skipped without nvcc), and must
give the NumPy sampler's tokens on fresh random rows."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer.cuda.loader import CUDA_SRC
from ninfer.engine.core import SamplingParams
from ninfer.engine.sampler import MaskError, packed_mask, sample, sort_keys, uniform

F32 = np.float32
ONE = 1 << 44


def _draw(x: np.ndarray, seeds: range, **kw: float) -> list[int]:
    p = SamplingParams(temperature=kw.pop("temperature", 1.0), **kw)  # type: ignore[arg-type]
    return [sample(np.asarray(x, F32), p, seed=s, position=0, counts={}) for s in seeds]


def _support(x: np.ndarray, **kw: float) -> set[int]:
    return set(_draw(x, range(600), **kw))


def test_greedy_lowest_id_on_ties_and_signed_zero() -> None:
    g = SamplingParams()
    assert sample(np.array([1, 3, 2, 3], F32), g, seed=0, position=0, counts={}) == 1
    assert sample(np.array([-1, -0.0, 0.0, -2], F32), g, seed=0, position=0, counts={}) == 1  # -0 == +0
    x = np.array([np.nan, -np.inf, -np.inf], F32)
    assert sample(x, g, seed=0, position=0, counts={}) == 1  # NaN is banned; -inf is allowed
    assert sample(x, g, seed=0, position=0, counts={}, token_mask=lambda _: np.array([1, 0, 1], bool)) == 2


def test_sort_keys_order() -> None:
    x = np.array([1.0, -0.0, 0.0, -np.inf, np.inf, 1.0, -3.5, 2e-45], F32)
    ids = np.arange(x.size)
    order = ids[np.argsort(sort_keys(x, ids))[::-1]]
    want = sorted(ids, key=lambda i: (-float(x[i]), i))
    assert order.tolist() == want


def test_top_k_and_min_p_boundaries_with_ties() -> None:
    x = np.log(np.array([0.4, 0.2, 0.2, 0.1, 0.1], F32))
    assert _support(x) == {0, 1, 2, 3, 4}
    assert _support(x, top_k=2) == {0, 1}  # the tie at 0.2 goes to the lower id
    assert _support(x, top_k=3) == {0, 1, 2}
    assert _support(x, top_k=5) == _support(x, top_k=0) == {0, 1, 2, 3, 4}
    e = np.exp(x.astype(np.float64) - x[0])  # e_i exactly as the definition computes it
    assert _support(x, min_p=float(e[1])) == {0, 1, 2}  # e_i >= min_p keeps the boundary
    assert _support(x, min_p=float(np.nextafter(e[1], 1))) == {0}
    assert _support(x, min_p=1.0) == {0}


def _masses(x: np.ndarray, t: float = 1.0) -> np.ndarray:
    x = np.asarray(x, F32)
    return np.floor(np.exp((x.astype(np.float64) - np.float64(x.max())) / t) * ONE).astype(np.uint64)


def test_top_p_boundary_is_exact() -> None:
    x = np.log(np.array([0.5, 0.25, 0.25], F32))
    q = _masses(x)
    total = int(q.sum())
    tp = int(q[0]) / total  # the largest top_p whose target ceil(top_p * S) is still the first token's mass
    while math.ceil(tp * float(total)) > int(q[0]):
        tp = float(np.nextafter(tp, 0))
    while math.ceil(float(np.nextafter(tp, 1)) * float(total)) <= int(q[0]):
        tp = float(np.nextafter(tp, 1))
    assert _support(x, top_p=tp) == {0}
    assert _support(x, top_p=float(np.nextafter(tp, 1))) == {0, 1}  # one mass unit more: the next token
    assert _support(x, top_p=0.76) == {0, 1, 2}
    assert _support(x, top_p=1e-300) == _support(x, top_p=0.0) == {0}  # at least one token


def test_draw_is_the_integer_inverse_cdf() -> None:
    x = np.log(np.array([0.5, 0.3, 0.2], F32))
    q = np.floor(np.exp(x.astype(np.float64) - x[0]) * ONE).astype(np.uint64)
    csum = np.cumsum(q)
    for pos in range(300):
        t = math.floor(uniform(9, pos) * float(int(csum[-1])))
        want = int(np.searchsorted(csum, np.uint64(t), side="right"))
        got = sample(x, SamplingParams(temperature=1.0), seed=9, position=pos, counts={})
        assert got == want


def test_tiny_probabilities_have_no_mass(monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.engine.sampler as sampler

    monkeypatch.setattr(sampler, "uniform", lambda seed, pos: 1.0 - 2.0**-53)  # the draw's last kept token
    x = np.array([0.0, -40.0, -29.0], F32)  # e^-40 < 2^-44 <= e^-29
    assert _masses(x).tolist() == [ONE, 0, math.floor(math.exp(-29.0) * ONE)]
    assert sample(x, SamplingParams(temperature=1.0), seed=0, position=0, counts={}) == 2
    assert sample(x, SamplingParams(temperature=2.0), seed=0, position=0, counts={}) == 1  # e^-20: has mass


def test_masks_limit_nan_and_mask_error() -> None:
    x = np.array([5.0, 4.0, np.nan, 3.0, 2.0, 1.0], F32)
    p = SamplingParams(temperature=1.0)
    got = {sample(x, p, seed=s, position=0, counts={}, token_limit=4) for s in range(500)}
    assert got == {0, 1, 3}  # NaN and ids >= 4 never drawn
    packed = packed_mask(np.array([0, 0, 1, 0, 1, 1], bool), 6)
    assert packed.dtype == np.int32 and packed.tolist() == [0b110100]
    got = {sample(x, p, seed=s, position=0, counts={}, mask=packed) for s in range(500)}
    assert got == {4, 5}
    with pytest.raises(MaskError, match="allows no token"):
        sample(x, p, seed=0, position=0, counts={}, mask=packed, token_limit=4)
    with pytest.raises(MaskError, match="allows no token"):
        sample(np.full(3, np.nan, F32), SamplingParams(), seed=0, position=0, counts={})
    with pytest.raises(MaskError, match="failed"):
        sample(x, p, seed=0, position=0, counts={}, token_mask=lambda _: 1 / 0)
    with pytest.raises(MaskError):
        packed_mask(np.zeros(5, bool), 6)


def test_penalties_change_the_draw() -> None:
    x = np.zeros(4, F32)
    p = SamplingParams(temperature=1.0, presence_penalty=50.0)
    assert {sample(x, p, seed=s, position=1, counts={0: 1, 1: 2}) for s in range(300)} == {2, 3}
    r = SamplingParams(repetition_penalty=4.0)
    assert sample(np.array([2.0, 1.0], F32), r, seed=0, position=0, counts={0: 1}) == 1  # 2/4 < 1


def test_seeded_determinism_and_distribution() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(50).astype(F32)
    p = SamplingParams(temperature=0.8, top_k=10, top_p=0.9)
    a = [sample(x, p, seed=5, position=i, counts={}) for i in range(200)]
    assert a == [sample(x, p, seed=5, position=i, counts={}) for i in range(200)]
    assert a != [sample(x, p, seed=6, position=i, counts={}) for i in range(200)]
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    n = 8000
    draws = np.bincount(_draw(np.log(probs), range(n)), minlength=4) / n
    assert np.abs(draws - probs).max() < 4 * np.sqrt(0.25 / n)


# ---- the kernel's arithmetic on the host --------------------------------------------------------------------
@pytest.fixture(scope="module")
def host_sampler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    exe = tmp_path_factory.mktemp("sampling") / "sampling_host"
    src = Path(__file__).with_name("sampling_host.cu")
    subprocess.run([nvcc, "-std=c++17", "-O2", f"-I{CUDA_SRC}", "-x", "cu", str(src), "-o", str(exe)],
                   check=True, capture_output=True)  # fmt: skip
    return exe


@pytest.mark.parametrize("v", [300, 4099, 248320])
def test_kernel_algorithm_on_host_matches_numpy(host_sampler: Path, v: int) -> None:
    rng = np.random.default_rng(v)
    rows, limit = (40 if v < 100000 else 12), v - 7
    combos = [(1.0, 0, 1.0, 0.0), (0.7, 50, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (0.6, 20, 0.95, 0.0),
              (1.0, 0, 1.0, 0.05), (1.3, 200, 0.8, 0.01), (1e-3, 0, 1.0, 0.0), (50.0, 0, 0.5, 0.0),
              (0.0, 0, 1.0, 0.0), (1.0, 1, 1.0, 0.0)]  # fmt: skip
    blob = [np.array([rows, v, limit, 1], np.int32).tobytes()]
    want = []
    for r in range(rows):
        t, k, tp, mp = combos[r % len(combos)]
        scale = (1.0, 8.0, 0.5)[r % 3]
        x = (rng.standard_normal(v) * scale).astype(F32)
        if r % 4 == 3:
            x = np.round(x * 2) / F32(2)  # ties everywhere
            x[rng.integers(0, v, 3)] = np.nan
        bits = rng.random(v) < (1.0 if r % 2 else 0.3)
        words = packed_mask(bits, v)
        seed, pos = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**30))
        p = SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp)
        try:
            want.append(sample(x, p, seed=seed, position=pos, counts={}, token_limit=limit, mask=words))
        except MaskError:
            want.append(-1)
        blob += [np.array([t, tp, mp], np.float64).tobytes(), np.array([k], np.int32).tobytes(),
                 np.array([seed, pos], np.uint64).tobytes(), x.tobytes(), words.tobytes()]  # fmt: skip
    out = subprocess.run([str(host_sampler)], input=b"".join(blob), capture_output=True, check=True)
    got = [int(s) for s in out.stdout.split()]
    assert got == want


# ---- the engine's one sampling path (runner.sample) ------------------------------------------------------------
@pytest.mark.parametrize(
    "name,kw",
    [
        ("test_batch_invariance", {"sampling": {"temperature": 0.9, "top_p": 0.95, "top_k": 50}}),
        ("test_token_mask_hook", {}),
        ("test_penalties_and_seeds_in_the_engine", {}),
    ],
)
def test_engine_samples_through_the_runner(
    name: str, kw: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every token the engine accepts comes from ``runner.sample`` (the runner contract, engine/core.py): one
    ``SampleRequest`` per listed row, masks packed to int32 words, and the rows' tokens are ``sample``'s."""
    import test_engine_batching

    from ninfer.demo import build_demo
    from ninfer.engine.model_runner import ReferenceRunner
    from ninfer.model import load

    calls: list[int] = []
    inner = ReferenceRunner.sample

    def spy(self: ReferenceRunner, rows: list[int], reqs: list, token_limit: int | None) -> list[int]:
        calls.append(len(reqs))
        assert len(rows) == len(reqs) and all(r.mask is None or r.mask.dtype == np.int32 for r in reqs)
        toks = inner(self, rows, reqs, token_limit)
        for row, r, tok in zip(self._logits[rows], reqs, toks, strict=True):
            try:
                want = sample(row, r.params, seed=r.seed, position=r.position, counts=r.counts,
                              token_limit=token_limit, mask=r.mask)  # fmt: skip
            except MaskError:
                want = -1
            assert tok == want
        return toks

    monkeypatch.setattr(ReferenceRunner, "sample", spy)
    model = load(build_demo(tmp_path / "demo.ninfer"))
    getattr(test_engine_batching, name)(model, **kw)
    assert calls and max(calls) >= 1, "the engine must sample through runner.sample"
