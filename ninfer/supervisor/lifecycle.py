"""The supervisor's control loop: one engine at a time, started, stopped, restarted, switched, and restarted
after a crash with exponential backoff.

Threads: a monitor (every 0.25 s: has the engine exited, is it healthy yet, is a backoff over) and one worker
that runs the operations (start, stop, restart, switch, respawn) one at a time, so two operations never
interleave. Both change the state under one lock and never hold it while waiting for a process.

States: ``stopped``, ``starting`` (spawned, /health not yet 200), ``running``, ``stopping`` (draining),
``backoff`` (crashed; a respawn is due at ``next_restart_at``). An exit that no stop asked for is a crash: it is
counted, its exit code and last output become ``last_error``, and the engine is respawned after
``backoff_initial_s * 2**(crashes in a row - 1)`` (at most ``backoff_max_s``); an engine up for
``stable_after_s`` resets the run of crashes.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .catalog import Preflight, preflight, serve_argv
from .config import EngineSettings, SupervisorConfig, parse_config, save_config
from .gpu import GpuProbe
from .process import EngineProcess, kill_session, session_pids, tail_lines

__all__ = ["Supervisor", "first_key"]

_NAMED_KEY = re.compile(
    r"^[A-Za-z0-9_.-]{1,64}:(.+)$"
)  # the key file's "name:key" lines (as the server reads)
_LOG_ROTATE_BYTES = 64 << 20  # the request log is moved to FILE.1 at an engine start once it is this big


def first_key(path: str | None) -> str | None:
    """The first key of an engine key file (``name:`` prefix removed): what the supervisor reads /metrics with."""
    if not path:
        return None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith("#"):
            m = _NAMED_KEY.match(line)
            return m.group(1).strip() if m else line
    return None


class Supervisor:
    def __init__(self, config_path: str, cfg: SupervisorConfig, state_dir: str, gpu: GpuProbe) -> None:
        self.config_path, self.cfg, self.gpu = config_path, cfg, gpu
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.request_log = self.state_dir / "requests.jsonl"
        self.engine_log = self.state_dir / "engine.log"
        self._pid_file = self.state_dir / "engine.pid"
        self._lock = threading.RLock()
        self._ops: queue.Queue[str | None] = queue.Queue()
        self._closed = threading.Event()
        self._proc: EngineProcess | None = None
        self._engine: EngineSettings = cfg.engine  # what the current (or last) engine was started with
        self._started: tuple[EngineSettings, Any] | None = None  # (engine settings, preset) of that start
        self._stopping = False
        self.desired = False
        self.state = "stopped"
        self.health = "down"
        self.model_id: str | None = None
        self.crash_count = self.restart_count = self._in_a_row = 0
        self._fallback: str | None = None  # the preset a switch replaced, until the new one has come up
        self.last_error: str | None = None
        self.last_exit_code: int | None = None
        self.next_restart_at: float | None = None
        self.ready_at: float | None = None
        self._spawned_at = 0.0
        self._last_health = 0.0
        self.started_at = time.time()
        self._threads = [
            threading.Thread(target=self._work, name="supervisor-ops", daemon=True),
            threading.Thread(target=self._monitor, name="supervisor-monitor", daemon=True),
        ]

    # ---- public operations (any thread) -------------------------------------------------------------------
    def begin(self) -> None:
        self._reap_orphan()
        for t in self._threads:
            t.start()
        if self.cfg.autostart:
            self.submit("start")

    def submit(self, op: str) -> None:
        if op not in ("start", "stop", "restart", "switch", "respawn"):
            raise ValueError(f"unknown operation {op!r}")
        self._ops.put(op)

    def switch(self, name: str) -> Preflight:
        """Check preset ``name`` (PresetRefused if it fails: nothing changes), make it the active preset in the
        saved configuration, then replace the engine with it (in the background)."""
        with self._lock:
            cfg = self.cfg
            proc = self._proc
        preset = cfg.preset(name)  # KeyError: no such preset
        resident = self.gpu.process_bytes(proc.pids()) if proc is not None else 0
        check = preflight(preset, cfg.engine, self.gpu.status(), resident, cfg.preflight_verify)
        with self._lock:
            previous = self.cfg.active
            self.cfg = self.cfg.with_active(name)
            save_config(self.config_path, self.cfg)
            if proc is not None and previous != name:  # back to it if the new preset cannot start
                self._fallback = previous
        self.submit("switch")
        return check

    def put_config(self, data: Any) -> tuple[SupervisorConfig, str | None]:
        """Validate and save a new configuration (ConfigError if invalid: nothing saved). It takes effect at
        the next engine start (a restart applies it)."""
        new = parse_config(data, Path(self.config_path).resolve().parent)
        with self._lock:
            backup = save_config(self.config_path, new)
            self.cfg = new
        return new, backup

    def engine_target(self) -> tuple[str, dict[str, str]] | None:
        """The running engine's base URL and the headers to read it with (None while it is not running)."""
        with self._lock:
            if self._proc is None or self.state not in ("running", "stopping"):
                return None
            e = self._engine
        key = first_key(e.api_key_file)
        return f"http://{e.host}:{e.port}", ({"authorization": f"Bearer {key}"} if key else {})

    def status(self) -> dict[str, Any]:
        with self._lock:
            p = self._proc
            now = time.monotonic()
            return {
                "state": self.state,
                "desired": "running" if self.desired else "stopped",
                "preset": p.preset if p else None,
                "active_preset": self.cfg.active,
                "pid": p.pid if p else None,
                "health": self.health,
                "model_id": self.model_id,
                "url": f"http://{self._engine.host}:{self._engine.port}",
                # the saved configuration differs from what the engine was started with
                "restart_to_apply": p is not None
                and self._started != (self.cfg.engine, self.cfg.preset(self.cfg.active)),
                "started_at": p.started if p else None,
                "ready_at": self.ready_at,
                "crash_count": self.crash_count,
                "restart_count": self.restart_count,
                "last_error": self.last_error,
                "last_exit_code": self.last_exit_code,
                "next_restart_in_s": max(0.0, self.next_restart_at - now) if self.next_restart_at else None,
            }

    def close(self) -> None:
        """Stop the engine gracefully and end the threads (the supervisor is exiting)."""
        self._ops.put(None)
        self._closed.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=self.cfg.engine.shutdown_grace_s + 60)
        self._stop_engine()

    # ---- the worker: one operation at a time --------------------------------------------------------------
    def _work(self) -> None:
        while True:
            op = self._ops.get()
            if op is None:
                return
            try:
                self._run(op)
            except Exception as e:  # an operation's failure is shown, never the end of the supervisor
                with self._lock:
                    self.last_error = f"{op} failed: {type(e).__name__}: {e}"

    def _run(self, op: str) -> None:
        if op == "stop":
            self.desired = False
            self._stop_engine()
            return
        if op == "start":
            self.desired = True
            self._in_a_row = 0
        elif op in ("restart", "switch"):
            self.desired = True
            self._in_a_row = 0
            if self._proc is not None:
                self._stop_engine()
                self.restart_count += 1
        elif op == "respawn" and not self.desired:
            return
        with self._lock:
            if self._proc is None:
                self._spawn()

    def _spawn(self) -> None:
        cfg = self.cfg
        preset = cfg.preset(cfg.active)
        if self.request_log.exists() and self.request_log.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(self.request_log, self.request_log.with_name(self.request_log.name + ".1"))
        argv = serve_argv(preset, cfg.engine, str(self.request_log))
        self._proc = EngineProcess(argv, self.engine_log, preset.name)
        self._engine = cfg.engine  # a saved config applies at the next start: until then, probe this one
        self._started = (cfg.engine, preset)
        self._pid_file.write_text(str(self._proc.pid))
        self.state, self.health, self.model_id = "starting", "starting", None
        self.next_restart_at = self.ready_at = None
        self._spawned_at = time.monotonic()

    def _stop_engine(self) -> None:
        with self._lock:
            proc = self._proc
            if proc is None:
                self.state = "stopped" if not self.desired else self.state
                self.next_restart_at = None
                return
            self._stopping = True
            self.state, self.health = "stopping", "draining"
        code = proc.stop(self._engine.shutdown_grace_s)
        with self._lock:
            self._proc, self._stopping = None, False
            self.last_exit_code = code
            self.state, self.health, self.model_id = "stopped", "down", None
            self.next_restart_at = None
            self._pid_file.unlink(missing_ok=True)

    # ---- the monitor --------------------------------------------------------------------------------------
    def _monitor(self) -> None:
        while not self._closed.wait(0.25):
            try:
                self._check()
            except Exception as e:  # keep watching whatever happened
                with self._lock:
                    self.last_error = f"monitor: {type(e).__name__}: {e}"

    def _check(self) -> None:
        with self._lock:
            proc, state, stopping = self._proc, self.state, self._stopping
            due = self.next_restart_at is not None and time.monotonic() >= self.next_restart_at
        if proc is None:
            if state == "backoff" and due and self.desired:
                with self._lock:
                    self.next_restart_at = None
                    self.state = "restarting"
                self.submit("respawn")
            return
        if stopping:
            return
        rc = proc.poll()
        if rc is not None:
            self._crashed(proc, f"the engine exited with code {rc}", rc)
            return
        now = time.monotonic()
        if state == "starting" and now - self._spawned_at > self.cfg.restart.start_timeout_s:
            proc.proc.kill()
            proc.proc.wait(10)
            self._crashed(proc, f"not healthy {self.cfg.restart.start_timeout_s:.0f} s after the start", None)
            return
        if state == "starting" or now - self._last_health >= 2.0:
            self._last_health = now
            self._probe(proc)

    def _probe(self, proc: EngineProcess) -> None:
        e = self._engine
        url = f"http://{e.host}:{e.port}"
        key = first_key(e.api_key_file)
        try:
            r = httpx.get(url + "/health", timeout=2.0)
            health = r.json().get("status", "unavailable") if r.status_code in (200, 503) else "unavailable"
        except (httpx.HTTPError, ValueError):
            health = "unreachable"
        model_id = self.model_id
        if health == "ok" and model_id is None:
            headers = {"authorization": f"Bearer {key}"} if key else {}
            try:
                model_id = httpx.get(url + "/v1/models", timeout=2.0, headers=headers).json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                model_id = None
        with self._lock:
            if self._proc is not proc or self._stopping:
                return
            self.health, self.model_id = health, model_id
            if health == "ok" and self.state == "starting":
                self.state, self.ready_at = "running", time.time()
                self._fallback = None
            stable = (
                self.ready_at is not None and time.time() - self.ready_at > self.cfg.restart.stable_after_s
            )
            if self.state == "running" and stable:
                self._in_a_row = 0

    def _crashed(self, proc: EngineProcess, why: str, code: int | None) -> None:
        out = " | ".join(line.strip() for line in tail_lines(proc.log_path, 4) if line.strip())
        with self._lock:
            if self._proc is not proc or self._stopping:  # an exit that a stop asked for is no crash
                return
            self._proc = None
            self._pid_file.unlink(missing_ok=True)
            self.crash_count += 1
            self._in_a_row += 1
            self.last_exit_code = code
            self.last_error = f"{why}; last output: {out[-600:]}" if out else why
            r = self.cfg.restart
            delay = min(r.backoff_max_s, r.backoff_initial_s * 2 ** (self._in_a_row - 1))
            if self._fallback is not None and self.state == "starting":
                # a switched-to preset that passed the preflight but cannot start: the previous one comes
                # back at once rather than leave the service down
                self.last_error = (
                    f"preset {proc.preset!r} did not start ({self.last_error}); back to {self._fallback!r}"
                )
                self.cfg = self.cfg.with_active(self._fallback)
                save_config(self.config_path, self.cfg)
                self._fallback, self._in_a_row, delay = None, 0, 0.0
            self.state, self.health, self.model_id = "backoff", "down", None
            self.next_restart_at = time.monotonic() + delay if self.desired else None
            if not self.desired:
                self.state = "stopped"
        proc.cleanup()  # what the engine left in its session (Ray's agents outlive a killed driver)

    def _reap_orphan(self) -> None:
        """An engine left by an earlier supervisor that ended without stopping it (killed): end its session,
        which would otherwise hold the port and the GPU memory."""
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmd = []
        if session_pids(pid) and b"serve" in cmd and any(b"ninfer" in c for c in cmd):
            kill_session(pid)
        self._pid_file.unlink(missing_ok=True)
