#!/usr/bin/env bash
# device_quick.sh — a short check on the GPU machine after a fix: build-90a
# (sm_90a SASS only), then the tests named below, each bounded; output in
# $OUT/quick.txt. Usage: [FD_QUICK_FP8=1] [FD_QUICK_BENCH="bench_gpu.py flags"]
# [FD_QUICK_AB="cmake flags"] [FD_QUICK_NCU=<profile.sh mode>] [FD_QUICK_CTEST=1] [FD_QUICK_TESTS=0]
# [FD_QUICK_INTERLEAVE="bench_interleave.py flags;..."] [FD_QUICK_REL="groups"] [FD_QUICK_MEMCHECK=1]
# scripts/device_quick.sh (needs .deps/ carried; .whl/ for FlashInfer peers).
OUT=${OUT:-/tmp/fd-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/quick.txt") 2>&1
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/device_env.sh
. scripts/device_env.sh # DEPS, LD_LIBRARY_PATH, qbuild
t0=$(date +%s)
# FD_QUICK_AB="cmake flags": a second tree, build-90a-b, with those flags (e.g.
# "-DCMAKE_CUDA_FLAGS=-DFD_MMA_WIDE_FP8=0" on branch fp8-wide), built beside the first; the
# benchmark (FD_QUICK_BENCH) then runs on both, the second's files tagged ab.
if [ -n "${FD_QUICK_AB:-}" ]; then
  # read as shell words, so one flag may hold spaces:
  # FD_QUICK_AB="'-DCMAKE_CUDA_FLAGS=-DA=0 -DB=0'"
  abflags=()
  eval "abflags=($FD_QUICK_AB)"
  qbuild build-90a-b /tmp/qb-b.txt "${abflags[@]}" & pb=$!
fi
qbuild build-90a /tmp/qb.txt || { echo BUILD FAILED; tail -30 /tmp/qb.txt; exit 1; }
if [ -n "${FD_QUICK_AB:-}" ]; then
  wait $pb || { echo "BUILD FAILED (build-90a-b)"; tail -30 /tmp/qb-b.txt; exit 1; }
fi
echo "== built in $(( $(date +%s) - t0 ))s"
export FLASHDECODE_LIBRARY="$PWD/build-90a/libflashdecode.so" PYTHONPATH="$PWD/python"
run() { local t=$1; shift; echo "== $* (t=$(( $(date +%s) - t0 ))s)"; timeout "$t" "$@" 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | tail -25; echo "   exit ${PIPESTATUS[0]}"; }
if [ "${FD_QUICK_TESTS:-1}" = 0 ]; then # FD_QUICK_TESTS=0: no tests (a benchmark-only call)
  echo "== no tests (FD_QUICK_TESTS=0)"
elif [ "${FD_QUICK_ROWS:-0}" = 1 ]; then # after a rows-kernel change (rows_mma_kernel.cu)
  # its grid cases (FD_QUICK_CTEST=1 runs the whole grid later), bad page ids, the cascade example,
  # memcheck and racecheck
  [ "${FD_QUICK_CTEST:-0}" = 1 ] || FD_TEST_FILTER='cuda/*noncausal*' run 120 build-90a/tests/test_gpu_grid
  FD_TEST_FILTER='bad_page_ids_skipped_or_refused' run 120 build-90a/tests/reliability/test_reliability_gpu layout
  run 60 python3 examples/shared_prefix_decode.py --device cuda --batch 40 --q-len 2
  FD_TEST_QUICK=1 FD_TEST_FILTER='cuda/*noncausal*' run 180 \
    compute-sanitizer --tool memcheck --error-exitcode 99 build-90a/tests/test_gpu_grid
  # racecheck: two rows-kernel cases (page ids a key: page_size 48; one a tile: 16, head_dim 64)
  for f in 'cuda/*/d128/h16:2/*noncausal*' 'cuda/*/d64/h12:4/*noncausal*'; do
    FD_TEST_QUICK=1 FD_TEST_FILTER="$f" run 120 \
      compute-sanitizer --tool racecheck --error-exitcode 99 build-90a/tests/test_gpu_grid
  done
elif [ "${FD_QUICK_FP8:-0}" = 1 ]; then # after an fp8 kernel change: fp8, then the 16-bit grid
  run 60 build-90a/tests/test_gpu_fp8_grid
  run 30 build-90a/tests/test_gpu_append
  run 20 build-90a/tests/test_variants cuda
  run 60 python3 -m pytest -x -q --tb=short -p no:cacheprovider tests/python/test_cuda_fp8.py
  [ "${FD_QUICK_RACE:-1}" = 1 ] && FD_TEST_QUICK=1 FD_TEST_FILTER='cuda/*d128*' run 120 \
    compute-sanitizer --tool racecheck --error-exitcode 99 build-90a/tests/test_gpu_fp8_grid
  run 30 build-90a/tests/reliability/test_reliability_gpu variants
  # FD_QUICK_REL="group ...": those reliability groups too (quick mode, 60 s each)
  for grp in ${FD_QUICK_REL:-}; do
    FD_TEST_QUICK=1 run 60 build-90a/tests/reliability/test_reliability_gpu "$grp"
  done
  # FD_QUICK_MEMCHECK=1: compute-sanitizer memcheck of the 16-bit grid's bf16 d128 cases
  [ "${FD_QUICK_MEMCHECK:-0}" = 1 ] && FD_TEST_QUICK=1 FD_TEST_FILTER='cuda/bf16/d128*' run 120 \
    compute-sanitizer --tool memcheck --error-exitcode 99 build-90a/tests/test_gpu_grid
else
  run 20 build-90a/tests/test_variants cuda
  run 30 build-90a/tests/test_gpu_append
  FD_TEST_FILTER='cuda/*softcap*' run 20 build-90a/tests/test_gpu_grid
  run 40 build-90a/tests/reliability/test_reliability_gpu trust
  run 30 python3 -m pytest -x -q --tb=short -p no:cacheprovider tests/python/test_cuda_fp8.py
  run 20 build-90a/tests/reliability/test_reliability_gpu variants
  run 20 build-90a/tests/reliability/test_reliability_gpu graphs
fi
# FD_QUICK_CTEST=1: then every GPU test of build-90a (ctest -L gpu)
if [ "${FD_QUICK_CTEST:-0}" = 1 ]; then
  echo "== ctest -L gpu (t=$(( $(date +%s) - t0 ))s)"
  (cd build-90a && timeout 300 ctest -L gpu --output-on-failure 2>&1 | grep -E "Test +#|tests passed|FAIL|Error|error" | tail -40)
fi
# FD_QUICK_BENCH="bench_gpu.py flags": then the benchmark on build-90a (FlashInfer from
# .whl/ when carried), its files under $OUT
if [ -n "${FD_QUICK_BENCH:-}" ]; then
  if ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/site .whl/*.whl >/tmp/qpip.txt 2>&1; then
    export PYTHONPATH="$PYTHONPATH:/tmp/site" CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")") \
      FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fd-flashinfer-jit MAX_JOBS=$(nproc)
  fi
  # qbench BUILD OUTDIR LOG [more bench_gpu.py flags]: the benchmark on BUILD's library
  qbench() {
    local b=$1 out=$2 log=$3; shift 3
    # shellcheck disable=SC2086
    FLASHDECODE_LIBRARY="$PWD/$b/libflashdecode.so" FD_READ_PROBE_LIBRARY="$PWD/$b/libfd_read_probe.so" \
      timeout 300 python3 bench/bench_gpu.py --out-dir "$out" --traces bench/data \
      --commit "${FD_COMMIT:-$(git rev-parse --short HEAD)}" --log-dir "/tmp/fd-bench-logs-$b" \
      $FD_QUICK_BENCH "$@" >"$log" 2>&1
    echo "   exit $?"; sed -n '/^=====/,$p' "$log"
  }
  echo "== bench_gpu.py $FD_QUICK_BENCH (t=$(( $(date +%s) - t0 ))s)"
  qbench build-90a "$OUT" /tmp/qbench.txt
  if [ -n "${FD_QUICK_AB:-}" ]; then
    echo "== the same on build-90a-b ($FD_QUICK_AB) (t=$(( $(date +%s) - t0 ))s)"
    qbench build-90a-b "$OUT/ab" /tmp/qbench-b.txt --tag ab
    # one file for the second build's results: at most 8 files come back
    tar -C "$OUT" -czf "$OUT/ab.tgz" ab && rm -rf "$OUT/ab"
  fi
fi
# FD_QUICK_INTERLEAVE="flags[;flags...]": bench_interleave.py once per ';'-separated flag set
# (a model's GEMM and small kernels between attention calls), on build-90a
if [ -n "${FD_QUICK_INTERLEAVE:-}" ]; then
  IFS=';' read -ra isets <<<"$FD_QUICK_INTERLEAVE"
  for fl in "${isets[@]}"; do
    echo "== bench_interleave.py $fl (t=$(( $(date +%s) - t0 ))s)"
    # shellcheck disable=SC2086
    PYTHONPATH="$PYTHONPATH:bench" timeout 240 python3 bench/bench_interleave.py $fl 2>&1 |
      grep -v "UserWarning\|_warn_once"
  done
fi
# FD_QUICK_NCU=<mode> (fp8, rows, d64, paged, ...; 1 = fp8): Nsight Compute through
# dev/cuda/profile.sh's mode of that name, on build-90a and on build-90a-b when FD_QUICK_AB
# built it; everything the mode wrote goes to $OUT/ncu-<mode>.txt
if [ "${FD_QUICK_NCU:-0}" != 0 ]; then
  mode=$FD_QUICK_NCU; [ "$mode" = 1 ] && mode=fp8
  for b in build-90a build-90a-b; do
    [ -x $b/flashdecode ] || continue
    echo "== profile.sh $mode, $b (t=$(( $(date +%s) - t0 ))s)"
    FD_BIN=$b/flashdecode bash dev/cuda/profile.sh /tmp/qncu-$b "$mode" 2>&1 | tail -120
    for f in /tmp/qncu-$b/ncu-*.txt; do echo "==== $b $(basename "$f")"; cat "$f"; done >>"$OUT/ncu-$mode.txt"
  done
fi
# FD_QUICK_FP8=1, last: the 16-bit GPU grid, until FD_QUICK_END_S (default 330) seconds
if [ "${FD_QUICK_FP8:-0}" = 1 ]; then
  lim=$(( ${FD_QUICK_END_S:-330} - ($(date +%s) - t0) )); [ "$lim" -lt 30 ] && lim=30
  echo "== test_gpu_grid, up to ${lim}s (t=$(( $(date +%s) - t0 ))s)"
  timeout "$lim" build-90a/tests/test_gpu_grid >/tmp/qgrid.txt 2>&1
  echo "   exit $? after $(( $(date +%s) - t0 ))s; $(grep -c '^\[       OK' /tmp/qgrid.txt) OK"
  grep -E "^\[  (ERROR|FAILED|PASSED)|^\[ RUN" /tmp/qgrid.txt | tail -4
fi
echo "== done t=$(( $(date +%s) - t0 ))s"
