"""The demo byte-level BPE: determinism, Qwen control tokens, round trips, and loadability by transformers."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import unicodedata

import pytest

from ninfer.frontend import ChatTemplate, Tokenizer
from ninfer.frontend.demo_tokenizer import (
    DEMO_ADDED_TOKENS,
    DEMO_SPECIAL_TOKENS,
    demo_frontend_resources,
    load_demo_chat_template,
    load_demo_corpus,
    train_demo_tokenizer,
)

VOCAB = 1024
CONTROL = DEMO_SPECIAL_TOKENS + DEMO_ADDED_TOKENS


@pytest.fixture(scope="module")
def trained():
    tok_json, config = train_demo_tokenizer(load_demo_corpus(), VOCAB)
    return tok_json, config, Tokenizer.from_json_bytes(tok_json.encode(), config)


def test_corpus_is_sized_and_varied():
    corpus = load_demo_corpus()
    assert 50_000 <= len(corpus.encode()) <= 200_000
    assert any(ord(c) > 0x4E00 for c in corpus) and any(ord(c) > 0x1F000 for c in corpus)  # CJK and emoji
    assert "def " in corpus and '{"' in corpus


def test_training_is_deterministic_across_processes(trained):
    tok_json, config, _ = trained
    again, config_again = train_demo_tokenizer(load_demo_corpus(), VOCAB)
    assert again == tok_json and config_again == config
    code = (
        "import hashlib, sys; from ninfer.frontend.demo_tokenizer import train_demo_tokenizer, load_demo_corpus;"
        f"sys.stdout.write(hashlib.sha256(train_demo_tokenizer(load_demo_corpus(), {VOCAB})[0].encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "RAYON_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout == hashlib.sha256(tok_json.encode()).hexdigest()


def test_control_tokens_follow_the_learned_vocab_in_qwen_order(trained):
    tok_json, config, tok = trained
    assert tok.vocab_size == VOCAB + len(CONTROL)
    assert [tok.token_to_id(t) for t in CONTROL] == list(range(VOCAB, VOCAB + len(CONTROL)))
    # as in the real Qwen vocabulary: only the three chat markers are "special"; think/tool markers are not
    assert tok.special_ids == {tok.token_to_id(t) for t in DEMO_SPECIAL_TOKENS}
    decoder = config["added_tokens_decoder"]
    assert {v["content"]: v["special"] for v in decoder.values()} == {
        t: t in DEMO_SPECIAL_TOKENS for t in CONTROL
    }
    assert (
        config["eos_token"] == "<|im_end|>"
        and config["pad_token"] == "<|endoftext|>"
        and not config["bos_token"]
    )
    for t in CONTROL:  # each encodes to exactly its own id, also glued to text
        assert tok.encode(t) == [tok.token_to_id(t)]
        assert tok.token_to_id(t) in tok.encode(f"x{t}y")
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n</tool_call><|im_end|>"
    assert (
        tok.decode(tok.encode(text), skip_special_tokens=True)
        == "assistant\n<think>\nhm\n</think>\n\n<tool_call>\n</tool_call>"
    )


def test_round_trip_of_any_text(trained):
    _, _, tok = trained
    corpus = load_demo_corpus()
    assert tok.decode(tok.encode(corpus)) == unicodedata.normalize("NFC", corpus)
    rng = random.Random(0)
    for _ in range(100):  # arbitrary code points, including ones never seen in training
        text = "".join(
            chr(rng.choice([rng.randrange(32, 0x800), rng.randrange(0x800, 0xD800)])) for _ in range(30)
        )
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_bpe_learned_useful_merges(trained):
    _, _, tok = trained
    corpus = load_demo_corpus()
    # measured at vocab 1024: 0.46 tokens per byte on the corpus (digits stay single tokens, as in Qwen)
    assert len(tok.encode(corpus)) < 0.5 * len(corpus.encode())
    unseen = "The river was quiet in the morning, and the people of the village walked along it together."
    assert len(tok.encode(unseen)) < 0.45 * len(unseen)
    for word in (" the", " and", "ing", " of"):
        assert len(tok.encode(word)) == 1, word


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        train_demo_tokenizer("some text", vocab_size=100)
    with pytest.raises(ValueError, match="empty"):
        train_demo_tokenizer("   ")


def test_resources_load_in_transformers_and_render_the_same(tmp_path):
    transformers = pytest.importorskip("transformers")
    res = demo_frontend_resources(vocab_size=512)
    assert set(res) == {"tokenizer", "tokenizer_config", "chat_template"}
    (tmp_path / "tokenizer.json").write_bytes(res["tokenizer"])
    (tmp_path / "tokenizer_config.json").write_bytes(res["tokenizer_config"])
    (tmp_path / "chat_template.jinja").write_bytes(res["chat_template"])
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok = Tokenizer.from_json_bytes(res["tokenizer"], json.loads(res["tokenizer_config"]))
    assert len(hf) == tok.vocab_size and hf.eos_token == tok.eos_token
    ct = ChatTemplate(load_demo_chat_template(), tok)
    msgs = [{"role": "system", "content": "Short answers."}, {"role": "user", "content": "Wie geht's? 🙂"}]
    for thinking in (True, False):
        want = hf.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert ct.render(msgs, enable_thinking=thinking) == want
        ids = hf.apply_chat_template(
            msgs, add_generation_prompt=True, enable_thinking=thinking, return_dict=False
        )
        assert ct.render_ids(msgs, enable_thinking=thinking) == list(ids)
