"""Token-level negative log-likelihood and perplexity of a text under a loaded model, with a sliding window.

Windows follow the transformers recipe: window k covers tokens ``[k·S, min(k·S + N, T))`` (N the context, S the
stride, 1 ≤ S ≤ N) and scores only the tokens that no earlier window scored; the first token of a window is never
scored (nothing predicts it), so with ``S == N`` the first token of every window goes unscored, exactly as
transformers' shifted loss with ``labels[:-trg_len] = -100`` does. Each window starts from an empty state (the
GDN recurrence cannot drop its oldest tokens: ``Model.open_sequence``) and is prefilled in chunks of
``prefill_chunk`` tokens, the same forward-with-carried-state path the engine's prefill and ``Model.logits`` use;
logits are computed only for the rows that predict scored tokens, ``LOGIT_ROWS`` rows at a time, so memory stays
bounded by ``LOGIT_ROWS × vocab`` whatever the window length. The sum is accumulated in float64.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

__all__ = ["Window", "PerplexityResult", "windows", "window_nll", "perplexity", "mean_kl", "LOGIT_ROWS"]

LOGIT_ROWS = 128
"""Rows of logits materialized at once (a [128, V] float32 block: 127 MB at the real 248K vocabulary)."""


class Window(msgspec.Struct, frozen=True, kw_only=True):
    begin: int  # first token of the window
    end: int  # one past its last token
    first_target: int  # first scored token (absolute position); tokens first_target..end-1 are scored


class PerplexityResult(msgspec.Struct, frozen=True, kw_only=True):
    tokens: int  # tokens of the text
    scored_tokens: int  # tokens whose NLL is summed
    windows: int
    context: int
    stride: int
    nll_sum: float  # nats
    nll_mean: float  # nats per scored token (transformers' loss over the whole text)
    perplexity: float  # exp(nll_mean)
    bits_per_token: float
    seconds: float
    tokens_per_s: float  # prefilled tokens (all windows, overlaps counted) per second


def windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    """The sliding windows over ``n_tokens`` tokens; every token but the first is scored exactly once when
    ``stride < context`` (with ``stride == context`` each window's first token is unscored)."""
    if n_tokens < 2:
        raise ValueError(f"the text has {n_tokens} token(s); perplexity needs at least 2")
    if context < 2:
        raise ValueError(f"--context: must be at least 2, got {context}")
    if not 1 <= stride <= context:
        raise ValueError(f"--stride: must be in 1..context ({context}), got {stride}")
    out: list[Window] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        first = max(prev_end, begin + 1)  # the window's own first token has no prediction
        if first < end:
            out.append(Window(begin=begin, end=end, first_target=first))
        prev_end = end
        if end == n_tokens:
            break
    return out


def _log_probs_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log p(target) per row, in float64 (logsumexp with the row max subtracted)."""
    z = logits.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
    return z[np.arange(z.shape[0]), targets] - lse


def mean_kl(ref: np.ndarray, got: np.ndarray) -> float:
    """Mean over rows of KL(softmax(ref) || softmax(got)) in nats (float64): what a change of arithmetic costs
    against reference logits (tests/test_cuda_model.py, perf/fidelity_prefill.py)."""

    def logp(z: np.ndarray) -> np.ndarray:
        z = z.astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lg = logp(ref), logp(got)
    return float(np.mean(np.sum(np.exp(lr) * (lr - lg), axis=-1)))


def window_nll(model: Any, ids: np.ndarray, w: Window, prefill_chunk: int) -> float:
    """Summed NLL (nats) of tokens ``w.first_target .. w.end-1`` given the window's tokens before each, under
    ``model`` (a ``ninfer.model.Model``: a fresh sequence of its backend per window)."""
    net, feed = model.net, model.open_sequence(w.end - w.begin)
    first_row = w.first_target - 1 - w.begin  # row of the window whose logits predict the first target
    total = 0.0
    for c0 in range(w.begin, w.end, prefill_chunk):
        c1 = min(c0 + prefill_chunk, w.end)
        h = feed(ids[c0:c1])
        # rows r (window-relative) in this chunk that predict a scored token: r >= first_row, r + 1 < window len
        lo = max(first_row, c0 - w.begin)
        hi = min(c1 - w.begin, w.end - w.begin - 1)
        for r0 in range(lo, hi, LOGIT_ROWS):
            r1 = min(r0 + LOGIT_ROWS, hi)
            rows = h[r0 - (c0 - w.begin) : r1 - (c0 - w.begin)]
            logits = np.asarray(net.lm_head(rows))
            targets = ids[w.begin + r0 + 1 : w.begin + r1 + 1]
            total -= float(_log_probs_at(logits, targets).sum())
    return total


def perplexity(
    model: Any,
    token_ids: Sequence[int],
    *,
    context: int,
    stride: int,
    prefill_chunk: int = 512,
    progress: Callable[[int], None] | None = None,
) -> PerplexityResult:
    """Perplexity of ``token_ids`` under ``model`` (a ``ninfer.model.Model``). ``progress(n)`` is called with the
    number of tokens scored after each window."""
    if prefill_chunk < 1:
        raise ValueError(f"--prefill-chunk: must be positive, got {prefill_chunk}")
    vocab = model.config.vocab_size
    ids = np.asarray(list(token_ids), dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must be in 0..{vocab - 1}")
    plan = windows(int(ids.size), context, stride)
    t0 = time.perf_counter()
    nll, scored, computed = 0.0, 0, 0
    for w in plan:
        nll += window_nll(model, ids, w, prefill_chunk)
        scored += w.end - w.first_target
        computed += w.end - w.begin
        if progress is not None:
            progress(w.end - w.first_target)
    dt = time.perf_counter() - t0
    mean = nll / scored
    return PerplexityResult(
        tokens=int(ids.size),
        scored_tokens=scored,
        windows=len(plan),
        context=context,
        stride=stride,
        nll_sum=nll,
        nll_mean=mean,
        perplexity=math.exp(mean),
        bits_per_token=mean / math.log(2),
        seconds=dt,
        tokens_per_s=computed / dt if dt > 0 else 0.0,
    )
