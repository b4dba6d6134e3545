/*
 * test_nccl_mock.c — flashdecode_nccl.h's merge across ranks, its logic run
 * on the CPU: src/nccl/nccl_merge.c linked against mock_nccl.c (NCCL's calls
 * over host memory, ranks as threads or one thread in a group; the local
 * merge on the CPU backend). What it shows: the plan's layout; that the
 * ranks' merged out equals fd_decode over the whole cache (CPU backend) for
 * 1..4 ranks, pages spread round-robin, ranks with empty shards, a sequence
 * with no key at all, several shards per rank, fp32 / bf16 states and
 * outputs, q_len 3 non-causal, the slot (in-place) and separate-buffer
 * paths, one thread driving every rank in a group; that every rank's result
 * is bitwise the same; check_shapes (agreeing ranks, a rank that disagrees:
 * every rank refuses, naming the field, nothing written; refused while
 * capturing); every local argument check; NCCL failures named
 * (FD_STATUS_BACKEND_ERROR); a non-blocking communicator's ncclInProgress;
 * fd_nccl_wait's timeout and abort. What it cannot show: NCCL itself, the
 * CUDA merge and graph capture (examples/multi_gpu_decode.c on GPUs).
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashdecode_nccl.h"
#include "mock_nccl.h"

enum { HQ = 8, HKV = 2, D = 64, PAGE = 16, MAX_PAGES = 16, MAXB = 4 };

/* ---- Data: a paged cache, and each rank's shard of it --------------------- */

static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

typedef struct setup {
  fd_dtype dtype;        /* q, k, v */
  fd_dtype state_dtype;  /* local out (the gathered states) */
  fd_dtype out_dtype;    /* merged out */
  int batch, q_len, non_causal;
  int32_t kv_len[MAXB];
  int nranks, local;     /* ranks, shards per rank */
  int in_place;          /* fd_run writes into the workspace slot */
  int grouped;           /* one thread drives every rank in a group */
  int check_shapes;
  int bad_rank_batch;    /* check_shapes: this rank (>= 0) says batch - 1 */
} setup;

typedef struct cache {
  int num_pages;
  void *q, *k, *v;
  int32_t block_table[MAXB][MAX_PAGES]; /* whole cache */
  int page_owner[MAXB][MAX_PAGES];      /* shard (rank * local + l) of each page */
} cache;

static size_t esz(fd_dtype d) { return fd_dtype_size(d); }

static void *rand_tensor(fd_dtype d, size_t n) {
  void *p = malloc(n * esz(d));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    const float x = frand();
    if (d == FD_DTYPE_F32)
      ((float *)p)[i] = x;
    else
      ((uint16_t *)p)[i] = to_bf16(x);
  }
  return p;
}

static void cache_init(cache *c, const setup *s) {
  memset(c, 0, sizeof *c);
  c->num_pages = s->batch * MAX_PAGES;
  const int shards = s->nranks * s->local;
  for (int b = 0; b < s->batch; b++)
    for (int i = 0; i < MAX_PAGES; i++) {
      c->block_table[b][i] = (b * 7 + i * s->batch) % c->num_pages; /* scattered pages */
      c->page_owner[b][i] = (i + b) % shards;                        /* round-robin shards */
    }
  c->q = rand_tensor(s->dtype, (size_t)s->batch * s->q_len * HQ * D);
  c->k = rand_tensor(s->dtype, (size_t)c->num_pages * PAGE * HKV * D);
  c->v = rand_tensor(s->dtype, (size_t)c->num_pages * PAGE * HKV * D);
}

static void cache_free(cache *c) {
  free(c->q);
  free(c->k);
  free(c->v);
}

static fd_problem problem_of(const setup *s, fd_dtype out_dtype) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = s->dtype;
  p.out_dtype = out_dtype == s->dtype ? 0 : out_dtype;
  p.batch = s->batch;
  p.q_len = s->q_len;
  p.num_heads_q = HQ;
  p.num_heads_kv = HKV;
  p.head_dim = D;
  p.page_size = PAGE;
  p.max_pages_per_seq = MAX_PAGES;
  p.num_pages = 0;
  p.non_causal = s->non_causal;
  p.num_threads = 1;
  return p;
}

