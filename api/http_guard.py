"""Connection limits uvicorn does not have: a deadline for each request head and a cap on open connections.

uvicorn closes a connection that stays idle after a response (``--keep-alive-timeout-s``), but a connection that
opens and sends half a request head, or nothing, stays open forever, and there is no limit on how many there are
(``limit_concurrency`` answers 503 only once a head is complete). ``guarded_protocol`` wraps uvicorn's HTTP/1.1
protocol class (whichever ``http="auto"`` picks: h11 or httptools; both keep the same ``cycle`` and
``connections`` attributes) with:

- a head deadline: from the moment a connection waits for a request head (connection made, or the first byte of
  the next head on a kept-alive connection) it has ``head_timeout_s`` to complete it, else it is closed;
- a connection cap: a connection beyond ``max_connections`` gets ``503`` with ``Retry-After`` and is closed;
- a request the HTTP parser cannot read gets a JSON ``400`` in the OpenAI error shape instead of uvicorn's text.

A body that stops arriving is the gate's business (api/gate.py: ``--body-timeout-s`` between two pieces).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

__all__ = ["guarded_protocol", "BUSY_RESPONSE", "BAD_REQUEST_RESPONSE"]

_LOG = logging.getLogger("ninfer.api")
_BUSY_BODY = b'{"error":{"message":"too many open connections","type":"internal_error","param":null,"code":"server_busy"}}'
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
_BAD_BODY = b'{"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":"bad_http_request"}}'
BAD_REQUEST_RESPONSE = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BAD_BODY), _BAD_BODY)
)


def guarded_protocol(head_timeout_s: float, max_connections: int, base: type[Any] | None = None) -> type[Any]:
    """uvicorn's protocol class ``base`` (default: its auto choice) with a head deadline and a connection cap."""
    parent: type[Any] = base or AutoHTTPProtocol

    class GuardedHTTP(parent):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                _LOG.warning("refused a connection: %d open (--max-connections)", len(self.connections) - 1)
                transport.write(BUSY_RESPONSE)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._waiting_for_head():
                self._arm()  # the first byte of the next head on a kept-alive connection
            super().data_received(data)
            if not self._waiting_for_head():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """What the HTTP parser could not read (a bad request line, header or Content-Length): uvicorn's
            own answer is a text/plain 400; this one is JSON in the OpenAI error shape (the path, and with it
            the protocol, is unknown), and the connection closes as before (uvicorn has logged the warning)."""
            self.transport.write(BAD_REQUEST_RESPONSE)
            self.transport.close()

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
