"""Acceptance of `ninfer serve --replicas 3` on the demo artifact (reference backend): prefix affinity, spreading,
a full replica's requests going elsewhere, 429 only when all are full, and a replica killed mid-stream.

One Ray instance (this process's) and one server serve every test; the test process also joins as a Python job
(pinned clients fill a replica's lane and queue; the kill goes through Ray). Each replica has 1 lane and a queue
of 1, so two pinned requests make it full (long ones: 16000 tokens, so that they outlast the test).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from test_api_live import Server

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(300)

MODEL = "ninfer-demo"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    from ninfer.demo import build_demo

    tmp = tmp_path_factory.mktemp("replicas")
    artifact = build_demo(tmp / "demo.ninfer")
    ray.init(num_cpus=4, include_dashboard=False, namespace="ninfer", log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    server = None
    try:
        server = Server(
            "rep",
            ["--replicas", "3", "--max-concurrency", "1", "--queue-depth", "1", "--route-poll-ms", "100",
             "--preserve-thinking", "--max-context", "16384", "--kv-capacity", "65536", "--prompt-tokens-details"],
            address,
            artifact,
            tmp,
        )  # fmt: skip
        server.wait_ready(240)
        yield {"server": server, "url": server.url, "actor": server.actor}
    finally:
        code = server.stop() if server is not None else 0
        ray.shutdown()
    assert code == 0, f"unclean shutdown: {code}"


def routed(url: str) -> dict[str, int]:
    """Requests each replica accepted so far (the router's per-replica counter)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {k: int(v) for k, v in re.findall(r'ninfer_replica_requests_total\{replica="(\d+)"\} (\d+)', text)}


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


def chat(url: str, messages: list[dict], max_tokens: int = 8) -> tuple[httpx.Response, str]:
    """One chat completion and the replica that took it."""
    before = routed(url)
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    after = routed(url)
    took = [k for k in after if after[k] != before.get(k, 0)]
    assert len(took) <= 1, (before, after)
    return r, took[0] if took else ""


def follow_up(messages: list[dict], answer: dict, text: str) -> list[dict]:
    prev = {
        "role": "assistant",
        "content": answer["content"],
        "reasoning_content": answer.get("reasoning_content"),
    }
    return [*messages, prev, {"role": "user", "content": text}]


def test_turn_two_lands_on_turn_ones_replica_and_reuses_its_prompt(stack: dict) -> None:
    url = stack["url"]
    for s in range(3):
        msgs = [{"role": "user", "content": f"Session {s}: tell me about the river number {s * 11}."}]
        r1, rep1 = chat(url, msgs)
        assert r1.status_code == 200, r1.text
        first = r1.json()
        r2, rep2 = chat(url, follow_up(msgs, first["choices"][0]["message"], "And the next one?"))
        assert r2.status_code == 200, r2.text
        assert rep2 == rep1, f"session {s}: turn 1 on replica {rep1}, turn 2 on {rep2}"
        cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first["usage"]["prompt_tokens"], (cached, first["usage"])
    assert metric(url, "ninfer_router_affinity_hits_total") >= 3


def test_unrelated_sessions_spread_across_replicas(stack: dict) -> None:
    url = stack["url"]
    took = []
    for s in range(6):
        r, rep = chat(
            url, [{"role": "user", "content": f"Unrelated {s}: {'xyzw'[s % 4] * (s + 3)} quux {s}"}]
        )
        assert r.status_code == 200, r.text
        took.append(rep)
    assert set(took) == {"0", "1", "2"}, took


class Hold:
    """A long pinned generation on one replica from this Python job, stopped (and cancelled) on ``stop()``."""

    def __init__(self, actor: str, replica: int) -> None:
        from ninfer.actors import connect_replicas

        self.client = connect_replicas(actor, replica=replica)
        self.started, self.done = threading.Event(), threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from ninfer.actors import GenerationError

        try:
            # as long as the context allows: the holds must outlast the test on a fast machine too
            for _ in self.client.stream([1, 2, 3, 4], max_tokens=16000, ignore_eos=True):
                self.started.set()
                if self.done.is_set():
                    break  # closing the stream cancels the request
        except GenerationError as e:
            self.error = e
        finally:
            self.started.set()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


def _fill(url: str, actor: str, replica: int) -> list[Hold]:
    holds = [Hold(actor, replica)]  # its lane, then its queue
    assert holds[0].started.wait(30) and holds[0].error is None, holds[0].error
    holds.append(Hold(actor, replica))
    queue = f'ninfer_replica_queue_length{{replica="{replica}"}}'
    deadline = time.monotonic() + 30
    while metric(url, queue) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(url, queue) == 1, f"replica {replica}'s queue did not fill: {[h.error for h in holds]}"
    time.sleep(0.3)  # a router poll (every 100 ms) sees it full
    return holds


def test_a_full_replica_sends_requests_elsewhere_and_429_needs_all_full(stack: dict) -> None:
    url, actor = stack["url"], stack["actor"]
    msgs = [{"role": "user", "content": "A session whose replica will be full."}]
    r1, rep1 = chat(url, msgs)
    assert r1.status_code == 200
    holds = _fill(url, actor, int(rep1))
    try:
        fb = metric(url, 'ninfer_router_fallbacks_total{reason="full"}')
        r2, rep2 = chat(url, follow_up(msgs, r1.json()["choices"][0]["message"], "More?"))
        assert r2.status_code == 200, r2.text
        assert rep2 and rep2 != rep1
        assert metric(url, 'ninfer_router_fallbacks_total{reason="full"}') == fb + 1
        for k in {"0", "1", "2"} - {rep1}:
            holds += _fill(url, actor, int(k))
        r3, _ = chat(url, [{"role": "user", "content": "Anyone free?"}])
        assert r3.status_code == 429, r3.text
        assert r3.headers.get("retry-after")
        assert metric(url, 'ninfer_router_rejected_total{reason="all_full"}') >= 1
    finally:
        for h in holds:
            h.stop()


def test_killing_a_replica_mid_stream_fails_its_stream_and_it_comes_back(stack: dict) -> None:
    url, actor = stack["url"], stack["actor"]
    lines: list[str] = []
    before = routed(url)

    def stream() -> None:
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": 3500,
            "ignore_eos": True,  # the random demo model may end a sampled stream early (seen: a stop before the kill)
            "messages": [{"role": "user", "content": "go"}],
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines.extend(ln for ln in r.iter_lines() if ln)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while len(lines) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = routed(url)
    (victim,) = [k for k in after if after[k] != before.get(k, 0)]
    restarts = f'ninfer_replica_restarts_total{{replica="{victim}"}}'
    assert metric(url, restarts) == 0
    ray.kill(ray.get_actor(f"{actor}-{victim}", namespace="ninfer"), no_restart=False)
    t.join(30)
    assert not t.is_alive(), "the stream hung after its replica died"
    errors = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {") and '"error"' in ln]
    assert errors and errors[-1]["error"]["code"] == "engine_unavailable", lines[-3:]
    assert not any('"finish_reason":"' in ln for ln in lines), "the stream finished instead of failing"
    # new requests go to the survivors while the victim is away (each one checked against its restart count)
    for i in range(4):
        r, rep = chat(url, [{"role": "user", "content": f"after the kill {i}"}])
        assert r.status_code == 200, r.text
        assert rep != victim or metric(url, restarts) == 1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # Ray restarts it and the router takes it back
        health = httpx.get(url + "/health", timeout=10).json()
        if health["replicas"][victim] == "ok" and metric(url, restarts) == 1:
            break
        time.sleep(0.5)
    assert health["status"] == "ok" and health["replicas"] == {"0": "ok", "1": "ok", "2": "ok"}
    assert metric(url, restarts) == 1 and metric(url, "ninfer_router_replica_failures_total") >= 1
    from ninfer.actors import connect_replicas

    assert connect_replicas(actor, replica=int(victim)).chat(
        [{"role": "user", "content": "back?"}], max_tokens=4
    )
