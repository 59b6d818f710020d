"""How long one huge request stalls everyone else: a live ``ninfer serve`` (demo artifact, reference backend, local
Ray), one streaming request running, ``/health`` probed every 20 ms, then one request of many small messages.

    python -m ninfer.perf.bench_stall [--messages 1000000 ...] [--shape plain|parts] [--via http|job]
        [--concurrent N] [-o out.json]

Reports the longest gap between two streamed chunks of the running request and the slowest ``/health`` answer,
each before the huge request (the baseline) and while it is in flight (from its send to its answer), with the
huge request's own status, error code and time. The stream's items come every ``--stream-interval-ms`` (50 ms),
so a gap well past that is the actor (or the API) holding the stream up. ``--via job`` sends the huge request as
a Python job straight to the actor (``EngineClient.chat``), so the API process does no work for it: what stalls
then is the actor alone. ``--shape parts``: each message's content is a list of one text part (an object inside a
list inside an object: containers the garbage collector tracks), not a string.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

MODEL = "ninfer-demo"
CHAT = "/v1/chat/completions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    artifact: str, address: str, tmp: Path, args: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    """``ninfer serve`` on ``artifact`` joined to the Ray at ``address``; its URL once ``/health`` answers."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "ninfer.cli",
        "serve",
        artifact,
        "--port",
        str(port),
        "--backend",
        "reference",
    ]
    cmd += ["--ray-address", address, *args]
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {(tmp / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready")


class Probe:
    """A streaming request's chunk arrival times and ``/health`` answer times, recorded on two threads."""

    def __init__(self, url: str, stream_tokens: int, headers: dict[str, str] | None = None) -> None:
        self.url, self.stream_tokens, self.headers = url, stream_tokens, headers or {}
        self.chunks: list[float] = []
        self.health: list[tuple[float, float]] = []  # (sent, seconds)
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._stream), threading.Thread(target=self._health)]

    def _stream(self) -> None:
        body = {"model": MODEL, "stream": True, "max_tokens": self.stream_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": "count"}]}  # fmt: skip
        with (
            httpx.Client(timeout=300, headers=self.headers) as c,
            c.stream("POST", self.url + CHAT, json=body) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.chunks.append(time.perf_counter())
                if self.done.is_set():
                    break

    def _health(self) -> None:
        with httpx.Client(timeout=300) as c:
            while not self.done.is_set():
                t = time.perf_counter()
                c.get(self.url + "/health")
                self.health.append((t, time.perf_counter() - t))
                time.sleep(0.02)

    def __enter__(self) -> Probe:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        for t in self.threads:
            t.join()

    def worst(self, lo: float, hi: float) -> dict[str, float]:
        """The longest chunk gap ending in [lo, hi] and the slowest /health sent in [lo, hi], in seconds."""
        gaps = [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False) if lo <= b <= hi]
        health = [s for t, s in self.health if lo <= t <= hi]
        return {
            "max_gap_s": round(max(gaps, default=float("nan")), 4),
            "chunks": len(gaps),
            "max_health_s": round(max(health, default=float("nan")), 4),
            "health_probes": len(health),
        }


def message(shape: str) -> dict[str, Any]:
    """The huge request's every message: an empty user turn, its content a string or a list of one text part."""
    return {"role": "user", "content": "" if shape == "plain" else [{"type": "text", "text": ""}]}


def http_sender(url: str, messages: int, shape: str) -> Any:
    """The body built now, before the measurement: ``json.dumps`` of a million messages is one C call holding this
    process's GIL for ~0.5-1 s, during which the probe's threads (here) could record nothing, and that pause read as
    the server's stream gap (before session 36). ``send()`` -> (status, code) posts it."""
    body = json.dumps({"model": MODEL, "max_tokens": 2, "messages": [message(shape)] * messages}).encode()

    def send() -> tuple[int, str | None]:
        r = httpx.post(url + CHAT, content=body, timeout=300)
        try:
            return r.status_code, r.json()["error"]["code"]
        except Exception:
            return r.status_code, None

    return send


_JOB = """
import json, sys, ray
from ninfer.actors import connect
from ninfer.actors.client import GenerationError
ray.init(address=sys.argv[1], namespace="ninfer", log_to_driver=False)
client = connect(sys.argv[2])
one = sys.argv[4]
messages = [json.loads(one) for _ in range(int(sys.argv[3]))]  # distinct objects, as a decoded body's are
print("ready", flush=True)
sys.stdin.readline()
try:
    client.chat(messages, max_tokens=2)
    print(200, "-")
except GenerationError as e:
    print(e.status, e.code)
"""


def job_sender(address: str, actor: str, messages: int, shape: str) -> Any:
    """A Python job in its own process (its encoding and Ray's are not this process's: the stream is read here),
    the request built and Ray joined before it is told to send: ``send()`` -> (status, code)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _JOB, address, actor, str(messages), json.dumps(message(shape))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"

    def send() -> tuple[int, str | None]:
        out, _ = proc.communicate("go\n", timeout=300)
        status, code = out.split()[-2:]
        return int(status), None if code == "-" else code

    return send


def together(sends: list[Any]) -> Any:
    """One ``send()`` that runs every sender at once, each on its own thread (``--concurrent``); -> the first's
    (status, code)."""

    def send() -> tuple[int, str | None]:
        with ThreadPoolExecutor(len(sends)) as pool:
            return list(pool.map(lambda f: f(), sends))[0]

    return send


def measure(
    url: str, send: Any, stream_tokens: int, settle_s: float = 1.5, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Start the probe, let it settle, ``send()`` the huge request (-> status, error code), keep probing 0.5 s."""
    with Probe(url, stream_tokens, headers) as p:
        while not p.chunks:
            time.sleep(0.01)
        time.sleep(settle_s)
        t0 = time.perf_counter()
        status, code = send()
        t1 = time.perf_counter()
        time.sleep(0.5)  # a stall that outlasts the answer still counts
        t2 = time.perf_counter()
    return {
        "status": status,
        "code": code,
        "request_s": round(t1 - t0, 3),
        "before": p.worst(t0 - settle_s + 0.2, t0),
        "during": p.worst(t0, t2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--shape", choices=["plain", "parts"], default="plain", help="each message's content")
    ap.add_argument("--stream-tokens", type=int, default=4000)
    ap.add_argument("--via", choices=["http", "job"], default="http", help="how the huge request is sent")
    ap.add_argument("--concurrent", type=int, default=1, help="huge requests sent at once (http)")
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    import ray

    from ninfer.demo import build_demo

    tmp = Path(tempfile.mkdtemp(prefix="bench-stall-"))
    artifact = str(build_demo(tmp / "demo.ninfer"))
    ray.init(num_cpus=4, include_dashboard=False, namespace="ninfer", log_to_driver=False)
    args = [
        "--max-context",
        "4096",
        "--kv-capacity",
        "32768",
        "--max-concurrency",
        "2",
        "--max-request-mib",
        "256",
    ]
    actor = f"ninfer-stall-{os.getpid()}"
    proc, url = start_server(
        artifact, ray.get_runtime_context().gcs_address, tmp, ["--actor-name", actor, *args]
    )
    results = []
    try:
        for n in a.messages:
            if a.via == "http":
                send = together([http_sender(url, n, a.shape) for _ in range(a.concurrent)])
            else:
                send = job_sender(ray.get_runtime_context().gcs_address, actor, n, a.shape)
            res = {"messages": n, "via": a.via, "shape": a.shape, "concurrent": a.concurrent}
            res |= measure(url, send, a.stream_tokens)
            print(json.dumps(res), flush=True)
            results.append(res)
    finally:
        proc.terminate()
        proc.wait(60)
        ray.shutdown()
    if a.output:
        Path(a.output).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
