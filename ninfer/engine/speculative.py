"""``Speculator``: the engine's side of MTP speculative decoding (docs/speculative.md).

Per step, for every decode lane that may speculate (a running request, no checkpoint due at this step, at least
two tokens of budget left): draft ``m <= k`` tokens with the runner's MTP head, each sampled by the one sampler
from the request's draft stream under the same ``SampleRequest`` the target row will get (penalty counts with the
drafts so far, the grammar mask after them, the same position); the decode work becomes a verify round
``[last token, d_1..d_m]``. After the runner's ``execute``: ``runner.verify`` gives the tokens the round emits,
``Outputs.accept_round`` pushes them until the request stops, and ``runner.commit`` keeps the lane's state up to
the last pushed token (which stays uncomputed, like every freshly sampled token).

Drafting stops early at a stop token, where a mask cannot be computed or allows nothing, and at the budget, so a
round never computes a position beyond the request's reservation.

Where no row of the round depends on the drafts (no grammar mask, no penalties: every draft's ``SampleRequest`` is
known before drafting) and every lane drafts the same number of tokens, a runner with ``draft_chain`` drafts the
round at once (the CUDA runner samples on the device and feeds each draft to the next step there: one host
synchronization per round instead of one per draft); the drafts after a stop token or a -1 are dropped here, so
the round is the one the step-by-step loop builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .core import (
    Batch,
    DraftLane,
    LaneWork,
    ModelRunner,
    Request,
    RequestStatus,
    SampleRequest,
    SamplingParams,
)
from .output import Outputs
from .sampler import MaskError, compute_mask, packed_mask, resolve_mask
from .spec_verify import draft_request

__all__ = ["Speculator", "chain_by_steps"]


def chain_by_steps(
    runner: Any, lanes: Sequence[DraftLane], reqs: Sequence[Sequence[SampleRequest]], token_limit: int | None
) -> list[list[int]]:
    """``draft_chain``'s definition by ``draft`` and ``sample``: ``len(reqs[i])`` draft steps of every lane (the
    same count for all), step ``s`` sampled with ``reqs[i][s]`` and appended to the lane's tokens for the next
    (a -1, nothing allowed, as token 0: the caller drops the drafts from a -1 on). ``lanes``: the first step's."""
    toks: list[list[int]] = [[] for _ in lanes]
    for s in range(len(reqs[0]) if reqs else 0):
        runner.draft(
            [
                DraftLane(dl.lane, [*dl.tokens, *(max(t, 0) for t in ts)])
                for dl, ts in zip(lanes, toks, strict=True)
            ]
        )
        got = runner.sample(range(len(lanes)), [r[s] for r in reqs], token_limit)
        for ts, t in zip(toks, got, strict=True):
            ts.append(int(t))
    return toks


