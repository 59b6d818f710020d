"""The generation endpoints — POST /v1/chat/completions (OpenAI), /v1/messages and /v1/messages/count_tokens
(Anthropic), /v1/responses (OpenAI Responses): each validates and translates its body (openai_chat.py,
anthropic.py, responses.py) into the one GenerateRequest and its log record (which walks every message) — off the
event loop when the body is large (validation.prepare) —, builds its output (*_output.py) and runs through the
shared request plumbing (routes_common.py): a JSON body or an SSE stream. app.py mounts them.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, post, route
from ninfer.actors.messages import Failed, GenerateRequest

from . import anthropic as am
from . import anthropic_output as ao
from . import responses as rs
from . import responses_output as ro
from .anthropic_models import CountTokens
from .errors import ApiError
from .openai_chat import parse_chat_request, to_generate_request
from .openai_chat_models import ChatRequest
from .openai_chat_output import ChatStream, completion_body, new_completion_id
from .openapi import ROUTE_DOCS
from .protocol_shared import Output, new_id, parse_output, reports_calls
from .routes_common import admit, collect, event_stream, failure, output_mode, request_record
from .service import Service, client_claim, client_name, json_response, service
from .validation import check_depth, prepare

__all__ = ["GENERATION_ROUTES"]


@post("/v1/chat/completions", status_code=200, **ROUTE_DOCS["chat"])
async def chat_completions(request: Request[Any, Any, Any]) -> Any:
    svc = service(request)
    t0 = time.perf_counter()
    body = await request.body()
    rid = new_completion_id()

    def translate() -> tuple[ChatRequest, GenerateRequest, dict[str, Any]]:
        req = parse_chat_request(body, svc.limits)
        check_depth(req, ApiError)
        greq = to_generate_request(req, svc.limits, rid, client_name(request), svc.template_defaults)
        check_depth(greq, ApiError)  # JSON parsed out of strings (tool-call arguments) may nest deeper
        record = request_record(
            greq,
            protocol="openai_chat_completions",
            model=req.model,
            stream=req.stream,
            messages=len(req.messages),
            client_max=bool(req.max_completion_tokens or req.max_tokens),
            claim=client_claim(request, req.user),
        )
        return req, greq, record

    req, greq, record = await prepare(body, translate, ApiError, svc.large_bodies)
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
) -> tuple[am.AnthropicRequest, GenerateRequest, dict[str, Any]]:
    """The request, its GenerateRequest and (unless counting tokens) its log record."""
    body = await request.body()

    def translate() -> tuple[am.AnthropicRequest, GenerateRequest, dict[str, Any]]:
        req = am.parse_messages_request(body, svc.limits.max_context, require_max_tokens=not count)
        check_depth(req, am.AnthropicError)
        greq = am.to_generate_request(
            req, rid, client_name(request), svc.template_defaults, svc.config.default_max_tokens
        )
        check_depth(greq, am.AnthropicError)  # JSON parsed out of strings may nest deeper
        if count:
            return req, greq, {}
        record = request_record(greq, protocol="anthropic_messages", model=req.model, stream=req.stream,
                                messages=len(req.messages), client_max=req.max_tokens is not None,
                                claim=client_claim(request, None))  # fmt: skip
        return req, greq, record

    return await prepare(body, translate, am.AnthropicError, svc.large_bodies)


@post("/v1/messages", status_code=200, **ROUTE_DOCS["messages"])
async def messages(request: Request[Any, Any, Any]) -> Any:
    svc = service(request)
    t0 = time.perf_counter()
    mid = new_id("msg_")
    req, greq, record = await _anthropic(request, svc, mid)
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
    req, greq, _ = await _anthropic(request, svc, new_id("count_"), count=True)
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

    def translate() -> tuple[rs.ResponsesRequest, GenerateRequest, dict[str, Any]]:
        req = rs.parse_responses_request(body, svc.limits.model_id, svc.limits.max_context)
        check_depth(req, ApiError)
        greq = rs.to_generate_request(
            req, rid, client_name(request), svc.template_defaults, svc.config.default_max_tokens
        )
        check_depth(greq, ApiError)  # JSON parsed out of strings (call arguments) may nest deeper
        record = request_record(greq, protocol="openai_responses", model=req.model, stream=req.stream,
                                messages=len(greq.messages or ()), client_max=req.max_output_tokens is not None,
                                claim=client_claim(request, req.user))  # fmt: skip
        return req, greq, record

    req, greq, record = await prepare(body, translate, ApiError, svc.large_bodies)
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


GENERATION_ROUTES = [chat_completions, messages, count_tokens, responses, stored_response]
