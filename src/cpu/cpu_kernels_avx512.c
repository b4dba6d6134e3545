/*
 * cpu_kernels_avx512.c — the CPU kernels for AVX-512 F/BW/VL (contract in
 * cpu_kernels.h). 16 floats a vector; fp16 widens with vcvtph2ps, bf16 with a
 * 16-bit shift (both exact); head_dim tails use masked loads and stores
 * (masked-off lanes never touch memory), so any head_dim works.
 *
 * Scores: register tiles of 4 rows x 4 keys (2 x 8, 1 x 16 for the last
 * rows), 16 dot-product accumulators over head_dim, summed by one 16-to-1
 * transpose-add tree; the next tile's key rows are prefetched meanwhile.
 * Online softmax: 16 scores a vector with a polynomial exp. Values: register
 * tiles of 4 rows x 64 columns, each value vector loaded and widened once for
 * the 4 rows. bf16 with head_dim a multiple of 32 runs in the paired column
 * order (cpu_kernels.h): 32 keys or values widen with two instructions
 * instead of four. (vdpbf16ps was tried for the bf16 scores and dropped: on
 * Sapphire Rapids it multiplies at half the FMA rate; bench/NOTES.md.)
 *
 * head_dim <= 8 has its own steps (small_* in cpu_kernels.h): keys
 * transposed into lanes, no reductions per score (see that section below).
 *
 * Built with default flags: the target attribute enables the instructions
 * per function, and dispatch calls these only when the CPU has them.
 */
#include <math.h>

#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX512_KERNELS 1
#include <immintrin.h>

#define FD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define FD_INLINE inline __attribute__((always_inline))

#if FD_CPU_KEY_BLOCK != 32
#error "the softmax below holds a key block in two vectors"
#endif

/* The lanes of `mask` of 16 elements of `dtype` at row + i, widened to
 * float; other lanes 0. */
static FD_INLINE FD_AVX512 __m512 load16(const void *row, int i, __mmask16 mask, fd_dtype dtype) {
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

/* Asks L1 for the lines of [p, p + bytes): the next key tile's rows while
 * this one computes (rows a head-count stride apart are too short for the
 * hardware prefetchers to lock on to; +10-15 % cold, bench/NOTES.md). */
static FD_INLINE void prefetch_row(const char *p, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* Value rows are prefetched this many keys ahead. */
#define FD_VALUE_PREFETCH 8

/* Mask of the first n lanes (n <= 16; n <= 0: none). */
static FD_INLINE __mmask16 first_lanes(int n) {
  return n <= 0 ? (__mmask16)0 : (__mmask16)((1u << (n < 16 ? n : 16)) - 1u);
}

/* Lane n = the sum of the 16 lanes of in[n]. */
static FD_INLINE FD_AVX512 __m512 reduce16(const __m512 *in) {
  __m512 t[8], u[4];
  /* the tree leaves lane 4k+i holding input 4i+k: feed it transposed */
  for (int i = 0; i < 8; i++) {
    const __m512 a = in[((2 * i) % 4) * 4 + (2 * i) / 4];
    const __m512 b = in[((2 * i + 1) % 4) * 4 + (2 * i + 1) / 4];
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int i = 0; i < 4; i++)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  const __m512 p = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
  const __m512 q = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
  return _mm512_add_ps(_mm512_shuffle_ps(p, q, 0x44), _mm512_shuffle_ps(p, q, 0xEE));
}

/* exp(x) for x <= 0: 2^n * P(r), n = round(x / ln 2), r = x - n ln 2 (ln 2
 * in two parts), P the degree-7 Taylor polynomial (|r| <= ln2 / 2: relative
 * error < 1e-8 before rounding). x < -87 (exp below the normal floats,
 * -inf included) gives 0; NaN stays NaN. */
static FD_INLINE FD_AVX512 __m512 exp16(__m512 x) {
  const __m512 floor_x = _mm512_set1_ps(-87.0f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, floor_x, _CMP_LT_OQ);
  x = _mm512_max_ps(floor_x, x); /* a NaN x is the result */
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(p, n));
}

/* Scores of rows [r0, r0 + RT) for every key of the block, KT keys at a
 * time (RT * KT = 16 accumulators), into scratch. */
static FD_INLINE FD_AVX512 void scores_tile(const fd_cpu_block *b, int r0, const int RT,
                                            const int KT, fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys, full = head_dim & ~15;
  const __mmask16 tail = first_lanes(head_dim & 15);
  const float *qp[4];
  for (int r = 0; r < RT; r++) qp[r] = b->q + (ptrdiff_t)(r0 + r) * head_dim;
  for (int j0 = 0; j0 < nk; j0 += KT) {
    const char *kp[16];
    for (int i = 0; i < KT; i++) /* past the last key: repeat it, discard the score */
      kp[i] = (const char *)b->keys[j0 + i < nk ? j0 + i : nk - 1] + b->key_off;
    for (int i = 0; i < KT && j0 + KT + i < nk; i++)
      prefetch_row((const char *)b->keys[j0 + KT + i] + b->key_off,
                   head_dim * (dtype == FD_DTYPE_F32 ? 4 : 2));
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < full; d += 16) {
      if (RT == 1) {
        const __m512 qv = _mm512_loadu_ps(qp[0] + d);
        for (int i = 0; i < KT; i++)
          acc[i] = _mm512_fmadd_ps(qv, load16(kp[i], d, 0xffff, dtype), acc[i]);
      } else {
        __m512 kv[16];
        for (int i = 0; i < KT; i++) kv[i] = load16(kp[i], d, 0xffff, dtype);
        for (int r = 0; r < RT; r++) {
          const __m512 qv = _mm512_loadu_ps(qp[r] + d);
          for (int i = 0; i < KT; i++) acc[r * KT + i] = _mm512_fmadd_ps(qv, kv[i], acc[r * KT + i]);
        }
      }
    }
    if (tail) {
      __m512 kv[16];
      for (int i = 0; i < KT; i++) kv[i] = load16(kp[i], full, tail, dtype);
      for (int r = 0; r < RT; r++) {
        const __m512 qv = _mm512_maskz_loadu_ps(tail, qp[r] + full);
        for (int i = 0; i < KT; i++) acc[r * KT + i] = _mm512_fmadd_ps(qv, kv[i], acc[r * KT + i]);
      }
    }
    /* lane r * KT + i: row r, key j0 + i */
    const __m512 sums = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(b->scale));
    const __mmask16 keys = first_lanes(nk - j0 < KT ? nk - j0 : KT);
    for (int r = 0; r < RT; r++)
      _mm512_mask_storeu_ps(b->scratch + (ptrdiff_t)(r0 + r) * FD_CPU_KEY_BLOCK + j0 - r * KT,
                            (__mmask16)(keys << (r * KT)), sums);
  }
}

