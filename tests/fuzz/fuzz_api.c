/*
 * fuzz_api.c — libFuzzer target over the public API: argument checking and
 * the CPU (and reference) backend. Built with -fsanitize=fuzzer,address,
 * undefined by `make fuzz`; replay_main.c runs the same entry point over the
 * committed corpus (tests/fuzz/corpus) in the ordinary and ASan test builds.
 *
 * The first input byte picks a mode:
 *   even: fd_plan_init on raw field values (anything an int32 or a float can
 *         hold, kv_len_hint and the attention variants' fields included),
 *         fd_num_splits_heuristic on raw values, the name and size functions.
 *         Checks: a valid status with a terminated message; on success the
 *         plan's invariants (1 <= num_splits <= min(chunks, FD_MAX_SPLITS), a
 *         workspace_size that holds the partials, never a wrapped one; q_len,
 *         window, soft-cap, non_causal, out_dtype, softmax_scale, a
 *         contiguous kv_capacity, deterministic and no_pdl resolved to
 *         values the header allows; a deterministic plan's split count).
 *   odd:  a bounded problem (batch <= 4, kv_capacity <= 300, heads <= 16,
 *         head_dim 1..256, q_len up to 130 when non-causal) with the variants
 *         (sliding window, soft-cap, sinks with now and then a NaN one,
 *         non-causal rows, out_dtype f32, the deterministic mode; valid and
 *         invalid values), fuzzed
 *         strides (default, permuted and padded, negative, a 0 beside nonzero
 *         ones, FD_STRIDE_BROADCAST), element-misaligned pointers, kv_len and
 *         block_table values (in and out of range), NULL pointers, short or
 *         NULL workspaces, out or lse placed on another tensor's bytes, then
 *         fd_run (or fd_decode). Every buffer is allocated to the exact byte
 *         its strides reach, so ASan sees any access outside.
 *         Checks: a rejected call writes nothing; an accepted one writes every
 *         element of out and lse and nothing else, rows that see no key are
 *         0 / -inf (lse = the sink with sinks), rows of a NaN sink are NaN,
 *         everything else is finite and matches the float64 oracle within a
 *         worst-case rounding bound; a second plan with another thread count
 *         gives bitwise the same result; in the deterministic mode each
 *         sequence run alone (a batch of 1) gives bitwise its batch result.
 * A failed check prints the reason and aborts (libFuzzer keeps the input).
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "flashdecode.h"
#include "internal.h"
#include "split.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* FD_FUZZ_VERBOSE=1: one line per call (for replaying a corpus by hand). */
static int verbose(void) {
  const char *v = getenv("FD_FUZZ_VERBOSE");
  return v && *v && *v != '0';
}

/* ---- Reading the input ------------------------------------------------------------ */

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static uint32_t u8(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}
static uint32_t u16(reader *r) { return u8(r) | u8(r) << 8; }
static uint32_t u32(reader *r) { return u16(r) | u16(r) << 16; }
static uint64_t u64(reader *r) { return (uint64_t)u32(r) | (uint64_t)u32(r) << 32; }

/* An int32 that is often an edge value. */
static int32_t edgy32(reader *r) {
  static const int32_t edges[] = {0,         1,     -1,     2,       3,       7,         8,
                                  15,        16,    17,     63,      64,      65,        127,
                                  128,       255,   256,    257,     1000,    1024,      1025,
                                  65535,     65536, 262144, 1 << 20, 1 << 30, INT32_MAX, INT32_MAX - 63,
                                  INT32_MIN, -64};
  const uint32_t k = u8(r);
  if (k < 2 * (sizeof edges / sizeof *edges)) return edges[k % (sizeof edges / sizeof *edges)];
  return (int32_t)u32(r);
}

static _Noreturn void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz_api: check failed: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

static void check_error(fd_status st, const fd_error *err, const char *what) {
  if ((int)st < FD_STATUS_OK || (int)st > FD_STATUS_BACKEND_ERROR)
    fail("%s: status %d is not an fd_status", what, (int)st);
  if (err->status != st) fail("%s: err.status %d, returned %d", what, (int)err->status, (int)st);
  if (memchr(err->message, '\0', sizeof err->message) == NULL) fail("%s: message not terminated", what);
  if (st != FD_STATUS_OK && err->message[0] == '\0')
    fail("%s: %s without a message", what, fd_status_name(st));
}

/* ---- Mode: plans from raw values ----------------------------------------------------- */

