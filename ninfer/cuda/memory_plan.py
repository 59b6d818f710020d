"""The device-memory plan of the CUDA runner, computed before anything but the weights is allocated.

Parts: weights (as uploaded), the KV page pool (every full-attention layer, K and V, plus one scratch page; fp8
pages also hold one float32 scale per token and KV head),
GDN state slots for the lanes and for checkpoints (plus one scratch slot), the prefill workspace (temporaries of
one ``prefill_chunk`` forward, the largest layer alive at once, an estimate, the prefill GEMM's pair-mode scratch,
the chunked GDN rule's scratch and the MoE expert lanes' split partials,
plus the device sampler's
per-lane vocabulary buffers, and the host tier's staging pages when it has one), and the CUDA-graph pools (one decode
step's temporaries per lane count, an estimate; the runner reports the measured size after capture).
A reserve (``ninfer serve --memory-reserve-gib``) is taken off the free memory before the plan is checked, so the
desktop and other programs keep that much.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ninfer.config import ModelConfig
from ninfer.cuda.attention import rows_per_launch, split_plan, workspace_bytes
from ninfer.cuda.attention_prefill import SPLIT_SCRATCH_BYTES
from ninfer.cuda.gdn import chunk_scratch_bytes
from ninfer.cuda.gemm_group import GROUP_STRUCTS, group_scratch_bytes
from ninfer.cuda.gemm_pair import pair_scratch_bytes, splitk_scratch_bytes
from ninfer.cuda.host_tier import stage_pages
from ninfer.cuda.moe_lanes import lanes_workspace_bytes, slot_bound

__all__ = ["MemoryPlan", "plan_memory", "MemoryPlanError", "KV_HEAD_BYTES", "kv_head_bytes", "kv_page_bytes"]

GIB = float(1 << 30)
HEADROOM = 0.04  # fraction of free memory left for the CUDA context, cuBLAS and allocator fragmentation
SAMPLER_BYTES_PER_ID = 12  # device sampling per lane: uint64 candidate keys + a float32 copy for penalties


class MemoryPlanError(MemoryError):
    """The planned device memory does not fit the free memory of the GPU; the message names the parts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan:
    weights: int
    kv_pool: int
    gdn_lanes: int
    checkpoints: int
    workspace: int
    graph_pools: int
    free: int  # device memory free before the plan (after the weights were uploaded: weights counted in it)
    # bytes that must stay free for other programs (``--memory-reserve-gib``): not ours to plan
    reserve: int = 0
    # the prefill GEMM's kept fp16 weight operands (ninfer/cuda/operands.py), sized after the rest: ``spare``
    prefill_operands: int = 0

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.kv_pool
            + self.gdn_lanes
            + self.checkpoints
            + self.workspace
            + self.graph_pools
            + self.prefill_operands
        )

    @property
    def spare(self) -> int:
        """Bytes the plan leaves unused within what ``check`` allows (negative: it does not fit)."""
        return int((self.available - self.weights) * (1 - HEADROOM)) - (self.total - self.weights)

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}

    def report(self) -> str:
        parts = ("weights", "kv_pool", "gdn_lanes", "checkpoints", "workspace", "graph_pools")
        parts += ("prefill_operands",)
        body = ", ".join(f"{p} {getattr(self, p) / GIB:.2f}" for p in parts)
        avail = f"{self.available / GIB:.2f} available"
        if self.reserve:
            avail += f" ({self.free / GIB:.2f} free less a reserve of {self.reserve / GIB:.2f})"
        return f"device memory plan (GiB): {body}; total {self.total / GIB:.2f} of {avail}"

    @property
    def available(self) -> int:
        """What the plan may use: the free memory less the reserve kept for other programs."""
        return self.free - self.reserve

    def check(self) -> None:
        if self.total - self.weights > (self.available - self.weights) * (1 - HEADROOM):
            raise MemoryPlanError(
                f"{self.report()}: does not fit; lower kv_capacity, max_concurrency, prefill_chunk or the "
                "checkpoint budget (or keep no prefill operands: --prefill-weights scratch)"
            )


# KV storage of one (token, KV head) of K or V: (bytes per element, bytes of per-row scale)
KV_HEAD_BYTES = {"bf16": (2, 0), "fp32": (4, 0), "fp8": (1, 4)}  # fp8: e4m3 codes + one float32 scale


GRAPH_LAYER_SLACK = 16 << 10  # bytes of small buffers per layer in a graph's pool (see plan_memory)


def has_group_weights(formats: Iterable[str]) -> bool:
    """Whether any of the weight ``formats`` is a group-int one (plan_memory's ``group_weights``)."""
    return any(f in GROUP_STRUCTS for f in formats)


def kv_head_bytes(mc: ModelConfig, kv_dtype: str) -> int:
    """Bytes of one token's K (or V) row of one KV head in the device cache, scale included."""
    elem, scale = KV_HEAD_BYTES[kv_dtype]
    return mc.head_dim * elem + scale


