"""``Engine``: submit requests, stream their events; one step loop in its own thread.

``submit``/``cancel``/``stats`` are safe from any thread: they take the engine lock, which the step holds only
while it plans and while it turns logits into tokens and events, never while the model runs.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ninfer.frontend.prompt import TurnMarker

from .config import EngineConfig, EngineConfigError
from .core import (
    Accepted,
    EngineClosed,
    EngineStats,
    Event,
    FinishReason,
    ModelRunner,
    Request,
    RequestError,
    RequestStatus,
    SamplingParams,
    TokenMask,
)
from .handle import Handle
from .kv_pool import PagePool
from .output import Outputs
from .prefix_cache import PrefixCache
from .prefix_digest import PrefixDigest
from .sampler import MaskWorker
from .scheduler import Scheduler
from .speculative import Speculator
from .stop import TextStream
from .tiering import TieredCache

if TYPE_CHECKING:
    from ninfer.model import Model

__all__ = ["Engine"]


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        model_config: Any,
        tokenizer: Any | None,
        cfg: EngineConfig,
        *,
        eos_token_ids: Sequence[int] = (),
        token_limit: int | None = None,
        turns: TurnMarker | None = None,
        background: bool = True,
    ) -> None:
        # the model's prefill chunk when the settings leave it open (the CUDA runner resolves its copy alike)
        cfg = cfg.for_model(model_config)
        self.config, self.model_config, self.tokenizer = cfg, model_config, tokenizer
        self._eos = frozenset(int(t) for t in eos_token_ids)
        self._token_limit = token_limit
        self._turns = turns  # where the next turn's prompt parts (chat-format knowledge, frontend/prompt.py)
        self._runner = runner  # the only part that touches the model (core.py's contract)
        self._pool = PagePool(cfg.num_pages)
        cache = None
        if cfg.prefix_reuse:
            budget = cfg.checkpoint_budget(self._runner.snapshot_bytes)
            if budget < 2 * self._runner.snapshot_bytes:
                raise EngineConfigError(
                    f"checkpoint_budget_bytes: {budget} bytes hold fewer than 2 GDN checkpoints of "
                    f"{self._runner.snapshot_bytes} bytes; raise it or disable prefix_reuse"
                )
            args = (self._pool, cfg.page_size, self._runner.snapshot_bytes, budget, cfg.reserved_sequences)
            cache = PrefixCache(*args)
            if runner.host_pages:  # the host tier (docs/tiering.md)
                cache = TieredCache(*args, host_pages=runner.host_pages, page_bytes=runner.page_bytes)
        self._cache = cache
        self._digests: dict[int, PrefixDigest] = {}  # by block size: what a replica reports to its router
        self._sched = Scheduler(cfg, self._pool, cache)
        self._cv = threading.Condition(threading.RLock())
        self._step_lock = threading.Lock()
        self._out = Outputs(self._sched, token_limit)
        self._masks = MaskWorker()
        self._spec = Speculator(runner, cfg.num_draft, token_limit, self._out) if cfg.num_draft else None
        self._next_id = 1
        self._closed = False
        self._steps = 0
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
            self._thread.start()

    # ---- construction ----------------------------------------------------------------------------------
    @classmethod
    def from_model(
        cls,
        model: Model,
        tokenizer: Any | None = None,
        *,
        config: EngineConfig | None = None,
        background: bool = True,
        **settings: Any,
    ) -> Engine:
        """An engine over a loaded ``ninfer.model.Model`` (its backend's runner), with ``config`` or the
        ``EngineConfig`` of ``settings`` (``ninfer.model.open_engine`` loads an artifact and does this)."""
        if config is not None and settings:
            raise EngineConfigError("give an EngineConfig or its settings, not both")
        try:
            cfg = config if config is not None else EngineConfig(**settings)
        except TypeError as e:
            raise EngineConfigError(f"unknown engine setting: {e}") from None
        tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        return cls(
            model.runner(cfg),
            model.config,
            tokenizer,
            cfg,
            eos_token_ids=model.eos_token_ids,
            token_limit=model.token_limit,
            turns=TurnMarker.from_tokenizer(tokenizer) if tokenizer is not None else None,
            background=background,
        )

    # ---- requests ---------------------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int = 16,
        temperature: float = 0.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        *,
        token_mask: TokenMask | None = None,
        on_event: Callable[[Event], None] | None = None,
        checkpoint_at: Sequence[int] | None = None,
        **sampling: Any,
    ) -> Handle:
        """Queue a request; returns its handle at once. Raises ``QueueFull`` or ``RequestError``.

        ``sampling``: the other ``SamplingParams`` fields (top_k, top_p, min_p, presence/frequency/repetition
        penalties, stop_token_ids, ignore_eos). ``token_mask``: the grammar hook (see ``core.TokenMask``).
        ``on_event``: called from the engine thread with every event as it is produced.
        ``checkpoint_at``: prompt positions where the next turn's prompt may part from this one (reserved
        checkpoints); default: found from the chat format (``ninfer/frontend/prompt.py``).
        """
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=float(temperature),
                seed=seed,
                stop=stops,
                **{k: tuple(v) if k == "stop_token_ids" else v for k, v in sampling.items()},
            )
        except TypeError as e:
            raise RequestError(f"unknown sampling setting: {e}") from None
        return self.submit_params(
            prompt_ids, params, token_mask=token_mask, on_event=on_event, checkpoint_at=checkpoint_at
        )

    def submit_params(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        token_mask: TokenMask | None = None,
        on_event: Callable[[Event], None] | None = None,
        checkpoint_at: Sequence[int] | None = None,
    ) -> Handle:
        """``submit`` with ready ``SamplingParams``."""
        params.check()
        prompt = self._check_prompt(prompt_ids)
        room = self.config.max_context - len(prompt)
        if room < 1:
            raise RequestError(
                f"prompt has {len(prompt)} tokens; max_context {self.config.max_context} leaves no room to generate"
            )
        try:
            text = TextStream(self.tokenizer, params.stop, params.stop_after_token_id)
        except ValueError as e:
            raise RequestError(str(e)) from None
        seed = params.seed if params.seed is not None else self.config.seed
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos)
        with self._cv:
            if self._closed:
                raise EngineClosed("the engine is closed")
            rid, self._next_id = self._next_id, self._next_id + 1
            req = Request(
                id=rid,
                prompt_len=len(prompt),
                params=params,
                seed=seed if seed is not None else secrets.randbits(64),
                budget=min(params.max_tokens, room),
                limit_reason=FinishReason.OUTPUT_LIMIT
                if params.max_tokens <= room
                else FinishReason.CONTEXT_CAPACITY,
                tokens=prompt,
                token_mask=token_mask,
                marks=self._marks(prompt, checkpoint_at),
                t_submit=time.monotonic(),
                speculative=self._spec is not None,
            )
            self._sched.add(req)  # admitted at once when a lane and KV capacity are free; else QueueFull
            accepted = Accepted(rid, len(prompt), req.budget, req.status is RequestStatus.WAITING)
            handle = Handle(
                accepted, lambda: self.cancel(rid), None if self.background else self._drive, on_event
            )
            self._out.add(req, handle, text, stop_ids)
            self._cv.notify_all()
        return handle

    def admitting(self) -> AbstractContextManager[Any]:
        """The admission lock (reentrant): requests submitted while it is held are all scheduled by one step."""
        return self._cv

    def _marks(self, prompt: list[int], explicit: Sequence[int] | None) -> tuple[int, ...]:
        if explicit is not None:
            return tuple(sorted({int(q) for q in explicit if 0 < int(q) < len(prompt)}))
        return self._turns.marks(prompt) if self._turns is not None else ()

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        try:
            return self.model_config.token_ids(list(prompt_ids), "prompt_ids").tolist()
        except (ValueError, OverflowError) as e:  # OverflowError: an id beyond int64
            raise RequestError(str(e) if isinstance(e, ValueError) else f"prompt_ids: {e}") from None

    def cancel(self, request_id: int) -> None:
        """Stop a request at the next step (its lane and reservation are freed then)."""
        with self._cv:
            if request_id in self._out:
                self._sched.cancel(request_id)
                self._cv.notify_all()

    # ---- the step loop ----------------------------------------------------------------------------------
    def step(self) -> bool:
        """One step: plan, run the model, sample, emit. Returns False when there was nothing to do."""
        with self._step_lock:
            with self._cv:
                batch = self._sched.schedule()  # cancellations, FIFO admission, each lane's next tokens
                self._out.emit_finished()
                owners = {w.lane: self._sched.lanes[w.lane] for w in batch.work}
            if batch.empty:
                return self._wait_restores()
            try:  # speculation: drafts turn decode work into verify rounds (speculative.py)
                rounds = self._spec.draft(batch, owners) if self._spec is not None else []
            except Exception as e:  # noqa: BLE001 - fail the running requests, keep serving
                self._fail_step(batch, e)
                return True
            reqs = [owners[w.lane] for w in batch.work if w.sample]
            masks = self._masks.start(reqs)  # grammar masks on the CPU while the model step runs
            try:
                self._runner.execute(batch)  # the only call that runs the model
            except Exception as e:  # noqa: BLE001 - fail the running requests, keep serving
                masks.result()
                self._fail_step(batch, e)
                return True
            ready = masks.result()
            with self._cv:
                try:
                    committed = self._spec.settle(rounds) if rounds else None  # verify, emit, roll back
                except Exception as e:  # noqa: BLE001 - fail the running requests, keep serving
                    self._sched.abort(batch, f"verification failed: {type(e).__name__}: {e}")
                    self._out.emit_finished()
                    return True
                self._sched.after_run(batch, committed)  # computed tokens catch up; checkpoints; retire
                if isinstance(self._cache, TieredCache):  # host-tier restores now on the device
                    self._sched.restored(self._runner.copies_done(False))
                rows, specs = self._out.sample_requests(reqs, ready, self._runner.vocab_size)
                try:  # sample with the grammar masks: tokens back (the one sampler, core.py)
                    toks = self._runner.sample(rows, specs, self._token_limit) if rows else []
                except Exception as e:  # noqa: BLE001 - a failing sampler fails this step's requests only
                    self._out.fail(reqs, rows, f"sampling failed: {type(e).__name__}: {e}")
                else:
                    self._out.accept(reqs, rows, toks)  # detok, stops, deltas
                self._out.emit_finished()
                self._steps += 1
            return True

    def _fail_step(self, batch: Any, e: Exception) -> None:
        with self._cv:
            self._sched.abort(batch, f"model step failed: {type(e).__name__}: {e}")
            self._out.emit_finished()

    def _wait_restores(self) -> bool:
        """Nothing to run but a restore from the host tier in flight: wait for it (False: nothing in flight)."""
        if not self._sched.restoring:
            return False
        done = self._runner.copies_done(True)
        with self._cv:
            self._sched.restored(done)
        return True

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._sched.has_work:
                    self._cv.wait()
                if self._closed:
                    return
            self.step()

    # ---- inline driving (background=False), stats, shutdown -------------------------------------------
    def _drive(self, until: Callable[[], bool]) -> None:
        """Run steps in the caller's thread until ``until()`` (engines without a background thread)."""
        while not until():
            if not self.step() and not until():
                raise RuntimeError("engine is idle but the request has not finished")

    @property
    def background(self) -> bool:
        return self._thread is not None

    def memory_plan(self) -> dict[str, int]:
        """The runner's device-memory plan in bytes by part (weights, kv_pool, ..., reserve, total); empty for
        a runner that plans no device memory (the reference backend)."""
        plan = getattr(self._runner, "plan", None)
        return plan.as_dict() if plan is not None else {}

    def stats(self) -> EngineStats:
        with self._cv:
            held = self._cache.held_pages() if self._cache is not None else set()
            active = {p for pages in self._sched.lane_pages for p in pages}
            c = self._cache
            t = c if isinstance(c, TieredCache) else None
            s = self._sched
            return EngineStats(
                lanes_total=self.config.max_concurrency,
                lanes_busy=len(self._sched.running),
                queue_length=len(self._sched.waiting),
                queue_depth=self.config.queue_depth,
                page_size=self.config.page_size,
                kv_pages_total=self._pool.num_pages,
                kv_pages_free=self._pool.free,
                kv_pages_active=len(active),
                kv_pages_retained=len(held - active),
                checkpoints=c.num_checkpoints if c else 0,
                checkpoint_bytes=c.ckpt_used if c else 0,
                checkpoint_budget_bytes=c.budget_bytes if c else 0,
                reserved_sequences=c.num_reservations if c else 0,
                prefix_hit_tokens=self._sched.prefix_hit_tokens,
                prefill_tokens=self._sched.prefill_tokens,
                decode_tokens=self._out.decode_tokens,
                evicted_nodes=c.evicted_nodes if c else 0,
                evicted_checkpoints=c.evicted_checkpoints if c else 0,
                steps=self._steps,
                requests_finished=self._out.finished,
                spec_rounds=self._spec.rounds if self._spec else 0,
                spec_drafted=self._spec.drafted if self._spec else 0,
                spec_accepted=self._spec.accepted if self._spec else 0,
                device_hit_tokens=s.prefix_hit_tokens - s.host_hit_tokens,
                host_hit_tokens=s.host_hit_tokens,
                host_restores=t.num_restores if t else 0,
                restore_bytes=t.restore_bytes if t else 0,
                restore_seconds=s.restore_seconds,
                spills=t.num_spills if t else 0,
                spill_bytes=t.spill_bytes if t else 0,
                host_evictions=t.host_evictions if t else 0,
                host_pages_total=t.host_pool.num_pages if t else 0,
                host_pages_free=t.host_pool.free if t else 0,
            )

    def retained_blocks(self, block_tokens: int) -> tuple[int, tuple[int, ...]]:
        """(version, hashes): for every resume point (checkpoint) of the retained prefixes, the chain hash of the
        last full block before it (prefix_digest.py); the version changes with the set. Empty without prefix
        reuse."""
        with self._cv:
            if self._cache is None:
                return 0, ()
            digest = self._digests.get(block_tokens)
            if digest is None:
                digest = self._digests[block_tokens] = PrefixDigest(block_tokens)
            return digest.update(self._cache.root)

    def close(self) -> None:
        """Cancel what is left, stop the step loop and wait for it."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            for rid in self._out:
                self._sched.cancel(rid)
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._masks.close()
        with self._step_lock, self._cv:
            self._sched.schedule()
            self._out.emit_finished()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
