/*
 * cpu_threads.c — fd_cpu_default_threads: how many CPUs this process may run
 * on (its affinity mask, so taskset and container CPU sets are respected).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <omp.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include "internal.h"

int fd_cpu_default_threads(void) {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  /* more CPUs than a cpu_set_t holds, or not Linux */
  int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}
