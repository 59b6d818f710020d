"""Flash-Next through the artifact path: tiny transformers ``Qwen4ExpForCausalLM`` checkpoints -> ``ninfer convert``
-> ``ninfer.load`` -> logits and greedy tokens against transformers; the mixed profile's decode bounds; the
converter's checks; the registry entry.

The memory-map test (n-gram table read by rows, never loaded whole) is in test_flash_next_rss.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_tiny_flash import CASES, EOS, TOL, build_tiny, hf_greedy, hf_logits, hf_state, real_hf_config, rel_max

import ninfer
from ninfer.artifact import ArtifactError, open_artifact
from ninfer.artifact.registry import MODELS, architecture
from ninfer.convert import ConversionError, convert
from ninfer.flash_next import FlashNextConfig
from ninfer.flash_next.hf import canonical_from_hf
from ninfer.flash_next.names import ngram_table_name
from ninfer.flash_next.quant import PROFILE_MIXED, PROFILES, assignment, ngram_layout

pytest.importorskip("transformers")


class Converted:
    """A tiny checkpoint saved with save_pretrained, converted with the bf16 profile and loaded."""

    def __init__(self, name: str, seed: int, root: Path) -> None:
        self.hf_model, hf = build_tiny(seed, **CASES[name])
        self.hf_dir, self.out = root / "hf", root / "m.ninfer"
        self.hf_model.save_pretrained(self.hf_dir)
        self.manifest = convert(
            str(self.hf_dir), str(self.out), "bf16", allow_unregistered_shape=True, progress=False
        )
        self.model = ninfer.load(self.out)
        self.cfg = self.model.config
        self.selections = 0
        self.ties: list[tuple[int, int]] = []
        self.model.net.select_hook = self._hook

    def _hook(self, layer: int, pos: int, scores: np.ndarray, blocks: np.ndarray) -> None:
        self.selections += 1
        ranked = np.sort(scores)[::-1]
        if ranked[self.cfg.block_topk - 1] == ranked[self.cfg.block_topk]:
            self.ties.append((layer, pos))

    def check_no_ties(self) -> None:  # transformers' tie order among equal scores is undocumented
        assert not self.ties, f"QSA top-k ties at (layer, pos) {self.ties}: change the test prompt"


@pytest.fixture(scope="module")
def built() -> dict[str, Converted]:
    return {}  # one conversion per case, shared by the fixtures below


def _get(built: dict[str, Converted], name: str, tmp: pytest.TempPathFactory) -> Converted:
    if name not in built:
        built[name] = Converted(name, list(CASES).index(name), tmp.mktemp(name))
    return built[name]


@pytest.fixture(scope="module", params=list(CASES))
def conv(request: Any, built: dict[str, Converted], tmp_path_factory: pytest.TempPathFactory) -> Converted:
    return _get(built, request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def first(built: dict[str, Converted], tmp_path_factory: pytest.TempPathFactory) -> Converted:
    return _get(built, "e8k2-budget8", tmp_path_factory)


def _prompt(n: int, seed: int) -> list[int]:
    ids = np.random.default_rng(seed).integers(3, 256, n)
    ids[n // 3] = EOS  # n-grams must not cross it
    return ids.tolist()


def test_logits_match_transformers_in_chunks(conv: Converted) -> None:
    short = _prompt(conv.cfg.dense_max_visible - 1, 1)
    assert rel_max(conv.model.logits(short), hf_logits(conv.hf_model, np.array(short))) < TOL
    assert conv.selections == 0  # below the budget QSA is exactly dense
    long = _prompt(48, 2)
    ref = hf_logits(conv.hf_model, np.array(long))
    for chunk in (64, 13, 5):
        got = conv.model.logits(long, prefill_chunk=chunk)
        assert got.shape == ref.shape and got.dtype == np.float32
        conv.check_no_ties()
        assert rel_max(got, ref) < TOL, (chunk, rel_max(got, ref))
    assert conv.selections > 0, "the long prompt never exercised block selection"


def test_greedy_32_steps_match_transformers(conv: Converted) -> None:
    prompt = _prompt(20, 4)
    got = conv.model.generate(prompt, 32, greedy=True, stop_token_ids=[], prefill_chunk=7)
    conv.check_no_ties()
    assert got == hf_greedy(conv.hf_model, np.array(prompt), 32)


def test_artifact_identity_and_table_region(conv: Converted) -> None:
    m = conv.manifest
    assert (m["model_id"], m["architecture"], m["shape_registered"]) == (
        "qwen3.8-flash-next",
        "qwen4_exp",
        False,
    )
    table = ngram_table_name(conv.cfg.ple_layers[0])
    assert m["tensors"][-1]["name"] == table  # the host-rows region comes after every GPU tensor
    assert not any("layer_multipliers" in t["name"] or ".shard_" in t["name"] for t in m["tensors"])
    art = conv.model.artifact
    assert art.plan[table].host_rows and not art.plan["embed_tokens.weight"].host_rows
    want = canonical_from_hf(conv.cfg, hf_state(conv.hf_model))[table]  # the checkpoint's shards concatenated
    ids = np.random.default_rng(0).integers(0, want.shape[0], 300)
    np.testing.assert_array_equal(art.weights().get_rows(table, ids), want[ids])  # bf16-exact: lossless
    assert type(conv.model.net).__name__ == "FlashNext" and conv.cfg.arch == "qwen4_exp"


@pytest.fixture(scope="module")
def mixed(
    first: Converted, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """The first tiny checkpoint converted with the mixed profile, and its canonical float32 weights."""
    out = tmp_path_factory.mktemp("mixed") / "q.ninfer"
    convert(str(first.hf_dir), str(out), PROFILE_MIXED, allow_unregistered_shape=True, progress=False)
    return first.cfg, open_artifact(out), canonical_from_hf(first.cfg, hf_state(first.hf_model))


def test_mixed_profile_formats_and_decode_bounds(mixed: tuple[Any, Any, dict[str, np.ndarray]]) -> None:
    cfg, art, src = mixed
    fmts = {t["name"]: t["format"] for t in art.manifest["tensors"]}
    assert fmts == assignment(cfg, PROFILE_MIXED)
    assert fmts["layers.0.mlp.experts.gate_up_proj"] == "NVFP4G16_E4M3S"
    for name in ("layers.0.mlp.experts.gate_up_proj", "layers.3.mlp.experts.down_proj"):  # quant.py bounds
        x, w = src[name], art.tensor(name)
        amax = np.abs(x.reshape(-1, 16)).max(axis=1, keepdims=True)  # 16-value NVFP4 blocks
        err = np.abs(w - x).reshape(-1, 16)
        assert np.all(err <= (amax * (1 + 2**-4) / 6 + amax / 16) * (1 + 1e-6)), name
    x, w = src["lm_head.weight"], art.tensor("lm_head.weight")  # FP8 rows
    assert np.all(np.abs(w - x) <= 2**-4 * np.abs(x) + 2**-10 * np.abs(x).max(axis=1, keepdims=True) / 448)

    table = ngram_table_name(cfg.ple_layers[0])
    lay = ngram_layout(cfg, PROFILE_MIXED)
    assert fmts[table] == "Q4G64_F16S" and art.tensor_info(table)["shape"] == list(lay.stored_shape)
    x = src[table]
    ids = np.random.default_rng(1).integers(0, lay.rows, 500)
    rows = art.weights().get_rows(table, ids)
    np.testing.assert_array_equal(rows, art.tensor(table)[ids])  # row gather == whole decode
    groups = np.abs(x.reshape(lay.stored_shape[0], -1, 64)).max(axis=2)  # 64-groups along the packed rows
    amax = np.repeat(groups, 64, axis=1).reshape(x.shape)[ids]
    assert np.all(np.abs(rows - x[ids]) <= amax / 14 * (1 + 2**-10) + 1e-12)


def test_mixed_profile_runs(mixed: tuple[Any, Any, dict[str, np.ndarray]]) -> None:
    _, art, _ = mixed
    m = ninfer.load(art.path, verify="manifest")
    logits = m.logits(_prompt(30, 5), prefill_chunk=8)
    assert logits.shape == (30, 256) and np.isfinite(logits).all()


def test_converter_checks(first: Converted, tmp_path: Path) -> None:
    conv = first
    with pytest.raises(
        ConversionError, match="matches no registered model identity .closest: qwen3.8-flash-next"
    ):
        convert(str(conv.hf_dir), str(tmp_path / "x.ninfer"), "bf16", progress=False)
    with pytest.raises(
        ConversionError, match="weight profile 'nvfp4' is not registered for 'qwen3.8-flash-next'"
    ):
        convert(str(conv.hf_dir), str(tmp_path / "x.ninfer"), "nvfp4", allow_unregistered_shape=True)
    from safetensors.numpy import load_file, save_file

    def tampered(edit: Any) -> str:
        d = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        shutil.copy(conv.hf_dir / "config.json", d / "config.json")
        tensors = load_file(conv.hf_dir / "model.safetensors")
        edit(tensors)
        save_file(tensors, d / "model.safetensors")
        return str(d)

    mult = "model.layers.1.ple.ple_embedding.layer_multipliers"
    bad = tampered(lambda t: t.update({mult: t[mult] + 2}))
    with pytest.raises(ConversionError, match="layer_multipliers: holds"):
        convert(bad, str(tmp_path / "x.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    shard = "model.layers.1.ple.ple_embedding.ngram_embedding.shard_2.weight"
    bad = tampered(lambda t: t.pop(shard))
    with pytest.raises(ConversionError, match=r"n-gram shards \[0, 1, 3\] are not 0..2"):
        convert(bad, str(tmp_path / "x.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)
    bad = tampered(lambda t: t.pop("model.layers.2.mlp.experts.3.up_proj.weight"))
    with pytest.raises(ConversionError, match="expert 3 has no up_proj"):
        convert(bad, str(tmp_path / "x.ninfer"), "bf16", allow_unregistered_shape=True, progress=False)


def test_mtp_tensors_are_converted(first: Converted, tmp_path: Path) -> None:
    """transformers drops ``mtp.*`` on load; a real checkpoint carries them (fused experts) at the root."""
    from hf_tiny_flash import random_weights
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "hf-mtp"
    d.mkdir()
    hf = json.loads((first.hf_dir / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**hf, "mtp_num_hidden_layers": 1}))
    tensors = load_file(first.hf_dir / "model.safetensors")
    mtp = {k: v for k, v in random_weights(first.cfg, seed=9, mtp=True).items() if k.startswith("mtp.")}
    save_file({**tensors, **mtp}, d / "model.safetensors")
    out = tmp_path / "mtp.ninfer"
    convert(str(d), str(out), PROFILE_MIXED, allow_unregistered_shape=True, progress=False)
    m = ninfer.load(out)
    assert m.config.mtp_num_hidden_layers == 1 and m.net.has_mtp and len(mtp) == 31
    fmts = {t["name"]: t["format"] for t in m.artifact.manifest["tensors"]}
    assert {fmts[n] for n in mtp if len(mtp[n].shape) > 1} == {"FP8E4M3_F32ROW", "BF16"}
    x = mtp["mtp.fc_hidden.weight"]
    w = m.artifact.tensor("mtp.fc_hidden.weight")
    assert np.all(np.abs(w - x) <= 2**-4 * np.abs(x) + 2**-10 * np.abs(x).max(axis=1, keepdims=True) / 448)
    ids = _prompt(12, 6)
    h, streams = m.net.forward_streams(ids, m.net.new_state())
    assert np.isfinite(m.net.mtp_forward(streams[:-1], ids[1:], None, m.net.new_mtp_state())).all()


def test_reader_rejects_a_table_in_another_format(first: Converted, tmp_path: Path) -> None:
    from test_artifact import _rewrite_manifest

    conv, table = first, ngram_table_name(first.cfg.ple_layers[0])

    def edit(m: dict[str, Any]) -> None:
        next(t for t in m["tensors"] if t["name"] == table).update(format="FP32")

    with pytest.raises(
        ArtifactError, match=f"tensor '{table}': format FP32 but profile 'bf16' requires BF16"
    ):
        open_artifact(_rewrite_manifest(str(conv.out), tmp_path / "m.ninfer", edit), verify="manifest")


def test_registered_identity() -> None:
    ident = MODELS["qwen3.8-flash-next"]
    assert ident.arch == "qwen4_exp" and ident.profiles == PROFILES
    real = FlashNextConfig.from_hf(real_hf_config())
    assert real.to_dict() == ident.config.to_dict()  # the pinned config is the checkpoint's
    plan = architecture("qwen4_exp").plan(ident.config, PROFILE_MIXED)
    table = plan["layers.1.ple.ple_embedding.ngram_embedding.weight"]
    assert table.host_rows and table.shape == (80_000_384, 640) and table.logical == (320_001_536, 160)
    assert [n for n, p in plan.items() if p.host_rows] == [ngram_table_name(1)]
    assert json.loads(json.dumps(ident.config.to_dict())) == ident.config.to_dict()
