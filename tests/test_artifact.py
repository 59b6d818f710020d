"""The .ninfer container: round trip, registry binding, and clear rejection of damaged or foreign files."""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import replace

import numpy as np
import pytest

from ninfer import cli
from ninfer.artifact import ArtifactError, open_artifact, write_artifact
from ninfer.artifact.container import HEADER_BYTES
from ninfer.artifact.registry import MODELS, RegistryError, profile_format
from ninfer.demo import random_weights

CFG = replace(MODELS["ninfer-demo"].config, eos_token_ids=(1, 2))


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return random_weights(CFG, seed=3)


def _write(path: str, weights: dict[str, np.ndarray], profile: str = "bf16", **kw: object) -> dict:
    args = dict(
        model_id="ninfer-demo",
        weight_profile=profile,
        config=CFG,
        shape_registered=True,
        load_tensor=weights.__getitem__,
        resources={"chat_template": b"{{ messages }}", "generation_config": b'{"temperature": 0.5}'},
    )
    args.update(kw)
    return write_artifact(path, **args)


@pytest.fixture(scope="module")
def art_path(tmp_path_factory: pytest.TempPathFactory, weights: dict[str, np.ndarray]) -> str:
    p = str(tmp_path_factory.mktemp("art") / "demo.ninfer")
    _write(p, weights)
    return p


def test_round_trip_bf16(art_path: str, weights: dict[str, np.ndarray]) -> None:
    art = open_artifact(art_path)
    assert art.model_id == "ninfer-demo" and art.weight_profile == "bf16" and art.shape_registered
    assert art.model_config == CFG
    for name, x in weights.items():
        got = art.tensor(name)
        assert got.shape == x.shape and got.dtype == np.float32
        fmt = art.tensor_info(name)["format"]
        if fmt == "FP32":
            np.testing.assert_array_equal(got, x)
        else:  # bf16 keeps 8 mantissa bits: relative error <= 2^-9
            np.testing.assert_allclose(got, x, rtol=2.0**-8, atol=0)
    assert art.resource("chat_template") == b"{{ messages }}"
    assert art.resource("tokenizer") is None


def test_blobs_aligned_and_end_at_eof(art_path: str) -> None:
    art = open_artifact(art_path, verify="manifest")
    entries = art.manifest["tensors"] + art.manifest["resources"]
    assert all(e["offset"] % 256 == 0 for e in entries)
    with open(art_path, "rb") as f:
        _, _, _, _, _, doff, dbytes = struct.unpack("<8sIIQQQQ", f.read(48))
    assert doff % 4096 == 0 and doff + dbytes == os.path.getsize(art_path)
    assert entries[-1]["offset"] + entries[-1]["nbytes"] == dbytes
    # readable with a plain memmap
    t = art.tensor_info("norm.weight")
    mm = np.memmap(art_path, dtype="<u2", mode="r", offset=doff + t["offset"], shape=tuple(t["shape"]))
    np.testing.assert_array_equal((mm.astype(np.uint32) << 16).view(np.float32), art.tensor("norm.weight"))


@pytest.mark.parametrize("profile", ["nvfp4", "groupwise-int", "fp8"])
def test_quantized_profiles_round_trip(tmp_path, weights, profile: str) -> None:
    p = str(tmp_path / f"{profile}.ninfer")
    _write(p, weights, profile=profile)
    art = open_artifact(p)
    name = "layers.0.linear_attn.in_proj_qkv.weight"
    assert art.tensor_info(name)["format"] == profile_format(profile, name, weights[name].shape)
    got, x = art.tensor(name), weights[name]
    rel = np.abs(got - x).max() / np.abs(x).max()
    assert 0 < rel < 0.2  # quantized, but close; tight per-format bounds live in test_formats.py
    np.testing.assert_array_equal(
        art.tensor("layers.0.input_layernorm.weight"), art.tensor("layers.0.input_layernorm.weight")
    )


def _copy(src: str, dst) -> str:
    shutil.copy(src, dst)
    return str(dst)


