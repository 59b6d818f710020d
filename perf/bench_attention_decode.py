"""Decode attention micro-benchmark (GPU): the split-KV ``attention`` kernel's variants side by side against the copy
ceiling, at both models' attention shapes.

27B: 24 query heads over 4 KV heads; 35B-A3B: 16 over 2; head_dim 256, float32 queries (the models' default
activations), a paged cache of 16-token pages in a random page order; 1 and 8 sequences at 8K and 32K context
(every sequence at that length, one decode row each), bf16 and fp8 caches. Each case times every kernel variant
(``ninfer.cuda.attention.VARIANTS``: ``base`` is the kernel before the pipelined loads, the default is marked *) at
the model's default chunk (256), and the default variant also at chunks 128 and 512, all over the same buffers.
Times come from a CUDA graph of several launches back to back, each over its own copy of the cache (together more
than the 50 MB L2), so every launch reads HBM (``bench_peers.graph_seconds``). Bytes = K and V rows read
(2 x positions x HKV x D x 2 B; fp8: codes + float32 scales); ``of copy`` compares with the device-to-device copy
bandwidth measured in the same run.

``python -m perf.bench_attention_decode [--out DIR]`` (PYTHONPATH=.) prints a table (us and % of copy per variant)
and writes ``bench_attention_decode.json`` under DIR (default: stdout only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .bench_peers import copy_bandwidth, graph_seconds

D, PAGE, CHUNK = 256, 16, 256
MODELS = {"27B": (24, 4), "35B-A3B": (16, 2)}  # (query heads, KV heads)
CASES = ((8192, 1), (8192, 8), (32768, 1), (32768, 8))  # (context, sequences)
FP8_CASES = CASES[:3]
EXTRA_CHUNKS = (128, 512)  # the default variant at these chunks too
CACHE_BYTES = 256 << 20  # the copies of one case together read at least this much (5x the L2)


def _copies(
    hq: int, hkv: int, ctx: int, nseq: int, kv: str, rng: np.random.Generator
) -> tuple[list[tuple], int]:
    """Launch arguments over independent caches, and the bytes one launch reads."""
    import cupy

    fp8 = kv == "fp8"
    pages = nseq * ctx // PAGE
    per = 2 * pages * PAGE * hkv * (D + 4 if fp8 else 2 * D)  # K and V rows (fp8: codes and a float32 scale)
    n = max(2, math.ceil(CACHE_BYTES / per))
    shape = (pages, PAGE, hkv, D)
    q = cupy.asarray(rng.standard_normal((nseq, hq, D)).astype(np.float32))
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


def _configs() -> list[tuple[str, int]]:
    """(variant, chunk) timed per case: every variant at the default chunk, the default variant at the others."""
    from ninfer.cuda.attention import DEFAULT_VARIANT, VARIANTS

    return [(v, CHUNK) for v in VARIANTS] + [(DEFAULT_VARIANT, c) for c in EXTRA_CHUNKS]


def _compile(key: tuple[str, tuple[str, ...]]) -> None:
    from ninfer.cuda.loader import load_module

    load_module(*key)


def _precompile() -> None:
    """The modules the cases load (the default family, one module per other variant and cache type), compiled in
    parallel subprocesses into CuPy's on-disk cache."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ninfer.cuda.attention import DEFAULT_VARIANT, SOURCES, VARIANTS

    keys = [("attention.cu", SOURCES["attention.cu"])]
    keys += [
        ("attention.cu", (var.instance("float", c, D),))
        for name, var in VARIANTS.items()
        if name != DEFAULT_VARIANT
        for c in ("bf16", "e4m3")
    ]
    with ProcessPoolExecutor(len(keys), mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_compile, keys))


def _case(model: str, ctx: int, nseq: int, kv: str, ceiling: float, rng: np.random.Generator) -> list[dict]:
    import cupy

    from ninfer.cuda.attention import attention

    hq, hkv = MODELS[model]
    calls, nbytes = _copies(hq, hkv, ctx, nseq, kv, rng)
    res = []
    for variant, chunk in _configs():
        fns = [
            lambda a=a, v=variant, c=chunk: attention(
                *a[:6], max_len=ctx, chunk=c, out=a[6], variant=v, **a[7]
            )
            for a in calls
        ]
        sec = graph_seconds(fns, reps=10)
        res.append({"model": model, "context": ctx, "seqs": nseq, "kv": kv, "variant": variant, "chunk": chunk,
                    "us": sec * 1e6, "bytes": nbytes, "gbs": nbytes / sec / 1e9,
                    "frac_copy": nbytes / sec / ceiling})  # fmt: skip
    del calls
    cupy.get_default_memory_pool().free_all_blocks()
    return res


def _line(rows: list[dict]) -> str:
    from ninfer.cuda.attention import DEFAULT_VARIANT

    r0 = rows[0]
    head = f"{r0['model']:8s} {r0['kv']:4s} ctx={r0['context']:5d} seqs={r0['seqs']} {r0['bytes'] / 1e6:7.1f} MB |"
    cells = [
        f" {r['variant']}{'*' if r['variant'] == DEFAULT_VARIANT else ''}/c{r['chunk']} "
        f"{r['us']:6.1f} us {r['frac_copy']:6.1%}"
        for r in rows
    ]
    return head + " |".join(cells)


def main(out: str | None = None) -> dict[str, Any]:
    _precompile()
    rng = np.random.default_rng(0)
    ceiling = copy_bandwidth()
    print(f"copy ceiling {ceiling / 1e9:.0f} GB/s (read + write); * = default variant")
    cases: list[dict] = []
    for model in MODELS:
        for kv, shapes in (("bf16", CASES), ("fp8", FP8_CASES)):
            for ctx, nseq in shapes:
                rows = _case(model, ctx, nseq, kv, ceiling, rng)
                cases += rows
                print(_line(rows), flush=True)
    res = {"copy_gbs": ceiling / 1e9, "cases": cases}
    if out:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "bench_attention_decode.json").write_text(json.dumps(res, indent=1))
        print(f"wrote {path / 'bench_attention_decode.json'}")
    else:
        print(json.dumps(res))
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for bench_attention_decode.json")
    main(ap.parse_args().out)
