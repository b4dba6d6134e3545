/*
 * membw.h — the machine's memory read bandwidth, measured by a plain
 * multithreaded read loop (what `bench --backend cpu` compares against), and
 * the size of the last-level cache (to make benchmark data outgrow it).
 */
#ifndef FD_CLI_MEMBW_H
#define FD_CLI_MEMBW_H

#include <stddef.h>

typedef struct membw_result {
  double read_gbps;    /* median over the timed passes of the best stream count, 1e9 bytes/s */
  double best_gbps;    /* fastest pass of any stream count */
  int streams;         /* sequential streams per thread of read_gbps (1, 4 or 8) */
  size_t bytes;        /* buffer size read per pass */
  int threads;         /* OpenMP threads that read */
  int passes;          /* timed passes (after one untimed pass) */
  const char *isa;     /* "avx512", "avx2" or "scalar": the loads used */
} membw_result;

/* The last-level cache in bytes (sysconf, then sysfs); 0 when unknown. */
size_t membw_llc_bytes(void);

/* Reads a buffer of max(1 GiB, 8 x LLC) bytes (at most 4 GiB and a quarter of
 * physical memory), first touched by the threads that read it, with `threads`
 * OpenMP threads, each summing its contiguous share 64 bytes a load (SIMD when
 * the CPU has it) as 1, 4 and 8 interleaved sequential streams (a core's
 * hardware prefetchers serve several streams at once: on the dev box one
 * stream per thread reads ~2/3 of what 8 do). For each stream count one
 * untimed pass, then `passes` timed ones; the best median is the result.
 * Returns 0, or -1 when the buffer cannot be allocated. */
int membw_measure(int threads, int passes, membw_result *result);

#endif /* FD_CLI_MEMBW_H */
