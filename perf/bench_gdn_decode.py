"""GDN decode step and decode-size RMSNorm on the GPU at the Qwen3.6-27B shapes (HK 16, HV 48, dk = dv 128, conv
channels 10240, hidden 5120) and the 35B-A3B's GDN heads (HK 16, HV 32), against a device-to-device copy measured in
the same run.

    python -m perf.bench_gdn_decode [--reps 10] [--models 27b,35b] [--json PATH]

Each case is a CUDA graph of several launches (``graph_seconds``: per-launch time, the graph's inter-kernel gaps
included, median of ``reps`` replays), each launch on other state slots of one pool larger than the L2 (so every
launch reads its state from device memory, as a decode step does across 48 layers). Cases, for T = 1 and 8
sequences of one token, float32 and bf16 state:

- ``recurrent``: ``gdn_recurrent`` alone (the delta rule on conv output);
- ``mixer``: ``gdn_decode`` (conv + delta rule + gated RMSNorm in one launch; per-layer time of the mixer core),
  ``variant="cluster"`` (gdn_step_cl; the default "auto" takes it up to 4 sequences);
- ``mixer-cnt``: the same with ``variant="counter"`` (the last-arrival epilogue, the kernel before gdn_step_cl);
- ``mixer-clp``: the same with ``variant="persist"`` (gdn_step_clp: the resident clusters take the (sequence, value
  head) items in turn, the next item's state slice copied while the current one runs);
- ``mixer-2l``: the same as two launches (``fused=False``: conv + delta rule, then ``gdn_step_post``'s gated norm
  and q/k windows; the same bits): at 8 sequences the single launch's epilogue (fence, two arrivals, the last tile's
  norm) lengthens every block's life by a few round trips while it holds its SM's registers, ~4 waves over.

Bytes = the recurrent state read and written (``state``) plus activations and conv state (``total``); the
fraction is of the copy ceiling (bytes read + written per second). ``rmsnorm`` (residual add, offset weight) at 1
and 8 rows of 5120 runs over buffers that stay in the L2, as in a decode step: its time is latency, not bandwidth.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

import numpy as np

from ninfer.artifact.pinned import QWEN36_27B, QWEN36_35B_A3B

from .bench_peers import copy_bandwidth, graph_seconds

__all__ = ["bench_gdn_decode", "main"]

POOL_BYTES = 512 << 20  # state pool: ~10x the H200's L2
MODELS = {"27b": QWEN36_27B, "35b": QWEN36_35B_A3B}


def _gdn_cases(ceiling: float, reps: int, model: str = "27b") -> list[dict[str, Any]]:
    import cupy

    from ninfer.cuda.gdn import gdn_decode, gdn_recurrent

    c = MODELS[model]
    hk, hv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    ch, w = 2 * hk * dk + hv * dv, hv * dv
    rng = np.random.default_rng(0)
    f32 = np.float32
    a_log = cupy.asarray(rng.uniform(-2, 1, hv).astype(f32))
    dt_bias = cupy.asarray(rng.uniform(-1, 1, hv).astype(f32))
    conv_w = cupy.asarray((rng.standard_normal((ch, 4)) * 0.5).astype(f32))
    norm_w = cupy.asarray(np.ones(dv, f32))
    rows = []
    for st_name, st_t in (("fp32", f32), ("bf16", np.uint16)):
        slot_bytes = hv * dk * dv * np.dtype(st_t).itemsize
        n_slots = POOL_BYTES // slot_bytes
        # zero states and conv windows: the kernels' time does not depend on the values
        state, conv = cupy.zeros((n_slots, hv, dk, dv), st_t), cupy.zeros((n_slots, ch, 3), f32)
        for t in (1, 8):
            qkv = cupy.asarray(rng.standard_normal((t, ch)).astype(f32))
            a, b = (cupy.asarray(rng.standard_normal((t, hv)).astype(f32)) for _ in range(2))
            z = cupy.asarray(rng.standard_normal((t, w)).astype(f32))
            out = cupy.empty((t, w), f32)
            starts = cupy.arange(t + 1, dtype=np.int32)
            slots = [cupy.arange(i * t, (i + 1) * t, dtype=np.int32) for i in range(n_slots // t)]
            state_bytes = 2 * t * slot_bytes
            act = 4 * t * (ch + 2 * hv + 2 * w)  # qkv, a, b read; o written (+ z read by the mixer)
            for name in ("recurrent", "mixer", "mixer-cnt", "mixer-clp", "mixer-2l"):
                if name == "recurrent":
                    rule = partial(
                        gdn_recurrent, qkv, a, b, a_log, dt_bias, state, starts, n_k_heads=hk, out=out
                    )
                    fns = [partial(rule, slots=s) for s in slots]
                    extra = act
                else:
                    core = partial(gdn_decode, qkv, conv_w, conv, a, b, a_log, dt_bias, state, starts)
                    variant = {"mixer": "cluster", "mixer-clp": "persist"}.get(name, "counter")
                    fused = name != "mixer-2l"
                    fns = [
                        partial(core, s, z, norm_w, 1e-6, n_k_heads=hk, out=out, variant=variant, fused=fused)
                        for s in slots
                    ]
                    extra = act + 4 * t * w + 2 * 4 * t * ch * 3  # + z, conv state read and written
                sec = graph_seconds(fns, reps)
                rows.append({"model": model, "case": name, "T": t, "state": st_name, "us": sec * 1e6,
                             "state_bytes": state_bytes, "total_bytes": state_bytes + extra,
                             "state_frac": state_bytes / sec / ceiling,
                             "total_frac": (state_bytes + extra) / sec / ceiling})  # fmt: skip
        del state, conv
        cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _rmsnorm_cases(ceiling: float, reps: int) -> list[dict[str, Any]]:
    import cupy

    from ninfer.cuda.norm import rmsnorm

    h, rng, rows = QWEN36_27B.hidden_size, np.random.default_rng(1), []
    w = cupy.asarray((rng.standard_normal(h) * 0.3).astype(np.float32))
    for act, dt in (("fp32", np.float32), ("bf16", np.uint16)):
        for t in (1, 8):
            n = 16  # buffers per graph: 16 launches, as the step's 129 norms see different activations
            xs = [cupy.zeros((t, h), dt) for _ in range(n)]
            rs = [cupy.asarray(rng.standard_normal((t, h)).astype(np.float32)) for _ in range(n)]
            ys = [cupy.empty((t, h), dt) for _ in range(n)]
            fns = [partial(rmsnorm, xs[i], w, 1e-6, residual=rs[i], out=ys[i]) for i in range(n)]
            sec = graph_seconds(fns, reps)
            nbytes = t * h * (2 * np.dtype(dt).itemsize + 8) + 4 * h  # x read, y written, residual both, w
            rows.append({"case": "rmsnorm+resid", "T": t, "act": act, "us": sec * 1e6, "bytes": nbytes,
                         "frac": nbytes / sec / ceiling})  # fmt: skip
    return rows


def bench_gdn_decode(reps: int = 10, models: tuple[str, ...] = ("27b", "35b")) -> dict[str, Any]:
    """Times and bandwidth fractions of the GDN decode kernels and decode-size rmsnorm (see the module doc)."""
    ceiling = copy_bandwidth(1 << 30, reps)
    out = {
        "copy_GBps": ceiling / 1e9,
        "gdn": [r for m in models for r in _gdn_cases(ceiling, reps, m)],
        "rmsnorm": _rmsnorm_cases(ceiling, reps),
    }
    print(f"copy ceiling (read + write): {ceiling / 1e9:.0f} GB/s")
    print("GDN decode (27B: HV 48, 35B: HV 32; dk = dv 128)   us/layer   state MB   of copy   total of copy")
    for r in out["gdn"]:
        print(f"  {r['model']} {r['case']:10s} T={r['T']} state={r['state']:4s} {r['us']:9.2f}"
              f" {r['state_bytes'] / 1e6:10.2f} {r['state_frac']:9.2f} {r['total_frac']:15.2f}")  # fmt: skip
    print("rmsnorm (5120, residual add, offset)   us/launch  of copy (L2-resident)")
    for r in out["rmsnorm"]:
        print(f"  T={r['T']} act={r['act']:4s} {r['us']:24.2f} {r['frac']:9.2f}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--models", default="27b,35b", help=f"comma-separated, of {sorted(MODELS)}")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    out = bench_gdn_decode(args.reps, tuple(args.models.split(",")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
