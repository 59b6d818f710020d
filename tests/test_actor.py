"""The engine actor's logic in-process (no Ray): events, coalescing, admission, cancellation, engine failure.

The real engine runs on the demo artifact; the Ray plumbing itself is covered by tests/test_api_live.py.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import make_actor
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import (
    Accepted,
    ActorSpec,
    Failed,
    Finish,
    GenerateRequest,
    SamplingOptions,
    TokenDelta,
    decode_batch,
    decode_events,
    decode_opened,
    decode_requests,
    encode_requests,
    engine_failure,
)

from ninfer.engine import EngineConfig

USER = ({"role": "user", "content": "hello there"},)


def req(rid: str, max_tokens: int = 8, **kw: object) -> GenerateRequest:
    sampling = SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return GenerateRequest(request_id=rid, messages=kw.pop("messages", USER), sampling=sampling, **kw)  # type: ignore[arg-type]


async def collect(a: EngineActor, r: GenerateRequest, delay: float = 0.0) -> list[object]:
    out = []
    async for raw in a.generate(r):
        out.extend(decode_events(raw))
        if delay:
            await asyncio.sleep(delay)
    return out


def test_actor_sets_its_gil_switch_interval(artifact: str) -> None:
    """The actor's other threads take the GIL from the engine's step loop within ``gil_switch_s`` (0: untouched)."""
    import sys

    default = sys.getswitchinterval()
    assert ActorSpec(artifact=artifact, backend="reference").gil_switch_s == 0.0002
    a = make_actor(artifact)
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    asyncio.run(a.shutdown())
    sys.setswitchinterval(default)
    spec = ActorSpec(artifact=artifact, backend="reference", engine=a._spec.engine, gil_switch_s=0)
    b = EngineActor(spec)
    assert sys.getswitchinterval() == default
    asyncio.run(b.shutdown())


def test_stream_shape_and_coalescing(actor: EngineActor) -> None:
    fast = asyncio.run(collect(actor, req("fast", 24)))
    slow = asyncio.run(collect(actor, req("slow", 24), delay=0.03))  # a slow consumer gets bigger items
    for evs in (fast, slow):
        assert isinstance(evs[0], Accepted) and evs[0].max_tokens == 24
        assert isinstance(evs[-1], Finish) and evs[-1].reason == "output_limit"
        deltas = [e for e in evs if isinstance(e, TokenDelta)]
        assert sum(len(d.token_ids) for d in deltas) == 24 == evs[-1].usage.completion_tokens
    fast_ids = [t for e in fast if isinstance(e, TokenDelta) for t in e.token_ids]
    slow_ids = [t for e in slow if isinstance(e, TokenDelta) for t in e.token_ids]
    assert fast_ids == slow_ids  # greedy: same tokens however they are chunked
    assert len([e for e in slow if isinstance(e, TokenDelta)]) < 24 / 2
    assert "".join(e.text for e in fast if isinstance(e, TokenDelta)) == "".join(
        e.text for e in slow if isinstance(e, TokenDelta)
    )


def test_token_id_prompts_and_prompt_errors(actor: EngineActor) -> None:
    evs = asyncio.run(
        collect(
            actor,
            GenerateRequest(request_id="ids", prompt_ids=(1, 2, 3), sampling=SamplingOptions(max_tokens=3)),
        )
    )
    assert isinstance(evs[0], Accepted) and evs[0].prompt_tokens == 3 and isinstance(evs[-1], Finish)
    long = ({"role": "user", "content": "lorem ipsum dolor " * 400},)
    (ev,) = asyncio.run(collect(actor, req("long", messages=long)))
    assert isinstance(ev, Failed) and (ev.status, ev.code, ev.param) == (
        400,
        "context_length_exceeded",
        "messages",
    )
    (ev,) = asyncio.run(collect(actor, GenerateRequest(request_id="bad", prompt_ids=(10**9,))))
    assert isinstance(ev, Failed) and ev.status == 400 and "prompt_ids" in ev.message


def test_queue_full_and_cancel_free_the_lane(artifact: str) -> None:
    a = make_actor(artifact, max_concurrency=1, queue_depth=0)

    async def scenario() -> tuple[list[object], list[object]]:
        first = a.generate(req("long", 400))
        assert isinstance(decode_events(await anext(first))[0], Accepted)
        refused = await collect(a, req("second"))
        assert (await a.stats()).lanes_busy == 1
        assert await a.cancel("long")
        rest = [ev async for raw in first for ev in decode_events(raw)]
        return refused, rest

    try:
        refused, rest = asyncio.run(scenario())
        assert len(refused) == 1 and isinstance(refused[0], Failed)
        assert (refused[0].status, refused[0].code, refused[0].retry_after) == (429, "queue_full", 1.0)
        assert isinstance(rest[-1], Finish) and rest[-1].reason == "cancelled"
        st = asyncio.run(a.stats())
        assert (st.lanes_busy, st.open_streams) == (0, 0)
        assert isinstance(asyncio.run(collect(a, req("after", 2)))[-1], Finish)
    finally:
        asyncio.run(a.shutdown())


def test_dropped_consumer_cancels(actor: EngineActor) -> None:
    async def scenario() -> None:
        gen = actor.generate(req("dropped", 400))
        await anext(gen)
        await anext(gen)
        await gen.aclose()  # what Ray does when the caller goes away
        for _ in range(100):
            if (await actor.stats()).lanes_busy == 0:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("lane still busy 1 s after the consumer left")

    asyncio.run(scenario())


def test_engine_failure_fails_requests_and_the_actor_keeps_serving(actor: EngineActor) -> None:
    runner = actor._engine.engine._runner
    real = runner.execute
    calls = {"n": 0}

    def flaky(batch: object) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected device fault")
        return real(batch)

    runner.execute = flaky
    try:
        evs = asyncio.run(collect(actor, req("victim", 50)))
    finally:
        runner.execute = real
    assert isinstance(evs[-1], Finish) and evs[-1].reason == "error"  # the engine's event, as it is
    failed = engine_failure(evs[-1])
    assert failed is not None and failed.code == "engine_error" and failed.status == 500
    assert "injected device fault" in failed.message
    assert (asyncio.run(actor.stats())).engine_failures == 1
    assert asyncio.run(actor.health()).ok
    after = asyncio.run(collect(actor, req("survivor", 4)))
    assert isinstance(after[-1], Finish) and after[-1].usage.completion_tokens == 4


def _text(evs: list[object]) -> str:
    return "".join(e.text for e in evs if isinstance(e, TokenDelta | Finish) and getattr(e, "text", ""))


def test_stop_strings_apply_to_the_answer_not_the_reasoning(actor: EngineActor) -> None:
    def run(stop: tuple[str, ...], thinking: bool) -> list[object]:
        s = SamplingOptions(max_tokens=16, temperature=0.0, ignore_eos=True, stop=list(stop))
        kw = {"enable_thinking": thinking}
        return asyncio.run(
            collect(actor, GenerateRequest(request_id="s", messages=USER, sampling=s, template_kwargs=kw))
        )

    for thinking in (True, False):
        text = _text(run((), thinking))
        assert len(text) > 8
        stopped = run((text[3:7],), thinking)
        reason = stopped[-1].reason  # type: ignore[attr-defined]
        # random weights never close the think block: with thinking on the whole text is reasoning
        assert reason == ("output_limit" if thinking else "stop_string"), (thinking, reason)


@pytest.mark.parametrize(
    "flags,sampling",
    [
        (["--greedy"], {"temperature": 0.0}),
        (["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7"],
         {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}),
        (["--temperature", "1.3", "--seed", "123"], {"temperature": 1.3, "seed": 123}),
        (["--temperature", "1.3", "--top-k", "0", "--top-p", "1", "--seed", "123"],
         {"temperature": 1.3, "top_k": 0, "top_p": 1.0, "seed": 123}),
        (["--seed", "9"], {"seed": 9}),
    ],
)  # fmt: skip
def test_ninfer_generate_gives_the_servers_tokens(
    actor: EngineActor, artifact: str, capsys: pytest.CaptureFixture[str], flags: list[str], sampling: dict
) -> None:
    """One sampler: ``ninfer generate`` (Model.generate through a one-lane engine in its own thread) and the
    server's actor give the same tokens for the same prompt, settings and seed. A setting left out is the
    artifact's generation default on both sides (the demo's: temperature 0.7, top_p 0.9, top_k 20)."""
    got = _cli_tokens(artifact, capsys, flags)
    assert len(got) >= 1 and got == _served(actor, sampling)


def test_ninfer_generate_greedy_keeps_the_artifacts_penalties(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``ninfer generate --greedy`` is the server's temperature 0: the artifact's penalty defaults still apply
    (the server takes every setting a request leaves out from the artifact, greedy or not)."""
    from ninfer import demo

    monkeypatch.setitem(demo.DEMO_GENERATION_CONFIG, "repetition_penalty", 3.0)
    art = demo.build_demo(tmp_path_factory.mktemp("penalty") / "demo.ninfer")
    a = make_actor(art)
    try:
        got = _cli_tokens(art, capsys, ["--greedy"])
        assert got == _served(a, {"temperature": 0.0})
        assert got != _served(a, {"temperature": 0.0, "repetition_penalty": 1.0})  # the penalty mattered
    finally:
        asyncio.run(a.shutdown())


