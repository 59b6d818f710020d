"""Slow clients and a full server against a live `ninfer serve` (demo artifact, reference backend), through raw
sockets and the official SDKs: a body trickled just under the per-read timeout is cut off at the whole-body
deadline; a head trickled a byte at a time is closed at the head deadline; a connection past --max-connections
and a request past the queue are refused in the path's protocol (Anthropic's 529 overloaded_error, which its SDK
retries after Retry-After; OpenAI's 503/429); every early refusal has its path's error shape
(docs/serving.md "Connections and slow clients", docs/protocols.md §3).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")

from test_api_live import Server, demo_server  # noqa: E402
from test_hostile_live import (  # noqa: E402
    _BASE,
    AUTH,
    CHAT,
    KEY,
    MODEL,
    MSGS,
    RESP,
    USER,
    _idle,
    _metric,
    _open,
    _raw,
    _shape,
)

CAP = 12  # --max-connections
HEAD_S, READ_S, BODY_S = 2.0, 2.0, 4.0  # --header-timeout-s, --body-timeout-s, --body-deadline-s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One lane, a queue of one, short head/body deadlines, a small connection cap and an API key."""
    tmp = tmp_path_factory.mktemp("hostile-limits")
    (tmp / "keys.txt").write_text(f"tester:{KEY}\n")
    args = ["--max-context", "4096", "--kv-capacity", "32768", "--max-concurrency", "1", "--queue-depth", "1",
            "--max-request-mib", "1", "--header-timeout-s", str(HEAD_S), "--body-timeout-s", str(READ_S),
            "--body-deadline-s", str(BODY_S), "--max-connections", str(CAP),
            "--api-key-file", str(tmp / "keys.txt")]  # fmt: skip
    with demo_server(tmp, "hostile-limits", args) as s:
        yield s


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def _as_response(raw: bytes) -> httpx.Response:
    status, headers, body = _parse(raw)
    return httpx.Response(status, headers=headers, content=body)


def _head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n").encode()  # fmt: skip


def _trickle(s: Server, first: bytes, piece: bytes, every: float, limit: float) -> tuple[bytes, float, bool]:
    """Send ``first``, then ``piece`` every ``every`` s until the server answers or closes (or ``limit`` s):
    (what it sent, seconds until it closed or ``limit``, whether it closed)."""
    t0 = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", s.port), timeout=every) as c:
        c.sendall(first)
        while time.monotonic() - t0 < limit:
            try:
                chunk = c.recv(65536)
            except TimeoutError:
                if not got:  # stop sending once an answer started: only its end is left to read
                    c.sendall(piece)
                continue
            except ConnectionResetError:
                return got, time.monotonic() - t0, True
            if not chunk:
                return got, time.monotonic() - t0, True
            got += chunk
    return got, limit, False


# ---- slow clients -------------------------------------------------------------------------------------------
def test_a_trickled_body_is_cut_off_at_the_body_deadline(server: Server) -> None:
    """Each piece comes well inside the per-read timeout, so only the whole-body deadline ends it (before: the
    connection stayed open as long as the trickle lasted; only --max-connections bounded such clients)."""

    def one(path: str) -> tuple[str, bytes, float, bool]:
        return path, *_trickle(server, _head(path, 100_000) + b'{"model": "m", "x": "', b"a", 0.5, 30)

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, [CHAT, MSGS, RESP]))
    for path, got, took, closed in results:
        assert got.startswith(b"HTTP/1.1 408"), (path, got[:300], took)
        assert closed and BODY_S - 0.5 <= took < BODY_S + 8, (path, took)  # answered, then closed
        r = _as_response(got)
        assert r.headers["connection"] == "close"
        err = _shape(path, r)
        assert f"within {BODY_S:g} s" in err["message"], err
        if path != MSGS:
            assert err["code"] == "request_timeout"
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_trickled_head_is_closed_at_the_head_deadline(server: Server) -> None:
    """Slowloris: uvicorn bounds a head's size (h11) but not its time; the guard's head deadline is not moved by
    the bytes that do arrive, so a head sent a byte every half second is closed after --header-timeout-s."""
    got, took, closed = _trickle(server, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n".encode(), b"X", 0.5, 20)
    assert closed and got == b"" and HEAD_S - 0.5 <= took < HEAD_S + 8, (got, took)


# ---- a full server ------------------------------------------------------------------------------------------
def _request(s: Server, path: str, body: dict[str, Any]) -> bytes:
    """One request on a fresh connection; everything the server sends until it closes."""
    data = json.dumps(body).encode()
    return _raw(s, _head(path, len(data)) + data)


def test_connections_past_the_cap_are_refused_in_the_paths_protocol(server: Server) -> None:
    """Before: the same OpenAI-shaped 503 on every path, written before the request line was read."""
    import anthropic
    import openai

    a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    o = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(CAP)]
    try:  # the held connections stay for --header-timeout-s: everything below is quick
        bodies = {
            CHAT: _BASE[CHAT],
            MSGS: _BASE[MSGS],
            MSGS + "/count_tokens": _BASE[MSGS],
            RESP: _BASE[RESP],
        }
        raw = {path: _request(server, path, body) for path, body in bodies.items()}
        with pytest.raises(anthropic.OverloadedError) as ae:
            a.messages.create(model="m", max_tokens=2, messages=USER)  # type: ignore[arg-type]
        with pytest.raises(openai.InternalServerError) as oe:
            o.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)  # type: ignore[arg-type]
    finally:
        for c in held:
            c.close()
    for path, got in raw.items():
        r = _as_response(got)
        assert r.headers["retry-after"] == "1" and r.headers["connection"] == "close", got[:300]
        err = _shape(path, r)
        if path.startswith(MSGS):
            assert r.status_code == 529 and err["type"] == "overloaded_error", got[:300]
        else:
            assert r.status_code == 503 and err["code"] == "server_busy", got[:300]
    assert ae.value.status_code == 529 and ae.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert oe.value.status_code == 503 and oe.value.code == "server_busy"
    time.sleep(0.5)
    assert httpx.get(server.url + "/health").status_code == 200


