/*
 * mla_fixture.c — the MLA test case (mla_fixture.h): inputs, one checked
 * fd_run, the case runner and its cmocka group.
 *
 * Inputs: q_nope, q_pe, c_kv and k_pe drawn standard normal (fp8: c_kv / s,
 * and k_pe / s when the rope part is fp8, rounded to the fp8 type, s the
 * key's scale: (1 + 3/4 u) 2^-k, k in 2..5, one a tensor or one a
 * position). Sequence b's q rows and keys come from (seed, seq_id[b]) alone,
 * so a sequence has the same inputs in any batch. Caches: contiguous
 * [batch, kv_capacity, 1, .] or paged pools of num_pages = the pages used +
 * 3 with the pages handed out in shuffled order. Everything no row may read
 * (positions past kv_len, unused pages, the gap after a combined row, TOKEN
 * scales there) holds NaN.
 */
#include "mla_fixture.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtype.h"
#include "harness.h"
#include "internal.h"
#include "cpu/cpu_kernels.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

static int host_alloc(void **ptr, size_t bytes) {
  *ptr = malloc(bytes ? bytes : 1);
  return *ptr ? 0 : -1;
}
static int host_release(void *ptr) {
  free(ptr);
  return 0;
}
static int host_copy(void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
  return 0;
}
static int host_sync(void) { return 0; }

const fd_mla_mem fd_mla_host_mem = {host_alloc, host_release, host_copy, host_copy, host_sync};

static const char *tag(fd_dtype t) {
  switch (t) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_E4M3: return "e4m3";
    case FD_DTYPE_E5M2: return "e5m2";
  }
  return "?";
}

void fd_mla_case_name(const fd_mla_case *c, char *buf, size_t size) {
  size_t n = 0;
#define PUT(...)                                                               \
  do {                                                                         \
    if (n < size) n += (size_t)snprintf(buf + n, size - n, __VA_ARGS__);      \
  } while (0)
  PUT("%s/%s", fd_backend_name(c->backend), tag(c->dtype));
  if (c->kv_dtype && c->kv_dtype != c->dtype) PUT("/kv-%s", tag(c->kv_dtype));
  if (c->rope_dtype && c->rope_dtype != c->kv_dtype) PUT("/rope-%s", tag(c->rope_dtype));
  if (c->kv_scale) PUT("/scale-%s", c->kv_scale == FD_KV_SCALE_TENSOR ? "tensor"
                                    : c->kv_scale == FD_KV_SCALE_HEAD ? "head" : "token");
  PUT("/d%d+%d/h%d/b%d/kv[", c->head_dim, c->rope_dim, c->num_heads_q, c->batch);
  for (int b = 0; b < c->batch; b++) PUT("%s%d", b ? "," : "", c->kv_len[b]);
  PUT("]/q%d", c->q_len);
  if (c->page_size) PUT("/paged%d", c->page_size);
  PUT("%s%s", c->combined ? "/combined" : "/separate", c->q_combined ? "/qcombined" : "");
  if (c->row_pad) PUT("/rowpad%d", c->row_pad);
  if (c->num_splits) PUT("/splits%d", c->num_splits);
  if (c->sweep_splits) PUT("/sweep%d", c->sweep_splits);
  if (c->deterministic) PUT("/det");
  if (c->out_f32) PUT("/outf32");
  if (c->with_lse) PUT("/lse");
  if (c->nan_key) PUT("/nankey");
  if (c->num_threads) PUT("/t%d", c->num_threads);
  if (c->cpu_isa) PUT("/isa%d", c->cpu_isa - 1);
#undef PUT
}

/* ---- data ------------------------------------------------------------------ */

/* One tensor: host bytes and the fd_mla_mem copy (the same bytes). */
typedef struct buffer {
  unsigned char *host;
  void *dev;
  size_t bytes;
} buffer;

