"""Shared vocabulary of the engine: requests, sampling parameters, events, usage, errors, the step plan and the
typed runner contract (the ``ModelRunner`` Protocol beside the batch types).

Every other engine module depends on this one; it depends on nothing in the engine. Messages that cross the Ray
or HTTP boundary (events, usage, metrics, stats, sampling parameters) are msgspec Structs; the request's events
(``Accepted``, ``TokenDelta``, ``Finish``) are the one vocabulary from the engine to the API: the actor sends them
as they are. They are tagged, ``array_like`` and ``gc=False`` so a step's deltas serialize cheaply.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import msgspec
import numpy as np

__all__ = [
    "EngineError",
    "QueueFull",
    "RequestError",
    "EngineClosed",
    "FinishReason",
    "SamplingParams",
    "TokenMask",
    "Usage",
    "SpeculativeUsage",
    "RequestMetrics",
    "Accepted",
    "TokenDelta",
    "Finish",
    "Event",
    "Completion",
    "EngineStats",
    "Request",
    "RequestStatus",
    "LaneSetup",
    "LaneWork",
    "Batch",
    "SampleRequest",
    "DraftLane",
    "TierCopy",
    "ModelRunner",
]


# ---- errors ---------------------------------------------------------------------------------------------
class EngineError(RuntimeError):
    """Base class of the engine's own errors."""


class QueueFull(EngineError):
    """``queue_depth`` requests already wait for a lane; the request was not accepted (HTTP 429)."""


class EngineClosed(EngineError):
    """The engine was closed; it accepts no more requests."""


class RequestError(ValueError):
    """A request the engine can never run (bad parameters, or larger than the context or the KV pool)."""


class FinishReason(enum.StrEnum):
    STOP_TOKEN = "stop_token"
    STOP_STRING = "stop_string"
    OUTPUT_LIMIT = "output_limit"  # max_tokens reached
    CONTEXT_CAPACITY = "context_capacity"  # max_context reached (the budget was clamped to it)
    CANCELLED = "cancelled"
    ERROR = "error"  # the request failed (e.g. its token mask allowed nothing); the engine keeps serving


# A per-request token mask (grammar hook): called with the tokens generated so far, before each sample. Returns
# None (no constraint), a bool array [V] of allowed ids, or an XGrammar-style packed int32 bitmask
# [ceil(V/32)] (token t allowed iff bit t&31 of word t>>5 is set).
TokenMask = Callable[[Sequence[int]], "np.ndarray | None"]


