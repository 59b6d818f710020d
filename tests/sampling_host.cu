// Host check of the GPU sampler's arithmetic (tests/test_sampler.py builds and drives it; no GPU needed).
// Includes cuda_src/sampling.cu and runs the sample_rows algorithm sequentially with the kernel's own
// __host__ __device__ pieces (sort_key, token_mass, find_bin, top_p_target, draw_target, counter_u, the workspace
// packing): same candidates, same radix passes and histograms (summed in one thread instead of by atomics, which
// are exact and order-independent), same bin search. What stays unchecked here is the CUDA parallel machinery.
//
// stdin (binary): int32 rows, V, limit, has_mask; per row: float64 T, top_p, min_p; int32 top_k; uint64 seed,
// position; float32 x[V]; int32 mask[ceil(V/32)] if has_mask. stdout: one token id per line (-1: nothing allowed).
#include <cmath>
#include <cstdio>
#include <vector>

#include "sampling.cu"

static u64 select(const std::vector<u64>& ws, const std::vector<float>& x, u64 lo, u64 r, bool mass) {
    u64 prefix = 0, hist[256], group[32], sh[2];
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (u64& h : hist) h = 0;
        for (u64 w : ws) {
            const u64 key = sort_key(x[ws_id(w)], ws_id(w));
            if (key < lo || (shift < 56 && (key >> (shift + 8)) != (prefix >> (shift + 8)))) continue;
            hist[(key >> shift) & 255u] += mass ? ws_mass(w) : 1ull;
        }
        for (int g = 0; g < 32; ++g) {
            group[g] = 0;
            for (int k = 0; k < 8; ++k) group[g] += hist[255 - 8 * g - k];
        }
        find_bin(hist, group, r, sh);
        prefix |= sh[0] << shift;
        r = sh[1];
    }
    return prefix;
}

static u64 kept(const std::vector<u64>& ws, const std::vector<float>& x, u64 lo) {
    u64 s = 0;
    for (u64 w : ws)
        if (sort_key(x[ws_id(w)], ws_id(w)) >= lo) s += ws_mass(w);
    return s;
}

static int sample_row(const std::vector<float>& x, const int* m, int lim, double T, int k, double tp, double mp,
                      u64 seed, u64 pos) {
    auto allowed = [&](int i) { return (!m || ((m[i >> 5] >> (i & 31)) & 1)) && !std::isnan(x[i]); };
    u64 best = 0;
    for (int i = 0; i < lim; ++i)
        if (allowed(i) && sort_key(x[i], i) > best) best = sort_key(x[i], i);
    if (best == 0 || T <= 0.0) return best == 0 ? -1 : key_id(best);
    const float mx = x[key_id(best)];
    std::vector<u64> ws;
    for (int i = 0; i < lim; ++i) {
        if (!allowed(i)) continue;
        double e;
        const u64 q = token_mass(x[i], mx, T, e);
        if (q == 0 || (mp > 0.0 && e < mp)) continue;
        ws.push_back(((q - 1) << 20) | (u64)i);
    }
    const int n = (int)ws.size();
    u64 lo = 0;
    if (k > 0 && k < n) lo = select(ws, x, 0, (u64)k, false);
    if (tp < 1.0) lo = select(ws, x, lo, top_p_target(tp, kept(ws, x, lo)), true);
    return key_id(select(ws, x, lo, draw_target(counter_u(seed, pos), kept(ws, x, lo)), true));
}

template <typename T> static void get(T* p, size_t n) {
    if (std::fread(p, sizeof(T), n, stdin) != n) throw 1;
}

int main() {
    int head[4];
    get(head, 4);
    const int rows = head[0], V = head[1], limit = head[2] < V ? head[2] : V, words = (V + 31) / 32;
    std::vector<float> x(V);
    std::vector<int> mask(words);
    for (int r = 0; r < rows; ++r) {
        double f[3];
        int k;
        u64 sp[2];
        get(f, 3), get(&k, 1), get(sp, 2), get(x.data(), V);
        if (head[3]) get(mask.data(), words);
        std::printf("%d\n", sample_row(x, head[3] ? mask.data() : nullptr, limit, f[0], k, f[1], f[2], sp[0], sp[1]));
    }
    return 0;
}
