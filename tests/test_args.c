/*
 * test_args.c — bad arguments: every public function returns the documented
 * status with a non-empty message naming the argument, never crashes, and a
 * rejected fd_run writes nothing (out and lse keep their NaN poison). Also
 * status names, backend names, dtype sizes and the version macros.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashdecode.h"
#include "gpu_mem.h"

/* ---- A small valid problem and its tensors (CPU, host memory) ------------------- */

enum { B = 2, T = 1, HQ = 4, HKV = 2, D = 8, CAP = 256, PAGE = 64, PAGES = 4 };

typedef struct fixture {
  fd_problem problem;
  fd_plan plan;
  float q[B * T * HQ * D];
  float k[B * CAP * HKV * D], v[B * CAP * HKV * D]; /* also a pool of 8 pages of 64 */
  int32_t kv_len[B];
  int32_t block_table[B * PAGES];
  float out[B * T * HQ * D];
  float lse[B * HQ * T];
  unsigned char *workspace;
  fd_tensors t;
} fixture;

static void poison_outputs(fixture *f) {
  memset(f->out, 0xff, sizeof f->out);
  memset(f->lse, 0xff, sizeof f->lse);
}

static int outputs_untouched(const fixture *f) {
  const unsigned char *o = (const unsigned char *)f->out, *l = (const unsigned char *)f->lse;
  for (size_t i = 0; i < sizeof f->out; i++)
    if (o[i] != 0xff) return 0;
  for (size_t i = 0; i < sizeof f->lse; i++)
    if (l[i] != 0xff) return 0;
  return 1;
}

/* backend CPU or REFERENCE; page_size 0 or PAGE; num_splits 2 (CPU) so the
 * plan needs a workspace. */
static fixture *make_fixture(fd_backend backend, int32_t page_size) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  fd_problem *p = &f->problem;
  p->backend = backend;
  p->dtype = FD_DTYPE_F32;
  p->batch = B;
  p->q_len = T;
  p->num_heads_q = HQ;
  p->num_heads_kv = HKV;
  p->head_dim = D;
  p->kv_capacity = CAP;
  p->num_splits = 2;
  p->num_threads = 1;
  if (page_size) {
    p->page_size = page_size;
    p->max_pages_per_seq = PAGES;
    p->num_pages = 2 * PAGES;
  }
  fd_error err;
  fd_status st = fd_plan_init(&f->plan, p, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
  for (size_t i = 0; i < sizeof f->q / sizeof *f->q; i++) f->q[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (size_t i = 0; i < sizeof f->k / sizeof *f->k; i++) {
    f->k[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
    f->v[i] = (float)((i * 3) % 17) / 17.0f - 0.5f;
  }
  f->kv_len[0] = 100;
  f->kv_len[1] = CAP;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < PAGES; i++) f->block_table[b * PAGES + i] = b * PAGES + (PAGES - 1 - i);
  f->workspace = malloc(f->plan.workspace_size ? f->plan.workspace_size : 1);
  assert_non_null(f->workspace);
  f->t.q = f->q;
  f->t.k_cache = f->k;
  f->t.v_cache = f->v;
  f->t.kv_len = f->kv_len;
  f->t.block_table = page_size ? f->block_table : NULL;
  f->t.out = f->out;
  f->t.lse = f->lse;
  poison_outputs(f);
  return f;
}

static void free_fixture(fixture *f) {
  free(f->workspace);
  free(f);
}

static fd_status run(fixture *f, fd_error *err) {
  poison_outputs(f);
  return fd_run(&f->plan, &f->t, f->workspace, f->plan.workspace_size, NULL, err);
}

/* The status is `want`, err carries it, and the message names `needle`. */
static void expect_status(fd_status got, fd_status want, const fd_error *err, const char *needle,
                          const char *what) {
  if (got != want)
    fail_msg("%s: returned %s, want %s (message: %s)", what, fd_status_name(got), fd_status_name(want),
             err->message);
  if (err->status != want) fail_msg("%s: err.status %s, want %s", what, fd_status_name(err->status), fd_status_name(want));
  if (want == FD_STATUS_OK) return;
  if (err->message[0] == '\0') fail_msg("%s: empty message", what);
  if (strlen(err->message) >= sizeof err->message) fail_msg("%s: message not terminated", what);
  if (needle && !strstr(err->message, needle))
    fail_msg("%s: message \"%s\" does not name \"%s\"", what, err->message, needle);
}

/* ---- fd_plan_init ------------------------------------------------------------------ */

static fd_problem valid_problem(void) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 2;
  p.num_heads_q = 8;
  p.num_heads_kv = 2;
  p.head_dim = 64;
  p.kv_capacity = 1000;
  return p;
}