struct fd_mla_data {
  fd_mla_case c;
  char name[512];
  const fd_mla_mem *mem;
  int32_t capacity, max_pages, num_pages;
  size_t e_q, e_kv, e_rope, e_out;
  /* q: q_nope [batch, q_len, heads, qw] (qw = D, or D + R when combined) and
   * q_pe (its own [.., R] buffer, or the same buffer at column D) */
  buffer q, q_pe, kv, pe, scales, kv_len, table;
  int64_t q_strides[3], q_pe_strides[3], k_strides[3], k_pe_strides[3], scale_strides[3];
  size_t pe_offset; /* combined: bytes from kv's base to k_pe's */
  double *ref, *ref_lse;
};

static double normal(fd_rng *r) { return fd_rng_normal(r); }

static float draw_scale(fd_rng *r) {
  return (float)((1.0 + 0.75 * fd_rng_uniform(r)) * ldexp(1.0, -(int)(2 + fd_rng_below(r, 4))));
}

/* The NaN of `t`, written as element i of base. */
static void put_nan(void *base, fd_dtype t, int64_t i) {
  switch (t) {
    case FD_DTYPE_F32: ((float *)base)[i] = NAN; break;
    case FD_DTYPE_F16: ((uint16_t *)base)[i] = 0x7e00; break;
    case FD_DTYPE_BF16: ((uint16_t *)base)[i] = 0x7fc0; break;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: ((uint8_t *)base)[i] = 0x7f; break;
  }
}

static int buf_new(buffer *b, size_t bytes) {
  b->bytes = bytes ? bytes : 16;
  b->host = malloc(b->bytes);
  if (!b->host) return -1;
  memset(b->host, 0xff, b->bytes); /* NaN in every float type until written */
  return 0;
}

static int buf_upload(buffer *b, const fd_mla_mem *mem) {
  if (mem->alloc(&b->dev, b->bytes)) return -1;
  return mem->upload(b->dev, b->host, b->bytes);
}

static void buf_free(buffer *b, const fd_mla_mem *mem) {
  free(b->host);
  if (b->dev) mem->release(b->dev);
  b->host = NULL;
  b->dev = NULL;
}

void fd_mla_data_free(fd_mla_data *d) {
  if (!d) return;
  buffer *all[] = {&d->q, &d->kv, &d->scales, &d->kv_len, &d->table};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i], d->mem);
  if (!d->c.q_combined) buf_free(&d->q_pe, d->mem);
  if (!d->c.combined) buf_free(&d->pe, d->mem);
  free(d->ref);
  free(d->ref_lse);
  free(d);
}

static fd_dtype kv_type(const fd_mla_case *c) { return c->kv_dtype ? c->kv_dtype : c->dtype; }
static fd_dtype rope_type(const fd_mla_case *c) { return c->rope_dtype ? c->rope_dtype : kv_type(c); }

fd_problem fd_mla_data_problem(const fd_mla_data *d, int32_t num_splits) {
  const fd_mla_case *c = &d->c;
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = c->backend;
  p.dtype = c->dtype;
  p.kv_dtype = c->kv_dtype;
  p.rope_dtype = c->rope_dtype;
  p.kv_scale = c->kv_scale;
  p.out_dtype = c->out_f32 ? FD_DTYPE_F32 : 0;
  p.batch = c->batch;
  p.q_len = c->q_len;
  p.num_heads_q = c->num_heads_q;
  p.num_heads_kv = 1;
  p.head_dim = c->head_dim;
  p.rope_dim = c->rope_dim;
  p.softmax_scale = (float)(1.0 / sqrt(192.0));
  p.kv_capacity = d->capacity;
  p.page_size = c->page_size;
  p.max_pages_per_seq = c->page_size ? d->max_pages : 0;
  p.num_pages = c->page_size ? d->num_pages : 0;
  p.num_splits = num_splits;
  p.deterministic = c->deterministic;
  p.num_threads = c->num_threads;
  return p;
}

/* Byte offset in the cache of position j of sequence b with row stride
 * (elements of e bytes) s. */
static size_t cache_pos(const fd_mla_data *d, const int64_t s[3], size_t e, int32_t b, int32_t j) {
  const int32_t P = d->c.page_size;
  if (P == 0) return ((size_t)b * s[0] + (size_t)j * s[1]) * e;
  const int32_t page = ((const int32_t *)d->table.host)[(size_t)b * d->max_pages + j / P];
  return ((size_t)page * s[0] + (size_t)(j % P) * s[1]) * e;
}

