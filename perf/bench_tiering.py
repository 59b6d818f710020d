"""The host tier on the GPU (docs/tiering.md): restoring a long prefix from pinned host memory against recomputing
it, and what a restore costs another lane's decode. Synthetic weights at the 27B's shape (perf/synthetic.py).

    python -m perf.bench_tiering --out perf/results                    # 8K and 32K prefixes, about 5 minutes
    python -m perf.bench_tiering --sizes 8192 --out /tmp/t             # one size, quicker
    python -m perf.bench_tiering --plan                                # no GPU: the copy and memory plans

One network, then per size one engine on the CUDA runner, two lanes, driven step by step in this thread:
1. the prefix: a ``size``-token prompt, one token generated (its prefill time is the recompute cost);
2. a filler prompt of half that length takes the device pool, so the prefix (KV pages and checkpoints) spills to
   the host tier;
3. a short request decodes in lane 0; its step times before anything else happens are the baseline;
4. the next turn of the prefix (the whole prefix plus ``--new`` tokens) restores it from the host while lane 0
   keeps decoding: the restore's bytes and copy time (events on the copy stream), the effective GB/s, the turn's
   time to first token, and every step from the submission to the turn's first token, each classified:
   - restore steps: the restore is issued or in flight and the turn computes nothing (its lane waits for the
     copy). The stall is the longest of them less the baseline median, in baseline steps; target <= 1.
   - prefill steps: the turn's new tokens prefill beside lane 0's decode. That is prefill interference, which
     any admitted request causes (``--new`` tokens here), not the restore's: reported apart, never in the stall.
Each step also reports the host time spent issuing copies (``issue_ms``: the tier queues them and issues them
while the GPU runs the step, ``ninfer/cuda/host_tier.py``) and pinning host memory (``pin_ms``: 0, the runner pins
the whole tier at start-up; the table gives that time).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "run_size", "classify"]


def _settings(args: argparse.Namespace, size: int) -> dict[str, Any]:
    """The engine: room for the prefix and half of it again; the prefix one node (checkpoint stride = its length)
    so the filler spills it whole; one reserved sequence, so the decoding lane's releases the filler's and the
    next turn can spill the filler to make room for the restore while that lane runs."""
    return dict(
        max_concurrency=2, queue_depth=4, max_context=size + args.new + 64, reserved_sequences=1,
        kv_capacity=size + size // 2, prefill_chunk=args.chunk,
        checkpoint_stride=args.stride or size + 64, host_cache_gib=args.host_gib, tier_checksum=args.checksum,
    )  # fmt: skip


class _Recorder:
    """Wraps the runner's ``execute``: what each batch held and the host time its copies took."""

    def __init__(self, runner: Any) -> None:
        self.runner, self.inner, self.last = runner, runner.execute, {}
        runner.execute = self

    def __call__(self, batch: Any) -> None:
        tier = self.runner.tier
        issue0, pin0 = tier.issue_seconds, tier.pin_seconds
        self.inner(batch)
        self.last = dict(
            decode=sum(1 for w in batch.work if not w.prefill),
            prefill_tokens=sum(len(w.token_ids) for w in batch.work if w.prefill),
            spills=sum(1 for c in batch.copies if not c.ticket),
            restores=len({c.ticket for c in batch.copies if c.ticket}),
            issue_ms=(tier.issue_seconds - issue0) * 1e3,
            pin_ms=(tier.pin_seconds - pin0) * 1e3,
        )


def _step(eng: Any, rec: _Recorder) -> dict[str, Any]:
    restoring = eng._sched.restoring
    rec.last = {}
    t0 = time.perf_counter()
    eng.step()
    return dict(ms=(time.perf_counter() - t0) * 1e3, restoring=restoring, **rec.last)


def classify(steps: list[dict[str, Any]], base_ms: float) -> dict[str, Any]:
    """The turn's steps: restore steps (copy issued or in flight, the turn computing nothing) and prefill steps."""
    restore = [s for s in steps if (s.get("restores") or s["restoring"]) and not s.get("prefill_tokens")]
    prefill = [s for s in steps if s.get("prefill_tokens")]
    worst = max((s["ms"] for s in restore), default=0.0)
    return dict(
        steps_during_restore=len(restore),
        max_step_during_restore_ms=worst,
        stall_ms=max(0.0, worst - base_ms),
        stall_steps=max(0.0, worst - base_ms) / base_ms,
        prefill_steps=len(prefill),
        max_prefill_step_ms=max((s["ms"] for s in prefill), default=0.0),
        issue_ms=sum(s.get("issue_ms", 0.0) for s in steps),
        pin_ms_in_steps=sum(s.get("pin_ms", 0.0) for s in steps),
    )


