"""One engine process: ``ninfer serve`` spawned in its own session, stopped gracefully, and cleaned up whole.

The engine starts a local Ray (GCS, raylet, workers, agents) whose processes stay in the engine's session. A
graceful stop is SIGTERM to the serve process — it drains: running requests get the grace period, new ones 503
with ``Retry-After`` — then, past the grace period, SIGKILL. Whatever is left in the session afterwards (Ray's
agents outlive a killed driver) is terminated too, so a stop or a crash never leaks processes or GPU memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from pathlib import Path

__all__ = ["EngineProcess", "session_pids", "kill_session", "tail_lines"]


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (Linux /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            out.append(int(entry.name))
    return out


def kill_session(sid: int, wait_s: float = 3.0) -> int:
    """SIGTERM every process of session ``sid``, then SIGKILL what is left after ``wait_s``; returns how many
    processes there were."""
    pids = session_pids(sid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = session_pids(sid)
        if not pids:
            break
    return len(pids)


def tail_lines(path: str | os.PathLike[str], n: int, max_bytes: int = 65536) -> list[str]:
    """The last ``n`` lines of a text file (read from its last ``max_bytes``)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    return list(deque(data.decode("utf-8", "replace").splitlines(), maxlen=n))


class EngineProcess:
    """A spawned ``ninfer serve``; its stdout and stderr are appended to ``log_path``."""

    def __init__(self, argv: list[str], log_path: str | os.PathLike[str], preset: str) -> None:
        self.argv, self.preset, self.log_path = argv, preset, Path(log_path)
        with open(self.log_path, "ab") as log:
            log.write(f"--- supervisor: starting preset {preset!r}: {' '.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.proc.pid  # also the session id of everything the engine starts
        self.started = time.time()

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace_s: float) -> int:
        """Graceful stop: SIGTERM (the server drains for ``grace_s``), SIGKILL if it is still there some
        seconds after that, then the rest of the session. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s + 15)  # the drain, then Ray's shutdown
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.cleanup()
        return self.proc.returncode

    def cleanup(self) -> None:
        """Terminate what the engine left in its session (after it exited or was killed)."""
        kill_session(self.pid)

    def pids(self) -> list[int]:
        return session_pids(self.pid)
