/*
 * test_merge.c — fd_merge_states against a float64 merge computed plainly
 * here. One program, two runs (ctest): `test_merge cpu` (the CPU backend;
 * REFERENCE and, without a GPU, AUTO too) and `test_merge gpu` (CUDA on
 * device pointers, AUTO too; exits 77, skipped, without a usable GPU).
 *
 * Every call: outputs poisoned with a NaN payload first, 64 guard bytes
 * around every buffer intact after, the inputs unchanged, a second call
 * bitwise identical. Random cases: every (dtype, out_dtype) pair, S in
 * {1, 2, 3, 7, 1024, 65536}, head_dim 1..512 (vector and scalar CUDA paths,
 * misaligned bases too), empty states (lse = -inf, their out_s NaN: must not
 * be read) mixed in, and special rows: all states empty (out 0, lse -inf),
 * a NaN lse_s or +inf lse_s (NaN row), lse_s from -FLT_MAX to FLT_MAX.
 * Plus: a worked example, cascade consistency (fd_run over key ranges
 * [0, a1), [a1, a2), [a2, n) merged == fd_run over [0, n)), every invalid
 * field (FD_STATUS_INVALID_ARGUMENT naming it, nothing written), and on the
 * GPU a merge captured in a CUDA graph and replayed on new inputs.
 *
 * TOLERANCE per element i of a row, with the float64 merge ref_i, the
 * non-empty states' weights w_s = exp(lse_s - m), L = sum w_s,
 * A_i = sum_s w_s |x_si| / L and E = sum_s w_s (|lse_s - m| + 3) / L:
 *   CPU (sums in double):   ulp(out_dtype, ref_i) + denormal floor
 *   CUDA (sums in fp32):    the same + 2 g(n) (A_i + |ref_i|) + 2u E (A_i + |ref_i|)
 *                           + 2u |ref_i|,   g(n) = min(n, 8 sqrt(n)) u, u = 2^-24
 * (g: n fp32 additions, worst case or the probabilistic sqrt(n) size;
 * E: each w_s off by (|lse_s - m| + 3) u from rounding lse_s - m and expf).
 * lse: CPU 2u |ref| (+1e-30); CUDA 4u max(|ref|, |m|) + 2 (g(n) + u E).
 *
 * FD_TEST_SEED reproduces a run's inputs (printed at the start), and
 * FD_TEST_FILTER selects tests by name.
 */
#include <float.h>
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
#include "flashdecode.h"
#include "gpu_mem.h"
#include "harness.h"
#include "reliability/rel_cuda.h"

#define GUARD 64
#define MAX_CASES 128
#define MAX_MESSAGES 10
#define U32 5.9604644775390625e-08 /* 2^-24 */

/* ---- The run's environment --------------------------------------------------------- */

typedef struct env {
  int gpu;            /* 1: device pointers, backend CUDA */
  fd_backend backend; /* the backend under test */
  uint64_t seed;
} env;

/* ---- Random numbers: the harness's (harness.h) ---------------------------------- */

typedef fd_rng rng;

static uint64_t name_seed(uint64_t seed, const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  return fd_mix64(seed ^ h);
}

/* ---- Buffers: guard bytes around the payload; a device mirror in GPU runs ---------- */

typedef struct tbuf {
  unsigned char *host; /* GUARD | bytes (+ 16 spare for a misaligned base) | GUARD */
  unsigned char *dev;  /* the whole allocation on the device, or NULL */
  size_t bytes;        /* payload, spare included */
} tbuf;

static unsigned char guard_byte(size_t i) { return (unsigned char)(0x5au ^ (i * 37u)); }

static size_t tbuf_total(const tbuf *b) { return b->bytes + 2 * GUARD; }

static void tbuf_init(const env *e, tbuf *b, size_t bytes) {
  memset(b, 0, sizeof *b);
  b->bytes = bytes + 16;
  b->host = aligned_alloc(64, (tbuf_total(b) + 63) / 64 * 64);
  assert_non_null(b->host);
  memset(b->host + GUARD, 0, b->bytes);
  for (size_t i = 0; i < GUARD; i++) {
    b->host[i] = guard_byte(i);
    b->host[GUARD + b->bytes + i] = guard_byte(i + GUARD);
  }
  if (e->gpu && fd_gpu_malloc((void **)&b->dev, tbuf_total(b))) fail_msg("cudaMalloc of %zu bytes", tbuf_total(b));
}

static void tbuf_free(tbuf *b) {
  free(b->host);
  if (b->dev) fd_gpu_free(b->dev);
  memset(b, 0, sizeof *b);
}

/* The payload on the host (what tests fill and read). */
static unsigned char *tbuf_data(const tbuf *b) { return b->host + GUARD; }

/* What the library gets: the payload `offset` bytes in, on the device in GPU runs. */
static void *tbuf_arg(const tbuf *b, size_t offset) {
  return (b->dev ? b->dev : b->host) + GUARD + offset;
}

static void tbuf_push(const tbuf *b) {
  if (b->dev && fd_gpu_upload(b->dev, b->host, tbuf_total(b))) fail_msg("upload failed");
}

static void tbuf_pull(tbuf *b) {
  if (b->dev && fd_gpu_download(b->host, b->dev, tbuf_total(b))) fail_msg("download failed");
}

static int tbuf_guards_ok(const tbuf *b) {
  for (size_t i = 0; i < GUARD; i++)
    if (b->host[i] != guard_byte(i) || b->host[GUARD + b->bytes + i] != guard_byte(i + GUARD)) return 0;
  return 1;
}

static uint64_t tbuf_hash(const tbuf *b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < tbuf_total(b); i++) h = (h ^ b->host[i]) * 0x100000001b3ull;
  return h;
}

/* Poison: quiet NaNs with a payload no merge writes. */
#define POISON_F32 0x7fc5a5a5u
#define POISON_F16 0x7e5au
#define POISON_BF16 0x7fc5u

static void poison(void *base, fd_dtype dtype, size_t count) {
  if (dtype == FD_DTYPE_F32) {
    uint32_t *p = base;
    for (size_t i = 0; i < count; i++) p[i] = POISON_F32;
  } else {
    uint16_t *p = base;
    const uint16_t v = dtype == FD_DTYPE_F16 ? POISON_F16 : POISON_BF16;
    for (size_t i = 0; i < count; i++) p[i] = v;
  }
}