/* bf16 scores, head_dim % 32 == 0, in the paired order: q rows go into
 * [16 even columns][16 odd columns] per 32 (a local copy), each 64-byte load
 * of a key widens with one shift (even columns) and one and (odd ones), and
 * the dot product sums both halves. RT * KT = 16 accumulators, as
 * scores_tile. */
static FD_INLINE FD_AVX512 void scores_tile_pairs(const fd_cpu_block *b, int r0, const int RT,
                                                  const int KT) {
  const int head_dim = b->head_dim, nk = b->num_keys;
  const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
  const __m512i even_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  float qp[4][256] __attribute__((aligned(64))); /* rows in the paired order */
  for (int r = 0; r < RT; r++) {
    const float *qr = b->q + (ptrdiff_t)(r0 + r) * head_dim;
    for (int c = 0; c < head_dim; c += 32) {
      const __m512 lo = _mm512_loadu_ps(qr + c), hi = _mm512_loadu_ps(qr + c + 16);
      _mm512_store_ps(qp[r] + c, _mm512_permutex2var_ps(lo, even_idx, hi));
      _mm512_store_ps(qp[r] + c + 16, _mm512_permutex2var_ps(lo, odd_idx, hi));
    }
  }
  for (int j0 = 0; j0 < nk; j0 += KT) {
    const char *kp[16];
    for (int i = 0; i < KT; i++) /* past the last key: repeat it, discard the score */
      kp[i] = (const char *)b->keys[j0 + i < nk ? j0 + i : nk - 1] + b->key_off;
    for (int i = 0; i < KT && j0 + KT + i < nk; i++)
      prefetch_row((const char *)b->keys[j0 + KT + i] + b->key_off, 2 * head_dim);
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; d += 32) {
      if (RT == 1) {
        const __m512 qe = _mm512_load_ps(qp[0] + d), qo = _mm512_load_ps(qp[0] + d + 16);
        for (int i = 0; i < KT; i++) {
          const __m512i x = _mm512_loadu_si512((const void *)(kp[i] + 2 * d));
          acc[i] = _mm512_fmadd_ps(qe, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), acc[i]);
          acc[i] = _mm512_fmadd_ps(qo, _mm512_castsi512_ps(_mm512_and_si512(x, high)), acc[i]);
        }
      } else {
        __m512 ke[16], ko[16];
        for (int i = 0; i < KT; i++) {
          const __m512i x = _mm512_loadu_si512((const void *)(kp[i] + 2 * d));
          ke[i] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
          ko[i] = _mm512_castsi512_ps(_mm512_and_si512(x, high));
        }
        for (int r = 0; r < RT; r++) {
          const __m512 qe = _mm512_load_ps(qp[r] + d), qo = _mm512_load_ps(qp[r] + d + 16);
          for (int i = 0; i < KT; i++) {
            acc[r * KT + i] = _mm512_fmadd_ps(qe, ke[i], acc[r * KT + i]);
            acc[r * KT + i] = _mm512_fmadd_ps(qo, ko[i], acc[r * KT + i]);
          }
        }
      }
    }
    const __m512 sums = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(b->scale));
    const __mmask16 keys = first_lanes(nk - j0 < KT ? nk - j0 : KT);
    for (int r = 0; r < RT; r++)
      _mm512_mask_storeu_ps(b->scratch + (ptrdiff_t)(r0 + r) * FD_CPU_KEY_BLOCK + j0 - r * KT,
                            (__mmask16)(keys << (r * KT)), sums);
  }
}

