"""Decode GEMV time against its K-split count (GPU): the split rule's choice (``linear.gemv_plan``) beside every
other split count, per 27B / 35B-A3B shape, at 1 and 8 activation rows.

    PYTHONPATH=. python -m perf.gemv_splits [--format NVFP4G16_E4M3S] [--repeats 20]

Timed as ``perf.bench_gemv`` times a case (a CUDA graph of launches over enough weight copies to exceed the L2,
launched with PDL as a decode step launches them, median of the replays). The split count changes each output's
summation order, never which weights or rows are read: an experiment on the rule, not a second kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from ninfer.artifact.pinned import QWEN36_35B_A3B

from .bench_gemv import SHAPES, _copies, _random_weight
from .bench_peers import graph_seconds

SPLITS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20)


def _shapes() -> dict[str, tuple[int, int]]:
    c = QWEN36_35B_A3B
    h = c.hidden_size
    vd = c.linear_num_value_heads * c.linear_value_head_dim
    kd = c.linear_num_key_heads * c.linear_key_head_dim
    out = {f"27B {k}": v for k, v in SHAPES.items() if k != "lm_head"}
    out.update(
        {"35B gdn qkv|z": (2 * kd + 2 * vd, h), "35B gdn out": (h, vd), "35B router": (c.num_experts, h)}
    )
    return out


def main(argv: list[str] | None = None) -> None:
    import cupy

    from ninfer.cuda import linear

    ap = argparse.ArgumentParser(prog="python -m perf.gemv_splits")
    ap.add_argument("--format", default="NVFP4G16_E4M3S")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    rule = linear.gemv_plan
    rng = np.random.default_rng(0)
    for name, (n, k) in _shapes().items():
        base = rule(a.format, n, k)
        w0 = _random_weight(a.format, (n, k))
        ws = [w0] + [_random_weight(a.format, (n, k)) for _ in range(_copies(w0.data.nbytes) - 1)]
        for b in (1, 8):
            x = cupy.asarray(rng.standard_normal((b, k)).astype(np.float32))
            out = cupy.empty((b, n), dtype=np.float32)
            row: list[str] = []
            for s in SPLITS:
                if s > base.ntiles:
                    continue

                def plan(fmt: str, n_: int, k_: int, s: int = s, nk: tuple = (n, k)) -> Any:
                    p = rule(fmt, n_, k_)
                    return dataclasses.replace(p, splits=s) if (n_, k_) == nk else p

                linear.gemv_plan = plan
                try:
                    t = graph_seconds(
                        [lambda x=x, out=out, w=w: linear.gemv(x, w, out) for w in ws], a.repeats
                    )
                finally:
                    linear.gemv_plan = rule
                mark = "*" if s == base.splits else ""
                row.append(f"{s}{mark}:{t * 1e6:.1f}")
            print(f"{name:16s} N {n:6d} K {k:6d} x{b} bx {base.blocks_x:4d} | " + " ".join(row), flush=True)
        del w0, ws
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
