// Driver of the fused conv + prep host emulation (tests/test_gdn_chunked_host.py::test_gdn_conv_prep_emulated):
// argv = dir T HK HV DK DV nseq nslots act_bf16 state_bf16 ldx tc_smem conv_smem staged32_smem. Reads
// dir/{x,a,b,alog,dtb,state,starts,slots,convw,convst}.bin; x holds T rows of ldx words of which the first
// C = 2·HK·DK + HV·DV are the raw in-projection q | k | v channels (the rest stands for the other projections'
// columns of the model's row). Runs, each from the initial conv and recurrent states over NaN-filled scratch:
//   unfused: gdn.cu's causal_conv<T, 4> (x -> y, conv state updated), gdn_chunk_prep_tc<T, DK> on y, then the
//            staged state pass gdn_chunk_state_mma<T, S, DK, 32, 4, true> ("tcs");
//   fused:   gdn_chunk_prep_tc_conv<T, DK> on x (conv state updated), then the same state pass;
// and writes dir/{qk,w,a,u,g}_{ref,fused}.bin (the scratch), dir/{o,state,conv}_{ref,fused}.bin.
template <typename T, typename S, int DK>
void emu_run(const std::string& dir, int T_, int HK, int HV, int DV, int nseq, int nslots, long long ldx,
             unsigned tc_smem, unsigned conv_smem, unsigned stg32) {
    const int C = 2 * HK * DK + HV * DV;
    auto x = emu_read<T>(dir + "/x.bin", (size_t)T_ * ldx);
    auto a = emu_read<T>(dir + "/a.bin", (size_t)T_ * HV), b = emu_read<T>(dir + "/b.bin", (size_t)T_ * HV);
    auto alog = emu_read<float>(dir + "/alog.bin", HV), dtb = emu_read<float>(dir + "/dtb.bin", HV);
    auto state0 = emu_read<S>(dir + "/state.bin", (size_t)nslots * HV * DK * DV);
    auto starts = emu_read<int>(dir + "/starts.bin", nseq + 1), slots = emu_read<int>(dir + "/slots.bin", nseq);
    auto convw = emu_read<float>(dir + "/convw.bin", (size_t)C * 4);
    auto conv0 = emu_read<float>(dir + "/convst.bin", (size_t)nslots * C * 3);
    const float nan = __uint_as_float(0x7fc00000u);
    struct Run {
        std::vector<float> qk, w, am, u, g, conv;
        std::vector<T> o;
        std::vector<S> state;
    };
    auto fresh = [&] {
        Run r{std::vector<float>((size_t)T_ * HK * 2 * DK, nan), std::vector<float>((size_t)T_ * HV * DK, nan),
              std::vector<float>((size_t)T_ * HV * GC_CHUNK, nan), std::vector<float>((size_t)T_ * HV * DV, nan),
              std::vector<float>((size_t)T_ * HV, nan), conv0, std::vector<T>((size_t)T_ * HV * DV), state0};
        std::memset((void*)r.o.data(), 0xff, r.o.size() * sizeof(T));  // NaN poison (float and bf16 words)
        return r;
    };
    const emu_dim3 pgrid{(unsigned)(T_ / GC_CHUNK + nseq), (unsigned)HK, 1};
    auto state_pass = [&](Run& r) {
        emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + 31) / 32)}, 128, stg32, [&] {
            gdn_chunk_state_mma<T, S, DK, 32, 4, true>(r.qk.data(), r.w.data(), r.am.data(), r.u.data(), r.g.data(),
                                                       r.state.data(), r.o.data(), starts.data(), slots.data(), HK,
                                                       HV, DV, (long long)HV * DV);
        });
    };
    Run ref = fresh(), fu = fresh();
    {  // causal_conv (its launch shape in gdn_step.py: 128 channels x CONV_TILE rows per block), then the tc prep
        std::vector<T> y((size_t)T_ * C);
        std::memset((void*)y.data(), 0xff, y.size() * sizeof(T));
        emu_launch({(unsigned)((C + 127) / 128), (unsigned)((T_ + CONV_TILE - 1) / CONV_TILE), 1}, 128, 0, [&] {
            causal_conv<T, 4>(x.data(), convw.data(), ref.conv.data(), y.data(), starts.data(), slots.data(), C, ldx,
                              C, nseq);
        });
        emu_launch(pgrid, 256, tc_smem, [&] {
            gdn_chunk_prep_tc<T, DK>(y.data(), a.data(), b.data(), alog.data(), dtb.data(), ref.qk.data(),
                                     ref.w.data(), ref.am.data(), ref.u.data(), ref.g.data(), starts.data(), nseq, HK,
                                     HV, DV, C, HV, HV);
        });
        state_pass(ref);
    }
    emu_launch(pgrid, 256, conv_smem, [&] {
        gdn_chunk_prep_tc_conv<T, DK>(x.data(), a.data(), b.data(), alog.data(), dtb.data(), fu.qk.data(),
                                      fu.w.data(), fu.am.data(), fu.u.data(), fu.g.data(), starts.data(), nseq, HK, HV,
                                      DV, ldx, HV, HV, convw.data(), fu.conv.data(), slots.data());
    });
    state_pass(fu);
    for (auto [name, r] : {std::pair<const char*, Run*>{"ref", &ref}, {"fused", &fu}}) {
        const std::string tag = std::string("_") + name + ".bin";
        emu_write(dir + "/qk" + tag, r->qk);
        emu_write(dir + "/w" + tag, r->w);
        emu_write(dir + "/a" + tag, r->am);
        emu_write(dir + "/u" + tag, r->u);
        emu_write(dir + "/g" + tag, r->g);
        emu_write(dir + "/conv" + tag, r->conv);
        emu_write(dir + "/o" + tag, r->o);
        emu_write(dir + "/state" + tag, r->state);
    }
}

template <typename T, typename S> void emu_dispatch(char** v) {
    const int T_ = atoi(v[2]), HK = atoi(v[3]), HV = atoi(v[4]), DK = atoi(v[5]), DV = atoi(v[6]);
    const int nseq = atoi(v[7]), nslots = atoi(v[8]);
    const long long ldx = atoll(v[11]);
    const unsigned tcs = (unsigned)atoi(v[12]), cvs = (unsigned)atoi(v[13]), g32 = (unsigned)atoi(v[14]);
#define EMU_CASE(dk) \
    if (DK == dk) return emu_run<T, S, dk>(v[1], T_, HK, HV, DV, nseq, nslots, ldx, tcs, cvs, g32);
    EMU_CASE(16) EMU_CASE(32) EMU_CASE(64) EMU_CASE(128)
    std::abort();
}

int main(int argc, char** argv) {
    if (argc != 15) return 2;
    if (atoi(argv[9])) {
        if (atoi(argv[10])) emu_dispatch<bf16, bf16>(argv); else emu_dispatch<bf16, float>(argv);
    } else {
        if (atoi(argv[10])) emu_dispatch<float, bf16>(argv); else emu_dispatch<float, float>(argv);
    }
    return 0;
}
