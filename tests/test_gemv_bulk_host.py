"""CPU check of the decode GEMV's bulk-copy weight ring (cuda_src/gemv_bulk.cuh, ``GV_BULK``; an experiment, off
by default): NVFP4 stages filled by one lane's bulk copies on a per-stage mbarrier, the scales read from their
compact block (FragNVFP4::read_bulk). Host emulation: tests/gemv_lanes_emu.py's emulator built from gemv.cu
as it is and with ``GV_BULK 1`` (the copy a memcpy by the issuing lane, the mbarrier a phase count the warp's
other lanes poll). Dense products (N off the 16-row groups and off the row blocks, K off the 128-wide tiles, 1-10
rows, K splits, float and bf16 activations) and norm folding give every output file bitwise the cp.async ring's;
the MoE expert launches (one lane per slot, and expert lanes; expert rows a multiple of 16) pass the lanes test (each lane bitwise its one-lane
launch, all against the NumPy reference) on the bulk build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gemv_lanes_emu import FILES, both_builds, build_lanes_emu, dense_case, fold_case, fold_id, lanes_case

from ninfer.cuda.loader import source_text

NV = "NVFP4G16_E4M3S"
# fmt, activations, N, K, rows, splits
DENSE = [
    (
        NV,
        "float",
        300,
        1032,
        10,
        2,
    ),  # 3 row blocks (the last partial, its rows 296-299 a padded group) x 9 tiles
    (NV, "float", 40, 2048, 1, 5),  # one row block: m-tiles past N take the last row's group
    (NV, "bf16", 600, 256, 3, 1),
    (NV, "float", 520, 1536, 8, 7),  # 7 splits: every stage of the ring reused (parity 0 and 1)
]
FOLD = [
    (NV, "float", 300, 1032, 10, 2, 200, 1, True),
    (NV, "float", 600, 512, 8, 1, 520, 3, False),
]
# as test_gemv_lanes_host.GEMV_CASES, with expert rows a multiple of 16 (a group of the device layout never
# straddles two experts: the bulk ring copies whole 16-row groups, so GV_BULK needs every expert's first row, and a
# dense launch's row0, on a group boundary; every 27B and 35B-A3B shape has it)
LANES = [
    (NV, "float", 8, 48, 1032, 12, 3, 4, True, False),
    (NV, "bf16", 4, 32, 264, 10, 2, 3, False, True),
]


@pytest.fixture(scope="module")
def emus(lanes_emu: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    bulk = build_lanes_emu(tmp_path_factory, gemv="#define GV_BULK 1\n" + source_text("gemv.cu"))
    return {"base": lanes_emu, "bulk": bulk}


@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"{c[1]}-n{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}")
def test_bulk_dense_products_are_the_cp_async_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    both_builds(emus, tmp_path, lambda e, d: dense_case(e, d, case, cluster=False), FILES["dense"])


@pytest.mark.parametrize("case", FOLD, ids=fold_id)
def test_bulk_norm_folding_is_the_cp_async_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    both_builds(emus, tmp_path, lambda e, d: fold_case(e, d, case, cluster=False), FILES["fold"])


@pytest.mark.parametrize("case", LANES, ids=lambda c: f"{c[1]}-nb{c[2]}-{'swiglu' if c[9] else 'plain'}")
def test_bulk_expert_launches(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    lanes_case(emus["bulk"], tmp_path, case, cluster=False)
