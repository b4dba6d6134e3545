#!/usr/bin/env bash
# Device call 1, short form (twelfth session, ~400 s of device time left): issue 37's A/B against
# 8ec7257 (.base carried) on the whole grid, 3 rounds (Nsight Compute of the +1.5 % row if time
# is left), then the GPU tests that exercise the changed split kernel: the reliability suite's
# edges (windows near INT32_MAX), numerics and variants, the fp8 grid, and the grid (quick).
OUT=${OUT:-/tmp/fd-out}
export FD_COMMIT=${FD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
FD_DEADLINE_S=250 FD_ARCHS=90a-real FD_AB_TESTS=0 FD_AB_ROUNDS=3 \
  FD_AB_NCU=b1-h32/8-d128-bf16-n4096 timeout 260 scripts/device_run.sh ab >"$OUT/ab-log.txt" 2>&1
grep -v "read ceiling" "$OUT/ab-log.txt" | tail -40
(cd build && timeout 70 ctest -j 4 --timeout 65 --output-on-failure \
  -R "rel_gpu_edges|rel_gpu_numerics|rel_gpu_variants|test_gpu_variants|test_gpu_fp8_grid") \
  >"$OUT/ctest-gpu.txt" 2>&1
grep -E "Test +#|tests passed|FAILED" "$OUT/ctest-gpu.txt" | tail -10
FD_TEST_QUICK=1 timeout 60 build/tests/test_gpu_grid >"$OUT/test-gpu-grid-quick.txt" 2>&1
echo "test_gpu_grid (quick) exit $?"; tail -3 "$OUT/test-gpu-grid-quick.txt"
