/*
 * test_mla.c — multi-head latent attention (rope_dim > 0) on the CPU and
 * reference backends: the case grid of mla_cases.c against the float64
 * oracle (mla_fixture.c), and unit tests: the oracle against standard
 * attention over [c_kv | k_pe] keys, batch invariance of the deterministic
 * mode, plan and fd_run argument checks (the argument named, nothing
 * written), fd_append_kv round trips (16-bit and fp8, TENSOR and TOKEN
 * scales, rope part 16-bit or fp8) and fd_merge_states at head_dim 512.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtype.h"
#include "fp8.h"
#include "harness.h"
#include "internal.h"
#include "mla_fixture.h"

#define MAX_CASES 64

static uint64_t g_seed;

static fd_problem mla_problem(void) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 2;
  p.q_len = 1;
  p.num_heads_q = 16;
  p.num_heads_kv = 1;
  p.head_dim = 512;
  p.rope_dim = 64;
  p.softmax_scale = 0.0721f;
  p.kv_capacity = 256;
  return p;
}

/* fd_plan_init fails with `status` and a message that names `arg`. */
static void plan_refused(const fd_problem *p, fd_status status, const char *arg) {
  fd_plan plan;
  fd_error err;
  memset(&err, 0, sizeof err);
  const fd_status st = fd_plan_init(&plan, p, &err);
  if (st != status || !strstr(err.message, arg))
    fprintf(stderr, "expected %s naming '%s', got %s: %s\n", fd_status_name(status), arg,
            fd_status_name(st), err.message);
  assert_int_equal(st, status);
  assert_non_null(strstr(err.message, arg));
  assert_int_equal(plan.magic, 0);
}

static void test_plan_checks(void **state) {
  (void)state;
  fd_problem p = mla_problem();
  fd_plan plan;
  fd_error err;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  assert_int_equal(plan.kernel, FD_KERNEL_CPU);
  assert_int_equal(plan.problem.rope_dtype, FD_DTYPE_BF16); /* 0 resolves to kv_dtype */
  assert_true(plan.workspace_size > 0);                      /* the threads' scratch */
  p.backend = FD_BACKEND_REFERENCE;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  p = mla_problem();
  p.rope_dim = -1;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dim");
  p.rope_dim = 65;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dim");
  p = mla_problem();
  p.rope_dim = 0;
  p.rope_dtype = FD_DTYPE_BF16;
  p.head_dim = 128;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dtype");
  p = mla_problem();
  p.rope_dim = 0; /* standard attention keeps 1..256 */
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "head_dim");
  p = mla_problem();
  p.head_dim = 513;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "head_dim");
  p.head_dim = 0;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "head_dim");
  p = mla_problem();
  p.num_heads_kv = 2;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "num_heads_kv");
  p = mla_problem();
  p.softmax_scale = 0.0f;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "softmax_scale");
  p = mla_problem();
  p.has_window = 1;
  p.window_left = 10;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "window_left");
  p.window_left = -1; /* has_window with -1: no window, accepted */
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  p = mla_problem();
  p.logits_soft_cap = 30.0f;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "logits_soft_cap");
  p = mla_problem();
  p.non_causal = 1;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "non_causal");
  p = mla_problem();
  p.rope_dtype = FD_DTYPE_E4M3; /* the latent is bf16 */
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dtype");
  p.rope_dtype = FD_DTYPE_F32;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dtype");
  /* fp8 latent: rope 0, dtype or kv_dtype; every kv_scale */
  p = mla_problem();
  p.kv_dtype = FD_DTYPE_E4M3;
  const fd_dtype ropes[3] = {0, FD_DTYPE_BF16, FD_DTYPE_E4M3};
  for (int r = 0; r < 3; r++)
    for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
      p.rope_dtype = ropes[r];
      p.kv_scale = (fd_kv_scale)s;
      assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
      assert_int_equal(plan.problem.rope_dtype, r == 1 ? FD_DTYPE_BF16 : FD_DTYPE_E4M3);
    }
  p.rope_dtype = FD_DTYPE_E5M2;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dtype");
  p.rope_dtype = FD_DTYPE_F16;
  plan_refused(&p, FD_STATUS_INVALID_ARGUMENT, "rope_dtype");
}

/* CUDA plans from made-up device facts (no GPU needed): the MLA kernel for
 * its shapes, UNSUPPORTED otherwise. */
