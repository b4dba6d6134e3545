/*
 * test_append.c — fd_append_kv on the host (CPU and reference backends):
 *   - every new value lands at kv_len[b] + i (contiguous and paged, across a
 *     page boundary), copied exactly into a 16-bit cache, or quantized into
 *     e4m3 / e5m2 with every scale granularity: the code is the rounding of
 *     x / s, its value times s is within half an fp8 step of x, NaN stays
 *     NaN, +-inf and values beyond the range saturate, per-token scales are
 *     the largest finite |x| over max_finite;
 *   - nothing else is written (cache bytes and scales keep their sentinel);
 *   - appending one token at a time writes the same bytes as one call;
 *   - bad arguments: the documented status, a message naming the argument,
 *     nothing written;
 *   - append then attend: fd_run on the appended fp8 cache agrees with the
 *     float64 reference.
 */
#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "append_fixture.h"

static size_t cache_off(const append_fixture *f, int b, int j, int hk) {
  if (f->problem.page_size == 0) return (((size_t)b * ACAP + j) * AHKV + hk) * AD;
  const int page = f->block_table[b * APAGES + j / APAGE];
  return (((size_t)page * APAGE + j % APAGE) * AHKV + hk) * AD;
}

static size_t scale_off(const append_fixture *f, int b, int j, int hk) {
  return cache_off(f, b, j, hk) / AD;
}

static float new_value(const append_fixture *f, int w, int b, int i, int hk, int d, int n) {
  const uint16_t u = (w ? f->v_new : f->k_new)[(((size_t)b * n + i) * AHKV + hk) * AD + d];
  return f->problem.dtype == FD_DTYPE_F16 ? fd_f16_to_f32(u) : fd_bf16_to_f32(u);
}

/* Checks f's caches and scales after appending n tokens from k_new / v_new. */
static void check_appended(const append_fixture *f, int n, const char *what) {
  const fd_problem *p = &f->plan.problem; /* kv_dtype resolved */
  const int fp8 = p->kv_dtype == FD_DTYPE_E4M3 || p->kv_dtype == FD_DTYPE_E5M2;
  const int e5m2 = p->kv_dtype == FD_DTYPE_E5M2;
  const float max_finite = e5m2 ? FD_E5M2_MAX : FD_E4M3_MAX;
  const size_t esize = fd_dtype_size(p->kv_dtype);
  static unsigned char written[sizeof ((append_fixture *)0)->k_cache];
  static unsigned char scale_written[sizeof ((append_fixture *)0)->k_scale / sizeof(float)];
  for (int w = 0; w < 2; w++) {
    const uint8_t *cache = w ? f->v_cache : f->k_cache;
    const float *scale = w ? f->v_scale : f->k_scale;
    memset(written, 0, sizeof written);
    memset(scale_written, 0, sizeof scale_written);
    for (int b = 0; b < AB; b++)
      for (int i = 0; i < n; i++)
        for (int hk = 0; hk < AHKV; hk++) {
          const int j = f->kv_len[b] + i;
          const size_t off = cache_off(f, b, j, hk);
          memset(written + off * esize, 1, AD * esize);
          if (!fp8) {
            for (int d = 0; d < AD; d++) {
              const uint16_t got = ((const uint16_t *)cache)[off + d];
              const uint16_t want = (w ? f->v_new : f->k_new)[(((size_t)b * n + i) * AHKV + hk) * AD + d];
              if (got != want) fail_msg("%s: copy [b=%d,i=%d,hk=%d][%d] 0x%04x != 0x%04x", what, b, i, hk, d, got, want);
            }
            continue;
          }
          float s = 1.0f;
          if (p->kv_scale == FD_KV_SCALE_TENSOR) s = scale[0];
          if (p->kv_scale == FD_KV_SCALE_HEAD) s = scale[hk];
          if (p->kv_scale == FD_KV_SCALE_TOKEN) {
            float amax = 0.0f;
            for (int d = 0; d < AD; d++) {
              const float x = fabsf(new_value(f, w, b, i, hk, d, n));
              if (x <= FLT_MAX && x > amax) amax = x;
            }
            float want = amax > 0.0f ? amax / max_finite : 1.0f;
            if (want < FLT_MIN) want = FLT_MIN;
            s = scale[scale_off(f, b, j, hk)];
            scale_written[scale_off(f, b, j, hk)] = 1;
            if (s != want) fail_msg("%s: scale [b=%d,j=%d,hk=%d] %g, want %g", what, b, j, hk, (double)s, (double)want);
          }
          for (int d = 0; d < AD; d++) {
            const float x = new_value(f, w, b, i, hk, d, n);
            const uint8_t code = cache[off + d];
            const float v = e5m2 ? fd_e5m2_to_f32(code) : fd_e4m3_to_f32(code);
            if (!isnan(x) && code != (e5m2 ? fd_f32_to_e5m2(x / s) : fd_f32_to_e4m3(x / s)))
              fail_msg("%s: [b=%d,i=%d,hk=%d][%d] code 0x%02x is not the rounding of %g / %g", what, b, i, hk, d, code, (double)x, (double)s);
            if (isnan(x)) {
              /* the NaN code with x's sign (S.1111.111 / S.11111.11), on any host */
              const uint8_t nan_code = (uint8_t)((signbit(x) ? 0x80u : 0u) | 0x7fu);
              if (!isnan(v) || code != nan_code)
                fail_msg("%s: NaN (sign %d) stored as code 0x%02x, want 0x%02x", what, signbit(x) != 0, code, nan_code);
              continue;
            }
            if (isnan(v) || isinf(v)) fail_msg("%s: %g stored as %g (must saturate)", what, (double)x, (double)v);
            const double y = (double)x / s;
            if (fabs(y) >= max_finite) {
              if (fabs(v) != max_finite || (v < 0) != (y < 0))
                fail_msg("%s: %g / %g = %g stored as %g, want +-%g", what, (double)x, (double)s, y, (double)v, (double)max_finite);
              continue;
            }
            /* half a step: relative 2^-(man_bits+1) of |y| for normals, half the
             * subnormal step below, plus the rounding of x / s in float32 */
            const double half_step = fmax(fabs(y) * (e5m2 ? 0x1p-3 : 0x1p-4), e5m2 ? 0x1p-17 : 0x1p-10);
            if (fabs((double)v - y) > half_step * (1.0 + 1e-6))
              fail_msg("%s: %g / %g = %.9g stored as %.9g, off by more than half a step", what, (double)x, (double)s, y, (double)v);
          }
        }
    for (size_t i = 0; i < sizeof written; i++)
      if (!written[i] && cache[i] != CACHE_SENTINEL) {
        fail_msg("%s: %s byte %zu written outside the new positions", what, w ? "v_cache" : "k_cache", i);
        break;
      }
    for (size_t i = 0; i < sizeof scale_written; i++) {
      const int kept = p->kv_scale == FD_KV_SCALE_TENSOR || p->kv_scale == FD_KV_SCALE_HEAD ? i < AHKV : 0;
      if (!scale_written[i] && !kept && scale[i] != SCALE_SENTINEL) {
        fail_msg("%s: %s[%zu] written outside the new positions", what, w ? "v_scale" : "k_scale", i);
        break;
      }
    }
  }
}

