"""fp8 (e4m3fn codes + one float32 scale per token and KV head) KV cache of the CUDA backend.

CPU tests: the kernels' e4m3 encoder (cuda_src/e4m3.cuh, compiled for the host with nvcc) is bitwise
``ninfer.formats.fp8.e4m3_encode``; the memory plan counts the KV bytes of the reference ``PagedKVStore``.
GPU tests (marked ``gpu``): the KV write gives bitwise the reference runner's encoding (``PagedKVStore._encode``) of
the kernel's own rotated k and the raw v; attention over an fp8 cache matches NumPy attention over the decoded
values; the tiny model with fp8 KV follows the reference network over the reference runner's fp8 store, and the
engine runs on the CUDA runner with ``kv_dtype="fp8"`` (graphs captured) giving the reference engine's tokens.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer.cuda.loader import CUDA_SRC
from ninfer.cuda.memory_plan import plan_memory
from ninfer.engine.model_runner import PagedKVStore
from ninfer.formats import bf16_decode, bf16_encode, bf16_round, e4m3_encode
from ninfer.formats.fp8 import e4m3_table

F32 = np.float32
NVCC = shutil.which("nvcc")
gpu = pytest.mark.gpu

_HOST_ENCODER = r"""
#include "e4m3.cuh"
#include <cstdio>
#include <vector>
// argv[1]: float32 input file, argv[2]: one code byte per input written here
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    if (!in) return 3;
    std::vector<float> x;
    float buf[4096];
    size_t n;
    while ((n = fread(buf, 4, 4096, in)) > 0) x.insert(x.end(), buf, buf + n);
    fclose(in);
    std::vector<unsigned char> c(x.size());
    for (size_t i = 0; i < x.size(); ++i) c[i] = f_to_e4m3(x[i]);
    FILE* out = fopen(argv[2], "wb");
    if (!out || fwrite(c.data(), 1, c.size(), out) != c.size()) return 4;
    fclose(out);
    return 0;
}
"""


def _encoder_inputs() -> np.ndarray:
    """Every code's value, every midpoint with 64 ulps either side, saturation, specials, subnormals, a strided
    sweep of [2^-12, 2^10) and random values (log-uniform magnitudes and raw bit patterns); both signs."""
    rng = np.random.default_rng(5)
    table = e4m3_table()
    vals = table[np.isfinite(table)].astype(np.float64)
    pos = np.unique(np.abs(vals))
    mids = ((pos[:-1] + pos[1:]) / 2).astype(F32)
    assert np.array_equal(mids.astype(np.float64), (pos[:-1] + pos[1:]) / 2), "midpoints exact in float32"
    around = (mids.view(np.uint32)[:, None].astype(np.int64) + np.arange(-64, 65)).astype(np.uint32).view(F32)
    big = np.array([448, 448.0001, 463.99, 464, 464.001, 480, 500, 1e4, 3.4e38, np.inf], F32)
    special = np.array([0.0, np.nan, 1e-45, 1e-40, 1.17e-38, 2.0**-10, 2.0**-9, 2.0**-7, 2.0**-6], F32)
    nan_payloads = np.array([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FA00000], np.uint32).view(F32)
    sweep = np.arange(0x39800000, 0x44800000, 97, dtype=np.uint32).view(F32)
    logu = np.exp2(rng.uniform(-30, 20, 1 << 20)).astype(F32)
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(F32)
    x = np.concatenate([vals.astype(F32), mids, around.ravel(), big, special, nan_payloads, sweep, logu])
    return np.concatenate([x, -x, bits]).astype(F32)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_host_e4m3_encoder_matches_numpy(tmp_path: Path) -> None:
    src = tmp_path / "enc.cu"
    src.write_text(_HOST_ENCODER)
    exe = tmp_path / "enc"
    cmd = [NVCC, "-std=c++17", "-I", str(CUDA_SRC), "-o", str(exe), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    x = _encoder_inputs()
    x.tofile(tmp_path / "x.f32")
    run = subprocess.run([str(exe), str(tmp_path / "x.f32"), str(tmp_path / "c.u8")], timeout=120)
    assert run.returncode == 0
    got = np.fromfile(tmp_path / "c.u8", np.uint8)
    with np.errstate(invalid="ignore"):  # NaN inputs
        want = e4m3_encode(x)
    assert got.size == x.size
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{bad.size} mismatches, first x={x[bad[:5]]!r} bits={x[bad[:5]].view(np.uint32)} "
        f"got={got[bad[:5]]} want={want[bad[:5]]}"
    )
    # the inputs do reach every code, ties and the special codes
    assert np.unique(want).size == 256
    assert {0x00, 0x80, 0x7E, 0xFE, 0x7F, 0xFF} <= set(np.unique(got).tolist())


# ---- memory plan -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("model_id", ["qwen3.6-27b", "qwen3.6-35b-a3b", "ninfer-demo"])
def test_memory_plan_kv_bytes_match_reference_store(kv_dtype: str, model_id: str) -> None:
    from ninfer.artifact.registry import MODELS

    mc = MODELS[model_id].config
    ps, pages = 16, 1000
    store = PagedKVStore(mc, num_pages=1, page_size=ps, dtype=kv_dtype)
    plan = plan_memory(
        mc, weights=1 << 30, free=120 << 30, lanes=2, checkpoints=0, num_pages=pages, page_size=ps,
        max_context=4096, prefill_chunk=512, attn_chunk=512, kv_dtype=kv_dtype, state_dtype="fp32",
        act_bytes=2, graphs=False,
    )  # fmt: skip
    assert plan.kv_pool == (pages + 1) * ps * store.bytes_per_token  # one scratch page on the device
    per_head = mc.head_dim * (2 if kv_dtype == "bf16" else 1) + (4 if kv_dtype == "fp8" else 0)
    assert store.bytes_per_token == 2 * len(mc.full_attention_layers) * mc.num_key_value_heads * per_head


def test_memory_plan_rejects_unknown_kv_dtype() -> None:
    from ninfer.artifact.registry import MODELS

    with pytest.raises(ValueError, match="kv_dtype"):
        plan_memory(
            MODELS["ninfer-demo"].config, weights=0, free=1 << 30, lanes=1, checkpoints=0, num_pages=4,
            page_size=16, max_context=64, prefill_chunk=16, attn_chunk=64, kv_dtype="fp4", state_dtype="fp32",
            act_bytes=2, graphs=False,
        )  # fmt: skip


# ---- GPU: kernels ------------------------------------------------------------------------------------------------
@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


def _store(kv_dtype: str = "fp8") -> PagedKVStore:
    """A reference store: its ``_encode``/``_decode`` are the fp8 KV encoding the kernels must reproduce."""
    from ninfer.artifact.registry import MODELS

    return PagedKVStore(MODELS["ninfer-demo"].config, num_pages=1, page_size=1, dtype=kv_dtype)


def _rows(rng: np.random.Generator, shape: tuple[int, ...], t: str, spread: float = 20) -> np.ndarray:
    """Random rows with magnitudes spread over 2^-spread..2^spread (bf16-representable when the kernel reads bf16)."""
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-spread, spread, shape[:-1] + (1,)))).astype(F32)
    return bf16_round(x) if t == "bf16" else x


def _dev(cp: Any, x: np.ndarray, t: str) -> Any:
    return cp.asarray(bf16_encode(x) if t == "bf16" else np.asarray(x, F32))


def _host(cp: Any, a: Any) -> np.ndarray:
    h = cp.asnumpy(a)
    return bf16_decode(h) if h.dtype == np.uint16 else h.astype(F32)


WRITE_SHAPES = ((4, 2, 32, 8, (2, 1, 1)), (8, 2, 256, 64, (11, 11, 10)), (16, 4, 128, 32, (6, 5, 5)))


@gpu
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_kv_write_fp8_bitwise_reference_encoding(cp: Any, t: str) -> None:
    """Codes and scales equal the reference runner's encoding of the same kernel's fp32-cache k (after norm and
    rope) and of the raw v; special rows: zero k and v (scale 0), tiny v (subnormal scale), NaN in v (NaN scale,
    unscaled codes). Slots not written keep their poison."""
    from ninfer.cuda.attention import qk_norm_rope_kv_write

    rng, store = np.random.default_rng(21), _store()
    for hq, hkv, d, rot, sec in WRITE_SHAPES:
        n, page = 9, 4
        qg, k, v = _rows(rng, (n, hq * 2 * d), t), _rows(rng, (n, hkv * d), t), _rows(rng, (n, hkv * d), t)
        k[1, :d] = 0.0
        v[2, :d] = 0.0
        v[3, d : 2 * d] = rng.standard_normal(d).astype(F32) * F32(1e-38)
        v[4, 5] = np.nan
        k, v = (bf16_round(k), bf16_round(v)) if t == "bf16" else (k, v)
        qw, kw = (rng.standard_normal(d) * 0.3).astype(F32), (rng.standard_normal(d) * 0.3).astype(F32)
        pos = np.stack([rng.integers(0, 3000, n) for _ in range(3)]).astype(np.int32)
        total = -(-n // page) + 3
        slots = rng.permutation(total * page)[:n].astype(np.int64)
        args = [_dev(cp, a, t) for a in (qg, k, v)] + [cp.asarray(a) for a in (qw, kw, pos, slots)]
        kw_ = dict(heads=hq, kv_heads=hkv, head_dim=d, rotary_dim=rot, theta=1e7, mrope_section=sec)
        shape = (total, page, hkv, d)
        k32, v32 = cp.full(shape, np.nan, F32), cp.full(shape, np.nan, F32)
        q32 = qk_norm_rope_kv_write(*args, k32, v32, **kw_)
        kc, vc = cp.full(shape, 0x7F, np.uint8), cp.full(shape, 0x7F, np.uint8)
        ks, vs = cp.full(shape[:3], np.nan, F32), cp.full(shape[:3], np.nan, F32)
        q8 = qk_norm_rope_kv_write(*args, kc, vc, **kw_, k_scale=ks, v_scale=vs)
        assert np.array_equal(cp.asnumpy(q8), cp.asnumpy(q32)), "q must not depend on the cache type"
        for name, c32, codes, scales in (("k", k32, kc, ks), ("v", v32, vc, vs)):
            x = cp.asnumpy(c32).reshape(-1, hkv, d)[slots]
            assert np.isfinite(x).sum() >= x.size - 1, f"{name}: fp32 cache rows not all written"
            with np.errstate(invalid="ignore"):
                want_codes, want_scale = store._encode(x)
            got_codes = cp.asnumpy(codes).reshape(-1, hkv, d)
            got_scale = cp.asnumpy(scales).reshape(-1, hkv)
            bad = np.flatnonzero(got_codes[slots] != want_codes)
            assert bad.size == 0, f"{name} d={d} {t}: {bad.size} codes differ, first at {bad[:5]}"
            assert np.array_equal(
                got_scale[slots].view(np.uint32), want_scale.view(np.uint32)
            ) or np.array_equal(got_scale[slots], want_scale, equal_nan=True), (
                f"{name} d={d} {t}: scales differ"
            )
            untouched = np.setdiff1d(np.arange(total * page), slots)
            assert (got_codes[untouched] == 0x7F).all() and np.isnan(got_scale[untouched]).all()
        assert cp.asnumpy(ks).reshape(-1, hkv)[slots[1], 0] == 0.0  # zero k row: scale 0, codes of 0
        assert np.isnan(cp.asnumpy(vs).reshape(-1, hkv)[slots[4], 0])


def _fp8_cache(cp: Any, rng: np.random.Generator, lens: list[int], hkv: int, d: int, page: int) -> tuple:
    """An fp8 paged cache of random rows, encoded by the reference store; per sequence the decoded k, v."""
    store = _store()
    per = [max(1, -(-n // page)) for n in lens]
    total = sum(per) + 3
    perm = rng.permutation(total).astype(np.int32)
    table = np.zeros((len(lens), max(per)), np.int32)
    at = 0
    for b, p in enumerate(per):
        table[b, :p] = perm[at : at + p]
        at += p
    out = []
    for _ in range(2):
        # moderate spread: scores stay O(1), so fp32 summation order cannot move the softmax
        codes, scale = store._encode(_rows(rng, (total, page, hkv, d), "float", spread=2))
        out.append((codes, scale, store._decode(codes, scale)))
    (kc, ks, kd), (vc, vs, vd) = out
    seq_k = [kd[table[b]].reshape(-1, hkv, d)[: lens[b]] for b in range(len(lens))]
    seq_v = [vd[table[b]].reshape(-1, hkv, d)[: lens[b]] for b in range(len(lens))]
    dev = {"k_cache": kc, "v_cache": vc, "k_scale": ks, "v_scale": vs}
    return {k: cp.asarray(a) for k, a in dev.items()}, cp.asarray(table), seq_k, seq_v


# (hq, hkv, d, page, lens): GQA groups 1..8, every head dim, page sizes 4..32, lengths crossing the 64-chunk splits
ATTN_SHAPES = (
    (8, 2, 128, 16, [1, 40, 300]),
    (6, 1, 256, 8, [700, 3]),
    (4, 2, 32, 4, [17, 65]),
    (8, 1, 64, 32, [129, 64]),
    (4, 4, 64, 16, [200]),
)


@gpu
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_attention_fp8_cache_vs_decoded_reference(cp: Any, t: str) -> None:
    """Decode (one row per sequence, split or not) and prefill (every position of a sequence) attention over an fp8
    cache against NumPy attention over the decoded values; a decode row alone equals the row in its batch."""
    from ninfer.cuda.attention import attention
    from ninfer.reference import ops

    rng = np.random.default_rng(22)
    tol = 1e-4 if t == "float" else 1.2e-2
    for hq, hkv, d, page, lens in ATTN_SHAPES:
        dev, table, seq_k, seq_v = _fp8_cache(cp, rng, lens, hkv, d, page)
        kc, vc = dev.pop("k_cache"), dev.pop("v_cache")
        q = (rng.standard_normal((len(lens), hq, d))).astype(F32)
        q = bf16_round(q) if t == "bf16" else q
        row_seq = cp.asarray(np.arange(len(lens), dtype=np.int32))
        row_pos = cp.asarray(np.array(lens, np.int32) - 1)
        ref = np.stack(
            [ops.attention(q[b : b + 1], seq_k[b], seq_v[b], lens[b] - 1)[0] for b in range(len(lens))]
        )
        for chunk in (64, None):
            out = cp.full(q.shape, np.nan, F32) if t == "float" else cp.full(q.shape, 0x7FC0, np.uint16)
            attention(
                _dev(cp, q, t),
                kc,
                vc,
                table,
                row_seq,
                row_pos,
                max_len=max(lens),
                chunk=chunk,
                out=out,
                **dev,
            )
            _close(
                f"fp8 decode attn {t} hq={hq} hkv={hkv} d={d} page={page} chunk={chunk}",
                _host(cp, out),
                ref,
                tol,
            )
        full = cp.asnumpy(
            attention(_dev(cp, q, t), kc, vc, table, row_seq, row_pos, max_len=max(lens), chunk=64, **dev)
        )
        b = len(lens) - 1
        alone = attention(
            _dev(cp, q[b:], t), kc, vc, table, row_seq[b:], row_pos[b:], max_len=lens[b], chunk=64, **dev
        )
        assert np.array_equal(cp.asnumpy(alone)[0], full[b]), "decode attention depends on the batch"
        # prefill: every position of sequence 0 (rows attend 0..p)
        n0 = lens[0]
        qp = rng.standard_normal((n0, hq, d)).astype(F32)
        qp = bf16_round(qp) if t == "bf16" else qp
        rs, rp = cp.zeros(n0, np.int32), cp.arange(n0, dtype=np.int32)
        out = attention(_dev(cp, qp, t), kc, vc, table, rs, rp, max_len=n0, chunk=64, **dev)
        _close(
            f"fp8 prefill attn {t} hq={hq} d={d}",
            _host(cp, out),
            ops.attention(qp, seq_k[0], seq_v[0], 0),
            tol,
        )


def _close(name: str, got: np.ndarray, ref: np.ndarray, tol: float) -> None:
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    assert np.isfinite(got).all(), f"{name}: non-finite output"
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    assert err <= tol, f"{name}: normalised max error {err:.3e} > {tol:.1e}"


@gpu
def test_attention_wrappers_check_fp8_scales(cp: Any) -> None:
    from ninfer.cuda._common import KernelError
    from ninfer.cuda.attention import attention

    kc = cp.zeros((4, 16, 2, 32), np.uint8)
    q = cp.zeros((1, 4, 32), F32)
    meta = (cp.zeros((1, 4), np.int32), cp.zeros(1, np.int32), cp.zeros(1, np.int32))
    good = cp.zeros((4, 16, 2), F32)
    with pytest.raises(KernelError, match="k_scale: required"):
        attention(q, kc, kc, *meta, max_len=1)
    with pytest.raises(KernelError, match="v_scale: shape"):
        attention(q, kc, kc, *meta, max_len=1, k_scale=good, v_scale=cp.zeros((4, 16, 1), F32))
    with pytest.raises(KernelError, match="k_scale: dtype"):
        attention(q, kc, kc, *meta, max_len=1, k_scale=good.astype(np.float16), v_scale=good)
    bf = cp.zeros((4, 16, 2, 32), np.uint16)
    with pytest.raises(KernelError, match="only an fp8"):
        attention(q, bf, bf, *meta, max_len=1, k_scale=good, v_scale=good)
    out = attention(q, kc, kc, *meta, max_len=1, k_scale=good, v_scale=good)
    assert cp.asnumpy(out).shape == (1, 4, 32)


# ---- GPU: the network and the engine -----------------------------------------------------------------------------
# Tiny models (tests/hf_tiny.py shapes, demo-style random weights), fp32 activations and GEMV projections, so the
# CUDA net follows the reference up to fp32 summation order. Measured on the reference: fp8 against fp32 KV moves
# the logits by 7.4e-3 (dense) / 5.7e-3 (MoE); 1e-6-relative noise on k/v before encoding (a code flipping at a
# rounding midpoint) by at most 2.5e-4 over 30 draws. TOL_FP8 lies between: a net that kept bf16 or fp32 KV fails.
TOL_FP8 = 2e-3


def _tiny_pair(kind: str, **opts: Any) -> tuple[Any, Any, Any]:
    """(config, CUDA net, reference net) over the same BF16-encoded random weights."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_tiny import tiny_config_kwargs

    from ninfer.config import ModelConfig
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import encode_weights, upload_encoded
    from ninfer.demo import random_weights
    from ninfer.formats import FORMATS
    from ninfer.reference import DictWeights, Qwen36

    kw = tiny_config_kwargs(kind)
    kw["model_type"] = "qwen3_5_text" if kind == "dense" else "qwen3_5_moe_text"
    cfg = ModelConfig.from_hf(kw)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=0)), "BF16")
    ref = Qwen36(cfg, DictWeights({n: FORMATS[f].decode(b, s) for n, (f, s, b) in enc.items()}))
    return cfg, CudaQwen36(cfg, upload_encoded(cfg, enc), **opts), ref


