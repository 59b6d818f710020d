// Driver of the expert-lanes host emulation (tests/gemv_lanes_emu.py), appended after attn_emu.cpp (CUDA
// built-ins on std::thread, emu_mma), cuda_src/gemv.cu (GV_HOST_EMU), cuda_src/moe_lanes.cu, router.cu's
// moe_route kernel and norm.cu (its __shared__ arrays static: blocks run one at a time).
// argv = dir fmt T NB N K splits S E xf tab seed table_only
//   fmt: 0 BF16, 1 NVFP4, 2 FP8 row; T: 0 float, 1 bf16; NB: 4 | 8; xf: 0 plain, 1 SwiGLU (x rows are [gate | up]);
//   tab: 0 the tx table (x by token row), 1 ts (x by pair row); table_only: build the table and stop.
// Reads dir/{ids,xrow}.bin (S int32 each, sorted by expert), dir/w.bin + dir/woff.bin (3 int64 plane offsets),
// dir/x.bin (xrows x ldx activations, xrows from dir/xrows.bin); writes dir/{sid,tx,ts}.bin (the table) and
// dir/{lanes,one}.bin: y[S, N] by the lanes launch and by the one-lane expert launch (slot s = pair s).
// Exits 7 if a split arrival counter is not zero again after a launch, 8 if a cluster launch wrote the workspace.
// Environment GV_EMU_CLUSTER=1: every launch with K splits (grid.y > 1) runs as clusters of its splits (gemv.cu's
// gv_store_cl, as linear.py launches it with cluster dims (1, splits, 1)) instead of the arrival-counter path.
static const bool gv_cluster = [] {
    const char* e = std::getenv("GV_EMU_CLUSTER");
    return e && std::string(e) == "1";
}();

// emu_launch with the GEMV's and the table's dynamic shared memory poisoned per block (NaN floats, -1 ints); the
// cluster launches give each block its own poisoned shared memory
template <typename Fn> void gv_launch(emu_dim3 grid, unsigned threads, unsigned seed, Fn fn) {
    if (gv_cluster && grid.y > 1) {
        std::memset(ml_sm, 0xff, sizeof(ml_sm));
        emu_launch_cluster_poisoned(grid, grid.y, threads, sizeof(gv_sm), seed, fn);
        return;
    }
    emu_launch_poisoned(grid, threads, seed, [] {
        std::memset(gv_sm, 0xff, sizeof(gv_sm));
        std::memset(ml_sm, 0xff, sizeof(ml_sm));
    }, fn);
}

// 7: an arrival counter not zero again; 8: a cluster launch touched the workspace (it must not use ws or cnt)
inline int gv_check(const std::vector<float>& ws, const std::vector<int>& cnt) {
    for (int c : cnt)
        if (c != 0) return 7;
    if (gv_cluster)
        for (float v : ws)
            if (!std::isnan(v)) return 8;
    return 0;
}

// dir/<name>.bin (a weight's bytes, dir/<name>size.bin of them, 64 bytes of slack after) and its three plane
// offsets (dir/<name>off.bin) into off
inline std::vector<u8> gv_read_weight(const std::string& dir, const std::string& name, long long off[3]) {
    auto wsz = emu_read<long long>(dir + "/" + name + "size.bin", 1)[0];
    auto w = emu_read<u8>(dir + "/" + name + ".bin", (size_t)wsz);
    w.resize(w.size() + 64);
    auto o = emu_read<long long>(dir + "/" + name + "off.bin", 3);
    for (int i = 0; i < 3; ++i) off[i] = o[i];
    return w;
}

struct GvArgs {
    std::string dir;
    int NB, N, K, splits, S, E, xf, tab, Z, xrows;
    unsigned seed;
    long long ldx;
};

template <typename F, typename T, int NB>
int gv_run(const GvArgs& a, const std::vector<u8>& w, const long long off[3], const std::vector<T>& x,
           const std::vector<int>& ids, const std::vector<int>& sel, int experts, int gz, std::vector<T>& y) {
    const u8 *p0 = w.data() + off[0], *p1 = w.data() + off[1], *p2 = w.data() + off[2];
    constexpr int ROWS = GV_WARPS * F::MT * 16;
    const int bx = (a.N + ROWS - 1) / ROWS;
    std::vector<float> ws((size_t)gz * bx * a.splits * ROWS * 8 + 8, NAN);
    std::vector<int> cnt((size_t)gz * bx + 1, 0);
    const long long K = a.K, ldx2 = a.ldx;
    const T* x2 = x.data() + (a.xf == 1 ? K : 0);
    gv_launch({(unsigned)bx, (unsigned)a.splits, (unsigned)gz}, GV_WARPS * 32, a.seed, [&] {
        gemv_mma<F, T, NB>(p0, p1, p2, x.data(), x2, y.data(), ids.data(), sel.data(), ws.data(), cnt.data(), a.N,
                           a.K, 0, a.ldx, ldx2, a.N, 0, experts, a.xf, 8, 0, nullptr, 0, 0, 0.f, 0);
    });
    return gv_check(ws, cnt);
}

