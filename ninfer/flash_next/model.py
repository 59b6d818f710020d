"""FlashNext: the NumPy reference model of Qwen3.8-Flash-Next (``qwen4_exp``), same interface as ``Qwen36``.

```python
model = FlashNext(cfg, weights)             # weights: WeightSource (canonical names, float32 on get)
state = model.new_state(kv=None)            # FlashNextState; kv defaults to ContiguousKV over the QSA layers
h = model.forward(token_ids, state)         # collapsed hidden [T, D]; state.length += T
logits = model.lm_head(h)                   # [T, V]
h, streams = model.forward_streams(ids, s)  # also the pre-mixer 4-stream state [T, S·D] (the MTP input)
snap = state.snapshot_gdn(); state.restore_gdn(snap)
```
Layer i: [PLE] -> Mix_attn -> GDN | QSA -> Combine -> Mix_mlp -> MoE -> Combine (docs/flash-next.md §3); no norms
outside the hyper-connections; the final mixer collapses the 4 streams straight into lm_head.

N-gram rows are read through ``weights.get_rows(name, row_ids) -> float32 [n, row_dim]`` when the source offers
it (an artifact serves them from its memory-mapped region without loading the table); otherwise the table is
fetched once with ``get``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ninfer.flash_next import ops as fops
from ninfer.flash_next.config import FlashNextConfig
from ninfer.flash_next.layers import QsaCaches, Rope, SelectHook, gdn_block, moe_block, ple_block, qsa_block
from ninfer.flash_next.names import expected_shapes, ngram_table_name
from ninfer.flash_next.ops_ngram import (
    ngram_context_after,
    ngram_multipliers,
    ngram_row_ids,
    ngram_shifted_ids,
)
from ninfer.flash_next.state import FlashNextState
from ninfer.reference import ops
from ninfer.reference.kv import KVCache
from ninfer.reference.weights import CachedWeights, WeightError, WeightSource, lm_head_name

__all__ = ["FlashNext", "MTP_ATTN_IDX"]

F32 = np.float32
MTP_ATTN_IDX = 0  # the MTP head's own one-layer caches


def _check_text_positions(positions: np.ndarray, start: int, t: int) -> None:
    pos = np.asarray(positions)
    want = np.arange(start, start + t)
    rows = pos.reshape(-1, t) if pos.size in (t, 3 * t) else None
    if rows is None or rows.shape[0] not in (1, 3) or not all(np.array_equal(r, want) for r in rows):
        raise ValueError(
            f"positions: the Flash-Next reference runs text only; expected {start}..{start + t - 1}"
        )


class FlashNext:
    def __init__(
        self, cfg: FlashNextConfig, weights: WeightSource, *, select_hook: SelectHook | None = None
    ) -> None:
        self.cfg = cfg
        self.src = weights
        shapes = expected_shapes(cfg, mtp=False)
        self._tables = {ngram_table_name(i): shapes.pop(ngram_table_name(i)) for i in cfg.ple_layers}
        self._has_mtp = "mtp.fc_hidden.weight" in weights
        if self._has_mtp:
            shapes.update(expected_shapes(cfg, mtp=True))
            for name in self._tables:
                shapes.pop(name, None)
        self.w = CachedWeights(weights, shapes)
        self.w.require(shapes, "qwen4_exp text model")
        self.w.require(self._tables, "n-gram table")
        self.rope = Rope(cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section)
        self.select_hook = select_hook
        self._table_cache: dict[str, np.ndarray] = {}  # fallback when the source has no get_rows
        self._mult = [
            ngram_multipliers(cfg.vocab_size, cfg.ngram_size, r, cfg.seed) for r in range(len(cfg.ple_layers))
        ]
        self._head_sizes = [np.array(cfg.ngram_head_sizes(r), np.int64) for r in range(len(cfg.ple_layers))]
        self._head_offs = [np.array(cfg.ngram_head_offsets(r), np.int64) for r in range(len(cfg.ple_layers))]

    @property
    def has_mtp(self) -> bool:
        return self._has_mtp

    # ---- state ----------------------------------------------------------------------------------------------
    def new_state(self, kv: KVCache | None = None) -> FlashNextState:
        return FlashNextState.empty(self.cfg, kv)

    def new_mtp_state(self, kv: KVCache | None = None) -> FlashNextState:
        """The MTP head's own caches: one QSA layer (attn_idx 0), no GDN/PLE state."""
        return FlashNextState.empty(self.cfg, kv, n_qsa=1)

    # ---- weights --------------------------------------------------------------------------------------------
    def _embed(self, ids: np.ndarray) -> np.ndarray:
        return ops.embedding(self.w("embed_tokens.weight"), ids)

    def ngram_rows(self, name: str, row_ids: np.ndarray) -> np.ndarray:
        """Rows ``[n, row_dim]`` of an n-gram table, via ``get_rows`` when the weight source has it."""
        flat = np.asarray(row_ids, np.int64).reshape(-1)
        rows, dim = self._tables[name]
        if flat.size and (flat.min() < 0 or flat.max() >= rows):
            raise WeightError(f"{name}: row id outside [0, {rows})")
        get_rows = getattr(self.src, "get_rows", None)
        if get_rows is not None:
            out = np.asarray(get_rows(name, flat), dtype=F32)
        else:
            out = self._full_table(name)[flat]
        if out.shape != (flat.size, dim):
            raise WeightError(
                f"{name}: get_rows returned shape {list(out.shape)}, expected {[flat.size, dim]}"
            )
        return out

    def _full_table(self, name: str) -> np.ndarray:
        cached = self._table_cache
        if name not in cached:
            arr = np.ascontiguousarray(self.src.get(name), dtype=F32)
            if arr.shape != self._tables[name]:
                raise WeightError(f"{name}: shape {list(arr.shape)}, expected {list(self._tables[name])}")
            cached[name] = arr
        return cached[name]

    # ---- forward --------------------------------------------------------------------------------------------
    def _check_ids(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.cfg.token_ids(token_ids)

    def _hc(self, prefix: str, h: np.ndarray, inject: bool) -> tuple[np.ndarray, np.ndarray | None]:
        w = self.w
        return fops.hc_mix(
            h, w(prefix + "hc_norm.weight"), w(prefix + "input_mix_weight_down.weight"),
            w(prefix + "input_mix_weight_up.weight"), w(prefix + "block_inject_weight.weight") if inject else None,
            self.cfg.hc_count, self.cfg.rms_norm_eps,
        )  # fmt: skip

    def _ple_embedding(self, rank: int, shifted: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        rows = ngram_row_ids(
            shifted, self._mult[rank], self._head_sizes[rank], self._head_offs[rank], cfg.heads_per_ngram
        )
        layer = cfg.ple_layers[rank]
        e = self.ngram_rows(ngram_table_name(layer), rows)
        return e.reshape(rows.shape[0], cfg.ple_dim)

    def _layer(
        self, i: int, h: np.ndarray, state: FlashNextState, start: int, shifted: np.ndarray
    ) -> np.ndarray:
        cfg, p = self.cfg, f"layers.{i}."
        if i in cfg.ple_layers:
            rank = cfg.ple_layers.index(i)
            upd, state.ple_conv[rank] = ple_block(
                cfg, self.w, p, h, self._ple_embedding(rank, shifted), state.ple_conv[rank]
            )
            h = (h + upd).astype(F32, copy=False)
        x, inj = self._hc(p + "attn_hyper_connection.", h, True)
        if cfg.layer_types[i] == "linear_attention":
            j = cfg.gdn_layers.index(i)
            y, state.conv[j], state.rec[j] = gdn_block(cfg, self.w, p, x, state.conv[j], state.rec[j])
        else:
            j = cfg.qsa_layers.index(i)
            y = self._qsa(p, x, start, state, j)
        h = fops.hc_combine(h, y, inj)
        x, inj = self._hc(p + "mlp_hyper_connection.", h, True)
        return fops.hc_combine(h, moe_block(cfg, self.w, p, x), inj)

    def _qsa(self, p: str, x: np.ndarray, start: int, state: FlashNextState, j: int) -> np.ndarray:
        caches = QsaCaches(kv=state.kv, index=state.index_store, attn_idx=j, open_keys=state.open_keys[j])
        y = qsa_block(self.cfg, self.w, p, self.rope, x, start, caches, self.select_hook)
        state.open_keys[j] = caches.open_keys
        return y

    def forward_streams(
        self, token_ids: Sequence[int] | np.ndarray, state: FlashNextState
    ) -> tuple[np.ndarray, np.ndarray]:
        """Append tokens at positions state.length..; returns (collapsed hidden ``[T, D]``, pre-mixer streams
        ``[T, S·D]``) and advances ``state.length`` and the n-gram context."""
        cfg = self.cfg
        ids = self._check_ids(token_ids)
        start = state.length
        shifted = (
            ngram_shifted_ids(state.ngram_ctx, ids, cfg.pad_token_id, cfg.ngram_size)
            if cfg.ple_layers
            else None
        )
        h = fops.hc_expand(self._embed(ids), cfg.hc_count)
        for i in range(cfg.num_hidden_layers):
            h = self._layer(i, h, state, start, shifted)  # type: ignore[arg-type]
        out, _ = self._hc("hyper_connection_mixer.", h, False)
        if cfg.ple_layers:
            state.ngram_ctx = ngram_context_after(state.ngram_ctx, ids)
        state.length = start + ids.size
        return out, h

    def forward(
        self,
        token_ids: Sequence[int] | np.ndarray,
        state: FlashNextState,
        positions: np.ndarray | None = None,
    ) -> np.ndarray:
        """Append ``token_ids[T]``; returns the collapsed hidden ``[T, D]``. ``positions`` (``[T]`` or ``[3, T]``)
        may only restate the text positions state.length..: the reference runs text (vision is not here)."""
        if positions is not None:
            _check_text_positions(positions, state.length, np.asarray(token_ids).size)
        return self.forward_streams(token_ids, state)[0]

    def forward_batch(
        self, token_ids: Sequence[int] | np.ndarray, states: Sequence[FlashNextState]
    ) -> np.ndarray:
        """One new token for each of B independent sequences; returns hidden ``[B, D]``. Row b is bitwise
        ``forward([token_ids[b]], states[b])`` (the reference runs the sequences one after another)."""
        ids = self._check_ids(token_ids)
        if len(states) != ids.size:
            raise ValueError(f"forward_batch: {ids.size} token ids for {len(states)} states")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("forward_batch: the same state appears twice in one batch")
        return np.concatenate([self.forward(ids[b : b + 1], st) for b, st in enumerate(states)], axis=0)

    def lm_head(self, h: np.ndarray) -> np.ndarray:
        return ops.lm_head(h, self.w(lm_head_name(self.cfg)))

    def logits(self, token_ids: Sequence[int] | np.ndarray, prefill_chunk: int | None = None) -> np.ndarray:
        """Full-sequence logits ``[T, V]`` from a fresh state, prefilling in chunks of ``prefill_chunk`` tokens."""
        ids = self._check_ids(token_ids)
        state = self.new_state()
        step = prefill_chunk or ids.size
        return np.concatenate(
            [self.lm_head(self.forward(ids[s : s + step], state)) for s in range(0, ids.size, step)]
        )

    # ---- MTP head (§8) --------------------------------------------------------------------------------------
    def mtp_forward_full(
        self,
        streams: np.ndarray,
        next_token_ids: Sequence[int] | np.ndarray,
        positions: np.ndarray | None,
        mtp_state: FlashNextState,
    ) -> tuple[np.ndarray, np.ndarray]:
        """MTP rows for target pre-mixer states ``streams[T, S·D]`` of positions p and the tokens at p+1.

        Row t runs at position ``positions[t]`` (default mtp_state.length + t; they must be contiguous from
        mtp_state.length, the MTP cache row); returns (logits ``[T, V]``, the MTP's own pre-mixer streams, the
        input of a further draft step).
        """
        if not self._has_mtp:
            raise WeightError("mtp.fc_hidden.weight: this model's weights have no MTP head")
        cfg, w = self.cfg, self.w
        ids = self._check_ids(next_token_ids)
        start = mtp_state.length
        expect = start + np.arange(ids.size)
        if positions is not None and not np.array_equal(np.asarray(positions).reshape(-1), expect):
            raise ValueError(f"mtp positions must be {start}..{start + ids.size - 1} (the MTP cache rows)")
        if streams.shape != (ids.size, cfg.hc_dim):
            raise ValueError(f"mtp streams: shape {list(streams.shape)}, expected {[ids.size, cfg.hc_dim]}")
        h = fops.mtp_fuse_input(
            streams.astype(F32), self._embed(ids), w("mtp.pre_fc_norm_hidden.weight"),
            w("mtp.pre_fc_norm_embedding.weight"), w("mtp.fc_hidden.weight"), w("mtp.fc_embedding.weight"),
            cfg.hc_count, cfg.rms_norm_eps,
        )  # fmt: skip
        p = "mtp.layers.0."
        x, inj = self._hc(p + "attn_hyper_connection.", h, True)
        h = fops.hc_combine(h, self._qsa(p, x, start, mtp_state, MTP_ATTN_IDX), inj)
        x, inj = self._hc(p + "mlp_hyper_connection.", h, True)
        h = fops.hc_combine(h, moe_block(cfg, w, p, x), inj)
        out, _ = self._hc("mtp.hyper_connection_mixer.", h, False)
        mtp_state.length = start + ids.size
        return self.lm_head(out), h

    def mtp_forward(
        self,
        streams: np.ndarray,
        next_token_ids: Sequence[int] | np.ndarray,
        positions: np.ndarray | None,
        mtp_state: FlashNextState,
    ) -> np.ndarray:
        return self.mtp_forward_full(streams, next_token_ids, positions, mtp_state)[0]
