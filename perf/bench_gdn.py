"""GDN prefill kernels on the GPU: ``gdn_chunked`` against the exact ``gdn_recurrent`` on one fresh sequence of
T tokens (Qwen3.6 shapes: HV=48 value heads, HK=16 key heads, dk=dv=128). Times are CUDA-event medians over a few
launches after a warm-up (each launch continues the state: the cost does not depend on the values).

    python -m perf.bench_gdn            # prints one line per T, returns the figures from bench_gdn()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bench_peers import event_seconds

__all__ = ["bench_gdn"]


def bench_gdn(
    lengths: tuple[int, ...] = (1024, 8192),
    hv: int = 48,
    hk: int = 16,
    d: int = 128,
    act: str = "bf16",
    state_dtype: str = "fp32",
    reps: int = 3,
) -> dict[str, Any]:
    """Seconds per launch of both kernels at each length, and the speed-up of the chunked one."""
    import cupy

    from ninfer.cuda.gdn import gdn_chunked, gdn_recurrent
    from ninfer.formats import bf16_encode

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"hv": hv, "hk": hk, "d": d, "act": act, "state": state_dtype, "runs": []}

    def dev(x: np.ndarray) -> Any:
        return cupy.asarray(bf16_encode(x) if act == "bf16" else x)

    for t in lengths:
        qkv = dev(rng.standard_normal((t, 2 * hk * d + hv * d), dtype=np.float32))
        a, b = (
            dev(rng.standard_normal((t, hv), dtype=np.float32)),
            dev(rng.standard_normal((t, hv), dtype=np.float32)),
        )
        a_log = cupy.asarray(rng.uniform(-2, 1, hv).astype(np.float32))
        dt_bias = cupy.asarray(rng.uniform(-1, 1, hv).astype(np.float32))
        st_t = np.float32 if state_dtype == "fp32" else np.uint16
        state = cupy.zeros((1, hv, d, d), dtype=st_t)
        starts, slots = cupy.asarray(np.array([0, t], np.int32)), cupy.zeros(1, np.int32)
        o = cupy.empty((t, hv * d), dtype=qkv.dtype)
        args = (qkv, a, b, a_log, dt_bias, state, starts, slots)
        fig = {"T": t}
        for name, fn in (("chunked_s", gdn_chunked), ("recurrent_s", gdn_recurrent)):
            fig[name] = event_seconds(lambda fn=fn, args=args, o=o: fn(*args, n_k_heads=hk, out=o), reps)
        fig["speedup"] = fig["recurrent_s"] / fig["chunked_s"]
        out["runs"].append(fig)
    line = "  ".join(
        f"T={r['T']}: chunked {r['chunked_s'] * 1e3:.3f} ms, recurrent {r['recurrent_s'] * 1e3:.3f} ms "
        f"(x{r['speedup']:.1f})"
        for r in out["runs"]
    )
    print(f"gdn hv={hv} hk={hk} d={d} act={act} state={state_dtype}  {line}")
    return out


if __name__ == "__main__":
    bench_gdn()
