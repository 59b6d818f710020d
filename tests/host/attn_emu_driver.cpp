// Driver of the attention host emulation: argv = dir T C D R HQ HKV npages page_size page_shift ldpt chunk nsplit
// ngmax qk_scale smem order_seed nseq sx (gridDim.z) nw pipe (the kernel's NW and P). T: 0 float, 1 bf16; C: 0 float, 1 bf16, 2 e4m3. Reads dir/{q,kc,vc,ks,vs,pt,
// seq,pos}.bin, writes dir/o.bin; exits 7 if an arrival counter is not zero again after the launch.
struct EmuArgs {
    std::string dir;
    int R, HQ, HKV, nseq, npages, page_size, page_shift, chunk, nsplit, ngmax;
    long long ldpt;
    float qk_scale;
    unsigned smem, seed, sx;
    int nw, pipe;
};

template <typename T, typename C, int D, int NW, int P> int emu_run(const EmuArgs& a) {
    const size_t cache = (size_t)a.npages * a.page_size * a.HKV, G = a.HQ / a.HKV;
    auto q = emu_read<T>(a.dir + "/q.bin", (size_t)a.R * a.HQ * D);
    auto kc = emu_read<C>(a.dir + "/kc.bin", cache * D), vc = emu_read<C>(a.dir + "/vc.bin", cache * D);
    auto ks = emu_read<float>(a.dir + "/ks.bin", cache), vs = emu_read<float>(a.dir + "/vs.bin", cache);
    auto pt = emu_read<int>(a.dir + "/pt.bin", (size_t)a.ldpt * a.nseq);
    auto seq = emu_read<int>(a.dir + "/seq.bin", a.R), pos = emu_read<int>(a.dir + "/pos.bin", a.R);
    std::vector<T> o((size_t)a.R * a.HQ * D);
    std::memset((void*)o.data(), 0xff, o.size() * sizeof(T));  // NaN poison (float and bf16 words)
    const size_t rh = (size_t)a.R * a.HKV;
    std::vector<float> ws_o(rh * a.nsplit * G * D + 4, NAN), ws_ml(rh * a.nsplit * G * 2 + 4, NAN);
    std::vector<float> wg_o(rh * a.ngmax * G * D + 4, NAN), wg_ml(rh * a.ngmax * G * 2 + 4, NAN);
    std::vector<int> cnt(rh * (a.ngmax + 1) + 4, 0);
    emu_launch({(unsigned)a.HKV, (unsigned)a.R, a.sx}, 32 * NW, a.smem, a.seed, [&] {
        attention<T, C, D, NW, P>(q.data(), kc.data(), vc.data(), ks.data(), vs.data(), pt.data(), seq.data(), pos.data(),
                           o.data(), ws_o.data(), ws_ml.data(), wg_o.data(), wg_ml.data(), cnt.data(), a.HQ, a.HKV,
                           a.page_size, a.page_shift, a.ldpt, a.chunk, a.nsplit, a.ngmax, a.qk_scale);
    });
    emu_write(a.dir + "/o.bin", o);
    for (int c : cnt)
        if (c != 0) return 7;
    return 0;
}

template <typename T, typename C, int NW, int P> int emu_dims(int D, const EmuArgs& a) {
    switch (D) {
        case 32: return emu_run<T, C, 32, NW, P>(a);
        case 64: return emu_run<T, C, 64, NW, P>(a);
        case 128: return emu_run<T, C, 128, NW, P>(a);
        case 256: return emu_run<T, C, 256, NW, P>(a);
    }
    return 5;
}

template <typename T, typename C> int emu_variant(int D, const EmuArgs& a) {  // the wrapper's VARIANTS
    if (a.nw == 4 && a.pipe == 0) return emu_dims<T, C, 4, 0>(D, a);
    if (a.nw == 4 && a.pipe == 1) return emu_dims<T, C, 4, 1>(D, a);
    if (a.nw == 8 && a.pipe == 1) return emu_dims<T, C, 8, 1>(D, a);
    if (a.nw == 8 && a.pipe == 2) return emu_dims<T, C, 8, 2>(D, a);
    return 6;
}

template <typename T> int emu_cache(int c, int D, const EmuArgs& a) {
    if (c == 0) return emu_variant<T, float>(D, a);
    if (c == 1) return emu_variant<T, bf16>(D, a);
    return emu_variant<T, e4m3>(D, a);
}

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "e4m3") {  // every code through att_e4m3x4: 256 bf16 words on stdout
        std::vector<unsigned short> out(256);
        for (unsigned c = 0; c < 256; c += 4) {
            u32 p01, p23;
            att_e4m3x4(c | (c + 1) << 8 | (c + 2) << 16 | (c + 3) << 24, p01, p23);
            out[c] = p01 & 0xffffu, out[c + 1] = p01 >> 16, out[c + 2] = p23 & 0xffffu, out[c + 3] = p23 >> 16;
        }
        return std::fwrite(out.data(), 2, 256, stdout) == 256 ? 0 : 3;
    }
    if (argc != 22) return 2;
    EmuArgs a;
    a.dir = argv[1];
    const int t = atoi(argv[2]), c = atoi(argv[3]), D = atoi(argv[4]);
    a.R = atoi(argv[5]), a.HQ = atoi(argv[6]), a.HKV = atoi(argv[7]), a.npages = atoi(argv[8]);
    a.page_size = atoi(argv[9]), a.page_shift = atoi(argv[10]), a.ldpt = atoll(argv[11]), a.chunk = atoi(argv[12]);
    a.nsplit = atoi(argv[13]), a.ngmax = atoi(argv[14]), a.qk_scale = (float)atof(argv[15]);
    a.smem = (unsigned)atoi(argv[16]), a.seed = (unsigned)atoi(argv[17]), a.nseq = atoi(argv[18]);
    a.sx = (unsigned)atoi(argv[19]), a.nw = atoi(argv[20]), a.pipe = atoi(argv[21]);
    return t == 0 ? emu_cache<float>(c, D, a) : emu_cache<bf16>(c, D, a);
}
