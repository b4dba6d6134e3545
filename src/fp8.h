/*
 * fp8.h — the two 8-bit float formats of an fp8 KV cache, host and device:
 * exact widening to float32 and rounding from float32 (to nearest, ties to
 * even, saturating to the finite range). One definition compiled by the C
 * files and the CUDA files alike, so the CPU and the GPU quantize to the same
 * bits. Formats (flashdecode.h, FP8 KV CACHE; OCP OFP8 rev. 1.0, 2023):
 *   E4M3 (e4m3fn): bias 7, 3 mantissa bits, no infinities, S.1111.111 NaN,
 *                  largest finite 448, subnormals m * 2^-9
 *   E5M2:          bias 15, 2 mantissa bits, S.11111.00 inf, S.11111.xx NaN,
 *                  largest finite 57344, subnormals m * 2^-16
 */
#ifndef FD_FP8_H
#define FD_FP8_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define FD_FP8_HD __host__ __device__ __forceinline__
#else
#define FD_FP8_HD static inline
#endif

/* Largest finite values. */
#define FD_E4M3_MAX 448.0f
#define FD_E5M2_MAX 57344.0f

FD_FP8_HD float fd_fp8_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

FD_FP8_HD uint32_t fd_fp8_f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* e4m3fn -> float32, exact. */
FD_FP8_HD float fd_e4m3_to_f32(uint8_t x) {
  const uint32_t sign = (uint32_t)(x & 0x80u) << 24;
  const uint32_t exp = (x >> 3) & 0xfu, man = x & 0x7u;
  if (exp == 0xfu && man == 0x7u) return fd_fp8_bits_to_f32(sign | 0x7fc00000u); /* NaN */
  if (exp == 0) {
    /* subnormal or zero: man * 2^-9, exact in float32 */
    const float v = (float)man * 0.001953125f;
    return fd_fp8_bits_to_f32(sign | fd_fp8_f32_to_bits(v));
  }
  return fd_fp8_bits_to_f32(sign | ((exp + 120u) << 23) | (man << 20)); /* rebias 7 -> 127 */
}

/* e5m2 -> float32, exact. */
FD_FP8_HD float fd_e5m2_to_f32(uint8_t x) {
  const uint32_t sign = (uint32_t)(x & 0x80u) << 24;
  const uint32_t exp = (x >> 2) & 0x1fu, man = x & 0x3u;
  if (exp == 0x1fu) return fd_fp8_bits_to_f32(sign | 0x7f800000u | (man ? 0x400000u : 0u));
  if (exp == 0) {
    /* subnormal or zero: man * 2^-16, exact in float32 */
    const float v = (float)man * 1.52587890625e-05f;
    return fd_fp8_bits_to_f32(sign | fd_fp8_f32_to_bits(v));
  }
  return fd_fp8_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 21)); /* rebias 15 -> 127 */
}

/*
 * float32 -> an 8-bit format with `man_bits` mantissa bits and exponent bias
 * `bias`, rounded to nearest (ties to even), saturating: |f| beyond the
 * largest finite value (`max_bits`, the float32 bits of it), infinities
 * included, gives +-max; NaN gives S.1111111 (NaN in both formats).
 */
