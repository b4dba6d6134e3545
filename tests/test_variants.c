/*
 * test_variants.c — the attention variants checked by identities between
 * runs of the backend itself, not against the float64 oracle: a bug that the
 * oracle and the kernels share cannot pass these. `test_variants cpu` (ctest
 * test_variants, label cpu) and `test_variants cuda` (test_gpu_variants,
 * label gpu; exits 77 without a GPU).
 *
 *   window      a windowed call (window_left W, q_len up to 16, dense or paged,
 *               forced or automatic splits) equals, row by row, a plain decode
 *               (q_len 1, no window) over a fresh cache that holds only the
 *               row's keys lo_t .. p_t: all rows at once as one batch of
 *               batch * q_len sequences on a page_size-1 view of the cache.
 *   non-causal  row t of a non-causal call equals a causal decode of q row t
 *               at q_len 1 with the same kv_len (one batch, a 16-key page view
 *               of the same cache).
 *   sinks       with sinks s_h, against the same call without (lse0, out0):
 *               lse = log(exp(lse0) + exp(s_h)) and out = out0 * exp(lse0 -
 *               lse); rows that see no key: out 0, lse = s_h. Plain causal,
 *               windowed, soft-capped and non-causal calls; each head's sink
 *               drawn within 1 of the mean lse of its rows, so it matters.
 *   soft-cap    a cap of 1e6, 3e38 or 3.4e38 equals no cap; and (f32, MHA, q_len 1, where the
 *               keys can be rescaled for the one query that reads them) a cap
 *               of 5 equals no cap over keys k'_j = k_j * cap tanh(s_j / cap)
 *               / s_j, whose scores are the capped ones.
 *   fp32 out    out_dtype F32 rounded to the dtype equals the 16-bit out
 *               (within the 1-vs-N-splits tolerance), and is not merely a
 *               16-bit value (most elements not representable in the dtype).
 *
 * Tolerance of a comparison of two of our runs, per row: out within
 * (2 floor(dtype) + 8 sqrt(keys) 2^-24) * max|out| (floor of harness.c: the
 * runs split and round differently; f32's sums in another order differ by a
 * random walk), lse within 2 tol_lse(dtype) * max(1, |lse|); NaN never passes.
 * Inputs are fresh each run (FD_TEST_SEED reproduces), cache slots nobody may
 * read are NaN, outputs are poisoned before every call (rel_run_private).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "reliability/rel.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16
#define MAXB 4
#define MAXT 128

/* ---- Random inputs ------------------------------------------------------------------ */

static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) * 0x1.0p-53; }
static double next_normal(uint64_t *s) {
  const double u1 = next_unit(s), u2 = next_unit(s);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint64_t seed_for(const rel_env *env, const char *name, int variant) {
  uint64_t h = 0xcbf29ce484222325ull ^ env->seed ^ ((uint64_t)variant << 40);
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return h;
}

/* ---- One problem's inputs on the host ---------------------------------------------------- */

/* q [B][T][Hq][D]; a contiguous cache [B][cap][Hkv][D] (cap a multiple of 64;
 * positions at or past kv_len NaN); sinks [Hq]. */
typedef struct inputs {
  fd_dtype dtype;
  int32_t B, T, Hq, Hkv, D, cap;
  int32_t kv_len[MAXB];
  unsigned char *q, *k, *v;
  float sinks[256];
  size_t es;
} inputs;

static size_t q_elems(const inputs *in) { return (size_t)in->B * in->T * in->Hq * in->D; }
static size_t kv_elems(const inputs *in) { return (size_t)in->B * in->cap * in->Hkv * in->D; }
static size_t kv_at(const inputs *in, int32_t b, int32_t j, int32_t hk) {
  return (((size_t)b * in->cap + j) * in->Hkv + hk) * in->D;
}

static void inputs_init(inputs *in, fd_dtype dtype, int32_t D, int32_t Hq, int32_t Hkv, int32_t B,
                        const int32_t *kv_len, int32_t T, uint64_t *rng) {
  memset(in, 0, sizeof *in);
  in->dtype = dtype, in->D = D, in->Hq = Hq, in->Hkv = Hkv, in->B = B, in->T = T;
  in->es = fd_dtype_size(dtype);
  int32_t longest = 1;
  for (int32_t b = 0; b < B; b++) {
    in->kv_len[b] = kv_len[b];
    if (kv_len[b] > longest) longest = kv_len[b];
  }
  in->cap = (longest + 63) / 64 * 64; /* whole pages of 16 and 64 */
  in->q = malloc(q_elems(in) * in->es);
  in->k = malloc(kv_elems(in) * in->es);
  in->v = malloc(kv_elems(in) * in->es);
  assert_true(in->q && in->k && in->v);
  for (size_t i = 0; i < q_elems(in); i++) fd_store_elem(in->q, dtype, (int64_t)i, (float)(2.0 * next_normal(rng)));
  for (int32_t b = 0; b < B; b++)
    for (int32_t j = 0; j < in->cap; j++)
      for (int32_t hk = 0; hk < Hkv; hk++)
        for (int32_t i = 0; i < D; i++) {
          const int64_t at = (int64_t)kv_at(in, b, j, hk) + i;
          const int live = j < kv_len[b];
          fd_store_elem(in->k, dtype, at, live ? (float)next_normal(rng) : NAN);
          fd_store_elem(in->v, dtype, at, live ? (float)next_normal(rng) : NAN);
        }
  for (int32_t h = 0; h < Hq; h++) in->sinks[h] = (float)(-2.0 + 6.0 * next_unit(rng));
}

static void inputs_free(inputs *in) {
  free(in->q);
  free(in->k);
  free(in->v);
}

/* The problem of `in` (contiguous cache), no variant. */
static fd_problem base_problem(const rel_env *env, const inputs *in, int32_t num_splits) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = env->backend;
  p.dtype = in->dtype;
  p.batch = in->B;
  p.q_len = in->T;
  p.num_heads_q = in->Hq;
  p.num_heads_kv = in->Hkv;
  p.head_dim = in->D;
  p.kv_capacity = in->cap;
  p.num_splits = num_splits;
  return p;
}

