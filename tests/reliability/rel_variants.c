/*
 * rel_variants.c — the attention variants and the deterministic mode under
 * hostile inputs (every test runs on the CPU and on the CUDA backend):
 *   window    sliding windows of 0 keys up to more than the cache, across
 *             chunk and page boundaries, q_len 1..16, every split count kind,
 *             empty rows: right against float64, never NaN; keys before
 *             the first row's window chunk (never read) poisoned with NaN and
 *             inf: bitwise equal to zeros there
 *   softcap   caps from 1e-3 to 1e30, scores up to +-3e4 (capped at 30):
 *             finite and right
 *   sinks     sinks from -inf to 1e30 beside NaN and +inf ones: a NaN / +inf
 *             sink's head is NaN, every other head right; rows that see no
 *             key get out 0 and lse = the sink
 *   noncausal q_len up to 128 over kv_len 0..cap: every row sees every key;
 *             keys at or past kv_len poisoned: bitwise equal to zeros there
 *   out_f32   a float32 out of 16-bit inputs: right, and within one 16-bit
 *             ulp of the 16-bit out's value
 *   combined  window + soft-cap + sinks + fp32 out + paged + deterministic
 *   deterministic  a sequence's bits alone (batch 1, kv_capacity = its
 *             length) and in a batch of 8 ragged others (larger capacity,
 *             another thread count / sm_count, a kv_len_hint, a workspace full
 *             of NaN) are the same, with and without variants
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rel.h"
#include "split.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16
#define MAX_B 16

static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) * 0x1.0p-53 * 2.0 - 1.0; }

/* ---- A problem's tensors, on the host and where the backend computes ------------------ */

typedef struct vcase {
  fd_backend be;
  fd_problem p; /* as given to fd_plan_init (backend = be) */
  int32_t kv_len[MAX_B];
  int32_t max_pages, pages; /* paged: block_table columns, pool pages */
  size_t esize, q_elems, kv_elems;
  void *q, *k, *v;   /* host, dense: q [B][T][Hq][D]; k, v [B][cap][Hkv][D] or [pages][P][Hkv][D] */
  int32_t *bt;       /* host [B][max_pages] (paged) */
  float sinks[64];   /* host [Hq] */
  int with_sinks;
  void *dq, *dk, *dv; /* backend side */
  int32_t *dkv_len, *dbt;
  float *dsinks;
} vcase;

/* Element offset of key j of sequence b, kv head h, in k / v. */
static int64_t kv_at(const vcase *c, int32_t b, int32_t j, int32_t h) {
  const fd_problem *p = &c->p;
  int64_t slot;
  if (p->page_size > 0)
    slot = (int64_t)c->bt[b * c->max_pages + j / p->page_size] * p->page_size + j % p->page_size;
  else
    slot = (int64_t)b * p->kv_capacity + j;
  return (slot * p->num_heads_kv + h) * p->head_dim;
}

/* Random q, k, v in [-1, 1) (rounded to the dtype), a shuffled page pool,
 * sinks in [-2, 2) when with_sinks; copies on the backend's side. */
