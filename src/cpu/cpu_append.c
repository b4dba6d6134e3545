/*
 * cpu_append.c — fd_append_kv on the host (CPU and reference backends): the
 * value checks first (nothing is written unless all pass), then one copy or
 * quantization per new (token, kv head) row of k and of v. Quantization is
 * fp8.h's, the same code the CUDA kernel runs, so both write the same bits.
 */
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"

/* Element offset of position j of sequence b, kv head hk, in a cache with
 * `strides` (contiguous or through the block table). */
static int64_t cache_offset(const fd_plan *plan, const fd_append_tensors *t, const int64_t s[3],
                            int32_t b, int64_t j, int32_t hk) {
  const int32_t P = plan->problem.page_size;
  if (P == 0) return (int64_t)b * s[0] + j * s[1] + (int64_t)hk * s[2];
  const int32_t page = t->block_table[(int64_t)b * t->block_table_stride + j / P];
  return (int64_t)page * s[0] + (j % P) * s[1] + (int64_t)hk * s[2];
}

static fd_status check_values(const fd_plan *plan, const fd_append_tensors *t, int32_t n,
                              fd_error *err) {
  const fd_problem *p = &plan->problem;
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t len = t->kv_len[b];
    if (len < 0 || (int64_t)len + n > plan->kv_capacity)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "kv_len[%d]: %d + num_new %d is outside [0, kv_capacity = %d]", b, len, n,
                     plan->kv_capacity);
    if (p->page_size == 0) continue;
    const int32_t *row = t->block_table + (int64_t)b * t->block_table_stride;
    const int64_t first = len / p->page_size, last = ((int64_t)len + n - 1) / p->page_size;
    for (int64_t i = first; i <= last; i++)
      if (row[i] < 0 || (p->num_pages > 0 && row[i] >= p->num_pages))
        return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                       "block_table[%d][%lld]: page id %d is outside [0, num_pages = %d) (new "
                       "tokens of sequence %d go there)",
                       b, (long long)i, row[i], p->num_pages, b);
  }
  if (p->kv_scale == FD_KV_SCALE_TENSOR || p->kv_scale == FD_KV_SCALE_HEAD) {
    const int64_t count = p->kv_scale == FD_KV_SCALE_HEAD ? p->num_heads_kv : 1;
    const float *ptr[2] = {t->k_scale, t->v_scale};
    const char *name[2] = {"k_scale", "v_scale"};
    for (int w = 0; w < (p->rope_dim > 0 ? 1 : 2); w++) /* MLA: k_scale only */
      for (int64_t i = 0; i < count; i++)
        if (!(ptr[w][i] > 0.0f) || isinf(ptr[w][i]))
          return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s[%lld]: %g, must be finite and > 0",
                         name[w], (long long)i, (double)ptr[w][i]);
  }
  return FD_STATUS_OK;
}

/* One row: head_dim values of dtype at src into the cache at dst (element
 * offset), quantized for fp8 with the row's scale (*scale_slot: read for
 * TENSOR / HEAD, written for TOKEN; NULL for NONE). */
static void append_row(const fd_problem *p, const void *src, void *cache, int64_t dst,
                       float *scale_slot) {
  const int D = p->head_dim;
  if (p->kv_dtype == p->dtype) {
    const size_t e = fd_dtype_size(p->dtype);
    memcpy((char *)cache + dst * (int64_t)e, src, (size_t)D * e);
    return;
  }
  float x[FD_MAX_MLA_HEAD_DIM];
  for (int d = 0; d < D; d++) x[d] = fd_load_elem(src, p->dtype, d);
  float s = 1.0f;
  const float max_finite = p->kv_dtype == FD_DTYPE_E5M2 ? FD_E5M2_MAX : FD_E4M3_MAX;
  if (p->kv_scale == FD_KV_SCALE_TOKEN) {
    float amax = 0.0f;
    for (int d = 0; d < D; d++) amax = fmaxf(amax, fd_fp8_finite_abs(x[d]));
    s = fd_fp8_token_scale(amax, max_finite);
    *scale_slot = s;
  } else if (scale_slot) {
    s = *scale_slot;
  }
  uint8_t *o = (uint8_t *)cache + dst;
  const int e5m2 = p->kv_dtype == FD_DTYPE_E5M2;
  for (int d = 0; d < D; d++) o[d] = fd_fp8_quantize(x[d], s, e5m2);
}

/* MLA: one token's latent (head_dim values at src) and rope part (rope_dim
 * at pe_src) into the caches at element offsets dst / pe_dst. fp8: one
 * scale for both, TOKEN's computed over the latent and, when the rope part
 * is fp8, the rope part too; a 16-bit rope part is copied exactly. */
