/*
 * test_gpu_mla.c — MLA decode (rope_dim 64) on CUDA against the float64
 * oracle (fd_reference_f64 on the same host inputs), and the CUDA append of
 * an MLA cache against the host append (the same bytes); then the shared
 * MLA case grid (mla_cases.c, mla_fixture.c) on CUDA.
 *
 * Decode cases: head_dim 512 and 448; 3 .. 128 query heads; q_len 1, 2, 5,
 * 16; ragged batches of 1 .. 4 with kv_len 0, 1 and odd lengths; paged
 * caches (page_size 1, 16, 64, 256, scattered pages) and contiguous ones;
 * separate latent / rope buffers and a combined [.., D + 64] buffer seen as
 * two strided views; bf16 and fp16 q, out 16-bit or fp32; fp8 e4m3 / e5m2
 * latent with TENSOR or TOKEN k_scale, rope part 16-bit or fp8; forced
 * num_splits; the deterministic mode (bitwise equal to the same sequence
 * run alone); lse; a NaN in a key every row sees (the rows go NaN). Every
 * case runs twice (bitwise equal), with NaN in every cache position,
 * token scale and page no row may read, NaN-poisoned out / lse / workspace
 * and guard bytes past out and lse.
 *
 * Each case prints one line: PASS or FAIL, the worst error over its
 * tolerance, the first bad element (b, t, h, d) with both values, and the
 * counts of unexpected NaN and of bad lse. FD_TEST_SEED fixes the inputs;
 * FD_TEST_FILTER=<substring> runs the matching cases only; FD_TEST_QUICK=1
 * (compute-sanitizer) skips those over 3000 keys or 256 rows. Exits 77
 * (ctest: skipped) when no usable GPU is present.
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
#include "gpu_mem.h"
#include "harness.h"
#include "internal.h"
#include "mla_fixture.h"

#define R 64         /* rope_dim */
#define GUARD 256    /* guard bytes past out and lse */
#define GUARD_BYTE 0xA5

typedef struct mla_case {
  fd_dtype dtype, kv_dtype, rope_dtype, out_dtype;
  fd_kv_scale kv_scale;
  int D, heads, q_len, batch;
  int32_t kv_len[4];
  int page_size; /* 0: contiguous */
  int combined;  /* one [.., D + 64] buffer, two strided views */
  int num_splits, deterministic, lse, nan_key;
  int pages_unknown; /* num_pages 0: the block table's ids are trusted, not checked */
} mla_case;

static int g_failed; /* cases failed so far */

static const char *tag(fd_dtype d) {
  switch (d) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_E4M3: return "e4m3";
    case FD_DTYPE_E5M2: return "e5m2";
  }
  return "?";
}

static void case_name(const mla_case *c, char *buf, size_t n) {
  const fd_dtype kv = c->kv_dtype ? c->kv_dtype : c->dtype;
  const fd_dtype rope = c->rope_dtype ? c->rope_dtype : kv;
  snprintf(buf, n, "%s_kv%s_rope%s_out%s_%s_D%d_H%d_T%d_B%d_kv%d,%d,%d,%d_pg%d%s_S%d%s%s%s%s",
           tag(c->dtype), tag(kv), tag(rope), tag(c->out_dtype ? c->out_dtype : c->dtype),
           c->kv_scale == FD_KV_SCALE_TOKEN ? "token" : c->kv_scale ? "tensor" : "none", c->D,
           c->heads, c->q_len, c->batch, c->kv_len[0], c->batch > 1 ? c->kv_len[1] : -1,
           c->batch > 2 ? c->kv_len[2] : -1, c->batch > 3 ? c->kv_len[3] : -1, c->page_size,
           c->combined ? "_comb" : "", c->num_splits, c->deterministic ? "_det" : "",
           c->lse ? "_lse" : "", c->nan_key ? "_nan" : "", c->pages_unknown ? "_pgunk" : "");
}

static int filtered_out(const char *name) {
  const char *f = getenv("FD_TEST_FILTER");
  return f && *f && !strstr(name, f);
}

/* ---- random values ---- */

static uint64_t g_rng;
static double rnd_normal(void) {
  fd_rng r = {g_rng};
  const double x = fd_rng_normal(&r);
  g_rng = r.state;
  return x;
}
static double rnd_uniform(void) {
  fd_rng r = {g_rng};
  const double x = fd_rng_uniform(&r);
  g_rng = r.state;
  return x;
}
static uint64_t rnd_below(uint64_t n) {
  fd_rng r = {g_rng};
  const uint64_t x = fd_rng_below(&r, n);
  g_rng = r.state;
  return x;
}

static float nan_f(void) { return fd_bits_to_f32(0x7fc00000u); }

/* NaN in element i of an array of dtype (fp8: the NaN code). */
static void store_nan(void *base, fd_dtype d, int64_t i) {
  if (d == FD_DTYPE_E4M3 || d == FD_DTYPE_E5M2) ((uint8_t *)base)[i] = 0x7f;
  else fd_store_elem(base, d, i, nan_f());
}

/* ---- device copies ---- */

static void *dev_copy(const void *host, size_t n) {
  void *d = NULL;
  if (fd_gpu_malloc(&d, n ? n : 16) || (n && fd_gpu_upload(d, host, n))) fail_msg("device copy failed");
  return d;
}

/* ---- one case ---- */

typedef struct mla_inputs {
  fd_problem p;
  size_t esz, kesz, resz, osz;
  int64_t cap, rows_cache; /* kv_capacity; rows of the cache (pages * page_size or batch * cap) */
  int pages, max_pages;
  void *q, *q_pe, *ckv_buf, *kpe_buf; /* host */
  size_t q_bytes, qpe_bytes, ckv_bytes, kpe_bytes;
  int64_t ckv_off, kpe_off; /* elements from the buffer base (combined: kpe at D) */
  fd_tensors t;             /* host tensors (strides explicit) */
  int32_t *block_table;
  float *scales;
  size_t scale_count;
  int32_t kv_len[4];
} mla_inputs;

static void free_inputs(mla_inputs *in) {
  free(in->q);
  free(in->q_pe);
  free(in->ckv_buf);
  if (in->kpe_buf != in->ckv_buf) free(in->kpe_buf);
  free(in->block_table);
  free(in->scales);
}

/* Builds the case's problem and host inputs: caches filled with random
 * values where some row reads them, NaN everywhere else. */
