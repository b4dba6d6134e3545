/*
 * mla_fuzz.c — random CPU MLA calls (fd_problem.rope_dim > 0) checked
 * against the float64 oracle (fd_reference_f64) under every instruction set
 * this machine has. Not part of the build:
 *
 *   cc -O1 -g -std=c11 -fopenmp -Iinclude -Isrc dev/cpu/mla_fuzz.c \
 *      build-cpu/libflashdecode.a -lm -o /tmp/mla_fuzz
 *   /tmp/mla_fuzz [SECONDS [SEED]]        (default 60 s, seed from the clock)
 *   /tmp/mla_fuzz case SEED               (one case again, verbose)
 *   /tmp/mla_fuzz list N SEED             (the shapes of a run's first N cases)
 *
 * (against an FD_SANITIZE=ON build add -fsanitize=address,undefined.)
 * Each case draws: dtype (bf16 mostly, f16, f32), an fp8 latent (e4m3 /
 * e5m2, TENSOR / HEAD / TOKEN scales, rope fp8 or 16-bit), head_dim (512,
 * 448, 480, other multiples of 32, any 1..512), rope_dim (64, 32, any),
 * heads 1..128, q_len 1..16 (or a tree mask), batch 1..3, kv_len around
 * multiples of 32 and 256, contiguous or paged caches (page 1, 16, 64, 256
 * or any, pages scattered, gaps between pages), the rope part after the
 * latent in one row or in its own buffer with padded rows of any stride,
 * q_pe in q's rows or its own, out and lse with padded strides, split
 * counts 0 / 1..many, deterministic, 1 or 2 threads, and magnitudes: q
 * scaled up to 64x, keys growing or shrinking along the sequence (the
 * running max moves a lot between blocks), rows whose scores are all -inf.
 * Checked per instruction set: status OK, out / lse guard bytes and the
 * gaps of their strides untouched, the workspace's guards, the inputs
 * unchanged, and per row out and lse against the oracle (as tests/
 * mla_fixture.c: max|err| <= floor * max|ref|, NaN exactly where the
 * oracle has NaN, rows without a key out 0 and lse -inf).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "flashdecode.h"
#include "internal.h"
#include "cpu/cpu_kernels.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
typedef struct rng {
  uint64_t s;
} rng;
static uint64_t next(rng *r) { return mix64(r->s += 0x9e3779b97f4a7c15ull); }
static double uni(rng *r) { return ((double)(next(r) >> 11) + 0.5) * 0x1.0p-53; }
static int below(rng *r, int n) { return (int)(next(r) % (uint64_t)n); }
static double normal(rng *r) {
  const double u1 = uni(r), u2 = uni(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static int pick(rng *r, const int *v, int n) { return v[below(r, n)]; }

typedef struct cfg {
  fd_dtype dtype, kv_dtype, rope_dtype;
  fd_kv_scale kv_scale;
  int out_f32, D, R, H, T, B, tree;
  int32_t kv_len[4];
  int page, table_mode, combined, q_combined, kpad, ppad, page_gap, qpad, opad, lpad;
  int splits, det, threads, with_lse;
  double q_gain, key_ramp; /* key j scaled by exp(key_ramp * j / 32) (clamped) */
  int ninf_rows;           /* rows whose scores are all -inf (q_pe[0] = -inf) */
  int saw;                 /* key gains 1..13 jumping block to block (the max moves) */
  int nan_key;             /* one element of one key NaN (the rows that see it: NaN) */
  float scale;
} cfg;


static void describe(const cfg *c, char *s, size_t n) {
  int k = snprintf(s, n,
                   "%s kv=%s rope=%s scale%d outf32=%d D=%d R=%d H=%d T=%d tree=%d B=%d kv=[", fd_dtype_name(c->dtype),
                   fd_dtype_name(c->kv_dtype), fd_dtype_name(c->rope_dtype), (int)c->kv_scale, c->out_f32, c->D, c->R, c->H,
                   c->T, c->tree, c->B);
  for (int b = 0; b < c->B; b++) k += snprintf(s + k, n - k, "%s%d", b ? "," : "", c->kv_len[b]);
  snprintf(s + k, n - k,
           "] page=%d table=%d gap=%d combined=%d qcomb=%d kpad=%d ppad=%d qpad=%d opad=%d lpad=%d splits=%d "
           "det=%d threads=%d lse=%d qgain=%g ramp=%g saw=%d ninf=%d nan=%d smscale=%g",
           c->page, c->table_mode, c->page_gap, c->combined, c->q_combined, c->kpad, c->ppad, c->qpad, c->opad,
           c->lpad, c->splits, c->det, c->threads, c->with_lse, c->q_gain, c->key_ramp, c->saw, c->ninf_rows, c->nan_key,
           (double)c->scale);
}