static void test_plan_cuda(void **state) {
  (void)state;
  fd_cuda_fit fit;
  memset(&fit, 0, sizeof fit);
  fit.g.sm_count = 132;
  fit.split_blocks = 1;
  fd_problem p = mla_problem();
  p.backend = FD_BACKEND_CUDA;
  p.kv_capacity = 32768;
  fd_plan plan;
  fd_error err;
  const int dims[2] = {512, 448};
  for (int i = 0; i < 2; i++) {
    p.head_dim = dims[i];
    assert_int_equal(fd_plan_init_fit(&plan, &p, &fit, &err), FD_STATUS_OK);
    assert_int_equal(plan.kernel, FD_KERNEL_CUDA_MLA);
    assert_true(plan.num_splits >= 1);
  }
  p.head_dim = 256;
  memset(&err, 0, sizeof err);
  assert_int_equal(fd_plan_init_fit(&plan, &p, &fit, &err), FD_STATUS_UNSUPPORTED);
  assert_non_null(strstr(err.message, "head_dim"));
  p.head_dim = 512;
  p.rope_dim = 32;
  assert_int_equal(fd_plan_init_fit(&plan, &p, &fit, &err), FD_STATUS_UNSUPPORTED);
  p.rope_dim = 64;
  p.dtype = FD_DTYPE_F32;
  assert_int_equal(fd_plan_init_fit(&plan, &p, &fit, &err), FD_STATUS_UNSUPPORTED);
  assert_non_null(strstr(err.message, "dtype"));
#if !FD_CUDA_APPEND_MLA
  /* fd_append_kv refuses CUDA MLA plans until the CUDA kernel writes them
   * (the arguments are checked first; nothing reaches the device) */
  p.dtype = FD_DTYPE_BF16;
  assert_int_equal(fd_plan_init_fit(&plan, &p, &fit, &err), FD_STATUS_OK);
  static uint16_t k_new[2][512], pe_new[2][64], ckv[2][32768][512 / 64], kpe[64];
  const int32_t kv_len[2] = {0, 0};
  fd_append_tensors at;
  memset(&at, 0, sizeof at);
  at.k_new = k_new, at.k_pe_new = pe_new, at.k_cache = ckv, at.k_pe_cache = kpe, at.kv_len = kv_len;
  memset(&err, 0, sizeof err);
  assert_int_equal(fd_append_kv(&plan, &at, 1, NULL, &err), FD_STATUS_UNSUPPORTED);
  assert_non_null(strstr(err.message, "rope_dim"));
#endif
}

/* The oracle's MLA equals its standard attention over keys [c_kv | k_pe]
 * (head_dim D + R) with values [c_kv | anything], in the first D columns
 * and lse: the same products summed in the same order, so bit for bit. */
