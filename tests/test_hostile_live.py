"""Hostile and careless clients against a live `ninfer serve` (demo artifact, reference backend, one server).

What outside clients do that well-behaved SDK calls do not: raw sockets with broken HTTP, HEAD probes, bodies that
are not JSON or not UTF-8, lone surrogates, absurd numbers, every content-part type, schemas XGrammar refuses,
raw SSE readers that check every frame, clients that hang up mid-stream or while queued, bursts past the queue.
Every answer must be in the protocol's own error shape and the server must keep serving (docs/protocols.md §3,
docs/serving.md "Hostile and heavy input").
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("xgrammar")

from test_api_live import Server, demo_server  # noqa: E402

MODEL = "ninfer-demo"
KEY = "sk-hostile-7d1f0c2a9b"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT, MSGS, RESP = "/v1/chat/completions", "/v1/messages", "/v1/responses"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 lanes, a queue of 2, a 1 MiB body cap, short head/body deadlines and an API key."""
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "keys.txt").write_text(f"tester:{KEY}\n")
    args = ["--max-context", "4096", "--kv-capacity", "32768", "--max-concurrency", "2", "--queue-depth",
            "2", "--max-request-mib", "1", "--header-timeout-s", "2", "--body-timeout-s", "2",
            "--api-key-file", str(tmp / "keys.txt"), "--request-log-jsonl", str(tmp / "req.jsonl")]  # fmt: skip
    with demo_server(tmp, "hostile", args) as s:
        yield s
        assert KEY not in s.log() and KEY not in (tmp / "req.jsonl").read_text()  # keys are never logged


def _raw(s: Server, data: bytes, timeout: float = 10) -> bytes:
    """Send bytes on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", s.port), timeout=timeout) as c:
        c.sendall(data)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def _shape(path: str, r: httpx.Response) -> dict[str, Any]:
    """The error body of ``r`` checked against the shape of ``path``'s protocol; returns the inner error."""
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    if path.startswith(MSGS):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"], body
    return body["error"]


def _metric(s: Server, name: str) -> float:
    text = httpx.get(s.url + "/metrics", headers=AUTH).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _idle(s: Server, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _metric(s, "ninfer_lanes_busy") == 0 and _metric(s, "ninfer_queue_length") == 0:
            return True
        time.sleep(0.1)
    return False


# ---- defects found by the audit (each failed before its fix) ------------------------------------------------
def test_head_is_get_without_a_body(server: Server) -> None:
    """Health probes and `curl -I` send HEAD; it was a 405 on every route."""
    r = httpx.head(server.url + "/health")
    assert r.status_code == 200 and r.content == b"" and r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(httpx.get(server.url + "/health").content)
    assert httpx.head(server.url + "/v1/models", headers=AUTH).status_code == 200
    assert httpx.head(server.url + "/v1/models").status_code == 401  # still behind the key
    assert httpx.head(server.url + CHAT, headers=AUTH).status_code == 405  # POST-only routes stay POST-only


@pytest.mark.parametrize("path", [CHAT, MSGS])
@pytest.mark.parametrize(
    "head",
    [b"Content-Length: -5", b"Content-Length: 99999999999999999999999", b"Bad Header Name: x"],
    ids=["negative-length", "absurd-length", "bad-header"],
)
def test_unparseable_http_is_a_json_400(server: Server, head: bytes, path: str) -> None:
    """uvicorn answered these with a text/plain 400; a JSON client then failed on the body, not the status.
    The request line still names the path, and with it the protocol's error shape (it was OpenAI's on both)."""
    out = _raw(server, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\n{}")
    status, _, rest = out.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400"), out[:200]
    assert b"content-type: application/json" in headers.lower()
    r = httpx.Response(400, headers={"content-type": "application/json"}, content=body)
    err = _shape(path, r)
    assert err["type"] == "invalid_request_error" and "malformed HTTP request" in err["message"]
    if path == CHAT:
        assert err["code"] == "bad_http_request"
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conversation", "conv_1"),
        ("conversation", {"id": "conv_1"}),
        ("prompt", {"id": "p"}),
        ("background", True),
    ],
)
def test_responses_refuses_fields_that_need_stored_state(server: Server, field: str, value: Any) -> None:
    """Like previous_response_id: ignoring them answered without the stored context the client meant (and
    ``background: true``, whose result is polled from a stored response, ran in the foreground)."""
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, field: value}
    r = httpx.post(server.url + RESP, json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, r.text
    err = _shape(RESP, r)
    assert err["param"] == field and err["code"] == "unsupported_field"


def test_responses_store_is_answered_and_nothing_is_kept(server: Server) -> None:
    """OpenAI stores responses by default (``store`` true): the answer is complete without storing it, so
    ``store`` is accepted; retrieving, cancelling or deleting a response is a 404 that says nothing is stored
    (it was Litestar's bare "Not Found"); ``background`` true is refused through the SDK too."""
    import openai

    o = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    for store in (True, False):
        r = o.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=store)
        assert r.status in ("completed", "incomplete") and r.id.startswith("resp_")
    assert o.responses.create(model=MODEL, input="hi", max_output_tokens=2, background=False).id
    with pytest.raises(openai.BadRequestError) as bad:
        o.responses.create(model=MODEL, input="hi", max_output_tokens=2, background=True)
    assert bad.value.param == "background" and "background" in bad.value.message
    for call in (o.responses.retrieve, o.responses.cancel, o.responses.delete, o.responses.input_items.list):
        with pytest.raises(openai.NotFoundError) as nf:
            call(r.id)
        assert nf.value.code == "response_not_found" and "stores no responses" in nf.value.message, call


