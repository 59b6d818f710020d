"""``CheckpointSlots``: which device GDN slot holds which checkpoint id, and when within a step a freed id's slot
may be taken again (the CUDA runner's bookkeeping; pure Python, so CI checks it against the engine's plans).

The engine accounts checkpoints against its budget and names the ids it released in ``Batch.free_checkpoints``
(evicted, dropped, spilled to the host tier). The runner has ``budget // snapshot + lanes`` slots. Within one
step a slot is taken by a restore from the host tier (in ``copies``, on the copy stream) and by a save (after the
prefills, on the compute stream), so a freed slot must be back in the free list before those whenever that is
safe, or a full budget that evicts and takes in one step runs out (measured on the H200 at fa50d21: "no free GDN
checkpoint slot"). The order, ``CudaModelRunner.execute``'s:

1. ``begin``: ids freed in this batch that nothing of the step reads any more are released at once: not spilled
   in this step (a spill reads its slot), not the checkpoint a setup of this step resumes from, not a save target.
   Nothing on the compute stream still reads them (the previous step ended with the compute stream synchronized),
   and a copy in flight that does is ordered by the copy stream (restores) or guarded (saves).
2. ``spilled``: a spilled checkpoint's slot is released right after its spill is issued (a restore into it runs
   later on the same copy stream; a save waits on the spill's event), unless a setup of this step resumes from
   that checkpoint: the engine can spill, while planning a later admission of the same step, the checkpoint an
   earlier admission resumes from (83e8d47 released it here regardless: the setup then found no slot, or a
   restore of the same step overwrote it before the setup's copy).
3. ``after_setups``: the slots the setups copied from.
4. ``end``: what is left (an id both freed and saved in one step, which the engine does not plan).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CheckpointSlots"]


class CheckpointSlots:
    def __init__(self, slots: Iterable[int]) -> None:
        self._free = list(slots)[::-1]  # taken from the end: the lowest slot first
        self.held: dict[int, tuple[int, int]] = {}  # checkpoint id -> (slot, length)
        self._pending: set[int] = set()  # freed in this step, not yet released
        self._late: set[int] = set()  # of those, the ones a setup reads

    def __len__(self) -> int:
        return len(self.held)

    @property
    def free(self) -> int:
        return len(self._free)

    def slot(self, cid: int) -> int:
        return self.held[cid][0]

    def take(self, cid: int, length: int, avoid: set[int] | frozenset[int] = frozenset()) -> int:
        """A free slot for checkpoint ``cid`` (one not in ``avoid`` where there is one)."""
        if cid in self.held:
            self._release(cid)
        if not self._free:
            raise RuntimeError(
                f"no free GDN checkpoint slot on the device ({len(self.held)} held); the engine's checkpoint "
                "budget and the runner's slots disagree"
            )
        i = next((k for k in range(len(self._free) - 1, -1, -1) if self._free[k] not in avoid), -1)
        slot = self._free.pop(i)
        self.held[cid] = (slot, length)
        return slot

    def _release(self, cid: int) -> None:
        got = self.held.pop(cid, None)
        if got is not None:
            self._free.append(got[0])

    def begin(
        self, freed: Iterable[int], spilled: Iterable[int], setups: Iterable[int], saves: Iterable[int]
    ) -> None:
        """Step start: release the freed ids nothing of this step reads (the rest later, see the module doc)."""
        self._pending = set(freed)
        self._late = self._pending & set(setups)
        keep = self._late | set(spilled) | set(saves)
        for cid in sorted(self._pending - keep):
            self._release(cid)
        self._pending &= keep

    def spilled(self, cid: int) -> None:
        """Its spill is issued: a freed id's slot is free again, unless a setup of this step still copies from it
        (the engine may spill the checkpoint an admission of the same step resumes from: then after the setups)."""
        if cid in self._pending and cid not in self._late:
            self._pending.discard(cid)
            self._release(cid)

    def after_setups(self) -> None:
        for cid in sorted(self._late & self._pending):
            self._release(cid)
        self._pending -= self._late

    def end(self) -> None:
        for cid in sorted(self._pending):
            self._release(cid)
        self._pending = set()
