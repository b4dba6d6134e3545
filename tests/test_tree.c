/*
 * test_tree.c — speculative-decoding tree masks (fd_problem.tree_mask) on
 * the CPU and reference backends.
 *
 *   tree_grid   harness cases (harness.c: seeded random inputs, NaN-poisoned
 *               outputs and cache padding, guard bytes, the float64 oracle
 *               and its tolerances): random EAGLE-shaped trees (each node's
 *               parent an earlier node), the same trees with their nodes
 *               shuffled (masks not lower-triangular), Medusa-like wide
 *               trees, chains, rows that see only themselves; q_len 1, 5,
 *               16, 37 and 64; ragged batches with kv_len == q_len (no
 *               prefix) and kv_len < q_len; dense and paged; MHA, GQA, MQA;
 *               f32, f16, bf16, fp8 (tensor and token scales); forced,
 *               automatic and one split; lse; soft-cap and sinks; every CPU
 *               instruction set.
 *   tree_unit   the oracle itself against an independent rule: each row of a
 *               tree equals (bitwise, float64 reference) a q_len-1 decode over
 *               a fresh cache holding only its prefix and its own path; a
 *               chain mask equals the causal call bit for bit on the CPU
 *               backend (same path); a NaN in K of a draft key changes only
 *               the rows that see it; deterministic plans are batch
 *               invariant; MLA trees (CPU vs reference, chain = causal);
 *               bad masks and plans are refused naming the argument, with
 *               out and lse untouched.
 * FD_TEST_SEED fixes the inputs; FD_TEST_FILTER selects cases by name.
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

#include "cpu/cpu_kernels.h"
#include "harness.h"

#define MAX_CASES 96
#define MAX_B 4
#define MAX_T 64

static uint64_t g_seed;

/* ---- A small f32 fixture for the unit tests ------------------------------------- */

typedef struct fixture {
  int B, T, Hq, Hkv, D, cap;
  int32_t kv_len[MAX_B];
  uint64_t mask[MAX_B * MAX_T];
  float *q, *k, *v; /* contiguous [B][T][Hq][D], [B][cap][Hkv][D] */
} fixture;

static void fixture_init(fixture *f, int B, int T, int Hq, int Hkv, int D, const int32_t *kv_len,
                         uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->B = B, f->T = T, f->Hq = Hq, f->Hkv = Hkv, f->D = D;
  f->cap = 1;
  for (int b = 0; b < B; b++) {
    f->kv_len[b] = kv_len[b];
    if (kv_len[b] > f->cap) f->cap = kv_len[b];
  }
  fd_rng r = {seed};
  const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * f->cap * Hkv * D;
  f->q = malloc(nq * sizeof *f->q);
  f->k = malloc(nk * sizeof *f->k);
  f->v = malloc(nk * sizeof *f->v);
  assert_non_null(f->q);
  assert_non_null(f->k);
  assert_non_null(f->v);
  for (size_t i = 0; i < nq; i++) f->q[i] = (float)(2.0 * fd_rng_normal(&r));
  for (size_t i = 0; i < nk; i++) f->k[i] = (float)fd_rng_normal(&r);
  for (size_t i = 0; i < nk; i++) f->v[i] = (float)fd_rng_normal(&r);
  for (int b = 0; b < B; b++) fd_tree_eagle(&r, T, f->mask + b * T);
}

static void fixture_free(fixture *f) {
  free(f->q);
  free(f->k);
  free(f->v);
}

static fd_problem fixture_problem(const fixture *f, fd_backend backend, int tree) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = backend;
  p.dtype = FD_DTYPE_F32;
  p.batch = f->B;
  p.q_len = f->T;
  p.num_heads_q = f->Hq;
  p.num_heads_kv = f->Hkv;
  p.head_dim = f->D;
  p.kv_capacity = f->cap;
  p.num_threads = 2;
  p.tree_mask = tree;
  return p;
}