template <typename F, typename T, int NB> int gv_case(const GvArgs& a, bool table_only) {
    auto ids = emu_read<int>(a.dir + "/ids.bin", a.S), xrow = emu_read<int>(a.dir + "/xrow.bin", a.S);
    std::vector<int> sid(a.Z, -7), tx((size_t)a.Z * 2 * NB, -7), ts((size_t)a.Z * 2 * NB, -7);
    gv_launch({1, 1, 1}, 1024, a.seed, [&] {
        gemv_lanes_table<NB>(ids.data(), xrow.data(), a.S, a.E, a.Z, sid.data(), tx.data(), ts.data());
    });
    emu_write(a.dir + "/sid.bin", sid);
    emu_write(a.dir + "/tx.bin", tx);
    emu_write(a.dir + "/ts.bin", ts);
    if (table_only) return 0;
    long long off[3];
    const auto w = gv_read_weight(a.dir, "w", off);
    auto x = emu_read<T>(a.dir + "/x.bin", (size_t)a.xrows * a.ldx);
    std::vector<T> lanes((size_t)a.S * a.N), one((size_t)a.S * a.N);
    std::memset((void*)lanes.data(), 0xff, lanes.size() * sizeof(T));  // NaN poison (float and bf16 words)
    std::memset((void*)one.data(), 0xff, one.size() * sizeof(T));
    int rc = gv_run<F, T, NB>(a, w, off, x, sid, a.tab ? ts : tx, 2, a.Z, lanes);
    if (rc) return rc;
    // one lane per pair: activation row xrow[s] (tx) or s (ts), output row s
    std::vector<int> rows(a.S);
    for (int s = 0; s < a.S; ++s) rows[s] = a.tab ? s : xrow[s];
    rc = gv_run<F, T, 1>(a, w, off, x, ids, rows, 1, a.S, one);
    if (rc) return rc;
    emu_write(a.dir + "/lanes.bin", lanes);
    emu_write(a.dir + "/one.bin", one);
    return 0;
}

template <typename F, typename T> int gv_nb(const GvArgs& a, bool t) {
    return a.NB == 4 ? gv_case<F, T, 4>(a, t) : gv_case<F, T, 8>(a, t);
}
template <typename F> int gv_t(int tt, const GvArgs& a, bool t) {
    return tt ? gv_nb<F, bf16>(a, t) : gv_nb<F, float>(a, t);
}

// Dense mode (argv: dense dir fmt T N K splits rows seed): rows activation rows x[rows, K] (dir/x.bin) against
// W (dir/w.bin, woff.bin); writes dir/{lanes8,lanes1}.bin: y[rows, N] by the K-split launch with 8-lane blocks and
// with one lane per block (several lane blocks side by side: zin).
// Exits 7 if an arrival counter is not zero again after a launch.
template <typename F, typename T, int NB>
int gv_dense(const std::vector<u8>& w, const long long off[3], const std::vector<T>& x, int N, int K, int rows,
             int splits, unsigned seed, std::vector<T>& y) {
    const u8 *p0 = w.data() + off[0], *p1 = w.data() + off[1], *p2 = w.data() + off[2];
    constexpr int ROWS = GV_WARPS * F::MT * 16;
    const int R = (N + ROWS - 1) / ROWS, gz = (rows + NB - 1) / NB, zin = gz > 1 ? gz : 0;
    std::vector<float> ws((size_t)gz * R * splits * ROWS * 8 + 8, NAN);
    std::vector<int> cnt((size_t)gz * R + 1, 0);
    const emu_dim3 grid{(unsigned)(R * (zin ? zin : 1)), (unsigned)splits, 1u};
    gv_launch(grid, GV_WARPS * 32, seed, [&] {
        gemv_mma<F, T, NB>(p0, p1, p2, x.data(), x.data(), y.data(), nullptr, nullptr, ws.data(), cnt.data(), N, K,
                           rows, K, K, N, 0, 0, 0, 8, zin, nullptr, 0, 0, 0.f, 0);
    });
    return gv_check(ws, cnt);
}

template <typename F, typename T> int gv_dense_case(char** argv) {
    const std::string dir = argv[2];
    const int N = atoi(argv[5]), K = atoi(argv[6]), splits = atoi(argv[7]), rows = atoi(argv[8]);
    const unsigned seed = (unsigned)atoi(argv[9]);
    long long off[3];
    const auto w = gv_read_weight(dir, "w", off);
    auto x = emu_read<T>(dir + "/x.bin", (size_t)rows * K);
    std::vector<T> lanes8((size_t)rows * N), lanes1((size_t)rows * N);
    for (auto* v : {&lanes8, &lanes1}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(T));
    int rc = gv_dense<F, T, 8>(w, off, x, N, K, rows, splits, seed, lanes8);
    if (!rc) rc = gv_dense<F, T, 1>(w, off, x, N, K, rows, splits, seed + 1, lanes1);
    if (rc) return rc;
    emu_write(dir + "/lanes8.bin", lanes8);
    emu_write(dir + "/lanes1.bin", lanes1);
    return 0;
}
template <typename F> int gv_dense_t(int tt, char** argv) {
    return tt ? gv_dense_case<F, bf16>(argv) : gv_dense_case<F, float>(argv);
}

