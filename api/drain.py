"""Graceful shutdown: on SIGTERM/SIGINT stop taking requests, let running ones finish, end what is left cleanly.

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
from collections.abc import AsyncIterator
from types import FrameType
from typing import TypeVar

import uvicorn

__all__ = ["Drain", "DrainingServer", "Drained", "until_drained"]

_LOG = logging.getLogger("ninfer.api")
T = TypeVar("T")
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

    @property
    def expired(self) -> asyncio.Event:
        if self._expired is None:
            self._expired = asyncio.Event()
        return self._expired

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
            self.expired.set()
            settle = loop.time() + _SETTLE_S
            while self.inflight and loop.time() < settle:
                await asyncio.sleep(0.05)
        _LOG.warning("drained")


async def until_drained(events: AsyncIterator[T], drain: Drain) -> AsyncIterator[T]:
    """``events``, until the drain's grace period ends: then raises ``Drained`` (and closes ``events``)."""
    stop = asyncio.ensure_future(drain.expired.wait())
    nxt: asyncio.Future[T] | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(anext(events))
            await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                raise Drained
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                return
            yield ev
    finally:  # drained, or the consumer left (client gone): never leave the pending read behind
        stop.cancel()
        if nxt is not None and not nxt.done():
            nxt.cancel()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain in front of its own shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
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
