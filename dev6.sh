COMMIT=wip TEST_FILES="tests/test_cuda_experts_swiglu.py tests/test_cuda_gemm_f16.py tests/test_cuda_gemm_swiglu.py" TEST_TIMEOUT=400 bash perf/device_run.sh tests > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20
rm -f $OUT/cupy-cache.tgz.part-* $OUT/compile.txt
export PYTHONPATH=$PWD:$PWD/tests:/tmp/site-msgspec:/tmp/site-pytest CUPY_CACHE_DIR=$PWD/.cupy-cache PYTHONUNBUFFERED=1
python3 -m perf.profile_step --model 35b --chunk 4096 --timeline > $OUT/timeline_35b.txt 2>&1; grep -E "timeline:|experts|split_f16row" $OUT/timeline_35b.txt | head -12
cat > /tmp/ab.py <<'PY'
import sys, runpy
import ninfer.cuda.experts_swiglu as es
if sys.argv[1] == "off":
    es.experts_swiglu_ok = lambda *a, **k: False
sys.argv = ["perf.cli", "--quick", "--no-transformers", "--models", "35b", "--prefill", "8192", "--lanes", "", "--out", "/tmp/r_" + sys.argv[1]]
runpy.run_module("perf.cli", run_name="__main__")
PY
for m in on off on off; do echo "== $m"; python3 /tmp/ab.py $m 2>&1 | grep -E ": prefill [0-9]+:"; done
