"""Upstream v1 files: the container (framing, directory, ranges), the binding of upstream's names to canonical
tensors and groups, decoding to the values upstream's quantizer encoded, and strict rejection of malformed files.
Files come from tests/v1_writer.py (byte-identical to upstream's writer: tests/upstream_crosscheck.py)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from v1_writer import (  # noqa: E402
    FRONTEND,
    MODEL,
    V1Tensor,
    inventory,
    random_canonical,
    tiny_config,
    upstream_values,
    write_tiny,
)

from ninfer.artifact.upstream import UpstreamArtifact  # noqa: E402
from ninfer.artifact.v1_container import V1Container, V1FormatError  # noqa: E402
from ninfer.formats import FORMATS, bf16_round  # noqa: E402
from ninfer.reference.weights import expected_shapes  # noqa: E402


def _write(tmp_path: Path, moe: bool, bf16: bool = False, seed: int = 0, **kw):
    cfg = tiny_config(moe)
    w = random_canonical(cfg, seed)
    path = tmp_path / f"{MODEL[moe]}.ninfer"
    kw.setdefault("resources", FRONTEND)
    write_tiny(path, cfg, w, bf16=bf16, **kw)
    return path, cfg, w


# ---- round trips -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("moe", [False, True])
def test_bf16_round_trip_exact(tmp_path, moe):
    path, cfg, w = _write(tmp_path, moe, bf16=True)
    art = UpstreamArtifact(path, cfg)
    assert art.model_id == MODEL[moe] and art.v1.resource_names() == list(FRONTEND)
    assert art.resource("chat_template") == FRONTEND["frontend/chat_template.jinja"]
    assert len(art.groups["vision"]) == 33 and len(art.groups["draft_head"]) == 2
    assert len(art.groups["dflash"]) == (19 if moe else 0) and len(art.groups["mtp"]) == (15 if moe else 12)
    shapes = expected_shapes(cfg, mtp=True)
    assert set(art.tensor_names()) == set(shapes)
    weights = art.weights()
    for name, orig in w.items():
        want = orig if name.endswith(("A_log", "dt_bias")) else bf16_round(orig)
        got = weights.get(name)
        assert got.dtype == np.float32 and got.shape == shapes[name]
        np.testing.assert_array_equal(got, want, err_msg=name)
    emb = weights.get_rows("embed_tokens.weight", np.array([3, 3, 200]))
    np.testing.assert_array_equal(emb, bf16_round(w["embed_tokens.weight"])[[3, 3, 200]])


@pytest.mark.parametrize("moe", [False, True])
def test_objects_decode_to_upstreams_encoding(tmp_path, moe):
    """Every object's bytes are the encoder's (== upstream's quantizer, tests/upstream_crosscheck.py) and decode to
    its values; re-fusing the canonical view gives exactly the decoded parents (the binding is an element
    bijection), and widened canonical tensors (27B q_proj, in_proj_qkv) keep every value."""
    path, cfg, w = _write(tmp_path, moe, seed=3)
    values = upstream_values(cfg, w)
    art = UpstreamArtifact(path, cfg)
    fmts = {o.format for o in art.v1.objects if o.kind == "tensor"}
    assert {"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16", "FP32", "I32"} <= fmts
    decoded = {}
    for o in art.v1.objects:
        if o.kind != "tensor":
            continue
        x = values[o.name]
        enc = FORMATS[o.format].encode(x, o.shape) if o.format != "I32" else x.astype("<i4").view(np.uint8)
        np.testing.assert_array_equal(art.v1.raw(o.name), enc.reshape(-1), err_msg=o.name)
        decoded[o.name] = art.v1.decode(o.name)
    refused = upstream_values(cfg, {n: art.tensor(n) for n in art.tensor_names()})
    for name in art.groups["text"] + art.groups["mtp"]:
        np.testing.assert_array_equal(refused[name], decoded[name], err_msg=name)
    if not moe:
        assert art.tensor_info("layers.3.self_attn.q_proj.weight")["format"] == "Q5G64_F16S"
        assert art.tensor_info("layers.0.linear_attn.in_proj_qkv.weight")["format"] == "Q5G64_F16S"
        assert art.tensor_info("layers.0.mlp.down_proj.weight")["format"] == "Q5G64_F16S"
    raw = art.raw("lm_head.weight")
    assert isinstance(raw.base, np.memmap) or isinstance(raw, np.memmap)  # a whole parent is a view


def test_container_views_and_errors(tmp_path):
    path, cfg, w = _write(tmp_path, False)
    with V1Container.open(path) as art:
        emb = art.decode("text/token_embedding")
        np.testing.assert_array_equal(art.decode_rows("text/token_embedding", 17, 40), emb[17:40])
        assert np.abs(emb - w["embed_tokens.weight"]).max() < 0.05
        raw = art.raw("text/token_embedding")
        assert raw.size == FORMATS["Q6G64_F16S"].encoded_size((256, 64))
        ids = art.decode("text/draft_head_token_ids")
        assert ids.dtype == np.int32 and len(set(ids.tolist())) == 32
        assert [o.kind for o in art.objects[:7]] == ["resource"] * 6 + [
            "tensor"
        ] and art.payload_offset % 4096 == 0
        assert (
            art.objects[6].offset % 256 == 0
            and art.objects[5].offset + art.objects[5].bytes <= art.objects[6].offset
        )
        with pytest.raises(V1FormatError, match="no object named 'nope'"):
            art.raw("nope")
        with pytest.raises(V1FormatError, match="is a resource"):
            art.decode("frontend/tokenizer.json")
        with pytest.raises(V1FormatError, match="row range"):
            art.decode_rows("text/token_embedding", 0, 257)
    np.testing.assert_array_equal(raw[:64], FORMATS["Q6G64_F16S"].encode(w["embed_tokens.weight"])[:64])
    with pytest.raises(V1FormatError, match="closed"):
        art.raw("text/token_embedding")


def test_unknown_model_id_inspectable_not_served(tmp_path):
    path, cfg, _ = _write(tmp_path, False, bf16=True, model_id="qwen9-1t")
    with V1Container.open(path) as art:
        assert art.model_id == "qwen9-1t" and art.decode("text/final_norm").shape == (64,)
    with pytest.raises(ValueError, match="'qwen9-1t' is not registered for v1 files"):
        UpstreamArtifact(path, cfg)


def test_binding_rejects_a_mismatched_config(tmp_path):
    path, cfg, _ = _write(tmp_path, False, bf16=True)
    with pytest.raises(ValueError, match="config architecture 'qwen3_5_moe'"):
        UpstreamArtifact(path, tiny_config(True))
    from dataclasses import replace

    with pytest.raises(
        V1FormatError, match=r"'text/layers/0/mlp/gate_up' has shape \[256, 64\], expected \[512, 64\]"
    ):
        UpstreamArtifact(path, replace(cfg, intermediate_size=256))


def _drop(name):
    return lambda inv: [t for t in inv if t.name != name]


BIND_REJECT = [
    (
        "missing text object",
        _drop("text/layers/2/gdn/norm"),
        r"text model: object 'text/layers/2/gdn/norm' is missing",
    ),
    (
        "missing vision object",
        _drop("vision/layers/1/norm2/bias"),
        r"vision: object 'vision/layers/1/norm2/bias' is missing",
    ),
    (
        "unknown object",
        lambda inv: [*inv, V1Tensor("text/layers/0/mystery", (4, 64), "BF16")],
        r"object 'text/layers/0/mystery' has no role",
    ),
    (
        "extra vision object",
        lambda inv: [*inv, V1Tensor("vision/layers/0/extra", (4,), "BF16")],
        r"vision: object 'vision/layers/0/extra' has no role",
    ),
    (
        "norm as a grouped format",
        lambda inv: [
            V1Tensor(t.name, t.shape, "I32" if t.name == "text/final_norm" else t.format) for t in inv
        ],
        r"object 'text/final_norm' is stored as I32; a vector takes one of BF16, FP32",
    ),
    (
        "merger width",
        lambda inv: [
            V1Tensor(t.name, (32, 128) if t.name == "vision/merger/fc2" else t.shape, t.format) for t in inv
        ],
        r"vision: object 'vision/merger/fc2' has shape \[32, 128\], expected \[64, 128\]",
    ),
]


@pytest.mark.parametrize(
    "change,pattern", [(c, p) for _, c, p in BIND_REJECT], ids=[n for n, _, _ in BIND_REJECT]
)
def test_binding_rejects(tmp_path, change, pattern):
    cfg = tiny_config(False)
    w = random_canonical(cfg, 0)
    values = upstream_values(cfg, w)
    inv = change(inventory(cfg))
    for t in inv:
        if t.name not in values or values[t.name].shape != t.shape:
            values[t.name] = np.zeros(t.shape, np.float32)
    write_tiny(tmp_path / "b.ninfer", cfg, w, tensors=inv, values=values)
    with pytest.raises(V1FormatError, match=pattern):
        UpstreamArtifact(tmp_path / "b.ninfer", cfg)


# ---- rejection -----------------------------------------------------------------------------------------
def _open_edited(tmp_path, edit):
    path, *_ = _write(tmp_path, False, edit=edit)
    return V1Container.open(path)


def _tensor(d, name="text/token_embedding"):
    return next(o for o in d["objects"] if o["name"] == name)


REJECT = [
    (
        "extra root member",
        lambda d: d.update(checksum="x"),
        r"directory: missing members \[\], unexpected members \['checksum'\]",
    ),
    (
        "extra object member",
        lambda d: _tensor(d).update(sha256="0"),
        r"objects\[6\] 'text/token_embedding': .*unexpected members \['sha256'\]",
    ),
    (
        "missing member",
        lambda d: _tensor(d).pop("layout"),
        r"'text/token_embedding': missing members \['layout'\]",
    ),
    (
        "null member",
        lambda d: _tensor(d).update(format=None),
        r"'text/token_embedding': member 'format' is null",
    ),
    (
        "bool as int",
        lambda d: d["objects"][0].update(offset=False),
        r"objects\[0\] .*member 'offset' must be an integer >= 0, got False",
    ),
    (
        "bool in shape",
        lambda d: _tensor(d).update(shape=[True, 64]),
        r"member 'shape' must be a list of integers > 0",
    ),
    ("float offset", lambda d: _tensor(d).update(offset=256.0), r"member 'offset' must be an integer"),
    (
        "misaligned",
        lambda d: _tensor(d).update(offset=_tensor(d)["offset"] + 16),
        r"'text/token_embedding': offset \d+ is not 256-byte aligned",
    ),
    (
        "overlap",
        lambda d: _tensor(d, "text/layers/0/input_norm").update(offset=_tensor(d)["offset"]),
        r"'text/layers/0/input_norm': offset \d+ overlaps",
    ),
    (
        "wrong size",
        lambda d: _tensor(d).update(bytes=_tensor(d)["bytes"] - 256),
        r"'text/token_embedding': bytes \d+ != \d+, the size of Q6G64_F16S \[256, 64\]",
    ),
    (
        "unknown format",
        lambda d: _tensor(d).update(format="NVFP4G16_E4M3S"),
        r"format 'NVFP4G16_E4M3S': upstream v1 defines no FP4/FP8 format.*not known yet",
    ),
    (
        "format/layout",
        lambda d: _tensor(d).update(layout="contiguous-le-v1"),
        r"format Q6G64_F16S cannot use layout contiguous-le-v1",
    ),
    ("rank", lambda d: _tensor(d).update(shape=[4, 64, 64]), r"layout row-split-k128-v1 needs rank 2..2"),
    ("kind", lambda d: _tensor(d).update(kind="blob"), r"member 'kind' must be 'tensor' or 'resource'"),
    (
        "encoding",
        lambda d: d["objects"][0].update(encoding="gzip"),
        r"member 'encoding' must be 'raw-bytes-v1'",
    ),
    (
        "duplicate name",
        lambda d: _tensor(d, "text/layers/0/input_norm").update(name="text/token_embedding"),
        r"duplicate name",
    ),
    ("root type", lambda d: d.update(objects={}), r"member 'objects' must be a non-empty list"),
    ("empty resource", lambda d: d["objects"][0].update(bytes=0), r"member 'bytes' must be an integer > 0"),
    ("object type", lambda d: d["objects"].append([1]), r"objects\[\d+\]: must be a JSON object, got list"),
    ("model_id type", lambda d: d.update(model_id=7), r"member 'model_id' must be a non-empty string, got 7"),
    ("empty name", lambda d: _tensor(d).update(name=""), r"member 'name' must be a non-empty string"),
    (
        "zero dim",
        lambda d: _tensor(d).update(shape=[0, 64]),
        r"member 'shape' must be a list of integers > 0",
    ),
]


@pytest.mark.parametrize("edit,pattern", [(e, p) for _, e, p in REJECT], ids=[n for n, _, _ in REJECT])
def test_rejects_bad_directory(tmp_path, edit, pattern):
    with pytest.raises(V1FormatError, match=pattern):
        _open_edited(tmp_path, edit)


def _rewrite_json(path: Path, text: bytes) -> None:
    data = bytearray(path.read_bytes())
    old = struct.unpack("<Q", data[8:16])[0]
    assert len(text) <= old
    data[8:16] = struct.pack("<Q", len(text))
    data[16 : 16 + old] = text + bytes(old - len(text))
    path.write_bytes(bytes(data))


def test_rejects_bad_framing(tmp_path):
    path, *_ = _write(tmp_path, False)
    good = path.read_bytes()
    bad = tmp_path / "bad.ninfer"
    cases = [
        (b"NINFPY\x00\x01" + good[8:], r"bad magic b'NINFPY\\x00\\x01'"),
        (good[:7] + b"\x02" + good[8:], "unsupported v1 framing revision 2"),
        (good[:10], "shorter than the 16-byte v1 prefix"),
        (good[:100], r"json_bytes \d+ does not fit the 100-byte file"),
        (
            good[: len(good) - 1000],
            r"ends at payload byte \d+, past the payload's \d+ bytes|past the payload's",
        ),
        (good[:8] + struct.pack("<Q", 0) + good[16:], "json_bytes 0"),
    ]
    for data, pattern in cases:
        bad.write_bytes(data)
        with pytest.raises(V1FormatError, match=pattern):
            V1Container.open(bad)
    with pytest.raises(V1FormatError, match="cannot open"):
        V1Container.open(tmp_path / "missing.ninfer")


def test_rejects_bad_json(tmp_path):
    path, *_ = _write(tmp_path, False)
    good = path.read_bytes()
    cases = [
        (b'{"model_id":"a","model_id":"b","objects":[]}', "duplicate JSON member 'model_id'"),
        (b'{"model_id":"a","objects":[{"name":"x","kind":"tensor","shape":[NaN]}]}', "JSON constant NaN"),
        (b'{"model_id":"\xff","objects":[]}', "directory is not UTF-8"),
        (b'{"model_id":"a","objects":[', "directory is not valid JSON"),
        (b'["model_id"]', "directory: must be a JSON object"),
    ]
    for text, pattern in cases:
        path.write_bytes(good)
        _rewrite_json(path, text)
        with pytest.raises(V1FormatError, match=pattern):
            V1Container.open(path)


def test_illegal_w8_code_is_refused_on_decode(tmp_path):
    path, cfg, w = _write(tmp_path, False)
    art = UpstreamArtifact(path, cfg)
    name = "mtp/input_projection"
    off = art.v1.payload_offset + art.v1.entry(name).offset
    data = bytearray(path.read_bytes())
    data[off] = 0x80
    path.write_bytes(bytes(data))
    with V1Container.open(path) as bad:
        with pytest.raises(V1FormatError, match=f"tensor '{name}': W8G32_F16S: illegal code 0x80"):
            bad.decode(name)
    with pytest.raises(ValueError, match="illegal code 0x80"):
        UpstreamArtifact(path, cfg).verify_blobs()


def test_negative_scale_fails_verification(tmp_path):
    path, cfg, w = _write(tmp_path, False)
    art = UpstreamArtifact(path, cfg)
    o = art.v1.entry("text/layers/0/mlp/down")
    geo = FORMATS[o.format].geometry(o.shape)
    data = bytearray(path.read_bytes())
    data[art.v1.payload_offset + o.offset + geo["sc"] + 1] |= 0x80  # sign bit of the first scale
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="'text/layers/0/mlp/down' has a negative or non-finite group scale"):
        UpstreamArtifact(path, cfg).verify_blobs()


@pytest.mark.parametrize("model", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_real_inventories_bind_to_the_pinned_configs(model):
    """Upstream's real inventories (the writer's, equal to upstream's: tests/upstream_crosscheck.py) bind to the
    pinned configs: every canonical tensor of the text model and MTP head is provided, every object claimed."""
    from ninfer.artifact.registry import MODELS
    from ninfer.artifact.v1_binding import bind
    from ninfer.artifact.v1_container import V1Object
    from ninfer.artifact.v1_writer import DFlashShape, VisionShape, v1_inventory

    cfg = MODELS[model].config
    moe = cfg.is_moe
    inv = v1_inventory(
        cfg,
        draft_rows=131072,
        vision=VisionShape(hidden=1152, mlp=4304, depth=27, positions=2304, patch=1536),
        dflash=DFlashShape(layers=6, features=8, heads=32, kv_heads=8, head_dim=128, mlp=6144),
        q6_routed_down=(34, 38, 39),
    )
    assert len(inv) == (934 if moe else 1118)
    objects = [V1Object(t.name, "tensor", 0, 1, t.shape, t.format, "x") for t in inv]
    b = bind(objects, cfg)
    assert set(b.recipes) == set(expected_shapes(cfg, mtp=True))
    counts = {g: len(n) for g, n in b.groups.items()}
    assert counts["vision"] == 333 and counts["draft_head"] == 2
    assert counts["mtp"] == (15 if moe else 12) and counts["dflash"] == (51 if moe else 0)
    assert sum(counts.values()) == len(inv)
