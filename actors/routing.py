"""The routing policy of several engine replicas behind one endpoint (docs/replicas.md), without Ray or asyncio.

Each replica reports (``RouteState``, polled by the router) its load and, for every resume point (GDN checkpoint)
of the prefixes its engine retains, the chain hash of the last full block before it (ninfer/engine/prefix_digest.py). For a request the router hashes the blocks of its rendered prompt
the same way and ranks the replicas that are up:

1. affinity: the replica that can resume the prompt deepest (ties: the least loaded),
   unless it is full, or all its lanes are busy while another replica has a free lane (the request would wait
   there but could start at once elsewhere), or it has more than ``max_imbalance`` requests more than the least
   loaded replica. A prefix that only one replica holds so far (a shared system prompt) does attract new
   sessions, until those rules spread them: then every replica holds it and the tie goes to the least loaded;
2. otherwise the least-loaded replica (ties: the one given the fewest requests, so sequential sessions spread).

The rest follow by load, full ones last: the router tries them in order when a replica answers 429 or is gone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .messages import ActorStats

__all__ = ["RouteState", "RouterConfig", "ReplicaView", "Ranking", "rank", "merge_stats"]


class RouteState(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's answer to the router's poll. ``hashes`` is None when unchanged since the version asked about;
    ``epoch`` changes when the actor restarts (its cache is then empty and its versions start again)."""

    epoch: str
    version: int
    hashes: tuple[int, ...] | None
    lanes_total: int
    lanes_busy: int
    queue_len: int
    queue_depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig:
    block_tokens: int = 16  # tokens per hashed block (the engine's KV page size by default)
    max_imbalance: int = (
        4  # affinity yields when its replica has this many more requests than the least loaded
    )
    poll_interval_s: float = 0.5  # how often each replica's RouteState is fetched
    probe_timeout_s: float = 2.0  # a replica that does not answer a poll this fast is taken out of rotation
    recent_ttl_s: float = (
        30.0  # how long a routed prompt's blocks count for its replica before a report has them
    )

    def __post_init__(self) -> None:
        if not isinstance(self.block_tokens, int) or self.block_tokens < 1:
            raise ValueError(f"block_tokens: must be a positive integer, got {self.block_tokens!r}")
        if self.max_imbalance < 1:
            raise ValueError(f"max_imbalance: must be at least 1, got {self.max_imbalance}")
        for name in ("poll_interval_s", "probe_timeout_s", "recent_ttl_s"):
            v = getattr(self, name)
            if not 0 < v <= 3600:
                raise ValueError(f"{name}: must be in (0, 3600] seconds, got {v}")


