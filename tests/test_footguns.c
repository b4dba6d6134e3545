/*
 * test_footguns.c — calls that used to do something other than what the
 * caller meant, now refused with a message or made to mean it:
 *   - a zero stride beside nonzero ones (read as a broadcast) is refused,
 *     naming the tensor and the stride index; FD_STRIDE_BROADCAST broadcasts
 *     an input on purpose and gives what a materialised copy gives;
 *   - out or lse overlapping an input, the workspace or each other is
 *     refused from addresses and strides alone (also on a CUDA plan, before
 *     anything reaches the device), naming both; disjoint neighbours pass;
 *   - a contiguous plan without kv_capacity fails in fd_plan_init, naming it;
 *   - softmax_scale -0.0 is refused instead of meaning "default";
 *   - num_threads 0 follows OMP_NUM_THREADS (setenv in this process).
 * Every refused fd_run leaves out and lse untouched.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, strdup */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashdecode.h"
#include "gpu_mem.h"
#include "internal.h" /* fd_cpu_env_threads, fd_cpu_default_threads */

enum { B = 2, T = 1, HQ = 4, HKV = 2, D = 8, CAP = 256, PAGE = 64, PAGES = 4 };
enum { Q_ELEMS = B * T * HQ * D, KV_ELEMS = B * CAP * HKV * D, LSE_ELEMS = B * HQ * T };

/* One buffer holding every tensor of a small CPU call, so that the tests can
 * move a tensor onto another's bytes. Offsets in floats. */
typedef struct fixture {
  fd_plan plan;
  float *mem;
  size_t mem_floats;
  int32_t kv_len[B];
  int32_t block_table[B * PAGES];
  float sinks[HQ];
  unsigned char *workspace;
  fd_tensors t;
} fixture;

static const size_t OFF_Q = 0, OFF_K = Q_ELEMS, OFF_V = Q_ELEMS + KV_ELEMS,
                    OFF_OUT = Q_ELEMS + 2 * KV_ELEMS, OFF_LSE = 2 * Q_ELEMS + 2 * KV_ELEMS,
                    OFF_END = 2 * Q_ELEMS + 2 * KV_ELEMS + LSE_ELEMS;

