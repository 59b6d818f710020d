"""``Scheduler``: FIFO admission into lanes, the per-step plan, checkpoint publishing and retirement.

Pure Python with integer ids (lanes, pages, checkpoints); the model runner carries out the ``Batch`` it plans.

One token-accounting rule: every running request's ``num_computed`` catches up with ``len(tokens)``. A prompt is
computed in chunks, a generated token one step after it was sampled, and a finished request's last token in one
more step (so its end-of-generation checkpoint covers the whole context). Logits are sampled when a request's
work reaches the end of its known tokens while it is still generating.

Admission reserves the request's whole need up front (``prompt + budget`` positions, budget already clamped to
``max_context``), so a running request never waits for memory and nothing is preempted. Only retained,
unreserved prefixes are evicted to make room; reservations are released (oldest first) only when no request is
running, i.e. when nothing else could ever free memory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping

from .config import EngineConfig
from .core import Batch, FinishReason, LaneSetup, LaneWork, QueueFull, Request, RequestStatus
from .kv_pool import PagePool
from .prefix_cache import Match, Node, PrefixCache
from .tiering import Restore, TieredCache

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(self, cfg: EngineConfig, pool: PagePool, cache: PrefixCache | None) -> None:
        self.cfg, self.pool, self.cache = cfg, pool, cache
        self.waiting: deque[Request] = deque()
        self.lanes: list[Request | None] = [None] * cfg.max_concurrency
        self.lane_pages: list[list[int]] = [[] for _ in range(cfg.max_concurrency)]
        self.retired: list[Request] = []  # finished since the engine last drained it
        self._cancelled: set[int] = set()
        self._reservation: dict[int, int] = {}  # request id -> its own reservation (end-of-prompt onwards)
        self._setups: list[LaneSetup] = []  # admitted since the last plan; the runner applies them first
        # admitted with a restore from the host tier in flight: ticket -> (request, its setup held back, the node
        # it resumes from, held in the cache until the setup is out)
        self._restoring: dict[int, tuple[Request, LaneSetup, Node]] = {}
        self._held: dict[int, Node] = {}  # ticket -> that node, between placement and admission
        self.prefix_hit_tokens = 0
        self.host_hit_tokens = 0
        self.prefill_tokens = 0
        self.restore_seconds = 0.0

    # ---- requests in and out ----------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue ``req`` and admit what fits now (so only requests that really wait count as queued). Raises
        ``QueueFull``, with nothing changed, when ``queue_depth`` requests already wait."""
        self.waiting.append(req)
        self._admit()
        if len(self.waiting) > self.cfg.queue_depth:
            assert self.waiting[-1] is req  # FIFO: only the newest can be over the depth
            self.waiting.pop()
            raise QueueFull(f"{self.cfg.queue_depth} requests already wait (queue_depth)")

    def cancel(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    @property
    def running(self) -> list[Request]:
        return [r for r in self.lanes if r is not None]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self._cancelled or any(r is not None for r in self.lanes))

    @property
    def restoring(self) -> bool:
        """A restore from the host tier is in flight (some admitted request waits for it)."""
        return bool(self._restoring)

    def finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        """Stop generating. With prefix reuse the last token is still computed (next step) before retiring."""
        req.finish_reason, req.error = reason, error
        keep = self.cache is not None and reason not in (FinishReason.CANCELLED, FinishReason.ERROR)
        if keep and req.num_computed < len(req.tokens):
            req.status = RequestStatus.FINISHING
        else:
            self._retire(req)

    def _retire(self, req: Request) -> None:
        unrun = [s for s in self._setups if s.lane == req.lane]  # admitted but never run
        self._setups = [s for s in self._setups if s.lane != req.lane]
        for ticket in [t for t, (r, _, _) in self._restoring.items() if r is req]:  # its restore is in flight
            _, setup, node = self._restoring.pop(ticket)
            assert self.cache is not None
            self.cache.hold(node, -1)
            unrun.append(setup)
        for s in unrun:
            if s.copy_page is not None:
                self.pool.decref([s.copy_page[0]])
        if req.lane >= 0:
            self.pool.decref(self.lane_pages[req.lane])
            self.lanes[req.lane], self.lane_pages[req.lane] = None, []
        own = self._reservation.pop(req.id, None)
        superseded = any(pos >= req.prompt_len for pos, _ in req.checkpoints)  # its own end-of-prompt exists
        if self.cache is not None and superseded and req.resumed_reservation != own:
            self.cache.release(req.resumed_reservation)  # this turn supersedes the one it continued
        elif self.cache is not None and not superseded and own != req.resumed_reservation:
            self.cache.release(
                own
            )  # stopped before its prompt ended: the sequence's latest turn stays as it was
        req.status, req.t_finish = RequestStatus.DONE, time.monotonic()
        self.retired.append(req)

    # ---- one step's plan --------------------------------------------------------------------------------
    def schedule(self) -> Batch:
        self._apply_cancels()
        self._admit()
        batch = Batch(setups=self._setups)
        self._setups = []
        self._plan(batch)
        if self.cache is not None:
            batch.free_checkpoints, self.cache.freed_checkpoints = self.cache.freed_checkpoints, []
        if isinstance(self.cache, TieredCache):
            batch.copies = self.cache.drain()
        return batch

    def restored(self, done: list[tuple[int, float]]) -> None:
        """Restores the runner finished (ticket, seconds): their requests' lanes are set up in the next step."""
        for ticket, secs in done:
            assert isinstance(self.cache, TieredCache)
            self.cache.restored(ticket)
            self.restore_seconds += secs
            entry = self._restoring.pop(ticket, None)
            if entry is not None:  # its checkpoint is freed, if at all, after the next step's setups
                req, setup, node = entry
                self.cache.hold(node, -1)
                req.restore, req.restore_s = None, secs
                self._setups.append(setup)

    def _apply_cancels(self) -> None:
        if not self._cancelled:
            return
        for req in [r for r in self.waiting if r.id in self._cancelled]:
            self.waiting.remove(req)
            self.finish(req, FinishReason.CANCELLED)
        for req in self.running:
            if req.id in self._cancelled:
                self.finish(req, FinishReason.CANCELLED)
        self._cancelled.clear()

    def _admit(self) -> None:
        while self.waiting and None in self.lanes:
            req = self.waiting[0]
            setup = self._place(req, self.lanes.index(None))
            if setup is None:  # strict FIFO: nobody overtakes the head of the queue
                return
            self.waiting.popleft()
            req.status, req.lane, req.t_admit = RequestStatus.RUNNING, setup.lane, time.monotonic()
            req.num_computed = req.cached_tokens = setup.length
            self.lanes[setup.lane], self.lane_pages[setup.lane] = req, setup.pages
            self.prefix_hit_tokens += setup.length
            self.host_hit_tokens += req.host_cached_tokens
            if req.restore is not None:  # the lane waits until the copy is on the device
                self._restoring[req.restore] = (req, setup, self._held.pop(req.restore))
            else:
                self._setups.append(setup)

    def _place(self, req: Request, lane: int) -> LaneSetup | None:
        """Pages (and a checkpoint to resume from) for ``req``; None if it must wait."""
        total = self.cfg.pages_for(req.prompt_len + req.budget)
        match = None
        if self.cache is not None:  # resume strictly inside the prompt: the last prompt token is recomputed
            match = self.cache.lookup(req.tokens[: req.prompt_len], req.prompt_len - 1)
        for m in (match, None) if match is not None else (None,):
            setup = self._try_place(req, lane, total, m)
            if setup is not None:
                return setup
        return None

    def _try_place(self, req: Request, lane: int, total: int, m: Match | None) -> LaneSetup | None:
        P = self.cfg.page_size
        restore: Restore | None = None
        if m is not None and m.host:
            got = self._restore(req, total, m)
            if got is None:
                return None
            m, restore = got
        c = m.length if m is not None else 0
        shared = m.pages[: c // P] if m is not None else []
        boundary = [m.pages[c // P]] if m is not None and c % P else []
        self.pool.incref(shared + boundary)  # held before evicting so eviction cannot take them
        if not self._make_room(total - len(shared)):
            self.pool.decref(shared + boundary)
            return None
        fresh = self.pool.alloc(total - len(shared))  # the boundary page is released once copied (after_run)
        if m is None:
            return LaneSetup(lane, fresh, None, 0, None)
        assert self.cache is not None
        self.cache.touch(m.node)
        req.resumed_reservation = self.cache.reservation_of(m.node)
        for q in req.marks:  # a turn start inside the reused part keeps its (earlier) checkpoint reserved
            node = self.cache.node_at(req.tokens, q) if q <= c else None
            if node is not None:
                self._reservation[req.id] = self.cache.extend_reservation(self._reservation.get(req.id), node)
        copy = (boundary[0], fresh[0], c % P) if boundary else None
        if restore is not None:
            self.cache.hold(m.node)
            self._held[restore.ticket] = m.node
            req.restore, req.host_cached_tokens, req.restore_bytes = (
                restore.ticket,
                restore.tokens,
                restore.bytes,
            )
        return LaneSetup(lane, shared + fresh, m.ckpt, c, copy)

    def _restore(self, req: Request, total: int, m: Match) -> tuple[Match, Restore] | None:
        """Bring ``m``'s host part back to the device, with room for the request too; None if it cannot be."""
        cache = self.cache
        assert isinstance(cache, TieredCache)
        cache.pin(m.node)  # nothing below may spill or drop the path being restored
        try:
            if not self._make_room(cache.restore_pages(m) + total - m.length // self.cfg.page_size):
                return None
            restore = cache.restore(m)
        finally:
            cache.pin(m.node, -1)
        if restore is None:
            return None
        again = cache.lookup(req.tokens[: req.prompt_len], req.prompt_len - 1)
        assert again is not None and again.node is m.node and not again.host
        return again, restore

    def _make_room(self, n: int) -> bool:
        if self.pool.free >= n:
            return True
        if self.cache is None:
            return False
        if self.cache.evict_pages(n):
            return True
        if self.running:  # running requests will free memory; reservations stay
            return False
        while self.cache.num_reservations:
            self.cache.release_oldest()
            if self.cache.evict_pages(n):
                return True
        return False

    def _plan(self, batch: Batch) -> None:
        budget = self.cfg.prefill_chunk
        for req in sorted(self.running, key=lambda r: r.id):  # admission order
            start, known = req.num_computed, len(req.tokens)
            if start >= known or req.restore is not None:
                continue
            prefill = start < req.prompt_len
            if prefill:  # a lane's chunks never depend on other lanes: batch invariance
                end = min(start + self.cfg.prefill_chunk, req.prompt_len)
                if self.cache is not None:
                    end = min(end, (start // self.cfg.checkpoint_stride + 1) * self.cfg.checkpoint_stride)
                    end = min([end] + [m for m in req.marks if m > start])
                if end - start > budget:
                    continue
                budget -= end - start
            else:
                end = known
            sample = end == known and req.status is RequestStatus.RUNNING
            ckpt = self._checkpoint_for(req, end)
            batch.work.append(LaneWork(req.lane, start, req.tokens[start:end], prefill, sample, ckpt))

    def _checkpoint_for(self, req: Request, end: int) -> int | None:
        if self.cache is None:
            return None
        prompt_end = end == req.prompt_len or end in req.marks
        gen_end = req.status is RequestStatus.FINISHING and end == len(req.tokens)
        if prompt_end or gen_end or end % self.cfg.checkpoint_stride == 0:
            return self.cache.new_checkpoint(important=prompt_end or gen_end)
        return None

    def abort(self, batch: Batch, message: str) -> None:
        """The runner failed on ``batch``: release what it held and fail every running request."""
        self.pool.decref([s.copy_page[0] for s in batch.setups if s.copy_page is not None])
        for w in batch.work:
            if w.save_checkpoint is not None and self.cache is not None:
                self.cache.discard_checkpoint(w.save_checkpoint)
        if isinstance(
            self.cache, TieredCache
        ):  # copies that may never complete: their host ids are free again
            for ticket in {c.ticket for c in batch.copies if c.ticket}:
                self.restored([(ticket, 0.0)])
        for req in self.running:
            self.finish(req, FinishReason.ERROR, message)

    # ---- after the runner -------------------------------------------------------------------------------
    def after_run(self, batch: Batch, committed: Mapping[int, int] | None = None) -> None:
        """Advance token accounting, publish the checkpoints just taken, retire requests that are done.
        ``committed``: lane -> tokens the lane kept after its verify round (speculation)."""
        self.pool.decref([s.copy_page[0] for s in batch.setups if s.copy_page is not None])
        for w in batch.work:
            req = self.lanes[w.lane]
            if w.verify and req is None:  # stopped inside its round and retired at once
                continue
            assert req is not None and req.num_computed == w.start
            end = committed[w.lane] if w.verify and committed is not None else w.start + len(w.token_ids)
            req.num_computed = end
            if w.prefill:
                self.prefill_tokens += len(w.token_ids)
            if w.save_checkpoint is not None:
                self._publish(req, end, w.save_checkpoint)
            if req.status is RequestStatus.FINISHING and end == len(req.tokens):
                self._retire(req)

    def _publish(self, req: Request, end: int, ckpt: int) -> None:
        assert self.cache is not None
        node = self.cache.publish(req.tokens, end, self.lane_pages[req.lane], ckpt)
        req.checkpoints.append((end, node.id))
        if end == req.prompt_len or end in req.marks or req.status is RequestStatus.FINISHING:
            own = self._reservation.get(req.id)
            self._reservation[req.id] = self.cache.extend_reservation(own, node)
