/*
 * cuda_backend.cu — the CUDA backend's entry points (declared in internal.h):
 * device queries, stream-ordered allocation for fd_decode, and fd_cuda_run,
 * which fills one fd_kernel_params and enqueues the split kernel (tensor
 * cores for fp16/bf16, CUDA cores for fp32) and, when the plan splits, the
 * combine kernel (programmatic dependent launch). fd_cuda_run allocates nothing, never
 * synchronises and never reads kv_len or block_table on the host, so it can
 * be captured in a CUDA graph.
 *
 * Every runtime call that fails is followed by cudaGetLastError() so that the
 * error does not linger for the caller; without a driver or GPU the queries
 * simply report "unavailable".
 */
#include <string.h>

#include <cuda_runtime.h>

#include "internal.h"
#include "kernel_params.cuh"

/* Turns a failed runtime call into FD_STATUS_BACKEND_ERROR (clearing it). */
static fd_status cuda_fail(fd_error *err, const char *what, cudaError_t e) {
  (void)cudaGetLastError();
  return fd_fail(err, FD_STATUS_BACKEND_ERROR, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" int fd_cuda_available(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device < 0 || device >= count) return 0;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  /* The kernels are built for sm_90a only, which runs on compute capability 9.0. */
  return major == 9 && minor == 0;
}

extern "C" fd_status fd_cuda_sm_count(int device, int32_t *sm_count, fd_error *err) {
  *sm_count = 0;
  int n = 0;
  const cudaError_t e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return cuda_fail(err, "device: multiprocessor count query failed", e);
  *sm_count = n;
  return fd_ok(err);
}

extern "C" int32_t fd_cuda_blocks_per_sm(int device, fd_dtype dtype, int32_t head_dim) {
  int current = 0, n = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    (void)cudaGetLastError();
    return 2;
  }
  if (current != device && cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 2;
  }
  const cudaError_t e = dtype == FD_DTYPE_F32 ? fd_split_occupancy(head_dim, &n)
                                              : fd_split_mma_occupancy((int)dtype, head_dim, &n);
  if (current != device) (void)cudaSetDevice(current);
  if (e != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    return 2;
  }
  return n;
}

extern "C" fd_status fd_cuda_malloc_async(void **ptr, size_t bytes, void *stream, fd_error *err) {
  *ptr = NULL;
  const cudaError_t e = cudaMallocAsync(ptr, bytes, (cudaStream_t)stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *ptr = NULL;
    return fd_fail(err,
                   e == cudaErrorMemoryAllocation ? FD_STATUS_OUT_OF_MEMORY
                                                  : FD_STATUS_BACKEND_ERROR,
                   "workspace: cudaMallocAsync of %zu bytes failed: %s", bytes,
                   cudaGetErrorString(e));
  }
  return fd_ok(err);
}

extern "C" fd_status fd_cuda_free_async(void *ptr, void *stream, fd_error *err) {
  const cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)stream);
  if (e != cudaSuccess) return cuda_fail(err, "workspace: cudaFreeAsync failed", e);
  return fd_ok(err);
}