/* fd_decode over shard `shard` (its pages, in order) or, shard < 0, the whole cache. */
static void decode_shard(const setup *s, const cache *c, int shard, fd_dtype out_dtype, void *out,
                         float *lse) {
  int32_t bt[MAXB][MAX_PAGES], kv[MAXB];
  memset(bt, 0, sizeof bt);
  for (int b = 0; b < s->batch; b++) {
    const int pages = (s->kv_len[b] + PAGE - 1) / PAGE;
    int n = 0;
    kv[b] = 0;
    for (int i = 0; i < pages; i++) {
      if (shard >= 0 && c->page_owner[b][i] != shard) continue;
      bt[b][n++] = c->block_table[b][i];
      kv[b] += (i == pages - 1) ? s->kv_len[b] - PAGE * i : PAGE; /* the last page is partial */
    }
  }
  fd_problem p = problem_of(s, out_dtype);
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = c->q;
  t.k_cache = c->k;
  t.v_cache = c->v;
  t.kv_len = kv;
  t.block_table = &bt[0][0];
  t.out = out;
  t.lse = lse;
  fd_error err;
  const fd_status st = fd_decode(&p, &t, NULL, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_decode (shard %d): %s", shard, err.message);
}

/* ---- One rank's part --------------------------------------------------------- */

typedef struct rank_ctx {
  const setup *s;
  const cache *c;
  ncclComm_t comm;
  int rank;
  fd_nccl_plan plan;
  void *ws;
  void *local_out; /* separate buffers (not in place) */
  float *local_lse;
  void *out;
  float *lse;
  fd_status st;
  fd_error err;
} rank_ctx;

static size_t rows_of(const setup *s) { return (size_t)s->batch * s->q_len * HQ; }

static void *xalloc(size_t bytes) {
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  assert_non_null(p);
  memset(p, 0xA5, (bytes + 255) / 256 * 256); /* poison: NaN-ish patterns in every dtype */
  return p;
}

/* Plan, workspace, and the rank's shards decoded into its states. */
static void rank_prepare(rank_ctx *r) {
  const setup *s = r->s;
  fd_nccl_problem np;
  memset(&np, 0, sizeof np);
  np.dtype = s->state_dtype;
  np.out_dtype = s->out_dtype;
  np.batch = s->batch - (s->check_shapes && r->rank == s->bad_rank_batch);
  np.q_len = s->q_len;
  np.num_heads = HQ;
  np.head_dim = D;
  np.num_local_states = s->local;
  np.check_shapes = s->check_shapes;
  r->st = fd_nccl_plan_init(&r->plan, &np, r->comm, &r->err);
  if (r->st != FD_STATUS_OK) fail_msg("fd_nccl_plan_init: %s", r->err.message);
  r->ws = xalloc(r->plan.workspace_size);
  const size_t rows = rows_of(s);
  if (s->in_place) {
    fd_nccl_local_slot(&r->plan, r->ws, &r->local_out, &r->local_lse, NULL);
  } else {
    /* sized from the setup: a check_shapes rank may plan a smaller batch */
    r->local_out = xalloc((size_t)s->local * rows * D * esz(s->state_dtype));
    r->local_lse = xalloc((size_t)s->local * rows * sizeof(float));
  }
  for (int l = 0; l < s->local; l++)
    decode_shard(s, r->c, r->rank * s->local + l, s->state_dtype,
                 (char *)r->local_out + l * rows * D * esz(s->state_dtype), r->local_lse + l * rows);
  r->out = xalloc(rows * D * esz(s->out_dtype));
  r->lse = xalloc(rows * sizeof(float));
}

static void *rank_thread(void *arg) {
  rank_ctx *r = (rank_ctx *)arg;
  r->st = fd_nccl_merge(&r->plan, r->comm, r->local_out, r->local_lse, r->ws, r->plan.workspace_size,
                        r->out, r->lse, NULL, &r->err);
  return NULL;
}

static void rank_free(rank_ctx *r) {
  free(r->ws);
  if (!r->s->in_place) {
    free(r->local_out);
    free(r->local_lse);
  }
  free(r->out);
  free(r->lse);
}

/* Runs the merge on every rank; returns the contexts (caller frees). */
static void run_ranks(const setup *s, const cache *c, ncclComm_t *comms, rank_ctx *ctx) {
  for (int r = 0; r < s->nranks; r++) {
    memset(&ctx[r], 0, sizeof ctx[r]);
    ctx[r].s = s;
    ctx[r].c = c;
    ctx[r].comm = comms[r];
    ctx[r].rank = r;
    rank_prepare(&ctx[r]);
  }
  if (s->grouped) { /* one thread, every rank: gathers in one group, merges after */
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < s->nranks; r++)
      ctx[r].st = fd_nccl_gather(&ctx[r].plan, ctx[r].comm, ctx[r].local_out, ctx[r].local_lse,
                                 ctx[r].ws, ctx[r].plan.workspace_size, NULL, &ctx[r].err);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < s->nranks; r++)
      if (ctx[r].st == FD_STATUS_OK)
        ctx[r].st = fd_nccl_merge_gathered(&ctx[r].plan, ctx[r].ws, ctx[r].plan.workspace_size,
                                           ctx[r].out, ctx[r].lse, NULL, &ctx[r].err);
    return;
  }
  pthread_t th[MOCK_MAX_RANKS];
  for (int r = 0; r < s->nranks; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &ctx[r]), 0);
  for (int r = 0; r < s->nranks; r++) pthread_join(th[r], NULL);
}

