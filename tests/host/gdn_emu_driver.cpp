// Driver of the two-pass gdn_chunked host emulation (cuda_src/gdn_chunk.cu): argv = dir T HK HV DK DV nseq nslots
// act_bf16 state_bf16 prep_smem state16_smem state32_smem mma16_smem mma32_smem tc_prep_smem staged16_smem
// staged32_smem wsp16_smem wsp32_smem wspq32_smem. Reads
// dir/{qkv,a,b,alog,dtb,state,starts,slots}.bin, runs gdn_chunk_prep over a NaN-filled scratch (as
// ninfer/cuda/gdn_chunk.py lays it out) once per variant, then from the same initial state: gdn_chunk_state with 16
// value columns per block (writes dir/o.bin, dir/state_out.bin) and with 32 (dir/o32.bin, dir/state32.bin) from
// gdn_chunk_prep<., ., false>'s scratch (variant "fp32"), and gdn_chunk_state_mma with 16 (dir/o_mma16.bin,
// dir/state_mma16.bin) and 32 (dir/o_mma32.bin, dir/state_mma32.bin) from gdn_chunk_prep<., ., true>'s ("mma"),
// and gdn_chunk_state_mma with 16 (dir/o_tc16.bin, dir/state_tc16.bin) from gdn_chunk_prep_tc's ("tc"), whose
// scratch is also written (dir/{qk,w,a,u,g}_tc.bin) beside the "mma" prep's (dir/{qk,w,a,u,g}_mma.bin); then
// the "split" state pass on a copy of the tc scratch: gdn_chunk_state_h and gdn_chunk_out with 32 columns
// (dir/o_split.bin, dir/state_split.bin); and the 8-warp gdn_chunk_state_mma<., ., DK, ., 8> ("tc8") on the tc
// scratch with 16 and 32 columns (dir/o_tc8_16.bin, dir/state_tc8_16.bin, dir/o_tc8_32.bin, dir/state_tc8_32.bin)
// and on the mma scratch with 32 (dir/o_mma8_32.bin, dir/state_mma8_32.bin); and the staged
// gdn_chunk_state_mma<., ., DK, ., 4, true> ("tcs") on the tc scratch with 16 and 32 columns (dir/o_tcs16.bin,
// dir/state_tcs16.bin, dir/o_tcs32.bin, dir/state_tcs32.bin); and the warp-specialized gdn_chunk_state_wsp ("wsp")
// on the tc scratch with 16 and 32 columns, with its Q rows staged ("wspq") with 32 and with two chains per
// product ("wsp2") with 16 and 32 (dir/o_wsp16.bin, ..., dir/state_wsp2_32.bin), all from the initial states;
// and the bf16 scratch ("wspb"): gdn_chunk_prep_tc<T, DK, bf16> (its q|k, W and A words: dir/{qk,w,a}_b16.bin,
// U and γ: dir/{u,g}_b16.bin) and gdn_chunk_state_wsp<., ., DK, ., false, 1, bf16> with 16 and 32 columns
// (dir/o_wspb16.bin, ...), beside "wsp" with 32 columns over the tc scratch with q|k, W and A rounded to bf16 in
// place (dir/o_wspr32.bin, dir/state_wspr32.bin).
template <typename T, typename S, int DK>
void emu_run(const std::string& dir, int T_, int HK, int HV, int DV, int nseq, int nslots, unsigned prep_smem,
             unsigned smem16, unsigned smem32, unsigned mma16, unsigned mma32, unsigned tc_smem, unsigned stg16,
             unsigned stg32, unsigned wsp16, unsigned wsp32, unsigned wspq32) {
    const long long width = 2LL * HK * DK + (long long)HV * DV;
    auto qkv = emu_read<T>(dir + "/qkv.bin", T_ * width);
    auto a = emu_read<T>(dir + "/a.bin", (size_t)T_ * HV), b = emu_read<T>(dir + "/b.bin", (size_t)T_ * HV);
    auto alog = emu_read<float>(dir + "/alog.bin", HV), dtb = emu_read<float>(dir + "/dtb.bin", HV);
    auto state = emu_read<S>(dir + "/state.bin", (size_t)nslots * HV * DK * DV);
    const std::vector<S> state0(state);  // the initial states (the fp32 pass below updates `state` in place)
    auto starts = emu_read<int>(dir + "/starts.bin", nseq + 1), slots = emu_read<int>(dir + "/slots.bin", nseq);
    std::vector<T> o((size_t)T_ * HV * DV);
    std::memset((void*)o.data(), 0xff, o.size() * sizeof(T));  // NaN poison (both float and bf16 words)
    const std::vector<T> o0(o);                                   // the poisoned output, for the later passes
    const float nan = __uint_as_float(0x7fc00000u);
    struct Scratch {
        std::vector<float> qk, w, am, u, g;
    };
    auto prep = [&]<bool MMA>() {  // a NaN-filled scratch, filled by gdn_chunk_prep<T, DK, MMA>
        Scratch x{std::vector<float>((size_t)T_ * HK * 2 * DK, nan), std::vector<float>((size_t)T_ * HV * DK, nan),
                  std::vector<float>((size_t)T_ * HV * GC_CHUNK, nan), std::vector<float>((size_t)T_ * HV * DV, nan),
                  std::vector<float>((size_t)T_ * HV, nan)};
        emu_launch({(unsigned)(T_ / GC_CHUNK + nseq), (unsigned)HK, 1}, 256, prep_smem, [&] {
            gdn_chunk_prep<T, DK, MMA>(qkv.data(), a.data(), b.data(), alog.data(), dtb.data(), x.qk.data(),
                                       x.w.data(), x.am.data(), x.u.data(), x.g.data(), starts.data(), nseq, HK, HV,
                                       DV, width, HV, HV);
        });
        return x;
    };
    const Scratch fp = prep.template operator()<false>(), mm = prep.template operator()<true>();
    Scratch tc{std::vector<float>((size_t)T_ * HK * 2 * DK, nan), std::vector<float>((size_t)T_ * HV * DK, nan),
               std::vector<float>((size_t)T_ * HV * GC_CHUNK, nan), std::vector<float>((size_t)T_ * HV * DV, nan),
               std::vector<float>((size_t)T_ * HV, nan)};
    emu_launch({(unsigned)(T_ / GC_CHUNK + nseq), (unsigned)HK, 1}, 256, tc_smem, [&] {
        gdn_chunk_prep_tc<T, DK>(qkv.data(), a.data(), b.data(), alog.data(), dtb.data(), tc.qk.data(), tc.w.data(),
                                 tc.am.data(), tc.u.data(), tc.g.data(), starts.data(), nseq, HK, HV, DV, width, HV,
                                 HV);
    });
    std::vector<T> o32(o), om16(o), om32(o), ot16(o);
    std::vector<S> state32(state), sm16(state), sm32(state), st16(state);
    emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 15) / 16)}, 128, mma16, [&] {
        gdn_chunk_state_mma<T, S, DK, 16>(tc.qk.data(), tc.w.data(), tc.am.data(), tc.u.data(), tc.g.data(),
                                          st16.data(), ot16.data(), starts.data(), slots.data(), HK, HV, DV,
                                          (long long)HV * DV);
    });
    emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 15) / 16)}, 128, mma16, [&] {
        gdn_chunk_state_mma<T, S, DK, 16>(mm.qk.data(), mm.w.data(), mm.am.data(), mm.u.data(), mm.g.data(),
                                          sm16.data(), om16.data(), starts.data(), slots.data(), HK, HV, DV,
                                          (long long)HV * DV);
    });
    emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 31) / 32)}, 128, mma32, [&] {
        gdn_chunk_state_mma<T, S, DK, 32>(mm.qk.data(), mm.w.data(), mm.am.data(), mm.u.data(), mm.g.data(),
                                          sm32.data(), om32.data(), starts.data(), slots.data(), HK, HV, DV,
                                          (long long)HV * DV);
    });
    emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 15) / 16)}, 128, smem16, [&] {
        gdn_chunk_state<T, S, DK, 16>(fp.qk.data(), fp.w.data(), fp.am.data(), fp.u.data(), fp.g.data(),
                                      state.data(), o.data(), starts.data(), slots.data(), HK, HV, DV,
                                      (long long)HV * DV);
    });
    emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 31) / 32)}, 256, smem32, [&] {
        gdn_chunk_state<T, S, DK, 32>(fp.qk.data(), fp.w.data(), fp.am.data(), fp.u.data(), fp.g.data(),
                                      state32.data(), o32.data(), starts.data(), slots.data(), HK, HV, DV,
                                      (long long)HV * DV);
    });
    emu_write(dir + "/o.bin", o);
    emu_write(dir + "/state_out.bin", state);
    emu_write(dir + "/o32.bin", o32);
    emu_write(dir + "/state32.bin", state32);
    emu_write(dir + "/o_mma16.bin", om16);
    emu_write(dir + "/state_mma16.bin", sm16);
    emu_write(dir + "/o_mma32.bin", om32);
    emu_write(dir + "/state_mma32.bin", sm32);
    {  // "split": gdn_chunk_state_h (V' over U, per-chunk states into h), then gdn_chunk_out
        Scratch sp = tc;
        const int nchunks = T_ / GC_CHUNK + nseq;
        std::vector<float> h((size_t)nchunks * HV * DK * DV, nan);
        std::vector<T> osp(o);
        std::vector<S> ssp(state0);
        emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 31) / 32)}, 128, mma32, [&] {
            gdn_chunk_state_h<T, S, DK, 32>(sp.qk.data(), sp.w.data(), sp.am.data(), sp.u.data(), sp.g.data(),
                                            h.data(), ssp.data(), starts.data(), slots.data(), HK, HV, DV);
        });
        emu_launch({(unsigned)nchunks, (unsigned)HV, (unsigned)((DV + 31) / 32)}, 128, mma32, [&] {
            gdn_chunk_out<T, DK, 32>(sp.qk.data(), sp.am.data(), sp.u.data(), sp.g.data(), h.data(), osp.data(),
                                     starts.data(), nseq, HK, HV, DV, (long long)HV * DV);
        });
        emu_write(dir + "/o_split.bin", osp);
        emu_write(dir + "/state_split.bin", ssp);
    }
    {  // 8 warps per state-pass block: 256 threads, the same shared memory
        std::vector<T> o8;
        std::vector<S> s8;
        auto run8 = [&]<int DVS>(const Scratch& x, const std::string& name, unsigned smem) {
            o8 = o0;
            s8 = state0;
            emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + DVS - 1) / DVS)}, 256, smem, [&] {
                gdn_chunk_state_mma<T, S, DK, DVS, 8>(x.qk.data(), x.w.data(), x.am.data(), x.u.data(),
                                                      x.g.data(), s8.data(), o8.data(), starts.data(),
                                                      slots.data(), HK, HV, DV, (long long)HV * DV);
            });
            emu_write(dir + "/o_" + name + ".bin", o8);
            emu_write(dir + "/state_" + name + ".bin", s8);
        };
        run8.template operator()<16>(tc, "tc8_16", mma16);
        run8.template operator()<32>(tc, "tc8_32", mma32);
        run8.template operator()<32>(mm, "mma8_32", mma32);
    }
    {  // W and Q rows staged in shared memory ("tcs"): 128 threads, the larger shared memory
        auto runs = [&]<int DVS>(const std::string& name, unsigned smem) {
            std::vector<T> os(o0);
            std::vector<S> ss(state0);
            emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + DVS - 1) / DVS)}, 128, smem, [&] {
                gdn_chunk_state_mma<T, S, DK, DVS, 4, true>(tc.qk.data(), tc.w.data(), tc.am.data(), tc.u.data(),
                                                            tc.g.data(), ss.data(), os.data(), starts.data(),
                                                            slots.data(), HK, HV, DV, (long long)HV * DV);
            });
            emu_write(dir + "/o_" + name + ".bin", os);
            emu_write(dir + "/state_" + name + ".bin", ss);
        };
        runs.template operator()<16>("tcs16", stg16);
        runs.template operator()<32>("tcs32", stg32);
    }
    {  // the walk and the outputs on two warp groups ("wsp", "wspq"): 256 threads
        auto runw = [&]<int DVS, bool QSTG, int CH = 1>(const std::string& name, unsigned smem) {
            std::vector<T> ow(o0);
            std::vector<S> sw(state0);
            emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + DVS - 1) / DVS)}, 256, smem, [&] {
                gdn_chunk_state_wsp<T, S, DK, DVS, QSTG, CH>(tc.qk.data(), tc.w.data(), tc.am.data(), tc.u.data(),
                                                         tc.g.data(), sw.data(), ow.data(), starts.data(),
                                                         slots.data(), HK, HV, DV, (long long)HV * DV);
            });
            emu_write(dir + "/o_" + name + ".bin", ow);
            emu_write(dir + "/state_" + name + ".bin", sw);
        };
        runw.template operator()<16, false>("wsp16", wsp16);
        runw.template operator()<32, false>("wsp32", wsp32);
        runw.template operator()<32, true>("wspq32", wspq32);
        runw.template operator()<16, false, 2>("wsp2_16", wsp16);  // two chains per product: its own rounding
        runw.template operator()<32, false, 2>("wsp2_32", wsp32);
    }
    {  // the bf16 scratch ("wspb"), and wsp over the tc scratch rounded to bf16 ("wspr")
        std::vector<bf16> qk((size_t)T_ * HK * 2 * DK), w((size_t)T_ * HV * DK), am((size_t)T_ * HV * GC_CHUNK);
        for (auto* v : {&qk, &w, &am}) std::memset((void*)v->data(), 0xff, v->size() * sizeof(bf16));  // NaN
        std::vector<float> u((size_t)T_ * HV * DV, nan), g((size_t)T_ * HV, nan);
        emu_launch({(unsigned)(T_ / GC_CHUNK + nseq), (unsigned)HK, 1}, 256, tc_smem, [&] {
            gdn_chunk_prep_tc<T, DK, bf16>(qkv.data(), a.data(), b.data(), alog.data(), dtb.data(), qk.data(),
                                           w.data(), am.data(), u.data(), g.data(), starts.data(), nseq, HK, HV, DV,
                                           width, HV, HV);
        });
        auto runb = [&]<int DVS>(const std::string& name, unsigned smem) {
            std::vector<T> ow(o0);
            std::vector<S> sw(state0);
            emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + DVS - 1) / DVS)}, 256, smem, [&] {
                gdn_chunk_state_wsp<T, S, DK, DVS, false, 1, bf16>(qk.data(), w.data(), am.data(), u.data(),
                                                                   g.data(), sw.data(), ow.data(), starts.data(),
                                                                   slots.data(), HK, HV, DV, (long long)HV * DV);
            });
            emu_write(dir + "/o_" + name + ".bin", ow);
            emu_write(dir + "/state_" + name + ".bin", sw);
        };
        runb.template operator()<16>("wspb16", wsp16);
        runb.template operator()<32>("wspb32", wsp32);
        emu_write(dir + "/qk_b16.bin", qk);
        emu_write(dir + "/w_b16.bin", w);
        emu_write(dir + "/a_b16.bin", am);
        emu_write(dir + "/u_b16.bin", u);
        emu_write(dir + "/g_b16.bin", g);
        Scratch r = tc;  // the tc scratch's q|k, W and A rounded to bf16 (NaN words stay NaN)
        for (auto* v : {&r.qk, &r.w, &r.am})
            for (float& x : *v) x = to_f(from_f<bf16>(x));
        std::vector<T> ow(o0);
        std::vector<S> sw(state0);
        emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 31) / 32)}, 256, wsp32, [&] {
            gdn_chunk_state_wsp<T, S, DK, 32>(r.qk.data(), r.w.data(), r.am.data(), r.u.data(), r.g.data(),
                                              sw.data(), ow.data(), starts.data(), slots.data(), HK, HV, DV,
                                              (long long)HV * DV);
        });
        emu_write(dir + "/o_wspr32.bin", ow);
        emu_write(dir + "/state_wspr32.bin", sw);
    }
    emu_write(dir + "/o_tc16.bin", ot16);
    emu_write(dir + "/state_tc16.bin", st16);
    const char* parts[5] = {"qk", "w", "a", "u", "g"};
    const std::vector<float>* mmv[5] = {&mm.qk, &mm.w, &mm.am, &mm.u, &mm.g};
    const std::vector<float>* tcv[5] = {&tc.qk, &tc.w, &tc.am, &tc.u, &tc.g};
    for (int i = 0; i < 5; ++i) {
        emu_write(dir + "/" + parts[i] + "_mma.bin", *mmv[i]);
        emu_write(dir + "/" + parts[i] + "_tc.bin", *tcv[i]);
    }
}

