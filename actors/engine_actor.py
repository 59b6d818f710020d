"""The engine actor: one per GPU, owning the resident model, its lanes and its admission queue.

Threads: the engine runs its own step loop. For each request it calls back (on its thread) with every event,
which wakes the request's ``generate`` generator on the actor's event loop only while that generator waits;
the generator drains everything since its last item (``handle.poll()``: consecutive deltas merged into one
``TokenDelta``) and forwards the engine's events as they are, at most one wake-up per ``stream_interval_s``.
Measured decision: each Ray item costs ~0.15-0.6 ms of Python in this process, and that time is taken from the
GIL the engine's step loop needs. On the demo model (8 lanes, ~5 ms steps, H200 host, 16 cores, reference
backend) the stack cost 25% of engine-alone throughput at 20 ms and 9% at 50 ms, hence the 50 ms default (the
first token is never delayed, and neither is the last: the request's ``Finish`` ends the pause). Control methods (cancel, stats, health, info) run in their
own concurrency group, on another thread, so they answer while generation runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import ray

from ninfer.engine.core import Finish

from . import _engine_adapter as adapter
from .messages import ActorInfo, ActorSpec, ActorStats, Failed, GenerateRequest, Health
from .routing import RouteState

__all__ = ["EngineActor", "actor_options", "start_actor", "CTL_GROUP", "GEN_GROUP"]

CTL_GROUP = "ctl"
_LOG = logging.getLogger("ninfer.actor")
_ENC = msgspec.msgpack.Encoder().encode
GEN_GROUP = "gen"


class EngineActor:
    _open_engine = staticmethod(adapter.open_engine)  # a subclass may load the model otherwise (perf/)

    def __init__(self, spec: ActorSpec) -> None:
        self._spec = spec
        self._t0 = time.monotonic()
        self._epoch = uuid.uuid4().hex  # a restarted actor is a new epoch: the router forgets its prefixes
        self._engine = self._open_engine(spec)
        self._lock = threading.Lock()  # guards _handles and _failures (gen and ctl threads)
        self._handles: dict[str, Any] = {}
        self._failures = 0
        self._internal_errors = 0  # requests the actor failed itself (a bug), not the engine
        self._prompts = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ninfer-prompt")

    # ---- generation ---------------------------------------------------------------------------------
    @ray.method(num_returns="streaming", concurrency_group=GEN_GROUP)
    async def generate(self, req: GenerateRequest) -> AsyncIterator[bytes]:
        """Streams msgpack-encoded StreamEvents (decode with ``messages.decode_event``): bytes cross Ray
        without pickling a class, which measurably cuts the per-item cost that shares the engine's GIL."""
        ld = self._engine
        loop = asyncio.get_running_loop()
        try:
            # rendering, tokenizing (a long prompt takes seconds) and compiling a grammar: off the event loop
            ids = await loop.run_in_executor(self._prompts, adapter.prompt_ids, ld, req)
            mask = None
            if req.grammar is not None or req.thinking_budget is not None:
                mask = await loop.run_in_executor(None, adapter.token_mask, ld, req)
        except adapter.PromptError as e:
            yield _ENC(Failed(code=e.code or "invalid_prompt", message=str(e), status=400, param=e.param))
            return
        except Exception as e:  # a bug, not the client's fault: logged and counted, never a silent Ray error
            yield _ENC(self._internal_error("generate", req, e))
            return
        wake = _Wake(loop)
        try:
            with self._lock:
                handle = adapter.submit(
                    ld, ids, req.sampling, wake.on_event, mask, adapter.thinking_on(ld, req)
                )
                self._handles[req.request_id] = handle
        except adapter.QueueFull as e:
            yield _ENC(Failed(code="queue_full", message=str(e), status=429, retry_after=1.0))
            return
        except adapter.RequestRejected as e:
            yield _ENC(Failed(code=e.code or "invalid_request", message=str(e), status=400, param=e.param))
            return
        finished = False
        try:
            yield _ENC(handle.accepted)  # the engine's budget: max_tokens clamped once, by the engine
            interval, last = self._spec.stream_interval_s, -1e9
            while not finished:
                # at most one item per interval: bounds Ray items (and SSE frames downstream) per stream to
                # 1/interval however short the engine's steps are; the first token is not delayed
                pause = last + interval - loop.time()
                if pause > 0:
                    await wake.pause(pause)  # cut short by the request's Finish: the end is not delayed
                events = await wake.events(handle)  # the engine's events, consecutive deltas merged
                last = loop.time()
                for ev in events:
                    if isinstance(ev, Finish):
                        finished = True
                        if ev.reason == "error":
                            with self._lock:
                                self._failures += 1
                    yield _ENC(ev)
        finally:
            # the consumer may vanish (client disconnect drops the generator): never leave the lane busy
            with self._lock:
                self._handles.pop(req.request_id, None)
            if not finished:
                handle.cancel()

    # ---- control ------------------------------------------------------------------------------------
    @ray.method(concurrency_group=CTL_GROUP)
    async def cancel(self, request_id: str) -> bool:
        with self._lock:
            handle = self._handles.get(request_id)
        if handle is None:
            return False
        handle.cancel()
        return True

    @ray.method(concurrency_group=CTL_GROUP)
    async def count_tokens(self, req: GenerateRequest) -> int | Failed:
        """Prompt tokens of ``req`` as ``generate`` would render it (nothing runs on the model)."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._prompts, adapter.count_prompt, self._engine, req)
        except adapter.PromptError as e:
            return Failed(code=e.code or "invalid_prompt", message=str(e), status=400, param=e.param)
        except Exception as e:
            return self._internal_error("count_tokens", req, e)

    def _internal_error(self, where: str, req: GenerateRequest, e: Exception) -> Failed:
        _LOG.exception("%s of request %s failed", where, req.request_id)
        with self._lock:
            self._internal_errors += 1
        return Failed(code="internal_error", message=f"internal error: {type(e).__name__}", status=500)

    @ray.method(concurrency_group=CTL_GROUP)
    async def stats(self) -> ActorStats:
        eng = adapter.engine_stats(self._engine)
        with self._lock:
            open_streams, failures, internal = len(self._handles), self._failures, self._internal_errors
        return ActorStats(
            lanes_total=int(eng["lanes_total"]),
            lanes_busy=int(eng["lanes_busy"]),
            queue_len=int(eng["queue_length"]),
            queue_depth=int(eng["queue_depth"]),
            open_streams=open_streams,
            engine_failures=failures,
            internal_errors=internal,
            uptime_s=time.monotonic() - self._t0,
            engine=eng,
        )

    @ray.method(concurrency_group=CTL_GROUP)
    async def route_state(self, block_tokens: int, since: int) -> RouteState:
        """What a router needs (actors/routing.py): load, and the retained prefixes' block hashes unless they
        are still those of version ``since``."""
        return adapter.route_state(self._engine, self._epoch, block_tokens, since)

    @ray.method(concurrency_group=CTL_GROUP)
    async def prompt_blocks(self, req: GenerateRequest, block_tokens: int) -> list[int] | Failed:
        """The block hashes of ``req``'s rendered prompt (a Python job routes with them: it has no tokenizer)."""
        loop = asyncio.get_running_loop()
        try:
            ids = await loop.run_in_executor(self._prompts, adapter.count_prompt_ids, self._engine, req)
        except adapter.PromptError as e:
            return Failed(code=e.code or "invalid_prompt", message=str(e), status=400, param=e.param)
        return adapter.chain_hashes(ids, block_tokens)

    @ray.method(concurrency_group=CTL_GROUP)
    async def health(self) -> Health:
        ok, detail = adapter.engine_alive(self._engine)
        return Health(ok=ok, detail=detail)

    @ray.method(concurrency_group=CTL_GROUP)
    async def info(self) -> ActorInfo:
        return adapter.engine_info(self._engine)

    @ray.method(concurrency_group=CTL_GROUP)
    async def shutdown(self) -> None:
        self._prompts.shutdown(wait=False, cancel_futures=True)
        adapter.close(self._engine)


