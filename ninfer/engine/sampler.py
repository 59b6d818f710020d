"""Sampling one token from one logits row: penalties, token mask, greedy or temperature/top-k/top-p/min-p.

The definition below is the engine's sampler on every backend: this NumPy code is the oracle and
``cuda_src/sampling.cu`` computes the same function on the GPU. Every reduction is exact integer arithmetic (no
float sums whose value depends on their order), so a request's tokens are a pure function of (logits, params,
seed, position), independent of the batch, of step boundaries and of the backend. For one row:

1. ``x`` = the float32 logits. Penalties (generated tokens only, ``apply_penalties``), in float32 with one
   rounding per operation: repetition ``x / r`` if ``x > 0`` else ``x * r``; then ``(x - f * count) - p``.
2. Banned: ids ``>= token_limit``, ids the mask disallows (a bool ``[V]`` array, or the XGrammar packed int32
   bitmask, LSB-first), and NaN logits. Nothing allowed: ``MaskError`` (the GPU returns -1 for the row).
3. ``temperature <= 0``: the allowed argmax of ``x``, the lowest id on ties (``-0 == +0``).
4. ``m`` = the largest allowed ``x``; ``e_i = exp((double(x_i) - double(m)) / double(T))``, and ``e_i = 1`` where
   ``x_i == m`` (so infinite logits are well defined); integer mass ``q_i = floor(e_i * 2^44)`` (uint64; the top
   token has exactly 2^44 and a vocabulary below 2^20 cannot overflow a uint64 sum).
5. Candidates: allowed ids with ``q_i > 0`` and, when ``min_p > 0``, ``e_i >= min_p`` (a prefix of the order:
   ``e`` grows with ``x``). Order: descending ``x``, ties by ascending id, i.e. descending 64-bit key
   ``ordered_bits(x) << 32 | (0xFFFFFFFF - id)`` (``ordered_bits``: the float's bits mapped so that unsigned order
   is float order, ``-0`` taken as ``+0``).
6. ``0 < top_k < n`` (n candidates): keep the first ``top_k``.
7. ``top_p < 1``: ``S`` = sum of kept ``q``; ``target = min(max(ceil(top_p * double(S)), 1), S)``; keep the
   shortest prefix whose cumulative ``q`` reaches ``target``.
8. Draw: ``u = uniform(seed, position)``; ``S'`` = sum of kept ``q``; ``t = floor(u * double(S'))`` (uint64);
   pick the first kept token whose cumulative ``q`` exceeds ``t``; if none (``double(S')`` rounded up), the
   last kept one.

Consequences. A token whose probability is below 2^-44 of the top token's has zero mass and is never sampled (the
mass lost is below ``V * 2^-44`` of the total): the price of exactness. ``exp`` may differ by an ulp between
NumPy and CUDA, so a ``q_i`` may differ by one unit (and ``e_i >= min_p`` may flip when ``e_i`` is within an ulp
of ``min_p``); a different token then needs ``u`` within a few 2^-44 of a boundary, so backends agree on every
token in practice. Conversions ``uint64 -> double`` round to nearest even on both sides (Python ``float(int)``,
CUDA ``__ull2double_rn``).

Randomness is counter-based: the uniform for a request's token at sequence position ``pos`` is a pure function of
``(seed, pos)`` (SplitMix64 finalizer, 53-bit double).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .core import SampleRequest, SamplingParams, TokenMask

__all__ = [
    "sample",
    "distribution",
    "uniform",
    "uniform_bits",
    "stream_seed",
    "MaskError",
    "apply_penalties",
    "allowed_from_mask",
    "compute_mask",
    "resolve_mask",
    "NOT_COMPUTED",
    "MaskWorker",
    "SampleRequest",
    "sample_host",
    "packed_mask",
    "sort_keys",
]

_M64 = (1 << 64) - 1
_ONE = float(1 << 44)  # the top token's integer mass


class MaskError(RuntimeError):
    """The request's token mask allowed no token (or failed)."""


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def uniform_bits(seed: int, position: int) -> int:
    """The 53-bit integer behind ``uniform(seed, position)`` (= ``uniform_bits / 2^53``)."""
    return _mix64(_mix64(seed & _M64) ^ (position & _M64)) >> 11


