/*
 * cpu_kernels_avx2.c — the CPU kernel for AVX2 + FMA + F16C (contract in
 * cpu_kernels.h). 8 floats a vector; fp16 widens with vcvtph2ps, bf16 with a
 * 16-bit shift (both exact); head_dim tails that are not a multiple of 8 are
 * read through masked float loads (f32) or a zero-padded copy (f16, bf16).
 *
 * The same structure as the AVX-512 kernel with half the lanes: scores in
 * register tiles of 4 rows x 2 keys (2 x 4, 1 x 8), 8 accumulators summed by
 * one 8-to-1 tree; a polynomial exp; values in tiles of 4 rows x 16 columns.
 * Built with default flags: the target attribute enables the instructions per
 * function, and dispatch calls these only when the CPU has them.
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX2_KERNELS 1
#include <immintrin.h>

#define FD_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FD_INLINE inline __attribute__((always_inline))

#if FD_CPU_KEY_BLOCK != 32
#error "the softmax below holds a key block in four vectors"
#endif

/* 8 elements of `dtype` at row + i, widened to float. */
static FD_INLINE FD_AVX2 __m256 load8(const void *row, int i, fd_dtype dtype) {
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

/* Lanes below n set (all-ones), others clear; n may be <= 0 or >= 8. */
static FD_INLINE FD_AVX2 __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first n (< 8) elements at row + i widened, other lanes 0; nothing
 * past them is read. */
static FD_INLINE FD_AVX2 __m256 load8_part(const void *row, int i, int n, fd_dtype dtype) {
  if (n <= 0) return _mm256_setzero_ps();
  if (dtype == FD_DTYPE_F32) return _mm256_maskload_ps((const float *)row + i, first_lanes(n));
  uint16_t pad[8] = {0};
  memcpy(pad, (const uint16_t *)row + i, (size_t)n * sizeof(uint16_t));
  return load8(pad, 0, dtype);
}

/* Lane n = the sum of the 8 lanes of in[n]. */
static FD_INLINE FD_AVX2 __m256 reduce8(const __m256 *in) {
  __m256 t[4];
  for (int i = 0; i < 4; i++)
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(in[i], in[i + 4], 0x20),
                         _mm256_permute2f128_ps(in[i], in[i + 4], 0x31));
  return _mm256_hadd_ps(_mm256_hadd_ps(t[0], t[1]), _mm256_hadd_ps(t[2], t[3]));
}

/* exp(x) for x <= 0, as exp16 in cpu_kernels_avx512.c: 2^n * P(r), degree-7
 * Taylor P, 2^n built in the exponent field; x < -87 gives 0. */
static FD_INLINE FD_AVX2 __m256 exp8(__m256 x) {
  const __m256 floor_x = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, floor_x, _CMP_LT_OQ);
  x = _mm256_max_ps(floor_x, x); /* a NaN x is the result */
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  /* n in [-126, 0]: 2^n = (n + 127) << 23 */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Scores of rows [r0, r0 + RT) for every key of the block, KT keys at a
 * time (RT * KT = 8 accumulators), into scratch. */
static FD_INLINE FD_AVX2 void scores_tile(const fd_cpu_block *b, int r0, const int RT,
                                          const int KT, fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys, full = head_dim & ~7;
  const int tail = head_dim & 7;
  const float *qp[4];
  for (int r = 0; r < RT; r++) qp[r] = b->q + (ptrdiff_t)(r0 + r) * head_dim;
  for (int j0 = 0; j0 < nk; j0 += KT) {
    const char *kp[8];
    for (int i = 0; i < KT; i++) /* past the last key: repeat it, discard the score */
      kp[i] = (const char *)b->keys[j0 + i < nk ? j0 + i : nk - 1] + b->key_off;
    __m256 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
    for (int d = 0; d < full; d += 8) {
      __m256 kv[8];
      for (int i = 0; i < KT; i++) kv[i] = load8(kp[i], d, dtype);
      for (int r = 0; r < RT; r++) {
        const __m256 qv = _mm256_loadu_ps(qp[r] + d);
        for (int i = 0; i < KT; i++) acc[r * KT + i] = _mm256_fmadd_ps(qv, kv[i], acc[r * KT + i]);
      }
    }
    if (tail) {
      __m256 kv[8];
      for (int i = 0; i < KT; i++) kv[i] = load8_part(kp[i], full, tail, dtype);
      for (int r = 0; r < RT; r++) {
        const __m256 qv = _mm256_maskload_ps(qp[r] + full, first_lanes(tail));
        for (int i = 0; i < KT; i++) acc[r * KT + i] = _mm256_fmadd_ps(qv, kv[i], acc[r * KT + i]);
      }
    }
    float sums[8]; /* [r * KT + i]: row r, key j0 + i */
    _mm256_storeu_ps(sums, _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(b->scale)));
    const int valid = nk - j0 < KT ? nk - j0 : KT;
    for (int r = 0; r < RT; r++)
      for (int i = 0; i < valid; i++)
        b->scratch[(ptrdiff_t)(r0 + r) * FD_CPU_KEY_BLOCK + j0 + i] = sums[r * KT + i];
  }
}

