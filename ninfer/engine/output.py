"""A request's outputs, both ends: ``Outputs`` (the engine's side: the runner's sampling inputs out, its tokens
in; per-request text, stop checks, token deltas and finish events) and ``Handle`` (the caller's side: events,
result, cancel). The engine pushes events onto the handle under its lock; the caller drains them, consecutive
deltas merged (``coalesce``)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .core import (
    Accepted,
    Completion,
    Event,
    Finish,
    FinishReason,
    Request,
    RequestMetrics,
    SampleRequest,
    TokenDelta,
    Usage,
)
from .sampler import NOT_COMPUTED, MaskError, packed_mask, resolve_mask
from .scheduler import Scheduler
from .stop import TextStream

__all__ = ["Outputs", "Handle", "coalesce", "completion_of", "reasoning_tokens"]


# ---- the caller's side ------------------------------------------------------------------------------------
def coalesce(events: list[Event]) -> list[Event]:
    """Merge runs of consecutive token deltas into one delta each (fewer messages across Ray/HTTP)."""
    out: list[Event] = []
    run: list[TokenDelta] = []
    for ev in events:
        if isinstance(ev, TokenDelta):
            run.append(ev)
            continue
        if run:
            out.append(_merged(run))
            run = []
        out.append(ev)
    if run:
        out.append(_merged(run))
    return out


def _merged(run: list[TokenDelta]) -> TokenDelta:
    if len(run) == 1:
        return run[0]
    ids = [t for ev in run for t in ev.token_ids]
    return TokenDelta(run[0].request_id, ids, "".join(ev.text for ev in run))


def reasoning_tokens(req: Request) -> int:
    """Generated ids up to and including the first ``stop_after_token_id`` (all of them if it never came)."""
    end = req.params.stop_after_token_id
    if end is None:
        return 0
    gen = req.generated
    return gen.index(end) + 1 if end in gen else len(gen)


def completion_of(req: Request, text: str, stop_string: str | None) -> Completion:
    usage = Usage(
        prompt_tokens=req.prompt_len,
        cached_tokens=req.cached_tokens,
        completion_tokens=req.num_generated,
        reasoning_tokens=reasoning_tokens(req),
    )
    admitted, first = req.t_admit or req.t_finish, req.t_first or req.t_finish
    metrics = RequestMetrics(
        queue_wait_s=admitted - req.t_submit,
        prefill_s=first - admitted,
        decode_s=req.t_finish - first,
        ttft_s=first - req.t_submit,
        prompt_tokens=req.prompt_len,
        cached_tokens=req.cached_tokens,
        completion_tokens=req.num_generated,
        finish_reason=str(req.finish_reason),
        lane=req.lane,
    )
    return Completion(
        request_id=req.id,
        token_ids=list(req.generated),
        text=text,
        finish_reason=str(req.finish_reason),
        usage=usage,
        metrics=metrics,
        stop_string=stop_string,
        error=req.error,
    )


class Handle:
    """``cancel``: stops the request at the engine's next step. ``drive``: for an engine without a step thread,
    runs steps in the caller's thread until its argument returns True (None: a step thread runs them)."""

    def __init__(
        self,
        accepted: Accepted,
        cancel: Callable[[], None],
        drive: Callable[[Callable[[], bool]], None] | None,
        on_event: Callable[[Event], None] | None,
    ) -> None:
        self.request_id, self.accepted = accepted.request_id, accepted
        self._cancel, self._drive, self._on_event = cancel, drive, on_event
        self._events: deque[Event] = deque()
        self._cv = threading.Condition()
        self._completion: Completion | None = None

    # ---- called by the engine (its lock held) -----------------------------------------------------------
    def _push(self, ev: Event) -> None:
        with self._cv:
            self._events.append(ev)
            self._cv.notify_all()
        if self._on_event is not None:
            try:
                self._on_event(ev)
            except Exception:  # noqa: BLE001 - a consumer's callback must not break the step loop
                self._on_event = None

    def _finish(self, ev: Finish, completion: Completion) -> None:
        with self._cv:
            self._completion = completion
        self._push(ev)

    # ---- for the caller ---------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._completion is not None

    def cancel(self) -> None:
        """Stop the request at the next step; its lane and KV reservation are freed then."""
        self._cancel()

    def poll(self) -> list[Event]:
        """Every event produced since the last call, consecutive deltas merged; never blocks."""
        with self._cv:
            out, self._events = list(self._events), deque()
        return coalesce(out)

    def stream(self, timeout: float | None = None) -> Iterator[Event]:
        """Token deltas, then the ``Finish`` event. ``timeout``: most seconds to wait for each event."""
        while True:
            ev = self._next(timeout)
            yield ev
            if isinstance(ev, Finish):
                return

    def _next(self, timeout: float | None) -> Event:
        if self._drive is not None:
            self._drive(lambda: bool(self._events))
        with self._cv:
            if not self._cv.wait_for(lambda: bool(self._events), timeout):
                raise TimeoutError(f"request {self.request_id}: no event within {timeout} s")
            return self._events.popleft()

    def result(self, timeout: float | None = None) -> Completion:
        """Wait for the request to finish and return its completion."""
        if self._drive is not None:
            self._drive(lambda: self.done)
        with self._cv:
            if not self._cv.wait_for(lambda: self._completion is not None, timeout):
                raise TimeoutError(f"request {self.request_id}: not finished within {timeout} s")
            assert self._completion is not None
            return self._completion


