"""Engine parts without a model: page pool, prefix radix tree, stop strings, sampler, config."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.engine import EngineConfig, EngineConfigError, SamplingParams
from ninfer.engine.kv_pool import PagePool, PoolExhausted
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.sampler import MaskError, allowed_from_mask, apply_penalties, sample, uniform
from ninfer.engine.stop import StopMatcher, TextStream

P = 4


def _cache(pages: int = 64, budget_ckpts: int = 100, max_reserved: int = 8) -> PrefixCache:
    return PrefixCache(PagePool(pages), P, 10, 10 * budget_ckpts, max_reserved)


def _lane(cache: PrefixCache, n_tokens: int) -> list[int]:
    return cache.pool.alloc(-(-n_tokens // P))


# ---- page pool ----------------------------------------------------------------------------------------------
def test_pool_refcounts_and_exhaustion() -> None:
    pool = PagePool(4)
    a = pool.alloc(3)
    assert pool.free == 1 and all(pool.refcount(p) == 1 for p in a)
    pool.incref(a[:1])
    assert pool.decref(a) == 2 and pool.free == 3
    assert pool.decref(a[:1]) == 1 and pool.free == 4
    with pytest.raises(PoolExhausted):
        pool.alloc(5)
    with pytest.raises(AssertionError):
        pool.decref([0])


# ---- prefix cache -------------------------------------------------------------------------------------------
def test_publish_lookup_and_split_share_pages() -> None:
    c = _cache()
    seq = list(range(100, 114))  # 14 tokens, 4 pages
    lane = _lane(c, 14)
    node = c.publish(seq, 10, lane, c.new_checkpoint(True))
    c.pool.decref(lane)  # the request retires: only the tree holds pages now
    assert node.end == 10 and node.pages == lane[:3]
    m = c.lookup(seq + [1, 2], 13)
    assert m is not None and m.length == 10 and m.pages == lane[:3]
    assert c.lookup(seq, 9) is None  # the only checkpoint is past the limit
    # a second sequence shares the first 6 tokens, then diverges inside page 1
    other = seq[:6] + [7, 7, 7, 7, 7]
    lane2 = _lane(c, 11)
    c.publish(other, 11, lane2, c.new_checkpoint(True))
    c.pool.decref(lane2)
    c.check()
    m2 = c.lookup(other + [0], 11)
    assert m2 is not None and m2.length == 11
    # page 0 from the shared upper node, pages 1.. from the new branch's own copies
    assert m2.pages == [lane[0], lane2[1], lane2[2]]
    assert c.pool.refcount(lane[1]) == 2  # boundary page held by both halves of the split node
    m1 = c.lookup(seq + [1], 13)
    assert m1 is not None and m1.pages == lane[:3]


def test_duplicate_checkpoint_is_released() -> None:
    c = _cache()
    seq = list(range(9))
    for _ in range(2):
        lane = _lane(c, 9)
        c.publish(seq, 8, lane, c.new_checkpoint(True))
        c.pool.decref(lane)
    assert c.num_checkpoints == 1 and len(c.freed_checkpoints) == 1 and c.ckpt_used == 10
    assert len(c.held_pages()) == 2  # the second lane's duplicate pages were not taken


def test_lru_eviction_spares_reserved_and_prunes_paths() -> None:
    c = _cache(pages=12)
    nodes = []
    for k in range(3):  # three disjoint 8-token sequences, 2 pages each
        seq = [k * 100 + i for i in range(8)]
        lane = _lane(c, 8)
        nodes.append(c.publish(seq, 8, lane, c.new_checkpoint(True)))
        c.pool.decref(lane)
    c.reserve([nodes[0]])
    c.touch(nodes[1])  # 2 is now least recently used, then 0 (reserved), then 1
    assert c.pool.free == 6 and c.freeable_pages() == 4
    assert c.evict_pages(8)
    assert c.lookup([200 + i for i in range(8)] + [0], 8) is None
    assert c.lookup(list(range(8)) + [0], 8) is not None
    assert not c.evict_pages(11)  # only reserved pages are left: refused without evicting anything
    assert c.lookup([100 + i for i in range(8)] + [0], 8) is not None
    c.check()


def test_checkpoint_budget_evicts_lru_and_releases_oldest_reservation() -> None:
    c = _cache(budget_ckpts=2)
    made = []
    for k in range(2):
        lane = _lane(c, 4)
        made.append(c.publish([k, 1, 2, 3], 4, lane, c.new_checkpoint(True)))
        c.pool.decref(lane)
        c.reserve([made[-1]])
    assert c.new_checkpoint(False) is None  # stride checkpoints never displace reserved ones
    cid = c.new_checkpoint(True)  # an end-of-turn checkpoint releases the oldest reservation
    assert cid is not None and c.num_reservations == 1 and c.num_checkpoints == 1
    assert c.lookup([0, 1, 2, 3, 9], 4) is None and c.lookup([1, 1, 2, 3, 9], 4) is not None
    c.discard_checkpoint(cid)
    assert c.ckpt_used == 10


def test_reservation_cap_releases_oldest() -> None:
    c = _cache(max_reserved=2)
    for k in range(3):
        lane = _lane(c, 4)
        c.reserve([c.publish([k, 0, 0, 0], 4, lane, c.new_checkpoint(True))])
        c.pool.decref(lane)
    assert c.num_reservations == 2
    assert c.freeable_pages() == 1  # sequence 0 lost its reservation


# ---- stop strings -------------------------------------------------------------------------------------------
def test_stop_matcher_across_pieces_and_earliest_wins() -> None:
    m = StopMatcher(["END", "ND!", "xyz"])
    out = m.push("hello E") + m.push("N") + m.push("D! more")
    assert out == "hello " and m.matched == "END"
    m = StopMatcher(["bc", "ab"])
    assert m.push("zabc") == "z" and m.matched == "ab"  # lowest offset wins
    m = StopMatcher(["abc"])
    assert m.push("xa") == "x" and m.push("bz") == "abz" and m.matched is None
    assert m.push("ab") == "" and m.flush() == "ab"


def test_text_stream_without_tokenizer_refuses_stops() -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        TextStream(None, ["x"])
    assert TextStream(None, []).push(5) == ""


# ---- sampler ------------------------------------------------------------------------------------------------
def test_uniform_is_a_function_of_seed_and_position() -> None:
    u = [uniform(7, p) for p in range(2000)]
    assert u == [uniform(7, p) for p in range(2000)]
    assert all(0.0 <= x < 1.0 for x in u) and abs(np.mean(u) - 0.5) < 0.03
    assert uniform(7, 3) != uniform(8, 3)


def test_penalties() -> None:
    logits = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(logits, {0: 2, 1: 1}, p)
    assert out[0] == pytest.approx(2.0 / 2 - 0.5 * 2 - 0.25)
    assert out[1] == pytest.approx(-2.0 * 2 - 0.5 - 0.25)
    assert list(out[2:]) == [1.0, 0.5] and logits[0] == 2.0
    # greedy follows the penalized logits
    assert sample(logits, SamplingParams(presence_penalty=5.0), seed=0, position=0, counts={0: 1}) == 2


def test_top_k_top_p_min_p_restrict_the_support() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))

    def support(**kw: float) -> set[int]:
        p = SamplingParams(temperature=1.0, **kw)
        return {sample(logits, p, seed=1, position=i, counts={}) for i in range(400)}

    assert support() == {0, 1, 2, 3}
    assert support(top_k=2) == {0, 1}
    assert support(top_p=0.8) == {0, 1}
    assert support(min_p=0.25) == {0, 1, 2}
    # empirical frequencies follow the distribution
    draws = [
        sample(logits, SamplingParams(temperature=1.0), seed=3, position=i, counts={}) for i in range(4000)
    ]
    assert np.bincount(draws, minlength=4)[0] / 4000 == pytest.approx(0.5, abs=0.04)


def test_masks_and_token_limit() -> None:
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0], np.float32)
    g = SamplingParams()
    assert sample(logits, g, seed=0, position=0, counts={}, token_limit=0 + 5) == 0
    assert (
        sample(
            logits, g, seed=0, position=0, counts={}, token_mask=lambda gen: np.array([0, 0, 1, 1, 0], bool)
        )
        == 2
    )
    packed = np.array([0b01000], np.int32)  # only token 3
    assert allowed_from_mask(packed, 5).tolist() == [False, False, False, True, False]
    assert sample(logits, g, seed=0, position=0, counts={}, token_mask=lambda gen: packed) == 3
    with pytest.raises(MaskError, match="allows no token"):
        sample(logits, g, seed=0, position=0, counts={}, token_mask=lambda gen: np.zeros(5, bool))
    with pytest.raises(MaskError, match="failed"):
        sample(logits, g, seed=0, position=0, counts={}, token_mask=lambda gen: 1 / 0)
    assert sample(np.array([1.0, 9.0], np.float32), g, seed=0, position=0, counts={}, token_limit=1) == 0


# ---- config -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_concurrency": 9}, "max_concurrency"),
        ({"kv_capacity": 100, "max_context": 200}, "kv_capacity"),
        ({"kv_dtype": "int4"}, "kv_dtype"),
        ({"gdn_state_dtype": "fp16"}, "gdn_state_dtype"),
        ({"queue_depth": -1}, "queue_depth"),
        ({"prefill_chunk": 0}, "prefill_chunk"),
    ],
)
def test_config_names_the_bad_field(kw: dict, field: str) -> None:
    with pytest.raises(EngineConfigError, match=field):
        EngineConfig(**kw)


def test_checkpoint_stride_follows_a_larger_prefill_chunk() -> None:
    """A prompt's chunks are cut at checkpoint positions, so the default stride is max(4096, prefill_chunk): a
    larger chunk takes effect with prefix reuse on; an explicit stride is kept."""
    assert EngineConfig(prefill_chunk=4096).checkpoint_stride == 4096
    assert EngineConfig(prefill_chunk=2048).checkpoint_stride == 4096
    assert EngineConfig(prefill_chunk=8192).checkpoint_stride == 8192
    assert EngineConfig(prefill_chunk=8192, checkpoint_stride=4096).checkpoint_stride == 4096
    with pytest.raises(EngineConfigError, match="checkpoint_stride"):
        EngineConfig(checkpoint_stride=0)


def test_prefill_chunk_default_follows_the_model() -> None:
    """Left open (None), the chunk is the model's: 4096 dense, 8192 MoE (its expert GEMMs see twice the rows per
    expert), with the stride that follows; a chunk or a stride that was given is kept."""
    from types import SimpleNamespace

    dense, moe = SimpleNamespace(is_moe=False), SimpleNamespace(is_moe=True)
    open_ = EngineConfig()
    assert open_.prefill_chunk is None and open_.checkpoint_stride is None
    assert (open_.for_model(dense).prefill_chunk, open_.for_model(dense).checkpoint_stride) == (4096, 4096)
    assert (open_.for_model(moe).prefill_chunk, open_.for_model(moe).checkpoint_stride) == (8192, 8192)
    assert EngineConfig(checkpoint_stride=4096).for_model(moe).checkpoint_stride == 4096
    given = EngineConfig(prefill_chunk=2048)
    assert given.for_model(moe) is given


def test_engine_resolves_the_prefill_chunk(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The engine (and so its scheduler and runner) sees the model's chunk, never None."""
    from ninfer.demo import build_demo
    from ninfer.model import open_engine

    art = build_demo(tmp_path / "demo.ninfer")
    with open_engine(art, backend="null", backend_options={"step_s": 0.0}) as eng:
        assert not eng.model_config.is_moe
        assert (eng.config.prefill_chunk, eng.config.checkpoint_stride) == (4096, 4096)


