"""``ninfer.cuda.sequences`` on the CPU: the integer-id bookkeeping (``SeqTable``) and what ``Sequences`` asks of
the network (``allocate``, ``zero_slot``, ``run``, ``decode``), against a recording stand-in for ``CudaQwen36``.
The device side is checked on the GPU by tests/test_cuda_model.py and tests/test_cuda_kv_fp8.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.cuda.sequences import SeqTable, Sequences


class FakeNet:
    """Records the calls ``Sequences`` makes; hidden rows are the token ids (as float32 [T, 1])."""

    def __init__(self) -> None:
        self.generation = 0
        self.calls: list[tuple[Any, ...]] = []
        self.cfg = self  # ``cfg.token_ids``

    @staticmethod
    def token_ids(ids: Any) -> np.ndarray:
        return np.asarray(ids, np.int64).reshape(-1)

    def allocate(self, **kw: Any) -> None:
        self.generation += 1
        self.calls.append(("allocate", kw))

    def zero_slot(self, slot: int) -> None:
        self.calls.append(("zero", slot))

    def run(self, segs: Any, ids: np.ndarray, positions: Any = None) -> np.ndarray:
        self.calls.append(("run", [(g, s, n, list(p)) for g, s, n, p in segs], ids.tolist()))
        return ids.astype(np.float32)[:, None]

    def decode(self, ids: np.ndarray, lanes: Any, *, logits: bool = True) -> tuple[np.ndarray, None]:
        self.calls.append(("decode", [(g, s, list(p)) for g, s, p in lanes], ids.tolist(), logits))
        return ids.astype(np.float32)[:, None], None


def test_table_slots_pages_and_lengths() -> None:
    t = SeqTable(num_slots=2, num_pages=5, page_size=4, max_pages=3)
    a, b = t.new(), t.new()
    assert (t.slot(a), t.slot(b)) == (0, 1) and len(t) == 2
    with pytest.raises(RuntimeError, match="every GDN state slot"):
        t.new()
    t.reserve(a, 9)  # 3 pages of 4
    assert t.pages(a) == [0, 1, 2] and t.length(a) == 0
    t.reserve(a, 5)  # already held: nothing more
    assert t.pages(a) == [0, 1, 2]
    with pytest.raises(ValueError, match="context of 12"):
        t.reserve(b, 13)
    with pytest.raises(RuntimeError, match="KV pool is full"):
        t.reserve(b, 12)  # 3 pages asked, 2 free
    assert t.pages(b) == []  # nothing taken by the failed reservation
    t.seek(a, 9)
    with pytest.raises(ValueError, match="outside"):
        t.seek(a, 13)
    t.free(a)
    assert t.pool.free == 5 and len(t) == 1
    with pytest.raises(KeyError, match="no live sequence"):
        t.length(a)
    c = t.new()
    assert c != a and t.slot(c) == 0  # ids are never reused; the slot is


def test_table_share_counts_references() -> None:
    t = SeqTable(num_slots=3, num_pages=4, page_size=4, max_pages=4)
    a, b = t.new(), t.new()
    t.reserve(a, 6)
    t.seek(a, 6)
    t.share(b, a)
    assert t.pages(b) == t.pages(a) == [0, 1] and t.length(b) == 6
    t.reserve(b, 10)
    assert t.pages(b) == [0, 1, 2] and t.pages(a) == [0, 1]
    t.free(a)
    assert t.pool.free == 1  # pages 0 and 1 still held by b
    t.free(b)
    assert t.pool.free == 4
    c, d = t.new(), t.new()
    t.reserve(c, 1)
    t.reserve(d, 1)
    with pytest.raises(ValueError, match="not empty"):
        t.share(d, c)


def test_sequences_allocate_forward_and_batch() -> None:
    net = FakeNet()
    seqs = Sequences(net, slots=2, context=10, page_size=4)
    assert net.calls == [
        ("allocate", dict(num_slots=2, num_pages=6, page_size=4, max_context=10, extra_kv=0))
    ]
    a, b = seqs.new(), seqs.new()
    assert net.calls[1:] == [("zero", 0), ("zero", 1)]
    h = seqs.forward(a, [5, 6, 7, 8, 9])
    assert h[:, 0].tolist() == [5, 6, 7, 8, 9]
    assert net.calls[-1] == ("run", [(0, 0, 5, [0, 1])], [5, 6, 7, 8, 9])
    seqs.forward(b, [1, 2, 3])
    assert net.calls[-1] == ("run", [(1, 0, 3, [2])], [1, 2, 3]) and seqs.length(b) == 3
    seqs.forward_batch([10, 11], [a, b])
    assert net.calls[-1] == ("decode", [(0, 5, [0, 1]), (1, 3, [2])], [10, 11], False)
    assert (seqs.length(a), seqs.length(b)) == (6, 4)
    seqs.forward_batch([12], [b])  # position 4: a second page
    assert net.calls[-1] == ("decode", [(1, 4, [2, 3])], [12], False) and seqs.pages(b) == [2, 3]
    with pytest.raises(ValueError, match="distinct"):
        seqs.forward_batch([1, 2], [a, a])
    with pytest.raises(ValueError, match="context of 12"):
        seqs.forward(a, list(range(7)))
    assert seqs.length(a) == 6  # a refused call leaves the sequence as it was
    seqs.free(a)
    assert seqs.new() == 2 and net.calls[-1] == ("zero", 0)


def test_sequences_refuse_pools_allocated_again() -> None:
    net = FakeNet()
    seqs = Sequences(net, slots=1, context=8, pages=3, extra_kv=1)
    assert net.calls[0][1]["num_pages"] == 3 and net.calls[0][1]["extra_kv"] == 1
    a = seqs.new()
    net.allocate(num_slots=4, num_pages=4, page_size=16, max_context=64)  # a runner took the pools
    with pytest.raises(RuntimeError, match="allocated again"):
        seqs.forward(a, [1])
    with pytest.raises(RuntimeError, match="allocated again"):
        seqs.new()
    with pytest.raises(ValueError, match="context"):
        Sequences(net, context=0)


class RefNet(FakeNet):
    """The reference network behind ``CudaQwen36``'s pool interface: one reference state per GDN slot, checking
    that every segment starts where its slot's sequence ends and that its pages cover it."""

    def __init__(self, ref: Any, page_size: int = 16) -> None:
        super().__init__()
        self.ref, self.cfg, self.page_size = ref, ref.cfg, page_size
        self.states: dict[int, Any] = {}

    def zero_slot(self, slot: int) -> None:
        self.states[slot] = self.ref.new_state()

    def run(self, segs: Any, ids: np.ndarray, positions: Any = None) -> np.ndarray:
        out, r = [], 0
        for slot, start, n, pages in segs:
            state = self.states[slot]
            assert state.length == start and len(pages) * self.page_size >= start + n
            out.append(self.ref.forward(ids[r : r + n], state, positions))
            r += n
        return np.concatenate(out)

    def decode(self, ids: np.ndarray, lanes: Any, *, logits: bool = True) -> tuple[np.ndarray, None]:
        return self.run([(slot, start, 1, pages) for slot, start, pages in lanes], ids), None

    def lm_head(self, h: np.ndarray) -> np.ndarray:
        return self.ref.lm_head(h)