def _open_stream(s: Server) -> socket.socket:
    return _open(s, CHAT, {**_BASE[CHAT], "max_tokens": 3000, "ignore_eos": True, "stream": True})


def test_a_full_queue_is_anthropic_overloaded_and_its_sdk_retries_after_retry_after(server: Server) -> None:
    """Anthropic's 429 means "your account hit a rate limit"; a server whose queue is full answers 529
    overloaded_error, which the SDK raises as OverloadedError after retrying (Retry-After: 1 s) as for a 429."""
    import anthropic
    import openai

    assert _idle(server)
    running = _open_stream(server)
    assert running.recv(4096).startswith(b"HTTP/1.1 200")
    queued = _open_stream(server)  # the one lane runs, the one queue place is taken
    try:
        deadline = time.monotonic() + 10
        while not _full(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        attempts: list[float] = []
        hook = {"request": [lambda _req: attempts.append(time.monotonic())]}
        a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=2,
                                http_client=anthropic.DefaultHttpxClient(event_hooks=hook))  # fmt: skip
        with pytest.raises(anthropic.OverloadedError) as ae:
            a.messages.create(model="m", max_tokens=2, messages=USER)  # type: ignore[arg-type]
        assert ae.value.status_code == 529 and ae.value.type == "overloaded_error"  # type: ignore[attr-defined]
        gaps = [b - a_ for a_, b in zip(attempts, attempts[1:], strict=False)]
        assert len(attempts) == 3 and min(gaps) >= 0.9, attempts  # 2 retries, each after Retry-After: 1
        o = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError) as oe:
            o.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)  # type: ignore[arg-type]
        assert oe.value.code == "queue_full"
    finally:
        running.close()
        queued.close()
    assert _idle(server)
    r = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert 'ninfer_server_errors_total{endpoint="messages"' not in r  # a refusal, not a server fault


def _full(s: Server) -> bool:
    return _metric(s, "ninfer_lanes_busy") == 1 and _metric(s, "ninfer_queue_length") == 1


# ---- every early refusal in its path's shape ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/messages", 405), ("GET", CHAT, 405), ("POST", "/v1/messages/nope", 404), ("POST", "/v1/nope", 404),
     ("DELETE", RESP, 405), ("GET", "/nope", 404)],
)  # fmt: skip
def test_unknown_routes_and_methods_answer_in_the_paths_shape(
    server: Server, method: str, path: str, status: int
) -> None:
    r = httpx.request(method, server.url + path, headers=AUTH, timeout=30)
    assert r.status_code == status, r.text
    _shape(path, r)
    r = httpx.request(method, server.url + path, timeout=30)  # no key: refused before routing
    assert r.status_code == 401 and _shape(path, r)


@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
def test_a_declared_length_over_the_cap_is_refused_before_the_body(server: Server, path: str) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
        c.sendall(_head(path, 2 << 20))  # the body is never sent: the answer must not wait for it
        got = b""
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < int(
            _parse(got)[1]["content-length"]
        ):
            got += c.recv(65536)
    r = _as_response(got)
    assert r.status_code == 413, got[:300]
    err = _shape(path, r)
    assert err["type"] == "request_too_large" if path == MSGS else err["code"] == "request_too_large"
