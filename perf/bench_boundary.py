"""What a dependent kernel boundary costs on this GPU, apart from any kernel's own work (GPU)::

    python -m perf.bench_boundary [--links 256] [--grids 1,132,528] [--splits 1,4] [--wkb 0,32]

A decode step is a chain of dependent kernels replayed as one CUDA graph (27B: 342, 35B-A3B: 335 at c14cc9e), and
the 35B-A3B's ~9 us per kernel is mostly latency (docs/cuda.md, "Where it stands"). This measures the floor of one
link of such a chain with a stand-in kernel whose work is the decode GEMV's dependence pattern and nothing else:
every block reads the whole previous output (``--n`` floats, 8 KB: an activation row) and writes its 128 outputs;
with ``splits`` > 1 the blocks of a row group are K splits that store partials, and the last to arrive on a
counter adds them (the GEMV's split sum); with ``wkb`` > 0 every block also streams that many KB of independent
"weights" (a 1 GiB pool, so device memory, not the L2), issued before the dependence is resolved and consumed after
it, as the GEMV's weight ring is. Each link is timed as graph replay time / links. Modes:

- ``plain``: launched without PDL (stream order: the next kernel starts after this one completes);
- ``pdl``: PDL, every kernel triggers its dependents at entry and calls ``griddepcontrol.wait`` before reading
  the previous output (the decode kernels' scheme, common.cuh ``pdl_trigger`` / ``pdl_wait``);
- ``flag``: PDL without ``griddepcontrol.wait``: every block of a link arrives on the link's counter (release,
  after its stores), and the next link's blocks spin on it (acquire) until all blocks arrived; the next link's
  blocks reset it after passing (docs/cuda.md, "waiting for the producer's outputs, not its grid");
- ``nowait``: PDL with no wait at all (wrong results: the launch overlap's own floor);
- ``persist``: the links as phases of one launch of resident blocks, a grid barrier (a counter per phase: one
  release per block, then a spin until all arrived) where the kernel boundary was, and the next phase's
  independent bytes issued before the barrier: what a persistent decode kernel's boundary would cost (grids of
  at most one wave).

Per link: us, and what that floor would be over a whole decode step's kernel count. A timing experiment: nothing
here feeds a result.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

__all__ = ["main"]

_MODES = {
    "plain": (False, 0),
    "pdl": (True, 0),
    "flag": (True, 1),
    "nowait": (True, 2),
    "persist": (False, 0),
}
_POOL = 1 << 30  # bytes of independent "weights": ~20x the L2

_SRC = r"""
// one phase's work: every output of this block depends on the whole previous output x (n floats) and on the
// independent bytes h; with splits > 1 the last of a row group's split blocks adds their partials in split order
__device__ __forceinline__ void phase(const float* __restrict__ x, float* __restrict__ y, int n,
                                      float* __restrict__ part, unsigned* __restrict__ splitcnt, int splits,
                                      unsigned h, float* red, int* last) {
    const int tid = threadIdx.x, r = blockIdx.x / splits, s = blockIdx.x % splits;
    const int per = (n + splits - 1) / splits, lo = s * per, hi = min(n, lo + per);
    float acc = (float)(h & 1u);
    for (int i = lo + tid; i < hi; i += 128) acc += x[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((tid & 31) == 0) red[tid >> 5] = acc;
    __syncthreads();
    const float v = (red[0] + red[1] + red[2] + red[3]) * 1e-3f + (float)(r * 128 + tid);
    if (splits == 1) {
        y[r * 128 + tid] = v;
        return;
    }
    part[(long long)blockIdx.x * 128 + tid] = v;
    __threadfence();
    __syncthreads();
    if (tid == 0) *last = atomicAdd(splitcnt + r, 1u) == (unsigned)splits - 1;
    __syncthreads();
    if (*last) {
        __threadfence();
        float sum = 0.f;
        for (int q = 0; q < splits; ++q) sum += part[((long long)r * splits + q) * 128 + tid];
        y[r * 128 + tid] = sum;
        if (tid == 0) splitcnt[r] = 0u;
    }
}

__device__ __forceinline__ void load_w(uint4 (&wr)[16], const uint4* __restrict__ wb, int wvec) {
#pragma unroll
    for (int i = 0; i < 16; ++i) wr[i] = i < wvec ? wb[i * 128 + threadIdx.x] : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ unsigned fold_w(const uint4 (&wr)[16]) {
    unsigned h = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) h ^= wr[i].x ^ wr[i].y ^ wr[i].z ^ wr[i].w;
    return h;
}

__device__ __forceinline__ void spin_until(const unsigned* c, unsigned need) {
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
    } while (v < need);
}

