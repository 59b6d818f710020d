"""The decode GEMV's weight ring filled by bulk copies (cuda_src/gemv_bulk.cuh, ``GV_BULK``; an experiment, off by
default) on the GPU: the same bits as the cp.async ring. The module is compiled with ``GV_BULK`` 1 and 2 (the L2
evict-first hint) beside the default one; per launch, for NVFP4, 1, 4 and 8 rows (gemv_w8.cu's 8-warp blocks too), one and several K splits, N off the 16-row groups and off the row blocks, dense products and the
MoE expert launch: every output bitwise the default kernel's. The host emulation (tests/test_gemv_bulk_host.py)
checks the kernel text on the CPU. Run: ``python -m pytest -m gpu tests/test_cuda_gemv_bulk.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


@pytest.fixture
def bulk_source(cp: Any) -> Iterator[Callable[[int], None]]:
    """set(level): gemv.cu compiled with GV_BULK = level (0: the default text), its NVFP4 float instances only (a
    module of every instance compiles for minutes); the default restored after."""
    import ninfer.cuda.linear as linear
    import ninfer.cuda.loader as loader

    families = ("gemv.cu", "gemv_w8.cu")  # 5-8 rows run gemv_w8.cu (linear.GV_W8): gemv.cu with 8 warps
    original, instances = loader.source_text, {f: linear.SOURCES[f] for f in families}
    for f in families:
        linear.SOURCES[f] = tuple(n for n in instances[f] if "<FragNVFP4, float," in n)

    def set_level(level: int) -> None:
        loader.source_text = (
            (lambda n: (f"#define GV_BULK {level}\n" if n in families else "") + original(n))
            if level
            else original
        )
        loader.load_module.cache_clear()
        loader._FUNCTIONS.clear()

    yield set_level
    linear.SOURCES.update(instances)
    set_level(0)


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> Any:
    from ninfer.cuda.weights import upload_weight
    from ninfer.formats import FORMATS

    wf = (rng.standard_normal((n, k)) * 0.5).astype(F32)
    return upload_weight(fmt, (n, k), FORMATS[fmt].encode(wf, (n, k)))


def _run_all(fns: list[Callable[[], Any]]) -> list[np.ndarray]:
    import cupy

    return [cupy.asnumpy(f()).view(np.uint8) for f in fns]


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("n,k", [(600, 2048), (300, 1032), (136, 4096), (2048, 512), (40, 256)])
def test_bulk_ring_same_bits_dense(cp: Any, bulk_source: Any, level: int, n: int, k: int) -> None:
    from ninfer.cuda.linear import gemv

    rng = np.random.default_rng(n * 7 + k)
    w = _weight(rng, NVFP4, n, k)
    x = cp.asarray((rng.standard_normal((8, 2 * k)) * 2).astype(F32))
    fns = [lambda b=b: gemv(x[:b, :k], w) for b in (1, 4, 8)] + [lambda: gemv(x, w, swiglu=True)]
    bulk_source(0)
    want = _run_all(fns)
    bulk_source(level)
    got = _run_all(fns)
    for i, (a, b) in enumerate(zip(want, got, strict=True)):
        assert np.array_equal(a, b), f"case {i}: bulk ring differs from cp.async ring"


@pytest.mark.parametrize("level", [1, 2])
def test_bulk_ring_same_bits_experts(cp: Any, bulk_source: Any, level: int) -> None:
    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.weights import upload_weight
    from ninfer.formats import FORMATS

    rng = np.random.default_rng(5)
    ne, n, k = 6, 256, 1024
    wf = (rng.standard_normal((ne * n, k)) * 0.5).astype(F32)
    w = upload_weight(NVFP4, (ne * n, k), FORMATS[NVFP4].encode(wf, (ne * n, k)))
    x = cp.asarray(rng.standard_normal((3, k)).astype(F32))
    ids = cp.asarray(np.array([4, 0, 5, 2, 4], dtype=np.int32))
    xrow = cp.asarray(np.array([0, 1, 2, 0, 1], dtype=np.int32))

    def call() -> Any:
        return gemv_experts(x, w, ids, xrow, n)

    bulk_source(0)
    want = _run_all([call])
    bulk_source(level)
    got = _run_all([call])
    assert np.array_equal(want[0], got[0]), "bulk ring differs from cp.async ring (expert launch)"