static fixture *make_fixture(fd_backend backend, int32_t page_size) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = backend;
  p.dtype = FD_DTYPE_F32;
  p.batch = B;
  p.q_len = T;
  p.num_heads_q = HQ;
  p.num_heads_kv = HKV;
  p.head_dim = D;
  p.kv_capacity = CAP;
  p.num_splits = 2;
  p.num_threads = 1;
  if (page_size) {
    p.page_size = page_size;
    p.max_pages_per_seq = PAGES;
    p.num_pages = 2 * PAGES;
  }
  fd_error err;
  if (fd_plan_init(&f->plan, &p, &err) != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
  f->mem_floats = OFF_END + 64; /* room to move a tensor a little */
  f->mem = calloc(f->mem_floats, sizeof(float));
  assert_non_null(f->mem);
  for (size_t i = 0; i < Q_ELEMS; i++) f->mem[OFF_Q + i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (size_t i = 0; i < KV_ELEMS; i++) {
    f->mem[OFF_K + i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
    f->mem[OFF_V + i] = (float)((i * 3) % 17) / 17.0f - 0.5f;
  }
  f->kv_len[0] = 100;
  f->kv_len[1] = CAP;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < PAGES; i++) f->block_table[b * PAGES + i] = b * PAGES + (PAGES - 1 - i);
  for (int h = 0; h < HQ; h++) f->sinks[h] = 0.25f * (float)h;
  /* slack after the workspace: a tensor put on its last float (the overlap
   * cases) then runs into memory of its own, not whatever the heap placed
   * next (another fixture buffer, which the message would name instead) */
  f->workspace = malloc((f->plan.workspace_size ? f->plan.workspace_size : 1) + 4096);
  assert_non_null(f->workspace);
  f->t.q = f->mem + OFF_Q;
  f->t.k_cache = f->mem + OFF_K;
  f->t.v_cache = f->mem + OFF_V;
  f->t.kv_len = f->kv_len;
  f->t.block_table = page_size ? f->block_table : NULL;
  f->t.out = f->mem + OFF_OUT;
  f->t.lse = f->mem + OFF_LSE;
  return f;
}

static void free_fixture(fixture *f) {
  free(f->workspace);
  free(f->mem);
  free(f);
}

/* The status is `want`, err carries it, and the message names every needle. */
static void expect(fd_status got, fd_status want, const fd_error *err, const char *what,
                   const char *needle1, const char *needle2) {
  if (got != want)
    fail_msg("%s: returned %s, want %s (message: %s)", what, fd_status_name(got), fd_status_name(want),
             err->message);
  if (err->status != want) fail_msg("%s: err.status %s", what, fd_status_name(err->status));
  if (want == FD_STATUS_OK) return;
  if (!memchr(err->message, '\0', sizeof err->message) || !err->message[0])
    fail_msg("%s: empty or unterminated message", what);
  if (needle1 && !strstr(err->message, needle1))
    fail_msg("%s: message \"%s\" does not name \"%s\"", what, err->message, needle1);
  if (needle2 && !strstr(err->message, needle2))
    fail_msg("%s: message \"%s\" does not name \"%s\"", what, err->message, needle2);
}

/* fd_run on f's tensors, with the whole buffer poisoned (0xff bytes: NaN) in
 * the out and lse regions first; returns the status. *written: whether a
 * byte of the buffer outside q/k/v changed. */
static fd_status run_poisoned(fixture *f, fd_error *err, int *written) {
  unsigned char *before = malloc(f->mem_floats * sizeof(float));
  assert_non_null(before);
  memset(f->mem + OFF_OUT, 0xff, (f->mem_floats - OFF_OUT) * sizeof(float));
  memcpy(before, f->mem, f->mem_floats * sizeof(float));
  fd_status st = fd_run(&f->plan, &f->t, f->workspace, f->plan.workspace_size, NULL, err);
  *written = memcmp(before, f->mem, f->mem_floats * sizeof(float)) != 0;
  free(before);
  return st;
}

/* ---- Mixed zero strides ---------------------------------------------------------- */

static void dense(int64_t s[3], int64_t n1, int64_t n2, int64_t inner) {
  s[2] = inner;
  s[1] = n2 * inner;
  s[0] = n1 * n2 * inner;
}

/* A zero stride on a dimension of extent > 1, the others set: refused, naming
 * the tensor's strides and the index; nothing written. On a dimension of
 * extent 1 (q_len 1 here) it is accepted. */
static void test_mixed_zero_strides(void **state) {
  (void)state;
  static const char *names[] = {"q_strides", "k_strides", "v_strides", "out_strides", "lse_strides"};
  for (int paged = 0; paged < 2; paged++)
    for (int which = 0; which < 5; which++)
      for (int dim = 0; dim < 3; dim++) {
        fixture *f = make_fixture(FD_BACKEND_CPU, paged ? PAGE : 0);
        int64_t *s[] = {f->t.q_strides, f->t.k_strides, f->t.v_strides, f->t.out_strides,
                        f->t.lse_strides};
        dense(f->t.q_strides, T, HQ, D);
        dense(f->t.out_strides, T, HQ, D);
        dense(f->t.k_strides, paged ? PAGE : CAP, HKV, D);
        dense(f->t.v_strides, paged ? PAGE : CAP, HKV, D);
        dense(f->t.lse_strides, HQ, T, 1);
        fd_error err;
        int written;
        expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "explicit dense strides", NULL, NULL);
        s[which][dim] = 0;
        /* extent of that dimension: q/out {B, T, HQ}, k/v {B or pages, CAP or PAGE, HKV}, lse {B, HQ, T} */
        const int64_t ext[5][3] = {{B, T, HQ}, {B, CAP, HKV}, {B, CAP, HKV}, {B, T, HQ}, {B, HQ, T}};
        char what[96], needle[32];
        snprintf(what, sizeof what, "%s %s[%d] = 0", paged ? "paged" : "contiguous", names[which], dim);
        snprintf(needle, sizeof needle, "%s: stride %d", names[which], dim);
        if (ext[which][dim] == 1) {
          expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, what, NULL, NULL);
        } else {
          expect(run_poisoned(f, &err, &written), FD_STATUS_INVALID_ARGUMENT, &err, what, needle, "0");
          if (written) fail_msg("%s: refused, but memory was written", what);
        }
        free_fixture(f);
      }
}

