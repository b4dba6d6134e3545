/*
 * append.c — fd_append_kv: argument checks, default strides, and dispatch to
 * the host code (CPU and reference backends, with the host-side value
 * checks) or the CUDA kernel (append_kernel.cu).
 */
#include <string.h>

#include "internal.h"

static int all_zero(const int64_t s[3]) { return s[0] == 0 && s[1] == 0 && s[2] == 0; }

/* strides = src, or for all-zero src the dense {d0 * d1 * d2, d1 * d2, d2}
 * of a [., d0, d1, d2] tensor; negative strides refused. */
static fd_status resolve(int64_t dst[3], const int64_t src[3], int64_t d0, int64_t d1, int64_t d2,
                         const char *name, fd_error *err) {
  if (all_zero(src)) {
    dst[2] = d2;
    dst[1] = d1 * d2;
    dst[0] = d0 * d1 * d2;
    return FD_STATUS_OK;
  }
  for (int i = 0; i < 3; i++) {
    if (src[i] < 0)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: stride %d is %lld, must be >= 0", name, i,
                     (long long)src[i]);
    dst[i] = src[i];
  }
  return FD_STATUS_OK;
}

/* The pointers that depend on rope_dim (the same rules as fd_run's): MLA
 * needs k_pe_new and k_pe_cache and takes no v_new / v_cache (its values
 * are the latent rows); standard attention the reverse. v_scale is
 * scales.c's. */
static fd_status check_mla_pointers(const fd_problem *p, const fd_append_tensors *in,
                                    fd_error *err) {
  if (p->rope_dim == 0) {
    if (!in->v_new) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "v_new: NULL");
    if (!in->v_cache) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "v_cache: NULL");
    if (in->k_pe_new)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "k_pe_new: given, but the plan's rope_dim is 0 (it is MLA's; pass NULL)");
    if (in->k_pe_cache)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "k_pe_cache: given, but the plan's rope_dim is 0 (it is MLA's; pass NULL)");
    return FD_STATUS_OK;
  }
  if (!in->k_pe_new)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "k_pe_new: NULL, but the plan's rope_dim is %d",
                   p->rope_dim);
  if (!in->k_pe_cache)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "k_pe_cache: NULL, but the plan's rope_dim is %d", p->rope_dim);
  if (in->v_new)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "v_new: given with rope_dim %d; MLA's values are the latent rows (k_new), pass "
                   "NULL",
                   p->rope_dim);
  if (in->v_cache)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "v_cache: given with rope_dim %d; MLA's values are k_cache's rows, pass NULL",
                   p->rope_dim);
  return FD_STATUS_OK;
}

fd_status fd_append_kv(const fd_plan *plan, const fd_append_tensors *tensors, int32_t num_new,
                       void *stream, fd_error *err) {
  if (!plan) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  if (plan->magic != FD_PLAN_MAGIC)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: not made by fd_plan_init (or it failed)");
  if (!tensors) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "tensors: NULL");
  if (num_new < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_new: %d, must be >= 0", num_new);
  const fd_problem *p = &plan->problem;
  const fd_append_tensors *in = tensors;
  if (!in->k_new) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "k_new: NULL");
  if (!in->k_cache) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "k_cache: NULL");
  fd_status st;
  if ((st = check_mla_pointers(p, in, err))) return st;
  if (!in->kv_len) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "kv_len: NULL");
  if (p->page_size > 0 && !in->block_table)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "block_table: NULL for a paged cache");
  if (in->block_table_stride < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "block_table_stride: %lld, must be >= 0",
                   (long long)in->block_table_stride);

  fd_append_tensors t = *in;
  const int64_t D = p->head_dim, H = p->num_heads_kv, R = p->rope_dim;
  const int64_t rows = p->page_size > 0 ? p->page_size : plan->kv_capacity;
  if ((st = resolve(t.k_new_strides, in->k_new_strides, num_new, H, D, "k_new_strides", err)) ||
      (st = resolve(t.k_strides, in->k_strides, rows, H, D, "k_strides", err)))
    return st;
  if (R == 0 &&
      ((st = resolve(t.v_new_strides, in->v_new_strides, num_new, H, D, "v_new_strides", err)) ||
       (st = resolve(t.v_strides, in->v_strides, rows, H, D, "v_strides", err))))
    return st;
  if (R > 0 &&
      ((st = resolve(t.k_pe_new_strides, in->k_pe_new_strides, num_new, H, R, "k_pe_new_strides",
                     err)) ||
       (st = resolve(t.k_pe_strides, in->k_pe_strides, rows, H, R, "k_pe_strides", err))))
    return st;
  if ((st = fd_check_scale_args(plan, in->k_scale, in->v_scale, in->scale_strides, t.scale_strides,
                                err)))
    return st;
  if (p->page_size > 0 && t.block_table_stride == 0) t.block_table_stride = p->max_pages_per_seq;
  if (p->page_size == 0) t.block_table = NULL;

  const size_t e = fd_dtype_size(p->dtype), ekv = fd_dtype_size(p->kv_dtype);
  /* MLA: the rope parts in place of v (rope_dtype is resolved when rope_dim > 0) */
  const size_t erope = R > 0 ? fd_dtype_size(p->rope_dtype) : ekv;
  const void *ptrs[4] = {t.k_new, R > 0 ? t.k_pe_new : t.v_new, t.k_cache,
                         R > 0 ? t.k_pe_cache : t.v_cache};
  const size_t sizes[4] = {e, e, ekv, erope};
  const char *names[4] = {"k_new", R > 0 ? "k_pe_new" : "v_new", "k_cache",
                          R > 0 ? "k_pe_cache" : "v_cache"};
  for (int i = 0; i < 4; i++)
    if ((uintptr_t)ptrs[i] % sizes[i])
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: not aligned to its %zu-byte elements",
                     names[i], sizes[i]);
  if (num_new == 0) return fd_ok(err);

  switch (plan->backend) {
    case FD_BACKEND_CPU:
    case FD_BACKEND_REFERENCE:
      return fd_host_append(plan, &t, num_new, err);
    case FD_BACKEND_CUDA:
      if (R > 0 && !FD_CUDA_APPEND_MLA)
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "rope_dim: %d; this build's CUDA append kernel does not write MLA caches",
                       p->rope_dim);
      if ((int64_t)p->batch * num_new * H > INT32_MAX)
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "num_new: batch %d x num_new %d x num_heads_kv %lld rows exceed 2^31 - 1",
                       p->batch, num_new, (long long)H);
      return fd_cuda_append(plan, &t, num_new, stream, err);
    default: break;
  }
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: backend %d is not runnable", (int)plan->backend);
}
