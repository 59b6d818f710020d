"""Grammar: the schema subset checker, the RFC 8259 patch, and random walks through compiled grammars.

A random walk samples uniformly among the tokens the mask allows until the grammar accepts a stop token; the
decoded text must parse with a strict JSON parser and validate against the schema (jsonschema). This is what a
model with random weights does under the constraint, without the model.
"""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

pytest.importorskip("xgrammar")

from ninfer.engine.sampler import allowed_from_mask
from ninfer.frontend import Tokenizer
from ninfer.frontend.grammar import GrammarCompiler, RequestGrammar, SchemaError, check_schema, rfc8259_ebnf

VOCAB = 1152  # the demo model's padded logits rows (more than the tokenizer's 1033 ids)

SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "null"}}, "required": ["ok", "n"]},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 8}}, "required": ["s"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}}, "required": ["s"]},
    {"type": "object", "properties": {"c": {"enum": ["red", "green", "blue"]}}, "required": ["c"]},
    {"type": "object", "properties": {"v": {"const": 42}}, "required": ["v"]},
    {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9},
                              "minItems": 1, "maxItems": 3}},
        "required": ["xs"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"inner": {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]}},
        "required": ["inner"],
    },
    {
        "type": "object",
        "properties": {"u": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "boolean"}]}},
        "required": ["u"],
    },
    {
        "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}},
                         "required": ["x"]}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/pt"}},
        "required": ["p"],
    },
    {"type": "array", "items": {"enum": [1, "two", None]}, "minItems": 2, "maxItems": 2},
    {"type": "object", "properties": {"t": {"type": ["integer", "null"], "minimum": 0, "maximum": 3}},
     "required": ["t"]},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                               "maxItems": 2}},
     "required": ["name", "tags"], "additionalProperties": False},
    {"type": "boolean"},
    {"type": "object", "properties": {"lvl": {"enum": ["low", "mid", "high"]},
                                      "score": {"type": "integer", "minimum": 0, "maximum": 10}},
     "required": ["lvl", "score"], "title": "Rating", "description": "annotations are accepted"},
    {"type": "object", "properties": {"e": {"type": "string", "enum": ["a\tb", "c\"d", "e\\f"]}}, "required": ["e"]},
]  # fmt: skip


def _walk(
    hook: RequestGrammar, stop_ids: tuple[int, ...], rng: random.Random, limit: int = 3000
) -> list[int]:
    """Uniform random tokens among those allowed, until a stop token is chosen."""
    gen: list[int] = []
    for _ in range(limit):
        m = hook(gen)
        ok = np.ones(VOCAB, bool) if m is None else allowed_from_mask(m, VOCAB)
        ok[1033:] = False  # padded rows beyond the tokenizer are never sampled (the engine's token_limit)
        ids = np.flatnonzero(ok)
        assert ids.size, "the mask allowed no token"
        t = int(ids[rng.randrange(ids.size)])
        if t in stop_ids:
            return gen
        gen.append(t)
    raise AssertionError("the walk did not terminate")


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_random_walks_parse_strictly_and_validate(i: int, tok: Tokenizer, compiler: GrammarCompiler) -> None:
    schema = SCHEMAS[i]
    cg = compiler.json_schema(schema)
    rng = random.Random(i)
    for _ in range(4):
        hook = RequestGrammar(cg, vocab_size=VOCAB, thinking=False, think_end_id=None)
        text = tok.decode(_walk(hook, tok.eos_token_ids, rng))
        value = json.loads(text)  # strict: raw control characters in strings are rejected
        jsonschema.validate(value, schema)


def test_compile_cache_hits(compiler: GrammarCompiler) -> None:
    a = compiler.json_schema({"type": "object", "properties": {"q": {"type": "boolean"}}, "required": ["q"]})
    b = compiler.json_schema({"required": ["q"], "properties": {"q": {"type": "boolean"}}, "type": "object"})
    assert a is b


