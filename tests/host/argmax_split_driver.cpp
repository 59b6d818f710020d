// Driver of the argmax_split host emulation (tests/test_argmax_split_host.py), appended after tests/host/attn_emu.cpp,
// the test's prelude and cuda_src/sampling.cu. argv = dir rows V limit chunk has_mask launches; reads dir/x.bin
// (float32 [rows, V]) and dir/mask.bin (int32 [rows, ceil(V/32)]) if has_mask; runs `launches` launches on the same
// workspaces (blocks in a different shuffled order each), the partials poisoned before each; writes dir/out.bin
// (int32 [launches, rows], poisoned -2 before each launch) and dir/cnt.bin (the arrival counters after the last).
int main(int argc, char** argv) {
    if (argc != 8) return 2;
    const std::string dir = argv[1];
    const int rows = atoi(argv[2]), V = atoi(argv[3]), limit = atoi(argv[4]), chunk = atoi(argv[5]);
    const int has_mask = atoi(argv[6]), launches = atoi(argv[7]), words = (V + 31) / 32;
    const int lim = limit < V ? limit : V, splits = lim > 0 ? (lim + chunk - 1) / chunk : 1;
    auto x = emu_read<float>(dir + "/x.bin", (size_t)rows * V);
    std::vector<int> mask;
    if (has_mask) mask = emu_read<int>(dir + "/mask.bin", (size_t)rows * words);
    std::vector<u64> part((size_t)rows * splits);
    std::vector<int> cnt(rows, 0), out((size_t)launches * rows);
    for (int l = 0; l < launches; ++l) {
        std::memset(part.data(), 0x5a, part.size() * sizeof(u64));  // a large key: an unwritten partial shows
        int* o = out.data() + (size_t)l * rows;
        for (int r = 0; r < rows; ++r) o[r] = -2;
        emu_launch_poisoned({(unsigned)splits, (unsigned)rows, 1}, ARGMAX_NT, 1000u + l, [] {}, [&] {
            argmax_split(x.data(), V, has_mask ? mask.data() : nullptr, words, V, limit, chunk, part.data(),
                         cnt.data(), o);
        });
    }
    emu_write(dir + "/out.bin", out);
    emu_write(dir + "/cnt.bin", cnt);
    return 0;
}
