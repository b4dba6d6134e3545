/*
 * cpu_kernels_avx512.c — the CPU kernels for AVX-512 F/BW/VL (contract in
 * cpu_kernels.h). 16 floats a vector; fp16 widens with vcvtph2ps, bf16 with a
 * 16-bit shift (both exact); head_dim tails use masked loads and stores
 * (masked-off lanes never touch memory), so any head_dim works. Built with
 * default flags: the target attribute enables the instructions per function,
 * and dispatch calls these only when the CPU has them.
 */
#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX512_KERNELS 1
#include <immintrin.h>

#define FD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* The lanes of `mask` of 16 elements of `dtype` at row + i, widened to
 * float; other lanes 0. */
static inline FD_AVX512 __m512 load16(const void *row, int i, __mmask16 mask, fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return _mm512_maskz_loadu_ps(mask, (const float *)row + i);
    case FD_DTYPE_F16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + i));
    default: {
      __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

/* Mask of the first n lanes (n <= 16). */
static inline __mmask16 first_lanes(int n) { return (__mmask16)((1u << n) - 1u); }

static inline FD_AVX512 void scores_body(const float *q, int64_t ld_q, int rows,
                                         const void *const *keys, int num_keys, int head_dim,
                                         float scale, float *scores, int ld_scores,
                                         fd_dtype dtype) {
  const int full = head_dim & ~15;
  const __mmask16 all = 0xffff, tail = first_lanes(head_dim & 15);
  for (int j = 0; j < num_keys; j++) {
    const void *k = keys[j];
    int r = 0;
    /* four rows at once share each widened key vector */
    for (; r + 4 <= rows; r += 4) {
      const float *q0 = q + r * ld_q, *q1 = q0 + ld_q, *q2 = q1 + ld_q, *q3 = q2 + ld_q;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int d = 0; d < full; d += 16) {
        __m512 kv = load16(k, d, all, dtype);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d), kv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + d), kv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + d), kv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q3 + d), kv, a3);
      }
      if (tail) {
        __m512 kv = load16(k, full, tail, dtype);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q0 + full), kv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q1 + full), kv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q2 + full), kv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q3 + full), kv, a3);
      }
      scores[(r + 0) * ld_scores + j] = scale * _mm512_reduce_add_ps(a0);
      scores[(r + 1) * ld_scores + j] = scale * _mm512_reduce_add_ps(a1);
      scores[(r + 2) * ld_scores + j] = scale * _mm512_reduce_add_ps(a2);
      scores[(r + 3) * ld_scores + j] = scale * _mm512_reduce_add_ps(a3);
    }
    for (; r < rows; r++) {
      const float *q0 = q + r * ld_q;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0;
      int d = 0;
      for (; d + 32 <= full; d += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d), load16(k, d, all, dtype), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d + 16), load16(k, d + 16, all, dtype), a1);
      }
      for (; d < full; d += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + d), load16(k, d, all, dtype), a0);
      if (tail)
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q0 + full), load16(k, full, tail, dtype),
                             a1);
      scores[r * ld_scores + j] = scale * _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
  }
}

static inline FD_AVX512 void accumulate_body(float *acc, int64_t ld_acc, int rows,
                                             const float *alpha, const float *p, int ld_p,
                                             const int *count, const void *const *values,
                                             int head_dim, fd_dtype dtype) {
  const __mmask16 all = 0xffff;
  for (int r = 0; r < rows; r++) {
    const int n = count[r];
    if (n <= 0) continue;
    float *a = acc + r * ld_acc;
    const float *pr = p + r * ld_p;
    const __m512 al = _mm512_set1_ps(alpha[r]);
    int d = 0;
    /* 64 columns at once: four independent FMA chains */
    for (; d + 64 <= head_dim; d += 64) {
      __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(a + d), al);
      __m512 a1 = _mm512_mul_ps(_mm512_loadu_ps(a + d + 16), al);
      __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(a + d + 32), al);
      __m512 a3 = _mm512_mul_ps(_mm512_loadu_ps(a + d + 48), al);
      for (int j = 0; j < n; j++) {
        const __m512 pj = _mm512_set1_ps(pr[j]);
        const void *v = values[j];
        a0 = _mm512_fmadd_ps(pj, load16(v, d, all, dtype), a0);
        a1 = _mm512_fmadd_ps(pj, load16(v, d + 16, all, dtype), a1);
        a2 = _mm512_fmadd_ps(pj, load16(v, d + 32, all, dtype), a2);
        a3 = _mm512_fmadd_ps(pj, load16(v, d + 48, all, dtype), a3);
      }
      _mm512_storeu_ps(a + d, a0);
      _mm512_storeu_ps(a + d + 16, a1);
      _mm512_storeu_ps(a + d + 32, a2);
      _mm512_storeu_ps(a + d + 48, a3);
    }
    /* the rest, 16 (or fewer, masked) columns at a time */
    for (; d < head_dim; d += 16) {
      const __mmask16 m = head_dim - d >= 16 ? all : first_lanes(head_dim - d);
      __m512 a0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + d), al);
      for (int j = 0; j < n; j++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(pr[j]), load16(values[j], d, m, dtype), a0);
      _mm512_mask_storeu_ps(a + d, m, a0);
    }
  }
}

/* One instance per dtype, so the load switch folds away. */
#define FD_AVX512_KERNELS(suffix, dtype)                                                        \
  static FD_AVX512 void scores_##suffix(const float *q, int64_t ld_q, int rows,                 \
                                        const void *const *keys, int num_keys, int head_dim,    \
                                        float scale, float *scores, int ld_scores) {            \
    scores_body(q, ld_q, rows, keys, num_keys, head_dim, scale, scores, ld_scores, dtype);      \
  }                                                                                             \
  static FD_AVX512 void accumulate_##suffix(float *acc, int64_t ld_acc, int rows,               \
                                            const float *alpha, const float *p, int ld_p,       \
                                            const int *count, const void *const *values,        \
                                            int head_dim) {                                     \
    accumulate_body(acc, ld_acc, rows, alpha, p, ld_p, count, values, head_dim, dtype);         \
  }

FD_AVX512_KERNELS(f32, FD_DTYPE_F32)
FD_AVX512_KERNELS(f16, FD_DTYPE_F16)
FD_AVX512_KERNELS(bf16, FD_DTYPE_BF16)
#endif

int fd_cpu_kernels_avx512(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX512_KERNELS
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