static fd_tensors fixture_tensors(const fixture *f, float *out, float *lse) {
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = f->q;
  t.k_cache = f->k;
  t.v_cache = f->v;
  t.kv_len = f->kv_len;
  t.out = out;
  t.lse = lse;
  t.tree_mask = f->mask;
  return t;
}

static size_t out_count(const fixture *f) { return (size_t)f->B * f->T * f->Hq * f->D; }
static size_t lse_count(const fixture *f) { return (size_t)f->B * f->Hq * f->T; }

/* Runs `p` over the fixture into fresh NaN-poisoned out / lse; returns the status. */
static fd_status run(const fixture *f, const fd_problem *p, const fd_tensors *t_in, float *out,
                     float *lse, fd_error *err) {
  for (size_t i = 0; i < out_count(f); i++) out[i] = NAN;
  for (size_t i = 0; i < lse_count(f); i++) lse[i] = NAN;
  fd_plan plan;
  fd_status st = fd_plan_init(&plan, p, err);
  if (st != FD_STATUS_OK) return st;
  void *ws = plan.workspace_size ? malloc(plan.workspace_size) : NULL;
  if (plan.workspace_size) memset(ws, 0xff, plan.workspace_size);
  fd_tensors t = *t_in;
  t.out = out;
  t.lse = lse;
  st = fd_run(&plan, &t, ws, plan.workspace_size, NULL, err);
  free(ws);
  return st;
}

/* ---- Unit tests ----------------------------------------------------------------- */

/* Each row of a tree (reference backend) equals a q_len-1 decode over a cache
 * holding only the row's prefix and the draft keys of its bits, in order:
 * the same float64 sums (a hidden key adds exp(-inf) = 0), so bitwise. */
static void test_paths(void **state) {
  (void)state;
  const int32_t kv_len[3] = {300, 64, 40}; /* a prefix; none; drafts cut off */
  fixture f;
  fixture_init(&f, 3, 64, 4, 2, 24, kv_len, fd_mix64(g_seed + 1));
  fd_tree_shuffle(&(fd_rng){fd_mix64(g_seed + 2)}, 64, f.mask + 64); /* non-triangular */
  float *out = malloc(out_count(&f) * sizeof *out), *lse = malloc(lse_count(&f) * sizeof *lse);
  fd_error err;
  const fd_problem p = fixture_problem(&f, FD_BACKEND_REFERENCE, 1);
  const fd_tensors t = fixture_tensors(&f, out, lse);
  assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_OK);

  const int D = f.D, Hkv = f.Hkv, Hq = f.Hq;
  float *pk = malloc((size_t)f.cap * Hkv * D * sizeof *pk), *pv = malloc((size_t)f.cap * Hkv * D * sizeof *pv);
  float q1[4 * 24], o1[4 * 24], l1[4];
  int checked = 0, hidden = 0;
  for (int b = 0; b < f.B; b++)
    for (int row = 0; row < f.T; row++) {
      const uint64_t m = f.mask[b * f.T + row];
      int32_t n = 0;
      for (int j = 0; j < kv_len[b]; j++) {
        const int d = j - (kv_len[b] - f.T);
        if (d >= 0 && !((m >> d) & 1u)) {
          hidden++;
          continue;
        }
        memcpy(pk + (size_t)n * Hkv * D, f.k + ((size_t)b * f.cap + j) * Hkv * D, (size_t)Hkv * D * sizeof *pk);
        memcpy(pv + (size_t)n * Hkv * D, f.v + ((size_t)b * f.cap + j) * Hkv * D, (size_t)Hkv * D * sizeof *pv);
        n++;
      }
      memcpy(q1, f.q + ((size_t)b * f.T + row) * Hq * D, (size_t)Hq * D * sizeof *q1);
      fd_problem p1 = fixture_problem(&f, FD_BACKEND_REFERENCE, 0);
      p1.batch = 1;
      p1.q_len = 1;
      fd_tensors t1;
      memset(&t1, 0, sizeof t1);
      t1.q = q1;
      t1.k_cache = pk;
      t1.v_cache = pv;
      t1.kv_len = &n;
      t1.out = o1;
      t1.lse = l1;
      if (n == 0) { /* no key: out 0, lse -inf */
        for (int i = 0; i < Hq * D; i++) assert_true(out[((size_t)b * f.T + row) * Hq * D + i] == 0.0f);
        continue;
      }
      assert_int_equal(fd_decode(&p1, &t1, NULL, &err), FD_STATUS_OK);
      assert_memory_equal(o1, out + ((size_t)b * f.T + row) * Hq * D, (size_t)Hq * D * sizeof *o1);
      for (int h = 0; h < Hq; h++)
        assert_memory_equal(&l1[h], &lse[((size_t)b * Hq + h) * f.T + row], sizeof(float));
      checked++;
    }
  assert_true(checked > 100);
  assert_true(hidden > 1000); /* the trees hide keys: the test can fail */
  free(pk);
  free(pv);
  free(out);
  free(lse);
  fixture_free(&f);
}

