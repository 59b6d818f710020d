"""Upstream v1 files and mixed-format artifacts on the CUDA backend: the repacked weights (rows gathered, Q4 parts
widened to Q5, BF16 GDN a/b as a second run of the fused in-projection) compute the reference's logits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import v1_writer as w  # noqa: E402

import ninfer  # noqa: E402
from ninfer.artifact import write_artifact  # noqa: E402

gpu = pytest.mark.gpu
TOL = 2e-2  # fp32 activations, bf16 KV cache and accumulation order (test_cuda_model.TOL_REF)


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), "non-finite logits"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def _compare(path: Path, **load: Any) -> Any:
    pytest.importorskip("cupy")
    ids = list(np.random.default_rng(4).integers(0, 256, 45))
    ref = ninfer.load(path, **load)
    gpu_model = ninfer.load(path, backend="cuda", backend_options={"progress": False}, **load)
    want = ref.logits(ids, prefill_chunk=40)
    got = gpu_model.logits(ids, prefill_chunk=40)  # a 40-row prefill (GEMM) then a 5-row one (GEMV)
    err = _err(got, want)
    assert err <= TOL, err
    return gpu_model.net


@gpu
@pytest.mark.parametrize("moe", [False, True])
def test_v1_file_on_cuda_matches_the_reference(tmp_path, moe: bool) -> None:
    from ninfer.cuda.fuse import FusedRuns

    cfg = w.tiny_config(moe)
    path = tmp_path / "up.ninfer"
    w.write_tiny(path, cfg, w.random_canonical(cfg, 6))
    net = _compare(path, upstream_config=cfg)
    if not moe:
        assert net.w["layers.3.self_attn.qkvg_proj"].fmt == "Q5G64_F16S"  # Q4 query_key widened next to Q5
        runs = net.w["layers.0.linear_attn.in_proj"]
        assert isinstance(runs, FusedRuns) and [r.fmt for r in runs.runs] == ["Q5G64_F16S", "BF16"]
    else:
        assert net.w["layers.3.self_attn.qkvg_proj"].fmt == "W8G32_F16S"


@gpu
@pytest.mark.parametrize("profile", ["groupwise-int", "nvfp4", "fp8"])
def test_our_mixed_format_profiles_on_cuda(tmp_path, profile: str) -> None:
    """Our own quantized profiles keep the GDN a/b projections BF16 next to quantized q/k/v/z."""
    cfg = w.tiny_config(False)
    weights = w.random_canonical(cfg, 7)
    path = tmp_path / f"{profile}.ninfer"
    write_artifact(
        path,
        model_id="qwen3.6-27b",
        weight_profile=profile,
        config=cfg,
        shape_registered=False,
        load_tensor=weights.__getitem__,
        resources={},
    )
    _compare(path)
