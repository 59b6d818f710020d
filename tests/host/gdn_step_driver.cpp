// Driver of the gdn_step host emulation (tests/test_gdn_step_host.py), appended after gdn_emu.cpp and
// cuda_src/gdn_step.cu. argv = dir T HK HV DK DV nseq nslots act_bf16 state_bf16 mode eps
//   mode 0 (fused):   gdn_step<CONV = true> + gdn_step_post, as gdn_decode launches them
//   mode 1 (unfused): causal conv (conv_token per channel, causal_conv's loop), gdn_step<CONV = false>, then the
//                     gated norm per row (gated_norm_row, gated_rmsnorm's row function)
//   mode 2 (decode):  mode 0 one token per sequence per call (step i runs the i-th token of every sequence that
//                     has one), the way decode calls see the tokens
//   mode 3 (snapshots): mode 0 with snapshots into the slots of dir/snap.bin (one int32 per sequence)
//   mode 10 + m (m = 0, 2, 3): mode m with gdn_decode's single launch (the epilogue in gdn_step, counters that
//                     must be zero again afterwards) instead of gdn_step + gdn_step_post
//   mode 20 + m (m = 0, 2, 3): mode m with gdn_decode's cluster kernel (gdn_step_cl, its clusters run with
//                     emu_launch_cluster; the q/k counters must be zero again afterwards)
//   mode 30 + m, 40 + m: mode m with the persistent cluster kernel (gdn_step_clp) on 3 clusters or 1, each taking
//                     the (sequence, value head) items in turn
// Reads dir/{qkv,convw,conv,a,b,alog,dtb,state,starts,slots,z,normw}.bin, writes dir/{y,state_out,conv_out}.bin.
// EMU_NO_CL (defined by the test before this file): the kernel text has no gdn_step_cl (an older gdn_step.cu).
struct StepShape {
    int HK, HV, DV;
    long long C, W;  // conv channels = qkv row width, value width HV*DV
    float eps;
};

int emu_variant = 0;  // 0: gdn_step + gdn_step_post, 1: one gdn_step launch (modes 10+), 2: gdn_step_cl (20+),
                      // 3, 4: gdn_step_clp on 3 clusters (30+) or 1 (40+)

// gdn_decode's launches over packed rows (row stride = width, as contiguous cupy arrays): one (the epilogue in
// gdn_step) with emu_one_launch, else gdn_step and gdn_step_post.
template <typename T, typename S, int DK>
void emu_fused(const StepShape& sh, int rows, const std::vector<int>& starts, const std::vector<int>& slots,
               const T* qkv, const float* convw, float* conv, const T* a, const T* b, const float* alog,
               const float* dtb, S* state, const T* z, const float* normw, T* y, const int* snap = nullptr) {
    using G = GdnStep<DK>;
    const int nseq = (int)slots.size(), qkc = 2 * sh.HK * DK, nsnap = snap != nullptr;
    if (!snap) snap = slots.data();
    const emu_dim3 grid{(unsigned)nseq, (unsigned)sh.HV, (unsigned)((sh.DV + G::CT - 1) / G::CT)};
#ifndef EMU_NO_CL
    if (emu_variant >= 3) {  // gdn_step_clp: 3 persistent clusters (30+) or 1 (40+) taking the items in turn
        std::vector<int> cnt((size_t)nseq * (sh.HV + sh.HK), 0);
        const unsigned gx = (unsigned)std::min(nseq * sh.HV, emu_variant == 3 ? 3 : 1);
        if (gx)
            emu_launch_cluster({gx, 1, (unsigned)GDN_CL}, GDN_CL, G::NT, GdnStepClp<DK>::FLOATS * 4, [&] {
                gdn_step_clp<T, S, DK>(qkv, convw, conv, a, b, alog, dtb, state, y, starts.data(), slots.data(),
                                       sh.HK, sh.HV, sh.DV, sh.C, sh.HV, sh.HV, sh.W, snap, nsnap, cnt.data(), z,
                                       normw, y, sh.W, sh.W, sh.eps, nseq);
            });
        for (int c : cnt)
            if (c) std::abort();  // the last readers reset every q/k counter
        return;
    }
    if (emu_variant == 2) {
        std::vector<int> cnt((size_t)nseq * (sh.HV + sh.HK), 0);
        emu_launch_cluster({grid.x, grid.y, (unsigned)GDN_CL}, GDN_CL, G::NT, GdnStepCl<DK>::FLOATS * 4, [&] {
            gdn_step_cl<T, S, DK>(qkv, convw, conv, a, b, alog, dtb, state, y, starts.data(), slots.data(), sh.HK,
                                  sh.HV, sh.DV, sh.C, sh.HV, sh.HV, sh.W, snap, nsnap, cnt.data(), z, normw, y, sh.W,
                                  sh.W, sh.eps);
        });
        for (int c : cnt)
            if (c) std::abort();  // the last readers reset every q/k counter (the o counters are never used)
        return;
    }
#endif
    if (emu_variant == 1) {
        std::vector<int> cnt((size_t)nseq * (sh.HV + sh.HK), 0);
        emu_launch(grid, G::NT, G::FLOATS * 4, [&] {
            gdn_step<T, S, DK, true>(qkv, convw, conv, a, b, alog, dtb, state, y, starts.data(), slots.data(), sh.HK,
                                     sh.HV, sh.DV, sh.C, sh.HV, sh.HV, sh.W, snap, nsnap, cnt.data(), z, normw, y,
                                     sh.W, sh.W, sh.eps);
        });
        for (int c : cnt)
            if (c) std::abort();  // the last arrivals reset every counter
        return;
    }
    emu_launch(grid, G::NT, G::FLOATS * 4, [&] {
        gdn_step<T, S, DK, true>(qkv, convw, conv, a, b, alog, dtb, state, y, starts.data(), slots.data(), sh.HK,
                                 sh.HV, sh.DV, sh.C, sh.HV, sh.HV, sh.W, snap, nsnap, nullptr, nullptr, nullptr,
                                 nullptr, 0, 0, 0.f);
    });
    const unsigned gx = (unsigned)std::max((rows * sh.HV + 3) / 4, (qkc + 127) / 128);
    emu_launch({gx, (unsigned)(1 + nseq), 1}, 128, 0, [&] {
        gdn_step_post<T>(y, z, normw, y, qkv, conv, starts.data(), slots.data(), rows, sh.HV, sh.DV, qkc, (int)sh.C,
                         sh.eps, sh.W, sh.W, sh.W, sh.C, snap, nsnap);
    });
}

