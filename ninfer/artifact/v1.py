"""Strict reader of the upstream v1 ``.ninfer`` container (docs/formats.md §1-3), and its canonical-name view.

```
[0,16)   b"NINFER\\0\\x01" | u64 LE json_bytes (> 0)
[16,16+J) UTF-8 JSON {model_id, objects[]};  payload at align_up(16+J, 4096); objects at payload offsets
```
``V1Artifact.open(path)`` reads only the prefix and the JSON directory, checks the closed schema and registries
and every object's range (offset >= cursor, alignment, bounds, exact encoded size, in array order), then maps
the payload with one read-only ``numpy.memmap``. An unregistered ``model_id`` opens (``registered`` is False)
but ``canonical_weights()`` refuses it. Every failure is a ``V1FormatError`` naming the object/member at fault.

Upstream tensor names are not in the spec: ``V1_LAYER_PARENTS`` / ``V1_GLOBALS`` below are OUR ASSUMPTION of
upstream naming, built from the roles and fused row orders of docs/formats.md §3.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.artifact.container import ArtifactError
from ninfer.config import ModelConfig
from ninfer.formats import FORMATS, FormatError, align_up

__all__ = ["V1Artifact", "V1Object", "V1Weights", "V1FormatError", "MAGIC_V1", "V1_MODEL_IDS", "V1_FORMATS"]

MAGIC_V1 = b"NINFER\x00\x01"
PAYLOAD_ALIGN = 4096
V1_MODEL_IDS = ("qwen3.6-27b", "qwen3.6-35b-a3b")
_DIRECT = ("BF16", "FP32", "I32")
_GROUPED = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")
V1_FORMATS = _DIRECT + _GROUPED
# layout -> (formats, min rank, max rank, byte alignment of offsets)
V1_LAYOUTS = {"contiguous-le-v1": (_DIRECT, 0, 16, 256), "row-split-k128-v1": (_GROUPED, 2, 2, 256)}
_TENSOR_MEMBERS = ("name", "kind", "shape", "format", "layout", "offset", "bytes")
_RESOURCE_MEMBERS = ("name", "kind", "encoding", "offset", "bytes")

# ---- upstream naming (OUR ASSUMPTION; docs/formats.md §3 documents roles and row orders, not names) -----------
# Layer tensors are "{L}{role}" with L = "text.layers.{i}." (canonical "layers.{i}.") or "mtp.layers.{j}."
# (canonical "mtp.layers.{j}."). Each fused parent lists its row segments in order; a segment's row count
# comes from _segment_rows (single-segment parents: all rows). Both the 27B split parents ([q,k] + [gate,v],
# [q,k] + [v,z], separate a/b) and the 35B single parents are recognised.
V1_LAYER_PARENTS: Mapping[str, tuple[str, ...]] = {
    "input_norm": ("input_norm",),
    "post_attention_norm": ("post_norm",),
    "attn.query_key_gate_value": ("q", "k", "gate", "v"),
    "attn.query_key": ("q", "k"),
    "attn.gate_value": ("gate", "v"),
    "attn.output": ("o",),
    "attn.q_norm": ("q_norm",),
    "attn.k_norm": ("k_norm",),
    "gdn.query_key_value_z": ("gq", "gk", "gv", "gz"),
    "gdn.query_key": ("gq", "gk"),
    "gdn.value_z": ("gv", "gz"),
    "gdn.a_b_projection": ("a", "b"),
    "gdn.a_projection": ("a",),
    "gdn.b_projection": ("b",),
    "gdn.conv": ("conv",),  # [K, C], tap-major: conv[j, c] = conv1d.weight[c, 0, j]
    "gdn.a_log": ("a_log",),
    "gdn.dt_bias": ("dt_bias",),
    "gdn.norm": ("gdn_norm",),
    "gdn.output": ("gdn_out",),
    "mlp.gate_up": ("mlp_gate", "mlp_up"),
    "mlp.down": ("mlp_down",),
    "moe.router_shared_gate": ("router", "shared_gate"),  # [E+1, H]
    "moe.routed_gate_up": ("experts_gate_up",),  # [E*2I, H], row e*2I + {0 gate, 1 up}*I + r
    "moe.routed_down": ("experts_down",),  # [E*H, I], row e*H + h
    "moe.shared_gate_up": ("shared_gate_proj", "shared_up_proj"),
    "moe.shared_down": ("shared_down_proj",),
}
# canonical suffix (after "layers.{i}." / "mtp.layers.{j}.") -> (how, segments)
#   rows: concatenate the segments' rows, reshape to the HF shape;  heads: q_proj, per head [query D | gate D];
#   conv: [K, C] tap-major -> [C, 1, K]
V1_CANONICAL: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "input_layernorm.weight": ("rows", ("input_norm",)),
    "post_attention_layernorm.weight": ("rows", ("post_norm",)),
    "self_attn.q_proj.weight": ("heads", ("q", "gate")),
    "self_attn.k_proj.weight": ("rows", ("k",)),
    "self_attn.v_proj.weight": ("rows", ("v",)),
    "self_attn.o_proj.weight": ("rows", ("o",)),
    "self_attn.q_norm.weight": ("rows", ("q_norm",)),
    "self_attn.k_norm.weight": ("rows", ("k_norm",)),
    "linear_attn.in_proj_qkv.weight": ("rows", ("gq", "gk", "gv")),
    "linear_attn.in_proj_z.weight": ("rows", ("gz",)),
    "linear_attn.in_proj_a.weight": ("rows", ("a",)),
    "linear_attn.in_proj_b.weight": ("rows", ("b",)),
    "linear_attn.conv1d.weight": ("conv", ("conv",)),
    "linear_attn.A_log": ("rows", ("a_log",)),
    "linear_attn.dt_bias": ("rows", ("dt_bias",)),
    "linear_attn.norm.weight": ("rows", ("gdn_norm",)),
    "linear_attn.out_proj.weight": ("rows", ("gdn_out",)),
    "mlp.gate_proj.weight": ("rows", ("mlp_gate",)),
    "mlp.up_proj.weight": ("rows", ("mlp_up",)),
    "mlp.down_proj.weight": ("rows", ("mlp_down",)),
    "mlp.gate.weight": ("rows", ("router",)),
    "mlp.shared_expert_gate.weight": ("rows", ("shared_gate",)),
    "mlp.experts.gate_up_proj": ("rows", ("experts_gate_up",)),
    "mlp.experts.down_proj": ("rows", ("experts_down",)),
    "mlp.shared_expert.gate_proj.weight": ("rows", ("shared_gate_proj",)),
    "mlp.shared_expert.up_proj.weight": ("rows", ("shared_up_proj",)),
    "mlp.shared_expert.down_proj.weight": ("rows", ("shared_down_proj",)),
}
# whole-tensor names outside layers (MTP reuses text.embedding / text.lm_head as aliases, not copies)
V1_GLOBALS: Mapping[str, str] = {
    "text.embedding": "embed_tokens.weight",
    "text.lm_head": "lm_head.weight",
    "text.final_norm": "norm.weight",
    "mtp.fc": "mtp.fc.weight",
    "mtp.pre_fc_norm_embedding": "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden": "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm": "mtp.norm.weight",
}
# not part of the text model: vision tower, draft head (+ its token-id shortlist), DFlash drafter
V1_IGNORED = re.compile(r"^(vision|draft_head|dflash)\.")
_LAYER = re.compile(r"^(text\.layers\.(\d+)\.|mtp\.layers\.(\d+)\.)(.+)$")


def _segment_rows(cfg: ModelConfig) -> dict[str, int]:
    d = cfg.head_dim
    return {
        "q": cfg.num_attention_heads * d,
        "k": cfg.num_key_value_heads * d,
        "gate": cfg.num_attention_heads * d,
        "v": cfg.num_key_value_heads * d,
        "gq": cfg.gdn_key_dim,
        "gk": cfg.gdn_key_dim,
        "gv": cfg.gdn_value_dim,
        "gz": cfg.gdn_value_dim,
        "a": cfg.linear_num_value_heads,
        "b": cfg.linear_num_value_heads,
        "mlp_gate": cfg.intermediate_size,
        "mlp_up": cfg.intermediate_size,
        "router": cfg.num_experts,
        "shared_gate": 1,
        "shared_gate_proj": cfg.shared_expert_intermediate_size,
        "shared_up_proj": cfg.shared_expert_intermediate_size,
    }


class V1FormatError(ArtifactError):
    """An upstream v1 file that is malformed or cannot be used; the message names the object/member at fault."""


@dataclass(frozen=True, slots=True)
class V1Object:
    """One directory entry. ``shape``/``format``/``layout`` are None for resources, ``encoding`` for tensors."""

    name: str
    kind: str
    offset: int
    bytes: int
    shape: tuple[int, ...] | None = None
    format: str | None = None
    layout: str | None = None
    encoding: str | None = None


# ---- container parsing ------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise V1FormatError(f"directory: duplicate JSON member {k!r}")
        out[k] = v
    return out


def _reject_constant(token: str) -> None:
    raise V1FormatError(f"directory: JSON constant {token} is not allowed")


def _read_directory(path: str, size: int) -> tuple[dict[str, Any], int]:
    """The parsed JSON root and the payload offset; reads only the prefix and the directory."""
    if size < 16:
        raise V1FormatError(f"{path}: {size} bytes is shorter than the 16-byte v1 prefix (truncated file)")
    with open(path, "rb") as f:
        magic, jbytes = struct.unpack("<8sQ", f.read(16))
        if magic != MAGIC_V1:
            if magic[:7] == MAGIC_V1[:7]:
                raise V1FormatError(f"{path}: unsupported v1 framing revision {magic[7]} (expected 1)")
            raise V1FormatError(f"{path}: bad magic {magic!r}: not an upstream v1 .ninfer file")
        if jbytes == 0 or 16 + jbytes > size:
            raise V1FormatError(f"{path}: json_bytes {jbytes} does not fit the {size}-byte file (truncated?)")
        raw = f.read(jbytes)
    try:
        root = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except UnicodeDecodeError as e:
        raise V1FormatError(f"{path}: directory is not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise V1FormatError(f"{path}: directory is not valid JSON ({e.msg} at char {e.pos})") from None
    except V1FormatError as e:
        raise V1FormatError(f"{path}: {e}") from None
    return root, align_up(16 + jbytes, PAYLOAD_ALIGN)


def _check_members(where: str, obj: Any, members: tuple[str, ...]) -> None:
    if not isinstance(obj, dict):
        raise V1FormatError(f"{where}: must be a JSON object, got {type(obj).__name__}")
    missing = [m for m in members if m not in obj]
    extra = sorted(set(obj) - set(members))
    if missing or extra:
        raise V1FormatError(f"{where}: missing members {missing}, unexpected members {extra}")
    nulls = [m for m in members if obj[m] is None]
    if nulls:
        raise V1FormatError(f"{where}: member {nulls[0]!r} is null")


def _want(where: str, member: str, ok: bool, what: str, value: Any) -> None:
    if not ok:
        raise V1FormatError(f"{where}: member {member!r} must be {what}, got {value!r}")


def _parse_object(i: int, o: Any) -> V1Object:
    where = f"objects[{i}]"
    if isinstance(o, dict) and isinstance(o.get("name"), str):
        where += f" {o['name']!r}"
    kind = o.get("kind") if isinstance(o, dict) else None
    if not isinstance(o, dict):
        raise V1FormatError(f"{where}: must be a JSON object, got {type(o).__name__}")
    if kind not in ("tensor", "resource"):
        raise V1FormatError(f"{where}: member 'kind' must be 'tensor' or 'resource', got {kind!r}")
    _check_members(where, o, _TENSOR_MEMBERS if kind == "tensor" else _RESOURCE_MEMBERS)
    _want(where, "name", isinstance(o["name"], str) and o["name"] != "", "a non-empty string", o["name"])
    _want(where, "offset", _is_int(o["offset"]) and o["offset"] >= 0, "an integer >= 0", o["offset"])
    if kind == "resource":
        _want(where, "bytes", _is_int(o["bytes"]) and o["bytes"] >= 0, "an integer >= 0", o["bytes"])
        _want(where, "encoding", o["encoding"] == "raw-bytes-v1", "'raw-bytes-v1'", o["encoding"])
        return V1Object(o["name"], kind, o["offset"], o["bytes"], encoding=o["encoding"])
    _want(where, "bytes", _is_int(o["bytes"]) and o["bytes"] > 0, "an integer > 0", o["bytes"])
    shape = o["shape"]
    ok = isinstance(shape, list) and all(_is_int(d) and d > 0 for d in shape)
    _want(where, "shape", ok, "a list of integers > 0", shape)
    fmt, layout = o["format"], o["layout"]
    _want(where, "format", isinstance(fmt, str) and fmt in V1_FORMATS, f"one of {' '.join(V1_FORMATS)}", fmt)
    _want(
        where,
        "layout",
        isinstance(layout, str) and layout in V1_LAYOUTS,
        f"one of {list(V1_LAYOUTS)}",
        layout,
    )
    formats, lo, hi, _ = V1_LAYOUTS[layout]
    if fmt not in formats:
        raise V1FormatError(f"{where}: format {fmt} cannot use layout {layout}")
    if not lo <= len(shape) <= hi:
        raise V1FormatError(f"{where}: layout {layout} needs rank {lo}..{hi}, got shape {shape}")
    return V1Object(o["name"], kind, o["offset"], o["bytes"], tuple(shape), fmt, layout)


def _check_ranges(objects: list[V1Object], payload_bytes: int) -> None:
    """Per-object checks in array order: offset >= cursor, alignment, bounds, exact encoded size."""
    cursor = 0
    for i, ob in enumerate(objects):
        where = f"objects[{i}] {ob.name!r}"
        if ob.offset < cursor:
            raise V1FormatError(
                f"{where}: offset {ob.offset} overlaps or precedes the previous object (ends {cursor})"
            )
        align = V1_LAYOUTS[ob.layout][3] if ob.layout else 1
        if ob.offset % align:
            raise V1FormatError(f"{where}: offset {ob.offset} is not {align}-byte aligned")
        end = ob.offset + ob.bytes
        if end > payload_bytes:
            raise V1FormatError(
                f"{where}: ends at payload byte {end}, past the payload's {payload_bytes} (truncated?)"
            )
        if ob.kind == "tensor":
            want = FORMATS[ob.format].encoded_size(ob.shape)
            if ob.bytes != want:
                raise V1FormatError(
                    f"{where}: bytes {ob.bytes} != {want}, the size of {ob.format} {list(ob.shape)}"
                )
        cursor = end


def parse_directory(root: Any, payload_bytes: int) -> tuple[str, list[V1Object]]:
    """Check a parsed JSON root against the v1 schema; returns (model_id, objects)."""
    _check_members("directory", root, ("model_id", "objects"))
    _want("directory", "model_id", isinstance(root["model_id"], str), "a string", root["model_id"])
    _want("directory", "objects", isinstance(root["objects"], list), "a list", root["objects"])
    objects = [_parse_object(i, o) for i, o in enumerate(root["objects"])]
    seen: set[str] = set()
    for i, ob in enumerate(objects):
        if ob.name in seen:
            raise V1FormatError(f"objects[{i}] {ob.name!r}: duplicate name")
        seen.add(ob.name)
    _check_ranges(objects, payload_bytes)
    return root["model_id"], objects


class V1Artifact:
    """An opened upstream v1 file. Use ``V1Artifact.open(path)``."""

    def __init__(self, path: str, model_id: str, objects: list[V1Object], payload_offset: int, size: int):
        self.path, self.model_id, self.objects = path, model_id, objects
        self.payload_offset, self.file_size = payload_offset, size
        self.registered = model_id in V1_MODEL_IDS  # an unknown model can be inspected, not executed
        self._by_name = {o.name: o for o in objects}
        n = size - payload_offset
        self._mm: np.ndarray | None = (
            np.memmap(path, dtype=np.uint8, mode="r", offset=payload_offset, shape=(n,))
            if n > 0
            else np.zeros(0, np.uint8)
        )

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> V1Artifact:
        p = os.fspath(path)
        try:
            size = os.stat(p).st_size
        except OSError as e:
            raise V1FormatError(f"{p}: cannot open ({e.strerror})") from None
        root, payload = _read_directory(p, size)
        try:
            model_id, objects = parse_directory(root, size - payload)
        except V1FormatError as e:
            raise V1FormatError(f"{p}: {e}") from None
        return cls(p, model_id, objects, payload, size)

    def close(self) -> None:
        """Drop this object's memory map. The mapping itself goes when the last ``raw()`` view is gone: forcing
        ``mmap.close()`` under live views would leave them dangling (a segfault on the next read)."""
        self._mm = None

    def __enter__(self) -> V1Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entry(self, name: str) -> V1Object:
        try:
            return self._by_name[name]
        except KeyError:
            raise V1FormatError(f"{self.path}: no object named {name!r}") from None

    def tensor_names(self) -> list[str]:
        return [o.name for o in self.objects if o.kind == "tensor"]

    def resource_names(self) -> list[str]:
        return [o.name for o in self.objects if o.kind == "resource"]

    def raw(self, name: str) -> np.ndarray:
        """The object's bytes as a read-only uint8 view of the memory map."""
        o = self.entry(name)
        if self._mm is None:
            raise V1FormatError(f"{self.path}: the artifact is closed")
        return self._mm[o.offset : o.offset + o.bytes]

    def _tensor(self, name: str) -> V1Object:
        o = self.entry(name)
        if o.kind != "tensor":
            raise V1FormatError(f"{self.path}: {name!r} is a resource, not a tensor")
        return o

    def decode(self, name: str) -> np.ndarray:
        o = self._tensor(name)
        try:
            return FORMATS[o.format].decode(self.raw(name), o.shape)
        except FormatError as e:
            raise V1FormatError(f"{self.path}: tensor {name!r}: {e}") from None

    def decode_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of the ``[prod(shape[:-1]), shape[-1]]`` view, float32 (I32: int32)."""
        o = self._tensor(name)
        try:
            return FORMATS[o.format].decode_rows(self.raw(name), o.shape, r0, r1)
        except FormatError as e:
            raise V1FormatError(f"{self.path}: tensor {name!r}: {e}") from None

    def resource(self, name: str) -> bytes:
        o = self.entry(name)
        if o.kind != "resource":
            raise V1FormatError(f"{self.path}: {name!r} is a tensor, not a resource")
        return bytes(self.raw(name))

    def canonical_weights(self, cfg: ModelConfig | None = None) -> V1Weights:
        """The text model (and MTP head) under canonical HF names, un-fused lazily from the v1 tensors.

        ``cfg`` gives the dimensions used to split fused rows; default: the registered config of ``model_id``.
        """
        from ninfer.artifact.registry import MODELS  # the pinned 27B / 35B configs

        if not self.registered:
            raise V1FormatError(
                f"{self.path}: model_id {self.model_id!r} is not registered for v1 files "
                f"({', '.join(V1_MODEL_IDS)}); it can be inspected but not executed"
            )
        ident = MODELS[self.model_id]
        if cfg is not None and cfg.arch != ident.arch:
            raise V1FormatError(f"{self.path}: config arch {cfg.arch!r} does not match {self.model_id!r}")
        return V1Weights(self, cfg or ident.config)


# ---- canonical view -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Segment:
    parent: str
    r0: int
    r1: int


class V1Weights:
    """A ``WeightSource`` over a ``V1Artifact``: ``get(name)`` decodes only the parent rows ``name`` needs.

    ``ignored`` lists the v1 tensors outside the text model (vision, draft head, DFlash).
    """

    def __init__(self, art: V1Artifact, cfg: ModelConfig) -> None:
        from ninfer.reference.weights import expected_shapes  # canonical HF shapes for this config

        self._art, self.cfg = art, cfg
        self._shapes = expected_shapes(cfg, mtp=True)
        self.ignored: list[str] = []
        self._recipes: dict[str, tuple[str, tuple[_Segment, ...]]] = {}
        segments: dict[str, dict[str, _Segment]] = {}  # canonical layer prefix -> segment -> location
        for name in art.tensor_names():
            if V1_IGNORED.match(name):
                self.ignored.append(name)
            elif name in V1_GLOBALS:
                self._recipes[V1_GLOBALS[name]] = ("rows", (self._whole(name),))
            elif (m := _LAYER.match(name)) and m.group(4) in V1_LAYER_PARENTS:
                prefix = f"layers.{m.group(2)}." if m.group(2) is not None else f"mtp.layers.{m.group(3)}."
                self._locate(name, V1_LAYER_PARENTS[m.group(4)], segments.setdefault(prefix, {}))
            else:
                raise V1FormatError(f"{art.path}: tensor {name!r} has no known role in the v1 naming table")
        for prefix, segs in segments.items():
            for suffix, (how, needs) in V1_CANONICAL.items():
                if all(s in segs for s in needs):
                    self._recipes[prefix + suffix] = (how, tuple(segs[s] for s in needs))
        unknown = sorted(set(self._recipes) - set(self._shapes))
        if unknown:
            raise V1FormatError(f"{art.path}: {unknown[0]!r} is not a tensor of this model configuration")

    def _whole(self, name: str) -> _Segment:
        shape = self._art.entry(name).shape or ()
        return _Segment(name, 0, int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1)

    def _locate(self, name: str, parts: tuple[str, ...], into: dict[str, _Segment]) -> None:
        whole = self._whole(name)
        rows = _segment_rows(self.cfg)
        sizes = [rows[p] for p in parts] if len(parts) > 1 else [whole.r1]
        if sum(sizes) != whole.r1:
            raise V1FormatError(
                f"{self._art.path}: tensor {name!r} has {whole.r1} rows, the config gives "
                f"{' + '.join(f'{p} {n}' for p, n in zip(parts, sizes, strict=True))}"
            )
        r = 0
        for p, n in zip(parts, sizes, strict=True):
            if p in into:
                raise V1FormatError(
                    f"{self._art.path}: tensor {name!r} repeats segment {p!r} of {into[p].parent!r}"
                )
            into[p] = _Segment(name, r, r + n)
            r += n

    def names(self) -> Iterator[str]:
        return iter(self._recipes)

    def __contains__(self, name: object) -> bool:
        return name in self._recipes

    def get(self, name: str) -> np.ndarray:
        try:
            how, segs = self._recipes[name]
        except KeyError:
            raise V1FormatError(f"{self._art.path}: no v1 tensor provides {name!r}") from None
        shape = self._shapes[name]
        parts = [self._art.decode_rows(s.parent, s.r0, s.r1) for s in segs]
        if how == "heads":  # q_proj rows per head: [query D | gate D]
            d = self.cfg.head_dim
            q, g = (p.reshape(self.cfg.num_attention_heads, d, -1) for p in parts)
            out = np.stack([q, g], axis=1)
        elif how == "conv":  # [K, C] tap-major -> [C, 1, K]
            out = parts[0].T[:, None, :]
        else:
            out = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        if out.size != int(np.prod(shape)) or out.shape[-1] != shape[-1]:
            got = [list(self._art.entry(s.parent).shape or ()) for s in segs]
            raise V1FormatError(
                f"{self._art.path}: {name!r} from {segs[0].parent!r} (shape {got[0]}) does not fit the "
                f"config's shape {list(shape)}"
            )
        return np.ascontiguousarray(out, dtype=np.float32).reshape(shape)
