"""The Litestar application: the service endpoints (health, models, metrics), the exception handlers and the
shared service object; the generation endpoints are routes_generation.py's.

``build_app`` returns the ASGI callable uvicorn serves: the gate (auth, body cap, CORS) wrapped around Litestar.
Litestar also serves the OpenAPI document at ``/openapi.json`` (openapi.py describes the bodies).
Everything a handler needs lives on one :class:`Service` kept in ``app.state.service``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get
from litestar.exceptions import HTTPException
from msgspec import UNSET

from . import anthropic as am
from .anthropic import error_class
from .auth import KeyRing
from .errors import ApiError, error_json
from .gate import Gate
from .openai_chat_models import HealthStatus, ModelList, ModelObject
from .openapi import ROUTE_DOCS, openapi_config
from .replica_metrics import replica_metrics
from .routes_generation import GENERATION_ROUTES
from .service import Service, endpoint_name, json_response, service

__all__ = ["build_app"]


@get("/health", **ROUTE_DOCS["health"])
async def health(request: Request[Any, Any, Any]) -> Response[bytes]:
    svc = service(request)
    if svc.drain.draining:  # shutting down: load balancers should stop sending requests here
        return json_response(HealthStatus(status="draining", detail="shutting down"), 503)
    try:
        h = await svc.backend.health()
    except Exception as e:  # the actor is gone or not answering: not ready
        return json_response(HealthStatus(status="unavailable", detail=type(e).__name__), 503)
    replicas = h.replicas or UNSET  # behind the router: every replica's status
    if not h.ok:
        return json_response(HealthStatus(status="unavailable", detail=h.detail, replicas=replicas), 503)
    return json_response(HealthStatus(status="ok", detail=h.detail or UNSET, replicas=replicas))


def _model(svc: Service) -> ModelObject:
    return ModelObject(id=svc.limits.model_id, created=svc.created)


@get("/v1/models", **ROUTE_DOCS["list_models"])
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    return json_response(ModelList(data=[_model(service(request))]))


@get("/v1/models/{model_id:path}", **ROUTE_DOCS["get_model"])
async def get_model(request: Request[Any, Any, Any], model_id: str) -> Response[bytes]:
    svc = service(request)
    if model_id.lstrip("/") != svc.limits.model_id:
        raise ApiError(
            404, f"The model '{model_id.lstrip('/')}' does not exist", param="model", code="model_not_found"
        )
    return json_response(_model(svc))


@get("/metrics", **ROUTE_DOCS["metrics"])
async def metrics(request: Request[Any, Any, Any]) -> Response[str]:
    svc = service(request)
    try:
        st = await svc.backend.stats()
        actor = {k: float(v) for k, v in msgspec.structs.asdict(st).items() if isinstance(v, int | float)}
        engine: dict[str, float] | None = dict(st.engine)
    except Exception:  # scrape must not fail because the actor is busy restarting
        actor = engine = None
    text = svc.metrics.render(actor, engine)
    if svc.replicas is not None:  # per-replica series and the router's counters
        text += replica_metrics(svc.replicas)
    # Litestar appends "; charset=utf-8" to text/* types: the header is Prometheus 0.0.4's exact content type
    return Response(text, media_type="text/plain; version=0.0.4")


def _api_error(request: Request[Any, Any, Any], exc: ApiError) -> Response[bytes]:
    if exc.status >= 500 and exc.code not in am.OVERLOADED_CODES:  # a full queue is a refusal, not a fault
        service(request).server_error(endpoint_name(request.url.path), exc)
    return Response(
        error_json(exc), status_code=exc.status, media_type="application/json", headers=exc.headers()
    )


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """The router's 404 and 405 in the path's error shape; a 405 keeps the router's ``Allow`` header (RFC 9110
    §15.5.6: a 405 must list the methods the path has), with HEAD beside GET (the gate answers it as GET)."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    methods = [m.strip() for m in (exc.headers or {}).get("allow", "").split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.insert(methods.index("GET") + 1, "HEAD")
    message = str(exc.detail)
    if exc.status_code == 405 and methods:
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {', '.join(methods)})"
    response = _api_error(request, error_class(request.url.path)(exc.status_code, message, code=code))
    if methods:
        response.headers["Allow"] = ", ".join(methods)
    return response


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """An exception no handler expected: a 500 in the protocol's shape, logged with its traceback."""
    err = error_class(request.url.path)(500, f"internal error: {type(exc).__name__}", code="internal_error")
    service(request).server_error(endpoint_name(request.url.path), err, exc)
    return Response(error_json(err), status_code=500, media_type="application/json")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ninfer")
    except PackageNotFoundError:
        return "0"


def build_app(svc: Service, keyring: KeyRing | None) -> Gate:
    app = Litestar(
        route_handlers=[
            health,
            list_models,
            get_model,
            metrics,
            *GENERATION_ROUTES,
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, 500: _internal_error},
        openapi_config=openapi_config(_version()),
        request_max_body_size=None,  # the gate's --max-request-mib is the one cap (Litestar's own is 10 MB)
        debug=False,
    )
    app.state.service = svc
    cfg = svc.config
    return Gate(
        app,
        keyring=keyring,
        max_body_bytes=cfg.max_request_bytes,
        cors=cfg.cors,
        body_timeout_s=cfg.body_timeout_s,
        body_deadline_s=cfg.body_deadline_s,
        drain=svc.drain,
        on_refusal=lambda path, err: svc.server_error(endpoint_name(path), err),
    )
