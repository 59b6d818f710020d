"""What the three protocols (chat completions, Anthropic messages, responses) share: tool and schema checks that
build the one engine request contract (GenerateRequest's tools / grammar / thinking), and the output parser
that turns generated text back into reasoning, answer text and tool calls (one parser, whole or streamed).

Output events (streaming and whole): ``("reasoning", s)``, ``("text", s)``, ``("start", i, name)``,
``("args", i, piece)``, ``("end", i, arguments)``. Each protocol renders them in its own shape.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.actors.messages import GrammarSpec

from ninfer.frontend.grammar import SchemaError, check_schema
from ninfer.frontend.reasoning import ReasoningStream
from ninfer.frontend.toolcalls import ToolCallStream

from .errors import ApiError

__all__ = [
    "Output",
    "OutputParser",
    "parse_output",
    "reports_calls",
    "hit_limit",
    "check_tool",
    "named_tool",
    "schema_grammar",
    "tool_grammar",
    "response_grammar",
    "salvage_arguments",
    "new_id",
]

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


@dataclass(slots=True)
class Output:
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    unclosed: bool = False  # the answer ended inside a call block (its markup is content, not a call)


_LIMIT = frozenset({"output_limit", "context_capacity"})


def reports_calls(finish_reason: str, calls: int, unclosed: bool) -> bool:
    """Whether the finish is "tool calls" (``tool_calls`` / ``tool_use`` / a completed response): some call was
    completed and the token limit did not cut the answer inside a later one (that is a ``length`` finish)."""
    return calls > 0 and not (unclosed and finish_reason in _LIMIT)


def hit_limit(finish_reason: str) -> bool:
    return finish_reason in _LIMIT


def parse_output(text: str, thinking: bool, tools: list[dict] | None, max_name: int = 64) -> Output:
    """A whole generated text, through the parser a stream uses, so the two always report the same."""
    parser = OutputParser(thinking, tools, max_name)
    out, names = Output(), {}
    for ev in parser.push(text) + parser.finish():
        if ev[0] == "reasoning":
            out.reasoning += ev[1]
        elif ev[0] == "text":
            out.content += ev[1]
        elif ev[0] == "start":
            names[ev[1]] = ev[2]
        elif ev[0] == "end":
            out.calls.append((names[ev[1]], ev[2]))
    out.unclosed = parser.unclosed
    return out


class OutputParser:
    """``push(text)`` / ``finish()`` return output events. Reasoning streams live; with tools active the answer
    goes through the call parser (a call's events come out when its block closes). ``unclosed`` after
    ``finish()``: the answer ended inside a call block."""

    def __init__(self, thinking: bool, tools: list[dict] | None, max_name: int = 64) -> None:
        self._think = ReasoningStream(thinking)
        self._calls = ToolCallStream(tools, max_name) if tools else None

    @property
    def unclosed(self) -> bool:
        return self._calls is not None and self._calls.unclosed

    def push(self, text: str) -> list[tuple]:
        r, a = self._think.push(text)
        return self._events(r, a, final=False)

    def finish(self) -> list[tuple]:
        r, a = self._think.finish()
        return self._events(r, a, final=True)

    def _events(self, r: str, a: str, final: bool) -> list[tuple]:
        out: list[tuple] = [("reasoning", r)] if r else []
        if self._calls is None:
            if a:
                out.append(("text", a))
            return out
        if a:
            out += self._calls.push(a)
        if final:
            out += self._calls.finish()
        return out


# ---- request side ---------------------------------------------------------------------------------------
def check_tool(name: Any, params: Any, at: str, max_name: int, err: type[ApiError]) -> dict[str, Any]:
    """One function tool in the OpenAI form the chat template renders (``{"type": "function", "function":
    {...}}``); a missing ``parameters`` is an empty object schema."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name) or len(name) > max_name:
        raise err(
            400, f"{at}.name: must match [A-Za-z0-9_-]{{1,{max_name}}}, got {name!r}", param=f"{at}.name"
        )
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise err(400, f"{at}: parameters must be a JSON Schema object", param=at)
    if not isinstance(params.get("properties", {}), dict):  # the output parser reads each parameter's type
        where = f"{at}.parameters.properties"
        raise err(400, f"{where}: must be an object", param=where, code="invalid_schema")
    return {"name": name, "parameters": params}


def named_tool(
    tools: list[dict[str, Any]], name: Any, param: str, err: type[ApiError]
) -> list[dict[str, Any]]:
    """The one tool a named tool choice renders; ``name`` must be the name of one of ``tools`` (a string)."""
    named = [t for t in tools if isinstance(name, str) and t["function"]["name"] == name]
    if not named:
        raise err(400, f"{param}: no tool named {name!r} in tools", param=param)
    return named


def schema_grammar(schema: Any, param: str, err: type[ApiError]) -> GrammarSpec:
    """A json_schema grammar; the schema is checked here so an unsupported keyword is a 400 naming it."""
    check(schema, param, err)
    return GrammarSpec(kind="json_schema", schema=json.dumps(schema))


def check(schema: Any, param: str, err: type[ApiError], patterns: bool = True) -> None:
    try:
        check_schema(schema, param, patterns=patterns)
    except SchemaError as e:
        code = "unsupported_schema_keyword" if e.keyword else "invalid_schema"
        raise err(400, str(e), param=e.path or param, code=code) from None


def tool_grammar(
    tools: list[dict[str, Any]], choice: str, param: str, err: type[ApiError], parallel: bool = False
) -> GrammarSpec | None:
    """``choice``: "auto" / "none" (free) or "required" / a tool name (constrained to calls: exactly one, or
    one or more when the client asked for ``parallel_tool_calls: true``)."""
    if choice in ("auto", "none"):
        return None
    for t in tools:
        fn = t["function"]
        if choice in ("required", fn["name"]):
            check(fn["parameters"], f"{param}.{fn['name']}.parameters", err, patterns=False)
    return GrammarSpec(kind="tool_calls", tool_choice=choice, parallel=parallel)


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def response_grammar(rf: Any, param: str = "response_format") -> GrammarSpec | None:
    """``response_format``: text (free), json_object, or json_schema (checked against the supported subset)."""
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(kind="json_object")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise _bad(f"{param}.json_schema: required", f"{param}.json_schema")
        name = js.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise _bad(
                f"{param}.json_schema.name: must match [a-zA-Z0-9_-]{{1,64}}", f"{param}.json_schema.name"
            )
        return schema_grammar(js.get("schema", {}), f"{param}.json_schema.schema", ApiError)
    raise _bad(
        f"{param}.type: must be text, json_object or json_schema",
        f"{param}.type",
        "response_format_not_supported",
    )


def salvage_arguments(args: Any) -> dict[str, Any]:
    """History tool-call arguments as an object. A string that is not a JSON object (a peer server may have
    streamed a truncated call) renders as a call without parameters instead of failing the whole session."""
    if isinstance(args, Mapping):
        return dict(args)
    if isinstance(args, str):
        try:
            v = json.loads(args) if args.strip() else {}
        except ValueError:
            return {}
        return v if isinstance(v, dict) else {}
    return {}
