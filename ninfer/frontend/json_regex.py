"""JSON Schema ``pattern`` as XGrammar EBNF for the inside of a JSON string (between its quotes).

XGrammar 0.2.x compiles ``pattern`` to ``Regex("...", json_string=true)`` but writes the regex's literal characters
raw: a ``"`` or ``\\`` in the pattern ends or breaks the JSON string, a ``\\n`` or ``\\t`` is a raw control
character (RFC 8259 §7 forbids both), and a character after a multi-byte literal can be a raw control character.
So this module translates the pattern itself: each character the regex can match becomes either itself (when
JSON allows it raw) or its JSON escape (``\\"``, ``\\\\``, ``\\n``, ``\\u000b``), so every generated string is
valid JSON whose *decoded* value fully matches the pattern.

The translation is sound, not complete: it generates a subset of what the pattern matches, chosen so that the
value matches under both ECMA-262 (JSON Schema's dialect) and Python ``re`` (what Python validators use):

* ``\\d`` is ``[0-9]``, ``\\w`` ``[A-Za-z0-9_]``, ``\\s`` the ASCII whitespace; negated classes that use them
  (``\\D``, ``[^\\w]``, ...) generate printable ASCII only;
* ``.`` and other negated classes generate Basic Multilingual Plane characters other than control characters,
  surrogates and line terminators (ECMA's ``.`` counts UTF-16 units, so astral characters are left out);
* an unanchored pattern generates whole-string matches (a whole match is also a match anywhere).

Refused (``ValueError`` naming the construct): backreferences, lookaround, word boundaries, ``\\A``/``\\Z``, flags
such as ``(?i)``, anchors other than a leading ``^`` and a trailing ``$``, ``{,n}`` (a literal in ECMA-262), and
repetition counts above the caller's bound. The parser is Python's own (``re._parser``).
"""

from __future__ import annotations

import re
import re._constants as C  # noqa: N812 - the parser's opcode names
import re._parser as sre_parse

__all__ = ["pattern_ebnf"]

Ranges = list[tuple[int, int]]  # sorted, disjoint, inclusive code point intervals

_BMP: Ranges = [(0x20, 0xD7FF), (0xE000, 0xFFFF)]  # no control characters, no surrogates, no astral planes
_ASCII: Ranges = [(0x20, 0x7E)]
_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20)]
_LINE_ENDS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
_RAW_OK: Ranges = [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]  # what a JSON string may hold unescaped
_SHORT = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r", 0x22: '"', 0x5C: "\\"}


def _union(*sets: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(r for s in sets for r in s):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in a:
        for blo, bhi in b:
            if bhi < lo or blo > hi:
                continue
            if blo > lo:
                out.append((lo, blo - 1))
            lo = bhi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _minus(a, _minus(a, b))


_CATEGORIES: dict[object, Ranges] = {
    C.CATEGORY_DIGIT: _DIGIT,
    C.CATEGORY_WORD: _WORD,
    C.CATEGORY_SPACE: _SPACE,
    C.CATEGORY_NOT_DIGIT: _minus(_ASCII, _DIGIT),
    C.CATEGORY_NOT_WORD: _minus(_ASCII, _WORD),
    C.CATEGORY_NOT_SPACE: _minus(_ASCII, _SPACE),
}


def _class(items: list) -> Ranges:
    negate = bool(items) and items[0][0] is C.NEGATE
    parts: list[Ranges] = []
    for op, av in items[1:] if negate else items:
        if op is C.LITERAL:
            parts.append([(av, av)])
        elif op is C.RANGE:
            parts.append([av])
        elif op is C.CATEGORY and av in _CATEGORIES:
            parts.append(_CATEGORIES[av])
        else:
            raise ValueError(f"the class item {op} is not supported")
    pos = _union(*parts)
    if not negate:  # in ECMA-262 a class matches one UTF-16 unit: astral characters are left out
        return _intersect(pos, [(0, 0xD7FF), (0xE000, 0xFFFF)])
    universe = _ASCII if any(op is C.CATEGORY for op, _ in items) else _BMP
    return _minus(universe, pos)


def _chars(ranges: Ranges) -> str:
    """EBNF for one character of ``ranges`` inside a JSON string: raw where JSON allows it, else escaped."""
    alts = []
    raw = _intersect(ranges, _RAW_OK)
    if raw:
        alts.append("[" + "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}" for lo, hi in raw) + "]")
    for c in (c for lo, hi in _minus(ranges, _RAW_OK) for c in range(lo, hi + 1)):
        esc = _SHORT.get(c, f"u{c:04x}")
        alts.append('"\\\\' + ("\\" + esc if esc in ('"', "\\") else esc) + '"')
    if not alts:
        raise ValueError("a character class matches no character this server generates")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _cp(c: int) -> str:
    return f"\\u{c:04x}" if c <= 0xFFFF else f"\\U{c:08x}"


