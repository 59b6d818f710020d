"""Test-only writer of small upstream v1 ``.ninfer`` files (docs/formats.md §1-3) from canonical HF-shaped weights.

Written from the documented layout, independently of ``ninfer.artifact.v1``: ``fuse`` builds the upstream fused
parents (naming per the v1 table's assumption), ``assign_*`` gives each parent its format like §3, and
``write_v1`` frames them (resources first, tensors 256-aligned, payload at align_up(16+J, 4096), truncated at the
last object's end). ``edit`` lets a test corrupt the JSON directory after planning.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.config import ModelConfig
from ninfer.formats import FORMATS
from ninfer.reference.weights import expected_shapes

Parents = list[tuple[str, np.ndarray]]


def tiny_config(moe: bool) -> ModelConfig:
    """docs/model-math.md §9 sizes: 4 layers (lin, lin, lin, full), GQA 4/2 x 32, GDN 2 key / 6 (MoE: 4) value heads."""
    common: dict[str, Any] = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=("linear_attention",) * 3 + ("full_attention",),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        mrope_section=(2, 1, 1),
        mtp_num_hidden_layers=1,
    )
    if moe:
        return ModelConfig(
            arch="qwen3_5_moe",
            linear_num_value_heads=4,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **common,
        )
    return ModelConfig(arch="qwen3_5", linear_num_value_heads=6, intermediate_size=128, **common)


def random_canonical(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        name: (rng.standard_normal(shape) * 0.5).astype(np.float32)
        for name, shape in expected_shapes(cfg, mtp=True).items()
    }


def _layer(
    cfg: ModelConfig, w: dict[str, np.ndarray], src: str, dst: str, full: bool, split: bool
) -> Parents:
    """One decoder layer's parents. ``split``: the 27B text-layer form ([q,k]+[gate,v], [q,k]+[v,z], a and b)."""
    g = lambda n: w[src + n]  # noqa: E731
    out: Parents = [(dst + "input_norm", g("input_layernorm.weight"))]
    if full:
        hq, d, h = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
        qg = g("self_attn.q_proj.weight").reshape(hq, 2, d, h)
        q, gate = qg[:, 0].reshape(hq * d, h), qg[:, 1].reshape(hq * d, h)
        k, v = g("self_attn.k_proj.weight"), g("self_attn.v_proj.weight")
        if split:
            out += [
                (dst + "attn.query_key", np.concatenate([q, k])),
                (dst + "attn.gate_value", np.concatenate([gate, v])),
            ]
        else:
            out.append((dst + "attn.query_key_gate_value", np.concatenate([q, k, gate, v])))
        out += [
            (dst + f"attn.{n}", g(f"self_attn.{m}.weight"))
            for n, m in (("output", "o_proj"), ("q_norm", "q_norm"), ("k_norm", "k_norm"))
        ]
    else:
        qkv, z = g("linear_attn.in_proj_qkv.weight"), g("linear_attn.in_proj_z.weight")
        a, b = g("linear_attn.in_proj_a.weight"), g("linear_attn.in_proj_b.weight")
        if split:
            kd2 = 2 * cfg.gdn_key_dim
            out += [(dst + "gdn.query_key", qkv[:kd2]), (dst + "gdn.value_z", np.concatenate([qkv[kd2:], z]))]
            out += [(dst + "gdn.a_projection", a), (dst + "gdn.b_projection", b)]
        else:
            out += [
                (dst + "gdn.query_key_value_z", np.concatenate([qkv, z])),
                (dst + "gdn.a_b_projection", np.concatenate([a, b])),
            ]
        conv = g("linear_attn.conv1d.weight")  # [C, 1, K] -> tap-major [K, C]
        out.append((dst + "gdn.conv", np.ascontiguousarray(conv[:, 0, :].T)))
        out += [
            (dst + f"gdn.{n}", g(f"linear_attn.{m}"))
            for n, m in (
                ("a_log", "A_log"),
                ("dt_bias", "dt_bias"),
                ("norm", "norm.weight"),
                ("output", "out_proj.weight"),
            )
        ]
    out.append((dst + "post_attention_norm", g("post_attention_layernorm.weight")))
    if cfg.is_moe:
        e, i, h = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        out.append(
            (
                dst + "moe.router_shared_gate",
                np.concatenate([g("mlp.gate.weight"), g("mlp.shared_expert_gate.weight")]),
            )
        )
        out.append((dst + "moe.routed_gate_up", g("mlp.experts.gate_up_proj").reshape(e * 2 * i, h)))
        out.append((dst + "moe.routed_down", g("mlp.experts.down_proj").reshape(e * h, i)))
        se = "mlp.shared_expert."
        out.append(
            (
                dst + "moe.shared_gate_up",
                np.concatenate([g(se + "gate_proj.weight"), g(se + "up_proj.weight")]),
            )
        )
        out.append((dst + "moe.shared_down", g(se + "down_proj.weight")))
    else:
        out.append(
            (dst + "mlp.gate_up", np.concatenate([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")]))
        )
        out.append((dst + "mlp.down", g("mlp.down_proj.weight")))
    return out


def fuse(cfg: ModelConfig, w: dict[str, np.ndarray], *, split: bool) -> Parents:
    """Canonical HF tensors -> upstream v1 parents (a bijection of elements), in upstream write order."""
    out: Parents = [("text.embedding", w["embed_tokens.weight"])]
    for i, kind in enumerate(cfg.layer_types):
        out += _layer(cfg, w, f"layers.{i}.", f"text.layers.{i}.", kind == "full_attention", split)
    out += [("text.final_norm", w["norm.weight"]), ("text.lm_head", w["lm_head.weight"])]
    if cfg.mtp_num_hidden_layers:
        out += [
            (f"mtp.{n}", w[f"mtp.{n}.weight"])
            for n in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
        ]
        out += _layer(cfg, w, "mtp.layers.0.", "mtp.layers.0.", True, False)
    return out


def extras(cfg: ModelConfig, seed: int) -> Parents:
    """Tensors outside the text model (the reader lists them as ignored)."""
    rng = np.random.default_rng(seed)
    h = cfg.hidden_size
    return [
        ("vision.patch_embedding", rng.standard_normal((96, 48)).astype(np.float32)),
        ("draft_head.weight", rng.standard_normal((32, h)).astype(np.float32)),
        ("draft_head.token_ids", rng.permutation(cfg.vocab_size)[:32].astype(np.int32)),
    ]


def assign_bf16(name: str, arr: np.ndarray) -> str:
    if arr.dtype.kind == "i":
        return "I32"
    return "FP32" if name.endswith(("a_log", "dt_bias")) else "BF16"


def assign_27b(name: str, arr: np.ndarray) -> str:
    """§3 qwen3.6-27b: Q6 embedding/lm_head, Q4 query_key/gate_up/draft, Q5 gate_value/outputs/value_z/down,
    W8 MTP matrices, BF16 norms/conv/a/b, FP32 a_log/dt_bias."""
    if arr.ndim < 2 or name.endswith(("conv", "a_projection", "b_projection")) or arr.dtype.kind == "i":
        return assign_bf16(name, arr)
    if name.startswith("mtp."):
        return "W8G32_F16S"
    if name in ("text.embedding", "text.lm_head", "vision.patch_embedding"):
        return "Q6G64_F16S"
    if name.endswith(("query_key", "gate_up")) or name.startswith("draft_head"):
        return "Q4G64_F16S"
    return "Q5G64_F16S"


def assign_35b(name: str, arr: np.ndarray) -> str:
    """§3 qwen3.6-35b-a3b: W8 most matrices, Q6 lm_head (+ routed_down of layer 1 here), Q4 routed gate_up,
    Q5 routed down, BF16 router_shared_gate/a_b/conv/norms, FP32 a_log/dt_bias."""
    if (
        arr.ndim < 2
        or name.endswith(("conv", "a_b_projection", "router_shared_gate"))
        or arr.dtype.kind == "i"
    ):
        return assign_bf16(name, arr)
    if name.startswith("mtp."):
        return "W8G32_F16S"
    if name in ("text.lm_head", "text.layers.1.moe.routed_down", "vision.patch_embedding"):
        return "Q6G64_F16S"
    if name.endswith("routed_gate_up") or name.startswith("draft_head"):
        return "Q4G64_F16S"
    return "Q5G64_F16S" if name.endswith("routed_down") else "W8G32_F16S"


def encode_parents(parents: Parents, assign: Callable[[str, np.ndarray], str]) -> list[dict[str, Any]]:
    """Each parent encoded per ``assign``: dicts with name, format, layout, shape, data (uint8)."""
    out = []
    for name, arr in parents:
        fmt = FORMATS[assign(name, arr)]
        out.append(
            dict(name=name, format=fmt.id, layout=fmt.layout, shape=list(arr.shape), data=fmt.encode(arr))
        )
    return out


FRONTEND = {
    "frontend/tokenizer.json": b'{"version":"1.0"}',
    "frontend/chat_template.jinja": b"{{ messages }}",
}


def write_v1(
    path: Path,
    model_id: str,
    tensors: list[dict[str, Any]],
    resources: dict[str, bytes] | None = None,
    *,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Write a v1 file; returns the (possibly edited) directory that was written."""
    res = FRONTEND if resources is None else resources
    objects: list[dict[str, Any]] = []
    blobs: list[tuple[int, bytes]] = []
    cursor = 0
    for name, data in res.items():  # resources first, alignment 1
        objects.append(
            dict(name=name, kind="resource", encoding="raw-bytes-v1", offset=cursor, bytes=len(data))
        )
        blobs.append((cursor, data))
        cursor += len(data)
    for t in tensors:
        cursor = (cursor + 255) // 256 * 256
        data = t["data"].tobytes()
        objects.append(
            dict(
                name=t["name"],
                kind="tensor",
                shape=t["shape"],
                format=t["format"],
                layout=t["layout"],
                offset=cursor,
                bytes=len(data),
            )
        )
        blobs.append((cursor, data))
        cursor += len(data)
    directory: dict[str, Any] = {"model_id": model_id, "objects": objects}
    if edit is not None:
        edit(directory)
    text = json.dumps(directory, separators=(",", ":")).encode()
    payload = (16 + len(text) + 4095) // 4096 * 4096
    buf = bytearray(payload + cursor)
    buf[:16] = b"NINFER\x00\x01" + struct.pack("<Q", len(text))
    buf[16 : 16 + len(text)] = text
    for off, data in blobs:
        buf[payload + off : payload + off + len(data)] = data
    Path(path).write_bytes(bytes(buf))
    return directory
