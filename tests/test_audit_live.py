"""What an outside tester's audit of the HTTP server found, against a live `ninfer serve` (demo artifact, reference
backend, an API key and a request log): each test failed before its fix. Raw HTTP and the official SDKs, as such
testers use them (docs/protocols.md §2-§5, docs/serving.md "Auth", "Hostile and heavy input").
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")

from test_api_live import Server, demo_server  # noqa: E402
from test_hostile_live import _BASE, AUTH, CHAT, KEY, MODEL, MSGS, RESP, USER, _frames, _shape  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("audit")
    (tmp / "keys.txt").write_text(f"tester:{KEY}\n")
    args = ["--max-context", "4096", "--kv-capacity", "32768", "--max-concurrency", "2",
            "--api-key-file", str(tmp / "keys.txt"), "--request-log-jsonl", str(tmp / "req.jsonl")]  # fmt: skip
    with demo_server(tmp, "audit", args) as s:
        s.reqlog = tmp / "req.jsonl"  # type: ignore[attr-defined]
        yield s


# ---- 405 names the methods the path has ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("DELETE", CHAT, "POST"), ("GET", MSGS, "POST"), ("POST", "/v1/models", "GET, HEAD"), ("PUT", "/health", "GET")],
)  # fmt: skip
def test_405_has_an_allow_header(server: Server, method: str, path: str, allow: str) -> None:
    """RFC 9110 §15.5.6: a 405 must list the path's methods; it had no Allow header and said only "Method Not
    Allowed"."""
    r = httpx.request(method, server.url + path, headers=AUTH, timeout=30)
    assert r.status_code == 405, r.text
    assert r.headers["allow"].startswith(allow), r.headers
    err = _shape(path, r)
    assert method in err["message"] and path in err["message"], err


# ---- auth: either header may carry the key ------------------------------------------------------------------
def test_a_valid_key_in_either_header_passes(server: Server) -> None:
    """Upstream accepts a request when the bearer token or x-api-key is right; a wrong bearer token (a gateway's
    own) beside the right x-api-key was a 401. A 401 names its scheme (RFC 9110 §15.5.2)."""
    url = server.url + "/v1/models"
    assert httpx.get(url, headers={"Authorization": "Bearer wrong", "x-api-key": KEY}).status_code == 200
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}", "x-api-key": "wrong"}).status_code == 200
    r = httpx.get(url, headers={"Authorization": "Bearer wrong", "x-api-key": "wrong"})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), r.headers


# ---- Anthropic: a streamed message's usage equals the non-streamed one ---------------------------------------
def test_anthropic_stream_usage_has_every_count(server: Server) -> None:
    """message_delta carried only output_tokens, so the SDK's streamed final message had no
    cache_read_input_tokens (None) where the same request unstreamed reported them."""
    import anthropic

    a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    body: dict[str, Any] = {"model": "claude-x", "max_tokens": 4, "messages": USER}
    whole = a.messages.create(**body).usage
    with a.messages.stream(**body) as s:
        streamed = s.get_final_message().usage
    assert streamed.cache_read_input_tokens is not None and streamed.cache_creation_input_tokens == 0
    assert streamed.input_tokens == whole.input_tokens and streamed.output_tokens == whole.output_tokens
    stream = {**body, "stream": True}
    with httpx.stream("POST", server.url + MSGS, json=stream, headers=AUTH, timeout=60) as r:
        frames = _frames(r.read().decode())
    usage = next(json.loads(d)["usage"] for e, d in frames if e == "message_delta")
    counts = {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}
    assert set(usage) == counts, usage


