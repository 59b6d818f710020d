"""Assemble canonical float32 tensors from an HF qwen4_exp state dict (or safetensors tensors), fully checked.

This is the in-memory counterpart of what a converter does with ``names.map_hf_name``: shards concatenated into
the n-gram table, per-expert tensors fused, derived buffers verified and dropped, vision/extras ignored, every
expected tensor present with its expected shape and nothing unknown left over.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np

from ninfer.flash_next.config import FlashNextConfig
from ninfer.flash_next.names import expected_buffer, expected_shapes, map_hf_name
from ninfer.reference.weights import WeightError

__all__ = ["canonical_from_hf"]


def _fuse_experts(name: str, parts: dict[tuple[int, str], np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    n_exp = shape[0]
    out = []
    for e in range(n_exp):
        want = ("down",) if name.endswith("down_proj") else ("gate", "up")
        missing = [p for p in want if (e, p) not in parts]
        if missing:
            raise WeightError(f"{name}: expert {e} {missing[0]}_proj is missing")
        out.append(np.concatenate([parts[(e, p)] for p in want], axis=0))
    return np.stack(out)


def canonical_from_hf(
    cfg: FlashNextConfig, tensors: Mapping[str, np.ndarray], *, mtp: bool | None = None
) -> dict[str, np.ndarray]:
    """Canonical name -> float32 array for every tensor of ``expected_shapes(cfg, mtp=mtp)``."""
    shapes = expected_shapes(cfg, mtp=mtp)
    with_mtp = "mtp.fc_hidden.weight" in shapes
    out: dict[str, np.ndarray] = {}
    shards: dict[str, dict[int, np.ndarray]] = defaultdict(dict)
    experts: dict[str, dict[tuple[int, str], np.ndarray]] = defaultdict(dict)
    for hf_name, arr in tensors.items():
        ref = map_hf_name(hf_name)
        if ref is None or (ref.canonical.startswith("mtp.") and not with_mtp):
            continue  # ignored, or MTP tensors of a checkpoint read without its MTP head
        a = np.asarray(arr)
        if ref.kind == "verify_buffer":
            want = expected_buffer(cfg, ref.canonical)
            if not np.array_equal(a.astype(np.int64), want):
                raise WeightError(f"{hf_name}: holds {a.tolist()}, the config implies {want.tolist()}")
        elif ref.kind == "ngram_shard":
            shards[ref.canonical][ref.shard] = a  # type: ignore[index]
        elif ref.kind == "expert_part":
            experts[ref.canonical][(ref.expert, ref.part)] = a  # type: ignore[index]
        elif ref.canonical not in shapes:
            raise WeightError(f"{hf_name}: not a tensor of this qwen4_exp configuration")
        else:
            out[ref.canonical] = a
    for name, parts in shards.items():
        order = sorted(parts)
        if order != list(range(len(order))):
            raise WeightError(f"{name}: n-gram shards {order} are not 0..{len(order) - 1}")
        out[name] = np.concatenate([parts[k] for k in order], axis=0)
    for name, parts in experts.items():
        if name not in shapes:
            raise WeightError(f"{name}: not a tensor of this qwen4_exp configuration")
        out[name] = _fuse_experts(name, parts, shapes[name])
    for name, shape in shapes.items():
        if name not in out:
            raise WeightError(f"{name}: missing from the checkpoint")
        if tuple(out[name].shape) != shape:
            raise WeightError(f"{name}: shape {list(out[name].shape)}, expected {list(shape)}")
        out[name] = np.ascontiguousarray(out[name], dtype=np.float32)
    return out