/* A chain mask is the causal call: bitwise equal on the CPU backend (the same
 * path), forced and automatic splits, q_len 1..16. */
static void test_chain_is_causal(void **state) {
  (void)state;
  const int q_lens[] = {1, 7, 16};
  for (int qi = 0; qi < 3; qi++)
    for (int splits = 0; splits < 4; splits += 3) {
      const int T = q_lens[qi];
      const int32_t kv_len[3] = {T + 333, T, T + 40};
      fixture f;
      fixture_init(&f, 3, T, 8, 2, 64, kv_len, fd_mix64(g_seed + 10 + qi));
      fd_tree_chain(T, f.mask);
      fd_tree_chain(T, f.mask + T);
      fd_tree_chain(T, f.mask + 2 * T);
      float *o_a = malloc(out_count(&f) * sizeof(float)), *o_b = malloc(out_count(&f) * sizeof(float));
      float *l_a = malloc(lse_count(&f) * sizeof(float)), *l_b = malloc(lse_count(&f) * sizeof(float));
      fd_error err;
      fd_problem pt = fixture_problem(&f, FD_BACKEND_CPU, 1), pc = fixture_problem(&f, FD_BACKEND_CPU, 0);
      pt.num_splits = pc.num_splits = splits;
      fd_tensors t = fixture_tensors(&f, o_a, l_a);
      assert_int_equal(run(&f, &pt, &t, o_a, l_a, &err), FD_STATUS_OK);
      t.tree_mask = NULL;
      assert_int_equal(run(&f, &pc, &t, o_b, l_b, &err), FD_STATUS_OK);
      assert_memory_equal(o_a, o_b, out_count(&f) * sizeof(float));
      assert_memory_equal(l_a, l_b, lse_count(&f) * sizeof(float));
      for (size_t i = 0; i < out_count(&f); i++) assert_false(isnan(o_a[i]));
      free(o_a), free(o_b), free(l_a), free(l_b);
      fixture_free(&f);
    }
}

/* NaN in the K of draft key j: exactly the rows whose mask has bit j turn NaN. */
static void test_hidden_keys_unread(void **state) {
  (void)state;
  const int32_t kv_len[1] = {200};
  fixture f;
  fixture_init(&f, 1, 64, 4, 4, 32, kv_len, fd_mix64(g_seed + 20));
  const int j = 9, key = 200 - 64 + j;
  for (int i = 0; i < 4 * 32; i++) f.k[(size_t)key * 4 * 32 + i] = NAN;
  float *out = malloc(out_count(&f) * sizeof *out), *lse = malloc(lse_count(&f) * sizeof *lse);
  fd_error err;
  for (int backend = FD_BACKEND_CPU; backend <= FD_BACKEND_REFERENCE; backend += 2) {
    const fd_problem p = fixture_problem(&f, (fd_backend)backend, 1);
    const fd_tensors t = fixture_tensors(&f, out, lse);
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_OK);
    int seen = 0;
    for (int row = 0; row < 64; row++) {
      const int sees = (int)((f.mask[row] >> j) & 1u);
      seen += sees;
      for (int i = 0; i < 4 * 32; i++) assert_int_equal(!!isnan(out[(size_t)row * 4 * 32 + i]), sees);
    }
    assert_true(seen >= 1 && seen < 64);
  }
  free(out);
  free(lse);
  fixture_free(&f);
}

