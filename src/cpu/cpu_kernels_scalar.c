/*
 * cpu_kernels_scalar.c — the CPU kernel in plain C (contract in
 * cpu_kernels.h). What machines without AVX2 run, and the readable statement
 * of what the SIMD variants compute.
 */
#include <math.h>

#include "cpu_kernels.h"

static inline void scores_body(const fd_cpu_block *b, fd_dtype dtype) {
  const int head_dim = b->head_dim;
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count ? b->count[r] : b->num_keys;
    b->alpha[r] = 1.0f;
    if (n <= 0) continue;
    const float *qr = b->q + (ptrdiff_t)r * head_dim;
    float *s = b->scratch + (ptrdiff_t)r * FD_CPU_KEY_BLOCK;
    float block_max = -INFINITY;
    for (int j = 0; j < n; j++) {
      const char *k = (const char *)b->keys[j] + b->key_off;
      float dot = 0.0f;
      for (int d = 0; d < head_dim; d++) dot += qr[d] * fd_load_elem(k, dtype, d);
      s[j] = dot * b->scale;
    }
    fd_cpu_adjust_row(b, r, s, n);
    for (int j = 0; j < n; j++)
      if (s[j] > block_max) block_max = s[j];
    const float m_new = block_max > b->m[r] ? block_max : b->m[r];
    const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* never (-inf) - (-inf) */
    const float alpha = expf(b->m[r] - m_use); /* m = -inf: 0 */
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
      s[j] = expf(s[j] - m_use);
      sum += s[j];
    }
    b->l[r] = b->l[r] * alpha + sum;
    b->m[r] = m_new;
    b->alpha[r] = alpha;
  }
}

static inline void values_body(const fd_cpu_block *b, fd_dtype dtype) {
  const int head_dim = b->head_dim;
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count ? b->count[r] : b->num_keys;
    if (n <= 0) continue;
    const float *s = b->scratch + (ptrdiff_t)r * b->stride;
    float *a = b->acc + (ptrdiff_t)r * head_dim;
    for (int d = 0; d < head_dim; d++) a[d] *= b->alpha[r];
    for (int j = 0; j < n; j++) {
      const char *v = (const char *)b->values[j] + b->value_off;
      for (int d = 0; d < head_dim; d++) a[d] += s[j] * fd_load_elem(v, dtype, d);
    }
  }
}

/* One instance per dtype, so the element switch folds away. */
#define FD_SCALAR_KERNELS(suffix, dtype)                                           \
  static void scores_##suffix(const fd_cpu_block *b) { scores_body(b, dtype); } \
  static void values_##suffix(const fd_cpu_block *b) { values_body(b, dtype); }

FD_SCALAR_KERNELS(f32, FD_DTYPE_F32)
FD_SCALAR_KERNELS(f16, FD_DTYPE_F16)
FD_SCALAR_KERNELS(bf16, FD_DTYPE_BF16)

int fd_cpu_kernels_scalar(fd_dtype dtype, fd_cpu_kernels *k) {
  switch (dtype) {
    case FD_DTYPE_F32: k->scores = scores_f32; k->values = values_f32; k->paired = 0; return 1;
    case FD_DTYPE_F16: k->scores = scores_f16; k->values = values_f16; k->paired = 0; return 1;
    case FD_DTYPE_BF16: k->scores = scores_bf16; k->values = values_bf16; k->paired = 0; return 1;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* fp8 caches: cpu_decode.c widens them to float32 */
  }
  return 0;
}
