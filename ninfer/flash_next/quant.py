"""Weight profiles of qwen3.8-flash-next: the format of every canonical tensor, and the n-gram table's layout.

Profiles (docs/formats.md §6):
- ``bf16``: every tensor BF16 except GDN ``A_log``/``dt_bias`` (FP32); the n-gram table is BF16 ``[rows, D]``.
  For tiny checkpoints whose values are bf16-exact this is lossless (the parity tests rely on that).
- ``mixed-nvfp4-fp8-ple-int4`` (the real model, one H200):
  - NVFP4G16_E4M3S: the trunk's routed experts (``experts.gate_up_proj/down_proj``, about 96% of the parameters
    outside the table) and the large projections: GDN ``in_proj_qkv``, ``in_proj_z``, ``out_proj``; QSA
    ``q_proj``, ``o_proj``; PLE ``key_proj``, ``value_proj``.
  - FP8E4M3_F32ROW: the whole MTP head's matrices (the official FP8 release keeps MTP in FP8; the
    draft quality is acceptance-critical), ``embed_tokens``, ``lm_head``, QSA ``k_proj``/``v_proj``, the indexer
    ``index_qk_proj`` (block selection is sensitive), shared experts, HC ``input_mix_weight_down/up``.
  - BF16: norms, router ``mlp.gate``, ``shared_expert_gate``, HC ``block_inject_weight``, GDN ``in_proj_a/b``
    and all conv1d weights; FP32: ``A_log``, ``dt_bias``.
  - n-gram table: Q4G64_F16S (INT4, one f16 scale per 64 values), stored PACKED: ``pack`` consecutive table
    rows form one stored row of ``pack·D`` values, ``pack = 128 / gcd(D, 128)``, so the row-split-k128 layout
    has no column padding (D = 160: pack 4, stored ``[80000384, 640]``, 85 B per table row, 27.2 GB for
    320,001,536 rows; unpacked it would pad 160 to 256 columns: 136 B per row). A 64-group may span two
    adjacent table rows (they share its scale). Rows are read with ``decode_ngram_rows`` from the mapped bytes.
Decode bounds (the formats' documented, tested bounds; checked again on this model's tensors in the tests):
- Q4G64 table rows: ``|w - x| <= s/2``, ``s <= amax_group/7·(1 + 2^-11)`` (normal f16 scales), i.e. <= amax/14;
- NVFP4 experts: ``|w - x| <= amax_block·(1 + 2^-4)/6 + amax_block/16`` per 16-value block (normal e4m3 scales);
- FP8 rows: ``|w - x| <= 2^-4·|x| + 2^-10·amax_row/448``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ninfer.artifact.inventory import TensorPlan
from ninfer.artifact.rows import gather_rows
from ninfer.flash_next.config import FlashNextConfig
from ninfer.flash_next.names import expected_shapes, is_ngram_table, ngram_table_name
from ninfer.formats import get_format
from ninfer.formats.common import Buffer

__all__ = [
    "PROFILE_BF16",
    "PROFILE_MIXED",
    "PROFILES",
    "MODEL_ID",
    "tensor_format",
    "assignment",
    "stored_shapes",
    "NgramLayout",
    "ngram_layout",
    "encode_ngram_table",
    "decode_ngram_rows",
    "artifact_plan",
]

MODEL_ID = "qwen3.8-flash-next"
PROFILE_BF16 = "bf16"
PROFILE_MIXED = "mixed-nvfp4-fp8-ple-int4"
PROFILES = (PROFILE_BF16, PROFILE_MIXED)
NGRAM_FORMAT = "Q4G64_F16S"

_FP32 = ("linear_attn.A_log", "linear_attn.dt_bias")
_NVFP4 = (
    "mlp.experts.gate_up_proj",
    "mlp.experts.down_proj",
    "linear_attn.in_proj_qkv.weight",
    "linear_attn.in_proj_z.weight",
    "linear_attn.out_proj.weight",
    "self_attn.q_proj.weight",
    "self_attn.o_proj.weight",
    "ple.key_proj.weight",
    "ple.value_proj.weight",
)
_BF16_MATRICES = (
    "mlp.gate.weight",
    "mlp.shared_expert_gate.weight",
    "block_inject_weight.weight",
    "linear_attn.in_proj_a.weight",
    "linear_attn.in_proj_b.weight",
    "conv1d.weight",
)


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"weight profile {profile!r} is not one of {list(PROFILES)} for {MODEL_ID}")


def tensor_format(name: str, shape: Sequence[int], profile: str) -> str:
    """Format id of canonical tensor ``name`` (HF ``shape``) under ``profile`` (module doc has the rules)."""
    _check_profile(profile)
    if name.endswith(_FP32):
        return "FP32"
    if profile == PROFILE_BF16:
        return "BF16"
    if is_ngram_table(name):
        return NGRAM_FORMAT
    if len(shape) < 2 or name.endswith(_BF16_MATRICES):
        return "BF16"
    if name.startswith("mtp."):
        return "FP8E4M3_F32ROW"
    if name.endswith(_NVFP4):
        return "NVFP4G16_E4M3S"
    return "FP8E4M3_F32ROW"


def assignment(cfg: FlashNextConfig, profile: str, *, mtp: bool | None = None) -> dict[str, str]:
    """Canonical name -> format id for every tensor of ``cfg`` (``expected_shapes``)."""
    return {n: tensor_format(n, s, profile) for n, s in expected_shapes(cfg, mtp=mtp).items()}


def stored_shapes(
    cfg: FlashNextConfig, profile: str, *, mtp: bool | None = None
) -> dict[str, tuple[int, ...]]:
    """Canonical name -> the shape its bytes are encoded with: the HF shape, except an n-gram table, stored
    packed as ``ngram_layout(...).stored_shape``. Byte size = ``encoded_size(format, stored shape)``."""
    out = expected_shapes(cfg, mtp=mtp)
    for rank in range(len(cfg.ple_layers)):
        lay = ngram_layout(cfg, profile, rank)
        out[lay.name] = lay.stored_shape
    return out


@dataclass(frozen=True, slots=True)
class NgramLayout:
    """How one n-gram table ``[rows, row_dim]`` is stored: ``format`` over ``stored_shape``, ``pack`` table rows
    per stored row (table row r = stored row r // pack, columns (r % pack)·row_dim ..)."""

    name: str
    format: str
    rows: int
    row_dim: int
    pack: int

    @property
    def stored_shape(self) -> tuple[int, int]:
        return (self.rows // self.pack, self.pack * self.row_dim)

    @property
    def nbytes(self) -> int:
        return get_format(self.format).encoded_size(self.stored_shape)

    def read_rows(self, buf: Buffer, row_ids: np.ndarray) -> np.ndarray:
        """``decode_ngram_rows(buf, self, row_ids)`` (the artifact reader's row-reader hook)."""
        return decode_ngram_rows(buf, self, row_ids)


def ngram_layout(cfg: FlashNextConfig, profile: str, ple_rank: int = 0) -> NgramLayout:
    """Storage layout of the n-gram table of PLE layer ``ple_rank`` under ``profile``."""
    fmt = tensor_format(ngram_table_name(cfg.ple_layers[ple_rank]), (1, 1), profile)
    rows, dim = cfg.ngram_table_rows(ple_rank), cfg.ngram_row_dim
    pack = 1
    if fmt == NGRAM_FORMAT:
        pack = 128 // math.gcd(dim, 128)
        if rows % pack:  # rows are padded to make_ngram_vocab_size_divisible_by (128): never in practice
            pack = 1
    return NgramLayout(ngram_table_name(cfg.ple_layers[ple_rank]), fmt, rows, dim, pack)


def encode_ngram_table(table: np.ndarray, layout: NgramLayout) -> np.ndarray:
    """Encoded bytes (1-D uint8) of a float32 table ``[rows, row_dim]`` in ``layout``."""
    if tuple(table.shape) != (layout.rows, layout.row_dim):
        raise ValueError(
            f"{layout.name}: table shape {list(table.shape)}, expected {[layout.rows, layout.row_dim]}"
        )
    return get_format(layout.format).encode(np.asarray(table, np.float32).reshape(layout.stored_shape))


def decode_ngram_rows(buf: Buffer, layout: NgramLayout, row_ids: np.ndarray) -> np.ndarray:
    """Table rows ``[n, row_dim]`` (float32) decoded from the encoded bytes, touching only the stored rows they
    live in (``buf`` may be a memory map: nothing else is read)."""
    ids = np.asarray(row_ids, np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= layout.rows):
        raise ValueError(f"{layout.name}: row id outside [0, {layout.rows})")
    stored = ids // layout.pack
    uniq, inverse = np.unique(stored, return_inverse=True)
    decoded = gather_rows(get_format(layout.format), buf, layout.stored_shape, uniq)
    cols = (ids % layout.pack)[:, None] * layout.row_dim + np.arange(layout.row_dim)[None, :]
    return np.take_along_axis(decoded[inverse.reshape(-1)], cols, axis=1)


def artifact_plan(cfg: FlashNextConfig, profile: str) -> dict[str, TensorPlan]:
    """The artifact inventory of ``cfg`` under ``profile``: every tensor of ``expected_shapes`` (MTP when the
    config has it) with its stored shape and format; the n-gram tables are ``host_rows`` (own mapped region,
    written last, read only by ``NgramLayout.read_rows``)."""
    _check_profile(profile)
    fmts = assignment(cfg, profile)
    plan = {
        n: TensorPlan(shape, fmts[n], shape)
        for n, shape in expected_shapes(cfg).items()
        if not is_ngram_table(n)
    }
    for rank in range(len(cfg.ple_layers)):
        lay = ngram_layout(cfg, profile, rank)
        plan[lay.name] = TensorPlan(
            lay.stored_shape, lay.format, (lay.rows, lay.row_dim), host_rows=True, rows=lay.read_rows
        )
    return plan
