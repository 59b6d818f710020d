"""Request limits checked on the raw body before it is decoded."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["MAX_JSON_DEPTH", "json_depth", "value_depth"]

# Deepest JSON nesting accepted in a request body. Real requests stay far below it (a tool schema inside a chat
# request is ~15 levels); around 200 levels the JSON decoder, the chat template and Ray's pickling of the engine
# request each fail with a RecursionError.
MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPEN, _CLOSE = b"[{", b"]}"


def json_depth(body: bytes, limit: int | None = None) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do not count). With
    ``limit``, a body with no more than ``limit`` opening brackets in all is not scanned: their count (at least
    the depth, at most ``limit``) is returned."""
    opens = body.count(b"[") + body.count(b"{")
    if limit is not None and opens <= limit:
        return opens
    a = np.frombuffer(_STRING.sub(b'""', body), dtype=np.uint8)
    steps = (a == _OPEN[0]).astype(np.int32) + (a == _OPEN[1]) - (a == _CLOSE[0]) - (a == _CLOSE[1])
    return int(np.cumsum(steps).max(initial=0))


def value_depth(value: Any, limit: int) -> int:
    """How deep the lists, tuples and dicts of a decoded value nest (counting stops once past ``limit``).

    The raw body's depth misses JSON inside strings that the translation parses (tool-call arguments), so the
    engine request is measured again before it is sent."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, list | tuple):
            items = v
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((x, depth + 1) for x in items)
    return deepest