static size_t scale_pos(const fd_mla_data *d, int32_t b, int32_t j) {
  return cache_pos(d, d->scale_strides, 1, b, j); /* in floats */
}

fd_mla_data *fd_mla_data_new(const fd_mla_case *c, uint64_t seed, const fd_mla_mem *mem) {
  fd_mla_data *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->c = *c;
  d->mem = mem;
  fd_mla_case_name(c, d->name, sizeof d->name);
  const int32_t D = c->head_dim, R = c->rope_dim, H = c->num_heads_q, T = c->q_len, B = c->batch;
  if (B < 1 || B > FD_MLA_MAX_BATCH) {
    fprintf(stderr, "%s: bad batch\n", d->name);
    free(d);
    return NULL;
  }
  const fd_dtype kvt = kv_type(c), rt = rope_type(c);
  d->e_q = fd_dtype_size(c->dtype);
  d->e_kv = fd_dtype_size(kvt);
  d->e_rope = fd_dtype_size(rt);
  d->e_out = c->out_f32 ? 4 : d->e_q;
  int32_t longest = 0;
  for (int b = 0; b < B; b++)
    if (c->kv_len[b] > longest) longest = c->kv_len[b];
  d->capacity = longest + (c->kv_capacity_pad ? c->kv_capacity_pad : 1);
  fd_rng cr = {fd_mix64(seed ^ 0x6d6c61ull ^ (uint64_t)strlen(d->name) * 0x9e37ull)};
  for (const char *s = d->name; *s; s++) cr.state = fd_mix64(cr.state ^ (uint64_t)(unsigned char)*s);
  fd_rng gr = {fd_mix64(seed ^ 0x7363616c65ull)}; /* the tensor scale: the same in every case */

  /* q: [B, T, H, qw] (+ q_pe [B, T, H, R] when separate) */
  const int64_t qw = c->q_combined ? D + R : D;
  if (buf_new(&d->q, (size_t)B * T * H * qw * d->e_q)) goto oom;
  d->q_strides[2] = qw, d->q_strides[1] = H * qw, d->q_strides[0] = (int64_t)T * H * qw;
  if (c->q_combined) {
    d->q_pe = d->q;
    for (int i = 0; i < 3; i++) d->q_pe_strides[i] = d->q_strides[i];
  } else {
    if (buf_new(&d->q_pe, (size_t)B * T * H * R * d->e_q)) goto oom;
    d->q_pe_strides[2] = R, d->q_pe_strides[1] = (int64_t)H * R, d->q_pe_strides[0] = (int64_t)T * H * R;
  }

  /* caches: rows of `rows` positions in `blocks` blocks (batch or pages) */
  int32_t blocks, rows;
  if (c->page_size > 0) {
    d->max_pages = (d->capacity + c->page_size - 1) / c->page_size;
    int32_t used = 0;
    for (int b = 0; b < B; b++) used += (c->kv_len[b] + c->page_size - 1) / c->page_size;
    d->num_pages = used + 3;
    blocks = d->num_pages;
    rows = c->page_size;
    if (buf_new(&d->table, (size_t)B * d->max_pages * sizeof(int32_t))) goto oom;
    int32_t *perm = malloc((size_t)d->num_pages * sizeof *perm);
    if (!perm) goto oom;
    for (int32_t i = 0; i < d->num_pages; i++) perm[i] = i;
    for (int32_t i = d->num_pages - 1; i > 0; i--) {
      const int32_t k = (int32_t)fd_rng_below(&cr, (uint64_t)i + 1), x = perm[i];
      perm[i] = perm[k];
      perm[k] = x;
    }
    int32_t *table = (int32_t *)d->table.host, next = 0;
    for (int b = 0; b < B; b++) {
      const int32_t need = (c->kv_len[b] + c->page_size - 1) / c->page_size;
      for (int32_t i = 0; i < d->max_pages; i++)
        table[(size_t)b * d->max_pages + i] = i < need ? perm[next++] : perm[d->num_pages - 1];
    }
    free(perm);
  } else {
    blocks = B;
    rows = d->capacity;
  }
  if (c->combined) {
    /* one row of D latent then R rope elements, padded to 16 bytes */
    size_t row = (size_t)D * d->e_kv + (size_t)R * d->e_rope;
    row = (row + 15) / 16 * 16;
    d->pe_offset = (size_t)D * d->e_kv;
    if (buf_new(&d->kv, (size_t)blocks * rows * row)) goto oom;
    d->pe = d->kv;
    d->k_strides[2] = d->k_strides[1] = (int64_t)(row / d->e_kv);
    d->k_strides[0] = (int64_t)rows * d->k_strides[1];
    d->k_pe_strides[2] = d->k_pe_strides[1] = (int64_t)(row / d->e_rope);
    d->k_pe_strides[0] = (int64_t)rows * d->k_pe_strides[1];
  } else {
    const int64_t kw = (D * (int64_t)d->e_kv + 15) / 16 * 16 / (int64_t)d->e_kv + /* 16-byte rows */
                       c->row_pad;
    const int64_t pw = (R * (int64_t)d->e_rope + 15) / 16 * 16 / (int64_t)d->e_rope + 2 * c->row_pad;
    if (buf_new(&d->kv, (size_t)blocks * rows * kw * d->e_kv)) goto oom;
    if (buf_new(&d->pe, (size_t)blocks * rows * pw * d->e_rope)) goto oom;
    d->k_strides[2] = d->k_strides[1] = kw, d->k_strides[0] = rows * kw;
    d->k_pe_strides[2] = d->k_pe_strides[1] = pw, d->k_pe_strides[0] = rows * pw;
  }
  if (c->kv_scale == FD_KV_SCALE_TOKEN) {
    if (buf_new(&d->scales, (size_t)blocks * rows * sizeof(float))) goto oom;
    d->scale_strides[2] = 1, d->scale_strides[1] = 1, d->scale_strides[0] = rows;
  } else if (c->kv_scale != FD_KV_SCALE_NONE) {
    if (buf_new(&d->scales, sizeof(float))) goto oom;
    ((float *)d->scales.host)[0] = draw_scale(&gr);
  }
  if (buf_new(&d->kv_len, (size_t)B * sizeof(int32_t))) goto oom;
  memcpy(d->kv_len.host, c->kv_len, (size_t)B * sizeof(int32_t));

  /* every element NaN first (buf_new), then the inputs rows may read */
  unsigned char *kv = d->kv.host, *pe = d->pe.host + d->pe_offset;
  const int fp8 = fd_dtype_is_fp8(kvt), rope_fp8 = fd_dtype_is_fp8(rt);
  for (int b = 0; b < B; b++) {
    fd_rng r = {fd_mix64(seed ^ fd_mix64(0x5e9ull + (uint64_t)(c->seq_id[b] ? c->seq_id[b] : b)))};
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const size_t qo = (size_t)b * d->q_strides[0] + (size_t)t * d->q_strides[1] + (size_t)h * d->q_strides[2];
        for (int i = 0; i < D; i++) fd_store_elem(d->q.host, c->dtype, (int64_t)(qo + i), (float)normal(&r));
        const size_t po = c->q_combined ? qo + D
                                        : (size_t)b * d->q_pe_strides[0] + (size_t)t * d->q_pe_strides[1] +
                                              (size_t)h * d->q_pe_strides[2];
        for (int i = 0; i < R; i++) fd_store_elem(d->q_pe.host, c->dtype, (int64_t)(po + i), (float)normal(&r));
      }
    for (int32_t j = 0; j < c->kv_len[b]; j++) {
      float s = 1.0f;
      if (c->kv_scale == FD_KV_SCALE_TOKEN) {
        s = draw_scale(&r);
        ((float *)d->scales.host)[scale_pos(d, b, j)] = s;
      } else if (c->kv_scale != FD_KV_SCALE_NONE) {
        s = ((float *)d->scales.host)[0];
      }
      unsigned char *k = kv + cache_pos(d, d->k_strides, d->e_kv, b, j);
      unsigned char *p = pe + cache_pos(d, d->k_pe_strides, d->e_rope, b, j);
      for (int i = 0; i < D; i++) fd_store_elem(k, kvt, i, (float)(normal(&r) / (fp8 ? s : 1.0f)));
      for (int i = 0; i < R; i++) fd_store_elem(p, rt, i, (float)(normal(&r) / (rope_fp8 ? s : 1.0f)));
    }
  }
  if (c->nan_key && c->kv_len[0] > 0) put_nan(kv + cache_pos(d, d->k_strides, d->e_kv, 0, 0), kvt, D / 2);

  /* the oracle, on the host copies */
  {
    fd_problem rp = fd_mla_data_problem(d, 0);
    rp.backend = FD_BACKEND_REFERENCE;
    rp.deterministic = 0;
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &rp, &err) != FD_STATUS_OK) {
      fprintf(stderr, "%s: reference plan: %s\n", d->name, err.message);
      fd_mla_data_free(d);
      return NULL;
    }
    fd_tensors t;
    memset(&t, 0, sizeof t);
    t.q = d->q.host;
    t.q_pe = c->q_combined ? (const void *)(d->q.host + (size_t)D * d->e_q) : d->q_pe.host;
    t.k_cache = d->kv.host;
    t.k_pe_cache = d->pe.host + d->pe_offset;
    t.kv_len = (const int32_t *)d->kv_len.host;
    t.block_table = c->page_size ? (const int32_t *)d->table.host : NULL;
    t.block_table_stride = d->max_pages;
    t.k_scale = c->kv_scale ? (const float *)d->scales.host : NULL;
    memcpy(t.q_strides, d->q_strides, sizeof t.q_strides);
    memcpy(t.q_pe_strides, d->q_pe_strides, sizeof t.q_pe_strides);
    memcpy(t.k_strides, d->k_strides, sizeof t.k_strides);
    memcpy(t.k_pe_strides, d->k_pe_strides, sizeof t.k_pe_strides);
    memcpy(t.scale_strides, d->scale_strides, sizeof t.scale_strides);
    t.out_strides[2] = D, t.out_strides[1] = (int64_t)H * D, t.out_strides[0] = (int64_t)T * H * D;
    d->ref = malloc((size_t)B * T * H * D * sizeof(double));
    d->ref_lse = malloc((size_t)B * T * H * sizeof(double));
    if (!d->ref || !d->ref_lse) goto oom;
    if (fd_reference_f64(&plan, &t, d->ref, d->ref_lse, &err) != FD_STATUS_OK) {
      fprintf(stderr, "%s: reference: %s\n", d->name, err.message);
      fd_mla_data_free(d);
      return NULL;
    }
  }
  /* the copies fd_run reads */
  if (buf_upload(&d->q, mem) || (!c->q_combined && buf_upload(&d->q_pe, mem)) ||
      buf_upload(&d->kv, mem) || (!c->combined && buf_upload(&d->pe, mem)) ||
      buf_upload(&d->kv_len, mem) || (c->page_size && buf_upload(&d->table, mem)) ||
      (c->kv_scale && buf_upload(&d->scales, mem))) {
    fprintf(stderr, "%s: device copies failed\n", d->name);
    fd_mla_data_free(d);
    return NULL;
  }
  if (c->q_combined) d->q_pe.dev = d->q.dev;
  if (c->combined) d->pe.dev = d->kv.dev;
  return d;