def test_corrupt_byte_in_every_blob_is_named(art_path: str, tmp_path) -> None:
    art = open_artifact(art_path, verify="manifest")
    doff = art._data.offset
    entries = art.manifest["tensors"] + art.manifest["resources"]
    rng = np.random.default_rng(0)
    for e in entries[:: max(1, len(entries) // 12)] + [entries[-1]]:
        p = _copy(art_path, tmp_path / "c.ninfer")
        pos = doff + e["offset"] + int(rng.integers(e["nbytes"]))
        with open(p, "r+b") as f:
            f.seek(pos)
            b = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([b ^ 0x40]))
        with pytest.raises(ArtifactError, match=f"blob '{e['name']}' is corrupt"):
            open_artifact(p)


def test_truncated_file(art_path: str, tmp_path) -> None:
    p = _copy(art_path, tmp_path / "t.ninfer")
    os.truncate(p, os.path.getsize(p) - 1000)
    with pytest.raises(ArtifactError, match="truncated"):
        open_artifact(p)
    os.truncate(p, 100)
    with pytest.raises(ArtifactError, match="shorter than the 128-byte header"):
        open_artifact(p)


def _rewrite_manifest(src: str, dst, edit) -> str:
    """Re-encode the manifest after ``edit`` with a valid header, so only the semantic checks can object."""
    import hashlib

    with open(src, "rb") as f:
        data = f.read()
    magic, hb, fl, mo, mb, doff, db = struct.unpack("<8sIIQQQQ", data[:48])
    m = json.loads(data[HEADER_BYTES : HEADER_BYTES + mb])
    edit(m)
    mbytes = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    assert HEADER_BYTES + len(mbytes) <= doff, "edited manifest must fit before the data region"
    mbytes += b" " * (mb - len(mbytes))  # keep the original length so data_offset stays consistent
    header = struct.pack(
        "<8sIIQQQQ32s48s",
        magic,
        hb,
        fl,
        mo,
        len(mbytes),
        doff,
        db,
        hashlib.sha256(mbytes).digest(),
        b"\0" * 48,
    )
    out = header + mbytes + b"\0" * (doff - HEADER_BYTES - len(mbytes)) + data[doff:]
    with open(dst, "wb") as f:
        f.write(out)
    return str(dst)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(model_id="qwen9-1t"), "model identity 'qwen9-1t' is not registered"),
        (
            lambda m: m.update(model_id="qwen3.6-27b"),
            "config differs from the pinned config of 'qwen3.6-27b'",
        ),
        (lambda m: m.update(weight_profile="int2"), "weight profile 'int2' is not registered"),
        (
            lambda m: m.update(weight_profile="nvfp4"),
            "format BF16 but profile 'nvfp4' requires NVFP4G16_E4M3S",
        ),
        (
            lambda m: m["config"].update(hidden_size=256),
            "config differs from the pinned config of 'ninfer-demo'",
        ),
        (lambda m: m["config"].update(mystery_field=1), "mystery_field: unknown config field"),
        (lambda m: m["config"].update(arch="llama"), "arch: unsupported architecture 'llama'"),
        (lambda m: m.update(extra=1), r"unknown members \['extra'\]"),
        (lambda m: m["tensors"][0].update(shape=[7, 7]), "shape \\[7, 7\\] but the config implies"),
        (lambda m: m["tensors"].pop(3), "tensor inventory: missing"),
    ],
)
def test_identity_profile_and_config_changes_are_rejected(art_path, tmp_path, edit, message) -> None:
    p = _rewrite_manifest(art_path, tmp_path / "m.ninfer", edit)
    with pytest.raises(ArtifactError, match=message):
        open_artifact(p, verify="manifest")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(digest=None), "digest must be"),
        (lambda m: m.update(model_id=["ninfer-demo"]), "model_id must be a string"),
        (lambda m: m["tensors"][0].update(name=[]), "name must be a string"),
        (lambda m: m["resources"][0].update(role={}), "role must be a string"),
        (lambda m: m["config"].update(mtp_num_hidden_layers=None), "mtp_num_hidden_layers: expected int"),
        (lambda m: m["config"].update(layer_types=None), "layer_types: expected a list"),
        (lambda m: m["config"].update(rope_theta="x"), "rope_theta: expected float"),
    ],
)
def test_manifest_values_of_the_wrong_type_are_artifact_errors(art_path, tmp_path, edit, message) -> None:
    """A hash-consistent manifest with a value of the wrong type is an ArtifactError naming it, never a
    TypeError from deep inside (``ninfer inspect`` would print a traceback)."""
    p = _rewrite_manifest(art_path, tmp_path / "t.ninfer", edit)
    with pytest.raises(ArtifactError, match=message):
        open_artifact(p, verify="manifest")