/* Deterministic plans: a sequence's rows are the same bits alone and in a batch. */
static void test_deterministic(void **state) {
  (void)state;
  const int32_t kv_len[3] = {5000, 64, 2100};
  fixture f;
  fixture_init(&f, 3, 64, 4, 2, 32, kv_len, fd_mix64(g_seed + 30));
  float *out = malloc(out_count(&f) * sizeof *out), *lse = malloc(lse_count(&f) * sizeof *lse);
  fd_error err;
  fd_problem p = fixture_problem(&f, FD_BACKEND_CPU, 1);
  p.deterministic = 1;
  fd_tensors t = fixture_tensors(&f, out, lse);
  assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_OK);
  /* sequence 0 alone, with another capacity and thread count */
  const size_t per = (size_t)64 * 4 * 32;
  float *o1 = malloc(per * sizeof *o1), l1[4 * 64];
  fd_problem p1 = p;
  p1.batch = 1;
  p1.num_threads = 1;
  fd_tensors t1 = t;
  t1.out = o1;
  t1.lse = l1;
  t1.k_strides[0] = (int64_t)f.cap * 2 * 32, t1.k_strides[1] = 2 * 32, t1.k_strides[2] = 32;
  memcpy(t1.v_strides, t1.k_strides, sizeof t1.v_strides);
  p1.kv_capacity = 5000;
  assert_int_equal(fd_decode(&p1, &t1, NULL, &err), FD_STATUS_OK);
  assert_memory_equal(o1, out, per * sizeof *o1);
  assert_memory_equal(l1, lse, sizeof l1);
  free(o1);
  free(out);
  free(lse);
  fixture_free(&f);
}

/* MLA (rope_dim > 0) with a tree: the CPU backend within float32 accuracy of
 * the float64 reference (hidden keys make it fail: the masks hide most
 * drafts), and a chain mask equal to the causal MLA call bit for bit. */
