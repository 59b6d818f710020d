"""Weights as the reference model sees them: a ``WeightSource`` of float32 arrays under canonical names.

Canonical names are the HF names without the ``model.`` / ``model.language_model.`` prefix (docs/contracts.md).
``expected_shapes(cfg)`` is the single table of every tensor a Qwen3.6-family text model (and its MTP head) has;
``CachedWeights`` fetches each tensor once, checks it against that table and keeps the float32 copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from ninfer.config import ModelConfig

__all__ = ["WeightSource", "DictWeights", "CachedWeights", "WeightError", "expected_shapes", "lm_head_name"]


class WeightError(ValueError):
    """A weight that is missing or has the wrong shape, with the tensor named."""


@runtime_checkable
class WeightSource(Protocol):
    def get(self, name: str) -> np.ndarray: ...  # float32, HF shape

    def names(self) -> Iterable[str]: ...

    def __contains__(self, name: object) -> bool: ...


class DictWeights:
    """A ``WeightSource`` over a plain ``dict[str, np.ndarray]`` (values converted to float32 on ``get``)."""

    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        self._t = dict(tensors)

    def get(self, name: str) -> np.ndarray:
        try:
            arr = self._t[name]
        except KeyError:
            raise WeightError(f"{name}: no such tensor") from None
        return np.asarray(arr, dtype=np.float32)

    def names(self) -> Iterator[str]:
        return iter(self._t)

    def __contains__(self, name: object) -> bool:
        return name in self._t

    def __len__(self) -> int:
        return len(self._t)


def lm_head_name(cfg: ModelConfig) -> str:
    """The tensor the LM head multiplies by: ``embed_tokens.weight`` for a tied model."""
    return "embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"


def _attention_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, d = cfg.hidden_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    return {
        f"{p}self_attn.q_proj.weight": (2 * hq * d, h),  # per head [query d | gate d]
        f"{p}self_attn.k_proj.weight": (hkv * d, h),
        f"{p}self_attn.v_proj.weight": (hkv * d, h),
        f"{p}self_attn.o_proj.weight": (h, hq * d),
        f"{p}self_attn.q_norm.weight": (d,),
        f"{p}self_attn.k_norm.weight": (d,),
    }


def _gdn_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h, c, hv = cfg.hidden_size, cfg.gdn_conv_channels, cfg.linear_num_value_heads
    vw = cfg.gdn_value_dim
    return {
        f"{p}linear_attn.in_proj_qkv.weight": (c, h),
        f"{p}linear_attn.in_proj_z.weight": (vw, h),
        f"{p}linear_attn.in_proj_a.weight": (hv, h),
        f"{p}linear_attn.in_proj_b.weight": (hv, h),
        f"{p}linear_attn.conv1d.weight": (c, 1, cfg.linear_conv_kernel_dim),
        f"{p}linear_attn.A_log": (hv,),
        f"{p}linear_attn.dt_bias": (hv,),
        f"{p}linear_attn.norm.weight": (cfg.linear_value_head_dim,),
        f"{p}linear_attn.out_proj.weight": (h, vw),
    }


def _ffn_shapes(cfg: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h = cfg.hidden_size
    if not cfg.is_moe:
        i = cfg.intermediate_size
        return {
            f"{p}mlp.gate_proj.weight": (i, h),
            f"{p}mlp.up_proj.weight": (i, h),
            f"{p}mlp.down_proj.weight": (h, i),
        }
    e, i, s = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    return {
        f"{p}mlp.gate.weight": (e, h),
        f"{p}mlp.experts.gate_up_proj": (e, 2 * i, h),
        f"{p}mlp.experts.down_proj": (e, h, i),
        f"{p}mlp.shared_expert.gate_proj.weight": (s, h),
        f"{p}mlp.shared_expert.up_proj.weight": (s, h),
        f"{p}mlp.shared_expert.down_proj.weight": (h, s),
        f"{p}mlp.shared_expert_gate.weight": (1, h),
    }


def _layer_shapes(cfg: ModelConfig, p: str, kind: str) -> dict[str, tuple[int, ...]]:
    out = {
        f"{p}input_layernorm.weight": (cfg.hidden_size,),
        f"{p}post_attention_layernorm.weight": (cfg.hidden_size,),
    }
    out.update(_gdn_shapes(cfg, p) if kind == "linear_attention" else _attention_shapes(cfg, p))
    out.update(_ffn_shapes(cfg, p))
    return out


def expected_shapes(cfg: ModelConfig, *, mtp: bool | None = None) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor name of the text model -> its HF shape.

    ``mtp`` adds the MTP head's tensors (default: when ``cfg.mtp_num_hidden_layers > 0``).
    """
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg.vocab_size, h), "norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i, kind in enumerate(cfg.layer_types):
        out.update(_layer_shapes(cfg, f"layers.{i}.", kind))
    with_mtp = cfg.mtp_num_hidden_layers > 0 if mtp is None else mtp
    if with_mtp:
        out.update(mtp_shapes(cfg))
    return out


def mtp_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The MTP head's tensors (model-qwen3.6.md §6, §8): one full-attention decoder layer plus fc and norms."""
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.fc.weight": (h, 2 * h),
        "mtp.norm.weight": (h,),
    }
    for layer in range(max(1, cfg.mtp_num_hidden_layers)):
        out.update(_layer_shapes(cfg, f"mtp.layers.{layer}.", "full_attention"))
    return out


class CachedWeights:
    """Fetches each tensor from a ``WeightSource`` once, checks its shape, and keeps the float32 array.

    ``shapes`` is the table the tensors are checked against (``expected_shapes``); a name outside it is refused
    so a typo in model code fails loudly instead of reading an unrelated tensor.
    """

    def __init__(self, source: WeightSource, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.source = source
        self._src = source
        self._shapes = dict(shapes)
        self._cache: dict[str, np.ndarray] = {}

    def require(self, names: Iterable[str], what: str) -> None:
        """Raise ``WeightError`` naming the first of ``names`` the source lacks."""
        for name in names:
            if name not in self._src:
                raise WeightError(f"{name}: missing from the weights ({what})")

    def __call__(self, name: str) -> np.ndarray:
        arr = self._cache.get(name)
        if arr is not None:
            return arr
        shape = self._shapes.get(name)
        if shape is None:
            raise WeightError(f"{name}: not a tensor of this model configuration")
        if name not in self._src:
            raise WeightError(f"{name}: missing from the weights")
        arr = np.ascontiguousarray(self._src.get(name), dtype=np.float32)
        if arr.shape != shape:
            raise WeightError(
                f"{name}: shape {list(arr.shape)} does not match the config, expected {list(shape)}"
            )
        arr = arr.view()  # read-only view: the source's own array keeps its flags
        arr.setflags(write=False)
        self._cache[name] = arr
        return arr
