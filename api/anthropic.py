"""Anthropic Messages (docs/protocols.md §5): request validation and translation to the engine request. The models are
anthropic_models.py; the response body and SSE events are anthropic_output.py.

Decisions: ``input_tokens`` is the whole rendered prompt (equal to count_tokens, as upstream's smoke test checks)
and ``cache_read_input_tokens`` is the part of it the engine reused from its prefix cache (so, unlike Anthropic's
own API, it is included in ``input_tokens``). ``thinking.budget_tokens`` is enforced: ``</think>`` is forced once
that many reasoning tokens were generated. ``stop_sequence`` names the stop sequence that ended the message.
Structured output (``output_config.format``) takes the same grammar path as chat's ``response_format``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from ninfer.actors.messages import GenerateRequest, GrammarSpec, SamplingOptions

from .anthropic_models import AnthropicRequest, ErrorDetail, ErrorEvent
from .bulk_json import BodyDecoder
from .errors import ApiError
from .protocol_shared import check_tool, named_tool, schema_grammar, tool_grammar
from .validation import (
    THINKING_TYPES,
    check_max_tokens,
    check_model,
    check_one_of,
    check_sampling,
    check_stops,
    check_tool_choice,
)

__all__ = [
    "AnthropicError",
    "AnthropicRequest",
    "error_class",
    "parse_messages_request",
    "to_generate_request",
]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                504: "timeout_error", 529: "overloaded_error"}  # fmt: skip
# Refusals because the server is full (not because of the client): Anthropic answers those 529 overloaded_error
# (its 429 means "your account hit a rate limit"); the SDKs retry both, honouring Retry-After (docs/protocols.md §3)
OVERLOADED_CODES = frozenset({"queue_full", "server_busy"})


class AnthropicError(ApiError):
    """An ApiError whose body has the Anthropic shape ``{"type": "error", "error": {"type", "message"}}``; a
    refusal for a full server (``OVERLOADED_CODES``) is a 529 ``overloaded_error``, as Anthropic's own."""

    def __init__(self, status: int, message: str, **kw: Any) -> None:
        super().__init__(529 if kw.get("code") in OVERLOADED_CODES else status, message, **kw)

    def body(self) -> ErrorEvent:  # type: ignore[override]
        kind = _ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return ErrorEvent(error=ErrorDetail(type=kind, message=self.message))


def error_class(path: str) -> type[ApiError]:
    """Anthropic's error shape under /v1/messages, OpenAI's elsewhere (docs/protocols.md §3)."""
    return AnthropicError if path.startswith("/v1/messages") else ApiError


def _bad(message: str, code: str | None = None) -> AnthropicError:
    return AnthropicError(400, message, code=code)


_DECODER = BodyDecoder(AnthropicRequest, "messages")


