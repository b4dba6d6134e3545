/*
 * rel_numerics.c — the tests about values (every test runs on the CPU and
 * on the CUDA backend):
 *   empty_rows_out_zero_lse_neg_inf  kv_len 0 in a batch of 64: out 0, lse
 *      -inf, others right; with sinks (windowed, non-causal) lse = the sink
 *   more_splits_than_keys_ignore_workspace  NaN-filled workspace: finite,
 *      bitwise equal to zero-filled and huge-finite-filled workspaces
 *   split_counts_1_to_64_agree  every num_splits 1..64 within two ulps (f16,
 *      bf16; f32: 4 sqrt(kv_len) ulps, its own accumulation order) of 1
 *      split, at each row's largest value
 *   paged_cache_grown_token_by_token  to 2048 keys with automatic splits:
 *      never NaN, right at every page and chunk boundary
 *   unread_slots_nan_inf_change_nothing  NaN / +-inf in every cache slot
 *      nobody may read (with a window: the keys before it too): bitwise equal
 *      to zero
 *   lse_matches_f64_every_split_count  for every head and split count;
 *   lse_merge_of_halves_equals_one_call  merging the two halves of a cache
 *      by their lse gives the one-call result
 *   huge_logits_right_and_finite  scores +-1e6, large-norm bf16: right, finite
 *   score_shift_moves_only_lse  adding a constant to every score leaves out
 *      unchanged and moves lse by it
 *   bf16_256_splits_as_accurate_as_one  error at most the 1-split error plus
 *      one ulp
 * FD_TEST_QUICK=1 (compute-sanitizer runs) keeps one or two variants of each.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rel.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16

static const fd_dtype all_dtypes[3] = {F32, F16, BF16};

/* splitmix64, for the tests that build their own inputs */
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) * 0x1.0p-53 * 2.0 - 1.0; }

/* ---- empty rows ------------------------------------------------------------------ */

static void empty_rows_out_zero_lse_neg_inf(void **state) {
  const rel_env *env = REL_ENV(state);
  const int32_t splits[] = {1, 2, 8, 0};
  const fd_dtype dtypes[] = {F16, F32};
  for (size_t di = 0; di < (rel_quick() ? 1u : 2u); di++)
    for (size_t si = rel_quick() ? 2 : 0; si < 4; si++) {
      fd_case c = rel_case(env);
      c.dtype = dtypes[di];
      c.head_dim = 128;
      c.num_heads_q = 8;
      c.num_heads_kv = 2;
      c.batch = 64;
      int32_t longest = 0;
      for (int b = 0; b < 64; b++) {
        c.kv_len[b] = (b == 1 || b == 10 || b == 63) ? 0 : 1 + (b * 97) % 400;
        if (c.kv_len[b] > longest) longest = c.kv_len[b];
      }
      c.q_len = 1;
      c.num_splits = splits[si];
      c.with_lse = 1;
      c.kv_capacity_pad = 512 - longest; /* 8 chunks: 8 splits stay 8 */
      c.page_size = dtypes[di] == F32 ? 16 : 0;
      c.check_determinism = splits[si] == 0;
      rel_run_case(env, &c);
    }
  /* q_len 3, paged: rows of short sequences that see no key; empty sequences. */
  for (size_t si = rel_quick() ? 1 : 0; si < (rel_quick() ? 2u : 4u); si++) {
    fd_case c = rel_case(env);
    c.dtype = BF16;
    c.head_dim = 64;
    c.num_heads_q = 8;
    c.num_heads_kv = 2;
    c.batch = 6;
    const int32_t kv[6] = {0, 1, 2, 3, 0, 600};
    memcpy(c.kv_len, kv, sizeof kv);
    c.q_len = 3;
    c.page_size = 16;
    c.num_splits = splits[si];
    c.with_lse = 1;
    c.kv_capacity_pad = 40;
    rel_run_case(env, &c);
  }
  /* sinks: rows that see no key get lse = the sink (kv_len 0, q_len > kv_len; windowed, non-causal) */
  for (int variant = rel_quick() ? 1 : 0; variant < 2; variant++) {
    fd_case c = rel_case(env);
    c.dtype = variant ? BF16 : F32;
    c.head_dim = 64;
    c.num_heads_q = 8;
    c.num_heads_kv = 2;
    c.batch = 5;
    const int32_t kv[5] = {0, 1, 2, 700, 0};
    memcpy(c.kv_len, kv, sizeof kv);
    c.q_len = variant ? 32 : 3;
    c.non_causal = variant;
    c.has_window = !variant, c.window_left = 63;
    c.page_size = 16;
    c.num_splits = 8;
    c.with_lse = 1;
    c.sinks = 1;
    rel_run_case(env, &c);
  }
  /* every sequence empty, 8 splits: the combine gets no active split at all */
  fd_case c = rel_case(env);
  c.dtype = F16;
  c.head_dim = 128;
  c.num_heads_q = 8;
  c.num_heads_kv = 2;
  c.batch = 4;
  c.q_len = 2;
  c.num_splits = 8;
  c.with_lse = 1;
  c.kv_capacity_pad = 1024;
  rel_run_case(env, &c);
}

/* ---- more splits than keys, garbage workspace -------------------------------------- */

