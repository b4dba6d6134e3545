/*
 * cpu_simd_avx2.h — the vector primitives of the CPU kernel for AVX2 + FMA +
 * F16C: 8 floats a vector (vf), masks as all-ones lanes of an integer
 * vector. Included by cpu_kernels_avx2.c before cpu_kernel_body.h, which
 * holds the algorithm. Every primitive is a forced-inline function with the
 * instruction set's target attribute (FD_VFN); the kernels the body defines
 * carry it too (FD_VKERNEL), so the file builds with default flags and
 * dispatch calls it only where the CPU has the instructions.
 *
 * fp16 widens with vcvtph2ps, bf16 with a 16-bit shift (both exact); partial
 * rows of f32 through masked loads, of fp16/bf16 through a zero-padded copy.
 */
#ifndef FD_CPU_SIMD_AVX2_H
#define FD_CPU_SIMD_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

#define FD_VFN static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define FD_VKERNEL static __attribute__((target("avx2,fma,f16c")))

#define FD_V_W 8           /* floats a vector */
#define FD_V_VALUE_DT 2    /* value tiles: up to 2 vectors of columns a row (16 registers) */
#define FD_V_PREFETCH 0    /* no software prefetch */
#define FD_V_PAIRED 0      /* bf16 in natural column order */
#define FD_V_DPBF16 0      /* no vdpbf16ps */

typedef __m256 vf;
typedef __m256i vi;
typedef __m256i vmask;
typedef __m256 hf; /* 8 floats: a row of head_dim <= 8 */

FD_VFN vf v_zero(void) { return _mm256_setzero_ps(); }
FD_VFN vf v_set1(float x) { return _mm256_set1_ps(x); }
FD_VFN vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
FD_VFN vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
FD_VFN vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
FD_VFN vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
FD_VFN vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
FD_VFN vf v_loadf(const float *p) { return _mm256_loadu_ps(p); }
FD_VFN void v_storef(float *p, vf v) { _mm256_storeu_ps(p, v); }
FD_VFN float v_first(vf v) { return _mm256_cvtss_f32(v); }

