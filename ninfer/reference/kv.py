"""Per-sequence state of the reference model: KV cache seam, GDN conv/recurrent state, snapshots.

The KV cache is reached only through ``write``/``read`` (docs/contracts.md), so the engine can supply a paged
implementation; ``ContiguousKV`` is the plain one. ``attn_idx`` is the ordinal of a full-attention layer among the
full-attention layers (0 for the first), not its layer index; the MTP head uses its own 1-layer cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ninfer.config import ModelConfig

__all__ = ["KVCache", "ContiguousKV", "SequenceState", "GdnSnapshot"]

F32 = np.float32


@runtime_checkable
class KVCache(Protocol):
    def write(self, attn_idx: int, start_pos: int, k: np.ndarray, v: np.ndarray) -> None: ...

    def read(self, attn_idx: int, length: int) -> tuple[np.ndarray, np.ndarray]: ...


class ContiguousKV:
    """Growable contiguous fp32 K/V per attention layer, ``[capacity, Hkv, D]``; capacity doubles as needed.

    Writing at ``start_pos`` overwrites rows start_pos.. (rewinding a sequence is just writing at an earlier
    position); ``read`` returns views of rows 0..length-1, valid until the next write.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int = 64) -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        shape = (max(1, capacity), n_kv_heads, head_dim)
        self._k = [np.zeros(shape, F32) for _ in range(n_layers)]
        self._v = [np.zeros(shape, F32) for _ in range(n_layers)]
        self._filled = [0] * n_layers  # rows ever written contiguously from 0

    def _check_layer(self, attn_idx: int) -> None:
        if not 0 <= attn_idx < self.n_layers:
            raise IndexError(
                f"attn_idx {attn_idx} out of range: this cache has {self.n_layers} attention layers"
            )

    def write(self, attn_idx: int, start_pos: int, k: np.ndarray, v: np.ndarray) -> None:
        self._check_layer(attn_idx)
        if start_pos > self._filled[attn_idx]:
            raise ValueError(
                f"KV write at {start_pos} would leave a gap: layer {attn_idx} holds {self._filled[attn_idx]} rows"
            )
        end = start_pos + k.shape[0]
        cap = self._k[attn_idx].shape[0]
        if end > cap:
            new_cap = max(end, 2 * cap)
            for buf in (self._k, self._v):
                grown = np.zeros((new_cap, self.n_kv_heads, self.head_dim), F32)
                grown[:cap] = buf[attn_idx]
                buf[attn_idx] = grown
        self._k[attn_idx][start_pos:end] = k
        self._v[attn_idx][start_pos:end] = v
        self._filled[attn_idx] = max(self._filled[attn_idx], end)

    def read(self, attn_idx: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        self._check_layer(attn_idx)
        if length > self._filled[attn_idx]:
            raise ValueError(
                f"KV read of {length} rows: layer {attn_idx} holds only {self._filled[attn_idx]}"
            )
        return self._k[attn_idx][:length], self._v[attn_idx][:length]

    def clone(self) -> ContiguousKV:
        out = ContiguousKV.__new__(ContiguousKV)
        out.n_layers, out.n_kv_heads, out.head_dim = self.n_layers, self.n_kv_heads, self.head_dim
        out._k = [a.copy() for a in self._k]
        out._v = [a.copy() for a in self._v]
        out._filled = list(self._filled)
        return out


@dataclass(frozen=True, slots=True)
class GdnSnapshot:
    """Deep copy of every GDN layer's conv window and recurrent state, with the length they belong to."""

    length: int
    conv: tuple[np.ndarray, ...]
    rec: tuple[np.ndarray, ...]


@dataclass(slots=True)
class SequenceState:
    """Everything one sequence carries between forward calls.

    ``conv[j]``: ``[C, K−1]`` raw pre-conv inputs of GDN layer j (oldest first); ``rec[j]``: ``[HV, dk, dv]``.
    ``length`` is the number of tokens already processed (the next token's cache row).
    """

    kv: KVCache
    conv: list[np.ndarray] = field(default_factory=list)
    rec: list[np.ndarray] = field(default_factory=list)
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, kv: KVCache | None = None) -> SequenceState:
        """Zero state for ``cfg``; ``kv`` defaults to a ``ContiguousKV`` over the full-attention layers."""
        n_gdn = len(cfg.linear_attention_layers)
        if kv is None:
            kv = ContiguousKV(len(cfg.full_attention_layers), cfg.num_key_value_heads, cfg.head_dim)
        conv_shape = (cfg.gdn_conv_channels, cfg.linear_conv_kernel_dim - 1)
        rec_shape = (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        return cls(
            kv=kv,
            conv=[np.zeros(conv_shape, F32) for _ in range(n_gdn)],
            rec=[np.zeros(rec_shape, F32) for _ in range(n_gdn)],
        )

    def snapshot_gdn(self) -> GdnSnapshot:
        return GdnSnapshot(self.length, tuple(c.copy() for c in self.conv), tuple(r.copy() for r in self.rec))

    def restore_gdn(self, snap: GdnSnapshot) -> None:
        """Put back the GDN state of ``snap`` and its length (the KV cache is rewound by the length alone)."""
        if len(snap.conv) != len(self.conv) or len(snap.rec) != len(self.rec):
            raise ValueError("GDN snapshot does not match this state's number of GDN layers")
        self.conv = [c.copy() for c in snap.conv]
        self.rec = [r.copy() for r in snap.rec]
        self.length = snap.length

    def clone(self) -> SequenceState:
        """Independent copy; the KV cache must offer ``clone()`` (``ContiguousKV`` does)."""
        clone_kv = getattr(self.kv, "clone", None)
        if clone_kv is None:
            raise TypeError(f"{type(self.kv).__name__} has no clone(); cannot clone this SequenceState")
        return SequenceState(
            kv=clone_kv(),
            conv=[c.copy() for c in self.conv],
            rec=[r.copy() for r in self.rec],
            length=self.length,
        )