static void more_splits_than_keys_ignore_workspace(void **state) {
  const rel_env *env = REL_ENV(state);
  for (size_t di = rel_quick() ? 2 : 0; di < 3; di++) /* quick: bf16 */
    for (int variant = 0; variant < 3; variant++) {
      fd_case c = rel_case(env);
      c.dtype = all_dtypes[di];
      c.head_dim = 128;
      c.num_heads_q = 8;
      c.num_heads_kv = 2;
      c.batch = 3;
      c.kv_len[0] = 1, c.kv_len[1] = 3, c.kv_len[2] = 700;
      c.q_len = variant == 1 ? 3 : 1; /* q_len 3: rows of sequence 0 see no key */
      c.page_size = variant == 2 ? 16 : 0;
      c.with_lse = 1;
      c.kv_capacity_pad = 2048 - 700; /* 32 chunks */
      fd_case_data *d = rel_data(env, &c);
      fd_plan plan = rel_plan(d, 32);
      assert_int_equal(plan.num_splits, 32);
      fd_case_output nan_ws, zero_ws, big_ws;
      rel_data_run(d, &plan, 0xff, "workspace of NaN", &nan_ws);
      rel_data_run(d, &plan, 0x00, "workspace of zeros", &zero_ws);
      rel_data_run(d, &plan, 0x7f, "workspace of huge floats", &big_ws);
      char what[1200];
      snprintf(what, sizeof what, "%s: out, NaN vs zero workspace", fd_case_data_name(d));
      rel_assert_same(nan_ws.out_bytes, zero_ws.out_bytes, nan_ws.out_size, what);
      rel_assert_same(nan_ws.out_bytes, big_ws.out_bytes, nan_ws.out_size, what);
      snprintf(what, sizeof what, "%s: lse, NaN vs zero workspace", fd_case_data_name(d));
      rel_assert_same(nan_ws.lse_bytes, zero_ws.lse_bytes, nan_ws.lse_size, what);
      rel_assert_same(nan_ws.lse_bytes, big_ws.lse_bytes, nan_ws.lse_size, what);
      fd_case_output_free(&nan_ws);
      fd_case_output_free(&zero_ws);
      fd_case_output_free(&big_ws);
      fd_case_data_free(d);
    }
}

/* ---- split-count independence ------------------------------------------------------ */

/* Largest distance between a and b (dense outputs of one case) in units in
 * the last place of the dtype at each row's largest |value| (a row of
 * head_dim elements shares one scale: an element that is small by
 * cancellation carries the absolute error of the row). */
static double ulp_distance(fd_dtype dtype, const double *a, const double *b, size_t rows, int32_t head_dim) {
  double worst = 0.0;
  for (size_t r = 0; r < rows; r++) {
    double m = 0.0, d = 0.0;
    for (int32_t i = 0; i < head_dim; i++) {
      m = fmax(m, fmax(fabs(a[r * head_dim + i]), fabs(b[r * head_dim + i])));
      const double x = fabs(a[r * head_dim + i] - b[r * head_dim + i]);
      if (!(x <= d)) d = x;
    }
    if (d == 0.0) continue;
    d /= fd_dtype_ulp(dtype, m);
    if (!(d <= worst)) worst = d; /* NaN sticks */
  }
  return worst;
}

static void split_counts_1_to_64_agree(void **state) {
  const rel_env *env = REL_ENV(state);
  for (size_t di = 0; di < 3; di++)
    for (int variant = 0; variant < 2; variant++) {
      if (rel_quick() && !((di == 2 && variant == 0) || (di == 0 && variant == 1))) continue;
      fd_case c = rel_case(env);
      c.dtype = all_dtypes[di];
      c.head_dim = variant ? 64 : 128;
      c.num_heads_q = 8;
      c.num_heads_kv = variant ? 1 : 2;
      c.batch = 3;
      c.kv_len[0] = 4097, c.kv_len[1] = 1000, c.kv_len[2] = 64;
      c.q_len = variant ? 2 : 1;
      c.page_size = variant ? 16 : 0;
      c.layout = variant ? FD_LAYOUT_NONCONTIG : FD_LAYOUT_CONTIG;
      c.with_lse = 1;
      fd_case_data *d = rel_data(env, &c);
      fd_plan one = rel_plan(d, 1);
      fd_case_output base;
      rel_data_run(d, &one, 0xff, "1 split", &base);
      const size_t rows = (size_t)c.batch * c.q_len * c.num_heads_q;
      double worst = 0.0;
      int32_t worst_at = 1;
      for (int32_t s = 2; s <= 64; s++) {
        if (rel_quick() && s != 2 && s != 3 && s != 7 && s != 16 && s != 64) continue;
        fd_plan plan = rel_plan(d, s);
        assert_int_equal(plan.num_splits, s);
        char what[32];
        snprintf(what, sizeof what, "%d splits", s);
        fd_case_output o;
        rel_data_run(d, &plan, 0xff, what, &o);
        const double dist = ulp_distance(c.dtype, base.out, o.out, rows, c.head_dim);
        if (!(dist <= worst)) worst = dist, worst_at = s;
        fd_case_output_free(&o);
      }
      /* f32 shows the float32 accumulation's own rounding: a sum of n terms
       * taken in another order differs by ~sqrt(n) ulps (a random walk); the
       * f32 bound is 4 sqrt(n) ulps (256 for 4097 keys, 3e-5 relative) */
      const double bound = c.dtype == F32 ? 4.0 * sqrt((double)c.kv_len[0]) : 2.0;
      printf("  %s: largest distance from 1 split: %.2f ulp at the row's max (%d splits; bound %.0f)\n",
             fd_case_data_name(d), worst, worst_at, bound);
      if (!(worst <= bound))
        fail_msg("%s: %d splits differ from 1 split by %.2f ulps of the dtype (> %.0f)", fd_case_data_name(d),
                 worst_at, worst, bound);
      fd_case_output_free(&base);
      fd_case_data_free(d);
    }
}

