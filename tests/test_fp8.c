/*
 * test_fp8.c — the fp8 conversions of src/fp8.h against a plain definition
 * of the formats (OCP OFP8 rev. 1.0): every one of the 256 bit patterns of
 * E4M3 and E5M2 widens to its value, and rounding from float32 gives the
 * nearest value (ties to even mantissa), saturating to the largest finite
 * one, NaN to NaN, at every midpoint, just beside it, at the values
 * themselves and on random floats of every magnitude.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_kernels.h"
#include "fp8.h"

typedef struct format {
  const char *name;
  int exp_bits, man_bits, bias;
  int ieee; /* E5M2: all-ones exponent is inf (mantissa 0) or NaN; E4M3: only S.1111.111 is NaN */
  double max;
  float (*widen)(uint8_t);
  uint8_t (*narrow)(float);
} format;

static const format E4M3 = {"e4m3", 4, 3, 7, 0, 448.0, fd_e4m3_to_f32, fd_f32_to_e4m3};
static const format E5M2 = {"e5m2", 5, 2, 15, 1, 57344.0, fd_e5m2_to_f32, fd_f32_to_e5m2};

/* The plain definition: sign, exponent and mantissa fields to a value. */
static double plain_value(const format *f, unsigned x, int *is_nan) {
  const int sign = (x >> 7) & 1;
  const unsigned exp = (x >> f->man_bits) & ((1u << f->exp_bits) - 1u);
  const unsigned man = x & ((1u << f->man_bits) - 1u);
  const unsigned exp_ones = (1u << f->exp_bits) - 1u, man_ones = (1u << f->man_bits) - 1u;
  *is_nan = 0;
  double v;
  if (f->ieee && exp == exp_ones) {
    if (man != 0) {
      *is_nan = 1;
      return NAN;
    }
    v = INFINITY;
  } else if (!f->ieee && exp == exp_ones && man == man_ones) {
    *is_nan = 1;
    return NAN;
  } else if (exp == 0) {
    v = ldexp((double)man, 1 - f->bias - f->man_bits);
  } else {
    v = ldexp(1.0 + (double)man / (double)(1u << f->man_bits), (int)exp - f->bias);
  }
  return sign ? -v : v;
}

/* Rounding by search: the finite code nearest to x (ties: even mantissa,
 * i.e. even code), beyond the largest finite value the largest; NaN: NaN. */
static int plain_round(const format *f, double x, uint8_t *code) {
  if (isnan(x)) return 1; /* caller checks NaN-ness */
  const int neg = signbit(x);
  const double a = fabs(x);
  if (a >= f->max) {
    int dummy;
    for (unsigned c = 0; c < 128; c++)
      if (plain_value(f, c, &dummy) == f->max) *code = (uint8_t)(c | (neg ? 0x80u : 0u));
    return 0;
  }
  unsigned best = 0;
  double best_d = INFINITY;
  for (unsigned c = 0; c < 128; c++) {
    int nan;
    const double v = plain_value(f, c, &nan);
    if (nan || isinf(v)) continue;
    const double d = fabs(v - a);
    if (d < best_d || (d == best_d && (c & 1u) == 0)) best = c, best_d = d;
  }
  *code = (uint8_t)(best | (neg ? 0x80u : 0u));
  return 0;
}

static void check_widen(const format *f) {
  for (unsigned x = 0; x < 256; x++) {
    int nan;
    const double want = plain_value(f, x, &nan);
    const float got = f->widen((uint8_t)x);
    if (nan) {
      if (!isnan(got)) fail_msg("%s 0x%02x: got %g, want NaN", f->name, x, (double)got);
      continue;
    }
    if (!((double)got == want) || !signbit(got) != !signbit(want))
      fail_msg("%s 0x%02x: got %.9g, want %.9g", f->name, x, (double)got, want);
  }
}

static void check_one(const format *f, float x) {
  const uint8_t got = f->narrow(x);
  if (isnan(x)) {
    int nan;
    (void)plain_value(f, got, &nan);
    if (!nan) fail_msg("%s: narrow(NaN) = 0x%02x, not a NaN", f->name, got);
    if ((got & 0x80u) != (signbit(x) ? 0x80u : 0u)) fail_msg("%s: narrow(NaN) lost the sign", f->name);
    return;
  }
  uint8_t want = 0;
  plain_round(f, (double)x, &want);
  /* +-0 both encode as a zero of x's sign */
  if (got != want) fail_msg("%s: narrow(%.9g = 0x%08x) = 0x%02x, want 0x%02x", f->name, (double)x,
                            fd_fp8_f32_to_bits(x), got, want);
}

/* Every value, every midpoint between neighbours, and the floats just beside
 * each, both signs. */
