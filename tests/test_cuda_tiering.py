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
  verify rounds run while restores are in flight, outputs equal the engine's without reuse and without drafts;
- the copy kernel (cuda_src/tier_copy.cu) and the pinned arena on their own: pages and a checkpoint slot of
  every dtype spilled and restored elsewhere, bitwise;
- a restore held in flight (a kernel queued first on the copy stream waits for a host flag): the other lane
  keeps decoding, no step waits for the copy (completion only polled), outputs bitwise those without reuse;
- checkpoint slots under repeated spill and restore with tight checkpoint budgets on one and two lanes (at
  fa50d21 these ran out: "no free GDN checkpoint slot"; tests/test_tiering_slots.py checks the bookkeeping on
  the CPU).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gpu = pytest.mark.gpu
GEN = 8


HOLD = r"""
__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void hold(const volatile int* flag, unsigned long long max_ns) {
    const unsigned long long t0 = now_ns();
    while (*flag == 0 && now_ns() - t0 < max_ns) {
    }
}
"""


def _hold(stream: Any, seconds: float) -> Any:
    """Hold ``stream`` until the returned flag (an int32 in mapped pinned memory: with unified addressing the
    kernel reads it at its host address) is set to 1, or ``seconds`` at most, so that a step that waits on the
    stream fails instead of hanging."""
    import ctypes

    import cupy

    rt = cupy.cuda.runtime
    ptr = rt.hostAlloc(64, rt.hostAllocMapped)
    flag = ctypes.c_int32.from_address(ptr)
    flag.value = 0
    with stream:  # bounded by the global timer (ns), whatever the SM clock
        cupy.RawKernel(HOLD, "hold")((1,), (1,), (np.uint64(ptr), np.uint64(seconds * 1e9)))
    return flag


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


@gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_tier_pages_kernel_and_pinned_arena_bitwise(fp8: bool) -> None:
    """Pages of every array (bf16 words or fp8 bytes with float32 scales) and a checkpoint slot spilled from
    scattered device pages to scattered host pages across segments, then restored into other pages and another
    slot: bitwise, with the checksum on and off; the arena is pinned at start with ``eager``."""
    cupy = pytest.importorskip("cupy")
    import types

    from ninfer.cuda import host_tier
    from ninfer.cuda.host_tier import HostTier
    from ninfer.engine.core import TierCopy

    rng = np.random.default_rng(5)
    pages, P, H, D, slots = 700, 16, 4, 64, 6
    word = np.uint8 if fp8 else np.uint16

    def arr(shape: tuple[int, ...], dtype: Any) -> Any:
        return cupy.asarray(rng.integers(0, 255, shape).astype(dtype))

    net = types.SimpleNamespace(stream=cupy.cuda.Stream(non_blocking=True))
    net.kc = [arr((pages, P, H, D), word) for _ in range(3)]
    net.vc = [arr((pages, P, H, D), word) for _ in range(3)]
    net.ks = [cupy.asarray(rng.random((pages, P, H), np.float32)) for _ in range(3)] if fp8 else []
    net.vs = [cupy.asarray(rng.random((pages, P, H), np.float32)) for _ in range(3)] if fp8 else []
    net.conv = [cupy.asarray(rng.random((slots, 96, 3), np.float32)) for _ in range(4)]
    net.rec = [cupy.asarray(rng.random((slots, 4, 32, 32), np.float32)) for _ in range(4)]
    page_bytes = sum(int(a[0].nbytes) for a in net.kc + net.vc + net.ks + net.vs)
    ckpt_pages = -(-sum(int(a[0].nbytes) for a in net.conv + net.rec) // page_bytes)
    cupy.cuda.Device().synchronize()
    old = host_tier.SEGMENT_BYTES, host_tier.STAGE_BYTES
    host_tier.SEGMENT_BYTES = 100 * page_bytes  # runs of host pages cross segments
    host_tier.STAGE_BYTES = 64 * page_bytes  # several staging chunks
    try:
        for checksum in (False, True):
            tier = HostTier(net, 400, page_bytes, checksum=checksum, eager=True)
            assert tier.host_bytes == 400 * page_bytes and tier.chunk == 64
            host = [*range(50, 250), *range(49, 9, -1)]  # runs across segments, then single pages
            dev = [int(p) for p in rng.permutation(pages)[: len(host)]]
            hc = [399 - 3 * i for i in range(ckpt_pages)]  # the checkpoint over scattered host pages
            before = [cupy.asnumpy(a[cupy.asarray(dev)]) for a in tier.page_arrays]
            slot_before = [cupy.asnumpy(a[2]) for a in tier.slot_arrays]
            tier.spill(TierCopy(0, dev, host, 1, hc), 2)
            tier.flush()  # queued until pumped (the runner pumps in its steps)
            tier.stream.synchronize()
            for a in tier.page_arrays + tier.slot_arrays:
                a.fill(0)
            cupy.cuda.Device().synchronize()  # the fills ran on the default stream, the copies do not wait for it
            new = [int(p) for p in rng.permutation(pages)[: len(dev)]]
            tier.restore([TierCopy(5, new, host, 2, hc)], [4], 5)
            got = tier.done(True)
            assert [t for t, _ in got] == [5] and got[0][1] > 0
            for b, a in zip(before, tier.page_arrays, strict=True):
                assert np.array_equal(b, cupy.asnumpy(a[cupy.asarray(new)]))
            for b, a in zip(slot_before, tier.slot_arrays, strict=True):
                assert np.array_equal(b, cupy.asnumpy(a[4]))
            for k, a in enumerate(tier.page_arrays):  # the contents back for the next round
                a[cupy.asarray(dev)] = cupy.asarray(before[k])
            for k, a in enumerate(tier.slot_arrays):
                a[2] = cupy.asarray(slot_before[k])
            cupy.cuda.Device().synchronize()
    finally:
        host_tier.SEGMENT_BYTES, host_tier.STAGE_BYTES = old


@gpu
def test_restore_in_flight_never_blocks_another_lanes_decode(demo: Path) -> None:
    """A restore held in flight (a kernel queued first on the copy stream waits for a host flag): lane 0 keeps
    decoding one token per step meanwhile, no step waits for the copy stream (completion is only polled), the
    restored lane starts only after the copy, and both outputs are bitwise those of the engine without reuse."""
    # one reserved sequence: with the default 64 the fillers' reserved prefixes kept the device pool full while lane
    # 0 ran, so the turn waited for lane 0 to finish instead of restoring beside it (the reference engine shows it)
    kw = dict(BASE, max_concurrency=2, kv_capacity=512, host_cache_gib=0.25, reserved_sequences=1)
    plain = _engine(demo, **dict(BASE, max_concurrency=1, kv_capacity=1024, prefix_reuse=False))
    eng = _engine(demo, **kw, background=False)
    try:
        tok, tier = eng.tokenizer, eng._runner.tier
        waits: list[bool] = []
        done = tier.done
        tier.done = lambda wait: (waits.append(wait), done(wait))[1]
        a, b = _opening(tok, 1), _opening(tok, 2)
        first = eng.submit(a, max_tokens=GEN, ignore_eos=True, checkpoint_at=()).result(timeout=300)
        for s in range(3, 9):  # other sessions push session 1 out of the device pool
            eng.submit(_opening(tok, s), max_tokens=GEN, ignore_eos=True).result(timeout=300)
        assert eng.stats().spills > 0
        budget = BASE["max_context"] - len(b) - 1
        long = eng.submit(b, max_tokens=budget, ignore_eos=True)
        for _ in range(4):
            eng.step()
        lane0 = next(r for r in eng._sched.lanes if r is not None)
        waits.clear()
        flag = _hold(tier.stream, 10.0)  # the restore's copies queue behind it
        nxt = a + first.token_ids + _tool(tok, 0)
        turn = eng.submit(nxt, max_tokens=GEN, ignore_eos=True, checkpoint_at=())
        eng.step()  # admission (inside the step's schedule) issues the restore behind the held flag
        assert eng._sched.restoring, "the next turn did not restore from the host"
        gen0, during = lane0.num_generated, []
        for _ in range(8):  # the copy cannot complete: every step must still run lane 0 at its own pace
            t0 = time.perf_counter()
            eng.step()
            during.append(time.perf_counter() - t0)
            assert eng._sched.restoring
        flag.value = 1  # release the copy stream
        assert max(during) < 1.0, during  # a step that waited on the copy stream would take the 10 s
        assert lane0.num_generated - gen0 == len(during)  # lane 0 decoded in every one of them
        assert waits and not any(waits)  # completion polled, never waited for, while lane 0 ran
        while eng._sched.restoring:
            eng.step()
        c, d = turn.result(timeout=300), long.result(timeout=300)
        assert c.usage.host_cached_tokens > 0 and c.metrics.restore_s > 0
        assert c.token_ids == plain.submit(nxt, max_tokens=GEN, ignore_eos=True).result(timeout=300).token_ids
        assert (
            d.token_ids == plain.submit(b, max_tokens=budget, ignore_eos=True).result(timeout=300).token_ids
        )
    finally:
        eng.close()
        plain.close()


@gpu
@pytest.mark.parametrize(("lanes", "budget"), [(1, 3), (1, 6), (2, 3), (2, 8)])
def test_checkpoint_slots_never_run_out_under_repeated_spill_and_restore(
    demo: Path, lanes: int, budget: int
) -> None:
    """Every session's turn submitted at once, four turns, a checkpoint budget of a few snapshots: spills,
    restores, drops and saves in the same steps never exhaust the runner's slots; outputs equal no reuse."""
    plain = _engine(demo, **BASE, kv_capacity=1024, max_concurrency=1, prefix_reuse=False)
    tok = plain.tokenizer
    eng = _engine(
        demo, **BASE, max_concurrency=lanes, kv_capacity=448, queue_depth=10, tier_checksum=True,
        checkpoint_budget_bytes=budget * 58368, host_cache_gib=4e6 / (1 << 30),
    )  # fmt: skip
    try:
        assert eng._runner.snapshot_bytes == 58368
        ctx = [_opening(tok, s) for s in range(10)]
        hits = 0
        for turn in range(4):
            handles = [eng.submit(c, max_tokens=GEN, ignore_eos=True, checkpoint_at=()) for c in ctx]
            for s, h in enumerate(handles):
                c = h.result(timeout=300)
                assert c.finish_reason == "output_limit", c.error
                want = plain.submit(ctx[s], max_tokens=GEN, ignore_eos=True).result(timeout=300)
                assert c.token_ids == want.token_ids, (turn, s)
                hits += c.usage.host_cached_tokens > 0
                ctx[s] = ctx[s] + c.token_ids + _tool(tok, turn)
            eng._cache.check()
            assert eng._runner.num_checkpoints <= budget
        assert hits >= 10 and eng.stats().host_restores >= hits
    finally:
        eng.close()
        plain.close()
