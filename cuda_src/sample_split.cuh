// sample_rows with each row's vocabulary split over many blocks (included by sampling.cu after the exact
// sampler's pieces: sort_key, token_mass, top_p_target, draw_target, counter_u, radix_select, kept_mass).
//
// The definition (ninfer/engine/sampler.py) orders the candidates by descending key and takes prefixes of that
// order: top-k (a count), top-p (a mass) and the draw (a mass) are each "the first candidate whose cumulative
// weight from the top reaches w". Here the order is cut into nb bins by a function of x alone that never increases
// with x (mass_bin), so a bin is a contiguous stretch of the order and the bins' exact integer counts and masses
// (atomics: order-independent) locate the bin holding any w. Only that stretch is then put in exact key order:
// its candidates are gathered and sorted (bitonic, at most cap of them) by one block, or, for a bin of more than
// cap (ties, a flat bin), searched by sample_rows' radix selection over the gathered list.
//
// Launches (all grids fixed by (rows, V, chunk); per row, nothing depends on other rows or the launch size):
//   split_max    (splits, rows): the row's largest allowed key and smallest allowed x; the last block to arrive
//                writes the row's state (the bin scale), or the answer for greedy rows and rows with nothing
//                allowed.
//   split_hist   (splits / 4, rows): each candidate's (count, q) added to its bin (shared, then global atomics);
//                the row's last block to arrive plans (resolve_row, plan = 1): the bins' prefix sums (the
//                histogram zeroed for the next launch), then the stages as far as the prefix sums answer them; a
//                stage that needs a bin's order asks for the bins [b0, b] (b0 as low as keeps them within cap
//                candidates: later stages only move up the order, so they often land in the same list).
//   split_gather (splits, rows) x 3: the asked bins' candidates appended to the row's list (a self-resetting
//                count); the row's last block to arrive sorts the list and answers the stages it holds, or asks
//                again (resolve_row, plan = 0).
// Each round answers at least the stage it asked for, so three rounds finish every row; a row that is done
// returns at once in the later launches. Arrival counters are reset by the last block, as in argmax_split; a
// block's global writes are fenced by every thread before thread 0 arrives, and the last block reads them
// through L2 (__ldcg).

constexpr int SPLIT_NT = 256;        // threads of split_max / split_hist / split_gather
constexpr int SPLIT_CHUNK_MAX = 2048;  // ids per block at most (split_gather's shared list)
constexpr int SPLIT_NB_MAX = 2048;   // bins at most
constexpr int SPLIT_CAP_MAX = 2048;  // sorted list at most (resolve_row's shared memory)
// shared memory of split_hist / split_gather (u64 words): the sorted list's keys and masses, then 256 words for the
// scans' partials and the radix histogram, 32 + 32 + 2 for its groups, reductions and answer
constexpr int SPLIT_SMEM = 2 * SPLIT_CAP_MAX + 256 + 66;
constexpr int ST_STRIDE = 8;         // u64 state words per row: see enum
enum { ST_BEST = 0, ST_SCALE = 1, ST_STAGE = 2, ST_B0 = 3, ST_B1 = 4, ST_MASS = 5 };
// stage: 0 top-k, 1 top-p, 2 the draw, 3 done. ST_MASS: the mass of the kept prefix so far (all candidates until a
// cut). ST_B0 / ST_B1: the bins asked for (B0 = -1: none).

HD double u64_as_f64(u64 u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    __builtin_memcpy(&d, &u, 8);
    return d;
#endif
}
HD u64 f64_as_u64(double d) {
#ifdef __CUDA_ARCH__
    return (u64)__double_as_longlong(d);
#else
    u64 u;
    __builtin_memcpy(&u, &d, 8);
    return u;
#endif
}

