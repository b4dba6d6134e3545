/*
 * scales.c — the fp8 scale arguments of fd_run and fd_append_kv
 * (flashdecode.h, FP8 KV CACHE): which pointers a plan's kv_scale needs,
 * the per-token layout's default strides, and the host-side check of the
 * values the CPU and reference backends will read.
 */
#include <math.h>

#include "internal.h"
#include "row_keys.h"

static const char *scale_name(fd_kv_scale s) {
  switch (s) {
    case FD_KV_SCALE_NONE: return "FD_KV_SCALE_NONE";
    case FD_KV_SCALE_TENSOR: return "FD_KV_SCALE_TENSOR";
    case FD_KV_SCALE_HEAD: return "FD_KV_SCALE_HEAD";
    case FD_KV_SCALE_TOKEN: return "FD_KV_SCALE_TOKEN";
  }
  return "an invalid kv_scale";
}

fd_status fd_check_scale_args(const fd_plan *plan, const float *k_scale, const float *v_scale,
                              const int64_t strides_in[3], int64_t strides[3], fd_error *err) {
  const fd_problem *p = &plan->problem;
  const float *ptr[2] = {k_scale, v_scale};
  const char *name[2] = {"k_scale", "v_scale"};
  for (int i = 0; i < 2; i++) {
    if (i == 1 && p->rope_dim > 0) { /* MLA: the values are c_kv * k_scale */
      if (ptr[i])
        return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                       "v_scale: given with rope_dim %d; MLA's values are k_cache's rows, scaled "
                       "by k_scale (pass NULL)",
                       p->rope_dim);
      continue;
    }
    if (p->kv_scale == FD_KV_SCALE_NONE && ptr[i])
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "%s: given, but the plan's kv_scale is FD_KV_SCALE_NONE (set kv_scale to "
                     "the scales' granularity, or pass NULL)", name[i]);
    if (p->kv_scale != FD_KV_SCALE_NONE && !ptr[i])
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: NULL, but the plan's kv_scale is %s",
                     name[i], scale_name(p->kv_scale));
    if ((uintptr_t)ptr[i] % sizeof(float))
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: not aligned to a float", name[i]);
  }
  for (int i = 0; i < 3; i++)
    if (strides_in[i] < 0)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "scale_strides: stride %d is %lld, must be >= 0",
                     i, (long long)strides_in[i]);
  if (strides_in[0] == 0 && strides_in[1] == 0 && strides_in[2] == 0) {
    /* dense [batch or page, position, head] */
    const int64_t rows = p->page_size > 0 ? p->page_size : plan->kv_capacity;
    strides[2] = 1;
    strides[1] = p->num_heads_kv;
    strides[0] = rows * p->num_heads_kv;
  } else {
    for (int i = 0; i < 3; i++) strides[i] = strides_in[i];
  }
  return FD_STATUS_OK;
}

/* 1 when s is a usable scale: finite and > 0. */
static int scale_ok(float s) { return s > 0.0f && isfinite(s); }

static fd_status bad_scale(fd_error *err, const char *name, int64_t i, float s) {
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s[%lld]: %g, must be finite and > 0", name,
                 (long long)i, (double)s);
}

fd_status fd_check_host_scale_values(const fd_plan *plan, const fd_tensors *t, fd_error *err) {
  const fd_problem *p = &plan->problem;
  if (p->kv_scale == FD_KV_SCALE_NONE) return FD_STATUS_OK;
  const float *ptr[2] = {t->k_scale, t->v_scale};
  const char *name[2] = {"k_scale", "v_scale"};
  const int scales = p->rope_dim > 0 ? 1 : 2; /* MLA: k_scale only */
  if (p->kv_scale != FD_KV_SCALE_TOKEN) {
    const int64_t n = p->kv_scale == FD_KV_SCALE_HEAD ? p->num_heads_kv : 1;
    for (int w = 0; w < scales; w++)
      for (int64_t i = 0; i < n; i++)
        if (!scale_ok(ptr[w][i])) return bad_scale(err, name[w], i, ptr[w][i]);
    return FD_STATUS_OK;
  }
  /* per token: the positions some row sees, [fd_first_seen_key, kv_len) */
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t n = t->kv_len[b];
    for (int32_t j = fd_first_seen_key(n, p->q_len, p->window_left); j < n; j++)
      for (int32_t hk = 0; hk < p->num_heads_kv; hk++) {
        const int64_t i = fd_scale_index(plan, t->block_table, t->block_table_stride,
                                         t->scale_strides, b, j, hk);
        for (int w = 0; w < scales; w++)
          if (!scale_ok(ptr[w][i]))
            return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                           "%s[%lld]: %g (sequence %d, position %d, kv head %d), must be finite "
                           "and > 0",
                           name[w], (long long)i, (double)ptr[w][i], b, j, hk);
      }
  }
  return FD_STATUS_OK;
}