/* The kernel parameters of one call (t has explicit strides, from api.c). */
static void fill_params(fd_kernel_params *kp, const fd_plan *plan, const fd_tensors *t,
                        void *workspace) {
  const fd_problem *pr = &plan->problem;
  memset(kp, 0, sizeof *kp);
  kp->q = t->q;
  kp->k_cache = t->k_cache;
  kp->v_cache = t->v_cache;
  kp->out = t->out;
  kp->lse = t->lse;
  for (int i = 0; i < 3; i++) {
    kp->q_strides[i] = t->q_strides[i];
    kp->k_strides[i] = t->k_strides[i];
    kp->v_strides[i] = t->v_strides[i];
    kp->out_strides[i] = t->out_strides[i];
    kp->lse_strides[i] = t->lse_strides[i];
  }
  kp->kv_len = t->kv_len;
  kp->block_table = pr->page_size > 0 ? t->block_table : NULL;
  kp->block_table_stride = t->block_table_stride;
  if (plan->num_splits > 1) {
    kp->partial_o = (float *)((char *)workspace + plan->ws_partial_o);
    kp->partial_ml = (float *)((char *)workspace + plan->ws_partial_ml);
  }
  kp->dtype = (int32_t)pr->dtype;
  kp->batch = pr->batch;
  kp->q_len = pr->q_len;
  kp->num_heads_q = pr->num_heads_q;
  kp->num_heads_kv = pr->num_heads_kv;
  kp->group = pr->num_heads_q / pr->num_heads_kv;
  kp->head_dim = pr->head_dim;
  kp->page_size = pr->page_size;
  kp->num_pages = pr->page_size > 0 ? pr->num_pages : 0;
  kp->kv_capacity = plan->kv_capacity;
  kp->chunk_len = plan->chunk_len;
  kp->num_splits = plan->num_splits;
  kp->split_len_fixed = fd_split_len_fixed(pr);
  kp->scale_log2 = plan->softmax_scale * 1.4426950408889634f; /* log2(e) */
  kp->window_left = pr->window_left;
  kp->non_causal = pr->non_causal;
  if (pr->logits_soft_cap > 0.0f) {
    kp->cap_in = 1.0f / (pr->logits_soft_cap * 1.4426950408889634f);
    kp->cap_out = pr->logits_soft_cap * 1.4426950408889634f;
  }
  kp->sinks = t->sinks;
  kp->out_f32 = pr->out_dtype == FD_DTYPE_F32 && pr->dtype != FD_DTYPE_F32;
  kp->kv_dtype = (int32_t)pr->kv_dtype;
  kp->kv_scale = (int32_t)pr->kv_scale;
  kp->k_scale = t->k_scale;
  kp->v_scale = t->v_scale;
  for (int i = 0; i < 3; i++) kp->scale_strides[i] = t->scale_strides[i];
}

extern "C" fd_status fd_cuda_run(const fd_plan *plan, const fd_tensors *t, void *workspace,
                                 void *stream, fd_error *err) {
  const fd_problem *pr = &plan->problem;
  if (pr->head_dim != 64 && pr->head_dim != 80 && pr->head_dim != 96 && pr->head_dim != 128 &&
      pr->head_dim != 256)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: %d is not supported by the CUDA backend (64, 80, 96, 128 or 256)",
                   pr->head_dim);
  if (pr->batch > 65535)
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "batch: %d exceeds the CUDA backend's 65535",
                   pr->batch);
  if (pr->num_heads_kv > 65535)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "num_heads_kv: %d exceeds the CUDA backend's 65535", pr->num_heads_kv);
  /* fill_params passes the fp8 fields; the split kernels do not read them yet. */
  if (pr->kv_dtype != pr->dtype)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "kv_dtype: fp8 caches are not yet supported by the CUDA backend");

  fd_kernel_params kp;
  fill_params(&kp, plan, t, workspace);

  /* Launch on the plan's device; restore the caller's current device after. */
  int prev = 0;
  cudaError_t e = cudaGetDevice(&prev);
  if (e != cudaSuccess) return cuda_fail(err, "device: cudaGetDevice failed", e);
  if (prev != pr->device) {
    e = cudaSetDevice(pr->device);
    if (e != cudaSuccess) return cuda_fail(err, "device: cudaSetDevice failed", e);
  }

  const cudaStream_t s = (cudaStream_t)stream;
  const char *what = "split kernel launch failed";
  /* 16-bit K/V: tensor cores (split_mma_kernel.cu); fp32: CUDA cores. */
  if (pr->dtype == FD_DTYPE_F32) {
    e = fd_split_launch(&kp, s);
  } else {
    /* A grid no larger than the GPU runs one block per SM whichever kernel
     * runs it: take the 8-warp one, twice the bytes in flight. */
    const int64_t blocks = (int64_t)kp.num_splits * kp.num_heads_kv * kp.batch;
    /* the deterministic mode always runs the 4-warp kernel: the variant must
     * not follow the grid (its key-warp partition sums in another order) */
    const int wide = !pr->deterministic &&
                     fd_cuda_wide_kernel(blocks, plan->sm_count, plan->split_keys);
    e = fd_split_mma_launch(&kp, wide, s);
  }
  if (e == cudaSuccess && plan->num_splits > 1) {
    what = "combine kernel launch failed";
    e = fd_combine_launch(&kp, s);
  }
  if (e != cudaSuccess) (void)cudaGetLastError();

  if (prev != pr->device) {
    const cudaError_t r = cudaSetDevice(prev);
    if (r != cudaSuccess && e == cudaSuccess) {
      what = "device: restoring the current device failed";
      e = r;
    }
  }
  if (e != cudaSuccess) return cuda_fail(err, what, e);
  return fd_ok(err);
}
