"""Clients of the engine actor: a blocking one for Python jobs and an asyncio one for the API process.

From any job on the cluster::

    from ninfer.actors import connect
    client = connect()                          # the actor named "ninfer-engine" in namespace "ninfer"
    for ev in client.stream_chat([{"role": "user", "content": "hi"}], max_tokens=32):
        print(ev.text, end="")                  # TokenDelta items, then the Finish (its text: the tail)
    print(client.chat([{"role": "user", "content": "hi"}], max_tokens=8).usage)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import msgspec
import ray
from ray.exceptions import GetTimeoutError, RayError

from ninfer.engine.core import Accepted, Finish, TokenDelta

from .job_request import check_request_id, job_request
from .messages import (
    ActorInfo,
    ActorStats,
    Failed,
    GenerateRequest,
    Health,
    StreamEvent,
    bulky,
    decode_batch,
    decode_events,
    decode_opened,
    encode_requests,
    engine_failure,
    opens_quickly,
)
from .routing import RouteState

__all__ = ["connect", "EngineClient", "AsyncEngineClient", "GenerationError", "Result", "DEFAULT_ACTOR_NAME"]

DEFAULT_ACTOR_NAME = "ninfer-engine"
DEFAULT_NAMESPACE = "ninfer"


class GenerationError(RuntimeError):
    """The actor refused or failed a request; ``code`` is e.g. ``queue_full`` or ``context_length_exceeded``."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(f"{failed.code}: {failed.message}")
        self.code, self.status, self.failed = failed.code, failed.status, failed


