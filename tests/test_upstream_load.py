"""Upstream v1 files load through ``ninfer.load`` / ``open_artifact`` and compute what their weights define: the
logits of a v1 file written from a transformers checkpoint match transformers within the group-int error, and equal
exactly our reference run on the dequantized weights."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import v1_writer as w  # noqa: E402

import ninfer  # noqa: E402
from ninfer.artifact import open_artifact  # noqa: E402
from ninfer.config import ModelConfig  # noqa: E402
from ninfer.formats import FORMATS  # noqa: E402
from ninfer.reference import DictWeights, Qwen36  # noqa: E402
from ninfer.reference.weights import expected_shapes  # noqa: E402

torch = pytest.importorskip("torch")
from hf_tiny import canonical_state_dict, make_tiny_hf  # noqa: E402


def _hf_case(kind: str) -> tuple[object, ModelConfig, dict[str, np.ndarray]]:
    hf, hf_cfg = make_tiny_hf(kind, seed=3, initializer_range=0.02)  # 0.2 makes the tiny models chaotic
    cfg = replace(ModelConfig.from_hf(hf_cfg), mtp_num_hidden_layers=1)
    canon = canonical_state_dict(hf)
    rng = np.random.default_rng(0)  # the CausalLM has no MTP head; upstream files always carry one
    for name, shape in expected_shapes(cfg, mtp=True).items():
        canon.setdefault(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    return hf, cfg, canon


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def _hf_logits(hf: object, ids: np.ndarray, weights: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """transformers' logits, with the model's tensors replaced by ``weights`` (canonical names) if given."""
    if weights is not None:
        hf = copy.deepcopy(hf)
        state = hf.state_dict()  # type: ignore[attr-defined]
        for key in state:
            name = key.removeprefix("model.language_model.").removeprefix("model.")
            state[key] = torch.from_numpy(weights[name])
        hf.load_state_dict(state)  # type: ignore[attr-defined]
    with torch.no_grad():
        return hf(torch.tensor(ids)[None]).logits[0].numpy()  # type: ignore[operator]


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_v1_logits_match_transformers_and_the_dequantized_reference(tmp_path, kind: str) -> None:
    hf, cfg, canon = _hf_case(kind)
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, 40)
    path = tmp_path / "up.ninfer"
    w.write_tiny(path, cfg, canon)
    m = ninfer.load(path, upstream_config=cfg)
    assert m.model_id == w.MODEL[kind == "moe"] and m.artifact.weight_profile == "groupwise-int"
    got = m.logits(list(ids), prefill_chunk=len(ids))
    # exactly our reference network on the dequantized weights
    text = expected_shapes(cfg, mtp=False)
    deq = {n: m.artifact.weights().get(n) for n in text}
    net = Qwen36(replace(cfg, mtp_num_hidden_layers=0), DictWeights(deq))
    np.testing.assert_array_equal(got, net.lm_head(net.forward(ids, net.new_state())))
    # the group-int tolerance: every served weight within half a quantization step of the checkpoint's ...
    for name in text:
        info = m.artifact.tensor_info(name)
        if info["format"].endswith("_F16S"):
            fmt = FORMATS[info["format"]]
            scale = fmt.views(m.artifact.raw(name), info["shape"])["scale"].astype(np.float32)  # type: ignore[attr-defined]
            step = np.repeat(scale, fmt.group, axis=1)[:, : info["shape"][-1]].reshape(info["shape"])
            assert (np.abs(deq[name] - canon[name]) <= step * (0.5 + 2.0**-20)).all(), name
    # ... and transformers on those weights computes our logits; on the source checkpoint's, nearly so
    assert _rel(got, _hf_logits(hf, ids, deq)) < 1e-4
    err = _rel(got, _hf_logits(hf, ids))
    assert err < 0.2, err
    exact = tmp_path / "bf16.ninfer"
    w.write_tiny(exact, cfg, canon, bf16=True)
    got_bf16 = ninfer.load(exact, upstream_config=cfg).logits(list(ids), prefill_chunk=len(ids))
    assert _rel(got_bf16, _hf_logits(hf, ids)) < err  # the codes, not the plumbing, make the difference


def test_open_artifact_dispatches_and_verifies(tmp_path) -> None:
    cfg = w.tiny_config(False)
    path = tmp_path / "up.ninfer"
    w.write_tiny(path, cfg, w.random_canonical(cfg, 0))
    with pytest.raises(
        ValueError,
        match=r"text model: object 'text/layers/4/input_norm' is missing .*pinned qwen3.6-27b shape",
    ):
        open_artifact(path)  # the pinned 27B shape does not fit a tiny file
    art = ninfer.load(path, upstream_config=cfg).artifact
    art.verify_blobs()
    assert not art.shape_registered and art.architecture == "qwen3_5"
    assert {k: len(v) for k, v in art.groups.items()} == {
        "text": 51,
        "mtp": 12,
        "draft_head": 2,
        "vision": 33,
        "dflash": 0,
    }
    assert art.resource("chat_template") == w.FRONTEND["frontend/chat_template.jinja"]
    assert art.resource("tokenizer") is None


def test_v1_unregistered_model_id_is_refused(tmp_path) -> None:
    cfg = w.tiny_config(False)
    w.write_tiny(tmp_path / "x.ninfer", cfg, w.random_canonical(cfg, 0), model_id="qwen9", bf16=True)
    with pytest.raises(ValueError, match="'qwen9' is not registered for v1 files"):
        ninfer.load(tmp_path / "x.ninfer", upstream_config=cfg)


def test_draft_ids_outside_the_vocabulary_fail_verification(tmp_path) -> None:
    cfg = w.tiny_config(True)
    canon = w.random_canonical(cfg, 1)
    values = w.upstream_values(cfg, canon)
    values["text/draft_head_token_ids"] = values["text/draft_head_token_ids"].copy()
    values["text/draft_head_token_ids"][3] = cfg.vocab_size
    w.write_tiny(tmp_path / "d.ninfer", cfg, canon, values=values, bf16=True)
    art = ninfer.load(tmp_path / "d.ninfer", upstream_config=cfg).artifact
    with pytest.raises(ValueError, match="draft head token ids"):
        art.verify_blobs()


def test_inspect_and_verify_give_the_verdict_serve_acts_on(tmp_path, monkeypatch, capsys) -> None:
    from ninfer import cli
    from ninfer.artifact import registry

    cfg = w.tiny_config(True)
    path = tmp_path / "up.ninfer"
    w.write_tiny(path, cfg, w.random_canonical(cfg, 2))
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "upstream v1" in out and "not servable" in out and "pinned qwen3.6-35b-a3b shape" in out
    assert cli.main(["verify", str(path)]) != 0
    assert "pinned qwen3.6-35b-a3b shape" in capsys.readouterr().err
    # with the tiny shape pinned, the same file binds: inspect lists every component, verify decodes everything
    ident = registry.MODELS["qwen3.6-35b-a3b"]
    monkeypatch.setitem(registry.MODELS, "qwen3.6-35b-a3b", replace(ident, config=cfg))
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "servable" in out and "not servable" not in out
    for group in ("text", "mtp", "draft_head", "vision", "dflash"):
        assert group in out
    assert cli.main(["inspect", "--json", str(path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["verdict"] == "servable" and len(info["groups"]["dflash"]) == 19
    assert cli.main(["verify", str(path)]) == 0
    assert "OK" in capsys.readouterr().out
    art = open_artifact(path, verify="manifest")
    assert art.shape_registered and art.model_id == "qwen3.6-35b-a3b"


@pytest.mark.parametrize("moe", [False, True])
def test_cuda_upload_plan_on_the_host(tmp_path, moe: bool) -> None:
    """What the CUDA loader does with a v1 file, on NumPy: every matrix's bytes as ``raw`` gives them, fused per
    ``cuda.fuse`` (widened, or as runs): each fused weight decodes to the reference's weights in fused row order."""
    from ninfer.cuda.fuse import FUSED, FusedRuns, fuse_projections
    from ninfer.cuda.upload import is_vector
    from ninfer.cuda.weights import DeviceWeight, plane_offsets

    cfg = w.tiny_config(moe)
    path = tmp_path / "up.ninfer"
    w.write_tiny(path, cfg, w.random_canonical(cfg, 5))
    art = ninfer.load(path, upstream_config=cfg).artifact
    tensors = {}
    for name, shape in expected_shapes(cfg, mtp=False).items():
        if not is_vector(name):
            info = art.tensor_info(name)
            raw = np.ascontiguousarray(art.raw(name))
            tensors[name] = DeviceWeight(
                info["format"], tuple(shape), raw, plane_offsets(info["format"], tuple(shape), raw)
            )
    fused = fuse_projections(cfg, tensors)
    kinds = set()
    for i in range(cfg.num_hidden_layers):
        for fname, parts in FUSED.items():
            key = f"layers.{i}.{fname}"
            if key not in fused:
                continue
            want = np.concatenate([art.tensor(f"layers.{i}.{p}").reshape(-1, cfg.hidden_size) for p in parts])
            wt = fused[key]
            runs = wt.runs if isinstance(wt, FusedRuns) else (wt,)
            got = np.concatenate([FORMATS[r.fmt].decode(r.data, r.shape) for r in runs])
            np.testing.assert_array_equal(got, want, err_msg=key)
            kinds.add((fname, tuple(r.fmt for r in runs)))
    if not moe:
        assert ("self_attn.qkvg_proj", ("Q5G64_F16S",)) in kinds
        assert ("linear_attn.in_proj", ("Q5G64_F16S", "BF16")) in kinds
        assert ("mlp.gate_up_proj", ("Q4G64_F16S",)) in kinds
    else:
        assert ("linear_attn.in_proj", ("W8G32_F16S", "BF16")) in kinds


