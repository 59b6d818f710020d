"""``Sequences``: whole sequences on a ``CudaQwen36`` outside the engine, over the network's one memory system.

``CudaQwen36`` holds device memory in one shape only: the KV page pool and the GDN state slots that
``CudaQwen36.allocate`` sizes, addressed by integer page and slot ids chosen by whoever allocated them. The engine's
runner (``ninfer/cuda/runner.py``) is one such owner: its lanes and checkpoints are slots, the engine's page ids
are pages. A ``Sequences`` is the other: ``Model.logits`` and perplexity on the CUDA backend, the perf scripts and
the GPU tests use it to run sequences of their own::

    seqs = Sequences(net, slots=2, context=4096)   # calls net.allocate (drops earlier pools and graphs)
    a = seqs.new()                                 # an integer id: one zeroed GDN slot, no KV pages yet
    h = seqs.forward(a, ids)                       # appends ids; final-normed hidden [T, H] float32 (cupy)
    h = seqs.forward_batch([t0, t1], [a, b])       # one token per sequence (decode; CUDA graph when enabled)
    seqs.free(a)                                   # its slot and pages go back

The bookkeeping (``SeqTable``: free slots, page lists from the engine's ``PagePool``, lengths) is pure Python. A
``Sequences`` notices when someone else (a runner) allocated the network's pools after it, and refuses to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.engine.kv_pool import PagePool

__all__ = ["SeqTable", "Sequences"]


class SeqTable:
    """Integer sequence ids over ``num_slots`` GDN slots and ``num_pages`` KV pages of ``page_size`` positions; a
    sequence holds at most ``max_pages`` pages. Pages are reference-counted, so sequences may share a prefix."""

    def __init__(self, num_slots: int, num_pages: int, page_size: int, max_pages: int) -> None:
        if min(num_slots, num_pages, page_size, max_pages) < 1:
            raise ValueError(
                f"SeqTable: slots, pages, page size and pages per sequence must be positive, got "
                f"{num_slots}, {num_pages}, {page_size}, {max_pages}"
            )
        self.page_size, self.max_pages = page_size, max_pages
        self.pool = PagePool(num_pages)
        self._free_slots = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._slot: dict[int, int] = {}
        self._pages: dict[int, list[int]] = {}
        self._len: dict[int, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._slot)

    def new(self) -> int:
        """A new empty sequence in a free slot (RuntimeError when every slot is taken)."""
        if not self._free_slots:
            raise RuntimeError("Sequences: every GDN state slot is in use (free a sequence or allocate more)")
        sid, self._next = self._next, self._next + 1
        self._slot[sid], self._pages[sid], self._len[sid] = self._free_slots.pop(), [], 0
        return sid

    def free(self, sid: int) -> None:
        self._check(sid)
        self.pool.decref(self._pages.pop(sid))
        self._free_slots.append(self._slot.pop(sid))
        del self._len[sid]

    def slot(self, sid: int) -> int:
        self._check(sid)
        return self._slot[sid]

    def pages(self, sid: int) -> list[int]:
        self._check(sid)
        return self._pages[sid]

    def length(self, sid: int) -> int:
        self._check(sid)
        return self._len[sid]

    def reserve(self, sid: int, length: int) -> None:
        """Hold enough pages for positions ``0 .. length-1`` (ValueError past the pool's context, RuntimeError
        when the pages run out)."""
        pages = self.pages(sid)
        need = -(-length // self.page_size)
        if need > self.max_pages:
            raise ValueError(
                f"sequence of {length} tokens exceeds the pool's context of {self.max_pages * self.page_size}"
            )
        if need - len(pages) > self.pool.free:
            raise RuntimeError(
                f"Sequences: the KV pool is full ({need - len(pages)} pages asked, {self.pool.free} free)"
            )
        if need > len(pages):
            pages.extend(self.pool.alloc(need - len(pages)))

    def seek(self, sid: int, length: int) -> None:
        """Set the sequence's length (its next token goes at ``length``); its pages must cover it."""
        if not 0 <= length <= len(self.pages(sid)) * self.page_size:
            raise ValueError(f"seek({length}): outside the {len(self._pages[sid])} pages the sequence holds")
        self._len[sid] = length

    def share(self, dst: int, src: int) -> None:
        """The empty sequence ``dst`` takes (references to) the pages of ``src`` and its length: a kept prefix. A
        partly filled last page is shared too: once one of them appends, the other must not (both would write the
        positions past the shared length)."""
        if self.pages(dst) or self.length(dst):
            raise ValueError(f"share: sequence {dst} is not empty")
        self.pool.incref(self.pages(src))
        self._pages[dst] = list(self._pages[src])
        self._len[dst] = self._len[src]

    def _check(self, sid: int) -> None:
        if sid not in self._slot:
            raise KeyError(f"no live sequence {sid}")


