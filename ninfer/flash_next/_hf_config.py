"""HF ``config.json`` -> FlashNextConfig (docs/flash-next.md §1): field mapping and the checks HF itself makes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ninfer.config import ConfigError

if TYPE_CHECKING:
    from ninfer.flash_next.config import FlashNextConfig

_QSA_NAMES = ("full_attention", "indexed_attention", "qwen_sparse_attention", "qsa")
_INDEXER = (
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
)


def _layer_types(text: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    raw = text.get("layer_types")
    if raw is None:
        interval = text.get("full_attention_interval", 4)
        return tuple("qsa" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers))
    out = []
    for t in raw:
        if t in _QSA_NAMES:
            out.append("qsa")
        elif t == "linear_attention":
            out.append(t)
        else:
            raise ConfigError(f"layer_types: unknown layer type {t!r}")
    return tuple(out)


def _eos_ids(hf: dict[str, Any], text: dict[str, Any]) -> tuple[int, ...]:
    """Text-config eos ids first (the first one is the n-gram pad id HF uses), then the outer config's others."""
    out: list[int] = []
    for src in (text, hf):
        eos = src.get("eos_token_id")
        for e in eos if isinstance(eos, list) else ([] if eos is None else [eos]):
            if int(e) not in out:
                out.append(int(e))
    return tuple(out)


def _check_supported(text: dict[str, Any], rope: dict[str, Any]) -> None:
    missing = [k for k in _INDEXER if text.get(k) is None]
    if missing:
        raise ConfigError(f"{missing[0]}: required (every non-GDN qwen4_exp layer is QSA)")
    if text["indexer_kv_heads"] != 1:
        raise ConfigError(f"indexer_kv_heads: qwen4_exp QSA requires 1, got {text['indexer_kv_heads']}")
    if text.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act: only silu is supported, got {text.get('hidden_act')!r}")
    if text.get("attention_bias", False):
        raise ConfigError("attention_bias: attention biases are not supported")
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(
            f"rope_parameters.rope_type: only 'default' is supported, got {rope.get('rope_type')!r}"
        )
    if text.get("mtp_use_dedicated_embeddings", False):
        raise ConfigError("mtp_use_dedicated_embeddings: dedicated MTP embeddings are not supported")


def from_hf(cls: type[FlashNextConfig], hf: dict[str, Any]) -> FlashNextConfig:
    text = hf.get("text_config", hf)
    model_type = text.get("model_type", hf.get("model_type"))
    if model_type not in ("qwen4_exp", "qwen4_exp_text"):
        raise ConfigError(f"model_type: {model_type!r} is not qwen4_exp (Qwen3.8-Flash-Next)")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    _check_supported(text, rope)
    n_layers = text["num_hidden_layers"]
    hidden = text["hidden_size"]

    def g(name: str, default: Any) -> Any:
        v = text.get(name)
        return default if v is None else v

    return cls(
        vocab_size=text["vocab_size"],
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        layer_types=_layer_types(text, n_layers),
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        head_dim=g("head_dim", 256),
        indexer_n_heads=text["indexer_n_heads"],
        indexer_head_dim=text["indexer_head_dim"],
        indexer_budget=text["indexer_budget"],
        indexer_compress_ratio=text["indexer_compress_ratio"],
        linear_num_key_heads=g("linear_num_key_heads", 16),
        linear_num_value_heads=g("linear_num_value_heads", 32),
        linear_key_head_dim=g("linear_key_head_dim", 128),
        linear_value_head_dim=g("linear_value_head_dim", 128),
        linear_conv_kernel_dim=g("linear_conv_kernel_dim", 4),
        output_gate_type=g("output_gate_type", g("hidden_act", "silu")),
        num_experts=g("num_experts", 512),
        num_experts_per_tok=g("num_experts_per_tok", 10),
        moe_intermediate_size=g("moe_intermediate_size", 512),
        shared_expert_intermediate_size=g("shared_expert_intermediate_size", 512),
        norm_topk_prob=bool(g("norm_topk_prob", True)),
        hc_count=g("hc_count", 4),
        hc_lowrank=g("hc_lowrank", 320),
        ple_layer_ids=tuple(sorted(set(g("ple_layer_ids", [])))),
        ple_embed_dim=g("ple_embed_dim", hidden),
        ple_conv_kernel_size=g("ple_conv_kernel_size", 4),
        ngram_size=g("ngram_size", 3),
        heads_per_ngram=g("heads_per_ngram", 8),
        ngram_vocab_size_base=g("ngram_vocab_size_base", 20_000_000),
        make_ngram_vocab_size_divisible_by=g("make_ngram_vocab_size_divisible_by", 128),
        seed=g("seed", 1234),
        split_ngram_parts=g("split_ngram_parts", 512),
        rms_norm_eps=float(g("rms_norm_eps", 1e-6)),
        # HF silently defaults a missing rope_theta to 1e4 and mrope_section to [11,11,10]
        rope_theta=float(rope.get("rope_theta", g("rope_theta", 1e4))),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", g("partial_rotary_factor", 1.0))),
        mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position_embeddings=g("max_position_embeddings", 32768),
        mtp_num_hidden_layers=g("mtp_num_hidden_layers", 0),
        eos_token_ids=_eos_ids(hf, text),
    )
