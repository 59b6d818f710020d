"""Engine on the demo model: batch invariance, admission queue, cancellation, finishes, stop strings, streaming."""

from __future__ import annotations

import threading

import msgspec
import numpy as np
import pytest

import ninfer
from ninfer.demo import build_demo
from ninfer.engine import Engine, Finish, QueueFull, RequestError, TokenDelta
from ninfer.model import load


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_demo(tmp_path_factory.mktemp("engine") / "demo.ninfer")


@pytest.fixture(scope="module")
def model(demo_path: str):  # noqa: ANN201
    return load(demo_path)


def _engine(model, **kw) -> Engine:  # noqa: ANN001
    base = dict(max_context=512, kv_capacity=8192, prefill_chunk=32, checkpoint_stride=64)
    return Engine.from_model(model, **{**base, **kw})


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, size=int(k)).tolist() for k in rng.integers(3, 120, size=n)]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_p": 0.95, "top_k": 50}])
def test_batch_invariance(model, sampling: dict) -> None:  # noqa: ANN001
    prompts = _prompts(12)
    seeds = {"seed": None} if not sampling else {}
    with _engine(model, max_concurrency=4, queue_depth=12) as eng:
        handles = [
            eng.submit(p, max_tokens=10, ignore_eos=True, **sampling, **(seeds or {"seed": i}))
            for i, p in enumerate(prompts)
        ]
        batched = [h.result(timeout=120).token_ids for h in handles]
        assert eng.stats().steps < sum(len(b) for b in batched)  # requests really shared steps
    with _engine(model, max_concurrency=1, queue_depth=12, prefix_reuse=False) as solo:
        for i, (p, b) in enumerate(zip(prompts, batched, strict=True)):
            assert (
                solo.submit(p, max_tokens=10, ignore_eos=True, **sampling, **(seeds or {"seed": i}))
                .result(timeout=60)
                .token_ids
                == b
            )


def test_queue_full_fifo_and_cancel(model) -> None:  # noqa: ANN001
    eng = _engine(model, max_concurrency=1, queue_depth=2, background=False)
    started: list[int] = []
    hs = [
        eng.submit(
            [1, 2, 3, k],
            max_tokens=4,
            ignore_eos=True,
            on_event=lambda ev, k=k: started.append(k) if isinstance(ev, TokenDelta) else None,
        )
        for k in range(3)
    ]
    with pytest.raises(QueueFull):
        eng.submit([5, 6], max_tokens=4)
    st = eng.stats()
    assert st.lanes_busy == 1 and st.queue_length == 2
    for h in hs:
        h.result()
    firsts = list(dict.fromkeys(started))
    assert firsts == [0, 1, 2]  # queued requests start in submit order
    # cancel a running request: its lane and its pages are free again at the next step
    free0 = eng.stats().kv_pages_free
    long = eng.submit(list(range(40)), max_tokens=300, ignore_eos=True)
    waiting = eng.submit([9, 9, 9], max_tokens=2, ignore_eos=True)
    assert eng.stats().kv_pages_free < free0 and eng.stats().queue_length == 1
    eng.step()
    long.cancel()
    eng.step()
    assert long.result().finish_reason == "cancelled"
    assert long.result().usage.completion_tokens <= 2
    assert waiting.result().finish_reason == "output_limit"
    cancelled_in_queue = [eng.submit([4], max_tokens=50, ignore_eos=True) for _ in range(2)]
    cancelled_in_queue[1].cancel()
    assert cancelled_in_queue[1].result().finish_reason == "cancelled"
    assert cancelled_in_queue[1].result().metrics.queue_wait_s >= 0
    assert cancelled_in_queue[0].result().usage.completion_tokens == 50
    st = eng.stats()
    assert st.lanes_busy == 0 and st.kv_pages_active == 0
    assert st.kv_pages_free + st.kv_pages_retained == st.kv_pages_total
    eng.close()


def test_reservation_admission_waits_for_kv(model) -> None:  # noqa: ANN001
    # 2 lanes but KV for only one max-size request: the second waits (FIFO) instead of failing
    eng = _engine(
        model,
        max_concurrency=2,
        queue_depth=4,
        max_context=256,
        kv_capacity=256,
        prefix_reuse=False,
        background=False,
    )
    a = eng.submit(list(range(10)), max_tokens=200, ignore_eos=True)
    b = eng.submit(list(range(10)), max_tokens=200, ignore_eos=True)
    assert eng.stats().lanes_busy == 1 and eng.stats().queue_length == 1
    assert a.result().token_ids == b.result().token_ids
    with pytest.raises(RequestError, match="max_context"):
        eng.submit(list(range(256)), max_tokens=1)
    eng.close()


