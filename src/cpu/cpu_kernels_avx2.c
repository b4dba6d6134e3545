/*
 * cpu_kernels_avx2.c — the CPU kernel for AVX2 + FMA + F16C (contract in
 * cpu_kernels.h). 8 floats a vector; fp16 widens with vcvtph2ps, bf16 with a
 * 16-bit shift (both exact); head_dim tails that are not a multiple of 8 are
 * read through masked float loads (f32) or a zero-padded copy (f16, bf16).
 *
 * The same structure as the AVX-512 kernel with half the lanes: scores in
 * register tiles of 4 rows x 2 keys (2 x 4, 1 x 8), 8 accumulators summed by
 * one 8-to-1 tree; a polynomial exp; values in tiles of 4 rows x 16 columns.
 * head_dim <= 8 has its own steps (keys in lanes; see the section below).
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
  fd_cpu_adjust_scores(b, FD_CPU_KEY_BLOCK);
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

/* ---- head_dim <= 8: keys in lanes (as in cpu_kernels_avx512.c) -------------
 * 8 keys are transposed in registers so that t[d] holds column d of the 8
 * keys: a row's 8 scores are head_dim FMAs with q[r][d] broadcast, no
 * reduction. f32: each key's two halves go into 128-bit lanes ([key a |
 * key a + 4]) and two in-lane 4x4 transposes finish it (8 inserts, 16
 * shuffles per 8 keys); bf16: 4 column pairs (32 bits) per key, one 4x4
 * transpose, then a shift and an and; f16 and head_dim < 8: rows widened
 * one by one, then an 8x8 transpose. Values: one 8-lane accumulator per row.
 * The softmax runs over blocks of up to FD_CPU_SMALL_BLOCK keys. */

/* One row of head_dim <= 8 elements at p, widened to 8 floats (FULL:
 * head_dim == 8; else the columns past it read as 0, not touched). */
static FD_INLINE FD_AVX2 __m256 load_row8(const char *p, int head_dim, const int FULL, fd_dtype dtype) {
  return FULL ? load8(p, 0, dtype) : load8_part(p, 0, head_dim, dtype);
}

/* 4x4 transposes of 32-bit elements in both 128-bit lanes: out[c] lane l
 * element e = in[e] lane l element c. */
static FD_INLINE FD_AVX2 void transpose4_lanes(const __m256 in[4], __m256 out[4]) {
  const __m256 t0 = _mm256_unpacklo_ps(in[0], in[1]), t1 = _mm256_unpackhi_ps(in[0], in[1]);
  const __m256 t2 = _mm256_unpacklo_ps(in[2], in[3]), t3 = _mm256_unpackhi_ps(in[2], in[3]);
  out[0] = _mm256_shuffle_ps(t0, t2, 0x44);
  out[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  out[2] = _mm256_shuffle_ps(t1, t3, 0x44);
  out[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}

/* Key j of the block (padded to a multiple of 32 keys: see cpu_kernels.h). */
static FD_INLINE const char *key_at(const fd_cpu_block *b, int j) {
  return (const char *)b->keys[j] + b->key_off;
}

/* Keys j0 .. j0 + 7 of the block (past num_keys: the padding; its scores are
 * discarded), transposed: lane i of t[d] = column d of key j0 + i, widened
 * (columns >= head_dim: 0). */
static FD_INLINE FD_AVX2 void keys8_t(const fd_cpu_block *b, int j0, __m256 t[8], const int FULL,
                                      fd_dtype dtype) {
  if (FULL && dtype == FD_DTYPE_F32) {
    __m256 lo[4], hi[4];
    for (int a = 0; a < 4; a++) {
      const float *k0 = (const float *)key_at(b, j0 + a), *k1 = (const float *)key_at(b, j0 + a + 4);
      lo[a] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(k0)), _mm_loadu_ps(k1), 1);
      hi[a] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(k0 + 4)), _mm_loadu_ps(k1 + 4), 1);
    }
    transpose4_lanes(lo, t);
    transpose4_lanes(hi, t + 4);
    return;
  }
  if (FULL && dtype == FD_DTYPE_BF16) {
    __m256 z[4], pr[4];
    for (int a = 0; a < 4; a++)
      z[a] = _mm256_castsi256_ps(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)key_at(b, j0 + a))),
          _mm_loadu_si128((const __m128i *)key_at(b, j0 + a + 4)), 1));
    transpose4_lanes(z, pr); /* pr[c]: column pair c of the 8 keys */
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    for (int c = 0; c < 4; c++) {
      t[2 * c] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pr[c]), 16));
      t[2 * c + 1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(pr[c]), high));
    }
    return;
  }
  __m256 r[8], lo[4], hi[4];
  for (int i = 0; i < 8; i++) r[i] = load_row8(key_at(b, j0 + i), b->head_dim, FULL, dtype);
  /* lo[c] / hi[c]: columns c and c + 4 of keys 0..3 / 4..7 in the two lanes */
  transpose4_lanes(r, lo);
  transpose4_lanes(r + 4, hi);
  for (int c = 0; c < 4; c++) {
    t[c] = _mm256_permute2f128_ps(lo[c], hi[c], 0x20);
    t[c + 4] = _mm256_permute2f128_ps(lo[c], hi[c], 0x31);
  }
}

