"""A writer of upstream v1 files that follows upstream's converter byte for byte (docs/upstream-v1.md): for tests
and benchmarks only (ninfer serves v1 files; it converts into its own container).

``v1_inventory(cfg, ...)`` lists ``(name, shape, format)`` in upstream's write order with upstream's per-role
formats (a dense config takes the 27B recipe, an MoE config the 35B one); ``write_v1`` frames them: six resources
first and back to back, tensors 256-aligned, the compact JSON directory (``ensure_ascii=False``, no spaces,
members in upstream's order), zero fill to the 4096-aligned payload, payloads streamed one object at a time with
zero gaps, and the file ends exactly at the last object.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ninfer.artifact.v1_container import MAGIC_V1, PAYLOAD_ALIGN
from ninfer.config import ModelConfig
from ninfer.formats import FORMATS, align_up

__all__ = ["V1Tensor", "VisionShape", "DFlashShape", "v1_inventory", "write_v1", "RESOURCE_NAMES"]

RESOURCE_NAMES = (
    "frontend/tokenizer.json",
    "frontend/tokenizer_config.json",
    "frontend/chat_template.jinja",
    "frontend/generation_config.json",
    "frontend/preprocessor_config.json",
    "frontend/video_preprocessor_config.json",
)
Q4, Q5, Q6, W8 = "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"


@dataclass(frozen=True, slots=True)
class V1Tensor:
    name: str
    shape: tuple[int, ...]
    format: str


@dataclass(frozen=True, slots=True)
class VisionShape:
    """The vision tower's own sizes (real: 1152 wide, 4304 MLP, 27 blocks, 2304 positions, 1536 patch inputs)."""

    hidden: int = 32
    mlp: int = 48
    depth: int = 2
    positions: int = 16
    patch: int = 1536


@dataclass(frozen=True, slots=True)
class DFlashShape:
    """The DFlash drafter's sizes (real 35B-A3B drafter: 6 layers, 8 feature layers, 32 x 128 query / 8 kv heads,
    MLP 6144)."""

    layers: int = 2
    features: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    mlp: int = 96


def _layer(cfg: ModelConfig, p: str, full: bool, moe_fmts: tuple[str, str, str], mtp: bool) -> list[V1Tensor]:
    h, d, big = cfg.hidden_size, cfg.head_dim, not cfg.is_moe
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = [V1Tensor(p + "input_norm", (h,), "BF16")]
    if full:
        a = p + "attention/"
        if big and not mtp:
            out += [V1Tensor(a + "query_key", (q + kv, h), Q4), V1Tensor(a + "gate_value", (q + kv, h), Q5)]
        else:
            out.append(V1Tensor(a + "query_key_gate_value", (2 * q + 2 * kv, h), W8))
        out += [V1Tensor(a + "query_norm", (d,), "BF16"), V1Tensor(a + "key_norm", (d,), "BF16")]
        out.append(V1Tensor(a + "output", (h, q), W8 if (mtp or not big) else Q5))
    else:
        g, nv, kd, vd = p + "gdn/", cfg.linear_num_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim
        out += [V1Tensor(g + "a_log", (nv,), "FP32"), V1Tensor(g + "dt_bias", (nv,), "FP32")]
        out.append(V1Tensor(g + "convolution", (cfg.linear_conv_kernel_dim, cfg.gdn_conv_channels), "BF16"))
        if big:
            out += [
                V1Tensor(g + "a_projection", (nv, h), "BF16"),
                V1Tensor(g + "b_projection", (nv, h), "BF16"),
            ]
            out += [V1Tensor(g + "query_key", (2 * kd, h), Q4), V1Tensor(g + "value_z", (2 * vd, h), Q5)]
        else:
            out.append(V1Tensor(g + "a_b_projection", (2 * nv, h), "BF16"))
            out.append(V1Tensor(g + "query_key_value_z", (2 * kd + 2 * vd, h), W8))
        out += [
            V1Tensor(g + "norm", (cfg.linear_value_head_dim,), "BF16"),
            V1Tensor(g + "output", (h, vd), Q5 if big else W8),
        ]
    out.append(V1Tensor(p + "post_attention_norm", (h,), "BF16"))
    if big:
        i, f = cfg.intermediate_size, W8 if mtp else None
        out += [V1Tensor(p + "mlp/gate_up", (2 * i, h), f or Q4), V1Tensor(p + "mlp/down", (h, i), f or Q5)]
    else:
        e, i, s, m = (
            cfg.num_experts,
            cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size,
            p + "moe/",
        )
        gate_up, down, shared = moe_fmts
        out += [
            V1Tensor(m + "router_shared_gate", (e + 1, h), "BF16"),
            V1Tensor(m + "routed_gate_up", (e * 2 * i, h), gate_up),
            V1Tensor(m + "routed_down", (e * h, i), down),
            V1Tensor(m + "shared_gate_up", (2 * s, h), shared),
            V1Tensor(m + "shared_down", (h, s), shared),
        ]
    return out


