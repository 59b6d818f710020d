"""``ninfer convert``: a transformers checkpoint directory -> a verified .ninfer artifact.

Architecture-neutral: the HF ``model_type`` picks the registry's ``Architecture`` adapter, which gives the config
reader, the checkpoint reader (``Qwen36Checkpoint`` here, ``FlashNextCheckpoint`` in ``convert/flash_next.py``)
and the tensor plan. A checkpoint reader offers ``names()`` (canonical names it can produce), ``shape(name)``
(without reading data), ``get(name)`` (float32; a host-rows table may come back as a lazy ``RowSource``) and
``check()`` (derived tensors the checkpoint carries, compared with the config).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from tqdm import tqdm

from ninfer.artifact import ArtifactError, open_artifact, write_artifact
from ninfer.artifact.container import check_output_path
from ninfer.artifact.inventory import TensorPlan
from ninfer.artifact.registry import (
    MODELS,
    AnyConfig,
    RegistryError,
    architecture_for_hf,
    identity,
    identity_for_arch,
    matching_identities,
    shape_diff,
    tensor_plan,
)
from ninfer.artifact.rows import take_rows
from ninfer.config import ConfigError, ModelConfig
from ninfer.convert.flash_next import FlashNextCheckpoint
from ninfer.convert.safetensors_io import CheckpointError, SafetensorsDir
from ninfer.formats import FORMATS

__all__ = ["convert", "canonical_name", "ConversionError", "Qwen36Checkpoint"]

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


class Qwen36Checkpoint:
    """Canonical name -> how to load it from a Qwen3.5/3.6 checkpoint. transformers' save_pretrained writes MoE
    experts per expert (``experts.{e}.{gate,up,down}_proj.weight``); they are fused here into the canonical 3-D
    ``experts.gate_up_proj`` [E, 2I, H] (gate rows first) and ``experts.down_proj`` [E, H, I]."""

    def __init__(self, ckpt: SafetensorsDir, cfg: ModelConfig | None = None) -> None:
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

    def _expert_parts(self, c: str) -> list[list[str]]:
        prefix, kind = c.rsplit(".", 1)
        per = self.experts[prefix]
        if sorted(per) != list(range(len(per))):
            raise ConversionError(f"{prefix}: expert indices are not 0..{len(per) - 1}")
        parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
        try:
            return [[per[e][p] for p in parts] for e in range(len(per))]
        except KeyError as e:
            raise ConversionError(f"{prefix}: an expert lacks {e.args[0]}") from None

    def shape(self, c: str) -> tuple[int, ...]:
        if c in self.direct:
            return self.ckpt.shape(self.direct[c])
        return self.ckpt.stacked_shape(c, self._expert_parts(c))

    def get(self, c: str) -> np.ndarray:
        if c in self.direct:
            return self.ckpt.get(self.direct[c])
        return self.ckpt.stacked(self._expert_parts(c))

    def check(self) -> None:
        """Nothing derived to compare in a Qwen3.5/3.6 checkpoint."""


# each architecture's checkpoint reader: (SafetensorsDir, config) -> the converter's tensor source
CHECKPOINT_READERS: dict[str, Any] = {
    "qwen3_5": Qwen36Checkpoint,
    "qwen3_5_moe": Qwen36Checkpoint,
    "qwen4_exp": FlashNextCheckpoint,
}


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


def checkpoint_names(hf_dir: str, hf: dict[str, Any]) -> list[str]:
    """The names a checkpoint gives itself: ``_name_or_path`` / ``name_or_path`` of config.json and the model
    card's (README.md front matter) ``model_name`` and ``base_model`` entries."""
    names = [hf[k] for k in ("_name_or_path", "name_or_path") if isinstance(hf.get(k), str) and hf[k]]
    card = os.path.join(hf_dir, "README.md")
    if os.path.exists(card):
        with open(card, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        if lines and lines[0].strip() == "---":
            key = None
            for line in lines[1:]:
                if line.strip() == "---":
                    break
                m = re.match(r"^([A-Za-z_]+):\s*(.*)$", line)
                if m:
                    key, value = m.group(1), m.group(2).strip().strip("'\"")
                    if key in ("model_name", "base_model") and value:
                        names.append(value)
                elif key == "base_model" and line.strip().startswith("- "):
                    names.append(line.strip()[2:].strip().strip("'\""))
    return names


def _compact(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def named_identities(names: Sequence[str]) -> list[str]:
    """Registered identities the names designate: for each name (its last path part), the longest model id that
    starts it, compared without case or punctuation (``Qwen/Qwen3.8-27B-Instruct`` -> ``qwen3.8-27b``)."""
    found: list[str] = []
    for name in names:
        tail = _compact(name.rsplit("/", 1)[-1])
        hits = [m for m in MODELS if m != "ninfer-demo" and tail.startswith(_compact(m))]
        if hits:
            best = max(hits, key=len)
            if best not in found:
                found.append(best)
    return found


def _select_identity(
    cfg: AnyConfig, model_id: str | None, allow_unregistered: bool, names: Sequence[str] = ()
) -> tuple[str, bool]:
    """The identity to bind: ``model_id`` if given; else the one identity whose pinned shape matches ``cfg``,
    narrowed by the names the checkpoint gives itself when several share that shape (an error if that does not
    leave exactly one: never a silent first match)."""
    if model_id is not None:
        ident = identity(model_id)
        same = ident.arch == cfg.arch and not shape_diff(ident.config, cfg)
        if not same and not allow_unregistered:
            raise ConversionError(
                f"config does not match the pinned shape of {model_id!r}; "
                "pass --allow-unregistered-shape to convert a checkpoint of another size"
            )
        return model_id, same
    shaped = [m.model_id for m in matching_identities(cfg)]
    named = named_identities(names)
    if shaped:
        picked = [m for m in shaped if m in named] if named else shaped
        if len(picked) == 1:
            return picked[0], True
        why = (
            f"it names itself {', '.join(named)}, which its shape does not fit"
            if named and not picked
            else "the checkpoint does not say which"
        )
        raise ConversionError(
            f"the checkpoint's shape matches {', '.join(shaped)} and {why}; pass --model-id to choose"
        )
    same_arch = [n for n in named if identity(n).arch == cfg.arch]
    family = identity(same_arch[0]) if len(same_arch) == 1 else identity_for_arch(cfg.arch)
    if not allow_unregistered:
        raise ConversionError(
            f"config matches no registered model identity (closest: {family.model_id}, differs in "
            f"{', '.join(shape_diff(family.config, cfg))}); registered: {', '.join(MODELS)}. "
            "Pass --allow-unregistered-shape to convert a checkpoint of a registered architecture at another size"
        )
    return family.model_id, False


def _preflight(hf_dir: str, src: Any, plan: dict[str, TensorPlan]) -> None:
    """Every planned tensor comes from the checkpoint with its shape; nothing is left unmapped."""
    names = src.names()
    missing = [n for n in plan if n not in names]
    unmapped = sorted(c for c in names if c not in plan)
    if missing:
        raise ConversionError(f"{hf_dir}: checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    if unmapped:
        raise ConversionError(f"{hf_dir}: checkpoint has tensors ninfer does not map: {unmapped[:5]}")
    for n, p in plan.items():
        if src.shape(n) != p.logical:
            raise ConversionError(
                f"{n}: checkpoint shape {list(src.shape(n))}, config implies {list(p.logical)}"
            )


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
    check_output_path(out)  # before the checkpoint is read: a bad path is not found out after the conversion
    hf = _read_json(os.path.join(hf_dir, "config.json"))
    if hf is None:
        raise ConversionError(f"{hf_dir}: no config.json")
    res = _resources(hf_dir)
    gen = _read_json(os.path.join(hf_dir, "generation_config.json"))
    try:
        arch = architecture_for_hf(hf)
        cfg = arch.config_from_hf(hf, _eos_ids(hf, gen, res))
        src = CHECKPOINT_READERS[arch.name](SafetensorsDir(hf_dir), cfg)
        if not any(c.startswith("mtp.") for c in src.names()):
            cfg = replace(cfg, mtp_num_hidden_layers=0)
        names = checkpoint_names(hf_dir, hf)
        mid, registered = _select_identity(cfg, model_id, allow_unregistered_shape, names)
        plan = tensor_plan(mid, cfg, profile)
    except (ConfigError, CheckpointError) as e:
        raise ConversionError(f"{hf_dir}: {e}") from None
    except RegistryError as e:
        raise ConversionError(str(e)) from None
    try:
        _preflight(hf_dir, src, plan)
        src.check()
    except CheckpointError as e:
        raise ConversionError(f"{hf_dir}: {e}") from None

    bar = tqdm(total=len(plan), desc=f"convert {profile}", unit="tensor", disable=not progress)
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
    _verify_written(out, src, plan)
    return manifest


def _verify_written(out: str, src: Any, plan: dict[str, TensorPlan]) -> None:
    """Re-open with full hashing, and re-encode a sample of source tensors (and, of a host-rows table, sample
    stored rows: first, middle, last): their bytes must equal what was written."""
    art = open_artifact(out, verify="full")
    order = [n for n, p in plan.items() if not p.host_rows]
    sample = {order[0], order[-1], order[len(order) // 2], order[len(order) // 3]}
    for n in sorted(sample):
        p = plan[n]
        want = FORMATS[p.format].encode(np.asarray(src.get(n), np.float32).reshape(p.shape), p.shape)
        _same_bytes(out, n, art.raw(n), want)
    for n in (n for n, p in plan.items() if p.host_rows):
        p, table = plan[n], src.get(n)
        fmt = FORMATS[p.format]
        n_stored, k = p.shape
        pack = p.logical[0] // n_stored
        for r in sorted({0, n_stored // 2, n_stored - 1}):
            x = np.asarray(table[r * pack : (r + 1) * pack], np.float32).reshape(1, k)
            _same_bytes(out, n, take_rows(fmt, art.raw(n), p.shape, np.array([r])), fmt.encode(x, (1, k)))


def _same_bytes(out: str, name: str, got: np.ndarray, want: bytes | np.ndarray) -> None:
    want = np.frombuffer(want, np.uint8) if isinstance(want, bytes) else np.asarray(want).view(np.uint8)
    if not np.array_equal(np.asarray(got).reshape(-1), want.reshape(-1)):
        raise ArtifactError(f"{out}: verification failed: tensor {name!r} differs from its source")
