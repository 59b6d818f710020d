"""A large request body decoded in steps: the one long array of a request (``messages``, ``input``) a window of
items at a time, so that no single msgspec call holds the GIL for long.

One ``Decoder.decode`` of a 60 MB body (a million messages whose content is a list of parts) is one C call of
~0.4 s that never lets another thread run: on a worker thread it still stalls the API's event loop (every
stream, ``/health``) for as long. ``decode_in_steps`` finds the array, decodes its items ~256 KiB at a time and
the rest of the body (the array left empty) once, and gives the same Struct. A window ends at a ``}`` followed
by ``,`` or ``]`` (the first few past ~256 KiB, else the last few before), and is kept only if ``[`` + window +
``]`` decodes as a list of items: starting at an item boundary, a balanced run of complete items can end nowhere
but at another boundary (a cut inside a string leaves it unterminated, a cut inside a nested value leaves it
unclosed). The steps are kept only where the array is the value the one call would keep: the last top-level key
that decodes to ``field`` (a duplicate, ``\\u``-escaped or not, or a key such as ``"x\\"messages"`` leaves them
unused). Where no cut is found (items that are not objects, a malformed array) or the steps meet any error (a
malformed or invalid body, one nested too deep), the body is decoded in one call, as before: an error is always
the one call's own, in its words (byte offsets, the first error in the body's order) and at its cost.
"""

from __future__ import annotations

import itertools
import re
import types
import typing
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
_NEXT = re.compile(rb"\}\s*(,)")  # past the window's target: `}]` there mostly closes a list inside an item
_EMPTY = re.compile(rb"\s*\]")
_SPACE = re.compile(rb"\s*")
_HEAD = 8  # the bytes of an item's start compared (`{"role":`, `{"type":`, pretty-printed: its indentation)
_SCAN = 64  # `},` past a window's target looked at for one followed by an item's start
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


class BodyDecoder:
    """A request's decoder: in one call up to LARGE_BODY_BYTES, past it in steps (``decode_in_steps``). The items'
    type is read from ``request``'s annotation of ``field`` (``list[X]``, alone or in a union), so the steps decode
    them exactly as the one call would."""

    def __init__(self, request: type[Any], field: str) -> None:
        self.one = msgspec.json.Decoder(request)
        self.field = field
        self.items = msgspec.json.Decoder(_list_type(request, field))

    def decode(self, body: bytes) -> Any:
        if len(body) <= LARGE_BODY_BYTES:
            return self.one.decode(body)
        return decode_in_steps(body, self.one, self.field, self.items)


def _list_type(request: type[Any], field: str) -> Any:
    """The one ``list[X]`` in ``request``'s annotation of ``field``; TypeError if there is none, or several."""
    hint = typing.get_type_hints(request)[field]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    lists = [t for t in (typing.get_args(hint) if union else (hint,)) if typing.get_origin(t) is list]
    if len(lists) != 1 or getattr(request, "__post_init__", None) is not None:
        raise TypeError(
            f"{request.__name__}.{field}: one list[...] type and no __post_init__ expected, got {hint}"
        )
    return lists[0]


def decode_in_steps(
    body: bytes, decoder: msgspec.json.Decoder[T], field: str, items: msgspec.json.Decoder[Any]
) -> T:
    """``decoder.decode(body)``, with the top-level array ``field`` decoded by ``items`` (a decoder of a list of
    its items) in windows of STEP_BYTES. Returns and raises what ``decoder.decode`` does: where the steps do not
    give the result (no cut, a duplicated key) or meet an error, ``decoder.decode(body)`` is the answer."""
    try:
        req = _in_steps(body, decoder, field, items)
    except (msgspec.MsgspecError, RecursionError):
        req = None  # an error: the one call's, in the one call's words, order and byte offsets
    return decoder.decode(body) if req is None else req


def _in_steps(
    body: bytes, decoder: msgspec.json.Decoder[T], field: str, items: msgspec.json.Decoder[Any]
) -> T | None:
    start = _array_start(body, field)
    found = None if start is None else _items(body, start, items)
    if start is None or found is None:
        return None
    values, close = found
    for n in range(1, 64):  # the array left empty, `[ ]` with n spaces that appear nowhere else in the body
        empty = b"[" + b" " * n + b"]"
        rest = body[: start - 1] + empty + body[close + 1 :]
        if rest.count(empty) == 1:
            break
    else:
        return None
    top = _TOP.decode(rest).get(field)  # the value the one call keeps: a later key (escaped, say) wins
    if top is None or bytes(top) != empty:
        return None
    req = decoder.decode(rest)
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


def _items(body: bytes, pos: int, items: msgspec.json.Decoder[Any]) -> tuple[list[Any], int] | None:
    """The array's items from ``pos`` (just past its ``[``) and the index of its ``]``; None where no cut works.
    Raises what a window's decode raises past a cut that parses (an item's error)."""
    out: list[Any] = []
    if _EMPTY.match(body, pos):
        return None  # an empty array: nothing to step through
    step = STEP_BYTES
    while True:
        got = _window(body, pos, step, items)
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
    """Candidate cuts: of the first few dozen ``},`` past ``pos + step``, those followed by what the window's first
    item starts with (``{"role":``: a part of a message's content, nested, starts otherwise), then the first few of
    them all, then the last few ``},`` or ``}]`` before ``pos + step`` (the array may end there). Each candidate
    that fails costs a window's decode: without the first pass, content of k parts sent a window past one or more
    of the k parts' ``},`` for most windows (k = 8: ~7 decodes a window, 6 times the one call's time)."""
    target = min(pos + step, len(body))
    start = _SPACE.match(body, pos).end()
    head = body[start : start + _HEAD]
    after = list(itertools.islice(_NEXT.finditer(body, target), _SCAN))
    alike = [m for m in after if body.startswith(head, _SPACE.match(body, m.end()).end())][:_TRIES]
    yield from alike
    yield from [m for m in after[:_TRIES] if m not in alike]
    yield from reversed(list(_CUT.finditer(body, pos, target))[-_TRIES:])


def _window(
    body: bytes, pos: int, step: int, items: msgspec.json.Decoder[Any]
) -> tuple[list[Any], int] | None:
    """The items from ``pos`` up to the first candidate cut that decodes, and that cut's index. A ValidationError
    goes up (the caller decodes the body in one call for its words)."""
    for m in _cuts(body, pos, step):
        try:
            return items.decode(b"[" + body[pos : m.start(1)] + b"]"), m.start(1)
        except msgspec.ValidationError:  # a DecodeError too, but the items' own: not a cut to pass over
            raise
        except msgspec.DecodeError:
            continue  # a cut inside an item, or past the array's end
    return None
