/*
 * gpu_cuda.c — gpu.h over the CUDA runtime (cudart_static). Compiled only in
 * a build with CUDA. A machine without a GPU or driver is not an error here:
 * gpu_available() says 0 and the callers print why and exit nonzero.
 */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "gpu.h"
#include "internal.h" /* fd_cuda_no_device_reason */

static fd_status cuda_fail(fd_error *err, cudaError_t code, const char *what) {
  cudaGetLastError(); /* reported here: clear it, so a later launch check does not see it */
  fd_status status =
      code == cudaErrorMemoryAllocation ? FD_STATUS_OUT_OF_MEMORY : FD_STATUS_BACKEND_ERROR;
  if (err) {
    err->status = status;
    snprintf(err->message, sizeof err->message, "%s: %s (%s)", what, cudaGetErrorString(code),
             cudaGetErrorName(code));
  }
  return status;
}

static fd_status ok(fd_error *err) {
  if (err) {
    err->status = FD_STATUS_OK;
    err->message[0] = '\0';
  }
  return FD_STATUS_OK;
}

int gpu_available(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError(); /* clear the error so later calls start clean */
    return 0;
  }
  return count > 0;
}

void gpu_describe(char *text, size_t text_size) {
  int count = 0;
  cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess || count == 0) {
    cudaGetLastError();
    char reason[200];
    fd_cuda_no_device_reason((int)code, reason, sizeof reason); /* the library's words */
    snprintf(text, text_size, "none (%s)", reason);
    return;
  }
  struct cudaDeviceProp prop;
  code = cudaGetDeviceProperties(&prop, 0);
  if (code != cudaSuccess) {
    snprintf(text, text_size, "device 0 (%s)", cudaGetErrorString(code));
    return;
  }
  snprintf(text, text_size, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
}

size_t gpu_l2_cache_bytes(void) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return bytes > 0 ? (size_t)bytes : 0;
}

fd_status gpu_malloc(void **ptr, size_t bytes, fd_error *err) {
  *ptr = NULL;
  cudaError_t code = cudaMalloc(ptr, bytes > 0 ? bytes : 1);
  if (code != cudaSuccess) {
    *ptr = NULL;
    return cuda_fail(err, code, "cudaMalloc");
  }
  return ok(err);
}

void gpu_free(void *ptr) {
  if (ptr) cudaFree(ptr);
}

fd_status gpu_copy_to_device(void *dst, const void *src, size_t bytes, void *stream, fd_error *err) {
  cudaError_t code =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaMemcpyAsync to device");
}

fd_status gpu_copy_to_host(void *dst, const void *src, size_t bytes, void *stream, fd_error *err) {
  cudaError_t code =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaMemcpyAsync to host");
}

fd_status gpu_stream_create(void **stream, fd_error *err) {
  cudaStream_t s = NULL;
  cudaError_t code = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = s;
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaStreamCreate");
}

void gpu_stream_destroy(void *stream) {
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

fd_status gpu_stream_sync(void *stream, fd_error *err) {
  cudaError_t code = cudaStreamSynchronize((cudaStream_t)stream);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaStreamSynchronize");
}

fd_status gpu_event_create(void **event, fd_error *err) {
  cudaEvent_t e = NULL;
  cudaError_t code = cudaEventCreate(&e);
  *event = e;
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaEventCreate");
}

void gpu_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

fd_status gpu_event_record(void *event, void *stream, fd_error *err) {
  cudaError_t code = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaEventRecord");
}

fd_status gpu_event_elapsed_ms(void *start, void *end, float *ms, fd_error *err) {
  *ms = 0.0f;
  cudaError_t code = cudaEventSynchronize((cudaEvent_t)end);
  if (code != cudaSuccess) return cuda_fail(err, code, "cudaEventSynchronize");
  code = cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaEventElapsedTime");
}

fd_status gpu_capture_begin(void *stream, fd_error *err) {
  cudaError_t code = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeGlobal);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaStreamBeginCapture");
}

fd_status gpu_capture_end(void *stream, void **graph_exec, fd_error *err) {
  *graph_exec = NULL;
  cudaGraph_t graph = NULL;
  cudaError_t code = cudaStreamEndCapture((cudaStream_t)stream, &graph);
  if (code != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    return cuda_fail(err, code, "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = NULL;
  code = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (code != cudaSuccess) return cuda_fail(err, code, "cudaGraphInstantiate");
  *graph_exec = exec;
  return ok(err);
}

fd_status gpu_graph_launch(void *graph_exec, void *stream, fd_error *err) {
  cudaError_t code = cudaGraphLaunch((cudaGraphExec_t)graph_exec, (cudaStream_t)stream);
  return code == cudaSuccess ? ok(err) : cuda_fail(err, code, "cudaGraphLaunch");
}

void gpu_graph_destroy(void *graph_exec) {
  if (graph_exec) cudaGraphExecDestroy((cudaGraphExec_t)graph_exec);
}
