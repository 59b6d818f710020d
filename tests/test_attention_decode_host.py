"""CPU check of the split-KV ``attention`` kernel itself: cuda_src/attention.cu compiled by g++ under a prelude that
emulates the CUDA built-ins with std::thread (tests/host/attn_emu.cpp: one thread per CUDA thread, block and warp
barriers, shuffles and mma.sync on their PTX fragment layouts, NaN-filled shared memory and workspaces, NaN-poisoned
output, blocks in a shuffled order). Checks the fragment index math, masking, paging, the three merge levels and
the arrival counters against the NumPy reference on every cache type, head dim and GQA group without a GPU, and
that a row's bits depend neither on the block order, the blocks per row nor on the other rows of the launch, for
every kernel variant (``VARIANTS``: warps per block, load pipeline), plus both models' shapes at 1-8 sequences
with bf16 and fp8 caches around 256-position chunk boundaries (the default variant). The GPU tests (tests/test_cuda_attention_decode.py) check the same kernel on the device.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator

from ninfer.artifact.registry import MODELS
from ninfer.cuda.attention import (
    DEFAULT_VARIANT,
    VARIANTS,
    group_size,
    page_shift,
    smem_bytes,
    split_blocks,
    split_plan,
)
from ninfer.engine.model_runner import PagedKVStore
from ninfer.formats import bf16_decode, bf16_encode, bf16_round
from ninfer.formats.fp8 import e4m3_table
from ninfer.reference import ops

F32 = np.float32
CACHE_CODES = {"float": 0, "bf16": 1, "e4m3": 2}  # the driver's C argument


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(
        tmp_path_factory,
        "attn_emu",
        ["attn_emu.cpp", "attention.cu", "emu_io.cpp", "attn_emu_driver.cpp"],
        timeout=900,
    )


def _cache(rng: np.random.Generator, lens: list[int], hkv: int, d: int, ct: str, page: int) -> dict:
    """A paged cache of random rows in storage form plus, per sequence, the values the kernel must see."""
    per = [max(1, -(-n // page)) for n in lens]
    total = sum(per) + 3
    perm = rng.permutation(total).astype(np.int32)
    table = np.zeros((len(lens), max(per) + 1), np.int32)  # one spare column: ldpt > the pages used
    at = 0
    for b, p in enumerate(per):
        table[b, :p] = perm[at : at + p]
        at += p
    shape = (total, page, hkv, d)
    out: dict = {"table": table, "ks": np.ones(shape[:3], F32), "vs": np.ones(shape[:3], F32)}
    for name in ("k", "v"):
        x = rng.standard_normal(shape).astype(F32)
        if ct == "e4m3":
            store = PagedKVStore(MODELS["ninfer-demo"].config, num_pages=1, page_size=1, dtype="fp8")
            x *= np.exp2(rng.uniform(-2, 2, shape[:3] + (1,))).astype(F32)
            codes, sc = store._encode(x)
            out[name + "c"], out[name + "s"], val = codes, sc.astype(F32), store._decode(codes, sc)
        elif ct == "bf16":
            val = bf16_round(x)
            out[name + "c"] = bf16_encode(val)
        else:
            val = x
            out[name + "c"] = x
        out[name + "seq"] = [val[table[b, : per[b]]].reshape(-1, hkv, d) for b in range(len(lens))]
    return out


def _run(emu: Path, tmp: Path, cache: dict, q: np.ndarray, seq: np.ndarray, pos: np.ndarray, *, t: str, ct: str,
         hkv: int, chunk: int | None, max_len: int, seed: int = 1, sx: int | None = None,
         variant: str = DEFAULT_VARIANT) -> np.ndarray:  # fmt: skip
    r, hq, d = q.shape
    plan, var = split_plan(max_len, chunk), VARIANTS[variant]
    files = {"q": bf16_encode(q) if t == "bf16" else q.astype(F32), "kc": cache["kc"], "vc": cache["vc"],
             "ks": cache["ks"], "vs": cache["vs"], "pt": cache["table"], "seq": seq, "pos": pos}  # fmt: skip
    for name, arr in files.items():
        np.ascontiguousarray(arr).tofile(tmp / f"{name}.bin")
    npages, page = cache["kc"].shape[:2]
    qk = float(d) ** -0.5 * np.log2(np.e)  # as the wrapper: scale * log2(e) in float32
    args = [int(t == "bf16"), CACHE_CODES[ct], d, r, hq, hkv, npages, page, page_shift(page), cache["table"].shape[1],
            plan.chunk, plan.nsplit, plan.ngmax, repr(float(F32(qk))), smem_bytes(d, var.nw), seed,
            cache["table"].shape[0], split_blocks(r, hkv, plan.nsplit, 132, var.nw) if sx is None else sx, var.nw,
            var.pipe]  # fmt: skip
    proc = subprocess.run([str(emu), str(tmp), *map(str, args)], capture_output=True, text=True, timeout=900)
    assert proc.returncode != 7, "an arrival counter is not zero after the launch"
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    raw = np.fromfile(tmp / "o.bin", dtype=np.uint16 if t == "bf16" else F32).reshape(r, hq, d)
    return bf16_decode(raw) if t == "bf16" else raw


def _ref(cache: dict, q: np.ndarray, seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return np.stack([
        ops.attention(q[i : i + 1], cache["kseq"][s][: p + 1], cache["vseq"][s][: p + 1], p)[0]
        for i, (s, p) in enumerate(zip(seq.tolist(), pos.tolist(), strict=True))
    ])  # fmt: skip


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), f"non-finite output: {np.count_nonzero(~np.isfinite(got))} values"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


# (t, cache, hq, hkv, d, page, lens, chunk): GQA groups 1, 2, 6, 8; every head dim and cache type; page sizes
# 4..32 and 12 (not a power of two); lengths 1, below/at/above a chunk and a page, and up to 3 splits per group with
# two merge levels (chunk 16, 300 positions: 19 splits in 3 groups of 8).
CASES = (
    ("float", "bf16", 24, 4, 256, 16, [300, 1, 129], 64),
    ("bf16", "bf16", 6, 1, 256, 16, [40], 16),
    ("float", "bf16", 8, 4, 128, 8, [300, 65], 16),
    ("float", "float", 8, 1, 64, 32, [129, 64], 64),
    ("bf16", "float", 4, 2, 32, 4, [17, 2], 16),
    ("float", "e4m3", 6, 1, 256, 16, [200, 3], 32),
    ("bf16", "e4m3", 4, 4, 64, 12, [50], 16),
    ("float", "bf16", 2, 1, 32, 12, [97, 1, 33], None),
)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-hq{c[2]}hkv{c[3]}d{c[4]}p{c[5]}c{c[7]}")
def test_attention_emulated_matches_reference(emu: Path, tmp_path: Path, case: tuple, variant: str) -> None:
    t, ct, hq, hkv, d, page, lens, chunk = case
    rng = np.random.default_rng(sum(lens) + d + hq)
    cache = _cache(rng, lens, hkv, d, ct, page)
    q = rng.standard_normal((len(lens), hq, d)).astype(F32)
    q = bf16_round(q) if t == "bf16" else q
    seq, pos = np.arange(len(lens), dtype=np.int32), np.array(lens, np.int32) - 1
    kw = {"t": t, "ct": ct, "hkv": hkv, "chunk": chunk, "variant": variant}
    got = _run(emu, tmp_path, cache, q, seq, pos, max_len=max(lens), **kw)
    err = _err(got, _ref(cache, q, seq, pos))
    tol = 1.2e-2 if t == "bf16" else 1e-4
    assert err <= tol, f"normalised max error {err:.2e} > {tol:.1e}"
    # the block order, the blocks per (KV head, row) (gridDim.z) and the other rows of the launch move no bit (every
    # grid for the default variant, one block per row for the benchmark's others)
    grids = ((7, 1), (3, 2), (5, split_plan(max(lens), chunk).nsplit))
    for seed, sx in grids if variant == DEFAULT_VARIANT else grids[:1]:
        again = _run(emu, tmp_path, cache, q, seq, pos, max_len=max(lens), seed=seed, sx=sx, **kw)
        assert np.array_equal(again.view(np.uint32), got.view(np.uint32)), f"depends on the grid: {sx}"
    if chunk is not None:
        b = int(np.argmin(lens))
        alone = _run(
            emu, tmp_path, cache, q[b : b + 1], seq[b : b + 1], pos[b : b + 1], max_len=lens[b], **kw
        )
        assert np.array_equal(alone[0].view(np.uint32), got[b].view(np.uint32)), "row depends on the batch"


# The two models' attention at their shapes (27B: 24 query heads over 4 KV heads, 35B-A3B: 16 over 2, head dim
# 256, float32 queries) with the default 256-position chunk, bf16 and fp8 caches: 8 sequences whose positions sit
# on both sides of chunk boundaries (1 to 3 splits: one and two merge levels; 8-warp blocks with two tiles per warp
# and split), then rows of the batch alone (one sequence), a one-block-per-row grid and another block order.
MODEL_LENS = [513, 1, 256, 257, 16, 17, 300, 40]


@pytest.mark.parametrize("ct", ["bf16", "e4m3"])
@pytest.mark.parametrize("shape", [(24, 4), (16, 2)], ids=["27B", "35B-A3B"])
def test_model_shapes_emulated(emu: Path, tmp_path: Path, shape: tuple[int, int], ct: str) -> None:
    hq, hkv = shape
    rng = np.random.default_rng(hq + len(ct))
    cache = _cache(rng, MODEL_LENS, hkv, 256, ct, 16)
    q = rng.standard_normal((len(MODEL_LENS), hq, 256)).astype(F32)
    seq, pos = np.arange(8, dtype=np.int32), np.array(MODEL_LENS, np.int32) - 1
    kw = {"t": "float", "ct": ct, "hkv": hkv, "chunk": 256}
    # max_len 2048: as a decode graph's capacity, not the rows' lengths
    got = _run(emu, tmp_path, cache, q, seq, pos, max_len=2048, **kw)
    assert _err(got, _ref(cache, q, seq, pos)) <= 1e-4
    again = _run(emu, tmp_path, cache, q, seq, pos, max_len=513, seed=9, sx=1, **kw)
    assert np.array_equal(again.view(np.uint32), got.view(np.uint32)), "depends on the grid or max_len"
    for b in (0, 3, 4):
        alone = _run(
            emu, tmp_path, cache, q[b : b + 1], seq[b : b + 1], pos[b : b + 1], max_len=MODEL_LENS[b], **kw
        )
        assert np.array_equal(alone[0].view(np.uint32), got[b].view(np.uint32)), (
            f"row {b} depends on the batch"
        )


def test_e4m3_codes_widen_exactly(emu: Path) -> None:
    """Every e4m3 code (subnormals, both zeros, NaN) through the kernel's widening to bf16 (att_e4m3x4)."""
    proc = subprocess.run([str(emu), "e4m3"], capture_output=True, timeout=60)
    assert proc.returncode == 0
    got = bf16_decode(np.frombuffer(proc.stdout, np.uint16))
    want = e4m3_table().astype(F32)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_prefill_rows_emulated(emu: Path, tmp_path: Path) -> None:
    """Every position of one sequence as rows of one launch (prefill through the split kernel): row p equals the
    decode row at p bitwise, and follows the reference."""
    rng = np.random.default_rng(3)
    hq, hkv, d, page, n, chunk = 4, 2, 64, 8, 70, 32
    cache = _cache(rng, [n], hkv, d, "bf16", page)
    q = rng.standard_normal((n, hq, d)).astype(F32)
    seq, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    got = _run(emu, tmp_path, cache, q, seq, pos, t="float", ct="bf16", hkv=hkv, chunk=chunk, max_len=n)
    assert _err(got, _ref(cache, q, seq, pos)) <= 1e-4
    for p in (0, 31, 32, 69):
        one = _run(emu, tmp_path, cache, q[p : p + 1], seq[:1], pos[p : p + 1], t="float", ct="bf16", hkv=hkv,
                   chunk=chunk, max_len=p + 1)  # fmt: skip
        assert np.array_equal(one[0].view(np.uint32), got[p].view(np.uint32)), (
            f"prefill row {p} != its decode"
        )