static void vcase_init(vcase *c, const rel_env *env, const fd_problem *p, const int32_t *kv_len,
                       int with_sinks, uint64_t salt) {
  memset(c, 0, sizeof *c);
  c->be = env->backend;
  c->p = *p;
  c->p.backend = env->backend;
  if (c->p.batch > MAX_B || c->p.num_heads_q > 64) fail_msg("test bug: batch or heads too large");
  memcpy(c->kv_len, kv_len, (size_t)p->batch * sizeof *kv_len);
  const int32_t B = p->batch, T = p->q_len > 0 ? p->q_len : 1, D = p->head_dim, P = p->page_size;
  c->esize = fd_dtype_size(p->dtype);
  c->q_elems = (size_t)B * T * p->num_heads_q * D;
  if (P > 0) {
    c->max_pages = p->max_pages_per_seq;
    c->pages = p->num_pages;
  }
  const size_t slots = P > 0 ? (size_t)c->pages * P : (size_t)B * p->kv_capacity;
  c->kv_elems = slots * p->num_heads_kv * D;
  c->q = malloc(c->q_elems * c->esize);
  c->k = malloc(c->kv_elems * c->esize);
  c->v = malloc(c->kv_elems * c->esize);
  if (!c->q || !c->k || !c->v) fail_msg("out of memory");
  uint64_t s = env->seed ^ salt;
  for (size_t i = 0; i < c->q_elems; i++) rel_store(p->dtype, c->q, (int64_t)i, next_unit(&s));
  for (size_t i = 0; i < c->kv_elems; i++) {
    rel_store(p->dtype, c->k, (int64_t)i, next_unit(&s));
    rel_store(p->dtype, c->v, (int64_t)i, next_unit(&s));
  }
  if (P > 0) {
    c->bt = malloc((size_t)B * c->max_pages * sizeof *c->bt);
    int32_t *perm = malloc((size_t)c->pages * sizeof *perm);
    if (!c->bt || !perm) fail_msg("out of memory");
    for (int32_t i = 0; i < c->pages; i++) perm[i] = i;
    for (int32_t i = c->pages - 1; i > 0; i--) {
      const int32_t j = (int32_t)(next_u64(&s) % (uint64_t)(i + 1)), x = perm[i];
      perm[i] = perm[j];
      perm[j] = x;
    }
    for (int32_t i = 0; i < B * c->max_pages; i++) c->bt[i] = perm[i % c->pages];
    free(perm);
  }
  c->with_sinks = with_sinks;
  for (int32_t h = 0; h < p->num_heads_q; h++) c->sinks[h] = (float)(2.0 * next_unit(&s));
  /* the backend's copies */
  c->dq = rel_alloc(c->be, c->q_elems * c->esize);
  c->dk = rel_alloc(c->be, c->kv_elems * c->esize);
  c->dv = rel_alloc(c->be, c->kv_elems * c->esize);
  c->dkv_len = rel_alloc(c->be, (size_t)B * sizeof(int32_t));
  c->dsinks = rel_alloc(c->be, 64 * sizeof(float));
  if (P > 0) c->dbt = rel_alloc(c->be, (size_t)B * c->max_pages * sizeof(int32_t));
}

/* Host -> backend (after the host tensors changed). */
static void vcase_upload(vcase *c) {
  rel_put(c->be, c->dq, c->q, c->q_elems * c->esize);
  rel_put(c->be, c->dk, c->k, c->kv_elems * c->esize);
  rel_put(c->be, c->dv, c->v, c->kv_elems * c->esize);
  rel_put(c->be, c->dkv_len, c->kv_len, (size_t)c->p.batch * sizeof(int32_t));
  rel_put(c->be, c->dsinks, c->sinks, 64 * sizeof(float));
  if (c->dbt) rel_put(c->be, c->dbt, c->bt, (size_t)c->p.batch * c->max_pages * sizeof(int32_t));
}

static void vcase_free(vcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->bt);
  rel_free(c->be, c->dq), rel_free(c->be, c->dk), rel_free(c->be, c->dv);
  rel_free(c->be, c->dkv_len), rel_free(c->be, c->dbt), rel_free(c->be, c->dsinks);
  memset(c, 0, sizeof *c);
}

/* The call's tensors: the backend's (device = 1) or the host's, dense
 * explicit strides (the oracle takes them as they are). */
