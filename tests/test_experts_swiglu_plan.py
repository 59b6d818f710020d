"""The MoE gate | up fold's host orchestration (ninfer/cuda/experts_swiglu.py) without a GPU: where it applies
(experts_swiglu_ok: formats, shapes, modes, never values), and its launches through emulated kernels against the
two-array path's (gemm.gemm_experts with ``rows=`` then ``swiglu=True``): the kernels, grids and arguments, ``h``
bitwise the emulated SwiGLU of the [gate | up] output, the tile maxima the rows' largest ``|h|`` per 128 features,
the down projection's fp16 rows (split_f16row_max from the maxima) and output bitwise the per-slot split's. The
emulated gate | up kernel computes each tile from the rows the kernel's contract names (gate rows e 2I + 128 nt ..,
up rows e 2I + I + 128 nt ..) over the tile table it is given; the kernels themselves: tests/test_gemm_gate_up_host.py
(CPU) and tests/test_cuda_experts_swiglu.py (device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_gemm_pair_plan import _Experts, _fp8_weight, _Kernel

import ninfer.cuda.experts_swiglu as es
import ninfer.cuda.gemm as gm
import ninfer.cuda.gemm_swiglu as gs
from ninfer.cuda import gemm_rows
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS
from ninfer.formats.fp8 import e4m3_decode

F32 = np.float32


def _swiglu32(gu: np.ndarray, k: int) -> np.ndarray:
    """The kernels' silu(g) * u in float32 (either path's emulation: the same function, so the same bits)."""
    g, u = gu[:, :k].astype(F32), gu[:, k : 2 * k].astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        return ((g / (F32(1) + np.exp(-g))) * u).astype(F32)


def _f16_rows(v: np.ndarray, amax: np.ndarray, xh: np.ndarray, rowf: np.ndarray) -> None:
    """split_f16row's arithmetic with the row maxima given (ops.round_fp16_rows' scale)."""
    e = ((amax.astype(F32).view(np.uint32) >> 23) & 0xFF).astype(np.int32)
    k = np.clip(141 - e, -126, 126)
    s = ((127 + k).astype(np.uint32) << 23).view(F32)[:, None]
    with np.errstate(over="ignore", under="ignore"):
        xh[...] = (v * s).astype(np.float16).view(np.uint16).reshape(xh.shape)
    rowf[:] = ((127 - k).astype(np.uint32) << 23).view(F32)


def _amax(v: np.ndarray) -> np.ndarray:
    """Each row's largest |v| by fmaxf from 0 (NaN ignored), as the kernels take it."""
    return np.fmax.reduce(np.abs(v), axis=1, initial=0.0).astype(F32) if v.size else np.zeros(len(v), F32)


class _Split(_Kernel):
    """_Kernel with the SwiGLU row split (split_f16row_in<false, true>) and split_f16row_max emulated."""

    def _split_f16row_in(self, grid: tuple[int, ...], a: tuple[Any, ...], shared_mem: int) -> None:
        assert self.name == "split_f16row_in<false, true>"
        x, _, xh, rowf = a[:4]
        m, k = int(a[4]), int(a[5])
        assert grid == (m,) and x.shape == (m, 2 * k)
        v = _swiglu32(x, k)
        _f16_rows(v, _amax(v), xh, rowf)

    def _split_f16row_max(self, grid: tuple[int, ...], a: tuple[Any, ...]) -> None:
        h, tmax, xh, rowf = a[:4]
        m, k, tn = int(a[4]), int(a[5]), int(a[6])
        assert grid == (m,) and h.shape == (m, k) and tmax.shape == (m, tn) and tn == k // 128
        _f16_rows(h, np.fmax.reduce(tmax, axis=1, initial=0.0).astype(F32), xh, rowf)