static int32_t draw_len(rng *r) {
  static const int bases[] = {0, 1, 31, 32, 33, 64, 255, 256, 257, 288, 511, 512, 513, 1024, 2048};
  switch (below(r, 4)) {
    case 0: return below(r, 40);
    case 1: return below(r, 1300);
    case 2: {
      const int v = pick(r, bases, 15) + below(r, 5) - 2;
      return v < 0 ? 0 : v;
    }
    default: {
      const int v = 32 * below(r, 40) + below(r, 3) - 1;
      return v < 0 ? 0 : v;
    }
  }
}

static void draw(rng *r, cfg *c) {
  memset(c, 0, sizeof *c);
  const int dt = below(r, 10);
  c->dtype = dt < 7 ? FD_DTYPE_BF16 : dt < 9 ? FD_DTYPE_F16 : FD_DTYPE_F32;
  c->kv_dtype = c->dtype;
  if (c->dtype != FD_DTYPE_F32 && below(r, 4) == 0) {
    c->kv_dtype = below(r, 3) ? FD_DTYPE_E4M3 : FD_DTYPE_E5M2;
    c->kv_scale = (fd_kv_scale)below(r, 4); /* NONE, TENSOR, HEAD, TOKEN */
    c->rope_dtype = below(r, 2) ? c->kv_dtype : c->dtype;
  } else {
    c->rope_dtype = c->kv_dtype;
  }
  c->out_f32 = below(r, 4) == 0;
  static const int dims[] = {512, 512, 512, 448, 448, 480, 256, 64, 96, 32};
  c->D = below(r, 6) ? pick(r, dims, 10) : 1 + below(r, 512);
  c->R = below(r, 5) ? 64 : below(r, 2) ? 32 : 1 + below(r, 64);
  static const int heads[] = {1, 2, 4, 8, 9, 12, 16, 16, 16, 17, 32, 33, 64, 100, 128, 128};
  c->H = pick(r, heads, 16);
  c->tree = below(r, 12) == 0;
  const int tq = below(r, 4);
  c->T = tq == 0 ? 1 + below(r, 16) : tq == 1 ? 2 : 1;
  if (c->tree) c->T = 1 + below(r, c->H <= 16 ? 40 : 16);
  c->B = 1 + below(r, 3);
  /* keep the work bounded (2 shared cores, 3-5 instruction sets) */
  const int64_t budget = 12000000; /* rows x keys x columns */
  for (int b = 0; b < c->B; b++) {
    c->kv_len[b] = draw_len(r);
    if (below(r, 10) == 0) c->kv_len[b] = 3000 + below(r, 3000);
    int64_t rows = (int64_t)c->H * c->T;
    while (c->kv_len[b] > 0 && rows * c->kv_len[b] * (c->D + c->R) > budget) c->kv_len[b] /= 2;
  }
  static const int pages[] = {0, 0, 0, 1, 16, 64, 256, 16, 64, 7};
  c->page = pick(r, pages, 10);
  if (c->page == 7) c->page = 1 + below(r, 256);
  c->page_gap = below(r, 3) == 0 ? below(r, 40) : 0;
  /* pages: shuffled, in order (blocks evenly spaced across pages), in
   * reverse order (page 1: rows evenly spaced with a negative step), or one
   * pool shared by every sequence (a common prefix) */
  c->table_mode = below(r, 2) ? 0 : 1 + below(r, 3);
  c->combined = below(r, 3) == 0;
  c->q_combined = below(r, 3) == 0;
  c->kpad = below(r, 2) ? 0 : below(r, 3) ? below(r, 40) : 8;
  c->ppad = below(r, 2) ? 0 : below(r, 40);
  c->qpad = below(r, 3) ? 0 : below(r, 20);
  c->opad = below(r, 3) ? 0 : below(r, 20);
  c->lpad = below(r, 3) ? 0 : below(r, 5);
  c->splits = below(r, 3) == 0 ? 0 : below(r, 2) ? 1 : 1 + below(r, 40);
  c->det = below(r, 6) == 0;
  if (c->det) c->splits = 0; /* the deterministic mode fixes the split length */
  c->threads = 1 + below(r, 2);
  c->with_lse = below(r, 5) != 0;
  static const double gains[] = {1, 1, 1, 4, 16, 64};
  c->q_gain = gains[below(r, 6)];
  if (c->dtype == FD_DTYPE_F32) c->q_gain = 1; /* float32 scores: error grows with |s| */
  c->key_ramp = below(r, 3) == 0 && c->dtype != FD_DTYPE_F32 ? (uni(r) - 0.5) * 2.0 : 0.0;
  c->ninf_rows = below(r, 8) == 0;
  c->nan_key = below(r, 8) == 0;
  c->saw = below(r, 4) == 0 && c->dtype != FD_DTYPE_F32;
  if (below(r, 3) == 0) { /* the AMX values over groups of 8 blocks: bf16, many rows, long */
    c->dtype = c->kv_dtype = c->rope_dtype = FD_DTYPE_BF16;
    c->kv_scale = FD_KV_SCALE_NONE;
    c->D = below(r, 2) ? 512 : 448;
    c->R = 64;
    static const int h2[] = {9, 16, 32, 64, 128};
    c->H = h2[below(r, 5)];
    c->T = c->tree ? 1 + below(r, 4) : 1 + below(r, 2);
    c->B = 1;
    c->kv_len[0] = 256 * (1 + below(r, 8)) + below(r, 70) - 35;
    while ((int64_t)c->H * c->T * c->kv_len[0] > 400000) c->kv_len[0] /= 2;
    c->splits = c->det ? 0 : 1 + below(r, 3);
  }
  c->scale = below(r, 3) || c->dtype == FD_DTYPE_F32 ? (float)(1.0 / sqrt(192.0)) : (float)(0.01 + uni(r));
}

