"""Chat prompts as token ids, with the text of the messages read as text.

A client's message may contain the text of a control token (``<|im_end|>\\n<|im_start|>system ...``). Read the
usual way, that text becomes the control tokens themselves and the client has forged a turn of another role. So
only the template's own markup may produce control tokens: before rendering, every occurrence of a control
token's text inside the request's strings (message contents, tool definitions, template variables; keys too) is
swapped for a private-use placeholder character that occurs nowhere in the request; the template renders as
usual (placeholders are not whitespace, so trimming and the template's tests behave as on the original text); the
rendered prompt is then cut at the control tokens left in it — all markup — and each piece between them is
tokenized as text with the placeholders turned back into the text they replaced. Cutting at control tokens and
tokenizing the pieces is what the tokenizer itself does with added tokens, so a request without control-token
text gets exactly the ids it always got (the tests check both).

Added tokens that are not special (``<think>``, ``<tool_call>``, ...) are left alone: templates parse them out
of the history (a reasoning split, a tool-response test), and they cannot start a turn.

``input_chars`` counts the characters of a request's strings, for a size check before any of this runs: a text
of N characters has at least N / (max_token_chars * NORMALIZATION_SLACK) tokens (NFC/NFKC merge at most four
code points into one), so a request over ``max_context`` times that many characters cannot fit.

``TurnMarker``: where the next turn of a chat will part from this prompt (the engine's reserved checkpoints).

Agents re-render history. In the Qwen chat format (``<|im_start|>role\\n ... <|im_end|>``) two rewrites are common:
- within one user query (tool loop), the previous assistant turn keeps its thinking but its tool call is
  re-rendered: the next prompt parts after this prompt's end (the end-of-prompt checkpoint covers it);
- after a new user message, every assistant turn since the previous user query loses its thinking: the next
  prompt parts right after the first of those turns' ``<|im_start|>assistant\\n``.
So besides the end of the prompt, a prompt gets a checkpoint at the start of the first assistant turn after the
last real user query (a ``user`` turn that is not a tool response); in the first turn after a query that is the
generation prompt. It is reserved with the sequence's latest turn, and later turns of the same tool loop keep it
reserved while they reuse it. Callers that know better pass explicit positions
(``Engine.submit(..., checkpoint_at=...)``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .chat_template import ChatTemplate

__all__ = [
    "encode_chat",
    "plain_data",
    "input_chars",
    "chars_over",
    "min_tokens",
    "NORMALIZATION_SLACK",
    "TurnMarker",
]

NORMALIZATION_SLACK = 4
_PUA_FIRST, _PUA_LAST = 0xF0000, 0xFFFFD  # Supplementary Private Use Area-A
_PUA = re.compile("[\U000f0000-\U000ffffd]")


def plain_data(value: Any) -> Any:
    """Rebuild ``value`` from JSON types only (transformers' ``_plain_template_data``); anything else becomes an
    inert ``"<TypeName>"`` placeholder so that no object with dangerous methods reaches the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if hasattr(value, "item") and type(value).__module__ == "numpy":  # numpy scalar
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, msgspec.Struct):  # wire names, UNSET fields omitted
        return plain_data(msgspec.to_builtins(value))
    if callable(getattr(value, "model_dump", None)):  # pydantic (e.g. OpenAI SDK messages)
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _strings(value: Any) -> Any:
    """Every string in a JSON-like value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def input_chars(*values: Any) -> int:
    """Characters in every string of ``values`` (messages, tools, template variables)."""
    return sum(len(s) for v in values for s in _strings(v))


def chars_over(limit: int, *values: Any) -> bool:
    """Whether the strings of ``values`` hold more than ``limit`` characters; counting stops once they do, so the
    answer for a huge request (a million messages) costs no more than for one just past the limit."""
    total = 0
    for v in values:
        for s in _strings(v):
            total += len(s)
            if total > limit:
                return True
    return False


def min_tokens(chars: int, tokenizer: Tokenizer) -> int:
    """The fewest tokens a text of ``chars`` characters can take."""
    return chars // (tokenizer.max_token_chars * NORMALIZATION_SLACK)


def _map(value: Any, fn: Any) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {_map(k, fn): _map(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map(v, fn) for v in value]
    return value


def _placeholders(count: int, values: Sequence[Any]) -> list[str]:
    """``count`` private-use characters that occur in no string of ``values``."""
    used = {ord(c) for v in values for s in _strings(v) for c in _PUA.findall(s)}
    base = _PUA_FIRST
    while any(base + i in used for i in range(count)):
        base += count
        if base + count > _PUA_LAST:
            raise ValueError("the request uses too much of the private-use area to mark control-token text")
    return [chr(base + i) for i in range(count)]


def encode_chat(
    template: ChatTemplate,
    messages: Sequence[Any],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> list[int]:
    """Token ids of the rendered chat, with control tokens only where the template's markup put them."""
    tok = template.tokenizer
    if tok is None:
        raise ValueError("encode_chat needs a ChatTemplate built with a tokenizer")
    control = tok.control_tokens
    if not control:
        return tok.encode(template.render(messages, tools, add_generation_prompt, **kwargs))
    texts = sorted(control, key=len, reverse=True)  # longest first: no token's text is cut by a shorter one
    any_control = re.compile("|".join(map(re.escape, texts)))
    inputs = plain_data([list(messages), list(tools) if tools is not None else None, kwargs])
    if not any(any_control.search(s) for s in _strings(inputs)):  # the usual case: the tokenizer as it is
        return tok.encode(template.render(messages, tools, add_generation_prompt, **kwargs))
    messages, tools, kwargs = inputs
    marks = dict(zip(texts, _placeholders(len(texts), inputs), strict=True))

    def mark(s: str) -> str:
        return any_control.sub(lambda m: marks[m.group(0)], s)

    text = template.render(
        _map(messages, mark),
        _map(tools, mark) if tools is not None else None,
        add_generation_prompt,
        **{k: _map(v, mark) for k, v in kwargs.items()},
    )
    return _encode_marked(tok, text, {p: t for t, p in marks.items()})


