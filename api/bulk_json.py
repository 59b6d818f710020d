"""A large request body decoded in steps: the one long array of a request (``messages``, ``input``) a window of
items at a time, so that no single msgspec call holds the GIL for long.

One ``Decoder.decode`` of a 60 MB body (a million messages whose content is a list of parts) is one C call of
~0.4 s that never lets another thread run: on a worker thread it still stalls the API's event loop (every
stream, ``/health``) for as long. ``decode_in_steps`` finds the array, decodes its items ~256 KiB at a time and
the rest of the body (the array left empty) once, and gives the same Struct. A window ends at a ``}`` followed by
``,`` or ``]`` (the first few past ~256 KiB, else the last few before), and is kept only if ``[`` + window + ``]`` decodes as a list of items: starting at an item
boundary, a balanced run of complete items can end nowhere but at another boundary (a cut inside a string leaves
it unterminated, a cut inside a nested value leaves it unclosed). Where no such cut is found (items that are not
objects, a malformed body, a duplicated key), the body is decoded in one call, as before.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any, TypeVar

import msgspec

from .validation import LARGE_BODY_BYTES

__all__ = ["STEP_BYTES", "BodyDecoder", "decode_in_steps"]

T = TypeVar("T")
STEP_BYTES = 256 << 10  # one window's bytes: ~2 ms of decoding on a 2-core CPU host
_TRIES = 4  # candidate cuts tried per window before the window grows
_KEY_END = re.compile(rb"\s*:\s*\[")
_CUT = re.compile(rb"\}\s*([,\]])")
_EMPTY = re.compile(rb"\s*\]")
_PATH = re.compile(r"`\$\[(\d+)\]")


class BodyDecoder:
    """A request's decoder: in one call up to LARGE_BODY_BYTES, past it in steps (``decode_in_steps``)."""

    def __init__(self, request: type[Any], field: str, item: Any) -> None:
        self.one = msgspec.json.Decoder(request)
        self.field = field
        self.items = msgspec.json.Decoder(list[item])

    def decode(self, body: bytes) -> Any:
        if len(body) <= LARGE_BODY_BYTES:
            return self.one.decode(body)
        return decode_in_steps(body, self.one, self.field, self.items)


def decode_in_steps(
    body: bytes, decoder: msgspec.json.Decoder[T], field: str, items: msgspec.json.Decoder[Any]
) -> T:
    """``decoder.decode(body)``, with the top-level array ``field`` decoded by ``items`` (a decoder of a list of
    its items) in windows of STEP_BYTES. Raises what ``decoder.decode`` raises; a validation error inside the array
    names the item by its index in the whole array (``$.messages[123456].role``)."""
    start = _array_start(body, field)
    found = None if start is None else _items(body, start, items, field)
    if found is None:
        return decoder.decode(body)
    values, close = found
    if (
        body.find(b'"' + field.encode() + b'"', close) >= 0
    ):  # the key again, perhaps: the one-call decoder's way
        return decoder.decode(body)
    req = decoder.decode(body[:start] + body[close:])  # the array left empty: `"messages": []`
    setattr(req, field, values)
    return req


def _array_start(body: bytes, field: str) -> int | None:
    """The index just past the ``[`` of the top-level ``"field": [``, or None. A hit counts only if the body up to
    the key is the start of a JSON object (``{`` and complete members): not a key of a nested object, not text."""
    key = b'"' + field.encode() + b'"'
    at = body.find(key)
    for _ in range(8):
        if at < 0:
            return None
        m = _KEY_END.match(body, at + len(key))
        if m is not None:
            try:
                msgspec.json.decode(body[:at] + b'"_":0}', type=dict[str, msgspec.Raw])
                return m.end()
            except msgspec.MsgspecError:
                pass
        at = body.find(key, at + 1)
    return None


def _items(
    body: bytes, pos: int, items: msgspec.json.Decoder[Any], field: str
) -> tuple[list[Any], int] | None:
    """The array's items from ``pos`` (just past its ``[``) and the index of its ``]``; None where no cut works."""
    out: list[Any] = []
    if _EMPTY.match(body, pos):
        return None  # an empty array: nothing to step through
    step = STEP_BYTES
    while True:
        got = _window(body, pos, step, items, field, len(out))
        if got is None:
            if pos + step >= len(body):
                return None
            step *= 4  # no cut within the tries: a larger window (a few huge items, cuts inside them)
            continue
        values, end = got
        out.extend(values)
        if body[end : end + 1] == b"]":
            return out, end
        pos, step = end + 1, STEP_BYTES


def _cuts(body: bytes, pos: int, step: int) -> Iterator[re.Match[bytes]]:
    """Candidate cuts: the first few past ``pos + step``, then the last few before it (the array may end there)."""
    target = min(pos + step, len(body))
    yield from itertools.islice(_CUT.finditer(body, target), _TRIES)
    yield from reversed(list(_CUT.finditer(body, pos, target))[-_TRIES:])


def _window(
    body: bytes, pos: int, step: int, items: msgspec.json.Decoder[Any], field: str, base: int
) -> tuple[list[Any], int] | None:
    """The items from ``pos`` up to the first candidate cut that decodes, and that cut's index."""
    for m in _cuts(body, pos, step):
        try:
            return items.decode(b"[" + body[pos : m.start(1)] + b"]"), m.start(1)
        except msgspec.ValidationError as e:  # a real error: the bytes decoded so far are the body's own
            raise msgspec.ValidationError(
                _PATH.sub(lambda p: f"`$.{field}[{base + int(p[1])}]", str(e))
            ) from None
        except msgspec.DecodeError:
            continue  # a cut inside an item, or past the array's end
    return None