static void check_narrow(const format *f) {
  double vals[128];
  int n = 0;
  for (unsigned c = 0; c < 128; c++) {
    int nan;
    const double v = plain_value(f, c, &nan);
    if (!nan && !isinf(v)) vals[n++] = v;
  }
  for (int i = 0; i < n; i++) {
    const double next = i + 1 < n ? vals[i + 1] : vals[i] * 2.0; /* past max: a made-up neighbour */
    const float pts[] = {(float)vals[i], (float)((vals[i] + next) / 2.0)};
    for (int k = 0; k < 2; k++) {
      const float p = pts[k];
      const float around[] = {p, nextafterf(p, INFINITY), nextafterf(p, -INFINITY)};
      for (int j = 0; j < 3; j++) {
        check_one(f, around[j]);
        check_one(f, -around[j]);
      }
    }
  }
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e30f, -1e30f, 3.4e38f,
                           1e-30f, -1e-30f, 1e-40f, 1.4e-45f, FLT_MIN, 0.1f, 1.0f / 3.0f};
  for (size_t i = 0; i < sizeof special / sizeof *special; i++) check_one(f, special[i]);
  /* random float32 bit patterns (every exponent) */
  uint64_t s = 0x243f6a8885a308d3ull;
  for (int i = 0; i < 200000; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float x = fd_fp8_bits_to_f32((uint32_t)(s >> 32));
    check_one(f, x);
  }
}

/* Narrowing a value gives back its code (all 256 patterns but NaNs; -0 too). */
static void check_round_trip(const format *f) {
  for (unsigned x = 0; x < 256; x++) {
    int nan;
    const double v = plain_value(f, x, &nan);
    if (nan) continue;
    const uint8_t back = f->narrow(f->widen((uint8_t)x));
    const unsigned want = isinf(v) ? (x & 0x80u) | (unsigned)f->narrow((float)f->max) : x;
    if (back != want) fail_msg("%s: 0x%02x -> %g -> 0x%02x", f->name, x, v, back);
  }
}

static void test_e4m3_widen(void **state) { (void)state, check_widen(&E4M3); }
static void test_e5m2_widen(void **state) { (void)state, check_widen(&E5M2); }
static void test_e4m3_narrow(void **state) { (void)state, check_narrow(&E4M3); }
static void test_e5m2_narrow(void **state) { (void)state, check_narrow(&E5M2); }
static void test_round_trip(void **state) {
  (void)state;
  check_round_trip(&E4M3);
  check_round_trip(&E5M2);
}

/* A few values by hand (from the OCP tables). */
static void test_known(void **state) {
  (void)state;
  assert_true(fd_e4m3_to_f32(0x7e) == 448.0f);
  assert_true(fd_e4m3_to_f32(0x01) == 0x1p-9f);
  assert_true(fd_e4m3_to_f32(0x08) == 0x1p-6f);
  assert_true(isnan(fd_e4m3_to_f32(0x7f)) && isnan(fd_e4m3_to_f32(0xff)));
  assert_true(fd_e4m3_to_f32(0x78) == 256.0f); /* S.1111.000 is finite in e4m3fn */
  assert_true(fd_e5m2_to_f32(0x7b) == 57344.0f);
  assert_true(fd_e5m2_to_f32(0x7c) == INFINITY && fd_e5m2_to_f32(0xfc) == -INFINITY);
  assert_true(fd_e5m2_to_f32(0x01) == 0x1p-16f);
  assert_true(isnan(fd_e5m2_to_f32(0x7d)) && isnan(fd_e5m2_to_f32(0x7e)));
  assert_int_equal(fd_f32_to_e4m3(1000.0f), 0x7e);
  assert_int_equal(fd_f32_to_e4m3(-INFINITY), 0xfe);
  assert_int_equal(fd_f32_to_e4m3(NAN), 0x7f);
  assert_int_equal(fd_f32_to_e5m2(INFINITY), 0x7b);
  assert_int_equal(fd_f32_to_e5m2(1e6f), 0x7b);
  assert_int_equal(fd_f32_to_e5m2(NAN), 0x7f);
  assert_int_equal(fd_f32_to_e4m3(464.0f), 0x7e); /* tie 448 | 480 (NaN slot): saturates */
  assert_int_equal(fd_f32_to_e4m3(0x1p-10f), 0x00); /* half the smallest subnormal: tie to 0 */
  assert_int_equal(fd_f32_to_e4m3(0x1.8p-9f), 0x02); /* 1.5 subnormal steps: tie to 2 */
  assert_int_equal(fd_f32_to_e4m3(-0.0f), 0x80);
}

/* The CPU backend's widening of fp8 rows (cpu_fp8.c): every instruction set
 * this machine has gives lut[code] * scale, for all 256 codes, at scales that
 * take the SIMD path and ones that take the table, rows of 16..256 codes
 * with tails. */
