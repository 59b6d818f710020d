"""``Outputs``: the runner's sampling inputs out, its tokens in; events out (per-request text, stop checks,
finish events)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from .core import Finish, FinishReason, Request, RequestStatus, SampleRequest, TokenDelta
from .handle import Handle, completion_of
from .sampler import NOT_COMPUTED, MaskError, packed_mask, resolve_mask
from .scheduler import Scheduler
from .stop import TextStream

__all__ = ["Outputs"]


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

    def stop_ids(self, request_id: int) -> frozenset[int]:
        return self._live[request_id].stop_ids

    def accept_round(self, req: Request, toks: list[int]) -> int:
        """A speculative round's tokens, in order, until the request stops (a stop token or string, its budget,
        -1: nothing allowed); nothing after the stop is pushed. Returns how many were pushed."""
        n = 0
        for tok in toks:
            if req.status is not RequestStatus.RUNNING:
                break
            if tok < 0:
                self._sched.finish(req, FinishReason.ERROR, "token mask allows no token")
                break
            self._push(req, tok)
            n += 1
        return n

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
