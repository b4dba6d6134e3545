/*
 * cpu_threads.c — fd_cpu_default_threads: OMP_NUM_THREADS when it is set to
 * a positive integer, else how many CPUs this process may run on (its
 * affinity mask, so taskset and container CPU sets are respected).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <stdlib.h>

#include <omp.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include "internal.h"

int fd_cpu_env_threads(const char *value) {
  if (!value) return 0;
  /* OpenMP's syntax: a positive integer, or a comma-separated list of them
   * (one per nesting level; the first is the outermost). Spaces around it
   * are allowed. Anything else is ignored, as libgomp ignores it. */
  while (*value == ' ' || *value == '\t') value++;
  if (*value < '0' || *value > '9') return 0;
  char *end = NULL;
  errno = 0;
  const long n = strtol(value, &end, 10);
  while (*end == ' ' || *end == '\t') end++;
  if (errno == ERANGE || n < 1 || (*end != '\0' && *end != ',')) return 0;
  return n > FD_MAX_THREADS ? FD_MAX_THREADS : (int)n;
}

int fd_cpu_default_threads(void) {
  const int env = fd_cpu_env_threads(getenv("OMP_NUM_THREADS"));
  if (env > 0) return env;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n > FD_MAX_THREADS ? FD_MAX_THREADS : n;
  }
#endif
  /* more CPUs than a cpu_set_t holds, or not Linux */
  int n = omp_get_num_procs();
  if (n > FD_MAX_THREADS) n = FD_MAX_THREADS;
  return n > 0 ? n : 1;
}
