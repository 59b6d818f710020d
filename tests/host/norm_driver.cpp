// Driver of the rmsnorm host emulation (tests/test_norm_host.py), appended after gdn_emu.cpp and cuda_src/norm.cu.
// argv = dir rows H bf16 offset resid vec eps; reads dir/{x,r,w}.bin (x in the activation type, r and w float32,
// rows contiguous), writes dir/{y,r_out}.bin.
#include <cstdio>
template <typename T, bool OFFSET, bool RESID, bool VEC>
void emu_run(const std::string& dir, int rows, int H, float eps) {
    auto x = emu_read<T>(dir + "/x.bin", (size_t)rows * H);
    auto r = emu_read<float>(dir + "/r.bin", (size_t)rows * H);
    auto w = emu_read<float>(dir + "/w.bin", H);
    std::vector<T> y((size_t)rows * H);
    std::memset((void*)y.data(), 0xff, y.size() * sizeof(T));  // NaN poison
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        rmsnorm<T, OFFSET, RESID, VEC>(x.data(), r.data(), w.data(), y.data(), H, eps, H, H, H);
    });
    emu_write(dir + "/y.bin", y);
    emu_write(dir + "/r_out.bin", r);
}

template <typename T, bool OFFSET, bool RESID> void emu_vec(char** v) {
    const int rows = atoi(v[2]), H = atoi(v[3]);
    const float eps = (float)atof(v[8]);
    if (atoi(v[7])) emu_run<T, OFFSET, RESID, true>(v[1], rows, H, eps);
    else emu_run<T, OFFSET, RESID, false>(v[1], rows, H, eps);
}
template <typename T, bool OFFSET> void emu_resid(char** v) {
    if (atoi(v[6])) emu_vec<T, OFFSET, true>(v); else emu_vec<T, OFFSET, false>(v);
}
template <typename T> void emu_offset(char** v) {
    if (atoi(v[5])) emu_resid<T, true>(v); else emu_resid<T, false>(v);
}

int main(int argc, char** argv) {
    if (argc != 9) return 2;
    if (atoi(argv[4])) emu_offset<bf16>(argv); else emu_offset<float>(argv);
    return 0;
}
