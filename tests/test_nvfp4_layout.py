"""The NVFP4 device layout (ninfer/cuda/nvfp4_layout.py) on the host: it is a bijection of the artifact's bytes
(rows padded to 16), its byte addresses are the ones the kernels compute (wformat.cuh nv4_codes / nv4_scales), and
every device word yields its codes' bf16 placements through the kernels' pair formulas (nv4_pair)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.cuda.nvfp4_layout import POS, device_planes, natural_planes, padded_rows, to_device_layout
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS

M = 0x81C081C0


def _pair(q: np.ndarray, i: int) -> np.ndarray:
    """wformat.cuh nv4_pair on uint32 arrays."""
    q = q.astype(np.uint64)
    if i < 3:
        return ((q << np.uint64(3 * i)) & np.uint64(M)).astype(np.uint32)
    a = (q >> np.uint64(4)) & np.uint64(0x00C000C0)
    b = (q >> np.uint64(5)) & np.uint64(0x01000100)
    c = (q << np.uint64(1)) & np.uint64(0x80008000)
    return (a | b | c).astype(np.uint32)


@pytest.mark.parametrize("rows", [1, 5, 16, 21, 48])
def test_layout_is_a_bijection_with_the_kernels_addresses(rows: int) -> None:
    rng = np.random.default_rng(rows)
    kp = 384
    codes = rng.integers(0, 256, rows * kp // 2, dtype=np.uint8)
    scales = rng.integers(0, 128, rows * kp // 16, dtype=np.uint8)  # nonnegative: a permutation
    dc, ds = device_planes(np, codes, scales, rows)
    assert dc.size == padded_rows(rows) * kp // 2 and ds.size == padded_rows(rows) * kp // 16
    nc, ns = natural_planes(np, dc, ds, rows)
    np.testing.assert_array_equal(nc, codes)
    np.testing.assert_array_equal(ns, scales)
    words = dc.view(np.uint32)
    for n in range(rows):
        for k in range(0, kp, 16):
            # nv4_scales: the scale byte of k's 16-wide block
            s_off = (n & ~15) * (kp // 16) + (k >> 7) * 128 + (n & 15) * 8 + ((k & 127) >> 4)
            assert ds[s_off] == scales[n * kp // 16 + k // 16]
        for k in range(0, kp, 8):
            # nv4_codes: the device word holding columns k..k+7; its pairs place the natural codes
            c_off = (n & ~15) * (kp // 2) + (k >> 7) * 1024 + (n & 15) * 64 + ((k & 127) >> 1)
            q = words[c_off // 4 : c_off // 4 + 1]
            nat = int(codes[n * kp // 2 + k // 2 : n * kp // 2 + k // 2 + 4].view(np.uint32)[0])
            for i in range(4):
                lo, hi = (nat >> (4 * i)) & 15, (nat >> (4 * (i + 4))) & 15
                want = ((lo & 7) << 6) | ((lo & 8) << 12) | ((hi & 7) << 22) | ((hi & 8) << 28)
                assert int(_pair(q, i)[0]) == want


def test_positions_cover_each_half_once() -> None:
    assert sorted(b for p in POS for b in p) == list(range(16))


def test_device_weight_round_trip_keeps_the_codec_bytes() -> None:
    """A 3-D (expert) tensor whose rows are not a multiple of 16: back to natural, the codec's own bytes."""
    from ninfer.cuda.nvfp4_layout import to_natural_layout

    rng = np.random.default_rng(0)
    shape = (3, 7, 200)
    codec = FORMATS["NVFP4G16_E4M3S"]
    buf = np.ascontiguousarray(
        codec.encode(rng.standard_normal(shape).astype(np.float32), shape).view(np.uint8)
    )
    w = to_device_layout(
        DeviceWeight("NVFP4G16_E4M3S", shape, buf, plane_offsets("NVFP4G16_E4M3S", shape, buf))
    )
    assert w.offsets[1] % 256 == 0 and w.offsets[2] % 256 == 0
    back = to_natural_layout(w)
    np.testing.assert_array_equal(back.data, buf)
    assert back.offsets == plane_offsets("NVFP4G16_E4M3S", shape, buf)
    np.testing.assert_array_equal(codec.decode(back.data, shape), codec.decode(buf, shape))


def test_negative_scales_fold_into_the_codes_exactly() -> None:
    """A block scale with its sign bit set: on the device the scale is |s| and the block's 16 codes change sign, so
    every decoded weight (code * scale) is unchanged, -0 scales included."""
    from ninfer.formats.fp8 import e4m3_decode
    from ninfer.formats.nvfp4 import e2m1_decode

    rng = np.random.default_rng(3)
    rows, kp = 5, 256
    codes = rng.integers(0, 256, rows * kp // 2, dtype=np.uint8)
    scales = rng.integers(0, 256, rows * kp // 16, dtype=np.uint8)
    scales[:4] = (0x80, 0x00, 0x81, 0xB8)
    dc, ds = device_planes(np, codes, scales, rows)
    assert not (ds & 0x80).any()
    nc, ns = natural_planes(np, dc, ds, rows)

    def values(c: np.ndarray, s: np.ndarray) -> np.ndarray:
        nib = np.stack([c & 15, c >> 4], axis=-1).reshape(-1)
        return e2m1_decode(nib).reshape(-1, 16) * e4m3_decode(s)[:, None]

    np.testing.assert_array_equal(values(nc, ns), values(codes, scales))
    assert (ns == scales & 0x7F).all()
