"""Greedy decode through the CUDA engine's ``Sequences`` (prefill each prompt, then batched decode steps), shared by
the GPU tests that compare two ways of running the same network (graph and eager, folded norms, MoE fusions)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["greedy"]


def greedy(seqs: Any, prompts: list[np.ndarray], steps: int) -> tuple[list[list[int]], np.ndarray]:
    """Each prompt prefilled in its own sequence, then ``steps`` greedy decode steps of all of them as one batch:
    (the tokens per sequence, the logits ``[steps, sequences, vocab]``). The sequences are freed."""
    net, sids = seqs.net, [seqs.new() for _ in prompts]
    last = np.stack([net.lm_head(seqs.forward(s, p)[-1:])[0] for p, s in zip(prompts, sids, strict=True)])
    toks, logits = [], []
    for _ in range(steps):
        nxt = last.argmax(-1)
        toks.append(nxt.tolist())
        last = net.lm_head(seqs.forward_batch(nxt, sids))
        logits.append(last)
    for s in sids:
        seqs.free(s)
    return [list(t) for t in zip(*toks, strict=True)], np.stack(logits)
