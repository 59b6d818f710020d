"""Exactness and error bounds of ninfer.formats against independent computations (torch casts, scalar loops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.formats import (
    E2M1_VALUES,
    FORMATS,
    FormatError,
    bf16_decode,
    bf16_encode,
    bf16_round,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    e4m3_table,
    encoded_size,
    f16_rne,
    get_format,
)

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
ROWWISE = [*GROUPED, "NVFP4G16_E4M3S", "FP8E4M3_F32ROW", "FP8E4M3_F32T"]


def _randn(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _edge_f32() -> np.ndarray:
    vals = [0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.17e-38, 65504.0, 65520.0, 448.0, 464.0]
    return np.array(vals, dtype=np.float32)


# ---- scalar codecs -------------------------------------------------------------------------------------
def test_bf16_matches_torch_rne():
    x = np.concatenate([_randn(100_000, 1, 1e3), _edge_f32(), np.array([np.inf, -np.inf], np.float32)])
    # values exactly halfway between two bf16 numbers: both tie directions
    ties = (np.arange(0, 1 << 16, 97, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    x = np.concatenate([x, ties[np.isfinite(ties)]])
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_encode(x), want)


def test_bf16_all_words_round_trip_and_nan_kept():
    w = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    f = bf16_decode(w)
    back = bf16_encode(f)
    nan = np.isnan(f)
    np.testing.assert_array_equal(back[~nan], w[~nan])
    assert np.isnan(bf16_decode(back[nan])).all()
    np.testing.assert_array_equal(np.signbit(bf16_decode(back[nan])), np.signbit(f[nan]))
    x = _randn(10_000, 2)
    assert (np.abs(bf16_round(x) - x) <= np.abs(x) * 2.0**-8).all()


def test_e4m3_all_codes_round_trip_and_decode_matches_torch():
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(e4m3_encode(e4m3_decode(codes)), codes)
    ref = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    np.testing.assert_array_equal(e4m3_table(), ref)  # NaN positions compare equal
    assert e4m3_table()[0x7E] == 448 and e4m3_table()[1] == 2.0**-9 and e4m3_table()[8] == 2.0**-6


def test_e4m3_encode_matches_torch_and_saturates():
    t = e4m3_table()[:127].astype(np.float64)
    mids = ((t[:-1] + t[1:]) / 2).astype(np.float32)
    x = np.concatenate([_randn(200_000, 3, 50.0), mids, np.nextafter(mids, 0), _edge_f32()])
    x = np.concatenate([x, -x])
    inside = np.abs(x) < 464  # torch's cast is non-saturating above the 448/480 midpoint
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(e4m3_encode(x)[inside], want[inside])
    big = np.array([464.0, 1e6, np.inf, -500.0, -np.inf], np.float32)
    np.testing.assert_array_equal(e4m3_encode(big), [0x7E, 0x7E, 0x7E, 0xFE, 0xFE])
    assert e4m3_encode(np.array([np.nan, -np.nan], np.float32)).tolist() == [0x7F, 0xFF]


def _e2m1_modelopt(x: np.ndarray) -> np.ndarray:
    """ModelOpt's threshold form: searchsorted on the bounds, ties at odd bounds go up."""
    bounds = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    a = np.abs(x)
    ordv = np.searchsorted(bounds, a, side="left") + np.isin(a, bounds[[1, 3, 5]])
    return ordv.astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 3)


def test_e2m1_codes_and_modelopt_thresholds():
    codes = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(e2m1_encode(e2m1_decode(codes)), codes)
    assert E2M1_VALUES[8] == 0 and np.signbit(E2M1_VALUES[8])
    grid = np.array([0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, 7, 100], np.float32)
    x = np.concatenate(
        [_randn(100_000, 4, 3.0), grid, -grid, np.nextafter(grid, 10), np.nextafter(grid, -10)]
    )
    np.testing.assert_array_equal(e2m1_encode(x), _e2m1_modelopt(x))
    np.testing.assert_array_equal(e2m1_decode(e2m1_encode(grid))[:8], [0, 0, 1, 1, 2, 2, 4, 4])


def test_f16_rne_matches_torch():
    x = np.concatenate(
        [_randn(100_000, 5, 1e-3), _randn(1000, 6, 1e5), _edge_f32(), np.float32([6e-8, 3e-8])]
    )
    want = torch.from_numpy(x).half().numpy()
    np.testing.assert_array_equal(f16_rne(x).view(np.uint16), want.view(np.uint16))


