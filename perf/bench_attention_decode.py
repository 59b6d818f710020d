"""Decode attention micro-benchmark (GPU): the split-KV ``attention`` kernel at the 27B shapes against the copy ceiling.

24 query heads, 4 KV heads, head_dim 256, float32 queries (the model's default activations), a bf16 paged cache of
16-token pages scattered in a random page order; 1 and 8 sequences at 8K and 32K context (every sequence at that
length, one decode row each), for the model's default chunk and its neighbours. Times come from a CUDA graph of
several launches back to back, each over its own copy of the cache (together more than the 50 MB L2), so every
launch reads HBM (``bench_peers.graph_seconds``). Bytes = K and V rows read (2 x positions x HKV x D x 2 B);
``frac_copy`` compares with the device-to-device copy bandwidth measured in the same run. Also an fp8 cache at 8K
(bytes: codes + scales). ``python -m perf.bench_attention_decode`` (PYTHONPATH=.) prints one line per case and
returns the results as a dict; about 15 s after the kernels are compiled.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .bench_peers import copy_bandwidth, graph_seconds

HQ, HKV, D, PAGE = 24, 4, 256, 16
CASES = ((8192, 1), (8192, 8), (32768, 1), (32768, 8))  # (context, sequences)
CHUNKS = (128, 256, 512)
CACHE_BYTES = 256 << 20  # the copies of one case together read at least this much (5x the L2)


def _copies(ctx: int, nseq: int, kv: str, rng: np.random.Generator) -> tuple[list[tuple], int]:
    """Launch arguments over independent caches, and the bytes one launch reads."""
    import cupy

    fp8 = kv == "fp8"
    pages = nseq * ctx // PAGE
    per = 2 * pages * PAGE * HKV * (D + 4 if fp8 else 2 * D)  # K and V rows (fp8: codes and a float32 scale)
    n = max(2, math.ceil(CACHE_BYTES / per))
    shape = (pages, PAGE, HKV, D)
    q = cupy.asarray(rng.standard_normal((nseq, HQ, D)).astype(np.float32))
    seq = cupy.arange(nseq, dtype=cupy.int32)
    pos = cupy.full(nseq, ctx - 1, dtype=cupy.int32)
    out = []
    for _ in range(n):
        table = cupy.asarray(rng.permutation(pages).astype(np.int32).reshape(nseq, ctx // PAGE))
        sc = {}
        if fp8:  # codes below 0x7E (no NaN), constant scales: the timing does not depend on the values
            k, v = (
                cupy.random.randint(0, 0x7E, shape, dtype=cupy.int32).astype(cupy.uint8) for _ in range(2)
            )
            sc = {name: cupy.full(shape[:3], 0.01, cupy.float32) for name in ("k_scale", "v_scale")}
        else:  # bf16 words: magnitudes in [0.5, 4), random signs
            bits = (cupy.random.randint(0x3F00, 0x4080, (2, *shape), dtype=cupy.int32)
                    | (cupy.random.randint(0, 2, (2, *shape), dtype=cupy.int32) << 15)).astype(cupy.uint16)  # fmt: skip
            k, v = bits[0], bits[1]
        out.append((q, k, v, table, seq, pos, cupy.empty_like(q), sc))
    return out, per


def _case(
    ctx: int, nseq: int, chunk: int, kv: str, ceiling: float, rng: np.random.Generator
) -> dict[str, Any]:
    import cupy

    from ninfer.cuda.attention import attention

    calls, nbytes = _copies(ctx, nseq, kv, rng)
    fns = [lambda a=a: attention(*a[:6], max_len=ctx, chunk=chunk, out=a[6], **a[7]) for a in calls]
    sec = graph_seconds(fns, reps=10)
    del calls, fns
    cupy.get_default_memory_pool().free_all_blocks()
    return {"context": ctx, "seqs": nseq, "chunk": chunk, "kv": kv, "us": sec * 1e6, "bytes": nbytes,
            "gbs": nbytes / sec / 1e9, "frac_copy": nbytes / sec / ceiling}  # fmt: skip


def main(chunks: tuple[int, ...] = CHUNKS) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    ceiling = copy_bandwidth()
    print(f"copy ceiling {ceiling / 1e9:.0f} GB/s (read + write)")
    cases = []
    for kv, shapes in (("bf16", CASES), ("fp8", CASES[:2])):
        for ctx, nseq in shapes:
            for chunk in chunks if kv == "bf16" else chunks[:1]:
                c = _case(ctx, nseq, chunk, kv, ceiling, rng)
                cases.append(c)
                print(f"attention {kv} ctx={ctx} seqs={nseq} chunk={chunk}: {c['us']:.1f} us, "
                      f"{c['bytes'] / 1e6:.1f} MB, {c['gbs']:.0f} GB/s, {c['frac_copy']:.1%} of copy")  # fmt: skip
    res = {"copy_gbs": ceiling / 1e9, "cases": cases}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
