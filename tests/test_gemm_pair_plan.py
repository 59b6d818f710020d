"""The pair mode's host orchestration (ninfer/cuda/gemm_pair.py; its rules: gemm_plan.py, its row split and
scratch: gemm_rows.py) without a GPU: the three kernels emulated in NumPy on the arrays the wrapper passes (views
in place of device pointers), so the chunk loops, the scratch slices, the per-row scale plane offsets, the output
views and the launch geometry are checked against the reference with and without chunking; likewise the fp16 mode's
row split with the attention output gate (``gate=``), which path gemm.gemm takes for a gated input, and which row
split and kernel gemm.gemm_experts launches for each mode and input transform (the token rows read in place per
slot: bitwise the per-slot rows' product). The kernels themselves: tests/test_gemm_pair_host.py,
tests/test_gemm_f16_host.py (CPU) and tests/test_cuda_gemm_pair.py, tests/test_cuda_gemm_f16.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ninfer.cuda.gemm_pair as gp
import ninfer.cuda.gemm_plan as plan
from ninfer.cuda import gemm_rows
from ninfer.cuda.weights import DeviceWeight, plane_offsets
from ninfer.formats import FORMATS, bf16_decode
from ninfer.formats.fp8 import e4m3_decode
from ninfer.reference import ops


def _rne(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _sigmoid_gate(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """sigmoid_gate's element expression in float32: x * (1 / (1 + exp(-g)))."""
    with np.errstate(over="ignore"):
        return (x * (np.float32(1) / (np.float32(1) + np.exp(-g)))).astype(np.float32)


