"""The JSON Schema subset this server enforces (docs/serving.md "Structured output"), checked before compiling.

XGrammar silently ignores keywords it does not implement (so an unchecked ``if``/``then`` would look enforced and
not be), ignores ``minLength``/``maxLength`` next to ``pattern`` or ``format``, and gets some formats wrong, so
:func:`check_schema` admits only what was checked to hold and raises :class:`SchemaError` naming the keyword and
where it sits. Pure Python: the API process runs it without importing XGrammar.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .json_regex import pattern_ebnf

__all__ = [
    "SchemaError",
    "check_schema",
    "with_pattern_placeholders",
    "SUPPORTED_KEYWORDS",
    "SUPPORTED_FORMATS",
    "MAX_BOUND",
    "PLACEHOLDER",
]

# Annotations are accepted and have no effect.
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
_STRUCTURE = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems",
    "maxItems", "anyOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "pattern", "format",
}  # fmt: skip
SUPPORTED_KEYWORDS = frozenset(_ANNOTATIONS | _STRUCTURE)
# Formats whose XGrammar grammar was checked against independent validators (random walks through the grammar):
# uuid (uuid.UUID) and duration (RFC 3339 appendix A). Refused, with what XGrammar 0.2.9 generates: date and
# date-time (impossible days such as 02-31), time (second 60 at any hour), email (escapes that are not JSON),
# ipv4 and ipv6 (leading zeros, which Python's ipaddress refuses), hostname (labels over 63 characters), uri and
# the rest (not checked here); idn-*, iri*, regex and unknown formats XGrammar does not constrain at all.
SUPPORTED_FORMATS = frozenset({"uuid", "duration"})
# Largest minItems / maxItems / minLength / maxLength and pattern repetition count: grammars with huge bounds cost
# seconds to compile in some XGrammar versions, and no answer holds that many items or characters.
MAX_BOUND = 100_000
PLACEHOLDER = "ninferpattern{}"  # what XGrammar sees in place of the i-th pattern (see GrammarCompiler)
_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
_STRING_ONLY = ("minLength", "maxLength", "enum", "const")  # keywords XGrammar drops next to pattern / format
_MAX_DEPTH = 32


class SchemaError(ValueError):
    """A schema outside the supported subset (``keyword`` set) or not a valid schema (``keyword`` None)."""

    def __init__(self, message: str, keyword: str | None = None, path: str = "") -> None:
        super().__init__(message)
        self.keyword, self.path = keyword, path


def check_schema(schema: Any, where: str = "schema", *, patterns: bool = True) -> None:
    """Raise SchemaError unless ``schema`` is a valid JSON Schema inside the supported subset. ``patterns``:
    whether ``pattern`` is admitted (it is translated for JSON answers only, not for tool-call parameters)."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a JSON Schema must be an object, got {type(schema).__name__}")
    _check(schema, where, schema, 0, patterns)


def _children(s: dict, at: str) -> Iterator[tuple[Any, str]]:
    """The subschemas of a schema object, with their paths (the keywords that hold schemas)."""
    for key in ("properties", "$defs", "definitions"):
        if key in s:
            if not isinstance(s[key], dict):
                raise SchemaError(f"{at}.{key}: must be an object")
            for name, sub in s[key].items():
                yield sub, f"{at}.{key}.{name}"
    for key in ("items", "additionalProperties"):
        if key in s:
            yield s[key], f"{at}.{key}"
    if "anyOf" in s:
        if not isinstance(s["anyOf"], list) or not s["anyOf"]:
            raise SchemaError(f"{at}.anyOf: must be a non-empty array")
        for i, sub in enumerate(s["anyOf"]):
            yield sub, f"{at}.anyOf[{i}]"


def _check(s: Any, at: str, root: dict, depth: int, patterns: bool) -> None:
    if isinstance(s, bool):
        return
    if not isinstance(s, dict):
        raise SchemaError(f"{at}: a subschema must be an object or a boolean, got {type(s).__name__}")
    if depth > _MAX_DEPTH:
        raise SchemaError(f"{at}: schema nesting deeper than {_MAX_DEPTH}")
    for key in s:
        if key not in SUPPORTED_KEYWORDS or (key == "pattern" and not patterns):
            where = "" if key != "pattern" else " in tool parameters"
            raise SchemaError(
                f"{at}: the JSON Schema keyword '{key}' is not supported{where} by this server "
                f"(supported: {', '.join(sorted(_STRUCTURE))})",
                keyword=key,
                path=at,
            )
    _check_values(s, at)
    _check_string(s, at)
    for sub, path in _children(s, at):
        _check(sub, path, root, depth + 1, patterns)
    if "$ref" in s:
        _resolve(s["$ref"], root, f"{at}.$ref")


