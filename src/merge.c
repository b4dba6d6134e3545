/*
 * merge.c — fd_merge_states: checks every field and pointer (NULL,
 * alignment, overlap of out / lse with the inputs and each other, from their
 * address ranges), resolves out_dtype and the backend (AUTO: CUDA when
 * device `device` is usable, else CPU; REFERENCE runs the CPU code), and
 * hands the call to src/cpu/cpu_merge.c or src/cuda/merge_backend.cu.
 * Nothing is written before every check has passed.
 */
#include <stdint.h>

#include "internal.h"

/* The largest tensor (bytes) a call may describe: every element offset then
 * fits an int64_t with room to spare (fd_plan_init bounds its workspace the
 * same way). */
#define FD_MERGE_MAX_BYTES 4503599627370496.0 /* 2^52 */

/* The states' and the merged out's types: F32, F16, BF16 (fp8 is a cache type only). */
static int valid_dtype(fd_dtype d) { return fd_dtype_size(d) != 0 && !fd_dtype_is_fp8(d); }

static fd_status check_problem(const fd_merge_problem *p, fd_error *err) {
  if (p->backend < FD_BACKEND_AUTO || p->backend > FD_BACKEND_REFERENCE)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "backend: %d is not an fd_backend", (int)p->backend);
  if (!valid_dtype(p->dtype))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "dtype: %d is not FD_DTYPE_F32, FD_DTYPE_F16 or FD_DTYPE_BF16", (int)p->dtype);
  if (p->out_dtype != 0 && !valid_dtype(p->out_dtype))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "out_dtype: %d is not 0 (= dtype), FD_DTYPE_F32, FD_DTYPE_F16 or FD_DTYPE_BF16",
                   (int)p->out_dtype);
  if (p->num_states < 1 || p->num_states > FD_MAX_MERGE_STATES)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_states: %d, must be 1..%d", p->num_states,
                   FD_MAX_MERGE_STATES);
  if (p->batch < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "batch: %d, must be >= 1", p->batch);
  if (p->q_len < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "q_len: %d, must be >= 1", p->q_len);
  if (p->num_heads < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_heads: %d, must be >= 1", p->num_heads);
  if (p->head_dim < 1 || p->head_dim > FD_MAX_MLA_HEAD_DIM)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "head_dim: %d, must be 1..%d", p->head_dim,
                   FD_MAX_MLA_HEAD_DIM);
  if (p->device < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "device: %d, must be >= 0", p->device);
  /* In double first: the int32 fields' product can overflow int64. */
  const double bytes = (double)p->num_states * p->batch * p->q_len * p->num_heads * p->head_dim *
                       (double)fd_dtype_size(p->dtype);
  if (bytes > FD_MERGE_MAX_BYTES)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "states_out: num_states %d x batch %d x q_len %d x num_heads %d x head_dim %d "
                   "is %.3g bytes, beyond what can be addressed",
                   p->num_states, p->batch, p->q_len, p->num_heads, p->head_dim, bytes);
  return FD_STATUS_OK;
}

/* A tensor's bytes [lo, hi) and its name, for the overlap checks. */
typedef struct span {
  uintptr_t lo, hi;
  const char *name;
} span;

static span make_span(const void *ptr, int64_t bytes, const char *name) {
  span s;
  s.lo = (uintptr_t)ptr;
  s.hi = s.lo + (uintptr_t)bytes;
  s.name = name;
  return s;
}

static int overlap(span a, span b) { return a.lo < b.hi && b.lo < a.hi; }

static fd_status check_pointer(const void *ptr, size_t align, const char *name, fd_error *err) {
  if (!ptr) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: NULL", name);
  if ((uintptr_t)ptr % align)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: %p is not aligned to its %zu-byte elements", name,
                   ptr, align);
  return FD_STATUS_OK;
}

fd_status fd_merge_states(const fd_merge_problem *problem, const void *states_out,
                          const float *states_lse, void *out, float *lse, void *stream,
                          fd_error *err) {
  if (!problem) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "problem: NULL");
  fd_status st = check_problem(problem, err);
  if (st != FD_STATUS_OK) return st;
  fd_merge_problem p = *problem;
  if (p.out_dtype == 0) p.out_dtype = p.dtype;
  const size_t in_size = fd_dtype_size(p.dtype), out_size = fd_dtype_size(p.out_dtype);

  if ((st = check_pointer(states_out, in_size, "states_out", err))) return st;
  if ((st = check_pointer(states_lse, sizeof(float), "states_lse", err))) return st;
  if ((st = check_pointer(out, out_size, "out", err))) return st;
  if (lse && (st = check_pointer(lse, sizeof(float), "lse", err))) return st;

  /* out and lse must not overlap the inputs or each other. */
  const int64_t rows = (int64_t)p.batch * p.q_len * p.num_heads;
  const int64_t S = p.num_states, D = p.head_dim;
  const span in[2] = {make_span(states_out, S * rows * D * (int64_t)in_size, "states_out"),
                      make_span(states_lse, S * rows * (int64_t)sizeof(float), "states_lse")};
  const span o = make_span(out, rows * D * (int64_t)out_size, "out");
  const span l = make_span(lse, rows * (int64_t)sizeof(float), "lse");
  for (int i = 0; i < 2; i++) {
    if (overlap(o, in[i]))
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "out: its bytes overlap %s's", in[i].name);
    if (lse && overlap(l, in[i]))
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "lse: its bytes overlap %s's", in[i].name);
  }
  if (lse && overlap(l, o))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "lse: its bytes overlap out's");

  /* Device queries only (no synchronisation): safe inside a graph capture. */
  fd_backend backend = p.backend;
  int cuda = -1; /* fd_cuda_available(p.device), once asked */
  if (backend == FD_BACKEND_AUTO) {
    cuda = fd_cuda_available(p.device);
    backend = cuda ? FD_BACKEND_CUDA : FD_BACKEND_CPU;
  }
  p.backend = backend;
  switch (backend) {
    case FD_BACKEND_CPU:
    case FD_BACKEND_REFERENCE:
      return fd_cpu_merge(&p, states_out, states_lse, out, lse, err);
    case FD_BACKEND_CUDA:
      if (cuda < 0) cuda = fd_cuda_available(p.device);
      if (!cuda) return fd_cuda_check_device(p.device, err); /* names what is missing */
      return fd_cuda_merge(&p, states_out, states_lse, out, lse, stream, err);
    default: break;
  }
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "backend: %d is not runnable", (int)backend);
}