static float load(const void *p, fd_dtype d, size_t i) {
  return d == FD_DTYPE_F32 ? ((const float *)p)[i] : from_bf16(((const uint16_t *)p)[i]);
}

/* Every rank's merged out / lse equals fd_decode over the whole cache, and
 * all ranks agree bitwise. */
static void check_against_whole(const setup *s) {
  cache c;
  cache_init(&c, s);
  ncclComm_t comms[MOCK_MAX_RANKS];
  mock_world_create(comms, s->nranks);
  rank_ctx ctx[MOCK_MAX_RANKS];
  run_ranks(s, &c, comms, ctx);

  const size_t rows = rows_of(s), n = rows * D;
  float *want = malloc(n * sizeof(float)), *want_lse = malloc(rows * sizeof(float));
  assert_non_null(want);
  assert_non_null(want_lse);
  decode_shard(s, &c, -1, FD_DTYPE_F32, want, want_lse);
  /* Absolute errors (|V| <= 1): fp32 everywhere, a few float roundings of
   * the sums; a 16-bit out, its rounding (2^-9 relative, doubled); 16-bit
   * states, each state's rounding, up to 2^-9 of its own values (<= 1). */
  const int out16 = s->out_dtype != FD_DTYPE_F32, states16 = s->state_dtype != FD_DTYPE_F32;
  for (int r = 0; r < s->nranks; r++) {
    if (ctx[r].st != FD_STATUS_OK) fail_msg("rank %d: %s", r, ctx[r].err.message);
    double worst = 0; /* error over tolerance */
    for (size_t i = 0; i < n; i++) {
      const double got = load(ctx[r].out, s->out_dtype, i), ref = want[i];
      const double tol = 2e-6 + (out16 ? 0x1p-8 * fabs(ref) : 0) + (states16 ? 0x1p-8 : 0);
      const double e = fabs(got - ref) / tol;
      if (!(e <= worst)) worst = e; /* NaN shows */
    }
    if (!(worst <= 1)) fail_msg("rank %d: out differs from the whole-cache decode by %g x the tolerance", r, worst);
    for (size_t i = 0; i < rows; i++) {
      const float got = ctx[r].lse[i], ref = want_lse[i];
      if (isinf(ref)) {
        if (!(isinf(got) && got < 0)) fail_msg("rank %d: lse[%zu] = %g, want -inf", r, i, got);
      } else if (!(fabs(got - ref) <= 1e-5 * (fabs(ref) + 1))) {
        fail_msg("rank %d: lse[%zu] = %.9g, want %.9g", r, i, got, ref);
      }
    }
    if (r > 0) {
      assert_memory_equal(ctx[r].out, ctx[0].out, n * esz(s->out_dtype));
      assert_memory_equal(ctx[r].lse, ctx[0].lse, rows * sizeof(float));
    }
  }
  assert_int_equal(mock.mismatched, 0);
  for (int r = 0; r < s->nranks; r++) rank_free(&ctx[r]);
  free(want);
  free(want_lse);
  mock_world_destroy(comms, s->nranks);
  cache_free(&c);
}

