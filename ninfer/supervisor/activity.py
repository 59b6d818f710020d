"""What the dashboard shows of the engine's work, read off the request path: the request JSONL log (tailed) and
``/metrics`` with NVML (sampled every ``interval_s``).

``RequestLog`` keeps the last ``keep`` requests (``request_start`` opens a row as running, ``request_done`` /
``request_error`` finishes it) and totals per client; a rotated or truncated log is reopened from its start.
``Sampler`` keeps a ring of samples: queue and lanes, KV pages, checkpoint pool use, evictions, prefix reuse
counters and GPU memory.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from .gpu import GpuProbe

__all__ = ["RequestLog", "Sampler", "parse_prometheus"]

_BACKFILL_BYTES = 4 << 20  # read this much of an existing log at start-up


_PEER = re.compile(
    r"^(\[[0-9a-fA-F:.]+\]|[0-9.]+):\d+$"
)  # a peer address with its port: the server's own name
# for a client without an API key; per connection, so the dashboard groups by the host


def client_label(client: str | None, claim: str | None) -> str:
    """Who a request is shown as: the API key's name (or the peer host without its port) and, in brackets,
    the name the request claims (``user`` / ``X-Client-Name``, unverified)."""
    who = client or "unknown"
    m = _PEER.match(who)
    if m:
        who = m.group(1)
    return f"{who} ({claim})" if claim else who


def _row(rec: dict[str, Any]) -> dict[str, Any]:
    req = rec.get("request", {})
    return {
        "key": f"{rec.get('server_instance_id')}/{req.get('request_id')}",
        "id": req.get("request_id"),
        "time": rec.get("timestamp_unix_ms", 0) / 1000,
        "client": client_label(req.get("client"), req.get("client_claim")),
        "client_claim": req.get("client_claim"),
        "model": req.get("model"),
        "protocol": req.get("protocol"),
        "stream": req.get("stream"),
        "status": "running",
        "queued": req.get("queued"),
        "prompt_tokens": req.get("prompt_tokens"),
        "cached_tokens": None,
        "completion_tokens": None,
        "ttft_s": None,
        "total_s": None,
        "tok_s": None,
        "finish_reason": None,
        "error": None,
    }


class RequestLog:
    """Tails the engine's request log; ``poll()`` reads what was appended since the last call."""

    def __init__(self, path: str | os.PathLike[str], keep: int = 500) -> None:
        self.path = Path(path)
        self.keep = keep
        self.rows: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.clients: dict[str, dict[str, Any]] = {}
        self.server_start: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._ino: int | None = None
        self._pos = 0
        self._partial = b""

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if st.st_ino != self._ino or st.st_size < self._pos:  # new, rotated or truncated: from its start
            first = self._ino is None
            self._ino, self._pos, self._partial = st.st_ino, 0, b""
            if first and st.st_size > _BACKFILL_BYTES:
                self._pos = st.st_size - _BACKFILL_BYTES
                self._partial = None  # type: ignore[assignment] - skip the cut line
        if st.st_size == self._pos:
            return
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read(st.st_size - self._pos)
        self._pos += len(data)
        if self._partial is None:
            data = data.split(b"\n", 1)[1] if b"\n" in data else b""
            self._partial = b""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        with self._lock:
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    self._apply(rec)

    def _apply(self, rec: dict[str, Any]) -> None:
        ev = rec.get("event")
        if ev == "server_start":
            self.server_start = rec
            return
        if ev not in ("request_start", "request_done", "request_error"):
            return
        new = _row(rec)
        row = self.rows.get(new["key"])
        if row is None:
            row = self.rows[new["key"]] = new
            c = self.clients.setdefault(row["client"], dict(client=row["client"], requests=0, running=0, errors=0,
                                        prompt_tokens=0, cached_tokens=0, completion_tokens=0, last_seen=0.0))  # fmt: skip
            c["requests"] += 1
            c["running"] += 1
            while len(self.rows) > self.keep:
                self.rows.popitem(last=False)
        c = self.clients[row["client"]]
        c["last_seen"] = max(c["last_seen"], new["time"])
        if ev == "request_start":
            return
        if row["status"] == "running":
            c["running"] -= 1
        res, t = rec.get("result") or {}, rec.get("timings_seconds") or {}
        row["end"] = new["time"]
        row["prompt_tokens"] = res.get("prompt_tokens", row["prompt_tokens"])
        row["completion_tokens"] = res.get("completion_tokens")
        row["ttft_s"], row["total_s"] = t.get("ttft"), t.get("total")
        if ev == "request_done":
            row["status"] = "done"
            row["cached_tokens"] = res.get("cached_tokens", res.get("prefix_cache_hit_tokens"))
            row["finish_reason"] = res.get("finish_reason")
            dec = t.get("decode")
            n = row["completion_tokens"] or 0
            row["tok_s"] = n / dec if dec and n > 1 else None
        else:
            row["status"] = "error"
            err = rec.get("error") or {}
            row["finish_reason"] = err.get("outcome", "error")
            row["error"] = err.get("message")
            c["errors"] += 1
        c["prompt_tokens"] += row["prompt_tokens"] or 0
        c["cached_tokens"] += row["cached_tokens"] or 0
        c["completion_tokens"] += row["completion_tokens"] or 0

    def snapshot(self, limit: int = 100) -> dict[str, Any]:
        with self._lock:
            rows = list(self.rows.values())[-limit:][::-1]
            clients = sorted(self.clients.values(), key=lambda c: -c["last_seen"])
            return {"requests": [dict(r) for r in rows], "clients": [dict(c) for c in clients]}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Each series' value by name, labelled series summed (``ninfer_requests_total`` over all outcomes)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or line.startswith("#"):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