static FD_INLINE FD_AVX2 float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static FD_INLINE FD_AVX2 float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Online softmax of every row (see cpu_kernels_avx512.c). */
static FD_INLINE FD_AVX2 void softmax_rows(const fd_cpu_block *b) {
  float *alpha = b->alpha;
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count ? b->count[r] : b->num_keys;
    if (n <= 0) {
      alpha[r] = 1.0f;
      continue;
    }
    float *s = b->scratch + (ptrdiff_t)r * FD_CPU_KEY_BLOCK;
    __m256 sv[4];
    for (int i = 0; i < 4; i++) /* lanes past the row's keys: -inf (never read) */
      sv[i] = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(s + 8 * i, first_lanes(n - 8 * i)),
                               _mm256_castsi256_ps(first_lanes(n - 8 * i)));
    const float block_max =
        hmax8(_mm256_max_ps(_mm256_max_ps(sv[0], sv[1]), _mm256_max_ps(sv[2], sv[3])));
    const float m_old = b->m[r];
    const float m_new = block_max > m_old ? block_max : m_old;
    const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* never (-inf) - (-inf) */
    const __m256 mv = _mm256_set1_ps(m_use);
    __m256 sum = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
      const __m256 p = exp8(_mm256_sub_ps(sv[i], mv));
      _mm256_storeu_ps(s + 8 * i, p);
      sum = _mm256_add_ps(sum, p);
    }
    alpha[r] = expf(m_old - m_use); /* m_old = -inf: 0 */
    b->l[r] = b->l[r] * alpha[r] + hsum8(sum);
    b->m[r] = m_new;
  }
}

/* acc = alpha * acc + P V for rows [r0, r0 + RT) that all see every key of
 * the block, 16 columns at a time (RT * 2 accumulators). */
static FD_INLINE FD_AVX2 void values_tile(const fd_cpu_block *b, const float *alpha, int r0,
                                          const int RT, fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys;
  const float *p = b->scratch + (ptrdiff_t)r0 * FD_CPU_KEY_BLOCK;
  /* small tiles keep U sets of accumulators, for keys j = u mod U, added up
   * in order at the end: at least 8 FMA chains in flight */
  const int U = RT >= 4 ? 1 : RT >= 2 ? 2 : 4;
  int d0 = 0;
  for (; d0 + 16 <= head_dim; d0 += 16) {
    __m256 acc[8]; /* [u][r][2] */
    for (int r = 0; r < RT; r++) {
      const __m256 al = _mm256_set1_ps(alpha[r0 + r]);
      const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
      acc[2 * r] = _mm256_mul_ps(_mm256_loadu_ps(a), al);
      acc[2 * r + 1] = _mm256_mul_ps(_mm256_loadu_ps(a + 8), al);
    }
    for (int i = 2 * RT; i < 2 * RT * U; i++) acc[i] = _mm256_setzero_ps();
    for (int j = 0; j < nk; j += U) {
      for (int u = 0; u < U && j + u < nk; u++) {
        const char *v = (const char *)b->values[j + u] + b->value_off;
        const __m256 v0 = load8(v, d0, dtype), v1 = load8(v, d0 + 8, dtype);
        for (int r = 0; r < RT; r++) {
          const __m256 pj = _mm256_broadcast_ss(p + r * FD_CPU_KEY_BLOCK + j + u);
          acc[2 * RT * u + 2 * r] = _mm256_fmadd_ps(pj, v0, acc[2 * RT * u + 2 * r]);
          acc[2 * RT * u + 2 * r + 1] = _mm256_fmadd_ps(pj, v1, acc[2 * RT * u + 2 * r + 1]);
        }
      }
    }
    for (int u = 1; u < U; u++)
      for (int i = 0; i < 2 * RT; i++) acc[i] = _mm256_add_ps(acc[i], acc[2 * RT * u + i]);
    for (int r = 0; r < RT; r++) {
      float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
      _mm256_storeu_ps(a, acc[2 * r]);
      _mm256_storeu_ps(a + 8, acc[2 * r + 1]);
    }
  }
  if (d0 < head_dim) { /* 1..15 columns left */
    const int c0 = head_dim - d0 < 8 ? head_dim - d0 : 8, c1 = head_dim - d0 - c0;
    const __m256i m0 = first_lanes(c0), m1 = first_lanes(c1);
    __m256 acc[8];
    for (int r = 0; r < RT; r++) {
      const __m256 al = _mm256_set1_ps(alpha[r0 + r]);
      const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
      acc[2 * r] = _mm256_mul_ps(_mm256_maskload_ps(a, m0), al);
      acc[2 * r + 1] = c1 > 0 ? _mm256_mul_ps(_mm256_maskload_ps(a + 8, m1), al) : _mm256_setzero_ps();
    }
    for (int j = 0; j < nk; j++) {
      const char *v = (const char *)b->values[j] + b->value_off;
      const __m256 v0 = c0 == 8 ? load8(v, d0, dtype) : load8_part(v, d0, c0, dtype);
      const __m256 v1 = load8_part(v, d0 + 8, c1, dtype);
      for (int r = 0; r < RT; r++) {
        const __m256 pj = _mm256_broadcast_ss(p + r * FD_CPU_KEY_BLOCK + j);
        acc[2 * r] = _mm256_fmadd_ps(pj, v0, acc[2 * r]);
        acc[2 * r + 1] = _mm256_fmadd_ps(pj, v1, acc[2 * r + 1]);
      }
    }
    for (int r = 0; r < RT; r++) {
      float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
      _mm256_maskstore_ps(a, m0, acc[2 * r]);
      if (c1 > 0) _mm256_maskstore_ps(a + 8, m1, acc[2 * r + 1]);
    }
  }
}

