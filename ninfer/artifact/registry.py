"""The closed registry of architectures, model identities and weight profiles.

An artifact binds exactly one registered ``model_id`` and one of that model's weight profiles. A registered
identity pins its config; a checkpoint of a registered architecture at another size (the tiny test models) is
accepted only when converted with ``--allow-unregistered-shape`` and is then marked ``shape_registered: false``.

Each architecture (the manifest's ``architecture``) has one ``Architecture`` adapter in ``ARCHITECTURES`` with what
the artifact layer needs to know of it: how to read its config (from a manifest or an HF ``config.json``) and its
tensor plan for a weight profile (name -> stored shape and format). The reader, writer and converter dispatch
through it and hold no per-architecture code. What is built from an architecture above this layer is kept there:
its reference network and backends in ``ninfer.architectures``, its checkpoint reader in the converter; both
import this module, never the reverse.

A weight profile is a pure function of (config, profile), so the converter and the verifier agree on every
tensor's format by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ninfer.artifact.inventory import TensorPlan, expected_inventory
from ninfer.artifact.pinned import DEMO, QWEN36_27B, QWEN36_35B_A3B, QWEN38_FLASH_NEXT
from ninfer.config import ConfigError, ModelConfig
from ninfer.flash_next.config import FlashNextConfig

__all__ = [
    "Architecture",
    "ARCHITECTURES",
    "ModelIdentity",
    "MODELS",
    "PROFILES",
    "RegistryError",
    "architecture",
    "architecture_for_hf",
    "identity",
    "identity_for_arch",
    "profile_format",
]

AnyConfig = ModelConfig | FlashNextConfig


class RegistryError(ValueError):
    """An unregistered model identity or weight profile, or a config that differs from the pinned one."""


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


def _nvfp4_bf16_embeddings(name: str, shape: tuple[int, ...]) -> str:
    """NVFP4 with the input embedding and the output head kept BF16 (Qwen3.8-27B OrcaRouter)."""
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return "BF16"
    return _nvfp4(name, shape)


def _fp8(name: str, shape: tuple[int, ...]) -> str:
    return _fixed_format(name, shape) or "FP8E4M3_F32ROW"


def _groupwise_int(name: str, shape: tuple[int, ...]) -> str:
    """Per-role group-int assignment modelled on upstream's qwen3_6 recipes (docs/formats.md §3).

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
    "nvfp4-bf16-embeddings": _nvfp4_bf16_embeddings,
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

