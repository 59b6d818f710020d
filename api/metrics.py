"""Prometheus metrics in the text exposition format (version 0.0.4), written by hand.

The API process owns request-level series (latency, TTFT, tokens, outcomes); engine gauges (lanes, queue, KV and
checkpoint memory, prefix-hit tokens) are read from the actor's stats at scrape time. All updates happen on the
event-loop thread, so no locking is needed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping

__all__ = ["Histogram", "Metrics", "LATENCY_BUCKETS", "TTFT_BUCKETS"]

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, esc, strict=True)) + "}"


class Histogram:
    """Cumulative buckets as Prometheus expects: ``le`` counts include every smaller bucket."""

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v

    @property
    def count(self) -> int:
        return sum(self.counts)

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += n
            out.append(f'{name}_bucket{{le="{_fmt(bound)}"}} {acc}')
        out += [f"{name}_sum {_fmt(self.sum)}", f"{name}_count {acc}"]
        return out


# engine stats key -> (metric name, help). Keys absent from the engine's stats are skipped.
_ENGINE_GAUGES = {
    "kv_pages_used": ("ninfer_kv_pages_used", "KV pages held by active requests and retained prefixes"),
    "kv_pages_retained": ("ninfer_kv_pages_retained", "KV pages held only by retained prefixes"),
    "kv_pages_free": ("ninfer_kv_pages_free", "free KV pages"),
    "kv_pages_total": ("ninfer_kv_pages_total", "KV pages in the pool"),
    "kv_bytes": ("ninfer_kv_bytes", "bytes of the KV pool in use"),
    "checkpoint_bytes": ("ninfer_checkpoint_bytes", "bytes held by GDN state checkpoints"),
    "checkpoints": ("ninfer_checkpoints", "GDN state checkpoints held"),
}
_ENGINE_COUNTERS = {
    "prefix_hit_tokens": ("ninfer_prefix_hit_tokens_total", "prompt tokens served from reused prefixes"),
    "evictions": ("ninfer_prefix_evictions_total", "retained prefixes evicted"),
}


class Metrics:
    def __init__(self) -> None:
        self.latency = Histogram(LATENCY_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.requests: dict[tuple[str, str], int] = {}  # (endpoint, outcome) -> count
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0

    def count_request(self, endpoint: str, outcome: str) -> None:
        key = (endpoint, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1

    def observe_done(
        self, *, latency_s: float, ttft_s: float | None, prompt: int, cached: int, completion: int
    ) -> None:
        self.latency.observe(latency_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.completion_tokens += completion

    def render(self, actor: Mapping[str, float] | None, engine: Mapping[str, float] | None) -> str:
        """The exposition text; ``actor``/``engine`` are the actor's stats (None when it did not answer)."""
        out: list[str] = []

        def series(name: str, kind: str, help_: str, rows: list[str]) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *rows])

        series(
            "ninfer_request_duration_seconds",
            "histogram",
            "request wall time",
            self.latency.lines("ninfer_request_duration_seconds"),
        )
        series(
            "ninfer_time_to_first_token_seconds",
            "histogram",
            "time from request to first token",
            self.ttft.lines("ninfer_time_to_first_token_seconds"),
        )
        rows = [
            f"ninfer_requests_total{_labels({'endpoint': e, 'outcome': o})} {n}"
            for (e, o), n in sorted(self.requests.items())
        ]
        series("ninfer_requests_total", "counter", "requests by endpoint and outcome", rows)
        for name, v, h in (
            ("ninfer_prompt_tokens_total", self.prompt_tokens, "prompt tokens of completed requests"),
            (
                "ninfer_cached_prompt_tokens_total",
                self.cached_tokens,
                "prompt tokens reused from the prefix cache",
            ),
            ("ninfer_completion_tokens_total", self.completion_tokens, "generated tokens"),
        ):
            series(name, "counter", h, [f"{name} {v}"])
        series(
            "ninfer_engine_up",
            "gauge",
            "1 when the engine actor answered this scrape",
            [f"ninfer_engine_up {0 if actor is None else 1}"],
        )
        for key, name, h in (
            ("lanes_busy", "ninfer_lanes_busy", "lanes running a request"),
            ("lanes_total", "ninfer_lanes_total", "lanes (max concurrency)"),
            ("queue_len", "ninfer_queue_length", "requests waiting for a lane"),
            ("queue_depth", "ninfer_queue_depth", "admission queue capacity"),
            ("engine_failures", "ninfer_engine_failures_total", "engine step failures"),
        ):
            if actor is not None and key in actor:
                kind = "counter" if name.endswith("_total") else "gauge"
                series(name, kind, h, [f"{name} {_fmt(actor[key])}"])
        for table, kind in ((_ENGINE_GAUGES, "gauge"), (_ENGINE_COUNTERS, "counter")):
            for key, (name, h) in table.items():
                if engine is not None and key in engine:
                    series(name, kind, h, [f"{name} {_fmt(engine[key])}"])
        return "\n".join(out) + "\n"
