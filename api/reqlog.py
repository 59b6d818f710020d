"""The request JSONL log (docs/protocols.md §9, schema_version 2, extended): written by one background thread.

The request path only puts a dict on a queue. The writer appends one JSON line per record and flushes it; after a
write failure logging turns itself off and says so once on stderr. Records carry token counts, timings and client
names — never prompt or response text, never keys (callers pass only those fields; nothing here inspects bodies).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["RequestLog", "RequestLogError"]

_STOP = object()


class RequestLogError(ValueError):
    """The log file cannot be used (missing directory, unwritable, or the artifact itself)."""


class RequestLog:
    def __init__(self, path: str | os.PathLike[str], *, artifact: str | None = None) -> None:
        p = Path(path)
        if artifact is not None and p.resolve() == Path(artifact).resolve():
            raise RequestLogError(f"--request-log-jsonl: {str(p)!r} is the artifact path")
        if not p.parent.is_dir():
            raise RequestLogError(f"--request-log-jsonl: directory {str(p.parent)!r} does not exist")
        try:
            self._file = open(p, "ab")  # noqa: SIM115 - owned by the writer thread until close()
        except OSError as e:
            raise RequestLogError(f"--request-log-jsonl: cannot open {str(p)!r}: {e.strerror}") from None
        self.path = p
        self.instance_id = f"serve-{os.getpid()}-{time.time_ns() // 1000}"
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._next_id = 0
        self._enabled = True
        self._thread = threading.Thread(target=self._run, name="ninfer-reqlog", daemon=True)
        self._thread.start()

    def next_request_id(self) -> int:
        """Monotonic request ids, unique per process (called on the event-loop thread only)."""
        self._next_id += 1
        return self._next_id

    def write(self, event: str, **fields: Any) -> None:
        if not self._enabled:
            return
        rec = {
            "artifact_type": "ninfer_serve_request_log",
            "schema_version": 2,
            "event": event,
            "timestamp_unix_ms": time.time_ns() // 1_000_000,
            "server_instance_id": self.instance_id,
        }
        rec.update(fields)
        self._q.put(rec)

    def _run(self) -> None:
        enc = msgspec.json.Encoder()
        while True:
            rec = self._q.get()
            if rec is _STOP:
                break
            if not self._enabled:
                continue
            try:
                self._file.write(enc.encode(rec) + b"\n")
                self._file.flush()
            except (OSError, TypeError, ValueError) as e:
                self._enabled = False
                print(f"ninfer: request log disabled after a write failure: {e}", file=sys.stderr)

    def close(self) -> None:
        """Drain what was queued, then close the file. Safe to call twice."""
        if self._thread.is_alive():
            self._q.put(_STOP)
            self._thread.join(timeout=5)
        self._file.close()