static fd_tensors vcase_tensors(const vcase *c, int device) {
  const fd_problem *p = &c->p;
  const int64_t T = p->q_len > 0 ? p->q_len : 1, D = p->head_dim, Hq = p->num_heads_q, Hkv = p->num_heads_kv;
  const int64_t rows = p->page_size > 0 ? p->page_size : p->kv_capacity;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = device ? c->dq : c->q;
  t.k_cache = device ? c->dk : c->k;
  t.v_cache = device ? c->dv : c->v;
  t.kv_len = device ? c->dkv_len : c->kv_len;
  t.block_table = p->page_size > 0 ? (device ? c->dbt : c->bt) : NULL;
  t.block_table_stride = c->max_pages;
  t.sinks = c->with_sinks ? (device ? c->dsinks : c->sinks) : NULL;
  const int64_t q3[3] = {T * Hq * D, Hq * D, D}, kv3[3] = {rows * Hkv * D, Hkv * D, D}, l3[3] = {Hq * T, T, 1};
  memcpy(t.q_strides, q3, sizeof q3);
  memcpy(t.out_strides, q3, sizeof q3);
  memcpy(t.k_strides, kv3, sizeof kv3);
  memcpy(t.v_strides, kv3, sizeof kv3);
  memcpy(t.lse_strides, l3, sizeof l3);
  return t;
}

/* Runs c (plan from problem p, which may differ from c->p in what the
 * tensors do not depend on: splits, threads, hint, capacity, ...) into
 * host buffers out / lse (workspace filled with ws_fill); fails on a
 * non-OK status. */
static fd_plan vcase_run(const vcase *c, const fd_problem *p, unsigned char ws_fill, void *out, float *lse,
                         const char *what) {
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, p, &err) != FD_STATUS_OK) fail_msg("%s: fd_plan_init: %s", what, err.message);
  const fd_tensors t = vcase_tensors(c, 1);
  if (rel_run_private(&plan, &t, ws_fill, NULL, out, lse, &err) != FD_STATUS_OK)
    fail_msg("%s: fd_run: %s", what, err.message);
  return plan;
}

/* Runs c as given and checks it against the float64 oracle (factor 2, as the
 * other reliability tests); returns the plan, out / lse in the caller's
 * buffers when given. */
static fd_plan vcase_check(const vcase *c, const char *what, void *out_keep, float *lse_keep) {
  const size_t rows = (size_t)c->p.batch * (c->p.q_len > 0 ? c->p.q_len : 1) * c->p.num_heads_q;
  const fd_dtype odt = c->p.out_dtype ? c->p.out_dtype : c->p.dtype;
  void *out = out_keep ? out_keep : malloc(rows * c->p.head_dim * fd_dtype_size(odt));
  float *lse = lse_keep ? lse_keep : malloc(rows * sizeof(float));
  if (!out || !lse) fail_msg("out of memory");
  const fd_plan plan = vcase_run(c, &c->p, 0xff, out, lse, what);
  double *ref, *ref_lse;
  const fd_tensors host = vcase_tensors(c, 0);
  rel_oracle(&plan.problem, &host, &ref, &ref_lse);
  char full[256];
  snprintf(full, sizeof full, "%s (%s, %d splits)", what, fd_backend_name(c->be), plan.num_splits);
  if (rel_check_dense_sinks(&plan.problem, c->kv_len, c->with_sinks ? c->sinks : NULL, out, lse, ref, ref_lse,
                            2.0, 0.0, 0.0, full))
    fail_msg("%s: wrong result", full);
  free(ref);
  free(ref_lse);
  if (!out_keep) free(out);
  if (!lse_keep) free(lse);
  return plan;
}

/* A problem of the shapes the tests share. */
static fd_problem vproblem(const rel_env *env, fd_dtype dt, int32_t batch, int32_t q_len, int32_t hq, int32_t hkv,
                           int32_t d, int32_t cap, int32_t page_size) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = env->backend;
  p.dtype = dt;
  p.batch = batch;
  p.q_len = q_len;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = d;
  p.kv_capacity = cap;
  if (page_size > 0) {
    p.page_size = page_size;
    p.max_pages_per_seq = (cap + page_size - 1) / page_size;
    p.num_pages = batch * p.max_pages_per_seq + 2;
  }
  return p;
}

static const fd_dtype dtypes3[3] = {F32, F16, BF16};

/* ---- window --------------------------------------------------------------------------- */

