/*
 * rel_trust.c — the "trust" group: long sums that stay exact, NaN that always
 * shows, and the deterministic (batch-invariant) mode, for one backend.
 *
 *   long_identical   4M identical keys (a paged cache whose block_table
 *                    names one page 16384 times), num_splits 1 and automatic:
 *                    out = v exactly up to rounding (f32 within 2e-6 of
 *                    max|V|), lse = s + ln(n)
 *   long_realistic   one page of 256 random keys repeated to 4M keys: out and
 *                    lse - ln(16384) equal attention over the page alone
 *   nan_shows        NaN in q, in a visible K element, a score that
 *                    overflows to +inf, or a NaN sink: the affected rows get
 *                    NaN out and lse; NaN, +inf or -inf in a visible V
 *                    element: lse NaN and out non-finite in its column (with
 *                    1, 2, 7 and automatic splits, and on the reference
 *                    backend); the other rows stay finite
 *   deterministic    a sequence decoded alone and inside a batch of 64 (other
 *                    lengths, kv_capacity, kv_len_hint, CPU threads or SM
 *                    count, a window) gives the same bits
 * FD_TEST_QUICK=1 shrinks the long cases to 64k keys.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rel.h"

/* This group's inputs: the harness's splitmix64, seeded from the run's seed. */
static uint64_t next64(uint64_t *s) {
  fd_rng r = {*s};
  const uint64_t x = fd_rng_next(&r);
  *s = r.state;
  return x;
}
static double uniform(uint64_t *s) { return (double)(next64(s) >> 11) * 0x1p-53 * 2.0 - 1.0; }

static void fill_random(fd_dtype dt, void *host, size_t n, double scale, uint64_t *s) {
  for (size_t i = 0; i < n; i++) rel_store(dt, host, (int64_t)i, uniform(s) * scale);
}

/* Device (or host) copy of a host buffer. */
static void *put_copy(fd_backend be, const void *host, size_t bytes) {
  void *d = rel_alloc(be, bytes);
  rel_put(be, d, host, bytes);
  return d;
}

/* ---- long sums --------------------------------------------------------------------- */

#define LONG_D 128
#define LONG_HQ 4
#define LONG_PAGE 256

/* One page (LONG_PAGE positions, one kv head) repeated `pages` times; `distinct`:
 * random keys per position, else every position holds the same key. Runs
 * num_splits 1 and 0 and checks out/lse against the page's own attention. */
