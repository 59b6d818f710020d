"""Unit tests of the API's pure parts: keys, config, request validation, SSE framing, metrics, request log."""

from __future__ import annotations

import json
import time

import msgspec
import pytest
from conftest import finish_event
from ninfer.api.auth import KeyFileError, extract_key, parse_keys, presented_keys
from ninfer.api.config import ServerConfig, ServerConfigError
from ninfer.api.errors import ApiError
from ninfer.api.metrics import Histogram, Metrics
from ninfer.api.openai_chat import ChatLimits, parse_chat_request, to_generate_request
from ninfer.api.openai_chat_output import ChatStream
from ninfer.api.reqlog import RequestLog, RequestLogError

from ninfer.cuda.options import CUDA_OPTIONS, CudaOption
from ninfer.cuda.options import DEFAULTS as CUDA_DEFAULTS

LIMITS = ChatLimits(model_id="m", max_context=64, default_max_tokens=16)


def body(**kw: object) -> bytes:
    base: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    base.update(kw)
    return json.dumps(base).encode()


# ---- keys -----------------------------------------------------------------------------------------------
def test_key_file_names_and_constant_time_check() -> None:
    ring = parse_keys("# comment\nalice:sk-a\n\nsk-b\nbob:sk:with:colons\n")
    assert len(ring) == 3
    assert ring.check("sk-a") == (True, "alice")
    assert ring.check("sk-b") == (True, "")
    assert ring.check("sk:with:colons") == (True, "bob")
    assert ring.check("sk-c") == (False, "")
    assert ring.check(None) == (False, "")
    assert "sk-a" not in repr(ring)
    with pytest.raises(KeyFileError, match="no keys"):
        parse_keys("# nothing\n")


def test_extract_key_bearer_then_x_api_key() -> None:
    assert extract_key({"authorization": "Bearer k1", "x-api-key": "k2"}) == "k1"
    assert extract_key({"authorization": "Basic zzz", "x-api-key": "k2"}) == "k2"
    assert extract_key({}) is None


def test_a_valid_key_in_either_header_identifies_the_client() -> None:
    """Upstream passes a request when either header holds the key: a wrong bearer token beside the right
    x-api-key (a gateway's own token) must not refuse it."""
    ring = parse_keys("alice:sk-a\n")
    both = {"authorization": "Bearer wrong", "x-api-key": "sk-a"}
    assert presented_keys(both) == ["wrong", "sk-a"]
    assert ring.identify_any(presented_keys(both)) == "alice"
    assert ring.identify_any(presented_keys({"authorization": "Bearer sk-a", "x-api-key": "x"})) == "alice"
    assert ring.identify_any(presented_keys({"authorization": "Basic sk-a", "x-api-key": " "})) is None
    assert ring.identify_any([]) is None


# ---- config ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"max_concurrency": 9}, "--max-concurrency"),
        ({"port": 0}, "--port"),
        ({"kv_dtype": "int4"}, "--kv-dtype"),
        ({"max_context": -1}, "--max-context"),
        ({"backend": "tpu"}, "--backend"),
        ({"queue_depth": -1}, "--queue-depth"),
        ({"max_context": 65536}, "--kv-capacity"),  # the engine's own cross-check, named by its flag
    ],
)
def test_server_config_names_the_flag(kw: dict[str, object], flag: str) -> None:
    """Engine flags are checked by EngineConfig (the one source of engine settings), errors named by flag."""
    from ninfer.api.config import engine_config

    engine = {
        k: kw.pop(k) for k in list(kw) if k in ("max_concurrency", "kv_dtype", "max_context", "queue_depth")
    }
    with pytest.raises(ServerConfigError, match=flag):
        ServerConfig(artifact="a.ninfer", engine=engine_config(**engine), **kw)  # type: ignore[arg-type]
    cfg = ServerConfig(artifact="a.ninfer")
    assert (cfg.host, cfg.port, cfg.max_request_bytes) == ("127.0.0.1", 8010, 384 << 20)
    assert (cfg.engine.queue_depth, cfg.engine.max_concurrency) == (
        16,
        4,
    )  # the server's queue, the engine's lanes