static void window_edges(void **state) {
  const rel_env *env = REL_ENV(state);
  const int32_t windows[] = {0, 1, 63, 64, 65, 200, 5000};
  const int32_t qlens[] = {1, 4, 16};
  const int32_t splits[] = {0, 1, 7};
  const int32_t kv[6] = {0, 1, 64, 129, 700, 1000};
  const size_t nw = rel_quick() ? 2 : sizeof windows / sizeof *windows;
  for (size_t wi = 0; wi < nw; wi++)
    for (size_t qi = 0; qi < 3; qi++) {
      const fd_dtype dt = dtypes3[(wi + qi) % 3];
      const int32_t paged = (int32_t)((wi + qi) % 2) * 16;
      fd_problem p = vproblem(env, dt, 6, qlens[qi], 8, 2, 128, 1000, paged);
      p.has_window = 1;
      p.window_left = windows[wi];
      p.num_splits = splits[(wi + 2 * qi) % 3];
      vcase c;
      vcase_init(&c, env, &p, kv, 0, 0x77 + wi * 16 + qi);
      vcase_upload(&c);
      char what[160];
      snprintf(what, sizeof what, "window %d, q_len %d, %s, %s", windows[wi], qlens[qi],
               dt == F32 ? "f32" : dt == F16 ? "f16" : "bf16", paged ? "paged16" : "contiguous");
      vcase_check(&c, what, NULL, NULL);
      vcase_free(&c);
    }
}

/* Keys before fd_window_start (the first row's window, chunk-aligned) are
 * never read: NaN / +inf there gives the bits zeros give. */
