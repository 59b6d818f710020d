"""MTP draft head of the Qwen3.6 family (docs/model-math.md §6), composed from ``ops`` and ``layers``.

    u = mtp.fc([RMSNormOff(embed(x_{t+1}), pre_fc_norm_embedding) ‖ RMSNormOff(h_t, pre_fc_norm_hidden)])
    u = decoder layer mtp.layers.0 (gated full attention + the model's FFN), own 1-layer KV cache
    d = RMSNormOff(u, mtp.norm);  logits = lm_head(d)     (shared embedding and lm_head)

Prefill alignment is the caller's: tokens shift left, hidden states and positions do not.
"""

from __future__ import annotations

import numpy as np

from ninfer.config import ModelConfig
from ninfer.reference import ops
from ninfer.reference.kv import SequenceState
from ninfer.reference.layers import decoder_layer
from ninfer.reference.weights import CachedWeights, mtp_shapes

__all__ = ["mtp_hidden"]


def mtp_hidden(
    w: CachedWeights,
    cfg: ModelConfig,
    hidden_final: np.ndarray,
    next_ids: np.ndarray,
    positions: np.ndarray,
    state: SequenceState,
) -> np.ndarray:
    """MTP output ``d[T,H]`` for target hiddens ``[T,H]``, next tokens ``[T]``, positions ``[3,T]``."""
    if cfg.mtp_num_hidden_layers > 1:
        raise NotImplementedError(
            f"mtp_num_hidden_layers={cfg.mtp_num_hidden_layers}: only one MTP layer is defined"
        )
    w.require(mtp_shapes(cfg), "MTP head")
    h = np.asarray(hidden_final, dtype=np.float32)
    if h.shape != (next_ids.shape[0], cfg.hidden_size):
        raise ValueError(
            f"hidden_final: expected [{next_ids.shape[0]},{cfg.hidden_size}], got {list(h.shape)}"
        )
    eps = cfg.rms_norm_eps
    e = ops.rmsnorm_offset(
        ops.embedding(w("embed_tokens.weight"), next_ids), w("mtp.pre_fc_norm_embedding.weight"), eps
    )
    hn = ops.rmsnorm_offset(h, w("mtp.pre_fc_norm_hidden.weight"), eps)
    u = ops.linear(np.concatenate([e, hn], axis=-1), w("mtp.fc.weight"))
    rope = ops.rope_cos_sin(
        positions, cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section, cfg.mrope_interleaved
    )
    segments = [(state, slice(0, u.shape[0]))]
    u = decoder_layer(w, cfg, "mtp.layers.0.", "full_attention", u, segments, 0, rope)
    state.length += u.shape[0]
    return ops.rmsnorm_offset(u, w("mtp.norm.weight"), eps)
