"""Request fixtures for the corpus runner: one JSON file per request, a directory per multi-turn session.

A fixtures directory holds ``*.json`` files (single requests, each its own session of one turn) and
sub-directories (sessions: their ``*.json`` files, in name order, are the turns, sent one after another). A file::

    {"protocol": "openai_chat" | "anthropic_messages" | "openai_responses",
     "description": "...",                       # optional
     "body": {...},                              # the request body as the protocol defines it
     "checks": [{"kind": "valid_json"}, ...]}    # optional structural checks

``body.model`` may be left out: the runner fills in the server's model id. ``stream`` is always set by the runner.
Check kinds and what they need from the body are in ``checks.py``; a check the body cannot support (a stop check
without stop strings, a schema check without a schema) is refused when the corpus is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from .checks import Check, check_supported

__all__ = ["Check", "Fixture", "Session", "FixtureError", "load_corpus"]


class FixtureError(ValueError):
    """A fixture file or directory that cannot be replayed, with its path."""


class _File(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    protocol: Literal["openai_chat", "anthropic_messages", "openai_responses"]
    body: dict[str, Any]
    checks: list[Check] = []
    description: str = ""


class Fixture(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # "plain_chat" or "agent_session/03_read_file"
    session: str
    turn: int  # 1-based position in its session
    protocol: str
    body: dict[str, Any]
    checks: tuple[Check, ...]
    description: str = ""


class Session(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    turns: tuple[Fixture, ...]


def _load_file(path: Path, name: str, session: str, turn: int) -> Fixture:
    try:
        f = msgspec.json.decode(path.read_bytes(), type=_File)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise FixtureError(f"{path}: {e}") from None
    if "stream" in f.body and f.body["stream"] is not True:
        raise FixtureError(f"{path}: body.stream: the runner always streams; leave it out")
    for c in f.checks:
        why = check_supported(c, f.protocol, f.body)
        if why is not None:
            raise FixtureError(f"{path}: check {c.kind!r}: {why}")
    return Fixture(name=name, session=session, turn=turn, protocol=f.protocol, body=f.body,
                   checks=tuple(f.checks), description=f.description)  # fmt: skip


def load_corpus(directory: str | Path) -> list[Session]:
    """Every session of a fixtures directory, in name order (single files and session directories mixed)."""
    root = Path(directory)
    if not root.is_dir():
        raise FixtureError(f"{root}: not a directory")
    sessions: list[Session] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            files = sorted(entry.glob("*.json"))
            if not files:
                raise FixtureError(f"{entry}: a session directory without *.json turns")
            turns = tuple(
                _load_file(p, f"{entry.name}/{p.stem}", entry.name, i + 1) for i, p in enumerate(files)
            )
            sessions.append(Session(name=entry.name, turns=turns))
        elif entry.suffix == ".json":
            sessions.append(Session(name=entry.stem, turns=(_load_file(entry, entry.stem, entry.stem, 1),)))
    if not sessions:
        raise FixtureError(f"{root}: no fixtures (*.json files or session directories)")
    return sessions
