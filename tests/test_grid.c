/*
 * test_grid.c — the CPU backend against the float64 oracle over the case grid
 * of grid_cases.c (checks and tolerances: harness.c). FD_TEST_SEED fixes the
 * inputs, FD_TEST_FILTER selects cases by name.
 */
#include "harness.h"

#define MAX_CASES 256

int main(void) {
  static fd_case cases[MAX_CASES];
  int n = fd_grid_cases(FD_BACKEND_CPU, cases, MAX_CASES);
  return fd_run_case_group("cpu_grid", cases, n);
}
