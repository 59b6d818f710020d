"""Model-level measurements of ``CudaQwen36``: prefill and TTFT, decode at several lane counts with a long
context, and a follow-up agent turn that resumes from a GDN checkpoint with the KV prefix kept. The sequences are
integer ids of a ``ninfer.cuda.sequences.Sequences`` over the network's pools (the caller sizes it).

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


def bench_prefill(seqs: Any, n_tokens: int, chunk: int, seed: int = 0) -> tuple[dict[str, float], int]:
    """Prefill ``n_tokens`` random ids in chunks of ``chunk`` on a fresh sequence; TTFT adds the last row's logits.
    Returns the figures and the sequence's id (a follow-up turn can resume from it; the caller frees it)."""
    net = seqs.net
    ids = np.random.default_rng(seed).integers(0, net.cfg.vocab_size, n_tokens)
    sid = seqs.new()
    _sync()
    t0 = time.perf_counter()
    for a in range(0, n_tokens, chunk):
        h = seqs.forward(sid, ids[a : a + chunk])
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
    return fig, sid


def lane_tokens(lanes: int, vocab: int) -> np.ndarray:
    """One token id per lane, all different: the lanes' hidden states differ, so a MoE model's lanes route to
    different experts as real requests do (the same id in every lane routed all of them to the same k experts,
    which read 1/lanes of the expert bytes the roofline counts for random routing)."""
    return (np.arange(lanes, dtype=np.int64) * 7919 + 11) % vocab


def bench_decode(seqs: Any, lanes: int, context: int, steps: int, *, graph: bool = True) -> dict[str, float]:
    """``steps`` decode steps of ``lanes`` sequences sitting at position ``context`` (logits included)."""
    net = seqs.net
    saved = net.cuda_graph
    net.cuda_graph = graph
    sids = [seqs.new() for _ in range(lanes)]
    for s in sids:
        seqs.reserve(s, context + steps + 2)
        seqs.seek(s, context)
    held = [(seqs.slot(s), seqs.pages(s)) for s in sids]
    ids = lane_tokens(lanes, net.cfg.vocab_size)

    def step(i: int) -> None:
        net.decode(ids, [(slot, context + i, pages) for slot, pages in held], logits=True)

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
        for s in sids:
            seqs.free(s)
    return {
        "lanes": lanes, "context": context, "graph": graph, "step_ms": dt * 1e3,
        "tok_s": lanes / dt, "first_step_s": capture_s,
    }  # fmt: skip


def bench_followup(seqs: Any, first: int, new_tokens: int, repeats: int = 3) -> dict[str, float]:
    """An agent's next turn after the prompt held by sequence ``first`` (KV pages kept, GDN state checkpointed into
    another slot), with ``new_tokens`` more: one state copy plus the new tokens instead of the whole prompt again.

    The turn runs ``repeats`` times from the same checkpoint: ``ttft_reuse_first_s`` is the process's first forward
    of that many rows (allocations, first launches of its kernel instances), ``ttft_reuse_s`` the median of the
    others (a server that has served turns before)."""
    net = seqs.net
    context = seqs.length(first)
    ids = np.random.default_rng(5).integers(0, net.cfg.vocab_size, new_tokens)
    ckpt = seqs.new()
    net.copy_slot(seqs.slot(first), seqs.slot(ckpt))
    times = []
    for _ in range(max(2, repeats)):
        nxt = seqs.new()
        _sync()
        t0 = time.perf_counter()
        seqs.share(nxt, first)  # the prefix pages are shared (reference-counted)
        net.copy_slot(seqs.slot(ckpt), seqs.slot(nxt))
        h = seqs.forward(nxt, ids)
        net.logits_dev(h[-1:])
        _sync()
        times.append(time.perf_counter() - t0)
        seqs.free(nxt)  # the turn's own pages back to the pool; the prefix stays with ``first``
    seqs.free(ckpt)
    return {
        "context": context,
        "new_tokens": new_tokens,
        "ttft_reuse_s": float(np.median(times[1:])),
        "ttft_reuse_first_s": times[0],
    }
