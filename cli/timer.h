/*
 * timer.h — wall-clock seconds from the monotonic clock (CPU timings).
 */
#ifndef FD_CLI_TIMER_H
#define FD_CLI_TIMER_H

#include <time.h>

static inline double timer_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* FD_CLI_TIMER_H */
