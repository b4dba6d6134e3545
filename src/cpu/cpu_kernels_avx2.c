/*
 * cpu_kernels_avx2.c — the CPU kernels for AVX2 + FMA + F16C (contract in
 * cpu_kernels.h). 8 floats a vector; fp16 widens with vcvtph2ps, bf16 with a
 * 16-bit shift (both exact); head_dim tails that are not a multiple of 8 run
 * in scalar code. Built with default flags: the target attribute enables the
 * instructions per function, and dispatch calls these only when the CPU has
 * them.
 */
#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX2_KERNELS 1
#include <immintrin.h>

#define FD_AVX2 __attribute__((target("avx2,fma,f16c")))

/* 8 elements of `dtype` at row + i, widened to float. */
static inline FD_AVX2 __m256 load8(const void *row, int i, fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return _mm256_loadu_ps((const float *)row + i);
    case FD_DTYPE_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    default: {
      __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

/* One element, widened (the tails). */
static inline float elem(const void *row, int i, fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return ((const float *)row)[i];
    case FD_DTYPE_F16: return fd_f16_to_f32(((const uint16_t *)row)[i]);
    default: return fd_bf16_to_f32(((const uint16_t *)row)[i]);
  }
}

static inline FD_AVX2 float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline FD_AVX2 void scores_body(const float *q, int64_t ld_q, int rows,
                                       const void *const *keys, int num_keys, int head_dim,
                                       float scale, float *scores, int ld_scores, fd_dtype dtype) {
  const int full = head_dim & ~7;
  for (int j = 0; j < num_keys; j++) {
    const void *k = keys[j];
    int r = 0;
    /* four rows at once share each widened key vector */
    for (; r + 4 <= rows; r += 4) {
      const float *q0 = q + r * ld_q, *q1 = q0 + ld_q, *q2 = q1 + ld_q, *q3 = q2 + ld_q;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int d = 0; d < full; d += 8) {
        __m256 kv = load8(k, d, dtype);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), kv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), kv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), kv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), kv, a3);
      }
      float s0 = hsum8(a0), s1 = hsum8(a1), s2 = hsum8(a2), s3 = hsum8(a3);
      for (int d = full; d < head_dim; d++) {
        float kd = elem(k, d, dtype);
        s0 += q0[d] * kd;
        s1 += q1[d] * kd;
        s2 += q2[d] * kd;
        s3 += q3[d] * kd;
      }
      scores[(r + 0) * ld_scores + j] = scale * s0;
      scores[(r + 1) * ld_scores + j] = scale * s1;
      scores[(r + 2) * ld_scores + j] = scale * s2;
      scores[(r + 3) * ld_scores + j] = scale * s3;
    }
    for (; r < rows; r++) {
      const float *q0 = q + r * ld_q;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0;
      int d = 0;
      for (; d + 16 <= full; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), load8(k, d, dtype), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d + 8), load8(k, d + 8, dtype), a1);
      }
      for (; d < full; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), load8(k, d, dtype), a0);
      float s0 = hsum8(_mm256_add_ps(a0, a1));
      for (d = full; d < head_dim; d++) s0 += q0[d] * elem(k, d, dtype);
      scores[r * ld_scores + j] = scale * s0;
    }
  }
}

static inline FD_AVX2 void accumulate_body(float *acc, int64_t ld_acc, int rows, const float *alpha,
                                           const float *p, int ld_p, const int *count,
                                           const void *const *values, int head_dim,
                                           fd_dtype dtype) {
  const int full = head_dim & ~7;
  for (int r = 0; r < rows; r++) {
    const int n = count[r];
    if (n <= 0) continue;
    float *a = acc + r * ld_acc;
    const float *pr = p + r * ld_p;
    const __m256 al = _mm256_set1_ps(alpha[r]);
    int d = 0;
    /* 32 columns at once: four independent FMA chains */
    for (; d + 32 <= full; d += 32) {
      __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(a + d), al);
      __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(a + d + 8), al);
      __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(a + d + 16), al);
      __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(a + d + 24), al);
      for (int j = 0; j < n; j++) {
        const __m256 pj = _mm256_set1_ps(pr[j]);
        const void *v = values[j];
        a0 = _mm256_fmadd_ps(pj, load8(v, d, dtype), a0);
        a1 = _mm256_fmadd_ps(pj, load8(v, d + 8, dtype), a1);
        a2 = _mm256_fmadd_ps(pj, load8(v, d + 16, dtype), a2);
        a3 = _mm256_fmadd_ps(pj, load8(v, d + 24, dtype), a3);
      }
      _mm256_storeu_ps(a + d, a0);
      _mm256_storeu_ps(a + d + 8, a1);
      _mm256_storeu_ps(a + d + 16, a2);
      _mm256_storeu_ps(a + d + 24, a3);
    }
    for (; d < full; d += 8) {
      __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(a + d), al);
      for (int j = 0; j < n; j++)
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(pr[j]), load8(values[j], d, dtype), a0);
      _mm256_storeu_ps(a + d, a0);
    }
    for (; d < head_dim; d++) {
      float x = a[d] * alpha[r];
      for (int j = 0; j < n; j++) x += pr[j] * elem(values[j], d, dtype);
      a[d] = x;
    }
  }
}

/* One instance per dtype, so the load switch folds away. */
#define FD_AVX2_KERNELS(suffix, dtype)                                                          \
  static FD_AVX2 void scores_##suffix(const float *q, int64_t ld_q, int rows,                   \
                                      const void *const *keys, int num_keys, int head_dim,      \
                                      float scale, float *scores, int ld_scores) {              \
    scores_body(q, ld_q, rows, keys, num_keys, head_dim, scale, scores, ld_scores, dtype);      \
  }                                                                                             \
  static FD_AVX2 void accumulate_##suffix(float *acc, int64_t ld_acc, int rows,                 \
                                          const float *alpha, const float *p, int ld_p,         \
                                          const int *count, const void *const *values,          \
                                          int head_dim) {                                       \
    accumulate_body(acc, ld_acc, rows, alpha, p, ld_p, count, values, head_dim, dtype);         \
  }

FD_AVX2_KERNELS(f32, FD_DTYPE_F32)
FD_AVX2_KERNELS(f16, FD_DTYPE_F16)
FD_AVX2_KERNELS(bf16, FD_DTYPE_BF16)
#endif

int fd_cpu_kernels_avx2(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX2_KERNELS
  switch (dtype) {
    case FD_DTYPE_F32: k->scores = scores_f32; k->accumulate = accumulate_f32; return 1;
    case FD_DTYPE_F16: k->scores = scores_f16; k->accumulate = accumulate_f16; return 1;
    case FD_DTYPE_BF16: k->scores = scores_bf16; k->accumulate = accumulate_bf16; return 1;
  }
#endif
  (void)dtype;
  (void)k;
  return 0;
}
