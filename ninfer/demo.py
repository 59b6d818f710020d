"""``ninfer demo``: the tiny demo artifact (random weights, a real BPE tokenizer, a Qwen-style chat template).

Its text is random: the weights are seeded noise. It exists so that `make serve` and the tests exercise every
part of the stack (artifact, tokenizer, template, engine, API) on a model small enough for a CPU.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np

from ninfer.artifact import write_artifact
from ninfer.artifact.inventory import expected_inventory
from ninfer.artifact.registry import MODELS
from ninfer.config import ModelConfig

__all__ = ["build_demo", "random_weights", "midsize_config", "DEMO_GENERATION_CONFIG"]

DEMO_GENERATION_CONFIG = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}


def midsize_config(kind: str) -> ModelConfig:
    """The mid-size random models of the fidelity checks (tests/test_cuda_model.py, perf/fidelity_prefill.py):
    hidden 1024, 8 layers (every fourth full attention), vocab 4096; ``kind`` ``dense`` or ``moe`` (16 experts,
    top 4, a shared expert)."""
    base = dict(
        vocab_size=4096, hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
        head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
        linear_value_head_dim=128, partial_rotary_factor=0.25, mrope_section=(6, 5, 5),
        layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(8)),
    )  # fmt: skip
    if kind == "dense":
        return ModelConfig(arch="qwen3_5", intermediate_size=2816, **base)
    return ModelConfig(
        arch="qwen3_5_moe", num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
        shared_expert_intermediate_size=512, **base,
    )  # fmt: skip


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random float32 weights for every tensor of ``cfg``'s inventory (HF init conventions:
    offset norms near 0, GDN norm near 1, matrices scaled by 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_inventory(cfg).items():
        if name.endswith("A_log"):
            x = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            x = rng.uniform(-1.0, 1.0, shape)
        elif name.endswith("linear_attn.norm.weight"):
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            x = 0.1 * rng.standard_normal(shape)
        elif name == "embed_tokens.weight":
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = x.astype(np.float32)
    return out


def build_demo(
    path: str | os.PathLike[str], seed: int = 0, profile: str = "bf16", *, shape_registered: bool = True
) -> str:
    """Write the demo artifact to ``path`` and return the path (``shape_registered=False``: marked as an
    unregistered shape, as ``ninfer convert --allow-unregistered-shape`` marks tiny checkpoints)."""
    from ninfer.frontend.demo_tokenizer import demo_frontend_resources

    res = demo_frontend_resources()
    added = json.loads(res["tokenizer"])["added_tokens"]
    ids = {t["content"]: t["id"] for t in added}
    cfg = replace(MODELS["ninfer-demo"].config, eos_token_ids=(ids["<|im_end|>"], ids["<|endoftext|>"]))
    n_tokens = max(ids.values()) + 1
    if n_tokens > cfg.vocab_size:
        raise AssertionError(
            f"demo tokenizer has {n_tokens} ids but the demo vocab has {cfg.vocab_size} rows"
        )
    weights = random_weights(cfg, seed)
    res["generation_config"] = json.dumps(
        {**DEMO_GENERATION_CONFIG, "eos_token_id": list(cfg.eos_token_ids)}, indent=2
    ).encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_artifact(
        path,
        model_id="ninfer-demo",
        weight_profile=profile,
        config=cfg,
        shape_registered=shape_registered,
        load_tensor=weights.__getitem__,
        resources=res,
        provenance=dict(tool="ninfer demo", seed=seed),
    )
    return os.fspath(path)
