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

// From stage on, the next stage that cuts and its weight *wt (a count for top-k: *wm = 0, else a mass), given the
// kept mass S so far and the n candidates; a stage that cuts nothing is passed (the kept set stays as it is).
HD int next_cut(int stage, u64 S, u64 n, int k, double tp, double u, u64* wt, int* wm) {
    *wm = 1;
    if (stage == 0) {
        if (k > 0 && (u64)k < n) {
            *wt = (u64)k, *wm = 0;
            return 0;
        }
        stage = 1;
    }
    if (stage == 1) {
        if (tp < 1.0) {
            *wt = top_p_target(tp, S);
            return 1;
        }
        stage = 2;
    }
    *wt = draw_target(u, S);
    return 2;
}

// plan: the bins' exclusive prefix sums Cc, Cm from the histogram (zeroed for the next launch); the total mass.
__device__ u64 plan_prefix(u64* z, int nb, u64* Cc, u64* Cm, u64* keys, u64* w, u64* tmp) {
    for (int b = threadIdx.x; b < nb; b += blockDim.x)
        keys[b] = __ldcg(z + b), w[b] = __ldcg(z + nb + b), z[b] = 0, z[nb + b] = 0;
    __syncthreads();
    block_scan_u64(keys, nb, tmp);
    block_scan_u64(w, nb, tmp);
    for (int b = threadIdx.x; b <= nb; b += blockDim.x) Cc[b] = b ? keys[b - 1] : 0, Cm[b] = b ? w[b - 1] : 0;
    return w[nb - 1];
}

// The bins to gather for a cut in bin b: [b0, b], b0 as low as keeps them within cap candidates (b alone if it
// holds more). The condition is monotone in b0, so exactly one thread finds the first b0 that meets it.
__device__ int ask_bins(const u64* Cc, long long b, int cap, int* s_b0) {
    if (threadIdx.x == 0) *s_b0 = (int)b;
    __syncthreads();
    for (long long c = threadIdx.x; c <= b; c += blockDim.x)
        if (Cc[b + 1] - Cc[c] <= (u64)cap && (c == 0 || Cc[b + 1] - Cc[c - 1] > (u64)cap)) *s_b0 = (int)c;
    __syncthreads();
    return *s_b0;
}

// The sorted list's index of a cut's weight wt (base: the weight above the list): direct for a count, the one j
// with base + w[j - 1] < wt <= base + w[j] for a mass.
__device__ int list_index(const u64* w, int nl, u64 base, u64 wt, int wm, int* s_j) {
    if (!wm) {
        if (threadIdx.x == 0) *s_j = (int)(wt - base - 1);
    } else {
        for (int j = threadIdx.x; j < nl; j += blockDim.x)
            if (base + (j ? w[j - 1] : 0) < wt && wt <= base + w[j]) *s_j = j;
    }
    __syncthreads();
    return *s_j;
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
    if (plan) {
        const u64 total = plan_prefix(z, nb, Cc, Cm, keys, w, hist);
        if (tid == 0) s_mass = total;
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
        if (tid == 0) {
            u64 wt;
            int wm;
            const double u = counter_u(seeds[row], positions[row]);
            s_stage = next_cut(s_stage, s_mass, Cc[nb], topk[row], topp[row], u, &wt, &wm);
            s_w = wt, s_wm = wm, s_bin = -1;
        }
        __syncthreads();
        const u64 wt = s_w;
        const int wm = s_wm;
        const u64* Cx = wm ? Cm : Cc;
        find_prefix_bin(Cx, nb, wt, &s_bin);
        __syncthreads();
        const long long b = s_bin;
        if (nl < 0 || b < b0 || b > b1) {  // not in the list: ask for it
            const int a = ask_bins(Cc, b, cap, &s_b0);
            if (tid == 0) s[ST_B0] = (u64)(long long)a, s[ST_B1] = (u64)b;
            break;
        }
        u64 key, kept;  // in the list: the exact position
        if (nl <= cap) {
            const int j = list_index(w, (int)nl, Cx[b0], wt, wm, &s_j);
            key = keys[j], kept = Cm[b0] + w[j];
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
    }
    if (tid == 0) {
        s[ST_STAGE] = (u64)s_stage, s[ST_MASS] = s_mass;
        if (s_stage == 3) s[ST_B0] = (u64)-1;
    }
}
