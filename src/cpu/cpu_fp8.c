/*
 * cpu_fp8.c — fp8 caches on the CPU: the 256 values of a format's codes,
 * and the widening of one head's key block to float32 times the scales,
 * which cpu_decode.c runs before each kernel call (the kernels then read
 * float32 keys and values).
 *
 * Widening, x86 with AVX2 + F16C: 16 codes at a time are moved into fp16 bit
 * patterns (e5m2 is the top byte of an fp16; an e4m3 code shifted into fp16
 * is its value times 2^-8, subnormals included) and widened by vcvtph2ps,
 * then multiplied by the scale (times 2^8 for e4m3); e4m3's NaN codes are
 * set to NaN. Every value equals the table's lut[code] * scale: the power
 * of two folds into the one rounding of the product (scales of 2^-100 ..
 * 2^100, which keep 2^8 * scale exact and finite; others take the table).
 * With AVX-512 BW e4m3 runs that path 32 codes at a time, NaNs set by a
 * mask. Elsewhere (and for the tail of a row), the table.
 *
 * Without per-token scales the driver widens to bf16 instead (exact, no
 * scale: it folds k_scale into the softmax scale and v_scale into the
 * output) and runs the bf16 kernels, which read half the bytes of the
 * float32 ones; fd_cpu_widen_fp8_bf16 does that step: on the AMX set (whose
 * CPUs have AVX-512 VBMI) two byte-table vpermi2b per 64 codes; with
 * AVX-512 BW a table lookup, 32 codes by two vpermi2w (the table's 128
 * sign-less entries in four registers); with AVX2 the fp16 path above.
 */
#include <math.h>

#include "cpu_kernels.h"
#include "fp8.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FD_FP8_AVX2 1
#endif

void fd_cpu_fp8_table(fd_dtype dtype, float lut[256]) {
  for (int i = 0; i < 256; i++)
    lut[i] = dtype == FD_DTYPE_E4M3 ? fd_e4m3_to_f32((uint8_t)i) : fd_e5m2_to_f32((uint8_t)i);
}

#ifdef FD_FP8_AVX2
/* The 16 codes at src as float32 times mul (lo: codes 0-7, hi: 8-15); mul
 * carries e4m3's 2^8. */
__attribute__((target("avx2,f16c"))) static inline void widen16_avx2(const uint8_t *src, int e5m2,
                                                                     __m256 mul, __m256 *lo,
                                                                     __m256 *hi) {
  const __m256i low7 = _mm256_set1_epi16(0x7f), sign = _mm256_set1_epi16(0x80);
  const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src));
  const __m256i bits =
      e5m2 ? _mm256_slli_epi16(h, 8)
           : _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, low7), 7),
                             _mm256_slli_epi16(_mm256_and_si256(h, sign), 8));
  *lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(bits)), mul);
  *hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1)), mul);
  if (!e5m2) { /* S.1111.111: NaN */
    const __m256 nan = _mm256_set1_ps(NAN);
    const __m256i is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, low7), low7);
    *lo = _mm256_blendv_ps(*lo, nan, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(is_nan))));
    *hi = _mm256_blendv_ps(*hi, nan, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(is_nan, 1))));
  }
}

/* dst[d] = value(src[d]) * s for d < n16 (a multiple of 16). */
__attribute__((target("avx2,f16c"))) static void widen_row_avx2(float *dst, const uint8_t *src,
                                                                int n16, int e5m2, float s) {
  const __m256 mul = _mm256_set1_ps(e5m2 ? s : s * 256.0f);
  for (int d = 0; d < n16; d += 16) {
    __m256 lo, hi;
    widen16_avx2(src + d, e5m2, mul, &lo, &hi);
    _mm256_storeu_ps(dst + d, lo);
    _mm256_storeu_ps(dst + d + 8, hi);
  }
}

/* dst[d] = bf16 bits of value(src[d]) for d < n16 (a multiple of 16): exact
 * (every fp8 value is a bf16 value: the float32 bits' low half is zero). */
__attribute__((target("avx2,f16c"))) static void widen_row_bf16_avx2(uint16_t *dst,
                                                                     const uint8_t *src, int n16,
                                                                     int e5m2) {
  const __m256 mul = _mm256_set1_ps(e5m2 ? 1.0f : 256.0f);
  for (int d = 0; d < n16; d += 16) {
    __m256 lo, hi;
    widen16_avx2(src + d, e5m2, mul, &lo, &hi);
    /* the top halves of the 16 floats, in order */
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                               _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
    _mm256_storeu_si256((__m256i *)(dst + d), _mm256_permute4x64_epi64(packed, 0xD8));
  }
}

/* dst[d] = lut16[src[d]] for d < n32 (a multiple of 32), AVX-512 BW: the
 * table's first 128 entries (the positive codes) in four registers, looked
 * up 32 codes at a time by two vpermi2w (index bits 0-5) and a blend on bit
 * 6; the code's sign bit becomes bf16's. Needs lut16[c | 0x80] ==
 * lut16[c] | 0x8000, which both formats' tables satisfy (NaNs: any NaN). */
