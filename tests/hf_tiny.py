"""Tiny random transformers Qwen3.5/3.6 checkpoints: the parity oracle of docs/model-math.md §9.

    model, hf_cfg = make_tiny_hf("dense" | "moe", seed, **overrides)
    save_tiny_hf(path, "moe", seed)                   # save_pretrained (safetensors) into path
    tensors = canonical_state_dict(model)             # {canonical name: float32 array}

The models are fp32, eval, eager attention and eager experts. Every ``*norm.weight`` is perturbed away from its
initial value (zero-centred offset norms at 0 could not detect a missing ``1+w``; the GDN gated norm at 1 could not
detect a missing weight), and ``A_log`` / ``dt_bias`` are random. Overrides replace keys of the text config
(shapes, ``layer_types``, expert counts, ``rope_parameters`` ...). torch and transformers are imported lazily so
importing this module is cheap.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["tiny_config_kwargs", "make_tiny_hf", "save_tiny_hf", "canonical_state_dict"]

_COMMON: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=4,  # lin, lin, lin, full
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # 8 rotary dims
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
    tie_word_embeddings=False,
    rope_parameters=dict(
        rope_type="default",
        rope_theta=1e7,
        partial_rotary_factor=0.25,
        mrope_section=[2, 1, 1],
        mrope_interleaved=True,
    ),
)
_DENSE: dict[str, Any] = dict(intermediate_size=128)
_MOE: dict[str, Any] = dict(
    linear_num_value_heads=4,  # GDN ratio 2 as in the 35B
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)


def tiny_config_kwargs(kind: str = "dense", **overrides: Any) -> dict[str, Any]:
    """Keyword arguments of ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig`` for a tiny model."""
    if kind not in ("dense", "moe"):
        raise ValueError(f"kind: expected 'dense' or 'moe', got {kind!r}")
    kw = copy.deepcopy(_COMMON)
    kw.update(copy.deepcopy(_DENSE if kind == "dense" else _MOE))
    kw.update(copy.deepcopy(overrides))
    if "layer_types" not in overrides:
        n = kw["num_hidden_layers"]
        kw["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    return kw


def _perturb(model: Any, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
            if name.endswith("linear_attn.norm.weight"):  # plain gated norm, initialised to 1
                param.copy_(1.0 + 0.3 * noise)
            elif name.endswith("norm.weight"):  # zero-centred offset norms, initialised to 0
                param.copy_(0.3 * noise)
            elif name.endswith("linear_attn.A_log"):
                param.copy_(torch.log(torch.rand(param.shape, generator=gen) * 8.0 + 0.5))
            elif name.endswith("linear_attn.dt_bias"):
                param.copy_(0.5 * noise)


def make_tiny_hf(kind: str = "dense", seed: int = 0, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """A tiny random fp32 ``Qwen3_5ForCausalLM`` (dense) or ``Qwen3_5MoeForCausalLM`` and its config dict."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    kw = tiny_config_kwargs(kind, **overrides)
    cfg = Qwen3_5TextConfig(**kw) if kind == "dense" else Qwen3_5MoeTextConfig(**kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    model.eval()
    _perturb(model, seed)
    return model, model.config.to_dict()


def save_tiny_hf(
    path: str | Path, kind: str = "dense", seed: int = 0, **overrides: Any
) -> tuple[Any, dict[str, Any]]:
    """``make_tiny_hf`` then ``save_pretrained(path)`` as safetensors (no tokenizer); returns the same pair."""
    model, hf_cfg = make_tiny_hf(kind, seed, **overrides)
    model.save_pretrained(str(path), safe_serialization=True)
    return model, hf_cfg


def canonical_state_dict(model: Any) -> dict[str, np.ndarray]:
    """The model's tensors as float32 NumPy under canonical names (``model.`` prefix removed)."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in model.state_dict().items():
        key = name.removeprefix("model.language_model.").removeprefix("model.")
        out[key] = tensor.detach().to("cpu").float().numpy().copy()
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out