static void make_inputs(const mla_case *c, mla_inputs *in) {
  memset(in, 0, sizeof *in);
  fd_problem *p = &in->p;
  p->backend = FD_BACKEND_CUDA;
  p->dtype = c->dtype;
  p->kv_dtype = c->kv_dtype;
  p->rope_dtype = c->rope_dtype;
  p->out_dtype = c->out_dtype;
  p->kv_scale = c->kv_scale;
  p->batch = c->batch;
  p->q_len = c->q_len;
  p->num_heads_q = c->heads;
  p->num_heads_kv = 1;
  p->head_dim = c->D;
  p->rope_dim = R;
  p->num_splits = c->num_splits;
  p->deterministic = c->deterministic;
  p->softmax_scale = 1.0f / sqrtf(192.0f);
  int32_t longest = 1;
  for (int b = 0; b < c->batch; b++) {
    in->kv_len[b] = c->kv_len[b];
    if (c->kv_len[b] > longest) longest = c->kv_len[b];
  }
  const fd_dtype kv = c->kv_dtype ? c->kv_dtype : c->dtype;
  const fd_dtype rope = c->rope_dtype ? c->rope_dtype : kv;
  in->esz = fd_dtype_size(c->dtype);
  in->kesz = fd_dtype_size(kv);
  in->resz = fd_dtype_size(rope);
  in->osz = fd_dtype_size(c->out_dtype ? c->out_dtype : c->dtype);
  in->cap = longest + 3; /* a few positions past the longest: never read */
  if (c->page_size > 0) {
    in->max_pages = (int)((in->cap + c->page_size - 1) / c->page_size);
    in->pages = in->max_pages * c->batch + 3; /* spare pages nobody uses */
    in->rows_cache = (int64_t)in->pages * c->page_size;
    p->page_size = c->page_size;
    p->max_pages_per_seq = in->max_pages;
    p->num_pages = c->pages_unknown ? 0 : in->pages;
    p->kv_capacity = (int32_t)in->cap;
  } else {
    in->rows_cache = (int64_t)c->batch * in->cap;
    p->kv_capacity = (int32_t)in->cap;
  }
  const int D = c->D, H = c->heads, T = c->q_len, B = c->batch;

  /* q, q_pe: dense, N(0, 1) */
  in->q_bytes = (size_t)B * T * H * D * in->esz;
  in->qpe_bytes = (size_t)B * T * H * R * in->esz;
  in->q = malloc(in->q_bytes);
  in->q_pe = malloc(in->qpe_bytes);
  for (int64_t i = 0; i < (int64_t)B * T * H * D; i++) fd_store_elem(in->q, c->dtype, i, (float)rnd_normal());
  for (int64_t i = 0; i < (int64_t)B * T * H * R; i++) fd_store_elem(in->q_pe, c->dtype, i, (float)rnd_normal());

  /* caches: rows of rows_cache positions; combined (same element size
   * only): one row of D + R, kpe at column D */
  const int64_t ckv_row = c->combined ? D + R : D, kpe_row = c->combined ? D + R : R;
  in->ckv_bytes = (size_t)in->rows_cache * ckv_row * in->kesz;
  in->ckv_buf = malloc(in->ckv_bytes);
  if (c->combined) {
    in->kpe_buf = in->ckv_buf;
    in->kpe_bytes = in->ckv_bytes;
    in->kpe_off = D;
  } else {
    in->kpe_bytes = (size_t)in->rows_cache * kpe_row * in->resz;
    in->kpe_buf = malloc(in->kpe_bytes);
  }
  for (int64_t i = 0; i < in->rows_cache * ckv_row; i++) store_nan(in->ckv_buf, kv, i);
  if (!c->combined)
    for (int64_t i = 0; i < in->rows_cache * kpe_row; i++) store_nan(in->kpe_buf, rope, i);

  /* the block table: a random permutation of the pages, NaN-filled spare ones */
  if (c->page_size > 0) {
    int *perm = malloc(sizeof(int) * in->pages);
    for (int i = 0; i < in->pages; i++) perm[i] = i;
    for (int i = in->pages - 1; i > 0; i--) {
      const int j = (int)rnd_below((uint64_t)i + 1), x = perm[i];
      perm[i] = perm[j];
      perm[j] = x;
    }
    in->block_table = malloc(sizeof(int32_t) * B * in->max_pages);
    for (int b = 0; b < B; b++)
      for (int k = 0; k < in->max_pages; k++) in->block_table[b * in->max_pages + k] = perm[b * in->max_pages + k];
    free(perm);
  }
  /* scales: TENSOR [1]; TOKEN laid out like the cache's rows */
  if (c->kv_scale == FD_KV_SCALE_TENSOR) {
    in->scale_count = 1;
    in->scales = malloc(sizeof(float));
    in->scales[0] = (float)(0.002 + 0.01 * rnd_uniform());
  } else if (c->kv_scale == FD_KV_SCALE_TOKEN) {
    in->scale_count = (size_t)in->rows_cache;
    in->scales = malloc(sizeof(float) * in->scale_count);
    for (size_t i = 0; i < in->scale_count; i++) in->scales[i] = nan_f();
  }
  /* the read positions: random values (fp8 codes of N(0, 1) * 64 with
   * scales around 1/64 .. 1/16, so keys and values are O(1)) */
  const double code_mul = kv == FD_DTYPE_E4M3 ? 64.0 : kv == FD_DTYPE_E5M2 ? 256.0 : 1.0;
  for (int b = 0; b < B; b++) {
    for (int j = 0; j < in->kv_len[b]; j++) {
      int64_t row;
      if (c->page_size > 0)
        row = (int64_t)in->block_table[b * in->max_pages + j / c->page_size] * c->page_size + j % c->page_size;
      else
        row = (int64_t)b * in->cap + j;
      for (int d = 0; d < D; d++) fd_store_elem(in->ckv_buf, kv, row * ckv_row + d, (float)(rnd_normal() * code_mul));
      const double rmul = rope == kv ? code_mul : 1.0;
      for (int d = 0; d < R; d++)
        fd_store_elem(in->kpe_buf, rope, row * kpe_row + in->kpe_off + d, (float)(rnd_normal() * rmul));
      if (c->kv_scale == FD_KV_SCALE_TOKEN) in->scales[row] = (float)((0.25 + rnd_uniform()) / code_mul);
    }
  }
  if (c->nan_key && in->kv_len[0] > 0) { /* key 0 of sequence 0: every row of it sees it */
    int64_t row = c->page_size > 0 ? (int64_t)in->block_table[0] * c->page_size : 0;
    store_nan(in->ckv_buf, kv, row * ckv_row + D / 3);
  }

  /* host tensors, strides explicit */
  fd_tensors *t = &in->t;
  memset(t, 0, sizeof *t);
  t->q = in->q;
  t->q_strides[0] = (int64_t)T * H * D, t->q_strides[1] = (int64_t)H * D, t->q_strides[2] = D;
  t->q_pe = in->q_pe;
  t->q_pe_strides[0] = (int64_t)T * H * R, t->q_pe_strides[1] = (int64_t)H * R, t->q_pe_strides[2] = R;
  t->k_cache = in->ckv_buf;
  t->k_pe_cache = (const char *)in->kpe_buf + in->kpe_off * (int64_t)in->resz;
  const int64_t rows_per_block = c->page_size > 0 ? c->page_size : in->cap;
  t->k_strides[0] = rows_per_block * ckv_row, t->k_strides[1] = ckv_row, t->k_strides[2] = ckv_row;
  t->k_pe_strides[0] = rows_per_block * kpe_row, t->k_pe_strides[1] = kpe_row, t->k_pe_strides[2] = kpe_row;
  t->kv_len = in->kv_len;
  t->block_table = in->block_table;
  t->block_table_stride = c->page_size > 0 ? in->max_pages : 0;
  t->out_strides[0] = (int64_t)T * H * D, t->out_strides[1] = (int64_t)H * D, t->out_strides[2] = D;
  t->lse_strides[0] = (int64_t)H * T, t->lse_strides[1] = T, t->lse_strides[2] = 1;
  if (c->kv_scale != FD_KV_SCALE_NONE) {
    t->k_scale = in->scales;
    if (c->kv_scale == FD_KV_SCALE_TOKEN) t->scale_strides[0] = rows_per_block, t->scale_strides[1] = 1, t->scale_strides[2] = 1;
  }
}

