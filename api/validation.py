"""The one validation rule set of the three protocols (chat completions, Anthropic messages, responses).

Each check takes the field's name in the calling protocol (``param``) and that protocol's error class, so the same
rule answers a 400 in the protocol's own shape naming the protocol's own field. The rules and their limits are
listed in docs/serving.md ("One validation rule set").

How deeply a request may nest is checked on what was decoded (cheap: only containers are visited). Real requests
stay far below the limit (a tool schema inside a chat request is ~15 levels); from about 200 levels on, the chat
template and Ray's pickling of the engine request fail with a RecursionError, and from about 1,000 the JSON
decoder itself does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec

from ninfer.gc_pause import gc_paused

from .errors import ApiError

__all__ = [
    "SAMPLING_RANGES",
    "MAX_STOPS",
    "EFFORTS",
    "THINKING_TYPES",
    "UNSUPPORTED_FIELDS",
    "MAX_MODEL_CHARS",
    "check_model",
    "check_sampling",
    "check_max_tokens",
    "check_stops",
    "check_one_of",
    "check_tool_choice",
    "check_unsupported",
    "MAX_JSON_DEPTH",
    "value_depth",
    "check_depth",
    "nesting_guard",
    "LARGE_BODY_BYTES",
    "prepare",
]

SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
MAX_STOPS = 16  # stop strings / stop_sequences per request
MAX_MODEL_CHARS = 256  # a longer `model` is refused: answers echo it, the log records it
EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})  # "none" turns thinking off
THINKING_TYPES = frozenset({"enabled", "disabled", "adaptive"})  # Anthropic thinking.type
# Fields a client sends because it relies on them, which this server does not implement: refused by name instead
# of being silently dropped (the value that asks for nothing, e.g. logprobs: false, is accepted).
UNSUPPORTED_FIELDS: dict[str, str] = {
    "logprobs": "token log-probabilities are not supported by this server",
    "top_logprobs": "token log-probabilities are not supported by this server",
    "guided_json": "vLLM guided decoding is not supported; use response_format json_schema",
    "guided_regex": "vLLM guided decoding is not supported; use a json_schema with a pattern",
    "guided_choice": "vLLM guided decoding is not supported; use a json_schema with an enum",
    "guided_grammar": "vLLM guided decoding is not supported; use response_format json_schema",
    "structured_outputs": "vLLM structured_outputs is not supported; use response_format json_schema",
}


def _bad(err: type[ApiError], message: str, param: str | None, code: str | None = None) -> ApiError:
    return err(400, message, param=param, code=code)


def check_model(model: str, error: type[ApiError]) -> None:
    """``model`` is a non-empty string of at most ``MAX_MODEL_CHARS`` characters (Anthropic echoes it in every
    answer; every protocol logs it), checked before it is compared with the served id."""
    if not model:
        raise _bad(error, "model: must be a non-empty string", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise _bad(error, f"model: at most {MAX_MODEL_CHARS} characters, got {len(model)}", "model")


def check_sampling(values: Mapping[str, Any], err: type[ApiError]) -> None:
    """Ranges of the sampling fields present (None = absent): SAMPLING_RANGES, ``top_k`` >= 0, ``seed`` an
    unsigned 64-bit integer."""
    for name, (lo, hi) in SAMPLING_RANGES.items():
        v = values.get(name)
        if v is not None and not (math.isfinite(v) and lo <= v <= hi):
            raise _bad(err, f"{name}: must be a finite number in [{lo:g}, {hi:g}], got {v!r}", name)
    top_k = values.get("top_k")
    if top_k is not None and top_k < 0:
        raise _bad(err, "top_k: must be >= 0", "top_k")
    seed = values.get("seed")
    if seed is not None and not 0 <= seed < 1 << 64:
        raise _bad(err, "seed: must be a non-negative 64-bit integer", "seed")


def check_max_tokens(value: int | None, param: str, max_context: int, err: type[ApiError]) -> None:
    """An output budget: > 0 and no more than the server's context (``context_length_exceeded``)."""
    if value is None:
        return
    if value <= 0:
        raise _bad(err, f"{param}: must be > 0", param)
    if value > max_context:
        raise _bad(
            err,
            f"{param}: {value} exceeds the server's context length of {max_context} tokens",
            param,
            "context_length_exceeded",
        )


