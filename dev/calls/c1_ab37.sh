#!/usr/bin/env bash
# Device call 1 (twelfth session): issue 37's A/B against 8ec7257 (.base carried) on the whole
# grid, 3 rounds, Nsight Compute of b1-h32/8-d128-bf16-n4096, then the GPU ctest tests (tree
# excluded: its kernels are unchanged) and memcheck of the grid's bf16 d128 cases.
OUT=${OUT:-/tmp/fd-out}
export FD_COMMIT=${FD_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
FD_DEADLINE_S=370 FD_ARCHS=90a-real FD_AB_TESTS=0 FD_AB_ROUNDS=3 \
  FD_AB_NCU=b1-h32/8-d128-bf16-n4096 timeout 380 scripts/device_run.sh ab >"$OUT/ab-log.txt" 2>&1
grep -v "read ceiling" "$OUT/ab-log.txt" | tail -45
(cd build && timeout 125 ctest -L gpu -j 4 -E "tree|mla" --timeout 120 --output-on-failure) >"$OUT/ctest-gpu.txt" 2>&1
grep -E "Test +#|tests passed|FAILED" "$OUT/ctest-gpu.txt" | tail -20
# what time is left: where the seesaw MLA kernel's warps wait (Nsight Compute source counters)
FD_PROFILE_KERNELS=fd_mla_seesaw_kernel FD_PROFILE_SWEEPS=0 timeout 70 bash dev/cuda/mla_source_profile.sh
