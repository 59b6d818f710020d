"""CPU check of the decode GEMV's deferred group scaling (cuda_src/gemv_products.cuh ``GV_GROUP_DEFER``, off): a
group format's tile partials scaled into the accumulators after the next tile's first products instead of at the
tile's end, the same FMAs in the same order per accumulator. The launch emulation (tests/gemv_lanes_emu.py: one
host thread per GPU thread, the kernel's own copies, reads and order; its dense launches are Q4G64's) gives every
output bitwise the default build's at one and eight lanes with K split and N off the row blocks. W8G32 (four
groups per tile) is checked on the GPU (tests/test_cuda_gemv_xlane.py). perf/gemv_variants.py "defer" times it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gemv_lanes_emu import FILES, both_builds, build_lanes_emu, dense_case

from ninfer.cuda.loader import source_text


@pytest.fixture(scope="module")
def emus(lanes_emu: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    defer = "#define GV_GROUP_DEFER 1\n" + source_text("gemv.cu")
    return {"base": lanes_emu, "defer": build_lanes_emu(tmp_path_factory, gemv=defer)}


@pytest.mark.parametrize(
    "case",
    [
        ("Q4G64_F16S", "float", 600, 1024, 1, 3),
        ("Q4G64_F16S", "float", 300, 2048, 8, 2),
        ("Q4G64_F16S", "bf16", 200, 520, 3, 1),
    ],
)
def test_deferred_scaling_launch_is_the_same_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    both_builds(emus, tmp_path, lambda e, d: dense_case(e, d, case, cluster=False), FILES["dense"])
