"""The Qwen3.6-family text model (dense ``qwen3_5`` and MoE ``qwen3_5_moe``) as a composition of ``ops``.

    model = Qwen36(cfg, weights)
    state = model.new_state()
    h = model.forward(token_ids, state)          # final-normed hidden [T,H]; state.length += T
    logits = model.lm_head(h)                    # [T,V]

``forward`` with T>1 runs the chunked GDN form, T==1 the recurrent step; ``forward_batch`` runs one token for
each of B independent sequences and gives every row bitwise what ``forward`` gives that sequence alone.
Weights are fetched from the ``WeightSource`` once, on first use, and kept as float32 (``CachedWeights``).
A call that raises may leave ``state`` partly advanced; callers that need atomicity snapshot it first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ninfer.config import ModelConfig
from ninfer.reference import ops
from ninfer.reference.kv import ContiguousKV, KVCache, SequenceState
from ninfer.reference.layers import Segment, decoder_layer
from ninfer.reference.mtp import mtp_hidden
from ninfer.reference.weights import CachedWeights, WeightSource, expected_shapes, lm_head_name

__all__ = ["Qwen36", "text_positions"]


def text_positions(start: int, length: int) -> np.ndarray:
    """MRoPE positions ``[3,T]`` of plain text: T=H=W=start..start+length-1."""
    return np.broadcast_to(np.arange(start, start + length, dtype=np.int64), (3, length))


def _positions(positions: np.ndarray | None, start: int, t: int) -> np.ndarray:
    if positions is None:
        return text_positions(start, t)
    pos = np.asarray(positions)
    if pos.ndim == 1:
        pos = np.broadcast_to(pos, (3, pos.shape[0]))
    if pos.shape != (3, t) or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(
            f"positions: expected integer [3,{t}] (T, H, W rows) or [{t}], got {list(pos.shape)} {pos.dtype}"
        )
    return pos


class Qwen36:
    """NumPy fp32 reference of one Qwen3.6-family text model plus its MTP head."""

    def __init__(self, cfg: ModelConfig, weights: WeightSource) -> None:
        self.cfg = cfg
        self.weights = CachedWeights(weights, expected_shapes(cfg, mtp=True))
        self.weights.require(expected_shapes(cfg, mtp=False), f"{cfg.arch} text model")
        # index of each layer among the layers of its kind: GDN state slot or KV-cache attn_idx
        self._mixer_idx = [cfg.layer_types[:i].count(kind) for i, kind in enumerate(cfg.layer_types)]

    # ---- state ------------------------------------------------------------------------------------------
    def new_state(self, kv: KVCache | None = None) -> SequenceState:
        """Empty sequence: zero GDN state; ``kv`` defaults to a ``ContiguousKV`` over the attention layers."""
        return SequenceState.empty(self.cfg, kv)

    def new_mtp_state(self, kv: KVCache | None = None) -> SequenceState:
        """Empty MTP-head state: its own 1-layer KV cache (attn_idx 0), no GDN state."""
        if kv is None:
            kv = ContiguousKV(1, self.cfg.num_key_value_heads, self.cfg.head_dim)
        return SequenceState(kv=kv)

    # ---- target model -----------------------------------------------------------------------------------
    def forward(
        self, token_ids: Sequence[int] | np.ndarray, state: SequenceState, positions: np.ndarray | None = None
    ) -> np.ndarray:
        """Append ``token_ids[T]`` to ``state``; returns the final-normed hidden ``[T,H]`` float32.

        ``positions``: optional MRoPE ids ``[3,T]`` (default: text positions state.length..).
        """
        ids = self.cfg.token_ids(token_ids)
        pos = _positions(positions, state.length, ids.shape[0])
        return self._run(ids, [(state, slice(0, ids.shape[0]))], pos)

    def forward_batch(
        self, token_ids: Sequence[int] | np.ndarray, states: Sequence[SequenceState]
    ) -> np.ndarray:
        """One new token for each of B independent sequences (text positions); returns hidden ``[B,H]``.

        Row b is bitwise ``forward([token_ids[b]], states[b])``: projections, norms and FFN run batched but
        row-independently (``ops`` module docstring), the stateful parts run per sequence.
        """
        ids = self.cfg.token_ids(token_ids)
        if len(states) != ids.shape[0]:
            raise ValueError(f"forward_batch: {ids.shape[0]} token ids for {len(states)} states")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("forward_batch: the same SequenceState appears twice in one batch")
        pos = text_positions(0, 1) + np.array([s.length for s in states], dtype=np.int64)
        return self._run(ids, [(s, slice(b, b + 1)) for b, s in enumerate(states)], pos)

    def lm_head(self, h: np.ndarray) -> np.ndarray:
        """Logits ``[T,V]`` of final-normed hidden ``[T,H]`` (row independent)."""
        return ops.lm_head(np.asarray(h, dtype=np.float32), self.weights(lm_head_name(self.cfg)))

    def _run(self, ids: np.ndarray, segments: Sequence[Segment], pos: np.ndarray) -> np.ndarray:
        cfg, w = self.cfg, self.weights
        rope = ops.rope_cos_sin(pos, cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section, cfg.mrope_interleaved)
        x = ops.embedding(w("embed_tokens.weight"), ids)
        for i, kind in enumerate(cfg.layer_types):
            x = decoder_layer(w, cfg, f"layers.{i}.", kind, x, segments, self._mixer_idx[i], rope)
        for state, rows in segments:
            state.length += rows.stop - rows.start
        return ops.rmsnorm_offset(x, w("norm.weight"), cfg.rms_norm_eps)

    # ---- MTP head (§6) ----------------------------------------------------------------------------------
    @property
    def has_mtp(self) -> bool:
        return "mtp.fc.weight" in self.weights.source

    def mtp_hidden(
        self,
        hidden_final: np.ndarray,
        next_token_ids: Sequence[int] | np.ndarray,
        positions: np.ndarray | None,
        mtp_state: SequenceState,
    ) -> np.ndarray:
        """MTP output ``d[T,H]`` (after mtp.norm): the hidden a further draft step feeds back in."""
        ids = self.cfg.token_ids(next_token_ids)
        pos = _positions(positions, mtp_state.length, ids.shape[0])
        return mtp_hidden(self.weights, self.cfg, hidden_final, ids, pos, mtp_state)

    def mtp_forward(
        self,
        hidden_final: np.ndarray,
        next_token_ids: Sequence[int] | np.ndarray,
        positions: np.ndarray | None,
        mtp_state: SequenceState,
    ) -> np.ndarray:
        """Draft logits ``[T,V]``: row t predicts x_{t+2} from target hidden h_t and token x_{t+1} (§6).

        ``positions`` are those of the hidden states (default: mtp_state.length..); advances mtp_state.length.
        """
        return self.lm_head(self.mtp_hidden(hidden_final, next_token_ids, positions, mtp_state))