static void run_one(fd_backend backend, fd_dtype dtype, fd_dtype kv_dtype, fd_kv_scale kv_scale, int paged,
                    int specials) {
  static append_fixture f;
  fd_error err;
  if (append_fixture_init(&f, backend, dtype, kv_dtype, kv_scale, paged, specials, 1234u + (unsigned)kv_scale, &err))
    fail_msg("fd_plan_init: %s", err.message);
  char what[128];
  snprintf(what, sizeof what, "%s %s kv %s scale %d %s%s", fd_backend_name(backend), dtype == FD_DTYPE_F16 ? "f16" : "bf16",
           kv_dtype == FD_DTYPE_E4M3 ? "e4m3" : kv_dtype == FD_DTYPE_E5M2 ? "e5m2" : "16-bit", (int)kv_scale,
           paged ? "paged" : "contig", specials ? " specials" : "");
  const fd_status st = fd_append_kv(&f.plan, &f.t, AMAXNEW, NULL, &err);
  if (st != FD_STATUS_OK) fail_msg("%s: fd_append_kv returned %s: %s", what, fd_status_name(st), err.message);
  check_appended(&f, AMAXNEW, what);
}

static void test_fp8_quantize(void **state) {
  (void)state;
  const fd_dtype kv[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2};
  const fd_dtype q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  for (int k = 0; k < 2; k++)
    for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++)
      for (int paged = 0; paged < 2; paged++) {
        run_one(FD_BACKEND_CPU, q[(k + s) % 2], kv[k], (fd_kv_scale)s, paged, 0);
        run_one(FD_BACKEND_REFERENCE, q[(k + s + 1) % 2], kv[k], (fd_kv_scale)s, paged, 1);
      }
}

static void test_copy_16bit(void **state) {
  (void)state;
  for (int paged = 0; paged < 2; paged++) {
    run_one(FD_BACKEND_CPU, FD_DTYPE_BF16, FD_DTYPE_BF16, FD_KV_SCALE_NONE, paged, 1);
    run_one(FD_BACKEND_CPU, FD_DTYPE_F16, (fd_dtype)0, FD_KV_SCALE_NONE, paged, 1);
  }
}