static void test_mla(void **state) {
  (void)state;
  enum { B = 2, T = 40, H = 16, D = 96, R = 16 };
  const int32_t kv_len[B] = {700, 33};
  const int cap = 700;
  fd_rng r = {fd_mix64(g_seed + 50)};
  float *q = malloc(sizeof(float) * B * T * H * D), *qp = malloc(sizeof(float) * B * T * H * R);
  float *ck = malloc(sizeof(float) * B * cap * D), *kp = malloc(sizeof(float) * B * cap * R);
  const size_t n_out = (size_t)B * T * H * D, n_lse = (size_t)B * H * T;
  float *o[3], *l[3];
  for (int i = 0; i < 3; i++) o[i] = malloc(n_out * sizeof(float)), l[i] = malloc(n_lse * sizeof(float));
  for (size_t i = 0; i < (size_t)B * T * H * D; i++) q[i] = (float)(0.5 * fd_rng_normal(&r));
  for (size_t i = 0; i < (size_t)B * T * H * R; i++) qp[i] = (float)(0.5 * fd_rng_normal(&r));
  for (size_t i = 0; i < (size_t)B * cap * D; i++) ck[i] = (float)fd_rng_normal(&r);
  for (size_t i = 0; i < (size_t)B * cap * R; i++) kp[i] = (float)fd_rng_normal(&r);
  uint64_t mask[B * T], chain[B * T];
  for (int b = 0; b < B; b++) fd_tree_eagle(&r, T, mask + b * T), fd_tree_chain(T, chain + b * T);
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.dtype = FD_DTYPE_F32;
  p.batch = B;
  p.q_len = T;
  p.num_heads_q = H;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.rope_dim = R;
  p.kv_capacity = cap;
  p.softmax_scale = 0.1f;
  p.num_threads = 2;
  p.num_splits = 3;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = q, t.q_pe = qp, t.k_cache = ck, t.k_pe_cache = kp, t.kv_len = kv_len;
  fd_error err;
  const fd_backend backends[3] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE, FD_BACKEND_CPU};
  for (int i = 0; i < 3; i++) {
    for (size_t e = 0; e < n_out; e++) o[i][e] = NAN;
    p.backend = backends[i];
    p.tree_mask = 1;
    t.tree_mask = mask;
    t.out = o[i], t.lse = l[i];
    assert_int_equal(fd_decode(&p, &t, NULL, &err), FD_STATUS_OK);
  }
  double worst = 0.0;
  for (size_t e = 0; e < n_out; e++) {
    assert_false(isnan(o[0][e]));
    const double d = fabs((double)o[0][e] - (double)o[1][e]);
    if (d > worst) worst = d;
  }
  assert_true(worst < 2e-5);
  assert_memory_equal(o[0], o[2], n_out * sizeof(float)); /* run to run */
  /* a chain: the causal call (q_len 16 rows of the same data) */
  p.q_len = 16;
  p.backend = FD_BACKEND_CPU;
  for (int b = 0; b < B; b++) fd_tree_chain(16, chain + b * 16);
  t.tree_mask = chain;
  t.out = o[0], t.lse = l[0];
  assert_int_equal(fd_decode(&p, &t, NULL, &err), FD_STATUS_OK);
  p.tree_mask = 0;
  t.tree_mask = NULL;
  t.out = o[1], t.lse = l[1];
  assert_int_equal(fd_decode(&p, &t, NULL, &err), FD_STATUS_OK);
  assert_memory_equal(o[0], o[1], (size_t)B * 16 * H * D * sizeof(float));
  assert_memory_equal(l[0], l[1], (size_t)B * H * 16 * sizeof(float));
  /* CUDA MLA plans refuse trees too */
  p.tree_mask = 1;
  p.q_len = T;
  p.backend = FD_BACKEND_CUDA;
  fd_plan plan;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_UNSUPPORTED);
  for (int i = 0; i < 3; i++) free(o[i]), free(l[i]);
  free(q), free(qp), free(ck), free(kp);
}

/* Plans: what is refused, naming the field. */
static void test_plan_checks(void **state) {
  (void)state;
  const int32_t kv_len[1] = {100};
  fixture f;
  fixture_init(&f, 1, 64, 4, 2, 32, kv_len, 1);
  fd_plan plan;
  fd_error err;
  fd_problem p = fixture_problem(&f, FD_BACKEND_CPU, 1);
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  p.backend = FD_BACKEND_REFERENCE;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  p.backend = FD_BACKEND_CPU;
  p.q_len = 65;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "q_len"));
  p.q_len = 64;
  p.tree_mask = 0;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT); /* causal: 16 */
  p.tree_mask = 2;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "tree_mask"));
  p.tree_mask = 1;
  p.non_causal = 1;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "tree_mask"));
  p.non_causal = 0;
  p.has_window = 1;
  p.window_left = 10;
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "window_left"));
  p.window_left = -1; /* has_window with -1: no window */
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  p.has_window = 0;
  p = fixture_problem(&f, FD_BACKEND_CUDA, 1);
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_UNSUPPORTED);
  assert_non_null(strstr(err.message, "tree_mask"));
  assert_non_null(strstr(err.message, "CPU"));
  fixture_free(&f);
}