// Fold mode (argv: fold dir fmt T N K splits rows seed N2 splits2 offset eps): norm folding. The producer
// res[rows, N] += x[rows, K] . W1^T (dir/x.bin, w.bin, woff.bin; dir/res.bin the residual before) with its partial
// sums of squares part[row blocks, rows]; then the consumer y[rows, N2] = rmsnorm(res, nw) . W2^T (dir/w2.bin,
// woff2.bin, nw.bin: [N] norm weight) from those partials; and the consumer again as the one-lane expert launch
// (experts == 1, expert 0 = W2) over the rows in reverse (slot s: row rows - 1 - s). Everything with 8-lane blocks
// and with one lane per block; writes dir/{res8,part8,y8,res1,part1,y1,ye}.bin.
template <typename F, typename F2, typename T, int NB>
int gv_fold_run(const std::vector<u8>& w1, const long long o1[3], const std::vector<u8>& w2, const long long o2[3],
                const std::vector<T>& x, const std::vector<float>& nw, std::vector<float>& res,
                std::vector<float>& part, std::vector<T>& y, int N, int K, int rows, int s1, int N2, int s2,
                int xf, float eps, unsigned seed) {
    // P partials: one per 4-warp row group (FR1 rows) whatever GV_WARPS (gemv_w8.cu: two per 8-warp block)
    constexpr int R1 = GV_WARPS * F::MT * 16, R2 = GV_WARPS * F2::MT * 16, FR1 = 4 * F::MT * 16;
    const int B1 = (N + R1 - 1) / R1, P = (N + FR1 - 1) / FR1, B2 = (N2 + R2 - 1) / R2;
    const int gz = (rows + NB - 1) / NB, zin = gz > 1 ? gz : 0;
    std::vector<float> ws((size_t)gz * (B1 * s1 * R1 + B2 * s2 * R2) * 8 + 8, NAN);
    std::vector<int> cnt((size_t)gz * (B1 + B2) + 1, 0);
    gv_launch({(unsigned)(B1 * (zin ? zin : 1)), (unsigned)s1, 1u}, GV_WARPS * 32, seed, [&] {
        gemv_mma<F, T, NB>(w1.data() + o1[0], w1.data() + o1[1], w1.data() + o1[2], x.data(), x.data(),
                           reinterpret_cast<T*>(res.data()), nullptr, nullptr, ws.data(), cnt.data(), N, K, rows,
                           K, K, N, 0, 0, 0, 8, zin, part.data(), rows, 0, 0.f, 1);
    });
    const T* r = reinterpret_cast<const T*>(res.data());
    const T* g = reinterpret_cast<const T*>(nw.data());
    gv_launch({(unsigned)(B2 * (zin ? zin : 1)), (unsigned)s2, 1u}, GV_WARPS * 32, seed + 3, [&] {
        gemv_mma<F2, T, NB>(w2.data() + o2[0], w2.data() + o2[1], w2.data() + o2[2], r, g, y.data(), nullptr,
                            nullptr, ws.data(), cnt.data(), N2, N, rows, N, 0, N2, 0, 0, xf, 8, zin, part.data(),
                            rows, P, eps, 0);
    });
    return gv_check(ws, cnt);
}

template <typename F, typename T> int gv_fold_case(char** argv) {
    using F2 = FragNVFP4;  // the consumer's format (dir/w2.bin is NVFP4 in the device layout)
    const std::string dir = argv[2];
    const int N = atoi(argv[5]), K = atoi(argv[6]), s1 = atoi(argv[7]), rows = atoi(argv[8]);
    const unsigned seed = (unsigned)atoi(argv[9]);
    const int N2 = atoi(argv[10]), s2 = atoi(argv[11]), xf = atoi(argv[12]) ? GV_NORM : GV_NORMW;
    const float eps = (float)atof(argv[13]);
    long long o1[3], o2[3];
    auto w1 = gv_read_weight(dir, "w", o1), w2 = gv_read_weight(dir, "w2", o2);
    auto x = emu_read<T>(dir + "/x.bin", (size_t)rows * K);
    auto res0 = emu_read<float>(dir + "/res.bin", (size_t)rows * N);
    auto nw = emu_read<float>(dir + "/nw.bin", (size_t)N);
    constexpr int FR1 = 4 * F::MT * 16;  // rows per partial: a 4-warp block's (gv_fold_ss)
    const int P = (N + FR1 - 1) / FR1;
    std::vector<float> res8(res0), res1(res0), part8((size_t)P * rows, NAN), part1((size_t)P * rows, NAN);
    std::vector<T> y8((size_t)rows * N2), y1((size_t)rows * N2), ye((size_t)rows * N2);
    for (auto* v : {&y8, &y1, &ye}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(T));
    int rc = gv_fold_run<F, F2, T, 8>(w1, o1, w2, o2, x, nw, res8, part8, y8, N, K, rows, s1, N2, s2, xf, eps, seed);
    if (!rc)
        rc = gv_fold_run<F, F2, T, 1>(w1, o1, w2, o2, x, nw, res1, part1, y1, N, K, rows, s1, N2, s2, xf, eps,
                                      seed + 1);
    if (rc) return rc;
    // the consumer as expert slots (experts == 1): slot s reads row rows - 1 - s of the residual and its partials
    std::vector<int> ids(rows, 0), xrow(rows);
    for (int s = 0; s < rows; ++s) xrow[s] = rows - 1 - s;
    constexpr int R2 = GV_WARPS * F2::MT * 16;
    const int B2 = (N2 + R2 - 1) / R2;
    std::vector<float> ws((size_t)rows * B2 * s2 * R2 * 8 + 8, NAN);
    std::vector<int> cnt((size_t)rows * B2 + 1, 0);
    gv_launch({(unsigned)B2, (unsigned)s2, (unsigned)rows}, GV_WARPS * 32, seed + 5, [&] {
        gemv_mma<F2, T, 1>(w2.data() + o2[0], w2.data() + o2[1], w2.data() + o2[2],
                           reinterpret_cast<const T*>(res8.data()), reinterpret_cast<const T*>(nw.data()), ye.data(),
                           ids.data(), xrow.data(), ws.data(), cnt.data(), N2, N, 0, N, 0, N2, 0, 1, xf, 8, 0,
                           part8.data(), rows, P, eps, 0);
    });
    if (int rc2 = gv_check(ws, cnt)) return rc2;
    emu_write(dir + "/res8.bin", res8);
    emu_write(dir + "/part8.bin", part8);
    emu_write(dir + "/y8.bin", y8);
    emu_write(dir + "/res1.bin", res1);
    emu_write(dir + "/part1.bin", part1);
    emu_write(dir + "/y1.bin", y1);
    emu_write(dir + "/ye.bin", ye);
    return 0;
}
template <typename F> int gv_fold_t(int tt, char** argv) {
    return tt ? gv_fold_case<F, bf16>(argv) : gv_fold_case<F, float>(argv);
}