# metric name -> sample field
_FIELDS = {
    "ninfer_queue_length": "queue",
    "ninfer_lanes_busy": "lanes_busy",
    "ninfer_lanes_total": "lanes_total",
    "ninfer_kv_pages_total": "kv_pages_total",
    "ninfer_kv_pages_free": "kv_pages_free",
    "ninfer_kv_pages_retained": "kv_pages_retained",
    "ninfer_checkpoints": "checkpoints",
    "ninfer_checkpoint_bytes": "checkpoint_bytes",
    "ninfer_checkpoint_budget_bytes": "checkpoint_budget_bytes",
    "ninfer_prefix_evicted_nodes_total": "evicted_nodes",
    "ninfer_evicted_checkpoints_total": "evicted_checkpoints",
    "ninfer_prefix_hit_tokens_total": "prefix_hit_tokens",
    "ninfer_prefill_tokens_total": "prefill_tokens",
    "ninfer_decode_tokens_total": "decode_tokens",
    "ninfer_prompt_tokens_total": "prompt_tokens",
    "ninfer_cached_prompt_tokens_total": "cached_tokens",
}


class Sampler:
    """Every ``interval_s``: poll the request log, scrape the engine's /metrics (when ``target()`` gives one)
    and read NVML; samples are kept in a ring of ``keep``."""

    def __init__(
        self,
        log: RequestLog,
        gpu: GpuProbe,
        target: Callable[[], tuple[str, dict[str, str]] | None],
        interval_s: float = 1.0,
        keep: int = 600,
    ) -> None:
        self.log, self.gpu, self.target, self.interval_s = log, gpu, target, interval_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)
        self.gpu_status = gpu.status()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor-sampler", daemon=True)
        self._n = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.sample()
            except Exception:  # a failed sample is a gap in the charts, not the end of sampling
                pass
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def sample(self) -> dict[str, Any]:
        self.log.poll()
        s: dict[str, Any] = {"t": time.time()}
        if self._n % 2 == 0:  # NVML every other sample
            self.gpu_status = self.gpu.status()
        self._n += 1
        g = self.gpu_status
        if g.available:
            s.update(gpu_used=g.used_bytes, gpu_total=g.total_bytes)
        target = self.target()
        if target is not None:
            url, headers = target
            try:
                r = httpx.get(url + "/metrics", headers=headers, timeout=2.0)
                if r.status_code == 200:
                    m = parse_prometheus(r.text)
                    s.update({f: m[name] for name, f in _FIELDS.items() if name in m})
            except httpx.HTTPError:
                pass
        with self._lock:
            self.samples.append(s)
        return s

    def series(self, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.samples if s["t"] > since]
