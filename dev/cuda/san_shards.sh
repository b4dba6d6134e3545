#!/usr/bin/env bash
# san_shards.sh — the compute-sanitizer runs that do not fit one call in series:
# racecheck of the GPU grid's bf16 d128 cases in FD_SAN_SHARDS parallel shards
# (FD_TEST_SHARD=k/n), then memcheck / racecheck / initcheck / synccheck of the
# GPU reliability suite (FD_TEST_QUICK=1), the four tools in parallel.
# Built in build-san/ (scripts/device_run.sh's build/ is left alone). Each run's log
# in $OUT/san-<name>.txt; a summary line each on stdout.
# Usage on the device: OUT=... dev/cuda/san_shards.sh   (FD_SAN_TIMEOUT: seconds a
# racecheck shard may take, 280; FD_SAN_REL_TIMEOUT: a reliability-suite run, 200)
set -u
OUT=${OUT:-/tmp/fd-out}
T=${FD_SAN_TIMEOUT:-280}
N=${FD_SAN_SHARDS:-4}
mkdir -p "$OUT"
start=$(date +%s)
cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real >/tmp/fd-b.txt 2>&1 &&
  cmake --build build-san -j "$(nproc)" --target test_gpu_grid test_reliability_gpu >>/tmp/fd-b.txt 2>&1 ||
  { tail -40 /tmp/fd-b.txt; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# run NAME TOOL FILTER SHARD BINARY: one compute-sanitizer run in the background
run() {
  (FD_TEST_QUICK=1 FD_TEST_FILTER="$3" FD_TEST_SHARD="$4" timeout "$T" \
     compute-sanitizer --tool "$2" --error-exitcode 99 "$5" >"$OUT/san-$1.txt" 2>&1
   echo "exit $?" >>"$OUT/san-$1.txt") &
}
summary() {
  for f in "$OUT"/san-$1*.txt; do
    printf '%s: %s cases OK, %s FAILED; %s; %s\n' "$(basename "$f" .txt)" \
      "$(grep -c '^\[       OK \]' "$f")" "$(grep -c '^\[  FAILED  \]' "$f")" \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1)" "$(tail -1 "$f")"
  done
}
for k in $(seq 0 $((N - 1))); do run "race-grid-$k" racecheck 'cuda/bf16/d128/*' "$k/$N" build-san/tests/test_gpu_grid; done
wait
echo "racecheck shards done at $(( $(date +%s) - start )) s"
summary race-grid
T=${FD_SAN_REL_TIMEOUT:-200}
for tool in memcheck racecheck initcheck synccheck; do run "rel-$tool" "$tool" "" "" build-san/tests/test_reliability_gpu; done
wait
echo "reliability suite done at $(( $(date +%s) - start )) s"
summary rel-
