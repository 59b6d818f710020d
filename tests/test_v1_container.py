"""Upstream v1 container: round trips through tests/v1_writer.py and strict rejection of malformed files."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from v1_writer import (  # noqa: E402
    FRONTEND,
    assign_27b,
    assign_35b,
    assign_bf16,
    encode_parents,
    extras,
    fuse,
    random_canonical,
    tiny_config,
    write_v1,
)

from ninfer.artifact.v1 import V1Artifact, V1FormatError  # noqa: E402
from ninfer.formats import FORMATS, bf16_round  # noqa: E402
from ninfer.reference.weights import expected_shapes  # noqa: E402

MODEL = {False: "qwen3.6-27b", True: "qwen3.6-35b-a3b"}


def _write(tmp_path: Path, moe: bool, assign, seed: int = 0, **kw):
    cfg = tiny_config(moe)
    w = random_canonical(cfg, seed)
    tensors = encode_parents(fuse(cfg, w, split=not moe) + extras(cfg, seed + 1), assign)
    path = tmp_path / f"{MODEL[moe]}.ninfer"
    write_v1(path, MODEL[moe], tensors, **kw)
    return path, cfg, w, tensors


# ---- round trips -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("moe", [False, True])
def test_bf16_round_trip_exact(tmp_path, moe):
    path, cfg, w, _ = _write(tmp_path, moe, assign_bf16)
    with V1Artifact.open(path) as art:
        assert art.model_id == MODEL[moe] and art.registered
        assert art.resource_names() == list(FRONTEND)
        assert art.resource("frontend/chat_template.jinja") == FRONTEND["frontend/chat_template.jinja"]
        cw = art.canonical_weights(cfg)
        assert sorted(cw.ignored) == ["draft_head.token_ids", "draft_head.weight", "vision.patch_embedding"]
        shapes = expected_shapes(cfg, mtp=True)
        assert set(cw.names()) == set(shapes) and "lm_head.weight" in cw and "x" not in cw
        for name, orig in w.items():
            want = orig if name.endswith(("A_log", "dt_bias")) else bf16_round(orig)
            got = cw.get(name)
            assert got.dtype == np.float32 and got.shape == shapes[name]
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("moe", [False, True])
def test_quantized_round_trip_matches_dequantized_parents(tmp_path, moe):
    """Re-fusing the canonical view must give exactly the dequantized parents (fuse is an element bijection),
    and every element stays within its format's bound of the fp32 source."""
    path, cfg, w, tensors = _write(tmp_path, moe, assign_35b if moe else assign_27b, seed=3)
    fmts = {t["format"] for t in tensors}
    assert {"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16", "FP32", "I32"} <= fmts
    with V1Artifact.open(path) as art:
        cw = art.canonical_weights(cfg)
        refused = dict(fuse(cfg, {n: cw.get(n) for n in cw.names()}, split=not moe))
        for t in tensors:
            if t["name"] not in refused:
                continue
            fmt = FORMATS[t["format"]]
            np.testing.assert_array_equal(
                refused[t["name"]], fmt.decode(t["data"], t["shape"]), err_msg=t["name"]
            )
        for name, orig in fuse(cfg, w, split=not moe):
            entry = art.entry(name)
            got = refused[name]
            if entry.format == "FP32":
                np.testing.assert_array_equal(got, orig)
            elif entry.format == "BF16":
                np.testing.assert_array_equal(got, bf16_round(orig))
            else:  # group-int: half a step (docs/formats.md §2 scales are normal f16 here)
                fmt = FORMATS[entry.format]
                s = fmt.views(art.raw(name), entry.shape)["scale"].astype(np.float32)
                per = np.repeat(s, fmt.group, axis=1)[:, : orig.shape[-1]]
                assert (np.abs(got - orig) <= per * (0.5 + fmt.qmax * 2.0**-23)).all(), name


def test_decode_rows_and_raw_views(tmp_path):
    path, cfg, w, _ = _write(tmp_path, False, assign_27b)
    with V1Artifact.open(path) as art:
        emb = art.decode("text.embedding")
        np.testing.assert_array_equal(art.decode_rows("text.embedding", 17, 40), emb[17:40])
        assert np.abs(emb - w["embed_tokens.weight"]).max() < 0.05
        raw = art.raw("text.embedding")
        assert isinstance(raw.base, np.memmap) or isinstance(raw, np.memmap)
        assert raw.size == FORMATS["Q6G64_F16S"].encoded_size((256, 64))
        ids = art.decode("draft_head.token_ids")
        assert ids.dtype == np.int32 and len(set(ids.tolist())) == 32
        assert art.objects[0].kind == "resource" and art.payload_offset % 4096 == 0
        with pytest.raises(V1FormatError, match="no object named 'nope'"):
            art.raw("nope")
        with pytest.raises(V1FormatError, match="is a resource"):
            art.decode("frontend/tokenizer.json")
        with pytest.raises(V1FormatError, match="row range"):
            art.decode_rows("text.embedding", 0, 257)
    np.testing.assert_array_equal(
        raw[:64], FORMATS["Q6G64_F16S"].encode(w["embed_tokens.weight"])[:64]
    )  # view survives
    with pytest.raises(V1FormatError, match="closed"):
        art.raw("text.embedding")