static setup base_setup(int nranks) {
  setup s;
  memset(&s, 0, sizeof s);
  s.dtype = FD_DTYPE_F32;
  s.state_dtype = FD_DTYPE_F32;
  s.out_dtype = FD_DTYPE_F32;
  s.batch = 3;
  s.q_len = 1;
  s.kv_len[0] = 200; /* 13 pages: every rank some */
  s.kv_len[1] = 37;  /* 3 pages: with 4 ranks one rank has none */
  s.kv_len[2] = 0;   /* no key at all: out 0, lse -inf on every rank */
  s.nranks = nranks;
  s.local = 1;
  s.bad_rank_batch = -1;
  return s;
}

/* ---- Tests ----------------------------------------------------------------------- */

static void test_plan_layout(void **state) {
  (void)state;
  ncclComm_t comms[3];
  mock_world_create(comms, 3);
  fd_nccl_problem np;
  memset(&np, 0, sizeof np);
  np.dtype = FD_DTYPE_BF16;
  np.batch = 2;
  np.num_heads = 5;
  np.head_dim = 24;
  np.num_local_states = 2;
  fd_nccl_plan plan;
  fd_error err;
  assert_int_equal(fd_nccl_plan_init(&plan, &np, comms[1], &err), FD_STATUS_OK);
  assert_int_equal(plan.nranks, 3);
  assert_int_equal(plan.rank, 1);
  assert_int_equal(plan.device, 1);
  assert_int_equal(plan.num_states, 6);
  assert_int_equal(plan.problem.q_len, 1);
  assert_int_equal(plan.problem.out_dtype, FD_DTYPE_BF16);
  assert_int_equal(plan.local_out_bytes, 2 * 2 * 5 * 24 * 2);
  assert_int_equal(plan.local_lse_bytes, 2 * 2 * 5 * 4);
  assert_int_equal(plan.ws_states_out, 0);
  assert_true(plan.ws_states_lse >= 3 * plan.local_out_bytes && plan.ws_states_lse % 256 == 0);
  assert_int_equal(plan.workspace_size, (plan.ws_states_lse + 3 * plan.local_lse_bytes + 255) / 256 * 256);
  char ws[1]; /* only its address is used */
  void *o;
  float *l;
  assert_int_equal(fd_nccl_local_slot(&plan, ws, &o, &l, &err), FD_STATUS_OK);
  assert_ptr_equal(o, ws + plan.local_out_bytes);
  assert_ptr_equal((char *)l, ws + plan.ws_states_lse + plan.local_lse_bytes);
  np.check_shapes = 1;
  fd_nccl_plan p2;
  assert_int_equal(fd_nccl_plan_init(&p2, &np, comms[1], &err), FD_STATUS_OK);
  assert_int_equal(p2.workspace_size, plan.workspace_size + 3 * 128);
  mock_world_destroy(comms, 3);
}

static void expect_plan_error(fd_nccl_problem np, ncclComm_t comm, fd_status want, const char *text) {
  fd_nccl_plan plan;
  fd_error err;
  const fd_status st = fd_nccl_plan_init(&plan, &np, comm, &err);
  if (st != want || !strstr(err.message, text))
    fail_msg("plan: status %d (%s), want %d with \"%s\"", st, err.message, want, text);
  assert_int_equal(plan.magic, 0);
}

static void test_plan_errors(void **state) {
  (void)state;
  ncclComm_t comms[2];
  mock_world_create(comms, 2);
  fd_nccl_problem ok;
  memset(&ok, 0, sizeof ok);
  ok.dtype = FD_DTYPE_F32;
  ok.batch = 1;
  ok.num_heads = 1;
  ok.head_dim = 8;
  fd_nccl_problem p;
  p = ok; p.dtype = 0; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "dtype");
  p = ok; p.out_dtype = 9; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "out_dtype");
  p = ok; p.batch = 0; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "batch");
  p = ok; p.q_len = -1; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "q_len");
  p = ok; p.num_heads = 0; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "num_heads");
  p = ok; p.head_dim = 257; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "head_dim");
  p = ok; p.num_local_states = -1; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "num_local_states");
  p = ok; p.num_local_states = 40000; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "FD_MAX_MERGE_STATES");
  p = ok; p.check_shapes = 2; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "check_shapes");
  p = ok; p.batch = 1 << 30; p.num_heads = 1 << 20; expect_plan_error(p, comms[0], FD_STATUS_INVALID_ARGUMENT, "addressed");
  expect_plan_error(ok, NULL, FD_STATUS_INVALID_ARGUMENT, "comm: NULL");
  mock.fail_comm_count = ncclUnhandledCudaError;
  expect_plan_error(ok, comms[0], FD_STATUS_BACKEND_ERROR, "ncclCommCount: unhandled cuda error");
  mock.fail_comm_count = ncclSuccess;
  fd_error err;
  fd_nccl_plan plan;
  assert_int_equal(fd_nccl_plan_init(NULL, &ok, comms[0], &err), FD_STATUS_INVALID_ARGUMENT);
  assert_int_equal(fd_nccl_plan_init(&plan, NULL, comms[0], &err), FD_STATUS_INVALID_ARGUMENT);
  mock_world_destroy(comms, 2);
}

