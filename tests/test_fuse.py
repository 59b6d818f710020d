"""Fused projections (ninfer/cuda/fuse.py) on the host: the fused weight decodes to the parts' rows in order, in
every format, including the conversions (FP8 tensor scales to row scales, NVFP4 parts with different globals to
per-row globals). The GPU side (a fused product equals the parts' products bitwise) is in test_cuda_ops.py."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.artifact.registry import MODELS
from ninfer.cuda.fuse import FUSED, ROWG, concat_rows, fuse_projections, fused_splits, missing_tensors
from ninfer.cuda.nvfp4_layout import to_device_layout, to_natural_layout
from ninfer.cuda.weights import DeviceWeight
from ninfer.formats import FORMATS
from ninfer.formats.fp8 import e4m3_decode
from ninfer.formats.nvfp4 import e2m1_decode

FMTS = ("BF16", "FP8E4M3_F32ROW", "FP8E4M3_F32T", "NVFP4G16_E4M3S", "Q4G64_F16S", "Q6G64_F16S", "W8G32_F16S")


def _part(
    rng: np.random.Generator, fmt: str, rows: int, k: int, scale: float
) -> tuple[DeviceWeight, np.ndarray]:
    from ninfer.cuda.upload import plane_offsets

    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode((rng.standard_normal((rows, k)) * scale).astype(np.float32), (rows, k))
    )
    buf = buf.reshape(-1).view(np.uint8)
    w = to_device_layout(DeviceWeight(fmt, (rows, k), buf, plane_offsets(fmt, (rows, k), buf)))
    return w, codec.decode(buf, (rows, k))


def _decode(w: DeviceWeight) -> np.ndarray:
    w = to_natural_layout(w)  # NVFP4 weights live in the device layout (nvfp4_layout.py)
    if w.fmt != ROWG:
        return FORMATS[w.fmt].decode(w.data, w.shape)
    n, k = w.shape
    kp = -(-k // 128) * 128
    codes = w.data[: n * kp // 2].reshape(n, kp // 2)
    nib = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(n, kp)[:, :k]
    sc = w.data[w.offsets[1] : w.offsets[1] + n * kp // 16].reshape(n, kp // 16)
    g = w.data[w.offsets[2] : w.offsets[2] + 4 * n].view(np.float32)
    d = (e4m3_decode(np.repeat(sc, 16, axis=1)[:, :k]) * g[:, None]).astype(np.float32)
    return e2m1_decode(nib) * d


@pytest.mark.parametrize("fmt", FMTS)
def test_concat_rows_decodes_to_the_parts(fmt: str) -> None:
    rng = np.random.default_rng(3)
    for k in (200, 256):
        parts = [_part(rng, fmt, r, k, s) for r, s in ((5, 1.0), (16, 0.01), (3, 40.0))]
        fused = concat_rows([p for p, _ in parts])
        assert fused.shape == (24, k)
        want = {"FP8E4M3_F32T": "FP8E4M3_F32ROW", "NVFP4G16_E4M3S": ROWG}.get(fmt, fmt)
        assert fused.fmt == want
        ref = np.concatenate([d for _, d in parts])
        np.testing.assert_array_equal(_decode(fused), ref)


def test_nvfp4_parts_with_one_global_stay_nvfp4() -> None:
    rng = np.random.default_rng(4)
    a, da = _part(rng, "NVFP4G16_E4M3S", 4, 128, 1.0)
    fused = concat_rows([a, a])
    assert fused.fmt == "NVFP4G16_E4M3S"
    np.testing.assert_array_equal(_decode(fused), np.concatenate([da, da]))


@pytest.mark.parametrize(
    "fmts", [("Q4G64_F16S", "Q5G64_F16S", "Q4G64_F16S"), ("Q6G64_F16S", "Q4G64_F16S", "W8G32_F16S")]
)
def test_mixed_group_int_parts_are_widened_exactly(fmts: tuple[str, ...]) -> None:
    rng = np.random.default_rng(8)
    parts = [_part(rng, f, r, 200, s) for f, r, s in zip(fmts, (5, 7, 3), (1.0, 0.02, 30.0), strict=True)]
    fused = concat_rows([p for p, _ in parts])
    assert fused.fmt == max(fmts, key=("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S").index)
    np.testing.assert_array_equal(_decode(fused), np.concatenate([d for _, d in parts]))


def test_unjoinable_parts_fuse_as_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """GDN in-projections q|k|v (Q4), z (Q5), a, b (BF16): one widened Q5 run and one BF16 run."""
    import ninfer.cuda.fuse as fuse

    rng = np.random.default_rng(9)
    parts = [
        _part(rng, f, r, 64, 1.0) for f, r in (("Q4G64_F16S", 6), ("Q5G64_F16S", 4), ("BF16", 2), ("BF16", 2))
    ]
    runs = fuse._fuse([p for p, _ in parts])
    assert isinstance(runs, fuse.FusedRuns) and runs.cols == (0, 10, 14)
    assert [r.fmt for r in runs.runs] == ["Q5G64_F16S", "BF16"] and runs.nbytes == sum(
        r.data.nbytes for r in runs.runs
    )
    np.testing.assert_array_equal(_decode(runs.runs[0]), np.concatenate([parts[0][1], parts[1][1]]))
    np.testing.assert_array_equal(_decode(runs.runs[1]), np.concatenate([parts[2][1], parts[3][1]]))


def test_mixed_formats_are_refused() -> None:
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="mixed formats"):
        concat_rows([_part(rng, "BF16", 2, 64, 1)[0], _part(rng, "W8G32_F16S", 2, 64, 1)[0]])


@pytest.mark.parametrize("model", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_fuse_projections_replaces_the_parts(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer's group becomes one weight whose rows match the split table; nothing else changes (the
    concatenation itself is stubbed: real-size bytes would not fit here)."""
    import ninfer.cuda.fuse as fuse
    from ninfer.cuda.upload import is_vector
    from ninfer.reference.weights import expected_shapes

    def stub(parts: list) -> DeviceWeight:
        return DeviceWeight(
            "BF16", (sum(p.rows for p in parts), parts[0].cols), np.zeros(0, np.uint8), (0, 0, 0)
        )

    monkeypatch.setattr(fuse, "concat_rows", stub)
    cfg = MODELS[model].config
    shapes = expected_shapes(cfg, mtp=False)
    tensors: dict = {}
    for name, shape in shapes.items():
        if len(shape) == 2 and not is_vector(name) and ".experts." not in name:
            tensors[name] = DeviceWeight("BF16", tuple(shape), np.zeros(0, np.uint8), (0, 0, 0))
        else:
            tensors[name] = "other"
    out = fuse_projections(cfg, tensors)
    for i in range(cfg.num_hidden_layers):
        for fused, parts in FUSED.items():
            names = [f"layers.{i}.{p}" for p in parts]
            if not all(n in shapes for n in names):
                continue
            assert not any(n in out for n in names)
            w = out[f"layers.{i}.{fused}"]
            assert w.rows == fused_splits(cfg, fused)[-1] == sum(shapes[n][0] for n in names)
    assert sum(1 for v in out.values() if v == "other") == sum(1 for v in tensors.values() if v == "other")


