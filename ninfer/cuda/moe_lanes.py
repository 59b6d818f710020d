"""MoE prefill of short chunks as an expert-dispatch GEMV: up to 8 rows of one expert per slot (cuda_src/moe_lanes.cu
builds the slot table on the device, cuda_src/gemv.cu ``experts == 2`` runs it; ``gemv_experts.gemv_expert_lanes``).

Why: with T tokens of top-k routing over E experts an expert gets about ``T * k / E`` rows (8 for a 256-token chunk
of the 35B-A3B: 256 x 8 / 256), so the grouped GEMM's 128-row tiles are mostly padding, and a tile costs its 128
rows of tensor-core work whatever it holds. A GEMV slot instead streams and dequantizes the expert's weights once
for its 1..NB rows (the rows are the mma's N columns: free), so its cost does not grow with padding.

The switch (:data:`LANES_MAX_AVG_ROWS`) compares the two per expert of c rows. Lanes: ceil(c / 8) slots, each about
one pass over the expert's weights at the GEMV's dequantization rate (27B gate|up, 4 rows, NVFP4 on the H200 at
d82349e: 178 M weights in 50.6 us, 3.5 M weights/us; the 35B expert's gate|up + down is 3.1 M weights, so
~0.9 us per slot, ~1 us allowing the 8-lane staging). Grouped GEMM: ceil(c / 128) tiles; the same run measured
gemm_experts at 74.9 ms for a 256-token chunk = 1.87 ms per layer over ~272 tile rows (256 experts with a partial
tile + 16), ~6.9 us per tile row for both projections. Per expert the lanes win while ceil(c / 8) x 1.0 < 6.9,
i.e. up to ~48 rows, and lose by up to 2x once an expert fills whole tiles. Routing is uneven (a few hot experts
hold several times the average), which favours the GEMM on those, so the switch on the chunk's average sits below
the per-expert crossover. Measured on the H200 at cedd073 (``python -m perf.bench_moe_lanes``,
perf/results/bench_moe_lanes.json, ms per layer, grouped GEMM / 8 lanes): 256 tokens 2.10 / 0.65, 512 2.09 / 0.97,
1024 2.15 / 1.60, 2048 2.33 / 2.85. But the whole 35B-A3B prefill of one 1024-token chunk (``ninfer-perf``, same
run) was slower through the lanes than through the GEMM the run before (8,140 against 10,806 tok/s; not explained,
the benchmark times the two expert products alone), while the 256-token follow-up turn gained (80 -> 71 ms). So
the switch sits at what the model-level runs showed: 8 rows per expert on average, chunks of up to 256 tokens on the
35B-A3B.

Lanes per slot (:data:`LANES_NB4_MAX_AVG_ROWS`): the 4-lane instance stages half the 8-lane one's activations per
K-tile; with about one row per expert on average most hit experts hold 1-4 rows, so 4 lanes fill the same number
of slots for less staging; above, 8 lanes save slots. Measured (same run): 16 tokens (0.5 rows per expert) 4 lanes
0.383 ms / 8 lanes 0.392; 64 tokens (2 rows) 0.440 / 0.432.

Results: each row is bitwise its decode result (``gemv_experts``: the same lane arithmetic and K splits), so
prefill through the lanes equals decode exactly for the expert products, and the exact mode (``prefill_gemm`` off)
takes the lanes for every multi-row chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, check_array
from ninfer.cuda.loader import kernel

__all__ = [
    "SOURCES",
    "LANES_MAX_AVG_ROWS",
    "LANES_NB4_MAX_AVG_ROWS",
    "SLOTS_PER_LAUNCH",
    "ExpertLanes",
    "use_lanes",
    "lanes_nb",
    "slot_bound",
    "expert_lanes",
    "expert_lanes_product",
    "lanes_workspace_bytes",
]

SOURCES: dict[str, tuple[str, ...]] = {"moe_lanes.cu": tuple(f"gemv_lanes_table<{nb}>" for nb in (4, 8))}
LANES_MAX_AVG_ROWS = 8  # routed rows per expert, on average, up to which prefill takes the lanes (see above)
LANES_NB4_MAX_AVG_ROWS = 1  # ... and up to which a slot has 4 lanes instead of 8
# Slots per GEMV launch: bounds the K-split partials (gemv.cu writes one [rows, 8] fp32 block per row block and split
# of every slot: 131 KB per slot on the 35B's gate|up, so 134 MB for 1024 slots; the launches reuse it in turn).
# 1024 slots of 32 blocks are ~60 waves of an H200: the launch boundaries cost no measurable tail.
SLOTS_PER_LAUNCH = 1024
_TABLE_THREADS = 1024  # one block of gemv_lanes_table: experts + 1 <= threads


def use_lanes(pairs: int, experts: int) -> bool:
    """Whether a prefill chunk of ``pairs`` routed (token, expert) pairs over ``experts`` routed experts takes the
    expert lanes rather than the grouped GEMM (:data:`LANES_MAX_AVG_ROWS`)."""
    return pairs <= LANES_MAX_AVG_ROWS * experts


def lanes_nb(pairs: int, experts: int) -> int:
    """Lanes per slot (4 or 8) for ``pairs`` routed pairs over ``experts`` experts."""
    return 4 if pairs <= LANES_NB4_MAX_AVG_ROWS * experts else 8


def slot_bound(pairs: int, experts: int, nb: int) -> int:
    """Slots the table is sized for: sum over experts of ceil(c_e / nb) <= floor(S / nb) + E, and <= S."""
    return min(pairs, pairs // nb + experts)


@dataclass(frozen=True, slots=True)
class ExpertLanes:
    """The slot table of one MoE layer's chunk (cuda_src/moe_lanes.cu): ``sid[Z]`` the slot's expert (-1 empty),
    ``tx`` / ``ts`` ``[Z * 2 * nb]`` per slot the lanes' input rows then output rows: ``tx`` reads token rows (the
    gate|up input), ``ts`` sorted-pair rows (the down projection); both write sorted-pair rows."""

    nb: int
    sid: Any
    tx: Any
    ts: Any

    @property
    def slots(self) -> int:
        return int(self.sid.shape[0])


def expert_lanes(ids: Any, xrow: Any, experts: int, nb: int) -> ExpertLanes:
    """The slot table for ``ids`` (int32 ``[S]``, sorted by expert, values in ``[0, experts)``) and ``xrow`` (their
    token rows), one launch, no host synchronization."""
    import cupy

    if nb not in (4, 8):
        raise KernelError(f"expert_lanes: nb={nb}; 4 or 8")
    if not (1 <= experts < _TABLE_THREADS):
        raise KernelError(f"expert_lanes: {experts} experts; 1..{_TABLE_THREADS - 1}")
    check_array(ids, "ids", dtype=np.int32, shape=(None,))
    s = ids.shape[0]
    check_array(xrow, "xrow", dtype=np.int32, shape=(s,))
    z = slot_bound(s, experts, nb)
    sid = cupy.empty(z, dtype=np.int32)
    tx, ts = (cupy.empty(z * 2 * nb, dtype=np.int32) for _ in range(2))
    if z:
        fn = kernel("moe_lanes.cu", SOURCES["moe_lanes.cu"], f"gemv_lanes_table<{nb}>")
        smem = (experts + 1 + _TABLE_THREADS) * 4
        args = (ids, xrow, np.int32(s), np.int32(experts), np.int32(z), sid, tx, ts)
        fn((1,), (_TABLE_THREADS,), args, shared_mem=smem)
    return ExpertLanes(nb, sid, tx, ts)


def expert_lanes_product(
    x: Any, w: Any, lanes: ExpertLanes, n: int, out: Any, *, gate_up: bool, swiglu: bool = False
) -> Any:
    """``out[s] = x[row] · W_e[ids[s]]ᵀ`` for every sorted pair ``s``: ``gate_up`` reads ``x`` by token row (the
    ``tx`` table), else by pair row (``ts``); launches of at most :data:`SLOTS_PER_LAUNCH` slots."""
    from ninfer.cuda.gemv_experts import gemv_expert_lanes

    table, step = (lanes.tx if gate_up else lanes.ts), 2 * lanes.nb
    for z0 in range(0, lanes.slots, SLOTS_PER_LAUNCH):
        z1 = min(lanes.slots, z0 + SLOTS_PER_LAUNCH)
        gemv_expert_lanes(
            x, w, lanes.sid[z0:z1], table[z0 * step : z1 * step], n, out, nb=lanes.nb, swiglu=swiglu
        )
    return out


def lanes_workspace_bytes(n: int, k: int, slots: int) -> int:
    """The largest K-split partial buffer of one lanes launch of ``slots`` slots (capped at SLOTS_PER_LAUNCH) for an
    ``[n, k]`` expert matrix, over every weight format (linear.gemv_plan)."""
    from ninfer.cuda.linear import FRAG_STRUCTS, gemv_plan

    per = 0
    for fmt in FRAG_STRUCTS:
        p = gemv_plan(fmt, n, k)
        if p.splits > 1:
            per = max(per, p.blocks_x * p.splits * p.rows * 8 * 4)
    return min(slots, SLOTS_PER_LAUNCH) * per
