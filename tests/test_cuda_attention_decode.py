"""Split-KV attention (cuda_src/attention.cu ``attention``) on the GPU against the NumPy reference, and its invariants.

Fresh random inputs per case, outputs poisoned with NaN before each launch; bf16, fp8 (e4m3 codes + per-row
scales, the reference runner's encoding) and fp32 caches; float and bf16 queries; GQA groups 1, 2, 6, 8; every
head dim; 1, 3 and 8 sequences with lengths 1, off the page and the chunk, and long enough for two merge levels.
Invariants: a row alone equals the row within a batch bitwise (whatever ``max_len`` and the other rows), a prefill
row equals its decode row bitwise, repeated launches and CUDA-graph replays give the same bits (the arrival
counters are zero again after every launch), and row-batched launches (capped workspace) change nothing.
Skipped without a CUDA device (conftest); tests/test_attention_decode_host.py runs the same kernel on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.artifact.registry import MODELS
from ninfer.engine.model_runner import PagedKVStore
from ninfer.formats import bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
TOL = {"float": 1e-4, "bf16": 1.2e-2}


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _cache(cp: Any, rng: np.random.Generator, lens: list[int], hkv: int, d: int, ct: str, page: int) -> dict:
    """Device cache (scattered pages, a spare table column) and per sequence the K/V values the kernel must see."""
    per = [max(1, -(-n // page)) for n in lens]
    total = sum(per) + 3
    perm = rng.permutation(total).astype(np.int32)
    table = np.zeros((len(lens), max(per) + 1), np.int32)
    at = 0
    for b, p in enumerate(per):
        table[b, :p] = perm[at : at + p]
        at += p
    shape = (total, page, hkv, d)
    out: dict = {"table": cp.asarray(table), "scales": {}}
    for name in ("k", "v"):
        x = rng.standard_normal(shape).astype(F32)
        if ct == "fp8":
            store = PagedKVStore(MODELS["ninfer-demo"].config, num_pages=1, page_size=1, dtype="fp8")
            codes, sc = store._encode(x * np.exp2(rng.uniform(-2, 2, shape[:3] + (1,))).astype(F32))
            out[name], val = cp.asarray(codes), store._decode(codes, sc)
            out["scales"][name + "_scale"] = cp.asarray(sc.astype(F32))
        elif ct == "bf16":
            val = bf16_round(x)
            out[name] = cp.asarray(bf16_encode(val))
        else:
            val = x
            out[name] = cp.asarray(x)
        out[name + "seq"] = [val[table[b, : per[b]]].reshape(-1, hkv, d) for b in range(len(lens))]
    return out


def _q(cp: Any, q: np.ndarray, t: str) -> Any:
    return cp.asarray(bf16_encode(q) if t == "bf16" else q)


def _host(cp: Any, a: Any) -> np.ndarray:
    h = cp.asnumpy(a)
    return bf16_decode(h) if h.dtype == np.uint16 else h


def _run(cp: Any, c: dict, q: np.ndarray, seq: np.ndarray, pos: np.ndarray, t: str, **kw: Any) -> Any:
    from ninfer.cuda.attention import attention

    out = cp.full(q.shape, 0x7FC0, np.uint16) if t == "bf16" else cp.full(q.shape, np.nan, F32)
    attention(_q(cp, q, t), c["k"], c["v"], c["table"], cp.asarray(seq), cp.asarray(pos), out=out, **c["scales"],
              **kw)  # fmt: skip
    return out


def _ref(c: dict, q: np.ndarray, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return np.stack([
        ops.attention(q[i : i + 1], c["kseq"][s][: p + 1], c["vseq"][s][: p + 1], p)[0]
        for i, (s, p) in enumerate(zip(seq.tolist(), pos.tolist(), strict=True))
    ])  # fmt: skip


def _close(name: str, got: np.ndarray, ref: np.ndarray, tol: float) -> None:
    assert np.isfinite(got).all(), f"{name}: non-finite output ({np.count_nonzero(~np.isfinite(got))} values)"
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    assert err <= tol, f"{name}: normalised max error {err:.3e} > {tol:.1e}"


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16 if a.dtype == np.uint16 else np.uint32)


# (hq, hkv, d, page, lens): GQA 6 at the 27B head dim (1 and 8 sequences), 1 and 2 at the others, 8 (the widest
# group); lengths 1, off the page and the 128/64 chunk, a page exactly, and 2100 (17 splits of 128: two merge levels).
SHAPES = (
    (24, 4, 256, 16, [2100]),
    (24, 4, 256, 16, [1, 129, 700, 16, 2100, 3, 255, 1000]),
    (6, 1, 256, 8, [700, 3, 64]),
    (4, 2, 128, 32, [1, 300, 97]),
    (2, 2, 64, 16, [65, 1, 130]),
    (8, 1, 32, 4, [17, 2, 40]),
)


@pytest.mark.parametrize("ct", ["bf16", "fp8", "fp32"])
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_attention_decode_vs_reference(cp: Any, t: str, ct: str) -> None:
    rng = np.random.default_rng(31)
    for hq, hkv, d, page, lens in SHAPES:
        c = _cache(cp, rng, lens, hkv, d, ct, page)
        q = rng.standard_normal((len(lens), hq, d)).astype(F32)
        q = bf16_round(q) if t == "bf16" else q
        seq, pos = np.arange(len(lens), dtype=np.int32), np.array(lens, np.int32) - 1
        ref = _ref(c, q, seq, pos)
        for chunk in (128, 64, None):
            got = _host(cp, _run(cp, c, q, seq, pos, t, max_len=max(lens), chunk=chunk))
            _close(
                f"{t}/{ct} hq={hq} hkv={hkv} d={d} page={page} lens={lens} chunk={chunk}", got, ref, TOL[t]
            )


@pytest.mark.parametrize("ct", ["bf16", "fp8"])
def test_attention_row_alone_equals_row_in_batch(cp: Any, ct: str) -> None:
    """Every row of an 8-sequence batch (and of a 3-sequence batch in another order) launched alone with its own
    max_len gives the same bits; so do repeated launches and a larger max_len."""
    rng = np.random.default_rng(32)
    lens = [2100, 1, 129, 700, 16, 3000, 255, 64]
    c = _cache(cp, rng, lens, 4, 256, ct, 16)
    q = rng.standard_normal((len(lens), 24, 256)).astype(F32)
    seq, pos = np.arange(8, dtype=np.int32), np.array(lens, np.int32) - 1
    full = cp.asnumpy(_run(cp, c, q, seq, pos, "float", max_len=max(lens), chunk=128))
    for _ in range(2):
        cap = (
            c["table"].shape[1] * 16
        )  # the table's whole capacity (a decode graph launches with its capacity)
        again = cp.asnumpy(_run(cp, c, q, seq, pos, "float", max_len=cap, chunk=128))
        assert np.array_equal(_bits(again), _bits(full)), "repeated launch (or a larger max_len) changed bits"
    for b in range(8):
        alone = cp.asnumpy(_run(cp, c, q[b : b + 1], seq[b : b + 1], pos[b : b + 1], "float", max_len=lens[b],
                                chunk=128))  # fmt: skip
        assert np.array_equal(_bits(alone[0]), _bits(full[b])), (
            f"row {b} (len {lens[b]}) depends on the batch"
        )
    sub = [6, 0, 3]
    three = cp.asnumpy(_run(cp, c, q[sub], seq[sub], pos[sub], "float", max_len=3000, chunk=128))
    assert np.array_equal(_bits(three), _bits(full[sub])), "rows depend on their order or neighbours"


@pytest.mark.parametrize("t", ["float", "bf16"])
def test_attention_prefill_rows_equal_decode_rows(cp: Any, t: str) -> None:
    """Rows of one sequence at consecutive positions in one launch (prefill through the split kernel) equal the
    same positions decoded one at a time, bitwise, and follow the reference."""
    rng = np.random.default_rng(33)
    n = 300
    c = _cache(cp, rng, [n], 2, 128, "bf16", 16)
    q = rng.standard_normal((n, 12, 128)).astype(F32)
    q = bf16_round(q) if t == "bf16" else q
    seq, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    pre = _run(cp, c, q, seq, pos, t, max_len=n, chunk=128)
    _close(f"prefill rows {t}", _host(cp, pre), _ref(c, q, seq, pos), TOL[t])
    pre = cp.asnumpy(pre)
    for p in (0, 1, 127, 128, 255, 256, 299):
        one = cp.asnumpy(_run(cp, c, q[p : p + 1], seq[:1], pos[p : p + 1], t, max_len=p + 1, chunk=128))
        assert np.array_equal(_bits(one[0]), _bits(pre[p])), f"prefill row {p} != its decode"


def test_attention_graph_replay_and_row_batches(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured in a CUDA graph (several launches back to back, replayed twice) and run as row batches of a capped
    workspace, the kernel gives the eager bits."""
    import ninfer.cuda.attention as att

    rng = np.random.default_rng(34)
    lens = [4000, 9, 1500]
    c = _cache(cp, rng, lens, 4, 256, "bf16", 16)
    q = rng.standard_normal((3, 24, 256)).astype(F32)
    qd, seq, pos = (
        cp.asarray(q),
        cp.asarray(np.arange(3, dtype=np.int32)),
        cp.asarray(np.array(lens, np.int32) - 1),
    )
    args = (qd, c["k"], c["v"], c["table"], seq, pos)
    want = cp.asnumpy(att.attention(*args, max_len=4000, chunk=128))
    outs = [cp.full(q.shape, np.nan, F32) for _ in range(3)]
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        for o in outs:  # warm-up outside the capture: compiles, sizes the counters and the pool
            att.attention(*args, max_len=4000, chunk=128, out=o)
        stream.synchronize()
        for o in outs:
            o.fill(np.nan)
        stream.begin_capture()
        for o in outs:
            att.attention(*args, max_len=4000, chunk=128, out=o)
        graph = stream.end_capture()
        for _ in range(2):
            graph.launch(stream)
        stream.synchronize()
    for o in outs:
        assert np.array_equal(_bits(cp.asnumpy(o)), _bits(want)), "graph replay differs from eager"
    # prefill-sized launch split into row batches by a small workspace cap
    n = 40
    rows_q = rng.standard_normal((n, 24, 256)).astype(F32)
    rs, rp = np.zeros(n, np.int32), np.arange(3900, 3900 + n, dtype=np.int32)
    one = cp.asnumpy(_run(cp, c, rows_q, rs, rp, "float", max_len=4000, chunk=128))
    monkeypatch.setattr(att, "WS_CAP", att.workspace_bytes(7, 24, 256, att.split_plan(4000, 128)))
    assert att.rows_per_launch(n, 24, 256, att.split_plan(4000, 128)) == 7
    split = cp.asnumpy(_run(cp, c, rows_q, rs, rp, "float", max_len=4000, chunk=128))
    assert np.array_equal(_bits(split), _bits(one)), "row batches changed bits"