/* FD_STRIDE_BROADCAST: k and v broadcast over the batch read sequence 0's
 * cache for every sequence, bitwise what a copy of it gives; q broadcast
 * over the heads likewise; out and lse cannot be broadcast. */
static void test_broadcast_stride(void **state) {
  (void)state;
  fixture *f = make_fixture(FD_BACKEND_CPU, 0);
  fd_error err;
  int written;
  /* reference: sequence 1's cache a copy of sequence 0's, q heads all head 0's */
  const size_t per_seq = (size_t)CAP * HKV * D;
  memcpy(f->mem + OFF_K + per_seq, f->mem + OFF_K, per_seq * sizeof(float));
  memcpy(f->mem + OFF_V + per_seq, f->mem + OFF_V, per_seq * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int h = 1; h < HQ; h++)
      memcpy(f->mem + OFF_Q + ((size_t)b * HQ + h) * D, f->mem + OFF_Q + (size_t)b * HQ * D, D * sizeof(float));
  expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "materialised copies", NULL, NULL);
  float *want = malloc((Q_ELEMS + LSE_ELEMS) * sizeof(float));
  assert_non_null(want);
  memcpy(want, f->mem + OFF_OUT, (Q_ELEMS + LSE_ELEMS) * sizeof(float));

  /* the copies poisoned: only the broadcast strides can give the same result */
  memset(f->mem + OFF_K + per_seq, 0xff, per_seq * sizeof(float));
  memset(f->mem + OFF_V + per_seq, 0xff, per_seq * sizeof(float));
  for (int b = 0; b < B; b++) memset(f->mem + OFF_Q + ((size_t)b * HQ + 1) * D, 0xff, (HQ - 1) * D * sizeof(float));
  const int64_t kb[3] = {FD_STRIDE_BROADCAST, HKV * D, D}, qb[3] = {T * HQ * D, HQ * D, FD_STRIDE_BROADCAST};
  memcpy(f->t.k_strides, kb, sizeof kb);
  memcpy(f->t.v_strides, kb, sizeof kb);
  memcpy(f->t.q_strides, qb, sizeof qb);
  expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "FD_STRIDE_BROADCAST", NULL, NULL);
  if (memcmp(want, f->mem + OFF_OUT, (Q_ELEMS + LSE_ELEMS) * sizeof(float)) != 0)
    fail_msg("broadcast strides differ from the materialised copies");
  free(want);

  /* every stride broadcast (one q row for everything) is not 'contiguous' */
  const int64_t all[3] = {FD_STRIDE_BROADCAST, FD_STRIDE_BROADCAST, FD_STRIDE_BROADCAST};
  memcpy(f->t.q_strides, all, sizeof all);
  expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "q all broadcast", NULL, NULL);
  const float *out = f->mem + OFF_OUT;
  for (int h = 1; h < HQ; h++) /* sequence 0: every head reads q[0,0,0] and kv head h / 2 */
    if (h / 2 == 0 && memcmp(out, out + h * D, D * sizeof(float)) != 0) fail_msg("head %d differs", h);

  /* outputs cannot be broadcast */
  memset(f->t.q_strides, 0, sizeof f->t.q_strides);
  const int64_t ob[3] = {FD_STRIDE_BROADCAST, HQ * D, D}, lb[3] = {HQ * T, T, FD_STRIDE_BROADCAST};
  memcpy(f->t.out_strides, ob, sizeof ob);
  expect(run_poisoned(f, &err, &written), FD_STATUS_INVALID_ARGUMENT, &err, "out broadcast",
         "out_strides: stride 0", "FD_STRIDE_BROADCAST");
  if (written) fail_msg("out broadcast: memory written");
  memset(f->t.out_strides, 0, sizeof f->t.out_strides);
  memcpy(f->t.lse_strides, lb, sizeof lb);
  expect(run_poisoned(f, &err, &written), FD_STATUS_INVALID_ARGUMENT, &err, "lse broadcast",
         "lse_strides: stride 2", "FD_STRIDE_BROADCAST");
  if (written) fail_msg("lse broadcast: memory written");
  /* ... but an unused lse's strides are checked for sign only */
  f->t.lse = NULL;
  const int64_t lz[3] = {0, 5, 0};
  memcpy(f->t.lse_strides, lz, sizeof lz);
  expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "lse NULL, odd strides", NULL, NULL);
  free_fixture(f);
}

