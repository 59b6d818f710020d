"""Chat template rendering with jinja2, byte-identical to transformers' ``apply_chat_template``.

The environment mirrors ``transformers.utils.chat_template_utils._cached_compile_jinja_template`` (5.x):
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the loopcontrols extension, a
``{% generation %}`` tag (rendered as its body), the ``tojson`` filter with ``json.dumps`` semantics
(``ensure_ascii=False``), and the globals ``raise_exception``, ``strftime_now``, ``dict`` and an underscore-safe
``namespace``. Inputs are prepared as transformers does: keys whose value is None are dropped, everything is
rebuilt from plain JSON types, reasoning is aliased to ``reasoning_content`` / ``thinking``, and the tokenizer's
special tokens (``bos_token``, ``eos_token``, ...) are template variables that explicit kwargs override.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .prompt import encode_chat, plain_data
from .tokenizer import Tokenizer

__all__ = [
    "ChatTemplate",
    "TemplateError",
    "RESERVED_VARIABLES",
    "check_variables",
    "parse_tool_call_arguments",
]

# Template variables render() takes as its own arguments: a caller's extra variables may not reuse them.
RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
# Names a message's reasoning may come under; the first is the one chat templates read (transformers' order).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class TemplateError(ValueError):
    """A chat template that does not compile, or messages the template rejects, with the problem named."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """``dict(...)`` inside templates, without exposing the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore attributes (no way to reach CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as jinja2's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
):
    # Unlike jinja2's own tojson this does not HTML-escape and does not mark the result safe (transformers).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TemplateError(f"messages must be a list of message objects, got {type(messages).__name__}")
    if len(messages) == 0:
        raise TemplateError("messages is empty: a conversation needs at least one message")


def _prepare_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    _check_messages(messages)
    prepared = []
    for i, message in enumerate(plain_data(list(messages))):
        if not isinstance(message, dict):
            raise TemplateError(f"messages[{i}] must be an object with a 'role', got {message!r}")
        # Drop None values: APIs send content=None / tool_calls=None, which templates handle only as missing keys.
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def check_variables(variables: Mapping[str, Any]) -> None:
    """Refuse extra template variables that would collide with ``render``'s own arguments."""
    clash = sorted(RESERVED_VARIABLES.intersection(variables))
    if clash:
        raise TemplateError(f"template variable {clash[0]!r} is set by the renderer and cannot be passed")


def parse_tool_call_arguments(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copy of ``messages`` whose assistant tool calls carry ``arguments`` as objects, not JSON strings.

    OpenAI clients send ``function.arguments`` as a JSON string; Qwen templates iterate the arguments as a
    mapping. Call this before ``render`` for wire-format messages (transformers leaves this to the caller).
    """
    out = []
    for i, message in enumerate(messages):
        message = dict(message)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_parse_call(i, j, c) for j, c in enumerate(calls)]
        out.append(message)
    return out


def _parse_call(i: int, j: int, call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    call = dict(call)
    holder = dict(call["function"]) if isinstance(call.get("function"), Mapping) else call
    args = holder.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise TemplateError(f"messages[{i}].tool_calls[{j}] arguments are not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise TemplateError(
                f"messages[{i}].tool_calls[{j}] arguments must be a JSON object, got {args!r}"
            )
        holder["arguments"] = parsed
    if holder is not call:
        call["function"] = holder
    return call


class ChatTemplate:
    """One compiled chat template bound to a tokenizer (whose special tokens the template can reference)."""

    def __init__(self, source: str, tokenizer: Tokenizer | None = None) -> None:
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template is empty")
        self.source = source
        self.tokenizer = tokenizer
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from None

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (what ``apply_chat_template(..., tokenize=False)`` returns).

        ``kwargs`` become template variables (``enable_thinking=False``, ``preserve_thinking=True``, ...).
        """
        chat = _prepare_messages(messages)
        if tools is not None:
            for j, tool in enumerate(tools):
                if not isinstance(tool, Mapping):
                    raise TemplateError(f"tools[{j}] must be a JSON-schema object, got {type(tool).__name__}")
        special = self.tokenizer.special_tokens_map if self.tokenizer is not None else {}
        variables = plain_data({**special, **kwargs})
        try:
            return self._template.render(
                messages=chat,
                tools=plain_data(list(tools)) if tools is not None else None,
                documents=plain_data(list(documents)) if documents is not None else None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.TemplateError as e:  # raise_exception(...), undefined names, sandbox violations
            raise TemplateError(f"chat template rejected the messages: {e.message or e}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            raise TemplateError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None

    def render_ids(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of ``render(...)`` (encoded without added BOS/EOS, as transformers does), except that text in
        the messages, tools and variables that spells a control token (``<|im_end|>``) is tokenized as text: only
        the template's own markup yields control tokens (``ninfer.frontend.prompt``)."""
        if self.tokenizer is None:
            raise TemplateError("render_ids() needs a ChatTemplate built with a tokenizer")
        check_variables(kwargs)
        _check_messages(messages)
        return encode_chat(self, messages, tools, add_generation_prompt, **kwargs)
