"""``ScriptedDrafts``: a runner whose drafts come from a script (forced acceptance for tests and
``perf/bench_spec.py``).

It wraps a runner and passes everything through; the runner's MTP head still runs (its state and cost stay
real), but the ``sample`` that follows each ``draft`` returns ``script(tokens)`` for every lane instead of the
head's own draft (None: keep the head's). ``draft_chain`` (a round at once, ``speculative.chain_by_steps``) gives
the scripted tokens of the whole round to the wrapped runner's ``draft_chain`` as ``forced`` (its drafting and
sampling still run, one synchronization a round); where the script leaves a token to the head, or the runner has
no ``draft_chain``, it drafts step by step through ``draft`` and ``sample`` above. With ``replay_script`` the
drafts are the target's own greedy tokens, wrong at a chosen rate: the acceptance of greedy requests is then what
the script decides (a round keeps its script past its first miss, so it stays one ``draft_chain``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .core import Batch, DraftLane, SampleRequest
from .speculative import chain_by_steps

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

    def draft_chain(
        self, lanes: Sequence[DraftLane], reqs: Sequence[Sequence[SampleRequest]], token_limit: int | None
    ) -> list[list[int]]:
        forced: list[list[int]] = []
        for dl, r in zip(lanes, reqs, strict=True):
            toks: list[int] = list(dl.tokens)
            for _ in r:
                t = self.script(toks)
                if t is None:
                    break
                toks.append(int(t))
            forced.append(toks[len(dl.tokens) :])
        inner = getattr(self.inner, "draft_chain", None)
        if inner is None or any(len(f) < len(r) for f, r in zip(forced, reqs, strict=True)):
            return chain_by_steps(self, lanes, reqs, token_limit)
        self._forced = None
        return inner(lanes, reqs, token_limit, forced=forced)

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
    at the positions where ``(position * 37) % 100 >= accept_pct`` — a fixed pattern, so runs repeat.

    Tokens that leave the reference only by wrong drafts of its own (this round's, past the rejection) are still
    followed: a round whose first drafts miss stays scripted to its end (one ``draft_chain``, as real drafting)
    instead of falling back to the head, step by step, for its last drafts; verification stops at the first miss,
    so what follows it is never accepted either way."""
    by_len = sorted({len(p) for p in refs}, reverse=True)

    def wrong(i: int) -> bool:
        return (i * 37) % 100 >= accept_pct

    def script(tokens: list[int]) -> int | None:
        for n in by_len:
            ref = refs.get(tuple(tokens[:n]))
            if ref is None:
                continue
            pos = len(tokens)
            if pos >= len(ref):
                return None
            if list(ref[:pos]) != tokens and not all(
                t == r or (wrong(i) and t == (int(r) + 1) % vocab)
                for i, (t, r) in enumerate(zip(tokens[n:], ref[n:pos], strict=True), n)
            ):
                return None
            tok = int(ref[pos])
            return (tok + 1) % vocab if wrong(pos) else tok
        return None

    return script
