#!/usr/bin/env bash
# One device run of the CUDA model: compile every kernel family, the model/graph/engine GPU tests against the
# reference, then `ninfer-perf --quick` (27B and 35B-A3B at nvfp4). Everything lands under $OUT (7 files: the device tool returns at most 8).
# Usage (repository root, on the device, .whl-cuda carried): COMMIT=<id> bash perf/device_model.sh [perf args]
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
for need in "pytest:pytest pluggy iniconfig packaging pygments" "msgspec:msgspec"; do
  mod=${need%%:*}
  python3 -c "import $mod" 2>/dev/null && continue
  whls=$(for w in ${need#*:}; do ls .whl-cuda/$w-*.whl; done)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-$mod $whls \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site-$mod
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/compile.txt"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" \
  | tee -a "$OUT/compile.txt"
python3 -c "
import time; t = time.perf_counter()
from ninfer.cuda import warmup; print('compiled', sum(warmup().values()), 'instances in', round(time.perf_counter() - t, 1), 's')
" 2>&1 | tee -a "$OUT/compile.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  NINFER_GPU_REPORT_MODEL=$OUT/model_report.json timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu \
    tests/test_cuda_model.py -p no:cacheprovider --timeout 150 \
    ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest.txt" | tail -40
fi
timeout ${PERF_TIMEOUT:-300} python3 -m perf.cli --quick --out "$OUT/results" --commit "${COMMIT:-unknown}" "$@" \
  2>&1 | tee "$OUT/perf.txt"
tail -3 "$OUT/pytest.txt" 2>/dev/null
