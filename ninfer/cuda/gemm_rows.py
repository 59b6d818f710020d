"""The fp16 prefill GEMM's activation rows and the Hopper prefill GEMMs' scratch (docs/cuda.md, "Prefill GEMM
inputs"): ``split_f16row`` and its input transforms (a row gather, the SwiGLU of [gate | up] rows, the attention
output gate) write float32 rows as fp16 words times a power of two per row, once per GEMM, into a grow-only scratch
per (device, stream); the pair GEMM's hi / lo rows and weight copy and the split-K partials (gemm_pair.py) use the
same scratch.

The kernels come through ``kernel_of`` (gemm.py's compiled gemm_sm90.cu module), so this module does not import gemm
(no cycle). Tests that run the GEMM wrappers on NumPy stand-ins patch :func:`_scratch` here: every reader (this
module, gemm_pair.py) looks it up in this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ninfer.cuda._common import F16Rows

__all__ = ["f16_rows", "f16_scratch", "f16_token_rows", "release_scratch"]

_SPLIT_THREADS = 256
# split_f16row_in keeps a row's transformed inputs in shared memory up to this many bytes (the 27B's 17408-wide
# down-projection rows: 68 KB, three blocks per SM), else reads them twice
_SPLIT_KEEP_BYTES = 96 << 10
# (device, stream, kind) -> grow-only uint16 buffer: sized by the largest call so far (at most gemm_plan.py's caps),
# then reused without allocating; one per stream, so GEMMs on different streams never share one.
_SCRATCH: dict[tuple[int, int, str], Any] = {}


def _scratch(kind: str, elems: int) -> Any:
    import cupy

    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, kind)
    buf = _SCRATCH.get(key)
    if buf is None or buf.size < elems:
        _SCRATCH.pop(key, None)  # the pool reuses the old block (stream-ordered) for the new one
        buf = _SCRATCH[key] = cupy.empty(elems, dtype=np.uint16)
    return buf[:elems]


def release_scratch() -> None:
    """Drop the cached scratch buffers (tests, or to give the memory back to the pool)."""
    _SCRATCH.clear()


def f16_rows(
    x: Any,
    ldx: int,
    kernel_of: Callable[[str], Any],
    *,
    rows: Any = None,
    swiglu: bool = False,
    gate: tuple[Any, int] | None = None,
) -> tuple[Any, Any]:
    """The fp16 mode's activation rows for a kernel that reads them itself (the MoE prefill GEMM): ``split_f16row``
    of float32 ``x[M, K]`` (row stride ``ldx``, M > 0) into the scratch, as (fp16 words ``[M, K]`` as uint16, one
    float32 factor per row). Input transforms, bitwise the same as applying them first (``split_f16row_in``):
    ``rows`` (int32 ``[M']`` on the device), row m is ``x[rows[m]]``; ``swiglu``, ``x`` holds [gate | up] rows of
    width 2K and row m is their SwiGLU; ``gate=(qg, D)`` (alone), row m is ``x[m] * sigmoid(gate)`` with the gate
    read in place from the q|gate projection ``qg[M, 2K]`` ([query D | gate D] per head; D % 8 == 0, 16-byte
    aligned rows: ``split_f16row_gate``), sigmoid_gate's values. Not for graph capture (the scratch may be
    reallocated)."""
    m = x.shape[0] if rows is None else rows.shape[0]
    k = x.shape[1] // 2 if swiglu else x.shape[1]
    xh, rowf = f16_scratch(m, k)
    if gate is not None:
        if rows is not None or swiglu:
            raise ValueError("f16_rows: the gate is the only transform of its rows")
        _split_gate(x, ldx, kernel_of("split_f16row_gate"), gate, xh, rowf)
        return xh, rowf
    if rows is None and not swiglu:
        kernel_of("split_f16row")(
            (m,), (_SPLIT_THREADS,), (x, xh, rowf, np.int32(m), np.int32(k), np.int64(ldx))
        )
        return xh, rowf
    fn = kernel_of(f"split_f16row_in<{str(rows is not None).lower()}, {str(swiglu).lower()}>")
    # the row's inputs kept in shared memory between the kernel's two passes
    keep = 4 * k <= _SPLIT_KEEP_BYTES
    if keep and fn.max_dynamic_shared_size_bytes < 4 * k:
        fn.max_dynamic_shared_size_bytes = _SPLIT_KEEP_BYTES
    ptr = rows if rows is not None else np.uint64(0)
    args = (x, ptr, xh, rowf, np.int32(m), np.int32(k), np.int64(ldx), np.int32(keep))
    fn((m,), (_SPLIT_THREADS,), args, shared_mem=4 * k if keep else 0)
    return xh, rowf


def f16_input(x: Any, ldx: int, kernel_of: Callable[[str], Any]) -> tuple[Any, Any]:
    """(fp16 words, row factors) of ``x``: an ``F16Rows``' own arrays, else :func:`f16_rows` of float32 rows."""
    return (x.xh, x.rowf) if isinstance(x, F16Rows) else f16_rows(x, ldx, kernel_of)


def f16_scratch(m: int, k: int) -> tuple[Any, Any]:
    """The fp16 row scratch of ``m`` rows of ``k``: (fp16 words, flat ``[m k]`` uint16; ``m`` float32 factors)."""
    buf = _scratch("x", m * k + 2 * m)
    return buf[: m * k], buf[m * k : m * k + 2 * m].view(np.float32)


def f16_token_rows(x: Any, ldx: int, kernel_of: Callable[[str], Any], rows: Any) -> tuple[Any, Any]:
    """The fp16 rows of a GEMM whose slot s reads token row ``rows[s]`` in place (gemm90_experts_f16g):
    ``split_f16row`` of the tokens' float32 ``x[T, K]`` (row stride ``ldx``, T > 0) into the scratch, as (fp16 words
    ``[T, K]`` as uint16, one float32 factor per SLOT: its token row's factor, gathered by ``take``). Each
    token's row is split once, not once per slot: its words depend only on that row, so the GEMM's operands are
    bitwise those of ``f16_rows(x, ldx, kernel_of, rows=rows)``. Not for graph capture (the scratch may be
    reallocated)."""
    t, k, s = x.shape[0], x.shape[1], rows.shape[0]
    buf = _scratch("x", t * k + 2 * t + 2 * s)
    xh, rowf = buf[: t * k], buf[t * k : t * k + 2 * t].view(np.float32)
    rowf_s = buf[t * k + 2 * t : t * k + 2 * t + 2 * s].view(np.float32)
    kernel_of("split_f16row")((t,), (_SPLIT_THREADS,), (x, xh, rowf, np.int32(t), np.int32(k), np.int64(ldx)))
    rowf.take(rows, out=rowf_s)  # one small launch: the slots' factors
    return xh, rowf_s


def _split_gate(x: Any, ldx: int, fn: Any, gate: tuple[Any, int], xh: Any, rowf: Any) -> None:
    """split_f16row_gate (``fn``) of ``x[M, K]`` with the gate of ``gate=(qg, D)`` into ``xh``, ``rowf``: the kernel
    reads the gate as sigmoid_gate does, from head 0's first gate element ``qg[:, D:]`` with qg's row stride; the
    row's gated values kept in shared memory between its two passes as split_f16row_in's are."""
    (m, k), (qg, d) = x.shape, gate
    keep = 4 * k <= _SPLIT_KEEP_BYTES
    if keep and fn.max_dynamic_shared_size_bytes < 4 * k:
        fn.max_dynamic_shared_size_bytes = _SPLIT_KEEP_BYTES
    args = (x, qg[:, d:], xh, rowf, np.int32(m), np.int32(k), np.int64(ldx), np.int32(d),
            np.int64(qg.strides[0] // 4), np.int32(keep))  # fmt: skip
    fn((m,), (_SPLIT_THREADS,), args, shared_mem=4 * k if keep else 0)
