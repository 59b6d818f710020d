"""The demo model's tokenizer: a real byte-level BPE trained on the corpus shipped in ``ninfer/data``.

Built like Qwen's: NFC normalizer, the Qwen2/3 split regex, ByteLevel pre-tokenizer and decoder (every byte is
in the base alphabet, so any text round-trips), then the Qwen control tokens appended after the learned vocab.
As in the real vocabulary, ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` are special tokens (removed by
``skip_special_tokens``) while the think / tool markers are plain added tokens that stay in decoded text.

Training is deterministic: the same corpus gives a byte-identical tokenizer.json (measured across processes,
hash seeds and thread counts with tokenizers 0.23; the test suite checks it).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

__all__ = [
    "DEMO_SPECIAL_TOKENS",
    "DEMO_ADDED_TOKENS",
    "train_demo_tokenizer",
    "load_demo_corpus",
    "load_demo_chat_template",
    "demo_frontend_resources",
]

# Qwen2/Qwen3 pre-tokenizer split (contractions, letter runs, single digits, punctuation, newlines, spaces).
_QWEN_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# (text, special) in id order after the learned vocabulary.
DEMO_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
DEMO_ADDED_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
_MIN_VOCAB = 256 + 1  # the byte alphabet plus at least one merge


def _untrained() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def _config(tok: tokenizers.Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json as the real Qwen3.6 checkpoint shapes it (no BOS, eos = im_end, pad = endoftext)."""
    decoder = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    return {
        "tokenizer_class": "TokenizersBackend",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": 262144,
        "added_tokens_decoder": decoder,
    }


def train_demo_tokenizer(corpus: str, vocab_size: int = 1024) -> tuple[str, dict[str, Any]]:
    """Train the demo BPE on ``corpus``; return (tokenizer.json text, tokenizer_config dict).

    ``vocab_size`` is the learned vocabulary (256 byte symbols + merges; fewer if the corpus runs out of pairs
    seen twice). The 9 Qwen control tokens follow it, so the id domain is ``learned + 9``.
    """
    if not isinstance(corpus, str) or not corpus.strip():
        raise ValueError("demo tokenizer corpus is empty")
    if vocab_size < _MIN_VOCAB:
        raise ValueError(
            f"vocab_size must be at least {_MIN_VOCAB} (256 byte symbols + merges), got {vocab_size}"
        )
    tok = _untrained()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([corpus], trainer=trainer)
    tok.add_special_tokens(
        [tokenizers.AddedToken(t, normalized=False, special=True) for t in DEMO_SPECIAL_TOKENS]
    )
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False) for t in DEMO_ADDED_TOKENS])
    return tok.to_str(pretty=False), _config(tok)


def load_demo_corpus() -> str:
    """The training text shipped as ``ninfer/data/demo_corpus.txt``."""
    return resources.files("ninfer").joinpath("data/demo_corpus.txt").read_text(encoding="utf-8")


def load_demo_chat_template() -> str:
    """The Qwen-style chat template shipped as ``ninfer/data/chat_template.jinja``."""
    return resources.files("ninfer").joinpath("data/chat_template.jinja").read_text(encoding="utf-8")


def demo_frontend_resources(vocab_size: int = 1024) -> dict[str, bytes]:
    """Artifact resources of the demo model by role: ``tokenizer``, ``tokenizer_config``, ``chat_template``."""
    tok_json, config = train_demo_tokenizer(load_demo_corpus(), vocab_size)
    return {
        "tokenizer": tok_json.encode("utf-8"),
        "tokenizer_config": json.dumps(config, indent=2, ensure_ascii=False).encode("utf-8") + b"\n",
        "chat_template": load_demo_chat_template().encode("utf-8"),
    }
