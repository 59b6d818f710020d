"""msgspec models of the Anthropic Messages request, response body and SSE event payloads (docs/protocols.md §5).

Response-side types carry their ``type`` as a msgspec tag (always encoded, first), so a content block, a delta
or an event is one Struct per shape. The SSE ``event:`` name of a stream event is its tag (:func:`event_name`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "AnthropicRequest",
    "ThinkingBlock",
    "TextBlock",
    "ToolUseBlock",
    "ContentBlock",
    "Usage",
    "Message",
    "TextDelta",
    "ThinkingDelta",
    "SignatureDelta",
    "InputJsonDelta",
    "BlockDelta",
    "MessageStart",
    "ContentBlockStart",
    "ContentBlockDelta",
    "ContentBlockStop",
    "StopInfo",
    "DeltaUsage",
    "MessageDelta",
    "MessageStop",
    "ErrorDetail",
    "ErrorEvent",
    "StreamEvent",
    "CountTokens",
    "event_name",
]


# ---- request --------------------------------------------------------------------------------------------
class AnthropicRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # {format: {type: json_schema, schema}, effort}
    output_format: dict[str, Any] | None = None  # the older top-level form of output_config.format


class _Typed(msgspec.Struct, kw_only=True, tag_field="type"):
    """Base of every response-side shape whose ``type`` names it."""


# ---- content blocks -------------------------------------------------------------------------------------
class ThinkingBlock(_Typed, tag="thinking"):
    thinking: str
    signature: str = ""  # this server signs nothing; the field is present because clients expect it


class TextBlock(_Typed, tag="text"):
    text: str


class ToolUseBlock(_Typed, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = ThinkingBlock | TextBlock | ToolUseBlock


# ---- message body ---------------------------------------------------------------------------------------
class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The body's usage has all four counts; ``message_start``'s only input and output tokens."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | UnsetType = UNSET
    cache_creation_input_tokens: int | UnsetType = UNSET


class Message(_Typed, kw_only=True, tag="message"):
    id: str
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage


# ---- stream deltas --------------------------------------------------------------------------------------
class TextDelta(_Typed, tag="text_delta"):
    text: str


class ThinkingDelta(_Typed, tag="thinking_delta"):
    thinking: str


class SignatureDelta(_Typed, tag="signature_delta"):
    signature: str = ""


class InputJsonDelta(_Typed, tag="input_json_delta"):
    partial_json: str


BlockDelta = TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


# ---- stream events --------------------------------------------------------------------------------------
class MessageStart(_Typed, tag="message_start"):
    message: Message


class ContentBlockStart(_Typed, tag="content_block_start"):
    index: int
    content_block: ContentBlock


class ContentBlockDelta(_Typed, tag="content_block_delta"):
    index: int
    delta: BlockDelta


class ContentBlockStop(_Typed, tag="content_block_stop"):
    index: int


class StopInfo(msgspec.Struct, kw_only=True):
    stop_reason: str
    stop_sequence: str | None


class DeltaUsage(msgspec.Struct, kw_only=True):
    """``message_delta``'s usage: cumulative totals, all four as in the non-streamed body (the SDKs' stream
    accumulators take each count given here over ``message_start``'s, which cannot know the cached tokens yet)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int = 0


class MessageDelta(_Typed, tag="message_delta"):
    delta: StopInfo
    usage: DeltaUsage


class MessageStop(_Typed, tag="message_stop"):
    pass


class ErrorDetail(msgspec.Struct, kw_only=True):
    type: str
    message: str


class ErrorEvent(_Typed, tag="error"):
    """Both the error body of a failed request and the ``error`` event of a failed stream."""

    error: ErrorDetail


StreamEvent = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | ErrorEvent
)


class CountTokens(msgspec.Struct, kw_only=True):
    input_tokens: int


def event_name(ev: StreamEvent) -> str:
    """The SSE ``event:`` name, which Anthropic makes equal to the payload's ``type``."""
    return ev.__struct_config__.tag  # type: ignore[return-value]