/* ---- Overlaps ------------------------------------------------------------------- */

typedef struct overlap_case {
  const char *what;
  const char *a, *b; /* the names the message must hold */
  void (*place)(fixture *f);
} overlap_case;

static void o_out_on_q(fixture *f) { f->t.out = f->mem + OFF_Q; }
static void o_out_in_q_tail(fixture *f) { f->t.out = f->mem + OFF_Q + Q_ELEMS - 1; }
static void o_out_in_k(fixture *f) { f->t.out = f->mem + OFF_K + 100; }
static void o_out_in_v(fixture *f) { f->t.out = f->mem + OFF_V + KV_ELEMS - 1; }
static void o_out_on_kv_len(fixture *f) { f->t.out = (float *)f->kv_len; }
static void o_out_on_bt(fixture *f) { f->t.out = (float *)(f->block_table + PAGES); }
static void o_out_on_sinks(fixture *f) {
  f->t.sinks = f->sinks;
  f->t.out = f->sinks + 2;
}
static void o_out_on_ws(fixture *f) { f->t.out = (float *)(f->workspace + f->plan.workspace_size - 4); }
static void o_lse_on_q(fixture *f) { f->t.lse = f->mem + OFF_Q + 3; }
static void o_lse_on_k(fixture *f) { f->t.lse = f->mem + OFF_K; }
static void o_lse_on_kv_len(fixture *f) { f->t.lse = (float *)f->kv_len + 1; }
static void o_lse_on_ws(fixture *f) { f->t.lse = (float *)f->workspace; }
static void o_lse_on_sinks(fixture *f) {
  f->t.sinks = f->sinks;
  f->t.lse = f->sinks;
}
static void o_lse_in_out(fixture *f) { f->t.lse = f->mem + OFF_OUT + Q_ELEMS - 1; }
/* out's heads padded to 3 * D (a strided view): its span covers q placed
 * in the padding of its last row */
static void o_out_strided(fixture *f) {
  const int64_t s[3] = {T * HQ * 3 * D, HQ * 3 * D, 3 * D};
  memcpy(f->t.out_strides, s, sizeof s);
  f->t.out = f->mem + OFF_K; /* spans (B-1)*HQ*3D + (HQ-1)*3D + D floats */
  f->t.q = f->mem + OFF_K + ((B - 1) * HQ * 3 + (HQ - 1) * 3) * D + D - 1;
}

static void test_overlaps_refused(void **state) {
  (void)state;
  const overlap_case cases[] = {
      {"out = q", "out", "q's", o_out_on_q},
      {"out starts in q's last element", "out", "q's", o_out_in_q_tail},
      {"out inside k_cache", "out", "k_cache", o_out_in_k},
      {"out on v_cache's last element", "out", "v_cache", o_out_in_v},
      {"out on kv_len", "out", "kv_len", o_out_on_kv_len},
      {"out on block_table", "out", "block_table", o_out_on_bt},
      {"out on sinks", "out", "sinks", o_out_on_sinks},
      {"out on the workspace's last float", "out", "workspace", o_out_on_ws},
      {"lse inside q", "lse", "q's", o_lse_on_q},
      {"lse on k_cache", "lse", "k_cache", o_lse_on_k},
      {"lse on kv_len", "lse", "kv_len", o_lse_on_kv_len},
      {"lse on the workspace", "lse", "workspace", o_lse_on_ws},
      {"lse on sinks", "lse", "sinks", o_lse_on_sinks},
      {"lse on out's last element", "lse", "out's", o_lse_in_out},
      {"strided out over q", "out", "q's", o_out_strided},
  };
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE};
  for (int bi = 0; bi < 2; bi++)
    for (int paged = 0; paged < 2; paged++)
      for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture *f = make_fixture(backends[bi], paged ? PAGE : 0);
        if (cases[i].place == o_out_on_bt && !paged) { /* a contiguous plan has no block table */
          free_fixture(f);
          continue;
        }
        if ((cases[i].place == o_out_on_ws || cases[i].place == o_lse_on_ws) && f->plan.workspace_size == 0) {
          free_fixture(f);
          continue;
        }
        cases[i].place(f);
        char what[128];
        snprintf(what, sizeof what, "%s %s: %s", fd_backend_name(backends[bi]), paged ? "paged" : "contiguous",
                 cases[i].what);
        fd_error err;
        int written;
        expect(run_poisoned(f, &err, &written), FD_STATUS_INVALID_ARGUMENT, &err, what, cases[i].a, cases[i].b);
        if (written) fail_msg("%s: refused, but memory was written", what);
        free_fixture(f);
      }
}