@pytest.fixture(scope="module")
def ref() -> Any:
    from hf_tiny import tiny_config_kwargs

    from ninfer.config import ModelConfig
    from ninfer.demo import random_weights
    from ninfer.reference import DictWeights, Qwen36

    kw = tiny_config_kwargs("dense")
    kw["model_type"] = "qwen3_5_text"
    cfg = ModelConfig.from_hf(kw)
    return Qwen36(cfg, DictWeights(random_weights(cfg, seed=0)))


def _model(net: Any, backend: str) -> Any:
    """The parts of a ``ninfer.model.Model`` that ``logits`` and perplexity use."""
    import functools
    import types

    from ninfer.model import Model

    m = types.SimpleNamespace(net=net, backend=backend, config=net.cfg)
    m.open_sequence = functools.partial(Model.open_sequence, m)
    m.logits = functools.partial(Model.logits, m)
    return m


def test_model_logits_and_perplexity_through_sequences(ref: Any) -> None:
    """``Model.logits`` and a perplexity window on the CUDA branch (``Sequences`` over a stand-in network that
    runs the reference per slot) equal the reference branch bitwise: same chunks, same starts, same rows."""
    from ninfer.evaluate.perplexity import Window, window_nll

    ids = np.random.default_rng(3).integers(0, ref.cfg.vocab_size, 45).tolist()
    want = _model(ref, "reference").logits(ids, prefill_chunk=16)
    cuda = _model(RefNet(ref), "cuda")
    np.testing.assert_array_equal(cuda.logits(ids, prefill_chunk=16), want)
    assert cuda.net.calls[0][1]["max_context"] == 45 and cuda.net.calls[0][1]["num_slots"] == 1
    w = Window(begin=5, end=45, first_target=20)
    arr = np.asarray(ids)
    assert window_nll(cuda, arr, w, 16) == window_nll(_model(ref, "reference"), arr, w, 16)


def test_sequences_batch_rows_follow_their_sequences(ref: Any) -> None:
    """Two sequences decoded together and one alone: the stand-in checks every start, and the rows equal the
    reference's own batched decode."""
    seqs = Sequences(RefNet(ref), slots=3, context=64)
    a, b = seqs.new(), seqs.new()
    ra, rb = ref.new_state(), ref.new_state()
    for sid, st, n in ((a, ra, 7), (b, rb, 20)):
        p = np.arange(n) % ref.cfg.vocab_size
        np.testing.assert_array_equal(seqs.forward(sid, p), ref.forward(p, st))
    for t in range(3):
        np.testing.assert_array_equal(
            seqs.forward_batch([t, t + 1], [a, b]), ref.forward_batch([t, t + 1], [ra, rb])
        )
    assert (seqs.length(a), seqs.length(b)) == (10, 23)
