// Driver of the split sampler's host emulation (tests/test_sample_split_host.py), appended after
// tests/host/attn_emu.cpp, the test's prelude and cuda_src/sampling.cu. argv = dir rows V limit chunk bins cap
// has_mask launches. Reads dir/x.bin (float32 [rows, V]), dir/mask.bin (int32 [rows, ceil(V/32)]) if has_mask,
// dir/params.bin (per row float64 T, top_p, min_p), dir/topk.bin (int32 [rows]), dir/seedpos.bin (uint64 seeds
// [rows] then positions [rows]). Runs sample_rows' split launch sequence (ninfer.cuda.sampling._split_launches)
// `launches` times on the same workspaces (blocks in a different shuffled order each; state, prefix sums,
// partials and lists poisoned before each); writes dir/out.bin (int32 [launches, rows], poisoned -2 before each),
// dir/zero.bin (the must-be-zero workspace after the last), dir/cnt.bin (the arrival counters after the last) and
// dir/st.bin (the rows' state words after the last).
int main(int argc, char** argv) {
    if (argc != 10) return 2;
    const std::string dir = argv[1];
    const int rows = atoi(argv[2]), V = atoi(argv[3]), limit = atoi(argv[4]), chunk = atoi(argv[5]);
    const int nb = atoi(argv[6]), cap = atoi(argv[7]), has_mask = atoi(argv[8]), launches = atoi(argv[9]);
    const int words = (V + 31) / 32, lim = limit < V ? limit : V, ldw = lim > 1 ? lim : 1;
    const int splits = lim > 0 ? (lim + chunk - 1) / chunk : 1;
    const int hchunk = chunk * 4, hsplits = lim > 0 ? (lim + hchunk - 1) / hchunk : 1;  // sampling.HIST_SPAN
    const long long zs = 2 * nb + 1;
    auto x = emu_read<float>(dir + "/x.bin", (size_t)rows * V);
    std::vector<int> mask;
    if (has_mask) mask = emu_read<int>(dir + "/mask.bin", (size_t)rows * words);
    auto f = emu_read<double>(dir + "/params.bin", (size_t)rows * 3);
    std::vector<double> T(rows), tp(rows), mp(rows);
    for (int r = 0; r < rows; ++r) T[r] = f[3 * r], tp[r] = f[3 * r + 1], mp[r] = f[3 * r + 2];
    auto k = emu_read<int>(dir + "/topk.bin", rows);
    auto sp = emu_read<u64>(dir + "/seedpos.bin", (size_t)rows * 2);
    std::vector<u64> seeds(sp.begin(), sp.begin() + rows), pos(sp.begin() + rows, sp.end());
    std::vector<u64> zero((size_t)rows * zs, 0), st((size_t)rows * ST_STRIDE), pre((size_t)rows * 2 * (nb + 1));
    std::vector<u64> part((size_t)rows * splits * 2), ws((size_t)rows * ldw);
    std::vector<int> cnt(rows, 0), out((size_t)launches * rows);
    const int* m = has_mask ? mask.data() : nullptr;
    for (int l = 0; l < launches; ++l) {
        for (auto* v : {&st, &pre, &part, &ws}) std::memset(v->data(), 0x5a, v->size() * sizeof(u64));
        int* o = out.data() + (size_t)l * rows;
        for (int r = 0; r < rows; ++r) o[r] = -2;
        const emu_dim3 grid{(unsigned)splits, (unsigned)rows, 1}, hgrid{(unsigned)hsplits, (unsigned)rows, 1};
        unsigned seed = 1000u + 17u * l;
        emu_launch_poisoned(grid, SPLIT_NT, seed++, [] {}, [&] {
            split_max(x.data(), V, m, words, lim, chunk, T.data(), mp.data(), nb, part.data(), cnt.data(), st.data(), o);
        });
        emu_launch_poisoned(hgrid, SPLIT_NT, seed++, [] {}, [&] {
            split_hist(x.data(), V, m, words, lim, hchunk, T.data(), mp.data(), nb, k.data(), tp.data(), seeds.data(),
                       pos.data(), cap, cnt.data(), st.data(), zero.data(), zs, pre.data(), ws.data(), ldw, o);
        });
        for (int round = 0; round < 3; ++round)
            emu_launch_poisoned(grid, SPLIT_NT, seed++, [] {}, [&] {
                split_gather(x.data(), V, m, words, lim, chunk, T.data(), mp.data(), nb, k.data(), tp.data(),
                             seeds.data(), pos.data(), cap, cnt.data(), st.data(), zero.data(), zs, pre.data(),
                             ws.data(), ldw, o);
            });
    }
    emu_write(dir + "/out.bin", out);
    emu_write(dir + "/zero.bin", zero);
    emu_write(dir + "/cnt.bin", cnt);
    emu_write(dir + "/st.bin", st);
    return 0;
}
