"""The decode GEMV's NVFP4 decoding (cuda_src/wfrag.cuh ``gv_nv4_pair``, ``FragNVFP4::read``/``prep``), compiled for
the host with nvcc, gives bitwise the bf16 operands of the reference formulas: wformat.cuh ``nv4_pair`` (which the
GEMM, the embedding and the layout tests keep using) and the block-scale placement the GEMV used before its
instruction diet (the lane's 16-bit scale pair out of its 4-byte word, ``(y << 4) & 0x07F007F0`` and
``(y >> 4) & 0x07F007F0`` with ``y = sc * 0x10001``). Pairs: every 16-bit half pattern in both halves plus random
words (the formulas never move a bit across halves); scales: every pair of nonnegative e4m3 bytes (the device
layout's scales, nvfp4_layout.py) for both lanes of a scale word. Skipped without nvcc. The device's own
instructions (the multiplies from constant memory) are checked on a GPU by tests/test_cuda_ops.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from host_emu import build_nvcc_driver

DRIVER = r"""
#include <cstdio>
#include <cstring>
#include "wfrag.cuh"

static u32 old_scale(u32 sc, int h) {  // the placement before the diet, then the same two bf16 multiplies
    const u32 y = sc * 0x00010001u;
    return FragNVFP4::scale_up(h == 0 ? (y << 4) & 0x07F007F0u : (y >> 4) & 0x07F007F0u);
}

int main() {
    long long bad = 0, n = 0;
    u32 x = 12345u;
    for (u32 h = 0; h < 65536u + (1u << 20); ++h) {
        u32 q;
        if (h < 65536u) {
            q = h | (((h * 40503u) & 0xffffu) << 16);
        } else {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            q = x;
        }
        for (int i = 0; i < 4; ++i, ++n) bad += gv_nv4_pair(q, i) != nv4_pair(q, i);
    }
    const uint4 codes = make_uint4(0x01234567u, 0x89abcdefu, 0xdeadbeefu, 0x0badf00du);
    for (u32 b0 = 0; b0 < 128; ++b0)
        for (u32 b1 = 0; b1 < 128; ++b1)
            for (int t = 0; t < 4; ++t) {
                // a stage holding, in every row's scale slot of this lane, the word with (b0, b1) at t's half
                static u8 st[FragNVFP4::VECS * 512];
                memset(st, 0xee, sizeof st);
                const int lane = 4 * 5 + t;
                for (int r = 0; r < 2 * FragNVFP4::MT; ++r) {
                    u8* w = st + 2 * FragNVFP4::MT * 512 + (32 * r + lane) * 4;
                    w[2 * (t & 1)] = (u8)b0, w[2 * (t & 1) + 1] = (u8)b1;
                    w[2 * (1 - (t & 1))] = (u8)(b1 ^ 0x55), w[2 * (1 - (t & 1)) + 1] = (u8)(b0 ^ 0x2a);
                    memcpy(gv_vec(st, r, lane), &codes, 16);
                }
                for (int mt = 0; mt < FragNVFP4::MT; ++mt)
                    for (int r = 0; r < 2; ++r, ++n) {
                        FragNVFP4::Raw raw;
                        FragNVFP4::read(st, lane, mt, r, t, raw);
                        FragNVFP4::Prep p;
                        FragNVFP4::prep(raw, p);
                        const u32 sc = b0 | (b1 << 8);
                        bad += p.s0 != old_scale(sc, 0) || p.s1 != old_scale(sc, 1) || p.c.x != codes.x ||
                               p.c.w != codes.w;
                    }
            }
    printf("%lld %lld\n", bad, n);
    return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nvcc_driver(tmp_path_factory, "gemv_nv4_host", DRIVER)


def test_gemv_nvfp4_decode_is_bitwise_the_reference_formulas(driver: Path) -> None:
    proc = subprocess.run([str(driver)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    bad, n = (int(v) for v in proc.stdout.split())
    assert n > 4_000_000 and bad == 0, f"{bad} of {n} operands differ"
