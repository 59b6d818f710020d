"""The resident prefill operands' bookkeeping on the CPU (ninfer/cuda/operands.py): the budget, first-use admission,
identity of a weight, the eligible weights of a model, and their place in the memory plan. The device side (the
same GEMM results with and without kept operands) is tests/test_cuda_operands.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from ninfer.cuda.memory_plan import HEADROOM, MemoryPlan, MemoryPlanError
from ninfer.cuda.operands import OperandStore, eligible_bytes, prefill_gemm_weight


@dataclass
class _Ptr:
    ptr: int


@dataclass
class _Data:
    data: _Ptr
    size: int


@dataclass
class _W:
    """The attributes of a DeviceWeight the store reads."""

    fmt: str
    shape: tuple[int, ...]
    data: Any
    offsets: tuple[int, int, int] = (0, 0, 0)

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[-1]


def _w(ptr: int, rows: int = 4, cols: int = 8, fmt: str = "NVFP4G16_E4M3S") -> _W:
    return _W(fmt, (rows, cols), _Data(_Ptr(ptr), rows * cols))


def test_store_admits_in_first_use_order_until_the_budget_is_spent() -> None:
    s = OperandStore(100)
    assert s.lookup(_w(1)) is None
    assert s.admit(64)
    s.keep(_w(1), "b1")
    assert not s.admit(64)  # 128 > 100: the second weight takes the scratch
    assert s.admit(36)
    s.keep(_w(2), "b2")
    assert (s.used, len(s)) == (100, 2)
    assert s.lookup(_w(1)) == "b1" and s.lookup(_w(2)) == "b2"
    assert not s.admit(1)


def test_store_identity_is_the_buffer_offsets_format_and_shape() -> None:
    s = OperandStore(1 << 20)
    assert s.admit(64)
    s.keep(_w(7), "kept")
    assert s.lookup(_w(7)) == "kept"  # another object for the same weight
    assert s.lookup(_w(7), "bf16") is None  # the exact pair mode's operand is another buffer
    assert s.admit(64)
    s.keep(_w(7), "kept-bf16", "bf16")
    assert s.lookup(_w(7), "bf16") == "kept-bf16" and s.lookup(_w(7)) == "kept"
    assert s.lookup(_w(8)) is None  # another buffer
    assert s.lookup(replace(_w(7), offsets=(0, 16, 32))) is None  # another view of the buffer
    assert s.lookup(_w(7, rows=2, cols=16)) is None  # same bytes, another shape
    assert s.lookup(_w(7, fmt="FP8E4M3_F32ROW")) is None


def test_store_budget_changes_and_bad_budgets() -> None:
    s = OperandStore(0)
    assert not s.admit(1)  # the default: nothing kept
    s.set_budget(10)
    assert s.admit(10)
    s.keep(_w(1), "b")
    s.set_budget(20)  # growing keeps what is kept
    assert s.lookup(_w(1)) == "b" and s.used == 10
    s.set_budget(5)  # shrinking below the kept bytes drops them
    assert s.lookup(_w(1)) is None and s.used == 0 and len(s) == 0
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="budget"):
            OperandStore(bad)  # type: ignore[arg-type]


def test_eligible_weights_are_the_dense_prefill_gemms() -> None:
    yes = (
        "model.layers.3.self_attn.qkvg_proj",
        "model.layers.3.self_attn.o_proj.weight",
        "model.layers.0.linear_attn.in_proj",
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.1.mlp.gate_up_proj",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.2.mlp.shared_expert.gate_up_proj",
        "model.layers.2.mlp.shared_expert.down_proj.weight",
        "model.layers.2.mlp.router_gates",  # the prefill router's pair-mode GEMM (bf16 operand)
    )
    no = (
        "model.layers.2.mlp.experts.gate_up_proj",  # grouped GEMM, converted in its main loop
        "model.layers.2.mlp.experts.down_proj",
        "lm_head.weight",
        "model.embed_tokens.weight",
        "mtp.layers.0.mlp.gate_up_proj",  # speculation only
        "model.layers.0.input_layernorm.weight",
    )
    assert all(prefill_gemm_weight(n) for n in yes)
    assert not any(prefill_gemm_weight(n) for n in no)
    weights = [(n, _w(i, 16, 32)) for i, n in enumerate(yes + no)]
    assert eligible_bytes(weights, lambda f, n, k: True) == len(yes) * 2 * 16 * 32
    assert eligible_bytes(weights, lambda f, n, k: False) == 0  # e.g. BF16 weights: no fp16 mode
    assert eligible_bytes([("model.layers.0.linear_attn.in_proj", object())], lambda f, n, k: True) == 0


def _plan(**kw: int) -> MemoryPlan:
    base = dict(weights=10, kv_pool=20, gdn_lanes=1, checkpoints=2, workspace=3, graph_pools=4, free=100)
    return MemoryPlan(**{**base, **kw})


def test_plan_counts_the_operands_and_its_spare_is_what_check_allows() -> None:
    p = _plan()
    assert p.spare == int((100 - 10) * (1 - HEADROOM)) - 30
    q = replace(p, prefill_operands=p.spare)
    assert q.total == p.total + p.spare and q.spare == 0
    q.check()  # exactly the spare fits
    assert "prefill_operands" in q.report() and q.as_dict()["prefill_operands"] == p.spare
    with pytest.raises(MemoryPlanError, match="--prefill-weights scratch"):
        replace(p, prefill_operands=p.spare + 1).check()
    assert _plan(reserve=50).spare < p.spare  # the reserve is not ours


def test_budget_by_mode() -> None:
    from ninfer.cuda.operands import budget

    assert budget("auto", 100, 30) == 30 and budget("auto", 100, 300) == 100 and budget("auto", 100, -5) == 0
    assert budget("resident", 100, 30) == 100  # the caller's plan refuses it
    assert budget("scratch", 100, 300) == 0
    with pytest.raises(ValueError, match="prefill_weights"):
        budget("always", 1, 1)
