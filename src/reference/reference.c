/*
 * reference.c — the float64 oracle and the reference backend.
 *
 * fd_reference_f64 is decode attention written as plainly as possible: one
 * thread, no splits, every product and sum in double, inputs widened exactly
 * (dtype.h; an fp8 cache's values times their scales, also exact).
 * fd_reference_run rounds that result once to the plan's out dtype.
 * The tests compare every other backend against these two functions.
 */
#include <math.h>
#include <stdlib.h>

#include "dtype.h"
#include "internal.h"
#include "row_keys.h"

/* double -> float rounding toward zero with the last bit set when inexact
 * ("round to odd"). float keeps more than two bits beyond fp16 and bf16, so
 * rounding this float to nearest even gives the correctly rounded fp16/bf16
 * value of x: the reference rounds its result exactly once. */
static float round_to_odd(double x) {
  float f = (float)x;
  if ((double)f == x || isnan(x)) return f;
  uint32_t u = fd_f32_to_bits(f);
  if (fabs((double)f) > fabs(x)) u -= 1; /* step back toward zero (inf -> FLT_MAX) */
  return fd_bits_to_f32(u | 1u);
}

/* Writes x as element i of a tensor of `dtype`, rounded to nearest even. */
static void store_elem(void *base, fd_dtype dtype, int64_t i, double x) {
  switch (dtype) {
    case FD_DTYPE_F32: ((float *)base)[i] = (float)x; break;
    case FD_DTYPE_F16: ((uint16_t *)base)[i] = fd_f32_to_f16(round_to_odd(x)); break;
    case FD_DTYPE_BF16: ((uint16_t *)base)[i] = fd_f32_to_bf16(round_to_odd(x)); break;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* never an out dtype (plan.c) */
  }
}

/* Element offset of position j of sequence b, kv head hk, in a K or V cache
 * with `strides` (contiguous: {batch, position, head}; paged: {page,
 * position, head} through the block table). */
static int64_t kv_offset(const fd_plan *plan, const fd_tensors *t, const int64_t strides[3],
                         int32_t b, int32_t j, int32_t hk) {
  int32_t page_size = plan->problem.page_size;
  if (page_size == 0) return (int64_t)b * strides[0] + (int64_t)j * strides[1] + (int64_t)hk * strides[2];
  int32_t page = t->block_table[(int64_t)b * t->block_table_stride + j / page_size];
  return (int64_t)page * strides[0] + (int64_t)(j % page_size) * strides[1] +
         (int64_t)hk * strides[2];
}

/* The scale of position j of sequence b, kv head hk, in `scale` (k_scale or
 * v_scale): 1 without scales. */
static double kv_scale_at(const fd_plan *plan, const fd_tensors *t, const float *scale, int32_t b,
                          int32_t j, int32_t hk) {
  if (plan->problem.kv_scale == FD_KV_SCALE_NONE) return 1.0;
  return scale[fd_scale_index(plan, t->block_table, t->block_table_stride, t->scale_strides, b, j,
                              hk)];
}