static void test_reference_vs_standard(void **state) {
  (void)state;
  enum { D = 40, R = 8, W = D + R, H = 4, T = 3, B = 3, CAP = 40 };
  const int32_t kv_len[B] = {37, 0, 5};
  fd_rng rng = {fd_mix64(g_seed ^ 0x1234)};
  static uint16_t q[B][T][H][W], kv[B][CAP][W], vv[B][CAP][W];
  static uint16_t qn[B][T][H][D], qp[B][T][H][R], ckv[B][CAP][D], kpe[B][CAP][R];
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < W; i++) {
          q[b][t][h][i] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
          if (i < D) qn[b][t][h][i] = q[b][t][h][i];
          else qp[b][t][h][i - D] = q[b][t][h][i];
        }
    for (int j = 0; j < CAP; j++)
      for (int i = 0; i < W; i++) {
        kv[b][j][i] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
        vv[b][j][i] = i < D ? kv[b][j][i] : fd_f32_to_bf16((float)fd_rng_normal(&rng));
        if (i < D) ckv[b][j][i] = kv[b][j][i];
        else kpe[b][j][i - D] = kv[b][j][i];
      }
  }
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_REFERENCE;
  p.dtype = FD_DTYPE_BF16;
  p.batch = B;
  p.q_len = T;
  p.num_heads_q = H;
  p.num_heads_kv = 1;
  p.head_dim = W;
  p.softmax_scale = 0.3f;
  p.kv_capacity = CAP;
  fd_plan std_plan, mla_plan;
  fd_error err;
  assert_int_equal(fd_plan_init(&std_plan, &p, &err), FD_STATUS_OK);
  p.head_dim = D;
  p.rope_dim = R;
  assert_int_equal(fd_plan_init(&mla_plan, &p, &err), FD_STATUS_OK);
  fd_tensors ts, tm;
  memset(&ts, 0, sizeof ts);
  memset(&tm, 0, sizeof tm);
  const int64_t sq[3] = {T * H * W, H * W, W}, sk[3] = {CAP * W, W, W};
  ts.q = q, ts.k_cache = kv, ts.v_cache = vv, ts.kv_len = kv_len;
  memcpy(ts.q_strides, sq, sizeof sq);
  memcpy(ts.k_strides, sk, sizeof sk);
  memcpy(ts.v_strides, sk, sizeof sk);
  const int64_t sqn[3] = {T * H * D, H * D, D}, sqp[3] = {T * H * R, H * R, R};
  const int64_t skn[3] = {CAP * D, D, D}, skp[3] = {CAP * R, R, R};
  tm.q = qn, tm.q_pe = qp, tm.k_cache = ckv, tm.k_pe_cache = kpe, tm.kv_len = kv_len;
  memcpy(tm.q_strides, sqn, sizeof sqn);
  memcpy(tm.q_pe_strides, sqp, sizeof sqp);
  memcpy(tm.k_strides, skn, sizeof skn);
  memcpy(tm.k_pe_strides, skp, sizeof skp);
  static double out_s[B * T * H * W], out_m[B * T * H * D], lse_s[B * H * T], lse_m[B * H * T];
  assert_int_equal(fd_reference_f64(&std_plan, &ts, out_s, lse_s, &err), FD_STATUS_OK);
  assert_int_equal(fd_reference_f64(&mla_plan, &tm, out_m, lse_m, &err), FD_STATUS_OK);
  int nonzero = 0;
  for (int r = 0; r < B * T * H; r++) {
    for (int i = 0; i < D; i++) {
      assert_true(memcmp(&out_s[(size_t)r * W + i], &out_m[(size_t)r * D + i], sizeof(double)) == 0);
      nonzero += out_m[(size_t)r * D + i] != 0.0;
    }
  }
  for (int r = 0; r < B * H * T; r++) assert_true(memcmp(&lse_s[r], &lse_m[r], sizeof(double)) == 0);
  assert_true(nonzero > 0);
  /* and the rope part matters: without it the scores differ */
  memset(qp, 0, sizeof qp);
  assert_int_equal(fd_reference_f64(&mla_plan, &tm, out_m, lse_m, &err), FD_STATUS_OK);
  assert_true(memcmp(&lse_s[0], &lse_m[0], sizeof(double)) != 0);
}

/* Deterministic mode: a sequence's out and lse bits do not depend on the
 * batch around it, the other lengths, the capacity or the threads. */
static void test_batch_invariance(void **state) {
  (void)state;
  fd_mla_case a = {.backend = FD_BACKEND_CPU, .dtype = FD_DTYPE_BF16, .head_dim = 512, .rope_dim = 64,
                   .num_heads_q = 16, .q_len = 2, .batch = 3, .kv_len = {300, 4500, 17},
                   .seq_id = {7, 8, 9}, .page_size = 16, .deterministic = 1, .with_lse = 1,
                   .num_threads = 2};
  fd_mla_case b = a;
  b.batch = 1;
  b.kv_len[0] = 4500;
  b.seq_id[0] = 8;
  b.page_size = 64;
  b.combined = 1;
  b.num_threads = 1;
  b.kv_capacity_pad = 3000;
  fd_mla_data *da = fd_mla_data_new(&a, g_seed, &fd_mla_host_mem);
  fd_mla_data *db = fd_mla_data_new(&b, g_seed, &fd_mla_host_mem);
  assert_non_null(da);
  assert_non_null(db);
  fd_plan pa, pb;
  fd_error err;
  fd_problem qa = fd_mla_data_problem(da, 0), qb = fd_mla_data_problem(db, 0);
  assert_int_equal(fd_plan_init(&pa, &qa, &err), FD_STATUS_OK);
  assert_int_equal(fd_plan_init(&pb, &qb, &err), FD_STATUS_OK);
  unsigned char *oa = NULL, *la = NULL, *ob = NULL, *lb = NULL;
  assert_int_equal(fd_mla_data_run(da, &pa, "batch 3", &oa, &la), 0);
  assert_int_equal(fd_mla_data_run(db, &pb, "batch 1", &ob, &lb), 0);
  const size_t so = fd_mla_data_seq_out_bytes(da), sl = fd_mla_data_seq_lse_bytes(da);
  assert_memory_equal(oa + so, ob, so);
  assert_memory_equal(la + sl, lb, sl);
  free(oa), free(la), free(ob), free(lb);
  fd_mla_data_free(da);
  fd_mla_data_free(db);
}

