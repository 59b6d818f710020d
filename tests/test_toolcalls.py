"""Qwen XML tool-call parsing and the <think> split, whole and streamed (every chunking must agree)."""

from __future__ import annotations

import json
import random

import pytest

from ninfer.frontend.reasoning import ReasoningStream, split_reasoning
from ninfer.frontend.toolcalls import ToolCallStream, parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "opts": {}},
            },
        },
    }
]

ONE = "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n123 Main St\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
TWO = (
    '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis "<b>"\n\n</parameter>\n'
    '<parameter=opts>\n{"unit": "c", "list": [1, 2]}\n</parameter>\n</function>\n</tool_call>\n'
    "<tool_call>\n<function=other-tool>\n</function>\n</tool_call>\n"
)


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        out.append(text[i : i + n])
        i += n
    return out


def _stream(text: str, rng: random.Random, tools: list | None = TOOLS) -> tuple[str, dict, dict, dict]:
    s = ToolCallStream(tools)
    events = [ev for c in _chunks(text, rng) for ev in s.push(c)] + s.finish()
    content = "".join(ev[1] for ev in events if ev[0] == "text")
    names = {ev[1]: ev[2] for ev in events if ev[0] == "start"}
    pieces: dict[int, str] = {}
    for ev in events:
        if ev[0] == "args":
            pieces[ev[1]] = pieces.get(ev[1], "") + ev[2]
    final = {ev[1]: ev[2] for ev in events if ev[0] == "end"}
    return content, names, pieces, final


def test_single_call_with_typed_values() -> None:
    p = parse_tool_calls(ONE, TOOLS)
    assert p.content == "I'll check."
    assert [c.name for c in p.calls] == ["get_weather"]
    assert json.loads(p.calls[0].arguments) == {"city": "123 Main St", "days": 3}


def test_two_calls_json_values_and_string_typed_digits() -> None:
    p = parse_tool_calls(TWO, TOOLS)
    assert p.content == ""
    assert json.loads(p.calls[0].arguments) == {"city": 'Paris "<b>"', "opts": {"unit": "c", "list": [1, 2]}}
    assert p.calls[1].name == "other-tool" and p.calls[1].arguments == "{}"
    untyped = parse_tool_calls(ONE.replace("123 Main St", "123"), None)
    assert json.loads(untyped.calls[0].arguments)["city"] == 123  # no schema: read as JSON
    typed = parse_tool_calls(ONE.replace("123 Main St", "123"), TOOLS)
    assert json.loads(typed.calls[0].arguments)["city"] == "123"


@pytest.mark.parametrize(
    "text",
    [
        ONE.replace("</parameter>\n</function>", "</function>"),
        ONE.replace("<function=get_weather>", "<function=bad name>"),
        ONE.replace("</tool_call>", ""),
        "<tool_call>\n<function=f>\n<parameter=x>\n1",
        "<tool_call>\nplain text\n</tool_call>",
    ],
)
def test_malformed_is_whole_text_as_content(text: str) -> None:
    p = parse_tool_calls(text, TOOLS)
    assert p.calls == [] and p.content == text.strip()


def test_text_after_complete_calls_is_content() -> None:
    """A complete call is already streamed when trailing text comes: it stays a call, the text is content (the
    whole-text parse is the same parser, so it agrees; upstream dropped the call)."""
    p = parse_tool_calls(ONE + "\ntrailing words", TOOLS)
    assert [c.name for c in p.calls] == ["get_weather"] and not p.unclosed
    assert p.content == "I'll check.\ntrailing words"


def test_name_length_limits() -> None:
    call = "<tool_call>\n<function={}>\n</function>\n</tool_call>"
    assert parse_tool_calls(call.format("a" * 64)).calls
    assert not parse_tool_calls(call.format("a" * 65)).calls
    assert parse_tool_calls(call.format("a" * 128), max_name=128).calls
    assert not parse_tool_calls(call.format("a" * 129), max_name=128).calls


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("text", [ONE, TWO, "no calls here at all <tool", "  just text\n\n"])
def test_streaming_agrees_with_whole_text(text: str, seed: int) -> None:
    whole = parse_tool_calls(text, TOOLS)
    content, names, pieces, final = _stream(text, random.Random(seed))
    assert content == whole.content
    assert [names[i] for i in sorted(names)] == [c.name for c in whole.calls]
    assert [pieces[i] for i in sorted(pieces)] == [c.arguments for c in whole.calls]
    assert [final[i] for i in sorted(final)] == [c.arguments for c in whole.calls]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("cut", "unclosed"),
    [
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", True),
        ("<tool_call>\n<function=get_weather>\n<parameter=days>\n4", True),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n</function>\n</tool", True),
        ("<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</parameter>\nnot a tag", False),
    ],
)
def test_cut_or_malformed_block_is_never_a_call(cut: str, unclosed: bool, seed: int) -> None:
    content, names, pieces, final = _stream("Let me see.\n\n" + cut, random.Random(seed))
    assert names == pieces == final == {}  # nothing of the call was streamed
    assert content == "Let me see.\n\n" + cut  # its markup is text, as the whole-text parse says
    whole = parse_tool_calls("Let me see.\n\n" + cut, TOOLS)
    assert whole.calls == [] and whole.content == content and whole.unclosed is unclosed


@pytest.mark.parametrize("seed", range(3))
def test_every_cut_agrees_and_reports_only_closed_blocks(seed: int) -> None:
    """Each prefix of a two-call answer (a generation cut at any point): streamed in random chunks it gives the
    whole-text parse, and exactly the calls whose </tool_call> is inside the prefix."""
    text = "Sure.\n\n" + TWO.rstrip()
    for n in range(len(text) + 1):
        cut = text[:n]
        whole = parse_tool_calls(cut, TOOLS)
        content, names, pieces, final = _stream(cut, random.Random(seed * 1000 + n))
        assert content == whole.content
        assert [names[i] for i in sorted(names)] == [c.name for c in whole.calls]
        assert [pieces[i] for i in sorted(pieces)] == [final[i] for i in sorted(final)]
        assert [final[i] for i in sorted(final)] == [c.arguments for c in whole.calls]
        assert len(whole.calls) == cut.count("</tool_call>")
        for c in whole.calls:
            assert isinstance(json.loads(c.arguments), dict)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize(
    ("text", "thinking"),
    [
        ("  let me think\n about it \n</think>\n\nThe answer.", True),
        ("<think>\nrepeated opener</think>answer", True),
        ("still thinking when the budget ended  \n", True),
        ("answer only, </think> is just text", False),
        ("</think>\n\n", True),
        ("a </thin and more</think>b", True),
    ],
)
def test_reasoning_stream_agrees_with_split(text: str, thinking: bool, seed: int) -> None:
    whole = split_reasoning(text, thinking)
    rs = ReasoningStream(thinking)
    parts = [rs.push(c) for c in _chunks(text, random.Random(seed))] + [rs.finish()]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == whole


def test_reasoning_split_values() -> None:
    assert split_reasoning("  a b \n</think>\n\n c", True) == ("a b", "c")
    assert split_reasoning("x", False) == ("", "x")
    assert split_reasoning("never closed", True) == ("never closed", "")
