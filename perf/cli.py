"""``ninfer-perf``: synthetic models at the registered shapes on the GPU, measured against re-measured ceilings.

    ninfer-perf --quick --out perf/results          # 27B and 35B-A3B at nvfp4, ~5 minutes on an H200

Rooflines: decode is memory bound, bytes per step = matrix weights read once (MoE: the expected
distinct experts of the step's tokens) + GDN state read and written + KV read, at the measured copy bandwidth;
prefill is compute bound, FLOPs = 2 x active matrix parameters + causal attention, at the measured cuBLAS bf16
GEMM rate. Every figure is reported with its fraction of the roofline.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from ninfer.cuda import options as cuda_options

from .bench_model import bench_decode, bench_followup, bench_prefill, model_bytes
from .bench_peers import copy_bandwidth, gemm_bf16, transformers_peer
from .report import plot, table
from .synthetic import PROFILES

__all__ = ["main", "rooflines"]

MODELS = {"27b": "qwen3.6-27b", "35b": "qwen3.6-35b-a3b"}
# device memory left beside the kept prefill operands for a 32K prompt's chunk temporaries (the GDN scratch, the
# attention partials, activations: a few GiB for the 27B at 4096-token chunks)
OPERAND_LEAVE = 16 << 30


def rooflines(mc: Any, sizes: dict[str, int], bw: float, flops: float, lanes: int, context: int) -> dict:
    """Decode tok/s ceiling at ``lanes`` x ``context`` and prefill FLOPs per token (without attention)."""
    from ninfer.cuda.memory_plan import snapshot_bytes

    dense = sizes["matrix_bytes"] - sizes["expert_bytes"]
    experts = sizes["expert_bytes"]
    if mc.is_moe:  # expected distinct experts per layer among lanes x k random choices
        frac = 1.0 - (1.0 - mc.num_experts_per_tok / mc.num_experts) ** lanes
        experts = int(experts * frac)
    kv_tok = 2 * len(mc.full_attention_layers) * mc.num_key_value_heads * mc.head_dim * 2
    step = dense + experts + lanes * (2 * snapshot_bytes(mc, "fp32") + context * kv_tok)
    active = sizes["params"] - sizes["expert_params"]
    if mc.is_moe:
        active += sizes["expert_params"] * mc.num_experts_per_tok // mc.num_experts
    return {"decode_tok_s": lanes * bw / step, "bytes_per_step": step, "flops_per_token": 2 * active}


def _attn_flops(mc: Any, n: int) -> float:
    """Causal attention FLOPs of an n-token prompt (QK and PV, every attention layer)."""
    return len(mc.full_attention_layers) * 2 * 2 * mc.num_attention_heads * mc.head_dim * n * n / 2


def bench_model(key: str, args: argparse.Namespace, ceil: dict[str, float], log: Any) -> dict[str, Any]:
    import cupy

    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.engine.config import default_prefill_chunk

    from .synthetic import synthetic_tensors  # beside the model imports (PROFILES above is the table alone)

    mc = REG[MODELS[key]].config
    t0 = time.perf_counter()
    phases: dict[str, float] = {}  # where the build's time goes (the 27B's took ~190 s on a fresh machine)
    mark = [t0]

    def phase(name: str) -> None:  # the time since the previous phase ended
        now = time.perf_counter()
        phases[name], mark[0] = round(now - mark[0], 2), now

    tensors = synthetic_tensors(mc, args.profile, mtp=args.spec > 0)
    phase("tensors")
    net = CudaQwen36(
        mc, tensors, **cuda_options.backend_options(args),
        **({"attn_chunk": args.attn_chunk} if args.attn_chunk else {}),
    )  # fmt: skip
    if args.gdn_variant:
        net.gdn_variant = args.gdn_variant
    net.gdn_conv_prep = args.gdn_conv_prep == "on"
    if args.moe_fusions is not None:  # decode MoE: routing in gate|up, combine + norm in the down launch
        net.moe_route_fused = net.moe_combine_fused = args.moe_fusions == "on"
    if args.gemv_prefetch is not None:
        net.gemv_prefetch = args.gemv_prefetch == "on"
    del tensors  # the model holds the fused weights; the unfused parts are freed
    phase("model")
    net.warmup()
    phase("warmup")
    longest = max(
        args.prefill + [args.followup_context + args.followup_tokens, args.context + args.steps + 8]
    )
    pages = -(-(longest + 64) // 16)
    seqs = Sequences(net, slots=16, pages=pages * 10, page_size=16, context=longest + 64)
    # --prefill-weights (auto, as served: where memory allows), once the KV pool is sized
    kept = net.keep_prefill_operands(leave=OPERAND_LEAVE)
    phase("allocate")
    chunk = args.chunk or default_prefill_chunk(mc)  # the server's default for this model unless given
    net.warm_prefill(chunk)  # as the server does: a full chunk, so no first-chunk cost is timed
    phase("warm_prefill")
    res: dict[str, Any] = {"model": MODELS[key], "profile": args.profile, "activations": args.activations}
    res["prefill_chunk"], res["prefill_inputs"] = chunk, args.prefill_inputs
    res["prefill_attention"], res["prefill_gdn"] = args.prefill_attention, args.prefill_gdn
    res["prefill_weights"], res["prefill_operand_budget"] = args.prefill_weights, kept
    res["sizes"] = model_bytes(net)
    res["build_s"], res["build_phases_s"] = time.perf_counter() - t0, phases
    gb = res["sizes"]["matrix_bytes"] / 1e9
    log(f"{key}: built in {res['build_s']:.1f} s ({phases}), {gb:.2f} GB of matrices")
    res["prefill"] = []
    keep = None
    for n in args.prefill:
        r, sid = bench_prefill(seqs, n, chunk)
        if n == args.followup_context and keep is None:
            keep = sid  # the follow-up turn resumes from it
        else:
            seqs.free(sid)
        rf = rooflines(mc, res["sizes"], ceil["copy_Bps"], ceil["gemm_flops"], 1, n)
        r["flops_per_s"] = r["tok_s"] * rf["flops_per_token"] + _attn_flops(mc, n) / r["prefill_s"]
        r["frac_gemm"] = r["flops_per_s"] / ceil["gemm_flops"]
        res["prefill"].append(r)
        log(
            f"{key}: prefill {n}: {r['tok_s']:.0f} tok/s ({r['frac_gemm']:.1%} of cuBLAS), TTFT {r['ttft_s']:.3f} s"
        )
    if keep is not None:
        fu = bench_followup(seqs, keep, args.followup_tokens)
        full = next(p for p in res["prefill"] if p["tokens"] == args.followup_context)
        fu["ttft_recompute_est_s"] = full["ttft_s"] * (fu["context"] + fu["new_tokens"]) / fu["context"]
        res["followup"] = fu
        log(f"{key}: follow-up turn {fu}")
        seqs.free(keep)
    res["decode"] = []
    for lanes in args.lanes:
        r = bench_decode(seqs, lanes, args.context, args.steps)
        rf = rooflines(mc, res["sizes"], ceil["copy_Bps"], ceil["gemm_flops"], lanes, args.context)
        r.update(roofline_tok_s=rf["decode_tok_s"], frac_roofline=r["tok_s"] / rf["decode_tok_s"])
        res["decode"].append(r)
        log(
            f"{key}: decode x{lanes} @{args.context}: {r['tok_s']:.1f} tok/s = {r['frac_roofline']:.1%} of roofline"
        )
    r = bench_decode(seqs, 1, args.context, 3, graph=False)
    res["decode_eager_1"] = r
    log(f"{key}: eager decode x1: {r['tok_s']:.1f} tok/s")
    res["graph_pool_bytes"] = net.graphs.pool_bytes()
    if args.spec:  # MTP speculation at forced acceptance: acceptance, tokens per round (perf/bench_spec.py)
        from .bench_spec import bench_forced

        res["spec"] = [
            r for lanes in (1, 8) for r in bench_forced(net, mc, lanes, args.spec, [100, 80, 50], 64)
        ]
        for r in res["spec"]:
            log(f"{key}: spec k={r['k']} x{r['lanes']} accept {r['accept_pct']}: {r['tok_s']:.1f} tok/s, "
                f"{r['tokens_per_round']:.2f} tokens/round")  # fmt: skip
    del net
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    if args.transformers:
        try:
            res["transformers"] = transformers_peer(mc, layers=4, prompt=1024, steps=8)
            log(f"{key}: transformers {res['transformers']}")
        except Exception as e:  # the peer column is optional; its failure must not lose our numbers
            res["transformers"] = {"error": f"{type(e).__name__}: {e}"[:500]}
            log(f"{key}: transformers failed: {res['transformers']['error']}")
    return res


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer-perf", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1K/8K prefill, 8K-context decode, 8K follow-up")
    p.add_argument("--models", default="27b,35b", help="comma list of 27b, 35b")
    p.add_argument("--profile", default="nvfp4", help=f"{', '.join(PROFILES)}: every matrix in that format")
    p.add_argument(
        "--spec", type=int, default=0, help="also measure MTP speculation with this many draft tokens (1..5)"
    )
    p.add_argument("--out", default="perf/results", help="directory for the JSON and PNG")
    p.add_argument("--commit", default="unknown", help="commit id recorded with the results")
    cuda_options.add_arguments(p)  # as ninfer serve takes them: --activations, --prefill-inputs, ...
    p.add_argument(
        "--gdn-variant",
        default=None,
        choices=("tc", "tcs", "tc8", "split", "mma", "fp32", "wsp", "wspq", "wsp2", "wspb"),
        help="the chunked GDN prefill's kernels (default: ninfer.cuda.gdn.DEFAULT_VARIANT)",
    )
    p.add_argument(
        "--gdn-conv-prep",
        default="on",
        choices=("on", "off"),
        help="the chunked GDN prefill's causal conv inside the tc prep (on, the model's default) or its own kernel",
    )
    p.add_argument(
        "--attn-chunk",
        type=int,
        default=None,
        help="positions per decode-attention split (CudaQwen36.attn_chunk; default the model's, 256): a per-model "
        "setting that changes every decode's bits, so compared as whole-model runs",
    )
    p.add_argument(
        "--moe-fusions",
        default=None,
        choices=("on", "off"),
        help="decode MoE layers with the routing inside gate|up and the combine + norm in the down launch "
        "(CudaQwen36.moe_route_fused, moe_combine_fused; default the model's)",
    )
    p.add_argument(
        "--gemv-prefetch",
        default=None,
        choices=("on", "off"),
        help="the decode GEMVs' L2 hints of the next product (CudaQwen36.gemv_prefetch; default the model's)",
    )
    p.add_argument(
        "--no-transformers",
        dest="transformers",
        action="store_false",
        help="skip the transformers reference measurement",
    )
    p.add_argument("--prefill", default=None, help="comma list of prompt lengths ('' for none)")
    p.add_argument("--lanes", default="1,2,4,8", help="comma list of decode lane counts ('' for none)")
    p.add_argument(
        "--no-pdl", dest="pdl", action="store_false", help="decode GEMVs without PDL (to measure it)"
    )
    p.add_argument(
        "--gemv-cluster",
        default=None,
        choices=("off", "graph", "always"),
        help="the decode GEMV's K-split sum through thread-block clusters (ninfer.cuda.linear.GV_CLUSTER)",
    )
    p.add_argument(
        "--attention-ws",
        default=None,
        choices=("off", "on", "ov", "pp", "ovpp"),
        help="the warp-specialized prefill attention at precision bf16 (ninfer.cuda.attention_prefill.WS_AUTO; on: "
        "the module's WS_OPTIONS, else those options: ov overlap, pp ping-pong; the same bits as off)",
    )
    p.add_argument(
        "--gemv-w8",
        default=None,
        choices=("on", "off"),
        help="5-8-lane decode GEMVs on gemv_w8.cu's 8-warp blocks (ninfer.cuda.linear.GV_W8; the same bits)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="prefill chunk (default: the server's for each model, ninfer.engine.config.default_prefill_chunk)",
    )
    return p


def _args(argv: list[str] | None) -> argparse.Namespace:
    a = _parser().parse_args(argv)
    default = [1024, 8192] if a.quick else [1024, 8192, 32768]
    a.prefill = default if a.prefill is None else [int(v) for v in a.prefill.split(",") if v]
    a.lanes = [int(v) for v in a.lanes.split(",") if v]
    a.context, a.steps = 8192, 16 if a.quick else 64
    a.followup_context, a.followup_tokens = (8192 if a.quick else 32768), 256
    return a


def _set_pdl(on: bool) -> None:
    """A measurement knob (a module switch read at launch; the server always runs the default, on)."""
    import ninfer.cuda.linear as linear

    linear._GV_PDL = on


def main(argv: list[str] | None = None) -> int:
    import cupy

    args = _args(argv)
    _set_pdl(args.pdl)
    if args.gemv_cluster is not None:  # a measurement knob as --no-pdl (the server runs the module's default)
        import ninfer.cuda.linear as linear

        linear.GV_CLUSTER = args.gemv_cluster
    if args.gemv_w8 is not None:  # likewise
        import ninfer.cuda.linear as linear

        linear.GV_W8 = args.gemv_w8 == "on"
    if args.attention_ws is not None:  # likewise
        import ninfer.cuda.attention_prefill as ap

        ap.WS_AUTO = args.attention_ws != "off"
        if args.attention_ws not in ("off", "on"):
            ap.WS_OPTIONS = ("ov" in args.attention_ws, "pp" in args.attention_ws)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    from ninfer.cuda.gdn import DEFAULT_VARIANT

    props = cupy.cuda.runtime.getDeviceProperties(0)
    ceil = {"copy_Bps": copy_bandwidth(), **{f"gemm_{k}": v for k, v in gemm_bf16().items()}}
    log(f"ceilings: copy {ceil['copy_Bps'] / 1e12:.2f} TB/s, GEMM {ceil['gemm_flops'] / 1e12:.0f} TFLOP/s")
    result = {
        "commit": args.commit, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "cupy": cupy.__version__, "ceilings": ceil, "models": {},
        "gdn_variant": args.gdn_variant or DEFAULT_VARIANT, "gdn_conv_prep": args.gdn_conv_prep,
        "attn_chunk": args.attn_chunk,  # None: the model default
        "moe_fusions": args.moe_fusions, "gemv_prefetch": args.gemv_prefetch, "gemv_w8": args.gemv_w8,
        "attention_ws": args.attention_ws,
    }  # fmt: skip
    path = out / f"perf_{args.profile}.json"
    for key in args.models.split(","):
        result["models"][key] = bench_model(key.strip(), args, ceil, log)
        path.write_text(json.dumps(result, indent=1))
    print(table(result), flush=True)
    (out / f"perf_{args.profile}.txt").write_text(table(result))
    png = plot(result, out / f"perf_{args.profile}.png")
    log(f"wrote {path}" + (f" and {png}" if png else " (no matplotlib: no PNG)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
