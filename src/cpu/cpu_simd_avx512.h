/*
 * cpu_simd_avx512.h — the vector primitives of the CPU kernel for AVX-512
 * F/BW/VL (+ FMA, F16C): 16 floats a vector (vf), masks in k registers.
 * Included by cpu_kernels_avx512.c before cpu_kernel_body.h, which holds the
 * algorithm; the names and contracts are those of cpu_simd_avx2.h.
 *
 * What only this instruction set does: tails through masked loads and
 * stores (masked-off lanes never touch memory), 2^n in exp by vscalefps,
 * value-row prefetches, and bf16 in the paired column order (cpu_kernels.h):
 * 32 keys or values widen with two instructions instead of four. With
 * FD_V_DPBF16 (AVX-512 BF16, cpu_kernels_avx512_bf16.c) the bf16 scores
 * multiply by vdpbf16ps instead, where q is bf16.
 */
#ifndef FD_CPU_SIMD_AVX512_H
#define FD_CPU_SIMD_AVX512_H

#include <immintrin.h>
#include <math.h>

#include "cpu_kernels.h"

/* FD_V_DPBF16 1 (cpu_kernels_avx512_bf16.c): AVX-512 BF16 as well, for the
 * bf16 scores by vdpbf16ps (see cpu_kernel_body.h). */
#ifndef FD_V_DPBF16
#define FD_V_DPBF16 0
#endif
/* FD_V_AMX 1 (cpu_kernels_amx.c): AMX-TILE and AMX-BF16 as well (the tile
 * steps of cpu_simd_amx.h), with AVX-512 BF16 for their bf16 conversions. */
#ifndef FD_V_AMX
#define FD_V_AMX 0
#endif
#if FD_V_AMX
#define FD_V_TARGET "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16"
#elif FD_V_DPBF16
#define FD_V_TARGET "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"
#else
#define FD_V_TARGET "avx512f,avx512bw,avx512vl,avx2,fma,f16c"
#endif
#define FD_VFN static inline __attribute__((always_inline, target(FD_V_TARGET)))
#define FD_VKERNEL static __attribute__((target(FD_V_TARGET)))

#define FD_V_W 16          /* floats a vector */
#define FD_V_VALUE_DT 4    /* value tiles: up to 4 vectors of columns a row */
#define FD_V_PREFETCH 1    /* prefetch the next key tile's and value rows */
#define FD_V_PAIRED 1      /* bf16, head_dim % 32 == 0: the paired order */

typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vmask;
typedef __m256 hf; /* 8 floats: a row of head_dim <= 8 */

FD_VFN vf v_zero(void) { return _mm512_setzero_ps(); }
FD_VFN vf v_set1(float x) { return _mm512_set1_ps(x); }
FD_VFN vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
FD_VFN vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
FD_VFN vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
FD_VFN vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
FD_VFN vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
FD_VFN vf v_loadf(const float *p) { return _mm512_loadu_ps(p); }
FD_VFN void v_storef(float *p, vf v) { _mm512_storeu_ps(p, v); }
FD_VFN float v_first(vf v) { return _mm512_cvtss_f32(v); }

/* Lanes below n (n may be <= 0 or >= 16). */
FD_VFN vmask v_mask_first(int n) {
  return n <= 0 ? (vmask)0 : (vmask)((1u << (n < 16 ? n : 16)) - 1u);
}
FD_VFN vf v_loadf_mask(vmask m, const float *p) { return _mm512_maskz_loadu_ps(m, p); }
FD_VFN void v_storef_mask(float *p, vmask m, vf v) { _mm512_mask_storeu_ps(p, m, v); }
/* Lanes below n from p, the others `fill`; nothing past them is read. */
FD_VFN vf v_loadf_or(vf fill, int n, const float *p) {
  return _mm512_mask_loadu_ps(fill, v_mask_first(n), p);
}

