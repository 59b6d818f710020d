"""FlashNextConfig from HF configs (tiny and the real model's §1 values), names inventory and HF name mapping."""

from __future__ import annotations

import numpy as np
import pytest
from hf_tiny_flash import real_hf_config, tiny_hf_config

from ninfer.flash_next.config import ConfigError, FlashNextConfig
from ninfer.flash_next.names import expected_buffer, expected_shapes, map_hf_name, ngram_table_names
from ninfer.flash_next.ops_ngram import ngram_multipliers


@pytest.fixture(scope="module")
def real() -> FlashNextConfig:
    return FlashNextConfig.from_hf(real_hf_config())


def test_real_config_derived_values(real: FlashNextConfig) -> None:
    assert real.qsa_layers == tuple(range(3, 48, 4)) and len(real.gdn_layers) == 36
    assert real.ple_layers == (1,) and real.ple_dim == 2560 and real.ngram_row_dim == 160
    assert real.dense_max_visible == 2051 and real.block_topk == 512
    assert real.pad_token_id == 248044 and real.eos_token_ids == (248044, 248046)
    assert real.hc_dim == 10240 and real.ple_conv_state_len == 9 and real.rotary_dim == 64
    assert real.split_ngram_parts == 128 and real.mtp_num_hidden_layers == 1


def test_real_ngram_constants(real: FlashNextConfig) -> None:
    """docs/flash-next.md §7: the 16 primes, offsets, padded row count and the seed-1234 multipliers."""
    sizes = real.ngram_head_sizes(0)
    assert sizes[:3] == (20000003, 20000023, 20000033) and sizes[-1] == 20000171 and len(sizes) == 16
    offs = real.ngram_head_offsets(0)
    assert offs[:3] == (0, 20000003, 40000026) and offs[-1] == 300001275
    assert real.ngram_table_rows(0) == 320_001_536
    mult = ngram_multipliers(real.vocab_size, 3, 0, 1234)
    assert mult.tolist() == [23703573157769, 20109073645365, 8052911324071]
    assert real.ngram_head_sizes(1)[0] > sizes[-1]  # a second PLE layer continues the prime sequence


def test_real_inventory_counts(real: FlashNextConfig) -> None:
    """§10: 1325 HF tensors = 1195 canonical (128 shards -> 1 table, 3 derived buffers dropped) incl. 31 MTP."""
    with_mtp = expected_shapes(real)
    assert len(with_mtp) == 1195 and len(expected_shapes(real, mtp=False)) == 1164
    assert sum(n.startswith("mtp.") for n in with_mtp) == 31
    assert with_mtp["layers.1.ple.ple_embedding.ngram_embedding.weight"] == (320_001_536, 160)
    assert with_mtp["layers.0.mlp.experts.gate_up_proj"] == (512, 1280, 2560)
    assert with_mtp["layers.3.self_attn.indexer.index_qk_proj.weight"] == (640, 2560)
    assert with_mtp["mtp.pre_fc_norm_hidden.weight"] == (10240,)
    assert "norm.weight" not in with_mtp and "layers.0.input_layernorm.weight" not in with_mtp
    assert ngram_table_names(real) == ("layers.1.ple.ple_embedding.ngram_embedding.weight",)


def test_roundtrip_and_layer_type_names() -> None:
    hf = tiny_hf_config()
    hf["layer_types"] = ["linear_attention"] * 3 + ["indexed_attention"]
    cfg = FlashNextConfig.from_hf(hf)
    assert cfg.layer_types[-1] == "qsa" and FlashNextConfig.from_dict(cfg.to_dict()) == cfg
    hf.pop("layer_types")
    assert FlashNextConfig.from_hf(hf).layer_types == cfg.layer_types


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"indexer_budget": None}, "indexer_budget"),
        ({"indexer_kv_heads": 2}, "indexer_kv_heads"),
        ({"ple_layer_ids": [4]}, "not a linear_attention"),
        ({"ple_layer_ids": [0]}, "one-indexed"),
        ({"indexer_budget": 10}, "multiple of indexer_compress_ratio"),
        ({"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]}, "sliding_attention"),
        ({"model_type": "qwen3_5_moe_text"}, "not qwen4_exp"),
        ({"eos_token_id": None}, "eos_token_ids"),
        ({"output_gate_type": "tanh"}, "output_gate_type"),
    ],
)
def test_config_errors_name_the_field(change: dict, message: str) -> None:
    hf = tiny_hf_config()
    hf.update(change)
    with pytest.raises(ConfigError, match=message):
        FlashNextConfig.from_hf(hf)


def test_map_hf_names() -> None:
    assert map_hf_name("model.language_model.layers.3.self_attn.q_proj.weight").canonical == (
        "layers.3.self_attn.q_proj.weight"
    )
    assert map_hf_name("model.embed_tokens.weight").canonical == "embed_tokens.weight"
    assert map_hf_name("lm_head.weight").canonical == "lm_head.weight"
    assert (
        map_hf_name("mtp.layers.0.mlp.experts.gate_up_proj").canonical
        == "mtp.layers.0.mlp.experts.gate_up_proj"
    )
    shard = map_hf_name("model.language_model.layers.1.ple.ple_embedding.ngram_embedding.shard_17.weight")
    assert shard is not None and shard.kind == "ngram_shard" and shard.shard == 17
    assert shard.canonical == "layers.1.ple.ple_embedding.ngram_embedding.weight"
    buf = map_hf_name("model.layers.1.ple.ple_embedding.layer_multipliers")
    assert buf is not None and buf.kind == "verify_buffer"
    part = map_hf_name("model.layers.5.mlp.experts.7.up_proj.weight")
    assert part is not None and (part.canonical, part.expert, part.part) == (
        "layers.5.mlp.experts.gate_up_proj",
        7,
        "up",
    )
    for ignored in (
        "model.visual.blocks.0.attn.qkv.weight",
        "model.layers.2.hashstats_x",
        "model.hyper_connection_mixer.block_inject_weight",
    ):
        assert map_hf_name(ignored) is None


def test_expected_buffers_match_config() -> None:
    cfg = FlashNextConfig.from_hf(tiny_hf_config())
    sizes = expected_buffer(cfg, "layers.1.ple.ple_embedding.ngram_heads_vocab_sizes")
    offs = expected_buffer(cfg, "layers.1.ple.ple_embedding.ngram_heads_offsets")
    assert sizes[0] == 1009 and np.array_equal(offs, np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    with pytest.raises(KeyError):
        expected_buffer(cfg, "layers.0.ple.ple_embedding.layer_multipliers")
