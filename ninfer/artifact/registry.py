"""The closed registry of model identities and weight profiles.

An artifact binds exactly one registered ``model_id`` and one of that model's weight profiles. A registered
identity pins its config; a checkpoint of a registered architecture at another size (the tiny test models) is
accepted only when converted with ``--allow-unregistered-shape`` and is then marked ``shape_registered: false``.

A weight profile is a pure function (canonical tensor name, shape) -> format id, so the converter and the
verifier agree on every tensor's format by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ninfer.config import ModelConfig

__all__ = [
    "ModelIdentity",
    "MODELS",
    "PROFILES",
    "RegistryError",
    "identity",
    "identity_for_arch",
    "profile_format",
]


class RegistryError(ValueError):
    """An unregistered model identity or weight profile, or a config that differs from the pinned one."""


# ---- pinned configs -------------------------------------------------------------------------------------

_QWEN36_COMMON = dict(
    num_attention_heads=0,
    head_dim=256,
    linear_num_key_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_theta=1e7,
    partial_rotary_factor=0.25,
    mrope_section=(11, 11, 10),
    mrope_interleaved=True,
    tie_word_embeddings=False,
    max_position_embeddings=262144,
    mtp_num_hidden_layers=1,
    vocab_size=248320,
    eos_token_ids=(248046, 248044),
)


def _layer_types(n: int) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n))


def _cfg(**kw: object) -> ModelConfig:
    return ModelConfig(**{**_QWEN36_COMMON, **kw})  # type: ignore[arg-type]


QWEN36_27B = _cfg(
    arch="qwen3_5",
    hidden_size=5120,
    num_hidden_layers=64,
    layer_types=_layer_types(64),
    num_attention_heads=24,
    num_key_value_heads=4,
    linear_num_value_heads=48,
    intermediate_size=17408,
)

QWEN36_35B_A3B = _cfg(
    arch="qwen3_5_moe",
    hidden_size=2048,
    num_hidden_layers=40,
    layer_types=_layer_types(40),
    num_attention_heads=16,
    num_key_value_heads=2,
    linear_num_value_heads=32,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
)

# The demo model: a tiny dense qwen3.6-family body over the demo BPE tokenizer (random weights).
DEMO = ModelConfig(
    arch="qwen3_5",
    vocab_size=1152,
    hidden_size=128,
    num_hidden_layers=4,
    layer_types=_layer_types(4),
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    intermediate_size=256,
    rms_norm_eps=1e-6,
    rope_theta=1e7,
    partial_rotary_factor=0.25,
    mrope_section=(2, 1, 1),
    mrope_interleaved=True,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
    mtp_num_hidden_layers=1,
    eos_token_ids=(),  # filled from the tokenizer when the demo is built
)


# ---- weight profiles ------------------------------------------------------------------------------------

_ALWAYS_FP32 = ("linear_attn.A_log", "linear_attn.dt_bias")
# Small or precision-critical tensors stay BF16 in every profile: norms, GDN conv taps and a/b projections,
# the MoE router and the shared-expert gate.
_ALWAYS_BF16 = (
    "norm.weight",
    "layernorm.weight",
    "linear_attn.conv1d.weight",
    "linear_attn.in_proj_a.weight",
    "linear_attn.in_proj_b.weight",
    "mlp.gate.weight",
    "mlp.shared_expert_gate.weight",
)


def _fixed_format(name: str, shape: tuple[int, ...]) -> str | None:
    if name.endswith(_ALWAYS_FP32):
        return "FP32"
    if len(shape) < 2 or name.endswith(_ALWAYS_BF16):
        return "BF16"
    return None


def _bf16(name: str, shape: tuple[int, ...]) -> str:
    return _fixed_format(name, shape) or "BF16"


def _nvfp4(name: str, shape: tuple[int, ...]) -> str:
    return _fixed_format(name, shape) or "NVFP4G16_E4M3S"


def _fp8(name: str, shape: tuple[int, ...]) -> str:
    return _fixed_format(name, shape) or "FP8E4M3_F32ROW"


def _groupwise_int(name: str, shape: tuple[int, ...]) -> str:
    """Per-role group-int assignment modelled on upstream's qwen3_6 recipes (artifact.md §3).

    Upstream fuses rows ([q,k,gate,v], [q,k,v,z]); we keep HF tensors, so each HF tensor takes the format of
    the upstream role that holds most of its rows.
    """
    fixed = _fixed_format(name, shape)
    if fixed:
        return fixed
    if name.startswith("mtp.") or "shared_expert." in name:
        return "W8G32_F16S"
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return "Q6G64_F16S"
    q4 = ("q_proj.weight", "k_proj.weight", "in_proj_qkv.weight", "gate_proj.weight", "up_proj.weight")
    if name.endswith(q4) or name.endswith("experts.gate_up_proj"):
        return "Q4G64_F16S"
    return "Q5G64_F16S"


PROFILES: dict[str, Callable[[str, tuple[int, ...]], str]] = {
    "bf16": _bf16,
    "nvfp4": _nvfp4,
    "groupwise-int": _groupwise_int,
    "fp8": _fp8,
}


def profile_format(profile: str, name: str, shape: tuple[int, ...]) -> str:
    """The format id that weight profile ``profile`` assigns to tensor ``name`` of ``shape``."""
    try:
        fn = PROFILES[profile]
    except KeyError:
        raise RegistryError(
            f"weight profile {profile!r} is not registered (known: {', '.join(PROFILES)})"
        ) from None
    return fn(name, tuple(shape))


# ---- identities -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    model_id: str
    arch: str
    config: ModelConfig  # the pinned config of the registered shape
    profiles: tuple[str, ...]
    description: str


MODELS: dict[str, ModelIdentity] = {
    m.model_id: m
    for m in (
        ModelIdentity(
            "qwen3.6-27b",
            "qwen3_5",
            QWEN36_27B,
            ("bf16", "nvfp4", "groupwise-int", "fp8"),
            "Qwen3.6-27B: hybrid GDN + gated attention, dense",
        ),
        ModelIdentity(
            "qwen3.6-35b-a3b",
            "qwen3_5_moe",
            QWEN36_35B_A3B,
            ("bf16", "nvfp4", "groupwise-int", "fp8"),
            "Qwen3.6-35B-A3B: hybrid GDN + gated attention, 256-expert MoE",
        ),
        ModelIdentity(
            "qwen3.8-27b",
            "qwen3_5",
            QWEN36_27B,
            ("nvfp4", "groupwise-int"),
            "Qwen3.8-27B: same body as Qwen3.6-27B",
        ),
        ModelIdentity(
            "ninfer-demo",
            "qwen3_5",
            DEMO,
            ("bf16", "nvfp4", "groupwise-int", "fp8"),
            "tiny demo model with random weights (its text is random)",
        ),
    )
}

# The identity an unregistered-shape checkpoint of an architecture is recorded under.
_ARCH_FAMILY = {"qwen3_5": "qwen3.6-27b", "qwen3_5_moe": "qwen3.6-35b-a3b"}


def identity(model_id: str) -> ModelIdentity:
    try:
        return MODELS[model_id]
    except KeyError:
        raise RegistryError(
            f"model identity {model_id!r} is not registered (known: {', '.join(MODELS)})"
        ) from None


def identity_for_arch(arch: str) -> ModelIdentity:
    if arch not in _ARCH_FAMILY:
        raise RegistryError(f"architecture {arch!r} has no registered model identity")
    return MODELS[_ARCH_FAMILY[arch]]


def match_identity(cfg: ModelConfig) -> ModelIdentity | None:
    """The registered identity whose pinned config equals ``cfg`` in every model dimension, if any."""
    for m in MODELS.values():
        if m.model_id != "ninfer-demo" and _same_shape(m.config, cfg):
            return m
    return None


def _same_shape(a: ModelConfig, b: ModelConfig) -> bool:
    # eos ids and mtp depth describe the checkpoint, not the shape
    da, db = a.to_dict(), b.to_dict()
    for k in ("eos_token_ids", "mtp_num_hidden_layers"):
        da.pop(k), db.pop(k)
    return da == db


def check_config(model_id: str, cfg: ModelConfig, shape_registered: bool) -> ModelIdentity:
    """Check that ``cfg`` may be run as ``model_id``; returns the identity. Raises RegistryError."""
    ident = identity(model_id)
    if cfg.arch != ident.arch:
        raise RegistryError(
            f"config architecture {cfg.arch!r} does not match model identity {model_id!r} ({ident.arch})"
        )
    if shape_registered and not _same_shape(ident.config, cfg):
        diff = [
            k
            for k, v in ident.config.to_dict().items()
            if k not in ("eos_token_ids", "mtp_num_hidden_layers") and cfg.to_dict().get(k) != v
        ]
        raise RegistryError(f"config differs from the pinned config of {model_id!r} in: {', '.join(diff)}")
    return ident
