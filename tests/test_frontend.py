"""Frontend: chat-template parity with transformers, template errors, tokenizer facts, incremental detok."""

from __future__ import annotations

import copy
import json
import random

import msgspec
import pytest
import tokenizers

from ninfer.frontend import (
    ChatTemplate,
    IncrementalDetokenizer,
    TemplateError,
    Tokenizer,
    TokenizerError,
    parse_tool_call_arguments,
)
from ninfer.frontend.demo_tokenizer import load_demo_chat_template, load_demo_corpus, train_demo_tokenizer

transformers = pytest.importorskip("transformers")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city — «today».",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEARCH = {
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object", "properties": {}}},
}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
RICH_CALL = {
    "function": {
        "name": "search",
        "arguments": {
            "q": "naïve <b> & 中文",
            "n": 3,
            "exact": False,
            "tags": ["a", "b"],
            "opts": {"x": 1.5},
            "z": None,
        },
    }
}

# (messages, tools) pairs covering the template's branches.
CONVERSATIONS = [
    ([{"role": "user", "content": "Hello"}], None),
    ([{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "  Hi there  "}], None),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet them"},
            {"role": "user", "content": "How are you? 🙂"},
            {"role": "assistant", "content": "<think>\nfine\n</think>\n\nFine, thanks."},
            {"role": "user", "content": "Great"},
        ],
        None,
    ),
    (
        [
            {"role": "system", "content": "You use tools."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "reasoning_content": "need the tool", "tool_calls": [CALL]},
            {"role": "tool", "content": '{"temp": 3}'},
            {"role": "assistant", "content": "It is 3 degrees.", "reasoning_content": "  got it  "},
        ],
        [WEATHER, SEARCH],
    ),
    (
        [
            {"role": "user", "content": "Two lookups please"},
            {"role": "assistant", "content": "Sure.", "tool_calls": [CALL, RICH_CALL]},
            {"role": "tool", "content": "result one"},
            {"role": "tool", "content": "result two"},
        ],
        [WEATHER],
    ),
    (
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}],
            },
            {"role": "assistant", "content": None, "thinking": "aliased reasoning", "tool_calls": [CALL]},
            {"role": "user", "content": "<tool_response>\nmanual\n</tool_response>"},
        ],
        [WEATHER],
    ),
    (
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "one", "reasoning": "old thoughts"},
            {"role": "user", "content": "second"},
            {"role": "assistant", "content": "two", "reasoning_content": ""},
        ],
        None,
    ),
]
KWARGS = [{}, {"enable_thinking": False}, {"enable_thinking": True}, {"preserve_thinking": True}]


@pytest.fixture(scope="module")
def demo():
    tok_json, config = train_demo_tokenizer(load_demo_corpus(), vocab_size=512)
    tok = Tokenizer.from_json_bytes(tok_json.encode(), config)
    specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if config.get(k)}
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(tok_json),
        chat_template=load_demo_chat_template(),
        **specials,
    )
    return tok, ChatTemplate(load_demo_chat_template(), tok), hf


# -- chat template: parity with transformers ----------------------------------------------------------------------
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_render_matches_transformers(demo, conv):
    tok, ct, hf = demo
    messages, tools = CONVERSATIONS[conv]
    for kwargs in KWARGS:
        for agp in (True, False):
            before = copy.deepcopy(messages)
            want = hf.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=agp, **kwargs
            )
            assert ct.render(messages, tools=tools, add_generation_prompt=agp, **kwargs) == want, (
                kwargs,
                agp,
            )
            assert messages == before  # rendering never edits the caller's messages
    want_ids = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False)
    assert ct.render_ids(messages, tools=tools) == list(want_ids)


FEATURES = """{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
{%- if m.role == 'skip' %}{% continue %}{% endif -%}
{%- set ns.n = ns.n + 1 -%}
{%- if ns.n > 2 %}{% break %}{% endif -%}
{% generation %}{{ m.content | tojson }}{% endgeneration %}
  {{ m | tojson(indent=2) }}|{{ m | tojson(separators=(',', ':'), sort_keys=true) }}
{% endfor %}
[{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ dict(a=1, b=[2]) | tojson }}|{{ strftime_now('%Y') }}]
{{ custom | default('none') }} {{ tools | length if tools else 0 }} {{ add_generation_prompt }}
{%- if documents %} docs={{ documents | tojson }}{% endif %}
"""


