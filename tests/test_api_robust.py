"""The HTTP app in-process (ASGI, a scripted engine backend): 5xx are logged and counted, deep JSON is a 400,
body limits answer in the path's error shape, attribution keeps claims apart, and the drain refuses new work."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import finish_event
from ninfer.actors.messages import ActorStats, Failed, GenerateRequest, Health, StreamEvent
from ninfer.api.app import build_app
from ninfer.api.auth import parse_keys
from ninfer.api.config import ServerConfig
from ninfer.api.gate import Drain
from ninfer.api.openai_chat import ChatLimits
from ninfer.api.reqlog import RequestLog
from ninfer.api.service import Service
from ninfer.api.validation import MAX_JSON_DEPTH, value_depth

from ninfer.engine.core import Accepted, TokenDelta

MODEL = "ninfer-demo"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MSGS = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Scripted:
    """An EngineBackend that answers every generate with ``script(greq)``'s events."""

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.cancelled: list[str] = []
        self.script: Any = lambda greq: [Accepted(request_id=0, prompt_tokens=3, max_tokens=4, queued=False),
                                      TokenDelta(0, [5], "x"), _fin()]  # fmt: skip

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        self.requests.append(req)
        for ev in self.script(req):
            if isinstance(ev, BaseException):
                raise ev
            if isinstance(ev, float):
                await asyncio.sleep(ev)
                continue
            yield ev

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def stats(self) -> ActorStats:
        return ActorStats(lanes_total=1, lanes_busy=0, queue_len=0, queue_depth=1, open_streams=0,
                          engine_failures=0, uptime_s=1.0)  # fmt: skip

    async def health(self) -> Health:
        return Health(ok=True)

    async def count_tokens(self, req: GenerateRequest) -> int | Failed:
        return 7


def _fin() -> Any:
    return finish_event("output_limit", 3, 0, 1)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    cfg = ServerConfig(artifact="a.ninfer", max_request_mib=1, body_timeout_s=0.3)
    backend = Scripted()
    log = RequestLog(tmp_path / "req.jsonl")
    svc = Service(config=cfg, backend=backend, limits=ChatLimits(MODEL, 4096, 16), reqlog=log,
                  drain=Drain(0.2))  # fmt: skip
    keys = parse_keys("alice:sk-alice\nsk-unnamed\n")
    yield {
        "app": build_app(svc, keys),
        "svc": svc,
        "backend": backend,
        "log": log,
        "path": tmp_path / "req.jsonl",
    }
    log.close()


AUTH = {"x-api-key": "sk-alice"}


