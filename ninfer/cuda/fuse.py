"""Projections that read the same activation, fused at load into one weight: one GEMV (decode) or GEMM (prefill)
instead of two to four, so the small ones (k, v, the GDN gates a and b) stop costing a launch and a latency each.

- attention: ``q_proj`` ([query | gate] per head) | ``k_proj`` | ``v_proj`` -> ``self_attn.qkvg_proj``;
- GDN: ``in_proj_qkv`` | ``in_proj_z`` | ``in_proj_a`` | ``in_proj_b`` -> ``linear_attn.in_proj``;
- dense MLP and the MoE shared expert: ``gate_proj`` | ``up_proj`` -> ``gate_up_proj`` (the SwiGLU input layout);
- MoE router: ``gate`` | ``shared_expert_gate`` -> ``mlp.router_gates`` (both read the fp32 input, exact GEMV).

The fused weight's rows are the parts' rows in that order, each row stored exactly as before, so each output
column of the fused product is the part's own up to fp32 summation order (bitwise where the GEMV splits K the same
way, which depends on the row count: ``gemv_plan``). The model only ever uses the fused weight, so its results
stay independent of the batch. Formats keep their encoding; scales that were per tensor become per row where the parts' differ:
FP8 tensor-scaled parts become one row-scaled FP8 weight, NVFP4 parts with different global scales one
``NVFP4G16_E4M3S_ROWG`` weight (an f32 global per row; device only, cuda_src/wformat.cuh and wfrag.cuh).
The parts are dropped from the tensor dict, so fusing costs no memory beyond one layer's copy while it runs.

MoE: the shared expert is also appended to the routed experts as expert E (``append_shared_expert``), when its
width equals an expert's and one format holds both, so decode runs routed and shared experts in one launch per
projection (the router lists the shared slot after the routed ones, cuda_src/router.cu); the standalone shared
weights stay for the prefill GEMM.

Parts of different group-int formats (Q4 q|k next to Q5 v) are first widened to the widest of them, value for value
(``formats.groupint.widen_planes``, on the device). Parts that no format holds exactly together (BF16 a|b next to
quantized q|k|v|z) are fused per run of joinable parts into a ``FusedRuns``: one product per run, written into the
columns of one output (``model_layers.linear``), so the model still sees one product.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.config import ModelConfig
from ninfer.cuda._common import array_module
from ninfer.cuda.nvfp4_layout import has_device_layout, to_device_layout, to_natural_layout
from ninfer.cuda.weights import PLANES, DeviceWeight
from ninfer.formats import get_format
from ninfer.formats.groupint import widen_planes, widest

__all__ = [
    "FUSED",
    "ROWG",
    "FusedRuns",
    "append_shared_expert",
    "concat_rows",
    "fuse_projections",
    "fused_splits",
    "missing_tensors",
]

ROWG = "NVFP4G16_E4M3S_ROWG"

# fused name (after "layers.{i}.") -> its parts, in row order
FUSED: dict[str, tuple[str, ...]] = {
    "self_attn.qkvg_proj": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "linear_attn.in_proj": (
        "linear_attn.in_proj_qkv.weight",
        "linear_attn.in_proj_z.weight",
        "linear_attn.in_proj_a.weight",
        "linear_attn.in_proj_b.weight",
    ),
    "mlp.gate_up_proj": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.shared_expert.gate_up_proj": (
        "mlp.shared_expert.gate_proj.weight",
        "mlp.shared_expert.up_proj.weight",
    ),
    "mlp.router_gates": ("mlp.gate.weight", "mlp.shared_expert_gate.weight"),
}


def fused_splits(cfg: ModelConfig, name: str) -> tuple[int, ...]:
    """Column offsets where each part of fused weight ``name`` starts in the product, plus the total width."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    vd, hv = cfg.linear_num_value_heads * cfg.linear_value_head_dim, cfg.linear_num_value_heads
    widths = {
        "self_attn.qkvg_proj": (2 * hq * d, hkv * d, hkv * d),
        "linear_attn.in_proj": (2 * kd + vd, vd, hv, hv),
        "mlp.gate_up_proj": (cfg.intermediate_size,) * 2,
        "mlp.shared_expert.gate_up_proj": (cfg.shared_expert_intermediate_size,) * 2,
        "mlp.router_gates": (cfg.num_experts, 1),
    }[name]
    return tuple(itertools.accumulate((int(v) for v in widths), initial=0))  # once per layer: no NumPy calls


