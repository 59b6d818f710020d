"""OpenAI Responses (docs/protocols.md §6): request validation and translation to the engine request. The models are
responses_models.py; the response object and SSE events are responses_output.py.

Nothing is stored: ``store`` is accepted and ignored (the answer is complete; only a later retrieval, which the
server answers 404, tells the difference); ``previous_response_id``, ``conversation`` and ``prompt`` (which point at
stored state) and ``background: true`` (whose result is polled from a stored response) are a 400.
"""

from __future__ import annotations

from typing import Any

import msgspec
from ninfer.actors.messages import GenerateRequest, SamplingOptions

from .bulk_json import BodyDecoder
from .errors import ApiError, validation_param
from .protocol_shared import check_tool, named_tool, response_grammar, salvage_arguments, tool_grammar
from .responses_models import ResponsesRequest
from .validation import (
    EFFORTS,
    check_max_tokens,
    check_model,
    check_one_of,
    check_sampling,
    check_tool_choice,
    check_unsupported,
)

__all__ = ["ResponsesRequest", "parse_responses_request", "to_generate_request"]


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


_DECODER = BodyDecoder(ResponsesRequest, "input")
# Fields that need state the server would have to hold (it stores nothing): a 400 when set (null and false are
# not), since ignoring them would answer without that context, or in the foreground. (field, why, error code)
_STORED_STATE = (
    ("previous_response_id", "this server stores no responses; send the items", None),
    ("conversation", "this server stores no conversations; send the items", "unsupported_field"),
    ("prompt", "this server stores no prompt templates; send instructions and input", "unsupported_field"),
    ("background", "this server stores no responses to poll; send the request without it (stream "
     "long ones)", "unsupported_field"),
)  # fmt: skip


def parse_responses_request(body: bytes, model_id: str, max_context: int) -> ResponsesRequest:
    """Decode and validate (api/validation.py's rules); raises ApiError naming the field."""
    try:
        req = _DECODER.decode(body)
    except msgspec.ValidationError as e:
        raise _bad(f"invalid request: {e}", validation_param(e)) from None
    except msgspec.DecodeError:
        raise _bad("request body is not valid JSON") from None
    check_model(req.model, ApiError)
    if req.model != model_id:
        raise ApiError(404, f"The model '{req.model}' does not exist", param="model", code="model_not_found")
    for name, why, code in _STORED_STATE:
        if getattr(req, name) not in (None, False):
            raise _bad(f"{name}: {why}", name, code)
    check_unsupported({"top_logprobs": req.top_logprobs}, ApiError)
    check_max_tokens(req.max_output_tokens, "max_output_tokens", max_context, ApiError)
    check_sampling({"temperature": req.temperature, "top_p": req.top_p}, ApiError)
    check_one_of((req.reasoning or {}).get("effort"), EFFORTS, "reasoning.effort", ApiError)
    check_tool_choice(req.tool_choice, "none", bool(req.tools), "tool_choice", ApiError)
    if not req.input:
        raise _bad("input: must be a non-empty string or array", "input")
    return req


def _content_text(c: Any, at: str) -> str:
    if isinstance(c, str):
        return c
    if not isinstance(c, list) or not c:
        raise _bad(f"{at}: must be a string or a non-empty array of parts", at)
    parts = []
    for j, p in enumerate(c):
        t = p.get("type") if isinstance(p, dict) else None
        if t in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            parts.append(p["text"])
        elif t in ("input_image", "input_file"):
            raise _bad(f"{at}[{j}]: image and file input are not enabled on this server", f"{at}[{j}]",
                       "vision_disabled")  # fmt: skip
        else:
            raise _bad(f"{at}[{j}].type: unsupported part {t!r}", f"{at}[{j}].type", "modality_not_supported")
    return "\n".join(parts)


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*out, {"role": "user", "content": req.input}]
    reasoning: str | None = None
    for i, item in enumerate(req.input):
        at = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{at}.role: unsupported role {role!r}", f"{at}.role", "unsupported_role")
            m = {"role": "system" if role == "developer" else role,
                 "content": _content_text(item.get("content"), f"{at}.content")}  # fmt: skip
            if role == "assistant" and reasoning is not None:
                m["reasoning_content"], reasoning = reasoning, None
            if m["role"] == "system" and out and out[0]["role"] == "system":
                out[0]["content"] += "\n" + m["content"]
            elif m["role"] == "system" and out:
                out.insert(0, m)
            else:
                out.append(m)
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")),
                                 "arguments": salvage_arguments(item.get("arguments"))}}  # fmt: skip
            if (
                out
                and out[-1]["role"] == "assistant"
                and (out[-1].get("tool_calls") or not out[-1]["content"])
            ):
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                m = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    m["reasoning_content"], reasoning = reasoning, None
                out.append(m)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{at}.output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind == "reasoning":
            texts = [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
            texts += [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
            reasoning = "\n".join(t for t in texts if t)
        else:
            raise _bad(f"{at}.type: unsupported item {kind!r}", f"{at}.type")
    return out


def _tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    if not req.tools:  # a tool_choice other than none was refused by parse_responses_request
        return None, None
    tools = []
    for i, t in enumerate(req.tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise _bad(f"tools[{i}].type: only function tools are supported", f"tools[{i}].type",
                       "tool_type_not_supported")  # fmt: skip
        fn = check_tool(t.get("name"), t.get("parameters"), f"tools[{i}]", 64, ApiError)
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        tools.append({"type": "function", "function": fn})
    tc = req.tool_choice
    choice = tc if tc in (None, "auto", "none", "required") else None
    if isinstance(tc, dict) and tc.get("type") == "function":
        choice = tc.get("name")
        tools = named_tool(tools, choice, "tool_choice.name", ApiError)
    elif choice is None and tc is not None:
        raise _bad("tool_choice: must be none, auto, required or {type: function, name}", "tool_choice")
    if choice == "none":
        return None, None
    return tools, tool_grammar(tools, choice or "auto", "tools", ApiError, req.parallel_tool_calls is True)


def _format_grammar(text: dict[str, Any] | None) -> Any:
    fmt = (text or {}).get("format")
    if fmt is None or not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return response_grammar(fmt, "text.format")
    rf = {
        "type": "json_schema",
        "json_schema": {"name": fmt.get("name", "response"), "schema": fmt.get("schema")},
    }
    return response_grammar(rf, "text.format")


def to_generate_request(
    req: ResponsesRequest, request_id: str, client: str, defaults: dict[str, Any], max_tokens: int
) -> GenerateRequest:
    kwargs = dict(defaults)
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        kwargs["enable_thinking"] = effort != "none"
    tools, grammar = _tools(req)
    fmt = _format_grammar(
        req.text
    )  # checked even where a forced call's grammar wins, as chat and Anthropic do
    if grammar is None:
        grammar = fmt
    sampling = SamplingOptions(max_tokens=req.max_output_tokens or max_tokens, temperature=req.temperature,
                               top_p=req.top_p)  # fmt: skip
    return GenerateRequest(request_id=request_id, messages=tuple(_messages(req)), template_kwargs=kwargs,
                           sampling=sampling, client=client, tools=tuple(tools) if tools else None,
                           grammar=grammar)  # fmt: skip