static void long_case(const rel_env *env, fd_dtype dt, int distinct) {
  const fd_backend be = env->backend;
  const int32_t pages = rel_quick() ? 256 : 16384; /* 64k or 4M keys */
  const int32_t n = pages * LONG_PAGE;
  uint64_t s = env->seed ^ (0x1234u + (uint64_t)dt * 7u + (uint64_t)distinct);
  const size_t es = fd_dtype_size(dt);
  const size_t page_elems = (size_t)LONG_PAGE * LONG_D;
  void *q = malloc((size_t)LONG_HQ * LONG_D * es), *k = malloc(page_elems * es),
       *v = malloc(page_elems * es);
  int32_t *bt = calloc((size_t)pages, sizeof *bt); /* every entry: page 0 */
  assert_non_null(q);
  assert_non_null(k);
  assert_non_null(v);
  assert_non_null(bt);
  fill_random(dt, q, (size_t)LONG_HQ * LONG_D, 1.0, &s);
  fill_random(dt, k, page_elems, 1.0, &s);
  fill_random(dt, v, page_elems, 1.0, &s);
  if (!distinct)
    for (int j = 1; j < LONG_PAGE; j++) {
      memcpy((char *)k + (size_t)j * LONG_D * es, k, LONG_D * es);
      memcpy((char *)v + (size_t)j * LONG_D * es, v, LONG_D * es);
    }

  /* Expected: attention of q over the page alone (its 256 keys, each
   * repeated `pages` times: the same softmax), lse + ln(pages). */
  fd_problem rp = {0};
  rp.dtype = dt;
  rp.batch = 1;
  rp.num_heads_q = LONG_HQ;
  rp.num_heads_kv = 1;
  rp.head_dim = LONG_D;
  rp.kv_capacity = LONG_PAGE;
  int32_t page_len = LONG_PAGE;
  fd_tensors ht = {0};
  ht.q = q;
  ht.k_cache = k;
  ht.v_cache = v;
  ht.kv_len = &page_len;
  const int64_t q_strides[3] = {LONG_HQ * LONG_D, LONG_HQ * LONG_D, LONG_D};
  const int64_t k_strides[3] = {(int64_t)LONG_PAGE * LONG_D, LONG_D, LONG_D};
  memcpy(ht.q_strides, q_strides, sizeof q_strides);
  memcpy(ht.k_strides, k_strides, sizeof k_strides);
  memcpy(ht.v_strides, k_strides, sizeof k_strides);
  double *ref, *ref_lse;
  rel_oracle(&rp, &ht, &ref, &ref_lse);
  for (int h = 0; h < LONG_HQ; h++) ref_lse[h] += log((double)pages);

  fd_problem p = rp;
  p.backend = be;
  p.kv_capacity = n;
  p.page_size = LONG_PAGE;
  p.max_pages_per_seq = pages;
  p.num_pages = 1;
  void *dq = put_copy(be, q, (size_t)LONG_HQ * LONG_D * es), *dk = put_copy(be, k, page_elems * es),
       *dv = put_copy(be, v, page_elems * es);
  int32_t *dbt = put_copy(be, bt, (size_t)pages * sizeof *bt), *dlen = put_copy(be, &n, sizeof n);
  fd_tensors t = {0};
  t.q = dq;
  t.k_cache = dk;
  t.v_cache = dv;
  t.kv_len = dlen;
  t.block_table = dbt;
  const int32_t splits[2] = {1, 0};
  for (int si = 0; si < 2; si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
    unsigned char out[LONG_HQ * LONG_D * 4];
    float lse[LONG_HQ];
    const fd_status st = rel_run_private(&plan, &t, 0xff, NULL, out, lse, &err);
    if (st != FD_STATUS_OK) fail_msg("%s", err.message);
    /* f32: 2e-6 of max|V| (the accuracy the header promises at any length);
     * 16-bit: the grid's floor for the dtype */
    const double tol_rel = dt == FD_DTYPE_F32 ? 2e-6 : fd_tol_out_floor(dt);
    double vmax = 0.0;
    for (size_t i = 0; i < page_elems; i++) vmax = fmax(vmax, fabs(rel_load(dt, v, (int64_t)i)));
    double worst = 0.0, worst_lse = 0.0;
    for (int i = 0; i < LONG_HQ * LONG_D; i++) {
      const double e = fabs(rel_load(dt, out, i) - ref[i]);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    for (int h = 0; h < LONG_HQ; h++) {
      const double e = fabs((double)lse[h] - ref_lse[h]) / fmax(1.0, fabs(ref_lse[h]));
      if (!(e <= worst_lse)) worst_lse = isnan(e) ? INFINITY : e;
    }
    printf("    %s %s keys %d, plan num_splits %d: out error %.3g of max|V| (limit %.3g), lse %.3g\n",
           dt == FD_DTYPE_F32 ? "f32" : dt == FD_DTYPE_F16 ? "f16" : "bf16",
           distinct ? "realistic" : "identical", n, plan.num_splits, worst / vmax, tol_rel, worst_lse);
    if (!(worst <= tol_rel * vmax) || !(worst_lse <= fd_tol_lse(dt)))
      fail_msg("long sum: out error %.3g of max|V| (limit %.3g), lse error %.3g (limit %.3g)",
               worst / vmax, tol_rel, worst_lse, fd_tol_lse(dt));
  }
  rel_free(be, dq);
  rel_free(be, dk);
  rel_free(be, dv);
  rel_free(be, dbt);
  rel_free(be, dlen);
  free(ref);
  free(ref_lse);
  free(q);
  free(k);
  free(v);
  free(bt);
}

static void long_identical(void **state) {
  const rel_env *env = REL_ENV(state);
  long_case(env, FD_DTYPE_F32, 0);
  long_case(env, FD_DTYPE_BF16, 0);
  long_case(env, FD_DTYPE_F16, 0);
}

static void long_realistic(void **state) {
  const rel_env *env = REL_ENV(state);
  long_case(env, FD_DTYPE_F32, 1);
  long_case(env, FD_DTYPE_BF16, 1);
}

/* ---- NaN that always shows ----------------------------------------------------------- */

enum blowup { NAN_Q, NAN_K, NAN_V, OVERFLOW, INF_K, NAN_SINK, INF_V, NEG_INF_V, ALL_NEG_INF_K, BLOWUPS };
static const char *blowup_name[BLOWUPS] = {"NaN in q",  "NaN in k",  "NaN in v",  "q.k overflows", "+inf in k",
                                           "NaN sink",  "+inf in v", "-inf in v", "every score -inf"};

#define NS_B 2
#define NS_HQ 4
#define NS_HKV 2
#define NS_T 2
#define NS_D 64
#define NS_CAP 320

/* One problem, one blow-up planted where row (b 0, t 1, head 1 -> kv head 0)
 * sees it; checks every row with num_splits 1, 2, 7 and 0 on `be`. */
static void nan_case(const rel_env *env, fd_backend be, fd_dtype dt, enum blowup kind) {
  const int32_t kv_len[NS_B] = {300, 150};
  const size_t es = fd_dtype_size(dt);
  const size_t qn = (size_t)NS_B * NS_T * NS_HQ * NS_D, kvn = (size_t)NS_B * NS_CAP * NS_HKV * NS_D;
  uint64_t s = env->seed ^ (0xbad0u + (uint64_t)kind * 31u + (uint64_t)dt);
  void *q = malloc(qn * es), *k = malloc(kvn * es), *v = malloc(kvn * es);
  float sinks[NS_HQ];
  assert_non_null(q);
  assert_non_null(k);
  assert_non_null(v);
  fill_random(dt, q, qn, 1.0, &s);
  fill_random(dt, k, kvn, 1.0, &s);
  fill_random(dt, v, kvn, 1.0, &s);
  for (int h = 0; h < NS_HQ; h++) sinks[h] = (float)uniform(&s);
  /* element offsets: q [b][t][h][d], k/v [b][pos][hk][d] */
  const int64_t q_at = (((int64_t)0 * NS_T + 1) * NS_HQ + 1) * NS_D + 5; /* b0 t1 h1 */
  const int64_t k_at = (((int64_t)0 * NS_CAP + 100) * NS_HKV + 0) * NS_D + 7; /* b0 key 100 hk0 */
  switch (kind) {
    case NAN_Q: rel_store(dt, q, q_at, NAN); break;
    case NAN_K: rel_store(dt, k, k_at, NAN); break;
    case NAN_V: rel_store(dt, v, k_at, NAN); break;
    case INF_V: rel_store(dt, v, k_at, INFINITY); break;
    case NEG_INF_V: rel_store(dt, v, k_at, -INFINITY); break;
    case ALL_NEG_INF_K: /* every key of b0, kv head 0: score -inf (q's element 7 > 0) */
    case INF_K:
      if (kind == INF_K) rel_store(dt, k, k_at, INFINITY); /* q's element there made positive below */
      else
        for (int32_t j = 0; j < NS_CAP; j++)
          rel_store(dt, k, (((int64_t)0 * NS_CAP + j) * NS_HKV + 0) * NS_D + 7, -INFINITY);
      for (int h = 0; h < NS_HQ / NS_HKV; h++)
        for (int t = 0; t < NS_T; t++) {
          const int64_t i = (((int64_t)0 * NS_T + t) * NS_HQ + h) * NS_D + 7;
          rel_store(dt, q, i, fabs(rel_load(dt, q, i)) + 0.25);
        }
      break;
    case OVERFLOW: /* f32 only: q.k = 3e38 * 3e38 overflows float32 */
      for (int h = 0; h < NS_HQ / NS_HKV; h++)
        for (int t = 0; t < NS_T; t++)
          rel_store(dt, q, (((int64_t)0 * NS_T + t) * NS_HQ + h) * NS_D + 7, 3e38);
      rel_store(dt, k, k_at, 3e38);
      break;
    case NAN_SINK: sinks[1] = NAN; break;
    default: break;
  }
  /* Rows that must be NaN: (b, t, h) seeing the planted element. */
  int must_nan[NS_B][NS_T][NS_HQ] = {{{0}}};
  for (int t = 0; t < NS_T; t++)
    for (int h = 0; h < NS_HQ; h++) {
      if (kind == NAN_Q) must_nan[0][t][h] = t == 1 && h == 1;
      else if (kind == NAN_SINK) must_nan[0][t][h] = must_nan[1][t][h] = h == 1;
      else must_nan[0][t][h] = h / (NS_HQ / NS_HKV) == 0; /* kv head 0 of b0: key 100 is visible */
    }

  fd_problem p = {0};
  p.backend = be;
  p.dtype = dt;
  p.batch = NS_B;
  p.q_len = NS_T;
  p.num_heads_q = NS_HQ;
  p.num_heads_kv = NS_HKV;
  p.head_dim = NS_D;
  p.kv_capacity = NS_CAP;
  void *dq = put_copy(be, q, qn * es), *dk = put_copy(be, k, kvn * es), *dv = put_copy(be, v, kvn * es);
  int32_t *dlen = put_copy(be, kv_len, sizeof kv_len);
  float *dsinks = put_copy(be, sinks, sizeof sinks);
  fd_tensors t = {0};
  t.q = dq;
  t.k_cache = dk;
  t.v_cache = dv;
  t.kv_len = dlen;
  t.sinks = kind == NAN_SINK ? dsinks : NULL;
  const int32_t splits[4] = {1, 2, 7, 0};
  for (int si = 0; si < (be == FD_BACKEND_REFERENCE ? 1 : 4); si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
    unsigned char out[NS_B * NS_T * NS_HQ * NS_D * 4];
    float lse[NS_B * NS_HQ * NS_T];
    if (rel_run_private(&plan, &t, 0x00, NULL, out, lse, &err) != FD_STATUS_OK)
      fail_msg("%s", err.message);
    for (int b = 0; b < NS_B; b++)
      for (int tt = 0; tt < NS_T; tt++)
        for (int h = 0; h < NS_HQ; h++) {
          const int64_t row = ((int64_t)b * NS_T + tt) * NS_HQ + h;
          int any_nan = 0, all_finite = 1;
          for (int d = 0; d < NS_D; d++) {
            const double o = rel_load(dt, out, row * NS_D + d);
            any_nan |= isnan(o);
            all_finite &= isfinite(o);
          }
          const float l = lse[((int64_t)b * NS_HQ + h) * NS_T + tt];
          /* a non-finite V element (flashdecode.h, fd_run): lse NaN, out NaN
           * or +-inf in that element's column at least (which other
           * elements is backend-defined) */
          const int in_v = kind == NAN_V || kind == INF_V || kind == NEG_INF_V;
          if (in_v && must_nan[b][tt][h]) {
            if (isfinite(rel_load(dt, out, row * NS_D + 7)) || !isnan(l))
              fail_msg("%s (%s, %s, num_splits %d): row b%d t%d h%d out[7] %g, lse %g: want a non-finite "
                       "out[7] and lse NaN",
                       blowup_name[kind], fd_backend_name(be), dt == FD_DTYPE_F32 ? "f32" : "bf16",
                       plan.num_splits, b, tt, h, rel_load(dt, out, row * NS_D + 7), (double)l);
          }
          if (kind == ALL_NEG_INF_K && must_nan[b][tt][h]) {
            /* no key has weight: a row without keys (out 0, lse -inf) */
            int all_zero = 1;
            for (int d = 0; d < NS_D; d++) all_zero &= rel_load(dt, out, row * NS_D + d) == 0.0;
            if (!all_zero || !(isinf(l) && l < 0))
              fail_msg("%s (%s, %s, num_splits %d): row b%d t%d h%d: want out 0 and lse -inf, lse %g",
                       blowup_name[kind], fd_backend_name(be), dt == FD_DTYPE_F32 ? "f32" : "bf16",
                       plan.num_splits, b, tt, h, (double)l);
            continue;
          }
          if (must_nan[b][tt][h] && kind != INF_V && kind != NEG_INF_V && !(any_nan && isnan(l)))
            fail_msg("%s (%s, %s, num_splits %d): row b%d t%d h%d out %s, lse %g: the blow-up vanished",
                     blowup_name[kind], fd_backend_name(be), dt == FD_DTYPE_F32 ? "f32" : "bf16",
                     plan.num_splits, b, tt, h, any_nan ? "has NaN" : "has no NaN", (double)l);
          if (!must_nan[b][tt][h] && !(all_finite && isfinite(l)))
            fail_msg("%s (%s, num_splits %d): row b%d t%d h%d, which does not see it, is not finite",
                     blowup_name[kind], fd_backend_name(be), plan.num_splits, b, tt, h);
        }
  }
  rel_free(be, dq);
  rel_free(be, dk);
  rel_free(be, dv);
  rel_free(be, dlen);
  rel_free(be, dsinks);
  free(q);
  free(k);
  free(v);
}

static void nan_shows(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int kind = 0; kind < BLOWUPS; kind++) {
    nan_case(env, env->backend, FD_DTYPE_F32, (enum blowup)kind);
    if (kind != OVERFLOW) nan_case(env, env->backend, FD_DTYPE_BF16, (enum blowup)kind);
    /* the reference computes in double: no overflow there */
    if (env->backend == FD_BACKEND_CPU && kind != OVERFLOW)
      nan_case(env, FD_BACKEND_REFERENCE, FD_DTYPE_F32, (enum blowup)kind);
  }
}

