"""Anatomy of the decode GEMV's launch boundaries (GPU): every block of a 27B layer chain stamps the global timer at
six points, so the ~10 us a launch costs beyond its bytes (docs/cuda.md, "Per-launch cost") splits into its parts::

    PYTHONPATH=. python -m perf.gemv_trace --rows 1,8 --layers 3

The chain is a 27B GDN layer's products as the model runs them (norm folding included): the in-projection reads
the folded norm of the residual, the output projection and the down projection add into the residual and write
its partial sums of squares, gate | up reads the folded norm, down reads SwiGLU(gate | up). Launched back to back
with PDL in one CUDA graph over ``--layers`` layers' weights (more bytes than the L2), replayed, and the last
replay's stamps read back. The kernel is a copy of gemv.cu with the stamps patched in (``_TRACE``): a timing
experiment, nothing here feeds a result.

Stamps per block (``%globaltimer``, ns): t0 the block starts (after its PDL trigger), t1 its weight ring's first
tiles are issued, t2 its PDL wait returns (the previous launch is complete), t3 the first activation chunk and the
folded norm's 1 / rms are in registers, t4 the products are done, t5 its split's partial is stored (the last block
of a row block: after the split sum and the fold). Per launch the report gives: ``start`` the first block's t0
after the previous launch's last t5 (negative: blocks started early under PDL), ``wait`` the first t2 after the
previous launch's last t5 (the completion's latency), ``act`` the median t3 - t2, ``prod`` the median and the 90th
percentile and maximum of t4 - t3, ``bar`` the median of thread 0's time in the products' chunk barriers (part of
``prod``; at 2-8 lanes one barrier per GV_CHUNK tiles), ``store`` the median t5 - t4 of all blocks and the maximum (the last blocks'
split sum), ``tail`` the last t5 minus the median t5, and ``span`` the last t5 minus the previous launch's.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from .bench_gemv import SHAPES, _random_weight

__all__ = ["main"]

_REC = (
    11  # u64 words per block record: t0 .. t5, smid, linear block id, N | K << 32, the weight's address, bar
)
_CAP = 1 << 16  # records

_HEAD = (
    'extern "C" {\n__device__ unsigned int gv_trn;\n'
    f"__device__ unsigned long long gv_trbuf[{_REC * _CAP}];\n"
    f"__device__ unsigned long long gv_trbar[{_CAP}];\n}}\n"
    "__device__ __forceinline__ unsigned long long gv_now() {\n"
    '    unsigned long long t;\n    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n    return t;\n}\n'
)

_BLOCK = "blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)"
# (text in gv_kernel or gv_products, the text with the stamps)
_TRACE = (
    (
        "    pdl_trigger();\n#ifdef GV_HOST_EMU",
        "    pdl_trigger();\n    const unsigned long long tr0 = gv_now();\n#ifdef GV_HOST_EMU",
    ),
    (
        "    gv_prologue<F>(wsm, lane, src, t, nt);\n",
        "    gv_prologue<F>(wsm, lane, src, t, nt);\n    const unsigned long long tr1 = gv_now();\n",
    ),
    (
        "    if (!experts) pdl_wait();\n",
        "    if (!experts) pdl_wait();\n    const unsigned long long tr2 = gv_now();\n",
    ),
    (
        "    float acc[MT][4];\n    gv_products",
        "    const unsigned long long tr3 = gv_now();\n    float acc[MT][4];\n    gv_products",
    ),
    ("    const GvFold fo{", "    const unsigned long long tr4 = gv_now();\n    const GvFold fo{"),
    (
        "    gv_store<F, T, NB, GU>(gv_sm, acc, bx, tile, split, splits, yb, lt, ldy, ws, cnt, p1, p2, wbase, N, nb, fo);\n",
        "    gv_store<F, T, NB, GU>(gv_sm, acc, bx, tile, split, splits, yb, lt, ldy, ws, cnt, p1, p2, wbase, N, nb, fo);\n"
        "    const unsigned long long tr5 = gv_now();\n"
        "    if (threadIdx.x == 0) {\n"
        "        unsigned smid;\n"
        '        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));\n'
        f"        const unsigned i = atomicAdd(&gv_trn, 1u);\n        if (i < {_CAP}u) {{\n"
        f"            unsigned long long* r = gv_trbuf + (unsigned long long)i * {_REC};\n"
        "            r[0] = tr0, r[1] = tr1, r[2] = tr2, r[3] = tr3, r[4] = tr4, r[5] = tr5, r[6] = smid;\n"
        f"            r[7] = {_BLOCK};\n"
        "            r[8] = (unsigned long long)N | ((unsigned long long)K << 32), r[9] = (unsigned long long)p0;\n"
        f"            r[10] = gv_trbar[({_BLOCK}) % {_CAP}u];\n"
        "        }\n    }\n",
    ),
    # thread 0's time in the products' chunk barriers, kept per block: its record is written before its launch
    # completes, and the next launch's blocks reach their barriers only after their PDL wait, so no other block
    # overwrites the slot in between
    (
        "    gv_put<F, T, NB>(xv, sm);  // chunk 0, fetched by the caller\n",
        "    gv_put<F, T, NB>(xv, sm);  // chunk 0, fetched by the caller\n    unsigned long long trbar = 0;\n",
    ),
    (
        "        if (c + 1 < nchunks) gv_put<F, T, NB>(xv, sm + ((c + 1) & 1) * ACT);\n        __syncthreads();\n    }\n",
        "        if (c + 1 < nchunks) gv_put<F, T, NB>(xv, sm + ((c + 1) & 1) * ACT);\n"
        "        const unsigned long long trb = gv_now();\n        __syncthreads();\n        trbar += gv_now() - trb;\n"
        f"    }}\n    if (threadIdx.x == 0) gv_trbar[({_BLOCK}) % {_CAP}u] = trbar;\n",
    ),
)


def _traced(original: Any) -> Any:
    def src(name: str) -> str:
        s = original(name)
        if name != "gemv.cu":
            return s
        for old, new in _TRACE:
            if s.count(old) != 1:
                raise SystemExit(f"gemv_trace: {old!r} not once in the source")
            s = s.replace(old, new)
        return _HEAD + s

    return src


def _layer_calls(lin: Any, fmt: str, b: int, layers: int, rng: Any) -> list[Any]:
    """The launches of ``layers`` 27B GDN layers' decode products (their weights distinct), as the model chains
    them: in-proj (folded norm in), out-proj (residual fold), gate | up (folded norm in), down (SwiGLU in, fold)."""
    import cupy

    from ninfer.cuda.norm import Normed

    h = SHAPES["mlp down"][0]
    names = ("gdn qkv|z", "attn o", "mlp gate|up", "mlp down")
    res = cupy.asarray(rng.standard_normal((b, h)).astype(np.float32))
    nw = cupy.asarray(rng.standard_normal(h).astype(np.float32) * 0.1)

    def part(n: str) -> Any:
        p = lin.gemv_plan(fmt, *SHAPES[n])
        return cupy.asarray(rng.random((p.blocks_x, b)).astype(np.float32) * h)

    pa, pb = part("attn o"), part("mlp down")
    mix = cupy.asarray(rng.standard_normal((b, SHAPES["attn o"][1])).astype(np.float32))
    y_in = cupy.empty((b, SHAPES["gdn qkv|z"][0]), np.float32)
    gu = cupy.empty((b, SHAPES["mlp gate|up"][0]), np.float32)
    calls = []
    for _ in range(layers):
        w_in, w_o, w_gu, w_dn = (_random_weight(fmt, SHAPES[n]) for n in names)
        calls += [
            lambda w=w_in: lin.gemv(Normed(res, pb, nw, 1e-6), w, y_in),
            lambda w=w_o: lin.gemv(mix, w, res, fold=pa),
            lambda w=w_gu: lin.gemv(Normed(res, pa, nw, 1e-6), w, gu),
            lambda w=w_dn: lin.gemv(gu, w, res, swiglu=True, fold=pb),
        ]
    return calls


def _replay(fns: list[Any], mod: Any) -> np.ndarray:
    """The stamps of the last of a few graph replays of ``fns`` (one PDL chain), as [blocks, _REC] int64."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for f in fns:
            f()
        stream.begin_capture()
        for f in fns:
            f()
        graph = stream.end_capture()
        graph.upload(stream)
        for _ in range(3):
            graph.launch(stream)
        stream.synchronize()
        n = cupy.ndarray((1,), np.uint32, mod.get_global("gv_trn"))
        n.fill(0)
        stream.synchronize()
        t0, t1 = cupy.cuda.Event(), cupy.cuda.Event()
        t0.record(stream)
        graph.launch(stream)
        t1.record(stream)
        t1.synchronize()
        us = cupy.cuda.get_elapsed_time(t0, t1) * 1e3
    cnt = min(int(n.get()[0]), _CAP)
    buf = cupy.ndarray((_CAP, _REC), np.uint64, mod.get_global("gv_trbuf"))[:cnt].get().astype(np.int64)
    print(f"  graph replay {us:.1f} us, {cnt} block records", flush=True)
    return buf


