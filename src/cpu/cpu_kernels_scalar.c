/*
 * cpu_kernels_scalar.c — the CPU kernels in plain C (contract in
 * cpu_kernels.h). What machines without AVX2 run, and the readable statement
 * of what the SIMD variants compute.
 */
#include "cpu_kernels.h"

/* Element i of a row of `dtype`, widened exactly to float. */
static inline float elem(const void *row, int i, fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return ((const float *)row)[i];
    case FD_DTYPE_F16: return fd_f16_to_f32(((const uint16_t *)row)[i]);
    default: return fd_bf16_to_f32(((const uint16_t *)row)[i]);
  }
}

static inline void scores_body(const float *q, int64_t ld_q, int rows, const void *const *keys,
                               int num_keys, int head_dim, float scale, float *scores,
                               int ld_scores, fd_dtype dtype) {
  for (int r = 0; r < rows; r++) {
    const float *qr = q + r * ld_q;
    for (int j = 0; j < num_keys; j++) {
      float dot = 0.0f;
      for (int d = 0; d < head_dim; d++) dot += qr[d] * elem(keys[j], d, dtype);
      scores[r * ld_scores + j] = scale * dot;
    }
  }
}

static inline void accumulate_body(float *acc, int64_t ld_acc, int rows, const float *alpha,
                                   const float *p, int ld_p, const int *count,
                                   const void *const *values, int head_dim, fd_dtype dtype) {
  for (int r = 0; r < rows; r++) {
    if (count[r] <= 0) continue;
    float *a = acc + r * ld_acc;
    const float *pr = p + r * ld_p;
    for (int d = 0; d < head_dim; d++) a[d] *= alpha[r];
    for (int j = 0; j < count[r]; j++)
      for (int d = 0; d < head_dim; d++) a[d] += pr[j] * elem(values[j], d, dtype);
  }
}

/* One instance per dtype, so the element switch folds away. */
#define FD_SCALAR_KERNELS(suffix, dtype)                                                        \
  static void scores_##suffix(const float *q, int64_t ld_q, int rows, const void *const *keys,  \
                              int num_keys, int head_dim, float scale, float *scores,          \
                              int ld_scores) {                                                 \
    scores_body(q, ld_q, rows, keys, num_keys, head_dim, scale, scores, ld_scores, dtype);     \
  }                                                                                            \
  static void accumulate_##suffix(float *acc, int64_t ld_acc, int rows, const float *alpha,    \
                                  const float *p, int ld_p, const int *count,                  \
                                  const void *const *values, int head_dim) {                   \
    accumulate_body(acc, ld_acc, rows, alpha, p, ld_p, count, values, head_dim, dtype);        \
  }

FD_SCALAR_KERNELS(f32, FD_DTYPE_F32)
FD_SCALAR_KERNELS(f16, FD_DTYPE_F16)
FD_SCALAR_KERNELS(bf16, FD_DTYPE_BF16)

int fd_cpu_kernels_scalar(fd_dtype dtype, fd_cpu_kernels *k) {
  switch (dtype) {
    case FD_DTYPE_F32: k->scores = scores_f32; k->accumulate = accumulate_f32; return 1;
    case FD_DTYPE_F16: k->scores = scores_f16; k->accumulate = accumulate_f16; return 1;
    case FD_DTYPE_BF16: k->scores = scores_bf16; k->accumulate = accumulate_bf16; return 1;
  }
  return 0;
}