/* Online softmax of every row: scores -> exp(s - m') in scratch (0 past the
 * row's keys), m, l updated, alpha[r] = exp(m - m') (1 for rows that see no
 * key of the block). */
static FD_INLINE FD_AVX512 void softmax_rows(const fd_cpu_block *b) {
  float *alpha = b->alpha;
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count ? b->count[r] : b->num_keys;
    if (n <= 0) {
      alpha[r] = 1.0f;
      continue;
    }
    float *s = b->scratch + (ptrdiff_t)r * FD_CPU_KEY_BLOCK;
    const __m512 s0 = _mm512_mask_loadu_ps(neg_inf, first_lanes(n), s);
    const __m512 s1 = _mm512_mask_loadu_ps(neg_inf, first_lanes(n - 16), s + 16);
    const float block_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    const float m_old = b->m[r];
    const float m_new = block_max > m_old ? block_max : m_old;
    const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* never (-inf) - (-inf) */
    const __m512 mv = _mm512_set1_ps(m_use);
    const __m512 p0 = exp16(_mm512_sub_ps(s0, mv)), p1 = exp16(_mm512_sub_ps(s1, mv));
    _mm512_storeu_ps(s, p0);
    _mm512_storeu_ps(s + 16, p1);
    alpha[r] = expf(m_old - m_use); /* m_old = -inf: 0 */
    b->l[r] = b->l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
    b->m[r] = m_new;
  }
}

/* Independent key sets for a tile of A accumulators: at least 8 FMA chains
 * in flight (an FMA's latency is 4 cycles, two issue per cycle). */
#define FD_KEY_SETS(A) ((A) >= 8 ? 1 : (A) >= 4 ? 2 : 4)

/* acc = alpha * acc + P V for rows [r0, r0 + RT) that all see every key of
 * the block, columns [d0, d0 + 16 * DT) (RT * DT <= 16 accumulators; small
 * tiles keep U sets of them, for keys j = u mod U, added up in order at the
 * end). FULL: all those columns exist (plain loads); else lanes past head_dim
 * are masked off. */
static FD_INLINE FD_AVX512 void values_cols(const fd_cpu_block *b, const float *alpha, int r0,
                                            int d0, const int RT, const int DT, const int FULL,
                                            fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys;
  const int A = RT * DT, U = FD_KEY_SETS(A);
  const size_t elem = dtype == FD_DTYPE_F32 ? 4 : 2;
  __mmask16 cols[4];
  for (int i = 0; i < DT; i++) cols[i] = FULL ? (__mmask16)0xffff : first_lanes(head_dim - d0 - 16 * i);
  __m512 acc[16]; /* [u][r][i] */
  for (int r = 0; r < RT; r++) {
    const __m512 al = _mm512_set1_ps(alpha[r0 + r]);
    const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < DT; i++)
      acc[r * DT + i] = _mm512_mul_ps(
          FULL ? _mm512_loadu_ps(a + 16 * i) : _mm512_maskz_loadu_ps(cols[i], a + 16 * i), al);
  }
  for (int i = A; i < U * A; i++) acc[i] = _mm512_setzero_ps();
  const float *p = b->scratch + (ptrdiff_t)r0 * FD_CPU_KEY_BLOCK;
  const ptrdiff_t off = b->value_off + (ptrdiff_t)d0 * (ptrdiff_t)elem;
  int j = 0;
  for (; j + U <= nk; j += U) {
    for (int u = 0; u < U; u++) {
      const char *v = (const char *)b->values[j + u] + off;
      if (j + u + FD_VALUE_PREFETCH < nk)
        prefetch_row((const char *)b->values[j + u + FD_VALUE_PREFETCH] + off, DT * 16 * (int)elem);
      __m512 vv[4];
      for (int i = 0; i < DT; i++) vv[i] = load16(v, 16 * i, FULL ? (__mmask16)0xffff : cols[i], dtype);
      for (int r = 0; r < RT; r++) {
        const __m512 pj = _mm512_set1_ps(p[r * FD_CPU_KEY_BLOCK + j + u]);
        for (int i = 0; i < DT; i++)
          acc[u * A + r * DT + i] = _mm512_fmadd_ps(pj, vv[i], acc[u * A + r * DT + i]);
      }
    }
  }
  for (; j < nk; j++) {
    const char *v = (const char *)b->values[j] + off;
    __m512 vv[4];
    for (int i = 0; i < DT; i++) vv[i] = load16(v, 16 * i, FULL ? (__mmask16)0xffff : cols[i], dtype);
    for (int r = 0; r < RT; r++) {
      const __m512 pj = _mm512_set1_ps(p[r * FD_CPU_KEY_BLOCK + j]);
      for (int i = 0; i < DT; i++) acc[r * DT + i] = _mm512_fmadd_ps(pj, vv[i], acc[r * DT + i]);
    }
  }
  for (int u = 1; u < U; u++)
    for (int i = 0; i < A; i++) acc[i] = _mm512_add_ps(acc[i], acc[u * A + i]);
  for (int r = 0; r < RT; r++) {
    float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < DT; i++) {
      if (FULL)
        _mm512_storeu_ps(a + 16 * i, acc[r * DT + i]);
      else
        _mm512_mask_storeu_ps(a + 16 * i, cols[i], acc[r * DT + i]);
    }
  }
}

