/*
 * test_reliability.c — rel_main: runs the reliability tests of one
 * backend, one group or all of them, as one cmocka group. The two programs
 * are test_reliability_cpu.c and test_reliability_gpu.c:
 *   test_reliability_cpu [group]    test_reliability_gpu [group]
 * groups: numerics, layout, capacity, dispatch, concurrency, graphs (CUDA), trust,
 * variants, edges;
 * none = every group. The GPU program exits 77 (ctest: skipped) when the
 * CUDA backend is not available. FD_TEST_SEED fixes the inputs,
 * FD_TEST_FILTER selects tests by name (cmocka wildcards), FD_TEST_QUICK=1
 * shrinks every test to a few runs (the compute-sanitizer runs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rel.h"

#define MAX_TESTS 64

int rel_main(fd_backend backend, int argc, char **argv) {
  const char *tag = backend == FD_BACKEND_CUDA ? "cuda" : "cpu";
  if (argc > 2) {
    fprintf(stderr, "usage: %s [numerics|layout|capacity|dispatch|concurrency|graphs|trust|variants|edges]\n",
            argv[0]);
    return 2;
  }
  if (backend == FD_BACKEND_CUDA && !fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  static rel_env env;
  env.backend = backend;
  static const struct {
    const char *name;
    rel_group (*get)(fd_backend);
  } groups[] = {
      {"numerics", rel_group_numerics},       {"layout", rel_group_layout},
      {"capacity", rel_group_capacity},       {"dispatch", rel_group_dispatch},
      {"concurrency", rel_group_concurrency}, {"graphs", rel_group_graphs},
      {"trust", rel_group_trust},
      {"variants", rel_group_variants},       {"edges", rel_group_edges},
  };
  static struct CMUnitTest tests[MAX_TESTS];
  size_t count = 0;
  int found = 0;
  for (size_t i = 0; i < sizeof groups / sizeof *groups; i++) {
    if (argc == 2 && strcmp(argv[1], groups[i].name) != 0) continue;
    found = 1;
    const rel_group g = groups[i].get(backend);
    for (size_t k = 0; k < g.count && count < MAX_TESTS; k++) {
      tests[count] = g.tests[k];
      tests[count].initial_state = &env; /* every test gets the environment */
      count++;
    }
  }
  if (!found) {
    fprintf(stderr, "%s: unknown group %s\n", argv[0], argv[1]);
    return 2;
  }
  if (count == 0) {
    printf("SKIP: group %s has no %s tests\n", argv[1], tag);
    return 77;
  }
  env.seed = fd_test_seed();
  char name[64];
  snprintf(name, sizeof name, "reliability_%s%s%s", tag, argc == 2 ? "_" : "", argc == 2 ? argv[1] : "");
  printf("%s: %zu tests, FD_TEST_SEED=%llu%s\n", name, count, (unsigned long long)env.seed,
         rel_quick() ? " (FD_TEST_QUICK: reduced)" : "");
  fflush(stdout);
  const char *filter = getenv("FD_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  const int failed = _cmocka_run_group_tests(name, tests, count, NULL, NULL);
  if (failed) printf("%s: FD_TEST_SEED=%llu reproduces these inputs\n", name, (unsigned long long)env.seed);
  return failed ? 1 : 0;
}