_PROMPT = (5, 17, 99, 250, 3, 8, 41)


def _cli_tokens(artifact: str, capsys: pytest.CaptureFixture[str], flags: list[str]) -> list[int]:
    import json

    from ninfer import cli

    argv = ["generate", artifact, "--prompt-ids", ",".join(map(str, _PROMPT)), "--max-new", "20", "--json"]
    assert cli.main(argv + flags) == 0
    return json.loads(capsys.readouterr().out)["token_ids"]


def _served(a: EngineActor, sampling: dict) -> list[int]:
    s = SamplingOptions(max_tokens=20, **sampling)  # what is left out: the artifact's defaults
    evs = asyncio.run(collect(a, GenerateRequest(request_id="cli", prompt_ids=_PROMPT, sampling=s)))
    assert isinstance(evs[-1], Finish)
    return [t for e in evs if isinstance(e, TokenDelta) for t in e.token_ids]


@pytest.mark.parametrize(("kw", "field"), [({"temperature": -0.5}, "temperature"), ({"top_k": -1}, "top_k")])
def test_a_ray_request_with_a_negative_setting_is_a_400_naming_it(
    actor: EngineActor, kw: dict, field: str
) -> None:
    """A Python job's request reaches the actor without the HTTP range checks: the engine's refusal comes back
    as the 400 ``Failed`` the API answers in the protocol's shape, naming the field."""
    s = SamplingOptions(max_tokens=4, **kw)
    evs = asyncio.run(collect(actor, GenerateRequest(request_id="neg", prompt_ids=(1, 2, 3), sampling=s)))
    assert len(evs) == 1 and isinstance(evs[0], Failed)
    assert (evs[0].status, evs[0].param) == (400, field) and field in evs[0].message