def check_stops(stops: Sequence[str] | None, param: str, err: type[ApiError]) -> None:
    if stops is not None and len(stops) > MAX_STOPS:
        raise _bad(err, f"{param}: at most {MAX_STOPS} stop strings, got {len(stops)}", param)


def check_one_of(value: Any, allowed: frozenset[str], param: str, err: type[ApiError]) -> None:
    """``value`` absent or one of ``allowed``; any other JSON value (an array or object too) is a 400."""
    if value is not None and (not isinstance(value, str) or value not in allowed):
        raise _bad(err, f"{param}: must be one of {sorted(allowed)}, got {value!r}", param)


def check_tool_choice(choice: Any, none: Any, has_tools: bool, param: str, err: type[ApiError]) -> None:
    """A ``choice`` other than absent or ``none`` (the protocol's value for none) needs tools (upstream's rule,
    for every protocol)."""
    if choice is not None and choice != none and not has_tools:
        raise _bad(err, f"{param}: requires tools", param)


def check_unsupported(fields: Mapping[str, Any], err: type[ApiError]) -> None:
    """Refuse, by name, an UNSUPPORTED_FIELDS field that asks for something (not null, false or 0)."""
    for name, why in UNSUPPORTED_FIELDS.items():
        v = fields.get(name)
        if v is not None and v is not False and v != 0:
            raise _bad(err, f"{name}: {why}", name, "unsupported_field")


# ---- nesting depth ---------------------------------------------------------------------------------------
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


T = TypeVar("T")
# A body past this is decoded, checked and translated on a worker thread: JSON of a million small messages (30 MB,
# well under --max-request-mib) takes seconds of Python to decode, measure and translate, which on the event loop
# would stall every other client of the process (/health, every stream) for as long. The garbage collector is
# paused meanwhile (ninfer/gc_pause.py): a million messages whose content is a list of parts ran ~8,500
# collections (3.1 s, the longest 0.47 s, each holding the GIL the loop needs); paused, one walk of what survives
# the pause (0.23 s). perf/bench_stall.py --via http --shape parts: a running stream stalled 2.5 s, now 1.4-1.5 s;
# /health 2.5 s, now 0.65 s (the rest: one msgspec call decoding the whole body, the checks' Python).
LARGE_BODY_BYTES = 1 << 20


async def prepare(body: bytes, work: Callable[[], T], err: type[ApiError], one_at_a_time: asyncio.Lock) -> T:
    """``work()`` — decode, check and translate ``body`` — under ``nesting_guard``; off the event loop, with the
    garbage collector paused, when the body is larger than LARGE_BODY_BYTES (the thread takes the GIL in turns with
    the loop, which keeps answering).

    Large bodies take ``one_at_a_time`` (the Service's) in arrival order: their work is Python holding the GIL in
    5 ms turns, so two at once take as long as one after the other and each extra thread lengthens the loop's wait
    for every turn (perf/bench_stall.py --concurrent 3, a million messages each: /health 0.54 s and the stream 0.47
    s at worst at once, 0.17 / 0.22 s for one), and holds another decoded body in memory. A request whose client
    leaves while its thread runs keeps the lock until the thread ends."""

    def guarded() -> T:
        with nesting_guard(err):
            return work()

    def paused() -> T:
        with gc_paused():
            return guarded()

    if len(body) <= LARGE_BODY_BYTES:
        return guarded()
    async with one_at_a_time:
        thread = asyncio.ensure_future(asyncio.to_thread(paused))
        try:
            return await asyncio.shield(thread)
        except asyncio.CancelledError:
            await asyncio.wait([thread])  # the lock is the thread's until it ends; then the cancel goes on
            raise
