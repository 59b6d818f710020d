"""The CUDA runner's checkpoint-slot bookkeeping (``ninfer.cuda.ckpt_slots``) against the engine's real plans, on
the CPU: the reference runner is wrapped by a mirror that replays every batch through ``CheckpointSlots`` in
``CudaModelRunner.execute``'s order, with exactly the CUDA runner's number of slots (``budget // snapshot +
lanes``), and checks that no step runs out and that the ids held are the reference runner's checkpoints.

The scenarios are the ones that failed on the H200 at fa50d21 with "no free GDN checkpoint slot" (sessions on one
and two lanes, a checkpoint budget of a few snapshots, spills and restores in one step). The earlier orders are
replayed too, so the test shows it reproduces that failure: the release at the end of the step (fa50d21) and
the spilled slot released once its spill is issued but every other freed id at the end (83e8d47).
"""

from __future__ import annotations

from typing import Any

import pytest
from engines import agent_opening, agent_tool_result

from ninfer.cuda.ckpt_slots import CheckpointSlots
from ninfer.demo import build_demo
from ninfer.engine import Engine, EngineConfig
from ninfer.engine.core import Batch
from ninfer.model import load

BASE = dict(max_context=256, prefill_chunk=64, checkpoint_stride=1024, page_size=16)
SNAP = 58368  # the demo model's GDN snapshot (tests/test_engine_tiering.py)
GEN = 8


class SlotMirror:
    """A runner that runs the wrapped one and replays each batch's checkpoint slots as the CUDA runner takes them.
    ``order``: "now" (``CheckpointSlots``), "fa50d21" or "83e8d47" (the earlier releases, for contrast)."""

    def __init__(self, inner: Any, cfg: EngineConfig, order: str = "now") -> None:
        self.inner, self.order = inner, order
        self.snapshot_bytes, self.vocab_size = inner.snapshot_bytes, inner.vocab_size
        lanes = cfg.max_concurrency
        self.slots = CheckpointSlots(
            range(cfg.checkpoint_budget(self.snapshot_bytes) // self.snapshot_bytes + lanes)
        )
        self.most = 0  # the most slots held at once

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute(self, batch: Batch) -> None:
        sl, freed = self.slots, list(batch.free_checkpoints)
        saves = [w.save_checkpoint for w in batch.work if w.save_checkpoint is not None]
        spilled = [c.device_ckpt for c in batch.copies if not c.ticket and c.host_ckpt]
        reads = [s.restore for s in batch.setups if s.restore is not None]
        # the older orders: nothing freed before the end of the step, except (83e8d47) a slot once spilled
        sl.begin(freed if self.order == "now" else [], spilled, reads, saves)
        for c in batch.copies:
            if c.ticket and c.host_ckpt:
                sl.take(c.device_ckpt, 0)
            elif c.host_ckpt and self.order == "now":
                sl.spilled(c.device_ckpt)
            elif c.host_ckpt and self.order == "83e8d47" and c.device_ckpt in freed:
                sl._release(c.device_ckpt)
        for cid in reads:
            assert cid in sl.held, f"a setup resumes from checkpoint {cid}, which holds no slot"
        sl.after_setups()
        for cid in saves:
            sl.take(cid, 0)
        self.most = max(self.most, len(sl))
        if self.order != "now":
            for cid in freed:
                sl._release(cid)
        sl.end()
        self.inner.execute(batch)
        assert set(sl.held) == set(self.inner._ckpts), "the slots held are not the runner's checkpoints"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return load(build_demo(tmp_path_factory.mktemp("slots") / "demo.ninfer"))


def _engine(model, order: str, **kw: Any) -> tuple[Engine, SlotMirror]:  # noqa: ANN001
    cfg = EngineConfig(**BASE, tier_checksum=True, **kw)
    mirror = SlotMirror(model.runner(cfg), cfg, order)
    eng = Engine(
        mirror, model.config, model.tokenizer, cfg, eos_token_ids=model.eos_token_ids,
        token_limit=model.token_limit, background=False,
    )  # fmt: skip
    return eng, mirror


def _sessions(
    model, order: str, lanes: int, budget: int, sessions: int = 10, turns: int = 3
) -> tuple[int, int]:  # noqa: ANN001
    """Every session's turn submitted at once, ``turns`` times; returns (host restores, most slots held)."""
    eng, mirror = _engine(
        model, order, max_concurrency=lanes, kv_capacity=448, queue_depth=sessions,
        checkpoint_budget_bytes=budget * SNAP, host_cache_gib=4e6 / (1 << 30),
    )  # fmt: skip
    try:
        ctx = [agent_opening(model, s) for s in range(sessions)]
        for turn in range(turns):
            handles = [eng.submit(c, max_tokens=GEN, ignore_eos=True, checkpoint_at=()) for c in ctx]
            for s, h in enumerate(handles):
                c = h.result(timeout=120)
                assert c.finish_reason == "output_limit", c.error
                ctx[s] = ctx[s] + c.token_ids + agent_tool_result(model, turn)
            eng._cache.check()
        return eng.stats().host_restores, mirror.most
    finally:
        eng.close()


SCENARIOS = [
    (1, 2),
    (1, 3),
    (1, 6),
    (2, 2),
    (2, 3),
    (2, 4),
    (2, 8),
]  # (lanes, checkpoint budget in snapshots)


@pytest.mark.parametrize(("lanes", "budget"), SCENARIOS)
def test_slots_never_run_out_under_spill_and_restore(model, lanes: int, budget: int) -> None:  # noqa: ANN001
    restores, most = _sessions(model, "now", lanes, budget)
    assert restores >= 10
    assert (
        most <= budget
    )  # freed ids come back within the step: the runner's extra slot per lane is never needed


@pytest.mark.parametrize(
    ("order", "lanes", "budget", "error"),
    [
        ("fa50d21", 1, 6, "no free GDN checkpoint slot"),  # tests/test_cuda_tiering.py's sessions on the H200
        ("fa50d21", 2, 8, "no free GDN checkpoint slot"),  # ... and its two-lane sessions
        ("83e8d47", 2, 8, "holds no slot"),  # a spilled slot released before a setup of the same step read it
        ("83e8d47", 1, 3, "holds no slot"),
    ],
)
def test_the_earlier_orders_fail(model, order: str, lanes: int, budget: int, error: str) -> None:  # noqa: ANN001
    """The earlier releases fail in these scenarios (fa50d21 as it did on the H200): the test above can fail."""
    with pytest.raises(AssertionError, match=error):
        _sessions(model, order, lanes, budget)