/* ---- The deterministic mode ------------------------------------------------------------ */

#define DT_HQ 8
#define DT_HKV 2
#define DT_D 64

/* Runs batch `batch` (sequence `mine` at index `slot`, its length kv_mine)
 * with deterministic plans and returns that sequence's out and lse. */
static void det_run(const rel_env *env, fd_dtype dt, int32_t batch, int32_t slot, int32_t cap,
                    int32_t kv_mine, int use_hint, int32_t knob, int32_t window, const void *q_mine,
                    const void *k_mine, const void *v_mine, unsigned char *out_mine, float *lse_mine,
                    uint64_t *s) {
  const fd_backend be = env->backend;
  const size_t es = fd_dtype_size(dt);
  const size_t q_row = (size_t)DT_HQ * DT_D, kv_row = (size_t)DT_HKV * DT_D;
  void *q = malloc((size_t)batch * q_row * es), *k = malloc((size_t)batch * cap * kv_row * es),
       *v = malloc((size_t)batch * cap * kv_row * es);
  int32_t *kv = malloc((size_t)batch * sizeof *kv);
  assert_non_null(q);
  assert_non_null(k);
  assert_non_null(v);
  assert_non_null(kv);
  fill_random(dt, q, (size_t)batch * q_row, 1.0, s);
  fill_random(dt, k, (size_t)batch * cap * kv_row, 1.0, s);
  fill_random(dt, v, (size_t)batch * cap * kv_row, 1.0, s);
  for (int32_t b = 0; b < batch; b++) kv[b] = (int32_t)(next64(s) % (uint64_t)(cap + 1));
  kv[slot] = kv_mine;
  memcpy((char *)q + slot * q_row * es, q_mine, q_row * es);
  memcpy((char *)k + (size_t)slot * cap * kv_row * es, k_mine, (size_t)kv_mine * kv_row * es);
  memcpy((char *)v + (size_t)slot * cap * kv_row * es, v_mine, (size_t)kv_mine * kv_row * es);

  fd_problem p = {0};
  p.backend = be;
  p.dtype = dt;
  p.batch = batch;
  p.num_heads_q = DT_HQ;
  p.num_heads_kv = DT_HKV;
  p.head_dim = DT_D;
  p.kv_capacity = cap;
  p.deterministic = 1;
  p.kv_len_hint = use_hint ? kv : NULL;
  if (be == FD_BACKEND_CPU) p.num_threads = knob;
  else p.sm_count = knob;
  if (window >= 0) {
    p.has_window = 1;
    p.window_left = window;
  }
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("%s", err.message);
  void *dq = put_copy(be, q, (size_t)batch * q_row * es);
  void *dk = put_copy(be, k, (size_t)batch * cap * kv_row * es);
  void *dv = put_copy(be, v, (size_t)batch * cap * kv_row * es);
  int32_t *dkv = put_copy(be, kv, (size_t)batch * sizeof *kv);
  fd_tensors t = {0};
  t.q = dq;
  t.k_cache = dk;
  t.v_cache = dv;
  t.kv_len = dkv;
  unsigned char *out = malloc((size_t)batch * q_row * es);
  float *lse = malloc((size_t)batch * DT_HQ * sizeof *lse);
  assert_non_null(out);
  assert_non_null(lse);
  if (rel_run_private(&plan, &t, 0x5a, NULL, out, lse, &err) != FD_STATUS_OK) fail_msg("%s", err.message);
  memcpy(out_mine, out + slot * q_row * es, q_row * es);
  memcpy(lse_mine, lse + (size_t)slot * DT_HQ, DT_HQ * sizeof *lse);
  rel_free(be, dq);
  rel_free(be, dk);
  rel_free(be, dv);
  rel_free(be, dkv);
  free(out);
  free(lse);
  free(q);
  free(k);
  free(v);
  free(kv);
}

