"""OpenAI Chat Completions output (docs/protocols.md §4): the non-streamed body and the SSE frames of a streamed one,
built from the msgspec models in models.py. Pure functions and a per-request builder; no I/O."""

from __future__ import annotations

import secrets
from typing import Any

import msgspec

from ninfer.engine.core import Finish

from .errors import ApiError
from .openai_chat_models import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    ChunkDelta,
    CompletionTokensDetails,
    FunctionOut,
    PromptTokensDetails,
    ToolCallOut,
    Usage,
)
from .protocol_shared import Output, OutputParser, new_id, reports_calls

__all__ = ["new_completion_id", "finish_reason", "usage_of", "completion_body", "ChatStream"]

_FINISH = {"output_limit": "length", "context_capacity": "length", "length": "length"}
_MARK = "\x00ninfer-text\x00"  # where a delta's text goes in a pre-encoded frame


def new_completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(8)


def finish_reason(internal: str) -> str:
    return _FINISH.get(internal, "stop")


def usage_of(fin: Finish, cached: bool = False) -> Usage:
    """``cached``: add ``prompt_tokens_details.cached_tokens`` (``--prompt-tokens-details``). Without it the usage
    is a function of the request and its output only, so a greedy request streamed and unstreamed report the
    same usage, as upstream's contract checks (the second of two identical requests reuses more of its prompt)."""
    return Usage(
        prompt_tokens=fin.usage.prompt_tokens,
        completion_tokens=fin.usage.completion_tokens,
        total_tokens=fin.usage.prompt_tokens + fin.usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=fin.usage.cached_tokens)
        if cached
        else msgspec.UNSET,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=fin.usage.reasoning_tokens)
        if fin.usage.reasoning_tokens
        else msgspec.UNSET,
        speculative=fin.usage.speculative if fin.usage.speculative is not None else msgspec.UNSET,
    )


def completion_body(
    cid: str, created: int, model: str, out: Output | str, fin: Finish, cached: bool = False
) -> ChatCompletion:
    """The non-streamed body: ``reasoning_content`` only when non-empty; with tool calls, ``content`` is null
    when empty and ``finish_reason`` is ``tool_calls`` (``length`` when the limit cut a later call)."""
    out = Output(content=out) if isinstance(out, str) else out
    msg = AssistantMessage(content=out.content)
    if out.reasoning:
        msg.reasoning_content = out.reasoning
    finish = finish_reason(fin.reason)
    if out.calls:
        msg.content = out.content or None
        msg.tool_calls = [
            ToolCallOut(id=new_id("call_"), type="function", function=FunctionOut(name=n, arguments=a))
            for n, a in out.calls
        ]
        if reports_calls(fin.reason, len(out.calls), out.unclosed):
            finish = "tool_calls"
    return ChatCompletion(
        id=cid,
        created=created,
        model=model,
        choices=[Choice(index=0, message=msg, finish_reason=finish)],
        usage=usage_of(fin, cached),
    )


class ChatStream:
    """Builds the SSE frames of one streamed completion in the order of docs/protocols.md §4: role chunk, reasoning
    chunks, content chunks, tool-call fragments (first per call: index, id, type, name, empty arguments; then
    index + argument pieces), finish chunk, usage chunk (include_usage only; every earlier chunk then carries
    ``usage: null``), ``[DONE]``. An error after the start is a ``data: {"error": ...}`` frame and no ``[DONE]``."""

    __slots__ = (
        "cid",
        "created",
        "model",
        "include_usage",
        "cached",
        "_enc",
        "_parser",
        "tool_calls",
        "_text_frames",
    )

    def __init__(
        self,
        cid: str,
        created: int,
        model: str,
        include_usage: bool,
        thinking: bool = False,
        tools: list[dict[str, Any]] | None = None,
        cached: bool = False,
    ) -> None:
        self.cid, self.created, self.model, self.include_usage = cid, created, model, include_usage
        self.cached = cached  # the usage chunk reports prompt_tokens_details (usage_of)
        self._enc = msgspec.json.Encoder()
        self._parser = OutputParser(thinking, tools)
        self.tool_calls = 0
        # the frames of a content / reasoning delta, cut around the text: each one is then one string encoded
        # between two fixed byte strings, not three Structs built and encoded (the same bytes: test_api_units)
        self._text_frames = {
            "text": self._cut(ChunkDelta(content=_MARK)),
            "reasoning": self._cut(ChunkDelta(reasoning_content=_MARK)),
        }

    def _cut(self, delta: ChunkDelta) -> tuple[bytes, bytes] | None:
        parts = self._chunk(delta).split(self._enc.encode(_MARK))
        return (parts[0], parts[1]) if len(parts) == 2 else None  # None: the model name holds the mark

    def _frame(self, obj: Any) -> bytes:
        return b"data: " + self._enc.encode(obj) + b"\n\n"

    def _text(self, kind: str, text: str) -> bytes:
        cut = self._text_frames[kind]
        if cut is None:
            delta = ChunkDelta(content=text) if kind == "text" else ChunkDelta(reasoning_content=text)
            return self._chunk(delta)
        return cut[0] + self._enc.encode(text) + cut[1]

    def _chunk(self, delta: ChunkDelta, finish: str | None = None) -> bytes:
        chunk = ChatCompletionChunk(
            id=self.cid,
            created=self.created,
            model=self.model,
            choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)],
            usage=None if self.include_usage else msgspec.UNSET,
        )
        return self._frame(chunk)

    def role(self) -> bytes:
        return self._chunk(ChunkDelta(role="assistant", content=""))

    start = role

    def content(self, text: str) -> bytes:
        return self._text("text", text)

    def text(self, text: str) -> bytes:
        return self._events(self._parser.push(text))

    def _events(self, events: list[tuple]) -> bytes:
        out = b""
        for ev in events:
            kind = ev[0]
            if kind == "reasoning" or kind == "text":
                out += self._text(kind, ev[1])
            elif kind == "start":
                self.tool_calls += 1
                call = ToolCallOut(
                    index=ev[1],
                    id=new_id("call_"),
                    type="function",
                    function=FunctionOut(name=ev[2], arguments=""),
                )
                out += self._chunk(ChunkDelta(tool_calls=[call]))
            elif kind == "args":
                out += self._chunk(
                    ChunkDelta(tool_calls=[ToolCallOut(index=ev[1], function=FunctionOut(arguments=ev[2]))])
                )
        return out

    def finish(self, fin: Finish) -> bytes:
        out = self._events(self._parser.finish())
        called = reports_calls(fin.reason, self.tool_calls, self._parser.unclosed)
        reason = "tool_calls" if called else finish_reason(fin.reason)
        out += self._chunk(ChunkDelta(), reason)
        if self.include_usage:
            usage = ChatCompletionChunk(
                id=self.cid,
                created=self.created,
                model=self.model,
                choices=[],
                usage=usage_of(fin, self.cached),
            )
            out += self._frame(usage)
        return out + b"data: [DONE]\n\n"

    def error(self, err: ApiError) -> bytes:
        return self._frame(err.body())
