"""BF16's fp16 path's host-side rules (ninfer/cuda/gemm_bf16.py, ninfer/cuda/operands.py; pure CPU): when gemm()
tries it, and the OperandStore's refusal of a weight that fp16 does not hold exactly."""

from __future__ import annotations

import pytest

from ninfer.cuda import gemm_plan
from ninfer.cuda.gemm_bf16 import bf16_f16_ok, bf16_operands
from ninfer.cuda.operands import OperandStore


class _Data:
    class data:  # noqa: N801 - the shape of a CuPy array's .data.ptr
        ptr = 4096

    size = 64


class _W:
    fmt, rows, cols, offsets, shape = "BF16", 4, 8, (0,), (4, 8)
    data = _Data()


def test_on_by_default_and_its_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gemm_plan.BF16_F16 is True, "the default since its GPU tests and bench_gemm ran (docs/cuda.md)"
    assert bf16_f16_ok("BF16", "float", 128, 1024, 5120) and bf16_operands("BF16", 1024, 5120)
    assert not bf16_f16_ok("BF16", "float", 127, 1024, 5120), "below the fp16 mode's row floor"
    assert not bf16_f16_ok("BF16", "float", 4096, 1024, 5124), "TMA: K % 8"
    assert not bf16_f16_ok("BF16", "bf16", 4096, 1024, 5120), "float32 rows only"
    assert not bf16_f16_ok("NVFP4G16_E4M3S", "float", 4096, 1024, 5120)
    assert not bf16_operands("Q4G64_F16S", 1024, 5120)
    # the small, precision-critical tensors every profile keeps BF16 stay on the exact path
    for n, k in ((256, 2048), (512, 2048), (48, 5120), (1, 2048)):  # routers, GDN a / b, shared-expert gate
        assert not bf16_f16_ok("BF16", "float", 4096, n, k) and not bf16_operands("BF16", n, k), (n, k)
    monkeypatch.setattr(gemm_plan, "BF16_F16", False)
    assert not bf16_f16_ok("BF16", "float", 4096, 1024, 5120) and not bf16_operands("BF16", 1024, 5120)


def test_refused_operand_gives_its_bytes_back() -> None:
    store, w = OperandStore(1000), _W()
    assert store.admit(600) and store.used == 600
    assert not store.refused(w, "f16row")
    store.refuse(w, "f16row", 600)
    assert store.used == 0 and store.refused(w, "f16row") and not store.refused(w, "f16")
    assert store.lookup(w, "f16row") is None and len(store) == 0
    store.set_budget(10)  # drops the kept operands (clear), not what the weight's values decided
    assert store.refused(w, "f16row") and store.used == 0


def test_obtain_builds_once_and_remembers_a_refusal() -> None:
    store, w, built = OperandStore(1000), _W(), []

    def ok() -> str:
        built.append("ok")
        return "operand"

    assert store.obtain(w, "f16", 600, ok) == "operand" and store.used == 600
    assert store.obtain(w, "f16", 600, ok) == "operand" and built == ["ok"], "kept: not built again"
    assert store.obtain(w, "f16row", 600, ok) is None and built == ["ok"], "no room: not built"

    def inexact() -> None:
        built.append("inexact")

    store.set_budget(2000)
    assert (
        store.obtain(w, "f16row", 600, inexact) is None and store.used == 600 and store.refused(w, "f16row")
    )
    assert store.obtain(w, "f16row", 600, inexact) is None and built == ["ok", "inexact"], (
        "refused: not rebuilt"
    )
