"""Text table and PNG plot of one ``ninfer-perf`` result (matplotlib optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["table", "plot"]


def _find(rows: list[dict], key: str, value: int) -> dict | None:
    return next((r for r in rows if r.get(key) == value), None)


def table(result: dict[str, Any]) -> str:
    c = result["ceilings"]
    lines = [
        f"ninfer-perf  commit {result['commit']}  {result['device']}  {result['date']}  activations "
        + ",".join(sorted({m.get("activations", "bf16") for m in result["models"].values()})),
        f"ceilings: copy {c['copy_Bps'] / 1e12:.2f} TB/s, bf16 GEMM {c['gemm_flops'] / 1e12:.0f} TFLOP/s "
        f"({c['gemm_how']})",
        f"{'model':18s} {'decode x1':>16s} {'decode x8':>16s} {'prefill 8K':>18s} {'TTFT 8K':>8s} "
        f"{'follow-up':>9s} {'HF prefill':>10s} {'HF decode':>9s}",
    ]
    for m in result["models"].values():
        d1, d8 = _find(m["decode"], "lanes", 1), _find(m["decode"], "lanes", 8)
        p8 = _find(m["prefill"], "tokens", 8192)
        hf = m.get("transformers", {})

        def dec(d: dict | None) -> str:
            return f"{d['tok_s']:7.1f} ({d['frac_roofline']:4.0%})" if d else "-"

        pre = f"{p8['tok_s']:7.0f} ({p8['frac_gemm']:5.1%})" if p8 else "-"
        ttft = f"{p8['ttft_s']:7.2f}s" if p8 else "-"
        fu = f"{m['followup']['ttft_reuse_s']:8.3f}s" if "followup" in m else "-"
        na = "failed" if "error" in hf else "n/a"
        hfp = f"{hf['prefill_tok_s']:10.0f}" if "prefill_tok_s" in hf else f"{na:>10s}"
        hfd = f"{hf['decode_tok_s']:9.2f}" if "decode_tok_s" in hf else f"{na:>9s}"
        lines.append(
            f"{m['model']:18s} {dec(d1):>16s} {dec(d8):>16s} {pre:>18s} {ttft:>8s} {fu:>9s} {hfp} {hfd}"
        )
    lines.append(
        "decode: tok/s (fraction of the memory roofline); prefill: tok/s (fraction of cuBLAS bf16 FLOP/s)"
    )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Decode tok/s vs lanes against the roofline, and prefill tok/s per prompt length; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = list(result["models"].values())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m in models:
        lanes = [d["lanes"] for d in m["decode"]]
        axes[0].plot(lanes, [d["tok_s"] for d in m["decode"]], "o-", label=f"{m['model']} measured")
        axes[0].plot(lanes, [d["roofline_tok_s"] for d in m["decode"]], "--", label=f"{m['model']} roofline")
        axes[1].plot(
            [p["tokens"] for p in m["prefill"]], [p["tok_s"] for p in m["prefill"]], "o-", label=m["model"]
        )
    axes[0].set(xlabel="busy lanes (8K context)", ylabel="decode tok/s", yscale="log", title="decode")
    axes[1].set(xlabel="prompt tokens", ylabel="prefill tok/s", xscale="log", title="prefill")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"ninfer-perf {result['commit']} ({result['device']}, {models[0]['profile'] if models else ''})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
