"""``ScriptedDrafts``: a runner whose drafts come from a script (forced acceptance for tests and
``perf/bench_spec.py``).

It wraps a runner and passes everything through; the runner's MTP head still runs (its state and cost stay
real), but the ``sample`` that follows each ``draft`` returns ``script(tokens)`` for every lane instead of the
head's own draft (None: keep the head's). With ``replay_script`` the drafts are the target's own greedy tokens,
wrong at a chosen rate: the acceptance of greedy requests is then what the script decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .core import Batch, DraftLane, SampleRequest

__all__ = ["ScriptedDrafts", "replay_script"]

Script = Callable[[list[int]], "int | None"]


class ScriptedDrafts:
    def __init__(self, inner: Any, script: Script) -> None:
        self.inner, self.script = inner, script
        self.snapshot_bytes, self.vocab_size = inner.snapshot_bytes, inner.vocab_size
        self._forced: list[int | None] | None = None

    def __getattr__(self, name: str) -> Any:  # plan, num_checkpoints, net ... of the wrapped runner
        return getattr(self.inner, name)

    def execute(self, batch: Batch) -> None:
        self._forced = None
        self.inner.execute(batch)

    def draft(self, lanes: Sequence[DraftLane]) -> None:
        self.inner.draft(lanes)
        self._forced = [self.script(list(dl.tokens)) for dl in lanes]

    def sample(
        self, rows: Sequence[int], reqs: Sequence[SampleRequest], token_limit: int | None
    ) -> list[int]:
        toks = self.inner.sample(rows, reqs, token_limit)
        forced, self._forced = self._forced, None
        if forced is None:
            return toks
        return [t if forced[r] is None else int(forced[r]) for r, t in zip(rows, toks, strict=True)]  # type: ignore[arg-type]

    def verify(
        self,
        lanes: Sequence[int],
        drafts: Sequence[Sequence[int]],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
    ) -> list[list[int]]:
        return self.inner.verify(lanes, drafts, reqs, token_limit)

    def commit(self, lane: int, length: int) -> None:
        self.inner.commit(lane, length)


def replay_script(refs: Mapping[tuple[int, ...], Sequence[int]], accept_pct: int, vocab: int) -> Script:
    """Drafts from reference sequences (prompt -> prompt + the target's greedy continuation, keyed by the
    prompt): the next reference token while the request follows its reference, made wrong (``+1 mod vocab``)
    at the positions where ``(position * 37) % 100 >= accept_pct`` — a fixed pattern, so runs repeat."""
    by_len = sorted({len(p) for p in refs}, reverse=True)

    def script(tokens: list[int]) -> int | None:
        for n in by_len:
            ref = refs.get(tuple(tokens[:n]))
            if ref is None:
                continue
            pos = len(tokens)
            if pos >= len(ref) or list(ref[:pos]) != tokens:
                return None
            tok = int(ref[pos])
            return tok if (pos * 37) % 100 < accept_pct else (tok + 1) % vocab
        return None

    return script