/* Runs: bad masks refused naming tree_mask[b][t], nothing written. */
static void test_run_checks(void **state) {
  (void)state;
  const int32_t kv_len[2] = {100, 30};
  fixture f;
  fixture_init(&f, 2, 20, 4, 2, 32, kv_len, fd_mix64(g_seed + 40));
  float *out = malloc(out_count(&f) * sizeof *out), *lse = malloc(lse_count(&f) * sizeof *lse);
  fd_error err;
  for (int backend = FD_BACKEND_CPU; backend <= FD_BACKEND_REFERENCE; backend += 2) {
    const fd_problem p = fixture_problem(&f, (fd_backend)backend, 1);
    fd_tensors t = fixture_tensors(&f, out, lse);
    const uint64_t good = f.mask[20 + 7];
    f.mask[20 + 7] &= ~((uint64_t)1 << 7); /* row 7 of sequence 1 does not see itself */
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tree_mask[1][7]"));
    for (size_t i = 0; i < out_count(&f); i++) assert_true(isnan(out[i]));
    for (size_t i = 0; i < lse_count(&f); i++) assert_true(isnan(lse[i]));
    f.mask[20 + 7] = good | ((uint64_t)1 << 20); /* a bit at q_len */
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tree_mask[1][7]"));
    for (size_t i = 0; i < out_count(&f); i++) assert_true(isnan(out[i]));
    f.mask[20 + 7] = good | ((uint64_t)1 << 63);
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_INVALID_ARGUMENT);
    f.mask[20 + 7] = good;
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_OK);
    t.tree_mask = NULL;
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tree_mask"));
    t.tree_mask = f.mask;
    t.tree_mask_stride = -2;
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tree_mask_stride"));
    t.tree_mask_stride = 0;
    t.tree_mask = (const uint64_t *)((const char *)f.mask + 4);
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_INVALID_ARGUMENT);
    t.tree_mask = f.mask;
    /* out over the mask: refused by the overlap check */
    fd_plan plan;
    assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
    fd_tensors bad = t;
    bad.lse = (float *)f.mask;
    void *ws = malloc(plan.workspace_size + 1);
    assert_int_equal(fd_run(&plan, &bad, ws, plan.workspace_size, NULL, &err),
                     FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tree_mask"));
    free(ws);
    /* a plan without tree_mask refuses a mask */
    fd_problem pc = p;
    pc.tree_mask = 0;
    pc.q_len = 16;
    assert_int_equal(fd_plan_init(&plan, &pc, &err), FD_STATUS_OK);
    assert_int_equal(fd_run(&plan, &t, NULL, 0, NULL, &err), FD_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err.message, "tree_mask"));
    /* FD_STRIDE_BROADCAST: sequence 0's tree for both */
    memcpy(f.mask + 20, f.mask, 20 * sizeof *f.mask);
    float *out2 = malloc(out_count(&f) * sizeof *out2), *lse2 = malloc(lse_count(&f) * sizeof *lse2);
    assert_int_equal(run(&f, &p, &t, out, lse, &err), FD_STATUS_OK);
    t.tree_mask_stride = FD_STRIDE_BROADCAST;
    f.mask[20 + 3] = 0; /* not read */
    assert_int_equal(run(&f, &p, &t, out2, lse2, &err), FD_STATUS_OK);
    assert_memory_equal(out, out2, out_count(&f) * sizeof *out);
    memcpy(f.mask + 20, f.mask, 20 * sizeof *f.mask);
    free(out2);
    free(lse2);
  }
  free(out);
  free(lse);
  fixture_free(&f);
}

int main(void) {
  g_seed = fd_test_seed();
  static fd_case cases[MAX_CASES];
  const int n = fd_tree_cases(FD_BACKEND_CPU, g_seed, cases, MAX_CASES);
  int failed = fd_run_case_group("tree_grid", cases, n);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paths),           cmocka_unit_test(test_chain_is_causal),
      cmocka_unit_test(test_hidden_keys_unread), cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_plan_checks),     cmocka_unit_test(test_run_checks),
      cmocka_unit_test(test_mla),
  };
  const char *filter = getenv("FD_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  failed |= cmocka_run_group_tests_name("tree_unit", tests, NULL, NULL) != 0;
  return failed ? 1 : 0;
}