__attribute__((target("avx512f,avx512bw"))) static void widen_row_bf16_avx512(
    uint16_t *dst, const uint8_t *src, int n32, const uint16_t *lut16) {
  __m512i t[4]; /* lut16[0..127], 32 entries a register */
  for (int i = 0; i < 4; i++) t[i] = _mm512_loadu_si512((const void *)(lut16 + 32 * i));
  const __m512i bit6 = _mm512_set1_epi16(0x40), sign = _mm512_set1_epi16((short)0x8000);
  for (int d = 0; d < n32; d += 32) {
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(src + d)));
    const __m512i lo = _mm512_permutex2var_epi16(t[0], w, t[1]); /* codes 0-63 (128-191) */
    const __m512i hi = _mm512_permutex2var_epi16(t[2], w, t[3]); /* codes 64-127 (192-255) */
    const __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, bit6), lo, hi);
    /* v | ((w << 8) & sign) */
    _mm512_storeu_si512((void *)(dst + d),
                        _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(w, 8), sign, 0xF8));
  }
}

/* dst[d] = value(src[d]) * s for d < n32 (a multiple of 32), e4m3 codes,
 * AVX-512 BW: the fp16 path of widen16_avx2 at twice the width, NaN codes
 * patched by a mask; mul = s * 2^8 (scales of 2^-100 .. 2^100). */
__attribute__((target("avx512f,avx512bw"))) static void widen_row_e4m3_avx512(float *dst,
                                                                             const uint8_t *src,
                                                                             int n32, float s) {
  const __m512 mul = _mm512_set1_ps(s * 256.0f), nan = _mm512_set1_ps(NAN);
  const __m512i low7 = _mm512_set1_epi16(0x7f), sign = _mm512_set1_epi16((short)0x8000);
  for (int d = 0; d < n32; d += 32) {
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(src + d)));
    const __m512i m7 = _mm512_and_si512(w, low7);
    /* ((w & 0x7f) << 7) | ((w << 8) & sign) */
    const __m512i bits =
        _mm512_ternarylogic_epi32(_mm512_slli_epi16(m7, 7), _mm512_slli_epi16(w, 8), sign, 0xF8);
    const __mmask32 is_nan = _mm512_cmpeq_epi16_mask(m7, low7); /* S.1111.111 */
    __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(bits)), mul);
    __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1)), mul);
    lo = _mm512_mask_mov_ps(lo, (__mmask16)is_nan, nan);
    hi = _mm512_mask_mov_ps(hi, (__mmask16)(is_nan >> 16), nan);
    _mm512_storeu_ps(dst + d, lo);
    _mm512_storeu_ps(dst + d + 16, hi);
  }
}

/* widen_row_bf16_avx512 for the first n32 (a multiple of 32) codes of each
 * of n rows (rows[j] + off into dst + j * head_dim), the table loaded once
 * and the rows' chunks back to back. */
__attribute__((target("avx512f,avx512bw"))) static void widen_rows_bf16_avx512(
    uint16_t *dst, const void *const *rows, ptrdiff_t off, int n, int head_dim, int n32,
    const uint16_t *lut16) {
  __m512i t[4];
  for (int i = 0; i < 4; i++) t[i] = _mm512_loadu_si512((const void *)(lut16 + 32 * i));
  const __m512i bit6 = _mm512_set1_epi16(0x40), sign = _mm512_set1_epi16((short)0x8000);
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    uint16_t *o = dst + (ptrdiff_t)j * head_dim;
    for (int d = 0; d < n32; d += 32) {
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(src + d)));
      const __m512i lo = _mm512_permutex2var_epi16(t[0], w, t[1]);
      const __m512i hi = _mm512_permutex2var_epi16(t[2], w, t[3]);
      const __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, bit6), lo, hi);
      _mm512_storeu_si512((void *)(o + d),
                          _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(w, 8), sign, 0xF8));
    }
  }
}