/* Lanes below n set (all-ones), others clear; n may be <= 0 or >= 8. */
FD_VFN vmask v_mask_first(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
FD_VFN vf v_loadf_mask(vmask m, const float *p) { return _mm256_maskload_ps(p, m); }
FD_VFN void v_storef_mask(float *p, vmask m, vf v) { _mm256_maskstore_ps(p, m, v); }
/* Lanes below n from p, the others `fill`; nothing past them is read. */
FD_VFN vf v_loadf_or(vf fill, int n, const float *p) {
  const vmask m = v_mask_first(n);
  return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}

/* 8 elements of `dtype` at row + i, widened to float (exact). */
FD_VFN vf v_load(const void *row, int i, fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return _mm256_loadu_ps((const float *)row + i);
    case FD_DTYPE_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    default: {
      const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

/* The first n elements (m = v_mask_first(n); n may be <= 0 or >= 8: all)
 * at row + i widened, other lanes 0; nothing past them is read. */
FD_VFN vf v_load_part(const void *row, int i, vmask m, int n, fd_dtype dtype) {
  if (n <= 0) return _mm256_setzero_ps();
  if (n >= 8) return v_load(row, i, dtype);
  if (dtype == FD_DTYPE_F32) return _mm256_maskload_ps((const float *)row + i, m);
  uint16_t pad[8] = {0};
  memcpy(pad, (const uint16_t *)row + i, (size_t)n * sizeof(uint16_t));
  return v_load(pad, 0, dtype);
}

/* base[l] = lane l of v for lanes lo .. lo + n - 1 (0 < n, lo + n <= 8). */
FD_VFN void v_store_lanes(float *base, int lo, int n, vf v) {
  float lanes[8];
  _mm256_storeu_ps(lanes, v);
  for (int l = lo; l < lo + n; l++) base[l] = lanes[l];
}

/* Lane n = the sum of the 8 lanes of in[n]. */
FD_VFN vf v_reduce(const vf *in) {
  __m256 t[4];
  for (int i = 0; i < 4; i++)
    t[i] = _mm256_add_ps(_mm256_permute2f128_ps(in[i], in[i + 4], 0x20),
                         _mm256_permute2f128_ps(in[i], in[i + 4], 0x31));
  return _mm256_hadd_ps(_mm256_hadd_ps(t[0], t[1]), _mm256_hadd_ps(t[2], t[3]));
}

FD_VFN float v_hmax(vf v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
FD_VFN float v_hsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* The max / sum of all 8 lanes, in every lane. */
FD_VFN vf v_all_max(vf x) {
  x = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 0x01));
  x = _mm256_max_ps(x, _mm256_permute_ps(x, 0x4E));
  return _mm256_max_ps(x, _mm256_permute_ps(x, 0xB1));
}
FD_VFN vf v_all_sum(vf x) {
  x = _mm256_add_ps(x, _mm256_permute2f128_ps(x, x, 0x01));
  x = _mm256_add_ps(x, _mm256_permute_ps(x, 0x4E));
  return _mm256_add_ps(x, _mm256_permute_ps(x, 0xB1));
}

/* x with its -inf lanes 0. */
FD_VFN vf v_ninf_to_zero(vf x) {
  return _mm256_blendv_ps(x, _mm256_setzero_ps(),
                          _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}
/* dst with lane i replaced by lane i of src. */
FD_VFN vf v_put_lane(vf dst, int i, vf src) {
  const __m256i lane = _mm256_cmpeq_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(i));
  return _mm256_blendv_ps(dst, src, _mm256_castsi256_ps(lane));
}

/* exp(x) for x <= 0 (as cpu_simd_avx512.h): 2^n * P(r), degree-7 Taylor P,
 * 2^n built in the exponent field; x < -87 gives 0; NaN stays NaN. */
FD_VFN vf v_exp(vf x) {
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

FD_VFN void v_prefetch_row(const char *p, int bytes) {
  (void)p;
  (void)bytes;
}

/* ---- head_dim <= 8: 8-float rows (hf) and keys transposed into lanes ---- */
FD_VFN hf h_zero(void) { return _mm256_setzero_ps(); }
FD_VFN hf h_set1(float x) { return _mm256_set1_ps(x); }
FD_VFN hf h_add(hf a, hf b) { return _mm256_add_ps(a, b); }
FD_VFN hf h_mul(hf a, hf b) { return _mm256_mul_ps(a, b); }
FD_VFN hf h_fma(hf a, hf b, hf c) { return _mm256_fmadd_ps(a, b, c); }

/* A row of head_dim <= 8 elements of dtype at p, widened (FULL: head_dim ==
 * 8; else columns past head_dim read as 0 and are not touched). */
FD_VFN hf h_load_row(const char *p, int head_dim, const int FULL, fd_dtype dtype) {
  return FULL ? v_load(p, 0, dtype) : v_load_part(p, 0, v_mask_first(head_dim), head_dim, dtype);
}
/* The float row a of head_dim <= 8 columns (past them: 0, not read). */
FD_VFN hf h_load_acc(const float *a, int head_dim, const int FULL) {
  return FULL ? _mm256_loadu_ps(a) : _mm256_maskload_ps(a, v_mask_first(head_dim));
}
FD_VFN void h_store_acc(float *a, int head_dim, const int FULL, hf v) {
  if (FULL)
    _mm256_storeu_ps(a, v);
  else
    _mm256_maskstore_ps(a, v_mask_first(head_dim), v);
}

/* 4x4 transposes of 32-bit elements in both 128-bit lanes: out[c] lane l
 * element e = in[e] lane l element c. */
FD_VFN void transpose4_lanes(const __m256 in[4], __m256 out[4]) {
  const __m256 t0 = _mm256_unpacklo_ps(in[0], in[1]), t1 = _mm256_unpackhi_ps(in[0], in[1]);
  const __m256 t2 = _mm256_unpacklo_ps(in[2], in[3]), t3 = _mm256_unpackhi_ps(in[2], in[3]);
  out[0] = _mm256_shuffle_ps(t0, t2, 0x44);
  out[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  out[2] = _mm256_shuffle_ps(t1, t3, 0x44);
  out[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}

/* Keys j0 .. j0 + 7 of the block at keys[j] + key_off (past num_keys: the
 * block's padding; its scores are discarded), transposed: lane i of t[d] =
 * column d of key j0 + i, widened (columns >= head_dim: 0). f32 with
 * head_dim 8: each key's halves go into 128-bit lanes ([key a | key a + 4])
 * and two in-lane 4x4 transposes finish it; bf16 with head_dim 8: 4 column
 * pairs (32 bits) a key, one 4x4 transpose, then a shift and an and; else
 * rows widened one by one, then an 8x8 transpose. */
FD_VFN void v_keys_t(const fd_cpu_block *b, int j0, vf t[8], const int FULL, fd_dtype dtype) {
#define FD_KEY(j) ((const char *)b->keys[j] + b->key_off)
  if (FULL && dtype == FD_DTYPE_F32) {
    __m256 lo[4], hi[4];
    for (int a = 0; a < 4; a++) {
      const float *k0 = (const float *)FD_KEY(j0 + a), *k1 = (const float *)FD_KEY(j0 + a + 4);
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
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)FD_KEY(j0 + a))),
          _mm_loadu_si128((const __m128i *)FD_KEY(j0 + a + 4)), 1));
    transpose4_lanes(z, pr); /* pr[c]: column pair c of the 8 keys */
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    for (int c = 0; c < 4; c++) {
      t[2 * c] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pr[c]), 16));
      t[2 * c + 1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(pr[c]), high));
    }
    return;
  }
  __m256 r[8], lo[4], hi[4];
  for (int i = 0; i < 8; i++) r[i] = h_load_row(FD_KEY(j0 + i), b->head_dim, FULL, dtype);
#undef FD_KEY
  /* lo[c] / hi[c]: columns c and c + 4 of keys 0..3 / 4..7 in the two lanes */
  transpose4_lanes(r, lo);
  transpose4_lanes(r + 4, hi);
  for (int c = 0; c < 4; c++) {
    t[c] = _mm256_permute2f128_ps(lo[c], hi[c], 0x20);
    t[c + 4] = _mm256_permute2f128_ps(lo[c], hi[c], 0x31);
  }
}

#endif /* FD_CPU_SIMD_AVX2_H */
