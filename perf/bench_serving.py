"""Throughput of N concurrent streams through HTTP + Ray + the actor, against the engine alone, in one run.

    python -m ninfer.perf.bench_serving [ARTIFACT] [--backend reference|cuda|null] [--streams 8]
        [--max-tokens 256] [--rounds 3] [--null-step-ms 1.5] [--null-busy] [-o result.json]

Both sides run the same greedy requests (ignore_eos, so every stream generates exactly --max-tokens) with the
same engine settings on the same backend. The engine side submits straight to an ``Engine`` in this process; the
stack side starts ``ninfer serve`` (local Ray) and streams with httpx. Rounds alternate between the two, so the
two engines (both resident, on one GPU with ``--backend cuda``) never run at once; medians are reported.

``--backend null`` runs no model (``ninfer/engine/null_runner.py``): each engine step takes ``--null-step-ms``
(1.5 ms: 8 lanes at ~5,500 tok/s, the demo model's engine on the H200) and emits text tokens, so the stack's cost
at a GPU's token rate is measured on any machine. The step sleeps (freeing the GIL) unless ``--null-busy``: then it
spins holding the GIL, as the CUDA engine's thread is busy with Python most of a step, so the work the stack does
on the engine's process (Ray's threads, the actor's event loop) costs throughput as it does on the GPU.
``--null-step-ms 0.66 --null-busy``: 8 lanes at ~12,000 tok/s, the demo model's CUDA engine on the H200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

ENGINE = {"max_concurrency": 8, "queue_depth": 8, "max_context": 2048, "kv_capacity": 32768}


def engine_round(eng: object, prompts: list[list[int]], max_tokens: int) -> float:
    t0 = time.perf_counter()
    handles = [eng.submit(p, max_tokens=max_tokens, temperature=0.0, ignore_eos=True) for p in prompts]  # type: ignore[attr-defined]
    n = sum(h.result().usage.completion_tokens for h in handles)
    return n / (time.perf_counter() - t0)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu(stat: str) -> tuple[int, float]:
    """The parent id and CPU seconds (user + system) of a /proc ``stat`` line."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def _tree(root: int) -> dict[int, tuple[float, str]]:
    """Process ``root`` and its descendants: CPU seconds and command line of each. Empty without /proc."""
    procs: dict[int, tuple[int, float, str]] = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode("latin-1")
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().decode("latin-1")
        except OSError:
            continue
        procs[int(d)] = (*_stat_cpu(stat), cmd)
    out: dict[int, tuple[float, str]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in out or pid not in procs:
            continue
        out[pid] = procs[pid][1:]
        todo += [p for p, (ppid, _, _) in procs.items() if ppid == pid]
    return out


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system) of process ``root`` and its descendants, by part: ``api`` (the serve process
    itself: HTTP and the Ray client), ``actor`` (the engine actor: the engine and the actor's event loop) and
    ``ray`` (Ray's daemons and idle workers). Empty where /proc is not readable."""
    out: dict[str, float] = {}
    for pid, (cpu, cmd) in _tree(root).items():
        part = "api" if pid == root else "actor" if cmd.startswith("ray::EngineActor") else "ray"
        out[part] = out.get(part, 0.0) + cpu
    return out


def actor_threads(root: int) -> dict[int, float]:
    """CPU seconds of each thread of the engine actor under ``root``, by thread id."""
    out: dict[int, float] = {}
    for pid, (_, cmd) in _tree(root).items():
        if not cmd.startswith("ray::EngineActor"):
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    out[int(tid)] = _stat_cpu(f.read().decode("latin-1"))[1]
            except OSError:
                continue
    return out


def engine_thread_split(before: dict[int, float], after: dict[int, float], tokens: int) -> dict[str, float]:
    """The actor's CPU per token (microseconds) split into its busiest thread (the engine's step loop) and all
    the others (its event loop, Ray's threads): the others are what the stack adds beside the engine in its
    process."""
    deltas = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    if not deltas:
        return {}
    return {
        "engine_thread": round(1e6 * deltas[0] / tokens, 1),
        "other_threads": round(1e6 * sum(deltas[1:]) / tokens, 1),
    }


def cpu_per_token(before: dict[str, float], after: dict[str, float], tokens: int) -> dict[str, float]:
    """Microseconds of CPU per generated token, by part, between two ``tree_cpu`` readings."""
    return {k: round(1e6 * (after.get(k, 0.0) - before.get(k, 0.0)) / tokens, 1) for k in after}


async def stack_round(url: str, model: str, n: int, max_tokens: int) -> float:
    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"stream {i}: tell me a story"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            usage = 0
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"usage":{' in line:
                    usage = json.loads(line[6:])["usage"]["completion_tokens"]
            return usage

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n + 4)) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(client, i) for i in range(n)))
        return sum(counts) / (time.perf_counter() - t0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", nargs="?")
    p.add_argument("--backend", default="reference", choices=["reference", "cuda", "null"])
    p.add_argument("--null-step-ms", type=float, default=1.5, help="--backend null: one engine step's time")
    p.add_argument("--null-busy", action="store_true", help="--backend null: the step spins holding the GIL")
    p.add_argument("-o", "--output", help="also write the result JSON here")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve-flag", action="append", default=[], help="extra `ninfer serve` flag (repeatable)")
    a = p.parse_args()
    from ninfer.demo import build_demo
    from ninfer.model import open_engine

    art = a.artifact or build_demo(os.path.join(tempfile.mkdtemp(), "demo.ninfer"))
    options = {"step_s": a.null_step_ms / 1000, "busy": a.null_busy} if a.backend == "null" else None
    eng = open_engine(art, backend=a.backend, backend_options=options, **ENGINE)
    port = free_port()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE.items()]
    if a.backend == "null":
        flags.append(f"--null-step-ms={a.null_step_ms}")
        if a.null_busy:
            flags.append("--null-busy")
    srv = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ninfer.cli",
            "serve",
            art,
            "--backend",
            a.backend,
            f"--port={port}",
            *flags,
            *a.serve_flag,
        ],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        tok = eng.tokenizer
        prompts = [tok.encode(f"stream {i}: tell me a story") for i in range(a.streams)]
        engine_round(eng, prompts, 8)  # warm-up both sides
        asyncio.run(stack_round(url, model, a.streams, 8))
        e_tps, s_tps, e_cpu, s_cpu, a_split = [], [], [], [], []
        # CPU seconds over all rounds together (one clock tick is ~5 us a token in one round of 2048 tokens)
        e_total, s_total = 0.0, {}
        tokens = a.streams * a.max_tokens
        for _ in range(a.rounds):
            c0 = time.process_time()
            e_tps.append(engine_round(eng, prompts, a.max_tokens))
            e_total += time.process_time() - c0
            e_cpu.append(round(1e6 * (time.process_time() - c0) / tokens, 1))
            c1, t1 = tree_cpu(srv.pid), actor_threads(srv.pid)
            s_tps.append(asyncio.run(stack_round(url, model, a.streams, a.max_tokens)))
            c2, t2 = tree_cpu(srv.pid), actor_threads(srv.pid)
            s_cpu.append(cpu_per_token(c1, c2, tokens))
            a_split.append(engine_thread_split(t1, t2, tokens))
            for k in c2:
                s_total[k] = s_total.get(k, 0.0) + c2[k] - c1.get(k, 0.0)
        e, s = statistics.median(e_tps), statistics.median(s_tps)
        parts = {k: statistics.median(c.get(k, 0.0) for c in s_cpu) for k in s_cpu[0]} if s_cpu[0] else {}
        result = {
            "backend": a.backend,
            "streams": a.streams,
            "max_tokens": a.max_tokens,
            "engine_tok_s": e_tps,
            "stack_tok_s": s_tps,
            "stack_cost": round(1 - s / e, 4),
            # per round pair (engine round, then the stack round right after it): the machine's CPU speed drifts
            # between rounds (the engine alone varied 7.6-13.1k tok/s in one H200 run), less within a pair
            "stack_cost_paired": [round(1 - si / ei, 4) for ei, si in zip(e_tps, s_tps, strict=True)],
            "stack_cost_paired_median": 0.0,
            # CPU microseconds per token: the engine alone (this process), the stack's processes by part
            "engine_cpu_us_per_token": e_cpu,
            "stack_cpu_us_per_token": s_cpu,
            # the same over all rounds together (finer than one round's clock ticks)
            "engine_cpu_us_per_token_all": round(1e6 * e_total / (tokens * a.rounds), 1),
            "stack_cpu_us_per_token_all": {
                k: round(1e6 * v / (tokens * a.rounds), 1) for k, v in s_total.items()
            },
            # the actor's CPU per token: its engine thread, and its other threads (what the stack adds beside it)
            "actor_cpu_us_per_token_split": a_split,
            "serve_flags": a.serve_flag,
            "null_step_ms": a.null_step_ms if a.backend == "null" else None,
            "null_busy": a.null_busy if a.backend == "null" else None,
            "cpus": os.cpu_count(),
        }
        result["stack_cost_paired_median"] = round(statistics.median(result["stack_cost_paired"]), 4)
        print(json.dumps(result))
        if a.output:
            with open(a.output, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
        print(
            f"{a.streams} streams x {a.max_tokens} tokens: engine alone {e:.0f} tok/s, "
            f"HTTP+Ray {s:.0f} tok/s, stack cost {100 * (1 - s / e):.1f}% (medians); per round pair "
            + " ".join(f"{100 * c:.1f}%" for c in result["stack_cost_paired"])
            + f", their median {100 * result['stack_cost_paired_median']:.1f}%"
        )
        if parts:
            total, eng_us = sum(parts.values()), statistics.median(e_cpu)
            print(
                f"CPU per token (median): engine alone {eng_us:.1f} us; stack {total:.1f} us = "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items()))
                + f"; the stack's own: {total - eng_us:.1f} us"
            )
            all_eng, all_parts = e_total * 1e6 / (tokens * a.rounds), result["stack_cpu_us_per_token_all"]
            print(
                f"CPU per token (all rounds): engine alone {all_eng:.1f} us; stack {sum(all_parts.values()):.1f} us = "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(all_parts.items()))
                + f"; the stack's own: {sum(all_parts.values()) - all_eng:.1f} us"
            )
        if a_split and a_split[0]:
            avg = {k: statistics.fmean(x.get(k, 0.0) for x in a_split) for k in a_split[0]}
            print(
                f"actor CPU per token (all rounds): engine thread {avg['engine_thread']:.1f} us, "
                f"its other threads {avg['other_threads']:.1f} us"
            )
    finally:
        srv.terminate()
        srv.wait(30)
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
