"""Request plumbing every protocol shares: admission through the actor, log records and metrics, collecting a
whole answer (cancelled if the client hangs up) and driving an SSE stream.

The handler waits for the actor's first event before it answers, so a full queue is a fast 429 (with
Retry-After) and a prompt over the context is a 400, both before any stream starts. Whatever ends a request —
finish, error, client disconnect — it is logged once and, unless the engine finished it, cancelled on the actor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec
from litestar import Request
from litestar.response import Stream
from ninfer.actors.messages import Failed, GenerateRequest, StreamEvent, engine_failure

from ninfer.engine.core import Accepted, Finish, TokenDelta

from .errors import ApiError
from .gate import Drained, until_drained
from .service import Service

__all__ = [
    "Tracker",
    "StreamBuilder",
    "EventStream",
    "SSE_HEADERS",
    "admit",
    "collect",
    "sse",
    "event_stream",
    "request_record",
    "failure",
    "output_mode",
]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def request_record(
    greq: GenerateRequest,
    *,
    protocol: str,
    model: str,
    stream: bool,
    messages: int,
    client_max: bool,
    claim: str | None = None,
) -> dict[str, Any]:
    """The request's log record. It walks every message (``has_tool_history``): build it inside
    ``validation.prepare``'s work, off the event loop for a large body (1.5M messages held the loop 0.16-0.18 s)."""
    s = greq.sampling
    tools = greq.tools or ()
    g = greq.grammar
    return {
        "engine_request_id": greq.request_id,
        "protocol": protocol,
        "model": model,
        "stream": stream,
        "message_count": messages,
        "client": greq.client,  # who the server knows sent it (API key name, else the peer address)
        "client_claim": claim,  # who the request says it is (user field / X-Client-Name), unverified
        "requested_output_tokens": s.max_tokens,
        "requested_output_tokens_source": "client" if client_max else "server_default",
        "tool_count": len(tools),
        "tool_choice": (g.tool_choice if g and g.kind == "tool_calls" else "auto") if tools else "none",
        "grammar": g.kind if g else None,
        "has_tool_history": any(m.get("role") == "tool" or m.get("tool_calls") for m in greq.messages or ()),
        "enable_thinking": greq.template_kwargs.get("enable_thinking", True),
        "thinking_budget": greq.thinking_budget,
        "sampling": msgspec.structs.asdict(s) | {"stop": len(s.stop or ())},
    }


def output_mode(greq: GenerateRequest) -> tuple[bool, list[dict[str, Any]] | None]:
    """How to parse the generated text: (thinking on — the template's default —, the tools rendered)."""
    thinking = greq.template_kwargs.get("enable_thinking", True) is not False
    return thinking, list(greq.tools) if greq.tools else None


class Tracker:
    """One request's bookkeeping: log records, metrics and the cancel-unless-finished rule."""

    def __init__(self, svc: Service, greq: GenerateRequest, record: dict[str, Any], endpoint: str, t0: float):
        self.svc, self.greq, self.t0, self.endpoint, self.done = svc, greq, t0, endpoint, False
        self.ttft: float | None = None
        self.record = {"request_id": svc.next_request_id(), **record}
        self.tool_calls = 0
        self.completion_tokens = 0  # generated so far (what a cancelled request logs)
        # the loop time since which a streamed chunk waits for the client to take it; None between chunks
        self.sending: float | None = None

    def delta(self, ev: TokenDelta) -> None:
        self.completion_tokens += len(ev.token_ids)
        if ev.text:
            self.first_token()

    def first_token(self) -> None:
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.t0

    def accepted(self, ev: Accepted) -> None:
        self.record["prompt_tokens"] = ev.prompt_tokens
        self.record["queued"] = ev.queued
        self._log("request_start", request=self.record)

    def finished(self, fin: Finish) -> None:
        self.done = True
        total = time.perf_counter() - self.t0
        t, u = fin.metrics, fin.usage
        self._log(
            "request_done",
            request=self.record,
            result={
                "finish_reason": fin.reason,
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "reasoning_tokens": u.reasoning_tokens,
                "cached_tokens": u.cached_tokens,
                "prefix_cache_hit_tokens": u.cached_tokens,
                "cached_tokens_device": u.cached_tokens - u.host_cached_tokens,
                "cached_tokens_host": u.host_cached_tokens,
                "host_restore_bytes": t.restore_bytes,
                "tool_call_count": self.tool_calls,
                "lane": t.lane if t.lane >= 0 else None,
                "speculative": msgspec.to_builtins(u.speculative),
            },
            timings_seconds={
                "queue": t.queue_wait_s,
                "prefill": t.prefill_s,
                "decode": t.decode_s,
                "engine_ttft": t.ttft_s,
                "host_restore": t.restore_s,
                "engine_total": t.queue_wait_s + t.prefill_s + t.decode_s,
                "ttft": self.ttft,
                "total": total,
            },
        )
        self.svc.metrics.count_request(self.endpoint, fin.reason)
        self.svc.metrics.observe_done(
            latency_s=total,
            ttft_s=self.ttft,
            prompt=u.prompt_tokens,
            cached=u.cached_tokens,
            completion=u.completion_tokens,
        )

    def failed(self, message: str, outcome: str) -> None:
        """Logged with what the request got before it ended: its tokens so far and the API's timings."""
        if self.done:
            return
        self.done = True
        self.svc.metrics.count_request(self.endpoint, outcome)
        self._log(
            "request_error",
            request=self.record,
            error={"message": message, "outcome": outcome},
            result={
                "prompt_tokens": self.record.get("prompt_tokens"),
                "completion_tokens": self.completion_tokens,
            },
            timings_seconds={"ttft": self.ttft, "total": time.perf_counter() - self.t0},
        )

    def abandon(self, message: str = "client disconnected", outcome: str = "cancelled") -> None:
        """The client went away, the handler failed or the server is shutting down before the engine finished:
        free the lane now."""
        if not self.done:
            self.svc.backend.cancel(self.greq.request_id)
            self.failed(message, outcome)

    def _log(self, event: str, **fields: Any) -> None:
        if self.svc.reqlog is not None:
            self.svc.reqlog.write(event, **fields)