/* a guarded buffer: GUARD | n bytes of `fill` | GUARD */
static unsigned char *guarded(size_t n, int fill) {
  unsigned char *p = malloc(n + 2 * GUARD);
  memset(p, GUARD_BYTE, GUARD);
  memset(p + GUARD, fill, n);
  memset(p + GUARD + n, GUARD_BYTE, GUARD);
  return p;
}
static int guards_ok(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < GUARD; i++)
    if (p[i] != GUARD_BYTE || p[GUARD + n + i] != GUARD_BYTE) return 0;
  return 1;
}

static double out_floor(fd_dtype t) { return t == FD_DTYPE_F32 ? 1e-5 : t == FD_DTYPE_F16 ? 1e-3 : 8e-3; }
static double lse_tol(fd_dtype t) { return t == FD_DTYPE_F32 ? 1e-5 : 1e-4; }

static int verbose = 0;

/* One case: returns the number of failed checks. */
static int run_case(uint64_t seed) {
  rng r = {seed};
  cfg c;
  draw(&r, &c);
  char desc[1024];
  describe(&c, desc, sizeof desc);
  if (verbose) printf("case %llu: %s\n", (unsigned long long)seed, desc);
  const int D = c.D, R = c.R, H = c.H, T = c.T, B = c.B;
  const size_t eq = fd_dtype_size(c.dtype), ekv = fd_dtype_size(c.kv_dtype), erp = fd_dtype_size(c.rope_dtype);
  const size_t eo = c.out_f32 ? 4 : eq;
  int32_t longest = 0;
  for (int b = 0; b < B; b++)
    if (c.kv_len[b] > longest) longest = c.kv_len[b];
  const int32_t cap = longest + 1 + below(&r, 40);

  /* q */
  const int64_t qw = (c.q_combined ? D + R : D) + c.qpad;
  const size_t qn = (size_t)B * T * H * qw;
  unsigned char *q = calloc(qn * eq + 64, 1), *qpe = NULL;
  int64_t qs[3] = {(int64_t)T * H * qw, (int64_t)H * qw, qw}, ps[3];
  if (c.q_combined) {
    memcpy(ps, qs, sizeof ps);
  } else {
    const int64_t pw = R + c.qpad;
    qpe = calloc((size_t)B * T * H * pw * eq + 64, 1);
    ps[0] = (int64_t)T * H * pw, ps[1] = (int64_t)H * pw, ps[2] = pw;
  }
  unsigned char *qpe_base = c.q_combined ? q + (size_t)D * eq : qpe;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const int64_t o = b * qs[0] + t * qs[1] + h * qs[2], po = b * ps[0] + t * ps[1] + h * ps[2];
        for (int i = 0; i < D; i++) fd_store_elem(q, c.dtype, o + i, (float)(normal(&r) * c.q_gain));
        for (int i = 0; i < R; i++) fd_store_elem(qpe_base, c.dtype, po + i, (float)(normal(&r) * c.q_gain));
        if (c.ninf_rows && (h + t) % 3 == 1) fd_store_elem(qpe_base, c.dtype, po, -INFINITY);
      }

  /* caches */
  int32_t blocks, rows_per, max_pages = 0, num_pages = 0, *table = NULL, table_stride = 0;
  if (c.page) {
    max_pages = (cap + c.page - 1) / c.page;
    int32_t used = 0;
    for (int b = 0; b < B; b++) used += (c.kv_len[b] + c.page - 1) / c.page;
    num_pages = used + 1 + below(&r, 4);
    blocks = num_pages;
    rows_per = c.page;
    table_stride = max_pages + below(&r, 3);
    table = malloc((size_t)B * table_stride * sizeof *table + 4);
    int32_t *perm = malloc((size_t)num_pages * sizeof *perm);
    for (int i = 0; i < num_pages; i++) perm[i] = i;
    if (c.table_mode == 0)
      for (int i = num_pages - 1; i > 0; i--) {
        const int k = below(&r, i + 1), x = perm[i];
        perm[i] = perm[k], perm[k] = x;
      }
    if (c.table_mode == 2)
      for (int i = 0; i < num_pages; i++) perm[i] = num_pages - 1 - i;
    int nx = 0;
    for (int b = 0; b < B; b++) {
      const int need = (c.kv_len[b] + c.page - 1) / c.page;
      if (c.table_mode == 3) nx = 0; /* every sequence from page perm[0] on */
      for (int i = 0; i < table_stride; i++)
        table[(size_t)b * table_stride + i] = i < need ? perm[nx++] : perm[num_pages - 1];
    }
    free(perm);
  } else {
    blocks = B;
    rows_per = cap;
  }
  unsigned char *kv, *pe;
  int64_t ks[3], kps[3];
  size_t kv_bytes, pe_bytes = 0;
  int pe_in_kv = 0;
  if (c.combined) {
    /* one row: D latent then R rope elements, padded; its width in bytes a
     * multiple of both element sizes */
    const size_t pe_off = ((size_t)D * ekv + erp - 1) / erp * erp; /* k_pe aligned */
    size_t row = pe_off + (size_t)R * erp + (size_t)c.kpad * 2;
    row = (row + 1) / 2 * 2;
    if (erp == 4 || ekv == 4) row = (row + 3) / 4 * 4;
    const size_t block = (size_t)rows_per * row + (size_t)c.page_gap * 4;
    kv_bytes = (size_t)blocks * block;
    kv = malloc(kv_bytes);
    memset(kv, 0xff, kv_bytes);
    ks[1] = ks[2] = (int64_t)(row / ekv), ks[0] = (int64_t)(block / ekv);
    kps[1] = kps[2] = (int64_t)(row / erp), kps[0] = (int64_t)(block / erp);
    pe = kv + pe_off;
    pe_in_kv = 1;
  } else {
    const int64_t kw = D + c.kpad, pw = R + c.ppad;
    ks[1] = ks[2] = kw, ks[0] = (int64_t)rows_per * kw + c.page_gap;
    kps[1] = kps[2] = pw, kps[0] = (int64_t)rows_per * pw + c.page_gap;
    kv_bytes = (size_t)blocks * ks[0] * ekv;
    pe_bytes = (size_t)blocks * kps[0] * erp;
    kv = malloc(kv_bytes);
    pe = malloc(pe_bytes);
    memset(kv, 0xff, kv_bytes);
    memset(pe, 0xff, pe_bytes);
  }
  float *scales = NULL;
  int64_t ss[3] = {0, 0, 0};
  size_t scale_n = 1;
  if (c.kv_scale == FD_KV_SCALE_TOKEN) {
    ss[2] = 1, ss[1] = 1 + below(&r, 2), ss[0] = (int64_t)rows_per * ss[1] + below(&r, 3);
    scale_n = (size_t)blocks * ss[0];
    scales = malloc(scale_n * sizeof *scales);
    for (size_t i = 0; i < scale_n; i++) scales[i] = NAN;
  } else if (c.kv_scale != FD_KV_SCALE_NONE) {
    scales = malloc(sizeof *scales);
    scales[0] = (float)((1.0 + 0.75 * uni(&r)) * ldexp(1.0, -(2 + below(&r, 4))));
  }
  const int fp8 = fd_dtype_is_fp8(c.kv_dtype), rfp8 = fd_dtype_is_fp8(c.rope_dtype);
  for (int b = 0; b < B; b++)
    for (int32_t j = 0; j < c.kv_len[b]; j++) {
      int64_t base;
      if (c.page) {
        base = table[(size_t)b * table_stride + j / c.page];
      } else {
        base = b;
      }
      const int32_t pos = c.page ? j % c.page : j;
      float s = 1.0f;
      if (c.kv_scale == FD_KV_SCALE_TOKEN) {
        s = (float)((1.0 + 0.75 * uni(&r)) * ldexp(1.0, -(2 + below(&r, 4))));
        scales[base * ss[0] + pos * ss[1]] = s;
      } else if (scales) {
        s = scales[0];
      }
      double g = exp(c.key_ramp * j / 32.0);
      if (g > 64) g = 64;
      if (g < 1.0 / 64) g = 1.0 / 64;
      if (c.saw) g *= 1 + 3 * ((j / 32 * 7 + b) % 5);
      const int64_t ko = base * ks[0] + pos * ks[1], po = base * kps[0] + pos * kps[1];
      for (int i = 0; i < D; i++) fd_store_elem(kv, c.kv_dtype, ko + i, (float)(normal(&r) * g / (fp8 ? s : 1.0f)));
      for (int i = 0; i < R; i++) {
        double x = normal(&r) * g;
        if (c.ninf_rows && i == 0) x = 0.5 + fabs(x); /* q_pe[0] = -inf: every score -inf */
        fd_store_elem(pe, c.rope_dtype, po + i, (float)(x / (rfp8 ? s : 1.0f)));
      }
    }
  if (c.nan_key) { /* a key near the end (seen by some causal rows only) or anywhere */
    const int b = below(&r, B);
    if (c.kv_len[b] > 0) {
      const int32_t j = below(&r, 2) ? c.kv_len[b] - 1 - below(&r, c.kv_len[b] < T ? c.kv_len[b] : T)
                                     : below(&r, c.kv_len[b]);
      const int64_t base = c.page ? table[(size_t)b * table_stride + j / c.page] : b;
      const int32_t pos = c.page ? j % c.page : j;
      /* with a tree mask, in the rope part only: a NaN in the latent (V) of a
       * draft key a row's mask hides may still give that row NaN (zero
       * weight times NaN; flashdecode.h, TREE MASKS) */
      const int i = c.tree ? D + below(&r, R) : below(&r, D + R);
      if (i < D) fd_store_elem(kv, c.kv_dtype, base * ks[0] + pos * ks[1] + i, NAN);
      else fd_store_elem(pe, c.rope_dtype, base * kps[0] + pos * kps[1] + i - D, NAN);
    }
  }
  /* the largest |key element| of each sequence (the scores' float32 error
   * allowance below) */
  double kmax[4] = {0, 0, 0, 0};
  for (int b = 0; b < B; b++)
    for (int32_t j = 0; j < c.kv_len[b]; j++) {
      const int64_t base = c.page ? table[(size_t)b * table_stride + j / c.page] : b;
      const int32_t pos = c.page ? j % c.page : j;
      double s = 1.0;
      if (c.kv_scale == FD_KV_SCALE_TOKEN) s = scales[base * ss[0] + pos * ss[1]];
      else if (scales) s = scales[0];
      for (int i = 0; i < D; i++)
        kmax[b] = fmax(kmax[b], fabs(fd_load_elem(kv, c.kv_dtype, base * ks[0] + pos * ks[1] + i) * s));
      for (int i = 0; i < R; i++)
        kmax[b] = fmax(kmax[b], fabs(fd_load_elem(pe, c.rope_dtype, base * kps[0] + pos * kps[1] + i) *
                                     (rfp8 ? s : 1.0)));
    }
  /* the byte copies to check the inputs against */
  unsigned char *q_copy = malloc(qn * eq + 64), *qpe_copy = NULL, *kv_copy = malloc(kv_bytes), *pe_copy = NULL;
  memcpy(q_copy, q, qn * eq + 64);
  memcpy(kv_copy, kv, kv_bytes);
  const size_t qpe_bytes = c.q_combined ? 0 : (size_t)B * T * H * (R + c.qpad) * eq + 64;
  if (!c.q_combined) {
    qpe_copy = malloc(qpe_bytes);
    memcpy(qpe_copy, qpe, qpe_bytes);
  }
  if (!pe_in_kv) {
    pe_copy = malloc(pe_bytes);
    memcpy(pe_copy, pe, pe_bytes);
  }
  uint64_t *tree = NULL;
  if (c.tree) {
    tree = malloc((size_t)B * T * sizeof *tree);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        uint64_t m = 1ull << t;
        const int mode = below(&r, 3);
        for (int j = 0; j < T; j++) {
          if (mode == 0 && j < t) m |= 1ull << j;                    /* chain */
          if (mode == 1 && below(&r, 2)) m |= 1ull << j;             /* any */
          if (mode == 2 && j < t && below(&r, 3) == 0) m |= 1ull << j; /* sparse ancestors */
        }
        tree[(size_t)b * T + t] = m;
      }
  }

  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_REFERENCE;
  p.dtype = c.dtype;
  p.kv_dtype = c.kv_dtype;
  p.rope_dtype = c.rope_dtype == c.kv_dtype ? 0 : c.rope_dtype;
  p.kv_scale = c.kv_scale;
  p.out_dtype = c.out_f32 ? FD_DTYPE_F32 : 0;
  p.batch = B;
  p.q_len = T;
  p.num_heads_q = H;
  p.num_heads_kv = 1;
  p.head_dim = D;
  p.rope_dim = R;
  p.softmax_scale = c.scale;
  p.kv_capacity = c.page ? 0 : cap;
  p.page_size = c.page;
  p.max_pages_per_seq = c.page ? max_pages : 0;
  p.num_pages = c.page ? num_pages : 0;
  p.tree_mask = c.tree;
  p.num_threads = c.threads;
  fd_tensors tn_;
  memset(&tn_, 0, sizeof tn_);
  fd_tensors *t = &tn_;
  t->q = q;
  memcpy(t->q_strides, qs, sizeof qs);
  t->q_pe = qpe_base;
  memcpy(t->q_pe_strides, ps, sizeof ps);
  t->k_cache = kv;
  memcpy(t->k_strides, ks, sizeof ks);
  t->k_pe_cache = pe;
  memcpy(t->k_pe_strides, kps, sizeof kps);
  t->kv_len = c.kv_len;
  t->block_table = table;
  t->block_table_stride = table_stride;
  t->k_scale = scales;
  memcpy(t->scale_strides, ss, sizeof ss);
  t->tree_mask = tree;
  t->tree_mask_stride = tree ? T : 0;

  int failed = 0;
  fd_error err;
  fd_plan rplan;
  if (fd_plan_init(&rplan, &p, &err) != FD_STATUS_OK) {
    printf("SKIP case %llu (reference plan: %s): %s\n", (unsigned long long)seed, err.message, desc);
    goto done;
  }
  const size_t nrows = (size_t)B * T * H;
  double *ref = malloc(nrows * D * sizeof *ref), *ref_lse = malloc(nrows * sizeof *ref_lse);
  if (fd_reference_f64(&rplan, t, ref, ref_lse, &err) != FD_STATUS_OK) {
    printf("FAIL case %llu reference: %s: %s\n", (unsigned long long)seed, err.message, desc);
    failed++;
    goto done2;
  }

  /* out [B, T, H, D + opad] strides {b, t, h}; lse [B, H, T + lpad] */
  const int64_t os[3] = {(int64_t)T * H * (D + c.opad), (int64_t)H * (D + c.opad), D + c.opad};
  const size_t out_n = (size_t)B * os[0];
  const int64_t ls[3] = {(int64_t)H * (T + c.lpad), T + c.lpad, 1};
  const size_t lse_n = (size_t)B * ls[0];
  static const char *const isas[] = {"scalar", "avx2", "avx512", "avx512_bf16", "amx"};
  const fd_cpu_isa best = fd_cpu_isa_available();
  for (int isa = (int)best; isa >= 0; isa--) {
    if (isa == 1 && below(&r, 2)) continue; /* avx2: every other case */
    setenv("FD_CPU_ISA", isas[isa], 1);
    p.backend = FD_BACKEND_CPU;
    p.num_splits = c.splits;
    p.deterministic = c.det;
    fd_plan plan;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) {
      printf("FAIL case %llu isa %s: plan: %s: %s\n", (unsigned long long)seed, isas[isa], err.message, desc);
      failed++;
      continue;
    }
    unsigned char *ob = guarded(out_n * eo, 0xff), *lb = guarded(lse_n * 4, 0xff);
    unsigned char *wb = guarded(plan.workspace_size, 0x77);
    t->out = ob + GUARD;
    memcpy(t->out_strides, os, sizeof os);
    t->lse = c.with_lse ? (float *)(lb + GUARD) : NULL;
    memcpy(t->lse_strides, ls, sizeof ls);
    const fd_status st = fd_run(&plan, t, wb + GUARD, plan.workspace_size, NULL, &err);
    char where[64];
    snprintf(where, sizeof where, "case %llu isa %s splits %d", (unsigned long long)seed, isas[isa],
             plan.num_splits);
    int f = 0;
    if (st != FD_STATUS_OK) {
      printf("FAIL %s: fd_run: %s\n", where, err.message);
      f++;
    } else {
      if (!guards_ok(ob, out_n * eo)) printf("FAIL %s: out guard\n", where), f++;
      if (!guards_ok(lb, lse_n * 4)) printf("FAIL %s: lse guard\n", where), f++;
      if (!guards_ok(wb, plan.workspace_size)) printf("FAIL %s: workspace guard\n", where), f++;
      if (memcmp(q, q_copy, qn * eq + 64) || memcmp(kv, kv_copy, kv_bytes) ||
          (qpe_copy && memcmp(qpe, qpe_copy, qpe_bytes)) || (pe_copy && memcmp(pe, pe_copy, pe_bytes)))
        printf("FAIL %s: an input changed\n", where), f++;
      /* gaps of the strides untouched (0xff) */
      const unsigned char *o = ob + GUARD;
      int gap_bad = 0;
      for (int b = 0; b < B; b++)
        for (int tk = 0; tk < T; tk++)
          for (int h = 0; h < H; h++)
            for (int i = D; i < D + c.opad; i++)
              for (size_t e = 0; e < eo; e++)
                gap_bad |= o[((size_t)(b * os[0] + tk * os[1] + h * os[2] + i)) * eo + e] != 0xff;
      if (!c.with_lse) {
        for (size_t i = 0; i < lse_n * 4; i++) gap_bad |= lb[GUARD + i] != 0xff;
      } else {
        for (int b = 0; b < B; b++)
          for (int h = 0; h < H; h++)
            for (int tk = T; tk < T + c.lpad; tk++)
              for (int e = 0; e < 4; e++) gap_bad |= lb[GUARD + (b * ls[0] + h * ls[1] + tk) * 4 + e] != 0xff;
      }
      if (gap_bad) printf("FAIL %s: wrote into a stride gap\n", where), f++;
      const fd_dtype ot = c.out_f32 ? FD_DTYPE_F32 : c.dtype;
      const double fl = out_floor(c.dtype), lt = lse_tol(c.dtype);
      int reported = 0;
      for (int b = 0; b < B; b++)
        for (int tk = 0; tk < T; tk++)
          for (int h = 0; h < H; h++) {
            const size_t row = ((size_t)b * T + tk) * H + h;
            const double *rf = ref + row * D;
            const double rl = ref_lse[((size_t)b * H + h) * T + tk];
            const double ol = c.with_lse ? ((float *)(lb + GUARD))[b * ls[0] + h * ls[1] + tk] : 0.0;
            int ref_nan = isnan(rl);
            for (int i = 0; i < D; i++) ref_nan |= isnan(rf[i]);
            const int none = !ref_nan && rl == -INFINITY; /* no key with weight */
            double amax = 0, em = 0;
            int bad = 0;
            for (int i = 0; i < D; i++) {
              const double x = fd_load_elem(o, ot, b * os[0] + tk * os[1] + h * os[2] + i);
              if (ref_nan) {
                bad |= !isnan(x);
                continue;
              }
              if (none) {
                bad |= x != 0.0;
                continue;
              }
              const double e = fabs(x - rf[i]);
              if (!(e <= em)) em = e;
              if (fabs(rf[i]) > amax) amax = fabs(rf[i]);
            }
            /* 16-bit q: scores far from 1 (q gain, key ramp, softmax_scale) lose
             * float32 bits to cancellation: allow es = a few float32 ulps of
             * scale * sum|q| * max|k| per score (0 for float32 cases, whose
             * inputs stay standard normal) */
            double es = 0.0;
            if (c.dtype != FD_DTYPE_F32) {
              double qa = 0.0;
              const int64_t qo = b * qs[0] + tk * qs[1] + h * qs[2], po = b * ps[0] + tk * ps[1] + h * ps[2];
              for (int i = 0; i < D; i++) qa += fabs(fd_load_elem(q, c.dtype, qo + i));
              for (int i = 0; i < R; i++) qa += fabs(fd_load_elem(qpe_base, c.dtype, po + i));
              es = (double)c.scale * qa * kmax[b] * sqrt((double)(D + R)) * 0x1.0p-24;
              if (!isfinite(es)) es = 0.0;
            }
            if (!ref_nan && !none && !(em <= (fl + 2 * es) * amax + 1e-30)) bad = 1;
            if (c.with_lse) {
              if (ref_nan) bad |= !isnan(ol);
              else if (none) bad |= !(ol == -INFINITY);
              else bad |= !(fabs(ol - rl) <= lt * fmax(1.0, fabs(rl)) + es);
            }
            if (bad) {
              f++;
              if (reported++ < 4)
                printf("FAIL %s: row b%d t%d h%d: err %.3g bound %.3g (max|ref| %.3g, es %.3g) lse %.9g ref %.9g%s\n",
                       where, b, tk, h, em, (fl + 2 * es) * amax, amax, es, ol, rl, ref_nan ? " (ref NaN)" : "");
            }
          }
    }
    if (f) printf("  %s\n", desc);
    failed += f;
    free(ob);
    free(lb);
    free(wb);
  }