/* Which cache a run reads. */
typedef enum view {
  VIEW_CONTIG = 0,   /* the contiguous cache */
  VIEW_SHUFFLED = 1, /* a pool of pages of p.page_size in shuffled order (a copy) */
  VIEW_TABLE = 2     /* the contiguous cache as pages of p.page_size, with the caller's block table */
} view;

/* One run of p on the backend: q (host, [batch][q_len][Hq][D]) and the
 * cache of `in` as `how` says, kv_len (host [batch]), sinks (host or NULL);
 * out (p's out dtype) and lse come back dense in host buffers. */
static void run(const rel_env *env, const fd_problem *p, const inputs *in, const void *q, view how,
                const int32_t *block_table, const int32_t *kv_len, const float *sinks, void *out_host,
                float *lse_host, uint64_t *rng) {
  const fd_backend be = env->backend;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, p, &err) != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
  const size_t q_bytes = (size_t)p->batch * p->q_len * p->num_heads_q * p->head_dim * in->es;
  size_t kv_bytes = kv_elems(in) * in->es;
  const unsigned char *k = in->k, *v = in->v;
  unsigned char *k_pool = NULL, *v_pool = NULL;
  int32_t *table = NULL;
  size_t table_count = 0;
  if (how == VIEW_SHUFFLED) {
    /* pages of the contiguous cache in a shuffled pool, 2 spare NaN pages */
    const int32_t P = p->page_size, per_seq = in->cap / P, pages = in->B * per_seq + 2;
    const size_t page_bytes = (size_t)P * in->Hkv * in->D * in->es;
    int32_t *perm = malloc((size_t)pages * sizeof *perm);
    k_pool = malloc((size_t)pages * page_bytes);
    v_pool = malloc((size_t)pages * page_bytes);
    table_count = (size_t)in->B * per_seq;
    table = malloc(table_count * sizeof *table);
    assert_true(perm && k_pool && v_pool && table);
    memset(k_pool, 0xff, (size_t)pages * page_bytes); /* NaN in every dtype */
    memset(v_pool, 0xff, (size_t)pages * page_bytes);
    for (int32_t i = 0; i < pages; i++) perm[i] = i;
    for (int32_t i = pages - 1; i > 0; i--) {
      const int32_t j = (int32_t)(next_u64(rng) % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    for (int32_t b = 0; b < in->B; b++)
      for (int32_t c = 0; c < per_seq; c++) {
        const int32_t id = perm[b * per_seq + c];
        table[b * per_seq + c] = id;
        memcpy(k_pool + (size_t)id * page_bytes, in->k + kv_at(in, b, c * P, 0) * in->es, page_bytes);
        memcpy(v_pool + (size_t)id * page_bytes, in->v + kv_at(in, b, c * P, 0) * in->es, page_bytes);
      }
    free(perm);
    k = k_pool, v = v_pool, kv_bytes = (size_t)pages * page_bytes;
    block_table = table;
  } else if (how == VIEW_TABLE) {
    table_count = (size_t)p->batch * p->max_pages_per_seq;
  }
  const size_t lens_bytes = (size_t)p->batch * sizeof(int32_t);
  void *dq = rel_alloc(be, q_bytes), *dk = rel_alloc(be, kv_bytes), *dv = rel_alloc(be, kv_bytes);
  int32_t *dlen = rel_alloc(be, lens_bytes), *dbt = NULL;
  float *dsinks = NULL;
  rel_put(be, dq, q, q_bytes);
  rel_put(be, dk, k, kv_bytes);
  rel_put(be, dv, v, kv_bytes);
  rel_put(be, dlen, kv_len, lens_bytes);
  if (how != VIEW_CONTIG) {
    dbt = rel_alloc(be, table_count * sizeof(int32_t));
    rel_put(be, dbt, block_table, table_count * sizeof(int32_t));
  }
  if (sinks) {
    dsinks = rel_alloc(be, (size_t)p->num_heads_q * sizeof(float));
    rel_put(be, dsinks, sinks, (size_t)p->num_heads_q * sizeof(float));
  }
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = dq, t.k_cache = dk, t.v_cache = dv, t.kv_len = dlen, t.block_table = dbt, t.sinks = dsinks;
  const fd_status st = rel_run_private(&plan, &t, 0xff, NULL, out_host, lse_host, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_run: %s: %s", fd_status_name(st), err.message);
  rel_free(be, dq), rel_free(be, dk), rel_free(be, dv), rel_free(be, dlen), rel_free(be, dbt), rel_free(be, dsinks);
  free(k_pool), free(v_pool), free(table);
}

/* ---- Comparing two of our runs ------------------------------------------------------------ */

/* Row r of a and b (out_dtype, dense rows of D), lse la / lb: the tolerance
 * at the top. keys: how many keys the row sees (0: out exactly 0 in both).
 * Returns 1 on failure (printed, at most a few per test). */
static int compare_row(fd_dtype dtype, fd_dtype out_dtype, int32_t D, const void *a, const void *b,
                       size_t row_a, size_t row_b, double la, double lb, int32_t keys, int *printed,
                       const char *what, int32_t bi, int32_t t, int32_t h) {
  double m = 0.0, d = 0.0;
  int worst = 0, finite = 1;
  for (int32_t i = 0; i < D; i++) {
    const double x = fd_load_elem(a, out_dtype, (int64_t)(row_a * D + i));
    const double y = fd_load_elem(b, out_dtype, (int64_t)(row_b * D + i));
    if (!isfinite(x) || !isfinite(y)) finite = 0;
    m = fmax(m, fmax(fabs(x), fabs(y)));
    if (fabs(x - y) > d) d = fabs(x - y), worst = i;
    if (keys <= 0 && !(x == 0.0 && y == 0.0)) finite = 0;
  }
  const double tol = (2.0 * fd_tol_out_floor(dtype) + 8.0 * sqrt((double)(keys > 1 ? keys : 1)) * 0x1p-24) * m;
  int bad = !finite || !(d <= tol);
  const double ltol = 2.0 * fd_tol_lse(dtype) * fmax(1.0, fabs(la));
  if (keys <= 0)
    bad |= !(la == lb);
  else
    bad |= !isfinite(la) || !(fabs(la - lb) <= ltol);
  if (bad && (*printed)++ < 6)
    fprintf(stderr,
            "FAIL %s: row b=%d t=%d h=%d (%d keys): out[%d] %.9g vs %.9g (max diff %.3g, tol %.3g%s), "
            "lse %.9g vs %.9g\n",
            what, bi, t, h, keys, worst, fd_load_elem(a, out_dtype, (int64_t)(row_a * D + worst)),
            fd_load_elem(b, out_dtype, (int64_t)(row_b * D + worst)), d, tol,
            finite ? "" : ", NOT FINITE or not 0", la, lb);
  return bad;
}

static size_t out_bytes(const fd_problem *p, fd_dtype out_dtype) {
  return (size_t)p->batch * p->q_len * p->num_heads_q * p->head_dim * fd_dtype_size(out_dtype);
}
static size_t lse_count(const fd_problem *p) { return (size_t)p->batch * p->q_len * p->num_heads_q; }

/* ---- window == a decode over the window's keys alone ------------------------------------------ */

typedef struct shape {
  fd_dtype dtype;
  int32_t D, Hq, Hkv, B, kv_len[MAXB], T;
  int32_t page_size; /* of the variant's run: 0 = contiguous */
  int32_t num_splits;
  int32_t window_left; /* -1: none */
  float soft_cap;
  int non_causal;
} shape;

/* The variant's run layout: contiguous, or paged (page_size, shuffled pages,
 * two spare pages in the pool). */
static view layout(fd_problem *p, const inputs *in, int32_t page_size) {
  if (!page_size) return VIEW_CONTIG;
  p->page_size = page_size, p->max_pages_per_seq = in->cap / page_size;
  p->num_pages = in->B * p->max_pages_per_seq + 2;
  return VIEW_SHUFFLED;
}

static void window_case(const rel_env *env, const shape *sh, int variant) {
  uint64_t rng = seed_for(env, "window", variant);
  inputs in;
  inputs_init(&in, sh->dtype, sh->D, sh->Hq, sh->Hkv, sh->B, sh->kv_len, sh->T, &rng);
  fd_problem p = base_problem(env, &in, sh->num_splits);
  p.has_window = 1, p.window_left = sh->window_left, p.logits_soft_cap = sh->soft_cap;
  const view how = layout(&p, &in, sh->page_size);
  void *out = malloc(out_bytes(&p, in.dtype)), *crop_out = malloc(out_bytes(&p, in.dtype));
  float *lse = malloc(lse_count(&p) * sizeof(float)), *crop_lse = malloc(lse_count(&p) * sizeof(float));
  assert_true(out && crop_out && lse && crop_lse);
  run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, out, lse, &rng);

  /* the crop: sequence (b, t) of a batch of B * T holds keys lo_t .. p_t of b,
   * through a page_size 1 view of the contiguous cache (page id = b * cap + j) */
  fd_problem c = base_problem(env, &in, sh->num_splits);
  c.batch = in.B * in.T, c.q_len = 1, c.logits_soft_cap = sh->soft_cap;
  int32_t n_max = 1;
  int32_t *lens = malloc((size_t)c.batch * sizeof *lens), *los = malloc((size_t)c.batch * sizeof *los);
  assert_true(lens && los);
  for (int32_t b = 0; b < in.B; b++)
    for (int32_t t = 0; t < in.T; t++) {
      const int32_t n = rel_visible(&p, in.kv_len[b], t, &los[b * in.T + t]);
      lens[b * in.T + t] = n > 0 ? n : 0;
      if (n > n_max) n_max = n;
    }
  c.page_size = 1, c.max_pages_per_seq = n_max, c.kv_capacity = n_max, c.num_pages = in.B * in.cap;
  int32_t *table = malloc((size_t)c.batch * n_max * sizeof *table);
  assert_true(table);
  for (int32_t r = 0; r < c.batch; r++)
    for (int32_t i = 0; i < n_max; i++)
      table[(size_t)r * n_max + i] = i < lens[r] ? (r / in.T) * in.cap + los[r] + i : c.num_pages - 1 - (i % 7);
  run(env, &c, &in, in.q, VIEW_TABLE, table, lens, NULL, crop_out, crop_lse, &rng);

  char what[160];
  snprintf(what, sizeof what, "%s window_left %d, q_len %d, %s, num_splits %d%s: windowed vs the window's keys",
           fd_backend_name(env->backend), sh->window_left, sh->T, sh->page_size ? "paged" : "dense",
           sh->num_splits, sh->soft_cap > 0 ? ", soft-capped" : "");
  int fails = 0, printed = 0;
  for (int32_t b = 0; b < in.B; b++)
    for (int32_t t = 0; t < in.T; t++)
      for (int32_t h = 0; h < in.Hq; h++) {
        const size_t row = ((size_t)b * in.T + t) * in.Hq + h; /* = the crop's row (b * T + t, 0, h) */
        fails += compare_row(in.dtype, in.dtype, in.D, out, crop_out, row, row,
                             lse[((size_t)b * in.Hq + h) * in.T + t], crop_lse[row], lens[b * in.T + t], &printed,
                             what, b, t, h);
      }
  free(out), free(crop_out), free(lse), free(crop_lse), free(lens), free(los), free(table);
  inputs_free(&in);
  if (fails) fail_msg("%s: %d rows differ", what, fails);
}

static void window_vs_cropped_cache(void **state) {
  const rel_env *env = REL_ENV(state);
  static const shape shapes[] = {
      {F32, 64, 4, 2, 2, {300, 70}, 4, 0, 0, 63, 0.0f, 0},
      {BF16, 128, 8, 2, 2, {1000, 5}, 16, 16, 7, 127, 0.0f, 0},
      {F16, 64, 8, 1, 2, {64, 2000}, 8, 0, 2, 0, 0.0f, 0},
      {F32, 80, 4, 4, 1, {5000}, 2, 64, 0, 4095, 0.0f, 0}, /* kv_len longer than the window */
      {F32, 64, 4, 2, 1, {4000}, 3, 0, 7, 4095, 0.0f, 0},  /* shorter */
      {BF16, 96, 4, 2, 2, {3000, 100}, 1, 0, 1, 1, 0.0f, 0},
      {F16, 256, 4, 1, 2, {129, 700}, 5, 16, 0, 64, 30.0f, 0},
      {F32, 128, 8, 2, 3, {2, 65, 640}, 8, 16, 2, 65, 0.0f, 0}, /* q_len > kv_len */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    if (rel_quick() && i % 3 != 0) continue;
    window_case(env, &shapes[i], (int)i);
  }
}

/* ---- non-causal rows == causal decodes ------------------------------------------------------- */

static void noncausal_case(const rel_env *env, const shape *sh, int variant) {
  uint64_t rng = seed_for(env, "noncausal", variant);
  inputs in;
  inputs_init(&in, sh->dtype, sh->D, sh->Hq, sh->Hkv, sh->B, sh->kv_len, sh->T, &rng);
  fd_problem p = base_problem(env, &in, sh->num_splits);
  p.non_causal = 1, p.logits_soft_cap = sh->soft_cap;
  const view how = layout(&p, &in, sh->page_size);
  void *out = malloc(out_bytes(&p, in.dtype)), *dec_out = malloc(out_bytes(&p, in.dtype));
  float *lse = malloc(lse_count(&p) * sizeof(float)), *dec_lse = malloc(lse_count(&p) * sizeof(float));
  assert_true(out && dec_out && lse && dec_lse);
  run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, out, lse, &rng);

  /* the decode: sequence (b, t) of a batch of B * T is sequence b's cache
   * through a 16-key page view (page id = b * cap / 16 + c), kv_len[b] keys */
  fd_problem c = base_problem(env, &in, sh->num_splits);
  c.batch = in.B * in.T, c.q_len = 1, c.logits_soft_cap = sh->soft_cap;
  c.page_size = 16, c.max_pages_per_seq = in.cap / 16, c.num_pages = in.B * (in.cap / 16);
  int32_t *lens = malloc((size_t)c.batch * sizeof *lens);
  int32_t *table = malloc((size_t)c.batch * c.max_pages_per_seq * sizeof *table);
  assert_true(lens && table);
  for (int32_t r = 0; r < c.batch; r++) {
    lens[r] = in.kv_len[r / in.T];
    for (int32_t i = 0; i < c.max_pages_per_seq; i++)
      table[(size_t)r * c.max_pages_per_seq + i] = (r / in.T) * c.max_pages_per_seq + i;
  }
  run(env, &c, &in, in.q, VIEW_TABLE, table, lens, NULL, dec_out, dec_lse, &rng);

  char what[160];
  snprintf(what, sizeof what, "%s non-causal q_len %d, %s, num_splits %d%s: rows vs causal decodes",
           fd_backend_name(env->backend), sh->T, sh->page_size ? "paged" : "dense", sh->num_splits,
           sh->soft_cap > 0 ? ", soft-capped" : "");
  int fails = 0, printed = 0;
  for (int32_t b = 0; b < in.B; b++)
    for (int32_t t = 0; t < in.T; t++)
      for (int32_t h = 0; h < in.Hq; h++) {
        const size_t row = ((size_t)b * in.T + t) * in.Hq + h;
        fails += compare_row(in.dtype, in.dtype, in.D, out, dec_out, row, row,
                             lse[((size_t)b * in.Hq + h) * in.T + t], dec_lse[row], in.kv_len[b], &printed, what,
                             b, t, h);
      }
  free(out), free(dec_out), free(lse), free(dec_lse), free(lens), free(table);
  inputs_free(&in);
  if (fails) fail_msg("%s: %d rows differ", what, fails);
}

