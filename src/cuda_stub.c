/* cuda_stub.c — the CUDA entry points of a build without CUDA: unavailable. */
#include <string.h>

#include "internal.h"

fd_status fd_cuda_check_device(int device, fd_error *err) {
  (void)device;
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: CUDA is not built in");
}

int fd_cuda_available(int device) {
  (void)device;
  return 0;
}

fd_status fd_cuda_device_budget(int device, fd_gpu_budget *budget, fd_error *err) {
  (void)device;
  memset(budget, 0, sizeof *budget);
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: CUDA is not built in");
}

int fd_cuda_pdl(int device) {
  (void)device;
  return 0;
}

fd_status fd_cuda_device_fit(int device, fd_dtype dtype, int32_t head_dim, int rows,
                             fd_cuda_fit *fit, fd_error *err) {
  (void)device, (void)dtype, (void)head_dim, (void)rows;
  memset(fit, 0, sizeof *fit);
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: built without CUDA");
}

fd_status fd_cuda_run(const fd_plan *plan, const fd_tensors *t, void *workspace, void *stream,
                      fd_error *err) {
  (void)plan, (void)t, (void)workspace, (void)stream;
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: built without CUDA");
}

fd_status fd_cuda_malloc_async(void **ptr, size_t bytes, void *stream, fd_error *err) {
  (void)bytes, (void)stream;
  *ptr = NULL;
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: built without CUDA");
}

fd_status fd_cuda_free_async(void *ptr, void *stream, fd_error *err) {
  (void)ptr, (void)stream;
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: built without CUDA");
}

fd_status fd_cuda_merge(const fd_merge_problem *p, const void *states_out, const float *states_lse,
                        void *out, float *lse, void *stream, fd_error *err) {
  (void)p, (void)states_out, (void)states_lse, (void)out, (void)lse, (void)stream;
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: built without CUDA");
}

fd_status fd_cuda_append(const fd_plan *plan, const fd_append_tensors *t, int32_t num_new,
                         void *stream, fd_error *err) {
  (void)plan, (void)t, (void)num_new, (void)stream;
  return fd_fail(err, FD_STATUS_UNSUPPORTED, "backend: built without CUDA");
}
