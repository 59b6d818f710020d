"""The group formats' fp16 path's host-side rules (ninfer/cuda/gemm_group.py; pure CPU): when gemm() takes it,
the stored layout's group count, and the bytes its kept operands take in the memory plan."""

from __future__ import annotations

import pytest

from ninfer.cuda import gemm_plan
from ninfer.cuda.gemm_group import GROUP_STRUCTS, _groups, group_f16_ok, group_operand_extra, group_operands
from ninfer.cuda.operands import eligible_bytes


def test_off_by_default_and_the_conditions_when_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gemm_plan.GROUP_F16 is False, "not the default until the GPU suite and bench_gemm have run it"
    assert not group_f16_ok("Q4G64_F16S", "float", 4096, 5120, 5120)
    assert not group_operands("Q4G64_F16S")
    monkeypatch.setattr(gemm_plan, "GROUP_F16", True)
    for fmt in GROUP_STRUCTS:
        assert group_f16_ok(fmt, "float", 128, 5120, 5120) and group_operands(fmt)
    assert not group_f16_ok("Q4G64_F16S", "float", 127, 5120, 5120), "below the fp16 mode's row floor"
    assert not group_f16_ok("Q4G64_F16S", "bf16", 4096, 5120, 5120), "float32 rows only"
    assert not group_f16_ok("Q4G64_F16S", "float", 4096, 5120, 5124), "TMA: K % 8"
    assert not group_f16_ok("Q4G64_F16S", "float", 4096, 5122, 5120), "the scale map: N % 4"
    assert not group_f16_ok("NVFP4G16_E4M3S", "float", 4096, 5120, 5120), "a folded format: gemm_pair's path"


def test_groups_follow_the_stored_layout() -> None:
    """Groups per row: K padded to 128, over 64 (Q g64) or 32 (W8 g32): the scale plane's row length."""
    assert _groups("Q4G64_F16S", 5120) == 80 and _groups("Q4G64_F16S", 200) == 4
    assert _groups("W8G32_F16S", 5120) == 160 and _groups("W8G32_F16S", 200) == 8


def test_kept_operand_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    class W:
        def __init__(self, fmt: str) -> None:
            self.fmt, self.rows, self.cols = fmt, 16, 200

    weights = [
        ("model.layers.0.mlp.down_proj.weight", W("Q4G64_F16S")),
        ("model.layers.0.mlp.gate_up", W("BF16")),
    ]
    assert group_operand_extra("Q4G64_F16S", 16, 200) == 4 * 16 * 4
    assert group_operand_extra("NVFP4G16_E4M3S", 16, 200) == 0
    monkeypatch.setattr(gemm_plan, "GROUP_F16", True)
    got = eligible_bytes(weights, group_operands, group_operand_extra)
    assert got == 2 * 16 * 200 + 4 * 16 * 4, "codes as fp16 + float32 scales; BF16 not kept"
