"""The generation endpoints: POST /v1/chat/completions (OpenAI), /v1/messages and /v1/messages/count_tokens
(Anthropic) and /v1/responses (OpenAI Responses).

Each validates and translates its body (openai_chat.py, anthropic.py, responses.py) into the one GenerateRequest,
builds its output (*_output.py) and runs through the shared request plumbing (routes_common.py): a JSON body or an
SSE stream.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request
from ninfer.actors.messages import Failed

from . import anthropic as am
from . import anthropic_output as ao
from . import responses as rs
from . import responses_output as ro
from .anthropic_models import CountTokens
from .errors import ApiError
from .openai_chat import parse_chat_request, to_generate_request
from .openai_chat_output import ChatStream, completion_body, new_completion_id
from .protocol_shared import Output, new_id, parse_output, reports_calls
from .routes_common import admit, collect, event_stream, failure, output_mode, request_record
from .service import Service, client_claim, client_name, json_response
from .validation import check_depth, nesting_guard

__all__ = ["handle_chat", "handle_messages", "handle_count_tokens", "handle_responses"]


async def handle_chat(request: Request[Any, Any, Any], svc: Service) -> Any:
    t0 = time.perf_counter()
    body = await request.body()
    rid = new_completion_id()
    with nesting_guard(ApiError):
        req = parse_chat_request(body, svc.limits)
        check_depth(req, ApiError)
        greq = to_generate_request(req, svc.limits, rid, client_name(request), svc.template_defaults)
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
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        cs = ChatStream(rid, created, req.model, include_usage, thinking, tools)
        return event_stream(cs, events, track, ApiError)
    text, fin = await collect(request, events, track, ApiError)
    out = parse_output(text, thinking, tools)
    track.tool_calls = len(out.calls)
    return json_response(completion_body(rid, created, req.model, out, fin))


def _anthropic(
    request: Request[Any, Any, Any], svc: Service, body: bytes, rid: str, count: bool = False
) -> tuple[Any, Any]:
    with nesting_guard(am.AnthropicError):
        req = am.parse_messages_request(body, svc.limits.max_context, require_max_tokens=not count)
        check_depth(req, am.AnthropicError)
        greq = am.to_generate_request(
            req, rid, client_name(request), svc.template_defaults, svc.config.default_max_tokens
        )
    return req, greq


async def handle_count_tokens(request: Request[Any, Any, Any], svc: Service) -> Any:
    """Counted on the actor's prompt worker (no model run); logged as a ``count_tokens`` record."""
    t0 = time.perf_counter()
    req, greq = _anthropic(request, svc, await request.body(), new_id("count_"), count=True)
    check_depth(greq, am.AnthropicError)
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


async def handle_messages(request: Request[Any, Any, Any], svc: Service) -> Any:
    t0 = time.perf_counter()
    mid = new_id("msg_")
    req, greq = _anthropic(request, svc, await request.body(), mid)
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


async def handle_responses(request: Request[Any, Any, Any], svc: Service) -> Any:
    t0 = time.perf_counter()
    body = await request.body()
    rid = new_id("resp_")
    with nesting_guard(ApiError):
        req = rs.parse_responses_request(body, svc.limits.model_id, svc.limits.max_context)
        check_depth(req, ApiError)
        greq = rs.to_generate_request(
            req, rid, client_name(request), svc.template_defaults, svc.config.default_max_tokens
        )
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
