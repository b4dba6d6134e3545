/*
 * dtype.c — fd_dtype_size, the element size of each fd_dtype: its own file
 * so that api.c, plan.c and the backends share it without reaching into one
 * another.
 */
#include "flashdecode.h"

size_t fd_dtype_size(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 4;
    case FD_DTYPE_F16: return 2;
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: return 1;
  }
  return 0;
}
