// resolve_row: the last block of a row in split_hist (plan = 1) and split_gather (plan = 0); see sample_split.cuh. pre: per row the bins' exclusive prefix sums, counts
// Cc[nb + 1] then masses Cm[nb + 1] (Cc[b] = candidates in bins < b). The sorted list (plan = 0) holds bins
// [b0, b1]; its j-th entry's cumulative weight from the top of the order is Cx[b0] + its prefix within the list.

// The first index j of a stage's weight w: Cx[b] < w <= Cx[b + 1] (1 <= w <= Cx[nb]: exactly one b).
__device__ void find_prefix_bin(const u64* Cx, int nb, u64 w, int* out) {
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        if (Cx[b] < w && w <= Cx[b + 1]) *out = b;
}

// Loads the gathered list (nl <= cap entries of ws), sorts it by descending key, masses to inclusive prefix sums.
__device__ void load_sorted(const u64* ws, int nl, const float* x, u64* keys, u64* w, u64* tmp) {
    int P = 1;
    while (P < nl) P <<= 1;
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
        if (j < nl) {
            const u64 e = __ldcg(ws + j);
            keys[j] = sort_key(x[ws_id(e)], ws_id(e));
            w[j] = ws_mass(e);
        } else {
            keys[j] = 0, w[j] = 0;
        }
    }
    __syncthreads();
    bitonic_desc(keys, w, P);
    block_scan_u64(w, P, tmp);
}

__device__ void resolve_row(SPLIT_ARGS, int plan, u64* smem) {
    u64 *keys = smem, *w = smem + SPLIT_CAP_MAX, *hist = w + SPLIT_CAP_MAX, *group = hist + 256;
    u64 *scratch = group + 32, *sh = scratch + 32;
    __shared__ u64 s_w, s_mass;
    __shared__ int s_stage, s_wm, s_bin, s_j, s_b0;
    const long long row = blockIdx.y;
    const int tid = threadIdx.x;
    u64* s = st + row * ST_STRIDE;
    const float* x = logits + row * ld;
    u64* z = zero + row * zs;
    u64* Cc = pre_all + row * 2 * (nb + 1);
    u64* Cm = Cc + nb + 1;
    const u64* ws = ws_all + row * ldw;
    long long b0 = -1, b1 = -1, nl = -1;  // the list's bins and length (-1: no list)
    if (plan) {  // the bins' prefix sums; the histogram zeroed for the next launch
        for (int b = tid; b < nb; b += blockDim.x)
            keys[b] = __ldcg(z + b), w[b] = __ldcg(z + nb + b), z[b] = 0, z[nb + b] = 0;
        __syncthreads();
        block_scan_u64(keys, nb, hist);
        block_scan_u64(w, nb, hist);
        for (int b = tid; b <= nb; b += blockDim.x) Cc[b] = b ? keys[b - 1] : 0, Cm[b] = b ? w[b - 1] : 0;
        if (tid == 0) s_mass = w[nb - 1];
    } else {
        b0 = (long long)s[ST_B0], b1 = (long long)s[ST_B1];
        nl = (long long)__ldcg(z + 2 * nb);
        __syncthreads();
        if (tid == 0) z[2 * nb] = 0, s_mass = s[ST_MASS];
        if (nl <= cap) load_sorted(ws, (int)nl, x, keys, w, hist);
    }
    if (tid == 0) s_stage = (int)s[ST_STAGE];
    __syncthreads();
    for (;;) {
        if (tid == 0) {  // the next stage that cuts: its weight (a count for top-k, else a mass)
            int stage = s_stage, wm = 1;
            u64 wt = 0;
            for (;;) {
                if (stage == 0) {
                    const int k = topk[row];
                    if (k > 0 && (u64)k < Cc[nb]) {
                        wt = (u64)k, wm = 0;
                        break;
                    }
                    stage = 1;  // no cut: the kept mass stays all of it
                } else if (stage == 1) {
                    if (topp[row] < 1.0) {
                        wt = top_p_target(topp[row], s_mass);
                        break;
                    }
                    stage = 2;
                } else {
                    wt = draw_target(counter_u(seeds[row], positions[row]), s_mass);
                    break;
                }
            }
            s_stage = stage, s_w = wt, s_wm = wm, s_bin = -1;
        }
        __syncthreads();
        const u64 wt = s_w;
        const int wm = s_wm;
        const u64* Cx = wm ? Cm : Cc;
        find_prefix_bin(Cx, nb, wt, &s_bin);
        __syncthreads();
        const long long b = s_bin;
        if (nl >= 0 && b0 <= b && b <= b1) {  // in the list: the exact position
            u64 key, kept;
            if (nl <= cap) {
                const u64 base = Cx[b0];
                if (!wm) {
                    if (tid == 0) s_j = (int)(wt - base - 1);
                } else {
                    for (int j = tid; j < nl; j += blockDim.x)
                        if (base + (j ? w[j - 1] : 0) < wt && wt <= base + w[j]) s_j = j;
                }
                __syncthreads();
                key = keys[s_j], kept = Cm[b0] + w[s_j];
            } else {  // one bin of more than cap candidates: radix selection over the list
                key = radix_select(ws, (int)nl, x, 0, wt - Cx[b0], wm != 0, hist, group, sh);
                kept = Cm[b0] + kept_mass(ws, (int)nl, x, key, scratch);
            }
            if (tid == 0) {
                s_mass = kept;
                if (s_stage == 2) out[row] = key_id(key);
                s_stage += 1;
            }
            __syncthreads();
            const bool done = s_stage == 3;
            __syncthreads();
            if (done) break;
            continue;
        }
        // not in the list: ask for bins [b0', b], b0' as low as keeps them within cap candidates
        if (tid == 0) s_b0 = (int)b;
        __syncthreads();
        for (long long c = tid; c <= b; c += blockDim.x)
            if (Cc[b + 1] - Cc[c] <= (u64)cap && (c == 0 || Cc[b + 1] - Cc[c - 1] > (u64)cap)) s_b0 = (int)c;
        __syncthreads();
        if (tid == 0) s[ST_B0] = (u64)(long long)s_b0, s[ST_B1] = (u64)b;
        break;
    }
    if (tid == 0) {
        s[ST_STAGE] = (u64)s_stage, s[ST_MASS] = s_mass;
        if (s_stage == 3) s[ST_B0] = (u64)-1;
    }
}
