"""``ReferenceDrafter``: the MTP head of the reference runner, per lane (docs/speculative.md).

The head's one attention layer keeps its KV in an extra plane of the runner's paged store (the lane's page table,
so a resumed prefix shares it like the target's KV). MTP row ``p`` reads the target's final hidden ``h_p`` and
the token ``x_{p+1}`` and writes KV position ``p`` (docs/model-math.md §6: tokens shift left, hidden states and
positions do not). Per lane:

- ``base``: rows ``0..base-1`` are in the MTP KV; ``pending``: the target hiddens of positions ``base..`` whose
  rows wait for their next token (prefill and decode work append to it; the last one always waits).
- A round's first ``draft`` step (``tokens`` = the computed tokens plus the one sampled last) runs the pending
  rows and keeps the last row's output as the chain; each further step runs one provisional row
  ``(chain, previous draft)`` at the next position. Every step keeps its logits row.
- ``commit`` after verification drops the provisional rows (the MTP KV length goes back to ``base``) and makes the
  target's verify hiddens of the kept positions pending: the next round re-runs those rows with the target's
  hiddens, overwriting the provisional KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .core import DraftLane

__all__ = ["ReferenceDrafter", "MtpView"]


class MtpView:
    """A lane's view of the MTP plane (the reference ``KVCache`` seam): the head's layer 0 is plane ``plane``
    of the runner's ``PagedKVStore``."""

    def __init__(self, store: Any, pages: list[int], plane: int) -> None:
        self._store, self._pages, self._plane = store, np.asarray(pages, dtype=np.int64), plane

    def write(self, attn_idx: int, start_pos: int, k: np.ndarray, v: np.ndarray) -> None:
        if start_pos + k.shape[0] > self._pages.size * self._store.page_size:
            raise ValueError(f"MTP KV write past the lane's reservation ({self._pages.size} pages)")
        self._store.write(self._pages, self._plane, start_pos, k, v)

    def read(self, attn_idx: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        return self._store.read(self._pages, self._plane, length)


class _Lane:
    __slots__ = ("state", "base", "pending", "chain", "rows")

    def __init__(self, state: Any, length: int) -> None:
        self.state, self.base = state, length
        self.pending: list[np.ndarray] = []
        self.chain: np.ndarray | None = None
        self.rows: list[np.ndarray] = []


class ReferenceDrafter:
    def __init__(self, net: Any, store: Any, plane: int, lanes: int) -> None:
        self.net, self.store, self.plane = net, store, plane
        self._lanes: list[_Lane | None] = [None] * lanes

    def setup(self, lane: int, pages: list[int], length: int) -> None:
        """A new request in ``lane`` resuming at ``length`` (rows before it come with the shared pages)."""
        state = self.net.new_mtp_state(kv=MtpView(self.store, pages, self.plane))
        state.length = length
        self._lanes[lane] = _Lane(state, length)

    def record(self, lane: int, start: int, hidden: np.ndarray) -> None:
        """Target hiddens ``[T,H]`` of positions ``start..`` just computed in ``lane``."""
        ln = self._lane(lane)
        assert start == ln.base + len(ln.pending), "MTP rows out of step with the target"
        ln.pending.extend(np.asarray(hidden, np.float32))

    def draft(self, lanes: Sequence[DraftLane]) -> np.ndarray:
        """One draft step per lane (module docstring); returns the logits rows ``[len(lanes), V]``."""
        out = []
        for dl in lanes:
            ln = self._lane(dl.lane)
            computed = ln.base + len(ln.pending)
            if len(dl.tokens) == computed + 1:  # a round's first step: catch up with the computed tokens
                ln.state.length, ln.rows = ln.base, []
                ids = np.asarray(dl.tokens[ln.base + 1 : computed + 1], np.int64)
                d = self.net.mtp_hidden(np.stack(ln.pending), ids, None, ln.state)
                ln.base, ln.pending = computed, []
            else:
                assert ln.chain is not None and len(dl.tokens) == computed + 1 + len(ln.rows)
                d = self.net.mtp_hidden(ln.chain[None], np.asarray(dl.tokens[-1:], np.int64), None, ln.state)
            ln.chain = d[-1]
            ln.rows.append(self.net.lm_head(d[-1:])[0].astype(np.float32, copy=False))
            out.append(ln.rows[-1])
        return np.stack(out)

    def rows(self, lane: int, n: int) -> np.ndarray:
        """The first ``n`` draft logits rows of the lane's round ``[n, V]``."""
        ln = self._lane(lane)
        assert len(ln.rows) >= n, "fewer draft rows than drafts"
        return np.stack(ln.rows[:n]) if n else np.zeros((0, self.net.cfg.vocab_size), np.float32)

    def commit(self, lane: int, start: int, hiddens: Sequence[np.ndarray]) -> None:
        """End of a round verified from ``start``: provisional rows dropped, ``hiddens`` (kept positions
        ``start..``) pending."""
        ln = self._lane(lane)
        assert ln.base == start and not ln.pending, "a round's first draft step caught the head up to start"
        ln.state.length, ln.chain, ln.rows = ln.base, None, []
        ln.pending = list(hiddens)

    def _lane(self, lane: int) -> _Lane:
        ln = self._lanes[lane]
        assert ln is not None, f"lane {lane} has no MTP state"
        return ln
