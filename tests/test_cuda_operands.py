"""Resident prefill operands on the device (ninfer/cuda/operands.py): a GEMM reading a weight's kept fp16 operand
gives bitwise the result of the per-call dequant pass, for every format with the fp16 mode, both scratch kernels
(cp, ws), chunked scratch on the other side, a SwiGLU input; the store fills once per weight and respects its
budget; a model's prefill is bitwise the same with and without kept operands; the runner sizes them by its memory
plan. Skipped without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_operands.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_f16 import F16_FMTS, _x
from test_cuda_gemm_pair import _weight

pytestmark = pytest.mark.gpu

F32 = np.float32
SHAPES = ((128, 300, 200), (257, 1000, 512), (520, 4100, 264))


@pytest.fixture
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90_ws.cu", compute_capability()).endswith("a"):
        pytest.skip("the fp16 scratch kernels need sm_90a (compute capability 9.0)")
    return cupy


@pytest.fixture
def dequants(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts dequant passes (gemm_pair._dequant calls), so a test knows which side read the kept operand."""
    import ninfer.cuda.gemm_pair as gp

    calls: list[int] = []
    real = gp._dequant

    def counted(*a: Any, **k: Any) -> None:
        calls.append(1)
        real(*a, **k)

    monkeypatch.setattr(gp, "_dequant", counted)
    return calls


@pytest.mark.parametrize("variant", ["cp", "ws"])
@pytest.mark.parametrize("fmt", F16_FMTS)
def test_kept_operand_is_bitwise_the_scratch(
    cp: Any, dequants: list[int], monkeypatch: pytest.MonkeyPatch, fmt: str, variant: str
) -> None:
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(5)
    for m, n, k in SHAPES:
        w, _ = _weight(rng, fmt, n, k)
        monkeypatch.setattr(plan, "_W_CAP", 2 * 256 * k)  # the scratch side in 256-row weight chunks
        store = OperandStore(1 << 30)
        for rep in range(2):
            xd = cp.asarray(_x(rng, m, k))
            before = len(dequants)
            want = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant=variant))
            assert len(dequants) - before == -(-n // 256), f"{fmt} {m}x{n}x{k}: the scratch was not chunked"
            before = len(dequants)
            got = cp.asnumpy(gemm(xd, w, impl="pair", inputs="fp16", variant=variant, operands=store))
            assert len(dequants) - before == (1 if rep == 0 else 0), "filled once, then read"
            assert len(store) == 1 and store.used == 2 * n * k
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{fmt} {m}x{n}x{k} rep {rep}"


def test_budget_and_swiglu_input(cp: Any, dequants: list[int]) -> None:
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(6)
    m, n, k = 300, 520, 1032
    w, _ = _weight(rng, "NVFP4G16_E4M3S", n, k)
    x2 = cp.asarray(np.concatenate([_x(rng, m, k), _x(rng, m, k)], axis=1))  # [gate | up]
    want = cp.asnumpy(gemm(x2, w, inputs="fp16", swiglu=True))
    small = OperandStore(2 * n * k - 1)  # one byte short: the scratch, as before
    before = len(dequants)
    got = cp.asnumpy(gemm(x2, w, inputs="fp16", swiglu=True, operands=small))
    assert len(small) == 0 and small.used == 0 and len(dequants) > before
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    store = OperandStore(2 * n * k)
    for _ in range(2):
        got = cp.asnumpy(gemm(x2, w, inputs="fp16", swiglu=True, operands=store))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert len(store) == 1
    # exact inputs never read a kept fp16 operand (their operands are bf16 values)
    exact = cp.asnumpy(gemm(x2, w, inputs="exact", swiglu=True)).view(np.uint32)  # row 0: inf * 0 = NaN
    assert np.array_equal(
        cp.asnumpy(gemm(x2, w, inputs="exact", swiglu=True, operands=store)).view(np.uint32), exact
    )


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_model_prefill_bitwise_with_kept_operands(cp: Any, kind: str) -> None:
    """The mid-size models' 300-token prefill (every dense projection a fp16-mode GEMM) and decode after it: the
    same logits bits with the store empty and with every operand kept."""
    from test_cuda_model import _mid_reference, _sequences

    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.upload import upload_encoded

    cfg, enc, ids, _ = _mid_reference(kind)
    net = CudaQwen36(cfg, upload_encoded(cfg, enc))
    seqs = _sequences(net)
    want_bytes = net.prefill_operand_bytes()
    assert want_bytes > 0

    def run() -> np.ndarray:
        s = seqs.new()
        out = [net.lm_head(seqs.forward(s, ids[:300]))]
        out += [net.lm_head(seqs.forward_batch(ids[i : i + 1], [s])) for i in range(300, 304)]
        seqs.free(s)
        return np.concatenate(out)

    want = run()
    assert len(net.operands) == 0
    net.operands.set_budget(want_bytes)
    got = run()
    assert len(net.operands) > 0 and 0 < net.operands.used <= want_bytes
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    again = run()  # now read from the kept operands only
    assert np.array_equal(again.view(np.uint32), want.view(np.uint32))
    net.prefill_weights = "scratch"
    assert net.prefill_operand_bytes() == 0


def test_runner_keeps_operands_by_its_plan(cp: Any, tmp_path: Any) -> None:
    """``auto``: the runner's plan lists the kept operands (here all of them: a tiny model) and the start-up prefill
    fills them; ``scratch``: none; more than the plan leaves: ``auto`` keeps the spare, ``resident`` refuses."""
    from ninfer.cuda.memory_plan import MemoryPlanError
    from ninfer.cuda.model import load_cuda
    from ninfer.demo import build_demo
    from ninfer.engine import Engine
    from ninfer.model import load

    path = build_demo(tmp_path / "demo.ninfer", profile="nvfp4")
    model = load(path)
    model.net, model.backend = load_cuda(path, progress=False), "cuda"
    net = model.net
    want = net.prefill_operand_bytes()
    assert want > 0
    kw = dict(max_context=1024, kv_capacity=4096, max_concurrency=1, prefill_chunk=256)
    with Engine.from_model(model, **kw) as eng:
        assert eng.memory_plan()["prefill_operands"] == want
        assert net.operands.budget == want and 0 < net.operands.used <= want  # warm_prefill filled them
    net.prefill_weights = "scratch"
    with Engine.from_model(model, **kw) as eng:
        assert eng.memory_plan()["prefill_operands"] == 0 and len(net.operands) == 0
    net.prefill_operand_bytes = lambda: 1 << 50  # type: ignore[method-assign]  # more than any GPU holds
    try:
        net.prefill_weights = "auto"
        with Engine.from_model(model, **kw) as eng:
            plan = eng.memory_plan()
            assert 0 < plan["prefill_operands"] < 1 << 50 and net.operands.budget == plan["prefill_operands"]
        net.prefill_weights = "resident"
        with pytest.raises(MemoryPlanError, match="does not fit"):
            Engine.from_model(model, **kw)
    finally:
        del net.prefill_operand_bytes
        net.prefill_weights = "auto"
