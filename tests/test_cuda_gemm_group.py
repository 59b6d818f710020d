"""The group-int formats' fp16-mode prefill GEMM (ninfer/cuda/gemm_group.py, cuda_src/gemm_sm90_ws.cu
gemm90_f16_wsg, dequant90<D, true>, group_scales_t) on the device, with ``gemm_plan.GROUP_F16`` on: fresh random
inputs against NumPy with the same input rounding (``ops.round_fp16_rows``) at the fp32-accumulation tolerance, for
Q4/Q5/Q6 g64 and W8 g32; strided views and nothing written outside them; the kept operands (``OperandStore``) and
the per-call scratch, whole or in weight-row chunks, give the same bits; split-K units against the unsplit kernel
at the accumulation tolerance and bitwise repeatable; the deferred scaling (``GROUP_DEFER``) bitwise the undeferred
kernel; off, the same call stays on the exact kernel. The schedule, tensor maps and descriptor addressing are
checked on the CPU (tests/test_gemm_ws_host.py). Skipped without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_gemm_group.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_f16 import _x, gemm_strided, sm90a_cupy
from test_cuda_gemm_pair import TOL, _err, _weight

from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
GROUP_FMTS = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")
# (M, N, K): one row tile, ragged tiles off the 128-column tile and the 64-k K tile, K off the formats' 128
# padding, a K long enough to wrap the 6-slot ring several times (N % 4 == 0: the scale map's row stride)
SHAPES = ((128, 8, 64), (129, 300, 200), (257, 1000, 512), (300, 520, 2056))


@pytest.fixture
def cp(monkeypatch: pytest.MonkeyPatch) -> Any:
    from ninfer.cuda import gemm_plan

    cupy = sm90a_cupy()
    monkeypatch.setattr(gemm_plan, "GROUP_F16", True)
    return cupy


@pytest.mark.parametrize("fmt", GROUP_FMTS)
def test_group_f16_matches_rounded_reference(cp: Any, fmt: str) -> None:
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(71)
    for m, n, k in SHAPES:
        w, wf = _weight(rng, fmt, n, k)
        x = _x(rng, m, k)
        got = gemm_strided(cp, x, w, f"{fmt} {m}x{n}x{k}", col0=4, inputs="fp16", variant="ws1")
        err = _err(got, ops.linear(ops.round_fp16_rows(x), wf))
        assert err <= TOL, f"{fmt} {m}x{n}x{k}: normalised max error {err:.2e} against the rounded inputs"
        for r in (0, 1 % m, 2 % m, m - 1):  # the tiny and huge rows are not hidden by the others' scale
            ref = ops.linear(ops.round_fp16_rows(x[r : r + 1]), wf)
            assert _err(got[r : r + 1], ref) <= TOL, f"{fmt} {m}x{n}x{k}: row {r}"
        exact = cp.asnumpy(gemm(cp.asarray(x), w))
        assert not np.array_equal(exact, got), f"{fmt}: the fp16 mode gave the exact result (not taken?)"


@pytest.mark.parametrize("fmt", ("Q4G64_F16S", "W8G32_F16S"))
def test_group_f16_kept_operands_splits_and_default(
    cp: Any, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ninfer.cuda import gemm_plan
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(73)
    m, n, k = 256, 1024, 4096
    w, wf = _weight(rng, fmt, n, k)
    x = cp.asarray(_x(rng, m, k))
    base = cp.asnumpy(gemm(x, w, inputs="fp16", variant="ws1"))
    store = OperandStore(1 << 30)
    kept = cp.asnumpy(gemm(x, w, inputs="fp16", variant="ws1", operands=store))
    assert len(store) == 2 and np.array_equal(kept, base), "kept codes / scales: other bits than the scratch"
    again = cp.asnumpy(gemm(x, w, inputs="fp16", variant="ws1", operands=store))
    assert np.array_equal(again, base), "second call from the kept operands"
    monkeypatch.setattr(gemm_plan, "_W_CAP", 2 * 256 * k)  # the scratch in four weight-row chunks
    chunked = cp.asnumpy(gemm(x, w, inputs="fp16", variant="ws1"))
    assert np.array_equal(chunked, base), "weight-row chunks of the scratch: other bits"
    monkeypatch.undo()
    monkeypatch.setattr(gemm_plan, "GROUP_F16", True)
    split = cp.asnumpy(gemm(x, w, inputs="fp16", variant="ws3"))
    assert _err(split, base) <= TOL, "split-K: the same product at the fp32-accumulation tolerance"
    assert np.array_equal(split, cp.asnumpy(gemm(x, w, inputs="fp16", variant="ws3"))), (
        "split-K not repeatable"
    )
    ref = ops.linear(ops.round_fp16_rows(cp.asnumpy(x)), wf)
    assert _err(split, ref) <= TOL
    monkeypatch.setattr(gemm_plan, "GROUP_F16", False)
    off = cp.asnumpy(gemm(x, w, inputs="fp16"))
    assert np.array_equal(off, cp.asnumpy(gemm(x, w))), "GROUP_F16 off: the exact kernel, as inputs='exact'"


@pytest.mark.parametrize("fmt", ("Q4G64_F16S", "Q6G64_F16S"))
def test_deferred_group_scaling_is_the_same_bits(cp: Any, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gemm_plan.GROUP_DEFER (gemm90_f16_wsgd<1>: each K tile's scaling after the next tile's wgmmas): bitwise the
    undeferred kernel, unsplit and split, with the ring wrapping and CTAs walking several units."""
    import ninfer.cuda.gemm as lin
    from ninfer.cuda import gemm_plan
    from ninfer.cuda.gemm import gemm

    names: list[str] = []
    real = lin._sm90_kernel
    monkeypatch.setattr(lin, "_sm90_kernel", lambda name: (names.append(name), real(name))[1])
    rng = np.random.default_rng(77)
    for m, n, k in ((129, 300, 200), (300, 520, 2056), (1100, 4100, 1032)):
        w, _ = _weight(rng, fmt, n, k)
        x = cp.asarray(_x(rng, m, k))
        for variant in ("ws1", "ws3", "auto"):
            monkeypatch.setattr(gemm_plan, "GROUP_DEFER", False)
            base = cp.asnumpy(gemm(x, w, inputs="fp16", variant=variant))
            monkeypatch.setattr(gemm_plan, "GROUP_DEFER", True)
            names.clear()
            got = cp.asnumpy(gemm(x, w, inputs="fp16", variant=variant))
            assert "gemm90_f16_wsgd<1>" in names, f"{variant}: the deferred kernel was not launched"
            assert np.array_equal(got, base), (
                f"{fmt} {m}x{n}x{k} {variant}: the deferred scaling changed bits"
            )
