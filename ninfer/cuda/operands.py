"""Resident prefill operands: the fp16 weight operands of the prefill GEMM kept on the device between calls.

The fp16 mode's scratch kernels (gemm_pair.py, docs/cuda.md "Prefill GEMM inputs") read each weight as fp16 values
that ``dequant90<D, true>`` writes into a scratch buffer at every GEMM: ~4.6 bytes of memory traffic per weight per
call, whatever the number of rows. On the H200 that pass took 16.7 ms of a 27B 4096-token chunk and 16.4 ms of its
256-token follow-up turn (perf/results/timeline_prefill_1e66f7e.txt), a fifth of the follow-up's GPU time. Where
device memory is left over after the runner's plan (weights, KV pool, GDN slots, workspace, graph pools), the
operands are kept instead: each weight is dequantized once, by the same kernel into a buffer of its own, on its
first prefill GEMM (the runner's start-up ``warm_prefill`` runs one), and every later GEMM reads that buffer. The
operand values are the ones the scratch would hold, and the GEMM kernels are unchanged, so every result is bitwise
the same with or without residency (GPU test ``tests/test_cuda_operands.py``).

``OperandStore`` is the bookkeeping (pure Python; the caller allocates and fills): a byte budget, admitted in first-use
order until it is spent, so a partial budget keeps the first weights and the rest take the scratch as before.
``prefill_weights`` (``ninfer serve --prefill-weights``): ``auto`` keeps what the memory plan leaves room for,
``resident`` requires every eligible weight to fit (the plan fails otherwise), ``scratch`` keeps none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["PREFILL_WEIGHTS", "OperandStore", "budget", "eligible_bytes", "prefill_gemm_weight"]

PREFILL_WEIGHTS = ("auto", "resident", "scratch")

# the weights that the prefill runs as dense GEMMs (model_layers.linear above 8 rows, the router from
# model_layers.ROUTER_GEMM_ROWS): attention q|k|v|gate and o,
# the GDN in- and out-projections, the dense MLP and an MoE shared expert that is not appended to the routed experts
# (those run as grouped GEMMs converting their tiles in the main loop, with no scratch to save); the LM head runs as
# a GEMV in prefill, the MTP head's products only in speculation
_SUFFIXES = (
    ".self_attn.qkvg_proj",
    ".self_attn.o_proj.weight",
    ".in_proj",
    ".out_proj.weight",
    ".mlp.gate_up_proj",
    ".mlp.down_proj.weight",
    ".mlp.shared_expert.gate_up_proj",
    ".mlp.shared_expert.down_proj.weight",
    ".mlp.router_gates",  # an MoE prefill's router: the exact pair mode's bf16 operand (model_layers._router)
)


def prefill_gemm_weight(name: str) -> bool:
    """Whether the weight ``name`` (a key of the network's fused weights) is a dense prefill GEMM operand."""
    return not name.startswith("mtp.") and name.endswith(_SUFFIXES)


def eligible_bytes(weights: Iterable[tuple[str, Any]], foldable: Any, extra: Any = None) -> int:
    """Bytes of the fp16 operands of the dense prefill weights among ``(name, weight)`` pairs that
    ``foldable(fmt, rows, cols)`` accepts (weights of several formats, ``FusedRuns``, are left out: each run's GEMM
    is small); ``extra(fmt, rows, cols)``: bytes a format keeps beside its fp16 rows (the group formats' scales)."""
    total = 0
    for name, w in weights:
        fmt = getattr(w, "fmt", None)
        if not (isinstance(fmt, str) and prefill_gemm_weight(name)):
            continue
        n, k = int(w.rows), int(w.cols)
        if foldable(fmt, n, k):
            total += 2 * n * k + (extra(fmt, n, k) if extra else 0)
    return total


def budget(mode: str, want: int, room: int) -> int:
    """The operand budget of ``prefill_weights`` ``mode`` for ``want`` bytes of eligible operands and ``room`` bytes
    to spare: all of them for "resident" (whoever sized ``room`` refuses if they do not fit), what fits for "auto",
    none for "scratch"."""
    if mode not in PREFILL_WEIGHTS:
        raise ValueError(f"prefill_weights: one of {PREFILL_WEIGHTS}, got {mode!r}")
    return want if mode == "resident" else 0 if mode == "scratch" else max(0, min(want, room))


def _key(w: Any) -> tuple[Any, ...]:
    """A weight's identity: its device buffer's address and size, plane offsets, format and shape. The store keeps a
    reference to the buffer, so the address cannot be reused by another weight while the entry exists."""
    return (int(w.data.data.ptr), int(w.data.size), tuple(w.offsets), w.fmt, tuple(w.shape))


class OperandStore:
    """fp16 prefill operands kept per weight, up to ``budget`` bytes (0: none). Not thread-safe: the model runner's
    one thread uses it."""

    def __init__(self, budget: int = 0) -> None:
        self.budget = 0
        self.used = 0
        # key -> (the operand buffer, the weight's data: kept alive so that its address stays its own)
        self._bufs: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self._refused: dict[tuple[Any, ...], Any] = {}  # key -> the weight's data (its address stays its own)
        self.set_budget(budget)

    def set_budget(self, budget: int) -> None:
        """A new budget; operands kept beyond it are dropped (the device memory returns to the pool)."""
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise ValueError(f"OperandStore: budget must be a non-negative integer, got {budget!r}")
        self.budget = budget
        if self.used > budget:
            self.clear()

    def lookup(self, w: Any, kind: str = "f16") -> Any | None:
        """The kept operand of ``w`` (``kind``: "f16" the fp16 mode's values, "bf16" the exact pair mode's), or None."""
        hit = self._bufs.get((*_key(w), kind))
        return None if hit is None else hit[0]

    def admit(self, nbytes: int) -> bool:
        """Whether an operand of ``nbytes`` fits the budget now; if so the bytes are counted as used."""
        if self.used + nbytes > self.budget:
            return False
        self.used += nbytes
        return True

    def keep(self, w: Any, buf: Any, kind: str = "f16") -> None:
        """Keep ``buf`` (admitted before) as ``w``'s operand of ``kind``."""
        self._bufs[(*_key(w), kind)] = (buf, w.data)

    def obtain(self, w: Any, kind: str, nbytes: int, build: Callable[[], Any]) -> Any | None:
        """``w``'s kept operand of ``kind``, built now by ``build()`` (``nbytes`` of device memory) if the store has
        none yet and its budget admits it; None: not kept (no room, or refused). ``build`` may return None: the
        weight has no such operand (BF16 values fp16 does not hold exactly, gemm_bf16.py), which is remembered
        (:meth:`refuse`), so that later calls do not build it again."""
        hit = self.lookup(w, kind)
        if hit is not None or self.refused(w, kind) or not self.admit(nbytes):
            return hit
        buf = build()
        if buf is None:
            self.refuse(w, kind, nbytes)
        else:
            self.keep(w, buf, kind)
        return buf

    def refuse(self, w: Any, kind: str, nbytes: int) -> None:
        """Give back ``nbytes`` admitted for ``w``'s operand of ``kind`` and remember that it has none (BF16 weights
        whose values fp16 does not hold exactly: gemm_bf16.py), so that later calls do not build it again."""
        self.used -= nbytes
        self._refused[(*_key(w), kind)] = w.data

    def refused(self, w: Any, kind: str) -> bool:
        """Whether ``w``'s operand of ``kind`` was refused (:meth:`refuse`)."""
        return (*_key(w), kind) in self._refused

    def clear(self) -> None:
        """Drop every kept operand (the refusals stay: they are the weights' values', not the budget's)."""
        self._bufs.clear()
        self.used = 0

    def __len__(self) -> int:
        return len(self._bufs)
