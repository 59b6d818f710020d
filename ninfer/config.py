"""Model configuration: the frozen description of one Qwen3.6-family text model.

Built once (from an HF ``config.json`` or an artifact manifest), validated in ``__post_init__`` and passed down.
Field names follow HF ``text_config`` so that a config read from a checkpoint maps one to one.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ModelConfig", "HybridDims", "ConfigError", "ARCHITECTURES"]

# transformers model_type of the text model -> our architecture name
ARCHITECTURES = {
    "qwen3_5_text": "qwen3_5",
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_5_moe": "qwen3_5_moe",
}


class ConfigError(ValueError):
    """A model configuration that ninfer cannot run, with the offending field named."""


def _fits(hint: Any, v: Any) -> bool:
    """Whether a manifest value has a config field's type (``int``, ``float``, ``str``, ``bool``, ``tuple[T, ...]``);
    a bool is not a number, an int is a float."""
    if hint is bool:
        return isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if hint is float:
        return isinstance(v, int | float) and not isinstance(v, bool)
    if hint is str:
        return isinstance(v, str)
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        return isinstance(v, tuple) and all(_fits(args[0], x) for x in v)
    return True


def _type_name(hint: Any) -> str:
    return "a list" if typing.get_origin(hint) is tuple else getattr(hint, "__name__", str(hint))


_POSITIVE_DIMS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


class HybridDims:
    """Derived dimensions shared by every hybrid GDN + attention config (Qwen3.6 and Flash-Next)."""

    __slots__ = ()
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    mrope_section: tuple[int, ...]
    head_dim: int
    partial_rotary_factor: float
    num_attention_heads: int
    num_key_value_heads: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int

    vocab_size: int

    def token_ids(self, ids: Any, what: str = "token_ids") -> np.ndarray:
        """``ids`` as a non-empty 1-D int64 array of ids in ``0..vocab_size-1``, or a ``ValueError`` that names
        ``what`` and the first bad id: the one token-id check of every entry point (the engine, ``Model``, the
        reference and CUDA networks)."""
        arr = np.asarray(ids)
        if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"{what}: expected a non-empty 1-D sequence of integer ids, got {arr.dtype}{list(arr.shape)}"
            )
        out = arr.astype(np.int64, copy=False)
        bad = (out < 0) | (out >= self.vocab_size)
        if bad.any():
            raise ValueError(
                f"{what}: token id {int(out[bad][0])} is outside the vocabulary [0, {self.vocab_size})"
            )
        return out

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def kv_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def gdn_ratio(self) -> int:
        return self.linear_num_value_heads // self.linear_num_key_heads

    @property
    def gdn_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_conv_channels(self) -> int:
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    def _check_hybrid(self, layer_kinds: tuple[str, ...], positive: Iterable[str] = ()) -> None:
        """The checks every hybrid config makes: the shared dimensions (and the ``positive`` fields) are positive
        integers, every layer has one of ``layer_kinds``, heads form whole GQA / GDN groups and the mRoPE
        sections cover the rotary dims."""
        for name in (*_POSITIVE_DIMS, *positive):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name}: must be a positive integer, got {v!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types: {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}"
            )
        bad = [t for t in self.layer_types if t not in layer_kinds]
        if bad:
            raise ConfigError(
                f"layer_types: unknown layer type {bad[0]!r} (expected {' or '.join(layer_kinds)})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads: must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads: must be a multiple of linear_num_key_heads")
        if self.rotary_dim % 2 or sum(self.mrope_section) * 2 != self.rotary_dim:
            raise ConfigError(
                f"mrope_section: {list(self.mrope_section)} must sum to rotary_dim/2 = {self.rotary_dim // 2}"
            )

    # ---- (de)serialisation (manifests store configs as JSON: tuples become lists) ----------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """The config from ``to_dict``'s output; unknown or missing fields are a ConfigError naming them."""
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        extra = sorted(set(d) - known)
        if extra:
            raise ConfigError(f"{extra[0]}: unknown config field")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        hints = typing.get_type_hints(cls)
        for k, v in kw.items():
            if not _fits(hints[k], v):
                raise ConfigError(f"{k}: expected {_type_name(hints[k])}, got {v!r}")
        try:
            return cls(**kw)
        except TypeError as e:  # missing required field
            raise ConfigError(str(e)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig(HybridDims):
    arch: str  # "qwen3_5" (dense) or "qwen3_5_moe"
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # "linear_attention" (GDN) or "full_attention" per layer
    # gated full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    # FFN: dense SwiGLU (intermediate_size) or MoE
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    # norms / rope
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mrope_interleaved: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    mtp_num_hidden_layers: int = 0
    eos_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.arch not in ("qwen3_5", "qwen3_5_moe"):
            raise ConfigError(f"arch: unsupported architecture {self.arch!r}")
        self._check_hybrid(("linear_attention", "full_attention"))
        if self.arch == "qwen3_5" and self.intermediate_size <= 0:
            raise ConfigError("intermediate_size: must be positive for the dense architecture")
        if self.arch == "qwen3_5_moe":
            if not (0 < self.num_experts_per_tok <= self.num_experts):
                raise ConfigError("num_experts_per_tok: must be in 1..num_experts")
            if self.moe_intermediate_size <= 0 or self.shared_expert_intermediate_size <= 0:
                raise ConfigError("moe_intermediate_size/shared_expert_intermediate_size: must be positive")

    # ---- derived values -------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3_5_moe"

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Read an HF ``config.json`` dict (CausalLM text config or VLM with ``text_config``)."""
        text = hf.get("text_config", hf)
        model_type = text.get("model_type", hf.get("model_type"))
        arch = ARCHITECTURES.get(model_type)
        if arch is None:
            raise ConfigError(
                f"model_type: {model_type!r} is not a supported architecture "
                f"(supported: {sorted(set(ARCHITECTURES))})"
            )
        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        n_layers = text["num_hidden_layers"]
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = text.get("full_attention_interval", 4)
            layer_types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
            ]
        eos = hf.get("eos_token_id", text.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))

        def g(name: str, default: Any = 0) -> Any:
            return text.get(name, default)

        return cls(
            arch=arch,
            vocab_size=g("vocab_size"),
            hidden_size=g("hidden_size"),
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=g("num_attention_heads"),
            num_key_value_heads=g("num_key_value_heads"),
            head_dim=g("head_dim"),
            linear_num_key_heads=g("linear_num_key_heads"),
            linear_num_value_heads=g("linear_num_value_heads"),
            linear_key_head_dim=g("linear_key_head_dim"),
            linear_value_head_dim=g("linear_value_head_dim"),
            linear_conv_kernel_dim=g("linear_conv_kernel_dim", 4),
            intermediate_size=g("intermediate_size", 0) if arch == "qwen3_5" else 0,
            num_experts=g("num_experts", 0),
            num_experts_per_tok=g("num_experts_per_tok", 0),
            moe_intermediate_size=g("moe_intermediate_size", 0),
            shared_expert_intermediate_size=g("shared_expert_intermediate_size", 0),
            rms_norm_eps=float(g("rms_norm_eps", 1e-6)),
            # HF silently defaults a missing rope_theta to 1e4 and mrope_section to [11,11,10]
            rope_theta=float(rope.get("rope_theta", g("rope_theta", 1e4))),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", g("partial_rotary_factor", 0.25))),
            mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
            mrope_interleaved=bool(rope.get("mrope_interleaved", True)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            max_position_embeddings=g("max_position_embeddings", 262144),
            mtp_num_hidden_layers=g("mtp_num_hidden_layers", 0),
            eos_token_ids=eos_ids,
        )
