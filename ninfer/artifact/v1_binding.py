"""What every object of an upstream v1 file is (docs/upstream-v1.md §6): upstream's names bound to our canonical
(HF-named) text-model tensors, and the parts kept for later (vision tower, draft head, DFlash drafter).

``bind(objects, cfg)`` checks the whole directory against the inventory that ``cfg`` implies, the way upstream's
binders do: every text/MTP object present with its exact shape and a format of its kind, every canonical tensor
provided, and every other object accounted for by a known group whose shapes agree with each other. Nothing is
silently dropped: an object no role claims is an error.

Forms (upstream's two targets): a dense ``qwen3_5`` model stores its text attention split as ``query_key`` [q; k]
and ``gate_value`` [gate; v] and its GDN projections as ``query_key`` [q; k], ``value_z`` [v; z] and separate a/b;
a ``qwen3_5_moe`` model stores one ``query_key_gate_value`` [q; k; gate; v], one ``query_key_value_z`` [q; k; v; z]
and one ``a_b_projection`` [a; b]. The MTP layer always uses the single ``query_key_gate_value`` form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ninfer.artifact.v1_container import V1FormatError, V1Object
from ninfer.config import ModelConfig

__all__ = ["V1_MODEL_IDS", "Segment", "Recipe", "Binding", "bind", "text_inventory", "GROUPS"]

# model ids a v1 file may carry to be served (upstream's two, and the published Qwen3.8-27B file, which uses the
# 27B layout); any other id can be inspected, not served
V1_MODEL_IDS = ("qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.8-27b")
GROUPS = ("text", "mtp", "draft_head", "vision", "dflash")

_GROUPED = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")
# object kind -> formats it may be stored in
_KINDS: Mapping[str, tuple[str, ...]] = {
    "vector": ("BF16", "FP32"),
    "matrix": ("BF16", *_GROUPED),
    "ids": ("I32",),
}


@dataclass(frozen=True, slots=True)
class Segment:
    """Rows ``[r0, r1)`` of v1 object ``parent`` (its ``[prod(shape[:-1]), shape[-1]]`` row view)."""

    parent: str
    r0: int
    r1: int


@dataclass(frozen=True, slots=True)
class Recipe:
    """How one canonical tensor is made of v1 rows. ``rows``: the segments' rows in order; ``heads``: HF
    ``q_proj``, per head [query rows | gate rows] from segments (query, gate); ``conv``: the stored tap-major
    ``[T, C]`` transposed to HF ``[C, 1, T]``."""

    how: str
    segments: tuple[Segment, ...]


@dataclass(frozen=True, slots=True)
class Binding:
    recipes: dict[str, Recipe]  # canonical name -> recipe (text model and MTP)
    groups: dict[str, tuple[str, ...]]  # group -> v1 object names (every tensor object in exactly one)


Shape = tuple[int, ...]
_Parents = dict[str, tuple[Shape, str]]  # v1 name -> (shape, kind)


class _Inv:
    """Collects expected parents and canonical recipes."""

    def __init__(self) -> None:
        self.parents: _Parents = {}
        self.recipes: dict[str, Recipe] = {}

    def obj(self, name: str, shape: Shape, kind: str = "matrix") -> str:
        self.parents[name] = (shape, kind)
        return name

    def whole(self, canon: str, name: str, shape: Shape, kind: str = "matrix") -> None:
        self.obj(name, shape, kind)
        rows = 1
        for d in shape[:-1]:
            rows *= d
        self.recipes[canon] = Recipe("rows", (Segment(name, 0, rows),))

    def split(self, name: str, cols: int, parts: Iterable[tuple[str, int]]) -> None:
        """Parent ``name`` whose rows are the canonical tensors ``parts`` (name, rows) in order."""
        r = 0
        for canon, n in parts:
            self.recipes[canon] = Recipe("rows", (Segment(name, r, r + n),))
            r += n
        self.obj(name, (r, cols))


def _attention(inv: _Inv, cfg: ModelConfig, src: str, dst: str, split: bool) -> None:
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    a = f"{src}attention/"
    c = f"{dst}self_attn."
    if split:
        qk, gv = inv.obj(a + "query_key", (q + kv, h)), inv.obj(a + "gate_value", (q + kv, h))
        query, key, gate, value = (
            Segment(qk, 0, q),
            Segment(qk, q, q + kv),
            Segment(gv, 0, q),
            Segment(gv, q, q + kv),
        )
    else:
        p = inv.obj(a + "query_key_gate_value", (2 * q + 2 * kv, h))
        query, key = Segment(p, 0, q), Segment(p, q, q + kv)
        gate, value = Segment(p, q + kv, 2 * q + kv), Segment(p, 2 * q + kv, 2 * q + 2 * kv)
    inv.recipes[c + "q_proj.weight"] = Recipe("heads", (query, gate))
    inv.recipes[c + "k_proj.weight"] = Recipe("rows", (key,))
    inv.recipes[c + "v_proj.weight"] = Recipe("rows", (value,))
    inv.whole(c + "q_norm.weight", a + "query_norm", (d,), "vector")
    inv.whole(c + "k_norm.weight", a + "key_norm", (d,), "vector")
    inv.whole(c + "o_proj.weight", a + "output", (h, q))


def _gdn(inv: _Inv, cfg: ModelConfig, src: str, dst: str, split: bool) -> None:
    h, nv, kd, vd = cfg.hidden_size, cfg.linear_num_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim
    g, c = f"{src}gdn/", f"{dst}linear_attn."
    inv.whole(c + "A_log", g + "a_log", (nv,), "vector")
    inv.whole(c + "dt_bias", g + "dt_bias", (nv,), "vector")
    inv.obj(g + "convolution", (cfg.linear_conv_kernel_dim, cfg.gdn_conv_channels), "vector")
    inv.recipes[c + "conv1d.weight"] = Recipe(
        "conv", (Segment(g + "convolution", 0, cfg.linear_conv_kernel_dim),)
    )
    if split:
        inv.whole(c + "in_proj_a.weight", g + "a_projection", (nv, h))
        inv.whole(c + "in_proj_b.weight", g + "b_projection", (nv, h))
        qk, vz = inv.obj(g + "query_key", (2 * kd, h)), inv.obj(g + "value_z", (2 * vd, h))
        qkv = (Segment(qk, 0, 2 * kd), Segment(vz, 0, vd))
        inv.recipes[c + "in_proj_z.weight"] = Recipe("rows", (Segment(vz, vd, 2 * vd),))
    else:
        inv.split(g + "a_b_projection", h, ((c + "in_proj_a.weight", nv), (c + "in_proj_b.weight", nv)))
        p = inv.obj(g + "query_key_value_z", (2 * kd + 2 * vd, h))
        qkv = (Segment(p, 0, 2 * kd + vd),)
        inv.recipes[c + "in_proj_z.weight"] = Recipe("rows", (Segment(p, 2 * kd + vd, 2 * kd + 2 * vd),))
    inv.recipes[c + "in_proj_qkv.weight"] = Recipe("rows", qkv)
    inv.whole(c + "norm.weight", g + "norm", (cfg.linear_value_head_dim,), "vector")
    inv.whole(c + "out_proj.weight", g + "output", (h, vd))


def _ffn(inv: _Inv, cfg: ModelConfig, src: str, dst: str) -> None:
    h, c = cfg.hidden_size, f"{dst}mlp."
    if not cfg.is_moe:
        i = cfg.intermediate_size
        inv.split(f"{src}mlp/gate_up", h, ((c + "gate_proj.weight", i), (c + "up_proj.weight", i)))
        inv.whole(c + "down_proj.weight", f"{src}mlp/down", (h, i))
        return
    e, i, s, m = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size, f"{src}moe/"
    inv.split(m + "router_shared_gate", h, ((c + "gate.weight", e), (c + "shared_expert_gate.weight", 1)))
    inv.whole(c + "experts.gate_up_proj", m + "routed_gate_up", (e * 2 * i, h))
    inv.whole(c + "experts.down_proj", m + "routed_down", (e * h, i))
    se = c + "shared_expert."
    inv.split(m + "shared_gate_up", h, ((se + "gate_proj.weight", s), (se + "up_proj.weight", s)))
    inv.whole(se + "down_proj.weight", m + "shared_down", (h, s))


def _layer(inv: _Inv, cfg: ModelConfig, src: str, dst: str, full: bool, split: bool) -> None:
    h = cfg.hidden_size
    inv.whole(dst + "input_layernorm.weight", src + "input_norm", (h,), "vector")
    if full:
        _attention(inv, cfg, src, dst, split)
    else:
        _gdn(inv, cfg, src, dst, split)
    inv.whole(dst + "post_attention_layernorm.weight", src + "post_attention_norm", (h,), "vector")
    _ffn(inv, cfg, src, dst)


def text_inventory(cfg: ModelConfig) -> tuple[_Parents, dict[str, Recipe], _Parents]:
    """(text parents, canonical recipes, MTP parents) that ``cfg`` implies, in upstream's write order."""
    h, v, split = cfg.hidden_size, cfg.vocab_size, not cfg.is_moe
    inv = _Inv()
    inv.whole("embed_tokens.weight", "text/token_embedding", (v, h))
    for i, kind in enumerate(cfg.layer_types):
        _layer(inv, cfg, f"text/layers/{i}/", f"layers.{i}.", kind == "full_attention", split)
    inv.whole("norm.weight", "text/final_norm", (h,), "vector")
    inv.whole("lm_head.weight", "text/output_head", (v, h))
    text = dict(inv.parents)
    if cfg.mtp_num_hidden_layers:
        if cfg.mtp_num_hidden_layers != 1:
            raise V1FormatError(
                f"v1 files hold one MTP layer; the config asks for {cfg.mtp_num_hidden_layers}"
            )
        inv.whole("mtp.fc.weight", "mtp/input_projection", (h, 2 * h))
        inv.whole("mtp.pre_fc_norm_embedding.weight", "mtp/embedding_norm", (h,), "vector")
        inv.whole("mtp.pre_fc_norm_hidden.weight", "mtp/hidden_norm", (h,), "vector")
        _layer(inv, cfg, "mtp/layer/", "mtp.layers.0.", True, False)
        inv.whole("mtp.norm.weight", "mtp/final_norm", (h,), "vector")
    mtp = {n: s for n, s in inv.parents.items() if n not in text}
    return text, inv.recipes, mtp


