"""Gated DeltaNet kernels (cuda_src/gdn.cu, gdn_step.cu): causal conv with carried state (+SiLU) and the delta-rule
recurrence with fused l2norm and gates, over packed sequences (``starts[b]..starts[b+1]`` rows, state slot
``slots[b]``).

``gdn_recurrent`` is the exact token-by-token recurrence; ``gdn_decode`` is the same recurrence fused with the
causal conv and the gated RMSNorm (one launch instead of three: a cluster of a value head's column tiles exchanges
o through distributed shared memory, or the last arriving blocks run the epilogue; bitwise equal to
``causal_conv`` -> ``gdn_recurrent`` -> ``gated_rmsnorm``): the model's decode and exact-prefill path, where a
token's result must not depend on chunking. ``gdn_chunked`` is the chunked form (chunks of 64 tokens per
sequence), equal to the recurrence within fp32 noise and much faster on long prompts: two passes (cuda_src/
gdn_chunk.cu), the chunk-parallel intra-chunk work into a float32 scratch, then a short sequential state pass.

The family's Python is in two modules, both re-exported here (callers import from ``ninfer.cuda.gdn``):
``gdn_step.py`` (``causal_conv``, ``gdn_recurrent``, ``gdn_decode``, their launches, shared-memory sizes and the
argument checks both forms share) and ``gdn_chunk.py`` (``gdn_chunked``: its variants, kernel instances, shared
memory and scratch sizes). ``SOURCES`` (the instances the warm-up compiles) is assembled here from both."""

from __future__ import annotations

from ninfer.cuda.gdn_chunk import (
    CHUNK,
    DEFAULT_VARIANT,
    PREFILL_GDN,
    SCRATCH_BF16,
    SERIAL_SOURCES,
    STATE_COLS,
    STATE_VARIANTS,
    chunk_instances,
    chunk_scratch_bytes,
    chunk_slice,
    chunk_smem_bytes,
    gdn_chunked,
    prep_smem_bytes,
    prep_tc_conv_smem_bytes,
    prep_tc_smem_bytes,
    state_cols,
    state_mma_smem_bytes,
    state_smem_bytes,
    state_wsp_smem_bytes,
)
from ninfer.cuda.gdn_step import (
    CONV_SOURCES,
    CONV_TILE,
    DECODE_VARIANTS,
    HEAD_DIMS,
    STEP_CLUSTER,
    STEP_CLUSTER_MAX_SEQS,
    STEP_COLS,
    STEP_SOURCES,
    causal_conv,
    gdn_decode,
    gdn_recurrent,
    step_cl_smem_bytes,
    step_smem_bytes,
)

__all__ = [
    "causal_conv",
    "gdn_recurrent",
    "gdn_decode",
    "step_smem_bytes",
    "step_cl_smem_bytes",
    "DECODE_VARIANTS",
    "gdn_chunked",
    "chunk_slice",
    "chunk_smem_bytes",
    "chunk_scratch_bytes",
    "prep_smem_bytes",
    "prep_tc_smem_bytes",
    "prep_tc_conv_smem_bytes",
    "state_smem_bytes",
    "state_mma_smem_bytes",
    "state_wsp_smem_bytes",
    "state_cols",
    "STATE_VARIANTS",
    "SCRATCH_BF16",
    "PREFILL_GDN",
    "DEFAULT_VARIANT",
    "SOURCES",
    "HEAD_DIMS",
    # the family's other public names (also importable from here before the split)
    "chunk_instances",
    "SERIAL_SOURCES",
    "CHUNK",
    "CONV_TILE",
    "STATE_COLS",
    "STEP_COLS",
    "STEP_CLUSTER",
    "STEP_CLUSTER_MAX_SEQS",
]


# every instance the warm-up compiles (ninfer.cuda.all_sources): the conv, the default chunked variant's two
# passes, the recurrence; the other chunked variants and SERIAL_SOURCES compile on first use
SOURCES: dict[str, tuple[str, ...]] = {
    "gdn.cu": CONV_SOURCES,
    "gdn_chunk.cu": chunk_instances(DEFAULT_VARIANT),
    "gdn_step.cu": STEP_SOURCES,
}
