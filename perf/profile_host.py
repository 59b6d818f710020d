"""Where the host's time goes in a prefill chunk (GPU): cProfile of the eager forward of a follow-up turn's chunk
(``--chunk`` new tokens over a ``--prefill-at`` prefix; the KV values of the prefix unset, as profile_step does),
the synthetic model at the real shapes. A follow-up turn of a few hundred tokens launches ~900 (27B) to ~1,000
(35B-A3B) kernels, and the GPU idles between them when the host is slower than the kernels (profile_step
--timeline: busy / idle), so this names the Python functions that hold the GPU back.

    PYTHONPATH=. python -m perf.profile_host --model 27b,35b --chunk 256 --prefill-at 8192 [--top 40]

Without a GPU, ``--no-gpu`` runs the same host code over perf/nogpu.py's stand-ins (CuPy and the driver stubbed, no
kernel runs), on the model's first ``--layers`` layers (host memory): the Python time per layer and where it goes,
less CuPy's own launch and allocation time (not counted there). The GPU idles whenever that time exceeds the
layer's kernels, so it is what the host-side work on an eager chunk can be measured by on any machine::

    PYTHONPATH=. python -m perf.profile_host --no-gpu --layers 8 --model 35b
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import time
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic import PROFILES


def _profile(key: str, a: argparse.Namespace) -> None:
    import cupy

    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences

    from .cli import MODELS, OPERAND_LEAVE
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[key]].config
    if a.layers:
        mc = dataclasses.replace(mc, num_hidden_layers=a.layers, layer_types=mc.layer_types[: a.layers])
    net = CudaQwen36(mc, synthetic_tensors(mc, a.profile), cuda_graph=False)
    net.warmup()
    context = a.prefill_at + a.chunk + 64
    seqs = Sequences(net, slots=4, pages=2 * -(-context // 16), page_size=16, context=context)
    net.keep_prefill_operands(leave=OPERAND_LEAVE)  # as ninfer-perf: the server's default
    pre = seqs.new()
    seqs.reserve(pre, a.prefill_at + a.chunk)
    ids = np.random.default_rng(0).integers(0, mc.vocab_size, a.chunk)

    def chunk() -> None:
        seqs.seek(pre, a.prefill_at)
        seqs.forward(pre, ids)

    for _ in range(2):  # warm-up: allocations, first launches, kept operands
        chunk()
    cupy.cuda.Device().synchronize()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        chunk()
        cupy.cuda.Device().synchronize()
        walls.append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    chunk()
    prof.disable()
    host = time.perf_counter() - t0
    cupy.cuda.Device().synchronize()
    done = time.perf_counter() - t0
    layers = (
        f", {mc.num_hidden_layers} layers: {np.median(walls) * 1e3 / mc.num_hidden_layers:.3f} ms per layer"
    )
    print(f"{key} chunk {a.chunk} @{a.prefill_at}{layers}: wall {np.median(walls) * 1e3:.1f} ms (median of 3); under "
          f"cProfile the host returned after {host * 1e3:.1f} ms, the GPU finished at {done * 1e3:.1f} ms")  # fmt: skip
    st = pstats.Stats(
        prof
    ).stats  # (file, line, function) -> (primitive calls, calls, tottime, cumtime, callers)
    n = mc.num_hidden_layers
    print(f"--- {key}: {sum(v[1] for v in st.values()) / n:.0f} Python calls and "
          f"{sum(v[2] for v in st.values()) * 1e6 / n:.0f} us per layer under cProfile")  # fmt: skip
    for col, order in ((2, "own time"), (3, "cumulative time")):
        print(f"--- {key}: by {order} (per layer: calls, own us, cumulative us)")
        for (f, ln, fn), v in sorted(st.items(), key=lambda kv: -kv[1][col])[: a.top]:
            print(f"{v[1] / n:8.1f} {v[2] * 1e6 / n:9.1f} {v[3] * 1e6 / n:9.1f}  {Path(f).name}:{ln} {fn}")


def main(argv: list[str] | None = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="27b,35b")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--prefill-at", type=int, default=8192)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--layers", type=int, default=0, help="the model's first N layers only (default: all)")
    p.add_argument("--profile", default="nvfp4", help=f"{', '.join(PROFILES)}: every matrix in that format")
    p.add_argument("--no-gpu", action="store_true", help="host code only, over perf/nogpu.py's stand-ins")
    a = p.parse_args(argv)
    if a.no_gpu:
        from . import nogpu

        nogpu.install()
    for key in a.model.split(","):
        _profile(key, a)


if __name__ == "__main__":
    main()