def _vision(vs: VisionShape, h: int) -> list[V1Tensor]:
    v, i = vs.hidden, vs.mlp
    out = [
        V1Tensor("vision/patch_embedding", (v, vs.patch), Q6),
        V1Tensor("vision/patch_embedding_bias", (v,), "BF16"),
        V1Tensor("vision/position_embedding", (vs.positions, v), "BF16"),
    ]
    for b in range(vs.depth):
        p = f"vision/layers/{b}/"
        out += [
            V1Tensor(p + "attention/qkv", (3 * v, v), Q4),
            V1Tensor(p + "attention/qkv_bias", (3 * v,), "BF16"),
            V1Tensor(p + "attention/output", (v, v), Q5),
            V1Tensor(p + "attention/output_bias", (v,), "BF16"),
            V1Tensor(p + "mlp/fc1", (i, v), Q4),
            V1Tensor(p + "mlp/fc1_bias", (i,), "BF16"),
            V1Tensor(p + "mlp/fc2", (v, i), Q5),
            V1Tensor(p + "mlp/fc2_bias", (v,), "BF16"),
        ]
        out += [V1Tensor(f"{p}{n}/{w}", (v,), "BF16") for n in ("norm1", "norm2") for w in ("weight", "bias")]
    m = "vision/merger/"
    out += [
        V1Tensor(m + "fc1", (4 * v, 4 * v), W8),
        V1Tensor(m + "fc1_bias", (4 * v,), "BF16"),
        V1Tensor(m + "fc2", (h, 4 * v), W8),
        V1Tensor(m + "fc2_bias", (h,), "BF16"),
        V1Tensor(m + "norm/weight", (v,), "BF16"),
        V1Tensor(m + "norm/bias", (v,), "BF16"),
    ]
    return out


def _dflash(h: int, ds: DFlashShape) -> list[V1Tensor]:
    q, kv, hd = ds.heads * ds.head_dim, ds.kv_heads * ds.head_dim, ds.head_dim
    out = [
        V1Tensor("dflash/feature_projection", (h, ds.features * h), W8),
        V1Tensor("dflash/context_norm", (h,), "BF16"),
    ]
    for layer in range(ds.layers):
        p = f"dflash/layers/{layer}/"
        out += [
            V1Tensor(p + "input_norm", (h,), "BF16"),
            V1Tensor(p + "attention/query_key_value", (q + 2 * kv, h), W8),
            V1Tensor(p + "attention/query_norm", (hd,), "BF16"),
            V1Tensor(p + "attention/key_norm", (hd,), "BF16"),
            V1Tensor(p + "attention/output", (h, q), W8),
            V1Tensor(p + "post_attention_norm", (h,), "BF16"),
            V1Tensor(p + "mlp/gate_up", (2 * ds.mlp, h), W8),
            V1Tensor(p + "mlp/down", (h, ds.mlp), W8),
        ]
    return [*out, V1Tensor("dflash/final_norm", (h,), "BF16")]