class _ExpertsSW(_Experts):
    """_Experts with gemm90_experts_f16g_swiglu emulated tile by tile from its tile table: rows s0 .. of expert e,
    column tile nt from gate rows e n + 128 nt .. and up rows e n + n / 2 + 128 nt .., the [gate | up] values as
    the plain emulation computes them, then h and the tile's row maxima. ``rows``: the (fp16 words, factors)
    each gemm90_experts_f16 launch read."""

    rows: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], a: tuple[Any, ...], **kw: Any) -> None:
        if self.name.startswith("gemm90_experts_f16<"):
            _ExpertsSW.rows.append((np.array(a[3]).reshape(-1), np.array(a[4])))
        if not self.name.startswith("gemm90_experts_f16g_swiglu"):
            return super().__call__(grid, block, a, **kw)
        self.log.append((self.name, grid))
        assert block == (256,) and kw == {"shared_mem": 232448}
        p0, p1, _, xh, rows, rowf, h, tmax, off, tile_e, tile_s0, ntiles = a[:12]
        n, k, ldx, ldh = (int(v) for v in a[12:16])
        half, s = n // 2, self.ids.size
        assert ldx == k and ldh == half and h.shape == (s, half) and tmax.shape == (s, half // 128)
        assert grid[0] == n // 256 and grid[1] >= int(ntiles[0]) and rowf.shape == (s,)
        e = off.size - 1
        w = e4m3_decode(np.asarray(p0)[: e * n * k]).reshape(e, n, k).astype(np.float64)
        scale = np.frombuffer(np.asarray(p1)[: 4 * e * n].tobytes(), F32).reshape(e, n)
        x = xh.view(np.float16).reshape(-1, k)[rows].astype(np.float64)
        for t in range(int(ntiles[0])):
            ex, s0 = int(tile_e[t]), int(tile_s0[t])
            s1 = min(s0 + 128, int(off[ex + 1]))
            for nt in range(n // 256):
                f = np.arange(128 * nt, 128 * nt + 128)
                cols = np.concatenate([f, half + f])  # the tile's gate rows, then the same features' up rows
                gu = np.empty((s1 - s0, 256), F32)
                gu[...] = (x[s0:s1] @ w[ex, cols].T) * scale[ex, cols] * rowf[s0:s1, None]
                hv = _swiglu32(gu, 128)
                h[s0:s1, f] = hv
                tmax[s0:s1, nt] = _amax(hv)


def _tiles(ids: np.ndarray, e: int) -> tuple[Any, ...]:
    """expert_tiles' table (router.cu): per expert its slots in tiles of 128; bound = ceil(S / 128) + e."""
    counts = np.bincount(ids, minlength=e)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    pairs = [(x, s0) for x in range(e) for s0 in range(off[x], off[x + 1], 128)]
    te, ts = [p[0] for p in pairs], [p[1] for p in pairs]
    bound = -(-ids.size // 128) + e
    return off, np.asarray(te, np.int32), np.asarray(ts, np.int32), np.asarray([len(te)], np.int32), bound


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """gemm / experts_swiglu / gemm_swiglu on NumPy arrays with emulated kernels; returns the launch log."""
    import cupy

    st: dict[str, Any] = {"log": [], "ids": None}
    monkeypatch.setattr(_ExpertsSW, "rows", [])
    monkeypatch.setattr(gemm_rows, "_scratch", lambda kind, n: np.full(n, 0xFFFF, np.uint16))
    monkeypatch.setattr(cupy, "empty", lambda shape, dtype: np.full(shape, np.nan, dtype))
    monkeypatch.setattr(gm, "_hopper", lambda impl: impl != "mma")
    monkeypatch.setattr(gm, "capturing", lambda: False)
    for mod in (gm, es, gs):
        monkeypatch.setattr(mod, "check_array", lambda *a, **kw: None)
    rows = lambda a, w, out, what: ("float", a.shape[0], a.shape[1], a.strides[0] // 4)  # noqa: E731
    monkeypatch.setattr(gm, "matrix_args", rows)
    monkeypatch.setattr(es, "matrix_args", rows)
    monkeypatch.setattr(
        gm, "check_rows", lambda a, name, cols=None, **kw: (a.shape[0], a.shape[1], a.strides[0] // 4)
    )
    out = lambda a, o, m, n: (np.full((m, n), np.nan, F32), n)  # noqa: E731
    monkeypatch.setattr(gm, "matrix_out", out)
    monkeypatch.setattr(es, "matrix_out", out)
    monkeypatch.setattr(gm, "expert_tiles", _tiles)
    monkeypatch.setattr(gm, "_sm90_kernel", lambda nm: _Split(nm, st["log"]))
    monkeypatch.setattr(gm, "_gs_kernel", lambda nm: _ExpertsSW(nm, st["log"], st["ids"]))
    return st


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> DeviceWeight:
    if fmt == "FP8E4M3_F32ROW":
        return _fp8_weight(rng, n, k)
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(codec.encode(rng.standard_normal((n, k)).astype(F32), (n, k)).view(np.uint8))
    return DeviceWeight(fmt, (n, k), buf.reshape(-1), tuple(plane_offsets(fmt, (n, k), buf)))


def test_where_the_fold_applies(emu: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """experts_swiglu_ok: the fp16 mode for both products (float32 x, foldable formats, Hopper, no capture), the
    gate rows a multiple of 128, the down projection's input width I; nothing else is looked at."""
    rng = np.random.default_rng(3)
    x, xb = np.zeros((5, 64), F32), np.zeros((5, 64), np.uint16)
    wg, wd = _weight(rng, "FP8E4M3_F32ROW", 3 * 512, 64), _weight(rng, "FP8E4M3_F32ROW", 3 * 64, 256)
    assert es.experts_swiglu_ok(x, wg, wd, 512)
    assert not es.experts_swiglu_ok(x, wg, wd, 512, inputs="exact")
    assert not es.experts_swiglu_ok(x, wg, wd, 512, impl="mma")
    assert not es.experts_swiglu_ok(xb, wg, wd, 512), "bf16 activations: the exact kernels"
    wd128 = _weight(rng, "FP8E4M3_F32ROW", 3 * 64, 128)
    assert not es.experts_swiglu_ok(x, wg, wd128, 512), "the down projection's input is not I wide"
    w384 = _weight(rng, "FP8E4M3_F32ROW", 2 * 384, 64)
    assert not es.experts_swiglu_ok(x, w384, _weight(rng, "FP8E4M3_F32ROW", 64, 192), 384), "I = 192"
    assert not es.experts_swiglu_ok(x, wg, wd, 1024 + 256), "not whole experts"
    wbf = _weight(rng, "BF16", 3 * 512, 64)
    assert not es.experts_swiglu_ok(x, wbf, wd, 512), "BF16: no fp16 mode"
    assert not es.experts_swiglu_ok(x, object(), wd, 512)
    monkeypatch.setattr(gm, "capturing", lambda: True)
    assert not es.experts_swiglu_ok(x, wg, wd, 512), "graph capture"
    assert es.experts_swiglu_shape_ok("NVFP4G16_E4M3S", 1024)
    assert not es.experts_swiglu_shape_ok("W8G32_F16S", 1024)


@pytest.mark.parametrize(
    "case",
    [  # (tokens, I, K, hid, expert slot counts)
        (37, 128, 64, 48, [0, 50, 3, 0, 130]),  # empty first / inner experts, one over two row tiles
        (200, 256, 136, 72, [1, 0, 2]),  # fewer slots than tokens, K off the 64 tile, two column tiles
        (9, 384, 72, 40, [129, 0, 1, 0]),  # more slots than tokens, trailing empty expert, three column tiles
    ],
)
def test_fold_equals_two_array_path(emu: dict, case: tuple) -> None:
    """The fold's launches (split_f16row of the tokens, the gate | up kernel, split_f16row_max, the down kernel)
    against the two-array path's (split_f16row, gemm90_experts_f16g, split_f16row_in<false, true>,
    gemm90_experts_f16) on emulated kernels: h bitwise the SwiGLU of the [gate | up] output, the maxima its rows'
    per 128 features, the down output bitwise, the launches counted."""
    tokens, i, k, hid, counts = case
    rng = np.random.default_rng(11)
    e, n = len(counts), 2 * i
    ids = np.repeat(np.arange(e, dtype=np.int32), counts)
    emu["ids"] = ids
    rows = rng.integers(0, tokens, ids.size).astype(np.int32)
    xs = np.full((tokens, k + 8), np.nan, F32)
    xs[:, :k] = rng.standard_normal((tokens, k)) * 3
    xs[0, :4] = [0, 1e-30, 7e3, -(2.0**-60)]
    x = xs[:, :k]
    wg, wd = _weight(rng, "FP8E4M3_F32ROW", e * n, k), _weight(rng, "FP8E4M3_F32ROW", e * hid, i)
    assert es.experts_swiglu_ok(x, wg, wd, n)
    gu = gm.gemm_experts(x, wg, ids, n, inputs="fp16", rows=rows)
    want = gm.gemm_experts(gu, wd, ids, hid, inputs="fp16", swiglu=True)
    old = [nm for nm, _ in emu["log"]]
    assert old == ["split_f16row", "gemm90_experts_f16g<DqFP8<true>>", "split_f16row_in<false, true>",
                   "gemm90_experts_f16<DqFP8<true>>"]  # fmt: skip
    emu["log"].clear()
    before = gm.EXPERTS_LAUNCHES.copy()
    hs = es.gemm_experts_gate_up_swiglu(x, wg, ids, n, rows=rows)
    got = es.gemm_experts_down(hs, wd, ids, hid)
    new = [(nm, g) for nm, g in emu["log"]]
    assert [nm for nm, _ in new] == ["split_f16row", "gemm90_experts_f16g_swiglu<DqFP8<true>>",
                                     "split_f16row_max", "gemm90_experts_f16<DqFP8<true>>"]  # fmt: skip
    assert new[0][1] == (tokens,) and new[1][1] == (i // 128, -(-ids.size // 128) + e)
    assert gm.EXPERTS_LAUNCHES - before == {
        "gemm90_experts_f16g_swiglu<DqFP8<true>>": 1,
        "gemm90_experts_f16<DqFP8<true>>": 1,
    }
    h = _swiglu32(gu, i)
    assert np.array_equal(hs.h.view(np.uint32), h.view(np.uint32)), "h != swiglu of the [gate | up] output"
    tiles = np.stack([_amax(h[:, j : j + 128]) for j in range(0, i, 128)], axis=1)
    assert np.array_equal(hs.tmax, tiles) and np.array_equal(hs.tmax.max(axis=1), _amax(h))
    (xh0, f0), (xh1, f1) = _ExpertsSW.rows
    assert np.array_equal(xh1, xh0), "the down projection's fp16 words differ"
    assert np.array_equal(f1.view(np.uint32), f0.view(np.uint32)), "the row factors differ"
    assert np.isfinite(got).all() and np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
        "down differs"
    )


def test_no_slots(emu: dict) -> None:
    """No slots: empty h, maxima and output, nothing launched."""
    rng = np.random.default_rng(5)
    ids = np.zeros(0, np.int32)
    emu["ids"] = ids
    wg, wd = _weight(rng, "FP8E4M3_F32ROW", 2 * 256, 64), _weight(rng, "FP8E4M3_F32ROW", 2 * 32, 128)
    hs = es.gemm_experts_gate_up_swiglu(np.zeros((3, 64), F32), wg, ids, 256, rows=ids)
    assert hs.h.shape == (0, 128) and hs.tmax.shape == (0, 1)
    assert es.gemm_experts_down(hs, wd, ids, 32).shape == (0, 32) and emu["log"] == []


def test_refuses_where_it_does_not_apply(emu: dict) -> None:
    rng = np.random.default_rng(6)
    ids = np.zeros(4, np.int32)
    emu["ids"] = ids
    x = np.zeros((4, 64), F32)
    w384 = _weight(rng, "FP8E4M3_F32ROW", 2 * 192, 64)
    with pytest.raises(gm.KernelError, match="no epilogue"):
        es.gemm_experts_gate_up_swiglu(x, w384, ids, 384, rows=ids)
    wbf = _weight(rng, "BF16", 256, 64)
    with pytest.raises(gm.KernelError, match="no epilogue"):
        es.gemm_experts_gate_up_swiglu(x, wbf, ids, 256, rows=ids)
    hs = gs.SwigluRows(np.zeros((4, 128), F32), np.zeros((4, 1), F32))
    with pytest.raises(gm.KernelError, match="rows of 128"):
        es.gemm_experts_down(hs, _weight(rng, "FP8E4M3_F32ROW", 64, 256), ids, 64)
    assert emu["log"] == []
