/*
 * test_fp8_grid.c — the CPU backend with fp8 KV caches against the float64
 * oracle over the cases of fp8_cases.c (checks and tolerances: harness.c;
 * FD_TEST_SEED fixes the inputs, FD_TEST_FILTER selects cases by name).
 */
#include "harness.h"

#define MAX_CASES 64

int main(void) {
  static fd_case cases[MAX_CASES];
  int n = fd_fp8_grid_cases(FD_BACKEND_CPU, cases, MAX_CASES);
  return fd_run_case_group("cpu_fp8_grid", cases, n);
}
