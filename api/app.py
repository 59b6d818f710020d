"""The Litestar application: every route, the exception handlers and the shared service object.

The generation endpoints — POST /v1/chat/completions (OpenAI), /v1/messages and /v1/messages/count_tokens
(Anthropic), /v1/responses (OpenAI Responses) — each validate and translate their body (openai_chat.py,
anthropic.py, responses.py) into the one GenerateRequest, build their output (*_output.py) and run through the
shared request plumbing (routes_common.py): a JSON body or an SSE stream.

``build_app`` returns the ASGI callable uvicorn serves: the gate (auth, body cap, CORS) wrapped around Litestar.
Litestar also serves the OpenAPI document at ``/openapi.json`` (openapi.py describes the bodies).
Everything a handler needs lives on one :class:`Service` kept in ``app.state.service``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post, route
from litestar.exceptions import HTTPException
from msgspec import UNSET
from ninfer.actors.messages import Failed, GenerateRequest

from . import anthropic as am
from . import anthropic_output as ao
from . import responses as rs
from . import responses_output as ro
from .anthropic import error_class
from .anthropic_models import CountTokens
from .auth import KeyRing
from .errors import ApiError, error_json
from .gate import Gate
from .openai_chat import parse_chat_request, to_generate_request
from .openai_chat_models import ChatRequest, HealthStatus, ModelList, ModelObject
from .openai_chat_output import ChatStream, completion_body, new_completion_id
from .openapi import ROUTE_DOCS, openapi_config
from .protocol_shared import Output, new_id, parse_output, reports_calls
from .replica_metrics import replica_metrics
from .routes_common import admit, collect, event_stream, failure, output_mode, request_record
from .service import Service, client_claim, client_name, endpoint_name, json_response, service
from .validation import check_depth, prepare

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


# ---- generation: each protocol validates and translates its body into the one GenerateRequest, builds its
# output (*_output.py) and runs through the shared request plumbing (routes_common.py): JSON or SSE ------------
@post("/v1/chat/completions", status_code=200, **ROUTE_DOCS["chat"])
async def chat_completions(request: Request[Any, Any, Any]) -> Any:
    svc = service(request)
    t0 = time.perf_counter()
    body = await request.body()
    rid = new_completion_id()

    def translate() -> tuple[ChatRequest, GenerateRequest]:
        req = parse_chat_request(body, svc.limits)
        check_depth(req, ApiError)
        greq = to_generate_request(req, svc.limits, rid, client_name(request), svc.template_defaults)
        check_depth(greq, ApiError)  # JSON parsed out of strings (tool-call arguments) may nest deeper
        return req, greq

    req, greq = await prepare(body, translate, ApiError)
    record = request_record(
        greq,
        protocol="openai_chat_completions",
        model=req.model,
        stream=req.stream,
        messages=len(req.messages),
        client_max=bool(req.max_completion_tokens or req.max_tokens),
        claim=client_claim(request, req.user),
    )
    track, events = await admit(svc, greq, record, "chat_completions", t0, ApiError)
    created = int(time.time())
    thinking, tools = output_mode(greq)
    cached = svc.config.prompt_tokens_details  # usage.prompt_tokens_details (--prompt-tokens-details)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        cs = ChatStream(rid, created, req.model, include_usage, thinking, tools, cached)
        return event_stream(cs, events, track, ApiError)
    text, fin = await collect(request, events, track, ApiError)
    out = parse_output(text, thinking, tools)
    track.tool_calls = len(out.calls)
    return json_response(completion_body(rid, created, req.model, out, fin, cached))


async def _anthropic(
    request: Request[Any, Any, Any], svc: Service, rid: str, count: bool = False
) -> tuple[am.AnthropicRequest, GenerateRequest]:
    body = await request.body()

    def translate() -> tuple[am.AnthropicRequest, GenerateRequest]:
        req = am.parse_messages_request(body, svc.limits.max_context, require_max_tokens=not count)
        check_depth(req, am.AnthropicError)
        greq = am.to_generate_request(
            req, rid, client_name(request), svc.template_defaults, svc.config.default_max_tokens
        )
        check_depth(greq, am.AnthropicError)  # JSON parsed out of strings may nest deeper
        return req, greq

    return await prepare(body, translate, am.AnthropicError)


@post("/v1/messages", status_code=200, **ROUTE_DOCS["messages"])
async def messages(request: Request[Any, Any, Any]) -> Any:
    svc = service(request)
    t0 = time.perf_counter()
    mid = new_id("msg_")
    req, greq = await _anthropic(request, svc, mid)
    record = request_record(greq, protocol="anthropic_messages", model=req.model, stream=req.stream,
                            messages=len(req.messages), client_max=req.max_tokens is not None,
                            claim=client_claim(request, None))  # fmt: skip
    track, events = await admit(svc, greq, record, "messages", t0, am.AnthropicError)
    thinking, tools = output_mode(greq)
    if req.stream:
        prompt = track.record.get("prompt_tokens", 0)
        b = ao.MessagesStream(mid, req.model, prompt, thinking, tools)
        return event_stream(b, events, track, am.AnthropicError)
    text, fin = await collect(request, events, track, am.AnthropicError)
    out = parse_output(text, thinking, tools, max_name=128)
    track.tool_calls = len(out.calls)
    return json_response(ao.message_body(mid, req.model, out, fin))


@post("/v1/messages/count_tokens", status_code=200, **ROUTE_DOCS["count_tokens"])
async def count_tokens(request: Request[Any, Any, Any]) -> Any:
    """Counted on the actor's prompt worker (no model run); logged as a ``count_tokens`` record."""
    svc = service(request)
    t0 = time.perf_counter()
    req, greq = await _anthropic(request, svc, new_id("count_"), count=True)
    n = await svc.backend.count_tokens(greq)
    rec = {"request_id": svc.next_request_id(), "engine_request_id": greq.request_id,
           "protocol": "anthropic_count_tokens", "model": req.model, "message_count": len(req.messages),
           "client": greq.client, "client_claim": client_claim(request, None)}  # fmt: skip
    seconds = {"total": time.perf_counter() - t0}
    if isinstance(n, Failed):
        svc.metrics.count_request("count_tokens", "error")
        if svc.reqlog is not None:
            svc.reqlog.write("count_tokens", request=rec, error={"message": n.message, "code": n.code},
                             timings_seconds=seconds)  # fmt: skip
        raise failure(n, am.AnthropicError)
    svc.metrics.count_request("count_tokens", "ok")
    if svc.reqlog is not None:
        svc.reqlog.write("count_tokens", request=rec, result={"input_tokens": n}, timings_seconds=seconds)
    return json_response(CountTokens(input_tokens=n))