def test_finish_reasons_and_usage(model) -> None:  # noqa: ANN001
    with _engine(model, max_context=64) as eng:
        c = eng.submit(list(range(20)), max_tokens=5, ignore_eos=True).result(timeout=60)
        assert (c.finish_reason, c.usage.completion_tokens, c.usage.prompt_tokens) == ("output_limit", 5, 20)
        c = eng.submit(list(range(50)), max_tokens=100, ignore_eos=True).result(timeout=60)
        assert (c.finish_reason, c.usage.completion_tokens) == ("context_capacity", 14)
        first = eng.submit(list(range(20)), max_tokens=8, ignore_eos=True).result(timeout=60).token_ids
        stop_tok = first[3]
        c = eng.submit(list(range(20)), max_tokens=8, stop_token_ids=[stop_tok]).result(timeout=60)
        assert c.finish_reason == "stop_token" and c.token_ids == first[: first.index(stop_tok) + 1]
        assert c.usage.completion_tokens == len(c.token_ids)  # the stop token is counted


def test_stop_string_split_across_tokens(model) -> None:  # noqa: ANN001
    tok = model.tokenizer
    with _engine(model) as eng:
        ref = eng.submit(list(range(30)), max_tokens=24, ignore_eos=True).result(timeout=60)
        pieces = [tok.decode([t]) for t in ref.token_ids]
        # a stop string that starts inside one token's text and ends inside a later token's text
        k = next(i for i in range(2, 20) if len(pieces[i]) >= 2 and len(pieces[i + 2]) >= 2)
        stop = pieces[k][-1] + pieces[k + 1] + pieces[k + 2][:1]
        full = tok.decode(ref.token_ids)
        cut = full.find(stop)
        h = eng.submit(list(range(30)), max_tokens=24, ignore_eos=True, stop=["never-there", stop])
        events = list(h.stream(timeout=60))
        c = h.result()
        assert c.finish_reason == "stop_string" and c.stop_string == stop
        assert c.text == full[:cut] and stop not in c.text
        assert "".join(e.text for e in events) == c.text  # deltas then finish carry exactly the text
        assert isinstance(events[-1], Finish) and len(c.token_ids) <= k + 3


def test_stream_events_and_msgspec_roundtrip(model) -> None:  # noqa: ANN001
    with _engine(model) as eng:
        h = eng.submit([1, 2, 3], max_tokens=6, ignore_eos=True)
        events = list(h.stream(timeout=60))
        deltas = [e for e in events if isinstance(e, TokenDelta)]
        assert [t for d in deltas for t in d.token_ids] == h.result().token_ids
        fin = events[-1]
        assert isinstance(fin, Finish) and fin.usage.completion_tokens == 6
        enc = msgspec.msgpack.encode(events)
        assert msgspec.msgpack.decode(enc, type=list[TokenDelta | Finish]) == events
        m = fin.metrics
        assert m.ttft_s >= m.queue_wait_s >= 0 and m.decode_s >= 0 and m.finish_reason == "output_limit"


def test_token_mask_hook(model) -> None:  # noqa: ANN001
    allowed = np.zeros(model.config.vocab_size, bool)
    allowed[[10, 20, 30]] = True
    seen: list[int] = []

    def mask(generated):  # noqa: ANN001, ANN202
        seen.append(len(generated))
        return allowed

    with _engine(model) as eng:
        c = eng.submit([5, 6, 7], max_tokens=5, temperature=1.0, seed=1, token_mask=mask).result(timeout=60)
        assert set(c.token_ids) <= {10, 20, 30} and seen == [0, 1, 2, 3, 4]
        bad = eng.submit([5, 6], max_tokens=5, token_mask=lambda g: np.zeros(model.config.vocab_size, bool))
        c = bad.result(timeout=60)
        assert c.finish_reason == "error" and "no token" in c.error
        assert (
            eng.submit([5, 6], max_tokens=2).result(timeout=60).usage.completion_tokens >= 1
        )  # still serving


def test_kv_and_state_dtypes_run_and_threads_submit(model) -> None:  # noqa: ANN001
    prompts = _prompts(6, seed=3)
    for kw in ({"kv_dtype": "fp8"}, {"gdn_state_dtype": "bf16"}):
        with _engine(model, max_concurrency=3, queue_depth=6, **kw) as eng:
            results: dict[int, list[int]] = {}

            def worker(i: int, eng: Engine = eng, results: dict = results) -> None:
                results[i] = (
                    eng.submit(prompts[i], max_tokens=6, ignore_eos=True).result(timeout=120).token_ids
                )

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == list(range(6)) and all(len(r) == 6 for r in results.values())
            solo = eng.submit(prompts[0], max_tokens=6, ignore_eos=True).result(timeout=60).token_ids
            assert solo == results[0]