def test_json_object_grammar_is_strict_json(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    cg = compiler.json_object()
    rng = random.Random(7)
    done = 0
    for _ in range(6):
        hook = RequestGrammar(cg, vocab_size=VOCAB, thinking=False, think_end_id=None)
        try:
            ids = _walk(hook, tok.eos_token_ids, rng, limit=300)
        except AssertionError:
            continue  # a uniform walk through unbounded JSON may not close in 300 tokens
        assert isinstance(json.loads(tok.decode(ids)), dict | list)
        done += 1
    assert done >= 1


def test_json_object_grammar_admits_only_objects(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    import xgrammar as xgr

    m = xgr.GrammarMatcher(compiler.json_object())
    assert not m.accept_string("[")  # XGrammar's builtin JSON grammar admits a top-level array
    for start in ('"', "1", "t", "n", " "):
        assert not xgr.GrammarMatcher(compiler.json_object()).accept_string(start), start
    assert xgr.GrammarMatcher(compiler.json_object()).accept_string('{"a": [1, {"b": null}]}')
    rng = random.Random(8)
    for _ in range(40):  # every walk that closes is an object
        hook = RequestGrammar(compiler.json_object(), vocab_size=VOCAB, thinking=False, think_end_id=None)
        first = np.flatnonzero(allowed_from_mask(hook([]), VOCAB)[:1033])
        assert {tok.decode([int(t)])[:1] for t in first} == {"{"}
        try:
            ids = _walk(hook, tok.eos_token_ids, rng, limit=200)
        except AssertionError:
            continue
        assert isinstance(json.loads(tok.decode(ids)), dict)


def test_rfc8259_patch_refuses_raw_control_characters(compiler: GrammarCompiler) -> None:
    import xgrammar as xgr

    raw = str(xgr.Grammar.from_json_schema('{"type": "string", "maxLength": 5}'))
    assert '[^\\"\\\\\\r\\n]' in raw  # XGrammar 0.2.8's bounded-string class (the bug this patch fixes)
    fixed = xgr.Grammar.from_ebnf(rfc8259_ebnf(raw))
    bad = xgr.GrammarMatcher(compiler._compiler.compile_grammar(xgr.Grammar.from_ebnf(raw)))
    assert bad.accept_string('"a') and bad.accept_string("\x01")  # unpatched: admitted
    good = xgr.GrammarMatcher(compiler._compiler.compile_grammar(fixed))
    assert good.accept_string('"a')
    assert not good.accept_string("\x01") and not good.accept_string("\t")
    assert good.accept_string("\\n\\u00e9") and good.accept_string('"')


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        (
            {"type": "string", "pattern": "^(a)\\1$"},
            "pattern",
        ),  # a backreference (pattern itself is supported)
        ({"type": "string", "format": "date"}, "format"),
        ({"type": "object", "properties": {"e": {"type": "string", "format": "email"}}}, "format"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"$ref": "https://example.com/s.json"}, "$ref"),
    ],
)
def test_unsupported_keywords_are_named(schema: dict, keyword: str) -> None:
    with pytest.raises(SchemaError) as e:
        check_schema(schema)
    assert e.value.keyword == keyword and keyword in str(e.value)


@pytest.mark.parametrize(
    "schema",
    [
        [1, 2],
        {"type": "strnig"},
        {"type": "object", "required": "a"},
        {"type": "integer", "minimum": 5, "maximum": 1},
        {"type": "array", "minItems": -1},
        {"$ref": "#/$defs/missing"},
        {"type": "object", "properties": {"a": 3}},
    ],
)
def test_invalid_schemas(schema: object) -> None:
    with pytest.raises(SchemaError) as e:
        check_schema(schema)
    assert e.value.keyword is None


def test_thinking_is_free_then_budget_forces_close_then_grammar(
    tok: Tokenizer, compiler: GrammarCompiler
) -> None:
    end = tok.hf.token_to_id("</think>")
    nl = tok.encode("\n\n", add_special_tokens=False)
    schema = SCHEMAS[0]
    hook = RequestGrammar(
        compiler.json_schema(schema),
        vocab_size=VOCAB,
        thinking=True,
        think_end_id=end,
        after_think_ids=nl,
        budget=5,
    )
    gen: list[int] = []
    for t in tok.encode("I think so", add_special_tokens=False)[:5]:
        assert hook(gen) is None  # free while thinking
        gen.append(t)
    while len(gen) < 5:
        gen.append(tok.encode("x", add_special_tokens=False)[0])
    forced = allowed_from_mask(hook(gen), VOCAB)
    assert np.flatnonzero(forced).tolist() == [end]
    gen.append(end)
    for t in nl:
        assert np.flatnonzero(allowed_from_mask(hook(gen), VOCAB)).tolist() == [t]
        gen.append(t)
    start = len(gen)
    rest = _walk(_Offset(hook, gen), tok.eos_token_ids, random.Random(3))
    text = tok.decode(gen[start:] + rest)
    jsonschema.validate(json.loads(text), schema)


