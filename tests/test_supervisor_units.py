"""The supervisor's parts without an engine: configuration validation and atomic saving, the request-log tail,
Prometheus parsing, client labels, NVML absent, the systemd unit, the admin key and the engine key file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ninfer.supervisor.activity import RequestLog, client_label, parse_prometheus
from ninfer.supervisor.catalog import serve_argv
from ninfer.supervisor.config import ConfigError, load_config, parse_config, save_config
from ninfer.supervisor.gpu import GpuProbe
from ninfer.supervisor.lifecycle import first_key
from ninfer.supervisor.systemd import UNIT_NAME, install, uninstall, unit_text


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> str:
    from ninfer.demo import build_demo

    return build_demo(tmp_path_factory.mktemp("sup-units") / "demo.ninfer")


def _cfg(art: str, **over: Any) -> dict[str, Any]:
    return {"presets": [{"name": "a", "artifact": art, "args": ["--max-concurrency", "2"]}], **over}


def test_config_defaults_paths_and_round_trip(art: str, tmp_path: Path) -> None:
    (tmp_path / "k").write_text("sk-1\n")
    cfg = parse_config(
        _cfg(art, engine={"api_key_file": "k", "memory_reserve_gib": 2}, state_dir="st"), tmp_path
    )
    assert cfg.active == "a" and cfg.engine.port == 8010 and cfg.engine.host == "127.0.0.1"
    assert cfg.engine.api_key_file == str(tmp_path / "k") and cfg.state_dir == str(tmp_path / "st")
    assert parse_config(cfg.to_dict(), tmp_path) == cfg
    argv = serve_argv(cfg.presets[0], cfg.engine, "/x/req.jsonl")
    assert argv[3:5] == ["serve", art] and argv[argv.index("--memory-reserve-gib") + 1] == "2.0"
    assert argv[argv.index("--api-key-file") + 1] == str(tmp_path / "k") and "--max-concurrency" in argv


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"presets": []}, "presets", "non-empty"),
        ({"active": "zzz"}, "active", "names no preset"),
        ({"bogus": 1}, "bogus", "unknown"),
        ({"engine": {"port": 0}}, "engine.port", "1..65535"),
        ({"engine": {"memory_reserve_gib": -1}}, "engine.memory_reserve_gib", "number"),
        ({"engine": {"args": ["--port", "1"]}}, "engine.args", "--port is set by the supervisor"),
        ({"restart": {"backoff_initial_s": 5, "backoff_max_s": 1}}, "restart.backoff_max_s", "at least"),
        ({"preflight_verify": "some"}, "preflight_verify", "full"),
    ],
)
def test_config_errors_name_the_setting(art: str, tmp_path: Path, over: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_cfg(art, **over), tmp_path)
    assert e.value.field == field and words in str(e.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--request-log", "x"], "--request-log-jsonl is set by the supervisor"),  # an abbreviation too
        (["--detached"], "--detached"),
        (["--max-concurrency", "99"], "max-concurrency"),
        (["--no-such-flag"], "unrecognized"),
        (["--kv-dtype", "int3"], "invalid choice"),
    ],
)
def test_preset_args_are_judged_by_serve_itself(
    art: str, tmp_path: Path, args: list[str], words: str
) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"presets": [{"name": "a", "artifact": art, "args": args}]}, tmp_path)
    assert e.value.field == "presets[0].args" and words in str(e.value)


def test_config_refuses_duplicates_and_missing_artifacts(art: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="two presets"):
        parse_config({"presets": [{"name": "a", "artifact": art}, {"name": "a", "artifact": art}]}, tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        parse_config({"presets": [{"name": "a", "artifact": "missing.ninfer"}]}, tmp_path)


def test_save_is_atomic_and_keeps_a_backup(art: str, tmp_path: Path) -> None:
    path = tmp_path / "sup.json"
    assert save_config(path, parse_config(_cfg(art), tmp_path)) is None
    cfg2 = parse_config({**_cfg(art), "engine": {"port": 9000}}, tmp_path)
    backup = save_config(path, cfg2)
    assert backup == str(path) + ".bak" and json.loads(Path(backup).read_text())["engine"]["port"] == 8010
    assert load_config(path) == cfg2 and [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(path)


def _rec(event: str, rid: int, **kw: Any) -> str:
    base = {"event": event, "timestamp_unix_ms": 1000 * rid, "server_instance_id": "serve-1"}
    return json.dumps({**base, **kw}) + "\n"


def test_request_log_tail_rows_clients_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "req.jsonl"
    log = RequestLog(path, keep=3)
    log.poll()  # no file yet: nothing
    req = {"request_id": 1, "client": "alice", "model": "m", "prompt_tokens": 10}
    with open(path, "w") as f:
        f.write(_rec("server_start", 0, memory_plan={"weights": 5}))
        f.write(_rec("request_start", 1, request=req))
        f.write(_rec("request_done", 1, request=req, result={"prompt_tokens": 10, "cached_tokens": 4,
                     "completion_tokens": 5, "finish_reason": "stop"},
                     timings_seconds={"ttft": 0.1, "total": 0.6, "decode": 0.5})[:-20])  # fmt: skip
    log.poll()
    (row,) = log.snapshot()["requests"]
    assert row["status"] == "running" and log.server_start["memory_plan"] == {"weights": 5}
    with open(path, "a") as f:  # the rest of the half-written line arrives
        f.write(_rec("request_done", 1, request=req, result={"prompt_tokens": 10, "cached_tokens": 4,
                     "completion_tokens": 5, "finish_reason": "stop"},
                     timings_seconds={"ttft": 0.1, "total": 0.6, "decode": 0.5})[-20:])  # fmt: skip
        f.write(_rec("request_error", 2, request={**req, "request_id": 2}, error={"message": "x", "outcome": "cancelled"},
                     result={"completion_tokens": 1}))  # fmt: skip
    log.poll()
    snap = log.snapshot()
    done = snap["requests"][1]
    assert (done["status"], done["cached_tokens"], done["tok_s"], done["finish_reason"]) == (
        "done",
        4,
        10.0,
        "stop",
    )
    assert snap["requests"][0]["status"] == "error" and snap["requests"][0]["finish_reason"] == "cancelled"
    (c,) = snap["clients"]
    assert (c["requests"], c["running"], c["errors"], c["cached_tokens"]) == (2, 0, 1, 4)
    os.replace(path, tmp_path / "req.jsonl.1")  # rotated: the new file is read from its start
    path.write_text(_rec("request_start", 7, request={**req, "request_id": 7}))
    log.poll()
    assert log.snapshot()["requests"][0]["id"] == 7 and len(log.rows) == 3


def test_client_labels_group_by_host_and_show_the_claim() -> None:
    assert client_label("127.0.0.1:5555", None) == "127.0.0.1"
    assert client_label("[::1]:5555", "ide") == "[::1] (ide)"
    assert client_label("alice", None) == "alice" and client_label(None, None) == "unknown"


def test_parse_prometheus_sums_labelled_series() -> None:
    text = '# HELP x y\nninfer_queue_length 3\nninfer_requests_total{endpoint="a",outcome="b"} 2\n' \
           'ninfer_requests_total{endpoint="c",outcome="d"} 5\nbad line\n'  # fmt: skip
    assert parse_prometheus(text) == {"ninfer_queue_length": 3.0, "ninfer_requests_total": 7.0}


def test_gpu_absent_is_a_status_not_an_error() -> None:
    st = GpuProbe(index=97).status()  # no machine has a 98th GPU
    assert st.available is False and st.detail and st.total_bytes == 0
    assert GpuProbe(index=97).process_bytes([os.getpid()]) == 0


def test_first_key_reads_named_and_plain_keys(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("# keys\n\nsupervisor:sk-abc\nsk-def\n")
    (tmp_path / "p").write_text("sk-plain\n")
    assert first_key(str(tmp_path / "k")) == "sk-abc" and first_key(str(tmp_path / "p")) == "sk-plain"
    assert first_key(None) is None and first_key(str(tmp_path / "missing")) is None


def test_systemd_unit_install_and_uninstall(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    text = unit_text(str(tmp_path / "c.json"), host="127.0.0.1", port=8099, admin_key_file=None, grace_s=30,
                     python="/venv/bin/python")  # fmt: skip
    assert f"ExecStart=/venv/bin/python -m ninfer.cli supervisor --config {tmp_path / 'c.json'}" in text
    assert "WantedBy=default.target" in text and "TimeoutStopSec=90" in text and "KillMode=mixed" in text
    path = install(tmp_path / "units", text, systemctl=str(fake))
    assert path.name == UNIT_NAME and path.read_text() == text
    assert calls.read_text().splitlines() == ["--user daemon-reload", f"--user enable --now {UNIT_NAME}"]
    assert uninstall(tmp_path / "units", systemctl=str(fake)) == path and not path.exists()
    assert calls.read_text().splitlines()[-2:] == [
        f"--user disable --now {UNIT_NAME}",
        "--user daemon-reload",
    ]


def test_admin_key_guards_every_api_route_but_not_the_page(art: str, tmp_path: Path) -> None:
    from litestar.testing import TestClient

    from ninfer.supervisor.activity import Sampler
    from ninfer.supervisor.http import build_app
    from ninfer.supervisor.lifecycle import Supervisor

    (tmp_path / "engine-keys").write_text("sk-engine-secret\n")
    cfg = parse_config(_cfg(art, autostart=False, engine={"api_key_file": "engine-keys"}), tmp_path)
    save_config(tmp_path / "c.json", cfg)
    gpu = GpuProbe(index=97)
    sup = Supervisor(str(tmp_path / "c.json"), cfg, str(tmp_path / "state"), gpu)
    log = RequestLog(sup.request_log)
    app = build_app(sup, Sampler(log, gpu, sup.engine_target), log, "admin-secret")
    with TestClient(app) as client:
        assert client.get("/").status_code == 200 and "dashboard.js" in client.get("/").text
        assert client.get("/assets/dashboard.js").status_code == 200
        assert client.get("/assets/../config.py").status_code == 404
        for path in ("/api/status", "/api/config", "/api/requests", "/api/metrics", "/api/engine/log"):
            r = client.get(path)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key", path
            assert client.get(path, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert client.post("/api/engine/start").status_code == 401
        assert client.post("/api/switch", json={"preset": "a"}).status_code == 401
        ok = {"authorization": "Bearer admin-secret"}
        st = client.get("/api/status", headers=ok).json()
        assert st["engine"]["state"] == "stopped" and st["gpu"]["available"] is False
        assert client.get("/api/status", headers={"x-admin-key": "admin-secret"}).status_code == 200
        everything = "".join(client.get(p, headers=ok).text for p in ("/api/status", "/api/config"))
        assert "sk-engine-secret" not in everything and "engine-keys" in everything
        assert client.post("/api/engine/fly", headers=ok).status_code == 404
        r = client.post("/api/switch", headers=ok, content=b"{nope")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        assert client.post("/api/switch", headers=ok, json={"preset": "zz"}).status_code == 404
        r = client.put("/api/config", headers=ok, json={"presets": "x"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "presets"
        assert client.get("/api/requests?limit=x", headers=ok).status_code == 400


def test_preflight_checks_the_memory_estimate_against_free_memory_less_the_reserve(
    art: str, tmp_path: Path
) -> None:
    from ninfer.supervisor.catalog import PresetRefused, estimate_plan, preflight
    from ninfer.supervisor.gpu import GpuStatus

    cfg = parse_config({"presets": [{"name": "a", "artifact": art, "args": ["--backend", "cuda"]}],
                        "engine": {"memory_reserve_gib": 1}}, tmp_path)  # fmt: skip
    preset, eng = cfg.presets[0], cfg.engine

    def gpu(free: int) -> GpuStatus:
        return GpuStatus(available=True, name="fake", total_bytes=free * 2, used_bytes=free, free_bytes=free)

    ok = preflight(preset, eng, gpu(8 << 30), 0, "manifest")
    assert ok.backend == "cuda" and ok.estimate_bytes and ok.available_bytes == 7 << 30
    need = ok.estimate_bytes
    from ninfer.api.cli import config_from_args

    from ninfer.artifact import open_artifact
    from ninfer.cli import _parser

    sc = config_from_args(_parser().parse_args(["serve", art, "--backend", "cuda", "--kv-capacity", "65536"]))
    assert (
        estimate_plan(open_artifact(art, verify="manifest"), sc).total > need
    )  # a bigger KV pool needs more
    fits = need + (1 << 30)  # exactly enough with the reserve kept
    assert preflight(preset, eng, gpu(fits), 0, "manifest").estimate_bytes == need
    with pytest.raises(PresetRefused, match="does not fit in GPU memory.*reserve"):
        preflight(preset, eng, gpu(fits - 1), 0, "manifest")
    # what the resident engine holds comes back at the switch
    assert preflight(preset, eng, gpu(fits - (1 << 20)), 1 << 20, "manifest").estimate_bytes == need
    ref = parse_config(
        {"presets": [{"name": "r", "artifact": art, "args": ["--backend", "reference"]}]}, tmp_path
    )
    assert preflight(ref.presets[0], ref.engine, gpu(0), 0, "full").estimate_bytes is None  # no device plan


@pytest.mark.gpu
def test_nvml_sees_the_gpu_and_the_estimate_is_the_runners_plan(art: str) -> None:
    """On a GPU: NVML reports the device and this process's memory, and the preflight's estimate has the CUDA
    runner's own plan parts for the same settings (weights: at least what was uploaded)."""
    from ninfer.api.cli import config_from_args

    from ninfer.artifact import open_artifact
    from ninfer.cli import _parser
    from ninfer.engine import Engine
    from ninfer.model import load
    from ninfer.supervisor.catalog import estimate_plan

    st = GpuProbe().status()
    assert st.available and st.name and st.total_bytes > st.free_bytes > 0, st
    flags = ["--max-context", "1024", "--kv-capacity", "8192", "--max-concurrency", "2"]
    sc = config_from_args(_parser().parse_args(["serve", art, "--backend", "cuda", *flags]))
    est = estimate_plan(open_artifact(art, verify="manifest"), sc)
    model = load(art, backend="cuda", backend_options={"cuda_graph": True, "act_dtype": "fp32"})
    with Engine.from_model(model, max_context=1024, kv_capacity=8192, max_concurrency=2) as eng:
        plan = eng.memory_plan()
        assert GpuProbe().process_bytes([os.getpid()]) > 0
    for part in ("kv_pool", "gdn_lanes", "checkpoints", "workspace", "graph_pools"):
        assert getattr(est, part) == plan[part], part
    assert est.weights >= plan["weights"] > 0


def test_cli_install_writes_the_unit_and_refuses_a_bad_config(
    art: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ninfer.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    save_config(tmp_path / "c.json", parse_config(_cfg(art), tmp_path))
    assert main(["supervisor", "install", "--user", "--config", str(tmp_path / "c.json"), "--no-enable"]) == 0
    unit = (tmp_path / "xdg" / "systemd" / "user" / UNIT_NAME).read_text()
    assert f"--config {tmp_path / 'c.json'} --host 127.0.0.1 --port 8099" in unit
    (tmp_path / "bad.json").write_text(json.dumps({"presets": []}))
    assert (
        main(["supervisor", "install", "--user", "--config", str(tmp_path / "bad.json"), "--no-enable"]) == 2
    )
    assert "presets: must be a non-empty list" in capsys.readouterr().err
    assert main(["supervisor"]) == 2
