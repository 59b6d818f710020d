"""Connection limits uvicorn does not have: a deadline for each request head and a cap on open connections.

uvicorn closes a connection that stays idle after a response (``--keep-alive-timeout-s``), but a connection that
opens and sends half a request head, or nothing, stays open forever (uvicorn has no head timeout; h11 bounds
only the head's size), and there is no limit on how many there are (``limit_concurrency`` answers 503 only once
a head is complete). ``guarded_protocol`` wraps uvicorn's HTTP/1.1 protocol class (whichever ``http="auto"``
picks: h11 or httptools; both keep the same ``cycle`` and ``connections`` attributes) with:

- a head deadline: from the moment a connection waits for a request head (connection made, or the first byte of
  the next head on a kept-alive connection) it has ``head_timeout_s`` to complete it, else it is closed (a head
  trickled a byte at a time included: the deadline is not moved by the bytes that do arrive);
- a connection cap: a connection beyond ``max_connections`` is answered ``503`` with ``Retry-After`` and closed;
  the answer waits (at most ``REFUSE_WAIT_S``) for the request line, so that its path picks the error shape:
  Anthropic's ``529 overloaded_error`` under ``/v1/messages``, OpenAI's ``503 server_busy`` elsewhere. At most
  ``max_connections`` refused connections wait so at once; beyond that the OpenAI answer goes out at once;
- a request the HTTP parser cannot read gets a JSON ``400`` in its path's error shape (OpenAI's when the request
  line is unreadable too) instead of uvicorn's text; a head h11 refuses for its size (over ``HEAD_MAX``) gets
  ``431`` (RFC 6585) instead, so the client knows what to shorten.

These answers are written before the request was read in full. The connection then shuts its sending side and
discards what the client still sends until it hangs up (at most ``LINGER_S``): closing with unread bytes would
make the kernel reset the connection, and a reset can destroy the answer before the client reads it.

A body that stops arriving, or arrives too slowly, is the gate's business (api/gate.py: ``--body-timeout-s``
between two pieces, ``--body-deadline-s`` for the whole body).
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .errors import error_json

__all__ = ["guarded_protocol", "error_response", "request_path", "REFUSE_WAIT_S", "LINGER_S", "HEAD_MAX"]

_LOG = logging.getLogger("ninfer.api")
REFUSE_WAIT_S = 1.0  # most time a refused connection gets to send its request line (its path picks the shape)
LINGER_S = 2.0  # after an early answer: most time to discard what the client still sends before closing
_LINE_MAX = 8192  # bytes of a head kept to find its request line
HEAD_MAX = 16 * 1024  # h11's bound on an incomplete request head (uvicorn's default): past it, 431


def request_path(head: bytes) -> str | None:
    """The path of the request line at the start of ``head`` (``POST /v1/messages?beta=true HTTP/1.1``), or None
    while that line is incomplete or is not one."""
    line, sep, _ = head.partition(b"\r\n")
    parts = line.split(b" ")
    if not sep or len(parts) != 3 or not parts[1].startswith(b"/"):
        return None
    return parts[1].split(b"?", 1)[0].decode("latin-1")


def error_response(
    path: str | None, status: int, message: str, code: str, retry_after: float | None = None
) -> bytes:
    """A complete HTTP/1.1 response (``connection: close``) with the error body of ``path``'s protocol."""
    from .anthropic import error_class  # noqa: PLC0415 - the protocol modules are not needed before a request

    err = error_class(path or "")(status, message, code=code, retry_after=retry_after)
    body = error_json(err)
    try:
        reason = HTTPStatus(err.status).phrase
    except ValueError:  # 529, Anthropic's own
        reason = "Overloaded"
    head = [f"HTTP/1.1 {err.status} {reason}", "content-type: application/json"]
    head += [f"{k.lower()}: {v}" for k, v in err.headers().items() if k.lower() != "connection"]
    head += ["connection: close", f"content-length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def guarded_protocol(head_timeout_s: float, max_connections: int, base: type[Any] | None = None) -> type[Any]:
    """uvicorn's protocol class ``base`` (default: its auto choice) with a head deadline and a connection cap."""
    parent: type[Any] = base or AutoHTTPProtocol
    waiting = [0]  # refused connections still open (waiting for a request line, lingering): not counted

    class GuardedHTTP(parent):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _refused = False  # over the cap and counted in ``waiting``
        _answered = False  # an early answer went out: what arrives now is discarded
        _head: bytes = b""  # the start of the current head, until its request line is complete
        _head_bytes = 0  # bytes received while waiting for the current head, until its blank line
        _head_tail = b""  # the last 3 of them (the blank line may straddle two reads)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) - waiting[0] > max_connections:
                _LOG.warning("refused a connection: %d open (--max-connections)", max_connections)
                if waiting[0] >= max_connections:  # a flood of them: no time to wait for request lines
                    self._answer(error_response(None, 503, "too many open connections", "server_busy", 1.0))
                    return
                waiting[0] += 1
                self._refused = True
                self._head_timer = self.loop.call_later(REFUSE_WAIT_S, self._refuse)
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._answered:
                return
            if self._head_timer is None and self._waiting_for_head():
                self._arm()  # the first byte of the next head on a kept-alive connection
                self._head, self._head_bytes, self._head_tail = b"", 0, b""
            if self._waiting_for_head() and self._head_tail != b"\r\n\r\n":
                seen = self._head_tail + data
                end = seen.find(b"\r\n\r\n")
                self._head_bytes += len(data) if end < 0 else end + 4 - len(self._head_tail)
                self._head_tail = b"\r\n\r\n" if end >= 0 else seen[-3:]
            if len(self._head) < _LINE_MAX and b"\r\n" not in self._head:
                self._head += data[: _LINE_MAX - len(self._head)]
            if self._refused:
                if b"\r\n" in self._head or len(self._head) >= _LINE_MAX:
                    self._refuse()
                return
            super().data_received(data)
            if not self._answered and not self._waiting_for_head():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._refused:
                self._refused = False
                waiting[0] -= 1
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """What the HTTP parser could not read (a bad request line, header or Content-Length): uvicorn's
            own answer is a text/plain 400; this one is JSON in the error shape of the request line's path
            (OpenAI's if there is none), and the connection closes as before (uvicorn has logged the warning)."""
            path = request_path(self._head)
            if self._waiting_for_head() and self._head_bytes > HEAD_MAX:  # what h11 refuses for its size
                msg = f"request head exceeds {HEAD_MAX >> 10} KiB"
                self._answer(error_response(path, 431, msg, "request_header_too_large"))
                return
            self._answer(error_response(path, 400, "malformed HTTP request", "bad_http_request"))

        def _refuse(self) -> None:
            path = request_path(self._head)
            self._answer(error_response(path, 503, "too many open connections", "server_busy", 1.0))

        def _answer(self, response: bytes) -> None:
            """Write an early answer, then linger: shut the sending side, discard what arrives, close when the
            client hangs up or after ``LINGER_S``."""
            self._disarm()
            self._answered = True
            if self.transport.is_closing():
                return
            self.transport.write(response)
            if not self.transport.can_write_eof():
                self.transport.close()
                return
            self.transport.write_eof()
            self._head_timer = self.loop.call_later(LINGER_S, self.transport.close)

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._waiting_for_head() and not self.transport.is_closing():
                self.transport.close()

    GuardedHTTP.__name__ = GuardedHTTP.__qualname__ = f"Guarded{parent.__name__}"
    return GuardedHTTP