extern "C" __global__ void __launch_bounds__(128)
link(const float* __restrict__ x, float* __restrict__ y, int n, float* __restrict__ part,
     unsigned* __restrict__ splitcnt, int splits, unsigned* cin, unsigned need, unsigned* cout,
     unsigned* used, const uint4* __restrict__ w, int wvec, int mode) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    __shared__ float red[4];
    __shared__ int last;
    const int tid = threadIdx.x;
    uint4 wr[16];  // independent bytes first (the GEMV's weight ring): at most 16 uint4 per thread in flight
    load_w(wr, w + (long long)blockIdx.x * wvec * 128, wvec);
    if (mode == 0) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (mode == 1 && cin != nullptr) {
        if (tid == 0) spin_until(cin, need);
        __syncthreads();
    }
    phase(x, y, n, part, splitcnt, splits, fold_w(wr), red, &last);
    if (mode == 1) {  // as cooperative groups' grid barrier: the block's stores, then one release by thread 0
        __syncthreads();
        if (tid == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(cout) : "memory");
            // off the critical path: the last of this link's blocks to get here resets the producer's counter for
            // the next replay (every block of this link has passed its spin; the producer has no block left)
            if (cin != nullptr && atomicAdd(used, 1u) == gridDim.x - 1) {
                *cin = 0u;
                *used = 0u;
            }
        }
    }
}

