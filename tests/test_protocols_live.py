"""End-to-end: Anthropic Messages, OpenAI Responses, tools and constrained JSON on a live `ninfer serve`.

The demo artifact has random weights, so structure in the output comes only from the constraints: JSON parses
strictly and validates against its schema, forced tool calls validate against the tool's parameters. Official
SDKs only (openai, anthropic). One server per module, joined to a local Ray this module starts and stops.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import openai
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("xgrammar")

from test_api_live import Server, demo_server  # noqa: E402 - the live-server helper of the serving tests
from test_grammar import SCHEMAS  # noqa: E402

MODEL = "ninfer-demo"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
}
USER = [{"role": "user", "content": "What is the weather in Paris? Reply as JSON."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from live_server(tmp_path_factory)


def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (8 lanes) on the demo artifact, joined to a local Ray this generator starts and stops."""
    args = [
        "--max-context",
        "4096",
        "--kv-capacity",
        "32768",
        "--max-concurrency",
        "8",
        "--queue-depth",
        "32",
    ]
    with demo_server(tmp_path_factory.mktemp("proto"), "proto", args) as s:
        yield s


def oai(s: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)


def ant(s: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=120)


# ---- structured output ----------------------------------------------------------------------------------
def test_chat_json_schema_parses_and_validates(server: Server) -> None:
    client = oai(server)

    def one(i: int) -> None:
        schema = SCHEMAS[i]
        r = client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=400, temperature=1.0, seed=i,
            extra_body={"enable_thinking": False},
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
        )  # fmt: skip
        c = r.choices[0]
        assert c.finish_reason == "stop", (i, c.message.content)
        jsonschema.validate(json.loads(c.message.content), schema)  # strict json.loads, then the schema

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(len(SCHEMAS))))
    assert len(SCHEMAS) >= 15


def test_schema_after_thinking_budget(server: Server) -> None:
    r = oai(server).chat.completions.create(
        model=MODEL, messages=USER, max_tokens=300, temperature=1.0, seed=5,
        extra_body={"thinking_budget": 8},
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMAS[0]}},
    )  # fmt: skip
    m = r.choices[0].message
    assert m.model_extra.get("reasoning_content")  # thinking ran free, then was closed by the budget
    jsonschema.validate(json.loads(m.content), SCHEMAS[0])
    assert r.usage.completion_tokens_details.reasoning_tokens == 9  # 8 free + the forced </think>


def test_unsupported_and_invalid_schemas_are_400(server: Server) -> None:
    client = oai(server)
    for schema, word in (
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "'if'"),
        ({"type": "string", "format": "date"}, "format"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model=MODEL, messages=USER, max_tokens=8,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            )  # fmt: skip
        assert word in e.value.body["message"] and e.value.body["code"] == "unsupported_schema_keyword"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}},
        )  # fmt: skip
    assert e.value.body["code"] == "invalid_schema"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model=MODEL, input="hi", max_output_tokens=8,
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "array", "uniqueItems": True}}},
        )  # fmt: skip
    assert "uniqueItems" in e.value.body["message"]


# ---- tools ----------------------------------------------------------------------------------------------
def test_forced_tool_call_validates_and_streams_the_same_arguments(server: Server) -> None:
    client = oai(server)
    kw = dict(model=MODEL, messages=USER, max_tokens=300, temperature=1.0, seed=7, tools=[TOOL],
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              extra_body={"enable_thinking": False})  # fmt: skip
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    pieces: dict[int, list[str]] = {}
    names, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or ():
                if tc.function and tc.function.name:
                    names[tc.index] = tc.function.name
                pieces.setdefault(tc.index, []).append(tc.function.arguments or "")
    assert finish == "tool_calls" and names[0] == "get_weather"
    assert len(pieces[0]) > 2  # streamed in pieces, not one final blob
    assert "".join(pieces[0]) == call.function.arguments  # same seed: the same call, streamed