# ---- request validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "status", "param", "code"),
    [
        (b"{not json", 400, None, None),
        (b"", 400, None, None),
        (b'{"messages": []}', 400, "model", None),
        (body(messages=[{"content": "x"}]), 400, "messages[0].role", None),
        (body(model="other"), 404, "model", "model_not_found"),
        (body(messages=[]), 400, "messages", None),
        (body(messages="hi"), 400, "messages", None),
        (body(max_tokens="ten"), 400, "max_tokens", None),
        (body(max_tokens=0), 400, "max_tokens", None),
        (body(max_tokens=65), 400, "max_tokens", "context_length_exceeded"),
        (
            body(max_completion_tokens=100, max_tokens=5),
            400,
            "max_completion_tokens",
            "context_length_exceeded",
        ),
        (body(temperature=2.5), 400, "temperature", None),
        (body(temperature=-0.5), 400, "temperature", None),
        (body(top_k=-1), 400, "top_k", None),
        (body(top_p=-0.1), 400, "top_p", None),
        (body(seed=-1), 400, "seed", None),
        (body(seed=2**64), 400, "seed", None),
        (body(n=2), 400, "n", "n_not_supported"),
        (body(stream="yes"), 400, "stream", None),
        (
            body(response_format={"type": "xml"}),
            400,
            "response_format.type",
            "response_format_not_supported",
        ),
        (body(tools=[{"type": "custom", "name": "f"}]), 400, "tools[0].type", "tool_type_not_supported"),
        (body(messages=[{"role": "function", "content": "x"}]), 400, "messages[0].role", "unsupported_role"),
        (body(messages=[{"role": "user", "content": []}]), 400, "messages[0].content", None),
        (
            body(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
            400,
            "messages[0].content[0].type",
            "modality_not_supported",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": "http://x"}]}]),
            400,
            "messages[0].content[0]",
            "vision_disabled",
        ),
        (body(messages=[{"role": "tool", "content": "r"}]), 400, "messages[0].tool_call_id", None),
        (
            body(messages=[{"role": "user", "content": "a", "tool_call_id": "c"}]),
            400,
            "messages[0].tool_call_id",
            None,
        ),
        (body(messages=[{"role": "user"}]), 400, "messages[0].content", None),
        (body(stop=["a", 3]), 400, "stop[1]", None),
    ],
)
def test_bad_requests_name_the_field(raw: bytes, status: int, param: str | None, code: str | None) -> None:
    with pytest.raises(ApiError) as ei:
        parse_chat_request(raw, LIMITS)
    err = ei.value
    assert (err.status, err.code) == (status, code)
    if param is not None:
        assert err.param == param, err.message
        assert param.split("[")[0].split(".")[0] in err.message
    shape = msgspec.json.decode(msgspec.json.encode(err.body()))
    assert set(shape["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("extra", "field"), [({"temperature": -0.5}, "temperature"), ({"top_k": -1}, "top_k")]
)
def test_negative_sampling_values_are_anthropic_400s(extra: dict[str, float], field: str) -> None:
    """/v1/messages refuses a negative temperature or top_k with a 400 in Anthropic's error shape."""
    from ninfer.api import anthropic as am

    raw = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(am.AnthropicError) as ei:
        am.parse_messages_request(json.dumps(raw).encode(), 64)
    assert ei.value.status == 400 and field in ei.value.message
    shape = msgspec.json.decode(msgspec.json.encode(ei.value.body()))
    assert shape["type"] == "error" and set(shape["error"]) == {"type", "message"}
    assert shape["error"]["type"] == "invalid_request_error"


def test_translation_to_the_engine_request() -> None:
    raw = body(
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "q"},
        ],
        max_tokens=5,
        stop=["", "x"],
        seed=7,
        enable_thinking=False,
        store=True,  # unknown / ignored fields are dropped
        logprobs=False,  # a refused field (logprobs: true is a 400) that asks for nothing is accepted
    )
    req = parse_chat_request(raw, LIMITS)
    g = to_generate_request(req, LIMITS, "rid", "client", {"preserve_thinking": True})
    assert g.messages == ({"role": "system", "content": "a\nb"}, {"role": "user", "content": "q"})
    assert g.sampling.max_tokens == 5 and g.sampling.stop == ("x",) and g.sampling.seed == 7
    assert g.template_kwargs == {"preserve_thinking": True, "enable_thinking": False}
    g2 = to_generate_request(parse_chat_request(body(), LIMITS), LIMITS, "r2", "c", {})
    assert g2.sampling.max_tokens == 16  # the server default