/* values_cols over every column of rows [r0, r0 + RT). */
static FD_INLINE FD_AVX512 void values_tile(const fd_cpu_block *b, const float *alpha, int r0,
                                            const int RT, const int DT, fd_dtype dtype) {
  int d0 = 0;
  for (; d0 + 16 * DT <= b->head_dim; d0 += 16 * DT) values_cols(b, alpha, r0, d0, RT, DT, 1, dtype);
  if (d0 < b->head_dim) values_cols(b, alpha, r0, d0, RT, DT, 0, dtype);
}

/* Rows with DT vectors of columns per tile: 4 at a time, then 2, then 1. */
static FD_INLINE FD_AVX512 void values_rows(const fd_cpu_block *b, const float *alpha,
                                            const int DT, fd_dtype dtype) {
  int r = 0;
  for (; r + 4 <= b->rows; r += 4) values_tile(b, alpha, r, 4, DT, dtype);
  for (; r + 2 <= b->rows; r += 2) values_tile(b, alpha, r, 2, DT, dtype);
  for (; r < b->rows; r++) values_tile(b, alpha, r, 1, DT, dtype);
}

/* bf16 values, paired order (cpu_kernels.h), head_dim % 32 == 0: acc =
 * alpha * acc + P V for rows [r0, r0 + RT) that see every key of the block,
 * columns [d0, d0 + 32 * CT) (key sets as in values_cols). A 64-byte load of
 * 32 bf16 widens with one shift (the even columns) and one and (the odd
 * ones). */
static FD_INLINE FD_AVX512 void values_pairs(const fd_cpu_block *b, const float *alpha, int r0,
                                             int d0, const int RT, const int CT) {
  const int head_dim = b->head_dim, nk = b->num_keys;
  const int A = RT * 2 * CT, U = FD_KEY_SETS(A);
  const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
  __m512 acc[16]; /* [u][r][c][even, odd] */
  for (int r = 0; r < RT; r++) {
    const __m512 al = _mm512_set1_ps(alpha[r0 + r]);
    const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < 2 * CT; i++) acc[r * 2 * CT + i] = _mm512_mul_ps(_mm512_loadu_ps(a + 16 * i), al);
  }
  for (int i = A; i < U * A; i++) acc[i] = _mm512_setzero_ps();
  const float *p = b->scratch + (ptrdiff_t)r0 * FD_CPU_KEY_BLOCK;
  const ptrdiff_t off = b->value_off + (ptrdiff_t)d0 * 2;
  for (int j = 0; j < nk; j += U) {
    for (int u = 0; u < U && j + u < nk; u++) {
      const char *v = (const char *)b->values[j + u] + off;
      if (j + u + FD_VALUE_PREFETCH < nk)
        prefetch_row((const char *)b->values[j + u + FD_VALUE_PREFETCH] + off, 64 * CT);
      __m512 vv[8];
      for (int c = 0; c < CT; c++) {
        const __m512i x = _mm512_loadu_si512((const void *)(v + 64 * c));
        vv[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        vv[2 * c + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, high));
      }
      for (int r = 0; r < RT; r++) {
        const __m512 pj = _mm512_set1_ps(p[r * FD_CPU_KEY_BLOCK + j + u]);
        for (int i = 0; i < 2 * CT; i++)
          acc[u * A + r * 2 * CT + i] = _mm512_fmadd_ps(pj, vv[i], acc[u * A + r * 2 * CT + i]);
      }
    }
  }
  for (int u = 1; u < U; u++)
    for (int i = 0; i < A; i++) acc[i] = _mm512_add_ps(acc[i], acc[u * A + i]);
  for (int r = 0; r < RT; r++) {
    float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < 2 * CT; i++) _mm512_storeu_ps(a + 16 * i, acc[r * 2 * CT + i]);
  }
}

/* values_pairs over every column of rows [r0, r0 + RT): CT chunks at a time,
 * then 2, then 1. */