static void noncausal_vs_decode(void **state) {
  const rel_env *env = REL_ENV(state);
  static const shape shapes[] = {
      {F32, 64, 8, 1, 2, {65, 1}, 32, 0, 0, -1, 0.0f, 1},
      {BF16, 128, 8, 1, 1, {4099}, 64, 16, 7, -1, 0.0f, 1},
      {F16, 96, 4, 2, 2, {300, 0}, 128, 0, 2, -1, 0.0f, 1},
      {F32, 80, 8, 8, 1, {1000}, 17, 64, 0, -1, 20.0f, 1},
      {BF16, 64, 8, 1, 1, {2000}, 128, 0, 0, -1, 0.0f, 1},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    if (rel_quick() && i % 2 != 0) continue;
    noncausal_case(env, &shapes[i], (int)i);
  }
}

/* ---- sinks: the identities over the same call without them ----------------------------------------- */

static void sinks_case(const rel_env *env, const shape *sh, int variant) {
  uint64_t rng = seed_for(env, "sinks", variant);
  inputs in;
  inputs_init(&in, sh->dtype, sh->D, sh->Hq, sh->Hkv, sh->B, sh->kv_len, sh->T, &rng);
  fd_problem p = base_problem(env, &in, sh->num_splits);
  p.non_causal = sh->non_causal, p.logits_soft_cap = sh->soft_cap;
  if (sh->window_left >= 0) p.has_window = 1, p.window_left = sh->window_left;
  const view how = layout(&p, &in, sh->page_size);
  const fd_dtype dt = in.dtype;
  void *out0 = malloc(out_bytes(&p, dt)), *out1 = malloc(out_bytes(&p, dt));
  float *lse0 = malloc(lse_count(&p) * sizeof(float)), *lse1 = malloc(lse_count(&p) * sizeof(float));
  assert_true(out0 && out1 && lse0 && lse1);
  uint64_t rng_pages = rng; /* the same page shuffle for both runs */
  run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, out0, lse0, &rng_pages);
  /* each head's sink near the mean lse of its rows: weights 0.27 .. 0.73 */
  for (int32_t h = 0; h < in.Hq; h++) {
    double sum = 0.0;
    int n = 0;
    for (int32_t b = 0; b < in.B; b++)
      for (int32_t t = 0; t < in.T; t++) {
        int32_t lo;
        if (rel_visible(&p, in.kv_len[b], t, &lo) <= 0) continue;
        sum += lse0[((size_t)b * in.Hq + h) * in.T + t], n++;
      }
    in.sinks[h] = (float)((n ? sum / n : 0.0) - 1.0 + 2.0 * next_unit(&rng));
  }
  rng_pages = rng;
  run(env, &p, &in, in.q, how, NULL, in.kv_len, in.sinks, out1, lse1, &rng_pages);

  char what[200];
  snprintf(what, sizeof what, "%s sinks, q_len %d, window %d, soft-cap %g%s, %s, num_splits %d",
           fd_backend_name(env->backend), sh->T, sh->window_left, (double)sh->soft_cap,
           sh->non_causal ? ", non-causal" : "", sh->page_size ? "paged" : "dense", sh->num_splits);
  int fails = 0, printed = 0;
  const double floor_rel = fd_tol_out_floor(dt), ltol = fd_tol_lse(dt);
  for (int32_t b = 0; b < in.B; b++)
    for (int32_t t = 0; t < in.T; t++)
      for (int32_t h = 0; h < in.Hq; h++) {
        const size_t row = ((size_t)b * in.T + t) * in.Hq + h, lrow = ((size_t)b * in.Hq + h) * in.T + t;
        int32_t lo;
        const int32_t keys = rel_visible(&p, in.kv_len[b], t, &lo);
        const double s = in.sinks[h], l0 = lse0[lrow], l1 = lse1[lrow];
        double want_l, f = 0.0, m0 = 0.0, d = 0.0;
        int bad = 0;
        if (keys <= 0) {
          want_l = s; /* the sink alone; out 0 */
          for (int32_t i = 0; i < in.D; i++) bad |= !(fd_load_elem(out1, dt, (int64_t)(row * in.D + i)) == 0.0);
        } else {
          const double m = fmax(l0, s);
          want_l = m + log(exp(l0 - m) + exp(s - m));
          f = exp(l0 - l1); /* out1 / out0, from the call's own lse values */
          for (int32_t i = 0; i < in.D; i++) {
            const double o0 = fd_load_elem(out0, dt, (int64_t)(row * in.D + i));
            const double o1 = fd_load_elem(out1, dt, (int64_t)(row * in.D + i));
            m0 = fmax(m0, fabs(o0));
            const double e = fabs(o1 - f * o0);
            if (!(e <= d)) d = e;
          }
          bad |= !(d <= f * m0 * (2.0 * floor_rel + 1e-6 * fmax(1.0, fabs(l1))));
        }
        bad |= !(fabs(l1 - want_l) <= 2.0 * ltol * fmax(1.0, fabs(want_l)));
        if (bad && printed++ < 6)
          fprintf(stderr,
                  "FAIL %s: row b=%d t=%d h=%d (%d keys): sink %.6g, lse %.9g -> %.9g (want %.9g); out scaled by "
                  "%.6g: max diff %.3g of max|out0| %.3g\n",
                  what, b, t, h, keys, s, l0, l1, want_l, f, d, m0);
        fails += bad;
      }
  free(out0), free(out1), free(lse0), free(lse1);
  inputs_free(&in);
  if (fails) fail_msg("%s: %d rows wrong", what, fails);
}