static int is_poison(const void *base, fd_dtype dtype, int64_t i) {
  if (dtype == FD_DTYPE_F32) return ((const uint32_t *)base)[i] == POISON_F32;
  return ((const uint16_t *)base)[i] == (dtype == FD_DTYPE_F16 ? POISON_F16 : POISON_BF16);
}

static const char *dtype_tag(fd_dtype d) {
  switch (d) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* cache types, never merged */
  }
  return "dtype0";
}

/* ---- Failure reports ---------------------------------------------------------------- */

typedef struct report {
  const char *name;
  uint64_t seed;
  int fails;
} report;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void fail_at(report *rep, const char *fmt, ...) {
  if (rep->fails++ >= MAX_MESSAGES) return;
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout);
  fprintf(stderr, "FAIL %s (FD_TEST_SEED=%llu): ", rep->name, (unsigned long long)rep->seed);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static void finish(const report *rep) {
  if (rep->fails)
    fail_msg("%d check(s) failed; reproduce: FD_TEST_SEED=%llu FD_TEST_FILTER='%s'", rep->fails,
             (unsigned long long)rep->seed, rep->name);
}

/* ---- One merge call's tensors --------------------------------------------------------- */

typedef struct mshape {
  fd_dtype dtype, out_dtype; /* out_dtype 0 = dtype */
  int32_t S, B, T, H, D;
  int with_lse;
  int misalign;  /* bases of states_out, states_lse, out, lse one element past alignment */
  fd_backend backend; /* what the call passes (the env's, AUTO or REFERENCE) */
} mshape;

typedef struct mdata {
  mshape c;
  fd_dtype odt; /* resolved out_dtype */
  int64_t rows;
  size_t in_size, out_size;
  size_t off_so, off_sl, off_o, off_l; /* bytes from each payload start to the tensor */
  tbuf so, sl, o, l;
} mdata;

static void mdata_init(const env *e, mdata *m, const mshape *c) {
  memset(m, 0, sizeof *m);
  m->c = *c;
  m->odt = c->out_dtype ? c->out_dtype : c->dtype;
  m->rows = (int64_t)c->B * c->T * c->H;
  m->in_size = fd_dtype_size(c->dtype);
  m->out_size = fd_dtype_size(m->odt);
  if (c->misalign) {
    m->off_so = m->in_size;
    m->off_sl = 4;
    m->off_o = m->out_size;
    m->off_l = 4;
  }
  tbuf_init(e, &m->so, (size_t)(c->S * m->rows * c->D) * m->in_size);
  tbuf_init(e, &m->sl, (size_t)(c->S * m->rows) * 4);
  tbuf_init(e, &m->o, (size_t)(m->rows * c->D) * m->out_size);
  tbuf_init(e, &m->l, (size_t)m->rows * 4);
}

static void mdata_free(mdata *m) {
  tbuf_free(&m->so);
  tbuf_free(&m->sl);
  tbuf_free(&m->o);
  tbuf_free(&m->l);
}

static void *h_states_out(const mdata *m) { return tbuf_data(&m->so) + m->off_so; }
static float *h_states_lse(const mdata *m) { return (float *)(tbuf_data(&m->sl) + m->off_sl); }
static void *h_out(const mdata *m) { return tbuf_data(&m->o) + m->off_o; }
static float *h_lse(const mdata *m) { return (float *)(tbuf_data(&m->l) + m->off_l); }

static fd_merge_problem mdata_problem(const mdata *m) {
  fd_merge_problem p;
  memset(&p, 0, sizeof p);
  p.backend = m->c.backend;
  p.dtype = m->c.dtype;
  p.out_dtype = m->c.out_dtype;
  p.num_states = m->c.S;
  p.batch = m->c.B;
  p.q_len = m->c.T;
  p.num_heads = m->c.H;
  p.head_dim = m->c.D;
  return p;
}

/* lse index of out row r = (b * T + t) * H + h. */
static int64_t lse_index(const mshape *c, int64_t r) {
  const int64_t h = r % c->H, t = r / c->H % c->T, b = r / ((int64_t)c->H * c->T);
  return (b * c->H + h) * c->T + t;
}

/* Poison outputs, push everything, call, pull everything. Returns the status. */
static fd_status mdata_call(mdata *m, void *stream, fd_error *err) {
  poison(tbuf_data(&m->o), m->odt, m->o.bytes / m->out_size);
  poison(tbuf_data(&m->l), FD_DTYPE_F32, m->l.bytes / 4);
  tbuf_push(&m->so);
  tbuf_push(&m->sl);
  tbuf_push(&m->o);
  tbuf_push(&m->l);
  fd_merge_problem p = mdata_problem(m);
  fd_status st = fd_merge_states(&p, tbuf_arg(&m->so, m->off_so), (const float *)tbuf_arg(&m->sl, m->off_sl),
                                 tbuf_arg(&m->o, m->off_o),
                                 m->c.with_lse ? (float *)tbuf_arg(&m->l, m->off_l) : NULL, stream, err);
  if (m->so.dev && fd_gpu_synchronize()) fail_msg("the merge kernel failed (cudaDeviceSynchronize)");
  tbuf_pull(&m->so);
  tbuf_pull(&m->sl);
  tbuf_pull(&m->o);
  tbuf_pull(&m->l);
  return st;
}

/* ---- The float64 merge and the check ------------------------------------------------------ */

/* g(n): the relative error of n fp32 additions (worst case, or the
 * probabilistic sqrt(n) size, whichever is smaller). */
static double g_sum(int64_t n) {
  const double w = (double)n, p = 8.0 * sqrt((double)n);
  return (w < p ? w : p) * U32;
}

/* One ulp of `dtype` at |x| (x = 0: the smallest subnormal). */
static double ulp_of(fd_dtype dtype, double x) {
  const int p = dtype == FD_DTYPE_F32 ? 24 : dtype == FD_DTYPE_F16 ? 11 : 8;
  const int emin = dtype == FD_DTYPE_F32 ? -126 : dtype == FD_DTYPE_F16 ? -14 : -126;
  int e = 0;
  frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
  if (x == 0.0 || e - 1 < emin) e = emin + 1;
  return ldexp(1.0, e - p);
}