def uniform(seed: int, position: int) -> float:
    """The request's uniform in [0, 1) for the token at ``position``."""
    return uniform_bits(seed, position) * (1.0 / (1 << 53))


def stream_seed(seed: int, stream: int) -> int:
    """The key of an independent counter stream of a request (speculative drafting and acceptance)."""
    return _mix64((seed ^ stream) & _M64)


def apply_penalties(logits: np.ndarray, counts: Mapping[int, int], p: SamplingParams) -> np.ndarray:
    """Repetition (divide positive / multiply negative), frequency (- f * count) and presence (- p) penalties."""
    if not counts or (
        p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
    ):
        return logits
    ids = np.fromiter(counts.keys(), np.int64, len(counts))
    cnt = np.fromiter(counts.values(), np.float32, len(counts))
    out = logits.copy()
    x = out[ids]
    if p.repetition_penalty != 1.0:
        r = np.float32(p.repetition_penalty)
        x = np.where(x > 0, x / r, x * r)
    x = x - np.float32(p.frequency_penalty) * cnt - np.float32(p.presence_penalty)
    out[ids] = x
    return out


def allowed_from_mask(mask: np.ndarray, vocab: int) -> np.ndarray:
    """A token mask as bool[vocab]: a bool array as is, or an XGrammar packed int32 bitmask unpacked LSB-first."""
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        if m.shape != (vocab,):
            raise MaskError(f"token mask has shape {m.shape}, expected ({vocab},)")
        return m
    if m.dtype in (np.int32, np.uint32) and m.shape == (-(-vocab // 32),):
        bits = np.unpackbits(m.astype("<u4").view(np.uint8), bitorder="little")
        return bits[:vocab].astype(bool)
    raise MaskError(f"token mask must be bool[{vocab}] or int32[{-(-vocab // 32)}], got {m.dtype}{m.shape}")


NOT_COMPUTED: Any = object()  # ``sample(mask=...)`` default: call the hook at sampling time


def compute_mask(token_mask: TokenMask, generated: Sequence[int]) -> Any:
    """Call a request's mask hook: its mask (or None), or the ``MaskError`` it raised, to be raised at sampling.
    The engine calls this on its mask worker while the model step runs (grammar work overlaps the step)."""
    try:
        return token_mask(generated)
    except Exception as e:  # noqa: BLE001 - a failing hook fails its request, never the engine
        return MaskError(f"token mask failed: {type(e).__name__}: {e}")


def resolve_mask(mask: Any, token_mask: TokenMask | None, generated: Sequence[int]) -> Any:
    """The mask to apply: ``mask`` as computed ahead, or the hook's result now when it is ``NOT_COMPUTED``
    (None without a hook). Raises the ``MaskError`` the hook produced."""
    if mask is NOT_COMPUTED:
        mask = compute_mask(token_mask, generated) if token_mask is not None else None
    if isinstance(mask, MaskError):
        raise mask
    return mask


def distribution(
    logits: np.ndarray,
    p: SamplingParams,
    *,
    counts: Mapping[int, int],
    token_limit: int | None = None,
    mask: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1-7 of the module's definition: the kept ids in the sampler's order and their integer masses
    (uint64). Greedy (``temperature <= 0``): the allowed argmax alone, mass 1. ``mask``: a resolved mask (or None).
    Raises ``MaskError`` when nothing is allowed. Speculative verification (``speculate_host``) compares these
    exact masses for the draft and the target."""
    x = apply_penalties(np.asarray(logits, np.float32), counts, p)
    allowed = ~np.isnan(x)
    if token_limit is not None and token_limit < x.shape[0]:
        allowed[max(token_limit, 0) :] = False
    if mask is not None:
        allowed &= allowed_from_mask(mask, x.shape[0])
    ids = np.flatnonzero(allowed)
    if ids.size == 0:
        raise MaskError("token mask allows no token")
    xa = x[ids]
    m = xa.max()
    if p.temperature <= 0.0:
        return ids[np.argmax(xa == m)][None], np.ones(1, np.uint64)  # the first (lowest) id holding the max
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp((xa.astype(np.float64) - np.float64(m)) / float(p.temperature))
    e[xa == m] = 1.0  # also where m is infinite (inf - inf is NaN)
    q = np.floor(e * _ONE).astype(np.uint64)
    cand = q > 0
    if p.min_p > 0.0:
        cand &= e >= p.min_p
    ids, xa, q = ids[cand], xa[cand], q[cand]  # only the candidates are sorted: cheap on peaked rows
    keys = sort_keys(xa, ids)  # distinct (the id is in them): any sort gives the same order
    order = np.arange(keys.size)
    if 0 < p.top_k < keys.size:  # the first top_k only: partition, then sort those
        order = np.argpartition(keys, keys.size - p.top_k)[-p.top_k :]
    order = order[np.argsort(keys[order])[::-1]]
    q = q[order]
    keep = q.size
    if p.top_p < 1.0:
        csum = np.cumsum(q, dtype=np.uint64)  # exact: the total stays below 2^64
        total = int(csum[-1])
        target = min(max(math.ceil(p.top_p * float(total)), 1), total)
        keep = int(np.searchsorted(csum, np.uint64(target), side="left")) + 1
    return ids[order[:keep]], q[:keep]


def sample(
    logits: np.ndarray,
    p: SamplingParams,
    *,
    seed: int,
    position: int,
    counts: Mapping[int, int],
    generated: Sequence[int] = (),
    token_mask: TokenMask | None = None,
    token_limit: int | None = None,
    mask: Any = NOT_COMPUTED,
) -> int:
    """Pick the token at ``position`` from ``logits`` [V] (the module's definition). ``token_limit``: ids at or
    above it are never picked. ``mask`` is the hook's result computed ahead (``compute_mask``); else ``token_mask``
    is called here."""
    mask = resolve_mask(mask, token_mask, generated)
    ids, q = distribution(logits, p, counts=counts, token_limit=token_limit, mask=mask)
    if p.temperature <= 0.0:
        return int(ids[0])
    csum = np.cumsum(q, dtype=np.uint64)
    t = math.floor(uniform(seed, position) * float(int(csum[-1])))
    i = int(np.searchsorted(csum, np.uint64(t), side="right"))  # first cumulative mass > t
    return int(ids[min(i, ids.size - 1)])


def sample_host(logits: np.ndarray, reqs: Sequence[SampleRequest], token_limit: int | None) -> list[int]:
    """``sample`` for each row of host ``logits[len(reqs), V]`` (-1 where nothing is allowed): a runner's
    ``sample`` on the CPU (core.py)."""
    out = []
    for row, r in zip(logits, reqs, strict=True):
        try:
            tok = sample(row, r.params, seed=r.seed, position=r.position, counts=r.counts,
                         token_limit=token_limit, mask=r.mask)  # fmt: skip
        except MaskError:
            tok = -1
        out.append(tok)
    return out


def sort_keys(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The uint64 order keys of float32 logits ``x`` at ``ids``: descending key = descending x, then ascending
    id (``-0`` is taken as ``+0``; NaN never reaches here)."""
    b = (np.asarray(x, np.float32) + np.float32(0.0)).view(np.uint32)  # -0 + 0 = +0
    hi = np.where(b >> 31, ~b, b | np.uint32(0x80000000)).astype(np.uint64)  # mapped in 32 bits, widened once
    return (hi << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - ids.astype(np.uint64))


def packed_mask(mask: Any, vocab: int) -> np.ndarray | None:
    """A resolved mask (``resolve_mask``'s result) as the packed int32 bitmask ``[ceil(vocab/32)]``, or None
    for no mask. Raises ``MaskError`` for a malformed mask."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype in (np.int32, np.uint32) and m.shape == (-(-vocab // 32),):
        return m.astype(np.uint32).view(np.int32)
    bits = np.pad(allowed_from_mask(m, vocab), (0, -vocab % 32))
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)


class MaskWorker:
    """Computes the token masks of a step's sampled requests on one worker thread while the model step runs
    (grammar work overlaps the step instead of adding to it). A mask depends only on the tokens generated
    before this step, so it is ready to apply when the step's logits arrive."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def start(self, reqs: Sequence[Any]) -> Future[dict[int, Any]]:
        todo = [(r.id, r.token_mask, r.generated) for r in reqs if r.token_mask is not None]
        if not todo:
            done: Future[dict[int, Any]] = Future()
            done.set_result({})
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ninfer-mask")
        return self._pool.submit(lambda: {rid: compute_mask(fn, gen) for rid, fn, gen in todo})

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
