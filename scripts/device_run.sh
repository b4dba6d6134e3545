#!/usr/bin/env bash
# device_run.sh — everything the GPU machine does, in one call, most important
# first, each step skipped once the time budget (FD_DEADLINE_S, seconds since
# start; default 1e9) would be overrun:
#   1 build (CUDA: SASS sm_80 + sm_90a, compute_80 PTX)  2 ctest: every test, GPU ones included
#   3 generate --backend cuda --check
#   4 compute-sanitizer memcheck/racecheck/initcheck/synccheck, GPU grid
#   5 bench/bench_gpu.py (peers: SDPA, FlashInfer from .whl/, Flex; the variant rows)
#                                    6 Python tests + the SDPA-swap example
#   7 bench/bench_cpu.py (CPU backend vs torch CPU, this machine's cores)
#   8 compute-sanitizer on the GPU reliability suite (FD_TEST_QUICK=1)
# FD_ARCHS=90a-real: build only those CUDA targets (a quicker experiment build).
# Usage: FD_COMMIT=<hash> [FD_DEADLINE_S=540] scripts/device_run.sh [all|test|bench|exp|ampere|final|ab|mla|mlaxp|tree|treexp|release|san]
#   san: build, the GPU ctest tests (FD_CTEST: a regex of them), then the compute-sanitizer
#   steps of test (the GPU grid, the MLA cases, the GPU reliability suite) and nothing else.
#   FD_SAN_TIMEOUT: seconds a compute-sanitizer run may take (200; racecheck of the bf16 d128
#   grid cases needs more).
#   treexp: a variant against this tree: FD_XP=<name> builds .xp/<name> (carried) beside this
#   one, runs its test_gpu_tree, then bench_tree.py --no-flashinfer (FD_TREE_BENCH_ARGS) on both
#   builds, alternating twice.
#   mlaxp: MLA kernel variants against this tree: FD_XP="<name> ..." builds each .xp/<name>
#   (carried: `git archive <branch> | tar -x -C .xp/<name>`, or this tree plus a diff) beside
#   this one, runs each one's test_gpu_mla (FD_TEST_QUICK=1), the CLI's MLA rows on every build
#   alternating twice (FD_MLAXP_ROWS: "batch heads kv_len page_size" separated by ';'), then
#   compute-sanitizer memcheck of each variant on FD_SAN_FILTER (test_gpu_mla case-name
#   substrings, space-separated); FD_MLAXP_BENCH=<name>: bench_gpu.py --mla-only (FlashInfer's
#   MLA from .whl/ beside it) on that variant's library; FD_MLAXP_NCU=1: Nsight Compute of
#   B=64 128 heads 8k (64-key pages) on every build.
#   tree: build, test_gpu_tree, the Python tree tests, compute-sanitizer on tree cases, every
#   other GPU test (FD_TREE_GPU_TESTS=0: not), bench/bench_tree.py (FD_TREE_BENCH_ARGS) with
#   FlashInfer's masked prefill from .whl/.
#   mla: build, the MLA GPU tests (ctest -L gpu -R mla), then the MLA rows of the benchmark
#   (bench_gpu.py --mla-only: ours, FlashInfer's MLA wrapper fa2 / fa3) with the FlashInfer
#   wheels of .whl/; FlashInfer's MLA modules come prebuilt from .fi-mla-aot/ when carried
#   (scripts/prebuild_flashinfer_mla.sh makes it, ~1.2 MiB; copied into FlashInfer's AOT
#   directory, so nothing compiles), else they JIT-compile in the benchmark's background
#   prebuild (~2 CPU-minutes). FD_BENCH_ARGS: more bench_gpu.py flags (e.g. "--shapes h16").
#   release: build, test_gpu_mla (every case), the MLA benchmark rows with peers, the Python
#   MLA CUDA tests and the DeepSeek-V3 layer example, every other GPU test (ctest -L gpu), then
#   compute-sanitizer memcheck/racecheck on two MLA cases: every GPU check in one short call.
#   ab: the test steps, then our rows (bench_gpu.py --no-peers --no-sweep) of the tree in
#   .base/ (a commit to compare with: `git archive <rev> | tar -x -C .base`, carried) and of
#   this one, alternating base, new, base, new; bench/compare_builds.py's table in
#   $OUT/ab-compare.txt, the CSVs in $OUT/ab-runs.tgz. FD_AB_SHAPES: only those rows;
#   FD_AB_ROUNDS: alternations (2); FD_AB_NEED_S: seconds the A/B step needs left (150); FD_AB_QUICK=1: no variants fuzz, no generate;
#   FD_SAN_FILTER: the memcheck's grid cases.
#   FD_AB_NCU=<row>: Nsight Compute of that row's split kernel on both builds ($OUT/ab-ncu-*.txt).
#   FD_AB_TESTS=0: no test steps, only the build, the A/B rows and Nsight Compute.
#   FD_PROFILE=1 with bench: also dev/cuda/profile.sh OUTDIR paged (ncu).
#   exp: an experiment's check, not evidence for the targets: build, the GPU
#   ctest tests (label gpu), then bench_gpu.py without peers (ours + sweep;
#   FD_BENCH_SHAPES=a,b: only shapes whose name has a or b);
#   FD_EXP_CPU=1: the CPU benchmark too; FD_EXP_SAN=GLOB: memcheck and
#   racecheck (FD_EXP_SAN_TOOLS="memcheck ...": those) of the GPU grid cases
#   matching GLOB; FD_EXP_CTEST=REGEX: only the GPU tests REGEX matches.
#   ampere: the Ampere code path on this GPU, no sm_90a code (~8 min; the
#   default build is not made): build-sm80ptx (-DFD_CUDA_ARCHS=80-virtual:
#   compute_80 PTX only, JIT-compiled by the driver as on a B200 or RTX 50xx:
#   no PDL, no 8-warp config) and build-sm86 (the same with
#   -DFD_CUDA_SMEM_LIMIT_KB=100: planned as on an sm_86/89, the 2-stage
#   config from head_dim 80, one block an SM); the JIT's first-use time;
#   for both at once: test_fatbin, test_gpu_select device, the Python CUDA
#   tests (test_cuda_variants.py, test_cuda.py), the GPU ctest tests (label
#   gpu), compute-sanitizer memcheck of the GPU grid; then
#   bench_gpu.py --no-peers on build-sm80ptx, its files named
#   <date>-<commit>-sm80ptx-h200*.csv (beside the sm_90a run's -h200.csv).
#   FD_AMPERE_VARIANTS="sm80ptx" (or "sm86"): one of the two builds only (two
#   calls when both do not fit one call's deadline).
#   FD_BENCH_ARGS="...": more bench_gpu.py flags (bench and exp), e.g.
#   "--variants-only", "--no-variants", "--shapes b1-,var-mistral", "--no-flex".
# bench: FlashInfer's wheels (.whl/, scripts/fetch_device_deps.sh) are installed
#   into /tmp/site first; its kernels JIT-compile into /tmp/fd-flashinfer-jit in a
#   background process while the benchmark measures our rows (sm_90a only).
# Output: $OUT/log.txt (everything) plus the benchmarks' CSV/PNG files.
# Needs .deps/ (cmocka) and, for bench, .whl/ (both from
# scripts/fetch_device_deps.sh) carried with the call; the serving traces are in
# the repository (bench/data).
set -u
MODE=${1:-all}
OUT=${OUT:-/tmp/fd-out}
DEADLINE=${FD_DEADLINE_S:-1000000000}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
START=$(date +%s)
COMMIT=${FD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "== flashdecode device run: mode=$MODE commit=$COMMIT date=$(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
nvcc --version | tail -1
lscpu | grep -E "Model name|^CPU\(s\)" | tr -s ' '

DEPS="$PWD/.deps/root/usr"
status=0
# step NAME SECONDS_NEEDED: 0 when the step fits in the remaining budget.
step() {
  local left=$(( DEADLINE - ($(date +%s) - START) ))
  echo; echo "== $1 (t=$(( $(date +%s) - START ))s)"
  if [ "$left" -lt "$2" ]; then echo "   SKIPPED: ${left}s left, needs ~$2s"; return 1; fi
  return 0
}
want() { [ "$MODE" = all ] || [ "$MODE" = "$1" ] ||
         { [ "$MODE" = ab ] && [ "$1" = test ] && [ "${FD_AB_TESTS:-1}" = 1 ]; }; }
# san: the GPU ctest tests (FD_CTEST: only those) and the compute-sanitizer steps, nothing else
san_mode() { [ "$MODE" = san ]; }

DEPFLAGS=(-DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu"
  -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_C_FLAGS="-I$DEPS/include")
if [ "$MODE" = ab ]; then
  # the base build (.base: the tree of the commit compared with, carried) beside this one
  [ -f .base/CMakeLists.txt ] || { echo "ab: no .base/ carried"; exit 1; }
  (cmake -S .base -B .base/build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_BUILD_TESTS=OFF \
     -DFD_BUILD_CLI=OFF ${FD_ARCHS:+-DFD_CUDA_ARCHS="$FD_ARCHS"} "${DEPFLAGS[@]}" && cmake --build .base/build -j "$(( $(nproc) / 2 ))") \
    >/tmp/fd-build-base.txt 2>&1 &
  BASE_PID=$!
fi
if [ "$MODE" = treexp ] || [ "$MODE" = mlaxp ]; then
  # the variants' trees (.xp/<name> for each name of FD_XP, carried) built beside this one:
  # their library and the mode's test (and the CLI for mlaxp); treexp takes the first
  XPS=() XP_PIDS=()
  for name in ${FD_XP:?$MODE: set FD_XP to folders under .xp}; do
    XP=".xp/$name"
    [ -f "$XP/CMakeLists.txt" ] || { echo "$MODE: no $XP carried"; exit 1; }
    if [ "$MODE" = treexp ]; then XP_TARGETS="flashdecode test_gpu_tree"
    else XP_TARGETS="flashdecode flashdecode_cli test_gpu_mla"; fi
    # shellcheck disable=SC2086
    (cmake -S "$XP" -B "$XP/build" -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_PTXAS_VERBOSE=ON \
       ${FD_ARCHS:+-DFD_CUDA_ARCHS="$FD_ARCHS"} "${DEPFLAGS[@]}" &&
     cmake --build "$XP/build" -j "$(( $(nproc) / 2 ))" --target $XP_TARGETS) \
      >"/tmp/fd-build-xp-$name.txt" 2>&1 &
    XPS+=("$XP") XP_PIDS+=($!)
  done
  XP=${XPS[0]}
fi
# xp_wait: every variant built, or which did not (its log's tail)
xp_wait() {
  local i ok=0
  for i in "${!XPS[@]}"; do
    wait "${XP_PIDS[$i]}" ||
      { ok=1; echo "variant BUILD FAILED: ${XPS[$i]}"; tail -40 "/tmp/fd-build-xp-$(basename "${XPS[$i]}").txt"; }
  done
  return $ok
}
if [ "$MODE" != ampere ] && [ "$MODE" != final ]; then
step build 60 || exit 1
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_PTXAS_VERBOSE=ON \
  ${FD_ARCHS:+-DFD_CUDA_ARCHS="$FD_ARCHS"} "${DEPFLAGS[@]}" >/tmp/fd-build.txt 2>&1 &&
  cmake --build build -j "$(nproc)" >>/tmp/fd-build.txt 2>&1 || { echo "BUILD FAILED"; tail -60 /tmp/fd-build.txt; exit 1; }
grep -E "Used [0-9]+ registers|spill" /tmp/fd-build.txt | sort | uniq -c | sort -rn | head -12
fi
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python"

if { want test || san_mode; } && step "ctest (all tests, GPU included)" 120; then
  # ab, san: the GPU tests only (the CPU ones run in CI)
  (cd build && ctest --output-on-failure -j 4 --timeout 600 ${FD_CTEST:+-R "$FD_CTEST"} \
     $({ [ "$MODE" = ab ] || [ "$MODE" = san ]; } && echo "-L gpu")) \
    >/tmp/fd-ctest.txt 2>&1 || status=1
  cp /tmp/fd-ctest.txt "$OUT/ctest.txt"
  grep -E "Test +#|tests passed|FAILED|ERROR" /tmp/fd-ctest.txt | grep -v "^\[  FAILED  \] cuda/" | tail -40
fi

quick() { [ "$MODE" = ab ] && [ "${FD_AB_QUICK:-0}" = 1 ]; }
if want test && ! quick && step "variants fuzz (dev/cuda/variants_fuzz.c: CUDA vs float64 reference)" 40; then
  CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
  cc -O2 -Iinclude -Itests dev/cuda/variants_fuzz.c build/libflashdecode.a tests/gpu_mem.c \
    -fopenmp -lm -I"$CUDA_ROOT/include" -L"$CUDA_ROOT/lib64" -lcudart -lstdc++ -o /tmp/fd-vfuzz &&
    { timeout 120 /tmp/fd-vfuzz 600 "$(date +%s)" >/tmp/fd-vfuzz.txt 2>&1 || status=1; }
  tail -25 /tmp/fd-vfuzz.txt
fi

if want test && ! quick && step "generate --backend cuda --check" 20; then
  ./build/flashdecode generate --backend cuda --check --ids 2>&1 | tail -9
  ./build/flashdecode generate --backend cuda --num-splits 1 2>&1 | tail -1
  ./build/flashdecode generate --backend cpu 2>&1 | tail -1
fi

# ---- ab: our rows of the base build (.base) and of this tree, alternating ----
if [ "$MODE" = ab ] && step "A/B benchmark: base, new, base, new (bench_gpu.py --no-peers --no-sweep)" "${FD_AB_NEED_S:-150}"; then
  wait "$BASE_PID" || { echo "BASE BUILD FAILED"; tail -30 /tmp/fd-build-base.txt; exit 1; }
  mkdir -p /tmp/fd-ab
  for i in $(seq 1 "${FD_AB_ROUNDS:-2}"); do
    for which in base new; do
      if [ $which = base ]; then dir=.base; else dir=.; fi
      (cd $dir && FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python" \
        FD_READ_PROBE_LIBRARY="$OLDPWD/build/libfd_read_probe.so" timeout 240 \
        python3 bench/bench_gpu.py --no-peers --no-sweep --tag "$which$i" --out-dir /tmp/fd-ab \
        ${FD_AB_SHAPES:+--shapes "$FD_AB_SHAPES"} \
        --traces "$OLDPWD/bench/data" --commit "$COMMIT" --ceiling-reps 3 ${FD_BENCH_ARGS:-}) \
        >"/tmp/fd-ab-$which$i.txt" 2>&1 || { status=1; echo "   $which$i failed"; tail -12 "/tmp/fd-ab-$which$i.txt"; }
      grep -E "ceiling|read probe" "/tmp/fd-ab-$which$i.txt" | head -2 | sed "s/^/   [$which$i] /"
    done
  done
  main_csv() { ls /tmp/fd-ab/*-"$1"-*.csv | grep -vE -- '-(check|sweep)\.csv$' | head -1; }
  bases=(); news=()
  for i in $(seq 1 "${FD_AB_ROUNDS:-2}"); do bases+=("$(main_csv base$i)"); news+=("$(main_csv new$i)"); done
  python3 bench/compare_builds.py --base "${bases[@]}" --new "${news[@]}" --out "$OUT/ab-compare.txt"
  (cd /tmp/fd-ab && tar czf "$OUT/ab-runs.tgz" *.csv *.json 2>/dev/null)
  for f in /tmp/fd-ab-*.txt; do { echo "---- $f"; cat "$f"; } >>"$OUT/full-logs.txt"; done
fi
# FD_AB_NCU=<row>: Nsight Compute on that row's split kernel, base then new
# (one launch each, after 20), $OUT/ab-ncu-{base,new}.txt
if [ "$MODE" = ab ] && [ -n "${FD_AB_NCU:-}" ] && step "A/B Nsight Compute: $FD_AB_NCU" 60; then
  for which in base new; do
    if [ $which = base ]; then dir=.base; else dir=.; fi
    (cd $dir && FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python" \
      FD_READ_PROBE_LIBRARY="$OLDPWD/build/libfd_read_probe.so" timeout 150 \
      ncu -k regex:fd_split_mma_kernel --launch-skip 20 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
        --section InstructionStats --print-details all \
        python3 bench/bench_gpu.py --no-peers --no-sweep --shapes "$FD_AB_NCU" \
        --out-dir /tmp/fd-ab-ncu-$which --traces "$OLDPWD/bench/data" --ceiling-reps 1) \
      >"$OUT/ab-ncu-$which.txt" 2>&1
    echo "   [$which]"
    grep -E "Duration|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|Stall [A-Z]|Registers Per|Achieved Occupancy|Executed Instructions  " \
      "$OUT/ab-ncu-$which.txt" | head -24 | sed 's/^/     /'
  done
fi

if want test && step "python tests and the SDPA-swap example" 70; then
  # stopped before the call's deadline; its output written where the call's files come back
  left=$(( DEADLINE - ($(date +%s) - START) - 10 ))
  timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/python >"$OUT/pytest.txt" 2>&1
  rc=$?; [ $rc -eq 124 ] && echo "   stopped after ${left}s (deadline)"
  tail -6 "$OUT/pytest.txt"
  [ $rc -eq 0 ] || status=1
  timeout 60 python3 examples/llama_decode_swap.py 2>&1 | tail -12
fi

san() { # san BINARY TOOL FILTER
  echo "-- $2 $1 ${3:+(filter $3)}"
  FD_TEST_QUICK=1 FD_TEST_FILTER="$3" timeout "${FD_SAN_TIMEOUT:-200}" compute-sanitizer --tool "$2" \
    --error-exitcode 99 "$1" >/tmp/fd-san.txt 2>&1
  local rc=$?
  { echo "---- compute-sanitizer $2 $1 $3 (exit $rc)"; cat /tmp/fd-san.txt; } >>"$OUT/full-logs.txt"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK|PASSED|FAILED" /tmp/fd-san.txt | tail -3
  echo "   exit $rc"
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
}
if { want test || san_mode; } && step "compute-sanitizer: GPU grid" 90; then
  san build/tests/test_gpu_grid memcheck "${FD_SAN_FILTER:-}"
  for tool in racecheck initcheck synccheck; do san build/tests/test_gpu_grid $tool 'cuda/bf16/d128/*'; done
  san build/tests/test_gpu_mla memcheck ""
  for tool in racecheck synccheck; do
    san build/tests/test_gpu_mla $tool '_D512_H16_T1_B3_kv1000'
    san build/tests/test_gpu_mla $tool '_D512_H64_T1_B3_kv1000'
  done
fi

if [ "$MODE" = exp ] && step "ctest (GPU tests only)" 60; then
  (cd build && ctest --output-on-failure -j 2 -L gpu --timeout 300 ${FD_EXP_CTEST:+-R "$FD_EXP_CTEST"}) \
    >/tmp/fd-ctest.txt 2>&1 || status=1
  grep -E "Test +#|tests passed|FAILED|ERROR" /tmp/fd-ctest.txt | tail -20
fi
if [ "$MODE" = exp ] && [ -n "${FD_EXP_SAN:-}" ] && step "compute-sanitizer (exp): GPU grid, filter $FD_EXP_SAN" 60; then
  for tool in ${FD_EXP_SAN_TOOLS:-memcheck racecheck}; do san build/tests/test_gpu_grid $tool "$FD_EXP_SAN"; done
fi
if [ "$MODE" = exp ] && step "benchmark without peers (bench/bench_gpu.py --no-peers)" 90; then
  # shellcheck disable=SC2086
  python3 bench/bench_gpu.py --no-peers --out-dir "$OUT" --traces bench/data \
    --commit "$COMMIT" ${FD_BENCH_SHAPES:+--shapes "$FD_BENCH_SHAPES"} ${FD_BENCH_ARGS:-} \
    >/tmp/fd-bench.txt 2>&1
  [ $? -eq 0 ] || status=1
  sed -n '/^=====/,$p' /tmp/fd-bench.txt
fi

# FlashInfer for the peer benchmark: the carried wheels into /tmp/site (no network
# there), nvcc's root as CUDA_HOME, kernels for sm_90a only, its JIT cache under /tmp.
fi_setup() {
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "   no .whl/*.whl carried: the FlashInfer peers will say unavailable"; return 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/tmp/fd-pip.txt 2>&1 ||
    { echo "   pip install of .whl/ failed (FlashInfer peers unavailable):"; tail -5 /tmp/fd-pip.txt; return 0; }
  # FlashInfer's MLA modules prebuilt elsewhere (scripts/prebuild_flashinfer_mla.sh): its AOT
  # directory is read before any JIT build
  if [ -d .fi-mla-aot ] && [ -d /tmp/site/flashinfer/data ]; then
    mkdir -p /tmp/site/flashinfer/data/aot && cp -r .fi-mla-aot/. /tmp/site/flashinfer/data/aot/ &&
      echo "   prebuilt FlashInfer MLA modules: $(ls .fi-mla-aot | wc -l) from .fi-mla-aot/"
  fi
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
  local nvcc; nvcc=$(command -v nvcc)
  [ -n "$nvcc" ] && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc")")")}
  export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fd-flashinfer-jit
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  ls .whl/*.whl | sed 's|^|   |'
  python3 -c "import flashinfer, cudnn, tvm_ffi; print('   flashinfer', flashinfer.__version__, \
'(CUDA_HOME ${CUDA_HOME:-unset})')" 2>&1 | tail -2
}
if want bench && step "FlashInfer wheels -> /tmp/site" 20; then fi_setup; fi

if want bench && step "peer benchmark (bench/bench_gpu.py)" 150; then
  # its own budget: what is left of ours, less the margin its start and its files need
  left=$(( DEADLINE - ($(date +%s) - START) ))
  budget=$(( left - 50 )); [ "$budget" -gt 420 ] && budget=420
  # shellcheck disable=SC2086
  timeout $(( left - 10 )) python3 bench/bench_gpu.py --out-dir "$OUT" --traces bench/data \
    --commit "$COMMIT" --budget-s "$budget" --log-dir /tmp/fd-bench-logs ${FD_BENCH_ARGS:-} \
    >/tmp/fd-bench.txt 2>&1
  [ $? -eq 0 ] || status=1
  sed -n '/^=====/,$p' /tmp/fd-bench.txt
fi

# ---- release: every GPU check in one short call (little device time left) ----
if [ "$MODE" = release ] && step "test_gpu_mla, every case" 60; then
  (cd build && FD_TEST_QUICK=0 timeout "${FD_MLA_TEST_S:-120}" ./tests/test_gpu_mla) >"$OUT/gpu_mla.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "   rc $rc: $(grep -c '^PASS' "$OUT/gpu_mla.txt") PASS, $(grep -c '^FAIL' "$OUT/gpu_mla.txt") FAIL"
  grep '^FAIL' "$OUT/gpu_mla.txt" | head -20; tail -2 "$OUT/gpu_mla.txt"
fi
if [ "$MODE" = release ] && step "FlashInfer wheels -> /tmp/site" 20; then fi_setup; fi
if [ "$MODE" = release ] && step "MLA benchmark (bench/bench_gpu.py --mla-only)" 60; then
  timeout 120 python3 bench/bench_gpu.py --mla-only --out-dir "$OUT" --commit "$COMMIT" \
    --budget-s 100 --log-dir /tmp/fd-bench-logs >/tmp/fd-bench.txt 2>&1 || status=1
  sed -n '/^=====/,$p' /tmp/fd-bench.txt
fi
if [ "$MODE" = release ] && step "Python MLA on CUDA, the DeepSeek-V3 layer example" 40; then
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/python/test_mla.py -k "cuda or gpu" \
    >"$OUT/py_mla.txt" 2>&1 || status=1
  tail -3 "$OUT/py_mla.txt"
  for a in "" "--kv-dtype e4m3"; do
    # shellcheck disable=SC2086
    timeout 60 python3 examples/deepseek_mla_decode.py --device cuda $a 2>&1 | tail -2 || status=1
  done
fi
if [ "$MODE" = release ] && step "every other GPU test (ctest -L gpu -E mla)" 60; then
  (cd build && timeout "${FD_GPU_TESTS_S:-150}" ctest --output-on-failure -L gpu -E mla -j 3 \
     --timeout 140) >/tmp/fd-ctest.txt 2>&1 || status=1
  cp /tmp/fd-ctest.txt "$OUT/ctest.txt"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" /tmp/fd-ctest.txt | tail -12
fi
if [ "$MODE" = release ] && step "compute-sanitizer memcheck + racecheck, two MLA cases" 40; then
  for f in _D512_H16_T1_B3_kv1000 _D512_H64_T1_B3_kv1000; do
    for t in memcheck racecheck; do
      echo "   $t $f: $(cd build && FD_TEST_QUICK=1 FD_TEST_FILTER=$f timeout 60 compute-sanitizer \
        --tool $t ./tests/test_gpu_mla 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1)"
    done
  done
fi

# ---- treexp: a variant (.xp/$FD_XP) against this tree: the variant's test_gpu_tree, then
# bench_tree.py --no-flashinfer (FD_TREE_BENCH_ARGS) on this build and the variant, alternating ----
if [ "$MODE" = treexp ] && step "the variant's build and test_gpu_tree" 60; then
  xp_wait || exit 1
  grep -E "rows_wgmma|C75[0-9]+" "/tmp/fd-build-xp-$(basename "$XP").txt" | grep -E "Used|spill|C75" | sort | uniq -c | head -8
  (cd "$XP/build" && timeout 120 ./tests/test_gpu_tree) >"$OUT/xp_gpu_tree.txt" 2>&1 || status=1
  echo "   variant test_gpu_tree: $(grep -c '^\[       OK \]' "$OUT/xp_gpu_tree.txt") OK, $(grep -c '^\[  FAILED  \]' "$OUT/xp_gpu_tree.txt") FAILED lines"
fi
if [ "$MODE" = treexp ] && step "bench_tree.py: this build and the variant, alternating" 40; then
  for round in 1 2; do
    for lib in build "$XP/build"; do
      echo "   round $round, $lib:"
      # shellcheck disable=SC2086
      FLASHDECODE_LIBRARY="$PWD/$lib/libflashdecode.so" PYTHONPATH="$PWD/python:$PWD/bench" \
        timeout 120 python3 bench/bench_tree.py --no-flashinfer --out-dir "/tmp/fd-xp-$round" \
        --commit "$(basename "$lib" | tr / -)" ${FD_TREE_BENCH_ARGS:-} 2>&1 | grep -E "^tree-" || status=1
    done
  done
fi

# ---- mlaxp: MLA kernel variants (.xp/<name> for each of FD_XP) against this tree: their
# test_gpu_mla, the CLI's MLA rows on every build alternating, memcheck of the variants, and
# (optional) the MLA benchmark with FlashInfer on one variant, Nsight Compute on every build ----
if [ "$MODE" = mlaxp ] && step "the variants' builds and test_gpu_mla (FD_TEST_QUICK=1)" 60; then
  xp_wait || exit 1
  for XP in "${XPS[@]}"; do
    name=$(basename "$XP")
    grep -E "mla_wgmma|mla_kernel" -A2 "/tmp/fd-build-xp-$name.txt" | grep -E "Used|spill" | sort | uniq -c | head -8
    (cd "$XP/build" && FD_TEST_QUICK=1 timeout 150 ./tests/test_gpu_mla) >"$OUT/xp_gpu_mla-$name.txt" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "   $name test_gpu_mla rc $rc: $(grep -c '^PASS' "$OUT/xp_gpu_mla-$name.txt") PASS, $(grep -c '^FAIL' "$OUT/xp_gpu_mla-$name.txt") FAIL"
    grep -m 12 -E '^FAIL|^hopper:' "$OUT/xp_gpu_mla-$name.txt"
  done
fi
if [ "$MODE" = mlaxp ] && step "the CLI's MLA rows: this build and the variants, alternating" 60; then
  rows=${FD_MLAXP_ROWS:-"64 128 8192 64;1 128 32768 64;16 128 8192 64;128 128 4096 64;64 128 8192 16;64 128 8192 0;64 16 8192 64"}
  for round in 1 2; do
    IFS=';' read -r -a list <<<"$rows"
    for r in "${list[@]}"; do
      read -r b h n pg <<<"$r"
      for dir in build "${XPS[@]/%//build}"; do
        echo "   $round $dir b$b h$h n$n pg$pg: $(timeout 60 "./$dir/flashdecode" bench --backend cuda \
          --num-heads-kv 1 --head-dim 512 --rope-dim 64 --iters 50 --batch "$b" --num-heads-q "$h" \
          --kv-len "$n" --page-size "$pg" 2>&1 | tail -1 | grep -oE "us=[0-9.]+|num_splits=[0-9]+" | tr '\n' ' ')"
      done
    done
  done | tee "$OUT/xp_mla_rows.txt"
fi
if [ "$MODE" = mlaxp ] && step "compute-sanitizer memcheck of the variants" 40; then
  for XP in "${XPS[@]}"; do
    for f in ${FD_SAN_FILTER:-_D512_H128_T1_B4_kv1,0,1999,65}; do
      echo "   $(basename "$XP") memcheck $f: $(cd "$XP/build" && FD_TEST_QUICK=1 FD_TEST_FILTER=$f \
        timeout 90 compute-sanitizer --tool memcheck ./tests/test_gpu_mla 2>&1 | grep -E "ERROR SUMMARY" | tail -1)"
    done
  done
fi
if [ "$MODE" = mlaxp ] && [ -n "${FD_MLAXP_BENCH:-}" ] && step "FlashInfer wheels -> /tmp/site" 20; then fi_setup; fi
if [ "$MODE" = mlaxp ] && [ -n "${FD_MLAXP_BENCH:-}" ] &&
   step "MLA benchmark (bench_gpu.py --mla-only) on .xp/$FD_MLAXP_BENCH" 150; then
  left=$(( DEADLINE - ($(date +%s) - START) ))
  budget=$(( left - 100 )); [ "$budget" -gt 240 ] && budget=240
  FLASHDECODE_LIBRARY="$PWD/.xp/$FD_MLAXP_BENCH/build/libflashdecode.so" \
    FD_READ_PROBE_LIBRARY="$PWD/build/libfd_read_probe.so" timeout $(( budget + 40 )) \
    python3 bench/bench_gpu.py --mla-only --out-dir "$OUT" --commit "$COMMIT-$FD_MLAXP_BENCH" \
    --budget-s "$budget" --log-dir /tmp/fd-bench-logs >/tmp/fd-bench.txt 2>&1 || status=1
  sed -n '/^=====/,$p' /tmp/fd-bench.txt | head -60
fi
if [ "$MODE" = mlaxp ] && [ "${FD_MLAXP_NCU:-0}" = 1 ]; then
  for dir in build "${XPS[@]/%//build}"; do
    step "Nsight Compute: B=64 128 heads 8k, page 64, $dir" 50 || break
    timeout 120 ncu -k regex:fd_mla_wgmma_kernel --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --print-details all \
      "./$dir/flashdecode" bench --backend cuda --iters 2 --batch 64 --num-heads-q 128 \
      --kv-len 8192 --num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64 >/tmp/fd-ncu.txt 2>&1
    grep -E "Duration|L2 Cache Throughput|DRAM Throughput|Issue Slots|No Eligible|Warp Cycles Per Issued|Stall [A-Z]" \
      /tmp/fd-ncu.txt | head -24 | sed 's/^/     /'
    { echo "==== $dir"; cat /tmp/fd-ncu.txt; } >>"$OUT/xp-ncu.txt"
  done
fi

# ---- tree: tree masks on CUDA (the rows kernel), then every other GPU test, the tree
# benchmark with FlashInfer's masked prefill ----
if [ "$MODE" = tree ] && step "test_gpu_tree, the Python tree tests on CUDA" 40; then
  (cd build && timeout 120 ./tests/test_gpu_tree) >"$OUT/gpu_tree.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "   test_gpu_tree rc $rc: $(grep -c '^\[       OK \]' "$OUT/gpu_tree.txt") OK, $(grep -c '^\[  FAILED  \]' "$OUT/gpu_tree.txt") FAILED lines"
  grep -E "FAIL|tree plan" "$OUT/gpu_tree.txt" | head -20
  # the non-causal cases of the GPU grid: the rows kernels' other calls
  (cd build && FD_TEST_FILTER='*noncausal*' timeout 120 ./tests/test_gpu_grid) \
    >"$OUT/grid_noncausal.txt" 2>&1 || status=1
  echo "   test_gpu_grid non-causal: $(grep -c '^\[       OK \]' "$OUT/grid_noncausal.txt") OK, $(grep -c '^\[  FAILED  \]' "$OUT/grid_noncausal.txt") FAILED lines"
  grep -E "FAIL|reproduce" "$OUT/grid_noncausal.txt" | head -10
  timeout 60 python3 examples/tree_verify.py --device cuda --dtype bfloat16 2>&1 | tail -2 || status=1
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/python/test_tree.py \
    >"$OUT/py_tree.txt" 2>&1 || status=1
  tail -3 "$OUT/py_tree.txt"
fi
if [ "$MODE" = tree ] && step "compute-sanitizer memcheck + racecheck, tree cases" 40; then
  for f in "*/q5/*" "*/q64/paged16/*"; do
    for t in memcheck racecheck; do
      echo "   $t $f: $(cd build && FD_TEST_FILTER="$f" timeout 90 compute-sanitizer \
        --tool $t ./tests/test_gpu_tree 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1)"
    done
  done
fi
if [ "$MODE" = tree ] && [ "${FD_TREE_GPU_TESTS:-1}" = 1 ] && step "every other GPU test (ctest -L gpu -E tree)" 60; then
  (cd build && timeout "${FD_GPU_TESTS_S:-250}" ctest --output-on-failure -L gpu -E tree -j 3 \
     --timeout 240) >/tmp/fd-ctest.txt 2>&1 || status=1
  cp /tmp/fd-ctest.txt "$OUT/ctest.txt"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" /tmp/fd-ctest.txt | tail -12
fi
if [ "$MODE" = tree ] && step "FlashInfer wheels -> /tmp/site" 20; then fi_setup; fi
if [ "$MODE" = tree ] && step "tree benchmark (bench/bench_tree.py)" 60; then
  left=$(( DEADLINE - ($(date +%s) - START) ))
  # shellcheck disable=SC2086
  PYTHONPATH="$PYTHONPATH:bench:/tmp/site" timeout $(( left - 10 )) python3 bench/bench_tree.py \
    --out-dir "$OUT" --commit "$COMMIT" ${FD_TREE_BENCH_ARGS:-} >"$OUT/bench_tree.txt" 2>&1 || status=1
  grep -vE "^\[" "$OUT/bench_tree.txt" | tail -75
fi

# ---- mla: the MLA GPU tests, then the MLA rows with FlashInfer's MLA paths ----
if [ "$MODE" = mla ] && step "MLA GPU tests (ctest -L gpu -R mla)" 60; then
  # FD_TEST_QUICK=1 by default here (the cases up to 3000 keys; FD_TEST_QUICK=0: all), and
  # stopped in time to leave the benchmark ~240 s
  tlimit=$(( DEADLINE - ($(date +%s) - START) - 240 )); [ "$tlimit" -lt 60 ] && tlimit=60
  (cd build && FD_TEST_QUICK=${FD_TEST_QUICK:-1} timeout "$tlimit" ctest --output-on-failure \
     -L gpu -R mla --timeout 300) >/tmp/fd-ctest.txt 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1; [ $rc -eq 124 ] && echo "   stopped after ${tlimit}s (deadline)"
  cp /tmp/fd-ctest.txt "$OUT/ctest.txt"
  grep -E "Test +#|tests passed|tests failed|No tests were found|FAILED|ERROR" /tmp/fd-ctest.txt | tail -20
fi
if [ "$MODE" = mla ] && step "FlashInfer wheels -> /tmp/site" 20; then fi_setup; fi
if [ "$MODE" = mla ] && step "MLA benchmark (bench/bench_gpu.py --mla-only)" 120; then
  left=$(( DEADLINE - ($(date +%s) - START) ))
  budget=$(( left - 60 )); [ "$budget" -gt 360 ] && budget=360
  # shellcheck disable=SC2086
  timeout $(( left - 10 )) python3 bench/bench_gpu.py --mla-only --out-dir "$OUT" \
    --commit "$COMMIT" --budget-s "$budget" --log-dir /tmp/fd-bench-logs ${FD_BENCH_ARGS:-} \
    >/tmp/fd-bench.txt 2>&1
  [ $? -eq 0 ] || status=1
  sed -n '/^=====/,$p' /tmp/fd-bench.txt
  grep -E "FAILED|Traceback|Error" /tmp/fd-bench.txt | head -8
fi

if want bench && [ "${FD_PROFILE:-0}" = 1 ] && step "Nsight Compute: paged vs contiguous, one split" 60; then
  bash dev/cuda/profile.sh "$OUT/ncu" paged 2>&1 | tail -60
  # one file: only about 8 files of $OUT come back from the device
  for f in "$OUT"/ncu/ncu-*.txt; do echo "==== $(basename "$f")"; cat "$f"; done >"$OUT/ncu-all.txt"
  rm -rf "$OUT/ncu"
fi


if { want bench || [ "${FD_EXP_CPU:-0}" = 1 ]; } && [ -f bench/bench_cpu.py ] &&
  step "CPU benchmark (bench/bench_cpu.py)" 90; then
  timeout 240 python3 bench/bench_cpu.py --out-dir "$OUT" --commit "$COMMIT" >/tmp/fd-cpu.txt 2>&1
  [ $? -eq 0 ] || status=1
  tail -25 /tmp/fd-cpu.txt
fi

if { want test || san_mode; } && step "compute-sanitizer: GPU reliability suite" 60; then
  for bin in $(find build/tests -type f -executable -name '*reliability*gpu*' | sort); do
    for tool in memcheck racecheck initcheck synccheck; do san "$bin" $tool ""; done
  done
fi

# ---- ampere: the compute_80 code path (JIT-compiled PTX) and an sm_86 budget ----
# abuild NAME CMAKE_FLAGS...: configure and build build-NAME (log /tmp/fd-build-NAME.txt)
abuild() {
  local name=$1; shift
  cmake -S . -B "build-$name" -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON "$@" "${DEPFLAGS[@]}" \
    >"/tmp/fd-build-$name.txt" 2>&1 &&
    cmake --build "build-$name" -j "$(( $(nproc) / 2 ))" >>"/tmp/fd-build-$name.txt" 2>&1
}
# avariant NAME: what the ampere mode runs on build-NAME; output to stdout
avariant() {
  local b=build-$1 rc=0 r
  echo "---- [$1] test_fatbin"
  (cd "$b" && ctest --output-on-failure -R '^test_fatbin$' --timeout 120) || rc=1
  echo "---- [$1] test_gpu_select device"
  "$b/tests/test_gpu_select" device; r=$?; [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
  # the variants against float64 at every CUDA head_dim (windows at head_dim
  # 256: the lean config's 32-key tiles below a window's first key)
  echo "---- [$1] pytest tests/python/test_cuda*.py"
  FLASHDECODE_LIBRARY="$PWD/$b/libflashdecode.so" python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_cuda*.py 2>&1 | tail -6
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  echo "---- [$1] ctest -L gpu"
  (cd "$b" && ctest --output-on-failure -L gpu --timeout 400) || rc=1
  echo "---- [$1] compute-sanitizer memcheck $b/tests/test_gpu_grid (FD_TEST_QUICK=1)"
  FD_TEST_QUICK=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 99 \
    "$b/tests/test_gpu_grid"; r=$?
  echo "   memcheck exit $r"
  [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
  return $rc
}
if [ "$MODE" = ampere ]; then
  # the JIT cache starts empty, so the first-use time below is the JIT's
  export CUDA_CACHE_PATH=/tmp/fd-jit-cache CUDA_CACHE_MAXSIZE=4294967296
  rm -rf "$CUDA_CACHE_PATH"
  # FD_AMPERE_VARIANTS: which of the two builds (default both; one a call when
  # both do not fit the deadline)
  AV=${FD_AMPERE_VARIANTS:-sm80ptx sm86}
  if ! step "build: $AV (80-virtual; sm86: a 100 KB budget), at once" 90; then
    exit 1
  fi
  t=$(date +%s)
  pids=()
  for n in $AV; do
    case $n in
      sm80ptx) abuild sm80ptx -DFD_CUDA_ARCHS=80-virtual & pids+=($!) ;;
      sm86) abuild sm86 -DFD_CUDA_ARCHS=80-virtual -DFD_CUDA_SMEM_LIMIT_KB=100 & pids+=($!) ;;
      *) echo "unknown FD_AMPERE_VARIANTS entry $n"; exit 1 ;;
    esac
  done
  k=0
  for n in $AV; do
    wait "${pids[$k]}" || { echo "BUILD FAILED ($n)"; tail -40 "/tmp/fd-build-$n.txt"; exit 1; }
    grep -E "flashdecode: CUDA" "/tmp/fd-build-$n.txt" | sed "s/^/   [$n] /"
    k=$((k + 1))
  done
  echo "   built in $(( $(date +%s) - t ))s"
  jb=build-$(echo "$AV" | awk '{print $1}') # the JIT timing runs on the first

  if step "first use: the driver JIT-compiles the compute_80 PTX (empty cache), then cached" 120; then
    for pass in "JIT" "cached"; do
      for dt in bf16 f32; do
        t=$(date +%s%N)
        line=$(./$jb/flashdecode check --backend cuda --dtype $dt --batch 2 \
          --num-heads-q 8 --num-heads-kv 2 --head-dim 128 --kv-len 3000 2>&1 | tail -1)
        echo "   $pass $dt: $(( ($(date +%s%N) - t) / 1000000 )) ms: $line"
      done
    done
    du -sh "$CUDA_CACHE_PATH" 2>/dev/null | sed 's/^/   JIT cache: /'
  fi

  if step "$AV at once: test_fatbin, test_gpu_select device, ctest -L gpu, memcheck of the GPU grid" 200; then
    # bounded by the deadline (less the summary's margin): the log must come back
    left=$(( DEADLINE - ($(date +%s) - START) - 20 ))
    pids=()
    for n in $AV; do
      timeout "$left" bash -c "$(declare -f avariant); avariant $n" >"/tmp/fd-amp-$n.txt" 2>&1 &
      pids+=($!)
    done
    k=0
    for n in $AV; do
      wait "${pids[$k]}"; r=$?
      [ $r -eq 0 ] || { status=1; [ $r -eq 124 ] && echo "   [$n] stopped at the deadline"; }
      k=$((k + 1))
    done
    for n in $AV; do
      echo "-- [$n]"
      grep -E "^---- |^SASS|^PTX|PASS|^FAIL|^device 0|^build:|^  16-bit|^  float32|Test +#|tests passed|tests failed|ERROR SUMMARY|memcheck exit| passed| failed| skipped|error" \
        "/tmp/fd-amp-$n.txt" | grep -v "^---- \[.*\] \(test_fatbin\|ctest\)$" | head -60
      { echo "---- ampere variant $n"; cat "/tmp/fd-amp-$n.txt"; } >>"$OUT/full-logs.txt"
    done
  fi

  if [[ " $AV " == *" sm80ptx "* ]] && step "benchmark without peers, build-sm80ptx (bench/bench_gpu.py --no-peers --tag sm80ptx)" 90; then
    left=$(( DEADLINE - ($(date +%s) - START) ))
    budget=$(( left - 50 )); [ "$budget" -gt 240 ] && budget=240
    # files <date>-<commit>-sm80ptx-h200*.csv, beside the sm_90a run's <date>-<commit>-h200*.csv
    # shellcheck disable=SC2086
    FLASHDECODE_LIBRARY="$PWD/build-sm80ptx/libflashdecode.so" \
      FD_READ_PROBE_LIBRARY="$PWD/build-sm80ptx/libfd_read_probe.so" timeout $(( left - 10 )) \
      python3 bench/bench_gpu.py --no-peers --tag sm80ptx --out-dir "$OUT" --traces bench/data \
      --commit "$COMMIT" --budget-s "$budget" ${FD_BENCH_ARGS:-} >/tmp/fd-bench.txt 2>&1
    r=$?
    sed -n '/^=====/,$p' /tmp/fd-bench.txt
    [ $r -eq 0 ] || { status=1; echo "   bench_gpu.py exit $r"; tail -15 /tmp/fd-bench.txt; }
  fi
fi

# ---- final: one call that checks a session's work on both code paths ----
# build-sm80ptx (compute_80 PTX only, JIT-compiled) and build-90a (sm_90a SASS
# only) side by side; then at once: the ampere checks of build-sm80ptx
# (avariant: test_fatbin, test_gpu_select device, Python CUDA tests, ctest -L
# gpu, memcheck of the GPU grid) and ctest -L gpu on build-90a; then the
# deterministic-mode rows on build-90a and the benchmark of build-sm80ptx
# without peers (its -sm80ptx-h200 CSV).
if [ "$MODE" = final ]; then
  export CUDA_CACHE_PATH=/tmp/fd-jit-cache CUDA_CACHE_MAXSIZE=4294967296
  rm -rf "$CUDA_CACHE_PATH"
  step "build: build-sm80ptx (80-virtual) and build-90a (90a-real), at once" 90 || exit 1
  t=$(date +%s)
  abuild sm80ptx -DFD_CUDA_ARCHS=80-virtual & p1=$!
  abuild 90a -DFD_CUDA_ARCHS=90a-real -DFD_PTXAS_VERBOSE=ON & p2=$!
  wait $p1; r1=$?; wait $p2; r2=$?
  [ $r1 -eq 0 ] || { echo "BUILD FAILED (sm80ptx)"; tail -40 /tmp/fd-build-sm80ptx.txt; exit 1; }
  [ $r2 -eq 0 ] || { echo "BUILD FAILED (90a)"; tail -40 /tmp/fd-build-90a.txt; exit 1; }
  echo "   both built in $(( $(date +%s) - t ))s"
  grep -E "Used [0-9]+ registers|spill" /tmp/fd-build-90a.txt | sort | uniq -c | sort -rn | head -14
  if step "first use of the compute_80 PTX (JIT, empty cache), then cached" 40; then
    for pass in JIT cached; do
      t=$(date +%s%N)
      line=$(./build-sm80ptx/flashdecode check --backend cuda --dtype bf16 --batch 2 \
        --num-heads-q 8 --num-heads-kv 2 --head-dim 128 --kv-len 3000 2>&1 | tail -1)
      echo "   $pass bf16: $(( ($(date +%s%N) - t) / 1000000 )) ms: $line"
    done
  fi
  if step "at once: avariant sm80ptx; ctest -L gpu on build-90a" 150; then
    left=$(( DEADLINE - ($(date +%s) - START) - 210 ))
    [ "$left" -lt 150 ] && left=150
    timeout "$left" bash -c "$(declare -f avariant); avariant sm80ptx" >/tmp/fd-amp-sm80ptx.txt 2>&1 & p1=$!
    { (cd build-90a && timeout "$left" ctest --output-on-failure -L gpu --timeout 300) >/tmp/fd-ctest.txt 2>&1
      r=$?
      # the fp8 widening in place (two barriers a tile): racecheck, d128 cases
      FD_TEST_QUICK=1 FD_TEST_FILTER='cuda/*d128*' timeout 80 compute-sanitizer --tool racecheck \
        --error-exitcode 99 build-90a/tests/test_gpu_fp8_grid >/tmp/fd-race-fp8.txt 2>&1
      echo "racecheck test_gpu_fp8_grid d128: exit $?" >>/tmp/fd-race-fp8.txt
      exit $r; } & p2=$!
    wait $p1; r1=$?; wait $p2; r2=$?
    [ $r1 -eq 0 ] || { status=1; echo "   [sm80ptx] exit $r1 (124: stopped at the deadline)"; }
    [ $r2 -eq 0 ] || { status=1; echo "   [90a ctest] exit $r2"; }
    echo "-- [sm80ptx]"
    grep -E "^---- |^SASS|^PTX|PASS|^FAIL|^device 0|^build:|Test +#|tests passed|tests failed|ERROR SUMMARY|memcheck exit| passed| failed| skipped|error" \
      /tmp/fd-amp-sm80ptx.txt | grep -v "^---- \[.*\] \(test_fatbin\|ctest\)$" | head -70
    { echo "---- final: avariant sm80ptx"; cat /tmp/fd-amp-sm80ptx.txt; } >>"$OUT/full-logs.txt"
    echo "-- [90a] ctest -L gpu"
    cp /tmp/fd-ctest.txt "$OUT/ctest-90a.txt"
    grep -E "Test +#|tests passed|tests failed|ERROR:" /tmp/fd-ctest.txt | tail -30
    grep -E "RACECHECK SUMMARY|PASSED|FAILED|exit" /tmp/fd-race-fp8.txt | tail -4
    { echo "---- final: racecheck fp8 grid d128"; cat /tmp/fd-race-fp8.txt; } >>"$OUT/full-logs.txt"
  fi
  if step "benchmark without peers, build-sm80ptx (--tag sm80ptx --no-variants --no-sweep)" 80; then
    left=$(( DEADLINE - ($(date +%s) - START) ))
    budget=$(( left - 150 )); [ "$budget" -gt 120 ] && budget=120; [ "$budget" -lt 60 ] && budget=60
    FLASHDECODE_LIBRARY="$PWD/build-sm80ptx/libflashdecode.so" \
      FD_READ_PROBE_LIBRARY="$PWD/build-sm80ptx/libfd_read_probe.so" timeout $(( budget + 40 )) \
      python3 bench/bench_gpu.py --no-peers --no-variants --no-sweep --tag sm80ptx --out-dir "$OUT" \
      --traces bench/data --commit "$COMMIT" --budget-s "$budget" --ceiling-reps 3 >/tmp/fd-bench.txt 2>&1
    r=$?
    sed -n '/^=====/,$p' /tmp/fd-bench.txt
    [ $r -eq 0 ] || { status=1; echo "   bench_gpu.py exit $r"; tail -15 /tmp/fd-bench.txt; }
  fi
  if step "build-90a rows: deterministic mode, soft-cap, fp32 (bench_gpu.py --no-peers)" 70; then
    FLASHDECODE_LIBRARY="$PWD/build-90a/libflashdecode.so" \
      FD_READ_PROBE_LIBRARY="$PWD/build-90a/libfd_read_probe.so" timeout 110 \
      python3 bench/bench_gpu.py --no-peers --no-sweep --shapes var-det,var-gemma2,-fp32- --tag det \
      --traces bench/data --out-dir "$OUT" --commit "$COMMIT" --budget-s 60 --ceiling-reps 3 \
      >/tmp/fd-bench-det.txt 2>&1 || status=1
    sed -n '/^=====/,$p' /tmp/fd-bench-det.txt | grep -v "^$" | head -30
  fi
  # only ~8 files come back from the device: the benchmarks' CSV/PNG files in one archive
  ( cd "$OUT" && ls *.csv *.png >/dev/null 2>&1 && tar czf bench-final.tgz *.csv *.png &&
    rm -f *.csv *.png && echo "   bench files -> bench-final.tgz" )
  cat /tmp/fd-bench-det.txt >>"$OUT/full-logs.txt" 2>/dev/null
fi

echo; echo "== full logs"
for f in /tmp/fd-ctest.txt /tmp/fd-bench.txt /tmp/fd-bench-logs/fi-prebuild.log /tmp/fd-cpu.txt; do
  [ -f "$f" ] && { echo "---- $f"; cat "$f"; } >>"$OUT/full-logs.txt"
done
echo "== done at t=$(( $(date +%s) - START ))s, status $status"
exit $status
