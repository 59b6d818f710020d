"""CPU check of the MoE expert lanes: cuda_src/moe_lanes.cu's slot table and cuda_src/gemv.cu's ``experts == 2`` mode,
the kernel text compiled by g++ under the CUDA emulation prelude of tests/host/attn_emu.cpp (std::thread per CUDA
thread, block and warp barriers, mma.sync on its PTX fragment layout; gemv.cu's GV_HOST_EMU branches: synchronous
copies, emu_mma), driven by tests/host/gemv_lanes_driver.cpp with NaN-poisoned shared memory, workspaces and
outputs and blocks in a shuffled order. Checks the table against a NumPy model (every routed pair in exactly one
lane, slots in expert order, the launch bound), and the lanes GEMV (4 and 8 lanes, K splits, the SwiGLU prologue,
float and bf16 activations) bitwise against the one-lane expert GEMV per row and against the NumPy reference.
The dense launches, norm folding, the routed and combine launches, and the dense gate | up SwiGLU epilogue
(gemv_mma_gu: the down product of its output bitwise the down product staging the SwiGLU) are checked the same
way. The GPU tests (tests/test_cuda_moe_lanes.py, tests/test_cuda_gemv_swiglu.py) check the kernels on the device.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator, words
from moe_lanes_model import routing, table_model

from ninfer.cuda.linear import gemv_plan
from ninfer.cuda.loader import source_text
from ninfer.cuda.moe_lanes import slot_bound
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS, bf16_decode, bf16_round
from ninfer.reference import ops

F32 = np.float32
FMTS = ("BF16", "NVFP4G16_E4M3S", "FP8E4M3_F32ROW")  # the driver's fmt codes 0, 1, 2
PRELUDE = """#define GV_HOST_EMU 1
#undef __align__
#define __align__(n)  // a block-scope extern cannot carry alignas; gv_sm below is aligned, bf16 is 2-aligned anyway
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float2 make_float2(float x, float y) { return {x, y}; }
alignas(16) unsigned gv_sm[227 * 1024 / 4];
// gemv.cu's shared memory: the block's own in a cluster launch, else the one poisoned per block
inline unsigned* gv_emu_smem() {
    void* p = emu_block_smem();
    return p ? static_cast<unsigned*>(p) : gv_sm;
}
int ml_sm[4096];
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # moe_lanes.cu after gemv.cu in one unit: drop its second copy of common.cuh
    table = re.sub(
        r"// ---- common\.cuh ----.*?// ---- end common\.cuh ----",
        "",
        source_text("moe_lanes.cu"),
        flags=re.S,
    )
    # router.cu's moe_route kernel alone (route_row.cuh and common.cuh came with gemv.cu)
    router = source_text("router.cu")
    route = router[router.index("template <typename T, int MAXE>\n__global__") : router.index("// moe_sort:")]
    # norm.cu (moe_combine_rmsnorm) without its copy of common.cuh, its __shared__ arrays static
    norm = re.sub(
        r"// ---- common\.cuh ----.*?// ---- end common\.cuh ----", "", source_text("norm.cu"), flags=re.S
    )
    norm = (
        "#undef __shared__\n#define __shared__ static\n" + norm + "\n#undef __shared__\n#define __shared__\n"
    )
    parts = ["attn_emu.cpp", PRELUDE, source_text("gemv.cu"), table, route, norm, "emu_io.cpp"]
    parts.append("gemv_lanes_driver.cpp")
    return build_emulator(tmp_path_factory, "gemv_lanes_emu", parts, timeout=900)


def _write(d: Path, **arrays: np.ndarray) -> None:
    for name, a in arrays.items():
        np.ascontiguousarray(a).tofile(d / f"{name}.bin")