/* Disjoint neighbours pass: out right after q's last element, lse right
 * after out's, out right before k; a padded strided out whose last row
 * ends just before q; an interleaved layout in separate buffers (the
 * tests' FD_LAYOUT_INTERLEAVED). */
static void test_overlaps_exact_bounds(void **state) {
  (void)state;
  for (int paged = 0; paged < 2; paged++) {
    fixture *f = make_fixture(FD_BACKEND_CPU, paged ? PAGE : 0);
    fd_error err;
    int written;
    expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "touching neighbours (the fixture's layout)",
           NULL, NULL);
    /* out immediately before k_cache: q moved past lse */
    f->t.q = f->mem + OFF_LSE + LSE_ELEMS;
    f->t.out = f->mem + OFF_K - Q_ELEMS;
    f->t.lse = f->mem + OFF_OUT;
    expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "out just before k", NULL, NULL);
    free_fixture(f);

    /* a padded strided out ([b][t][h] rows of 3 * D, head_dim D) ending one
     * element before q; its padding is not written */
    f = make_fixture(FD_BACKEND_CPU, paged ? PAGE : 0);
    const int64_t s[3] = {T * HQ * 3 * D, HQ * 3 * D, 3 * D};
    memcpy(f->t.out_strides, s, sizeof s);
    const size_t span = ((B - 1) * HQ * 3 + (HQ - 1) * 3) * D + D;
    f->t.out = f->mem + OFF_K;
    f->t.q = f->mem + OFF_K + span;
    memcpy(f->mem + OFF_K + span, f->mem + OFF_Q, Q_ELEMS * sizeof(float));
    f->t.k_cache = f->mem + OFF_V; /* k and v may share bytes: both are inputs */
    expect(run_poisoned(f, &err, &written), FD_STATUS_OK, &err, "strided out ending before q", NULL, NULL);
    free_fixture(f);
  }
}

/* A CUDA plan refuses an overlap in fd_run before anything reaches the
 * device: the check reads no memory. Without a GPU the plan is a CPU plan
 * with its backend field set to CUDA (fd_run dispatches on it); the
 * non-overlapping call then reaches the CUDA path and fails there for
 * another reason (no CUDA in this build or no device). */
