"""The Hopper prefill GEMM's pair mode (ninfer/cuda/gemm_pair.py, cuda_src/gemm_sm90.cu gemm90_pair) on the device:
float32 activations split once per GEMM, BF16 / FP8 / NVFP4 weights dequantized once per GEMM, a copy + wgmma main
loop. Fresh random inputs against the NumPy reference at the fp32-accumulation tolerance of the other GEMM tests,
ragged M / N / K tails, strided views, every foldable format; bitwise equality with the in-loop kernel
(``impl="wgmma"``), row independence (a row's bits depend only on K: alone, in a slice, in any M, on either side of
PAIR_MIN_ROWS), chunked scratch, dispatch and scratch reuse. Skipped without an sm_90a device (the pair mode is
Hopper only).

    python -m pytest -m gpu tests/test_cuda_gemm_pair.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ninfer.formats import FORMATS
from ninfer.reference import ops

pytestmark = pytest.mark.gpu

F32 = np.float32
TOL = 5e-5  # test_cuda_ops.GEMM_TOL["float"]: exact operands, hi / lo split (<= 2^-17), fp32 accumulation
FOLDABLE = ("BF16", "FP8E4M3_F32ROW", "FP8E4M3_F32T", "NVFP4G16_E4M3S", "NVFP4G16_E4M3S_ROWG")
# (M, N, K): M at and around one 128-row tile and several tiles; N below 8, off the 256-wide tile; K off the 64-wide
# tile, off NVFP4's 128 padding, and long enough to wrap the 3-stage ring many times
SHAPES = ((128, 6, 8), (129, 300, 200), (130, 257, 136), (257, 1000, 512), (300, 520, 2056))


@pytest.fixture
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from ninfer.cuda.loader import compute_capability, target_arch

    if not target_arch("gemm_sm90.cu", compute_capability()).endswith("a"):
        pytest.skip("pair mode needs the sm_90a wgmma kernels (compute capability 9.0)")
    return cupy


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[Any, np.ndarray]:
    """(DeviceWeight, decoded float32 weights). ROWG: three NVFP4 parts of different scales fused (fuse.py)."""
    from ninfer.cuda.fuse import concat_rows
    from ninfer.cuda.weights import upload_weight

    if not fmt.endswith("ROWG"):
        codec = FORMATS[fmt]
        buf = codec.encode((rng.standard_normal((n, k)) * 0.5).astype(F32), (n, k))
        return upload_weight(fmt, (n, k), buf), codec.decode(buf, (n, k))
    codec, parts, refs = FORMATS["NVFP4G16_E4M3S"], [], []
    for rows, s in ((n // 2, 1.0), (n // 4, 30.0), (n - n // 2 - n // 4, 0.01)):
        buf = codec.encode((rng.standard_normal((rows, k)) * s).astype(F32), (rows, k))
        parts.append(upload_weight("NVFP4G16_E4M3S", (rows, k), buf))
        refs.append(codec.decode(buf, (rows, k)))
    fused = concat_rows(parts)
    assert fused.fmt == fmt
    return fused, np.concatenate(refs)


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all(), f"non-finite output ({np.count_nonzero(~np.isfinite(got))} values)"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


@pytest.mark.parametrize("fmt", FOLDABLE)
def test_pair_matches_reference_and_in_loop(cp: Any, fmt: str) -> None:
    """Strided x / out views: right values, nothing written outside the view, and bitwise the in-loop kernel."""
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(41)
    for m, n, k in SHAPES:
        w, wf = _weight(rng, fmt, n, k)
        x = (rng.standard_normal((m, k)) * 4).astype(F32)
        x[0, : min(8, k)] = [0, 1e-30, -1e-30, 1e20, -7e3, 2.0**-60, 0.5, -0.25][: min(8, k)]
        xbuf = cp.zeros((m, k + 24), dtype=F32)
        xbuf[:, 8 : 8 + k] = cp.asarray(x)
        buf = cp.full((m, n + 11), np.nan, dtype=F32)
        gemm(xbuf[:, 8 : 8 + k], w, buf[:, 3 : 3 + n], impl="pair")
        got = cp.asnumpy(buf)
        assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 3 + n :]).all(), (
            f"{fmt} {m}x{n}x{k}: wrote outside"
        )
        err = _err(got[:, 3 : 3 + n], ops.linear(x, wf))
        assert err <= TOL, f"{fmt} {m}x{n}x{k}: normalised max error {err:.2e}"
        old = cp.asnumpy(gemm(cp.asarray(x), w, impl="wgmma"))
        assert np.array_equal(old, got[:, 3 : 3 + n]), (
            f"{fmt} {m}x{n}x{k}: pair differs from the in-loop kernel"
        )
        auto = cp.asnumpy(gemm(cp.asarray(x), w))
        assert np.array_equal(auto, old), f"{fmt} {m}x{n}x{k}: auto differs"


@pytest.mark.parametrize("fmt", FOLDABLE)
def test_pair_rows_independent(cp: Any, fmt: str) -> None:
    """A row's result is bitwise the same alone (1 row: the in-loop kernel under auto, pair when forced), inside a
    differently aligned slice, and in the full launch."""
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(43)
    m, n, k = 300, 520, 1032
    w, _ = _weight(rng, fmt, n, k)
    xd = cp.asarray((rng.standard_normal((m, k)) * 2).astype(F32))
    full = cp.asnumpy(gemm(xd, w))
    for r in (0, 127, 128, 255, 299):
        one = cp.ascontiguousarray(xd[r : r + 1])
        for impl in ("auto", "pair"):
            alone = cp.asnumpy(gemm(one, w, impl=impl))
            assert np.array_equal(alone[0], full[r]), (
                f"{fmt}: row {r} alone ({impl}) differs from the full launch"
            )
    for a, b in ((100, 260), (1, 129), (170, 300)):
        part = cp.asnumpy(gemm(xd[a:b], w, impl="pair"))
        assert np.array_equal(part, full[a:b]), f"{fmt}: rows {a}..{b - 1} differ when launched as a slice"


@pytest.mark.parametrize("fmt", ("FP8E4M3_F32ROW", "NVFP4G16_E4M3S_ROWG", "NVFP4G16_E4M3S", "BF16"))
def test_pair_chunked_scratch(cp: Any, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scratch caps small enough for several weight-row and activation-row chunks (the per-row scale planes offset
    per chunk): bitwise the unchunked result."""
    import ninfer.cuda.gemm_pair as gp
    import ninfer.cuda.gemm_plan as plan
    from ninfer.cuda.gemm import gemm

    rng = np.random.default_rng(47)
    m, n, k = 300, 700, 264
    w, _ = _weight(rng, fmt, n, k)
    xd = cp.asarray(rng.standard_normal((m, k)).astype(F32))
    whole = cp.asnumpy(gemm(xd, w, impl="pair"))
    monkeypatch.setattr(plan, "_W_CAP", 2 * 256 * k)  # 256-row weight chunks: 3 of them
    monkeypatch.setattr(plan, "_X_CAP", 4 * 128 * k)  # 128-row activation chunks: 3 of them
    assert gp._plan(fmt, m, n, k) == (128, n if fmt == "BF16" else 256)
    chunked = cp.asnumpy(gemm(xd, w, impl="pair"))
    assert np.array_equal(chunked, whole), f"{fmt}: chunked scratch changed the result"