@post("/v1/responses", status_code=200, **ROUTE_DOCS["responses"])
async def responses(request: Request[Any, Any, Any]) -> Any:
    svc = service(request)
    t0 = time.perf_counter()
    body = await request.body()
    rid = new_id("resp_")

    def translate() -> tuple[rs.ResponsesRequest, GenerateRequest]:
        req = rs.parse_responses_request(body, svc.limits.model_id, svc.limits.max_context)
        check_depth(req, ApiError)
        greq = rs.to_generate_request(
            req, rid, client_name(request), svc.template_defaults, svc.config.default_max_tokens
        )
        check_depth(greq, ApiError)  # JSON parsed out of strings (call arguments) may nest deeper
        return req, greq

    req, greq = await prepare(body, translate, ApiError)
    record = request_record(greq, protocol="openai_responses", model=req.model, stream=req.stream,
                            messages=len(greq.messages or ()), client_max=req.max_output_tokens is not None,
                            claim=client_claim(request, req.user))  # fmt: skip
    track, events = await admit(svc, greq, record, "responses", t0, ApiError)
    created = int(time.time())
    thinking, tools = output_mode(greq)
    if req.stream:
        b = ro.ResponsesStream(rid, created, req, thinking, tools)
        return event_stream(b, events, track, ApiError)
    text, fin = await collect(request, events, track, ApiError)
    out: Output = parse_output(text, thinking, tools)
    track.tool_calls = len(out.calls)
    called = reports_calls(fin.reason, len(out.calls), out.unclosed)
    return json_response(ro.response_body(rid, created, req, ro.output_items(out), fin, called))


@route("/v1/responses/{rest:path}", http_method=["GET", "POST", "DELETE"], include_in_schema=False)
async def stored_response(rest: str) -> None:
    """Retrieve, cancel, delete or list the input items of a stored response: nothing is stored (``store`` is
    accepted and ignored, ``background`` refused), so each is a 404 that says so."""
    rid = rest.strip("/").split("/")[0]
    raise ApiError(404, f"Response with id '{rid}' not found: this server stores no responses",
                   param="response_id", code="response_not_found")  # fmt: skip


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
            chat_completions,
            messages,
            count_tokens,
            responses,
            stored_response,
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
