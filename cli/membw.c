/*
 * membw.c — memory read bandwidth by a plain read loop (see membw.h): every
 * thread sums the 64-byte lines of its contiguous share of a buffer far
 * larger than the last-level cache, as 1, 4 or 8 sequential streams;
 * bandwidth = bytes / wall time of the parallel region; median over passes,
 * best stream count.
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "membw.h"
#include "timer.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MEMBW_X86 1
#include <immintrin.h>
#endif

#define GIB ((size_t)1 << 30)
#define MAX_PASSES 64

size_t membw_llc_bytes(void) {
  long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  if (v > 0) return (size_t)v;
  /* sysfs: the highest cache index of cpu0, e.g. "32768K" */
  size_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[96], text[32];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (fgets(text, sizeof text, f)) {
      char *end;
      unsigned long long n = strtoull(text, &end, 10);
      if (*end == 'K') n <<= 10;
      else if (*end == 'M') n <<= 20;
      if (n > best) best = (size_t)n;
    }
    fclose(f);
  }
  return best;
}

/*
 * Sum of the 64-bit words of [p, p + bytes) (bytes a multiple of 64), read
 * as S concurrent sequential streams: the range is cut into S equal parts and
 * each loop step loads one 64-byte line of every part. One stream per thread
 * leaves bandwidth unused on many CPUs (each core's L2 streamer tracks a few
 * streams), so the caller tries several S and keeps the best.
 */
#define MEMBW_MAX_STREAMS 8
#ifdef MEMBW_X86
static inline __attribute__((always_inline, target("avx512f"))) uint64_t
sum_avx512(const char *p, size_t bytes, const int S) {
  __m512i acc[MEMBW_MAX_STREAMS];
  for (int k = 0; k < S; k++) acc[k] = _mm512_setzero_si512();
  const size_t part = bytes / (size_t)S / 64 * 64;
  for (size_t i = 0; i < part; i += 64)
    for (int k = 0; k < S; k++)
      acc[k] = _mm512_add_epi64(acc[k], _mm512_load_si512((const void *)(p + (size_t)k * part + i)));
  for (size_t i = part * (size_t)S; i < bytes; i += 64)
    acc[0] = _mm512_add_epi64(acc[0], _mm512_load_si512((const void *)(p + i)));
  for (int k = 1; k < S; k++) acc[0] = _mm512_add_epi64(acc[0], acc[k]);
  /* lane by lane in unsigned arithmetic (the intrinsic's reduction adds signed
   * 64-bit lanes, and the sum of arbitrary bytes may overflow them) */
  uint64_t lanes[8], sum = 0;
  _mm512_storeu_si512((void *)lanes, acc[0]);
  for (int k = 0; k < 8; k++) sum += lanes[k];
  return sum;
}

