"""End-to-end HTTP contract of the three protocols on a live `ninfer serve` (demo artifact, reference backend):
stream headers, what `json_object` and patterns produce, calls cut by the token limit, one validation rule set,
unsupported fields, Anthropic structured output and the OpenAPI document. Raw HTTP (httpx) where headers or exact
bodies matter, the official SDKs where their parsing is the point.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import jsonschema
import msgspec
import pydantic
import pytest

pytest.importorskip("ray")
pytest.importorskip("xgrammar")

from ninfer.api.anthropic_models import AnthropicRequest, Message  # noqa: E402
from ninfer.api.openai_chat_models import ChatCompletion, ChatRequest  # noqa: E402
from ninfer.api.responses_models import Response, ResponsesRequest  # noqa: E402
from test_api_live import Server  # noqa: E402
from test_protocols_live import MODEL, TOOL, USER, WEATHER, ant, live_server  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from live_server(tmp_path_factory)


SSE = [
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 4, "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4, "stream": True}),
    ("/v1/messages", {"model": "m", "messages": USER, "max_tokens": 4, "stream": True}),
]


# ---- 1. stream and metrics content types ----------------------------------------------------------------
@pytest.mark.parametrize(("path", "body"), SSE, ids=["chat", "responses", "messages"])
def test_streams_are_event_streams(server: Server, path: str, body: dict) -> None:
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].split(";")[0] == "text/event-stream", r.headers["content-type"]
        assert r.headers["cache-control"] == "no-cache"
        assert r.read().startswith(b"data: " if path.endswith("completions") else b"event: ")


def test_metrics_content_type_is_prometheus_text_004(server: Server) -> None:
    r = httpx.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


# ---- 2. json_object means an object ---------------------------------------------------------------------
def _json_object_answers(server: Server) -> list[tuple[str, str]]:
    out = []
    for seed in range(6):
        body = {"model": MODEL, "messages": USER, "max_tokens": 40, "temperature": 1.0, "seed": seed,
                "enable_thinking": False, "response_format": {"type": "json_object"}}  # fmt: skip
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        out.append((c["message"]["content"], c["finish_reason"]))
    body = {"model": MODEL, "input": "JSON please", "max_output_tokens": 40, "temperature": 1.0,
            "reasoning": {"effort": "none"}, "text": {"format": {"type": "json_object"}}}  # fmt: skip
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out.append((r.json()["output"][-1]["content"][0]["text"], r.json()["status"]))
    return out


def test_json_object_is_always_an_object(server: Server) -> None:
    for text, finish in _json_object_answers(server):
        assert text.startswith("{"), text  # an array or a scalar was admitted before
        if finish in ("stop", "completed"):
            assert isinstance(json.loads(text), dict), text


# ---- 3. a call cut by the token limit -------------------------------------------------------------------
def sse(server: Server, path: str, body: dict) -> list[tuple[str | None, object]]:
    """The (event name, decoded data) frames of one raw SSE response."""
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    frames = []
    for block in text.split("\n\n"):
        lines = block.splitlines()
        name = next((ln[7:] for ln in lines if ln.startswith("event: ")), None)
        data = next((ln[6:] for ln in lines if ln.startswith("data: ")), None)
        if data is not None:
            frames.append((name, data if data == "[DONE]" else json.loads(data)))
    return frames


CUT = {"max_tokens": 14, "temperature": 0, "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def test_chat_forced_call_cut_by_the_limit_is_length_in_both_paths(server: Server) -> None:
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        body = {"model": MODEL, **CUT, "tools": [TOOL], "tool_choice": choice, "enable_thinking": False}
        whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
        assert whole["finish_reason"] == "length" and "tool_calls" not in whole["message"]
        assert whole["message"]["content"].startswith("<tool_call>")  # the unclosed markup is content
        chunks = [d for _, d in sse(server, "/v1/chat/completions", body) if d != "[DONE]"]
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        assert not any("tool_calls" in d["delta"] for d in deltas)  # no half call was streamed
        assert deltas[-1]["finish_reason"] == "length"
        assert "".join(d["delta"].get("content", "") for d in deltas) == whole["message"]["content"]


def test_anthropic_forced_call_cut_by_the_limit_is_max_tokens_in_both_paths(server: Server) -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER}
    body = {
        "model": "m",
        **CUT,
        "tools": [tool],
        "tool_choice": {"type": "any"},
        "thinking": {"type": "disabled"},
    }
    whole = httpx.post(server.url + "/v1/messages", json=body, timeout=120).json()
    assert whole["stop_reason"] == "max_tokens"
    assert [b["type"] for b in whole["content"]] == ["text"]
    frames = sse(server, "/v1/messages", body)
    starts = [d["content_block"]["type"] for n, d in frames if n == "content_block_start"]
    assert starts == ["text"]
    text = "".join(d["delta"]["text"] for n, d in frames if n == "content_block_delta")
    assert text == whole["content"][0]["text"] and text.startswith("<tool_call>")
    assert next(d for n, d in frames if n == "message_delta")["delta"]["stop_reason"] == "max_tokens"


def test_responses_forced_call_cut_by_the_limit_is_incomplete_in_both_paths(server: Server) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    body = {"model": MODEL, "input": "Weather?", "max_output_tokens": 14, "temperature": 0, "tools": [tool],
            "tool_choice": "required", "reasoning": {"effort": "none"}}  # fmt: skip
    whole = httpx.post(server.url + "/v1/responses", json=body, timeout=120).json()
    assert whole["status"] == "incomplete" and [o["type"] for o in whole["output"]] == ["message"]
    final = sse(server, "/v1/responses", body)[-1]
    assert final[0] == "response.incomplete"
    assert final[1]["response"]["output"][0]["content"] == whole["output"][0]["content"]


# ---- 4. one validation rule set, each protocol's own error shape ----------------------------------------
ASSISTANT_EMPTY = [{"role": "user", "content": "a"}, {"role": "assistant"}, {"role": "user", "content": "b"}]
TOOL_USE_NO_ID = [
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": [{"type": "tool_use", "name": "get_weather", "input": {}}]},
    {"role": "user", "content": "b"},
]
BIG_ARRAY = {"type": "array", "items": {"type": "integer"}, "minItems": 10**8}
OPENAI_400 = [  # (path, body, param, code)
    ("/v1/responses", {"input": "hi", "temperature": -5}, "temperature", None),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 10**12}, "max_output_tokens", "context_length_exceeded"),
    ("/v1/responses", {"input": "hi", "reasoning": {"effort": "ultra"}}, "reasoning.effort", None),
    ("/v1/responses", {"input": "hi", "tool_choice": "required"}, "tool_choice", None),
    ("/v1/chat/completions", {"messages": USER, "stream_options": {"include_usage": True}}, "stream_options", None),
    ("/v1/chat/completions", {"messages": ASSISTANT_EMPTY}, "messages[1].content", None),
    ("/v1/chat/completions", {"messages": USER, "stop": ["x"] * 17}, "stop", None),
    ("/v1/chat/completions",
     {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": BIG_ARRAY}}},
     "response_format.json_schema.schema.minItems", "invalid_schema"),
]  # fmt: skip
ANTHROPIC_400 = [  # (body, a word the message must name)
    ({"max_tokens": 2**70}, "max_tokens"),
    ({"max_tokens": None}, "max_tokens"),
    ({"thinking": {"type": "bogus"}}, "thinking.type"),
    ({"stop_sequences": ["s"] * 5000}, "stop_sequences"),
    ({"temperature": -1}, "temperature"),
    ({"messages": TOOL_USE_NO_ID}, "messages[1].content[0].id"),
    ({"tool_choice": {"type": "auto"}}, "tool_choice"),
    ({"messages": [*USER, {"role": "assistant", "content": []}, *USER]}, "messages[1].content"),
]


@pytest.mark.parametrize(("path", "body", "param", "code"), OPENAI_400)
def test_openai_protocols_refuse_out_of_range_fields(
    server: Server, path: str, body: dict, param: str, code: str | None
) -> None:
    r = httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 4, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err


@pytest.mark.parametrize(("body", "word"), ANTHROPIC_400)
def test_anthropic_refuses_out_of_range_fields(server: Server, body: dict, word: str) -> None:
    payload = {"model": "m", "messages": USER, "max_tokens": 4, **body}
    r = httpx.post(
        server.url + "/v1/messages", json={k: v for k, v in payload.items() if v is not None}, timeout=30
    )
    assert r.status_code == 400, r.text
    got = r.json()
    assert got["type"] == "error" and got["error"]["type"] == "invalid_request_error"
    assert word in got["error"]["message"], got


RANGE_ENDS = [  # (path, body): the documented ranges' ends, closed on both sides (docs/serving.md)
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "top_p": 0, "temperature": 2}),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "top_p": 0, "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "top_p": 0, "max_output_tokens": 4}),
    ("/v1/messages", {"model": "m", "messages": USER, "top_p": 0, "temperature": 0}),
]


@pytest.mark.parametrize(("path", "body"), RANGE_ENDS, ids=["chat", "chat-stream", "responses", "messages"])
def test_the_ends_of_the_sampling_ranges_are_accepted(server: Server, path: str, body: dict) -> None:
    """`top_p: 0` is inside the documented [0, 1] (OpenAI and Anthropic accept it; clients send it with a zero
    temperature for determinism): it keeps the most probable token only, it is not a 400."""
    r = httpx.post(server.url + path, json={"max_tokens": 4, **body}, timeout=120)
    assert r.status_code == 200, r.text


def test_count_tokens_needs_no_max_tokens_and_server_keeps_serving(server: Server) -> None:
    r = httpx.post(
        server.url + "/v1/messages/count_tokens", json={"model": "m", "messages": USER}, timeout=30
    )
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    r = httpx.post(
        server.url + "/v1/messages", json={"model": "m", "messages": USER, "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] >= 1


# ---- 5. fields a client relies on are refused by name, not dropped ---------------------------------------
@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "logprobs", True),
        ("/v1/chat/completions", "top_logprobs", 3),
        ("/v1/chat/completions", "guided_json", {"type": "object"}),
        ("/v1/chat/completions", "guided_choice", ["a", "b"]),
        ("/v1/responses", "top_logprobs", 2),
    ],
)
def test_unsupported_fields_are_refused_by_name(server: Server, path: str, field: str, value: object) -> None:
    body = {"model": MODEL, "messages": USER, "input": "hi", "max_tokens": 4, field: value}
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (field, "unsupported_field") and field in err["message"]
    off = httpx.post(
        server.url + path, json={**body, field: False if field == "logprobs" else None}, timeout=60
    )
    assert off.status_code == 200, off.text  # the value that asks for nothing is fine


class Verdict(pydantic.BaseModel):  # bounded fields only: a model with random weights must be able to stop
    ok: bool
    unit: Literal["c", "f"]
    level: Literal[1, 2, 3]


def test_anthropic_structured_output(server: Server) -> None:
    client = ant(server)
    msgs = [{"role": "user", "content": "Weather in Paris as JSON"}]
    fmt = {"type": "json_schema", "schema": WEATHER}
    for temp in (0.7, 1.0):
        r = client.messages.create(model="m", max_tokens=300, messages=msgs, extra_body={"temperature": temp},
                                   thinking={"type": "disabled"}, output_config={"format": fmt})  # fmt: skip
        assert r.stop_reason == "end_turn", r.content
        jsonschema.validate(json.loads(r.content[0].text), WEATHER)
    with client.messages.stream(model="m", max_tokens=300, messages=msgs, extra_body={"temperature": 1.0},
                                output_config={"format": fmt}, thinking={"type": "enabled", "budget_tokens": 8}) as st:  # fmt: skip
        final = st.get_final_message()
    assert final.content[0].type == "thinking"
    jsonschema.validate(json.loads(final.content[-1].text), WEATHER)  # the grammar starts after thinking
    parsed = client.messages.parse(model="m", max_tokens=300, messages=msgs, output_format=Verdict,
                                   thinking={"type": "disabled"})  # fmt: skip
    assert isinstance(parsed.parsed_output, Verdict)  # the SDK's own parse of the answer
    legacy = httpx.post(server.url + "/v1/messages", timeout=120, json={
        "model": "m", "max_tokens": 300, "messages": msgs, "thinking": {"type": "disabled"}, "output_format": fmt})  # fmt: skip
    jsonschema.validate(json.loads(legacy.json()["content"][0]["text"]), WEATHER)
    bad = httpx.post(server.url + "/v1/messages", timeout=30, json={
        "model": "m", "max_tokens": 8, "messages": msgs,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "if": {}}}}})  # fmt: skip
    assert bad.status_code == 400 and "'if'" in bad.json()["error"]["message"]


# ---- 6. JSON Schema pattern and format -----------------------------------------------------------------
PATTERNED = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"},
        "answer": {"type": "string", "pattern": r'^(yes|no|"maybe"|back\\slash)$'},  # JSON escapes needed
        "tab": {"type": "string", "pattern": r"^a\tb$"},
        "id": {"type": "string", "format": "uuid"},
    },
    "required": ["code", "answer", "tab", "id"],
    "additionalProperties": False,
}


def test_patterns_and_formats_hold_end_to_end(server: Server) -> None:
    def one(seed: int) -> None:
        body = {"model": MODEL, "messages": USER, "max_tokens": 200, "temperature": 1.0, "seed": seed,
                "enable_thinking": False,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PATTERNED}}}  # fmt: skip
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert c["finish_reason"] == "stop", c
        value = json.loads(c["message"]["content"])  # strict: the escapes are JSON
        jsonschema.validate(value, PATTERNED)  # every pattern matches (Python's re)
        assert value["tab"] == "a\tb" and str(uuid.UUID(value["id"])) == value["id"].lower()

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(one, range(3)))
    bad = {**PATTERNED, "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}}
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={"model": MODEL, "messages": USER,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": bad}}})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_schema_keyword"
    assert r.json()["error"]["param"] == "response_format.json_schema.schema.properties.x.pattern"


# ---- 7. the OpenAPI document ----------------------------------------------------------------------------
def test_openapi_document_describes_the_real_models(server: Server) -> None:
    r = httpx.get(server.url + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] == "ninfer"
    assert set(doc["paths"]) >= {"/health", "/v1/models", "/metrics", "/v1/chat/completions", "/v1/messages",
                                 "/v1/messages/count_tokens", "/v1/responses"}  # fmt: skip
    schemas = doc["components"]["schemas"]

    def model(path: str, where: str) -> dict:
        op = doc["paths"][path]["post"]
        node = op["requestBody"] if where == "request" else op["responses"]["200"]
        return schemas[node["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]]

    for path, request, response in (
        ("/v1/chat/completions", ChatRequest, ChatCompletion),
        ("/v1/messages", AnthropicRequest, Message),
        ("/v1/responses", ResponsesRequest, Response),
    ):
        for where, struct in (("request", request), ("response", response)):
            tag = struct.__struct_config__.tag_field  # a tagged Struct's type field
            fields = {f.encode_name for f in msgspec.structs.fields(struct)} | ({tag} if tag else set())
            assert set(model(path, where)["properties"]) == fields, (path, where)
        assert "text/event-stream" in doc["paths"][path]["post"]["responses"]["200"]["content"]
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', r.text))
    assert refs <= set(schemas)  # every reference resolves