// The bin of a candidate with logit x (m: the row's largest allowed x): 0 for x == m, else floor((m - x) * scale)
// clamped to nb - 1. Rounding is monotone, so the bin never increases with x (and ties share a bin): bin order is
// the key order. scale only spreads the candidates over the bins; any value keeps the result exact.
HD int mass_bin(float x, float m, double scale, int nb) {
    if (x == m) return 0;
    const double v = ((double)m - (double)x) * scale;
    return v < (double)(nb - 1) ? (int)v : nb - 1;
}

// The scale of a row: nb bins over the x range that can hold candidates, [max(xmin, m - tmax * T), m] with
// tmax = 44 ln 2 (q > 0) or -ln(min_p); 0 (every finite x in bin 0) when that range is empty or not finite.
HD double bin_scale(float m, float xmin, double T, double mp, int nb) {
    double tmax = 30.6;
    if (mp > 0.0 && -log(mp) < tmax) tmax = -log(mp) * 1.000001 + 1e-9;
    double lower = (double)m - tmax * T;
    if ((double)xmin > lower) lower = (double)xmin;
    const double span = (double)m - lower;
    return span > 0.0 && span < 1e300 ? (double)nb / span : 0.0;
}

// The float32 whose order bits (sort_key's upper half) are o.
HD float ordered_float(u32 o) { return f32_from_bits((o & 0x80000000u) ? (o ^ 0x80000000u) : ~o); }

HD bool id_allowed(const int* m, int i) { return !m || ((m[i >> 5] >> (i & 31)) & 1); }

__global__ void __launch_bounds__(SPLIT_NT)
    split_max(const float* __restrict__ logits, long long ld, const int* __restrict__ mask, long long ldm, int limit,
              int chunk, const double* __restrict__ temp, const double* __restrict__ minp, int nb,
              u64* __restrict__ part, int* __restrict__ cnt, u64* __restrict__ st, int* __restrict__ out) {
    __shared__ u64 scratch[32];
    __shared__ int last;
    const long long row = blockIdx.y;
    const int splits = gridDim.x;
    const float* x = logits + row * ld;
    const int* m = mask ? mask + row * ldm : nullptr;
    const long long lo = (long long)blockIdx.x * chunk;
    const int hi = lo + chunk < limit ? (int)(lo + chunk) : limit;
    u64 best = 0, low = 0;  // low: the largest ~order bits (the smallest x); 0: nothing allowed
    for (int i = (int)lo + threadIdx.x; i < hi; i += SPLIT_NT) {
        const float v = x[i];
        if (v != v || !id_allowed(m, i)) continue;
        const u64 k = sort_key(v, i);
        best = k > best ? k : best;
        const u64 l = 0xffffffffull - (k >> 32) + 1;
        low = l > low ? l : low;
    }
    best = block_max_u64(best, scratch);
    low = block_max_u64(low, scratch);
    u64* p = part + (row * splits + blockIdx.x) * 2;
    if (threadIdx.x == 0) {
        p[0] = best, p[1] = low;
        last = arrive_acq_rel(cnt + row, 1) == splits - 1;
    }
    __syncthreads();
    if (!last) return;
    best = low = 0;
    for (int s = threadIdx.x; s < splits; s += SPLIT_NT) {
        const u64 b = __ldcg(part + (row * splits + s) * 2), l = __ldcg(part + (row * splits + s) * 2 + 1);
        best = b > best ? b : best;
        low = l > low ? l : low;
    }
    best = block_max_u64(best, scratch);
    low = block_max_u64(low, scratch);
    if (threadIdx.x != 0) return;
    cnt[row] = 0;
    u64* s = st + row * ST_STRIDE;
    s[ST_B0] = (u64)-1;
    const double T = temp[row];
    if (best == 0 || T <= 0.0) {  // nothing allowed, or greedy: done here
        out[row] = best == 0 ? -1 : key_id(best);
        s[ST_STAGE] = 3;
        return;
    }
    const float mx = x[key_id(best)], xmin = ordered_float((u32)(0xffffffffull - (low - 1)));
    s[ST_BEST] = best;
    s[ST_SCALE] = f64_as_u64(bin_scale(mx, xmin, T, minp[row], nb));
    s[ST_STAGE] = 0;
}

