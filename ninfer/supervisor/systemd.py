"""``ninfer supervisor install --user`` / ``uninstall --user``: a systemd user unit that starts the supervisor
at login (``WantedBy=default.target`` of the user's manager; ``loginctl enable-linger`` makes it start at boot).

Stopping the unit sends SIGTERM to the supervisor, which stops the engine gracefully; ``TimeoutStopSec`` leaves
room for the engine's grace period before systemd kills what is left.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["UNIT_NAME", "unit_text", "install", "uninstall"]

UNIT_NAME = "ninfer-supervisor.service"


def unit_text(
    config: str,
    *,
    host: str,
    port: int,
    admin_key_file: str | None,
    grace_s: float,
    python: str | None = None,
) -> str:
    argv = [
        python or sys.executable,
        "-m",
        "ninfer.cli",
        "supervisor",
        "--config",
        str(Path(config).resolve()),
    ]
    argv += ["--host", host, "--port", str(port)]
    if admin_key_file:
        argv += ["--admin-key-file", str(Path(admin_key_file).resolve())]
    return "\n".join([
        "[Unit]",
        "Description=ninfer supervisor: the local inference engine and its dashboard",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={shlex.join(argv)}",
        "Restart=on-failure",
        "RestartSec=5",
        "KillMode=mixed",
        f"TimeoutStopSec={int(grace_s) + 60}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ])  # fmt: skip


def _systemctl(systemctl: str, *args: str) -> None:
    r = subprocess.run([systemctl, "--user", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"systemctl --user {' '.join(args)} failed: {(r.stderr or r.stdout).strip()}")


def install(unit_dir: str | Path, text: str, *, enable: bool = True, systemctl: str = "systemctl") -> Path:
    """Write the unit (replacing an earlier one), reload the user manager and, with ``enable``, enable and
    start it now."""
    d = Path(unit_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / UNIT_NAME
    path.write_text(text, encoding="utf-8")
    if enable:
        _systemctl(systemctl, "daemon-reload")
        _systemctl(systemctl, "enable", "--now", UNIT_NAME)
    return path


def uninstall(unit_dir: str | Path, *, systemctl: str | None = "systemctl") -> Path | None:
    """Disable and stop the unit, remove its file and reload; returns the removed path (None: none was there)."""
    path = Path(unit_dir) / UNIT_NAME
    if systemctl:
        try:
            _systemctl(systemctl, "disable", "--now", UNIT_NAME)
        except RuntimeError:
            if path.exists():  # a unit we wrote but cannot stop: say so rather than leave it half removed
                raise
    if not path.exists():
        return None
    path.unlink()
    if systemctl:
        _systemctl(systemctl, "daemon-reload")
    return path
