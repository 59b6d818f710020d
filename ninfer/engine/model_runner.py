"""The model runner: the only engine part that touches the model and its memory (KV pages, GDN state).

Contract (the CUDA backend implements the same, against device memory):

- ``ModelRunner(net, model_config, engine_config)``; ``snapshot_bytes`` (one GDN checkpoint in the configured
  state dtype) and ``vocab_size`` are known after construction.
- ``execute(batch) -> logits[n, V] float32``: apply ``batch.setups`` (page table, GDN restore or zero state, the
  boundary page copy), run every ``LaneWork`` (prefill lanes one forward call each, decode lanes in one batched
  call), snapshot the GDN state of work that asks for it, then release ``batch.free_checkpoints``. Rows of the
  result are the work items with ``sample=True``, in batch order.
- A lane's result never depends on which other lanes share the step: prefill lanes run alone, decode rows are
  bitwise equal to solo calls (the reference's ``forward_batch`` guarantees it) and ``lm_head`` runs per row.

This reference runner stores KV pages in their storage format (bf16 words, or e4m3 codes with one float32 scale
per token and KV head) and widens on read; GDN state is rounded to bf16 after every call when configured.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.config import ModelConfig
from ninfer.formats import bf16_decode, bf16_encode, bf16_round, e4m3_decode, e4m3_encode

from .config import EngineConfig
from .core import Batch, LaneSetup

__all__ = ["ModelRunner", "PagedKVStore", "PagedKV"]


class PagedKVStore:
    """K/V of every full-attention layer: ``[num_pages, page_size, Hkv, D]`` in the storage format."""

    def __init__(self, mc: ModelConfig, num_pages: int, page_size: int, dtype: str) -> None:
        n_attn = len(mc.full_attention_layers)
        shape = (num_pages, page_size, mc.num_key_value_heads, mc.head_dim)
        self.page_size, self.fp8 = page_size, dtype == "fp8"
        word = np.uint8 if self.fp8 else np.uint16
        self.k = [np.zeros(shape, word) for _ in range(n_attn)]
        self.v = [np.zeros(shape, word) for _ in range(n_attn)]
        self.k_scale = [np.zeros(shape[:3], np.float32) for _ in range(n_attn)] if self.fp8 else []
        self.v_scale = [np.zeros(shape[:3], np.float32) for _ in range(n_attn)] if self.fp8 else []

    @property
    def bytes_per_token(self) -> int:
        per = sum(a[0, 0].nbytes for a in self.k + self.v + self.k_scale + self.v_scale)
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

    def copy(self, src: int, dst: int, n: int) -> None:
        for arrs in (self.k, self.v, self.k_scale, self.v_scale):
            for a in arrs:
                a[dst, :n] = a[src, :n]


class PagedKV:
    """One lane's view of the store through its page table (the reference model's ``KVCache`` seam)."""

    def __init__(self, store: PagedKVStore, pages: list[int]) -> None:
        self._store, self._pages = store, np.asarray(pages, dtype=np.int64)

    def write(self, attn_idx: int, start_pos: int, k: np.ndarray, v: np.ndarray) -> None:
        if start_pos + k.shape[0] > self._pages.size * self._store.page_size:
            raise ValueError(f"KV write past the lane's reservation ({self._pages.size} pages)")
        self._store.write(self._pages, attn_idx, start_pos, k, v)

    def read(self, attn_idx: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        return self._store.read(self._pages, attn_idx, length)


class ModelRunner:
    def __init__(self, net: Any, model_config: ModelConfig, cfg: EngineConfig) -> None:
        self.net, self.mc, self.cfg = net, model_config, cfg
        self.store = PagedKVStore(model_config, cfg.num_pages, cfg.page_size, cfg.kv_dtype)
        self._bf16_state = cfg.gdn_state_dtype == "bf16"
        self._states: list[Any] = [None] * cfg.max_concurrency
        self._ckpts: dict[int, tuple[int, list[np.ndarray], list[np.ndarray]]] = {}
        conv = model_config.gdn_conv_channels * (model_config.linear_conv_kernel_dim - 1)
        rec = model_config.linear_num_value_heads * model_config.linear_key_head_dim
        rec *= model_config.linear_value_head_dim
        per_elem = 2 if self._bf16_state else 4
        self.snapshot_bytes = len(model_config.linear_attention_layers) * (conv + rec) * per_elem
        self.vocab_size = model_config.vocab_size

    @property
    def num_checkpoints(self) -> int:
        return len(self._ckpts)

    def execute(self, batch: Batch) -> np.ndarray:
        for s in batch.setups:
            self._setup(s)
        rows: dict[int, np.ndarray] = {}
        for w in batch.work:
            if w.prefill:
                h = self.net.forward(np.asarray(w.token_ids, np.int64), self._lane_state(w.lane, w.start))
                self._round_state(w.lane)
                rows[w.lane] = h[-1]
        decode = [w for w in batch.work if not w.prefill]
        if decode:
            ids = np.asarray([w.token_ids[0] for w in decode], np.int64)
            assert all(len(w.token_ids) == 1 for w in decode), "decode work is one token per lane"
            h = self.net.forward_batch(ids, [self._lane_state(w.lane, w.start) for w in decode])
            for i, w in enumerate(decode):
                self._round_state(w.lane)
                rows[w.lane] = h[i]
        for w in batch.work:
            if w.save_checkpoint is not None:
                self._save(w.lane, w.save_checkpoint)
        out = [self.net.lm_head(rows[w.lane][None, :])[0] for w in batch.work if w.sample]
        for cid in batch.free_checkpoints:
            self._ckpts.pop(cid, None)
        if not out:
            return np.zeros((0, self.vocab_size), np.float32)
        return np.stack(out).astype(np.float32, copy=False)

    # ---- lanes and checkpoints --------------------------------------------------------------------------
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
        state = self.net.new_state(kv=PagedKV(self.store, s.pages))
        if s.restore is not None:
            length, conv, rec = self._ckpts[s.restore]
            assert length == s.length, "checkpoint length disagrees with the planned resume point"
            if self._bf16_state:
                conv, rec = [bf16_decode(c) for c in conv], [bf16_decode(r) for r in rec]
            state.conv, state.rec = [c.copy() for c in conv], [r.copy() for r in rec]
            state.length = length
        self._states[s.lane] = state

    def _round_state(self, lane: int) -> None:
        if self._bf16_state:
            state = self._states[lane]
            state.conv = [bf16_round(c) for c in state.conv]
            state.rec = [bf16_round(r) for r in state.rec]

    def _save(self, lane: int, cid: int) -> None:
        state = self._states[lane]
        if self._bf16_state:
            conv, rec = [bf16_encode(c) for c in state.conv], [bf16_encode(r) for r in state.rec]
        else:
            conv, rec = [c.copy() for c in state.conv], [r.copy() for r in state.rec]
        self._ckpts[cid] = (state.length, conv, rec)
