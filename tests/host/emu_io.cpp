// File I/O of the host-emulation drivers (tests/host/*_driver.cpp): a driver reads its inputs from and writes its
// outputs to raw binary files of the test's temporary directory. tests/host_emu.py's build_emulator places this
// file before the driver.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
template <typename X> std::vector<X> emu_read(const std::string& path, size_t n) {
    std::vector<X> v(n);
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f || std::fread(v.data(), sizeof(X), n, f) != n) std::abort();
    std::fclose(f);
    return v;
}
template <typename X> void emu_write(const std::string& path, const std::vector<X>& v) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(v.data(), sizeof(X), v.size(), f) != v.size()) std::abort();
    std::fclose(f);
}
