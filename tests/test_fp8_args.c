/*
 * test_fp8_args.c — the fp8 fields' bad values: fd_plan_init refuses an fp8
 * q or out dtype, a kv_dtype or kv_scale out of range or without its pair,
 * naming the field; fd_run refuses missing, surplus or misaligned scale
 * pointers, negative scale strides, and (CPU, reference) scale values that
 * are zero, negative, NaN or infinite where a key is read, naming the index,
 * with nothing written; out over the scales is refused (overlap check); scales past kv_len (never read) may be anything;
 * CUDA: an fp8 plan is accepted, an fp8 cache not 16-byte aligned (base or
 * strides) is UNSUPPORTED naming it (checked when a GPU is present).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "flashdecode.h"

enum { B = 2, HQ = 4, HKV = 2, D = 16, CAP = 64 };

static fd_problem fp8_problem(fd_backend backend, fd_kv_scale scale) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = backend;
  p.dtype = FD_DTYPE_BF16;
  p.kv_dtype = FD_DTYPE_E4M3;
  p.kv_scale = scale;
  p.batch = B;
  p.num_heads_q = HQ;
  p.num_heads_kv = HKV;
  p.head_dim = D;
  p.kv_capacity = CAP;
  p.num_threads = 1;
  return p;
}

static void expect(fd_status got, fd_status want, const fd_error *err, const char *needle, const char *what) {
  if (got != want)
    fail_msg("%s: returned %s, want %s (message: %s)", what, fd_status_name(got), fd_status_name(want), err->message);
  if (want != FD_STATUS_OK && !strstr(err->message, needle))
    fail_msg("%s: message \"%s\" does not name \"%s\"", what, err->message, needle);
}

static void test_plan_fields(void **state) {
  (void)state;
  struct {
    const char *what, *needle;
    fd_dtype dtype, out_dtype, kv_dtype;
    int kv_scale;
  } bad[] = {
      {"dtype e4m3", "dtype", FD_DTYPE_E4M3, 0, 0, 0},
      {"dtype e5m2 with kv_dtype e5m2", "dtype", FD_DTYPE_E5M2, 0, FD_DTYPE_E5M2, 0},
      {"out_dtype e4m3", "out_dtype", FD_DTYPE_BF16, FD_DTYPE_E4M3, FD_DTYPE_E4M3, 0},
      {"kv_dtype 9", "kv_dtype", FD_DTYPE_BF16, 0, (fd_dtype)9, 0},
      {"kv_dtype -1", "kv_dtype", FD_DTYPE_BF16, 0, (fd_dtype)-1, 0},
      {"kv_dtype f32 under bf16", "kv_dtype", FD_DTYPE_BF16, 0, FD_DTYPE_F32, 0},
      {"kv_dtype f16 under bf16", "kv_dtype", FD_DTYPE_BF16, 0, FD_DTYPE_F16, 0},
      {"kv_dtype e4m3 under f32", "kv_dtype", FD_DTYPE_F32, 0, FD_DTYPE_E4M3, 0},
      {"kv_scale 4", "kv_scale", FD_DTYPE_BF16, 0, FD_DTYPE_E4M3, 4},
      {"kv_scale -1", "kv_scale", FD_DTYPE_BF16, 0, FD_DTYPE_E4M3, -1},
      {"kv_scale without fp8", "kv_scale", FD_DTYPE_BF16, 0, 0, FD_KV_SCALE_TENSOR},
      {"kv_scale with a bf16 cache", "kv_scale", FD_DTYPE_BF16, 0, FD_DTYPE_BF16, FD_KV_SCALE_TOKEN},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fd_problem p = fp8_problem(FD_BACKEND_CPU, FD_KV_SCALE_NONE);
    p.dtype = bad[i].dtype;
    p.out_dtype = bad[i].out_dtype;
    p.kv_dtype = bad[i].kv_dtype;
    p.kv_scale = (fd_kv_scale)bad[i].kv_scale;
    fd_plan plan;
    fd_error err;
    expect(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, bad[i].needle, bad[i].what);
  }
  /* accepted, and resolved */
  const fd_dtype q[2] = {FD_DTYPE_F16, FD_DTYPE_BF16}, kv[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2};
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 2; k++)
      for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
        fd_problem p = fp8_problem(FD_BACKEND_REFERENCE, (fd_kv_scale)s);
        p.dtype = q[i];
        p.kv_dtype = kv[k];
        p.out_dtype = s == FD_KV_SCALE_HEAD ? FD_DTYPE_F32 : (fd_dtype)0;
        fd_plan plan;
        fd_error err;
        expect(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, "", "valid fp8 plan");
        assert_int_equal(plan.problem.kv_dtype, kv[k]);
        assert_int_equal(plan.problem.kv_scale, s);
      }
  fd_problem p = fp8_problem(FD_BACKEND_CPU, FD_KV_SCALE_NONE);
  p.kv_dtype = (fd_dtype)0;
  fd_plan plan;
  fd_error err;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  assert_int_equal(plan.problem.kv_dtype, FD_DTYPE_BF16); /* 0 = dtype */
}