/* NaN / inf / huge values: NaN code, saturation, per-token scale over the finite ones. */
static void test_specials(void **state) {
  (void)state;
  for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
    run_one(FD_BACKEND_CPU, FD_DTYPE_BF16, FD_DTYPE_E4M3, (fd_kv_scale)s, 1, 1);
    run_one(FD_BACKEND_CPU, FD_DTYPE_F16, FD_DTYPE_E5M2, (fd_kv_scale)s, 0, 1);
  }
}

/* One token a call (bumping kv_len) writes what one call of 7 does. */
static void test_incremental(void **state) {
  (void)state;
  static append_fixture one, inc;
  fd_error err;
  for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
    assert_int_equal(append_fixture_init(&one, FD_BACKEND_CPU, FD_DTYPE_BF16, FD_DTYPE_E4M3, (fd_kv_scale)s, 1, 1, 99, &err), 0);
    assert_int_equal(append_fixture_init(&inc, FD_BACKEND_CPU, FD_DTYPE_BF16, FD_DTYPE_E4M3, (fd_kv_scale)s, 1, 1, 99, &err), 0);
    assert_int_equal(fd_append_kv(&one.plan, &one.t, AMAXNEW, NULL, &err), FD_STATUS_OK);
    static uint16_t k1[AB * AHKV * AD], v1[AB * AHKV * AD];
    for (int i = 0; i < AMAXNEW; i++) {
      for (int b = 0; b < AB; b++) {
        memcpy(k1 + (size_t)b * AHKV * AD, inc.k_new + ((size_t)b * AMAXNEW + i) * AHKV * AD, AHKV * AD * 2);
        memcpy(v1 + (size_t)b * AHKV * AD, inc.v_new + ((size_t)b * AMAXNEW + i) * AHKV * AD, AHKV * AD * 2);
      }
      fd_append_tensors t = inc.t;
      t.k_new = k1;
      t.v_new = v1;
      assert_int_equal(fd_append_kv(&inc.plan, &t, 1, NULL, &err), FD_STATUS_OK);
      for (int b = 0; b < AB; b++) inc.kv_len[b]++;
    }
    assert_memory_equal(one.k_cache, inc.k_cache, sizeof one.k_cache);
    assert_memory_equal(one.v_cache, inc.v_cache, sizeof one.v_cache);
    assert_memory_equal(one.k_scale, inc.k_scale, sizeof one.k_scale);
    assert_memory_equal(one.v_scale, inc.v_scale, sizeof one.v_scale);
  }
}

/* ---- Bad arguments: status, message naming the argument, nothing written ---- */

static void expect_rejected(append_fixture *f, const fd_append_tensors *t, int32_t n, fd_status want,
                            const char *needle) {
  fd_error err;
  memset(&err, 0, sizeof err);
  const fd_status st = fd_append_kv(&f->plan, t, n, NULL, &err);
  if (st != want) fail_msg("%s: returned %s (%s), want %s", needle, fd_status_name(st), err.message, fd_status_name(want));
  if (!strstr(err.message, needle)) fail_msg("message \"%s\" does not name \"%s\"", err.message, needle);
  for (size_t i = 0; i < sizeof f->k_cache; i++)
    if (f->k_cache[i] != CACHE_SENTINEL || f->v_cache[i] != CACHE_SENTINEL) fail_msg("%s: cache written", needle);
  for (size_t i = AHKV; i < sizeof f->k_scale / sizeof(float); i++)
    if (f->k_scale[i] != SCALE_SENTINEL || f->v_scale[i] != SCALE_SENTINEL) fail_msg("%s: scales written", needle);
}

