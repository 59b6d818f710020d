"""End-to-end HTTP contract of the three protocols on a live `ninfer serve` (demo artifact, reference backend):
stream headers, what `json_object` and patterns produce, calls cut by the token limit, one validation rule set,
unsupported fields, Anthropic structured output and the OpenAPI document. Raw HTTP (httpx) where headers or exact
bodies matter, the official SDKs where their parsing is the point.
"""

from __future__ import annotations

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
