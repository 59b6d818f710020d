"""The pair mode's host orchestration (ninfer/cuda/gemm_pair.py) without a GPU: the three kernels emulated in NumPy
on the arrays the wrapper passes (views in place of device pointers), so the chunk loops, the scratch slices, the
per-row scale plane offsets, the output views and the launch geometry are checked against the reference with and
without chunking. The kernels themselves: tests/test_gemm_pair_host.py (CPU) and tests/test_cuda_gemm_pair.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ninfer.cuda.gemm_pair as gp
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS, bf16_decode
from ninfer.formats.fp8 import e4m3_decode
from ninfer.reference import ops


def _rne(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class _Kernel:
    """A launch of one emulated kernel: checks the geometry, then runs ``body`` on the arguments."""

    def __init__(self, name: str, log: list[tuple[str, tuple[int, ...]]]) -> None:
        self.name, self.log, self.max_dynamic_shared_size_bytes = name, log, 0

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], **kw: Any
    ) -> None:
        self.log.append((self.name, grid))
        assert block == (256,)
        getattr(self, "_" + self.name.split("<")[0])(grid, args, **kw)

    def _split_hilo(self, grid: tuple[int, ...], a: tuple[Any, ...]) -> None:
        x, hi, lo, m, k, ldx = a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5])
        assert grid[0] * 256 >= m * k // 8 and x.shape == (m, k) and ldx == x.strides[0] // 4
        h = _rne(x)
        hi[:] = h.reshape(-1)
        lo[:] = _rne(x - bf16_decode(h)).reshape(-1)

    def _dequant90(
        self, grid: tuple[int, ...], a: tuple[Any, ...]
    ) -> None:  # FP8 codes [N, K] -> bf16 values
        p0, w, rows, k, n0 = a[0], a[3], int(a[4]), int(a[5]), int(a[6])
        assert grid == (-(-k // 64), -(-rows // 256))
        w[: rows * k] = _rne(e4m3_decode(p0[n0 * k : (n0 + rows) * k]))

    def _gemm90_pair(self, grid: tuple[int, ...], a: tuple[Any, ...], shared_mem: int) -> None:
        p0, p1, hi, lo, y = a[0], a[1], a[3], a[4], a[5]
        rows, cols, k, ldx = int(a[6]), int(a[7]), int(a[8]), int(a[9])
        assert shared_mem == 232448 and grid == (-(-rows // 128) * -(-cols // 256),) and ldx == k
        assert y.shape == (rows, cols) and hi.size == lo.size == rows * k
        w = bf16_decode(np.asarray(p0).view(np.uint16)[: cols * k]).reshape(cols, k).astype(np.float64)
        x = bf16_decode(hi).reshape(rows, k).astype(np.float64) + bf16_decode(lo).reshape(rows, k)
        scale = np.frombuffer(p1[: 4 * cols].tobytes(), np.float32) if self.name.find("FP8") > 0 else 1.0
        y[...] = (x @ w.T) * scale


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...]]]:
    monkeypatch.setattr(gp, "_scratch", lambda kind, n: np.full(n, 0xFFFF, np.uint16))
    return []


@pytest.mark.parametrize("fmt", ["FP8E4M3_F32ROW", "BF16"])
@pytest.mark.parametrize("caps", [None, (2 * 256, 4 * 128)])
def test_pair_orchestration(fake: list, monkeypatch: pytest.MonkeyPatch, fmt: str, caps: Any) -> None:
    rng = np.random.default_rng(3)
    m, n, k = 300, 700, 136
    if caps:  # 256-row weight chunks and 128-row activation chunks
        monkeypatch.setattr(gp, "_W_CAP", caps[0] * k)
        monkeypatch.setattr(gp, "_X_CAP", caps[1] * k)
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode(rng.standard_normal((n, k)).astype(np.float32), (n, k)).view(np.uint8)
    )
    w = DeviceWeight(fmt, (n, k), buf.reshape(-1), tuple(plane_offsets(fmt, (n, k), buf)))
    wf = codec.decode(buf, (n, k))
    xs = np.full((m, k + 8), np.nan, np.float32)
    xs[:, :k] = rng.standard_normal((m, k))
    x = xs[:, :k]
    out = np.full((m, n + 5), np.nan, np.float32)
    gp.gemm_pair(x, w, out[:, 2 : 2 + n], (m, n, k, k + 8, n + 5), lambda name: _Kernel(name, fake))
    assert np.isnan(out[:, :2]).all() and np.isnan(out[:, 2 + n :]).all()
    got = out[:, 2 : 2 + n]
    ref = ops.linear(x, wf)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    names = [nm.split("<")[0] for nm, _ in fake]
    mchunks, nchunks = (3, 3) if caps else (1, 1)
    assert names.count("split_hilo") == mchunks and names.count("gemm90_pair") == mchunks * (
        nchunks if fmt != "BF16" else 1
    )
    deq = names.count("dequant90")
    assert deq == (0 if fmt == "BF16" else (1 if nchunks == 1 else mchunks * nchunks))


def test_pair_scratch_bound() -> None:
    """The memory plan's bound covers what a GEMM's plan takes, chunked or not."""
    for m, n, k in ((128, 34816, 5120), (8192, 5120, 17408), (8192, 34816, 5120), (30000, 248320, 5120)):
        mx, nw = gp._plan("NVFP4G16_E4M3S", m, n, k)
        assert 4 * mx * k + 2 * nw * k <= gp.pair_scratch_bytes(m, k, n * k)
    assert gp.pair_scratch_bytes(gp.PAIR_MIN_ROWS - 1, 5120, 10**8) == 0


def test_f16_auto_ws_by_rows_and_weight_size() -> None:
    """``variant="auto"``: the ws kernel from F16_WS_ROWS rows for every weight, from F16_WS_WIDE_ROWS for wide ones
    (the 27B's gate|up and down projections at a 256-token follow-up), and from F16_WS_SPLIT_ROWS wherever split-K
    applies (the narrow projections with few tiles); the cp.async kernel elsewhere."""
    up, down, o_proj, qkv = (34816, 5120), (5120, 17408), (5120, 6144), (10240, 5120)
    assert gp.F16_WS_SPLIT_ROWS <= gp.F16_WS_WIDE_ROWS < gp.F16_WS_ROWS
    assert up[0] * up[1] >= gp.F16_WS_WIDE_ELEMS > down[0] * down[1]
    for n, k in (up, down):  # down: by its split from 128 rows (gate|up: by its size)
        assert gp.f16_auto_ws(256, n, k) and gp.f16_auto_ws(gp.F16_WS_WIDE_ROWS, n, k)
    assert not gp.f16_auto_ws(gp.F16_WS_WIDE_ROWS - 1, *up), (
        "272 tiles at 255 rows: no split, not wide enough"
    )
    for n, k in (o_proj, qkv, up, down):
        for m in (gp.F16_WS_SPLIT_ROWS, 200, 256, 300, gp.F16_WS_ROWS - 1):
            wide = m >= gp.F16_WS_WIDE_ROWS and n * k >= gp.F16_WS_WIDE_ELEMS
            assert gp.f16_auto_ws(m, n, k) == (wide or gp.splitk_splits(m, n, k) > 1), (m, n, k)
        assert not gp.f16_auto_ws(gp.F16_WS_SPLIT_ROWS - 1, n, k)
        assert gp.f16_auto_ws(gp.F16_WS_ROWS, n, k) and gp.f16_auto_ws(8192, n, k)
    assert gp.f16_auto_ws(256, *down) and not gp.f16_auto_ws(256, *o_proj), "272 K steps split, 96 do not"
    assert not gp.f16_auto_ws(256, *qkv), "80 tiles, 80 K steps: cp"


# the 27B's dense projections (N, K): attention q|gate|k|v, o / GDN out, GDN in, MLP gate|up, down
SHAPES_27B = ((14336, 5120), (5120, 6144), (16480, 5120), (34816, 5120), (5120, 17408))


def test_splitk_rule() -> None:
    """S = 1 from one wave of tiles (the 2K-8K-row prefill chunks keep the unsplit kernel); otherwise at most
    SPLITK_MAX splits of at least SPLITK_MIN_KSTEPS K tiles; S depends on the tile counts only; the 27B follow-up
    turn's narrow projections fill about a wave."""
    for n, k in SHAPES_27B:
        nk = -(-k // 64)
        for m in range(1, 8193, 37):
            s = gp.splitk_splits(m, n, k)
            tiles = -(-m // 128) * -(-n // 256)
            assert 1 <= s <= gp.SPLITK_MAX and (s == 1 or nk // s >= gp.SPLITK_MIN_KSTEPS)
            if tiles >= gp.SPLITK_WAVE:
                assert s == 1, (m, n, k)
            tm, tn = -(-m // 128), -(-n // 256)
            assert s == gp.splitk_splits(128 * tm, 256 * tn, 64 * nk), "a function of the tile counts"
        for m in (2048, 4096, 8192):
            assert gp.splitk_splits(m, n, k) == 1
    # 40 tiles: three splits fill 120 of 132 SMs in one round (four would take two rounds of a quarter of K); the
    # o-projection's 96 K tiles are too short for splits of SPLITK_MIN_KSTEPS (measured slower at every S)
    assert gp.splitk_splits(256, 5120, 17408) == 3 and gp.splitk_splits(256, 5120, 6144) == 1
    assert gp.splitk_splits(256, 34816, 5120) == 1, "272 tiles: more than a wave"
    assert gp.splitk_splits(8, 5120, 256) == 1, "K of 4 tiles: too short to split"


def test_splitk_scratch_bound() -> None:
    """splitk_scratch_bytes covers every launch of at most ``rows`` rows (from PAIR_MIN_ROWS) against the shapes,
    and is 0 where no launch splits."""
    for rows in (128, 300, 1000, 2048):
        bound = gp.splitk_scratch_bytes(rows, SHAPES_27B)
        most = max(
            4 * gp.splitk_splits(m, n, k) * m * n * (gp.splitk_splits(m, n, k) > 1)
            for n, k in SHAPES_27B
            for m in range(gp.PAIR_MIN_ROWS, rows + 1)
        )
        assert bound == most, rows
    assert gp.splitk_scratch_bytes(gp.PAIR_MIN_ROWS - 1, SHAPES_27B) == 0
    assert gp.splitk_scratch_bytes(8192, [(34816, 5120)]) == 0


def test_memory_plan_counts_splitk() -> None:
    """The runner's plan adds the split-K workspace of the model's own dense shapes."""
    from ninfer.artifact.registry import MODELS
    from ninfer.cuda import memory_plan as mp

    for key in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        mc = MODELS[key].config
        shapes = mp._dense_shapes(mc)
        assert shapes and all(n > 0 and k > 0 for n, k in shapes)
        split = gp.splitk_scratch_bytes(2048, shapes)
        assert (split > 0) == (key == "qwen3.6-27b"), key  # the 35B-A3B's dense K are too short to split
        assert mp._gemm_scratch(mc, 2048) >= split
