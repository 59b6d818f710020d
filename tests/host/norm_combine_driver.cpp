// Driver of the moe_combine_rmsnorm host emulation (tests/test_norm_host.py), appended after gdn_emu.cpp and
// cuda_src/norm.cu. argv = dir rows H k slots bf16 offset vec eps; reads dir/{dn,sh} (activation type), where
// (int32 [rows, k]), ew (float32 [rows, k]), sg (float32 [rows]), r, w (float32); writes the fused kernel's
// dir/{y2,r2}.bin and the pair it replaces (the standalone combine, as ninfer/cuda/_glue.py computes it, then
// rmsnorm<RESID>): dir/{y1,r1}.bin.
#include <cstdio>
template <typename T, bool OFFSET, bool VEC>
void emu_run(const std::string& dir, int rows, int H, int k, int slots, float eps) {
    const size_t n = (size_t)rows * H;
    auto dn = emu_read<T>(dir + "/dn.bin", (size_t)slots * H);
    auto sh = emu_read<T>(dir + "/sh.bin", n);
    auto where = emu_read<int>(dir + "/where.bin", (size_t)rows * k);
    auto ew = emu_read<float>(dir + "/ew.bin", (size_t)rows * k);
    auto sg = emu_read<float>(dir + "/sg.bin", rows);
    auto w = emu_read<float>(dir + "/w.bin", H);
    auto r1 = emu_read<float>(dir + "/r.bin", n), r2 = r1;
    std::vector<T> x(n), y1(n), y2(n);
    for (int t = 0; t < rows; ++t)  // the glue combine, element by element
        for (int c = 0; c < H; ++c) {
            float acc = 0.f;
            for (int j = 0; j < k; ++j) acc = fmaf(ew[t * k + j], to_f(dn[(size_t)where[t * k + j] * H + c]), acc);
            acc = fmaf(1.f / (1.f + expf(-sg[t])), to_f(sh[(size_t)t * H + c]), acc);
            x[(size_t)t * H + c] = from_f<T>(acc);
        }
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        rmsnorm<T, OFFSET, true, VEC>(x.data(), r1.data(), w.data(), y1.data(), H, eps, H, H, H);
    });
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        moe_combine_rmsnorm<T, OFFSET, VEC>(dn.data(), where.data(), ew.data(), sh.data(), sg.data(), k, H, 1,
                                            r2.data(), w.data(), y2.data(), H, eps, H, H);
    });
    emu_write(dir + "/y1.bin", y1);
    emu_write(dir + "/r1.bin", r1);
    emu_write(dir + "/y2.bin", y2);
    emu_write(dir + "/r2.bin", r2);
}

template <typename T, bool OFFSET> void emu_vec(char** v) {
    const int rows = atoi(v[2]), H = atoi(v[3]), k = atoi(v[4]), slots = atoi(v[5]);
    const float eps = (float)atof(v[9]);
    if (atoi(v[8])) emu_run<T, OFFSET, true>(v[1], rows, H, k, slots, eps);
    else emu_run<T, OFFSET, false>(v[1], rows, H, k, slots, eps);
}
template <typename T> void emu_offset(char** v) {
    if (atoi(v[7])) emu_vec<T, true>(v); else emu_vec<T, false>(v);
}

int main(int argc, char** argv) {
    if (argc != 10) return 2;
    if (atoi(argv[6])) emu_offset<bf16>(argv); else emu_offset<float>(argv);
    return 0;
}