# ---- Anthropic content blocks: the error names the block that is wrong --------------------------------------
@pytest.mark.parametrize(
    ("content", "where"),
    [
        ([{"type": "text", "text": "a"}, {"type": "text"}], "messages[0].content[1].text"),
        ([{"type": "text", "text": "a"}, {"type": "image", "source": {}}], "messages[0].content[1]"),
        ([{"type": "text", "text": "a"}, {"type": "audio"}], "messages[0].content[1].type"),
        ([], "messages[0].content"),
    ],
    ids=["text-without-text", "image-second", "unknown-second", "empty"],
)
def test_anthropic_block_errors_name_the_block(server: Server, content: list, where: str) -> None:
    """A user block's error named content[0] whatever its place; a text block without text was "unsupported
    content block 'text'"; an empty content array vanished and the request failed as "messages is empty"."""
    body = {"model": "claude-x", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(server.url + MSGS, json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, r.text
    msg = _shape(MSGS, r)["message"]
    assert msg.startswith(where + ":"), msg
    assert "unsupported content block 'text'" not in msg and "messages is empty" not in msg


# ---- a giant `model` is refused, not echoed and logged ------------------------------------------------------
@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
def test_an_oversized_model_name_is_refused_not_echoed(server: Server, path: str) -> None:
    """Anthropic echoed a 1 MB `model` in the answer and wrote it to the request log twice (a 2 MB log line per
    request); OpenAI's 404 repeated it in its message."""
    giant = "m" * 300_000
    r = httpx.post(server.url + path, json={**_BASE[path], "model": giant}, headers=AUTH, timeout=30)
    assert r.status_code == 400 and len(r.content) < 1000, r.text[:300]
    err = _shape(path, r)
    assert "256" in err["message"] and (path == MSGS or err["param"] == "model")
    ok = httpx.post(server.url + path, json={**_BASE[path], "model": MODEL if path != MSGS else "m" * 256},
                    headers=AUTH, timeout=30)  # fmt: skip
    assert ok.status_code == 200, ok.text[:300]
    log: Path = server.reqlog  # type: ignore[attr-defined]
    assert max(len(line) for line in log.read_text().splitlines()) < 10_000


# ---- a request head over h11's bound is a 431, not "malformed" ----------------------------------------------
@pytest.mark.parametrize("path", [CHAT, MSGS])
def test_an_oversized_head_is_a_431_in_the_paths_shape(server: Server, path: str) -> None:
    """A 40 KiB cookie was answered 400 "malformed HTTP request": the client could not tell what to fix."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nCookie: {'c' * (40 << 10)}\r\nContent-Length: 2\r\n\r\n{{}}"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
        data = head.encode()
        for i in range(0, len(data), 4096):  # in pieces, as a head arrives over a network
            c.sendall(data[i : i + 4096])
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    status, _, rest = out.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 431"), out[:200]
    body = rest.partition(b"\r\n\r\n")[2]
    err = _shape(path, httpx.Response(431, headers={"content-type": "application/json"}, content=body))
    assert "16 KiB" in err["message"], err
    assert httpx.get(server.url + "/health").status_code == 200


# ---- upstream's contract: a greedy request's usage is the same unstreamed and streamed ------------------------
def test_upstream_contract_usage_is_the_same_streamed_and_unstreamed(server: Server) -> None:
    """Upstream's smoke contract sends a greedy request, then the same request streamed with include_usage, and
    requires equal usage. The second reuses the first's prompt from the prefix cache, so the cached count in
    chat usage made the contract fail on every fresh server; it is now reported only with
    --prompt-tokens-details (the log and the other protocols keep it)."""
    messages = [{"role": "user", "content": "Reply with a single short word (usage contract)."}]
    body = {"model": MODEL, "messages": messages, "max_completion_tokens": 4, "temperature": 0}
    whole = httpx.post(server.url + CHAT, json=body, headers=AUTH, timeout=60).json()
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + CHAT, json=stream, headers=AUTH, timeout=60) as r:
        frames = [json.loads(d) for _, d in _frames(r.read().decode()) if d != "[DONE]"]
    usage = [f["usage"] for f in frames if f.get("usage")]
    assert len(usage) == 1 and usage[0] == whole["usage"], (usage, whole["usage"])
    assert "prompt_tokens_details" not in whole["usage"]
    text = "".join(f["choices"][0]["delta"].get("reasoning_content", "") for f in frames if f["choices"])
    assert text == whole["choices"][0]["message"].get("reasoning_content", "")