def _launches(rec: np.ndarray) -> list[np.ndarray]:
    """The records grouped by launch (each launch of the chain reads its own weight), in order of first start."""
    groups = [rec[rec[:, 9] == p] for p in np.unique(rec[:, 9])]
    return sorted(groups, key=lambda g: int(g[:, 0].min()))


def _stats(launches: list[np.ndarray]) -> list[dict[str, float]]:
    """Per launch (in order): its shape and the report's quantities in microseconds (module docstring)."""
    out, prev_end = [], None
    for r in launches:
        t0, t2, t3, t4, t5 = (r[:, i] for i in (0, 2, 3, 4, 5))
        end = int(t5.max())

        def rel(v: int, p: int | None = prev_end) -> float:
            return float("nan") if p is None else (v - p) / 1e3

        prod, store = (t4 - t3) / 1e3, (t5 - t4) / 1e3
        out.append(
            {
                "n": int(r[0, 8] & 0xFFFFFFFF),
                "k": int(r[0, 8] >> 32),
                "blocks": len(r),
                "start": rel(int(t0.min())),
                "wait": rel(int(t2.min())),
                "act": float(np.median(t3 - t2)) / 1e3,
                "prod": float(np.median(prod)),
                "p90": float(np.percentile(prod, 90)),
                "max": float(prod.max()),
                "bar": float(np.median(r[:, 10])) / 1e3,
                "store": float(np.median(store)),
                "smax": float(store.max()),
                "tail": (end - float(np.median(t5))) / 1e3,
                "span": rel(end),
            }
        )
        prev_end = end
    return out


