/*
 * cpu_combine.c — fd_cpu_combine: merges the per-split partials (O, m, l) of
 * every row into the normalised out and lse, in parallel over rows.
 *
 *   m* = max_s m_s,  l* = sum_s exp(m_s - m*) l_s,
 *   out = sum_s exp(m_s - m*) O_s / l*,  lse = m* + log(l*)
 *
 * over the splits s < fd_seq_active_splits(kv_len[b], ...), in increasing s (a
 * fixed order: reproducible). Sums are in double. An empty split (m = -inf)
 * adds nothing and is skipped, so (-inf) - (-inf) is never formed; a row with
 * no key at all (m* = -inf) gets out = 0 and lse = -inf (the sink's lse with
 * one). A split whose m or l is NaN (a blow-up in the inputs the row sees)
 * makes the row's out and lse NaN, whatever the split count.
 */
#include <math.h>

#include "cpu_kernels.h"
#include "split.h"

/* One row: row = (b * num_heads_q + h) * q_len + tok. */
static void combine_row(const fd_plan *plan, const fd_tensors *t,
                        const float *partial_o,  /* [rows][num_splits][head_dim] */
                        const float *partial_ml, /* [rows][num_splits][2] */
                        int64_t row) {
  const fd_problem *p = &plan->problem;
  const int head_dim = p->head_dim;
  const int32_t num_splits = plan->num_splits;
  const int32_t tok = (int32_t)(row % p->q_len);
  const int32_t h = (int32_t)(row / p->q_len % p->num_heads_q);
  const int32_t b = (int32_t)(row / ((int64_t)p->q_len * p->num_heads_q));
  const int32_t kv = t->kv_len[b];
  const int32_t active = fd_seq_active_splits(kv, p->q_len, p->window_left, plan->chunk_len,
                                              num_splits, fd_split_len_fixed(p));
  const float *ml = partial_ml + row * num_splits * 2;
  const float *o = partial_o + row * num_splits * head_dim;

  float m_star = -INFINITY;
  int blown = 0; /* a split's m or l is NaN: the row is NaN (never a silent number) */
  for (int32_t s = 0; s < active; s++) {
    if (ml[2 * s] > m_star) m_star = ml[2 * s];
    blown |= isnan(ml[2 * s]) || isnan(ml[2 * s + 1]);
  }

  double sum[FD_MAX_MLA_HEAD_DIM] = {0}; /* [head_dim] sum_s w_s O_s */
  double l_star = 0.0;
  if (m_star != -INFINITY) {
    for (int32_t s = 0; s < active; s++) {
      const float m_s = ml[2 * s];
      if (m_s == -INFINITY) continue; /* empty for this row */
      const double w = exp((double)m_s - (double)m_star);
      l_star += w * ml[2 * s + 1];
      const float *o_s = o + (int64_t)s * head_dim;
      for (int d = 0; d < head_dim; d++) sum[d] += w * o_s[d];
    }
  }

  /* l_star = 0: no key (out 0, lse -inf, or the sink's with one) */
  float out_row[FD_MAX_MLA_HEAD_DIM]; /* [head_dim] */
  double f, lse_d;
  fd_cpu_finish_row(m_star, blown ? NAN : l_star, t->sinks != NULL, t->sinks ? t->sinks[h] : 0.0,
                    &f, &lse_d);
  for (int d = 0; d < head_dim; d++) out_row[d] = (float)(sum[d] * f);
  const float lse = (float)lse_d;

  const int64_t out_off = (int64_t)b * t->out_strides[0] + (int64_t)tok * t->out_strides[1] +
                          (int64_t)h * t->out_strides[2];
  fd_cpu_store_row((char *)t->out + out_off * (int64_t)fd_dtype_size(p->out_dtype), p->out_dtype,
                   out_row, head_dim);
  if (t->lse)
    t->lse[(int64_t)b * t->lse_strides[0] + (int64_t)h * t->lse_strides[1] +
           (int64_t)tok * t->lse_strides[2]] = lse;
}

fd_status fd_cpu_combine(const fd_plan *plan, const fd_tensors *t, const float *partial_o,
                         const float *partial_ml, fd_error *err) {
  const int64_t rows = fd_num_rows(plan);
  /* Threads only when there is enough to merge (~64k floats each). */
  int64_t threads = rows * plan->num_splits * plan->problem.head_dim / 65536 + 1;
  if (threads > plan->num_threads) threads = plan->num_threads;
#pragma omp parallel for num_threads((int)threads) schedule(static)
  for (int64_t row = 0; row < rows; row++) combine_row(plan, t, partial_o, partial_ml, row);
  return fd_ok(err);
}
