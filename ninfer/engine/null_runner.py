"""``NullRunner``: the runner contract (core.py) without a model, for measuring what surrounds the engine.

Every step takes ``step_s`` seconds (a sleep, which frees the GIL as a GPU step's wait does) and every sampled
row gets its token at once, with no logits computed: ``ninfer serve --backend null`` and
``python -m ninfer.perf.bench_serving --backend null`` measure the engine's own Python work and the serving stack
(actor, Ray, HTTP) at a model's step rate on any machine. The token of a row is a pure function of the request's
seed and position, drawn from ``token_pool`` (ordinary text ids, so detokenization and stop checks do their usual
work), so a request's output is the same on every run and on both sides of a benchmark. Grammar masks are
ignored; ``ignore_eos`` requests never stop early unless the pool holds an end-of-sequence id.

``busy=True`` (``--null-busy``) spins in Python for the step time instead, holding the GIL as the CUDA engine's
step loop does (its thread is busy with Python most of a step: launches, sampling, detokenization): another
thread of the process then gets the GIL only by taking it from the step, so whatever the serving stack does per
token or per step on the engine's process (Ray's threads, the actor's event loop, encoding) shows as lost
throughput, as on the GPU. With a sleep that work hides in the step's wait.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .core import Batch, SampleRequest

__all__ = ["NullRunner", "DEFAULT_STEP_S"]

DEFAULT_STEP_S = 0.0015  # ~8 lanes at ~5,500 tok/s: the demo model's engine on the H200


class NullRunner:
    snapshot_bytes = 1  # a checkpoint holds nothing; the byte budget still counts them
    page_bytes = 1
    host_pages = 0  # no host tier (docs/tiering.md): nothing to spill
    vocab_size: int

    def __init__(
        self, vocab_size: int, token_pool: Sequence[int], step_s: float = DEFAULT_STEP_S, busy: bool = False
    ) -> None:
        if not token_pool:
            raise ValueError("token_pool: the null runner needs at least one token id to emit")
        if not (isinstance(step_s, int | float) and 0 <= step_s <= 1):
            raise ValueError(f"step_s: must be in [0, 1] seconds, got {step_s!r}")
        self.vocab_size = int(vocab_size)
        self._pool = [int(t) for t in token_pool]
        if not isinstance(busy, bool):
            raise ValueError(f"busy: must be a bool, got {busy!r}")
        self._step_s = float(step_s)
        self._busy = busy

    def execute(self, batch: Batch) -> None:
        if self._step_s > 0 and batch.work:
            if not self._busy:
                time.sleep(self._step_s)
                return
            end = time.perf_counter() + self._step_s
            while time.perf_counter() < end:  # the GIL held, given up only when another thread asks for it
                pass

    def sample(
        self, rows: Sequence[int], reqs: Sequence[SampleRequest], token_limit: int | None
    ) -> list[int]:
        n = len(self._pool)
        return [self._pool[(r.seed + r.position) % n] for r in reqs]

    def copies_done(self, wait: bool) -> list[tuple[int, float]]:
        return []  # no host tier, no restores