static void test_plan_null(void **state) {
  (void)state;
  fd_problem p = valid_problem();
  fd_plan plan;
  fd_error err;
  expect_status(fd_plan_init(NULL, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, "plan", "plan NULL");
  expect_status(fd_plan_init(&plan, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "problem", "problem NULL");
  assert_int_equal(fd_plan_init(NULL, &p, NULL), FD_STATUS_INVALID_ARGUMENT);
  assert_int_equal(fd_plan_init(&plan, NULL, NULL), FD_STATUS_INVALID_ARGUMENT);
  /* And success clears a stale error. */
  err.status = FD_STATUS_BACKEND_ERROR;
  expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL, "valid problem");
}

typedef struct bad_problem {
  const char *what;
  const char *needle;
  void (*mutate)(fd_problem *p);
} bad_problem;

static void m_dtype0(fd_problem *p) { p->dtype = (fd_dtype)0; }
static void m_dtype9(fd_problem *p) { p->dtype = (fd_dtype)9; }
static void m_backend9(fd_problem *p) { p->backend = (fd_backend)9; }
static void m_batch0(fd_problem *p) { p->batch = 0; }
static void m_batch_neg(fd_problem *p) { p->batch = -3; }
static void m_q_len17(fd_problem *p) { p->q_len = 17; }
static void m_q_len_neg(fd_problem *p) { p->q_len = -1; }
static void m_hq0(fd_problem *p) { p->num_heads_q = 0; }
static void m_hkv0(fd_problem *p) { p->num_heads_kv = 0; }
static void m_heads_indivisible(fd_problem *p) { p->num_heads_q = 6, p->num_heads_kv = 4; }
static void m_head_dim0(fd_problem *p) { p->head_dim = 0; }
static void m_head_dim257(fd_problem *p) { p->head_dim = 257; }
static void m_head_dim_neg(fd_problem *p) { p->head_dim = -64; }
static void m_cap_neg(fd_problem *p) { p->kv_capacity = -1; }
static void m_page257(fd_problem *p) { p->page_size = 257, p->max_pages_per_seq = 4; }
static void m_page_neg(fd_problem *p) { p->page_size = -16; }
static void m_max_pages0(fd_problem *p) { p->page_size = 16, p->max_pages_per_seq = 0; }
static void m_cap_over_pages(fd_problem *p) { p->page_size = 16, p->max_pages_per_seq = 10, p->kv_capacity = 161; }
static void m_num_pages_neg(fd_problem *p) { p->page_size = 16, p->max_pages_per_seq = 100, p->num_pages = -1; }
static void m_splits_neg(fd_problem *p) { p->num_splits = -2; }
static void m_scale_nan(fd_problem *p) { p->softmax_scale = NAN; }
static void m_scale_inf(fd_problem *p) { p->softmax_scale = -INFINITY; }
static void m_threads_neg(fd_problem *p) { p->num_threads = -1; }
static void m_device_neg(fd_problem *p) { p->device = -1; }
static void m_sm_neg(fd_problem *p) { p->sm_count = -8; }
static const int32_t hint_neg[2] = {10, -1};
static const int32_t hint_big[2] = {1001, 10};
static void m_hint_neg(fd_problem *p) { p->kv_len_hint = hint_neg; }
static void m_hint_big(fd_problem *p) { p->kv_len_hint = hint_big; }
/* the attention variants */
static void m_has_window2(fd_problem *p) { p->has_window = 2, p->window_left = 10; }
static void m_has_window_neg(fd_problem *p) { p->has_window = -1, p->window_left = 10; }
static void m_window_left_neg2(fd_problem *p) { p->has_window = 1, p->window_left = -2; }
static void m_window_left_min(fd_problem *p) { p->has_window = 1, p->window_left = INT32_MIN; }
static void m_soft_cap_neg(fd_problem *p) { p->logits_soft_cap = -1.0f; }
static void m_soft_cap_nan(fd_problem *p) { p->logits_soft_cap = NAN; }
static void m_soft_cap_inf(fd_problem *p) { p->logits_soft_cap = INFINITY; }
static void m_soft_cap_neg_inf(fd_problem *p) { p->logits_soft_cap = -INFINITY; }
static void m_soft_cap_tiny_neg(fd_problem *p) { p->logits_soft_cap = -1e-30f; }
/* below FLT_MIN: 1 / cap overflows float, a zero score would become NaN */
static void m_soft_cap_subnormal(fd_problem *p) { p->logits_soft_cap = 1e-39f; }
static void m_soft_cap_denorm_min(fd_problem *p) { p->logits_soft_cap = 1.4e-45f; }
static void m_non_causal2(fd_problem *p) { p->non_causal = 2; }
static void m_no_pdl2(fd_problem *p) { p->no_pdl = 2; }
static void m_no_pdl_neg(fd_problem *p) { p->no_pdl = -1; }
static void m_non_causal_neg(fd_problem *p) { p->non_causal = -1; }
static void m_non_causal_window(fd_problem *p) { p->non_causal = 1, p->has_window = 1, p->window_left = 100; }
static void m_non_causal_window0(fd_problem *p) { p->non_causal = 1, p->has_window = 1, p->window_left = 0; }
static void m_non_causal_q129(fd_problem *p) { p->non_causal = 1, p->q_len = FD_MAX_Q_LEN_NON_CAUSAL + 1; }
static void m_non_causal_q_neg(fd_problem *p) { p->non_causal = 1, p->q_len = -1; }
static void m_causal_q17(fd_problem *p) { p->q_len = FD_MAX_Q_LEN + 1, p->has_window = 1, p->window_left = 5; }
static void m_out_dtype9(fd_problem *p) { p->out_dtype = (fd_dtype)9; }
static void m_out_dtype_neg(fd_problem *p) { p->out_dtype = (fd_dtype)-1; }
static void m_out_dtype_f16(fd_problem *p) { p->out_dtype = FD_DTYPE_F16; } /* dtype bf16 */
static void m_out_dtype_bf16_of_f32(fd_problem *p) { p->dtype = FD_DTYPE_F32, p->out_dtype = FD_DTYPE_BF16; }
static void m_out_dtype_f16_of_f32(fd_problem *p) { p->dtype = FD_DTYPE_F32, p->out_dtype = FD_DTYPE_F16; }
static void m_out_dtype_bf16_of_f16(fd_problem *p) { p->dtype = FD_DTYPE_F16, p->out_dtype = FD_DTYPE_BF16; }

static void test_plan_bad_fields(void **state) {
  (void)state;
  const bad_problem cases[] = {
      {"dtype 0", "dtype", m_dtype0},
      {"dtype 9", "dtype", m_dtype9},
      {"backend 9", "backend", m_backend9},
      {"batch 0", "batch", m_batch0},
      {"batch -3", "batch", m_batch_neg},
      {"q_len 17", "q_len", m_q_len17},
      {"q_len -1", "q_len", m_q_len_neg},
      {"num_heads_q 0", "num_heads_q", m_hq0},
      {"num_heads_kv 0", "num_heads_kv", m_hkv0},
      {"heads 6:4", "num_heads", m_heads_indivisible},
      {"head_dim 0", "head_dim", m_head_dim0},
      {"head_dim 257", "head_dim", m_head_dim257},
      {"head_dim -64", "head_dim", m_head_dim_neg},
      {"kv_capacity -1", "kv_capacity", m_cap_neg},
      {"page_size 257", "page_size", m_page257},
      {"page_size -16", "page_size", m_page_neg},
      {"max_pages_per_seq 0", "max_pages_per_seq", m_max_pages0},
      {"kv_capacity over the pages", "kv_capacity", m_cap_over_pages},
      {"num_pages -1", "num_pages", m_num_pages_neg},
      {"num_splits -2", "num_splits", m_splits_neg},
      {"softmax_scale NaN", "softmax_scale", m_scale_nan},
      {"softmax_scale -inf", "softmax_scale", m_scale_inf},
      {"num_threads -1", "num_threads", m_threads_neg},
      {"device -1", "device", m_device_neg},
      {"sm_count -8", "sm_count", m_sm_neg},
      {"kv_len_hint -1", "kv_len_hint", m_hint_neg},
      {"kv_len_hint > kv_capacity", "kv_len_hint", m_hint_big},
      {"has_window 2", "has_window", m_has_window2},
      {"has_window -1", "has_window", m_has_window_neg},
      {"window_left -2", "window_left", m_window_left_neg2},
      {"window_left INT32_MIN", "window_left", m_window_left_min},
      {"logits_soft_cap -1", "logits_soft_cap", m_soft_cap_neg},
      {"logits_soft_cap NaN", "logits_soft_cap", m_soft_cap_nan},
      {"logits_soft_cap inf", "logits_soft_cap", m_soft_cap_inf},
      {"logits_soft_cap -inf", "logits_soft_cap", m_soft_cap_neg_inf},
      {"logits_soft_cap -1e-30", "logits_soft_cap", m_soft_cap_tiny_neg},
      {"logits_soft_cap 1e-39", "logits_soft_cap", m_soft_cap_subnormal},
      {"logits_soft_cap 1.4e-45", "logits_soft_cap", m_soft_cap_denorm_min},
      {"non_causal 2", "non_causal", m_non_causal2},
      {"no_pdl 2", "no_pdl", m_no_pdl2},
      {"no_pdl -1", "no_pdl", m_no_pdl_neg},
      {"non_causal -1", "non_causal", m_non_causal_neg},
      {"non_causal with a window of 100", "non_causal|window", m_non_causal_window},
      {"non_causal with a window of 0", "non_causal|window", m_non_causal_window0},
      {"non_causal q_len 129", "q_len", m_non_causal_q129},
      {"non_causal q_len -1", "q_len", m_non_causal_q_neg},
      {"causal q_len 17 (with a window)", "q_len", m_causal_q17},
      {"out_dtype 9", "out_dtype", m_out_dtype9},
      {"out_dtype -1", "out_dtype", m_out_dtype_neg},
      {"out_dtype f16 of bf16", "out_dtype", m_out_dtype_f16},
      {"out_dtype bf16 of f32", "out_dtype", m_out_dtype_bf16_of_f32},
      {"out_dtype f16 of f32", "out_dtype", m_out_dtype_f16_of_f32},
      {"out_dtype bf16 of f16", "out_dtype", m_out_dtype_bf16_of_f16},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fd_problem p = valid_problem();
    cases[i].mutate(&p);
    fd_plan plan;
    memset(&plan, 0x5a, sizeof plan);
    fd_error err;
    memset(&err, 0, sizeof err);
    const fd_status st = fd_plan_init(&plan, &p, &err);
    /* "a|b": the message names a or b */
    char needle[64];
    snprintf(needle, sizeof needle, "%s", cases[i].needle);
    char *bar = strchr(needle, '|');
    if (bar) {
      *bar = '\0';
      if (!strstr(err.message, needle)) memmove(needle, bar + 1, strlen(bar + 1) + 1);
    }
    expect_status(st, FD_STATUS_INVALID_ARGUMENT, &err, needle, cases[i].what);
    assert_int_equal(fd_plan_init(&plan, &p, NULL), FD_STATUS_INVALID_ARGUMENT);
    /* A plan whose init failed cannot be run. */
    fd_tensors t;
    memset(&t, 0, sizeof t);
    expect_status(fd_run(&plan, &t, NULL, 0, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "plan", cases[i].what);
  }
}

/* Zero is "default" for q_len (1), kv_capacity of a paged cache (all pages). */
static void test_plan_defaults(void **state) {
  (void)state;
  fd_problem p = valid_problem();
  fd_plan plan;
  fd_error err;
  expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL, "q_len 0");
  assert_int_equal(plan.problem.q_len, 1);
  assert_true(fabsf(plan.softmax_scale - 0.125f) < 1e-7f);
  p.page_size = 16;
  p.max_pages_per_seq = 10;
  p.kv_capacity = 0;
  expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL, "paged, capacity 0");
  assert_int_equal(plan.kv_capacity, 160);
  p.softmax_scale = 0.5f;
  expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL, "scale 0.5");
  assert_true(plan.softmax_scale == 0.5f);
}

