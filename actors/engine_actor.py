"""The engine actor: one per GPU, owning the resident model, its lanes and its admission queue.

Threads: the engine runs its own step loop. For each request it calls back (on its thread) with every event,
which wakes the actor's event loop only while something there waits for that event (actors/streaming.py); the
loop drains everything since the last item (``handle.poll()``: consecutive deltas merged into one ``TokenDelta``)
and forwards the engine's events as they are, at most one Ray item per ``stream_interval_s`` (the first token and
the ``Finish`` are never delayed). The API opens requests with ``open`` and receives all of their events on one
``subscribe`` stream (one item per interval for every stream together); Python jobs use ``generate``, one stream
per request. Measured decision: each Ray item costs ~0.15-1 ms of CPU in this process, taken from the GIL the
engine's step loop needs (docs/serving.md). Control methods (cancel, stats, health, info) run in their own
concurrency group, on another thread, so they answer while generation runs.

The GIL: the engine's step loop holds it most of the time (the CUDA engine's thread is busy with Python most of a
step), so every other thread of this process (Ray's task and reporting threads, the event loop) takes it from the
step loop. With Python's default switch interval each such take waited up to 5 ms, and an ``open`` or a stream
item takes it a dozen times (Ray's task dispatch, the loop's wake-up, its self-pipe, each prompt's tokenizing,
Ray's report through its thread pool): measured with ``--null-busy`` (ninfer/engine/null_runner.py), a second
``open`` of a burst reached the engine 20-45 ms after the first and its requests ran 20-60 steps alone at the end
of the burst. The actor sets ``ActorSpec.gil_switch_s`` (0.2 ms, below a step) instead: the same work, the same
hand-overs, waits of at most a fifth of a millisecond each.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec
import ray

from ninfer.engine.core import Finish

from . import _engine_adapter as adapter
from . import prepare
from .cancels import CancelBook, cancelled_events
from .messages import (
    ActorInfo,
    ActorSpec,
    ActorStats,
    Failed,
    GenerateRequest,
    Health,
    decode_requests,
    opens_quickly,
)
from .routing import RouteState
from .streaming import Subscription, Wake

__all__ = ["EngineActor", "CTL_CONCURRENCY", "GEN_GROUP"]

_LOG = logging.getLogger("ninfer.actor")
_ENC = msgspec.msgpack.Encoder().encode
GEN_GROUP = "gen"
# The control methods (cancel, stats, health, ...) run in Ray's default group, sized by the actor's max_concurrency,
# so that they answer while generation runs. It is the default group and not a second named one because Ray starts
# each named group's loop thread with a lambda that reads the loop variable late: with two named groups a thread
# that starts after the loop moved on runs the next group's event loop ("This event loop is already running" in
# the other thread) and its own group's calls are never answered (seen on the 2-core CI host, ray 2.60: a replica
# never became ready). One named group leaves that loop one iteration. tests/test_actor_options.py holds this.
CTL_CONCURRENCY = 4
T = TypeVar("T")


class EngineActor:
    _open_engine = staticmethod(adapter.open_engine)  # a subclass may load the model otherwise (perf/)

    def __init__(self, spec: ActorSpec) -> None:
        self._spec = spec
        if spec.gil_switch_s > 0:  # this process's other threads wait less for the step loop's GIL (above)
            sys.setswitchinterval(spec.gil_switch_s)
        self._t0 = time.monotonic()
        self._epoch = uuid.uuid4().hex  # a restarted actor is a new epoch: the router forgets its prefixes
        self._engine = self._open_engine(spec)
        self._lock = (
            threading.Lock()
        )  # guards _handles, _cancels and _failures (the gen and default groups' threads)
        self._handles: dict[str, Any] = {}
        self._cancels = CancelBook()  # cancels that came before their request (actors/cancels.py)
        self._failures = 0
        self._internal_errors = 0  # requests the actor failed itself (a bug), not the engine
        self._prompts = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ninfer-prompt")
        self._subs: dict[str, Subscription] = {}  # the callers' multiplexed streams (gen group's loop only)
        self._closed_subs: set[str] = set()

    # ---- generation ---------------------------------------------------------------------------------
    async def _start(self, req: GenerateRequest, on_event: Any) -> Any:
        """Render, check and submit ``req`` (a small one: decoded on the loop) with engine callback ``on_event``: its
        engine handle, or the ``Failed`` that refuses it."""
        ld = self._engine
        loop = asyncio.get_running_loop()
        try:
            # rendering and tokenizing a long prompt (seconds) and compiling a grammar: off the event loop
            if adapter.renders_quickly(req):
                ids = adapter.prompt_ids(ld, req)
            else:
                ids = await loop.run_in_executor(self._prompts, adapter.prompt_ids, ld, req)
            mask = None
            if prepare.needs_mask(req):
                mask = await loop.run_in_executor(None, adapter.token_mask, ld, req)
        except adapter.PromptError as e:
            return prepare.prompt_failed(e)
        except Exception as e:  # a bug, not the client's fault: logged and counted, never a silent Ray error
            return self._internal_error("generate", req.request_id, e)
        return self._submit(prepare.ready(ld, req, ids, mask), on_event)

    async def _ready_large(self, raw: bytes) -> list[tuple[str, prepare.Outcome]] | Failed:
        """``raw``'s requests made ready on the prompt pool: a large argument is never decoded on the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._prompts, prepare.ready_all, self._engine, raw)

    def _submit(self, r: prepare.Ready | Failed, on_event: Any) -> Any:
        """Submit ready request ``r``: its engine handle, the ``Failed`` that refuses it (``r`` itself if one), or,
        for a request cancelled before it came here, its whole answer (``cancels.cancelled_events``: no lane)."""
        if isinstance(r, Failed):
            return r
        try:
            with self._lock:
                if r.request_id in self._handles:  # a cancel by that id could not tell the two apart
                    return Failed(
                        code="duplicate_request_id",
                        message=f"request_id: {r.request_id!r} is already running on this engine",
                        status=400,
                        param="request_id",
                    )
                if self._cancels.cancelled(r.request_id):  # its cancel came first (actors/cancels.py)
                    return cancelled_events(len(r.ids))
                handle = adapter.submit(self._engine, r.ids, r.sampling, on_event, r.mask, r.thinking)
                self._handles[r.request_id] = handle
        except adapter.QueueFull as e:
            return Failed(code="queue_full", message=str(e), status=429, retry_after=1.0)
        except adapter.RequestRejected as e:
            return Failed(code=e.code or "invalid_request", message=str(e), status=400, param=e.param)
        return handle

    def _finished(self, request_id: str, fin: Finish) -> None:
        with self._lock:
            self._forget(request_id)
            if fin.reason == "error":
                self._failures += 1

    def _forget(self, request_id: str) -> None:
        """``request_id``'s request is over here (hold ``_lock``): a late cancel of it is not remembered."""
        if self._handles.pop(request_id, None) is not None:
            self._cancels.ended(request_id)

    async def _start_one(self, raw: bytes | GenerateRequest, on_event: Any) -> tuple[str, Any]:
        """``generate``'s request (``encode_requests([req])``, or the request itself) started: its id and its engine
        handle or ``Failed``; a large one is decoded and rendered on the prompt pool."""
        if prepare.is_large(raw):
            got = await self._ready_large(raw)  # type: ignore[arg-type]
            if isinstance(got, Failed):
                return "", got
            if len(got) != 1:
                return "", Failed(
                    code="invalid_request", message="generate: expected one request", status=400
                )
            rid, outcome = got[0]
            return rid, self._submit(self._settled("generate", rid, outcome), on_event)
        try:
            req = raw if isinstance(raw, GenerateRequest) else prepare.decode_one(raw)
        except (msgspec.DecodeError, TypeError, ValueError) as e:
            return "", Failed(code="invalid_request", message=f"generate: {e}", status=400)
        return req.request_id, await self._start(req, on_event)

    @ray.method(num_returns="streaming", concurrency_group=GEN_GROUP)
    async def generate(self, req: bytes | GenerateRequest) -> AsyncIterator[bytes]:
        """One request's stream (Python jobs): msgpack-encoded lists of StreamEvents (``messages.decode_events``),
        each every event since the previous item; ``Accepted`` comes with the first token when that comes within
        an interval (a queued request's ``Accepted`` goes at once), the last delta with the ``Finish``. ``req``:
        ``messages.encode_requests([request])`` (what ``EngineClient`` sends: a large one is decoded off the
        loop) or the ``GenerateRequest`` itself."""
        loop = asyncio.get_running_loop()
        wake = Wake(loop)
        rid, handle = await self._start_one(req, wake.on_event)
        done = _settled_answer(handle)
        if done is not None:
            yield _ENC(done)
            return
        finished, interval = False, self._spec.stream_interval_s
        try:
            items = [handle.accepted]  # the engine's budget: max_tokens clamped once, by the engine
            if not handle.accepted.queued:
                items += await wake.events(handle, timeout=interval)
            last = loop.time() if len(items) > 1 else -1e9
            while True:
                if isinstance(items[-1], Finish):
                    finished = True
                    self._finished(rid, items[-1])
                yield _ENC(items)  # one Ray item: every event since the last one, consecutive deltas merged
                if finished:
                    break
                pause = last + interval - loop.time()  # at most one item per interval; the first token and
                if pause > 0:  # the Finish are not delayed (the Finish ends the pause)
                    await wake.pause(pause)
                items = await wake.events(handle)
                last = loop.time()
        finally:
            # the consumer may vanish (client disconnect drops the generator): never leave the lane busy
            with self._lock:
                self._forget(rid)
            if not finished:
                handle.cancel()

    def _settled(self, where: str, request_id: str, outcome: prepare.Outcome) -> prepare.Ready | Failed:
        """A prepared request as ``_submit`` takes it: an exception while preparing it (a bug) is logged, counted
        and answered as a 500."""
        if isinstance(outcome, Exception):
            return self._internal_error(where, request_id, outcome)
        return outcome

    def _subscription(self, sub_id: str) -> Subscription:
        sub = self._subs.get(sub_id)
        if sub is None:
            sub = self._subs[sub_id] = Subscription(asyncio.get_running_loop(), self._finished)
        return sub

    @ray.method(num_returns="streaming", concurrency_group=GEN_GROUP)
    async def subscribe(self, sub_id: str) -> AsyncIterator[bytes]:
        """The events of every request the caller opens (``open``) under ``sub_id``: msgpack-encoded lists of
        ``(request_id, events)`` (``messages.decode_batch``), at most one item per stream interval for all of
        them (a first token or a ``Finish`` is never held back). Ends (and cancels what is left) when the caller
        goes away."""
        sub = self._subscription(sub_id)
        try:
            async for batch in sub.batches(self._spec.stream_interval_s):
                yield _ENC(batch)
        finally:
            self._subs.pop(sub_id, None)
            self._closed_subs.add(sub_id)
            with self._lock:
                for rid in sub.handles:
                    self._forget(rid)
            sub.close()

    @ray.method(concurrency_group=GEN_GROUP)
    async def open(self, reqs: bytes | list[GenerateRequest], sub_id: str) -> bytes:
        """Admit the requests of ``reqs`` (``messages.encode_requests``: what the caller opened in one turn of its
        event loop, one Ray call), in order; their events follow on the caller's ``subscribe(sub_id)`` stream.
        Returns, msgpack-encoded, for each request ``[Accepted]`` (the engine's budget) or ``[Failed]``."""
        if prepare.is_large(reqs):  # decoded, rendered and freed on the prompt pool; then admitted together
            got = await self._ready_large(reqs)  # type: ignore[arg-type]
            if isinstance(got, Failed):
                return _ENC([[got]])
            sub = self._open_subscription(sub_id)
            if isinstance(sub, Failed):
                return _ENC([[sub] for _ in got])
            with adapter.admitting(self._engine):
                return _ENC([self._admit(sub, rid, self._settled("open", rid, o)) for rid, o in got])
        try:
            batch = decode_requests(reqs)
        except (
            msgspec.DecodeError,
            TypeError,
            ValueError,
        ) as e:  # the caller's bug: one refusal for the call
            return _ENC([[Failed(code="invalid_request", message=f"open: {e}", status=400)]])
        sub = self._open_subscription(sub_id)
        if isinstance(sub, Failed):
            return _ENC([[sub] for _ in batch])
        if len(batch) == 1:
            return _ENC([await self._open_one(sub, batch[0])])
        # the quick ones are rendered first, then admitted together (one engine step prefills them all, their
        # first tokens and their ends come in the same steps: fewer steps and fewer items); a long prompt renders
        # on a thread and a grammar compiles there: the others are not held up by it
        quick = [i for i, req in enumerate(batch) if opens_quickly(req)]
        answers: list[Any] = [None] * len(batch)
        for i, ans in zip(quick, self._open_together(sub, [batch[i] for i in quick]), strict=True):
            answers[i] = ans
        rest = [i for i in range(len(batch)) if answers[i] is None]
        for i, ans in zip(
            rest, await asyncio.gather(*(self._open_one(sub, batch[i]) for i in rest)), strict=True
        ):
            answers[i] = ans
        return _ENC(answers)

    def _open_subscription(self, sub_id: str) -> Subscription | Failed:
        if sub_id in self._closed_subs:
            return Failed(
                code="engine_unavailable", message="the caller's event stream is closed", status=503
            )
        return self._subscription(sub_id)

    async def _open_one(self, sub: Subscription, req: GenerateRequest) -> list[Any]:
        try:  # one request's failure is its own: never the batch's
            handle = await self._start(req, sub.watch(req.request_id))
        except Exception as e:
            handle = self._internal_error("open", req.request_id, e)
        return self._opened(sub, req.request_id, handle)

    def _open_together(self, sub: Subscription, reqs: list[GenerateRequest]) -> list[list[Any]]:
        """Open requests that render quickly and compile nothing: every prompt rendered first, then all submitted
        while the engine's admission is held, so that its next step admits them all."""
        ready = [self._settled("open", req.request_id, prepare.ready_one(self._engine, req)) for req in reqs]
        with adapter.admitting(self._engine):
            return [self._admit(sub, req.request_id, r) for req, r in zip(reqs, ready, strict=True)]

    def _admit(self, sub: Subscription, request_id: str, r: prepare.Ready | Failed) -> list[Any]:
        if isinstance(r, Failed):
            return [r]
        try:  # one request's failure is its own: never the batch's
            handle = self._submit(r, sub.watch(request_id))
        except Exception as e:
            handle = self._internal_error("open", request_id, e)
        return self._opened(sub, request_id, handle)

    @staticmethod
    def _opened(sub: Subscription, request_id: str, handle: Any) -> list[Any]:
        done = _settled_answer(handle)
        if done is not None:
            sub.fresh.discard(request_id)
            return done
        sub.add(request_id, handle)
        return [handle.accepted]

    # ---- control ------------------------------------------------------------------------------------
    async def cancel(self, request_id: str) -> bool:
        """Cancel ``request_id``: True if it was running or queued here (its stream ends with a cancelled
        ``Finish``). False otherwise; unless it ended lately, the cancel is then remembered for its open, which may
        still be on its way (actors/cancels.py)."""
        with self._lock:
            handle = self._handles.get(request_id)
            if handle is None:
                self._cancels.remember(request_id)
        if handle is None:
            return False
        handle.cancel()
        return True

    async def count_tokens(self, req: bytes | GenerateRequest) -> int | Failed:
        """Prompt tokens of ``req`` (``encode_requests([request])`` or the request itself) as ``generate`` would
        render it (nothing runs on the model). Decoded and counted on the prompt pool, whatever its size."""
        return await self._on_pool("count_tokens", req, functools.partial(adapter.count_prompt, self._engine))

    async def _on_pool(
        self, where: str, raw: bytes | GenerateRequest, fn: Callable[[GenerateRequest], T]
    ) -> T | Failed:
        """``fn`` of ``raw``'s one request, decoded and run on the prompt pool (the request is freed there too)."""
        loop = asyncio.get_running_loop()
        rid, out = await loop.run_in_executor(self._prompts, prepare.apply_one, raw, fn)
        return self._internal_error(where, rid, out) if isinstance(out, Exception) else out

    def _internal_error(self, where: str, request_id: str, e: Exception) -> Failed:
        _LOG.error("%s of request %s failed", where, request_id, exc_info=e)
        with self._lock:
            self._internal_errors += 1
        return Failed(code="internal_error", message=f"internal error: {type(e).__name__}", status=500)

    async def stats(self) -> ActorStats:
        eng = adapter.engine_stats(self._engine)
        with self._lock:
            open_streams, failures, internal = len(self._handles), self._failures, self._internal_errors
            early = self._cancels.applied
        return ActorStats(
            lanes_total=int(eng["lanes_total"]),
            lanes_busy=int(eng["lanes_busy"]),
            queue_len=int(eng["queue_length"]),
            queue_depth=int(eng["queue_depth"]),
            open_streams=open_streams,
            engine_failures=failures,
            internal_errors=internal,
            cancelled_before_start=early,
            uptime_s=time.monotonic() - self._t0,
            engine=eng,
        )

    async def route_state(self, block_tokens: int, since: int) -> RouteState:
        """What a router needs (actors/routing.py): load, and the retained prefixes' block hashes unless they
        are still those of version ``since``."""
        return adapter.route_state(self._engine, self._epoch, block_tokens, since)

    async def prompt_blocks(self, req: bytes | GenerateRequest, block_tokens: int) -> list[int] | Failed:
        """The block hashes of ``req``'s rendered prompt (a Python job routes with them: it has no tokenizer);
        rendered and hashed on the prompt pool."""

        def blocks(r: GenerateRequest) -> list[int]:
            return adapter.chain_hashes(adapter.count_prompt_ids(self._engine, r), block_tokens)

        return await self._on_pool("prompt_blocks", req, blocks)

    async def health(self) -> Health:
        ok, detail = adapter.engine_alive(self._engine)
        return Health(ok=ok, detail=detail)

    async def info(self) -> ActorInfo:
        return adapter.engine_info(self._engine)

    async def shutdown(self) -> None:
        self._prompts.shutdown(wait=False, cancel_futures=True)
        adapter.close(self._engine)


def _settled_answer(handle: Any) -> list[Any] | None:
    """What ``_submit`` returned, as the whole answer of a request that never got a lane (its ``Failed``, or the
    events of a cancel that came first), or None for an engine handle."""
    if isinstance(handle, Failed):
        return [handle]
    return handle if isinstance(handle, list) else None