def test_a_structured_answer_cannot_end_while_thinking(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    """With a grammar the think phase masks the end-of-sequence ids (a stop there would end the request without
    its answer) and nothing else; without a grammar (a budget alone) thinking stays free."""
    end = tok.hf.token_to_id("</think>")
    nl = tok.encode("\n\n", add_special_tokens=False)
    eos = list(tok.eos_token_ids)
    hook = RequestGrammar(compiler.json_schema(SCHEMAS[0]), vocab_size=VOCAB, thinking=True, think_end_id=end,
                          after_think_ids=nl, stop_ids=eos)  # fmt: skip
    gen = tok.encode("I think", add_special_tokens=False)
    allowed = allowed_from_mask(hook(gen), VOCAB)
    assert not allowed[eos].any() and allowed[end]
    assert int(allowed.sum()) == VOCAB - len(set(eos))
    free = RequestGrammar(None, vocab_size=VOCAB, thinking=True, think_end_id=end, budget=50, stop_ids=eos)
    assert free(gen) is None
    gen += [end, *nl]
    answer = allowed_from_mask(hook(gen), VOCAB)  # the grammar's own mask after the think block
    assert answer[tok.encode("{", add_special_tokens=False)[0]] and not answer[eos].any()


class _Offset:
    """Feeds a hook a prefix it has already seen plus the walk's tokens."""

    def __init__(self, hook: RequestGrammar, prefix: list[int]) -> None:
        self.hook, self.prefix = hook, list(prefix)

    def __call__(self, gen: list[int]) -> np.ndarray | None:
        return self.hook(self.prefix + gen)


def test_rollback_restores_the_matcher(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    hook = RequestGrammar(
        compiler.json_schema(SCHEMAS[2]), vocab_size=VOCAB, thinking=False, think_end_id=None
    )
    ids = tok.encode('{"s": "ab', add_special_tokens=False)
    m_full = hook(ids).copy()
    hook(ids[:2])  # a speculative round rejected: back to two tokens
    m_again = hook(ids)
    assert np.array_equal(m_full, m_again)


def test_tool_call_structural_tag_walk(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    from ninfer.frontend.toolcalls import parse_tool_calls

    params = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1,
                                                                            "maximum": 7}},
        "required": ["city", "days"],
    }  # fmt: skip
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    cg = compiler.tool_calls(tools, "get_weather")
    rng = random.Random(11)
    for _ in range(3):
        hook = RequestGrammar(cg, vocab_size=VOCAB, thinking=False, think_end_id=None)
        text = tok.decode(_walk(hook, tok.eos_token_ids, rng))
        parsed = parse_tool_calls(text, tools)
        assert parsed.calls, text
        for call in parsed.calls:
            assert call.name == "get_weather"
            jsonschema.validate(json.loads(call.arguments), params)


def test_a_forced_tool_call_is_bounded_even_for_a_model_that_loves_whitespace(
    tok: Tokenizer, compiler: GrammarCompiler
) -> None:
    """A walk that takes a whitespace-only token whenever the grammar allows one (a weak sampled model's blank
    lines) still closes the call: each gap admits at most TOOL_CALL_WHITESPACE characters."""
    from ninfer.frontend.grammar import TOOL_CALL_WHITESPACE

    params = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 6}, "metric": {"type": "boolean"}},
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    blank = [i for i in range(1033) if (s := tok.decode([i])) and not s.strip()]
    assert blank, "the tokenizer has whitespace-only tokens"
    hook = RequestGrammar(
        compiler.tool_calls(tools, "get_weather"), vocab_size=VOCAB, thinking=False, think_end_id=None
    )
    rng, gen, spaces = random.Random(5), [], 0
    for _ in range(400):
        ok = allowed_from_mask(hook(gen), VOCAB)
        ok[1033:] = False
        ws = [i for i in blank if ok[i]]
        t = ws[0] if ws else int(rng.choice(np.flatnonzero(ok)))
        if t in tok.eos_token_ids:
            break
        spaces += bool(ws)
        gen.append(t)
    else:
        raise AssertionError("the call never closed: " + repr(tok.decode(gen)[:200]))
    assert spaces <= 6 * TOOL_CALL_WHITESPACE, repr(tok.decode(gen))
