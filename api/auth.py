"""API keys: loading ``--api-key-file`` and checking a request's key in constant time.

File format: one key per line; blank lines and ``#`` comments are skipped; an optional ``name:`` prefix
(``[A-Za-z0-9_.-]{1,64}`` followed by a colon) names the client that the key belongs to. Keys never appear in
logs, errors or ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["KeyRing", "KeyFileError", "load_key_file", "parse_keys", "extract_key", "presented_keys"]

_NAME = re.compile(r"^([A-Za-z0-9_.-]{1,64}):(.+)$")


class KeyFileError(ValueError):
    """The key file is missing, unreadable or holds no usable key."""


@dataclass(frozen=True, slots=True)
class KeyRing:
    """SHA-256 digests of the accepted keys with their client names ("" when unnamed)."""

    _entries: tuple[tuple[bytes, str], ...] = field(repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, presented: str | None) -> tuple[bool, str]:
        """``(ok, client_name)``. Digests make every comparison the same length and every key is compared,
        so the time taken does not depend on which key (or how much of one) matched."""
        if presented is None:
            return False, ""
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        ok, name = False, ""
        for key_digest, key_name in self._entries:
            if hmac.compare_digest(digest, key_digest):
                ok, name = True, key_name
        return ok, name

    def identify(self, presented: str | None) -> str | None:
        """Who a valid key belongs to: its name, or ``key#N`` for an unnamed key (N: its place among the keys
        of the file, from 1); None for an invalid key. Constant time like ``check``."""
        if presented is None:
            return None
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        who = None
        for i, (key_digest, key_name) in enumerate(self._entries, 1):
            if hmac.compare_digest(digest, key_digest):
                who = key_name or f"key#{i}"
        return who

    def identify_any(self, presented: list[str]) -> str | None:
        """Who the first valid key among ``presented`` belongs to (each checked as ``identify``); None if none is."""
        for key in presented:
            if (who := self.identify(key)) is not None:
                return who
        return None


def parse_keys(text: str, source: str = "api key file") -> KeyRing:
    entries: list[tuple[bytes, str]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        name, key = (m.group(1), m.group(2).strip()) if m else ("", line)
        if not key or any(c.isspace() for c in key):
            raise KeyFileError(f"{source}: line {lineno}: a key must be non-empty and contain no whitespace")
        entries.append((hashlib.sha256(key.encode()).digest(), name))
    if not entries:
        raise KeyFileError(f"{source}: no keys found")
    return KeyRing(tuple(entries))


def load_key_file(path: str | Path) -> KeyRing:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise KeyFileError(f"--api-key-file: cannot read {str(p)!r}: {e.strerror}") from None
    return parse_keys(text, f"--api-key-file {str(p)!r}")


def extract_key(headers: dict[str, str]) -> str | None:
    """The presented key: ``Authorization: Bearer K`` first, else ``x-api-key: K``. Header names are lower-case."""
    keys = presented_keys(headers)
    return keys[0] if keys else None


def presented_keys(headers: dict[str, str]) -> list[str]:
    """Every key the request presents: ``Authorization: Bearer K``, then ``x-api-key: K``. A request passes when
    any of them is valid (as upstream: either header may carry the key), so a client that sends both, one of
    them stale or a gateway's own bearer token, is not refused for the other one."""
    out = []
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            out.append(value.strip())
    key = headers.get("x-api-key")
    if key and key.strip():
        out.append(key.strip())
    return out