oom:
  fprintf(stderr, "%s: out of memory\n", d->name);
  fd_mla_data_free(d);
  return NULL;
}

fd_tensors fd_mla_data_tensors(const fd_mla_data *d) {
  const fd_mla_case *c = &d->c;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = d->q.dev;
  t.q_pe = c->q_combined ? (const void *)((const char *)d->q.dev + (size_t)c->head_dim * d->e_q) : d->q_pe.dev;
  t.k_cache = d->kv.dev;
  t.k_pe_cache = (const char *)d->pe.dev + d->pe_offset;
  t.kv_len = (const int32_t *)d->kv_len.dev;
  t.block_table = c->page_size ? (const int32_t *)d->table.dev : NULL;
  t.block_table_stride = c->page_size ? d->max_pages : 0;
  t.k_scale = c->kv_scale ? (const float *)d->scales.dev : NULL;
  memcpy(t.q_strides, d->q_strides, sizeof t.q_strides);
  memcpy(t.q_pe_strides, d->q_pe_strides, sizeof t.q_pe_strides);
  memcpy(t.k_strides, d->k_strides, sizeof t.k_strides);
  memcpy(t.k_pe_strides, d->k_pe_strides, sizeof t.k_pe_strides);
  if (c->kv_scale == FD_KV_SCALE_TOKEN) memcpy(t.scale_strides, d->scale_strides, sizeof t.scale_strides);
  return t;
}

