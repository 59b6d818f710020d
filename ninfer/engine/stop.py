"""Generated text for streaming: incremental detokenization plus stop strings matched across token boundaries.

``StopMatcher`` holds back the longest tail of the text that is still the start of some stop string, so emitted
text never has to be taken back. When several stop strings match, the earliest wins: fewest tokens (the first
push that completes any), then lowest offset, then declaration order. The stop string and everything after it
are removed from the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["StopMatcher", "TextStream"]


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""  # text not yet emitted: a possible start of a stop string
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Add text; return what is now safe to emit. After a match, ``matched`` is set and nothing more comes."""
        if self.matched is not None or not text:
            return ""
        if not self.stops:
            return text
        buf = self._pending + text
        hits = [(i, n, s) for n, s in enumerate(self.stops) if (i := buf.find(s)) >= 0]
        if hits:
            at, _, self.matched = min(hits)
            self._pending = ""
            return buf[:at]
        hold = self._held_tail(buf)
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def _held_tail(self, buf: str) -> int:
        longest = max(len(s) for s in self.stops) - 1
        for k in range(min(longest, len(buf)), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def flush(self) -> str:
        """End of generation without a match: the held tail is ordinary text."""
        out, self._pending = ("" if self.matched is not None else self._pending), ""
        return out


class _DiffDetokenizer:
    """Fallback for tokenizers without ``IncrementalDetokenizer`` support: decode the whole id list each time and
    emit the new suffix, holding a trailing U+FFFD (an incomplete UTF-8 sequence)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok, self._ids, self._emitted = tokenizer, [], 0

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids).rstrip("\ufffd")
        out = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return out

    def flush(self) -> str:
        return self._tok.decode(self._ids)[self._emitted :]


def _detokenizer(tokenizer: Any) -> Any:
    try:
        from ninfer.frontend import IncrementalDetokenizer, Tokenizer
    except ImportError:  # pragma: no cover - the frontend is part of the package
        return _DiffDetokenizer(tokenizer)
    if isinstance(tokenizer, Tokenizer):
        return IncrementalDetokenizer(tokenizer)
    return _DiffDetokenizer(tokenizer)


class TextStream:
    """Text of one request's generated ids. Stop tokens are counted by the caller but never pushed here."""

    def __init__(self, tokenizer: Any | None, stops: Sequence[str], after_token: int | None = None) -> None:
        if tokenizer is None and any(stops):
            raise ValueError("stop strings need a tokenizer")
        self._detok = _detokenizer(tokenizer) if tokenizer is not None else None
        self._stop = StopMatcher(stops)
        self._after = after_token  # stop strings are searched only in text after this token
        self.text = ""  # everything emitted so far

    @property
    def matched(self) -> str | None:
        return self._stop.matched

    def push(self, token_id: int) -> str:
        if self._detok is None:
            return ""
        piece = self._detok.push(token_id)
        if self._after is not None:  # not armed yet: the text passes unsearched
            if token_id == self._after:
                self._after = None
            self.text += piece
            return piece
        out = self._stop.push(piece)
        self.text += out
        return out

    def finish(self) -> str:
        """The remaining text at the end of generation (nothing after a matched stop string)."""
        if self._detok is None or self._stop.matched is not None:
            return ""
        out = self._stop.push(self._detok.flush())
        out += self._stop.flush()
        self.text += out
        return out