class Sequences:
    """Sequences on ``net`` (a ``CudaQwen36``) over pools it allocates now: ``slots`` GDN slots, ``pages`` KV
    pages (default: ``context`` positions for every slot) of ``page_size`` positions, at most ``context`` positions
    per sequence. ``extra_kv``: KV planes after the attention layers (1: the MTP head's)."""

    def __init__(
        self,
        net: Any,
        *,
        slots: int = 1,
        context: int,
        pages: int | None = None,
        page_size: int = 16,
        extra_kv: int = 0,
    ) -> None:
        if context < 1:
            raise ValueError(f"Sequences: context must be positive, got {context}")
        per_seq = -(-context // page_size)
        pages = per_seq * slots if pages is None else pages
        self.net = net
        self.table = SeqTable(slots, pages, page_size, per_seq)
        net.allocate(
            num_slots=slots, num_pages=pages, page_size=page_size, max_context=context, extra_kv=extra_kv
        )
        self._generation = net.generation

    # ---- bookkeeping (SeqTable's, with the slot zeroed on the device) --------------------------------------
    def new(self) -> int:
        """A new sequence: a zeroed GDN state slot and no KV pages."""
        self._owned()
        sid = self.table.new()
        self.net.zero_slot(self.table.slot(sid))
        return sid

    def free(self, sid: int) -> None:
        self.table.free(sid)

    def slot(self, sid: int) -> int:
        return self.table.slot(sid)

    def pages(self, sid: int) -> list[int]:
        return self.table.pages(sid)

    def length(self, sid: int) -> int:
        return self.table.length(sid)

    def reserve(self, sid: int, length: int) -> None:
        self.table.reserve(sid, length)

    def seek(self, sid: int, length: int) -> None:
        self.table.seek(sid, length)

    def share(self, dst: int, src: int) -> None:
        self.table.share(dst, src)

    # ---- running them ----------------------------------------------------------------------------------------
    def forward(self, sid: int, token_ids: Sequence[int] | np.ndarray, positions: Any = None) -> Any:
        """Append ``token_ids[T]`` at the sequence's length; returns the final-normed hidden ``[T, H]`` float32."""
        self._owned()
        ids = self.net.cfg.token_ids(token_ids).astype(np.int32)
        start = self.table.length(sid)
        self.table.reserve(sid, start + ids.size)
        h = self.net.run([(self.table.slot(sid), start, ids.size, self.table.pages(sid))], ids, positions)
        self.table.seek(sid, start + ids.size)
        return h

    def forward_batch(self, token_ids: Sequence[int] | np.ndarray, sids: Sequence[int]) -> Any:
        """One token for each of B sequences (B <= 8 with CUDA graphs); row b is bitwise ``forward`` of
        ``token_ids[b]`` on ``sids[b]``. Returns the final-normed hidden ``[B, H]`` float32."""
        self._owned()
        ids = self.net.cfg.token_ids(token_ids).astype(np.int32)
        if ids.size != len(sids) or len(set(sids)) != len(sids):
            raise ValueError("forward_batch: one token id per distinct sequence")
        for s in sids:
            self.table.reserve(s, self.table.length(s) + 1)
        t = self.table
        h, _ = self.net.decode(ids, [(t.slot(s), t.length(s), t.pages(s)) for s in sids], logits=False)
        for s in sids:
            t.seek(s, t.length(s) + 1)
        return h

    def _owned(self) -> None:
        if self.net.generation != self._generation:
            raise RuntimeError(
                "Sequences: the network's pools were allocated again since (by a runner or another Sequences)"
            )
