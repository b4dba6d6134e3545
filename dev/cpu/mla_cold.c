/*
 * mla_cold.c — one CPU MLA shape (bf16, B=1, q_len 1) timed hot or cold,
 * with the rope part in its own cache or right after the latent (one
 * 576-wide row: two views). Not part of the build:
 *   cc -O2 -fopenmp -Iinclude dev/cpu/mla_cold.c build-cpu/libflashdecode.a -lm -o /tmp/mla_cold
 *   /tmp/mla_cold THREADS HEADS KV_LEN combined|separate SETS [ITERS]
 * SETS input sets are rotated (1: hot, the cache stays in L2/L3; enough for
 * ~2 GB: cold). Prints the median microseconds and ns a key per thread.
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

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 6) return 1;
  const int threads = atoi(argv[1]), h = atoi(argv[2]), n = atoi(argv[3]);
  const int combined = !strcmp(argv[4], "combined"), sets = atoi(argv[5]);
  const int iters = argc > 6 ? atoi(argv[6]) : 3 * sets > 30 ? 3 * sets : 30;
  const int D = 512, R = 64;
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
    return 1;
  }
  uint16_t *q = malloc((size_t)h * D * 2), *qp = malloc((size_t)h * R * 2), *o = malloc((size_t)h * D * 2);
  fill(q, (size_t)h * D, 1), fill(qp, (size_t)h * R, 4);
  fd_tensors *t = calloc(sets, sizeof *t);
  int32_t len = n;
  for (int s = 0; s < sets; s++) {
    uint16_t *ckv = malloc((size_t)n * (D + R) * 2), *kpe = combined ? ckv + D : ckv + (size_t)n * D;
    fill(ckv, (size_t)n * (D + R), 2 + s);
    t[s].q = q, t[s].q_pe = qp, t[s].k_cache = ckv, t[s].k_pe_cache = kpe, t[s].kv_len = &len;
    t[s].out = o;
    if (combined) {
      const int64_t st[3] = {(int64_t)n * (D + R), D + R, D + R};
      memcpy(t[s].k_strides, st, sizeof st);
      memcpy(t[s].k_pe_strides, st, sizeof st);
    }
  }
  void *ws = plan.workspace_size ? malloc(plan.workspace_size) : NULL;
  double *ts = malloc(iters * sizeof *ts);
  for (int i = 0; i < sets + 2; i++)
    fd_run(&plan, &t[i % sets], ws, plan.workspace_size, NULL, &err);
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
