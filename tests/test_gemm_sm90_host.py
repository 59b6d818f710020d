"""The Hopper GEMM's tile code (cuda_src/wdq.cuh, ``__host__ __device__``) compiled for the host with nvcc and driven
as ``gemm90`` drives it: every CTA of the rasterized grid, every K tile copied by the 256 threads' cp.asyncs (host
memcpy) into a stage pre-filled with NaN bytes (a byte nobody writes poisons the result), activations split in place,
weights converted into the swizzled bf16 tile, then each warpgroup's wgmma emulated by reading the operand tiles at
the documented SW128 K-major addresses (row r, k: byte 128 r + 16 ((k / 8) ^ (r % 8)) + 2 (k % 8)), group scales on
fp32 partial sums, row scales, and the accumulator registers written out through ``frag_rc``. Checks the copy
offsets, zero fill, bit-placement dequantization, the float split, the tails and the tile/fragment bookkeeping
(every tile once, every accumulator element in exactly one register) against the NumPy reference without a GPU. The instructions themselves are checked by tests/test_cuda_ops.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_nvcc_driver

from ninfer.cuda.gemm import DQ_STRUCTS
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS, bf16_round
from ninfer.reference import ops

FMTS = tuple(DQ_STRUCTS)  # ROWG: NVFP4 planes with a per-row global built here

DRIVER = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include "wdq.cuh"

static float rd(const u8* tile, int r, int k) {  // bf16 operand element (row r, k) of a SW128 K-major tile
    u16 h;
    memcpy(&h, tile + r * 128 + 16 * ((k / 8) ^ (r % 8)) + 2 * (k % 8), 2);
    return bf16_val(h);
}

// stdin: fmt tflag M N K ldx off0 off1 off2 nbytes, weight bytes, M*ldx float32 x; stdout: y [M, N] float32.
template <typename D, typename T>
static int run(int M, int N, int K, long long ldx, const u8* base, const long long off[3], const T* x, float* y,
               std::vector<int>& seen) {
    const u8 *p0 = base + off[0], *p1 = base + off[1], *p2 = base + off[2];
    constexpr int BN = D::BN, AB = Act<T>::BYTES;
    const int tm = (M + GS_BM - 1) / GS_BM, tn = (N + BN - 1) / BN, nk = (K + GS_BK - 1) / GS_BK;
    std::vector<u8> stage(AB + D::BYTES), conv(BN * 128);
    std::vector<float> acc(GS_BM * BN), part(GS_BM * BN);
    for (int b = 0; b < tm * tn; ++b) {
        int mt, nt;
        gs_raster(b, tm, tn, mt, nt);
        if (mt < 0 || mt >= tm || nt < 0 || nt >= tn) return 10;
        seen[mt * tn + nt] += 1;
        const int m0 = mt * GS_BM, n0 = nt * BN, mvalid = M - m0 < GS_BM ? M - m0 : GS_BM;
        const int nvalid = N - n0 < BN ? N - n0 : BN;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int kt = 0; kt < nk; ++kt) {
            std::fill(stage.begin(), stage.end(), (u8)0xff);  // bf16 0xffff / f32 0xffffffff: NaN
            std::fill(conv.begin(), conv.end(), (u8)0xff);
            for (int tid = 0; tid < GS_THREADS; ++tid) {
                const typename Act<T>::Loader al(x + (long long)m0 * ldx, ldx, mvalid, tid);
                const typename D::Loader wl(p0, p1, p2, K, n0, nvalid, tid);
                al.copy(stage.data(), kt, K, x);
                wl.copy(stage.data() + AB, kt, K, p0);
            }
            for (int tid = 0; tid < GS_THREADS; ++tid) {
                Act<T>::split(stage.data(), tid);
                if constexpr (!D::DIRECT) convert_tile<D>(stage.data() + AB, conv.data(), kt, tid);
            }
            const u8* bt = D::DIRECT ? stage.data() + AB : conv.data();
            for (int g = 0; g < (D::GPT ? D::GPT : 1); ++g) {
                const int s0 = D::GPT == 2 ? 2 * g : 0, s1 = D::GPT == 2 ? 2 * g + 2 : 4;
                float* d = D::GPT ? part.data() : acc.data();
                if (D::GPT) std::fill(part.begin(), part.end(), 0.f);
                for (int r = 0; r < GS_BM; ++r)
                    for (int c = 0; c < BN; ++c)
                        for (int ks = s0; ks < s1; ++ks)
                            for (int h = 0; h < (Act<T>::SPLIT ? 2 : 1); ++h) {
                                double s = 0;
                                for (int kk = 0; kk < 16; ++kk)
                                    s += (double)rd(stage.data() + h * GS_BM * 128, r, 16 * ks + kk) *
                                         rd(bt, c, 16 * ks + kk);
                                d[r * BN + c] += (float)s;
                            }
                if (D::GPT)
                    for (int r = 0; r < GS_BM; ++r)
                        for (int c = 0; c < BN; ++c)
                            acc[r * BN + c] = fmaf(D::gscale(stage.data() + AB, c, g, kt), part[r * BN + c],
                                                   acc[r * BN + c]);
            }
        }
        std::vector<int> hit(GS_BM * BN, 0);
        for (int tid = 0; tid < GS_THREADS; ++tid)
            for (int i = 0; i < BN / 2; ++i) {
                int r, c;
                frag_rc(tid, i, r, c);
                if (r < 0 || r >= GS_BM || c < 0 || c >= BN) return 11;
                hit[r * BN + c] += 1;
                if (r < mvalid && n0 + c < N)
                    y[(long long)(m0 + r) * N + n0 + c] = acc[r * BN + c] * D::row_scale(p1, p2, n0 + c);
            }
        for (int v : hit)
            if (v != 1) return 12;  // every accumulator element held by exactly one register
    }
    for (int i = 0; i < tm * tn; ++i)
        if (seen[i] != 1) return 13;  // every tile exactly once
    return 0;
}

int main() {
    int fmt, tflag, M, N, K;
    long long ldx, off[3], nbytes;
    if (scanf("%d %d %d %d %d %lld %lld %lld %lld %lld", &fmt, &tflag, &M, &N, &K, &ldx, &off[0], &off[1], &off[2],
              &nbytes) != 10)
        return 2;
    getchar();
    std::vector<u8> w(nbytes + 64);
    std::vector<float> x((size_t)M * ldx), y((size_t)M * N, 0.f);
    if (fread(w.data(), 1, nbytes, stdin) != (size_t)nbytes) return 3;
    if (fread(x.data(), 4, x.size(), stdin) != x.size()) return 4;
    std::vector<bf16> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i].bits = (u16)(f32_bits(x[i]) >> 16);  // x is bf16-exact here
    std::vector<int> seen(4096, 0);
    int rc = 5;
    switch (fmt * 2 + tflag) {
%CASES%
    }
    if (rc) return rc;
    fwrite(y.data(), 4, y.size(), stdout);
    return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = []
    for i, f in enumerate(FMTS):
        for tf, (t, xs) in enumerate((("float", "x"), ("bf16", "xb"))):
            cases.append(
                f"        case {2 * i + tf}: rc = run<{DQ_STRUCTS[f][0]}, {t}>(M, N, K, ldx, w.data(), off, "
                f"{xs}.data(), y.data(), seen); break;"
            )
    return build_nvcc_driver(tmp_path_factory, "gemm_sm90_host", DRIVER.replace("%CASES%", "\n".join(cases)))


def _planes(fmt: str, buf: np.ndarray, shape: tuple[int, int]) -> list[int]:
    return list(plane_offsets(fmt, shape, buf))


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(bytes, plane offsets, the float32 weights the kernel must see). ROWG: NVFP4's codes and block scales with
    a per-row f32 global appended as p2."""
    base = "NVFP4G16_E4M3S" if fmt == "NVFP4G16_E4M3S_ROWG" else fmt
    codec = FORMATS[base]
    wf32 = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
    wf32[0, :16] *= 1e-3  # small NVFP4 block scales: e4m3 subnormal codes
    buf = np.ascontiguousarray(codec.encode(wf32, (n, k)).reshape(-1).view(np.uint8))
    wdec = codec.decode(buf, (n, k))
    offs = _planes(base, buf, (n, k))
    # the kernels read the device layout (ninfer/cuda/nvfp4_layout.py, qg64_layout.py)
    w = to_device_layout(DeviceWeight(base, (n, k), buf, (offs[0], offs[1], offs[2])))
    buf, offs = w.data, list(w.offsets)
    if fmt != base:
        g = float(np.frombuffer(buf[offs[2] : offs[2] + 4].tobytes(), np.float32)[0])
        rows = (2.0 ** rng.integers(-3, 4, size=n)).astype(np.float32) * g  # per-row globals
        offs[2] = buf.size
        buf = np.concatenate([buf, rows.view(np.uint8)])
        wdec = wdec * (rows / g)[:, None]
    return buf, offs, wdec