def _emulate(emu: Path, args: list, cluster: bool = False) -> None:
    """Run the driver; ``cluster``: K-split launches as clusters of their splits (gemv.cu gv_store_cl)."""
    env = os.environ | {"GV_EMU_CLUSTER": "1" if cluster else "0"}
    proc = subprocess.run([str(emu), *map(str, args)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode != 7, "a split arrival counter is not zero after the launch"
    assert proc.returncode != 8, "a cluster launch wrote the split workspace"
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"


def _same_outputs(a: Path, b: Path, names: tuple[str, ...]) -> None:
    """Output files ``names`` of two runs are byte for byte the same."""
    for n in names:
        x, y = (np.fromfile(d / f"{n}.bin", dtype=np.uint8) for d in (a, b))
        assert x.size and np.array_equal(x, y), f"{n}: the cluster reduction differs from the counter path"


def _cluster_twin(emu: Path, d: Path, args: list, names: tuple[str, ...]) -> None:
    """Run ``args`` (the counter path, already run in ``d``) again as cluster launches in a copy of ``d`` (the
    inputs), and compare the outputs ``names`` bitwise."""
    c = d.parent / (d.name + "-cluster")
    shutil.copytree(d, c)
    for n in names:
        (c / f"{n}.bin").unlink()
    _emulate(emu, [c if a == d else a for a in args], cluster=True)
    _same_outputs(d, c, names)


def _table(
    emu: Path, d: Path, ids: np.ndarray, xrow: np.ndarray, experts: int, nb: int
) -> tuple[np.ndarray, ...]:
    z = slot_bound(ids.size, experts, nb)
    _write(d, ids=ids, xrow=xrow, dims=np.array([z, 0, 0], np.int64))
    args = [d, 0, 0, nb, 16, 8, 1, ids.size, experts, 0, 0, 1, 1]
    proc = subprocess.run([str(emu), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return tuple(np.fromfile(d / f"{n}.bin", dtype=np.int32) for n in ("sid", "tx", "ts"))


@pytest.mark.parametrize(
    "case",
    [
        (256, 8, 256, True, 8),
        (64, 8, 256, True, 4),
        (40, 3, 5, False, 8),
        (9, 1, 1, False, 4),
        (8, 1, 3, True, 8),
        (33, 4, 16, False, 4),
    ],  # fmt: skip
    ids=lambda c: f"t{c[0]}k{c[1]}e{c[2]}{'s' if c[3] else ''}nb{c[4]}",
)
def test_slot_table_matches_model(emu: Path, tmp_path: Path, case: tuple) -> None:
    """The 35B-A3B's 256-token chunk (256 experts + shared, 8 lanes), a 4-lane chunk, few experts with many rows
    (several slots each), one expert, fewer pairs than lanes: the device table is the model's, every routed pair is
    in exactly one lane, and the bound covers the slots."""
    t, k, e, shared, nb = case
    ids, xrow, experts = routing(np.random.default_rng(t * 7 + e), t, k, e, shared)
    got = _table(emu, tmp_path, ids, xrow, experts, nb)
    want = table_model(ids, xrow, experts, nb)
    for name, g, w in zip(("sid", "tx", "ts"), got, want, strict=True):
        assert np.array_equal(g, w), f"{name} differs from the model"
    outs = got[1].reshape(-1, 2, nb)[:, 1]
    assert np.array_equal(np.sort(outs[outs >= 0]), np.arange(ids.size)), "a pair is missing or doubled"
    assert (got[0] >= 0).sum() == sum(-(-np.count_nonzero(ids == x) // nb) for x in range(experts))


# fmt, activation type, lanes, N, K, tokens, top-k, experts, shared, SwiGLU (down projection: x by pair row)
GEMV_CASES = [
    ("NVFP4G16_E4M3S", "float", 8, 40, 1032, 12, 3, 4, True, False),  # 2 K splits, slots of 1..8 lanes
    ("NVFP4G16_E4M3S", "bf16", 4, 24, 264, 10, 2, 3, False, True),
    ("BF16", "float", 4, 70, 520, 9, 2, 3, True, True),  # 70 rows: two row blocks, the second partial
    ("FP8E4M3_F32ROW", "bf16", 8, 33, 256, 11, 2, 2, False, False),
]


@pytest.mark.parametrize(
    "case", GEMV_CASES, ids=lambda c: f"{c[0]}-{c[1]}-nb{c[2]}-{'swiglu' if c[9] else 'plain'}"
)
def test_lanes_gemv_bitwise_one_lane_and_reference(emu: Path, tmp_path: Path, case: tuple) -> None:
    _lanes_case(emu, tmp_path, case, cluster=False)


# expert modes 1 and 2 with their K splits as clusters (more splits than the plan's, 1..16 tiles each)
CLUSTER_LANES_CASES = [
    ("NVFP4G16_E4M3S", "float", 8, 40, 1032, 12, 3, 4, True, False, 5),
    ("FP8E4M3_F32ROW", "bf16", 4, 33, 2048, 7, 2, 2, False, True, 16),
]


@pytest.mark.parametrize("case", CLUSTER_LANES_CASES, ids=lambda c: f"{c[0]}-{c[1]}-nb{c[2]}-s{c[10]}")
def test_lanes_gemv_cluster_bitwise_counter(emu: Path, tmp_path: Path, case: tuple) -> None:
    """The expert launches (one lane per slot and expert lanes) with their splits reduced through distributed
    shared memory: every output bitwise the arrival-counter path's, and against the reference."""
    _lanes_case(emu, tmp_path, case[:10], cluster=True, splits=case[10])


def _lanes_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool, splits: int | None = None) -> None:
    fmt, t, nb, n, k, tokens, top, e, shared, swiglu = case
    rng = np.random.default_rng(n * 31 + k)
    ids, xrow, experts = routing(rng, tokens, top, e, shared)
    s = ids.size
    codec = FORMATS[fmt]
    shape = (experts * n, k)
    buf = np.ascontiguousarray(
        codec.encode((rng.standard_normal(shape) * 0.5).astype(F32), shape).reshape(-1)
    )
    buf = buf.view(np.uint8)
    wdec = codec.decode(buf, shape)
    offs = plane_offsets(fmt, shape, buf)
    if fmt.startswith("NVFP4"):  # the kernels read the device layout (ninfer/cuda/nvfp4_layout.py)
        dw = to_device_layout(DeviceWeight(fmt, shape, buf, offs))
        buf, offs = dw.data, dw.offsets
    xrows = s if swiglu else tokens  # the down projection reads pair rows, gate|up token rows
    width = 2 * k if swiglu else k
    x = (rng.standard_normal((xrows, width)) * 2).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    z = slot_bound(s, experts, nb)
    _write(tmp_path, ids=ids, xrow=xrow, dims=np.array([z, xrows, width], np.int64), w=buf,
           wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64), x=words(x, t == "bf16"))  # fmt: skip
    splits = gemv_plan(fmt, n, k).splits if splits is None else splits
    args = [tmp_path, FMTS.index(fmt), int(t == "bf16"), nb, n, k, splits, s, experts, int(swiglu), int(swiglu),
            3, 0]  # fmt: skip
    _emulate(emu, args)
    if cluster:
        _cluster_twin(emu, tmp_path, args, ("lanes", "one"))
    dt = np.uint16 if t == "bf16" else F32
    lanes, one = (np.fromfile(tmp_path / f"{name}.bin", dtype=dt).reshape(s, n) for name in ("lanes", "one"))
    assert np.array_equal(lanes.view(np.uint8), one.view(np.uint8)), (
        "a lane differs from its one-lane product"
    )
    got = bf16_decode(lanes) if t == "bf16" else lanes
    assert np.isfinite(got).all(), "an output row was not written"
    xin = x
    if swiglu:
        xin = ops.swiglu(x[:, :k], x[:, k:])
        xin = bf16_round(xin) if t == "bf16" else xin  # the prologue rounds as the standalone kernel stores
    rows = np.arange(s) if swiglu else xrow
    ref = np.stack(
        [ops.linear(xin[r : r + 1], wdec[i * n : (i + 1) * n])[0] for i, r in zip(ids, rows, strict=True)]
    )
    err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert err <= (1.2e-2 if t == "bf16" else 2e-5), f"{case}: normalised error {err:.3e}"


def test_switch_points_and_bounds() -> None:
    """The 35B-A3B (256 experts, top 8): chunks of up to 256 tokens take the lanes (4 lanes up to 32 tokens), 257
    the grouped GEMM; the slot bound covers any spread of the pairs; the split partials stay per launch."""
    from ninfer.cuda.moe_lanes import SLOTS_PER_LAUNCH, lanes_nb, lanes_workspace_bytes, use_lanes

    e, k = 256, 8
    assert use_lanes(16 * k, e) and use_lanes(256 * k, e) and not use_lanes(257 * k, e)
    assert lanes_nb(32 * k, e) == 4 and lanes_nb(33 * k, e) == 8
    rng = np.random.default_rng(0)
    for s, ex, nb in ((2304, 257, 8), (9, 3, 4), (100, 1, 8), (7, 50, 4)):
        counts = rng.multinomial(s, rng.dirichlet(np.full(ex, 0.3)))
        assert sum(-(-c // nb) for c in counts) <= slot_bound(s, ex, nb)
    # the 35B's gate|up: 8 row blocks x 4 splits of [128 rows x 8 lanes] fp32 per slot (NVFP4; others no larger)
    assert lanes_workspace_bytes(1024, 2048, 10**6) == SLOTS_PER_LAUNCH * 8 * 4 * 128 * 8 * 4
    assert lanes_workspace_bytes(2048, 512, 10) == 0  # the down projection (4 K-tiles) has no split


# fmt, activation type, N, K, rows, K-splits
DENSE_CASES = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 2),  # 3 row blocks (last partial) x 9 tiles, two lane blocks
    ("NVFP4G16_E4M3S", "bf16", 600, 256, 3, 1),  # 5 row blocks x 2 tiles, no split
    ("BF16", "float", 70, 520, 9, 2),  # 64-row blocks
    ("FP8E4M3_F32ROW", "bf16", 200, 384, 1, 3),
]


@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}")
def test_dense_lanes_match_one_lane_and_reference(emu: Path, tmp_path: Path, case: tuple) -> None:
    """gemv.cu's dense launches (K splits summed by the last block with 16-byte loads of 4 lanes, several lane
    blocks side by side): each row bitwise the same with 8 lanes per block and with one, and both against the
    NumPy reference."""
    _dense_case(emu, tmp_path, case, cluster=False)


# the K splits as thread-block clusters (gv_store_cl): 1-16 tiles per split, 1 to 16 splits (a cluster of 16 is
# the non-portable maximum), partial row blocks, 1 to 10 rows (one and two lane blocks)
CLUSTER_DENSE_CASES = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 9),  # 1 tile per split (9 tiles)
    ("NVFP4G16_E4M3S", "bf16", 130, 2048, 5, 16),  # 16 splits of one tile
    ("BF16", "float", 70, 520, 1, 2),  # 64-row blocks, 5 tiles as 3 + 2
    ("FP8E4M3_F32ROW", "bf16", 200, 1536, 4, 12),
    ("NVFP4G16_E4M3S", "float", 40, 640, 2, 5),
    ("BF16", "bf16", 100, 896, 8, 7),
]


@pytest.mark.parametrize(
    "case", CLUSTER_DENSE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}"
)
def test_dense_cluster_bitwise_counter(emu: Path, tmp_path: Path, case: tuple) -> None:
    """The dense launches with their splits reduced through distributed shared memory (each block's partial tile
    in its own shared memory, rank 0 adding them in split order): every output bitwise the counter path's (8 lanes
    and one per block), and against the reference."""
    _dense_case(emu, tmp_path, case, cluster=True)