/* ---- fd_run argument checks ---------------------------------------------------- */

typedef struct run_fixture {
  fd_plan plan;
  uint16_t q[2][16][512], qp[2][16][64], ckv[2][256][512], kpe[2][256][64];
  uint16_t out[2][16][512];
  float lse[2][16];
  int32_t kv_len[2];
  unsigned char *ws;
} run_fixture;

static run_fixture *run_fixture_new(void) {
  run_fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  fd_problem p = mla_problem();
  fd_error err;
  assert_int_equal(fd_plan_init(&f->plan, &p, &err), FD_STATUS_OK);
  f->ws = malloc(f->plan.workspace_size);
  assert_non_null(f->ws);
  f->kv_len[0] = 100, f->kv_len[1] = 3;
  fd_rng rng = {fd_mix64(g_seed ^ 99)};
  for (size_t i = 0; i < sizeof f->ckv / 2; i++) (&f->ckv[0][0][0])[i] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
  for (size_t i = 0; i < sizeof f->kpe / 2; i++) (&f->kpe[0][0][0])[i] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
  for (size_t i = 0; i < sizeof f->q / 2; i++) (&f->q[0][0][0])[i] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
  for (size_t i = 0; i < sizeof f->qp / 2; i++) (&f->qp[0][0][0])[i] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
  return f;
}

static fd_tensors run_tensors(run_fixture *f) {
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = f->q, t.q_pe = f->qp, t.k_cache = f->ckv, t.k_pe_cache = f->kpe, t.kv_len = f->kv_len;
  t.out = f->out, t.lse = &f->lse[0][0];
  return t;
}

/* fd_run refuses t with INVALID_ARGUMENT naming `arg`, out / lse / the
 * workspace untouched. */
static void run_refused(run_fixture *f, const fd_tensors *t, const char *arg) {
  memset(f->out, 0xee, sizeof f->out);
  memset(f->lse, 0xee, sizeof f->lse);
  memset(f->ws, 0xee, f->plan.workspace_size);
  fd_error err;
  memset(&err, 0, sizeof err);
  const fd_status st = fd_run(&f->plan, t, f->ws, f->plan.workspace_size, NULL, &err);
  if (st != FD_STATUS_INVALID_ARGUMENT || !strstr(err.message, arg))
    fprintf(stderr, "expected INVALID_ARGUMENT naming '%s', got %s: %s\n", arg, fd_status_name(st),
            err.message);
  assert_int_equal(st, FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, arg));
  for (size_t i = 0; i < sizeof f->out; i++) assert_int_equal(((unsigned char *)f->out)[i], 0xee);
  for (size_t i = 0; i < sizeof f->lse; i++) assert_int_equal(((unsigned char *)f->lse)[i], 0xee);
  for (size_t i = 0; i < f->plan.workspace_size; i++) assert_int_equal(f->ws[i], 0xee);
}