def test_the_finish_is_not_held_back_by_the_stream_interval(artifact: str) -> None:
    """Items are at most one per ``stream_interval_s``, but a request's last items (its Finish) go out as soon as
    the engine finishes it: a short request ends long before one interval has passed."""
    import time

    cfg = EngineConfig(max_concurrency=1, queue_depth=1, max_context=512, kv_capacity=4096)
    a = EngineActor(ActorSpec(artifact=artifact, backend="reference", engine=cfg, stream_interval_s=2.0))
    try:
        asyncio.run(collect(a, req("warm", 2)))
        t0 = time.perf_counter()
        evs = asyncio.run(collect(a, req("short", 4)))
        took = time.perf_counter() - t0
    finally:
        asyncio.run(a.shutdown())
    assert isinstance(evs[-1], Finish) and evs[-1].usage.completion_tokens == 4
    assert len([e for e in evs if isinstance(e, TokenDelta)]) >= 1
    assert took < 1.0, f"the stream took {took:.2f} s: the Finish waited for the 2 s interval"


def test_items_carry_the_accepted_with_the_first_token_and_the_last_delta_with_the_finish(
    artifact: str,
) -> None:
    """Fewer Ray items: the first item is ``Accepted`` plus the first token (when it comes within an interval),
    the last one the final delta plus the ``Finish``; a queued request's ``Accepted`` goes alone, at once."""
    cfg = EngineConfig(max_concurrency=1, queue_depth=1, max_context=512, kv_capacity=4096)
    opts = {"step_s": 0.002}  # the interval's pause ends only with the Finish: then every event is in
    a = EngineActor(
        ActorSpec(artifact=artifact, backend="null", engine=cfg, backend_options=opts, stream_interval_s=1.0)
    )

    async def items(gen: object) -> list[list[object]]:
        return [decode_events(raw) async for raw in gen]  # type: ignore[attr-defined]

    async def scenario() -> tuple[list[list[object]], list[list[object]]]:
        return tuple(await asyncio.gather(items(a.generate(req("a", 40))), items(a.generate(req("b", 4)))))  # type: ignore[return-value]

    try:
        first, queued = asyncio.run(scenario())
    finally:
        asyncio.run(a.shutdown())
    assert [type(e) for e in first[0]] == [Accepted, TokenDelta] and not first[0][0].queued
    assert [[type(e) for e in item] for item in first[1:]] == [[TokenDelta, Finish]]
    assert [type(e) for e in queued[0]] == [Accepted] and queued[0][0].queued
    for its in (first, queued):
        evs = [e for item in its for e in item]
        n = sum(len(e.token_ids) for e in evs if isinstance(e, TokenDelta))
        assert isinstance(evs[-1], Finish) and n == evs[-1].usage.completion_tokens


