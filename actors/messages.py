"""Messages that cross the Ray boundary between the engine actor and its callers (the API, Python jobs).

Requests are frozen keyword-only Structs. A generation streams a tagged union of events:
``Accepted`` once (or ``Failed`` instead, e.g. a full queue), then ``Delta`` items — each one coalesces every
token the engine produced since the previous item, so Ray's per-item cost (~0.6 ms on a 2-core machine) is paid
per engine step at most, never per token — then exactly one ``Finished`` or ``Failed``.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "SamplingOptions",
    "GrammarSpec",
    "GenerateRequest",
    "Accepted",
    "Delta",
    "Finished",
    "Failed",
    "StreamEvent",
    "decode_event",
    "Timings",
    "ActorStats",
    "ActorInfo",
    "Health",
    "ActorSpec",
]


class SamplingOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request sampling; ``None`` means the engine's / artifact's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens (benchmarks, load tests)


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


class Accepted(msgspec.Struct, frozen=True, kw_only=True, tag="accepted"):
    request_id: str
    prompt_tokens: int
    max_tokens: int
    queued: bool  # False when a lane was free at submit time


class Delta(msgspec.Struct, frozen=True, gc=False, tag="delta"):
    token_ids: list[int]
    text: str


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    total_s: float = 0.0


class Finished(msgspec.Struct, frozen=True, kw_only=True, tag="finished"):
    finish_reason: str  # the engine's internal reason (stop_token, stop_string, output_limit, ...)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: Timings = Timings()
    lane: int | None = None
    stop_string: str | None = None  # the request stop string that ended the text (finish_reason stop_string)
    reasoning_tokens: int = 0  # generated tokens up to and including </think> (thinking requests)


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """``status`` is the HTTP status the API should answer with (429 queue full, 400 bad prompt, 500 engine)."""

    code: str
    message: str
    status: int = 500
    param: str | None = None
    retry_after: float | None = None


StreamEvent = Accepted | Delta | Finished | Failed
_EVENT_DECODER = msgspec.msgpack.Decoder(StreamEvent)


def decode_event(raw: bytes) -> StreamEvent:
    """One item of ``EngineActor.generate`` (msgpack bytes) as its event Struct."""
    return _EVENT_DECODER.decode(raw)


class ActorStats(msgspec.Struct, frozen=True, kw_only=True):
    lanes_total: int
    lanes_busy: int
    queue_len: int
    queue_depth: int
    open_streams: int
    engine_failures: int
    uptime_s: float
    internal_errors: int = 0  # requests the actor itself failed (500 internal_error), logged in its process
    engine: dict[str, float] = {}  # the engine's own counters and gauges, flattened to numbers


class ActorInfo(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    artifact: str
    backend: str
    max_context: int
    max_concurrency: int
    queue_depth: int
    prefix_reuse: bool
    engine_config: dict[str, Any] = {}
    # the device-memory plan in bytes by part; empty on the reference backend
    memory_plan: dict[str, int] = {}


class Health(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    detail: str = ""


class ActorSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the actor is started with: the artifact, the backend and the engine's keyword options."""

    artifact: str
    backend: str  # "reference" | "cuda"
    model_id: str | None = None  # None: the artifact's model identity
    engine: dict[str, Any] = {}  # keyword arguments of ninfer.engine.Engine.open
    backend_options: dict[str, Any] = {}  # backend options (CUDA: cuda_graph, ...), see ninfer.load
    template_defaults: dict[str, Any] = {}  # chat-template kwargs every request starts from
    stream_interval_s: float = 0.05  # least time between two streamed items of one request (0: per wake-up)
    blas_threads: int = 0  # BLAS/OpenMP threads for the reference backend (0: the node's CPU count)
    # load an artifact whose shape is not a registered one (tiny test models: --allow-unregistered-shape)
    allow_unregistered_shape: bool = False
