"""Decode with and without norm folding (docs/cuda.md, "Norm folding"), or with and without the decode GEMVs' L2
prefetch of the next product (``--toggle prefetch``: ``CudaQwen36.gemv_prefetch``), in one run on the same network.

    python -m perf.bench_fold --out perf/results          # 27B and 35B-A3B synthetic nvfp4, 1 and 8 lanes
    python -m perf.bench_fold --toggle prefetch           # the same A/B for the prefetch hints (norms folded)
    python -m perf.bench_fold --toggle route --model 35b  # MoE routing inside the gate | up launch (moe_route_fused)
    python -m perf.bench_fold --toggle combine --model 35b  # the combine + norm in the down launch (moe_combine_fused)
    python -m perf.bench_fold --toggle moe --model 35b    # both
    python -m perf.bench_fold --toggle w8 --lanes 8       # 5-8-lane GEMVs on 8-warp blocks (linear.GV_W8)
    python -m perf.bench_fold --toggle bulk               # NVFP4 weight ring by bulk copies (linear.GV_BULK)
    python -m perf.bench_fold --toggle wave3,wave2        # GEMV K-splits sized for 3 or 2 blocks per SM, not 4
    python -m perf.bench_fold --toggle swiglu             # gate | up GEMVs (dense, experts) with the SwiGLU epilogue
    python -m perf.bench_fold --toggle rtail --model 35b  # MoE routing in the router GEMV's tail (moe_route_router)
    python -m perf.bench_fold --toggle gdnp --lanes 8     # GDN decode on persistent clusters (gdn_step.STEP_PERSIST)

For each model and lane count, the graph-replayed decode step (logits included) with ``fold_norms`` off, then on
(the graphs recaptured between), and the captured graph's node count by type (cuGraphGetNodes /
cuGraphNodeGetType through the driver API): a step's kernel count before and after. Prints a table and writes
``bench_fold.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
from pathlib import Path
from typing import Any

from ninfer.cuda import gemv_geometry as _geo

from .bench_model import bench_decode

__all__ = ["main", "graph_node_types"]

TOGGLES = ("fold", "prefetch", "route", "combine", "moe", "w8", "bulk", "wave3", "wave2", "tiles2", "tiles1",
           "swiglu", "rtail", "dtiles2", "dtiles4", "gdnp")  # fmt: skip
# Split-plan experiments (gemv_geometry constant -> the value tried; other sums' order, so not bitwise the default):
# wave3 / wave2 size the one-wave grid for 3 or 2 resident GEMV blocks per SM instead of 4 (fewer K-splits, so the
# next launch's blocks find free slots to start in under PDL); tiles2 / tiles1 let a split of an expert launch be
# 2 or 1 K-tiles instead of 4 (more blocks for the small products); dtiles2 / dtiles4 set the dense launches'
# minimum (default 1, _GV_DENSE_MIN_TILES) to 2, or back to 4 (None: the default until 1 measured faster)
_PLANS = {"wave3": ("_GV_WAVE_BLOCKS", 396), "wave2": ("_GV_WAVE_BLOCKS", 264), "tiles2": ("_GV_MIN_TILES", 2),
          "tiles1": ("_GV_MIN_TILES", 1), "dtiles2": ("_GV_DENSE_MIN_TILES", 2),
          "dtiles4": ("_GV_DENSE_MIN_TILES", None)}  # fmt: skip
_PLAN_DEFAULTS = {attr: getattr(_geo, attr) for attr, _ in _PLANS.values()}  # the module's own values

# CUgraphNodeType (cuda.h)
_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
               7: "event_record", 10: "mem_alloc", 11: "mem_free"}  # fmt: skip


def graph_node_types(graph: Any) -> dict[str, int]:
    """Node counts by type of a ``cupy.cuda.graph.Graph`` (its cudaGraph_t is the driver's CUgraph)."""
    cu = ctypes.CDLL("libcuda.so.1")
    h, n = ctypes.c_void_p(graph.graph), ctypes.c_size_t(0)
    if cu.cuGraphGetNodes(h, None, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    nodes = (ctypes.c_void_p * n.value)()
    if cu.cuGraphGetNodes(h, nodes, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    out: dict[str, int] = {"total": int(n.value)}
    t = ctypes.c_int(0)
    for node in nodes:
        if cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)) != 0:
            raise RuntimeError("cuGraphNodeGetType failed")
        name = _NODE_TYPES.get(t.value, f"type{t.value}")
        out[name] = out.get(name, 0) + 1
    return out


def _switch(net: Any, toggle: str, on: bool) -> None:
    """Sets the one switch an A/B flips (the graphs are captured again after it)."""
    if toggle == "fold":
        net.fold_norms = on
    elif toggle == "route":
        net.moe_route_fused = on
    elif toggle == "combine":
        net.moe_combine_fused = on
    elif toggle == "moe":  # both MoE fusions
        net.moe_route_fused = net.moe_combine_fused = on
    elif toggle in _PLANS:  # the split plan's constant, then every cached plan and launch geometry dropped
        import ninfer.cuda.linear as linear

        attr, value = _PLANS[toggle]
        setattr(_geo, attr, value if on else _PLAN_DEFAULTS[attr])
        linear.replan()
    elif toggle == "swiglu":
        net.gemv_swiglu_out = on
    elif toggle == "rtail":
        net.moe_route_router = on
    elif toggle in ("w8", "bulk"):  # module switches, read at every launch
        import ninfer.cuda.linear as linear

        setattr(linear, "GV_W8" if toggle == "w8" else "GV_BULK", on)
    elif toggle == "gdnp":  # the GDN decode's persistent clusters above 4 sequences (gdn_step.STEP_PERSIST)
        import ninfer.cuda.gdn_step as gdn_step

        gdn_step.STEP_PERSIST = on
    else:
        net.gemv_prefetch, net.gemv_next = on, {}


def _state(net: Any, toggle: str) -> bool:
    """The switch's current setting (``moe``: the routing fusion's; both fusions share their default)."""
    import ninfer.cuda.linear as linear

    name = {"fold": "fold_norms", "route": "moe_route_fused", "combine": "moe_combine_fused",
            "moe": "moe_route_fused", "prefetch": "gemv_prefetch", "swiglu": "gemv_swiglu_out", "rtail": "moe_route_router"}.get(toggle)  # fmt: skip
    if toggle in _PLANS:
        attr, value = _PLANS[toggle]
        return getattr(_geo, attr) == value
    if toggle == "gdnp":
        import ninfer.cuda.gdn_step as gdn_step

        return bool(gdn_step.STEP_PERSIST)
    if name is None:
        return bool(linear.GV_BULK if toggle == "bulk" else linear.GV_W8)
    return bool(getattr(net, name))


def _model(key: str, a: argparse.Namespace) -> list[dict[str, Any]]:
    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences

    from .cli import MODELS
    from .synthetic import synthetic_tensors

    mc = REG[MODELS[key]].config
    net = CudaQwen36(mc, synthetic_tensors(mc, a.profile), act_dtype="fp32")
    net.warmup()
    cap = a.context + a.steps + 64
    lanes = [int(x) for x in a.lanes.split(",")]
    seqs = Sequences(
        net, slots=max(lanes) + 1, pages=-(-cap // 16) * (max(lanes) + 1), page_size=16, context=cap
    )
    rows = []
    for toggle in a.toggle.split(","):  # one network for every A/B (each switch back to its default)
        default = _state(net, toggle)
        for on in (False, True):
            _switch(net, toggle, on)
            net.graphs.clear()
            for n in lanes:
                r = bench_decode(seqs, n, a.context, a.steps)
                r |= {
                    "model": key,
                    "on": on,
                    "toggle": toggle,
                    "nodes": graph_node_types(net.graphs.graph(n)),
                }
                rows.append(r)
                print(
                    f"{key} {toggle}={on!s:5} x{n}: {r['step_ms']:.3f} ms/step {r['tok_s']:.1f} tok/s  {r['nodes']}"
                )
        _switch(net, toggle, default)
    net.graphs.clear()
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | switch | lanes | step ms (off) | step ms (on) | speed-up | kernels off -> on |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["on"]:
            continue
        f = next(
            x for x in rows
            if x["on"] and x["model"] == r["model"] and x["lanes"] == r["lanes"] and x["toggle"] == r["toggle"]
        )  # fmt: skip
        lines.append(
            f"| {r['model']} | {r['toggle']} | {r['lanes']} | {r['step_ms']:.3f} | {f['step_ms']:.3f} | "
            f"{r['step_ms'] / f['step_ms']:.3f}x | {r['nodes'].get('kernel')} -> {f['nodes'].get('kernel')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m perf.bench_fold")
    p.add_argument("--model", default="27b,35b")
    p.add_argument("--profile", default="nvfp4")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--lanes", default="1,8")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument(
        "--toggle", default="fold", help=f"what the A/B switches, one or more of {','.join(TOGGLES)}"
    )
    p.add_argument("--out", default=None, help="directory for bench_fold.json")
    a = p.parse_args(argv)
    bad = set(a.toggle.split(",")) - set(TOGGLES)
    if bad:
        p.error(f"unknown --toggle {','.join(sorted(bad))} (choose from {','.join(TOGGLES)})")
    rows: list[dict[str, Any]] = []
    for key in a.model.split(","):
        rows += _model(key, a)
        gc.collect()
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    print(_table(rows))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (
            out / ("bench_fold.json" if a.toggle == "fold" else f"bench_{a.toggle.replace(',', '_')}.json")
        ).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