def test_open_from_path_and_bad_requests(demo_path: str) -> None:
    with ninfer.open_engine(
        demo_path, backend="reference", max_concurrency=2, queue_depth=2, max_context=128, kv_capacity=1024
    ) as eng:
        assert eng.tokenizer is not None
        c = eng.submit(eng.tokenizer.encode("Hello there"), max_tokens=4).result(timeout=60)
        assert c.usage.prompt_tokens == len(eng.tokenizer.encode("Hello there"))
        assert c.text == eng.tokenizer.decode(
            [t for t in c.token_ids if t not in eng.tokenizer.eos_token_ids]
        )
        with pytest.raises(RequestError, match="outside the vocabulary"):
            eng.submit([10**6], max_tokens=1)
        with pytest.raises(RequestError, match="top_p"):
            eng.submit([1], max_tokens=1, top_p=1.5)
        with pytest.raises(RequestError, match="empty"):
            eng.submit([], max_tokens=1)


def test_penalties_and_seeds_in_the_engine(model) -> None:  # noqa: ANN001
    prompt = list(range(40, 60))
    allowed = np.zeros(model.config.vocab_size, bool)
    allowed[[100, 200, 300, 400]] = True

    def run(**kw: float) -> list[int]:
        h = eng.submit(prompt, max_tokens=8, ignore_eos=True, token_mask=lambda g: allowed, **kw)
        return h.result(timeout=60).token_ids

    with _engine(model) as eng:
        plain = run()
        counts = np.bincount(plain, minlength=401)[[100, 200, 300, 400]]
        assert len(set(plain[:4])) < 4 and sorted(counts) != [2] * 4  # without penalties greedy repeats
        assert len(set(run(presence_penalty=1e4)[:4])) == 4  # every repeat is worse than any new token
        assert sorted(np.bincount(run(frequency_penalty=1e4), minlength=401)[[100, 200, 300, 400]]) == [2] * 4
        assert run(repetition_penalty=100.0) != plain

        def sampled(seed: int | None) -> list[int]:
            h = eng.submit(prompt, max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True)
            return h.result(timeout=60).token_ids

        assert sampled(11) == sampled(11) and sampled(11) != sampled(12)
        assert sampled(None) != sampled(None)  # no seed: a fresh stream per request


def test_model_failure_fails_running_requests_and_engine_recovers(model) -> None:  # noqa: ANN001
    eng = _engine(model, background=False)
    net = eng._runner.net
    original = net.forward_batch
    calls = {"n": 0}

    def flaky(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            raise FloatingPointError("boom")
        return original(*args, **kw)

    net.forward_batch = flaky
    try:
        c = eng.submit(list(range(30)), max_tokens=8, ignore_eos=True).result()
        assert c.finish_reason == "error" and "boom" in c.error
        ok = eng.submit(list(range(30)), max_tokens=4, ignore_eos=True).result()
        assert ok.finish_reason == "output_limit" and ok.usage.completion_tokens == 4
    finally:
        net.forward_batch = original
    st = eng.stats()
    assert (
        st.lanes_busy == 0 and st.kv_pages_active == 0 and st.checkpoint_bytes <= st.checkpoint_budget_bytes
    )
    eng.close()


def test_accepted_budget_queued_flag_and_reasoning_tokens(model) -> None:  # noqa: ANN001
    """``Handle.accepted`` is where max_tokens is clamped (once, to what the context leaves); ``queued`` says
    whether the request waits for a lane; ``Usage.reasoning_tokens`` counts up to ``stop_after_token_id``."""
    with _engine(model, max_concurrency=1, queue_depth=2, max_context=64, kv_capacity=1024) as eng:
        first = eng.submit(list(range(1, 41)), max_tokens=100, ignore_eos=True)
        second = eng.submit([1, 2, 3], max_tokens=5, ignore_eos=True)
        assert (first.accepted.prompt_tokens, first.accepted.max_tokens, first.accepted.queued) == (
            40,
            24,
            False,
        )
        assert (second.accepted.max_tokens, second.accepted.queued) == (5, True)
        assert first.result().finish_reason == "context_capacity" and len(first.result().token_ids) == 24
        done = second.result()
        mark = done.token_ids[2]  # a generated id: the reasoning ends at its first occurrence
        third = eng.submit([1, 2, 3], max_tokens=5, ignore_eos=True, stop_after_token_id=mark).result()
        assert third.token_ids == done.token_ids  # greedy: the same tokens
        assert third.usage.reasoning_tokens == done.token_ids.index(mark) + 1
        assert done.usage.reasoning_tokens == 0 and third.metrics.lane == 0
