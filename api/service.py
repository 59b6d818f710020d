"""The service object shared by the API handlers, and the engine-backend protocol it talks to."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from litestar import Request, Response
from ninfer.actors.messages import ActorStats, Failed, GenerateRequest, Health, StreamEvent

from .config import ServerConfig
from .errors import ApiError
from .gate import KEY_NAME_SCOPE, Drain
from .metrics import Metrics
from .openai_chat import ChatLimits
from .reqlog import RequestLog

if TYPE_CHECKING:
    from ninfer.actors.router import ReplicaRouter

__all__ = [
    "EngineBackend",
    "Service",
    "service",
    "json_response",
    "client_name",
    "client_claim",
    "endpoint_name",
]

_LOG = logging.getLogger("ninfer.api")
_ENDPOINTS = {
    "/v1/chat/completions": "chat_completions",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/responses": "responses",
    "/v1/models": "models",
    "/health": "health",
    "/metrics": "metrics",
}


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
    drain: Drain = field(default_factory=lambda: Drain(30.0))
    replicas: ReplicaRouter | None = None  # --replicas: the router (also the backend), for its metrics
    # large request bodies are decoded and translated one at a time, in arrival order (validation.prepare)
    large_bodies: asyncio.Lock = field(default_factory=asyncio.Lock)
    _next_id: int = 0

    def next_request_id(self) -> int:
        if self.reqlog is not None:
            return self.reqlog.next_request_id()
        self._next_id += 1
        return self._next_id

    def server_error(self, endpoint: str, err: ApiError, exc: BaseException | None = None) -> None:
        """Every 5xx answer — raised, streamed as an error event, or refused by the gate — is logged (with the
        traceback of ``exc`` when there is one) and counted in ``ninfer_server_errors_total``. ``endpoint`` is a
        metrics label (``endpoint_name`` of the path)."""
        self.metrics.count_server_error(endpoint, err.code or "none")
        _LOG.error(
            "%s %d %s: %s",
            endpoint,
            err.status,
            err.code,
            err.message,
            exc_info=exc if exc is not None else None,
        )


def service(request: Request[Any, Any, Any]) -> Service:
    return request.app.state.service


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(
        msgspec.json.encode(obj), status_code=status, media_type="application/json", headers=headers
    )


def endpoint_name(path: str) -> str:
    """The metrics label of a path: its route's name, ``other`` for anything else (bounded label values)."""
    return _ENDPOINTS.get(path.rstrip("/"), "other")


def client_name(request: Request[Any, Any, Any], user: str | None = None) -> str:
    """Who sent the request, as far as the server can tell: the API key's name (``key#N`` for an unnamed key,
    N its place in the key file), else — without auth — the peer address. Never taken from the request itself;
    ``user`` is accepted for the callers' convenience and ignored (it is a claim: ``client_claim``)."""
    name = request.scope.get(KEY_NAME_SCOPE)
    if name:
        return str(name)
    peer = request.client
    return f"{peer.host}:{peer.port}" if peer else "unknown"


def client_claim(request: Request[Any, Any, Any], user: str | None) -> str | None:
    """Who the request says it is: the body's ``user`` field, else the ``X-Client-Name`` header (unverified;
    logged as ``client_claim`` beside ``client``)."""
    claim = user or request.headers.get("x-client-name")
    return str(claim)[:128] if claim else None
