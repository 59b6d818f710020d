"""The device sampler's call on the GPU: greedy rows through ``argmax_rows`` (the split-vocabulary argmax) against
the general ``sample_rows`` path that greedy rows took before, and sampled rows through ``sample_rows``' split path
(cuda_src/sample_split.cuh, the default) against its one-block-per-row kernel (``split=False``), side by side.

    python -m perf.bench_sampling [--rows 1 4 8 32] [--vocab 248320] [--reps 200] [--out DIR]

Logits ``[rows, vocab]`` (the 27B's vocabulary by default; rows 4 = one lane's verify at k = 3): ``flat`` (random
normal: nearly every id is a candidate) or ``peaked`` (LM-like: a deep tail, a few dozen plausible ids, a handful
of strong ones). Per case and row count:

- ``call_ms``: one ``sample_requests`` call as the runner makes it (host preparation, launches, the ids' copy back
  and its synchronization), the device idle before it: mean wall time;
- ``host_ms``: the same call's work before its synchronization (``sample_requests_dev``: the launches returned, the
  GPU possibly still running): mean wall time;
- ``kernel_ms``: the sampling launches alone, CUDA events around ``reps`` calls back to back, per call (the
  one-block kernel: ``reps / 10`` calls, and no call_ms / host_ms: it is the baseline, not the runner's path);
- ``graph_ms`` (split path): the same launches captured in a CUDA graph, per replay: the device's time without
  the host's launch overhead (the split path is nine launches).

Cases: ``greedy_before`` (temperature 0 rows through the per-row parameter upload and the one-block kernel),
``greedy`` (``argmax_rows``), then ``<params>/<logits>/<split|block>`` for the parameter sets ``qwen`` (temperature
0.6, top-k 20, top-p 0.95: Qwen's recommended), ``k50p95`` (temperature 1, top-k 50, top-p 0.95), ``p95`` (top-p
0.95 only), ``temp`` (temperature 1 only) and ``minp`` (min-p 0.05). Every greedy row's id is checked equal between
the two paths and the NumPy argmax, every sampled row's id between the split path and the one-block kernel. Prints
a table and writes ``bench_sampling.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["bench_sampling", "main"]


PARAMS = {  # name -> SamplingParams keywords
    "greedy": {},
    "qwen": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
    "k50p95": {"temperature": 1.0, "top_k": 50, "top_p": 0.95},
    "p95": {"temperature": 1.0, "top_p": 0.95},
    "temp": {"temperature": 1.0},
    "minp": {"temperature": 1.0, "min_p": 0.05},
}


def _requests(n: int, params: str) -> list[Any]:
    from ninfer.engine.core import SamplingParams
    from ninfer.engine.sampler import SampleRequest

    p = SamplingParams(**PARAMS[params])  # type: ignore[arg-type]
    return [SampleRequest(p, 1234 + i, 100 + i, {}, None) for i in range(n)]


def _logits(rng: np.random.Generator, n: int, vocab: int, kind: str) -> np.ndarray:
    if kind == "flat":
        x = rng.standard_normal((n, vocab)).astype(np.float32)
    else:  # LM-like: a deep tail, a few dozen plausible ids, a handful of strong ones
        x = (rng.standard_normal((n, vocab)) * 2.5 - 12).astype(np.float32)
        for r in range(n):
            x[r, rng.integers(0, vocab, 40)] = rng.uniform(-4, 6, 40).astype(np.float32)
            x[r, rng.integers(0, vocab, 4)] = rng.uniform(6, 14, 4).astype(np.float32)
    x[:, 7] = x.max(axis=1)  # a tie with the row's max at a lower id than most
    return x


def _before_dev(x: Any, reqs: list[Any], limit: int | None) -> Any:
    """The greedy rows' path before ``argmax_rows``: the rows' columns uploaded, then the one-block kernel."""
    from ninfer.cuda.sampling import _columns, sample_rows

    c = _columns(reqs)
    return sample_rows(x, c["temperature"], c["top_k"], c["top_p"], c["min_p"], c["seeds"], c["positions"],
                       None, limit, split=False)  # fmt: skip


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


def _graph_s(launch: Any, reps: int) -> float | str:
    """Per replay of ``launch`` captured in a CUDA graph (the device's time alone, no launch overhead), or the
    capture's error as a string."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with stream:
            launch()  # outside the capture: sizes this stream's workspaces
            stream.synchronize()
            stream.begin_capture()
            launch()
            graph = stream.end_capture()
            graph.launch(stream)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for _ in range(reps):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
    except Exception as e:  # noqa: BLE001 - reported in the table, the other cases still run
        return f"{type(e).__name__}: {e}"
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / reps


def _case(x: Any, name: str, reps: int) -> dict[str, Any]:
    """One case: ``greedy_before``, ``greedy`` or ``<params>/<logits>/<split|block>``."""
    import cupy

    from ninfer.cuda.sampling import _columns, argmax_rows, sample_requests_dev, sample_rows

    n = x.shape[0]
    params = name.split("/")[0] if "/" in name else "greedy"
    reqs = _requests(n, params)
    block = name == "greedy_before" or name.endswith("/block")
    dev = _before_dev if name == "greedy_before" else sample_requests_dev
    c = _columns(reqs)
    cols = (c["temperature"], c["top_k"], c["top_p"], c["min_p"], c["seeds"], c["positions"])
    if name == "greedy":
        launch = lambda: argmax_rows(x)  # noqa: E731
    else:
        launch = lambda: sample_rows(x, *cols, split=not block)  # noqa: E731
    res: dict[str, Any] = {"case": name, "rows": n, "call_ms": None, "host_ms": None}
    if block and name != "greedy_before":
        res["kernel_ms"] = 1e3 * _kernel_s(launch, max(2, reps // 10))
        res["ids"] = cupy.asnumpy(launch()).tolist()
        return res
    res["call_ms"] = 1e3 * _mean_s(lambda: cupy.asnumpy(dev(x, reqs, None)), reps)
    res["host_ms"] = 1e3 * _mean_s(lambda: dev(x, reqs, None), reps)
    res["kernel_ms"] = 1e3 * _kernel_s(launch, reps)
    res["ids"] = cupy.asnumpy(dev(x, reqs, None)).tolist()
    if not block and name != "greedy":  # the split path
        out = cupy.empty((n,), np.int32)
        g = _graph_s(lambda: sample_rows(x, *cols, out=out), reps)
        res["graph_ms"] = 1e3 * g if isinstance(g, float) else g
        if isinstance(g, float):
            assert cupy.asnumpy(out).tolist() == res["ids"], f"{name}: the graph's ids differ"
    return res


def bench_sampling(rows: list[int], vocab: int, reps: int) -> list[dict[str, Any]]:
    import cupy

    rng = np.random.default_rng(0)
    out = []
    for n in rows:
        logits = {kind: _logits(rng, n, vocab, kind) for kind in ("flat", "peaked")}
        x = cupy.asarray(logits["flat"])
        want = [int(np.argmax(r)) for r in logits["flat"]]
        cases = [_case(x, name, reps) for name in ("greedy_before", "greedy")]
        for c in cases:
            assert c["ids"] == want, f"{c['case']} at {n} rows: ids differ from NumPy's argmax"
        for kind, host in logits.items():
            x = cupy.asarray(host)
            for params in PARAMS:
                if params == "greedy":
                    continue
                new, old = (_case(x, f"{params}/{kind}/{impl}", reps) for impl in ("split", "block"))
                assert new["ids"] == old["ids"], f"{params}/{kind} at {n} rows: split and block ids differ"
                cases += [new, old]
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
    print(f"{'case':20s} {'rows':>4s} {'call_ms':>8s} {'host_ms':>8s} {'kernel_ms':>9s} {'graph_ms':>8s}")
    ms = lambda v: f"{v:8.3f}" if isinstance(v, float) else f"{'-':>8s}"  # noqa: E731
    for r in res:
        g = r.get("graph_ms")
        print(
            f"{r['case']:20s} {r['rows']:4d} {ms(r['call_ms'])} {ms(r['host_ms'])} {r['kernel_ms']:9.4f} {ms(g)}"
        )
        if isinstance(g, str):
            print(f"  graph capture failed: {g}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = [{k: v for k, v in r.items() if k != "ids"} for r in res]
        doc = {"vocab": args.vocab, "reps": args.reps, "results": rows}
        (args.out / "bench_sampling.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