def _failed_or(ev: StreamEvent) -> StreamEvent:
    """A ``Finish`` whose reason is ``error`` as the ``Failed`` it stands for; any other event as it is."""
    return (engine_failure(ev) or ev) if isinstance(ev, Finish) else ev


def failure(ev: Failed, err: type[ApiError] = ApiError) -> ApiError:
    return err(ev.status, ev.message, code=ev.code, param=ev.param, retry_after=ev.retry_after)


async def admit(
    svc: Service, greq: GenerateRequest, record: dict[str, Any], endpoint: str, t0: float, err: type[ApiError]
) -> tuple[Tracker, AsyncIterator[StreamEvent]]:
    """Submit and wait for the actor's first event: Accepted, or a refusal raised as ``err``. ``greq``'s nesting
    is already measured (``validation.check_depth``, by the handler that translated it)."""
    events = svc.backend.generate(greq)
    first = await anext(events, None)
    if not isinstance(first, Accepted):
        outcome = "rejected" if isinstance(first, Failed) and first.status == 429 else "error"
        svc.metrics.count_request(endpoint, outcome)
        if isinstance(first, Failed):
            raise failure(first, err)
        raise err(500, "the engine closed the request without answering", code="internal_error")
    track = Tracker(svc, greq, record, endpoint, t0)
    track.accepted(first)
    return track, events


def _shutting_down(err: type[ApiError]) -> ApiError:
    return err(503, "the server is shutting down", code="shutting_down", retry_after=1.0)


