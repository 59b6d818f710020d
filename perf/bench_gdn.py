"""GDN chunked prefill on the GPU: ``gdn_chunked`` (two passes, cuda_src/gdn_chunk.cu) in each variant
(``variant="mma"``: both passes' products as 3xTF32 mma.sync, ``"tc"``: the same with the prep's solve on tensor
cores, ``"tcs"``: "tc" with each chunk's W and Q rows staged in shared memory, ``"tc8"``: "tc" with 8 warps per
state-pass block, ``"split"``: "tc" with the state pass split in two, ``"wsp"`` / ``"wspq"``: "tc" with the walk and
the outputs on two warp groups,
``"fp32"``: on fp32 FMAs; each with 16 and with 32
value columns per state-pass block, and the size ``state_cols`` picks) beside the one-pass variant
(``variant="serial"``, gdn.cu) and optionally the exact ``gdn_recurrent``, at the Qwen3.6 GDN shapes (35B-A3B: 16
key / 32 value heads, 27B: 16 / 48, dk = dv = 128) for one 8192-token sequence and 8 sequences of 1024 tokens.
Times are CUDA-event medians over a few launches after a warm-up (each launch continues the state: the cost does
not depend on the values), with each two-pass call split into its prep and state launches; the variants' outputs
are compared too (max error / max |ref|). Also the causal conv fused into the tc prep (``gdn_chunked(conv=...)``):
its prep launch against ``causal_conv`` + the tc prep, and whether it gives the separate conv's bits.

    python -m perf.bench_gdn [--out DIR] [--act float|bf16] [--state float|bf16] [--recurrent] [--reps 5]
        [--models 27b,35b] [--batches 1x8192,8x1024] [--variants tc,tcs,wsp,...,serial]

prints one line per (model, batch) and writes ``bench_gdn.json`` under DIR (default: stdout only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .bench_peers import event_seconds

__all__ = ["bench_gdn", "main"]

SHAPES = {"35b": (16, 32), "27b": (16, 48)}  # (key heads, value heads), dk = dv = 128
BATCHES = {"1x8192": [8192], "8x1024": [1024] * 8}
# gdn_chunked's two-pass variants (ninfer.cuda.gdn.STATE_VARIANTS)
VARIANTS = ("tc", "tcs", "tc8", "split", "mma", "fp32", "wsp", "wspq", "wsp2", "wspb")


def bench_gdn(
    model: str, lens: list[int], act: str = "float", state_dtype: str = "float", reps: int = 5,
    recurrent: bool = False, d: int = 128, variants: tuple[str, ...] = (*VARIANTS, "serial"),
) -> dict[str, Any]:  # fmt: skip
    """Milliseconds per ``gdn_chunked`` call of each variant on fresh random inputs of the packed sequences
    (``variants``: those of VARIANTS and "serial" to run; every one not the default compiles on first use)."""
    import cupy

    from ninfer.cuda._common import sm_count
    from ninfer.cuda.gdn import chunk_scratch_bytes, gdn_chunked, gdn_recurrent, state_cols
    from ninfer.formats import bf16_encode

    hk, hv = SHAPES[model]
    rng = np.random.default_rng(0)
    t = sum(lens)

    def dev(x: np.ndarray) -> Any:
        return cupy.asarray(bf16_encode(x) if act == "bf16" else x)

    qkv = dev(rng.standard_normal((t, 2 * hk * d + hv * d), dtype=np.float32))
    a, b = (
        dev(rng.standard_normal((t, hv), dtype=np.float32)),
        dev(rng.standard_normal((t, hv), dtype=np.float32)),
    )
    a_log = cupy.asarray(rng.uniform(-2, 1, hv).astype(np.float32))
    dt_bias = cupy.asarray(rng.uniform(-1, 1, hv).astype(np.float32))
    st_t = np.float32 if state_dtype == "float" else np.uint16
    s0 = (rng.standard_normal((len(lens), hv, d, d)) * 0.1).astype(np.float32)
    starts = cupy.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    slots = cupy.arange(len(lens), dtype=np.int32)
    fig: dict[str, Any] = {"model": model, "hk": hk, "hv": hv, "d": d, "lens": lens, "act": act,
                           "state": state_dtype, "scratch_mb": chunk_scratch_bytes(t, hk, hv, d, d) / 2**20}  # fmt: skip
    outs = {}
    two = tuple(v for v in VARIANTS if v in variants)
    runs = [(f"{v}{c}", dict(variant=v, cols=c)) for v in two for c in (16, 32)]
    runs += [("serial", dict(variant="serial"))] if "serial" in variants else []
    for name, kw in runs + ([("recurrent", {})] if recurrent else []):
        fn = gdn_chunked if kw else gdn_recurrent
        state = cupy.asarray(bf16_encode(s0) if st_t == np.uint16 else s0)
        o = cupy.empty((t, hv * d), dtype=qkv.dtype)
        fn(qkv, a, b, a_log, dt_bias, state.copy(), starts, slots, n_k_heads=hk, out=o, **kw)
        outs[name] = cupy.asnumpy(o).astype(np.float32) if act == "float" else None
        fig[f"{name}_ms"] = 1e3 * event_seconds(
            lambda fn=fn, kw=kw, state=state, o=o: fn(qkv, a, b, a_log, dt_bias, state, starts, slots,
                                                      n_k_heads=hk, out=o, **kw), reps)  # fmt: skip
    for name, kw in runs[: 2 * len(two)]:  # the two launches of one call, each between its own events
        split = _split_ms(lambda kw=kw: gdn_chunked(qkv, a, b, a_log, dt_bias, state, starts, slots,
                                                    n_k_heads=hk, out=o, **kw))  # fmt: skip
        fig[f"{name}_prep_ms"], fig[f"{name}_state_ms"] = split
    auto = state_cols(len(lens), hv, d, sm_count(cupy.cuda.Device().id))
    fig["auto_cols"] = auto
    for v in two:
        fig[f"{v}_ms"] = fig[f"{v}{auto}_ms"]
    # 16 or 32 columns per state-pass block: the same bits; against the one-pass kernel: fp32 noise
    if act == "float" and "serial" in outs:
        ref = outs["serial"]
        for v in two:
            fig[f"{v}_cols_bitwise_equal"] = bool(np.array_equal(outs[f"{v}16"], outs[f"{v}32"]))
            fig[f"{v}_vs_serial"] = _rel(outs[f"{v}16"], ref)
    if act == "float" and "tc" in two:  # the state passes after the tc prep: the tc variant's bits
        for v in ("split", "tc8", "tcs", "wsp", "wspq"):
            if v in two:
                fig[f"{v}_eq_tc"] = all(np.array_equal(outs[f"{v}{c}"], outs[f"tc{c}"]) for c in (16, 32))
    # "wsp2" has its own rounding: how far from tc's bits (wsp's, which are tc's, where tc did not run), and 16 / 32
    # columns still the same bits
    base = "tc" if "tc" in two else "wsp"
    if act == "float" and "wsp2" in two and base in two:
        fig["wsp2_vs_tc"] = _rel(outs["wsp232"], outs[f"{base}32"])
        fig["wsp2_cols_bitwise_equal"] = bool(np.array_equal(outs["wsp216"], outs["wsp232"]))
    # "wspb" (the bf16 scratch): how far from the float scratch's outputs, 16 / 32 columns the same bits
    if act == "float" and "wspb" in two and base in two:
        fig["wspb_vs_tc"] = _rel(outs["wspb32"], outs[f"{base}32"])
        fig["wspb_cols_bitwise_equal"] = bool(np.array_equal(outs["wspb16"], outs["wspb32"]))
    if "tcs" not in two:
        return fig
    # the causal conv fused into the tc prep (gdn_chunked(conv=...), the model's prefill): its prep launch against
    # causal_conv's launch plus the tc prep's, and the same bits as causal_conv then gdn_chunked ("tcs")
    from ninfer.cuda.gdn import causal_conv

    c = qkv.shape[1]
    conv_w = cupy.asarray((rng.standard_normal((c, 4)) * 0.5).astype(np.float32))
    conv0 = cupy.asarray(rng.standard_normal((len(lens), c, 3)).astype(np.float32))
    y = cupy.empty_like(qkv)
    cw = conv0.copy()  # timed calls carry it on (the cost does not depend on the values)
    fig["conv_ms"] = 1e3 * event_seconds(lambda: causal_conv(qkv, conv_w, cw, starts, slots, y), reps)
    fused = {}
    for on in (False, True):
        state, cst = cupy.asarray(bf16_encode(s0) if st_t == np.uint16 else s0), conv0.copy()
        o = cupy.empty((t, hv * d), dtype=qkv.dtype)
        kw = dict(variant="tcs", out=o, n_k_heads=hk)
        if on:
            gdn_chunked(qkv, a, b, a_log, dt_bias, state, starts, slots, conv=(conv_w, cst), **kw)
        else:
            gdn_chunked(
                causal_conv(qkv, conv_w, cst, starts, slots), a, b, a_log, dt_bias, state, starts, slots, **kw
            )
        fused[on] = [cupy.asnumpy(x).tobytes() for x in (o, state, cst)]
    fig["conv_fused_bitwise_equal"] = fused[False] == fused[True]
    fig["tcs_conv_prep_ms"], _ = _split_ms(lambda: gdn_chunked(qkv, a, b, a_log, dt_bias, state, starts, slots,
                                                               n_k_heads=hk, out=o, variant="tcs",
                                                               conv=(conv_w, cw)))  # fmt: skip
    if {"serial", "mma", "tc", "fp32"} <= set(variants):
        fig["speedup"] = fig["serial_ms"] / fig["mma_ms"]
        fig["tc_prep_speedup"] = fig["mma16_prep_ms"] / fig["tc16_prep_ms"]
        fig["state_speedup"] = fig[f"fp32{auto}_state_ms"] / fig[f"mma{auto}_state_ms"]
    return fig


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|."""
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _split_ms(call: Any) -> tuple[float, float]:
    """Milliseconds of gdn_chunk_prep and of the state pass (its launches summed: the "split" variant has two) in
    one ``call()`` (median of 3): ``_launch_smem`` wrapped with CUDA events."""
    import statistics

    import cupy

    import ninfer.cuda.gdn_chunk as gdn  # gdn_chunked's module: its launches go through its _launch_smem

    orig, times = gdn._launch_smem, []

    def timed(*args: Any) -> None:
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        orig(*args)
        e.record()
        times.append((s, e))

    gdn._launch_smem = timed
    try:
        for _ in range(3):
            call()
    finally:
        gdn._launch_smem = orig
    cupy.cuda.Device().synchronize()
    ms = [cupy.cuda.get_elapsed_time(s, e) for s, e in times]
    per = len(ms) // 3
    calls = [ms[i * per : (i + 1) * per] for i in range(3)]
    return statistics.median(c[0] for c in calls), statistics.median(sum(c[1:]) for c in calls)