/* acc = alpha * acc + P V row by row, over each row's own key count. */
static FD_INLINE FD_AVX2 void values_counted(const fd_cpu_block *b, fd_dtype dtype) {
  const float *alpha = b->alpha;
  const int head_dim = b->head_dim;
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count[r];
    if (n <= 0) continue;
    const float *p = b->scratch + (ptrdiff_t)r * FD_CPU_KEY_BLOCK;
    float *a = b->acc + (ptrdiff_t)r * head_dim;
    for (int d = 0; d < head_dim; d += 8) {
      const int c = head_dim - d < 8 ? head_dim - d : 8;
      const __m256i m = first_lanes(c);
      __m256 acc = _mm256_mul_ps(_mm256_maskload_ps(a + d, m), _mm256_set1_ps(alpha[r]));
      for (int j = 0; j < n; j++) {
        const char *v = (const char *)b->values[j] + b->value_off;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), c == 8 ? load8(v, d, dtype) : load8_part(v, d, c, dtype),
                              acc);
      }
      _mm256_maskstore_ps(a + d, m, acc);
    }
  }
}

static FD_INLINE FD_AVX2 void scores_body(const fd_cpu_block *b, fd_dtype dtype) {
  int r = 0;
  for (; r + 4 <= b->rows; r += 4) scores_tile(b, r, 4, 2, dtype);
  for (; r + 2 <= b->rows; r += 2) scores_tile(b, r, 2, 4, dtype);
  for (; r < b->rows; r++) scores_tile(b, r, 1, 8, dtype);
  softmax_rows(b);
}

static FD_INLINE FD_AVX2 void values_body(const fd_cpu_block *b, fd_dtype dtype) {
  if (b->count) {
    values_counted(b, dtype);
    return;
  }
  int r = 0;
  for (; r + 4 <= b->rows; r += 4) values_tile(b, b->alpha, r, 4, dtype);
  for (; r + 2 <= b->rows; r += 2) values_tile(b, b->alpha, r, 2, dtype);
  for (; r < b->rows; r++) values_tile(b, b->alpha, r, 1, dtype);
}

/* One instance per dtype, so the load switch folds away. */
#define FD_AVX2_KERNELS(suffix, dtype)                                                    \
  static FD_AVX2 void scores_##suffix(const fd_cpu_block *b) { scores_body(b, dtype); } \
  static FD_AVX2 void values_##suffix(const fd_cpu_block *b) { values_body(b, dtype); }

FD_AVX2_KERNELS(f32, FD_DTYPE_F32)
FD_AVX2_KERNELS(f16, FD_DTYPE_F16)
FD_AVX2_KERNELS(bf16, FD_DTYPE_BF16)
#endif

int fd_cpu_kernels_avx2(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX2_KERNELS
  switch (dtype) {
    case FD_DTYPE_F32: k->scores = scores_f32; k->values = values_f32; k->paired = 0; return 1;
    case FD_DTYPE_F16: k->scores = scores_f16; k->values = values_f16; k->paired = 0; return 1;
    case FD_DTYPE_BF16: k->scores = scores_bf16; k->values = values_bf16; k->paired = 0; return 1;
  }
#endif
  (void)dtype;
  (void)k;
  return 0;
}
