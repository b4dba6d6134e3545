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
 * Elsewhere (and for the tail of a row), the table.
 *
 * Without per-token scales the driver widens to bf16 instead (exact, no
 * scale: it folds k_scale into the softmax scale and v_scale into the
 * output) and runs the bf16 kernels, which read half the bytes of the
 * float32 ones; fd_cpu_widen_fp8_bf16 does that step.
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
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    uint16_t *o = dst + (ptrdiff_t)j * head_dim;
    int d = 0;
#ifdef FD_FP8_AVX2
    if (simd) {
      d = head_dim & ~15;
      widen_row_bf16_avx2(o, src, d, e5m2);
    }
#endif
    for (; d < head_dim; d++) o[d] = lut16[src[d]];
  }
}

void fd_cpu_widen_fp8(float *dst, const void *const *rows, ptrdiff_t off, int n, int head_dim,
                      const float *lut, const float *scales, float scale, fd_cpu_isa isa,
                      int e5m2) {
  int simd = 0;
#ifdef FD_FP8_AVX2
  simd = isa >= FD_CPU_ISA_AVX2 && head_dim >= 16;  /* the run's isa: AVX2 implies F16C (fd_cpu_isa_detect) */
#endif
  (void)isa, (void)e5m2;
  for (int j = 0; j < n; j++) {
    const uint8_t *src = (const uint8_t *)rows[j] + off;
    const float s = scales ? scales[j] : scale;
    float *o = dst + (ptrdiff_t)j * head_dim;
    int d = 0;
#ifdef FD_FP8_AVX2
    const float as = fabsf(s);
    if (simd && as >= 0x1p-100f && as <= 0x1p100f) {
      d = head_dim & ~15;
      widen_row_avx2(o, src, d, e5m2, s);
    }
#endif
    for (; d < head_dim; d++) o[d] = lut[src[d]] * s;
  }
}
