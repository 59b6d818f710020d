"""MoE prefill of the 35B-A3B's routed experts per chunk size: the grouped GEMM against the expert lanes (GPU).

    python -m perf.bench_moe_lanes [--tokens 16,64,256,512,1024,2048,4096] [--format NVFP4G16_E4M3S] [--out DIR]

One layer's routed experts (256 of [2*512, 2048] gate|up and [2048, 512] down, top 8), float32 activations, as
``ffn_block`` runs them after the router and the sort: ``gemm_experts`` twice with the SwiGLU between (the tile
table built inside), against ``expert_lanes`` + the two lanes products (the down one with the fused SwiGLU) at 4
and 8 lanes per slot. Routing: the router's top 8 over random logits plus a per-expert popularity (normal, sd
``--skew``), so experts get uneven rows as in a real model. Weights are random bytes of the format's layout
(bench_gemv: the time does not depend on the values). Median of ``--repeats`` eager runs, CUDA events. The table
shows ms per layer and which path ``moe_lanes.use_lanes`` picks: the switch belongs where the two columns cross
(move ``LANES_MAX_AVG_ROWS`` there). JSON: ``DIR/bench_moe_lanes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from ninfer.artifact.pinned import QWEN36_35B_A3B

from .bench_gemv import _random_weight

__all__ = ["bench", "main"]


def _median_ms(fn: Any, repeats: int) -> float:
    import cupy

    fn()  # warm-up: compilation, pool allocations
    times = []
    for _ in range(repeats):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(cupy.cuda.get_elapsed_time(s, e))
    return float(np.median(times))


def _routing(t: int, e: int, k: int, skew: float, rng: np.random.Generator) -> tuple[Any, Any]:
    """Expert-sorted (ids, token rows) as ffn_block builds them."""
    import cupy

    from ninfer.cuda.router import moe_route

    logits = rng.standard_normal((t, e)) + rng.standard_normal(e) * skew
    eid, _ = moe_route(cupy.asarray(logits.astype(np.float32)), k)
    flat = eid.reshape(-1)
    order = cupy.argsort(flat).astype(np.int32)
    return flat[order], order // np.int32(k)


def _case(t: int, w: tuple[Any, Any], repeats: int, skew: float, rng: np.random.Generator) -> dict:
    """One chunk of ``t`` tokens: both paths timed on the same routing."""
    import cupy

    from ninfer.cuda.activation import swiglu
    from ninfer.cuda.gemm import gemm_experts
    from ninfer.cuda.moe_lanes import expert_lanes, expert_lanes_product, lanes_nb, use_lanes

    c = QWEN36_35B_A3B
    e, k, hid, inter = c.num_experts, c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size
    wgu, wdn = w
    h = cupy.asarray(rng.standard_normal((t, hid)).astype(np.float32))
    ids, xrow = _routing(t, e, k, skew, rng)
    s = t * k

    def grouped() -> None:
        gu = gemm_experts(cupy.take(h, xrow, axis=0), wgu, ids, 2 * inter)
        gemm_experts(swiglu(gu), wdn, ids, hid)

    def lanes(nb: int) -> None:
        table = expert_lanes(ids, xrow, e, nb)
        gu = cupy.empty((s, 2 * inter), np.float32)
        expert_lanes_product(h, wgu, table, 2 * inter, gu, gate_up=True)
        expert_lanes_product(
            gu, wdn, table, hid, cupy.empty((s, hid), np.float32), gate_up=False, swiglu=True
        )

    counts = np.bincount(cupy.asnumpy(ids), minlength=e)
    return {"tokens": t, "avg_rows": s / e, "max_rows": int(counts.max()), "hit": int((counts > 0).sum()),
            "gemm_ms": _median_ms(grouped, repeats), "lanes4_ms": _median_ms(lambda: lanes(4), repeats),
            "lanes8_ms": _median_ms(lambda: lanes(8), repeats),
            "picks": f"lanes{lanes_nb(s, e)}" if use_lanes(s, e) else "gemm"}  # fmt: skip


def bench(tokens: tuple[int, ...], fmt: str, repeats: int, skew: float) -> dict:
    c = QWEN36_35B_A3B
    e, k, hid, inter = c.num_experts, c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size
    w = _random_weight(fmt, (e, 2 * inter, hid)), _random_weight(fmt, (e, hid, inter))
    rng = np.random.default_rng(0)
    rows = []
    for t in tokens:
        rows.append(_case(t, w, repeats, skew, rng))
        print(_line(rows[-1]), flush=True)
    return {"format": fmt, "skew": skew, "repeats": repeats, "experts": e, "top_k": k, "rows": rows}


HEAD = f"{'tokens':>7}{'rows/exp':>9}{'max':>6}{'hit':>5}{'gemm ms':>10}{'lanes4':>9}{'lanes8':>9}{'best':>8}  picks"


def _line(r: dict) -> str:
    best = min(
        ("gemm", r["gemm_ms"]), ("lanes4", r["lanes4_ms"]), ("lanes8", r["lanes8_ms"]), key=lambda p: p[1]
    )
    return (f"{r['tokens']:>7}{r['avg_rows']:>9.1f}{r['max_rows']:>6}{r['hit']:>5}{r['gemm_ms']:>10.3f}"
            f"{r['lanes4_ms']:>9.3f}{r['lanes8_ms']:>9.3f}{best[0]:>8}  {r['picks']}")  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="16,64,128,256,512,1024,2048,4096")
    ap.add_argument("--format", default="NVFP4G16_E4M3S")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--skew", type=float, default=1.0, help="sd of the per-expert popularity added to the logits"
    )
    ap.add_argument("--out", default=None, help="write bench_moe_lanes.json into this directory")
    a = ap.parse_args(argv)
    print(HEAD, flush=True)
    res = bench(tuple(int(x) for x in a.tokens.split(",") if x), a.format, a.repeats, a.skew)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_moe_lanes.json"), "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
