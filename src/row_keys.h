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

/* Tree masks (fd_problem.tree_mask; flashdecode.h, TREE MASKS): row t of a
 * call with q_len rows over kv keys sees every prefix key 0 .. kv - q_len - 1
 * and draft key j (key kv - q_len + j) when bit j of its mask is set; keys
 * below 0 do not exist. fd_tree_row_keys gives the span [*lo, *hi) of
 * [begin, end) that holds every key the row sees (lo = hi = begin when it
 * sees none there); fd_tree_key_seen says whether key j (0 <= j < kv) is
 * one of them. Windows and non_causal are refused with a tree (plan.c). */
FD_RK_HD int fd_tree_key_seen(uint64_t mask, int q_len, int kv, int j) {
  const int d = j - (kv - q_len); /* the draft index, < 0 for a prefix key */
  return d < 0 ? 1 : (int)((mask >> d) & 1u);
}

FD_RK_HD void fd_tree_row_keys(uint64_t mask, int q_len, int kv, int begin, int end, int *lo,
                               int *hi) {
  int top = 0; /* draft keys 0 .. top - 1 hold every set bit */
  while (top < 64 && (mask >> top) != 0) top++;
  int h = kv - q_len + top; /* < 0 when kv < q_len */
  if (h > end) h = end;
  if (h <= begin) h = begin;
  *lo = begin;
  *hi = h;
}

/* Whether a tree row sees any key of [a, b) (0 <= a <= b <= kv). */
FD_RK_HD int fd_tree_sees_any(uint64_t mask, int q_len, int kv, int a, int b) {
  const int prefix = kv - q_len;
  if (a < prefix && a < b) return 1;
  int d0 = a - prefix, d1 = b - prefix; /* draft indices [d0, d1), 0 <= d0 */
  if (d0 < 0) d0 = 0;
  if (d1 <= d0) return 0;
  const uint64_t bits = mask >> d0;
  return d1 - d0 >= 64 ? bits != 0 : (bits & ((((uint64_t)1) << (d1 - d0)) - 1u)) != 0;
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
