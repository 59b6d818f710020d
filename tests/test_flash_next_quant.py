"""Weight profiles of qwen3.8-flash-next: format assignment, the packed INT4 n-gram table read row by row (also
from a memory map), NVFP4 experts within the documented bound, and the model running on mixed-profile weights
through ``get_rows`` without ever loading the table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hf_tiny_flash import random_weights, real_hf_config, tiny_hf_config

from ninfer.flash_next import FlashNext, FlashNextConfig
from ninfer.flash_next.names import is_ngram_table
from ninfer.flash_next.quant import (
    PROFILE_BF16,
    PROFILE_MIXED,
    NgramLayout,
    assignment,
    decode_ngram_rows,
    encode_ngram_table,
    ngram_layout,
    stored_shapes,
    tensor_format,
)
from ninfer.formats import encoded_size, get_format
from ninfer.reference.weights import DictWeights


def test_mixed_assignment_of_the_real_model() -> None:
    cfg = FlashNextConfig.from_hf(real_hf_config())
    a = assignment(cfg, PROFILE_MIXED)
    assert a["layers.0.mlp.experts.gate_up_proj"] == a["layers.47.mlp.experts.down_proj"] == "NVFP4G16_E4M3S"
    assert (
        a["layers.0.linear_attn.in_proj_qkv.weight"]
        == a["layers.3.self_attn.q_proj.weight"]
        == "NVFP4G16_E4M3S"
    )
    assert a["mtp.layers.0.mlp.experts.gate_up_proj"] == a["mtp.fc_hidden.weight"] == "FP8E4M3_F32ROW"
    assert a["layers.3.self_attn.indexer.index_qk_proj.weight"] == a["lm_head.weight"] == "FP8E4M3_F32ROW"
    assert a["layers.0.mlp.gate.weight"] == a["layers.0.attn_hyper_connection.hc_norm.weight"] == "BF16"
    assert a["layers.0.linear_attn.A_log"] == "FP32"
    assert a["layers.1.ple.ple_embedding.ngram_embedding.weight"] == "Q4G64_F16S"
    lay = ngram_layout(cfg, PROFILE_MIXED)
    assert lay.pack == 4 and lay.stored_shape == (80_000_384, 640)
    assert lay.nbytes == 85 * 320_001_536  # 4.25 bits per value, no column padding
    gpu = sum(
        encoded_size(f, stored_shapes(cfg, PROFILE_MIXED)[n]) for n, f in a.items() if not is_ngram_table(n)
    )
    assert 70e9 < gpu < 80e9  # what has to fit on the H200 (the table stays on the host)
    assert set(assignment(cfg, PROFILE_BF16).values()) == {"BF16", "FP32"}
    with pytest.raises(ValueError, match="not one of"):
        tensor_format("embed_tokens.weight", (4, 4), "nvfp4")


@pytest.mark.parametrize(("rows", "dim", "pack"), [(1024, 160, 4), (16896, 4, 32)])
def test_packed_table_rows_decode_within_bound(tmp_path: Path, rows: int, dim: int, pack: int) -> None:
    rng = np.random.default_rng(0)
    table = rng.normal(0, 0.5, (rows, dim)).astype(np.float32)
    lay = NgramLayout("t", "Q4G64_F16S", rows, dim, pack)
    buf = encode_ngram_table(table, lay)
    assert buf.size == lay.nbytes
    path = tmp_path / "table.bin"
    buf.tofile(path)
    mapped = np.memmap(path, np.uint8, "r")
    ids = rng.integers(0, rows, 300)
    got = decode_ngram_rows(mapped, lay, ids)
    whole = get_format("Q4G64_F16S").decode(buf, lay.stored_shape).reshape(rows, dim)
    np.testing.assert_array_equal(got, whole[ids])
    # documented bound |w - x| <= s/2 with s <= amax_group/7·(1 + 2^-11), groups of 64 along the stored rows
    groups = np.abs(table.reshape(lay.stored_shape[0], -1, 64)).max(axis=2)  # stored row, group
    amax = np.repeat(groups, 64, axis=1).reshape(rows, dim)
    assert np.all(np.abs(whole - table) <= amax / 14 * (1 + 2**-10) + 1e-12)


def test_experts_nvfp4_within_bound() -> None:
    cfg = FlashNextConfig.from_hf(tiny_hf_config(num_experts=8))
    w = random_weights(cfg, seed=2, mtp=False)
    for name in ("layers.0.mlp.experts.gate_up_proj", "layers.3.mlp.experts.down_proj"):
        x = w[name]
        fmt = get_format(tensor_format(name, x.shape, PROFILE_MIXED))
        dec = fmt.decode(fmt.encode(x), x.shape)
        blocks = np.abs(x.reshape(-1, 16)).max(axis=1, keepdims=True)
        bound = blocks * (1 + 2**-4) / 6 + blocks / 16
        assert np.all(np.abs(dec - x).reshape(-1, 16) <= bound * (1 + 1e-6))
        assert np.linalg.norm(dec - x) / np.linalg.norm(x) < 0.15


class QuantSource:
    """A WeightSource over encoded bytes: ``get`` decodes, ``get_rows`` serves n-gram rows; ``get`` of a table
    raises, proving the model never loads it whole."""

    def __init__(self, cfg: FlashNextConfig, tensors: dict[str, np.ndarray], profile: str) -> None:
        self.shapes = stored_shapes(cfg, profile)
        self.fmts = assignment(cfg, profile)
        self.layouts = {
            ngram_layout(cfg, profile, r).name: ngram_layout(cfg, profile, r)
            for r in range(len(cfg.ple_layers))
        }
        self.blobs = {}
        for n, x in tensors.items():
            self.blobs[n] = (
                encode_ngram_table(x, self.layouts[n])
                if n in self.layouts
                else get_format(self.fmts[n]).encode(x)
            )
        self.rows_read = 0

    def get(self, name: str) -> np.ndarray:
        if name in self.layouts:
            raise AssertionError(f"{name}: the whole n-gram table was requested")
        return get_format(self.fmts[name]).decode(self.blobs[name], self.shapes[name])

    def get_rows(self, name: str, row_ids: np.ndarray) -> np.ndarray:
        self.rows_read += len(row_ids)
        return decode_ngram_rows(self.blobs[name], self.layouts[name], row_ids)

    def names(self) -> list[str]:
        return list(self.blobs)

    def __contains__(self, name: object) -> bool:
        return name in self.blobs


def test_model_on_mixed_profile_reads_table_rows_only() -> None:
    cfg = FlashNextConfig.from_hf(tiny_hf_config())
    w = random_weights(cfg, seed=4, mtp=False)
    src = QuantSource(cfg, w, PROFILE_MIXED)
    ids = np.random.default_rng(1).integers(3, 256, 30)
    got = FlashNext(cfg, src).logits(ids, prefill_chunk=7)
    assert src.rows_read == ids.size * cfg.ngram_heads
    ref = FlashNext(cfg, DictWeights(w)).logits(ids)
    # no closeness bound here: on random tiny weights expert routing and QSA selection flip under any noise
    # (1e-3 relative noise on the embedding alone moves these logits by ~35%); the per-tensor bounds above are
    # the quality contract, this checks the mixed path end to end
    assert np.all(np.isfinite(got)) and not np.array_equal(got, ref)
    exact = FlashNext(cfg, QuantSource(cfg, w, PROFILE_BF16)).logits(ids)
    np.testing.assert_allclose(
        exact, ref, rtol=0, atol=1e-5 * np.abs(ref).max()
    )  # bf16-exact weights: lossless