fd_status fd_reference_f64(const fd_plan *plan, const fd_tensors *t,
                           double *out64, /* [batch][q_len][num_heads_q][head_dim] */
                           double *lse64, /* [batch][num_heads_q][q_len], may be NULL */
                           fd_error *err) {
  const fd_problem *p = &plan->problem;
  const int32_t batch = p->batch, q_len = p->q_len, num_heads_q = p->num_heads_q;
  const int32_t head_dim = p->head_dim;
  const int32_t group = p->num_heads_q / p->num_heads_kv; /* query heads per kv head */
  const double scale = plan->softmax_scale;

  int32_t longest = 1;
  for (int32_t b = 0; b < batch; b++)
    if (t->kv_len[b] > longest) longest = t->kv_len[b];
  double *att = malloc((size_t)longest * sizeof *att); /* [kv_len] scores of one row */
  if (!att)
    return fd_fail(err, FD_STATUS_OUT_OF_MEMORY, "reference: malloc of %d scores failed", longest);

  const int32_t window_left = p->window_left; /* resolved: -1 = no window */
  const double cap = p->logits_soft_cap;
  const int32_t rope_dim = p->rope_dim; /* MLA: > 0 */
  double q_row[FD_MAX_ROW_DIM]; /* [head_dim] q, then (MLA) [rope_dim] q_pe */
  for (int32_t b = 0; b < batch; b++) {
    for (int32_t tok = 0; tok < q_len; tok++) {
      for (int32_t h = 0; h < num_heads_q; h++) {
        const int32_t hk = h / group;
        /* visible keys [lo, hi) of all kv_len (fd_row_keys, row_keys.h:
         * the rule every backend follows) */
        int lo, hi;
        const int tree = p->tree_mask; /* keys of [lo, hi) the mask hides are skipped */
        const uint64_t mask = tree ? t->tree_mask[(int64_t)b * t->tree_mask_stride + tok] : 0;
        const int kv = t->kv_len[b];
        if (tree)
          fd_tree_row_keys(mask, q_len, kv, 0, kv, &lo, &hi);
        else
          fd_row_keys(tok, q_len, kv, window_left, p->non_causal, 0, kv, &lo, &hi);
        const int has_sink = t->sinks != NULL;
        const double sink = has_sink ? (double)t->sinks[h] : -INFINITY;
        double *o = out64 + (((int64_t)b * q_len + tok) * num_heads_q + h) * head_dim;
        double *lse = lse64 ? lse64 + ((int64_t)b * num_heads_q + h) * q_len + tok : NULL;
        for (int32_t d = 0; d < head_dim; d++) o[d] = 0.0;
        if (isnan(sink) || sink == INFINITY) { /* a blown-up sink: a NaN row */
          for (int32_t d = 0; d < head_dim; d++) o[d] = NAN;
          if (lse) *lse = NAN;
          continue;
        }
        if (hi <= lo) { /* no visible key: out 0, lse = log(exp(sink)) */
          if (lse) *lse = sink;
          continue;
        }

        const int64_t q_off = (int64_t)b * t->q_strides[0] + (int64_t)tok * t->q_strides[1] +
                              (int64_t)h * t->q_strides[2];
        for (int32_t d = 0; d < head_dim; d++) q_row[d] = fd_load_elem(t->q, p->dtype, q_off + d);
        if (rope_dim > 0) {
          const int64_t pe_off = (int64_t)b * t->q_pe_strides[0] +
                                 (int64_t)tok * t->q_pe_strides[1] + (int64_t)h * t->q_pe_strides[2];
          for (int32_t d = 0; d < rope_dim; d++)
            q_row[head_dim + d] = fd_load_elem(t->q_pe, p->dtype, pe_off + d);
        }

        /* scores (att[j - lo]) and their max, the sink included */
        double max = sink;
        for (int64_t j = lo; j < hi; j++) {
          if (tree && !fd_tree_key_seen(mask, q_len, kv, (int)j)) {
            att[j - lo] = -INFINITY; /* not seen: no weight, not read */
            continue;
          }
          const int64_t k_off = kv_offset(plan, t, t->k_strides, b, (int32_t)j, hk);
          /* an fp8 key is k_fp8 * k_scale: exact in double (4 + 24 bits) */
          const double ks = kv_scale_at(plan, t, t->k_scale, b, (int32_t)j, hk);
          double dot = 0.0;
          for (int32_t d = 0; d < head_dim; d++)
            dot += q_row[d] * (fd_load_elem(t->k_cache, p->kv_dtype, k_off + d) * ks);
          if (rope_dim > 0) { /* MLA: the rope part, scaled by k_scale when it is fp8 */
            const int64_t pe_off = kv_offset(plan, t, t->k_pe_strides, b, (int32_t)j, hk);
            const double rs = fd_dtype_is_fp8(p->rope_dtype) ? ks : 1.0;
            for (int32_t d = 0; d < rope_dim; d++)
              dot += q_row[head_dim + d] *
                     (fd_load_elem(t->k_pe_cache, p->rope_dtype, pe_off + d) * rs);
          }
          double x = scale * dot;
          if (cap > 0.0) x = cap * tanh(x / cap);
          att[j - lo] = x;
          if (x > max) max = x;
        }

        /* every score -inf (none NaN): no key has weight, as in a row
         * without keys (the CPU and CUDA backends agree) */
        if (max == -INFINITY) {
          int any_nan = 0;
          for (int64_t j = lo; j < hi; j++) any_nan |= isnan(att[j - lo]);
          if (!any_nan) {
            if (lse) *lse = sink;
            continue;
          }
        }

        /* softmax, max subtracted; the sink joins the denominator only */
        double sum = has_sink ? exp(sink - max) : 0.0;
        for (int64_t j = lo; j < hi; j++) {
          att[j - lo] = exp(att[j - lo] - max);
          sum += att[j - lo];
        }

        /* weighted sum of the values (MLA: k_cache's rows times k_scale) */
        const void *v_cache = rope_dim > 0 ? t->k_cache : t->v_cache;
        const int64_t *v_strides = rope_dim > 0 ? t->k_strides : t->v_strides;
        const float *v_scale = rope_dim > 0 ? t->k_scale : t->v_scale;
        for (int64_t j = lo; j < hi; j++) {
          if (tree && !fd_tree_key_seen(mask, q_len, kv, (int)j)) continue;
          const int64_t v_off = kv_offset(plan, t, v_strides, b, (int32_t)j, hk);
          const double vs = kv_scale_at(plan, t, v_scale, b, (int32_t)j, hk);
          const double w = att[j - lo] / sum;
          for (int32_t d = 0; d < head_dim; d++)
            o[d] += w * (fd_load_elem(v_cache, p->kv_dtype, v_off + d) * vs);
        }
        if (lse) *lse = max + log(sum);
        /* a non-finite output (NaN or Inf in a value the row sees) shows in lse too */
        for (int32_t d = 0; d < head_dim; d++)
          if (!isfinite(o[d]) && lse) *lse = NAN;
      }
    }
  }
  free(att);
  return fd_ok(err);
}