template <typename T, typename S> void emu_dispatch(char** v) {
    const int T_ = atoi(v[2]), HK = atoi(v[3]), HV = atoi(v[4]), DK = atoi(v[5]), DV = atoi(v[6]);
    const int nseq = atoi(v[7]), nslots = atoi(v[8]);
    const unsigned ps = (unsigned)atoi(v[11]), s16 = (unsigned)atoi(v[12]), s32 = (unsigned)atoi(v[13]);
    const unsigned m16 = (unsigned)atoi(v[14]), m32 = (unsigned)atoi(v[15]), tcs = (unsigned)atoi(v[16]);
    const unsigned g16 = (unsigned)atoi(v[17]), g32 = (unsigned)atoi(v[18]);
    const unsigned w16 = (unsigned)atoi(v[19]), w32 = (unsigned)atoi(v[20]), wq32 = (unsigned)atoi(v[21]);
#define EMU_CASE(dk) \
    if (DK == dk)    \
        return emu_run<T, S, dk>(v[1], T_, HK, HV, DV, nseq, nslots, ps, s16, s32, m16, m32, tcs, g16, g32, w16, w32, wq32);
    EMU_CASE(16) EMU_CASE(32) EMU_CASE(64) EMU_CASE(128)
    std::abort();
}

int main(int argc, char** argv) {
    if (argc != 22) return 2;
    if (atoi(argv[9])) {
        if (atoi(argv[10])) emu_dispatch<bf16, bf16>(argv); else emu_dispatch<bf16, float>(argv);
    } else {
        if (atoi(argv[10])) emu_dispatch<float, bf16>(argv); else emu_dispatch<float, float>(argv);
    }
    return 0;
}