def main(
    out: str | None = None, act: str = "float", state: str = "float", reps: int = 5, recurrent: bool = False,
    models: tuple[str, ...] = tuple(SHAPES), batches: tuple[str, ...] = tuple(BATCHES),
    variants: tuple[str, ...] = (*VARIANTS, "serial"),
) -> dict[str, Any]:  # fmt: skip
    res: dict[str, Any] = {"runs": []}
    for model in models:
        for batch in batches:
            r = bench_gdn(model, _lens(batch), act, state, reps, recurrent, variants=variants)
            r["batch"] = batch
            res["runs"].append(r)
            print(_line(r, act, state), flush=True)
    if out:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "bench_gdn.json").write_text(json.dumps(res, indent=1))
        print(f"wrote {path / 'bench_gdn.json'}")
    else:
        print(json.dumps(res))
    return res


def _lens(batch: str) -> list[int]:
    """``"NxL"``: N sequences of L tokens each (e.g. ``1x4096``, a default prefill chunk)."""
    if batch in BATCHES:
        return BATCHES[batch]
    n, _, length = batch.partition("x")
    return [int(length)] * int(n)


def _line(r: dict[str, Any], act: str, state: str) -> str:
    """One run as a line: per state pass the call (at the auto column count), its prep and state launches at 16 / 32
    columns and the checks that ran (errors against the serial kernel, bits against the tc variant), then the
    serial kernel and the conv-fused prep where they ran."""
    parts = []
    for v in VARIANTS:
        if f"{v}_ms" not in r:
            continue
        err = (
            f", vs serial {r[f'{v}_vs_serial']:.1e} 16≡32 {r[f'{v}_cols_bitwise_equal']}"
            if f"{v}_vs_serial" in r
            else ""
        )
        eq = f", ≡tc {r[f'{v}_eq_tc']}" if f"{v}_eq_tc" in r else ""
        if f"{v}_vs_tc" in r:
            eq += f", vs tc {r[f'{v}_vs_tc']:.1e} 16≡32 {r[f'{v}_cols_bitwise_equal']}"
        parts.append(
            f"{v} {r[f'{v}_ms']:7.3f} ms (prep {r[f'{v}16_prep_ms']:.3f}, state {r[f'{v}16_state_ms']:.3f} / "
            f"{r[f'{v}32_state_ms']:.3f}{err}{eq})"
        )
    if "serial_ms" in r:
        parts.append(f"serial {r['serial_ms']:7.3f} ms")
    if "speedup" in r:
        parts.append(f"(mma x{r['speedup']:.2f}; state pass mma x{r['state_speedup']:.2f})")
    if "recurrent_ms" in r:
        parts.append(f"recurrent {r['recurrent_ms']:8.3f} ms")
    if "tcs_conv_prep_ms" in r:
        parts.append(f"conv {r['conv_ms']:.3f} + tc prep {r['tcs32_prep_ms']:.3f} ms -> fused prep "
                     f"{r['tcs_conv_prep_ms']:.3f} (bitwise {r['conv_fused_bitwise_equal']})")  # fmt: skip
    return (f"gdn_chunked {r['model']} hk={r['hk']} hv={r['hv']} {r['batch']:7s} act={act} state={state} auto cols "
            f"{r['auto_cols']} scratch {r['scratch_mb']:.0f} MB: " + "  ".join(parts))  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for bench_gdn.json")
    ap.add_argument("--act", default="float", choices=("float", "bf16"))
    ap.add_argument("--state", default="float", choices=("float", "bf16"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--recurrent", action="store_true", help="also time the exact token-by-token kernel")
    ap.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument(
        "--batches", default=",".join(BATCHES), help="comma-separated NxL (N sequences of L tokens)"
    )
    ap.add_argument(
        "--variants", default=",".join((*VARIANTS, "serial")), help="comma-separated, of the defaults' (all)"
    )
    a = ap.parse_args()
    main(a.out, a.act, a.state, a.reps, a.recurrent, tuple(a.models.split(",")), tuple(a.batches.split(",")),
         tuple(a.variants.split(",")))  # fmt: skip