// The candidate test and mass of id i (allowed, not NaN): q > 0 and e >= min_p; 0 when not a candidate.
HD u64 candidate_mass(float v, float mx, double T, double mp) {
    double e;
    const u64 q = token_mass(v, mx, T, e);
    return q == 0 || (mp > 0.0 && e < mp) ? 0 : q;
}

// The argument list of split_hist and split_gather (the last block resolves the row).
#define SPLIT_ARGS                                                                                                 \
    const float *__restrict__ logits, long long ld, const int *__restrict__ mask, long long ldm, int limit,        \
        int chunk, const double *__restrict__ temp, const double *__restrict__ minp, int nb,                       \
        const int *__restrict__ topk, const double *__restrict__ topp, const u64 *__restrict__ seeds,              \
        const u64 *__restrict__ positions, int cap, int *__restrict__ cnt, u64 *__restrict__ st,                   \
        u64 *__restrict__ zero, long long zs, u64 *__restrict__ pre_all, u64 *__restrict__ ws_all, long long ldw,  \
        int *__restrict__ out

__device__ void resolve_row(SPLIT_ARGS, int plan, u64* smem);

// After a block's global writes (every thread): whether it is the row's last block to arrive (then the counter is
// reset for the next launch and the other blocks' writes are visible through L2).
__device__ bool last_to_arrive(int* cnt, long long row, int* flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *flag = arrive_acq_rel(cnt + row, 1) == (int)gridDim.x - 1;
    __syncthreads();
    const bool last = *flag;
    if (last && threadIdx.x == 0) cnt[row] = 0;
    return last;
}

// zero: per row [nb counts | nb masses | list count] (stride zs), zero between launches.
__global__ void __launch_bounds__(SPLIT_NT) split_hist(SPLIT_ARGS) {
    __shared__ u64 smem[SPLIT_SMEM];
    __shared__ int flag;
    u64* hm = smem;
    u32* hc = (u32*)(smem + SPLIT_NB_MAX);
    const long long row = blockIdx.y;
    const u64* s = st + row * ST_STRIDE;
    if (s[ST_STAGE] >= 3) return;
    const float* x = logits + row * ld;
    const int* m = mask ? mask + row * ldm : nullptr;
    const float mx = x[key_id(s[ST_BEST])];
    const double T = temp[row], mp = minp[row], scale = u64_as_f64(s[ST_SCALE]);
    for (int b = threadIdx.x; b < nb; b += SPLIT_NT) hc[b] = 0, hm[b] = 0;
    __syncthreads();
    const long long lo = (long long)blockIdx.x * chunk;
    const int hi = lo + chunk < limit ? (int)(lo + chunk) : limit;
    for (int i = (int)lo + threadIdx.x; i < hi; i += SPLIT_NT) {
        const float v = x[i];
        if (v != v || !id_allowed(m, i)) continue;
        const u64 q = candidate_mass(v, mx, T, mp);
        if (q == 0) continue;
        const int b = mass_bin(v, mx, scale, nb);
        atomicAdd(&hc[b], 1u);
        atomicAdd(&hm[b], q);
    }
    __syncthreads();
    u64* z = zero + row * zs;
    for (int b = threadIdx.x; b < nb; b += SPLIT_NT)
        if (hc[b]) atomicAdd(&z[b], (u64)hc[b]), atomicAdd(&z[nb + b], hm[b]);
    if (!last_to_arrive(cnt, row, &flag)) return;
    resolve_row(logits, ld, mask, ldm, limit, chunk, temp, minp, nb, topk, topp, seeds, positions, cap, cnt, st, zero,
                zs, pre_all, ws_all, ldw, out, 1, smem);
}

