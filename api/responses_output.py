"""OpenAI Responses output (docs/protocols.md §6): the response object and the SSE events of a streamed one, built from
responses_models.py. Streamed items and the final ``response.completed`` carry the same ids (clients match them);
every event has a ``sequence_number``; there is no ``[DONE]``."""

from __future__ import annotations

import msgspec

from ninfer.engine.core import Finish

from .errors import ApiError
from .protocol_shared import Output, OutputParser, hit_limit, new_id, reports_calls
from .responses_models import (
    ContentPartAdded,
    ContentPartDone,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    Response,
    ResponseCompleted,
    ResponseCreated,
    ResponseError,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponsesRequest,
    Usage,
    event_name,
)

__all__ = ["response_body", "output_items", "ResponsesStream"]


def _usage(fin: Finish) -> Usage:
    return Usage(
        input_tokens=fin.usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=fin.usage.cached_tokens),
        output_tokens=fin.usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=fin.usage.reasoning_tokens),
        total_tokens=fin.usage.prompt_tokens + fin.usage.completion_tokens,
    )


def _status(fin: Finish | None, called: bool) -> tuple[str, IncompleteDetails | None]:
    if fin is None:
        return "in_progress", None
    if hit_limit(fin.reason) and not called:
        return "incomplete", IncompleteDetails(reason="max_output_tokens")
    return "completed", None


def _reasoning_item(rid: str, text: str, status: str = "completed") -> ReasoningItem:
    return ReasoningItem(id=rid, status=status, content=[ReasoningText(text=text)])


def _message_item(mid: str, text: str, status: str = "completed") -> MessageItem:
    return MessageItem(id=mid, status=status, content=[OutputText(text=text)])


def _call_item(fid: str, call_id: str, name: str, args: str, status: str = "completed") -> FunctionCallItem:
    return FunctionCallItem(id=fid, call_id=call_id, name=name, arguments=args, status=status)


def response_body(
    rid: str,
    created: int,
    req: ResponsesRequest,
    output: list[OutputItem],
    fin: Finish | None,
    called: bool = False,
) -> Response:
    """``called``: the answer ended with completed calls (protocol.reports_calls), so the token limit reached
    just after them does not make the response incomplete."""
    status, incomplete = _status(fin, called)
    return Response(
        id=rid,
        created_at=created,
        status=status,
        model=req.model,
        output=output,
        error=None,
        incomplete_details=incomplete,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        temperature=req.temperature,
        top_p=req.top_p,
        tool_choice=req.tool_choice or "auto",
        tools=req.tools or [],
        text=req.text or {"format": {"type": "text"}},
        reasoning=req.reasoning,
        metadata=req.metadata or {},
        usage=_usage(fin) if fin is not None else None,
    )


def output_items(out: Output) -> list[OutputItem]:
    """Reasoning (if any), the message (unless only calls were made), then one item per call."""
    items: list[OutputItem] = [_reasoning_item(new_id("rs_"), out.reasoning)] if out.reasoning else []
    if out.content or not out.calls:
        items.append(_message_item(new_id("msg_"), out.content))
    items += [_call_item(new_id("fc_"), new_id("call_"), n, a) for n, a in out.calls]
    return items


class ResponsesStream:
    """Events: response.created, response.in_progress, then per output item output_item.added, its deltas
    (reasoning_text / content_part + output_text / function_call_arguments), their .done events and
    output_item.done, and finally response.completed (or response.incomplete) with the same item ids."""

    def __init__(self, rid: str, created: int, req: ResponsesRequest, thinking: bool, tools: list | None):
        self.rid, self.created, self.req = rid, created, req
        self._parser = OutputParser(thinking, tools)
        self._seq = 0
        self.items: list[OutputItem] = []
        self._open: OutputItem | None = None  # the item being streamed, as output_item.added sent it
        self._acc = ""  # its text or arguments so far
        self.tool_calls = 0

    def _ev(self, ev: Event) -> bytes:
        ev.sequence_number = self._seq
        self._seq += 1
        return b"event: " + event_name(ev).encode() + b"\ndata: " + msgspec.json.encode(ev) + b"\n\n"

    def start(self) -> bytes:
        r = response_body(self.rid, self.created, self.req, [], None)
        return self._ev(ResponseCreated(response=r)) + self._ev(ResponseInProgress(response=r))

    def _begin(self, item: OutputItem) -> bytes:
        out = self._close()
        self._open, self._acc = item, ""
        idx = len(self.items)
        out += self._ev(OutputItemAdded(output_index=idx, item=item))
        if isinstance(item, MessageItem):
            out += self._ev(ContentPartAdded(item_id=item.id, output_index=idx, part=OutputText(text="")))
        return out

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open, idx, acc = None, len(self.items), self._acc
        done: OutputItem
        if isinstance(item, ReasoningItem):
            done = _reasoning_item(item.id, acc)
            out = self._ev(ReasoningTextDone(item_id=item.id, output_index=idx, text=acc))
        elif isinstance(item, MessageItem):
            done = _message_item(item.id, acc)
            out = self._ev(OutputTextDone(item_id=item.id, output_index=idx, text=acc))
            out += self._ev(ContentPartDone(item_id=item.id, output_index=idx, part=done.content[0]))
        else:
            done = _call_item(item.id, item.call_id, item.name, acc)
            out = self._ev(FunctionCallArgumentsDone(item_id=item.id, output_index=idx, name=item.name,
                                                     arguments=acc))  # fmt: skip
        self.items.append(done)
        return out + self._ev(OutputItemDone(output_index=idx, item=done))

    def _delta(
        self, kind: type[OutputTextDelta | ReasoningTextDelta | FunctionCallArgumentsDelta], piece: str
    ) -> bytes:
        self._acc += piece
        item_id = self._open.id  # type: ignore[union-attr]
        return self._ev(kind(item_id=item_id, output_index=len(self.items), delta=piece))

    def text(self, text: str) -> bytes:
        return self._events(self._parser.push(text))

    def _events(self, events: list[tuple]) -> bytes:
        out = b""
        for ev in events:
            kind = ev[0]
            if kind == "reasoning":
                if not isinstance(self._open, ReasoningItem):
                    out += self._begin(_reasoning_item(new_id("rs_"), "", "in_progress"))
                out += self._delta(ReasoningTextDelta, ev[1])
            elif kind == "text":
                if not isinstance(self._open, MessageItem):
                    out += self._begin(_message_item(new_id("msg_"), "", "in_progress"))
                out += self._delta(OutputTextDelta, ev[1])
            elif kind == "start":
                self.tool_calls += 1
                out += self._begin(_call_item(new_id("fc_"), new_id("call_"), ev[2], "", "in_progress"))
            elif kind == "args":
                out += self._delta(FunctionCallArgumentsDelta, ev[2])
            elif kind == "end":
                out += self._close()
        return out

    def finish(self, fin: Finish) -> bytes:
        out = self._events(self._parser.finish()) + self._close()
        if all(isinstance(i, ReasoningItem) for i in self.items):
            out += self._begin(_message_item(new_id("msg_"), "", "in_progress")) + self._close()
        called = reports_calls(fin.reason, self.tool_calls, self._parser.unclosed)
        body = response_body(self.rid, self.created, self.req, self.items, fin, called)
        done = ResponseCompleted if body.status == "completed" else ResponseIncomplete
        return out + self._ev(done(response=body))

    def error(self, err: ApiError) -> bytes:
        body = response_body(self.rid, self.created, self.req, self.items, None)
        body.status, body.error = (
            "failed",
            ResponseError(code=err.code or "server_error", message=err.message),
        )
        return self._ev(ResponseFailed(response=body))
