"""The ASGI gate in front of the Litestar app: CORS preflight, API-key check, the body-size cap, the body read
timeout and, while the server drains for shutdown, the refusal of new requests.

It runs before routing (as upstream does), so an unknown path without a key is a 401, not a 404, and an
oversized body is refused before anything parses it. Every refusal uses the error shape of its path (Anthropic's
under ``/v1/messages``, OpenAI's elsewhere), including a 413 found only while a chunked body is being read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .auth import KeyRing, extract_key
from .drain import Drain
from .errors import ApiError, error_json

__all__ = ["Gate", "KEY_NAME_SCOPE"]

KEY_NAME_SCOPE = "ninfer.key_name"  # scope key: who the API key that authenticated the request belongs to
_CORS = [
    (b"access-control-allow-origin", b"*"),
    (
        b"access-control-allow-headers",
        b"Authorization, Content-Type, x-api-key, anthropic-version, X-Client-Name",
    ),
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
]
_OPEN_PATHS = frozenset({"/health"})
_WHILE_DRAINING = frozenset({"/health", "/metrics"})  # still answered while the server drains

OnRefusal = Callable[[str, ApiError], None]  # (path, error): called for every 5xx the gate answers


class Gate:
    def __init__(
        self,
        app: Any,
        *,
        keyring: KeyRing | None,
        max_body_bytes: int,
        cors: bool,
        body_timeout_s: float | None = None,
        drain: Drain | None = None,
        on_refusal: OnRefusal | None = None,
    ) -> None:
        self.app = app
        self.keyring = keyring
        self.max_body_bytes = max_body_bytes
        self.cors = cors
        self.body_timeout_s = body_timeout_s
        self.drain = drain
        self.on_refusal = on_refusal

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.cors:
            send = self._with_cors(send)
            if scope["method"] == "OPTIONS":
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        if self.drain is not None and self.drain.draining and scope["path"] not in _WHILE_DRAINING:
            err = _error(scope, 503, "the server is shutting down", "shutting_down", retry_after=1.0)
            if self.on_refusal is not None:
                self.on_refusal(scope["path"], err)
            await _reply(send, err)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.keyring is not None and self.keyring.enabled and scope["path"] not in _OPEN_PATHS:
            who = self.keyring.identify(extract_key(headers))
            if who is None:
                await _reply(send, _error(scope, 401, "missing or invalid API key", "invalid_api_key"))
                return
            scope[KEY_NAME_SCOPE] = who
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _reply(send, self._too_large(scope))
            return
        if self.drain is not None:
            self.drain.inflight += 1
        try:
            await self.app(scope, self._reading(scope, receive), send)
        finally:
            if self.drain is not None:
                self.drain.inflight -= 1

    def _too_large(self, scope: dict[str, Any]) -> ApiError:
        mib = self.max_body_bytes >> 20
        return _error(scope, 413, f"request body exceeds the {mib} MiB limit", "request_too_large")

    def _reading(self, scope: dict[str, Any], receive: Any) -> Any:
        """A receive that raises 413 once a chunked body passes the cap (Content-Length was absent or lied) and
        408 when the next piece of the body takes longer than the body timeout."""
        seen = 0
        body_done = False

        async def guarded() -> dict[str, Any]:
            nonlocal seen, body_done
            if body_done or self.body_timeout_s is None:
                msg = await receive()  # after the body only the disconnect is left to wait for
            else:
                try:
                    msg = await asyncio.wait_for(receive(), self.body_timeout_s)
                except TimeoutError:
                    raise _error(
                        scope, 408, f"no request body data for {self.body_timeout_s:g} s", "request_timeout"
                    ) from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                body_done = not msg.get("more_body", False)
                if seen > self.max_body_bytes:
                    raise self._too_large(scope)
            return msg

        return guarded

    @staticmethod
    def _with_cors(send: Any) -> Any:
        async def cors_send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), *_CORS]}
            await send(msg)

        return cors_send


def _error(
    scope: dict[str, Any], status: int, message: str, code: str | None, retry_after: float | None = None
) -> ApiError:
    from .anthropic import error_class

    return error_class(scope["path"])(status, message, code=code, retry_after=retry_after)


async def _reply(send: Any, err: ApiError) -> None:
    body = error_json(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers().items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
