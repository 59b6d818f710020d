"""One streamed request against a live server, read back into an ``Outcome`` for any of the three protocols.

Each protocol's SSE events are folded by a small accumulator into the same fields: the response id (the id the
server also logs as ``engine_request_id``), answer text, reasoning, tool calls, finish reason and usage. The clock
starts just before the request is sent; ``t_first`` is the first event that carries generated output (a text,
reasoning or tool-call delta), ``t_done`` the protocol's final event.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

__all__ = ["Outcome", "ToolCall", "stream_request", "iter_sse", "ENDPOINTS"]

ENDPOINTS = {
    "openai_chat": "/v1/chat/completions",
    "anthropic_messages": "/v1/messages",
    "openai_responses": "/v1/responses",
}


class ToolCall(msgspec.Struct, frozen=True):
    name: str
    arguments: str  # the JSON text as streamed


class Outcome(msgspec.Struct, kw_only=True):
    http_status: int = 0
    error: str | None = None
    response_id: str | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None where the protocol's stream does not carry it (Anthropic)
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    speculative: dict[str, Any] | None = None  # counters the usage carries, when the server reports any
    t_first: float | None = None  # seconds after send
    t_done: float | None = None


async def iter_sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str]]:
    """(event name or None, data) per SSE message; multi-line data joined with newlines."""
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield event, "\n".join(data)


def _speculative(usage: dict[str, Any]) -> dict[str, Any] | None:
    """Counters whose name says speculative decoding (draft/accepted/speculative), at any depth of the usage."""
    found: dict[str, Any] = {}

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif any(w in k for w in ("specul", "draft", "accepted", "rejected")):
                found[prefix + k] = v

    walk(usage, "")
    return found or None


class _Chat:
    def __init__(self, out: Outcome) -> None:
        self.out, self.calls = out, {}

    def feed(self, _event: str | None, d: dict[str, Any]) -> bool:
        o = self.out
        if "error" in d:
            o.error = str(d["error"].get("message", d["error"]))
            return False
        o.response_id = o.response_id or d.get("id")
        if d.get("usage"):
            u = d["usage"]
            o.prompt_tokens, o.completion_tokens = u.get("prompt_tokens"), u.get("completion_tokens")
            o.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
            o.reasoning_tokens = (u.get("completion_tokens_details") or {}).get("reasoning_tokens")
            o.speculative = _speculative(u)
        output = False
        for c in d.get("choices") or ():
            delta = c.get("delta") or {}
            for key, attr in (("content", "text"), ("reasoning_content", "reasoning")):
                if delta.get(key):
                    setattr(o, attr, getattr(o, attr) + delta[key])
                    output = True
            for tc in delta.get("tool_calls") or ():
                f = tc.get("function") or {}
                name, args = self.calls.get(tc["index"], ("", ""))
                self.calls[tc["index"]] = (name + (f.get("name") or ""), args + (f.get("arguments") or ""))
                output = True
            o.finish_reason = c.get("finish_reason") or o.finish_reason
        o.tool_calls = [ToolCall(*self.calls[i]) for i in sorted(self.calls)]
        return output


class _Messages:
    def __init__(self, out: Outcome) -> None:
        self.out, self.blocks = out, []  # [type, name, text]

    def feed(self, event: str | None, d: dict[str, Any]) -> bool:
        o, kind = self.out, d.get("type", event)
        if kind == "error":
            o.error = str((d.get("error") or {}).get("message", d))
        elif kind == "message_start":
            m = d["message"]
            o.response_id, u = m.get("id"), m.get("usage") or {}
            o.prompt_tokens = u.get("input_tokens")
        elif kind == "content_block_start":
            b = d["content_block"]
            self.blocks.append([b["type"], b.get("name", ""), ""])
        elif kind == "content_block_delta":
            delta = d["delta"]
            piece = delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
            self.blocks[-1][2] += piece
            self._fold()
            return bool(piece)
        elif kind == "message_delta":
            o.finish_reason = (d.get("delta") or {}).get("stop_reason")
            u = d.get("usage") or {}
            o.completion_tokens = u.get("output_tokens", o.completion_tokens)
            if "cache_read_input_tokens" in u:
                o.cached_tokens = u["cache_read_input_tokens"]
            o.speculative = _speculative(u)
        return False

    def _fold(self) -> None:
        o = self.out
        o.text = "".join(t for k, _, t in self.blocks if k == "text")
        o.reasoning = "".join(t for k, _, t in self.blocks if k == "thinking")
        o.tool_calls = [ToolCall(n, t or "{}") for k, n, t in self.blocks if k == "tool_use"]


class _Responses:
    def __init__(self, out: Outcome) -> None:
        self.out = out

    def feed(self, event: str | None, d: dict[str, Any]) -> bool:
        o, kind = self.out, d.get("type", event) or ""
        if kind == "error":
            o.error = str(d.get("message", d))
        elif kind == "response.created":
            o.response_id = d["response"]["id"]
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._final(d["response"])
        return kind.endswith(".delta") and bool(d.get("delta"))

    def _final(self, r: dict[str, Any]) -> None:
        o = self.out
        o.finish_reason = r.get("status")
        if r.get("incomplete_details"):
            o.finish_reason = f"incomplete:{r['incomplete_details'].get('reason')}"
        if r.get("error"):
            o.error = str(r["error"].get("message", r["error"]))
        for item in r.get("output") or ():
            if item["type"] == "reasoning":
                o.reasoning += "".join(c.get("text", "") for c in item.get("content") or ())
            elif item["type"] == "message":
                o.text += "".join(c.get("text", "") for c in item.get("content") or ())
            elif item["type"] == "function_call":
                o.tool_calls.append(ToolCall(item["name"], item.get("arguments", "")))
        u = r.get("usage") or {}
        o.prompt_tokens, o.completion_tokens = u.get("input_tokens"), u.get("output_tokens")
        o.cached_tokens = (u.get("input_tokens_details") or {}).get("cached_tokens")
        o.reasoning_tokens = (u.get("output_tokens_details") or {}).get("reasoning_tokens")
        o.speculative = _speculative(u)


_FOLDERS = {"openai_chat": _Chat, "anthropic_messages": _Messages, "openai_responses": _Responses}


def stream_body(protocol: str, body: dict[str, Any]) -> dict[str, Any]:
    """The fixture's body as sent: streamed, with usage requested where the protocol makes it optional."""
    out = dict(body, stream=True)
    if protocol == "openai_chat":
        out["stream_options"] = dict(body.get("stream_options") or {}, include_usage=True)
    return out


async def stream_request(
    client: httpx.AsyncClient, url: str, protocol: str, body: dict[str, Any], headers: dict[str, str]
) -> Outcome:
    """Send one fixture body streamed and fold its events; transport failures become ``Outcome.error``."""
    out = Outcome()
    folder = _FOLDERS[protocol](out)
    t0 = time.perf_counter()
    try:
        async with client.stream(
            "POST", url + ENDPOINTS[protocol], json=stream_body(protocol, body), headers=headers
        ) as r:
            out.http_status = r.status_code
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                out.error = f"HTTP {r.status_code}: {text[:300]}"
                return out
            async for event, data in iter_sse(r.aiter_lines()):
                if data == "[DONE]":
                    continue
                if folder.feed(event, json.loads(data)) and out.t_first is None:
                    out.t_first = time.perf_counter() - t0
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError) as e:
        out.error = f"{type(e).__name__}: {e}"
    out.t_done = time.perf_counter() - t0
    return out
