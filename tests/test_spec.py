"""MTP speculative decoding on the reference backend (docs/speculative.md).

Greedy output with drafts is token-for-token the output without them, on tiny converted checkpoints that carry
an MTP head (dense and MoE), at one and several lanes; with scripted drafts (the target's own tokens, wrong at a
chosen rate) the rounds accept 100/80/50% and the output is still the same, which exercises the rollback of KV,
GDN and MTP state at every acceptance length.
"""

from __future__ import annotations

import pytest
from engines import engine_over
from hf_tiny import save_tiny_hf
from ninfer.api.cli import check_artifact, config_from_args
from ninfer.api.config import ServerConfigError

from ninfer.cli import _parser
from ninfer.convert.hf import convert
from ninfer.engine import Engine, EngineConfig, EngineConfigError
from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script
from ninfer.model import load

PROMPTS = [[5, 9, 33, 100, 7, 12], [1, 2, 3], list(range(40, 75)), [200, 17]]
BASE = dict(max_context=256, kv_capacity=4096, page_size=16, prefill_chunk=16, checkpoint_stride=32)


@pytest.fixture(scope="module", params=["dense", "moe"])
def tiny(request, tmp_path_factory):  # noqa: ANN001, ANN201
    d = tmp_path_factory.mktemp(f"spec-{request.param}")
    save_tiny_hf(d / "hf", request.param, 5, mtp=True)
    convert(str(d / "hf"), str(d / "m.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    return load(str(d / "m.ninfer"))


def _engine(model, runner_wrap=None, **kw) -> Engine:  # noqa: ANN001
    return engine_over(model, EngineConfig(**{**BASE, **kw}), runner_wrap)


def _generate(eng: Engine, prompts: list[list[int]], **kw) -> list:  # noqa: ANN003
    with eng:
        hs = [eng.submit(p, **kw) for p in prompts]
        return [h.result(timeout=300) for h in hs]


_PLAIN: dict = {}


def _plain(model, lanes: int, max_tokens: int = 20):  # noqa: ANN001, ANN201
    """Greedy outputs without drafts (kept per model, lane count and length: the tests' oracle)."""
    key = (id(model), lanes, max_tokens)
    if key not in _PLAIN:
        eng = _engine(model, max_concurrency=lanes)
        _PLAIN[key] = _generate(eng, PROMPTS, max_tokens=max_tokens, ignore_eos=True)
    return _PLAIN[key]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_spec_equals_plain(tiny, k: int) -> None:
    for lanes in (1, 4):
        plain = _plain(tiny, lanes)
        spec = _generate(_engine(tiny, max_concurrency=lanes, spec="mtp", draft_tokens=k), PROMPTS,
                         max_tokens=20, ignore_eos=True)  # fmt: skip
        for a, b in zip(plain, spec, strict=True):
            assert b.token_ids == a.token_ids
            u = b.usage.speculative
            assert u is not None and u.rounds > 0 and 0 <= u.accepted <= u.drafted <= k * u.rounds
            assert a.usage.speculative is None


@pytest.mark.parametrize("pct", [100, 80, 50, 0])
def test_forced_acceptance_keeps_tokens(tiny, pct: int) -> None:
    plain = _plain(tiny, 4, max_tokens=30)
    refs = {tuple(p): p + r.token_ids for p, r in zip(PROMPTS, plain, strict=True)}
    wrap = lambda r: ScriptedDrafts(r, replay_script(refs, pct, tiny.config.vocab_size))  # noqa: E731
    for k in (1, 3, 5):
        out = _generate(_engine(tiny, wrap, max_concurrency=4, spec="mtp", draft_tokens=k), PROMPTS,
                        max_tokens=30, ignore_eos=True)  # fmt: skip
        for a, b in zip(plain, out, strict=True):
            assert b.token_ids == a.token_ids
            u = b.usage.speculative
            assert u.drafted > 0
            if pct == 100:
                assert u.accepted == u.drafted and u.rounds <= -(-29 // (k + 1)) + 1
            elif pct == 0:
                assert u.accepted == 0
            else:
                assert 0 < u.accepted < u.drafted


def test_forced_acceptance_with_prefix_reuse_and_stops(tiny) -> None:
    """A second turn resumes from the first's checkpoints; stop tokens end a request inside a round."""
    first = _plain(tiny, 2, max_tokens=24)
    turn2 = [p + r.token_ids + [3, 4, 5] for p, r in zip(PROMPTS, first, strict=True)]
    stops = {"stop_token_ids": (first[0].token_ids[9], first[2].token_ids[4])}
    plain_eng = _engine(tiny, max_concurrency=2)
    with plain_eng:
        want = [plain_eng.submit(p, max_tokens=24, **stops).result(timeout=300) for p in PROMPTS + turn2]
    refs = {tuple(p): p + r.token_ids for p, r in zip(PROMPTS + turn2, want, strict=True)}
    wrap = lambda r: ScriptedDrafts(r, replay_script(refs, 80, tiny.config.vocab_size))  # noqa: E731
    eng = _engine(tiny, wrap, max_concurrency=2, spec="mtp", draft_tokens=4)
    with eng:
        got = [eng.submit(p, max_tokens=24, **stops).result(timeout=300) for p in PROMPTS + turn2]
    for a, b in zip(want, got, strict=True):
        assert (b.token_ids, b.finish_reason) == (a.token_ids, a.finish_reason)
    assert any(r.usage.cached_tokens > 0 for r in got[len(PROMPTS) :])
    assert {r.finish_reason for r in got} >= {"stop_token"}


def test_seeded_sampling_is_reproducible(tiny) -> None:
    kw = dict(max_tokens=16, ignore_eos=True, temperature=0.9, top_k=40, top_p=0.95, seed=1234,
              presence_penalty=0.3, repetition_penalty=1.1)  # fmt: skip
    runs = [_generate(_engine(tiny, max_concurrency=lanes, spec="mtp", draft_tokens=3), PROMPTS, **kw)
            for lanes in (1, 4, 4)]  # fmt: skip
    for r in runs[1:]:
        assert [x.token_ids for x in r] == [x.token_ids for x in runs[0]]


def test_config_and_weights_checks(tiny, tmp_path) -> None:
    with pytest.raises(EngineConfigError, match="draft_tokens"):
        EngineConfig(spec="mtp", draft_tokens=6)
    with pytest.raises(EngineConfigError, match="draft_tokens"):
        EngineConfig(draft_tokens=2)
    with pytest.raises(EngineConfigError, match="spec"):
        EngineConfig(spec="dflash")
    assert EngineConfig(spec="mtp").num_draft == 3 and EngineConfig().num_draft == 0
    save_tiny_hf(tmp_path / "hf", "dense", 1)
    convert(
        str(tmp_path / "hf"),
        str(tmp_path / "m.ninfer"),
        "bf16",
        allow_unregistered_shape=True,
        progress=False,
    )
    plain = load(str(tmp_path / "m.ninfer"))
    with pytest.raises(EngineConfigError, match="MTP weights"):
        plain.runner(EngineConfig(spec="mtp", draft_tokens=2))
    # `ninfer serve`: the flags reach EngineConfig; bad values and an artifact without MTP weights are refused
    a = _parser().parse_args(["serve", str(tmp_path / "m.ninfer"), "--spec", "mtp", "--draft-tokens", "4"])
    cfg = config_from_args(a)
    assert (cfg.engine.spec, cfg.engine.num_draft) == ("mtp", 4)
    with pytest.raises(ServerConfigError, match="MTP weights"):
        check_artifact(cfg)
    for argv, flag in (
        (["--draft-tokens", "2"], "--draft-tokens"),
        (["--spec", "mtp", "--draft-tokens", "9"], "--draft-tokens"),
    ):
        with pytest.raises(ServerConfigError, match=flag):
            config_from_args(_parser().parse_args(["serve", "x.ninfer", *argv]))
