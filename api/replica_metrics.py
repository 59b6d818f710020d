"""The `/metrics` series of `ninfer serve --replicas N`: per replica (label ``replica``) and the router's counters
(docs/replicas.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .metrics import format_labels, format_value

if TYPE_CHECKING:
    from ninfer.actors.router import ReplicaRouter

__all__ = ["replica_metrics"]

_PER_REPLICA = (  # (metric, kind, help, value of a ReplicaView or None)
    ("ninfer_replica_up", "gauge", "1 while the replica is in rotation", lambda v: int(v.up)),
    (
        "ninfer_replica_requests_total",
        "counter",
        "requests the router sent there (accepted)",
        lambda v: v.routed,
    ),
    ("ninfer_replica_inflight", "gauge", "requests running there through the router", lambda v: v.inflight),
    ("ninfer_replica_restarts_total", "counter", "times it came back after a restart", lambda v: v.restarts),
    ("ninfer_replica_prefix_blocks", "gauge", "retained prefix blocks it reported", lambda v: len(v.hashes)),
    ("ninfer_replica_lanes_busy", "gauge", "lanes running a request", lambda v: _stat(v, "lanes_busy")),
    ("ninfer_replica_lanes_total", "gauge", "lanes", lambda v: _stat(v, "lanes_total")),
    ("ninfer_replica_queue_length", "gauge", "requests waiting for a lane", lambda v: _stat(v, "queue_len")),
    (
        "ninfer_replica_prefix_hit_tokens_total",
        "counter",
        "prompt tokens reused",
        lambda v: _eng(v, "prefix_hit_tokens"),
    ),
    (
        "ninfer_replica_prefill_tokens_total",
        "counter",
        "prompt tokens computed",
        lambda v: _eng(v, "prefill_tokens"),
    ),
    ("ninfer_replica_decode_tokens_total", "counter", "tokens generated", lambda v: _eng(v, "decode_tokens")),
)


def _stat(v: Any, key: str) -> float | None:
    return None if v.stats is None else getattr(v.stats, key)


def _eng(v: Any, key: str) -> float | None:
    return None if v.stats is None else v.stats.engine.get(key)


def replica_metrics(router: ReplicaRouter) -> str:
    """Per-replica series (label ``replica``; engine figures from the stats the last ``router.stats()`` read)
    and the router's counters, in the exposition format of api/metrics.py."""
    out: list[str] = []

    def series(name: str, kind: str, help_: str, rows: list[tuple[dict[str, str], float]]) -> None:
        out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
        out.extend(f"{name}{format_labels(lab)} {format_value(val)}" for lab, val in rows)

    for name, kind, help_, fn in _PER_REPLICA:
        vals = [({"replica": v.name}, fn(v)) for v in router.views]
        series(name, kind, help_ + ", by replica", [(lab, x) for lab, x in vals if x is not None])
    c = router.counters
    series(
        "ninfer_router_affinity_hits_total",
        "counter",
        "requests accepted by the replica holding their prefix",
        [({}, c.affinity_hits)],
    )
    series(
        "ninfer_router_least_loaded_total",
        "counter",
        "requests with no prefix worth following",
        [({}, c.least_loaded)],
    )
    fb = {"full": c.fallback_full, "imbalance": c.fallback_imbalance, "unavailable": c.fallback_unavailable}
    series(
        "ninfer_router_fallbacks_total",
        "counter",
        "requests sent away from their prefix's replica, by reason",
        [({"reason": k}, n) for k, n in fb.items()],
    )
    rej = {"all_full": c.rejected_all_full, "no_replica": c.no_replica}
    series(
        "ninfer_router_rejected_total",
        "counter",
        "requests every replica refused (429) or none could take (503)",
        [({"reason": k}, n) for k, n in rej.items()],
    )
    series(
        "ninfer_router_replica_failures_total",
        "counter",
        "times a replica left the rotation",
        [({}, c.replica_failures)],
    )
    return "\n".join(out) + "\n"
