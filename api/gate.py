"""The ASGI gate in front of the Litestar app: CORS preflight, API-key check, the body-size cap, the body read
timeout and deadline and, while the server drains for shutdown, the refusal of new requests.

It runs before routing (as upstream does), so an unknown path without a key is a 401, not a 404, and an
oversized body is refused before anything parses it. Every refusal uses the error shape of its path (Anthropic's
under ``/v1/messages``, OpenAI's elsewhere), including a 413 found only while a chunked body is being read.

The drain (``Drain``, ``until_drained``, ``DrainingServer``) is graceful shutdown: on SIGTERM/SIGINT stop taking
requests, let running ones finish, end what is left cleanly.
1. The first signal starts the drain: every new request is answered 503 ``shutting_down`` with ``Retry-After``
   (the listening socket stays open, so clients get an answer instead of a refused connection), and
   ``GET /health`` says ``draining``.
2. Requests already running get ``--shutdown-grace-s`` seconds to finish as usual.
3. Then each one still open ends with an error in its protocol's shape — an SSE error event for a stream, a 503
   body otherwise — and is cancelled on the engine (its tokens and timings are logged like any cancellation).
4. uvicorn then shuts down as usual. A second signal skips what is left of the drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any, TypeVar

import uvicorn

from .auth import KeyRing, presented_keys
from .cors import with_cors
from .errors import ApiError, error_json

__all__ = ["Gate", "KEY_NAME_SCOPE", "Drain", "DrainingServer", "Drained", "until_drained"]

_LOG = logging.getLogger("ninfer.api")
T = TypeVar("T")

KEY_NAME_SCOPE = "ninfer.key_name"  # scope key: who the API key that authenticated the request belongs to
_OPEN_PATHS = frozenset({"/health"})
_WHILE_DRAINING = frozenset({"/health", "/metrics"})  # still answered while the server drains

OnRefusal = Callable[[str, ApiError], None]  # (path, error): called for every 5xx the gate answers


class Gate:
    def __init__(
        self,
        app: Any,
        *,
        keyring: KeyRing | None,
        max_body_bytes: int,
        cors: bool,
        body_timeout_s: float | None = None,
        body_deadline_s: float | None = None,
        drain: Drain | None = None,
        on_refusal: OnRefusal | None = None,
    ) -> None:
        self.app = app
        self.keyring = keyring
        self.max_body_bytes = max_body_bytes
        self.cors = cors
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_deadline_s
        self.drain = drain
        self.on_refusal = on_refusal

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.cors:
            send = with_cors(send, scope)
            if scope["method"] == "OPTIONS":
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        if self.drain is not None and self.drain.draining and scope["path"] not in _WHILE_DRAINING:
            err = _error(scope, 503, "the server is shutting down", "shutting_down", retry_after=1.0)
            if self.on_refusal is not None:
                self.on_refusal(scope["path"], err)
            await _reply(send, err)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.keyring is not None and self.keyring.enabled and scope["path"] not in _OPEN_PATHS:
            who = self.keyring.identify_any(presented_keys(headers))
            if who is None:
                await _reply(send, _error(scope, 401, "missing or invalid API key", "invalid_api_key"))
                return
            scope[KEY_NAME_SCOPE] = who
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _reply(send, self._too_large(scope))
            return
        if scope["method"] == "HEAD":
            # HEAD is GET without a body (RFC 9110 §9.3.2): health probes and `curl -I` use it. The copy keeps
            # uvicorn's own scope saying HEAD, so uvicorn drops the body bytes and keeps the headers.
            scope = {**scope, "method": "GET"}
        if self.drain is not None:
            self.drain.inflight += 1
        try:
            await self.app(scope, self._reading(scope, receive), send)
        finally:
            if self.drain is not None:
                self.drain.inflight -= 1

    def _too_large(self, scope: dict[str, Any]) -> ApiError:
        mib = self.max_body_bytes >> 20
        return _error(scope, 413, f"request body exceeds the {mib} MiB limit", "request_too_large")

    def _reading(self, scope: dict[str, Any], receive: Any) -> Any:
        """A receive that raises 413 once a chunked body passes the cap (Content-Length was absent or lied) and
        408 when the next piece of the body takes longer than the body timeout, or the whole body longer than
        the body deadline (counted from now: the head is complete). A 408 closes the connection."""
        seen = 0
        body_done = False
        loop = asyncio.get_running_loop()
        deadline = None if self.body_deadline_s is None else loop.time() + self.body_deadline_s

        async def guarded() -> dict[str, Any]:
            nonlocal seen, body_done
            wait = _min_or_none(self.body_timeout_s, None if deadline is None else deadline - loop.time())
            if body_done or wait is None:
                msg = await receive()  # after the body only the disconnect is left to wait for
            else:
                try:
                    msg = await asyncio.wait_for(receive(), max(wait, 0.0))
                except TimeoutError:
                    raise self._timed_out(scope, deadline is not None and loop.time() >= deadline) from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                body_done = not msg.get("more_body", False)
                if seen > self.max_body_bytes:
                    raise self._too_large(scope)
            return msg

        return guarded

    def _timed_out(self, scope: dict[str, Any], whole: bool) -> ApiError:
        if whole:
            what = f"the request body did not arrive within {self.body_deadline_s:g} s"
        else:
            what = f"no request body data for {self.body_timeout_s:g} s"
        return _error(scope, 408, what, "request_timeout")


def _min_or_none(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _error(
    scope: dict[str, Any], status: int, message: str, code: str | None, retry_after: float | None = None
) -> ApiError:
    from .anthropic import error_class

    return error_class(scope["path"])(status, message, code=code, retry_after=retry_after)


async def _reply(send: Any, err: ApiError) -> None:
    body = error_json(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers().items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---- the drain (graceful shutdown) --------------------------------------------------------------------------
_SETTLE_S = 2.0  # after the grace period: time for the ended requests to write their error and return


class Drained(Exception):
    """The grace period ended while this request was still running."""


class Drain:
    """Shutdown state shared by the gate, the handlers and the server; lives on the event loop's thread."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested = False
        self.draining = False
        self.inflight = 0
        self._expired: asyncio.Event | None = None
        self._waits: set[_Wait] = set()  # the streams' reads in progress (until_drained), ended at expiry

    @property
    def expired(self) -> asyncio.Event:
        if self._expired is None:
            self._expired = asyncio.Event()
        return self._expired

    def expire(self) -> None:
        """The grace period is over: every running stream's read ends with ``Drained`` (``until_drained``)."""
        self.expired.set()
        for wait in list(self._waits):
            wait.end()

    async def run(self) -> None:
        """Refuse new requests, wait for the running ones (at most the grace period), then end the rest."""
        loop = asyncio.get_running_loop()
        self.draining = True
        _LOG.warning("draining: new requests get 503; %d running get %.0f s", self.inflight, self.grace_s)
        deadline = loop.time() + self.grace_s
        while self.inflight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.inflight:
            _LOG.warning("grace period over: ending %d running requests with an error", self.inflight)
            self.expire()
            settle = loop.time() + _SETTLE_S
            while self.inflight and loop.time() < settle:
                await asyncio.sleep(0.05)
        _LOG.warning("drained")


