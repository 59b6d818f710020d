#!/usr/bin/env bash
# One device run of the CUDA kernel checks: compile every family (timed), run the GPU tests against the NumPy
# reference, time a few decode/prefill kernels against the copy and cuBLAS ceilings, print a short table last.
# Installs nothing the machine has: only pytest (+deps) and msgspec from .whl-cuda/ where the image lacks them.
# Usage (repository root, on the device): bash perf/device_check.sh   (writes under $OUT, default ./out)
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# each missing module gets its own wheels, appended after the image's paths
for need in "pytest:pytest pluggy iniconfig packaging pygments" "msgspec:msgspec"; do
  mod=${need%%:*}
  python3 -c "import $mod" 2>/dev/null && continue
  whls=$(for w in ${need#*:}; do ls .whl-cuda/$w-*.whl; done)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-$mod $whls \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site-$mod
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PY' 2>&1 | tee "$OUT/compile.txt"
import time, cupy
from ninfer.cuda import all_sources
from ninfer.cuda.loader import load_module
print("cupy", cupy.__version__, "cc", cupy.cuda.Device().compute_capability)
for src, inst in all_sources().items():
    t = time.perf_counter()
    try:
        load_module(src, inst)
        print(f"compile {src:14s} {len(inst):3d} instances {time.perf_counter() - t:6.1f} s")
    except Exception as e:  # keep going: the tests report the failing family in detail
        print(f"compile {src:14s} FAILED: {str(e)[-2000:]}")
PY
NINFER_GPU_REPORT=$OUT/gpu_report.json timeout 420 python3 -m pytest -q -m gpu tests/test_cuda_ops.py \
  -p no:cacheprovider --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/pytest.txt" | tail -60
python3 - <<'PY' 2>&1 | tee "$OUT/bench.txt"
# Kernel timings against ceilings re-measured in the same run (hardware.md: ratios, not absolute times).
import cupy as cp, numpy as np
from ninfer.cuda.linear import gemv, gemm
from ninfer.cuda.weights import upload_weight
from ninfer.formats import FORMATS

def timeit(fn, n=20):
    fn(); cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record(); [fn() for _ in range(n)]; e.record(); e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) / n * 1e-3

a = cp.empty(2 << 30, dtype=cp.uint8); b = cp.empty_like(a)
bw = 2 * a.nbytes / timeit(lambda: b.__setitem__(Ellipsis, a), 10)
del a, b
x = cp.random.standard_normal((8192, 8192), dtype=cp.float32).astype(cp.float16)
fl = 2 * 8192**3 / timeit(lambda: x @ x, 5)
print(f"ceiling copy {bw/1e12:.2f} TB/s   cuBLAS fp16 8192^3 {fl/1e12:.0f} TFLOP/s")
rng = np.random.default_rng(0)
n, k = 8192, 5120  # 27B-like rows (half of gate/up)
w32 = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
for fmt in ("BF16", "NVFP4G16_E4M3S", "Q4G64_F16S", "Q5G64_F16S", "W8G32_F16S", "FP8E4M3_F32ROW"):
    w = upload_weight(fmt, (n, k), FORMATS[fmt].encode(w32, (n, k)))
    for rows in (1, 8):
        xv = cp.random.standard_normal((rows, k), dtype=cp.float32)
        t = timeit(lambda: gemv(xv, w))
        print(f"gemv {fmt:15s} rows={rows} {n}x{k}: {t*1e6:8.1f} us  {w.data.nbytes/t/1e12:5.2f} TB/s = {w.data.nbytes/t/bw:5.1%} of copy")
    xm = cp.random.standard_normal((2048, k), dtype=cp.float32)
    t = timeit(lambda: gemm(xm, w), 5)
    print(f"gemm {fmt:15s} 2048x{n}x{k}: {t*1e3:7.2f} ms  {2*2048*n*k/t/1e12:6.1f} TFLOP/s = {2*2048*n*k/t/fl:5.1%} of cuBLAS")
PY
python3 - "$OUT/gpu_report.json" <<'PY'
import collections, json, sys
try:
    rows = json.load(open(sys.argv[1]))
except OSError:
    sys.exit("no report: the tests did not run")
fam = collections.defaultdict(lambda: [0, 0, 0.0])
for r in rows:
    f = fam[r["case"].split()[0]]
    f[0] += 1; f[1] += not r["ok"]
    f[2] = max(f[2], r["err"] / r["tol"] if r["tol"] else (0.0 if r["err"] == 0 else float("inf")))
print(f"{'family':16s} {'checks':>6s} {'fail':>5s} {'max err/tol':>12s}")
for k, (n, bad, worst) in sorted(fam.items()):
    print(f"{k:16s} {n:6d} {bad:5d} {worst:12.3g}")
PY
tail -3 "$OUT/pytest.txt"
