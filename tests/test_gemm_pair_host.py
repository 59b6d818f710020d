"""The Hopper GEMM's pair mode on the CPU (no GPU): exactness of the weight folding and of the activation split, and
the operand tiles the pair kernel copies, bitwise against the in-loop kernel's.

- NumPy: every NVFP4 code x block-scale product (times 2^-7, the operand scaling) and every FP8 code is exactly a
  bf16, while the group-int formats' code x f16 scale is not (why they keep the in-loop kernel).
- cuda_src/wdq.cuh compiled for the host with nvcc: ``make()`` of the folded formats over every code and scale code
  (the bit tricks the dequant pass uses), ``split8`` (hi = bf16(x) RNE, lo = bf16(x - hi), |x - hi - lo| <=
  2^-17 |x|) against a NumPy emulation, and the whole pre-pass + tile path: split_hilo and dequant90 emulated
  thread by thread, then for every CTA tile and K tile the stage gemm90<D, float> builds (fp32 copy, in-place split,
  convert_tile) against the one gemm90_pair<DqFolded<D>> copies (ActPair from hi / lo, DqBF16's loader from the
  scratch), byte for byte: the same operands in the same order make the GPU results bitwise equal
  (tests/test_cuda_gemm_pair.py checks that on the device). The fp16 mode likewise: the weight tile
  gemm90_f16il<D> converts in its main loop (convert_tile<D, true>) against the one gemm90_f16<DqFolded<D>> copies
  from dequant90<D, true>'s scratch (tests/test_cuda_gemm_f16.py compares the two kernels' results on the device).
  And the MoE gate | up GEMM's A tiles read through a row index from the tokens' rows (ActF16G) against ActF16's
  from the per-slot copy.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_nvcc_driver

from ninfer.cuda.gemm_pair import PAIR_STRUCTS
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS, bf16_decode
from ninfer.formats.fp8 import e4m3_table
from ninfer.formats.groupint import f16_rne
from ninfer.formats.nvfp4 import E2M1_VALUES

FMTS = tuple(PAIR_STRUCTS)
_DQ = {f: PAIR_STRUCTS[f][1] or "DqBF16" for f in FMTS}


def _bf16_exact(v: np.ndarray) -> np.ndarray:
    """Whether float64 values are exactly representable in bf16 (8 significant bits, normal exponent range)."""
    v = np.asarray(v, np.float64)
    m, e = np.frexp(v)  # v = m 2^e, 0.5 <= |m| < 1
    return (v == 0) | ((m * 256 == np.round(m * 256)) & (e - 1 >= -126) & (e - 1 <= 127))


def _rne_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# ---- NumPy: which formats fold exactly --------------------------------------------------------------------------
def test_nvfp4_products_fold_exactly() -> None:
    """All 16 e2m1 codes x all 128 non-negative e4m3 block-scale codes (NaN excluded; the device layout folds a
    negative scale's sign into the codes): code x scale and the operand code x scale x 2^-7 are exact bf16."""
    s = e4m3_table()[:127].astype(np.float64)
    prod = E2M1_VALUES.astype(np.float64)[:, None] * s[None, :]
    assert _bf16_exact(prod).all() and _bf16_exact(prod * 2.0**-7).all()
    nz = np.abs(prod[prod != 0])
    assert nz.min() == 2.0**-10 and nz.max() == 6 * 448  # normal bf16 range, far from over/underflow


def test_fp8_codes_fold_exactly() -> None:
    v = e4m3_table()
    ok = np.isfinite(v)
    assert ok.sum() == 254 and _bf16_exact(v[ok].astype(np.float64)).all()


def test_group_int_products_do_not_fold() -> None:
    """Why Q4/5/6 and W8 keep the in-loop kernel: code x f16 group scale needs up to 8 + 11 significant bits."""
    scales = f16_rne(np.linspace(0.001, 1.0, 4001, dtype=np.float32)).astype(np.float64)
    codes = np.arange(-128, 128, dtype=np.float64)
    assert not _bf16_exact(codes[:, None] * scales[None, :]).all()
    assert not _bf16_exact(np.float64(3) * np.float64(np.float16(1.0009765625)))


# ---- nvcc host driver -------------------------------------------------------------------------------------------
DRIVER = r"""
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>
#include "wdq.cuh"

// mode 0: make() of the folded formats. stdin: nwords, words (u32); stdout: per word and scale code s in 0..127:
// NVFP4 8 bf16 + 8 codes (u16 each), then per word FP8 8 bf16.
static int makes() {
    int nw;
    if (scanf("%d", &nw) != 1) return 2;
    getchar();
    std::vector<u32> w(nw);
    if (fread(w.data(), 4, nw, stdin) != (size_t)nw) return 3;
    for (int i = 0; i < nw; ++i)
        for (u32 s = 0; s < 128; ++s) {
            uint2 v;
            v.x = w[i], v.y = s;
            const uint4 o = DqNVFP4<false>::make(v, 0);
            u16 out[16];
            memcpy(out, &o, 16);
            for (int j = 0; j < 8; ++j) out[8 + j] = (u16)nv4_code(w[i], j);
            fwrite(out, 2, 16, stdout);
        }
    for (int i = 0; i < nw; ++i) {
        uint2 v;
        v.x = w[i], v.y = w[i] ^ 0x5a5a5a5au;
        const uint4 o = DqFP8<true>::make(v, 0);
        fwrite(&o, 2, 8, stdout);
    }
    return 0;
}

// dequant90<D, F16>: CTA (kt, row tile) of the stored weight [N, K] -> the operand scratch w [N, K]
template <typename D, bool F16>
static void dequant90_emu(const u8* p0, const u8* p1, const u8* p2, int N, int K, bf16* w) {
    std::vector<u8> raw(D::BYTES);
    for (int kt = 0; kt < (K + GS_BK - 1) / GS_BK; ++kt)
        for (int r0 = 0; r0 < N; r0 += D::BN) {
            const int nvalid = N - r0 < D::BN ? N - r0 : D::BN;
            std::fill(raw.begin(), raw.end(), (u8)0xff);
            for (int tid = 0; tid < GS_THREADS; ++tid)
                typename D::Loader(p0, p1, p2, K, r0, nvalid, tid).copy(raw.data(), kt, K, p0);
            for (int tid = 0; tid < GS_THREADS; ++tid)
                dequant_tile<D, F16>(raw.data(), w + (size_t)r0 * K, K, nvalid, kt, tid);
        }
}

// mode 1: stdin: M N K ldx off0 off1 off2 nbytes, weight bytes, M*ldx float32 x; stdout: hi, lo [M, K], scratch [N, K]
// (u16). Returns 20+ if a tile differs between the in-loop and the pair path.
template <typename D>
static int run(int M, int N, int K, long long ldx, const u8* base, const long long off[3], const float* x) {
    constexpr bool FOLD = !D::DIRECT;
    typedef typename std::conditional<FOLD, DqFolded<D>, DqBF16>::type P;
    const u8 *p0 = base + off[0], *p1 = base + off[1], *p2 = base + off[2];
    std::vector<bf16> hi((size_t)M * K), lo((size_t)M * K), w((size_t)N * K);
    for (auto& b : w) b.bits = 0xffff;
    for (int r = 0; r < M; ++r)  // split_hilo: one thread per 8 k of a row
        for (int k = 0; k < K; k += 8) {
            float v[8];
            load8x(x + r * ldx + k, v);
            uint4 h, l;
            split8(v, h, l);
            memcpy(&hi[(size_t)r * K + k], &h, 16);
            memcpy(&lo[(size_t)r * K + k], &l, 16);
        }
    const int nk = (K + GS_BK - 1) / GS_BK, BN = D::BN;
    // the fp16 mode: dequant90<D, true>'s scratch (read by gemm90_f16<DqFolded<D>> through DqBF16's loader) and
    // convert_tile<D, true> (gemm90_f16il<D>'s in-loop conversion) must give the same operand tiles
    std::vector<bf16> w16((size_t)N * K);
    for (auto& b : w16) b.bits = 0xffff;
    if constexpr (FOLD) {
        dequant90_emu<D, false>(p0, p1, p2, N, K, w.data());
        dequant90_emu<D, true>(p0, p1, p2, N, K, w16.data());
    }
    const u8* wp = FOLD ? reinterpret_cast<const u8*>(w.data()) : p0;
    const u8* wp16 = reinterpret_cast<const u8*>(w16.data());
    constexpr int AO = Act<float>::BYTES, AP = ActPair::BYTES;
    std::vector<u8> so(AO + D::BYTES), conv(BN * 128), sp(AP + P::BYTES), conv16(BN * 128), sp16(P::BYTES);
    for (int m0 = 0; m0 < M; m0 += GS_BM)
        for (int n0 = 0; n0 < N; n0 += BN) {
            const int mvalid = M - m0 < GS_BM ? M - m0 : GS_BM, nvalid = N - n0 < BN ? N - n0 : BN;
            for (int kt = 0; kt < nk; ++kt) {
                std::fill(so.begin(), so.end(), (u8)0xff);
                std::fill(conv.begin(), conv.end(), (u8)0xff);
                std::fill(sp.begin(), sp.end(), (u8)0xfe);  // another poison: a byte neither path writes differs
                for (int tid = 0; tid < GS_THREADS; ++tid) {
                    Act<float>::Loader(x + (long long)m0 * ldx, ldx, mvalid, tid).copy(so.data(), kt, K, p0);
                    typename D::Loader(p0, p1, p2, K, n0, nvalid, tid).copy(so.data() + AO, kt, K, p0);
                    const PairX px = PairX{hi.data(), lo.data()} + (long long)m0 * K;
                    ActPair::Loader(px, K, mvalid, tid).copy(sp.data(), kt, K, p0);
                    typename P::Loader(wp, p1, p2, K, n0, nvalid, tid).copy(sp.data() + AP, kt, K, p0);
                }
                for (int tid = 0; tid < GS_THREADS; ++tid) {
                    Act<float>::split(so.data(), tid);
                    ActPair::split(sp.data(), tid);
                    if constexpr (FOLD) convert_tile<D>(so.data() + AO, conv.data(), kt, tid);
                }
                if (AO != AP || memcmp(so.data(), sp.data(), AO)) return 20;  // hi, lo operand tiles
                if (memcmp(FOLD ? conv.data() : so.data() + AO, sp.data() + AP, BN * 128)) return 21;  // weights
                if constexpr (FOLD) {  // fp16 mode: in-loop conversion == the fp16 scratch's copy
                    std::fill(conv16.begin(), conv16.end(), (u8)0xff);
                    std::fill(sp16.begin(), sp16.end(), (u8)0xfe);
                    for (int tid = 0; tid < GS_THREADS; ++tid) {
                        typename P::Loader(wp16, p1, p2, K, n0, nvalid, tid).copy(sp16.data(), kt, K, p0);
                        convert_tile<D, true>(so.data() + AO, conv16.data(), kt, tid);
                    }
                    if (memcmp(conv16.data(), sp16.data(), BN * 128)) return 23;
                    if (!memcmp(conv16.data(), conv.data(), BN * 128) && nvalid > 0) return 24;  // really fp16 words
                }
            }
            for (int c = 0; c < nvalid; ++c)
                if (P::row_scale(p1, p2, n0 + c) != D::row_scale(p1, p2, n0 + c)) return 22;
        }
    fwrite(hi.data(), 2, hi.size(), stdout);
    fwrite(lo.data(), 2, lo.size(), stdout);
    fwrite(w.data(), 2, w.size(), stdout);
    return 0;
}

// mode "gather": the MoE gate | up GEMM's A tiles. stdin: T K ldx S E, rows [S] (i32), counts [E] (i32), xh [T, ldx]
// (u16, the tokens' fp16 rows); for every tile of the expert table (expert e's slots off[e] .. off[e + 1] in tiles of
// 128, as expert_tiles builds it) and K tile, the stage gemm90_experts_f16g loads (ActF16G: token rows read in place
// through rows[]) against the one gemm90_experts_f16 loads from the per-slot copy xh[rows] [S, K] (ActF16), byte for
// byte, under different poison bytes. Returns 30 on a difference; stdout: tiles compared (i32).
static int gather() {
    int T, K, S, E;
    long long ldx;
    if (scanf("%d %d %lld %d %d", &T, &K, &ldx, &S, &E) != 5) return 2;
    getchar();
    std::vector<int> rows(S), counts(E);
    std::vector<bf16> xh((size_t)T * ldx), xg((size_t)S * K);
    if (fread(rows.data(), 4, S, stdin) != (size_t)S || fread(counts.data(), 4, E, stdin) != (size_t)E) return 3;
    if (fread(xh.data(), 2, xh.size(), stdin) != xh.size()) return 4;
    for (int s = 0; s < S; ++s) memcpy(&xg[(size_t)s * K], &xh[(size_t)rows[s] * ldx], 2 * (size_t)K);
    std::vector<u8> sa(ActF16::BYTES), sg(ActF16G::BYTES);
    const int nk = (K + GS_BK - 1) / GS_BK;
    int off = 0, tiles = 0;
    for (int e = 0; e < E; ++e) {
        for (int s0 = off; s0 < off + counts[e]; s0 += GS_BM, ++tiles) {
            const int mvalid = off + counts[e] - s0 < GS_BM ? off + counts[e] - s0 : GS_BM;
            for (int kt = 0; kt < nk; ++kt) {
                std::fill(sa.begin(), sa.end(), (u8)0xff);
                std::fill(sg.begin(), sg.end(), (u8)0xfe);
                for (int tid = 0; tid < GS_THREADS; ++tid) {
                    ActF16::Loader(ActF16::at(xg.data(), s0, K), K, mvalid, tid).copy(sa.data(), kt, K, xg.data());
                    const GatherX gx = ActF16G::at(GatherX{xh.data(), rows.data()}, s0, ldx);
                    ActF16G::Loader(gx, ldx, mvalid, tid).copy(sg.data(), kt, K, xh.data());
                }
                if (memcmp(sa.data(), sg.data(), ActF16::BYTES)) return 30;
            }
        }
        off += counts[e];
    }
    fwrite(&tiles, 4, 1, stdout);
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1) return strcmp(argv[1], "gather") ? makes() : gather();
    int fmt, M, N, K;
    long long ldx, off[3], nbytes;
    if (scanf("%d %d %d %d %lld %lld %lld %lld %lld", &fmt, &M, &N, &K, &ldx, &off[0], &off[1], &off[2],
              &nbytes) != 9)
        return 2;
    getchar();
    std::vector<u8> wb(nbytes + 64);
    std::vector<float> x((size_t)M * ldx);
    if (fread(wb.data(), 1, nbytes, stdin) != (size_t)nbytes) return 3;
    if (fread(x.data(), 4, x.size(), stdin) != x.size()) return 4;
    switch (fmt) {
%CASES%
    }
    return 5;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = [f"        case {i}: return run<{_DQ[f]}>(M, N, K, ldx, wb.data(), off, x.data());" for i, f in
             enumerate(FMTS)]  # fmt: skip
    return build_nvcc_driver(tmp_path_factory, "gemm_pair_host", DRIVER.replace("%CASES%", "\n".join(cases)))


def test_make_every_code_and_scale(driver: Path) -> None:
    """The dequant pass's make(): NVFP4 every e2m1 code in every position x every block-scale code gives the bf16
    of e2m1 x e4m3 x 2^-7 exactly; FP8 every finite code gives its value."""
    rng = np.random.default_rng(5)
    words = np.concatenate([np.arange(16, dtype=np.uint32) * np.uint32(0x11111111),
                            rng.integers(0, 2**32, 240, dtype=np.uint64).astype(np.uint32),
                            np.arange(256, dtype=np.uint32) * np.uint32(0x01010101)])  # fmt: skip
    proc = subprocess.run([str(driver), "make"], input=f"{words.size}\n".encode() + words.tobytes(),
                          capture_output=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out = np.frombuffer(proc.stdout, np.uint16)
    nv = out[: words.size * 128 * 16].reshape(words.size, 128, 16)
    codes = nv[..., 8:].astype(np.int64)
    assert set(np.unique(codes)) == set(range(16))
    want = E2M1_VALUES[codes].astype(np.float64) * e4m3_table()[:128][None, :, None] * 2.0**-7
    got = bf16_decode(nv[..., :8]).astype(np.float64)
    assert np.array_equal(got[:, :127], want[:, :127]), "NVFP4 make"  # scale code 127 is e4m3's NaN
    fp8 = out[words.size * 128 * 16 :].reshape(words.size, 8)
    b = np.stack([(words >> (8 * i)) & 0xFF for i in range(4)], axis=1)
    b = np.concatenate([b, b ^ 0x5A], axis=1).astype(np.int64)  # v.y = w ^ 0x5a5a5a5a
    fin = np.isfinite(e4m3_table()[b])
    assert np.array_equal(bf16_decode(fp8)[fin], e4m3_table()[b][fin]), "FP8 make"


def test_gathered_rows_tiles_equal_per_slot_tiles(driver: Path) -> None:
    """The MoE gate | up GEMM reading its slots' token rows in place (ActF16G, gemm90_experts_f16g) loads the A
    tiles that the per-slot copy ``xh[rows]`` gives ActF16 (gemm90_experts_f16), byte for byte: every tile of
    tables with empty experts (first, inner, last), ragged last tiles (zero-filled rows past the expert's end), one-
    row experts, more slots than tokens and fewer, repeated tokens, K off the 64-wide K tile, a row stride above K."""
    rng = np.random.default_rng(17)
    for tokens, k, ldx, counts in (
        (97, 136, 136, [0, 150, 1, 0, 64, 65, 3]),
        (40, 264, 280, [0, 5, 0, 131, 0, 0]),
        (200, 64, 72, [1, 0, 2]),
        (3, 8, 8, [129, 0, 1]),
        (300, 2048, 2048, [256, 7, 0, 300]),
    ):
        s = sum(counts)
        rows = rng.integers(0, tokens, s).astype(np.int32)
        xh = rng.integers(0, 2**16, (tokens, ldx)).astype(np.uint16)
        head = f"{tokens} {k} {ldx} {s} {len(counts)}\n".encode()
        body = rows.tobytes() + np.asarray(counts, np.int32).tobytes() + xh.tobytes()
        proc = subprocess.run([str(driver), "gather"], input=head + body, capture_output=True, timeout=600)
        assert proc.returncode == 0, f"{tokens}x{k} {counts}: driver exited {proc.returncode}"
        tiles = int(np.frombuffer(proc.stdout, np.int32)[0])
        assert tiles == sum(-(-c // 128) for c in counts), f"{counts}: {tiles} tiles compared"


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(device bytes, plane offsets, decoded float32 weights); ROWG: per-row globals appended as p2."""
    base = "NVFP4G16_E4M3S" if fmt.endswith("ROWG") else fmt
    codec = FORMATS[base]
    wf = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
    wf[0, :16] *= 1e-3  # small NVFP4 block scales: e4m3 subnormal codes
    buf = np.ascontiguousarray(codec.encode(wf, (n, k)).reshape(-1).view(np.uint8))
    wdec = codec.decode(buf, (n, k))
    offs = list(plane_offsets(base, (n, k), buf))
    # the kernels read the device layout (ninfer/cuda/nvfp4_layout.py, qg64_layout.py)
    dw = to_device_layout(DeviceWeight(base, (n, k), buf, (offs[0], offs[1], offs[2])))
    buf, offs = dw.data, list(dw.offsets)
    if fmt != base:
        g = float(np.frombuffer(buf[offs[2] : offs[2] + 4].tobytes(), np.float32)[0])
        rows = (2.0 ** rng.integers(-3, 4, size=n)).astype(np.float32) * g
        offs[2] = buf.size
        buf = np.concatenate([buf, rows.view(np.uint8)])
        wdec = wdec * (rows / g)[:, None]
    return buf, offs, wdec


def _row_scale(fmt: str, buf: np.ndarray, offs: list[int], n: int) -> np.ndarray:
    f32 = lambda o, c: np.frombuffer(buf[o : o + 4 * c].tobytes(), np.float32)  # noqa: E731
    if fmt == "BF16":
        return np.ones(n, np.float32)
    if fmt.startswith("FP8"):
        return np.broadcast_to(f32(offs[1], n if fmt.endswith("ROW") else 1), (n,))
    return np.broadcast_to(128 * f32(offs[2], n if fmt.endswith("ROWG") else 1), (n,))


@pytest.mark.parametrize("fmt", FMTS)
def test_pair_tiles_equal_in_loop_tiles(driver: Path, fmt: str) -> None:
    """Ragged M / N / K (row tiles, partial column tiles, K off the 64-wide tile and the padded formats' 128),
    a strided x with edge values: identical operand tiles, split within 2^-17, scratch = stored weight / row scale."""
    rng = np.random.default_rng(11)
    for m, n, k in ((3, 6, 8), (130, 300, 200), (9, 257, 136)):
        buf, offs, wdec = _weight(rng, fmt, n, k)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        x[0, :8] = [0, 1e-30, -1e-30, 1e20, -7e3, 2.0**-60, 1 + 2.0**-8, -(1 + 3 * 2.0**-9)][: min(8, k)]
        ldx = k + 16
        xs = np.full((m, ldx), np.nan, np.float32)
        xs[:, :k] = x
        head = f"{FMTS.index(fmt)} {m} {n} {k} {ldx} {offs[0]} {offs[1]} {offs[2]} {buf.size}\n"
        proc = subprocess.run([str(driver)], input=head.encode() + buf.tobytes() + xs.tobytes(),
                              capture_output=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"{fmt} {m}x{n}x{k}: driver exited {proc.returncode}"
        out = np.frombuffer(proc.stdout, np.uint16)
        hi, lo, w = out[: m * k], out[m * k : 2 * m * k], out[2 * m * k :]
        assert np.array_equal(hi, _rne_bf16(x).reshape(-1)), "hi = bf16(x), round to nearest even"
        rest = x.reshape(-1) - bf16_decode(hi)
        assert np.array_equal(lo, _rne_bf16(rest)), "lo = bf16(x - hi)"
        err = np.abs(x.reshape(-1).astype(np.float64) - bf16_decode(hi) - bf16_decode(lo))
        assert (err <= 2.0**-17 * np.abs(x.reshape(-1))).all()
        if PAIR_STRUCTS[fmt][1] is None:
            continue
        wv = bf16_decode(w.reshape(n, k)).astype(np.float64) * _row_scale(fmt, buf, offs, n)[:, None]
        assert np.isfinite(wv).all(), "every scratch element within K written"
        assert np.allclose(wv, wdec, rtol=2.0**-22, atol=0), f"{fmt}: scratch x row scale != decoded weight"