/* Checks out and lse against the float64 merge of the inputs (host copies). */
static void check_merge(const mdata *m, int precise, report *rep) {
  const mshape *c = &m->c;
  const int64_t rows = m->rows, D = c->D;
  const void *so = h_states_out(m);
  const float *sl = h_states_lse(m);
  const void *out = h_out(m);
  const float *lse = h_lse(m);
  double *ref = malloc((size_t)D * sizeof *ref), *absw = malloc((size_t)D * sizeof *absw);
  assert_non_null(ref);
  assert_non_null(absw);
  for (int64_t r = 0; r < rows; r++) {
    const int64_t li = lse_index(c, r);
    double m_ = -INFINITY;
    int bad = 0;
    int64_t n = 0;
    for (int64_t s = 0; s < c->S; s++) {
      const double x = sl[s * rows + li];
      if (isnan(x) || x == INFINITY) bad = 1;
      else if (x > m_) m_ = x;
      if (x != -INFINITY) n++;
    }
    const int64_t ob = r * D;
    if (bad || m_ == -INFINITY) {
      for (int64_t d = 0; d < D; d++) {
        const double got = fd_load_elem(out, m->odt, ob + d);
        const int ok = bad ? (isnan(got) && !is_poison(out, m->odt, ob + d)) : got == 0.0;
        if (!ok) fail_at(rep, "row %lld (%s) out[%lld] = %g, want %s", (long long)r, bad ? "NaN lse" : "all empty",
                         (long long)d, got, bad ? "NaN (written)" : "0");
      }
      if (c->with_lse) {
        const float got = lse[li];
        uint32_t bits;
        memcpy(&bits, &got, 4);
        const int ok = bad ? (isnan(got) && bits != POISON_F32) : (got == -INFINITY);
        if (!ok) fail_at(rep, "row %lld lse = %g, want %s", (long long)r, (double)got, bad ? "NaN" : "-inf");
      }
      continue;
    }
    double L = 0.0, E = 0.0;
    for (int64_t d = 0; d < D; d++) ref[d] = absw[d] = 0.0;
    for (int64_t s = 0; s < c->S; s++) {
      const double x = sl[s * rows + li];
      if (x == -INFINITY) continue;
      const double w = exp(x - m_);
      L += w;
      if (w > 0.0) E += w * (fabs(x - m_) + 3.0);
      for (int64_t d = 0; d < D; d++) {
        const double v = fd_load_elem(so, c->dtype, (s * rows + r) * D + d);
        ref[d] += w * v;
        absw[d] += w * fabs(v);
      }
    }
    E /= L;
    const double g = g_sum(n);
    for (int64_t d = 0; d < D; d++) {
      ref[d] /= L;
      const double A = absw[d] / L + fabs(ref[d]);
      double tol = ulp_of(m->odt, ref[d]) + ulp_of(m->odt, 0.0);
      if (!precise) tol += 2.0 * g * A + 2.0 * U32 * E * A + 2.0 * U32 * fabs(ref[d]);
      const double got = fd_load_elem(out, m->odt, ob + d);
      if (!(fabs(got - ref[d]) <= tol))
        fail_at(rep, "row %lld out[%lld] = %.9g, want %.9g (error %.3g, tol %.3g; %lld states)", (long long)r,
                (long long)d, got, ref[d], fabs(got - ref[d]), tol, (long long)n);
    }
    if (c->with_lse) {
      const double want = m_ + log(L);
      const double tol = precise ? 2.0 * U32 * fabs(want) + 1e-30
                                 : 4.0 * U32 * fmax(fabs(want), fabs(m_)) + 2.0 * (g + U32 * E);
      const double got = lse[li];
      if (!(fabs(got - want) <= tol))
        fail_at(rep, "row %lld lse = %.9g, want %.9g (error %.3g, tol %.3g)", (long long)r, got, want,
                fabs(got - want), tol);
    }
  }
  free(ref);
  free(absw);
}

/* ---- Random cases ------------------------------------------------------------------------ */

typedef struct rcase {
  mshape shape;
  double p_empty; /* probability a state of a random row is empty */
  double spread;  /* standard deviation of a random row's lse_s */
  int specials;   /* rows r % 8: 1 all empty, 3 a NaN lse_s, 5 a +inf lse_s, 6 extreme lse_s */
} rcase;

static void rcase_name(const env *e, const rcase *rc, char *buf, size_t size) {
  const mshape *c = &rc->shape;
  snprintf(buf, size, "%s/%s>%s/S%d/b%dq%dh%d/d%d/%s/empty%g/spread%g%s%s%s", e->gpu ? "gpu" : "cpu",
           dtype_tag(c->dtype), c->out_dtype ? dtype_tag(c->out_dtype) : "same", c->S, c->B, c->T, c->H, c->D,
           c->with_lse ? "lse" : "nolse", rc->p_empty, rc->spread, rc->specials ? "/specials" : "",
           c->misalign ? "/misaligned" : "",
           c->backend == FD_BACKEND_AUTO ? "/auto" : c->backend == FD_BACKEND_REFERENCE ? "/reference" : "");
}

static float extreme_lse(rng *r) {
  static const float v[] = {FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 88.7f, -104.0f, 1e4f, -1e4f, 0.0f, 1e4f + 0.5f};
  return v[fd_rng_below(r, sizeof v / sizeof *v)];
}

static void fill_random(mdata *m, const rcase *rc, rng *r) {
  const mshape *c = &m->c;
  const int64_t rows = m->rows;
  float *sl = h_states_lse(m);
  void *so = h_states_out(m);
  for (int64_t row = 0; row < rows; row++) {
    const int kind = rc->specials ? (int)(row % 8) : 0;
    const int64_t li = lse_index(c, row);
    const int64_t odd = (int64_t)fd_rng_below(r, (uint64_t)c->S); /* the state a special row marks */
    for (int64_t s = 0; s < c->S; s++) {
      float x;
      if (kind == 1)
        x = -INFINITY;
      else if (kind == 6)
        x = fd_rng_uniform(r) < 0.2 ? -INFINITY : extreme_lse(r);
      else
        x = fd_rng_uniform(r) < rc->p_empty ? -INFINITY : (float)(rc->spread * fd_rng_normal(r));
      if (kind == 3 && s == odd) x = NAN;
      if (kind == 5 && s == odd) x = INFINITY;
      sl[s * rows + li] = x;
      for (int64_t d = 0; d < c->D; d++) {
        const int64_t i = (s * rows + row) * c->D + d;
        /* an empty state's out_s must not be read: NaN there */
        fd_store_elem(so, c->dtype, i, x == -INFINITY ? NAN : (float)fd_rng_normal(r));
      }
    }
  }
}