def test_unknown_model_id_inspectable_but_flagged(tmp_path):
    cfg = tiny_config(False)
    tensors = encode_parents(fuse(cfg, random_canonical(cfg, 0), split=True), assign_bf16)
    write_v1(tmp_path / "m.ninfer", "qwen9-1t", tensors)
    with V1Artifact.open(tmp_path / "m.ninfer") as art:
        assert not art.registered and art.model_id == "qwen9-1t"
        assert art.decode("text.final_norm").shape == (64,)
        with pytest.raises(V1FormatError, match="'qwen9-1t' is not registered.*inspected but not executed"):
            art.canonical_weights(cfg)


def test_canonical_view_rejects_mismatched_config(tmp_path):
    path, cfg, _, _ = _write(tmp_path, False, assign_bf16)
    other = tiny_config(True)
    with V1Artifact.open(path) as art:
        with pytest.raises(V1FormatError, match="arch 'qwen3_5_moe' does not match"):
            art.canonical_weights(other)
        with pytest.raises(
            V1FormatError, match="text.layers.0.gdn.query_key.*has 64 rows, the config gives gq 2048"
        ):
            art.canonical_weights()  # the pinned 27B dims do not fit the tiny file


# ---- rejection -----------------------------------------------------------------------------------------
def _open_edited(tmp_path, edit):
    path, *_ = _write(tmp_path, False, assign_27b, edit=edit)
    return V1Artifact.open(path)


def _tensor(d, name="text.embedding"):
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
        r"objects\[2\] 'text.embedding': .*unexpected members \['sha256'\]",
    ),
    ("missing member", lambda d: _tensor(d).pop("layout"), r"'text.embedding': missing members \['layout'\]"),
    ("null member", lambda d: _tensor(d).update(format=None), r"'text.embedding': member 'format' is null"),
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
        r"'text.embedding': offset \d+ is not 256-byte aligned",
    ),
    (
        "overlap",
        lambda d: _tensor(d, "text.layers.0.input_norm").update(offset=_tensor(d)["offset"]),
        r"'text.layers.0.input_norm': offset \d+ overlaps",
    ),
    (
        "wrong size",
        lambda d: _tensor(d).update(bytes=_tensor(d)["bytes"] - 256),
        r"'text.embedding': bytes \d+ != \d+, the size of Q6G64_F16S \[256, 64\]",
    ),
    (
        "unknown format",
        lambda d: _tensor(d).update(format="NVFP4G16_E4M3S"),
        r"member 'format' must be one of BF16 .*got 'NVFP4G16_E4M3S'",
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
        lambda d: _tensor(d, "text.layers.0.input_norm").update(name="text.embedding"),
        r"duplicate name",
    ),
    ("root type", lambda d: d.update(objects={}), r"member 'objects' must be a list"),
    ("object type", lambda d: d["objects"].append([1]), r"objects\[\d+\]: must be a JSON object, got list"),
    ("model_id type", lambda d: d.update(model_id=7), r"member 'model_id' must be a string, got 7"),
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
    path, *_ = _write(tmp_path, False, assign_27b)
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
            V1Artifact.open(bad)
    with pytest.raises(V1FormatError, match="cannot open"):
        V1Artifact.open(tmp_path / "missing.ninfer")


def test_rejects_bad_json(tmp_path):
    path, *_ = _write(tmp_path, False, assign_27b)
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
            V1Artifact.open(path)


def test_unknown_role_and_illegal_code(tmp_path):
    cfg = tiny_config(False)
    tensors = encode_parents(fuse(cfg, random_canonical(cfg, 0), split=True), assign_27b)
    w8 = next(t for t in tensors if t["format"] == "W8G32_F16S")
    w8["data"] = w8["data"].copy()
    w8["data"][0] = 0x80
    tensors.append(dict(tensors[1], name="text.layers.0.mystery"))
    write_v1(tmp_path / "m.ninfer", "qwen3.6-27b", tensors)
    with V1Artifact.open(tmp_path / "m.ninfer") as art:
        with pytest.raises(V1FormatError, match=f"tensor '{w8['name']}': W8G32_F16S: illegal code 0x80"):
            art.decode(w8["name"])
        with pytest.raises(V1FormatError, match="'text.layers.0.mystery' has no known role"):
            art.canonical_weights(cfg)