# ---- the engine's side ------------------------------------------------------------------------------------
class _Live:
    """What the engine keeps per unfinished request besides the scheduler's record."""

    __slots__ = ("req", "handle", "text", "stop_ids")

    def __init__(self, req: Request, handle: Handle, text: TextStream, stop_ids: frozenset[int]) -> None:
        self.req, self.handle, self.text, self.stop_ids = req, handle, text, stop_ids


class Outputs:
    def __init__(self, sched: Scheduler, token_limit: int | None) -> None:
        self._sched, self._token_limit = sched, token_limit
        self._live: dict[int, _Live] = {}
        self.decode_tokens = 0
        self.finished = 0

    def add(self, req: Request, handle: Handle, text: TextStream, stop_ids: frozenset[int]) -> None:
        self._live[req.id] = _Live(req, handle, text, stop_ids)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._live

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._live))

    def sample_requests(
        self, reqs: list[Request], masks: dict[int, Any], vocab: int
    ) -> tuple[list[int], list[SampleRequest]]:
        """The runner's sampling inputs for this step's sampled ``reqs`` (``masks``: the hooks' results computed
        during the step): the rows to sample and one ``SampleRequest`` each. A request whose mask hook failed or
        gave a malformed mask is failed here, alone."""
        rows: list[int] = []
        specs: list[SampleRequest] = []
        for i, req in enumerate(reqs):
            try:
                mask = resolve_mask(masks.get(req.id, NOT_COMPUTED), req.token_mask, req.generated)
                words = packed_mask(mask, vocab)
            except MaskError as e:
                self._sched.finish(req, FinishReason.ERROR, str(e))
                continue
            rows.append(i)
            specs.append(SampleRequest(req.params, req.seed, len(req.tokens), req.counts, words))
        return rows, specs

    def fail(self, reqs: list[Request], rows: list[int], message: str) -> None:
        """The runner's sampling failed: exactly the requests of ``rows`` fail (the engine keeps serving)."""
        for i in rows:
            self._sched.finish(reqs[i], FinishReason.ERROR, message)

    def accept(self, reqs: list[Request], rows: list[int], toks: list[int]) -> None:
        """The one accept path: the runner's token for each sampled row (-1: the mask allowed nothing)."""
        for i, tok in zip(rows, toks, strict=True):
            if tok < 0:
                self._sched.finish(reqs[i], FinishReason.ERROR, "token mask allows no token")
            else:
                self._push(reqs[i], tok)

    def _push(self, req: Request, tok: int) -> None:
        """Append a sampled token, stream it, and finish the request if it stops here."""
        live = self._live[req.id]
        req.tokens.append(tok)
        req.counts[tok] = req.counts.get(tok, 0) + 1
        self.decode_tokens += 1
        if req.num_generated == 1:
            req.t_first = time.monotonic()
        is_stop = tok in live.stop_ids  # counted, never shown
        live.handle._push(TokenDelta(req.id, [tok], "" if is_stop else live.text.push(tok)))
        if is_stop:
            self._sched.finish(req, FinishReason.STOP_TOKEN)
        elif live.text.matched is not None:
            self._sched.finish(req, FinishReason.STOP_STRING)
        elif req.num_generated >= req.budget:
            self._sched.finish(req, req.limit_reason)

    def emit_finished(self) -> None:
        """A ``Finish`` event for every request the scheduler retired (its checkpoints are published by now)."""
        for req in self._sched.retired:
            live = self._live.pop(req.id)
            tail = live.text.finish()
            if live.text.matched is not None:
                req.finish_reason = FinishReason.STOP_STRING  # possibly matched in the flushed tail
            comp = completion_of(req, live.text.text, live.text.matched)
            self.finished += 1
            ev = Finish(
                req.id, str(req.finish_reason), comp.usage, comp.metrics, tail, live.text.matched, req.error
            )
            live.handle._finish(ev, comp)
        self._sched.retired = []