# ---- request parameters -----------------------------------------------------------------------------------
class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int = 16
    temperature: float = 0.0  # 0: exact argmax (negative: refused)
    top_k: int = 0  # 0: no top-k cut (negative: refused)
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's end-of-sequence ids
    ignore_eos: bool = False  # do not stop on the model's end-of-sequence ids (benchmarks)
    # stop strings are matched only in text generated after this token (e.g. ``</think>``: a stop applies to
    # the answer, never to the reasoning); None: from the first generated token
    stop_after_token_id: int | None = None

    def check(self) -> None:
        """Raise ``RequestError`` naming the first invalid field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens: must be a positive integer, got {self.max_tokens!r}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
            if not np.isfinite(getattr(self, name)):
                raise RequestError(f"{name}: must be finite")
        if self.temperature < 0:
            raise RequestError(f"temperature: must be >= 0 (0: greedy), got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k: must be an integer >= 0 (0: no cut), got {self.top_k!r}")
        # top_p 0 keeps the most probable token only (the sampler keeps at least one), as HTTP's [0, 1] allows
        if not 0.0 <= self.top_p <= 1.0:
            raise RequestError(f"top_p: must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise RequestError(f"min_p: must be in [0, 1], got {self.min_p}")
        if not (np.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise RequestError(f"repetition_penalty: must be positive, got {self.repetition_penalty}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise RequestError(f"seed: must be an integer in 0..2^64-1, got {self.seed!r}")


# ---- events and results -----------------------------------------------------------------------------------
class SpeculativeUsage(msgspec.Struct, frozen=True, kw_only=True):
    """A request's speculative decoding (``--spec mtp``): draft tokens proposed, drafts accepted (and emitted),
    verify rounds. Tokens per round = 1 + accepted / rounds (a round emits its accepted drafts and one more)."""

    drafted: int
    accepted: int
    rounds: int


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the prefix cache (not computed again), both tiers
    completion_tokens: int  # generated ids, including a stop token
    # generated ids up to and including the first ``stop_after_token_id`` (``</think>``: the reasoning of a
    # thinking request; all of them if it never came); 0 without a ``stop_after_token_id``
    reasoning_tokens: int = 0
    speculative: SpeculativeUsage | None = (
        None  # an extension object; None when the engine does not speculate
    )
    host_cached_tokens: int = 0  # of ``cached_tokens``, those restored from the host tier (docs/tiering.md)


class RequestMetrics(msgspec.Struct, frozen=True, kw_only=True):
    queue_wait_s: float  # submit -> admitted to a lane
    prefill_s: float  # admitted -> first token sampled
    decode_s: float  # first token -> finish
    ttft_s: float  # submit -> first token sampled
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    lane: int = -1  # the lane it ran in (-1: it never got one)
    host_cached_tokens: int = 0  # of ``cached_tokens``, those restored from the host tier
    restore_bytes: int = 0  # bytes copied host -> device for them (KV pages and GDN checkpoints)
    restore_s: float = 0.0  # the copy's time (on the GPU: between events on the copy stream)


class Accepted(msgspec.Struct, array_like=True, gc=False, tag=True):
    """A request the engine took (``Handle.accepted``): its prompt, the output budget it runs with (``max_tokens``
    clamped once, here, to what the context leaves) and whether it waits for a lane."""

    request_id: int
    prompt_tokens: int
    max_tokens: int
    queued: bool


class TokenDelta(msgspec.Struct, array_like=True, gc=False, tag=True):
    """New generated ids and the text that became final with them (text may lag ids by a held-back tail)."""

    request_id: int
    token_ids: list[int]
    text: str


class Finish(msgspec.Struct, array_like=True, gc=False, tag=True):
    """Last event of a request. Its remaining text (held back for a possible stop string) comes with it."""

    request_id: int
    reason: str
    usage: Usage
    metrics: RequestMetrics
    text: str = ""
    stop_string: str | None = None
    error: str | None = None


Event = TokenDelta | Finish


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    request_id: int
    token_ids: list[int]  # every generated id (a stop token included)
    text: str  # generated text without stop tokens, cut before a matched stop string
    finish_reason: str
    usage: Usage
    metrics: RequestMetrics
    stop_string: str | None = None
    error: str | None = None


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    lanes_total: int
    lanes_busy: int
    queue_length: int
    queue_depth: int
    page_size: int
    kv_pages_total: int
    kv_pages_free: int
    kv_pages_active: int  # held by running requests (some of them shared with retained prefixes)
    kv_pages_retained: int  # held only by the prefix cache
    checkpoints: int
    checkpoint_bytes: int
    checkpoint_budget_bytes: int
    reserved_sequences: int
    prefix_hit_tokens: int  # total prompt tokens reused
    prefill_tokens: int  # total prompt tokens computed
    decode_tokens: int  # total generated tokens
    evicted_nodes: int
    evicted_checkpoints: int
    steps: int
    requests_finished: int
    spec_rounds: int = 0  # speculative verify rounds (``EngineConfig.spec``)
    spec_drafted: int = 0  # draft tokens proposed
    spec_accepted: int = 0  # drafts accepted and emitted
    # the host tier (docs/tiering.md); all 0 without one
    device_hit_tokens: int = 0  # prompt tokens reused from prefixes resident on the device
    host_hit_tokens: int = 0  # prompt tokens reused from prefixes restored from the host tier
    host_restores: int = 0  # prefixes restored host -> device
    restore_bytes: int = 0
    restore_seconds: float = 0.0
    spills: int = 0  # prefix nodes moved device -> host instead of being dropped
    spill_bytes: int = 0
    host_evictions: int = 0  # prefix nodes dropped from the host tier (LRU)
    host_pages_total: int = 0  # host-tier pages of one KV page's bytes (KV pages and checkpoints share them)
    host_pages_free: int = 0


# ---- the engine's own request record (never leaves the engine) --------------------------------------------
class RequestStatus(enum.Enum):
    WAITING = 1
    RUNNING = 2
    FINISHING = 3  # finished generating; computing its last token so the end-of-generation checkpoint exists
    DONE = 4


@dataclass(eq=False, slots=True)
class Request:
    """One request's progress. Token accounting: ``num_computed`` catches up with ``len(tokens)``."""

    id: int
    prompt_len: int
    params: SamplingParams
    seed: int  # the counter-based stream's key (drawn at submit when the request brought none)
    budget: int  # most tokens it may generate: min(max_tokens, max_context - prompt_len)
    limit_reason: FinishReason  # the reason reported when ``budget`` is reached
    tokens: list[int]  # prompt + generated
    token_mask: TokenMask | None = None
    marks: tuple[int, ...] = ()  # prompt positions that get a reserved checkpoint (the last turn's start)
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0  # tokens whose KV and GDN state are in the lane
    cached_tokens: int = 0
    host_cached_tokens: int = 0  # of ``cached_tokens``, restored from the host tier
    restore: int | None = (
        None  # ticket of the host -> device copy it waits for (its lane runs nothing until then)
    )
    restore_bytes: int = 0
    restore_s: float = 0.0
    lane: int = -1
    finish_reason: FinishReason | None = None
    error: str | None = None
    counts: dict[int, int] = field(default_factory=dict)  # generated id -> occurrences (penalties)
    resumed_reservation: int | None = None  # reservation of the sequence this request continues
    checkpoints: list[tuple[int, int]] = field(default_factory=list)  # (position, node id) published
    speculative: bool = False  # the engine drafts for it (``EngineConfig.spec``); counters below
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_rounds: int = 0
    t_submit: float = 0.0
    t_admit: float = 0.0
    t_first: float = 0.0
    t_finish: float = 0.0

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len