static void sinks_identities(void **state) {
  const rel_env *env = REL_ENV(state);
  static const shape shapes[] = {
      {F32, 64, 4, 2, 3, {0, 2, 300}, 4, 0, 2, -1, 0.0f, 0},
      {BF16, 128, 8, 2, 2, {1000, 65}, 2, 16, 7, 127, 0.0f, 0},
      {F16, 80, 8, 1, 2, {97, 0}, 32, 0, 0, -1, 0.0f, 1},
      {F32, 96, 4, 4, 1, {500}, 1, 0, 1, -1, 30.0f, 0},
      {BF16, 64, 16, 2, 2, {3, 2000}, 8, 16, 0, 63, 50.0f, 0},
      {F16, 256, 4, 2, 2, {4099, 1}, 2, 64, 0, -1, 0.0f, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    if (rel_quick() && i % 2 != 0) continue;
    sinks_case(env, &shapes[i], (int)i);
  }
}

/* ---- soft-cap ------------------------------------------------------------------------------------ */

/* A cap of 1e6 changes no float32 score: the same as no cap; so do the
 * largest finite caps (3e38: a backend that scales the cap, by log2(e) for
 * base-2 exponentials say, must not overflow it). */
static void softcap_huge_is_none(void **state) {
  const rel_env *env = REL_ENV(state);
  static const shape shapes[] = {
      {F32, 64, 4, 2, 2, {300, 4099}, 2, 0, 0, -1, 1e6f, 0},
      {F16, 128, 8, 2, 2, {1000, 3}, 4, 16, 7, 127, 1e6f, 0},
      {BF16, 80, 8, 1, 1, {700}, 32, 0, 2, -1, 1e6f, 1},
      {F32, 96, 4, 1, 2, {65, 900}, 3, 0, 2, -1, 3e38f, 0},
      {BF16, 128, 8, 2, 1, {2000}, 1, 16, 0, 255, 3.4e38f, 0},
  };
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
    if (rel_quick() && si != 0 && si != 3) continue;
    const shape *sh = &shapes[si];
    uint64_t rng = seed_for(env, "softcap_huge", (int)si);
    inputs in;
    inputs_init(&in, sh->dtype, sh->D, sh->Hq, sh->Hkv, sh->B, sh->kv_len, sh->T, &rng);
    fd_problem p = base_problem(env, &in, sh->num_splits);
    p.non_causal = sh->non_causal;
    if (sh->window_left >= 0) p.has_window = 1, p.window_left = sh->window_left;
    const view how = layout(&p, &in, sh->page_size);
    void *out0 = malloc(out_bytes(&p, in.dtype)), *out1 = malloc(out_bytes(&p, in.dtype));
    float *lse0 = malloc(lse_count(&p) * sizeof(float)), *lse1 = malloc(lse_count(&p) * sizeof(float));
    assert_true(out0 && out1 && lse0 && lse1);
    uint64_t r2 = rng;
    run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, out0, lse0, &r2);
    p.logits_soft_cap = sh->soft_cap;
    r2 = rng;
    run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, out1, lse1, &r2);
    char what[128];
    snprintf(what, sizeof what, "%s soft-cap %g vs none (%s, q_len %d)", fd_backend_name(env->backend),
             (double)sh->soft_cap, sh->dtype == F32 ? "f32" : sh->dtype == F16 ? "f16" : "bf16", sh->T);
    int fails = 0, printed = 0;
    for (int32_t b = 0; b < in.B; b++)
      for (int32_t t = 0; t < in.T; t++)
        for (int32_t h = 0; h < in.Hq; h++) {
          const size_t row = ((size_t)b * in.T + t) * in.Hq + h, lrow = ((size_t)b * in.Hq + h) * in.T + t;
          int32_t lo;
          const int32_t keys = rel_visible(&p, in.kv_len[b], t, &lo);
          fails += compare_row(in.dtype, in.dtype, in.D, out1, out0, row, row, lse1[lrow], lse0[lrow], keys,
                               &printed, what, b, t, h);
        }
    free(out0), free(out1), free(lse0), free(lse1);
    inputs_free(&in);
    if (fails) fail_msg("%s: %d rows differ", what, fails);
  }
}

