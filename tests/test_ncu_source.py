"""perf/ncu_source.py: the top SASS lines of an Nsight Compute source page by one column."""

from __future__ import annotations

import pytest

from perf.ncu_source import top_lines

_CSV = """[    0.0 s] the profiled program's own output
"Address","Source","Warp Stall Sampling (All Samples)","L1 Wavefronts Shared Excessive"
"0x10","LDS.128 R4, [R2]","5","1,024"
"0x20","STS.128 [R3], R8","2","4096"
"0x30","FFMA R1, R2, R3","9","0"
"0x40","LDS R5, [R6]","1","12"
"""


def test_top_lines_by_excess_wavefronts() -> None:
    got = top_lines(_CSV, "L1 Wavefronts Shared Excessive", 2)
    assert got == [(4096.0, "0x20", "STS.128 [R3], R8"), (1024.0, "0x10", "LDS.128 R4, [R2]")]
    values = [v for v, _, _ in top_lines(_CSV, "l1 wavefronts shared", 10)]
    assert values == [4096.0, 1024.0, 12.0]  # case-insensitive column match; the zero line dropped


def test_top_lines_other_column_and_missing_header() -> None:
    assert top_lines(_CSV, "Warp Stall Sampling", 1) == [(9.0, "0x30", "FFMA R1, R2, R3")]
    with pytest.raises(SystemExit):
        top_lines(_CSV, "No Such Metric", 3)
