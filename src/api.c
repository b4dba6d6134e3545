/*
 * api.c — the public entry points besides fd_plan_init: version, names,
 * fd_run's argument checks and dispatch, and the one-call fd_decode.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *fd_version(void) { return FD_VERSION_STRING; }

int fd_version_number(void) { return FD_VERSION_NUMBER; }

size_t fd_struct_size(const char *name) {
  if (!name) return 0;
  if (!strcmp(name, "fd_problem")) return sizeof(fd_problem);
  if (!strcmp(name, "fd_plan")) return sizeof(fd_plan);
  if (!strcmp(name, "fd_tensors")) return sizeof(fd_tensors);
  if (!strcmp(name, "fd_error")) return sizeof(fd_error);
  if (!strcmp(name, "fd_merge_problem")) return sizeof(fd_merge_problem);
  if (!strcmp(name, "fd_append_tensors")) return sizeof(fd_append_tensors);
  return 0;
}

size_t fd_dtype_size(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 4;
    case FD_DTYPE_F16: return 2;
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: return 1;
  }
  return 0;
}

const char *fd_backend_name(fd_backend backend) {
  switch (backend) {
    case FD_BACKEND_AUTO: return "auto";
    case FD_BACKEND_CPU: return "cpu";
    case FD_BACKEND_CUDA: return "cuda";
    case FD_BACKEND_REFERENCE: return "reference";
  }
  return "unknown";
}

int fd_backend_available(fd_backend backend) {
  switch (backend) {
    case FD_BACKEND_AUTO:
    case FD_BACKEND_CPU:
    case FD_BACKEND_REFERENCE: return 1;
    case FD_BACKEND_CUDA: return fd_cuda_available(0);
  }
  return 0;
}

static int all_zero(const int64_t s[3]) { return s[0] == 0 && s[1] == 0 && s[2] == 0; }

static fd_status resolve3(int64_t dst[3], const int64_t src[3], int64_t d0, int64_t d1, int64_t d2,
                          const char *name, fd_error *err) {
  if (all_zero(src)) {
    dst[2] = d2;
    dst[1] = d1 * d2;
    dst[0] = d0 * d1 * d2;
    return FD_STATUS_OK;
  }
  for (int i = 0; i < 3; i++) {
    if (src[i] < 0)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: stride %d is %lld, must be >= 0", name,
                     i, (long long)src[i]);
    dst[i] = src[i];
  }
  return FD_STATUS_OK;
}

static int misaligned(const void *ptr, const int64_t strides[3], size_t elem, size_t align) {
  if ((uintptr_t)ptr % align) return 1;
  for (int i = 0; i < 3; i++)
    if (((uint64_t)strides[i] * elem) % align) return 1;
  return 0;
}

fd_status fd_check_host_lengths(const fd_plan *plan, const fd_tensors *t, fd_error *err) {
  const fd_problem *p = &plan->problem;
  for (int32_t b = 0; b < p->batch; b++) {
    int32_t n = t->kv_len[b];
    if (n < 0 || n > plan->kv_capacity)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "kv_len[%d]: %d is outside [0, kv_capacity = %d]",
                     b, n, plan->kv_capacity);
    if (p->page_size > 0 && p->num_pages > 0) {
      int64_t pages = ((int64_t)n + p->page_size - 1) / p->page_size;
      const int32_t *row = t->block_table + (int64_t)b * t->block_table_stride;
      for (int64_t i = 0; i < pages; i++)
        if (row[i] < 0 || row[i] >= p->num_pages)
          return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                         "block_table[%d][%lld]: page id %d is outside [0, num_pages = %d)", b, (long long)i, row[i],
                         p->num_pages);
    }
  }
  return FD_STATUS_OK;
}

fd_status fd_run(const fd_plan *plan, const fd_tensors *tensors, void *workspace,
                 size_t workspace_size, void *stream, fd_error *err) {
  if (!plan) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  if (plan->magic != FD_PLAN_MAGIC)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: not made by fd_plan_init (or it failed)");
  if (!tensors) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "tensors: NULL");
  const fd_problem *p = &plan->problem;
  const fd_tensors *in = tensors;
  if (!in->q) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "q: NULL");
  if (!in->k_cache) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "k_cache: NULL");
  if (!in->v_cache) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "v_cache: NULL");
  if (!in->kv_len) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "kv_len: NULL");
  if (!in->out) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "out: NULL");
  if (in->sinks && (uintptr_t)in->sinks % sizeof(float))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "sinks: not aligned to a float");
  if (p->page_size > 0 && !in->block_table)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "block_table: NULL for a paged cache");
  if (in->block_table_stride < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "block_table_stride: %lld, must be >= 0",
                   (long long)in->block_table_stride);

  fd_tensors t = *in;
  const int64_t D = p->head_dim;
  fd_status st;
  if ((st = resolve3(t.q_strides, in->q_strides, p->q_len, p->num_heads_q, D, "q_strides", err)))
    return st;
  if ((st = resolve3(t.out_strides, in->out_strides, p->q_len, p->num_heads_q, D, "out_strides",
                     err)))
    return st;
  int64_t rows = p->page_size > 0 ? p->page_size : plan->kv_capacity;
  if ((st = resolve3(t.k_strides, in->k_strides, rows, p->num_heads_kv, D, "k_strides", err)))
    return st;
  if ((st = resolve3(t.v_strides, in->v_strides, rows, p->num_heads_kv, D, "v_strides", err)))
    return st;
  if ((st = resolve3(t.lse_strides, in->lse_strides, p->num_heads_q, p->q_len, 1, "lse_strides",
                     err)))
    return st;
  if (p->page_size > 0 && t.block_table_stride == 0) t.block_table_stride = p->max_pages_per_seq;
  if (p->page_size == 0) t.block_table = NULL;
  if ((st = fd_check_scale_args(plan, in->k_scale, in->v_scale, in->scale_strides, t.scale_strides,
                                err)))
    return st;

  if (plan->workspace_size > 0 && (!workspace || workspace_size < plan->workspace_size))
    return fd_fail(err, FD_STATUS_WORKSPACE_TOO_SMALL,
                   "workspace_size: %zu bytes%s, the plan needs %zu", workspace ? workspace_size : 0,
                   workspace ? "" : " (workspace NULL)", plan->workspace_size);

  switch (plan->backend) {
    case FD_BACKEND_CPU:
      if ((st = fd_check_host_lengths(plan, &t, err))) return st;
      if ((st = fd_check_host_scale_values(plan, &t, err))) return st;
      return fd_cpu_run(plan, &t, workspace, err);
    case FD_BACKEND_REFERENCE:
      if ((st = fd_check_host_lengths(plan, &t, err))) return st;
      if ((st = fd_check_host_scale_values(plan, &t, err))) return st;
      return fd_reference_run(plan, &t, err);
    case FD_BACKEND_CUDA: {
      const size_t e = fd_dtype_size(p->dtype), ekv = fd_dtype_size(p->kv_dtype);
      if (misaligned(t.q, t.q_strides, e, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED, "q: CUDA needs 16-byte aligned base and strides");
      if (misaligned(t.k_cache, t.k_strides, ekv, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "k_cache: CUDA needs 16-byte aligned base and strides");
      if (misaligned(t.v_cache, t.v_strides, ekv, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "v_cache: CUDA needs 16-byte aligned base and strides");
      if (misaligned(t.out, t.out_strides, fd_dtype_size(p->out_dtype), 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED, "out: CUDA needs 16-byte aligned base and strides");
      if ((uintptr_t)workspace % 16)
        return fd_fail(err, FD_STATUS_UNSUPPORTED, "workspace: CUDA needs a 16-byte aligned base");
      return fd_cuda_run(plan, &t, workspace, stream, err);
    }
    default: break;
  }
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: backend %d is not runnable", (int)plan->backend);
}

fd_status fd_decode(const fd_problem *problem, const fd_tensors *tensors, void *stream,
                    fd_error *err) {
  fd_plan plan;
  fd_status st = fd_plan_init(&plan, problem, err);
  if (st != FD_STATUS_OK) return st;
  void *ws = NULL;
  if (plan.workspace_size > 0) {
    if (plan.backend == FD_BACKEND_CUDA) {
      st = fd_cuda_malloc_async(&ws, plan.workspace_size, stream, err);
      if (st != FD_STATUS_OK) return st;
    } else {
      ws = malloc(plan.workspace_size);
      if (!ws)
        return fd_fail(err, FD_STATUS_OUT_OF_MEMORY, "workspace: malloc of %zu bytes failed",
                       plan.workspace_size);
    }
  }
  st = fd_run(&plan, tensors, ws, plan.workspace_size, stream, err);
  if (ws) {
    if (plan.backend == FD_BACKEND_CUDA) {
      fd_error ferr;
      fd_status fst = fd_cuda_free_async(ws, stream, &ferr);
      if (st == FD_STATUS_OK && fst != FD_STATUS_OK) {
        if (err) *err = ferr;
        st = fst;
      }
    } else {
      free(ws);
    }
  }
  return st;
}
