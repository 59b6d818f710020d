"""``ninfer bench-corpus``: replay a fixtures directory against a live server, join with its request log, report.

Sessions run ``concurrency`` at a time; the turns of one session are sent in order, each after the previous one
finished (a session is one conversation, so its turns can reuse each other's prefix). ``repeat`` replays the
whole corpus that many times, one repetition after another. Every request is streamed; its record holds what
the client measured and saw (``stream.py``), the fixture's checks (``checks.py``) and, with ``request_log``, the
server's own record of it (``serverlog.py``), matched by the response id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from .checks import CheckResult, evaluate
from .fixtures import Fixture, Session, load_corpus
from .report import Report, build_report
from .serverlog import LogJoin, join_record, wait_for
from .stream import Outcome, stream_request

__all__ = ["RunOptions", "Record", "run_corpus"]

CLIENT_NAME = "ninfer-bench-corpus"  # sent as X-Client-Name: the log's client_claim


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    url: str
    """Server base URL without a trailing slash."""
    fixtures: str
    """Fixtures directory (``fixtures.py``)."""
    out: str | None = None
    """Directory for report.json, report.md and the PNG charts; None writes nothing."""
    request_log: str | None = None
    """The server's request JSONL; None skips the join."""
    concurrency: int = 1
    repeat: int = 1
    seed: int | None = None
    """Seed of chat requests that bring none (+ the repetition index); other protocols have no seed field."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as a bearer token; never written to the report or printed."""
    timeout_s: float = 300.0
    log_wait_s: float = 10.0
    """How long to wait for the log writer to catch up after the last response."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"--concurrency: must be at least 1, got {self.concurrency}")
        if self.repeat < 1:
            raise ValueError(f"--repeat: must be at least 1, got {self.repeat}")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout: must be positive, got {self.timeout_s}")


class Record(msgspec.Struct, kw_only=True):
    """One replayed request."""

    fixture: str
    session: str
    turn: int
    repeat: int
    protocol: str
    outcome: Outcome
    checks: list[CheckResult]
    ttft_s: float | None
    decode_tok_s: float | None  # (completion - 1) / (last event - first output), as the client saw it
    log: LogJoin | None = None
    usage_matches_log: bool | None = None

    @property
    def ok(self) -> bool:
        return self.outcome.error is None


def _decode_rate(o: Outcome) -> float | None:
    n = o.completion_tokens
    if n is None or n < 2 or o.t_first is None or o.t_done is None or o.t_done <= o.t_first:
        return None
    return (n - 1) / (o.t_done - o.t_first)


def _headers(api_key: str | None) -> dict[str, str]:
    h = {"X-Client-Name": CLIENT_NAME, "anthropic-version": "2023-06-01"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _body(f: Fixture, model: str, seed: int | None) -> dict[str, Any]:
    body = dict(f.body)
    body.setdefault("model", model)
    if seed is not None and f.protocol == "openai_chat":
        body.setdefault("seed", seed)
    return body


async def _session(
    client: httpx.AsyncClient, opts: RunOptions, s: Session, model: str, rep: int, log: Callable[[str], None]
) -> list[Record]:
    out = []
    seed = None if opts.seed is None else opts.seed + rep
    for f in s.turns:
        body = _body(f, model, seed)
        o = await stream_request(client, opts.url, f.protocol, body, _headers(opts.api_key))
        rec = Record(fixture=f.name, session=f.session, turn=f.turn, repeat=rep, protocol=f.protocol, outcome=o,
                     checks=evaluate(f.checks, f.protocol, body, o), ttft_s=o.t_first,
                     decode_tok_s=_decode_rate(o))  # fmt: skip
        failed = [c.kind for c in rec.checks if not c.passed]
        status = o.error or f"{o.completion_tokens} tokens, {o.finish_reason}"
        log(f"{f.name} (repeat {rep}): {status}" + (f"; failed checks {failed}" if failed else ""))
        out.append(rec)
    return out


async def _replay(opts: RunOptions, sessions: list[Session], log: Callable[[str], None]) -> list[Record]:
    limits = httpx.Limits(max_connections=opts.concurrency + 2)
    async with httpx.AsyncClient(timeout=opts.timeout_s, limits=limits) as client:
        r = await client.get(opts.url + "/v1/models", headers=_headers(opts.api_key))
        if r.status_code != 200:
            raise ValueError(f"{opts.url}/v1/models answered {r.status_code}: {r.text[:200]}")
        model = r.json()["data"][0]["id"]
        gate = asyncio.Semaphore(opts.concurrency)
        records: list[Record] = []
        for rep in range(opts.repeat):

            async def one(s: Session, rep: int = rep) -> list[Record]:
                async with gate:
                    return await _session(client, opts, s, model, rep, log)

            for recs in await asyncio.gather(*(one(s) for s in sessions)):
                records.extend(recs)
    return records


def _usage_matches(o: Outcome, j: LogJoin) -> bool:
    """Every token count the stream reported equals the logged one (counts a stream lacks are not compared)."""
    pairs = [(o.prompt_tokens, j.prompt_tokens), (o.cached_tokens, j.cached_tokens),
             (o.completion_tokens, j.completion_tokens)]  # fmt: skip
    return all(a == b for a, b in pairs if a is not None)


def _join(records: list[Record], path: str, wait_s: float) -> list[dict[str, Any]]:
    ids = {r.outcome.response_id for r in records if r.outcome.response_id}
    finals, starts = wait_for(path, ids, wait_s)
    for r in records:
        rec = finals.get(r.outcome.response_id or "")
        if rec is not None:
            r.log = join_record(rec)
            r.usage_matches_log = _usage_matches(r.outcome, r.log)
    return starts


def run_corpus(opts: RunOptions, log: Callable[[str], None] | None = None) -> Report:
    """Replay, join, build the report and (with ``opts.out``) write it. Raises ``FixtureError`` or ``ValueError``
    for a corpus or server that cannot be used; failed requests and checks are results, not exceptions."""
    say = log or (lambda _m: None)
    sessions = load_corpus(opts.fixtures)
    say(f"{sum(len(s.turns) for s in sessions)} fixtures in {len(sessions)} sessions from {opts.fixtures}")
    t0 = time.time()
    try:
        records = asyncio.run(_replay(opts, sessions, say))
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {opts.url}: {type(e).__name__}: {e}") from None
    starts = _join(records, opts.request_log, opts.log_wait_s) if opts.request_log else []
    report = build_report(opts, records, starts, started_unix=t0)
    if opts.out is not None:
        for path in report.write(opts.out):
            say(f"wrote {path}")
    return report
