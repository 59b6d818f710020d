#!/usr/bin/env bash
# A device session's phases (run several in one call, each call under the tool's 10-minute limit); everything is
# written under $OUT:
#   tests   compile every kernel family (timed), then every GPU-marked test (tests/test_cuda_*.py: kernels vs the
#           NumPy reference, the CUDA model vs reference/transformers, the engine on CUDA)
#   bench   the kernel micro-benchmarks and the per-kernel profile (perf/bench_*.py, perf/profile_step.py)
#   perf    `ninfer-perf --quick` (27B and 35B-A3B at nvfp4, transformers column)
#   serving perf/bench_serving.py --backend cuda (stack cost) and the live-server tests on the CUDA backend
#   spec    perf/bench_spec.py at forced acceptance (27B, 1 lane, k = 3)
#   gdn_bounds  perf/bench_gdn_decode.py with the GDN decode counter kernel's minimum resident blocks per SM at 1
#           (before c14cc9e), 4 (as built) and 5 (an experiment on the device's copy of the source)
#   prefill_profile  perf/profile_step.py on a default prefill chunk (4096) and on a 256-token follow-up after 8K
#   ab      the decode switches built without a GPU: GPU tests, then all their whole-step A/Bs (both models)
#   decode_probe  issue 13's open questions after c14cc9e: GDN decode at 5-8 sequences (bounds, two launches), the
#           MoE fusions' step profile, the decode GEMV boundary trace
#   bulk    the NVFP4 decode GEMV's weight ring by bulk copies (GV_BULK): GPU test and per-shape A/B
#   verify  the GPU tests of the MoE combine's batched loads, the gate | up GEMV's SwiGLU epilogue and the
#           router's routing tail (~6 min); verify_ab their whole-step A/Bs and the fused MoE switches' (~8 min)
#   next    the follow-up turn's timeline (host-bound?), both decode steps' GEMV launches
#           traced (perf/gemv_trace.py --model), the 35B-A3B step profile and the MoE combine A/B after the combine's
#           batched loads (~7 min); next_tests the GPU tests of what session 27 changed (~8 min)
#   probe   issue 13's open measurements in one call (~8 min): the dependent-kernel boundary's floor per scheme
#           (perf/bench_boundary.py: PDL wait, counter flag, persistent phases), the bulk ring's GPU test and
#           per-shape A/B, and the 27B decode step's GEMV launches traced (perf/gemv_trace.py)
#   moe     the decode MoE fusions' GPU tests and whole-step A/Bs (35B-A3B), with the L2 hints
#   boundary  the decode GEMV launch boundary traced (perf/gemv_trace.py), the start-of-block L2 hints A/B and the
#           8-lane activation traffic (gemv_variants actl1, w8)
#   w8      the 5-8-lane GEMVs on 8-warp blocks (linear.GV_W8): GPU tests, per-shape and whole-step A/B
#   explore the open experiments (docs/cuda.md): the decode GEMVs' L2 prefetch (per shape, a 27B layer chain, the
#           whole decode step), and the 35B-A3B prefill against its chunk size and the GDN state pass
#   gdn_probe  perf/bench_gdn at a 4096-token chunk (27B, 35B-A3B) and Nsight Compute on the prep and state launches
#   attn_probe Nsight Compute on one wgmma prefill-attention launch (27B heads, 8K prompt)
#   gemv_probe Nsight Compute's stall reasons on the decode GEMV (27B gate|up) per format (GEMV_PROBE_FORMATS, NVFP4 by
#           default) and activation rows (GEMV_PROBE_ROWS, 1 and 8)
#   gdn_pick  perf/bench_gdn, then `ninfer-perf --quick` with the fastest GDN variant of "tc", "tc8" and "split"
#   diag    the prefill chunk's kernel timeline (profile_step --timeline: busy / idle GPU time, CuPy's glue kernels
#           included; 27B and 35B-A3B at 4096 tokens, 35B-A3B's 256-token follow-up) and Nsight Compute's stall
#           reasons per issued instruction for the GDN state pass (27B heads, 4096 rows)
#   compile every kernel family compiled (the first part of tests), e.g. before phases that time kernels
#   gdnp    the GDN decode's persistent clusters (gdn_step_clp): GPU tests, per-call and whole-step A/Bs; the
#           35B-A3B's prefill at 4096- against 8192-token chunks
#   ws      the warp-specialized prefill attention (attention_ws.cu): GPU tests, perf/bench_attention with its options;
#           ws_ab the whole-model prefill with it off / on
#   wsp     the GDN state pass on two warp groups ("wsp", "wspq"): GPU tests, bench_gdn against tc / tcs, the
#           whole-model prefill per variant
#   wsp_probe  Nsight Compute on one "wsp" GDN state launch (35B-A3B heads, 8192 rows)
#   wspb    the bf16 GDN scratch ("wspb"): GPU tests, bench_gdn against wsp, the whole-model prefill per variant
#   gab     a prefill GEMM candidate tree (AB_TREE, default .ab/g192) against this one: its GEMM GPU tests, bench_gemm
#   group_sol  Nsight's speed-of-light / memory sections of the group GEMM beside NVFP4's (L2 bandwidth bound?)
#   shard   one third (SHARD=0/3, 1/3, 2/3) of the whole GPU suite per call (perf/pytest_shard.py)
#   group_probe  Nsight Compute's stall reasons on the group-int fp16 GEMM (Q4G64, kept operands) beside NVFP4's ws
#           GEMM, 27B shapes at 8192 rows (~3 min)
#   group_source  Nsight's source page (stall samples per SASS line) of the group GEMM beside NVFP4's ws GEMM
#   group   the group formats' and BF16's fp16 prefill GEMMs (gemm90_f16_wsg, gemm_bf16.py): their GPU tests and
#           the ws kernel's, then perf/bench_gemm's f16g / f16gk / f16gd (Q4, W8; f16gd the deferred scaling,
#           gemm_plan.GROUP_DEFER) and f16bk (BF16) against the exact kernels and cuBLAS (~3 min warm)
#   xlane   a decode GEMV A/B against another tree (AB_TREE, default .ab/xlane: `git archive qg64-xlane`, carried):
#           its GEMV GPU tests, then perf/bench_gemv from both trees (AB_FORMATS) in the same call
#   w8one   the one-lane dense GEMVs on gemv_w8.cu's 8-warp blocks (linear.GV_W8_ONE, off until measured): its GPU
#           test, then perf/gemv_variants w8 against w8one at one lane (GEMV_FORMATS; ~3 min)
#   gv_xlane  the decode GEMV's cross-lane copies (wfrag.cuh GV_QG64_XLANE, a mask, 5 since session 41;
#           GV_W8G32_XLANE, off): their GPU test cases, then perf/gemv_variants base against xl5, xl7 (Q5, Q6) and
#           w8x (W8G32) at 1 and 8 rows (~4 min)
#   swz     the group-int decode GEMV's bank-placed shared slots (wfrag.cuh GV_QG64_SWZ) and W8G32's I2F-free
#           code conversion (GV_W8G32_FCVT): GPU tests, then
#           perf/gemv_variants base against swz and swz7 (with GV_QG64_XLANE 7: the scale words shared too; Q4, Q5,
#           Q6), now8f against base (W8G32: GV_W8G32_FCVT, on since session 41), at 1 and 8 rows (~4 min)
#   q4hv    Q4G64's 5-vector stage (wfrag.cuh GV_Q4_HV 0, 4 blocks per SM): its GPU tests, then gemv_variants q4hv2
#           (the 7-vector stage) against base at 1 and 8 rows (~3 min)
#   qg      the group-int decode GEMV's remaining candidate of session 42, off: the group partials scaled after
#           the next tile's first products (gemv_products.cuh GV_GROUP_DEFER; measured 0.99-1.02x Q4-Q6, 0.78x
#           W8G32 at e2ac007): GPU tests, then gemv_variants base against defer (the tiled scales, "tsc" there,
#           are the device layout since session 43)
#   setup   the installs only
#   replicas  perf/bench_replicas.py sessions: two synthetic 27B replicas vs one (needs two GPUs; issue 20)
# e.g. `bash perf/device_run.sh tests bench`
# Installs only what the image lacks (pytest and msgspec wheels from .whl-cuda/, the API stack from .whl/, both
# carried by the caller).
# CuPy's kernel cache travels between calls: .cupy-cache.tgz (carried, if present) is unpacked first and the cache
# is packed again into $OUT/cupy-cache.tgz.part-* at the end (15 MiB parts: the tool returns files of at most
# 16 MiB), which saves the cold NVRTC compile (~70 s for the 347 instances at 4eb6bda) next time.
# pytest runs through pytest_for (below).
# Env: COMMIT (recorded with the results; pass it from the machine holding the repository: a copied checkout's
# git may report a stale HEAD), PYTEST_K (-k filter), PYTEST_ARGS (more pytest options), TEST_FILES (default
# tests/test_cuda_*.py), SKIP_COMPILE (tests: no timed compile first), SKIP_TESTS (w8one, gv_xlane: the timings
# only), TEST_TIMEOUT, PERF_TIMEOUT, BENCHES, PERF_ARGS, NO_CACHE_BACK (below), XDIST (tests: pytest -n XDIST, the
# test processes side by side on the one GPU: the suite's time is mostly host work, NVRTC and NumPy references;
# needs pytest_xdist and execnet wheels in .whl-cuda: `pip download --no-deps pytest-xdist execnet`).
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy-cache
# (.cupy-cache.txz: the same packed with xz here, a third the size, where the carry's 64 MiB would not hold the tgz)
for c in .cupy-cache.tgz .cupy-cache.txz; do [ -f $c ] && tar xf $c; done
# xdist (pytest-xdist, execnet: XDIST=N runs the tests in N processes on the one GPU) where .whl-cuda has it
for need in "pytest:pytest pluggy iniconfig packaging pygments pytest_timeout" "msgspec:msgspec" \
  "xdist:pytest_xdist execnet"; do
  mod=${need%%:*}
  [ "$mod" = xdist ] && ! ls .whl-cuda/pytest_xdist-*.whl >/dev/null 2>&1 && continue
  python3 -c "import $mod" 2>/dev/null && continue
  whls=$(for w in ${need#*:}; do ls .whl-cuda/$w-*.whl; done)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-$mod $whls \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site-$mod
done
# The API stack the image lacks (ray, litestar, uvicorn, xgrammar, ...: the device tooling's wheel script prepares
# .whl/, carried by the caller), for the live-server and serving runs.
# WHL_DIR: where they are (default .whl; a copy without the test-only faker/polyfactory lets it travel beside the
# kernel cache within one call's carry).
WHL_DIR=${WHL_DIR:-.whl}
if ls $WHL_DIR/*.whl >/dev/null 2>&1; then  # once per machine: later calls find the installed copy
  [ -d /tmp/site-api ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site-api $WHL_DIR/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/site-api
fi
# The official SDKs the live-server tests drive (openai, anthropic and their few wheels: .whl-sdk/, carried by the
# caller: `pip download --no-deps --only-binary=:all: --python-version 3.12 ... openai anthropic jiter distro
# docstring-parser httpx2 httpcore2 truststore opentelemetry-api anyio idna h11 importlib-metadata zipp typing_extensions`).
if ls .whl-sdk/*.whl >/dev/null 2>&1; then
  export PYTHONPATH=$PYTHONPATH:/tmp/site-sdk
  python3 -c "import openai, anthropic" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site-sdk .whl-sdk/*.whl
fi
# The package's other top-level folders under their import names (pyproject's package-dir: ninfer.api is api/,
# ...), as the editable install maps them, for the server processes started from this copy.
python3 -c "import ninfer.api" 2>/dev/null || for d in api actors perf cuda_src; do
  [ -e ninfer/$d ] || ln -s ../$d ninfer/$d
done
pytest_for() {  # pytest_for SECONDS ARGS...: pytest interrupted at its limit (so that it prints what ran, which -q
  # alone would not), killed 30 s later
  local limit=$1; shift
  timeout -s INT -k 30 "$limit" python3 -m pytest "$@"
}
run_setup() { :; }  # the installs above only (for the caller's own commands after it)
run_serving() {  # issue 12: the stack's cost on this GPU, then the live-server tests on the CUDA backend
  timeout ${SERVING_TIMEOUT:-240} python3 -m perf.bench_serving --backend cuda --rounds ${SERVING_ROUNDS:-5} \
    -o "$OUT/bench_serving_cuda.json" 2>&1 | tee "$OUT/serving.txt" | tail -4
  NINFER_LIVE_BACKEND=cuda pytest_for ${LIVE_TIMEOUT:-300} -q -p no:cacheprovider -rf \
    tests/test_api_live.py tests/test_protocols_live.py tests/test_contract_live.py 2>&1 | tee "$OUT/live.txt" | tail -15
}
run_compile() {  # every kernel family compiled (timed) into the CuPy cache that travels back
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import transformers, torch, cupy; print('transformers', transformers.__version__, 'torch', torch.__version__, 'cupy', cupy.__version__)"
    python3 -c "
import time; t = time.perf_counter()
from ninfer.cuda import warmup; print('compiled', sum(warmup(workers=12).values()), 'instances in', round(time.perf_counter() - t, 1), 's')"
  } 2>&1 | tee "$OUT/compile.txt"
}
run_tests() {
  [ -n "${SKIP_COMPILE:-}" ] || run_compile
  NINFER_GPU_REPORT=$OUT/gpu_report.json NINFER_GPU_REPORT_MODEL=$OUT/model_report.json \
    pytest_for ${TEST_TIMEOUT:-480} -q -m gpu ${TEST_FILES:-tests/test_cuda_*.py} -p no:cacheprovider \
    --timeout 200 -rf --durations=30 --continue-on-collection-errors ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} \
    ${XDIST:+-n $XDIST} \
    2>&1 | tee "$OUT/pytest.txt" | grep -v PASSED | tail -40
}
run_bench() {
  for b in ${BENCHES:-profile_step bench_gemm bench_gemv bench_gdn bench_gdn_decode bench_attention bench_attention_decode}; do
    timeout ${BENCH_TIMEOUT:-300} python3 -m perf.$b 2>&1 | tee -a "$OUT/bench.txt" | tail -40
  done
}
run_profile() {  # per-kernel profile of one graph-replayed decode step (Nsight Compute), PROFILES="27b:1 35b:1";
  # PROFILE_SET="moe_route_fused=on ..." (profile_graph --set) and PROFILE_TAG (file name suffix) for a switch's profile
  # the table's "of copy" column against this GPU's copy bandwidth, measured here (profile_graph's default is
  # the H200's 4.28 TB/s: an H100's tables read 0.7x too low without it)
  local ncu copy; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  copy=$(python3 -c "from perf.bench_peers import copy_bandwidth; print(round(copy_bandwidth() / 1e12, 3))")
  for spec in ${PROFILES:-27b:1}; do
    local m=${spec%%:*} l=${spec#*:}
    timeout ${PROFILE_TIMEOUT:-200} "$ncu" --profile-from-start off --graph-profiling node --clock-control none \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
      --log-file "$OUT/ncu_${m}_x$l${PROFILE_TAG:-}.csv" python3 -m perf.profile_graph --model "$m" --lanes "$l" \
      $(for s in ${PROFILE_SET:-}; do echo --set $s; done) > /dev/null 2>&1
    python3 -m perf.profile_graph --summarize "$OUT/ncu_${m}_x$l${PROFILE_TAG:-}.csv" --copy-tbs "$copy" 2>&1 \
      | tee "$OUT/profile_${m}_x$l${PROFILE_TAG:-}.txt" | head -30
  done
}
run_perf() {
  timeout ${PERF_TIMEOUT:-540} python3 -m perf.cli --quick --out "$OUT/results" --commit "${COMMIT:-unknown}" \
    ${PERF_ARGS:-} 2>&1 | tee "$OUT/perf.txt"
}
run_replicas() {  # issue 20 (two GPUs: nvidia-h200-x2): 16 agent sessions x 5 turns, 2 replicas vs 1, synthetic 27B
  timeout ${REPLICAS_TIMEOUT:-560} python3 -m perf.bench_replicas sessions --synthetic qwen3.6-27b --profile nvfp4 \
    --backend cuda --replicas 2 --sessions 16 --turns 5 --max-tokens ${REPLICAS_MAX_TOKENS:-256} \
    --serve-flag=--max-context=16384 --serve-flag=--kv-capacity=262144 --out "$OUT/results" \
    ${REPLICAS_ARGS:-} 2>&1 | tee "$OUT/replicas.txt" | tail -20
}
run_explore() {  # each step under its own limit, its output kept even if a later one fails
  timeout ${EXPLORE_TIMEOUT:-200} python3 -m perf.gemv_variants --variants base,pf,pf8 --rows 1,8 2>&1 \
    | tee "$OUT/explore_gemv.txt" | tail -8
  timeout ${EXPLORE_TIMEOUT:-150} python3 -m perf.bench_fold --toggle prefetch --out "$OUT/results" 2>&1 \
    | tee "$OUT/explore_prefetch.txt" | tail -8
  timeout ${EXPLORE_TIMEOUT:-150} python3 -m perf.bench_chunk --model 35b --chunks 2048,4096,8192 --inputs fp16 \
    --gdn mma,fp32 --out "$OUT/results" 2>&1 | tee "$OUT/explore_chunk.txt" | tail -8
}
run_boundary() {  # issue 13: the decode GEMV launch boundary's parts (perf/gemv_trace.py: a 27B layer chain, then
  # both models' whole decode steps), then the L2 hints issued at each block's start (GV_PF_START) per shape and as
  # whole graph steps (bench_fold --toggle prefetch, both models)
  timeout ${BOUNDARY_TIMEOUT:-170} python3 -m perf.gemv_trace --rows 1,8 --layers 3 2>&1 | tee "$OUT/trace_chain.txt"
  for m in 35b 27b; do
    timeout ${BOUNDARY_TIMEOUT:-170} python3 -m perf.gemv_trace --model $m --rows 1,8 2>&1 | tee "$OUT/trace_$m.txt"
  done
  # actl1: what the 8-lane activations' L2 -> SM traffic costs (diagnostic, wrong results); w8: 256-row blocks
  # (the fix for it, timed before it is built)
  timeout ${VARIANTS_TIMEOUT:-260} python3 -m perf.gemv_variants --variants base,pf,pfend,actl1,w8 --rows 1,8 2>&1 \
    | tee "$OUT/boundary_gemv.txt" | tail -8
  timeout ${BOUNDARY_TIMEOUT:-170} python3 -m perf.bench_fold --toggle prefetch --out "$OUT/results" 2>&1 \
    | tee "$OUT/boundary_prefetch.txt" | tail -8
}
run_w8() {  # issue 13: the 5-8-lane GEMVs on 8-warp blocks (gemv_w8.cu, linear.GV_W8): the GPU tests, then the
  # per-shape A/B (gemv_variants base/w8/actl1 at 8 rows) and whole decode steps at 8 lanes (bench_fold --toggle w8)
  pytest_for ${W8_TIMEOUT:-300} -q -p no:cacheprovider -rf tests/test_cuda_gemv_w8.py \
    > "$OUT/w8_tests.txt" 2>&1; tail -3 "$OUT/w8_tests.txt"
  timeout ${W8_TIMEOUT:-260} python3 -m perf.gemv_variants --variants base,w8,actl1 --rows 1,8 2>&1 \
    | tee "$OUT/w8_gemv.txt" | tail -6
  timeout ${W8_TIMEOUT:-300} python3 -m perf.bench_fold --toggle w8 --model 27b,35b --lanes 8 --out "$OUT/results" \
    2>&1 | tee "$OUT/w8_step.txt" | grep -E "ms/step"
}
run_ab() {  # issue 13: the decode switches built without a GPU (MoE routing / combine fusions, start-of-block L2
  # hints, 8-warp 5-8-lane GEMVs): their GPU tests, then every A/B on one network per model (bench_fold --toggle a,b)
  pytest_for ${AB_TEST_TIMEOUT:-240} -q -p no:cacheprovider -rf --timeout 120 \
    tests/test_cuda_moe_fused.py tests/test_cuda_gemv_prefetch.py tests/test_cuda_gemv_w8.py > "$OUT/ab_tests.txt" 2>&1
  grep -E "passed|failed|error" "$OUT/ab_tests.txt" | tail -12
  timeout ${AB_TIMEOUT:-200} python3 -m perf.bench_fold --model 35b --toggle route,combine,moe,prefetch,w8 --steps 100 \
    2>&1 | tee "$OUT/ab_35b.txt" | grep -E "^\|"
  timeout ${AB_TIMEOUT:-160} python3 -m perf.bench_fold --model 27b --toggle prefetch,w8 --steps 100 2>&1 \
    | tee "$OUT/ab_27b.txt" | grep -E "^\|"
}
run_decode_probe() {  # issue 13's open questions after c14cc9e, in one call (~8 min): the GDN decode at 5-8
  # sequences (counter kernel at 1 / 4 / 5 resident blocks, and as two launches: bench_gdn_decode's mixer-2l), where
  # the MoE fusions lose (the 35B-A3B step's kernels with both on, beside the default's), and the decode GEMV launch
  # boundary traced (gemv_trace: block start, PDL wait, first products, store, exit)
  BENCH_TIMEOUT=100 run_gdn_bounds
  PROFILE_TIMEOUT=90 PROFILES="35b:1 35b:8" run_profile
  PROFILE_TIMEOUT=90 PROFILES="35b:1 35b:8" PROFILE_SET="moe_route_fused=on moe_combine_fused=on" PROFILE_TAG=_moe \
    run_profile
  rm -f "$OUT"/ncu_*.csv  # the summaries are enough (the tool returns at most 8 files)
  timeout ${BOUNDARY_TIMEOUT:-120} python3 -m perf.gemv_trace --model 27b --rows 1,8 2>&1 | tee "$OUT/trace_27b.txt" \
    | tail -30
}
run_next() {  # session 28's first call (~9 min): where a follow-up turn's time goes now (busy / idle and per kernel,
  # both models: is it host-bound?), the whole decode steps' GEMV launches traced (gemv_trace --model: act, prod,
  # store, tail per shape; 35B-A3B first), then the GPU tests of the wrappers split in session 27 (gdn, gemm_pair)
  timeout ${PROFILE_TIMEOUT:-150} python3 -m perf.profile_step --model 27b,35b --chunk 256 --prefill-at 8192 --timeline \
    2>&1 | tee "$OUT/timeline_followup.txt" | grep -v '^\[' | grep -E "timeline|prefill 256|^ +[0-9.]+ ms" | head -40
  for m in 35b 27b; do
    timeout ${TRACE_TIMEOUT:-150} python3 -m perf.gemv_trace --model $m --rows 1 2>&1 | tee "$OUT/trace_$m.txt" | tail -14
  done
  # the MoE combine's batched row loads (1b830c8): the standalone kernel's time in the step profile, and the fused
  # combine (which ran the same serial loads) against it again
  PROFILE_TIMEOUT=90 PROFILES="35b:1" run_profile
  rm -f "$OUT"/ncu_*.csv
  timeout ${MOE_TIMEOUT:-150} python3 -m perf.bench_fold --toggle combine,moe --model 35b --lanes 1,8 --steps 100 \
    --out "$OUT/results" 2>&1 | tee "$OUT/moe_ab.txt" | grep -E "^\|"
}
run_verify() {  # the next session's first call (~6 min): the GPU tests of the MoE combine's batched loads (the
  # default path's moe_combine_rmsnorm and the fused tail: bitwise the kernels they replace), of the gate | up GEMVs'
  # SwiGLU epilogue and of the router's routing tail (the new instances compile cold: ~60 more)
  TEST_TIMEOUT=${TEST_TIMEOUT:-240} TEST_FILES="tests/test_cuda_gemv_swiglu.py tests/test_cuda_route_tail.py \
tests/test_cuda_moe_fused.py tests/test_cuda_ops.py" \
    PYTEST_K=${PYTEST_K:-"swiglu or tail or combine or moe or rmsnorm or route or fused or eight"} run_tests
}
run_verify_ab() {  # the second call (~8 min): the epilogue's and the routing tail's whole-step A/Bs, and the MoE
  # fusions' again after the combine's batched loads (graph decode at 8K, ms per step off -> on)
  timeout ${SWIGLU_TIMEOUT:-240} python3 -m perf.bench_fold --toggle swiglu --model 27b,35b --lanes 1,8 --steps 100 \
    --out "$OUT/results" 2>&1 | tee "$OUT/swiglu_ab.txt" | grep -E "^\|"
  timeout ${RTAIL_TIMEOUT:-120} python3 -m perf.bench_fold --toggle rtail --model 35b --lanes 1,8 --steps 100 \
    --out "$OUT/results" 2>&1 | tee "$OUT/rtail_ab.txt" | grep -E "^\|"
  timeout ${MOE_TIMEOUT:-120} python3 -m perf.bench_fold --toggle combine,moe --model 35b --lanes 1,8 \
    --steps 100 --out "$OUT/results" 2>&1 | tee "$OUT/moe_ab.txt" | grep -E "^\|"
}
run_next_tests() {  # the second call: the GPU tests of what session 27 changed (the gdn / gemm_pair wrappers split,
  # the combine's loads: test_cuda_ops checks the fused combine + norm bitwise against the pair it replaces)
  TEST_TIMEOUT=${TEST_TIMEOUT:-420} TEST_FILES="tests/test_cuda_ops.py tests/test_cuda_gdn_decode.py \
tests/test_cuda_moe_fused.py tests/test_cuda_gemm_pair.py tests/test_cuda_gemm_ws.py tests/test_cuda_gemm_f16.py" run_tests
}
run_bulk() {  # issue 13: the NVFP4 decode GEMV's weight ring by bulk copies (cuda_src/gemv_bulk.cuh, linear.GV_BULK):
  # its GPU tests (same bits as the cp.async ring), the per-shape A/B at 1 and 8 rows (gemv_variants base/bulk/bulkef,
  # bulkef with an L2 evict-first hint), then whole graph decode steps (bench_fold --toggle bulk, both models)
  run_bulk_kernels
  timeout ${BULK_TIMEOUT:-240} python3 -m perf.bench_fold --toggle bulk --model 27b,35b --lanes 1,8 --steps 100 \
    --out "$OUT/results" 2>&1 | tee "$OUT/bulk_step.txt" | grep -E "^\|"
}
run_probe() {  # issue 13: what decides the next decode design (docs/cuda.md, "waiting for the producer's outputs")
  timeout ${PROBE_TIMEOUT:-120} python3 -m perf.bench_boundary --json "$OUT/bench_boundary.json" 2>&1 \
    | tee "$OUT/boundary.txt" | tail -14
  BULK_TIMEOUT=${BULK_TIMEOUT:-150} run_bulk_kernels
  timeout ${PROBE_TIMEOUT:-120} python3 -m perf.gemv_trace --model 27b --rows 1,8 2>&1 | tee "$OUT/trace_27b.txt" \
    | tail -30
}
run_bulk_kernels() {  # the bulk ring's GPU test and per-shape A/B (run_bulk's first two steps)
  pytest_for ${BULK_TIMEOUT:-200} -q -p no:cacheprovider -rf tests/test_cuda_gemv_bulk.py \
    > "$OUT/bulk_tests.txt" 2>&1; tail -3 "$OUT/bulk_tests.txt"
  timeout ${BULK_TIMEOUT:-240} python3 -m perf.gemv_variants --variants base,bulk,bulkef --rows 1,8 2>&1 \
    | tee "$OUT/bulk_gemv.txt" | tail -8
}
run_moe() {  # issue 13: the decode MoE fusions (routing in gate | up, combine + norm in the down launch) and the
  # start-of-block L2 hints: their GPU tests, then each as a whole-step A/B (bench_fold) on the 35B-A3B
  pytest_for ${MOE_TIMEOUT:-300} -q -p no:cacheprovider -rf tests/test_cuda_moe_fused.py \
    tests/test_cuda_gemv_prefetch.py > "$OUT/moe_tests.txt" 2>&1; tail -3 "$OUT/moe_tests.txt"
  for tg in route combine moe prefetch; do
    timeout ${MOE_TIMEOUT:-200} python3 -m perf.bench_fold --toggle $tg --model 35b --out "$OUT/results" 2>&1 \
      | tee "$OUT/moe_$tg.txt" | grep -E "ms/step"
  done
  timeout ${MOE_TIMEOUT:-200} python3 -m perf.cli --quick --no-transformers --models 35b --prefill '' --lanes 1,8 \
    --moe-fusions on --out "$OUT/moe_perf" --commit "${COMMIT:-unknown}" 2>&1 | tee "$OUT/moe_perf.txt" | grep "decode x"
}
run_prefill_profile() {  # issue 14: where a default 4096-token chunk's time goes, and a 256-token follow-up's
  timeout ${PROFILE_TIMEOUT:-200} python3 -m perf.profile_step --model 27b,35b --chunk 4096 2>&1 \
    | tee "$OUT/profile_prefill.txt" | tail -40
  timeout ${PROFILE_TIMEOUT:-200} python3 -m perf.profile_step --model 27b,35b --chunk 256 --prefill-at 8192 2>&1 \
    | tee "$OUT/profile_followup.txt" | tail -40
}
run_gdn_bounds() {  # the GDN decode counter kernel's resident blocks (gdn_step<., ., ., CONV=true>, 5-8 sequences a
  # call): perf.bench_gdn_decode with GDN_STEP_CONV_MIN_BLOCKS at 1 (the compiler's choice: 80 registers, 3 blocks
  # per SM, the kernel before c14cc9e), 4 (as built) and 5 (an experiment on the device's copy; nothing changes here)
  local f=cuda_src/gdn_step.cu; cp $f /tmp/gdn_step.cu.orig
  for mb in 1 4 5; do
    cp /tmp/gdn_step.cu.orig $f
    sed -i "s/^constexpr int GDN_STEP_CONV_MIN_BLOCKS = [0-9]*;/constexpr int GDN_STEP_CONV_MIN_BLOCKS = $mb;/" $f
    echo "## gdn_step CONV min blocks per SM: $mb" | tee -a "$OUT/gdn_bounds.txt"
    timeout ${BENCH_TIMEOUT:-120} python3 -m perf.bench_gdn_decode --reps 10 2>&1 | tee -a "$OUT/gdn_bounds.txt" | tail -12
  done
  cp /tmp/gdn_step.cu.orig $f
}
run_gdn_probe() {  # issue 14: the GDN chunked prefill's two passes at a default 4096-token chunk (bench_gdn), then
  # Nsight Compute on one prep and one state launch of the 27B shape (stall reasons, occupancy, memory)
  timeout ${BENCH_TIMEOUT:-200} python3 -m perf.bench_gdn --models 27b,35b --batches ${GDN_BATCHES:-1x4096} \
    --reps 5 2>&1 | grep -v '^{' | tee -a "$OUT/gdn_probe.txt"
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:gdn_chunk_(prep|state_mma)" --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
    python3 -m perf.bench_gdn --models 27b --batches 1x4096 --reps 1 2>&1 | grep -v '^{' | tee -a "$OUT/gdn_ncu.txt" | tail -5
}
run_attn_probe() {  # issue 14: Nsight Compute on one wgmma prefill-attention launch (27B heads, one 8K prompt):
  # stall reasons, issue, pipe and shared-memory use; what limits it at ~20% of the GEMM (docs/cuda.md)
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:attention_prefill_wg" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio \
    python3 -m perf.bench_attention --lengths 8192 --reps 1 2>&1 | tee -a "$OUT/attn_ncu.txt" | tail -5
}
run_gemv_probe() {  # issue 13: where the decode GEMV's time goes (27B gate|up): Nsight Compute's stall reasons per
  # issued instruction, issue activity, DRAM and shared-memory traffic per format (GEMV_PROBE_FORMATS, default NVFP4;
  # e.g. "Q4G64_F16S NVFP4G16_E4M3S": why Q4G64 reaches half NVFP4's bandwidth) and row count (GEMV_PROBE_ROWS);
  # the cp.async (LDGSTS) sectors and requests and the L2 sectors read against the DRAM bytes say
  # whether Q4G64's row-major scale plane (a 4-byte copy per row and tile, one 32-byte sector each) costs L2 traffic
  local ncu fmt rows; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for fmt in ${GEMV_PROBE_FORMATS:-NVFP4G16_E4M3S}; do for rows in ${GEMV_PROBE_ROWS:-1 8}; do
    echo "## $fmt rows $rows" | tee -a "$OUT/gemv_ncu.txt"
    timeout ${PROFILE_TIMEOUT:-200} "$ncu" --profile-from-start off --clock-control none \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum" \
      python3 -m perf.ncu_gemv --format $fmt --shape "mlp gate|up" --rows $rows 2>&1 | grep -v '^==PROF==' \
      | tee -a "$OUT/gemv_ncu.txt" | grep -v "  0$\|  0.0[0-9]$" | tail -40
  done; done
}
run_group_probe() {  # issue 14: Nsight Compute on one group-int fp16 GEMM launch (gemm90_f16_wsg, Q4G64, kept
  # operands) and one NVFP4 ws launch (gemm90_f16_ws, at 81-103% of cuBLAS) on the 27B's shapes at 8192 rows: stall
  # reasons, tensor-pipe activity, issue; why the group kernel stays near 60% of cuBLAS (docs/cuda.md)
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  local m="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
  for spec in "^gemm90_f16_wsg$:Q4G64_F16S:f16gk" "^gemm90_f16_ws$:NVFP4G16_E4M3S:f16ws"; do  # ncu matches base names
    IFS=: read -r kern fmt path <<< "$spec"
    echo "## $kern $fmt $path" | tee -a "$OUT/group_ncu.txt"
    timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:$kern" --launch-skip 2 --launch-count 2 \
      --clock-control none --metrics "$m" python3 -m perf.bench_gemm --formats $fmt --paths $path --rows 8192 \
      --reps 1 2>&1 | grep -v '^==PROF==' | tee -a "$OUT/group_ncu.txt" | grep -v "  0$\|  0.0[0-9]$" | tail -40
  done
}
run_group_source() {  # issue 14: where the group GEMM's warps stall, per SASS line (Nsight's source page, warp
  # stall sampling; perf/ncu_source.py's top lines): gemm90_f16_wsg (Q4G64 f16gk) beside NVFP4's gemm90_f16_ws, one
  # 8192-row launch of the 27B's shapes each; group_probe's `barrier` (2.09 per issue) names no instruction
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for spec in "gemm90_f16_wsg:Q4G64_F16S:f16gk" "gemm90_f16_ws:NVFP4G16_E4M3S:f16ws"; do
    IFS=: read -r kern fmt path <<< "$spec"
    timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:^$kern\$" --launch-skip 2 --launch-count 1 \
      --section SourceCounters --page source --print-source sass --csv \
      python3 -m perf.bench_gemm --formats $fmt --paths $path --rows 8192 --reps 1 > "$OUT/source_$kern.csv" 2>&1
    python3 -m perf.ncu_source "$OUT/source_$kern.csv" --column "Warp Stall Sampling (All Samples)" --top 40 2>&1 \
      | tee "$OUT/source_${kern}_top.txt" | head -44
    gzip -f "$OUT/source_$kern.csv"
  done
}
run_group_sol() {  # issue 14: whether the group GEMM (gemm90_f16_wsg, 128 x 128 tiles) is held by the L2's
  # bandwidth where NVFP4's (gemm90_f16_ws, 128 x 256) is not: Nsight Compute's speed-of-light and memory workload
  # sections of one 8192-row launch of each (27B shapes), text
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for spec in "gemm90_f16_wsg:Q4G64_F16S:f16gk" "gemm90_f16_ws:NVFP4G16_E4M3S:f16ws"; do
    IFS=: read -r kern fmt path <<< "$spec"
    timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:^$kern\$" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      python3 -m perf.bench_gemm --formats $fmt --paths $path --rows 8192 --reps 1 2>&1 \
      | grep -v "^==PROF==" | tee "$OUT/sol_$kern.txt" | grep -E "Throughput|Busy|Bandwidth|Hit Rate|Duration|Issue" | head -24
  done
}
run_group() {  # issue 14: the group-int formats' fp16 GEMM (ninfer/cuda/gemm_group.py) on the device, then measured
  pytest_for ${TEST_TIMEOUT:-300} -q -m gpu -p no:cacheprovider --timeout 200 -rf \
    tests/test_cuda_gemm_group.py tests/test_cuda_gemm_bf16.py tests/test_cuda_gemm_ws.py 2>&1 \
    | tee "$OUT/group_tests.txt" | grep -v PASSED | tail -20
  timeout ${BENCH_TIMEOUT:-360} python3 -m perf.bench_gemm --formats ${GROUP_FORMATS:-Q4G64_F16S,W8G32_F16S,BF16} \
    --paths bf16,fp32,pair,f16g,f16gk,f16gd,f16bk --rows ${GROUP_ROWS:-2048,8192} --out "$OUT" 2>&1 \
    | tee "$OUT/bench_gemm_group.txt" | tail -50
}
run_w8one() {  # issue 13: linear.GV_W8_ONE (one-lane products on 8-warp blocks: the same bits), test and timing
  [ -n "${SKIP_TESTS:-}" ] || pytest_for ${TEST_TIMEOUT:-200} -q -m gpu -p no:cacheprovider --timeout 200 -rf \
    tests/test_cuda_gemv_w8.py -k one_lane 2>&1 | tee "$OUT/w8one_tests.txt" | grep -v PASSED | tail -10
  timeout ${BENCH_TIMEOUT:-240} python3 -m perf.gemv_variants --variants w8,w8one --rows 1 --no-chain \
    --formats ${GEMV_FORMATS:-Q4G64_F16S,Q6G64_F16S,W8G32_F16S,NVFP4G16_E4M3S} 2>&1 | tee "$OUT/w8one.txt" | tail -12
}
gv_ab() {  # NAME K VARIANTS FORMATS: tests/test_cuda_gemv_xlane.py's cases matching -k K (none for K "" or with
  # SKIP_TESTS), then perf/gemv_variants VARIANTS on FORMATS at 1 and 8 rows; appended to $OUT/NAME{_tests,}.txt
  local name=$1 k=$2 variants=$3 formats=$4
  [ -z "$k" ] || [ -n "${SKIP_TESTS:-}" ] || pytest_for ${TEST_TIMEOUT:-200} -q -m gpu -p no:cacheprovider \
    --timeout 200 -rf tests/test_cuda_gemv_xlane.py -k "$k" 2>&1 | tee -a "$OUT/${name}_tests.txt" | grep -v PASSED \
    | tail -10
  timeout ${BENCH_TIMEOUT:-300} python3 -m perf.gemv_variants --variants "$variants" --rows 1,8 --formats "$formats" \
    2>&1 | tee -a "$OUT/$name.txt" | tail -12
}
run_gv_xlane() {  # issue 13: GV_QG64_XLANE (the group-int GEMV's cross-lane copies) and GV_W8G32_XLANE: GPU test, A/B
  gv_ab gv_xlane "XLANE" "${XLANE_VARIANTS:-base,xl5,xl7}" "${GEMV_FORMATS:-Q5G64_F16S,Q6G64_F16S}"
  gv_ab gv_xlane "" base,w8x W8G32_F16S
}
run_qg() {  # issue 13: GV_GROUP_DEFER (the group partials scaled after the next tile's first products): its GPU
  # test cases (bitwise the default build), then gemv_variants base against defer on Q4G64, Q5G64, Q6G64 and W8G32
  # at 1 and 8 rows
  gv_ab qg "DEFER" "${QG_VARIANTS:-base,defer}" \
    "${GEMV_FORMATS:-Q4G64_F16S,Q5G64_F16S,Q6G64_F16S,W8G32_F16S}"
}
run_swz() {  # issue 13: GV_QG64_SWZ (the group-int GEMV's slots placed for the banks) and GV_W8G32_FCVT: GPU test, A/B
  gv_ab swz "SWZ or FCVT" "${SWZ_VARIANTS:-base,swz,swz7}" "${GEMV_FORMATS:-Q4G64_F16S,Q5G64_F16S,Q6G64_F16S}"
  gv_ab swz "" now8f,base W8G32_F16S
}
run_q4hv() {  # issue 13: Q4G64's stage without its unused high-word vectors (GV_Q4_HV 0: 4 blocks per SM): the
  # GPU tests of the Q4 GEMV, then perf/gemv_variants q4hv2 (the 7-vector stage of before) against base
  gv_ab q4hv "${Q4HV_K:-Q4G64}" q4hv2,base Q4G64_F16S
}
run_gab() {  # issue 14: a prefill GEMM candidate in another tree (AB_TREE, default .ab/g192: the group formats'
  # 192-column tiles) against this tree's, same machine and call: its GPU tests, then perf.bench_gemm on both
  local tree=${AB_TREE:-.ab/g192} fmts=${AB_FORMATS:-Q4G64_F16S} paths=${AB_PATHS:-f16gk}
  for d in api actors perf cuda_src; do [ -e "$tree/ninfer/$d" ] || ln -s ../$d "$tree/ninfer/$d"; done
  (cd "$tree" && PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH#$OLDPWD:$OLDPWD/tests:} CUPY_CACHE_DIR=$OLDPWD/.cupy-cache \
    pytest_for ${TEST_TIMEOUT:-200} -q -m gpu -p no:cacheprovider --timeout 200 -rf \
    tests/test_cuda_gemm_group.py tests/test_cuda_gemm_ws.py 2>&1 | tee "$OUT/gab_tests.txt" | grep -v PASSED | tail -15
   timeout ${BENCH_TIMEOUT:-150} python3 -m perf.bench_gemm --formats $fmts --paths $paths --rows 2048,8192 2>&1 \
    | tee "$OUT/gab_bench_ab.txt" | tail -12)
  timeout ${BENCH_TIMEOUT:-150} python3 -m perf.bench_gemm --formats $fmts --paths $paths --rows 2048,8192 2>&1 \
    | tee "$OUT/gab_bench_base.txt" | tail -12
}
run_xlane() {  # issue 13: a decode GEMV candidate in another tree (AB_TREE) against this one, same machine and call
  local tree=${AB_TREE:-.ab/xlane} fmts=${AB_FORMATS:-Q4G64_F16S,NVFP4G16_E4M3S}
  for d in api actors perf cuda_src; do [ -e "$tree/ninfer/$d" ] || ln -s ../$d "$tree/ninfer/$d"; done
  (cd "$tree" && PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH#$OLDPWD:$OLDPWD/tests:} CUPY_CACHE_DIR=$PWD/.cupy-cache \
    pytest_for ${TEST_TIMEOUT:-300} -q -m gpu -p no:cacheprovider --timeout 200 -rf \
    tests/test_cuda_ops.py -k gemv 2>&1 | tee "$OUT/xlane_tests.txt" | grep -v PASSED | tail -15)
  timeout ${BENCH_TIMEOUT:-300} python3 -m perf.bench_gemv --formats $fmts --json "$OUT/bench_gemv_base.json" 2>&1 \
    | tee "$OUT/bench_gemv_base.txt" | tail -30
  (cd "$tree" && PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH#$OLDPWD:$OLDPWD/tests:} CUPY_CACHE_DIR=$PWD/.cupy-cache \
    timeout ${BENCH_TIMEOUT:-300} python3 -m perf.bench_gemv --formats $fmts --json "$OUT/bench_gemv_ab.json" 2>&1 \
    | tee "$OUT/bench_gemv_ab.txt" | tail -30)
}
run_diag() {  # issue 14: what a prefill chunk's GPU timeline holds besides the wrapped kernels, and why the GDN
  # state pass issues so little
  timeout ${PROFILE_TIMEOUT:-200} python3 -m perf.profile_step --model 27b,35b --chunk 4096 --timeline 2>&1 \
    | tee "$OUT/timeline_prefill.txt" | grep -v '^\[' | tail -70
  timeout ${PROFILE_TIMEOUT:-200} python3 -m perf.profile_step --model ${FOLLOWUP_MODELS:-35b} --chunk 256 --prefill-at 8192 --timeline \
    2>&1 | tee "$OUT/timeline_followup.txt" | grep -v '^\[' | tail -35
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:gdn_chunk_state_mma" --launch-count 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum" \
    ${GDN_NCU_ARGS:-} python3 -m perf.bench_gdn --models 27b --batches 1x4096 --reps 1 2>&1 | grep -v '^{' \
    | tee -a "$OUT/gdn_stalls.txt" | grep -v "  0$\|  0.0[0-9]$" | tail -40
}
run_gdn_pick() {  # bench_gdn at the 27B / 35B-A3B chunk shapes, then `ninfer-perf` with the fastest of the "tc",
  # "tc8" and "split" GDN variants (bitwise the same results; GDN_PICK_ARGS: ninfer-perf's other arguments)
  timeout ${BENCH_TIMEOUT:-200} python3 -m perf.bench_gdn --models 27b,35b --batches 1x4096,1x8192 --reps 5 \
    --out "$OUT" 2>&1 | grep -v '^{' | tee "$OUT/gdn_bench.txt"
  GDN_PICK=$(python3 -c "import json; r = json.load(open('$OUT/bench_gdn.json'))['runs']; \
print(min(('tc', 'tc8', 'split'), key=lambda v: sum(x[v + '32_ms'] for x in r)))" 2>/dev/null || echo tc)
  echo "gdn variant for perf: $GDN_PICK" | tee -a "$OUT/gdn_bench.txt"
  PERF_ARGS="--gdn-variant $GDN_PICK ${GDN_PICK_ARGS:-}" run_perf
}
run_gdnp() {  # the GDN decode's persistent clusters (gdn_step_clp): GPU tests, per-call A/B at 1 and 8 sequences,
  # whole-step A/B at 8 lanes; then the 35B-A3B's prefill at 4096- against 8192-token chunks (CHUNKS)
  TEST_FILES=tests/test_cuda_gdn_decode.py run_tests
  timeout ${BENCH_TIMEOUT:-120} python3 -m perf.bench_gdn_decode --reps 20 --json "$OUT/bench_gdn_decode.json" 2>&1 \
    | tee "$OUT/gdn_decode.txt" | grep -E "mixer|case" | tail -24
  timeout ${AB_TIMEOUT:-200} python3 -m perf.bench_fold --toggle gdnp --model 27b,35b --lanes 8 --steps 100 \
    --out "$OUT/results" 2>&1 | tee "$OUT/fold_gdnp.txt" | tail -8
  for c in ${CHUNKS:-4096 8192}; do
    timeout 120 python3 -m perf.cli --quick --models 35b --no-transformers --prefill 8192,32768 --lanes '' \
      --chunk $c --out "$OUT/chunk$c" 2>&1 | grep -E "prefill|follow" | tee -a "$OUT/chunk_ab.txt"
  done
}
run_ws() {  # the warp-specialized prefill attention (attention_ws.cu): its GPU tests with the others of the prefill
  # attention, then perf/bench_attention (wg / ws under each option, bitwise) at 2K-32K
  TEST_FILES=tests/test_cuda_attention_prefill.py run_tests
  timeout ${BENCH_TIMEOUT:-240} python3 -m perf.bench_attention --lengths ${WS_LENGTHS:-2048,8192,32768} \
    --out "$OUT/results" 2>&1 | tee "$OUT/bench_attention.txt" | tail -8
}
run_ws_ab() {  # whole-model prefill with the warp-specialized attention off / on (WS_MODES), both models
  for m in ${WS_MODES:-off on}; do
    timeout ${WS_AB_TIMEOUT:-150} python3 -m perf.cli --quick --no-transformers --prefill 8192,32768 --lanes '' \
      --attention-ws $m --out "$OUT/ws_$m" 2>&1 | grep -E "prefill|follow" | tee -a "$OUT/ws_ab.txt"
  done
}
gdn_variant_ab() {  # FILE LENGTHS VARIANT...: the whole-model prefill (ninfer-perf) per GDN variant into $OUT/FILE
  local file=$1 lens=$2 v; shift 2
  for v in "$@"; do
    timeout ${WS_AB_TIMEOUT:-150} python3 -m perf.cli --quick --no-transformers --prefill $lens --lanes '' \
      --gdn-variant $v --commit "${COMMIT:-unknown}" --out "$OUT/gdn_$v" 2>&1 | grep -E "prefill|follow" | tee -a "$OUT/$file"
  done
}
run_wsp() {  # the GDN state pass on two warp groups (gdn_state_wsp.cuh): its GPU tests (bitwise the tc variant's),
  # bench_gdn against tc / tcs at the 27B / 35B-A3B chunk shapes, then the whole-model prefill per variant (WSP_VARIANTS)
  TEST_FILES=tests/test_cuda_ops.py PYTEST_K=gdn_chunked run_tests
  timeout ${BENCH_TIMEOUT:-240} python3 -m perf.bench_gdn --models 27b,35b --batches ${GDN_BATCHES:-1x4096,1x8192} \
    --variants tc,tcs,wsp,wspq --out "$OUT/results" 2>&1 | grep -v '^{' | tee "$OUT/bench_gdn_wsp.txt" | tail -6
  gdn_variant_ab wsp_ab.txt 8192,32768 ${WSP_VARIANTS:-tcs wsp}
}
run_wspb() {  # session 35: the bf16 GDN scratch ("wspb", cuda_src/gdn_scratch.cuh): bench_gdn against wsp at the
  # 27B / 35B-A3B chunk shapes, its GPU tests, the whole-model prefill per variant (wsp, wspb; WSPB_PREFILL lengths)
  timeout ${BENCH_TIMEOUT:-200} python3 -m perf.bench_gdn --models 27b,35b --batches 1x4096,1x8192 \
    --variants wsp,wspb --out "$OUT/results" 2>&1 | grep -v '^{' | tee "$OUT/bench_gdn_wspb.txt" | tail -8
  pytest_for ${TEST_TIMEOUT:-240} -q -m gpu -p no:cacheprovider -rf --timeout 200 tests/test_cuda_ops.py \
    -k "gdn_chunked and wspb" > "$OUT/wspb_tests.txt" 2>&1; tail -3 "$OUT/wspb_tests.txt"
  gdn_variant_ab wspb_ab.txt ${WSPB_PREFILL:-8192,32768} ${WSP_VARIANTS:-wsp wspb}
}
run_wsp_probe() {  # Nsight Compute on one "wsp" state launch (35B-A3B heads, one 8192-row chunk): stall reasons,
  # scheduler issue and the source lines the warps stall on (both warp groups together)
  local ncu; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:gdn_chunk_state_wsp" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section SourceCounters --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 -m perf.bench_gdn --models 35b --batches 1x8192 --variants wsp --reps 1 2>&1 | grep -v '^{' \
    | tee "$OUT/wsp_ncu.txt" | tail -5
}
run_prefill_probe() {  # session 33's first call (~8 min): the two-chain GDN state pass (wsp2, never run on a GPU
  # before) against its reference and wsp, the served fp16 GEMM against cuBLAS at 2K-8K rows with forced splits
  # (bench_gemm --served), then the prefill chunks' kernels per cuda_src file with the launch-level attribution
  pytest_for ${TEST_TIMEOUT:-240} -q -m gpu -p no:cacheprovider -rf --timeout 200 tests/test_cuda_ops.py \
    -k "gdn and wsp2" > "$OUT/wsp2_tests.txt" 2>&1; tail -3 "$OUT/wsp2_tests.txt"
  timeout ${BENCH_TIMEOUT:-200} python3 -m perf.bench_gdn --models 27b,35b --batches 1x4096,1x8192 \
    --variants wsp,wsp2 --out "$OUT/results" 2>&1 | grep -v '^{' | tee "$OUT/bench_gdn_wsp2.txt" | tail -8
  timeout ${BENCH_TIMEOUT:-200} python3 -m perf.bench_gemm --served --rows 2048,4096,8192 --max-splits 3 \
    --out "$OUT/results" 2>&1 | tee "$OUT/bench_gemm_served.txt" | grep -E " auto " | head -20
  for spec in 27b:4096 35b:8192; do
    timeout ${PROFILE_TIMEOUT:-150} python3 -m perf.profile_step --model ${spec%%:*} --chunk ${spec#*:} 2>&1 \
      | tee "$OUT/profile_prefill_${spec%%:*}.txt" | tail -25
  done
}
# the whole GPU suite in two calls of under 10 minutes on one warm machine (the split of session 31's six calls)
SUITE_A="tests/test_cuda_ops.py tests/test_cuda_attention_prefill.py tests/test_cuda_gemm_f16.py tests/test_cuda_gemm_ws.py
  tests/test_cuda_gemm_pair.py tests/test_cuda_gemm_swiglu.py tests/test_cuda_compile.py tests/test_cuda_attention_decode.py
  tests/test_cuda_gdn_decode.py tests/test_cuda_operands.py tests/test_cuda_norm_f16.py tests/test_cuda_v1.py
  tests/test_cuda_tiering.py tests/test_cuda_warmup_host.py tests/test_cuda_kv_fp8.py tests/test_cuda_sampling.py
  tests/test_perplexity.py tests/test_launch_pdl.py"
run_suite_a() { TEST_TIMEOUT=${TEST_TIMEOUT:-500} TEST_FILES="$SUITE_A" run_tests; cp "$OUT/pytest.txt" "$OUT/suite_a.txt"; }
run_suite_changed() {  # the GPU test files whose kernels or wrappers changed since the last whole suite (e8ca7a3)
  TEST_TIMEOUT=${TEST_TIMEOUT:-400} TEST_FILES="tests/test_cuda_attention_prefill.py tests/test_cuda_gdn_decode.py
    tests/test_cuda_ops.py tests/test_cuda_sampling.py tests/test_cuda_gemm_ws.py tests/test_cuda_compile.py
    tests/test_launch_pdl.py" run_tests
}
run_suite_b() {  # every tests/test_cuda_*.py file not in SUITE_A
  local f files="" a=" $(echo $SUITE_A) "
  for f in tests/test_cuda_*.py; do case "$a" in *" $f "*) ;; *) files="$files $f" ;; esac; done
  pytest_for ${TEST_TIMEOUT:-500} -q -m gpu $files -p no:cacheprovider --timeout 200 -rf 2>&1 \
    | tee "$OUT/suite_b.txt" | grep -v PASSED | tail -30
}
run_shard() {  # one part of the whole GPU suite, SHARD=I/N (perf/pytest_shard.py: round robin over the selected
  # tests, so every part holds a share of each file): the suite ran ~13 min of pytest on an H100 at 0c06c77, so
  # N = 3 leaves each call ~4.5 min of tests beside the compile; its file is shard_IofN.txt
  TEST_FILES="tests/test_cuda_*.py tests/test_perplexity.py" PYTEST_ARGS="-p perf.pytest_shard --shard ${SHARD:?SHARD=I/N}" \
    run_tests
  cp "$OUT/pytest.txt" "$OUT/shard_${SHARD/\//of}.txt"
}
run_wsp_source() {  # where the chunked GDN's excess shared-memory wavefronts come from: Nsight Compute's source
  # page (per SASS instruction) over one 35B-A3B 8192-row launch of each kernel in NCU_KERNELS (regexes; default the
  # wsp state pass and the conv-fused tc prep), the top lines by excess wavefronts
  local ncu k; ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for k in ${NCU_KERNELS:-gdn_chunk_state_wsp gdn_chunk_prep_tc_conv}; do
    timeout ${PROFILE_TIMEOUT:-200} "$ncu" --kernel-name "regex:$k" --launch-count 1 \
      --section SourceCounters --page source --print-source sass --csv \
      python3 -m perf.bench_gdn --models 35b --batches 1x8192 --variants wsp --reps 1 > "$OUT/source_$k.csv" 2>&1
    python3 -m perf.ncu_source "$OUT/source_$k.csv" --top 30 2>&1 | tee "$OUT/source_${k}_top.txt" | head -34
  done
}
run_spec() {  # issue 15: MTP at forced acceptance, 27B, 1 lane, k = 3 (--skip-rounds: the rounds table alone
  # printed nothing within 280 s at 4eb6bda)
  timeout ${SPEC_TIMEOUT:-420} python3 -m perf.bench_spec --models 27b --activations fp32 --lanes 1 --ks 3 \
    --pcts 100 80 --skip-rounds --out "$OUT/results" 2>&1 | tee "$OUT/spec.txt" | tail -20
}
for phase in "${@:-tests}"; do
  "run_$phase"
done
# The tool returns at most 8 files per call (session 42 lost a perf JSON and PNG to that beside the cache's
# parts): the results folder comes back as one results.tgz (`tar xzf results.tgz` here).
if [ -d "$OUT/results" ]; then tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"; fi
# The cache comes back in parts of at most 15 MiB (the tool returns files of at most 16 MiB): `cat
# cupy-cache.tgz.part-* > .cupy-cache.tgz` here, then carry .cupy-cache.tgz in the next call. NO_CACHE_BACK=1:
# not packed (a call after one that brought the cache back, on the same source).
[ -n "${NO_CACHE_BACK:-}" ] || { tar czf /tmp/cupy-cache.tgz .cupy-cache 2>/dev/null \
  && split -b 15M /tmp/cupy-cache.tgz "$OUT/cupy-cache.tgz.part-"; }
