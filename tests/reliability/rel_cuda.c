/* rel_cuda.c — streams, graphs and memsets for the reliability tests
 * (rel_cuda.h); stubs that fail when the tests are built without CUDA. */
#include <stdio.h>

#include "rel_cuda.h"

#ifdef FD_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>

static int check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  fprintf(stderr, "rel_cuda: %s: %s\n", what, cudaGetErrorString(e));
  (void)cudaGetLastError();
  return -1;
}

int rel_cuda_stream_create(void **stream, int non_blocking) {
  cudaStream_t s = NULL;
  int rc = check(cudaStreamCreateWithFlags(&s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault),
                 "cudaStreamCreateWithFlags");
  *stream = rc ? NULL : (void *)s;
  return rc;
}

int rel_cuda_stream_destroy(void *stream) {
  return check(cudaStreamDestroy((cudaStream_t)stream), "cudaStreamDestroy");
}

int rel_cuda_stream_sync(void *stream) {
  return check(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

int rel_cuda_memset_async(void *dst, int byte, size_t bytes, void *stream) {
  return check(cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)stream), "cudaMemsetAsync");
}

int rel_cuda_upload_async(void *dst, const void *src, size_t bytes, void *stream) {
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream),
               "cudaMemcpyAsync H2D");
}

int rel_cuda_download_async(void *dst, const void *src, size_t bytes, void *stream) {
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream),
               "cudaMemcpyAsync D2H");
}

int rel_cuda_capture_begin(void *stream) {
  return check(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeGlobal),
               "cudaStreamBeginCapture");
}

int rel_cuda_capture_end(void *stream, void **exec) {
  cudaGraph_t graph = NULL;
  cudaGraphExec_t ge = NULL;
  *exec = NULL;
  if (check(cudaStreamEndCapture((cudaStream_t)stream, &graph), "cudaStreamEndCapture")) return -1;
  int rc = check(cudaGraphInstantiate(&ge, graph, 0), "cudaGraphInstantiate");
  (void)cudaGraphDestroy(graph);
  if (rc == 0) *exec = (void *)ge;
  return rc;
}

int rel_cuda_graph_launch(void *exec, void *stream) {
  return check(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), "cudaGraphLaunch");
}

int rel_cuda_graph_destroy(void *exec) {
  return check(cudaGraphExecDestroy((cudaGraphExec_t)exec), "cudaGraphExecDestroy");
}

int rel_cuda_is_capturing(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (check(cudaStreamIsCapturing((cudaStream_t)stream, &st), "cudaStreamIsCapturing")) return -1;
  return st == cudaStreamCaptureStatusActive;
}

size_t rel_cuda_free_bytes(void) {
  size_t free_b = 0, total = 0;
  if (check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo")) return 0;
  return free_b;
}

#else /* no CUDA: the GPU tests exit 77 before calling these */

static int none(void) {
  fprintf(stderr, "rel_cuda: built without CUDA\n");
  return -1;
}
int rel_cuda_stream_create(void **stream, int non_blocking) {
  (void)non_blocking;
  *stream = NULL;
  return none();
}
int rel_cuda_stream_destroy(void *stream) { return (void)stream, none(); }
int rel_cuda_stream_sync(void *stream) { return (void)stream, none(); }
int rel_cuda_memset_async(void *dst, int byte, size_t bytes, void *stream) {
  return (void)dst, (void)byte, (void)bytes, (void)stream, none();
}
int rel_cuda_upload_async(void *dst, const void *src, size_t bytes, void *stream) {
  return (void)dst, (void)src, (void)bytes, (void)stream, none();
}
int rel_cuda_download_async(void *dst, const void *src, size_t bytes, void *stream) {
  return (void)dst, (void)src, (void)bytes, (void)stream, none();
}
int rel_cuda_capture_begin(void *stream) { return (void)stream, none(); }
int rel_cuda_capture_end(void *stream, void **exec) {
  (void)stream;
  *exec = NULL;
  return none();
}
int rel_cuda_graph_launch(void *exec, void *stream) { return (void)exec, (void)stream, none(); }
int rel_cuda_graph_destroy(void *exec) { return (void)exec, none(); }
int rel_cuda_is_capturing(void *stream) { return (void)stream, none(); }
size_t rel_cuda_free_bytes(void) { return 0; }
#endif