def test_environment_features_match_transformers(demo):
    """tojson options, namespace, loopcontrols, {% generation %}, dict, strftime_now, special-token variables."""
    tok, _, hf = demo
    ct = ChatTemplate(FEATURES, tok)
    msgs = [
        {"role": "user", "content": "a<b> & 'c' é 🙂"},
        {"role": "skip", "content": "hidden"},
        {"role": "assistant", "content": "x", "extra": {"k": [1, 2.5, None, True]}},
        {"role": "user", "content": "never shown"},
    ]
    for kwargs in ({}, {"custom": "yes"}, {"eos_token": "OVERRIDE"}):
        want = hf.apply_chat_template(msgs, tools=[WEATHER], chat_template=FEATURES, tokenize=False, **kwargs)
        assert ct.render(msgs, tools=[WEATHER], add_generation_prompt=False, **kwargs) == want
    docs = [{"title": "t", "text": "body"}]
    assert ct.render(msgs, add_generation_prompt=False, documents=docs) == hf.apply_chat_template(
        msgs, chat_template=FEATURES, tokenize=False, documents=docs
    )


# -- chat template: what the demo template renders (docs/protocols.md §7) ------------------------------------------------
def test_generation_prompt_thinking_on_and_off(demo):
    _, ct, _ = demo
    msgs = [{"role": "user", "content": "hey"}]
    head = "<|im_start|>user\nhey<|im_end|>\n<|im_start|>assistant\n"
    assert ct.render(msgs) == head + "<think>\n"
    assert ct.render(msgs, enable_thinking=True) == head + "<think>\n"
    assert ct.render(msgs, enable_thinking=False) == head + "<think>\n\n</think>\n\n"
    assert ct.render(msgs, add_generation_prompt=False) == "<|im_start|>user\nhey<|im_end|>\n"


def test_tool_calls_responses_and_reasoning_layout(demo):
    _, ct, _ = demo
    messages, tools = CONVERSATIONS[4]
    out = ct.render(messages, tools=tools, add_generation_prompt=False)
    assert out.startswith("<|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER, ensure_ascii=False) + "\n</tools>" in out
    call_1 = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    )
    params = [
        ("q", "naïve <b> & 中文"),
        ("n", "3"),
        ("exact", "false"),
        ("tags", '["a", "b"]'),
        ("opts", '{"x": 1.5}'),
        ("z", "null"),
    ]
    call_2 = "<tool_call>\n<function=search>\n"
    call_2 += (
        "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params) + "</function>\n</tool_call>"
    )
    # after the last real query: empty think block kept, blank line before calls, "\n" between calls
    assert f"<|im_start|>assistant\n<think>\n\n</think>\n\nSure.\n\n{call_1}\n{call_2}<|im_end|>\n" in out
    responses = "<|im_start|>user\n<tool_response>\nresult one\n</tool_response>\n<tool_response>\nresult two"
    assert out.endswith(responses + "\n</tool_response><|im_end|>\n")


def test_earlier_reasoning_dropped_unless_preserved(demo):
    _, ct, _ = demo
    messages, _ = CONVERSATIONS[2]
    out = ct.render(messages, add_generation_prompt=False)
    assert "greet them" not in out and "fine" not in out.replace("Fine", "")
    assert "<|im_start|>assistant\nFine, thanks.<|im_end|>" in out
    kept = ct.render(messages, add_generation_prompt=False, preserve_thinking=True)
    assert "<|im_start|>assistant\n<think>\ngreet them\n</think>\n\nHello!<|im_end|>" in kept
    assert "<|im_start|>assistant\n<think>\nfine\n</think>\n\nFine, thanks.<|im_end|>" in kept


class _Msg(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None = None
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET


def test_structs_and_dataclass_like_inputs_render_as_dicts(demo):
    _, ct, _ = demo
    structs = [_Msg(role="user", content="q"), _Msg(role="assistant", content="a", reasoning_content="r")]
    dicts = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
    ]
    assert ct.render(structs, preserve_thinking=True) == ct.render(dicts, preserve_thinking=True)
    assert "<think>\nr\n</think>" in ct.render(structs, preserve_thinking=True)
    assert ct.render([_Msg(role="user", content="q")]) == ct.render(dicts[:1])


