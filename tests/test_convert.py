"""Converter and public API end to end: tiny transformers checkpoints -> `ninfer convert` -> `ninfer.load`.

Parity is against transformers itself on the same weights in fp32. The tiny models' weights are rounded to
bf16-representable values before saving, so the `bf16` profile stores them exactly and the comparison measures
the model math alone (acceptance: 1e-4 relative, max-abs error over max-abs logit).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_tiny import make_tiny_hf
from test_reference_parity import CONFIGS

import ninfer
from ninfer import cli
from ninfer.artifact import open_artifact
from ninfer.convert import ConversionError, convert

torch = pytest.importorskip("torch")

# The reference's parity configs (GQA ratios, odd heads, 8-layer 3:1 patterns, expert counts, tied embeddings);
# their seeds and init ranges keep MoE routers away from near-ties, where fp32 noise alone flips a top-k.
SHAPES = {
    k: CONFIGS[k]
    for k in (
        "dense-gqa2-gdn3",
        "dense-8L-gqa4-q3k1",
        "dense-odd-q3k1-tied",
        "moe-e16k4-gqa4",
        "moe-8L-e4k1-q3k1",
    )
}


def _save_bf16_exact(path, kind: str, seed: int, **overrides):
    model, _ = make_tiny_hf(kind, seed, **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("A_log", "dt_bias")):  # stored FP32 by every profile
                p.copy_(p.bfloat16().float())
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        t = torch.tensor([ids])
        return model(t, attention_mask=torch.ones_like(t)).logits[0].float().numpy()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module", params=list(SHAPES))
def converted(request, tmp_path_factory):
    kind, seed, overrides = SHAPES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    model = _save_bf16_exact(d / "hf", kind, seed=seed, **overrides)
    out = str(d / "m.ninfer")
    convert(str(d / "hf"), out, "bf16", allow_unregistered_shape=True, progress=False)
    return model, out, d


def test_logits_match_transformers(converted) -> None:
    model, out, _ = converted
    ids = list(np.random.default_rng(1).integers(0, 256, 150))  # > 2 prefill chunks of 64
    ref = _hf_logits(model, ids)
    m = ninfer.load(out)
    assert m.artifact.shape_registered is False
    for chunk in (64, 37):
        got = m.logits(ids, prefill_chunk=chunk)
        assert got.shape == ref.shape and got.dtype == np.float32
        assert _rel(got, ref) < 1e-4, (chunk, _rel(got, ref))


def test_greedy_32_steps_match_transformers(converted) -> None:
    model, out, _ = converted
    prompt = [int(x) for x in np.random.default_rng(2).integers(0, 256, 70)]
    got = ninfer.load(out).generate(prompt, 32, greedy=True)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(32):
            t = torch.tensor([seq])
            seq.append(int(model(t, attention_mask=torch.ones_like(t)).logits[0, -1].argmax()))
    assert got == seq[len(prompt) :]


# Documented bounds for quantized profiles: max-abs logit error relative to the max-abs bf16 logit, and greedy
# top-1 agreement, on tiny random models with the HF default init (initializer_range 0.02), where 1% weight
# noise moves the logits by ~2%. Measured (dense, hidden 64): nvfp4 0.18 / 77%, groupwise-int 0.13 / 91%,
# fp8 0.04 / 94% (MoE: fp8 0.086). (With initializer_range 0.2 the random models amplify weight noise ~20x, so no 4-bit format
# can be judged on them.)
PROFILE_BOUNDS = {"nvfp4": (0.3, 0.6), "groupwise-int": (0.2, 0.75), "fp8": (0.12, 0.85)}


@pytest.fixture(scope="module", params=["dense", "moe"])
def well_conditioned(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"q-{request.param}")
    _save_bf16_exact(d / "hf", request.param, seed=7, initializer_range=0.02)
    convert(str(d / "hf"), str(d / "bf16.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    return d


@pytest.mark.parametrize("profile", list(PROFILE_BOUNDS))
def test_quantized_profiles_stay_near_bf16(well_conditioned, profile: str) -> None:
    d = well_conditioned
    q = str(d / f"{profile}.ninfer")
    convert(str(d / "hf"), q, profile, allow_unregistered_shape=True, progress=False)
    ids = list(range(3, 90))
    base, got = ninfer.load(str(d / "bf16.ninfer")).logits(ids), ninfer.load(q).logits(ids)
    max_err, min_top1 = PROFILE_BOUNDS[profile]
    assert 0 < _rel(got, base) < max_err, _rel(got, base)
    assert (got.argmax(1) == base.argmax(1)).mean() >= min_top1


def test_registered_identity_required_without_flag(tmp_path) -> None:
    _save_bf16_exact(tmp_path, "dense", 0)
    with pytest.raises(
        ConversionError, match="matches no registered model identity.*allow-unregistered-shape"
    ):
        convert(str(tmp_path), str(tmp_path / "x.ninfer"), "bf16", progress=False)
    with pytest.raises(ConversionError, match="does not match the pinned shape of 'qwen3.6-27b'"):
        convert(str(tmp_path), str(tmp_path / "x.ninfer"), "bf16", model_id="qwen3.6-27b", progress=False)


def test_unknown_config_and_missing_tensor(tmp_path) -> None:
    _save_bf16_exact(tmp_path, "dense", 0)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ConversionError, match="model_type: 'llama' is not a supported architecture"):
        convert(
            str(tmp_path), str(tmp_path / "x.ninfer"), "bf16", allow_unregistered_shape=True, progress=False
        )
    eight = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 8, "layer_types": eight}))
    with pytest.raises(ConversionError, match="checkpoint lacks 53 tensor"):
        convert(
            str(tmp_path), str(tmp_path / "x.ninfer"), "bf16", allow_unregistered_shape=True, progress=False
        )
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(
        ConversionError, match=r"mlp.gate_proj.weight: checkpoint shape \[128, 64\], config implies"
    ):
        convert(
            str(tmp_path), str(tmp_path / "x.ninfer"), "bf16", allow_unregistered_shape=True, progress=False
        )


def test_cli_convert_and_generate(tmp_path, capsys) -> None:
    _save_bf16_exact(tmp_path / "hf", "moe", 5)
    out = str(tmp_path / "m.ninfer")
    rc = cli.main(
        ["convert", str(tmp_path / "hf"), "-o", out, "--profile", "nvfp4", "--allow-unregistered-shape", "-q"]
    )
    assert rc == 0 and "verified" in capsys.readouterr().out
    assert open_artifact(out).weight_profile == "nvfp4"
    rc = cli.main(["generate", out, "--prompt-ids", "1,2,3,4", "--max-new", "5", "--greedy", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["prompt_tokens"] == 4 and len(res["token_ids"]) == 5
    rc = cli.main(
        ["convert", str(tmp_path / "hf"), "-o", out, "--profile", "int3", "--allow-unregistered-shape"]
    )
    assert rc == 2 and "weight profile 'int3' is not registered" in capsys.readouterr().err


def test_serve_refuses_unregistered_shape_without_flag(converted, capsys) -> None:
    _, out, _ = converted
    assert cli.main(["serve", out, "--port", "18999"]) == 2
    err = capsys.readouterr().err
    assert "not a registered" in err and "--allow-unregistered-shape" in err
