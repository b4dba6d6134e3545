/*
 * nccl_glue.h — the CUDA runtime calls that nccl_merge.c needs, behind plain
 * C. nccl_glue_cuda.c implements them with the CUDA runtime (the library);
 * tests/nccl/mock_nccl.c implements them over host memory, together with a
 * mock of the NCCL calls, so that the merge's logic (layout, checks,
 * grouping, error paths) runs in CI without a GPU. Every function returns
 * FD_STATUS_OK or fills `err` (FD_STATUS_BACKEND_ERROR, naming the call).
 */
#ifndef FD_NCCL_GLUE_H
#define FD_NCCL_GLUE_H

#include <stddef.h>

#include "flashdecode.h"

/* *capturing = 1 when `stream` is being captured into a CUDA graph. */
fd_status fd_nccl_glue_capturing(int device, void *stream, int *capturing, fd_error *err);
/* Host -> device copy enqueued on `stream` (device memory of `device`). */
fd_status fd_nccl_glue_upload(int device, void *dst, const void *src, size_t bytes, void *stream,
                              fd_error *err);
/* Device -> host copy enqueued on `stream`, then the stream synchronised. */
fd_status fd_nccl_glue_download_sync(int device, void *dst, const void *src, size_t bytes,
                                     void *stream, fd_error *err);
/* *done = 1 when every piece of work enqueued on `stream` has finished. */
fd_status fd_nccl_glue_stream_done(void *stream, int *done, fd_error *err);
/* The backend fd_merge_states runs the local merge on: CUDA (the mock: CPU). */
fd_backend fd_nccl_glue_merge_backend(void);

#endif /* FD_NCCL_GLUE_H */
