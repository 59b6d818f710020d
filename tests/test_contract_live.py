"""End-to-end HTTP contract of the three protocols on a live `ninfer serve` (demo artifact, reference backend):
stream headers, what `json_object` and patterns produce, calls cut by the token limit, one validation rule set,
unsupported fields, Anthropic structured output and the OpenAPI document. Raw HTTP (httpx) where headers or exact
bodies matter, the official SDKs where their parsing is the point.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("ray")
pytest.importorskip("xgrammar")

from test_api_live import Server  # noqa: E402
from test_protocols_live import MODEL, USER, live_server  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from live_server(tmp_path_factory)


SSE = [
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 4, "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4, "stream": True}),
    ("/v1/messages", {"model": "m", "messages": USER, "max_tokens": 4, "stream": True}),
]


# ---- 1. stream and metrics content types ----------------------------------------------------------------
@pytest.mark.parametrize(("path", "body"), SSE, ids=["chat", "responses", "messages"])
def test_streams_are_event_streams(server: Server, path: str, body: dict) -> None:
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].split(";")[0] == "text/event-stream", r.headers["content-type"]
        assert r.headers["cache-control"] == "no-cache"
        assert r.read().startswith(b"data: " if path.endswith("completions") else b"event: ")


def test_metrics_content_type_is_prometheus_text_004(server: Server) -> None:
    r = httpx.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


# ---- 2. json_object means an object ---------------------------------------------------------------------
def _json_object_answers(server: Server) -> list[tuple[str, str]]:
    out = []
    for seed in range(6):
        body = {"model": MODEL, "messages": USER, "max_tokens": 40, "temperature": 1.0, "seed": seed,
                "enable_thinking": False, "response_format": {"type": "json_object"}}  # fmt: skip
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        out.append((c["message"]["content"], c["finish_reason"]))
    body = {"model": MODEL, "input": "JSON please", "max_output_tokens": 40, "temperature": 1.0,
            "reasoning": {"effort": "none"}, "text": {"format": {"type": "json_object"}}}  # fmt: skip
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out.append((r.json()["output"][-1]["content"][0]["text"], r.json()["status"]))
    return out


def test_json_object_is_always_an_object(server: Server) -> None:
    for text, finish in _json_object_answers(server):
        assert text.startswith("{"), text  # an array or a scalar was admitted before
        if finish in ("stop", "completed"):
            assert isinstance(json.loads(text), dict), text