static void fuzz_plan(reader *r) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = (fd_backend)(int32_t)(u8(r) % 6 == 5 ? edgy32(r) : (int32_t)(u8(r) % 4));
  p.dtype = (fd_dtype)(u8(r) % 8 == 7 ? edgy32(r) : 1 + (int32_t)(u8(r) % 3));
  p.batch = edgy32(r);
  p.q_len = edgy32(r);
  p.num_heads_q = edgy32(r);
  p.num_heads_kv = edgy32(r);
  p.head_dim = edgy32(r);
  p.kv_capacity = edgy32(r);
  p.page_size = edgy32(r);
  p.max_pages_per_seq = edgy32(r);
  p.num_pages = edgy32(r);
  p.num_splits = edgy32(r);
  const uint32_t bits = u32(r);
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  p.softmax_scale = u8(r) % 2 ? scale : 0.0f;
  p.num_threads = edgy32(r) % 5; /* the CPU would start this many threads */
  p.device = edgy32(r);
  p.sm_count = edgy32(r);
  /* the variants: mostly off or valid, now and then raw */
  p.has_window = u8(r) % 4 == 3 ? edgy32(r) : (int32_t)(u8(r) % 2);
  p.window_left = edgy32(r);
  const uint32_t cap_bits = u32(r);
  float cap_raw;
  memcpy(&cap_raw, &cap_bits, sizeof cap_raw);
  const uint32_t ck = u8(r) % 4;
  p.logits_soft_cap = ck == 0 ? 0.0f : ck == 1 ? 30.0f : ck == 2 ? -0.0f : cap_raw;
  p.non_causal = u8(r) % 4 == 3 ? edgy32(r) : (int32_t)(u8(r) % 2);
  p.out_dtype = (fd_dtype)(u8(r) % 4 == 3 ? edgy32(r) : (int32_t)(u8(r) % 4));
  if (u8(r) % 8 == 7) p.softmax_scale = -0.0f; /* refused, not the default */
  p.deterministic = u8(r) % 4 == 3 ? edgy32(r) : (int32_t)(u8(r) % 2);
  p.no_pdl = u8(r) % 4 == 3 ? edgy32(r) : (int32_t)(u8(r) % 2);
  int32_t hint[64];
  if (u8(r) % 3 == 0 && p.batch >= 1 && p.batch <= 64) {
    for (int32_t b = 0; b < p.batch; b++) hint[b] = edgy32(r);
    p.kv_len_hint = hint;
  }
  /* MLA, now and then: rope_dim mostly 0 or 64, rope_dtype mostly 0 */
  const uint32_t mk = u8(r) % 8;
  p.rope_dim = mk < 5 ? 0 : mk == 5 ? 64 : edgy32(r);
  p.rope_dtype = (fd_dtype)(u8(r) % 4 == 3 ? edgy32(r) : 0);
  /* values flashdecode.h calls invalid (whatever else is wrong): refused,
   * not resolved into valid ones */
  const int nc = p.non_causal == 1;
  const int mla = p.rope_dim != 0;
  const int bad_mla = p.rope_dim < 0 || p.rope_dim > 64 || (!mla && p.rope_dtype != 0) ||
                      (mla && (p.num_heads_kv != 1 || p.softmax_scale == 0.0f || nc ||
                               p.logits_soft_cap != 0.0f ||
                               (p.has_window == 1 && p.window_left >= 0)));
  const int bad_variant =
      (p.has_window != 0 && p.has_window != 1) || (p.has_window == 1 && p.window_left < -1) ||
      !(p.logits_soft_cap >= 0.0f) || isinf(p.logits_soft_cap) || (p.non_causal != 0 && p.non_causal != 1) ||
      (nc && p.has_window == 1 && p.window_left >= 0) ||
      (p.out_dtype != 0 && (fd_dtype_size(p.out_dtype) == 0 ||
                            (p.out_dtype != FD_DTYPE_F32 && p.out_dtype != p.dtype))) ||
      p.q_len < 0 || p.q_len > (nc ? FD_MAX_Q_LEN_NON_CAUSAL : FD_MAX_Q_LEN) ||
      (p.deterministic != 0 && p.deterministic != 1) || (p.deterministic == 1 && p.num_splits != 0) ||
      (p.no_pdl != 0 && p.no_pdl != 1);
  fd_plan plan;
  fd_error err;
  memset(&err, 0x5a, sizeof err);
  fd_status st = fd_plan_init(&plan, &p, &err);
  check_error(st, &err, "fd_plan_init");
  if (verbose()) printf("plan: %s%s%s\n", fd_status_name(st), st ? ": " : "", st ? err.message : "");
  fd_plan plan2;
  if (fd_plan_init(&plan2, &p, NULL) != st) fail("fd_plan_init: another status without err");
  if (st == FD_STATUS_OK && bad_mla)
    fail("fd_plan_init accepted rope_dim %d, rope_dtype %d, num_heads_kv %d, softmax_scale %g", p.rope_dim,
         (int)p.rope_dtype, p.num_heads_kv, (double)p.softmax_scale);
  if (st == FD_STATUS_OK && bad_variant)
    fail("fd_plan_init accepted has_window %d, window_left %d, logits_soft_cap %g, non_causal %d, q_len %d, "
         "out_dtype %d (dtype %d), deterministic %d (num_splits %d), no_pdl %d",
         p.has_window, p.window_left, (double)p.logits_soft_cap, p.non_causal, p.q_len, (int)p.out_dtype,
         (int)p.dtype, p.deterministic, p.num_splits, p.no_pdl);
  if (st == FD_STATUS_OK) {
    const fd_problem *q = &plan.problem;
    if (plan.backend != FD_BACKEND_CPU && plan.backend != FD_BACKEND_REFERENCE &&
        plan.backend != FD_BACKEND_CUDA)
      fail("plan.backend %d", (int)plan.backend);
    if (q->non_causal != 0 && q->non_causal != 1) fail("plan non_causal %d", q->non_causal);
    if (q->q_len < 1 || q->q_len > (q->non_causal ? FD_MAX_Q_LEN_NON_CAUSAL : FD_MAX_Q_LEN))
      fail("plan q_len %d (non_causal %d)", q->q_len, q->non_causal);
    if (q->window_left < -1 || q->has_window != (q->window_left >= 0) || (q->non_causal && q->has_window))
      fail("plan window: has_window %d, window_left %d, non_causal %d", q->has_window, q->window_left,
           q->non_causal);
    if (!(q->logits_soft_cap >= 0.0f) || isinf(q->logits_soft_cap))
      fail("plan logits_soft_cap %g", (double)q->logits_soft_cap);
    if (q->out_dtype != q->dtype && q->out_dtype != FD_DTYPE_F32)
      fail("plan out_dtype %d (dtype %d)", (int)q->out_dtype, (int)q->dtype);
    if (p.softmax_scale == 0.0f && signbit(p.softmax_scale)) fail("softmax_scale -0.0 accepted");
    if (q->page_size == 0 && plan.kv_capacity < 1) fail("contiguous plan of kv_capacity %d", plan.kv_capacity);
    if (q->deterministic != 0 && q->deterministic != 1) fail("plan deterministic %d", q->deterministic);
    if (q->no_pdl != p.no_pdl) fail("plan no_pdl %d, asked %d", q->no_pdl, p.no_pdl);
    if (q->deterministic && plan.backend != FD_BACKEND_REFERENCE) {
      /* fixed splits of FD_DETERMINISTIC_SPLIT_LEN keys over the keys a sequence reads */
      int64_t keys = plan.kv_capacity;
      if (q->window_left >= 0 && (int64_t)q->window_left + q->q_len + plan.chunk_len - 1 < keys)
        keys = (int64_t)q->window_left + q->q_len + plan.chunk_len - 1;
      const int64_t want = keys > 0 ? (keys + FD_DETERMINISTIC_SPLIT_LEN - 1) / FD_DETERMINISTIC_SPLIT_LEN : 1;
      if (plan.num_splits != want)
        fail("deterministic plan: %d splits for %lld keys, want %lld", plan.num_splits, (long long)keys,
             (long long)want);
    }
    if (q->head_dim < 1 || q->head_dim > (q->rope_dim > 0 ? 512 : 256)) fail("plan head_dim %d", q->head_dim);
    if (q->rope_dim > 0 && q->rope_dtype != q->dtype && q->rope_dtype != q->kv_dtype)
      fail("plan rope_dtype %d (dtype %d, kv_dtype %d)", (int)q->rope_dtype, (int)q->dtype, (int)q->kv_dtype);
    if (plan.kv_capacity < 0) fail("plan kv_capacity %d", plan.kv_capacity);
    if (!(plan.softmax_scale == plan.softmax_scale) || isinf(plan.softmax_scale))
      fail("plan softmax_scale not finite");
    const int64_t chunks =
        plan.chunk_len > 0 ? ((int64_t)plan.kv_capacity + plan.chunk_len - 1) / plan.chunk_len : -1;
    if (plan.chunk_len < 1) fail("plan chunk_len %d", plan.chunk_len);
    if (plan.num_splits < 1 || plan.num_splits > FD_MAX_SPLITS || (chunks >= 1 && plan.num_splits > chunks))
      fail("plan num_splits %d outside [1, min(%lld chunks, FD_MAX_SPLITS)]", plan.num_splits,
           (long long)chunks);
    if (plan.num_splits > 1) {
      const double need =
          (double)q->batch * q->num_heads_q * q->q_len * plan.num_splits * (q->head_dim + 2) * 4.0;
      if ((double)plan.workspace_size < need)
        fail(
            "plan workspace_size %zu < the %.4g bytes of the partials (batch %d, heads %d, q_len %d, splits "
            "%d, head_dim %d)",
            plan.workspace_size, need, q->batch, q->num_heads_q, q->q_len, plan.num_splits, q->head_dim);
    }
    /* a plan with no tensors runs nothing */
    fd_tensors t;
    memset(&t, 0, sizeof t);
    st = fd_run(&plan, &t, NULL, 0, NULL, &err);
    check_error(st, &err, "fd_run with NULL tensors");
    if (st != FD_STATUS_INVALID_ARGUMENT) fail("fd_run with NULL q returned %s", fd_status_name(st));
  } else {
    fd_tensors t;
    memset(&t, 0, sizeof t);
    st = fd_run(&plan, &t, NULL, 0, NULL, &err);
    if (st != FD_STATUS_INVALID_ARGUMENT) fail("fd_run on a failed plan returned %s", fd_status_name(st));
  }

  /* the pure functions */
  const int64_t work = (int64_t)u64(r), chunks = (int64_t)u64(r);
  const int32_t sms = edgy32(r), per = edgy32(r);
  const int32_t s = fd_num_splits_heuristic(work, chunks, sms, per);
  const int64_t most = chunks < FD_MAX_SPLITS ? chunks : FD_MAX_SPLITS;
  if (s < 1 || (chunks > 1 && s > most) || (chunks <= 1 && s != 1))
    fail("fd_num_splits_heuristic(%lld, %lld, %d, %d) = %d", (long long)work, (long long)chunks, sms, per, s);
  const int32_t raw = edgy32(r);
  if (!fd_status_name((fd_status)raw) || !fd_backend_name((fd_backend)raw))
    fail("a name function returned NULL");
  const size_t sz = fd_dtype_size((fd_dtype)raw);
  if (sz != 0 && sz != 1 && sz != 2 && sz != 4) fail("fd_dtype_size(%d) = %zu", raw, sz);
  char name[24];
  const size_t len = u8(r) % sizeof name;
  for (size_t i = 0; i < len; i++) name[i] = (char)u8(r);
  name[len] = '\0';
  (void)fd_struct_size(name);
  (void)fd_backend_available((fd_backend)raw);
}

