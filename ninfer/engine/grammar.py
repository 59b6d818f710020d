"""Constrained decoding with XGrammar: schema checks, RFC 8259-safe compiled grammars, per-request token masks.

Three parts:

* :func:`check_schema` accepts only the documented JSON Schema subset (XGrammar silently ignores keywords it does
  not implement, so an unchecked ``if``/``then`` or ``pattern`` would look enforced and not be). It raises
  :class:`SchemaError` naming the keyword and where it sits.
* :class:`GrammarCompiler` compiles JSON schemas, plain JSON and Qwen tool-call structural tags, cached by key.
  Every grammar goes through EBNF text that :func:`rfc8259_ebnf` patches: XGrammar 0.2.8's length-bounded string
  rule is ``[^"\\\r\n]`` (raw U+0000-U+001F admitted, escapes refused); every JSON string class gets
  ``\0-\x1f`` excluded and bounded strings get escapes back.
* :class:`RequestGrammar` is the engine's per-request ``token_mask`` hook. It owns the request's grammar state, not
  the lane: the reasoning phase is free (the matcher starts after ``</think>``), a thinking budget forces
  ``</think>\n\n`` once spent, then the matcher constrains the answer. Tokens are accepted lazily from the
  ``generated`` list the engine passes; a shorter list rolls the matcher back (speculative decoding).

``xgrammar`` (which imports torch) is imported lazily, so the API process can run :func:`check_schema` cheaply.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "SchemaError",
    "check_schema",
    "rfc8259_ebnf",
    "GrammarCompiler",
    "RequestGrammar",
    "SUPPORTED_KEYWORDS",
]

# The documented subset (docs/serving.md "Structured output"). Annotations are accepted and have no effect.
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
_STRUCTURE = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems",
    "maxItems", "anyOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum",
}  # fmt: skip
SUPPORTED_KEYWORDS = frozenset(_ANNOTATIONS | _STRUCTURE)
# No string format is admitted: in XGrammar 0.2.8 `date` admits impossible dates (11-31) and `email` can emit
# escapes that are not JSON; none is validated after generation yet, so all are refused by name.
SUPPORTED_FORMATS: frozenset[str] = frozenset()
_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
_MAX_DEPTH = 32


class SchemaError(ValueError):
    """A schema outside the supported subset (``keyword`` set) or not a valid schema (``keyword`` None)."""

    def __init__(self, message: str, keyword: str | None = None, path: str = "") -> None:
        super().__init__(message)
        self.keyword, self.path = keyword, path


def check_schema(schema: Any, where: str = "schema") -> None:
    """Raise SchemaError unless ``schema`` is a valid JSON Schema inside the supported subset."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a JSON Schema must be an object, got {type(schema).__name__}")
    _check(schema, where, schema, 0)


def _check(s: Any, at: str, root: dict, depth: int) -> None:
    if isinstance(s, bool):
        return
    if not isinstance(s, dict):
        raise SchemaError(f"{at}: a subschema must be an object or a boolean, got {type(s).__name__}")
    if depth > _MAX_DEPTH:
        raise SchemaError(f"{at}: schema nesting deeper than {_MAX_DEPTH}")
    for key in s:
        if key not in SUPPORTED_KEYWORDS and key != "format":
            raise SchemaError(
                f"{at}: the JSON Schema keyword '{key}' is not supported by this server "
                f"(supported: {', '.join(sorted(_STRUCTURE))})",
                keyword=key,
                path=at,
            )
    if "format" in s and s["format"] not in SUPPORTED_FORMATS:
        raise SchemaError(
            f"{at}: 'format: {s['format']}' is not supported by this server (its grammar constraint does not "
            "agree with JSON Schema validation)",
            keyword="format",
            path=at,
        )
    _check_values(s, at)
    for key in ("properties", "$defs", "definitions"):
        if key in s:
            if not isinstance(s[key], dict):
                raise SchemaError(f"{at}.{key}: must be an object")
            for name, sub in s[key].items():
                _check(sub, f"{at}.{key}.{name}", root, depth + 1)
    for key in ("items", "additionalProperties"):
        if key in s:
            _check(s[key], f"{at}.{key}", root, depth + 1)
    if "anyOf" in s:
        if not isinstance(s["anyOf"], list) or not s["anyOf"]:
            raise SchemaError(f"{at}.anyOf: must be a non-empty array")
        for i, sub in enumerate(s["anyOf"]):
            _check(sub, f"{at}.anyOf[{i}]", root, depth + 1)
    if "$ref" in s:
        _resolve(s["$ref"], root, f"{at}.$ref")


