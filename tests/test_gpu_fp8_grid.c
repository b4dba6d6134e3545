/*
 * test_gpu_fp8_grid.c — the CUDA backend with fp8 KV caches against the
 * float64 oracle over the cases of fp8_cases.c (each also run twice, bitwise
 * equal). Exits 77 (ctest: skipped) when no usable GPU is present.
 */
#include <stdio.h>

#include "harness.h"

#define MAX_CASES 64

int main(void) {
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no sm_90 GPU)\n");
    return 77;
  }
  static fd_case cases[MAX_CASES];
  int n = fd_fp8_grid_cases(FD_BACKEND_CUDA, cases, MAX_CASES);
  return fd_run_case_group("gpu_fp8_grid", cases, n);
}