/* ---- Mode: a bounded problem, run -------------------------------------------------------- */

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A tensor of logical shape [n0][n1][n2][d]: strides from the input. kind 0:
 * all zero (the documented contiguous layout); 1: the three dimensions in a
 * fuzzed order with fuzzed padding; 2: like 1 with one stride negated; 3:
 * like 1 with one stride passed as 0 (refused on a dimension of extent > 1);
 * 4: like 1 with one dimension broadcast (FD_STRIDE_BROADCAST; refused for
 * out and lse). */
typedef struct tensor {
  int64_t n[3], d;
  int64_t strides[3]; /* as passed */
  int64_t real[3];    /* as the library resolves them */
  int kind;
  int dim;       /* kinds 3 and 4: the dimension passed as 0 / broadcast */
  int64_t elems; /* allocation, elements, from the base */
  int64_t shift; /* elements the base is moved into the allocation */
  unsigned char *alloc;
  unsigned char *base;
} tensor;

static void tensor_layout(reader *r, tensor *t, int allow_negative) {
  const uint32_t k = u8(r) % 16; /* (a byte past the input's end reads 0: the default) */
  t->kind = k < 6 ? 0 : k == 15 && allow_negative ? 2 : k == 14 ? 3 : k == 13 ? 4 : 1;
  t->dim = -1;
  if (t->kind == 0) {
    memset(t->strides, 0, sizeof t->strides);
    t->real[2] = t->d, t->real[1] = t->n[2] * t->d, t->real[0] = t->n[1] * t->n[2] * t->d;
  } else {
    /* innermost first: a permutation of the three dims, each padded */
    const int perms[6][3] = {{2, 1, 0}, {1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {1, 0, 2}, {0, 1, 2}};
    const int *order = perms[u8(r) % 6];
    int64_t step = t->d + (int64_t)(u8(r) % 4);
    for (int i = 0; i < 3; i++) {
      const int dim = order[i];
      t->real[dim] = step;
      step = step * (t->n[dim] > 0 ? t->n[dim] : 1) + (int64_t)(u8(r) % 3);
    }
    memcpy(t->strides, t->real, sizeof t->strides);
    if (t->kind == 2) t->strides[u8(r) % 3] *= -1;
    if (t->kind == 3) t->strides[t->dim = (int)(u8(r) % 3)] = 0;
    if (t->kind == 4) {
      t->dim = (int)(u8(r) % 3);
      t->strides[t->dim] = FD_STRIDE_BROADCAST;
      t->real[t->dim] = 0;
    }
    if (t->strides[0] == 0 && t->strides[1] == 0 && t->strides[2] == 0) t->kind = 0;
  }
  int64_t last = 0;
  for (int i = 0; i < 3; i++) last += (t->n[i] - 1) * t->real[i];
  t->elems = last + t->d;
  t->shift = u8(r) % 4 == 3 ? (int64_t)(u8(r) % 3) + 1 : 0; /* element-aligned, not 16-byte aligned */
}

static int64_t offset(const tensor *t, int64_t a, int64_t b, int64_t c) {
  return a * t->real[0] + b * t->real[1] + c * t->real[2];
}

/* Allocates exactly shift + elems elements: ASan guards the end. */
static void tensor_alloc(tensor *t, size_t esize) {
  t->alloc = malloc((size_t)(t->shift + t->elems) * esize);
  if (!t->alloc) fail("out of memory");
  t->base = t->alloc + (size_t)t->shift * esize;
}

#define POISON_BYTE 0xff /* NaN in every dtype, and in lse */

/* Snapshot of a buffer, to check that a call did not write it. */
static unsigned char *snapshot(const void *p, size_t bytes) {
  unsigned char *c = malloc(bytes ? bytes : 1);
  if (!c) fail("out of memory");
  if (bytes) memcpy(c, p, bytes);
  return c;
}

static void fuzz_run(reader *r) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  const uint32_t be = u8(r) % 16;
  p.backend = be < 12    ? FD_BACKEND_CPU
              : be < 14  ? FD_BACKEND_REFERENCE
              : be == 14 ? FD_BACKEND_AUTO
                         : FD_BACKEND_CUDA;
  const uint32_t dt8 = u8(r) % 32;
  p.dtype = (fd_dtype)(dt8 == 31 ? 0 : 1 + dt8 % 3);
  p.batch = 1 + (int32_t)(u8(r) % 4);
  const uint32_t ql = u8(r) % 26; /* 1 most often, 1..16, 0 (= 1), 17 (refused) */
  p.q_len = ql < 8 ? 1 : ql < 24 ? (int32_t)ql - 7 : ql == 24 ? 0 : 17;
  /* the attention variants (a byte of flags; 0, past the input's end: none) */
  const uint32_t var = u8(r);
  if (var & 1) { /* sliding window: -1 (none) .. 78 keys, now and then -2 (refused) */
    p.has_window = 1;
    const uint32_t w = u8(r);
    p.window_left = w == 255 ? -2 : (int32_t)(w % 80) - 1;
  }
  if (var & 2) { /* soft-cap; -1 refused */
    static const float caps[] = {1.0f, 5.0f, 30.0f, -1.0f};
    p.logits_soft_cap = caps[u8(r) % 4];
  }
  if (var & 4) { /* non-causal rows, q_len 1..130 (129, 130 refused; a window refused) */
    p.non_causal = 1;
    p.q_len = 1 + (int32_t)(u8(r) % 130);
  }
  if (var & 8) /* fp32 out; now and then another dtype (refused unless it is dtype) */
    p.out_dtype = u8(r) % 8 == 7 ? (fd_dtype)(1 + (int32_t)(dt8 + 1) % 3) : FD_DTYPE_F32;
  const int with_sinks = (var & 16) != 0;
  const int deterministic = (var & 32) != 0;
  const int det_keep_splits = deterministic && u8(r) % 4 == 0; /* num_splits set: refused */
  const int nan_sink = with_sinks && u8(r) % 8 == 7;
  p.num_heads_kv = 1 + (int32_t)(u8(r) % 4);
  const uint32_t g = u8(r) % 16;
  p.num_heads_q = g == 15 ? p.num_heads_kv + 1 : p.num_heads_kv * (1 + (int32_t)(g % 4));
  const uint32_t hd = u16(r) % 300;
  p.head_dim = hd < 260    ? (int32_t)(hd % 256) + 1
               : hd == 299 ? 0
               : hd == 298 ? 257
                           : (int32_t)(8 << (hd % 6));
  const uint32_t ps = u8(r) % 16;
  static const int32_t page_sizes[] = {1, 2, 3, 7, 16, 32, 64, 256};
  p.page_size = ps < 8 ? 0 : page_sizes[ps - 8];
  int32_t cap = (int32_t)(u16(r) % 301); /* 0: refused for a contiguous cache */
  /* keep the float64 oracle cheap: rows * capacity * head_dim <= 2^22 */
  {
    const int64_t rows = (int64_t)p.batch * (p.q_len > 0 ? p.q_len : 1) * p.num_heads_q;
    const int64_t d = p.head_dim > 0 ? p.head_dim : 1;
    while (cap > 1 && rows * cap * d > ((int64_t)1 << 22)) cap /= 2;
  }
  int32_t max_pages = 0, pool = 0;
  if (p.page_size > 0) {
    max_pages = (cap + p.page_size - 1) / p.page_size + (int32_t)(u8(r) % 3);
    if (max_pages < 1) max_pages = 1;
    p.max_pages_per_seq = max_pages;
    if (u8(r) % 4 == 3) cap = 0; /* 0 = max_pages * page_size */
    pool = p.batch * max_pages + (int32_t)(u8(r) % 4);
    p.num_pages = u8(r) % 4 == 0 ? 0 : pool; /* 0 = unknown: then every id must be valid */
  }
  p.kv_capacity = cap;
  const uint32_t sp = u8(r) % 16;
  p.num_splits = sp < 6 ? 0 : sp < 14 ? (int32_t)(sp - 5) : sp == 14 ? 1000 : 64;
  if (deterministic) {
    p.deterministic = 1;
    if (!det_keep_splits) p.num_splits = 0;
  }
  static const float scales[] = {0.0f, 1.0f, 0.125f, 4.0f, 0.01f, 30.0f, -0.0f /* refused */};
  p.softmax_scale = scales[u8(r) % 7];
  p.num_threads = (int32_t)(u8(r) % 3);
  const int use_decode = u8(r) % 8 == 7;

  fd_plan plan;
  fd_error err;
  fd_status st = fd_plan_init(&plan, &p, &err);
  check_error(st, &err, "fd_plan_init");
  if (verbose()) printf("run: plan %s%s%s\n", fd_status_name(st), st ? ": " : "", st ? err.message : "");
  if (st != FD_STATUS_OK) return; /* bad shapes: the plan mode covers them */
  const fd_problem *q = &plan.problem;
  const int32_t B = q->batch, T = q->q_len, Hq = q->num_heads_q, Hkv = q->num_heads_kv, D = q->head_dim;
  const int32_t P = q->page_size, CAP = plan.kv_capacity;
  const size_t es = fd_dtype_size(q->dtype), eo = fd_dtype_size(q->out_dtype);

  /* tensors */
  tensor tq = {{B, T, Hq}, D, {0}, {0}, 0, -1, 0, 0, NULL, NULL}, tout = tq;
  const int64_t rows = P > 0 ? P : CAP, blocks = P > 0 ? pool : B;
  tensor tk = {{blocks, rows > 0 ? rows : 1, Hkv}, D, {0}, {0}, 0, -1, 0, 0, NULL, NULL}, tv = tk;
  tensor tl = {{B, Hq, T}, 1, {0}, {0}, 0, -1, 0, 0, NULL, NULL};
  tensor_layout(r, &tq, 1);
  tensor_layout(r, &tk, 1);
  tensor_layout(r, &tv, 1);
  tensor_layout(r, &tout, 1);
  tensor_layout(r, &tl, 1);
  tensor_alloc(&tq, es);
  tensor_alloc(&tk, es);
  tensor_alloc(&tv, es);
  tensor_alloc(&tout, eo);
  tensor_alloc(&tl, sizeof(float));
  const int negative = tq.kind == 2 || tk.kind == 2 || tv.kind == 2 || tout.kind == 2 || tl.kind == 2;

  /* values: NaN everywhere, then the keys a sequence has and q; v, q, k in [-2, 2] */
  uint64_t seed = u64(r);
  memset(tk.alloc, POISON_BYTE, (size_t)(tk.shift + tk.elems) * es);
  memset(tv.alloc, POISON_BYTE, (size_t)(tv.shift + tv.elems) * es);
  memset(tq.alloc, POISON_BYTE, (size_t)(tq.shift + tq.elems) * es);

  /* kv_len and block table */
  int32_t kv_len[4];
  int bad_len = 0;
  for (int32_t b = 0; b < B; b++) {
    const uint32_t k = u8(r) % 32;
    kv_len[b] = k < 28    ? (int32_t)(u16(r) % (uint32_t)(CAP + 1))
                : k == 28 ? -1
                : k == 29 ? CAP + 1
                : k == 30 ? INT32_MAX
                          : INT32_MIN;
    if (kv_len[b] < 0 || kv_len[b] > CAP) bad_len = 1;
  }
  const int64_t bt_stride = max_pages + (int64_t)(u8(r) % 3);
  int32_t *bt = NULL;
  int bad_id = 0;
  if (P > 0) {
    bt = malloc((size_t)(B * bt_stride) * sizeof *bt);
    if (!bt) fail("out of memory");
    for (int64_t i = 0; i < B * bt_stride; i++) {
      const uint32_t k = u8(r) % 32;
      int32_t id = (int32_t)(u16(r) % (uint32_t)pool);
      const int64_t b = i / bt_stride, col = i % bt_stride;
      /* pages wholly before a window's first (64-key) chunk are neither read nor checked */
      const int64_t w0 = bad_len ? 0 : fd_window_start(kv_len[b], plan.problem.q_len,
                                                        plan.problem.window_left, plan.chunk_len);
      const int used = !bad_len && col < max_pages && col * P < kv_len[b] && (col + 1) * P > w0;
      if (q->num_pages > 0 && k >= 29) {
        id = k == 29 ? -1 : k == 30 ? pool : INT32_MAX;
        if (used) bad_id = 1;
      } else if (!used && k >= 29) {
        id = -7; /* never looked at */
      }
      bt[i] = id;
    }
  }
  /* fill the live keys (every position of a key any sequence owns) */
  for (int32_t b = 0; b < B; b++) {
    const int32_t n = kv_len[b] >= 0 && kv_len[b] <= CAP ? kv_len[b] : 0;
    for (int32_t j = 0; j < n; j++) {
      int64_t blk = b, pos = j;
      if (P > 0) {
        const int32_t id = bt[b * bt_stride + j / P];
        if (id < 0 || id >= pool) continue; /* the run is rejected */
        blk = id, pos = j % P;
      }
      for (int32_t h = 0; h < Hkv; h++)
        for (int32_t i = 0; i < D; i++) {
          fd_store_elem(tk.base, q->dtype, offset(&tk, blk, pos, h) + i,
                (float)((double)(mix(&seed) >> 11) * 0x1.0p-53 * 4.0 - 2.0));
          fd_store_elem(tv.base, q->dtype, offset(&tv, blk, pos, h) + i,
                (float)((double)(mix(&seed) >> 11) * 0x1.0p-53 * 4.0 - 2.0));
        }
    }
  }
  for (int32_t b = 0; b < B; b++)
    for (int32_t t = 0; t < T; t++)
      for (int32_t h = 0; h < Hq; h++)
        for (int32_t i = 0; i < D; i++)
          fd_store_elem(tq.base, q->dtype, offset(&tq, b, t, h) + i,
                (float)((double)(mix(&seed) >> 11) * 0x1.0p-53 * 4.0 - 2.0));
  /* sinks in [-3, 3]; a NaN one gives its head's rows NaN */
  float sinks[16];
  for (int32_t h = 0; h < Hq; h++) sinks[h] = (float)((double)(mix(&seed) >> 11) * 0x1.0p-53 * 6.0 - 3.0);
  const int32_t nan_head = nan_sink ? (int32_t)(u8(r) % (uint32_t)Hq) : -1;
  if (nan_sink) sinks[nan_head] = NAN;

  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = tq.base, t.k_cache = tk.base, t.v_cache = tv.base, t.kv_len = kv_len, t.block_table = bt,
  t.out = tout.base;
  t.lse = u8(r) % 4 == 3 ? NULL : (float *)tl.base;
  t.sinks = with_sinks ? sinks : NULL;
  memcpy(t.q_strides, tq.strides, sizeof t.q_strides);
  memcpy(t.k_strides, tk.strides, sizeof t.k_strides);
  memcpy(t.v_strides, tv.strides, sizeof t.v_strides);
  memcpy(t.out_strides, tout.strides, sizeof t.out_strides);
  memcpy(t.lse_strides, tl.strides, sizeof t.lse_strides);
  const uint32_t bs = u8(r) % 8;
  t.block_table_stride = bs < 3 && bt_stride == max_pages ? 0 : bs == 7 ? -1 : bt_stride;
  if (P == 0) t.block_table = u8(r) % 2 ? NULL : bt;
  const uint32_t null_one = u8(r) % 24; /* 1..6: one pointer NULL */
  if (null_one == 1) t.q = NULL;
  if (null_one == 2) t.k_cache = NULL;
  if (null_one == 3) t.v_cache = NULL;
  if (null_one == 4) t.kv_len = NULL;
  if (null_one == 5) t.out = NULL;
  if (null_one == 6 && P > 0) t.block_table = NULL;
  const int null_bad = (null_one >= 1 && null_one <= 5) || (null_one == 6 && P > 0);

  /* strides: a literal 0 on a dimension of extent > 1 (as the library counts
   * them: a paged pool of unknown size is more than one page) is refused, for
   * lse only when lse is given; a broadcast out or lse is refused */
  const int64_t kv_ext0 = P > 0 ? (q->num_pages > 0 ? q->num_pages : -1) : B;
  int zero_bad = 0;
  {
    const tensor *ts[5] = {&tq, &tk, &tv, &tout, &tl};
    for (int i = 0; i < 5; i++) {
      const tensor *x = ts[i];
      if (x->kind == 3 && !(i == 4 && !t.lse)) {
        const int64_t ext = (i == 1 || i == 2) && x->dim == 0 ? kv_ext0 : x->n[x->dim];
        if (ext != 1) zero_bad = 1;
      }
      if (x->kind == 4 && i >= 3) zero_bad = 1;
    }
  }

  /* workspace: exact, one byte short, NULL, larger, or float- but not 16-byte aligned */
  const uint32_t wk = u8(r) % 8;
  size_t ws_size = plan.workspace_size;
  unsigned char *ws_alloc = malloc(plan.workspace_size + 8);
  if (!ws_alloc) fail("out of memory");
  memset(ws_alloc, POISON_BYTE, plan.workspace_size + 8);
  void *ws = ws_alloc;
  int ws_bad = 0;
  if (wk == 5) ws = (char *)ws_alloc + 4;
  if (wk == 6 && plan.workspace_size > 0) ws_size = plan.workspace_size - 1, ws_bad = 1;
  if (wk == 7) ws = NULL, ws_bad = plan.workspace_size > 0;

  /* out or lse on another tensor's bytes: refused (from the address ranges) */
  const uint32_t ov = u8(r) % 16;
  int overlap_bad = 0;
  if (t.out) {
    if (ov == 1 && t.q) t.out = (void *)t.q, overlap_bad = 1;
    if (ov == 2 && t.k_cache) t.out = (void *)t.k_cache, overlap_bad = 1;
    /* (fd_decode uses a workspace of its own) */
    if (ov == 3 && ws && plan.workspace_size > 0 && !use_decode) t.out = ws, overlap_bad = 1;
  }
  if (t.lse) {
    if (ov == 4 && t.v_cache) t.lse = (float *)t.v_cache, overlap_bad = 1;
    if (ov == 5 && t.out) t.lse = (float *)t.out, overlap_bad = 1;
    if (ov == 6 && t.kv_len) t.lse = (float *)kv_len, overlap_bad = 1;
    if (ov == 7 && t.sinks) t.lse = sinks, overlap_bad = 1;
  }

  memset(tout.alloc, POISON_BYTE, (size_t)(tout.shift + tout.elems) * eo);
  memset(tl.alloc, POISON_BYTE, (size_t)(tl.shift + tl.elems) * sizeof(float));
  /* the inputs and the buffers out or lse may have been moved onto */
  const size_t q_bytes = (size_t)(tq.shift + tq.elems) * es, k_bytes = (size_t)(tk.shift + tk.elems) * es,
               v_bytes = (size_t)(tv.shift + tv.elems) * es;
  unsigned char *q_copy = snapshot(tq.alloc, q_bytes), *k_copy = snapshot(tk.alloc, k_bytes),
                *v_copy = snapshot(tv.alloc, v_bytes);
  int32_t kv_len_copy[4];
  float sinks_copy[16];
  memcpy(kv_len_copy, kv_len, sizeof kv_len);
  memcpy(sinks_copy, sinks, sizeof sinks);
  memset(&err, 0x5a, sizeof err);
  const int bt_stride_bad = t.block_table_stride < 0;
  if (use_decode)
    st = fd_decode(&p, &t, NULL, &err);
  else
    st = fd_run(&plan, &t, ws, ws_size, NULL, &err);
  check_error(st, &err, use_decode ? "fd_decode" : "fd_run");
  if (verbose())
    printf("  %s %s/d%d/h%d:%d/b%d/q%d/cap%d/page%d/splits%d/win%d/softcap%g/nc%d/out%d/sinks%d/det%d -> %s%s%s\n",
           use_decode ? "fd_decode" : "fd_run", fd_backend_name(plan.backend), D, Hq, Hkv, B, T, CAP, P,
           plan.num_splits, q->window_left, (double)q->logits_soft_cap, q->non_causal, (int)q->out_dtype,
           with_sinks + nan_sink, q->deterministic, fd_status_name(st), st ? ": " : "", st ? err.message : "");
  /* no call writes its inputs */
  if (memcmp(q_copy, tq.alloc, q_bytes) || memcmp(k_copy, tk.alloc, k_bytes) || memcmp(v_copy, tv.alloc, v_bytes) ||
      memcmp(kv_len_copy, kv_len, sizeof kv_len) || memcmp(sinks_copy, sinks, sizeof sinks))
    fail("an input was written (status %s)", fd_status_name(st));
  free(q_copy), free(k_copy), free(v_copy);

  const int cuda = plan.backend == FD_BACKEND_CUDA;
  const int expect_bad = null_bad || negative || bt_stride_bad || bad_len || bad_id || zero_bad || overlap_bad ||
                         (!use_decode && ws_bad);
  if (cuda) {
    if (st == FD_STATUS_OK) fail("a CUDA run returned OK without a GPU");
  } else if (expect_bad && st == FD_STATUS_OK) {
    fail(
        "fd_run accepted a bad call (NULL %d, negative stride %d, block_table_stride %lld, kv_len bad %d, "
        "page id bad %d, workspace bad %d, zero or broadcast stride bad %d, overlap %d)",
        null_bad, negative, (long long)t.block_table_stride, bad_len, bad_id, ws_bad, zero_bad, overlap_bad);
  } else if (!expect_bad && st != FD_STATUS_OK) {
    fail("fd_run refused a good call: %s: %s", fd_status_name(st), err.message);
  }
  if (st != FD_STATUS_OK && !use_decode && plan.workspace_size > 0 && ws && !ws_bad) {
    /* a refused call leaves the workspace as it was, too */
    for (size_t i = 0; i < plan.workspace_size; i++)
      if (((unsigned char *)ws)[i] != POISON_BYTE) fail("workspace byte %zu written by a refused call", i);
  }

  /* what was written */
  unsigned char *mark = calloc((size_t)(tout.shift + tout.elems) + (size_t)(tl.shift + tl.elems), 1);
  if (!mark) fail("out of memory");
  unsigned char *lmark = mark + tout.shift + tout.elems;
  for (int32_t b = 0; b < B; b++)
    for (int32_t tt = 0; tt < T; tt++)
      for (int32_t h = 0; h < Hq; h++) {
        memset(mark + tout.shift + offset(&tout, b, tt, h), 1, (size_t)D);
        lmark[tl.shift + offset(&tl, b, h, tt)] = 1;
      }
  for (int64_t i = 0; i < tout.shift + tout.elems; i++) {
    const int touched = memcmp(tout.alloc + (size_t)i * eo, "\xff\xff\xff\xff", eo) != 0;
    if (touched && (st != FD_STATUS_OK || !mark[i]))
      fail("out element %lld written (status %s)", (long long)(i - tout.shift), fd_status_name(st));
  }
  for (int64_t i = 0; i < tl.shift + tl.elems; i++) {
    const int touched = memcmp(tl.alloc + (size_t)i * 4, "\xff\xff\xff\xff", 4) != 0;
    if (touched && (st != FD_STATUS_OK || !lmark[i] || !t.lse))
      fail("lse element %lld written", (long long)(i - tl.shift));
  }

  if (st == FD_STATUS_OK) {
    /* the oracle, on explicit strides */
    fd_plan ref_plan;
    fd_problem rp = *q;
    rp.backend = FD_BACKEND_REFERENCE;
    rp.num_splits = 0;
    if (fd_plan_init(&ref_plan, &rp, &err) != FD_STATUS_OK) fail("reference plan: %s", err.message);
    fd_tensors ht = t;
    memcpy(ht.q_strides, tq.real, sizeof ht.q_strides);
    memcpy(ht.k_strides, tk.real, sizeof ht.k_strides);
    memcpy(ht.v_strides, tv.real, sizeof ht.v_strides);
    memcpy(ht.out_strides, tout.real, sizeof ht.out_strides);
    memcpy(ht.lse_strides, tl.real, sizeof ht.lse_strides);
    ht.block_table_stride = bt_stride;
    const size_t nrows = (size_t)B * T * Hq;
    double *ref = malloc(nrows * D * sizeof *ref), *ref_lse = malloc(nrows * sizeof *ref_lse);
    if (!ref || !ref_lse) fail("out of memory");
    if (fd_reference_f64(&ref_plan, &ht, ref, ref_lse, &err) != FD_STATUS_OK) fail("oracle: %s", err.message);
    const double base = q->dtype == FD_DTYPE_F32 ? 2e-5 : q->dtype == FD_DTYPE_F16 ? 2e-3 : 1.6e-2;
    for (int32_t b = 0; b < B; b++)
      for (int32_t tt = 0; tt < T; tt++)
        for (int32_t h = 0; h < Hq; h++) {
          /* the keys row tt sees (as the header says): [lo, hi) */
          const int64_t pos = (int64_t)kv_len[b] - T + tt;
          const int64_t hi = q->non_causal ? kv_len[b] : pos + 1;
          const int64_t lo = q->window_left >= 0 && pos - q->window_left > 0 ? pos - q->window_left : 0;
          const int64_t visible = hi > lo ? hi - lo : 0;
          const int nan_row = t.sinks && isnan(t.sinks[h]);
          const double *rr = ref + (((size_t)b * T + tt) * Hq + h) * D;
          const double rl = ref_lse[((size_t)b * Hq + h) * T + tt];
          /* worst-case float32 score error: 2 D 2^-24 scale sum |q k| <= 2 D 2^-24 scale 4 D */
          const double eps = 2.0 * D * 0x1.0p-24 * fabs(plan.softmax_scale) * 4.0 * D;
          const double tol = 2.0 * (base + 2.0 * eps + 1e-6 * sqrt((double)(visible > 0 ? visible : 1)));
          for (int32_t i = 0; i < D; i++) {
            const double o = fd_load_elem(tout.base, q->out_dtype, offset(&tout, b, tt, h) + i);
            const int ok = nan_row ? isnan(o) : visible <= 0 ? o == 0.0 : fabs(o - rr[i]) <= tol;
            if (!ok)
              fail("out[b=%d,t=%d,h=%d][%d] = %.9g, oracle %.9g (sees %lld keys, tol %.3g%s)", b, tt, h, i, o,
                   rr[i], (long long)visible, tol, nan_row ? ", NaN sink" : "");
          }
          if (t.lse) {
            const double l = ((const float *)tl.base)[offset(&tl, b, h, tt)];
            const double empty = t.sinks ? (double)t.sinks[h] : -INFINITY;
            const int ok = nan_row ? isnan(l)
                           : visible <= 0 ? l == empty
                                          : fabs(l - rl) <= 1e-4 * fmax(1.0, fabs(rl)) + 2.0 * eps;
            if (!ok) fail("lse[b=%d,h=%d,t=%d] = %.9g, oracle %.9g (sees %lld keys)", b, h, tt, l, rl, (long long)visible);
          }
        }
    free(ref);
    free(ref_lse);
    /* deterministic: each sequence alone (a batch of 1, another thread count)
     * gives bitwise what it got in the batch (CPU) */
    if (q->deterministic && !use_decode && plan.backend == FD_BACKEND_CPU) {
      for (int32_t b = 0; b < B; b++) {
        fd_problem p1 = *q;
        p1.batch = 1;
        p1.num_threads = 1 + (b + q->num_threads) % 2;
        fd_plan plan1;
        if (fd_plan_init(&plan1, &p1, &err) != FD_STATUS_OK) fail("batch-1 plan: %s", err.message);
        fd_tensors t1 = t;
        t1.q = tq.base + (size_t)offset(&tq, b, 0, 0) * es;
        t1.kv_len = kv_len + b;
        if (P > 0) {
          t1.block_table = bt + (size_t)b * (size_t)bt_stride;
        } else {
          t1.k_cache = tk.base + (size_t)offset(&tk, b, 0, 0) * es;
          t1.v_cache = tv.base + (size_t)offset(&tv, b, 0, 0) * es;
        }
        const size_t n1 = (size_t)T * Hq * D;
        unsigned char *out1 = malloc(n1 * eo), *ws1 = malloc(plan1.workspace_size + 1);
        float *lse1 = malloc((size_t)T * Hq * sizeof(float));
        if (!out1 || !ws1 || !lse1) fail("out of memory");
        t1.out = out1;
        t1.lse = t.lse ? lse1 : NULL;
        memset(t1.out_strides, 0, sizeof t1.out_strides);
        memset(t1.lse_strides, 0, sizeof t1.lse_strides);
        if ((st = fd_run(&plan1, &t1, ws1, plan1.workspace_size, NULL, &err)) != FD_STATUS_OK)
          fail("batch-1 run of sequence %d: %s", b, err.message);
        for (int32_t tt = 0; tt < T; tt++)
          for (int32_t h = 0; h < Hq; h++) {
            const unsigned char *a = tout.base + (size_t)offset(&tout, b, tt, h) * eo;
            const unsigned char *c = out1 + ((size_t)tt * Hq + h) * D * eo;
            for (int32_t i = 0; i < D; i++) {
              const double x = fd_load_elem(a, q->out_dtype, i), y = fd_load_elem(c, q->out_dtype, i);
              if (memcmp(a + (size_t)i * eo, c + (size_t)i * eo, eo) != 0 && !(isnan(x) && isnan(y)))
                fail("deterministic: sequence %d alone differs at t=%d h=%d [%d]: %.9g vs %.9g in the batch",
                     b, tt, h, i, y, x);
            }
            if (t.lse) {
              const float la = ((const float *)tl.base)[offset(&tl, b, h, tt)], lb = lse1[(size_t)h * T + tt];
              if (memcmp(&la, &lb, sizeof la) != 0 && !(isnan(la) && isnan(lb)))
                fail("deterministic: sequence %d alone: lse %.9g vs %.9g in the batch", b, (double)lb, (double)la);
            }
          }
        free(out1), free(ws1), free(lse1);
      }
    }
    /* another thread count, same split count: bitwise the same (CPU) */
    if (!use_decode && plan.backend == FD_BACKEND_CPU) {
      fd_problem p2 = *q;
      p2.num_threads = q->num_threads == 1 ? 2 : 1;
      p2.num_splits = q->deterministic ? 0 : plan.num_splits; /* deterministic: fixed splits */
      fd_plan plan2;
      if (fd_plan_init(&plan2, &p2, &err) != FD_STATUS_OK) fail("second plan: %s", err.message);
      if (plan2.num_splits == plan.num_splits && plan2.workspace_size <= plan.workspace_size + 8) {
        unsigned char *copy =
            malloc((size_t)(tout.shift + tout.elems) * eo + (size_t)(tl.shift + tl.elems) * 4 + 1);
        if (!copy) fail("out of memory");
        memcpy(copy, tout.alloc, (size_t)(tout.shift + tout.elems) * eo);
        memcpy(copy + (size_t)(tout.shift + tout.elems) * eo, tl.alloc, (size_t)(tl.shift + tl.elems) * 4);
        memset(ws_alloc, 0, plan.workspace_size + 8);
        st = fd_run(&plan2, &t, ws_alloc, plan2.workspace_size, NULL, &err);
        if (st != FD_STATUS_OK) fail("second run: %s", err.message);
        if (memcmp(copy, tout.alloc, (size_t)(tout.shift + tout.elems) * eo) != 0 ||
            memcmp(copy + (size_t)(tout.shift + tout.elems) * eo, tl.alloc,
                   (size_t)(tl.shift + tl.elems) * 4) != 0)
          fail("%d vs %d threads: results differ", plan.num_threads, plan2.num_threads);
        free(copy);
      }
    }
  }
  free(mark);
  free(ws_alloc);
  free(bt);
  free(tq.alloc), free(tk.alloc), free(tv.alloc), free(tout.alloc), free(tl.alloc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  if (u8(&r) % 2 == 0)
    fuzz_plan(&r);
  else
    fuzz_run(&r);
  return 0;
}
