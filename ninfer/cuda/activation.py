"""SwiGLU over fused [gate | up] rows and the sigmoid output gate of gated attention (cuda_src/activation.cu)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.cuda._common import KernelError, act_type, check_rows
from ninfer.cuda.loader import kernel

__all__ = ["swiglu", "sigmoid_gate", "SOURCES"]

_T = ("float", "bf16")
SOURCES: dict[str, tuple[str, ...]] = {
    "activation.cu": tuple(f"swiglu<{t}>" for t in _T) + tuple(f"sigmoid_gate<{t}>" for t in _T)
}
_THREADS, _ILP = 256, 4  # activation.cu's block size and AC_ILP
_BLOCKS = 8192  # about this many blocks per launch (both grid axes are grid-stride loops)


def _grid(rows: int, width: int) -> tuple[int, int]:
    """(column blocks, row blocks): a row's columns over x, the rows over y (gridDim.y <= 65535)."""
    x = max(1, min(64, -(-width // (_THREADS * _ILP))))
    return x, max(1, min(rows, 65535, _BLOCKS // x))


def swiglu(gu: Any, out: Any = None) -> Any:
    """``silu(gu[:, :I]) * gu[:, I:]`` for fused ``gu[T, 2I]`` (gate rows first, as stored)."""
    import cupy

    t = act_type(gu, "gu")
    rows, two_i, ldg = check_rows(gu, "gu")
    if two_i % 2:
        raise KernelError(f"gu: width {two_i} is not 2·I")
    i = two_i // 2
    if out is None:
        out = cupy.empty((rows, i), dtype=gu.dtype)
    _, _, ldo = check_rows(out, "out", i)
    if out.dtype != gu.dtype or out.shape[0] != rows:
        raise KernelError(f"out: must be {gu.dtype} [{rows}, {i}]")
    if rows:
        fn = kernel("activation.cu", SOURCES["activation.cu"], f"swiglu<{t}>")
        fn(_grid(rows, i), (_THREADS,), (gu, out, np.int32(rows), np.int32(i), np.int64(ldg), np.int64(ldo)))
    return out


def sigmoid_gate(x: Any, qg: Any, heads: int, head_dim: int, out: Any = None) -> Any:
    """``x ⊙ sigmoid(gate)`` for attention output ``x[T, heads·D]``, the gate read in place from the q_proj output
    ``qg[T, heads·2D]`` (each head holds [query D | gate D])."""
    import cupy

    t = act_type(x, "x")
    rows, width, ldx = check_rows(x, "x", heads * head_dim)
    _, _, ldq = check_rows(qg, "qg", heads * 2 * head_dim)
    if qg.dtype != x.dtype or qg.shape[0] != rows:
        raise KernelError(f"qg: must be {x.dtype} [{rows}, {heads * 2 * head_dim}]")
    if out is None:
        out = cupy.empty((rows, width), dtype=x.dtype)
    _, _, ldo = check_rows(out, "out", width)
    if rows:
        fn = kernel("activation.cu", SOURCES["activation.cu"], f"sigmoid_gate<{t}>")
        gate = qg[:, head_dim:]  # first gate element of head 0
        fn(
            _grid(rows, width),
            (_THREADS,),
            (
                x,
                gate,
                out,
                np.int32(rows),
                np.int32(heads),
                np.int32(head_dim),
                np.int64(ldx),
                np.int64(ldq),
                np.int64(2 * head_dim),
                np.int64(ldo),
            ),
        )
    return out