// SwiGLU-out mode (argv: swiglu_out dir fmt T N K splits rows seed N2 splits2): the SwiGLU epilogue (gemv_mma_gu). W1
// (dir/w.bin, woff.bin) is a fused [gate | up] weight of N = 2 I rows. With 8-lane blocks and with one lane per
// block: hs[rows, I] = silu(gate) * up by the epilogue, then the down product W2 (dir/w2.bin, woff2.bin: [N2, I],
// NVFP4 in the device layout) of hs as plain input (yo); and the plain launch's [gate | up] rows gu[rows, N], then
// the down product staging their SwiGLU (xf = GV_SWIGLU: yp); and the epilogue as one-lane expert slots (hse, slot s
// = row rows - 1 - s). Writes dir/{hs8,hs1,gu,yo8,yo1,yp,hse}.bin.
template <typename F, typename T, int NB>
int gv_launch_dense(const std::vector<u8>& w, const long long o[3], const T* x, const T* x2, long long ldx, int xf,
                    T* y, long long ldy, int N, int K, int rows, int splits, bool gu, unsigned seed) {
    constexpr int R = GV_WARPS * F::MT * 16;
    const int B = (N + R - 1) / R, gz = (rows + NB - 1) / NB, zin = gz > 1 ? gz : 0;
    std::vector<float> ws((size_t)gz * B * splits * R * 8 + 8, NAN);
    std::vector<int> cnt((size_t)gz * B + 1, 0);
    gv_launch({(unsigned)(B * (zin ? zin : 1)), (unsigned)splits, 1u}, GV_WARPS * 32, seed, [&] {
        const u8 *p0 = w.data() + o[0], *p1 = w.data() + o[1], *p2 = w.data() + o[2];
        if (gu)
            gemv_mma_gu<F, T, NB>(p0, p1, p2, x, x2, y, nullptr, nullptr, ws.data(), cnt.data(), N, K, rows, ldx, ldx,
                                  ldy, 0, 0, xf, 8, zin, nullptr, 0, 0, 0.f, 0);
        else
            gemv_mma<F, T, NB>(p0, p1, p2, x, x2, y, nullptr, nullptr, ws.data(), cnt.data(), N, K, rows, ldx, ldx,
                               ldy, 0, 0, xf, 8, zin, nullptr, 0, 0, 0.f, 0);
    });
    return gv_check(ws, cnt);
}

template <typename F, typename T, int NB>
int gv_swiglu_out_run(const std::vector<u8>& w1, const long long o1[3], const std::vector<u8>& w2,
                      const long long o2[3], const std::vector<T>& x, std::vector<T>& hs, std::vector<T>& yo, int N,
                      int K, int rows, int s1, int N2, int s2, unsigned seed) {
    const int I = N / 2;
    int rc = gv_launch_dense<F, T, NB>(w1, o1, x.data(), x.data(), K, GV_PLAIN, hs.data(), I, N, K, rows, s1, true, seed);
    if (!rc)
        rc = gv_launch_dense<FragNVFP4, T, NB>(w2, o2, hs.data(), hs.data(), I, GV_PLAIN, yo.data(), N2, N2, I, rows,
                                               s2, false, seed + 1);
    return rc;
}

