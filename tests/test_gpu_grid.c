/*
 * test_gpu_grid.c — the CUDA backend against the float64 oracle over the case
 * grid of grid_cases.c (head_dim 64/128/256, plus long and ragged GPU-only
 * cases); every case also runs twice and must give bitwise identical output.
 * Exits 77 (ctest: skipped) when no usable GPU is present.
 */
#include <stdio.h>

#include "harness.h"

#define MAX_CASES 256

int main(void) {
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  static fd_case cases[MAX_CASES];
  int n = fd_grid_cases(FD_BACKEND_CUDA, cases, MAX_CASES);
  return fd_run_case_group("gpu_grid", cases, n);
}