/* The variants' valid values: accepted, and kept in plan.problem (resolved:
 * has_window 1 with window_left -1 is no window, out_dtype 0 is dtype). */
static void test_plan_variants_accepted(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int bi = 0; bi < 2; bi++)
    for (int di = 0; di < 3; di++) {
      fd_problem p = valid_problem();
      p.backend = backends[bi];
      p.dtype = dtypes[di];
      fd_plan plan;
      fd_error err;
      char what[96];
      const int32_t windows[] = {-1, 0, 1, 127, INT32_MAX};
      for (size_t i = 0; i < sizeof windows / sizeof *windows; i++) {
        fd_problem v = p;
        v.has_window = 1, v.window_left = windows[i], v.q_len = FD_MAX_Q_LEN;
        snprintf(what, sizeof what, "%s window_left %d", fd_backend_name(p.backend), windows[i]);
        expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, what);
        /* resolved: window_left -1 is no window */
        assert_int_equal(plan.problem.has_window, windows[i] >= 0);
        assert_int_equal(plan.problem.window_left, windows[i]);
      }
      const float caps[] = {FLT_MIN, 1e-30f, 1.0f, 50.0f, 3.0e38f};
      for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
        fd_problem v = p;
        v.logits_soft_cap = caps[i];
        snprintf(what, sizeof what, "%s logits_soft_cap %g", fd_backend_name(p.backend), (double)caps[i]);
        expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, what);
        assert_true(plan.problem.logits_soft_cap == caps[i]);
      }
      {
        /* just below the smallest accepted cap: refused, the message names it */
        fd_problem v = p;
        v.logits_soft_cap = nextafterf(FLT_MIN, 0.0f);
        snprintf(what, sizeof what, "%s logits_soft_cap below FLT_MIN", fd_backend_name(p.backend));
        expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_INVALID_ARGUMENT, &err,
                      "logits_soft_cap", what);
        char smallest[32];
        snprintf(smallest, sizeof smallest, ">= %g", (double)FLT_MIN);
        if (!strstr(err.message, smallest))
          fail_msg("%s: message \"%s\" does not give the smallest cap (%s)", what, err.message,
                   smallest);
      }
      const int32_t qs[] = {1, 17, 64, FD_MAX_Q_LEN_NON_CAUSAL};
      for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
        fd_problem v = p;
        v.non_causal = 1, v.q_len = qs[i];
        snprintf(what, sizeof what, "%s non_causal q_len %d", fd_backend_name(p.backend), qs[i]);
        expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, what);
        assert_int_equal(plan.problem.non_causal, 1);
        assert_int_equal(plan.problem.q_len, qs[i]);
      }
      fd_problem v = p;
      v.out_dtype = FD_DTYPE_F32;
      expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "out_dtype f32");
      assert_int_equal(plan.problem.out_dtype, FD_DTYPE_F32);
      v.out_dtype = p.dtype;
      expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "out_dtype = dtype");
      assert_int_equal(plan.problem.out_dtype, p.dtype);
      v.out_dtype = (fd_dtype)0; /* resolved: dtype */
      expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "out_dtype 0");
      assert_int_equal(plan.problem.out_dtype, p.dtype);
      /* all of them at once (the window and non-causal exclude each other) */
      v = p;
      v.has_window = 1, v.window_left = 63, v.logits_soft_cap = 30.0f, v.out_dtype = FD_DTYPE_F32, v.q_len = 16;
      expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "window, soft-cap, f32 out");
      v.has_window = 0, v.non_causal = 1, v.q_len = 100;
      expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "non-causal, soft-cap, f32 out");
    }
}