def parse_messages_request(
    body: bytes, max_context: int, require_max_tokens: bool = True
) -> AnthropicRequest:
    """Decode and validate (api/validation.py's rules); ``max_tokens`` is required except for count_tokens."""
    try:
        req = _DECODER.decode(body)
    except msgspec.ValidationError as e:
        raise _bad(f"invalid request: {e}") from None
    except msgspec.DecodeError:
        raise _bad("request body is not valid JSON") from None
    check_model(req.model, AnthropicError)
    if not req.messages:
        raise _bad("messages: must be a non-empty array")
    if req.max_tokens is None and require_max_tokens:
        raise _bad("max_tokens: required")
    check_max_tokens(req.max_tokens, "max_tokens", max_context, AnthropicError)
    check_sampling({"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}, AnthropicError)
    check_stops(req.stop_sequences, "stop_sequences", AnthropicError)
    _check_thinking(req.thinking)
    kind = req.tool_choice.get("type", "") if req.tool_choice is not None else None
    check_tool_choice(kind, "none", bool(req.tools), "tool_choice", AnthropicError)
    return req


def _check_thinking(thinking: dict[str, Any] | None) -> None:
    if thinking is None:
        return
    if thinking.get("type") is None:
        raise _bad("thinking.type: required")
    check_one_of(thinking["type"], THINKING_TYPES, "thinking.type", AnthropicError)
    b = thinking.get("budget_tokens")
    if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
        raise _bad("thinking.budget_tokens: must be a positive integer")


def _text_of(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if blocks is None:
        return ""
    if not isinstance(blocks, list):
        raise _bad(f"{where}: must be a string or an array of content blocks")
    return "\n".join(_block_text(b, f"{where}[{j}]") for j, b in enumerate(blocks))


def _block_text(b: Any, where: str) -> str:
    """The text of one content block at ``where`` (``messages[0].content[2]``); any other block is refused."""
    t = b.get("type") if isinstance(b, dict) else None
    if t == "text":
        if not isinstance(b.get("text"), str):
            raise _bad(f"{where}.text: must be a string")
        return b["text"]
    if t == "image":
        raise _bad(f"{where}: image input is not enabled on this server", "vision_disabled")
    raise _bad(f"{where}.type: unsupported content block {t!r}", "modality_not_supported")


def _user(m: dict[str, Any], at: str) -> list[dict[str, Any]]:
    """Each tool_result becomes its own tool turn, placed before the message's user text (docs/protocols.md §5)."""
    c = m.get("content")
    if isinstance(c, str):
        return [{"role": "user", "content": c}]
    if not isinstance(c, list) or not c:  # an empty list would vanish from the prompt (Anthropic refuses it)
        raise _bad(f"{at}.content: must be a string or a non-empty array of content blocks")
    out, texts = [], []
    for j, b in enumerate(c):
        if isinstance(b, dict) and b.get("type") == "tool_result":
            if not isinstance(b.get("tool_use_id"), str) or not b["tool_use_id"]:
                raise _bad(f"{at}.content[{j}].tool_use_id: required")
            text = _text_of(b.get("content"), f"{at}.content[{j}].content")
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
        else:
            texts.append(_block_text(b, f"{at}.content[{j}]"))
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(m: dict[str, Any], at: str) -> dict[str, Any]:
    c = m.get("content")
    if isinstance(c, str):
        return {"role": "assistant", "content": c}
    if not isinstance(c, list) or not c:
        raise _bad(f"{at}.content: must be a string or a non-empty array of content blocks")
    texts, thinking, calls = [], [], []
    for j, b in enumerate(c):
        t = b.get("type") if isinstance(b, dict) else None
        if t == "text":
            texts.append(str(b.get("text", "")))
        elif t == "thinking":
            thinking.append(str(b.get("thinking", "")))
        elif t == "redacted_thinking":
            continue
        elif t == "tool_use":
            if not isinstance(b.get("id"), str) or not b["id"]:
                raise _bad(f"{at}.content[{j}].id: required for a tool_use block")
            args = b.get("input") if isinstance(b.get("input"), dict) else {}
            calls.append({"id": b.get("id", ""), "type": "function",
                          "function": {"name": str(b.get("name", "")), "arguments": args}})  # fmt: skip
        else:
            raise _bad(f"{at}.content[{j}].type: unsupported block {t!r} in an assistant message")
    d: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thinking:
        d["reasoning_content"] = "\n".join(thinking)
    if calls:
        d["tool_calls"] = calls
    return d


def _messages(req: AnthropicRequest) -> list[dict[str, Any]]:
    system = [_text_of(req.system, "system")] if req.system else []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        at = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "system":  # Claude Code sends these: merged into the leading system text
            system.append(_text_of(m.get("content"), f"{at}.content"))
        elif role == "user":
            out += _user(m, at)
        elif role == "assistant":
            out.append(_assistant(m, at))
        else:
            raise _bad(f"{at}.role: unsupported role {role!r}", "unsupported_role")
    if system:
        out.insert(0, {"role": "system", "content": "\n".join(system)})
    return out


_OUTPUT_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})


def _output_grammar(req: AnthropicRequest) -> GrammarSpec | None:
    """Structured output: ``output_config.format`` (what the anthropic SDK sends; ``output_format`` is its older
    top-level place) ``{"type": "json_schema", "schema": {...}}``, through the same grammar path as the others.
    ``output_config.effort`` is checked and has no effect."""
    cfg = req.output_config or {}
    check_one_of(cfg.get("effort"), _OUTPUT_EFFORTS, "output_config.effort", AnthropicError)
    fmt, where = cfg.get("format"), "output_config.format"
    if req.output_format is not None:
        if fmt is not None:
            raise _bad("output_format: give either output_format or output_config.format, not both")
        fmt, where = req.output_format, "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad(f"{where}.type: must be 'json_schema'")
    if not isinstance(fmt.get("schema"), dict):
        raise _bad(f"{where}.schema: required (a JSON Schema object)")
    return schema_grammar(fmt["schema"], f"{where}.schema", AnthropicError)


def _tools(req: AnthropicRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    if not req.tools:
        return None, None
    tools = []
    for i, t in enumerate(req.tools):
        if not isinstance(t, dict) or not isinstance(t.get("input_schema"), dict):
            raise _bad(
                f"tools[{i}]: only client tools with an input_schema are supported", "tool_type_not_supported"
            )
        fn = check_tool(t.get("name"), t["input_schema"], f"tools[{i}]", 128, AnthropicError)
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        tools.append({"type": "function", "function": fn})
    tc = req.tool_choice or {"type": "auto"}
    kind = tc.get("type")
    if kind == "none":
        return None, None
    choice = {"auto": "auto", "any": "required"}.get(kind) if isinstance(kind, str) else None
    if kind == "tool":
        choice = tc.get("name")
        tools = named_tool(tools, choice, "tool_choice.name", AnthropicError)
    if choice is None:
        raise _bad("tool_choice.type: must be auto, any, tool or none")
    return tools, tool_grammar(tools, choice, "tools", AnthropicError)


def to_generate_request(
    req: AnthropicRequest, request_id: str, client: str, defaults: dict[str, Any], max_tokens: int
) -> GenerateRequest:
    kwargs = dict(defaults)
    budget = None
    if req.thinking is not None:  # checked by parse_messages_request
        kwargs["enable_thinking"] = req.thinking.get("type") != "disabled"
        budget = req.thinking.get("budget_tokens") if kwargs["enable_thinking"] else None
    tools, grammar = _tools(req)
    output = _output_grammar(req)
    if grammar is None:  # a forced tool call wins, as in chat
        grammar = output
    sampling = SamplingOptions(
        max_tokens=req.max_tokens or max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=tuple(s for s in req.stop_sequences or () if s),
    )
    return GenerateRequest(
        request_id=request_id,
        messages=tuple(_messages(req)),
        template_kwargs=kwargs,
        sampling=sampling,
        client=client,
        tools=tuple(tools) if tools else None,
        grammar=grammar,
        thinking_budget=budget,
    )
