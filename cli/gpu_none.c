/*
 * gpu_none.c — gpu.h for a build without CUDA: there is never a GPU, and
 * every call that would need one fails with FD_STATUS_UNSUPPORTED.
 */
#include <stdio.h>

#include "gpu.h"

static fd_status no_gpu(fd_error *err) {
  if (err) {
    err->status = FD_STATUS_UNSUPPORTED;
    snprintf(err->message, sizeof err->message, "this flashdecode was built without CUDA");
  }
  return FD_STATUS_UNSUPPORTED;
}

int gpu_available(void) { return 0; }

void gpu_describe(char *text, size_t text_size) {
  snprintf(text, text_size, "none (built without CUDA)");
}

size_t gpu_l2_cache_bytes(void) { return 0; }

fd_status gpu_malloc(void **ptr, size_t bytes, fd_error *err) {
  (void)bytes;
  *ptr = NULL;
  return no_gpu(err);
}

void gpu_free(void *ptr) { (void)ptr; }

fd_status gpu_copy_to_device(void *dst, const void *src, size_t bytes, void *stream, fd_error *err) {
  (void)dst, (void)src, (void)bytes, (void)stream;
  return no_gpu(err);
}

fd_status gpu_copy_to_host(void *dst, const void *src, size_t bytes, void *stream, fd_error *err) {
  (void)dst, (void)src, (void)bytes, (void)stream;
  return no_gpu(err);
}

fd_status gpu_stream_create(void **stream, fd_error *err) {
  *stream = NULL;
  return no_gpu(err);
}

void gpu_stream_destroy(void *stream) { (void)stream; }

fd_status gpu_stream_sync(void *stream, fd_error *err) {
  (void)stream;
  return no_gpu(err);
}

fd_status gpu_event_create(void **event, fd_error *err) {
  *event = NULL;
  return no_gpu(err);
}

void gpu_event_destroy(void *event) { (void)event; }

fd_status gpu_event_record(void *event, void *stream, fd_error *err) {
  (void)event, (void)stream;
  return no_gpu(err);
}

fd_status gpu_event_elapsed_ms(void *start, void *end, float *ms, fd_error *err) {
  (void)start, (void)end;
  *ms = 0.0f;
  return no_gpu(err);
}

fd_status gpu_capture_begin(void *stream, fd_error *err) {
  (void)stream;
  return no_gpu(err);
}

fd_status gpu_capture_end(void *stream, void **graph_exec, fd_error *err) {
  (void)stream;
  *graph_exec = NULL;
  return no_gpu(err);
}

fd_status gpu_graph_launch(void *graph_exec, void *stream, fd_error *err) {
  (void)graph_exec, (void)stream;
  return no_gpu(err);
}

void gpu_graph_destroy(void *graph_exec) { (void)graph_exec; }