static inline __attribute__((always_inline, target("avx2"))) uint64_t
sum_avx2(const char *p, size_t bytes, const int S) {
  __m256i acc[MEMBW_MAX_STREAMS];
  for (int k = 0; k < S; k++) acc[k] = _mm256_setzero_si256();
  const size_t part = bytes / (size_t)S / 64 * 64;
  for (size_t i = 0; i < part; i += 64)
    for (int k = 0; k < S; k++) {
      const char *q = p + (size_t)k * part + i;
      acc[k] = _mm256_add_epi64(acc[k], _mm256_add_epi64(_mm256_load_si256((const __m256i *)q),
                                                         _mm256_load_si256((const __m256i *)(q + 32))));
    }
  for (size_t i = part * (size_t)S; i < bytes; i += 32)
    acc[0] = _mm256_add_epi64(acc[0], _mm256_load_si256((const __m256i *)(p + i)));
  for (int k = 1; k < S; k++) acc[0] = _mm256_add_epi64(acc[0], acc[k]);
  uint64_t lanes[4];
  _mm256_storeu_si256((__m256i *)lanes, acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

static inline uint64_t sum_scalar(const char *p, size_t bytes, const int S) {
  uint64_t acc[MEMBW_MAX_STREAMS] = {0};
  const size_t part = bytes / (size_t)S / 64 * 64;
  for (size_t i = 0; i < part; i += 64)
    for (int k = 0; k < S; k++) {
      const uint64_t *w = (const uint64_t *)(const void *)(p + (size_t)k * part + i);
      acc[k] += w[0] + w[1] + w[2] + w[3] + w[4] + w[5] + w[6] + w[7];
    }
  for (size_t i = part * (size_t)S; i < bytes; i += 8) acc[0] += *(const uint64_t *)(const void *)(p + i);
  uint64_t total = 0;
  for (int k = 0; k < S; k++) total += acc[k];
  return total;
}

/* The streams tried, and one function per (instruction set, streams). */
static const int stream_counts[] = {1, 4, 8};
#define MEMBW_CONFIGS 3
#ifdef MEMBW_X86
__attribute__((target("avx512f"))) static uint64_t sum_avx512_1(const char *p, size_t n) { return sum_avx512(p, n, 1); }
__attribute__((target("avx512f"))) static uint64_t sum_avx512_4(const char *p, size_t n) { return sum_avx512(p, n, 4); }
__attribute__((target("avx512f"))) static uint64_t sum_avx512_8(const char *p, size_t n) { return sum_avx512(p, n, 8); }
__attribute__((target("avx2"))) static uint64_t sum_avx2_1(const char *p, size_t n) { return sum_avx2(p, n, 1); }
__attribute__((target("avx2"))) static uint64_t sum_avx2_4(const char *p, size_t n) { return sum_avx2(p, n, 4); }
__attribute__((target("avx2"))) static uint64_t sum_avx2_8(const char *p, size_t n) { return sum_avx2(p, n, 8); }
#endif
static uint64_t sum_scalar_1(const char *p, size_t n) { return sum_scalar(p, n, 1); }
static uint64_t sum_scalar_4(const char *p, size_t n) { return sum_scalar(p, n, 4); }
static uint64_t sum_scalar_8(const char *p, size_t n) { return sum_scalar(p, n, 8); }

typedef uint64_t (*sum_fn)(const char *, size_t);

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median GB/s of `passes` timed passes (after one untimed) of `sum` over the
 * buffer, `threads` threads each on its contiguous share. */
static double measure_config(char *buf, size_t bytes, int threads, int passes, sum_fn sum,
                             double *best) {
  double gbps[MAX_PASSES];
  volatile uint64_t sink = 0;
  for (int pass = -1; pass < passes; pass++) { /* pass -1: untimed */
    uint64_t total = 0;
    const double t0 = timer_seconds();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
      const size_t part = bytes / (size_t)n / 4096 * 4096;
      const size_t len = t == n - 1 ? bytes - part * (size_t)t : part;
      total += sum(buf + part * (size_t)t, len);
    }
    const double dt = timer_seconds() - t0;
    sink += total;
    if (pass >= 0) gbps[pass] = (double)bytes / dt / 1e9;
  }
  (void)sink;
  qsort(gbps, (size_t)passes, sizeof gbps[0], compare_doubles);
  if (gbps[passes - 1] > *best) *best = gbps[passes - 1];
  return passes % 2 ? gbps[passes / 2] : 0.5 * (gbps[passes / 2 - 1] + gbps[passes / 2]);
}

int membw_measure(int threads, int passes, membw_result *r) {
  memset(r, 0, sizeof *r);
  if (threads < 1) threads = 1;
  if (passes < 1) passes = 1;
  if (passes > MAX_PASSES) passes = MAX_PASSES;
  size_t bytes = 8 * membw_llc_bytes();
  if (bytes < GIB) bytes = GIB;
  if (bytes > 4 * GIB) bytes = 4 * GIB;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes > (size_t)pages * (size_t)page / 4)
    bytes = (size_t)pages * (size_t)page / 4;
  /* every thread's share a multiple of 4 KiB */
  const size_t share = bytes / (size_t)threads / 4096 * 4096;
  if (share == 0) return -1;
  bytes = share * (size_t)threads;
  char *buf = aligned_alloc(4096, bytes);
  if (!buf) return -1;

  sum_fn sums[MEMBW_CONFIGS] = {sum_scalar_1, sum_scalar_4, sum_scalar_8};
  r->isa = "scalar";
#ifdef MEMBW_X86
  if (__builtin_cpu_supports("avx512f")) {
    sums[0] = sum_avx512_1, sums[1] = sum_avx512_4, sums[2] = sum_avx512_8;
    r->isa = "avx512";
  } else if (__builtin_cpu_supports("avx2")) {
    sums[0] = sum_avx2_1, sums[1] = sum_avx2_4, sums[2] = sum_avx2_8;
    r->isa = "avx2";
  }
#endif

  /* first touch by the reading thread (its NUMA node), nonzero data */
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const size_t part = bytes / (size_t)n / 4096 * 4096;
    const size_t len = t == n - 1 ? bytes - part * (size_t)t : part;
    memset(buf + part * (size_t)t, 1 + t, len);
  }

  r->best_gbps = 0.0;
  for (int c = 0; c < MEMBW_CONFIGS; c++) {
    const double median = measure_config(buf, bytes, threads, passes, sums[c], &r->best_gbps);
    if (median > r->read_gbps) {
      r->read_gbps = median;
      r->streams = stream_counts[c];
    }
  }
  free(buf);
  r->bytes = bytes;
  r->threads = threads;
  r->passes = passes;
  return 0;
}