def _chunks(lm_head: Any, forward: Any, step: Any, ids: np.ndarray) -> np.ndarray:
    """Chunked prefill (5, 32, 3 rows) then one decode step per remaining id; logits of every row."""
    got = [lm_head(forward(ids[a:b])) for a, b in ((0, 5), (5, 37), (37, 40))]
    got += [lm_head(step(ids[i : i + 1])) for i in range(40, ids.size)]
    return np.concatenate(got)


def _cuda_chunks(net: Any, ids: np.ndarray) -> np.ndarray:
    """``_chunks`` on one sequence over fresh pools of ``net`` (8 slots, 16K positions, 2048 pages of 16)."""
    from ninfer.cuda.sequences import Sequences

    seqs = Sequences(net, slots=8, context=16384, pages=2048, page_size=16)
    s = seqs.new()
    return _chunks(net.lm_head, lambda x: seqs.forward(s, x), lambda x: seqs.forward_batch(x, [s]), ids)


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), "non-finite logits"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))


@gpu
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_tiny_fp8_kv_vs_reference_fp8_store(kind: str) -> None:
    """CUDA net with kv_dtype fp8 against the reference net over the reference runner's fp8 ``PagedKV``; decode by
    CUDA graph and eagerly give the same bits (the scales are static buffers of the graph)."""
    pytest.importorskip("cupy")
    from ninfer.engine.model_runner import PagedKV

    cfg, net, ref = _tiny_pair(kind, act_dtype="fp32", prefill_gemm=False, kv_dtype="fp8")
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, 48)
    got = _cuda_chunks(net, ids)
    assert net.kc[0].dtype == np.uint8 and net.ks[0].shape == net.kc[0].shape[:3]
    pages = list(range(4))
    state = ref.new_state(kv=PagedKV(PagedKVStore(cfg, 4, 16, "fp8"), pages))
    want = _chunks(ref.lm_head, lambda x: ref.forward(x, state), lambda x: ref.forward_batch(x, [state]), ids)
    err = _err(got, want)
    assert err <= TOL_FP8, f"{kind}: logits differ from the fp8-KV reference by {err:.3e}"
    net.cuda_graph = False
    eager = _cuda_chunks(net, ids)
    assert np.array_equal(eager, got), "graph and eager decode differ with an fp8 cache"


