"""OpenAI Chat Completions: request validation and translation to the actor's GenerateRequest.

Pure functions (no I/O), so every rule of docs/protocols.md §4 is testable without a server. Each rejection is an
ApiError naming the offending field in ``param``. The response side (bodies, SSE frames) is
openai_chat_output.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from ninfer.actors.messages import GenerateRequest, GrammarSpec, SamplingOptions

from .bulk_json import BodyDecoder
from .errors import ApiError, validation_param
from .openai_chat_models import ChatMessage, ChatRequest
from .protocol_shared import check_tool, named_tool, response_grammar, salvage_arguments, tool_grammar
from .validation import (
    EFFORTS,
    UNSUPPORTED_FIELDS,
    check_max_tokens,
    check_model,
    check_one_of,
    check_sampling,
    check_stops,
    check_tool_choice,
    check_unsupported,
)

__all__ = [
    "ChatLimits",
    "parse_chat_request",
    "to_generate_request",
    "chat_tools",
    "chat_thinking",
]

_ROLES = {"system", "developer", "user", "assistant", "tool"}
_DECODER = BodyDecoder(ChatRequest, "messages")


@dataclass(frozen=True, slots=True)
class ChatLimits:
    model_id: str
    max_context: int
    default_max_tokens: int


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def parse_chat_request(body: bytes, limits: ChatLimits) -> ChatRequest:
    """Decode and validate a request body; raises ApiError (400/404) naming the field."""
    if not body.strip():
        raise _bad("request body is empty", None)
    try:
        req = _DECODER.decode(body)
    except msgspec.ValidationError as e:
        raise _bad(f"invalid request: {e}", validation_param(e)) from None
    except msgspec.DecodeError:
        raise _bad("request body is not valid JSON", None) from None
    check_model(req.model, ApiError)
    if req.model != limits.model_id:
        raise ApiError(404, f"The model '{req.model}' does not exist", param="model", code="model_not_found")
    _check_messages(req.messages)
    _check_unsupported(req)
    _check_sampling(req, limits)
    return req


def _check_unsupported(req: ChatRequest) -> None:
    if req.n is not None and req.n != 1:
        raise _bad("n: only n=1 is supported", "n", "n_not_supported")
    if req.functions is not None or req.function_call is not None:
        param = "functions" if req.functions is not None else "function_call"
        raise _bad(
            f"{param}: legacy function calling is not supported; use tools", param, "tools_not_supported"
        )
    check_unsupported({name: getattr(req, name) for name in UNSUPPORTED_FIELDS}, ApiError)
    chat_tools(req)
    response_grammar(req.response_format)
    check_one_of(req.reasoning_effort, EFFORTS, "reasoning_effort", ApiError)
    if req.thinking_budget is not None and req.thinking_budget < 1:
        raise _bad("thinking_budget: must be a positive integer", "thinking_budget")


def chat_tools(req: ChatRequest) -> tuple[list[dict[str, Any]] | None, GrammarSpec | None]:
    """The tools rendered into the prompt and the grammar tool_choice asks for (docs/protocols.md §4, §7)."""
    choice = req.tool_choice
    if not req.tools:
        check_tool_choice(choice, "none", False, "tool_choice", ApiError)
        return None, None
    tools = []
    for i, t in enumerate(req.tools):
        at = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise _bad(
                f"{at}.type: only function tools are supported", f"{at}.type", "tool_type_not_supported"
            )
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{at}.function: required", f"{at}.function")
        if "description" in fn and not isinstance(fn["description"], str):
            raise _bad(f"{at}.function.description: must be a string", f"{at}.function.description")
        out = check_tool(fn.get("name"), fn.get("parameters"), f"{at}.function", 64, ApiError)
        if isinstance(fn.get("description"), str):
            out["description"] = fn["description"]
        tools.append({"type": "function", "function": out})
    if choice is None or choice in ("auto", "none"):
        name = choice or "auto"
    elif choice == "required":
        name = "required"
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        tools = named_tool(tools, name, "tool_choice.function.name", ApiError)  # renders only that tool
    else:
        raise _bad(
            "tool_choice: must be none, auto, required or {type: function, function: {name}}", "tool_choice"
        )
    if name == "none":
        return None, None
    return tools, tool_grammar(tools, name, "tools", ApiError, req.parallel_tool_calls is True)


def chat_thinking(req: ChatRequest, defaults: dict[str, Any]) -> dict[str, Any]:
    """Template kwargs: server defaults, then reasoning_effort ("none": off), chat_template_kwargs, then the
    enable_thinking field (each later one wins)."""
    kwargs = dict(defaults)
    if req.reasoning_effort is not None:
        kwargs["enable_thinking"] = req.reasoning_effort != "none"
    kwargs.update(req.chat_template_kwargs or {})
    if req.enable_thinking is not None:
        kwargs["enable_thinking"] = req.enable_thinking
    return kwargs


def _check_messages(messages: list[ChatMessage]) -> None:
    if not messages:
        raise _bad("messages: must be a non-empty array", "messages")
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if m.role not in _ROLES:
            raise _bad(f"{at}.role: unsupported role {m.role!r}", f"{at}.role", "unsupported_role")
        if isinstance(m.content, list):
            _check_parts(m.content, f"{at}.content")
        if m.role == "tool":
            if not m.tool_call_id:
                raise _bad(f"{at}.tool_call_id: required for role tool", f"{at}.tool_call_id")
            # content: a string or text parts (the SDK's type; the parts are checked above and joined)
        elif m.tool_call_id is not None:
            raise _bad(f"{at}.tool_call_id: only allowed for role tool", f"{at}.tool_call_id")
        if m.tool_calls is not None:
            if m.role != "assistant":
                raise _bad(f"{at}.tool_calls: only allowed for role assistant", f"{at}.tool_calls")
            _check_tool_calls(m.tool_calls, f"{at}.tool_calls")
        elif m.content is None:
            what = "content or tool_calls" if m.role == "assistant" else "content"
            raise _bad(f"{at}.content: {what} required", f"{at}.content")


def _check_parts(parts: list[Any], at: str) -> None:
    if not parts:
        raise _bad(f"{at}: must not be an empty array", at)
    for j, p in enumerate(parts):
        here = f"{at}[{j}]"
        if p.type == "text":
            if not isinstance(p.text, str):
                raise _bad(f"{here}.text: must be a string", f"{here}.text")
        elif p.type in ("image_url", "video_url"):
            raise _bad(
                f"{here}: image and video input are not enabled on this server", here, "vision_disabled"
            )
        else:
            raise _bad(
                f"{here}.type: unsupported content part {p.type!r}", f"{here}.type", "modality_not_supported"
            )


def _check_tool_calls(calls: list[Any], at: str) -> None:
    if not calls:
        raise _bad(f"{at}: must be a non-empty array", at)
    for j, c in enumerate(calls):
        if c.type != "function":
            raise _bad(f"{at}[{j}].type: must be 'function'", f"{at}[{j}].type")
        # arguments that are not a JSON object are salvaged, not refused (protocol.salvage_arguments): one bad
        # call in a replayed history must not fail every later request of the session (agents replay history)


def _check_sampling(req: ChatRequest, limits: ChatLimits) -> None:
    fields = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")
    check_sampling({name: getattr(req, name) for name in fields}, ApiError)
    if req.logit_bias is not None and not all(k.lstrip("-").isdigit() for k in req.logit_bias):
        raise _bad("logit_bias: keys must be token ids", "logit_bias")
    # max_completion_tokens wins when both are present
    if req.max_completion_tokens is not None:
        check_max_tokens(req.max_completion_tokens, "max_completion_tokens", limits.max_context, ApiError)
    else:
        check_max_tokens(req.max_tokens, "max_tokens", limits.max_context, ApiError)
    check_stops(req.stop if isinstance(req.stop, list) else None, "stop", ApiError)
    if req.stream_options is not None and not req.stream:
        raise _bad("stream_options: only allowed when stream is true", "stream_options")


def _message_dict(m: ChatMessage) -> dict[str, Any]:
    """A chat-template message: developer renders as system, text parts join with newlines."""
    content = m.content
    if isinstance(content, list):
        content = "\n".join(p.text for p in content)
    d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
    if m.reasoning_content is not None:
        d["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        d["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": salvage_arguments(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    return d


def to_generate_request(
    req: ChatRequest, limits: ChatLimits, request_id: str, client: str, template_defaults: dict[str, Any]
) -> GenerateRequest:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    max_tokens = req.max_completion_tokens or req.max_tokens or limits.default_max_tokens
    kwargs = chat_thinking(req, template_defaults)
    tools, grammar = chat_tools(req)
    fmt = response_grammar(req.response_format)
    if grammar is None:
        grammar = fmt
    sampling = SamplingOptions(
        max_tokens=max_tokens,  # the engine clamps it, once, to what the context leaves (Accepted.max_tokens)
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=req.seed,
        stop=tuple(s for s in stop if s),
        ignore_eos=req.ignore_eos,
    )
    return GenerateRequest(
        request_id=request_id,
        messages=tuple(_message_dict(m) for m in req.messages),
        template_kwargs=kwargs,
        sampling=sampling,
        client=client,
        tools=tuple(tools) if tools else None,
        grammar=grammar,
        thinking_budget=req.thinking_budget,
    )