static void test_merge_ranks(void **state) {
  (void)state;
  for (int n = 1; n <= 4; n++) {
    for (int in_place = 0; in_place <= 1; in_place++) {
      setup s = base_setup(n);
      s.in_place = in_place;
      check_against_whole(&s);
    }
  }
}

static void test_merge_dtypes(void **state) {
  (void)state;
  setup s = base_setup(3);
  s.dtype = FD_DTYPE_BF16; /* bf16 cache, fp32 states, bf16 out: the recommended setup */
  s.out_dtype = FD_DTYPE_BF16;
  check_against_whole(&s);
  s.state_dtype = FD_DTYPE_BF16; /* bf16 states: half the traffic, rounded */
  check_against_whole(&s);
  s.out_dtype = FD_DTYPE_F32;
  s.in_place = 1;
  check_against_whole(&s);
}

static void test_merge_local_states(void **state) {
  (void)state;
  setup s = base_setup(1); /* one rank, 4 shards: the one-GPU case of the example */
  s.local = 4;
  s.in_place = 1;
  check_against_whole(&s);
  s = base_setup(2); /* 2 ranks x 3 shards */
  s.local = 3;
  check_against_whole(&s);
}

static void test_merge_qlen_non_causal(void **state) {
  (void)state;
  setup s = base_setup(3);
  s.q_len = 3;
  s.non_causal = 1;
  s.batch = 2;
  check_against_whole(&s);
}

static void test_merge_grouped(void **state) {
  (void)state;
  for (int n = 1; n <= 4; n += 3) {
    setup s = base_setup(n);
    s.grouped = 1;
    s.in_place = n > 1;
    check_against_whole(&s);
  }
}

static void test_check_shapes(void **state) {
  (void)state;
  setup s = base_setup(3);
  s.check_shapes = 1;
  check_against_whole(&s); /* agreeing ranks: the check passes, the merge is right */

  s.bad_rank_batch = 2; /* rank 2 says batch 2, the others 3: all refuse, nothing written */
  cache c;
  cache_init(&c, &s);
  ncclComm_t comms[MOCK_MAX_RANKS];
  mock_world_create(comms, s.nranks);
  rank_ctx ctx[MOCK_MAX_RANKS];
  run_ranks(&s, &c, comms, ctx);
  for (int r = 0; r < s.nranks; r++) {
    if (ctx[r].st != FD_STATUS_INVALID_ARGUMENT || !strstr(ctx[r].err.message, "check_shapes: rank") ||
        !strstr(ctx[r].err.message, "batch"))
      fail_msg("rank %d: status %d, %s", r, ctx[r].st, ctx[r].err.message);
    const unsigned char *o = ctx[r].out;
    for (size_t i = 0; i < rows_of(&s) * D * 4; i++)
      if (o[i] != 0xA5) fail_msg("rank %d: out written after a failed check", r);
  }
  assert_int_equal(mock.allgathers, 3); /* the descriptions only */
  for (int r = 0; r < s.nranks; r++) rank_free(&ctx[r]);
  mock_world_destroy(comms, s.nranks);

  /* One thread driving every rank in a group: the check cannot run (its
   * gather waits for the group's end) and says so, never a stale pass. */
  s.grouped = 1;
  s.bad_rank_batch = -1;
  mock_world_create(comms, s.nranks);
  run_ranks(&s, &c, comms, ctx);
  for (int r = 0; r < s.nranks; r++) {
    if (ctx[r].st != FD_STATUS_INVALID_ARGUMENT || !strstr(ctx[r].err.message, "sent no description"))
      fail_msg("grouped rank %d: status %d, %s", r, ctx[r].st, ctx[r].err.message);
    rank_free(&ctx[r]);
  }
  mock_world_destroy(comms, s.nranks);
  s.grouped = 0;

  /* While capturing: refused before any communication. */
  s.bad_rank_batch = -1;
  s.nranks = 1;
  mock_world_create(comms, 1);
  memset(&ctx[0], 0, sizeof ctx[0]);
  ctx[0].s = &s;
  ctx[0].c = &c;
  ctx[0].comm = comms[0];
  rank_prepare(&ctx[0]);
  mock.capturing = 1;
  rank_thread(&ctx[0]);
  assert_int_equal(ctx[0].st, FD_STATUS_UNSUPPORTED);
  assert_non_null(strstr(ctx[0].err.message, "captured"));
  assert_int_equal(mock.allgathers, 0);
  rank_free(&ctx[0]);
  mock_world_destroy(comms, 1);
  cache_free(&c);
}