def _sessions(eng: Any, prompts: list[list[int]]) -> list[list[int]]:
    """A first turn per prompt, then a second turn that resumes from the first's retained prefix (its boundary
    page is copied: codes and scales)."""
    first = [eng.submit(p, max_tokens=8, ignore_eos=True).result(timeout=300).token_ids for p in prompts]
    second = [
        eng.submit(p + f + [7, 8, 9], max_tokens=6, ignore_eos=True).result(timeout=300).token_ids
        for p, f in zip(prompts, first, strict=True)
    ]
    return first + second


@gpu
def test_engine_fp8_kv_on_cuda_runner_matches_reference_engine(tmp_path: Path) -> None:
    """The demo model through the engine with kv_dtype fp8: the CUDA runner (graphs captured, pages copied on
    reuse) gives the reference runner's greedy tokens. On the reference, every sampled row's top-1 margin (over the
    tokenizer's ids) is >= 2.5e-3 of its largest logit: over twice the CUDA/reference logit difference."""
    pytest.importorskip("cupy")
    from ninfer.cuda.model import load_cuda
    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.demo import build_demo
    from ninfer.engine import Engine
    from ninfer.model import load

    path = build_demo(tmp_path / "demo.ninfer")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1000, int(rng.integers(20, 60))).tolist() for _ in range(3)]
    kw = dict(max_context=512, kv_capacity=4096, prefill_chunk=32, checkpoint_stride=64, max_concurrency=2)
    with Engine.from_model(load(path), kv_dtype="fp8", **kw) as eng:
        want = _sessions(eng, prompts)
    model = load(path)
    model.net = load_cuda(path, act_dtype="fp32", prefill_gemm=False, progress=False)
    model.backend = "cuda"  # the engine takes the backend's runner (Model.runner)
    with Engine.from_model(model, kv_dtype="fp8", **kw) as eng:
        runner = eng._runner
        assert isinstance(runner, CudaModelRunner) and sorted(runner.net.graphs.captured) == [1, 2]
        net = runner.net
        assert net.kc[0].dtype == np.uint8 and len(net.ks) == len(net.vs) == len(net.kc)
        per_page = sum(a[0].nbytes for a in net.kc + net.vc + net.ks + net.vs)
        assert runner.plan.kv_pool == (4096 // 16 + 1) * per_page
        got = _sessions(eng, prompts)
        assert eng.stats().prefix_hit_tokens > 0, "the second turns did not reuse the first turns' pages"
    assert got == want