static FD_INLINE FD_AVX512 void values_pairs_tile(const fd_cpu_block *b, const float *alpha,
                                                  int r0, const int RT, const int CT) {
  int d0 = 0;
  for (; d0 + 32 * CT <= b->head_dim; d0 += 32 * CT) values_pairs(b, alpha, r0, d0, RT, CT);
  if (CT > 2)
    for (; d0 + 64 <= b->head_dim; d0 += 64) values_pairs(b, alpha, r0, d0, RT, 2);
  for (; d0 < b->head_dim; d0 += 32) values_pairs(b, alpha, r0, d0, RT, 1);
}

/* acc = alpha * acc + P V row by row, over each row's own key count. */
static FD_INLINE FD_AVX512 void values_counted(const fd_cpu_block *b, const float *alpha,
                                               fd_dtype dtype) {
  const int head_dim = b->head_dim;
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count[r];
    if (n <= 0) continue;
    const float *p = b->scratch + (ptrdiff_t)r * FD_CPU_KEY_BLOCK;
    float *a = b->acc + (ptrdiff_t)r * head_dim;
    if (dtype == FD_DTYPE_BF16 && head_dim % 32 == 0) { /* paired order */
      const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
      for (int d = 0; d < head_dim; d += 32) {
        const __m512 al = _mm512_set1_ps(alpha[r]);
        __m512 even = _mm512_mul_ps(_mm512_loadu_ps(a + d), al);
        __m512 odd = _mm512_mul_ps(_mm512_loadu_ps(a + d + 16), al);
        for (int j = 0; j < n; j++) {
          const __m512i x = _mm512_loadu_si512(
              (const void *)((const char *)b->values[j] + b->value_off + (ptrdiff_t)d * 2));
          const __m512 pj = _mm512_set1_ps(p[j]);
          even = _mm512_fmadd_ps(pj, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), even);
          odd = _mm512_fmadd_ps(pj, _mm512_castsi512_ps(_mm512_and_si512(x, high)), odd);
        }
        _mm512_storeu_ps(a + d, even);
        _mm512_storeu_ps(a + d + 16, odd);
      }
      continue;
    }
    for (int d = 0; d < head_dim; d += 16) {
      const __mmask16 cols = first_lanes(head_dim - d);
      __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(cols, a + d), _mm512_set1_ps(alpha[r]));
      for (int j = 0; j < n; j++)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j]),
                              load16((const char *)b->values[j] + b->value_off, d, cols, dtype), acc);
      _mm512_mask_storeu_ps(a + d, cols, acc);
    }
  }
}

/* ---- head_dim <= 8: keys in lanes -------------------------------------------
 * A 16-lane dot product over 8 columns would leave half its lanes empty and
 * need a 16-to-1 reduction per 16 scores. Instead 16 keys are loaded two per
 * vector ([key i | key i + 8]) and transposed in registers (3 shuffles per
 * vector, 24 per 16 keys; bf16: 4 keys per vector as column pairs, 8
 * shuffles), so that t[d] holds column d of 16 keys: a row's 16 scores are
 * then head_dim FMAs with q[r][d] broadcast, no reduction. The values step
 * keeps each row's 8 accumulators in one 8-lane vector (one FMA per key and
 * row). */

/* Lane-wise max / sum of all 16 lanes of x, in every lane (no scalar
 * round trip: a butterfly of 4 shuffles). */
static FD_INLINE FD_AVX512 __m512 all_max16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
  x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));
  return _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));
}

static FD_INLINE FD_AVX512 __m512 all_sum16(__m512 x) {
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E));
  return _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
}

/* The small steps' online softmax (contract: small_softmax in
 * cpu_kernels.h), for blocks of up to FD_CPU_SMALL_BLOCK keys: a row's block
 * max is a running vector max and one butterfly, its sum likewise; lane i of
 * a 16-row chunk collects row i's m, m' and sum, so alpha = exp(m - m') of
 * 16 rows is one vector exp (as exp16: m = -inf gives 0) and l = l * alpha +
 * sum follows 16 rows at a time. The same results as softmax_rows up to
 * rounding. */
