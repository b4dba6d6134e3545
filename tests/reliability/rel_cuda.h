/*
 * rel_cuda.h — the CUDA runtime calls the reliability tests need beyond
 * gpu_mem.h (streams, graph capture and replay, memset), behind plain C so
 * the tests compile without CUDA headers. rel_cuda.c implements them (stubs
 * that fail in a build without CUDA). Every function returns 0 on success,
 * else prints the CUDA error to stderr and returns -1.
 */
#ifndef FD_TEST_REL_CUDA_H
#define FD_TEST_REL_CUDA_H

#include <stddef.h>

/* cudaStreamCreateWithFlags: non_blocking 1 = cudaStreamNonBlocking. */
int rel_cuda_stream_create(void **stream, int non_blocking);
int rel_cuda_stream_destroy(void *stream);
int rel_cuda_stream_sync(void *stream);
/* cudaMemsetAsync on `stream` (NULL = legacy default stream). */
int rel_cuda_memset_async(void *dst, int byte, size_t bytes, void *stream);
/* cudaMemcpyAsync host -> device / device -> host on `stream`. */
int rel_cuda_upload_async(void *dst, const void *src, size_t bytes, void *stream);
int rel_cuda_download_async(void *dst, const void *src, size_t bytes, void *stream);

/* cudaStreamBeginCapture (cudaStreamCaptureModeGlobal) ... */
int rel_cuda_capture_begin(void *stream);
/* ... cudaStreamEndCapture + cudaGraphInstantiate: *exec is the executable
 * graph (the graph itself is destroyed). */
int rel_cuda_capture_end(void *stream, void **exec);
int rel_cuda_graph_launch(void *exec, void *stream);
int rel_cuda_graph_destroy(void *exec);
/* 1 when `stream` is capturing, 0 when not, -1 on error. */
int rel_cuda_is_capturing(void *stream);
/* Free device memory in bytes (cudaMemGetInfo), 0 on error. */
size_t rel_cuda_free_bytes(void);

#endif /* FD_TEST_REL_CUDA_H */
