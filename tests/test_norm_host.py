"""CPU check of cuda_src/norm.cu's rmsnorm and moe_combine_rmsnorm: the kernel text compiled by g++ under the CUDA
emulation prelude of tests/host/gdn_emu.cpp (std::thread per CUDA thread, real barriers; ``__shared__`` as
``static``), driven by tests/host/norm_driver.cpp and norm_combine_driver.cpp. Checks the chunk index arithmetic of
the 16-byte (VEC) and scalar instances, rows in one and in several register rounds (H > 8192), ragged H, against the
NumPy reference, and invariants: the VEC and scalar instances give the same bits, a row gives the same bits alone as
inside a batch, and the fused MoE combine gives the bits of the combine followed by rmsnorm.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator, words

from ninfer.formats import bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

F32 = np.float32
EPS = 1e-6


def _build(tmp_path_factory: pytest.TempPathFactory, name: str, driver: str) -> Path:
    """norm.cu under the emulation prelude with ``driver`` (``__shared__`` as ``static``)."""
    parts = ["gdn_emu.cpp", "#undef __shared__\n#define __shared__ static", "norm.cu", "emu_io.cpp", driver]
    return build_emulator(tmp_path_factory, name, parts)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "norm_emu", "norm_driver.cpp")


def _run(emu: Path, d: Path, x: np.ndarray, r: np.ndarray, w: np.ndarray, bf: bool, flags: tuple) -> tuple:
    d.mkdir(exist_ok=True)
    (bf16_encode(x) if bf else x).tofile(d / "x.bin")
    r.tofile(d / "r.bin")
    w.tofile(d / "w.bin")
    offset, resid, vec = flags
    args = [x.shape[0], x.shape[1], int(bf), int(offset), int(resid), int(vec), EPS]
    proc = subprocess.run([str(emu), str(d), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    y = np.fromfile(d / "y.bin", dtype=np.uint16 if bf else F32).reshape(x.shape)
    return y, np.fromfile(d / "r_out.bin", dtype=F32).reshape(x.shape)


CASES = (  # rows, H, bf16, offset, residual
    (3, 5120, False, True, True),
    (2, 5120, True, True, True),
    (2, 64, False, False, False),
    (2, 1000, True, False, True),
    (2, 8200, False, True, True),  # two register rounds
    (1, 20480, True, True, False),
    (2, 1003, False, True, True),  # ragged: scalar instance only
)


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c[0]}x{c[1]}{'bf16' if c[2] else 'f32'}o{c[3]:d}r{c[4]:d}"
)
def test_rmsnorm_emulated(emu: Path, tmp_path: Path, case: tuple) -> None:
    rows, h, bf, offset, resid = case
    rng = np.random.default_rng(rows * h)
    x = (rng.standard_normal((rows, h)) * 3).astype(F32)
    x = bf16_round(x) if bf else x
    r = rng.standard_normal((rows, h)).astype(F32)
    w = (rng.standard_normal(h) * 0.3).astype(F32)
    runs = {}
    for vec in (False, True) if h % 8 == 0 else (False,):
        runs[vec] = _run(emu, tmp_path / f"v{vec:d}", x, r, w, bf, (offset, resid, vec))
    y, r_out = runs[False]
    got = bf16_decode(y) if bf else y
    rr = ops.add_residual(r, x) if resid else x
    ref = ops.rmsnorm_offset(rr, w, EPS) if offset else ops.rmsnorm_plain(rr, EPS) * w
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    assert np.isfinite(got).all() and err <= (1.2e-2 if bf else 2e-5), f"error {err:.2e}"
    np.testing.assert_array_equal(r_out, rr if resid else r)
    if True in runs:  # 16-byte and scalar instances: same elements in the same order
        np.testing.assert_array_equal(runs[True][0], y, err_msg="VEC vs scalar output")
        np.testing.assert_array_equal(runs[True][1], r_out, err_msg="VEC vs scalar residual")
    # the last row alone: the same bits as inside the batch
    vec = h % 8 == 0
    y1, r1 = _run(emu, tmp_path / "alone", x[-1:], r[-1:], w, bf, (offset, resid, vec))
    np.testing.assert_array_equal(y1[0], runs[vec][0][-1], err_msg="row alone vs in a batch")
    np.testing.assert_array_equal(r1[0], runs[vec][1][-1])


@pytest.fixture(scope="module")
def emu_combine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "norm_combine_emu", "norm_combine_driver.cpp")


COMBINE_CASES = (  # rows, H, k, bf16, offset
    (3, 2048, 8, False, True),
    (2, 2048, 8, True, True),
    (2, 1003, 4, False, False),  # ragged: scalar instance only
    (2, 8200, 2, True, True),  # two register rounds: the output re-reads the residual
)


@pytest.mark.parametrize(
    "case", COMBINE_CASES, ids=lambda c: f"{c[0]}x{c[1]}k{c[2]}{'bf16' if c[3] else 'f32'}o{c[4]:d}"
)
def test_moe_combine_rmsnorm_emulated(emu_combine: Path, tmp_path: Path, case: tuple) -> None:
    """The MoE combine fused into the residual add + norm gives the bits of the combine followed by rmsnorm<RESID>
    (both instances), and the reference within the dtype's tolerance."""
    rows, h, k, bf, offset = case
    rng = np.random.default_rng(rows * h + k)
    slots = rows * k + rows
    dn = (rng.standard_normal((slots, h)) * 2).astype(F32)
    sh = rng.standard_normal((rows, h)).astype(F32)
    dn, sh = (bf16_round(dn), bf16_round(sh)) if bf else (dn, sh)
    where = rng.permutation(slots)[: rows * k].reshape(rows, k).astype(np.int32)
    ew, sg = rng.random((rows, k)).astype(F32), rng.standard_normal(rows).astype(F32)
    r, w = rng.standard_normal((rows, h)).astype(F32), (rng.standard_normal(h) * 0.3).astype(F32)
    for vec in (False, True) if h % 8 == 0 else (False,):
        d = tmp_path / f"v{vec:d}"
        d.mkdir()
        for name, a in (("dn", words(dn, bf)), ("sh", words(sh, bf)), ("where", where), ("ew", ew), ("sg", sg),
                        ("r", r), ("w", w)):  # fmt: skip
            a.tofile(d / f"{name}.bin")
        args = [rows, h, k, slots, int(bf), int(offset), int(vec), EPS]
        proc = subprocess.run(
            [str(emu_combine), str(d), *map(str, args)], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
        out = {
            n: np.fromfile(d / f"{n}.bin", dtype=np.uint16 if bf and n[0] == "y" else F32).reshape(rows, h)
            for n in ("y1", "r1", "y2", "r2")
        }
        np.testing.assert_array_equal(out["y2"], out["y1"], err_msg="fused vs combine + rmsnorm: output")
        np.testing.assert_array_equal(out["r2"], out["r1"], err_msg="fused vs combine + rmsnorm: residual")
    gate = 1 / (1 + np.exp(-sg.astype(np.float64)))[:, None]
    y = np.einsum("tk,tkh->th", ew.astype(np.float64), dn[where].astype(np.float64)) + gate * sh
    y = bf16_round(y.astype(F32)) if bf else y.astype(F32)
    rr = ops.add_residual(r, y)
    ref = ops.rmsnorm_offset(rr, w, EPS) if offset else ops.rmsnorm_plain(rr, EPS) * w
    got = bf16_decode(out["y2"]) if bf else out["y2"]
    err = float(np.max(np.abs(got.astype(np.float64) - ref)) / np.max(np.abs(ref)))
    assert np.isfinite(got).all() and err <= (1.2e-2 if bf else 2e-5), f"error {err:.2e}"
    # bf16: the kernel rounds its fp32 sum, the reference a float64 one: one bf16 step apart at a tie
    np.testing.assert_allclose(out["r2"], rr, rtol=1e-5, atol=float(np.abs(y).max()) * 2**-8 if bf else 1e-5)


@pytest.fixture(scope="module")
def emu_f16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "norm_f16_emu", "norm_f16_driver.cpp")