static FD_INLINE FD_AVX512 void softmax_rows_v(const fd_cpu_block *b) {
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  for (int r0 = 0; r0 < b->rows; r0 += 16) {
    const int nr = b->rows - r0 < 16 ? b->rows - r0 : 16;
    /* lane i: row r0 + i; rows that see no key keep m_old = m_use = sum =
     * 0, so alpha = exp(0) = 1 and l stays l */
    __m512 m_old = _mm512_setzero_ps(), m_use = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
    __m512 l_old = _mm512_setzero_ps();
    for (int i = 0; i < nr; i++) {
      const int r = r0 + i, n = b->count ? b->count[r] : b->num_keys;
      const __mmask16 lane = (__mmask16)(1u << i);
      l_old = _mm512_mask_mov_ps(l_old, lane, _mm512_set1_ps(b->l[r]));
      if (n <= 0) continue;
      float *s = b->scratch + (ptrdiff_t)r * b->stride;
      const int full = n & ~15;
      const __mmask16 tail = first_lanes(n & 15);
      __m512 mx = neg_inf, mx2 = neg_inf; /* two chains */
      int j = 0;
      for (; j + 32 <= full; j += 32) {
        mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
        mx2 = _mm512_max_ps(mx2, _mm512_loadu_ps(s + j + 16));
      }
      if (j < full) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
      if (tail) mx2 = _mm512_max_ps(mx2, _mm512_mask_loadu_ps(neg_inf, tail, s + full));
      const __m512 mo = _mm512_set1_ps(b->m[r]);
      /* m' = max(block max, m) (a NaN block max keeps m, as the scalar form) */
      const __m512 mn = _mm512_max_ps(all_max16(_mm512_max_ps(mx, mx2)), mo);
      /* never (-inf) - (-inf) */
      const __m512 mu =
          _mm512_mask_mov_ps(mn, _mm512_cmp_ps_mask(mn, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
      __m512 sm = _mm512_setzero_ps(), sm2 = _mm512_setzero_ps();
      for (j = 0; j + 32 <= full; j += 32) {
        const __m512 p0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mu));
        const __m512 p1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), mu));
        _mm512_storeu_ps(s + j, p0);
        _mm512_storeu_ps(s + j + 16, p1);
        sm = _mm512_add_ps(sm, p0);
        sm2 = _mm512_add_ps(sm2, p1);
      }
      if (j < full) {
        const __m512 p0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mu));
        _mm512_storeu_ps(s + j, p0);
        sm = _mm512_add_ps(sm, p0);
      }
      if (tail) { /* lanes past n: exp(-inf) = 0, stored (the row has room) */
        const __m512 p1 = exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, tail, s + full), mu));
        _mm512_storeu_ps(s + full, p1);
        sm2 = _mm512_add_ps(sm2, p1);
      }
      m_old = _mm512_mask_mov_ps(m_old, lane, mo);
      m_use = _mm512_mask_mov_ps(m_use, lane, mu);
      sum = _mm512_mask_mov_ps(sum, lane, all_sum16(_mm512_add_ps(sm, sm2)));
      b->m[r] = _mm512_cvtss_f32(mn);
    }
    /* alpha and l through whole-vector stores and scalar copies: the
     * values step and the next block load them as scalars, which a masked
     * store would not forward to */
    float al[16], l_new[16];
    const __m512 a = exp16(_mm512_sub_ps(m_old, m_use));
    _mm512_storeu_ps(al, a);
    _mm512_storeu_ps(l_new, _mm512_add_ps(_mm512_mul_ps(l_old, a), sum));
    for (int i = 0; i < nr; i++) {
      b->alpha[r0 + i] = al[i];
      b->l[r0 + i] = l_new[i];
    }
  }
}

/* The 8 16-bit elements at p; those past head_dim (mask dm, FULL: none)
 * read as 0 and are not touched in memory. */
static FD_INLINE FD_AVX512 __m128i load8_u16(const char *p, __mmask8 dm, const int FULL) {
  return FULL ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi16(dm, (const void *)p);
}

/* One row of head_dim <= 8 elements of dtype at p, widened to 8 floats;
 * columns past head_dim (mask dm) read as 0 and are not touched in memory. */
static FD_INLINE FD_AVX512 __m256 load8_cols(const char *p, __mmask8 dm, const int FULL,
                                             fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32:
      return FULL ? _mm256_loadu_ps((const float *)p) : _mm256_maskz_loadu_ps(dm, (const float *)p);
    case FD_DTYPE_F16: return _mm256_cvtph_ps(load8_u16(p, dm, FULL));
    default:
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load8_u16(p, dm, FULL)), 16));
  }
}

/* Key j of the block (padded to a multiple of 32 keys: see cpu_kernels.h). */
static FD_INLINE const char *key_at(const fd_cpu_block *b, int j) {
  return (const char *)b->keys[j] + b->key_off;
}

/* Keys j0 .. j0 + 15 of the block (past num_keys: the last key again, the
 * block's padding; its scores are discarded), transposed: lane i of t[d] =
 * column d of key j0 + i, widened to float (columns >= head_dim: 0). */