def _check_values(s: dict, at: str) -> None:
    t = s.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if not types and "type" in s or any(x not in _TYPES for x in types):
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


# ---- RFC 8259 patch of XGrammar's EBNF ----------------------------------------------------------------------
_BOUNDED_CLASS = r"[^\"\\\r\n]"  # XGrammar's per-character rule of length-bounded JSON strings
_SAFE_CHAR = (
    r'([^\"\\\0-\x1f] | ("\\" ([\"\\/bfnrt] | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))))'
)
_NEG_CLASS = re.compile(r"\[\^((?:\\.|[^\]\\])*)\]")


def rfc8259_ebnf(ebnf: str) -> str:
    """XGrammar EBNF whose JSON strings admit no raw U+0000-U+001F (RFC 8259 §7) and whose bounded strings admit
    escapes. Negated classes that exclude the quote (JSON string characters) get ``\\0-\\x1f`` excluded too."""
    out = ebnf.replace(_BOUNDED_CLASS, _SAFE_CHAR)

    def fix(m: re.Match[str]) -> str:
        body = m.group(1)
        if '\\"' in body and "\\0-\\x1f" not in body:
            return "[^" + body + "\\0-\\x1f]"
        return m.group(0)

    return _NEG_CLASS.sub(fix, out)


# ---- compilation -----------------------------------------------------------------------------------------
class GrammarCompiler:
    """XGrammar compiler for one tokenizer and vocabulary (``vocab_size``: the model's padded logits rows).

    ``json_schema`` / ``json_object`` / ``tool_calls`` return CompiledGrammar objects, cached (LRU, ``cache_size``
    entries) by their canonical key, so a schema sent on every request compiles once. Thread-safe."""

    def __init__(
        self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int], cache_size: int = 256
    ):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer)
        self.info = xgr.TokenizerInfo.from_huggingface(
            fast, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        self.vocab_size = vocab_size
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()

    def _cached(self, key: str, build: Any) -> Any:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = build()
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return compiled

    def _from_grammar(self, grammar: Any) -> Any:
        safe = self._xgr.Grammar.from_ebnf(rfc8259_ebnf(str(grammar)))
        return self._compiler.compile_grammar(safe)

    def json_schema(self, schema: dict[str, Any]) -> Any:
        check_schema(schema)
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))

        def build() -> Any:
            try:
                g = self._xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
            except Exception as e:  # XGrammar's own refusal of a malformed schema
                raise SchemaError(
                    f"schema: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                ) from None
            return self._from_grammar(g)

        return self._cached("schema:" + text, build)

    def json_object(self) -> Any:
        return self._cached("json", lambda: self._from_grammar(self._xgr.Grammar.builtin_json_grammar()))

    def tool_calls(self, tools: list[dict[str, Any]], choice: str, parallel: bool = False) -> Any:
        """Qwen XML calls (docs/protocols.md §7) of ``tools`` (OpenAI function-tool form): exactly one, or one or more
        with ``parallel``; ``choice`` is "required" (any of them) or a tool name (that one)."""
        for t in tools:
            check_schema(
                t["function"].get("parameters") or {"type": "object"}, f"tools.{t['function']['name']}"
            )
        text = json.dumps([tools, choice, parallel], sort_keys=True, separators=(",", ":"))

        def build() -> Any:
            tc: Any = (
                "required" if choice == "required" else {"type": "function", "function": {"name": choice}}
            )
            st = self._xgr.get_model_structural_tag(
                "qwen_3_5", tools=tools, tool_choice=tc, reasoning=False, parallel_tool_calls=parallel
            )
            return self._compiler.compile_structural_tag(st)

        return self._cached("tools:" + text, build)


# ---- the per-request hook --------------------------------------------------------------------------------
class RequestGrammar:
    """The engine's ``token_mask`` hook for one request (see ``ninfer.engine.core.TokenMask``).

    Phases: ``think`` (free; counts tokens against ``budget``) -> ``force`` (the queued ids, one at a time:
    ``</think>`` when the budget ran out, then the ids of ``"\\n\\n"``) -> ``answer`` (the matcher, or free when
    there is no grammar). ``thinking=False`` starts in ``answer`` (the prompt already closed the think block).
    """

    def __init__(
        self,
        compiled: Any | None,
        *,
        vocab_size: int,
        thinking: bool,
        think_end_id: int | None,
        after_think_ids: Sequence[int] = (),
        budget: int | None = None,
    ) -> None:
        if thinking and think_end_id is None:
            raise ValueError("thinking needs the tokenizer's </think> id")
        self._compiled, self._vocab = compiled, vocab_size
        self._thinking, self._end, self._after = thinking, think_end_id, tuple(after_think_ids)
        self._budget = budget
        self._words = np.zeros((1, -(-vocab_size // 32)), np.int32)
        self._reset()

    def _reset(self) -> None:
        self._phase = "think" if self._thinking else "answer"
        self._queue: list[int] = []
        self._think_n = 0
        self._seen = 0
        self._answer_at = 0 if not self._thinking else -1  # position where the answer phase began
        self._matcher = None
        if self._phase == "answer":
            self._start_answer(0)

    def _start_answer(self, at: int) -> None:
        self._phase, self._answer_at = "answer", at
        if self._compiled is not None:
            import xgrammar as xgr

            self._matcher = xgr.GrammarMatcher(self._compiled)

    @property
    def phase(self) -> str:
        return self._phase

    def __call__(self, generated: Sequence[int]) -> np.ndarray | None:
        n = len(generated)
        if n < self._seen:
            self._rollback(n)
        for pos in range(self._seen, n):
            self._advance(int(generated[pos]), pos)
        self._seen = n
        return self._mask()

    def _rollback(self, n: int) -> None:
        if self._phase == "answer" and n >= self._answer_at and self._matcher is not None:
            self._matcher.rollback(self._seen - n)
            self._seen = n
        else:  # back before the answer began: the caller replays from the start (rare; only speculative rounds)
            self._reset()

    def _advance(self, tok: int, pos: int) -> None:
        if self._phase == "think":
            self._think_n += 1
            if tok == self._end:
                self._queue = list(self._after) if self._compiled is not None or self._budget else []
                self._next_after_force(pos + 1)
        elif self._phase == "force":
            if not self._queue or tok != self._queue[0]:
                raise RuntimeError(f"forced token {self._queue[:1]} expected, got {tok}")
            self._queue.pop(0)
            self._next_after_force(pos + 1)
        elif self._matcher is not None and not self._matcher.accept_token(tok):
            raise RuntimeError(f"token {tok} is outside the grammar")

    def _next_after_force(self, at: int) -> None:
        if self._queue:
            self._phase = "force"
        else:
            self._start_answer(at)

    def _only(self, tok: int) -> np.ndarray:
        m = np.zeros(self._vocab, bool)
        m[tok] = True
        return m

    def _mask(self) -> np.ndarray | None:
        if self._phase == "think":
            if self._budget is not None and self._think_n >= self._budget:
                return self._only(self._end)  # budget spent: close the think block now
            return None
        if self._phase == "force":
            return self._only(self._queue[0])
        if self._matcher is None:
            return None
        self._matcher.fill_next_token_bitmask(self._words, 0)
        return self._words[0]
