/* errors.c — status and dtype names, and the messages failing calls write. */
#include <stdio.h>

#include "internal.h"

const char *fd_status_name(fd_status status) {
  switch (status) {
    case FD_STATUS_OK: return "FD_STATUS_OK";
    case FD_STATUS_INVALID_ARGUMENT: return "FD_STATUS_INVALID_ARGUMENT";
    case FD_STATUS_UNSUPPORTED: return "FD_STATUS_UNSUPPORTED";
    case FD_STATUS_WORKSPACE_TOO_SMALL: return "FD_STATUS_WORKSPACE_TOO_SMALL";
    case FD_STATUS_OUT_OF_MEMORY: return "FD_STATUS_OUT_OF_MEMORY";
    case FD_STATUS_BACKEND_ERROR: return "FD_STATUS_BACKEND_ERROR";
  }
  return "FD_STATUS_UNKNOWN";
}

fd_status fd_fail(fd_error *err, fd_status status, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->status = status;
  }
  return status;
}

fd_status fd_ok(fd_error *err) {
  if (err) {
    err->status = FD_STATUS_OK;
    err->message[0] = '\0';
  }
  return FD_STATUS_OK;
}

const char *fd_dtype_name(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return "FD_DTYPE_F32";
    case FD_DTYPE_F16: return "FD_DTYPE_F16";
    case FD_DTYPE_BF16: return "FD_DTYPE_BF16";
    case FD_DTYPE_E4M3: return "FD_DTYPE_E4M3";
    case FD_DTYPE_E5M2: return "FD_DTYPE_E5M2";
  }
  return "an invalid dtype";
}
