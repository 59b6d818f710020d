"""POST /v1/chat/completions: validation and translation (openai_chat.py), output (openai_chat_output.py),
then the shared request plumbing (routes_common.py): a JSON body or an SSE stream."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request

from .errors import ApiError
from .limits import check_depth, nesting_guard
from .openai_chat import parse_chat_request, to_generate_request
from .openai_chat_output import ChatStream, completion_body, new_completion_id
from .protocol_shared import parse_output
from .routes_common import admit, collect, event_stream, output_mode, request_record
from .service import Service, client_claim, client_name, json_response

__all__ = ["handle_chat"]


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
