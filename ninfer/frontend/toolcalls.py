"""Qwen XML tool calls (docs/protocols.md §7) in generated answers, parsed whole or while they stream, by one parser.

The format::

    text before the calls
    <tool_call>
    <function=NAME>
    <parameter=KEY>
    value
    </parameter>
    </function>
    </tool_call>

:class:`ToolCallStream` parses an answer incrementally; :func:`parse_tool_calls` runs the same parser over a whole
text, so a streamed answer and the same answer parsed whole agree by construction. A call is reported only once
its block is complete and well formed (``</tool_call>`` consumed): its events (the name, then the arguments as
JSON pieces per parameter, then the final arguments) are held until then. A block that is malformed, or that the
answer ends inside (cut by the token limit), is never a call: its markup is text, and so is everything after a
malformed block. Calls completed before it stay calls.

Arguments: keys in the order generated (so streamed pieces equal the final string), compact JSON. A parameter
whose declared schema type is ``string`` keeps its trimmed text, so ``"123"`` stays a string; any other value is
trimmed and read as JSON, falling back to the text (docs/protocols.md §7).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .reasoning import held_tail

__all__ = ["ToolCall", "ParsedOutput", "parse_tool_calls", "ToolCallStream", "string_params", "CALL_OPEN"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FN_OPEN, FN_CLOSE = "<function=", "</function>"
P_OPEN, P_CLOSE = "<parameter=", "</parameter>"
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_KEY = re.compile(r"[^<>\s=]+")


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, compact, keys in generated order


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    unclosed: bool = False  # the answer ended inside a call block (its markup is in content)


def string_params(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, frozenset[str]]:
    """Tool name -> the parameters whose schema type is exactly ``string`` (OpenAI function-tool form)."""
    out: dict[str, frozenset[str]] = {}
    for t in tools or ():
        fn = t.get("function", t)
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, Mapping) else None
        if not isinstance(props, Mapping):  # none, or tools no API checked (a Python job's)
            props = {}
        out[str(fn.get("name"))] = frozenset(
            k for k, s in props.items() if isinstance(s, Mapping) and s.get("type") == "string"
        )
    return out


def _json_value(raw: str) -> str:
    v = raw.strip()
    try:
        parsed = json.loads(v)
    except ValueError:
        parsed = v
    return json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))


def _key_piece(first: bool, key: str) -> str:
    return ("{" if first else ",") + json.dumps(key, ensure_ascii=False) + ":"


def _esc(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None, max_name: int = 64
) -> ParsedOutput:
    """Content and calls of a whole answer: the streaming parser over the whole text."""
    stream = ToolCallStream(tools, max_name)
    events = stream.push(text) + stream.finish()
    names = {ev[1]: ev[2] for ev in events if ev[0] == "start"}
    args = {ev[1]: ev[2] for ev in events if ev[0] == "end"}
    calls = [ToolCall(names[i], args[i]) for i in sorted(names)]
    return ParsedOutput("".join(ev[1] for ev in events if ev[0] == "text"), calls, stream.unclosed)


class ToolCallStream:
    """Incremental parser of one answer. ``push(text)`` / ``finish()`` return events:
    ``("text", s)``, ``("start", index, name)``, ``("args", index, piece)``, ``("end", index, arguments)``.
    The events of a call come out together once its ``</tool_call>`` is consumed. After ``finish()``,
    ``failed`` tells whether any markup was malformed and ``unclosed`` whether the answer ended inside a block."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None, max_name: int = 64) -> None:
        self._strings = string_params(tools)
        self._max_name = max_name
        self._state = "text"
        # The text pushed since an origin that precedes any open block (a failed block's markup is released from
        # it as text); the origin moves up whenever no block is open, so it holds at most the open block.
        self._seen: list[str] = []
        self._seen_len = 0
        self._buf = ""  # the unconsumed tail of the text seen
        self._out: list[tuple] = []
        self._held: list[tuple] = []  # the open block's call events
        self._block_at: int | None = None  # where the open block (and the whitespace before it) starts
        self._text_started = False
        self.failed = False
        self.unclosed = False
        self._n = 0  # calls started
        self._args = ""  # the open call's arguments so far
        self._name = ""
        self._first = True  # no parameter yet in the open call
        self._key = ""

    # ---- public -----------------------------------------------------------------------------------------
    def push(self, text: str) -> list[tuple]:
        if self._block_at is None:  # nothing to release later: forget what was consumed
            self._seen, self._seen_len = [self._buf], len(self._buf)
        self._seen.append(text)
        self._seen_len += len(text)
        self._buf += text
        while self._step():
            pass
        out, self._out = self._out, []
        return out

    def finish(self) -> list[tuple]:
        if self._state == "text":
            self._text(self._buf.strip() if not self._text_started else self._buf.rstrip())
        elif self._state == "between":
            self._text(self._buf.rstrip())  # only whitespace, or a partial "<tool_call>" that never came
        elif self._state != "raw":
            self.unclosed = True
            self._fail()
        self._buf = ""  # raw: the held trailing whitespace
        out, self._out = self._out, []
        return out

    # ---- machinery --------------------------------------------------------------------------------------
    def _text(self, s: str) -> None:
        if not self._text_started:
            s = s.lstrip()
        if s:
            self._text_started = True
            self._out.append(("text", s))

    def _emit_args(self, piece: str) -> None:
        self._args += piece
        self._held.append(("args", self._n - 1, piece))

    def _open_block(self, at: int) -> None:
        self._block_at, self._held = at, []

    def _close_block(self) -> None:
        self._out += self._held
        self._block_at, self._held = None, []

    def _consumed(self) -> int:
        return self._seen_len - len(self._buf)

    def _fail(self) -> None:
        """Malformed markup: the open block (if any) is not a call; its markup and everything after is text."""
        self.failed = True
        if self._block_at is not None:
            self._buf, self._held = "".join(self._seen)[self._block_at :], []
            self._block_at = None
        self._state = "raw"
        self._raw()

    def _raw(self) -> None:
        """After malformed markup everything is text; trailing whitespace waits (the answer's end drops it)."""
        keep = len(self._buf) - len(self._buf.rstrip())
        self._text(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]

    def _expect(self, marker: str) -> int | None:
        """After leading whitespace: len consumed if ``marker`` is there, 0 to wait for more, None if not."""
        s = self._buf.lstrip()
        if s.startswith(marker):
            return len(self._buf) - len(s) + len(marker)
        return 0 if marker.startswith(s) else None

    def _step(self) -> bool:  # noqa: C901 - one branch per state of a small machine
        st, buf = self._state, self._buf
        if st == "raw":
            self._raw()
            return False
        if st == "text":
            i = buf.find(CALL_OPEN)
            if i >= 0:
                head = buf[:i].rstrip()
                self._text(head)
                self._open_block(self._consumed() + len(head))
                self._buf, self._state = buf[i + len(CALL_OPEN) :], "fn"
                return True
            keep = held_tail(buf, CALL_OPEN)
            self._text(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        if st == "fn":
            got = self._expect(FN_OPEN)
            if got is None:
                self._fail()
                return False
            j = buf.find(">", got) if got else -1
            if j < 0:
                return False
            name = buf[got:j]
            if not (0 < len(name) <= self._max_name and _NAME.fullmatch(name)):
                self._fail()
                return False
            self._n += 1
            self._args, self._name, self._first = "", name, True
            self._held.append(("start", self._n - 1, name))
            self._buf, self._state = buf[j + 1 :], "params"
            return True
        if st == "params":
            s = buf.lstrip()
            if s.startswith(FN_CLOSE):
                self._emit_args("{}" if self._first else "}")
                self._held.append(("end", self._n - 1, self._args))
                self._buf, self._state = s[len(FN_CLOSE) :], "close"
                return True
            got = self._expect(P_OPEN)
            if got is None and not FN_CLOSE.startswith(s):
                self._fail()
                return False
            if not got:
                return False
            j = buf.find(">", got)
            if j < 0:
                return False
            key = buf[got:j]
            if not _KEY.fullmatch(key):
                self._fail()
                return False
            self._emit_args(_key_piece(self._first, key))
            self._first, self._key = False, key
            self._buf = buf[j + 1 :]
            if key in self._strings.get(self._name, ()):
                self._emit_args('"')
                self._state = "value_str"
                self._str_started = False
            else:
                self._state = "value_json"
            return True
        if st == "value_json":
            i = buf.find(P_CLOSE)
            if i < 0:
                return False
            self._emit_args(_json_value(buf[:i]))
            self._buf, self._state = buf[i + len(P_CLOSE) :], "params"
            return True
        if st == "value_str":
            return self._string_step(buf)
        if st == "close":
            return self._then(CALL_CLOSE, "between")
        return self._then(CALL_OPEN, "fn")  # between calls: only whitespace, then another call or the end

    def _then(self, marker: str, state: str) -> bool:
        """Whitespace, then ``marker``: go on in ``state`` (closing or opening a block); else malformed."""
        got = self._expect(marker)
        if got is None:
            self._fail()
            return False
        if got:
            if marker == CALL_OPEN:
                self._open_block(self._consumed())
            self._buf, self._state = self._buf[got:], state
            if marker == CALL_CLOSE:
                self._close_block()
        return bool(got)

    def _string_step(self, buf: str) -> bool:
        if not self._str_started:
            buf = buf.lstrip()
            if not buf:
                self._buf = ""
                return False
            self._str_started = True
        i = buf.find(P_CLOSE)
        if i >= 0:
            value = buf[:i].rstrip()
            if value:
                self._emit_args(_esc(value))
            self._emit_args('"')
            self._buf, self._state = buf[i + len(P_CLOSE) :], "params"
            return True
        keep = held_tail(buf, P_CLOSE)
        if len(buf) > keep:
            self._emit_args(_esc(buf[: len(buf) - keep]))
        self._buf = buf[len(buf) - keep :]
        return False
