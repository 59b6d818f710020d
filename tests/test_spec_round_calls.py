"""The runner calls of a speculative round (docs/speculative.md "Cost of a round"), counted on the CPU.

A greedy round without masks or penalties is one ``draft_chain`` (one host synchronization on CUDA), one
``execute`` (a verify-only step: left running on CUDA), one ``verify`` (its sampling: one synchronization) and one
``commit`` per lane; forced acceptance below 100% (``replay_script``) keeps every round on the chain. Plus a smoke
run of ``perf/bench_spec.bench_forced`` over the reference backend (its phases, counts and columns)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hf_tiny import save_tiny_hf

from ninfer.convert.hf import convert
from ninfer.engine import Engine, EngineConfig
from ninfer.engine.core import DraftLane
from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script
from ninfer.model import load

VOCAB = 1000
PROMPT = list(range(1, 65))


def _target(pos: int) -> int:
    return (pos * 7919) % VOCAB


class Counting:
    """The runner contract without a model: the target's greedy token at position p is ``_target(p)``; every call
    is counted."""

    snapshot_bytes = page_bytes = 1
    host_pages = 0
    vocab_size = VOCAB

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def execute(self, batch: Any) -> None:
        self.calls["execute"] += 1

    def sample(self, rows: Any, reqs: Any, token_limit: Any) -> list[int]:
        self.calls["sample"] += 1
        return [_target(r.position) for r in reqs]

    def draft(self, lanes: Any) -> None:
        self.calls["draft"] += 1

    def draft_chain(self, lanes: Any, reqs: Any, token_limit: Any, forced: Any = None) -> list[list[int]]:
        self.calls["draft_chain"] += 1
        return [list(f) for f in forced] if forced is not None else [[0] * len(r) for r in reqs]

    def verify(self, lanes: Any, drafts: Any, reqs: Any, token_limit: Any) -> list[list[int]]:
        self.calls["verify"] += 1
        out = []
        for d, r in zip(drafts, reqs, strict=True):
            got = []
            for j, q in enumerate(r):
                got.append(_target(q.position))
                if j == len(d) or got[-1] != d[j]:
                    break
            out.append(got)
        return out

    def commit(self, lane: int, length: int) -> None:
        self.calls["commit"] += 1

    def copies_done(self, wait: bool) -> list[tuple[int, float]]:
        return []


def _cfg(k: int, tokens: int) -> EngineConfig:
    spec = dict(spec="mtp", draft_tokens=k) if k else {}
    return EngineConfig(max_concurrency=1, max_context=64 + tokens + 256, kv_capacity=64 + tokens + 288,
                        prefix_reuse=False, prefill_chunk=1024, **spec)  # fmt: skip


def _generate(runner: Any, k: int, tokens: int) -> Any:
    from ninfer.artifact.registry import MODELS

    mc = MODELS["qwen3.6-27b"].config
    with Engine(runner, mc, None, _cfg(k, tokens), token_limit=VOCAB, background=False) as eng:
        return eng.submit(PROMPT, max_tokens=tokens, ignore_eos=True).result()


@pytest.mark.parametrize("pct", [100, 80, 50])
def test_forced_round_is_one_chain_one_execute_one_verify(pct: int) -> None:
    tokens = 64
    plain = Counting()
    base = _generate(plain, 0, tokens)
    assert base.token_ids == [_target(64 + i) for i in range(tokens)]
    assert plain.calls == {"execute": tokens, "sample": tokens}
    inner = Counting()
    got = _generate(ScriptedDrafts(inner, replay_script({tuple(PROMPT): PROMPT + base.token_ids}, pct, VOCAB)), 3,
                    tokens)  # fmt: skip
    assert got.token_ids == base.token_ids
    u = got.usage.speculative
    assert (u.accepted == u.drafted) if pct == 100 else (0 < u.accepted < u.drafted)
    # the prefill step (execute + sample), per round one draft_chain, execute, verify and commit (no step loop),
    # and a plain decode step where one token of budget is left (no room for a draft)
    plain_steps = inner.calls["sample"] - 1
    assert plain_steps <= 1
    assert inner.calls == {"execute": 1 + u.rounds + plain_steps, "sample": 1 + plain_steps,
                           "draft_chain": u.rounds, "verify": u.rounds, "commit": u.rounds}  # fmt: skip


def test_replay_script_follows_its_own_misses() -> None:
    ref = [*PROMPT, *(_target(64 + i) for i in range(20))]
    script = replay_script({tuple(PROMPT): ref}, 50, VOCAB)
    wrong = [p for p in range(64, 84) if (p * 37) % 100 >= 50]
    toks = list(ref[: wrong[0]])
    for pos in range(wrong[0], wrong[0] + 4):  # past its first miss the script keeps drafting
        t = script(toks)
        assert t == ((ref[pos] + 1) % VOCAB if pos in wrong else ref[pos])
        toks.append(t)
    assert script([*ref[:70], (ref[70] + 7) % VOCAB]) is None  # left the reference otherwise: the head's
    assert script(list(ref)) is None  # past the reference


# ---- perf/bench_spec.bench_forced over the reference backend --------------------------------------------------
class _Ref:
    """The reference runner with the CUDA runner's extras the benchmark reads, and ``draft_chain`` by its
    definition (forced tokens fed)."""

    spec_graph_captures = 0
    spec_counts: dict[str, int] = {}

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def capture_spec_graphs(self, lanes: int) -> int:
        return 0

    def draft_chain(self, lanes: Any, reqs: Any, token_limit: Any, forced: Any = None) -> list[list[int]]:
        from ninfer.engine.speculative import chain_by_steps

        if forced is None:
            return chain_by_steps(self.inner, lanes, reqs, token_limit)
        for s in range(len(reqs[0])):
            self.inner.draft(
                [DraftLane(d.lane, [*d.tokens, *f[:s]]) for d, f in zip(lanes, forced, strict=True)]
            )
            self.inner.sample(range(len(lanes)), [r[s] for r in reqs], token_limit)
        return [list(f) for f in forced]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("bench-spec")
    save_tiny_hf(d / "hf", "dense", 3, mtp=True)
    convert(str(d / "hf"), str(d / "m.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    return load(str(d / "m.ninfer"))


@pytest.mark.parametrize("sync", [False, True])
def test_bench_forced_smoke(tiny: Any, sync: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from perf import bench_spec

    def runner(net: Any, mc: Any, lanes: int, k: int, context: int) -> tuple[Any, EngineConfig]:
        spec = dict(spec="mtp", draft_tokens=k) if k else {}
        cfg = EngineConfig(max_concurrency=lanes, max_context=context + 256, kv_capacity=lanes * (context + 288),
                           prefix_reuse=False, prefill_chunk=1024, **spec)  # fmt: skip
        return _Ref(net.runner(cfg)), cfg

    monkeypatch.setattr(bench_spec, "_runner", runner)
    monkeypatch.setattr(bench_spec, "_sync", lambda: None)
    rows = bench_spec.bench_forced(tiny, tiny.config, 1, 3, [100, 80], 16, sync)
    assert [r["accept_pct"] for r in rows] == [None, 100, 80]
    for r in rows:
        assert r["sync_calls"] is sync and r["prefill_ms"] > 0 and r["decode_tok_s"] > 0
        assert "prefill" in r["prefill_calls_ms"] and "prefill" not in r["calls_ms"]
        assert abs(sum(r["calls_ms"].values()) + r["other_ms"] - r["step_ms"]) < 1e-6
    assert rows[0]["calls_per_step"] == {"execute": 1.0, "sample": 1.0}
    for r in rows[1:]:
        assert r["same_tokens"] and r["timed_captures"] == 0
        n = r["calls_per_step"]
        assert n["draft_chain"] == n["verify"] == n["commit"] == 1.0 and "draft" not in n
        assert n["execute"] - 1.0 == n.get("sample", 0.0) <= 0.5  # a plain decode step at the budget's end


def test_bench_main_smoke(tiny: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The whole command (rounds table, forced runs plain and synchronized, the printed tables, the JSON)."""
    import json

    from perf import bench_spec

    def runner(net: Any, mc: Any, lanes: int, k: int, context: int) -> tuple[Any, EngineConfig]:
        spec = dict(spec="mtp", draft_tokens=k) if k else {}
        cfg = EngineConfig(max_concurrency=lanes, max_context=context + 256, kv_capacity=lanes * (context + 288),
                           prefix_reuse=False, prefill_chunk=1024, **spec)  # fmt: skip
        return _Ref(net.runner(cfg)), cfg

    monkeypatch.setattr(bench_spec, "build", lambda key, profile, act: (tiny.config, tiny))
    monkeypatch.setattr(bench_spec, "_runner", runner)
    monkeypatch.setattr(bench_spec, "_sync", lambda: None)
    args = ["--models", "27b", "--lanes", "1", "--ks", "1", "3", "--pcts", "100", "80", "--forced-tokens", "12",
            "--context", "24", "--reps", "2", "--sync-calls", "--out", str(tmp_path)]  # fmt: skip
    assert bench_spec.main(args) == 0
    res = json.loads((tmp_path / "bench_spec.json").read_text())["models"]["27b"]
    assert [r["k"] for r in res["rounds"]] == [0, 1, 3]
    assert [(r["accept_pct"], r["sync_calls"]) for r in res["forced"]] == [
        (None, False),
        (100, False),
        (80, False),
        (None, True),
        (100, True),
        (80, True),
    ]
