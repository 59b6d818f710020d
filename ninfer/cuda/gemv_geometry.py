"""The decode GEMV's launch geometry (cuda_src/gemv.cu): its template instances (``SOURCES``), the weight formats'
fragment readers, and :func:`gemv_plan`: rows per block, row blocks and K splits of one (format, N, K), picked from
the shape alone so that results never depend on the device or the batch. Nothing here touches the GPU; the launches
are ninfer/cuda/linear.py's (dense products) and ninfer/cuda/gemv_experts.py's (MoE experts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["GEMV_MAX_ROWS", "FRAG_STRUCTS", "SOURCES", "GemvPlan", "gemv_plan", "w8_plan"]

GEMV_MAX_ROWS = 8  # the mma's N

# format id -> the tensor-core GEMV's fragment reader (cuda_src/wfrag.cuh), its 16-row m-tiles per warp (F::MT)
# and its 16-byte shared-memory vectors per lane and pipeline stage (F::VECS)
FRAG_STRUCTS = {
    "BF16": ("FragBF16", 1, 8),
    "FP8E4M3_F32ROW": ("FragFP8<true>", 2, 8),
    "FP8E4M3_F32T": ("FragFP8<false>", 2, 8),
    "NVFP4G16_E4M3S": ("FragNVFP4", 2, 5),
    "NVFP4G16_E4M3S_ROWG": ("FragNVFP4RowG", 2, 5),
    "Q4G64_F16S": ("FragQG64<4>", 2, 5),  # no high-word vectors (GV_Q4_HV in wfrag.cuh)
    "Q5G64_F16S": ("FragQG64<5>", 2, 7),
    "Q6G64_F16S": ("FragQG64<6>", 2, 7),
    "W8G32_F16S": ("FragW8G32", 2, 10),
}
_GV_WARPS, _GV_THREADS, _GV_STAGES = 4, 128, 4  # GV_WARPS, GV_STAGES in gemv.cu
# lane-block instances: one activation row, up to 4, up to 8 (same arithmetic per row: a row's bits never depend on
# the instance). The 4-row one stages half the 8-row one's activations per tile; the staging is what made 2-8 rows
# cost up to 1.45x one row (float activations: split, converted and stored per block), so 2-4 rows (a speculative
# verify of k = 3 at one lane, 2-4 lanes of decode) run it.
_GV_NB = (1, 4, 8)
_GV_TILE = 128  # K per tile
# Splits are picked from (format, N, K) only, never from the GPU or the number of rows, so results are the same
# on every device and for every batch. K is split across blocks to give every matrix about one wave of blocks on a
# 132-SM H200 (4 resident blocks of 4 warps per SM: 528; the dequantization needs ~16 warps per SM to hide its
# latency), keeping >= 4 tiles per split; split s of S takes tiles [s T / S, (s + 1) T / S). Measured (H200, NVFP4,
# one row, perf/bench_gemv.py): a grid 6% over one wave (560 blocks, the down projection) ran 8% slower than 520,
# while 3% over (544, gate|up) beat the half-empty single split by 13%, hence a 5% allowance then; fewer than 4
# tiles per split was slower on every shape. Those timings were taken while the 1-lane NVFP4 block fitted only 3 per
# SM (see below); with 4 per SM, gate|up does better still as several waves (below), and no other shape of the 27B
# or the 35B-A3B used the allowance, so a wave is now exactly 528 blocks. The
# activations are staged in double-buffered chunks of GV_CHUNK tiles, so shared memory does not grow with K.
# 2-8 lanes stage 2 tiles per chunk (8 KB per buffer of float activations): with 4 their 72 KB block left room
# for 3 blocks per SM, not 4 (228 KB per SM, 1 KB of it reserved per block), like the 1-lane NVFP4 block did with
# a 4-byte static flag beside its 56 KB (gemv.cu now keeps it in the dynamic buffer).
_GV_WAVE_BLOCKS, _GV_MIN_TILES, _GV_CHUNK, _GV_CHUNK4, _GV_CHUNK1 = 528, 4, 2, 4, 16  # 4 x 132; gemv.cu's
# A grid that one wave would fill to less than 3/4 (a wide matrix whose row blocks alone are more than half a wave)
# takes splits of _GV_MULTI_TILES tiles instead, when that makes at least two waves: measured on the H200 at d82349e
# (perf/gemv_variants.py gu3/gu5/gu8, perf/results/device_run_d82349e.txt), the 27B gate|up (272 row blocks) at one
# row took 44.0 us as 2 splits (544 blocks: 16 of them a second wave; 1 split, 272 blocks: 55.2 us), 41.4 as 3,
# 40.6 as 5 (8 tiles each), 42.8 as 8. It is the only 27B or 35B-A3B shape the rule changes.
_GV_WAVE_FILL, _GV_MULTI_TILES = 0.75, 8
# The minimum K-tiles per split of dense launches (no expert ids; perf/bench_fold.py --toggle dtiles2,dtiles4 set
# it for a run). All splits 2 tiles (tiles2) made the 35B-A3B's one-lane step 5% faster and its eight-lane step 9%
# slower (H100, 18a67ef): 8 lanes launch 9x the expert slots of one, the dense products the same blocks. Dense
# launches alone at 1 tile: 35B-A3B x1 1.054x, x8 1.040x, 27B 1.00x (2 tiles: 1.044x, 1.038x), hence 1. So an
# expert slot and a dense launch of the same weight may split K differently (their sums agree to fp32 rounding, not
# bitwise): the model never computes one product both ways (the shared expert is always an expert slot where it is
# appended to the routed weights, docs/cuda.md "Decode step accounting"). None: _GV_MIN_TILES for every launch.
_GV_DENSE_MIN_TILES: int | None = 1
# Stream-K (one wave of equal blocks over the row-major (row block, K-tile) units) was tried instead of the splits
# and removed: on the H200 at 7fefbde (perf/gemv_variants.py, 27B NVFP4) only gate|up gained (39.9 vs 41.2 us at
# one row); a block's pieces crossing row blocks restart the activation staging and the pipeline, which cost more
# than the partial wave saved (gdn qkv|z 22.3 vs 19.9 us at one row, 43.7 vs 33.8 at eight; lm_head 236 vs 224).
_TYPES = ("float", "bf16")
# formats whose next product the GEMV can prefetch into L2 (gemv.cu gemv_mma_pf: the NVFP4 device layout)
_PF_FORMATS = frozenset(f for f, (s, _, _) in FRAG_STRUCTS.items() if s.startswith("FragNVFP4"))
SOURCES: dict[str, tuple[str, ...]] = {
    "gemv.cu": tuple(
        f"gemv_mma<{s}, {t}, {nb}>" for s, _, _ in FRAG_STRUCTS.values() for t in _TYPES for nb in _GV_NB
    )
    + tuple(
        f"gemv_mma_pf<{FRAG_STRUCTS[f][0]}, {t}, {nb}>"
        for f in sorted(_PF_FORMATS)
        for t in _TYPES
        for nb in _GV_NB
    )
    + tuple(dict.fromkeys(f"gemv_mma_rt<{s}, float, 1>" for s, _, _ in FRAG_STRUCTS.values()))
    + tuple(dict.fromkeys(f"gemv_mma_cb<{s}, float, 1>" for s, _, _ in FRAG_STRUCTS.values())),
    # gemv.cu's experiment instances (gemv_fused.cu, float activations): the gate | up product with the SwiGLU
    # epilogue (linear.gemv / gemv_experts(swiglu_out=True)) and the MoE router product with the routing in its tail
    # (linear.gemv(route=...))
    "gemv_fused.cu": tuple(
        f"gemv_mma_gu<{s}, float, {nb}>" for s, _, _ in FRAG_STRUCTS.values() for nb in _GV_NB
    )
    + tuple(f"gemv_mma_rr<{s}, float, {nb}>" for s, _, _ in FRAG_STRUCTS.values() for nb in _GV_NB),
    # gemv.cu with 8 warps per block (gemv_w8.cu): dense 5-8-lane products with float activations (linear.GV_W8),
    # and one-lane ones of the formats in linear.GV_W8_ONE
    "gemv_w8.cu": tuple(dict.fromkeys(f"gemv_mma<{s}, float, 8>" for s, _, _ in FRAG_STRUCTS.values()))
    + tuple(dict.fromkeys(f"gemv_mma_gu<{s}, float, 8>" for s, _, _ in FRAG_STRUCTS.values()))
    + tuple(dict.fromkeys(f"gemv_mma<{s}, float, 1>" for s, _, _ in FRAG_STRUCTS.values()))
    + tuple(dict.fromkeys(f"gemv_mma_gu<{s}, float, 1>" for s, _, _ in FRAG_STRUCTS.values())),
    # both with the NVFP4 weight ring filled by bulk copies (gemv_bulk.cuh; linear.GV_BULK, an experiment)
    "gemv_bulk.cu": tuple(
        f"gemv_mma<{FRAG_STRUCTS[f][0]}, {t}, {nb}>"
        for f in sorted(_PF_FORMATS)
        for t in _TYPES
        for nb in _GV_NB
    ),
    "gemv_w8_bulk.cu": tuple(f"gemv_mma<{FRAG_STRUCTS[f][0]}, float, 8>" for f in sorted(_PF_FORMATS)),
}


@dataclass(frozen=True, slots=True)
class GemvPlan:
    """Launch geometry of the tensor-core GEMV for one (format, N, K): ``rows`` weight rows per block,
    ``blocks_x`` row blocks, ``splits`` balanced K-splits of the ``ntiles`` 128-wide tiles."""

    rows: int
    blocks_x: int
    splits: int
    ntiles: int
    stage_bytes: int  # one warp's pipeline stage of weights
    warps: int = _GV_WARPS  # per block (gemv.cu's GV_WARPS; 8 for gemv_w8.cu)

    def tiles(self, split: int) -> range:
        """The K-tiles of ``split`` (gemv.cu: [s T / S, (s + 1) T / S))."""
        return range(split * self.ntiles // self.splits, (split + 1) * self.ntiles // self.splits)

    def smem_bytes(self, nb: int, t: str) -> int:
        """Two activation chunk buffers (per tile 8 steps x nb lanes x 4 threads x 8|16 bytes), then GV_STAGES
        weight stages per warp."""
        chunk = _GV_CHUNK1 if nb == 1 else (_GV_CHUNK4 if nb <= 4 else _GV_CHUNK)
        act = 2 * chunk * 8 * nb * 4 * (16 if t == "float" else 8)
        return act + self.warps * _GV_STAGES * self.stage_bytes


@functools.cache
def gemv_plan(fmt: str, n: int, k: int, dense: bool = False) -> GemvPlan:
    """The GEMV's geometry for a weight of format ``fmt`` with ``n`` rows and ``k`` columns (see _GV_* above);
    ``dense``: a launch without expert ids (the same plan unless _GV_DENSE_MIN_TILES is set; its blocks_x never
    differs)."""
    _, mt, vecs = FRAG_STRUCTS[fmt]
    rows = _GV_WARPS * mt * 16
    ntiles, bx = -(-k // _GV_TILE), -(-n // rows)
    min_tiles = _GV_DENSE_MIN_TILES if dense and _GV_DENSE_MIN_TILES else _GV_MIN_TILES
    splits = max(1, min(_GV_WAVE_BLOCKS // bx, ntiles // min_tiles))
    many = ntiles // _GV_MULTI_TILES
    if bx * splits < _GV_WAVE_FILL * _GV_WAVE_BLOCKS and bx * many >= 2 * _GV_WAVE_BLOCKS:
        splits = many  # one wave would leave SMs idle: several waves of small blocks balance themselves
    return GemvPlan(rows=rows, blocks_x=bx, splits=splits, ntiles=ntiles, stage_bytes=vecs * 512)


def w8_plan(plan: GemvPlan, n: int) -> GemvPlan:
    """gemv_w8.cu's geometry for ``plan`` (an n-row product): 8 warps, twice the rows per block, the same splits (so
    the same K order for every output: the 4-warp kernel's bits)."""
    rows = plan.rows * 8 // plan.warps
    return GemvPlan(rows=rows, blocks_x=-(-n // rows), splits=plan.splits, ntiles=plan.ntiles,
                    stage_bytes=plan.stage_bytes, warps=8)  # fmt: skip