def _host_gemm(exe: Path, fmt: str, t: str, buf: np.ndarray, offs: list[int], n: int, x: np.ndarray,
               ldx: int) -> np.ndarray:  # fmt: skip
    m, k = x.shape
    xs = np.zeros((m, ldx), np.float32)
    xs[:, :k] = x
    xs[:, k:] = np.nan  # the row stride's slack is never read
    head = (
        f"{FMTS.index(fmt)} {int(t == 'bf16')} {m} {n} {k} {ldx} {offs[0]} {offs[1]} {offs[2]} {buf.size}\n"
    )
    proc = subprocess.run([str(exe)], input=head.encode() + buf.tobytes() + xs.tobytes(), capture_output=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"driver exited {proc.returncode}: {proc.stderr.decode()[-2000:]}"
    return np.frombuffer(proc.stdout, dtype=np.float32).reshape(m, n)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_gemm90_tiles_match_reference(driver: Path, fmt: str, t: str) -> None:
    """M and N off the 128 x BN tiles (two row tiles, several column tiles), K off the 64-wide K tile and the
    padded formats' groups, N below 8, a strided x; tiny and large activations."""
    rng = np.random.default_rng(21)
    for m, n, k in ((3, 6, 8), (130, 300, 200), (9, 129, 136)):
        buf, offs, wdec = _weight(rng, fmt, n, k)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        x[0, :8] = [0, 1e-30, -1e-30, 1e20, -7e3, 2.0**-60, 0.5, -0.25][: min(8, k)]
        if t == "bf16":
            x = bf16_round(x)
        ref = ops.linear(x, wdec)
        got = _host_gemm(driver, fmt, t, buf, offs, n, x, k + 16)
        assert np.isfinite(got).all(), f"{fmt} {t} {m}x{n}x{k}: non-finite"
        err = np.max(np.abs(got.astype(np.float64) - ref), axis=1) / np.max(np.abs(ref), axis=1)
        assert err.max() <= 2e-5, f"{fmt} {t} {m}x{n}x{k}: normalised errors per row {err.max():.2e}"
