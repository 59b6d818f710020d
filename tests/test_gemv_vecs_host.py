"""gemv_geometry.FRAG_STRUCTS against the fragment readers it names (cuda_src/wfrag.cuh), compiled for the host with
nvcc: each struct's m-tiles per warp (F::MT) and 16-byte vectors per lane and stage (F::VECS). The kernels size
their weight ring from F::VECS while GemvPlan.smem_bytes sizes the launch's shared memory from the table, so a
mismatch would let a block write past its shared memory (or waste occupancy). Skipped without nvcc."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from host_emu import build_nvcc_driver

from ninfer.cuda.gemv_geometry import FRAG_STRUCTS

DRIVER = r"""
#include <cstdio>
#include "wfrag.cuh"

int main() {
%LINES%
    return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = "\n".join(
        f'    std::printf("{fmt} %d %d\\n", {s}::MT, {s}::VECS);' for fmt, (s, _, _) in FRAG_STRUCTS.items()
    )
    return build_nvcc_driver(tmp_path_factory, "gemv_vecs_host", DRIVER.replace("%LINES%", lines), opt="-O0")


def test_frag_structs_match_the_fragment_readers(driver: Path) -> None:
    out = subprocess.run([str(driver)], capture_output=True, text=True, timeout=60, check=True).stdout
    got = {f: (int(mt), int(v)) for f, mt, v in (line.split() for line in out.splitlines())}
    want = {f: (mt, vecs) for f, (_, mt, vecs) in FRAG_STRUCTS.items()}
    assert got == want
    assert got["Q4G64_F16S"][1] == got["NVFP4G16_E4M3S"][1], "Q4G64's stage is NVFP4's size (4 blocks per SM)"