static FD_INLINE FD_AVX512 void keys16_t(const fd_cpu_block *b, int j0, __mmask8 dm, __m512 t[8],
                                         const int FULL, fd_dtype dtype) {
  if (dtype == FD_DTYPE_BF16) {
    /* z[a]'s 128-bit lane l = key a + 4l as 4 column pairs (32 bits each);
     * a 4x4 transpose of 32-bit pairs in every lane gives pair c of the 16
     * keys in order; a shift (even column) and an and (odd) widen it */
    __m512i z[4];
    for (int a = 0; a < 4; a++) {
      __m512i x = _mm512_castsi128_si512(load8_u16(key_at(b, j0 + a), dm, FULL));
      x = _mm512_inserti32x4(x, load8_u16(key_at(b, j0 + a + 4), dm, FULL), 1);
      x = _mm512_inserti32x4(x, load8_u16(key_at(b, j0 + a + 8), dm, FULL), 2);
      z[a] = _mm512_inserti32x4(x, load8_u16(key_at(b, j0 + a + 12), dm, FULL), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    const __m512i pr[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                           _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (int c = 0; c < 4; c++) {
      t[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(pr[c], 16));
      t[2 * c + 1] = _mm512_castsi512_ps(_mm512_and_si512(pr[c], high));
    }
    return;
  }
  /* r[i] = [key i | key i + 8]: two 8x8 transposes side by side */
  __m512 r[8], a[8], c[8];
  for (int i = 0; i < 8; i++)
    r[i] = _mm512_castpd_ps(_mm512_insertf64x4( /* insertf32x8 is AVX-512 DQ */
        _mm512_castps_pd(_mm512_castps256_ps512(load8_cols(key_at(b, j0 + i), dm, FULL, dtype))),
        _mm256_castps_pd(load8_cols(key_at(b, j0 + i + 8), dm, FULL, dtype)), 1));
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) { /* c[h + k]: columns k and k + 4 of keys h .. h + 3 (+ 8) */
    c[h + 0] = _mm512_shuffle_ps(a[h + 0], a[h + 2], 0x44);
    c[h + 1] = _mm512_shuffle_ps(a[h + 0], a[h + 2], 0xEE);
    c[h + 2] = _mm512_shuffle_ps(a[h + 1], a[h + 3], 0x44);
    c[h + 3] = _mm512_shuffle_ps(a[h + 1], a[h + 3], 0xEE);
  }
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
  const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int k = 0; k < 4; k++) {
    t[k] = _mm512_permutex2var_ps(c[k], lo, c[k + 4]);
    t[k + 4] = _mm512_permutex2var_ps(c[k], hi, c[k + 4]);
  }
}

/* Scores (scale * q . k) of every row for every key of the block into
 * scratch, 16 keys at a time. head_dim <= 8; FULL: head_dim == 8. */
static FD_INLINE FD_AVX512 void scores_small(const fd_cpu_block *b, const int FULL, fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys, rows = b->rows;
  const __mmask8 dm = (__mmask8)((1u << head_dim) - 1u);
  const __m512 scale = _mm512_set1_ps(b->scale);
  for (int j0 = 0; j0 < nk; j0 += 16) {
    __m512 t[8];
    keys16_t(b, j0, dm, t, FULL, dtype);
    for (int r = 0; r < rows; r++) {
      const float *q = b->q + (ptrdiff_t)r * head_dim;
      __m512 s;
      if (FULL) { /* two chains of 4 */
        __m512 s0 = _mm512_mul_ps(_mm512_set1_ps(q[0]), t[0]);
        __m512 s1 = _mm512_mul_ps(_mm512_set1_ps(q[1]), t[1]);
        for (int d = 2; d < 8; d += 2) {
          s0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), t[d], s0);
          s1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), t[d + 1], s1);
        }
        s = _mm512_add_ps(s0, s1);
      } else {
        s = _mm512_mul_ps(_mm512_set1_ps(q[0]), t[0]);
        for (int d = 1; d < head_dim; d++) s = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), t[d], s);
      }
      /* j0 + 16 <= stride: lanes past the row's keys land in its scratch
       * row and the softmax ignores them */
      _mm512_storeu_ps(b->scratch + (ptrdiff_t)r * b->stride + j0, _mm512_mul_ps(s, scale));
    }
  }
}

/* acc = alpha * acc + P V for rows [r0, r0 + RT) over keys [0, n), one
 * 8-lane accumulator per row, U sets of them for keys j = u mod U (added up
 * in order at the end) so that RT * U = 8 FMA chains are in flight. */
static FD_INLINE FD_AVX512 void values_small_tile(const fd_cpu_block *b, int r0, int n, const int RT,
                                                  const int U, const int FULL, fd_dtype dtype) {
  const int head_dim = b->head_dim;
  const __mmask8 dm = (__mmask8)((1u << head_dim) - 1u);
  __m256 acc[8]; /* [u][r] */
  for (int r = 0; r < RT; r++) {
    const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim;
    acc[r] = _mm256_mul_ps(FULL ? _mm256_loadu_ps(a) : _mm256_maskz_loadu_ps(dm, a),
                           _mm256_set1_ps(b->alpha[r0 + r]));
  }
  for (int i = RT; i < RT * U; i++) acc[i] = _mm256_setzero_ps();
  const float *p = b->scratch + (ptrdiff_t)r0 * b->stride;
  const ptrdiff_t ps = b->stride;
  int j = 0;
  for (; j + U <= n; j += U)
    for (int u = 0; u < U; u++) {
      const __m256 v = load8_cols((const char *)b->values[j + u] + b->value_off, dm, FULL, dtype);
      for (int r = 0; r < RT; r++)
        acc[u * RT + r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * ps + j + u), v, acc[u * RT + r]);
    }
  for (; j < n; j++) {
    const __m256 v = load8_cols((const char *)b->values[j] + b->value_off, dm, FULL, dtype);
    for (int r = 0; r < RT; r++) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * ps + j), v, acc[r]);
  }
  for (int u = 1; u < U; u++)
    for (int r = 0; r < RT; r++) acc[r] = _mm256_add_ps(acc[r], acc[u * RT + r]);
  for (int r = 0; r < RT; r++) {
    float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim;
    if (FULL)
      _mm256_storeu_ps(a, acc[r]);
    else
      _mm256_mask_storeu_ps(a, dm, acc[r]);
  }
}