static void test_bad_arguments(void **state) {
  (void)state;
  static append_fixture f;
  fd_error err;
  for (int backend = FD_BACKEND_CPU; backend <= FD_BACKEND_REFERENCE; backend += 2) {
    assert_int_equal(append_fixture_init(&f, (fd_backend)backend, FD_DTYPE_BF16, FD_DTYPE_E4M3, FD_KV_SCALE_HEAD, 1, 0, 5, &err), 0);
    fd_append_tensors t = f.t;
    expect_rejected(&f, &t, -1, FD_STATUS_INVALID_ARGUMENT, "num_new");
    f.kv_len[2] = ACAP - AMAXNEW + 1; /* one token past the capacity */
    expect_rejected(&f, &t, AMAXNEW, FD_STATUS_INVALID_ARGUMENT, "kv_len[2]");
    f.kv_len[2] = -1;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "kv_len[2]");
    f.kv_len[2] = ACAP - AMAXNEW;
    f.block_table[1 * APAGES + 1] = -1; /* sequence 1's second page, where 5 + 7 tokens reach */
    expect_rejected(&f, &t, AMAXNEW, FD_STATUS_INVALID_ARGUMENT, "block_table[1][1]");
    f.block_table[1 * APAGES + 1] = AB * APAGES; /* == num_pages */
    expect_rejected(&f, &t, AMAXNEW, FD_STATUS_INVALID_ARGUMENT, "block_table[1][1]");
    f.block_table[1 * APAGES + 1] = 3;
    const float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
      const float keep = f.v_scale[1];
      f.v_scale[1] = bad[i];
      expect_rejected(&f, &t, AMAXNEW, FD_STATUS_INVALID_ARGUMENT, "v_scale[1]");
      f.v_scale[1] = keep;
    }
    t = f.t, t.k_new = NULL;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "k_new");
    t = f.t, t.v_cache = NULL;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "v_cache");
    t = f.t, t.block_table = NULL;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "block_table");
    t = f.t, t.k_scale = NULL;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "k_scale");
    t = f.t, t.k_new_strides[1] = -5;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "k_new_strides");
    t = f.t, t.scale_strides[0] = -1;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "scale_strides");
    t = f.t, t.v_new = (const char *)f.v_new + 1; /* not on a 2-byte element */
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "v_new");
    t = f.t;
    expect_rejected(&f, &t, 0, FD_STATUS_OK, ""); /* nothing to do */
    assert_int_equal(fd_append_kv(NULL, &t, 1, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_int_equal(fd_append_kv(&f.plan, NULL, 1, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
    /* scales given to a plan without kv_scale */
    assert_int_equal(append_fixture_init(&f, (fd_backend)backend, FD_DTYPE_BF16, FD_DTYPE_E5M2, FD_KV_SCALE_NONE, 0, 0, 5, &err), 0);
    t = f.t, t.v_scale = f.v_scale;
    expect_rejected(&f, &t, 1, FD_STATUS_INVALID_ARGUMENT, "v_scale");
  }
}

/* Append new tokens to empty sequences, then attend: CPU vs reference. */
static void test_append_then_attend(void **state) {
  (void)state;
  static append_fixture f;
  fd_error err;
  for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
    assert_int_equal(append_fixture_init(&f, FD_BACKEND_CPU, FD_DTYPE_BF16, s % 2 ? FD_DTYPE_E5M2 : FD_DTYPE_E4M3, (fd_kv_scale)s, s % 2, 0, 7, &err), 0);
    for (int b = 0; b < AB; b++) f.kv_len[b] = 0; /* every key read is a new one */
    assert_int_equal(fd_append_kv(&f.plan, &f.t, AMAXNEW, NULL, &err), FD_STATUS_OK);
    int32_t len[AB];
    for (int b = 0; b < AB; b++) len[b] = f.kv_len[b] + AMAXNEW;
    /* q: the first new key of each sequence, as the 4 query heads */
    static uint16_t q[AB * 2 * AHKV * AD];
    for (int b = 0; b < AB; b++) memcpy(q + (size_t)b * 2 * AHKV * AD, f.k_new + (size_t)b * AMAXNEW * AHKV * AD, 2 * AHKV * AD * 2);
    uint16_t out_cpu[AB * 2 * AHKV * AD], out_ref[AB * 2 * AHKV * AD];
    fd_tensors t = {0};
    t.q = q;
    t.k_cache = f.k_cache;
    t.v_cache = f.v_cache;
    t.kv_len = len;
    t.block_table = f.t.block_table;
    t.k_scale = f.t.k_scale;
    t.v_scale = f.t.v_scale;
    for (int r = 0; r < 2; r++) {
      fd_problem p = f.problem;
      p.backend = r ? FD_BACKEND_REFERENCE : FD_BACKEND_CPU;
      t.out = r ? out_ref : out_cpu;
      if (fd_decode(&p, &t, NULL, &err) != FD_STATUS_OK) fail_msg("fd_decode: %s", err.message);
    }
    for (size_t i = 0; i < sizeof out_cpu / 2; i++) {
      const float a = fd_bf16_to_f32(out_cpu[i]), b = fd_bf16_to_f32(out_ref[i]);
      if (!(fabsf(a - b) <= 0.02f * fmaxf(1.0f, fabsf(b)))) fail_msg("scale %d: out[%zu] %g vs reference %g", s, i, (double)a, (double)b);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8_quantize),  cmocka_unit_test(test_copy_16bit),
      cmocka_unit_test(test_specials),      cmocka_unit_test(test_incremental),
      cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_append_then_attend),
  };
  return cmocka_run_group_tests_name("append", tests, NULL, NULL);
}
