"""BF16 weights in the fp16-mode prefill GEMM (ninfer/cuda/gemm_bf16.py, cuda_src/gemm_sm90.cu bf16_f16_rows,
gemm90_f16_ws<DqFolded<RowPow2>>) on the device, with ``gemm_plan.BF16_F16`` on: fresh random inputs against NumPy
with the same input rounding at the fp32-accumulation tolerance, strided views, the kept operand reused, split-K;
a weight with a value fp16 cannot hold at its row's scale refused (the exact pair mode's bits, and no second
build); off, the exact pair mode. The fixture lifts the size floor (``BF16_F16_MIN_ELEMS``: the default keeps the
small always-BF16 tensors exact, tests/test_gemm_bf16_plan.py) so that small shapes take the path. The element rule is checked on the CPU (tests/test_gemm_f16_host.py).
Skipped without an sm_90a device.

    python -m pytest -m gpu tests/test_cuda_gemm_bf16.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_cuda_gemm_f16 import gemm_strided, sm90a_cupy
from test_cuda_gemm_pair import TOL, _err

from ninfer.formats import FORMATS
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
SHAPES = ((128, 6, 8), (129, 300, 200), (257, 1000, 512), (300, 520, 2056))


@pytest.fixture
def cp(monkeypatch: pytest.MonkeyPatch) -> Any:
    from ninfer.cuda import gemm_plan

    cupy = sm90a_cupy()
    monkeypatch.setattr(gemm_plan, "BF16_F16", True)
    monkeypatch.setattr(gemm_plan, "BF16_F16_MIN_ELEMS", 0)
    return cupy


def test_bf16_f16_matches_rounded_reference(cp: Any) -> None:
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(81)
    for m, n, k in SHAPES:
        # magnitudes within 2^-12 of each row's largest: every weight exact in fp16 at its row's scale, whatever the
        # seed (Gaussian rows would hold a value too small for it about once in 10^9)
        sign = rng.choice(np.array([-1.0, 1.0], F32), (n, k))
        wf = (sign * rng.uniform(0.5, 1.0, (n, k)) * 2.0 ** rng.integers(-12, 0, (n, k))).astype(F32)
        wf[1 % n] *= 2.0**40  # rows of other magnitudes: their own power of two
        wf[2 % n] *= 2.0**-40
        w, wf = _upload(wf), _bf16(wf)  # the stored bf16 values
        x = (rng.standard_normal((m, k)) * 4).astype(F32)
        store = OperandStore(1 << 30)
        got = gemm_strided(cp, x, w, f"{m}x{n}x{k}", inputs="fp16", operands=store)
        assert len(store) == 1, "the operand kept"
        err = _err(got, ops.linear(ops.round_fp16_rows(x), wf))
        assert err <= TOL, f"{m}x{n}x{k}: normalised max error {err:.2e} against the rounded inputs"
        again = cp.asnumpy(gemm(cp.asarray(x), w, inputs="fp16", operands=store))
        assert np.array_equal(again, got), "from the kept operand: the same bits"
        split = cp.asnumpy(gemm(cp.asarray(x), w, inputs="fp16", operands=store, variant="ws3"))
        assert _err(split, got) <= TOL
        exact = cp.asnumpy(gemm(cp.asarray(x), w))
        assert not np.array_equal(exact, got), "the fp16 mode gave the exact result (not taken?)"


def _bf16(wf: np.ndarray) -> np.ndarray:
    codec = FORMATS["BF16"]
    return codec.decode(codec.encode(wf, wf.shape), wf.shape)


def _upload(wf: np.ndarray) -> Any:
    from ninfer.cuda.weights import upload_weight

    return upload_weight("BF16", wf.shape, FORMATS["BF16"].encode(wf, wf.shape))


def test_inexact_weight_is_refused_and_off_is_exact(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ninfer.cuda import gemm_plan
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    rng = np.random.default_rng(83)
    m, n, k = 256, 520, 1032
    wf = (rng.standard_normal((n, k)) * 0.02).astype(F32)
    wf[7, 11] = (
        -(1 + 2.0**-7) * 2.0**-40
    )  # 8 significant bits ~2^35 below its row's largest: not in fp16 there
    w = _upload(wf)
    x = cp.asarray((rng.standard_normal((m, k)) * 4).astype(F32))
    pair = cp.asnumpy(
        gemm(x, w, inputs="fp16")
    )  # no store: the exact pair mode (BF16 has no per-call fp16 operand)
    store = OperandStore(1 << 30)
    got = cp.asnumpy(gemm(x, w, inputs="fp16", operands=store))
    assert np.array_equal(got, pair), "a refused weight keeps the pair mode's bits"
    assert len(store) == 0 and store.used == 0 and store.refused(w, "f16row")
    monkeypatch.setattr(gemm_plan, "BF16_F16", False)
    ok = _upload((rng.standard_normal((n, k)) * 0.02).astype(F32))
    off = cp.asnumpy(gemm(x, ok, inputs="fp16", operands=OperandStore(1 << 30)))
    assert np.array_equal(off, cp.asnumpy(gemm(x, ok))), "BF16_F16 off: the exact pair mode"
