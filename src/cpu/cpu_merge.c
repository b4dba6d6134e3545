/*
 * cpu_merge.c — fd_cpu_merge: fd_merge_states on the host (CPU and reference
 * backends), one output row at a time, OpenMP over rows.
 *
 * Row r = (b * q_len + t) * num_heads + h is out's row (dense
 * [batch, q_len, num_heads, head_dim]); its lse sits at
 * li = (b * num_heads + h) * q_len + t, and state s's at states_lse[s * rows + li],
 * its out_s at states_out[(s * rows + r) * head_dim].
 *
 *   m = max_s lse_s,  w_s = exp(lse_s - m),  L = sum_s w_s,
 *   out = sum_s w_s out_s / L,  lse = m + log(L)
 *
 * in double, states in increasing s (reproducible whatever the threads). A
 * state with lse_s = -inf is skipped and its out_s never read, so
 * (-inf) - (-inf) is never formed; a row whose states are all empty gets
 * out = 0 and lse = -inf. A NaN or +inf lse_s makes the whole row NaN (out
 * and lse).
 */
#include <math.h>

#include "cpu_kernels.h"

static void merge_row(const fd_merge_problem *p, const void *states_out, const float *states_lse,
                      void *out, float *lse, int64_t rows, int64_t r) {
  const int64_t H = p->num_heads, T = p->q_len, S = p->num_states;
  const int D = p->head_dim;
  const int64_t h = r % H, t = r / H % T, b = r / (H * T);
  const int64_t li = (b * H + h) * T + t;
  const size_t in_size = fd_dtype_size(p->dtype);

  double m = -INFINITY;
  int bad = 0; /* a NaN or +inf lse_s */
  for (int64_t s = 0; s < S && !bad; s++) {
    const float x = states_lse[s * rows + li];
    if (!(x < INFINITY))
      bad = 1;
    else if (x > m)
      m = x;
  }

  float out_row[FD_MAX_MLA_HEAD_DIM]; /* [head_dim] */
  float lse_row;
  if (bad || m == -INFINITY) {
    const float fill = bad ? NAN : 0.0f;
    for (int d = 0; d < D; d++) out_row[d] = fill;
    lse_row = bad ? NAN : -INFINITY;
  } else {
    double acc[FD_MAX_MLA_HEAD_DIM] = {0}; /* [head_dim] sum_s w_s out_s */
    float x_s[FD_MAX_MLA_HEAD_DIM]; /* [head_dim] out_s widened */
    double L = 0.0;
    for (int64_t s = 0; s < S; s++) {
      const float x = states_lse[s * rows + li];
      if (x == -INFINITY) continue; /* empty: neutral, out_s not read */
      const double w = exp((double)x - m);
      L += w;
      fd_cpu_load_row(x_s, (const char *)states_out + (s * rows + r) * D * (int64_t)in_size, p->dtype, D);
      for (int d = 0; d < D; d++) acc[d] += w * x_s[d];
    }
    /* L >= 1: the state holding the max contributes exp(0). */
    for (int d = 0; d < D; d++) out_row[d] = (float)(acc[d] / L);
    lse_row = (float)(m + log(L));
  }
  fd_cpu_store_row((char *)out + r * D * (int64_t)fd_dtype_size(p->out_dtype), p->out_dtype, out_row, D);
  if (lse) lse[li] = lse_row;
}

fd_status fd_cpu_merge(const fd_merge_problem *p, const void *states_out, const float *states_lse,
                       void *out, float *lse, fd_error *err) {
  const int64_t rows = (int64_t)p->batch * p->q_len * p->num_heads;
  /* Threads only when there is enough to merge (~64k elements each). */
  int64_t threads = rows * p->num_states * p->head_dim / 65536 + 1;
  const int64_t cores = fd_cpu_default_threads();
  if (threads > cores) threads = cores;
  if (threads > rows) threads = rows;
#pragma omp parallel for num_threads((int)threads) schedule(static)
  for (int64_t r = 0; r < rows; r++) merge_row(p, states_out, states_lse, out, lse, rows, r);
  return fd_ok(err);
}