def test_engine_requests_cross_ray_as_msgpack_unchanged() -> None:
    """What the API builds (tools, tool history, a grammar, template variables) survives ``open``'s msgpack
    encoding exactly: the actor renders the same prompt as from the Struct itself."""
    from ninfer.actors.messages import decode_requests, encode_requests
    from ninfer.api import anthropic as am

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, 2.5, null]}'}}
    raw = body(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        tools=[tool],
        tool_choice="required",
        temperature=0.5,
        stop="x",
        chat_template_kwargs={"deep": {"list": [1, {"k": True}], "f": 1.25}},
    )
    chat = to_generate_request(
        parse_chat_request(raw, LIMITS), LIMITS, "rid", "client", {"enable_thinking": False}
    )
    anth = am.parse_messages_request(
        json.dumps(
            {"model": "m", "max_tokens": 8, "system": "s", "messages": [{"role": "user", "content": "hi"}]}
        ),
        64,
        require_max_tokens=True,
    )
    anthropic = am.to_generate_request(anth, "rid2", "client", {}, 16)
    reqs = [chat, anthropic]
    wire = encode_requests(reqs)
    assert isinstance(wire, bytes) and decode_requests(wire) == reqs
    assert chat.grammar is not None and chat.tools and chat.messages and len(chat.messages) == 3


# ---- SSE framing ----------------------------------------------------------------------------------------
FIN = finish_event("output_limit", 10, 4, 3)