def call(env: dict[str, Any], method: str, path: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=env["app"], client=("10.0.0.9", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            kw["headers"] = {**AUTH, **kw.get("headers", {})}
            return await c.request(method, path, timeout=10, **kw)

    return asyncio.run(go())


def metric(env: dict[str, Any], prefix: str) -> float:
    text = call(env, "GET", "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def records(env: dict[str, Any]) -> list[dict[str, Any]]:
    env["log"].close()
    return [json.loads(x) for x in env["path"].read_text().splitlines()]


# ---- every 5xx is logged and counted --------------------------------------------------------------------
def test_an_unexpected_exception_is_a_logged_and_counted_500(env, caplog) -> None:
    env["backend"].script = lambda greq: [RuntimeError("boom")]
    with caplog.at_level(logging.ERROR, logger="ninfer.api"):
        r = call(env, "POST", "/v1/chat/completions", json=CHAT)
        a = call(env, "POST", "/v1/messages", json=MSGS)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert a.status_code == 500 and a.json() == {"type": "error", "error": {"type": "api_error",
                                                                           "message": "internal error: RuntimeError"}}  # fmt: skip
    assert "RuntimeError: boom" in caplog.text  # the traceback, not just a status line
    assert metric(env, 'ninfer_server_errors_total{endpoint="chat_completions",code="internal_error"}') == 1
    assert metric(env, 'ninfer_server_errors_total{endpoint="messages",code="internal_error"}') == 1


def test_engine_failures_before_and_during_a_stream_are_counted(env, caplog) -> None:
    gone = Failed(code="engine_unavailable", message="the engine actor failed: RayActorError", status=503)
    env["backend"].script = lambda greq: [gone]
    with caplog.at_level(logging.ERROR, logger="ninfer.api"):
        r = call(env, "POST", "/v1/chat/completions", json=CHAT)
        acc = Accepted(request_id=0, prompt_tokens=3, max_tokens=4, queued=False)
        env["backend"].script = lambda greq: [
            acc,
            TokenDelta(0, [5], "x"),
            Failed(code="engine_error", message="bad"),
        ]
        s = call(env, "POST", "/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 503
    assert s.status_code == 200 and '"code":"engine_error"' in s.text
    assert metric(env, "ninfer_server_errors_total") == 2
    assert "engine_unavailable" in caplog.text and "engine_error" in caplog.text


# ---- nesting ----------------------------------------------------------------------------------------------
def _list(n: int) -> str:
    return "[" * n + "]" * n


def _schema(n: int) -> str:
    return '{"type": "object", "properties": {"a": ' * n + "{}" + "}}" * n


def _body(base: dict, key: str, raw: str) -> str:
    """``base`` as JSON with ``"@"`` (the value of ``key`` somewhere inside) replaced by the raw JSON ``raw``."""
    return json.dumps(base).replace(f'"{key}": "@"', f'"{key}": {raw}')


_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "@"}}
DEEP = [
    ("/v1/chat/completions", _body({**CHAT, "chat_template_kwargs": {"x": "@"}}, "x", _list(1000))),
    (
        "/v1/chat/completions",
        _body(
            {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": "@"}}]},
            "parameters",
            _schema(150),
        ),
    ),  # fmt: skip
    # arguments are a JSON string: only the parsed history shows the depth
    (
        "/v1/chat/completions",
        _body(
            {
                **CHAT,
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_CALL]}],
            },
            "arguments",
            json.dumps(_schema(300)),
        ),
    ),  # fmt: skip
    (
        "/v1/messages",
        _body({**MSGS, "tools": [{"name": "f", "input_schema": "@"}]}, "input_schema", _schema(400)),
    ),
    ("/v1/messages/count_tokens", _body({**MSGS, "metadata": {"x": "@"}}, "x", _list(900))),
    (
        "/v1/responses",
        _body(
            {
                "model": MODEL,
                "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "@"}],
            },
            "arguments",
            json.dumps(_schema(120)),
        ),
    ),  # fmt: skip
]