@pytest.mark.parametrize(
    ("chunk", "stride", "want"), [(8192, None, [8192, 1808]), (8192, 4096, [4096, 4096, 1808])]
)
def test_prompt_chunks_with_prefix_reuse(tmp_path, chunk: int, stride: int | None, want: list[int]) -> None:  # type: ignore[no-untyped-def]
    """The prefill chunks a 10,000-token prompt is computed in, prefix reuse on (the runner records them)."""
    from ninfer.demo import build_demo
    from ninfer.model import open_engine

    seen: list[int] = []
    art = build_demo(tmp_path / "demo.ninfer")
    kw = dict(max_context=12288, kv_capacity=16384, prefill_chunk=chunk, checkpoint_stride=stride)
    with open_engine(art, backend="null", backend_options={"step_s": 0.0}, **kw) as eng:
        run = eng._runner.execute

        def execute(batch):  # type: ignore[no-untyped-def]
            seen.extend(len(w.token_ids) for w in batch.work if w.prefill)
            run(batch)

        eng._runner.execute = execute  # type: ignore[method-assign]
        eng.submit([1 + i % 97 for i in range(10000)], max_tokens=1).result()
    assert seen == want


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_params_refuse_out_of_range_values(kw: dict, field: str) -> None:
    """A negative temperature or top_k is refused (as HTTP refuses it), not silently taken as greedy / no cut:
    the Python API, the CLI and Ray token requests reach the engine without the HTTP checks."""
    from ninfer.engine.core import RequestError

    with pytest.raises(RequestError, match=field):
        SamplingParams(**kw).check()
    SamplingParams(temperature=0.0, top_k=0).check()
    SamplingParams(temperature=0.7, top_p=0.0).check()  # HTTP's range is [0, 1]: 0 keeps the top token only


