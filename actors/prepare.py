"""A request made ready for the engine, and where that work runs: the actor's event loops never run Python whose
cost grows with a request's size, and no step of it holds the GIL for long.

``ready_one`` renders a request's prompt, tokenizes it, checks it against the context and compiles its grammar;
what it gives (``Ready``) holds only what ``submit`` needs — the ids, the sampling options, the grammar hook —
never the messages or tools. Small requests are decoded and made ready on the loop (well under a millisecond: no
thread hop), as before. An argument of more than ``LARGE_REQUEST_BYTES`` of msgpack is decoded, made ready and
dropped entirely on the actor's prompt pool (``ready_all``, ``apply_one``): its objects are built, walked and
freed there, in short steps (the chunked wire form and ``release`` of actors/messages.py), with the garbage
collector paused (ninfer/gc_pause.py).

Why each part, measured (``python -m ninfer.perf.bench_stall``, 2-core CPU host, a million empty chat messages):
Ray unpickled the request, sent as a Struct, on the loop in 0.29 s; decoding its 20 MB of msgpack in one call
held the GIL 0.33 s (on a worker thread too: no other thread of the actor ran meanwhile, the control methods' loop
answering /health included); freeing it at once held it ~0.05 s; counting its characters took 2.2 s of Python
(now stopped at the context's bound). Two million messages whose content is a list of parts added ten full
collections of the garbage collector, the last 0.55 s: a running stream stalled 10-11 s.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from ninfer.gc_pause import gc_paused

from . import _engine_adapter as adapter
from .messages import Failed, GenerateRequest, SamplingOptions, decode_requests, release

__all__ = [
    "LARGE_REQUEST_BYTES",
    "Ready",
    "Outcome",
    "is_large",
    "needs_mask",
    "ready",
    "ready_one",
    "ready_all",
    "apply_one",
    "prompt_failed",
]

# Arguments of more msgpack than this are decoded and made ready off the event loop. A usual chat request is a
# few KiB; a 16k-character prompt (the inline bound, messages.INLINE_PROMPT_CHARS) ~20 KiB; decoding 1 MiB of
# small messages in one call takes ~15 ms.
LARGE_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Ready:
    """What the engine is given for one request (its prompt already rendered and checked)."""

    request_id: str
    sampling: SamplingOptions
    ids: list[int]
    mask: Any  # RequestGrammar | None
    thinking: bool


# a request made ready, refused (its Failed), or the exception that preparing it raised (a bug: the actor logs it)
Outcome = Ready | Failed | Exception
T = TypeVar("T")


def is_large(raw: object) -> bool:
    """Whether ``raw`` (an actor method's request argument) is too large to decode on the event loop."""
    return isinstance(raw, bytes) and len(raw) > LARGE_REQUEST_BYTES


def prompt_failed(e: adapter.PromptError) -> Failed:
    return Failed(code=e.code or "invalid_prompt", message=str(e), status=400, param=e.param)


def ready(ld: adapter.Loaded, req: GenerateRequest, ids: list[int], mask: Any) -> Ready:
    return Ready(req.request_id, req.sampling, ids, mask, adapter.thinking_on(ld, req))


def needs_mask(req: GenerateRequest) -> bool:
    return req.grammar is not None or req.thinking_budget is not None


def ready_one(ld: adapter.Loaded, req: GenerateRequest) -> Outcome:
    """``req`` rendered, checked and its grammar compiled, on the calling thread (O(prompt))."""
    try:
        ids = adapter.prompt_ids(ld, req)
        mask = adapter.token_mask(ld, req) if needs_mask(req) else None
    except adapter.PromptError as e:
        return prompt_failed(e)
    except Exception as e:  # a bug: logged and counted by the actor (one request's, never the batch's)
        return e
    return ready(ld, req, ids, mask)


def ready_all(ld: adapter.Loaded, raw: bytes) -> list[tuple[str, Outcome]] | Failed:
    """Decode ``raw`` (``messages.encode_requests``) and make each request ready: ``(request_id, outcome)`` in
    order, or one ``Failed`` for an argument that does not decode. Slow for a large request, by design: call it on
    a worker thread. The decoded requests are built, walked and freed on that thread, in short steps, with the
    garbage collector paused (``gc_paused``)."""
    keep: list[list[Any]] = []
    with gc_paused():
        try:
            reqs = decode_requests(raw, keep)
        except (msgspec.DecodeError, TypeError, ValueError) as e:  # the caller's bug: one refusal
            release(keep)
            return Failed(code="invalid_request", message=f"open: {e}", status=400)
        out = [(req.request_id, ready_one(ld, req)) for req in reqs]
        del reqs  # the last reference to each request: its sequences' items stay in keep until released
        release(keep)
    return out


def apply_one(
    raw: bytes | GenerateRequest, fn: Callable[[GenerateRequest], T]
) -> tuple[str, T | Failed | Exception]:
    """``fn`` of the one request of ``raw`` (``encode_requests([req])``, or ``req`` itself), decoded on the calling
    thread: ``(request_id, result)``, the result a ``Failed`` for a bad argument or prompt, or the exception
    ``fn`` raised (a bug). Call it on a worker thread: the request is built, used and freed there (a large one
    as ``ready_all`` does)."""
    if isinstance(raw, GenerateRequest):
        return _apply(raw, fn)
    keep: list[list[Any]] = []
    with gc_paused() if is_large(raw) else nullcontext():
        try:
            req = decode_one(raw, keep)
        except (msgspec.DecodeError, TypeError, ValueError) as e:
            release(keep)
            return "", Failed(code="invalid_request", message=f"request: {e}", status=400)
        out = _apply(req, fn)
        del req
        release(keep)
    return out


def _apply(req: GenerateRequest, fn: Callable[[GenerateRequest], T]) -> tuple[str, T | Failed | Exception]:
    try:
        return req.request_id, fn(req)
    except adapter.PromptError as e:
        return req.request_id, prompt_failed(e)
    except Exception as e:
        return req.request_id, e


def decode_one(raw: bytes | list[GenerateRequest], keep: list[list[Any]] | None = None) -> GenerateRequest:
    """The one request of ``encode_requests([req])`` (``keep``: as for ``messages.decode_requests``)."""
    reqs = decode_requests(raw, keep)
    if len(reqs) != 1:
        raise TypeError(f"expected one request, got {len(reqs)}")
    return reqs[0]