typedef struct test_state {
  const env *e;
  rcase rc;
  char name[200];
} test_state;

static void test_random_case(void **state) {
  const test_state *ts = *state;
  const env *e = ts->e;
  report rep = {ts->name, e->seed, 0};
  rng r = {name_seed(e->seed, ts->name)};
  mdata m;
  mdata_init(e, &m, &ts->rc.shape);
  fill_random(&m, &ts->rc, &r);
  const uint64_t h_so = tbuf_hash(&m.so), h_sl = tbuf_hash(&m.sl);
  fd_error err;
  fd_status st = mdata_call(&m, NULL, &err);
  if (st != FD_STATUS_OK) fail_msg("%s: fd_merge_states: %s: %s", ts->name, fd_status_name(st), err.message);
  if (!tbuf_guards_ok(&m.so) || !tbuf_guards_ok(&m.sl)) fail_at(&rep, "an input's guard bytes changed");
  if (tbuf_hash(&m.so) != h_so || tbuf_hash(&m.sl) != h_sl) fail_at(&rep, "the inputs changed");
  if (!tbuf_guards_ok(&m.o)) fail_at(&rep, "out's guard bytes changed");
  if (!tbuf_guards_ok(&m.l)) fail_at(&rep, "lse's guard bytes changed");
  /* Bytes of the payloads outside the tensors (the misaligned bases' spare) untouched. */
  const size_t out_bytes = (size_t)(m.rows * m.c.D) * m.out_size, lse_bytes = (size_t)m.rows * 4;
  unsigned char *o_copy = malloc(m.o.bytes), *l_copy = malloc(m.l.bytes);
  assert_non_null(o_copy);
  assert_non_null(l_copy);
  memcpy(o_copy, tbuf_data(&m.o), m.o.bytes);
  memcpy(l_copy, tbuf_data(&m.l), m.l.bytes);
  for (size_t i = 0; i < m.o.bytes; i += m.out_size)
    if ((i < m.off_o || i >= m.off_o + out_bytes) && !is_poison(o_copy + i, m.odt, 0))
      fail_at(&rep, "out: byte %zu outside the tensor written", i);
  for (size_t i = 0; i < m.l.bytes; i += 4)
    if ((!m.c.with_lse || i < m.off_l || i >= m.off_l + lse_bytes) && !is_poison(l_copy + i, FD_DTYPE_F32, 0))
      fail_at(&rep, "lse: byte %zu written (outside the tensor, or lse NULL)", i);
  check_merge(&m, e->backend != FD_BACKEND_CUDA, &rep);
  /* A second call: bitwise the same. */
  st = mdata_call(&m, NULL, &err);
  if (st != FD_STATUS_OK) fail_msg("%s: second fd_merge_states: %s: %s", ts->name, fd_status_name(st), err.message);
  if (memcmp(o_copy, tbuf_data(&m.o), m.o.bytes) || memcmp(l_copy, tbuf_data(&m.l), m.l.bytes))
    fail_at(&rep, "a second call gave different bits");
  /* The same inputs at bases moved by one element (CUDA: the other of the
   * vector and scalar paths): bitwise the same. */
  {
    mshape moved = m.c;
    moved.misalign = !moved.misalign;
    mdata m2;
    mdata_init(e, &m2, &moved);
    memcpy(h_states_out(&m2), h_states_out(&m), (size_t)(m.c.S * m.rows * m.c.D) * m.in_size);
    memcpy(h_states_lse(&m2), h_states_lse(&m), (size_t)(m.c.S * m.rows) * 4);
    st = mdata_call(&m2, NULL, &err);
    if (st != FD_STATUS_OK) fail_msg("%s: moved bases: %s: %s", ts->name, fd_status_name(st), err.message);
    if (memcmp(h_out(&m2), h_out(&m), out_bytes) || (m.c.with_lse && memcmp(h_lse(&m2), h_lse(&m), lse_bytes)))
      fail_at(&rep, "bases moved by one element gave different bits");
    mdata_free(&m2);
  }
  free(o_copy);
  free(l_copy);
  mdata_free(&m);
  finish(&rep);
}

/* The case list: every dtype pair at every S, head_dims rotating through the
 * vector and scalar paths. */
