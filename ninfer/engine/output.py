"""``Outputs``: sampled logits in, tokens and events out (per-request text, stop checks, finish events)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .core import Finish, FinishReason, Request, TokenDelta
from .handle import Handle, completion_of
from .sampler import NOT_COMPUTED, MaskError, SampleRequest, packed_mask, resolve_mask, sample
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

    def drop(self, request_id: int) -> None:
        del self._live[request_id]

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._live

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._live))

    def accept(self, req: Request, logits: np.ndarray, mask: Any = NOT_COMPUTED) -> None:
        """Sample ``req``'s next token on the CPU, stream it, and finish the request if it stops here. ``mask``:
        its token mask computed during the model step (``sampler.compute_mask``)."""
        try:
            tok = sample(
                logits,
                req.params,
                seed=req.seed,
                position=len(req.tokens),
                counts=req.counts,
                generated=req.generated,
                token_mask=req.token_mask,
                token_limit=self._token_limit,
                mask=mask,
            )
        except MaskError as e:
            self._sched.finish(req, FinishReason.ERROR, str(e))
            return
        self._push(req, tok)

    def accept_device(self, runner: Any, reqs: list[Request], logits: Any, masks: dict[int, Any]) -> None:
        """``accept`` for every sampled row at once, sampled by a runner with ``device_sampling``: the same
        function (``sampler`` docstring) on the rows that stayed on its device. A request whose mask hook failed
        or allows nothing fails alone, as on the CPU path."""
        rows: list[int] = []
        specs: list[SampleRequest] = []
        for i, req in enumerate(reqs):
            try:
                mask = resolve_mask(masks.get(req.id, NOT_COMPUTED), req.token_mask, req.generated)
                words = packed_mask(mask, logits.shape[1])
            except MaskError as e:
                self._sched.finish(req, FinishReason.ERROR, str(e))
                continue
            rows.append(i)
            specs.append(SampleRequest(req.params, req.seed, len(req.tokens), req.counts, words))
        if not rows:
            return
        try:
            toks = runner.sample(logits if len(rows) == len(reqs) else logits[rows], specs, self._token_limit)
        except Exception as e:  # noqa: BLE001 - a failing device sampler fails this step's requests only
            for i in rows:
                self._sched.finish(reqs[i], FinishReason.ERROR, f"sampling failed: {type(e).__name__}: {e}")
            return
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
