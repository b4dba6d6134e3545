/*
 * merge_backend.cu — fd_cuda_merge (declared in internal.h): fills the merge
 * kernel's parameters and enqueues it (merge_kernel.cu) on the problem's
 * device, restoring the caller's current device after. No allocation, no
 * synchronisation, nothing read on the host: it can be captured in a CUDA
 * graph.
 */
#include <string.h>

#include <cuda_runtime.h>

#include "internal.h"
#include "merge.cuh"

/* Turns a failed runtime call into FD_STATUS_BACKEND_ERROR (clearing it). */
static fd_status merge_fail(fd_error *err, const char *what, cudaError_t e) {
  (void)cudaGetLastError();
  return fd_fail(err, FD_STATUS_BACKEND_ERROR, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" fd_status fd_cuda_merge(const fd_merge_problem *p, const void *states_out,
                                   const float *states_lse, void *out, float *lse, void *stream,
                                   fd_error *err) {
  fd_merge_params mp;
  memset(&mp, 0, sizeof mp);
  mp.states_out = states_out;
  mp.states_lse = states_lse;
  mp.out = out;
  mp.lse = lse;
  mp.rows = (int64_t)p->batch * p->q_len * p->num_heads;
  mp.num_states = p->num_states;
  mp.q_len = p->q_len;
  mp.num_heads = p->num_heads;
  mp.head_dim = p->head_dim;
  mp.dtype = (int32_t)p->dtype;
  mp.out_dtype = (int32_t)p->out_dtype;

  int prev = 0;
  cudaError_t e = cudaGetDevice(&prev);
  if (e != cudaSuccess) return merge_fail(err, "device: cudaGetDevice failed", e);
  if (prev != p->device) {
    e = cudaSetDevice(p->device);
    if (e != cudaSuccess) return merge_fail(err, "device: cudaSetDevice failed", e);
  }
  const char *what = "merge kernel launch failed";
  e = fd_merge_launch(&mp, (cudaStream_t)stream);
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (prev != p->device) {
    const cudaError_t r = cudaSetDevice(prev);
    if (r != cudaSuccess && e == cudaSuccess) {
      what = "device: restoring the current device failed";
      e = r;
    }
  }
  if (e != cudaSuccess) return merge_fail(err, what, e);
  return fd_ok(err);
}
