"""Clients of the engine actor: a blocking one for Python jobs and an asyncio one for the API process.

From any job on the cluster::

    from ninfer.actors import connect
    client = connect()                          # the actor named "ninfer-engine" in namespace "ninfer"
    for ev in client.stream_chat([{"role": "user", "content": "hi"}], max_tokens=32):
        print(ev.text, end="")                  # TokenDelta items, then the Finish (its text: the tail)
    print(client.chat([{"role": "user", "content": "hi"}], max_tokens=8).usage)
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import msgspec
import ray
from ray.exceptions import RayError

from ninfer.engine.core import Finish, TokenDelta

from .messages import (
    ActorInfo,
    ActorStats,
    Failed,
    GenerateRequest,
    Health,
    SamplingOptions,
    StreamEvent,
    decode_event,
    engine_failure,
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


def _request(
    *,
    prompt_ids: Sequence[int] | None,
    messages: Sequence[dict[str, Any]] | None,
    template: dict[str, Any],
    **sampling: Any,
) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"job-{uuid.uuid4().hex[:16]}",
        prompt_ids=None if prompt_ids is None else tuple(int(t) for t in prompt_ids),
        messages=None if messages is None else tuple(dict(m) for m in messages),
        template_kwargs=template,
        sampling=SamplingOptions(
            **{
                k: (tuple(v) if k in ("stop", "stop_token_ids") else v)
                for k, v in sampling.items()
                if v is not None
            }
        ),
        client="python-job",
    )


def _died(e: Exception) -> Failed:
    return Failed(
        code="engine_unavailable", message=f"the engine actor failed: {type(e).__name__}", status=503
    )


class EngineClient:
    """Blocking client. Sampling keywords are SamplingOptions fields: the engine's ``SamplingParams`` (max_tokens,
    temperature, top_p, top_k, min_p, penalties, seed, stop, stop_token_ids, ignore_eos)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def stream(self, prompt_ids: Sequence[int], **sampling: Any) -> Iterator[TokenDelta | Finish]:
        return self._stream(_request(prompt_ids=prompt_ids, messages=None, template={}, **sampling))

    def stream_chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        template_kwargs: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> Iterator[TokenDelta | Finish]:
        return self._stream(
            _request(prompt_ids=None, messages=messages, template=template_kwargs or {}, **sampling)
        )

    def generate(self, prompt_ids: Sequence[int], **sampling: Any) -> Result:
        return self._collect(_request(prompt_ids=prompt_ids, messages=None, template={}, **sampling))

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        template_kwargs: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> Result:
        return self._collect(
            _request(prompt_ids=None, messages=messages, template=template_kwargs or {}, **sampling)
        )

    def stats(self) -> ActorStats:
        return ray.get(self.handle.stats.remote())

    def info(self) -> ActorInfo:
        return ray.get(self.handle.info.remote())

    def health(self) -> Health:
        return ray.get(self.handle.health.remote())

    def cancel(self, request_id: str) -> bool:
        return ray.get(self.handle.cancel.remote(request_id))

    def _stream(self, req: GenerateRequest) -> Iterator[TokenDelta | Finish]:
        """Yields TokenDelta items, then the Finish event (whose ``text`` is the held-back tail); raises
        GenerationError on a refusal or failure."""
        done = False
        try:
            for ref in self.handle.generate.remote(req):
                ev = decode_event(ray.get(ref))
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


class AsyncEngineClient:
    """The API's view of the actor (implements ninfer.api.service.EngineBackend)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]:
        try:
            async for ref in self.handle.generate.remote(req):
                yield decode_event(await ref)
        except RayError as e:
            yield _died(e)

    def cancel(self, request_id: str) -> None:
        self.handle.cancel.remote(request_id)  # fire and forget: callers may be inside a cancelled scope

    async def stats(self) -> ActorStats:
        return await self.handle.stats.remote()

    async def count_tokens(self, req: GenerateRequest) -> int | Failed:
        return await self.handle.count_tokens.remote(req)

    async def health(self) -> Health:
        return await self.handle.health.remote()

    async def info(self) -> ActorInfo:
        return await self.handle.info.remote()

    async def route_state(self, block_tokens: int, since: int) -> RouteState:
        return await self.handle.route_state.remote(block_tokens, since)


def connect(
    name: str = DEFAULT_ACTOR_NAME, *, namespace: str = DEFAULT_NAMESPACE, address: str | None = "auto"
) -> EngineClient:
    """Find the running engine actor by name (joining the cluster at ``address`` if Ray is not initialised)."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, log_to_driver=False)
    return EngineClient(ray.get_actor(name, namespace=namespace))
