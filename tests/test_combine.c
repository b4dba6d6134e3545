/*
 * test_combine.c — fd_cpu_combine alone, on hand-built partial states
 * (m, l, O) whose merged out and lse are known: worked values, the row
 * mapping through strided out/lse, neutral (empty) splits, m = -inf among
 * finite ones, huge m differences, and partials past the active splits that
 * hold NaN and must not be read.
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
#include "internal.h"
#include "split.h"

#define MAX_D 16

/* A plan for the combine: CPU backend, chunk-aligned capacity. */
static fd_plan make_plan(fd_dtype dtype, int32_t batch, int32_t q_len, int32_t hq, int32_t hkv,
                         int32_t head_dim, int32_t kv_capacity, int32_t num_splits) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = dtype;
  p.batch = batch;
  p.q_len = q_len;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = head_dim;
  p.kv_capacity = kv_capacity;
  p.num_splits = num_splits;
  p.num_threads = 2;
  fd_plan plan;
  fd_error err;
  fd_status st = fd_plan_init(&plan, &p, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
  assert_int_equal(plan.num_splits, num_splits);
  return plan;
}

/* Relative size of one unit in the last place of the dtype (worst case). */
static double ulp_rel(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 0x1.0p-22;
    case FD_DTYPE_F16: return 0x1.0p-10;
    case FD_DTYPE_BF16: return 0x1.0p-7;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* cache types, never combined */
  }
  return 0.0;
}