/* 16 elements of `dtype` at row + i, widened to float (exact). */
FD_VFN vf v_load(const void *row, int i, fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return _mm512_loadu_ps((const float *)row + i);
    case FD_DTYPE_F16:
      return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    default: {
      const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

/* The lanes of m (= v_mask_first(n); n may be <= 0 or >= 16: all) of the
 * 16 elements at row + i widened, other lanes 0; nothing past them is read. */
FD_VFN vf v_load_part(const void *row, int i, vmask m, int n, fd_dtype dtype) {
  (void)n;
  switch (dtype) {
    case FD_DTYPE_F32: return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    case FD_DTYPE_F16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    default: {
      const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

/* base[l] = lane l of v for lanes lo .. lo + n - 1 (0 < n, lo + n <= 16). */
FD_VFN void v_store_lanes(float *base, int lo, int n, vf v) {
  _mm512_mask_storeu_ps(base, (vmask)(v_mask_first(n) << lo), v);
}

/* Lane n = the sum of the 16 lanes of in[n]. */
FD_VFN vf v_reduce(const vf *in) {
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

FD_VFN float v_hmax(vf v) { return _mm512_reduce_max_ps(v); }
FD_VFN float v_hsum(vf v) { return _mm512_reduce_add_ps(v); }

/* The max / sum of all 16 lanes, in every lane (a butterfly of 4 shuffles). */
FD_VFN vf v_all_max(vf x) {
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
  x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));
  return _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));
}
FD_VFN vf v_all_sum(vf x) {
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
  x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4E));
  return _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));
}

/* x with its -inf lanes 0. */
FD_VFN vf v_ninf_to_zero(vf x) {
  return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                            _mm512_setzero_ps());
}
/* dst with lane i replaced by lane i of src. */
FD_VFN vf v_put_lane(vf dst, int i, vf src) { return _mm512_mask_mov_ps(dst, (vmask)(1u << i), src); }

/* exp(x) for x <= 0: 2^n * P(r), n = round(x / ln 2), r = x - n ln 2 (ln 2
 * in two parts), P the degree-7 Taylor polynomial (|r| <= ln2 / 2: relative
 * error < 1e-8 before rounding). x < -87 (exp below the normal floats,
 * -inf included) gives 0; NaN stays NaN. */
