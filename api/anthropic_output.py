"""Anthropic Messages output (docs/protocols.md §5): the non-streamed message body and the SSE events of a streamed
one, built from anthropic_models.py. ``stop_sequence`` names the stop sequence that ended the message;
``cache_read_input_tokens`` is part of ``input_tokens`` (see anthropic.py)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from ninfer.engine.core import Finish

from .anthropic import AnthropicError
from .anthropic_models import (
    BlockDelta,
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    DeltaUsage,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageStart,
    MessageStop,
    SignatureDelta,
    StopInfo,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    Usage,
    event_name,
)
from .errors import ApiError
from .protocol_shared import Output, OutputParser, new_id, reports_calls

__all__ = ["stop_reason", "message_body", "MessagesStream"]


def stop_reason(fin: Finish, calls: bool) -> str:
    if calls:
        return "tool_use"
    if fin.reason in ("output_limit", "context_capacity"):
        return "max_tokens"
    return "stop_sequence" if fin.reason == "stop_string" else "end_turn"


def _stop_sequence(fin: Finish) -> str | None:
    return fin.stop_string if fin.reason == "stop_string" else None


def _usage(fin: Finish) -> Usage:
    return Usage(
        input_tokens=fin.usage.prompt_tokens,
        output_tokens=fin.usage.completion_tokens,
        cache_read_input_tokens=fin.usage.cached_tokens,
        cache_creation_input_tokens=0,
    )


def _input(arguments: str) -> dict[str, Any]:
    try:
        v = json.loads(arguments)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def message_body(mid: str, model: str, out: Output, fin: Finish) -> Message:
    """Blocks in order thinking, text, tool_use; a message with none of them has one empty text block."""
    content: list[ContentBlock] = []
    if out.reasoning:
        content.append(ThinkingBlock(thinking=out.reasoning))
    if out.content:
        content.append(TextBlock(text=out.content))
    for name, args in out.calls:
        content.append(ToolUseBlock(id=new_id("toolu_"), name=name, input=_input(args)))
    if not content:
        content.append(TextBlock(text=""))
    return Message(
        id=mid,
        model=model,
        content=content,
        stop_reason=stop_reason(fin, reports_calls(fin.reason, len(out.calls), out.unclosed)),
        stop_sequence=_stop_sequence(fin),
        usage=_usage(fin),
    )


class MessagesStream:
    """SSE events in order: message_start, per block start / deltas / stop (thinking, text, tool_use with
    ``input_json_delta`` pieces as the call streams), message_delta (stop_reason, stop_sequence, usage),
    message_stop. Errors after the start are one ``event: error``."""

    def __init__(self, mid: str, model: str, prompt_tokens: int, thinking: bool, tools: list | None) -> None:
        self.mid, self.model, self.prompt_tokens = mid, model, prompt_tokens
        self._parser = OutputParser(thinking, tools, max_name=128)
        self._index = -1
        self._open: str | None = None  # type of the open block
        self.tool_calls = 0
        self._any = False

    @staticmethod
    def _ev(ev: StreamEvent) -> bytes:
        return b"event: " + event_name(ev).encode() + b"\ndata: " + msgspec.json.encode(ev) + b"\n\n"

    def start(self) -> bytes:
        msg = Message(id=self.mid, model=self.model, content=[], stop_reason=None, stop_sequence=None,
                      usage=Usage(input_tokens=self.prompt_tokens, output_tokens=0))  # fmt: skip
        return self._ev(MessageStart(message=msg))

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            out += self._delta(SignatureDelta())
        self._open = None
        return out + self._ev(ContentBlockStop(index=self._index))

    def _begin(self, block: ContentBlock) -> bytes:
        out = self._close()
        self._index += 1
        self._open, self._any = block.__struct_config__.tag, True  # type: ignore[assignment]
        return out + self._ev(ContentBlockStart(index=self._index, content_block=block))

    def _delta(self, delta: BlockDelta) -> bytes:
        return self._ev(ContentBlockDelta(index=self._index, delta=delta))

    def text(self, text: str) -> bytes:
        return self._events(self._parser.push(text))

    def _events(self, events: list[tuple]) -> bytes:
        out = b""
        for ev in events:
            kind = ev[0]
            if kind == "reasoning":
                if self._open != "thinking":
                    out += self._begin(ThinkingBlock(thinking=""))
                out += self._delta(ThinkingDelta(thinking=ev[1]))
            elif kind == "text":
                if self._open != "text":
                    out += self._begin(TextBlock(text=""))
                out += self._delta(TextDelta(text=ev[1]))
            elif kind == "start":
                self.tool_calls += 1
                out += self._begin(ToolUseBlock(id=new_id("toolu_"), name=ev[2], input={}))
            elif kind == "args":
                out += self._delta(InputJsonDelta(partial_json=ev[2]))
            elif kind == "end":
                out += self._close()
        return out

    def finish(self, fin: Finish) -> bytes:
        out = self._events(self._parser.finish()) + self._close()
        if not self._any:
            out += self._begin(TextBlock(text="")) + self._close()
        called = reports_calls(fin.reason, self.tool_calls, self._parser.unclosed)
        delta = StopInfo(stop_reason=stop_reason(fin, called), stop_sequence=_stop_sequence(fin))
        out += self._ev(MessageDelta(delta=delta, usage=DeltaUsage(**msgspec.structs.asdict(_usage(fin)))))
        return out + self._ev(MessageStop())

    def error(self, err: ApiError) -> bytes:
        return self._ev(AnthropicError(err.status, err.message).body())
