"""Cancels that arrive before their request ("cancel before open"), and the answer such a request gets.

A cancel runs on the actor's control group (its own thread); the ``open`` or ``generate`` it follows runs on the
generation loop, and Ray keeps no order between the two. A large request is also decoded and rendered on the
prompt pool (actors/prepare.py) for up to seconds before the engine sees it. A cancel that finds no running
request under its id is therefore remembered (``CancelBook.remember``) for ``ttl_s``, at most ``limit`` of them
(the oldest go first): an open under that id within that time ends at once with ``cancelled_events`` — the usual
``Accepted`` and ``Finish(reason="cancelled")``, no lane, nothing generated — and consumes the cancel.

An id is not blocked for later requests: a cancel of a request that ended within ``ttl_s`` (a late cancel: its
``Finish`` crossed the cancel) is not remembered, and a remembered cancel ends one open only. What this cannot tell
apart: a cancel for an id that was never opened (or went to another replica) ends the next open under that id if
it comes within ``ttl_s``. Callers that reuse ids should not cancel ids they did not open.

Not thread-safe: the actor holds its own lock around every call (the same lock as its running requests, so that a
cancel either finds the request's handle or is seen by its submit).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from ninfer.engine.core import Accepted, Finish, FinishReason, RequestMetrics, Usage

__all__ = ["CancelBook", "cancelled_events", "CANCEL_TTL_S", "CANCEL_LIMIT"]

CANCEL_TTL_S = 60.0  # longer than a large request's preparation (a million messages: ~10 s on a small CPU)
CANCEL_LIMIT = 4096  # remembered ids (each kind): unknown ids cannot grow the actor's memory without bound


class _Expiring:
    """Ids, each until its deadline; at most ``limit`` (the oldest dropped first)."""

    __slots__ = ("ttl_s", "limit", "_ids")

    def __init__(self, ttl_s: float, limit: int) -> None:
        self.ttl_s, self.limit = ttl_s, limit
        self._ids: OrderedDict[str, float] = OrderedDict()  # id -> deadline, oldest first

    def add(self, rid: str, now: float) -> None:
        self._expire(now)
        self._ids.pop(rid, None)
        self._ids[rid] = now + self.ttl_s
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def take(self, rid: str, now: float) -> bool:
        """Whether ``rid`` is here (and unexpired); it is removed either way."""
        deadline = self._ids.pop(rid, None)
        return deadline is not None and deadline > now

    def __len__(self) -> int:
        return len(self._ids)

    def _expire(self, now: float) -> None:
        while self._ids:
            rid, deadline = next(iter(self._ids.items()))
            if deadline > now:
                return
            del self._ids[rid]


class CancelBook:
    """Cancels waiting for their request, and the ids that ended lately (so that a late cancel is not kept)."""

    def __init__(
        self,
        ttl_s: float = CANCEL_TTL_S,
        limit: int = CANCEL_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._waiting = _Expiring(ttl_s, limit)
        self._ended = _Expiring(ttl_s, limit)
        self.applied = 0  # opens ended at once by a remembered cancel

    def remember(self, rid: str) -> bool:
        """A cancel of ``rid``, which runs nowhere here: kept unless ``rid`` ended lately. Whether it was kept."""
        now = self._clock()
        if self._ended.take(rid, now):
            self._ended.add(rid, now)  # still ended: a second late cancel is not kept either
            return False
        self._waiting.add(rid, now)
        return True

    def ended(self, rid: str) -> None:
        """``rid``'s request ended (finished, failed after admission or cancelled)."""
        self._ended.add(rid, self._clock())

    def cancelled(self, rid: str) -> bool:
        """At ``rid``'s submit: whether a remembered cancel ends it (the cancel is used up; the id counts as ended)."""
        now = self._clock()
        self._ended.take(rid, now)  # a new request under this id: a cancel from now on is its own
        if not self._waiting.take(rid, now):
            return False
        self.applied += 1
        self._ended.add(rid, now)
        return True

    @property
    def waiting(self) -> int:
        return len(self._waiting)


def cancelled_events(prompt_tokens: int) -> list[Accepted | Finish]:
    """What a request cancelled before it reached the engine gets: accepted and finished as cancelled at once, in
    no lane (``lane=-1``), with nothing generated; ``request_id`` -1 (the engine never numbered it)."""
    reason = str(FinishReason.CANCELLED)
    usage = Usage(prompt_tokens=prompt_tokens, cached_tokens=0, completion_tokens=0)
    metrics = RequestMetrics(
        queue_wait_s=0.0,
        prefill_s=0.0,
        decode_s=0.0,
        ttft_s=0.0,
        prompt_tokens=prompt_tokens,
        cached_tokens=0,
        completion_tokens=0,
        finish_reason=reason,
    )
    accepted = Accepted(request_id=-1, prompt_tokens=prompt_tokens, max_tokens=0, queued=False)
    return [accepted, Finish(-1, reason, usage, metrics)]
