"""msgspec models of the OpenAI Responses request, response object and SSE event payloads (docs/protocols.md §6).

Output items, content parts and events carry their ``type`` as a msgspec tag (always encoded, first). Every
event has a ``sequence_number``, set by the stream as it encodes the event; the SSE ``event:`` name is the tag
(:func:`event_name`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ResponsesRequest",
    "ReasoningText",
    "OutputText",
    "ReasoningItem",
    "MessageItem",
    "FunctionCallItem",
    "OutputItem",
    "InputTokensDetails",
    "OutputTokensDetails",
    "Usage",
    "IncompleteDetails",
    "ResponseError",
    "Response",
    "Event",
    "ResponseCreated",
    "ResponseInProgress",
    "ResponseCompleted",
    "ResponseIncomplete",
    "ResponseFailed",
    "OutputItemAdded",
    "OutputItemDone",
    "ContentPartAdded",
    "ContentPartDone",
    "OutputTextDelta",
    "OutputTextDone",
    "ReasoningTextDelta",
    "ReasoningTextDone",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "StreamEvent",
    "event_name",
]


# ---- request --------------------------------------------------------------------------------------------
class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None  # accepted, nothing is stored (docs/protocols.md §6)
    background: bool | None = None  # true is refused: it needs a stored response to poll (api/responses.py)
    previous_response_id: str | None = None
    conversation: Any = None  # stored server-side state: refused like previous_response_id (api/responses.py)
    prompt: Any = None  # a stored prompt template (id, variables): refused, nothing is stored
    metadata: dict[str, Any] | None = None
    user: str | None = None
    top_logprobs: int | None = None  # refused when > 0 (api/validation.py)


class _Typed(msgspec.Struct, kw_only=True, tag_field="type"):
    """Base of every response-side shape whose ``type`` names it."""


# ---- output items ---------------------------------------------------------------------------------------
class ReasoningText(_Typed, kw_only=True, tag="reasoning_text"):
    text: str


class OutputText(_Typed, kw_only=True, tag="output_text"):
    text: str
    annotations: list[Any] = []


class ReasoningItem(_Typed, kw_only=True, tag="reasoning"):
    id: str
    summary: list[Any] = []
    status: str
    content: list[ReasoningText]


class MessageItem(_Typed, kw_only=True, tag="message"):
    id: str
    role: Literal["assistant"] = "assistant"
    status: str
    content: list[OutputText]  # exactly one part: content_index is always 0


class FunctionCallItem(_Typed, kw_only=True, tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


# ---- response object ------------------------------------------------------------------------------------
class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct, kw_only=True):
    reason: str


class ResponseError(msgspec.Struct, kw_only=True):
    code: str
    message: str


class Response(msgspec.Struct, kw_only=True):
    """Every field is always present (nulls included); the request's settings are echoed back."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    model: str
    output: list[OutputItem]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    parallel_tool_calls: bool
    temperature: float | None
    top_p: float | None
    tool_choice: Any
    tools: list[Any]
    text: Any
    reasoning: Any
    metadata: dict[str, Any]
    usage: Usage | None


# ---- stream events --------------------------------------------------------------------------------------
class Event(_Typed, kw_only=True):
    sequence_number: int = 0  # set by the stream when the event is encoded


class _ResponseState(Event, kw_only=True):
    response: Response


class ResponseCreated(_ResponseState, tag="response.created"):
    pass


class ResponseInProgress(_ResponseState, tag="response.in_progress"):
    pass


class ResponseCompleted(_ResponseState, tag="response.completed"):
    pass


class ResponseIncomplete(_ResponseState, tag="response.incomplete"):
    pass


class ResponseFailed(_ResponseState, tag="response.failed"):
    pass


class _ItemEvent(Event, kw_only=True):
    output_index: int
    item: OutputItem


class OutputItemAdded(_ItemEvent, tag="response.output_item.added"):
    pass


class OutputItemDone(_ItemEvent, tag="response.output_item.done"):
    pass


class _InItem(Event, kw_only=True):
    item_id: str
    output_index: int


class _InPart(_InItem, kw_only=True):
    content_index: int = 0


class ContentPartAdded(_InPart, kw_only=True, tag="response.content_part.added"):
    part: OutputText


class ContentPartDone(_InPart, kw_only=True, tag="response.content_part.done"):
    part: OutputText


class OutputTextDelta(_InPart, kw_only=True, tag="response.output_text.delta"):
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_InPart, kw_only=True, tag="response.output_text.done"):
    text: str
    logprobs: list[Any] = []


class ReasoningTextDelta(_InPart, kw_only=True, tag="response.reasoning_text.delta"):
    delta: str


class ReasoningTextDone(_InPart, kw_only=True, tag="response.reasoning_text.done"):
    text: str


class FunctionCallArgumentsDelta(_InItem, kw_only=True, tag="response.function_call_arguments.delta"):
    delta: str


class FunctionCallArgumentsDone(_InItem, kw_only=True, tag="response.function_call_arguments.done"):
    name: str
    arguments: str


StreamEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
)


def event_name(ev: Event) -> str:
    """The SSE ``event:`` name, equal to the payload's ``type``."""
    return ev.__struct_config__.tag  # type: ignore[return-value]
