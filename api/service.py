"""The service object shared by the API handlers, and the engine-backend protocol it talks to."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from litestar import Request, Response
from ninfer.actors.messages import ActorStats, Failed, GenerateRequest, Health, StreamEvent

from .config import ServerConfig
from .gate import KEY_NAME_SCOPE
from .metrics import Metrics
from .openai_chat import ChatLimits
from .reqlog import RequestLog

__all__ = ["EngineBackend", "Service", "service", "json_response", "client_name"]


class EngineBackend(Protocol):
    """What the API needs from the engine actor (actors/client.py:AsyncEngineClient implements it)."""

    def generate(self, req: GenerateRequest) -> AsyncIterator[StreamEvent]: ...
    def cancel(self, request_id: str) -> None: ...
    async def stats(self) -> ActorStats: ...
    async def health(self) -> Health: ...
    async def count_tokens(self, req: GenerateRequest) -> int | Failed: ...


@dataclass(slots=True)
class Service:
    config: ServerConfig
    backend: EngineBackend
    limits: ChatLimits
    reqlog: RequestLog | None = None
    metrics: Metrics = field(default_factory=Metrics)
    template_defaults: dict[str, Any] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    _next_id: int = 0

    def next_request_id(self) -> int:
        if self.reqlog is not None:
            return self.reqlog.next_request_id()
        self._next_id += 1
        return self._next_id


def service(request: Request[Any, Any, Any]) -> Service:
    return request.app.state.service


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(
        msgspec.json.encode(obj), status_code=status, media_type="application/json", headers=headers
    )


def client_name(request: Request[Any, Any, Any], user: str | None) -> str:
    """Attribution: the API key's name, else the ``user`` field or ``X-Client-Name``, else the peer address."""
    name = request.scope.get(KEY_NAME_SCOPE) or user or request.headers.get("x-client-name")
    if name:
        return str(name)[:128]
    peer = request.client
    return f"{peer.host}:{peer.port}" if peer else "unknown"