static void test_run_checks(void **state) {
  (void)state;
  run_fixture *f = run_fixture_new();
  fd_error err;
  fd_tensors t = run_tensors(f);
  assert_int_equal(fd_run(&f->plan, &t, f->ws, f->plan.workspace_size, NULL, &err), FD_STATUS_OK);
  assert_true(isfinite(f->lse[0][0]));

  t = run_tensors(f), t.q_pe = NULL;
  run_refused(f, &t, "q_pe");
  t = run_tensors(f), t.k_pe_cache = NULL;
  run_refused(f, &t, "k_pe_cache");
  t = run_tensors(f), t.v_cache = f->ckv;
  run_refused(f, &t, "v_cache");
  t = run_tensors(f);
  static const float sinks[16];
  t.sinks = sinks;
  run_refused(f, &t, "sinks");
  t = run_tensors(f), t.q_pe = (const char *)f->qp + 1;
  run_refused(f, &t, "q_pe");
  t = run_tensors(f), t.k_pe_cache = (const char *)f->kpe + 1;
  run_refused(f, &t, "k_pe_cache");
  /* strides: a zero stride beside nonzero ones, a negative one */
  t = run_tensors(f), t.q_pe_strides[0] = 16 * 64, t.q_pe_strides[1] = 16 * 64, t.q_pe_strides[2] = 0;
  run_refused(f, &t, "q_pe_strides");
  t = run_tensors(f), t.k_pe_strides[0] = 256 * 64, t.k_pe_strides[1] = -64, t.k_pe_strides[2] = 64;
  run_refused(f, &t, "k_pe_strides");
  /* broadcast q_pe across heads is an input's right */
  t = run_tensors(f), t.q_pe_strides[0] = 16 * 64, t.q_pe_strides[1] = 16 * 64,
  t.q_pe_strides[2] = FD_STRIDE_BROADCAST;
  assert_int_equal(fd_run(&f->plan, &t, f->ws, f->plan.workspace_size, NULL, &err), FD_STATUS_OK);
  /* out / lse overlapping the rope parts */
  t = run_tensors(f), t.out = f->kpe;
  run_refused(f, &t, "k_pe_cache");
  t = run_tensors(f), t.lse = (float *)f->qp;
  run_refused(f, &t, "q_pe");
  /* host checks of kv_len unchanged */
  t = run_tensors(f);
  f->kv_len[1] = 257;
  run_refused(f, &t, "kv_len");
  f->kv_len[1] = 3;
  /* the workspace is required (the threads' scratch) */
  assert_int_equal(fd_run(&f->plan, &t, NULL, 0, NULL, &err), FD_STATUS_WORKSPACE_TOO_SMALL);

  /* a standard plan refuses the rope parts */
  fd_problem p = mla_problem();
  p.rope_dim = 0;
  p.head_dim = 256;
  p.num_heads_kv = 1;
  fd_plan std;
  assert_int_equal(fd_plan_init(&std, &p, &err), FD_STATUS_OK);
  t = run_tensors(f);
  t.v_cache = f->ckv;
  memset(&err, 0, sizeof err);
  assert_int_equal(fd_run(&std, &t, f->ws, std.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "q_pe"));
  t.q_pe = NULL;
  assert_int_equal(fd_run(&std, &t, f->ws, std.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "k_pe_cache"));

  /* fp8: v_scale refused, k_scale required */
  p = mla_problem();
  p.kv_dtype = FD_DTYPE_E4M3;
  p.kv_scale = FD_KV_SCALE_TENSOR;
  fd_plan fp8;
  assert_int_equal(fd_plan_init(&fp8, &p, &err), FD_STATUS_OK);
  const float one = 0.5f;
  unsigned char *ws8 = malloc(fp8.workspace_size);
  assert_non_null(ws8);
  t = run_tensors(f);
  t.k_scale = &one;
  t.v_scale = &one;
  assert_int_equal(fd_run(&fp8, &t, ws8, fp8.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "v_scale"));
  t.v_scale = NULL;
  t.k_scale = NULL;
  assert_int_equal(fd_run(&fp8, &t, ws8, fp8.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "k_scale"));
  t.k_scale = &one;
  assert_int_equal(fd_run(&fp8, &t, ws8, fp8.workspace_size, NULL, &err), FD_STATUS_OK);
  const float bad = -1.0f;
  t.k_scale = &bad;
  assert_int_equal(fd_run(&fp8, &t, ws8, fp8.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "k_scale"));
  free(ws8);
  free(f->ws);
  free(f);
}

/* ---- fd_append_kv --------------------------------------------------------------- */

/* Appends 3 tokens to 2 sequences of an MLA cache (kv_dtype, rope_dtype,
 * kv_scale; paged or not) and checks every written element, the scales, and
 * that nothing else changed. */
