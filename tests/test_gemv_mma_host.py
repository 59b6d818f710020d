"""The tensor-core GEMV's fragment readers (cuda_src/wfrag.cuh, ``__host__ __device__``) compiled for the host
with nvcc and driven as ``gemv_mma`` drives them: activations staged per word (``F::chunk``, ``stage_pairs``),
weight pairs per step (``F::src``/``copy_next``/``prep``/``pair``), and each ``mma.m16n8k16`` emulated on its documented
fragment layout (A rows g/g+8 x k 2t..2t+1 / 2t+8..2t+9, B k x column g, D rows x columns 2t, 2t+1). Checks the
K permutation, the bit-placement dequantization, the scales and the tails against the NumPy reference without a
GPU (skipped without nvcc). The device's own instructions are checked by tests/test_cuda_ops.py on a GPU.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_nvcc_driver

from ninfer.cuda.linear import FRAG_STRUCTS, gemv_plan
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS
from ninfer.reference import ops

FMTS = tuple(f for f in FRAG_STRUCTS if f in FORMATS)  # the device-only ROWG: test_cuda_ops.py

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "wfrag.cuh"

// One 16x16 x 16x8 mma per the PTX fragment layout: a[lane][4], b[lane][2] bf16x2 words, d[lane][4] fp32.
static void mma(float d[32][4], const u32 a[32][4], const u32 b[32][2]) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        const u32 w[4] = {a[l][0], a[l][1], a[l][2], a[l][3]};
        const int rr[4] = {g, g + 8, g, g + 8}, cc[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int j = 0; j < 4; ++j) {
            A[rr[j]][cc[j]] = bf16_val(w[j] & 0xffffu);
            A[rr[j]][cc[j] + 1] = bf16_val(w[j] >> 16);
        }
        B[2 * t][g] = bf16_val(b[l][0] & 0xffffu), B[2 * t + 1][g] = bf16_val(b[l][0] >> 16);
        B[2 * t + 8][g] = bf16_val(b[l][1] & 0xffffu), B[2 * t + 9][g] = bf16_val(b[l][1] >> 16);
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int e = 0; e < 4; ++e) {
            const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);
            double s = 0;
            for (int k = 0; k < 16; ++k) s += (double)A[r][k] * B[k][c];
            d[l][e] += (float)s;
        }
    }
}

// stdin: fmt N K nrows splits off0 off1 off2 nbytes, weight bytes, nrows*K float32 x; stdout: y.
template <typename F>
static void run(int N, int K, int nrows, int splits, const u8* base, const long long off[3],
                const float* x, float* y) {
    const u8 *p0 = base + off[0], *p1 = base + off[1], *p2 = base + off[2];
    const int ntiles = (K + 127) / 128;
    for (int b0 = 0; b0 < nrows; b0 += 8) {
        const int nb = nrows - b0 < 8 ? nrows - b0 : 8;
        for (int m0 = 0; m0 < N; m0 += 16) {
            std::vector<float> tot(16 * 8, 0.f);
            for (int sp = 0; sp < splits; ++sp) {
                float acc[32][4] = {};
                for (int kt = sp * ntiles / splits; kt < (sp + 1) * ntiles / splits; ++kt) {
                    u32 hi[8][8][4][2] = {}, lo[8][8][4][2] = {};  // [step][lane][t][b0|b1]
                    for (int g = 0; g < nb; ++g)
                        for (int cc = 0; cc < 16; ++cc) {
                            int t, w;
                            F::chunk(cc, t, w);
                            const int k = kt * 128 + 8 * cc;
                            float v[8] = {};
                            if (k < K)
                                for (int j = 0; j < 8; ++j) v[j] = x[(long long)(b0 + g) * K + k + j];
                            u32 h[4], l[4];
                            stage_pairs(v, h, l);
                            for (int q = 0; q < 4; ++q) {
                                hi[2 * w + q / 2][g][t][q & 1] = h[q];
                                lo[2 * w + q / 2][g][t][q & 1] = l[q];
                            }
                        }
                    // the pipeline stage of the warp whose m-tile `mtile` holds these 16 rows (rows past N clamped)
                    std::vector<u8> stage(F::VECS * 512, 0xee);
                    const int mw = m0 / (16 * F::MT) * (16 * F::MT), mtile = (m0 - mw) / 16;  // warp rows, m-tile
                    for (int l = 0; l < 32; ++l) {
                        long long rows[F::MT][2];
                        for (int mt = 0; mt < F::MT; ++mt)
                            for (int r = 0; r < 2; ++r) {
                                const int row = mw + mt * 16 + (l >> 2) + 8 * r;
                                rows[mt][r] = row < N ? row : N - 1;
                            }
                        typename F::Src src = F::src(p0, p1, p2, K, rows, kt * 128, l & 3);
                        F::copy_next(stage.data(), l, src, l & 3);
                    }
                    typename F::Prep pr[32][2];
                    for (int l = 0; l < 32; ++l)
                        for (int r = 0; r < 2; ++r) {
                            typename F::Raw raw;
                            F::read(stage.data(), l, mtile, r, l & 3, raw);
                            F::prep(raw, pr[l][r]);
                        }
                    float tmp[32][4] = {};
                    for (int s = 0; s < 8; ++s) {
                        u32 a[32][4], bh[32][2], bl[32][2];
                        for (int l = 0; l < 32; ++l) {
                            const int g = l >> 2, t = l & 3, w = s >> 1, i = 2 * (s & 1);
                            a[l][0] = F::pair(pr[l][0], w, i), a[l][1] = F::pair(pr[l][1], w, i);
                            a[l][2] = F::pair(pr[l][0], w, i + 1), a[l][3] = F::pair(pr[l][1], w, i + 1);
                            bh[l][0] = hi[s][g][t][0], bh[l][1] = hi[s][g][t][1];
                            bl[l][0] = lo[s][g][t][0], bl[l][1] = lo[s][g][t][1];
                        }
                        if (F::GROUP == 0) {
                            mma(acc, a, bh);
                            mma(acc, a, bl);
                        } else {
                            if (s % F::GROUP == 0)
                                for (int l = 0; l < 32; ++l)
                                    for (int e = 0; e < 4; ++e) tmp[l][e] = 0.f;
                            mma(tmp, a, bh);
                            mma(tmp, a, bl);
                            if (s % F::GROUP == F::GROUP - 1)
                                for (int l = 0; l < 32; ++l)
                                    for (int e = 0; e < 4; ++e)
                                        acc[l][e] += tmp[l][e] * F::gscale(pr[l][e >> 1], s / F::GROUP);
                        }
                    }
                }
                for (int l = 0; l < 32; ++l)
                    for (int e = 0; e < 4; ++e) tot[((l >> 2) + (e >> 1) * 8) * 8 + 2 * (l & 3) + (e & 1)] += acc[l][e];
            }
            for (int r = 0; r < 16 && m0 + r < N; ++r)
                for (int c = 0; c < nb; ++c)
                    y[(long long)(b0 + c) * N + m0 + r] = tot[r * 8 + c] * F::row_scale(p1, p2, m0 + r);
        }
    }
}

int main() {
    int fmt, N, K, nrows, splits;
    long long off[3], nbytes;
    if (scanf("%d %d %d %d %d %lld %lld %lld %lld", &fmt, &N, &K, &nrows, &splits, &off[0], &off[1],
              &off[2], &nbytes) != 9)
        return 2;
    getchar();
    std::vector<u8> w(nbytes + 64);
    std::vector<float> x((size_t)nrows * K + 8), y((size_t)nrows * N);
    if (fread(w.data(), 1, nbytes, stdin) != (size_t)nbytes) return 3;
    if (fread(x.data(), 4, (size_t)nrows * K, stdin) != (size_t)nrows * K) return 4;
    switch (fmt) {
%CASES%
        default: return 5;
    }
    fwrite(y.data(), 4, y.size(), stdout);
    return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = "\n".join(
        f"        case {i}: run<{FRAG_STRUCTS[f][0]}>(N, K, nrows, splits, w.data(), off, x.data(),"
        " y.data()); break;"
        for i, f in enumerate(FMTS)
    )
    return build_nvcc_driver(
        tmp_path_factory, "gemv_mma_host", DRIVER.replace("%CASES%", cases), timeout=600, opt="-O1"
    )


def _host_gemv(
    exe: Path, fmt: str, buf: np.ndarray, shape: tuple[int, int], x: np.ndarray, device_layout: bool = True
) -> np.ndarray:
    """The driver's product over ``buf`` (the codec's bytes) in the device layout the kernels read
    (ninfer/cuda/nvfp4_layout.py, qg64_layout.py), or as stored (``device_layout`` false: a negative check)."""
    n, k = shape
    offs = plane_offsets(fmt, shape, buf)
    if device_layout:
        w = to_device_layout(DeviceWeight(fmt, shape, buf, offs))
        buf, offs = w.data, w.offsets
    plan = gemv_plan(fmt, n, k)
    head = f"{FMTS.index(fmt)} {n} {k} {x.shape[0]} {plan.splits} {offs[0]} {offs[1]} {offs[2]} {buf.size}\n"
    stdin = head.encode() + buf.tobytes() + np.ascontiguousarray(x, dtype=np.float32).tobytes()
    proc = subprocess.run([str(exe)], input=stdin, capture_output=True, timeout=300)
    assert proc.returncode == 0, f"driver exited {proc.returncode}: {proc.stderr.decode()[-2000:]}"
    return np.frombuffer(proc.stdout, dtype=np.float32).reshape(x.shape[0], n)


@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_mma_fragments_match_reference(driver: Path, fmt: str) -> None:
    """K off the 128-wide tile (8 | K) and past the padded formats' groups, N off the 16-row m-tile, 1..9 rows
    (a second 8-row block), several splits (K = 5128), tiny and large activations, e4m3-subnormal block scales."""
    rng = np.random.default_rng(11)
    codec = FORMATS[fmt]
    for n, k in ((6, 8), (13, 200), (40, 1000), (21, 5128)):
        wf32 = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
        wf32[0, :16] *= 1e-3  # small NVFP4 block scales: e4m3 subnormal codes
        buf = np.ascontiguousarray(codec.encode(wf32, (n, k)).reshape(-1).view(np.uint8))
        wdec = codec.decode(buf, (n, k))
        for b in (1, 3, 9):
            x = (rng.standard_normal((b, k)) * 3).astype(np.float32)
            x[0, :8] = [0, 1e-30, -1e-30, 1e20, -7e3, 2.0**-60, 0.5, -0.25]  # tiny and large activations
            ref = ops.linear(x, wdec)
            got = _host_gemv(driver, fmt, buf, (n, k), x)
            assert np.isfinite(got).all(), f"{fmt} {n}x{k} b={b}: non-finite"
            # per activation row: row 0's 1e20 must not hide the others' errors
            err = np.max(np.abs(got.astype(np.float64) - ref), axis=1) / np.max(np.abs(ref), axis=1)
            assert err.max() <= 2e-5, f"{fmt} {n}x{k} b={b}: normalised errors {err}"


def test_gemv_plan() -> None:
    """Splits depend on (format, N, K) only; they partition the K-tiles evenly with >= 4 tiles each, shared memory
    stays bounded for any K, and a split grid stays within one wave of a 132-SM GPU unless one wave would be under
    3/4 full and 8-tile splits make at least two waves (the 27B gate|up: 5 splits)."""
    for fmt in FMTS:
        for n, k in ((8, 8), (1024, 2048), (5120, 6144), (5120, 17408), (34816, 5120), (248320, 5120)):
            p = gemv_plan(fmt, n, k)
            ntiles = -(-k // 128)
            assert p.ntiles == ntiles and [i for s in range(p.splits) for i in p.tiles(s)] == list(
                range(ntiles)
            )
            assert all(len(p.tiles(s)) >= 4 for s in range(p.splits)) or p.splits == 1
            one = p.blocks_x * p.splits <= 528 or p.splits == 1  # one wave of 4 blocks per SM
            many = (
                p.blocks_x * p.splits >= 2 * 528 and len(p.tiles(0)) >= 8
            )  # or several waves of small blocks
            assert one or many
            assert p.smem_bytes(8, "float") <= 120 * 1024
            assert p.blocks_x * p.rows >= n
    assert (
        gemv_plan("NVFP4G16_E4M3S", 5120, 6144).splits == 48 // 4
    )  # a narrow matrix: as many as 4-tile splits allow
    assert gemv_plan("NVFP4G16_E4M3S", 248320, 5120).splits == 1  # the LM head needs no split
    assert gemv_plan("NVFP4G16_E4M3S", 34816, 5120).splits == 5  # 272 row blocks: 1360 blocks of 8 tiles