static void test_cpu_widen(void **state) {
  (void)state;
  static const fd_dtype types[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2};
  static const float scales[] = {1.0f, 0.013f, 3.1e-5f, 1e20f, -0.5f, 0x1p-100f, 1e-35f, 1e35f};
  uint8_t codes[272];
  for (int i = 0; i < 272; i++) codes[i] = (uint8_t)(i * 7 + 3);
  for (int k = 0; k < 2; k++) {
    float lut[256], got[272];
    fd_cpu_fp8_table(types[k], lut);
    for (int i = 0; i < 256; i++)
      assert_true(k ? (isnan(lut[i]) ? isnan(fd_e5m2_to_f32((uint8_t)i)) : lut[i] == fd_e5m2_to_f32((uint8_t)i))
                    : (isnan(lut[i]) ? isnan(fd_e4m3_to_f32((uint8_t)i)) : lut[i] == fd_e4m3_to_f32((uint8_t)i)));
    const int dims[] = {16, 40, 64, 136, 256, 8};
    for (size_t si = 0; si < sizeof scales / sizeof *scales; si++)
      for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        const int D = dims[di], rows = 272 / D > 4 ? 4 : 272 / D;
        const void *ptrs[4];
        for (int r = 0; r < rows; r++) ptrs[r] = codes + r * (272 - D) / (rows > 1 ? rows - 1 : 1);
        for (int isa = FD_CPU_ISA_SCALAR; isa <= (int)fd_cpu_isa_detect(); isa++) {
          fd_cpu_widen_fp8(got, ptrs, 0, rows, D, lut, NULL, scales[si], (fd_cpu_isa)isa, k);
          for (int r = 0; r < rows; r++)
            for (int d = 0; d < D; d++) {
              const float w = lut[((const uint8_t *)ptrs[r])[d]] * scales[si], g = got[r * D + d];
              if (isnan(w) ? !isnan(g) : fd_fp8_f32_to_bits(w) != fd_fp8_f32_to_bits(g))
                fail_msg("%s isa %d scale %g D %d: code 0x%02x gives %g, want %g",
                         k ? "e5m2" : "e4m3", isa, (double)scales[si], D,
                         ((const uint8_t *)ptrs[r])[d], (double)g, (double)w);
            }
        }
      }
  }
}

/* The widening to bf16 bits (fd_cpu_widen_fp8_bf16, the path without
 * per-token scales): every instruction set this machine has gives the
 * table's lut16[code] for all 256 codes (NaN codes: a bf16 NaN), rows of
 * 8..256 codes with 16- and 32-code tails, at an offset into each row. */
static void test_cpu_widen_bf16(void **state) {
  (void)state;
  static const fd_dtype types[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2};
  uint8_t codes[300];
  for (int i = 0; i < 300; i++) codes[i] = (uint8_t)(i * 7 + 3); /* every code: 7 is odd */
  for (int k = 0; k < 2; k++) {
    float lut[256];
    uint16_t lut16[256], got[4 * 256 + 16];
    fd_cpu_fp8_table(types[k], lut);
    fd_cpu_fp8_table_bf16(lut, lut16);
    const int dims[] = {8, 16, 40, 48, 64, 80, 96, 128, 136, 256};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
      const int D = dims[di], rows = 4, off = 5;
      const void *ptrs[4];
      for (int r = 0; r < rows; r++) ptrs[r] = codes + r * (300 - D - off) / (rows - 1);
      for (int isa = FD_CPU_ISA_SCALAR; isa <= (int)fd_cpu_isa_detect(); isa++) {
        memset(got, 0xA5, sizeof got);
        fd_cpu_widen_fp8_bf16(got, ptrs, off, rows, D, lut16, (fd_cpu_isa)isa, k);
        for (int r = 0; r < rows; r++)
          for (int d = 0; d < D; d++) {
            const uint8_t code = ((const uint8_t *)ptrs[r])[off + d];
            const uint16_t w = lut16[code], g = got[r * D + d];
            const int w_nan = (w & 0x7f80) == 0x7f80 && (w & 0x7f);
            const int g_nan = (g & 0x7f80) == 0x7f80 && (g & 0x7f);
            if (w_nan ? !g_nan : w != g)
              fail_msg("%s isa %d D %d: code 0x%02x gives bf16 0x%04x, want 0x%04x",
                       k ? "e5m2" : "e4m3", isa, D, code, g, w);
          }
        assert_int_equal(got[rows * D], 0xA5A5); /* nothing past the rows */
      }
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_e4m3_widen),  cmocka_unit_test(test_e5m2_widen),
      cmocka_unit_test(test_e4m3_narrow), cmocka_unit_test(test_e5m2_narrow),
      cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_known),
      cmocka_unit_test(test_cpu_widen),   cmocka_unit_test(test_cpu_widen_bf16),
  };
  return cmocka_run_group_tests_name("fp8", tests, NULL, NULL);
}