def _check_string(s: dict, at: str) -> None:
    """``pattern`` and ``format``: on a ``"type": "string"`` schema, one of them, without the keywords XGrammar
    would then ignore; a format from SUPPORTED_FORMATS, a pattern the translator accepts."""
    for key in ("pattern", "format"):
        if key not in s:
            continue
        if key == "format" and not isinstance(s["format"], str):
            raise SchemaError(f"{at}.format: must be a string")
        if key == "format" and s["format"] not in SUPPORTED_FORMATS:
            raise SchemaError(
                f"{at}: 'format: {s['format']}' is not supported by this server (supported: "
                f"{', '.join(sorted(SUPPORTED_FORMATS))}; the others' grammars do not agree with JSON Schema)",
                keyword="format",
                path=at,
            )
        if s.get("type") != "string":
            raise SchemaError(f'{at}.{key}: supported on a schema with "type": "string" only', key, at)
        clash = [k for k in (*_STRING_ONLY, "format" if key == "pattern" else "") if k in s]
        if clash:
            raise SchemaError(f"{at}: '{key}' together with '{clash[0]}' is not supported", key, at)
    if "pattern" in s:
        if not isinstance(s["pattern"], str):
            raise SchemaError(f"{at}.pattern: must be a string")
        try:
            pattern_ebnf(s["pattern"], MAX_BOUND)
        except ValueError as e:
            raise SchemaError(f"{at}.pattern: {e}", "pattern", f"{at}.pattern") from None


def _check_values(s: dict, at: str) -> None:
    t = s.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if not types and "type" in s or any(not isinstance(x, str) or x not in _TYPES for x in types):
        raise SchemaError(f"{at}.type: must be one of {sorted(_TYPES)} or a list of them, got {t!r}")
    req = s.get("required", [])
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise SchemaError(f"{at}.required: must be an array of property names")
    if "enum" in s and (not isinstance(s["enum"], list) or not s["enum"]):
        raise SchemaError(f"{at}.enum: must be a non-empty array")
    for lo, hi in (("minItems", "maxItems"), ("minLength", "maxLength")):
        for k in (lo, hi):
            v = s.get(k)
            if k in s and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SchemaError(f"{at}.{k}: must be a non-negative integer, got {v!r}")
            if k in s and v > MAX_BOUND:
                raise SchemaError(
                    f"{at}.{k}: {v} is above this server's limit of {MAX_BOUND}", path=f"{at}.{k}"
                )
        if lo in s and hi in s and s[lo] > s[hi]:
            raise SchemaError(f"{at}: {lo} ({s[lo]}) is greater than {hi} ({s[hi]})")
    for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = s.get(k)
        if k in s and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise SchemaError(f"{at}.{k}: must be a number, got {v!r}")
    if "minimum" in s and "maximum" in s and s["minimum"] > s["maximum"]:
        raise SchemaError(f"{at}: minimum ({s['minimum']}) is greater than maximum ({s['maximum']})")


def _resolve(ref: Any, root: dict, at: str) -> None:
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise SchemaError(
            f"{at}: only local references ('#/$defs/...') are supported, got {ref!r}", "$ref", at
        )
    node: Any = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(f"{at}: reference {ref!r} does not resolve inside the schema")
        node = node[part]


def with_pattern_placeholders(schema: dict) -> tuple[dict, list[str]]:
    """A copy of a checked schema whose i-th ``pattern`` is PLACEHOLDER.format(i) (a plain word, which XGrammar
    passes through as ``Regex("ninferpattern<i>", ...)``), and the patterns in that order."""
    found: list[str] = []

    def walk(s: Any) -> Any:
        if not isinstance(s, dict):
            return s
        out = dict(s)
        if isinstance(s.get("pattern"), str):
            out["pattern"] = PLACEHOLDER.format(len(found))
            found.append(s["pattern"])
        for key in ("properties", "$defs", "definitions"):
            if key in s:
                out[key] = {name: walk(sub) for name, sub in s[key].items()}
        for key in ("items", "additionalProperties"):
            if key in s:
                out[key] = walk(s[key])
        if "anyOf" in s:
            out["anyOf"] = [walk(sub) for sub in s["anyOf"]]
        return out

    return walk(schema), found
