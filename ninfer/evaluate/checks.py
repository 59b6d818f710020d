"""Structural checks a fixture declares, evaluated on what the server streamed back.

- ``valid_json``: the answer text (reasoning excluded) parses as JSON.
- ``json_schema``: the answer parses and validates against the check's ``schema``, else the body's response
  schema (chat ``response_format.json_schema.schema``, Responses ``text.format.schema``, Anthropic
  ``output_config.format.schema`` / ``output_format.schema``).
- ``tool_called``: at least one tool call; every call names a tool the body declares (the check's ``name``, when
  given, for the first call) and its arguments are a JSON object valid against that tool's parameter schema.
- ``stop_respected``: no stop string of the body (chat ``stop``, Anthropic ``stop_sequences``) occurs in the
  answer text.
- ``reasoning``: the reply carries reasoning text (a thinking block was produced).

Every check yields passed true or false with a short reason; a request that failed yields false for all of them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from .stream import Outcome

__all__ = ["CheckResult", "evaluate", "check_supported", "response_schema", "tool_schemas", "stop_strings"]


CheckKind = Literal["valid_json", "json_schema", "tool_called", "stop_respected", "reasoning"]


class Check(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: CheckKind
    schema: dict[str, Any] | None = None  # json_schema: overrides the body's own response schema
    name: str | None = None  # tool_called: the tool expected (default: any tool the body declares)


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    passed: bool
    detail: str = ""


def response_schema(protocol: str, body: dict[str, Any]) -> dict[str, Any] | None:
    if protocol == "openai_chat":
        rf = body.get("response_format") or {}
        return (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
    if protocol == "openai_responses":
        fmt = (body.get("text") or {}).get("format") or {}
    else:
        fmt = (body.get("output_config") or {}).get("format") or body.get("output_format") or {}
    return fmt.get("schema") if fmt.get("type") == "json_schema" else None


def tool_schemas(protocol: str, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Declared tools: name -> parameter schema."""
    out: dict[str, dict[str, Any]] = {}
    for t in body.get("tools") or ():
        if protocol == "openai_chat":
            f = t.get("function") or {}
            out[f.get("name", "")] = f.get("parameters") or {}
        elif protocol == "openai_responses":
            out[t.get("name", "")] = t.get("parameters") or {}
        else:
            out[t.get("name", "")] = t.get("input_schema") or {}
    return out


def stop_strings(protocol: str, body: dict[str, Any]) -> list[str]:
    stop = body.get("stop") if protocol == "openai_chat" else body.get("stop_sequences")
    return [stop] if isinstance(stop, str) else list(stop or ())


def check_supported(c: Check, protocol: str, body: dict[str, Any]) -> str | None:
    """Why ``c`` cannot be evaluated on this body, or None."""
    if c.kind == "json_schema" and c.schema is None and response_schema(protocol, body) is None:
        return "no schema in the check and no json_schema response format in the body"
    if c.kind == "tool_called":
        tools = tool_schemas(protocol, body)
        if not tools:
            return "the body declares no tools"
        if c.name is not None and c.name not in tools:
            return f"the body declares no tool named {c.name!r}"
    if c.kind == "stop_respected" and not stop_strings(protocol, body):
        return "the body has no stop strings (chat: stop, Anthropic: stop_sequences)"
    return None


def _parse(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except ValueError as e:
        return None, f"not JSON: {e}"


def _validate(value: Any, schema: dict[str, Any]) -> str | None:
    import jsonschema

    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    return None if err is None else f"schema: {err.message[:200]}"


def _tool_called(c: Check, protocol: str, body: dict[str, Any], out: Outcome) -> str | None:
    if not out.tool_calls:
        return "no tool call"
    tools = tool_schemas(protocol, body)
    if c.name is not None and out.tool_calls[0].name != c.name:
        return f"first call is {out.tool_calls[0].name!r}, expected {c.name!r}"
    for call in out.tool_calls:
        if call.name not in tools:
            return f"call to undeclared tool {call.name!r}"
        args, why = _parse(call.arguments)
        if why is not None:
            return f"{call.name} arguments {why}"
        if not isinstance(args, dict):
            return f"{call.name} arguments are not an object"
        why = _validate(args, tools[call.name])
        if why is not None:
            return f"{call.name} arguments {why}"
    return None


def _failure(c: Check, protocol: str, body: dict[str, Any], out: Outcome) -> str | None:
    """Why the check fails, or None when it passes."""
    if c.kind == "valid_json":
        return _parse(out.text)[1]
    if c.kind == "json_schema":
        value, why = _parse(out.text)
        schema = c.schema if c.schema is not None else response_schema(protocol, body)
        return why if why is not None else _validate(value, schema or {})
    if c.kind == "tool_called":
        return _tool_called(c, protocol, body, out)
    if c.kind == "stop_respected":
        hit = [s for s in stop_strings(protocol, body) if s in out.text]
        return f"stop string {hit[0]!r} in the answer" if hit else None
    if c.kind == "reasoning":
        return None if out.reasoning.strip() else "no reasoning text"
    raise AssertionError(f"unknown check kind {c.kind!r}")  # load_corpus admits only the kinds above


def evaluate(
    checks: tuple[Check, ...], protocol: str, body: dict[str, Any], out: Outcome
) -> list[CheckResult]:
    if out.error is not None:
        return [CheckResult(kind=c.kind, passed=False, detail="request failed") for c in checks]
    results = []
    for c in checks:
        why = _failure(c, protocol, body, out)
        results.append(CheckResult(kind=c.kind, passed=why is None, detail=why or "ok"))
    return results
