"""Tokenizer: a thin, typed wrapper around an HF ``tokenizers.Tokenizer`` built from tokenizer.json bytes.

The artifact embeds the checkpoint's tokenizer.json (and tokenizer_config.json) byte for byte; this class is the
only place that turns them into ids and back. Everything runs through the Rust ``tokenizers`` library, so
encodings are identical to transformers' fast tokenizer for the same files. ``IncrementalDetokenizer`` turns one
sequence of generated ids back into text as they come (below).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import tokenizers

__all__ = ["Tokenizer", "TokenizerError", "EOS_TOKENS", "IncrementalDetokenizer"]

# The stop tokens of the Qwen3.6 family in preference order (docs/protocols.md §8: 248046 and 248044).
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
# tokenizer_config.json keys that name one special token each; the chat template sees them as variables.
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerError(ValueError):
    """A tokenizer that cannot be built, or an id / text it cannot handle, with the problem named."""


class _HasResources(Protocol):
    def resource(self, role: str) -> bytes | None: ...


def _token_content(value: Any, key: str) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, null, or a serialized AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(
        f"tokenizer_config.json: {key} must be a string, null or {{'content': ...}}, got {value!r}"
    )


def _add_config_tokens(hf: tokenizers.Tokenizer, decoder: Mapping[str, Any]) -> None:
    """Add tokens that tokenizer_config.json's ``added_tokens_decoder`` declares but tokenizer.json lacks.

    transformers does the same on load (docs/formats.md §1: the real model's ids 248070-76 come from there). Each must
    land on its declared id, so they are added in id order and must extend the vocabulary contiguously.
    """
    for key in sorted(decoder, key=int):
        entry = decoder[key]
        content = _token_content(entry, f"added_tokens_decoder[{key}]")
        if content is None or hf.token_to_id(content) is not None:
            continue
        if int(key) != hf.get_vocab_size(with_added_tokens=True):
            raise TokenizerError(
                f"tokenizer_config.json: added token {content!r} wants id {key} but the next free id is "
                f"{hf.get_vocab_size(with_added_tokens=True)}"
            )
        flags = {k: bool(entry.get(k, False)) for k in ("single_word", "lstrip", "rstrip")}
        token = tokenizers.AddedToken(
            content,
            normalized=bool(entry.get("normalized", False)),
            special=bool(entry.get("special")),
            **flags,
        )
        (hf.add_special_tokens if token.special else hf.add_tokens)([token])


class Tokenizer:
    """Text <-> token ids for one model, plus the special-token facts the engine and templates need."""

    def __init__(self, hf: tokenizers.Tokenizer, tokenizer_config: Mapping[str, Any] | None = None) -> None:
        self._hf = hf
        self._config: dict[str, Any] = dict(tokenizer_config or {})
        _add_config_tokens(hf, self._config.get("added_tokens_decoder") or {})
        added = hf.get_added_tokens_decoder()  # id -> AddedToken
        self._added: dict[int, str] = {i: t.content for i, t in sorted(added.items())}
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self._control = {t.content: (i, t.lstrip, t.rstrip) for i, t in sorted(added.items()) if t.special}
        # the same tokenizer with special-token text read as text (non-special added tokens still match)
        self._text_hf = tokenizers.Tokenizer.from_str(hf.to_str())
        self._text_hf.encode_special_tokens = True
        self._max_token_chars: int | None = None
        # The id domain: Qwen's ids are contiguous, so this is max id + 1 (248077 for the real model).
        self._vocab_size = max([hf.get_vocab_size(with_added_tokens=True), *(i + 1 for i in added)])
        self._special_tokens: dict[str, str] = {}
        for key in _SPECIAL_KEYS:
            content = _token_content(self._config.get(key), key)
            if content is None:
                continue
            if hf.token_to_id(content) is None:
                raise TokenizerError(f"tokenizer_config.json: {key} {content!r} is not in the vocabulary")
            self._special_tokens[key] = content
        eos = [t for t in EOS_TOKENS if hf.token_to_id(t) is not None]
        if "eos_token" in self._special_tokens and self._special_tokens["eos_token"] not in eos:
            eos.append(self._special_tokens["eos_token"])
        self._eos_ids = tuple(hf.token_to_id(t) for t in eos)

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_json_bytes(
        cls, tokenizer_json: bytes | str, tokenizer_config: Mapping[str, Any] | None = None
    ) -> Tokenizer:
        """Build from the bytes of a tokenizer.json and the parsed tokenizer_config.json (optional)."""
        text = tokenizer_json.decode("utf-8") if isinstance(tokenizer_json, bytes) else tokenizer_json
        try:
            hf = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # the Rust side raises a bare Exception with a serde message
            raise TokenizerError(f"tokenizer.json could not be loaded: {e}") from None
        return cls(hf, tokenizer_config)

    @classmethod
    def from_artifact(cls, art: _HasResources) -> Tokenizer:
        """Build from an opened artifact's embedded `tokenizer` and (if present) `tokenizer_config` resources.

        ``art.resource(role)`` returns the bytes, or None (or raises KeyError) when the artifact lacks the role.
        """

        def get(role: str) -> bytes | None:
            try:
                return art.resource(role)
            except KeyError:
                return None

        tok_json = get("tokenizer")
        if not tok_json:
            raise TokenizerError("the artifact embeds no tokenizer (resource role 'tokenizer')")
        cfg_bytes = get("tokenizer_config")
        config = None
        if cfg_bytes:
            try:
                config = json.loads(cfg_bytes)
            except ValueError as e:
                raise TokenizerError(f"tokenizer_config.json is not valid JSON: {e}") from None
            if not isinstance(config, dict):
                raise TokenizerError("tokenizer_config.json must hold a JSON object")
        return cls.from_json_bytes(tok_json, config)

    # -- ids <-> text -------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special-token text inside ``text`` becomes the special id (HF default).

        Runs through ``encode_batch``, which releases the GIL while it works (measured with tokenizers 0.23:
        a plain ``encode`` of a 2 MB text held it for the whole 2.5 s in some threads), so a long prompt
        tokenized on a worker thread does not stall the other threads of the process."""
        return self._encode(self._hf, text, add_special_tokens)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` read as plain text: special-token text (``<|im_end|>``) is split like any other
        text instead of becoming the control token. Added tokens that are not special (``<think>``) still match."""
        return self._encode(self._text_hf, text, False)

    @staticmethod
    def _encode(hf: tokenizers.Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"encode() needs a str, got {type(text).__name__}")
        (enc,) = hf.encode_batch([text], add_special_tokens=add_special_tokens)
        return enc.ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a cut multi-byte character) decodes to U+FFFD like HF does."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._vocab_size]
        if bad:
            raise TokenizerError(f"token id {bad[0]} is outside the vocabulary [0, {self._vocab_size})")
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    # -- vocabulary facts ---------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (ids are 0 .. vocab_size-1)."""
        return self._vocab_size

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(int(token_id))

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of added tokens marked special (removed by ``skip_special_tokens``)."""
        return self._special_ids

    @property
    def control_tokens(self) -> dict[str, tuple[int, bool, bool]]:
        """Special added tokens (``<|im_start|>``, ...): text -> (id, lstrip, rstrip)."""
        return dict(self._control)

    @property
    def max_token_chars(self) -> int:
        """Most characters one token stands for (the longest vocabulary entry; a byte-level entry has one
        character per byte, so this bounds the decoded text too). A text of N characters has at least
        N / max_token_chars tokens, up to normalization (see ``ninfer.frontend.prompt``)."""
        if self._max_token_chars is None:
            vocab = self._hf.get_vocab(with_added_tokens=True)
            self._max_token_chars = max([1, *map(len, vocab), *map(len, self._added.values())])
        return self._max_token_chars

    @property
    def added_tokens(self) -> dict[int, str]:
        """All added tokens (special or not, e.g. ``<think>``), id -> text."""
        return dict(self._added)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Default stop ids: ``<|im_end|>`` then ``<|endoftext|>`` when present, then the configured eos."""
        return self._eos_ids

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Configured ``bos_token`` / ``eos_token`` / ``unk_token`` / ``pad_token`` texts (absent when unset)."""
        return dict(self._special_tokens)

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special_tokens.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self._special_tokens.get("pad_token")

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self._hf.token_to_id(self.bos_token)

    @property
    def pad_token_id(self) -> int | None:
        return None if self.pad_token is None else self._hf.token_to_id(self.pad_token)

    @property
    def hf(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer`` (read-only use: e.g. grammar compilers need it)."""
        return self._hf

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self._vocab_size}, special={len(self._special_ids)}, eos={self._eos_ids})"
        )


# ---- incremental detokenization ------------------------------------------------------------------------------
# Incremental detokenization for streaming: text out per token, never a cut multi-byte character.
#
# Invariant (tested as a property): ``"".join(push(t) for t in ids) + flush() == tokenizer.decode(ids)``.
#
# Why it holds. The decoder turns a window of ids into bytes and decodes them lossily (HF ByteLevel:
# ``String::from_utf8_lossy``), which works left to right and never revises a character once a later valid
# character has followed it. So for a window that starts at a clean boundary:
# - if its text does not end in U+FFFD, the byte stream ends on a character boundary: the whole text is final and
#   the next window can start here;
# - if it does, only the trailing run of U+FFFD can still change (an incomplete sequence may be completed by the
#   next token's bytes), so everything before that run is final and is emitted, and the run is held back.
# A held U+FFFD that really is invalid input is emitted once a clean boundary follows it, or by ``flush()``.
# The window keeps one finished chunk of left context, so decoders that treat a sequence's first token specially
# (e.g. a SentencePiece leading space) see the same context as a full decode; for ByteLevel it is not needed.

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Streams the text of one sequence of generated token ids."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._start = 0  # window start; the byte stream before it ends on a clean boundary
        self._mark = 0  # latest clean boundary (>= start); becomes the next window start
        self._emitted = 0  # characters of decode(ids[start:]) already returned

    @property
    def token_ids(self) -> list[int]:
        """All ids pushed so far."""
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the newly final text (possibly empty)."""
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids[self._start :], skip_special_tokens=self._skip)
        clean = not text.endswith(_REPLACEMENT)
        final = text if clean else text.rstrip(_REPLACEMENT)
        out = final[self._emitted :]
        self._emitted = max(self._emitted, len(final))
        if clean:
            if self._mark > self._start:
                self._emitted = len(self._tok.decode(self._ids[self._mark :], skip_special_tokens=self._skip))
                self._start = self._mark
            self._mark = len(self._ids)
        return out

    def push_many(self, token_ids: list[int]) -> str:
        """Add several ids (e.g. accepted speculative drafts); same result as pushing them one by one."""
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """End of the sequence: return whatever is still held (a genuinely invalid tail decodes to U+FFFD)."""
        text = self._tok.decode(self._ids[self._start :], skip_special_tokens=self._skip)
        out = text[self._emitted :]
        self._start = self._mark = len(self._ids)
        self._emitted = 0
        return out
