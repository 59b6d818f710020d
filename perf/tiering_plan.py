"""``perf/bench_tiering.py``'s scenario without a GPU (``--plan``): the engine's own plans at the 27B's sizes, with
a runner that computes nothing, to show what each step copies (host page ids, bytes) and the device memory each
size needs on one H200.

- ``PlanRunner``: the runner contract with the CUDA runner's page and checkpoint sizes; restores complete at once;
  ``steps`` records every batch's copies.
- ``device_plan``: ``ninfer.cuda.memory_plan.plan_memory`` for the bench's engine settings, with the weights
  estimated from the parameter shapes (the GPU run prints the plan of the real upload instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PlanRunner", "device_plan", "copy_plan", "H200_BYTES", "SEGMENT_PAGES"]

H200_BYTES = 139 * (1 << 30)  # what the H200 reports free with nothing loaded, about
SEGMENT_PAGES = 1024  # pages of the 27B's 1 MiB in one pinned segment (host_tier.SEGMENT_BYTES)


class PlanRunner:
    """The runner contract without a model: every sampled row gets token 0; copies are recorded."""

    def __init__(self, page_bytes: int, snapshot_bytes: int, host_pages: int, vocab_size: int) -> None:
        self.page_bytes, self.snapshot_bytes, self.host_pages = page_bytes, snapshot_bytes, host_pages
        self.vocab_size = vocab_size
        self.num_checkpoints = 0
        self.steps: list[dict[str, Any]] = []
        self._done: list[tuple[int, float]] = []

    def execute(self, batch: Any) -> None:
        spills = [c for c in batch.copies if not c.ticket]
        restores = [c for c in batch.copies if c.ticket]
        self.steps.append(
            dict(
                decode=sum(1 for w in batch.work if not w.prefill),
                prefill_tokens=sum(len(w.token_ids) for w in batch.work if w.prefill),
                spill_host_pages=sorted(h for c in spills for h in c.host_pages + c.host_ckpt),
                restore_host_pages=sorted(h for c in restores for h in c.host_pages + c.host_ckpt),
            )
        )
        self._done = [(t, 0.0) for t in sorted({c.ticket for c in restores})]

    def sample(self, rows: Sequence[int], reqs: Sequence[Any], token_limit: int | None) -> list[int]:
        return [1] * len(rows)

    def copies_done(self, wait: bool) -> list[tuple[int, float]]:
        out, self._done = self._done, []
        return out


def _weights_estimate(mc: Any) -> int:
    """NVFP4 body (4.5 bits per parameter) and bf16 embedding and head, from the config's shapes: an estimate."""
    h, layers, v = mc.hidden_size, mc.num_hidden_layers, mc.vocab_size
    body = layers * (
        3 * h * mc.intermediate_size + 4 * h * h
    )  # MLP and about four h x h projections per layer
    return int(body * 4.5 / 8) + 2 * v * h * 2


def device_plan(mc: Any, settings: dict[str, Any], act_bytes: int = 4) -> Any:
    """The device memory plan of the bench's engine settings (``perf/bench_tiering._settings``) on one H200."""
    from ninfer.cuda.memory_plan import plan_memory, snapshot_bytes
    from ninfer.engine import EngineConfig

    cfg = EngineConfig(**settings).for_model(mc)
    snap = snapshot_bytes(mc, cfg.gdn_state_dtype)
    lanes = cfg.max_concurrency
    return plan_memory(
        mc, weights=_weights_estimate(mc), free=H200_BYTES, lanes=lanes,
        checkpoints=cfg.checkpoint_budget(snap) // snap + lanes, num_pages=cfg.num_pages,
        page_size=cfg.page_size, max_context=cfg.max_context, prefill_chunk=cfg.prefill_chunk, attn_chunk=256,
        kv_dtype=cfg.kv_dtype, state_dtype=cfg.gdn_state_dtype, act_bytes=act_bytes, graphs=True,
        host_tier=True,
    )  # fmt: skip


def copy_plan(mc: Any, settings: dict[str, Any], context: int, new: int, decode: int) -> dict[str, Any]:
    """The bench's sequence on ``PlanRunner``: which steps copy which host pages, and which pinned segments the
    turn's step reaches for the first time (a segment pinned lazily inside that step stalls it)."""
    import numpy as np

    from ninfer.cuda.memory_plan import kv_page_bytes, snapshot_bytes
    from ninfer.engine import Engine, EngineConfig
    from ninfer.engine.config import GIB

    cfg = EngineConfig(**settings).for_model(mc)
    pb, snap = kv_page_bytes(mc, cfg.page_size, cfg.kv_dtype), snapshot_bytes(mc, cfg.gdn_state_dtype)
    runner = PlanRunner(pb, snap, int(cfg.host_cache_gib * GIB) // pb, mc.vocab_size)
    eng = Engine(runner, mc, None, cfg, background=False)
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(0, mc.vocab_size, n).tolist()  # noqa: E731
    prefix = ids(context)
    for prompt, n in ((prefix, 1), (ids(context // 2), 1)):
        h = eng.submit(prompt, max_tokens=n, ignore_eos=True, checkpoint_at=())
        while not h.done:
            eng.step()
    before = len(runner.steps)
    dec = eng.submit(ids(64), max_tokens=decode, ignore_eos=True)
    eng.step()
    turn = eng.submit(prefix + [1] + ids(new), max_tokens=2, ignore_eos=True, checkpoint_at=())
    while not turn.done:
        eng.step()
    dec.cancel()
    eng.step()
    earlier = {h // SEGMENT_PAGES for s in runner.steps[:before] for h in s["spill_host_pages"]}
    turn_steps = runner.steps[before + 1 :]
    first = next((s for s in turn_steps if s["restore_host_pages"]), None)
    if first is None:
        raise RuntimeError(f"{context} tokens: the next turn did not restore from the host tier")
    reached = {h // SEGMENT_PAGES for h in first["spill_host_pages"]}
    eng.close()
    return {
        "page_bytes": pb,
        "snapshot_bytes": snap,
        "prefix_spill_host_pages": _span([h for s in runner.steps[:before] for h in s["spill_host_pages"]]),
        "turn_step_spill_host_pages": _span(first["spill_host_pages"]),
        "turn_step_restore_host_pages": _span(first["restore_host_pages"]),
        "new_segments_in_turn_step": sorted(reached - earlier),
    }


def _span(ids: list[int]) -> list[int]:
    return [min(ids), max(ids), len(ids)] if ids else []
