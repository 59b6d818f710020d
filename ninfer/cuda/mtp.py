"""The MTP head on the device (docs/model-math.md §6) with the model's own kernels: ``mtp_hidden`` (eager, packed
segments) and ``mtp_body`` (device ids and a ``Meta``: graph-capturable, ``spec_graphs.DraftGraphs``). Its attention
layer keeps KV in the extra plane ``len(full_attention_layers)`` of the device page pool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["mtp_hidden", "mtp_body"]

F32 = np.float32


def mtp_hidden(net: Any, hidden: Any, ids: Any, segs: Sequence[tuple[int, int, int, list[int]]]) -> Any:
    """MTP outputs ``d[T, H]`` float32 (after ``mtp.norm``) for target hiddens ``[T, H]`` and next tokens ``ids``
    (host, or an int32 device array); ``segs``: packed ``(slot, start, n, pages)``, ``start`` the position of the
    segment's first hidden."""
    from ninfer.cuda.model_graph import Meta, host_meta

    with net.stream:
        m = Meta.from_host(host_meta(segs, net.pool[2], net.pool[3]), net.attn_chunk)
        return mtp_body(net, hidden, m.ids_from(ids) if isinstance(ids, np.ndarray) else ids, m)


def mtp_body(net: Any, hidden: Any, ids: Any, m: Any) -> Any:
    """``mtp_hidden`` over device token ids and a ``Meta`` (on the current stream; graph-capturable)."""
    import cupy

    from ninfer.cuda.embedding import embed
    from ninfer.cuda.model_layers import attention_block, ffn_block, linear
    from ninfer.cuda.norm import rmsnorm

    cfg, w, eps = net.cfg, net.w, net.cfg.rms_norm_eps
    p, j = "mtp.layers.0.", len(cfg.full_attention_layers)
    e = rmsnorm(embed(w["embed_tokens.weight"], ids, dtype=F32), w["mtp.pre_fc_norm_embedding.weight"], eps)
    hn = rmsnorm(cupy.ascontiguousarray(hidden, dtype=F32), w["mtp.pre_fc_norm_hidden.weight"], eps)
    u = linear(net, cupy.ascontiguousarray(cupy.concatenate([e, hn], axis=1)), "mtp.fc.weight", exact=True)
    res = cupy.zeros((m.t, cfg.hidden_size), F32)
    h = rmsnorm(u, w[p + "input_layernorm.weight"], eps, residual=res)
    mixed = attention_block(net, p, h, m, j)
    h = rmsnorm(mixed, w[p + "post_attention_layernorm.weight"], eps, residual=res)
    res += ffn_block(net, p, h, m)
    return rmsnorm(res, w["mtp.norm.weight"], eps)
