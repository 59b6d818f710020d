"""The host tier on the GPU (docs/tiering.md): restoring a long prefix from pinned host memory against recomputing
it, and what a restore costs another lane's decode. Synthetic weights at the 27B's shape (perf/synthetic.py).

    python -m perf.bench_tiering --out perf/results              # 32K-token prefix, about 5 minutes on an H200
    python -m perf.bench_tiering --context 8192 --out /tmp/t     # quicker

One engine on the CUDA runner, two lanes, driven step by step in this thread (``background=False``):
1. the prefix: a ``--context``-token prompt, one token generated (its prefill time is the recompute cost);
2. a filler prompt of half that length takes the device pool, so the prefix (KV pages and checkpoints) spills to
   the host tier;
3. a short request decodes in lane 0; its step times before anything else happens are the baseline;
4. the next turn of the prefix (the whole prefix plus ``--new`` tokens) restores it from the host while lane 0
   keeps decoding: the restore's bytes and copy time (events on the copy stream), the effective GB/s, the turn's
   time to first token, and lane 0's step times while the restore is in flight (the stall: the longest of them
   less the baseline median).
Targets (the issue): restore >= 30x faster than recompute; no step of lane 0 longer than two baseline steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "run"]


def _engine(args: argparse.Namespace) -> Any:
    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.engine import Engine, EngineConfig

    from .cli import MODELS
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[args.model]].config
    net = CudaQwen36(mc, synthetic_tensors(mc, args.profile), act_dtype=args.activations)
    net.warmup()
    cfg = EngineConfig(**_settings(args))
    runner = CudaModelRunner(net, mc, cfg)
    return Engine(runner, mc, None, cfg, background=False), mc


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The engine: room for the prefix and half of it again; the prefix one node (checkpoint stride = its length)
    so the filler spills it whole; one reserved sequence, so the decoding lane's releases the filler's and the
    next turn can spill the filler to make room for the restore while that lane runs."""
    return dict(
        max_concurrency=2, queue_depth=4, max_context=args.context + args.new + 64, reserved_sequences=1,
        kv_capacity=args.context + args.context // 2, prefill_chunk=args.chunk,
        checkpoint_stride=args.stride or args.context + 64, host_cache_gib=args.host_gib,
        tier_checksum=args.checksum,
    )  # fmt: skip


def _drive(eng: Any, handles: list[Any]) -> None:
    while not all(h.done for h in handles):
        eng.step()


def _timed_steps(eng: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        eng.step()
        out.append(time.perf_counter() - t0)
    return out


def run(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    eng, mc = _engine(args)
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(0, mc.vocab_size, n).tolist()  # noqa: E731
    prefix = ids(args.context)
    res: dict[str, Any] = {
        "model": args.model,
        "profile": args.profile,
        "context": args.context,
        "new": args.new,
    }
    res["host_pages"], res["page_bytes"] = eng._runner.host_pages, eng._runner.page_bytes
    res["snapshot_bytes"] = eng._runner.snapshot_bytes
    first = eng.submit(prefix, max_tokens=1, ignore_eos=True, checkpoint_at=())
    _drive(eng, [first])
    c1 = first.result()
    res["recompute_s"] = c1.metrics.prefill_s
    log(f"prefix of {args.context} tokens computed in {c1.metrics.prefill_s:.2f} s")
    filler = eng.submit(ids(args.context // 2), max_tokens=1, ignore_eos=True, checkpoint_at=())
    _drive(eng, [filler])
    st = eng.stats()
    res["spills"], res["spill_bytes"] = st.spills, st.spill_bytes
    log(f"filler pushed it to the host: {st.spills} spills, {st.spill_bytes / 1e9:.2f} GB")
    dec = eng.submit(ids(64), max_tokens=args.decode_steps, ignore_eos=True)
    while not dec.done and eng._sched.lanes[0] is not None and eng._sched.lanes[0].num_generated < 4:
        eng.step()
    base = _timed_steps(eng, 16)
    turn = eng.submit(prefix + c1.token_ids + ids(args.new), max_tokens=4, ignore_eos=True, checkpoint_at=())
    during: list[float] = []
    while not turn.done:
        restoring = eng._sched.restoring or not during
        t = _timed_steps(eng, 1)[0]
        if restoring:
            during.append(t)
    dec.cancel()  # its budget only had to outlast the restore
    _drive(eng, [dec])
    c2 = turn.result()
    m = c2.metrics
    res["turn_metrics"] = {f: getattr(m, f) for f in m.__struct_fields__}
    median = statistics.median(base)
    if not m.host_cached_tokens or m.queue_wait_s > 10 * median:
        log(f"warning: the turn did not restore while lane 0 decoded as planned: {res['turn_metrics']}")
    res.update(
        restore_s=m.restore_s, restore_bytes=m.restore_bytes, host_cached_tokens=m.host_cached_tokens,
        restore_GBps=m.restore_bytes / m.restore_s / 1e9 if m.restore_s else 0.0,
        speedup=res["recompute_s"] / m.restore_s if m.restore_s else 0.0,
        ttft_turn_s=m.ttft_s, ttft_recompute_s=c1.metrics.ttft_s,
        decode_step_ms=median * 1e3, steps_during_restore=len(during),
        max_step_during_restore_ms=max(during) * 1e3, stall_ms=(max(during) - median) * 1e3,
        stall_steps=(max(during) - median) / median,
    )  # fmt: skip
    eng.close()
    return res


def table(r: dict[str, Any]) -> str:
    rows = [
        ("prefix tokens (restored)", f"{r['context']} ({r['host_cached_tokens']})"),
        ("recompute (prefill) s", f"{r['recompute_s']:.3f}"),
        ("restore s", f"{r['restore_s']:.4f}"),
        ("restore bytes", f"{r['restore_bytes'] / 1e9:.3f} GB"),
        ("restore GB/s", f"{r['restore_GBps']:.1f}"),
        ("restore speedup", f"{r['speedup']:.0f}x (target >= 30x)"),
        ("TTFT next turn / first turn", f"{r['ttft_turn_s']:.3f} / {r['ttft_recompute_s']:.3f} s"),
        ("lane-0 decode step (median)", f"{r['decode_step_ms']:.2f} ms"),
        ("longest step while restoring", f"{r['max_step_during_restore_ms']:.2f} ms ({r['steps_during_restore']} steps)"),
        ("stall", f"{r['stall_ms']:.2f} ms = {r['stall_steps']:.2f} steps (target <= 1)"),
    ]  # fmt: skip
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m perf.bench_tiering", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="27b", help="27b or 35b (perf/cli.py MODELS)")
    p.add_argument("--profile", default="nvfp4", help="nvfp4, q4, w8 or bf16")
    p.add_argument("--activations", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--context", type=int, default=32768, help="prefix tokens restored")
    p.add_argument("--new", type=int, default=64, help="new tokens of the next turn")
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk")
    p.add_argument("--stride", type=int, default=0, help="checkpoint stride (0: past the prefix)")
    p.add_argument("--decode-steps", type=int, default=2000, help="budget of the decoding lane")
    p.add_argument("--host-gib", type=float, default=16.0, help="host tier size")
    p.add_argument("--checksum", action="store_true", help="tier_checksum (slower: debug)")
    p.add_argument("--out", default="perf/results", help="directory for the JSON and the table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import cupy

    args = _args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    res = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), **run(args, log)}
    text = table(res)
    print(text, flush=True)
    (out / "bench_tiering.json").write_text(json.dumps(res, indent=1))
    (out / "bench_tiering.txt").write_text(text + "\n")
    log(f"wrote {out / 'bench_tiering.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
