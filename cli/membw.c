/*
 * membw.c — memory read bandwidth by a plain read loop (see membw.h): every
 * thread sums the 64-byte lines of its contiguous share of a buffer far
 * larger than the last-level cache; bandwidth = bytes / wall time of the
 * parallel region; median over passes.
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

/* Sum of the 64-bit words of [p, p + bytes), bytes a multiple of 256. */
#ifdef MEMBW_X86
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const char *p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
  }
  return (uint64_t)_mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const char *p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t lanes[4];
  _mm256_storeu_si256((__m256i *)lanes, s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

static uint64_t sum_scalar(const char *p, size_t bytes) {
  const uint64_t *w = (const uint64_t *)(const void *)p;
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i < bytes / 8; i += 8) { /* one 64-byte line per step */
    a0 += w[i] + w[i + 4];
    a1 += w[i + 1] + w[i + 5];
    a2 += w[i + 2] + w[i + 6];
    a3 += w[i + 3] + w[i + 7];
  }
  return a0 + a1 + a2 + a3;
}

typedef uint64_t (*sum_fn)(const char *, size_t);

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
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

  sum_fn sum = sum_scalar;
  r->isa = "scalar";
#ifdef MEMBW_X86
  if (__builtin_cpu_supports("avx512f")) {
    sum = sum_avx512;
    r->isa = "avx512";
  } else if (__builtin_cpu_supports("avx2")) {
    sum = sum_avx2;
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
  free(buf);

  qsort(gbps, (size_t)passes, sizeof gbps[0], compare_doubles);
  r->read_gbps = passes % 2 ? gbps[passes / 2] : 0.5 * (gbps[passes / 2 - 1] + gbps[passes / 2]);
  r->best_gbps = gbps[passes - 1];
  r->bytes = bytes;
  r->threads = threads;
  r->passes = passes;
  return 0;
}
