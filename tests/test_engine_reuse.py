"""Prefix reuse over agent sessions on the demo model (real BPE tokenizer and Qwen-style chat template).

Each check compares against an engine with reuse disabled: reuse may only skip work, never change tokens.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ninfer.demo import build_demo
from ninfer.engine import Engine
from ninfer.model import load

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up in the dictionary.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    }
]
BASE = dict(max_context=1024, prefill_chunk=64, checkpoint_stride=64, page_size=16)
SNAPSHOT_BYTES = 58368  # one demo-model GDN checkpoint in fp32: 3 GDN layers x (256x3 conv + 4x32x32 rec) x 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return load(build_demo(tmp_path_factory.mktemp("reuse") / "demo.ninfer"))


@pytest.fixture(scope="module")
def plain(model):  # noqa: ANN001, ANN201 - the no-reuse oracle
    kw = dict(BASE, max_concurrency=1, queue_depth=64, kv_capacity=4096, prefix_reuse=False)
    with Engine.from_model(model, **kw) as eng:
        yield eng


def _check_same(plain: Engine, prompt: list[int], ids: list[int], max_tokens: int) -> None:
    assert plain.submit(prompt, max_tokens=max_tokens, ignore_eos=True).result(timeout=60).token_ids == ids


def _words(model, ids: list[int], n: int) -> str:  # noqa: ANN001
    """Generated text as an agent framework would store it: plain words, no control markers."""
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    return " ".join(re.sub(r"[^A-Za-z ]", " ", text).split()[:n]) or "hmm"


def _query_end(model, msgs: list[dict], tools: list | None = TOOLS) -> int:  # noqa: ANN001
    """Tokens up to the end of the last real user query (not a tool result): where its first answer starts."""
    last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    return len(model.chat_template.render_ids(msgs[: last + 1], tools=tools, add_generation_prompt=False))


def _add_turn(
    model, msgs: list[dict], ids: list[int], turn: int, tool: bool, prompt_len: int, query: int
) -> int:  # noqa: ANN001
    """Append the assistant turn (and a tool result or a new user message); returns the next turn's floor."""
    reasoning = _words(model, ids, 6)
    if tool:  # a tool call: the turn keeps its thinking when re-rendered, the call itself is re-rendered
        call = {"function": {"name": "lookup", "arguments": {"word": f"w{turn}"}}}
        msgs.append(
            {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [call]}
        )
        msgs.append({"role": "tool", "content": f"meaning {turn}"})
        return prompt_len  # the whole previous prompt is reused
    # an answer and a new user message: every assistant turn since the last query loses its thinking
    msgs.append({"role": "assistant", "content": f"Answer {turn}.", "reasoning_content": reasoning})
    msgs.append({"role": "user", "content": f"Next question {turn}?"})
    # the prompts part right after the first assistant turn's "<|im_start|>assistant\n": only its "<think>\n"
    # (the previous generation prompt's last tokens) is rendered differently
    return query + len(model.tokenizer.encode("<|im_start|>assistant\n"))


