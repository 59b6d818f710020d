"""JSON Schema `pattern` and `format`, and valid UTF-8 strings: random walks through compiled grammars.

Every walk's text must parse with a strict JSON parser, and every generated string must match its regex (Python's
`re.search`, the semantics Python validators use) and contain no U+FFFD (bytes that were not UTF-8).
"""

from __future__ import annotations

import json
import random
import re
import uuid

import jsonschema
import pytest

pytest.importorskip("xgrammar")

from test_grammar import VOCAB, _walk  # noqa: E402

from ninfer.frontend import Tokenizer  # noqa: E402
from ninfer.frontend.grammar import GrammarCompiler, RequestGrammar, SchemaError, check_schema  # noqa: E402
from ninfer.frontend.json_regex import pattern_ebnf  # noqa: E402

PATTERNS = [
    r"^[a-z]+\d{2}$",
    r"a.c",  # unanchored: whole matches are generated
    r"^[^a]{1,5}$",
    r"^.{1,6}$",
    r'^["\\]{1,3}$',  # quote and backslash: JSON escapes
    r"^[\x00-\x1f]{1,3}$",  # control characters: JSON escapes
    r"^x\n\ty$",
    r'^(yes|no|"maybe")$',
    r"^[A-Z]{2}-\d{3}$",
    r"^é.$",  # XGrammar's own Regex admits a raw control character here
    r"^\s{1,3}x$",
    r"^\S{1,4}$",
    r"^\D{1,4}$",
    r"^[^\d\s]{2}$",
    r"^\w{2,4}$",
    r"^(?:ab|cd){1,3}e?$",
    r"^a|b$",
    r"[\]\-^]{1,3}",
    r"^\u00e9[\u4e00-\u4e0f]{1,2}$",
]


def _values(compiler: GrammarCompiler, tok: Tokenizer, schema: dict, n: int, seed: int) -> list:
    cg = compiler.json_schema(schema)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        hook = RequestGrammar(cg, vocab_size=VOCAB, thinking=False, think_end_id=None)
        text = tok.decode(_walk(hook, tok.eos_token_ids, rng))
        assert "\ufffd" not in text, text  # the bytes were UTF-8
        out.append(json.loads(text))  # strict: raw control characters are refused
    return out


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_strings_are_json_and_match(pattern: str, tok: Tokenizer, compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": pattern}}, "required": ["p"],
              "additionalProperties": False}  # fmt: skip
    for value in _values(compiler, tok, schema, 25, PATTERNS.index(pattern)):
        assert re.search(pattern, value["p"]), (pattern, value)
        jsonschema.validate(value, schema)


def test_several_patterns_refs_and_anyof(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    code = {"type": "string", "pattern": r"^[A-Z]{3}$"}
    schema = {
        "$defs": {"code": code},
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/code"},
            "b": {"type": "string", "pattern": r'^\d"\d$'},
            "c": {
                "anyOf": [{"type": "string", "pattern": r"^x+$", "description": "pattern"}, {"type": "null"}]
            },
            "pattern": {"type": "integer", "minimum": 0, "maximum": 9},  # a property named "pattern"
        },
        "required": ["a", "b", "c", "pattern"],
        "additionalProperties": False,
    }
    for value in _values(compiler, tok, schema, 12, 5):
        jsonschema.validate(value, schema)


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "string", "pattern": "a(?=b)"}, "pattern"),
        ({"type": "string", "pattern": "(?i)abc"}, "pattern"),
        ({"type": "string", "pattern": r"\bword"}, "pattern"),
        ({"type": "string", "pattern": "a{,3}"}, "pattern"),
        ({"type": "string", "pattern": "a{0,200000}"}, "pattern"),
        ({"type": "string", "pattern": "(?<name>a)"}, "pattern"),  # ECMA-262 syntax Python does not parse
        ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "pattern"),  # XGrammar drops maxLength
        ({"type": "string", "pattern": "^a$", "enum": ["b"]}, "pattern"),
        ({"pattern": "^a$"}, "pattern"),  # not a string schema
        ({"type": ["string", "null"], "pattern": "^a$"}, "pattern"),
        ({"type": "string", "format": "uuid", "pattern": "^a$"}, "pattern"),
        ({"type": "string", "format": "uuid", "maxLength": 8}, "format"),
        ({"type": "string", "format": "date"}, "format"),
        ({"type": "string", "format": "date-time"}, "format"),
        ({"type": "string", "format": "ipv4"}, "format"),
        ({"type": "string", "format": "email"}, "format"),
        ({"type": "string", "format": "iri"}, "format"),  # XGrammar would not constrain it at all
    ],
)
def test_unsupported_patterns_and_formats_are_named(schema: dict, keyword: str) -> None:
    with pytest.raises(SchemaError) as e:
        check_schema(schema)
    assert e.value.keyword == keyword, e.value


def test_patterns_are_refused_in_tool_parameters() -> None:
    params = {"type": "object", "properties": {"c": {"type": "string", "pattern": "^[a-z]+$"}}}
    check_schema(params)
    with pytest.raises(SchemaError, match="tool parameters") as e:
        check_schema(params, "tools.f", patterns=False)
    assert e.value.keyword == "pattern"


def test_pattern_translation_escapes_what_json_needs() -> None:
    assert pattern_ebnf('^"$', 10) == '"\\\\\\""'  # the EBNF literal of the two characters \"
    assert pattern_ebnf("^\\\\$", 10) == '"\\\\\\\\"'  # \\
    assert pattern_ebnf("^\\n$", 10) == '"\\\\n"'  # \n
    assert pattern_ebnf("^\\x0b$", 10) == '"\\\\u000b"'
    assert pattern_ebnf("^a{2,3}$", 10) == "([\\u0061]){2,3}"


_DURATION = re.compile(
    r"^P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))?"
    r"|T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)|\d+W)$"
)  # RFC 3339 appendix A


def test_supported_formats_hold(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    for value in _values(compiler, tok, {"type": "string", "format": "uuid"}, 40, 1):
        assert str(uuid.UUID(value)) == value.lower()
    for value in _values(compiler, tok, {"type": "string", "format": "duration"}, 40, 2):
        assert _DURATION.match(value), value


def test_strings_are_valid_utf8(tok: Tokenizer, compiler: GrammarCompiler) -> None:
    """XGrammar's negated string classes include the surrogate code points, whose 3-byte forms are not UTF-8
    (one walk in a few hundred hit one); rfc8259_ebnf excludes them."""
    for value in _values(compiler, tok, {"type": "string", "maxLength": 8}, 300, 1):
        assert len(value) <= 8