// The candidates of bins [ST_B0, ST_B1] appended to the row's list ws (workspace entries, as sample_rows'); the
// row's last block resolves.
__global__ void __launch_bounds__(SPLIT_NT) split_gather(SPLIT_ARGS) {
    __shared__ u64 smem[SPLIT_SMEM];
    __shared__ u32 n;
    __shared__ u64 base;
    __shared__ int flag;
    u64* list = smem;  // SPLIT_CHUNK_MAX entries
    const long long row = blockIdx.y;
    const u64* s = st + row * ST_STRIDE;
    const long long b0 = (long long)s[ST_B0], b1 = (long long)s[ST_B1];
    if (s[ST_STAGE] >= 3 || b0 < 0) return;
    const float* x = logits + row * ld;
    const int* m = mask ? mask + row * ldm : nullptr;
    const float mx = x[key_id(s[ST_BEST])];
    const double T = temp[row], mp = minp[row], scale = u64_as_f64(s[ST_SCALE]);
    if (threadIdx.x == 0) n = 0;
    __syncthreads();
    const long long lo = (long long)blockIdx.x * chunk;
    const int hi = lo + chunk < limit ? (int)(lo + chunk) : limit;
    for (int i = (int)lo + threadIdx.x; i < hi; i += SPLIT_NT) {
        const float v = x[i];
        if (v != v || !id_allowed(m, i)) continue;
        const int b = mass_bin(v, mx, scale, nb);
        if (b < b0 || b > b1) continue;
        const u64 q = candidate_mass(v, mx, T, mp);
        if (q != 0) list[atomicAdd(&n, 1u)] = ((q - 1) << 20) | (u64)i;
    }
    __syncthreads();
    if (threadIdx.x == 0) base = n ? atomicAdd(&zero[row * zs + 2 * nb], (u64)n) : 0;
    __syncthreads();
    u64* ws = ws_all + row * ldw;
    for (u32 j = threadIdx.x; j < n; j += SPLIT_NT) ws[base + j] = list[j];
    if (!last_to_arrive(cnt, row, &flag)) return;
    resolve_row(logits, ld, mask, ldm, limit, chunk, temp, minp, nb, topk, topp, seeds, positions, cap, cnt, st, zero,
                zs, pre_all, ws_all, ldw, out, 0, smem);
}

// Inclusive prefix sums of a[0, L) in place: each thread sums a contiguous segment, the blockDim.x (<= 256)
// segment sums are scanned in tmp (Hillis-Steele), then each segment is rewritten from its offset.
__device__ void block_scan_u64(u64* a, int L, u64* tmp) {
    const int t = threadIdx.x, per = (L + blockDim.x - 1) / blockDim.x, s0 = t * per;
    const int s1 = s0 + per < L ? s0 + per : L;
    u64 sum = 0;
    for (int i = s0; i < s1; ++i) sum += a[i];
    tmp[t] = sum;
    __syncthreads();
    for (int off = 1; off < (int)blockDim.x; off <<= 1) {
        const u64 v = t >= off ? tmp[t - off] : 0;
        __syncthreads();
        tmp[t] += v;
        __syncthreads();
    }
    u64 run = t ? tmp[t - 1] : 0;
    for (int i = s0; i < s1; ++i) run += a[i], a[i] = run;
    __syncthreads();
}

// keys[0, P) descending with their masses (P a power of two; keys distinct but the zero padding).
__device__ void bitonic_desc(u64* keys, u64* w, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                const int l = i ^ j;
                if (l <= i) continue;
                const bool desc = (i & k) == 0;
                if (desc ? keys[i] < keys[l] : keys[i] > keys[l]) {
                    const u64 tk = keys[i], tw = w[i];
                    keys[i] = keys[l], w[i] = w[l], keys[l] = tk, w[l] = tw;
                }
            }
            __syncthreads();
        }
}

#include "sample_resolve.cuh"
