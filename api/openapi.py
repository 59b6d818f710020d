"""The OpenAPI document at ``GET /openapi.json`` (behind the API key, like every route but ``/health``).

Litestar generates the document from the routes. The handlers decode their bodies themselves (msgspec, with the
protocols' own errors), so Litestar cannot see the request and response models; each route's ``operation_class``
(:func:`operation`) fills them in from the msgspec Structs, whose JSON Schemas msgspec generates as components
(added to the served document by :class:`_Document`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    Operation,
    Reference,
    RequestBody,
)

from . import responses_models as rm
from .anthropic_models import AnthropicRequest, CountTokens, ErrorEvent, Message, StreamEvent
from .errors import ErrorBody
from .openai_chat_models import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    HealthStatus,
    ModelList,
    ModelObject,
)

__all__ = ["openapi_config", "operation", "ROUTE_DOCS", "ERRORS"]

_MODELS: dict[str, Any] = {
    "ChatRequest": ChatRequest,
    "ChatCompletion": ChatCompletion,
    "ChatCompletionChunk": ChatCompletionChunk,
    "AnthropicRequest": AnthropicRequest,
    "Message": Message,
    "MessagesStreamEvent": StreamEvent,
    "CountTokens": CountTokens,
    "ResponsesRequest": rm.ResponsesRequest,
    "Response": rm.Response,
    "ResponsesStreamEvent": rm.StreamEvent,
    "ErrorBody": ErrorBody,
    "ErrorEvent": ErrorEvent,
    "ModelList": ModelList,
    "ModelObject": ModelObject,
    "HealthStatus": HealthStatus,
}
_TEMPLATE = "#/components/schemas/{name}"
_REFS, _COMPONENTS = msgspec.json.schema_components(list(_MODELS.values()), ref_template=_TEMPLATE)
_SCHEMA = dict(zip(_MODELS, _REFS, strict=True))  # model name -> its schema (a $ref, or a union of $refs)

ERRORS = {400: "invalid request", 401: "missing or invalid API key", 404: "model not found",
          408: "request body too slow (--body-timeout-s, --body-deadline-s)", 413: "request too large",
          429: "admission queue full (Retry-After)", 500: "internal error",
          503: "too many connections or shutting down (Retry-After)"}  # fmt: skip
# Anthropic's own status for an overloaded service: a full queue and the connection cap (docs/protocols.md §3)
_ANTHROPIC_ERRORS = {**{k: v for k, v in ERRORS.items() if k not in (429, 503)},
                     503: "shutting down (Retry-After)",
                     529: "overloaded: admission queue full or too many connections (Retry-After)"}  # fmt: skip
_GET_ERRORS = {401: ERRORS[401], 404: ERRORS[404]}
_SSE = "text/event-stream"  # its model is the data of each event


def _content(by_media: dict[str, Any]) -> dict[str, OpenAPIMediaType]:
    """Media type -> a model name (its component) or a literal JSON Schema."""
    return {media: OpenAPIMediaType(schema=_schema(name)) for media, name in by_media.items()}


def _schema(name: str | dict[str, Any]) -> Any:
    if isinstance(name, dict):
        return name
    s = _SCHEMA[name]
    return Reference(ref=s["$ref"]) if set(s) == {"$ref"} else s


def operation(
    ok: dict[str, Any],
    *,
    request: str | None = None,
    error: str = "ErrorBody",
    errors: dict[int, str] | None = None,
) -> type[Operation]:
    """An Operation class (Litestar's ``operation_class``) for one route: ``request`` names the JSON body's
    model, ``ok`` maps media types to the 200 response's model, ``errors`` the statuses answered with ``error``."""

    @dataclass
    class _Described(Operation):
        def __post_init__(self) -> None:
            if request is not None:
                self.request_body = RequestBody(
                    content=_content({"application/json": request}), required=True
                )
            responses = {"200": OpenAPIResponse(description="OK", content=_content(ok))}
            for status, why in (errors or {}).items():
                responses[str(status)] = OpenAPIResponse(
                    description=why, content=_content({"application/json": error})
                )
            self.responses = responses  # type: ignore[assignment]

    return _Described


def _route(operation_id: str, ok: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"operation_id": operation_id, "operation_class": operation(ok, **kw)}


ROUTE_DOCS: dict[str, dict[str, Any]] = {  # keyword arguments of each route's decorator (app.py)
    "health": _route("health", {"application/json": "HealthStatus"}),
    "list_models": _route("listModels", {"application/json": "ModelList"}, errors={401: ERRORS[401]}),
    "get_model": _route("getModel", {"application/json": "ModelObject"}, errors=_GET_ERRORS),
    "metrics": _route(
        "metrics", {"text/plain; version=0.0.4": {"type": "string"}}, errors={401: ERRORS[401]}
    ),
    "chat": _route(
        "createChatCompletion",
        {"application/json": "ChatCompletion", _SSE: "ChatCompletionChunk"},
        request="ChatRequest",
        errors=ERRORS,
    ),
    "messages": _route(
        "createMessage",
        {"application/json": "Message", _SSE: "MessagesStreamEvent"},
        request="AnthropicRequest",
        error="ErrorEvent",
        errors=_ANTHROPIC_ERRORS,
    ),
    "count_tokens": _route(
        "countTokens",
        {"application/json": "CountTokens"},
        request="AnthropicRequest",
        error="ErrorEvent",
        errors=_ANTHROPIC_ERRORS,
    ),
    "responses": _route(
        "createResponse",
        {"application/json": "Response", _SSE: "ResponsesStreamEvent"},
        request="ResponsesRequest",
        errors=ERRORS,
    ),
}


class _Document(JsonRenderPlugin):
    """Serves Litestar's document with the msgspec components added (Litestar replaces the configured
    ``components.schemas`` by the ones it generated itself, which are none here)."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        components = openapi_schema.get("components") or {}
        schemas = {**(components.get("schemas") or {}), **_COMPONENTS}
        return self.render_json(request, {**openapi_schema, "components": {**components, "schemas": schemas}})


def openapi_config(version: str) -> OpenAPIConfig:
    return OpenAPIConfig(
        title="ninfer",
        version=version,
        description="OpenAI Chat Completions and Responses, Anthropic Messages (docs/serving.md).",
        # The document's router lives at /openapi.json itself (its plugin at the router's root): a router at "/"
        # would also catch every unknown GET path with Litestar's HTML 404 page.
        path="/openapi.json",
        render_plugins=[_Document(path="/", media_type="application/json")],
    )