size_t fd_mla_data_seq_out_bytes(const fd_mla_data *d) {
  return (size_t)d->c.q_len * d->c.num_heads_q * d->c.head_dim * d->e_out;
}
size_t fd_mla_data_seq_lse_bytes(const fd_mla_data *d) {
  return (size_t)d->c.q_len * d->c.num_heads_q * sizeof(float);
}

/* ---- one run ------------------------------------------------------------------- */

static int fails(const fd_mla_data *d, const char *what, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL %s [%s]: ", d->name, what);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 1;
}

/* A guarded buffer: GUARD bytes, `bytes` of poison (0xff: NaN), GUARD bytes. */
static int guarded_new(const fd_mla_data *d, size_t bytes, unsigned char **host, void **dev) {
  const size_t all = bytes + 2 * GUARD;
  *host = malloc(all);
  if (!*host) return -1;
  memset(*host, GUARD_BYTE, GUARD);
  memset(*host + GUARD, 0xff, bytes);
  memset(*host + GUARD + bytes, GUARD_BYTE, GUARD);
  if (d->mem->alloc(dev, all)) return -1;
  return d->mem->upload(*dev, *host, all);
}

static int guards_ok(const unsigned char *h, size_t bytes) {
  for (size_t i = 0; i < GUARD; i++)
    if (h[i] != GUARD_BYTE || h[GUARD + bytes + i] != GUARD_BYTE) return 0;
  return 1;
}