def _split_f16row(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """split_f16row of float rows (gemm_sm90.cu; ops.round_fp16_rows is its value): fp16 words, 2^-k per row."""
    amax = np.max(np.abs(y), axis=-1, keepdims=True)
    k = np.clip(141 - ((amax.view(np.uint32) >> 23) & 0xFF).astype(np.int32), -126, 126)
    s = ((127 + k).astype(np.uint32) << 23).view(F32)
    with np.errstate(over="ignore", under="ignore"):
        xh = (y * s).astype(np.float16).view(np.uint16)
    return xh, ((127 - k).astype(np.uint32) << 23).view(F32).reshape(-1)


F16_CASES = (  # combine, rows, H, k, offset, residual
    (0, 3, 5120, 0, True, True),  # the 27B's norms
    (0, 2, 2048, 0, True, False),
    (0, 2, 64, 0, False, True),
    (0, 1, 8192, 0, True, True),  # the longest row kept in registers
    (1, 3, 2048, 8, True, True),  # the 35B-A3B's input norms (the combine fused in)
    (1, 2, 512, 4, False, True),
    (2, 3, 128, 48, True, False),  # the 27B's GDN output norm (48 heads of 128): rows = tokens, k = heads
    (2, 2, 128, 32, True, False),  # the 35B-A3B's
    (2, 2, 96, 5, True, False),  # D and heads off the warp and block sizes
    (2, 2, 200, 27, True, False),  # rows of 8 registers per lane, 4 heads per warp
)


@pytest.mark.parametrize("case", F16_CASES, ids=lambda c: f"c{c[0]}-{c[1]}x{c[2]}k{c[3]}o{c[4]:d}r{c[5]:d}")
def test_norm_f16_rows_are_the_row_split(emu_f16: Path, tmp_path: Path, case: tuple) -> None:
    """rmsnorm_f16 / moe_combine_rmsnorm_f16 write bitwise split_f16row of what rmsnorm / moe_combine_rmsnorm store
    (fp16 words and the row factors), and the same residual; rows of very different scales (the row factor's clamp
    and fp16's subnormals) included."""
    combine, rows, h, k, offset, resid = case
    rng = np.random.default_rng(rows * h + k + 7)
    r = rng.standard_normal((rows, h)).astype(F32)
    w = (rng.standard_normal(h) * 0.3).astype(F32)
    w[: min(8, h)] = -1.0 if offset else 0.0  # exact zeros in the output
    slots = rows * k + rows
    files: dict[str, np.ndarray] = {"r": r, "w": w}
    if combine == 2:  # the gated norm: o [rows * k heads, h], z [rows, k * h]
        files = {"o": (rng.standard_normal((rows * k, h)) * 2).astype(F32), "w": w}
        files["o"][1, :8] = 1e-30
        files["z"] = rng.standard_normal((rows, k * h)).astype(F32)
    elif combine:
        files["dn"] = (rng.standard_normal((slots, h)) * 2).astype(F32)
        files["sh"] = rng.standard_normal((rows, h)).astype(F32)
        files["where"] = rng.permutation(slots)[: rows * k].reshape(rows, k).astype(np.int32)
        files["ew"], files["sg"] = rng.random((rows, k)).astype(F32), rng.standard_normal(rows).astype(F32)
    else:
        x = (rng.standard_normal((rows, h)) * 3).astype(F32)
        x[0, 8:40] = 1e-30  # tiny entries beside O(1) ones: fp16 subnormals and zeros after scaling
        files["x"] = x
    d = tmp_path / "run"
    d.mkdir()
    for name, a in files.items():
        a.tofile(d / f"{name}.bin")
    args = [combine, rows, h, k, slots, int(offset), int(resid), EPS]
    proc = subprocess.run(
        [str(emu_f16), str(d), *map(str, args)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    width = h * k if combine == 2 else h
    y = np.fromfile(d / "y.bin", dtype=F32).reshape(rows, width)
    xh = np.fromfile(d / "xh.bin", dtype=np.uint16).reshape(rows, width)
    rowf = np.fromfile(d / "rowf.bin", dtype=F32)
    want_xh, want_rowf = _split_f16row(y)
    np.testing.assert_array_equal(xh, want_xh, err_msg="fp16 words")
    np.testing.assert_array_equal(rowf.view(np.uint32), want_rowf.view(np.uint32), err_msg="row factors")
    if combine == 2:  # the register-resident gated kernel: the two-pass kernel's bits
        np.testing.assert_array_equal(np.fromfile(d / "xh_r.bin", dtype=np.uint16).reshape(rows, width), xh)
        np.testing.assert_array_equal(
            np.fromfile(d / "rowf_r.bin", dtype=F32).view(np.uint32), rowf.view(np.uint32)
        )
    np.testing.assert_array_equal(np.fromfile(d / "r2.bin", dtype=F32), np.fromfile(d / "r1.bin", dtype=F32))
    assert np.isfinite(y).all() and (y == 0).any() == (combine != 2)