def kv_page_bytes(mc: ModelConfig, page_size: int, kv_dtype: str, extra_planes: int = 0) -> int:
    """One KV page of every full-attention layer, K and V (fp8: with their scales), as the device stores it;
    ``extra_planes``: KV planes after the model's layers (1: the MTP head's layer, with speculation)."""
    planes = len(mc.full_attention_layers) + extra_planes
    return 2 * planes * page_size * mc.num_key_value_heads * kv_head_bytes(mc, kv_dtype)


def snapshot_bytes(mc: ModelConfig, state_dtype: str) -> int:
    """One GDN checkpoint on the device: fp32 conv windows plus the recurrent state in ``state_dtype``."""
    conv = mc.gdn_conv_channels * (mc.linear_conv_kernel_dim - 1) * 4
    rec = mc.linear_num_value_heads * mc.linear_key_head_dim * mc.linear_value_head_dim
    return len(mc.linear_attention_layers) * (conv + rec * (2 if state_dtype == "bf16" else 4))


def _gemm_scratch(mc: ModelConfig, rows: int, group_weights: bool = True) -> int:
    """The Hopper prefill GEMM's pair-mode scratch (ninfer/cuda/gemm_plan.py): bf16 hi / lo of the widest GEMM
    input and a bf16 copy of the largest (fused) projection, both capped there; for an MoE model, room for the
    fp16 mode's expert rows too (gemm_rows.f16_rows: 2 * (K + 2) bytes per routed slot, uncapped; the shared
    expert runs as a dense GEMM beside the grouped one), the ws kernel's split-K partials (their own grow-only
    buffer) and the group formats' per-call scales (gemm_group.group_scratch_bytes; ``group_weights``: whether any
    weight is in a group format, else neither those scales nor the group kernel's split-K partials are counted).
    Added, not the larger of the two: the activation scratch grows by reallocation and CuPy's pool keeps the
    smaller block it replaced."""
    k_max = max(mc.hidden_size, mc.num_attention_heads * mc.head_dim, mc.gdn_value_dim, mc.intermediate_size,
                mc.shared_expert_intermediate_size)  # fmt: skip
    n_max = max(
        2 * mc.intermediate_size, 2 * mc.shared_expert_intermediate_size, _qkv_rows(mc), _gdn_in_rows(mc)
    )
    experts = 2 * rows * mc.num_experts_per_tok * (mc.hidden_size + 2) if mc.is_moe else 0
    shapes = _dense_shapes(mc)
    split = splitk_scratch_bytes(rows, shapes, group_weights) + group_scratch_bytes(
        rows, shapes, group_weights
    )
    return pair_scratch_bytes(rows, k_max, n_max * mc.hidden_size) + experts + split


def _qkv_rows(mc: ModelConfig) -> int:
    """Rows of the fused attention input projection (q | gate | k | v)."""
    return 2 * (mc.num_attention_heads + mc.num_key_value_heads) * mc.head_dim


def _gdn_in_rows(mc: ModelConfig) -> int:
    """Rows of the fused GDN input projection (q | k | v | z | b | a)."""
    return mc.gdn_conv_channels + mc.gdn_value_dim + 2 * mc.linear_num_value_heads


def _dense_shapes(mc: ModelConfig) -> list[tuple[int, int]]:
    """(N, K) of the dense prefill GEMMs that may take the fp16 mode's ws kernel with split-K (its fp32 partials:
    gemm_plan.splitk_scratch_bytes): attention q|gate|k|v and o, the GDN in- and out-projections, the dense MLP or
    the shared expert (gate|up fused, down)."""
    h, shapes = mc.hidden_size, []
    if mc.full_attention_layers:
        shapes += [(_qkv_rows(mc), h), (h, mc.num_attention_heads * mc.head_dim)]
    if mc.linear_attention_layers:
        shapes += [(_gdn_in_rows(mc), h), (h, mc.gdn_value_dim)]
    for inter in (mc.intermediate_size, mc.shared_expert_intermediate_size):
        if inter:
            shapes += [(2 * inter, h), (h, inter)]
    return shapes


def _gdn_scratch(mc: ModelConfig, rows: int) -> int:
    """The chunked delta rule's float32 scratch of one GDN layer's call (ninfer/cuda/gdn_chunk.py, freed to the pool
    after the call): W, U, A rows and gates per value head, normed q / k per key head."""
    if not mc.linear_attention_layers:
        return 0
    return chunk_scratch_bytes(rows, mc.linear_num_key_heads, mc.linear_num_value_heads, mc.linear_key_head_dim,
                               mc.linear_value_head_dim)  # fmt: skip


def _lanes_scratch(mc: ModelConfig, rows: int) -> int:
    """The MoE expert lanes' K-split partials (ninfer/cuda/moe_lanes.py: one launch of at most SLOTS_PER_LAUNCH
    slots alive at a time) for a chunk of ``rows`` tokens, shared expert included."""
    if not mc.is_moe:
        return 0
    k, e, inter = mc.num_experts_per_tok, mc.num_experts + 1, mc.moe_intermediate_size
    slots = slot_bound(rows * (k + 1), e, 4)
    return max(
        lanes_workspace_bytes(2 * inter, mc.hidden_size, slots),
        lanes_workspace_bytes(mc.hidden_size, inter, slots),
    )


