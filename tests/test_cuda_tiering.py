"""The host tier on the CUDA runner (docs/tiering.md): pinned host pages, the copy stream, restores overlapped
with other lanes' decode.

GPU tests (marked ``gpu``), on the demo model uploaded with ``prefix_reuse``-exact prefill (``prefill_gemm=False``:
prompt chunking and resume points never change results):
- interleaved agent sessions on a device pool with room for about two histories, the rest spilled to pinned host
  memory and restored: every restore checked bitwise against what was spilled (``tier_checksum``), every output
  equal to the CUDA engine's without reuse, bf16 and fp8 KV;
- two lanes: one session restores while another lane decodes; the restore's ticket comes back and its lane runs
  only after it; the copy's time is reported;
- with MTP speculation (docs/speculative.md): the head's KV plane is part of every spilled and restored page,
  verify rounds run while restores are in flight, outputs equal the engine's without reuse and without drafts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

gpu = pytest.mark.gpu
GEN = 8


def _engine(path: Path, **kw: Any) -> Any:
    from ninfer.cuda.model import load_cuda
    from ninfer.engine import Engine
    from ninfer.model import load

    model = load(path)
    model.net = load_cuda(path, act_dtype="fp32", prefill_gemm=False, progress=False)
    model.backend = "cuda"
    return Engine.from_model(model, **kw)


def _opening(tok: Any, s: int) -> list[int]:
    return tok.encode(
        f"<|im_start|>system\nAgent {s}. " + "note " * (16 + 2 * s) + "<|im_end|>\n"
        f"<|im_start|>user\nTask {s}?<|im_end|>\n<|im_start|>assistant\n"
    )


def _tool(tok: Any, turn: int) -> list[int]:
    return tok.encode(f"<|im_end|>\n<|im_start|>user\nresult {turn}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("cupy")
    from ninfer.demo import build_demo

    return build_demo(tmp_path_factory.mktemp("tier") / "demo.ninfer")


BASE = dict(max_context=256, prefill_chunk=64, checkpoint_stride=1024, page_size=16)


@gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_sessions_spill_and_restore_bitwise_outputs_equal_no_reuse(demo: Path, kv_dtype: str) -> None:
    from ninfer.cuda.runner import CudaModelRunner

    sessions, turns = 8, 3
    plain = _engine(demo, **BASE, kv_dtype=kv_dtype, kv_capacity=1024, max_concurrency=1, prefix_reuse=False)
    tok = plain.tokenizer
    probe = _engine(demo, **BASE, kv_dtype=kv_dtype, kv_capacity=384, host_cache_gib=0, max_concurrency=1)
    page_bytes, snap = probe._runner.page_bytes, probe._runner.snapshot_bytes
    probe.close()
    host = sessions * (14 * page_bytes + 4 * snap) / (1 << 30)
    eng = _engine(
        demo, **BASE, kv_dtype=kv_dtype, kv_capacity=384, checkpoint_budget_bytes=6 * snap, max_concurrency=1,
        host_cache_gib=host, tier_checksum=True,
    )  # fmt: skip
    try:
        assert isinstance(eng._runner, CudaModelRunner) and eng._runner.tier is not None
        ctx = [_opening(tok, s) for s in range(sessions)]
        last, restored = [0] * sessions, 0
        for turn in range(turns):
            for s in range(sessions):
                c = eng.submit(ctx[s], max_tokens=GEN, ignore_eos=True, checkpoint_at=()).result(timeout=300)
                want = plain.submit(ctx[s], max_tokens=GEN, ignore_eos=True).result(timeout=300)
                assert c.finish_reason != "error", c.error  # a checksum mismatch fails the step
                assert c.token_ids == want.token_ids, f"session {s} turn {turn}"
                if turn:
                    assert c.usage.cached_tokens == last[s], (s, turn, c.usage)
                    restored += c.usage.host_cached_tokens > 0
                last[s] = len(ctx[s]) + GEN
                ctx[s] = ctx[s] + c.token_ids + _tool(tok, turn)
                eng._cache.check()
        st = eng.stats()
        assert restored >= (turns - 1) * (sessions - 3) and st.spills > 0
        assert st.restore_bytes > 0 and st.restore_seconds > 0
    finally:
        eng.close()
        plain.close()


@gpu
def test_restore_overlaps_another_lanes_decode(demo: Path) -> None:
    """Two lanes: a long generation keeps decoding while a second session's prefix comes back from the host."""
    kw = dict(BASE, max_concurrency=2, kv_capacity=512, host_cache_gib=0.25, tier_checksum=True)
    plain = _engine(demo, **dict(BASE, max_concurrency=1, kv_capacity=1024, prefix_reuse=False))
    eng = _engine(demo, **kw)
    try:
        tok = eng.tokenizer
        a, b = _opening(tok, 1), _opening(tok, 2)
        first = eng.submit(a, max_tokens=GEN, ignore_eos=True, checkpoint_at=()).result(timeout=300)
        # other sessions push session 1 out of the device pool
        for s in range(3, 9):
            eng.submit(_opening(tok, s), max_tokens=GEN, ignore_eos=True).result(timeout=300)
        assert eng.stats().spills > 0
        long = eng.submit(b, max_tokens=120, ignore_eos=True)  # decodes in lane 0 meanwhile
        nxt = a + first.token_ids + _tool(tok, 0)
        c = eng.submit(nxt, max_tokens=GEN, ignore_eos=True, checkpoint_at=()).result(timeout=300)
        done = long.result(timeout=300)
        assert c.usage.host_cached_tokens > 0 and c.metrics.restore_s > 0 and c.metrics.restore_bytes > 0
        assert c.token_ids == plain.submit(nxt, max_tokens=GEN, ignore_eos=True).result(timeout=300).token_ids
        assert (
            done.token_ids == plain.submit(b, max_tokens=120, ignore_eos=True).result(timeout=300).token_ids
        )
    finally:
        eng.close()
        plain.close()