def v1_inventory(
    cfg: ModelConfig,
    *,
    draft_rows: int = 32,
    vision: VisionShape | None = VisionShape(),
    dflash: DFlashShape | None = DFlashShape(),
    q6_routed_down: tuple[int, ...] = (),
) -> list[V1Tensor]:
    """Every tensor object of an upstream file for ``cfg``, in write order, with upstream's formats. The 35B recipe
    stores ``routed_down`` as Q6 in ``q6_routed_down`` layers (34, 38, 39 real) and carries a DFlash drafter
    (``dflash``; upstream writes one only for the MoE model)."""
    h, v, big = cfg.hidden_size, cfg.vocab_size, not cfg.is_moe
    out = [V1Tensor("text/token_embedding", (v, h), Q6 if big else W8)]
    for i, kind in enumerate(cfg.layer_types):
        moe = (Q4, Q6 if i in q6_routed_down else Q5, W8)
        out += _layer(cfg, f"text/layers/{i}/", kind == "full_attention", moe, mtp=False)
    out += [V1Tensor("text/final_norm", (h,), "BF16"), V1Tensor("text/output_head", (v, h), Q6)]
    out += [
        V1Tensor("text/draft_head", (draft_rows, h), Q4),
        V1Tensor("text/draft_head_token_ids", (draft_rows,), "I32"),
    ]
    if cfg.mtp_num_hidden_layers:
        out += [
            V1Tensor("mtp/input_projection", (h, 2 * h), W8),
            V1Tensor("mtp/embedding_norm", (h,), "BF16"),
            V1Tensor("mtp/hidden_norm", (h,), "BF16"),
        ]
        out += _layer(cfg, "mtp/layer/", True, (W8, W8, W8), mtp=True)
        out.append(V1Tensor("mtp/final_norm", (h,), "BF16"))
    if vision is not None:
        out += _vision(vision, h)
    if not big and dflash is not None:
        out += _dflash(h, dflash)
    return out


Payload = np.ndarray  # values (encoded here), or uint8: the encoded bytes, written as they are


def _encoded(t: V1Tensor, x: Payload) -> np.ndarray:
    """uint8 arrays are already encoded (no tensor's values are uint8); anything else is encoded here."""
    if x.dtype == np.uint8:
        return x.reshape(-1)
    if t.format == "I32":
        return np.ascontiguousarray(x, dtype="<i4").reshape(-1).view(np.uint8)
    return FORMATS[t.format].encode(np.asarray(x, np.float32).reshape(t.shape), t.shape)


def write_v1(
    path: str | os.PathLike[str],
    model_id: str,
    tensors: list[V1Tensor],
    payload: Callable[[V1Tensor], Payload],
    resources: Mapping[str, bytes],
    *,
    edit: Callable[[dict[str, object]], None] | None = None,
) -> dict[str, object]:
    """Write the file; ``payload(t)`` gives each tensor when it is written (one at a time). Returns the directory.
    ``edit`` may change the directory after planning (tests of malformed files); payloads stay where planned."""
    objects: list[dict[str, object]] = []
    cursor = 0
    for name, data in resources.items():
        objects.append(
            {
                "name": name,
                "kind": "resource",
                "encoding": "raw-bytes-v1",
                "offset": cursor,
                "bytes": len(data),
            }
        )
        cursor += len(data)
    for t in tensors:
        cursor = align_up(cursor, 256)
        size = FORMATS[t.format].encoded_size(t.shape)
        objects.append(
            {
                "name": t.name,
                "kind": "tensor",
                "shape": list(t.shape),
                "format": t.format,
                "layout": FORMATS[t.format].layout,
                "offset": cursor,
                "bytes": size,
            }
        )
        cursor += size
    planned = [(int(ob["offset"]), int(ob["bytes"])) for ob in objects]  # type: ignore[call-overload]
    directory: dict[str, object] = {"model_id": model_id, "objects": objects}
    if edit is not None:
        edit(directory)
    text = json.dumps(directory, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    payload_offset = align_up(16 + len(text), PAYLOAD_ALIGN)
    with open(path, "wb") as f:
        f.write(MAGIC_V1 + struct.pack("<Q", len(text)) + text)
        f.write(b"\0" * (payload_offset - 16 - len(text)))
        at = 0
        blobs = [*resources.values(), *tensors]
        for (offset, size), item in zip(planned, blobs, strict=True):
            f.write(b"\0" * (offset - at))
            if isinstance(item, V1Tensor):
                buf = _encoded(item, payload(item))
                if buf.size != size:
                    raise ValueError(f"{item.name}: payload has {buf.size} bytes, the layout needs {size}")
                f.write(memoryview(np.ascontiguousarray(buf)))
            else:
                f.write(item)
            at = offset + size
        f.truncate(payload_offset + at)
    return directory
