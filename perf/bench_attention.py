"""Prefill attention micro-benchmark (GPU): the wgmma and GQA tensor-core kernels against the earlier one-head kernel.

    python -m perf.bench_attention                 # on a GPU; prints a table, returns the results
    python -m perf.bench_attention --out DIR       # also writes DIR/bench_attention.json
    python -m perf.bench_attention --lengths 2048,8192 --q float,bf16

``ninfer.cuda.attention_prefill`` with ``variant="gqa"`` (a KV head's query heads in one block, cp.async
double-buffered K/V tiles, ldmatrix) and ``variant="head"`` (one query head per block), on the attention shapes of
the 27B (24 query heads, 4 KV heads, head dim 256) and the 35B-A3B (16 query heads, 2 KV heads, head dim 256):
one sequence prefilled from position 0 over a bf16 paged cache of 16-token pages in a shuffled page order. Timed
with CUDA events (median of the repeats after a warm-up); TFLOP/s counts the causal FLOPs once, 4·HQ·D·T²/2
(float q runs twice the MMAs of that: q and P split into bf16 halves), and ``frac_gemm`` compares with a torch
bf16 8192³ GEMM measured in the same run. ``bitwise`` says whether the two mma.sync kernels' outputs are identical
(they compute the same arithmetic per row). Where it compiles (sm_90a), ``variant="wg"`` (the GQA block on
``wgmma``, the default there) is timed too: ``wg_ms``, ``wg_tflops``, ``wg_frac_gemm``, and against the GQA kernel
``wg_bitwise`` and ``wg_err`` (max |difference| over max |output|), and its rounded precisions (P, or q and P, to
bf16: ``wg_p-bf16_*``, ``wg_bf16_*``, their errors against the GQA kernel's exact output), and the
warp-specialized kernel at precision ``"bf16"`` under each of its options (``ws_ov_*``, ``ws_pp_*``,
``ws_ovpp_*``: overlap, ping-pong; ``ws_base_*`` neither), each with whether it is bitwise the ``"wg"`` kernel's ``"bf16"`` output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .bench_peers import event_seconds, gemm_bf16

SHAPES = {"27B": (24, 4, 256), "35B-A3B": (16, 2, 256)}  # (HQ, HKV, D)
LENGTHS = (2048, 8192, 32768)
PAGE = 16


def _case(model: str, t_len: int, qt: str, rng: np.random.Generator, reps: int) -> dict[str, Any]:
    import cupy

    from ninfer.cuda.attention_prefill import attention_prefill
    from ninfer.formats import bf16_encode

    hq, hkv, d = SHAPES[model]
    pages = -(-t_len // PAGE)
    kc = cupy.asarray(bf16_encode(rng.standard_normal((pages, PAGE, hkv, d)).astype(np.float32)))
    vc = cupy.asarray(bf16_encode(rng.standard_normal((pages, PAGE, hkv, d)).astype(np.float32)))
    q = rng.standard_normal((t_len, hq, d)).astype(np.float32)
    qd = cupy.asarray(bf16_encode(q) if qt == "bf16" else q)
    table = cupy.asarray(rng.permutation(pages).astype(np.int32)[None])
    row_seq = cupy.zeros(t_len, dtype=np.int32)
    row_pos = cupy.arange(t_len, dtype=np.int32)
    args = (qd, kc, vc, table, row_seq, row_pos)
    outs, ms = {}, {}
    for v in ("gqa", "head", "wg")[: 3 if _has_wg() else 2]:
        outs[v] = cupy.empty_like(qd)
        ms[v] = 1e3 * event_seconds(
            lambda v=v: attention_prefill(*args, max_len=t_len, out=outs[v], variant=v), reps
        )
    flops = 4 * hq * d * t_len**2 / 2
    same = bool(cupy.array_equal(outs["gqa"].view(cupy.uint8), outs["head"].view(cupy.uint8)))
    out = {"model": model, "HQ": hq, "HKV": hkv, "D": d, "T": t_len, "q": qt, "new_ms": ms["gqa"],
           "old_ms": ms["head"], "new_tflops": flops / (ms["gqa"] * 1e-3) / 1e12,
           "old_tflops": flops / (ms["head"] * 1e-3) / 1e12, "speedup": ms["head"] / ms["gqa"], "bitwise": same}  # fmt: skip
    if "wg" in ms:
        a, b = (_values(outs[v], qt) for v in ("wg", "gqa"))
        out.update(wg_ms=ms["wg"], wg_tflops=flops / (ms["wg"] * 1e-3) / 1e12,
                   wg_bitwise=bool(cupy.array_equal(outs["wg"].view(cupy.uint8), outs["gqa"].view(cupy.uint8))),
                   wg_err=float(cupy.max(cupy.abs(a - b)) / cupy.max(cupy.abs(b))))  # fmt: skip
        for prec in ("p-bf16", "bf16"):  # the rounded operands (attention_prefill PRECISIONS)
            o = cupy.empty_like(qd)
            ms_p = 1e3 * event_seconds(
                lambda o=o, prec=prec: attention_prefill(
                    *args, max_len=t_len, out=o, variant="wg", precision=prec
                ),
                reps,
            )
            err = float(cupy.max(cupy.abs(_values(o, qt) - b)) / cupy.max(cupy.abs(b)))
            out.update({f"wg_{prec}_ms": ms_p, f"wg_{prec}_tflops": flops / (ms_p * 1e-3) / 1e12,
                        f"wg_{prec}_err": err})  # fmt: skip
        out.update(_ws(args, t_len, qd, o, flops, reps))
    return out


def _ws(args: tuple, t_len: int, qd: Any, wg_bf16: Any, flops: float, reps: int) -> dict[str, Any]:
    """The warp-specialized kernel (variant "ws", precision "bf16") under each of its options (intra-warpgroup
    overlap ``ov``, ping-pong turns ``pp``): time and whether it is bitwise the "wg" kernel at that precision."""
    import cupy

    import ninfer.cuda.attention_prefill as ap

    res: dict[str, Any] = {}
    keep = ap.WS_OPTIONS
    try:
        for ov, pp in ap._WS_OPTIONS:
            ap.WS_OPTIONS = (ov, pp)
            o = cupy.empty_like(qd)
            ms = 1e3 * event_seconds(
                lambda o=o: ap.attention_prefill(*args, max_len=t_len, out=o, variant="ws", precision="bf16"),
                reps,
            )
            key = "ws_" + ("ov" * ov + "pp" * pp or "base")
            res.update({f"{key}_ms": ms, f"{key}_tflops": flops / (ms * 1e-3) / 1e12,
                        f"{key}_bitwise": bool(cupy.array_equal(o.view(cupy.uint8), wg_bf16.view(cupy.uint8)))})  # fmt: skip
    finally:
        ap.WS_OPTIONS = keep
    return res


def _has_wg() -> bool:
    from ninfer.cuda.loader import compute_capability, family_supported

    return family_supported("attention_wg.cu", compute_capability())


def _values(o: Any, qt: str) -> Any:
    """An output as float32 (bf16 words decoded)."""
    import cupy

    return (o.astype(cupy.uint32) << 16).view(cupy.float32) if qt == "bf16" else o


def main(
    lengths: tuple[int, ...] = LENGTHS, qtypes: tuple[str, ...] = ("float",), reps: int = 5
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    gemm = gemm_bf16()["flops"] / 1e12
    print(f"torch bf16 GEMM 8192^3: {gemm:.0f} TFLOP/s")
    print(f"{'model':8s} {'T':>6s} {'q':5s} {'old ms':>9s} {'old TF/s':>9s} {'new ms':>9s} {'new TF/s':>9s} "
          f"{'speedup':>8s} {'new/GEMM':>9s} bitwise {'wg ms':>8s} {'wg TF/s':>8s} {'wg/GEMM':>8s} wg≡gqa")  # fmt: skip
    cases = []
    for model in SHAPES:
        for t_len in lengths:
            for qt in qtypes:
                c = _case(model, t_len, qt, rng, reps if t_len < 32768 else max(2, reps // 2))
                c["frac_gemm"] = c["new_tflops"] / gemm
                wg = ""
                if "wg_ms" in c:
                    c["wg_frac_gemm"] = c["wg_tflops"] / gemm
                    wg = (f" {c['wg_ms']:8.2f} {c['wg_tflops']:8.1f} {c['wg_frac_gemm']:8.1%} "
                          f"{c['wg_bitwise']} (err {c['wg_err']:.1e})")  # fmt: skip
                    for prec in ("p-bf16", "bf16"):
                        c[f"wg_{prec}_frac_gemm"] = c[f"wg_{prec}_tflops"] / gemm
                        wg += (f" | {prec} {c[f'wg_{prec}_ms']:.2f} ms {c[f'wg_{prec}_frac_gemm']:.1%} "
                               f"err {c[f'wg_{prec}_err']:.1e}")  # fmt: skip
                    for k in [k[:-3] for k in c if k.startswith("ws_") and k.endswith("_ms")]:
                        c[f"{k}_frac_gemm"] = c[f"{k}_tflops"] / gemm
                        wg += (
                            f" | {k} {c[f'{k}_ms']:.2f} ms {c[f'{k}_frac_gemm']:.1%} ≡wg {c[f'{k}_bitwise']}"
                        )
                cases.append(c)
                print(f"{model:8s} {t_len:6d} {qt:5s} {c['old_ms']:9.2f} {c['old_tflops']:9.1f} {c['new_ms']:9.2f} "
                      f"{c['new_tflops']:9.1f} {c['speedup']:7.2f}x {c['frac_gemm']:9.1%} {c['bitwise']}{wg}")  # fmt: skip
    return {"gemm_tflops": gemm, "cases": cases}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m perf.bench_attention")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--q", default="float", help="q dtypes, comma-separated: float, bf16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="directory for bench_attention.json")
    a = ap.parse_args()
    res = main(tuple(int(v) for v in a.lengths.split(",")), tuple(a.q.split(",")), a.reps)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "bench_attention.json").write_text(json.dumps(res, indent=1))