def test_string_tool_arguments_are_parsed_for_the_template(demo):
    _, ct, _ = demo
    wire = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
    ]
    with pytest.raises(TemplateError, match="must be an object"):
        ct.render(wire)
    parsed = parse_tool_call_arguments(wire)
    assert wire[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'  # input untouched
    assert ct.render(parsed) == ct.render([wire[0], {"role": "assistant", "tool_calls": [CALL]}])
    bad = copy.deepcopy(wire)
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{city: Oslo"
    with pytest.raises(TemplateError, match=r"messages\[1\].tool_calls\[0\] arguments are not valid JSON"):
        parse_tool_call_arguments(bad)
    bad[1]["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    with pytest.raises(TemplateError, match="must be a JSON object"):
        parse_tool_call_arguments(bad)


# -- chat template: errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "messages is empty"),
        ("hello", "must be a list"),
        ([{"role": "user", "content": "a"}, "oops"], r"messages\[1\] must be an object"),
        ([{"role": "system", "content": "s"}], "no user query"),
        ([{"role": "tool", "content": "<tool_response>x</tool_response>"}], "no user query"),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}], r"messages\[1\] is one"),
        ([{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}], 'Unknown role "wizard"'),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
            '"image_url" content part',
        ),
        ([{"role": "user", "content": 42}], "must be a string or a list of text parts"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"arguments": {}}]}],
            "function name",
        ),
    ],
)
def test_bad_messages_raise_clear_template_error(demo, messages, match):
    _, ct, _ = demo
    with pytest.raises(TemplateError, match=match):
        ct.render(messages)


def test_bad_templates_raise_clear_template_error(demo):
    tok, _, _ = demo
    with pytest.raises(TemplateError, match="syntax error at line 2"):
        ChatTemplate("ok\n{% if messages %}no end", tok)
    with pytest.raises(TemplateError, match="empty"):
        ChatTemplate("   ", tok)
    msgs = [{"role": "user", "content": "a"}]
    with pytest.raises(TemplateError, match="rejected"):  # sandbox: no access to Python internals
        ChatTemplate("{{ ''.__class__.__mro__ }}", tok).render(msgs)
    with pytest.raises(TemplateError, match="rejected"):  # immutable sandbox: no mutation of inputs
        ChatTemplate("{% set _ = messages.append(1) %}", tok).render(msgs)
    with pytest.raises(TemplateError, match="rejected"):
        ChatTemplate("{% set ns = namespace(_x=1) %}", tok).render(msgs)
    with pytest.raises(TemplateError, match="TypeError"):
        ChatTemplate("{{ messages[0].content + 1 }}", tok).render(msgs)
    with pytest.raises(TemplateError, match=r"tools\[0\] must be a JSON-schema object"):
        ChatTemplate("x", tok).render(msgs, tools=["get_weather"])
    with pytest.raises(TemplateError, match="needs a ChatTemplate built with a tokenizer"):
        ChatTemplate("x").render_ids(msgs)


