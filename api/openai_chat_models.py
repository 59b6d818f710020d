"""msgspec models of the OpenAI Chat Completions request and response bodies (docs/protocols.md §4), the model list
and the health body.

Request fields are decoded leniently where the spec says "ignored" (unknown fields are dropped) and strictly
where it names a type, so a wrong type fails in msgspec with the field path, which becomes the error's ``param``.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ninfer.engine.core import SpeculativeUsage

__all__ = [
    "ContentPart",
    "ToolCallFunction",
    "ToolCallIn",
    "ChatMessage",
    "StreamOptions",
    "ChatRequest",
    "PromptTokensDetails",
    "CompletionTokensDetails",
    "Usage",
    "FunctionOut",
    "ToolCallOut",
    "AssistantMessage",
    "Choice",
    "ChatCompletion",
    "ChunkDelta",
    "ChunkChoice",
    "ChatCompletionChunk",
    "ModelObject",
    "ModelList",
    "HealthStatus",
]


# ---- request --------------------------------------------------------------------------------------------
class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: Any = None
    image_url: Any = None
    video_url: Any = None


class ToolCallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCallIn(msgspec.Struct, kw_only=True):
    id: str
    function: ToolCallFunction
    type: str = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class ChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    enable_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # "none" turns thinking off (docs/protocols.md §8)
    thinking_budget: int | None = None  # extension: force </think> after this many reasoning tokens
    parallel_tool_calls: bool | None = None
    response_format: Any = None
    user: str | None = None
    ignore_eos: bool = False  # extension (as vLLM): generate past end-of-sequence tokens, for load tests
    # Decoded so that a client relying on them gets a 400 naming the field (api/validation.py), not silence:
    logprobs: bool | None = None
    top_logprobs: int | None = None
    guided_json: Any = None  # vLLM
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None


# ---- response -------------------------------------------------------------------------------------------
class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class CompletionTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET  # --prompt-tokens-details
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET
    speculative: SpeculativeUsage | UnsetType = UNSET  # extension: drafted/accepted/rounds with --spec mtp


class FunctionOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str


class ToolCallOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool call in a message (no ``index``) or a streamed fragment (``index``; id/type/name only first)."""

    function: FunctionOut
    index: int | UnsetType = UNSET
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET


class AssistantMessage(msgspec.Struct, kw_only=True):
    content: str | None
    role: Literal["assistant"] = "assistant"
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class Choice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"


class ChunkDelta(msgspec.Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """``usage`` is UNSET (absent) without include_usage; with it, null on every chunk but the last."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None | UnsetType = UNSET


class ModelObject(msgspec.Struct, kw_only=True):
    """OpenAI's model object (``id, object, created, owned_by``) plus the fields of Anthropic's (``type,
    display_name, created_at``): the two APIs share the path, and each SDK ignores the other's fields."""

    id: str
    created: int
    object: Literal["model"] = "model"
    owned_by: str = "ninfer"
    type: Literal["model"] = "model"
    display_name: str = ""
    created_at: str = ""  # RFC 3339

    def __post_init__(self) -> None:
        self.display_name = self.display_name or self.id
        if not self.created_at:
            stamp = datetime.datetime.fromtimestamp(self.created, datetime.UTC)
            self.created_at = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


class ModelList(msgspec.Struct, kw_only=True):
    """OpenAI's list, with Anthropic's paging fields (one page: ``has_more`` false)."""

    data: list[ModelObject]
    object: Literal["list"] = "list"
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    def __post_init__(self) -> None:
        if self.data and self.first_id is None:
            self.first_id, self.last_id = self.data[0].id, self.data[-1].id


class HealthStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GET /health``: ``{"status": "ok"}``, or ``unavailable`` with the reason in ``detail``."""

    status: str
    detail: str | UnsetType = UNSET
    replicas: dict[str, str] | UnsetType = UNSET  # with --replicas: each replica's status by name