/* The same for head_dim % 64 == 0 with AVX-512 VBMI (FD_CPU_ISA_AMX): the
 * low and high bytes of lut16[0..127] as two 128-byte tables, looked up 64
 * codes at a time by one vpermi2b each (index bit 7, the sign, ignored),
 * the sign or-ed into the high bytes, and the two byte vectors interleaved
 * into 16-bit words by vpunpck{l,h}bw, with the codes permuted first (one
 * vpermb) so that the words come out in column order. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void widen_rows_bf16_vbmi(
    uint16_t *dst, const void *const *rows, ptrdiff_t off, int n, int head_dim,
    const uint16_t *lut16) {
  /* bytes 64 i + k of the tables: entry 32 w + k of lut16 register w = 2 i, 2 i + 1 */
  __m512i lo_t[2], hi_t[2];
  for (int i = 0; i < 2; i++) {
    const __m512i a = _mm512_loadu_si512((const void *)(lut16 + 64 * i));
    const __m512i b = _mm512_loadu_si512((const void *)(lut16 + 64 * i + 32));
    lo_t[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)),
                                 _mm512_cvtepi16_epi8(b), 1);
    hi_t[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8))),
                                 _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8)), 1);
  }
  const __m512i lo_a = lo_t[0], lo_b = lo_t[1], hi_a = hi_t[0], hi_b = hi_t[1];
  /* byte 16 L + b of the permuted codes: code 8 L + b (b < 8), 32 + 8 L + b - 8 (b >= 8) */
  static const uint8_t perm[64] = {
      0,  1,  2,  3,  4,  5,  6,  7,  32, 33, 34, 35, 36, 37, 38, 39,
      8,  9,  10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47,
      16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51, 52, 53, 54, 55,
      24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};
  const __m512i order = _mm512_loadu_si512(perm), sign = _mm512_set1_epi8((char)0x80);
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    uint16_t *o = dst + (ptrdiff_t)j * head_dim;
    for (int d = 0; d < head_dim; d += 64) {
      const __m512i c = _mm512_permutexvar_epi8(order, _mm512_loadu_si512((const void *)(src + d)));
      const __m512i lo = _mm512_permutex2var_epi8(lo_a, c, lo_b);
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi_a, c, hi_b), c, sign,
                                                   0xF8); /* hi | (c & sign) */
      _mm512_storeu_si512((void *)(o + d), _mm512_unpacklo_epi8(lo, hi));
      _mm512_storeu_si512((void *)(o + d + 32), _mm512_unpackhi_epi8(lo, hi));
    }
  }
}

#endif

void fd_cpu_fp8_table_bf16(const float lut[256], uint16_t lut16[256]) {
  for (int i = 0; i < 256; i++) lut16[i] = (uint16_t)(fd_fp8_f32_to_bits(lut[i]) >> 16);
}

void fd_cpu_widen_fp8_bf16(uint16_t *dst, const void *const *rows, ptrdiff_t off, int n,
                           int head_dim, const uint16_t *lut16, fd_cpu_isa isa, int e5m2) {
  int simd = 0;
#ifdef FD_FP8_AVX2
  simd = isa >= FD_CPU_ISA_AVX2 && head_dim >= 16;  /* the run's isa: AVX2 implies F16C (fd_cpu_isa_detect) */
#endif
  (void)isa, (void)e5m2;
#ifdef FD_FP8_AVX2
  const int wide = isa >= FD_CPU_ISA_AVX512 && head_dim >= 32; /* AVX-512 F + BW */
  if (isa >= FD_CPU_ISA_AMX && head_dim % 64 == 0) { /* (AMX machines have VBMI: dispatch) */
    widen_rows_bf16_vbmi(dst, rows, off, n, head_dim, lut16);
    return;
  }
  if (wide && head_dim % 32 == 0) { /* every row whole: one pass over the block */
    widen_rows_bf16_avx512(dst, rows, off, n, head_dim, head_dim, lut16);
    return;
  }
#endif
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    uint16_t *o = dst + (ptrdiff_t)j * head_dim;
    int d = 0;
#ifdef FD_FP8_AVX2
    if (wide) {
      d = head_dim & ~31;
      widen_row_bf16_avx512(o, src, d, lut16);
    }
    if (simd && (head_dim & ~15) > d) {
      widen_row_bf16_avx2(o + d, src + d, (head_dim & ~15) - d, e5m2);
      d = head_dim & ~15;
    }
#endif
    for (; d < head_dim; d++) o[d] = lut16[src[d]];
  }
}

void fd_cpu_widen_fp8(float *dst, const void *const *rows, ptrdiff_t off, int n, int head_dim,
                      const float *lut, const float *scales, float scale, fd_cpu_isa isa,
                      int e5m2) {
  int simd = 0, wide = 0;
#ifdef FD_FP8_AVX2
  simd = isa >= FD_CPU_ISA_AVX2 && head_dim >= 16;  /* the run's isa: AVX2 implies F16C (fd_cpu_isa_detect) */
  /* e4m3 with AVX-512 F + BW: the same fp16 path, twice as wide (its NaN
   * patch a mask, not two blends); e5m2's AVX2 path is a shift already */
  wide = isa >= FD_CPU_ISA_AVX512 && head_dim >= 32 && !e5m2;
#endif
  (void)isa, (void)e5m2;
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    const float s = scales ? scales[j] : scale;
    float *o = dst + (ptrdiff_t)j * head_dim;
    int d = 0;
#ifdef FD_FP8_AVX2
    const float as = fabsf(s);
    if (as >= 0x1p-100f && as <= 0x1p100f) {
      if (wide) {
        d = head_dim & ~31;
        widen_row_e4m3_avx512(o, src, d, s);
      }
      if (simd && (head_dim & ~15) > d) {
        widen_row_avx2(o + d, src + d, (head_dim & ~15) - d, e5m2, s);
        d = head_dim & ~15;
      }
    }
#endif
    for (; d < head_dim; d++) o[d] = lut[src[d]] * s;
  }
}