/* Device tensors of in (fresh copies) and the outputs; *dev_bufs collects
 * what to free. */
typedef struct mla_device {
  void *q, *q_pe, *ckv, *kpe, *kv_len, *bt, *scales, *out, *lse, *ws;
  size_t out_bytes, lse_bytes, ws_bytes;
} mla_device;

static void to_device(const mla_inputs *in, const fd_plan *plan, mla_device *d, fd_tensors *t) {
  memset(d, 0, sizeof *d);
  *t = in->t;
  d->q = dev_copy(in->q, in->q_bytes);
  d->q_pe = dev_copy(in->q_pe, in->qpe_bytes);
  d->ckv = dev_copy(in->ckv_buf, in->ckv_bytes);
  d->kpe = in->kpe_buf == in->ckv_buf ? d->ckv : dev_copy(in->kpe_buf, in->kpe_bytes);
  d->kv_len = dev_copy(in->kv_len, sizeof(int32_t) * in->p.batch);
  if (in->block_table) d->bt = dev_copy(in->block_table, sizeof(int32_t) * in->p.batch * in->max_pages);
  if (in->scales) d->scales = dev_copy(in->scales, sizeof(float) * in->scale_count);
  const fd_problem *p = &in->p;
  const int64_t rows = (int64_t)p->batch * p->q_len * p->num_heads_q;
  d->out_bytes = (size_t)rows * p->head_dim * in->osz;
  d->lse_bytes = (size_t)rows * sizeof(float);
  unsigned char *poison = malloc(d->out_bytes + GUARD);
  memset(poison, 0xff, d->out_bytes); /* NaN in every dtype */
  memset(poison + d->out_bytes, GUARD_BYTE, GUARD);
  d->out = dev_copy(poison, d->out_bytes + GUARD);
  free(poison);
  poison = malloc(d->lse_bytes + GUARD);
  memset(poison, 0xff, d->lse_bytes);
  memset(poison + d->lse_bytes, GUARD_BYTE, GUARD);
  d->lse = dev_copy(poison, d->lse_bytes + GUARD);
  free(poison);
  d->ws_bytes = plan->workspace_size;
  if (d->ws_bytes) {
    poison = malloc(d->ws_bytes);
    memset(poison, 0xff, d->ws_bytes); /* NaN partials: the kernels must write what the combine reads */
    d->ws = dev_copy(poison, d->ws_bytes);
    free(poison);
  }
  t->q = d->q;
  t->q_pe = d->q_pe;
  t->k_cache = d->ckv;
  t->k_pe_cache = (const char *)d->kpe + in->kpe_off * (int64_t)in->resz;
  t->kv_len = d->kv_len;
  t->block_table = d->bt;
  if (in->scales) t->k_scale = d->scales;
  t->out = d->out;
  t->lse = d->lse;
}

static void free_device(mla_device *d) {
  void *all[] = {d->q, d->q_pe, d->ckv, d->kpe == d->ckv ? NULL : d->kpe, d->kv_len, d->bt, d->scales, d->out, d->lse, d->ws};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) fd_gpu_free(all[i]);
}

/* Runs the plan on d (t: device tensors), downloads out and lse (with their
 * guards); 0 on success. */
static int run_device(const fd_plan *plan, const fd_tensors *t, mla_device *d, unsigned char *out,
                      unsigned char *lse, int want_lse, char *why, size_t why_n) {
  fd_tensors tt = *t;
  if (!want_lse) tt.lse = NULL;
  fd_error err;
  const fd_status st = fd_run(plan, &tt, d->ws, d->ws_bytes, NULL, &err);
  if (st != FD_STATUS_OK) {
    snprintf(why, why_n, "fd_run: %s: %s", fd_status_name(st), err.message);
    return -1;
  }
  if (fd_gpu_synchronize() || fd_gpu_download(out, d->out, d->out_bytes + GUARD) ||
      fd_gpu_download(lse, d->lse, d->lse_bytes + GUARD)) {
    snprintf(why, why_n, "kernel error or copy failure (see stderr)");
    return -1;
  }
  return 0;
}