# ---- groups kept for later: their own shapes must agree with each other and with the text model ---------------
def _draft(have: Mapping[str, V1Object], cfg: ModelConfig) -> _Parents:
    head = have.get("text/draft_head")
    r = head.shape[0] if head is not None and head.shape else 1
    return {"text/draft_head": ((r, cfg.hidden_size), "matrix"), "text/draft_head_token_ids": ((r,), "ids")}


def _layer_ids(have: Iterable[str], prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"(\d+)/")
    return sorted({int(m.group(1)) for n in have if (m := pat.match(n))})


def _dim(have: Mapping[str, V1Object], name: str, axis: int) -> int:
    o = have.get(name)
    return o.shape[axis] if o is not None and o.shape and len(o.shape) > axis else 1


def _vision(have: Mapping[str, V1Object], cfg: ModelConfig) -> _Parents:
    vh = _dim(have, "vision/patch_embedding_bias", 0)
    vi = _dim(have, "vision/layers/0/mlp/fc1_bias", 0)
    out: _Parents = {
        "vision/patch_embedding": ((vh, _dim(have, "vision/patch_embedding", 1)), "matrix"),
        "vision/patch_embedding_bias": ((vh,), "vector"),
        "vision/position_embedding": ((_dim(have, "vision/position_embedding", 0), vh), "matrix"),
    }
    for b in _layer_ids(have, "vision/layers/") or [0]:
        p = f"vision/layers/{b}/"
        for name, shape in (
            ("attention/qkv", (3 * vh, vh)),
            ("attention/output", (vh, vh)),
            ("mlp/fc1", (vi, vh)),
            ("mlp/fc2", (vh, vi)),
        ):
            out[p + name] = (shape, "matrix")
            out[p + name + "_bias"] = ((shape[0],), "vector")
        for n in ("norm1", "norm2"):
            out[f"{p}{n}/weight"], out[f"{p}{n}/bias"] = ((vh,), "vector"), ((vh,), "vector")
    m = "vision/merger/"
    out.update(
        {
            m + "fc1": ((4 * vh, 4 * vh), "matrix"),
            m + "fc1_bias": ((4 * vh,), "vector"),
            m + "fc2": ((cfg.hidden_size, 4 * vh), "matrix"),
            m + "fc2_bias": ((cfg.hidden_size,), "vector"),
            m + "norm/weight": ((vh,), "vector"),
            m + "norm/bias": ((vh,), "vector"),
        }
    )
    return out