/* f32, MHA, q_len 1: each kv head is read by one query row, so the keys can
 * be rescaled to give the capped scores: cap 5 over k == no cap over k'. */
static void softcap_is_rescaled_keys(void **state) {
  const rel_env *env = REL_ENV(state);
  const float caps[] = {5.0f, 1.0f};
  const int32_t windows[] = {-1, 100};
  for (int vi = 0; vi < 2; vi++) {
    uint64_t rng = seed_for(env, "softcap_keys", vi);
    const int32_t kv_len[3] = {1000, 0, 4099};
    inputs in;
    inputs_init(&in, F32, 64, 4, 4, 3, kv_len, 1, &rng);
    const float cap = caps[vi];
    fd_problem p = base_problem(env, &in, vi ? 7 : 0);
    if (windows[vi] >= 0) p.has_window = 1, p.window_left = windows[vi];
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
    const double scale = plan.softmax_scale;
    /* k' = k * cap tanh(s / cap) / s, s = scale q . k (in double) */
    unsigned char *k_orig = in.k, *k2 = malloc(kv_elems(&in) * in.es);
    assert_true(k2);
    memcpy(k2, in.k, kv_elems(&in) * in.es);
    for (int32_t b = 0; b < in.B; b++)
      for (int32_t j = 0; j < in.kv_len[b]; j++)
        for (int32_t h = 0; h < in.Hq; h++) {
          const float *q = (const float *)in.q + ((size_t)b * in.Hq + h) * in.D;
          float *k = (float *)k2 + kv_at(&in, b, j, h);
          double dot = 0.0;
          for (int32_t i = 0; i < in.D; i++) dot += (double)q[i] * k[i];
          const double s = scale * dot, r = s != 0.0 ? cap * tanh(s / cap) / s : 1.0;
          for (int32_t i = 0; i < in.D; i++) k[i] = (float)(k[i] * r);
        }
    void *out0 = malloc(out_bytes(&p, F32)), *out1 = malloc(out_bytes(&p, F32));
    float *lse0 = malloc(lse_count(&p) * sizeof(float)), *lse1 = malloc(lse_count(&p) * sizeof(float));
    assert_true(out0 && out1 && lse0 && lse1);
    p.logits_soft_cap = cap;
    run(env, &p, &in, in.q, VIEW_CONTIG, NULL, in.kv_len, NULL, out1, lse1, &rng);
    p.logits_soft_cap = 0.0f;
    in.k = k2;
    run(env, &p, &in, in.q, VIEW_CONTIG, NULL, in.kv_len, NULL, out0, lse0, &rng);
    in.k = k_orig;
    char what[128];
    snprintf(what, sizeof what, "%s soft-cap %g vs rescaled keys (window %d)", fd_backend_name(env->backend),
             (double)cap, windows[vi]);
    int fails = 0, printed = 0;
    for (int32_t b = 0; b < in.B; b++)
      for (int32_t h = 0; h < in.Hq; h++) {
        int32_t lo;
        const int32_t keys = rel_visible(&p, in.kv_len[b], 0, &lo);
        const size_t row = (size_t)b * in.Hq + h;
        /* scores differ by float32 rounding of q . k' vs the capped q . k: a few ulps */
        fails += compare_row(F32, F32, in.D, out1, out0, row, row, lse1[row], lse0[row], keys, &printed, what, b,
                             0, h);
      }
    free(k2), free(out0), free(out1), free(lse0), free(lse1);
    inputs_free(&in);
    if (fails) fail_msg("%s: %d rows differ", what, fails);
  }
}

