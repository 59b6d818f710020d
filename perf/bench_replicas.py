"""Replicas behind one endpoint: the router's overhead, and agent sessions on N replicas against one (one run).

    python -m perf.bench_replicas overhead [ART] [--backend reference|cuda] [--streams 8] --out DIR
    python -m perf.bench_replicas sessions --synthetic qwen3.6-27b --profile nvfp4 --backend cuda \\
        --replicas 2 --sessions 16 --turns 5 --out DIR                     # issue 20, on two GPUs

``overhead``: two servers on one Ray instance, the same artifact and engine settings: ``ninfer serve`` (one actor,
no router) and ``ninfer serve --replicas 1`` (the same single replica behind the router: rendering and hashing
the prompt, ranking, the failover wrapper, the poll task). Rounds of ``--streams`` concurrent greedy streams
(ignore_eos, ``--max-tokens`` each) alternate between them; the result is the median aggregate tok/s and TTFT of
each and the router's overhead ``1 - router/direct``.

``sessions``: ``--sessions`` concurrent agent sessions of ``--turns`` turns (a system prompt shared by every
session, a session's own task, then per turn the answer and a tool result appended), first against
``--replicas 1`` and then against ``--replicas N``, each server started and stopped in turn. Reported per side:
aggregate decode tok/s (completion tokens / wall time), TTFT of first turns and of follow-up turns, and the
follow-up affinity: turns whose cached tokens reach the previous turn's prompt (they ran where their prefix was)
and the router's own hit counter. ``--synthetic MODEL`` serves the registered shape MODEL with random weights
built on the GPU (perf/synthetic.py), with the demo artifact's tokenizer and chat template.

Writes ``replicas_{mode}.json`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .bench_serving import free_port
from .replica_sessions import run_sessions, session_summary

REPO = Path(__file__).resolve().parents[1]
ENGINE = ["--max-concurrency", "8", "--queue-depth", "16", "--prompt-tokens-details"]  # cached: usage


class Server:
    """``ninfer serve`` in a subprocess (synthetic weights through this module's ``serve-synthetic``)."""

    def __init__(self, a: argparse.Namespace, art: str, extra: list[str], log: Path, address: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        serve = [art, "--backend", a.backend, "--port", str(self.port), "--ray-address", address]
        serve += ["--actor-name", f"bench-{self.port}", *ENGINE, *a.serve_flag, *extra]
        if a.synthetic:
            cmd = [
                sys.executable,
                "-m",
                "perf.bench_replicas",
                "serve-synthetic",
                a.synthetic,
                a.profile,
                *serve,
            ]
        else:
            cmd = [sys.executable, "-m", "ninfer.cli", "serve", *serve]
        self.log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return httpx.get(self.url + "/v1/models").json()["data"][0]["id"]
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not ready after {timeout} s; see {self.log.name}")

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=30).text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def stream_round(url: str, model: str, n: int, max_tokens: int) -> dict[str, float]:
    """``n`` concurrent greedy streams: aggregate tok/s and median TTFT."""

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, float]:
        body = {"model": model, "messages": [{"role": "user", "content": f"stream {i}: tell me a story"}],
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        t0, ttft, usage = time.perf_counter(), 0.0, 0
        async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            async for line in r.aiter_lines():
                if not ttft and line.startswith("data: {") and '"delta"' in line:
                    ttft = time.perf_counter() - t0
                if line.startswith("data: {") and '"usage":{' in line:
                    usage = json.loads(line[6:])["usage"]["completion_tokens"]
        return usage, ttft

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n + 4)) as client:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(client, i) for i in range(n)))
        wall = time.perf_counter() - t0
    return {"tok_s": sum(u for u, _ in got) / wall, "ttft_s": statistics.median(t for _, t in got)}


def overhead(a: argparse.Namespace, art: str, out: Path, address: str) -> dict[str, Any]:
    sides = {"direct": Server(a, art, [], out / "serve_direct.log", address)}
    sides["router"] = Server(a, art, ["--replicas", "1"], out / "serve_router.log", address)
    try:
        models = {k: s.wait(a.start_timeout) for k, s in sides.items()}
        for k, s in sides.items():  # warm-up
            asyncio.run(stream_round(s.url, models[k], a.streams, 8))
        rounds: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
        for _ in range(a.rounds):
            for k, s in sides.items():
                rounds[k].append(asyncio.run(stream_round(s.url, models[k], a.streams, a.max_tokens)))
    finally:
        for s in sides.values():
            s.stop()
    med = {
        k: {m: statistics.median(r[m] for r in rs) for m in ("tok_s", "ttft_s")} for k, rs in rounds.items()
    }
    return {"streams": a.streams, "max_tokens": a.max_tokens, "rounds": rounds, "median": med,
            "router_overhead": round(1 - med["router"]["tok_s"] / med["direct"]["tok_s"], 4)}  # fmt: skip


