/*
 * split.h — where split s of a sequence begins and ends. Shared, word for
 * word, by the CPU backend, the combine steps and the CUDA kernels, so every
 * backend cuts the keys the same way (see flashdecode.h, "HOW").
 */
#ifndef FD_SPLIT_H
#define FD_SPLIT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FD_HD __host__ __device__ __forceinline__
#else
#define FD_HD static inline
#endif

/* Keys of the longest split of a sequence of kv_len keys cut by
 * fd_split_range: ceil(chunks / num_splits) whole chunks (the plan sizes its
 * splits by it; the fixed-length cut of the deterministic mode uses it as
 * the length of every split). */
FD_HD int32_t fd_split_len(int32_t kv_len, int32_t chunk_len, int32_t num_splits) {
  /* 64-bit: kv_len + chunk_len - 1 overflows int32 near 2^31. */
  int64_t chunks = ((int64_t)kv_len + chunk_len - 1) / chunk_len;
  int64_t per_split = (chunks + num_splits - 1) / num_splits;
  int64_t len = per_split * chunk_len;
  return len > INT32_MAX ? INT32_MAX : (int32_t)len;
}

/* Splits that hold at least one key: min(num_splits, chunks) (0 when
 * kv_len <= 0). */
FD_HD int32_t fd_active_splits(int32_t kv_len, int32_t chunk_len, int32_t num_splits) {
  if (kv_len <= 0) return 0;
#if defined(FD_SPLIT_EVEN) && !FD_SPLIT_EVEN /* A/B scaffolding: the former cut */
  return (int32_t)(((int64_t)kv_len + fd_split_len(kv_len, chunk_len, num_splits) - 1) /
                   fd_split_len(kv_len, chunk_len, num_splits));
#endif
  const int64_t chunks = ((int64_t)kv_len + chunk_len - 1) / chunk_len;
  return chunks < num_splits ? (int32_t)chunks : num_splits;
}

/* Keys [*begin, *end) of split `split` of kv_len keys; empty (begin == end)
 * past the last of the n = fd_active_splits splits. The F = kv_len /
 * chunk_len whole chunks are shared out as evenly as n splits allow (split s
 * begins at chunk ceil(s F / n)), and the last split also takes the partial
 * chunk (kv_len % chunk_len keys). So the longest split holds ceil(F / n)
 * chunks, or floor(F / n) chunks and the partial one: at kv_len = 8193 in 16
 * splits, 8 chunks and one key, where whole-chunk pieces of
 * fd_split_len keys would give 9 chunks to 14 splits and none to the 16th.
 * Never more than fd_split_len keys. */
FD_HD void fd_split_range(int32_t kv_len, int32_t chunk_len, int32_t num_splits, int32_t split,
                          int32_t *begin, int32_t *end) {
#if defined(FD_SPLIT_EVEN) && !FD_SPLIT_EVEN /* A/B scaffolding: the former cut */
  if (kv_len <= 0) {
    *begin = *end = 0;
    return;
  }
  {
    int32_t len = fd_split_len(kv_len, chunk_len, num_splits);
    int64_t b = (int64_t)split * len, e = b + len;
    *begin = (int32_t)(b > kv_len ? kv_len : b);
    *end = (int32_t)(e > kv_len ? kv_len : e);
    return;
  }
#endif
  const int32_t n = fd_active_splits(kv_len, chunk_len, num_splits);
  if (split >= n) {
    *begin = *end = kv_len > 0 ? kv_len : 0;
    return;
  }
  const int64_t whole = (int64_t)kv_len / chunk_len;
  const int64_t b = ((int64_t)split * whole + n - 1) / n * chunk_len;
  const int64_t e = split == n - 1 ? kv_len : ((int64_t)(split + 1) * whole + n - 1) / n * chunk_len;
  *begin = (int32_t)b;
  *end = (int32_t)e;
}

/* The first key any row of a sequence may see, rounded down to a multiple of
 * chunk_len: 0 without a window (window_left < 0), else
 * max(0, kv_len - q_len - window_left) rounded down (the first row's window
 * starts there). Splits cut keys [start, kv_len): pass kv_len - start as the
 * length to the functions above and add start to the ranges. Rounding down
 * keeps tiles and paged copies on multiples of chunk_len keys. */
FD_HD int32_t fd_window_start(int32_t kv_len, int32_t q_len, int32_t window_left,
                              int32_t chunk_len) {
  if (window_left < 0 || kv_len <= 0) return 0;
  int64_t lo = (int64_t)kv_len - q_len - window_left;
  if (lo <= 0) return 0;
  return (int32_t)(lo / chunk_len * chunk_len);
}

/* THE cut every backend makes (split kernels, combine steps, CPU): split
 * `split` of a sequence of kv_len keys covers keys [*begin, *end) of keys
 * [w0, kv_len) (w0 = fd_window_start): fd_split_range of those len keys, or,
 * when the plan fixes the split length (fixed_len > 0: the deterministic
 * mode), pieces of fixed_len keys in order; empty (begin == end) past the
 * last key. */
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
  int32_t b, e;
  if (fixed_len > 0) {
    int64_t b64 = (int64_t)split * fixed_len, e64 = b64 + fixed_len;
    b = (int32_t)(b64 > len ? len : b64);
    e = (int32_t)(e64 > len ? len : e64);
  } else {
    fd_split_range(len, chunk_len, num_splits, split, &b, &e);
  }
  *begin = w0 + b;
  *end = w0 + e;
}

/* Splits of fd_seq_split that hold at least one key (0 for kv_len <= 0). */
FD_HD int32_t fd_seq_active_splits(int32_t kv_len, int32_t q_len, int32_t window_left,
                                   int32_t chunk_len, int32_t num_splits, int32_t fixed_len) {
  const int32_t len = kv_len - fd_window_start(kv_len, q_len, window_left, chunk_len);
  if (len <= 0) return 0;
  if (fixed_len > 0) return (int32_t)(((int64_t)len + fixed_len - 1) / fixed_len);
  return fd_active_splits(len, chunk_len, num_splits);
}

#undef FD_HD
#endif /* FD_SPLIT_H */
