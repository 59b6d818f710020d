"""``ReferenceRunner``: the runner contract (core.py) over the NumPy reference network and host memory.

- ``ReferenceRunner(net, model_config, engine_config)``; ``snapshot_bytes`` (one GDN checkpoint in the configured
  state dtype) and ``vocab_size`` are known after construction.
- ``execute(batch)`` runs prefill lanes one forward call each and decode lanes in one batched call, and keeps the
  sampled rows' float32 logits; ``sample`` draws from them with the host sampler (``sampler.sample_host``).
- A lane's result never depends on which other lanes share the step: prefill lanes run alone, decode rows are
  bitwise equal to solo calls (the reference's ``forward_batch`` guarantees it) and ``lm_head`` runs per row.

This reference runner stores KV pages in their storage format (bf16 words, or e4m3 codes with one float32 scale
per token and KV head) and widens on read; GDN state is rounded to bf16 after every call when configured.

Checkpoints go through the state's own snapshot interface for every target: ``state.snapshot_gdn()`` returns a
frozen dataclass with ``length`` and the GDN ``conv``/``rec`` tuples (``GdnSnapshot`` for Qwen3.6; Flash-Next's
``FlashSnapshot`` adds the QSA open blocks, PLE conv windows and n-gram context), ``state.restore_gdn(snap)`` puts
it back. ``gdn_state_dtype`` applies to the ``conv``/``rec`` members; ``snapshot_bytes`` is the stored size of a
snapshot, which is the same at every length (Flash-Next pads its open blocks, docs/flash-next-state.md).

A model with a QSA indexer (config ``indexer_head_dim``/``indexer_compress_ratio``) also gets a paged plane for
its pooled index keys: positional like K/V, the key of block b (tokens b·r .. b·r+r-1) is kept in the slot of the
block's last token, so a page holds only blocks complete inside it, the boundary-page copy carries exactly the
blocks complete before the resume point, and a lane never writes a block key into a page it shares.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.config import ModelConfig
from ninfer.formats import bf16_decode, bf16_encode, bf16_round, e4m3_decode, e4m3_encode

from .config import EngineConfig, EngineConfigError
from .core import Batch, DraftLane, LaneSetup, LaneWork, SampleRequest, TierCopy
from .reference_draft import ReferenceDrafter
from .sampler import sample_host
from .spec_verify import verify_lane

__all__ = ["ReferenceRunner", "PagedKVStore", "PagedKV", "PagedKVIndex", "snapshot_nbytes"]


class PagedKVStore:
    """K/V of every full-attention layer: ``[num_pages, page_size, Hkv, D]`` in the storage format; with an indexer
    also the pooled index keys ``[num_pages, page_size, Dix]`` as bf16 words (one used slot per block)."""

    def __init__(self, mc: Any, num_pages: int, page_size: int, dtype: str, extra_planes: int = 0) -> None:
        n_attn = len(mc.full_attention_layers) + extra_planes  # extra: the MTP head's layer (last plane)
        shape = (num_pages, page_size, mc.num_key_value_heads, mc.head_dim)
        self.page_size, self.fp8 = page_size, dtype == "fp8"
        word = np.uint8 if self.fp8 else np.uint16
        self.k = [np.zeros(shape, word) for _ in range(n_attn)]
        self.v = [np.zeros(shape, word) for _ in range(n_attn)]
        self.k_scale = [np.zeros(shape[:3], np.float32) for _ in range(n_attn)] if self.fp8 else []
        self.v_scale = [np.zeros(shape[:3], np.float32) for _ in range(n_attn)] if self.fp8 else []
        index_dim = int(getattr(mc, "indexer_head_dim", 0) or 0)
        self.ratio = int(getattr(mc, "indexer_compress_ratio", 0) or 0)
        self.index = [np.zeros((num_pages, page_size, index_dim), np.uint16) for _ in range(n_attn)]
        if not (index_dim and self.ratio):
            self.index = []

    @property
    def bytes_per_token(self) -> int:
        per = sum(a[0, 0].nbytes for a in self.k + self.v + self.k_scale + self.v_scale + self.index)
        return int(per)

    def _encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if not self.fp8:
            return bf16_encode(x), None
        scale = (np.abs(x).max(axis=-1) / np.float32(448.0)).astype(np.float32)  # per token and head
        safe = np.where(scale > 0, scale, np.float32(1.0))
        return e4m3_encode(x / safe[..., None]), scale

    def _decode(self, words: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
        if scale is None:
            return bf16_decode(words)
        return e4m3_decode(words) * scale[..., None]

    def write(self, pages: np.ndarray, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        pos = np.arange(start, start + k.shape[0])
        pg, slot = pages[pos // self.page_size], pos % self.page_size
        for store, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            words, scale = self._encode(np.asarray(x, np.float32))
            store[layer][pg, slot] = words
            if scale is not None:
                scales[layer][pg, slot] = scale

    def read(self, pages: np.ndarray, layer: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        used = pages[: -(-length // self.page_size)]
        out = []
        for store, scales in ((self.k, self.k_scale), (self.v, self.v_scale)):
            words = store[layer][used].reshape(-1, *store[layer].shape[2:])[:length]
            scale = scales[layer][used].reshape(-1, scales[layer].shape[2])[:length] if scales else None
            out.append(self._decode(words, scale))
        return out[0], out[1]

    def _block_slots(self, pages: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = blocks * self.ratio + self.ratio - 1  # a block's key lives in its last token's slot
        return pages[pos // self.page_size], pos % self.page_size

    def write_index(self, pages: np.ndarray, layer: int, block: int, keys: np.ndarray) -> None:
        pg, slot = self._block_slots(pages, np.arange(block, block + keys.shape[0]))
        self.index[layer][pg, slot] = bf16_encode(np.asarray(keys, np.float32))

    def read_index(self, pages: np.ndarray, layer: int, n_blocks: int) -> np.ndarray:
        pg, slot = self._block_slots(pages, np.arange(n_blocks))
        return bf16_decode(self.index[layer][pg, slot])

    def _arrays(self) -> list[np.ndarray]:
        return [a for arrs in (self.k, self.v, self.k_scale, self.v_scale, self.index) for a in arrs]

    def copy(self, src: int, dst: int, n: int) -> None:
        for a in self._arrays():
            a[dst, :n] = a[src, :n]

    def move(self, other: PagedKVStore, src: list[int], dst: list[int]) -> None:
        """Copy whole pages ``src`` of this store into pages ``dst`` of ``other`` (the same layout)."""
        for a, b in zip(self._arrays(), other._arrays(), strict=True):
            b[dst] = a[src]

    def digest(self, page: int) -> bytes:
        """A hash of one page's contents in every layer (the host tier's restore check)."""
        h = hashlib.blake2b(digest_size=16)
        for a in self._arrays():
            h.update(a[page].tobytes())
        return h.digest()


class PagedKV:
    """One lane's view of the store through its page table (the reference model's ``KVCache`` seam)."""

    def __init__(self, store: PagedKVStore, pages: list[int]) -> None:
        self._store, self._pages = store, np.asarray(pages, dtype=np.int64)

    def _check_end(self, end: int) -> None:
        if end > self._pages.size * self._store.page_size:
            raise ValueError(f"KV write past the lane's reservation ({self._pages.size} pages)")

    def write(self, attn_idx: int, start_pos: int, k: np.ndarray, v: np.ndarray) -> None:
        self._check_end(start_pos + k.shape[0])
        self._store.write(self._pages, attn_idx, start_pos, k, v)

    def read(self, attn_idx: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        return self._store.read(self._pages, attn_idx, length)


class PagedKVIndex(PagedKV):
    """A lane's view that also holds the pooled QSA index keys (Flash-Next's ``IndexStore`` protocol)."""

    def write_index(self, attn_idx: int, block: int, keys: np.ndarray) -> None:
        self._check_end((block + keys.shape[0]) * self._store.ratio)
        self._store.write_index(self._pages, attn_idx, block, keys)

    def read_index(self, attn_idx: int, n_blocks: int) -> np.ndarray:
        return self._store.read_index(self._pages, attn_idx, n_blocks)


def _snapshot_digest(snap: Any) -> bytes:
    h = hashlib.blake2b(digest_size=16)

    def walk(x: Any) -> None:
        if isinstance(x, np.ndarray):
            h.update(x.tobytes())
        elif isinstance(x, tuple | list):
            for y in x:
                walk(y)
        elif dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, int | float | str | bytes | None):
            h.update(repr(x).encode())
        else:  # e.g. an index-key store: its attributes
            walk(list(vars(x).values()) if hasattr(x, "__dict__") else repr(x))

    walk(snap)
    return h.digest()


def snapshot_nbytes(snap: Any) -> int:
    """Bytes a (stored) snapshot holds: its arrays, walked through dataclass fields, tuples and ``nbytes``."""
    if isinstance(snap, np.ndarray):
        return int(snap.nbytes)
    if isinstance(snap, tuple | list):
        return sum(snapshot_nbytes(x) for x in snap)
    if dataclasses.is_dataclass(snap):
        return sum(snapshot_nbytes(getattr(snap, f.name)) for f in dataclasses.fields(snap))
    return int(getattr(snap, "nbytes", 0))  # e.g. an index-key store; plain ints (the length) hold nothing


class ReferenceRunner:
    def __init__(self, net: Any, model_config: ModelConfig, cfg: EngineConfig) -> None:
        self.net, self.mc, self.cfg = net, model_config, cfg
        _check_spec(net, model_config, cfg)
        spec = cfg.num_draft > 0
        self.store = PagedKVStore(model_config, cfg.num_pages, cfg.page_size, cfg.kv_dtype, int(spec))
        n_planes = len(self.store.k)
        self._drafter = ReferenceDrafter(net, self.store, n_planes - 1, cfg.max_concurrency) if spec else None
        self._verify: dict[int, tuple[int, np.ndarray, list[Any], list[np.ndarray]]] = {}
        self._view = PagedKVIndex if self.store.index else PagedKV
        self._bf16_state = cfg.gdn_state_dtype == "bf16"
        self._states: list[Any] = [None] * cfg.max_concurrency
        self._ckpts: dict[int, Any] = {}  # checkpoint id -> stored snapshot
        self.snapshot_bytes = snapshot_nbytes(self._stored(self._new_state([]).snapshot_gdn()))
        self.vocab_size = model_config.vocab_size
        # the host tier (docs/tiering.md): a plain second store, so the tiering logic runs in CI; off by default
        self.page_bytes = self.store.bytes_per_token * cfg.page_size
        self.host_pages = cfg.host_tier(self.page_bytes, self.snapshot_bytes, 0)
        self.host_store = (
            PagedKVStore(model_config, self.host_pages, cfg.page_size, cfg.kv_dtype, int(spec))
            if self.host_pages
            else None
        )
        self._host_ckpts: dict[int, Any] = {}
        self._digests: dict[tuple[str, int], bytes] = {}  # tier_checksum: ("page"|"ckpt", host id) -> digest
        self._done: list[tuple[int, float]] = []
        self._logits = np.zeros((0, self.vocab_size), np.float32)  # the last step's sampled rows

    @property
    def num_checkpoints(self) -> int:
        return len(self._ckpts)

    def execute(self, batch: Batch) -> None:
        for c in batch.copies:  # host tier, in planned order
            self._restore(c) if c.ticket else self._spill(c)
        for s in batch.setups:
            self._setup(s)
        rows: dict[int, np.ndarray] = {}
        self._verify = {}
        for w in batch.work:
            if w.prefill:
                h = self.net.forward(np.asarray(w.token_ids, np.int64), self._lane_state(w.lane, w.start))
                self._round_state(w.lane)
                self._record(w.lane, w.start, h)
                rows[w.lane] = h[-1]
        decode = [w for w in batch.work if not w.prefill and not w.verify]
        verify = [w for w in batch.work if w.verify]
        if verify:
            self._run_verify(verify, rows)
        if decode:
            ids = np.asarray([w.token_ids[0] for w in decode], np.int64)
            assert all(len(w.token_ids) == 1 for w in decode), "decode work is one token per lane"
            h = self.net.forward_batch(ids, [self._lane_state(w.lane, w.start) for w in decode])
            for i, w in enumerate(decode):
                self._round_state(w.lane)
                self._record(w.lane, w.start, h[i : i + 1])
                rows[w.lane] = h[i]
        for w in batch.work:
            if w.save_checkpoint is not None:
                self._ckpts[w.save_checkpoint] = self._stored(self._states[w.lane].snapshot_gdn())
        out = [self.net.lm_head(rows[w.lane][None, :])[0] for w in batch.work if w.sample]
        for cid in batch.free_checkpoints:
            self._ckpts.pop(cid, None)
        self._logits = (
            np.stack(out).astype(np.float32, copy=False)
            if out
            else np.zeros((0, self.vocab_size), np.float32)
        )

    def sample(
        self, rows: Sequence[int], reqs: Sequence[SampleRequest], token_limit: int | None
    ) -> list[int]:
        return sample_host(self._logits[list(rows)], reqs, token_limit)

    # ---- speculative rounds (docs/speculative.md) -------------------------------------------------------
    def draft(self, lanes: Sequence[DraftLane]) -> None:
        assert self._drafter is not None, "draft() without spec"
        self._logits = self._drafter.draft(lanes)

    def verify(
        self,
        lanes: Sequence[int],
        drafts: Sequence[Sequence[int]],
        reqs: Sequence[Sequence[SampleRequest]],
        token_limit: int | None,
    ) -> list[list[int]]:
        assert self._drafter is not None, "verify() without spec"
        out = []
        for lane, d, r in zip(lanes, drafts, reqs, strict=True):
            _, target, _, _ = self._verify[lane]
            out.append(verify_lane(target, self._drafter.rows(lane, len(d)), d, r, token_limit))
        return out

    def commit(self, lane: int, length: int) -> None:
        assert self._drafter is not None, "commit() without spec"
        start, _, snaps, hiddens = self._verify.pop(lane)
        kept = length - start
        assert 0 <= kept < len(snaps), f"lane {lane}: commit to {length} outside the round from {start}"
        self._states[lane].restore_gdn(snaps[kept])  # snaps[j]: after j verified positions
        self._drafter.commit(lane, start, hiddens[:kept])

    def _run_verify(self, work: list[LaneWork], rows: dict[int, np.ndarray]) -> None:
        """The verify rounds: position ``j`` of every lane in one batched call (bitwise one decode step per
        position), the lane's state snapshotted after each; every position's logits kept."""
        snaps = {w.lane: [self._states[w.lane].snapshot_gdn()] for w in work}
        hid: dict[int, list[np.ndarray]] = {w.lane: [] for w in work}
        for j in range(max(len(w.token_ids) for w in work)):
            now = [w for w in work if len(w.token_ids) > j]
            ids = np.asarray([w.token_ids[j] for w in now], np.int64)
            h = self.net.forward_batch(ids, [self._lane_state(w.lane, w.start + j) for w in now])
            for i, w in enumerate(now):
                self._round_state(w.lane)
                snaps[w.lane].append(self._states[w.lane].snapshot_gdn())
                hid[w.lane].append(h[i])
        for w in work:
            logits = np.stack([self.net.lm_head(x[None, :])[0] for x in hid[w.lane]]).astype(np.float32)
            self._verify[w.lane] = (w.start, logits, snaps[w.lane], hid[w.lane])
            rows[w.lane] = hid[w.lane][-1]

    def _record(self, lane: int, start: int, h: np.ndarray) -> None:
        if self._drafter is not None:
            self._drafter.record(lane, start, h)

    def copies_done(self, wait: bool) -> list[tuple[int, float]]:
        """Restores are synchronous here: every ticket of the last ``execute`` is done."""
        done, self._done = self._done, []
        return done

    # ---- the host tier ----------------------------------------------------------------------------------
    def _spill(self, c: TierCopy) -> None:
        assert self.host_store is not None
        self.store.move(self.host_store, c.device_pages, c.host_pages)
        if c.host_ckpt:  # the snapshot object stands for the bytes of its host pages
            self._host_ckpts[c.host_ckpt[0]] = copy.deepcopy(self._ckpts[c.device_ckpt])
        if self.cfg.tier_checksum:
            for p in c.host_pages:
                self._digests["page", p] = self.host_store.digest(p)
            if c.host_ckpt:
                self._digests["ckpt", c.host_ckpt[0]] = _snapshot_digest(self._host_ckpts[c.host_ckpt[0]])

    def _restore(self, c: TierCopy) -> None:
        assert self.host_store is not None
        t0 = time.perf_counter()
        self.host_store.move(self.store, c.host_pages, c.device_pages)
        if c.host_ckpt:
            self._ckpts[c.device_ckpt] = copy.deepcopy(self._host_ckpts[c.host_ckpt[0]])
        if self.cfg.tier_checksum:
            self._check_restore(c)
        secs = time.perf_counter() - t0
        if self._done and self._done[-1][0] == c.ticket:  # one restore may be several nodes' copies
            secs += self._done.pop()[1]
        self._done.append((c.ticket, secs))

    def _check_restore(self, c: TierCopy) -> None:
        """``tier_checksum``: the restored pages and checkpoint are bitwise what was spilled."""
        for hp, dp in zip(c.host_pages, c.device_pages, strict=True):
            if self.store.digest(dp) != self._digests["page", hp]:
                raise RuntimeError(
                    f"host tier: page {dp} restored from host page {hp} differs from the spill"
                )
        if (
            c.host_ckpt
            and _snapshot_digest(self._ckpts[c.device_ckpt]) != self._digests["ckpt", c.host_ckpt[0]]
        ):
            raise RuntimeError(f"host tier: checkpoint {c.device_ckpt} differs from the spill")

    # ---- lanes and checkpoints --------------------------------------------------------------------------
    def _new_state(self, pages: list[int]) -> Any:
        return self.net.new_state(kv=self._view(self.store, pages))

    def _lane_state(self, lane: int, start: int) -> Any:
        state = self._states[lane]
        if state is None or state.length != start:
            raise AssertionError(
                f"lane {lane}: work starts at {start}, state holds {getattr(state, 'length', None)}"
            )
        return state

    def _setup(self, s: LaneSetup) -> None:
        if s.copy_page is not None:
            self.store.copy(*s.copy_page)
        state = self._new_state(s.pages)
        if s.restore is not None:
            snap = self._ckpts[s.restore]
            assert snap.length == s.length, "checkpoint length disagrees with the planned resume point"
            state.restore_gdn(self._loaded(snap))
        self._states[s.lane] = state
        if self._drafter is not None:
            self._drafter.setup(s.lane, s.pages, s.length)

    def _round_state(self, lane: int) -> None:
        if self._bf16_state:
            state = self._states[lane]
            state.conv = [bf16_round(c) for c in state.conv]
            state.rec = [bf16_round(r) for r in state.rec]

    def _stored(self, snap: Any) -> Any:
        """A snapshot as kept between steps: GDN ``conv``/``rec`` as bf16 words when so configured."""
        if not self._bf16_state:
            return snap
        return dataclasses.replace(
            snap, conv=tuple(bf16_encode(c) for c in snap.conv), rec=tuple(bf16_encode(r) for r in snap.rec)
        )

    def _loaded(self, snap: Any) -> Any:
        if not self._bf16_state:
            return snap
        return dataclasses.replace(
            snap, conv=tuple(bf16_decode(c) for c in snap.conv), rec=tuple(bf16_decode(r) for r in snap.rec)
        )


def _check_spec(net: Any, mc: ModelConfig, cfg: EngineConfig) -> None:
    """``spec="mtp"`` needs the artifact's MTP head and a target whose drafting this runner implements."""
    if cfg.num_draft == 0:
        return
    if mc.arch not in ("qwen3_5", "qwen3_5_moe"):
        raise EngineConfigError(
            f"spec: MTP drafting is implemented for Qwen3.6-family targets, not {mc.arch}"
        )
    if not getattr(net, "has_mtp", False):
        raise EngineConfigError("spec: 'mtp' needs an artifact with MTP weights (mtp.*); this one has none")
