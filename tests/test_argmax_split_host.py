"""CPU check of cuda_src/sampling.cu's ``argmax_split`` (the greedy rows' split-vocabulary argmax): the kernel text
compiled by g++ under the CUDA emulation prelude of tests/host/attn_emu.cpp (std::thread per CUDA thread, block and
warp barriers, blocks in a shuffled order; ``__shared__`` as ``static``: one block runs at a time), driven by
tests/host/argmax_split_driver.cpp with poisoned partials and outputs. Every row's id must be the NumPy sampler's
greedy token (``ninfer.engine.sampler.sample`` at temperature 0, -1 for ``MaskError``) on rows with ties, both
zeros, NaN, infinities, masks (one allowing nothing), a token limit and penalties (applied before the kernel as
the device path does); two launches on the same workspaces (the arrival counters must be zero again after each),
and one slice or many per row. The GPU tests (tests/test_cuda_sampling.py) check the same kernel on the device.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from host_emu import build_emulator

from ninfer.engine.core import SamplingParams
from ninfer.engine.sampler import MaskError, apply_penalties, packed_mask, sample

F32 = np.float32
PRELUDE = """#undef __shared__
#define __shared__ static
inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int off) {
    const int src = (threadIdx.x & 31) ^ off;
    const unsigned lo = emu_exchange((unsigned)v, src), hi = emu_exchange((unsigned)(v >> 32), src);
    return (unsigned long long)hi << 32 | lo;
}
inline unsigned long long __ldcg(const unsigned long long* p) { return *p; }
// built-ins of sample_rows and apply_penalties_rows (compiled with the family, not run here)
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    parts = ["attn_emu.cpp", PRELUDE, "sampling.cu", "emu_io.cpp", "argmax_split_driver.cpp"]
    return build_emulator(tmp_path_factory, "argmax_split_emu", parts)


def greedy_rows(rng: np.random.Generator, n: int, v: int) -> np.ndarray:
    """Rows with ties everywhere (a coarse grid), -0 next to +0, NaN and infinities; row 1 (when there) all -inf
    but for NaNs, row 2 with +inf twice (the lower id wins)."""
    x = np.round(rng.standard_normal((n, v)) * 2).astype(F32) / F32(2)
    x[:, 1::7] = np.where(x[:, 1::7] == 0, F32(-0.0), x[:, 1::7])
    for r in range(n):
        x[r, rng.integers(0, v, 3)] = np.nan
        x[r, rng.integers(0, v, 2)] = -np.inf
    if n > 1:
        x[1] = -np.inf
        x[1, rng.integers(0, v, 2)] = np.nan
    if n > 2:
        x[2, rng.integers(0, v, 2)] = np.inf
    return x


def greedy_requests(rng: np.random.Generator, n: int, v: int, masked: bool) -> list[tuple]:
    """(params, counts, mask) per row: temperature 0 with sampling knobs that greedy ignores, penalties on some
    rows, masks on odd rows (row 3: nothing allowed; row 5: a few ids)."""
    out = []
    for i in range(n):
        pen = i % 3 == 0
        p = SamplingParams(temperature=0.0, top_k=int(rng.integers(0, 5)), top_p=float(rng.choice([1.0, 0.5])),
                           min_p=float(rng.choice([0.0, 0.2])), repetition_penalty=1.7 if pen else 1.0,
                           frequency_penalty=0.5 if pen else 0.0, presence_penalty=0.25 if pen else 0.0)  # fmt: skip
        counts = {int(t): int(rng.integers(1, 5)) for t in rng.choice(v, min(v, 40), replace=False)}
        mask = None
        if masked and i % 2:
            bits = rng.random(v) < (0.0 if i == 3 else 0.01 if i == 5 else 0.5)
            mask = packed_mask(bits, v)
        out.append((p, counts, mask))
    return out


def want_tokens(x: np.ndarray, reqs: list[tuple], limit: int | None) -> list[int]:
    """The NumPy sampler's tokens (-1: nothing allowed)."""
    got = []
    for row, (p, counts, mask) in zip(x, reqs, strict=True):
        try:
            got.append(sample(row, p, seed=1, position=0, counts=counts, token_limit=limit, mask=mask))
        except MaskError:
            got.append(-1)
    return got


def _run(emu: Path, d: Path, x: np.ndarray, masks: np.ndarray | None, limit: int, chunk: int) -> tuple:
    d.mkdir(exist_ok=True)
    x.tofile(d / "x.bin")
    if masks is not None:
        masks.tofile(d / "mask.bin")
    rows, v = x.shape
    args = [rows, v, limit, chunk, int(masks is not None), 2]
    proc = subprocess.run([str(emu), str(d), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"emulation failed (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return np.fromfile(d / "out.bin", np.int32).reshape(2, rows), np.fromfile(d / "cnt.bin", np.int32)


CASES = (  # rows, V, limit (None: V), chunk, masked
    (1, 5000, None, 512, False),
    (8, 5000, 4990, 512, True),  # ragged last slice, a limit inside it
    (8, 777, None, 2048, True),  # one slice per row
    (4, 4099, 1000, 256, True),  # slices past the limit scan nothing
    (2, 300, 0, 64, False),  # nothing allowed anywhere
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}l{c[2]}c{c[3]}m{c[4]:d}")
def test_argmax_split_emulated(emu: Path, tmp_path: Path, case: tuple) -> None:
    rows, v, limit, chunk, masked = case
    rng = np.random.default_rng([rows, v, chunk])
    x = greedy_rows(rng, rows, v)
    reqs = greedy_requests(rng, rows, v, masked)
    pen = np.stack(
        [apply_penalties(x[i], c, p) for i, (p, c, _) in enumerate(reqs)]
    )  # the device path's copy
    masks = None
    if masked:
        masks = np.stack([m if m is not None else np.full(-(-v // 32), -1, np.int32) for _, _, m in reqs])
    out, cnt = _run(emu, tmp_path, pen, masks, v if limit is None else limit, chunk)
    want = want_tokens(x, reqs, limit)
    assert out[0].tolist() == want, f"got {out[0].tolist()}, want {want}"
    assert out[1].tolist() == want, "a second launch on the same workspaces must give the same ids"
    assert not cnt.any(), f"arrival counters left nonzero: {cnt.tolist()}"
    if rows > 3 and masked:
        assert want[3] == -1 and want[1] >= 0, "the cases must cover a row with nothing allowed"
