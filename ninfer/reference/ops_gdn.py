"""fp32 NumPy ops of the Gated DeltaNet mixer (docs/model-math.md §4), re-exported by ``ops``.

Shapes: q, k ``[T,HK,dk]``; v ``[T,HV,dv]``; g, beta ``[T,HV]``; recurrent state ``S[HV,dk,dv]`` (FLA layout).
V head j reads QK head j // (HV/HK). q and k arrive l2-normed (``l2norm``); the 1/√dk query scale is applied
inside ``gdn_chunked`` / ``gdn_recurrent``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ninfer.reference.activations import sigmoid, silu, softplus

__all__ = [
    "conv1d_causal",
    "l2norm",
    "gdn_gates",
    "gdn_recurrent",
    "gdn_chunked",
    "solve_unit_lower",
    "gated_rmsnorm",
]

F32 = np.float32
CHUNK = 64  # HF/FLA chunk length; the chunked form is exact for any length, this only fixes the work shape


def conv1d_causal(x: np.ndarray, state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv (§4.1), no activation: ``y_t[c] = Σ_j w[c,j]·x_{t−K+1+j}[c]``.

    ``x[T,C]`` raw inputs, ``state[C,K−1]`` the previous K−1 raw inputs (oldest first; zeros at the start),
    ``w[C,K]`` (tap K−1 is the current token). Returns ``y[T,C]`` and the new state ``[C,K−1]``.
    """
    t = x.shape[0]
    taps = w.shape[1]
    xx = np.concatenate([state.T, x], axis=0)  # [K−1+T, C]
    y = xx[0:t] * w[:, 0]
    for j in range(1, taps):
        y = y + xx[j : j + t] * w[:, j]
    return y.astype(F32, copy=False), np.ascontiguousarray(xx[t:].T)


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x·rsqrt(Σx²+eps) over the last axis (eps 1e-6 as HF/FLA)."""
    ss = np.sum(x * x, axis=-1, keepdims=True, dtype=F32)
    return (x * (F32(1.0) / np.sqrt(ss + F32(eps)))).astype(F32, copy=False)


def gdn_gates(
    a: np.ndarray, b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """beta = sigmoid(b); g = −exp(A_log)·softplus(a + dt_bias), softplus linear above 20 (§4.3). fp32."""
    g = (-np.exp(a_log.astype(F32)) * softplus((a + dt_bias).astype(F32))).astype(F32)
    return sigmoid(b.astype(F32)), g


def _heads_first(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repeat q/k to the V heads (head j uses QK head j//ratio) and move heads first: ``[HV,T,d]``."""
    ratio = v.shape[1] // q.shape[1]
    q = np.repeat(q, ratio, axis=1) * F32(1.0 / np.sqrt(q.shape[-1]))
    k = np.repeat(k, ratio, axis=1)
    qh, kh, vh = (np.ascontiguousarray(a.transpose(1, 0, 2), dtype=F32) for a in (q, k, v))
    return qh, kh, vh


