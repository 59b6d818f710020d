"""Decode GEMV bandwidth at the Qwen3.6-27B shapes (GPU): bytes moved per second against a device-to-device copy
measured in the same run.

    PYTHONPATH=. python -m perf.bench_gemv [--formats NVFP4G16_E4M3S,BF16] [--repeats 20] [--json PATH]

Weights are random bytes of each format's exact encoded size and plane layout (the time of a GEMV does not
depend on the values; encoding a 248320 x 5120 matrix on the host would cost minutes). Each case is a CUDA graph
of launches over enough copies of the weight to exceed the L2 four times (so every launch reads device memory),
timed per launch, median of ``repeats`` replays: a decode step replays its GEMVs the same way. Bytes = the weight's encoded bytes (all
planes) + activations read + outputs written; the MoE case counts the selected experts' bytes only. The copy
ceiling is a cupy device-to-device copy of a 1 GiB buffer, counted as bytes read + written.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ninfer.artifact.pinned import QWEN36_27B, QWEN36_35B_A3B

from .bench_peers import copy_bandwidth, graph_seconds

__all__ = ["SHAPES", "bench", "copy_bandwidth", "main"]

DEFAULT_FORMATS = ("NVFP4G16_E4M3S", "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S")


def _shapes() -> dict[str, tuple[int, int]]:
    """(N, K) of each decode product of the 27B (fused projections as the model stores them)."""
    c = QWEN36_27B
    h, hd = c.hidden_size, c.head_dim
    kd = c.linear_num_key_heads * c.linear_key_head_dim
    vd = c.linear_num_value_heads * c.linear_value_head_dim
    return {
        "attn q|gate": (2 * c.num_attention_heads * hd, h),
        "attn k|v": (2 * c.num_key_value_heads * hd, h),
        "attn o": (h, c.num_attention_heads * hd),
        "gdn qkv|z": (2 * kd + 2 * vd, h),
        "gdn out": (h, vd),
        "mlp gate|up": (2 * c.intermediate_size, h),
        "mlp down": (h, c.intermediate_size),
        "lm_head": (c.vocab_size, h),
    }


SHAPES = _shapes()


def _random_weight(fmt: str, shape: tuple[int, ...]) -> Any:
    """A DeviceWeight of random bytes with the format's real plane offsets."""
    import cupy

    from ninfer.cuda.nvfp4_layout import to_device_layout
    from ninfer.cuda.weights import DeviceWeight, plane_offsets
    from ninfer.formats import get_format

    size = get_format(fmt).encoded_size(shape)
    offs = plane_offsets(
        fmt, shape, np.zeros(size, dtype=np.uint8)
    )  # untouched pages: only addresses are read
    data = cupy.zeros(size, dtype=np.uint8)
    whole = (
        size // 4 * 4
    )  # random float32 bit patterns: one byte of device memory per byte (no int64 temporary)
    data[:whole].view(np.float32)[...] = cupy.random.random(whole // 4, dtype=np.float32)
    return to_device_layout(DeviceWeight(fmt, tuple(shape), data, offs))


def bench(
    formats: tuple[str, ...] = DEFAULT_FORMATS, rows: tuple[int, ...] = (1, 4, 8), repeats: int = 20
) -> dict:
    """Every (format, shape, rows) case plus one MoE expert dispatch; returns the copy ceiling and the cases."""
    import cupy

    from ninfer.cuda.gemv_experts import gemv_experts
    from ninfer.cuda.linear import gemv

    ceiling = copy_bandwidth(1 << 30, repeats)  # 1 GiB device-to-device, read + written
    cases: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for fmt in formats:
        for name, (n, k) in SHAPES.items():
            w0 = _random_weight(fmt, (n, k))
            ws = [w0] + [_random_weight(fmt, (n, k)) for _ in range(_copies(w0.data.nbytes) - 1)]
            for b in rows:
                x = cupy.asarray(rng.standard_normal((b, k)).astype(np.float32))
                out = cupy.empty((b, n), dtype=np.float32)
                t = graph_seconds([lambda x=x, out=out, w=w: gemv(x, w, out) for w in ws], repeats)
                moved = w0.data.nbytes + x.nbytes + out.nbytes
                cases.append(_case(fmt, name, n, k, b, t, moved, ceiling))
            del w0, ws
        cases.append(_experts(fmt, repeats, ceiling, rng, gemv_experts))
        cupy.get_default_memory_pool().free_all_blocks()
    return {"copy_bytes_per_s": ceiling, "cases": cases}


def _experts(fmt: str, repeats: int, ceiling: float, rng: np.random.Generator, gemv_experts: Any) -> dict:
    """35B-A3B expert gate|up: 256 experts of [2*512, 2048], one token choosing 8 of them."""
    import cupy

    c = QWEN36_35B_A3B
    e, n, k, top = c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size, c.num_experts_per_tok
    w = _random_weight(fmt, (e, n, k))
    x = cupy.asarray(rng.standard_normal((1, k)).astype(np.float32))
    xrow = cupy.zeros(top, dtype=np.int32)
    out = cupy.empty((top, n), dtype=np.float32)
    calls = []
    for _ in range(16):  # a different expert choice each call: 16 x 8 of 256 experts, mostly outside the L2
        ids = cupy.asarray(rng.choice(e, top, replace=False).astype(np.int32))
        calls.append(lambda ids=ids: gemv_experts(x, w, ids, xrow, n, out))
    t = graph_seconds(calls, repeats)
    moved = w.data.nbytes // e * top + x.nbytes + out.nbytes
    return _case(fmt, f"moe experts x{top}", n, k, 1, t, moved, ceiling)


def _copies(nbytes: int) -> int:
    """Weight copies that together exceed the H200's 60 MB L2 four times (at most 16)."""
    return max(1, min(16, -(-(240 << 20) // nbytes)))


def _case(fmt: str, name: str, n: int, k: int, b: int, t: float, moved: int, ceiling: float) -> dict:
    bw = moved / t
    return {"format": fmt, "shape": name, "N": n, "K": k, "rows": b, "us": t * 1e6, "bytes": moved,
            "GB_per_s": bw / 1e9, "of_copy": bw / ceiling}  # fmt: skip


def table(res: dict) -> str:
    lines = [f"copy ceiling (read + write): {res['copy_bytes_per_s'] / 1e9:.0f} GB/s",
             f"{'format':<16}{'shape':<20}{'N':>8}{'K':>7}{'rows':>5}{'us':>10}{'GB/s':>9}{'of copy':>9}"]  # fmt: skip
    for c in res["cases"]:
        lines.append(
            f"{c['format']:<16}{c['shape']:<20}{c['N']:>8}{c['K']:>7}{c['rows']:>5}{c['us']:>10.1f}"
            f"{c['GB_per_s']:>9.0f}{c['of_copy']:>9.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    res = bench(tuple(f for f in a.formats.split(",") if f), repeats=a.repeats)
    print(table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