def test_pair_dispatch_and_scratch_reuse(cp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto takes the pair mode exactly for float32 x of >= PAIR_MIN_ROWS rows and a foldable format; repeated
    GEMMs reuse the scratch (no new allocation); impl='pair' refuses what it cannot do."""
    import ninfer.cuda.gemm as lin
    import ninfer.cuda.gemm_pair as gp
    from ninfer.cuda._common import KernelError

    calls: list[str] = []
    real = lin.gemm_pair
    monkeypatch.setattr(
        lin, "gemm_pair", lambda x, w, *a, **kw: (calls.append(w.fmt), real(x, w, *a, **kw))[1]
    )
    rng = np.random.default_rng(53)
    k, n = 256, 300
    ws = {f: _weight(rng, f, n, k)[0] for f in ("NVFP4G16_E4M3S", "Q4G64_F16S")}
    x = cp.asarray(rng.standard_normal((lin.PAIR_MIN_ROWS, k)).astype(F32))
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)
    lin.gemm(x, ws["NVFP4G16_E4M3S"])
    lin.gemm(x[:-1], ws["NVFP4G16_E4M3S"])  # one row short of the threshold
    lin.gemm(x, ws["Q4G64_F16S"])  # group-int: not foldable
    lin.gemm(xb, ws["NVFP4G16_E4M3S"])  # bf16 x
    assert calls == ["NVFP4G16_E4M3S"]
    gp.release_scratch()
    lin.gemm(x, ws["NVFP4G16_E4M3S"])
    ptrs = {key: b.data.ptr for key, b in gp._SCRATCH.items()}
    assert len(ptrs) == 2
    for _ in range(3):
        lin.gemm(x, ws["NVFP4G16_E4M3S"])
        lin.gemm(x[:-2], ws["NVFP4G16_E4M3S"], impl="pair")
    assert {key: b.data.ptr for key, b in gp._SCRATCH.items()} == ptrs, "scratch reallocated"
    for bad in ((xb, ws["NVFP4G16_E4M3S"]), (x, ws["Q4G64_F16S"])):
        with pytest.raises(KernelError, match="pair"):
            lin.gemm(*bad, impl="pair")
