"""qwen4_exp tensor names: HF checkpoint name -> canonical name, and the canonical inventory with shapes.

Canonical names drop the ``model.`` / ``model.language_model.`` prefix (docs/contracts.md); ``lm_head.weight`` and
``mtp.*`` sit at the root already. Special cases (docs/flash-next.md §7, §10):
- the n-gram table arrives as ``split_ngram_parts`` shards ``...ngram_embedding.shard_{k}.weight``, concatenated
  along rows in k order into ONE canonical table ``layers.{i}.ple.ple_embedding.ngram_embedding.weight``;
- the three i64 buffers ``layer_multipliers``, ``ngram_heads_vocab_sizes``, ``ngram_heads_offsets`` are derived
  from the config: a converter checks them against ``expected_buffer`` and does not store them;
- per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (accepted by the transformers loader) fuse into the
  3-D ``experts.gate_up_proj`` (gate rows then up rows) / ``experts.down_proj``;
- vision (``model.visual.*``) and the repack extras ``hashstats_*``, ``token_lookup``,
  ``hyper_connection_mixer.block_inject_weight`` are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ninfer.flash_next.config import FlashNextConfig
from ninfer.flash_next.ops_ngram import ngram_multipliers

__all__ = [
    "HFTensor",
    "map_hf_name",
    "expected_shapes",
    "ngram_table_name",
    "ngram_table_names",
    "is_ngram_table",
    "expected_buffer",
    "NGRAM_BUFFERS",
]

NGRAM_TABLE_SUFFIX = "ple.ple_embedding.ngram_embedding.weight"
NGRAM_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")
_PREFIXES = ("model.language_model.", "model.")
_SHARD = re.compile(r"^(layers\.\d+\.ple\.ple_embedding\.ngram_embedding)\.shard_(\d+)\.weight$")
_BUFFER = re.compile(r"^layers\.\d+\.ple\.ple_embedding\.(" + "|".join(NGRAM_BUFFERS) + ")$")
_EXPERT = re.compile(r"^((?:mtp\.)?layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
_IGNORED = re.compile(
    r"(^visual\.|^model\.visual\.|hashstats_|token_lookup|hyper_connection_mixer\.block_inject_weight$)"
)


@dataclass(frozen=True, slots=True)
class HFTensor:
    """Where one HF tensor goes. ``kind``: ``tensor`` (stored as is), ``ngram_shard`` (rows ``shard`` of the
    canonical table, in shard order), ``expert_part`` (expert ``expert``'s ``part`` of a fused tensor) or
    ``verify_buffer`` (derived; compare with ``expected_buffer``, do not store)."""

    canonical: str
    kind: Literal["tensor", "ngram_shard", "expert_part", "verify_buffer"] = "tensor"
    shard: int | None = None
    expert: int | None = None
    part: Literal["gate", "up", "down"] | None = None


def map_hf_name(hf_name: str) -> HFTensor | None:
    """Canonical destination of an HF tensor name, or None for a tensor the text model ignores."""
    if _IGNORED.search(hf_name):
        return None
    name = hf_name
    for p in _PREFIXES:
        if name.startswith(p):
            name = name[len(p) :]
            break
    if m := _SHARD.match(name):
        return HFTensor(f"{m.group(1)}.weight", "ngram_shard", shard=int(m.group(2)))
    if _BUFFER.match(name):
        return HFTensor(name, "verify_buffer")
    if m := _EXPERT.match(name):
        fused = f"{m.group(1)}.down_proj" if m.group(3) == "down" else f"{m.group(1)}.gate_up_proj"
        return HFTensor(fused, "expert_part", expert=int(m.group(2)), part=m.group(3))  # type: ignore[arg-type]
    return HFTensor(name)


def ngram_table_name(layer: int) -> str:
    """Canonical name of the n-gram table of 0-based layer ``layer``."""
    return f"layers.{layer}.{NGRAM_TABLE_SUFFIX}"


def ngram_table_names(cfg: FlashNextConfig) -> tuple[str, ...]:
    return tuple(ngram_table_name(i) for i in cfg.ple_layers)


def is_ngram_table(name: str) -> bool:
    return name.endswith(NGRAM_TABLE_SUFFIX)


def expected_buffer(cfg: FlashNextConfig, canonical: str) -> np.ndarray:
    """The value a checkpoint's derived n-gram buffer must hold (int64)."""
    m = re.match(r"^layers\.(\d+)\.ple\.ple_embedding\.(\w+)$", canonical)
    if not m or int(m.group(1)) not in cfg.ple_layers or m.group(2) not in NGRAM_BUFFERS:
        raise KeyError(f"{canonical}: not an n-gram buffer of this configuration")
    rank = cfg.ple_layers.index(int(m.group(1)))
    if m.group(2) == "layer_multipliers":
        return ngram_multipliers(cfg.vocab_size, cfg.ngram_size, rank, cfg.seed)
    if m.group(2) == "ngram_heads_vocab_sizes":
        return np.array(cfg.ngram_head_sizes(rank), np.int64)
    return np.array(cfg.ngram_head_offsets(rank), np.int64)


def _hc(p: str, cfg: FlashNextConfig, inject: bool) -> dict[str, tuple[int, ...]]:
    w, r = cfg.hc_dim, cfg.hc_lowrank
    out = {
        f"{p}hc_norm.weight": (w,),
        f"{p}input_mix_weight_down.weight": (r, w),
        f"{p}input_mix_weight_up.weight": (w, r),
    }
    if inject:
        out[f"{p}block_inject_weight.weight"] = (cfg.hc_count, w)
    return out


def _qsa(p: str, cfg: FlashNextConfig) -> dict[str, tuple[int, ...]]:
    h, d, hq, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    dix = cfg.indexer_head_dim
    return {
        f"{p}self_attn.q_proj.weight": (2 * hq * d, h),  # per head [query d | gate d]
        f"{p}self_attn.k_proj.weight": (hkv * d, h),
        f"{p}self_attn.v_proj.weight": (hkv * d, h),
        f"{p}self_attn.o_proj.weight": (h, hq * d),
        f"{p}self_attn.q_norm.weight": (d,),
        f"{p}self_attn.k_norm.weight": (d,),
        f"{p}self_attn.indexer.index_qk_proj.weight": ((cfg.indexer_n_heads + 1) * dix, h),
        f"{p}self_attn.indexer.q_layernorm.weight": (dix,),
        f"{p}self_attn.indexer.k_layernorm.weight": (dix,),
    }


def _gdn(p: str, cfg: FlashNextConfig) -> dict[str, tuple[int, ...]]:
    h, c, hv, vw = cfg.hidden_size, cfg.gdn_conv_channels, cfg.linear_num_value_heads, cfg.gdn_value_dim
    return {
        f"{p}linear_attn.in_proj_qkv.weight": (c, h),
        f"{p}linear_attn.in_proj_z.weight": (vw, h),
        f"{p}linear_attn.in_proj_b.weight": (hv, h),
        f"{p}linear_attn.in_proj_a.weight": (hv, h),
        f"{p}linear_attn.conv1d.weight": (c, 1, cfg.linear_conv_kernel_dim),
        f"{p}linear_attn.dt_bias": (hv,),
        f"{p}linear_attn.A_log": (hv,),
        f"{p}linear_attn.norm.weight": (cfg.linear_value_head_dim,),
        f"{p}linear_attn.out_proj.weight": (h, vw),
    }


def _moe(p: str, cfg: FlashNextConfig) -> dict[str, tuple[int, ...]]:
    h, e, i, s = (
        cfg.hidden_size,
        cfg.num_experts,
        cfg.moe_intermediate_size,
        cfg.shared_expert_intermediate_size,
    )
    return {
        f"{p}mlp.gate.weight": (e, h),
        f"{p}mlp.experts.gate_up_proj": (e, 2 * i, h),
        f"{p}mlp.experts.down_proj": (e, h, i),
        f"{p}mlp.shared_expert.gate_proj.weight": (s, h),
        f"{p}mlp.shared_expert.up_proj.weight": (s, h),
        f"{p}mlp.shared_expert.down_proj.weight": (h, s),
        f"{p}mlp.shared_expert_gate.weight": (1, h),
    }


def _ple(p: str, cfg: FlashNextConfig, rank: int) -> dict[str, tuple[int, ...]]:
    w, dp = cfg.hc_dim, cfg.ple_dim
    return {
        f"{p}ple.key_proj.weight": (w, dp),
        f"{p}ple.value_proj.weight": (cfg.hidden_size, dp),
        f"{p}ple.norm_key.weight": (w,),
        f"{p}ple.norm_query.weight": (w,),
        f"{p}ple.norm_conv.weight": (w,),
        f"{p}ple.conv1d.weight": (w, 1, cfg.ple_conv_kernel_size),
        f"{p}{NGRAM_TABLE_SUFFIX}": (cfg.ngram_table_rows(rank), cfg.ngram_row_dim),
    }


def _layer(p: str, cfg: FlashNextConfig, kind: str) -> dict[str, tuple[int, ...]]:
    out = _gdn(p, cfg) if kind == "linear_attention" else _qsa(p, cfg)
    out.update(_moe(p, cfg))
    out.update(_hc(f"{p}attn_hyper_connection.", cfg, True))
    out.update(_hc(f"{p}mlp_hyper_connection.", cfg, True))
    return out


def expected_shapes(cfg: FlashNextConfig, *, mtp: bool | None = None) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of the text model (n-gram tables included) -> HF shape; ``mtp`` adds the 31 MTP
    tensors (default: when the config has an MTP layer). Count for the real model: 1325 - 127 (128 shards are
    one table) - 3 (derived buffers) = 1195 with MTP."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (v, h)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    out.update(_hc("hyper_connection_mixer.", cfg, False))
    for i, kind in enumerate(cfg.layer_types):
        if i in cfg.ple_layers:
            out.update(_ple(f"layers.{i}.", cfg, cfg.ple_layers.index(i)))
        out.update(_layer(f"layers.{i}.", cfg, kind))
    if cfg.mtp_num_hidden_layers > 0 if mtp is None else mtp:
        out.update(mtp_shapes(cfg))
    return out


def mtp_shapes(cfg: FlashNextConfig) -> dict[str, tuple[int, ...]]:
    """The MTP head (§8): fc_embedding/fc_hidden, two pre-fc norms, a mixer and one QSA layer."""
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {
        "mtp.fc_embedding.weight": (h, h),
        "mtp.fc_hidden.weight": (h, h),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (cfg.hc_dim,),
    }
    out.update(_hc("mtp.hyper_connection_mixer.", cfg, False))
    out.update(_layer("mtp.layers.0.", cfg, "qsa"))
    return out