static void test_plan_cuda(void **state) {
  (void)state;
  fd_problem p = valid_problem();
  p.backend = FD_BACKEND_CUDA;
  fd_plan plan;
  fd_error err;
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    /* Not built in, or no device of compute capability 8.0+: UNSUPPORTED, naming the backend. */
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_UNSUPPORTED, &err, "backend", "CUDA without a GPU");
    return;
  }
  const int32_t unsupported[] = {100, 32, 8, 72, 88, 112, 192};
  for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
    p.head_dim = unsupported[i];
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_UNSUPPORTED, &err, "head_dim", "CUDA head_dim");
  }
  const int32_t supported[] = {64, 80, 96, 128, 256};
  for (size_t i = 0; i < sizeof supported / sizeof *supported; i++) {
    p.head_dim = supported[i];
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL, "CUDA head_dim 64/80/96/128/256");
    /* and with every variant (each dtype's fp32 out) */
    fd_problem v = p;
    v.has_window = 1, v.window_left = 127, v.logits_soft_cap = 30.0f, v.out_dtype = FD_DTYPE_F32, v.q_len = 16;
    expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "CUDA windowed, soft-capped");
    v = p;
    v.non_causal = 1, v.q_len = FD_MAX_Q_LEN_NON_CAUSAL;
    expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_OK, &err, NULL, "CUDA non-causal q_len 128");
    v.q_len = FD_MAX_Q_LEN_NON_CAUSAL + 1;
    expect_status(fd_plan_init(&plan, &v, &err), FD_STATUS_INVALID_ARGUMENT, &err, "q_len", "CUDA non-causal q_len 129");
  }
  p.head_dim = 257;
  expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, "head_dim", "CUDA head_dim 257");
}

/* ---- fd_run ------------------------------------------------------------------------- */

static void test_run_null(void **state) {
  (void)state;
  fixture *f = make_fixture(FD_BACKEND_CPU, 0);
  fd_error err;
  expect_status(fd_run(NULL, &f->t, f->workspace, f->plan.workspace_size, NULL, &err),
                FD_STATUS_INVALID_ARGUMENT, &err, "plan", "plan NULL");
  expect_status(fd_run(&f->plan, NULL, f->workspace, f->plan.workspace_size, NULL, &err),
                FD_STATUS_INVALID_ARGUMENT, &err, "tensors", "tensors NULL");
  assert_int_equal(fd_run(NULL, NULL, NULL, 0, NULL, NULL), FD_STATUS_INVALID_ARGUMENT);

  /* An uninitialised (zeroed) plan. */
  fd_plan zero;
  memset(&zero, 0, sizeof zero);
  poison_outputs(f);
  expect_status(fd_run(&zero, &f->t, f->workspace, f->plan.workspace_size, NULL, &err),
                FD_STATUS_INVALID_ARGUMENT, &err, "plan", "zeroed plan");
  assert_true(outputs_untouched(f));

  struct {
    const char *name;
    const void **slot;
  } ptrs[] = {
      {"q", &f->t.q}, {"k_cache", &f->t.k_cache}, {"v_cache", &f->t.v_cache},
      {"kv_len", (const void **)&f->t.kv_len}, {"out", (const void **)&f->t.out},
  };
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) {
    const void *saved = *ptrs[i].slot;
    *ptrs[i].slot = NULL;
    expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, ptrs[i].name, ptrs[i].name);
    assert_int_equal(run(f, NULL), FD_STATUS_INVALID_ARGUMENT);
    assert_true(outputs_untouched(f));
    *ptrs[i].slot = saved;
  }
  /* lse is optional. */
  f->t.lse = NULL;
  expect_status(run(f, &err), FD_STATUS_OK, &err, NULL, "lse NULL");
  free_fixture(f);

  /* A paged plan needs a block table. */
  f = make_fixture(FD_BACKEND_CPU, PAGE);
  f->t.block_table = NULL;
  expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, "block_table", "block_table NULL");
  assert_true(outputs_untouched(f));
  free_fixture(f);
}

