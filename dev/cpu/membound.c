/*
 * membound.c — CPU decode throughput in cache and from memory, per K/V
 * dtype (dev/cpu-memory-bound.md has the numbers). Not part of the build:
 *   cc -O2 -fopenmp -Iinclude dev/cpu/membound.c build-cpu/libflashdecode.a -lm -o /tmp/membound
 *   /tmp/membound threads hkv batch dtype kv_mb [hot]
 * dtype: f32 bf16 f16 e4m3 e5m2 (fp8: q bf16, tensor scales). hot: one input
 * set called again and again (K+V of kv_mb should fit the caches: the
 * kernels' compute rate); else sets rotated over >= 256 MiB (from memory).
 * FD_HUGE=1: K and V on transparent huge pages (madvise). MB_SPIN=n: n
 * untimed calls before the timed ones (for perf record).
 * Median of 21 timed calls after the warm-up; prints us and GB/s of K+V,
 * by the wall clock and by the process's CPU time per thread.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "flashdecode.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
/* CPU seconds of the whole process (all threads): on a shared machine the
 * wall time includes time the scheduler gave to others; cpu / threads does
 * not (but includes spinning at the region's barrier) */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* random bytes that are finite values of every dtype here (small exponents) */
static void fill(uint8_t *x, size_t n, size_t es, uint32_t seed) {
  for (size_t i = 0; i < n; i += es) {
    seed = seed * 1664525u + 1013904223u;
    if (es == 4) {
      const float f = ((seed >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
      memcpy(x + i, &f, 4);
    } else if (es == 2) {
      const uint16_t h = (uint16_t)(0x3800 | (seed >> 24)) ^ (uint16_t)((seed >> 16 & 1) << 15);
      const uint16_t b = (uint16_t)(0x3f00 | (seed >> 25)) ^ (uint16_t)((seed >> 16 & 1) << 15);
      memcpy(x + i, seed & 1 ? &h : &b, 2); /* overwritten per dtype below */
    } else {
      x[i] = (uint8_t)((seed >> 24) & 0x5f) | (uint8_t)(seed >> 16 & 0x80); /* no NaN codes */
    }
  }
}

/* n bytes, 2 MiB aligned; FD_HUGE=1 in the environment: madvise'd for
 * transparent huge pages (fewer TLB misses, which a VM pays twice) */
static void *alloc(size_t n) {
  const size_t a = 2u << 20, m = (n + a - 1) / a * a;
  void *p = aligned_alloc(a, m);
  const char *h = getenv("FD_HUGE");
  if (p && h && *h == '1') madvise(p, m, MADV_HUGEPAGE);
  return p;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: membound threads hkv batch dtype kv_mb [hot]\n");
    return 2;
  }
  const int threads = atoi(argv[1]), hkv = atoi(argv[2]), batch = atoi(argv[3]);
  const char *dt = argv[4];
  const double mb = atof(argv[5]);
  const int hot = argc > 6;
  const int hq = 32, d = 128;
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.batch = batch;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = d;
  p.num_threads = threads;
  size_t es = 2;
  if (!strcmp(dt, "f32")) p.dtype = FD_DTYPE_F32, es = 4;
  else if (!strcmp(dt, "bf16")) p.dtype = FD_DTYPE_BF16;
  else if (!strcmp(dt, "f16")) p.dtype = FD_DTYPE_F16;
  else if (!strcmp(dt, "e4m3") || !strcmp(dt, "e5m2")) {
    p.dtype = FD_DTYPE_BF16;
    p.kv_dtype = !strcmp(dt, "e4m3") ? FD_DTYPE_E4M3 : FD_DTYPE_E5M2;
    p.kv_scale = FD_KV_SCALE_TENSOR;
    es = 1;
  } else {
    fprintf(stderr, "dtype?\n");
    return 2;
  }
  const int n = (int)(mb * 1048576.0 / (2.0 * batch * hkv * d * es));
  p.kv_capacity = n;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err)) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  const size_t kv = (size_t)batch * n * hkv * d * es, qe = p.dtype == FD_DTYPE_F32 ? 4 : 2;
  const int sets = hot ? 1 : (int)((256.0 * 1048576.0) / (2.0 * kv)) + 1;
  fd_tensors *t = calloc((size_t)sets, sizeof *t);
  int32_t *len = malloc((size_t)batch * sizeof *len);
  for (int b = 0; b < batch; b++) len[b] = n;
  float one = 1.0f;
  for (int s = 0; s < sets; s++) {
    uint8_t *q = malloc((size_t)batch * hq * d * qe), *k = alloc(kv), *v = alloc(kv),
            *o = malloc((size_t)batch * hq * d * qe);
    fill(q, (size_t)batch * hq * d * qe, qe, 1 + s);
    fill(k, kv, es, 2 + s), fill(v, kv, es, 3 + s);
    if (es == 2 || qe == 2) { /* 16-bit: values in [1, 2) times +-1 of the dtype */
      uint16_t *x[3] = {(uint16_t *)q, es == 2 ? (uint16_t *)k : NULL, es == 2 ? (uint16_t *)v : NULL};
      size_t cnt[3] = {(size_t)batch * hq * d, kv / 2, kv / 2};
      for (int a = 0; a < 3; a++)
        for (size_t i = 0; x[a] && i < cnt[a]; i++)
          x[a][i] = (uint16_t)((x[a][i] & 0x807f) | (p.dtype == FD_DTYPE_F16 ? 0x3c00 : 0x3f80));
    }
    t[s].q = q, t[s].k_cache = k, t[s].v_cache = v, t[s].kv_len = len, t[s].out = o;
    if (es == 1) t[s].k_scale = &one, t[s].v_scale = &one;
  }
  void *ws = plan.workspace_size ? malloc(plan.workspace_size) : NULL;
  /* MB_SPIN=n: n more untimed calls first (a profile's samples) */
  const int warm = (sets > 3 ? sets : 3) + (getenv("MB_SPIN") ? atoi(getenv("MB_SPIN")) : 0), iters = 21;
  double us[64], cus[64];
  for (int i = 0; i < warm + iters; i++) {
    const double t0 = now(), c0 = cpu_now();
    if (fd_run(&plan, &t[i % sets], ws, plan.workspace_size, NULL, &err) != FD_STATUS_OK) {
      fprintf(stderr, "fd_run: %s\n", err.message);
      return 1;
    }
    if (i >= warm) us[i - warm] = (now() - t0) * 1e6, cus[i - warm] = (cpu_now() - c0) * 1e6 / threads;
  }
  qsort(us, iters, sizeof us[0], cmp);
  qsort(cus, iters, sizeof cus[0], cmp);
  const double med = us[iters / 2], cmed = cus[iters / 2];
  printf("threads=%d hkv=%d batch=%d dtype=%s mb=%.1f kv_len=%d splits=%d %s us=%.1f gbps=%.2f cpu_us=%.1f cpu_gbps=%.2f\n", threads,
         hkv, batch, dt, mb, n, plan.num_splits, hot ? "hot" : "cold", med, 2.0 * kv / med * 1e-3, cmed, 2.0 * kv / cmed * 1e-3);
  return 0;
}
