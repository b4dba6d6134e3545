/*
 * split.h — where split s of a sequence begins and ends. Shared, word for
 * word, by the CPU backend, the combine steps and the CUDA kernels, so every
 * backend cuts the keys the same way (see flashdecode.h, "HOW").
 */
#ifndef FD_SPLIT_H
#define FD_SPLIT_H

#include <stdint.h>

#include "row_keys.h"

#if defined(__CUDACC__)
#define FD_HD __host__ __device__ __forceinline__
#else
#define FD_HD static inline
#endif

/* Keys per split for a sequence of kv_len keys: a whole number of chunks. */
FD_HD int32_t fd_split_len(int32_t kv_len, int32_t chunk_len, int32_t num_splits) {
  /* 64-bit: kv_len + chunk_len - 1 overflows int32 near 2^31. */
  int64_t chunks = ((int64_t)kv_len + chunk_len - 1) / chunk_len;
  int64_t per_split = (chunks + num_splits - 1) / num_splits;
  int64_t len = per_split * chunk_len;
  return len > INT32_MAX ? INT32_MAX : (int32_t)len;
}

/* The first key any row of a sequence may see (fd_first_seen_key,
 * row_keys.h: 0 without a window, i.e. window_left < 0 as the plan resolves
 * it), rounded down to a multiple of chunk_len. Splits cut keys
 * [start, kv_len): pass kv_len - start as the length to the functions above
 * and add start to the ranges. Rounding down keeps tiles and paged copies on
 * multiples of chunk_len keys. */
FD_HD int32_t fd_window_start(int32_t kv_len, int32_t q_len, int32_t window_left,
                              int32_t chunk_len) {
  const int32_t lo = fd_first_seen_key(kv_len, q_len, window_left);
  return lo / chunk_len * chunk_len;
}

/* Keys per split of a sequence: fixed_len when the plan fixes it (the
 * deterministic mode), else fd_split_len of the len keys. */
FD_HD int32_t fd_seq_split_len(int32_t len, int32_t chunk_len, int32_t num_splits,
                               int32_t fixed_len) {
  return fixed_len > 0 ? fixed_len : fd_split_len(len, chunk_len, num_splits);
}

/* THE cut every backend makes (split kernels, combine steps, CPU): split
 * `split` of a sequence of kv_len keys covers keys [*begin, *end): keys
 * [w0, kv_len) (w0 = fd_window_start) in pieces of fd_seq_split_len keys;
 * empty (begin == end) past the last key. */
FD_HD void fd_seq_split(int32_t kv_len, int32_t q_len, int32_t window_left, int32_t chunk_len,
                        int32_t num_splits, int32_t fixed_len, int32_t split, int32_t *begin,
                        int32_t *end) {
  const int32_t w0 = fd_window_start(kv_len, q_len, window_left, chunk_len);
  const int32_t len = kv_len - w0;
  if (len <= 0) {
    *begin = *end = w0 > kv_len ? kv_len : w0;
    if (kv_len <= 0) *begin = *end = 0;
    return;
  }
  const int64_t per = fd_seq_split_len(len, chunk_len, num_splits, fixed_len);
  int64_t b = (int64_t)split * per, e = b + per;
  if (b > len) b = len;
  if (e > len) e = len;
  *begin = (int32_t)(w0 + b);
  *end = (int32_t)(w0 + e);
}

/* Splits of fd_seq_split that hold at least one key (0 for kv_len <= 0). */
FD_HD int32_t fd_seq_active_splits(int32_t kv_len, int32_t q_len, int32_t window_left,
                                   int32_t chunk_len, int32_t num_splits, int32_t fixed_len) {
  const int32_t len = kv_len - fd_window_start(kv_len, q_len, window_left, chunk_len);
  if (len <= 0) return 0;
  const int64_t per = fd_seq_split_len(len, chunk_len, num_splits, fixed_len);
  return (int32_t)(((int64_t)len + per - 1) / per);
}

#undef FD_HD
#endif /* FD_SPLIT_H */
