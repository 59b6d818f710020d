"""Messages that cross the Ray boundary between the engine actor and its callers (the API, Python jobs).

Requests are frozen keyword-only Structs. A generation streams the engine's own events (ninfer.engine.core), as
the engine made them: ``Accepted`` once (or ``Failed`` instead: a refusal before the engine ran anything, e.g. a
full queue or a bad prompt), then ``TokenDelta`` events — each one every token the engine produced since the
previous item (coalesced once, by ``Handle.poll``) — then exactly one ``Finish`` (its ``text`` is the held-back
tail; a ``Finish`` whose reason is ``error`` is the engine failing the request: ``engine_failure``).

On the wire every item is msgpack: ``EngineActor.generate`` (one request) streams lists of events
(``decode_events``); ``EngineActor.open`` takes a list of requests (``encode_requests``: the API's requests of one
event-loop turn, one Ray call) and returns, for each, ``[Accepted]`` or ``[Failed]`` (``decode_opened``);
``EngineActor.subscribe`` (every request one caller opened) streams lists of ``(request_id, events)``
(``decode_batch``). Ray's per-item cost (~1 ms of CPU on a 2-core machine, on each side) is paid at most once per
stream interval, never per token, and on ``subscribe`` once for all of a caller's streams; a request crosses as
msgpack bytes (~2 µs to encode) rather than as a pickled Struct (~120 µs in Ray's serializer on each side).
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from ninfer.engine.config import EngineConfig
from ninfer.engine.core import Accepted, Finish, SamplingParams, TokenDelta
from ninfer.frontend.prompt import chars_over

__all__ = [
    "SamplingOptions",
    "GrammarSpec",
    "GenerateRequest",
    "Accepted",
    "TokenDelta",
    "Finish",
    "Failed",
    "StreamEvent",
    "decode_events",
    "decode_batch",
    "encode_requests",
    "decode_requests",
    "bulky",
    "release",
    "WIRE_CHUNK",
    "decode_opened",
    "INLINE_PROMPT_CHARS",
    "renders_quickly",
    "opens_quickly",
    "engine_failure",
    "ActorStats",
    "ActorInfo",
    "Health",
    "ActorSpec",
]


# Per-request sampling: every ``SamplingParams`` field (the engine's, written once) as optional, ``None`` meaning the
# artifact's generation default, then the engine's. ``stop_after_token_id`` is the actor's to set (thinking).
SamplingOptions = msgspec.defstruct(
    "SamplingOptions",
    [
        (f.name, f.type | None, None)
        for f in msgspec.structs.fields(SamplingParams)
        if f.name != "stop_after_token_id"
    ],
    frozen=True,
    kw_only=True,
    module=__name__,
)


class GrammarSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What constrains the answer (after ``</think>``), compiled by the actor with XGrammar:
    ``json_object`` (any JSON object), ``json_schema`` (``schema``: the schema as JSON text) or
    ``tool_calls`` (one or more Qwen XML calls of ``tools``; ``tool_choice`` "required" or a tool name)."""

    kind: str
    schema: str = ""
    tool_choice: str = "required"
    parallel: bool = False  # tool_calls: allow more than one call


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Exactly one of ``prompt_ids`` and ``messages``. ``messages`` are OpenAI-style chat messages rendered by
    the artifact's chat template on the actor (so a Python job needs neither the tokenizer nor the artifact).

    The one engine request contract of every protocol (chat, Anthropic messages, responses): ``tools`` (OpenAI
    function-tool form) are rendered into the prompt; ``grammar`` constrains the answer; ``thinking_budget``
    forces ``</think>`` after that many reasoning tokens. Whether thinking is on is ``template_kwargs``'s
    ``enable_thinking`` (default on)."""

    request_id: str
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    template_kwargs: dict[str, Any] = {}
    sampling: SamplingOptions = SamplingOptions()
    client: str = ""
    tools: tuple[dict[str, Any], ...] | None = None
    grammar: GrammarSpec | None = None
    thinking_budget: int | None = None

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.messages is None):
            raise ValueError("GenerateRequest: give exactly one of prompt_ids and messages")


class Failed(msgspec.Struct, frozen=True, kw_only=True, array_like=True, tag="failed"):
    """A refusal or failure; ``status`` is the HTTP status the API should answer with (429 queue full, 400 bad
    prompt, 500 engine)."""

    code: str
    message: str
    status: int = 500
    param: str | None = None
    retry_after: float | None = None


StreamEvent = Accepted | TokenDelta | Finish | Failed
_EVENTS_DECODER = msgspec.msgpack.Decoder(list[StreamEvent])
_BATCH_DECODER = msgspec.msgpack.Decoder(list[tuple[str, list[StreamEvent]]])
_OPENED_DECODER = msgspec.msgpack.Decoder(list[list[StreamEvent]])
# A request holding more than WIRE_CHUNK messages, tools or prompt ids crosses as ``[head, messages, tools, ids]``:
# the request with those sequences emptied, then each sequence (or None) as msgpack chunks of WIRE_CHUNK items.
# Decoding it is then a Python loop of short C calls (4096 empty messages: ~1.5 ms each), between which the
# process's other threads take the GIL; one call for the whole request held it throughout (a million empty
# messages: 0.33 s, with no token streamed and no /health answered by the actor meanwhile). Smaller requests
# cross as they are.
WIRE_CHUNK = 4096
_Chunks = list[bytes] | None  # msgpack bin: the outer decode slices them out without parsing them
_REQUESTS_DECODER = msgspec.msgpack.Decoder(
    list[GenerateRequest | tuple[GenerateRequest, _Chunks, _Chunks, _Chunks]]
)
_DICTS_DECODER = msgspec.msgpack.Decoder(list[dict[str, Any]])
_IDS_DECODER = msgspec.msgpack.Decoder(list[int])
_ENCODE = msgspec.msgpack.Encoder().encode


def engine_failure(fin: Finish) -> Failed | None:
    """The ``Failed`` a ``Finish`` stands for when the engine failed the request (reason ``error``), else None."""
    if fin.reason != "error":
        return None
    return Failed(code="engine_error", message=fin.error or "the engine failed this request", status=500)


def decode_events(raw: bytes) -> list[StreamEvent]:
    """One item of ``EngineActor.generate`` (msgpack bytes): the events it carries, in order."""
    return _EVENTS_DECODER.decode(raw)


def decode_batch(raw: bytes) -> list[tuple[str, list[StreamEvent]]]:
    """One item of ``EngineActor.subscribe``: ``(request_id, events)`` for each request with new events."""
    return _BATCH_DECODER.decode(raw)


# a prompt this small renders and tokenizes on the actor's event loop (well under a millisecond)
INLINE_PROMPT_CHARS = 16384


def renders_quickly(req: GenerateRequest) -> bool:
    """Whether the request's prompt is small enough to render and tokenize on the actor's event loop: no thread hop
    (two GIL hand-overs and a wake-up) for the usual request; a long prompt (seconds to tokenize) goes to a thread."""
    if req.prompt_ids is not None:
        return True  # no rendering: the ids are checked and copied
    return req.tools is None and not chars_over(INLINE_PROMPT_CHARS, req.messages, req.template_kwargs)


def opens_quickly(req: GenerateRequest) -> bool:
    """Whether the actor admits ``req`` without leaving its event loop: a prompt that renders quickly and no grammar
    or thinking budget to compile. Only such requests share an ``open`` call (the call's answer waits for all of
    its requests); any other goes alone."""
    return req.grammar is None and req.thinking_budget is None and renders_quickly(req)


def encode_requests(reqs: list[GenerateRequest]) -> bytes | list[GenerateRequest]:
    """The argument of ``EngineActor.open`` (and of ``generate``, ``count_tokens``, ``prompt_blocks`` with one
    request): msgpack bytes, a bulky request's sequences in chunks (WIRE_CHUNK), or the list itself where a value
    does not fit msgpack (an integer beyond 64 bits in a JSON value: Ray pickles it then)."""
    try:
        return _ENCODE([_wire(r) if bulky(r) else r for r in reqs])
    except (OverflowError, TypeError):
        return list(reqs)


def bulky(req: GenerateRequest) -> bool:
    """Whether ``req`` holds more than WIRE_CHUNK messages, tools or prompt ids (O(1))."""
    return max(len(req.messages or ()), len(req.tools or ()), len(req.prompt_ids or ())) > WIRE_CHUNK


def _chunks(seq: tuple[Any, ...] | None) -> list[bytes] | None:
    if seq is None:
        return None
    return [_ENCODE(seq[i : i + WIRE_CHUNK]) for i in range(0, len(seq), WIRE_CHUNK)]


def _wire(req: GenerateRequest) -> tuple[GenerateRequest, Any, Any, Any]:
    head = msgspec.structs.replace(
        req,
        messages=None if req.messages is None else (),
        tools=None,
        prompt_ids=None if req.prompt_ids is None else (),
    )
    return head, _chunks(req.messages), _chunks(req.tools), _chunks(req.prompt_ids)


def _joined(chunks: list[bytes], decoder: Any, keep: list[list[Any]] | None) -> tuple[Any, ...]:
    parts = [
        decoder.decode(c) for c in chunks
    ]  # one short C call per chunk: the GIL changes hands between them
    if keep is not None:
        keep += parts
    return tuple(itertools.chain.from_iterable(parts))


def _unwire(w: Any, keep: list[list[Any]] | None) -> GenerateRequest:
    if isinstance(w, GenerateRequest):
        return w
    head, messages, tools, ids = w
    return msgspec.structs.replace(
        head,
        messages=head.messages if messages is None else _joined(messages, _DICTS_DECODER, keep),
        tools=head.tools if tools is None else _joined(tools, _DICTS_DECODER, keep),
        prompt_ids=head.prompt_ids if ids is None else _joined(ids, _IDS_DECODER, keep),
    )


def decode_requests(
    raw: bytes | list[GenerateRequest], keep: list[list[Any]] | None = None
) -> list[GenerateRequest]:
    """``encode_requests``'s inverse (typed and checked: ``msgspec.ValidationError`` on a malformed list). A bulky
    request takes time in proportion to its size, in short steps (WIRE_CHUNK): call it off the event loop. With
    ``keep``, a bulky request's chunks are added to it: once the requests are dropped, ``release(keep)`` frees
    their items in short steps too (a million messages freed at once hold the GIL ~50 ms)."""
    if not isinstance(raw, bytes):
        return list(raw)
    return [_unwire(w, keep) for w in _REQUESTS_DECODER.decode(raw)]


def release(keep: list[list[Any]]) -> None:
    """Free ``decode_requests``'s kept chunks one at a time (call it once the requests themselves are gone)."""
    while keep:
        keep.pop().clear()