fd_status fd_reference_run(const fd_plan *plan, const fd_tensors *t, fd_error *err) {
  const fd_problem *p = &plan->problem;
  const int32_t batch = p->batch, q_len = p->q_len, num_heads_q = p->num_heads_q;
  const int32_t head_dim = p->head_dim;
  const size_t rows = (size_t)batch * q_len * num_heads_q;

  double *out64 = malloc(rows * head_dim * sizeof *out64); /* [batch][q_len][num_heads_q][head_dim] */
  double *lse64 = malloc(rows * sizeof *lse64);            /* [batch][num_heads_q][q_len] */
  if (!out64 || !lse64) {
    free(out64);
    free(lse64);
    return fd_fail(err, FD_STATUS_OUT_OF_MEMORY, "reference: malloc of %zu bytes of scratch failed",
                   rows * (head_dim + 1) * sizeof(double));
  }
  fd_status st = fd_reference_f64(plan, t, out64, lse64, err);
  if (st == FD_STATUS_OK) {
    for (int32_t b = 0; b < batch; b++) {
      for (int32_t tok = 0; tok < q_len; tok++) {
        for (int32_t h = 0; h < num_heads_q; h++) {
          const double *o = out64 + (((int64_t)b * q_len + tok) * num_heads_q + h) * head_dim;
          const int64_t out_off = (int64_t)b * t->out_strides[0] + (int64_t)tok * t->out_strides[1] +
                                  (int64_t)h * t->out_strides[2];
          for (int32_t d = 0; d < head_dim; d++) store_elem(t->out, p->out_dtype, out_off + d, o[d]);
          if (t->lse)
            t->lse[(int64_t)b * t->lse_strides[0] + (int64_t)h * t->lse_strides[1] +
                   (int64_t)tok * t->lse_strides[2]] =
                (float)lse64[((int64_t)b * num_heads_q + h) * q_len + tok];
        }
      }
    }
  }
  free(out64);
  free(lse64);
  return st;
}
