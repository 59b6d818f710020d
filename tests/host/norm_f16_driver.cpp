// Driver of the norms' fp16-row outputs (tests/test_norm_host.py), appended after gdn_emu.cpp and cuda_src/norm.cu.
// argv = dir combine rows H k slots offset resid eps. combine 0: rmsnorm<float, OFFSET, RESID, VEC> and
// rmsnorm_f16<OFFSET, RESID> over dir/{x,r,w}.bin; combine 1: moe_combine_rmsnorm<float, OFFSET, VEC> and
// moe_combine_rmsnorm_f16<OFFSET> over dir/{dn,sh,where,ew,sg,r,w}.bin (as norm_combine_driver.cpp). Writes the
// float kernel's dir/{y,r1}.bin and the fp16 kernel's dir/{xh,rowf,r2}.bin (xh and rowf NaN-poisoned first).
#include <cstdio>
template <bool OFFSET, bool RESID>
void emu_norm(const std::string& dir, int rows, int H, float eps) {
    const size_t n = (size_t)rows * H;
    auto x = emu_read<float>(dir + "/x.bin", n);
    auto r1 = emu_read<float>(dir + "/r.bin", n), r2 = r1;
    auto w = emu_read<float>(dir + "/w.bin", H);
    std::vector<float> y(n), rowf(rows);
    std::vector<u16> xh(n);
    std::memset((void*)xh.data(), 0xff, n * sizeof(u16));
    std::memset((void*)rowf.data(), 0xff, rows * sizeof(float));
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        rmsnorm<float, OFFSET, RESID, true>(x.data(), r1.data(), w.data(), y.data(), H, eps, H, H, H);
    });
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        rmsnorm_f16<OFFSET, RESID>(x.data(), r2.data(), w.data(), xh.data(), rowf.data(), H, eps, H, H);
    });
    emu_write(dir + "/y.bin", y);
    emu_write(dir + "/r1.bin", r1);
    emu_write(dir + "/xh.bin", xh);
    emu_write(dir + "/rowf.bin", rowf);
    emu_write(dir + "/r2.bin", r2);
}

template <bool OFFSET>
void emu_combine(const std::string& dir, int rows, int H, int k, int slots, float eps) {
    const size_t n = (size_t)rows * H;
    auto dn = emu_read<float>(dir + "/dn.bin", (size_t)slots * H);
    auto sh = emu_read<float>(dir + "/sh.bin", n);
    auto where = emu_read<int>(dir + "/where.bin", (size_t)rows * k);
    auto ew = emu_read<float>(dir + "/ew.bin", (size_t)rows * k);
    auto sg = emu_read<float>(dir + "/sg.bin", rows);
    auto w = emu_read<float>(dir + "/w.bin", H);
    auto r1 = emu_read<float>(dir + "/r.bin", n), r2 = r1;
    std::vector<float> y(n), rowf(rows);
    std::vector<u16> xh(n);
    std::memset((void*)xh.data(), 0xff, n * sizeof(u16));
    std::memset((void*)rowf.data(), 0xff, rows * sizeof(float));
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        moe_combine_rmsnorm<float, OFFSET, true>(dn.data(), where.data(), ew.data(), sh.data(), sg.data(), k, H, 1,
                                                 r1.data(), w.data(), y.data(), H, eps, H, H);
    });
    emu_launch({(unsigned)rows, 1, 1}, RMS_NT, 0, [&] {
        moe_combine_rmsnorm_f16<OFFSET>(dn.data(), where.data(), ew.data(), sh.data(), sg.data(), k, H, 1,
                                        r2.data(), w.data(), xh.data(), rowf.data(), H, eps, H);
    });
    emu_write(dir + "/y.bin", y);
    emu_write(dir + "/r1.bin", r1);
    emu_write(dir + "/xh.bin", xh);
    emu_write(dir + "/rowf.bin", rowf);
    emu_write(dir + "/r2.bin", r2);
}