template <typename F, typename T> int gv_swiglu_out_case(char** argv) {
    const std::string dir = argv[2];
    const int N = atoi(argv[5]), K = atoi(argv[6]), s1 = atoi(argv[7]), rows = atoi(argv[8]);
    const unsigned seed = (unsigned)atoi(argv[9]);
    const int N2 = atoi(argv[10]), s2 = atoi(argv[11]), I = N / 2;
    long long o1[3], o2[3];
    auto w1 = gv_read_weight(dir, "w", o1), w2 = gv_read_weight(dir, "w2", o2);
    auto x = emu_read<T>(dir + "/x.bin", (size_t)rows * K);
    std::vector<T> hs8((size_t)rows * I), hs1(hs8), gu((size_t)rows * N), yo8((size_t)rows * N2), yo1(yo8), yp(yo8);
    for (auto* v : {&hs8, &hs1, &gu, &yo8, &yo1, &yp}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(T));
    int rc = gv_swiglu_out_run<F, T, 8>(w1, o1, w2, o2, x, hs8, yo8, N, K, rows, s1, N2, s2, seed);
    if (!rc) rc = gv_swiglu_out_run<F, T, 1>(w1, o1, w2, o2, x, hs1, yo1, N, K, rows, s1, N2, s2, seed + 2);
    if (!rc) rc = gv_launch_dense<F, T, 8>(w1, o1, x.data(), x.data(), K, GV_PLAIN, gu.data(), N, N, K, rows, s1, false, seed + 4);
    if (!rc)
        rc = gv_launch_dense<FragNVFP4, T, 8>(w2, o2, gu.data(), gu.data() + I, N, GV_SWIGLU, yp.data(), N2, N2, I,
                                              rows, s2, false, seed + 5);
    if (rc) return rc;
    // the epilogue in an expert launch (experts == 1): slot s reads row rows - 1 - s, expert 0 = W1 (dir/hse.bin)
    std::vector<T> hse((size_t)rows * I);
    std::memset((void*)hse.data(), 0xff, hse.size() * sizeof(T));
    {
        constexpr int R = GV_WARPS * F::MT * 16;
        const int B = N / R;
        std::vector<int> ids(rows, 0), xrow(rows);
        for (int r = 0; r < rows; ++r) xrow[r] = rows - 1 - r;
        std::vector<float> ws((size_t)rows * B * s1 * R * 8 + 8, NAN);
        std::vector<int> cnt((size_t)rows * B + 1, 0);
        gv_launch({(unsigned)B, (unsigned)s1, (unsigned)rows}, GV_WARPS * 32, seed + 6, [&] {
            gemv_mma_gu<F, T, 1>(w1.data() + o1[0], w1.data() + o1[1], w1.data() + o1[2], x.data(), x.data(),
                                 hse.data(), ids.data(), xrow.data(), ws.data(), cnt.data(), N, K, 0, K, K, I, 0, 1,
                                 GV_PLAIN, 8, 0, nullptr, 0, 0, 0.f, 0);
        });
        if (int rc2 = gv_check(ws, cnt)) return rc2;
    }
    emu_write(dir + "/hse.bin", hse);
    emu_write(dir + "/hs8.bin", hs8);
    emu_write(dir + "/hs1.bin", hs1);
    emu_write(dir + "/gu.bin", gu);
    emu_write(dir + "/yo8.bin", yo8);
    emu_write(dir + "/yo1.bin", yo1);
    emu_write(dir + "/yp.bin", yp);
    return 0;
}

// Route-tail mode (argv: rtail dir fmt N K splits rows seed E topk shared): the router product with the routing in
// its tail (gemv_mma_rr) against the plain product followed by router.cu's moe_route, with 8-lane blocks and with one
// lane per block. dir/w.bin + woff.bin: W [N, K] (the router's rows; columns 0 .. E - 1 of the output are routed);
// dir/x.bin [rows, K] float. Writes dir/{y_ref,ids_ref,w_ref}.bin and dir/{y_rr8,ids_rr8,w_rr8,y_rr1,ids_rr1,
// w_rr1}.bin. Exits 7 if a split or routing counter is not zero again after a launch.
template <typename F, int NB>
int gv_rtail_run(const std::vector<u8>& w, const long long o[3], const std::vector<float>& x, int N, int K, int rows,
                 int splits, int E, int top, int shared, unsigned seed, std::vector<float>& y, std::vector<int>& ids,
                 std::vector<float>& wt, bool tail) {
    constexpr int R = GV_WARPS * F::MT * 16;
    const int B = (N + R - 1) / R, gz = (rows + NB - 1) / NB, zin = gz > 1 ? gz : 0;
    std::vector<float> ws((size_t)gz * B * splits * R * 8 + 8, NAN);
    std::vector<int> cnt((size_t)gz * B + 1, 0), rcnt((size_t)gz + 1, 0);
    const u8 *p0 = w.data() + o[0], *p1 = w.data() + o[1], *p2 = w.data() + o[2];
    gv_launch({(unsigned)(B * (zin ? zin : 1)), (unsigned)splits, 1u}, GV_WARPS * 32, seed, [&] {
        if (tail)
            gemv_mma_rr<F, float, NB>(p0, p1, p2, x.data(), x.data(), y.data(), nullptr, nullptr, ws.data(), cnt.data(),
                                      N, K, rows, K, K, N, 0, 0, GV_PLAIN, 8, zin, nullptr, 0, 0, 0.f, 0, rcnt.data(),
                                      E, top, rows, shared ? E : -1, ids.data(), wt.data());
        else
            gemv_mma<F, float, NB>(p0, p1, p2, x.data(), x.data(), y.data(), nullptr, nullptr, ws.data(), cnt.data(),
                                   N, K, rows, K, K, N, 0, 0, GV_PLAIN, 8, zin, nullptr, 0, 0, 0.f, 0);
    });
    for (int c : rcnt)
        if (c != 0) return 7;
    return gv_check(ws, cnt);
}