/* ---- fd_run ---- */

typedef struct run_fixture {
  fd_plan plan;
  uint16_t q[B * HQ * D];
  uint8_t k[B * CAP * HKV * D], v[B * CAP * HKV * D];
  float k_scale[B * CAP * HKV], v_scale[B * CAP * HKV];
  int32_t kv_len[B];
  uint16_t out[B * HQ * D];
  fd_tensors t;
} run_fixture;

static void fixture_init(run_fixture *f, fd_backend backend, fd_kv_scale scale) {
  memset(f, 0, sizeof *f);
  fd_problem p = fp8_problem(backend, scale);
  fd_error err;
  if (fd_plan_init(&f->plan, &p, &err) != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
  for (size_t i = 0; i < sizeof f->q / 2; i++) f->q[i] = 0x3f80; /* 1.0 */
  for (size_t i = 0; i < sizeof f->k; i++) f->k[i] = f->v[i] = (uint8_t)(0x30 + i % 16);
  for (size_t i = 0; i < sizeof f->k_scale / 4; i++) f->k_scale[i] = f->v_scale[i] = 0.5f;
  f->kv_len[0] = 10;
  f->kv_len[1] = 3;
  /* past kv_len: the fp8 NaN code and NaN scales, never read */
  for (int b = 0; b < B; b++)
    for (int j = f->kv_len[b]; j < CAP; j++)
      for (int h = 0; h < HKV; h++) {
        memset(f->k + ((size_t)(b * CAP + j) * HKV + h) * D, 0x7f, D);
        memset(f->v + ((size_t)(b * CAP + j) * HKV + h) * D, 0x7f, D);
        if (scale == FD_KV_SCALE_TOKEN) f->k_scale[(b * CAP + j) * HKV + h] = f->v_scale[(b * CAP + j) * HKV + h] = NAN;
      }
  f->t.q = f->q;
  f->t.k_cache = f->k;
  f->t.v_cache = f->v;
  f->t.kv_len = f->kv_len;
  f->t.out = f->out;
  if (scale != FD_KV_SCALE_NONE) {
    f->t.k_scale = f->k_scale;
    f->t.v_scale = f->v_scale;
  }
}

static void expect_run(run_fixture *f, const fd_tensors *t, fd_status want, const char *needle, const char *what) {
  memset(f->out, 0xff, sizeof f->out);
  fd_error err;
  memset(&err, 0, sizeof err);
  expect(fd_run(&f->plan, t, NULL, 0, NULL, &err), want, &err, needle, what);
  if (want == FD_STATUS_OK) {
    for (size_t i = 0; i < sizeof f->out / 2; i++)
      if ((f->out[i] & 0x7f80) == 0x7f80) fail_msg("%s: out[%zu] is not finite", what, i);
    return;
  }
  for (size_t i = 0; i < sizeof f->out; i++)
    if (((const uint8_t *)f->out)[i] != 0xff) fail_msg("%s: a rejected run wrote out", what);
}

static void test_run_scales(void **state) {
  (void)state;
  static run_fixture f;
  for (int backend = FD_BACKEND_CPU; backend <= FD_BACKEND_REFERENCE; backend += 2) {
    const fd_backend be = (fd_backend)backend;
    fixture_init(&f, be, FD_KV_SCALE_NONE);
    expect_run(&f, &f.t, FD_STATUS_OK, "", "no scales");
    fd_tensors t = f.t;
    t.k_scale = f.k_scale;
    expect_run(&f, &t, FD_STATUS_INVALID_ARGUMENT, "k_scale", "k_scale with FD_KV_SCALE_NONE");

    for (int s = FD_KV_SCALE_TENSOR; s <= FD_KV_SCALE_TOKEN; s++) {
      fixture_init(&f, be, (fd_kv_scale)s);
      expect_run(&f, &f.t, FD_STATUS_OK, "", "valid scales (NaN ones past kv_len)");
      t = f.t, t.v_scale = NULL;
      expect_run(&f, &t, FD_STATUS_INVALID_ARGUMENT, "v_scale", "v_scale NULL");
      t = f.t, t.k_scale = (const float *)((const char *)f.k_scale + 2);
      expect_run(&f, &t, FD_STATUS_INVALID_ARGUMENT, "k_scale", "k_scale misaligned");
      t = f.t, t.scale_strides[1] = -2;
      expect_run(&f, &t, FD_STATUS_INVALID_ARGUMENT, "scale_strides", "negative scale stride");
      t = f.t, t.out = f.v_scale; /* out written over the scales: refused, naming both */
      {
        fd_error err;
        expect(fd_run(&f.plan, &t, NULL, 0, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err,
               "v_scale", "out over v_scale");
        if (!strstr(err.message, "out")) fail_msg("out over v_scale: message \"%s\"", err.message);
      }
      const float bad[4] = {0.0f, -0.5f, NAN, INFINITY};
      /* the last key of sequence 1, kv head 1: index 1 for HEAD, 0 for TENSOR */
      const size_t at = s == FD_KV_SCALE_TENSOR ? 0 : s == FD_KV_SCALE_HEAD ? 1 : (size_t)(1 * CAP + 2) * HKV + 1;
      char needle[32];
      for (int i = 0; i < 4; i++) {
        const float keep = f.v_scale[at];
        f.v_scale[at] = bad[i];
        snprintf(needle, sizeof needle, "v_scale[%zu]", at);
        expect_run(&f, &f.t, FD_STATUS_INVALID_ARGUMENT, needle, "a bad scale value");
        f.v_scale[at] = keep;
      }
    }
  }
}

/* CUDA reads fp8 caches (the tensor-core kernel widens them; results:
 * test_gpu_fp8_grid). Here, without a launch: an fp8 plan is accepted, and
 * an fp8 cache whose base or strides are not 16-byte multiples (bytes = elements)
 * is UNSUPPORTED naming the tensor (the kernel copies 16 fp8 values at a
 * time). An fp32 q with an fp8 cache is refused by the plan (test_plan_fields). */
static void test_cuda_fp8_alignment(void **state) {
  (void)state;
  if (!fd_backend_available(FD_BACKEND_CUDA)) skip();
  enum { DC = 64 };
  fd_problem p = fp8_problem(FD_BACKEND_CUDA, FD_KV_SCALE_NONE);
  p.head_dim = DC;
  fd_plan plan;
  fd_error err;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  /* host buffers standing in for device pointers: every call below stops at
   * the alignment checks, before a launch (nothing is read) */
  static _Alignas(16) unsigned char q[B * HQ * DC * 2], out[B * HQ * DC * 2];
  static _Alignas(16) unsigned char k[B * CAP * HKV * (DC + 16) + 16],
      v[B * CAP * HKV * (DC + 16) + 16];
  static _Alignas(16) int32_t kv_len[B];
  static _Alignas(16) unsigned char ws[1 << 20];
  void *wsp = plan.workspace_size ? ws : NULL;
  if (plan.workspace_size > sizeof ws) skip();
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q;
  t.out = out;
  t.k_cache = k;
  t.v_cache = v;
  t.kv_len = kv_len;
  /* head rows of DC + 8 bytes: not a multiple of 16 */
  t.k_strides[2] = DC + 8;
  t.k_strides[1] = HKV * (DC + 8);
  t.k_strides[0] = CAP * HKV * (DC + 8);
  expect(fd_run(&plan, &t, wsp, plan.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err,
         "k_cache", "CUDA fp8 k_cache stride of 72 bytes");
  memset(t.k_strides, 0, sizeof t.k_strides);
  /* v_cache 8 bytes past a 16-byte boundary */
  t.v_cache = v + 8;
  expect(fd_run(&plan, &t, wsp, plan.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err,
         "v_cache", "CUDA fp8 v_cache base misaligned by 8 bytes");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_fields),
      cmocka_unit_test(test_run_scales),
      cmocka_unit_test(test_cuda_fp8_alignment),
  };
  return cmocka_run_group_tests_name("fp8_args", tests, NULL, NULL);
}
