"""Model identities: a checkpoint binds the identity its own metadata or ``--model-id`` names; several identities
sharing one shape (Qwen3.6-27B, Qwen3.8-27B, its OrcaRouter variant) without a name are an error, never a guess."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ninfer.artifact.pinned import QWEN36_27B, QWEN36_35B_A3B
from ninfer.artifact.registry import RegistryError, profile_format, tensor_plan
from ninfer.convert.hf import ConversionError, _select_identity, checkpoint_names, named_identities


@pytest.mark.parametrize(
    "names,want",
    [
        (["Qwen/Qwen3.8-27B"], "qwen3.8-27b"),
        (["/data/ckpt/Qwen3.8-27B-Instruct"], "qwen3.8-27b"),
        (["Qwen/Qwen3.6-27B"], "qwen3.6-27b"),
        (["acme/Qwen3.8-27B-OrcaRouter-NVFP4"], "qwen3.8-27b-orcarouter"),
        (["qwen3_8_27b"], "qwen3.8-27b"),
    ],
)
def test_the_checkpoints_own_name_picks_among_one_shape(names: list[str], want: str) -> None:
    assert _select_identity(QWEN36_27B, None, False, names) == (want, True)


def test_several_matching_identities_without_a_name_are_an_error() -> None:
    with pytest.raises(
        ConversionError, match="matches qwen3.6-27b, qwen3.8-27b, qwen3.8-27b-orcarouter.*--model-id"
    ):
        _select_identity(QWEN36_27B, None, False, [])
    with pytest.raises(ConversionError, match="names itself qwen3.6-35b-a3b, which its shape does not fit"):
        _select_identity(QWEN36_27B, None, False, ["Qwen/Qwen3.6-35B-A3B"])
    assert _select_identity(QWEN36_27B, "qwen3.8-27b", False, ["Qwen/Qwen3.6-27B"]) == ("qwen3.8-27b", True)
    assert _select_identity(QWEN36_35B_A3B, None, False, []) == (
        "qwen3.6-35b-a3b",
        True,
    )  # one identity: no name needed


def test_unregistered_shape_takes_the_named_identity() -> None:
    small = replace(QWEN36_27B, hidden_size=64)
    assert _select_identity(small, None, True, ["Qwen/Qwen3.8-27B"]) == ("qwen3.8-27b", False)
    assert _select_identity(small, None, True, []) == ("qwen3.6-27b", False)
    with pytest.raises(ConversionError, match="matches no registered model identity"):
        _select_identity(small, None, False, ["Qwen/Qwen3.8-27B"])


def test_checkpoint_names_come_from_config_and_model_card(tmp_path) -> None:
    (tmp_path / "README.md").write_text(
        "---\nlicense: apache-2.0\nbase_model:\n- Qwen/Qwen3.8-27B\nmodel_name: 'OrcaRouter'\n---\n# Title\n"
    )
    names = checkpoint_names(str(tmp_path), {"_name_or_path": "/x/Qwen3.8-27B-OrcaRouter"})
    assert names == ["/x/Qwen3.8-27B-OrcaRouter", "Qwen/Qwen3.8-27B", "OrcaRouter"]
    assert named_identities(names) == ["qwen3.8-27b-orcarouter", "qwen3.8-27b"]


def test_orcarouter_profile_keeps_embeddings_and_head_bf16() -> None:
    prof = "nvfp4-bf16-embeddings"
    assert profile_format(prof, "embed_tokens.weight", (10, 64)) == "BF16"
    assert profile_format(prof, "lm_head.weight", (10, 64)) == "BF16"
    assert profile_format(prof, "layers.0.mlp.down_proj.weight", (64, 128)) == "NVFP4G16_E4M3S"
    assert profile_format(prof, "layers.0.input_layernorm.weight", (64,)) == "BF16"
    plan = tensor_plan("qwen3.8-27b-orcarouter", QWEN36_27B, prof)
    assert (
        plan["lm_head.weight"].format == "BF16"
        and plan["layers.0.mlp.up_proj.weight"].format == "NVFP4G16_E4M3S"
    )
    with pytest.raises(RegistryError, match="'nvfp4' is not registered for 'qwen3.8-27b-orcarouter'"):
        tensor_plan("qwen3.8-27b-orcarouter", QWEN36_27B, "nvfp4")


def test_convert_binds_the_name_in_the_model_card(tmp_path) -> None:
    pytest.importorskip("torch")
    from hf_tiny import save_tiny_hf

    from ninfer.convert import convert

    save_tiny_hf(tmp_path / "hf", "dense", 0)
    (tmp_path / "hf" / "README.md").write_text("---\nbase_model: Qwen/Qwen3.8-27B\n---\n")
    m = convert(
        str(tmp_path / "hf"),
        str(tmp_path / "x.ninfer"),
        "groupwise-int",
        allow_unregistered_shape=True,
        progress=False,
    )
    assert m["model_id"] == "qwen3.8-27b" and m["shape_registered"] is False
