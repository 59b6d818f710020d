#include <limits>
// Driver of the prefill-attention host emulation: argv = dir variant T D R HQ HKV npages page_size ldpt nseq scale
// seed split_keys max_len. variant: 0 attention_prefill_gqa, 1 attention_prefill (one head per block); T: 0 float,
// 1 bf16; split_keys > 0 (GQA): ceil(max_len / split_keys) key splits into NaN-poisoned partials, then
// attention_prefill_combine. Reads dir/{q,kc,vc,pt,seq,pos}.bin, writes dir/o.bin (NaN-poisoned before the
// launch: unwritten outputs stay NaN).
struct ApArgs {
    std::string dir;
    int variant, R, HQ, HKV, npages, page_size, nseq, split_keys, max_len;
    long long ldpt;
    float scale;
    unsigned seed;
};

template <typename T, int D> int ap_run(const ApArgs& a) {
    const size_t cache = (size_t)a.npages * a.page_size * a.HKV * D;
    auto q = emu_read<T>(a.dir + "/q.bin", (size_t)a.R * a.HQ * D);
    auto kc = emu_read<bf16>(a.dir + "/kc.bin", cache), vc = emu_read<bf16>(a.dir + "/vc.bin", cache);
    auto pt = emu_read<int>(a.dir + "/pt.bin", (size_t)a.ldpt * a.nseq);
    auto seq = emu_read<int>(a.dir + "/seq.bin", a.R), pos = emu_read<int>(a.dir + "/pos.bin", a.R);
    std::vector<T> o((size_t)a.R * a.HQ * D);
    std::memset((void*)o.data(), 0xff, o.size() * sizeof(T));
    constexpr int LD = D + 8, BN = ApCfg<D>::BN, H = std::is_same_v<T, float> ? 2 : 1;
    if (a.variant == 0) {
        const unsigned G = a.HQ / a.HKV, BR = AG_SLOTS / G, smem = 2 * LD * (AG_SLOTS * H + 4 * BN) + 8 * AG_SLOTS;
        const unsigned ns = a.split_keys ? (unsigned)((a.max_len + a.split_keys - 1) / a.split_keys) : 1;
        std::vector<float> part(a.split_keys ? (size_t)ns * a.R * a.HQ * (D + 2) : 0,
                                std::numeric_limits<float>::quiet_NaN());
        emu_launch({(a.R + BR - 1) / BR, (unsigned)a.HKV, ns}, AG_THREADS, smem, a.seed, [&] {
            attention_prefill_gqa<T, D>(q.data(), kc.data(), vc.data(), pt.data(), seq.data(), pos.data(), o.data(),
                                        a.R, a.HQ, a.HKV, a.page_size, a.ldpt, a.scale, a.split_keys, part.data());
        });
        if (a.split_keys) {
            const unsigned n = (unsigned)((size_t)a.R * a.HQ * D);
            emu_launch({(n + 255) / 256, 1, 1}, 256, 0, a.seed, [&] {
                attention_prefill_combine<T, D>(part.data(), pos.data(), o.data(), a.R, a.HQ, a.split_keys);
            });
        }
    } else {
        const unsigned smem = 2 * LD * (AP_BM * H + 2 * BN);
        emu_launch({(unsigned)(a.R + AP_BM - 1) / AP_BM, (unsigned)a.HQ, 1}, AP_THREADS, smem, a.seed, [&] {
            attention_prefill<T, D>(q.data(), kc.data(), vc.data(), pt.data(), seq.data(), pos.data(), o.data(), a.R,
                                    a.HQ, a.HKV, a.page_size, a.ldpt, a.scale);
        });
    }
    emu_write(a.dir + "/o.bin", o);
    return 0;
}

template <typename T> int ap_dims(int D, const ApArgs& a) {
    switch (D) {
        case 32: return ap_run<T, 32>(a);
        case 256: return ap_run<T, 256>(a);
    }
    return 5;
}

int main(int argc, char** argv) {
    if (argc != 16) return 2;
    ApArgs a;
    a.dir = argv[1];
    a.variant = atoi(argv[2]);
    const int t = atoi(argv[3]), D = atoi(argv[4]);
    a.R = atoi(argv[5]), a.HQ = atoi(argv[6]), a.HKV = atoi(argv[7]), a.npages = atoi(argv[8]);
    a.page_size = atoi(argv[9]), a.ldpt = atoll(argv[10]), a.nseq = atoi(argv[11]);
    a.scale = (float)atof(argv[12]), a.seed = (unsigned)atoi(argv[13]);
    a.split_keys = atoi(argv[14]), a.max_len = atoi(argv[15]);
    return t == 0 ? ap_dims<float>(D, a) : ap_dims<bf16>(D, a);
}
