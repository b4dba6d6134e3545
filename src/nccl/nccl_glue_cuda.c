/*
 * nccl_glue_cuda.c — nccl_glue.h over the CUDA runtime. Each call makes
 * `device` current for its duration (one thread may drive several GPUs) and
 * restores the caller's device.
 */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "nccl_glue.h"

static fd_status fail(fd_error *err, const char *what, cudaError_t e) {
  (void)cudaGetLastError();
  if (err) {
    err->status = FD_STATUS_BACKEND_ERROR;
    snprintf(err->message, sizeof err->message, "%s: %s", what, cudaGetErrorString(e));
  }
  return FD_STATUS_BACKEND_ERROR;
}

/* Makes `device` current; *prev gets the caller's. */
static fd_status enter(int device, int *prev, fd_error *err) {
  cudaError_t e = cudaGetDevice(prev);
  if (e != cudaSuccess) return fail(err, "cudaGetDevice", e);
  if (*prev != device && (e = cudaSetDevice(device)) != cudaSuccess)
    return fail(err, "cudaSetDevice", e);
  return FD_STATUS_OK;
}

static fd_status leave(int device, int prev, fd_status st, fd_error *err) {
  if (prev != device) {
    const cudaError_t e = cudaSetDevice(prev);
    if (e != cudaSuccess && st == FD_STATUS_OK) return fail(err, "cudaSetDevice (restoring the caller's device)", e);
  }
  return st;
}

fd_status fd_nccl_glue_capturing(int device, void *stream, int *capturing, fd_error *err) {
  int prev;
  fd_status st = enter(device, &prev, err);
  if (st != FD_STATUS_OK) return st;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &cs);
  if (e != cudaSuccess) st = fail(err, "cudaStreamIsCapturing", e);
  *capturing = cs != cudaStreamCaptureStatusNone;
  return leave(device, prev, st, err);
}

fd_status fd_nccl_glue_upload(int device, void *dst, const void *src, size_t bytes, void *stream,
                              fd_error *err) {
  int prev;
  fd_status st = enter(device, &prev, err);
  if (st != FD_STATUS_OK) return st;
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
  if (e != cudaSuccess) st = fail(err, "cudaMemcpyAsync (host to device)", e);
  return leave(device, prev, st, err);
}

fd_status fd_nccl_glue_download_sync(int device, void *dst, const void *src, size_t bytes,
                                     void *stream, fd_error *err) {
  int prev;
  fd_status st = enter(device, &prev, err);
  if (st != FD_STATUS_OK) return st;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
  if (e != cudaSuccess)
    st = fail(err, "cudaMemcpyAsync (device to host)", e);
  else if ((e = cudaStreamSynchronize((cudaStream_t)stream)) != cudaSuccess)
    st = fail(err, "cudaStreamSynchronize", e);
  return leave(device, prev, st, err);
}

fd_status fd_nccl_glue_stream_done(void *stream, int *done, fd_error *err) {
  const cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
  *done = e == cudaSuccess;
  if (e == cudaSuccess || e == cudaErrorNotReady) {
    if (e == cudaErrorNotReady) (void)cudaGetLastError();
    return FD_STATUS_OK;
  }
  return fail(err, "cudaStreamQuery", e);
}

fd_backend fd_nccl_glue_merge_backend(void) { return FD_BACKEND_CUDA; }
