"""Flash-Next through ``ninfer.Engine`` on the reference backend: prefix reuse over agent sessions.

The engine's checkpoints go through ``state.snapshot_gdn()/restore_gdn()`` (a ``FlashSnapshot``: GDN, QSA open
blocks, PLE conv windows, n-gram context) and the paged KV store also holds the pooled QSA index keys. Each check
compares against an engine with reuse disabled: reuse may only skip work, never change tokens. The tiny model has
a QSA budget of 8 tokens, so every context here runs block-sparse selection over paged index keys, and resume
points fall on and between QSA blocks (ratio 4) and KV pages (8 tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_tiny_flash import random_weights, tiny_hf_config

import ninfer
from ninfer.artifact import write_artifact
from ninfer.engine import Engine
from ninfer.engine.model_runner import snapshot_nbytes
from ninfer.flash_next import FlashNextConfig

BASE = dict(max_context=512, prefill_chunk=16, checkpoint_stride=16, page_size=8, kv_capacity=4096)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cfg = FlashNextConfig.from_hf(tiny_hf_config(budget=8, ratio=4))
    w = random_weights(cfg, seed=5, mtp=False)
    path = tmp_path_factory.mktemp("fn-engine") / "tiny.ninfer"
    write_artifact(
        path, model_id="qwen3.8-flash-next", weight_profile="bf16", config=cfg, shape_registered=False,
        load_tensor=w.__getitem__, resources={},
    )  # fmt: skip
    return ninfer.load(path)


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, n).tolist()


TURNS = [(7, 5), (5, 6), (6, 3), (9, 9), (4, 2)]  # (tokens generated, user tokens appended) per turn


def _session(model: Any, **kw: Any) -> list[tuple[list[int], int, list[int]]]:
    """Five token-level agent turns, each prompt = previous context + generated + new user tokens; then two other
    conversations over the same first 21 tokens (a shared system prompt). Returns (prompt, cached tokens,
    generated ids) per request."""
    out = []
    with Engine.from_model(model, max_concurrency=2, **{**BASE, **kw}) as eng:
        ctx = _ids(21, 1)
        for turn, (gen, user) in enumerate(TURNS):
            c = eng.submit(ctx, max_tokens=gen, ignore_eos=True).result(timeout=120)
            out.append((ctx, c.usage.cached_tokens, c.token_ids))
            ctx = ctx + c.token_ids + _ids(user, 10 + turn)
        for seed in (20, 21):
            prompt = _ids(21, 1) + _ids(30, seed)
            c = eng.submit(prompt, max_tokens=6, ignore_eos=True).result(timeout=120)
            out.append((prompt, c.usage.cached_tokens, c.token_ids))
        runner = eng._runner
        sizes = {snapshot_nbytes(s) for s in runner._ckpts.values()}
        assert runner.num_checkpoints > 5 and sizes == {runner.snapshot_bytes}  # one size at every length
        lengths = {s.length % 4 for s in runner._ckpts.values()}
        assert len(lengths) > 1, "every checkpoint fell on a QSA block boundary; the test lost its point"
    return out


def _no_reuse(model: Any, results: list[tuple[list[int], int, list[int]]], **kw: Any) -> list[list[int]]:
    with Engine.from_model(model, max_concurrency=1, prefix_reuse=False, **{**BASE, **kw}) as eng:
        return [
            eng.submit(p, max_tokens=len(ids), ignore_eos=True).result(timeout=120).token_ids
            for p, _, ids in results
        ]


# Lossy storage: fp8 KV is encoded per token, so it is the same whatever the chunking. bf16 GDN state is rounded
# after every forward call, so a resumed prompt (chunked from the resume point) rounds at other positions than a
# recomputed one, and on this random tiny model (where 1e-3 noise flips routing and QSA selection) tokens then
# differ; with one-token prefill chunks both engines round after every token and must agree exactly.
STORAGE = {
    "fp32-state": dict(),
    "fp8-kv": dict(kv_dtype="fp8"),
    "bf16-state-chunk1": dict(gdn_state_dtype="bf16", kv_dtype="fp8", prefill_chunk=1),
}


@pytest.mark.parametrize("storage", list(STORAGE.values()), ids=list(STORAGE))
def test_agent_session_resumes_with_identical_outputs(model: Any, storage: dict[str, str]) -> None:
    results = _session(model, **storage)
    assert [r[2] for r in results] == _no_reuse(model, results, **storage)
    assert results[0][1] == 0
    for (_, cached, _), (prompt, _, ids) in zip(results[1:5], results[:4], strict=True):
        assert cached == len(prompt) + len(ids), "a turn resumes at the end of the previous generation"
    assert {r[1] % 4 for r in results[1:5]} != {0}  # some resumes fall inside a QSA block
    # other conversations resume from the first turn's end-of-prompt checkpoint (21 tokens, inside a block)
    assert results[5][1] == results[6][1] == 21


def test_branch_inside_a_block_leaves_shared_pages_alone(model: Any) -> None:
    """Pages of 6 tokens, QSA blocks of 4: B branches from A's checkpoint at 18 (a page boundary inside block
    16..19) and completes that block; its key must go to B's own page, or C, continuing A, reads B's key."""
    kw = dict(BASE, page_size=6, checkpoint_stride=18)
    a = _ids(30, 40)
    b = a[:18] + _ids(14, 41)
    with Engine.from_model(model, **kw) as eng:
        ra = eng.submit(a, max_tokens=6, ignore_eos=True).result(timeout=120)
        rb = eng.submit(b, max_tokens=6, ignore_eos=True).result(timeout=120)
        c = a + ra.token_ids + _ids(5, 42)
        rc = eng.submit(c, max_tokens=6, ignore_eos=True).result(timeout=120)
    assert (rb.usage.cached_tokens, rc.usage.cached_tokens) == (18, len(a) + 6)
    want = _no_reuse(model, [(a, 0, ra.token_ids), (b, 0, rb.token_ids), (c, 0, rc.token_ids)])
    assert [ra.token_ids, rb.token_ids, rc.token_ids] == want


def test_runner_checkpoint_holds_sequence_state_only(model: Any, tmp_path: Path) -> None:
    """Index keys live in the KV pages (positional), so a checkpoint is the constant-size FlashSnapshot."""
    with Engine.from_model(model, background=False, **BASE) as eng:
        runner = eng._runner
        state = runner._new_state([0, 1, 2, 3])
        assert state.index is None  # the paged view serves write_index/read_index
        snap = state.snapshot_gdn()
        cfg = model.config
        assert runner.snapshot_bytes == snap.nbytes
        assert snap.open_keys[0].shape == (cfg.indexer_compress_ratio - 1, cfg.indexer_head_dim)
        assert runner.store.bytes_per_token > 2 * 2 * cfg.num_key_value_heads * cfg.head_dim * len(
            cfg.qsa_layers
        )
