"""How the actor's events leave the engine thread: wake-ups of the actor's event loop, and the items they become.

Two ways out, both at most one Ray item per ``stream_interval_s`` (the measured cost of an item, ~1 ms of CPU on a
2-core machine on each side, is taken from the GIL the engine's step loop needs):

- ``Wake`` (``EngineActor.generate``, Python jobs): one Ray stream per request; each item the request's events
  since the previous one.
- ``Subscription`` (``EngineActor.subscribe`` / ``open``, the API): one Ray stream per caller for all the requests
  it opened; each item every event of every request since the previous item, as ``(request_id, events)`` pairs
  (``messages.decode_batch``). 8 streams cost one item per interval, not 8. A request's first token and its
  ``Finish`` are never held back by the interval.

The handle queues an event before it calls ``on_event`` (engine thread), so a re-poll after raising ``waiting``
cannot miss one: an event pushed before it is seen by the poll, an event pushed after it schedules a wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ninfer.engine.core import Finish, TokenDelta

__all__ = ["Wake", "Subscription"]


def _resolve(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class Wake:
    """Wake-ups from the engine thread, only while the request's generator actually waits for events.

    While the generator sleeps out its interval only the request's ``Finish`` is scheduled on the loop (it ends
    the pause: a request's last item is never held back by the interval), so a request costs the actor's event
    loop (and the GIL the engine thread needs) at most one wake-up per interval, not one per token. A wait is one
    plain future (resolved by the engine's wake-up, the request's ``Finish`` or the interval's timer): no task, no
    ``wait_for`` per item.
    The handle queues events before calling ``on_event``, so the re-poll after raising ``waiting`` cannot miss
    one: an event pushed before it is seen by the poll, an event pushed after it schedules a wake-up.
    """

    __slots__ = ("loop", "finished", "waiting", "scheduled", "_events", "_pause")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.finished = self.waiting = self.scheduled = False
        self._events: asyncio.Future[None] | None = None  # resolved by an event (while waiting) or the Finish
        self._pause: asyncio.Future[None] | None = None  # resolved by the interval's timer or the Finish

    def on_event(self, ev: Any) -> None:  # engine thread
        if isinstance(ev, Finish):
            self.finished = True
            self.loop.call_soon_threadsafe(self._finished)
        elif self.waiting and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._woken)

    def _finished(self) -> None:
        for fut in (self._events, self._pause):
            _resolve(fut)

    def _woken(self) -> None:
        self.scheduled = False
        _resolve(self._events)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the request finishes meanwhile."""
        if self.finished:
            return
        self._pause = fut = self.loop.create_future()
        timer = self.loop.call_later(seconds, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._pause = None

    async def events(self, handle: Any, timeout: float | None = None) -> list[Any]:
        """Every engine event since the last call, waiting for at least one (at most ``timeout`` seconds: then
        possibly none)."""
        while True:
            got = handle.poll()
            if got:
                return got
            self._events = fut = self.loop.create_future()
            self.waiting = True
            got = handle.poll()
            timer = None
            if not got:
                if timeout is not None:
                    timer = self.loop.call_later(timeout, _resolve, fut)
                await fut
            self.waiting = False
            self._events = None
            if timer is not None:
                timer.cancel()
                return got or handle.poll()
            if got:
                return got


class Subscription:
    """One caller's requests, streamed together. ``watch(request_id, handle)`` gives the ``on_event`` callback
    to submit with; ``batches(interval)`` yields ``[(request_id, events), ...]`` until closed. ``on_finish`` is
    called (on the loop) with each request's ``Finish``."""

    __slots__ = ("loop", "handles", "fresh", "urgent", "waiting", "scheduled", "_fut", "on_finish")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_finish: Callable[[str, Finish], None]) -> None:
        self.loop, self.on_finish = loop, on_finish
        self.handles: dict[str, Any] = {}  # request_id -> engine handle, until its Finish has gone out
        self.fresh: set[str] = set()  # requests whose first token has not gone out yet
        self.urgent = self.waiting = self.scheduled = False
        self._fut: asyncio.Future[None] | None = None

    def watch(self, request_id: str) -> Callable[[Any], None]:
        """The engine callback of request ``request_id`` (add its handle with ``add`` once submitted)."""
        self.fresh.add(request_id)

        def on_event(ev: Any) -> None:  # engine thread
            if isinstance(ev, Finish) or request_id in self.fresh:
                self.urgent = True  # a first token or an end: the interval does not hold it back
                self._wake()
            elif self.waiting:
                self._wake()

        return on_event

    def add(self, request_id: str, handle: Any) -> None:
        self.handles[request_id] = handle

    def _wake(self) -> None:  # engine thread
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        self.scheduled = False
        _resolve(self._fut)

    async def _sleep(self, seconds: float | None) -> None:
        self._fut = fut = self.loop.create_future()
        timer = self.loop.call_later(seconds, _resolve, fut) if seconds is not None else None
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._fut = None

    def _collect(self) -> list[tuple[str, list[Any]]]:
        out = []
        fresh = self.fresh
        for rid, handle in list(self.handles.items()):
            evs = handle.poll()
            if not evs:
                continue
            out.append((rid, evs))
            last = evs[-1]
            if isinstance(last, Finish):
                del self.handles[rid]
                fresh.discard(rid)
                self.on_finish(rid, last)
            elif rid in fresh and any(isinstance(ev, TokenDelta) for ev in evs):
                fresh.discard(rid)
        return out

    async def batches(self, interval: float) -> Any:
        """Every event of every watched request, one list per wake-up, at most one per ``interval`` (a first
        token or a ``Finish`` cuts the pause short)."""
        last = -1e9
        while True:
            pause = last + interval - self.loop.time()
            if pause > 0 and not self.urgent:
                await self._sleep(pause)  # woken early only by an urgent event
            self.urgent = False
            batch = self._collect()
            if not batch:
                self.waiting = True
                batch = self._collect()
                if not batch:
                    await self._sleep(None)  # any event wakes it
                self.waiting = False
            if batch:
                last = self.loop.time()
                yield batch

    def close(self) -> None:
        """The caller is gone: cancel what it left running."""
        for handle in self.handles.values():
            handle.cancel()
        self.handles.clear()
