// Host emulation of gemm90_f16_ws (cuda_src/gemm_sm90_ws.cu) for tests/test_gemm_ws_host.py: the very loops of
// ws_sched.cuh (ws_produce, ws_consume), one std::thread per role of every CTA (a producer, two consumer
// warpgroups), against emulated mbarriers (phase / pending arrivals / transaction bytes, try_wait.parity as PTX
// defines it) and an emulated TMA that copies a box from the tensor-map parameters the Python side encodes
// (ninfer/cuda/tensor_map.map_params) into the ring with the 128B swizzle applied to the shared-memory offset. The
// consumers read their operands the way the wgmma descriptors address them (desc_sw128: 1024-aligned tiles, k16 step
// at +32 bytes, the hardware XOR of address bits [4:7) with [7:10)), so the tensor maps are checked against the
// descriptors rather than against a shared helper. Random delays shake the interleavings; invariants asserted:
//   - a slot is refilled only after both consumer warpgroups released every earlier fill of it;
//   - a consumer passing full[s] sees exactly the fill it waits for, and the slot holds the tile / K tile it expects;
//   - every output element (S = 1), every element of every split partial (S > 1), is written exactly once (unit
//     order: every tile and split once, ragged edges clipped), and each unit consumed exactly its split's K tiles;
//   - the descriptor addressing equals wdq.cuh's sw128 (the layout the cp.async kernels write).
// S > 1: the consumers' epilogue writes the unscaled partials (as the kernel's store<false>), then the reduction
// runs the kernel's own ws_split_sum per output and multiplies by rowf (row_scale is 1 here).
// GPT > 0: gemm90_f16_wsg<GPT> (the group formats): WsCfg<GPT>'s ring (128-column tiles, 6 slots), a third box per
// fill (the K tile's GPT rows of 128 fp32 scales from the scale map, unswizzled), and per group a partial sum of
// its k16 steps, then acc = fmaf(scale, partial, acc) with the scale read where the device reads it (the slot's
// scale rows, 4 bytes per column).
// GPT 3 on stdin: gemm90_f16_wsgd<1> (GPT 1, each K tile's partial scaled after the next tile's, its scales read
// from its slot then; the unit's last by drain() before the release).
// stdin: M N K G seed slow S GPT (slow 1: consumers sleep in every mma, the producer always waits for a release; 2:
// the producer sleeps in every fill, the consumers always wait for the bytes; 0: random jitter only; S: the
// splits), then per operand (A, B, and for GPT > 0 the scales) "dims0 dims1 stride box0 box1 swizzle elem_bytes",
// then xh [M*K] u16, w [N*K] u16, (GPT > 0) scales [groups*N] f32, rowf [M] f32.
// stdout: y [M*N] f32, then for S > 1 the partials [S*M*N] f32. Exit 20+ on a violated invariant (message on
// stderr).
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "ws_sched.cuh"

#define FAIL(code, ...)                   \
    do {                                  \
        fprintf(stderr, __VA_ARGS__);     \
        fprintf(stderr, "\n");            \
        std::exit(code);                  \
    } while (0)

struct EmuBar {  // one mbarrier: phase counter, pending arrivals, outstanding transaction bytes
    std::mutex mu;
    std::condition_variable cv;
    u32 phase = 0;
    int count = 1, pending = 1;
    long long tx = 0;
    void init(int c) { count = pending = c; }
    void maybe_complete() {  // caller holds mu
        if (pending == 0 && tx == 0) {
            ++phase, pending = count;
            cv.notify_all();
        }
    }
    void arrive(long long expect = 0) {
        std::lock_guard<std::mutex> g(mu);
        if (pending <= 0) FAIL(20, "arrive on a barrier with no pending arrivals");
        tx += expect, --pending;
        maybe_complete();
    }
    void complete_tx(long long bytes) {
        std::lock_guard<std::mutex> g(mu);
        tx -= bytes;
        if (tx < 0) FAIL(21, "transaction count below zero");
        maybe_complete();
    }
    void wait(u32 parity) {  // try_wait.parity loop: done once the phase of this parity has completed
        std::unique_lock<std::mutex> g(mu);
        if (!cv.wait_for(g, std::chrono::seconds(20), [&] { return (phase & 1u) != parity; }))
            FAIL(22, "deadlock: waited 20 s for parity %u", parity);
    }
};