def test_tool_message_content_may_be_text_parts(server: Server) -> None:
    """The OpenAI SDK types a tool message's content as a string or text parts; parts were a 400."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}

    def prompt_tokens(content: Any) -> int:
        msgs = [USER[0], {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": content}]  # fmt: skip
        r = httpx.post(server.url + CHAT, json={"model": MODEL, "messages": msgs, "max_tokens": 1},
                       headers=AUTH, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens(
        [{"type": "text", "text": "sunny"}, {"type": "text", "text": "21C"}]
    ) == prompt_tokens("sunny\n21C")
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    msgs = [USER[0], {"role": "tool", "tool_call_id": "c1", "content": image}]
    r = httpx.post(server.url + CHAT, json={"model": MODEL, "messages": msgs}, headers=AUTH, timeout=30)
    assert r.status_code == 400 and _shape(CHAT, r)["code"] == "vision_disabled"


@pytest.mark.parametrize("path", [CHAT, MSGS])
def test_xgrammar_refusals_do_not_leak_its_log_prefix(server: Server, path: str) -> None:
    """A schema only XGrammar refuses (a $ref cycle) came back as "[22:22:19] /project/cpp/...cc:3562: ..."."""
    schema = {
        "type": "object",
        "$defs": {"n": {"$ref": "#/$defs/n"}},
        "properties": {"a": {"$ref": "#/$defs/n"}},
    }
    if path == CHAT:
        tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
        body = {"model": MODEL, "messages": USER, "tools": [tool], "tool_choice": "required", "max_tokens": 4}
    else:
        body = {"model": "m", "messages": USER, "max_tokens": 4, "tool_choice": {"type": "any"},
                "tools": [{"name": "f", "input_schema": schema}]}  # fmt: skip
    r = httpx.post(server.url + path, json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, r.text
    msg = _shape(path, r)["message"]
    assert "Circular" in msg and "/project/" not in msg and not re.search(r"\[\d\d:\d\d:\d\d\]", msg), msg
    assert "\n" not in msg


# ---- the battery: behaviour that held, kept from regressing -------------------------------------------------
_BASE = {
    CHAT: {"model": MODEL, "messages": USER, "max_tokens": 2},
    MSGS: {"model": "m", "messages": USER, "max_tokens": 2},
    RESP: {"model": MODEL, "input": "hi", "max_output_tokens": 2},
}
_TEXT = {CHAT: "messages", MSGS: "messages", RESP: "input"}


def _hostile(path: str) -> list[tuple[str, bytes, int]]:
    """(name, body, status) for ``path``: one body per kind of hostile input."""
    base = json.dumps(_BASE[path]).encode()
    field = _TEXT[path].encode()

    def with_text(raw: bytes) -> bytes:  # the user text replaced by ``raw`` (a JSON string's bytes)
        value = b'"' + raw + b'"' if path == RESP else b'[{"role":"user","content":"' + raw + b'"}]'
        return re.sub(rb'"' + field + rb'": (\[.*?\]|"hi")', lambda _: b'"' + field + b'": ' + value, base)

    return [
        ("not-json", b"{not json", 400),
        ("empty", b"", 400),
        ("array", b"[1, 2]", 400),
        ("invalid-utf8", with_text(b"\xff\xfe"), 400),
        ("lone-surrogate", with_text(b"a\\ud800b"), 400),
        ("nan", base.replace(b"}", b', "temperature": NaN}', 1), 400),
        ("deep", b'{"model": "m", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
        ("huge-int", base.replace(b": 2}", b": 123456789012345678901234567890}"), 400),
        ("huge-float", base.replace(b": 2}", b": 1e400}"), 400),
        ("negative-max", base.replace(b": 2}", b": -1}"), 400),
        ("context-overflow", with_text(b"hello world " * 3000), 400),
        ("over-the-cap", with_text(b"a" * (1 << 20)), 413),
    ]


_ABSURD: dict[str, list[dict[str, Any]]] = {  # absurd values of fields each protocol has
    CHAT: [{"n": 2}, {"n": 10**30}, {"top_logprobs": -5}, {"max_tokens": 10**12}, {"seed": -1}],
    MSGS: [{"max_tokens": 10**12}, {"top_k": -1}, {"temperature": 1e308}, {"stop_sequences": ["x"] * 17}],
    RESP: [{"max_output_tokens": 10**12}, {"top_logprobs": 5}, {"top_p": -0.5}, {"tools": [{"type": "x"}]}],
}


@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
def test_hostile_bodies_answer_in_the_protocols_shape(server: Server, path: str) -> None:
    url = server.url + path
    for name, body, status in _hostile(path):
        r = httpx.post(url, content=body, headers={**AUTH, "content-type": "application/json"}, timeout=30)
        assert r.status_code == status, (name, r.text[:300])
        _shape(path, r)
    for extra in _ABSURD[path]:
        r = httpx.post(url, json={**_BASE[path], **extra}, headers=AUTH, timeout=30)
        assert r.status_code == 400, (extra, r.text)
        _shape(path, r)
    # chunked (no Content-Length) past the cap, and a stalled body: still the path's shape
    r = httpx.post(url, content=iter([b"{" + b" " * (1 << 19)] * 3), headers=AUTH, timeout=30)
    assert r.status_code == 413 and _shape(path, r)
    r = httpx.post(url, json={**_BASE[path], "unknown_field": {"x": [1]}}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text  # unknown fields are ignored
    r = httpx.post(url, json=_BASE[path], timeout=30)
    assert r.status_code == 401 and _shape(path, r)


def _frames(raw: str) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE frame; every line must be `event:` or `data:`, every frame end in \\n\\n."""
    assert raw.endswith("\n\n"), raw[-200:]
    out = []
    for frame in raw[:-2].split("\n\n"):
        event, data = None, None
        for line in frame.split("\n"):
            key, sep, value = line.partition(": ")
            assert sep and key in ("event", "data"), repr(line)
            event, data = (value, data) if key == "event" else (event, value)
        assert data is not None, frame
        out.append((event, data))
    return out