def frames(raw: bytes) -> list[object]:
    parts = raw.decode().split("\n\n")
    assert parts[-1] == ""
    out = []
    for p in parts[:-1]:
        assert p.startswith("data: ") and "\n" not in p
        out.append("[DONE]" if p == "data: [DONE]" else json.loads(p[6:]))
    return out


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("include_usage", [False, True])
def test_chunk_order(include_usage: bool, cached: bool) -> None:
    """``cached`` (--prompt-tokens-details) adds the prefix-cache hits to the usage; without it the usage holds
    only what the request and its output determine (upstream's contract compares it across two requests)."""
    cs = ChatStream("chatcmpl-1", 1, "m", include_usage, cached=cached)
    got = frames(cs.role() + cs.content("he") + cs.content("llo") + cs.finish(FIN))
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in got[1:3]] == ["he", "llo"]
    assert got[3]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}
    for c in got[:4]:
        assert c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-1"
        assert ("usage" in c) is include_usage and c.get("usage") is None
    if include_usage:
        assert got[4]["choices"] == []
        details = {"prompt_tokens_details": {"cached_tokens": 4}} if cached else {}
        assert got[4]["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, **details}
    assert got[-1] == "[DONE]" and len(got) == (6 if include_usage else 5)


@pytest.mark.parametrize("model", ["m", 'q"\\\u2028', "x\x00ninfer-text\x00y"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_text_frames_are_the_chunks_bytes(model: str, include_usage: bool) -> None:
    """A content or reasoning frame, written between pre-encoded bytes, is byte for byte the chunk Struct's
    encoding, whatever the text (escapes, control characters, non-ASCII) or the model name."""
    from ninfer.api.openai_chat_models import ChatCompletionChunk, ChunkChoice, ChunkDelta

    cs = ChatStream("chatcmpl-1", 1796000000, model, include_usage)
    enc = msgspec.json.Encoder()
    for text in [
        "he",
        "",
        'a "quote" \\ \n\t\x01',
        "\u00e9\u4e2d\U0001f600",
        "</think>",
        "\x00ninfer-text\x00",
    ]:
        for kind, delta in (
            ("text", ChunkDelta(content=text)),
            ("reasoning", ChunkDelta(reasoning_content=text)),
        ):
            chunk = ChatCompletionChunk(
                id="chatcmpl-1",
                created=1796000000,
                model=model,
                choices=[ChunkChoice(index=0, delta=delta)],
                usage=None if include_usage else msgspec.UNSET,
            )
            assert cs._text(kind, text) == b"data: " + enc.encode(chunk) + b"\n\n"


def test_error_frame_has_no_done() -> None:
    cs = ChatStream("c", 1, "m", False)
    got = frames(cs.error(ApiError(500, "boom", code="engine_error")))
    assert got == [
        {"error": {"message": "boom", "type": "internal_error", "param": None, "code": "engine_error"}}
    ]


# ---- metrics --------------------------------------------------------------------------------------------
def test_histogram_is_cumulative_and_text_parses() -> None:
    h = Histogram([0.1, 1.0])
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v)
    assert h.lines("x")[:3] == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1"} 3', 'x_bucket{le="+Inf"} 4']
    m = Metrics()
    m.count_request("chat_completions", "stop_token")
    m.observe_done(latency_s=0.2, ttft_s=0.05, prompt=10, cached=4, completion=3)
    text = m.render(
        {"lanes_busy": 1, "lanes_total": 4, "queue_len": 0}, {"checkpoint_bytes": 128, "prefix_hit_tokens": 4}
    )
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            names.add(line.split()[2])
        elif not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            float(value)
    for want in (
        "ninfer_request_duration_seconds",
        "ninfer_time_to_first_token_seconds",
        "ninfer_lanes_busy",
        "ninfer_checkpoint_bytes",
        "ninfer_prefix_hit_tokens_total",
        "ninfer_completion_tokens_total",
    ):
        assert want in names
    assert 'ninfer_requests_total{endpoint="chat_completions",outcome="stop_token"} 1' in text
    assert "ninfer_engine_up 0" in m.render(None, None)


# ---- request log ----------------------------------------------------------------------------------------
def test_request_log_lines_and_refusals(tmp_path) -> None:
    art = tmp_path / "a.ninfer"
    art.write_bytes(b"x")
    with pytest.raises(RequestLogError, match="artifact"):
        RequestLog(art, artifact=str(art))
    with pytest.raises(RequestLogError, match="does not exist"):
        RequestLog(tmp_path / "missing" / "log.jsonl")
    log = RequestLog(tmp_path / "log.jsonl", artifact=str(art))
    ids = [log.next_request_id() for _ in range(3)]
    assert ids == [1, 2, 3]
    for i in ids:
        log.write("request_start", request={"request_id": i})
    t0 = time.perf_counter()
    log.close()
    assert time.perf_counter() - t0 < 2
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["request"]["request_id"] for r in lines] == ids
    for r in lines:
        assert r["artifact_type"] == "ninfer_serve_request_log" and r["schema_version"] == 2
        assert r["server_instance_id"].startswith("serve-")


def test_no_cuda_graph_is_a_backend_option_not_an_engine_option() -> None:
    from ninfer.api.server import actor_spec

    from ninfer.engine import EngineConfig

    cfg = ServerConfig(artifact="a.ninfer", cuda_graph=False)
    spec = actor_spec(cfg, "cuda")
    assert spec.backend_options == {
        "cuda_graph": False,
        "act_dtype": "fp32",
        "prefill_inputs": "fp16",
        "prefill_attention": "bf16",
        "prefill_gdn": "exact",
        "prefill_weights": "auto",
    }
    assert isinstance(spec.engine, EngineConfig) and spec.engine is cfg.engine  # carried typed, as it is
    assert actor_spec(cfg, "reference").backend_options == {}


@pytest.mark.parametrize("opt", CUDA_OPTIONS, ids=lambda o: o.name)
def test_cuda_option_flags_reach_the_cuda_backend(opt: CudaOption) -> None:
    """Every choice of ``ninfer serve``'s CUDA options (--activations, --prefill-*) reaches CudaQwen36's keyword; the
    default is the table's; a value outside the choices is a ServerConfigError naming the flag."""
    from ninfer.api.cli import config_from_args
    from ninfer.api.server import actor_spec

    from ninfer.cli import _parser

    for v in opt.choices:
        a = _parser().parse_args(["serve", "a.ninfer", opt.flag, v])
        assert actor_spec(config_from_args(a), "cuda").backend_options[opt.keyword] == v
    assert getattr(_parser().parse_args(["serve", "a.ninfer"]), opt.name) == opt.default
    with pytest.raises(ServerConfigError, match=opt.flag):
        ServerConfig(artifact="a.ninfer", **{opt.name: "fp8-e5m2"})


def test_cuda_options_are_the_backends() -> None:
    """The table's choices are the kernel families' own, its defaults CudaQwen36's, and ninfer-perf takes the same
    flags with the same defaults (it measures the served configuration)."""
    import inspect

    from ninfer.perf.cli import _parser as perf_parser

    from ninfer.cuda.attention_prefill import PRECISIONS
    from ninfer.cuda.gdn import PREFILL_GDN
    from ninfer.cuda.gemm import GEMM_INPUTS
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.operands import PREFILL_WEIGHTS

    choices = {o.name: set(o.choices) for o in CUDA_OPTIONS}
    assert choices == {
        "activations": {"fp32", "bf16"},
        "prefill_inputs": set(GEMM_INPUTS),
        "prefill_attention": set(PRECISIONS),
        "prefill_gdn": set(PREFILL_GDN),
        "prefill_weights": set(PREFILL_WEIGHTS),
    }
    params = inspect.signature(CudaQwen36).parameters
    assert {o.keyword: params[o.keyword].default for o in CUDA_OPTIONS} == {
        o.keyword: o.default for o in CUDA_OPTIONS
    }
    perf = perf_parser().parse_args([])
    assert {o.name: getattr(perf, o.name) for o in CUDA_OPTIONS} == dict(CUDA_DEFAULTS)


# ---- OpenAPI document behind the key ---------------------------------------------------------------------
def test_openapi_document_is_behind_the_api_key() -> None:
    import asyncio

    import httpx
    from ninfer.api.app import build_app
    from ninfer.api.service import Service

    svc = Service(config=ServerConfig(artifact="a.ninfer"), backend=None, limits=LIMITS)  # type: ignore[arg-type]
    gate = build_app(svc, parse_keys("alice:sk-a\n"))

    async def get(path: str, headers: dict[str, str]) -> httpx.Response:
        transport = httpx.ASGITransport(app=gate)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path, headers=headers)

    assert asyncio.run(get("/openapi.json", {})).status_code == 401
    assert asyncio.run(get("/openapi.json", {"x-api-key": "sk-b"})).status_code == 401
    r = asyncio.run(get("/openapi.json", {"Authorization": "Bearer sk-a"}))
    assert r.status_code == 200 and "/v1/chat/completions" in r.json()["paths"]
    assert asyncio.run(get("/openapi.json/x", {})).status_code == 401