template <typename F> int gv_rtail_case(char** argv) {
    const std::string dir = argv[2];
    const int N = atoi(argv[4]), K = atoi(argv[5]), splits = atoi(argv[6]), rows = atoi(argv[7]);
    const unsigned seed = (unsigned)atoi(argv[8]);
    const int E = atoi(argv[9]), top = atoi(argv[10]), shared = atoi(argv[11]);
    long long o[3];
    const auto w = gv_read_weight(dir, "w", o);
    auto x = emu_read<float>(dir + "/x.bin", (size_t)rows * K);
    const size_t ni = (size_t)rows * top + (shared ? rows : 0), nw = (size_t)rows * top;
    std::vector<float> y_ref((size_t)rows * N), y8(y_ref), y1(y_ref), w_ref(nw, NAN), w8(nw, NAN), w1(nw, NAN);
    std::vector<int> ids_ref(ni, -7), ids8(ni, -7), ids1(ni, -7);
    for (auto* v : {&y_ref, &y8, &y1}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(float));
    int rc = gv_rtail_run<F, 8>(w, o, x, N, K, rows, splits, E, top, shared, seed, y_ref, ids_ref, w_ref, false);
    if (rc) return rc;
    emu_launch_poisoned({(unsigned)((rows + 3) / 4), 1, 1}, 128, seed, [] {}, [&] {
        moe_route<float, 8>(y_ref.data(), ids_ref.data(), w_ref.data(), rows, E, top, N, shared ? E : -1);
    });
    rc = gv_rtail_run<F, 8>(w, o, x, N, K, rows, splits, E, top, shared, seed + 1, y8, ids8, w8, true);
    if (!rc) rc = gv_rtail_run<F, 1>(w, o, x, N, K, rows, splits, E, top, shared, seed + 2, y1, ids1, w1, true);
    if (rc) return rc;
    emu_write(dir + "/y_ref.bin", y_ref);
    emu_write(dir + "/ids_ref.bin", ids_ref);
    emu_write(dir + "/w_ref.bin", w_ref);
    emu_write(dir + "/y_rr8.bin", y8);
    emu_write(dir + "/ids_rr8.bin", ids8);
    emu_write(dir + "/w_rr8.bin", w8);
    emu_write(dir + "/y_rr1.bin", y1);
    emu_write(dir + "/ids_rr1.bin", ids1);
    emu_write(dir + "/w_rr1.bin", w1);
    return 0;
}

// Routed mode (argv: routed dir fmt N K splits T E topk shared seed): the routed expert launch (gemv_mma_rt) against
// router.cu's moe_route followed by the one-lane expert launch. dir/w.bin + woff.bin: the fused expert weight
// [(E + shared) * N, K]; dir/x.bin [T, K] float activations; dir/lg.bin [T, E + 1] float router rows (the last
// column stands for the shared expert's gate, never routed). Slot s < T * topk is choice s % topk of token
// s / topk, then (shared) one slot per token for expert E. Writes dir/{ids_ref,w_ref,y_ref,ids_rt,w_rt,y_rt}.bin.
template <typename F> int gv_routed_case(char** argv) {
    const std::string dir = argv[2];
    const int N = atoi(argv[4]), K = atoi(argv[5]), splits = atoi(argv[6]), T = atoi(argv[7]), E = atoi(argv[8]);
    const int top = atoi(argv[9]), shared = atoi(argv[10]);
    const unsigned seed = (unsigned)atoi(argv[11]);
    const int S = T * top + (shared ? T : 0), ldl = E + 1;
    long long o[3];
    const auto w = gv_read_weight(dir, "w", o);
    const u8 *p0 = w.data() + o[0], *p1 = w.data() + o[1], *p2 = w.data() + o[2];
    auto x = emu_read<float>(dir + "/x.bin", (size_t)T * K);
    auto lg = emu_read<float>(dir + "/lg.bin", (size_t)T * ldl);
    std::vector<int> xrow(S), ids_ref(S, -7), ids_rt(S, -7);
    for (int s = 0; s < S; ++s) xrow[s] = s < T * top ? s / top : s - T * top;
    std::vector<float> w_ref((size_t)T * top, NAN), w_rt((size_t)T * top, NAN);
    emu_launch_poisoned({(unsigned)((T + 3) / 4), 1, 1}, 128, seed, [] {}, [&] {
        moe_route<float, 8>(lg.data(), ids_ref.data(), w_ref.data(), T, E, top, ldl, shared ? E : -1);
    });
    constexpr int ROWS = GV_WARPS * F::MT * 16;
    const int bx = (N + ROWS - 1) / ROWS;
    std::vector<float> ws((size_t)S * bx * splits * ROWS * 8 + 8, NAN), y_ref((size_t)S * N), y_rt((size_t)S * N);
    std::vector<int> cnt((size_t)S * bx + 1, 0);
    for (auto* v : {&y_ref, &y_rt}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(float));
    gv_launch({(unsigned)bx, (unsigned)splits, (unsigned)S}, GV_WARPS * 32, seed + 1, [&] {
        gemv_mma<F, float, 1>(p0, p1, p2, x.data(), x.data(), y_ref.data(), ids_ref.data(), xrow.data(), ws.data(),
                              cnt.data(), N, K, 0, K, K, N, 0, 1, 0, 8, 0, nullptr, 0, 0, 0.f, 0);
    });
    if (int rc = gv_check(ws, cnt)) return rc;
    gv_launch({(unsigned)bx, (unsigned)splits, (unsigned)S}, GV_WARPS * 32, seed + 2, [&] {
        gemv_mma_rt<F, float, 1>(p0, p1, p2, x.data(), x.data(), y_rt.data(), nullptr, xrow.data(), ws.data(),
                                 cnt.data(), N, K, 0, K, K, N, 0, 1, 0, 8, 0, nullptr, 0, 0, 0.f, 0, nullptr,
                                 nullptr, 0, 0, lg.data(), ldl, E, top, T * top, shared ? E : -1, ids_rt.data(),
                                 w_rt.data());
    });
    if (int rc = gv_check(ws, cnt)) return rc;
    emu_write(dir + "/ids_ref.bin", ids_ref);
    emu_write(dir + "/w_ref.bin", w_ref);
    emu_write(dir + "/y_ref.bin", y_ref);
    emu_write(dir + "/ids_rt.bin", ids_rt);
    emu_write(dir + "/w_rt.bin", w_rt);
    emu_write(dir + "/y_rt.bin", y_rt);
    return 0;
}