/* The values step for head_dim <= 8 (FULL: == 8). */
static FD_INLINE FD_AVX512 void values_small(const fd_cpu_block *b, const int FULL, fd_dtype dtype) {
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

/* The values step after the softmax. */
static FD_INLINE FD_AVX512 void values_body(const fd_cpu_block *b, fd_dtype dtype) {
  const float *alpha = b->alpha;
  if (b->count) {
    values_counted(b, alpha, dtype);
  } else if (dtype == FD_DTYPE_BF16 && b->head_dim % 32 == 0) {
    int r = 0;
    for (; r + 4 <= b->rows; r += 4) values_pairs_tile(b, alpha, r, 4, 2);
    for (; r + 2 <= b->rows; r += 2) values_pairs_tile(b, alpha, r, 2, 4);
    for (; r < b->rows; r++) values_pairs_tile(b, alpha, r, 1, 4);
  } else if (b->head_dim <= 16)
    values_rows(b, alpha, 1, dtype);
  else if (b->head_dim <= 32)
    values_rows(b, alpha, 2, dtype);
  else
    values_rows(b, alpha, 4, dtype);
}

static FD_INLINE FD_AVX512 void scores_body(const fd_cpu_block *b, fd_dtype dtype) {
  int r = 0;
  if (dtype == FD_DTYPE_BF16 && b->head_dim % 32 == 0) {
    for (; r + 4 <= b->rows; r += 4) scores_tile_pairs(b, r, 4, 4);
    for (; r + 2 <= b->rows; r += 2) scores_tile_pairs(b, r, 2, 8);
    for (; r < b->rows; r++) scores_tile_pairs(b, r, 1, 16);
  } else {
    for (; r + 4 <= b->rows; r += 4) scores_tile(b, r, 4, 4, dtype);
    for (; r + 2 <= b->rows; r += 2) scores_tile(b, r, 2, 8, dtype);
    for (; r < b->rows; r++) scores_tile(b, r, 1, 16, dtype);
  }
  fd_cpu_adjust_scores(b, FD_CPU_KEY_BLOCK);
  softmax_rows(b);
}

/* One instance per dtype, so the load switch folds away; the small-head_dim
 * steps branch once on head_dim == 8 (no masks). */
#define FD_AVX512_KERNELS(suffix, dtype)                                                    \
  static FD_AVX512 void scores_##suffix(const fd_cpu_block *b) { scores_body(b, dtype); } \
  static FD_AVX512 void values_##suffix(const fd_cpu_block *b) { values_body(b, dtype); } \
  static FD_AVX512 void small_scores_##suffix(const fd_cpu_block *b) {                    \
    if (b->head_dim == 8)                                                                 \
      scores_small(b, 1, dtype);                                                          \
    else                                                                                  \
      scores_small(b, 0, dtype);                                                          \
  }                                                                                       \
  static FD_AVX512 void small_values_##suffix(const fd_cpu_block *b) {                    \
    if (b->head_dim == 8)                                                                 \
      values_small(b, 1, dtype);                                                          \
    else                                                                                  \
      values_small(b, 0, dtype);                                                          \
  }

FD_AVX512_KERNELS(f32, FD_DTYPE_F32)
FD_AVX512_KERNELS(f16, FD_DTYPE_F16)
FD_AVX512_KERNELS(bf16, FD_DTYPE_BF16)

static FD_AVX512 void small_softmax(const fd_cpu_block *b) { softmax_rows_v(b); }

#endif

int fd_cpu_kernels_avx512(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX512_KERNELS
  k->small_softmax = small_softmax;
  k->small_head_dim = 8;
  switch (dtype) {
    case FD_DTYPE_F32:
      k->scores = scores_f32, k->values = values_f32, k->paired = 0;
      k->small_scores = small_scores_f32, k->small_values = small_values_f32;
      return 1;
    case FD_DTYPE_F16:
      k->scores = scores_f16, k->values = values_f16, k->paired = 0;
      k->small_scores = small_scores_f16, k->small_values = small_values_f16;
      return 1;
    case FD_DTYPE_BF16:
      k->scores = scores_bf16, k->values = values_bf16, k->paired = 1;
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