async def _collect(
    events: AsyncIterator[StreamEvent], track: Tracker, err: type[ApiError]
) -> tuple[str, Finish]:
    parts: list[str] = []
    async for item in until_drained(events, track.svc.drain):
        ev = _failed_or(item)
        if isinstance(ev, TokenDelta):
            track.delta(ev)
            parts.append(ev.text)
        elif isinstance(ev, Finish):
            if ev.text:  # the held-back tail
                track.first_token()
            track.finished(ev)
            return "".join(parts) + ev.text, ev
        elif isinstance(ev, Failed):
            track.failed(ev.message, "error")
            raise failure(ev, err)
    track.failed("the engine stream ended without a finish event", "error")
    raise err(500, "the engine stream ended without a finish event", code="internal_error")


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns when the client hangs up (the body is already read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(
    request: Request[Any, Any, Any], events: AsyncIterator[StreamEvent], track: Tracker, err: type[ApiError]
) -> tuple[str, Finish]:
    """The whole generated text and the finish event; a client that hangs up cancels the request."""
    work = asyncio.ensure_future(_collect(events, track, err))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            raise err(499, "client disconnected", code="client_disconnected")
        try:
            return work.result()
        except Drained:
            track.abandon("the server is shutting down", "shutting_down")
            raise _shutting_down(err) from None
    finally:
        gone.cancel()
        track.abandon()


class StreamBuilder(Protocol):
    def start(self) -> bytes: ...
    def text(self, text: str) -> bytes: ...
    def finish(self, fin: Finish) -> bytes: ...
    def error(self, err: ApiError) -> bytes: ...


async def _send_watch(track: Tracker, timeout: float) -> None:
    """Frees the lane of a stream whose client stopped reading: once one chunk has waited ``timeout`` seconds for
    the client to take it (``--send-timeout-s``; the server's send blocks when the connection's buffers are full,
    so the stream's generator stays suspended at its ``yield``), the request is cancelled as if the client had hung
    up. The connection stays until the client reads or leaves."""
    loop = asyncio.get_running_loop()
    while not track.done:
        since = track.sending
        if since is not None and loop.time() - since >= timeout:
            track.abandon(f"the client took no data for {timeout:g} s", "cancelled")
            return
        idle = min(timeout / 4, 1.0)  # between chunks: look again soon (a chunk may start waiting at once)
        await asyncio.sleep(idle if since is None else max(since + timeout - loop.time(), 0.0) + 0.01)


async def sse(
    b: StreamBuilder, events: AsyncIterator[StreamEvent], track: Tracker, err: type[ApiError]
) -> AsyncIterator[bytes]:
    """Runs inside Litestar's Stream; a client disconnect cancels this task, and ``finally`` frees the lane, as
    does a client that stops reading: each chunk's wait to be taken is ``Tracker.sending``, which ``_send_watch``
    reads."""
    loop = asyncio.get_running_loop()
    watch = asyncio.ensure_future(_send_watch(track, track.svc.config.send_timeout_s))
    chunks = _sse(b, events, track, err)
    try:
        async for chunk in chunks:
            track.sending = loop.time()
            yield chunk
            track.sending = None
    finally:
        watch.cancel()
        await chunks.aclose()  # its own finally (the lane) now, not when the collector finds it


async def _sse(
    b: StreamBuilder, events: AsyncIterator[StreamEvent], track: Tracker, err: type[ApiError]
) -> AsyncIterator[bytes]:
    """The stream's chunks. Any error after the start (the engine's, the server's shutdown, a bug here) ends the
    stream with one error event in the protocol's shape; the 5xx among them are logged and counted."""
    svc, endpoint = track.svc, track.endpoint
    try:
        yield b.start()
        async for item in until_drained(events, svc.drain):
            ev = _failed_or(item)
            if isinstance(ev, TokenDelta):
                track.delta(ev)
                out = b.text(ev.text) if ev.text else b""
                if out:
                    yield out
            elif isinstance(ev, Finish):
                if ev.text:  # the held-back tail comes before the finish
                    track.first_token()
                out = (b.text(ev.text) if ev.text else b"") + b.finish(ev)
                track.tool_calls = getattr(b, "tool_calls", 0)
                track.finished(ev)
                yield out
                return
            elif isinstance(ev, Failed):
                track.failed(ev.message, "error")
                e = failure(ev, err)
                if e.status >= 500:
                    svc.server_error(endpoint, e)
                yield b.error(e)
                return
        e = err(500, "the engine stream ended without a finish event", code="internal_error")
        track.failed(e.message, "error")
        svc.server_error(endpoint, e)
        yield b.error(e)
    except Drained:
        track.abandon("the server is shutting down", "shutting_down")
        e = _shutting_down(err)
        svc.server_error(endpoint, e)
        yield b.error(e)
    except (
        Exception
    ) as exc:  # a bug while streaming: the client still gets an error event, the log the traceback
        e = err(500, f"internal error: {type(exc).__name__}", code="internal_error")
        track.abandon(e.message, "error")
        svc.server_error(endpoint, e, exc)
        yield b.error(e)
    finally:
        track.abandon()


class EventStream(Stream):
    """A Stream sent as its own media type. Litestar gives a handler's default media type (JSON, for handlers that
    also answer JSON bodies) precedence over a returned Stream's, which sent every SSE stream as JSON."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)


def event_stream(
    b: StreamBuilder, events: AsyncIterator[StreamEvent], track: Tracker, err: type[ApiError]
) -> EventStream:
    """The SSE response of one request: ``text/event-stream``, not cached, not buffered by proxies."""
    return EventStream(sse(b, events, track, err), media_type="text/event-stream", headers=SSE_HEADERS)