/* Compares a device result with the oracle; prints the case's line; 1 = pass. */
static int check(const mla_case *c, const char *name, const mla_inputs *in, const fd_plan *plan,
                 const unsigned char *out, const unsigned char *lse, const double *ref,
                 const double *ref_lse) {
  const fd_problem *p = &in->p;
  const fd_dtype od = p->out_dtype ? p->out_dtype : p->dtype;
  const int D = p->head_dim, H = p->num_heads_q, T = p->q_len;
  const double floor_rel = fd_tol_out_floor(p->dtype), ltol = fd_tol_lse(p->dtype);
  double worst = 0.0;
  long bad = 0, nan_bad = 0, lse_bad = 0;
  char first[200] = "";
  for (int b = 0; b < p->batch; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const int64_t row = (((int64_t)b * T + t) * H + h) * D;
        const int nan_row = c->nan_key && b == 0 && in->kv_len[0] > 0;
        double rmax = 0.0;
        for (int d = 0; d < D; d++) rmax = fmax(rmax, fabs(ref[row + d]));
        for (int d = 0; d < D; d++) {
          const double g = fd_load_elem(out, od, row + d), r = ref[row + d];
          int ok;
          double ratio = 0.0;
          if (nan_row) {
            ok = isnan(g);
          } else if (isnan(g)) {
            ok = 0;
            nan_bad++;
          } else {
            const double tol = floor_rel * fmax(rmax, 1e-30) + 1e-30;
            ratio = fabs(g - r) / tol;
            ok = ratio <= 1.0;
          }
          if (ratio > worst && !nan_row) worst = ratio;
          if (!ok) {
            if (!bad)
              snprintf(first, sizeof first, "first bad out[b=%d t=%d h=%d d=%d] = %.9g, ref %.9g (row max %.3g)", b, t, h, d,
                       g, r, rmax);
            bad++;
          }
        }
        if (c->lse) {
          const int64_t li = ((int64_t)b * H + h) * T + t;
          float gl;
          memcpy(&gl, lse + 4 * li, 4);
          const double rl = ref_lse[li];
          int ok;
          if (nan_row) ok = isnan(gl);
          else if (isinf(rl)) ok = gl == (float)rl;
          else ok = !isnan(gl) && fabs(gl - rl) <= ltol * fmax(1.0, fabs(rl));
          if (!ok) {
            if (!lse_bad && !bad)
              snprintf(first, sizeof first, "first bad lse[b=%d h=%d t=%d] = %.9g, ref %.9g", b, h, t, (double)gl, rl);
            lse_bad++;
          }
        }
      }
  const int64_t rows = (int64_t)p->batch * T * H;
  int guard_ok = 1;
  for (int i = 0; i < GUARD; i++) {
    if (out[(size_t)rows * D * fd_dtype_size(od) + i] != GUARD_BYTE) guard_ok = 0;
    if (lse[(size_t)rows * 4 + i] != GUARD_BYTE) guard_ok = 0;
  }
  if (!c->lse) /* lse NULL: its buffer stays poisoned */
    for (int64_t i = 0; i < rows * 4; i++)
      if (lse[i] != 0xff) guard_ok = 0;
  const int pass = bad == 0 && lse_bad == 0 && guard_ok;
  printf("%s %s: splits %d, worst err/tol %.3g, bad out %ld (unexpected NaN %ld), bad lse %ld%s%s%s\n",
         pass ? "PASS" : "FAIL", name, plan->num_splits, worst, bad, nan_bad, lse_bad,
         guard_ok ? "" : ", WRITES PAST out/lse (or to lse when NULL)", first[0] ? ", " : "", first);
  return pass;
}

/* Runs one case: plan, device run twice (bitwise equal), oracle, compare;
 * deterministic cases also run each sequence alone (bitwise equal). */