/* ---- fp32 out ------------------------------------------------------------------------------------- */

static void out_f32_is_wider(void **state) {
  const rel_env *env = REL_ENV(state);
  static const shape shapes[] = {
      {F16, 128, 8, 2, 2, {1000, 65}, 2, 0, 7, -1, 0.0f, 0},
      {BF16, 64, 4, 1, 2, {4099, 0}, 4, 16, 0, 127, 30.0f, 0},
      {BF16, 96, 8, 8, 1, {300}, 64, 0, 2, -1, 0.0f, 1},
  };
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
    if (rel_quick() && si != 0) continue;
    const shape *sh = &shapes[si];
    uint64_t rng = seed_for(env, "out_f32", (int)si);
    inputs in;
    inputs_init(&in, sh->dtype, sh->D, sh->Hq, sh->Hkv, sh->B, sh->kv_len, sh->T, &rng);
    fd_problem p = base_problem(env, &in, sh->num_splits);
    p.non_causal = sh->non_causal, p.logits_soft_cap = sh->soft_cap;
    if (sh->window_left >= 0) p.has_window = 1, p.window_left = sh->window_left;
    const view how = layout(&p, &in, sh->page_size);
    void *o16 = malloc(out_bytes(&p, in.dtype)), *o32 = malloc(out_bytes(&p, F32));
    void *o32r = malloc(out_bytes(&p, in.dtype));
    float *l16 = malloc(lse_count(&p) * sizeof(float)), *l32 = malloc(lse_count(&p) * sizeof(float));
    assert_true(o16 && o32 && o32r && l16 && l32);
    uint64_t r2 = rng;
    run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, o16, l16, &r2);
    p.out_dtype = F32;
    r2 = rng;
    run(env, &p, &in, in.q, how, NULL, in.kv_len, NULL, o32, l32, &r2);
    const size_t n = out_bytes(&p, F32) / sizeof(float);
    size_t exact = 0, counted = 0;
    for (size_t i = 0; i < n; i++) {
      const float x = ((const float *)o32)[i];
      fd_store_elem(o32r, in.dtype, (int64_t)i, x);
      const size_t row = i / (size_t)in.D, t = (row / (size_t)in.Hq) % (size_t)in.T, b = row / ((size_t)in.Hq * in.T);
      int32_t lo;
      if (rel_visible(&p, in.kv_len[b], (int32_t)t, &lo) < 2) continue;
      counted++;
      exact += (double)fd_load_elem(o32r, in.dtype, (int64_t)i) == (double)x;
    }
    char what[128];
    snprintf(what, sizeof what, "%s fp32 out vs %s out (q_len %d)", fd_backend_name(env->backend),
             in.dtype == F16 ? "f16" : "bf16", in.T);
    if (2 * exact > counted)
      fail_msg("%s: %zu of %zu elements are exact 16-bit values: rounded, then widened?", what, exact, counted);
    int fails = 0, printed = 0;
    for (int32_t b = 0; b < in.B; b++)
      for (int32_t t = 0; t < in.T; t++)
        for (int32_t h = 0; h < in.Hq; h++) {
          const size_t row = ((size_t)b * in.T + t) * in.Hq + h, lrow = ((size_t)b * in.Hq + h) * in.T + t;
          int32_t lo;
          const int32_t keys = rel_visible(&p, in.kv_len[b], t, &lo);
          fails += compare_row(in.dtype, in.dtype, in.D, o32r, o16, row, row, l32[lrow], l16[lrow], keys,
                               &printed, what, b, t, h);
        }
    free(o16), free(o32), free(o32r), free(l16), free(l32);
    inputs_free(&in);
    if (fails) fail_msg("%s: %d rows differ", what, fails);
  }
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "cpu") != 0 && strcmp(argv[1], "cuda") != 0)) {
    fprintf(stderr, "usage: %s cpu|cuda\n", argv[0]);
    return 2;
  }
  static rel_env env;
  env.backend = strcmp(argv[1], "cuda") == 0 ? FD_BACKEND_CUDA : FD_BACKEND_CPU;
  if (env.backend == FD_BACKEND_CUDA && !fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  env.seed = fd_test_seed();
  struct CMUnitTest tests[] = {
      {"window_vs_cropped_cache", window_vs_cropped_cache, NULL, NULL, &env},
      {"noncausal_vs_decode", noncausal_vs_decode, NULL, NULL, &env},
      {"sinks_identities", sinks_identities, NULL, NULL, &env},
      {"softcap_huge_is_none", softcap_huge_is_none, NULL, NULL, &env},
      {"softcap_is_rescaled_keys", softcap_is_rescaled_keys, NULL, NULL, &env},
      {"out_f32_is_wider", out_f32_is_wider, NULL, NULL, &env},
  };
  char name[32];
  snprintf(name, sizeof name, "variants_%s", argv[1]);
  printf("%s: FD_TEST_SEED=%llu%s\n", name, (unsigned long long)env.seed,
         rel_quick() ? " (FD_TEST_QUICK: reduced)" : "");
  fflush(stdout);
  const char *filter = getenv("FD_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  const int failed = _cmocka_run_group_tests(name, tests, sizeof tests / sizeof *tests, NULL, NULL);
  if (failed) printf("%s: FD_TEST_SEED=%llu reproduces these inputs\n", name, (unsigned long long)env.seed);
  return failed ? 1 : 0;
}
