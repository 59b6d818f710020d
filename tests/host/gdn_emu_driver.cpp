// Driver of the gdn_chunked host emulation: argv = dir T HK HV DK DV nseq nslots act_bf16 state_bf16 DVS smem.
// Reads dir/{qkv,a,b,alog,dtb,state,starts,slots}.bin, writes dir/o.bin and dir/state_out.bin.
template <typename T, typename S, int DK, int DVS>
void emu_run(const std::string& dir, int T_, int HK, int HV, int DV, int nseq, int nslots, unsigned smem_bytes) {
    const long long width = 2LL * HK * DK + (long long)HV * DV;
    auto qkv = emu_read<T>(dir + "/qkv.bin", T_ * width);
    auto a = emu_read<T>(dir + "/a.bin", (size_t)T_ * HV), b = emu_read<T>(dir + "/b.bin", (size_t)T_ * HV);
    auto alog = emu_read<float>(dir + "/alog.bin", HV), dtb = emu_read<float>(dir + "/dtb.bin", HV);
    auto state = emu_read<S>(dir + "/state.bin", (size_t)nslots * HV * DK * DV);
    auto starts = emu_read<int>(dir + "/starts.bin", nseq + 1), slots = emu_read<int>(dir + "/slots.bin", nseq);
    std::vector<T> o((size_t)T_ * HV * DV);
    std::memset((void*)o.data(), 0xff, o.size() * sizeof(T));  // NaN poison (both float and bf16 words)
    emu_launch({(unsigned)nseq, (unsigned)HV, (unsigned)((DV + DVS - 1) / DVS)}, 256, smem_bytes, [&] {
        gdn_chunked<T, S, DK, DVS>(qkv.data(), a.data(), b.data(), alog.data(), dtb.data(), state.data(), o.data(),
                                   starts.data(), slots.data(), HK, HV, DV, width, HV, HV, (long long)HV * DV);
    });
    emu_write(dir + "/o.bin", o);
    emu_write(dir + "/state_out.bin", state);
}

template <typename T, typename S> void emu_dispatch(char** v) {
    const int T_ = atoi(v[2]), HK = atoi(v[3]), HV = atoi(v[4]), DK = atoi(v[5]), DV = atoi(v[6]);
    const int nseq = atoi(v[7]), nslots = atoi(v[8]), DVS = atoi(v[11]);
    const unsigned sm = (unsigned)atoi(v[12]);
#define EMU_CASE(dk, dvs) \
    if (DK == dk && DVS == dvs) return emu_run<T, S, dk, dvs>(v[1], T_, HK, HV, DV, nseq, nslots, sm);
    EMU_CASE(16, 32) EMU_CASE(32, 32) EMU_CASE(32, 64) EMU_CASE(64, 32) EMU_CASE(64, 64) EMU_CASE(128, 64)
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
