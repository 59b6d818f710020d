"""The group formats' fp16 path's host-side rules (ninfer/cuda/gemm_group.py; pure CPU): when gemm() takes it,
the stored layout's group count, and the bytes its kept operands take in the memory plan."""

from __future__ import annotations

import pytest

from ninfer.cuda import gemm_plan
from ninfer.cuda.gemm_group import (
    GROUP_STRUCTS,
    _chunk_rows,
    _groups,
    group_f16_ok,
    group_operand_extra,
    group_operands,
    group_scratch_bytes,
)
from ninfer.cuda.operands import eligible_bytes


def test_on_by_default_and_its_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gemm_plan.GROUP_F16 is True, "the default since its GPU tests and bench_gemm ran (docs/cuda.md)"
    for fmt in GROUP_STRUCTS:
        assert group_f16_ok(fmt, "float", 128, 5120, 5120) and group_operands(fmt)
    assert not group_f16_ok("Q4G64_F16S", "float", 127, 5120, 5120), "below the fp16 mode's row floor"
    assert not group_f16_ok("Q4G64_F16S", "bf16", 4096, 5120, 5120), "float32 rows only"
    assert not group_f16_ok("Q4G64_F16S", "float", 4096, 5120, 5124), "TMA: K % 8"
    assert not group_f16_ok("Q4G64_F16S", "float", 4096, 5122, 5120), "the scale map: N % 4"
    assert not group_f16_ok("NVFP4G16_E4M3S", "float", 4096, 5120, 5120), "a folded format: gemm_pair's path"
    monkeypatch.setattr(gemm_plan, "GROUP_F16", False)
    assert not group_f16_ok("Q4G64_F16S", "float", 4096, 5120, 5120) and not group_operands("Q4G64_F16S")


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
    got = eligible_bytes(weights, lambda f, n, k: group_operands(f), group_operand_extra)
    assert got == 2 * 16 * 200 + 4 * 16 * 4, "codes as fp16 + float32 scales; BF16 not kept"


def test_scales_scratch_covers_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """group_scratch_bytes bounds the "gs" scratch of every call gemm_group_f16 makes without kept operands: each
    weight chunk's float32 scales, [groups, chunk rows], for every group format; 0 off or below the row floor."""
    shapes = [(10240, 5120), (34816, 5120), (5120, 17408), (5120, 6144), (200, 72)]
    bound, most = group_scratch_bytes(4096, shapes), 0
    for n, k in shapes:
        nw = _chunk_rows(n, k)  # what gemm_group_f16 builds per call
        for fmt in GROUP_STRUCTS:
            for n0 in range(0, n, nw):
                most = max(most, 4 * _groups(fmt, k) * min(nw, n - n0))
    assert bound == most, "the largest chunk's scales, no more"
    assert group_scratch_bytes(gemm_plan.PAIR_MIN_ROWS - 1, shapes) == 0
    monkeypatch.setattr(gemm_plan, "GROUP_F16", False)
    assert group_scratch_bytes(4096, shapes) == 0


def test_memory_plan_counts_the_scales_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's plan adds it (and the group kernel's split-K partials) to the prefill GEMM's scratch."""
    from ninfer.artifact.registry import MODELS
    from ninfer.cuda import memory_plan as mp

    mc = MODELS["qwen3.6-27b"].config
    on, scales = mp._gemm_scratch(mc, 2048), group_scratch_bytes(2048, mp._dense_shapes(mc))
    monkeypatch.setattr(gemm_plan, "GROUP_F16", False)
    off = mp._gemm_scratch(mc, 2048)
    assert on - off >= scales > 0


def test_memory_plan_skips_it_without_group_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with no group-int weight (NVFP4, FP8, BF16) reserves neither the scales scratch nor the group
    kernel's split-K partials: the plan is the one with GROUP_F16 off."""
    from ninfer.artifact.registry import MODELS
    from ninfer.cuda import memory_plan as mp

    mc = MODELS["qwen3.6-27b"].config
    assert mp.has_group_weights(["BF16", "Q4G64_F16S"]) and not mp.has_group_weights(
        ["NVFP4G16_E4M3S", "BF16"]
    )
    with_group, without = mp._gemm_scratch(mc, 2048, True), mp._gemm_scratch(mc, 2048, False)
    assert with_group - without >= group_scratch_bytes(2048, mp._dense_shapes(mc)) > 0
    monkeypatch.setattr(gemm_plan, "GROUP_F16", False)
    assert mp._gemm_scratch(mc, 2048) == without