_STREAMS = {
    CHAT: {**_BASE[CHAT], "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}},
    MSGS: {**_BASE[MSGS], "max_tokens": 12, "stream": True},
    RESP: {**_BASE[RESP], "max_output_tokens": 12, "stream": True},
}
_LAST = {CHAT: {"[DONE]"}, MSGS: {"message_stop"}, RESP: {"response.completed", "response.incomplete"}}


@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
def test_raw_sse_framing(server: Server, path: str) -> None:
    """Every data line is JSON (but OpenAI's [DONE]); Anthropic and Responses name each event as its type;
    nothing follows the terminal frame."""
    with httpx.stream("POST", server.url + path, json=_STREAMS[path], headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    frames = _frames(raw)
    names = []
    for event, data in frames:
        if data == "[DONE]":
            assert path == CHAT and event is None
            names.append(data)
            continue
        obj = json.loads(data)
        if path == CHAT:
            assert event is None and obj["object"] == "chat.completion.chunk"
            names.append(obj["object"])
        else:
            assert event == obj["type"], (event, obj)
            names.append(event)
    assert names[-1] in _LAST[path] and sum(n in _LAST[path] for n in names) == 1, names
    if path == RESP:
        seq = [json.loads(d)["sequence_number"] for _, d in frames]
        assert seq == list(range(len(seq)))


def _open(s: Server, path: str, body: dict[str, Any]) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    data = json.dumps(body).encode()
    c.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n".encode()
              + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)  # fmt: skip
    return c


def test_hanging_up_mid_stream_or_while_queued_frees_lanes_and_queue(server: Server) -> None:
    assert _idle(server)
    long = {**_BASE[CHAT], "max_tokens": 3000, "ignore_eos": True, "stream": True}  # runs for seconds
    running = [_open(server, CHAT, long), _open(server, CHAT, long)]
    for c in running:
        assert c.recv(4096).startswith(b"HTTP/1.1 200")  # started streaming: both lanes busy
    queued = [_open(server, RESP, {**_BASE[RESP], "stream": True}), _open(server, MSGS, _BASE[MSGS])]
    deadline = time.monotonic() + 10
    while _metric(server, "ninfer_queue_length") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(server, "ninfer_lanes_busy") == 2 and _metric(server, "ninfer_queue_length") == 2
    for c in queued + running:  # hang up while waiting, then mid-stream
        c.close()
    assert _idle(server), "a hung-up request kept its lane or its place in the queue"


def test_a_burst_past_the_queue_is_refused_in_shape_and_nothing_accepted_is_lost(server: Server) -> None:
    assert _idle(server)

    def one(i: int) -> tuple[int, Any]:
        path = (CHAT, MSGS, RESP)[i % 3]
        body = {**_BASE[path], "ignore_eos": True, "stream": i % 2 == 0}
        body["max_output_tokens" if path == RESP else "max_tokens"] = 64
        with httpx.stream("POST", server.url + path, json=body, headers=AUTH, timeout=120) as r:
            raw = r.read()
        if r.status_code in (429, 529):  # a full queue: Anthropic's overloaded_error is a 529
            assert r.status_code == (529 if path == MSGS else 429), raw[:300]
            assert r.headers["retry-after"] and _shape(path, r)
            return 429, None
        assert r.status_code == 200, raw[:300]
        if not body["stream"]:
            return 200, (path, json.loads(raw))
        return 200, (path, _frames(raw.decode())[-1][1])

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    ok = [r for s, r in results if s == 200]
    assert 4 <= len(ok) < 12 and len(ok) + sum(s == 429 for s, _ in results) == 12
    for path, r in ok:  # every accepted request ran to its end
        if isinstance(r, dict):
            assert r["usage"], r
            if path == CHAT:
                assert r["usage"]["completion_tokens"] == 64, r
        elif path == CHAT:
            assert r == "[DONE]", r
        else:
            assert json.loads(r)["type"] in _LAST[path], r
    assert _idle(server)


def test_model_listing_serves_both_sdks(server: Server) -> None:
    """GET /v1/models is also Anthropic's path: its SDK read type, display_name and created_at as None."""
    import anthropic
    import openai

    a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    page = a.models.list()
    m = page.data[0]
    assert (m.id, m.type, m.display_name) == (MODEL, "model", MODEL) and m.created_at.year >= 2024
    assert page.has_more is False and page.first_id == page.last_id == MODEL
    assert a.models.retrieve(MODEL).created_at == m.created_at
    o = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    om = o.models.retrieve(MODEL)
    assert (om.id, om.object, om.owned_by) == (MODEL, "model", "ninfer") and om.created > 0
