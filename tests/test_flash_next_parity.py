"""Reference FlashNext vs transformers Qwen4ExpForCausalLM on tiny random checkpoints (fp32, perturbed norms).

Weights go HF state dict -> ``canonical_from_hf`` -> ``DictWeights`` (the converter path is tested by the artifact
tests). Each case has a PLE layer, a tiny QSA budget and contexts below and above it, so block selection runs in
prefill and decode. QSA top-k ties (possible at zero scores) would make the comparison depend on torch.topk's
undocumented tie order, so every test first asserts that no selection in it had a tie at the top-k boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_tiny_flash import CASES, EOS, TOL, build_tiny, hf_greedy, hf_logits, hf_state, rel_max

from ninfer.flash_next import FlashNext, FlashNextConfig
from ninfer.flash_next.hf import canonical_from_hf
from ninfer.reference.weights import DictWeights, WeightError

pytest.importorskip("transformers")


class Case:
    def __init__(self, name: str, seed: int) -> None:
        self.hf_model, hf = build_tiny(seed, **CASES[name])
        self.cfg = FlashNextConfig.from_hf(hf)
        self.selections = 0
        self.ties: list[tuple[int, int, float]] = []
        self.model = FlashNext(
            self.cfg,
            DictWeights(canonical_from_hf(self.cfg, hf_state(self.hf_model))),
            select_hook=self._hook,
        )

    def _hook(self, layer: int, pos: int, scores: np.ndarray, blocks: np.ndarray) -> None:
        self.selections += 1
        ranked = np.sort(scores)[::-1]
        k = self.cfg.block_topk
        if ranked[k - 1] == ranked[k]:
            self.ties.append((layer, pos, float(ranked[k])))

    def reset_ties(self) -> None:
        self.ties = []

    def check_no_ties(self) -> None:
        assert not self.ties, (
            f"QSA top-k ties at (layer, pos, score) {self.ties}: change the test seed/prompt"
        )


@pytest.fixture(scope="module", params=list(CASES))
def case_built(request: Any) -> Case:
    return Case(request.param, seed=list(CASES).index(request.param))


@pytest.fixture
def case(case_built: Case) -> Case:
    case_built.reset_ties()
    return case_built


def _prompt(n: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, 256, n)
    ids[n // 3] = EOS  # an EOS inside the prompt: n-grams must not cross it
    return ids


def test_logits_below_and_above_budget(case: Case) -> None:
    short = _prompt(case.cfg.dense_max_visible - 1, 1)
    before = case.selections
    assert rel_max(case.model.logits(short), hf_logits(case.hf_model, short)) < TOL
    assert case.selections == before  # below the budget QSA is exactly dense
    long = _prompt(48, 2)
    err = rel_max(case.model.logits(long), hf_logits(case.hf_model, long))
    case.check_no_ties()
    assert case.selections > before, "the long prompt never exercised block selection"
    assert err < TOL


@pytest.mark.parametrize("chunk", [1, 3, 8, 13])
def test_chunked_prefill(case: Case, chunk: int) -> None:
    ids = _prompt(40, 3)
    ref = hf_logits(case.hf_model, ids)
    err = rel_max(case.model.logits(ids, prefill_chunk=chunk), ref)
    case.check_no_ties()
    assert err < TOL


def test_greedy_32_steps_identical(case: Case) -> None:
    ids = _prompt(20, 4)
    want = hf_greedy(case.hf_model, ids, 32)
    state = case.model.new_state()
    h = case.model.forward(ids, state)
    got = []
    for _ in range(32):
        tok = int(np.argmax(case.model.lm_head(h[-1:])[0]))
        got.append(tok)
        h = case.model.forward([tok], state)
    case.check_no_ties()
    assert got == want
    assert state.length == 52 and state.length > case.cfg.dense_max_visible


def test_saved_checkpoint_shards_map_to_the_same_weights(case: Case, tmp_path: Path) -> None:
    """save_pretrained writes the n-gram table as split_ngram_parts shards plus the derived i64 buffers."""
    from safetensors.numpy import load_file

    case.hf_model.save_pretrained(tmp_path)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        tensors.update(load_file(f))
    assert any(".shard_3." in k for k in tensors) and any(k.endswith("layer_multipliers") for k in tensors)
    from_files = canonical_from_hf(case.cfg, tensors)
    from_state = canonical_from_hf(case.cfg, hf_state(case.hf_model))
    assert from_files.keys() == from_state.keys()
    for k, v in from_files.items():
        np.testing.assert_array_equal(v, from_state[k], err_msg=k)
    tensors["model.layers.1.ple.ple_embedding.layer_multipliers"] = np.array([3, 5, 7], np.int64)
    with pytest.raises(WeightError, match="layer_multipliers"):
        canonical_from_hf(case.cfg, tensors)
