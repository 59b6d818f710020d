"""The warp-specialized fp16 GEMM (cuda_src/gemm_sm90_ws.cu, ws_sched.cuh; ninfer/cuda/tensor_map.py) on the CPU.

tests/host/gemm_ws_driver.cu runs ws_sched.cuh's producer / consumer loops (the device kernel's own code) in one
std::thread per role of every persistent CTA against emulated mbarriers and an emulated TMA box copy built from
``map_params`` (dims, row stride, box, 128B swizzle), with the consumers reading their operands at the wgmma
descriptors' addresses. Integer-valued fp16 data make every fp32 sum exact, so the result must equal NumPy's bit for
bit: a misplaced, stale, missing or doubled element shows. The driver itself asserts the ring's invariants (no slot
refilled before both warpgroups released it, each consumer sees the fill it waits for, every output written once).
The device instructions (TMA, mbarrier, setmaxnreg) are checked by tests/test_cuda_gemm_ws.py on an H200.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import HOST, build_nvcc_driver

from ninfer.cuda.loader import KernelError
from ninfer.cuda.tensor_map import (
    BOX_K,
    DTYPE_FLOAT32,
    SWIZZLE_128B,
    SWIZZLE_NONE,
    MapParams,
    map_params,
    scale_map_params,
)

BM, BN, GBN = 128, 256, 128


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nvcc_driver(tmp_path_factory, "gemm_ws_host", (HOST / "gemm_ws_driver.cu").read_text())


def _line(p: MapParams) -> str:
    elem = 4 if p.dtype == DTYPE_FLOAT32 else 2
    return f"{p.dims[0]} {p.dims[1]} {p.strides[0]} {p.box[0]} {p.box[1]} {p.swizzle} {elem}\n"


def _run(
    driver: Path,
    m: int,
    n: int,
    k: int,
    grid: int,
    seed: int,
    slow: int = 0,
    swizzle: int = SWIZZLE_128B,
    splits: int = 1,
    integers: bool = True,
    gpt: int = 0,
    transpose_scales: bool = False,
    defer: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """(y, NumPy's y in float64 then rounded, the split partials [S, M, N] or None, x, w, rowf). ``gpt`` > 0: the
    group kernel (gemm90_f16_wsg<gpt>): ``w`` the codes, times a power-of-two scale per group of 64 / gpt k
    (``[groups, N]`` float32 as gemm_group lays them out; ``transpose_scales``: handed over in the wrong order) in
    NumPy's y and in the partials; ``defer`` (gpt 1): gemm90_f16_wsgd<1>, the scaling deferred by one K tile."""
    rng = np.random.default_rng(seed)
    if integers:
        x = rng.integers(-3, 4, (m, k)).astype(np.float16)
        w = rng.integers(-8 if gpt else -3, 8 if gpt else 4, (n, k)).astype(np.float16)
    else:  # 11 significant bits: the fp32 sums round, so their order shows in the bits
        x = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        w = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    rowf = (2.0 ** rng.integers(-3, 4, m)).astype(np.float32)
    bn = BN if gpt == 0 else GBN
    ma, mb = map_params(m, k, k, BM), map_params(n, k, k, bn)
    ma, mb = ma._replace(swizzle=swizzle), mb._replace(swizzle=swizzle)
    head = f"{m} {n} {k} {grid} {seed} {slow} {splits} {3 if defer else gpt}\n" + _line(ma) + _line(mb)
    wf = w.astype(np.float64)
    scales = b""
    if gpt:
        glen = 64 // gpt
        groups = -(-k // 128) * 128 // glen  # the stored layout's groups per row (K padded to 128)
        sc = (2.0 ** rng.integers(-2, 3, (groups, n))).astype(np.float32)
        head += _line(scale_map_params(groups, n, gpt))
        wf = wf * np.repeat(sc.astype(np.float64).T, glen, axis=1)[:, :k]
        scales = (np.ascontiguousarray(sc.T) if transpose_scales else sc).tobytes()
    data = head.encode() + x.view(np.uint16).tobytes() + w.view(np.uint16).tobytes() + scales + rowf.tobytes()
    proc = subprocess.run([str(driver)], input=data, capture_output=True, timeout=600)
    assert proc.returncode == 0, f"driver exited {proc.returncode}: {proc.stderr.decode()[-2000:]}"
    out = np.frombuffer(proc.stdout, np.float32)
    assert out.size == m * n * (1 + (splits if splits > 1 else 0)), "driver output size"
    got = out[: m * n].reshape(m, n)
    part = out[m * n :].reshape(splits, m, n) if splits > 1 else None
    want = (x.astype(np.float64) @ wf.T * rowf[:, None]).astype(np.float32)
    return got, want, part, x, wf, rowf


def _split_k(k: int, splits: int) -> list[tuple[int, int]]:
    """The K columns [a, b) of each split (ws_sched.cuh: K tiles [s nk / S, (s + 1) nk / S) of 64)."""
    nk = -(-k // 64)
    return [(s * nk // splits * 64, min(k, (s + 1) * nk // splits * 64)) for s in range(splits)]


def test_constants_agree() -> None:
    """The Python launch's constants are the kernel's (ws_sched.cuh, gemm_sm90_ws.cu)."""
    import re

    from ninfer.cuda import gemm_pair as gp
    from ninfer.cuda.loader import CUDA_SRC

    text = (CUDA_SRC / "ws_sched.cuh").read_text() + (CUDA_SRC / "gemm_sm90_ws.cu").read_text()
    defs = dict(re.findall(r"^#define (WS_\w+) (\d+)", text, re.MULTILINE))
    assert int(defs["WS_THREADS"]) == gp._WS_THREADS and int(defs["WS_BN"]) == gp._WS_BN == BN
    assert int(defs["WS_SMEM"]) == gp._SMEM
    need = 1024 + int(defs["WS_STAGES"]) * (BM + BN) * 128 + 16 * int(defs["WS_STAGES"])
    assert need <= gp._SMEM, "ring + barriers + alignment slack fit the opt-in shared memory"
    # the group formats' ring: 128-column tiles, the scale rows (at most 2 x 128 fp32) in a 1024-byte tail
    from ninfer.cuda import gemm_group
    from ninfer.cuda.tensor_map import SCALE_BOX_N

    gdefs = dict(re.findall(r"^#define (WSG_\w+) (\d+)", text, re.MULTILINE))
    assert int(gdefs["WSG_BN"]) == gemm_group._GBN == SCALE_BOX_N == GBN
    assert int(gdefs["WSG_S_BYTES"]) >= 2 * GBN * 4 and int(gdefs["WSG_S_BYTES"]) % 1024 == 0
    need = 1024 + int(gdefs["WSG_STAGES"]) * ((BM + GBN) * 128 + int(gdefs["WSG_S_BYTES"]) + 16)
    assert need <= gp._SMEM


def test_map_params() -> None:
    p = map_params(300, 1032, 1032, BM)
    assert p == MapParams((1032, 300), (2064,), (BOX_K, BM), (1, 1), SWIZZLE_128B)
    assert BOX_K * 2 == 128, "one box row = one 128-byte swizzle row (GS_BK fp16 words)"
    assert map_params(5, 8, 16, BN).strides == (32,)
    for bad in ((0, 8, 8, BM), (4, 8, 4, BM), (4, 12, 12, BM), (4, 8, 8, 257)):
        with pytest.raises(KernelError):
            map_params(*bad)


def test_scale_map_params() -> None:
    """The group scales' map: float32 [groups, N], boxes of 128 columns x the K tile's groups, unswizzled."""
    p = scale_map_params(34, 1000, 2)
    assert p == MapParams((1000, 34), (4000,), (128, 2), (1, 1), SWIZZLE_NONE, DTYPE_FLOAT32)
    for bad in ((0, 8, 1), (4, 10, 1), (4, 8, 3)):
        with pytest.raises(KernelError):
            scale_map_params(*bad)


def test_tensor_map_buffer_is_passed_by_value() -> None:
    """The 128-byte map sits 64-byte aligned in its buffer, and launch_ex hands the driver its address as the
    parameter's value (not a device pointer)."""
    import ctypes

    from ninfer.cuda.launch import _c_arg
    from ninfer.cuda.tensor_map import TensorMap

    for _ in range(8):
        tm = TensorMap()
        assert ctypes.addressof(tm.arg) % 64 == 0 and ctypes.sizeof(tm.arg) == 128
        assert _c_arg(tm.arg) is tm.arg


# (M, N, K, persistent CTAs): a single element; one exact tile; ragged M / N / K on several tiles with fewer CTAs than
# tiles (each CTA walks several output tiles, its ring running on across them); K of 17 K tiles wraps the 4-slot ring
# four times per tile; more CTAs than tiles (idle CTAs)
SHAPES = ((1, 1, 8, 1), (128, 256, 64, 1), (129, 257, 72, 3), (300, 520, 1032, 4), (70, 600, 136, 7))


@pytest.mark.parametrize("shape", SHAPES)
def test_ws_schedule_and_layout_match_numpy(driver: Path, shape: tuple[int, int, int, int]) -> None:
    for seed in (1, 2):
        got, want, part, *_ = _run(driver, *shape, seed=seed)
        assert part is None, "S = 1: y written directly, no partials"
        assert np.array_equal(got, want), (
            f"{shape} seed {seed}: {np.count_nonzero(got != want)} outputs differ"
        )


def test_ws_wrong_swizzle_is_caught(driver: Path) -> None:
    """The check can fail: tensor maps without the swizzle put the chunks where the descriptors do not look."""
    got, want, *_ = _run(driver, 129, 257, 72, 2, seed=3, swizzle=0)
    assert not np.array_equal(got, want)


# (M, N, K, persistent CTAs, S): one K tile per split (ragged M / N); 17 K tiles in splits of 5, 6, 6 with 27 units
# on 4 CTAs (each CTA's ring running on across units of different tiles and splits); 9 K tiles in 2, 2, 2, 3 with 16
# units on 5 CTAs; S > nk (3 K tiles in 5 splits: two empty splits, which contribute zeros; the host never chooses
# them); more CTAs than units
SPLIT_SHAPES = (
    (129, 257, 72, 3, 2),
    (300, 520, 1032, 4, 3),
    (200, 300, 520, 5, 4),
    (70, 600, 136, 7, 5),
    (128, 256, 256, 9, 4),
)


@pytest.mark.parametrize("shape", SPLIT_SHAPES)
def test_ws_split_units_match_numpy(driver: Path, shape: tuple[int, int, int, int, int]) -> None:
    """Split-K units: every partial is the exact sum over its split's K range (unscaled), and y their sum times rowf
    (integer data: exact, so any misplaced, missing or doubled K tile or unit shows)."""
    m, n, k, grid, splits = shape
    for seed, slow in ((1, 0), (2, 1), (3, 2)):
        got, want, part, x, w, _ = _run(driver, m, n, k, grid, seed=seed, slow=slow, splits=splits)
        assert part is not None
        for s, (a, b) in enumerate(_split_k(k, splits)):
            ref = (x[:, a:b].astype(np.float64) @ w[:, a:b].astype(np.float64).T).astype(np.float32)
            assert np.array_equal(part[s], ref), f"{shape} seed {seed}: split {s} (K {a}..{b}) differs"
        assert np.array_equal(got, want), (
            f"{shape} seed {seed}: {np.count_nonzero(got != want)} outputs differ"
        )


def test_ws_split_sum_order(driver: Path) -> None:
    """The reduction adds the partials in split order 0, 1, ..., S - 1 in fp32 (rounding data: the order shows),
    then the epilogue's row factor; two runs (different interleavings) give the same bits."""
    m, n, k, grid, splits = 130, 300, 1032, 5, 4
    got, _, part, *_, rowf = _run(driver, m, n, k, grid, seed=5, splits=splits, integers=False)
    assert part is not None
    acc = part[0].copy()
    for s in range(1, splits):
        acc = acc + part[s]
    assert np.array_equal(got, acc * rowf[:, None]), "not the in-order fp32 sum of the partials"
    rev = part[-1].copy()
    for s in range(splits - 2, -1, -1):
        rev = rev + part[s]
    assert not np.array_equal(acc, rev), "the data do not tell the summation orders apart"
    again, _, part2, *_ = _run(driver, m, n, k, grid, seed=5, slow=1, splits=splits, integers=False)
    assert np.array_equal(again, got) and np.array_equal(part2, part), "another interleaving changed the bits"


# The group formats (gemm90_f16_wsg<GPT>): (M, N, K, persistent CTAs, GPT, S). One tile; ragged M / N / K over
# several tiles with fewer CTAs than tiles and the 6-slot ring wrapping (17 K tiles); W8's two groups per K tile;
# split units (ragged splits of 17 K tiles, each split's groups whole).
GROUP_SHAPES = (
    (128, 128, 64, 1, 1, 1),
    (129, 260, 200, 3, 1, 1),
    (300, 132, 1032, 4, 1, 1),
    (129, 260, 200, 3, 2, 1),
    (70, 388, 1032, 5, 2, 1),
    (200, 300, 1032, 5, 1, 3),
    (130, 260, 520, 4, 2, 2),
)


@pytest.mark.parametrize("shape", GROUP_SHAPES + tuple(s[:6] + (True,) for s in GROUP_SHAPES if s[4] == 1))
def test_group_ws_schedule_scales_and_layout_match_numpy(driver: Path, shape: tuple[int, ...]) -> None:
    """Codes x power-of-two group scales on integer rows: every partial sum and fmaf exact, so y equals NumPy's
    x @ (codes x scales)^T exactly; the scale rows land where scale_group reads them, group GPT kt + j of column n.
    A seventh entry True: the deferred scaling (gemm90_f16_wsgd<1>), each partial scaled from its own slot before
    that slot is released (the driver fails otherwise)."""
    m, n, k, grid, gpt, splits = shape[:6]
    defer = len(shape) > 6
    for seed, slow in ((1, 0), (2, 1), (3, 2)):
        got, want, part, x, wf, _ = _run(
            driver, m, n, k, grid, seed=seed, slow=slow, splits=splits, gpt=gpt, defer=defer
        )
        assert np.array_equal(got, want), (
            f"{shape} seed {seed}: {np.count_nonzero(got != want)} outputs differ"
        )
        if splits > 1:
            assert part is not None
            for s, (a, b) in enumerate(_split_k(k, splits)):
                ref = (x[:, a:b].astype(np.float64) @ wf[:, a:b].T).astype(np.float32)
                assert np.array_equal(part[s], ref), f"{shape} seed {seed}: split {s} differs"


def test_group_ws_wrong_scale_layout_is_caught(driver: Path) -> None:
    """The check can fail: scales handed over [N, groups] instead of [groups, N] give other values."""
    got, want, *_ = _run(driver, 129, 260, 200, 3, seed=4, gpt=1, transpose_scales=True)
    assert not np.array_equal(got, want)


def test_group_ws_late_drain_is_caught(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The deferral's check can fail: with ws_consume draining a unit's last partial after releasing its slot, the
    driver reports the scale read from a released slot (exit 31)."""
    from ninfer.cuda.loader import CUDA_SRC

    sched = (CUDA_SRC / "ws_sched.cuh").read_text()
    late = sched.replace(
        "            o.drain(prev);\n            o.release(prev);",
        "            o.release(prev);\n            o.drain(prev);",
    )
    assert late != sched, "ws_consume's drain / release lines moved: update this test"
    text = (HOST / "gemm_ws_driver.cu").read_text().replace('#include "ws_sched.cuh"', late)
    drv = build_nvcc_driver(tmp_path_factory, "gemm_ws_late_drain", text)
    with pytest.raises(AssertionError, match="driver exited 31"):
        _run(drv, 300, 132, 1032, 4, seed=1, gpt=1, defer=True)
