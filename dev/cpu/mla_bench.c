/*
 * mla_bench.c — CPU timing of MLA decode against bf16 decode, in bytes of
 * cache read per second (dev/mla.md has the numbers). Not part of the build:
 *   cc -O2 -fopenmp -Iinclude dev/cpu/mla_bench.c build-cpu/libflashdecode.a -lm -o /tmp/mla_bench
 *   /tmp/mla_bench [threads]
 *     Each shape's cache is larger than the last-level cache (32 MiB here), so
 *     it comes from memory; best of 7 timed calls after 2 warm-up calls.
 *   /tmp/mla_bench cold THREADS HEADS KV_LEN combined|separate SETS [ITERS]
 *     One MLA shape (bf16, B=1, q_len 1, 512 + 64) hot or cold: SETS input
 *     sets rotated (1: hot, the cache stays in L2/L3; enough for ~2 GB:
 *     cold); the median microseconds and ns a key per thread.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashdecode.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill(uint16_t *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (uint16_t)(0x3f80 | (seed >> 25)) ^ (uint16_t)((seed >> 16 & 1) << 15);
  }
}

static double time_run(const fd_plan *plan, const fd_tensors *t) {
  void *ws = plan->workspace_size ? malloc(plan->workspace_size) : NULL;
  fd_error err;
  double best = 1e30;
  for (int i = 0; i < 9; i++) {
    const double t0 = now();
    if (fd_run(plan, t, ws, plan->workspace_size, NULL, &err) != FD_STATUS_OK) {
      fprintf(stderr, "fd_run: %s\n", err.message);
      exit(1);
    }
    const double dt = now() - t0;
    if (i >= 2 && dt < best) best = dt;
  }
  free(ws);
  return best;
}

/* bf16 decode, B=1, hq/hkv heads, head_dim d, n keys: K and V read. */
static void decode(int hq, int hkv, int d, int n, int threads) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 1;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = d;
  p.kv_capacity = n;
  p.num_threads = threads;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err)) {
    fprintf(stderr, "%s\n", err.message);
    exit(1);
  }
  const size_t kv = (size_t)n * hkv * d;
  uint16_t *q = malloc((size_t)hq * d * 2), *k = malloc(kv * 2), *v = malloc(kv * 2),
           *o = malloc((size_t)hq * d * 2);
  fill(q, (size_t)hq * d, 1), fill(k, kv, 2), fill(v, kv, 3);
  int32_t len = n;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q, t.k_cache = k, t.v_cache = v, t.kv_len = &len, t.out = o;
  const double s = time_run(&plan, &t);
  const double bytes = 2.0 * kv * 2;
  printf("decode bf16 B=1 %d/%d d%d %dk keys, %d splits: %8.1f us  %6.2f GB/s  (%.1f MB)\n", hq, hkv, d,
         n / 1024, plan.num_splits, s * 1e6, bytes / s * 1e-9, bytes * 1e-6);
  free(q), free(k), free(v), free(o);
}

/* The CPU plan of bf16 MLA, B=1, h query heads, q_len 1, D + R columns, n keys. */
static void mla_plan(fd_plan *plan, int h, int D, int R, int n, int threads) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 1;
  p.num_heads_q = h;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.rope_dim = R;
  p.softmax_scale = 0.0721f;
  p.kv_capacity = n;
  p.num_threads = threads;
  fd_error err;
  if (fd_plan_init(plan, &p, &err)) {
    fprintf(stderr, "%s\n", err.message);
    exit(1);
  }
}

/* A cache of n keys filled from `seed` into t: combined, one [D + R] row a
 * key (two views); else the k_pe rows after the c_kv ones. */
static void mla_cache(fd_tensors *t, int D, int R, int n, int combined, uint32_t seed) {
  uint16_t *ckv = malloc((size_t)n * (D + R) * 2);
  fill(ckv, (size_t)n * (D + R), seed);
  t->k_cache = ckv;
  t->k_pe_cache = combined ? ckv + D : ckv + (size_t)n * D;
  if (combined) {
    const int64_t s[3] = {(int64_t)n * (D + R), D + R, D + R};
    memcpy(t->k_strides, s, sizeof s);
    memcpy(t->k_pe_strides, s, sizeof s);
  }
}

