#!/usr/bin/env bash
# Device call 2 (twelfth session, on the warm machine of call 1: ./build exists): memcheck of the
# grid's bf16 d128 cases, the MLA kernels' stall profile, then the 16-core CPU sweep and bench.
OUT=${OUT:-/tmp/fd-out}
FD_TEST_QUICK=1 FD_TEST_FILTER='cuda/bf16/d128/*' timeout 90 compute-sanitizer --tool memcheck \
  --error-exitcode 99 build/tests/test_gpu_grid >"$OUT/san-grid-memcheck.txt" 2>&1
echo "memcheck exit $?"; tail -3 "$OUT/san-grid-memcheck.txt"
timeout 200 bash dev/cuda/mla_source_profile.sh
timeout 120 bash dev/cpu/cpu16_call.sh >/dev/null 2>&1; grep -E "^T=|^1 |^2 " "$OUT/cpu16.txt" | head -40
timeout 170 python3 bench/bench_cpu.py --out-dir "$OUT" --build-dir build --no-generate \
  --budget-s 0.5 >"$OUT/bench-cpu-log.txt" 2>&1
grep -E "target|read bandwidth" "$OUT/bench-cpu-log.txt"
