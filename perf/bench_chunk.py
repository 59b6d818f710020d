"""Prefill rate against the prefill chunk and the GEMM inputs, in one run on the same network.

    python -m perf.bench_chunk --out perf/results      # 27B and 35B-A3B synthetic nvfp4, 8K prompt, chunks 512..8192,
                                                       # prefill GEMM inputs exact and fp16 (docs/cuda.md)
    python -m perf.bench_chunk --model 35b --chunks 2048,4096,8192 --inputs fp16 --gdn mma,fp32
                                                       # larger MoE chunks; the GDN state passes A/B

The server prefills a prompt in chunks of at most ``EngineConfig.prefill_chunk`` tokens (4096 by default), cut at
the GDN checkpoint positions (every ``checkpoint_stride`` = 4096 tokens), so a served prompt never runs in chunks
above min(prefill_chunk, checkpoint_stride). Each row: one prompt of ``--tokens`` random ids on a fresh sequence
in chunks of the given size (``bench_model.bench_prefill``: a warm-up prompt first, then the timed one), with the
activations of ``--activations`` and each of ``--inputs`` as the network's ``prefill_inputs``. Prints a table and writes ``bench_chunk.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .bench_model import bench_prefill

__all__ = ["main"]


def _model(key: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences

    from .cli import MODELS
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[key]].config
    net = CudaQwen36(mc, synthetic_tensors(mc, a.profile), act_dtype=a.activations, cuda_graph=False)
    net.warmup()
    pages = -(-(a.tokens + 64) // 16)
    seqs = Sequences(net, slots=4, pages=pages * 2, page_size=16, context=a.tokens + 64)
    net.warm_prefill()  # after the pools exist (Sequences allocates them)
    rows = []
    for inputs, variant in ((i, v) for i in a.inputs.split(",") for v in a.gdn.split(",")):
        net.prefill_inputs, net.gdn_variant = inputs, variant
        for chunk in (int(c) for c in a.chunks.split(",")):
            _, sid = bench_prefill(
                seqs, min(a.tokens, 2 * chunk), chunk
            )  # first calls at this chunk's shapes
            seqs.free(sid)
            r, sid = bench_prefill(seqs, a.tokens, chunk)
            seqs.free(sid)
            r |= {"model": key, "activations": a.activations, "prefill_inputs": inputs, "gdn": variant}
            rows.append(r)
            print(
                f"{key} {inputs:5} gdn {variant:4} chunk {chunk:5d}: {r['tok_s']:8.0f} tok/s  "
                f"TTFT {r['ttft_s']:.3f} s",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m perf.bench_chunk")
    p.add_argument("--model", default="27b,35b")
    p.add_argument("--profile", default="nvfp4")
    p.add_argument("--activations", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--chunks", default="512,2048,4096,8192")
    p.add_argument(
        "--inputs", default="exact,fp16", help="prefill GEMM inputs to compare (ninfer.cuda GEMM_INPUTS)"
    )
    p.add_argument("--gdn", default="mma", help="the GDN state passes to time (comma list of mma, fp32)")
    p.add_argument("--out", default=None, help="directory for bench_chunk.json")
    a = p.parse_args(argv)
    rows = [r for key in a.model.split(",") for r in _model(key, a)]
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "bench_chunk.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
