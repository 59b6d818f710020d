"""``ReplicaRouter``: several engine replicas behind the API as one engine backend (docs/replicas.md).

It implements what the API needs from the engine (api/service.py's ``EngineBackend``): a request goes to the
replica ``routing.rank`` puts first; a replica that answers 429 or is gone before it accepted the request is
skipped for the next one, so the client sees 429 only when every replica refused it, and 503 only when none is
up. After ``Accepted`` the request stays where it is: a replica that dies mid-stream ends its streams with the
``engine_unavailable`` failure (503, or an error event once streaming) and leaves the rotation. A poll task
fetches every replica's ``RouteState`` each ``poll_interval_s``: it takes a silent replica out of rotation and
puts it back when Ray has restarted it (a new epoch, an empty cache).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ninfer.engine.core import Accepted, Finish

from .messages import ActorStats, Failed, GenerateRequest, Health, StreamEvent
from .routing import ReplicaView, RouterConfig, merge_stats, rank

__all__ = ["ReplicaRouter", "RouterCounters", "PromptKey"]

_LOG = logging.getLogger("ninfer.api")
INLINE_PROMPT = 2048  # prompts up to this many characters (or token ids) are keyed on the event loop itself
# ... and of at most this many messages and tools: the character count covers contents only, so a million empty
# messages (no characters at all) were rendered on the event loop, and measuring them walked every one there
INLINE_PARTS = 64


class PromptKey(Protocol):
    """A request's prompt block hashes (actors/route_prompt.py's ``PromptBlocks``) and what computing them costs."""

    def __call__(self, req: GenerateRequest) -> list[int]: ...
    def size(self, req: GenerateRequest) -> int: ...


@dataclass(slots=True)
class RouterCounters:
    affinity_hits: int = 0  # requests accepted by the replica holding their prefix
    least_loaded: int = 0  # requests with no prefix worth following, sent to the least-loaded replica
    fallback_full: int = 0  # the affinity replica was full (or answered 429): sent elsewhere
    fallback_imbalance: int = 0  # the affinity replica was too much busier than the others
    fallback_unavailable: int = 0  # a replica was gone when a request was sent to it: sent elsewhere
    rejected_all_full: int = 0  # every replica refused: 429
    no_replica: int = 0  # none was up: 503
    replica_failures: int = 0  # times a replica left the rotation (died, or stopped answering polls)


class ReplicaRouter:
    """The API's engine backend over ``clients`` (``AsyncEngineClient`` of each replica, index = replica) whose
    lanes and queue depths are ``lanes_queue``; ``blocks`` gives a request's prompt block hashes."""

    def __init__(
        self,
        clients: list[Any],
        lanes_queue: list[tuple[int, int]],
        cfg: RouterConfig,
        blocks: PromptKey,
        names: list[str] | None = None,
    ) -> None:
        names = names or [str(i) for i in range(len(clients))]
        self.views = [
            ReplicaView(index=i, name=n, client=c, capacity=lanes + depth, lanes=lanes)
            for i, (c, (lanes, depth), n) in enumerate(zip(clients, lanes_queue, names, strict=True))
        ]
        self.cfg, self._blocks = cfg, blocks
        self.counters = RouterCounters()
        self._where: dict[str, ReplicaView] = {}  # request id -> replica, while it runs
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninfer-route")
        self._pollers: list[asyncio.Task[None]] = []

    # ---- the engine backend -------------------------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        self._ensure_poller()
        parts = len(req.messages or ()) + len(req.tools or ())
        small = parts <= INLINE_PARTS and self._blocks.size(req) <= INLINE_PROMPT
        if small:  # well under a millisecond: cheaper here than a hop to a thread and back
            blocks = self._blocks(req)
        else:  # render + tokenize a long prompt off the event loop
            blocks = await asyncio.get_running_loop().run_in_executor(self._pool, self._blocks, req)
        r = rank(self.views, blocks, self.cfg)
        refusal: Failed | None = None
        for view in r.order:
            first, events = await self._submit(view, req)
            if isinstance(first, Accepted):
                self._accepted(view, r, blocks, refusal)
                break
            if not (
                isinstance(first, Failed) and (first.status == 429 or first.code == "engine_unavailable")
            ):
                if first is not None:
                    yield first  # a refusal every replica would give (a bad prompt): as it is
                return
            refusal = first
            if first.status == 429:
                view.polled_load = max(view.polled_load, view.capacity)  # full until the next poll
            else:
                self._lost(view, "it failed a request")
        else:
            yield self._refused(refusal)
            return
        self._where[req.request_id] = view
        admitted, finished, retired = time.monotonic(), False, False

        def retire() -> None:  # once: at the terminal event, or when the caller goes away
            nonlocal retired
            if not retired:
                retired = True
                view.inflight -= 1
                view.retired(admitted, time.monotonic())
                self._where.pop(req.request_id, None)

        try:
            ev = first
            while True:
                if isinstance(ev, Failed) and ev.code == "engine_unavailable":
                    self._lost(view, "it died mid-stream")
                # retired before the terminal event is handed on: the caller answers its client with it, and
                # that client's next turn may reach the router before this generator is resumed or closed (a
                # session's next turn saw its replica's lane still taken and went elsewhere)
                finished = isinstance(ev, Finish | Failed)
                if finished:
                    retire()
                yield ev
                ev = await anext(events, None)
                if ev is None:
                    break
        finally:
            retire()
            if not finished:  # the caller went away: free the lane there
                view.client.cancel(req.request_id)
                await events.aclose()

    async def _submit(
        self, view: ReplicaView, req: GenerateRequest
    ) -> tuple[Any, AsyncIterator[StreamEvent]]:
        """Send ``req`` to ``view`` and wait for its first event. The request counts in the replica's load from
        now on (so a burst of requests ranked before any is accepted spreads), and stops counting unless it was
        accepted."""
        view.inflight += 1
        events = view.client.generate(req)
        first = None
        try:
            first = await anext(events, None)
        finally:
            if not isinstance(first, Accepted):
                view.inflight -= 1
                if first is None:  # cancelled (the client left) or cut off: the replica may have taken it
                    view.client.cancel(req.request_id)
                await events.aclose()
        return first, events

    def _refused(self, refusal: Failed | None) -> Failed:
        if refusal is not None and refusal.status == 429:
            self.counters.rejected_all_full += 1
            return refusal
        self.counters.no_replica += 1
        return Failed(code="no_replica", message="no engine replica is up", status=503, retry_after=1.0)

    def _accepted(self, view: ReplicaView, r: Any, blocks: list[int], refusal: Failed | None) -> None:
        c = self.counters
        if r.affinity is view:
            c.affinity_hits += 1
        elif r.affinity is not None and r.reason in ("full", "imbalance"):
            c.fallback_full += r.reason == "full"
            c.fallback_imbalance += r.reason == "imbalance"
        elif refusal is not None:
            c.fallback_full += refusal.status == 429
            c.fallback_unavailable += refusal.status != 429
        else:
            c.least_loaded += 1
        view.routed += 1
        view.remember(blocks, self.cfg.recent_ttl_s, time.monotonic())

    def cancel(self, request_id: str) -> None:
        view = self._where.get(request_id)
        if view is not None:
            view.client.cancel(request_id)

    async def count_tokens(self, req: GenerateRequest) -> int | Failed:
        r = rank(self.views, [], self.cfg)
        if not r.order:
            return Failed(code="no_replica", message="no engine replica is up", status=503, retry_after=1.0)
        return await r.order[0].client.count_tokens(req)

    async def health(self) -> Health:
        """Every replica asked now; ok while one is up. ``replicas``: each one's status by name."""
        self._ensure_poller()
        await asyncio.gather(*(self._poll(v) for v in self.views))
        up = [v for v in self.views if v.up]
        status = {v.name: "ok" if v.up else "unavailable" for v in self.views}
        down = [v.name for v in self.views if not v.up]
        detail = f"replicas down: {', '.join(down)}" if down else ""
        return Health(ok=bool(up), detail=detail if up else "no engine replica is up", replicas=status)

    async def stats(self) -> ActorStats:
        """The replicas' stats summed (each kept on its view for the per-replica metrics)."""

        async def one(v: ReplicaView) -> None:
            try:
                v.stats = await asyncio.wait_for(v.client.stats(), self.cfg.probe_timeout_s)
            except Exception:  # restarting or gone: no figures this scrape
                v.stats = None

        await asyncio.gather(*(one(v) for v in self.views))
        return merge_stats([v.stats for v in self.views if v.stats is not None])

    # ---- polling -------------------------------------------------------------------------------------------
    def _ensure_poller(self) -> None:
        if not self._pollers or any(t.done() for t in self._pollers):
            for t in self._pollers:
                t.cancel()
            loop = asyncio.get_running_loop()
            self._pollers = [loop.create_task(self._poll_forever(v)) for v in self.views]

    async def _poll_forever(self, view: ReplicaView) -> None:
        """One loop per replica: a silent one (probe timeout) delays no other replica's poll."""
        while True:
            await self._poll(view)
            await asyncio.sleep(self.cfg.poll_interval_s)

    async def _poll(self, view: ReplicaView) -> None:
        sent = time.monotonic()
        try:
            st = await asyncio.wait_for(
                view.client.route_state(self.cfg.block_tokens, view.version), self.cfg.probe_timeout_s
            )
        except Exception as e:  # the actor died, is restarting, or does not answer: out of rotation
            self._lost(view, f"its poll failed ({type(e).__name__})")
            return
        back = view.apply(st, sent)
        view.poll_sent, view.poll_done = sent, time.monotonic()
        if back:
            _LOG.warning("replica %s is back in rotation (epoch %s)", view.name, st.epoch[:8])

    def _lost(self, view: ReplicaView, why: str) -> None:
        if view.down():
            self.counters.replica_failures += 1
            _LOG.error("replica %s left the rotation: %s", view.name, why)

    async def close(self) -> None:
        for t in self._pollers:
            t.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
