"""Per-kernel profile of one decode step as its CUDA graph replays it: time and DRAM bytes of every kernel node,
grouped by kernel family, against the copy ceiling.

On the GPU, under Nsight Compute (each graph node profiled on its own; clocks left alone)::

    ncu --profile-from-start off --graph-profiling node --clock-control none \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --log-file step.csv \\
        python -m perf.profile_graph --model 27b --lanes 1
    python -m perf.profile_graph --summarize step.csv [--copy-tbs 4.28]     # anywhere: the table

Only the profiled replay sits between cudaProfilerStart and Stop (the warm-up replays and the capture do not), so
the CSV holds exactly the kernels of one step. Times are the kernels' own durations (no inter-node gaps).
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict
from typing import Any

__all__ = ["main", "summarize", "decode_step"]


def decode_step(
    model: str,
    profile: str = "nvfp4",
    activations: str = "fp32",
    lanes: int = 1,
    context: int = 8192,
    switches: dict[str, bool] | None = None,
) -> Any:
    """A synthetic ``model`` (the real shapes, random weights) warmed up with ``lanes`` sequences at ``context``
    positions, its decode graph captured and replayed twice; returns the function that replays one more step.
    ``switches``: ``CudaQwen36`` decode switches set before the capture (e.g. ``{"moe_route_fused": True}``)."""
    import cupy

    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences

    from .bench_model import lane_tokens
    from .cli import MODELS
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[model]].config
    net = CudaQwen36(mc, synthetic_tensors(mc, profile), act_dtype=activations)
    net.warmup()
    for name, on in (switches or {}).items():
        if not hasattr(net, name):
            raise SystemExit(f"--set: CudaQwen36 has no switch {name!r}")
        setattr(net, name, on)
    cap = context + 64
    seqs = Sequences(net, slots=lanes + 1, pages=(-(-cap // 16)) * (lanes + 1), page_size=16, context=cap)
    held = []
    for _ in range(lanes):
        s = seqs.new()
        seqs.reserve(s, context + 8)
        held.append((seqs.slot(s), seqs.pages(s)))
    ids = lane_tokens(lanes, mc.vocab_size)  # distinct tokens: a MoE model's lanes route to different experts
    for i in range(3):  # capture, then warm replays
        net.decode(ids, [(slot, context + i, pages) for slot, pages in held])
    cupy.cuda.Device().synchronize()

    def step() -> None:
        net.decode(ids, [(slot, context + 3, pages) for slot, pages in held])

    return step


def _step(a: argparse.Namespace) -> None:
    import cupy

    switches = {}
    for item in a.set:
        name, _, value = item.partition("=")
        if value not in ("on", "off"):
            raise SystemExit(f"--set {item}: expected NAME=on|off")
        switches[name] = value == "on"
    step = decode_step(a.model, a.profile, a.activations, a.lanes, a.context, switches)
    cupy.cuda.profiler.start()
    step()
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.stop()


def _family(name: str) -> str:
    """Kernel family of a demangled or mangled kernel name: the function name without templates/arguments."""
    name = re.sub(r"^void\s+", "", name.strip().strip('"'))
    return re.split(r"[<(]", name, maxsplit=1)[0] or name


def summarize(path: str, copy_tbs: float) -> str:
    """Table of time, kernel count, DRAM bytes and fraction of the copy ceiling per kernel family."""
    fam: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # ns, bytes, count
    ids: dict[str, dict[str, float]] = defaultdict(dict)
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    head = rows[0]
    col = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    for r in rows[1:]:
        if len(r) < len(head):
            continue
        unit, val = r[col["Metric Unit"]], float(r[col["Metric Value"]].replace(",", ""))
        scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6,
                 "Gbyte": 1e9}.get(unit, 1.0)  # fmt: skip
        ids[r[col["ID"]]][r[col["Metric Name"]]] = val * scale
        ids[r[col["ID"]]]["name"] = r[col["Kernel Name"]]  # type: ignore[assignment]
    for m in ids.values():
        f = fam[_family(str(m["name"]))]
        f[0] += m.get("gpu__time_duration.sum", 0.0)
        f[1] += m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
        f[2] += 1
    total_ns = sum(v[0] for v in fam.values())
    lines = [
        f"{len(ids)} kernels, {total_ns / 1e6:.3f} ms of kernel time (sum of node durations)",
        f"{'family':<28}{'kernels':>8}{'ms':>9}{'share':>7}{'MB':>10}{'GB/s':>8}{'of copy':>8}",
    ]
    for name, (ns, by, n) in sorted(fam.items(), key=lambda kv: -kv[1][0]):
        bw = by / ns if ns else 0.0  # bytes per ns = GB/s
        lines.append(
            f"{name:<28}{int(n):>8}{ns / 1e6:>9.3f}{ns / total_ns:>7.1%}{by / 1e6:>10.1f}{bw:>8.0f}"
            f"{bw / (copy_tbs * 1e3):>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Any:
    p = argparse.ArgumentParser(prog="python -m perf.profile_graph", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="27b")
    p.add_argument("--profile", default="nvfp4")
    p.add_argument("--activations", default="fp32")
    p.add_argument("--lanes", type=int, default=1)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=on|off",
        help="a CudaQwen36 decode switch before the capture (moe_route_fused, moe_combine_fused, gemv_prefetch)",
    )
    p.add_argument("--summarize", default=None, help="an ncu --csv log of this script: print the table")
    p.add_argument("--copy-tbs", type=float, default=4.28, help="copy ceiling in TB/s (read + write)")
    a = p.parse_args(argv)
    if a.summarize:
        print(summarize(a.summarize, a.copy_tbs))
        return None
    _step(a)
    return None


if __name__ == "__main__":
    main()