static void append_mla_row(const fd_problem *p, const void *src, const void *pe_src, void *cache,
                           int64_t dst, void *pe_cache, int64_t pe_dst, float *scale_slot) {
  const int D = p->head_dim, R = p->rope_dim;
  const size_t e = fd_dtype_size(p->dtype);
  if (!fd_dtype_is_fp8(p->kv_dtype)) { /* rope_dtype == kv_dtype == dtype */
    memcpy((char *)cache + dst * (int64_t)e, src, (size_t)D * e);
    memcpy((char *)pe_cache + pe_dst * (int64_t)e, pe_src, (size_t)R * e);
    return;
  }
  const int rope_fp8 = fd_dtype_is_fp8(p->rope_dtype);
  float x[FD_MAX_ROW_DIM];
  for (int d = 0; d < D; d++) x[d] = fd_load_elem(src, p->dtype, d);
  for (int d = 0; d < R; d++) x[D + d] = fd_load_elem(pe_src, p->dtype, d);
  float s = 1.0f;
  const float max_finite = p->kv_dtype == FD_DTYPE_E5M2 ? FD_E5M2_MAX : FD_E4M3_MAX;
  if (p->kv_scale == FD_KV_SCALE_TOKEN) {
    float amax = 0.0f;
    for (int d = 0; d < D + (rope_fp8 ? R : 0); d++) amax = fmaxf(amax, fd_fp8_finite_abs(x[d]));
    s = fd_fp8_token_scale(amax, max_finite);
    *scale_slot = s;
  } else if (scale_slot) {
    s = *scale_slot;
  }
  const int e5m2 = p->kv_dtype == FD_DTYPE_E5M2;
  uint8_t *o = (uint8_t *)cache + dst;
  for (int d = 0; d < D; d++) o[d] = fd_fp8_quantize(x[d], s, e5m2);
  if (rope_fp8) {
    uint8_t *po = (uint8_t *)pe_cache + pe_dst;
    for (int d = 0; d < R; d++) po[d] = fd_fp8_quantize(x[D + d], s, e5m2);
  } else {
    memcpy((char *)pe_cache + pe_dst * (int64_t)e, pe_src, (size_t)R * e);
  }
}

fd_status fd_host_append(const fd_plan *plan, const fd_append_tensors *t, int32_t n, fd_error *err) {
  fd_status st = check_values(plan, t, n, err);
  if (st != FD_STATUS_OK) return st;
  const fd_problem *p = &plan->problem;
  if (p->rope_dim > 0) {
    const size_t e = fd_dtype_size(p->dtype);
    for (int32_t b = 0; b < p->batch; b++)
      for (int32_t i = 0; i < n; i++) {
        const int64_t j = (int64_t)t->kv_len[b] + i;
        float *ks = p->kv_scale == FD_KV_SCALE_NONE
                        ? NULL
                        : t->k_scale + fd_scale_index(plan, t->block_table, t->block_table_stride,
                                                      t->scale_strides, b, (int32_t)j, 0);
        const int64_t kn = (int64_t)b * t->k_new_strides[0] + (int64_t)i * t->k_new_strides[1];
        const int64_t pn =
            (int64_t)b * t->k_pe_new_strides[0] + (int64_t)i * t->k_pe_new_strides[1];
        append_mla_row(p, (const char *)t->k_new + kn * (int64_t)e,
                       (const char *)t->k_pe_new + pn * (int64_t)e, t->k_cache,
                       cache_offset(plan, t, t->k_strides, b, j, 0), t->k_pe_cache,
                       cache_offset(plan, t, t->k_pe_strides, b, j, 0), ks);
      }
    return fd_ok(err);
  }
  const size_t e = fd_dtype_size(p->dtype);
  for (int32_t b = 0; b < p->batch; b++)
    for (int32_t i = 0; i < n; i++) {
      const int64_t j = (int64_t)t->kv_len[b] + i;
      for (int32_t hk = 0; hk < p->num_heads_kv; hk++) {
        float *ks = NULL, *vs = NULL;
        if (p->kv_scale != FD_KV_SCALE_NONE) {
          const int64_t si = fd_scale_index(plan, t->block_table, t->block_table_stride,
                                            t->scale_strides, b, (int32_t)j, hk);
          ks = t->k_scale + si;
          vs = t->v_scale + si;
        }
        const int64_t kn = (int64_t)b * t->k_new_strides[0] + (int64_t)i * t->k_new_strides[1] +
                           (int64_t)hk * t->k_new_strides[2];
        const int64_t vn = (int64_t)b * t->v_new_strides[0] + (int64_t)i * t->v_new_strides[1] +
                           (int64_t)hk * t->v_new_strides[2];
        append_row(p, (const char *)t->k_new + kn * (int64_t)e, t->k_cache,
                   cache_offset(plan, t, t->k_strides, b, j, hk), ks);
        append_row(p, (const char *)t->v_new + vn * (int64_t)e, t->v_cache,
                   cache_offset(plan, t, t->v_strides, b, j, hk), vs);
      }
    }
  return fd_ok(err);
}