/* A paged cache filled one token at a time, as a server does: NaN in every
 * slot not yet written; every step runs a plan made once for the capacity
 * (automatic splits, as a CUDA graph would) and a plan made from the step's
 * lengths (kv_len_hint). Outputs must be finite at every step and match the
 * oracle at page and chunk boundaries and every 61st step. */
static void paged_cache_grown_token_by_token(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  enum { B = 2, HQ = 8, HKV = 2, D = 64, P = 16, CAP = 2048, MAXP = CAP / P, POOL = 2 * MAXP + 5 };
  const fd_dtype dtypes[2] = {BF16, F32};
  for (int di = 0; di < (rel_quick() ? 1 : 2); di++) {
    const fd_dtype dt = dtypes[di];
    const size_t es = fd_dtype_size(dt);
    const size_t page_elems = (size_t)P * HKV * D, pool_elems = POOL * page_elems;
    const size_t q_elems = (size_t)B * HQ * D;
    uint64_t rng = env->seed ^ (0x51ull + (uint64_t)di);
    /* host pool and block table; pages handed out in shuffled order */
    unsigned char *k = malloc(pool_elems * es), *v = malloc(pool_elems * es), *q = malloc(q_elems * es);
    int32_t bt[B * MAXP], perm[POOL];
    assert_non_null(k);
    assert_non_null(v);
    assert_non_null(q);
    for (size_t i = 0; i < pool_elems; i++)
      rel_store(dt, k, (int64_t)i, NAN), rel_store(dt, v, (int64_t)i, NAN);
    for (int i = 0; i < POOL; i++) perm[i] = i;
    for (int i = POOL - 1; i > 0; i--) {
      int j = (int)(next_u64(&rng) % (uint64_t)(i + 1)), tmp = perm[i];
      perm[i] = perm[j], perm[j] = tmp;
    }
    for (int i = 0; i < B * MAXP; i++) bt[i] = perm[i];
    void *dk = rel_alloc(be, pool_elems * es), *dv = rel_alloc(be, pool_elems * es);
    void *dq = rel_alloc(be, q_elems * es);
    int32_t *dbt = rel_alloc(be, sizeof bt), *dkv = rel_alloc(be, B * sizeof(int32_t));
    rel_put(be, dk, k, pool_elems * es);
    rel_put(be, dv, v, pool_elems * es);
    rel_put(be, dbt, bt, sizeof bt);

    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = be;
    p.dtype = dt;
    p.batch = B;
    p.num_heads_q = HQ;
    p.num_heads_kv = HKV;
    p.head_dim = D;
    p.page_size = P;
    p.max_pages_per_seq = MAXP;
    p.num_pages = POOL;
    /* CPU: plan for 32 threads, so that the automatic count splits these 4
     * (sequence, kv head) items (1 to 8 splits as the cache grows); CUDA: the
     * device's multiprocessors */
    p.num_threads = be == FD_BACKEND_CPU ? 32 : 0;
    fd_plan fixed;
    fd_error err;
    if (fd_plan_init(&fixed, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    fd_tensors t;
    memset(&t, 0, sizeof t);
    t.q = dq;
    t.k_cache = dk;
    t.v_cache = dv;
    t.kv_len = dkv;
    t.block_table = dbt;
    fd_tensors host = t;
    const int64_t s3[3] = {(int64_t)HQ * D, (int64_t)HQ * D, D},
                  kv3[3] = {(int64_t)P * HKV * D, (int64_t)HKV * D, D};
    memcpy(host.q_strides, s3, sizeof s3);
    memcpy(host.k_strides, kv3, sizeof kv3);
    memcpy(host.v_strides, kv3, sizeof kv3);
    host.block_table_stride = MAXP;
    host.q = q, host.k_cache = k, host.v_cache = v, host.block_table = bt;

    unsigned char *out = malloc(q_elems * es);
    float lse[B * HQ];
    assert_non_null(out);
    /* outputs and a workspace for the most splits any plan here can have (one per chunk) */
    fd_problem pmax = p;
    pmax.num_splits = CAP / 64;
    fd_plan most;
    if (fd_plan_init(&most, &pmax, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    unsigned char *dout = rel_alloc(be, q_elems * es), *dws = rel_alloc(be, most.workspace_size);
    float *dlse = rel_alloc(be, sizeof lse);
    t.out = dout;
    t.lse = dlse;
    int32_t kv_len[B] = {0, 0};
    int checked = 0, ran = 0, max_hinted = 0;
    /* FD_TEST_QUICK (compute-sanitizer): every token is still appended one at
     * a time, but only 16 steps (the start, page and chunk boundaries, the
     * end) run the attention */
    const int quick = rel_quick();
    for (int step = 1; step <= CAP; step++) {
      const int32_t want[B] = {step, (step + 1) / 2};
      for (int b = 0; b < B; b++)
        while (kv_len[b] < want[b]) { /* append token kv_len[b] of sequence b */
          const int32_t j = kv_len[b], page = bt[b * MAXP + j / P];
          const size_t at = (size_t)page * page_elems + (size_t)(j % P) * HKV * D;
          for (size_t i = 0; i < (size_t)HKV * D; i++) {
            rel_store(dt, k, (int64_t)(at + i), next_unit(&rng) * 2.0);
            rel_store(dt, v, (int64_t)(at + i), next_unit(&rng));
          }
          rel_put(be, (char *)dk + at * es, k + at * es, (size_t)HKV * D * es);
          rel_put(be, (char *)dv + at * es, v + at * es, (size_t)HKV * D * es);
          kv_len[b]++;
        }
      const int check = step <= 17 || step % 61 == 0 || step % P <= 1 || step % 64 == 63 || step == CAP;
      const int quick_step = step <= 5 || step == 16 || step == 17 || step == 63 || step == 64 ||
                             step == 65 || step == 127 || step == 128 || step == 129 || step == 1000 ||
                             step >= CAP - 1;
      if (quick && !quick_step) continue;
      for (size_t i = 0; i < q_elems; i++) rel_store(dt, q, (int64_t)i, next_unit(&rng) * 3.0);
      rel_put(be, dq, q, q_elems * es);
      rel_put(be, dkv, kv_len, sizeof kv_len);
      fd_problem ph = p;
      ph.kv_len_hint = kv_len;
      fd_plan hinted;
      if (fd_plan_init(&hinted, &ph, &err) != FD_STATUS_OK) fail_msg("plan with hint: %s", err.message);
      if (hinted.num_splits > max_hinted) max_hinted = hinted.num_splits;
      double *ref = NULL, *ref_lse = NULL;
      if (check) {
        host.kv_len = kv_len;
        rel_oracle(&p, &host, &ref, &ref_lse);
        checked++;
      }
      for (int which = 0; which < 2; which++) {
        const fd_plan *plan = which ? &hinted : &fixed;
        rel_fill(be, dout, 0xff, q_elems * es);
        rel_fill(be, dlse, 0xff, sizeof lse);
        rel_fill(be, dws, 0xff, most.workspace_size);
        if (plan->workspace_size > most.workspace_size) fail_msg("test bug: workspace too small");
        fd_status st = fd_run(plan, &t, dws, plan->workspace_size, NULL, &err);
        if (st != FD_STATUS_OK) fail_msg("step %d: fd_run: %s", step, err.message);
        rel_sync(be);
        rel_get(be, out, dout, q_elems * es);
        rel_get(be, lse, dlse, sizeof lse);
        ran++;
        for (size_t i = 0; i < q_elems; i++)
          if (!isfinite(rel_load(dt, out, (int64_t)i)))
            fail_msg("step %d (kv_len %d, %d; %s plan, %d splits): out[%zu] is not finite", step, kv_len[0],
                     kv_len[1], which ? "hinted" : "capacity", plan->num_splits, i);
        for (int i = 0; i < B * HQ; i++)
          if (!isfinite(lse[i])) fail_msg("step %d: lse[%d] = %g is not finite", step, i, (double)lse[i]);
        if (check) {
          char what[96];
          snprintf(what, sizeof what, "growth step %d, %s plan (%d splits)", step,
                   which ? "hinted" : "capacity", plan->num_splits);
          /* no calibration here: twice the floor (fp32 accumulation, one rounding) */
          if (rel_check_dense(&p, kv_len, out, lse, ref, ref_lse, 2.0, 0.0, 0.0, what))
            fail_msg("%s: wrong result", what);
        }
      }
      free(ref);
      free(ref_lse);
    }
    printf(
        "  paged growth %s: %d tokens appended one by one, %d runs, %d checked against the oracle; capacity "
        "plan %d "
        "splits, hinted plans up to %d\n",
        dt == BF16 ? "bf16" : "f32", CAP, ran, checked, fixed.num_splits, max_hinted);
    rel_free(be, dout);
    rel_free(be, dws);
    rel_free(be, dlse);
    free(out);
    free(k);
    free(v);
    free(q);
    rel_free(be, dk);
    rel_free(be, dv);
    rel_free(be, dq);
    rel_free(be, dbt);
    rel_free(be, dkv);
  }
}

/* ---- poisoned padding ------------------------------------------------------------------ */

static void unread_slots_nan_inf_change_nothing(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int variant = 0; variant < 5; variant++) {
    if (rel_quick() && variant != 1 && variant != 4) continue;
    fd_case c = rel_case(env);
    c.num_heads_q = 8;
    c.num_heads_kv = 2;
    c.batch = 3;
    c.kv_len[0] = 97, c.kv_len[1] = 1, c.kv_len[2] = 300;
    c.with_lse = 1;
    c.kv_capacity_pad = 200;
    switch (variant) {
      case 0:
        c.dtype = F32, c.head_dim = 64, c.q_len = 2;
        break;
      case 1:
        c.dtype = BF16, c.head_dim = 128, c.page_size = 16, c.layout = FD_LAYOUT_NONCONTIG;
        break;
      case 2:
        c.dtype = F16, c.head_dim = 64, c.page_size = 1, c.q_len = 4;
        break;
      case 3:
        c.dtype = BF16, c.head_dim = 256, c.layout = FD_LAYOUT_HEAD_MAJOR, c.page_size = 64;
        break;
      default: /* a window: the keys before it are padding too; sinks and a soft-cap */
        c.dtype = BF16, c.head_dim = 128, c.page_size = 16, c.q_len = 3, c.has_window = 1, c.window_left = 100;
        c.sinks = 1, c.logits_soft_cap = 30.0f;
        break;
    }
    fd_case_data *d = rel_data(env, &c);
    const int32_t splits[3] = {1, 7, 0};
    for (int si = rel_quick() ? 1 : 0; si < (rel_quick() ? 2 : 3); si++) {
      fd_plan plan = rel_plan(d, splits[si]);
      fd_case_output runs[3];
      const fd_pad_fill fills[3] = {FD_PAD_ZERO, FD_PAD_NAN, FD_PAD_NONFINITE};
      const char *names[3] = {"padding zero", "padding NaN", "padding NaN/+inf/-inf"};
      for (int f = 0; f < 3; f++) {
        if (fd_case_data_fill_padding(d, fills[f])) fail_msg("could not fill the padding");
        rel_data_run(d, &plan, 0xff, names[f], &runs[f]);
      }
      for (int f = 1; f < 3; f++) {
        char what[1200];
        snprintf(what, sizeof what, "%s, %d splits: %s vs zero padding", fd_case_data_name(d),
                 plan.num_splits, names[f]);
        rel_assert_same(runs[0].out_bytes, runs[f].out_bytes, runs[0].out_size, what);
        rel_assert_same(runs[0].lse_bytes, runs[f].lse_bytes, runs[0].lse_size, what);
      }
      for (int f = 0; f < 3; f++) fd_case_output_free(&runs[f]);
    }
    fd_case_data_free(d);
  }
}

/* ---- lse --------------------------------------------------------------------------------- */

static void lse_matches_f64_every_split_count(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int variant = rel_quick() ? 1 : 0; variant < (rel_quick() ? 2 : 3); variant++) {
    fd_case c = rel_case(env);
    c.with_lse = 1;
    switch (variant) {
      case 0:
        c.dtype = F32, c.head_dim = 64, c.num_heads_q = 8, c.num_heads_kv = 2, c.batch = 3, c.q_len = 1;
        c.kv_len[0] = 4097, c.kv_len[1] = 100, c.kv_len[2] = 0;
        break;
      case 1:
        c.dtype = BF16, c.head_dim = 128, c.num_heads_q = 16, c.num_heads_kv = 1, c.batch = 2, c.q_len = 2;
        c.kv_len[0] = 2500, c.kv_len[1] = 65, c.page_size = 16, c.layout = FD_LAYOUT_NONCONTIG;
        break;
      default:
        c.dtype = F16, c.head_dim = 256, c.num_heads_q = 4, c.num_heads_kv = 4, c.batch = 1, c.q_len = 1;
        c.kv_len[0] = 4200, c.softmax_scale = 0.5f; /* large scores */
        break;
    }
    fd_case_data *d = rel_data(env, &c);
    const int32_t splits[] = {1, 2, 3, 5, 8, 16, 33, 64, 0};
    for (size_t si = 0; si < sizeof splits / sizeof *splits; si++) {
      if (rel_quick() && splits[si] != 1 && splits[si] != 8 && splits[si] != 0) continue;
      fd_plan plan = rel_plan(d, splits[si]);
      char what[48];
      snprintf(what, sizeof what, "lse, %d splits", plan.num_splits);
      rel_data_run(d, &plan, 0xff, what, NULL); /* lse of every row vs float64 */
    }
    fd_case_data_free(d);
  }
}

/* Two halves of a cache, each run alone, merged by their lse in double: the
 * one-call out and lse. Dense caches: the second half starts at a shifted
 * k/v pointer; paged: at a shifted block_table pointer. */
static void lse_merge_of_halves_equals_one_call(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  for (int variant = 0; variant < 4; variant++) {
    if (rel_quick() && variant != 0 && variant != 3) continue;
    fd_case c = rel_case(env);
    c.dtype = all_dtypes[variant % 3];
    c.head_dim = variant == 1 ? 64 : 128;
    c.num_heads_q = 8;
    c.num_heads_kv = variant == 2 ? 8 : 2;
    c.batch = 2;
    const int32_t L = variant == 3 ? 4096 : 1000 + 16 * variant;
    c.kv_len[0] = c.kv_len[1] = L;
    c.q_len = 1;
    c.page_size = variant >= 2 ? 16 : 0;
    c.with_lse = 1;
    fd_case_data *d = rel_data(env, &c);
    const int32_t half = variant == 3 ? 1616 : L / 2 / 16 * 16; /* a page boundary */
    fd_plan full_plan = rel_plan(d, 0);
    fd_case_output full;
    rel_data_run(d, &full_plan, 0xff, "whole cache", &full);

    fd_tensors t = fd_case_data_tensors(d);
    const size_t es = fd_dtype_size(c.dtype);
    const int32_t D = c.head_dim, H = c.num_heads_q;
    const size_t rows = (size_t)c.batch * H, out_bytes = rows * D * es;
    unsigned char *o1 = malloc(out_bytes), *o2 = malloc(out_bytes);
    float *l1 = malloc(rows * sizeof(float)), *l2 = malloc(rows * sizeof(float));
    assert_non_null(o1);
    assert_non_null(o2);
    assert_non_null(l1);
    assert_non_null(l2);
    int32_t *dkv = rel_alloc(be, 2 * sizeof(int32_t));
    const int32_t splits[2] = {0, 7};
    for (int si = 0; si < (rel_quick() ? 1 : 2); si++) {
      fd_plan plan = rel_plan(d, splits[si]);
      fd_error err;
      /* first half: keys [0, half) */
      const int32_t kv1[2] = {half, half}, kv2[2] = {L - half, L - half};
      rel_put(be, dkv, kv1, sizeof kv1);
      fd_tensors t1 = t;
      t1.kv_len = dkv;
      if (rel_run_private(&plan, &t1, 0xff, NULL, o1, l1, &err) != FD_STATUS_OK)
        fail_msg("first half: %s", err.message);
      /* second half: keys [half, L) */
      rel_put(be, dkv, kv2, sizeof kv2);
      fd_tensors t2 = t1;
      /* the shifted view holds kv_capacity - half keys (dense) or
       * max_pages_per_seq - half / page_size block_table columns: a plan
       * that says so (with the whole capacity, the view's extent would run
       * past the cache into other buffers, which fd_run refuses) */
      fd_problem p2 = plan.problem;
      if (c.page_size == 0) {
        t2.k_cache = (const char *)t.k_cache + (size_t)half * t.k_strides[1] * es;
        t2.v_cache = (const char *)t.v_cache + (size_t)half * t.v_strides[1] * es;
        p2.kv_capacity -= half;
      } else {
        t2.block_table = t.block_table + half / c.page_size;
        if (t2.block_table_stride == 0) t2.block_table_stride = p2.max_pages_per_seq;
        p2.max_pages_per_seq -= half / c.page_size;
        p2.kv_capacity = p2.max_pages_per_seq * c.page_size;
      }
      fd_plan plan2;
      if (fd_plan_init(&plan2, &p2, &err) != FD_STATUS_OK) fail_msg("second half plan: %s", err.message);
      if (rel_run_private(&plan2, &t2, 0xff, NULL, o2, l2, &err) != FD_STATUS_OK)
        fail_msg("second half: %s", err.message);
      /* merge and compare, row by row (dense out rows = (b, h), lse rows the same) */
      int bad = 0;
      for (size_t r = 0; r < rows; r++) {
        const double a = l1[r], b = l2[r], m = fmax(a, b);
        const double wa = exp(a - m), wb = exp(b - m), lse = m + log(wa + wb);
        double worst = 0.0, rowmax = 0.0;
        for (int32_t i = 0; i < D; i++) {
          const double merged = (wa * rel_load(c.dtype, o1, (int64_t)r * D + i) +
                                 wb * rel_load(c.dtype, o2, (int64_t)r * D + i)) /
                                (wa + wb);
          const double one = full.out[r * D + i];
          rowmax = fmax(rowmax, fabs(one));
          if (!(fabs(merged - one) <= worst)) worst = fabs(merged - one);
        }
        /* both halves and the whole are rounded to the dtype once: two ulps
         * at the row's largest value, plus the float32 accumulation floor */
        const double tol = 2.0 * fd_dtype_ulp(c.dtype, rowmax) + 1e-5 * rowmax;
        const double ltol = fd_tol_lse(c.dtype) * fmax(1.0, fabs(full.lse[r]));
        if (!(worst <= tol) || !(fabs(lse - full.lse[r]) <= ltol)) {
          if (bad++ < 5)
            fprintf(stderr,
                    "FAIL %s, %d splits, row %zu: merged halves differ from one call by %.3g (tol %.3g); lse "
                    "%.9g vs %.9g\n",
                    fd_case_data_name(d), plan.num_splits, r, worst, tol, lse, full.lse[r]);
        }
      }
      if (bad)
        fail_msg("%s: merging two halves by lse differs from one call in %d rows", fd_case_data_name(d), bad);
    }
    rel_free(be, dkv);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    fd_case_output_free(&full);
    fd_case_data_free(d);
  }
}

/* ---- extreme logits ------------------------------------------------------------------------- */

static void huge_logits_right_and_finite(void **state) {
  const rel_env *env = REL_ENV(state);
  /* input_scale x: scores have a standard deviation of about 2 x^2 */
  const struct {
    fd_dtype dtype;
    float input_scale, softmax_scale;
  } kinds[] = {
      {F32, 700.0f, 0.0f},  /* scores of +-1e6 */
      {F32, 0.0f, 1.0e4f},  /* a huge softmax_scale */
      {BF16, 300.0f, 0.0f}, /* large-norm bf16: |q|, |k| ~ 300 sqrt(d) */
      {F16, 30.0f, 0.0f},   /* large-norm f16 (|x| stays far below 65504) */
  };
  for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
    const int32_t splits[3] = {1, 7, 0};
    for (int si = rel_quick() ? 1 : 0; si < (rel_quick() ? 2 : 3); si++) {
      fd_case c = rel_case(env);
      c.dtype = kinds[ki].dtype;
      c.input_scale = kinds[ki].input_scale;
      c.softmax_scale = kinds[ki].softmax_scale;
      c.head_dim = 128;
      c.num_heads_q = 4;
      c.num_heads_kv = 2;
      c.batch = 2;
      c.kv_len[0] = 1000, c.kv_len[1] = 77;
      c.q_len = 2;
      c.num_splits = splits[si];
      c.with_lse = 1;
      c.check_determinism = 1;
      rel_run_case(env, &c);
    }
  }
}

/*
 * Exact scores. q and k hold small integers in dimensions 0..d-2 (dot
 * products exact in float32); dimension d-1 is a bias: q[h][d-1] = 1 and
 * k[j][d-1] = the key's offset, spread over [-spread, spread] with four keys
 * at the top sharing nearly the same offset (so the softmax mixes a few keys).
 * A shift c is added to every offset, i.e. to every score; softmax_scale 1.
 * f32 offsets are integers (exact below 2^24); bf16 offsets are a * 4096 with
 * |a| < 256 (exact in bf16), shifts multiples of 4096.
 *
 * CPU: every score and every difference s_j - max is exact in float32, so out
 * is bitwise the same for every shift and matches float64 to the float32
 * floor; lse moves by exactly the shift (to the lse tolerance).
 * CUDA scales q by softmax_scale * log2(e) first, so its scores carry an
 * absolute error of order |s| 2^-22: it must match float64 within the weight
 * error that implies when that is small (|s| up to ~1e5), and for every shift
 * give finite out inside the values' range and lse(0) + shift.
 */
static void exact_shift_case(const rel_env *env, fd_dtype dt, double spread, const double *shifts,
                             int nshift) {
  const fd_backend be = env->backend;
  enum { HQ = 4, D = 64, L = 1000 };
  const size_t es = fd_dtype_size(dt);
  const double unit = dt == F32 ? 1.0 : 4096.0;
  uint64_t rng = env->seed ^ (uint64_t)(spread * 7.0) ^ (dt == F32 ? 0x1111ull : 0x2222ull);
  const size_t q_bytes = (size_t)HQ * D * es, kv_bytes = (size_t)L * D * es;
  unsigned char *q = malloc(q_bytes), *k = malloc(kv_bytes), *ks = malloc(kv_bytes), *v = malloc(kv_bytes);
  unsigned char *out0 = malloc(q_bytes), *out = malloc(q_bytes);
  assert_true(q && k && ks && v && out0 && out);
  double vmin[D], vmax[D];
  for (int i = 0; i < D; i++) vmin[i] = INFINITY, vmax[i] = -INFINITY;
  const double top = floor(spread / unit) - 8.0; /* in units */
  for (int j = 0; j < L; j++) {
    for (int i = 0; i < D - 1; i++)
      rel_store(dt, k, (int64_t)j * D + i, (double)((int)(next_u64(&rng) % 9) - 4));
    /* f32: anywhere in [-top, top]; bf16: [-4, top], so that every shift keeps |a| < 256 */
    double off =
        dt == F32 ? floor(next_unit(&rng) * top) : floor((next_unit(&rng) + 1.0) * 0.5 * (top + 4.0)) - 4.0;
    if (j % 250 == 7) off = top - (double)(j / 250 == 3 ? 4 : j / 250);
    rel_store(dt, k, (int64_t)j * D + D - 1, off);
    for (int i = 0; i < D; i++) {
      rel_store(dt, v, (int64_t)j * D + i, next_unit(&rng));
      const double x = rel_load(dt, v, (int64_t)j * D + i);
      vmin[i] = fmin(vmin[i], x), vmax[i] = fmax(vmax[i], x);
    }
  }
  for (int h = 0; h < HQ; h++) {
    for (int i = 0; i < D - 1; i++) rel_store(dt, q, h * D + i, (double)((int)(next_u64(&rng) % 7) - 3));
    rel_store(dt, q, h * D + D - 1, unit);
  }
  void *dq = rel_alloc(be, q_bytes), *dk = rel_alloc(be, kv_bytes), *dv = rel_alloc(be, kv_bytes);
  int32_t *dkv = rel_alloc(be, sizeof(int32_t));
  const int32_t kv_len = L;
  rel_put(be, dq, q, q_bytes);
  rel_put(be, dv, v, kv_bytes);
  rel_put(be, dkv, &kv_len, sizeof kv_len);
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = be;
  p.dtype = dt;
  p.batch = 1;
  p.num_heads_q = HQ;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.kv_capacity = L;
  p.softmax_scale = 1.0f;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = dq, t.k_cache = dk, t.v_cache = dv, t.kv_len = dkv;
  fd_tensors host = t;
  const int64_t q3[3] = {HQ * D, HQ * D, D}, k3[3] = {(int64_t)L * D, D, D};
  memcpy(host.q_strides, q3, sizeof q3);
  memcpy(host.k_strides, k3, sizeof k3);
  memcpy(host.v_strides, k3, sizeof k3);
  host.q = q, host.k_cache = ks, host.v_cache = v, host.kv_len = &kv_len;
  float lse0[HQ], lse[HQ];
  const int32_t splits[3] = {1, 5, 0};
  for (int si = rel_quick() ? 1 : 0; si < (rel_quick() ? 2 : 3); si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    for (int ci = 0; ci < nshift; ci++) {
      const double c_units = shifts[ci] / unit;
      double smax = 0.0;
      for (int j = 0; j < L; j++) {
        const double off = rel_load(dt, k, (int64_t)j * D + D - 1) + c_units;
        rel_store(dt, ks, (int64_t)j * D + D - 1, off);
        if (rel_load(dt, ks, (int64_t)j * D + D - 1) != off)
          fail_msg("test bug: offset %g is not exact", off);
        for (int i = 0; i < D - 1; i++)
          rel_store(dt, ks, (int64_t)j * D + i, rel_load(dt, k, (int64_t)j * D + i));
        smax = fmax(smax, fabs(off * unit) + 63.0 * 12.0);
      }
      rel_put(be, dk, ks, kv_bytes);
      unsigned char *o = ci ? out : out0;
      float *l = ci ? lse : lse0;
      if (rel_run_private(&plan, &t, 0xff, NULL, o, l, &err) != FD_STATUS_OK)
        fail_msg("fd_run: %s", err.message);
      double *ref, *ref_lse;
      rel_oracle(&p, &host, &ref, &ref_lse);
      char what[160];
      snprintf(what, sizeof what, "%s exact scores up to %.3g, shift %g, %d splits",
               dt == F32 ? "f32" : "bf16", smax, shifts[ci], plan.num_splits);
      for (int h = 0; h < HQ; h++) {
        if (!isfinite(l[h])) fail_msg("%s: lse[%d] = %g", what, h, (double)l[h]);
        for (int i = 0; i < D; i++) {
          const double x = rel_load(dt, o, h * D + i);
          const double slack = fd_tol_out_floor(dt) * fmax(fabs(vmin[i]), fabs(vmax[i]));
          if (!isfinite(x) || x < vmin[i] - slack || x > vmax[i] + slack)
            fail_msg("%s: out[%d][%d] = %g outside the values' range [%g, %g]", what, h, i, x, vmin[i],
                     vmax[i]);
        }
      }
      /* absolute score error (natural units) of a kernel that scales q by log2(e) in float32 */
      const double eps = be == FD_BACKEND_CPU ? 0.0 : 4.0 * smax * 0x1.0p-24;
      if (eps < 0.02) {
        /* weights off by at most 2 eps: out off by (e^{2 eps} - 1) max|v| <= that (|v| < 1) */
        if (rel_check_dense(&p, &kv_len, o, l, ref, ref_lse, 1.0, expm1(2.0 * eps), eps, what))
          fail_msg("%s: wrong result", what);
      }
      if (ci) {
        if (be == FD_BACKEND_CPU) rel_assert_same(out0, out, q_bytes, what);
        for (int h = 0; h < HQ; h++) {
          /* both lse are float32: each carries half an ulp of its magnitude */
          const double want = (double)lse0[h] + shifts[ci];
          const double tol = fd_tol_lse(dt) * fmax(1.0, fabs(want)) + fd_dtype_ulp(F32, lse0[h]) +
                             fd_dtype_ulp(F32, l[h]) + 2.0 * eps;
          if (!(fabs((double)l[h] - want) <= tol))
            fail_msg("%s: lse[%d] = %.9g, want lse(shift 0) + shift = %.9g", what, h, (double)l[h], want);
        }
      }
      free(ref);
      free(ref_lse);
    }
  }
  rel_free(be, dq);
  rel_free(be, dk);
  rel_free(be, dv);
  rel_free(be, dkv);
  free(q), free(k), free(ks), free(v), free(out0), free(out);
}

static void score_shift_moves_only_lse(void **state) {
  const rel_env *env = REL_ENV(state);
  const double f32_big[] = {0.0, 1e3, -3e4, 1e6, -1e6, 3e6, -7e6};
  const double f32_small[] = {0.0, 1e3, -3e4, 1e5};
  const double bf16_big[] = {0.0, 8.0 * 4096.0, -100.0 * 4096.0, -240.0 * 4096.0};
  exact_shift_case(env, F32, 1e6, f32_big, 7);
  exact_shift_case(env, F32, 1e3, f32_small, 4);
  exact_shift_case(env, BF16, 244.0 * 4096.0, bf16_big, 4);
}

/* ---- precision with 256 splits ------------------------------------------------------------ */

static void bf16_256_splits_as_accurate_as_one(void **state) {
  const rel_env *env = REL_ENV(state);
  fd_case c = rel_case(env);
  c.dtype = BF16;
  c.head_dim = 128;
  c.num_heads_q = 8;
  c.num_heads_kv = 2;
  c.batch = 2;
  c.kv_len[0] = 16400, c.kv_len[1] = 16384;
  c.q_len = 1;
  c.with_lse = 1;
  c.kv_capacity_pad = 240; /* 16640 keys: 260 chunks */
  fd_case_data *d = rel_data(env, &c);
  fd_plan one = rel_plan(d, 1), many = rel_plan(d, 256);
  assert_int_equal(many.num_splits, 256);
  fd_case_output o1, o256;
  rel_data_run(d, &one, 0xff, "1 split", &o1);
  rel_data_run(d, &many, 0xff, "256 splits", &o256);
  const double *ref = fd_case_data_ref_out(d);
  const size_t n = (size_t)c.batch * c.num_heads_q * c.head_dim;
  double e1_max = 0.0, e256_max = 0.0;
  int bad = 0;
  /* per element, one ulp at the row's largest |ref|: an element small by
   * cancellation carries the row's float32 accumulation error, not its own */
  const int32_t D = c.head_dim;
  for (size_t i = 0; i < n; i++) {
    double row_max = 0.0;
    for (int32_t k = 0; k < D; k++) row_max = fmax(row_max, fabs(ref[i / D * D + k]));
    const double e1 = fabs(o1.out[i] - ref[i]), e256 = fabs(o256.out[i] - ref[i]);
    const double ulp = fd_dtype_ulp(BF16, row_max);
    e1_max = fmax(e1_max, e1), e256_max = fmax(e256_max, e256);
    if (!(e256 <= e1 + ulp) && bad++ < 5)
      fprintf(stderr, "FAIL element %zu: 256-split error %.3g > 1-split error %.3g + 1 ulp (%.3g)\n", i, e256,
              e1, ulp);
  }
  printf("  bf16: largest error vs float64: 1 split %.3g, 256 splits %.3g\n", e1_max, e256_max);
  if (bad) fail_msg("256 splits: %d elements have an error above the 1-split error plus one bf16 ulp", bad);
  fd_case_output_free(&o1);
  fd_case_output_free(&o256);
  fd_case_data_free(d);
}

rel_group rel_group_numerics(fd_backend backend) {
  (void)backend;
  static const struct CMUnitTest tests[] = {
      {"empty_rows_out_zero_lse_neg_inf", empty_rows_out_zero_lse_neg_inf, NULL, NULL, NULL},
      {"more_splits_than_keys_ignore_workspace", more_splits_than_keys_ignore_workspace, NULL, NULL, NULL},
      {"split_counts_1_to_64_agree", split_counts_1_to_64_agree, NULL, NULL, NULL},
      {"paged_cache_grown_token_by_token", paged_cache_grown_token_by_token, NULL, NULL, NULL},
      {"unread_slots_nan_inf_change_nothing", unread_slots_nan_inf_change_nothing, NULL, NULL, NULL},
      {"lse_matches_f64_every_split_count", lse_matches_f64_every_split_count, NULL, NULL, NULL},
      {"lse_merge_of_halves_equals_one_call", lse_merge_of_halves_equals_one_call, NULL, NULL, NULL},
      {"huge_logits_right_and_finite", huge_logits_right_and_finite, NULL, NULL, NULL},
      {"score_shift_moves_only_lse", score_shift_moves_only_lse, NULL, NULL, NULL},
      {"bf16_256_splits_as_accurate_as_one", bf16_256_splits_as_accurate_as_one, NULL, NULL, NULL},
  };
  rel_group g = {"numerics", tests, sizeof tests / sizeof *tests};
  return g;
}
