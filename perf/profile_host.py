"""Where the host's time goes in a prefill chunk (GPU): cProfile of the eager forward of a follow-up turn's chunk
(``--chunk`` new tokens over a ``--prefill-at`` prefix; the KV values of the prefix unset, as profile_step does),
the synthetic model at the real shapes. A follow-up turn of a few hundred tokens launches ~900 (27B) to ~1,000
(35B-A3B) kernels, and the GPU idles between them when the host is slower than the kernels (profile_step
--timeline: busy / idle), so this names the Python functions that hold the GPU back.

    PYTHONPATH=. python -m perf.profile_host --model 27b,35b --chunk 256 --prefill-at 8192 [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

import numpy as np


def _profile(key: str, a: argparse.Namespace) -> None:
    import cupy

    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences

    from .cli import MODELS, OPERAND_LEAVE
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[key]].config
    net = CudaQwen36(mc, synthetic_tensors(mc, "nvfp4"), cuda_graph=False)
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
    print(f"{key} chunk {a.chunk} @{a.prefill_at}: wall {np.median(walls) * 1e3:.1f} ms (median of 3); under "
          f"cProfile the host returned after {host * 1e3:.1f} ms, the GPU finished at {done * 1e3:.1f} ms")  # fmt: skip
    for order in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).strip_dirs().sort_stats(order).print_stats(a.top)
        print(f"--- {key}: by {order}")
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:12000])


def main(argv: list[str] | None = None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="27b,35b")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--prefill-at", type=int, default=8192)
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args(argv)
    for key in a.model.split(","):
        _profile(key, a)


if __name__ == "__main__":
    main()
