"""Upstream v1 files load through ``ninfer.load`` and compute what their weights define."""

from __future__ import annotations

import numpy as np
import pytest
import v1_writer as w

import ninfer
from ninfer.reference import DictWeights, Qwen36


@pytest.mark.parametrize("moe", [False, True])
def test_v1_file_loads_and_matches_reference(tmp_path, moe: bool) -> None:
    cfg = w.tiny_config(moe)
    canon = w.random_canonical(cfg, seed=4)
    assign = w.assign_35b if moe else w.assign_27b
    tensors = w.encode_parents(w.fuse(cfg, canon, split=not moe), assign)
    path = tmp_path / "up.ninfer"
    w.write_v1(path, "qwen3.6-35b-a3b" if moe else "qwen3.6-27b", tensors, resources={})

    m = ninfer.load(path, upstream_config=cfg)
    assert m.model_id == ("qwen3.6-35b-a3b" if moe else "qwen3.6-27b")
    assert m.artifact.weight_profile == "groupwise-int" and not m.artifact.shape_registered
    ids = list(range(5, 80))
    # one prefill chunk, like the reference call below: BLAS row blocking (OpenBLAS 0.3.31) gives a row different
    # bits in a 64-row and in a 75-row product, which is not what this test is about (the weights are)
    got = m.logits(ids, prefill_chunk=len(ids))
    # the same model computed from the dequantized weights directly
    deq = {n: m.artifact.weights().get(n) for n in canon}
    net = Qwen36(cfg, DictWeights(deq))
    want = net.lm_head(net.forward(np.array(ids), net.new_state()))
    np.testing.assert_array_equal(got, want)
    # and the dequantized weights are the originals within the group-int bound
    name = "layers.0.linear_attn.in_proj_qkv.weight"
    assert np.abs(deq[name] - canon[name]).max() < 0.1 * np.abs(canon[name]).max()
    assert {t["format"] for t in tensors} & {"Q4G64_F16S", "Q5G64_F16S"}, (
        "the file must hold group-int tensors"
    )


def test_v1_unregistered_model_id_is_refused(tmp_path) -> None:
    cfg = w.tiny_config(False)
    tensors = w.encode_parents(w.fuse(cfg, w.random_canonical(cfg, 0), split=True), w.assign_bf16)
    w.write_v1(tmp_path / "x.ninfer", "qwen9", tensors, resources={})
    with pytest.raises(ValueError, match="not registered"):
        ninfer.load(tmp_path / "x.ninfer", upstream_config=cfg)
