"""GDN chunked prefill on the GPU: ``gdn_chunked`` (two passes, cuda_src/gdn_chunk.cu; the state pass with 16 and
with 32 value columns per block, and the size ``state_cols`` picks) beside its one-pass variant
(``variant="serial"``, gdn.cu) and optionally the exact ``gdn_recurrent``, at the Qwen3.6 GDN shapes (35B-A3B: 16
key / 32 value heads, 27B: 16 / 48, dk = dv = 128) for one 8192-token sequence and 8 sequences of 1024 tokens.
Times are CUDA-event medians over a few launches after a warm-up (each launch continues the state: the cost does
not depend on the values); the two chunked variants' outputs are compared too (max error / max |ref|).

    python -m perf.bench_gdn [--out DIR] [--act float|bf16] [--state float|bf16] [--recurrent] [--reps 5]

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


def bench_gdn(
    model: str, lens: list[int], act: str = "float", state_dtype: str = "float", reps: int = 5,
    recurrent: bool = False, d: int = 128,
) -> dict[str, Any]:  # fmt: skip
    """Milliseconds per ``gdn_chunked`` call of each variant on fresh random inputs of the packed sequences."""
    import cupy

    from ninfer.cuda.gdn import _sm_count, chunk_scratch_bytes, gdn_chunked, gdn_recurrent, state_cols
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
    runs = [("cols16", dict(cols=16)), ("cols32", dict(cols=32)), ("serial", dict(variant="serial"))]
    for name, kw in runs + ([("recurrent", {})] if recurrent else []):
        fn = gdn_chunked if kw else gdn_recurrent
        state = cupy.asarray(bf16_encode(s0) if st_t == np.uint16 else s0)
        o = cupy.empty((t, hv * d), dtype=qkv.dtype)
        fn(qkv, a, b, a_log, dt_bias, state.copy(), starts, slots, n_k_heads=hk, out=o, **kw)
        outs[name] = cupy.asnumpy(o).astype(np.float32) if act == "float" else None
        fig[f"{name}_ms"] = 1e3 * event_seconds(
            lambda fn=fn, kw=kw, state=state, o=o: fn(qkv, a, b, a_log, dt_bias, state, starts, slots,
                                                      n_k_heads=hk, out=o, **kw), reps)  # fmt: skip
    for name in ("cols16", "cols32"):  # the two launches of one call, each between its own events
        split = _split_ms(lambda c=int(name[4:]): gdn_chunked(qkv, a, b, a_log, dt_bias, state, starts, slots,
                                                             n_k_heads=hk, out=o, cols=c))  # fmt: skip
        fig[f"{name}_prep_ms"], fig[f"{name}_state_ms"] = split
    auto = state_cols(len(lens), hv, d, _sm_count(cupy.cuda.Device().id))
    fig["auto_cols"], fig["two_pass_ms"] = auto, fig[f"cols{auto}_ms"]
    # 16 or 32 columns per state-pass block: the same bits; against the one-pass kernel: fp32 noise
    if act == "float":
        ref = outs["serial"]
        fig["cols_bitwise_equal"] = bool(np.array_equal(outs["cols16"], outs["cols32"]))
        fig["two_pass_vs_serial"] = float(
            np.max(np.abs(outs["cols16"] - ref)) / max(np.max(np.abs(ref)), 1e-30)
        )
    fig["speedup"] = fig["serial_ms"] / fig["two_pass_ms"]
    return fig


def _split_ms(call: Any) -> tuple[float, float]:
    """Milliseconds of gdn_chunk_prep and gdn_chunk_state in one ``call()`` (median of 3): ``_launch_smem`` wrapped
    with CUDA events."""
    import statistics

    import cupy

    import ninfer.cuda.gdn as gdn

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
    return statistics.median(ms[0::2]), statistics.median(ms[1::2])


def main(
    out: str | None = None, act: str = "float", state: str = "float", reps: int = 5, recurrent: bool = False
) -> dict[str, Any]:
    res: dict[str, Any] = {"runs": []}
    for model in SHAPES:
        for batch, lens in BATCHES.items():
            r = bench_gdn(model, lens, act, state, reps, recurrent)
            r["batch"] = batch
            res["runs"].append(r)
            rec = f"  recurrent {r['recurrent_ms']:8.3f} ms" if recurrent else ""
            err = (f"  |two_pass-serial| {r['two_pass_vs_serial']:.1e} 16≡32 {r['cols_bitwise_equal']}"
                   if "two_pass_vs_serial" in r else "")  # fmt: skip
            print(f"gdn_chunked {model} hk={r['hk']} hv={r['hv']} {batch:7s} act={act} state={state}: two_pass "
                  f"{r['two_pass_ms']:7.3f} ms (cols16 {r['cols16_ms']:7.3f}, cols32 {r['cols32_ms']:7.3f}, auto "
                  f"{r['auto_cols']}; prep {r['cols16_prep_ms']:.3f} + state {r['cols16_state_ms']:.3f} / "
                  f"{r['cols32_state_ms']:.3f})  serial {r['serial_ms']:7.3f} ms  (x{r['speedup']:.2f}){rec}{err}  "
                  f"scratch {r['scratch_mb']:.0f} MB", flush=True)  # fmt: skip
    if out:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "bench_gdn.json").write_text(json.dumps(res, indent=1))
        print(f"wrote {path / 'bench_gdn.json'}")
    else:
        print(json.dumps(res))
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for bench_gdn.json")
    ap.add_argument("--act", default="float", choices=("float", "bf16"))
    ap.add_argument("--state", default="float", choices=("float", "bf16"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--recurrent", action="store_true", help="also time the exact token-by-token kernel")
    a = ap.parse_args()
    main(a.out, a.act, a.state, a.reps, a.recurrent)
