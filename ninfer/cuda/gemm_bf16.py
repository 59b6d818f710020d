"""BF16 weights in the fp16-mode prefill GEMM (docs/cuda.md, "BF16 weights in the fp16 mode").

A bf16 weight has 8 significant bits and fp16 11, but fp16's exponent range is narrow: a bf16 value is not an fp16
value in general. Scaled by a power of two per weight row, 2^k with the row's largest |w| in [2^14, 2^15) (the
activations' rule, ``f16row_scale``), every weight of the row is exactly an fp16 unless it is more than ~2^31 below
the row's largest (its low bits fall under fp16's 2^-24). So ``bf16_f16_rows`` writes the scaled rows as fp16 words
and 2^-k per row, and counts the weights that do not come out exact; a weight with none takes the warp-specialized
fp16 GEMM (``gemm90_f16_ws<DqFolded<RowPow2>>``: the row's 2^-k in the epilogue, as NVFP4's row scale), one MMA per
product instead of the exact pair mode's two. The check reads a count back to the host once per weight, so the
operand exists only kept (an ``OperandStore``, when the GEMM is given one): the first call builds it, and a weight
with an inexact value is remembered as refused and keeps the pair mode. What differs from the exact path is only
the fp16 rounding of the activations, as for every format in the fp16 mode.

``gemm_plan.BF16_F16`` (on) routes ``gemm(..., inputs="fp16", operands=...)`` here for weights of at least
``gemm_plan.BF16_F16_MIN_ELEMS`` (the small, precision-critical tensors every profile keeps BF16 stay exact); the
element rule ``bf16_f16_scaled`` is also checked on the CPU, tests/test_gemm_f16_host.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ninfer.cuda import gemm_plan, gemm_rows
from ninfer.cuda.gemm_pair import launch_ws
from ninfer.cuda.gemm_plan import PAIR_MIN_ROWS, forced_splits, splitk_splits

__all__ = [
    "BF16_WS_INSTANCES",
    "BF16_SM90_INSTANCES",
    "bf16_f16_ok",
    "bf16_operands",
    "bf16_operand_extra",
    "gemm_bf16_f16",
]

_STRUCT = "DqFolded<RowPow2>"
BF16_WS_INSTANCES: tuple[str, ...] = (f"gemm90_f16_ws<{_STRUCT}>", f"gemm90_f16_ws_reduce<{_STRUCT}>")
BF16_SM90_INSTANCES: tuple[str, ...] = ("bf16_f16_rows",)
_KIND = "f16row"  # the OperandStore kind: (fp16 rows, row factors)


def bf16_f16_ok(fmt: str, t: str, m: int, n: int, k: int) -> bool:
    """Whether ``gemm(x, w, inputs="fp16", operands=...)`` tries this path: ``gemm_plan.BF16_F16`` on, a BF16
    weight of at least ``BF16_F16_MIN_ELEMS``, float32 rows, at least the fp16 mode's row floor, TMA's 16-byte row
    stride (K % 8)."""
    return bf16_operands(fmt, n, k) and t == "float" and m >= PAIR_MIN_ROWS and k % 8 == 0


def bf16_operands(fmt: str, n: int, k: int) -> bool:
    """Whether the fp16 mode keeps an operand of an ``n`` x ``k`` weight of format ``fmt`` on this path (the memory
    plan's resident operands)."""
    return gemm_plan.BF16_F16 and fmt == "BF16" and n * k >= gemm_plan.BF16_F16_MIN_ELEMS


def bf16_operand_extra(fmt: str, n: int, k: int) -> int:
    """Bytes a kept operand holds beside its fp16 rows: BF16's float32 row factors, else none."""
    return 4 * n if fmt == "BF16" else 0


def _operand(w: Any, kernel_of: Callable[[str], Any], operands: Any) -> tuple[Any, Any] | None:
    """(fp16 rows [N, K], float32 2^-k [N]) of ``w`` kept in ``operands``, built on first use if its budget admits
    them; None if not kept or refused (a weight fp16 does not hold exactly)."""
    n, k = int(w.rows), int(w.cols)

    def build() -> tuple[Any, Any] | None:
        import cupy

        rows, rs, bad = cupy.empty(n * k, np.uint16), cupy.empty(n, np.float32), cupy.zeros(1, np.int32)
        kernel_of("bf16_f16_rows")(
            (n,), (256,), (w.planes()[0], rows, rs, bad, np.int32(n), np.int32(k), np.int64(0))
        )
        # one read-back per weight, on its first prefill GEMM; an inexact weight is refused (OperandStore.obtain)
        return None if int(bad.get()[0]) else (rows, rs)

    return operands.obtain(w, _KIND, 2 * n * k + bf16_operand_extra(w.fmt, n, k), build)


def gemm_bf16_f16(
    x: Any,
    w: Any,
    out: Any,
    dims: tuple[int, int, int, int, int],
    kernel_of: Callable[[str], Any],
    *,
    variant: str = "auto",
    operands: Any = None,
) -> bool:
    """``out = x · Wᵀ`` for a BF16 ``w`` in the fp16 mode from its kept exact fp16 operand (where
    :func:`bf16_f16_ok`); False, with nothing computed, where there is none (no store, no room, or an inexact
    weight): the caller takes the pair mode. ``dims`` = (M, N, K, ldx, ldy); ``variant`` ``ws<S>`` forces S K
    splits, otherwise the split rule's S (gemm_pair's)."""
    if operands is None:
        return False
    kept = _operand(w, kernel_of, operands)
    if kept is None:
        return False
    m, n, k, ldx, ldy = dims
    rows, rs = kept
    xh, rowf = gemm_rows.f16_input(x, ldx, kernel_of)
    forced = forced_splits(variant)
    splits = forced if forced is not None else splitk_splits(m, n, k)
    fn = kernel_of(f"gemm90_f16_ws<{_STRUCT}>")
    red = kernel_of(f"gemm90_f16_ws_reduce<{_STRUCT}>") if splits > 1 else None
    launch_ws(fn, xh, rowf, (rows, rows, rs), out, (m, n, k, ldy), splits=splits, reduce_fn=red)
    return True
