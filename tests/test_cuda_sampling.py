"""GPU sampler (ninfer.cuda.sampling) against the NumPy oracle (ninfer.engine.sampler.sample) on fresh random rows.

Tokens must be identical (the definition is exact integer arithmetic; see the sampler docstring for the one-ulp
``exp`` caveat, which needs a uniform within a few 2^-44 of a boundary to show). Outputs start poisoned (-2, never
a valid answer). Skipped without a CUDA device (conftest).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.engine.core import SamplingParams
from ninfer.engine.sampler import MaskError, SampleRequest, apply_penalties, packed_mask, sample

pytestmark = pytest.mark.gpu

F32 = np.float32
PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=50),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=1.3, top_k=200, top_p=0.8, min_p=0.01),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1e-3),
    SamplingParams(temperature=50.0, top_p=0.5),
    SamplingParams(temperature=1.0, presence_penalty=1.5, frequency_penalty=0.7, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5),
]


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _rows(rng: np.random.Generator, n: int, v: int, kind: str) -> np.ndarray:
    if kind == "flat":
        return rng.standard_normal((n, v)).astype(F32)
    if kind == "peaked":  # a few strong tokens over a deep tail: few positive-mass candidates
        x = (rng.standard_normal((n, v)) * 3 - 20).astype(F32)
        for r in range(n):
            x[r, rng.integers(0, v, 5)] = rng.uniform(5, 12, 5).astype(F32)
        return x
    # ties everywhere (coarse grid), both zeros, a NaN and infinities sprinkled in
    x = np.round(rng.standard_normal((n, v)) * 2).astype(F32) / F32(2)
    x[:, 1::7] = np.where(x[:, 1::7] == 0, F32(-0.0), x[:, 1::7])
    x[:, rng.integers(0, v, 3)] = np.nan
    x[0, rng.integers(0, v, 2)] = -np.inf
    return x


def _requests(rng: np.random.Generator, n: int, v: int, masked: bool) -> list[SampleRequest]:
    reqs = []
    for i in range(n):
        p = PARAMS[int(rng.integers(0, len(PARAMS)))]
        counts = {int(t): int(c) for t, c in zip(rng.integers(0, v, 30), rng.integers(1, 5, 30), strict=True)}
        mask = None
        if masked and i % 2:
            bits = rng.random(v) < (0.002 if i % 4 == 1 else 0.5)
            bits[int(rng.integers(0, v))] = True
            mask = packed_mask(bits, v)
        reqs.append(SampleRequest(p, int(rng.integers(0, 2**63)), int(rng.integers(0, 2**20)), counts, mask))
    return reqs


def _cpu(x: np.ndarray, r: SampleRequest, limit: int | None) -> int:
    try:
        return sample(x, r.params, seed=r.seed, position=r.position, counts=r.counts, token_limit=limit,
                      mask=r.mask)  # fmt: skip
    except MaskError:
        return -1


@pytest.mark.parametrize("v", [1000, 32771, 248320])
@pytest.mark.parametrize("kind", ["flat", "peaked", "ties"])
def test_sample_requests_match_numpy(cp: Any, v: int, kind: str) -> None:
    from ninfer.cuda.sampling import sample_requests

    rng = np.random.default_rng([v, len(kind)])
    n = 24 if v > 100000 else 48
    for masked, limit in ((False, None), (True, v - 243)):
        x = _rows(rng, n, v, kind)
        reqs = _requests(rng, n, v, masked)
        dev = cp.asarray(x)
        got = sample_requests(dev, reqs, limit)
        assert np.array_equal(cp.asnumpy(dev), x, equal_nan=True), "the caller's logits must stay unchanged"
        want = [_cpu(x[i], r, limit) for i, r in enumerate(reqs)]
        bad = [(i, reqs[i].params, got[i], want[i]) for i in range(n) if got[i] != want[i]]
        assert not bad, f"{len(bad)} rows differ from the NumPy sampler, e.g. {bad[:3]}"


def test_seeds_positions_and_nothing_allowed(cp: Any) -> None:
    from ninfer.cuda.sampling import sample_rows

    rng = np.random.default_rng(7)
    v, n = 5000, 64
    x = rng.standard_normal((1, v)).astype(F32).repeat(n, 0)
    seeds = rng.integers(0, 2**63, n, dtype=np.uint64)
    pos = rng.integers(0, 2**30, n, dtype=np.uint64)
    mask = np.full((n, -(-v // 32)), -1, np.int32)
    mask[3] = 0  # nothing allowed: -1
    col = lambda a, dt: cp.asarray(np.asarray(a, dt))  # noqa: E731
    got = cp.asnumpy(sample_rows(cp.asarray(x), col([1.0] * n, np.float64), col([0] * n, np.int32),
                                 col([0.9] * n, np.float64), col([0.0] * n, np.float64), cp.asarray(seeds),
                                 cp.asarray(pos), cp.asarray(mask), v))  # fmt: skip
    assert got[3] == -1 and (np.delete(got, 3) >= 0).all()
    p = SamplingParams(temperature=1.0, top_p=0.9)
    want = [sample(x[0], p, seed=int(s), position=int(q), counts={}) for s, q in zip(seeds, pos, strict=True)]
    assert np.array_equal(np.delete(got, 3), np.delete(np.array(want), 3))
    assert len(set(got.tolist())) > 10, "different seeds draw different tokens"


@pytest.mark.parametrize("v", [777, 248320])
def test_greedy_and_penalties_bitwise(cp: Any, v: int) -> None:
    from ninfer.cuda.sampling import apply_penalties_rows, argmax_masked, sample_requests

    rng = np.random.default_rng(v)
    n = 16
    x = _rows(rng, n, v, "ties")
    x[np.isnan(x)] = 0.0
    reqs = []
    for i in range(n):
        p = SamplingParams(repetition_penalty=float(rng.uniform(0.5, 3)), frequency_penalty=float(rng.uniform(0, 2)),
                           presence_penalty=float(rng.uniform(-1, 1)))  # fmt: skip
        counts = {int(t): int(rng.integers(1, 9)) for t in rng.choice(v, 40, replace=False)}
        reqs.append(SampleRequest(p, 1, i, counts, None))
    ref = np.stack([apply_penalties(x[i], r.counts, r.params) for i, r in enumerate(reqs)])
    dev = cp.asarray(x)
    w = max(len(r.counts) for r in reqs)
    ids = np.full((n, w), -1, np.int32)
    cnt = np.zeros((n, w), np.int32)
    for i, r in enumerate(reqs):
        ids[i, : len(r.counts)], cnt[i, : len(r.counts)] = list(r.counts), list(r.counts.values())
    cols = [cp.asarray(np.array([getattr(r.params, f) for r in reqs], F32))
            for f in ("repetition_penalty", "frequency_penalty", "presence_penalty")]  # fmt: skip
    apply_penalties_rows(dev, cp.asarray(ids), cp.asarray(cnt), *cols)
    assert np.array_equal(cp.asnumpy(dev).view(np.uint32), ref.view(np.uint32)), "penalties must be bitwise"
    got = sample_requests(cp.asarray(x), reqs, None)
    want = [int(np.argmax(ref[i])) for i in range(n)]  # lowest id on ties (-0 == +0)
    assert got == want
    assert cp.asnumpy(argmax_masked(cp.asarray(ref))).tolist() == want


def test_sample_rows_checks_arguments(cp: Any) -> None:
    from ninfer.cuda.sampling import KernelError, sample_rows

    x = cp.zeros((2, 64), F32)
    f = cp.zeros(2, np.float64)
    k = cp.zeros(2, np.int32)
    u = cp.zeros(2, np.uint64)
    with pytest.raises(KernelError, match="logits"):
        sample_rows(x.astype(np.float64), f, k, f, f, u, u)
    with pytest.raises(KernelError, match="top_k"):
        sample_rows(x, f, f, f, f, u, u)
    with pytest.raises(KernelError, match="seeds"):
        sample_rows(x, f, k, f, f, u[:1], u)
    with pytest.raises(KernelError, match="mask"):
        sample_rows(x, f, k, f, f, u, u, cp.zeros((2, 3), np.int32))