template <typename T, typename S, int DK>
void emu_unfused(const StepShape& sh, int rows, const std::vector<int>& starts, const std::vector<int>& slots,
                 const T* qkv, const float* convw, float* conv, const T* a, const T* b, const float* alog,
                 const float* dtb, S* state, const T* z, const float* normw, T* y) {
    using G = GdnStep<DK>;
    const int nseq = (int)slots.size();
    std::vector<T> yc((size_t)rows * sh.C);
    for (int s = 0; s < nseq; ++s)  // causal_conv's per-channel loop
        for (long long c = 0; c < sh.C; ++c) {
            float* st = conv + ((long long)slots[s] * sh.C + c) * 3;
            float win[3] = {st[0], st[1], st[2]}, wc[4] = {convw[c * 4], convw[c * 4 + 1], convw[c * 4 + 2],
                                                           convw[c * 4 + 3]};
            for (int t = starts[s]; t < starts[s + 1]; ++t)
                yc[t * sh.C + c] = from_f<T>(conv_token<4>(win, wc, to_f(qkv[t * sh.C + c])));
            for (int e = 0; e < 3; ++e) st[e] = win[e];
        }
    emu_launch({(unsigned)nseq, (unsigned)sh.HV, (unsigned)((sh.DV + G::CT - 1) / G::CT)}, G::NT,
               G::FLOATS * 4, [&] {
                   gdn_step<T, S, DK, false>(yc.data(), alog, (float*)alog, a, b, alog, dtb, state, y, starts.data(),
                                             slots.data(), sh.HK, sh.HV, sh.DV, sh.C, sh.HV, sh.HV, sh.W,
                                             slots.data(), 0, nullptr, nullptr, nullptr, nullptr, 0, 0, 0.f);
               });
    const int nrows = rows * sh.HV;
    emu_launch({(unsigned)((nrows + 7) / 8), 1, 1}, 256, 0, [&] {  // gated_rmsnorm's launch
        const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
        if (row < nrows)
            gated_norm_row(y + (long long)row * sh.DV, z + (long long)row * sh.DV, normw, y + (long long)row * sh.DV,
                           sh.DV, sh.eps, threadIdx.x & 31);
    });
}

