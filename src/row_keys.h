/*
 * row_keys.h — which keys a query row sees: the one definition the CUDA
 * kernels (through device_util.cuh), the CPU backend, the float64 reference
 * and the host checks (scales.c, split.h's fd_window_start) share.
 *
 * Query token t of a call with q_len tokens over kv_len keys sits at
 * position pos = kv_len - q_len + t. A causal row sees keys 0 .. pos; with a
 * sliding window (window_left >= 0) only pos - window_left .. pos; a
 * non-causal row sees every key 0 .. kv_len - 1. window_left is the plan's
 * resolved value (fd_plan_init): >= 0 exactly when a window applies, -1
 * otherwise, so no caller looks at has_window.
 *
 * Plain C (static inline) for the host, __host__ __device__ under nvcc.
 */
#ifndef FD_ROW_KEYS_H
#define FD_ROW_KEYS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FD_RK_HD __host__ __device__ __forceinline__
#else
#define FD_RK_HD static inline
#endif

/* Keys [*lo, *hi) that query token t sees within [begin, end) (a split's
 * keys, or 0 .. kv_len for all of them; 0 <= begin <= end <= kv). A row
 * that sees none of them gets lo = hi = begin. In 32 bits without overflow:
 * pos >= -q_len; pos - l is only negative-large when pos < 0, and then kv <
 * q_len bounds l; the window test is pos - window_left > l, written so that
 * neither side leaves the int range. */
FD_RK_HD void fd_row_keys(int t, int q_len, int kv, int window_left, int non_causal, int begin,
                          int end, int *lo, int *hi) {
  const int pos = kv - q_len + t; /* < 0 when kv < q_len */
  int h = non_causal ? kv : pos + 1;
  int l = begin;
  if (window_left >= 0 && pos - l > window_left) l = pos - window_left;
  if (h > end) h = end;
  if (h <= l) h = l = begin;
  *lo = l;
  *hi = h;
}

/* The first key any row of a sequence of kv_len keys sees: the first row's
 * window start, max(0, kv_len - q_len - window_left), with a window; 0
 * without. Every key from it to kv_len - 1 is seen by some row. */
FD_RK_HD int32_t fd_first_seen_key(int32_t kv_len, int32_t q_len, int32_t window_left) {
  if (window_left < 0) return 0;
  const int64_t lo = (int64_t)kv_len - q_len - window_left;
  return lo > 0 ? (int32_t)lo : 0;
}

#undef FD_RK_HD
#endif /* FD_ROW_KEYS_H */