struct Map {  // the tensor-map parameters as encoded
    long long dims0, dims1, stride, box0, box1;
    int swizzle, elem;
};

template <int GPT> struct Cta {
    typedef WsCfg<GPT> C;
    EmuBar full[C::STAGES], empty[C::STAGES];
    std::vector<u8> ring = std::vector<u8>((size_t)C::STAGES * C::STAGE_BYTES);
    std::mutex mu;  // guards the slot bookkeeping below
    int fills[C::STAGES] = {}, reads[2][C::STAGES] = {}, rels[2][C::STAGES] = {};
    int tag[C::STAGES][3];  // (mt, nt, kt) of the slot's last fill
    Cta() {
        for (int s = 0; s < C::STAGES; ++s) full[s].init(1), empty[s].init(WS_CONSUMER_WARPS);
    }
};

struct World {
    int M, N, K, S, GPT;
    Map ma, mb, ms;
    std::vector<u16> xh, w;
    std::vector<float> sc, rowf, y, part;
    std::vector<int> written;  // per element of y (S = 1) or of part (S > 1)
};

static void jitter(std::mt19937& rng, bool slow) {
    if (slow) std::this_thread::sleep_for(std::chrono::microseconds(30));
    const int r = (int)(rng() % 8);
    if (r == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    else if (r < 4) std::this_thread::yield();
}

// TMA tile mode, 2-D: box element (i, j) <- global (c0 + i, c1 + j) (zero out of bounds), stored at box offset
// e (j box0 + i) (e: the element's bytes), with the 128B swizzle (bits [4:7) ^= bits [7:10)) on that offset (the
// slot is 1024-aligned).
static long long tma_box(u8* dst, const Map& m, const void* g, int c0, int c1) {
    const int e = m.elem;
    for (long long j = 0; j < m.box1; ++j)
        for (long long i = 0; i < m.box0; ++i) {
            const long long gi = c0 + i, gj = c1 + j;
            u8 v[4] = {0, 0, 0, 0};
            if (gi < m.dims0 && gj < m.dims1) memcpy(v, (const u8*)g + gj * m.stride + gi * e, e);
            long long off = e * (j * m.box0 + i);
            if (m.swizzle == 3) off ^= ((off >> 7) & 7) << 4;
            memcpy(dst + off, v, e);
        }
    return e * m.box0 * m.box1;
}

// the 16-bit word at k16 step ks, row r, k kk of the SW128 K-major tile whose descriptor starts at `start` (the
// ring offset of the tile, 1024-aligned, + 32 ks): as the hardware resolves desc_sw128
static u32 desc_addr(u32 start, int r, int kk) {
    const u32 a = start + 128 * r + 2 * kk;
    return a ^ (((a >> 7) & 7) << 4);
}
static u16 desc_word(const u8* ring, u32 start, int r, int kk) {
    u16 v;
    memcpy(&v, ring + desc_addr(start, r, kk), 2);
    return v;
}

static float f16_to_f32(u16 h) {  // exact
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

template <int GPT> struct HostProducer {
    typedef WsCfg<GPT> C;
    static constexpr int STAGES = C::STAGES;
    Cta<GPT>& c;
    World& wd;
    std::mt19937 rng;
    bool slow;
    void wait_empty(int s, u32 parity) { c.empty[s].wait(parity); }
    void fill(int s, int kt, int mt, int nt) {
        {
            std::lock_guard<std::mutex> g(c.mu);
            for (int h = 0; h < 2; ++h)
                if (c.rels[h][s] != c.fills[s])
                    FAIL(23, "slot %d refilled before warpgroup %d released fill %d", s, h, c.fills[s]);
            c.fills[s] += 1;
            c.tag[s][0] = mt, c.tag[s][1] = nt, c.tag[s][2] = kt;
        }
        c.full[s].arrive(C::TX);  // arrive.expect_tx; the copies complete the bytes later
        u8* slot = c.ring.data() + (size_t)s * C::STAGE_BYTES;
        std::memset(slot, 0xff, C::STAGE_BYTES);  // NaN words: a byte the box copies miss poisons the result
        jitter(rng, slow);
        const long long a = tma_box(slot, wd.ma, wd.xh.data(), kt * GS_BK, mt * GS_BM);
        c.full[s].complete_tx(a);
        jitter(rng, false);
        c.full[s].complete_tx(tma_box(slot + WS_A_BYTES, wd.mb, wd.w.data(), kt * GS_BK, nt * C::BN));
        if (GPT) {  // the K tile's groups GPT kt .. of the tile's columns (WsProducer::fill)
            jitter(rng, false);
            c.full[s].complete_tx(tma_box(slot + WS_A_BYTES + WSG_B_BYTES, wd.ms, wd.sc.data(), nt * C::BN, kt * GPT));
        }
    }
};

template <int GPT, bool DEFER = false> struct HostConsumer {
    typedef WsCfg<GPT> C;
    static constexpr int STAGES = C::STAGES, BN = C::BN;
    Cta<GPT>& c;
    World& wd;
    int wg;
    std::mt19937 rng;
    bool slow;
    std::vector<float> acc = std::vector<float>(64 * BN), part = std::vector<float>(64 * BN);
    std::vector<float> pend_part = std::vector<float>(64 * BN);  // DEFER: the partial waiting for its scaling
    int pend_slot = -1;                                          // DEFER: its slot (-1: none waits)
    std::vector<int> seen;  // (mt, nt, kt) of every slot consumed in the current output tile
    void zero() { std::fill(acc.begin(), acc.end(), 0.f), seen.clear(); }
    void wait_full(int s, u32 parity) {
        c.full[s].wait(parity);
        std::lock_guard<std::mutex> g(c.mu);
        if (c.fills[s] != c.reads[wg][s] + 1)
            FAIL(24, "warpgroup %d passed full[%d] at fill %d, expected fill %d", wg, s, c.fills[s], c.reads[wg][s] + 1);
        c.reads[wg][s] += 1;
        seen.insert(seen.end(), c.tag[s], c.tag[s] + 3);
    }
    // k16 step ks of the slot's A (this warpgroup's 64 rows) and B tiles into d, one fp32 sum per output
    void step(std::vector<float>& d, u32 a, u32 b, int ks) {
        for (int r = 0; r < 64; ++r)
            for (int n = 0; n < BN; ++n) {
                float sum = 0.f;  // integer-valued test data: exact in any order
                for (int kk = 0; kk < 16; ++kk)
                    sum += f16_to_f32(desc_word(c.ring.data(), a + 32 * ks, r, kk)) *
                           f16_to_f32(desc_word(c.ring.data(), b + 32 * ks, n, kk));
                d[r * BN + n] += sum;
            }
    }
    void mma(int s) {  // the four k16 wgmmas of the slot, in order
        const u32 a = (u32)s * C::STAGE_BYTES + wg * 64 * 128, b = (u32)s * C::STAGE_BYTES + WS_A_BYTES;
        jitter(rng, slow);
        if (GPT == 0) {  // one fp32 accumulator per output
            for (int ks = 0; ks < 4; ++ks) step(acc, a, b, ks);
            return;
        }
        // WsConsumer::mma_groups: group j's k16 steps into a fresh partial, then acc = fmaf(scale, partial, acc)
        // with column n's scale at the slot's scale row j, byte 4 n (scale_group's address). DEFER (GPT 1): the
        // slot's partial waits; the previous slot's is scaled now, its scales read from that slot now (after this
        // slot's wgmmas were issued: WsConsumer's take_pending / scale_group order)
        for (int j = 0; j < GPT; ++j) {
            std::fill(part.begin(), part.end(), 0.f);
            for (int ks = j * (4 / GPT); ks < (j + 1) * (4 / GPT); ++ks) step(part, a, b, ks);
            if (DEFER) {
                if (pend_slot >= 0) scale(pend_part, pend_slot, 0);
                pend_part.swap(part), pend_slot = s;
            } else {
                scale(part, s, j);
            }
        }
    }
    // acc = fmaf(scale, p, acc) with the scale row j of slot s, which must not have been released since this
    // warpgroup read it (the device's producer may refill a released slot)
    void scale(const std::vector<float>& p, int s, int j) {
        {
            std::lock_guard<std::mutex> g(c.mu);
            if (c.rels[wg][s] >= c.reads[wg][s])
                FAIL(31, "warpgroup %d scaled a partial from slot %d after releasing it", wg, s);
        }
        const u8* row = c.ring.data() + (size_t)s * C::STAGE_BYTES + WS_A_BYTES + WSG_B_BYTES + j * WSG_BN * 4;
        for (int r = 0; r < 64; ++r)
            for (int n = 0; n < BN; ++n) {
                float sc;
                memcpy(&sc, row + 4 * n, 4);
                acc[r * BN + n] = fmaf(sc, p[r * BN + n], acc[r * BN + n]);
            }
    }
    void retire_prev() {}
    void retire_all() {}
    void drain(int s) {  // DEFER: the unit's last partial, from the slot about to be released
        if (!DEFER || pend_slot < 0) return;
        if (pend_slot != s) FAIL(32, "warpgroup %d drained slot %d, its last partial is slot %d's", wg, s, pend_slot);
        scale(pend_part, pend_slot, 0);
        pend_slot = -1;
    }
    void release(int s) {
        {
            std::lock_guard<std::mutex> g(c.mu);
            c.rels[wg][s] += 1;
        }
        for (int w = 0; w < WS_CONSUMER_WARPS / 2; ++w) c.empty[s].arrive();  // lane 0 of each of the 4 warps
    }
    void epilogue(const WsUnit& u) {
        const int mt = u.mt, nt = u.nt, nk = (wd.K + GS_BK - 1) / GS_BK;
        if (u.k0 != (int)((long long)u.split * nk / wd.S) || u.k1 != (int)((long long)(u.split + 1) * nk / wd.S))
            FAIL(30, "tile (%d, %d) split %d: K tiles [%d, %d)", mt, nt, u.split, u.k0, u.k1);
        if ((int)seen.size() != 3 * (u.k1 - u.k0))
            FAIL(25, "tile (%d, %d) split %d: %zu K tiles consumed", mt, nt, u.split, seen.size() / 3);
        for (int kt = u.k0; kt < u.k1; ++kt) {
            const int* t = &seen[3 * (kt - u.k0)];
            if (t[0] != mt || t[1] != nt || t[2] != kt)
                FAIL(26, "tile (%d, %d) K tile %d read the fill of (%d, %d, %d)", mt, nt, kt, t[0], t[1], t[2]);
        }
        const int m0 = mt * GS_BM, n0 = nt * BN;
        const size_t pbase = (size_t)u.split * wd.M * wd.N;
        for (int ct = wg * 128; ct < wg * 128 + 128; ++ct)  // through the fragment map, as the device epilogue
            for (int i = 0; i < BN / 2; ++i) {
                int r, cc;
                frag_rc(ct, i, r, cc);
                if (r / 64 != wg) FAIL(27, "fragment row %d outside warpgroup %d", r, wg);
                if (m0 + r < wd.M && n0 + cc < wd.N) {
                    const size_t o = (size_t)(m0 + r) * wd.N + n0 + cc;
                    const float a = acc[(r - 64 * wg) * BN + cc];
                    if (wd.S > 1) {  // units are disjoint: no two threads share an element
                        wd.part[pbase + o] = a;
                        wd.written[pbase + o] += 1;
                    } else {
                        wd.y[o] = a * wd.rowf[m0 + r];
                        wd.written[o] += 1;
                    }
                }
            }
    }
};

static void read_map(Map& m) {
    if (scanf("%lld %lld %lld %lld %lld %d %d", &m.dims0, &m.dims1, &m.stride, &m.box0, &m.box1, &m.swizzle,
              &m.elem) != 7)
        std::exit(2);
}

template <int GPT, bool DEFER = false> static void run(World& wd, int G, unsigned seed, int slow) {
    const WsSched sc(wd.M, wd.N, wd.K, wd.S, WsCfg<GPT>::BN);
    std::vector<Cta<GPT>> ctas(G);
    std::vector<std::thread> th;
    for (int cta = 0; cta < G; ++cta) {
        th.emplace_back([&, cta] {
            HostProducer<GPT> p{ctas[cta], wd, std::mt19937(seed * 977 + cta), slow == 2};
            ws_produce(p, sc, cta, G);
        });
        for (int wg = 0; wg < 2; ++wg)
            th.emplace_back([&, cta, wg] {
                HostConsumer<GPT, DEFER> c{ctas[cta], wd, wg, std::mt19937(seed * 131 + 7 * cta + wg), slow == 1};
                ws_consume(c, sc, cta, G);
            });
    }
    for (auto& t : th) t.join();
}

int main() {
    // the descriptor addressing above is the layout the cp.async kernels write (wdq.cuh sw128), for every row a B
    // tile has and every k of a K tile
    for (int r = 0; r < WS_BN; ++r)
        for (int k = 0; k < GS_BK; ++k)
            if ((int)desc_addr(32 * (k / 16), r, k % 16) != sw128(r, k / 8) + 2 * (k % 8))
                FAIL(29, "descriptor address of (%d, %d) != sw128", r, k);
    World wd;
    int G, slow;
    unsigned seed;
    if (scanf("%d %d %d %d %u %d %d %d", &wd.M, &wd.N, &wd.K, &G, &seed, &slow, &wd.S, &wd.GPT) != 8 || wd.S < 1 ||
        wd.GPT < 0 || wd.GPT > 3)
        return 2;
    const bool defer = wd.GPT == 3;  // 3: gemm90_f16_wsgd<1> (GPT 1, the group scaling deferred by one K tile)
    if (defer) wd.GPT = 1;
    read_map(wd.ma);
    read_map(wd.mb);
    if (wd.GPT) read_map(wd.ms);
    getchar();
    wd.xh.resize((size_t)wd.M * wd.K), wd.w.resize((size_t)wd.N * wd.K), wd.rowf.resize(wd.M);
    const size_t mn = (size_t)wd.M * wd.N;
    wd.y.assign(mn, 0.f), wd.written.assign(wd.S > 1 ? wd.S * mn : mn, 0);
    if (wd.S > 1) wd.part.assign(wd.S * mn, std::nanf(""));
    if (fread(wd.xh.data(), 2, wd.xh.size(), stdin) != wd.xh.size()) return 3;
    if (fread(wd.w.data(), 2, wd.w.size(), stdin) != wd.w.size()) return 3;
    if (wd.GPT) {
        wd.sc.resize((size_t)wd.ms.dims0 * wd.ms.dims1);
        if (fread(wd.sc.data(), 4, wd.sc.size(), stdin) != wd.sc.size()) return 3;
    }
    if (fread(wd.rowf.data(), 4, wd.rowf.size(), stdin) != wd.rowf.size()) return 3;
    if (wd.GPT == 0) run<0>(wd, G, seed, slow);
    if (wd.GPT == 1 && !defer) run<1>(wd, G, seed, slow);
    if (wd.GPT == 1 && defer) run<1, true>(wd, G, seed, slow);
    if (wd.GPT == 2) run<2>(wd, G, seed, slow);
    for (size_t i = 0; i < wd.written.size(); ++i)
        if (wd.written[i] != 1) FAIL(28, "output %zu written %d times", i, wd.written[i]);
    if (wd.S > 1) {  // gemm90_f16_ws_reduce: the kernel's split sum, then its epilogue (row_scale 1)
        for (size_t i = 0; i < mn; ++i)
            wd.y[i] = ws_split_sum(wd.part.data(), (long long)mn, (long long)i, wd.S) * wd.rowf[i / wd.N];
    }
    fwrite(wd.y.data(), 4, wd.y.size(), stdout);
    if (wd.S > 1) fwrite(wd.part.data(), 4, wd.part.size(), stdout);
    return 0;
}