// The same links as phases of one persistent launch (every block resident: grid <= one wave): a grid barrier
// (one release per block on the phase's counter, then a spin until all arrived) where a kernel boundary was; the
// next phase's independent bytes are issued before the barrier. The last block to exit resets the counters.
extern "C" __global__ void __launch_bounds__(128)
persist(float* bufs, long long stride, int n, float* __restrict__ part, unsigned* __restrict__ splitcnt,
        int splits, unsigned* bar, unsigned* exitcnt, const uint4* __restrict__ w, long long wstride, long long wmod,
        int wvec, int links) {
    __shared__ float red[4];
    __shared__ int last;
    const int tid = threadIdx.x;
    uint4 wr[16];
    load_w(wr, w + (long long)blockIdx.x * wvec * 128, wvec);
    for (int k = 0; k < links; ++k) {
        if (k > 0) {
            __syncthreads();
            if (tid == 0) {
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar + k - 1) : "memory");
                spin_until(bar + k - 1, gridDim.x);
            }
            __syncthreads();
        }
        const unsigned h = fold_w(wr);
        if (k + 1 < links) load_w(wr, w + ((k + 1) * wstride) % wmod + (long long)blockIdx.x * wvec * 128, wvec);
        phase(bufs + k * stride, bufs + (k + 1) * stride, n, part, splitcnt, splits, h, red, &last);
    }
    __syncthreads();
    if (tid == 0 && atomicAdd(exitcnt, 1u) == gridDim.x - 1) {
        for (int k = 0; k + 1 < links; ++k) bar[k] = 0u;
        *exitcnt = 0u;
    }
}
"""


def _resident(fn: Any) -> int:
    """Blocks of 128 threads of ``fn`` the device holds at once (cuOccupancyMaxActiveBlocksPerMultiprocessor x SMs)."""
    import ctypes

    import cupy

    from ninfer.cuda.launch import _lib

    occ = _lib().cuOccupancyMaxActiveBlocksPerMultiprocessor
    occ.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    n = ctypes.c_int(0)
    if occ(ctypes.byref(n), getattr(fn, "kernel", fn).ptr, 128, 0) != 0:
        return 0
    return n.value * cupy.cuda.Device().attributes["MultiProcessorCount"]


def _case(
    mod: Any, pool: Any, mode: str, grid: int, splits: int, wkb: int, links: int, n: int, reps: int
) -> float:
    """Microseconds per link of a ``links``-kernel chain replayed as one graph."""
    import cupy

    from ninfer.cuda.launch import launch_ex

    from .bench_peers import graph_seconds

    pdl, m = _MODES[mode]
    fn = mod.get_function("persist" if mode == "persist" else "link")
    rows = max(grid // splits, 1)
    size = max(rows * 128, n)
    flat = cupy.zeros((links + 1) * size, np.float32)  # link k reads buffer k, writes buffer k + 1
    bufs = [flat[k * size : (k + 1) * size] for k in range(links + 1)]
    part = cupy.zeros(grid * 128, np.float32)
    splitcnt = cupy.zeros(rows, np.uint32)
    cnt = cupy.zeros(links + 1, np.uint32)
    used = cupy.zeros(links + 1, np.uint32)
    wvec = wkb * 1024 // (16 * 128)  # uint4 per thread
    if wvec > 16:
        raise ValueError("--wkb: at most 32 KB per block (16 uint4 per thread)")
    per_link = grid * wvec * 128
    nvec = _POOL // 16

    def call(k: int) -> None:
        off = (k * per_link) % max(nvec - per_link, 1)
        cin = cnt[k - 1 :] if k else None
        args = (
            bufs[k], bufs[k + 1], np.int32(n), part, splitcnt, np.int32(splits),
            cin if cin is not None else np.uint64(0), np.uint32(grid), cnt[k:], used[k:],
            pool[off * 4 :], np.int32(wvec), np.int32(m),
        )  # fmt: skip
        launch_ex(fn, (grid,), (128,), args, pdl=pdl)

    if mode == "persist":  # one launch; its time divided by the links it runs as phases
        if grid > _resident(fn):
            return float("nan")  # not all resident: the barrier would never complete
        exitcnt = cupy.zeros(1, np.uint32)
        args = (
            flat, np.int64(size), np.int32(n), part, splitcnt, np.int32(splits), cnt, exitcnt, pool,
            np.int64(per_link), np.int64(max(nvec - per_link, 1)), np.int32(wvec), np.int32(links),
        )  # fmt: skip
        return graph_seconds([lambda: launch_ex(fn, (grid,), (128,), args)], reps) * 1e6 / links
    fns = [lambda k=k: call(k) for k in range(links)]
    return graph_seconds(fns, reps) * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", type=int, default=256)
    ap.add_argument("--grids", default="1,132,528", help="blocks per link")
    ap.add_argument("--splits", default="1,4", help="K splits per row group (the split sum's counter)")
    ap.add_argument("--wkb", default="0,32", help="KB of independent weights per block (at most 32)")
    ap.add_argument("--modes", default=",".join(_MODES))
    ap.add_argument("--n", type=int, default=2048, help="floats of the previous output every block reads")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    mod = cupy.RawModule(code=_SRC, options=("-std=c++17",))
    pool = cupy.zeros(_POOL // 4, np.uint32)  # the independent "weights", shared by every case
    modes = a.modes.split(",")
    print(f"{name}: us per link of a {a.links}-kernel graph (x335 = a 35B-A3B decode step's kernel count)")
    print(f"{'grid':>5} {'splits':>6} {'wkb':>4} " + " ".join(f"{m:>8}" for m in modes) + "   x335 (ms)")
    rows = []
    for g in (int(v) for v in a.grids.split(",")):
        for s in (int(v) for v in a.splits.split(",")):
            if s > g:
                continue
            for wkb in (int(v) for v in a.wkb.split(",")):
                us = {m: _case(mod, pool, m, g, s, wkb, a.links, a.n, a.reps) for m in modes}
                rows.append({"grid": g, "splits": s, "wkb": wkb, **us})
                floor = " ".join(f"{us[m] * 335e-3:.2f}" for m in modes)
                print(f"{g:>5} {s:>6} {wkb:>4} " + " ".join(f"{us[m]:8.2f}" for m in modes) + f"   {floor}",
                      flush=True)  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "links": a.links, "n": a.n, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
