"""End-to-end: live `ninfer serve` processes on the demo artifact (reference backend) joined to one local Ray.
``NINFER_LIVE_BACKEND=cuda`` starts every live server of the tests importing ``Server`` on the CUDA backend instead
(the device run; the default is what CI runs).

Server A: two API keys, a request log, 4 lanes. Server B: no auth, 1 lane and a queue of 1 (admission tests).
Both join the Ray instance this test process starts, so one Ray start serves every test and tear-down is ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-9876543210"}
SECRET_PROMPT = "zebra-quokka-prompt-text"
BACKEND = os.environ.get("NINFER_LIVE_BACKEND", "reference")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, args: list[str], address: str, artifact: str, tmp: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.actor = f"ninfer-test-{name}-{os.getpid()}"
        self.stderr = open(tmp / f"server-{name}.log", "w+")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable,
            "-m",
            "ninfer.cli",
            "serve",
            artifact,
            "--port",
            str(self.port),
            "--backend",
            BACKEND,
        ]
        cmd += ["--ray-address", address, "--actor-name", self.actor, *args]
        if BACKEND == "cuda":  # a fixture may run two servers at once: each asks Ray for a share of one GPU
            cmd += ["--gpu-share", "0.25"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.stderr, cwd=REPO)

    def wait_ready(self, timeout: float | None = None) -> None:
        # CUDA: a machine's first server compiles every kernel family (~90 s on the H200 host, 16 cores)
        timeout = timeout if timeout is not None else (300 if BACKEND == "cuda" else 120)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.stderr.close()
        return self.proc.returncode


@contextlib.contextmanager
def demo_server(tmp: Path, name: str, args: list[str]) -> Iterator[Server]:
    """One live server named ``name`` with ``args`` on a fresh demo artifact in ``tmp``, joined to a local Ray
    started here; stopped (exit code 0 asserted) and Ray shut down on exit."""
    from ninfer.demo import build_demo

    artifact = build_demo(tmp / "demo.ninfer")
    ray.init(num_cpus=4, include_dashboard=False, namespace="ninfer", log_to_driver=False)
    s = None
    try:
        s = Server(name, args, ray.get_runtime_context().gcs_address, str(artifact), tmp)
        s.wait_ready()
        yield s
    finally:
        code = s.stop() if s is not None else 0
        ray.shutdown()
    assert code == 0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    from ninfer.demo import build_demo

    tmp = tmp_path_factory.mktemp("serve")
    artifact = build_demo(tmp / "demo.ninfer")
    (tmp / "keys.txt").write_text("".join(f"{n}:{k}\n" for n, k in KEYS.items()))
    ray.init(num_cpus=4, include_dashboard=False, namespace="ninfer", log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    common = ["--max-context", "4096", "--kv-capacity", "32768"]
    a = b = None
    try:
        a = Server(
            "a",
            [
                *common,
                "--api-key-file",
                str(tmp / "keys.txt"),
                "--request-log-jsonl",
                str(tmp / "req.jsonl"),
                "--max-concurrency",
                "4",
                "--queue-depth",
                "8",
                "--max-request-mib",
                "1",
                "--prompt-tokens-details",  # the cached follow-up reads prompt_tokens_details
            ],
            address,
            artifact,
            tmp,
        )
        b = Server(
            "b", [*common, "--max-concurrency", "1", "--queue-depth", "1", "--cors"], address, artifact, tmp
        )
        a.wait_ready()
        b.wait_ready()
        yield {"a": a, "b": b, "address": address, "tmp": tmp, "log": tmp / "req.jsonl"}
    finally:
        codes = {}
        for s in (a, b):
            if s is not None:
                codes[s.actor] = s.stop()
        ray.shutdown()
    assert all(c == 0 for c in codes.values()), f"unclean SIGTERM shutdown: {codes}"


def sdk(server: Server, key: str | None = KEYS["alice"]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key or "none", max_retries=0, timeout=60)


def model_id(server: Server) -> str:
    return httpx.get(server.url + "/v1/models", headers={"x-api-key": KEYS["alice"]}).json()["data"][0]["id"]


USER = [{"role": "user", "content": f"Tell me a story. {SECRET_PROMPT}"}]


def test_openai_sdk_complete_stream_and_cached_followup(stack: dict) -> None:
    a = stack["a"]
    client = sdk(a)
    models = client.models.list()
    assert [m.id for m in models.data] == ["ninfer-demo"]
    r1 = client.chat.completions.create(model="ninfer-demo", messages=USER, max_tokens=12, temperature=0)
    c = r1.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    u = r1.usage
    assert u.prompt_tokens > 5 and 1 <= u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    # the same request streamed: the same greedy text and usage
    chunks = list(
        client.chat.completions.create(
            model="ninfer-demo",
            messages=USER,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == c.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1])
    assert text == c.message.content
    su = chunks[-1].usage
    assert (su.prompt_tokens, su.completion_tokens) == (u.prompt_tokens, u.completion_tokens)
    assert 0 <= su.prompt_tokens_details.cached_tokens < su.prompt_tokens

    # a follow-up turn reuses at least the previous prompt
    follow = [
        *USER,
        {"role": "assistant", "content": c.message.content},
        {"role": "user", "content": "And then?"},
    ]
    r3 = client.chat.completions.create(model="ninfer-demo", messages=follow, max_tokens=4, temperature=0)
    assert r3.usage.prompt_tokens > u.prompt_tokens
    cached = r3.usage.prompt_tokens_details.cached_tokens
    assert u.prompt_tokens - 8 <= cached < r3.usage.prompt_tokens, (cached, u.prompt_tokens)


def test_auth_keys_and_log_attribution(stack: dict) -> None:
    a = stack["a"]
    url = a.url
    assert httpx.get(url + "/health").status_code == 200  # open
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-alice"}):
        for path in ("/v1/models", "/metrics", "/no/such/path"):
            r = httpx.get(url + path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        sdk(a, "sk-wrong").models.list()
    for key in KEYS.values():
        assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(url + "/v1/models", headers={"x-api-key": key}).status_code == 200
        r = sdk(a, key).chat.completions.create(
            model="ninfer-demo", messages=USER, max_tokens=2, user="ignored-user"
        )
        assert r.usage.completion_tokens >= 1
    time.sleep(0.3)  # the log writer thread flushes off the request path
    text = stack["log"].read_text()
    for key in KEYS.values():
        assert key not in text
    assert SECRET_PROMPT not in text
    recs = [json.loads(line) for line in text.splitlines()]
    assert recs[0]["event"] == "server_start"
    done = [r for r in recs if r["event"] == "request_done"]
    clients = [r["request"]["client"] for r in done]
    assert clients[-2:] == ["alice", "bob"]  # the key name wins over the `user` field
    ids = [r["request"]["request_id"] for r in recs if r["event"] == "request_start"]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    last = done[-1]
    assert last["result"]["prompt_tokens"] > 0 and "cached_tokens" in last["result"]
    assert set(last["timings_seconds"]) >= {"queue", "prefill", "decode", "ttft", "total"}


def _post(server: Server, payload: dict, **kw: object) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=payload, timeout=60, **kw)


LONG = {"model": "ninfer-demo", "messages": USER, "max_tokens": 400, "temperature": 0, "ignore_eos": True}


def test_burst_admission_two_run_two_refused(stack: dict) -> None:
    b = stack["b"]

    async def one(client: httpx.AsyncClient) -> tuple[int, float, httpx.Response]:
        t0 = time.perf_counter()
        r = await client.post(b.url + "/v1/chat/completions", json=LONG, timeout=120)
        return r.status_code, time.perf_counter() - t0, r

    async def burst() -> list[tuple[int, float, httpx.Response]]:
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(one(client) for _ in range(4)))

    results = asyncio.run(burst())
    codes = sorted(code for code, _, _ in results)
    assert codes == [200, 200, 429, 429], codes
    slowest_ok = max(dt for code, dt, _ in results if code == 200)
    for code, dt, r in results:
        if code == 429:
            assert dt < min(1.0, slowest_ok / 2), dt  # refused at once, not after waiting
            assert int(r.headers["retry-after"]) >= 1
            err = r.json()["error"]
            assert err["code"] == "queue_full" and err["type"] == "invalid_request_error"
        else:
            body = r.json()
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 400


def _lanes_busy(server: Server) -> int:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("ninfer_lanes_busy "):
            return int(float(line.split()[1]))
    raise AssertionError("no ninfer_lanes_busy in /metrics")


def test_client_disconnect_frees_the_lane(stack: dict) -> None:
    b = stack["b"]
    payload = {**LONG, "max_tokens": 3500, "stream": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", b.url + "/v1/chat/completions", json=payload) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: ") and '"content":"' in line:
                got += 1
                if got >= 3:
                    break
        assert _lanes_busy(b) == 1
    t0 = time.perf_counter()
    while _lanes_busy(b) != 0:
        assert time.perf_counter() - t0 < 1.0, "the lane was not freed within a second"
        time.sleep(0.05)
    r = _post(b, {**LONG, "max_tokens": 2})  # the single lane serves again
    assert r.status_code == 200
    # a non-streaming request whose client gives up is cancelled too
    with pytest.raises(httpx.TimeoutException):
        httpx.post(b.url + "/v1/chat/completions", json={**LONG, "max_tokens": 3500}, timeout=0.5)
    t0 = time.perf_counter()
    while _lanes_busy(b) != 0:
        assert time.perf_counter() - t0 < 1.0, "the lane was not freed within a second"
        time.sleep(0.05)


def test_cors_preflight_and_headers(stack: dict) -> None:
    b = stack["b"]
    r = httpx.options(
        b.url + "/v1/chat/completions",
        headers={"Origin": "http://x", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"
    assert "x-api-key" in r.headers["access-control-allow-headers"]
    assert httpx.get(b.url + "/v1/models").headers["access-control-allow-origin"] == "*"


def test_python_job_streams_through_the_actor(stack: dict) -> None:
    a = stack["a"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        str(REPO / "docs/examples/ray_client_example.py"),
        "--address",
        stack["address"],
        "--actor-name",
        a.actor,
        "--max-tokens",
        "8",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "model: ninfer-demo" in out.stdout
    assert "[finish: " in out.stdout and "token ids: [" in out.stdout
    # and from this process, which is itself a Ray driver on the same cluster
    from ninfer.actors import Finish, TokenDelta, connect

    client = connect(a.actor)
    events = list(client.stream_chat(USER, max_tokens=6, temperature=0, ignore_eos=True))
    assert isinstance(events[-1], Finish) and events[-1].usage.completion_tokens == 6
    assert sum(len(e.token_ids) for e in events if isinstance(e, TokenDelta)) == 6
    st = client.stats()
    assert st.lanes_total == 4 and st.queue_depth == 8


HOSTILE = [
    # (payload or raw bytes, extra headers, status, param, code)
    (b"{not json", {}, 400, None, None),
    (b"[1, 2, 3]", {}, 400, None, None),
    (b"", {}, 400, None, None),
    ({"messages": USER}, {}, 400, "model", None),
    ({"model": "gpt-4", "messages": USER}, {}, 404, "model", "model_not_found"),
    ({"model": "ninfer-demo", "messages": []}, {}, 400, "messages", None),
    ({"model": "ninfer-demo", "messages": "hello"}, {}, 400, "messages", None),
    (
        {"model": "ninfer-demo", "messages": [{"role": "wizard", "content": "x"}]},
        {},
        400,
        "messages[0].role",
        "unsupported_role",
    ),
    (
        {"model": "ninfer-demo", "messages": USER, "max_tokens": 100000},
        {},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    ({"model": "ninfer-demo", "messages": USER, "max_tokens": -3}, {}, 400, "max_tokens", None),
    ({"model": "ninfer-demo", "messages": USER, "temperature": "hot"}, {}, 400, "temperature", None),
    ({"model": "ninfer-demo", "messages": USER, "top_p": 7}, {}, 400, "top_p", None),
    ({"model": "ninfer-demo", "messages": USER, "n": 3}, {}, 400, "n", "n_not_supported"),
    (
        {"model": "ninfer-demo", "messages": USER, "response_format": {"type": "xml"}},
        {},
        400,
        "response_format.type",
        "response_format_not_supported",
    ),
    (
        {"model": "ninfer-demo", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        {},
        400,
        "messages[0].content[0].type",
        "modality_not_supported",
    ),
    (
        {"model": "ninfer-demo", "messages": [{"role": "user", "content": "lorem ipsum dolor " * 3000}]},
        {},
        400,
        "messages",
        "context_length_exceeded",
    ),
    (
        {"model": "ninfer-demo", "messages": [{"role": "user", "content": "x"}], "pad": "y" * (2 << 20)},
        {},
        413,
        None,
        "request_too_large",
    ),
    ({"model": "ninfer-demo", "messages": USER, "stream": "yes"}, {}, 400, "stream", None),
    ({"model": "ninfer-demo", "messages": USER, "seed": -5}, {}, 400, "seed", None),
    (
        {"model": "ninfer-demo", "messages": [{"role": "tool", "content": "r"}]},
        {},
        400,
        "messages[0].tool_call_id",
        None,
    ),
]


def test_hostile_requests_get_4xx_and_the_server_keeps_serving(stack: dict) -> None:
    a = stack["a"]
    auth = {"Authorization": f"Bearer {KEYS['alice']}"}
    assert len(HOSTILE) == 20
    for payload, extra, status, param, code in HOSTILE:
        kw = (
            {"content": payload, "headers": {**auth, "content-type": "application/json"}}
            if isinstance(payload, bytes)
            else {"json": payload, "headers": {**auth, **extra}}
        )
        r = httpx.post(a.url + "/v1/chat/completions", timeout=30, **kw)
        assert r.status_code == status, (payload if len(str(payload)) < 300 else "<big>", r.text[:300])
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert err["code"] == code, err
        if param is not None:
            assert err["param"] == param, err
    assert httpx.get(a.url + "/v1/chat/completions", headers=auth).status_code == 405
    assert httpx.get(a.url + "/v1/nothing", headers=auth).status_code == 404
    r = sdk(a).chat.completions.create(model="ninfer-demo", messages=USER, max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_metrics_exposition(stack: dict) -> None:
    a = stack["a"]
    text = httpx.get(a.url + "/metrics", headers={"x-api-key": KEYS["bob"]}).text
    assert "ninfer_engine_up 1" in text
    for name in (
        "ninfer_request_duration_seconds_count",
        "ninfer_time_to_first_token_seconds_bucket",
        "ninfer_lanes_total 4",
        "ninfer_queue_depth 8",
        "ninfer_prompt_tokens_total",
        "ninfer_cached_prompt_tokens_total",
        "ninfer_checkpoint_bytes",
        "ninfer_prefix_hit_tokens_total",
    ):
        assert name in text, name