template <typename T, typename S, int DK>
void emu_run(const std::string& dir, int T_, const StepShape& sh, int nseq, int nslots, int mode) {
    auto qkv = emu_read<T>(dir + "/qkv.bin", T_ * sh.C);
    auto convw = emu_read<float>(dir + "/convw.bin", sh.C * 4);
    auto conv = emu_read<float>(dir + "/conv.bin", (size_t)nslots * sh.C * 3);
    auto a = emu_read<T>(dir + "/a.bin", (size_t)T_ * sh.HV), b = emu_read<T>(dir + "/b.bin", (size_t)T_ * sh.HV);
    auto alog = emu_read<float>(dir + "/alog.bin", sh.HV), dtb = emu_read<float>(dir + "/dtb.bin", sh.HV);
    auto state = emu_read<S>(dir + "/state.bin", (size_t)nslots * sh.HV * DK * sh.DV);
    auto starts = emu_read<int>(dir + "/starts.bin", nseq + 1), slots = emu_read<int>(dir + "/slots.bin", nseq);
    auto z = emu_read<T>(dir + "/z.bin", T_ * sh.W);
    auto normw = emu_read<float>(dir + "/normw.bin", sh.DV);
    std::vector<T> y((size_t)T_ * sh.W);
    std::memset((void*)y.data(), 0xff, y.size() * sizeof(T));  // NaN poison (both float and bf16 words)
    if (mode == 0 || mode == 3) {
        std::vector<int> snap = mode == 3 ? emu_read<int>(dir + "/snap.bin", nseq) : std::vector<int>();
        emu_fused<T, S, DK>(sh, T_, starts, slots, qkv.data(), convw.data(), conv.data(), a.data(), b.data(),
                            alog.data(), dtb.data(), state.data(), z.data(), normw.data(), y.data(),
                            mode == 3 ? snap.data() : nullptr);
    }
    else if (mode == 1)
        emu_unfused<T, S, DK>(sh, T_, starts, slots, qkv.data(), convw.data(), conv.data(), a.data(), b.data(),
                              alog.data(), dtb.data(), state.data(), z.data(), normw.data(), y.data());
    else
        for (int i = 0;; ++i) {  // decode calls: the i-th token of every sequence that has one, in sequence order
            std::vector<int> rows_, dstarts{0}, dslots;
            for (int s = 0; s < nseq; ++s)
                if (starts[s] + i < starts[s + 1]) {
                    rows_.push_back(starts[s] + i);
                    dslots.push_back(slots[s]);
                    dstarts.push_back((int)rows_.size());
                }
            if (rows_.empty()) break;
            const int n = (int)rows_.size();
            std::vector<T> q2(n * sh.C), a2(n * sh.HV), b2(n * sh.HV), z2(n * sh.W), y2(n * sh.W);
            for (int r = 0; r < n; ++r) {
                std::copy_n(&qkv[rows_[r] * sh.C], sh.C, &q2[r * sh.C]);
                std::copy_n(&a[rows_[r] * sh.HV], sh.HV, &a2[r * sh.HV]);
                std::copy_n(&b[rows_[r] * sh.HV], sh.HV, &b2[r * sh.HV]);
                std::copy_n(&z[rows_[r] * sh.W], sh.W, &z2[r * sh.W]);
            }
            emu_fused<T, S, DK>(sh, n, dstarts, dslots, q2.data(), convw.data(), conv.data(), a2.data(), b2.data(),
                                alog.data(), dtb.data(), state.data(), z2.data(), normw.data(), y2.data());
            for (int r = 0; r < n; ++r) std::copy_n(&y2[r * sh.W], sh.W, &y[rows_[r] * sh.W]);
        }
    emu_write(dir + "/y.bin", y);
    emu_write(dir + "/state_out.bin", state);
    emu_write(dir + "/conv_out.bin", conv);
}

template <typename T, typename S> void emu_dispatch(char** v) {
    const int T_ = atoi(v[2]), HK = atoi(v[3]), HV = atoi(v[4]), DK = atoi(v[5]), DV = atoi(v[6]);
    const int nseq = atoi(v[7]), nslots = atoi(v[8]), mode = atoi(v[11]) % 10;
    emu_variant = atoi(v[11]) / 10;
    const StepShape sh{HK, HV, DV, 2LL * HK * DK + (long long)HV * DV, (long long)HV * DV, (float)atof(v[12])};
#define EMU_CASE(dk) \
    if (DK == dk) return emu_run<T, S, dk>(v[1], T_, sh, nseq, nslots, mode);
    EMU_CASE(16) EMU_CASE(32) EMU_CASE(64) EMU_CASE(128)
    std::abort();
}

int main(int argc, char** argv) {
    if (argc != 13) return 2;
    if (atoi(argv[9])) {
        if (atoi(argv[10])) emu_dispatch<bf16, bf16>(argv); else emu_dispatch<bf16, float>(argv);
    } else {
        if (atoi(argv[10])) emu_dispatch<float, bf16>(argv); else emu_dispatch<float, float>(argv);
    }
    return 0;
}