def _seq(items: list, max_repeat: int) -> str:
    parts = [_node(op, av, max_repeat) for op, av in items]
    return " ".join(parts) if parts else '""'


def _node(op: object, av: object, max_repeat: int) -> str:  # noqa: C901 - one branch per opcode
    if op is C.LITERAL:
        return _chars([(av, av)])  # type: ignore[list-item]
    if op is C.NOT_LITERAL:
        return _chars(_minus(_BMP, [(av, av)]))  # type: ignore[list-item]
    if op is C.ANY:
        return _chars(_minus(_BMP, _LINE_ENDS))
    if op is C.IN:
        return _chars(_class(av))  # type: ignore[arg-type]
    if op is C.BRANCH:
        return "(" + " | ".join(_seq(alt, max_repeat) for alt in av[1]) + ")"  # type: ignore[index]
    if op is C.SUBPATTERN:
        _group, add, delete, sub = av  # type: ignore[misc]
        if add or delete:
            raise ValueError("inline flags such as (?i) are not supported")
        return "(" + _seq(sub, max_repeat) + ")"
    if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
        lo, hi, sub = av  # type: ignore[misc]
        top = lo if hi is C.MAXREPEAT else hi
        if top > max_repeat:
            raise ValueError(f"a repetition count of {top} is above this server's limit of {max_repeat}")
        body = "(" + _seq(sub, max_repeat) + ")"
        if hi is C.MAXREPEAT:
            return body + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
        return body + ("?" if (lo, hi) == (0, 1) else f"{{{lo},{hi}}}")
    if op is C.AT:
        raise ValueError(f"the anchor {av} is only supported as a leading ^ or a trailing $")
    raise ValueError(f"{op} (backreferences, lookaround, ...) is not supported")


def _strip_anchors(items: list) -> list:
    """A leading ``^`` and a trailing ``$`` (of the pattern or of each top-level alternative) are implied."""
    if len(items) == 1 and items[0][0] is C.BRANCH:
        return [(C.BRANCH, (None, [_strip_anchors(alt) for alt in items[0][1][1]]))]
    if items and items[0] == (C.AT, C.AT_BEGINNING):
        items = items[1:]
    if items and items[-1] == (C.AT, C.AT_END):
        items = items[:-1]
    return items


def pattern_ebnf(pattern: str, max_repeat: int) -> str:
    """An EBNF expression for the inside of JSON strings whose decoded value fully matches ``pattern``."""
    if re.search(r"(?<!\\)\{,", pattern):
        raise ValueError("'{,n}' is a literal in ECMA-262 and a repetition in Python: write {0,n}")
    try:
        tree = sre_parse.parse(pattern)
    except re.error as e:
        raise ValueError(f"not a supported regular expression: {e}") from None
    if tree.state.flags & ~C.SRE_FLAG_UNICODE:
        raise ValueError("inline flags such as (?i) are not supported")
    return _seq(_strip_anchors(list(tree)), max_repeat)