/* small_scores: scale * q . k of every row for every key of the block into
 * scratch, 8 keys at a time. head_dim <= 8; FULL: head_dim == 8. */
static FD_INLINE FD_AVX2 void scores_small(const fd_cpu_block *b, const int FULL, fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys, rows = b->rows;
  const __m256 scale = _mm256_set1_ps(b->scale);
  for (int j0 = 0; j0 < nk; j0 += 8) {
    __m256 t[8];
    keys8_t(b, j0, t, FULL, dtype);
    for (int r = 0; r < rows; r++) {
      const float *q = b->q + (ptrdiff_t)r * head_dim;
      __m256 s0 = _mm256_mul_ps(_mm256_broadcast_ss(q), t[0]), s1 = _mm256_setzero_ps();
      for (int d = 1; d + 1 < head_dim; d += 2) { /* two chains */
        s1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d), t[d], s1);
        s0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 1), t[d + 1], s0);
      }
      if (head_dim % 2 == 0) s1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + head_dim - 1), t[head_dim - 1], s1);
      /* j0 + 8 <= stride: lanes past the row's keys land in its row */
      _mm256_storeu_ps(b->scratch + (ptrdiff_t)r * b->stride + j0, _mm256_mul_ps(_mm256_add_ps(s0, s1), scale));
    }
  }
}

/* The max / sum of the 8 lanes of x, in every lane. */
static FD_INLINE FD_AVX2 __m256 all_max8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 0x01));
  x = _mm256_max_ps(x, _mm256_permute_ps(x, 0x4E));
  return _mm256_max_ps(x, _mm256_permute_ps(x, 0xB1));
}

static FD_INLINE FD_AVX2 __m256 all_sum8(__m256 x) {
  x = _mm256_add_ps(x, _mm256_permute2f128_ps(x, x, 0x01));
  x = _mm256_add_ps(x, _mm256_permute_ps(x, 0x4E));
  return _mm256_add_ps(x, _mm256_permute_ps(x, 0xB1));
}

/* small_softmax (as softmax_rows_v in cpu_kernels_avx512.c, 8 rows a
 * vector): each row's max and sum in vectors, alpha of 8 rows one exp8. */