FLASH_NEXT_PROFILES = ("bf16", "mixed-nvfp4-fp8-ple-int4")  # == ninfer.flash_next.quant.PROFILES (tested)


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    model_id: str
    arch: str
    config: AnyConfig  # the pinned config of the registered shape
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
            "qwen3.8-27b-orcarouter",
            "qwen3_5",
            QWEN36_27B,
            ("nvfp4-bf16-embeddings",),
            "Qwen3.8-27B OrcaRouter: NVFP4 body, BF16 embeddings and output head",
        ),
        ModelIdentity(
            "qwen3.8-flash-next",
            "qwen4_exp",
            QWEN38_FLASH_NEXT,
            FLASH_NEXT_PROFILES,
            "Qwen3.8-Flash-Next: hyper-connections, QSA block-sparse attention, host n-gram table, 512-expert MoE",
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


# ---- architectures --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Architecture:
    """What the artifact layer and the converter need to know about one architecture."""

    name: str  # the manifest's ``architecture`` and the config's ``arch``
    model_types: tuple[str, ...]  # HF ``model_type`` values (text model and VLM wrapper)
    family: str  # the identity an unregistered-shape checkpoint is recorded under
    config_from_dict: Callable[[dict[str, Any]], AnyConfig]
    # (HF config.json, the checkpoint's eos ids from generation_config/config/tokenizer) -> config
    config_from_hf: Callable[[dict[str, Any], tuple[int, ...]], AnyConfig]
    plan: Callable[[Any, str], dict[str, TensorPlan]]  # (config, profile) -> name -> TensorPlan


def _qwen36_from_hf(hf: dict[str, Any], eos: tuple[int, ...]) -> ModelConfig:
    cfg = ModelConfig.from_hf(hf)
    return replace(cfg, eos_token_ids=eos) if eos else cfg


def _qwen36_plan(cfg: ModelConfig, profile: str) -> dict[str, TensorPlan]:
    return {n: TensorPlan(s, profile_format(profile, n, s), s) for n, s in expected_inventory(cfg).items()}


def _flash_from_hf(hf: dict[str, Any], eos: tuple[int, ...]) -> FlashNextConfig:
    """The config's own eos ids stay first (the first is the n-gram pad id); the checkpoint's others follow."""
    cfg = FlashNextConfig.from_hf(hf)
    extra = tuple(e for e in eos if e not in cfg.eos_token_ids)
    return replace(cfg, eos_token_ids=cfg.eos_token_ids + extra) if extra else cfg


def _flash_plan(cfg: FlashNextConfig, profile: str) -> dict[str, TensorPlan]:
    from ninfer.flash_next.quant import artifact_plan

    try:
        return artifact_plan(cfg, profile)
    except ValueError as e:  # an unknown profile
        raise RegistryError(str(e)) from None


_QWEN36 = dict(
    config_from_dict=ModelConfig.from_dict,
    config_from_hf=_qwen36_from_hf,
    plan=_qwen36_plan,
)
ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("qwen3_5", ("qwen3_5", "qwen3_5_text"), "qwen3.6-27b", **_QWEN36),  # type: ignore[arg-type]
        Architecture(
            "qwen3_5_moe",
            ("qwen3_5_moe", "qwen3_5_moe_text"),
            "qwen3.6-35b-a3b",
            **_QWEN36,  # type: ignore[arg-type]
        ),
        Architecture(
            "qwen4_exp",
            ("qwen4_exp", "qwen4_exp_text"),
            "qwen3.8-flash-next",
            config_from_dict=FlashNextConfig.from_dict,
            config_from_hf=_flash_from_hf,
            plan=_flash_plan,
        ),
    )
}


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except (KeyError, TypeError):
        raise RegistryError(
            f"architecture {name!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        ) from None


def architecture_for_hf(hf: dict[str, Any]) -> Architecture:
    """The adapter of an HF ``config.json`` (text config or VLM wrapper with ``text_config``)."""
    text = hf.get("text_config", hf)
    model_type = text.get("model_type", hf.get("model_type"))
    for a in ARCHITECTURES.values():
        if model_type in a.model_types:
            return a
    known = sorted(t for a in ARCHITECTURES.values() for t in a.model_types)
    raise ConfigError(f"model_type: {model_type!r} is not a supported architecture (supported: {known})")


def identity(model_id: str) -> ModelIdentity:
    try:
        return MODELS[model_id]
    except KeyError:
        raise RegistryError(
            f"model identity {model_id!r} is not registered (known: {', '.join(MODELS)})"
        ) from None


def identity_for_arch(arch: str) -> ModelIdentity:
    return MODELS[architecture(arch).family]


def matching_identities(cfg: AnyConfig) -> list[ModelIdentity]:
    """Every registered identity whose pinned config equals ``cfg`` in every model dimension (several identities
    share one body: qwen3.6-27b, qwen3.8-27b and its OrcaRouter variant)."""
    return [
        m
        for m in MODELS.values()
        if m.model_id != "ninfer-demo" and m.arch == cfg.arch and _same_shape(m.config, cfg)
    ]


def match_identity(cfg: AnyConfig) -> ModelIdentity | None:
    """The registered identity whose pinned config equals ``cfg``, if exactly one does."""
    found = matching_identities(cfg)
    return found[0] if len(found) == 1 else None


_CHECKPOINT_FIELDS = ("eos_token_ids", "mtp_num_hidden_layers")  # describe the checkpoint, not the shape


def _shape_diff(a: AnyConfig, b: AnyConfig) -> list[str]:
    da, db = a.to_dict(), b.to_dict()
    keys = [k for k in dict.fromkeys([*da, *db]) if k not in _CHECKPOINT_FIELDS]
    return [k for k in keys if da.get(k) != db.get(k)]


def _same_shape(a: AnyConfig, b: AnyConfig) -> bool:
    return type(a) is type(b) and not _shape_diff(a, b)


def shape_diff(pinned: AnyConfig, cfg: AnyConfig) -> list[str]:
    """Config fields (other than eos ids and MTP depth) in which ``cfg`` differs from ``pinned``."""
    return _shape_diff(pinned, cfg)


def check_config(model_id: str, cfg: AnyConfig, shape_registered: bool) -> ModelIdentity:
    """Check that ``cfg`` may be run as ``model_id``; returns the identity. Raises RegistryError."""
    ident = identity(model_id)
    if cfg.arch != ident.arch:
        raise RegistryError(
            f"config architecture {cfg.arch!r} does not match model identity {model_id!r} ({ident.arch})"
        )
    if shape_registered and not _same_shape(ident.config, cfg):
        diff = _shape_diff(ident.config, cfg)
        raise RegistryError(f"config differs from the pinned config of {model_id!r} in: {', '.join(diff)}")
    return ident


def tensor_plan(model_id: str, cfg: AnyConfig, profile: str) -> dict[str, TensorPlan]:
    """The tensor plan of ``cfg`` as ``model_id`` under ``profile`` (the profile must be registered for it)."""
    ident = identity(model_id)
    if profile not in ident.profiles:
        raise RegistryError(
            f"weight profile {profile!r} is not registered for {model_id!r} "
            f"(registered: {', '.join(ident.profiles)})"
        )
    return architecture(ident.arch).plan(cfg, profile)