# -- tokenizer -------------------------------------------------------------------------------------------------------
def test_tokenizer_facts_and_encode_parity(demo):
    tok, _, hf = demo
    assert tok.vocab_size == 512 + 9 == len(hf)
    assert tok.eos_token_ids == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    assert tok.eos_token == "<|im_end|>" and tok.bos_token is None and tok.bos_token_id is None
    assert tok.pad_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.special_ids == {tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert tok.id_to_token(tok.token_to_id("<think>")) == "<think>"
    rng = random.Random(0)
    alphabet = "abc XYZ 12 \n\t,.!é中🙂" + "".join(["<think>", "</tool_call>", "<|im_end|>"])
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False)
        ids = tok.encode(text)
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_tokenizer_errors_and_config_added_tokens(demo):
    tok, _, _ = demo
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(TokenizerError, match="could not be loaded"):
        Tokenizer.from_json_bytes(b'{"not": "a tokenizer"}')
    with pytest.raises(TokenizerError, match="needs a str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    raw = tok.hf.to_str()
    with pytest.raises(TokenizerError, match="eos_token '<nope>' is not in the vocabulary"):
        Tokenizer.from_json_bytes(raw, {"eos_token": "<nope>"})
    # transformers adds added_tokens_decoder entries missing from tokenizer.json; so do we, on their declared ids
    n = tok.vocab_size
    extra = {
        str(n): {"content": "<|video_pad|>", "special": True},
        str(n + 1): {"content": "<x>", "special": False},
    }
    grown = Tokenizer.from_json_bytes(
        raw, {"added_tokens_decoder": extra, "eos_token": {"content": "<|im_end|>"}}
    )
    assert grown.vocab_size == n + 2 and grown.token_to_id("<|video_pad|>") == n and n in grown.special_ids
    assert grown.encode("a<x>") == tok.encode("a") + [n + 1]
    with pytest.raises(TokenizerError, match="wants id"):
        Tokenizer.from_json_bytes(raw, {"added_tokens_decoder": {str(n + 5): {"content": "<y>"}}})


class _FakeArtifact:
    def __init__(self, resources: dict[str, bytes]) -> None:
        self._res = resources

    def resource(self, role: str) -> bytes | None:
        return self._res.get(role)


def test_tokenizer_from_artifact_resources(demo):
    tok, _, _ = demo
    raw = tok.hf.to_str().encode()
    cfg = json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}).encode()
    built = Tokenizer.from_artifact(_FakeArtifact({"tokenizer": raw, "tokenizer_config": cfg}))
    assert built.encode("hello 🙂") == tok.encode("hello 🙂") and built.pad_token == "<|endoftext|>"
    assert Tokenizer.from_artifact(_FakeArtifact({"tokenizer": raw})).eos_token is None
    with pytest.raises(TokenizerError, match="embeds no tokenizer"):
        Tokenizer.from_artifact(_FakeArtifact({}))
    with pytest.raises(TokenizerError, match="not valid JSON"):
        Tokenizer.from_artifact(_FakeArtifact({"tokenizer": raw, "tokenizer_config": b"{oops"}))


# -- incremental detokenizer -----------------------------------------------------------------------------------------
def _stream(tok: Tokenizer, ids: list[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    return [detok.push(t) for t in ids] + [detok.flush()]


def test_detok_equals_full_decode_on_encoded_text(demo):
    tok, _, _ = demo
    rng = random.Random(1)
    pieces = [
        "hello",
        " world",
        "é",
        "中文",
        "🙂",
        "👩‍💻",
        "🇯🇵",
        "\n",
        " ",
        "ü",
        "<|im_end|>",
        "<think>",
        "x",
        "ℤ",
    ]
    for _ in range(150):
        ids = tok.encode("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 20))))
        for skip in (False, True):
            chunks = _stream(tok, ids, skip)
            full = tok.decode(ids, skip_special_tokens=skip)
            assert "".join(chunks) == full
            assert "\ufffd" not in full and not any("\ufffd" in c for c in chunks)


def test_detok_equals_full_decode_on_random_ids(demo):
    """Random ids include lone continuation bytes and cut sequences: genuine U+FFFD must come out exactly once."""
    tok, _, _ = demo
    rng = random.Random(2)
    specials = sorted(tok.added_tokens)
    for _ in range(300):
        ids = [
            rng.choice(specials) if rng.random() < 0.1 else rng.randrange(tok.vocab_size) for _ in range(30)
        ]
        for skip in (False, True):
            assert "".join(_stream(tok, ids, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_detok_holds_partial_characters(demo):
    tok, _, _ = demo
    byte_ids = tok.encode("🙂")  # 4 UTF-8 bytes; the small demo vocab spells it in several tokens
    assert len(byte_ids) > 1
    detok = IncrementalDetokenizer(tok)
    assert detok.push(tok.encode("a")[0]) == "a"
    assert [detok.push(t) for t in byte_ids[:-1]] == [""] * (len(byte_ids) - 1)
    assert detok.push(byte_ids[-1]) == "🙂"
    # a cut character at the end of the stream is flushed as U+FFFD, as a full decode gives
    assert detok.push(byte_ids[0]) == "" and detok.flush() == "\ufffd"
    assert detok.token_ids == tok.encode("a") + byte_ids + byte_ids[:1]
    again = IncrementalDetokenizer(tok)
    assert again.push_many(tok.encode("中文 ok")) == "中文 ok" and again.flush() == ""