def _dflash(have: Mapping[str, V1Object], cfg: ModelConfig) -> _Parents:
    h = cfg.hidden_size
    feats = _dim(have, "dflash/feature_projection", 1)
    out: _Parents = {
        "dflash/feature_projection": ((h, feats - feats % h if feats >= h else h), "matrix"),
        "dflash/context_norm": ((h,), "vector"),
    }
    for layer in _layer_ids(have, "dflash/layers/") or [0]:
        p = f"dflash/layers/{layer}/"
        fhd, fq = _dim(have, p + "attention/query_norm", 0), _dim(have, p + "attention/output", 1)
        fi = _dim(have, p + "mlp/down", 1)
        out.update(
            {
                p + "input_norm": ((h,), "vector"),
                p + "attention/query_key_value": (
                    (_dim(have, p + "attention/query_key_value", 0), h),
                    "matrix",
                ),
                p + "attention/query_norm": ((fhd,), "vector"),
                p + "attention/key_norm": ((fhd,), "vector"),
                p + "attention/output": ((h, fq), "matrix"),
                p + "post_attention_norm": ((h,), "vector"),
                p + "mlp/gate_up": ((2 * fi, h), "matrix"),
                p + "mlp/down": ((h, fi), "matrix"),
            }
        )
    out["dflash/final_norm"] = ((h,), "vector")
    return out