def decode_opened(raw: bytes) -> list[list[StreamEvent]]:
    """``EngineActor.open``'s answer: for each request, in order, ``[Accepted]`` or ``[Failed]``."""
    return _OPENED_DECODER.decode(raw)


class ActorStats(msgspec.Struct, frozen=True, kw_only=True):
    lanes_total: int
    lanes_busy: int
    queue_len: int
    queue_depth: int
    open_streams: int
    engine_failures: int
    uptime_s: float
    internal_errors: int = 0  # requests the actor itself failed (500 internal_error), logged in its process
    cancelled_before_start: int = 0  # requests whose cancel came before them: ended at once, never in a lane
    engine: dict[str, float] = {}  # the engine's own counters and gauges, flattened to numbers


class ActorInfo(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    artifact: str
    backend: str
    max_context: int
    max_concurrency: int
    queue_depth: int
    prefix_reuse: bool
    engine_config: dict[str, Any] = {}  # the EngineConfig, as a dict (logs, the server-start record)
    # the device-memory plan in bytes by part; empty on the reference backend
    memory_plan: dict[str, int] = {}


class Health(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    detail: str = ""
    replicas: dict[str, str] = {}  # behind a router: each replica's status ("ok", "unavailable") by name


class ActorSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the actor is started with: the artifact, the backend and the engine's keyword options."""

    artifact: str
    backend: str  # "reference" | "cuda"
    model_id: str | None = None  # None: the artifact's model identity
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)  # the engine's settings, typed
    backend_options: dict[str, Any] = {}  # backend options (CUDA: cuda_graph, ...), see ninfer.load
    template_defaults: dict[str, Any] = {}  # chat-template kwargs every request starts from
    stream_interval_s: float = 0.05  # least time between two streamed items of one request (0: per wake-up)
    gpu_share: float = 1.0  # CUDA: the fraction of one GPU asked of Ray (--gpu-share, ServerConfig checks it)
    blas_threads: int = 0  # BLAS/OpenMP threads for the reference backend (0: the node's CPU count)
    # load an artifact whose shape is not a registered one (tiny test models: --allow-unregistered-shape)
    allow_unregistered_shape: bool = False
    # the actor process's GIL switch interval (sys.setswitchinterval; Python's default 5 ms): how long one of its
    # other threads (Ray's, the event loop's) waits for the GIL while the engine's step loop holds it; 0: left as is
    gil_switch_s: float = 0.0002
