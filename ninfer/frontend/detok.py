"""Incremental detokenization for streaming: text out per token, never a cut multi-byte character.

Invariant (tested as a property): ``"".join(push(t) for t in ids) + flush() == tokenizer.decode(ids)``.

Why it holds. The decoder turns a window of ids into bytes and decodes them lossily (HF ByteLevel:
``String::from_utf8_lossy``), which works left to right and never revises a character once a later valid
character has followed it. So for a window that starts at a clean boundary:
- if its text does not end in U+FFFD, the byte stream ends on a character boundary: the whole text is final and
  the next window can start here;
- if it does, only the trailing run of U+FFFD can still change (an incomplete sequence may be completed by the
  next token's bytes), so everything before that run is final and is emitted, and the run is held back.
A held U+FFFD that really is invalid input is emitted once a clean boundary follows it, or by ``flush()``.
The window keeps one finished chunk of left context, so decoders that treat a sequence's first token specially
(e.g. a SentencePiece leading space) see the same context as a full decode; for ByteLevel it is not needed.
"""

from __future__ import annotations

from .tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]

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