/* One rank, fp32 states of shape [1, 1, 2, 8], for the argument checks. */
typedef struct small {
  ncclComm_t comms[2];
  fd_nccl_plan plan;
  void *ws, *local_out, *out;
  float *local_lse, *lse;
} small;

static void small_init(small *m) {
  mock_world_create(m->comms, 1);
  fd_nccl_problem np;
  memset(&np, 0, sizeof np);
  np.dtype = FD_DTYPE_F32;
  np.batch = 1;
  np.num_heads = 2;
  np.head_dim = 8;
  fd_error err;
  assert_int_equal(fd_nccl_plan_init(&m->plan, &np, m->comms[0], &err), FD_STATUS_OK);
  m->ws = xalloc(m->plan.workspace_size + 256);
  m->local_out = xalloc(64 * 4);
  m->local_lse = xalloc(64);
  m->out = xalloc(64 * 4);
  m->lse = xalloc(64);
  for (int i = 0; i < 16; i++) ((float *)m->local_out)[i] = (float)i;
  for (int i = 0; i < 2; i++) m->local_lse[i] = 0.5f * (float)i;
}

static void small_free(small *m) {
  free(m->ws);
  free(m->local_out);
  free(m->local_lse);
  free(m->out);
  free(m->lse);
  mock_world_destroy(m->comms, 1);
}

static void expect_status(fd_status st, const fd_error *err, fd_status want, const char *text) {
  if (st != want || (text && !strstr(err->message, text)))
    fail_msg("status %d (%s), want %d with \"%s\"", st, err->message, want, text ? text : "");
}

static void test_call_errors(void **state) {
  (void)state;
  small m;
  small_init(&m);
  fd_error err;
  const size_t W = m.plan.workspace_size;
  fd_nccl_plan bad = m.plan;
  bad.magic = 0;
  expect_status(fd_nccl_merge(&bad, m.comms[0], m.local_out, m.local_lse, m.ws, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "fd_nccl_plan_init");
  expect_status(fd_nccl_merge(NULL, m.comms[0], m.local_out, m.local_lse, m.ws, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  expect_status(fd_nccl_merge(&m.plan, NULL, m.local_out, m.local_lse, m.ws, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "comm: NULL");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], NULL, m.local_lse, m.ws, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "local_out: NULL");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, NULL, m.ws, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "local_lse: NULL");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], (char *)m.local_out + 2, m.local_lse, m.ws, W, m.out,
                              m.lse, NULL, &err), &err, FD_STATUS_INVALID_ARGUMENT, "aligned");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, NULL, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_WORKSPACE_TOO_SMALL, "workspace: NULL");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W - 1, m.out, m.lse, NULL,
                              &err), &err, FD_STATUS_WORKSPACE_TOO_SMALL, "workspace_size");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, (char *)m.ws + 8, W, m.out, m.lse,
                              NULL, &err), &err, FD_STATUS_INVALID_ARGUMENT, "16-byte");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W, NULL, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "out: NULL");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W, (char *)m.out + 1, m.lse,
                              NULL, &err), &err, FD_STATUS_INVALID_ARGUMENT, "out: ");
  /* local buffers inside the workspace but not the slot; outputs inside it */
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], (char *)m.ws + 16, m.local_lse, m.ws, W, m.out, m.lse,
                              NULL, &err), &err, FD_STATUS_INVALID_ARGUMENT, "local_out: overlaps");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, (float *)m.ws, m.ws, W, m.out, m.lse, NULL,
                              &err), &err, FD_STATUS_INVALID_ARGUMENT, "local_lse: overlaps");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W, m.ws, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "out: its bytes overlap the workspace");
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W, m.out,
                              (float *)((char *)m.ws + m.plan.ws_states_lse), NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "lse: its bytes overlap the workspace");
  assert_int_equal(mock.allgathers, 0); /* all refused before communicating */

  /* a communicator that is not the plan's */
  ncclComm_t other[2];
  mock_world_create(other, 2);
  expect_status(fd_nccl_merge(&m.plan, other[1], m.local_out, m.local_lse, m.ws, W, m.out, m.lse, NULL, &err),
                &err, FD_STATUS_INVALID_ARGUMENT, "the plan was made for rank 0 of 1");
  mock_world_destroy(other, 2);

  /* out may be the local buffer itself (outside the workspace), lse NULL */
  expect_status(fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W, m.local_out, NULL, NULL,
                              &err), &err, FD_STATUS_OK, NULL);
  for (int i = 0; i < 16; i++) assert_true(((float *)m.local_out)[i] == (float)i); /* one state: itself */
  small_free(&m);
}

