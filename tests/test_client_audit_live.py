"""A fourth audit from the outside clients' side, against a live `ninfer serve` (demo artifact, reference backend,
an API key and a request log): raw HTTP and the official SDKs; each test failed before its fix
(docs/protocols.md §3-§6, docs/serving.md "Hostile and heavy input").
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("xgrammar")

from test_api_live import Server, demo_server  # noqa: E402
from test_hostile_live import AUTH, CHAT, KEY, MODEL, MSGS, RESP, _shape  # noqa: E402

COUNT = MSGS + "/count_tokens"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("client-audit")
    (tmp / "keys.txt").write_text(f"tester:{KEY}\n")
    args = ["--max-context", "4096", "--kv-capacity", "32768", "--max-concurrency", "2",
            "--api-key-file", str(tmp / "keys.txt"), "--request-log-jsonl", str(tmp / "req.jsonl"),
            "--cors"]  # fmt: skip
    with demo_server(tmp, "client-audit", args) as s:
        s.reqlog = tmp / "req.jsonl"  # type: ignore[attr-defined]
        yield s


# ---- a field of the wrong JSON type is a 400 naming it, never a 500 -------------------------------------------
_TOOL = {"type": "object", "properties": {"a": {"type": "integer"}}}
_BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters": _TOOL}}],
           "tool_choice": {"type": "function", "function": {"name": "f"}},
           "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}},
    MSGS: {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
           "tools": [{"name": "f", "input_schema": _TOOL}], "tool_choice": {"type": "tool", "name": "f"},
           "thinking": {"type": "disabled"},
           "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
    RESP: {"model": MODEL, "max_output_tokens": 4, "input": "hi", "reasoning": {"effort": "low"},
           "tools": [{"type": "function", "name": "f", "parameters": _TOOL}],
           "tool_choice": {"type": "function", "name": "f"},
           "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}},
}  # fmt: skip
_BODIES[COUNT] = _BODIES[MSGS]


def _starts(s: Server) -> int:
    """How many requests the server's request log says were admitted."""
    lines = s.reqlog.read_text().splitlines()  # type: ignore[attr-defined]
    return sum(json.loads(line)["event"] == "request_start" for line in lines if line)


