"""``ninfer supervisor``: run the supervisor (engine + dashboard), or install / uninstall its user service."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _log(msg: str) -> None:
    print(f"ninfer supervisor: {msg}", file=sys.stderr, flush=True)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("supervisor", help="run the engine under a supervisor with a browser dashboard")
    _common(p)
    p.add_argument("--state-dir", default=None, help="engine and request logs (default: the config's, else "
                   "$XDG_STATE_HOME/ninfer)")  # fmt: skip
    p.set_defaults(func=_run)
    sub = p.add_subparsers(dest="action")
    i = sub.add_parser("install", help="install and enable a systemd user service (starts at login)")
    _common(i)
    i.add_argument("--user", action="store_true", required=True, help="a per-user service (the only kind)")
    i.add_argument("--no-enable", action="store_true", help="write the unit file only")
    i.set_defaults(func=_install)
    u = sub.add_parser("uninstall", help="disable and remove the systemd user service")
    u.add_argument("--user", action="store_true", required=True, help="the per-user service (the only kind)")
    u.set_defaults(func=_uninstall)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="the JSON config file")
    p.add_argument("--host", default="127.0.0.1", help="dashboard address (default: this machine only)")
    p.add_argument("--port", type=int, default=8099, help="dashboard port (default 8099)")
    p.add_argument("--admin-key-file", default=None, help="a file whose first line is the key every /api "
                   "route then needs")  # fmt: skip


def _unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "systemd" / "user"


def _state_dir(a: argparse.Namespace, cfg: Any) -> str:
    if a.state_dir:
        return a.state_dir
    if cfg.state_dir:
        return cfg.state_dir
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ninfer")


def _admin_key(path: str | None) -> str | None:
    if path is None:
        return None
    lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines or any(c.isspace() for c in lines[0]):
        raise ValueError(f"--admin-key-file {path!r}: the first line must be a key without whitespace")
    return lines[0]


def _exit_on_signal(signum: int, _: Any) -> None:
    raise SystemExit(128 + signum)


def _run(a: argparse.Namespace) -> int:
    import uvicorn

    from .activity import RequestLog, Sampler
    from .config import ConfigError, load_config
    from .gpu import GpuProbe
    from .http import build_app
    from .lifecycle import Supervisor

    if a.config is None:
        _log("error: --config FILE is required")
        return 2
    try:
        cfg = load_config(a.config)
        admin_key = _admin_key(a.admin_key_file)
    except (ConfigError, OSError, ValueError) as e:
        _log(f"error: {e}")
        return 2
    gpu = GpuProbe()
    sup = Supervisor(str(Path(a.config).resolve()), cfg, _state_dir(a, cfg), gpu)
    reqlog = RequestLog(sup.request_log)
    sampler = Sampler(reqlog, gpu, sup.engine_target)
    app = build_app(sup, sampler, reqlog, admin_key)
    g = sampler.gpu_status
    _log(
        f"GPU: {g.name} ({g.total_bytes / (1 << 30):.1f} GiB)" if g.available else f"GPU: absent ({g.detail})"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the monitor's polls are not news
    # uvicorn re-raises the signal that stopped it once it has shut down: make that an exception, so the
    # engine is stopped below instead of the process dying with it still running
    signal.signal(signal.SIGTERM, _exit_on_signal)
    sup.begin()
    sampler.start()
    _log(f"dashboard on http://{a.host}:{a.port} (engine on {sup.status()['url']}, state in {sup.state_dir})")
    try:
        uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        _log("stopping the engine")
        sampler.close()
        sup.close()
    return 0


def _install(a: argparse.Namespace) -> int:
    from .config import load_config
    from .systemd import install, unit_text

    if a.config is None:
        _log("error: install needs --config FILE")
        return 2
    cfg = load_config(a.config)  # refuse to install a service that could not start
    text = unit_text(a.config, host=a.host, port=a.port, admin_key_file=a.admin_key_file,
                     grace_s=cfg.engine.shutdown_grace_s)  # fmt: skip
    path = install(_unit_dir(), text, enable=not a.no_enable)
    _log(
        f"wrote {path}"
        + ("" if a.no_enable else "; enabled and started (systemctl --user status ninfer-supervisor)")
    )
    return 0


def _uninstall(a: argparse.Namespace) -> int:
    from .systemd import uninstall

    path = uninstall(_unit_dir())
    _log(f"removed {path}" if path else "no user service was installed")
    return 0
