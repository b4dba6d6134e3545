/*
 * dtype.h — exact conversions between float32 and the 16-bit storage types,
 * on the host. fp16 and bf16 widen to float32 exactly; narrowing rounds to
 * nearest, ties to even, keeps NaN a NaN and overflows to infinity.
 */
#ifndef FD_DTYPE_H
#define FD_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "flashdecode.h"
#include "fp8.h"

static inline float fd_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint32_t fd_f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* bfloat16 -> float32 (exact). */
static inline float fd_bf16_to_f32(uint16_t h) { return fd_bits_to_f32((uint32_t)h << 16); }

/* float32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t fd_f32_to_bf16(float f) {
  uint32_t u = fd_f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* binary16 -> float32 (exact, subnormals included). */
static inline float fd_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13); /* inf or NaN */
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign; /* +-0 */
  } else {
    /* subnormal: value = man * 2^-24, exact in float32 */
    float v = (float)man * 5.9604644775390625e-08f;
    u = sign | fd_f32_to_bits(v);
  }
  return fd_bits_to_f32(u);
}

/* float32 -> binary16, round to nearest even (subnormals and overflow too). */
static inline uint16_t fd_f32_to_f16(float f) {
  uint32_t u = fd_f32_to_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {
    /* result is subnormal or zero: round a * 2^24 to an integer (ties even) */
    if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
    uint32_t e = a >> 23;            /* 102..112 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;       /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits */
  r -= 0x38000000u;                          /* rebias exponent 127 -> 15 */
  return (uint16_t)(sign | (r >> 13));
}

/* Element i of an array of `dtype`, widened exactly to float. */
static inline float fd_load_elem(const void *base, fd_dtype dtype, int64_t i) {
  switch (dtype) {
    case FD_DTYPE_F32: return ((const float *)base)[i];
    case FD_DTYPE_F16: return fd_f16_to_f32(((const uint16_t *)base)[i]);
    case FD_DTYPE_BF16: return fd_bf16_to_f32(((const uint16_t *)base)[i]);
    case FD_DTYPE_E4M3: return fd_e4m3_to_f32(((const uint8_t *)base)[i]);
    case FD_DTYPE_E5M2: return fd_e5m2_to_f32(((const uint8_t *)base)[i]);
  }
  return fd_bits_to_f32(0x7fc00000u); /* not a dtype: NaN */
}

/* Store x as element i of an array of `dtype`, rounded to nearest even (fp8:
 * saturating to the finite range, fp8.h). */
static inline void fd_store_elem(void *base, fd_dtype dtype, int64_t i, float x) {
  switch (dtype) {
    case FD_DTYPE_F32: ((float *)base)[i] = x; break;
    case FD_DTYPE_F16: ((uint16_t *)base)[i] = fd_f32_to_f16(x); break;
    case FD_DTYPE_BF16: ((uint16_t *)base)[i] = fd_f32_to_bf16(x); break;
    case FD_DTYPE_E4M3: ((uint8_t *)base)[i] = fd_f32_to_e4m3(x); break;
    case FD_DTYPE_E5M2: ((uint8_t *)base)[i] = fd_f32_to_e5m2(x); break;
  }
}

#endif /* FD_DTYPE_H */