def test_null_runner_emits_the_same_text_tokens_at_its_step_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The null backend (benchmarks of the stack): no weights, a fixed step time, tokens that are a function of
    the request's seed and position only, so both sides of a benchmark get the same output."""
    import time

    from ninfer.demo import build_demo
    from ninfer.model import load, open_engine

    art = build_demo(tmp_path / "demo.ninfer")
    with pytest.raises(ValueError, match="step_s"):
        load(art, backend="null", backend_options={"cuda_graph": True})
    with open_engine(art, backend="null", backend_options={"step_s": 0.005}, max_concurrency=2) as eng:
        t0 = time.perf_counter()
        a, b = (eng.submit([1, 2, 3], max_tokens=8, ignore_eos=True, seed=7) for _ in range(2))
        ra, rb = a.result(), b.result()
        took = time.perf_counter() - t0
    assert ra.token_ids == rb.token_ids and len(ra.token_ids) == 8 and ra.text.strip()
    assert took >= 8 * 0.005  # one step per token, each at least step_s


def test_null_runner_busy_step_holds_the_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``busy``: the step spins for its time (CPU used, as the CUDA engine's Python is) instead of sleeping; the
    output is the sleeping runner's."""
    import time

    from ninfer.demo import build_demo
    from ninfer.engine.null_runner import NullRunner
    from ninfer.model import open_engine

    with pytest.raises(ValueError, match="busy"):
        NullRunner(16, [1], busy=1)  # type: ignore[arg-type]
    art = build_demo(tmp_path / "demo.ninfer")
    outs, cpu = [], []
    for busy in (False, True):
        opts = {"step_s": 0.004, "busy": busy}
        with open_engine(art, backend="null", backend_options=opts, max_concurrency=1) as eng:
            t0, c0 = time.perf_counter(), time.process_time()
            outs.append(eng.submit([1, 2, 3], max_tokens=10, ignore_eos=True, seed=7).result().token_ids)
            assert time.perf_counter() - t0 >= 10 * 0.004  # one step per token, each at least step_s
            cpu.append(time.process_time() - c0)
    assert outs[0] == outs[1]
    assert cpu[1] >= 10 * 0.004 / 2 and cpu[1] > 2 * cpu[0]  # the busy steps spent their time on the CPU