done2:
  free(ref);
  free(ref_lse);
done:
  free(q);
  free(qpe);
  free(kv);
  if (!pe_in_kv) free(pe);
  free(scales);
  free(table);
  free(tree);
  free(q_copy);
  free(qpe_copy);
  free(kv_copy);
  free(pe_copy);
  return failed;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[1], "list")) { /* the first N cases' shapes, not run */
    const uint64_t seed = strtoull(argv[3], NULL, 10);
    for (int i = 0; i < atoi(argv[2]); i++) {
      const uint64_t cs = mix64(seed + (uint64_t)i);
      rng r = {cs};
      cfg c;
      char desc[1024];
      draw(&r, &c);
      describe(&c, desc, sizeof desc);
      printf("%llu: %s\n", (unsigned long long)cs, desc);
    }
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[1], "case")) {
    verbose = 1;
    return run_case(strtoull(argv[2], NULL, 10)) ? 1 : 0;
  }
  const double seconds = argc >= 2 ? atof(argv[1]) : 60.0;
  const uint64_t seed = argc >= 3 ? strtoull(argv[2], NULL, 10) : mix64((uint64_t)time(NULL) ^ (uint64_t)clock());
  printf("mla_fuzz: seed %llu, %g s\n", (unsigned long long)seed, seconds);
  fflush(stdout);
  const double t0 = now();
  int cases = 0, bad = 0;
  for (uint64_t i = 0; now() - t0 < seconds; i++) {
    const uint64_t cs = mix64(seed + i);
    const int f = run_case(cs);
    cases++;
    if (f) {
      bad++;
      printf("  -> reproduce: mla_fuzz case %llu\n", (unsigned long long)cs);
    }
    fflush(stdout);
  }
  printf("mla_fuzz: %d cases, %d failed (seed %llu)\n", cases, bad, (unsigned long long)seed);
  return bad ? 1 : 0;
}