static void window_unread_keys(void **state) {
  const rel_env *env = REL_ENV(state);
  const int32_t windows[] = {0, 100, 300};
  for (size_t wi = 0; wi < (rel_quick() ? 1u : 3u); wi++)
    for (int paged = 0; paged < 2; paged++) {
      fd_problem p = vproblem(env, BF16, 4, 3, 8, 2, 64, 2000, paged ? 64 : 0);
      p.has_window = 1;
      p.window_left = windows[wi];
      const int32_t kv[4] = {2000, 1500, 333, 2};
      vcase c;
      vcase_init(&c, env, &p, kv, 1, 0x91 + wi);
      fd_plan plan;
      fd_error err;
      if (fd_plan_init(&plan, &c.p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
      const size_t rows = (size_t)4 * 3 * 8, out_bytes = rows * 64 * 2;
      unsigned char *o[3];
      float *l[3];
      for (int fill = 0; fill < 3; fill++) { /* zeros, NaN, +inf before w0 */
        const double value = fill == 0 ? 0.0 : fill == 1 ? NAN : INFINITY;
        for (int32_t b = 0; b < 4; b++) {
          const int32_t w0 = fd_window_start(kv[b], 3, windows[wi], plan.chunk_len);
          for (int32_t j = 0; j < w0; j++)
            for (int32_t h = 0; h < 2; h++)
              for (int32_t i = 0; i < 64; i++) {
                rel_store(BF16, c.k, kv_at(&c, b, j, h) + i, value);
                rel_store(BF16, c.v, kv_at(&c, b, j, h) + i, value);
              }
        }
        vcase_upload(&c);
        o[fill] = malloc(out_bytes);
        l[fill] = malloc(rows * sizeof(float));
        if (!o[fill] || !l[fill]) fail_msg("out of memory");
        vcase_run(&c, &c.p, 0xff, o[fill], l[fill], "window, poisoned keys");
      }
      char what[128];
      snprintf(what, sizeof what, "window %d %s: NaN before w0 vs zeros", windows[wi], paged ? "paged" : "contiguous");
      rel_assert_same(o[0], o[1], out_bytes, what);
      rel_assert_same(l[0], l[1], rows * sizeof(float), what);
      snprintf(what, sizeof what, "window %d %s: inf before w0 vs zeros", windows[wi], paged ? "paged" : "contiguous");
      rel_assert_same(o[0], o[2], out_bytes, what);
      rel_assert_same(l[0], l[2], rows * sizeof(float), what);
      snprintf(what, sizeof what, "window %d %s, +inf before w0", windows[wi], paged ? "paged" : "contiguous");
      vcase_check(&c, what, NULL, NULL);
      for (int i = 0; i < 3; i++) free(o[i]), free(l[i]);
      vcase_free(&c);
    }
}

/* ---- soft-cap --------------------------------------------------------------------------- */

static void softcap_extremes(void **state) {
  const rel_env *env = REL_ENV(state);
  const float caps[] = {1e-3f, 1.0f, 30.0f, 1e30f};
  for (size_t ci = 0; ci < 4; ci++)
    for (size_t di = 0; di < (rel_quick() ? 1u : 3u); di++) {
      fd_problem p = vproblem(env, dtypes3[di], 3, 2, 8, 2, 64, 900, ci % 2 ? 32 : 0);
      p.logits_soft_cap = caps[ci];
      const int32_t kv[3] = {900, 1, 450};
      vcase c;
      vcase_init(&c, env, &p, kv, 0, 0xA0 + ci * 4 + di);
      vcase_upload(&c);
      char what[96];
      snprintf(what, sizeof what, "soft-cap %g, dtype %d", (double)caps[ci], (int)dtypes3[di]);
      vcase_check(&c, what, NULL, NULL);
      vcase_free(&c);
    }
  /* scores up to +-3e4 before the cap (scale 1000, f32): capped at 30, finite, right */
  fd_problem p = vproblem(env, F32, 2, 1, 4, 1, 64, 600, 0);
  p.logits_soft_cap = 30.0f;
  p.softmax_scale = 1000.0f;
  const int32_t kv[2] = {600, 77};
  vcase c;
  vcase_init(&c, env, &p, kv, 0, 0xAF);
  vcase_upload(&c);
  vcase_check(&c, "soft-cap 30 over scores up to 3e4", NULL, NULL);
  vcase_free(&c);
}

/* ---- sinks -------------------------------------------------------------------------------- */

static void sinks_extremes(void **state) {
  const rel_env *env = REL_ENV(state);
  const float values[8] = {-INFINITY, -1e30f, -5.0f, 0.0f, 3.0f, 1e30f, NAN, INFINITY};
  const int32_t splits[] = {0, 1, 5};
  for (size_t si = 0; si < (rel_quick() ? 1u : 3u); si++)
    for (int paged = 0; paged < 2; paged++) {
      fd_problem p = vproblem(env, dtypes3[(si + paged) % 3], 4, 2, 8, 4, 128, 500, paged ? 16 : 0);
      p.num_splits = splits[si];
      const int32_t kv[4] = {0, 1, 250, 500};
      vcase c;
      vcase_init(&c, env, &p, kv, 1, 0xB0 + si * 2 + paged);
      for (int h = 0; h < 8; h++) c.sinks[h] = values[(h + si) % 8];
      vcase_upload(&c);
      char what[96];
      snprintf(what, sizeof what, "sinks -inf..+inf, NaN, %s", paged ? "paged" : "contiguous");
      vcase_check(&c, what, NULL, NULL);
      vcase_free(&c);
    }
}

/* ---- non-causal ---------------------------------------------------------------------------- */

static void noncausal_rows(void **state) {
  const rel_env *env = REL_ENV(state);
  const int32_t qlens[] = {1, 17, 64, 128};
  for (size_t qi = rel_quick() ? 3 : 0; qi < 4; qi++) {
    const fd_dtype dt = dtypes3[qi % 3];
    fd_problem p = vproblem(env, dt, 3, qlens[qi], 4, 2, 64, 300, qi % 2 ? 16 : 0);
    p.non_causal = 1;
    const int32_t kv[3] = {0, 5, 300};
    vcase c;
    vcase_init(&c, env, &p, kv, qi == 2, 0xC0 + qi);
    vcase_upload(&c);
    char what[64];
    snprintf(what, sizeof what, "non-causal q_len %d", qlens[qi]);
    vcase_check(&c, what, NULL, NULL);
    vcase_free(&c);
  }
  /* keys at or past kv_len are never read, non-causal rows included */
  fd_problem p = vproblem(env, F16, 2, 40, 4, 2, 64, 256, 0);
  p.non_causal = 1;
  const int32_t kv[2] = {100, 3};
  vcase c;
  vcase_init(&c, env, &p, kv, 0, 0xCF);
  const size_t rows = (size_t)2 * 40 * 4, out_bytes = rows * 64 * 2;
  unsigned char *o0 = malloc(out_bytes), *o1 = malloc(out_bytes);
  float *l0 = malloc(rows * sizeof(float)), *l1 = malloc(rows * sizeof(float));
  if (!o0 || !o1 || !l0 || !l1) fail_msg("out of memory");
  for (int fill = 0; fill < 2; fill++) {
    for (int32_t b = 0; b < 2; b++)
      for (int32_t j = kv[b]; j < 256; j++)
        for (int32_t h = 0; h < 2; h++)
          for (int32_t i = 0; i < 64; i++) {
            rel_store(F16, c.k, kv_at(&c, b, j, h) + i, fill ? NAN : 0.0);
            rel_store(F16, c.v, kv_at(&c, b, j, h) + i, fill ? -INFINITY : 0.0);
          }
    vcase_upload(&c);
    vcase_run(&c, &c.p, 0xff, fill ? o1 : o0, fill ? l1 : l0, "non-causal, poisoned tail");
  }
  rel_assert_same(o0, o1, out_bytes, "non-causal: NaN past kv_len vs zeros");
  rel_assert_same(l0, l1, rows * sizeof(float), "non-causal: NaN past kv_len vs zeros (lse)");
  free(o0), free(o1), free(l0), free(l1);
  vcase_free(&c);
}

/* ---- float32 out ---------------------------------------------------------------------------- */

static void out_f32(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int di = 1; di < 3; di++)
    for (int paged = 0; paged < 2; paged++) {
      const fd_dtype dt = dtypes3[di];
      fd_problem p = vproblem(env, dt, 3, 2, 8, 2, 128, 700, paged ? 64 : 0);
      const int32_t kv[3] = {700, 0, 129};
      vcase c;
      vcase_init(&c, env, &p, kv, paged, 0xD0 + di * 2 + paged);
      vcase_upload(&c);
      const size_t rows = (size_t)3 * 2 * 8, n = rows * 128;
      unsigned char *o16 = malloc(n * 2);
      float *o32 = malloc(n * sizeof(float)), *l16 = malloc(rows * sizeof(float)), *l32 = malloc(rows * sizeof(float));
      if (!o16 || !o32 || !l16 || !l32) fail_msg("out of memory");
      char what[96];
      snprintf(what, sizeof what, "%s in, f16/bf16 out", dt == F16 ? "f16" : "bf16");
      vcase_check(&c, what, o16, l16);
      c.p.out_dtype = F32;
      snprintf(what, sizeof what, "%s in, f32 out", dt == F16 ? "f16" : "bf16");
      vcase_check(&c, what, o32, l32);
      /* the float32 out is the value the 16-bit out rounds: within one ulp of
       * it, and the same lse (CPU: bitwise; CUDA, whose kernels for the two
       * outputs are separate instances: two ulps, lse within its tolerance) */
      const int cpu = env->backend == FD_BACKEND_CPU;
      for (size_t i = 0; i < n; i++) {
        const double a = rel_load(dt, o16, (int64_t)i), b = o32[i];
        if (!(fabs(a - b) <= (cpu ? 1.0 : 2.0) * fd_dtype_ulp(dt, fmax(fabs(a), fabs(b)))))
          fail_msg("%s: element %zu: 16-bit out %.9g, float32 out %.9g: more than %d ulp apart", what, i, a, b,
                   cpu ? 1 : 2);
      }
      for (size_t i = 0; i < rows; i++) {
        const double a = l16[i], b = l32[i];
        const int same = a == b || (isinf(a) && isinf(b) && (a < 0) == (b < 0)) ||
                         (!cpu && fabs(a - b) <= fd_tol_lse(dt) * fmax(1.0, fabs(a)));
        if (!same) fail_msg("%s: lse[%zu] %.9g with a 16-bit out, %.9g with a float32 out", what, i, a, b);
      }
      free(o16), free(o32), free(l16), free(l32);
      vcase_free(&c);
    }
}

/* ---- everything at once ------------------------------------------------------------------------ */

static void combined(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int det = 0; det < 2; det++)
    for (int di = 0; di < 3; di++) {
      if (rel_quick() && di) break;
      fd_problem p = vproblem(env, dtypes3[di], 5, 16, 8, 2, 128, 3000, 32);
      p.has_window = 1;
      p.window_left = 777;
      p.logits_soft_cap = 20.0f;
      p.out_dtype = F32;
      p.deterministic = det;
      const int32_t kv[5] = {3000, 0, 15, 2049, 800};
      vcase c;
      vcase_init(&c, env, &p, kv, 1, 0xE0 + det * 4 + di);
      c.sinks[3] = NAN;
      vcase_upload(&c);
      char what[96];
      snprintf(what, sizeof what, "window + soft-cap + sinks + f32 out, paged, deterministic %d", det);
      vcase_check(&c, what, NULL, NULL);
      vcase_free(&c);
    }
}

