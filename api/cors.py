"""CORS headers of ``--cors`` (docs/protocols.md §3): any origin, ninfer's allowed headers and, on a preflight,
every header the browser asks to send; ``Retry-After`` readable by the page."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ALLOW_HEADERS", "allowed_headers", "with_cors"]

ALLOW_HEADERS = b"Authorization, Content-Type, x-api-key, anthropic-version, X-Client-Name"
_CORS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    # what the SDKs read from a refusal to time their retry: a browser hides any other header from the page
    (b"access-control-expose-headers", b"Retry-After"),
]
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (an RFC 9110 §5.6.2 token)


def allowed_headers(scope: dict[str, Any]) -> bytes:
    """The headers a browser may send: ninfer's own list, and on a preflight also every header it asks for. The
    official SDKs send their own (``X-Stainless-*``, ``anthropic-dangerous-direct-browser-access``,
    ``anthropic-beta``, ``OpenAI-Organization``, ...), and a browser drops the request when one is not allowed;
    with ``Allow-Origin: *`` and no credentials, allowing what was asked gives nothing away (the key is checked
    on the request itself)."""
    if scope["method"] != "OPTIONS":
        return ALLOW_HEADERS
    asked = b",".join(v for k, v in scope["headers"] if k.lower() == b"access-control-request-headers")
    extra = [n for n in (n.strip() for n in asked.split(b",")) if _TOKEN.fullmatch(n)]
    return b", ".join([ALLOW_HEADERS, *extra]) if extra else ALLOW_HEADERS


def with_cors(send: Any, scope: dict[str, Any]) -> Any:
    """``send`` with the CORS headers added to the response start."""
    cors = [*_CORS, (b"access-control-allow-headers", allowed_headers(scope))]

    async def cors_send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            msg = {**msg, "headers": [*msg.get("headers", []), *cors]}
        await send(msg)

    return cors_send