static FD_INLINE FD_AVX2 void softmax_small(const fd_cpu_block *b) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int r0 = 0; r0 < b->rows; r0 += 8) {
    const int nr = b->rows - r0 < 8 ? b->rows - r0 : 8;
    /* lane i: row r0 + i; rows that see no key keep m_old = m_use = sum =
     * 0, so alpha = exp(0) = 1 and l stays l */
    __m256 m_old = _mm256_setzero_ps(), m_use = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
    __m256 l_old = _mm256_setzero_ps();
    for (int i = 0; i < nr; i++) {
      const int r = r0 + i, n = b->count ? b->count[r] : b->num_keys;
      const __m256 lane = _mm256_castsi256_ps(_mm256_cmpeq_epi32(iota, _mm256_set1_epi32(i)));
      l_old = _mm256_blendv_ps(l_old, _mm256_set1_ps(b->l[r]), lane);
      if (n <= 0) continue;
      float *s = b->scratch + (ptrdiff_t)r * b->stride;
      const int full = n & ~7, tail = n & 7;
      __m256 mx = neg_inf, mx2 = neg_inf;
      int j = 0;
      for (; j + 16 <= full; j += 16) {
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
        mx2 = _mm256_max_ps(mx2, _mm256_loadu_ps(s + j + 8));
      }
      if (j < full) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
      /* the last n % 8 scores, lanes past n -inf (the row has room for
       * them: n rounded up to 8 is at most the stride) */
      __m256 st = neg_inf;
      if (tail) {
        st = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(s + full), _mm256_castsi256_ps(first_lanes(tail)));
        mx2 = _mm256_max_ps(mx2, st);
      }
      const __m256 mo = _mm256_set1_ps(b->m[r]);
      /* m' = max(block max, m) (a NaN block max keeps m, as the scalar form) */
      const __m256 mn = _mm256_max_ps(all_max8(_mm256_max_ps(mx, mx2)), mo);
      const __m256 mu = _mm256_blendv_ps(mn, _mm256_setzero_ps(), _mm256_cmp_ps(mn, neg_inf, _CMP_EQ_OQ));
      __m256 sm = _mm256_setzero_ps(), sm2 = _mm256_setzero_ps();
      for (j = 0; j + 16 <= full; j += 16) {
        const __m256 p0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mu));
        const __m256 p1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mu));
        _mm256_storeu_ps(s + j, p0);
        _mm256_storeu_ps(s + j + 8, p1);
        sm = _mm256_add_ps(sm, p0);
        sm2 = _mm256_add_ps(sm2, p1);
      }
      if (j < full) {
        const __m256 p0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mu));
        _mm256_storeu_ps(s + j, p0);
        sm = _mm256_add_ps(sm, p0);
      }
      if (tail) {
        const __m256 p1 = exp8(_mm256_sub_ps(st, mu)); /* exp(-inf) = 0 past n */
        _mm256_storeu_ps(s + full, p1);
        sm2 = _mm256_add_ps(sm2, p1);
      }
      m_old = _mm256_blendv_ps(m_old, mo, lane);
      m_use = _mm256_blendv_ps(m_use, mu, lane);
      sum = _mm256_blendv_ps(sum, all_sum8(_mm256_add_ps(sm, sm2)), lane);
      b->m[r] = _mm256_cvtss_f32(mn);
    }
    float al[8], l_new[8];
    const __m256 a = exp8(_mm256_sub_ps(m_old, m_use));
    _mm256_storeu_ps(al, a);
    _mm256_storeu_ps(l_new, _mm256_add_ps(_mm256_mul_ps(l_old, a), sum));
    for (int i = 0; i < nr; i++) {
      b->alpha[r0 + i] = al[i];
      b->l[r0 + i] = l_new[i];
    }
  }
}

/* acc = alpha * acc + P V for rows [r0, r0 + RT) over keys [0, n), one
 * 8-lane accumulator per row, U sets (keys j = u mod U, added in order at
 * the end) so that RT * U = 8 FMA chains are in flight. */