# ---- the step plan and the runner contract ----------------------------------------------------------------
# The step plan and the runner contract: what the scheduler hands a model runner, and what comes back.
#
# One step is two calls, in this order, from the engine's step thread:
#
# 1. ``runner.execute(batch)``: start ``batch.copies`` in their order (host-tier spills and restores; a restore
#    may complete in a later step, ``copies_done`` says when), apply ``batch.setups`` (page table, GDN restore or
#    zero state, the boundary page copy), run every ``LaneWork`` (prefill lanes one forward call each, decode lanes in one batched call),
#    snapshot the GDN state of work that asks for it, then release ``batch.free_checkpoints``. The runner keeps
#    the logits of the work items with ``sample=True``: row ``i`` is the ``i``-th such item in batch order.
# 2. ``runner.sample(rows, reqs, token_limit)``: the token of each listed row of that step, one ``SampleRequest``
#    per row, by the one sampler (``sampler.py``: exact integer mass, counter-based randomness); -1 where nothing
#    is allowed. The grammar masks in ``reqs`` were computed on the CPU while ``execute`` ran.
#
# Invariants every runner keeps: a lane's result never depends on which other lanes share the step (batch
# invariance); ``snapshot_bytes`` (one stored GDN checkpoint) and ``vocab_size`` are known after construction and
# never change. The reference runner (``model_runner.py``) and the CUDA runner (``ninfer.cuda.runner``) are the two
# implementations; nothing else touches the model.


@dataclass(slots=True)
class LaneSetup:
    """Prepare a lane for a newly admitted request (applied before any work of the step)."""

    lane: int
    pages: list[int]  # page table for the request's whole reservation; page i holds positions i*P..i*P+P-1
    restore: int | None  # checkpoint id whose GDN state the lane resumes from; None: zero state
    length: int  # tokens already in the lane after the restore (0 without one)
    copy_page: tuple[int, int, int] | None  # (src, dst, n): copy positions 0..n-1 of page src into dst


@dataclass(slots=True)
class LaneWork:
    """Tokens one lane computes in this step."""

    lane: int
    start: int  # position of token_ids[0]; equals the lane's length before the step
    token_ids: list[int]
    prefill: bool  # prompt tokens (one forward call per lane) vs generated tokens (batched decode)
    sample: bool  # keep logits of the last position for sampling
    save_checkpoint: int | None  # snapshot the lane's GDN state after this work under this checkpoint id
    # a speculative round (decode work ``[last token, d_1..d_m]``): the runner keeps every position's logits for
    # ``verify`` and the lane's state after every position for ``commit``; ``sample`` is False for it
    verify: bool = False


