"""Model-level measurements of ``CudaQwen36``: prefill and TTFT, decode at several lane counts with a long
context, and a follow-up agent turn that resumes from a GDN checkpoint with the KV prefix kept.

Decode lanes get a KV reservation of ``context`` positions whose contents are left at zero: a decode step's cost
does not depend on the values, and filling 8 lanes x 8K tokens by prefill would cost more device time than the
measurement itself. Every timing ends with a device synchronisation (wall clock, ``time.perf_counter``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["bench_prefill", "bench_decode", "bench_followup", "model_bytes"]


def _sync() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


def model_bytes(net: Any) -> dict[str, int]:
    """Matrix bytes and parameter counts of a network: total, without the embedding, and expert share."""
    from ninfer.cuda.weights import DeviceWeight

    out = {"matrix_bytes": 0, "embed_bytes": 0, "expert_bytes": 0, "params": 0, "expert_params": 0}
    for name, t in net.w.items():
        if not isinstance(t, DeviceWeight):
            continue
        if name == "embed_tokens.weight":
            out["embed_bytes"] += t.data.nbytes
            continue
        out["matrix_bytes"] += t.data.nbytes
        out["params"] += t.rows * t.cols
        if ".experts." in name:
            out["expert_bytes"] += t.data.nbytes
            out["expert_params"] += t.rows * t.cols
    return out


def bench_prefill(net: Any, n_tokens: int, chunk: int, seed: int = 0) -> tuple[dict[str, float], Any]:
    """Prefill ``n_tokens`` random ids in chunks of ``chunk`` on a fresh sequence; TTFT adds the last row's logits.
    Returns the figures and the sequence state (a follow-up turn can resume from it)."""
    ids = np.random.default_rng(seed).integers(0, net.cfg.vocab_size, n_tokens)
    state = net.new_state()
    _sync()
    t0 = time.perf_counter()
    for a in range(0, n_tokens, chunk):
        h = net.forward(ids[a : a + chunk], state)
    t1 = time.perf_counter()
    net.logits_dev(h[-1:])
    _sync()
    t2 = time.perf_counter()
    fig = {
        "tokens": n_tokens,
        "chunk": chunk,
        "prefill_s": t1 - t0,
        "ttft_s": t2 - t0,
        "tok_s": n_tokens / (t1 - t0),
    }
    return fig, state


def bench_decode(net: Any, lanes: int, context: int, steps: int, *, graph: bool = True) -> dict[str, float]:
    """``steps`` decode steps of ``lanes`` sequences sitting at position ``context`` (logits included)."""
    saved = net.cuda_graph
    net.cuda_graph = graph
    states = [net.new_state() for _ in range(lanes)]
    for s in states:
        net._grow(s, context + steps + 2)
        s.length = context
    ids = np.zeros(lanes, np.int64)

    def step(i: int) -> None:
        net.decode(ids, [(s.slot, context + i, s.pages) for s in states], logits=True)

    try:
        t0 = time.perf_counter()
        step(0)  # captures the graph of this lane count on first use
        capture_s = time.perf_counter() - t0
        step(1)
        t0 = time.perf_counter()
        for i in range(2, steps + 2):
            step(i)
        dt = (time.perf_counter() - t0) / steps
    finally:
        net.cuda_graph = saved
    return {
        "lanes": lanes, "context": context, "graph": graph, "step_ms": dt * 1e3,
        "tok_s": lanes / dt, "first_step_s": capture_s,
    }  # fmt: skip


def bench_followup(net: Any, first: Any, new_tokens: int, repeats: int = 3) -> dict[str, float]:
    """An agent's next turn after the prompt held by ``first`` (KV pages kept, GDN state checkpointed into another
    slot), with ``new_tokens`` more: one state copy plus the new tokens instead of the whole prompt again.

    The turn runs ``repeats`` times from the same checkpoint: ``ttft_reuse_first_s`` is the process's first forward
    of that many rows (allocations, first launches of its kernel instances), ``ttft_reuse_s`` the median of the
    others (a server that has served turns before)."""
    context = first.length
    ids = np.random.default_rng(5).integers(0, net.cfg.vocab_size, new_tokens)
    ckpt = net.new_state()
    net.copy_slot(first.slot, ckpt.slot)
    nxt = net.new_state()
    times = []
    for _ in range(max(2, repeats)):
        _sync()
        t0 = time.perf_counter()
        nxt.pages = list(
            first.pages
        )  # the prefix pages are shared (the finalizer of ``nxt`` frees none of them)
        nxt.length = context
        net.copy_slot(ckpt.slot, nxt.slot)
        h = net.forward(ids, nxt)
        net.logits_dev(h[-1:])
        _sync()
        times.append(time.perf_counter() - t0)
        net._free_pages.extend(nxt.pages[len(first.pages) :])  # the turn's own pages back to the pool
    return {
        "context": context,
        "new_tokens": new_tokens,
        "ttft_reuse_s": float(np.median(times[1:])),
        "ttft_reuse_first_s": times[0],
    }