# ---- hostile-client audit (tests/test_hostile_live.py has the live side) ------------------------------------
def test_tool_message_text_parts_join_like_other_roles() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": parts}]  # fmt: skip
    req = parse_chat_request(body(messages=msgs), LIMITS)
    greq = to_generate_request(req, LIMITS, "r", "c", {})
    assert greq.messages[2] == {"role": "tool", "content": "a\nb", "tool_call_id": "c1"}
    with pytest.raises(ApiError) as ei:  # still only text
        parse_chat_request(
            body(messages=[*msgs[:2], {**msgs[2], "content": [{"type": "input_audio"}]}]), LIMITS
        )
    assert ei.value.code == "modality_not_supported"


@pytest.mark.parametrize(
    ("field", "value"),
    [("previous_response_id", "x"), ("conversation", "x"), ("prompt", {"id": "p"}), ("background", True)],
)
def test_responses_refuses_stored_state(field: str, value: object) -> None:
    from ninfer.api.responses import parse_responses_request

    raw = json.dumps({"model": "m", "input": "hi", field: value}).encode()
    with pytest.raises(ApiError) as ei:
        parse_responses_request(raw, "m", 64)
    assert ei.value.status == 400 and ei.value.param == field
    ok = {"model": "m", "input": "hi", "background": False, "store": True, "previous_response_id": None}
    assert parse_responses_request(json.dumps(ok).encode(), "m", 64).store is True


def test_early_answers_take_the_shape_of_the_request_lines_path() -> None:
    from ninfer.api.http_guard import error_response, request_path

    assert request_path(b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: x") == "/v1/messages"
    assert request_path(b"POST /v1/messages HTTP/1.1") is None  # the line is not complete yet
    assert request_path(b"\x16\x03\x01 TLS hello\r\n") is None and request_path(b"GET * HTTP/1.1\r\n") is None
    for path, status, shape in (("/v1/messages/count_tokens", 529, "overloaded_error"), ("/v1/responses", 503, None),
                                (None, 503, None)):  # fmt: skip
        raw = error_response(path, 503, "too many open connections", "server_busy", 1.0)
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0].startswith(f"HTTP/1.1 {status} ") and "retry-after: 1" in lines
        assert "connection: close" in lines and f"content-length: {len(body)}" in lines
        err = json.loads(body)["error"]
        assert err["type"] == shape if shape else err["code"] == "server_busy"
    raw = error_response("/v1/messages", 408, "slow", "request_timeout")
    assert raw.lower().count(b"connection: close") == 1


def test_xgrammar_log_prefix_is_not_sent_to_clients() -> None:
    from ninfer.actors._engine_adapter import _client_text

    raw = "schema: [22:22:19] /project/cpp/json_schema_converter.cc:3562: Circular $ref chain: #/$defs/n\nmore\n"
    assert _client_text(raw) == "schema: Circular $ref chain: #/$defs/n"
    assert _client_text("schema: type: must be a string") == "schema: type: must be a string"
