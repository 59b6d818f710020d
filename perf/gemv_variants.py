"""Decode GEMV design experiments (GPU): the same graph timing as perf/bench_gemv.py for variants of the kernel's
launch plan and source, compiled side by side in one process so their ratios come from one run::

    PYTHONPATH=. python -m perf.gemv_variants --variants base,ceil,stages3 --formats NVFP4G16_E4M3S,BF16

Variants (a variant changes only what its name says; results are timings, not numbers to trust for correctness):
  base      the kernel and plan as they are, 8 lanes on 4-warp blocks (linear.GV_W8 off; w8 below turns it on)
  ceil      the previous plan: ceil(2112 warps / row blocks) splits (up to a 10% partial second wave)
  mint2     at least 2 K-tiles per split instead of 4 (more splits for small matrices)
  wave528   grids of at most 528 blocks, no multi-wave rule (gate|up: 272 blocks)
  wave554   the plan before 2026-12-02: one wave with a 5% allowance (gate|up: 2 splits, 544 blocks)
  stages3   GV_STAGES 3 and 5 resident blocks per SM (registers capped at 102)
  occ5      5 resident blocks per SM (registers capped at 102) and a wave of 5 * 132 blocks (+5%)
  chunk4    one-lane activations staged per 4 tiles (GV_CHUNK1 4) instead of 16
  chunk4n   2-8 lanes staged per 4 tiles (GV_CHUNK 4, before 2026-12-02: 72 KB blocks for NVFP4, 3 per SM)
  static    a static __shared__ int beside the dynamic shared memory (before 2026-12-02 the last-block flag was one:
            the 1-lane NVFP4 block 4 bytes over a quarter of the SM's shared memory)
  nopdl     launched without programmatic dependent launch (a plain CuPy launch)
  nomul     diagnostic (wrong results): NVFP4 pairs without the block-scale multiply (its cost)
  nored     diagnostic (wrong results): every split writes its partial as the result (no last-block reduction:
            what the split-K tail costs)
  nowait    diagnostic: no griddepcontrol.wait (the next GEMV does not wait for the previous one: what the
            kernel boundary costs in a PDL chain; the inputs never change here, so the timing is meaningful)
  guN       mlp gate|up (N = 34816) split N ways (e.g. gu3, gu5, gu8: more, smaller blocks than one 544-block wave)
  sN        every product split N ways (at most its K-tiles; e.g. s1,s2,...,s20: the split rule's choice against
            every other split count, per shape; different rounding)
  fence     the split-K arrival as __threadfence + atomicAdd + __threadfence (before 2026-12-02; now one acq_rel
            atomic)
  w8        linear.GV_W8: the 5-8-lane products on gemv_w8.cu's 8-warp blocks (256 rows, 2 resident blocks per SM:
            the same 16 warps per SM) with the plan's own split counts, so every block stages its activations for
            twice the weight rows (docs/cuda.md, "Eight lanes"); the same results (tests/test_gemv_w8_host.py)
  w8one     w8, and the one-lane dense products on the 8-warp blocks too (linear.GV_W8_ONE: every format asked
            for; the same results)
  actl1     diagnostic (wrong results): every block stages its activations from the first 256 columns of each
            row (the same 8-16 KB for all blocks, L1-resident): what the activations' L2 -> SM traffic costs.
            Blocks of 128 rows read 32 B of fp32 activations per K column at 8 lanes (64 B where the prologue
            reads two rows: SwiGLU, the attention gate) against 72 B of NVFP4 weights, so at 8 lanes the SMs
            take in 1.4-1.9x the weight bytes; the 1-lane launches 1.06x
  nodq      diagnostic (wrong results): NVFP4 pairs as the raw code words (the whole dequantization's cost: the
            kernel's streaming + mma ceiling)
  pf, pfN   each GEMV of a chain prefetches the next one's first GV_PF_TILES (default 4, or N) K-tiles of its first
            wave into L2 from every block's start (linear.gemv's ``prefetch``; NVFP4 only; same results)
  pfend     pf with the hints issued by the blocks that finish last (GV_PF_START 0: the design measured a loss at
            ba43f57)
  bulk      NVFP4's weight ring filled by bulk copies (cuda_src/gemv_bulk.cuh, GV_BULK 1): one lane issues a stage's
            4 cp.async.bulk copies on one mbarrier, instead of 8 cp.async per lane (same results)
  bulkef    bulk with an L2 evict-first hint on the weights' copies (GV_BULK 2)
  xlane     GV_QG64_XLANE 1 (the default from db4788a until mask 5): the group-int formats' code bytes copied 16 per
            quad lane and read across the quad after a __syncwarp (cuda_src/wfrag.cuh; same results)
  noxlane   GV_QG64_XLANE 0: the group-int formats' per-lane 8-byte code copies (before 2026-12-07)
  xlN       GV_QG64_XLANE N, a mask (cuda_src/wfrag.cuh): 1 the codes (xlane), 2 each row set's scale word copied
            by one quad lane instead of all four, 4 Q5 / Q6's high-bit words as 16-byte pieces, one quad lane per
            row set; 5 (codes and high words) is the default (xl3 and xl7 were named xlane2 and xlane3 in
            perf/results/gemv_xlane23_h100.txt)
  w8x       GV_W8G32_XLANE 1: W8G32's codes copied 32 bytes per quad lane (a group each) and read across the quad
  w8f, now8f  GV_W8G32_FCVT 1 (the default since session 41) / 0: W8G32's int8 codes to float by a PRMT and an FADD,
            or by an I2F each (same results)
  q4hv2     GV_Q4_HV 2: Q4G64's stage with the two unused high-word vectors of before session 41 (7 vectors, 3
            blocks per SM instead of 4; the plan's stage bytes to match)
  swz, noswz  GV_QG64_SWZ 1 / 0: the group-int formats' shared slots placed for the banks (code pieces, high words,
            scale words; cuda_src/wfrag.cuh) or as before (same results); swzN: swz with GV_QG64_XLANE N
  defer     GV_GROUP_DEFER 1: the group formats' tile partials scaled into the accumulators after the next tile's
            first products instead of in a tail after the tile's last mma (cuda_src/gemv_products.cuh; same results)
  dir=PATH  the kernel sources of directory PATH (e.g. an older commit's cuda_src/, to compare in one run)
  olddq     the NVFP4 decode and tile loop before the integer-pipe diet (2026-12-02, docs/cuda.md "Decode GEMV on
            tensor cores"): plain shifts (ptxas: SHF), the lane's scale word shifted and masked, stage and
            fragment addresses from the tile index; same results, more integer-pipe instructions
  mulhi     GV_NV4_MULHI: pair 3's right shift as the high word of a product (IMAD.HI on the FMA pipe instead of SHF
            on the integer pipe; same results)
  cluster   the K-split reduction through thread-block clusters (linear.GV_CLUSTER "graph": a row block's splits as
            one cluster, rank 0 adds the partials from the others' shared memory; same results). base is the
            arrival-counter path of the same kernel; the report line adds how many clusters of each shape the
            device holds at once (cuOccupancyMaxActiveClusters) against the grid's
  nocl      base with the cluster branch compiled out (the kernel as before gv_store_cl: its register allocation
            is what the cluster code may change for the counter path; same results)
  cl8       cluster with at most 8 splits (portable cluster sizes; different plan, different rounding): whether
            clusters of 10-13 blocks pack the GPCs worse

Every variant also prints "layer", a 27B GDN layer's four products as a chain of launches, and "layer1", the same
parameters as one launch per layer: the bound for a persistent kernel walking a layer's products.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

from .bench_gemv import SHAPES, _copies, _experts, _random_weight
from .bench_peers import copy_bandwidth, graph_seconds

__all__ = ["main"]

_SHAPES = ("attn q|gate", "attn o", "gdn qkv|z", "mlp gate|up", "mlp down", "lm_head")
# the 35B-A3B's dense decode products (hidden 2048): latency-bound sizes (1-14 MB at NVFP4)
SHAPES_35B = {"35b gdn in": (12352, 2048), "35b gdn out": (2048, 4096), "35b attn qkvg": (9216, 2048)}


def _plan(lin: Any, base: Any, variant: str) -> Any:
    def plan(fmt: str, n: int, k: int, dense: bool = False) -> Any:
        p = base(fmt, n, k, dense)
        if variant == "q4hv2" and fmt == "Q4G64_F16S":  # GV_Q4_HV 2: Q5 / Q6's stage (before session 41)
            return dataclasses.replace(p, stage_bytes=base("Q5G64_F16S", n, k, dense).stage_bytes)
        if variant == "ceil":
            s = max(1, min(-(-2112 // (p.blocks_x * 4)), p.ntiles // 4))
        elif variant == "occ5":
            s = max(1, min(693 // p.blocks_x, p.ntiles // 4))
        elif variant == "mint2":
            s = max(1, min(554 // p.blocks_x, p.ntiles // 2))
        elif variant.startswith("gu") and variant[2:].isdigit():
            if n != 34816:
                return p
            s = int(variant[2:])
        elif variant in ("wave528", "wave554"):
            s = max(1, min(int(variant[4:]) // p.blocks_x, p.ntiles // 4))
        elif variant == "cl8":
            s = min(p.splits, 8)
        elif variant.startswith("s") and variant[1:].isdigit():
            s = min(int(variant[1:]), p.ntiles)
        else:
            return p
        return dataclasses.replace(p, splits=s)

    return plan


def _dir_source(root: Path, name: str) -> str:
    """``name`` from ``root`` with its local includes inlined once (as loader.source_text does)."""
    from ninfer.cuda.loader import _INCLUDE

    seen: set[str] = set()

    def expand(fname: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group(1) in seen:
                return ""
            seen.add(m.group(1))
            return expand(m.group(1))

        return _INCLUDE.sub(sub, (root / fname).read_text(encoding="utf-8")).replace("#pragma once", "")

    return expand(name)


def _must_replace(s: str, old: str, new: str) -> str:
    if old not in s:
        raise SystemExit(f"gemv_variants: {old!r} not in the source")
    return s.replace(old, new)


# olddq: (new text, the text before the diet) in gemv.cu as loader.source_text inlines wfrag.cuh into it
_OLDDQ = (
    (
        "return bf16x2_mul(gv_nv4_pair(word4(p.c, w), i), w < 2 ? p.s0 : p.s1);",
        "return bf16x2_mul(nv4_pair(word4(p.c, w), i), w < 2 ? p.s0 : p.s1);",
    ),
    (
        """        switch (2 * mt + r) {
            case 0: raw.b0 = gv_lds_u8<0>(b), raw.b1 = gv_lds_u8<1>(b); break;
            case 1: raw.b0 = gv_lds_u8<128>(b), raw.b1 = gv_lds_u8<129>(b); break;
            case 2: raw.b0 = gv_lds_u8<256>(b), raw.b1 = gv_lds_u8<257>(b); break;
            default: raw.b0 = gv_lds_u8<384>(b), raw.b1 = gv_lds_u8<385>(b); break;
        }""",
        """        (void)b;
        const u32 w = *reinterpret_cast<const u32*>(st + 2 * MT * 512 + (32 * (2 * mt + r) + lane) * 4);
        raw.b0 = raw.b1 = (w >> (16 * (t & 1))) & 0xffffu;""",
    ),
    (
        """        p.s0 = scale_up(r.b0 * 0x00100010u);
        p.s1 = scale_up(r.b1 * 0x00100010u);""",
        """        const u32 y = r.b0 * 0x00010001u;
        p.s0 = scale_up((y << 4) & 0x07F007F0u);
        p.s1 = scale_up((y >> 4) & 0x07F007F0u);""",
    ),
    (
        "const u32* f = f0 + s * NB * 4 * FW;",
        "const u32* f = sm + ((size_t)((tl * 8 + s) * NB + gb) * 4 + t) * FW;",
    ),
    (
        "for (int tl = 0, tend = min(GvChunk<NB>::V, nt - c * GvChunk<NB>::V); tl < tend; ++tl) {\n"
        "            const int i = c * GvChunk<NB>::V + tl;\n",
        "for (int tl = 0; tl < GvChunk<NB>::V; ++tl) {\n"
        "            const int i = c * GvChunk<NB>::V + tl;\n            if (i >= nt) break;\n",
    ),
    (
        "if (i < nt_refill) gv_copy_stage<F>(fill, lane, src, t);\n            fill = st;",
        "if (i + GV_STAGES - 1 < nt)\n"
        "                gv_copy_stage<F>(wsm + ((i + GV_STAGES - 1) % GV_STAGES) * STAGE, lane, src, t);",
    ),
)


def _source(original: Any, variant: str) -> Any:
    def src(name: str) -> str:
        if variant.startswith("dir="):
            return _dir_source(Path(variant[4:]), name)
        s = original(name)
        if name != "gemv.cu":
            return s
        if variant == "chunk4":
            s = s.replace("#define GV_CHUNK1 16", "#define GV_CHUNK1 4")
        if variant == "chunk4n":
            s = s.replace("#define GV_CHUNK 2 ", "#define GV_CHUNK 4 ")
        if variant == "static":  # the 4 static bytes (occupancy) only: the flag itself now lives in gv_store
            s = _must_replace(
                s,
                "extern __shared__ __align__(16) u32 gv_sm[];",
                "extern __shared__ __align__(16) u32 gv_sm[];\n    __shared__ volatile int gv_flag;\n    gv_flag = 0;",
            )
        nv4 = "return bf16x2_mul(gv_nv4_pair(word4(p.c, w), i), w < 2 ? p.s0 : p.s1);"
        if variant == "nomul":
            s = _must_replace(s, nv4, "return gv_nv4_pair(word4(p.c, w), i) ^ (w < 2 ? p.s0 : p.s1);")
        if variant == "olddq":
            for new, old in _OLDDQ:
                s = _must_replace(s, new, old)
        if variant == "mulhi":
            s = "#define GV_NV4_MULHI 1\n" + s
        if variant == "actl1":
            s = _must_replace(
                s, "k = (kt0 + tile) * 128 + 8 * cc;", "k = ((kt0 + tile) * 128 + 8 * cc) & 255;"
            )
        if variant == "nodq":
            s = _must_replace(s, nv4, "return word4(p.c, w) ^ (u32)i;")
        if variant == "fence":
            s = _must_replace(
                s,
                "if (threadIdx.x == 0) *last = arrive_acq_rel(cnt + tile, 1) == splits - 1;\n",
                "if (threadIdx.x == 0) {\n        __threadfence();\n        *last = atomicAdd(cnt + tile, 1) == splits - 1;\n"
                "        __threadfence();\n    }\n",
            )
        if variant == "nored":
            s = _must_replace(s, "if (splits == 1) {", "if (true) {")
        if variant == "nocl":
            s = _must_replace(s, "if (gv_cl_size() > 1) {", "if (false) {")
        if variant == "nowait":
            s = _must_replace(s, "if (!experts) pdl_wait();", "")
        if variant == "w8x":
            s = "#define GV_W8G32_XLANE 1\n" + s
        if variant in ("w8f", "now8f"):
            s = f"#define GV_W8G32_FCVT {int(variant == 'w8f')}\n" + s
        if variant == "q4hv2":
            s = "#define GV_Q4_HV 2\n" + s
        if variant == "defer":
            s = "#define GV_GROUP_DEFER 1\n" + s
        if variant == "noswz" or variant.startswith("swz"):
            s = f"#define GV_QG64_SWZ {int(variant != 'noswz')}\n" + s
            if variant[3:].isdigit():
                s = f"#define GV_QG64_XLANE {int(variant[3:])}\n" + s
        if variant in ("xlane", "noxlane") or (variant.startswith("xl") and variant[2:].isdigit()):
            mask = {"noxlane": 0, "xlane": 1}[variant] if "xlane" in variant else int(variant[2:])
            s = f"#define GV_QG64_XLANE {mask}\n" + s
        if variant in ("bulk", "bulkef"):
            s = f"#define GV_BULK {1 if variant == 'bulk' else 2}\n" + s
        if variant == "pfend":
            s = "#define GV_PF_START 0\n" + s
        if variant.startswith("pf") and variant[2:].isdigit():
            s = f"#define GV_PF_TILES {int(variant[2:])}\n" + s
        if variant == "occ5":
            s = s.replace("#define GV_MIN_BLOCKS 4", "#define GV_MIN_BLOCKS 5")
        if variant == "stages3":
            s = s.replace("#define GV_STAGES 4", "#define GV_STAGES 3")
            s = s.replace("#define GV_MIN_BLOCKS 4", "#define GV_MIN_BLOCKS 5")
        return s

    return src


def _next(ws: list[Any], i: int, variant: str) -> Any:
    """The weight a chain's GEMV i prefetches under the pf variants (the next one, cyclically), else None."""
    return ws[(i + 1) % len(ws)] if variant.startswith("pf") else None