@dataclass(slots=True)
class ReplicaView:
    """What the router knows about one replica."""

    index: int
    name: str
    client: Any  # an AsyncEngineClient (the API) or an actor handle (a Python job)
    capacity: int  # lanes + queue depth: requests it takes before answering 429
    lanes: int = 1
    up: bool = True
    epoch: str = ""
    version: int = -1
    hashes: frozenset[int] = frozenset()
    recent: dict[int, float] = field(default_factory=dict)  # block hash -> expiry (monotonic seconds)
    inflight: int = 0  # requests this router has running there
    polled_load: int = 0  # lanes busy + queued at the last poll (every caller's requests)
    poll_sent: float = 0.0  # monotonic time the last applied poll was asked (its state is no older)
    poll_done: float = 0.0  # and answered (its state is no newer)
    routed: int = 0  # requests accepted there through this router
    restarts: int = 0  # times it came back with a new epoch
    # (admitted, ended) of this router's requests there that ended since the last applied poll was asked (apply)
    ended: list[tuple[float, float]] = field(default_factory=list)
    stats: ActorStats | None = None  # the last stats read (metrics)

    @property
    def load(self) -> int:
        return max(self.inflight, self.polled_load)

    @property
    def full(self) -> bool:
        return self.load >= self.capacity

    def matched(self, blocks: list[int], now: float) -> int:
        """How many of ``blocks``' leading blocks lie under a resume point this replica holds (reported, or
        routed there recently): the deepest block whose chain hash it has (a chain hash implies its prefix)."""
        for k in range(len(blocks), 0, -1):
            h = blocks[k - 1]
            if h in self.hashes:
                return k
            exp = self.recent.get(h)
            if exp is not None and exp >= now:
                return k
        return 0

    def remember(self, blocks: list[int], ttl: float, now: float) -> None:
        """A routed prompt's end (its last two blocks: the next turn may re-render the prompt's last tokens) is a
        resume point there once it ran: counted until a report can include it."""
        if len(self.recent) > 65536:  # bound the memory of an idle replica's stale entries
            self.recent = {h: e for h, e in self.recent.items() if e >= now}
        for h in blocks[-2:]:
            self.recent[h] = now + ttl

    def retired(self, admitted: float, now: float) -> None:
        """One of this router's requests there, accepted at ``admitted``, ended at ``now``. If it ran from before
        the last poll was asked until after its answer, that poll counted it and nothing will uncount it until the
        next one, so the polled load drops by one. Without this, a session's next turn sent as soon as the last
        one finished (an agent's usual pace) saw its replica's only lane still busy and was sent elsewhere, away
        from the prefix it had just built, whenever it came within a poll interval (500 ms)."""
        if admitted < self.poll_sent and now > self.poll_done:
            self.polled_load = max(0, self.polled_load - 1)
        self.ended.append((admitted, now))

    def apply(self, st: RouteState, sent: float | None = None) -> bool:
        """Take a poll's answer, asked at ``sent``; True when the replica came back (it was down, or restarted
        meanwhile). A request of this router that ran when the poll was asked and has ended since may be in the
        answer's count (it ended while the poll was in flight: :meth:`retired` compared it with the previous poll)
        and nothing would uncount it until the next poll: it is left out of the polled load. If the replica had
        really finished it before counting, this undercounts other callers' load until the next poll; this
        router's own requests are counted exactly either way (``inflight``)."""
        back = not self.up or (bool(self.epoch) and st.epoch != self.epoch)
        if st.epoch != self.epoch:
            self.restarts += bool(self.epoch)
            self.hashes, self.recent, self.version = frozenset(), {}, -1
        self.epoch, self.up = st.epoch, True
        if st.hashes is not None:
            self.hashes, self.version = frozenset(st.hashes), st.version
        self.polled_load = st.lanes_busy + st.queue_len
        if sent is not None:
            gone = sum(1 for a, e in self.ended if a < sent <= e)
            self.polled_load = max(0, self.polled_load - gone)
            self.ended = [(a, e) for a, e in self.ended if e >= sent]  # later polls are asked after `sent`
        self.capacity, self.lanes = st.lanes_total + st.queue_depth, st.lanes_total
        return back

    def down(self) -> bool:
        """Take it out of rotation (its retained prefixes die with it); True if it was up."""
        was = self.up
        self.up, self.hashes, self.recent, self.version, self.polled_load = False, frozenset(), {}, -1, 0
        self.ended = []
        return was


@dataclass(frozen=True, slots=True)
class Ranking:
    order: list[ReplicaView]  # replicas to try, best first (up ones only)
    affinity: ReplicaView | None  # the replica holding the prompt's prefix, if the prefix counts
    matched_blocks: int
    reason: str  # affinity | least_loaded | full | imbalance (why affinity was not followed)


def rank(views: list[ReplicaView], blocks: list[int], cfg: RouterConfig, now: float | None = None) -> Ranking:
    """The order in which to try the replicas for a prompt of block hashes ``blocks``."""
    now = time.monotonic() if now is None else now
    up = [v for v in views if v.up]
    by_load = sorted(up, key=lambda v: (v.full, v.load, v.routed, v.index))
    if not up:
        return Ranking([], None, 0, "unavailable")
    match = {v.index: v.matched(blocks, now) for v in up} if blocks else {}
    best = max(match.values(), default=0)
    if best == 0:
        return Ranking(by_load, None, 0, "least_loaded")
    aff = min((v for v in up if match[v.index] == best), key=lambda v: (v.load, v.routed, v.index))
    rest = [v for v in by_load if v is not aff]
    if aff.full:
        return Ranking([*rest, aff], aff, best, "full")
    others = [v for v in up if v is not aff and not v.full]
    waits = aff.load >= aff.lanes and any(v.load < v.lanes for v in others)
    if waits or aff.load - min((v.load for v in others), default=aff.load) > cfg.max_imbalance:
        return Ranking([*rest, aff], aff, best, "imbalance")
    return Ranking([aff, *rest], aff, best, "affinity")


def merge_stats(stats: list[ActorStats]) -> ActorStats:
    """Several replicas' stats as one (sums; the longest uptime; the engine's page size as it is)."""
    if not stats:
        raise ValueError("merge_stats: no replica answered")
    engine: dict[str, float] = {}
    for st in stats:
        for k, v in st.engine.items():
            engine[k] = max(engine.get(k, 0.0), v) if k == "page_size" else engine.get(k, 0.0) + v
    total = {
        k: sum(getattr(st, k) for st in stats)
        for k in ("lanes_total", "lanes_busy", "queue_len", "queue_depth", "open_streams")
    }
    return ActorStats(
        **total,
        engine_failures=sum(st.engine_failures for st in stats),
        internal_errors=sum(st.internal_errors for st in stats),
        cancelled_before_start=sum(st.cancelled_before_start for st in stats),
        uptime_s=max(st.uptime_s for st in stats),
        engine=engine,
    )
