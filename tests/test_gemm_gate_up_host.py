"""The MoE gate | up GEMM with the SwiGLU in its epilogue (cuda_src/gate_up.cuh, gemm_sm90.cu
gemm90_experts_f16g_swiglu) on the CPU: the weight tile and the register pairing its epilogue relies on.

- cuda_src/gate_up.cuh compiled for the host with nvcc: for every expert, column tile and K tile of fused
  [E, 2I, K] weights (FP8 per-row / per-tensor, NVFP4 in the device layout, with per-row globals too), the stage
  ``GateUpLoader<D>`` fills is byte for byte the plain loader's (``D::Loader``, gemm90_experts_f16g's) stage of the
  tile's gate rows in its first half and of the same features' up rows in its second half, every byte written
  (two poisons), and the fp16 operand tile ``convert_tile<D, true>`` makes of it is the plain tiles' halves; so
  each output column is the plain kernel's MMA over the same operands (tests/test_cuda_gemm_experts_swiglu.py
  checks the results on the device).
- frag_rc: accumulator register i < BN / 4 and register i + BN / 4 of a thread hold the same row, columns c and
  c + BN / 2 (a feature's gate and up values), and the quad of threads sharing a row covers its BN / 2 features
  once (the per-tile row maximum's shuffle).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_nvcc_driver
from test_gemm_pair_host import _weight

# format id -> the wdq.cuh struct the expert kernels instantiate (gemm_plan.PAIR_STRUCTS' dequant structs)
STRUCTS = {
    "FP8E4M3_F32ROW": "DqFP8<true>",
    "FP8E4M3_F32T": "DqFP8<false>",
    "NVFP4G16_E4M3S": "DqNVFP4<false>",
    "NVFP4G16_E4M3S_ROWG": "DqNVFP4<true>",
}
FMTS = tuple(STRUCTS)

DRIVER = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include "gate_up.cuh"

// gs_tile's stage of weight rows base .. base + BN (rows past N zero-filled) through the plain loader.
template <typename D>
static void plain(const u8* p0, const u8* p1, const u8* p2, int N, int K, long long base, int kt, u8* st) {
    const int nvalid = N - base < D::BN ? (int)(N - base) : D::BN;
    for (int tid = 0; tid < GS_THREADS; ++tid) typename D::Loader(p0, p1, p2, K, base, nvalid, tid).copy(st, kt, K, p0);
}

// stdin: E I K off0 off1 off2 nbytes, the weight bytes ([E 2I, K]); stdout: tiles compared (i32). Returns 40+ on
// a difference.
template <typename D>
static int tiles(int E, int I, int K, const u8* base, const long long off[3]) {
    constexpr int BN = D::BN, H = BN / 2;
    constexpr bool FP8 = D::BYTES == BN * 64;  // else NVFP4: codes BN x 32, then scale words BN x 4
    const u8 *p0 = base + off[0], *p1 = base + off[1], *p2 = base + off[2];
    const int N = 2 * E * I, nk = (K + GS_BK - 1) / GS_BK;
    std::vector<u8> gu(D::BYTES), gu2(D::BYTES), a(D::BYTES), b(D::BYTES);
    std::vector<u8> cgu(BN * 128), ca(BN * 128), cb(BN * 128);
    int count = 0;
    for (int e = 0; e < E; ++e)
        for (int nt = 0; nt < I / H; ++nt, ++count)
            for (int kt = 0; kt < nk; ++kt) {
                const long long g0 = 2LL * e * I + (long long)H * nt;
                std::fill(gu.begin(), gu.end(), (u8)0xfe);
                std::fill(gu2.begin(), gu2.end(), (u8)0x01);
                std::fill(a.begin(), a.end(), (u8)0xff);
                std::fill(b.begin(), b.end(), (u8)0xff);
                for (int tid = 0; tid < GS_THREADS; ++tid) {
                    const GateUpLoader<D> l(p0, p1, p2, K, g0, I, tid);
                    l.copy(gu.data(), kt, K, p0);
                    l.copy(gu2.data(), kt, K, p0);
                }
                if (memcmp(gu.data(), gu2.data(), D::BYTES)) return 40;  // a byte left unwritten
                plain<D>(p0, p1, p2, N, K, g0, kt, a.data());      // gate rows (first half)
                plain<D>(p0, p1, p2, N, K, g0 + I, kt, b.data());  // the same features' up rows
                if (FP8) {
                    if (memcmp(gu.data(), a.data(), H * 64) || memcmp(gu.data() + H * 64, b.data(), H * 64)) return 41;
                } else {
                    if (memcmp(gu.data(), a.data(), H * 32) || memcmp(gu.data() + H * 32, b.data(), H * 32)) return 42;
                    const int s = BN * 32;
                    if (memcmp(gu.data() + s, a.data() + s, H * 4) || memcmp(gu.data() + s + H * 4, b.data() + s, H * 4))
                        return 43;
                }
                for (int tid = 0; tid < GS_THREADS; ++tid) {
                    convert_tile<D, true>(gu.data(), cgu.data(), kt, tid);
                    convert_tile<D, true>(a.data(), ca.data(), kt, tid);
                    convert_tile<D, true>(b.data(), cb.data(), kt, tid);
                }
                // the swizzle phase of row r + BN / 2 is row r's (sw128: r mod 8), so the halves compare as blocks
                if (memcmp(cgu.data(), ca.data(), H * 128) || memcmp(cgu.data() + H * 128, cb.data(), H * 128))
                    return 44;
            }
    fwrite(&count, 4, 1, stdout);
    return 0;
}

// mode "frag": registers i and i + BN / 4 pair up (same row, columns c and c + BN / 2); the quad sharing a row covers
// its BN / 2 gate columns exactly once. Returns 50+ on a violation.
static int frag() {
    constexpr int BN = 256, Q = BN / 4;
    std::vector<int> seen(GS_BM * (BN / 2), 0);
    for (int tid = 0; tid < GS_THREADS; ++tid)
        for (int i = 0; i < Q; ++i) {
            int r, c, r2, c2, rq, cq;
            frag_rc(tid, i, r, c);
            frag_rc(tid, i + Q, r2, c2);
            if (r2 != r || c2 != c + BN / 2 || c >= BN / 2) return 50;
            frag_rc(tid, i ^ 2, rq, cq);  // the thread's other row: (i >> 1) & 1 picks rows r, r + 8
            if (rq != (((i >> 1) & 1) ? r - 8 : r + 8)) return 51;
            for (int l = 0; l < 4; ++l) {  // quad partners share the row (the shuffle over lanes ^1, ^2)
                int rl, cl;
                frag_rc((tid & ~3) | l, i, rl, cl);
                if (rl != r) return 52;
            }
            ++seen[r * (BN / 2) + c];
        }
    for (int v : seen)
        if (v != 1) return 53;
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1) return frag();
    int fmt, E, I, K;
    long long off[3], nbytes;
    if (scanf("%d %d %d %d %lld %lld %lld %lld", &fmt, &E, &I, &K, &off[0], &off[1], &off[2], &nbytes) != 8) return 2;
    getchar();
    std::vector<u8> wb(nbytes + 64);
    if (fread(wb.data(), 1, nbytes, stdin) != (size_t)nbytes) return 3;
    switch (fmt) {
%CASES%
    }
    return 5;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = [
        f"        case {i}: return tiles<{STRUCTS[f]}>(E, I, K, wb.data(), off);" for i, f in enumerate(FMTS)
    ]
    return build_nvcc_driver(tmp_path_factory, "gate_up_host", DRIVER.replace("%CASES%", "\n".join(cases)))


@pytest.mark.parametrize("fmt", FMTS)
def test_gate_up_tiles_equal_plain_tiles(driver: Path, fmt: str) -> None:
    """Every (expert, column tile, K tile) of the gate | up loader against the plain loader's gate and up tiles:
    several experts (the last tile's up rows end the weight), I from one column tile to three, K off the 64-wide K
    tile and off NVFP4's 128 padding, a K of one tile."""
    rng = np.random.default_rng(23)
    for e, i, k in ((3, 128, 200), (2, 384, 136), (4, 256, 64)):
        buf, offs, _ = _weight(rng, fmt, 2 * e * i, k)
        head = f"{FMTS.index(fmt)} {e} {i} {k} {offs[0]} {offs[1]} {offs[2]} {buf.size}\n".encode()
        proc = subprocess.run([str(driver)], input=head + buf.tobytes(), capture_output=True, timeout=600)
        assert proc.returncode == 0, f"{fmt} E={e} I={i} K={k}: driver exited {proc.returncode}"
        assert int(np.frombuffer(proc.stdout, np.int32)[0]) == e * i // 128, "column tiles compared"


def test_gate_up_register_pairs(driver: Path) -> None:
    """The epilogue's pairing: register i + 64 holds the up column of register i's gate feature in the same row,
    and each row's 128 features are held once by the quad of threads that shares it."""
    proc = subprocess.run([str(driver), "frag"], capture_output=True, timeout=60)
    assert proc.returncode == 0, f"frag_rc pairing: driver exited {proc.returncode}"