# one 27B GDN layer's decode products in order (the GDN output projection has attn o's shape), as a chain
_CHAIN = ("gdn qkv|z", "attn o", "mlp gate|up", "mlp down")


def _call(lin: Any, x: Any, w: Any, out: Any, q: Any) -> Any:
    """One GEMV launch of a timed chain (``q``: the weight it prefetches, or None)."""
    return lambda: lin.gemv(x, w, out, prefetch=q)


def _chain(lin: Any, fmt: str, variant: str, rows: tuple[int, ...], ceiling: float, rng: Any) -> list[str]:
    """Microseconds per layer and fraction of copy of the _CHAIN products launched back to back over as many
    layers' weights as exceed the L2 (a decode step's GEMV sequence), each prefetching the next under pf."""
    import cupy

    first = [_random_weight(fmt, SHAPES[n]) for n in _CHAIN]
    moved = sum(w.data.nbytes for w in first)
    layers = max(2, -(-(240 << 20) // moved))
    ws = first + [_random_weight(fmt, SHAPES[n]) for _ in range(layers - 1) for n in _CHAIN]
    cells = []
    for b in rows:
        xs = [cupy.asarray(rng.standard_normal((b, w.cols)).astype(np.float32)) for w in first]
        outs = [cupy.empty((b, w.rows), dtype=np.float32) for w in first]
        j = len(_CHAIN)
        fns = [_call(lin, xs[i % j], w, outs[i % j], _next(ws, i, variant)) for i, w in enumerate(ws)]
        t = graph_seconds(fns, 10) * len(fns) / layers  # graph_seconds is per launch
        cells.append(f"layer x{b} {t * 1e6:.1f} {moved / t / ceiling:.2f}")
    return cells + _one_launch(lin, fmt, first, layers, rows, ceiling, rng, variant)


def _one_launch(
    lin: Any,
    fmt: str,
    first: list[Any],
    layers: int,
    rows: tuple[int, ...],
    ceiling: float,
    rng: Any,
    variant: str,
) -> list[str]:
    """The chain's bound with no boundary inside a layer: each layer's _CHAIN parameters as one GEMV of K = 5120
    (rows rounded up to a 128-row block), launched back to back over as many layers ("layer1": what a persistent
    kernel walking a layer's products could reach at best, docs/cuda.md "Next: one launch per layer chain")."""
    import cupy

    k = 5120
    n = -(-sum(w.rows * w.cols for w in first) // (k * 128)) * 128
    ws = [_random_weight(fmt, (n, k)) for _ in range(layers)]
    moved = ws[0].data.nbytes
    cells = []
    for b in rows:
        x = cupy.asarray(rng.standard_normal((b, k)).astype(np.float32))
        out = cupy.empty((b, n), dtype=np.float32)
        t = graph_seconds([_call(lin, x, w, out, None) for w in ws], 10)  # per launch: one per layer
        cells.append(f"layer1 x{b} {t * 1e6:.1f} {moved / t / ceiling:.2f}")
    return cells


def _occupancy(lin: Any, fmt: str) -> str:
    """Blocks of each float instance (1 and 8 lanes) the CUDA occupancy calculator fits on one SM, with the
    dynamic shared memory the wrapper launches it with (mlp gate|up's plan), and its registers."""
    import cupy

    from ninfer.cuda.loader import kernel

    out = []
    base = lin.gemv_plan(fmt, *SHAPES["mlp gate|up"])
    for nb in lin._GV_NB:
        # the w8 variant's 8-lane launches (w8one's one-lane ones too): gemv_w8.cu's 8-warp blocks
        w8 = lin.GV_W8 and (nb == 8 or (nb == 1 and fmt in lin.GV_W8_ONE))
        family, plan = (
            ("gemv_w8.cu", lin.w8_plan(base, SHAPES["mlp gate|up"][0])) if w8 else ("gemv.cu", base)
        )
        fn = kernel(family, lin.SOURCES[family], f"gemv_mma<{lin.FRAG_STRUCTS[fmt][0]}, float, {nb}>")
        smem = plan.smem_bytes(nb, "float")
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        try:
            n = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                fn.kernel.ptr, 32 * plan.warps, smem
            )
        except Exception as e:  # noqa: BLE001 - a report line, not a result
            n = f"? ({type(e).__name__}: {e})"
        out.append(f"x{nb}: {n} ({smem} B dynamic, {fn.shared_size_bytes} B static, {fn.num_regs} regs)")
    return ", ".join(out)


def _clusters(lin: Any, fmt: str, shapes: dict[str, tuple[int, int]]) -> str:
    """Per shape (one row, the cluster variants): clusters the device holds at once / clusters in the grid, and
    the cluster size (the plan's splits)."""
    from ninfer.cuda.launch import max_active_clusters
    from ninfer.cuda.loader import kernel

    fn = kernel("gemv.cu", lin.SOURCES["gemv.cu"], f"gemv_mma<{lin.FRAG_STRUCTS[fmt][0]}, float, 1>")
    out = []
    for name, (n, k) in shapes.items():
        p = lin.gemv_plan(fmt, n, k)
        if not 1 < p.splits <= lin.GV_CLUSTER_MAX:
            continue
        smem = p.smem_bytes(1, "float")
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        try:
            m = max_active_clusters(fn, (p.blocks_x, p.splits, 1), (128,), smem, (1, p.splits, 1))
        except Exception as e:  # noqa: BLE001 - a report line, not a result
            m = f"? ({type(e).__name__}: {e})"
        out.append(f"{name} {m}/{p.blocks_x} of {p.splits}")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> None:
    import cupy

    import ninfer.cuda.gemv_geometry as geo
    import ninfer.cuda.linear as lin
    import ninfer.cuda.loader as loader
    from ninfer.cuda.gemv_experts import gemv_experts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="base,ceil,stages3")
    ap.add_argument("--formats", default="NVFP4G16_E4M3S")
    ap.add_argument("--small", action="store_true", help="the 35B-A3B's shapes instead of the 27B's")
    ap.add_argument("--rows", default="1,4,8", help="activation rows per case")
    ap.add_argument("--no-chain", action="store_true", help="skip the decode-layer chain case")
    a = ap.parse_args(argv)
    shapes = SHAPES_35B if a.small else {n: SHAPES[n] for n in _SHAPES}
    rows = tuple(int(r) for r in a.rows.split(","))
    fmts = a.formats.split(",")
    # only the float instances of the formats asked for: each variant recompiles the family
    for family in ("gemv.cu", "gemv_w8.cu"):
        lin.SOURCES[family] = tuple(
            n
            for n in lin.SOURCES[family]
            if ", float," in n and any(lin.FRAG_STRUCTS[f][0] + "," in n for f in fmts)
        )
    original, plan0, stages0, chunk0 = loader.source_text, lin.gemv_plan, geo._GV_STAGES, geo._GV_CHUNK
    cluster0, w8_0, w8one_0 = lin.GV_CLUSTER, lin.GV_W8, lin.GV_W8_ONE
    ceiling = copy_bandwidth(1 << 30, 10)
    print(f"copy ceiling (read + write): {ceiling / 1e9:.0f} GB/s; us and fraction of copy per case")
    rng = np.random.default_rng(0)
    for fmt in fmts:
        weights = {}
        for name, shape in shapes.items():
            w0 = _random_weight(fmt, shape)
            weights[name] = [w0] + [_random_weight(fmt, shape) for _ in range(_copies(w0.data.nbytes) - 1)]
        for v in a.variants.split(","):
            loader.source_text = _source(original, v)
            loader.load_module.cache_clear()
            geo._GV_STAGES = 3 if v == "stages3" else stages0
            geo._GV_CHUNK = 4 if v == "chunk4n" else chunk0
            lin.GV_W8 = v in ("w8", "w8one")
            lin.GV_W8_ONE = frozenset(fmts) if v == "w8one" else w8one_0
            lin._GV_PDL = v != "nopdl" and not v.startswith("dir=")
            lin.GV_CLUSTER = "graph" if v in ("cluster", "cl8") else "off"
            lin.gemv_plan = _plan(lin, plan0.__wrapped__, v)
            cells = []
            for name, (n, k) in shapes.items():
                moved = weights[name][0].data.nbytes
                ws = weights[name]
                for b in rows:
                    x = cupy.asarray(rng.standard_normal((b, k)).astype(np.float32))
                    out = cupy.empty((b, n), dtype=np.float32)
                    t = graph_seconds([_call(lin, x, w, out, _next(ws, i, v)) for i, w in enumerate(ws)], 10)
                    frac = (moved + x.nbytes + out.nbytes) / t / ceiling
                    cells.append(f"{name} x{b} {t * 1e6:.1f} {frac:.2f}")
            if not a.small and not a.no_chain:
                cells += _chain(lin, fmt, v, rows, ceiling, rng)
            e = _experts(fmt, 10, ceiling, rng, gemv_experts)
            cells.append(f"moe x8 {e['us']:.1f} {e['of_copy']:.2f}")
            print(f"{fmt} {v:8s} | " + " | ".join(cells), flush=True)
            print(f"{fmt} {v:8s} | resident blocks per SM: {_occupancy(lin, fmt)}", flush=True)
            if lin.GV_CLUSTER != "off":
                print(
                    f"{fmt} {v:8s} | clusters at once / in the grid: {_clusters(lin, fmt, shapes)}",
                    flush=True,
                )
        del weights
        cupy.get_default_memory_pool().free_all_blocks()
    loader.source_text, lin.gemv_plan, geo._GV_STAGES, geo._GV_CHUNK = original, plan0, stages0, chunk0
    lin.GV_W8, lin.GV_W8_ONE = w8_0, w8one_0
    lin.GV_CLUSTER = cluster0
    loader.load_module.cache_clear()


if __name__ == "__main__":
    main()
