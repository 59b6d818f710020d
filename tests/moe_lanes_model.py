"""NumPy models of the MoE expert lanes' inputs and slot table (cuda_src/moe_lanes.cu), shared by
tests/test_gemv_lanes_host.py, tests/gemv_lanes_emu.py and tests/test_cuda_moe_lanes.py."""

from __future__ import annotations

import numpy as np

from ninfer.cuda.moe_lanes import slot_bound

__all__ = ["routing", "table_model"]


def routing(
    rng: np.random.Generator, t: int, k: int, e: int, shared: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids, xrow, experts) as ffn_block builds them: routed pairs sorted by expert (skewed choices: some experts
    get many rows, some none), then the shared expert's id e once per token."""
    p = np.exp(rng.standard_normal(e) * 1.5)
    flat = np.stack([rng.choice(e, k, replace=False, p=p / p.sum()) for _ in range(t)]).reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int32)
    ids, xrow = flat[order].astype(np.int32), (order // k).astype(np.int32)
    if shared:
        ids = np.concatenate([ids, np.full(t, e, np.int32)])
        xrow = np.concatenate([xrow, np.arange(t, dtype=np.int32)])
    return ids, xrow, e + int(shared)


def table_model(ids: np.ndarray, xrow: np.ndarray, experts: int, nb: int) -> tuple[np.ndarray, ...]:
    """The slot table as moe_lanes.cu documents it."""
    z = slot_bound(ids.size, experts, nb)
    sid = np.full(z, -1, np.int32)
    tx, ts = np.full((z, 2, nb), -1, np.int32), np.full((z, 2, nb), -1, np.int32)
    at = 0
    for ex in range(experts):
        pairs = np.flatnonzero(ids == ex)
        for j in range(0, pairs.size, nb):
            g = pairs[j : j + nb]
            sid[at], tx[at, 0, : g.size], tx[at, 1, : g.size] = ex, xrow[g], g
            ts[at, 0, : g.size] = ts[at, 1, : g.size] = g
            at += 1
    return sid, tx.reshape(-1), ts.reshape(-1)
