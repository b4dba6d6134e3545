/* gpu_mem.c — cudaMalloc / cudaMemcpy for the GPU tests (built only with CUDA). */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "gpu_mem.h"

static int check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "gpu_mem: %s: %s\n", what, cudaGetErrorString(e));
  return -1;
}

int fd_gpu_malloc(void **ptr, size_t bytes) { return check(cudaMalloc(ptr, bytes), "cudaMalloc"); }

int fd_gpu_free(void *ptr) { return check(cudaFree(ptr), "cudaFree"); }

int fd_gpu_upload(void *dst_device, const void *src_host, size_t bytes) {
  return check(cudaMemcpy(dst_device, src_host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

int fd_gpu_download(void *dst_host, const void *src_device, size_t bytes) {
  return check(cudaMemcpy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

int fd_gpu_synchronize(void) { return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