static void test_run_negative_strides(void **state) {
  (void)state;
  const char *names[] = {"q_strides", "k_strides", "v_strides", "out_strides", "lse_strides"};
  for (int which = 0; which < 5; which++)
    for (int dim = 0; dim < 3; dim++) {
      fixture *f = make_fixture(FD_BACKEND_CPU, 0);
      int64_t *s[] = {f->t.q_strides, f->t.k_strides, f->t.v_strides, f->t.out_strides, f->t.lse_strides};
      /* Valid contiguous strides, then one negative. */
      const int64_t q3[3] = {T * HQ * D, HQ * D, D}, kv3[3] = {CAP * HKV * D, HKV * D, D}, l3[3] = {HQ * T, T, 1};
      memcpy(f->t.q_strides, q3, sizeof q3);
      memcpy(f->t.out_strides, q3, sizeof q3);
      memcpy(f->t.k_strides, kv3, sizeof kv3);
      memcpy(f->t.v_strides, kv3, sizeof kv3);
      memcpy(f->t.lse_strides, l3, sizeof l3);
      fd_error err;
      expect_status(run(f, &err), FD_STATUS_OK, &err, NULL, "explicit contiguous strides");
      s[which][dim] = -s[which][dim];
      char what[64];
      snprintf(what, sizeof what, "%s[%d] negative", names[which], dim);
      expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, names[which], what);
      assert_true(outputs_untouched(f));
      free_fixture(f);
    }
  fixture *f = make_fixture(FD_BACKEND_CPU, PAGE);
  f->t.block_table_stride = -PAGES;
  fd_error err;
  expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, "block_table_stride", "block_table_stride negative");
  assert_true(outputs_untouched(f));
  free_fixture(f);
}

static void test_run_workspace(void **state) {
  (void)state;
  fixture *f = make_fixture(FD_BACKEND_CPU, 0);
  assert_true(f->plan.num_splits > 1);
  assert_true(f->plan.workspace_size > 0);
  fd_error err;
  poison_outputs(f);
  expect_status(fd_run(&f->plan, &f->t, f->workspace, f->plan.workspace_size - 1, NULL, &err),
                FD_STATUS_WORKSPACE_TOO_SMALL, &err, "workspace", "workspace one byte short");
  assert_true(outputs_untouched(f));
  expect_status(fd_run(&f->plan, &f->t, NULL, f->plan.workspace_size, NULL, &err),
                FD_STATUS_WORKSPACE_TOO_SMALL, &err, "workspace", "workspace NULL");
  assert_true(outputs_untouched(f));
  expect_status(fd_run(&f->plan, &f->t, f->workspace, 0, NULL, &err), FD_STATUS_WORKSPACE_TOO_SMALL, &err,
                "workspace", "workspace size 0");
  expect_status(fd_run(&f->plan, &f->t, f->workspace, f->plan.workspace_size, NULL, &err), FD_STATUS_OK, &err,
                NULL, "exact workspace");
  assert_false(outputs_untouched(f));
  free_fixture(f);

  /* One split: no workspace needed at all. */
  f = make_fixture(FD_BACKEND_REFERENCE, 0);
  assert_int_equal(f->plan.workspace_size, 0);
  poison_outputs(f);
  expect_status(fd_run(&f->plan, &f->t, NULL, 0, NULL, &err), FD_STATUS_OK, &err, NULL, "no workspace");
  free_fixture(f);
}

/* CPU and reference check kv_len and block_table on the host; nothing written. */
static void test_run_host_checks(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  for (int bi = 0; bi < 2; bi++) {
    const int32_t bad_lens[] = {-1, CAP + 1, INT32_MIN, INT32_MAX};
    for (int pi = 0; pi < 2; pi++) {
      for (size_t i = 0; i < sizeof bad_lens / sizeof *bad_lens; i++) {
        fixture *f = make_fixture(backends[bi], pi ? PAGE : 0);
        f->kv_len[1] = bad_lens[i];
        fd_error err;
        char what[96];
        snprintf(what, sizeof what, "%s %s kv_len %d", fd_backend_name(backends[bi]), pi ? "paged" : "dense",
                 bad_lens[i]);
        expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, "kv_len", what);
        if (!outputs_untouched(f)) fail_msg("%s: out or lse written", what);
        free_fixture(f);
      }
    }
    /* Page ids outside [0, num_pages) in a column the sequence uses. */
    const int32_t bad_ids[] = {-1, 2 * PAGES, INT32_MAX};
    for (size_t i = 0; i < 3; i++) {
      fixture *f = make_fixture(backends[bi], PAGE);
      f->block_table[1] = bad_ids[i]; /* sequence 0, page 1: keys 64..127 < kv_len 100 */
      fd_error err;
      char what[96];
      snprintf(what, sizeof what, "%s block_table id %d", fd_backend_name(backends[bi]), bad_ids[i]);
      expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, "block_table", what);
      if (!outputs_untouched(f)) fail_msg("%s: out or lse written", what);
      free_fixture(f);
    }
    /* ... but an id in a column past kv_len is never looked at. */
    fixture *f = make_fixture(backends[bi], PAGE);
    f->block_table[3] = -1; /* sequence 0, page 3: keys 192.. >= kv_len 100 */
    fd_error err;
    expect_status(run(f, &err), FD_STATUS_OK, &err, NULL, "unused block_table column");
    free_fixture(f);
  }
}

/* Rejected runs of the CUDA backend (only with a GPU). */
static void test_run_cuda_alignment(void **state) {
  (void)state;
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    print_message("CUDA backend not available: alignment checks not run\n");
    skip();
  }