static void deterministic(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_dtype dts[2] = {FD_DTYPE_F32, FD_DTYPE_BF16};
  const int32_t lens[3] = {1500, 5000, 2048 * 3 + 17}; /* one split; several; a partial last */
  for (int di = 0; di < 2; di++)
    for (int li = 0; li < 3; li++)
      for (int wi = 0; wi < 2; wi++) {
        const fd_dtype dt = dts[di];
        const int32_t n = lens[li], window = wi ? 3000 : -1;
        uint64_t s = env->seed ^ (0xde7u + (uint64_t)di * 131u + (uint64_t)li * 7u + (uint64_t)wi);
        const size_t es = fd_dtype_size(dt);
        void *q = malloc((size_t)DT_HQ * DT_D * es), *k = malloc((size_t)n * DT_HKV * DT_D * es),
             *v = malloc((size_t)n * DT_HKV * DT_D * es);
        assert_non_null(q);
        assert_non_null(k);
        assert_non_null(v);
        fill_random(dt, q, (size_t)DT_HQ * DT_D, 1.0, &s);
        fill_random(dt, k, (size_t)n * DT_HKV * DT_D, 1.0, &s);
        fill_random(dt, v, (size_t)n * DT_HKV * DT_D, 1.0, &s);
        unsigned char alone[DT_HQ * DT_D * 4], batched[DT_HQ * DT_D * 4];
        float lse_alone[DT_HQ], lse_batched[DT_HQ];
        /* alone: capacity = its length, one thread / one SM's worth */
        det_run(env, dt, 1, 0, n, n, 0, 1, window, q, k, v, alone, lse_alone, &s);
        /* in a batch (64 on CUDA, 12 on the CPU: memory and time on CI):
         * more capacity, the hint, more threads / the device's SMs */
        const int32_t batch = rel_quick() ? 8 : env->backend == FD_BACKEND_CUDA ? 64 : 12;
        det_run(env, dt, batch, 5, n + 700, n, 1, env->backend == FD_BACKEND_CPU ? 3 : 0, window,
                q, k, v, batched, lse_batched, &s);
        char what[96];
        snprintf(what, sizeof what, "deterministic out (%s, kv_len %d, window %d)",
                 di ? "bf16" : "f32", n, window);
        rel_assert_same(alone, batched, DT_HQ * DT_D * es, what);
        snprintf(what, sizeof what, "deterministic lse (%s, kv_len %d, window %d)",
                 di ? "bf16" : "f32", n, window);
        rel_assert_same(lse_alone, lse_batched, sizeof lse_alone, what);
        free(q);
        free(k);
        free(v);
      }
}

