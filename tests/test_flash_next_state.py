"""Flash-Next per-sequence state: snapshot/restore at and between block boundaries, resume into a fresh state that
shares only the positional caches, index keys held by the kv object, rollback, clone and forward_batch."""

from __future__ import annotations

import numpy as np
import pytest
from hf_tiny_flash import EOS, random_weights, tiny_hf_config

from ninfer.flash_next import FlashNext, FlashNextConfig
from ninfer.flash_next.state import FlashNextState, IndexKeys
from ninfer.reference.kv import ContiguousKV
from ninfer.reference.weights import DictWeights


@pytest.fixture(scope="module")
def model() -> FlashNext:
    cfg = FlashNextConfig.from_hf(tiny_hf_config(budget=8, ratio=4))
    return FlashNext(cfg, DictWeights(random_weights(cfg, seed=3, mtp=False)))


def _ids(n: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, 256, n)
    ids[n // 2] = EOS
    return ids


class KVWithIndex:
    """A kv object that stores the pooled index keys itself (as a paged engine cache would)."""

    def __init__(self, cfg: FlashNextConfig) -> None:
        self.kv = ContiguousKV(len(cfg.qsa_layers), cfg.num_key_value_heads, cfg.head_dim)
        self.idx = IndexKeys(len(cfg.qsa_layers), cfg.indexer_head_dim)

    def write(self, j: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        self.kv.write(j, start, k, v)

    def read(self, j: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        return self.kv.read(j, length)

    def write_index(self, j: int, block: int, keys: np.ndarray) -> None:
        self.idx.write_index(j, block, keys)

    def read_index(self, j: int, n: int) -> np.ndarray:
        return self.idx.read_index(j, n)


def _run(model: FlashNext, state: FlashNextState, ids: np.ndarray, chunk: int = 7) -> np.ndarray:
    return np.concatenate(
        [model.lm_head(model.forward(ids[s : s + chunk], state)) for s in range(0, ids.size, chunk)]
    )


@pytest.mark.parametrize("split", [16, 18])  # a block boundary (ratio 4) and a point inside a block
def test_resume_into_fresh_state_equals_no_reuse(model: FlashNext, split: int) -> None:
    prompt, turn2 = _ids(split, 1), _ids(30, 2)
    full = model.logits(np.concatenate([prompt, turn2]))

    first = model.new_state()
    model.forward(prompt, first)
    snap = first.snapshot_gdn()
    ratio, n_open = model.cfg.indexer_compress_ratio, split % model.cfg.indexer_compress_ratio
    assert snap.length == split and snap.open_keys[0].shape == (ratio - 1, model.cfg.indexer_head_dim)
    np.testing.assert_array_equal(snap.open_keys[0][:n_open], first.open_keys[0])  # then zero padding
    assert not snap.open_keys[0][n_open:].any() and first.open_keys[0].shape[0] == n_open
    assert model.cfg.is_block_boundary(split) == (split % 4 == 0)
    assert snap.ngram_ctx.tolist() == prompt[-2:].tolist()

    # the engine's reuse: a new sequence gets the prefix's positional caches (K/V) and the snapshot
    resumed = model.new_state(kv=first.kv.clone())
    resumed.restore_gdn(snap)
    got = _run(model, resumed, turn2, chunk=5)
    np.testing.assert_allclose(got, full[split:], rtol=0, atol=1e-5 * np.abs(full).max())


def test_restore_is_exact_rollback(model: FlashNext) -> None:
    prompt, draft, real = _ids(21, 3), _ids(5, 4), _ids(5, 5)
    state = model.new_state()
    model.forward(prompt, state)
    snap = state.snapshot_gdn()
    model.forward(draft, state)  # speculative tokens, then rejected
    state.restore_gdn(snap)
    after_rollback = model.lm_head(model.forward(real, state))
    fresh = model.new_state()
    model.forward(prompt, fresh)
    np.testing.assert_array_equal(after_rollback, model.lm_head(model.forward(real, fresh)))


def test_index_keys_in_kv_object(model: FlashNext) -> None:
    ids = _ids(40, 6)
    state = model.new_state(kv=KVWithIndex(model.cfg))
    assert state.index is None and isinstance(state.index_store, KVWithIndex)
    np.testing.assert_array_equal(_run(model, state, ids), _run(model, model.new_state(), ids))
    snap = state.snapshot_gdn()
    assert snap.index is None  # positional: stays with the kv object
    model.forward(_ids(3, 9), state)  # a snapshot then has the same size at every length (padded open block)
    assert state.snapshot_gdn().nbytes == snap.nbytes and state.length % 4 != 40 % 4


def test_clone_and_forward_batch(model: FlashNext) -> None:
    a, b = model.new_state(), model.new_state()
    model.forward(_ids(13, 7), a)
    model.forward(_ids(9, 8), b)
    c, d = a.clone(), b.clone()
    batch = model.forward_batch([17, 99], [a, b])
    np.testing.assert_array_equal(batch[0], model.forward([17], c)[0])
    np.testing.assert_array_equal(batch[1], model.forward([99], d)[0])
    assert a.length == 14 and b.length == 10 and c.length == 14


def test_snapshot_is_independent_and_sized(model: FlashNext) -> None:
    state = model.new_state()
    model.forward(_ids(10, 11), state)
    snap = state.snapshot_gdn()
    model.forward(_ids(4, 12), state)
    assert snap.length == 10 and state.length == 14
    cfg = model.cfg
    assert snap.ple_conv[0].shape == (cfg.ple_conv_state_len, cfg.hc_dim)
    assert snap.rec[0].shape == (
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )
    assert snap.index is not None and snap.index.filled == [10 // cfg.indexer_compress_ratio]
    assert snap.nbytes > sum(r.nbytes for r in snap.rec)


def test_errors_are_clear(model: FlashNext) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward([300], model.new_state())
    with pytest.raises(ValueError, match="non-empty 1-D"):
        model.forward([], model.new_state())
    with pytest.raises(ValueError, match="text only"):
        model.forward([5, 6], model.new_state(), positions=np.array([[0, 1], [0, 1], [0, 2]]))
    model.forward([5, 6], model.new_state(), positions=np.array([0, 1]))  # restating text positions is fine
    with pytest.raises(ValueError, match="layer counts"):
        model.new_state().restore_gdn(model.new_mtp_state().snapshot_gdn())
