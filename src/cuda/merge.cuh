/*
 * merge.cuh — what merge_backend.cu hands the fd_merge_states kernel
 * (merge_kernel.cu): its parameters and its launcher. Internal to src/cuda;
 * not installed.
 */
#ifndef FD_CUDA_MERGE_CUH
#define FD_CUDA_MERGE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* One fd_merge_states call on the device; merge.c checked every field.
 * Tensors are dense; pointers are device pointers aligned to their elements. */
typedef struct fd_merge_params {
  const void *states_out;   /* [num_states, rows, head_dim] dtype, rows in out's order */
  const float *states_lse;  /* [num_states, batch, num_heads, q_len] */
  void *out;                /* [batch, q_len, num_heads, head_dim] out_dtype */
  float *lse;               /* [batch, num_heads, q_len], or NULL */
  int64_t rows;             /* batch * q_len * num_heads */
  int32_t num_states;       /* 1..FD_MAX_MERGE_STATES */
  int32_t q_len;
  int32_t num_heads;
  int32_t head_dim;         /* 1..256 */
  int32_t dtype;            /* fd_dtype of states_out */
  int32_t out_dtype;        /* fd_dtype of out (resolved, never 0) */
} fd_merge_params;

/* Enqueue the merge kernel for p's dtype pair on `stream` (programmatic
 * dependent launch: it may start while the kernel before it on the stream
 * still runs, and waits for it before touching memory). It reads 16 bytes
 * at a time when states_out is 16-byte aligned, head_dim elements are a
 * multiple of 16 bytes and out is aligned to 4 of its elements; element by
 * element otherwise. Returns the launch's error (cudaErrorInvalidValue for a
 * dtype without a kernel). */
cudaError_t fd_merge_launch(const fd_merge_params *p, cudaStream_t stream);

#endif /* FD_CUDA_MERGE_CUH */