def test_perf_v1_synthetic_files_are_valid(tmp_path) -> None:
    """perf/v1_synthetic.py's writers (at a tiny shape here): the v1 file binds and decodes to finite values, ours
    verifies, and both give the same canonical tensor formats where the profiles agree."""
    from perf.v1_synthetic import write_ours, write_v1_file

    cfg = w.tiny_config(False)
    write_v1_file(tmp_path / "v1.ninfer", 0, cfg, small=True)
    write_ours(tmp_path / "ours.ninfer", 0, cfg)
    up = ninfer.load(tmp_path / "v1.ninfer", upstream_config=cfg).artifact
    up.verify_blobs()
    ours = open_artifact(tmp_path / "ours.ninfer", verify="full")
    for name in ("embed_tokens.weight", "layers.0.mlp.down_proj.weight", "layers.3.self_attn.o_proj.weight"):
        assert up.tensor_info(name)["format"] == ours.tensor_info(name)["format"]
        assert np.isfinite(up.tensor(name)).all() and np.isfinite(ours.tensor(name)).all()


@pytest.mark.parametrize("moe", [False, True])
def test_v1_mtp_layer_feeds_the_mtp_head(tmp_path, moe: bool) -> None:
    """The MTP objects of a v1 file (its single [q; k; gate; v] attention parent, W8) drive the reference MTP head
    exactly as the checkpoint's MTP tensors would (BF16 file: every value exact)."""
    from ninfer.formats import bf16_round

    cfg = w.tiny_config(moe)
    canon = w.random_canonical(cfg, 8)
    path = tmp_path / "up.ninfer"
    w.write_tiny(path, cfg, canon, bf16=True)
    net = ninfer.load(path, upstream_config=cfg).net
    assert net.has_mtp
    want_w = {n: (x if n.endswith(("A_log", "dt_bias")) else bf16_round(x)) for n, x in canon.items()}
    ref = Qwen36(cfg, DictWeights(want_w))
    ids = np.arange(3, 20)
    h = net.forward(ids, net.new_state())
    np.testing.assert_array_equal(h, ref.forward(ids, ref.new_state()))
    got = net.mtp_forward(h[:-1], ids[1:], None, net.new_mtp_state())
    np.testing.assert_array_equal(got, ref.mtp_forward(h[:-1], ids[1:], None, ref.new_mtp_state()))
