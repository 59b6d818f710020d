"""Pinned configs of the registered model identities (the registry binds each identity to one of these).

A registered identity's artifact must carry exactly this config (eos ids and MTP depth aside, which describe the
checkpoint); other sizes of the same architecture are accepted only as ``shape_registered: false``.
"""

from __future__ import annotations

from ninfer.config import ModelConfig
from ninfer.flash_next.config import FlashNextConfig

__all__ = ["QWEN36_27B", "QWEN36_35B_A3B", "DEMO", "QWEN38_FLASH_NEXT"]

# ---- Qwen3.6 family -------------------------------------------------------------------------------------

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


# Qwen3.8-Flash-Next (docs/flash-next.md §1: every value from the checkpoint config, not transformers' defaults).
QWEN38_FLASH_NEXT = FlashNextConfig(
    vocab_size=248320,
    hidden_size=2560,
    num_hidden_layers=48,
    layer_types=tuple("qsa" if i % 4 == 3 else "linear_attention" for i in range(48)),
    num_attention_heads=24,
    num_key_value_heads=2,
    head_dim=256,
    indexer_n_heads=4,
    indexer_head_dim=128,
    indexer_budget=2048,
    indexer_compress_ratio=4,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    output_gate_type="sigmoid",
    num_experts=512,
    num_experts_per_tok=10,
    moe_intermediate_size=640,
    shared_expert_intermediate_size=640,
    norm_topk_prob=True,
    hc_count=4,
    hc_lowrank=320,
    ple_layer_ids=(2,),
    ple_embed_dim=2560,
    ple_conv_kernel_size=4,
    ngram_size=3,
    heads_per_ngram=8,
    ngram_vocab_size_base=20_000_000,
    make_ngram_vocab_size_divisible_by=128,
    seed=1234,
    split_ngram_parts=128,
    rms_norm_eps=1e-6,
    rope_theta=1e7,
    partial_rotary_factor=0.25,
    mrope_section=(11, 11, 10),
    tie_word_embeddings=False,
    max_position_embeddings=262144,
    mtp_num_hidden_layers=1,
    eos_token_ids=(248044, 248046),  # the first is the n-gram pad id
)
