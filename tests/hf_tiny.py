"""Tiny random transformers Qwen3.5/3.6 checkpoints: the parity oracle of docs/model-math.md §9.

    model, hf_cfg = make_tiny_hf("dense" | "moe", seed, **overrides)
    save_tiny_hf(path, "moe", seed)                   # save_pretrained (safetensors) into path
    save_tiny_hf(path, "dense", seed, mtp=True)       # ... plus a random MTP head (mtp.safetensors)
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

__all__ = ["tiny_config_kwargs", "make_tiny_hf", "save_tiny_hf", "add_tiny_mtp", "canonical_state_dict"]

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
    path: str | Path, kind: str = "dense", seed: int = 0, *, mtp: bool = False, **overrides: Any
) -> tuple[Any, dict[str, Any]]:
    """``make_tiny_hf`` then ``save_pretrained(path)`` as safetensors (no tokenizer); returns the same pair.
    ``mtp``: also write a random MTP head (``add_tiny_mtp``), as the Qwen3.6 checkpoints carry one."""
    model, hf_cfg = make_tiny_hf(kind, seed, **overrides)
    model.save_pretrained(str(path), safe_serialization=True)
    if mtp:
        add_tiny_mtp(path, seed)
    return model, hf_cfg


def add_tiny_mtp(path: str | Path, seed: int = 0) -> None:
    """Add a random MTP head to a saved tiny checkpoint the way upstream checkpoints store it (HF ignores it):
    ``mtp.safetensors`` with ``mtp.{fc,pre_fc_norm_embedding,pre_fc_norm_hidden,norm}.weight`` and
    ``mtp.layers.0.*`` named like the checkpoint's first full-attention layer (MoE experts per expert), and
    ``mtp_num_hidden_layers: 1`` in config.json. Values: seeded noise at the scale of the copied tensors."""
    import json

    from safetensors.numpy import load_file, save_file

    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    full = cfg["layer_types"].index("full_attention")
    src: dict[str, np.ndarray] = {}
    for f in sorted(path.glob("*.safetensors")):
        src.update(load_file(str(f)))
    rng = np.random.default_rng(seed + 17)
    out: dict[str, np.ndarray] = {}
    prefix = next(p for p in ("model.language_model.", "model.") if any(k.startswith(p) for k in src))
    layer = f"{prefix}layers.{full}."
    h = int(cfg["hidden_size"])
    for name, x in src.items():
        if name.startswith(layer):
            scale = float(np.std(x)) or 0.1
            y = rng.standard_normal(x.shape) * (0.3 if name.endswith("norm.weight") else scale)
            out["mtp.layers.0." + name[len(layer) :]] = y.astype(np.float32)
    out["mtp.fc.weight"] = (rng.standard_normal((h, 2 * h)) / np.sqrt(2 * h)).astype(np.float32)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = (0.3 * rng.standard_normal(h)).astype(np.float32)
    save_file(out, str(path / "mtp.safetensors"))
    cfg["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(cfg, indent=2))


def canonical_state_dict(model: Any) -> dict[str, np.ndarray]:
    """The model's tensors as float32 NumPy under canonical names (``model.`` prefix removed)."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in model.state_dict().items():
        key = name.removeprefix("model.language_model.").removeprefix("model.")
        out[key] = tensor.detach().to("cpu").float().numpy().copy()
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out
