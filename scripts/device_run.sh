#!/usr/bin/env bash
# device_run.sh — everything the GPU machine does, in one call:
#   build (CUDA sm_90a), every test incl. GPU ones (ctest), compute-sanitizer
#   (memcheck, racecheck, initcheck, synccheck) on the GPU tests, the Python
#   tests, `generate --backend cuda --check`, a CLI bench table, and the peer
#   benchmark (bench/bench_gpu.py).
# Usage: scripts/device_run.sh [all|test|bench] [extra bench_gpu.py args...]
# Writes logs and results under $OUT (default /tmp/fd-out). Needs .deps/ (cmocka
# unpacked from Debian's packages, see scripts/fetch_device_deps.sh) and
# shared_data/traces carried with the call.
set -u
MODE=${1:-all}
shift || true
OUT=${OUT:-/tmp/fd-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
COMMIT=${FD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "== flashdecode device run: mode=$MODE commit=$COMMIT date=$(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
nvcc --version | tail -2

DEPS="$PWD/.deps/root/usr"
status=0
step() { echo; echo "== $*"; }

step build
t0=$(date +%s)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu" \
  -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_C_FLAGS="-I$DEPS/include" >"$OUT/build.txt" 2>&1 &&
  cmake --build build -j "$(nproc)" >>"$OUT/build.txt" 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.txt"; exit 1; }
echo "build ok in $(( $(date +%s) - t0 )) s"
grep -E "registers|spill" "$OUT/build.txt" | grep -E "Used|spill" | sort | uniq -c | sort -rn | head -20
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  step "ctest (all tests, GPU included)"
  (cd build && ctest --output-on-failure -j 4 --timeout 600) >"$OUT/ctest.txt" 2>&1 || status=1
  grep -E "FAIL|ERROR|Test +#|tests passed" "$OUT/ctest.txt" | tail -60

  step "compute-sanitizer on the GPU tests"
  # memcheck runs every GPU case; the slower racecheck/initcheck/synccheck run
  # the head_dim 128 cases (every kernel and dtype) and the quick reliability set.
  SAN="$OUT/sanitizer.txt"; : >"$SAN"
  for bin in $(find build/tests -type f -executable -name '*gpu*' | sort); do
    for tool in memcheck racecheck initcheck synccheck; do
      filter=""; [ "$tool" = memcheck ] || filter='cuda/*d128*'
      case "$bin" in *reliability*|*rel_*) filter="" ;; esac
      echo "-- $tool $bin ${filter:+(filter $filter)}" | tee -a "$SAN"
      FD_TEST_QUICK=1 FD_TEST_FILTER="$filter" timeout 240 compute-sanitizer --tool "$tool" \
        --error-exitcode 99 "$bin" >>"$SAN" 2>&1
      rc=$?; echo "   exit $rc" | tee -a "$SAN"
      [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$SAN" | tail -1
    done
  done

  step "generate --backend cuda --check"
  ./build/flashdecode generate --backend cuda --check --ids 2>&1 | tee "$OUT/generate.txt" | tail -12
  step "generate --backend cpu (reference story)"
  ./build/flashdecode generate --backend cpu 2>&1 | tail -4

  step "python tests"
  export FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python"
  python3 -m pytest -q tests/python 2>&1 | tail -25; rc=${PIPESTATUS[0]}
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1

  step "CLI bench (B=1, 32/8, d128, bf16)"
  for n in 1024 4096 16384 131072; do
    ./build/flashdecode bench --backend cuda --batch 1 --num-heads-q 32 --num-heads-kv 8 \
      --head-dim 128 --kv-len $n --dtype bf16 2>&1 | tail -1
  done
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  step "peer benchmark"
  export FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python"
  python3 bench/bench_gpu.py --out-dir "$OUT" --traces shared_data/traces --commit "$COMMIT" "$@" 2>&1 | tail -80
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo; echo "== done, status $status"
exit $status
