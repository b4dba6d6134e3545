/*
 * mla_bench.c — CPU timing of MLA decode against bf16 decode, in bytes of
 * cache read per second (dev/mla.md has the numbers). Not part of the build:
 *   cc -O2 -fopenmp -Iinclude dev/cpu/mla_bench.c build-cpu/libflashdecode.a -lm -o /tmp/mla_bench
 *   /tmp/mla_bench [threads]
 * Each shape's cache is larger than the last-level cache (32 MiB here), so
 * it comes from memory; best of 7 timed calls after 2 warm-up calls.
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

/* bf16 MLA, B=1, h query heads, q_len 1, n keys of [D | R]: the latent and
 * rope parts read; combined: one [D + R] row a key (two views). */
static void mla(int h, int D, int R, int n, int combined, int threads) {
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
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err)) {
    fprintf(stderr, "%s\n", err.message);
    exit(1);
  }
  uint16_t *q = malloc((size_t)h * D * 2), *qp = malloc((size_t)h * R * 2), *o = malloc((size_t)h * D * 2);
  uint16_t *ckv = malloc((size_t)n * (D + R) * 2), *kpe = combined ? ckv + D : malloc((size_t)n * R * 2);
  fill(q, (size_t)h * D, 1), fill(qp, (size_t)h * R, 4), fill(ckv, (size_t)n * (D + R), 2);
  if (!combined) fill(kpe, (size_t)n * R, 5);
  int32_t len = n;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q, t.q_pe = qp, t.k_cache = ckv, t.k_pe_cache = kpe, t.kv_len = &len, t.out = o;
  if (combined) {
    const int64_t s[3] = {(int64_t)n * (D + R), D + R, D + R};
    memcpy(t.k_strides, s, sizeof s);
    memcpy(t.k_pe_strides, s, sizeof s);
  }
  const double s = time_run(&plan, &t);
  const double bytes = (double)n * (D + R) * 2;
  printf("mla    bf16 B=1 h%d d%d+%d %dk keys %s, %d splits: %8.1f us  %6.2f GB/s  (%.1f MB)\n", h, D, R,
         n / 1024, combined ? "combined" : "separate", plan.num_splits, s * 1e6, bytes / s * 1e-9,
         bytes * 1e-6);
  free(q), free(qp), free(o), free(ckv);
  if (!combined) free(kpe);
}

int main(int argc, char **argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 0;
  decode(32, 8, 128, 32768, threads);
  decode(16, 1, 256, 131072, threads);
  mla(16, 512, 64, 65536, 1, threads);
  mla(16, 512, 64, 65536, 0, threads);
  mla(128, 512, 64, 65536, 1, threads);
  mla(1, 512, 64, 65536, 1, threads);
  return 0;
}