static int make_cases(const env *e, rcase *cases, int max) {
  static const fd_dtype dts[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const int32_t Ds[] = {1, 8, 64, 100, 128, 256, 3, 33, 16, 96};
  const int nD = (int)(sizeof Ds / sizeof *Ds);
  int n = 0;
  for (int i = 0; i < 3; i++)
    for (int o = 0; o < 3; o++) {
      const int pair = i * 3 + o;
      for (int k = 0; k < 6 && n < max; k++) {
        rcase *rc = &cases[n++];
        memset(rc, 0, sizeof *rc);
        mshape *c = &rc->shape;
        c->dtype = dts[i];
        c->out_dtype = (o == i && pair % 2 == 0) ? 0 : dts[o]; /* 0 = dtype, sometimes */
        c->backend = e->backend;
        c->with_lse = (pair + k) % 5 != 4;
        c->misalign = (pair + k) % 4 == 3;
        rc->p_empty = (k % 3 == 2) ? 0.85 : 0.25;
        rc->spread = k % 2 ? 1.0 : 12.0;
        rc->specials = 1;
        c->D = Ds[(pair + 3 * k) % nD];
        switch (k) {
          case 0: c->S = 1, c->B = 2, c->T = 2, c->H = 3; break;
          case 1: c->S = 2, c->B = 3, c->T = 1, c->H = 4; break;
          case 2: c->S = 3, c->B = 1, c->T = 3, c->H = 5; break;
          case 3: c->S = 7, c->B = 2, c->T = 2, c->H = 4; break;
          case 4: c->S = 1024, c->B = 2, c->T = 1, c->H = 4, c->D = c->D > 64 ? 64 : c->D; break;
          default: /* 65536 states: few rows, short rows */
            c->S = FD_MAX_MERGE_STATES, c->B = 1, c->T = 1, c->H = pair % 2 ? 4 : 2;
            c->D = pair % 3 == 0 ? 16 : pair % 3 == 1 ? 5 : 8;
            rc->p_empty = 0.5;
            break;
        }
        /* the other ways to name the backend */
        if (pair == 4 && k == 1) c->backend = e->gpu ? FD_BACKEND_AUTO : FD_BACKEND_REFERENCE;
        if (pair == 8 && k == 3 && (e->gpu || !fd_backend_available(FD_BACKEND_CUDA)))
          c->backend = FD_BACKEND_AUTO;
      }
    }
  /* Larger rows, no specials: the whole row is random. */
  for (int i = 0; i < 3 && n < max; i++) {
    rcase *rc = &cases[n++];
    memset(rc, 0, sizeof *rc);
    rc->shape.dtype = dts[i];
    rc->shape.out_dtype = FD_DTYPE_F32;
    rc->shape.backend = e->backend;
    rc->shape.S = 5, rc->shape.B = 8, rc->shape.T = 2, rc->shape.H = 8, rc->shape.D = 128;
    rc->shape.with_lse = 1;
    rc->p_empty = 0.1;
    rc->spread = 3.0;
  }
  return n;
}

/* ---- A worked example ------------------------------------------------------------------------ */

/* Three states of one row, head_dim 4: (lse 0, out (2,4,-6,8)), (lse ln 2,
 * out (1,1,1,1)), empty (lse -inf, out NaN). m = ln 2, w = (1/2, 1), L = 3/2:
 * out = ((1,2,-3,4) + (1,1,1,1)) / (3/2) = (4/3, 2, -4/3, 10/3), lse = ln 3. */
static void test_worked_example(void **state) {
  const env *e = *state;
  mshape c = {FD_DTYPE_F32, 0, 3, 1, 1, 1, 4, 1, 0, e->backend};
  mdata m;
  mdata_init(e, &m, &c);
  const float so[3][4] = {{2, 4, -6, 8}, {1, 1, 1, 1}, {NAN, NAN, NAN, NAN}};
  const float sl[3] = {0.0f, 0.69314718f, -INFINITY};
  memcpy(h_states_out(&m), so, sizeof so);
  memcpy(h_states_lse(&m), sl, sizeof sl);
  fd_error err;
  fd_status st = mdata_call(&m, NULL, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_merge_states: %s: %s", fd_status_name(st), err.message);
  const double want[4] = {4.0 / 3, 2.0, -4.0 / 3, 10.0 / 3};
  const float *out = h_out(&m);
  for (int i = 0; i < 4; i++)
    if (!(fabs(out[i] - want[i]) <= 1e-6 * fabs(want[i])))
      fail_msg("out[%d] = %.9g, want %.9g", i, (double)out[i], want[i]);
  if (!(fabs(h_lse(&m)[0] - log(3.0)) <= 1e-6)) fail_msg("lse = %.9g, want ln 3", (double)h_lse(&m)[0]);
  mdata_free(&m);
}

/* ---- Cascade consistency: fd_run over key ranges, merged, == fd_run over all keys ---------- */

enum { CB = 4, CHQ = 8, CHKV = 2, CD = 64, CCAP = 700, CPARTS = 3 };

static void consistency(const env *e, fd_dtype dtype, const char *name) {
  report rep = {name, e->seed, 0};
  rng r = {name_seed(e->seed, name)};
  const int32_t start[CPARTS + 1] = {0, 200, 450, CCAP};
  const int32_t kv_len[CB] = {CCAP, 300, 0, 150};
  const size_t es = fd_dtype_size(dtype);
  const int64_t rows = CB * CHQ, kv_elems = (int64_t)CB * CCAP * CHKV * CD;
  unsigned char *q = malloc((size_t)rows * CD * es), *k = malloc((size_t)kv_elems * es),
                *v = malloc((size_t)kv_elems * es), *full = malloc((size_t)rows * CD * es);
  float *full_lse = malloc((size_t)rows * sizeof(float));
  assert_true(q && k && v && full && full_lse);
  for (int64_t i = 0; i < rows * CD; i++) fd_store_elem(q, dtype, i, (float)fd_rng_normal(&r));
  for (int64_t i = 0; i < kv_elems; i++) {
    fd_store_elem(k, dtype, i, (float)fd_rng_normal(&r));
    fd_store_elem(v, dtype, i, (float)fd_rng_normal(&r));
  }

  /* The states: fd_run (CPU) over each key range, written straight into the merge's inputs. */
  mshape c = {dtype, 0, CPARTS, CB, 1, CHQ, CD, 1, 0, e->backend};
  mdata m;
  mdata_init(e, &m, &c);
  const int64_t kv_strides[3] = {(int64_t)CCAP * CHKV * CD, CHKV * CD, CD};
  for (int s = 0; s < CPARTS; s++) {
    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = FD_BACKEND_CPU;
    p.dtype = dtype;
    p.batch = CB;
    p.num_heads_q = CHQ;
    p.num_heads_kv = CHKV;
    p.head_dim = CD;
    p.kv_capacity = start[s + 1] - start[s];
    p.num_splits = s + 1; /* 1, 2, 3: the states come from different combines */
    int32_t len[CB];
    for (int b = 0; b < CB; b++) {
      int32_t n = kv_len[b] - start[s];
      len[b] = n < 0 ? 0 : n > p.kv_capacity ? p.kv_capacity : n;
    }
    fd_tensors t;
    memset(&t, 0, sizeof t);
    t.q = q;
    t.k_cache = k + (size_t)start[s] * CHKV * CD * es;
    t.v_cache = v + (size_t)start[s] * CHKV * CD * es;
    memcpy(t.k_strides, kv_strides, sizeof kv_strides);
    memcpy(t.v_strides, kv_strides, sizeof kv_strides);
    t.kv_len = len;
    t.out = (unsigned char *)h_states_out(&m) + (size_t)(s * rows * CD) * es;
    t.lse = h_states_lse(&m) + s * rows;
    fd_error err;
    fd_status st = fd_decode(&p, &t, NULL, &err);
    if (st != FD_STATUS_OK) fail_msg("fd_decode over keys [%d, %d): %s", start[s], start[s + 1], err.message);
  }
  /* The whole: the reference backend over all keys. */
  {
    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = FD_BACKEND_REFERENCE;
    p.dtype = dtype;
    p.batch = CB;
    p.num_heads_q = CHQ;
    p.num_heads_kv = CHKV;
    p.head_dim = CD;
    p.kv_capacity = CCAP;
    fd_tensors t;
    memset(&t, 0, sizeof t);
    t.q = q;
    t.k_cache = k;
    t.v_cache = v;
    t.kv_len = kv_len;
    t.out = full;
    t.lse = full_lse;
    fd_error err;
    fd_status st = fd_decode(&p, &t, NULL, &err);
    if (st != FD_STATUS_OK) fail_msg("fd_decode over all keys: %s", err.message);
  }

  fd_error err;
  fd_status st = mdata_call(&m, NULL, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_merge_states: %s: %s", fd_status_name(st), err.message);
  /* q_len 1: out row r = b * CHQ + h, lse index the same. */
  const double tol_out = 2.0 * fd_tol_out_floor(dtype), tol_lse = 2.0 * fd_tol_lse(dtype);
  for (int64_t row = 0; row < rows; row++) {
    double row_max = 0.0;
    for (int d = 0; d < CD; d++) row_max = fmax(row_max, fabs(fd_load_elem(full, dtype, row * CD + d)));
    for (int d = 0; d < CD; d++) {
      const double want = fd_load_elem(full, dtype, row * CD + d);
      const double got = fd_load_elem(h_out(&m), dtype, row * CD + d);
      if (!(fabs(got - want) <= tol_out * row_max + (row_max == 0.0 ? 0.0 : 1e-30)) && !(got == 0.0 && want == 0.0))
        fail_at(&rep, "row %lld out[%d]: merged %.9g, one call %.9g", (long long)row, d, got, want);
    }
    const double want = full_lse[row], got = h_lse(&m)[row];
    const int ok = want == -INFINITY ? got == -INFINITY : fabs(got - want) <= tol_lse * fmax(1.0, fabs(want));
    if (!ok) fail_at(&rep, "row %lld lse: merged %.9g, one call %.9g", (long long)row, got, want);
  }
  mdata_free(&m);
  free(q);
  free(k);
  free(v);
  free(full);
  free(full_lse);
  finish(&rep);
}

static void test_consistency_f32(void **state) { consistency(*state, FD_DTYPE_F32, "consistency_f32"); }
static void test_consistency_bf16(void **state) { consistency(*state, FD_DTYPE_BF16, "consistency_bf16"); }

/* ---- Bad arguments ---------------------------------------------------------------------------- */

static void expect_invalid(mdata *m, const fd_merge_problem *p, const void *so, const float *sl, void *o, float *l,
                           fd_status want, const char *needle, const char *what) {
  poison(tbuf_data(&m->o), FD_DTYPE_F32, m->o.bytes / 4);
  poison(tbuf_data(&m->l), FD_DTYPE_F32, m->l.bytes / 4);
  tbuf_push(&m->o);
  tbuf_push(&m->l);
  fd_error err;
  memset(&err, 0, sizeof err);
  const fd_status st = fd_merge_states(p, so, sl, o, l, NULL, &err);
  if (m->o.dev && fd_gpu_synchronize()) fail_msg("%s: device error", what);
  tbuf_pull(&m->o);
  tbuf_pull(&m->l);
  if (st != want)
    fail_msg("%s: returned %s, want %s (message: %s)", what, fd_status_name(st), fd_status_name(want), err.message);
  if (err.status != want) fail_msg("%s: err.status %s", what, fd_status_name(err.status));
  if (!err.message[0] || strlen(err.message) >= sizeof err.message) fail_msg("%s: empty or unterminated message", what);
  if (!strstr(err.message, needle)) fail_msg("%s: message \"%s\" does not name \"%s\"", what, err.message, needle);
  if (!tbuf_guards_ok(&m->o) || !tbuf_guards_ok(&m->l)) fail_msg("%s: guard bytes changed", what);
  for (size_t i = 0; i < m->o.bytes; i += 4)
    if (!is_poison(tbuf_data(&m->o) + i, FD_DTYPE_F32, 0)) fail_msg("%s: out written", what);
  for (size_t i = 0; i < m->l.bytes; i += 4)
    if (!is_poison(tbuf_data(&m->l) + i, FD_DTYPE_F32, 0)) fail_msg("%s: lse written", what);
  /* NULL err: the same status, no crash */
  if (fd_merge_states(p, so, sl, o, l, NULL, NULL) != want) fail_msg("%s: another status with err NULL", what);
}

static void test_bad_arguments(void **state) {
  const env *e = *state;
  mshape c = {FD_DTYPE_F32, 0, 2, 2, 1, 2, 4, 1, 0, e->backend};
  mdata m;
  mdata_init(e, &m, &c);
  tbuf_push(&m.so);
  tbuf_push(&m.sl);
  const void *so = tbuf_arg(&m.so, 0);
  const float *sl = (const float *)tbuf_arg(&m.sl, 0);
  void *o = tbuf_arg(&m.o, 0);
  float *l = (float *)tbuf_arg(&m.l, 0);
  const fd_merge_problem good = mdata_problem(&m);
  const fd_status INV = FD_STATUS_INVALID_ARGUMENT;

  expect_invalid(&m, NULL, so, sl, o, l, INV, "problem", "problem NULL");
  struct field {
    const char *needle;
    size_t offset; /* of an int32-sized field */
    int32_t value;
  } fields[] = {
      {"backend", offsetof(fd_merge_problem, backend), 4},
      {"backend", offsetof(fd_merge_problem, backend), -1},
      {"dtype", offsetof(fd_merge_problem, dtype), 0},
      {"dtype", offsetof(fd_merge_problem, dtype), 4},
      {"out_dtype", offsetof(fd_merge_problem, out_dtype), 7},
      {"out_dtype", offsetof(fd_merge_problem, out_dtype), -1},
      {"num_states", offsetof(fd_merge_problem, num_states), 0},
      {"num_states", offsetof(fd_merge_problem, num_states), -3},
      {"num_states", offsetof(fd_merge_problem, num_states), FD_MAX_MERGE_STATES + 1},
      {"batch", offsetof(fd_merge_problem, batch), 0},
      {"batch", offsetof(fd_merge_problem, batch), -1},
      {"q_len", offsetof(fd_merge_problem, q_len), 0},
      {"q_len", offsetof(fd_merge_problem, q_len), INT32_MIN},
      {"num_heads", offsetof(fd_merge_problem, num_heads), 0},
      {"head_dim", offsetof(fd_merge_problem, head_dim), 0},
      {"head_dim", offsetof(fd_merge_problem, head_dim), 513},
      {"device", offsetof(fd_merge_problem, device), -1},
  };
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
    fd_merge_problem p = good;
    int32_t v = fields[i].value;
    memcpy((char *)&p + fields[i].offset, &v, sizeof v);
    char what[96];
    snprintf(what, sizeof what, "%s = %d", fields[i].needle, v);
    expect_invalid(&m, &p, so, sl, o, l, INV, fields[i].needle, what);
  }
  /* A shape beyond what can be addressed. */
  {
    fd_merge_problem p = good;
    p.num_states = FD_MAX_MERGE_STATES;
    p.batch = INT32_MAX;
    p.num_heads = INT32_MAX;
    p.head_dim = 256;
    expect_invalid(&m, &p, so, sl, o, l, INV, "states_out", "huge shape");
  }
  /* NULL pointers (lse may be NULL: not an error). */
  expect_invalid(&m, &good, NULL, sl, o, l, INV, "states_out", "states_out NULL");
  expect_invalid(&m, &good, so, NULL, o, l, INV, "states_lse", "states_lse NULL");
  expect_invalid(&m, &good, so, sl, NULL, l, INV, "out", "out NULL");
  /* Pointers not aligned to their elements. */
  expect_invalid(&m, &good, (const char *)so + 1, sl, o, l, INV, "states_out", "states_out misaligned");
  expect_invalid(&m, &good, so, (const float *)((const char *)sl + 2), o, l, INV, "states_lse",
                 "states_lse misaligned");
  expect_invalid(&m, &good, so, sl, (char *)o + 2, l, INV, "out", "out misaligned");
  expect_invalid(&m, &good, so, sl, o, (float *)((char *)l + 1), INV, "lse", "lse misaligned");
  {
    fd_merge_problem p = good;
    p.dtype = FD_DTYPE_BF16;
    p.out_dtype = FD_DTYPE_F32;
    expect_invalid(&m, &p, so, sl, (char *)o + 2, l, INV, "out", "f32 out misaligned under bf16 states");
  }
  /* out / lse overlapping the inputs or each other (the last byte counts). */
  {
    const size_t so_bytes = (size_t)(c.S * m.rows * c.D) * 4, sl_bytes = (size_t)(c.S * m.rows) * 4;
    const size_t o_bytes = (size_t)(m.rows * c.D) * 4;
    /* out over states_out's last element; then lse over states_lse's first */
    expect_invalid(&m, &good, so, sl, (char *)tbuf_arg(&m.so, so_bytes - 4), l, INV, "out",
                   "out overlaps states_out");
    expect_invalid(&m, &good, so, sl, (char *)tbuf_arg(&m.sl, 0) - o_bytes + 4, l, INV, "out",
                   "out overlaps states_lse");
    expect_invalid(&m, &good, so, sl, o, (float *)tbuf_arg(&m.sl, sl_bytes - 4), INV, "lse",
                   "lse overlaps states_lse");
    expect_invalid(&m, &good, so, sl, o, (float *)tbuf_arg(&m.so, 0), INV, "lse", "lse overlaps states_out");
    expect_invalid(&m, &good, so, sl, o, (float *)((char *)o + o_bytes - 4), INV, "lse", "lse overlaps out");
  }
  /* CUDA asked for where it cannot run. */
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    fd_merge_problem p = good;
    p.backend = FD_BACKEND_CUDA;
    expect_invalid(&m, &p, so, sl, o, l, FD_STATUS_UNSUPPORTED, "backend", "CUDA without a GPU");
  } else {
    fd_merge_problem p = good;
    p.backend = FD_BACKEND_CUDA;
    p.device = 4096;
    expect_invalid(&m, &p, so, sl, o, l, FD_STATUS_UNSUPPORTED, "backend", "CUDA on a device that is not there");
  }
  /* And the good call succeeds (lse NULL too). */
  fd_error err;
  if (fd_merge_states(&good, so, sl, o, l, NULL, &err) != FD_STATUS_OK) fail_msg("good call: %s", err.message);
  if (fd_merge_states(&good, so, sl, o, NULL, NULL, &err) != FD_STATUS_OK) fail_msg("lse NULL: %s", err.message);
  if (err.status != FD_STATUS_OK || err.message[0]) fail_msg("a good call leaves err marked OK with no message");
  if (m.o.dev && fd_gpu_synchronize()) fail_msg("device error after the good calls");
  /* Back to back in one buffer (states_out | states_lse | out | lse): touching
   * is not overlapping; the same bits as separate buffers. */
  {
    const size_t so_bytes = (size_t)(c.S * m.rows * c.D) * 4, sl_bytes = (size_t)(c.S * m.rows) * 4;
    const size_t o_bytes = (size_t)(m.rows * c.D) * 4, l_bytes = (size_t)m.rows * 4;
    for (int64_t i = 0; i < c.S * m.rows; i++) h_states_lse(&m)[i] = (float)(i % 5) - 2.0f;
    for (int64_t i = 0; i < c.S * m.rows * c.D; i++) ((float *)h_states_out(&m))[i] = (float)(i % 7) - 3.0f;
    tbuf one;
    tbuf_init(e, &one, so_bytes + sl_bytes + o_bytes + l_bytes);
    memcpy(tbuf_data(&one), h_states_out(&m), so_bytes);
    memcpy(tbuf_data(&one) + so_bytes, h_states_lse(&m), sl_bytes);
    poison(tbuf_data(&one) + so_bytes + sl_bytes, FD_DTYPE_F32, (o_bytes + l_bytes) / 4);
    tbuf_push(&one);
    fd_status st = mdata_call(&m, NULL, &err);
    if (st != FD_STATUS_OK) fail_msg("separate buffers: %s", err.message);
    st = fd_merge_states(&good, tbuf_arg(&one, 0), (const float *)tbuf_arg(&one, so_bytes),
                         tbuf_arg(&one, so_bytes + sl_bytes), (float *)tbuf_arg(&one, so_bytes + sl_bytes + o_bytes),
                         NULL, &err);
    if (st != FD_STATUS_OK) fail_msg("back-to-back buffers: %s: %s", fd_status_name(st), err.message);
    if (one.dev && fd_gpu_synchronize()) fail_msg("device error (back-to-back buffers)");
    tbuf_pull(&one);
    if (!tbuf_guards_ok(&one)) fail_msg("back-to-back buffers: guard bytes changed");
    if (memcmp(tbuf_data(&one), h_states_out(&m), so_bytes) ||
        memcmp(tbuf_data(&one) + so_bytes, h_states_lse(&m), sl_bytes))
      fail_msg("back-to-back buffers: the inputs changed");
    if (memcmp(tbuf_data(&one) + so_bytes + sl_bytes, h_out(&m), o_bytes) ||
        memcmp(tbuf_data(&one) + so_bytes + sl_bytes + o_bytes, h_lse(&m), l_bytes))
      fail_msg("back-to-back buffers: out or lse differ from separate buffers");
    tbuf_free(&one);
  }
  mdata_free(&m);
}

static void test_struct_size(void **state) {
  (void)state;
  assert_int_equal(fd_struct_size("fd_merge_problem"), sizeof(fd_merge_problem));
}

/* ---- CUDA graph: captured once, replayed on new inputs ---------------------------------------- */

static void test_graph(void **state) {
  const env *e = *state;
  const char *name = "graph";
  report rep = {name, e->seed, 0};
  rng r = {name_seed(e->seed, name)};
  rcase rc;
  memset(&rc, 0, sizeof rc);
  rc.shape = (mshape){FD_DTYPE_BF16, FD_DTYPE_F32, 5, 3, 2, 4, 128, 1, 0, e->backend};
  rc.p_empty = 0.3;
  rc.spread = 5.0;
  rc.specials = 1;
  mdata m, eager;
  mdata_init(e, &m, &rc.shape);
  mdata_init(e, &eager, &rc.shape);
  void *stream = NULL, *exec = NULL;
  if (rel_cuda_stream_create(&stream, 1)) fail_msg("stream");
  fill_random(&m, &rc, &r);
  tbuf_push(&m.so);
  tbuf_push(&m.sl);
  fd_merge_problem p = mdata_problem(&m);
  if (rel_cuda_capture_begin(stream)) fail_msg("capture begin");
  fd_error err;
  fd_status st = fd_merge_states(&p, tbuf_arg(&m.so, 0), (const float *)tbuf_arg(&m.sl, 0), tbuf_arg(&m.o, 0),
                                 (float *)tbuf_arg(&m.l, 0), stream, &err);
  if (rel_cuda_capture_end(stream, &exec)) fail_msg("capture end / instantiate");
  if (st != FD_STATUS_OK) fail_msg("fd_merge_states under capture: %s: %s", fd_status_name(st), err.message);
  for (int replay = 0; replay < 3; replay++) {
    /* new inputs in the same buffers, outputs poisoned, replay */
    fill_random(&m, &rc, &r);
    poison(tbuf_data(&m.o), FD_DTYPE_F32, m.o.bytes / 4);
    poison(tbuf_data(&m.l), FD_DTYPE_F32, m.l.bytes / 4);
    tbuf_push(&m.so);
    tbuf_push(&m.sl);
    tbuf_push(&m.o);
    tbuf_push(&m.l);
    if (rel_cuda_graph_launch(exec, stream) || rel_cuda_stream_sync(stream)) fail_msg("replay %d", replay);
    tbuf_pull(&m.o);
    tbuf_pull(&m.l);
    check_merge(&m, 0, &rep);
    if (!tbuf_guards_ok(&m.o) || !tbuf_guards_ok(&m.l)) fail_at(&rep, "replay %d: guard bytes changed", replay);
    /* the same inputs eagerly: bitwise the same */
    memcpy(tbuf_data(&eager.so), tbuf_data(&m.so), m.so.bytes);
    memcpy(tbuf_data(&eager.sl), tbuf_data(&m.sl), m.sl.bytes);
    st = mdata_call(&eager, NULL, &err);
    if (st != FD_STATUS_OK) fail_msg("eager fd_merge_states: %s", err.message);
    const size_t ob = (size_t)(m.rows * m.c.D) * 4, lb = (size_t)m.rows * 4;
    if (memcmp(h_out(&m), h_out(&eager), ob) || memcmp(h_lse(&m), h_lse(&eager), lb))
      fail_at(&rep, "replay %d differs from an eager call on the same inputs", replay);
  }
  rel_cuda_graph_destroy(exec);
  rel_cuda_stream_destroy(stream);
  mdata_free(&m);
  mdata_free(&eager);
  finish(&rep);
}

/* ---- main ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  env e;
  memset(&e, 0, sizeof e);
  e.gpu = argc > 1 && !strcmp(argv[1], "gpu");
  if (argc > 1 && !e.gpu && strcmp(argv[1], "cpu")) {
    fprintf(stderr, "usage: %s [cpu|gpu]\n", argv[0]);
    return 2;
  }
  if (e.gpu && !fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  e.backend = e.gpu ? FD_BACKEND_CUDA : FD_BACKEND_CPU;
  e.seed = fd_test_seed();
  const char *group = e.gpu ? "merge_gpu" : "merge_cpu";
  printf("%s: FD_TEST_SEED=%llu\n", group, (unsigned long long)e.seed);
  fflush(stdout);

  static rcase cases[MAX_CASES];
  static test_state states[MAX_CASES];
  static struct CMUnitTest tests[MAX_CASES + 8];
  const int n = make_cases(&e, cases, MAX_CASES);
  int t = 0;
  tests[t++] = (struct CMUnitTest){"struct_size", test_struct_size, NULL, NULL, &e};
  tests[t++] = (struct CMUnitTest){"worked_example", test_worked_example, NULL, NULL, &e};
  tests[t++] = (struct CMUnitTest){"bad_arguments", test_bad_arguments, NULL, NULL, &e};
  tests[t++] = (struct CMUnitTest){"consistency_f32", test_consistency_f32, NULL, NULL, &e};
  tests[t++] = (struct CMUnitTest){"consistency_bf16", test_consistency_bf16, NULL, NULL, &e};
  if (e.gpu) tests[t++] = (struct CMUnitTest){"graph", test_graph, NULL, NULL, &e};
  for (int i = 0; i < n; i++) {
    states[i].e = &e;
    states[i].rc = cases[i];
    rcase_name(&e, &cases[i], states[i].name, sizeof states[i].name);
    tests[t++] = (struct CMUnitTest){states[i].name, test_random_case, NULL, NULL, &states[i]};
  }
  const char *filter = getenv("FD_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  const int failed = _cmocka_run_group_tests(group, tests, (size_t)t, NULL, NULL);
  if (failed) printf("%s: FD_TEST_SEED=%llu reproduces these inputs\n", group, (unsigned long long)e.seed);
  return failed ? 1 : 0;
}