def test_missing_tensors_counts_fused_parts_as_present() -> None:
    cfg = MODELS["qwen3.6-27b"].config
    names = ["layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight", "norm.weight"]
    fused = {"layers.0.self_attn.qkvg_proj": 1, "norm.weight": 1}
    assert missing_tensors(cfg, fused, names) == ["layers.0.mlp.down_proj.weight"]


@pytest.mark.parametrize("fmt", ("BF16", "NVFP4G16_E4M3S", "FP8E4M3_F32T"))
def test_shared_expert_is_appended_as_the_last_expert(fmt: str) -> None:
    """fuse.append_shared_expert: routed experts [E, N, K] and the shared expert [N, K] become [E + 1, N, K]
    decoding to the experts in order then the shared expert; a dict already extended is left alone; a shared
    expert of another width or a format that cannot join stays separate."""
    from types import SimpleNamespace

    from ninfer.cuda.fuse import append_shared_expert

    rng = np.random.default_rng(5)
    cfg = SimpleNamespace(num_experts=3)
    e, inter, hid = 3, 16, 128
    ex_gu = _part(rng, fmt, e * inter * 2, hid, 1.0)  # one stored tensor per projection, as in an artifact
    ex_dn = _part(rng, fmt, e * hid, inter * 2, 0.5)
    sh_gu, sh_dn = _part(rng, fmt, inter * 2, hid, 3.0), _part(rng, fmt, hid, inter * 2, 0.1)

    def experts(part: tuple) -> DeviceWeight:
        w = part[0]
        return DeviceWeight(w.fmt, (e, w.rows // e, w.cols), w.data, w.offsets)

    tensors = {
        "layers.0.mlp.experts.gate_up_proj": experts(ex_gu),
        "layers.0.mlp.experts.down_proj": experts(ex_dn),
        "layers.0.mlp.shared_expert.gate_up_proj": sh_gu[0],
        "layers.0.mlp.shared_expert.down_proj.weight": sh_dn[0],
    }
    assert append_shared_expert(cfg, tensors, "layers.0.")  # type: ignore[arg-type]
    for name, ex, sh in (("gate_up_proj", ex_gu, sh_gu), ("down_proj", ex_dn, sh_dn)):
        w = tensors[f"layers.0.mlp.experts.{name}"]
        assert w.shape == (e + 1, *sh[0].shape)
        flat = DeviceWeight(w.fmt, (w.rows, w.cols), w.data, w.offsets)
        ref = np.concatenate([ex[1], sh[1]])
        np.testing.assert_array_equal(_decode(flat), ref)
    before = dict(tensors)
    assert append_shared_expert(cfg, tensors, "layers.0.")  # type: ignore[arg-type]
    assert all(tensors[k] is before[k] for k in before)
    narrow = {
        "layers.0.mlp.experts.gate_up_proj": experts(ex_gu),
        "layers.0.mlp.experts.down_proj": experts(ex_dn),
        "layers.0.mlp.shared_expert.gate_up_proj": _part(rng, fmt, inter, hid, 1.0)[0],
        "layers.0.mlp.shared_expert.down_proj.weight": sh_dn[0],
    }
    assert not append_shared_expert(cfg, narrow, "layers.0.")  # type: ignore[arg-type]
    assert narrow["layers.0.mlp.experts.gate_up_proj"].shape[0] == e
