"""``ninfer convert``: a transformers checkpoint directory -> a verified .ninfer artifact."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from typing import Any

import numpy as np
from tqdm import tqdm

from ninfer.artifact import ArtifactError, open_artifact, write_artifact
from ninfer.artifact.inventory import expected_inventory
from ninfer.artifact.registry import MODELS, identity, identity_for_arch, match_identity
from ninfer.config import ConfigError, ModelConfig
from ninfer.convert.safetensors_io import CheckpointError, SafetensorsDir
from ninfer.formats import FORMATS

__all__ = ["convert", "canonical_name", "ConversionError"]

_PREFIXES = ("model.language_model.", "model.")
_IGNORED_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.")


class ConversionError(ValueError):
    """A checkpoint that cannot be converted as asked; the message says why."""


def canonical_name(hf_name: str) -> str | None:
    """HF tensor name -> canonical artifact name, or None for tensors ninfer does not serve (vision)."""
    if hf_name.startswith(_IGNORED_PREFIXES):
        return None
    for p in _PREFIXES:
        if hf_name.startswith(p):
            return hf_name[len(p) :]
    return hf_name  # lm_head.weight, mtp.*


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class _Sources:
    """Canonical name -> how to load it from the checkpoint. transformers' save_pretrained writes MoE experts
    per expert (``experts.{e}.{gate,up,down}_proj.weight``); they are fused here into the canonical 3-D
    ``experts.gate_up_proj`` [E, 2I, H] (gate rows first) and ``experts.down_proj`` [E, H, I]."""

    def __init__(self, ckpt: SafetensorsDir) -> None:
        self.ckpt = ckpt
        self.direct: dict[str, str] = {}
        self.experts: dict[str, dict[int, dict[str, str]]] = {}
        for n in ckpt.names():
            c = canonical_name(n)
            if c is None:
                continue
            m = _EXPERT.match(c)
            if m:
                self.experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = n
            else:
                self.direct[c] = n

    def names(self) -> set[str]:
        fused = {f"{p}.{s}" for p in self.experts for s in ("gate_up_proj", "down_proj")}
        return set(self.direct) | fused

    def _expert_parts(self, c: str) -> tuple[list[list[str]], str]:
        prefix, kind = c.rsplit(".", 1)
        per = self.experts[prefix]
        if sorted(per) != list(range(len(per))):
            raise ConversionError(f"{prefix}: expert indices are not 0..{len(per) - 1}")
        parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
        try:
            return [[per[e][p] for p in parts] for e in range(len(per))], kind
        except KeyError as e:
            raise ConversionError(f"{prefix}: an expert lacks {e.args[0]}") from None

    def shape(self, c: str) -> tuple[int, ...]:
        if c in self.direct:
            return self.ckpt.shape(self.direct[c])
        rows, _ = self._expert_parts(c)
        shapes = [[self.ckpt.shape(n) for n in r] for r in rows]
        first = shapes[0]
        if any(s != first for s in shapes):
            raise ConversionError(f"{c}: experts differ in shape")
        return (len(rows), sum(s[0] for s in first), first[0][1])

    def get(self, c: str) -> np.ndarray:
        if c in self.direct:
            return self.ckpt.get(self.direct[c])
        rows, _ = self._expert_parts(c)
        return np.stack([np.concatenate([self.ckpt.get(n) for n in r], axis=0) for r in rows])


def _read_json(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: cannot read JSON: {e}") from None


def _resources(hf_dir: str) -> dict[str, bytes]:
    res: dict[str, bytes] = {}
    for role, fn in (
        ("tokenizer", "tokenizer.json"),
        ("tokenizer_config", "tokenizer_config.json"),
        ("generation_config", "generation_config.json"),
        ("chat_template", "chat_template.jinja"),
    ):
        p = os.path.join(hf_dir, fn)
        if os.path.exists(p):
            with open(p, "rb") as f:
                res[role] = f.read()
    if "chat_template" not in res and "tokenizer_config" in res:
        tpl = json.loads(res["tokenizer_config"]).get("chat_template")
        if isinstance(tpl, str):
            res["chat_template"] = tpl.encode()
    return res


def _eos_ids(hf: dict[str, Any], gen: dict[str, Any] | None, res: dict[str, bytes]) -> tuple[int, ...]:
    for src in (gen or {}, hf, hf.get("text_config", {})):
        eos = src.get("eos_token_id")
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (int(eos),)
    if "tokenizer" in res:
        added = json.loads(res["tokenizer"]).get("added_tokens", [])
        ids = {t["content"]: t["id"] for t in added}
        return tuple(ids[t] for t in ("<|im_end|>", "<|endoftext|>") if t in ids)
    return ()


def _select_identity(cfg: ModelConfig, model_id: str | None, allow_unregistered: bool) -> tuple[str, bool]:
    if model_id is not None:
        ident = identity(model_id)
        same = match_identity(cfg) is not None and match_identity(cfg).config == ident.config
        if not same and not allow_unregistered:
            raise ConversionError(
                f"config does not match the pinned shape of {model_id!r}; "
                "pass --allow-unregistered-shape to convert a checkpoint of another size"
            )
        return model_id, same
    ident = match_identity(cfg)
    if ident is not None:
        return ident.model_id, True
    if not allow_unregistered:
        family = identity_for_arch(cfg.arch)
        diff = [k for k, v in family.config.to_dict().items() if cfg.to_dict().get(k) != v]
        diff = [k for k in diff if k not in ("eos_token_ids", "mtp_num_hidden_layers")]
        raise ConversionError(
            f"config matches no registered model identity (closest: {family.model_id}, differs in "
            f"{', '.join(diff)}); registered: {', '.join(MODELS)}. "
            "Pass --allow-unregistered-shape to convert a checkpoint of a registered architecture at another size"
        )
    return identity_for_arch(cfg.arch).model_id, False


def convert(
    hf_dir: str,
    out: str,
    profile: str = "bf16",
    *,
    allow_unregistered_shape: bool = False,
    model_id: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Convert ``hf_dir`` into ``out`` with ``profile``, verify what was written, return the manifest."""
    hf = _read_json(os.path.join(hf_dir, "config.json"))
    if hf is None:
        raise ConversionError(f"{hf_dir}: no config.json")
    try:
        cfg = ModelConfig.from_hf(hf)
        ckpt = SafetensorsDir(hf_dir)
    except (ConfigError, CheckpointError) as e:
        raise ConversionError(f"{hf_dir}: {e}") from None
    src = _Sources(ckpt)
    names = src.names()
    has_mtp = any(c.startswith("mtp.") for c in names)
    res = _resources(hf_dir)
    gen = _read_json(os.path.join(hf_dir, "generation_config.json"))
    cfg = replace(cfg, mtp_num_hidden_layers=cfg.mtp_num_hidden_layers if has_mtp else 0)
    cfg = replace(cfg, eos_token_ids=_eos_ids(hf, gen, res))
    mid, registered = _select_identity(cfg, model_id, allow_unregistered_shape)

    inv = expected_inventory(cfg)
    missing = [n for n in inv if n not in names]
    unmapped = sorted(c for c in names if c not in inv)
    if missing:
        raise ConversionError(f"{hf_dir}: checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    if unmapped:
        raise ConversionError(f"{hf_dir}: checkpoint has tensors ninfer does not map: {unmapped[:5]}")
    for n, shape in inv.items():
        if src.shape(n) != shape:
            raise ConversionError(f"{n}: checkpoint shape {list(src.shape(n))}, config implies {list(shape)}")

    bar = tqdm(total=len(inv), desc=f"convert {profile}", unit="tensor", disable=not progress)
    manifest = write_artifact(
        out,
        model_id=mid,
        weight_profile=profile,
        config=cfg,
        shape_registered=registered,
        load_tensor=src.get,
        resources=res,
        source=[dict(path=os.path.abspath(hf_dir), model_type=hf.get("model_type", ""))],
        provenance=dict(tool="ninfer convert", profile=profile),
        progress=lambda _n: bar.update(1),
    )
    bar.close()
    _verify_written(out, src, inv)
    return manifest


def _verify_written(out: str, src: _Sources, inv: dict[str, Any]) -> None:
    """Re-open with full hashing, and re-encode a sample of source tensors: their bytes must be identical."""
    art = open_artifact(out, verify="full")
    order = list(inv)
    sample = {order[0], order[-1], order[len(order) // 2], order[len(order) // 3]}
    for n in sorted(sample):
        t = art.tensor_info(n)
        want = FORMATS[t["format"]].encode(src.get(n).astype(np.float32), tuple(t["shape"]))
        want = np.frombuffer(want, np.uint8) if isinstance(want, bytes) else np.asarray(want).view(np.uint8)
        if not np.array_equal(np.asarray(art.raw(n)), want.ravel()):
            raise ArtifactError(f"{out}: verification failed: tensor {n!r} differs from its source")