def _f16_split(v: np.ndarray, xh: np.ndarray, rowf: np.ndarray) -> None:
    """split_f16row's arithmetic (as ops.round_fp16_rows): fp16 words of each row times 2^k, and 2^-k."""
    e = ((np.max(np.abs(v), axis=1).view(np.uint32) >> 23) & 0xFF).astype(np.int32)
    k = np.clip(141 - e, -126, 126)
    s = ((127 + k).astype(np.uint32) << 23).view(np.float32)[:, None]
    with np.errstate(over="ignore", under="ignore"):
        xh[:] = (v * s).astype(np.float16).view(np.uint16).reshape(-1)
    rowf[:] = ((127 - k).astype(np.uint32) << 23).view(np.float32)


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
    ) -> None:  # FP8 codes [N, K] -> bf16 values (fp16 for the fp16 mode's <D, true>)
        p0, w, rows, k, n0 = a[0], a[3], int(a[4]), int(a[5]), int(a[6])
        assert grid == (-(-k // 64), -(-rows // 256))
        v = e4m3_decode(p0[n0 * k : (n0 + rows) * k])
        w[: rows * k] = v.astype(np.float16).view(np.uint16) if self.name.endswith(", true>") else _rne(v)

    def _split_f16row(self, grid: tuple[int, ...], a: tuple[Any, ...]) -> None:
        x, xh, rowf, m, k, ldx = a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5])
        assert grid == (m,) and x.shape == (m, k) and ldx == x.strides[0] // 4
        _f16_split(x, xh, rowf)

    def _split_f16row_gate(self, grid: tuple[int, ...], a: tuple[Any, ...], shared_mem: int) -> None:
        x, gate, xh, rowf = a[:4]
        m, k, ldx, d, ldg, keep = (int(v) for v in a[4:])
        assert grid == (m,) and x.shape == (m, k) and ldx == x.strides[0] // 4
        assert gate.shape == (m, 2 * k - d) and ldg == gate.strides[0] // 4  # qg[:, D:] of the chunk's rows
        assert keep == (4 * k <= gp._SPLIT_KEEP_BYTES) and shared_mem == (4 * k if keep else 0)
        assert self.max_dynamic_shared_size_bytes >= shared_mem
        # sigmoid_gate's read: head h's gates at 2 D h .. 2 D h + D of the view (qg[:, D:])
        g = np.concatenate([gate[:, 2 * d * h : 2 * d * h + d] for h in range(k // d)], axis=1)
        _f16_split(_sigmoid_gate(x, g), xh, rowf)

    def _gemm90_f16(self, grid: tuple[int, ...], a: tuple[Any, ...], shared_mem: int) -> None:
        p0, p1, xh, rowf, y = a[0], a[1], a[3], a[4], a[5]
        rows, cols, k, ldx = int(a[6]), int(a[7]), int(a[8]), int(a[9])
        assert shared_mem == 232448 and grid == (-(-rows // 128) * -(-cols // 256),) and ldx == k
        assert y.shape == (rows, cols) and xh.size == rows * k and rowf.size == rows
        w = np.asarray(p0).view(np.float16)[: cols * k].reshape(cols, k).astype(np.float64)
        x = xh.view(np.float16).reshape(rows, k).astype(np.float64)
        scale = np.frombuffer(p1[: 4 * cols].tobytes(), np.float32)
        y[...] = (x @ w.T) * scale * rowf[:, None]

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
    monkeypatch.setattr(gemm_rows, "_scratch", lambda kind, n: np.full(n, 0xFFFF, np.uint16))
    return []


@pytest.mark.parametrize("fmt", ["FP8E4M3_F32ROW", "BF16"])
@pytest.mark.parametrize("caps", [None, (2 * 256, 4 * 128)])
def test_pair_orchestration(fake: list, monkeypatch: pytest.MonkeyPatch, fmt: str, caps: Any) -> None:
    rng = np.random.default_rng(3)
    m, n, k = 300, 700, 136
    if caps:  # 256-row weight chunks and 128-row activation chunks
        monkeypatch.setattr(plan, "_W_CAP", caps[0] * k)
        monkeypatch.setattr(plan, "_X_CAP", caps[1] * k)
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


def test_splitk_tunables_reach_the_cached_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split rule's cache and the plans cached on knobs() are keyed on the SPLITK_* tunables: a patched one
    takes effect at once (no cache_clear), and the old answers come back with the old value."""
    fmt, m, n, k = "NVFP4G16_E4M3S", 256, 5120, 17408  # 40 tiles, 272 K steps: S = 3
    plan_of = lambda: plan._pair_plan(fmt, m, n, k, True, False, "ws", False, plan.knobs())  # noqa: E731
    assert gp.splitk_splits(m, n, k) == 3 and plan_of()[1] == 3
    with monkeypatch.context() as mp:
        mp.setattr(plan, "SPLITK_WAVE", 40)  # 40 tiles fill the wave: no split
        assert gp.splitk_splits(m, n, k) == 1 and plan_of()[1] == 1
        mp.setattr(plan, "SPLITK_WAVE", 132)
        mp.setattr(plan, "SPLITK_MAX", 2)
        assert gp.splitk_splits(m, n, k) == 2 and plan_of()[1] == 2
    assert gp.splitk_splits(m, n, k) == 3 and plan_of()[1] == 3


def test_splitk_scratch_bound() -> None:
    """splitk_scratch_bytes covers every launch of at most ``rows`` rows (from PAIR_MIN_ROWS) against the shapes,
    and is 0 where no launch splits."""

    def splits(
        m: int, n: int, k: int, group: bool
    ) -> int:  # the ws kernel's S, or the group kernel's (gemm_group)
        return gp.splitk_splits(m, 2 * n if group else n, k)

    # shapes where the group kernel's rule (twice the tiles) splits more than the ws kernel's: (768, 17408) at 2048
    # rows and (11648, 17408) at 128 (S 2 -> 4), so the bound must count it
    shapes = (*SHAPES_27B, (768, 17408), (11648, 17408))
    assert gp.splitk_splits(2048, 2 * 768, 17408) > gp.splitk_splits(2048, 768, 17408)
    for group in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plan, "GROUP_F16", group)
            for rows in (128, 300, 1000, 2048):
                bound = gp.splitk_scratch_bytes(rows, shapes)
                most = max(
                    4 * s * m * n * (s > 1)
                    for n, k in shapes
                    for m in range(gp.PAIR_MIN_ROWS, rows + 1)
                    for s in {splits(m, n, k, False), splits(m, n, k, group)}
                )
                assert bound == most, (rows, group)
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


def _fp8_weight(rng: np.random.Generator, n: int, k: int) -> DeviceWeight:
    codec = FORMATS["FP8E4M3_F32ROW"]
    buf = np.ascontiguousarray(
        codec.encode(rng.standard_normal((n, k)).astype(np.float32), (n, k)).view(np.uint8)
    )
    return DeviceWeight(
        "FP8E4M3_F32ROW", (n, k), buf.reshape(-1), tuple(plane_offsets("FP8E4M3_F32ROW", (n, k), buf))
    )


@pytest.mark.parametrize("caps", [None, (2 * 256, 4 * 128)])
def test_f16_gate_orchestration(fake: list, monkeypatch: pytest.MonkeyPatch, caps: Any) -> None:
    """``gemm_pair(..., f16=True, gate=(qg, D))``: every row chunk's split is one split_f16row_gate launch on that
    chunk's rows of ``x`` and of the gate (``qg[:, D:]`` with qg's row stride, inside a wider q|gate|k|v row), and
    the product is bitwise that of the gated rows through split_f16row, chunked or not."""
    rng = np.random.default_rng(5)
    m, n, heads, d = 300, 700, 4, 40
    k = heads * d
    if caps:  # 256-row weight chunks and 128-row activation chunks
        monkeypatch.setattr(plan, "_W_CAP", caps[0] * k)
        monkeypatch.setattr(plan, "_X_CAP", caps[1] * k)
    w = _fp8_weight(rng, n, k)
    xs = np.full((m, k + 8), np.nan, np.float32)
    xs[:, :k] = rng.standard_normal((m, k))
    x = xs[:, :k]
    qkvg = np.full((m, 2 * k + 24), np.nan, np.float32)  # the queries and the k | v columns: NaN, never read
    gates = (rng.standard_normal((m, heads, d)) * 4).astype(np.float32)
    qkvg[:, : 2 * k].reshape(m, heads, 2 * d)[:, :, d:] = gates
    qg = qkvg[:, : 2 * k]
    gated = _sigmoid_gate(x, gates.reshape(m, k))
    out = np.full((m, n + 5), np.nan, np.float32)
    gp.gemm_pair(x, w, out[:, 2 : 2 + n], (m, n, k, k + 8, n + 5), lambda nm: _Kernel(nm, fake), f16=True,
                 variant="cp", gate=(qg, d))  # fmt: skip
    assert np.isnan(out[:, :2]).all() and np.isnan(out[:, 2 + n :]).all()
    names = [nm.split("<")[0] for nm, _ in fake]
    mchunks = 3 if caps else 1
    assert names.count("split_f16row_gate") == mchunks and "split_f16row" not in names
    assert names.count("gemm90_f16") == mchunks * (3 if caps else 1)
    fake.clear()
    want = np.empty((m, n), np.float32)
    gp.gemm_pair(gated, w, want, (m, n, k, k, n), lambda nm: _Kernel(nm, fake), f16=True, variant="cp")
    assert [nm.split("<")[0] for nm, _ in fake].count("split_f16row") == mchunks
    got = out[:, 2 : 2 + n]
    assert np.isfinite(got).all() and np.array_equal(got, want), "gate=(qg, D) != the gated rows"
    ref = ops.linear(
        ops.round_fp16_rows(gated), e4m3_decode(np.asarray(w.planes()[0])[: n * k]).reshape(n, k)
    )
    ref = ref * np.frombuffer(np.asarray(w.planes()[1])[: 4 * n].tobytes(), np.float32)
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    with pytest.raises(ValueError, match="fp16 mode"):
        gp.gemm_pair(
            x, w, out[:, 2 : 2 + n], (m, n, k, k + 8, n + 5), lambda nm: _Kernel(nm, fake), gate=(qg, d)
        )


class _Dev:
    """What gemm.gemm's dispatch reads of a device array (shape, dtype, row stride, address)."""

    def __init__(self, m: int, cols: int, ld: int = 0, ptr: int = 256) -> None:
        self.shape, self.ndim, self.dtype = (m, cols), 2, np.dtype(np.float32)
        self.strides, self.data = (4 * (ld or cols), 4), type("Mem", (), {"ptr": ptr})()


@pytest.mark.parametrize(
    "case",
    [  # (impl, inputs, fmt, rows, D, qg's row stride, its address, captured) -> the path gemm() takes
        (("auto", "fp16", "NVFP4G16_E4M3S", 300, 64, 0, 256, False), "fold"),
        (("pair", "fp16", "FP8E4M3_F32ROW", 20, 256, 1064, 512, False), "fold"),  # pair forced: any rows
        (("auto", "exact", "NVFP4G16_E4M3S", 300, 64, 0, 256, False), "pair"),
        (("auto", "fp16", "BF16", 300, 64, 0, 256, False), "pair"),  # no fp16 mode: the exact pair mode
        (("auto", "fp16", "NVFP4G16_E4M3S", 127, 64, 0, 256, False), "gemm90"),  # below PAIR_MIN_ROWS
        (("auto", "fp16", "NVFP4G16_E4M3S", 300, 64, 0, 256, True), "gemm90"),  # graph capture
        (("wgmma", "fp16", "NVFP4G16_E4M3S", 300, 64, 0, 256, False), "inloop"),
        (("mma", "fp16", "NVFP4G16_E4M3S", 300, 64, 0, 256, False), "mma"),
        (("auto", "fp16", "NVFP4G16_E4M3S", 300, 12, 0, 256, False), "pair"),  # D % 8: not the 8-float loads
        (("auto", "fp16", "NVFP4G16_E4M3S", 300, 64, 0, 264, False), "pair"),  # gate view 8 bytes off
        (("auto", "fp16", "NVFP4G16_E4M3S", 300, 64, 518, 256, False), "pair"),  # row stride 2 floats off
    ],
)
def test_gemm_gate_dispatch(monkeypatch: pytest.MonkeyPatch, case: tuple) -> None:
    """gemm(x, w, gate=(qg, D)) leaves the gate to the fp16 row split exactly where gemm_pair runs the fp16 mode and
    the kernel's 16-byte gate loads apply ("fold"); everywhere else sigmoid_gate runs first (once, on (x, qg,
    K / D, D)) and the GEMM that follows takes no gate."""
    import ninfer.cuda.activation as act
    import ninfer.cuda.gemm as gm

    (impl, inputs, fmt, m, d, ldq, ptr, captured), path = case
    k = 2 * 256 if d != 12 else 24
    calls: list[tuple] = []
    x = _Dev(m, k)
    gated = _Dev(m, k)
    monkeypatch.setattr(act, "sigmoid_gate", lambda *a: calls.append(("sigmoid_gate", *a[2:])) or gated)
    monkeypatch.setattr(gm, "_hopper", lambda impl: impl != "mma")
    monkeypatch.setattr(gm, "capturing", lambda: captured)
    monkeypatch.setattr(
        gm, "check_rows", lambda a, name, cols=None, **kw: (a.shape[0], a.shape[1], a.strides[0] // 4)
    )
    monkeypatch.setattr(
        gm, "matrix_args", lambda a, w, out, what: ("float", a.shape[0], a.shape[1], a.strides[0] // 4)
    )
    monkeypatch.setattr(gm, "matrix_out", lambda a, out, m, n: ("out", n))

    def pair(xa: Any, w: Any, out: Any, dims: tuple, kernel_of: Any, **kw: Any) -> None:
        assert xa is (x if path == "fold" else gated)
        calls.append(("inloop" if kw.get("inloop") else "pair", kw.get("f16"), kw.get("gate")))

    monkeypatch.setattr(gm, "gemm_pair", pair)
    monkeypatch.setattr(gm, "_gemm90", lambda name, w, t: (lambda *a, **kw: calls.append(("gemm90",)), 256))
    monkeypatch.setattr(gm, "kernel", lambda *a: lambda *b, **kw: calls.append(("mma",)))
    rng = np.random.default_rng(7)
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode(rng.standard_normal((64, k)).astype(np.float32), (64, k)).view(np.uint8)
    )
    w = DeviceWeight(fmt, (64, k), buf.reshape(-1), tuple(plane_offsets(fmt, (64, k), buf)))
    qg = _Dev(m, 2 * k, ldq, ptr)
    gm.gemm(x, w, impl=impl, inputs=inputs, gate=(qg, d))
    f16 = inputs == "fp16" and fmt != "BF16"
    want = {
        "fold": [("pair", True, (qg, d))],
        "pair": [("sigmoid_gate", k // d, d), ("pair", f16, None)],
        "inloop": [("sigmoid_gate", k // d, d), ("inloop", True, None)],
        "gemm90": [("sigmoid_gate", k // d, d), ("gemm90",)],
        "mma": [("sigmoid_gate", k // d, d), ("mma",)],
    }
    assert calls == want[path], calls
    with pytest.raises(gm.KernelError, match="exclusive"):
        gm.gemm(x, w, impl=impl, inputs=inputs, gate=(qg, d), swiglu=True)


class _Experts:
    """An emulated expert GEMM launch (gemm90_experts_f16 / _f16g, FP8 weights with a per-row scale): checks the
    geometry and writes y[s] = (x_s . W_e[ids[s]]) * scale * rowf[s] in float64, x_s the slot's fp16 row (row s of
    the per-slot rows, or row rows[s] of the tokens' rows)."""

    def __init__(self, name: str, log: list, ids: np.ndarray) -> None:
        self.name, self.log, self.ids, self.max_dynamic_shared_size_bytes = name, log, ids, 0

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], a: tuple[Any, ...], **kw: Any) -> None:
        self.log.append((self.name, grid))
        assert block == (256,) and kw == {"shared_mem": 232448}
        if not self.name.startswith("gemm90_experts_f16"):  # the exact kernel: logged only
            return
        if self.name.startswith("gemm90_experts_f16g"):
            p0, p1, _, xh, rows, rowf, y = a[:7]
            n, k, ldx = int(a[11]), int(a[12]), int(a[13])
            x = xh.view(np.float16).reshape(-1, k)[rows]
        else:
            p0, p1, _, xh, rowf, y = a[:6]
            n, k, ldx = int(a[10]), int(a[11]), int(a[12])
            x = xh.view(np.float16).reshape(-1, k)
        s = self.ids.size
        assert ldx == k and x.shape == (s, k) and rowf.shape == (s,) and y.shape == (s, n)
        e = int(self.ids.max()) + 1
        w = e4m3_decode(np.asarray(p0)[: e * n * k]).reshape(e, n, k).astype(np.float64)
        scale = np.frombuffer(np.asarray(p1)[: 4 * e * n].tobytes(), np.float32).reshape(e, n)
        xf = x.astype(np.float64)
        y[...] = np.einsum("sk,snk->sn", xf, w[self.ids]) * scale[self.ids] * rowf[:, None]


@pytest.mark.parametrize(
    "case",
    [  # (impl, inputs, fmt, rows, swiglu) -> the row split launched (or None) and the GEMM
        (
            ("auto", "fp16", "FP8E4M3_F32ROW", True, False),
            ("split_f16row", "gemm90_experts_f16g<DqFP8<true>>"),
        ),
        (
            ("auto", "fp16", "FP8E4M3_F32ROW", False, False),
            ("split_f16row", "gemm90_experts_f16<DqFP8<true>>"),
        ),
        (
            ("auto", "fp16", "FP8E4M3_F32ROW", True, True),
            ("split_f16row_in<true, true>", "gemm90_experts_f16<DqFP8<true>>"),
        ),
        (
            ("auto", "fp16", "FP8E4M3_F32ROW", False, True),
            ("split_f16row_in<false, true>", "gemm90_experts_f16<DqFP8<true>>"),
        ),
        (("auto", "exact", "FP8E4M3_F32ROW", True, False), (None, "gemm90_experts<DqFP8<true>, float>")),
        (("auto", "fp16", "BF16", True, False), (None, "gemm90_experts<DqBF16, float>")),  # no fp16 mode
        (("mma", "fp16", "FP8E4M3_F32ROW", True, False), (None, "gemm_experts<FmtFP8Row, float>")),
    ],
)
def test_gemm_experts_dispatch(fake: list, monkeypatch: pytest.MonkeyPatch, case: tuple) -> None:
    """gemm_experts' kernel for each mode and input transform (experts_kernel, EXPERTS_LAUNCHES): the fp16 mode
    with ``rows`` and no SwiGLU splits the T token rows once (split_f16row) and launches gemm90_experts_f16g with
    the tokens' rows, ``rows`` and the slots' factors; other fp16 calls split per slot; the exact modes gather (and
    SwiGLU) first. The rows-in-place launch's product equals the per-slot one of ``x[rows]`` (emulated kernels,
    bitwise) and the rounded reference."""
    import ninfer.cuda.activation as act
    import ninfer.cuda.gemm as gm

    (impl, inputs, fmt, with_rows, swiglu), (split, gemm) = case
    rng = np.random.default_rng(9)
    tokens, n, k, counts = 37, 48, 64, [0, 50, 3, 0, 30]
    e = len(counts)
    ids = np.repeat(np.arange(e, dtype=np.int32), counts)
    rows = rng.integers(0, tokens, ids.size).astype(np.int32) if with_rows else None
    kx = 2 * k if swiglu else k
    xs = np.full((tokens if with_rows else ids.size, kx + 8), np.nan, np.float32)
    xs[:, :kx] = rng.standard_normal((xs.shape[0], kx)) * 3
    x = xs[:, :kx]
    codec = FORMATS[fmt]
    buf = np.ascontiguousarray(
        codec.encode(rng.standard_normal((e * n, k)).astype(np.float32), (e * n, k)).view(np.uint8)
    )
    w = DeviceWeight(fmt, (e * n, k), buf.reshape(-1), tuple(plane_offsets(fmt, (e * n, k), buf)))
    log: list = []
    monkeypatch.setattr(gm, "_hopper", lambda impl: impl != "mma")
    monkeypatch.setattr(gm, "capturing", lambda: False)
    monkeypatch.setattr(gm, "check_array", lambda *a, **kw: None)
    monkeypatch.setattr(
        gm, "check_rows", lambda a, name, cols=None, **kw: (a.shape[0], a.shape[1], a.strides[0] // 4)
    )
    monkeypatch.setattr(
        gm, "matrix_args", lambda a, w, out, what: ("float", a.shape[0], a.shape[1], a.strides[0] // 4)
    )
    monkeypatch.setattr(gm, "matrix_out", lambda a, out, m, n: (np.full((m, n), np.nan, np.float32), n))
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    monkeypatch.setattr(gm, "expert_tiles", lambda i, ne: (off, None, None, None, -(-i.size // 128) + ne))
    monkeypatch.setattr(gm, "_sm90_kernel", lambda nm: _Kernel(nm, log))
    monkeypatch.setattr(gm, "_gs_kernel", lambda nm: _Experts(nm, log, ids))
    monkeypatch.setattr(gm, "kernel", lambda src, inst, nm: lambda *a, **kw: log.append((nm, a[0])))
    monkeypatch.setattr(act, "swiglu", lambda gu: gu[:, : gu.shape[1] // 2] * gu[:, gu.shape[1] // 2 :])
    monkeypatch.setattr(_Kernel, "_split_f16row_in", _split_in, raising=False)
    before = gm.EXPERTS_LAUNCHES.copy()
    out = gm.gemm_experts(x, w, ids, n, impl=impl, inputs=inputs, rows=rows, swiglu=swiglu)
    assert [nm for nm, _ in log] == ([split] if split else []) + [gemm], log
    assert gm.EXPERTS_LAUNCHES - before == {gemm: 1}
    want = gm.experts_kernel(fmt, "float", f16=split is not None, hopper=impl != "mma", rows=with_rows,
                             swiglu=swiglu)  # fmt: skip
    assert want == gemm
    if split == "split_f16row":
        assert log[0][1] == (x.shape[0],), "one split block per token row"
    if gemm.startswith("gemm90_experts_f16g"):
        log.clear()
        per_slot = gm.gemm_experts(np.ascontiguousarray(x[rows]), w, ids, n, inputs="fp16")
        assert [nm for nm, _ in log] == ["split_f16row", "gemm90_experts_f16<DqFP8<true>>"]
        assert np.isfinite(out).all() and np.array_equal(out, per_slot), "rows in place != the gathered copy"
        wf = codec.decode(buf, (e * n, k)).reshape(e, n, k)
        xr = ops.round_fp16_rows(x[rows])
        ref = np.einsum("sk,snk->sn", xr.astype(np.float64), wf[ids].astype(np.float64))
        assert np.allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def _split_in(self: _Kernel, grid: tuple[int, ...], a: tuple[Any, ...], shared_mem: int) -> None:
    """split_f16row_in<ROWS, SWIGLU> (emulated): the gathered and / or SwiGLU'd rows, then the fp16 split."""
    x, rows, xh, rowf = a[:4]
    m, k, ldx = int(a[4]), int(a[5]), int(a[6])
    assert grid == (m,) and ldx == x.strides[0] // 4
    v = x[rows] if "<true" in self.name else x
    if self.name.endswith("true>"):
        v = v[:, :k] * v[:, k : 2 * k]
    _f16_split(np.ascontiguousarray(v), xh, rowf)