def _line(name: str, d: dict[str, float]) -> str:
    return (
        f"  {name:22s} blocks {d['blocks']:4.0f} | start {d['start']:6.1f} wait {d['wait']:5.1f} | act {d['act']:4.1f}"
        f" | prod {d['prod']:5.1f} p90 {d['p90']:5.1f} max {d['max']:5.1f} bar {d['bar']:4.1f}"
        f" | store {d['store']:4.1f} max"
        f" {d['smax']:4.1f} | tail {d['tail']:5.1f} | span {d['span']:6.1f}"
    )


def _report(stats: list[dict[str, float]], names: list[str] | None) -> None:
    """Each launch (``names``), or the mean per shape over the launches after the first (a whole decode step)."""
    if names is not None:
        for name, d in zip(names, stats, strict=False):
            print(_line(name, d), flush=True)
        return
    kinds: dict[tuple[int, int], list[dict[str, float]]] = {}
    for d in stats[1:]:
        kinds.setdefault((int(d["n"]), int(d["k"])), []).append(d)
    for (n, k), ds in kinds.items():
        mean = {key: float(np.mean([d[key] for d in ds])) for key in ds[0]}
        print(_line(f"{n}x{k} ({len(ds)})", mean), flush=True)
    spans = sum(d["span"] for d in stats[1:])
    print(
        f"  GEMV launches {len(stats)}; first start to last end {spans:.1f} us after the first launch",
        flush=True,
    )


def _model(a: argparse.Namespace, lin: Any, loader: Any) -> None:
    """One decode step of the synthetic model (perf/profile_graph.py), every GEMV of its graph stamped."""
    import cupy

    from .profile_graph import decode_step

    for lanes in (int(x) for x in a.rows.split(",")):
        print(f"{a.model} decode step, {lanes} lane(s), 8K context: the GEMVs' mean per shape", flush=True)
        step = decode_step(a.model, lanes=lanes)
        mod = loader.load_module("gemv.cu", lin.SOURCES["gemv.cu"])
        n = cupy.ndarray((1,), np.uint32, mod.get_global("gv_trn"))
        n.fill(0)
        cupy.cuda.Device().synchronize()
        t0, t1 = cupy.cuda.Event(), cupy.cuda.Event()
        t0.record()
        step()
        t1.record()
        t1.synchronize()
        cnt = min(int(n.get()[0]), _CAP)
        rec = cupy.ndarray((_CAP, _REC), np.uint64, mod.get_global("gv_trbuf"))[:cnt].get().astype(np.int64)
        print(
            f"  step {cupy.cuda.get_elapsed_time(t0, t1) * 1e3:.1f} us (host launch included), {cnt} records"
        )
        _report(_stats(_launches(rec)), None)
        del step
        cupy.get_default_memory_pool().free_all_blocks()


def main(argv: list[str] | None = None) -> None:
    import ninfer.cuda.linear as lin
    import ninfer.cuda.loader as loader

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8", help="activation rows (lanes) per case")
    ap.add_argument(
        "--layers", type=int, default=3, help="layers' weights in the chain (>= 2: more than the L2)"
    )
    ap.add_argument("--format", default="NVFP4G16_E4M3S")
    ap.add_argument(
        "--model", default=None, help="27b or 35b: a whole decode step of that synthetic model instead"
    )
    a = ap.parse_args(argv)
    # the trace instruments gemv.cu's text; the 5-8-row launches run gemv_w8.cu by default, so they take the 4-warp
    # kernel here (its stamps are gemv.cu's; the w8 blocks' boundary is not traced)
    lin.GV_W8 = False
    lin.SOURCES["gemv.cu"] = tuple(n for n in lin.SOURCES["gemv.cu"] if ", float," in n)
    loader.source_text = _traced(loader.source_text)
    loader.load_module.cache_clear()
    if a.model:
        _model(a, lin, loader)
        return
    rng = np.random.default_rng(0)
    names = ["in-proj", "out-proj", "gate|up", "down"] * a.layers
    for b in (int(x) for x in a.rows.split(",")):
        print(f"27B GDN layer chain, {a.layers} layers, {b} row(s), {a.format}", flush=True)
        fns = _layer_calls(lin, a.format, b, a.layers, rng)
        mod = loader.load_module("gemv.cu", lin.SOURCES["gemv.cu"])
        _report(_stats(_launches(_replay(fns, mod))), names)


if __name__ == "__main__":
    main()