class Result(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    text: str
    token_ids: list[int]
    finish: Finish

    @property
    def finish_reason(self) -> str:
        return self.finish.reason


def _died(e: Exception) -> Failed:
    return Failed(
        code="engine_unavailable", message=f"the engine actor failed: {type(e).__name__}", status=503
    )


class EngineClient:
    """Blocking client. Sampling keywords are SamplingOptions fields: the engine's ``SamplingParams`` (max_tokens,
    temperature, top_p, top_k, min_p, penalties, seed, stop, stop_token_ids, ignore_eos); a setting left out is
    the artifact's generation default. ``request_id``: the caller's id for the request, to ``cancel`` it by from
    another thread or process (default: a new one, ``Result.request_id``). Arguments of the wrong type or range
    raise ``ValueError`` naming them before anything is sent; the actor's refusals raise ``GenerationError``."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def stream(
        self, prompt_ids: Sequence[int], *, request_id: str | None = None, **sampling: Any
    ) -> Iterator[TokenDelta | Finish]:
        req = job_request(
            prompt_ids=prompt_ids, messages=None, template=None, request_id=request_id, **sampling
        )
        return self._stream(req)

    def stream_chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        template_kwargs: dict[str, Any] | None = None,
        request_id: str | None = None,
        **sampling: Any,
    ) -> Iterator[TokenDelta | Finish]:
        req = job_request(
            prompt_ids=None, messages=messages, template=template_kwargs, request_id=request_id, **sampling
        )
        return self._stream(req)

    def generate(
        self, prompt_ids: Sequence[int], *, request_id: str | None = None, **sampling: Any
    ) -> Result:
        req = job_request(
            prompt_ids=prompt_ids, messages=None, template=None, request_id=request_id, **sampling
        )
        return self._collect(req)

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        template_kwargs: dict[str, Any] | None = None,
        request_id: str | None = None,
        **sampling: Any,
    ) -> Result:
        req = job_request(
            prompt_ids=None, messages=messages, template=template_kwargs, request_id=request_id, **sampling
        )
        return self._collect(req)

    def stats(self) -> ActorStats:
        return ray.get(self.handle.stats.remote())

    def info(self) -> ActorInfo:
        return ray.get(self.handle.info.remote())

    def health(self) -> Health:
        return ray.get(self.handle.health.remote())

    def cancel(self, request_id: str) -> bool:
        """Cancel the request ``request_id`` (True: it was running; its stream ends with a Finish). False: nothing
        ran under that id yet (or it ended); a request whose open is still on its way then ends cancelled at once
        (docs/serving.md, "Cancel before open")."""
        rid = check_request_id(request_id)
        return ray.get(self.handle.cancel.remote(rid))

    def _stream(self, req: GenerateRequest) -> Iterator[TokenDelta | Finish]:
        """Yields TokenDelta items, then the Finish event (whose ``text`` is the held-back tail); raises
        GenerationError on a refusal or failure."""
        done = False
        try:
            for ref in self.handle.generate.remote(encode_requests([req])):
                for ev in decode_events(ray.get(ref)):
                    failed = engine_failure(ev) if isinstance(ev, Finish) else ev
                    if isinstance(failed, Failed):
                        done = True
                        raise GenerationError(failed)
                    if isinstance(ev, TokenDelta | Finish):
                        yield ev
                    done = isinstance(ev, Finish)
        except RayError as e:
            raise GenerationError(_died(e)) from e
        finally:
            if not done:  # the caller stopped early: free the lane
                self.handle.cancel.remote(req.request_id)

    def _collect(self, req: GenerateRequest) -> Result:
        ids: list[int] = []
        text: list[str] = []
        for ev in self._stream(req):
            ids += ev.token_ids if isinstance(ev, TokenDelta) else []
            text.append(ev.text)
            if isinstance(ev, Finish):
                return Result(request_id=req.request_id, text="".join(text), token_ids=ids, finish=ev)
        raise GenerationError(Failed(code="engine_error", message="the stream ended without a finish event"))


_Opening = list[tuple[GenerateRequest, "asyncio.Future[list[StreamEvent]]"]]  # requests and their answers


class _Events:
    """The caller's end of ``EngineActor.subscribe``: one Ray stream, its items routed to each request's queue.
    On a Ray error (the actor died) every open request gets ``Failed(engine_unavailable, 503)``.

    ``open`` gathers the requests opened in one turn of the event loop (a burst of clients) into one
    ``EngineActor.open`` call: one Ray call (~0.5-1 ms of CPU here on each side) for the burst, not one per
    request, and no added wait (it goes at the end of the turn that opened the first). Only requests the actor
    admits on its loop share a call (``messages.opens_quickly``): one whose prompt renders on a thread or whose
    grammar compiles goes alone, so that it never holds up the others' answers."""

    def __init__(self, handle: Any) -> None:
        self.id = uuid.uuid4().hex
        self.handle = handle
        self.loop = asyncio.get_running_loop()
        self.queues: dict[str, asyncio.Queue[StreamEvent]] = {}
        self.failed: Failed | None = None
        self._opening: _Opening = []
        self._answers: set[asyncio.Future[None]] = set()  # the open calls in flight (held: not collected)
        self.task = asyncio.ensure_future(self._run(handle))

    def open(self, req: GenerateRequest) -> asyncio.Future[list[StreamEvent]]:
        """``req``'s first events (``[Accepted]`` or ``[Failed]``), from the next ``EngineActor.open`` call."""
        fut: asyncio.Future[list[StreamEvent]] = self.loop.create_future()
        if bulky(req):  # encoded on a thread (a million messages: ~80 ms of this loop), then sent alone
            self._hold(asyncio.ensure_future(self._send_bulky(req, fut)))
        elif not opens_quickly(req):  # a long prompt, tools, a grammar: alone (its answer may take long)
            self._send([(req, fut)])
        else:
            self._opening.append((req, fut))
            if len(self._opening) == 1:
                self.loop.call_soon(self._send_opening)
        return fut

    def _send_opening(self) -> None:
        batch, self._opening = self._opening, []
        self._send(batch)

    async def _send_bulky(self, req: GenerateRequest, fut: asyncio.Future[list[StreamEvent]]) -> None:
        self._send([(req, fut)], await asyncio.to_thread(encode_requests, [req]))

    def _send(self, batch: _Opening, wire: bytes | list[GenerateRequest] | None = None) -> None:
        try:
            wire = encode_requests([r for r, _ in batch]) if wire is None else wire
            ref = self.handle.open.remote(wire, self.id)
        except Exception as e:  # Ray itself refused the call (shut down): every request of it fails
            _settle(batch, e)
            return
        self._hold(asyncio.ensure_future(self._answer(ref, batch)))

    def _hold(self, task: asyncio.Future[None]) -> None:
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _answer(self, ref: Any, batch: _Opening) -> None:
        try:
            _settle(batch, decode_opened(await ref))
        except Exception as e:  # RayError: the actor died; anything else: a malformed answer
            _settle(batch, e)

    async def _run(self, handle: Any) -> None:
        try:
            async for ref in handle.subscribe.remote(self.id):
                for rid, events in decode_batch(await _item(ref)):
                    q = self.queues.get(rid)
                    if q is not None:
                        for ev in events:
                            q.put_nowait(ev)
            self.failed = Failed(
                code="engine_unavailable", message="the engine's event stream ended", status=503
            )
        except RayError as e:
            self.failed = _died(e)
        except asyncio.CancelledError:
            self.failed = Failed(code="engine_unavailable", message="the client was closed", status=503)
            raise
        finally:
            for q in self.queues.values():
                q.put_nowait(self.failed or _died(RuntimeError("event stream ended")))

    def register(self, request_id: str) -> asyncio.Queue[StreamEvent]:
        q: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.queues[request_id] = q
        return q


async def _item(ref: Any) -> bytes:
    """A streaming generator's item: its ref comes once the item is reported (a small one inline), so it is read
    at once (~0.2 ms of CPU less than awaiting it, which hops through a thread); awaited if it is not there."""
    if isinstance(ref, ray.ObjectRef):
        try:
            return ray.get(ref, timeout=0)
        except GetTimeoutError:
            pass
    return await ref


def _settle(batch: _Opening, got: Any) -> None:
    """Each request's answer from ``got`` (the decoded answer of an open call, or the exception it raised)."""
    for i, (_, fut) in enumerate(batch):
        if fut.done():  # the consumer left meanwhile
            continue
        if isinstance(got, list) and i < len(got):
            fut.set_result(got[i])
        elif isinstance(got, RayError):
            fut.set_result([_died(got)])
        else:
            why = f"{type(got).__name__}" if isinstance(got, Exception) else "no answer for this request"
            fut.set_result([Failed(code="internal_error", message=f"open: {why}", status=500)])


class AsyncEngineClient:
    """The API's view of the actor (implements ninfer.api.service.EngineBackend). The requests opened in one turn
    of the event loop share one Ray call (``EngineActor.open``); their events all come on one ``subscribe`` stream
    per client, so N streams cost the actor one Ray item per stream interval instead of N."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._events: _Events | None = None

    def _stream(self) -> _Events:
        ev = self._events
        if ev is None or ev.failed is not None or ev.task.done() or ev.loop is not asyncio.get_running_loop():
            ev = self._events = _Events(self.handle)
        return ev

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        stream = self._stream()
        q = stream.register(req.request_id)
        ended = False
        try:
            first = await stream.open(req)
            ended = not (first and isinstance(first[-1], Accepted))
            for ev in first:
                yield ev
            while not ended:
                ev = await q.get()
                ended = isinstance(ev, Finish | Failed)
                yield ev
        finally:
            stream.queues.pop(req.request_id, None)
            if not ended:  # the consumer left before the end: free the lane (as a dropped Ray stream does)
                self.cancel(req.request_id)

    def cancel(self, request_id: str) -> None:
        self.handle.cancel.remote(request_id)  # fire and forget: callers may be inside a cancelled scope

    async def stats(self) -> ActorStats:
        return await self.handle.stats.remote()

    async def count_tokens(self, req: GenerateRequest) -> int | Failed:
        wire = await asyncio.to_thread(encode_requests, [req]) if bulky(req) else encode_requests([req])
        return await self.handle.count_tokens.remote(wire)

    async def health(self) -> Health:
        return await self.handle.health.remote()

    async def info(self) -> ActorInfo:
        return await self.handle.info.remote()

    async def route_state(self, block_tokens: int, since: int) -> RouteState:
        return await self.handle.route_state.remote(block_tokens, since)


def connect(
    name: str = DEFAULT_ACTOR_NAME, *, namespace: str = DEFAULT_NAMESPACE, address: str | None = "auto"
) -> EngineClient:
    """Find the running engine actor by name (joining the cluster at ``address`` if Ray is not initialised).
    Raises ``ConnectionError`` when no cluster answers at ``address`` and ``ValueError`` when the cluster has no
    actor ``name`` in ``namespace``, each naming the actor it looked for."""
    what = f"engine actor {name!r} in namespace {namespace!r}"
    join_ray(address, namespace, f"the {what}")
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise ValueError(
            f"no {what} on the Ray cluster: is `ninfer serve ART --actor-name {name}` running on it? "
            f"(a server with --replicas N names its actors {name}-0, {name}-1, ...: use connect_replicas)"
        ) from None
    return EngineClient(handle)


def join_ray(address: str | None, namespace: str, what: str) -> None:
    """``ray.init(address)`` unless Ray is initialised; a cluster that does not answer is a ``ConnectionError``
    saying what was looked for (``what``)."""
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False)
    except ConnectionError as e:
        where = "a running Ray cluster" if address in (None, "auto") else f"the Ray cluster at {address!r}"
        raise ConnectionError(f"cannot reach {where} to find {what}: {e}") from None
