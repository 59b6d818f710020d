"""How deeply a request may nest, checked on what was decoded (cheap: only containers are visited).

Real requests stay far below the limit (a tool schema inside a chat request is ~15 levels); from about 200
levels on, the chat template and Ray's pickling of the engine request fail with a RecursionError, and from about
1,000 the JSON decoder itself does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from .errors import ApiError

__all__ = ["MAX_JSON_DEPTH", "value_depth", "check_depth", "nesting_guard"]

MAX_JSON_DEPTH = 64


def value_depth(value: Any, limit: int) -> int:
    """How deep the dicts, lists, tuples and msgspec Structs of ``value`` nest (iterative; counting stops once
    past ``limit``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, list | tuple):
            items = v
        elif isinstance(v, msgspec.Struct):
            items = [getattr(v, f) for f in v.__struct_fields__]
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((x, depth + 1) for x in items)
    return deepest


def check_depth(value: Any, err: type[ApiError], what: str = "the request") -> None:
    """400 ``nesting_too_deep`` when ``value`` nests deeper than MAX_JSON_DEPTH."""
    if value_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise err(400, f"{what} nests more than {MAX_JSON_DEPTH} levels deep", code="nesting_too_deep")


@contextmanager
def nesting_guard(err: type[ApiError]) -> Iterator[None]:
    """Decoding and translating a request: one nested past Python's recursion limit is a 400, not a 500."""
    try:
        yield
    except RecursionError:
        raise err(
            400, f"the request nests more than {MAX_JSON_DEPTH} levels deep", code="nesting_too_deep"
        ) from None
