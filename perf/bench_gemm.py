"""Prefill GEMM (``ninfer.cuda.gemm.gemm``: the wgmma kernels on an H200, cuda_src/gemm_sm90.cu) against cuBLAS
bf16 (torch) on the 27B projection shapes, measured in the same run.

    python -m perf.bench_gemm                      # on a GPU; prints a table, returns the rows
    python -m perf.bench_gemm --out DIR            # also writes DIR/bench_gemm.json
    python -m perf.bench_gemm --impl mma           # the mma.sync kernel (cuda_src/gemm.cu) instead
    python -m perf.bench_gemm --rows 128,512       # other row counts (the pair mode's threshold region)
    python -m perf.bench_gemm --formats NVFP4G16_E4M3S --paths bf16,f16,f16ws   # the fp16 scratch kernel's loops
    python -m perf.bench_gemm --splitk             # the ws kernel's split-K at a follow-up turn's rows (below)

NVFP4, BF16, FP8 (row scales) and Q4 weights (random codes generated on the device, perf/synthetic.py), M = 2048
and 8192 rows. Paths per (format, shape, M): ``bf16`` activations; ``fp32`` activations through the in-loop kernel
(``impl="wgmma"``: split and dequantization by the CUDA cores every K tile); ``pair``: fp32 activations in the
pair mode (``impl="pair"``, ninfer/cuda/gemm_pair.py: split and, for FP8 / NVFP4, dequantization once per call,
both included in the time; BF16, FP8 and NVFP4 only). The pair kernel's main loop is the same for every format,
so a format's pair time minus BF16's is its dequantization pass; ``f16``: fp32 activations in the fp16 mode
(``inputs="fp16"``: each row rounded to fp16 under a power-of-two scale, one MMA per product; FP8 / NVFP4 only,
ceiling = cuBLAS) with the weights dequantized once into the fp16 scratch; ``f16il``: the same with the weights
converted in the main loop (``impl="wgmma"``; bitwise the ``f16`` result, off the default path: slower); ``f16ws``:
``f16`` with the warp-specialized TMA main loop, unsplit (``variant="ws1"``, cuda_src/gemm_sm90_ws.cu; bitwise the
``f16`` result; its split-K: ``--splitk``); ``f16g`` / ``f16gk`` (the group formats, Q4 here): their fp16 mode,
the default (ninfer/cuda/gemm_group.py: the codes as fp16 operands, the group scales on partial sums,
``gemm_plan.GROUP_F16`` set for the call), the operands computed per call / kept (an ``OperandStore``, as the
runner keeps them; ceiling = cuBLAS; ``vs`` over the in-loop exact kernel); ``f16gd`` (Q4/Q5/Q6): ``f16gk``
with the group scaling deferred by one K tile (``gemm_plan.GROUP_DEFER``, the same bits; ``vs`` over f16gk);
``f16bk`` (BF16): its fp16 mode from the kept row-scaled operand (ninfer/cuda/gemm_bf16.py, ``gemm_plan.BF16_F16`` set; the first call, which builds
the operand, falls in the warm-up; ``vs`` over the pair mode). FLOP/s counts 2·M·N·K; float32 activations run two MMAs per k-step (exact hi/lo split), so their ceiling
is half of cuBLAS's: the ``vs ceiling`` column is the fraction of cuBLAS for bf16 and the fp16 mode, and of half
of cuBLAS for the exact float32 paths; ``vs`` (JSON ``vs_fp32``) is the speedup of pair, f16 and f16il over the
in-loop kernel, and of f16ws over f16. CUDA-event timing, median of repeats after a warm-up (about 60 s warm on an
H200; the first run also compiles the gemm_sm90.cu and gemm_sm90_ws.cu families, ~2 min, unless CuPy's cache has
them: give perf/device_run.sh BENCH_TIMEOUT=400).

``--served`` (:func:`served_main`): the fp16 mode as the model's prefill runs it, on the 27B's fused projections
(SPLITK_SHAPES) at 2048 / 4096 / 8192 rows, the first of ``--formats`` (NVFP4, FP8 or a group format; BF16's fp16
path takes float rows only: the default table's ``f16bk``): the rows already in fp16 form (``F16Rows``, as the norms write them),
the weight's fp16 operand kept (the runner's resident operands: no dequant pass), ``variant="auto"`` (kernel and
K splits by gemm_plan's rules), against cuBLAS bf16 at the same (M, N, K) in the same run: the issue's "fraction
of cuBLAS on the 27B prefill shapes". ``--max-splits S`` also times the ws kernel with 1 .. S splits forced (the
numbers for the split rule above one wave).

``--splitk`` (:func:`splitk_main`): the 27B's five fused dense projections (SPLITK_SHAPES) at a follow-up turn's
rows (default 128, 256, 384, 512), NVFP4, fp16 mode with the weight's fp16 operand kept (as the runner keeps it:
no dequant pass in the time; the row split is in it), through the cp kernel and the ws kernel with S forced to 1 ..
--max-splits (splits of at least 4 K tiles), ``*`` marking what ``variant="auto"`` runs (gemm_plan.f16_auto_ws,
splitk_splits). Each time is the median over --reps of 10 back-to-back calls (host launch gaps hidden), so the
table shows which kernel and S win per shape and rows: the numbers to set F16_WS_SPLIT_ROWS and the SPLITK_*
constants from. Repeating one GEMM keeps part of a small weight in L2 (60 MB): slightly optimistic for o_proj.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bench_peers import event_seconds

__all__ = ["main", "splitk_main", "served_main", "SHAPES", "SPLITK_SHAPES", "FORMATS", "ROWS"]

SHAPES = (
    ("qkv_gdn", 10240, 5120),
    ("mlp_up", 17408, 5120),
    ("mlp_down", 5120, 17408),
    ("o_proj", 5120, 6144),
)
FORMATS = ("NVFP4G16_E4M3S", "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S")
ROWS = (2048, 8192)
# the 27B's fused dense projections (N, K) as the model runs them (memory_plan._dense_shapes)
SPLITK_SHAPES = (
    ("attn_qkv", 14336, 5120),
    ("o_proj", 5120, 6144),
    ("gdn_in", 16480, 5120),
    ("mlp_gate_up", 34816, 5120),
    ("mlp_down", 5120, 17408),
)
SPLITK_ROWS = (128, 256, 384, 512)
SERVED_ROWS = (2048, 4096, 8192)


def _cublas(m: int, n: int, k: int) -> float:
    import torch

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / 10


def _paths(fmt: str, impl: str) -> tuple[tuple[str, str, str, str, str], ...]:
    """(label, activation dtype, impl, inputs, fp16-mode variant) of the paths measured for ``fmt``."""
    from ninfer.cuda.gemm_group import GROUP_STRUCTS
    from ninfer.cuda.gemm_pair import PAIR_STRUCTS, f16_foldable

    if impl == "mma":
        return (("bf16", "bf16", "mma", "exact", "cp"), ("fp32", "fp32", "mma", "exact", "cp"))
    paths = [("bf16", "bf16", impl, "exact", "cp"), ("fp32", "fp32", "wgmma", "exact", "cp")]
    if fmt in PAIR_STRUCTS:
        paths.append(("pair", "fp32", "pair", "exact", "cp"))
    if f16_foldable(fmt):  # fp32 activations rounded to fp16 per row: one MMA per product
        paths.append(("f16", "fp32", "pair", "fp16", "cp"))  # weights dequantized once into the fp16 scratch
        # weights converted in the main loop; the scratch kernel's TMA / warp-specialized loop (the default from 384 rows)
        paths += [("f16il", "fp32", "wgmma", "fp16", "cp"), ("f16ws", "fp32", "pair", "fp16", "ws1")]
    # the group formats' fp16 mode (gemm_group.py), BF16's from the kept row-scaled operand (gemm_bf16.py); each
    # with its gemm_plan switch on for the call
    # with K split by gemm_plan's rule (``auto``, as the model runs them; before 1f73c17 unsplit, ``ws1``)
    if fmt in GROUP_STRUCTS:
        paths += [("f16g", "fp32", "auto", "fp16", "auto"), ("f16gk", "fp32", "auto", "fp16", "auto")]
        if GROUP_STRUCTS[fmt][1] == 1:  # gemm_plan.GROUP_DEFER: the deferred scaling, kept operands
            paths.append(("f16gd", "fp32", "auto", "fp16", "auto"))
    if fmt == "BF16":
        paths.append(("f16bk", "fp32", "auto", "fp16", "auto"))
    return tuple(paths)


_BASE = {
    "pair": "fp32",
    "f16": "fp32",
    "f16il": "fp32",
    "f16ws": "f16",
    "f16g": "fp32",
    "f16gk": "fp32",
    "f16gd": "f16gk",
    "f16bk": "pair",
}  # what each ``vs`` column compares with


def main(
    rows: tuple[int, ...] = ROWS,
    fmts: tuple[str, ...] = FORMATS,
    reps: int = 5,
    impl: str = "auto",
    only: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    """Time the paths (``only``: these labels) of every format, shape and row count; print and return the rows."""
    import cupy

    from ninfer.cuda import gemm_plan as plan
    from ninfer.cuda.gemm import gemm
    from ninfer.cuda.operands import OperandStore

    from .synthetic import random_weight

    rs = cupy.random.RandomState(0)
    ref = {(m, n, k): _cublas(m, n, k) for m in rows for _, n, k in SHAPES}
    out_rows = []
    for fmt in fmts:
        for name, n, k in SHAPES:
            w = random_weight(fmt, (n, k), rs, 0.02)
            for m in rows:
                xf = rs.standard_normal((m, k), dtype=np.float32)
                xs = {"bf16": (xf.view(np.uint32) >> 16).astype(np.uint16), "fp32": xf}
                times: dict[str, float] = {}
                for label, act, how, inp, var in _paths(fmt, impl):
                    if only is not None and label not in only:
                        continue
                    x = xs[act]
                    out = cupy.empty((m, n), dtype=x.dtype)
                    store = OperandStore(1 << 34) if label in ("f16gk", "f16gd", "f16bk") else None
                    saved = plan.GROUP_F16, plan.BF16_F16, plan.GROUP_DEFER
                    plan.GROUP_F16 = label in ("f16g", "f16gk", "f16gd")
                    plan.GROUP_DEFER = label == "f16gd"
                    plan.BF16_F16 = label == "f16bk"
                    try:
                        t = event_seconds(
                            lambda x=x, out=out, w=w, how=how, inp=inp, var=var, store=store: gemm(
                                x, w, out, impl=how, inputs=inp, variant=var, operands=store
                            ),
                            reps=reps,
                        )
                    finally:
                        plan.GROUP_F16, plan.BF16_F16, plan.GROUP_DEFER = saved
                    if label == "f16bk" and store is not None and store.refused(w, "f16row"):
                        print(
                            f"f16bk {name} {m}: the weight is not exact in fp16 per row: the pair mode was timed"
                        )
                    fl, tc = 2 * m * n * k, ref[(m, n, k)]
                    times[label] = t
                    base = times.get(_BASE.get(label, ""))
                    out_rows.append({
                        "shape": name, "m": m, "n": n, "k": k, "fmt": fmt, "act": label, "impl": how, "s": t,
                        "tflops": fl / t / 1e12, "cublas_tflops": fl / tc / 1e12, "frac_cublas": tc / t,
                        "frac_ceiling": tc / t * (2 if act == "fp32" and inp != "fp16" else 1),
                        "vs_fp32": base / t if base else None,
                    })  # fmt: skip
                    del out
            del w
    _print(out_rows)
    return out_rows


def _print(out_rows: list[dict[str, Any]]) -> None:
    print(
        f"{'gemm':26s} {'format':15s} {'act':5s} {'TFLOP/s':>8s} {'cuBLAS':>8s} {'ratio':>6s} {'vs ceiling':>10s} "
        f"{'vs':>7s}"
    )
    for r in out_rows:
        sp = f"{r['vs_fp32']:6.2f}x" if r["vs_fp32"] else ""
        print(
            f"{r['shape']:8s} {r['m']:5d}x{r['n']:5d}x{r['k']:<5d} {r['fmt']:15s} {r['act']:5s} {r['tflops']:8.1f} "
            f"{r['cublas_tflops']:8.1f} {r['frac_cublas']:6.1%} {r['frac_ceiling']:10.1%} {sp:>7s}"
        )


def _time_f16(x: Any, w: Any, out: Any, store: Any, variant: str, reps: int) -> float:
    """Seconds per fp16-mode GEMM ``variant``: the median over ``reps`` of 10 back-to-back calls, divided by 10."""
    from ninfer.cuda.gemm import gemm

    def call() -> None:
        for _ in range(10):
            gemm(x, w, out, inputs="fp16", variant=variant, operands=store)

    return event_seconds(call, reps=reps) / 10


def splitk_main(
    rows: tuple[int, ...] = SPLITK_ROWS, fmt: str = "NVFP4G16_E4M3S", reps: int = 5, max_splits: int = 8
) -> list[dict[str, Any]]:
    """Time cp and ws with S = 1 .. ``max_splits`` on SPLITK_SHAPES at ``rows``; print and return the rows."""
    import cupy

    from ninfer.cuda import gemm_pair as gp
    from ninfer.cuda.operands import OperandStore

    from .synthetic import random_weight

    rs = cupy.random.RandomState(0)
    out_rows: list[dict[str, Any]] = []
    print(f"{'gemm':12s} {'rows':>5s} {'kernel':7s} {'S':>2s} {'us':>8s} {'TFLOP/s':>8s} {'vs cp':>6s}  auto")
    for name, n, k in SPLITK_SHAPES:
        w = random_weight(fmt, (n, k), rs, 0.02)
        store = OperandStore(4 * n * k)
        nk = -(-k // 64)
        for m in rows:
            x = rs.standard_normal((m, k), dtype=np.float32)
            out = cupy.empty((m, n), dtype=np.float32)
            auto_ws, auto_s = gp.f16_auto_ws(m, n, k), gp.splitk_splits(m, n, k)
            cases = [("cp", 1)] + [("ws", s) for s in range(1, max_splits + 1) if s == 1 or nk // s >= 4]
            base = None
            for kern, s in cases:
                t = _time_f16(x, w, out, store, "cp" if kern == "cp" else f"ws{s}", reps)
                base = t if kern == "cp" else base
                chosen = (kern == "ws") == auto_ws and (kern == "cp" or s == auto_s)
                r = {"shape": name, "m": m, "n": n, "k": k, "fmt": fmt, "kernel": kern, "splits": s, "s": t,
                     "tflops": 2 * m * n * k / t / 1e12, "vs_cp": base / t, "auto": chosen}  # fmt: skip
                out_rows.append(r)
                print(f"{name:12s} {m:5d} {kern:7s} {s:2d} {t * 1e6:8.1f} {r['tflops']:8.1f} {r['vs_cp']:5.2f}x"
                      f"  {'*' if chosen else ''}")  # fmt: skip
            del x, out
        del w, store
    return out_rows


def served_main(
    rows: tuple[int, ...] = SERVED_ROWS, fmt: str = "NVFP4G16_E4M3S", reps: int = 5, max_splits: int = 0
) -> list[dict[str, Any]]:
    """Time the served fp16-mode GEMM (``variant="auto"``; with ``max_splits``, also ws with S = 1 .. max_splits
    forced) on SPLITK_SHAPES at ``rows`` against cuBLAS bf16; print and return the rows."""
    import cupy

    from ninfer.cuda import gemm_pair as gp
    from ninfer.cuda._common import F16Rows
    from ninfer.cuda.gemm_group import GROUP_STRUCTS
    from ninfer.cuda.operands import OperandStore

    from .synthetic import random_weight

    rs = cupy.random.RandomState(0)
    out_rows: list[dict[str, Any]] = []
    print(
        f"{'gemm':12s} {'rows':>5s} {'variant':7s} {'S':>2s} {'us':>8s} {'TFLOP/s':>8s} {'cuBLAS':>8s} {'ratio':>6s}"
    )
    for name, n, k in SPLITK_SHAPES:
        w = random_weight(fmt, (n, k), rs, 0.02)
        store = OperandStore(4 * n * k)
        for m in rows:
            # fp16 words of values in [-2, 2) (bit patterns below 0x4000 and their negatives), row factors 1
            words = rs.randint(0, 0x4000, size=(m, k), dtype=np.int32) | (rs.randint(0, 2, size=(m, k)) << 15)
            x = F16Rows(words.astype(np.uint16), cupy.ones(m, dtype=np.float32))
            out = cupy.empty((m, n), dtype=np.float32)
            tc = _cublas(m, n, k)
            if fmt in GROUP_STRUCTS:  # gemm_group: always the ws kernel, the rule over 128-column tiles
                cases = [("auto", gp.splitk_splits(m, 2 * n, k))]
            else:
                cases = [("auto", gp.splitk_splits(m, n, k) if gp.f16_auto_ws(m, n, k) else 0)]
            cases += [(f"ws{s}", s) for s in range(1, max_splits + 1)]
            fl = 2 * m * n * k
            for var, s in cases:
                t = _time_f16(x, w, out, store, var, reps)
                r = {"shape": name, "m": m, "n": n, "k": k, "fmt": fmt, "variant": var, "splits": s, "s": t,
                     "tflops": fl / t / 1e12, "cublas_tflops": fl / tc / 1e12, "frac_cublas": tc / t}  # fmt: skip
                out_rows.append(r)
                print(f"{name:12s} {m:5d} {var:7s} {s:2d} {t * 1e6:8.1f} {r['tflops']:8.1f} "
                      f"{r['cublas_tflops']:8.1f} {r['frac_cublas']:6.1%}")  # fmt: skip
            del x, out, words
        del w, store
    return out_rows


if __name__ == "__main__":
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m perf.bench_gemm")
    ap.add_argument("--impl", default="auto", choices=("auto", "wgmma", "mma"), help="the bf16 path's kernel")
    ap.add_argument("--rows", default=None, help=f"default {ROWS}; with --splitk {SPLITK_ROWS}")
    ap.add_argument("--formats", default=",".join(FORMATS), help="with --splitk: the first one")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--paths",
        default=None,
        help="only these paths (bf16,fp32,pair,f16,f16il,f16ws,f16g,f16gk,f16gd,f16bk)",
    )
    ap.add_argument("--splitk", action="store_true", help="cp vs ws with forced K splits (splitk_main)")
    ap.add_argument("--served", action="store_true", help="the served fp16 GEMM vs cuBLAS (served_main)")
    ap.add_argument("--max-splits", type=int, default=None, help="--splitk: default 8; --served: default 0")
    ap.add_argument("--out", type=Path, default=None, help="directory for bench_gemm.json")
    a = ap.parse_args()
    paths = tuple(a.paths.split(",")) if a.paths else None
    if a.splitk:
        rws = tuple(int(v) for v in a.rows.split(",")) if a.rows else SPLITK_ROWS
        fmt = a.formats.split(",")[0]
        res = splitk_main(rws, fmt, a.reps, 8 if a.max_splits is None else a.max_splits)
    elif a.served:
        rws = tuple(int(v) for v in a.rows.split(",")) if a.rows else SERVED_ROWS
        res = served_main(rws, a.formats.split(",")[0], a.reps, a.max_splits or 0)
    else:
        rws = tuple(int(v) for v in a.rows.split(",")) if a.rows else ROWS
        res = main(rws, tuple(a.formats.split(",")), a.reps, a.impl, paths)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        mode = "_splitk" if a.splitk else "_served" if a.served else ""
        (a.out / f"bench_gemm{mode}.json").write_text(json.dumps(res, indent=1))