static void append_round_trip(fd_dtype kv_dtype, fd_dtype rope_dtype, fd_kv_scale kv_scale,
                              int32_t page_size) {
  enum { B = 2, N = 3, D = 40, R = 8, CAP = 32 };
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.kv_dtype = kv_dtype;
  p.rope_dtype = rope_dtype;
  p.kv_scale = kv_scale;
  p.batch = B;
  p.num_heads_q = 4;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.rope_dim = R;
  p.softmax_scale = 0.1f;
  p.kv_capacity = CAP;
  p.page_size = page_size;
  const int32_t pages_per_seq = page_size ? CAP / page_size : 0;
  p.max_pages_per_seq = pages_per_seq;
  p.num_pages = page_size ? B * pages_per_seq : 0;
  fd_plan plan;
  fd_error err;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  const fd_dtype kv = plan.problem.kv_dtype, rope = plan.problem.rope_dtype;
  const size_t ekv = fd_dtype_size(kv), erope = fd_dtype_size(rope);
  /* the pool: [B * CAP] rows either way (paged: pages shuffled by the table) */
  unsigned char *ckv = malloc((size_t)B * CAP * D * ekv), *kpe = malloc((size_t)B * CAP * R * erope);
  float *scales = malloc((size_t)B * CAP * sizeof(float));
  assert_non_null(ckv), assert_non_null(kpe), assert_non_null(scales);
  memset(ckv, 0x11, (size_t)B * CAP * D * ekv);
  memset(kpe, 0x22, (size_t)B * CAP * R * erope);
  for (int i = 0; i < B * CAP; i++) scales[i] = -7.0f;
  int32_t table[B * 8];
  for (int i = 0; i < B * pages_per_seq; i++) table[i] = (B * pages_per_seq - 1 - i); /* reversed */
  const int32_t kv_len[B] = {5, 28};
  uint16_t k_new[B][N][D], pe_new[B][N][R];
  fd_rng rng = {fd_mix64(g_seed ^ 0xabc)};
  for (int b = 0; b < B; b++)
    for (int i = 0; i < N; i++) {
      for (int d = 0; d < D; d++) k_new[b][i][d] = fd_f32_to_bf16((float)(fd_rng_normal(&rng) * 3.0));
      for (int d = 0; d < R; d++) pe_new[b][i][d] = fd_f32_to_bf16((float)(fd_rng_normal(&rng) * (d == 0 ? 40.0 : 1.0)));
    }
  float tensor_scale = 0.03f;
  fd_append_tensors t;
  memset(&t, 0, sizeof t);
  t.k_new = k_new, t.k_pe_new = pe_new, t.k_cache = ckv, t.k_pe_cache = kpe, t.kv_len = kv_len;
  t.block_table = page_size ? table : NULL;
  t.k_scale = kv_scale == FD_KV_SCALE_TOKEN ? scales : kv_scale ? &tensor_scale : NULL;
  /* bad arguments first: nothing written */
  fd_append_tensors bad = t;
  bad.v_new = k_new;
  assert_int_equal(fd_append_kv(&plan, &bad, N, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "v_new"));
  bad = t, bad.v_cache = ckv;
  assert_int_equal(fd_append_kv(&plan, &bad, N, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "v_cache"));
  bad = t, bad.k_pe_new = NULL;
  assert_int_equal(fd_append_kv(&plan, &bad, N, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "k_pe_new"));
  bad = t, bad.k_pe_cache = NULL;
  assert_int_equal(fd_append_kv(&plan, &bad, N, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "k_pe_cache"));
  if (kv_scale) {
    bad = t, bad.v_scale = scales;
    assert_int_equal(fd_append_kv(&plan, &bad, N, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "v_scale"));
  }
  const int32_t too_long[B] = {5, 30};
  bad = t, bad.kv_len = too_long;
  assert_int_equal(fd_append_kv(&plan, &bad, N, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "kv_len"));
  for (size_t i = 0; i < (size_t)B * CAP * D * ekv; i++) assert_int_equal(ckv[i], 0x11);
  for (size_t i = 0; i < (size_t)B * CAP * R * erope; i++) assert_int_equal(kpe[i], 0x22);

  assert_int_equal(fd_append_kv(&plan, &t, N, NULL, &err), FD_STATUS_OK);
  unsigned char *seen = calloc((size_t)B * CAP, 1);
  assert_non_null(seen);
  const int fp8 = fd_dtype_is_fp8(kv), rope_fp8 = fd_dtype_is_fp8(rope);
  const int e5m2 = kv == FD_DTYPE_E5M2;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < N; i++) {
      const int32_t j = kv_len[b] + i;
      const int32_t row = page_size ? table[b * pages_per_seq + j / page_size] * page_size + j % page_size
                                    : b * CAP + j;
      seen[row] = 1;
      float s = 1.0f;
      if (kv_scale == FD_KV_SCALE_TOKEN) {
        float amax = 0.0f;
        for (int d = 0; d < D; d++) amax = fmaxf(amax, fabsf(fd_bf16_to_f32(k_new[b][i][d])));
        for (int d = 0; rope_fp8 && d < R; d++) amax = fmaxf(amax, fabsf(fd_bf16_to_f32(pe_new[b][i][d])));
        s = amax / (e5m2 ? FD_E5M2_MAX : FD_E4M3_MAX);
        assert_float_equal(scales[row], s, 0.0f);
      } else if (kv_scale) {
        s = tensor_scale;
      }
      for (int d = 0; d < D; d++) {
        const float x = fd_bf16_to_f32(k_new[b][i][d]);
        if (fp8)
          assert_int_equal(ckv[(size_t)row * D + d], fd_fp8_quantize(x, s, e5m2));
        else
          assert_int_equal(((uint16_t *)ckv)[(size_t)row * D + d], k_new[b][i][d]);
      }
      for (int d = 0; d < R; d++) {
        const float x = fd_bf16_to_f32(pe_new[b][i][d]);
        if (rope_fp8)
          assert_int_equal(kpe[(size_t)row * R + d], fd_fp8_quantize(x, s, e5m2));
        else
          assert_int_equal(((uint16_t *)kpe)[(size_t)row * R + d], pe_new[b][i][d]);
      }
    }
  for (int row = 0; row < B * CAP; row++) {
    if (seen[row]) continue;
    for (size_t i = 0; i < D * ekv; i++) assert_int_equal(ckv[(size_t)row * D * ekv + i], 0x11);
    for (size_t i = 0; i < R * erope; i++) assert_int_equal(kpe[(size_t)row * R * erope + i], 0x22);
    assert_float_equal(scales[row], -7.0f, 0.0f);
  }
  free(seen), free(ckv), free(kpe), free(scales);
}