class _Wait:
    """One stream's read: cancelled at the drain's expiry while it waits (its task then raises ``Drained``)."""

    __slots__ = ("task", "ended", "cancelled")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None  # the task awaiting the next event (None between reads)
        self.ended = self.cancelled = False

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            if self.task is not None:
                self.cancelled = True
                self.task.cancel()


async def until_drained(events: AsyncIterator[T], drain: Drain) -> AsyncIterator[T]:
    """``events``, until the drain's grace period ends: then raises ``Drained`` (and closes ``events``). Each event
    is awaited in the consumer's own task (no task and no ``asyncio.wait`` per event): the drain's expiry cancels
    that await, and the cancellation becomes ``Drained`` here."""
    wait = _Wait()
    if drain.expired.is_set():
        raise Drained
    drain._waits.add(wait)
    it = aiter(events)
    try:
        while True:
            if wait.ended:
                raise Drained
            wait.task = task = asyncio.current_task()
            try:
                ev = await anext(it)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                # the drain's cancellation becomes Drained; the caller's own (client gone) stays a cancellation
                if wait.cancelled and task is not None and task.uncancel() == 0:
                    raise Drained from None
                raise
            finally:
                wait.task = None
            if wait.ended:  # ended while the event was on its way (or the stream swallowed the cancellation)
                if wait.cancelled and task is not None:
                    task.uncancel()
                raise Drained
            yield ev
    finally:
        drain._waits.discard(wait)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain in front of its own shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._drain_task: asyncio.Task[None] | None = None
        self.signals: list[int] = []  # the stop signals received, in order (SIGINT: the exit status is 130)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals.append(sig)
        if self.drain.requested:  # a second signal: uvicorn's own (graceful, then forced) exit
            super().handle_exit(sig, frame)
            return
        self.drain.requested = True  # picked up by on_tick, on the event loop

    async def on_tick(self, counter: int) -> bool:
        if self.drain.requested and self._drain_task is None:
            self._drain_task = asyncio.create_task(self.drain.run())
        if self._drain_task is not None and self._drain_task.done():
            self.should_exit = True
        return await super().on_tick(counter)
