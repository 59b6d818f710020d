"""Drafting a round at once (``draft_chain``, docs/speculative.md "Drafting and verification on CUDA") on the
reference backend: a runner offering ``draft_chain`` by its definition (``speculative.chain_by_steps``) gives the
same tokens, the same drafts (usage) and the same seeded samples as the step-by-step loop; requests whose drafts
depend on earlier drafts (penalties) keep the loop; stop tokens inside a chained round drop the drafts after them.
Plus the packed sampling columns of the device sampler (one upload per call)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engines import engine_over
from hf_tiny import save_tiny_hf

from ninfer.convert.hf import convert
from ninfer.engine import EngineConfig
from ninfer.engine.core import DraftLane, SampleRequest, SamplingParams
from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script
from ninfer.engine.speculative import chain_by_steps
from ninfer.model import load

PROMPTS = [[5, 9, 33, 100, 7, 12], [1, 2, 3], list(range(40, 75)), [200, 17]]
BASE = dict(max_context=256, kv_capacity=4096, page_size=16, prefill_chunk=16, checkpoint_stride=32)


class Chained:
    """The wrapped runner plus ``draft_chain`` by its definition; counts the chained rounds."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.chains = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def draft_chain(
        self, lanes: Any, reqs: Any, token_limit: int | None, forced: Any = None
    ) -> list[list[int]]:
        self.chains += 1
        if forced is None:
            return chain_by_steps(self.inner, lanes, reqs, token_limit)
        for s in range(len(reqs[0])):  # the forced tokens are fed; the head and the sampler still run
            self.inner.draft(
                [DraftLane(dl.lane, [*dl.tokens, *f[:s]]) for dl, f in zip(lanes, forced, strict=True)]
            )
            self.inner.sample(range(len(lanes)), [r[s] for r in reqs], token_limit)
        return [list(f) for f in forced]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # noqa: ANN001, ANN201
    d = tmp_path_factory.mktemp("spec-chain")
    save_tiny_hf(d / "hf", "dense", 5, mtp=True)
    convert(str(d / "hf"), str(d / "m.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    return load(str(d / "m.ninfer"))


def _run(
    model: Any, chained: bool, lanes: int, k: int, script: Any = None, **kw: Any
) -> tuple[list[Any], int]:
    seen: list[Chained] = []

    def wrap(r: Any) -> Any:
        seen.append(Chained(r))
        return seen[-1] if script is None else ScriptedDrafts(seen[-1], script)

    cfg = EngineConfig(**BASE, max_concurrency=lanes, spec="mtp", draft_tokens=k)
    with engine_over(model, cfg, wrap if chained else None) as eng:
        hs = [eng.submit(p, **kw) for p in PROMPTS]
        out = [h.result(timeout=300) for h in hs]
    return out, seen[0].chains if seen else 0


def _key(res: list[Any]) -> list[Any]:
    return [(r.token_ids, r.finish_reason, r.usage.speculative) for r in res]


@pytest.mark.parametrize(("lanes", "k"), [(1, 3), (4, 5)])
def test_chained_drafting_equals_steps_greedy(tiny: Any, lanes: int, k: int) -> None:
    kw = dict(max_tokens=20, ignore_eos=True)
    steps, _ = _run(tiny, False, lanes, k, **kw)
    chained, n = _run(tiny, True, lanes, k, **kw)
    assert n > 0
    assert _key(chained) == _key(steps)


def test_chained_drafting_equals_steps_sampled_and_stops(tiny: Any) -> None:
    """Seeded sampling (the draft stream's positions), and stop tokens that end requests inside a round."""
    kw = dict(max_tokens=24, ignore_eos=True, temperature=0.9, top_k=40, top_p=0.95, seed=77)
    steps, _ = _run(tiny, False, 4, 4, **kw)
    chained, n = _run(tiny, True, 4, 4, **kw)
    assert n > 0 and _key(chained) == _key(steps)
    stops = {"stop_token_ids": (steps[0].token_ids[9], steps[2].token_ids[4])}
    steps, _ = _run(tiny, False, 4, 4, **kw, **stops)
    chained, n = _run(tiny, True, 4, 4, **kw, **stops)
    assert n > 0 and _key(chained) == _key(steps)
    assert "stop_token" in {r.finish_reason for r in chained}


@pytest.mark.parametrize("pct", [100, 80])
def test_scripted_drafts_forced_through_the_chain(tiny: Any, pct: int) -> None:
    """``ScriptedDrafts`` over a runner with ``draft_chain`` hands it the round's scripted tokens (``forced``)."""
    kw = dict(max_tokens=24, ignore_eos=True)
    cfg = EngineConfig(**BASE, max_concurrency=4)
    with engine_over(tiny, cfg) as eng:
        plain = [h.result(timeout=300) for h in [eng.submit(p, **kw) for p in PROMPTS]]
    refs = {tuple(p): p + r.token_ids for p, r in zip(PROMPTS, plain, strict=True)}
    got, n = _run(tiny, True, 4, 3, replay_script(refs, pct, tiny.config.vocab_size), **kw)
    assert n > 0 and [r.token_ids for r in got] == [r.token_ids for r in plain]
    u = [r.usage.speculative for r in got]
    assert all(x.drafted > 0 for x in u)
    assert (
        all(x.accepted == x.drafted for x in u)
        if pct == 100
        else 0 < sum(x.accepted for x in u) < sum(x.drafted for x in u)
    )


def test_penalties_keep_the_step_loop(tiny: Any) -> None:
    kw = dict(max_tokens=12, ignore_eos=True, temperature=0.9, seed=5, presence_penalty=0.4)
    steps, _ = _run(tiny, False, 2, 3, **kw)
    chained, n = _run(tiny, True, 2, 3, **kw)
    assert n == 0 and _key(chained) == _key(steps)


def test_packed_sampling_columns() -> None:
    from ninfer.cuda.sampling import pack_columns

    reqs = [
        SampleRequest(
            SamplingParams(temperature=0.7, top_k=2**40, top_p=0.9, min_p=0.1), 2**64 - 5, 77, {}, None
        ),
        SampleRequest(SamplingParams(), -3, 5, {}, None),
        SampleRequest(SamplingParams(top_k=7), 1, 2**40, {}, None),
    ]
    host, layout = pack_columns(reqs)
    want = {
        "temperature": np.array([0.7, 0.0, 0.0]),
        "top_p": np.array([0.9, 1.0, 1.0]),
        "min_p": np.array([0.1, 0.0, 0.0]),
        "seeds": np.array([2**64 - 5, 2**64 - 3, 1], np.uint64),
        "positions": np.array([77, 5, 2**40], np.uint64),
        "top_k": np.array([2**31 - 1, 0, 7], np.int32),
    }
    assert set(layout) == set(want)
    for name, (off, size, dt) in layout.items():
        assert off % np.dtype(dt).itemsize == 0 and size == 3 * np.dtype(dt).itemsize
        got = host[off : off + size].view(dt)
        assert got.dtype == np.dtype(dt) and np.array_equal(got, want[name].astype(dt)), name