#ifdef FD_TEST_HAVE_CUDA
  fd_problem p = valid_problem();
  p.backend = FD_BACKEND_CUDA;
  p.q_len = 1;
  fd_plan plan;
  fd_error err;
  expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL, "CUDA plan");
  const size_t q_bytes = 2 * 8 * 64 * 2 + 64, kv_bytes = (size_t)2 * 1000 * 2 * 64 * 2 + 64;
  unsigned char *q = NULL, *k = NULL, *v = NULL, *out = NULL, *ws = NULL;
  int32_t *kv_len = NULL;
  assert_int_equal(fd_gpu_malloc((void **)&q, q_bytes), 0);
  assert_int_equal(fd_gpu_malloc((void **)&out, q_bytes), 0);
  assert_int_equal(fd_gpu_malloc((void **)&k, kv_bytes), 0);
  assert_int_equal(fd_gpu_malloc((void **)&v, kv_bytes), 0);
  assert_int_equal(fd_gpu_malloc((void **)&kv_len, 2 * sizeof(int32_t)), 0);
  assert_int_equal(fd_gpu_malloc((void **)&ws, plan.workspace_size + 64), 0);
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q + 2; /* 2-byte offset: misaligned */
  t.k_cache = k;
  t.v_cache = v;
  t.kv_len = kv_len;
  t.out = out;
  expect_status(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err, "q", "q misaligned");
  t.q = q;
  t.out = out + 2;
  expect_status(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err, "out", "out misaligned");
  t.out = out;
  t.k_strides[0] = 1000 * 2 * 64;
  t.k_strides[1] = 2 * 64 + 4; /* 8 bytes: not a multiple of 16 */
  t.k_strides[2] = 64;
  expect_status(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err, "k_cache", "k stride");
  memset(t.k_strides, 0, sizeof t.k_strides);
  /* fp32 out of bf16 inputs: out's alignment counts float32 elements */
  fd_problem p32 = p;
  p32.out_dtype = FD_DTYPE_F32;
  fd_plan plan32;
  expect_status(fd_plan_init(&plan32, &p32, &err), FD_STATUS_OK, &err, NULL, "CUDA plan, fp32 out");
  unsigned char *out32 = NULL;
  assert_int_equal(fd_gpu_malloc((void **)&out32, 2 * q_bytes + 64), 0);
  t.out = out32 + 8; /* 8 bytes: two floats, not 16-byte aligned */
  expect_status(fd_run(&plan32, &t, ws, plan32.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err, "out",
                "fp32 out misaligned");
  t.out = out32;
  t.out_strides[0] = 8 * 64 + 2, t.out_strides[1] = 8 * 64, t.out_strides[2] = 64; /* 2 floats: 8 bytes */
  expect_status(fd_run(&plan32, &t, ws, plan32.workspace_size, NULL, &err), FD_STATUS_UNSUPPORTED, &err, "out",
                "fp32 out stride");
  memset(t.out_strides, 0, sizeof t.out_strides);
  /* sinks (device memory) not aligned to a float */
  t.sinks = (const float *)(const void *)(out32 + 2);
  expect_status(fd_run(&plan32, &t, ws, plan32.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err,
                "sinks", "sinks misaligned");
  fd_gpu_free(out32);
  fd_gpu_free(q);
  fd_gpu_free(out);
  fd_gpu_free(k);
  fd_gpu_free(v);
  fd_gpu_free(kv_len);
  fd_gpu_free(ws);
#endif
}

/* A NaN sink is no argument error: its head's rows are NaN (out and lse;
 * never a silent number), every other row is as without it. CPU (1 and 2
 * splits) and reference; a sequence with kv_len 0 gets lse = its sink. */
static void test_run_nan_sink(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  for (int bi = 0; bi < 2; bi++)
    for (int splits = 1; splits <= 2; splits++)
      for (int empty = 0; empty < 2; empty++) {
        fixture *f = make_fixture(backends[bi], 0);
        if (splits == 1 && backends[bi] == FD_BACKEND_CPU) {
          fd_problem p = f->problem;
          p.num_splits = 1;
          fd_error err;
          if (fd_plan_init(&f->plan, &p, &err) != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
        }
        if (empty) f->kv_len[1] = 0;
        const float sinks[HQ] = {0.5f, NAN, -1.0f, 3.0f};
        f->t.sinks = sinks;
        fd_error err;
        char what[96];
        snprintf(what, sizeof what, "%s, %d split(s), sink NaN for head 1%s", fd_backend_name(backends[bi]),
                 f->plan.num_splits, empty ? ", kv_len[1] = 0" : "");
        expect_status(run(f, &err), FD_STATUS_OK, &err, NULL, what);
        for (int b = 0; b < B; b++)
          for (int h = 0; h < HQ; h++) {
            const float *o = f->out + ((size_t)b * T * HQ + h) * D;
            const float l = f->lse[(size_t)b * HQ + h];
            const int sees = f->kv_len[b] > 0;
            for (int i = 0; i < D; i++) {
              if (h == 1 && sees && !isnan(o[i]))
                fail_msg("%s: out[b=%d,h=%d][%d] = %g, want NaN", what, b, h, i, (double)o[i]);
              if (h == 1 && !sees && !(o[i] == 0.0f || isnan(o[i])))
                fail_msg("%s: out[b=%d,h=%d][%d] = %g (no key), want 0 or NaN", what, b, h, i, (double)o[i]);
              if (h != 1 && sees && !isfinite(o[i]))
                fail_msg("%s: out[b=%d,h=%d][%d] = %g, want a number (another head's NaN sink)", what, b, h, i,
                         (double)o[i]);
              if (h != 1 && !sees && !(o[i] == 0.0f))
                fail_msg("%s: out[b=%d,h=%d][%d] = %g (no key), want 0", what, b, h, i, (double)o[i]);
            }
            if (h == 1 && !isnan(l)) fail_msg("%s: lse[b=%d,h=%d] = %g, want NaN", what, b, h, (double)l);
            if (h != 1 && sees && !isfinite(l)) fail_msg("%s: lse[b=%d,h=%d] = %g, want a number", what, b, h, (double)l);
            if (h != 1 && !sees && !(fabsf(l - sinks[h]) <= 1e-6f * fmaxf(1.0f, fabsf(sinks[h]))))
              fail_msg("%s: lse[b=%d,h=%d] = %g (no key), want the sink %g", what, b, h, (double)l, (double)sinks[h]);
          }
        free_fixture(f);
      }
}

/* sinks not aligned to a float: INVALID_ARGUMENT naming sinks, nothing written. */
static void test_run_sinks_misaligned(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  for (int bi = 0; bi < 2; bi++) {
    fixture *f = make_fixture(backends[bi], 0);
    float storage[HQ + 1] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    f->t.sinks = (const float *)(const void *)((const char *)storage + 2);
    fd_error err;
    expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, "sinks", "sinks misaligned");
    assert_true(outputs_untouched(f));
    f->t.sinks = storage;
    expect_status(run(f, &err), FD_STATUS_OK, &err, NULL, "sinks aligned");
    free_fixture(f);
  }
}

/* q, k_cache, v_cache, out, lse, kv_len and block_table one byte off their
 * element alignment, each alone: refused naming it, nothing written (CPU and
 * reference; CUDA's 16-byte rule is test_run_cuda_alignment's). */
static void test_run_pointers_misaligned(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  static const char *const names[7] = {"q: not aligned",   "k_cache: not aligned",
                                       "v_cache: not aligned", "out: not aligned",
                                       "lse: not aligned", "kv_len: not aligned",
                                       "block_table: not aligned"};
  for (int bi = 0; bi < 2; bi++)
    for (int paged = 0; paged < 2; paged++) {
      fixture *f = make_fixture(backends[bi], paged ? PAGE : 0);
      fd_error err;
      for (int i = 0; i < 7; i++) {
        if (i == 6 && !paged) continue;
        const fd_tensors keep = f->t;
        switch (i) {
          case 0: f->t.q = (const char *)f->q + 1; break;
          case 1: f->t.k_cache = (const char *)f->k + 1; break;
          case 2: f->t.v_cache = (const char *)f->v + 1; break;
          case 3: f->t.out = (char *)f->out + 1; break;
          case 4: f->t.lse = (float *)(void *)((char *)f->lse + 2); break;
          case 5: f->t.kv_len = (const int32_t *)(const void *)((const char *)f->kv_len + 1); break;
          default: f->t.block_table = (const int32_t *)(const void *)((const char *)f->block_table + 2);
        }
        expect_status(run(f, &err), FD_STATUS_INVALID_ARGUMENT, &err, names[i], names[i]);
        assert_true(outputs_untouched(f));
        f->t = keep;
      }
      expect_status(run(f, &err), FD_STATUS_OK, &err, NULL, "aligned again");
      free_fixture(f);
    }
}

/* The deterministic mode's length limit (FD_DETERMINISTIC_MAX_KEYS keys read a
 * sequence) on every backend, the reference included, which never splits. */
static void test_plan_deterministic_limit(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  for (int bi = 0; bi < 2; bi++) {
    fd_problem p = valid_problem();
    p.backend = backends[bi];
    p.deterministic = 1;
    p.num_splits = 0;
    p.kv_capacity = FD_DETERMINISTIC_MAX_KEYS + 1;
    fd_plan plan;
    fd_error err;
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, "kv_capacity",
                  "deterministic over the limit");
    p.has_window = 1; /* a window reads window_left + q_len + 63 keys at most */
    p.window_left = FD_DETERMINISTIC_MAX_KEYS;
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, "kv_capacity",
                  "deterministic, a window over the limit");
    p.window_left = 1000;
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL,
                  "deterministic, a window under the limit");
    p.has_window = 0;
    p.kv_capacity = FD_DETERMINISTIC_MAX_KEYS;
    expect_status(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, NULL,
                  "deterministic at the limit");
  }
}

