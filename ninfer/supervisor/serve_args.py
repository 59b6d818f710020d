"""Serve's own option parser, used to judge preset arguments (the one definition of serve's options is
ninfer/api/cli.py ``register``)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["MANAGED_FLAGS", "parse_serve_args", "preset_args_problem"]

# serve options the supervisor sets itself (argparse dest -> flag): a preset may not set them
MANAGED_FLAGS = {
    "host": "--host",
    "port": "--port",
    "request_log_jsonl": "--request-log-jsonl",
    "api_key_file": "--api-key-file",
    "memory_reserve_gib": "--memory-reserve-gib",
    "shutdown_grace_s": "--shutdown-grace-s",
    "detached": "--detached",
}


class _Raising(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise ValueError(message)


def _serve_parser() -> argparse.ArgumentParser:
    from ninfer.api.cli import register

    top = _Raising(prog="ninfer", add_help=False)
    register(top.add_subparsers(dest="command", parser_class=_Raising))
    return top


def parse_serve_args(args: tuple[str, ...], artifact: str = "ARTIFACT") -> argparse.Namespace:
    """``ninfer serve ARTIFACT *args`` parsed (ValueError on a bad option)."""
    return _serve_parser().parse_args(["serve", artifact, *args])


def preset_args_problem(args: tuple[str, ...]) -> str | None:
    """Why ``args`` are not valid serve options that leave the supervisor's own alone, or None."""
    from ninfer.api.cli import config_from_args

    try:
        ns = parse_serve_args(args)
        defaults = parse_serve_args(())
        config_from_args(ns)  # the server's own validation (ranges, choices)
    except ValueError as e:
        return f"not valid serve options: {e}"
    for dest, flag in MANAGED_FLAGS.items():
        if getattr(ns, dest, None) != getattr(defaults, dest, None):
            return f"{flag} is set by the supervisor (engine settings), not by a preset"
    return None