static void test_append(void **state) {
  (void)state;
  append_round_trip(0, 0, FD_KV_SCALE_NONE, 0);
  append_round_trip(0, 0, FD_KV_SCALE_NONE, 16);
  append_round_trip(FD_DTYPE_E4M3, 0, FD_KV_SCALE_TOKEN, 16);
  append_round_trip(FD_DTYPE_E4M3, FD_DTYPE_BF16, FD_KV_SCALE_TOKEN, 0);
  append_round_trip(FD_DTYPE_E4M3, 0, FD_KV_SCALE_TENSOR, 8);
  append_round_trip(FD_DTYPE_E5M2, FD_DTYPE_BF16, FD_KV_SCALE_TENSOR, 0);
}

/* Appended tokens read back by fd_run as the oracle reads them: fp8 TOKEN
 * with an fp8 rope part, paged. */
static void test_append_then_run(void **state) {
  (void)state;
  enum { D = 512, R = 64, H = 16, CAP = 64, N = 20 };
  fd_problem p = mla_problem();
  p.batch = 1;
  p.kv_dtype = FD_DTYPE_E4M3;
  p.kv_scale = FD_KV_SCALE_TOKEN;
  p.kv_capacity = CAP;
  p.page_size = 16;
  p.max_pages_per_seq = 4;
  p.num_pages = 4;
  fd_plan plan, ref;
  fd_error err;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  p.backend = FD_BACKEND_REFERENCE;
  assert_int_equal(fd_plan_init(&ref, &p, &err), FD_STATUS_OK);
  static uint8_t ckv[CAP][D], kpe[CAP][R];
  static float scales[CAP];
  static uint16_t k_new[N][D], pe_new[N][R], q[H][D], qp[H][R], out[H][D];
  memset(ckv, 0x7f, sizeof ckv); /* NaN until written */
  memset(kpe, 0x7f, sizeof kpe);
  for (int i = 0; i < CAP; i++) scales[i] = NAN;
  const int32_t table[4] = {2, 0, 3, 1}, zero[1] = {0}, len[1] = {N};
  fd_rng rng = {fd_mix64(g_seed ^ 0xfeed)};
  for (int i = 0; i < N; i++) {
    for (int d = 0; d < D; d++) k_new[i][d] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
    for (int d = 0; d < R; d++) pe_new[i][d] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
  }
  for (int h = 0; h < H; h++) {
    for (int d = 0; d < D; d++) q[h][d] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
    for (int d = 0; d < R; d++) qp[h][d] = fd_f32_to_bf16((float)fd_rng_normal(&rng));
  }
  fd_append_tensors at;
  memset(&at, 0, sizeof at);
  at.k_new = k_new, at.k_pe_new = pe_new, at.k_cache = ckv, at.k_pe_cache = kpe;
  at.kv_len = zero, at.block_table = table, at.k_scale = scales;
  assert_int_equal(fd_append_kv(&plan, &at, N, NULL, &err), FD_STATUS_OK);
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q, t.q_pe = qp, t.k_cache = ckv, t.k_pe_cache = kpe, t.kv_len = len, t.block_table = table;
  t.k_scale = scales;
  t.out = out;
  float lse[H];
  t.lse = lse;
  unsigned char *ws = malloc(plan.workspace_size);
  assert_non_null(ws);
  assert_int_equal(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_OK);
  free(ws);
  /* the oracle on the same (resolved) tensors */
  fd_tensors r = t;
  const int64_t sq[3] = {H * D, H * D, D}, sp[3] = {H * R, H * R, R};
  const int64_t sk[3] = {16 * D, D, D}, skp[3] = {16 * R, R, R}, ss[3] = {16, 1, 1};
  memcpy(r.q_strides, sq, sizeof sq), memcpy(r.q_pe_strides, sp, sizeof sp);
  memcpy(r.k_strides, sk, sizeof sk), memcpy(r.k_pe_strides, skp, sizeof skp);
  memcpy(r.scale_strides, ss, sizeof ss);
  r.block_table_stride = 4;
  static double o64[H * D], l64[H];
  assert_int_equal(fd_reference_f64(&ref, &r, o64, l64, &err), FD_STATUS_OK);
  for (int h = 0; h < H; h++) {
    double amax = 0.0, e = 0.0;
    for (int d = 0; d < D; d++) {
      amax = fmax(amax, fabs(o64[h * D + d]));
      e = fmax(e, fabs((double)fd_bf16_to_f32(out[h][d]) - o64[h * D + d]));
    }
    assert_true(amax > 0.0);
    assert_true(e <= fd_tol_out_floor(FD_DTYPE_BF16) * amax);
    assert_true(fabs((double)lse[h] - l64[h]) <= fd_tol_lse(FD_DTYPE_BF16) * fmax(1.0, fabs(l64[h])));
  }
}

