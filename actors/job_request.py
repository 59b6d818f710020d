"""A Python job's request, checked before it is sent: the blocking clients' arguments (``EngineClient.generate``,
``stream``, ``chat``, ``stream_chat``) as a ``GenerateRequest``, or a ``ValueError`` naming the argument.

The types and shapes are checked here (a wrong one would otherwise fail inside the actor as an internal error, or
worse be taken: a string of digits as prompt ids, a string as a list of stop strings), and the sampling ranges by
the engine's own rules (``SamplingParams.check``), so a bad value costs no Ray call. What needs the model (the
vocabulary, the context, the chat template) is the actor's to refuse (``GenerationError``).
"""

from __future__ import annotations

import numbers
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ninfer.engine.core import SamplingParams

from .messages import GenerateRequest, SamplingOptions

__all__ = ["job_request", "check_request_id", "MAX_REQUEST_ID_CHARS", "SAMPLING_FIELDS"]

MAX_REQUEST_ID_CHARS = 256
SAMPLING_FIELDS = tuple(f.name for f in msgspec.structs.fields(SamplingOptions))


def job_request(
    *,
    prompt_ids: Sequence[int] | None,
    messages: Sequence[Mapping[str, Any]] | None,
    template: Mapping[str, Any] | None,
    request_id: str | None = None,
    **sampling: Any,
) -> GenerateRequest:
    """The request a Python job sends; ``request_id``: the caller's (to ``cancel`` it by), else a new one."""
    return GenerateRequest(
        request_id=f"job-{uuid.uuid4().hex[:16]}" if request_id is None else check_request_id(request_id),
        prompt_ids=None if prompt_ids is None else _prompt_ids(prompt_ids),
        messages=None if messages is None else _messages(messages),
        template_kwargs=_template(template),
        sampling=_sampling(sampling),
        client="python-job",
    )


def check_request_id(request_id: Any) -> str:
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id: must be a non-empty string, got {request_id!r}")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise ValueError(f"request_id: at most {MAX_REQUEST_ID_CHARS} characters, got {len(request_id)}")
    return request_id


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _prompt_ids(ids: Any) -> tuple[int, ...]:
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise ValueError(f"prompt_ids: must be a sequence of token ids, got {type(ids).__name__}")
    out = tuple(ids)
    if not out:
        raise ValueError("prompt_ids: must be non-empty")
    bad = next((i for i, t in enumerate(out) if not _is_int(t) or t < 0), None)
    if bad is not None:
        raise ValueError(f"prompt_ids[{bad}]: must be a non-negative integer token id, got {out[bad]!r}")
    return tuple(int(t) for t in out)


def _messages(messages: Any) -> tuple[dict[str, Any], ...]:
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise ValueError(
            f'messages: must be a list of chat messages ({{"role": ..., "content": ...}}), got {type(messages).__name__}'
        )
    if not messages:
        raise ValueError("messages: must be non-empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}]: must be a dict, got {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}].role: must be a string")
    return tuple(dict(m) for m in messages)


def _template(template: Any) -> dict[str, Any]:
    if template is None:
        return {}
    if not isinstance(template, Mapping) or not all(isinstance(k, str) for k in template):
        raise ValueError(f"template_kwargs: must be a dict with string keys, got {template!r}")
    return dict(template)


def _sampling(given: dict[str, Any]) -> Any:
    unknown = sorted(set(given) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a sampling setting (one of {', '.join(SAMPLING_FIELDS)})")
    values = {k: _plain(k, v) for k, v in given.items() if v is not None}
    try:
        opts = msgspec.convert(values, SamplingOptions)
    except msgspec.ValidationError as e:  # "Expected `int | null`, got `str` - at `$.max_tokens`"
        raise ValueError(f"sampling: {e}") from None
    SamplingParams(**{k: v for k, v in msgspec.structs.asdict(opts).items() if v is not None}).check()
    return opts


def _plain(name: str, v: Any) -> Any:
    """A value as msgspec converts it: NumPy scalars as Python numbers, one stop string as a list of one."""
    if name == "stop" and isinstance(v, str):
        return [v]
    if isinstance(v, numbers.Number) and hasattr(v, "item") and not isinstance(v, bool):
        return v.item()
    return v