def test_required_tool_choice_and_bad_history_does_not_fail(server: Server) -> None:
    client = oai(server)
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=300, temperature=1.0, seed=3, tools=[TOOL], tool_choice="required",
        extra_body={"enable_thinking": False},
    )  # fmt: skip
    call = r.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    history = [
        *USER,
        {"role": "assistant", "content": "<tool_call>\n<function=get_weather>\n<parameter=city\nPar",
         "tool_calls": [{"id": "call_x", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Par'}}]},
        {"role": "tool", "tool_call_id": "call_x", "content": "sunny"},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]  # fmt: skip
    r2 = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, tools=[TOOL])
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


# ---- Anthropic ------------------------------------------------------------------------------------------
def test_anthropic_create_stream_count_tokens(server: Server) -> None:
    client = ant(server)
    msgs = [{"role": "user", "content": "Hello there"}]
    n = client.messages.count_tokens(
        model="any-name", messages=msgs, system="Be brief.", thinking={"type": "disabled"}
    )
    r = client.messages.create(model="any-name", max_tokens=16, messages=msgs, system="Be brief.",
                               thinking={"type": "disabled"})  # fmt: skip
    assert r.model == "any-name" and r.usage.input_tokens == n.input_tokens
    assert [b.type for b in r.content] == ["text"] and r.stop_reason in ("end_turn", "max_tokens")
    t = client.messages.create(model="m", max_tokens=40, messages=msgs,
                               thinking={"type": "enabled", "budget_tokens": 6})  # fmt: skip
    assert t.content[0].type == "thinking" and t.content[0].thinking
    with client.messages.stream(model="m", max_tokens=40, messages=msgs,
                                thinking={"type": "enabled", "budget_tokens": 6}) as st:  # fmt: skip
        kinds = [ev.type for ev in st]
        final = st.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert (
        kinds.index("content_block_start") < kinds.index("content_block_delta") < kinds.index("message_delta")
    )
    assert final.content[0].type == "thinking" and final.usage.output_tokens > 0


def test_anthropic_stop_sequence_is_named(server: Server) -> None:
    stops = ["e", "a", "o", " "]
    r = ant(server).messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "Tell me"}],
                                    stop_sequences=stops, thinking={"type": "disabled"})  # fmt: skip
    if r.stop_reason == "stop_sequence":
        assert r.stop_sequence in stops
    else:
        assert r.stop_reason == "max_tokens" and r.stop_sequence is None


def test_anthropic_forced_tool_round_trip(server: Server) -> None:
    client = ant(server)
    tool = {"name": "get_weather", "description": "Weather", "input_schema": WEATHER}
    msgs: list = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.messages.create(model="m", max_tokens=300, messages=msgs, tools=[tool], extra_body={"temperature": 1.0},
                               tool_choice={"type": "tool", "name": "get_weather"}, thinking={"type": "disabled"})  # fmt: skip
    assert r.stop_reason == "tool_use"
    use = next(b for b in r.content if b.type == "tool_use")
    jsonschema.validate(use.input, WEATHER)
    msgs += [{"role": "assistant", "content": r.content},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]  # fmt: skip
    with client.messages.stream(model="m", max_tokens=300, messages=msgs, tools=[tool], extra_body={"temperature": 1.0},
                                tool_choice={"type": "any"}, thinking={"type": "disabled"}) as st:  # fmt: skip
        final = st.get_final_message()
    streamed = next(b for b in final.content if b.type == "tool_use")
    jsonschema.validate(streamed.input, WEATHER)
    bad = httpx.post(server.url + "/v1/messages", json={"model": "m", "messages": []})
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"


# ---- Responses ------------------------------------------------------------------------------------------
def test_responses_create_and_stream_ids_match(server: Server) -> None:
    client = oai(server)
    r = client.responses.create(model=MODEL, input="Hello", instructions="Be brief.", max_output_tokens=24,
                                reasoning={"effort": "low"})  # fmt: skip
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens > 0
    assert {o.type for o in r.output} <= {"reasoning", "message"}
    events = list(client.responses.create(model=MODEL, input="Hello", max_output_tokens=24, stream=True,
                                          reasoning={"effort": "none"}))  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type in ("response.completed", "response.incomplete")
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert added == done == [o.id for o in events[-1].response.output]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output[-1].content[0].text == text


def test_responses_function_call_and_json_format(server: Server) -> None:
    client = oai(server)
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    r = client.responses.create(model=MODEL, input="Weather?", tools=[tool], tool_choice="required",
                                max_output_tokens=300, temperature=1.0, reasoning={"effort": "none"})  # fmt: skip
    fc = next(o for o in r.output if o.type == "function_call")
    jsonschema.validate(json.loads(fc.arguments), WEATHER)
    events = list(client.responses.create(model=MODEL, input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}],
        max_output_tokens=300, temperature=1.0, reasoning={"effort": "none"}, stream=True,
        text={"format": {"type": "json_schema", "name": "w", "schema": SCHEMAS[1], "strict": True}}))  # fmt: skip
    final = events[-1].response
    assert final.status == "completed"
    jsonschema.validate(json.loads(final.output[-1].content[0].text), SCHEMAS[1])
