"""POST /v1/chat/completions: admission through the actor, then a JSON body or an SSE stream.

The handler waits for the actor's first event before it answers, so a full queue is a fast 429 (with
Retry-After) and a prompt over the context is a 400, both before any stream starts. Whatever ends a request —
finish, error, client disconnect — it is logged once and, unless the engine finished it, cancelled on the actor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.response import Stream
from ninfer.actors.messages import Accepted, Delta, Failed, Finished, GenerateRequest, StreamEvent

from .errors import ApiError
from .models import ChatRequest
from .openai_chat import (
    ChatStream,
    completion_body,
    new_completion_id,
    parse_chat_request,
    to_generate_request,
)
from .service import Service, client_name, json_response

__all__ = ["handle_chat"]

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Tracker:
    """One request's bookkeeping: log records, metrics and the cancel-unless-finished rule."""

    def __init__(self, svc: Service, greq: GenerateRequest, req: ChatRequest, log_id: int, t0: float) -> None:
        self.svc, self.greq, self.t0, self.done = svc, greq, t0, False
        self.ttft: float | None = None
        s = greq.sampling
        self.record: dict[str, Any] = {
            "request_id": log_id,
            "engine_request_id": greq.request_id,
            "protocol": "openai_chat_completions",
            "model": req.model,
            "stream": req.stream,
            "message_count": len(req.messages),
            "client": greq.client,
            "requested_output_tokens": s.max_tokens,
            "requested_output_tokens_source": "client"
            if (req.max_completion_tokens or req.max_tokens)
            else "server_default",
            "tool_count": 0,
            "tool_choice": "none",
            "has_tool_history": any(m.role == "tool" or m.tool_calls for m in req.messages),
            "enable_thinking": greq.template_kwargs.get("enable_thinking", True),
            "sampling": msgspec.structs.asdict(s) | {"stop": len(s.stop)},
        }

    def first_token(self) -> None:
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.t0

    def accepted(self, ev: Accepted) -> None:
        self.record["prompt_tokens"] = ev.prompt_tokens
        self.record["queued"] = ev.queued
        self._log("request_start", request=self.record)

    def finished(self, fin: Finished) -> None:
        self.done = True
        total = time.perf_counter() - self.t0
        t = fin.timings
        self._log(
            "request_done",
            request=self.record,
            result={
                "finish_reason": fin.finish_reason,
                "prompt_tokens": fin.prompt_tokens,
                "completion_tokens": fin.completion_tokens,
                "cached_tokens": fin.cached_tokens,
                "prefix_cache_hit_tokens": fin.cached_tokens,
                "tool_call_count": 0,
                "lane": fin.lane,
            },
            timings_seconds={
                "queue": t.queue_s,
                "prefill": t.prefill_s,
                "decode": t.decode_s,
                "engine_ttft": t.ttft_s,
                "engine_total": t.total_s,
                "ttft": self.ttft,
                "total": total,
            },
        )
        self.svc.metrics.count_request("chat_completions", fin.finish_reason)
        self.svc.metrics.observe_done(
            latency_s=total,
            ttft_s=self.ttft,
            prompt=fin.prompt_tokens,
            cached=fin.cached_tokens,
            completion=fin.completion_tokens,
        )

    def failed(self, message: str, outcome: str) -> None:
        if self.done:
            return
        self.done = True
        self.svc.metrics.count_request("chat_completions", outcome)
        self._log("request_error", request=self.record, error={"message": message, "outcome": outcome})

    def abandon(self) -> None:
        """The client went away (or the handler failed) before the engine finished: free the lane now."""
        if not self.done:
            self.svc.backend.cancel(self.greq.request_id)
            self.failed("client disconnected", "cancelled")

    def _log(self, event: str, **fields: Any) -> None:
        if self.svc.reqlog is not None:
            self.svc.reqlog.write(event, **fields)


def _failure(ev: Failed) -> ApiError:
    return ApiError(ev.status, ev.message, code=ev.code, param=ev.param, retry_after=ev.retry_after)


async def handle_chat(request: Request[Any, Any, Any], svc: Service) -> Any:
    t0 = time.perf_counter()
    req = parse_chat_request(await request.body(), svc.limits)
    log_id = svc.next_request_id()
    rid = f"{new_completion_id()}"
    greq = to_generate_request(req, svc.limits, rid, client_name(request, req.user), svc.template_defaults)
    events = svc.backend.generate(greq)
    first = await anext(events, None)
    if not isinstance(first, Accepted):
        outcome = "rejected" if isinstance(first, Failed) and first.status == 429 else "error"
        svc.metrics.count_request("chat_completions", outcome)
        if isinstance(first, Failed):
            raise _failure(first)
        raise ApiError(500, "the engine closed the request without answering", code="internal_error")
    track = _Tracker(svc, greq, req, log_id, t0)
    track.accepted(first)
    created = int(time.time())
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        cs = ChatStream(rid, created, req.model, include_usage)
        return Stream(_sse(cs, events, track), media_type="text/event-stream", headers=_SSE_HEADERS)
    return await _complete(request, rid, created, req.model, events, track)


async def _sse(cs: ChatStream, events: AsyncIterator[StreamEvent], track: _Tracker) -> AsyncIterator[bytes]:
    """Runs inside Litestar's Stream; a client disconnect cancels this task, and ``finally`` frees the lane."""
    try:
        yield cs.role()
        async for ev in events:
            if isinstance(ev, Delta):
                if ev.text:
                    track.first_token()
                    yield cs.content(ev.text)
            elif isinstance(ev, Finished):
                track.finished(ev)
                yield cs.finish(ev)
                return
            elif isinstance(ev, Failed):
                track.failed(ev.message, "error")
                yield cs.error(_failure(ev))
                return
        track.failed("the engine stream ended without a finish event", "error")
        yield cs.error(ApiError(500, "the engine stream ended without a finish event", code="internal_error"))
    finally:
        track.abandon()


async def _collect(events: AsyncIterator[StreamEvent], track: _Tracker) -> tuple[str, Finished]:
    parts: list[str] = []
    async for ev in events:
        if isinstance(ev, Delta):
            if ev.text:
                track.first_token()
            parts.append(ev.text)
        elif isinstance(ev, Finished):
            track.finished(ev)
            return "".join(parts), ev
        elif isinstance(ev, Failed):
            track.failed(ev.message, "error")
            raise _failure(ev)
    track.failed("the engine stream ended without a finish event", "error")
    raise ApiError(500, "the engine stream ended without a finish event", code="internal_error")


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns when the client hangs up (the body is already read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _complete(
    request: Request[Any, Any, Any],
    rid: str,
    created: int,
    model: str,
    events: AsyncIterator[StreamEvent],
    track: _Tracker,
) -> Response[bytes]:
    work = asyncio.ensure_future(_collect(events, track))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            raise ApiError(499, "client disconnected", code="client_disconnected")
        text, fin = work.result()
    finally:
        gone.cancel()
        track.abandon()
    return json_response(completion_body(rid, created, model, text, fin))