static FD_INLINE FD_AVX2 void values_small_tile(const fd_cpu_block *b, int r0, int n, const int RT,
                                                const int U, const int FULL, fd_dtype dtype) {
  const int head_dim = b->head_dim;
  const __m256i dm = first_lanes(head_dim);
  __m256 acc[8]; /* [u][r] */
  for (int r = 0; r < RT; r++) {
    const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim;
    acc[r] = _mm256_mul_ps(FULL ? _mm256_loadu_ps(a) : _mm256_maskload_ps(a, dm),
                           _mm256_set1_ps(b->alpha[r0 + r]));
  }
  for (int i = RT; i < RT * U; i++) acc[i] = _mm256_setzero_ps();
  const float *p = b->scratch + (ptrdiff_t)r0 * b->stride;
  const ptrdiff_t ps = b->stride;
  int j = 0;
  for (; j + U <= n; j += U)
    for (int u = 0; u < U; u++) {
      const __m256 v = load_row8((const char *)b->values[j + u] + b->value_off, head_dim, FULL, dtype);
      for (int r = 0; r < RT; r++)
        acc[u * RT + r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * ps + j + u), v, acc[u * RT + r]);
    }
  for (; j < n; j++) {
    const __m256 v = load_row8((const char *)b->values[j] + b->value_off, head_dim, FULL, dtype);
    for (int r = 0; r < RT; r++) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * ps + j), v, acc[r]);
  }
  for (int u = 1; u < U; u++)
    for (int r = 0; r < RT; r++) acc[r] = _mm256_add_ps(acc[r], acc[u * RT + r]);
  for (int r = 0; r < RT; r++) {
    float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim;
    if (FULL)
      _mm256_storeu_ps(a, acc[r]);
    else
      _mm256_maskstore_ps(a, dm, acc[r]);
  }
}

/* small_values: head_dim <= 8 (FULL: == 8). */
static FD_INLINE FD_AVX2 void values_small(const fd_cpu_block *b, const int FULL, fd_dtype dtype) {
  if (b->count) { /* rows see different key counts: one at a time */
    for (int r = 0; r < b->rows; r++)
      if (b->count[r] > 0) values_small_tile(b, r, b->count[r], 1, 8, FULL, dtype);
    return;
  }
  const int nk = b->num_keys;
  int r = 0;
  for (; r + 4 <= b->rows; r += 4) values_small_tile(b, r, nk, 4, 2, FULL, dtype);
  for (; r + 2 <= b->rows; r += 2) values_small_tile(b, r, nk, 2, 4, FULL, dtype);
  for (; r < b->rows; r++) values_small_tile(b, r, nk, 1, 8, FULL, dtype);
}

/* One instance per dtype, so the load switch folds away; the small-head_dim
 * steps branch once on head_dim == 8 (no partial rows). */
#define FD_AVX2_KERNELS(suffix, dtype)                                                    \
  static FD_AVX2 void scores_##suffix(const fd_cpu_block *b) { scores_body(b, dtype); } \
  static FD_AVX2 void values_##suffix(const fd_cpu_block *b) { values_body(b, dtype); } \
  static FD_AVX2 void small_scores_##suffix(const fd_cpu_block *b) {                    \
    if (b->head_dim == 8)                                                               \
      scores_small(b, 1, dtype);                                                        \
    else                                                                                \
      scores_small(b, 0, dtype);                                                        \
  }                                                                                     \
  static FD_AVX2 void small_values_##suffix(const fd_cpu_block *b) {                    \
    if (b->head_dim == 8)                                                               \
      values_small(b, 1, dtype);                                                        \
    else                                                                                \
      values_small(b, 0, dtype);                                                        \
  }

FD_AVX2_KERNELS(f32, FD_DTYPE_F32)
FD_AVX2_KERNELS(f16, FD_DTYPE_F16)
FD_AVX2_KERNELS(bf16, FD_DTYPE_BF16)

static FD_AVX2 void small_softmax(const fd_cpu_block *b) { softmax_small(b); }
#endif

int fd_cpu_kernels_avx2(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX2_KERNELS
  k->small_softmax = small_softmax;
  k->small_head_dim = 8;
  k->paired = 0;
  switch (dtype) {
    case FD_DTYPE_F32:
      k->scores = scores_f32, k->values = values_f32;
      k->small_scores = small_scores_f32, k->small_values = small_values_f32;
      return 1;
    case FD_DTYPE_F16:
      k->scores = scores_f16, k->values = values_f16;
      k->small_scores = small_scores_f16, k->small_values = small_values_f16;
      return 1;
    case FD_DTYPE_BF16:
      k->scores = scores_bf16, k->values = values_bf16;
      k->small_scores = small_scores_bf16, k->small_values = small_values_bf16;
      return 1;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* fp8 caches: cpu_decode.c widens them to float32 */
  }
#endif
  (void)dtype;
  (void)k;
  return 0;
}
