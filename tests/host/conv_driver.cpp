// Driver of the causal_conv host emulation (tests/test_causal_conv_host.py): argv = dir T C nseq nslots act_bf16.
// Reads dir/{x,w,state,starts,slots}.bin; runs gdn.cu's causal_conv (token tiles in parallel) on one copy of the
// state and, as the oracle, the one-thread-per-channel sequential pass it replaced (below, verbatim) on another;
// writes dir/{y,state_out,y_seq,state_seq}.bin.
template <typename T, int KW>
void causal_conv_seq(const T* x, const float* w, float* state, T* y, const int* starts, const int* slots, int C,
                     long long ldx, long long ldy) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C) return;
    float* st = state + ((long long)slots[b] * C + c) * (KW - 1);
    float win[KW - 1], wc[KW];
    for (int j = 0; j < KW - 1; ++j) win[j] = st[j];
    for (int j = 0; j < KW; ++j) wc[j] = w[c * KW + j];
    for (int t = starts[b]; t < starts[b + 1]; ++t)
        y[t * ldy + c] = from_f<T>(conv_token<KW>(win, wc, to_f(x[t * ldx + c])));
    for (int j = 0; j < KW - 1; ++j) st[j] = win[j];
}

template <typename T> void emu_run(const std::string& dir, int T_, int C, int nseq, int nslots) {
    auto x = emu_read<T>(dir + "/x.bin", (size_t)T_ * C);
    auto w = emu_read<float>(dir + "/w.bin", (size_t)C * 4);
    auto state = emu_read<float>(dir + "/state.bin", (size_t)nslots * C * 3), state2 = state;
    auto starts = emu_read<int>(dir + "/starts.bin", nseq + 1), slots = emu_read<int>(dir + "/slots.bin", nseq);
    std::vector<T> y((size_t)T_ * C), y2((size_t)T_ * C);
    std::memset((void*)y.data(), 0xff, y.size() * sizeof(T));  // NaN poison (float and bf16 words)
    std::memset((void*)y2.data(), 0xff, y2.size() * sizeof(T));
    const unsigned bx = (unsigned)((C + 127) / 128), tiles = (unsigned)((T_ + CONV_TILE - 1) / CONV_TILE);
    emu_launch({bx, tiles, 1}, 128, 0, [&] {
        causal_conv<T, 4>(x.data(), w.data(), state.data(), y.data(), starts.data(), slots.data(), C, C, C, nseq);
    });
    emu_launch({bx, (unsigned)nseq, 1}, 128, 0, [&] {
        causal_conv_seq<T, 4>(x.data(), w.data(), state2.data(), y2.data(), starts.data(), slots.data(), C, C, C);
    });
    emu_write(dir + "/y.bin", y);
    emu_write(dir + "/state_out.bin", state);
    emu_write(dir + "/y_seq.bin", y2);
    emu_write(dir + "/state_seq.bin", state2);
}

int main(int argc, char** argv) {
    if (argc != 7) return 2;
    const int T_ = atoi(argv[2]), C = atoi(argv[3]), nseq = atoi(argv[4]), nslots = atoi(argv[5]);
    if (atoi(argv[6]))
        emu_run<bf16>(argv[1], T_, C, nseq, nslots);
    else
        emu_run<float>(argv[1], T_, C, nseq, nslots);
    return 0;
}