static void test_overlaps_cuda_path(void **state) {
  (void)state;
  fixture *f = make_fixture(FD_BACKEND_CPU, 0);
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    f->plan.backend = FD_BACKEND_CUDA;
    f->plan.problem.backend = FD_BACKEND_CUDA;
  } else {
    fd_problem p = f->plan.problem;
    p.backend = FD_BACKEND_CUDA;
    p.head_dim = 64; /* a CUDA head_dim; the pointers are never read */
    fd_error err;
    if (fd_plan_init(&f->plan, &p, &err) != FD_STATUS_OK) fail_msg("CUDA plan: %s", err.message);
    free(f->workspace);
    /* slack after the workspace: a tensor put on its last float (the overlap
   * cases) then runs into memory of its own, not whatever the heap placed
   * next (another fixture buffer, which the message would name instead) */
  f->workspace = malloc((f->plan.workspace_size ? f->plan.workspace_size : 1) + 4096);
    f->mem_floats = (size_t)1 << 20;
    free(f->mem);
    f->mem = calloc(f->mem_floats, sizeof(float));
    assert_non_null(f->mem);
    f->t.q = f->t.out = f->mem; /* host pointers: refused before any launch */
    f->t.k_cache = f->t.v_cache = f->mem + 4096;
    f->t.lse = NULL;
  }
  f->t.out = (void *)f->t.q;
  fd_error err;
  int written;
  expect(run_poisoned(f, &err, &written), FD_STATUS_INVALID_ARGUMENT, &err, "CUDA plan, out = q", "out", "q's");
  if (written) fail_msg("CUDA plan, out = q: memory written");
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    f->t.out = f->mem + OFF_OUT;
    fd_status st = run_poisoned(f, &err, &written);
    if (st == FD_STATUS_OK || st == FD_STATUS_INVALID_ARGUMENT)
      fail_msg("CUDA plan without CUDA, no overlap: returned %s (%s)", fd_status_name(st), err.message);
    if (written) fail_msg("CUDA plan without CUDA: memory written");
  }
  free_fixture(f);
}

#ifdef FD_TEST_HAVE_CUDA
/* With a GPU: device buffers, out on q's device bytes and lse on k's. */
static void test_overlaps_cuda_device(void **state) {
  (void)state;
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    print_message("CUDA backend not available: device overlap checks not run\n");
    skip();
  }
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CUDA;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 2;
  p.num_heads_q = 8;
  p.num_heads_kv = 2;
  p.head_dim = 64;
  p.kv_capacity = 1000;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("CUDA plan: %s", err.message);
  const size_t q_bytes = 2 * 8 * 64 * 2, kv_bytes = (size_t)2 * 1000 * 2 * 64 * 2;
  unsigned char *buf = NULL, *ws = NULL;
  int32_t *kv_len = NULL;
  assert_int_equal(fd_gpu_malloc((void **)&buf, 2 * q_bytes + 2 * kv_bytes + 4096), 0);
  assert_int_equal(fd_gpu_malloc((void **)&kv_len, 2 * sizeof(int32_t)), 0);
  assert_int_equal(fd_gpu_malloc((void **)&ws, plan.workspace_size + 64), 0);
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = buf;
  t.k_cache = buf + q_bytes;
  t.v_cache = buf + q_bytes + kv_bytes;
  t.kv_len = kv_len;
  t.out = buf + 16; /* inside q */
  expect(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err,
         "device out inside q", "out", "q's");
  t.out = buf + q_bytes + 2 * kv_bytes;
  t.lse = (float *)(buf + q_bytes); /* on k */
  expect(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err,
         "device lse on k_cache", "lse", "k_cache");
  t.lse = (float *)ws;
  expect(fd_run(&plan, &t, ws, plan.workspace_size, NULL, &err), FD_STATUS_INVALID_ARGUMENT, &err,
         "device lse on the workspace", "lse", "workspace");
  fd_gpu_free(buf);
  fd_gpu_free(kv_len);
  fd_gpu_free(ws);
}
#endif

/* ---- fd_plan_init --------------------------------------------------------------- */

static fd_problem small_problem(fd_backend backend) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = backend;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 2;
  p.num_heads_q = 8;
  p.num_heads_kv = 2;
  p.head_dim = 64;
  p.kv_capacity = 1000;
  return p;
}

/* kv_capacity 0 for a contiguous cache fails at plan time, naming it and
 * what to set (every backend: the check comes before the device); a paged
 * plan still takes 0 as "all its pages". */
static void test_contiguous_capacity(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE, FD_BACKEND_CUDA, FD_BACKEND_AUTO};
  for (int i = 0; i < 4; i++) {
    fd_problem p = small_problem(backends[i]);
    p.kv_capacity = 0;
    fd_plan plan;
    fd_error err;
    expect(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, fd_backend_name(backends[i]),
           "kv_capacity: 0 for a contiguous cache", "second dimension");
    p.page_size = 16;
    p.max_pages_per_seq = 4;
    if (backends[i] != FD_BACKEND_CUDA || fd_backend_available(FD_BACKEND_CUDA)) {
      expect(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, "paged, capacity 0", NULL, NULL);
      assert_int_equal(plan.kv_capacity, 64);
    }
  }
}