def test_six_turn_session_appending_tokens(model, plain) -> None:  # noqa: ANN001
    """Token-level turns: each prompt extends the previous context, which must be reused whole."""
    enc = model.tokenizer.encode
    ctx = enc(
        "<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    with Engine.from_model(model, max_concurrency=2, kv_capacity=4096, **BASE) as eng:
        prev = 0
        for turn in range(6):
            c = eng.submit(ctx, max_tokens=12, ignore_eos=True).result(timeout=60)
            assert c.usage.cached_tokens >= prev, f"turn {turn}: reused {c.usage.cached_tokens} of {prev}"
            _check_same(plain, ctx, c.token_ids, 12)
            prev = len(ctx) + len(c.token_ids)
            user = (
                f"<|im_end|>\n<|im_start|>user\nAnd then {turn}?<|im_end|>\n<|im_start|>assistant\n<think>\n"
            )
            ctx = ctx + c.token_ids + enc(user)
        st = eng.stats()
        assert st.prefix_hit_tokens >= st.prefill_tokens  # most prompt tokens were not computed again


def test_six_turn_session_rerendered_by_template(model, plain) -> None:  # noqa: ANN001
    msgs: list[dict] = [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Define cat."},
    ]
    floor = 0
    with Engine.from_model(model, max_concurrency=2, kv_capacity=4096, **BASE) as eng:
        for turn, tool in enumerate([True, False, True, True, False, True]):
            prompt, query = model.chat_template.render_ids(msgs, tools=TOOLS), _query_end(model, msgs)
            c = eng.submit(prompt, max_tokens=16, ignore_eos=True).result(timeout=60)
            assert c.usage.cached_tokens >= floor, f"turn {turn}: cached {c.usage.cached_tokens} < {floor}"
            _check_same(plain, prompt, c.token_ids, 16)
            floor = _add_turn(model, msgs, c.token_ids, turn, tool, len(prompt), query)


def test_pressure_ten_interleaved_sessions(model, plain) -> None:  # noqa: ANN001
    """KV and checkpoint budget too small for every session's history, enough for the reserved checkpoints."""
    tmpl, n = model.chat_template, 10
    sessions = [
        [
            {"role": "system", "content": f"Session {s} " + "word " * (20 + 7 * s)},
            {"role": "user", "content": f"Define thing {s}."},
        ]
        for s in range(n)
    ]
    kw = dict(BASE, checkpoint_stride=32, max_concurrency=2, queue_depth=n, kv_capacity=3200)
    eng = Engine.from_model(model, checkpoint_budget_bytes=40 * SNAPSHOT_BYTES, **kw)
    assert eng._runner.snapshot_bytes == SNAPSHOT_BYTES
    floor = [0] * n
    for turn, tool in enumerate([True, False, True]):
        prompts = [tmpl.render_ids(m) for m in sessions]
        queries = [_query_end(model, m, tools=None) for m in sessions]
        handles = [eng.submit(p, max_tokens=48, ignore_eos=True) for p in prompts]
        for s, (p, h) in enumerate(zip(prompts, handles, strict=True)):
            c = h.result(timeout=120)
            assert c.usage.cached_tokens >= floor[s], (
                f"session {s} turn {turn}: {c.usage.cached_tokens} < {floor[s]}"
            )
            _check_same(plain, p, c.token_ids, 48)
            floor[s] = _add_turn(model, sessions[s], c.token_ids, turn, tool, len(p), queries[s])
        eng._cache.check()
    stats = eng.stats()
    eng.close()
    # every computed position is a distinct history token: together they did not fit in the pool
    assert stats.prefill_tokens + stats.decode_tokens > stats.kv_pages_total * stats.page_size
    # dropped, or (the CUDA runner's default host tier, tests/test_cuda_model.py) moved to the host tier
    assert (stats.evicted_nodes > 0 and stats.evicted_checkpoints > 0) or stats.spills > 0
    assert stats.checkpoint_bytes <= stats.checkpoint_budget_bytes and stats.reserved_sequences == n


def test_reuse_with_bf16_state_and_fp8_kv(model) -> None:  # noqa: ANN001
    """Lossy storage: reuse still hits, and the restored path gives the same greedy tokens as recomputing."""
    prompt = np.random.default_rng(5).integers(0, 1000, 150).tolist()
    kw = dict(BASE, kv_dtype="fp8", gdn_state_dtype="bf16", checkpoint_stride=1024, kv_capacity=4096)
    with Engine.from_model(model, **kw) as eng:
        a = eng.submit(prompt, max_tokens=8, ignore_eos=True).result(timeout=60)
        nxt = prompt + a.token_ids + [5, 6]
        b = eng.submit(nxt, max_tokens=8, ignore_eos=True).result(timeout=60)
        assert b.usage.cached_tokens == len(prompt) + len(a.token_ids)
    with Engine.from_model(model, prefix_reuse=False, **kw) as ref:
        _check_same(ref, nxt, b.token_ids, 8)
