"""Constrained decoding with XGrammar: schema checks, RFC 8259-safe compiled grammars, per-request token masks.

Three parts:

* :func:`check_schema` (schema_subset.py) accepts only the documented JSON Schema subset (XGrammar silently
  ignores keywords it does not implement, so an unchecked ``if``/``then`` would look enforced and not be). It
  raises :class:`SchemaError` naming the keyword and where it sits.
* :class:`GrammarCompiler` compiles JSON schemas, plain JSON and Qwen tool-call structural tags, cached by key.
  Every grammar goes through EBNF text that :func:`rfc8259_ebnf` patches: XGrammar 0.2.8's length-bounded string
  rule is ``[^"\\\r\n]`` (raw U+0000-U+001F admitted, escapes refused); every JSON string class gets
  ``\0-\x1f`` (and the surrogates) excluded and bounded strings get escapes back. ``pattern`` rules are
  ninfer's own JSON-safe translation (json_regex.py), put in place of XGrammar's ``Regex`` rules.
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

from .json_regex import pattern_ebnf
from .schema_subset import (
    MAX_BOUND,
    SUPPORTED_FORMATS,
    SUPPORTED_KEYWORDS,
    SchemaError,
    check_schema,
    with_pattern_placeholders,
)

__all__ = [
    "SchemaError",
    "check_schema",
    "rfc8259_ebnf",
    "GrammarCompiler",
    "RequestGrammar",
    "SUPPORTED_KEYWORDS",
    "SUPPORTED_FORMATS",
    "MAX_BOUND",
]

_ANY_OBJECT = {"type": "object"}  # XGrammar: any properties, any JSON values (additionalProperties unset)
# Whitespace characters admitted at each gap of a Qwen XML tool call (XGrammar's default is unbounded). The chat
# template writes one "\n" per gap; an unbounded gap let a sampled weak model spend a whole max_tokens budget on
# blank lines inside a forced call (finish "length", no call), so the call's length is bounded by its schema.
TOOL_CALL_WHITESPACE = 4


# ---- RFC 8259 patch of XGrammar's EBNF ----------------------------------------------------------------------
_BOUNDED_CLASS = r"[^\"\\\r\n]"  # XGrammar's per-character rule of length-bounded JSON strings
_SAFE_CHAR = r'([^\"\\\0-\x1f\ud800-\udfff] | ("\\" ([\"\\/bfnrt] | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))))'
_NEG_CLASS = re.compile(r"\[\^((?:\\.|[^\]\\])*)\]")


def rfc8259_ebnf(ebnf: str) -> str:
    """XGrammar EBNF whose JSON strings admit no raw U+0000-U+001F (RFC 8259 §7), no UTF-16 surrogate code points
    (XGrammar writes them as 3-byte sequences, which are not UTF-8: RFC 8259 §8.1) and whose bounded strings admit
    escapes. Negated classes that exclude the quote (JSON string characters) get both ranges excluded too."""
    out = ebnf.replace(_BOUNDED_CLASS, _SAFE_CHAR)

    def fix(m: re.Match[str]) -> str:
        body = m.group(1)
        if '\\"' not in body:
            return m.group(0)
        for extra in ("\\0-\\x1f", "\\ud800-\\udfff"):
            if extra not in body:
                body += extra
        return "[^" + body + "]"

    return _NEG_CLASS.sub(fix, out)


_PATTERN_RULE = re.compile(r'Regex\("ninferpattern(\d+)", json_string=true\)')


def _with_patterns(ebnf: str, patterns: list[str]) -> str:
    """XGrammar's EBNF with each placeholder pattern rule replaced by the pattern's JSON-safe translation
    (json_regex.pattern_ebnf); no XGrammar ``Regex`` rule may remain."""
    out = _PATTERN_RULE.sub(lambda m: "(" + pattern_ebnf(patterns[int(m.group(1))], MAX_BOUND) + ")", ebnf)
    if "Regex(" in out:
        raise SchemaError("schema: a pattern was not translated", keyword="pattern")
    return out


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

    def _compile_ebnf(self, ebnf: str) -> Any:
        return self._compiler.compile_grammar(self._xgr.Grammar.from_ebnf(rfc8259_ebnf(ebnf)))

    def json_schema(self, schema: dict[str, Any]) -> Any:
        check_schema(schema)
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))

        def build() -> Any:
            marked, patterns = with_pattern_placeholders(schema)
            try:
                g = self._xgr.Grammar.from_json_schema(
                    json.dumps(marked), any_whitespace=False, strict_mode=True
                )
            except Exception as e:  # XGrammar's own refusal of a malformed schema
                raise SchemaError(
                    f"schema: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                ) from None
            return self._compile_ebnf(_with_patterns(str(g), patterns))

        return self._cached("schema:" + text, build)

    def json_object(self) -> Any:
        """Any JSON object (``response_format: json_object``). XGrammar's builtin JSON grammar also admits a
        top-level array, so this is the schema ``{"type": "object"}``: an object whose values are any JSON."""
        return self.json_schema(_ANY_OBJECT)

    def tool_calls(self, tools: list[dict[str, Any]], choice: str, parallel: bool = False) -> Any:
        """Qwen XML calls (docs/protocols.md §7) of ``tools`` (OpenAI function-tool form): exactly one, or one or more
        with ``parallel``; ``choice`` is "required" (any of them) or a tool name (that one)."""
        for t in tools:
            params = t["function"].get("parameters") or {"type": "object"}
            check_schema(params, f"tools.{t['function']['name']}", patterns=False)
        text = json.dumps([tools, choice, parallel], sort_keys=True, separators=(",", ":"))

        def build() -> Any:
            tc: Any = (
                "required" if choice == "required" else {"type": "function", "function": {"name": choice}}
            )
            st = self._xgr.get_model_structural_tag(
                "qwen_3_5", tools=tools, tool_choice=tc, reasoning=False, parallel_tool_calls=parallel
            )
            _bound_whitespace(st.format, TOOL_CALL_WHITESPACE)
            return self._compiler.compile_structural_tag(st)

        return self._cached("tools:" + text, build)


def _bound_whitespace(fmt: Any, limit: int) -> None:
    """Sets ``max_whitespace_cnt`` on every JSON-schema format inside an XGrammar structural-tag format tree."""
    if hasattr(fmt, "max_whitespace_cnt"):
        fmt.max_whitespace_cnt = limit
    for name in ("content", "elements", "tags"):
        child = getattr(fmt, name, None)
        for sub in child if isinstance(child, list) else [child] if child is not None else []:
            _bound_whitespace(sub, limit)


# ---- the per-request hook --------------------------------------------------------------------------------
class RequestGrammar:
    """The engine's ``token_mask`` hook for one request (see ``ninfer.engine.core.TokenMask``).

    Phases: ``think`` (free; counts tokens against ``budget``) -> ``force`` (the queued ids, one at a time:
    ``</think>`` when the budget ran out, then the ids of ``"\\n\\n"``) -> ``answer`` (the matcher, or free when
    there is no grammar). ``thinking=False`` starts in ``answer`` (the prompt already closed the think block).
    With a grammar, the think phase excludes ``stop_ids`` (the ids that end the generation): an end of sequence
    sampled while thinking would end the request with no answer at all, so a structured request's answer always
    follows its reasoning (or ``max_tokens`` cuts it, which the finish reason says).
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
        stop_ids: Sequence[int] = (),
    ) -> None:
        if thinking and think_end_id is None:
            raise ValueError("thinking needs the tokenizer's </think> id")
        self._compiled, self._vocab = compiled, vocab_size
        self._thinking, self._end, self._after = thinking, think_end_id, tuple(after_think_ids)
        self._budget = budget
        # the think phase's mask with a grammar: every id but stop_ids
        self._no_stop: np.ndarray | None = None
        if compiled is not None and thinking and stop_ids:
            self._no_stop = np.ones(vocab_size, bool)
            self._no_stop[[int(t) for t in stop_ids if 0 <= int(t) < vocab_size]] = False
        self._words = np.zeros((1, -(-vocab_size // 32)), np.int32)
        self._reset()

    def _reset(self) -> None:
        self._phase = "think" if self._thinking else "answer"
        self._queue: list[int] = []
        self._think_n = 0
        self._seen = 0
        self._toks: list[
            int
        ] = []  # the generated tokens seen (speculative rounds roll back to a common prefix)
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
        common = self._common(generated)
        if (
            common < self._seen
        ):  # fewer tokens, or the same count but other ones (a speculative round's drafts)
            self._rollback(common)
        for pos in range(self._seen, n):
            self._advance(int(generated[pos]), pos)
            self._toks.append(int(generated[pos]))
            self._seen = pos + 1
        return self._mask()

    def _common(self, generated: Sequence[int]) -> int:
        """Length of the common prefix of ``generated`` and the tokens seen (only the tail can differ)."""
        c = min(len(generated), self._seen)
        if list(generated[:c]) == self._toks[:c]:
            return c
        return next(i for i in range(c) if int(generated[i]) != self._toks[i])

    def _rollback(self, n: int) -> None:
        if self._phase == "answer" and n >= self._answer_at and self._matcher is not None:
            self._matcher.rollback(self._seen - n)
            self._seen = n
            del self._toks[n:]
        elif (self._phase == "answer" and n >= self._answer_at) or self._phase == "think":
            self._think_n -= (self._seen - n) if self._phase == "think" else 0  # every think token counted
            self._seen = n
            del self._toks[n:]
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
            return self._no_stop
        if self._phase == "force":
            return self._only(self._queue[0])
        if self._matcher is None:
            return None
        self._matcher.fill_next_token_bitmask(self._words, 0)
        return self._words[0]