@gpu
def test_interleaved_sessions_on_two_lanes(demo: Path) -> None:
    """Every session's turn submitted at once on two lanes (restores in flight while the other lane runs, nodes
    restored and spilled again): outputs equal the CUDA engine's without reuse, every restore bitwise."""
    plain = _engine(demo, **BASE, kv_capacity=1024, max_concurrency=1, prefix_reuse=False)
    tok = plain.tokenizer
    eng = _engine(
        demo, **BASE, max_concurrency=2, kv_capacity=448, queue_depth=10, checkpoint_budget_bytes=8 * 58368,
        tier_checksum=True, host_cache_gib=4e6 / (1 << 30),
    )  # fmt: skip
    try:
        ctx = [_opening(tok, s) for s in range(10)]
        hits = 0
        for turn in range(3):
            handles = [eng.submit(c, max_tokens=GEN, ignore_eos=True, checkpoint_at=()) for c in ctx]
            for s, h in enumerate(handles):
                c = h.result(timeout=300)
                assert c.finish_reason == "output_limit", c.error
                want = plain.submit(ctx[s], max_tokens=GEN, ignore_eos=True).result(timeout=300)
                assert c.token_ids == want.token_ids, (turn, s)
                hits += c.usage.host_cached_tokens > 0
                ctx[s] = ctx[s] + c.token_ids + _tool(tok, turn)
            eng._cache.check()
        assert hits >= 10 and eng.stats().host_restores >= hits
    finally:
        eng.close()
        plain.close()


@gpu
def test_sessions_with_speculation_on_two_lanes(demo: Path) -> None:
    """The interleaved sessions with ``spec="mtp"`` and scripted drafts (80% accepted): every restore bitwise
    (the MTP plane included), every output the CUDA engine's without reuse and without drafts."""
    from ninfer.cuda.model import load_cuda
    from ninfer.engine import Engine, EngineConfig
    from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script
    from ninfer.model import load

    plain = _engine(demo, **BASE, kv_capacity=1024, max_concurrency=1, prefix_reuse=False)
    tok = plain.tokenizer
    model = load(demo)
    model.net = load_cuda(demo, act_dtype="fp32", prefill_gemm=False, progress=False)
    model.backend = "cuda"
    cfg = EngineConfig(
        **BASE, max_concurrency=2, kv_capacity=448, queue_depth=10, checkpoint_budget_bytes=8 * 58368,
        tier_checksum=True, host_cache_gib=8e6 / (1 << 30), spec="mtp", draft_tokens=3,
    )  # fmt: skip
    runner = ScriptedDrafts(model.runner(cfg), lambda tokens: None)  # the script is set per turn
    assert runner.tier is not None and runner.page_bytes == sum(
        int(a[0].nbytes) for a in runner.tier.page_arrays
    )
    eng = Engine(
        runner, model.config, tok, cfg, eos_token_ids=model.eos_token_ids, token_limit=model.token_limit
    )
    try:
        ctx = [_opening(tok, s) for s in range(10)]
        hits = 0
        for turn in range(3):
            want = [plain.submit(c, max_tokens=GEN, ignore_eos=True).result(timeout=300) for c in ctx]
            refs = {tuple(c): c + w.token_ids for c, w in zip(ctx, want, strict=True)}
            runner.script = replay_script(refs, 80, model.config.vocab_size)
            handles = [eng.submit(c, max_tokens=GEN, ignore_eos=True, checkpoint_at=()) for c in ctx]
            for s, h in enumerate(handles):
                c = h.result(timeout=300)
                assert c.finish_reason == "output_limit", c.error
                assert c.token_ids == want[s].token_ids, (turn, s)
                hits += c.usage.host_cached_tokens > 0
                ctx[s] = ctx[s] + c.token_ids + _tool(tok, turn)
            eng._cache.check()
        st = eng.stats()
        assert hits >= 10 and st.host_restores >= hits and st.spec_accepted > 0
    finally:
        eng.close()
        plain.close()
