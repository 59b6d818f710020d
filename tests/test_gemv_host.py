"""The GEMV's per-thread code (cuda_src/gemv.cu ``gemv_lane`` and the wformat.cuh wide-chunk decoders, which are
``__host__ __device__``) compiled for the host with nvcc and driven like the kernel: every thread of a row group,
the warp's xor butterfly and the group's warps in order, as ``gemv_block`` does. Checks the chunk indexing, the
subnormal-bit dequantization and the tails against the NumPy reference without a GPU (skipped without nvcc).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer.cuda.linear import GEMV_KV, gemv_geometry
from ninfer.cuda.loader import CUDA_SRC
from ninfer.formats import FORMATS
from ninfer.reference import ops

NVCC = shutil.which("nvcc")
FMTS = tuple(GEMV_KV)
PLANES = {
    "FP8E4M3_F32ROW": ("codes", "scale"),
    "FP8E4M3_F32T": ("codes", "scale"),
    "NVFP4G16_E4M3S": ("codes", "scale", "global"),
}
for _f in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"):
    PLANES[_f] = ("base", "high", "scale")
STRUCTS = (
    "FmtBF16",
    "FmtFP8Row",
    "FmtFP8Tensor",
    "FmtNVFP4",
    "FmtQG64<4>",
    "FmtQG64<5>",
    "FmtQG64<6>",
    "FmtW8G32",
)

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "gemv.cu"

// stdin: fmt N K nrows tpr off0 off1 off2 nbytes, then the weight bytes, then nrows*K float32 x; stdout: y.
template <typename F>
static void run(int N, int K, int nrows, int tpr, const u8* base, const long long off[3], const float* x,
                float* y) {
    const u8 *p0 = base + off[0], *p1 = base + off[1], *p2 = base + off[2];
    std::vector<float> part(tpr * GEMV_R * GEMV_MAXB);
    for (int n0 = 0; n0 < N; n0 += GEMV_R) {
        long long wr[GEMV_R];
        for (int r = 0; r < GEMV_R; ++r) wr[r] = n0 + r < N ? n0 + r : N - 1;
        for (int lt = 0; lt < tpr; ++lt) {
            float acc[GEMV_R][GEMV_MAXB];
            gemv_lane<F, float, GEMV_MAXB, GEMV_R>(p0, p1, p2, wr, K, x, K, nrows, lt, tpr, acc);
            for (int r = 0; r < GEMV_R; ++r)
                for (int b = 0; b < GEMV_MAXB; ++b) part[(lt * GEMV_R + r) * GEMV_MAXB + b] = acc[r][b];
        }
        for (int r = 0; r < GEMV_R; ++r)
            for (int b = 0; b < nrows; ++b) {
                float t = 0.f;
                for (int w = 0; w < tpr / 32; ++w) {
                    float v[32];
                    for (int l = 0; l < 32; ++l) v[l] = part[((w * 32 + l) * GEMV_R + r) * GEMV_MAXB + b];
                    for (int o = 16; o > 0; o >>= 1) {  // warp_sum: every lane adds its xor partner at once
                        float nv[32];
                        for (int l = 0; l < 32; ++l) nv[l] = v[l] + v[l ^ o];
                        for (int l = 0; l < 32; ++l) v[l] = nv[l];
                    }
                    t += v[0];
                }
                if (n0 + r < N) y[b * N + n0 + r] = t * F::row_scale(p1, p2, n0 + r);
            }
    }
}

int main() {
    int fmt, N, K, nrows, tpr;
    long long off[3], nbytes;
    if (scanf("%d %d %d %d %d %lld %lld %lld %lld", &fmt, &N, &K, &nrows, &tpr, &off[0], &off[1], &off[2],
              &nbytes) != 9)
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
    if NVCC is None:
        pytest.skip("nvcc not installed")
    d = tmp_path_factory.mktemp("gemv_host")
    cases = "\n".join(
        f"        case {i}: run<{s}>(N, K, nrows, tpr, w.data(), off, x.data(), y.data()); break;"
        for i, s in enumerate(STRUCTS)
    )
    (d / "driver.cu").write_text(DRIVER.replace("%CASES%", cases))
    exe = d / "driver"
    cmd = [NVCC, "-std=c++17", "-O1", "-I", str(CUDA_SRC), "-o", str(exe), str(d / "driver.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return exe


def _host_gemv(
    exe: Path, fmt: str, buf: np.ndarray, shape: tuple[int, int], x: np.ndarray, tpr: int
) -> np.ndarray:
    n, k = shape
    offs = [0, 0, 0]
    if fmt in PLANES:
        views = FORMATS[fmt].views(buf, shape)  # type: ignore[attr-defined]
        for i, name in enumerate(PLANES[fmt]):
            v = views[name]
            offs[i] = v.ctypes.data - buf.ctypes.data if v.size else 0
    head = (
        f"{STRUCTS.index(_struct(fmt))} {n} {k} {x.shape[0]} {tpr} {offs[0]} {offs[1]} {offs[2]} {buf.size}\n"
    )
    stdin = head.encode() + buf.tobytes() + np.ascontiguousarray(x, dtype=np.float32).tobytes()
    proc = subprocess.run([str(exe)], input=stdin, capture_output=True, timeout=300)
    assert proc.returncode == 0, f"driver exited {proc.returncode}: {proc.stderr.decode()[-2000:]}"
    return np.frombuffer(proc.stdout, dtype=np.float32).reshape(x.shape[0], n)


def _struct(fmt: str) -> str:
    from ninfer.cuda.weights import FORMAT_STRUCTS

    return FORMAT_STRUCTS[fmt]


@pytest.mark.parametrize("fmt", FMTS)
def test_gemv_lane_matches_reference(driver: Path, fmt: str) -> None:
    """K off every chunk size (8 | K, K % 16 == 8 for FP8's guarded half, K % 128 != 0 for the padded
    formats), N off the rows per group, 1..8 rows, and every row-group width the host would pick or force."""
    rng = np.random.default_rng(11)
    codec = FORMATS[fmt]
    for (n, k), tprs in (
        ((6, 8), (32,)),
        ((13, 200), (32, 64)),
        ((9, 1000), (None, 256)),
        ((5, 5128), (None,)),
    ):
        wf32 = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
        wf32[0, :16] *= 1e-3  # small NVFP4 block scales: e4m3 subnormal codes
        buf = np.ascontiguousarray(codec.encode(wf32, (n, k)).reshape(-1).view(np.uint8))
        wdec = codec.decode(buf, (n, k))
        for b in (1, 3, 8):
            x = (rng.standard_normal((b, k)) * 3).astype(np.float32)
            x[0, :8] = [0, 1e-30, -1e-30, 1e20, -7e3, 2.0**-60, 0.5, -0.25]  # tiny and large activations
            ref = ops.linear(x, wdec)
            for tpr in tprs:
                tpr = gemv_geometry(fmt, k)[0] if tpr is None else tpr
                got = _host_gemv(driver, fmt, buf, (n, k), x, tpr)
                assert np.isfinite(got).all(), f"{fmt} {n}x{k} b={b} tpr={tpr}: non-finite"
                # per activation row: row 0's 1e20 must not hide the others' errors
                err = np.max(np.abs(got.astype(np.float64) - ref), axis=1) / np.max(np.abs(ref), axis=1)
                assert err.max() <= 2e-5, f"{fmt} {n}x{k} b={b} tpr={tpr}: normalised errors {err}"
                if b == 8:  # rows independent of the batch: row 2 alone equals row 2 among 8
                    alone = _host_gemv(driver, fmt, buf, (n, k), x[2:3], tpr)
                    assert np.array_equal(alone[0], got[2]), f"{fmt}: row differs alone vs among 8"


def test_geometry() -> None:
    for fmt, kv in GEMV_KV.items():
        for k in (8, 64, 1000, 2048, 5120, 17408):
            tpr, per_block = gemv_geometry(fmt, k)
            assert tpr in (32, 64, 128, 256) and per_block == 256 // tpr * 4
            chunks = -(-k // kv)
            assert tpr == 256 or tpr * 2 >= chunks, f"{fmt} K={k}: {tpr} threads leave > 2 chunks each"
            assert tpr == 32 or tpr < chunks, f"{fmt} K={k}: {tpr} threads for {chunks} chunks"