def gdn_recurrent(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Token-by-token recurrence (§4.5), per V head: S ← e^g·S; δ = β(v − Sᵀk); S ← S + kδᵀ; o = Sᵀq/√dk.

    Decay before the delta, output read after the update. Returns ``o[T,HV,dv]`` and the new state.
    """
    qh, kh, vh = _heads_first(q, k, v)
    s = state.astype(F32, copy=True)
    out = np.empty_like(vh)
    for t in range(qh.shape[1]):
        s *= np.exp(g[t])[:, None, None]
        kv_mem = np.matmul(kh[:, t, None, :], s)[:, 0, :]  # Sᵀk: [HV, dv]
        delta = (vh[:, t] - kv_mem) * beta[t][:, None]
        s += kh[:, t, :, None] * delta[:, None, :]
        out[:, t] = np.matmul(qh[:, t, None, :], s)[:, 0, :]
    return np.ascontiguousarray(out.transpose(1, 0, 2)), s


def solve_unit_lower(lower: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X with (I + lower)·X = rhs, ``lower[...,C,C]`` strictly lower triangular, by forward substitution."""
    x = np.empty_like(rhs)
    x[..., 0, :] = rhs[..., 0, :]
    for i in range(1, rhs.shape[-2]):
        x[..., i, :] = rhs[..., i, :] - np.matmul(lower[..., i, None, :i], x[..., :i, :])[..., 0, :]
    return x


def _chunk(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    s: np.ndarray,
    scratch: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One chunk, all heads at once: q, k ``[HV,C,dk]``, v ``[HV,C,dv]``, g, beta ``[HV,C]``, S ``[HV,dk,dv]``.
    ``scratch``: applied to what the CUDA prep stores for the state pass (q, k, W and A), to measure what a
    narrower scratch would cost (``perf/fidelity_prefill.py``); None keeps them."""
    c = q.shape[1]
    gam = np.cumsum(g, axis=-1, dtype=F32)  # γ_i
    causal = np.tril(np.ones((c, c), dtype=bool))
    # D_ij = e^{γ_i−γ_j} for j ≤ i; masked before exp so no exponent is ever positive
    decay = np.exp(np.where(causal, gam[:, :, None] - gam[:, None, :], -np.inf)).astype(F32)
    kb = k * beta[..., None]
    lower = np.where(np.tril(causal, -1), np.matmul(kb, k.transpose(0, 2, 1)) * decay, F32(0.0))
    eg = np.exp(gam)[..., None]
    rhs = np.concatenate([v * beta[..., None], kb * eg], axis=-1)  # [diag(β)V | diag(βe^γ)K]
    uw = solve_unit_lower(lower, rhs)
    u, w = uw[..., : v.shape[-1]], uw[..., v.shape[-1] :]
    attn = np.matmul(q, k.transpose(0, 2, 1)) * decay  # QKᵀ ⊙ D, diagonal included
    if scratch is not None:  # the state pass's inputs as a narrower scratch would hold them
        q, k, w, attn = scratch(q), scratch(k), scratch(w), scratch(attn)
    v_new = u - np.matmul(w, s)  # V' = U − W·S
    out = np.matmul(q * eg, s) + np.matmul(attn, v_new)
    last = gam[:, -1:]  # γ_C
    k_tail = k * np.exp(last - gam)[..., None]
    s = s * np.exp(last)[..., None] + np.matmul(k_tail.transpose(0, 2, 1), v_new)
    return out.astype(F32, copy=False), s.astype(F32, copy=False)


def gdn_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = CHUNK,
    scratch: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Chunked prefill form (§4.6) of ``gdn_recurrent``: same result to fp32 noise, chunks of ``chunk`` tokens
    counted from the first token of this call (the last one may be shorter). Returns ``o[T,HV,dv]``, new state.
    ``scratch``: see ``_chunk`` (a fidelity experiment; None, the default, is the exact form)."""
    qh, kh, vh = _heads_first(q, k, v)
    gh = np.ascontiguousarray(g.T, dtype=F32)
    bh = np.ascontiguousarray(beta.T, dtype=F32)
    s = state.astype(F32, copy=True)
    out = np.empty_like(vh)
    for a in range(0, qh.shape[1], chunk):
        z = slice(a, a + chunk)
        out[:, z], s = _chunk(qh[:, z], kh[:, z], vh[:, z], gh[:, z], bh[:, z], s, scratch)
    return np.ascontiguousarray(out.transpose(1, 0, 2)), s


def gated_rmsnorm(x: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """GDN output norm per head (§2): (x·rsqrt(mean(x²)+eps))·w·SiLU(z); plain w, no +1."""
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    xn = x * (F32(1.0) / np.sqrt(var + F32(eps)))
    return (xn * w * silu(z)).astype(F32, copy=False)