static void run_case(const mla_case *c) {
  char name[256];
  case_name(c, name, sizeof name);
  if (filtered_out(name)) return;
  const char *quick = getenv("FD_TEST_QUICK"); /* compute-sanitizer: the smaller cases */
  if (quick && *quick && *quick != '0') {
    int64_t keys = 0;
    for (int b = 0; b < c->batch; b++) keys += c->kv_len[b];
    if (keys > 3000 || (int64_t)c->heads * c->q_len > 256) return;
  }
  mla_inputs in;
  make_inputs(c, &in);
  fd_error err;
  fd_plan plan, ref_plan;
  fd_status st = fd_plan_init(&plan, &in.p, &err);
  if (st != FD_STATUS_OK) {
    printf("FAIL %s: fd_plan_init: %s: %s\n", name, fd_status_name(st), err.message);
    g_failed++;
    free_inputs(&in);
    return;
  }
  if (plan.kernel != FD_KERNEL_CUDA_MLA) {
    printf("FAIL %s: plan.kernel %d, not FD_KERNEL_CUDA_MLA\n", name, (int)plan.kernel);
    g_failed++;
    free_inputs(&in);
    return;
  }
  fd_problem rp = in.p;
  rp.backend = FD_BACKEND_REFERENCE;
  rp.num_splits = 0;
  rp.deterministic = 0;
  st = fd_plan_init(&ref_plan, &rp, &err);
  if (st != FD_STATUS_OK) {
    printf("FAIL %s: reference fd_plan_init: %s: %s\n", name, fd_status_name(st), err.message);
    g_failed++;
    free_inputs(&in);
    return;
  }
  const int64_t rows = (int64_t)in.p.batch * in.p.q_len * in.p.num_heads_q;
  double *ref = malloc(sizeof(double) * rows * in.p.head_dim);
  double *ref_lse = malloc(sizeof(double) * rows);
  fd_tensors ht = in.t;
  if (fd_reference_f64(&ref_plan, &ht, ref, ref_lse, &err) != FD_STATUS_OK) {
    printf("FAIL %s: fd_reference_f64: %s\n", name, err.message);
    g_failed++;
    free(ref), free(ref_lse), free_inputs(&in);
    return;
  }
  mla_device d;
  fd_tensors dt;
  to_device(&in, &plan, &d, &dt);
  const size_t ob = (size_t)rows * in.p.head_dim * in.osz + GUARD, lb = (size_t)rows * 4 + GUARD;
  unsigned char *out = malloc(ob), *lse = malloc(lb), *out2 = malloc(ob), *lse2 = malloc(lb);
  char why[300];
  int pass = 0;
  if (run_device(&plan, &dt, &d, out, lse, c->lse, why, sizeof why)) {
    printf("FAIL %s: %s\n", name, why);
  } else {
    pass = check(c, name, &in, &plan, out, lse, ref, ref_lse);
    if (run_device(&plan, &dt, &d, out2, lse2, c->lse, why, sizeof why)) {
      printf("FAIL %s (second run): %s\n", name, why);
      pass = 0;
    } else if (memcmp(out, out2, ob) || memcmp(lse, lse2, lb)) {
      printf("FAIL %s: a second run differs (not bitwise reproducible)\n", name);
      pass = 0;
    }
  }
  /* deterministic: each sequence alone (batch 1, the same device inputs) */
  if (pass && c->deterministic) {
    for (int b = 0; b < in.p.batch && pass; b++) {
      fd_problem one = in.p;
      one.batch = 1;
      fd_plan p1;
      if (fd_plan_init(&p1, &one, &err) != FD_STATUS_OK) {
        printf("FAIL %s: batch-1 plan: %s\n", name, err.message);
        pass = 0;
        break;
      }
      fd_tensors t1 = dt;
      const size_t qoff = (size_t)b * dt.q_strides[0] * in.esz, qpoff = (size_t)b * dt.q_pe_strides[0] * in.esz;
      t1.q = (const char *)dt.q + qoff;
      t1.q_pe = (const char *)dt.q_pe + qpoff;
      t1.kv_len = (const int32_t *)dt.kv_len + b;
      if (in.p.page_size > 0) {
        t1.block_table = dt.block_table + (size_t)b * in.max_pages;
      } else {
        t1.k_cache = (const char *)dt.k_cache + (size_t)b * dt.k_strides[0] * in.kesz;
        t1.k_pe_cache = (const char *)dt.k_pe_cache + (size_t)b * dt.k_pe_strides[0] * in.resz;
        if (c->kv_scale == FD_KV_SCALE_TOKEN) t1.k_scale = dt.k_scale + (size_t)b * dt.scale_strides[0];
      }
      const size_t row_bytes = (size_t)in.p.q_len * in.p.num_heads_q * in.p.head_dim * in.osz;
      t1.out = (char *)dt.out + (size_t)b * row_bytes; /* overwrite the batch's own slot */
      t1.lse = (float *)dt.lse + (size_t)b * in.p.num_heads_q * in.p.q_len;
      void *ws1 = NULL;
      if (p1.workspace_size && fd_gpu_malloc(&ws1, p1.workspace_size)) fail_msg("workspace");
      if (fd_run(&p1, &t1, ws1, p1.workspace_size, NULL, &err) != FD_STATUS_OK || fd_gpu_synchronize() ||
          fd_gpu_download(out2, d.out, ob) || fd_gpu_download(lse2, d.lse, lb)) {
        printf("FAIL %s: sequence %d alone: %s\n", name, b, err.message);
        pass = 0;
      } else if (memcmp(out + (size_t)b * row_bytes, out2 + (size_t)b * row_bytes, row_bytes) ||
                 memcmp(lse + (size_t)b * in.p.num_heads_q * in.p.q_len * 4,
                        lse2 + (size_t)b * in.p.num_heads_q * in.p.q_len * 4,
                        (size_t)in.p.num_heads_q * in.p.q_len * 4)) {
        printf("FAIL %s: sequence %d alone differs from it in the batch (deterministic mode)\n", name, b);
        pass = 0;
      }
      if (ws1) fd_gpu_free(ws1);
    }
  }
  if (!pass) g_failed++;
  free(out), free(lse), free(out2), free(lse2), free(ref), free(ref_lse);
  free_device(&d);
  free_inputs(&in);
}

/* The base case every group varies: bf16, D 512, 16 heads, q_len 1, a
 * ragged batch of 3 (one empty), paged 64 with scattered pages, lse. */
static mla_case base_case(void) {
  mla_case c;
  memset(&c, 0, sizeof c);
  c.dtype = FD_DTYPE_BF16;
  c.D = 512;
  c.heads = 16;
  c.q_len = 1;
  c.batch = 3;
  c.kv_len[0] = 1000;
  c.kv_len[1] = 0;
  c.kv_len[2] = 257;
  c.page_size = 64;
  c.lse = 1;
  return c;
}

static void finish_group(const char *group, int failed_before) {
  const int failed = g_failed - failed_before;
  if (failed) fail_msg("%s: %d case(s) failed (lines above)", group, failed);
}

/* dtypes, head_dim, heads, q_len */
static void test_shapes(void **state) {
  (void)state;
  const int before = g_failed;
  const fd_dtype q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  const int dims[2] = {512, 448}, heads[6] = {16, 128, 3, 20, 32, 64}, qlens[4] = {1, 2, 5, 16};
  for (int qi = 0; qi < 2; qi++)
    for (int di = 0; di < 2; di++)
      for (int hi = 0; hi < 6; hi++) {
        mla_case c = base_case();
        c.dtype = q[qi];
        c.D = dims[di];
        c.heads = heads[hi];
        run_case(&c);
      }
  for (int li = 1; li < 4; li++)
    for (int hi = 0; hi < 3; hi++) {
      mla_case c = base_case();
      c.q_len = qlens[li];
      c.heads = heads[hi];
      c.kv_len[0] = 300 + li; /* odd lengths; the causal rows cross tiles */
      c.kv_len[1] = qlens[li];
      c.kv_len[2] = 64;
      run_case(&c);
    }
  mla_case c = base_case(); /* batch of 4 with kv_len 1, and one sequence */
  c.batch = 4;
  c.kv_len[0] = 1, c.kv_len[1] = 65, c.kv_len[2] = 2049, c.kv_len[3] = 0;
  run_case(&c);
  c = base_case();
  c.batch = 1;
  c.kv_len[0] = 40000; /* auto splits; the MLA split bound (32768 keys) */
  run_case(&c);
  finish_group("shapes", before);
}

/* layouts: page sizes, contiguous, combined views, out fp32 */
static void test_layouts(void **state) {
  (void)state;
  const int before = g_failed;
  const int pages[6] = {1, 16, 64, 256, 0, 3};
  for (int pi = 0; pi < 6; pi++)
    for (int comb = 0; comb < 2; comb++)
      for (int hi = 0; hi < 2; hi++) {
        mla_case c = base_case();
        c.page_size = pages[pi];
        c.combined = comb;
        c.heads = hi ? 64 : 16;
        run_case(&c);
      }
  const fd_dtype q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  for (int qi = 0; qi < 2; qi++)
    for (int hi = 0; hi < 2; hi++) {
      mla_case c = base_case();
      c.dtype = q[qi];
      c.out_dtype = FD_DTYPE_F32;
      c.heads = hi ? 128 : 16;
      c.q_len = hi ? 2 : 1;
      run_case(&c);
    }
  finish_group("layouts", before);
}