class _Wake:
    """Wake-ups from the engine thread, only while the request's generator actually waits for events.

    While the generator sleeps out its interval only the request's ``Finish`` is scheduled on the loop (it ends
    the pause: a request's last item is never held back by the interval), so a request costs the actor's event
    loop (and the GIL the engine thread needs) at most one wake-up per interval, not one per token.
    The handle queues events before calling ``on_event``, so the re-poll after raising ``waiting`` cannot miss
    one: an event pushed before it is seen by the poll, an event pushed after it schedules a wake-up.
    """

    __slots__ = ("loop", "event", "finished", "waiting", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.event, self.finished = loop, asyncio.Event(), asyncio.Event()
        self.waiting = self.scheduled = False

    def on_event(self, ev: Any) -> None:  # engine thread
        if isinstance(ev, Finish):
            self.loop.call_soon_threadsafe(self.finished.set)
        if self.waiting and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._woken)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the request finishes meanwhile."""
        if self.finished.is_set():
            return
        try:
            await asyncio.wait_for(self.finished.wait(), seconds)
        except TimeoutError:
            pass

    def _woken(self) -> None:
        self.scheduled = False
        self.event.set()

    async def events(self, handle: Any) -> list[Any]:
        """Every engine event since the last call, waiting for at least one."""
        while True:
            got = handle.poll()
            if got:
                return got
            self.waiting = True
            got = handle.poll()
            if not got:
                await self.event.wait()
                self.event.clear()
            self.waiting = False
            if got:
                return got


def actor_options(spec: ActorSpec, *, name: str, namespace: str, detached: bool) -> dict[str, Any]:
    """Ray options: a GPU for the CUDA backend, none for the reference; the gen group is sized so that a burst
    beyond lanes + queue still reaches ``generate`` at once and gets its 429 instead of waiting in Ray."""
    lanes, depth = spec.engine.max_concurrency, spec.engine.queue_depth
    opts: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "num_gpus": 1 if spec.backend == "cuda" else 0,
        "num_cpus": 0,
        "max_restarts": -1,
        "max_task_retries": 0,
        "concurrency_groups": {CTL_GROUP: 4, GEN_GROUP: lanes + depth + 64},
        "get_if_exists": False,
    }
    if detached:
        opts["lifetime"] = "detached"
    if spec.backend == "reference":
        # Ray pins OMP_NUM_THREADS=1 in workers without CPUs; the NumPy reference wants the node's BLAS threads
        n = str(spec.blas_threads or os.cpu_count() or 1)
        opts["runtime_env"] = {
            "env_vars": {k: n for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        }
    return opts


def start_actor(
    spec: ActorSpec,
    *,
    name: str,
    namespace: str,
    detached: bool = False,
    wait: bool = True,
    actor_cls: type = EngineActor,
) -> Any:
    """Create the named actor (Ray must be initialised) and return its handle, once the engine is loaded unless
    ``wait`` is false. ``actor_cls``: an ``EngineActor`` subclass (perf/ loads synthetic weights with one)."""
    opts = actor_options(spec, name=name, namespace=namespace, detached=detached)
    cls = ray.remote(concurrency_groups=opts.pop("concurrency_groups"))(
        actor_cls
    )  # not settable in .options()
    handle = cls.options(**opts).remote(spec)
    if not wait:
        return handle
    try:
        ray.get(
            handle.health.remote()
        )  # a failed __init__ (bad artifact, engine settings, ...) surfaces here
    except ray.exceptions.RayActorError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise RuntimeError(f"the engine actor failed to start: {lines[-1] if lines else e}") from None
    return handle
