"""The Hopper GEMM's fp16 mode on the CPU (no GPU): why its weights stay exact and that its activation rounding is
the NumPy twin's, bit for bit.

- NumPy: every NVFP4 operand value (e2m1 x e4m3 block scale x 2^-7) and every finite FP8 code is exactly an fp16,
  so ``dequant90<D, true>`` changes no weight; BF16 weights are not (why they keep the pair mode).
- cuda_src/wdq.cuh compiled for the host with nvcc: ``f16_rne_bits`` (the host twin of the device's
  cvt.rn.f16.f32) against NumPy's float32 -> float16 on random bit patterns, ties, subnormals and the overflow
  edge; ``f16row_scale`` + ``f16_rne_bits`` as ``split_f16row`` applies them against
  ``ninfer.reference.ops.round_fp16_rows``; ``bf16x8_to_f16`` of every NVFP4 ``make()`` output; the attention
  output gate in the row split (``split_f16row_gate``: ``split_gate8`` per 8 columns, the row's max over the gated
  values, then the rounding) against sigmoid_gate's element expression written out in C++ and the NumPy gate.
tests/test_cuda_gemm_f16.py checks the kernels on the device.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_nvcc_driver

from ninfer.formats import bf16_decode
from ninfer.formats.fp8 import e4m3_table
from ninfer.formats.nvfp4 import E2M1_VALUES
from ninfer.reference import ops
from ninfer.reference.ops import round_fp16_rows

F32 = np.float32


def _f16_exact(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.float64)
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(np.float64) == v


def test_folded_operands_are_exact_in_fp16() -> None:
    s = e4m3_table()[:127].astype(np.float64)
    prod = E2M1_VALUES.astype(np.float64)[:, None] * s[None, :] * 2.0**-7
    assert _f16_exact(prod).all(), "NVFP4 operand values"
    v = e4m3_table()
    assert _f16_exact(v[np.isfinite(v)]).all(), "FP8 codes"
    assert not _f16_exact(np.array([2.0**-20, 1e5, 1 + 2.0**-7 + 2.0**-11])).all(), "bf16 values need not fit"


DRIVER = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include "wdq.cuh"

int main(int argc, char** argv) {
    const char mode = argv[1][0];
    int n, k;
    if (scanf("%d %d", &n, &k) != 2) return 2;
    getchar();
    if (mode == 'r') {  // f16_rne_bits of n floats
        std::vector<float> x(n);
        if (fread(x.data(), 4, n, stdin) != (size_t)n) return 3;
        for (float f : x) {
            const u16 h = (u16)f16_rne_bits(f);
            fwrite(&h, 2, 1, stdout);
        }
        return 0;
    }
    if (mode == 'g') {  // split_f16row_gate on n rows of k (D, ldq, x [n, k], qg [n, ldq] on stdin): the gated
                        // values, sigmoid_gate's, the fp16 words, the factors
        int dl[2];
        if (fread(dl, 4, 2, stdin) != 2) return 3;
        const int D = dl[0], ldq = dl[1];
        std::vector<float> x((size_t)n * k), qg((size_t)n * ldq), fused(x.size()), plain(x.size()), inv(n);
        std::vector<u16> xh(x.size());
        if (fread(x.data(), 4, x.size(), stdin) != x.size() || fread(qg.data(), 4, qg.size(), stdin) != qg.size())
            return 3;
        for (int r = 0; r < n; ++r) {
            const float* xr = x.data() + (size_t)r * k;
            const float* gr = qg.data() + D + (size_t)r * ldq;  // the kernel's gate = qg[:, D:], row stride ldq
            float* v = fused.data() + (size_t)r * k;
            float m = 0.f;
            for (int c = 0; c < k; c += 8) {  // the row split's chunks (any order: max is order-free)
                split_gate8(xr, gr, D, c, v + c);
                for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[c + j]));
            }
            const float s = f16row_scale(m, inv[r]);
            for (int c = 0; c < k; ++c) {
                xh[(size_t)r * k + c] = (u16)f16_rne_bits(v[c] * s);
                const int h = c / D;  // sigmoid_gate<float>'s element c (activation.cu), written out
                const float g = gr[h * 2 * D + (c - h * D)];
                plain[(size_t)r * k + c] = xr[c] * (1.f / (1.f + expf(-g)));
            }
        }
        fwrite(fused.data(), 4, fused.size(), stdout);
        fwrite(plain.data(), 4, plain.size(), stdout);
        fwrite(xh.data(), 2, xh.size(), stdout);
        fwrite(inv.data(), 4, n, stdout);
        return 0;
    }
    if (mode == 'b') {  // bf16_f16_rows' arithmetic on n rows of k bf16 words: fp16 words, exact flags, factors
        std::vector<u16> w((size_t)n * k);
        std::vector<float> inv(n);
        if (fread(w.data(), 2, w.size(), stdin) != w.size()) return 3;
        std::vector<u16> h(w.size());
        std::vector<unsigned char> ok(w.size());
        for (int r = 0; r < n; ++r) {
            float m = 0.f;
            for (int j = 0; j < k; ++j) m = fmaxf(m, fabsf(f32_from_bits((u32)w[(size_t)r * k + j] << 16)));
            const float s = f16row_scale(m, inv[r]);
            for (int j = 0; j < k; ++j) {
                u32 hb;
                ok[(size_t)r * k + j] = bf16_f16_scaled(w[(size_t)r * k + j], s, inv[r], hb) ? 1 : 0;
                h[(size_t)r * k + j] = (u16)hb;
            }
        }
        fwrite(h.data(), 2, h.size(), stdout);
        fwrite(ok.data(), 1, ok.size(), stdout);
        fwrite(inv.data(), 4, n, stdout);
        return 0;
    }
    if (mode == 's') {  // split_f16row's arithmetic on n rows of k: the fp16 words, then the factors
        std::vector<float> x((size_t)n * k), inv(n);
        if (fread(x.data(), 4, x.size(), stdin) != x.size()) return 3;
        for (int r = 0; r < n; ++r) {
            float m = 0.f;
            for (int j = 0; j < k; ++j) m = fmaxf(m, fabsf(x[(size_t)r * k + j]));
            const float s = f16row_scale(m, inv[r]);
            for (int j = 0; j < k; ++j) {
                const u16 h = (u16)f16_rne_bits(x[(size_t)r * k + j] * s);
                fwrite(&h, 2, 1, stdout);
            }
        }
        fwrite(inv.data(), 4, n, stdout);
        return 0;
    }
    for (u32 w = 0; w < (u32)n; ++w)  // bf16x8_to_f16 of NVFP4 make(): words w * 0x01010101 x scale codes
        for (u32 s = 0; s < 127; ++s) {
            uint2 v;
            v.x = w * 0x01010101u, v.y = s;
            const uint4 b = DqNVFP4<false>::make(v, 0), h = bf16x8_to_f16(b);
            fwrite(&b, 16, 1, stdout);
            fwrite(&h, 16, 1, stdout);
        }
    return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nvcc_driver(tmp_path_factory, "gemm_f16_host", DRIVER)


def _run(driver: Path, mode: str, n: int, k: int, data: bytes) -> bytes:
    proc = subprocess.run(
        [str(driver), mode], input=f"{n} {k}\n".encode() + data, capture_output=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout


def test_f16_rne_matches_numpy(driver: Path) -> None:
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, 2.0**-25, 2.0**-25 * 1.5, 2.0**-24, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 65504,
                      65519.99, 65520, 1e30, np.inf, -np.inf, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049, 2051, 1e-40],
                     F32)  # fmt: skip
    x = np.concatenate([bits.view(F32), edges, rng.standard_normal(20_000).astype(F32) * 100])
    x = x[~np.isnan(x)]
    got = np.frombuffer(_run(driver, "r", x.size, 0, x.tobytes()), np.uint16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} conversions differ"


def test_row_rounding_matches_reference(driver: Path) -> None:
    rng = np.random.default_rng(4)
    n, k = 9, 136
    x = (rng.standard_normal((n, k)) * 3).astype(F32)
    x[1] *= 1e-30  # a tiny row: the scale clamps at 2^126
    x[2] *= 3e4  # above fp16's range before scaling
    x[3] = 0.0
    x[4, :5] = [1e-20, -(2.0**-60), 7e3, -(1 + 3 * 2.0**-12), 2.0**-14]  # values far below the row's largest
    x[5] *= 1e30
    out = _run(driver, "s", n, k, x.tobytes())
    h = np.frombuffer(out[: 2 * n * k], np.float16).reshape(n, k).astype(F32)
    inv = np.frombuffer(out[2 * n * k :], F32)
    assert np.isfinite(h).all() and (np.abs(h) < 2.0**15).all()
    assert np.array_equal(h * inv[:, None], round_fp16_rows(x)), "kernel rounding != round_fp16_rows"
    err = np.abs(round_fp16_rows(x).astype(np.float64) - x) / np.maximum(
        np.abs(x).max(-1, keepdims=True), 1e-38
    )
    assert (err <= 2.0**-11).all()


@pytest.mark.parametrize("heads,d,pad", ((3, 64, 8), (2, 136, 0), (5, 8, 24), (1, 256, 4)))
def test_gate_row_split_is_sigmoid_gate_then_split(driver: Path, heads: int, d: int, pad: int) -> None:
    """The fp16 row split with the attention output gate (split_f16row_gate, via split_gate8 as the kernel calls it)
    gives bitwise the values of sigmoid_gate's element expression on the gate read in place from the q|gate rows
    (head h's gate at 2 D h + D .. 2 D h + 2 D of a row of stride ldq = 2K + pad), and the fp16 words and row factors
    of split_f16row of those values (the row's max taken over the gated values); the values are the NumPy gate's
    up to expf's rounding."""
    from test_norm_host import _split_f16row

    rng = np.random.default_rng(heads * d + pad)
    n, k = 6, heads * d
    ldq = 2 * k + pad
    x = (rng.standard_normal((n, k)) * 3).astype(F32)
    x[1] *= 1e-30  # a tiny row: the clamped scale
    x[2] *= 3e4  # above fp16's range before scaling
    x[3, :4] = [0.0, -0.0, 1e-20, 7e3]
    qg = (rng.standard_normal((n, ldq)) * 4).astype(F32)
    qg[:, 2 * k :] = np.nan  # the row padding (k | v in the model): never read
    first = d + 2 * d * np.arange(heads)  # each head's first gate: sigmoid 1, ~1e-13, 0 (expf overflows), 1/2
    qg[:, first] = np.array([30.0, -30.0, -90.0, 0.0], F32)[np.arange(heads) % 4]
    qg[4] *= 40  # a row of saturated gates
    data = np.array([d, ldq], np.int32).tobytes() + x.tobytes() + qg.tobytes()
    out = _run(driver, "g", n, k, data)
    nk = n * k
    fused = np.frombuffer(out[: 4 * nk], F32).reshape(n, k)
    plain = np.frombuffer(out[4 * nk : 8 * nk], F32).reshape(n, k)
    xh = np.frombuffer(out[8 * nk : 10 * nk], np.uint16).reshape(n, k)
    inv = np.frombuffer(out[10 * nk :], F32)
    assert np.array_equal(fused.view(np.uint32), plain.view(np.uint32)), (
        "split_gate8 != sigmoid_gate's values"
    )
    want_xh, want_inv = _split_f16row(plain)
    assert np.array_equal(xh, want_xh), "fp16 words != split_f16row of sigmoid_gate's output"
    assert np.array_equal(inv.view(np.uint32), want_inv.view(np.uint32)), "row factors"
    gate = qg[:, : 2 * k].reshape(n, heads, 2 * d)[:, :, d:].reshape(n, k)
    with np.errstate(over="ignore"):
        ref = ops.sigmoid_gate(x.astype(np.float64), gate.astype(np.float64))
    live = gate > -80  # below, float32's expf overflows (a zero gate; the exact value is ~1e-35 of x)
    assert np.allclose(plain[live], ref[live], rtol=2e-6, atol=1e-37), "sigmoid_gate's values against NumPy"
    nz = x != 0
    assert ((plain == 0) & nz).any() and ((plain == x) & nz).any(), "saturated gates exercised"


def test_bf16_to_f16_of_every_nvfp4_operand(driver: Path) -> None:
    out = np.frombuffer(_run(driver, "m", 256, 0, b""), np.uint16).reshape(-1, 2, 8)
    b, h = bf16_decode(out[:, 0]), out[:, 1].view(np.float16).astype(F32)
    assert np.array_equal(b, h), "fp16 operand != bf16 operand"


def test_bf16_weights_scaled_into_fp16(driver: Path) -> None:
    """bf16_f16_rows' element rule (wdq.cuh bf16_f16_scaled) on rows of bf16 words: each row scaled by 2^k so that its
    largest |w| lies in [2^14, 2^15) (f16row_scale), the fp16 word NumPy's rounding of w 2^k, and "exact" exactly
    when that word times 2^-k is w: rows of normal weights fit (at any magnitude); a weight whose last bit falls under
    fp16's 2^-24 once scaled, a bf16 subnormal, inf and NaN do not (such a BF16 weight keeps the exact pair mode)."""
    rng = np.random.default_rng(5)
    n, k = 6, 512
    w = (rng.standard_normal((n, k)) * 0.02).astype(F32)
    # far below the row's largest (~0.06, k = 19): 2^-50 scales under fp16's 2^-24; (1 + 2^-7) 2^-40 to 2^-21 with
    # its last bit at 2^-28; 2^-40 alone to 2^-21, an fp16 subnormal: exact
    w[1, 3], w[1, 4], w[1, 5] = 2.0**-50, -(1 + 2.0**-7) * 2.0**-40, 2.0**-40
    w[2, :] *= 2.0**100  # a row of huge values: a negative k
    w[3, :] *= 2.0**-100  # a row of tiny (normal) values
    w[4, 7] = 1e-39  # a bf16 subnormal
    w[5, 0], w[5, 1] = np.inf, np.nan
    w[0, 5], w[0, 6] = 0.0, -0.0
    bits = (w.view(np.uint32) >> 16).astype(
        np.uint16
    )  # truncation: bf16 words (the test needs bf16 values only)
    out = _run(driver, "b", n, k, bits.tobytes())
    h = np.frombuffer(out[: 2 * n * k], np.uint16).reshape(n, k)
    ok = np.frombuffer(out[2 * n * k : 3 * n * k], np.uint8).reshape(n, k).astype(bool)
    inv = np.frombuffer(out[3 * n * k :], F32)
    v = bf16_decode(bits).astype(np.float64)
    for r in range(n):
        finite = np.isfinite(v[r])
        amax = np.max(np.abs(v[r][finite])) if r != 5 else np.inf
        if r != 5:
            kexp = int(np.clip(141 - (int(np.float32(amax).view(np.uint32)) >> 23 & 0xFF), -126, 126))
            assert inv[r] == np.float32(2.0**-kexp), f"row {r}: factor"
            scaled = v[r] * 2.0**kexp
            with np.errstate(over="ignore"):
                f16 = scaled.astype(np.float16)
            normal = (np.abs(v[r]) >= 2.0**-126) | (v[r] == 0)
            want = normal & (f16.astype(np.float64) == scaled)
            assert np.array_equal(ok[r], want), f"row {r}: exact flags at {np.flatnonzero(ok[r] != want)}"
            assert np.array_equal(h[r][want], f16.view(np.uint16)[want]), f"row {r}: fp16 words"
    assert ok[0].all() and ok[2].all() and ok[3].all(), (
        "rows of ordinary weights (at any magnitude) are exact"
    )
    assert not ok[1, 3] and not ok[1, 4] and ok[1, :3].all() and ok[1, 5:].all(), (
        "far below the largest: not exact"
    )
    assert not ok[4, 7] and not ok[5, 0] and not ok[5, 1], "subnormal, inf, NaN: not exact"