def run_size(net: Any, mc: Any, args: argparse.Namespace, size: int, log: Any) -> dict[str, Any]:
    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.engine import Engine, EngineConfig

    cfg = EngineConfig(**_settings(args, size))
    t0 = time.perf_counter()
    runner = CudaModelRunner(net, mc, cfg)
    res: dict[str, Any] = dict(context=size, new=args.new, runner_start_s=time.perf_counter() - t0)
    res.update(memory_plan=runner.plan.report(), page_bytes=runner.page_bytes)
    res.update(host_pages=runner.host_pages, snapshot_bytes=runner.snapshot_bytes)
    log(res["memory_plan"])
    eng = Engine(runner, mc, None, cfg, background=False)
    rec = _Recorder(runner)
    rng = np.random.default_rng(size)
    ids = lambda n: rng.integers(0, mc.vocab_size, n).tolist()  # noqa: E731
    prefix = ids(size)

    def drive(h: Any) -> Any:
        while not h.done:
            eng.step()
        return h.result()

    c1 = drive(eng.submit(prefix, max_tokens=1, ignore_eos=True, checkpoint_at=()))
    res["recompute_s"] = c1.metrics.prefill_s
    log(f"{size}: prefix computed in {c1.metrics.prefill_s:.2f} s")
    drive(eng.submit(ids(size // 2), max_tokens=1, ignore_eos=True, checkpoint_at=()))
    st = eng.stats()
    res.update(spills=st.spills, spill_bytes=st.spill_bytes)
    log(f"{size}: the filler pushed it to the host: {st.spills} spills, {st.spill_bytes / 1e9:.2f} GB")
    dec = eng.submit(ids(64), max_tokens=args.decode_steps, ignore_eos=True)
    while not dec.done and eng._sched.lanes[0] is not None and eng._sched.lanes[0].num_generated < 4:
        eng.step()
    res["host_pin_s"] = runner.tier.arena.pin_seconds  # the whole tier, pinned when the runner was made
    base = [_step(eng, rec)["ms"] for _ in range(16)]
    res["host_pinned_bytes"] = runner.tier.host_bytes
    turn = eng.submit(prefix + c1.token_ids + ids(args.new), max_tokens=4, ignore_eos=True, checkpoint_at=())
    steps: list[dict[str, Any]] = []
    while not turn.done and sum(s.get("prefill_tokens", 0) for s in steps) < args.new and len(steps) < 10000:
        steps.append(_step(eng, rec))  # until the turn's new tokens have run (its first token)
    tail = [_step(eng, rec) for _ in range(4)]  # two lanes decoding (for reference)
    dec.cancel()
    c2 = drive(turn)
    drive(dec)
    m = c2.metrics
    median = statistics.median(base)
    res["turn_metrics"] = {f: getattr(m, f) for f in m.__struct_fields__}
    if not m.host_cached_tokens:
        log(f"warning: the turn did not restore from the host: {res['turn_metrics']}")
    res.update(
        restore_s=m.restore_s, restore_bytes=m.restore_bytes, host_cached_tokens=m.host_cached_tokens,
        restore_GBps=m.restore_bytes / m.restore_s / 1e9 if m.restore_s else 0.0,
        speedup=res["recompute_s"] / m.restore_s if m.restore_s else 0.0,
        ttft_turn_s=m.ttft_s, ttft_recompute_s=c1.metrics.ttft_s, decode_step_ms=median,
        two_lane_step_ms=statistics.median(s["ms"] for s in tail), steps=steps, **classify(steps, median),
    )  # fmt: skip
    eng.close()
    return res


def table(results: list[dict[str, Any]]) -> str:
    def col(r: dict[str, Any]) -> list[str]:
        return [
            f"{r['context']} ({r['host_cached_tokens']})",
            f"{r['recompute_s']:.3f}",
            f"{r['restore_s'] * 1e3:.1f}",
            f"{r['restore_bytes'] / 1e9:.3f}",
            f"{r['restore_GBps']:.1f}",
            f"{r['speedup']:.0f}x",
            f"{r['ttft_turn_s']:.3f} / {r['ttft_recompute_s']:.3f}",
            f"{r['decode_step_ms']:.2f}",
            f"{r['max_step_during_restore_ms']:.2f} ({r['steps_during_restore']})",
            f"{r['stall_ms']:.2f} = {r['stall_steps']:.2f} steps",
            f"{r['issue_ms']:.2f} / {r['pin_ms_in_steps']:.2f}",
            f"{r['max_prefill_step_ms']:.1f} ({r['prefill_steps']})",
            f"{r['two_lane_step_ms']:.2f}",
            f"{r['host_pin_s']:.2f} ({r['host_pinned_bytes'] / (1 << 30):.0f} GiB)",
        ]

    names = [
        "prefix tokens (restored)",
        "recompute (prefill) s",
        "restore ms (copy stream)",
        "restore GB",
        "restore GB/s",
        "speedup (target >= 30x)",
        "TTFT next turn / first, s",
        "lane-0 decode step ms",
        "longest restore step ms (n)",
        "stall (target <= 1 step)",
        "copy issue / pin ms in steps",
        "turn prefill step ms (n)",
        "two-lane decode step ms",
        "host tier pinned at start-up s (size)",
    ]
    cols = [col(r) for r in results]
    w = max(len(n) for n in names)
    widths = [max(len(c[i]) for i in range(len(names))) for c in cols]
    return "\n".join(
        f"{n:<{w}}  " + "  ".join(f"{c[i]:>{cw}}" for c, cw in zip(cols, widths, strict=True))
        for i, n in enumerate(names)
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.bench_tiering", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="27b", help="27b or 35b (perf/cli.py MODELS)")
    p.add_argument("--profile", default="nvfp4", help="nvfp4, q4, w8 or bf16")
    p.add_argument("--activations", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--sizes", default="8192,32768", help="prefix tokens restored, comma-separated")
    p.add_argument("--new", type=int, default=64, help="new tokens of the next turn")
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk")
    p.add_argument("--stride", type=int, default=0, help="checkpoint stride (0: past the prefix)")
    p.add_argument(
        "--decode-steps",
        type=int,
        default=2000,
        help="budget of the decoding lane (its pages are taken at admission)",
    )
    p.add_argument("--host-gib", type=float, default=16.0, help="host tier size")
    p.add_argument("--checksum", action="store_true", help="tier_checksum (slower: debug)")
    p.add_argument("--plan", action="store_true", help="no GPU: print the copy and device-memory plans")
    p.add_argument("--out", default="perf/results", help="directory for the JSON and the table")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes: comma-separated token counts, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 256:
        p.error("--sizes: at least one size of 256 tokens or more")
    return args


def _plan(args: argparse.Namespace, mc: Any) -> int:
    from .tiering_plan import copy_plan, device_plan

    for size in args.sizes:
        st = _settings(args, size)
        print(f"{size} tokens: {device_plan(mc, st).report()} (weights estimated)")
        print(f"{size} tokens: {json.dumps(copy_plan(mc, st, size, args.new, args.decode_steps))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from ninfer.artifact.registry import MODELS as REG

    from .cli import MODELS

    args = _args(argv)
    mc = REG[MODELS[args.model]].config
    if args.plan:
        return _plan(args, mc)
    import cupy

    from ninfer.cuda.model import CudaQwen36

    from .synthetic import synthetic_tensors

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    net = CudaQwen36(mc, synthetic_tensors(mc, args.profile), act_dtype=args.activations)
    net.warmup()
    head = dict(device=name, date=time.strftime("%Y-%m-%d %H:%M:%S"), model=args.model, profile=args.profile)
    results = []
    for size in sorted(args.sizes):
        results.append({**head, **run_size(net, mc, args, size, log)})
        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()  # the next runner plans from the free memory
        (out / "bench_tiering.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    print(text, flush=True)
    (out / "bench_tiering.txt").write_text(f"{name} {head['date']} {args.model} {args.profile}\n{text}\n")
    log(f"wrote {out / 'bench_tiering.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