/* fp8 latent: e4m3 / e5m2, TENSOR / TOKEN, rope 16-bit or fp8 */
static void test_fp8(void **state) {
  (void)state;
  const int before = g_failed;
  const fd_dtype kvs[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2}, q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  const fd_kv_scale sc[3] = {FD_KV_SCALE_TENSOR, FD_KV_SCALE_TOKEN, FD_KV_SCALE_NONE};
  for (int ki = 0; ki < 2; ki++)
    for (int si = 0; si < 3; si++)
      for (int ri = 0; ri < 2; ri++)
        for (int qi = 0; qi < 2; qi++) {
          mla_case c = base_case();
          c.dtype = q[qi];
          c.kv_dtype = kvs[ki];
          c.kv_scale = sc[si];
          c.rope_dtype = ri ? c.dtype : 0; /* 0: fp8 like the latent */
          c.heads = (ki + si + ri + qi) % 2 ? 128 : 16;
          c.q_len = qi ? 2 : 1;
          c.D = ri && qi ? 448 : 512;
          run_case(&c);
        }
  mla_case c = base_case(); /* combined fp8 rows, TOKEN, contiguous and paged 1 */
  c.kv_dtype = FD_DTYPE_E4M3;
  c.kv_scale = FD_KV_SCALE_TOKEN;
  c.combined = 1;
  run_case(&c);
  c.page_size = 0;
  run_case(&c);
  c.page_size = 1;
  c.heads = 64;
  run_case(&c);
  finish_group("fp8", before);
}

/* forced split counts, deterministic mode, NaN in a seen key */
static void test_splits(void **state) {
  (void)state;
  const int before = g_failed;
  for (int s = 1; s <= 7; s++)
    for (int hi = 0; hi < 2; hi++) {
      mla_case c = base_case();
      c.num_splits = s;
      c.heads = hi ? 64 : 16;
      c.q_len = hi ? 2 : 1;
      run_case(&c);
    }
  mla_case c = base_case();
  c.num_splits = 17;
  run_case(&c);
  c.kv_dtype = FD_DTYPE_E4M3;
  c.kv_scale = FD_KV_SCALE_TOKEN;
  run_case(&c);
  for (int hi = 0; hi < 2; hi++) {
    c = base_case();
    c.deterministic = 1;
    c.heads = hi ? 128 : 16;
    c.kv_len[0] = 5000; /* 3 splits of 2048 */
    run_case(&c);
  }
  c = base_case();
  c.deterministic = 1;
  c.page_size = 0;
  c.kv_dtype = FD_DTYPE_E4M3;
  c.kv_scale = FD_KV_SCALE_TOKEN;
  c.kv_len[0] = 4100;
  run_case(&c);
  for (int s = 0; s < 3; s++)
    for (int hi = 0; hi < 2; hi++) {
      c = base_case();
      c.nan_key = 1;
      c.num_splits = s == 0 ? 1 : s == 1 ? 4 : 0;
      c.heads = hi ? 64 : 16;
      run_case(&c);
    }
  c = base_case();
  c.nan_key = 1;
  c.kv_dtype = FD_DTYPE_E4M3;
  c.kv_scale = FD_KV_SCALE_TENSOR;
  run_case(&c);
  finish_group("splits", before);
}

/* The Hopper kernels' shapes (gpu_select.h fd_mla_wgmma_ok: 16-bit caches,
 * head_dim 512, >= 64 rows a sequence; they run them on compute capability
 * 9.0 with sm_90a code, elsewhere mla_kernel.cu does; fd_mla_seesaw_ok picks
 * the seesaw kernel among them): 64 and 128 heads,
 * q_len 1, 2, 16 (causal rows inside and across 64-key tiles), paged 1, 3,
 * 64, 128, 256 and contiguous, combined rows, forced splits, kv_len 0 / 1 / odd,
 * deterministic mode, out fp32, a NaN key. */
