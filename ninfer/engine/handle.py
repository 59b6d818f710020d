"""``Handle``: one submitted request as its caller sees it (events, result, cancel)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from .core import (
    Accepted,
    Completion,
    Event,
    Finish,
    Request,
    RequestMetrics,
    SpeculativeUsage,
    TokenDelta,
    Usage,
)

__all__ = ["Handle", "coalesce", "completion_of", "reasoning_tokens"]


def coalesce(events: Iterable[Event]) -> list[Event]:
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
    ids: list[int] = []
    for ev in run:
        ids += ev.token_ids
    return TokenDelta(run[0].request_id, ids, "".join([ev.text for ev in run]))


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
        speculative=SpeculativeUsage(
            drafted=req.spec_drafted, accepted=req.spec_accepted, rounds=req.spec_rounds
        )
        if req.speculative
        else None,
        host_cached_tokens=req.host_cached_tokens,
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
        host_cached_tokens=req.host_cached_tokens,
        restore_bytes=req.restore_bytes,
        restore_s=req.restore_s,
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
            if not self._events:
                return []
            out, self._events = self._events, deque()
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