def _set(body: dict[str, Any], where: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node = out
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return out


_AUTO = {CHAT: "auto", MSGS: {"type": "auto"}, COUNT: {"type": "auto"}, RESP: "auto"}
_WRONG_TYPES = [  # (path, field, value, whether the tool choice is auto: the tools' schemas are then not checked)
    (CHAT, ("tool_choice", "function", "name"), ["f"], False),
    (CHAT, ("tools", 0, "function", "parameters", "properties"), "a", True),
    (CHAT, ("response_format", "json_schema", "schema", "type"), {"type": "object"}, False),
    (CHAT, ("response_format", "json_schema", "schema"), {"type": "string", "format": ["uuid"]}, False),
    (MSGS, ("thinking", "type"), ["disabled"], False),
    (MSGS, ("tool_choice", "type"), {"type": "auto"}, False),
    (MSGS, ("tool_choice", "name"), {"name": "f"}, False),
    (MSGS, ("tools", 0, "input_schema", "properties"), [1], True),
    (MSGS, ("output_config", "format", "schema", "type"), [{}], False),
    (MSGS, ("output_config", "effort"), ["low"], False),
    (COUNT, ("thinking", "type"), {}, False),
    (COUNT, ("tool_choice", "type"), [None], False),
    (RESP, ("reasoning", "effort"), [], False),
    (RESP, ("tool_choice", "name"), {"a": 1}, False),
    (RESP, ("tools", 0, "parameters", "properties"), 3, True),
    (RESP, ("text", "format", "schema", "type"), {}, True),
]


@pytest.mark.parametrize(("path", "where", "value", "auto"), _WRONG_TYPES)
@pytest.mark.parametrize("stream", [False, True])
def test_a_field_of_the_wrong_json_type_is_a_400(
    server: Server, path: str, where: tuple[Any, ...], value: Any, auto: bool, stream: bool
) -> None:
    """An array or object where a string belongs (a membership test on an unhashable value), or tool parameters
    whose ``properties`` is not an object (read by the output parser after the model ran, the request already
    admitted), were 500s; a 400 in the path's shape now, before anything is admitted."""
    body = _set(_BODIES[path], where, value) | ({"stream": True} if stream and path != COUNT else {})
    if auto:
        body["tool_choice"] = _AUTO[path]
    started = _starts(server)
    r = httpx.post(server.url + path, json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400, (where, r.text[:300])
    err = _shape(path, r)
    named = ".".join(str(k) for k in where if not isinstance(k, int))
    assert named.split(".")[-1] in (err["message"] + str(err.get("param"))), err
    time.sleep(0.2)  # the request log's writer thread
    assert _starts(server) == started  # nothing ran on the model


@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
def test_a_bad_output_format_is_refused_also_beside_a_forced_tool_call(server: Server, path: str) -> None:
    """The forced call's grammar wins over the output format, but the format is still checked, as it is in chat
    and Anthropic: Responses accepted an unsupported ``text.format`` schema whenever a tool call was forced."""
    fmt = {"type": "object", "oneOf": [{"type": "object"}]}
    where = {CHAT: ("response_format", "json_schema", "schema"), MSGS: ("output_config", "format", "schema"),
             RESP: ("text", "format", "schema")}[path]  # fmt: skip
    r = httpx.post(server.url + path, json=_set(_BODIES[path], where, fmt), headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text[:300]
    assert "oneOf" in _shape(path, r)["message"]


def _sdk_headers() -> set[str]:
    """The headers the official SDKs send with a request, as their clients build them (a browser asks to send the
    same in its preflight), with the ones they add per attempt and the browser opt-in of Anthropic's SDK."""
    import anthropic
    import openai

    names = set(openai.OpenAI(api_key="k", base_url="http://h/v1").default_headers)
    names |= set(anthropic.Anthropic(api_key="k", base_url="http://h").default_headers)
    names |= {
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "anthropic-dangerous-direct-browser-access",
    }
    return {n.lower() for n in names} - {"accept", "user-agent"}  # safelisted, or set by the browser itself


@pytest.mark.parametrize("path", [CHAT, MSGS, "/v1/models"])
def test_a_browser_preflight_allows_every_header_the_sdks_send(server: Server, path: str) -> None:
    """``--cors`` allowed a fixed list of headers; the SDKs send their own (X-Stainless-*, OpenAI-Organization,
    anthropic-dangerous-direct-browser-access), so a browser refused every SDK request after its preflight. And a
    page could not read Retry-After (not exposed), so the SDKs' retries could not honour it."""
    asked = sorted(_sdk_headers() | {"x-api-key"})
    r = httpx.options(server.url + path, timeout=30, headers={"Origin": "http://page.example",
                      "Access-Control-Request-Method": "POST",
                      "Access-Control-Request-Headers": ", ".join(asked)})  # fmt: skip
    assert r.status_code == 204, r.text
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert set(asked) <= allowed, set(asked) - allowed
    assert r.headers["access-control-allow-origin"] == "*"
    r = httpx.get(server.url + "/v1/models", headers={**AUTH, "Origin": "http://page.example"}, timeout=30)
    assert "retry-after" in r.headers["access-control-expose-headers"].lower()
    assert (
        "x-stainless-os" not in r.headers["access-control-allow-headers"].lower()
    )  # only what a preflight asks


def test_a_body_of_a_million_small_messages_does_not_stall_other_clients(server: Server) -> None:
    """Half a million empty messages (15 MB, far below the body cap) took seconds of Python on the API's event loop
    — decoding, measuring the nesting twice, translating, counting its characters to pick the actor's path — and
    every other client of the process waited as long (8 s for a million). Large bodies are now prepared on a
    worker thread and the character count stops at the inline bound."""
    body = json.dumps(
        {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": ""}] * 500_000}
    )
    waits: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(headers=AUTH, timeout=60) as c:
            while not done.is_set():
                t = time.perf_counter()
                assert c.get(server.url + "/v1/models").status_code == 200
                waits.append(time.perf_counter() - t)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        time.sleep(0.3)
        r = httpx.post(server.url + CHAT, content=body.encode(), headers=AUTH, timeout=120)
    finally:
        done.set()
        prober.join()
    assert r.status_code == 400 and _shape(CHAT, r)["code"] == "context_length_exceeded", r.text[:300]
    assert len(waits) > 10 and max(waits) < 1.5, max(waits)


def test_a_million_messages_do_not_stall_the_actor(server: Server) -> None:
    """A Python job's request of a million messages (content: a list of one text part), sent straight to the actor
    from its own process, while a stream runs through the API and /health is probed. The actor unpickled the
    request on its event loop, and built it under the garbage collector's full collections: the stream stopped
    4.3-5.7 s and /health waited as long. Now it is decoded, checked and freed on the actor's prompt pool, in short
    steps with the collector paused (actors/prepare.py): 0.13-0.17 s (python -m ninfer.perf.bench_stall --via job
    --shape parts). The request still gets its 400."""
    from ninfer.perf.bench_stall import job_sender, measure

    send = job_sender(ray.get_runtime_context().gcs_address, server.actor, 1_000_000, "parts")
    res = measure(server.url, send, stream_tokens=4000, headers=AUTH)
    assert (res["status"], res["code"]) == (400, "context_length_exceeded"), res
    during = res["during"]
    assert during["chunks"] > 10, res  # the stream ran throughout
    assert during["max_gap_s"] < 1.5 and during["max_health_s"] < 1.5, res