/* ---- deterministic --------------------------------------------------------------------------- */

/* Sequence `target` of a batch: its out / lse rows (dense) from the full-batch outputs. */
static void rows_of(const fd_problem *p, int32_t target, const void *out, const float *lse, unsigned char *o1,
                    float *l1) {
  const int32_t T = p->q_len, Hq = p->num_heads_q;
  const size_t row_bytes = (size_t)p->head_dim * fd_dtype_size(p->out_dtype ? p->out_dtype : p->dtype);
  memcpy(o1, (const unsigned char *)out + (size_t)target * T * Hq * row_bytes, (size_t)T * Hq * row_bytes);
  memcpy(l1, lse + (size_t)target * Hq * T, (size_t)Hq * T * sizeof(float));
}

static void deterministic_batch_invariance(void **state) {
  const rel_env *env = REL_ENV(state);
  const int32_t lens[] = {1, 100, 2048, 2049, 5000};
  for (size_t li = 0; li < (rel_quick() ? 2u : 5u); li++)
    for (int variant = 0; variant < 2; variant++)
      for (int paged = 0; paged < 2; paged++) {
        const fd_dtype dt = variant ? BF16 : F32;
        const int32_t T = variant ? 3 : 1, L = lens[li], B = 8, target = 5;
        const int32_t big_cap = 6000;
        /* the batch: ragged others, the target at index 5; a capacity above L */
        fd_problem pb = vproblem(env, dt, B, T, 8, 2, 64, big_cap, paged ? 16 : 0);
        pb.deterministic = 1;
        if (variant) {
          pb.has_window = 1;
          pb.window_left = 1500;
          pb.logits_soft_cap = 25.0f;
        }
        int32_t kv[8];
        for (int32_t b = 0; b < B; b++) kv[b] = b == target ? L : (int32_t)((b * 977 + 13) % big_cap);
        vcase c;
        vcase_init(&c, env, &pb, kv, variant, 0xF0 + li * 4 + (size_t)variant * 2 + (size_t)paged);
        vcase_upload(&c);
        const size_t rows = (size_t)B * T * 8, row_bytes = 64 * fd_dtype_size(dt);
        unsigned char *ob = malloc(rows * row_bytes), *o_batch = malloc((size_t)T * 8 * row_bytes);
        float *lb = malloc(rows * sizeof(float)), *l_batch = malloc((size_t)T * 8 * sizeof(float));
        unsigned char *o_alone = malloc((size_t)T * 8 * row_bytes);
        float *l_alone = malloc((size_t)T * 8 * sizeof(float));
        if (!ob || !o_batch || !lb || !l_batch || !o_alone || !l_alone) fail_msg("out of memory");
        /* in the batch: a hint, 3 threads or 7 SMs, a NaN-filled workspace */
        fd_problem p1 = c.p;
        p1.kv_len_hint = kv;
        if (env->backend == FD_BACKEND_CPU) p1.num_threads = 3;
        else p1.sm_count = 7;
        const fd_plan plan = vcase_run(&c, &p1, 0xff, ob, lb, "deterministic batch");
        rows_of(&c.p, target, ob, lb, o_batch, l_batch);
        /* alone: a batch of 1 (the target's tensors), capacity L, default threads / SMs,
         * a zero workspace */
        vcase one;
        fd_problem pa = vproblem(env, dt, 1, T, 8, 2, 64, L, paged ? 16 : 0);
        pa.deterministic = 1;
        pa.has_window = pb.has_window;
        pa.window_left = pb.window_left;
        pa.logits_soft_cap = pb.logits_soft_cap;
        vcase_init(&one, env, &pa, &L, variant, 0);
        /* the target's q, keys and values, copied over */
        const size_t qrow = (size_t)T * 8 * 64 * c.esize;
        memcpy(one.q, (unsigned char *)c.q + (size_t)target * qrow, qrow);
        for (int32_t j = 0; j < L; j++)
          for (int32_t h = 0; h < 2; h++) {
            memcpy((unsigned char *)one.k + (size_t)kv_at(&one, 0, j, h) * c.esize,
                   (unsigned char *)c.k + (size_t)kv_at(&c, target, j, h) * c.esize, 64 * c.esize);
            memcpy((unsigned char *)one.v + (size_t)kv_at(&one, 0, j, h) * c.esize,
                   (unsigned char *)c.v + (size_t)kv_at(&c, target, j, h) * c.esize, 64 * c.esize);
          }
        memcpy(one.sinks, c.sinks, sizeof one.sinks);
        vcase_upload(&one);
        const fd_plan plan1 = vcase_run(&one, &one.p, 0x00, o_alone, l_alone, "deterministic alone");
        char what[160];
        snprintf(what, sizeof what, "deterministic: sequence of %d keys alone (%d splits) vs in a batch (%d splits), %s%s",
                 L, plan1.num_splits, plan.num_splits, variant ? "window + soft-cap + sinks, " : "",
                 paged ? "paged" : "contiguous");
        rel_assert_same(o_alone, o_batch, (size_t)T * 8 * row_bytes, what);
        rel_assert_same(l_alone, l_batch, (size_t)T * 8 * sizeof(float), what);
        /* and right */
        vcase_check(&c, what, NULL, NULL);
        free(ob), free(o_batch), free(lb), free(l_batch), free(o_alone), free(l_alone);
        vcase_free(&one);
        vcase_free(&c);
      }
}

rel_group rel_group_variants(fd_backend backend) {
  (void)backend;
  static const struct CMUnitTest tests[] = {
      {"window_edges", window_edges, NULL, NULL, NULL},
      {"window_unread_keys", window_unread_keys, NULL, NULL, NULL},
      {"softcap_extremes", softcap_extremes, NULL, NULL, NULL},
      {"sinks_extremes", sinks_extremes, NULL, NULL, NULL},
      {"noncausal_rows", noncausal_rows, NULL, NULL, NULL},
      {"out_f32", out_f32, NULL, NULL, NULL},
      {"combined", combined, NULL, NULL, NULL},
      {"deterministic_batch_invariance", deterministic_batch_invariance, NULL, NULL, NULL},
  };
  rel_group g = {"variants", tests, sizeof tests / sizeof *tests};
  return g;
}