/* The input copies still hold the host bytes. */
static int inputs_intact(const fd_mla_data *d) {
  const buffer *all[] = {&d->q, &d->q_pe, &d->kv, &d->pe, &d->scales, &d->kv_len, &d->table};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    const buffer *b = all[i];
    if (!b->host || !b->dev) continue;
    unsigned char *now = malloc(b->bytes);
    if (!now) return 0;
    const int ok = !d->mem->download(now, b->dev, b->bytes) && !memcmp(now, b->host, b->bytes);
    free(now);
    if (!ok) return 0;
  }
  return 1;
}

int fd_mla_data_run(fd_mla_data *d, const fd_plan *plan, const char *what,
                    unsigned char **out_bytes, unsigned char **lse_bytes) {
  const fd_mla_case *c = &d->c;
  const int32_t D = c->head_dim, H = c->num_heads_q, T = c->q_len, B = c->batch;
  const size_t rows = (size_t)B * T * H;
  const size_t out_size = rows * D * d->e_out, lse_size = rows * sizeof(float);
  const size_t ws_size = plan->workspace_size;
  unsigned char *oh = NULL, *lh = NULL, *wh = NULL;
  void *od = NULL, *ld = NULL, *wd = NULL;
  int failed = 0;
  if (guarded_new(d, out_size, &oh, &od) || (c->with_lse && guarded_new(d, lse_size, &lh, &ld)) ||
      guarded_new(d, ws_size, &wh, &wd)) {
    failed += fails(d, what, "out of memory");
    goto done;
  }
  fd_tensors t = fd_mla_data_tensors(d);
  t.out = (char *)od + GUARD;
  t.out_strides[2] = D, t.out_strides[1] = (int64_t)H * D, t.out_strides[0] = (int64_t)T * H * D;
  if (c->with_lse) {
    t.lse = (float *)((char *)ld + GUARD);
    t.lse_strides[2] = 1, t.lse_strides[1] = T, t.lse_strides[0] = (int64_t)H * T;
  }
  fd_error err;
  fd_status st;
  if (c->cpu_isa > 0) {
    /* the kernels of one instruction set, on tensors whose strides are
     * explicit (what fd_run hands the backend) */
    if ((fd_cpu_isa)(c->cpu_isa - 1) > fd_cpu_isa_detect()) {
      printf("  (%s: instruction set %d not on this machine, skipped)\n", d->name, c->cpu_isa - 1);
      goto done;
    }
    st = fd_cpu_run_isa(plan, &t, (char *)wd + GUARD, (fd_cpu_isa)(c->cpu_isa - 1), &err);
  } else {
    st = fd_run(plan, &t, (char *)wd + GUARD, ws_size, NULL, &err);
  }
  if (st != FD_STATUS_OK) {
    failed += fails(d, what, "fd_run: %s: %s", fd_status_name(st), err.message);
    goto done;
  }
  if (d->mem->sync() || d->mem->download(oh, od, out_size + 2 * GUARD) ||
      (c->with_lse && d->mem->download(lh, ld, lse_size + 2 * GUARD)) ||
      d->mem->download(wh, wd, ws_size + 2 * GUARD)) {
    failed += fails(d, what, "device error after fd_run");
    goto done;
  }
  if (!guards_ok(oh, out_size)) failed += fails(d, what, "out's guard bytes changed");
  if (c->with_lse && !guards_ok(lh, lse_size)) failed += fails(d, what, "lse's guard bytes changed");
  if (!guards_ok(wh, ws_size)) failed += fails(d, what, "the workspace's guard bytes changed");
  if (!inputs_intact(d)) failed += fails(d, what, "an input changed");

  const fd_dtype out_t = c->out_f32 ? FD_DTYPE_F32 : c->dtype;
  const double floor = fd_tol_out_floor(c->dtype), ltol = fd_tol_lse(c->dtype);
  int reported = 0;
  for (int b = 0; b < B; b++)
    for (int tk = 0; tk < T; tk++)
      for (int h = 0; h < H; h++) {
        const size_t row = ((size_t)b * T + tk) * H + h;
        const double *ref = d->ref + row * D;
        const size_t li = ((size_t)b * H + h) * T + tk;
        const double rl = d->ref_lse[li];
        const double ol = c->with_lse ? (double)((const float *)(lh + GUARD))[li] : 0.0;
        const int sees = c->kv_len[b] - T + tk >= 0;
        int bad = 0;
        double amax = 0.0, err_max = 0.0;
        int ref_nan = isnan(rl);
        for (int i = 0; i < D; i++) ref_nan |= isnan(ref[i]);
        if (c->nan_key && b == 0 && sees && !ref_nan) bad = 1; /* the oracle must see it too */
        for (int i = 0; i < D; i++) {
          const double o = fd_load_elem(oh + GUARD, out_t, (int64_t)(row * D + i));
          if (ref_nan) {
            if (!isnan(o)) bad = 1;
            continue;
          }
          if (!sees) {
            if (o != 0.0) bad = 1;
            continue;
          }
          const double e = fabs(o - ref[i]);
          if (!(e <= err_max)) err_max = e; /* NaN sticks */
          if (fabs(ref[i]) > amax) amax = fabs(ref[i]);
        }
        if (!ref_nan && sees && !(err_max <= floor * amax + 1e-30)) bad = 1;
        if (c->with_lse) {
          if (ref_nan) {
            if (!isnan(ol)) bad = 1;
          } else if (!sees) {
            if (!(ol == -INFINITY)) bad = 1;
          } else if (!(fabs(ol - rl) <= ltol * fmax(1.0, fabs(rl)))) {
            bad = 1;
          }
        }
        if (bad) {
          failed++;
          if (reported++ < 5)
            fails(d, what, "row b%d t%d h%d: max err %.3g vs bound %.3g (max|ref| %.3g), lse %.9g vs %.9g%s",
                  b, tk, h, err_max, floor * amax, amax, ol, rl, ref_nan ? " (ref NaN)" : "");
        }
      }
  if (out_bytes) {
    *out_bytes = malloc(out_size);
    if (*out_bytes) memcpy(*out_bytes, oh + GUARD, out_size);
  }
  if (lse_bytes && c->with_lse) {
    *lse_bytes = malloc(lse_size);
    if (*lse_bytes) memcpy(*lse_bytes, lh + GUARD, lse_size);
  }
done:
  free(oh);
  free(lh);
  free(wh);
  if (od) d->mem->release(od);
  if (ld) d->mem->release(ld);
  if (wd) d->mem->release(wd);
  return failed;
}

