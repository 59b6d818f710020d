"""What one speculative round costs the CUDA runner in calls, graph replays and host synchronizations
(docs/speculative.md "Cost of a round"), with the tokens still those without speculation.

At 1 lane, k = 3, forced 100% and 80% acceptance (``replay_script``): every round is one ``draft_chain`` (k draft
graph replays, no eager step), one verify graph replay (no eager forward) whose ``execute`` synchronizes nothing, one
``verify`` and one ``commit``; no graph is captured after ``capture_spec_graphs``; the greedy tokens are the plain
runner's.

    python -m pytest -m gpu tests/test_cuda_spec_round.py
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

gpu = pytest.mark.gpu
PROMPT = [5, 9, 33, 100, 7, 12, 40, 41, 42, 43]
TOKENS = 48


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("cupy")
    from ninfer.cuda.model import load_cuda
    from ninfer.demo import build_demo
    from ninfer.model import load

    path = build_demo(tmp_path_factory.mktemp("cuda-spec-round") / "demo.ninfer")
    model = load(path)
    model.net = load_cuda(path, progress=False)
    model.backend = "cuda"
    return model


class _Count:
    """Counts the runner's calls and the stream synchronizations made inside a verify-only ``execute``."""

    def __init__(self, inner: Any, syncs: Counter[str]) -> None:
        self.inner, self.calls, self.syncs = inner, Counter[str](), syncs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in ("execute", "draft", "draft_chain", "sample", "verify", "commit"):
            return attr

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls[name] += 1
            verify_only = name == "execute" and all(w.verify for w in a[0].work) and a[0].work
            self.syncs["where"] = 1 if verify_only else 0
            try:
                return attr(*a, **kw)
            finally:
                self.syncs["where"] = 0

        return counted


def _generate(model: Any, k: int, wrap: Any = None) -> tuple[Any, Any]:
    from engines import engine_over

    from ninfer.engine import EngineConfig

    spec = dict(spec="mtp", draft_tokens=k) if k else {}
    cfg = EngineConfig(max_context=256, kv_capacity=4096, max_concurrency=1, prefix_reuse=False, **spec)
    seen: list[Any] = []

    def wrapped(runner: Any) -> Any:
        seen.append(runner)
        if k:
            runner.capture_spec_graphs(1)
        return wrap(runner) if wrap is not None else runner

    with engine_over(model, cfg, wrapped) as eng:
        captured = seen[0].spec_graph_captures
        out = eng.submit(PROMPT, max_tokens=TOKENS, ignore_eos=True).result(timeout=600)
        assert seen[0].spec_graph_captures == captured, "a graph was captured during the rounds"
    return out, seen[0]


@gpu
@pytest.mark.parametrize("pct", [100, 80])
def test_cuda_round_calls_replays_and_syncs(demo: Any, pct: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script

    k = 3
    plain, _ = _generate(demo, 0)
    refs = {tuple(PROMPT): PROMPT + plain.token_ids}
    syncs: Counter[str] = Counter()
    orig = cupy.cuda.Stream.synchronize

    def sync(self: Any) -> Any:
        syncs["all"] += 1
        syncs["in_verify_execute"] += syncs["where"]
        return orig(self)

    monkeypatch.setattr(cupy.cuda.Stream, "synchronize", sync)
    counted: list[_Count] = []

    def wrap(r: Any) -> Any:  # after the runner's construction and capture_spec_graphs
        syncs["all"] = 0
        counted.append(_Count(r, syncs))
        return ScriptedDrafts(counted[-1], replay_script(refs, pct, demo.config.vocab_size))

    got, runner = _generate(demo, k, wrap)
    assert got.token_ids == plain.token_ids
    u = got.usage.speculative
    assert (u.accepted == u.drafted) if pct == 100 else (0 < u.accepted < u.drafted)
    calls, n = counted[0].calls, runner.spec_counts
    plain_steps = calls["sample"] - 1  # the prefill's first token, then decode steps where no draft fits
    assert plain_steps <= 1 and "draft" not in calls
    assert calls["draft_chain"] == calls["verify"] == calls["commit"] == u.rounds
    assert n["verify_eager"] == 0 and n["verify_graph"] == u.rounds, n
    assert n["draft_eager"] == 0 and n["draft_graph"] == u.drafted <= k * u.rounds, n  # one step per draft
    assert syncs["in_verify_execute"] == 0, "a verify-only execute synchronized the stream"
    # the prefill's and the plain steps' included; CuPy's own (a device-to-host copy) may not pass through here
    print(f"pct={pct}: {u.rounds} rounds, Stream.synchronize() calls per round {syncs['all'] / u.rounds:.2f}")