@pytest.mark.parametrize("ct", ["bf16", "fp8"])
@pytest.mark.parametrize("shape", [(24, 4), (16, 2)], ids=["27B", "35B-A3B"])
def test_attention_variants_at_model_shapes(cp: Any, shape: tuple[int, int], ct: str) -> None:
    """Every kernel variant (``VARIANTS``: the benchmark's side-by-side) at the two models' attention shapes with
    the default 256-position chunk: 8 sequences around chunk boundaries (1 to 9 splits, two merge levels) vs the
    reference; each row alone and the batch at a graph's capacity give the batch's bits; prefill rows across a
    chunk boundary equal their decode rows."""
    from ninfer.cuda.attention import VARIANTS

    hq, hkv = shape
    rng = np.random.default_rng(35 + hq)
    lens = [2100, 1, 256, 257, 16, 17, 513, 40]
    c = _cache(cp, rng, lens, hkv, 256, ct, 16)
    q = rng.standard_normal((8, hq, 256)).astype(F32)
    seq, pos = np.arange(8, dtype=np.int32), np.array(lens, np.int32) - 1
    ref = _ref(c, q, seq, pos)
    pre_seq, pre_pos = np.zeros(24, np.int32), np.arange(244, 268, dtype=np.int32)
    for v in VARIANTS:
        full = cp.asnumpy(_run(cp, c, q, seq, pos, "float", max_len=2100, chunk=256, variant=v))
        _close(f"{v} {ct} hq={hq}", full, ref, TOL["float"])
        cap = cp.asnumpy(
            _run(cp, c, q, seq, pos, "float", max_len=c["table"].shape[1] * 16, chunk=256, variant=v)
        )
        assert np.array_equal(_bits(cap), _bits(full)), f"{v}: max_len changed bits"
        for b in (0, 1, 3, 6):
            one = cp.asnumpy(_run(cp, c, q[b : b + 1], seq[b : b + 1], pos[b : b + 1], "float", max_len=lens[b],
                                  chunk=256, variant=v))  # fmt: skip
            assert np.array_equal(_bits(one[0]), _bits(full[b])), f"{v}: row {b} depends on the batch"
        qp = q[:1].repeat(24, axis=0)
        pre = cp.asnumpy(_run(cp, c, qp, pre_seq, pre_pos, "float", max_len=268, chunk=256, variant=v))
        for i in (0, 11, 12, 23):  # positions 244, 255, 256, 267
            one = cp.asnumpy(_run(cp, c, qp[:1], pre_seq[:1], pre_pos[i : i + 1], "float", max_len=int(pre_pos[i]) + 1,
                                  chunk=256, variant=v))  # fmt: skip
            assert np.array_equal(_bits(one[0]), _bits(pre[i])), f"{v}: prefill row {i} != its decode"