def _dense_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool) -> None:
    fmt, t, n, k, rows, splits = case
    rng = np.random.default_rng(n * 7 + k)
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode((rng.standard_normal((n, k)) * 0.5).astype(F32), (n, k)).reshape(-1)
    ).view(np.uint8)
    wdec = codec.decode(buf, (n, k))
    offs = plane_offsets(fmt, (n, k), buf)
    if fmt.startswith("NVFP4"):
        dw = to_device_layout(DeviceWeight(fmt, (n, k), buf, offs))
        buf, offs = dw.data, dw.offsets
    x = (rng.standard_normal((rows, k)) * 2).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    _write(
        tmp_path,
        w=buf,
        wsize=np.array([buf.size], np.int64),
        woff=np.array(offs, np.int64),
        x=words(x, t == "bf16"),
    )
    args = ["dense", tmp_path, FMTS.index(fmt), int(t == "bf16"), n, k, splits, rows, 5]
    _emulate(emu, args)
    if cluster:
        _cluster_twin(emu, tmp_path, args, ("lanes8", "lanes1"))
    dt = np.uint16 if t == "bf16" else F32
    y8, y1 = (np.fromfile(tmp_path / f"{m}.bin", dtype=dt).reshape(rows, n) for m in ("lanes8", "lanes1"))
    assert np.array_equal(y8.view(np.uint8), y1.view(np.uint8)), "a row differs between 8 lanes and one"
    ref = ops.linear(x, wdec)
    for name, y in (("8 lanes", y8), ("one lane", y1)):
        got = bf16_decode(y) if t == "bf16" else y
        assert np.isfinite(got).all(), f"{name}: an output was not written"
        err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
        assert err <= (1.2e-2 if t == "bf16" else 2e-5), f"{name} {case}: normalised error {err:.3e}"


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(kernel bytes, decoded float weight, plane offsets) of a random [n, k] weight of ``fmt``."""
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode((rng.standard_normal((n, k)) * 0.5).astype(F32), (n, k)).reshape(-1)
    ).view(np.uint8)
    wdec = codec.decode(buf, (n, k))
    offs = plane_offsets(fmt, (n, k), buf)
    if fmt.startswith("NVFP4"):
        dw = to_device_layout(DeviceWeight(fmt, (n, k), buf, offs))
        buf, offs = dw.data, dw.offsets
    return buf, wdec, list(offs)


# producer fmt, activation type, N (hidden), K, rows, producer splits, consumer N2, consumer splits, offset
FOLD_CASES = [
    (
        "NVFP4G16_E4M3S",
        "float",
        300,
        1032,
        10,
        2,
        200,
        1,
        True,
    ),  # 3 row blocks (last partial), two lane blocks
    ("BF16", "float", 136, 256, 3, 1, 300, 2, False),  # 64-row blocks, no producer split; a split consumer
    ("FP8E4M3_F32ROW", "bf16", 264, 384, 8, 3, 100, 2, True),
]


def _fold_id(c: tuple) -> str:
    return f"{c[0]}-{c[1]}-n{c[2]}-r{c[4]}-s{c[5]}{c[7]}-{'off' if c[8] else 'w'}"


@pytest.mark.parametrize("case", FOLD_CASES, ids=_fold_id)
def test_norm_fold_producer_and_consumer(emu: Path, tmp_path: Path, case: tuple) -> None:
    """Norm folding (gemv.cu GvFold / GV_NORM): the producer's residual update and partial sums of squares, and the
    consumer's product of the normed residual: 8 lanes per block bitwise one lane, the expert-slot consumer (rows
    by xrow, in reverse) bitwise the dense one, and all against NumPy (rmsnorm of the updated residual)."""
    _fold_case(emu, tmp_path, case, cluster=False)


# producer and consumer (dense and expert slots) with their splits as clusters
CLUSTER_FOLD_CASES = [
    ("NVFP4G16_E4M3S", "float", 300, 1032, 10, 4, 200, 3, True),
    ("BF16", "bf16", 136, 512, 3, 2, 300, 6, False),
]


@pytest.mark.parametrize("case", CLUSTER_FOLD_CASES, ids=_fold_id)
def test_norm_fold_cluster_bitwise_counter(emu: Path, tmp_path: Path, case: tuple) -> None:
    """Norm folding with the splits reduced by the clusters' rank 0 (the residual update, the partial sums of
    squares from its shared memory, the consumer's products): every output bitwise the counter path's."""
    _fold_case(emu, tmp_path, case, cluster=True)


def _fold_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool) -> None:
    fmt, t, n, k, rows, s1, n2, s2, offset = case
    rng = np.random.default_rng(n * 13 + k)
    buf, wdec, offs = _weight(rng, fmt, n, k)
    buf2, wdec2, offs2 = _weight(rng, "NVFP4G16_E4M3S", n2, n)
    x = (rng.standard_normal((rows, k)) * 0.5).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    res0 = (rng.standard_normal((rows, n)) * 3).astype(F32)
    nw = (rng.standard_normal(n) * 0.3).astype(F32)
    eps = 1e-6
    _write(tmp_path, w=buf, wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64),
           w2=buf2, w2size=np.array([buf2.size], np.int64), w2off=np.array(offs2, np.int64),
           x=words(x, t == "bf16"), res=res0, nw=nw)  # fmt: skip
    assert gemv_plan(fmt, n, k).blocks_x == -(-n // (64 if fmt == "BF16" else 128))
    args = ["fold", tmp_path, FMTS.index(fmt), int(t == "bf16"), n, k, s1, rows, 3, n2, s2, int(offset), eps]
    _emulate(emu, args)
    if cluster:
        _cluster_twin(emu, tmp_path, args, ("res8", "part8", "y8", "res1", "part1", "y1", "ye"))
    dt = np.uint16 if t == "bf16" else F32
    rb = 64 if fmt == "BF16" else 128
    nblk = -(-n // rb)
    out = {m: np.fromfile(tmp_path / f"{m}.bin", dtype=F32) for m in ("res8", "res1", "part8", "part1")}
    out |= {m: np.fromfile(tmp_path / f"{m}.bin", dtype=dt).reshape(rows, n2) for m in ("y8", "y1", "ye")}
    for m in ("res", "part", "y"):
        assert np.array_equal(out[m + "8"].view(np.uint8), out[m + "1"].view(np.uint8)), (
            f"{m}: 8 lanes != one"
        )
    ye = out["ye"][::-1]  # slot s read row rows - 1 - s
    assert np.array_equal(ye.view(np.uint8), out["y8"].view(np.uint8)), "expert slots != dense consumer"
    prod = ops.linear(x, wdec)
    prod = bf16_round(prod.astype(F32)) if t == "bf16" else prod
    res = res0.astype(np.float64) + prod
    got_res = out["res8"].reshape(rows, n)
    assert np.max(np.abs(got_res - res)) / np.max(np.abs(res)) <= 1e-5, "residual update"
    pad = np.zeros((rows, nblk * rb))
    pad[:, :n] = res
    part = (pad.reshape(rows, nblk, rb) ** 2).sum(axis=2).T  # [row blocks, rows]
    got_part = out["part8"].reshape(nblk, rows)
    assert np.max(np.abs(got_part - part) / part) <= 1e-5, "partial sums of squares"
    inv = 1.0 / np.sqrt(part.sum(axis=0) / n + eps)
    h = got_res * inv[:, None] * ((1.0 + nw) if offset else nw)
    h = bf16_round(h.astype(F32)) if t == "bf16" else h
    ref = ops.linear(h.astype(F32), wdec2)
    got = bf16_decode(out["y8"]) if t == "bf16" else out["y8"]
    err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
    assert err <= (1.2e-2 if t == "bf16" else 2e-5), f"consumer: normalised error {err:.3e}"


# the SwiGLU epilogue (gemv.cu gemv_mma_gu): fmt, activation type, I (features), K, rows, gate|up splits, N2, down
# splits; N = 2 I rows, a multiple of twice the row block (both halves of a feature in one block, 4 and 8 warps)
SWIGLU_OUT_CASES = [
    (
        "NVFP4G16_E4M3S",
        "float",
        256,
        1032,
        10,
        3,
        200,
        2,
    ),  # 2 row blocks, 9 tiles as 3 splits, two lane blocks
    ("NVFP4G16_E4M3S", "bf16", 128, 256, 3, 1, 130, 1),  # one split: the block's own epilogue
    ("BF16", "float", 128, 520, 8, 2, 70, 3),  # 64-row blocks
    ("FP8E4M3_F32ROW", "bf16", 256, 384, 1, 3, 96, 2),
]


def _swiglu_out_id(c: tuple) -> str:
    return f"{c[0]}-{c[1]}-i{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}-n{c[6]}-s{c[7]}"


@pytest.mark.parametrize("case", SWIGLU_OUT_CASES, ids=_swiglu_out_id)
def test_swiglu_out_is_the_swiglu_staging(emu: Path, tmp_path: Path, case: tuple) -> None:
    """The SwiGLU epilogue (``gemv(..., swiglu_out=True)``: each row block holds its features' gate and up rows and
    stores silu(gate) * up): the next product of its [rows, I] output as plain input gives bitwise what the same
    product staging the SwiGLU of the plain [gate | up] output gives, 8 lanes and one per block the same bits, the
    counter and the cluster reductions the same bits, and the features against the NumPy reference."""
    _swiglu_out_case(emu, tmp_path, case, cluster=False)


@pytest.mark.parametrize("case", SWIGLU_OUT_CASES[::3], ids=_swiglu_out_id)
def test_swiglu_out_cluster_bitwise_counter(emu: Path, tmp_path: Path, case: tuple) -> None:
    """The SwiGLU epilogue with its splits reduced by the clusters' rank 0: the counter path's bits."""
    _swiglu_out_case(emu, tmp_path, case, cluster=True)


def _swiglu_out_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool) -> None:
    fmt, t, inter, k, rows, s1, n2, s2 = case
    n = 2 * inter
    rng = np.random.default_rng(inter * 11 + k)
    buf, wdec, offs = _weight(rng, fmt, n, k)
    buf2, wdec2, offs2 = _weight(rng, "NVFP4G16_E4M3S", n2, inter)
    x = (rng.standard_normal((rows, k)) * 0.5).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    _write(tmp_path, w=buf, wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64),
           w2=buf2, w2size=np.array([buf2.size], np.int64), w2off=np.array(offs2, np.int64),
           x=words(x, t == "bf16"))  # fmt: skip
    args = ["swiglu_out", tmp_path, FMTS.index(fmt), int(t == "bf16"), n, k, s1, rows, 3, n2, s2]
    _emulate(emu, args)
    names = ("hs8", "hs1", "gu", "yo8", "yo1", "yp", "hse")
    if cluster:
        _cluster_twin(emu, tmp_path, args, names)
    dt = np.uint16 if t == "bf16" else F32
    out = {m: np.fromfile(tmp_path / f"{m}.bin", dtype=dt) for m in names}
    for a, b, what in (("hs8", "hs1", "epilogue: 8 lanes != one"), ("yo8", "yo1", "down: 8 lanes != one"),
                       ("yo8", "yp", "down of the epilogue != down staging the SwiGLU")):  # fmt: skip
        assert out[a].size and np.array_equal(out[a].view(np.uint8), out[b].view(np.uint8)), what
    hse = out["hse"].reshape(rows, inter)[::-1]  # slot s read row rows - 1 - s
    assert np.array_equal(hse.view(np.uint8), out["hs1"].reshape(rows, inter).view(np.uint8)), (
        "expert slots != dense"
    )
    val = lambda y: bf16_decode(y) if t == "bf16" else y.astype(np.float64)  # noqa: E731
    gu = val(out["gu"]).reshape(rows, n)
    g, u = gu[:, :inter], gu[:, inter:]
    want = g / (1.0 + np.exp(-g)) * u
    got = val(out["hs8"]).reshape(rows, inter)
    assert np.isfinite(got).all(), "a feature was not written"
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= (8e-3 if t == "bf16" else 1e-6), f"silu(gate) * up: normalised error {err:.3e}"
    prod = ops.linear(x, wdec)
    ref_gu = np.max(np.abs(gu - prod)) / np.max(np.abs(prod))
    assert ref_gu <= (1.2e-2 if t == "bf16" else 2e-5), f"[gate | up] product: normalised error {ref_gu:.3e}"
    ref = ops.linear(want.astype(F32), wdec2)
    yo = val(out["yo8"]).reshape(rows, n2)
    err = np.max(np.abs(yo - ref)) / np.max(np.abs(ref))
    assert err <= (1.5e-2 if t == "bf16" else 2e-5), f"down: normalised error {err:.3e}"


# the router product with the routing in its tail (gemv.cu gemv_mma_rr): fmt, N (router rows), K, splits, rows, E,
# top-k, shared expert
RTAIL_CASES = [
    ("NVFP4G16_E4M3S", 257, 2048, 4, 1, 256, 8, True),  # the 35B-A3B's router | shared gate, one decode token
    ("NVFP4G16_E4M3S", 257, 2048, 4, 8, 256, 8, False),  # eight tokens: one 8-lane block, eight 1-lane blocks
    (
        "BF16",
        40,
        256,
        1,
        3,
        33,
        5,
        True,
    ),  # one split: every block finishes its row block itself; a lane's 2nd expert
    ("FP8E4M3_F32ROW", 130, 1024, 2, 10, 128, 4, False),  # two lane blocks of 8, a partial row block
]


@pytest.mark.parametrize(
    "case",
    RTAIL_CASES,
    ids=lambda c: f"{c[0]}-n{c[1]}-s{c[3]}-t{c[4]}-e{c[5]}k{c[6]}-{'sh' if c[7] else 'no'}",
)
def test_route_tail_is_the_product_then_moe_route(emu: Path, tmp_path: Path, case: tuple) -> None:
    """The router product with moe_route's selection in its tail (the last row block of each lane block routes its
    tokens): the logits, the ids (the shared expert's slots after the routed ones) and the weights bitwise the plain
    product followed by router.cu's moe_route, with 8-lane blocks and with one lane per block, the counters back at
    zero; the same through the cluster reduction."""
    fmt, n, k, splits, rows, e, top, shared = case
    rng = np.random.default_rng(n + 3 * k + rows)
    buf, wdec, offs = _weight(rng, fmt, n, k)
    x = (rng.standard_normal((rows, k)) * 0.5).astype(F32)
    _write(tmp_path, w=buf, wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64), x=x)
    args = ["rtail", tmp_path, FMTS.index(fmt), n, k, splits, rows, 3, e, top, int(shared)]
    _emulate(emu, args)
    names = ("y_ref", "ids_ref", "w_ref", "y_rr8", "ids_rr8", "w_rr8", "y_rr1", "ids_rr1", "w_rr1")
    if splits > 1:
        _cluster_twin(emu, tmp_path, args, names)
    out = {
        m: np.fromfile(tmp_path / f"{m}.bin", dtype=np.int32 if m.startswith("ids") else F32) for m in names
    }
    for part in ("y", "ids", "w"):
        for lanes in ("8", "1"):
            a, b = out[f"{part}_ref"], out[f"{part}_rr{lanes}"]
            assert a.size and np.array_equal(a.view(np.uint8), b.view(np.uint8)), (
                f"{part}, {lanes}-lane blocks"
            )
    ids = out["ids_ref"]
    assert ids.min() >= 0 and ids.max() <= e and (not shared or (ids[rows * top :] == e).all())
    ref = ops.linear(x, wdec)
    assert np.max(np.abs(out["y_ref"].reshape(rows, n) - ref)) / np.max(np.abs(ref)) <= 2e-5


def test_fold_rows_rule() -> None:
    """Norms fold where every product of a call is a GEMV with float32 activations: decode, and any call in the
    exact mode; not for GEMM prefill, bf16 activations or with folding off."""
    from types import SimpleNamespace

    from ninfer.cuda.model_layers import fold_rows

    def net(**kw: object) -> SimpleNamespace:
        return SimpleNamespace(**({"fold_norms": True, "act": np.dtype(F32), "prefill_gemm": True} | kw))

    assert fold_rows(net(), 1) and fold_rows(net(), 8) and not fold_rows(net(), 9)
    assert fold_rows(net(prefill_gemm=False), 300)
    assert not fold_rows(net(act=np.dtype(np.uint16)), 1)
    assert not fold_rows(net(fold_norms=False), 1)


def test_moe_fusion_rules() -> None:
    """The routing runs inside gate | up only for decode-sized calls with float32 rows whose experts run as one-lane
    GEMV slots, and only when switched on; a pending down launch (MoeCombine.down) is run exactly once by
    model_layers.settle."""
    from types import SimpleNamespace

    import ninfer.cuda.gemv_experts as gex
    from ninfer.cuda.model_layers import _route_in_experts, settle
    from ninfer.cuda.norm import MoeCombine

    on, h32 = SimpleNamespace(moe_route_fused=True), np.zeros((1, 4), F32)
    assert _route_in_experts(on, h32, 8, False, False)
    assert not _route_in_experts(on, h32, 9, False, False)  # prefill
    assert not _route_in_experts(on, h32, 4, True, False) and not _route_in_experts(on, h32, 4, False, True)
    assert not _route_in_experts(on, h32.astype(np.uint16), 1, False, False)
    assert not _route_in_experts(SimpleNamespace(), h32, 1, False, False)  # off unless switched on
    calls = []
    real, gex.gemv_experts = gex.gemv_experts, lambda *a, **kw: calls.append((a, kw))
    try:
        c = MoeCombine(np.zeros((3, 8), F32), None, None, None, None, 1, ("gu", "w", "ids", "slot"))
        done = settle(c)
        assert done.down is None and settle(done) is done
        assert calls == [(("gu", "w", "ids", "slot", 8, c.dn), {"swiglu": True})]
    finally:
        gex.gemv_experts = real


# fmt, N (rows per expert), K, splits, tokens, routed experts, top-k, shared expert
ROUTED_CASES = [
    (
        "NVFP4G16_E4M3S",
        128,
        256,
        2,
        1,
        40,
        8,
        True,
    ),  # one decode token, the shared expert's slot after the routed
    ("NVFP4G16_E4M3S", 200, 384, 1, 3, 256, 8, False),  # 256 experts (8 per lane), a partial row block
    ("BF16", 64, 128, 2, 2, 33, 5, True),  # one expert past a lane's 32: lane 0 holds experts 0 and 32
]


@pytest.mark.parametrize(
    "case", ROUTED_CASES, ids=lambda c: f"{c[0]}-e{c[5]}k{c[6]}-t{c[4]}-{'sh' if c[7] else 'no'}"
)
def test_routed_expert_launch_is_route_then_experts(emu: Path, tmp_path: Path, case: tuple) -> None:
    """gemv.cu's routed expert launch (gemv_mma_rt: the top-k inside the expert GEMV) against router.cu's
    moe_route and then the one-lane expert launch: the same ids, the same weights and the same products, bit for
    bit; the ids are NumPy's top-k (ties to the lower id) and the products match the decoded weights."""
    fmt, n, k, splits, t, e, top, shared = case
    rng = np.random.default_rng(1000 + e)
    ne = e + int(shared)
    buf, wdec, offs = _weight(rng, fmt, ne * n, k)
    x = rng.standard_normal((t, k)).astype(F32)
    lg = (rng.standard_normal((t, e + 1)) * 2).astype(F32)
    _write(tmp_path, w=buf, woff=np.array(offs, np.int64), wsize=np.array([buf.size], np.int64), x=x, lg=lg)
    args = ["routed", tmp_path, FMTS.index(fmt), n, k, splits, t, e, top, int(shared), 7]
    _emulate(emu, args)
    out = {name: np.fromfile(tmp_path / f"{name}.bin", dtype=np.int32 if name.startswith("ids") else F32)
           for name in ("ids_ref", "w_ref", "y_ref", "ids_rt", "w_rt", "y_rt")}  # fmt: skip
    for a, b in (("ids_ref", "ids_rt"), ("w_ref", "w_rt"), ("y_ref", "y_rt")):
        assert np.array_equal(out[a].view(np.uint8), out[b].view(np.uint8)), f"{a} != {b}"
    p = np.exp(lg[:, :e].astype(np.float64) - lg[:, :e].max(axis=1, keepdims=True))
    want = np.argsort(-p, axis=1, kind="stable")[:, :top]
    slots = want.reshape(-1).tolist() + ([e] * t if shared else [])
    assert out["ids_rt"].tolist() == slots
    sel = np.take_along_axis(p, want, axis=1)
    np.testing.assert_allclose(out["w_rt"].reshape(t, top), sel / sel.sum(axis=1, keepdims=True), rtol=1e-5)
    rows = [s // top for s in range(t * top)] + (list(range(t)) if shared else [])
    ref = np.stack([wdec[ex * n : (ex + 1) * n] @ x[r] for ex, r in zip(slots, rows, strict=True)])
    err = np.max(np.abs(out["y_rt"].reshape(len(slots), n) - ref)) / np.max(np.abs(ref))
    assert err <= 2e-5, f"normalised error {err:.3e}"


# fmt, hidden H, intermediate I, tokens, top-k, shared expert as slots, offset
COMBINE_CASES = [
    ("NVFP4G16_E4M3S", 2048, 256, 1, 8, True, True),  # the 35B-A3B's widths, one decode token
    ("NVFP4G16_E4M3S", 520, 128, 3, 4, False, False),  # a partial row block, the shared expert's rows apart
    ("BF16", 256, 64, 2, 2, True, True),  # 64-row blocks
    ("NVFP4G16_E4M3S", 1024, 128, 8, 2, True, True),  # eight decode lanes (eight last blocks, eight norms)
]


@pytest.mark.parametrize(
    "case", COMBINE_CASES, ids=lambda c: f"{c[0][:5]}-h{c[1]}-t{c[3]}k{c[4]}-{c[5]}-{c[6]}"
)
def test_down_with_combine_is_down_then_moe_combine_rmsnorm(emu: Path, tmp_path: Path, case: tuple) -> None:
    """gemv.cu's down launch with the MoE combine and the next norm in its tail (gemv_mma_cb: the token's last
    block plays norm.cu's 256-thread moe_combine_rmsnorm block with 128 threads) against the down launch followed by
    that kernel: the expert rows, the updated residual and the normed rows bit for bit (blocks in a shuffled order,
    the per-token counters back at zero), and the normed rows against NumPy."""
    fmt, h, inter, t, k, shared, offset = case
    rng = np.random.default_rng(h + t)
    e = 12
    n = t * k
    s = n + (t if shared else 0)
    ids = np.concatenate([rng.choice(e, size=(t, k), replace=False).reshape(-1) if t == 1 else
                          rng.integers(0, e, n), np.full(t if shared else 0, e)]).astype(np.int32)  # fmt: skip
    buf, wdec, offs = _weight(rng, fmt, (e + 1) * h, inter)
    gu = rng.standard_normal((s, 2 * inter)).astype(F32)
    ew = rng.random((t, k)).astype(F32)
    sg = rng.standard_normal(t).astype(F32)
    r = (rng.standard_normal((t, h)) * 2).astype(F32)
    nw = (rng.standard_normal(h) * 0.2).astype(F32)
    sh = rng.standard_normal((t, h)).astype(F32)
    _write(
        tmp_path, w=buf, woff=np.array(offs, np.int64), wsize=np.array([buf.size], np.int64), gu=gu, ids=ids
    )
    _write(tmp_path, ew=ew, sg=sg, r=r, nw=nw, sh=sh)
    _emulate(emu, ["combine", tmp_path, FMTS.index(fmt), h, inter, t, k, int(shared), int(offset), 1e-6, 5])
    out = {
        name: np.fromfile(tmp_path / f"{name}.bin", dtype=F32)
        for name in ("dn1", "r1", "y1", "dn2", "r2", "y2")
    }
    for a in ("dn", "r", "y"):
        assert np.array_equal(out[a + "1"].view(np.uint8), out[a + "2"].view(np.uint8)), f"{a} differs"
    # NumPy: the expert rows, the combine, the residual and the norm
    act = gu[:, :inter] / (1 + np.exp(-gu[:, :inter].astype(np.float64))) * gu[:, inter:]
    dn = np.stack([wdec[ex * h : (ex + 1) * h] @ act[j] for j, ex in enumerate(ids)])
    shr = dn[n:] if shared else sh
    comb = np.einsum("tk,tkh->th", ew, dn[:n].reshape(t, k, h)) + shr / (
        1 + np.exp(-sg[:, None].astype(np.float64))
    )
    res = r + comb
    y = res / np.sqrt(np.mean(res**2, axis=1, keepdims=True) + 1e-6) * ((1 + nw) if offset else nw)
    for name, want in (("r2", res), ("y2", y)):
        got = out[name].reshape(t, h)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err <= 2e-5, f"{name}: normalised error {err:.3e}"