@pytest.mark.parametrize(("path", "raw"), DEEP)
def test_deep_json_is_a_400_in_the_protocols_shape(env, path: str, raw: str) -> None:
    r = call(env, "POST", path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    err = r.json()
    if path.startswith("/v1/messages"):
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert "nest" in err["error"]["message"]
    else:
        assert err["error"]["code"] == "nesting_too_deep"
    assert env["backend"].requests == []  # refused before it reached the engine


def test_value_depth_counts_containers_and_structs() -> None:
    assert value_depth({"a": "[[[[{{{{", "b": [[1], {"c": "]]]"}]}, 100) == 3  # strings are not containers
    assert value_depth(Failed(code="x", message="y"), 100) == 1
    deep: Any = []
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = [deep]
    assert value_depth(deep, MAX_JSON_DEPTH) == MAX_JSON_DEPTH + 1  # stops counting past the limit
    assert value_depth(("x", 1, None), 5) == 1 and value_depth("x", 5) == 0


# ---- body limits in the path's shape ---------------------------------------------------------------------
def _chunks(total: int) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        yield b'{"model": "x", "pad": "'
        for _ in range(total // 65536):
            yield b"y" * 65536
        yield b'"}'

    return gen()


def test_chunked_body_over_the_cap_answers_in_the_paths_shape(env) -> None:
    a = call(env, "POST", "/v1/messages", content=_chunks(2 << 20))
    assert a.status_code == 413, a.text
    assert a.json()["type"] == "error" and a.json()["error"]["type"] == "request_too_large"
    o = call(env, "POST", "/v1/chat/completions", content=_chunks(2 << 20))
    assert o.status_code == 413 and o.json()["error"]["code"] == "request_too_large"


def test_the_configured_body_cap_is_the_only_one(tmp_path: Path) -> None:
    """Litestar's own 10 MB cap refused bodies under --max-request-mib with a bare "Request Entity Too Large"."""
    cfg = ServerConfig(artifact="a.ninfer", max_request_mib=16)
    svc = Service(config=cfg, backend=Scripted(), limits=ChatLimits(MODEL, 4096, 16), reqlog=None,
                  drain=Drain(0.2))  # fmt: skip
    env = {"app": build_app(svc, parse_keys("alice:sk-alice\n"))}
    body = json.dumps({**MSGS, "pad": "x" * (12 << 20)}).encode()
    for path in ("/v1/messages", "/v1/chat/completions"):
        r = call(env, "POST", path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text[:300]
    r = call(
        env,
        "POST",
        "/v1/messages",
        content=body + b" " * (5 << 20),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413 and "16 MiB" in r.json()["error"]["message"]


def test_a_slow_body_is_a_408_at_the_body_deadline(tmp_path: Path) -> None:
    """Every piece within the per-read timeout, the whole past the deadline: 408, and the connection closes."""
    cfg = ServerConfig(artifact="a.ninfer", body_timeout_s=0.5, body_deadline_s=1.0)
    svc = Service(config=cfg, backend=Scripted(), limits=ChatLimits(MODEL, 4096, 16), reqlog=None,
                  drain=Drain(0.2))  # fmt: skip
    env = {"app": build_app(svc, parse_keys("alice:sk-alice\n"))}

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"model": "'
        for _ in range(20):
            await asyncio.sleep(0.2)
            yield b"x"
        yield b'"}'

    for path in ("/v1/messages", "/v1/responses"):
        r = call(env, "POST", path, content=trickle())
        assert r.status_code == 408 and r.headers["connection"] == "close", r.text
        assert "did not arrive within 1 s" in r.text


def test_a_stalled_body_is_a_408(env) -> None:
    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"model": "'
        await asyncio.sleep(2)
        yield b'x"}'

    r = call(env, "POST", "/v1/messages", content=stalled())
    assert r.status_code == 408 and r.json()["error"]["type"] == "invalid_request_error"
    assert "no request body data" in r.json()["error"]["message"]


# ---- attribution ------------------------------------------------------------------------------------------
def test_client_names_come_from_keys_and_claims_are_logged_apart(env) -> None:
    spoof = {"x-api-key": "sk-unnamed", "x-client-name": "alice"}
    assert (
        call(env, "POST", "/v1/chat/completions", json={**CHAT, "user": "bob"}, headers=spoof).status_code
        == 200
    )
    assert (
        call(env, "POST", "/v1/chat/completions", json=CHAT, headers={"x-client-name": "carol"}).status_code
        == 200
    )
    assert call(env, "POST", "/v1/messages", json=MSGS, headers=spoof).status_code == 200
    assert [g.client for g in env["backend"].requests] == ["key#2", "alice", "key#2"]
    done = [r["request"] for r in records(env) if r["event"] == "request_done"]
    assert [(d["client"], d["client_claim"]) for d in done] == [("key#2", "bob"), ("alice", "carol"),
                                                                  ("key#2", "alice")]  # fmt: skip


# ---- cancelled requests and count_tokens are logged ------------------------------------------------------
def test_count_tokens_and_failures_are_logged_with_tokens_and_timings(env) -> None:
    assert call(env, "POST", "/v1/messages/count_tokens", json=MSGS).json() == {"input_tokens": 7}
    acc = Accepted(request_id=0, prompt_tokens=3, max_tokens=4, queued=False)
    env["backend"].script = lambda greq: [
        acc,
        TokenDelta(0, [5, 6], "ab"),
        Failed(code="engine_error", message="bad"),
    ]
    call(env, "POST", "/v1/chat/completions", json=CHAT)
    recs = records(env)
    (count,) = [r for r in recs if r["event"] == "count_tokens"]
    assert count["result"] == {"input_tokens": 7} and count["request"]["client"] == "alice"
    assert count["timings_seconds"]["total"] >= 0
    (err,) = [r for r in recs if r["event"] == "request_error"]
    assert err["result"] == {"prompt_tokens": 3, "completion_tokens": 2}
    assert err["timings_seconds"]["ttft"] is not None and err["timings_seconds"]["total"] > 0


# ---- drain ------------------------------------------------------------------------------------------------
def test_drain_refuses_new_requests_and_ends_running_ones(env) -> None:
    svc, backend = env["svc"], env["backend"]
    acc = Accepted(request_id=0, prompt_tokens=3, max_tokens=4, queued=False)
    backend.script = lambda greq: [acc, TokenDelta(0, [5], "x"), 30.0, _fin()]  # stalls after one token

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=env["app"])
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
            running = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, timeout=10))
            await asyncio.sleep(0.2)
            drain = asyncio.ensure_future(svc.drain.run())
            await asyncio.sleep(0.05)
            refused = await c.post("/v1/messages", json=MSGS)
            health = await c.get("/health")
            await drain
            return refused, health, await running, await c.get("/metrics")

    refused, health, running, metrics = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["type"] == "error"  # Anthropic's shape under /v1/messages
    assert health.status_code == 503 and health.json()["status"] == "draining"
    assert running.status_code == 503 and running.json()["error"]["code"] == "shutting_down"
    assert backend.cancelled  # the engine request was cancelled
    for endpoint in ("messages", "chat_completions"):  # the refusal and the ended request
        assert f'ninfer_server_errors_total{{endpoint="{endpoint}",code="shutting_down"}} 1' in metrics.text
    err = [r for r in records(env) if r["event"] == "request_error"]
    assert err[-1]["error"]["outcome"] == "shutting_down" and err[-1]["result"]["completion_tokens"] == 1


# ---- a client that stops reading ----------------------------------------------------------------------------
def _stalled_stream(tmp_path: Path, stall_after: int | None) -> tuple[Scripted, list[dict[str, Any]], float]:
    """A streamed chat request whose client takes ``stall_after`` body chunks and then none (None: all of them),
    against a server with a 0.3 s send timeout and an answer of 40 tokens over ~2 s: (the backend, the request log,
    seconds until the backend saw a cancel or the answer ended)."""
    cfg = ServerConfig(artifact="a.ninfer", send_timeout_s=0.3)
    backend, log = Scripted(), RequestLog(tmp_path / "req.jsonl")
    acc = Accepted(request_id=0, prompt_tokens=3, max_tokens=40, queued=False)
    backend.script = lambda greq: (
        [acc]
        + [x for i in range(40) for x in (0.05, TokenDelta(0, [5], f"t{i} "))]
        + [finish_event("output_limit", 3, 0, 40)]
    )
    svc = Service(
        config=cfg, backend=backend, limits=ChatLimits(MODEL, 4096, 16), reqlog=log, drain=Drain(0.2)
    )
    app = build_app(svc, None)
    body = json.dumps({**CHAT, "max_tokens": 40, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"t"), (b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("10.0.0.9", 4242), "server": ("t", 80)}  # fmt: skip

    async def scenario() -> float:
        sent, never = 0, asyncio.Event()
        got_body = False

        async def receive() -> dict[str, Any]:
            nonlocal got_body
            if not got_body:
                got_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # the client neither sends more nor hangs up
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            nonlocal sent
            if msg["type"] == "http.response.body" and msg.get("body"):
                sent += 1
                if stall_after is not None and sent > stall_after:
                    await never.wait()  # the connection's buffers are full: the server's send blocks

        t0 = time.monotonic()
        task = asyncio.ensure_future(app(scope, receive, send))
        while not backend.cancelled and not task.done() and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.02)
        took = time.monotonic() - t0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return took

    took = asyncio.run(scenario())
    log.close()
    return backend, [json.loads(x) for x in (tmp_path / "req.jsonl").read_text().splitlines()], took


def test_a_client_that_stops_reading_frees_its_lane(tmp_path: Path) -> None:
    backend, recs, took = _stalled_stream(tmp_path, stall_after=3)
    assert (
        len(backend.cancelled) == 1 and took < 1.5
    )  # cancelled ~0.3 s after the stall, not after the ~2 s answer
    err = [r for r in recs if r["event"] == "request_error"]
    assert err and err[-1]["error"] == {
        "message": "the client took no data for 0.3 s",
        "outcome": "cancelled",
    }


def test_a_client_that_reads_is_never_cancelled_by_the_send_timeout(tmp_path: Path) -> None:
    backend, recs, took = _stalled_stream(tmp_path, stall_after=None)  # 2 s of tokens, each taken at once
    assert backend.cancelled == [] and took > 1.5
    assert [r["event"] for r in recs][-1] == "request_done"