def _widest(mc: ModelConfig) -> int:
    """Widest per-token activation a layer keeps alive at once (elements)."""
    attn = 2 * mc.num_attention_heads * mc.head_dim * 2 + 2 * mc.num_key_value_heads * mc.head_dim
    gdn = 2 * mc.gdn_conv_channels + 3 * mc.gdn_value_dim
    if mc.is_moe:
        k = mc.num_experts_per_tok
        ffn = k * (3 * mc.moe_intermediate_size + mc.hidden_size) + 3 * mc.shared_expert_intermediate_size
    else:
        ffn = 3 * mc.intermediate_size
    return max(attn, gdn, ffn) + 4 * mc.hidden_size


def plan_memory(
    mc: ModelConfig,
    *,
    weights: int,
    free: int,
    lanes: int,
    checkpoints: int,
    num_pages: int,
    page_size: int,
    max_context: int,
    prefill_chunk: int,
    attn_chunk: int,
    kv_dtype: str,
    state_dtype: str,
    act_bytes: int,
    graphs: bool,
    reserve: int = 0,
    extra_kv_planes: int = 0,
    verify_rows: int = 0,
    host_tier: bool = False,
    group_weights: bool = True,
) -> MemoryPlan:
    """The device memory of a CUDA runner's configuration. ``group_weights``: whether any weight is stored in a
    group-int format (gemm_group.GROUP_STRUCTS): only those need the group GEMM's scratch (True: counted)."""
    if kv_dtype not in KV_HEAD_BYTES:
        raise ValueError(f"kv_dtype: one of {tuple(KV_HEAD_BYTES)}, got {kv_dtype!r}")
    per_page = kv_page_bytes(mc, page_size, kv_dtype, extra_kv_planes)
    snap = snapshot_bytes(mc, state_dtype)
    split = split_plan(max_context, attn_chunk)
    hq, d = mc.num_attention_heads, mc.head_dim
    per_row = _widest(mc) * act_bytes + mc.hidden_size * 8

    def step(rows: int) -> int:  # attention: split partials of one launch (capped, attention.WS_CAP)
        attn_ws = workspace_bytes(rows_per_launch(rows, hq, d, split), hq, d, split)
        return rows * per_row + attn_ws + rows * mc.vocab_size * 4 * (2 if rows <= 8 else 0)

    # every graph's pool also holds its launches' small buffers (split-K / arrival partials, the folded norms' sums
    # of squares, routing tables), each rounded up to CuPy's 512-byte unit: up to ~9 KB a graph more than the terms
    # above on a tiny 4-layer MoE model's 43 spec and decode graphs on the H200 (tests/test_cuda_spec.py at e919d69),
    # ~2.2 KB a layer: GRAPH_LAYER_SLACK counts 16 KB a layer (the 27B: ~1 MB a graph)
    slack = GRAPH_LAYER_SLACK * mc.num_hidden_layers
    graph = sum(step(b) + slack for b in range(1, lanes + 1)) if graphs else 0
    if graphs and verify_rows:  # speculation: a verify graph per (b lanes, n = 2..verify_rows rows per lane)
        graph += sum(
            step(b * n) + b * n * mc.vocab_size * 4 + slack
            for b in range(1, lanes + 1)
            for n in range(2, verify_rows + 1)
        )
        # draft-step graphs (ninfer/cuda/spec_graphs.py): one per (b lanes, t rows), b <= t <= 8; logits [b, V] each
        # plus about t rows of one layer's temporaries (bounded by step(t) / layers, counted as step(t) / 8)
        graph += sum(
            b * mc.vocab_size * 4 + step(t) // 8 + slack
            for b in range(1, min(lanes, 8) + 1)
            for t in range(b, 9)
        )
    return MemoryPlan(
        weights=weights,
        kv_pool=(num_pages + 1) * per_page,
        gdn_lanes=(lanes + 1) * snap,
        checkpoints=checkpoints * snap,
        workspace=step(prefill_chunk)
        + _gemm_scratch(mc, prefill_chunk, group_weights)
        + _gdn_scratch(mc, prefill_chunk)
        + _lanes_scratch(mc, prefill_chunk)
        + (SPLIT_SCRATCH_BYTES if mc.full_attention_layers else 0)  # prefill attention's key-split partials
        + mc.vocab_size * 4 * 8
        + lanes * mc.vocab_size * SAMPLER_BYTES_PER_ID
        + (
            2 * stage_pages(per_page) * per_page if host_tier else 0
        ),  # the host tier's staging, and room for its checksum's temporaries (debug)
        graph_pools=graph,
        free=free,
        reserve=reserve,
    )
