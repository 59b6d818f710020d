"""Reference model vs transformers on tiny random checkpoints (docs/model-math.md §9; issue 2 acceptance).

Tolerance: max-abs error over max-abs logit ≤ 1e-4. Both sides are fp32; the floor is ~3e-5 to 6e-5 and is the
same size as transformers-fp32 vs transformers-fp64. MoE configs are chosen (seed, init range) so that no router
top-k decision sits within fp32 noise of a tie: at such a tie HF fp32 and HF fp64 already disagree by ~1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_tiny import canonical_state_dict, make_tiny_hf  # noqa: E402

from ninfer.config import ModelConfig  # noqa: E402
from ninfer.reference import DictWeights, Qwen36  # noqa: E402

TOL = 1e-4
PROMPT_LEN = 150  # > 2 GDN chunks of 64, not a multiple of 64

# name -> (kind, seed, overrides)
CONFIGS = {
    "dense-gqa2-gdn3": ("dense", 0, {}),
    "dense-8L-gqa4-q3k1": (
        "dense",
        3,
        dict(
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=1,
            linear_num_key_heads=1,
            initializer_range=0.07,
        ),
    ),
    "dense-odd-q3k1-tied": (
        "dense",
        2,
        dict(num_attention_heads=3, num_key_value_heads=1, linear_num_key_heads=3, linear_num_value_heads=3),
    ),
    "dense-q5k5": ("dense", 3, dict(num_attention_heads=5, num_key_value_heads=5)),
    "moe-e8k2": ("moe", 0, {}),
    "moe-8L-e4k1-q3k1": (
        "moe",
        1,
        dict(
            num_hidden_layers=8,
            num_experts=4,
            num_experts_per_tok=1,
            num_attention_heads=3,
            num_key_value_heads=1,
            initializer_range=0.1,
        ),
    ),
    "moe-e16k4-gqa4": (
        "moe",
        0,
        dict(
            num_experts=16,
            num_experts_per_tok=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            initializer_range=0.1,
        ),
    ),
}
CONFIGS["dense-odd-q3k1-tied"][2]["tie_word_embeddings"] = True


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def prompt() -> np.ndarray:
    return np.random.default_rng(1234).integers(0, 256, PROMPT_LEN)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    kind, seed, overrides = CONFIGS[request.param]
    hf, hf_cfg = make_tiny_hf(kind, seed, **overrides)
    cfg = ModelConfig.from_hf(hf_cfg)
    return hf, Qwen36(cfg, DictWeights(canonical_state_dict(hf)))


@pytest.fixture(scope="module")
def prompt_ref(pair, prompt) -> np.ndarray:
    """transformers' logits of the whole prompt, computed once per config."""
    return hf_logits(pair[0], prompt)


def hf_logits(hf, ids: np.ndarray, position_ids: np.ndarray | None = None) -> np.ndarray:
    kw = {} if position_ids is None else {"position_ids": torch.tensor(position_ids)[:, None, :]}
    with torch.no_grad():
        return hf(torch.tensor(ids)[None], **kw).logits[0].numpy()


def test_config_shapes_are_exercised(pair):
    hf, model = pair
    cfg = model.cfg
    assert cfg.layer_types.count("full_attention") * 3 == cfg.layer_types.count("linear_attention")
    assert model.lm_head(model.forward([1, 2], model.new_state())).shape == (2, cfg.vocab_size)


def test_full_prefill_logits(pair, prompt, prompt_ref):
    _, model = pair
    ref = prompt_ref
    state = model.new_state()
    got = model.lm_head(model.forward(prompt, state))
    assert state.length == PROMPT_LEN
    assert rel_err(got, ref) <= TOL


@pytest.mark.parametrize(
    "sizes",
    [(1, 1, 1, 147), (70, 1, 79), (1, 63, 65, 21), (33, 33, 33, 33, 18), (64, 64, 22), (129, 1, 1, 1, 1, 17)],
)
def test_chunked_prefill_logits(pair, prompt, prompt_ref, sizes):
    _, model = pair
    assert sum(sizes) == PROMPT_LEN
    ref = prompt_ref
    state, outs, at = model.new_state(), [], 0
    for n in sizes:
        outs.append(model.lm_head(model.forward(prompt[at : at + n], state)))
        at += n
    assert rel_err(np.concatenate(outs), ref) <= TOL


def test_mrope_positions(pair, prompt):
    hf, model = pair
    t = 100
    rng = np.random.default_rng(7)
    base = np.arange(t)
    # the H and W frequency pairs are slow (θ=1e7, 8 rotary dims), so the rows differ by hundreds of positions
    pos = np.stack([base, 5 * base + rng.integers(0, 50, t), 40 * base + 700]).astype(np.int64)
    ref = hf_logits(hf, prompt[:t], pos)
    assert rel_err(model.lm_head(model.forward(prompt[:t], model.new_state(), positions=pos)), ref) <= TOL
    state, outs = model.new_state(), []
    for a, b in [(0, 37), (37, 38), (38, 100)]:
        outs.append(model.lm_head(model.forward(prompt[a:b], state, positions=pos[:, a:b])))
    assert rel_err(np.concatenate(outs), ref) <= TOL
    # distinct rows really matter: text positions give different logits
    text = model.lm_head(model.forward(prompt[:t], model.new_state()))
    assert rel_err(text, ref) > 100 * TOL


def test_greedy_decode_matches_hf_generate(pair, prompt):
    hf, model = pair
    steps, ctx = 32, prompt[:80]
    ids = torch.tensor(ctx)[None]
    with (
        torch.no_grad()
    ):  # explicit mask: generate would otherwise treat prompt tokens equal to pad as padding
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    ref_tokens = out[0, len(ctx) :].tolist()
    state = model.new_state()
    h = model.forward(ctx, state)
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(model.lm_head(h[-1:])[0])))
        h = model.forward([tokens[-1]], state)
    assert tokens == ref_tokens
    assert state.length == len(ctx) + steps


def _assert_states_equal(a, b, cfg) -> None:
    assert a.length == b.length
    for x, y in zip(a.conv + a.rec, b.conv + b.rec, strict=True):
        assert np.array_equal(x, y)
    for j in range(len(cfg.full_attention_layers)):
        for x, y in zip(a.kv.read(j, a.length), b.kv.read(j, b.length), strict=True):
            assert np.array_equal(x, y)


def test_forward_batch_is_bitwise_solo(pair, prompt):
    _, model = pair
    lengths = (5, 70, 1, 131)
    states = []
    for i, n in enumerate(lengths):
        states.append(model.new_state())
        model.forward(prompt[i : i + n], states[-1])
    solo = [s.clone() for s in states]
    rng = np.random.default_rng(3)
    for _ in range(4):
        ids = rng.integers(0, 256, len(states))
        batched = model.forward_batch(ids, states)
        alone = np.concatenate([model.forward([t], s) for t, s in zip(ids, solo, strict=True)])
        assert np.array_equal(batched, alone)
        assert np.array_equal(model.lm_head(batched), model.lm_head(alone))
    for s, r in zip(states, solo, strict=True):
        _assert_states_equal(s, r, model.cfg)


def test_snapshot_restore_replays_exactly(pair, prompt):
    _, model = pair
    state = model.new_state()
    model.forward(prompt[:90], state)
    snap = state.snapshot_gdn()
    first = model.forward(prompt[90:97], state)
    model.forward([3], state)  # provisional work that gets rolled back
    state.restore_gdn(snap)
    assert state.length == 90
    again = model.forward(prompt[90:97], state)
    assert np.array_equal(first, again)
