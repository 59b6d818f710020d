"""Reading the server's request JSONL log (``--request-log-jsonl``, docs/protocols.md §9) for the corpus runner.

A streamed request is matched to its log record by the id the client saw (``chatcmpl-…``, ``msg_…``, ``resp_…``),
which the server logs as ``request.engine_request_id``. The log is written by a background thread after the
response ends, so the reader polls until every expected id has its final record or the wait runs out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["LogJoin", "read_log", "wait_for", "join_record"]

FINAL_EVENTS = ("request_done", "request_error")


class LogJoin(msgspec.Struct, kw_only=True):
    """What the server logged about one request (its final record)."""

    event: str  # request_done | request_error
    request_id: int  # the server's monotonic log id
    server_instance_id: str
    finish_reason: str | None = None  # the engine's reason (stop_token, output_limit, ...)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    tool_call_count: int | None = None
    lane: int | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    engine_ttft_s: float | None = None
    server_ttft_s: float | None = None
    total_s: float | None = None
    speculative: dict[str, Any] | None = None
    error: str | None = None


def read_log(path: str | Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(final records by engine request id, server_start records). Lines that are not JSON objects (a line
    being written as we read) are skipped."""
    finals: dict[str, dict[str, Any]] = {}
    starts: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("event") == "server_start":
                starts.append(rec)
            elif rec.get("event") in FINAL_EVENTS:
                rid = (rec.get("request") or {}).get("engine_request_id")
                if rid is not None:
                    finals[str(rid)] = rec
    return finals, starts


def wait_for(
    path: str | Path, ids: set[str], timeout_s: float
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """``read_log`` again until every id in ``ids`` has a final record or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        finals, starts = read_log(path)
        if ids <= finals.keys() or time.monotonic() >= deadline:
            return finals, starts
        time.sleep(0.1)


def _spec(result: dict[str, Any]) -> dict[str, Any] | None:
    found = {k: v for k, v in result.items() if any(w in k for w in ("specul", "draft", "accepted"))}
    return found or None


def join_record(rec: dict[str, Any]) -> LogJoin:
    result, t = rec.get("result") or {}, rec.get("timings_seconds") or {}
    return LogJoin(
        event=rec["event"],
        request_id=int(rec["request"]["request_id"]),
        server_instance_id=str(rec.get("server_instance_id", "")),
        finish_reason=result.get("finish_reason"),
        prompt_tokens=result.get("prompt_tokens"),
        cached_tokens=result.get("cached_tokens"),
        completion_tokens=result.get("completion_tokens"),
        reasoning_tokens=result.get("reasoning_tokens"),
        tool_call_count=result.get("tool_call_count"),
        lane=result.get("lane"),
        queue_s=t.get("queue"),
        prefill_s=t.get("prefill"),
        decode_s=t.get("decode"),
        engine_ttft_s=t.get("engine_ttft"),
        server_ttft_s=t.get("ttft"),
        total_s=t.get("total"),
        speculative=_spec(result),
        error=(rec.get("error") or {}).get("message"),
    )
