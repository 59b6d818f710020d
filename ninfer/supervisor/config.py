"""The supervisor's configuration file: engine settings, the restart policy and the model catalog (presets).

A JSON object (docs/supervisor.md has an example)::

    {"engine": {"port": 8010, "memory_reserve_gib": 2, "args": ["--backend", "cuda"]},
     "restart": {"backoff_initial_s": 1, "backoff_max_s": 60},
     "presets": [{"name": "27B concurrent", "artifact": "/models/27b.ninfer",
                  "args": ["--max-concurrency", "8", "--kv-dtype", "fp8"]}],
     "active": "27B concurrent"}

Invariants: a loaded ``SupervisorConfig`` is valid (every preset's arguments parse as ``ninfer serve`` options,
none of them sets an option the supervisor owns, ``active`` names a preset); relative paths were resolved
against the file's directory. ``save_config`` writes atomically (temporary file, fsync, rename) and keeps the
previous file as ``FILE.bak``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .serve_args import MANAGED_FLAGS, preset_args_problem

__all__ = [
    "ConfigError",
    "EngineSettings",
    "RestartPolicy",
    "Preset",
    "SupervisorConfig",
    "parse_config",
    "load_config",
    "save_config",
    "MANAGED_FLAGS",
]


class ConfigError(ValueError):
    """An invalid configuration; ``field`` names the offending setting (``presets[1].args``)."""

    def __init__(self, field_: str, message: str) -> None:
        super().__init__(f"{field_}: {message}")
        self.field = field_
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    host: str = "127.0.0.1"
    port: int = 8010
    api_key_file: str | None = (
        None  # the engine's keys (never shown; the supervisor uses one to read /metrics)
    )
    memory_reserve_gib: float = 0.0  # GPU memory kept free for the desktop: passed to every engine
    shutdown_grace_s: float = 30.0  # running requests get this long to finish on stop, restart and switch
    args: tuple[str, ...] = ()  # serve options common to every preset (before the preset's own)


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartPolicy:
    backoff_initial_s: float = 1.0  # first wait after a crash; doubled after each crash in a row
    backoff_max_s: float = 60.0
    stable_after_s: float = 60.0  # up this long: the next crash waits backoff_initial_s again
    start_timeout_s: float = 900.0  # not healthy this long after the spawn: killed, counted as a crash


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    name: str
    artifact: str
    args: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorConfig:
    presets: tuple[Preset, ...]
    active: str
    engine: EngineSettings = field(default_factory=EngineSettings)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    autostart: bool = True  # start the active preset when the supervisor starts
    preflight_verify: str = "full"  # "full": hash every blob before a switch; "manifest": structure only
    state_dir: str | None = None  # engine log and request log; None: the CLI's default

    def preset(self, name: str) -> Preset:
        for p in self.presets:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engine"]["args"] = list(self.engine.args)
        d["presets"] = [{**asdict(p), "args": list(p.args)} for p in self.presets]
        return d

    def with_active(self, name: str) -> SupervisorConfig:
        self.preset(name)
        return replace(self, active=name)


def _obj(v: Any, where: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(where, "must be an object")
    unknown = sorted(set(v) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}" if where else unknown[0], "unknown setting")
    return v


def _num(d: dict[str, Any], key: str, where: str, default: float, lo: float, hi: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise ConfigError(f"{where}.{key}", f"must be a number in {lo}..{hi}, got {v!r}")
    return float(v)


def _str(d: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    v = d.get(key, default)
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise ConfigError(f"{where}.{key}", f"must be a non-empty string, got {v!r}")
    return v


def _args(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise ConfigError(where, 'must be a list of strings (serve options, e.g. ["--kv-dtype", "fp8"])')
    return tuple(v)


def _path(p: str | None, base: Path) -> str | None:
    return None if p is None else str((base / os.path.expanduser(p)).resolve())


def _engine(v: Any, base: Path) -> EngineSettings:
    d = _obj(v, "engine", {f.name for f in EngineSettings.__dataclass_fields__.values()})
    port = d.get("port", 8010)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError("engine.port", f"must be an integer in 1..65535, got {port!r}")
    return EngineSettings(
        host=_str(d, "host", "engine", "127.0.0.1") or "127.0.0.1",
        port=port,
        api_key_file=_path(_str(d, "api_key_file", "engine"), base),
        memory_reserve_gib=_num(d, "memory_reserve_gib", "engine", 0.0, 0, 1024),
        shutdown_grace_s=_num(d, "shutdown_grace_s", "engine", 30.0, 0, 3600),
        args=_args(d.get("args"), "engine.args"),
    )


def _restart(v: Any) -> RestartPolicy:
    d = _obj(v, "restart", {f.name for f in RestartPolicy.__dataclass_fields__.values()})
    r = RestartPolicy(
        backoff_initial_s=_num(d, "backoff_initial_s", "restart", 1.0, 0.1, 3600),
        backoff_max_s=_num(d, "backoff_max_s", "restart", 60.0, 0.1, 86400),
        stable_after_s=_num(d, "stable_after_s", "restart", 60.0, 0, 86400),
        start_timeout_s=_num(d, "start_timeout_s", "restart", 900.0, 1, 86400),
    )
    if r.backoff_max_s < r.backoff_initial_s:
        raise ConfigError("restart.backoff_max_s", "must be at least backoff_initial_s")
    return r


def _preset(v: Any, i: int, base: Path) -> Preset:
    where = f"presets[{i}]"
    d = _obj(v, where, {"name", "artifact", "args", "description"})
    name, artifact = _str(d, "name", where), _str(d, "artifact", where)
    if name is None or artifact is None:
        raise ConfigError(f"{where}.{'name' if name is None else 'artifact'}", "is required")
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(f"{where}.description", "must be a string")
    return Preset(name=name.strip(), artifact=_path(artifact, base) or artifact, args=_args(d.get("args"), f"{where}.args"),
                  description=desc)  # fmt: skip


def check_preset_args(args: tuple[str, ...], where: str) -> None:
    """Raise ConfigError unless ``args`` are valid serve options that leave the supervisor's own alone (serve's
    own option parser judges them)."""
    why = preset_args_problem(args)
    if why is not None:
        raise ConfigError(where, why)


def parse_config(data: Any, base_dir: str | os.PathLike[str] = ".") -> SupervisorConfig:
    """A validated config from the file's JSON value; relative paths are taken from ``base_dir``."""
    base = Path(base_dir)
    d = _obj(data, "", {*SupervisorConfig.__dataclass_fields__})
    raw = d.get("presets")
    if not isinstance(raw, list) or not raw:
        raise ConfigError("presets", "must be a non-empty list of presets")
    presets = tuple(_preset(p, i, base) for i, p in enumerate(raw))
    names = [p.name for p in presets]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError("presets", f"two presets are named {dup!r}")
    engine = _engine(d.get("engine", {}), base)
    check_preset_args(engine.args, "engine.args")
    for i, p in enumerate(presets):
        check_preset_args((*engine.args, *p.args), f"presets[{i}].args")
        if not os.path.isfile(p.artifact):
            raise ConfigError(f"presets[{i}].artifact", f"no such file: {p.artifact}")
    active = d.get("active", presets[0].name)
    if active not in names:
        raise ConfigError("active", f"names no preset: {active!r} (presets: {', '.join(names)})")
    verify = d.get("preflight_verify", "full")
    if verify not in ("full", "manifest"):
        raise ConfigError("preflight_verify", f"'full' or 'manifest', got {verify!r}")
    autostart = d.get("autostart", True)
    if not isinstance(autostart, bool):
        raise ConfigError("autostart", "must be true or false")
    return SupervisorConfig(
        presets=presets, active=active, engine=engine, restart=_restart(d.get("restart", {})),
        autostart=autostart, preflight_verify=verify, state_dir=_path(_str(d, "state_dir", ""), base),
    )  # fmt: skip


def load_config(path: str | os.PathLike[str]) -> SupervisorConfig:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError("config", f"cannot read {str(p)!r}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError("config", f"{str(p)!r} is not valid JSON: {e}") from None
    return parse_config(data, p.resolve().parent)


def save_config(path: str | os.PathLike[str], cfg: SupervisorConfig) -> str | None:
    """Write ``cfg`` atomically; the file it replaces is kept as ``FILE.bak`` (returned, None if none)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    text = json.dumps(cfg.to_dict(), indent=2) + "\n"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    backup = None
    if p.exists():
        backup = str(p.with_name(p.name + ".bak"))
        shutil.copy2(p, backup)
    os.replace(tmp, p)  # readers see the old file or the new one, never a part
    dir_fd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return backup
