"""Verification of one lane's speculative round on the sampler's exact integer masses (docs/speculative.md).

A round verifies drafts ``d_1..d_m`` against target rows ``L_0..L_m`` (``L_i`` scores the position after
``d_1..d_i``). Row ``i`` of the draft and of the target share one ``SampleRequest``: the same penalties (counts
with ``d_1..d_i``), grammar mask (the matcher advanced through ``d_1..d_i``), token limit, temperature, top-k,
top-p and min-p; ``sampler.distribution`` turns each into kept ids and integer masses ``P`` (target), ``Q``
(draft).

- Greedy (``temperature <= 0``): both are one-hot at their argmax; ``d_{i+1}`` is accepted iff it equals the
  target's argmax, and the first mismatch emits the target's argmax: the tokens of decoding without drafts.
- Sampled: ``d_{i+1}`` was drawn from ``Q`` with the request's draft stream; it is accepted iff
  ``u < P(d)·ΣQ / (Q(d)·ΣP)`` (``u``: the request's acceptance stream at that position, compared exactly in
  integers), else the token is drawn from the residual ``max(0, P·ΣQ − Q·ΣP)`` with the request's main stream.
  This is speculative sampling (Leviathan et al.; Chen et al.): every emitted token is distributed as the
  target's own distribution.
- All drafts accepted: the bonus token is ``sample`` of ``L_m`` (the main stream), as without drafts.

Every random number is the request's counter stream at the token's position, so a seeded request is
reproducible run to run.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from .core import SampleRequest
from .sampler import MaskError, distribution, sample, stream_seed, uniform_bits

__all__ = ["DRAFT_STREAM", "ACCEPT_STREAM", "draft_request", "verify_lane"]

DRAFT_STREAM = 0x64726166745F7374  # "draft_st": the stream drafts are sampled from
ACCEPT_STREAM = 0x6163636570745F73  # "accept_s": the stream acceptance tests draw from


def draft_request(r: SampleRequest) -> SampleRequest:
    """The draft's sampling inputs for a target row's: the same everything, the request's draft stream."""
    return r._replace(seed=stream_seed(r.seed, DRAFT_STREAM))


def _dist(row: np.ndarray, r: SampleRequest, token_limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    return distribution(row, r.params, counts=r.counts, token_limit=token_limit, mask=r.mask)


def _residual(p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray], r: SampleRequest) -> int:
    """Draw from ``max(0, P·ΣQ − Q·ΣP)`` over ``P``'s kept ids (in the sampler's order), exactly."""
    (pid, pm), (qid, qm) = p, q
    sp, sq = int(pm.sum(dtype=np.uint64)), int(qm.sum(dtype=np.uint64))
    qmass = dict(zip(qid.tolist(), qm.tolist(), strict=True))
    res = [max(0, int(a) * sq - qmass.get(t, 0) * sp) for t, a in zip(pid.tolist(), pm.tolist(), strict=True)]
    cum, acc = [], 0
    for v in res:
        acc += v
        cum.append(acc)
    if acc == 0:  # P == Q exactly (then acceptance had probability 1): draw from P
        return sample_from(pid, pm, r)
    t = (uniform_bits(r.seed, r.position) * acc) >> 53
    return int(pid[bisect.bisect_right(cum, t)])


def sample_from(ids: np.ndarray, masses: np.ndarray, r: SampleRequest) -> int:
    cum = np.cumsum(masses, dtype=np.uint64).tolist()
    t = (uniform_bits(r.seed, r.position) * cum[-1]) >> 53
    return int(ids[bisect.bisect_right(cum, t)])


def _accepts(
    p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray], d: int, r: SampleRequest
) -> bool:
    (pid, pm), (qid, qm) = p, q
    pd = int(pm[pid == d].sum(dtype=np.uint64))
    qd = int(qm[qid == d].sum(dtype=np.uint64))
    if qd == 0:  # the draft was drawn elsewhere (it cannot be under the same inputs): never accepted
        return False
    sp, sq = int(pm.sum(dtype=np.uint64)), int(qm.sum(dtype=np.uint64))
    u = uniform_bits(stream_seed(r.seed, ACCEPT_STREAM), r.position)
    return u * qd * sp < (pd * sq) << 53


def verify_lane(
    target: np.ndarray,
    draft: np.ndarray | None,
    drafts: Sequence[int],
    reqs: Sequence[SampleRequest],
    token_limit: int | None,
) -> list[int]:
    """The tokens one round emits: accepted drafts then one more (a correction or the bonus); a -1 at the end
    where a row allowed no token. ``target``: ``[m+1, V]`` rows; ``draft``: ``[m, V]`` rows (unused when the
    request is greedy, may be None then); ``reqs``: the ``m+1`` rows' sampling inputs (main stream)."""
    m = len(drafts)
    assert target.shape[0] == m + 1 and len(reqs) == m + 1
    out: list[int] = []
    for i, d in enumerate(drafts):
        r = reqs[i]
        try:
            p = _dist(target[i], r, token_limit)
        except MaskError:
            return [*out, -1]
        if r.params.temperature <= 0.0:
            t = int(p[0][0])
            out.append(t)
            if t != d:
                return out
            continue
        assert draft is not None, "a sampled request's round needs its draft rows"
        q = _dist(draft[i], r, token_limit)
        if _accepts(p, q, d, r):
            out.append(int(d))
            continue
        return [*out, _residual(p, q, r)]
    r = reqs[m]
    try:
        out.append(sample(target[m], r.params, seed=r.seed, position=r.position, counts=r.counts,
                          token_limit=token_limit, mask=r.mask))  # fmt: skip
    except MaskError:
        out.append(-1)
    return out