/* Expected merge of one row in double: only the first `active` splits. */
static void merge_row(const float *o, const float *ml, int32_t active, int32_t head_dim,
                      double *out, double *lse) {
  double m = -INFINITY;
  for (int32_t s = 0; s < active; s++)
    if (ml[2 * s] > m) m = ml[2 * s];
  for (int32_t i = 0; i < head_dim; i++) out[i] = 0.0;
  if (m == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  double l = 0.0;
  for (int32_t s = 0; s < active; s++) {
    if (ml[2 * s] == -INFINITY) continue;
    double w = exp((double)ml[2 * s] - m);
    l += w * ml[2 * s + 1];
    for (int32_t i = 0; i < head_dim; i++) out[i] += w * o[(int64_t)s * head_dim + i];
  }
  for (int32_t i = 0; i < head_dim; i++) out[i] /= l;
  *lse = m + log(l);
}

/* ---- Worked values ------------------------------------------------------------------- */

/* Four splits: (m=0, l=1, O=(2,4,-6,8)), (m=0, l=1, O=(4,8,6,0)),
 * (m=ln 2, l=0.5, O=(1,1,1,1)), empty (m=-inf, l=0, O=0).
 * m* = ln 2; weights 1/2, 1/2, 1; l* = 1/2 + 1/2 + 1/2 = 3/2;
 * out = ((1,2,-3,4) + (2,4,3,0) + (1,1,1,1)) / (3/2) = (8/3, 14/3, 2/3, 10/3);
 * lse = ln 2 + ln(3/2) = ln 3. */
static void test_worked_values(void **state) {
  (void)state;
  fd_plan plan = make_plan(FD_DTYPE_F32, 1, 1, 1, 1, 4, 256, 4);
  const float ln2 = 0.69314718f;
  float o[4][4] = {{2, 4, -6, 8}, {4, 8, 6, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}};
  float ml[4][2] = {{0, 1}, {0, 1}, {ln2, 0.5f}, {-INFINITY, 0}};
  int32_t kv_len[1] = {256};
  float out[4] = {NAN, NAN, NAN, NAN}, lse = NAN;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.kv_len = kv_len;
  t.out = out;
  t.lse = &lse;
  int64_t os[3] = {4, 4, 4}, ls[3] = {1, 1, 1};
  memcpy(t.out_strides, os, sizeof os);
  memcpy(t.lse_strides, ls, sizeof ls);
  fd_error err;
  assert_int_equal(fd_cpu_combine(&plan, &t, &o[0][0], &ml[0][0], &err), FD_STATUS_OK);
  const double want[4] = {8.0 / 3, 14.0 / 3, 2.0 / 3, 10.0 / 3};
  for (int i = 0; i < 4; i++)
    if (!(fabs(out[i] - want[i]) <= 1e-6 * fabs(want[i])))
      fail_msg("out[%d] = %.9g, want %.9g", i, (double)out[i], want[i]);
  if (!(fabs(lse - log(3.0)) <= 1e-6)) fail_msg("lse = %.9g, want ln 3 = %.9g", (double)lse, log(3.0));
}

/* ---- Many rows, strided outputs, special states ------------------------------------- */

enum { B = 4, T = 2, HQ = 4, HKV = 2, D = 8, SPLITS = 4, CAP = 256 };
#define ROWS (B * HQ * T)
#define ROW(b, h, t) (((b) * HQ + (h)) * T + (t))

typedef struct partials {
  float o[ROWS][SPLITS][D];
  float ml[ROWS][SPLITS][2];
  int32_t kv_len[B];
} partials;

/* Sequence 0: 256 keys (4 active splits), random states, and special rows:
 *   row (0,0,0): split 2 empty (m = -inf, l = 0, O = 0) among finite ones
 *   row (0,1,0): m = {1000, -1000, 999.5, 80}: exp(m - m*) spans 0 .. 1
 *   row (0,1,1): m = {-3000, -3001, -2999.25, -3002}: all far below 0
 *   row (0,2,1): every split empty (m = -inf, l = 0): out 0, lse -inf
 * Sequence 1: 100 keys: 2 active splits; splits 2 and 3 hold NaN.
 * Sequence 2: 0 keys: every partial NaN; out 0, lse -inf.
 * Sequence 3: 1 key with q_len 2: row t = 0 sees no key (partials m = -inf,
 *   l = 0 as a split kernel writes them); row t = 1 one active split. */
static void build(partials *p, unsigned seed) {
  srand(seed);
  const int32_t kv[B] = {256, 100, 0, 1};
  memcpy(p->kv_len, kv, sizeof kv);
  for (int r = 0; r < ROWS; r++)
    for (int s = 0; s < SPLITS; s++) {
      p->ml[r][s][0] = (float)(rand() % 2001 - 1000) / 200.0f; /* [-5, 5] */
      p->ml[r][s][1] = 0.5f + (float)(rand() % 1001) / 400.0f; /* [0.5, 3] */
      for (int i = 0; i < D; i++) p->o[r][s][i] = (float)(rand() % 2001 - 1000) / 250.0f;
    }
  const int r0 = ROW(0, 0, 0), r1 = ROW(0, 1, 0), r2 = ROW(0, 1, 1), r3 = ROW(0, 2, 1);
  p->ml[r0][2][0] = -INFINITY;
  p->ml[r0][2][1] = 0.0f;
  memset(p->o[r0][2], 0, sizeof p->o[r0][2]);
  const float big[SPLITS] = {1000.0f, -1000.0f, 999.5f, 80.0f};
  const float low[SPLITS] = {-3000.0f, -3001.0f, -2999.25f, -3002.0f};
  for (int s = 0; s < SPLITS; s++) {
    p->ml[r1][s][0] = big[s];
    p->ml[r2][s][0] = low[s];
    p->ml[r3][s][0] = -INFINITY;
    p->ml[r3][s][1] = 0.0f;
    memset(p->o[r3][s], 0, sizeof p->o[r3][s]);
  }
  for (int h = 0; h < HQ; h++)
    for (int t = 0; t < T; t++) {
      for (int s = 2; s < SPLITS; s++) { /* sequence 1: past its active splits */
        p->ml[ROW(1, h, t)][s][0] = NAN;
        p->ml[ROW(1, h, t)][s][1] = NAN;
        for (int i = 0; i < D; i++) p->o[ROW(1, h, t)][s][i] = NAN;
      }
      for (int s = 0; s < SPLITS; s++) { /* sequence 2: nothing active */
        p->ml[ROW(2, h, t)][s][0] = NAN;
        p->ml[ROW(2, h, t)][s][1] = NAN;
        for (int i = 0; i < D; i++) p->o[ROW(2, h, t)][s][i] = NAN;
      }
      for (int s = (t == 0 ? 0 : 1); s < SPLITS; s++) { /* sequence 3: 1 key */
        int32_t r = ROW(3, h, t);
        p->ml[r][s][0] = s == 0 ? -INFINITY : NAN;
        p->ml[r][s][1] = s == 0 ? 0.0f : NAN;
        for (int i = 0; i < D; i++) p->o[r][s][i] = s == 0 ? 0.0f : NAN;
      }
    }
}

/* Runs the combine into padded out [b][t][h] and lse [b][t][h] (lse strides
 * {batch, head, token} = {T*HQ + 5, 1, HQ}); checks every element. */
static int run_and_check(fd_dtype dtype, int with_lse, unsigned seed) {
  partials *p = malloc(sizeof *p);
  assert_non_null(p);
  build(p, seed);
  fd_plan plan = make_plan(dtype, B, T, HQ, HKV, D, CAP, SPLITS);
  const int64_t os[3] = {T * (HQ * (D + 8) + 8) + 16, HQ * (D + 8) + 8, D + 8};
  const int64_t ls[3] = {T * HQ + 5, 1, HQ};
  const size_t esize = fd_dtype_size(dtype);
  const int64_t out_elems = B * os[0], lse_elems = B * ls[0];
  unsigned char *out = malloc((size_t)out_elems * esize);
  float *lse = malloc((size_t)lse_elems * sizeof *lse);
  assert_non_null(out);
  assert_non_null(lse);
  memset(out, 0xff, (size_t)out_elems * esize); /* NaN in every dtype */
  memset(lse, 0xff, (size_t)lse_elems * sizeof *lse);

  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.kv_len = p->kv_len;
  t.out = out;
  t.lse = with_lse ? lse : NULL;
  memcpy(t.out_strides, os, sizeof os);
  memcpy(t.lse_strides, ls, sizeof ls);
  fd_error err;
  fd_status st = fd_cpu_combine(&plan, &t, &p->o[0][0][0], &p->ml[0][0][0], &err);
  if (st != FD_STATUS_OK) fail_msg("fd_cpu_combine: %s: %s", fd_status_name(st), err.message);

  int fails = 0;
  unsigned char *touched = calloc((size_t)(out_elems + lse_elems), 1);
  assert_non_null(touched);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++)
      for (int tk = 0; tk < T; tk++) {
        const int r = ROW(b, h, tk);
        const int32_t n = p->kv_len[b] - T + tk + 1; /* visible keys */
        const int32_t active =
            n > 0 ? fd_seq_active_splits(p->kv_len[b], 1, -1, plan.chunk_len, plan.num_splits, 0) : 0;
        double want[D], want_lse;
        merge_row(&p->o[r][0][0], &p->ml[r][0][0], active, D, want, &want_lse);
        double row_max = 0.0;
        for (int i = 0; i < D; i++) row_max = fmax(row_max, fabs(want[i]));
        const int64_t base = b * os[0] + tk * os[1] + h * os[2];
        for (int i = 0; i < D; i++) {
          touched[base + i] = 1;
          const double got = fd_load_elem(out, dtype, base + i);
          const double tol = ulp_rel(dtype) * fabs(want[i]) + 4e-6 * row_max;
          const int ok = want_lse == -INFINITY ? got == 0.0 : fabs(got - want[i]) <= tol;
          if (!ok && fails++ < 10)
            print_error("%s row (b=%d,h=%d,t=%d) out[%d] = %.9g, want %.9g\n", fd_backend_name(plan.backend), b, h,
                        tk, i, got, want[i]);
        }
        const int64_t li = b * ls[0] + h * ls[1] + tk * ls[2];
        touched[out_elems + li] = 1;
        if (with_lse) {
          const double got = lse[li];
          const int ok = want_lse == -INFINITY ? (isinf(got) && got < 0)
                                               : fabs(got - want_lse) <= 1e-6 * fmax(1.0, fabs(want_lse));
          if (!ok && fails++ < 10)
            print_error("row (b=%d,h=%d,t=%d) lse = %.9g, want %.9g\n", b, h, tk, got, want_lse);
        }
      }
  /* Nothing outside the logical elements written. */
  for (int64_t i = 0; i < out_elems; i++) {
    int untouched = esize == 4 ? ((uint32_t *)out)[i] == 0xffffffffu : ((uint16_t *)out)[i] == 0xffffu;
    if (!touched[i] && !untouched && fails++ < 10) print_error("out padding element %lld written\n", (long long)i);
  }
  for (int64_t i = 0; i < lse_elems; i++) {
    int untouched = ((uint32_t *)lse)[i] == 0xffffffffu;
    if ((!touched[out_elems + i] || !with_lse) && !untouched && fails++ < 10)
      print_error("lse element %lld written (padding, or lse NULL)\n", (long long)i);
  }
  free(touched);
  free(out);
  free(lse);
  free(p);
  return fails;
}

