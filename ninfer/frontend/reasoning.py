"""The ``<think>`` channel: split generated text into reasoning and answer, whole or while it streams.

With thinking on, the prompt ends inside ``<think>\\n``, so decoding starts in the reasoning channel; the first
``</think>`` switches to the answer, whose leading whitespace is dropped (docs/protocols.md §7). Reasoning is trimmed at
both ends, as the chat template trims it when the turn is replayed. With thinking off the prompt already closed
the block and everything is answer. Streaming holds back only what might still change: a partial ``</think>`` and
trailing whitespace of the reasoning, so the streamed pieces concatenate to exactly the whole-text split.
"""

from __future__ import annotations

__all__ = ["THINK_END", "split_reasoning", "ReasoningStream"]

THINK_START, THINK_END = "<think>", "</think>"


def split_reasoning(text: str, thinking: bool) -> tuple[str, str]:
    """(reasoning, answer) of a whole generated text."""
    if not thinking:
        return "", text
    reasoning, sep, answer = text.partition(THINK_END)
    reasoning = _strip_open(reasoning).strip()
    return reasoning, answer.lstrip() if sep else ""


def _strip_open(text: str) -> str:
    """A model that repeats the opener (``<think>`` already ended the prompt) does not show it twice."""
    s = text.lstrip()
    return s[len(THINK_START) :] if s.startswith(THINK_START) else text


def held_tail(buf: str, marker: str) -> int:
    """Length of the tail of ``buf`` a stream must hold back: the longest tail that is a proper prefix of
    ``marker`` (it may still complete) and the whitespace before it (it may yet be trimmed)."""
    hold = 0
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if marker.startswith(buf[-k:]):
            hold = k
            break
    return len(buf) - len(buf[: len(buf) - hold].rstrip())


class ReasoningStream:
    """Incremental ``split_reasoning``: ``push(text)`` returns ``(reasoning_delta, answer_delta)``."""

    __slots__ = ("_in_think", "_buf", "_started", "_answer_started")

    def __init__(self, thinking: bool) -> None:
        self._in_think = thinking
        self._buf = ""
        self._started = False  # reasoning emitted yet (its leading whitespace is dropped)
        self._answer_started = False

    @property
    def in_reasoning(self) -> bool:
        return self._in_think

    def push(self, text: str) -> tuple[str, str]:
        if not self._in_think:
            return "", self._answer(text)
        buf = self._buf + text
        i = buf.find(THINK_END)
        if i >= 0:
            self._in_think, self._buf = False, ""
            head = self._reasoning(buf[:i], final=True)
            return head, self._answer(buf[i + len(THINK_END) :])
        if not self._started and THINK_START.startswith(buf.lstrip()):
            self._buf = buf  # maybe a repeated opener: wait for it to complete or diverge
            return "", ""
        keep = held_tail(buf, THINK_END)
        self._buf = buf[len(buf) - keep :] if keep else ""
        return self._reasoning(buf[: len(buf) - keep], final=False), ""

    def _reasoning(self, piece: str, final: bool) -> str:
        if not self._started:
            piece = piece.lstrip()
            if piece.startswith(THINK_START):
                piece = piece[len(THINK_START) :].lstrip()
            if not piece:
                return ""
            self._started = True
        return piece.rstrip() if final else piece

    def _answer(self, piece: str) -> str:
        if not self._answer_started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self._answer_started = True
        return piece

    def finish(self) -> tuple[str, str]:
        """End of generation: anything held in the reasoning channel (trailing whitespace is dropped)."""
        if self._in_think:
            held, self._buf = self._buf, ""
            return self._reasoning(held, final=True), ""
        return "", ""
