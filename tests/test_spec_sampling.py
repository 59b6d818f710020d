"""Speculative sampling is the target's distribution (docs/speculative.md): chi-square tests on the verifier
alone (random target and draft rows) and on the engine (a tiny converted checkpoint with its MTP head); and the
demo model's chat paths (JSON schema, thinking with a budget, stop strings, a multi-turn session with prefix
reuse) give the same greedy tokens with and without drafts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from engines import engine_over
from hf_tiny import save_tiny_hf

from ninfer.convert.hf import convert
from ninfer.demo import build_demo
from ninfer.engine import Engine, EngineConfig, SamplingParams
from ninfer.engine.core import SampleRequest
from ninfer.engine.sampler import distribution, sample
from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script
from ninfer.engine.spec_verify import draft_request, verify_lane
from ninfer.frontend.grammar import GrammarCompiler, RequestGrammar
from ninfer.frontend.prompt import TurnMarker
from ninfer.model import load

CHI2_999 = {2: 13.82, 3: 16.27, 5: 20.52, 8: 26.12, 11: 31.26, 15: 37.70}  # chi-square 0.999 quantiles


def _chi2(observed: Counter, expected: dict[int, float], n: int) -> tuple[float, int]:
    cells = [t for t, p in expected.items() if p * n >= 5]
    rest = 1.0 - sum(expected[t] for t in cells)
    stat = sum((observed[t] - expected[t] * n) ** 2 / (expected[t] * n) for t in cells)
    other = n - sum(observed[t] for t in cells)
    if rest * n >= 5:
        stat += (other - rest * n) ** 2 / (rest * n)
        return stat, len(cells)
    assert other <= max(3, 0.01 * n), "tokens outside the target's support"
    return stat, len(cells) - 1


def _probs(row: np.ndarray, r: SampleRequest) -> dict[int, float]:
    ids, q = distribution(row, r.params, counts=r.counts, mask=r.mask)
    return {int(t): float(m) / float(q.sum()) for t, m in zip(ids, q, strict=True)}


@pytest.mark.parametrize("same", [False, True])
def test_verifier_emits_the_target_distribution(same: bool) -> None:
    rng = np.random.default_rng(7)
    vocab, k, n = 24, 2, 2500
    target = (rng.standard_normal((k + 1, vocab)) * 1.5).astype(np.float32)
    draft = target[:k].copy() if same else (rng.standard_normal((k, vocab)) * 1.5).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=12, top_p=0.97, presence_penalty=0.5)
    first = Counter()
    accepted = 0
    for seed in range(n):
        reqs = [SampleRequest(params, seed, 10 + i, {3: 1}, None) for i in range(k + 1)]
        drafts = []
        for i in range(k):  # each draft from the draft row with the request's draft stream
            d = draft_request(reqs[i])
            drafts.append(
                sample(draft[i], params, seed=d.seed, position=d.position, counts=d.counts, mask=None)
            )
        out = verify_lane(target, draft, drafts, reqs, None)
        first[out[0]] += 1
        accepted += out[0] == drafts[0]
    stat, df = _chi2(first, _probs(target[0], reqs[0]), n)
    assert stat < CHI2_999.get(df, 2.0 * df + 10), (stat, df)
    if same:
        assert accepted == n  # p == q: every draft is accepted
    else:
        assert 0 < accepted < n


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # noqa: ANN201
    d = tmp_path_factory.mktemp("spec-chi2")
    save_tiny_hf(d / "hf", "dense", 9, mtp=True)
    convert(str(d / "hf"), str(d / "m.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    return load(str(d / "m.ninfer"))


def test_engine_spec_sampling_matches_target(tiny) -> None:
    """Joint distribution of the first two generated tokens (the second comes from a verify round)."""
    prompt, n = [11, 42, 7, 99, 3], 400
    params = dict(temperature=1.0, top_k=3)
    sp = SamplingParams(**params)
    logits = tiny.logits(prompt)[-1]
    p1 = _probs(logits, SampleRequest(sp, 0, 0, {}, None))
    expected = {}
    for a, pa in p1.items():
        row = tiny.logits(prompt + [a])[-1]
        for b, pb in _probs(row, SampleRequest(sp, 0, 0, {a: 1}, None)).items():
            expected[a * 1000 + b] = pa * pb
    seen = Counter()
    with Engine.from_model(tiny, max_concurrency=4, max_context=64, kv_capacity=1024, spec="mtp",
                           draft_tokens=2, prefix_reuse=False, queue_depth=n) as eng:  # fmt: skip
        hs = [eng.submit(prompt, max_tokens=3, ignore_eos=True, seed=s, **params) for s in range(n)]
        outs = [h.result(timeout=300) for h in hs]
    for c in outs:
        seen[c.token_ids[0] * 1000 + c.token_ids[1]] += 1
    assert sum(c.usage.speculative.rounds for c in outs) >= n
    stat, df = _chi2(seen, expected, n)
    assert stat < CHI2_999.get(df, 2.0 * df + 10), (stat, df, seen, expected)


# ---- the demo model's chat paths ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory):  # noqa: ANN201
    return load(build_demo(tmp_path_factory.mktemp("spec-demo") / "demo.ninfer"))


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["name", "n"]}  # fmt: skip


def _hook(demo, schema: dict | None, thinking: bool, budget: int | None):  # noqa: ANN001, ANN201
    tok = demo.tokenizer
    compiled = None
    if schema is not None:
        compiled = GrammarCompiler(tok.hf, demo.config.vocab_size, tok.eos_token_ids).json_schema(schema)
    return RequestGrammar(compiled, vocab_size=demo.config.vocab_size, thinking=thinking,
                          think_end_id=tok.hf.token_to_id("</think>"),
                          after_think_ids=tuple(tok.encode("\n\n", add_special_tokens=False)), budget=budget)  # fmt: skip


def _chat(demo, eng: Engine, msgs: list[dict], thinking: bool, log: list, **kw):  # noqa: ANN001, ANN003, ANN201
    ids = demo.chat_template.render_ids(msgs, add_generation_prompt=True, enable_thinking=thinking)
    c = eng.submit(ids, **kw).result(timeout=300)
    log.append((ids, c))
    return c


def _session(demo, eng: Engine, thinking: bool) -> list:  # noqa: ANN001
    """Three turns, each answered free and under a JSON schema, then a request cut by a stop string."""
    end = demo.tokenizer.hf.token_to_id("</think>")
    log: list = []
    with eng:
        msgs = [{"role": "user", "content": "Name a thing and a number."}]
        for turn in range(3):
            for schema in (None, SCHEMA):
                hook = _hook(demo, schema, thinking, budget=8 if thinking else None)
                c = _chat(demo, eng, msgs, thinking, log, max_tokens=40, token_mask=hook,
                          stop_after_token_id=end if thinking else None)  # fmt: skip
            msgs += [{"role": "assistant", "content": c.text}, {"role": "user", "content": f"More {turn}?"}]
        ans = log[0][1].text.split("</think>")[-1]
        _chat(demo, eng, msgs[:1], thinking, log, max_tokens=40, stop=ans[len(ans) // 2 :][:3] or None,
              token_mask=_hook(demo, None, thinking, budget=8 if thinking else None),
              stop_after_token_id=end if thinking else None)  # fmt: skip
    return log


def _key(log: list) -> list:
    return [(c.token_ids, c.finish_reason, c.text, c.usage.cached_tokens > 0) for _, c in log]


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_paths_same_tokens(demo, thinking: bool) -> None:
    kw = dict(max_concurrency=2, max_context=1024, kv_capacity=8192, page_size=16, checkpoint_stride=64)
    plain = _session(demo, Engine.from_model(demo, **kw), thinking)
    spec = _session(demo, Engine.from_model(demo, spec="mtp", draft_tokens=3, **kw), thinking)
    assert _key(spec) == _key(plain)
    refs = {tuple(ids): ids + c.token_ids for ids, c in plain}
    cfg = EngineConfig(spec="mtp", draft_tokens=4, **kw)
    script = replay_script(refs, 80, demo.config.vocab_size)
    eng = engine_over(
        demo, cfg, lambda r: ScriptedDrafts(r, script), turns=TurnMarker.from_tokenizer(demo.tokenizer)
    )
    forced = _session(demo, eng, thinking)
    assert _key(forced) == _key(plain)
    assert (
        sum(c.usage.speculative.accepted for _, c in forced) > sum(len(c.token_ids) for _, c in forced) // 3
    )
    assert any(k[3] for k in _key(spec))  # later turns resumed from the prefix cache
    assert plain[-1][1].finish_reason == "stop_string"
    answer = plain[1][1].text.split("</think>")[-1].lstrip()
    assert answer.startswith("{")  # the schema constrained the answer (the output budget may cut it short)