def test_split_plan_bounds_every_row() -> None:
    """The launch's counter and group-workspace sizes (ngmax) cover every row: ceil(ns / gs(ns)) <= ngmax for all
    ns <= nsplit; chunks round up to whole tiles."""
    for max_len in (1, 15, 16, 17, 129, 2100, 8192, 32768, 131072):
        for chunk in (16, 64, 100, 128, 256, 512, None):
            plan = split_plan(max_len, chunk)
            assert plan.chunk % 16 == 0 and plan.nsplit * plan.chunk >= max_len
            for ns in range(1, plan.nsplit + 1):
                gs = group_size(ns)
                assert -(-ns // gs) <= plan.ngmax and gs * gs >= ns and (gs == 1 or (gs // 2) ** 2 < ns)


def test_variants_fit_the_sm() -> None:
    """Every variant's block fits an SM (threads, the 227 KB shared-memory opt-in limit at every head dim), the
    default variant's instances are the ones the family compiles up front, and gridDim.z keeps about 16 warps per
    SM over the launch (one sequence at 8K: one block per split)."""
    from ninfer.cuda.attention import HEAD_DIMS, SOURCES

    for var in VARIANTS.values():
        assert 32 * var.nw <= 1024 and var.pipe in (0, 1, 2)
        for d in HEAD_DIMS:
            assert smem_bytes(d, var.nw) <= 227 * 1024
    want = {VARIANTS[DEFAULT_VARIANT].instance(t, c, d) for t in ("float", "bf16") for c in ("float", "bf16", "e4m3")
            for d in HEAD_DIMS}  # fmt: skip
    assert want <= set(SOURCES["attention.cu"])
    assert split_blocks(1, 4, 32, 132, 8) == 32 and split_blocks(1, 4, 128, 132, 8) == 66
    assert split_blocks(8, 4, 32, 132, 8) == 9 and split_blocks(1, 4, 128, 132, 4) == 128
