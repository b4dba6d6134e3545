#!/usr/bin/env bash
# Device call 1, smallest form (~200 s of device time left): the A/B against 8ec7257 (.base
# carried) on the B=1 32/8 d128 rows (the +1.5 % row among them), 3 rounds, then the reliability
# suite's GPU edges (windows near INT32_MAX) and numerics.
OUT=${OUT:-/tmp/fd-out}
export FD_COMMIT=${FD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
FD_DEADLINE_S=185 FD_AB_NEED_S=40 FD_ARCHS=90a-real FD_AB_TESTS=0 FD_AB_ROUNDS=3 \
  FD_AB_SHAPES=b1-h32/8-d128 timeout 190 scripts/device_run.sh ab >"$OUT/ab-log.txt" 2>&1
grep -v "read ceiling" "$OUT/ab-log.txt" | tail -32
(cd build && timeout 30 ctest --timeout 28 --output-on-failure -R "rel_gpu_edges|rel_gpu_numerics") \
  >"$OUT/ctest-gpu.txt" 2>&1
grep -E "Test +#|tests passed|FAILED" "$OUT/ctest-gpu.txt" | tail -4
