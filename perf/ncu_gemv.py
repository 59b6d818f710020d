"""One decode GEMV launch inside cudaProfilerStart/Stop, for Nsight Compute's detailed sections (stall reasons,
issue slots, memory throughput) on a chosen format, 27B shape and row count::

    ncu --profile-from-start off --clock-control none --set detailed -o gemv \\
        python -m perf.ncu_gemv --format NVFP4G16_E4M3S --shape "mlp gate|up" --rows 1
"""

from __future__ import annotations

import argparse

import numpy as np

from .bench_gemv import SHAPES, _random_weight

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    import cupy

    from ninfer.cuda.linear import gemv

    p = argparse.ArgumentParser(prog="python -m perf.ncu_gemv")
    p.add_argument("--format", default="NVFP4G16_E4M3S")
    p.add_argument("--shape", default="mlp gate|up", choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, default=1)
    a = p.parse_args(argv)
    n, k = SHAPES[a.shape]
    w = _random_weight(a.format, (n, k))
    x = cupy.asarray(np.random.default_rng(0).standard_normal((a.rows, k)).astype(np.float32))
    out = cupy.empty((a.rows, n), dtype=np.float32)
    for _ in range(3):
        gemv(x, w, out)
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.start()
    gemv(x, w, out)
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.stop()


if __name__ == "__main__":
    main()