/* softmax_scale -0.0 is refused (it used to mean the default); +0.0 is the
 * default; -0.5 is a scale. */
static void test_negative_zero_scale(void **state) {
  (void)state;
  const fd_backend backends[] = {FD_BACKEND_CPU, FD_BACKEND_REFERENCE, FD_BACKEND_CUDA};
  for (int i = 0; i < 3; i++) {
    fd_problem p = small_problem(backends[i]);
    p.softmax_scale = -0.0f;
    fd_plan plan;
    fd_error err;
    expect(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT, &err, fd_backend_name(backends[i]),
           "softmax_scale", "-0.0");
  }
  fd_problem p = small_problem(FD_BACKEND_CPU);
  fd_plan plan;
  fd_error err;
  p.softmax_scale = 0.0f;
  expect(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, "+0.0", NULL, NULL);
  assert_true(plan.softmax_scale == 0.125f);
  p.softmax_scale = -0.5f;
  expect(fd_plan_init(&plan, &p, &err), FD_STATUS_OK, &err, "-0.5", NULL, NULL);
  assert_true(plan.softmax_scale == -0.5f);
}

/* ---- Threads -------------------------------------------------------------------- */

static int32_t planned_threads(int32_t num_threads) {
  fd_problem p = small_problem(FD_BACKEND_CPU);
  p.num_threads = num_threads;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("fd_plan_init: %s", err.message);
  return plan.num_threads;
}

/* num_threads 0 takes OMP_NUM_THREADS when it is a positive integer (the
 * first of a list), else the cores; an explicit num_threads wins. */
static void test_omp_num_threads(void **state) {
  (void)state;
  const char *saved = getenv("OMP_NUM_THREADS");
  char *copy = saved ? strdup(saved) : NULL;
  unsetenv("OMP_NUM_THREADS");
  const int32_t cores = planned_threads(0);
  assert_true(cores >= 1);
  char text[32];
  const int32_t other = cores + 1; /* differs from the cores, whatever they are */
  snprintf(text, sizeof text, "%d", other);
  setenv("OMP_NUM_THREADS", text, 1);
  assert_int_equal(planned_threads(0), other);
  assert_int_equal(planned_threads(2), 2); /* explicit wins */
  snprintf(text, sizeof text, " %d,2 ", other);
  setenv("OMP_NUM_THREADS", text, 1);
  assert_int_equal(planned_threads(0), other);
  setenv("OMP_NUM_THREADS", "100000", 1);
  assert_int_equal(planned_threads(0), FD_MAX_THREADS);
  const char *ignored[] = {"", "0", "-3", "abc", "4x", "2.5", ",4", "99999999999999999999"};
  for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++) {
    setenv("OMP_NUM_THREADS", ignored[i], 1);
    if (planned_threads(0) != cores)
      fail_msg("OMP_NUM_THREADS='%s': %d threads, want the cores (%d)", ignored[i], planned_threads(0), cores);
  }
  assert_int_equal(fd_cpu_env_threads(NULL), 0);
  assert_int_equal(fd_cpu_env_threads("7"), 7);
  assert_int_equal(fd_cpu_env_threads("7,3,1"), 7);
  assert_int_equal(fd_cpu_env_threads("\t5"), 5);
  if (copy) {
    setenv("OMP_NUM_THREADS", copy, 1);
    free(copy);
  } else {
    unsetenv("OMP_NUM_THREADS");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mixed_zero_strides),
      cmocka_unit_test(test_broadcast_stride),
      cmocka_unit_test(test_overlaps_refused),
      cmocka_unit_test(test_overlaps_exact_bounds),
      cmocka_unit_test(test_overlaps_cuda_path),
#ifdef FD_TEST_HAVE_CUDA
      cmocka_unit_test(test_overlaps_cuda_device),
#endif
      cmocka_unit_test(test_contiguous_capacity),
      cmocka_unit_test(test_negative_zero_scale),
      cmocka_unit_test(test_omp_num_threads),
  };
  return cmocka_run_group_tests_name("footguns", tests, NULL, NULL);
}
