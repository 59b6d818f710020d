"""The device sampler's call on the GPU: greedy rows through ``argmax_rows`` (the split-vocabulary argmax) against
the general ``sample_rows`` path that greedy rows took before (one 1024-thread block per row), and sampled rows.

    python -m perf.bench_sampling [--rows 1 4 8 32] [--vocab 248320] [--reps 200] [--out DIR]

Random float32 logits ``[rows, vocab]`` (the 27B's vocabulary by default; rows 4 = one lane's verify at k = 3).
Per case and row count:

- ``call_ms``: one ``sample_requests`` call as the runner makes it (host preparation, launches, the ids' copy back
  and its synchronization), the device idle before it: mean wall time;
- ``host_ms``: the same call's work before its synchronization (``sample_requests_dev``: the launches returned, the
  GPU possibly still running): mean wall time;
- ``kernel_ms``: the sampling kernel alone (``sample_rows`` or ``argmax_split``), CUDA events around ``reps``
  launches back to back, per launch (``sample_rows``' time includes the fill of its poisoned output).

Cases: ``greedy_before`` (temperature 0 rows through the per-row parameter upload and ``sample_rows``: the path
before ``argmax_rows``), ``greedy`` (``sample_requests`` now: ``argmax_rows``) and ``sampled`` (temperature 1,
top-p 0.95, top-k 50; unchanged, for scale). Every greedy row's id is checked equal between the two paths and the
NumPy argmax. Prints a table and writes ``bench_sampling.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["bench_sampling", "main"]


def _requests(n: int, greedy: bool) -> list[Any]:
    from ninfer.engine.core import SamplingParams
    from ninfer.engine.sampler import SampleRequest

    p = SamplingParams() if greedy else SamplingParams(temperature=1.0, top_p=0.95, top_k=50)
    return [SampleRequest(p, 1234 + i, 100 + i, {}, None) for i in range(n)]


def _before_dev(x: Any, reqs: list[Any], limit: int | None) -> Any:
    """The greedy rows' path before ``argmax_rows``: the rows' columns uploaded, then ``sample_rows``."""
    from ninfer.cuda.sampling import _columns, sample_rows

    c = _columns(reqs)
    return sample_rows(x, c["temperature"], c["top_k"], c["top_p"], c["min_p"], c["seeds"], c["positions"],
                       None, limit)  # fmt: skip


def _mean_s(fn: Any, reps: int) -> float:
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    total = 0.0
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
    cupy.cuda.Device().synchronize()
    return total / reps


def _kernel_s(launch: Any, reps: int) -> float:
    import cupy

    launch()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        launch()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / reps


def _case(x: Any, name: str, reps: int) -> dict[str, Any]:
    import cupy

    from ninfer.cuda.sampling import _columns, argmax_rows, sample_requests_dev, sample_rows

    n = x.shape[0]
    reqs = _requests(n, name != "sampled")
    dev = _before_dev if name == "greedy_before" else sample_requests_dev
    if name == "greedy":
        launch = lambda: argmax_rows(x)  # noqa: E731
    else:
        c = _columns(reqs)
        cols = (c["temperature"], c["top_k"], c["top_p"], c["min_p"], c["seeds"], c["positions"])
        launch = lambda: sample_rows(x, *cols)  # noqa: E731
    ids = cupy.asnumpy(dev(x, reqs, None)).tolist()
    return {
        "case": name,
        "rows": n,
        "call_ms": 1e3 * _mean_s(lambda: cupy.asnumpy(dev(x, reqs, None)), reps),
        "host_ms": 1e3 * _mean_s(lambda: dev(x, reqs, None), reps),
        "kernel_ms": 1e3 * _kernel_s(launch, reps),
        "ids": ids,
    }


def bench_sampling(rows: list[int], vocab: int, reps: int) -> list[dict[str, Any]]:
    import cupy

    rng = np.random.default_rng(0)
    out = []
    for n in rows:
        host = rng.standard_normal((n, vocab)).astype(np.float32)
        host[:, 7] = host.max(axis=1)  # a tie with the row's max at a lower id than most
        x = cupy.asarray(host)
        want = [int(np.argmax(r)) for r in host]
        cases = [_case(x, name, reps) for name in ("greedy_before", "greedy", "sampled")]
        for c in cases[:2]:
            assert c["ids"] == want, f"{c['case']} at {n} rows: ids differ from NumPy's argmax"
        out.extend(cases)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 32])
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None, help="directory for bench_sampling.json")
    args = ap.parse_args(argv)
    res = bench_sampling(args.rows, args.vocab, args.reps)
    print(f"device sampling, vocab {args.vocab} (mean per call; kernel: per launch, back to back)")
    print(f"{'case':14s} {'rows':>4s} {'call_ms':>8s} {'host_ms':>8s} {'kernel_ms':>9s}")
    for r in res:
        print(f"{r['case']:14s} {r['rows']:4d} {r['call_ms']:8.3f} {r['host_ms']:8.3f} {r['kernel_ms']:9.4f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = [{k: v for k, v in r.items() if k != "ids"} for r in res]
        doc = {"vocab": args.vocab, "reps": args.reps, "results": rows}
        (args.out / "bench_sampling.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
