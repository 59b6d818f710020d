"""PLE n-gram hashing (docs/flash-next.md §7): token history -> n-gram table row ids, one kernel's worth of math.

Per token p and shift k (0..n-1): t_k(p) = id(p-k), but the pad id (EOS) if p-k is before the sequence or any of
positions p-k..p-1 holds EOS, so n-grams never cross an EOS. Order-m mix (m = 2..n) = XOR over k<m of t_k·mult_k;
head j of order m reads row mix mod P_j + O_j. Heads 0..H-1 are bigrams, H..2H-1 trigrams (H = heads_per_ngram).
All products fit int64: t < vocab and mult < 2^63 / vocab.
"""

from __future__ import annotations

import numpy as np

__all__ = ["splitmix64", "ngram_multipliers", "ngram_shifted_ids", "ngram_row_ids", "ngram_context_after"]

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_LAYER_PRIME = 10007


def splitmix64(x: int) -> int:
    """The standard splitmix64 output step (adds γ first), mod 2^64."""
    z = (x + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return (z ^ (z >> 31)) & _MASK64


def ngram_multipliers(vocab_size: int, ngram_size: int, ple_rank: int, seed: int) -> np.ndarray:
    """Odd hash multipliers ``[ngram_size]`` int64 of PLE layer ``ple_rank`` (its index in ple_layer_ids).

    m_k = 2·(splitmix64(x_k) mod B) + 1, x_k = (seed + 10007·rank + γ·(k+1)) mod 2^64,
    B = max(1, ((2^63-1)//vocab)//2). Seed 1234, rank 0, vocab 248320 gives
    [23703573157769, 20109073645365, 8052911324071].
    """
    half = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _LAYER_PRIME * ple_rank
    mult = [2 * (splitmix64((base + _GAMMA * (k + 1)) & _MASK64) % half) + 1 for k in range(ngram_size)]
    return np.array(mult, dtype=np.int64)


def ngram_shifted_ids(context: np.ndarray, ids: np.ndarray, pad_id: int, ngram_size: int) -> np.ndarray:
    """Shifted ids ``[ngram_size, T]`` (row k = t_k) for new tokens ``ids[T]`` after ``context[n-1]``, the last
    n-1 ids of the sequence (pad ids before its start)."""
    hist = np.concatenate([np.asarray(context, np.int64), np.asarray(ids, np.int64)])
    n_ctx = ngram_size - 1
    t = len(ids)
    pos = np.arange(n_ctx, n_ctx + t)
    is_pad = hist == pad_id
    out = np.empty((ngram_size, t), np.int64)
    out[0] = hist[pos]
    blocked = np.zeros(t, dtype=bool)  # any pad among positions p-k..p-1 so far
    for k in range(1, ngram_size):
        blocked |= is_pad[pos - k]
        out[k] = np.where(blocked, pad_id, hist[pos - k])
    return out


def ngram_row_ids(
    shifted: np.ndarray,
    multipliers: np.ndarray,
    head_sizes: np.ndarray,
    head_offsets: np.ndarray,
    heads_per_ngram: int,
) -> np.ndarray:
    """Table rows ``[T, (n-1)·heads_per_ngram]`` (int64) for shifted ids ``[n, T]``."""
    n = shifted.shape[0]
    mix = shifted[0] * multipliers[0]
    cols = []
    for order in range(2, n + 1):
        mix = np.bitwise_xor(mix, shifted[order - 1] * multipliers[order - 1])
        lo = (order - 2) * heads_per_ngram
        sizes = np.asarray(head_sizes[lo : lo + heads_per_ngram], np.int64)
        offs = np.asarray(head_offsets[lo : lo + heads_per_ngram], np.int64)
        cols.append(np.remainder(mix[:, None], sizes[None, :]) + offs[None, :])
    return np.concatenate(cols, axis=1)


def ngram_context_after(context: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The n-gram context (last n-1 ids of the history) after appending ``ids``."""
    n_ctx = len(context)
    hist = np.concatenate([np.asarray(context, np.int64), np.asarray(ids, np.int64)])
    return hist[len(hist) - n_ctx :].copy()
