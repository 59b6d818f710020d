"""Tensor inventories: what an artifact of a given config and weight profile holds, tensor by tensor.

``TensorPlan`` is one stored tensor (encoded shape, format, the shape the model sees, and whether it lives in its
own host-side region read by rows). Every architecture's adapter (``registry.ARCHITECTURES``) turns (config,
profile) into ``{canonical name: TensorPlan}``; the converter uses it as its preflight, the writer as its plan and
the reader as its binder check (nothing missing, nothing extra, every shape and format exact).

``expected_inventory`` is the Qwen3.6-family table (canonical name -> HF shape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ninfer.config import ModelConfig

__all__ = ["expected_inventory", "expected_shapes", "lm_head_name", "TensorPlan", "RowReader"]

Shape = tuple[int, ...]
# (encoded bytes of the whole tensor, possibly a memory map; logical row ids) -> float32 rows [n, K_logical]
RowReader = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """How one tensor is stored.

    ``shape``: the shape its bytes are encoded with (the manifest's ``shape``); ``logical``: the shape the model
    sees (the HF shape; differs only for a packed row table). ``host_rows``: the tensor stays on the host in its
    own memory-mapped region, is written after every other tensor, and is read only by rows through ``rows``
    (an n-gram table larger than the GPU); its format must be row-local (``ninfer.artifact.rows``).
    """

    shape: Shape
    format: str
    logical: Shape
    host_rows: bool = False
    rows: RowReader | None = None


def _attention(prefix: str, c: ModelConfig) -> dict[str, Shape]:
    h, d = c.hidden_size, c.head_dim
    return {
        f"{prefix}self_attn.q_proj.weight": (2 * c.num_attention_heads * d, h),  # per head [query | gate]
        f"{prefix}self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
        f"{prefix}self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
        f"{prefix}self_attn.o_proj.weight": (h, c.num_attention_heads * d),
        f"{prefix}self_attn.q_norm.weight": (d,),
        f"{prefix}self_attn.k_norm.weight": (d,),
    }


def _gdn(prefix: str, c: ModelConfig) -> dict[str, Shape]:
    h, hv = c.hidden_size, c.linear_num_value_heads
    p = f"{prefix}linear_attn."
    return {
        f"{p}in_proj_qkv.weight": (c.gdn_conv_channels, h),
        f"{p}in_proj_z.weight": (c.gdn_value_dim, h),
        f"{p}in_proj_a.weight": (hv, h),
        f"{p}in_proj_b.weight": (hv, h),
        f"{p}out_proj.weight": (h, c.gdn_value_dim),
        f"{p}conv1d.weight": (c.gdn_conv_channels, 1, c.linear_conv_kernel_dim),
        f"{p}A_log": (hv,),
        f"{p}dt_bias": (hv,),
        f"{p}norm.weight": (c.linear_value_head_dim,),
    }


def _ffn(prefix: str, c: ModelConfig) -> dict[str, Shape]:
    h = c.hidden_size
    p = f"{prefix}mlp."
    if not c.is_moe:
        i = c.intermediate_size
        return {f"{p}gate_proj.weight": (i, h), f"{p}up_proj.weight": (i, h), f"{p}down_proj.weight": (h, i)}
    e, i, s = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    return {
        f"{p}gate.weight": (e, h),
        f"{p}experts.gate_up_proj": (e, 2 * i, h),  # rows [gate 0..I-1 ; up I..2I-1]
        f"{p}experts.down_proj": (e, h, i),
        f"{p}shared_expert.gate_proj.weight": (s, h),
        f"{p}shared_expert.up_proj.weight": (s, h),
        f"{p}shared_expert.down_proj.weight": (h, s),
        f"{p}shared_expert_gate.weight": (1, h),
    }


def _layer(prefix: str, c: ModelConfig, kind: str) -> dict[str, Shape]:
    h = c.hidden_size
    inv = {f"{prefix}input_layernorm.weight": (h,), f"{prefix}post_attention_layernorm.weight": (h,)}
    inv.update(_attention(prefix, c) if kind == "full_attention" else _gdn(prefix, c))
    inv.update(_ffn(prefix, c))
    return inv


def expected_inventory(c: ModelConfig) -> dict[str, Shape]:
    """All tensors of the text model (and the MTP head when ``mtp_num_hidden_layers`` > 0), in write order."""
    h, v = c.hidden_size, c.vocab_size
    inv: dict[str, Shape] = {"embed_tokens.weight": (v, h)}
    for i, kind in enumerate(c.layer_types):
        inv.update(_layer(f"layers.{i}.", c, kind))
    inv["norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        inv["lm_head.weight"] = (v, h)
    for j in range(c.mtp_num_hidden_layers):
        if j == 0:
            inv.update(
                {
                    "mtp.pre_fc_norm_embedding.weight": (h,),
                    "mtp.pre_fc_norm_hidden.weight": (h,),
                    "mtp.fc.weight": (h, 2 * h),
                }
            )
        inv.update(_layer(f"mtp.layers.{j}.", c, "full_attention"))
    if c.mtp_num_hidden_layers:
        inv["mtp.norm.weight"] = (h,)
    return inv


def expected_shapes(cfg: ModelConfig, *, mtp: bool | None = None) -> dict[str, Shape]:
    """Every canonical tensor name of the text model -> its HF shape (the inventory's table); ``mtp`` adds the MTP
    head's tensors (default: when ``cfg.mtp_num_hidden_layers > 0``). Every backend names tensors by it."""
    with_mtp = cfg.mtp_num_hidden_layers > 0 if mtp is None else mtp
    layers = max(1, cfg.mtp_num_hidden_layers) if with_mtp else 0
    return expected_inventory(replace(cfg, mtp_num_hidden_layers=layers))


def lm_head_name(cfg: Any) -> str:
    """The tensor the LM head multiplies by: ``embed_tokens.weight`` for a tied model."""
    return "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
