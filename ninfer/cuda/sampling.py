"""GPU sampling (cuda_src/sampling.cu): the engine's exact sampler (``ninfer.engine.sampler``, whose docstring
defines it) on device rows, plus its building blocks, masked greedy argmax and the counter-based uniform.

``apply_penalties_rows`` penalizes a device copy of the rows in place; ``sample_rows`` picks one token per row
(each row over many blocks: exact integer histograms over bins of the logits, then an exact sort of only the bins
the cuts land in; docs/cuda.md); ``argmax_rows`` is its greedy pick (temperature <= 0) with each
row's vocabulary split over many blocks; ``sample_requests`` does these for the engine's ``SampleRequest`` list
(an all-greedy list through ``argmax_rows``: no per-row parameters to upload, no workspace of ``[B, V]``). Each
row's token is the NumPy ``sample`` token for the same inputs (see the sampler docstring for the one ulp of ``exp``
the two may differ by).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.cuda._common import (
    KernelError,
    act_type,
    arrival_counters,
    check_array,
    check_rows,
    grid_1d,
    stream_buffer,
)
from ninfer.cuda.loader import kernel

__all__ = [
    "argmax_masked",
    "counter_uniform",
    "apply_penalties_rows",
    "sample_rows",
    "argmax_rows",
    "sample_requests",
    "sample_requests_dev",
    "SOURCES",
]

SOURCES: dict[str, tuple[str, ...]] = {
    "sampling.cu": tuple(f"argmax_masked<{t}>" for t in ("float", "bf16"))
    + ("counter_uniform", "apply_penalties_rows", "sample_rows", "argmax_split")
    + ("split_max", "split_hist", "split_gather")
}
MAX_VOCAB = 1 << 20  # workspace entries pack the id in 20 bits; the mass sum stays below 2^64
_THREADS = 1024  # sample_rows: one block of 1024 threads per row
_ARGMAX_THREADS = 256  # argmax_split: ARGMAX_NT
# argmax_rows: ids per block (ARGMAX_NT x ARGMAX_UNROLL: each thread's loads all in flight at once)
ARGMAX_CHUNK = 2048
# sample_rows' split path (sample_split.cuh): ids per block, bins per row, the longest list sorted in shared memory;
# the histogram's blocks take HIST_SPAN chunks each (fewer blocks: fewer global atomics on the row's bins)
SPLIT_CHUNK, SPLIT_NB, SPLIT_CAP, HIST_SPAN = 2048, 2048, 2048, 4
_SPLIT_THREADS, _ST_STRIDE = 256, 8


def argmax_masked(logits: Any, mask: Any = None, *, limit: int | None = None) -> Any:
    """Greedy ids ``[B]`` (int32) of ``logits[B, V]`` over ids < ``limit`` allowed by the packed int32 bitmask
    ``mask[B, ceil(V/32)]``; ties to the lowest id; -1 where nothing is allowed."""
    import cupy

    t = act_type(logits, "logits")
    rows, v, ld = check_rows(logits, "logits")
    limit = v if limit is None else min(int(limit), v)
    ldm = 0
    if mask is not None:
        check_array(mask, "mask", dtype=np.int32, shape=(rows, -(-v // 32)))
        ldm = mask.shape[1]
    out = cupy.empty((rows,), dtype=np.int32)
    if rows:
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], f"argmax_masked<{t}>")
        null = np.uint64(0)  # a null pointer: no mask
        fn((rows,), (256,), (logits, mask if mask is not None else null, out, np.int32(v), np.int32(limit),
                             np.int64(ld), np.int64(ldm)))  # fmt: skip
    return out


def counter_uniform(seeds: Any, positions: Any) -> Any:
    """float64 uniforms in [0, 1) for uint64 ``seeds[n]`` and ``positions[n]`` (engine.sampler.uniform)."""
    import cupy

    check_array(seeds, "seeds", dtype=np.uint64, shape=(None,))
    n = seeds.shape[0]
    check_array(positions, "positions", dtype=np.uint64, shape=(n,))
    out = cupy.empty((n,), dtype=np.float64)
    if n:
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], "counter_uniform")
        fn((grid_1d(n, 256),), (256,), (seeds, positions, out, np.int32(n)))
    return out


def apply_penalties_rows(
    logits: Any, ids: Any, counts: Any, repetition: Any, frequency: Any, presence: Any
) -> None:
    """Penalize float32 ``logits[B, V]`` in place (``sampler.apply_penalties`` per row): int32 ``ids[B, P]``
    (distinct within a row, -1 padding) with int32 ``counts[B, P]``; float32 ``repetition``, ``frequency``,
    ``presence`` ``[B]``."""
    if np.dtype(logits.dtype) != np.float32:
        raise KernelError(f"logits: dtype must be float32, got {logits.dtype}")
    rows, v, ld = check_rows(logits, "logits")
    check_array(ids, "ids", dtype=np.int32, shape=(rows, None))
    p = ids.shape[1]
    check_array(counts, "counts", dtype=np.int32, shape=(rows, p))
    for name, a in (("repetition", repetition), ("frequency", frequency), ("presence", presence)):
        check_array(a, name, dtype=np.float32, shape=(rows,))
    if rows and p:
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], "apply_penalties_rows")
        fn((grid_1d(p, 256), rows), (256,), (logits, np.int64(ld), np.int32(v), ids, counts, np.int32(p),
                                             repetition, frequency, presence))  # fmt: skip


def sample_rows(
    logits: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    min_p: Any,
    seeds: Any,
    positions: Any,
    mask: Any = None,
    limit: int | None = None,
    *,
    split: bool = True,
    chunk: int = SPLIT_CHUNK,
    bins: int = SPLIT_NB,
    cap: int = SPLIT_CAP,
    out: Any = None,
) -> Any:
    """Token ids ``[B]`` (int32) of float32 ``logits[B, V]`` (already penalized) by the sampler's definition:
    float64 ``temperature``, ``top_p``, ``min_p``, int32 ``top_k``, uint64 ``seeds`` and ``positions``, all
    ``[B]``; ``mask``: packed int32 bitmask ``[B, ceil(V/32)]`` or None; ids >= ``limit`` are banned. -1 where
    nothing is allowed.

    ``split`` (the default): each row's ids over ``ceil(limit / chunk)`` blocks, the candidates binned into
    ``bins`` bins and at most ``cap`` of them sorted per round (cuda_src/sample_split.cuh): a fixed sequence of
    launches with no host synchronization (capturable in a CUDA graph), on this device's and stream's
    workspaces. ``split=False``: the one-block-per-row kernel (the baseline; a uint64 ``[B, V]`` workspace per
    call). Both give the same tokens; ``chunk``, ``bins`` and ``cap`` change the speed only (tests shrink them).
    ``out``: an int32 ``[B]`` to write (e.g. a graph's fixed output; every row is written)."""
    import cupy

    if np.dtype(logits.dtype) != np.float32:
        raise KernelError(f"logits: dtype must be float32, got {logits.dtype}")
    rows, v, ld = check_rows(logits, "logits")
    if v >= MAX_VOCAB:
        raise KernelError(f"logits: {v} columns; sample_rows needs fewer than {MAX_VOCAB}")
    for name, a, dt in (("temperature", temperature, np.float64), ("top_k", top_k, np.int32),
                        ("top_p", top_p, np.float64), ("min_p", min_p, np.float64),
                        ("seeds", seeds, np.uint64), ("positions", positions, np.uint64)):  # fmt: skip
        check_array(a, name, dtype=dt, shape=(rows,))
    for name, val, hi in (("chunk", chunk, SPLIT_CHUNK), ("bins", bins, SPLIT_NB), ("cap", cap, SPLIT_CAP)):
        if not 1 <= val <= hi:
            raise KernelError(f"{name} must be in [1, {hi}], got {val}")
    ldm = 0
    if mask is not None:
        check_array(mask, "mask", dtype=np.int32, shape=(rows, -(-v // 32)))
        ldm = mask.shape[1]
    if rows > 65535:
        raise KernelError(f"logits: {rows} rows; sample_rows takes at most 65535")
    limit = v if limit is None else max(0, min(int(limit), v))
    if out is None:
        out = cupy.full((rows,), -2, dtype=np.int32)
    check_array(out, "out", dtype=np.int32, shape=(rows,))
    if not rows:
        return out
    null = np.uint64(0)  # a null pointer: no mask
    m = mask if mask is not None else null
    if not split:
        ws = cupy.empty((rows, v), dtype=np.uint64)
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], "sample_rows")
        fn((rows,), (_THREADS,), (logits, np.int64(ld), m, np.int64(ldm), np.int32(v), np.int32(limit),
                                  temperature, top_k, top_p, min_p, seeds, positions, ws, np.int64(v),
                                  out))  # fmt: skip
        return out
    _split_launches(logits, ld, m, ldm, limit, (temperature, top_k, top_p, min_p, seeds, positions),
                    (chunk, bins, cap), out)  # fmt: skip
    return out


def _split_launches(
    x: Any, ld: int, mask: Any, ldm: int, lim: int, cols: tuple, sizes: tuple[int, int, int], out: Any
) -> None:
    """The split path's launches (cuda_src/sample_split.cuh): max, histogram (its last block per row plans), then
    three gather rounds (their last block per row resolves). Workspaces: ``zero`` (histograms and list counts, zero again after every launch sequence), the
    per-row state, prefix sums, partials and lists, and the shared arrival counters."""
    temperature, top_k, top_p, min_p, seeds, positions = cols
    chunk, nb, cap = sizes
    rows = out.shape[0]
    splits = max(1, -(-lim // chunk))
    zs, ldw = 2 * nb + 1, max(lim, 1)
    zero = stream_buffer(rows * zs, np.uint64, tag="sample_zero")
    sizes_ws = (rows * _ST_STRIDE, rows * 2 * (nb + 1), rows * splits * 2, rows * ldw)
    buf = stream_buffer(sum(sizes_ws), np.uint64, tag="sample_ws")
    at = np.cumsum((0,) + sizes_ws)
    st, pre, part, ws = (buf[at[i] : at[i + 1]] for i in range(4))
    cnt = arrival_counters(rows)
    fns = _split_kernels()
    i32, i64 = np.int32, np.int64
    head = (x, i64(ld), mask, i64(ldm), i32(lim), i32(chunk), temperature, min_p, i32(nb))
    rest = (top_k, top_p, seeds, positions, i32(cap), cnt, st, zero, i64(zs), pre, ws, i64(ldw), out)
    grid, nt = (splits, rows), (_SPLIT_THREADS,)
    fns["split_max"](grid, nt, (*head, part, cnt, st, out))
    hchunk = chunk * HIST_SPAN
    hist_head = (*head[:5], i32(hchunk), *head[6:])
    fns["split_hist"]((max(1, -(-lim // hchunk)), rows), nt, (*hist_head, *rest))
    for _ in range(3):
        fns["split_gather"](grid, nt, (*head, *rest))


def _split_kernels() -> dict[str, Any]:
    """The split path's kernels, looked up for this launch (the loader's cache hit; a function kept across calls
    would escape perf/launch_spans.py's timing, loader.kernel)."""
    names = ("split_max", "split_hist", "split_gather")
    return {n: kernel("sampling.cu", SOURCES["sampling.cu"], n) for n in names}


def argmax_rows(
    logits: Any, mask: Any = None, limit: int | None = None, *, chunk: int = ARGMAX_CHUNK, out: Any = None
) -> Any:
    """``sample_rows``' token for ``temperature <= 0`` on every row, bitwise (the largest allowed float32 logit of
    ``logits[B, V]``, the lowest id on ties, ``-0 == +0``, NaN banned; ``mask`` and ``limit`` as there; -1 where
    nothing is allowed): int32 ``[B]``. Each row's ids are split over ``ceil(limit / chunk)`` blocks and merged in
    the launch (the last block to arrive), so a launch's shape depends on (B, V, limit, chunk) only and it needs no
    host synchronization (capturable in a CUDA graph; its workspaces are this device's and stream's, kept; ``out``:
    an int32 ``[B]`` to write, e.g. a graph's fixed output)."""
    import cupy

    if np.dtype(logits.dtype) != np.float32:
        raise KernelError(f"logits: dtype must be float32, got {logits.dtype}")
    rows, v, ld = check_rows(logits, "logits")
    if rows > 65535:
        raise KernelError(f"logits: {rows} rows; argmax_rows takes at most 65535")
    if chunk < 1:
        raise KernelError(f"chunk must be positive, got {chunk}")
    ldm = 0
    if mask is not None:
        check_array(mask, "mask", dtype=np.int32, shape=(rows, -(-v // 32)))
        ldm = mask.shape[1]
    lim = v if limit is None else max(0, min(int(limit), v))
    splits = max(1, -(-lim // chunk))
    if out is None:
        out = cupy.empty((rows,), dtype=np.int32)
    check_array(out, "out", dtype=np.int32, shape=(rows,))
    if rows:
        part, cnt = stream_buffer(rows * splits, np.uint64), arrival_counters(rows)
        fn = kernel("sampling.cu", SOURCES["sampling.cu"], "argmax_split")
        null = np.uint64(0)  # a null pointer: no mask
        fn((splits, rows), (_ARGMAX_THREADS,), (logits, np.int64(ld), mask if mask is not None else null,
                                                np.int64(ldm), np.int32(v), np.int32(lim), np.int32(chunk), part,
                                                cnt, out))  # fmt: skip
    return out


def _penalized(p: Any) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


# the per-row sampling inputs of ``sample_rows``, uploaded in one copy: (name, dtype), 8-byte columns first
_COLUMNS = (("temperature", np.float64), ("top_p", np.float64), ("min_p", np.float64), ("seeds", np.uint64),
            ("positions", np.uint64), ("top_k", np.int32))  # fmt: skip


def pack_columns(reqs: Sequence[Any]) -> tuple[np.ndarray, dict[str, tuple[int, int, Any]]]:
    """The rows' sampling inputs (``sample_rows``' columns, converted as it expects) packed into one host byte
    buffer: (buffer, name -> (offset, bytes, dtype)); every offset is a multiple of its dtype's size."""
    params = [r.params for r in reqs]
    values = {
        "temperature": [float(p.temperature) for p in params],
        "top_p": [float(p.top_p) for p in params],
        "min_p": [float(p.min_p) for p in params],
        "seeds": [r.seed & (2**64 - 1) for r in reqs],
        "positions": [r.position for r in reqs],
        "top_k": [max(min(int(p.top_k), 2**31 - 1), 0) for p in params],
    }
    layout, at = {}, 0
    for name, dt in _COLUMNS:
        size = len(reqs) * np.dtype(dt).itemsize
        layout[name], at = (at, size, dt), at + size
    host = np.empty(at, np.uint8)
    for name, (off, size, dt) in layout.items():
        host[off : off + size].view(dt)[:] = np.array(values[name], dt)
    return host, layout


def _columns(reqs: Sequence[Any]) -> dict[str, Any]:
    """The rows' sampling inputs as device columns: views of one buffer filled by one host-to-device copy (a
    ``cupy.asarray`` per column cost ~15 us each, six per sampling call)."""
    import cupy

    host, layout = pack_columns(reqs)
    dev = cupy.asarray(host)
    return {name: dev[off : off + size].view(dt) for name, (off, size, dt) in layout.items()}


def sample_requests_dev(logits: Any, reqs: Sequence[Any], token_limit: int | None) -> Any:
    """``sample_requests`` left on the device: the rows' token ids ``[len(reqs)]`` int32 (-1: nothing allowed),
    launched on the current stream and not synchronized. Greedy rows alone (every ``temperature <= 0``): through
    ``argmax_rows``, the same tokens without the sampling parameters' upload."""
    import cupy

    rows, v, _ = check_rows(logits, "logits")
    if rows != len(reqs):
        raise KernelError(f"logits: {rows} rows for {len(reqs)} requests")
    if not rows:
        return cupy.empty((0,), np.int32)
    x = _penalize(logits, reqs)
    mask = _mask(reqs, v)
    if all(
        r.params.temperature <= 0.0 for r in reqs
    ):  # sample_rows would stop at its greedy pick on every row
        return argmax_rows(x, mask, token_limit)
    c = _columns(reqs)
    return sample_rows(x, c["temperature"], c["top_k"], c["top_p"], c["min_p"], c["seeds"], c["positions"],
                       mask, token_limit)  # fmt: skip


def _penalize(logits: Any, reqs: Sequence[Any]) -> Any:
    """``logits``, or a penalized copy when a row has penalties; rows whose penalties are neutral are left as they
    are (x / 1, x * 1, x - 0: the same bits), as on the CPU."""
    import cupy

    width = max((len(r.counts) for r in reqs if _penalized(r.params)), default=0)
    if not width:
        return logits
    rows = len(reqs)
    params = [r.params for r in reqs]
    ids = np.full((rows, width), -1, np.int32)
    cnt = np.zeros((rows, width), np.int32)
    for i, r in enumerate(reqs):
        if _penalized(r.params):
            ids[i, : len(r.counts)] = list(r.counts.keys())
            cnt[i, : len(r.counts)] = list(r.counts.values())
    x = logits.copy()
    apply_penalties_rows(
        x, cupy.asarray(ids), cupy.asarray(cnt),
        *(cupy.asarray(np.array([getattr(p, f) for p in params], np.float32))
          for f in ("repetition_penalty", "frequency_penalty", "presence_penalty")),
    )  # fmt: skip
    return x


def _mask(reqs: Sequence[Any], v: int) -> Any:
    """The rows' packed masks on the device ``[B, ceil(V/32)]`` (all allowed where a row has none), or None."""
    import cupy

    if all(r.mask is None for r in reqs):
        return None
    words = np.full((len(reqs), -(-v // 32)), -1, np.int32)  # all allowed
    for i, r in enumerate(reqs):
        if r.mask is not None:
            words[i] = r.mask
    return cupy.asarray(words)


def sample_requests(logits: Any, reqs: Sequence[Any], token_limit: int | None) -> list[int]:
    """The engine's device sampling: one token per row of float32 ``logits[len(reqs), V]`` for
    ``sampler.SampleRequest`` rows (-1: nothing allowed). ``logits`` is left unchanged (penalties go to a copy).
    One host synchronization (the ids' copy back)."""
    import cupy

    out = sample_requests_dev(logits, reqs, token_limit)
    return cupy.asnumpy(out).tolist() if out.size else []