def _penalized(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


@dataclass(slots=True)
class _Round:
    work: LaneWork
    req: Request
    most: int  # drafts this round may hold
    drafts: list[int] = field(default_factory=list)
    reqs: list[SampleRequest] = field(default_factory=list)  # row i: the inputs after drafts[:i]
    done: bool = False


class Speculator:
    def __init__(self, runner: ModelRunner, k: int, token_limit: int | None, outputs: Outputs) -> None:
        self._runner, self.k, self._token_limit, self._out = runner, k, token_limit, outputs
        self.rounds = 0
        self.drafted = 0
        self.accepted = 0

    # ---- before the model step --------------------------------------------------------------------------
    def draft(self, batch: Batch, owners: Mapping[int, Request]) -> list[_Round]:
        """Draft for the eligible decode lanes of ``batch`` and turn their work into verify rounds."""
        rounds = [_Round(w, owners[w.lane], self._most(w, owners[w.lane])) for w in batch.work]
        rounds = [r for r in rounds if r.most > 0 and self._row(r)]
        vocab = self._runner.vocab_size
        chain = getattr(self._runner, "draft_chain", None)
        if chain is not None and self._chainable(rounds):
            self._draft_chained(rounds, chain, vocab)
        else:
            self._draft_steps(rounds, vocab)
        rounds = [r for r in rounds if r.drafts]
        for r in rounds:
            while len(r.reqs) <= len(
                r.drafts
            ):  # the bonus row's inputs when drafting stopped at a stop token
                self._row(r, vocab, must=False)
            del r.reqs[len(r.drafts) + 1 :]
            r.work.token_ids = [r.work.token_ids[0], *r.drafts]
            r.work.sample, r.work.verify = False, True
        return rounds

    def _draft_steps(self, rounds: list[_Round], vocab: int) -> None:
        """Draft step by step: each draft sampled with the inputs after the drafts before it."""
        live = rounds
        while live:
            self._runner.draft([DraftLane(r.work.lane, r.req.tokens + r.drafts) for r in live])
            specs = [draft_request(r.reqs[-1]) for r in live]
            toks = self._runner.sample(range(len(live)), specs, self._token_limit)
            for r, tok in zip(live, toks, strict=True):
                self._take(r, tok, vocab)
            live = [r for r in live if not r.done]

    def _take(self, r: _Round, tok: int, vocab: int) -> None:
        """The next draft of ``r`` (-1: nothing allowed); marks the round done where drafting stops."""
        if tok < 0:
            r.done = True
            return
        r.drafts.append(tok)
        stop = tok in self._out.stop_ids(r.req.id)
        r.done = stop or len(r.drafts) >= r.most or not self._row(r, vocab, must=False)

    @staticmethod
    def _chainable(rounds: Sequence[_Round]) -> bool:
        """Every draft's inputs are known before drafting: no grammar mask, no penalties (their counts), the same
        number of drafts in every round."""
        return bool(rounds) and all(
            r.req.token_mask is None and r.reqs[0].mask is None and not _penalized(r.req.params)
            and r.most == rounds[0].most for r in rounds
        )  # fmt: skip

    def _draft_chained(self, rounds: list[_Round], chain: Any, vocab: int) -> None:
        """The round at once by the runner's ``draft_chain``; then the drafts are taken as ``_draft_steps``
        takes them (so drafts after a stop token or a -1 are dropped)."""
        reqs = [[draft_request(r.reqs[0]._replace(position=r.reqs[0].position + s)) for s in range(r.most)]
                for r in rounds]  # fmt: skip
        got = chain([DraftLane(r.work.lane, r.req.tokens) for r in rounds], reqs, self._token_limit)
        for r, toks in zip(rounds, got, strict=True):
            for tok in toks:
                self._take(r, int(tok), vocab)
                if r.done:
                    break

    def _most(self, w: LaneWork, req: Request) -> int:
        eligible = not w.prefill and w.sample and w.save_checkpoint is None and len(w.token_ids) == 1
        if not eligible or req.status is not RequestStatus.RUNNING:
            return 0
        return max(0, min(self.k, req.budget - req.num_generated - 1))

    def _row(self, r: _Round, vocab: int | None = None, *, must: bool = True) -> bool:
        """Append the sampling inputs of the row after ``r.drafts``. A mask that fails: False when ``must``
        (the round's first row: the lane decodes without drafts and fails there as usual); otherwise the row
        allows nothing (it fails the request only if verification reaches it) and drafting stops."""
        req = r.req
        vocab = self._runner.vocab_size if vocab is None else vocab
        counts = req.counts  # used by penalties alone: a copy with the drafts only where they apply
        if r.drafts and _penalized(req.params):
            counts = dict(req.counts)
            for t in r.drafts:
                counts[t] = counts.get(t, 0) + 1
        ok, words = True, None
        if req.token_mask is not None:  # without a hook there is no mask (the generated list is not built)
            gen = req.generated + r.drafts
            try:
                words = packed_mask(resolve_mask(_mask(req, gen), req.token_mask, gen), vocab)
            except MaskError:
                if must:
                    return False
                words, ok = np.zeros(-(-vocab // 32), np.int32), False
        r.reqs.append(SampleRequest(req.params, req.seed, len(req.tokens) + len(r.drafts), counts, words))
        return ok

    # ---- after the model step ---------------------------------------------------------------------------
    def settle(self, rounds: Sequence[_Round]) -> dict[int, int]:
        """Verify, emit and commit every round; returns lane -> tokens the lane keeps (for ``after_run``)."""
        lanes = [r.work.lane for r in rounds]
        emitted = self._runner.verify(lanes, [r.drafts for r in rounds], [r.reqs for r in rounds],
                                      self._token_limit)  # fmt: skip
        committed: dict[int, int] = {}
        for r, toks in zip(rounds, emitted, strict=True):
            accepted = 0
            while accepted < len(r.drafts) and toks[accepted] == r.drafts[accepted]:
                accepted += 1
            pushed = self._out.accept_round(r.req, toks)
            committed[r.work.lane] = r.work.start + pushed
            self._runner.commit(r.work.lane, r.work.start + pushed)
            r.req.spec_rounds += 1
            r.req.spec_drafted += len(r.drafts)
            r.req.spec_accepted += min(accepted, pushed)
            self.rounds += 1
            self.drafted += len(r.drafts)
            self.accepted += min(accepted, pushed)
        return committed


def _mask(req: Request, gen: list[int]) -> Any:
    return compute_mask(req.token_mask, gen) if req.token_mask is not None else None
