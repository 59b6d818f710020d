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
    for kw in ({"chunk": 0}, {"chunk": 4096}, {"bins": 0}, {"bins": 4096}, {"cap": 0}, {"cap": 4096}):
        with pytest.raises(KernelError, match=next(iter(kw))):
            sample_rows(x, f, k, f, f, u, u, **kw)
    with pytest.raises(KernelError, match="out"):
        sample_rows(x, f, k, f, f, u, u, out=cp.zeros(3, np.int32))


# ---- sampled rows: sample_rows' split path against the one-block kernel and NumPy ----------------------------
SPLIT_COMBOS = [(t, k, tp, mp) for t in (0.3, 0.6, 1.0, 1.5) for k in (0, 1, 20, 50, 1024, 5000)
                for tp in (1.0, 0.95, 0.5, 1e-9) for mp in (0.0, 0.05)]  # fmt: skip


def _split_case(rng: np.random.Generator, n: int, v: int, kind: str, first: int) -> tuple:
    """Rows of a kind and params: SPLIT_COMBOS from ``first`` on (cyclically), the last row greedy."""
    x = _rows(rng, n, v, kind)
    combos = [SPLIT_COMBOS[(first + i) % len(SPLIT_COMBOS)] for i in range(n)]
    params = [SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp) for t, k, tp, mp in combos]
    params[-1] = SamplingParams(temperature=0.0, top_k=20)
    seeds = rng.integers(0, 2**63, n, dtype=np.uint64)
    pos = rng.integers(0, 2**30, n, dtype=np.uint64)
    return x, params, seeds, pos


def _sample_rows(cp: Any, x: Any, params: list, seeds: np.ndarray, pos: np.ndarray, **kw: Any) -> list[int]:
    from ninfer.cuda.sampling import sample_rows

    col = lambda a, dt: cp.asarray(np.asarray(a, dt))  # noqa: E731
    got = sample_rows(x, col([p.temperature for p in params], np.float64), col([p.top_k for p in params], np.int32),
                      col([p.top_p for p in params], np.float64), col([p.min_p for p in params], np.float64),
                      cp.asarray(seeds), cp.asarray(pos), **kw)  # fmt: skip
    return cp.asnumpy(got).tolist()


@pytest.mark.parametrize("kind", ["flat", "peaked", "ties"])
def test_split_matches_numpy_and_the_one_block_kernel(cp: Any, kind: str) -> None:
    """Every SPLIT_COMBOS parameter set on 248K-id rows of each kind: the split path (default sizes, and coarse
    bins with a small sort cap: several gather rounds and the radix fallback) gives the NumPy sampler's token and
    the one-block kernel's, twice on the same workspaces, in batches of 1, 4, 8 and 32 rows."""
    rng = np.random.default_rng([len(kind), 3])
    v, first = 248320, 0
    for n in (1, 4, 8, 32, 32, 32, 32, 32, 32):
        x, params, seeds, pos = _split_case(rng, n, v, kind, first)
        first += n - 1
        want = [
            sample(x[i], p, seed=int(seeds[i]), position=int(pos[i]), counts={}) for i, p in enumerate(params)
        ]
        dev = cp.asarray(x)
        for kw in ({}, {}, {"bins": 16, "cap": 64, "chunk": 1000}, {"split": False}):
            got = _sample_rows(cp, dev, params, seeds, pos, **kw)
            bad = [(i, params[i], got[i], want[i]) for i in range(n) if got[i] != want[i]]
            assert not bad, f"{kw}: {len(bad)} of {n} rows differ from the NumPy sampler, e.g. {bad[:3]}"
    assert first >= len(SPLIT_COMBOS), "every parameter set ran"