/* fd_decode: plan errors and run errors pass through. */
static void test_decode(void **state) {
  (void)state;
  fixture *f = make_fixture(FD_BACKEND_CPU, 0);
  fd_error err;
  expect_status(fd_decode(NULL, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "problem", "decode problem NULL");
  expect_status(fd_decode(&f->problem, NULL, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "tensors", "decode tensors NULL");
  fd_problem bad = f->problem;
  bad.head_dim = 257;
  expect_status(fd_decode(&bad, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "head_dim", "decode head_dim 257");
  f->kv_len[0] = CAP + 5;
  poison_outputs(f);
  expect_status(fd_decode(&f->problem, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "kv_len", "decode kv_len");
  assert_true(outputs_untouched(f));
  f->kv_len[0] = 7;
  expect_status(fd_decode(&f->problem, &f->t, NULL, &err), FD_STATUS_OK, &err, NULL, "decode");
  assert_false(outputs_untouched(f));
  free_fixture(f);
}

/* fd_decode: the variants' field errors pass through, nothing written. */
static void test_decode_variants(void **state) {
  (void)state;
  fixture *f = make_fixture(FD_BACKEND_CPU, 0);
  fd_error err;
  fd_problem bad = f->problem;
  bad.non_causal = 2;
  poison_outputs(f);
  expect_status(fd_decode(&bad, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "non_causal", "decode non_causal 2");
  assert_true(outputs_untouched(f));
  bad = f->problem;
  bad.out_dtype = FD_DTYPE_BF16;
  expect_status(fd_decode(&bad, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "out_dtype", "decode out_dtype bf16 of f32");
  assert_true(outputs_untouched(f));
  bad = f->problem;
  bad.logits_soft_cap = NAN;
  expect_status(fd_decode(&bad, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err, "logits_soft_cap", "decode soft-cap NaN");
  assert_true(outputs_untouched(f));
  fd_problem good = f->problem;
  good.has_window = 1, good.window_left = 10, good.logits_soft_cap = 5.0f;
  expect_status(fd_decode(&good, &f->t, NULL, &err), FD_STATUS_OK, &err, NULL, "decode window 10, soft-cap 5");
  assert_false(outputs_untouched(f));
  free_fixture(f);

  /* The smallest soft-cap: zero scores (q = 0) stay 0 (1 / cap is finite:
   * below FLT_MIN it overflowed and 0 * inf made every output NaN); one
   * below it is refused, nothing written. CPU and reference. */
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  for (int bi = 0; bi < 2; bi++) {
    f = make_fixture(backends[bi], 0);
    memset(f->q, 0, sizeof f->q);
    fd_problem tiny = f->problem;
    tiny.logits_soft_cap = nextafterf(FLT_MIN, 0.0f);
    poison_outputs(f);
    expect_status(fd_decode(&tiny, &f->t, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err,
                  "logits_soft_cap", "decode soft-cap below FLT_MIN");
    assert_true(outputs_untouched(f));
    tiny.logits_soft_cap = FLT_MIN;
    expect_status(fd_decode(&tiny, &f->t, NULL, &err), FD_STATUS_OK, &err, NULL, "decode soft-cap FLT_MIN");
    for (size_t i = 0; i < sizeof f->out / sizeof *f->out; i++)
      if (!isfinite(f->out[i])) fail_msg("%s soft-cap FLT_MIN: out[%zu] = %g", fd_backend_name(backends[bi]), i, (double)f->out[i]);
    for (size_t i = 0; i < sizeof f->lse / sizeof *f->lse; i++)
      if (!isfinite(f->lse[i])) fail_msg("%s soft-cap FLT_MIN: lse[%zu] = %g", fd_backend_name(backends[bi]), i, (double)f->lse[i]);
    free_fixture(f);
  }
}

/* ---- Names and versions ---------------------------------------------------------------- */

static void test_status_names(void **state) {
  (void)state;
  assert_string_equal(fd_status_name(FD_STATUS_OK), "FD_STATUS_OK");
  assert_string_equal(fd_status_name(FD_STATUS_INVALID_ARGUMENT), "FD_STATUS_INVALID_ARGUMENT");
  assert_string_equal(fd_status_name(FD_STATUS_UNSUPPORTED), "FD_STATUS_UNSUPPORTED");
  assert_string_equal(fd_status_name(FD_STATUS_WORKSPACE_TOO_SMALL), "FD_STATUS_WORKSPACE_TOO_SMALL");
  assert_string_equal(fd_status_name(FD_STATUS_OUT_OF_MEMORY), "FD_STATUS_OUT_OF_MEMORY");
  assert_string_equal(fd_status_name(FD_STATUS_BACKEND_ERROR), "FD_STATUS_BACKEND_ERROR");
  assert_string_equal(fd_status_name((fd_status)6), "FD_STATUS_UNKNOWN");
  assert_string_equal(fd_status_name((fd_status)99), "FD_STATUS_UNKNOWN");
  assert_string_equal(fd_status_name((fd_status)-1), "FD_STATUS_UNKNOWN");
}

static void test_backend_and_dtype_names(void **state) {
  (void)state;
  assert_string_equal(fd_backend_name(FD_BACKEND_AUTO), "auto");
  assert_string_equal(fd_backend_name(FD_BACKEND_CPU), "cpu");
  assert_string_equal(fd_backend_name(FD_BACKEND_CUDA), "cuda");
  assert_string_equal(fd_backend_name(FD_BACKEND_REFERENCE), "reference");
  assert_string_equal(fd_backend_name((fd_backend)42), "unknown");
  assert_int_equal(fd_backend_available(FD_BACKEND_CPU), 1);
  assert_int_equal(fd_backend_available(FD_BACKEND_REFERENCE), 1);
  assert_int_equal(fd_backend_available(FD_BACKEND_AUTO), 1);
  assert_int_equal(fd_backend_available((fd_backend)42), 0);
  assert_int_equal(fd_dtype_size(FD_DTYPE_F32), 4);
  assert_int_equal(fd_dtype_size(FD_DTYPE_F16), 2);
  assert_int_equal(fd_dtype_size(FD_DTYPE_BF16), 2);
  assert_int_equal(fd_dtype_size((fd_dtype)0), 0);
  assert_int_equal(fd_dtype_size(FD_DTYPE_E4M3), 1);
  assert_int_equal(fd_dtype_size(FD_DTYPE_E5M2), 1);
  assert_int_equal(fd_dtype_size((fd_dtype)6), 0);
}

static void test_version(void **state) {
  (void)state;
  assert_string_equal(fd_version(), FD_VERSION_STRING);
  assert_int_equal(fd_version_number(), FD_VERSION_NUMBER);
  assert_int_equal(FD_VERSION_NUMBER, FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH);
  char s[32];
  snprintf(s, sizeof s, "%d.%d.%d", FD_VERSION_MAJOR, FD_VERSION_MINOR, FD_VERSION_PATCH);
  assert_string_equal(s, FD_VERSION_STRING);
}

/* Bindings check their struct mirrors against these. */
static void test_struct_sizes(void **state) {
  (void)state;
  assert_int_equal(fd_struct_size("fd_problem"), sizeof(fd_problem));
  assert_int_equal(fd_struct_size("fd_plan"), sizeof(fd_plan));
  assert_int_equal(fd_struct_size("fd_tensors"), sizeof(fd_tensors));
  assert_int_equal(fd_struct_size("fd_error"), sizeof(fd_error));
  assert_int_equal(fd_struct_size("fd_status"), 0);
  assert_int_equal(fd_struct_size(""), 0);
  assert_int_equal(fd_struct_size(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_null),          cmocka_unit_test(test_plan_bad_fields),
      cmocka_unit_test(test_plan_defaults),      cmocka_unit_test(test_plan_variants_accepted),
      cmocka_unit_test(test_plan_cuda),          cmocka_unit_test(test_run_nan_sink),
      cmocka_unit_test(test_run_sinks_misaligned), cmocka_unit_test(test_run_pointers_misaligned),
      cmocka_unit_test(test_plan_deterministic_limit),
      cmocka_unit_test(test_run_null),           cmocka_unit_test(test_run_negative_strides),
      cmocka_unit_test(test_run_workspace),      cmocka_unit_test(test_run_host_checks),
      cmocka_unit_test(test_run_cuda_alignment), cmocka_unit_test(test_decode),
      cmocka_unit_test(test_decode_variants),
      cmocka_unit_test(test_status_names),       cmocka_unit_test(test_backend_and_dtype_names),
      cmocka_unit_test(test_version),            cmocka_unit_test(test_struct_sizes),
  };
  return cmocka_run_group_tests_name("args", tests, NULL, NULL);
}