# ---- group-int -----------------------------------------------------------------------------------------
def _scalar_groupint(row: np.ndarray, qmax: int, qmin: int, g: int) -> tuple[list[int], list[int]]:
    """Per-element MAXABS_F16_RECIP_RNE_V1 over one row already padded to K_pad (codes, f16 scale words)."""
    codes, words = [], []
    for a in range(0, row.size, g):
        grp = row[a : a + g]
        amax = max(abs(float(v)) for v in grp)
        if amax == 0:
            codes += [0] * g
            words.append(0)
            continue
        s = np.float16(np.float32(np.float32(amax) / np.float32(qmax)))
        if s == 0:
            s = np.uint16(1).view(np.float16)
        inv = np.float32(1) / np.float32(s)
        for v in grp:
            p = float(np.float32(v) * inv)
            q = round(p)  # Python's round is ties-to-even
            codes.append(min(max(q, qmin), qmax))
        words.append(int(np.float16(s).view(np.uint16)))
    return codes, words


@pytest.mark.parametrize("fid", GROUPED)
def test_groupint_matches_scalar_encoder(fid):
    fmt = FORMATS[fid]
    x = _randn((3, 200), 7)
    x[1, 64:128] = 0  # all-zero group
    x[2, :64] *= 1e-9  # 2^-24 rescue and subnormal scales
    x[2, 64] = 3e4
    x[2, 128:192] *= 1e-5  # subnormal f16 scales
    buf = fmt.encode(x)
    assert buf.size == fmt.encoded_size(x.shape)
    scale_words = fmt.views(buf, x.shape)["scale"].view(np.uint16)
    got_codes = fmt.codes(buf, x.shape, 0, 3)
    for r in range(3):
        padded = np.zeros(256, np.float32)
        padded[:200] = x[r]
        codes, words = _scalar_groupint(padded, fmt.qmax, fmt.qmin, fmt.group)
        assert got_codes[r].tolist() == codes
        assert scale_words[r].tolist() == words
    assert scale_words[1, 64 // fmt.group] == 0
    s = fmt.views(buf, x.shape)["scale"].astype(np.float32)
    per = np.repeat(s, fmt.group, axis=1)[:, :200]
    err = np.abs(fmt.decode(buf, x.shape) - x)
    assert (err <= groupint_bound(per, x, fmt.qmax)).all()
    normal = per >= 2.0**-14
    assert (err[normal] <= per[normal] * (0.5 + fmt.qmax * 2.0**-23)).all()


def groupint_bound(per_scale: np.ndarray, x: np.ndarray, qmax: int) -> np.ndarray:
    """Documented group-int bound: half a step, plus the clamp excess possible with subnormal scales."""
    return per_scale * (0.5 + qmax * 2.0**-23) + np.maximum(0, np.abs(x) - (qmax + 0.5) * per_scale)


def _scalar_pack(q: list[int], bits: int) -> tuple[bytes, bytes]:
    """Base and high plane bytes of one row of codes, bit by bit as the spec words it."""
    u = [v % (1 << bits) for v in q]
    if bits == 8:
        return bytes(u), b""
    base = bytes((u[2 * j] & 0xF) | ((u[2 * j + 1] & 0xF) << 4) for j in range(len(u) // 2))
    high = bytearray(len(u) * (bits - 4) // 8)
    for i, v in enumerate(u):
        for k in range(bits - 4):  # lane i's high bits at stream position i*(bits-4)+k
            pos = i * (bits - 4) + k
            high[pos // 8] |= ((v >> (4 + k)) & 1) << (pos % 8)
    return base, bytes(high)


@pytest.mark.parametrize("fid", GROUPED)
def test_groupint_plane_layout(fid):
    fmt = FORMATS[fid]
    rng = np.random.default_rng(8)
    shape = (2, 130)
    x = rng.integers(-fmt.qmax, fmt.qmax + 1, shape).astype(np.float32)
    x[:, 0::32] = fmt.qmax  # every group has amax = qmax: scale = f16(qmax/qmax) = 1, codes equal x
    buf = fmt.encode(x)
    geo = fmt.geometry(shape)
    q = np.zeros((2, 256), np.int64)
    q[:, :130] = x
    for r in range(2):
        base, high = _scalar_pack(q[r].tolist(), fmt.bits)
        nb, nh = len(base), len(high)
        assert bytes(buf[r * nb : (r + 1) * nb]) == base
        assert bytes(buf[geo["hi"] + r * nh : geo["hi"] + (r + 1) * nh]) == high
    scales = fmt.views(buf, shape)["scale"]
    gl = 130 // fmt.group + 1  # logical groups; later ones are padding
    assert (scales[:, :gl] == 1).all() and (scales[:, gl:] == 0).all()
    np.testing.assert_array_equal(fmt.decode(buf, shape), x)


def test_groupint_multiplies_by_reciprocal():
    # s = f16(8.39453125 / 7) = 1.19921875 and x = 3.5 * s: x / s is exactly 3.5 (-> 4) while f32(x * f32(1/s))
    # falls just below 3.5 (-> 3); the normative order gives 3.
    s, x = np.float32(1.19921875), np.float32(4.197265625)
    assert np.rint(x / s) == 4 and np.rint(x * (np.float32(1) / s)) == 3
    row = np.zeros((1, 64), np.float32)
    row[0, :2] = [7 * s, x]
    fmt = FORMATS["Q4G64_F16S"]
    assert fmt.codes(fmt.encode(row), row.shape, 0, 1)[0, :2].tolist() == [7, 3]


def test_q5_reference_size_and_geometry():
    assert encoded_size("Q5G64_F16S", [2, 130]) == 528
    geo = FORMATS["Q6G64_F16S"].geometry((3, 64))
    assert (geo["hi"], geo["sc"], geo["total"]) == (256, 512, 524)
    assert encoded_size("Q4G64_F16S", (1, 1)) == 256 + 4


def test_groupint_rejects_bad_input():
    fmt = FORMATS["Q4G64_F16S"]
    x = _randn((2, 64), 9)
    x[1, 5] = np.nan
    with pytest.raises(FormatError, match="non-finite.*index \\[1, 5\\]"):
        fmt.encode(x)
    with pytest.raises(FormatError, match="float16 scale range"):
        fmt.encode(np.full((1, 64), 1e6, np.float32))
    with pytest.raises(FormatError, match="rank >= 2"):
        fmt.encode(np.ones(64, np.float32))
    with pytest.raises(FormatError, match="needs 260 bytes, got 259"):
        fmt.decode(np.zeros(259, np.uint8), (1, 64))
    bad = FORMATS["W8G32_F16S"].encode(np.ones((1, 32), np.float32))
    bad[3] = 0x80
    with pytest.raises(FormatError, match="illegal code 0x80"):
        FORMATS["W8G32_F16S"].decode(bad, (1, 32))
    with pytest.raises(FormatError, match="unknown weight format 'Q3'"):
        get_format("Q3")


# ---- NVFP4 ---------------------------------------------------------------------------------------------
def test_nvfp4_matches_independent_computation():
    fmt = FORMATS["NVFP4G16_E4M3S"]
    x = _randn((4, 150), 10)
    x[1, 16:32] = 0  # all-zero block
    x[2, :16] *= 1e-6  # block scale clamped to 2^-9
    buf = fmt.encode(x)
    v = fmt.views(buf, x.shape)
    g = np.float32(np.abs(x).max() / np.float32(2688))
    assert v["global"][0] == g
    xp = np.zeros((4, 256), np.float32)
    xp[:, :150] = x
    blocks = torch.from_numpy(xp.reshape(4, 16, 16))
    amax_b = blocks.abs().amax(-1)
    sb = (amax_b / (6 * torch.tensor(g))).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    sb = np.where(amax_b.numpy() == 0, 0, np.maximum(sb, 1))
    np.testing.assert_array_equal(v["scale"], sb)
    d = torch.from_numpy(sb.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy() * g
    codes = _e2m1_modelopt(xp.reshape(4, 16, 16) / np.where(d == 0, 1, d)[..., None]).reshape(4, 256)
    codes[np.repeat(d == 0, 16, axis=1)] = 0
    np.testing.assert_array_equal(v["codes"], codes[:, 0::2] | (codes[:, 1::2] << 4))
    assert (v["scale"][:, 10:] == 0).all()  # padding blocks (150 -> 256 columns)


@pytest.mark.parametrize("scale", [1.0, 1e-20, 1e30])
def test_nvfp4_error_bound(scale):
    fmt = FORMATS["NVFP4G16_E4M3S"]
    x = _randn((8, 200), 11, scale) * np.exp(_randn((8, 1), 12)).astype(np.float32)
    buf = fmt.encode(x)
    w = fmt.decode(buf, x.shape)
    v = fmt.views(buf, x.shape)
    d = np.repeat(e4m3_decode(v["scale"]) * v["global"][0], 16, axis=1)[:, :200]
    bound = d + np.maximum(0, np.abs(x) - 6 * d)
    assert (np.abs(w - x) <= bound * (1 + 1e-6)).all()
    amax_b = np.repeat(np.abs(np.pad(x, ((0, 0), (0, 56)))).reshape(8, 16, 16).max(-1), 16, axis=1)[:, :200]
    normal = e4m3_decode(v["scale"]) >= 2.0**-6
    ok = np.repeat(normal, 16, axis=1)[:, :200]
    assert (np.abs(w - x)[ok] <= (amax_b * ((1 + 2**-4) / 6 + 1 / 16))[ok]).all()
    assert np.abs(w).max() <= np.abs(x).max() * (1 + 1e-6)


def test_nvfp4_zero_and_flush():
    fmt = FORMATS["NVFP4G16_E4M3S"]
    for x in (np.zeros((2, 32), np.float32), np.full((2, 32), 1e-35, np.float32)):
        buf = fmt.encode(x)
        assert not buf.any()
        assert (fmt.decode(buf, x.shape) == 0).all()


# ---- FP8 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fid", ["FP8E4M3_F32ROW", "FP8E4M3_F32T"])
def test_fp8_codes_and_bound(fid):
    fmt = FORMATS[fid]
    x = _randn((6, 70), 13) * np.float32([[1], [1e-3], [0], [1e20], [1e-30], [5]])
    buf = fmt.encode(x)
    v = fmt.views(buf, x.shape)
    amax = np.abs(x).max(axis=1) if fid.endswith("ROW") else np.abs(x).max(keepdims=True).reshape(1)
    np.testing.assert_array_equal(v["scale"], (amax / np.float32(448)).astype(np.float32))
    s = np.broadcast_to(v["scale"].reshape(-1, 1), (6, 1)).astype(np.float32)
    ref = torch.from_numpy(x / np.where(s == 0, 1, s)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(v["codes"], np.where(s == 0, 0, ref))
    w = fmt.decode(buf, x.shape)
    assert (np.abs(w - x) <= (2.0**-4 * np.abs(x) + 2.0**-10 * s) * (1 + 1e-6)).all()
    if fid.endswith("ROW"):
        assert (w[2] == 0).all() and (np.abs(w[4] - x[4]) <= 2.0**-4 * np.abs(x[4]) * 1.00001 + 1e-45).all()


# ---- common contract -----------------------------------------------------------------------------------
SHAPES = [(1, 1), (3, 64), (5, 128), (2, 3, 129), (7, 300), (4, 1000)]


@pytest.mark.parametrize("fid", sorted(FORMATS))
def test_sizes_rows_and_rank3(fid):
    fmt = FORMATS[fid]
    for i, shape in enumerate(SHAPES):
        x = _randn(shape, 20 + i)
        if fid == "I32":
            x = np.random.default_rng(i).integers(-(2**31), 2**31, shape)
        buf = fmt.encode(x)
        assert buf.dtype == np.uint8 and buf.size == fmt.encoded_size(shape) == encoded_size(fid, list(shape))
        full = fmt.decode(bytes(buf), shape)
        assert full.shape == shape
        rows = full.reshape(-1, shape[-1])
        n = rows.shape[0]
        for r0, r1 in ((0, n), (n // 2, n), (n - 1, n), (1 % n, max(1 % n, n - 1))):
            np.testing.assert_array_equal(fmt.decode_rows(memoryview(buf), shape, r0, r1), rows[r0:r1])
        flat = fmt.encode(x.reshape(-1, shape[-1]))
        np.testing.assert_array_equal(flat, buf)  # rank-3 == its 2-D row view
    with pytest.raises(FormatError, match="row range"):
        fmt.decode_rows(fmt.encode(_randn((2, 8), 0) if fid != "I32" else np.ones((2, 8), int)), (2, 8), 1, 3)


def test_direct_formats_exact_and_scalar():
    x = bf16_round(_randn((3, 5), 30))
    x[0, 0] = np.nan
    x[0, 1] = -0.0
    for fid in ("BF16", "FP32"):
        fmt = FORMATS[fid]
        y = fmt.decode(fmt.encode(x), x.shape)
        np.testing.assert_array_equal(y.view(np.uint32)[~np.isnan(x)], x.view(np.uint32)[~np.isnan(x)])
        assert np.isnan(y[0, 0])
        assert fmt.decode(fmt.encode(np.float32(2.5), ()), ()).item() == 2.5
    ids = np.array([0, 248319, -5, 2**31 - 1])
    np.testing.assert_array_equal(FORMATS["I32"].decode(FORMATS["I32"].encode(ids), (4,)), ids)
    with pytest.raises(FormatError, match="integer array"):
        FORMATS["I32"].encode(np.ones(3, np.float32))
    with pytest.raises(FormatError, match="does not fit shape"):
        FORMATS["BF16"].encode(np.ones(6, np.float32), (2, 2))


@pytest.mark.parametrize("fid", ROWWISE)
def test_quantized_reject_nonfinite_and_rank1(fid):
    fmt = FORMATS[fid]
    x = np.ones((2, 16), np.float32)
    x[0, 3] = np.inf
    with pytest.raises(FormatError, match="non-finite"):
        fmt.encode(x)
    with pytest.raises(FormatError, match="rank"):
        fmt.encoded_size((16,))
