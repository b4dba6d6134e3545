/*
 * gpu.h — the little CUDA runtime the CLI needs (device memory, copies, a
 * stream, events, graph capture), behind plain C functions so that no other
 * CLI file includes a CUDA header. gpu_cuda.c implements it with the CUDA
 * runtime; gpu_none.c (a build without CUDA) answers "no GPU" to every call.
 *
 * Every function that can fail returns an fd_status and writes a one-line
 * message into err (FD_STATUS_UNSUPPORTED without a GPU, FD_STATUS_BACKEND_ERROR
 * for a CUDA error, FD_STATUS_OUT_OF_MEMORY when an allocation fails).
 * Streams, events and graphs are opaque pointers.
 */
#ifndef FD_CLI_GPU_H
#define FD_CLI_GPU_H

#include <stddef.h>

#include "flashdecode.h"

/* 1 when this build has CUDA and at least one device is visible. */
int gpu_available(void);
/* "NVIDIA H200 (sm_90, 132 SMs)" or why there is none; never NULL. */
void gpu_describe(char *text, size_t text_size);

/* L2 cache size of device 0 in bytes; 0 when unknown or no GPU. */
size_t gpu_l2_cache_bytes(void);

fd_status gpu_malloc(void **ptr, size_t bytes, fd_error *err);
void gpu_free(void *ptr); /* NULL is fine */

/* Copies on `stream` (host memory is ordinary pageable memory). */
fd_status gpu_copy_to_device(void *dst, const void *src, size_t bytes, void *stream, fd_error *err);
fd_status gpu_copy_to_host(void *dst, const void *src, size_t bytes, void *stream, fd_error *err);

fd_status gpu_stream_create(void **stream, fd_error *err);
void gpu_stream_destroy(void *stream);
fd_status gpu_stream_sync(void *stream, fd_error *err);

fd_status gpu_event_create(void **event, fd_error *err);
void gpu_event_destroy(void *event);
fd_status gpu_event_record(void *event, void *stream, fd_error *err);
/* Milliseconds between two recorded events (waits for `end`). */
fd_status gpu_event_elapsed_ms(void *start, void *end, float *ms, fd_error *err);

/* Stream capture into a CUDA graph: begin, enqueue work, end (instantiates). */
fd_status gpu_capture_begin(void *stream, fd_error *err);
fd_status gpu_capture_end(void *stream, void **graph_exec, fd_error *err);
fd_status gpu_graph_launch(void *graph_exec, void *stream, fd_error *err);
void gpu_graph_destroy(void *graph_exec);

#endif /* FD_CLI_GPU_H */