def test_the_apis_requests_share_one_event_stream(actor: EngineActor) -> None:
    """The API's client opens each request with ``open`` and gets every request's events on one ``subscribe``
    stream: the same events, tokens and refusals as ``generate``, in fewer items."""
    from ninfer.actors.client import AsyncEngineClient
    from ninfer.perf.request_path import _Remote

    client = AsyncEngineClient(_Remote(actor))

    async def one(r: GenerateRequest) -> list[object]:
        return [ev async for ev in client.generate(r)]

    async def scenario() -> list[list[object]]:
        return list(await asyncio.gather(*(one(req(f"m{i}", 12)) for i in range(3))))

    outs = asyncio.run(scenario())
    solo = asyncio.run(collect(actor, req("solo", 12)))
    ids = [t for e in solo if isinstance(e, TokenDelta) for t in e.token_ids]
    for evs in outs:
        assert (
            isinstance(evs[0], Accepted) and isinstance(evs[-1], Finish) and evs[-1].reason == "output_limit"
        )
        assert [
            t for e in evs if isinstance(e, TokenDelta) for t in e.token_ids
        ] == ids  # greedy, same prompt
    bad = asyncio.run(one(GenerateRequest(request_id="bad", prompt_ids=(10**9,))))
    assert len(bad) == 1 and isinstance(bad[0], Failed) and bad[0].status == 400
    assert asyncio.run(actor.stats()).open_streams == 0


def test_requests_opened_in_one_loop_turn_share_one_open_call(actor: EngineActor) -> None:
    """A burst's requests cross as one ``open`` call (msgpack bytes), answered in order, one refusal among them
    its own; a prompt that renders on a thread goes alone (its answer would hold up the others'); a lone request
    later is a call of its own; every request still gets its whole stream."""
    from ninfer.actors.client import AsyncEngineClient
    from ninfer.perf.request_path import _Remote

    calls: list[object] = []

    class Counting(_Remote):
        def __getattr__(self, name: str) -> object:
            method = super().__getattr__(name)
            if name != "open":
                return method
            return type(method)(remote=lambda raw, sub: (calls.append(raw), method.remote(raw, sub))[1])

    client = AsyncEngineClient(Counting(actor))

    async def one(r: GenerateRequest) -> list[object]:
        return [ev async for ev in client.generate(r)]

    async def scenario() -> tuple[list[list[object]], list[object]]:
        long = req("long", 6, messages=({"role": "user", "content": "word " * 4000},))
        burst = [req("b0", 6), GenerateRequest(request_id="bad", prompt_ids=(10**9,)), req("b1", 6), long]
        outs = list(await asyncio.gather(*(one(r) for r in burst)))
        return outs, await one(req("alone", 6))

    outs, alone = asyncio.run(scenario())
    assert all(isinstance(c, bytes) for c in calls)
    # the long prompt at once and alone, the rest of the burst at the end of the loop's turn, then the lone one
    assert [[r.request_id for r in decode_requests(c)] for c in calls] == [
        ["long"],
        ["b0", "bad", "b1"],
        ["alone"],
    ]  # type: ignore[arg-type]
    assert isinstance(outs[3][-1], Failed) and outs[3][-1].code == "context_length_exceeded"
    for evs in (outs[0], outs[2], alone):
        assert isinstance(evs[0], Accepted) and isinstance(evs[-1], Finish)
        assert sum(len(e.token_ids) for e in evs if isinstance(e, TokenDelta)) == 6
    assert len(outs[1]) == 1 and isinstance(outs[1][0], Failed) and outs[1][0].status == 400
    assert asyncio.run(actor.stats()).open_streams == 0


def test_open_takes_a_request_that_msgpack_cannot_carry(actor: EngineActor) -> None:
    """An integer beyond 64 bits in a JSON value (a template variable here) does not fit msgpack: that call
    carries the requests themselves (Ray pickles them) and they run as any other."""
    big = req("big", 4, template_kwargs={"note": 2**70})
    raw = encode_requests([big])
    assert raw == [big]
    sub = "s-big"

    async def scenario() -> list[list[object]]:
        events = actor.subscribe(sub)
        got = decode_opened(await actor.open(raw, sub))
        async for item in events:
            if any(isinstance(e, Finish) for _, evs in decode_batch(item) for e in evs):
                break
        await events.aclose()
        return got

    got = asyncio.run(scenario())
    assert len(got) == 1 and isinstance(got[0][0], Accepted)
    bad = decode_opened(asyncio.run(actor.open(b"\x93not a request list", "s-bad")))
    assert isinstance(bad[0][0], Failed) and bad[0][0].code == "invalid_request"


def test_a_consumer_that_leaves_the_event_stream_frees_its_lane(actor: EngineActor) -> None:
    from ninfer.actors.client import AsyncEngineClient
    from ninfer.perf.request_path import _Remote

    client = AsyncEngineClient(_Remote(actor))

    async def scenario() -> None:
        gen = client.generate(req("left", 400))
        assert isinstance(await anext(gen), Accepted)
        await anext(gen)
        await gen.aclose()  # the API's handler went away without a cancel of its own
        for _ in range(100):
            if (await actor.stats()).lanes_busy == 0:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("lane still busy 1 s after the consumer left")

    asyncio.run(scenario())
