"""The supervisor's control loop against a fake engine (a few lines of http.server, no Ray, no model): crash
restarts with backoff, the crash count and last error, a switch whose preset cannot start falling back to the
previous one, and stop. Fast, so the timing rules are tested here and the live test only checks they hold for
the real engine."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ninfer.supervisor.lifecycle as lifecycle
from ninfer.supervisor.config import parse_config
from ninfer.supervisor.gpu import GpuProbe

# A fake `ninfer serve`: answers /health and /v1/models (the model id is its preset's name) until SIGTERM;
# the preset "bad" exits with code 3 at once, as an engine that cannot load would.
FAKE = r"""
import http.server, json, signal, sys
name, port = sys.argv[1], int(sys.argv[2])
if name == "bad":
    print("fake engine: cannot load", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"status": "ok"} if self.path == "/health" else {"data": [{"id": name}]}
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("content-length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("fake engine: listening", flush=True)
srv.serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., lifecycle.Supervisor]]:
    (tmp_path / "a.ninfer").write_bytes(b"")  # presets need existing files; the fake engine never reads them
    (tmp_path / "fake.py").write_text(FAKE)
    made: list[lifecycle.Supervisor] = []

    def argv(preset: Any, engine: Any, request_log: str) -> list[str]:
        return [sys.executable, str(tmp_path / "fake.py"), preset.name, str(engine.port)]

    monkeypatch.setattr(lifecycle, "serve_argv", argv)
    monkeypatch.setattr(
        lifecycle, "preflight", lambda *a, **k: None
    )  # the catalog's checks are tested elsewhere

    def build(**over: Any) -> lifecycle.Supervisor:
        presets = [{"name": n, "artifact": "a.ninfer"} for n in ("good", "other", "bad")]
        data = {"presets": presets, "engine": {"port": _free_port(), "shutdown_grace_s": 2},
                "restart": {"backoff_initial_s": 0.2, "backoff_max_s": 0.8, "stable_after_s": 60}, **over}  # fmt: skip
        (tmp_path / "c.json").write_text(json.dumps(data))
        with monkeypatch.context() as m:  # parse without judging the fake presets' artifacts as serve would
            m.setattr("ninfer.supervisor.config.check_preset_args", lambda *a: None)
            cfg = parse_config(data, tmp_path)
        sup = lifecycle.Supervisor(str(tmp_path / "c.json"), cfg, str(tmp_path / "state"), GpuProbe(index=97))
        made.append(sup)
        sup.begin()
        return sup

    yield build
    for sup in made:
        sup.close()
        assert sup.status()["pid"] is None


def _until(sup: lifecycle.Supervisor, pred: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = sup.status()
        if pred(st):
            return st
        time.sleep(0.05)
    raise AssertionError(f"timed out; last status {sup.status()}")


def test_crashes_restart_with_growing_backoff_then_settle(make: Callable[..., lifecycle.Supervisor]) -> None:
    sup = make(active="bad")  # exits at once, every time
    seen: list[float] = []
    for n in (1, 2, 3, 4):
        st = _until(sup, lambda s, n=n: s["crash_count"] == n and s["state"] == "backoff")
        seen.append(st["next_restart_in_s"])
        assert (
            st["last_exit_code"] == 3 and "code 3" in st["last_error"] and "cannot load" in st["last_error"]
        )
    assert seen[0] <= 0.2 + 0.05 and 0.3 < seen[1] <= 0.4 + 0.05 and seen[3] <= 0.8 + 0.05  # doubled, capped
    sup.submit("stop")
    st = _until(sup, lambda s: s["state"] == "stopped" and s["desired"] == "stopped")
    crashes = st["crash_count"]
    time.sleep(1.0)
    assert (
        sup.status()["crash_count"] == crashes and sup.status()["state"] == "stopped"
    )  # no restart when stopped


def test_a_killed_engine_comes_back_and_stop_is_no_crash(make: Callable[..., lifecycle.Supervisor]) -> None:
    import os
    import signal

    sup = make(active="good")
    st = _until(sup, lambda s: s["state"] == "running" and s["model_id"] == "good")
    os.kill(st["pid"], signal.SIGKILL)
    st2 = _until(sup, lambda s: s["state"] == "running" and s["pid"] not in (None, st["pid"]))
    assert st2["crash_count"] == 1 and "-9" in st2["last_error"]
    sup.submit("restart")
    st3 = _until(sup, lambda s: s["state"] == "running" and s["pid"] not in (None, st2["pid"]))
    assert st3["crash_count"] == 1 and st3["restart_count"] == 1 and st3["last_exit_code"] == 0
    sup.submit("stop")
    st4 = _until(sup, lambda s: s["state"] == "stopped")
    assert st4["crash_count"] == 1 and st4["pid"] is None


def test_a_switch_to_a_preset_that_cannot_start_falls_back(make: Callable[..., lifecycle.Supervisor]) -> None:
    sup = make(active="good")
    _until(sup, lambda s: s["state"] == "running" and s["model_id"] == "good")
    sup.switch("other")
    _until(sup, lambda s: s["state"] == "running" and s["model_id"] == "other")
    assert json.loads(Path(sup.config_path).read_text())["active"] == "other"
    sup.switch("bad")  # passes the (stubbed) preflight, then dies at start-up
    st = _until(sup, lambda s: s["state"] == "running" and s["model_id"] == "other" and s["crash_count"] == 1)
    assert "did not start" in st["last_error"] and "back to 'other'" in st["last_error"]
    assert (
        st["active_preset"] == "other" and json.loads(Path(sup.config_path).read_text())["active"] == "other"
    )


def test_a_saved_configuration_applies_at_the_next_restart(make: Callable[..., lifecycle.Supervisor]) -> None:
    sup = make(active="good")
    st = _until(sup, lambda s: s["state"] == "running")
    assert st["restart_to_apply"] is False
    data = sup.cfg.to_dict()
    old_port, new_port = data["engine"]["port"], _free_port()
    data["engine"]["port"] = new_port
    with pytest.MonkeyPatch.context() as m:
        m.setattr("ninfer.supervisor.config.check_preset_args", lambda *a: None)
        sup.put_config(data)
    time.sleep(2.5)  # a health probe or two: still the running engine's address, still healthy
    st = sup.status()
    assert st["restart_to_apply"] is True and st["url"].endswith(f":{old_port}") and st["health"] == "ok"
    sup.submit("restart")
    st = _until(sup, lambda s: s["state"] == "running" and s["url"].endswith(f":{new_port}"))
    assert st["restart_to_apply"] is False and st["crash_count"] == 0