def test_split_masks_limits_and_batch_invariance(cp: Any) -> None:
    """Masks (one allowing nothing), a token limit, penalized rows through sample_requests, and each row alone
    gives its token in the batch."""
    from ninfer.cuda.sampling import sample_requests

    rng = np.random.default_rng(21)
    v, n = 248320, 8
    x = _rows(rng, n, v, "peaked")
    x[1::2] = _rows(rng, n // 2, v, "flat")
    reqs = _requests(rng, n, v, masked=True)
    reqs[3] = SampleRequest(SamplingParams(temperature=0.6, top_k=20, top_p=0.95), 9, 9, {},
                            packed_mask(np.zeros(v, bool), v))  # fmt: skip
    limit = v - 1000
    want = [_cpu(x[i], r, limit) for i, r in enumerate(reqs)]
    assert want[3] == -1
    assert sample_requests(cp.asarray(x), reqs, limit) == want
    for i in range(n):
        alone = sample_requests(cp.asarray(x[i : i + 1]), reqs[i : i + 1], limit)
        assert alone == want[i : i + 1], f"row {i}"


def test_split_graph_replay(cp: Any) -> None:
    """sample_rows' split path captured in a CUDA graph (fixed output) and replayed on new logits and seeds."""
    from ninfer.cuda.sampling import sample_rows

    rng = np.random.default_rng(12)
    n, v = 8, 248320
    x, params, seeds, pos = _split_case(rng, n, v, "flat", 40)
    col = lambda a, dt: cp.asarray(np.asarray(a, dt))  # noqa: E731
    cols = [col([p.temperature for p in params], np.float64), col([p.top_k for p in params], np.int32),
            col([p.top_p for p in params], np.float64), col([p.min_p for p in params], np.float64)]  # fmt: skip
    dev, sd, ps = cp.asarray(x), cp.asarray(seeds), cp.asarray(pos)
    out = cp.full((n,), -2, np.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        # warm-up outside the capture: compiles, sizes the workspaces
        sample_rows(dev, *cols, sd, ps, out=out)
        stream.synchronize()
        stream.begin_capture()
        sample_rows(dev, *cols, sd, ps, out=out)
        graph = stream.end_capture()
        for kind in ("peaked", "flat", "ties"):
            x2 = _rows(rng, n, v, kind)
            s2, p2 = rng.integers(0, 2**63, n, dtype=np.uint64), rng.integers(0, 2**30, n, dtype=np.uint64)
            dev.set(x2), sd.set(s2), ps.set(p2)
            out.fill(-2)
            graph.launch(stream)
            stream.synchronize()
            want = [
                sample(x2[i], p, seed=int(s2[i]), position=int(p2[i]), counts={})
                for i, p in enumerate(params)
            ]
            assert cp.asnumpy(out).tolist() == want, f"graph replay on {kind} rows"


# ---- greedy rows: argmax_rows (the split-vocabulary argmax) --------------------------------------------------
def _greedy_case(rng: np.random.Generator, n: int, v: int) -> tuple[np.ndarray, list[SampleRequest]]:
    """Rows with ties, -0/+0, NaN and infinities (tests/test_argmax_split_host.py's), greedy requests with
    ignored sampling knobs, penalties on some rows and masks on odd rows (row 3: nothing allowed)."""
    from test_argmax_split_host import greedy_requests, greedy_rows

    x = greedy_rows(rng, n, v)
    reqs = [SampleRequest(p, int(rng.integers(0, 2**63)), int(rng.integers(0, 2**20)), c, m)
            for p, c, m in greedy_requests(rng, n, v, masked=True)]  # fmt: skip
    return x, reqs


def _first_max(r: np.ndarray) -> int:
    """NumPy's greedy pick of one row: the lowest id holding the largest non-NaN value (-0 == +0)."""
    with np.errstate(invalid="ignore"):
        return int(np.flatnonzero(r == np.nanmax(r))[0])


@pytest.mark.parametrize("v", [777, 5000, 248320])
@pytest.mark.parametrize("n", [1, 8])
def test_argmax_rows_matches_the_sampler(cp: Any, v: int, n: int) -> None:
    """argmax_rows against the NumPy sampler at temperature 0 and against sample_rows' greedy pick, bitwise, for
    several chunk sizes, twice on the same workspaces (the arrival counters reset themselves)."""
    from ninfer.cuda.sampling import argmax_rows, sample_requests, sample_rows

    rng = np.random.default_rng([v, n])
    x, reqs = _greedy_case(rng, n, v)
    for limit in (None, v - 37):
        want = [_cpu(x[i], r, limit) for i, r in enumerate(reqs)]
        dev = cp.asarray(x)
        got = sample_requests(dev, reqs, limit)  # the engine's path: penalties, masks, then argmax_rows
        assert got == want, f"sample_requests: got {got}, want {want}"
        assert np.array_equal(cp.asnumpy(dev), x, equal_nan=True), "the caller's logits must stay unchanged"
        pen = np.stack([apply_penalties(x[i], r.counts, r.params) for i, r in enumerate(reqs)])
        words = np.stack([r.mask if r.mask is not None else np.full(-(-v // 32), -1, np.int32) for r in reqs])
        pd, md = cp.asarray(pen), cp.asarray(words)
        col = lambda a, dt: cp.asarray(np.asarray(a, dt))  # noqa: E731
        general = cp.asnumpy(sample_rows(pd, col([0.0] * n, np.float64), col([3] * n, np.int32),
                                         col([0.5] * n, np.float64), col([0.1] * n, np.float64),
                                         col([1] * n, np.uint64), col([2] * n, np.uint64), md, limit))  # fmt: skip
        assert general.tolist() == want, "sample_rows' greedy pick"
        for chunk in (2048, 256, 100003):
            for _ in range(2):
                assert cp.asnumpy(argmax_rows(pd, md, limit, chunk=chunk)).tolist() == want, f"chunk {chunk}"
        plain = [_first_max(r) for r in pen]
        assert cp.asnumpy(argmax_rows(pd)).tolist() == plain, "no mask, no limit: NumPy's argmax"


def test_argmax_rows_graph_and_strided_rows(cp: Any) -> None:
    """Captured in a CUDA graph and replayed on new logits; rows of a wider array (a row stride) and a slice."""
    from ninfer.cuda.sampling import argmax_rows

    rng = np.random.default_rng(11)
    n, v = 8, 248320
    x, _ = _greedy_case(rng, n, v)
    dev = cp.asarray(x)
    out = cp.full((n,), -2, np.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        argmax_rows(dev, out=out)  # warm-up outside the capture: compiles, sizes the workspaces
        stream.synchronize()
        stream.begin_capture()
        argmax_rows(dev, out=out)
        graph = stream.end_capture()
        for _ in range(3):
            x2, _ = _greedy_case(rng, n, v)
            dev.set(x2)
            out.fill(-2)
            graph.launch(stream)
            stream.synchronize()
            want = [_first_max(r) for r in x2]
            assert cp.asnumpy(out).tolist() == want, "graph replay"
    wide = cp.asarray(np.pad(x, ((0, 0), (0, 64)), constant_values=np.float32(1e30)))[:, :v]
    want = [_first_max(r) for r in x]
    assert cp.asnumpy(argmax_rows(wide)).tolist() == want, "row stride"
    assert cp.asnumpy(argmax_rows(cp.asarray(x)[3:5])).tolist() == want[3:5], "a slice of rows"


def test_argmax_rows_checks_arguments(cp: Any) -> None:
    from ninfer.cuda.sampling import KernelError, argmax_rows

    x = cp.zeros((2, 64), F32)
    with pytest.raises(KernelError, match="logits"):
        argmax_rows(x.astype(np.float64))
    with pytest.raises(KernelError, match="mask"):
        argmax_rows(x, cp.zeros((2, 3), np.int32))
    with pytest.raises(KernelError, match="chunk"):
        argmax_rows(x, chunk=0)
    with pytest.raises(KernelError, match="out"):
        argmax_rows(x, out=cp.zeros(3, np.int32))
