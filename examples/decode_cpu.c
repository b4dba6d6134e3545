/*
 * decode_cpu.c — a complete program around the C API (the README's snippet,
 * filled in): one decode step of GQA attention on the CPU backend over a
 * paged bf16 KV cache, checked against a plain double-precision softmax
 * attention. Built and run by `make test` (ctest: example_decode_cpu).
 *
 *   cc examples/decode_cpu.c $(pkg-config --cflags --libs flashdecode) -lm \
 *      -Wl,-rpath,$PREFIX/lib     (PREFIX: where `cmake --install` put the library)
 *
 * Layouts (elements, row-major):
 *   q      [batch, q_len, num_heads_q, head_dim]        bf16 (uint16_t bits)
 *   k, v   [num_pages, page_size, num_heads_kv, head_dim] bf16, pages picked by
 *   block_table [batch, max_pages_per_seq] int32, kv_len [batch] int32
 *   out    [batch, q_len, num_heads_q, head_dim]        bf16
 *   lse    [batch, num_heads_q, q_len]                  float (natural log)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashdecode.h>

enum { BATCH = 2, HQ = 8, HKV = 2, D = 64, PAGE = 16, MAX_PAGES = 8 };

/* bf16 <-> float: bf16 is the top half of a float (round to nearest even). */
static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

int main(void) {
  const int32_t kv_len[BATCH] = {100, 37}; /* keys each sequence has now */
  const int num_pages = BATCH * MAX_PAGES;
  int32_t block_table[BATCH][MAX_PAGES];
  for (int b = 0; b < BATCH; b++) /* sequence b owns pages b, b + BATCH, ... */
    for (int i = 0; i < MAX_PAGES; i++) block_table[b][i] = b + BATCH * i;

  const size_t kv_elems = (size_t)num_pages * PAGE * HKV * D;
  uint16_t *q = malloc(sizeof(uint16_t) * BATCH * HQ * D);
  uint16_t *k = malloc(sizeof(uint16_t) * kv_elems);
  uint16_t *v = malloc(sizeof(uint16_t) * kv_elems);
  uint16_t *out = malloc(sizeof(uint16_t) * BATCH * HQ * D);
  float lse[BATCH * HQ];
  if (!q || !k || !v || !out) return 1;
  srand(1);
  for (size_t i = 0; i < (size_t)BATCH * HQ * D; i++) q[i] = to_bf16(rand() / (float)RAND_MAX - 0.5f);
  for (size_t i = 0; i < kv_elems; i++) {
    k[i] = to_bf16(rand() / (float)RAND_MAX - 0.5f);
    v[i] = to_bf16(rand() / (float)RAND_MAX - 0.5f);
  }

  /* The problem: shapes and the cache's form; zero fields take defaults
   * (q_len 1, softmax_scale 1/sqrt(head_dim), automatic split count). */
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.batch = BATCH;
  p.num_heads_q = HQ;
  p.num_heads_kv = HKV;
  p.head_dim = D;
  p.page_size = PAGE;
  p.max_pages_per_seq = MAX_PAGES;
  p.num_pages = num_pages; /* page ids are checked against it */
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) {
    fprintf(stderr, "fd_plan_init: %s\n", err.message);
    return 1;
  }
  void *workspace = plan.workspace_size ? malloc(plan.workspace_size) : NULL;
  if (plan.workspace_size && !workspace) return 1;

  /* The tensors of this step (strides left 0: the dense layouts above). */
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q;
  t.k_cache = k;
  t.v_cache = v;
  t.kv_len = kv_len;
  t.block_table = &block_table[0][0];
  t.out = out;
  t.lse = lse;
  if (fd_run(&plan, &t, workspace, plan.workspace_size, NULL, &err) != FD_STATUS_OK) {
    fprintf(stderr, "fd_run: %s\n", err.message);
    return 1;
  }
  printf("%d splits, workspace %zu bytes, out[0][0][0][0..3] = %.4f %.4f %.4f %.4f, lse[0] = %.4f\n",
         plan.num_splits, plan.workspace_size, from_bf16(out[0]), from_bf16(out[1]),
         from_bf16(out[2]), from_bf16(out[3]), lse[0]);

  /* The same attention in double precision, straight from the definition. */
  double worst = 0.0, worst_lse = 0.0;
  const double scale = 1.0 / sqrt((double)D);
  for (int b = 0; b < BATCH; b++)
    for (int h = 0; h < HQ; h++) {
      const int hk = h / (HQ / HKV);
      size_t row[MAX_PAGES * PAGE]; /* element offset of key j's row of head hk */
      double p[MAX_PAGES * PAGE], mx = -INFINITY;
      for (int j = 0; j < kv_len[b]; j++) {
        row[j] = (((size_t)block_table[b][j / PAGE] * PAGE + j % PAGE) * HKV + hk) * D;
        double dot = 0.0;
        for (int d = 0; d < D; d++) dot += from_bf16(q[(b * HQ + h) * D + d]) * from_bf16(k[row[j] + d]);
        p[j] = dot * scale;
        if (p[j] > mx) mx = p[j];
      }
      double sum = 0.0;
      for (int j = 0; j < kv_len[b]; j++) sum += (p[j] = exp(p[j] - mx));
      for (int d = 0; d < D; d++) {
        double o = 0.0;
        for (int j = 0; j < kv_len[b]; j++) o += p[j] / sum * from_bf16(v[row[j] + d]);
        const double e = fabs(from_bf16(out[(b * HQ + h) * D + d]) - o);
        if (!(e <= worst)) worst = e; /* NaN propagates */
      }
      const double el = fabs(lse[b * HQ + h] - (mx + log(sum)));
      if (!(el <= worst_lse)) worst_lse = el;
    }
  printf("max |out - float64| = %.2e, max |lse - float64| = %.2e\n", worst, worst_lse);
  free(q);
  free(k);
  free(v);
  free(out);
  free(workspace);
  /* bf16 output: one rounding of values below 1 is at most 2^-9 */
  return worst <= 4e-3 && worst_lse <= 1e-4 ? 0 : 1;
}
