"""The qwen4_exp checkpoint reader of ``ninfer convert`` (docs/flash-next.md §10, names: ``ninfer.flash_next.names``).

- the n-gram table arrives as ``split_ngram_parts`` shards; ``get`` returns a lazy ``ShardRows`` over them (a
  ``RowSource``: the writer reads it in row chunks, never the whole 100 GB table);
- per-expert ``experts.{e}.{gate,up,down}_proj.weight`` (what save_pretrained writes) fuse into the canonical 3-D
  ``experts.gate_up_proj`` (gate rows, then up rows) and ``experts.down_proj``;
- the derived i64 buffers (``layer_multipliers``, ``ngram_heads_vocab_sizes``, ``ngram_heads_offsets``) are not
  stored: ``check()`` compares them with what the config implies;
- vision and repack extras are ignored.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ninfer.convert.safetensors_io import CheckpointError, SafetensorsDir
from ninfer.flash_next.config import FlashNextConfig
from ninfer.flash_next.names import expected_buffer, map_hf_name

__all__ = ["FlashNextCheckpoint", "ShardRows"]


class ShardRows:
    """Row-concatenation of checkpoint shards ``[rows_k, D]`` in k order, read by row ranges."""

    def __init__(self, ckpt: SafetensorsDir, names: list[str]) -> None:
        self.ckpt, self.names = ckpt, names
        sizes = [ckpt.shape(n)[0] for n in names]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.shape = (int(self.starts[-1]), ckpt.shape(names[0])[1])

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("ShardRows: only contiguous row ranges can be read")
        parts = []
        for k, name in enumerate(self.names):
            lo, hi = max(a, int(self.starts[k])), min(b, int(self.starts[k + 1]))
            if lo < hi:
                parts.append(self.ckpt.get_rows(name, lo - int(self.starts[k]), hi - int(self.starts[k])))
        if not parts:
            return np.zeros((0, self.shape[1]), np.float32)
        return np.concatenate(parts, axis=0)


class FlashNextCheckpoint:
    def __init__(self, ckpt: SafetensorsDir, cfg: FlashNextConfig) -> None:
        self.ckpt, self.cfg = ckpt, cfg
        self.direct: dict[str, str] = {}
        self.shards: dict[str, dict[int, str]] = defaultdict(dict)
        self.experts: dict[str, dict[tuple[int, str], str]] = defaultdict(dict)
        self.buffers: dict[str, str] = {}
        for hf_name in ckpt.names():
            ref = map_hf_name(hf_name)
            if ref is None:
                continue
            if ref.kind == "ngram_shard":
                self.shards[ref.canonical][ref.shard] = hf_name  # type: ignore[index]
            elif ref.kind == "expert_part":
                self.experts[ref.canonical][(ref.expert, ref.part)] = hf_name  # type: ignore[index]
            elif ref.kind == "verify_buffer":
                self.buffers[ref.canonical] = hf_name
            else:
                self.direct[ref.canonical] = hf_name

    def names(self) -> set[str]:
        return set(self.direct) | set(self.shards) | set(self.experts)

    def _shard_names(self, table: str) -> list[str]:
        parts = self.shards[table]
        order = sorted(parts)
        if order != list(range(len(order))):
            raise CheckpointError(f"{table}: n-gram shards {order} are not 0..{len(order) - 1}")
        if len(order) != self.cfg.split_ngram_parts:
            raise CheckpointError(
                f"{table}: {len(order)} n-gram shards, config split_ngram_parts is {self.cfg.split_ngram_parts}"
            )
        widths = {self.ckpt.shape(parts[k])[1:] for k in order}
        if len(widths) != 1:
            raise CheckpointError(f"{table}: n-gram shards differ in row width {sorted(widths)}")
        return [parts[k] for k in order]

    def _expert_names(self, fused: str) -> list[list[str]]:
        parts = self.experts[fused]
        n_exp = 1 + max(e for e, _ in parts)
        want = ("down",) if fused.endswith("down_proj") else ("gate", "up")
        out = []
        for e in range(n_exp):
            missing = [p for p in want if (e, p) not in parts]
            if missing:
                raise CheckpointError(f"{fused}: expert {e} has no {missing[0]}_proj")
            out.append([parts[(e, p)] for p in want])
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.direct:
            return self.ckpt.shape(self.direct[name])
        if name in self.shards:
            return ShardRows(self.ckpt, self._shard_names(name)).shape
        return self.ckpt.stacked_shape(name, self._expert_names(name))

    def get(self, name: str) -> np.ndarray | ShardRows:
        if name in self.direct:
            return self.ckpt.get(self.direct[name])
        if name in self.shards:
            return ShardRows(self.ckpt, self._shard_names(name))
        return self.ckpt.stacked(self._expert_names(name))

    def check(self) -> None:
        """The checkpoint's derived n-gram buffers must hold what the config implies (docs/flash-next.md §7)."""
        for canonical, hf_name in sorted(self.buffers.items()):
            try:
                want = expected_buffer(self.cfg, canonical)
            except KeyError as e:
                raise CheckpointError(str(e.args[0])) from None
            got = np.asarray(self.ckpt.get(hf_name))
            if got.shape != want.shape or not np.array_equal(got.astype(np.int64), want):
                raise CheckpointError(f"{hf_name}: holds {got.tolist()}, the config implies {want.tolist()}")