static void test_f32(void **state) {
  (void)state;
  assert_int_equal(run_and_check(FD_DTYPE_F32, 1, 1), 0);
  assert_int_equal(run_and_check(FD_DTYPE_F32, 1, 2), 0);
}

static void test_f16(void **state) {
  (void)state;
  assert_int_equal(run_and_check(FD_DTYPE_F16, 1, 3), 0);
}

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(run_and_check(FD_DTYPE_BF16, 1, 4), 0);
}

static void test_no_lse(void **state) {
  (void)state;
  assert_int_equal(run_and_check(FD_DTYPE_F32, 0, 5), 0);
}

/* A single split holding everything: out = O / l, lse = m + log l, exactly. */
static void test_single_active_split(void **state) {
  (void)state;
  fd_plan plan = make_plan(FD_DTYPE_F32, 1, 1, 1, 1, 2, 512, 8);
  float o[8][2], ml[8][2];
  for (int s = 0; s < 8; s++) {
    o[s][0] = o[s][1] = NAN;
    ml[s][0] = ml[s][1] = NAN;
  }
  o[0][0] = 3.0f;
  o[0][1] = -1.5f;
  ml[0][0] = 2.0f;
  ml[0][1] = 1.5f;
  int32_t kv_len[1] = {40}; /* one chunk: one active split of eight */
  assert_int_equal(fd_seq_active_splits(40, 1, -1, plan.chunk_len, plan.num_splits, 0), 1);
  float out[2] = {NAN, NAN}, lse = NAN;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.kv_len = kv_len;
  t.out = out;
  t.lse = &lse;
  int64_t os[3] = {2, 2, 2}, ls[3] = {1, 1, 1};
  memcpy(t.out_strides, os, sizeof os);
  memcpy(t.lse_strides, ls, sizeof ls);
  fd_error err;
  assert_int_equal(fd_cpu_combine(&plan, &t, &o[0][0], &ml[0][0], &err), FD_STATUS_OK);
  if (!(fabs(out[0] - 2.0) <= 1e-6 && fabs(out[1] + 1.0) <= 1e-6))
    fail_msg("out = (%g, %g), want (2, -1)", (double)out[0], (double)out[1]);
  if (!(fabs(lse - (2.0 + log(1.5))) <= 1e-6)) fail_msg("lse = %.9g, want %.9g", (double)lse, 2.0 + log(1.5));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worked_values), cmocka_unit_test(test_single_active_split),
      cmocka_unit_test(test_f32),           cmocka_unit_test(test_f16),
      cmocka_unit_test(test_bf16),          cmocka_unit_test(test_no_lse),
  };
  return cmocka_run_group_tests_name("combine", tests, NULL, NULL);
}