// Combine mode (argv: combine dir fmt H I T k shared offset eps seed): the down projection with the MoE combine and
// the next norm in its tail (gemv_mma_cb) against the down launch followed by norm.cu's moe_combine_rmsnorm. dir/
// w.bin + woff.bin: the fused down weight [E * H, I]; gu.bin [S, 2I] float (S = T * k, + T shared slots); ids.bin
// [S]; ew.bin [T, k]; sg.bin [T]; r.bin [T, H] residual; nw.bin [H]; sh.bin [T, H] (the shared expert's rows when
// they are not slots). Slot s < T * k is choice s % k of token s / k. Writes dir/{dn1,r1,y1,dn2,r2,y2}.bin.
template <typename F> int gv_combine_case(char** argv) {
    const std::string dir = argv[2];
    const int H = atoi(argv[4]), I = atoi(argv[5]), T = atoi(argv[6]), k = atoi(argv[7]), shared = atoi(argv[8]);
    const int offset = atoi(argv[9]);
    const float eps = (float)atof(argv[10]);
    const unsigned seed = (unsigned)atoi(argv[11]);
    const int n = T * k, S = n + (shared ? T : 0);
    long long o[3];
    const auto w = gv_read_weight(dir, "w", o);
    const u8 *p0 = w.data() + o[0], *p1 = w.data() + o[1], *p2 = w.data() + o[2];
    auto gu = emu_read<float>(dir + "/gu.bin", (size_t)S * 2 * I);
    auto ids = emu_read<int>(dir + "/ids.bin", S);
    auto ew = emu_read<float>(dir + "/ew.bin", (size_t)n);
    auto sg = emu_read<float>(dir + "/sg.bin", T);
    auto r1 = emu_read<float>(dir + "/r.bin", (size_t)T * H), r2 = r1;
    auto nw = emu_read<float>(dir + "/nw.bin", H);
    auto shx = emu_read<float>(dir + "/sh.bin", (size_t)T * H);
    std::vector<int> slot(S), where(n), cnt_tok(T, 0);
    for (int s = 0; s < S; ++s) slot[s] = s;
    for (int s = 0; s < n; ++s) where[s] = s;
    constexpr int ROWS = GV_WARPS * F::MT * 16;
    const int bx = (H + ROWS - 1) / ROWS;
    std::vector<float> ws(8, NAN), dn1((size_t)S * H), dn2((size_t)S * H), y1((size_t)T * H), y2((size_t)T * H);
    std::vector<int> cnt((size_t)S * bx + 1, 0);
    for (auto* v : {&dn1, &dn2, &y1, &y2}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(float));
    const float* gup = gu.data() + I;  // SwiGLU: the up half at x2
    gv_launch({(unsigned)bx, 1u, (unsigned)S}, GV_WARPS * 32, seed, [&] {
        gemv_mma<F, float, 1>(p0, p1, p2, gu.data(), gup, dn1.data(), ids.data(), slot.data(), ws.data(), cnt.data(),
                              H, I, 0, 2 * I, 2 * I, H, 0, 1, 1, 8, 0, nullptr, 0, 0, 0.f, 0);
    });
    const float* sh1 = shared ? dn1.data() + (size_t)n * H : shx.data();
    emu_launch_poisoned({(unsigned)T, 1, 1}, 256, seed + 1, [] {}, [&] {
        if (offset)
            moe_combine_rmsnorm<float, true, true>(dn1.data(), where.data(), ew.data(), sh1, sg.data(), k, H, 1,
                                                   r1.data(), nw.data(), y1.data(), H, eps, H, H);
        else
            moe_combine_rmsnorm<float, false, true>(dn1.data(), where.data(), ew.data(), sh1, sg.data(), k, H, 1,
                                                    r1.data(), nw.data(), y1.data(), H, eps, H, H);
    });
    const float* sh2 = shared ? dn2.data() + (size_t)n * H : shx.data();
    gv_launch({(unsigned)bx, 1u, (unsigned)S}, GV_WARPS * 32, seed + 2, [&] {
        gemv_mma_cb<F, float, 1>(p0, p1, p2, gu.data(), gup, dn2.data(), ids.data(), slot.data(), ws.data(),
                                 cnt.data(), H, I, 0, 2 * I, 2 * I, H, 0, 1, 1, 8, 0, nullptr, 0, 0, 0.f, 0,
                                 cnt_tok.data(), bx * (S / T), k, n, where.data(), ew.data(), sh2, H, sg.data(), 1,
                                 r2.data(), H, nw.data(), y2.data(), H, eps, offset);
    });
    for (int c : cnt_tok)
        if (c != 0) return 7;
    emu_write(dir + "/dn1.bin", dn1);
    emu_write(dir + "/r1.bin", r1);
    emu_write(dir + "/y1.bin", y1);
    emu_write(dir + "/dn2.bin", dn2);
    emu_write(dir + "/r2.bin", r2);
    emu_write(dir + "/y2.bin", y2);
    return 0;
}

