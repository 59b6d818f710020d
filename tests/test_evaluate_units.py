"""Corpus-runner parts without a server: SSE folding per protocol (httpx MockTransport), checks, fixture loading,
request-log reading and the report's verdict."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from ninfer.evaluate.checks import check_supported, evaluate
from ninfer.evaluate.fixtures import Check, FixtureError, load_corpus
from ninfer.evaluate.report import build_report
from ninfer.evaluate.runner import Record, RunOptions
from ninfer.evaluate.serverlog import join_record, read_log, wait_for
from ninfer.evaluate.stream import Outcome, ToolCall, stream_request


def _sse(events: list[tuple[str | None, object]]) -> bytes:
    out = b": keep-alive comment\n\n"
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out += (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()
    return out


def _run(protocol: str, payload: bytes, status: int = 200) -> Outcome:
    seen: list[dict] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(status, content=payload, headers={"content-type": "text/event-stream"})

    async def go() -> Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await stream_request(c, "http://x", protocol, {"messages": []}, {})

    out = asyncio.run(go())
    assert seen[0]["stream"] is True
    if protocol == "openai_chat":
        assert seen[0]["stream_options"] == {"include_usage": True}
    return out


def _chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> dict:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish
            else [], "usage": usage}  # fmt: skip


def test_chat_stream_folds_reasoning_text_calls_and_usage() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 4},
             "completion_tokens_details": {"reasoning_tokens": 2, "accepted_draft_tokens": 3}}  # fmt: skip
    events = [(None, _chunk({"role": "assistant", "content": ""})), (None, _chunk({"reasoning_content": "hm"})),
              (None, _chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]})),
              (None, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]})),
              (None, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})),
              (None, _chunk({}, "tool_calls")), (None, _chunk({}, usage=usage)), (None, "[DONE]")]  # fmt: skip
    o = _run("openai_chat", _sse(events))
    assert o.error is None and o.response_id == "chatcmpl-1" and o.finish_reason == "tool_calls"
    assert o.reasoning == "hm" and o.text == "" and o.tool_calls == [ToolCall("f", '{"a":1}')]
    assert (o.prompt_tokens, o.cached_tokens, o.completion_tokens, o.reasoning_tokens) == (10, 4, 7, 2)
    assert o.speculative == {"completion_tokens_details.accepted_draft_tokens": 3}
    assert o.t_first is not None and o.t_done >= o.t_first  # the empty role chunk is not output


def test_messages_stream_folds_blocks() -> None:
    ev = [("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 9}}}),
          ("content_block_start", {"type": "content_block_start", "content_block": {"type": "thinking"}}),
          ("content_block_delta", {"type": "content_block_delta", "delta": {"thinking": "t"}}),
          ("content_block_start", {"type": "content_block_start", "content_block": {"type": "text"}}),
          ("content_block_delta", {"type": "content_block_delta", "delta": {"text": "hi"}}),
          ("content_block_start", {"type": "content_block_start", "content_block": {"type": "tool_use", "name": "g"}}),
          ("content_block_delta", {"type": "content_block_delta", "delta": {"partial_json": "{}"}}),
          ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                             "usage": {"output_tokens": 5}}),
          ("message_stop", {"type": "message_stop"})]  # fmt: skip
    o = _run("anthropic_messages", _sse(ev))
    assert (o.response_id, o.reasoning, o.text, o.finish_reason) == ("msg_1", "t", "hi", "tool_use")
    assert o.tool_calls == [ToolCall("g", "{}")]
    assert (o.prompt_tokens, o.cached_tokens, o.completion_tokens) == (9, None, 5)


def test_responses_stream_takes_the_final_response() -> None:
    final = {"id": "resp_1", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
             "output": [{"type": "reasoning", "content": [{"text": "r"}]},
                        {"type": "message", "content": [{"type": "output_text", "text": "{}"}]},
                        {"type": "function_call", "name": "h", "arguments": "{\"x\":2}"}],
             "usage": {"input_tokens": 3, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 1}}}  # fmt: skip
    ev = [("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
          ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "{}"}),
          ("response.incomplete", {"type": "response.incomplete", "response": final})]  # fmt: skip
    o = _run("openai_responses", _sse(ev))
    assert (o.response_id, o.reasoning, o.text) == ("resp_1", "r", "{}")
    assert o.finish_reason == "incomplete:max_output_tokens" and o.tool_calls == [ToolCall("h", '{"x":2}')]
    assert (o.prompt_tokens, o.cached_tokens, o.completion_tokens) == (3, 1, 4) and o.t_first is not None


def test_http_errors_and_stream_errors_become_outcome_errors() -> None:
    o = _run("openai_chat", b'{"error": {"message": "max_tokens: bad"}}', status=400)
    assert o.http_status == 400 and "max_tokens: bad" in o.error
    o = _run("openai_chat", _sse([(None, {"error": {"message": "engine failed"}})]))
    assert o.error == "engine failed"
    o = _run("openai_chat", b"data: {not json\n\n")
    assert o.error.startswith("JSONDecodeError")


CHAT_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"]}}}]  # fmt: skip
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("check", "body", "out", "why"),
    [
        (Check(kind="valid_json"), {}, Outcome(text='{"a": 1}'), None),
        (Check(kind="valid_json"), {}, Outcome(text='{"a": '), "not JSON"),
        (Check(kind="json_schema"), {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
         Outcome(text='{"a": 1}'), "schema"),
        (Check(kind="json_schema", schema=SCHEMA), {}, Outcome(text='{"a": "x"}'), None),
        (Check(kind="tool_called"), {"tools": CHAT_TOOLS}, Outcome(tool_calls=[ToolCall("f", '{"n": 3}')]), None),
        (Check(kind="tool_called"), {"tools": CHAT_TOOLS}, Outcome(), "no tool call"),
        (Check(kind="tool_called"), {"tools": CHAT_TOOLS}, Outcome(tool_calls=[ToolCall("f", '{"n": 9}')]), "schema"),
        (Check(kind="tool_called"), {"tools": CHAT_TOOLS}, Outcome(tool_calls=[ToolCall("z", "{}")]), "undeclared"),
        (Check(kind="tool_called"), {"tools": CHAT_TOOLS}, Outcome(tool_calls=[ToolCall("f", "[1]")]), "not an object"),
        (Check(kind="tool_called", name="f"), {"tools": CHAT_TOOLS + [{"type": "function", "function": {"name": "g"}}]},
         Outcome(tool_calls=[ToolCall("g", "{}")]), "expected 'f'"),
        (Check(kind="stop_respected"), {"stop": "END"}, Outcome(text="a END b"), "stop string"),
        (Check(kind="stop_respected"), {"stop": ["END"]}, Outcome(text="a b"), None),
        (Check(kind="reasoning"), {}, Outcome(reasoning=" "), "no reasoning"),
        (Check(kind="reasoning"), {}, Outcome(reasoning="because"), None),
    ],
)  # fmt: skip
def test_checks(check: Check, body: dict, out: Outcome, why: str | None) -> None:
    assert check_supported(check, "openai_chat", body) is None
    (res,) = evaluate((check,), "openai_chat", body, out)
    assert res.passed is (why is None) and (why or "ok") in res.detail, res
    (failed,) = evaluate((check,), "openai_chat", body, Outcome(error="boom"))
    assert not failed.passed and failed.detail == "request failed"


def test_check_support_per_protocol() -> None:
    ant = {"tools": [{"name": "t", "input_schema": {}}], "stop_sequences": ["x"],
           "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}  # fmt: skip
    for kind in ("tool_called", "stop_respected", "json_schema"):
        assert check_supported(Check(kind=kind), "anthropic_messages", ant) is None
    resp = {
        "tools": [{"type": "function", "name": "t"}],
        "text": {"format": {"type": "json_schema", "schema": {}}},
    }
    assert check_supported(Check(kind="tool_called", name="t"), "openai_responses", resp) is None
    assert "no stop strings" in check_supported(Check(kind="stop_respected"), "openai_responses", resp)
    assert "no schema" in check_supported(Check(kind="json_schema"), "openai_chat", {})
    assert "no tool named" in check_supported(Check(kind="tool_called", name="q"), "openai_responses", resp)


def _write(p: Path, obj: object) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj))


def test_load_corpus_orders_sessions_and_turns(tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]}
    for name in ("s/02.json", "s/01.json", "a.json"):
        _write(tmp_path / name, {"protocol": "openai_chat", "body": body})
    (tmp_path / "README.md").write_text("ignored")
    sessions = load_corpus(tmp_path)
    assert [(s.name, [(f.name, f.turn) for f in s.turns]) for s in sessions] == [
        ("a", [("a", 1)]), ("s", [("s/01", 1), ("s/02", 2)])]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "msg"),
    [
        ({"protocol": "grpc", "body": {}}, "protocol"),
        ({"protocol": "openai_chat", "body": {}, "extra": 1}, "extra"),
        ({"protocol": "openai_chat", "body": {"stream": False}}, "always streams"),
        ({"protocol": "openai_chat", "body": {}, "checks": [{"kind": "vibes"}]}, "kind"),
        ({"protocol": "openai_chat", "body": {}, "checks": [{"kind": "stop_respected"}]}, "no stop strings"),
    ],
)
def test_load_corpus_refuses_bad_fixtures(tmp_path: Path, obj: dict, msg: str) -> None:
    _write(tmp_path / "f.json", obj)
    with pytest.raises(FixtureError, match=msg):
        load_corpus(tmp_path)


def test_load_corpus_refuses_empty_dirs(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match="no fixtures"):
        load_corpus(tmp_path)
    (tmp_path / "s").mkdir()
    with pytest.raises(FixtureError, match="without"):
        load_corpus(tmp_path)


def _log_line(event: str, rid: str, n: int, **extra: object) -> str:
    rec = {"event": event, "server_instance_id": "serve-1", "request": {"request_id": n, "engine_request_id": rid},
           **extra}  # fmt: skip
    return json.dumps(rec) + "\n"


def test_request_log_reading(tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    done = {"result": {"prompt_tokens": 5, "cached_tokens": 2, "completion_tokens": 3, "finish_reason": "stop_token"},
            "timings_seconds": {"queue": 0.1, "prefill": 0.2, "ttft": 0.4}}  # fmt: skip
    log.write_text(json.dumps({"event": "server_start", "server_instance_id": "serve-1"}) + "\n"
                   + _log_line("request_start", "a", 1) + _log_line("request_done", "a", 1, **done)
                   + _log_line("request_error", "b", 2, error={"message": "gone"}) + '{"event": "request_do')  # fmt: skip
    finals, starts = read_log(log)
    assert set(finals) == {"a", "b"} and len(starts) == 1
    j = join_record(finals["a"])
    assert (j.request_id, j.prompt_tokens, j.cached_tokens, j.finish_reason, j.server_ttft_s) == (
        1, 5, 2, "stop_token", 0.4)  # fmt: skip
    assert join_record(finals["b"]).error == "gone"
    finals, _ = wait_for(log, {"a", "c"}, timeout_s=0.3)  # "c" never comes: returns what there is
    assert "c" not in finals


def _record(name: str, out: Outcome, passed: bool = True) -> Record:
    from ninfer.evaluate.checks import CheckResult

    return Record(fixture=name, session=name, turn=1, repeat=0, protocol="openai_chat", outcome=out,
                  checks=[CheckResult(kind="valid_json", passed=passed, detail="ok")], ttft_s=0.1,
                  decode_tok_s=10.0)  # fmt: skip


def test_report_verdicts() -> None:
    out = Outcome(
        response_id="x", prompt_tokens=4, cached_tokens=0, completion_tokens=2, finish_reason="stop"
    )
    opts = RunOptions(url="http://x", fixtures="fx")
    rep = build_report(opts, [_record("a", out)], [], started_unix=0)
    assert (
        rep.ok
        and "no request log joined" in rep.markdown
        and "| a | openai_chat | 0 | 100.0 | 10.0 |" in rep.markdown
    )
    assert not build_report(opts, [_record("a", out, passed=False)], [], started_unix=0).ok
    joined = RunOptions(url="http://x", fixtures="fx", request_log="r.jsonl")
    rep = build_report(joined, [_record("a", out)], [], started_unix=0)  # never found in the log
    assert not rep.ok and "0/1 found in the request log" in rep.markdown and "missing" in rep.markdown


@pytest.mark.parametrize(("field", "value"), [("concurrency", 0), ("repeat", 0), ("timeout_s", 0.0)])
def test_run_options_are_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        RunOptions(url="u", fixtures="f", **{field: value})


def test_the_api_key_is_sent_but_never_reported() -> None:
    from ninfer.evaluate.runner import _headers

    opts = RunOptions(url="http://x", fixtures="fx", api_key="sk-secret-123")
    assert _headers(opts.api_key)["Authorization"] == "Bearer sk-secret-123"
    rep = build_report(opts, [_record("a", Outcome())], [], started_unix=0)
    assert "sk-secret" not in json.dumps(rep.data) + rep.markdown + repr(opts)