static void test_hopper(void **state) {
  (void)state;
  const int before = g_failed;
  fd_gpu_budget g;
  fd_error err;
  memset(&g, 0, sizeof g);
  if (fd_cuda_device_budget(0, &g, &err) == FD_STATUS_OK)
    printf("hopper: device 0 %s the wgmma MLA kernel (compute capability %d.%d, code %d)\n",
           g.wgmma ? "runs" : "does not run", g.cc_major, g.cc_minor, g.code_arch);
  const fd_dtype q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  const int heads[2] = {64, 128}, qlens[3] = {1, 2, 16};
  for (int qi = 0; qi < 2; qi++)
    for (int hi = 0; hi < 2; hi++)
      for (int li = 0; li < 3; li++) {
        mla_case c = base_case();
        c.dtype = q[qi];
        c.heads = li == 2 ? 16 : heads[hi]; /* 16 x 16 = 256 rows (quick runs it) */
        if (li == 2 && hi) c.heads = 64;
        c.q_len = qlens[li];
        c.kv_len[0] = 301 + 2 * li; /* odd; the causal rows end inside a tile */
        c.kv_len[1] = li == 2 ? 16 : 0;
        c.kv_len[2] = 64;
        run_case(&c);
      }
  /* splits of FD_MLA_SS_MIN_SPLIT_KEYS keys or more over contiguous caches
   * and pages of a multiple of 64 keys run the seesaw kernel
   * (mla_seesaw_kernel.cu: TMA copies); shorter splits and other page sizes
   * mla_wgmma_kernel.cu. Each layout runs short (the automatic plan) and
   * long (kv_len 2561 in one forced split of 2624 keys; under 3000 keys a
   * call, so FD_TEST_QUICK runs them). */
  const int pages[6] = {1, 3, 0, 64, 128, 256};
  for (int pi = 0; pi < 6; pi++)
    for (int comb = 0; comb < 2; comb++)
      for (int lng = 0; lng < 2; lng++) {
        mla_case c = base_case();
        c.heads = 128;
        c.page_size = pages[pi];
        c.combined = comb;
        c.kv_len[2] = pi == 5 ? 1500 : c.kv_len[2];
        if (lng) {
          c.kv_len[0] = 2561;
          c.kv_len[2] = 300 + pi;
          c.num_splits = 1;
        }
        run_case(&c);
      }
  for (int lng = 0; lng < 2; lng++) {
    mla_case c = base_case(); /* pages of 64 keys, the pool's size not given */
    c.heads = 128;
    c.pages_unknown = 1;
    if (lng) c.kv_len[0] = 2561, c.num_splits = 1;
    run_case(&c);
  }
  for (int li = 1; li < 3; li++) { /* long splits, causal rows of q_len 2 and 16 */
    mla_case c = base_case();
    c.heads = li == 2 ? 16 : 64;
    c.q_len = li == 2 ? 16 : 2;
    c.page_size = li == 2 ? 0 : 128;
    c.kv_len[0] = 2049 + 2 * li, c.kv_len[1] = 16, c.kv_len[2] = 700;
    c.num_splits = 1;
    run_case(&c);
  }
  const int splits[4] = {1, 2, 3, 7};
  for (int si = 0; si < 4; si++) {
    mla_case c = base_case();
    c.heads = si % 2 ? 64 : 128;
    c.q_len = si % 2 ? 2 : 1;
    c.num_splits = splits[si];
    c.batch = 4;
    c.kv_len[0] = 1, c.kv_len[1] = 0, c.kv_len[2] = 1999, c.kv_len[3] = 65;
    run_case(&c);
  }
  for (int qi = 0; qi < 2; qi++) {
    mla_case c = base_case();
    c.dtype = q[qi];
    c.deterministic = 1;
    c.heads = 128;
    c.kv_len[0] = 2500, c.kv_len[1] = 0, c.kv_len[2] = 300; /* 2 splits of 2048 */
    run_case(&c);
  }
  mla_case c = base_case();
  c.heads = 128;
  c.out_dtype = FD_DTYPE_F32;
  c.q_len = 2;
  run_case(&c);
  for (int s = 0; s < 3; s++) {
    c = base_case();
    c.heads = 128;
    c.nan_key = 1;
    c.num_splits = s == 1 ? 4 : 1;
    if (s == 2) c.kv_len[0] = 2500; /* one split of 2560 keys: the seesaw kernel */
    run_case(&c);
  }
  finish_group("hopper", before);
}

/* ---- append ---- */

/* CUDA append of an MLA cache writes the bytes the host append writes:
 * 16-bit, e4m3 / e5m2 with TENSOR / TOKEN scales, rope 16-bit or fp8,
 * contiguous and paged. */
static void append_case(fd_dtype q, fd_dtype kv, fd_dtype rope, fd_kv_scale ks, int paged, int D) {
  const int B = 2, N = 3, cap = 40, ps = 16, maxp = 3, pages = 7;
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.dtype = q;
  p.kv_dtype = kv == q ? 0 : kv;
  p.rope_dtype = rope;
  p.kv_scale = ks;
  p.batch = B;
  p.q_len = 1;
  p.num_heads_q = 16;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.rope_dim = R;
  p.softmax_scale = 0.1f;
  p.kv_capacity = paged ? 0 : cap;
  p.page_size = paged ? ps : 0;
  p.max_pages_per_seq = paged ? maxp : 0;
  p.num_pages = paged ? pages : 0;
  char name[160];
  snprintf(name, sizeof name, "append_%s_kv%s_rope%s_%s_%s_D%d", tag(q), tag(kv), tag(rope ? rope : kv),
           ks == FD_KV_SCALE_TOKEN ? "token" : ks ? "tensor" : "none", paged ? "paged" : "contig", D);
  if (filtered_out(name)) return;
  fd_plan hp, dp;
  fd_error err;
  p.backend = FD_BACKEND_REFERENCE;
  fd_status st = fd_plan_init(&hp, &p, &err);
  p.backend = FD_BACKEND_CUDA;
  if (st == FD_STATUS_OK) st = fd_plan_init(&dp, &p, &err);
  if (st != FD_STATUS_OK) {
    printf("FAIL %s: fd_plan_init: %s\n", name, err.message);
    g_failed++;
    return;
  }
  const fd_dtype rd = rope ? rope : kv;
  const size_t esz = fd_dtype_size(q), kesz = fd_dtype_size(kv), resz = fd_dtype_size(rd);
  const int64_t rows = paged ? (int64_t)pages * ps : (int64_t)B * cap;
  const size_t ckv_b = (size_t)rows * D * kesz, kpe_b = (size_t)rows * R * resz, sc_b = (size_t)rows * 4;
  unsigned char *ckv = malloc(ckv_b), *kpe = malloc(kpe_b), *ckv2 = malloc(ckv_b), *kpe2 = malloc(kpe_b);
  float *sc = malloc(sc_b), *sc2 = malloc(sc_b);
  for (size_t i = 0; i < ckv_b; i++) ckv[i] = (unsigned char)rnd_below(256);
  for (size_t i = 0; i < kpe_b; i++) kpe[i] = (unsigned char)rnd_below(256);
  for (int64_t i = 0; i < rows; i++) sc[i] = (float)(0.01 + rnd_uniform());
  void *kn = malloc((size_t)B * N * D * esz), *pn = malloc((size_t)B * N * R * esz);
  for (int64_t i = 0; i < (int64_t)B * N * D; i++) fd_store_elem(kn, q, i, (float)(rnd_normal() * 3.0));
  for (int64_t i = 0; i < (int64_t)B * N * R; i++) fd_store_elem(pn, q, i, (float)(rnd_normal() * 3.0));
  if (q == FD_DTYPE_BF16) fd_store_elem(kn, q, 5, nan_f()); /* a NaN keeps its sign either way */
  int32_t kv_len[2] = {5, 30}, bt[6] = {4, 0, 6, 2, 5, 1};
  fd_append_tensors t;
  memset(&t, 0, sizeof t);
  t.k_new = kn;
  t.k_pe_new = pn;
  t.k_cache = ckv;
  t.k_pe_cache = kpe;
  t.kv_len = kv_len;
  t.block_table = paged ? bt : NULL;
  t.k_scale = ks ? sc : NULL;
  memcpy(ckv2, ckv, ckv_b);
  memcpy(kpe2, kpe, kpe_b);
  memcpy(sc2, sc, sc_b);
  st = fd_append_kv(&hp, &t, N, NULL, &err);
  if (st != FD_STATUS_OK) {
    printf("FAIL %s: host append: %s\n", name, err.message);
    g_failed++;
  } else {
    void *d_kn = dev_copy(kn, (size_t)B * N * D * esz), *d_pn = dev_copy(pn, (size_t)B * N * R * esz);
    void *d_ckv = dev_copy(ckv2, ckv_b), *d_kpe = dev_copy(kpe2, kpe_b), *d_sc = dev_copy(sc2, sc_b);
    void *d_len = dev_copy(kv_len, sizeof kv_len), *d_bt = dev_copy(bt, sizeof bt);
    fd_append_tensors dt = t;
    dt.k_new = d_kn, dt.k_pe_new = d_pn, dt.k_cache = d_ckv, dt.k_pe_cache = d_kpe, dt.kv_len = d_len;
    dt.block_table = paged ? d_bt : NULL;
    dt.k_scale = ks ? d_sc : NULL;
    st = fd_append_kv(&dp, &dt, N, NULL, &err);
    if (st != FD_STATUS_OK || fd_gpu_synchronize() || fd_gpu_download(ckv2, d_ckv, ckv_b) ||
        fd_gpu_download(kpe2, d_kpe, kpe_b) || fd_gpu_download(sc2, d_sc, sc_b)) {
      printf("FAIL %s: cuda append: %s\n", name, st != FD_STATUS_OK ? err.message : "kernel or copy error");
      g_failed++;
    } else {
      const int c1 = memcmp(ckv, ckv2, ckv_b), c2 = memcmp(kpe, kpe2, kpe_b), c3 = memcmp(sc, sc2, sc_b);
      long first = -1;
      for (size_t i = 0; i < ckv_b && first < 0; i++)
        if (ckv[i] != ckv2[i]) first = (long)i;
      printf("%s %s: latent %s, rope %s, scales %s%s\n", c1 || c2 || c3 ? "FAIL" : "PASS", name,
             c1 ? "DIFFER" : "same", c2 ? "DIFFER" : "same", c3 ? "DIFFER" : "same", first >= 0 ? " (first latent byte differs)" : "");
      if (first >= 0) printf("  first differing latent byte %ld: host 0x%02x, cuda 0x%02x\n", first, ckv[first], ckv2[first]);
      if (c1 || c2 || c3) g_failed++;
    }
    void *all[] = {d_kn, d_pn, d_ckv, d_kpe, d_sc, d_len, d_bt};
    for (int i = 0; i < 7; i++) fd_gpu_free(all[i]);
  }
  free(ckv), free(kpe), free(ckv2), free(kpe2), free(sc), free(sc2), free(kn), free(pn);
}