/* ---- fd_merge_states at head_dim 512 ------------------------------------------- */

static void test_merge_512(void **state) {
  (void)state;
  enum { S = 3, ROWS = 2 * 16, D = 512 };
  fd_merge_problem mp;
  memset(&mp, 0, sizeof mp);
  mp.backend = FD_BACKEND_CPU;
  mp.dtype = FD_DTYPE_F32;
  mp.num_states = S;
  mp.batch = 2;
  mp.q_len = 1;
  mp.num_heads = 16;
  mp.head_dim = D;
  static float so[S][ROWS][D], out[ROWS][D];
  float sl[S][ROWS], lse[ROWS];
  fd_rng rng = {fd_mix64(g_seed ^ 0x3e5)};
  for (int s = 0; s < S; s++)
    for (int r = 0; r < ROWS; r++) {
      sl[s][r] = s == 1 && r == 3 ? -INFINITY : (float)(fd_rng_normal(&rng) * 3.0);
      for (int d = 0; d < D; d++) so[s][r][d] = (float)fd_rng_normal(&rng);
    }
  fd_error err;
  assert_int_equal(fd_merge_states(&mp, so, &sl[0][0], out, lse, NULL, &err), FD_STATUS_OK);
  for (int r = 0; r < ROWS; r++) {
    double m = -INFINITY, L = 0.0;
    for (int s = 0; s < S; s++) m = fmax(m, sl[s][r]);
    for (int s = 0; s < S; s++) L += exp(sl[s][r] - m);
    assert_true(fabs(lse[r] - (m + log(L))) <= 1e-5 * fmax(1.0, fabs(m + log(L))));
    for (int d = 0; d < D; d++) {
      double o = 0.0;
      for (int s = 0; s < S; s++) o += exp(sl[s][r] - m) * so[s][r][d];
      assert_true(fabs(out[r][d] - o / L) <= 1e-5 * 4.0);
    }
  }
  mp.head_dim = 513;
  memset(&err, 0, sizeof err);
  assert_int_equal(fd_merge_states(&mp, so, &sl[0][0], out, lse, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "head_dim"));
}

int main(void) {
  g_seed = fd_test_seed();
  static fd_mla_case cases[MAX_CASES];
  const int n = fd_mla_grid_cases(FD_BACKEND_CPU, cases, MAX_CASES);
  int failed = fd_mla_run_group("mla_grid", cases, n, &fd_mla_host_mem);
  /* the reference backend runs the same cases (fd_run's reference path) */
  static fd_mla_case ref_cases[4];
  for (int i = 0; i < 4; i++) {
    ref_cases[i] = cases[i];
    ref_cases[i].backend = FD_BACKEND_REFERENCE;
    ref_cases[i].num_splits = 0;
    ref_cases[i].sweep_splits = 0;
    ref_cases[i].deterministic = 0;
  }
  failed |= fd_mla_run_group("mla_reference", ref_cases, 4, &fd_mla_host_mem);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_checks),
      cmocka_unit_test(test_plan_cuda),
      cmocka_unit_test(test_reference_vs_standard),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_run_checks),
      cmocka_unit_test(test_append),
      cmocka_unit_test(test_append_then_run),
      cmocka_unit_test(test_merge_512),
  };
  const char *filter = getenv("FD_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  failed |= cmocka_run_group_tests_name("mla_unit", tests, NULL, NULL) != 0;
  return failed ? 1 : 0;
}