/* ---- the case ------------------------------------------------------------------- */

static int plan_for(const fd_mla_data *d, int32_t num_splits, fd_plan *plan) {
  fd_problem p = fd_mla_data_problem(d, num_splits);
  fd_error err;
  const fd_status st = fd_plan_init(plan, &p, &err);
  if (st != FD_STATUS_OK) {
    fprintf(stderr, "FAIL %s: fd_plan_init(num_splits %d): %s: %s\n", d->name, num_splits,
            fd_status_name(st), err.message);
    return -1;
  }
  return 0;
}

int fd_mla_case_run(const fd_mla_case *c, uint64_t seed, const fd_mla_mem *mem) {
  fd_mla_data *d = fd_mla_data_new(c, seed, mem);
  if (!d) return 1;
  int failed = 0;
  fd_plan plan;
  unsigned char *o1 = NULL, *l1 = NULL, *o2 = NULL, *l2 = NULL;
  if (plan_for(d, c->num_splits, &plan)) {
    failed++;
    goto done;
  }
  failed += fd_mla_data_run(d, &plan, "plan", &o1, &l1);
  if (c->check_determinism) {
    failed += fd_mla_data_run(d, &plan, "again", &o2, &l2);
    const size_t out_size = (size_t)c->batch * fd_mla_data_seq_out_bytes(d);
    if (o1 && o2 && memcmp(o1, o2, out_size))
      failed += fails(d, "again", "out differs bitwise between two runs of one plan");
    if (l1 && l2 && memcmp(l1, l2, (size_t)c->batch * fd_mla_data_seq_lse_bytes(d)))
      failed += fails(d, "again", "lse differs bitwise between two runs of one plan");
  }
  for (int32_t s = 1; s <= c->sweep_splits; s++) {
    fd_plan sp;
    if (plan_for(d, s, &sp)) {
      failed++;
      continue;
    }
    char what[32];
    snprintf(what, sizeof what, "num_splits %d (plan %d)", s, sp.num_splits);
    failed += fd_mla_data_run(d, &sp, what, NULL, NULL);
  }
done:
  free(o1);
  free(l1);
  free(o2);
  free(l2);
  fd_mla_data_free(d);
  return failed;
}

