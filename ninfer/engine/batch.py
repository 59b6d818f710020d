"""The step plan and the runner contract: what the scheduler hands a model runner, and what comes back.

One step is two calls, in this order, from the engine's step thread:

1. ``runner.execute(batch)``: apply ``batch.setups`` (page table, GDN restore or zero state, the boundary page
   copy), run every ``LaneWork`` (prefill lanes one forward call each, decode lanes in one batched call),
   snapshot the GDN state of work that asks for it, then release ``batch.free_checkpoints``. The runner keeps
   the logits of the work items with ``sample=True``: row ``i`` is the ``i``-th such item in batch order.
2. ``runner.sample(rows, reqs, token_limit)``: the token of each listed row of that step, one ``SampleRequest``
   per row, by the one sampler (``sampler.py``: exact integer mass, counter-based randomness); -1 where nothing
   is allowed. The grammar masks in ``reqs`` were computed on the CPU while ``execute`` ran.

Invariants every runner keeps: a lane's result never depends on which other lanes share the step (batch
invariance); ``snapshot_bytes`` (one stored GDN checkpoint) and ``vocab_size`` are known after construction and
never change. The reference runner (``model_runner.py``) and the CUDA runner (``ninfer.cuda.runner``) are the two
implementations; nothing else touches the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from .core import SamplingParams

__all__ = ["LaneSetup", "LaneWork", "Batch", "SampleRequest", "ModelRunner"]


@dataclass(slots=True)
class LaneSetup:
    """Prepare a lane for a newly admitted request (applied before any work of the step)."""

    lane: int
    pages: list[int]  # page table for the request's whole reservation; page i holds positions i*P..i*P+P-1
    restore: int | None  # checkpoint id whose GDN state the lane resumes from; None: zero state
    length: int  # tokens already in the lane after the restore (0 without one)
    copy_page: tuple[int, int, int] | None  # (src, dst, n): copy positions 0..n-1 of page src into dst


@dataclass(slots=True)
class LaneWork:
    """Tokens one lane computes in this step."""

    lane: int
    start: int  # position of token_ids[0]; equals the lane's length before the step
    token_ids: list[int]
    prefill: bool  # prompt tokens (one forward call per lane) vs generated tokens (batched decode)
    sample: bool  # keep logits of the last position for sampling
    save_checkpoint: int | None  # snapshot the lane's GDN state after this work under this checkpoint id


@dataclass(slots=True)
class Batch:
    """Everything the model runner does in one step, in this order: setups, page copies, work, frees."""

    setups: list[LaneSetup] = field(default_factory=list)
    work: list[LaneWork] = field(default_factory=list)
    free_checkpoints: list[int] = field(default_factory=list)  # checkpoint ids to release after the work

    @property
    def empty(self) -> bool:
        return not (self.setups or self.work or self.free_checkpoints)


class SampleRequest(NamedTuple):
    """One row's sampling inputs. ``position``: the sequence position of the token drawn (the counter of the
    request's random stream); ``counts``: generated id -> occurrences (penalties); ``mask``: the packed int32
    bitmask ``[ceil(V/32)]`` of allowed ids (``sampler.packed_mask``) or None for no mask."""

    params: SamplingParams
    seed: int
    position: int
    counts: Mapping[int, int]
    mask: np.ndarray | None


@runtime_checkable
class ModelRunner(Protocol):
    """The engine's only seam to the model and its memory (KV pages, GDN state and checkpoints)."""

    snapshot_bytes: int
    vocab_size: int

    def execute(self, batch: Batch) -> None:
        """Run one step's plan; keep the logits of its sampled work items for ``sample``."""
        ...

    def sample(
        self, rows: Sequence[int], reqs: Sequence[SampleRequest], token_limit: int | None
    ) -> list[int]:
        """Tokens of rows ``rows`` of the last ``execute`` (one ``SampleRequest`` each; -1: nothing allowed).
        Ids at or above ``token_limit`` are never drawn."""
        ...