// fn(F{}) for the driver's format code (0 BF16, 1 NVFP4, 2 FP8 row); 5 for another code
template <typename Fn> int gv_by_fmt(int fmt, Fn fn) {
    switch (fmt) {
        case 0: return fn(FragBF16{});
        case 1: return fn(FragNVFP4{});
        case 2: return fn(FragFP8<true>{});
    }
    return 5;
}

int main(int argc, char** argv) {
    if (argc == 12 && std::string(argv[1]) == "combine")
        return gv_by_fmt(atoi(argv[3]), [&](auto f) { return gv_combine_case<decltype(f)>(argv); });
    if (argc == 12 && std::string(argv[1]) == "rtail")
        return gv_by_fmt(atoi(argv[3]), [&](auto f) { return gv_rtail_case<decltype(f)>(argv); });
    if (argc == 12 && std::string(argv[1]) == "routed")
        return gv_by_fmt(atoi(argv[3]), [&](auto f) { return gv_routed_case<decltype(f)>(argv); });
    if (argc == 14 && std::string(argv[1]) == "fold") {
        const int fmt = atoi(argv[3]), tt = atoi(argv[4]);
        switch (fmt) {
            case 0: return gv_fold_t<FragBF16>(tt, argv);
            case 1: return gv_fold_t<FragNVFP4>(tt, argv);
            case 2: return gv_fold_t<FragFP8<true>>(tt, argv);
        }
        return 5;
    }
    if (argc == 12 && std::string(argv[1]) == "swiglu_out") {
        const int fmt = atoi(argv[3]), tt = atoi(argv[4]);
        switch (fmt) {
            case 0: return tt ? gv_swiglu_out_case<FragBF16, bf16>(argv) : gv_swiglu_out_case<FragBF16, float>(argv);
            case 1: return tt ? gv_swiglu_out_case<FragNVFP4, bf16>(argv) : gv_swiglu_out_case<FragNVFP4, float>(argv);
            case 2:
                return tt ? gv_swiglu_out_case<FragFP8<true>, bf16>(argv) : gv_swiglu_out_case<FragFP8<true>, float>(argv);
        }
        return 5;
    }
    if (argc == 10 && std::string(argv[1]) == "dense") {
        const int fmt = atoi(argv[3]), tt = atoi(argv[4]);
        switch (fmt) {
            case 0: return gv_dense_t<FragBF16>(tt, argv);
            case 1: return gv_dense_t<FragNVFP4>(tt, argv);
            case 2: return gv_dense_t<FragFP8<true>>(tt, argv);
            case 3: return gv_dense_t<FragQG64<4>>(tt, argv);  // one group format (linear.GV_W8_ONE)
        }
        return 5;
    }
    if (argc != 14) return 2;
    GvArgs a;
    a.dir = argv[1];
    const int fmt = atoi(argv[2]), tt = atoi(argv[3]);
    a.NB = atoi(argv[4]), a.N = atoi(argv[5]), a.K = atoi(argv[6]), a.splits = atoi(argv[7]), a.S = atoi(argv[8]);
    a.E = atoi(argv[9]), a.xf = atoi(argv[10]), a.tab = atoi(argv[11]), a.seed = (unsigned)atoi(argv[12]);
    const bool table_only = atoi(argv[13]) != 0;
    auto zx = emu_read<long long>(a.dir + "/dims.bin", 3);  // Z, activation rows, ldx
    a.Z = (int)zx[0], a.xrows = (int)zx[1], a.ldx = zx[2];
    switch (fmt) {
        case 0: return gv_t<FragBF16>(tt, a, table_only);
        case 1: return gv_t<FragNVFP4>(tt, a, table_only);
        case 2: return gv_t<FragFP8<true>>(tt, a, table_only);
        case 3: return gv_t<FragQG64<4>>(tt, a, table_only);  // the group formats: the lanes launch only
        case 4: return gv_t<FragQG64<5>>(tt, a, table_only);
    }
    return 5;
}