static void test_append(void **state) {
  (void)state;
  const int before = g_failed;
  for (int paged = 0; paged < 2; paged++) {
    append_case(FD_DTYPE_BF16, FD_DTYPE_BF16, 0, FD_KV_SCALE_NONE, paged, 512);
    append_case(FD_DTYPE_F16, FD_DTYPE_F16, 0, FD_KV_SCALE_NONE, paged, 448);
    for (int k = 0; k < 2; k++) {
      const fd_dtype kv = k ? FD_DTYPE_E5M2 : FD_DTYPE_E4M3;
      for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
        if (s == FD_KV_SCALE_HEAD) continue;
        append_case(FD_DTYPE_BF16, kv, 0, (fd_kv_scale)s, paged, 512);
        append_case(FD_DTYPE_BF16, kv, FD_DTYPE_BF16, (fd_kv_scale)s, paged, 512);
        append_case(FD_DTYPE_F16, kv, FD_DTYPE_F16, (fd_kv_scale)s, paged, 448);
      }
    }
  }
  finish_group("append", before);
}

/* The MLA case grid of mla_cases.c (the CPU backend's fixture, shared) on
 * CUDA, through device memory. */
static const fd_mla_mem gpu_mla_mem = {fd_gpu_malloc, fd_gpu_free, fd_gpu_upload, fd_gpu_download,
                                       fd_gpu_synchronize};

static void test_fixture_grid(void **state) {
  (void)state;
  static fd_mla_case cases[512];
  const int n = fd_mla_grid_cases(FD_BACKEND_CUDA, cases, 512);
  const uint64_t seed = fd_test_seed();
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char name[256];
    fd_mla_case_name(&cases[i], name, sizeof name);
    if (filtered_out(name)) continue;
    const int f = fd_mla_case_run(&cases[i], seed, &gpu_mla_mem);
    printf("%s fixture %s%s\n", f ? "FAIL" : "PASS", name, f ? " (checks above)" : "");
    failed += f != 0;
  }
  if (failed) fail_msg("fixture grid: %d of %d case(s) failed", failed, n);
}

int main(void) {
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  { /* a GPU whose shared memory holds no MLA block (99 KB a block, or a build
     * capped by FD_CUDA_SMEM_LIMIT_KB): the plan refuses MLA there */
    fd_problem probe;
    memset(&probe, 0, sizeof probe);
    probe.backend = FD_BACKEND_CUDA;
    probe.dtype = FD_DTYPE_BF16;
    probe.batch = 1;
    probe.num_heads_q = 128;
    probe.num_heads_kv = 1;
    probe.head_dim = 512;
    probe.rope_dim = R;
    probe.kv_capacity = 64;
    probe.softmax_scale = 0.1f;
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &probe, &err) == FD_STATUS_UNSUPPORTED) {
      printf("SKIP: this GPU runs no MLA kernel: %s\n", err.message);
      return 77;
    }
  }
  const uint64_t seed = fd_test_seed();
  printf("gpu_mla: FD_TEST_SEED=%llu\n", (unsigned long long)seed);
  g_rng = fd_mix64(seed ^ 0x6d6c61ull);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes), cmocka_unit_test(test_layouts), cmocka_unit_test(test_fp8),
      cmocka_unit_test(test_splits), cmocka_unit_test(test_hopper), cmocka_unit_test(test_append),
      cmocka_unit_test(test_fixture_grid),
  };
  const int rc = cmocka_run_group_tests_name("gpu_mla", tests, NULL, NULL);
  printf("gpu_mla: %d case(s) failed\n", g_failed);
  return rc;
}