// combine 2: gated_rmsnorm<float> (T * HV rows of D, z [T, HV D]), gated_rmsnorm_f16 and gated_rmsnorm_f16r (into
// dir/xh_r.bin, dir/rowf_r.bin) over dir/{o,z,w}.bin
// (rows = T, H = D, k = HV); y is [T, HV D]; no residual (r1, r2 empty)
void emu_gated(const std::string& dir, int T, int D, int HV, float eps) {
    const size_t n = (size_t)T * HV * D;
    auto o = emu_read<float>(dir + "/o.bin", n);
    auto z = emu_read<float>(dir + "/z.bin", n);
    auto w = emu_read<float>(dir + "/w.bin", D);
    std::vector<float> y(n), rowf(T), none;
    std::vector<u16> xh(n);
    std::memset((void*)xh.data(), 0xff, n * sizeof(u16));
    std::memset((void*)rowf.data(), 0xff, T * sizeof(float));
    const int rows = T * HV;
    emu_launch({(unsigned)((rows + 7) / 8), 1, 1}, 256, 0, [&] {
        gated_rmsnorm<float>(o.data(), z.data(), w.data(), y.data(), rows, D, eps, D, (long long)HV * D, D, HV);
    });
    emu_launch({(unsigned)T, 1, 1}, 32 * GN_F16_WARPS, 0, [&] {
        gated_rmsnorm_f16(o.data(), z.data(), w.data(), xh.data(), rowf.data(), HV, D, eps, D, (long long)HV * D);
    });
    // the register-resident kernel, at the instance ninfer/cuda/norm.py picks (_gated_f16_kernel)
    std::vector<u16> xr(n);
    std::vector<float> rowr(T);
    std::memset((void*)xr.data(), 0xff, n * sizeof(u16));
    std::memset((void*)rowr.data(), 0xff, T * sizeof(float));
    const int hpw = (HV + GN_F16_WARPS - 1) / GN_F16_WARPS;
    auto resident = [&]<int R, int HPW>() {
        emu_launch({(unsigned)T, 1, 1}, 32 * GN_F16_WARPS, 0, [&] {
            gated_rmsnorm_f16r<R, HPW>(o.data(), z.data(), w.data(), xr.data(), rowr.data(), HV, D, eps, D,
                                       (long long)HV * D);
        });
    };
    if (D <= 128 && hpw <= 1) resident.template operator()<4, 1>();
    else if (D <= 128 && hpw <= 2) resident.template operator()<4, 2>();
    else if (D <= 128 && hpw <= 4) resident.template operator()<4, 4>();
    else if (D <= 128 && hpw <= 6) resident.template operator()<4, 6>();
    else if (D <= 128 && hpw <= 8) resident.template operator()<4, 8>();
    else if (hpw <= 4) resident.template operator()<8, 4>();
    else std::abort();
    emu_write(dir + "/y.bin", y);
    emu_write(dir + "/xh.bin", xh);
    emu_write(dir + "/rowf.bin", rowf);
    emu_write(dir + "/xh_r.bin", xr);
    emu_write(dir + "/rowf_r.bin", rowr);
    emu_write(dir + "/r1.bin", none);
    emu_write(dir + "/r2.bin", none);
}

int main(int argc, char** argv) {
    if (argc != 10) return 2;
    const std::string dir = argv[1];
    const int combine = atoi(argv[2]), rows = atoi(argv[3]), H = atoi(argv[4]), k = atoi(argv[5]);
    const int slots = atoi(argv[6]), offset = atoi(argv[7]), resid = atoi(argv[8]);
    const float eps = (float)atof(argv[9]);
    if (combine == 2) {
        emu_gated(dir, rows, H, k, eps);
    } else if (combine) {
        if (offset) emu_combine<true>(dir, rows, H, k, slots, eps); else emu_combine<false>(dir, rows, H, k, slots, eps);
    } else if (offset) {
        if (resid) emu_norm<true, true>(dir, rows, H, eps); else emu_norm<true, false>(dir, rows, H, eps);
    } else {
        if (resid) emu_norm<false, true>(dir, rows, H, eps); else emu_norm<false, false>(dir, rows, H, eps);
    }
    return 0;
}