static void test_nccl_failures(void **state) {
  (void)state;
  small m;
  small_init(&m);
  fd_error err;
  const size_t W = m.plan.workspace_size;
#define MERGE() fd_nccl_merge(&m.plan, m.comms[0], m.local_out, m.local_lse, m.ws, W, m.out, m.lse, NULL, &err)
  mock.fail_allgather = ncclUnhandledCudaError;
  expect_status(MERGE(), &err, FD_STATUS_BACKEND_ERROR,
                "ncclAllGather (states out): unhandled cuda error (mock: injected");
  mock.fail_allgather = ncclRemoteError;
  mock.fail_allgather_index = 1;
  expect_status(MERGE(), &err, FD_STATUS_BACKEND_ERROR, "ncclAllGather (states lse): remote process");
  mock.fail_group_end = ncclSystemError;
  expect_status(MERGE(), &err, FD_STATUS_BACKEND_ERROR, "ncclGroupEnd (states gather): unhandled system error");
  /* non-blocking communicator: in progress for a while, then done */
  mock.in_progress_polls = 5;
  expect_status(MERGE(), &err, FD_STATUS_OK, NULL);
  assert_true(((float *)m.out)[3] == 3.0f);
  /* ... or failing while in progress */
  mock.async_error = ncclRemoteError;
  expect_status(MERGE(), &err, FD_STATUS_BACKEND_ERROR, "ncclGroupEnd (states gather): remote process");
  mock.in_progress_polls = 0;
  mock.async_error = ncclSuccess;
  expect_status(MERGE(), &err, FD_STATUS_OK, NULL);
#undef MERGE
  small_free(&m);
}

static void test_wait(void **state) {
  (void)state;
  ncclComm_t comms[1];
  mock_world_create(comms, 1);
  fd_error err;
  expect_status(fd_nccl_wait(comms[0], NULL, 1.0, 1, &err), &err, FD_STATUS_OK, NULL);
  expect_status(fd_nccl_wait(NULL, NULL, 1.0, 1, &err), &err, FD_STATUS_INVALID_ARGUMENT, "comm: NULL");
  mock.stream_busy = 1;
  expect_status(fd_nccl_wait(comms[0], NULL, 0.02, 0, &err), &err, FD_STATUS_BACKEND_ERROR, "left as is");
  assert_int_equal(mock.aborts, 0);
  expect_status(fd_nccl_wait(comms[0], NULL, 0.02, 1, &err), &err, FD_STATUS_BACKEND_ERROR,
                "ncclCommAbort called");
  assert_int_equal(mock.aborts, 1);
  mock.async_error = ncclRemoteError;
  expect_status(fd_nccl_wait(comms[0], NULL, 0, 1, &err), &err, FD_STATUS_BACKEND_ERROR,
                "asynchronous error (ncclCommGetAsyncError): remote process");
  assert_int_equal(mock.aborts, 1);
  mock_world_destroy(comms, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_layout),       cmocka_unit_test(test_plan_errors),
      cmocka_unit_test(test_merge_ranks),       cmocka_unit_test(test_merge_dtypes),
      cmocka_unit_test(test_merge_local_states), cmocka_unit_test(test_merge_qlen_non_causal),
      cmocka_unit_test(test_merge_grouped),     cmocka_unit_test(test_check_shapes),
      cmocka_unit_test(test_call_errors),       cmocka_unit_test(test_nccl_failures),
      cmocka_unit_test(test_wait),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