def _planes(fmt: str, shape: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """Plane name -> (byte offset, byte size) of an encoded ``fmt`` tensor of ``shape`` (BF16: one plane)."""
    codec = get_format(fmt)
    if fmt not in PLANES:
        return {"data": (0, codec.encoded_size(shape))}
    host = np.empty(codec.encoded_size(shape), np.uint8)  # never read: only the views' offsets matter
    views = codec.views(host, shape)  # type: ignore[attr-defined]
    return {n: (views[n].ctypes.data - host.ctypes.data, views[n].nbytes) for n in PLANES[fmt]}


def _f32_rows(xp: Any, parts: Sequence[DeviceWeight], plane: str) -> Any:
    """The parts' per-row f32 scales of ``plane`` (a per-tensor scalar repeated over the part's rows)."""
    out = []
    for p in parts:
        off, size = _planes(p.fmt, (p.rows, p.cols))[plane]
        v = p.data[off : off + size].view(np.float32)
        out.append(v if v.size == p.rows else xp.repeat(v[:1], p.rows))
    return xp.concatenate(out)


@dataclass(frozen=True, slots=True)
class FusedRuns:
    """A fused projection stored as consecutive runs of rows in different formats: ``runs[i]`` gives output
    columns ``[cols[i], cols[i + 1])``."""

    runs: tuple[DeviceWeight, ...]
    cols: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(sum(r.data.nbytes for r in self.runs))


def widen_weight(w: DeviceWeight, fmt: str) -> DeviceWeight:
    """``w`` re-packed into the wider group-int format ``fmt``, every value kept (on ``w``'s device)."""
    if w.fmt == fmt:
        return w
    xp, shape = array_module(w.data), (w.rows, w.cols)
    src, dst = _planes(w.fmt, shape), _planes(fmt, shape)
    sv = [w.data[off : off + size] for off, size in (src[n] for n in ("base", "high", "scale"))]
    base = sv[0].reshape(w.rows, -1)
    high = sv[1].reshape(w.rows, -1) if sv[1].size else xp.zeros((w.rows, 0), np.uint8)
    planes = widen_planes(xp, w.fmt, fmt, base, high, sv[2].view(np.float16).reshape(w.rows, -1))
    data = xp.zeros(max(off + size for off, size in dst.values()), dtype=np.uint8)
    for name, plane in zip(("base", "high", "scale"), planes, strict=True):
        off, size = dst[name]
        data[off : off + size] = xp.ascontiguousarray(plane).reshape(-1).view(np.uint8)
    return DeviceWeight(fmt, shape, data, (dst["base"][0], dst["high"][0], dst["scale"][0]))


def _joinable(parts: Sequence[DeviceWeight]) -> bool:
    fmts = {p.fmt for p in parts}
    return (
        len({"FP8E4M3_F32ROW" if f == "FP8E4M3_F32T" else f for f in fmts}) == 1
        or widest(list(fmts)) is not None
    )


def concat_rows(parts: Sequence[DeviceWeight]) -> DeviceWeight:
    """One weight whose rows are the parts' rows in order (same width; one format, or group-int formats that are
    widened to the widest; see the module docstring). NVFP4 parts and Q4/Q5/Q6 scales are in a device layout
    (nvfp4_layout.py, qg64_layout.py): joined as natural rows, then laid out again."""
    if any(has_device_layout(p.fmt) for p in parts):
        return to_device_layout(_concat_natural([to_natural_layout(p) for p in parts]))
    return _concat_natural(parts)


def _concat_natural(parts: Sequence[DeviceWeight]) -> DeviceWeight:
    fmt, k = parts[0].fmt, parts[0].cols
    if any(p.cols != k or len(p.shape) != 2 for p in parts):
        raise ValueError(f"concat_rows: parts must be 2-D with {k} columns")
    wide = widest([p.fmt for p in parts])
    if wide is not None and any(p.fmt != wide for p in parts):
        parts = [widen_weight(p, wide) for p in parts]
        fmt = wide
    base = {"FP8E4M3_F32T": "FP8E4M3_F32ROW"}
    if len({base.get(p.fmt, p.fmt) for p in parts}) != 1 or fmt == ROWG:
        raise ValueError(f"concat_rows: mixed formats {[p.fmt for p in parts]}")
    xp, n = array_module(parts[0].data), sum(p.rows for p in parts)
    out_fmt = base.get(fmt, fmt)
    row_global = None
    if out_fmt == "NVFP4G16_E4M3S":
        g = _f32_rows(xp, parts, "global")
        if not bool((g == g[0]).all()):
            out_fmt, row_global = ROWG, g
    geo = _planes(out_fmt if out_fmt != ROWG else "NVFP4G16_E4M3S", (n, k))
    size = max(off + sz for off, sz in geo.values())
    if row_global is not None:
        size = geo["global"][0] + 4 * n
    data = xp.zeros(size, dtype=np.uint8)
    for plane, (off, _) in geo.items():
        if plane == "global" and row_global is not None:
            data[off : off + 4 * n] = row_global.view(np.uint8)
        elif plane == "scale" and out_fmt == "FP8E4M3_F32ROW":
            data[off : off + 4 * n] = _f32_rows(xp, parts, "scale").view(np.uint8)
        elif plane == "global":
            p0 = parts[0]
            src, sz = _planes("NVFP4G16_E4M3S", (p0.rows, k))["global"]
            data[off : off + sz] = p0.data[src : src + sz]
        else:
            cur = off
            for p in parts:
                src, sz = _planes(p.fmt, (p.rows, k))[plane]
                data[cur : cur + sz] = p.data[src : src + sz]
                cur += sz
    offs = [off for off, _ in geo.values()] + [0, 0]
    return DeviceWeight(out_fmt, (n, k), data, (offs[0], offs[1], offs[2]))


def fuse_projections(cfg: ModelConfig, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """A new tensor dict with every fusable group of every layer replaced by its fused weight (``FUSED``), and the
    MoE shared expert appended to the routed experts where it can be (``append_shared_expert``)."""
    out = dict(tensors)
    prefixes = [f"layers.{i}." for i in range(cfg.num_hidden_layers)]
    prefixes += [f"mtp.layers.{j}." for j in range(cfg.mtp_num_hidden_layers)]  # the MTP head's layer
    for p in prefixes:
        for fused, names in FUSED.items():
            keys = [f"{p}{n}" for n in names]
            if all(isinstance(out.get(key), DeviceWeight) for key in keys):
                out[f"{p}{fused}"] = _fuse([out.pop(key) for key in keys])
        append_shared_expert(cfg, out, p)
    return out


# (routed experts [E, N, K], the shared expert's [N, K]) per projection
_SHARED_SLOT = (
    ("mlp.experts.gate_up_proj", "mlp.shared_expert.gate_up_proj"),
    ("mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight"),
)


def append_shared_expert(cfg: ModelConfig, tensors: dict[str, Any], prefix: str) -> bool:
    """The routed expert weights of the layer whose names start with ``prefix`` (``layers.3.``) replaced in
    ``tensors`` by ``[E + 1, N, K]`` weights whose expert E is the shared expert (rows kept as stored: its products
    are the standalone GEMVs' sums in the expert plan's K splits, gemv_geometry._GV_DENSE_MIN_TILES). Only when
    every projection's shared weight has an expert's shape and joins the experts' format; returns whether it did
    (also true when an earlier call did)."""
    pairs = [(tensors.get(f"{prefix}{e}"), tensors.get(f"{prefix}{s}")) for e, s in _SHARED_SLOT]
    ok = all(
        isinstance(e, DeviceWeight)
        and isinstance(s, DeviceWeight)
        and len(e.shape) == 3
        and e.shape[1:] == s.shape
        for e, s in pairs
    )
    if not ok:
        return False
    if all(e.shape[0] == cfg.num_experts + 1 for e, _ in pairs):
        return True  # a shared dict this function already extended
    if not all(e.shape[0] == cfg.num_experts and _joinable([e, s]) for e, s in pairs):
        return False
    for (name, _), (e, s) in zip(_SHARED_SLOT, pairs, strict=True):
        joined = concat_rows([dataclasses.replace(e, shape=(e.rows, e.cols)), s])
        tensors[f"{prefix}{name}"] = dataclasses.replace(joined, shape=(e.shape[0] + 1, *e.shape[1:]))
    return True


def _fuse(parts: list[DeviceWeight]) -> DeviceWeight | FusedRuns:
    """``concat_rows`` of the parts, or, when no format holds them all, of each run of joinable parts."""
    if _joinable(parts):
        return concat_rows(parts)
    runs: list[list[DeviceWeight]] = [[parts[0]]]
    for p in parts[1:]:
        if _joinable([*runs[-1], p]):
            runs[-1].append(p)
        else:
            runs.append([p])
    fused = tuple(concat_rows(r) if len(r) > 1 else r[0] for r in runs)
    return FusedRuns(fused, tuple(int(c) for c in np.cumsum([0, *(w.rows for w in fused)])))


def missing_tensors(cfg: ModelConfig, tensors: Mapping[str, Any], expected: Sequence[str]) -> list[str]:
    """The ``expected`` names absent from ``tensors``, counting a part as present when its fused weight is (a dict
    that another network already fused can be shared)."""
    part_of = {
        f"layers.{i}.{p}": f"layers.{i}.{fused}"
        for i in range(cfg.num_hidden_layers)
        for fused, parts in FUSED.items()
        for p in parts
    }
    return [n for n in expected if n not in tensors and part_of.get(n) not in tensors]