FD_FP8_HD uint8_t fd_f32_to_fp8(float f, uint32_t man_bits, uint32_t bias, uint32_t max_bits) {
  const uint32_t u = fd_fp8_f32_to_bits(f);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN */
  const uint32_t shift = 23u - man_bits;                 /* float32 mantissa bits dropped */
  const uint32_t rebias = (127u - bias) << 23;           /* exponent 127 -> bias */
  const uint32_t min_normal = (128u - bias) << 23;       /* float32 bits of 2^(1 - bias) */
  /* largest finite as an 8-bit code: its float32 bits rebiased */
  const uint32_t max_code = (max_bits - rebias) >> shift;
  if (a >= min_normal) {
    if (a >= max_bits) return (uint8_t)(sign | max_code); /* beyond the largest: saturate */
    /* round the mantissa to man_bits (a carry moves into the exponent) */
    const uint32_t r = a + ((1u << (shift - 1u)) - 1u) + ((a >> shift) & 1u);
    uint32_t code = (r - rebias) >> shift;
    if (code > max_code) code = max_code; /* rounded past the largest finite */
    return (uint8_t)(sign | code);
  }
  /* subnormal or zero: round |f| / 2^(1 - bias - man_bits) to an integer
   * (ties even); 2^man_bits means the smallest normal (code 2^man_bits) */
  const uint32_t e = a >> 23;
  const uint32_t sub_shift = 151u - bias - man_bits; /* |f| = m 2^(e - 150): r = m >> (sub_shift - e) */
  if (e + 25u <= sub_shift) return sign; /* below half the smallest subnormal (f32 subnormals too) */
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t s = sub_shift - e; /* 21..24 (E4M3), 22..24 (E5M2) */
  uint32_t r = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  if (rem > half || (rem == half && (r & 1u))) r++;
  return (uint8_t)(sign | r);
}

/* float32 -> e4m3fn (ties to even, saturating, NaN -> S.1111.111). */
FD_FP8_HD uint8_t fd_f32_to_e4m3(float f) { return fd_f32_to_fp8(f, 3u, 7u, 0x43e00000u); }

/* float32 -> e5m2 (ties to even, saturating to +-57344, NaN -> S.11111.11). */
FD_FP8_HD uint8_t fd_f32_to_e5m2(float f) { return fd_f32_to_fp8(f, 2u, 15u, 0x47600000u); }

/* ---- Quantizing new tokens (fd_append_kv) ---- */

/* The per-token scale of a row whose largest finite |x| is amax (0 when it
 * has none): amax / max_finite in float32, at least FLT_MIN (2^-126), 1 when
 * amax is 0. */
FD_FP8_HD float fd_fp8_token_scale(float amax, float max_finite) {
  if (!(amax > 0.0f)) return 1.0f;
  const float s = amax / max_finite;
  return s < 1.17549435082228750797e-38f ? 1.17549435082228750797e-38f : s;
}

/* |x| when finite, else 0: what the per-token amax is taken over. */
FD_FP8_HD float fd_fp8_finite_abs(float x) {
  const float a = x < 0.0f ? -x : x;
  return a <= 3.40282346638528859812e+38f ? a : 0.0f; /* NaN and inf compare false */
}

/* x quantized with scale s: the float32 quotient x / s rounded to e4m3
 * (e5m2 when `e5m2`), ties to even, saturating. The sign is computed from
 * the bits (x's sign xor s's; a NaN x keeps its own) and the rounding sees
 * |x| / |s| only, so no NaN's sign ever comes from float arithmetic: the
 * GPU's division returns the canonical NaN 0x7fffffff for any NaN operand
 * while x86 returns the operand, sign included, and the compiler is free to
 * treat a NaN quotient's sign as its operand's (nvcc merged an earlier
 * "NaN x -> its sign" test into the quotient's, which wrote 0x7f on the GPU
 * for torch's bf16 NaN 0xffff where the CPU wrote 0xff). */
FD_FP8_HD uint8_t fd_fp8_quantize(float x, float s, int e5m2) {
  const uint32_t ux = fd_fp8_f32_to_bits(x), us = fd_fp8_f32_to_bits(s);
  const int x_nan = (ux & 0x7fffffffu) > 0x7f800000u;
  const uint8_t sign = (uint8_t)(((x_nan ? ux : ux ^ us) >> 24) & 0x80u);
  const float y = fd_fp8_bits_to_f32(ux & 0x7fffffffu) / fd_fp8_bits_to_f32(us & 0x7fffffffu);
  const uint8_t code = e5m2 ? fd_f32_to_e5m2(y) : fd_f32_to_e4m3(y);
  return (uint8_t)(sign | (code & 0x7fu));
}

#undef FD_FP8_HD
#endif /* FD_FP8_H */
