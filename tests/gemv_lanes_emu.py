"""The host emulation of cuda_src/gemv.cu's launches, shared by the ``test_gemv_*_host.py`` modules: the kernel text
(with moe_lanes.cu's slot table, router.cu's moe_route and norm.cu's moe_combine_rmsnorm) compiled by g++ under the
CUDA emulation prelude of tests/host/attn_emu.cpp (std::thread per CUDA thread, block and warp barriers, mma.sync on
its PTX fragment layout; gemv.cu's GV_HOST_EMU branches: synchronous copies, emu_mma), driven by
tests/host/gemv_lanes_driver.cpp with NaN-poisoned shared memory, workspaces and outputs and blocks in a shuffled
order. conftest.py's ``lanes_emu`` fixture builds it once per session; the cases below run its modes (expert lanes,
dense, norm folding) and check them bitwise (8 lanes against one, the cluster reduction against the arrival
counters) and against NumPy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from host_emu import build_emulator, words
from moe_lanes_model import routing

from ninfer.cuda.linear import gemv_plan
from ninfer.cuda.loader import source_text
from ninfer.cuda.moe_lanes import slot_bound
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS, bf16_decode, bf16_round
from ninfer.reference import ops

F32 = np.float32
FMTS = ("BF16", "NVFP4G16_E4M3S", "FP8E4M3_F32ROW", "Q4G64_F16S", "Q5G64_F16S")  # the driver's fmt codes 0-4
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
# the output files of the dense and fold modes (test_gemv_w8_host and test_gemv_bulk_host compare two builds')
FILES = {"dense": ("lanes8", "lanes1"), "fold": ("res8", "part8", "y8", "res1", "part1", "y1", "ye")}


def build_lanes_emu(tmp_path_factory: pytest.TempPathFactory, gemv: str | None = None) -> Path:
    """The emulator built from cuda_src as it is, or with ``gemv`` as gemv.cu's text (a variant under test)."""
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
    gemv = source_text("gemv.cu") if gemv is None else gemv
    parts = ["attn_emu.cpp", PRELUDE, gemv, table, route, norm, "emu_io.cpp"]
    parts.append("gemv_lanes_driver.cpp")
    return build_emulator(tmp_path_factory, "gemv_lanes_emu", parts, timeout=900)


def write(d: Path, **arrays: np.ndarray) -> None:
    for name, a in arrays.items():
        np.ascontiguousarray(a).tofile(d / f"{name}.bin")


def emulate(emu: Path, args: list, cluster: bool = False) -> None:
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


def cluster_twin(emu: Path, d: Path, args: list, names: tuple[str, ...]) -> None:
    """Run ``args`` (the counter path, already run in ``d``) again as cluster launches in a copy of ``d`` (the
    inputs), and compare the outputs ``names`` bitwise."""
    c = d.parent / (d.name + "-cluster")
    shutil.copytree(d, c)
    for n in names:
        (c / f"{n}.bin").unlink()
    emulate(emu, [c if a == d else a for a in args], cluster=True)
    _same_outputs(d, c, names)


def weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(kernel bytes, decoded float weight, plane offsets) of a random [n, k] weight of ``fmt``."""
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode((rng.standard_normal((n, k)) * 0.5).astype(F32), (n, k)).reshape(-1)
    ).view(np.uint8)
    wdec = codec.decode(buf, (n, k))
    offs = plane_offsets(fmt, (n, k), buf)
    # the kernels read the device layout (ninfer/cuda/nvfp4_layout.py, qg64_layout.py)
    dw = to_device_layout(DeviceWeight(fmt, (n, k), buf, offs))
    buf, offs = dw.data, dw.offsets
    return buf, wdec, list(offs)


def lanes_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool, splits: int | None = None) -> None:
    """The lanes GEMV (gemv.cu ``experts == 2``) bitwise the one-lane expert GEMV per row, and against NumPy."""
    fmt, t, nb, n, k, tokens, top, e, shared, swiglu = case
    rng = np.random.default_rng(n * 31 + k)
    ids, xrow, experts = routing(rng, tokens, top, e, shared)
    s = ids.size
    buf, wdec, offs = weight(rng, fmt, experts * n, k)
    xrows = s if swiglu else tokens  # the down projection reads pair rows, gate|up token rows
    width = 2 * k if swiglu else k
    x = (rng.standard_normal((xrows, width)) * 2).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    z = slot_bound(s, experts, nb)
    write(tmp_path, ids=ids, xrow=xrow, dims=np.array([z, xrows, width], np.int64), w=buf,
          wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64), x=words(x, t == "bf16"))  # fmt: skip
    splits = gemv_plan(fmt, n, k).splits if splits is None else splits
    args = [tmp_path, FMTS.index(fmt), int(t == "bf16"), nb, n, k, splits, s, experts, int(swiglu), int(swiglu),
            3, 0]  # fmt: skip
    emulate(emu, args)
    if cluster:
        cluster_twin(emu, tmp_path, args, ("lanes", "one"))
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


def dense_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool) -> None:
    """gemv.cu's dense launch: each row bitwise the same with 8 lanes per block and with one, both against NumPy."""
    fmt, t, n, k, rows, splits = case
    rng = np.random.default_rng(n * 7 + k)
    buf, wdec, offs = weight(rng, fmt, n, k)
    x = (rng.standard_normal((rows, k)) * 2).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    write(
        tmp_path,
        w=buf,
        wsize=np.array([buf.size], np.int64),
        woff=np.array(offs, np.int64),
        x=words(x, t == "bf16"),
    )
    args = ["dense", tmp_path, FMTS.index(fmt), int(t == "bf16"), n, k, splits, rows, 5]
    emulate(emu, args)
    if cluster:
        cluster_twin(emu, tmp_path, args, FILES["dense"])
    dt = np.uint16 if t == "bf16" else F32
    y8, y1 = (np.fromfile(tmp_path / f"{m}.bin", dtype=dt).reshape(rows, n) for m in ("lanes8", "lanes1"))
    assert np.array_equal(y8.view(np.uint8), y1.view(np.uint8)), "a row differs between 8 lanes and one"
    ref = ops.linear(x, wdec)
    for name, y in (("8 lanes", y8), ("one lane", y1)):
        got = bf16_decode(y) if t == "bf16" else y
        assert np.isfinite(got).all(), f"{name}: an output was not written"
        err = np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref))
        assert err <= (1.2e-2 if t == "bf16" else 2e-5), f"{name} {case}: normalised error {err:.3e}"


def fold_id(c: tuple) -> str:
    return f"{c[0]}-{c[1]}-n{c[2]}-r{c[4]}-s{c[5]}{c[7]}-{'off' if c[8] else 'w'}"


def fold_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool) -> None:
    """Norm folding (gemv.cu GvFold / GV_NORM): producer and consumers bitwise across lanes and slots, against
    NumPy (rmsnorm of the updated residual)."""
    fmt, t, n, k, rows, s1, n2, s2, offset = case
    rng = np.random.default_rng(n * 13 + k)
    buf, wdec, offs = weight(rng, fmt, n, k)
    buf2, wdec2, offs2 = weight(rng, "NVFP4G16_E4M3S", n2, n)
    x = (rng.standard_normal((rows, k)) * 0.5).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    res0 = (rng.standard_normal((rows, n)) * 3).astype(F32)
    nw = (rng.standard_normal(n) * 0.3).astype(F32)
    eps = 1e-6
    write(tmp_path, w=buf, wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64),
          w2=buf2, w2size=np.array([buf2.size], np.int64), w2off=np.array(offs2, np.int64),
          x=words(x, t == "bf16"), res=res0, nw=nw)  # fmt: skip
    assert gemv_plan(fmt, n, k).blocks_x == -(-n // (64 if fmt == "BF16" else 128))
    args = ["fold", tmp_path, FMTS.index(fmt), int(t == "bf16"), n, k, s1, rows, 3, n2, s2, int(offset), eps]
    emulate(emu, args)
    if cluster:
        cluster_twin(emu, tmp_path, args, FILES["fold"])
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


def both_builds(emus: dict[str, Any], tmp_path: Path, run: Any, files: tuple[str, ...]) -> None:
    """``run(emu, dir)`` on each of two builds ("base" and a variant): every output file in ``files`` the same
    bytes."""
    out = {}
    for variant, emu in emus.items():
        d = tmp_path / variant
        d.mkdir()
        run(emu, d)
        out[variant] = {m: np.fromfile(d / f"{m}.bin", dtype=np.uint8) for m in files}
    other = next(v for v in emus if v != "base")
    for m in files:
        assert out["base"][m].size > 0
        assert np.array_equal(out["base"][m], out[other][m]), (
            f"{m}: the {other} kernel differs from the base one"
        )
