"""Tiny upstream v1 files for the tests: upstream's recipes applied to canonical HF-shaped weights, framed by
``ninfer.artifact.v1_writer`` (upstream's object order, formats and byte layout).

``upstream_values`` is written from upstream's recipe rules (docs/upstream-v1.md §6), independently of the reader's
binding (``ninfer.artifact.v1_binding``): q_proj de-interleaved per head into query and gate, fused parents
concatenated in upstream's order, the GDN conv stored tap-major, a_log/dt_bias widened to FP32, the draft head
gathered from lm_head rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact.v1_writer import RESOURCE_NAMES, V1Tensor, v1_inventory, write_v1
from ninfer.config import ModelConfig
from ninfer.reference.weights import expected_shapes

MODEL = {False: "qwen3.6-27b", True: "qwen3.6-35b-a3b"}
FRONTEND = {name: f'{{"resource": "{name}"}}'.encode() for name in RESOURCE_NAMES}
# what a loaded model can use: no tokenizer (the tiny vocabularies have none), so no chat template either
NO_TOKENIZER = {n: b for n, b in FRONTEND.items() if "tokenizer" not in n}
DRAFT_ROWS = 32


def tiny_config(moe: bool) -> ModelConfig:
    """docs/model-math.md §9 sizes: 4 layers (lin, lin, lin, full), GQA 4/2 x 32, GDN 2 key / 6 (MoE: 4) value heads."""
    common: dict[str, Any] = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=("linear_attention",) * 3 + ("full_attention",),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        mrope_section=(2, 1, 1),
        mtp_num_hidden_layers=1,
    )
    if moe:
        return ModelConfig(
            arch="qwen3_5_moe",
            linear_num_value_heads=4,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **common,
        )
    return ModelConfig(arch="qwen3_5", linear_num_value_heads=6, intermediate_size=128, **common)


def random_canonical(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        name: (rng.standard_normal(shape) * 0.5).astype(np.float32)
        for name, shape in expected_shapes(cfg, mtp=True).items()
    }


def _layer(cfg: ModelConfig, w: dict[str, np.ndarray], src: str, dst: str, full: bool, split: bool) -> dict:
    g = lambda n: w[src + n]  # noqa: E731
    out = {
        dst + "input_norm": g("input_layernorm.weight"),
        dst + "post_attention_norm": g("post_attention_layernorm.weight"),
    }
    if full:
        hq, d, h = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        qg = g("self_attn.q_proj.weight").reshape(hq, 2 * d, h)
        q, gate = qg[:, :d].reshape(hq * d, h), qg[:, d:].reshape(hq * d, h)
        k, v = g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight")
        a = dst + "attention/"
        if split:
            out[a + "query_key"], out[a + "gate_value"] = np.concatenate([q, k]), np.concatenate([gate, v])
        else:
            out[a + "query_key_gate_value"] = np.concatenate([q, k, gate, v])
        out[a + "query_norm"], out[a + "key_norm"] = (
            g("self_attn.q_norm.weight"),
            g("self_attn.k_norm.weight"),
        )
        out[a + "output"] = g("self_attn.o_proj.weight")
    else:
        la, gd = "linear_attn.", dst + "gdn/"
        qkv, z = g(la + "in_proj_qkv.weight"), g(la + "in_proj_z.weight")
        a, b = g(la + "in_proj_a.weight"), g(la + "in_proj_b.weight")
        if split:
            kd2 = 2 * cfg.gdn_key_dim
            out[gd + "query_key"], out[gd + "value_z"] = qkv[:kd2], np.concatenate([qkv[kd2:], z])
            out[gd + "a_projection"], out[gd + "b_projection"] = a, b
        else:
            out[gd + "query_key_value_z"] = np.concatenate([qkv, z])
            out[gd + "a_b_projection"] = np.concatenate([a, b])
        out[gd + "convolution"] = np.ascontiguousarray(g(la + "conv1d.weight")[:, 0, :].T)  # [C,1,T] -> [T,C]
        out[gd + "a_log"], out[gd + "dt_bias"] = g(la + "A_log"), g(la + "dt_bias")
        out[gd + "norm"], out[gd + "output"] = g(la + "norm.weight"), g(la + "out_proj.weight")
    m = "mlp."
    if cfg.is_moe:
        e, i, h = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        mo, se = dst + "moe/", m + "shared_expert."
        out[mo + "router_shared_gate"] = np.concatenate(
            [g(m + "gate.weight"), g(m + "shared_expert_gate.weight")]
        )
        out[mo + "routed_gate_up"] = g(m + "experts.gate_up_proj").reshape(e * 2 * i, h)
        out[mo + "routed_down"] = g(m + "experts.down_proj").reshape(e * h, i)
        out[mo + "shared_gate_up"] = np.concatenate([g(se + "gate_proj.weight"), g(se + "up_proj.weight")])
        out[mo + "shared_down"] = g(se + "down_proj.weight")
    else:
        out[dst + "mlp/gate_up"] = np.concatenate([g(m + "gate_proj.weight"), g(m + "up_proj.weight")])
        out[dst + "mlp/down"] = g(m + "down_proj.weight")
    return out


def upstream_values(cfg: ModelConfig, w: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    """Every v1 object of ``v1_inventory(cfg)`` as values: text and MTP from the canonical weights ``w``, the
    draft head gathered from lm_head rows, vision and DFlash random."""
    out = {"text/token_embedding": w["embed_tokens.weight"]}
    for i, kind in enumerate(cfg.layer_types):
        out.update(
            _layer(cfg, w, f"layers.{i}.", f"text/layers/{i}/", kind == "full_attention", not cfg.is_moe)
        )
    out["text/final_norm"], out["text/output_head"] = w["norm.weight"], w["lm_head.weight"]
    rng = np.random.default_rng(seed)
    ids = rng.permutation(cfg.vocab_size)[:DRAFT_ROWS].astype(np.int32)
    out["text/draft_head"], out["text/draft_head_token_ids"] = w["lm_head.weight"][ids], ids
    if cfg.mtp_num_hidden_layers:
        out["mtp/input_projection"] = w["mtp.fc.weight"]
        out["mtp/embedding_norm"] = w["mtp.pre_fc_norm_embedding.weight"]
        out["mtp/hidden_norm"] = w["mtp.pre_fc_norm_hidden.weight"]
        out.update(_layer(cfg, w, "mtp.layers.0.", "mtp/layer/", True, False))
        out["mtp/final_norm"] = w["mtp.norm.weight"]
    for t in v1_inventory(cfg, draft_rows=DRAFT_ROWS):
        if t.name not in out:  # vision, DFlash
            out[t.name] = (rng.standard_normal(t.shape) * 0.1).astype(np.float32)
    return out


def inventory(cfg: ModelConfig, bf16: bool = False) -> list[V1Tensor]:
    """Upstream's inventory; ``bf16``: every grouped format replaced by BF16 (exact round trips)."""
    inv = v1_inventory(cfg, draft_rows=DRAFT_ROWS, q6_routed_down=(1,))
    if bf16:
        inv = [V1Tensor(t.name, t.shape, "BF16" if t.format.endswith("_F16S") else t.format) for t in inv]
    return inv


def write_tiny(
    path: Path,
    cfg: ModelConfig,
    w: dict[str, np.ndarray],
    model_id: str | None = None,
    *,
    bf16: bool = False,
    resources: dict[str, bytes] | None = None,
    tensors: list[V1Tensor] | None = None,
    values: dict[str, np.ndarray] | None = None,
    edit: Any = None,
) -> dict[str, Any]:
    vals = upstream_values(cfg, w) if values is None else values
    inv = inventory(cfg, bf16) if tensors is None else tensors
    mid = model_id or MODEL[cfg.is_moe]
    res = NO_TOKENIZER if resources is None else resources
    return write_v1(path, mid, inv, lambda t: vals[t.name], res, edit=edit)