typedef struct group_state {
  const fd_mla_case *c;
  const fd_mla_mem *mem;
  uint64_t seed;
  char name[512];
} group_state;

static void run_mla_case(void **state) {
  const group_state *g = *state;
  assert_int_equal(fd_mla_case_run(g->c, g->seed, g->mem), 0);
}

int fd_mla_run_group(const char *group, const fd_mla_case *cases, int count, const fd_mla_mem *mem) {
  const uint64_t seed = fd_test_seed();
  printf("%s: %d cases, FD_TEST_SEED=%llu\n", group, count, (unsigned long long)seed);
  fflush(stdout);
  group_state *states = calloc((size_t)count, sizeof *states);
  struct CMUnitTest *tests = calloc((size_t)count, sizeof *tests);
  if (!states || !tests) return 1;
  for (int i = 0; i < count; i++) {
    states[i].c = &cases[i];
    states[i].mem = mem;
    states[i].seed = seed;
    fd_mla_case_name(&cases[i], states[i].name, sizeof states[i].name);
    tests[i].name = states[i].name;
    tests[i].test_func = run_mla_case;
    tests[i].initial_state = &states[i];
  }
  const char *filter = getenv("FD_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  const int failed = _cmocka_run_group_tests(group, tests, (size_t)count, NULL, NULL);
  if (failed) printf("%s: FD_TEST_SEED=%llu reproduces these inputs\n", group, (unsigned long long)seed);
  free(tests);
  free(states);
  return failed ? 1 : 0;
}
