"""Per-sequence state of Qwen3.8-Flash-Next (docs/flash-next-state.md has the full model and the reuse rules).

Positional caches (valid for any prefix of the tokens that wrote them, so page-cacheable):
- K/V of every QSA layer, through the contract's ``kv.write/read`` (``attn_idx`` = ordinal among QSA layers);
- pooled index keys, one ``[Dix]`` vector per COMPLETE block of ``ratio`` tokens per QSA layer (normed and roped
  at the block start, so a pure function of the block's tokens and position). They live in the kv object when it
  offers ``write_index/read_index`` and otherwise in the state's own ``IndexKeys``.
Sequence state (must be snapshotted at a resume point; constant size):
- GDN conv window ``[C, K-1]`` (raw pre-conv inputs) and recurrent state ``[HV, dk, dv]`` per GDN layer;
- QSA open block: raw (un-normed, un-roped) indexer keys of the ``length % ratio`` tokens after the last
  complete block, per QSA layer (empty at a block boundary);
- PLE conv window ``[(K-1)·ngram_size, S·D]`` (the normed gated values of the last 9 tokens) per PLE layer;
- n-gram context: the last ngram_size-1 token ids (pad ids before the start).
The hyper-connection streams carry nothing across tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ninfer.flash_next.config import FlashNextConfig
from ninfer.reference.kv import ContiguousKV, KVCache

__all__ = ["IndexStore", "IndexKeys", "FlashNextState", "FlashSnapshot", "KVCache", "ContiguousKV"]

F32 = np.float32


@runtime_checkable
class IndexStore(Protocol):
    """Pooled QSA index keys, positional like K/V: block b of layer ``attn_idx`` covers tokens 4b..4b+3."""

    def write_index(self, attn_idx: int, block: int, keys: np.ndarray) -> None: ...

    def read_index(self, attn_idx: int, n_blocks: int) -> np.ndarray: ...


class IndexKeys:
    """Growable contiguous pooled index keys per QSA layer, ``[blocks, Dix]``; writing at block b overwrites."""

    def __init__(self, n_layers: int, dim: int, capacity: int = 16) -> None:
        self.n_layers, self.dim = n_layers, dim
        self._keys = [np.zeros((max(1, capacity), dim), F32) for _ in range(n_layers)]
        self._filled = [0] * n_layers

    def write_index(self, attn_idx: int, block: int, keys: np.ndarray) -> None:
        if block > self._filled[attn_idx]:
            raise ValueError(
                f"index write at block {block} leaves a gap: layer {attn_idx} holds {self._filled[attn_idx]}"
            )
        end = block + keys.shape[0]
        buf = self._keys[attn_idx]
        if end > buf.shape[0]:
            grown = np.zeros((max(end, 2 * buf.shape[0]), self.dim), F32)
            grown[: buf.shape[0]] = buf
            self._keys[attn_idx] = buf = grown
        buf[block:end] = keys
        self._filled[attn_idx] = max(self._filled[attn_idx], end)

    def read_index(self, attn_idx: int, n_blocks: int) -> np.ndarray:
        if n_blocks > self._filled[attn_idx]:
            raise ValueError(
                f"index read of {n_blocks} blocks: layer {attn_idx} holds {self._filled[attn_idx]}"
            )
        return self._keys[attn_idx][:n_blocks]

    @property
    def filled(self) -> list[int]:
        """Blocks written so far per layer."""
        return list(self._filled)

    @property
    def nbytes(self) -> int:
        return sum(k[:n].nbytes for k, n in zip(self._keys, self._filled, strict=True))

    def copy_prefix(self, n_blocks: list[int]) -> IndexKeys:
        """Independent copy holding the first ``n_blocks[j]`` blocks of each layer."""
        out = IndexKeys(self.n_layers, self.dim, 1)
        out._keys = [
            k[:n].copy() if n else np.zeros((1, self.dim), F32)
            for k, n in zip(self._keys, n_blocks, strict=True)
        ]
        out._filled = list(n_blocks)
        return out


@dataclass(frozen=True, slots=True)
class FlashSnapshot:
    """Deep copy of the non-positional state at ``length`` (plus the pooled index keys when the state owns them).

    Fixed size for a config (when the kv object holds the index keys): ``open_keys[j]`` is always
    ``[ratio-1, Dix]``, its first ``length % ratio`` rows the open block (zero padding after), so an engine can
    account every checkpoint with the same ``nbytes`` (the padding costs 3·128·4 B per QSA layer).
    """

    length: int
    conv: tuple[np.ndarray, ...]
    rec: tuple[np.ndarray, ...]
    open_keys: tuple[np.ndarray, ...]
    ple_conv: tuple[np.ndarray, ...]
    ngram_ctx: np.ndarray
    index: IndexKeys | None

    @property
    def nbytes(self) -> int:
        arrs = (*self.conv, *self.rec, *self.open_keys, *self.ple_conv, self.ngram_ctx)
        idx = self.index.nbytes if self.index is not None else 0
        return sum(a.nbytes for a in arrs) + idx


@dataclass(slots=True)
class FlashNextState:
    """Everything one sequence carries between forward calls; ``length`` = tokens processed so far."""

    kv: KVCache
    index: IndexKeys | None  # None when ``kv`` stores the index keys itself
    conv: list[np.ndarray] = field(default_factory=list)
    rec: list[np.ndarray] = field(default_factory=list)
    open_keys: list[np.ndarray] = field(default_factory=list)
    ple_conv: list[np.ndarray] = field(default_factory=list)
    ngram_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ratio: int = 4  # indexer_compress_ratio: complete blocks = length // ratio, open rows = length % ratio
    length: int = 0

    @classmethod
    def empty(
        cls, cfg: FlashNextConfig, kv: KVCache | None = None, *, n_qsa: int | None = None
    ) -> FlashNextState:
        """Zero state; ``kv`` defaults to a ``ContiguousKV`` over the QSA layers (``n_qsa`` overrides the count,
        the MTP head uses 1 and no GDN/PLE state)."""
        mtp = n_qsa is not None
        n_attn = len(cfg.qsa_layers) if n_qsa is None else n_qsa
        if kv is None:
            kv = ContiguousKV(n_attn, cfg.num_key_value_heads, cfg.head_dim)
        index = None if isinstance(kv, IndexStore) else IndexKeys(n_attn, cfg.indexer_head_dim)
        n_gdn = 0 if mtp else len(cfg.gdn_layers)
        n_ple = 0 if mtp else len(cfg.ple_layers)
        conv_shape = (cfg.gdn_conv_channels, cfg.linear_conv_kernel_dim - 1)
        rec_shape = (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        return cls(
            kv=kv,
            index=index,
            conv=[np.zeros(conv_shape, F32) for _ in range(n_gdn)],
            rec=[np.zeros(rec_shape, F32) for _ in range(n_gdn)],
            open_keys=[np.zeros((0, cfg.indexer_head_dim), F32) for _ in range(n_attn)],
            ple_conv=[np.zeros((cfg.ple_conv_state_len, cfg.hc_dim), F32) for _ in range(n_ple)],
            ngram_ctx=np.full(cfg.ngram_size - 1, cfg.eos_token_ids[0] if cfg.eos_token_ids else 0, np.int64),
            ratio=cfg.indexer_compress_ratio,
        )

    @property
    def index_store(self) -> IndexStore:
        """Where the pooled index keys live: the kv object when it has ``write_index``, else ``self.index``."""
        return self.index if self.index is not None else self.kv  # type: ignore[return-value]

    def snapshot_gdn(self) -> FlashSnapshot:
        """Copy of everything a resume at ``self.length`` needs beyond the positional K/V (contract name kept from
        Qwen3.6: the engine's checkpoint machinery calls it; here it also covers PLE, n-gram and QSA state)."""
        index = None
        if self.index is not None:
            index = self.index.copy_prefix([self.length // self.ratio] * self.index.n_layers)
        return FlashSnapshot(
            length=self.length,
            conv=tuple(c.copy() for c in self.conv),
            rec=tuple(r.copy() for r in self.rec),
            open_keys=tuple(self._padded_open(k) for k in self.open_keys),
            ple_conv=tuple(c.copy() for c in self.ple_conv),
            ngram_ctx=self.ngram_ctx.copy(),
            index=index,
        )

    def _padded_open(self, keys: np.ndarray) -> np.ndarray:
        out = np.zeros((self.ratio - 1, keys.shape[1]), F32)
        out[: keys.shape[0]] = keys
        return out

    def restore_gdn(self, snap: FlashSnapshot) -> None:
        """Put back ``snap`` and its length; positional K/V (and kv-held index keys) are rewound by length alone."""
        if (len(snap.conv), len(snap.open_keys), len(snap.ple_conv)) != (
            len(self.conv),
            len(self.open_keys),
            len(self.ple_conv),
        ):
            raise ValueError("snapshot does not match this state's layer counts (GDN, QSA or PLE)")
        if (snap.index is None) != (self.index is None):
            raise ValueError("snapshot and state disagree on where the QSA index keys live")
        self.conv = [c.copy() for c in snap.conv]
        self.rec = [r.copy() for r in snap.rec]
        n_open = snap.length % self.ratio
        self.open_keys = [k[:n_open].copy() for k in snap.open_keys]
        self.ple_conv = [c.copy() for c in snap.ple_conv]
        self.ngram_ctx = snap.ngram_ctx.copy()
        if snap.index is not None:
            self.index = snap.index.copy_prefix(snap.index.filled)
        self.length = snap.length

    snapshot = snapshot_gdn
    restore = restore_gdn

    def clone(self) -> FlashNextState:
        """Independent copy; the kv object must offer ``clone()`` (``ContiguousKV`` does)."""
        clone_kv = getattr(self.kv, "clone", None)
        if clone_kv is None:
            raise TypeError(f"{type(self.kv).__name__} has no clone(); cannot clone this FlashNextState")
        return FlashNextState(
            kv=clone_kv(),
            index=None if self.index is None else self.index.copy_prefix(self.index.filled),
            conv=[c.copy() for c in self.conv],
            rec=[r.copy() for r in self.rec],
            open_keys=[k.copy() for k in self.open_keys],
            ple_conv=[c.copy() for c in self.ple_conv],
            ngram_ctx=self.ngram_ctx.copy(),
            ratio=self.ratio,
            length=self.length,
        )
