"""``CudaModelRunner``: the engine's runner contract (ninfer/engine/core.py) over device memory.

- Lane ``l`` computes in GDN state slot ``l``; checkpoints live in slots ``lanes ..`` of the same pool (a save or
  a restore is one device copy per GDN layer); KV pages are the engine's page ids in the device page pool.
- Prefill lanes run one eager forward each; decode lanes run together as one replay of the CUDA graph captured
  for that lane count (``cuda_graph=False`` on the network: the same kernels launched eagerly).
- ``execute`` keeps the sampled rows' logits on the device; ``sample`` draws their tokens there
  (``ninfer.cuda.sampling.sample_requests``, the same function as the host sampler). ``device_sampling = False``
  (a runner setting, for tests and diagnosis) copies the rows to the host and samples them with the host
  sampler instead: the same tokens.
- The device-memory plan is computed and checked before the pools are allocated (``self.plan``).
- The host tier (docs/tiering.md, ``ninfer.cuda.host_tier``): pinned host pages and a copy stream. A step runs
  the running lanes' verify rounds and decode first (they touch no memory a copy uses), then starts its spills
  and restores on the copy stream, then sets up new lanes, prefills and saves checkpoints while they go, the
  compute stream waiting on a copy only where it touches that copy's pages or slots. A restoring lane is set up
  in a later step, once ``copies_done`` reported it (events polled, never a blocking wait on the step path).
- Checkpoint slots: ``ninfer.cuda.ckpt_slots.CheckpointSlots`` (a freed id's slot is reused within the step
  where that is safe, so restores and saves never find the slots taken by ids the same step released).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.config import ModelConfig
from ninfer.cuda.ckpt_slots import CheckpointSlots
from ninfer.cuda.memory_plan import MemoryPlan, has_group_weights, kv_page_bytes, plan_memory, snapshot_bytes
from ninfer.cuda.upload import tensor_bytes
from ninfer.engine.config import EngineConfigError, auto_host_cache_bytes
from ninfer.engine.core import Batch, DraftLane, SampleRequest, TierCopy
from ninfer.engine.sampler import sample_host

__all__ = ["CudaModelRunner"]


class CudaModelRunner:
    device_sampling = True  # False: ``sample`` copies the rows to the host and uses the host sampler
    # speculation's GDN rollback (docs/speculative.md): True, per-position snapshots written by the verify forward
    # (commit = one slot copy) and graphed draft steps; False, the pre-round copy and the replay of the kept rows
    spec_snapshots = True

    def __init__(
        self,
        net: Any,
        model_config: ModelConfig,
        cfg: Any,
        *,
        capture: bool = True,
        spec_snapshots: bool | None = None,
    ) -> None:
        import cupy

        if cfg.kv_dtype not in ("bf16", "fp8"):
            raise ValueError(f"kv_dtype={cfg.kv_dtype!r}: the CUDA runner stores KV pages as bf16 or fp8")
        cfg = cfg.for_model(model_config)  # the model's default prefill chunk when the settings leave it open
        self.net, self.mc, self.cfg = net, model_config, cfg
        if capture:  # every family first, in parallel on a cold cache (each compile subprocess holds a CUDA
            # context for a moment: before the pools take the memory); nothing compiles lazily after
            from ninfer.cuda import compile_workers

            net.warmup(compile_workers())
        net.state_dtype = cfg.gdn_state_dtype
        net.kv_dtype = cfg.kv_dtype  # the engine's setting rules the KV pools allocated below
        self.snapshot_bytes = snapshot_bytes(model_config, cfg.gdn_state_dtype)
        self.vocab_size = model_config.vocab_size
        lanes = cfg.max_concurrency
        n_ckpt = cfg.checkpoint_budget(self.snapshot_bytes) // self.snapshot_bytes if cfg.prefix_reuse else 0
        n_ckpt += lanes if cfg.prefix_reuse else 0  # a step saves before it frees: room for one save per lane
        spec = cfg.num_draft > 0
        if spec and "mtp.fc.weight" not in net.w:
            raise EngineConfigError(
                "spec: 'mtp' needs an artifact with MTP weights (mtp.*); this one has none"
            )
        if spec_snapshots is not None:
            self.spec_snapshots = spec_snapshots
        # speculation: k + 1 snapshot slots per lane, or one spare slot per lane (the pre-round state)
        spare = (lanes * (cfg.num_draft + 1) if self.spec_snapshots else lanes) if spec else 0
        # the host tier's unit: one KV page of every plane the pool holds (the MTP head's too, with speculation)
        self.page_bytes = kv_page_bytes(model_config, cfg.page_size, cfg.kv_dtype, int(spec))
        self.host_pages = cfg.host_tier(self.page_bytes, self.snapshot_bytes, auto_host_cache_bytes())
        net.allocate(num_slots=1, num_pages=1, page_size=cfg.page_size, max_context=cfg.page_size)  # free old
        free, _ = cupy.cuda.runtime.memGetInfo()
        weights = tensor_bytes(net.w)
        self.plan: MemoryPlan = plan_memory(
            model_config, weights=weights, free=free + weights, lanes=lanes, checkpoints=n_ckpt + spare,
            num_pages=cfg.num_pages, page_size=cfg.page_size, max_context=cfg.max_context,
            prefill_chunk=cfg.prefill_chunk, attn_chunk=net.attn_chunk, kv_dtype=cfg.kv_dtype,
            state_dtype=cfg.gdn_state_dtype, act_bytes=net.act.itemsize, graphs=net.cuda_graph,
            reserve=net.memory_reserve_bytes, extra_kv_planes=int(spec),
            verify_rows=cfg.num_draft + 1 if spec else 0, host_tier=self.host_pages > 0,
            group_weights=has_group_weights(getattr(t, "fmt", "") for t in net.w.values()),
        )  # fmt: skip
        self.plan.check()
        self._keep_operands(net)
        net.allocate(
            num_slots=lanes + n_ckpt + spare,
            num_pages=cfg.num_pages,
            page_size=cfg.page_size,
            max_context=cfg.max_context,
            extra_kv=int(spec),
        )
        from ninfer.cuda.spec import CudaSpec

        self._spec = (
            CudaSpec(net, lanes, lanes + n_ckpt, cfg.num_draft, self.spec_snapshots) if spec else None
        )
        self._pages: list[list[int]] = [[] for _ in range(lanes)]
        self._len = [0] * lanes
        self._slots = CheckpointSlots(range(lanes, lanes + n_ckpt))
        self._logits: Any = None  # the last step's sampled rows, on the device [n, V] float32
        self.tier: Any = None
        self._host_len: dict[int, int] = {}  # first host page of a spilled checkpoint -> its length
        if self.host_pages:
            from ninfer.cuda.host_tier import HostTier

            # all pinned now, at start-up: a cudaHostAlloc beside the steps (even in another thread) stalled the
            # step thread for its whole duration on the H200 (620 ms per GiB; docs/tiering.md "The runners")
            self.tier = HostTier(
                net, self.host_pages, self.page_bytes, checksum=cfg.tier_checksum, eager=True
            )
        if capture:
            net.warm_prefill(cfg.prefill_chunk)  # the prefill path's lazy builds: now, not in a request
            if self._spec is not None:
                self._spec.warm_chain()  # and those of draft_chain's device feed, not in the first round
        if capture and net.cuda_graph:
            self.capture_graphs()
            for b in range(1, lanes + 1):  # and every speculative graph, so no request's round pays a capture
                self.capture_spec_graphs(b)

    def _keep_operands(self, net: Any) -> None:
        """Size the prefill GEMM's kept fp16 operands (ninfer/cuda/operands.py) by the plan: ``auto`` takes what the
        plan leaves spare, up to all of them; ``resident`` all of them or a MemoryPlanError; the first full prefill
        chunk (``warm_prefill``) fills them."""
        from ninfer.cuda.operands import budget

        keep = budget(net.prefill_weights, net.prefill_operand_bytes(), self.plan.spare)
        self.plan = dataclasses.replace(self.plan, prefill_operands=keep)
        self.plan.check()
        net.operands.set_budget(keep)

    def capture_graphs(self) -> int:
        """Capture the decode graph of every lane count now (warm-up); returns their private pools' bytes."""
        for b in range(1, self.cfg.max_concurrency + 1):
            if b not in self.net.graphs.captured:
                self.net.graphs.capture(b)
        return self.net.graphs.pool_bytes()

    def capture_spec_graphs(self, lanes: int) -> int:
        """Capture the speculative verify and draft-step graphs of rounds over ``lanes`` lanes now (a warm-up, as
        ``capture_graphs`` for decode); returns the spec graphs captured so far (0 without speculation)."""
        return self._spec.capture(lanes) if self._spec is not None else 0

    def graph_pool_bytes(self) -> int:
        """What every captured graph's private pool holds now (decode, verify, draft): the plan's ``graph_pools``
        bounds it."""
        return self.net.graphs.pool_bytes() + (self._spec.pool_bytes() if self._spec is not None else 0)

    @property
    def spec_graph_captures(self) -> int:
        """Speculative graphs captured so far (a capture in a timed region is a one-time cost, not a round's)."""
        return self._spec.captures if self._spec is not None else 0

    @property
    def spec_counts(self) -> dict[str, int]:
        """Verify forwards and draft steps so far, by graph replay or eager (``CudaSpec.counts``; empty without
        speculation)."""
        return dict(self._spec.counts) if self._spec is not None else {}

    @property
    def num_checkpoints(self) -> int:
        return len(self._slots)

    # ---- one engine step --------------------------------------------------------------------------------
    def execute(self, batch: Batch) -> None:
        import cupy

        net = self.net
        rows: dict[int, Any] = {}  # lane -> device logits row [1, V]
        # first the lanes already running (decode, verify rounds): they touch no memory of a host-tier copy
        verify = [w for w in batch.work if w.verify]
        if verify:
            assert self._spec is not None, "verify work without spec"
            self._spec.forward(verify, self._len)
            for w in verify:
                self._len[w.lane] += len(w.token_ids)
        decode = [w for w in batch.work if not w.prefill and not w.verify]
        if decode:
            assert all(len(w.token_ids) == 1 for w in decode), "decode work is one token per lane"
            lanes = [(w.lane, self._at(w), self._pages[w.lane]) for w in decode]
            # not synchronized: the host-tier copies are issued while it runs (pump, below), the step ends synchronized
            h, logits = net.decode(np.asarray([w.token_ids[0] for w in decode]), lanes, sync=False)
            for i, w in enumerate(decode):
                self._record(w.lane, w.start, h[i : i + 1])
                self._len[w.lane] += 1
                rows[w.lane] = logits[i : i + 1]
        saves = [w.save_checkpoint for w in batch.work if w.save_checkpoint is not None]
        spilled = [c.device_ckpt for c in batch.copies if not c.ticket and c.host_ckpt]
        setup_reads = [s.restore for s in batch.setups if s.restore is not None]
        self._slots.begin(batch.free_checkpoints, spilled, setup_reads, saves)
        # host tier: queued here (issued by pump below, or earlier where a setup or save guards what they touch)
        self._copies(batch)
        for s in batch.setups:
            self._setup(s)
        self._slots.after_setups()
        for w in batch.work:
            if w.prefill:
                h = net.run([(w.lane, self._at(w), len(w.token_ids), self._pages[w.lane])], w.token_ids)
                self._record(w.lane, w.start, h, w.token_ids)
                self._len[w.lane] += len(w.token_ids)
                if w.sample:
                    rows[w.lane] = net.logits_dev(h[-1:])
        for w in batch.work:
            if w.save_checkpoint is not None:
                self._save(w.lane, w.save_checkpoint)
        self._slots.end()
        sampled = [rows[w.lane] for w in batch.work if w.sample]
        self._logits = None
        if sampled:
            with net.stream:
                self._logits = cupy.concatenate(sampled, axis=0)
        # host-tier copies issued while the step runs on the GPU
        if self.tier is not None and self.tier.queued:
            self.tier.pump(lambda: not net.stream.done)
        if self._verify_only(batch):
            # a step of verify rounds alone is left running: the engine's ``verify`` right after it launches the
            # round's sampling behind the forward and synchronizes once (its token ids' copy back), so the host
            # prepares the sampling while the GPU verifies instead of after it (docs/speculative.md)
            return
        net.stream.synchronize()  # nothing of this step is pending when the copy stream reuses what it freed

    def _verify_only(self, batch: Batch) -> bool:
        """Only verify rounds: no setup, host-tier copy, checkpoint, prefill, decode or sampled row (nothing a copy
        stream or the host reads before the round's ``verify`` synchronizes)."""
        return (
            bool(batch.work)
            and all(w.verify and w.save_checkpoint is None for w in batch.work)
            and not (batch.setups or batch.copies or batch.free_checkpoints)
            and (self.tier is None or not self.tier.queued)
        )

    def copies_done(self, wait: bool) -> list[tuple[int, float]]:
        """Restores now on the device: (ticket, seconds between its events on the copy stream)."""
        return self.tier.done(wait) if self.tier is not None else []

    def _copies(self, batch: Batch) -> None:
        if not batch.copies:
            return
        assert self.tier is not None, "a host-tier copy without a host tier"
        i = 0
        while i < len(batch.copies):  # in planned order; a restore's copies (one ticket) are consecutive
            c = batch.copies[i]
            if not c.ticket:
                slot = None
                if c.host_ckpt:
                    slot, length = self._slots.held[c.device_ckpt]
                    self._host_len[c.host_ckpt[0]] = length
                self.tier.spill(c, slot)
                if slot is not None:  # a restore later in this step writes it on the same copy stream
                    self._slots.spilled(c.device_ckpt)
                i += 1
                continue
            j = i
            while j < len(batch.copies) and batch.copies[j].ticket == c.ticket:
                j += 1
            group = batch.copies[i:j]
            self.tier.restore(group, [self._restore_slot(x) for x in group], c.ticket)
            i = j

    def _restore_slot(self, c: TierCopy) -> int | None:
        if not c.host_ckpt:
            return None
        # the copy stream orders it after any spill that read the slot
        return self._slots.take(c.device_ckpt, self._host_len.pop(c.host_ckpt[0]))

    def sample(
        self, rows: Sequence[int], reqs: Sequence[SampleRequest], token_limit: int | None
    ) -> list[int]:
        """Token ids of rows ``rows`` of the last ``execute``, one ``SampleRequest`` per row (-1: nothing
        allowed)."""
        import cupy

        from ninfer.cuda.sampling import sample_requests

        if not rows:
            return []
        assert self._logits is not None, "sample() before execute() kept any rows"
        with self.net.stream:
            x = self._logits if len(rows) == self._logits.shape[0] else self._logits[list(rows)]
            if not self.device_sampling:
                return sample_host(cupy.asnumpy(x, stream=self.net.stream), reqs, token_limit)
            return sample_requests(x, reqs, token_limit)

    # ---- speculative rounds (ninfer/cuda/spec.py) --------------------------------------------------------
    def draft(self, lanes: Sequence[DraftLane]) -> None:
        assert self._spec is not None, "draft() without spec"
        self._logits = self._spec.draft(lanes)

    def draft_chain(
        self,
        lanes: Sequence[DraftLane],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
        forced: Sequence[Sequence[int]] | None = None,
    ) -> list[list[int]]:
        """A round's draft steps with one host synchronization (``CudaSpec.draft_chain``; the engine's contract:
        ``speculative.chain_by_steps``)."""
        assert self._spec is not None, "draft_chain() without spec"
        toks, self._logits = self._spec.draft_chain(lanes, reqs, token_limit, forced)
        return toks

    def verify(
        self,
        lanes: Sequence[int],
        drafts: Sequence[Sequence[int]],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
    ) -> list[list[int]]:
        assert self._spec is not None, "verify() without spec"
        return self._spec.verify(lanes, drafts, reqs, token_limit)

    def commit(self, lane: int, length: int) -> None:
        assert self._spec is not None, "commit() without spec"
        self._len[lane] = self._spec.commit(lane, length)

    def _record(self, lane: int, start: int, h: Any, token_ids: Sequence[int] | None = None) -> None:
        if self._spec is not None:
            self._spec.record(lane, start, h, token_ids)

    # ---- lanes and checkpoints --------------------------------------------------------------------------
    def _at(self, w: Any) -> int:
        if self._len[w.lane] != w.start:
            raise AssertionError(
                f"lane {w.lane}: work starts at {w.start}, the lane holds {self._len[w.lane]}"
            )
        return w.start

    def _setup(self, s: Any) -> None:
        if self.tier is not None:
            # the pages the lane writes (from its resume point on) wait for any copy that reads or writes them (a
            # spill of the page's previous owner); what it only reads waits for restores alone, not for a spill
            # that reads it too (the engine may spill, in the same step, the checkpoint a setup resumes from)
            cut = s.length // self.cfg.page_size
            src = {s.copy_page[0]} if s.copy_page is not None else set()
            slot = {self._slots.slot(s.restore)} if s.restore is not None else set()
            self.tier.guard(set(s.pages[cut:]), set())
            self.tier.guard(set(s.pages[:cut]) | src, slot, writes_only=True)
        if s.copy_page is not None:
            self.net.copy_page(*s.copy_page)
        self._pages[s.lane] = list(s.pages)
        if s.restore is not None:
            slot, length = self._slots.held[s.restore]
            assert length == s.length, "checkpoint length disagrees with the planned resume point"
            self.net.copy_slot(slot, s.lane)
        else:
            self.net.zero_slot(s.lane)
        self._len[s.lane] = s.length
        if self._spec is not None:
            self._spec.setup(s.lane, s.pages, s.length)

    def _save(self, lane: int, cid: int) -> None:
        # a slot no copy in flight touches where there is one, so the compute stream rarely waits on the copy stream
        busy = self.tier.busy_slots() if self.tier is not None else set()
        slot = self._slots.take(cid, self._len[lane], avoid=busy)
        if slot in busy:
            self.tier.guard(set(), {slot})  # a spill in flight still reads it
        self.net.copy_slot(lane, slot)