/* bf16 MLA, B=1, h query heads, q_len 1, n keys of [D | R]: the latent and
 * rope parts read; combined: one [D + R] row a key (two views). */
static void mla(int h, int D, int R, int n, int combined, int threads) {
  fd_plan plan;
  mla_plan(&plan, h, D, R, n, threads);
  uint16_t *q = malloc((size_t)h * D * 2), *qp = malloc((size_t)h * R * 2), *o = malloc((size_t)h * D * 2);
  fill(q, (size_t)h * D, 1), fill(qp, (size_t)h * R, 4);
  int32_t len = n;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q, t.q_pe = qp, t.kv_len = &len, t.out = o;
  mla_cache(&t, D, R, n, combined, 2);
  const double s = time_run(&plan, &t);
  const double bytes = (double)n * (D + R) * 2;
  printf("mla    bf16 B=1 h%d d%d+%d %dk keys %s, %d splits: %8.1f us  %6.2f GB/s  (%.1f MB)\n", h, D, R,
         n / 1024, combined ? "combined" : "separate", plan.num_splits, s * 1e6, bytes / s * 1e-9,
         bytes * 1e-6);
  free(q), free(qp), free(o), free((void *)t.k_cache);
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* `cold` (the header): one shape's median over `iters` calls rotating `sets` caches. */
static int cold(int threads, int h, int n, int combined, int sets, int iters) {
  const int D = 512, R = 64;
  fd_plan plan;
  mla_plan(&plan, h, D, R, n, threads);
  uint16_t *q = malloc((size_t)h * D * 2), *qp = malloc((size_t)h * R * 2), *o = malloc((size_t)h * D * 2);
  fill(q, (size_t)h * D, 1), fill(qp, (size_t)h * R, 4);
  fd_tensors *t = calloc(sets, sizeof *t);
  int32_t len = n;
  for (int s = 0; s < sets; s++) {
    t[s].q = q, t[s].q_pe = qp, t[s].kv_len = &len, t[s].out = o;
    mla_cache(&t[s], D, R, n, combined, 2 + s);
  }
  void *ws = plan.workspace_size ? malloc(plan.workspace_size) : NULL;
  double *ts = malloc(iters * sizeof *ts);
  fd_error err;
  for (int i = 0; i < sets + 2; i++) fd_run(&plan, &t[i % sets], ws, plan.workspace_size, NULL, &err);
  for (int i = 0; i < iters; i++) {
    const double t0 = now();
    if (fd_run(&plan, &t[i % sets], ws, plan.workspace_size, NULL, &err) != FD_STATUS_OK) {
      fprintf(stderr, "fd_run: %s\n", err.message);
      return 1;
    }
    ts[i] = now() - t0;
  }
  qsort(ts, iters, sizeof *ts, cmp);
  const double med = ts[iters / 2];
  printf("h%d %dk %s sets=%d threads=%d: %.0f us  %.1f ns/key/thread  %.2f GB/s\n", h, n / 1024,
         combined ? "combined" : "separate", sets, threads, med * 1e6, med * 1e9 * threads / n,
         (double)n * (D + R) * 2 / med * 1e-9);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "cold")) {
    if (argc < 7) return 1;
    const int sets = atoi(argv[6]);
    return cold(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), !strcmp(argv[5], "combined"), sets,
                argc > 7 ? atoi(argv[7]) : 3 * sets > 30 ? 3 * sets : 30);
  }
  const int threads = argc > 1 ? atoi(argv[1]) : 0;
  decode(32, 8, 128, 32768, threads);
  decode(16, 1, 256, 131072, threads);
  mla(16, 512, 64, 65536, 1, threads);
  mla(16, 512, 64, 65536, 0, threads);
  mla(128, 512, 64, 65536, 1, threads);
  mla(1, 512, 64, 65536, 1, threads);
  return 0;
}
