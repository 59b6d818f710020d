"""CPU check of cuda_src/router.cu's ``expert_tiles`` (the grouped expert GEMM's tile table in one launch): the kernel
text compiled by g++ under the CUDA emulation prelude of tests/host/gdn_emu.cpp (std::thread per CUDA thread, real
block barriers; ``__shared__`` as ``static``) and compared with the CuPy expressions it replaced (searchsorted,
cumsum, the tile's expert and first slot), written here in NumPy: every entry equal, over experts with no slots,
runs of empty experts at both ends, a single expert, more tiles than threads and uneven counts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator

from ninfer.cuda.loader import source_text

DRIVER = r"""
#include <cstdio>
int main(int argc, char** argv) {
    if (argc != 5) return 2;
    const std::string dir = argv[1];
    const int S = atoi(argv[2]), E = atoi(argv[3]), BM = atoi(argv[4]), bound = (S + BM - 1) / BM + E;
    auto ids = emu_read<int>(dir + "/ids.bin", S);
    std::vector<int> off(E + 1, -7), te(bound, -7), ts(bound, -7), nt(1, -7);
    emu_launch({1, 1, 1}, ET_NT, 0, [&] {
        expert_tiles(ids.data(), S, E, BM, bound, off.data(), te.data(), ts.data(), nt.data());
    });
    emu_write(dir + "/off.bin", off);
    emu_write(dir + "/tile_e.bin", te);
    emu_write(dir + "/tile_s0.bin", ts);
    emu_write(dir + "/ntiles.bin", nt);
    return 0;
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = source_text("router.cu")
    kernel = text[
        text.index("// expert_tiles: the grouped expert GEMM") :
    ]  # the other kernels need warp intrinsics
    head = source_text("common.cuh") if "#include" not in kernel else ""
    parts = [
        "gdn_emu.cpp",
        "#undef __shared__\n#define __shared__ static",
        head,
        kernel,
        "emu_io.cpp",
        DRIVER,
    ]
    return build_emulator(tmp_path_factory, "router_emu", parts)


def _numpy_tiles(ids: np.ndarray, e: int, bm: int) -> tuple[np.ndarray, ...]:
    """gemm.expert_tiles' former CuPy expressions, in NumPy."""
    off = np.searchsorted(ids, np.arange(e + 1), side="left").astype(np.int32)
    tiles = (off[1:] - off[:-1] + bm - 1) // bm
    end = np.cumsum(tiles)
    bound = -(-ids.shape[0] // bm) + e
    i = np.arange(bound)
    te = np.minimum(np.searchsorted(end, i, side="right"), e - 1)
    ts = off[te] + (i - (end[te] - tiles[te])) * bm
    return off, te.astype(np.int32), ts.astype(np.int32), end[-1:].astype(np.int32)


def _ids(rng: np.random.Generator, s: int, e: int, kind: str) -> np.ndarray:
    if kind == "uniform":
        return np.sort(rng.integers(0, e, s)).astype(np.int32)
    if kind == "skewed":  # a few experts take most slots, many none
        return np.sort(np.minimum(rng.geometric(0.05, s) - 1, e - 1)).astype(np.int32)
    lo, hi = e // 3, e // 3 + 5  # only a middle run of experts: empty runs at both ends
    return np.sort(rng.integers(lo, hi, s)).astype(np.int32)


CASES = (  # slots, experts, tile rows, ids
    (36864, 256, 128, "uniform"),  # a 35B-A3B 4096-token chunk's routed slots
    (2048, 256, 128, "skewed"),
    (1000, 257, 128, "middle"),
    (300, 1, 128, "uniform"),
    (5, 64, 16, "uniform"),
    (4000, 1024, 8, "skewed"),  # more tiles than threads, the largest expert count
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"S{c[0]}E{c[1]}bm{c[2]}{c[3]}")
def test_expert_tiles_emulated(emu: Path, tmp_path: Path, case: tuple) -> None:
    s, e, bm, kind = case
    ids = _ids(np.random.default_rng(s + e), s, e, kind)
    ids.tofile(tmp_path / "ids.bin")
    proc = subprocess.run(
        [str(emu), str(tmp_path), str(s), str(e), str(bm)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    want = _numpy_tiles(ids, e, bm)
    for name, w in zip(("off", "tile_e", "tile_s0", "ntiles"), want, strict=True):
        got = np.fromfile(tmp_path / f"{name}.bin", dtype=np.int32)
        np.testing.assert_array_equal(got, w, err_msg=name)