def _check(group: str, expected: _Parents, have: Mapping[str, V1Object]) -> None:
    missing = [n for n in expected if n not in have]
    if missing:
        raise V1FormatError(f"{group}: object {missing[0]!r} is missing ({len(missing)} missing in all)")
    for name, (shape, kind) in expected.items():
        o = have[name]
        if o.kind != "tensor":
            raise V1FormatError(f"object {name!r} must be a tensor, not a {o.kind}")
        if o.shape != shape:
            raise V1FormatError(
                f"{group}: object {name!r} has shape {list(o.shape or ())}, expected {list(shape)}"
            )
        if o.format not in _KINDS[kind]:
            raise V1FormatError(
                f"{group}: object {name!r} is stored as {o.format}; a {kind} takes one of {', '.join(_KINDS[kind])}"
            )


def bind(objects: Iterable[V1Object], cfg: ModelConfig) -> Binding:
    """Bind a v1 directory to ``cfg`` (see the module docstring); raises ``V1FormatError`` naming the object."""
    have = {o.name: o for o in objects if o.kind == "tensor"}
    text, recipes, mtp = text_inventory(cfg)
    _check("text model", text, have)
    _check("MTP layer", mtp, have)
    groups: dict[str, tuple[str, ...]] = {"text": tuple(text), "mtp": tuple(mtp)}
    for group, prefix, expect in (
        ("draft_head", "text/draft_head", _draft),
        ("vision", "vision/", _vision),
        ("dflash", "dflash/", _dflash),
    ):
        present = tuple(n for n in have if n.startswith(prefix))
        if present:
            expected = expect(have, cfg)
            _check(group.replace("_", " "), expected, have)
            extra = [n for n in present if n not in expected]
            if extra:
                raise V1FormatError(f"{group.replace('_', ' ')}: object {extra[0]!r} has no role")
        groups[group] = present
    claimed = {n for names in groups.values() for n in names}
    unknown = [n for n in have if n not in claimed]
    if unknown:
        raise V1FormatError(
            f"object {unknown[0]!r} has no role in a {cfg.arch} v1 file ({len(unknown)} unknown)"
        )
    return Binding(recipes, groups)