@dataclass(slots=True)
class TierCopy:
    """One prefix node's move between the device pool and the host tier (docs/tiering.md).

    A spill copies device pages ``device_pages[i]`` into host pages ``host_pages[i]`` (whole pages) and the GDN
    checkpoint ``device_ckpt`` into the host pages ``host_ckpt`` (a checkpoint takes ``ceil(snapshot_bytes /
    page_bytes)`` host pages, its bytes in order); a restore copies the other way into device pages and a device
    checkpoint id that the scheduler just allocated. The scheduler has already released the
    source ids of a spill (the device pages may be handed to another request in the same step; the runner
    orders its writes after the copy) and releases the device checkpoint id of a spill in ``free_checkpoints``.
    """

    ticket: (
        int  # a restore's (> 0), reported back by ``copies_done`` when the data is on the device; 0: a spill
    )
    device_pages: list[int]
    host_pages: list[int]
    device_ckpt: int | None = None
    host_ckpt: list[int] = field(default_factory=list)  # empty: no checkpoint moves


@dataclass(slots=True)
class Batch:
    """Everything the model runner does in one step: host-tier copies, setups, work, frees (a runner may run decode
    work before the copies start, since decode touches no memory a copy uses)."""

    setups: list[LaneSetup] = field(default_factory=list)
    work: list[LaneWork] = field(default_factory=list)
    free_checkpoints: list[int] = field(default_factory=list)  # checkpoint ids to release after the work
    # host-tier spills and restores in the order they were planned (a node restored and spilled again in one
    # step, or pages freed by a spill and restored into, are only right in that order)
    copies: list[TierCopy] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.setups or self.work or self.free_checkpoints or self.copies)


class SampleRequest(NamedTuple):
    """One row's sampling inputs. ``position``: the sequence position of the token drawn (the counter of the
    request's random stream); ``counts``: generated id -> occurrences (penalties); ``mask``: the packed int32
    bitmask ``[ceil(V/32)]`` of allowed ids (``sampler.packed_mask``) or None for no mask."""

    params: SamplingParams
    seed: int
    position: int
    counts: Mapping[int, int]
    mask: np.ndarray | None


@dataclass(slots=True)
class DraftLane:
    """One lane's draft step: ``tokens`` are the request's tokens (prompt, generated, then the drafts of this
    round so far); the runner feeds its draft head the rows it has not seen and keeps one draft logits row."""

    lane: int
    tokens: Sequence[int]


@runtime_checkable
class ModelRunner(Protocol):
    """The engine's only seam to the model and its memory (KV pages, GDN state and checkpoints)."""

    snapshot_bytes: int
    vocab_size: int
    page_bytes: int  # one KV page of every attention layer, as stored: the unit of the host tier
    host_pages: int  # pages of ``page_bytes`` in the host tier (0: none); a checkpoint takes several

    def execute(self, batch: Batch) -> None:
        """Run one step's plan; keep the logits of its sampled work items for ``sample``."""
        ...

    def sample(
        self, rows: Sequence[int], reqs: Sequence[SampleRequest], token_limit: int | None
    ) -> list[int]:
        """Tokens of rows ``rows`` of the last ``execute`` (one ``SampleRequest`` each; -1: nothing allowed).
        Ids at or above ``token_limit`` are never drawn."""
        ...

    def draft(self, lanes: Sequence[DraftLane]) -> None:
        """One draft step of the MTP head for each of ``lanes``: the first of a round catches the head up with
        the lane's computed tokens, the next ones chain from the previous draft (``tokens[-1]``). Keeps one
        logits row per lane (row ``i``: ``lanes[i]``) for ``sample``, and every step's row for ``verify``.
        A runner may also offer ``draft_chain`` (``speculative.chain_by_steps`` defines it): a round's draft
        steps at once, each sampled and fed to the next without the host (CUDA: one synchronization a round)."""
        ...

    def verify(
        self,
        lanes: Sequence[int],
        drafts: Sequence[Sequence[int]],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
    ) -> list[list[int]]:
        """The tokens each verified lane's round emits (``spec_verify.verify_lane``) from the last ``execute``'s
        verify rows and this round's draft rows; ``reqs[i]``: one ``SampleRequest`` per verified position."""
        ...

    def commit(self, lane: int, length: int) -> None:
        """After a verify round: the lane keeps the state of its first ``length`` tokens (the KV of later
        positions is dropped, the GDN state is the one after position ``length - 1``)."""
        ...

    def copies_done(self, wait: bool) -> list[tuple[int, float]]:
        """Restores (``TierCopy.ticket``) whose data is now on the device, each with the copy's seconds; each
        ticket is reported once. ``wait``: block until at least one restore in flight completes (if any is)."""
        ...