def sessions(a: argparse.Namespace, art: str, out: Path, address: str) -> dict[str, Any]:
    res: dict[str, Any] = {"sessions": a.sessions, "turns": a.turns, "max_tokens": a.max_tokens}
    for n in (1, a.replicas):
        srv = Server(a, art, ["--replicas", str(n), "--preserve-thinking"], out / f"serve_x{n}.log", address)
        try:
            model = srv.wait(a.start_timeout)
            t0 = time.perf_counter()
            turns = asyncio.run(run_sessions(srv.url, model, a.sessions, a.turns, a.max_tokens, a.tool_chars))
            wall = time.perf_counter() - t0
            res[f"x{n}"] = session_summary(turns, wall, srv.metrics())
        finally:
            srv.stop()
    one, many = res["x1"], res[f"x{a.replicas}"]
    res["speedup"] = round(many["decode_tok_s"] / one["decode_tok_s"], 3)
    return res


def _table(mode: str, r: dict[str, Any]) -> str:
    if mode == "overhead":
        m = r["median"]
        return "\n".join([
            f"{'side':<8} {'tok/s':>9} {'TTFT ms':>8}",
            *(f"{k:<8} {v['tok_s']:>9.1f} {1e3 * v['ttft_s']:>8.1f}" for k, v in m.items()),
            f"router overhead at {r['streams']} streams: {100 * r['router_overhead']:.1f}%",
        ])  # fmt: skip
    keys = [k for k in r if k.startswith("x")]
    rows = [
        f"{'replicas':<9} {'decode tok/s':>12} {'TTFT 1st ms':>11} {'TTFT f/u ms':>11} {'affinity':>9} {'router hits':>11}"
    ]
    for k in keys:
        v = r[k]
        rows.append(f"{k[1:]:<9} {v['decode_tok_s']:>12.1f} {1e3 * v['ttft_first_s']:>11.0f} "
                    f"{1e3 * v['ttft_followup_s']:>11.0f} {v['followup_reuse_rate']:>9.1%} {v['router_hit_rate']:>11.1%}")  # fmt: skip
    rows.append(f"aggregate decode speed-up: {r['speedup']:.2f}x")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-synthetic"]:
        from .replica_synthetic import serve_synthetic

        return serve_synthetic(argv[1], argv[2], argv[3:])
    p = argparse.ArgumentParser(prog="python -m perf.bench_replicas", description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("overhead", "sessions"))
    p.add_argument("artifact", nargs="?", help="default: the demo artifact, built in a temporary directory")
    p.add_argument("--backend", default="reference", choices=("reference", "cuda"))
    p.add_argument(
        "--synthetic", default=None, help="serve this registered model with synthetic weights (GPU)"
    )
    p.add_argument("--profile", default="nvfp4", help="--synthetic's weight profile (perf/synthetic.py)")
    p.add_argument("--out", default="perf/results", help="directory for replicas_MODE.json and server logs")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--tool-chars", type=int, default=1200, help="characters of each turn's tool result")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--serve-flag", action="append", default=[], help="extra `ninfer serve` flag (repeatable)")
    a = p.parse_args(argv)
    import ray

    from ninfer.demo import build_demo

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # the Ray workers (started by this process's Ray) import perf.replica_synthetic: give them the repository
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    art = a.artifact or str(build_demo(os.path.join(tempfile.mkdtemp(), "demo.ninfer")))
    ray.init(include_dashboard=False, namespace="ninfer", log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        res = (overhead if a.mode == "overhead" else sessions)(a, art, out, address)
    finally:
        ray.shutdown()
    res.update(mode=a.mode, backend=a.backend, synthetic=a.synthetic, profile=a.profile if a.synthetic else None,
               serve_flags=a.serve_flag, cpus=os.cpu_count(), argv=["python", "-m", "perf.bench_replicas", *argv])  # fmt: skip
    (out / f"replicas_{a.mode}.json").write_text(json.dumps(res, indent=1))
    print(_table(a.mode, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