FD_VFN vf v_exp(vf x) {
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

/* Asks L1 for the lines of [p, p + bytes): rows a head-count stride apart
 * are too short for the hardware prefetchers to lock on to. */
FD_VFN void v_prefetch_row(const char *p, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

/* ---- bf16 in the paired order: 32 bf16 (64 bytes) as 16 even and 16 odd
 * columns ---- */
FD_VFN vi v_loadi(const void *p) { return _mm512_loadu_si512(p); }
FD_VFN void v_storei(void *p, vi x) { _mm512_storeu_si512(p, x); }
FD_VFN vf v_bf16_even(vi x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
FD_VFN vf v_bf16_odd(vi x) {
  return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
/* Columns 0..31 in lo, hi -> the 16 even ones, the 16 odd ones. */
FD_VFN void v_split_pairs(vf lo, vf hi, vf *even, vf *odd) {
  const __m512i e = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i o = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  *even = _mm512_permutex2var_ps(lo, e, hi);
  *odd = _mm512_permutex2var_ps(lo, o, hi);
}

#if FD_V_DPBF16 || FD_V_AMX
/* The 32 floats lo (columns 0..15), hi (16..31) as 32 bf16 in column order
 * (round to nearest even: exact for values that are bf16). */
FD_VFN vi v_bf16_pack(vf lo, vf hi) { return (vi)_mm512_cvtne2ps_pbh(hi, lo); }
/* Nonzero when a lane of x is not a bf16 value (low 16 bits set). */
FD_VFN int v_not_bf16(vf x) {
  return _mm512_test_epi32_mask(_mm512_castps_si512(x), _mm512_set1_epi32(0xffff)) != 0;
}
/* acc lane l + a[2l] b[2l] + a[2l + 1] b[2l + 1] (32 bf16 each; bf16
 * subnormal inputs count as 0, a subnormal result is flushed to 0). */
FD_VFN vf v_dot_bf16(vf acc, vi a, vi b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
#endif

/* ---- head_dim <= 8: 8-float rows (hf) and keys transposed into lanes ---- */
FD_VFN hf h_zero(void) { return _mm256_setzero_ps(); }
FD_VFN hf h_set1(float x) { return _mm256_set1_ps(x); }
FD_VFN hf h_add(hf a, hf b) { return _mm256_add_ps(a, b); }
FD_VFN hf h_mul(hf a, hf b) { return _mm256_mul_ps(a, b); }
FD_VFN hf h_fma(hf a, hf b, hf c) { return _mm256_fmadd_ps(a, b, c); }

/* The 8 16-bit elements at p; those past head_dim (mask dm, FULL: none)
 * read as 0 and are not touched in memory. */
FD_VFN __m128i load8_u16(const char *p, __mmask8 dm, const int FULL) {
  return FULL ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi16(dm, (const void *)p);
}

/* A row of head_dim <= 8 elements of dtype at p, widened (FULL: head_dim ==
 * 8; else columns past head_dim read as 0 and are not touched in memory). */
FD_VFN hf h_load_row(const char *p, int head_dim, const int FULL, fd_dtype dtype) {
  const __mmask8 dm = (__mmask8)((1u << head_dim) - 1u);
  switch (dtype) {
    case FD_DTYPE_F32:
      return FULL ? _mm256_loadu_ps((const float *)p) : _mm256_maskz_loadu_ps(dm, (const float *)p);
    case FD_DTYPE_F16: return _mm256_cvtph_ps(load8_u16(p, dm, FULL));
    default:
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load8_u16(p, dm, FULL)), 16));
  }
}
/* The float row a of head_dim <= 8 columns (past them: 0, not read). */
FD_VFN hf h_load_acc(const float *a, int head_dim, const int FULL) {
  return FULL ? _mm256_loadu_ps(a) : _mm256_maskz_loadu_ps((__mmask8)((1u << head_dim) - 1u), a);
}
FD_VFN void h_store_acc(float *a, int head_dim, const int FULL, hf v) {
  if (FULL)
    _mm256_storeu_ps(a, v);
  else
    _mm256_mask_storeu_ps(a, (__mmask8)((1u << head_dim) - 1u), v);
}

/* Keys j0 .. j0 + 15 of the block at keys[j] + key_off (past num_keys: the
 * block's padding; its scores are discarded), transposed: lane i of t[d] =
 * column d of key j0 + i, widened (columns >= head_dim: 0). f32 and f16: 16
 * keys two per vector ([key i | key i + 8]), two 8x8 transposes side by
 * side (3 shuffles a vector); bf16: 4 keys a vector as column pairs, one 4x4
 * transpose of 32-bit pairs, then a shift and an and. */
FD_VFN void v_keys_t(const fd_cpu_block *b, int j0, vf t[8], const int FULL, fd_dtype dtype) {
  const __mmask8 dm = (__mmask8)((1u << b->head_dim) - 1u);
#define FD_KEY(j) ((const char *)b->keys[j] + b->key_off)
  if (dtype == FD_DTYPE_BF16) {
    __m512i z[4];
    for (int a = 0; a < 4; a++) {
      __m512i x = _mm512_castsi128_si512(load8_u16(FD_KEY(j0 + a), dm, FULL));
      x = _mm512_inserti32x4(x, load8_u16(FD_KEY(j0 + a + 4), dm, FULL), 1);
      x = _mm512_inserti32x4(x, load8_u16(FD_KEY(j0 + a + 8), dm, FULL), 2);
      z[a] = _mm512_inserti32x4(x, load8_u16(FD_KEY(j0 + a + 12), dm, FULL), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    const __m512i pr[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                           _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    for (int c = 0; c < 4; c++) {
      t[2 * c] = v_bf16_even(pr[c]);
      t[2 * c + 1] = v_bf16_odd(pr[c]);
    }
    return;
  }
  __m512 r[8], a[8], c[8];
  for (int i = 0; i < 8; i++)
    r[i] = _mm512_castpd_ps(_mm512_insertf64x4( /* insertf32x8 is AVX-512 DQ */
        _mm512_castps_pd(_mm512_castps256_ps512(h_load_row(FD_KEY(j0 + i), b->head_dim, FULL, dtype))),
        _mm256_castps_pd(h_load_row(FD_KEY(j0 + i + 8), b->head_dim, FULL, dtype)), 1));
#undef FD_KEY
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

#endif /* FD_CPU_SIMD_AVX512_H */