/* A sliding-window server frees the pages wholly before a window: their
 * block_table ids (-1 here, with num_pages known) are never checked or read,
 * and the result equals the one with the pages still there. */
static void window_freed_pages(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  enum { PS = 16, PAGES = 64, D = 64, HQ = 4 };
  const int32_t n = PAGES * PS - 5, window = 100;
  uint64_t s = env->seed ^ 0xf7eeu;
  const size_t kvn = (size_t)PAGES * PS * D;
  float *q = malloc((size_t)HQ * D * sizeof *q), *k = malloc(kvn * sizeof *k), *v = malloc(kvn * sizeof *v);
  assert_non_null(q);
  assert_non_null(k);
  assert_non_null(v);
  fill_random(FD_DTYPE_F32, q, (size_t)HQ * D, 1.0, &s);
  fill_random(FD_DTYPE_F32, k, kvn, 1.0, &s);
  fill_random(FD_DTYPE_F32, v, kvn, 1.0, &s);
  int32_t bt[PAGES], freed[PAGES];
  for (int i = 0; i < PAGES; i++) bt[i] = freed[i] = i;
  for (int i = 0; (i + 1) * PS <= n - 1 - window - 64; i++) freed[i] = -1; /* wholly before w0 */
  fd_problem p = {0};
  p.backend = be;
  p.dtype = FD_DTYPE_F32;
  p.batch = 1;
  p.num_heads_q = HQ;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.page_size = PS;
  p.max_pages_per_seq = PAGES;
  p.num_pages = PAGES;
  p.has_window = 1;
  p.window_left = window;
  void *dq = put_copy(be, q, (size_t)HQ * D * sizeof *q), *dk = put_copy(be, k, kvn * sizeof *k),
       *dv = put_copy(be, v, kvn * sizeof *v);
  int32_t *dbt = put_copy(be, bt, sizeof bt), *dfreed = put_copy(be, freed, sizeof freed),
          *dlen = put_copy(be, &n, sizeof n);
  fd_tensors t = {0};
  t.q = dq;
  t.k_cache = dk;
  t.v_cache = dv;
  t.kv_len = dlen;
  float out_a[HQ * D], out_b[HQ * D], lse_a[HQ], lse_b[HQ];
  const int32_t splits[2] = {1, 3};
  for (int si = 0; si < 2; si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
    t.block_table = dbt;
    if (rel_run_private(&plan, &t, 0, NULL, out_a, lse_a, &err) != FD_STATUS_OK) fail_msg("%s", err.message);
    t.block_table = dfreed;
    if (rel_run_private(&plan, &t, 0, NULL, out_b, lse_b, &err) != FD_STATUS_OK)
      fail_msg("freed pages before the window: %s", err.message);
    rel_assert_same(out_a, out_b, sizeof out_a, "out with the pages before the window freed");
    rel_assert_same(lse_a, lse_b, sizeof lse_a, "lse with the pages before the window freed");
  }
  rel_free(be, dq);
  rel_free(be, dk);
  rel_free(be, dv);
  rel_free(be, dbt);
  rel_free(be, dfreed);
  rel_free(be, dlen);
  free(q);
  free(k);
  free(v);
}

rel_group rel_group_trust(fd_backend backend) {
  static const struct CMUnitTest tests[] = {
      {"long_identical", long_identical, NULL, NULL, NULL},
      {"long_realistic", long_realistic, NULL, NULL, NULL},
      {"nan_shows", nan_shows, NULL, NULL, NULL},
      {"deterministic", deterministic, NULL, NULL, NULL},
      {"window_freed_pages", window_freed_pages, NULL, NULL, NULL},
  };
  (void)backend;
  rel_group g = {"trust", tests, sizeof tests / sizeof *tests};
  return g;
}