def test_manifest_tamper_without_rehash_is_caught(art_path, tmp_path) -> None:
    p = _copy(art_path, tmp_path / "h.ninfer")
    with open(p, "r+b") as f:
        f.seek(HEADER_BYTES + 20)
        f.write(b"X")
    with pytest.raises(ArtifactError, match="manifest is corrupt"):
        open_artifact(p)


def test_not_an_artifact(tmp_path) -> None:
    p = tmp_path / "x.ninfer"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 300)
    with pytest.raises(ArtifactError, match="not a .ninfer artifact"):
        open_artifact(str(p))
    with pytest.raises(ArtifactError, match="cannot open"):
        open_artifact(str(tmp_path / "missing.ninfer"))


def test_writer_rejects_unregistered_profile_and_bad_source(tmp_path, weights) -> None:
    with pytest.raises(ArtifactError, match="not registered for 'ninfer-demo'"):
        _write(str(tmp_path / "a.ninfer"), weights, profile="mixed")
    bad = dict(weights)
    bad["norm.weight"] = np.full_like(bad["norm.weight"], np.nan)
    with pytest.raises(ArtifactError, match="'norm.weight': source has non-finite"):
        _write(str(tmp_path / "b.ninfer"), bad)
    with pytest.raises(RegistryError, match="config differs"):
        _write(str(tmp_path / "c.ninfer"), weights, config=replace(CFG, hidden_size=64))


def test_a_failed_write_leaves_no_partial_file(tmp_path, weights) -> None:
    """A source, encoder or Ctrl-C failure mid-write removes ``OUT.partial``; an artifact already at ``OUT`` is
    kept as it was."""
    bad = dict(weights)
    bad["norm.weight"] = np.full_like(bad["norm.weight"], np.nan)
    with pytest.raises(ArtifactError, match="non-finite"):
        _write(str(tmp_path / "b.ninfer"), bad)
    assert os.listdir(tmp_path) == []

    def interrupted(name: str) -> np.ndarray:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _write(str(tmp_path / "c.ninfer"), weights, load_tensor=interrupted)
    assert os.listdir(tmp_path) == []
    good = str(tmp_path / "good.ninfer")
    digest = _write(good, weights)["digest"]["content"]
    with pytest.raises(ArtifactError):
        _write(good, bad)
    assert (
        os.listdir(tmp_path) == ["good.ninfer"]
        and open_artifact(good).manifest["digest"]["content"] == digest
    )


def test_an_output_path_that_cannot_be_the_file_is_refused_first(tmp_path, weights, capsys) -> None:
    """An existing directory (or a missing parent) is refused before any tensor is loaded; ``ninfer demo`` and
    ``ninfer convert`` say so in one line (convert before it reads the checkpoint)."""
    out = tmp_path / "out"
    out.mkdir()
    loaded: list[str] = []

    def load(name: str) -> np.ndarray:
        loaded.append(name)
        return weights[name]

    with pytest.raises(ArtifactError, match="is a directory; give the artifact's file path"):
        _write(str(out), weights, load_tensor=load)
    with pytest.raises(ArtifactError, match="does not exist"):
        _write(str(tmp_path / "missing" / "a.ninfer"), weights, load_tensor=load)
    assert not loaded and os.listdir(out) == [] and sorted(os.listdir(tmp_path)) == ["out"]
    for argv in (["demo", "-o", str(out)], ["convert", str(tmp_path / "no-checkpoint"), "-o", str(out)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"{out}: is a directory" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_cli_inspect_and_verify(art_path, tmp_path, capsys) -> None:
    assert cli.main(["inspect", art_path]) == 0
    out = capsys.readouterr().out
    assert "ninfer-demo" in out and "bf16" in out and "BF16" in out
    assert cli.main(["inspect", art_path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_id"] == "ninfer-demo"
    assert cli.main(["verify", art_path]) == 0
    assert capsys.readouterr().out.startswith("OK ")
    p = _copy(art_path, tmp_path / "v.ninfer")
    os.truncate(p, os.path.getsize(p) - 1)
    assert cli.main(["verify", p]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