def _encode_marked(tok: Tokenizer, text: str, unmark: dict[str, str]) -> list[int]:
    """Cut ``text`` at its control tokens (honouring their lstrip/rstrip whitespace), tokenize the pieces as text
    with the placeholders of ``unmark`` restored, and put the control ids between them."""
    control = tok.control_tokens
    patterns = []
    for t in sorted(control, key=len, reverse=True):
        _, lstrip, rstrip = control[t]
        patterns.append(("\\s*" if lstrip else "") + re.escape(t) + ("\\s*" if rstrip else ""))
    cut = re.compile("|".join(f"({p})" for p in patterns))
    by_group = [control[t][0] for t in sorted(control, key=len, reverse=True)]
    restore = re.compile("|".join(map(re.escape, unmark))) if unmark else None
    ids: list[int] = []
    pos = 0
    for m in cut.finditer(text):
        ids += _piece(tok, text[pos : m.start()], restore, unmark)
        ids.append(by_group[m.lastindex - 1])  # type: ignore[operator]
        pos = m.end()
    ids += _piece(tok, text[pos:], restore, unmark)
    return ids


def _piece(tok: Tokenizer, piece: str, restore: re.Pattern[str] | None, unmark: dict[str, str]) -> list[int]:
    if not piece:
        return []
    if restore is not None:
        piece = restore.sub(lambda m: unmark[m.group(0)], piece)
    return tok.encode_text(piece)


# ---- turn marks ----------------------------------------------------------------------------------------------
class TurnMarker:
    def __init__(
        self, start: int, user: Sequence[int], assistant: Sequence[int], tool: Sequence[int]
    ) -> None:
        self.start = start  # the turn-start token id
        self.user, self.assistant, self.tool = list(user), list(assistant), list(tool)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TurnMarker | None:
        """The Qwen chat-format markers in ``tokenizer``'s ids; None when it has no ``<|im_start|>``."""
        token_to_id = getattr(tokenizer, "token_to_id", None)
        start = token_to_id("<|im_start|>") if token_to_id is not None else None
        if start is None:
            return None
        enc = tokenizer.encode
        return cls(
            start,
            enc("<|im_start|>user\n"),
            enc("<|im_start|>assistant\n"),
            enc("<|im_start|>user\n<tool_response>"),
        )

    def marks(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """Positions (0 < q < len(prompt)) where the next turn's prompt parts from this one: right after the
        ``<|im_start|>assistant\n`` of the turn described in the module docstring (before any other turn start)."""
        starts = np.flatnonzero(np.asarray(prompt, dtype=np.int64) == self.start).tolist()
        if not starts:
            return ()

        def at(i: int, seq: list[int]) -> bool:
            return list(prompt[i : i + len(seq)]) == seq

        query = next((i for i in reversed(starts) if at(i, self.user) and not at(i, self.tool)), None)
        first = None
        if query is not None:
            first = next((i for i in starts if i > query and at(i, self.assistant)), None)
        q = starts[-1] if first is None else first
        if at(q, self.assistant):  # the re-render keeps "<|im_start|>assistant\n" and parts right after it
            q += len(self.assistant)
        return (q,) if 0 < q < len(prompt) else ()
