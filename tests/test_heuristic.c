/*
 * test_heuristic.c — fd_num_splits_heuristic as a pure function over
 * simulated machines (8, 78, 108, 132 multiprocessors), and the split count
 * and workspace layout fd_plan_init derives from it (CUDA plans with a
 * simulated sm_count, on the GPU when one is present, else for an H100's
 * facts through fd_plan_init_fit; CPU plans, whose slots are num_threads),
 * and the kernel each plan records (fd_plan.kernel) for simulated H100, A100
 * and sm_86 budgets: no GPU needed.
 *
 * The rule (flashdecode.h, plan.c), from which the worked values below are
 * derived by hand: slots = sm_count * blocks_per_sm; 1 when max_chunks <= 1
 * or when work_items >= 0.8 * slots (a full machine); else, over split counts
 * s = 1 .. min(max_chunks, 128), with per(s) = ceil(chunks / s) chunks a
 * split and active(s) = ceil(chunks / per(s)) splits that hold keys,
 * waves = work_items * active(s) / slots and efficiency(s) = work_items *
 * chunks / (ceil(waves) * slots * per(s)) (= waves / ceil(waves) when s
 * divides the chunks); the answer is the smallest s whose efficiency is
 * >= 0.95 * the best (a count whose cut equals a smaller count's is never
 * the first to reach it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "flashdecode.h"
#include "internal.h" /* FD_MMA_MAX_SPLIT_KEYS */

/* With chunks >= 128^2 every s <= 128 cuts exactly (active(s) == s). */
#define MANY_CHUNKS 16384
/* Beyond this many chunks the cut's rounding no longer moves the answer. */
#define HUGE_CHUNKS ((int64_t)1 << 30)

static const int32_t SMS[] = {8, 78, 108, 132};

static void test_worked_values(void **state) {
  (void)state;
  /* w=1, 8 SMs x 2 = 16 slots: eff(s) = s/16 below one wave; best 1.0 at
   * s=16; 15/16 = 0.9375 < 0.95 -> 16. */
  assert_int_equal(fd_num_splits_heuristic(1, MANY_CHUNKS, 8, 2), 16);
  /* w=1, 264 slots: at most 128 splits, best at s=128 (per 128):
   * 16384 / (264 * 128) = 0.485, 0.95 of it 0.4607; s=122 cuts 135 chunks a
   * split, 16384 / (264 * 135) = 0.4597 (whole splits only: 122/264 = 0.462
   * would pass); s=123 cuts 134: 0.4631 -> 123. */
  assert_int_equal(fd_num_splits_heuristic(1, MANY_CHUNKS, 132, 2), 123);
  /* The H200 case that made the rounding count (fp32, 8 kv heads, 128k keys,
   * 132 SMs x 4): best 0.9697 (s=64: 32 chunks a split); s=61 and 62 cut 34
   * chunks: 16384 / (528 * 34) = 0.913 < 0.921; s=63 cuts 33: 0.940 -> 63
   * (whole splits only gave 61, measured 6.5 % slower than 64). */
  assert_int_equal(fd_num_splits_heuristic(8, 2048, 132, 4), 63);
  /* w=4, 216 slots: waves = s/54, best 1.0 at s=54; 52/54 = 0.963 -> 52
   * (51/54 = 0.944). */
  assert_int_equal(fd_num_splits_heuristic(4, MANY_CHUNKS, 108, 2), 52);
  /* w=32, 264 slots: waves = 32s/264; best 1.0 at s=33 (4 full waves);
   * s=7 gives 224/264 = 0.848, s=8 gives 256/264 = 0.970 -> 8. */
  assert_int_equal(fd_num_splits_heuristic(32, MANY_CHUNKS, 132, 2), 8);
  /* w=16, 156 slots: best 1.0 at s=39; s=9 gives 144/156 = 0.923, s=10..18
   * spill into a second wave (<= 0.923), s=19 gives 304/312 = 0.974 -> 19. */
  assert_int_equal(fd_num_splits_heuristic(16, MANY_CHUNKS, 78, 2), 19);
  /* Full machine: 212 * 10 >= 264 * 8 -> 1. One less is not full: s=1..4
   * all give 0.799, s=5 gives 1055/1056 = 0.999 -> 5. */
  assert_int_equal(fd_num_splits_heuristic(212, MANY_CHUNKS, 132, 2), 1);
  assert_int_equal(fd_num_splits_heuristic(211, MANY_CHUNKS, 132, 2), 5);
  /* 10 chunks, w=1, 16 slots: exact cuts are s = 1..5 and 10 (6..9 cut
   * like 5); best 10/16; 0.95 of it needs >= 9.5 active splits -> 10. */
  assert_int_equal(fd_num_splits_heuristic(1, 10, 8, 2), 10);
  /* One chunk or none: nothing to split. */
  assert_int_equal(fd_num_splits_heuristic(1, 1, 132, 2), 1);
  assert_int_equal(fd_num_splits_heuristic(1, 0, 132, 2), 1);
}

static int32_t exact_cut(int64_t chunks, int32_t s) {
  int64_t per = (chunks + s - 1) / s;
  return (int32_t)((chunks + per - 1) / per) == s;
}

static void test_bounds_and_properties(void **state) {
  (void)state;
  const int64_t chunk_counts[] = {0, 1, 2, 3, 7, 10, 63, 64, 65, 100, 128, 129, 500, 2049, MANY_CHUNKS,
                                  (int64_t)1 << 40};
  const int32_t bps_values[] = {1, 2, 4};
  for (size_t ci = 0; ci < sizeof chunk_counts / sizeof *chunk_counts; ci++)
    for (size_t si = 0; si < sizeof SMS / sizeof *SMS; si++)
      for (size_t bi = 0; bi < sizeof bps_values / sizeof *bps_values; bi++)
        for (int64_t w = 1; w <= 1200; w += (w < 40 ? 1 : 37)) {
          const int64_t c = chunk_counts[ci];
          const int32_t sm = SMS[si], bps = bps_values[bi];
          const int32_t s = fd_num_splits_heuristic(w, c, sm, bps);
          int64_t hi = c < FD_MAX_SPLITS ? c : FD_MAX_SPLITS;
          if (hi < 1) hi = 1;
          if (s < 1 || s > hi)
            fail_msg("h(w=%lld, chunks=%lld, sm=%d, bps=%d) = %d outside [1, %lld]", (long long)w,
                     (long long)c, sm, bps, s, (long long)hi);
          /* A full machine is never split. */
          if (w >= (int64_t)sm * bps && s != 1)
            fail_msg("h(w=%lld >= slots %d) = %d, want 1", (long long)w, sm * bps, s);
          /* Only the slot count matters. */
          if (fd_num_splits_heuristic(w, c, sm * bps, 1) != s)
            fail_msg("h(w=%lld, chunks=%lld): sm=%d x bps=%d differs from sm=%d x 1", (long long)w,
                     (long long)c, sm, bps, sm * bps);
          /* Every chosen split holds keys. */
          if (c >= 1 && !exact_cut(c, s))
            fail_msg("h(w=%lld, chunks=%lld, sm=%d, bps=%d) = %d leaves empty splits", (long long)w,
                     (long long)c, sm, bps, s);
          /* Beyond 2^30 chunks the answer no longer depends on the count. */
          if (c > HUGE_CHUNKS && fd_num_splits_heuristic(w, HUGE_CHUNKS, sm, bps) != s)
            fail_msg("h(w=%lld) differs between %lld and %lld chunks", (long long)w, (long long)c,
                     (long long)HUGE_CHUNKS);
        }
}

/* One work item on a bigger machine never gets fewer splits. */
static void test_monotonic_in_sm_count(void **state) {
  (void)state;
  const int64_t chunk_counts[] = {2, 10, 65, 128, 1000, MANY_CHUNKS};
  for (size_t ci = 0; ci < sizeof chunk_counts / sizeof *chunk_counts; ci++) {
    int32_t prev = 1;
    for (int32_t sm = 1; sm <= 200; sm++) {
      int32_t s = fd_num_splits_heuristic(1, chunk_counts[ci], sm, 2);
      if (s < prev)
        fail_msg("chunks=%lld: %d splits at sm=%d, %d at sm=%d", (long long)chunk_counts[ci], s, sm, prev, sm - 1);
      prev = s;
    }
  }
  /* More work on the same machine: once full, it stays at 1. */
  for (size_t si = 0; si < sizeof SMS / sizeof *SMS; si++) {
    int seen_one = 0;
    for (int64_t w = 1; w <= 4 * SMS[si]; w++) {
      int32_t s = fd_num_splits_heuristic(w, MANY_CHUNKS, SMS[si], 2);
      if (seen_one && s != 1) fail_msg("sm=%d: w=%lld gives %d after a full machine", SMS[si], (long long)w, s);
      if (w >= 2 * SMS[si]) seen_one = 1;
    }
  }
}

static void test_degenerate_inputs(void **state) {
  (void)state;
  const int64_t ws[] = {-5, 0, 1};
  const int32_t sms[] = {-1, 0, 1};
  for (size_t i = 0; i < 3; i++)
    for (size_t j = 0; j < 3; j++)
      for (int32_t bps = -1; bps <= 1; bps++) {
        int32_t s = fd_num_splits_heuristic(ws[i], 1000, sms[j], bps);
        if (s < 1 || s > 1000) fail_msg("h(w=%lld, sm=%d, bps=%d) = %d", (long long)ws[i], sms[j], bps, s);
      }
  assert_int_equal(fd_num_splits_heuristic(1, -3, 132, 2), 1);
}

/* ---- fd_plan_init ---------------------------------------------------------------------- */

static fd_problem problem(fd_backend backend, int32_t batch, int32_t hkv, int32_t kv_capacity) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = backend;
  p.dtype = FD_DTYPE_BF16;
  p.batch = batch;
  p.num_heads_q = hkv * 4;
  p.num_heads_kv = hkv;
  p.head_dim = 128;
  p.kv_capacity = kv_capacity;
  return p;
}

static fd_plan plan_ok(const fd_problem *p) {
  fd_plan plan;
  fd_error err;
  fd_status st = fd_plan_init(&plan, p, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_plan_init: %s: %s", fd_status_name(st), err.message);
  return plan;
}

static void check_workspace_layout(const fd_plan *plan) {
  const fd_problem *p = &plan->problem;
  if (plan->num_splits == 1) {
    assert_int_equal(plan->workspace_size, 0);
    return;
  }
  const size_t rows = (size_t)p->batch * p->num_heads_q * p->q_len;
  const size_t o_end = plan->ws_partial_o + rows * plan->num_splits * p->head_dim * sizeof(float);
  const size_t ml_end = plan->ws_partial_ml + rows * plan->num_splits * 2 * sizeof(float);
  const size_t c_end = plan->ws_counters + (size_t)p->batch * p->num_heads_kv * sizeof(uint32_t);
  assert_true(o_end <= plan->ws_partial_ml);
  assert_true(ml_end <= plan->ws_counters);
  assert_true(c_end <= plan->workspace_size);
  assert_int_equal(plan->ws_partial_o % 16, 0);
  assert_int_equal(plan->ws_partial_ml % 16, 0);
  assert_int_equal(plan->ws_counters % 16, 0);
}

/* CPU: the slots are the worker threads, one block each. */
static void test_plan_cpu(void **state) {
  (void)state;
  const int32_t threads[] = {1, 2, 8, 16, 64};
  const int32_t caps[] = {1, 64, 65, 4099, 131072}; /* 0: refused for a contiguous cache */
  const int32_t batches[] = {1, 3}, hkvs[] = {1, 8};
  for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++)
    for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++)
      for (size_t bi = 0; bi < 2; bi++)
        for (size_t hi = 0; hi < 2; hi++) {
          fd_problem p = problem(FD_BACKEND_CPU, batches[bi], hkvs[hi], caps[ci]);
          p.num_threads = threads[ti];
          fd_plan plan = plan_ok(&p);
          const int64_t chunks = ((int64_t)caps[ci] + plan.chunk_len - 1) / plan.chunk_len;
          /* The CPU's slots (plan.c, cpu_slots): half the threads from 8 on,
           * at most one per 256 KB of K+V (bf16, head_dim 128) plus one. */
          int64_t slots = threads[ti] >= 8 ? threads[ti] / 2 : threads[ti];
          const int64_t busy =
              (int64_t)2 * p.batch * caps[ci] * p.num_heads_kv * 128 * 2 / (256 * 1024) + 1;
          if (busy < slots) slots = busy;
          const int32_t want = fd_num_splits_heuristic((int64_t)p.batch, chunks, (int32_t)slots, 1);
          if (plan.num_splits != want)
            fail_msg("cpu t=%d b=%d hkv=%d cap=%d: plan has %d splits, heuristic says %d", threads[ti], p.batch,
                     p.num_heads_kv, caps[ci], plan.num_splits, want);
          assert_int_equal(plan.sm_count, threads[ti]);
          assert_int_equal(plan.num_threads, threads[ti]);
          assert_int_equal(plan.backend, FD_BACKEND_CPU);
          check_workspace_layout(&plan);
        }
}

static void test_plan_explicit_and_hint(void **state) {
  (void)state;
  fd_problem p = problem(FD_BACKEND_CPU, 1, 1, 131072);
  p.num_threads = 16;
  /* Explicit counts are kept, clamped to the chunks and FD_MAX_SPLITS. */
  p.num_splits = 7;
  assert_int_equal(plan_ok(&p).num_splits, 7);
  p.num_splits = 1;
  fd_plan one = plan_ok(&p);
  assert_int_equal(one.num_splits, 1);
  assert_int_equal(one.workspace_size, 0);
  p.num_splits = 5000;
  fd_plan many = plan_ok(&p);
  assert_int_equal(many.num_splits, FD_MAX_SPLITS);
  check_workspace_layout(&many);
  p.kv_capacity = 65; /* two chunks */
  p.num_splits = 128;
  assert_int_equal(plan_ok(&p).num_splits, 2);
  p.kv_capacity = 1;
  assert_int_equal(plan_ok(&p).num_splits, 1);

  /* A kv_len hint sizes the automatic count from the real lengths. */
  p = problem(FD_BACKEND_CPU, 2, 1, 131072);
  p.num_threads = 16;
  const int32_t short_hint[2] = {64, 10};
  p.kv_len_hint = short_hint;
  fd_plan hinted = plan_ok(&p);
  assert_int_equal(hinted.num_splits, 1);
  assert_null(hinted.problem.kv_len_hint);
  const int32_t long_hint[2] = {5, 131072};
  p.kv_len_hint = long_hint;
  fd_plan full = plan_ok(&p);
  p.kv_len_hint = NULL;
  /* 16 threads plan for 8 (sequence, split) items (two threads each).
   * Ragged (131072 against a mean of 65538): the long sequence is cut so each
   * split holds about half an even share: ceil(2 * 131072 / (131077 / 8))
   * = 16, but never into more splits than it would get alone (8 on 8
   * slots); either is more than the capacity-sized wave count (4 of 8). */
  assert_int_equal(plan_ok(&p).num_splits, 4);
  assert_int_equal(full.num_splits, 8);
  /* One thread: nothing to gain from splitting a ragged batch. */
  p.num_threads = 1;
  p.kv_len_hint = long_hint;
  assert_int_equal(plan_ok(&p).num_splits, 1);
  p.kv_len_hint = NULL;
  p.num_threads = 16;

  /* The reference backend never splits. */
  p.backend = FD_BACKEND_REFERENCE;
  p.num_splits = 9;
  fd_plan ref = plan_ok(&p);
  assert_int_equal(ref.num_splits, 1);
  assert_int_equal(ref.workspace_size, 0);
}

/* The least split count of a CUDA 16-bit plan of 2^20 keys (plan.c). */
#define MMA_LEAST_SPLITS ((1 << 20) / FD_MMA_MAX_SPLIT_KEYS)

static fd_plan plan_cuda(const fd_problem *p);

/* CUDA plans for simulated GPUs (sm_count set): on the GPU when there is
 * one, else for an H100's budget (fd_plan_init_fit). */
static void test_plan_cuda_simulated(void **state) {
  (void)state;
  int32_t prev = 1;
  for (size_t si = 0; si < sizeof SMS / sizeof *SMS; si++) {
    fd_problem p = problem(FD_BACKEND_CUDA, 1, 1, 1 << 20);
    p.sm_count = SMS[si];
    fd_plan plan = plan_cuda(&p);
    assert_int_equal(plan.sm_count, SMS[si]);
    assert_int_equal(plan.backend, FD_BACKEND_CUDA);
    /* The plan uses the public heuristic with some resident-blocks count,
     * raised to the 16-bit tensor-core bound: no split over
     * FD_MMA_MAX_SPLIT_KEYS keys (internal.h). */
    int found = 0;
    for (int32_t bps = 1; bps <= 8 && !found; bps++) {
      int32_t want = fd_num_splits_heuristic(1, (1 << 20) / plan.chunk_len, SMS[si], bps);
      if (want < MMA_LEAST_SPLITS) want = MMA_LEAST_SPLITS;
      found = plan.num_splits == want;
    }
    if (!found) fail_msg("sm=%d: %d splits is no blocks_per_sm's heuristic value", SMS[si], plan.num_splits);
    if (plan.num_splits < prev) fail_msg("sm=%d: %d splits, fewer than on a smaller GPU (%d)", SMS[si], plan.num_splits, prev);
    prev = plan.num_splits;
    assert_true(plan.num_splits > 1);
    check_workspace_layout(&plan);

    /* A ragged batch of one long and one tiny sequence splits the long one as
     * if it were alone (and the tiny one the same way). */
    fd_problem alone = problem(FD_BACKEND_CUDA, 1, 8, 16384);
    alone.sm_count = SMS[si];
    fd_problem pair = problem(FD_BACKEND_CUDA, 2, 8, 16384);
    pair.sm_count = SMS[si];
    const int32_t pair_hint[2] = {16384, 1};
    pair.kv_len_hint = pair_hint;
    if (plan_cuda(&pair).num_splits > plan_cuda(&alone).num_splits)
      fail_msg("sm=%d: ragged pair %d splits, more than the long sequence alone (%d)", SMS[si],
               plan_cuda(&pair).num_splits, plan_cuda(&alone).num_splits);

    /* A full machine: 8 kv heads x batch 64 >= every plausible slot count.
     * The heuristic says 1; 1M keys of bf16 still take the tensor-core
     * bound's splits, and FD_MMA_MAX_SPLIT_KEYS keys take 1. */
    fd_problem full = problem(FD_BACKEND_CUDA, 64, 8, 1 << 20);
    full.sm_count = SMS[si];
    assert_int_equal(plan_cuda(&full).num_splits, MMA_LEAST_SPLITS);
    full.kv_capacity = FD_MMA_MAX_SPLIT_KEYS;
    assert_int_equal(plan_cuda(&full).num_splits, 1);
  }
}

/* ---- The recorded kernel (fd_plan.kernel) on simulated GPUs ------------------------------ */

/* Budgets the CUDA runtime reports (test_gpu_select.c has the same). */
#define KB 1024
static const fd_gpu_budget H100 = {9, 0, 132, 227 * KB, 228 * KB, KB, 90, 1}; /* H100 / H200 */
static const fd_gpu_budget A100 = {8, 0, 108, 163 * KB, 164 * KB, KB, 80, 0};
static const fd_gpu_budget SM86 = {8, 6, 84, 99 * KB, 100 * KB, KB, 80, 0};
/* compute_80 PTX JIT-compiled on an H100: the budget holds the 8-warp block,
 * the code has none */
static const fd_gpu_budget H100_PTX80 = {9, 0, 132, 227 * KB, 228 * KB, KB, 80, 0};

/* The facts fd_cuda_device_fit would report, with registers allowing every
 * block shared memory does (fp32: 3 blocks an SM, an arbitrary count). */
static fd_cuda_fit fit_for(const fd_gpu_budget *g, const fd_problem *p) {
  fd_cuda_fit f;
  memset(&f, 0, sizeof f);
  f.g = *g;
  if (p->dtype == FD_DTYPE_F32) {
    f.split_blocks = 3;
  } else {
    const int cfg = fd_mma_config_4w(g, p->head_dim);
    assert_true(cfg >= 0);
    f.split_blocks = fd_gpu_blocks_fit(g, fd_mma_smem_bytes(p->head_dim, (fd_mma_config)cfg));
  }
  if (p->head_dim == 64 || p->head_dim == 128) {
    f.rows_blocks = fd_gpu_blocks_fit(g, FD_ROWS_SMEM(p->head_dim));
    if (g->wgmma) f.rows_wg_blocks = fd_gpu_blocks_fit(g, FD_ROWS_WG_SMEM(p->head_dim));
  }
  return f;
}

static fd_plan plan_on(const fd_gpu_budget *g, const fd_problem *p) {
  const fd_cuda_fit f = fit_for(g, p);
  fd_plan plan;
  fd_error err;
  const fd_status st = fd_plan_init_fit(&plan, p, &f, &err);
  if (st != FD_STATUS_OK) fail_msg("fd_plan_init_fit: %s: %s", fd_status_name(st), err.message);
  assert_int_equal(plan.backend, FD_BACKEND_CUDA);
  assert_int_equal(plan.sm_count, p->sm_count ? p->sm_count : g->sm_count);
  check_workspace_layout(&plan);
  return plan;
}

/* A CUDA plan: from the GPU when there is one, else for an H100. */
static fd_plan plan_cuda(const fd_problem *p) {
  return fd_backend_available(FD_BACKEND_CUDA) ? plan_ok(p) : plan_on(&H100, p);
}

/* fp16, B=1, 32 query heads over 8 kv heads, head_dim 128, kv_capacity keys. */
static fd_problem decode_problem(int32_t batch, int32_t kv_capacity) {
  fd_problem p = problem(FD_BACKEND_CUDA, batch, 8, kv_capacity);
  p.dtype = FD_DTYPE_F16;
  return p;
}

#define EXPECT_KERNEL(plan, k)                                                                  \
  do {                                                                                          \
    if ((plan).kernel != (k))                                                                   \
      fail_msg("line %d: kernel %d, expected %s (%d); %d splits of %d keys", __LINE__,         \
               (int)(plan).kernel, #k, (int)(k), (plan).num_splits, (plan).split_keys);        \
  } while (0)

static void test_plan_kernel(void **state) {
  (void)state;
  /* H100, B=1, 16k keys: 8 kv heads x 16 splits of 1024 keys = 128 blocks,
   * no more than the 132 SMs: the 8-warp config, one block an SM (the
   * one-block-an-SM count, not the occupancy's 2 blocks an SM). */
  fd_problem p = decode_problem(1, 16384);
  fd_plan plan = plan_on(&H100, &p);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_WIDE);
  assert_int_equal(plan.num_splits, 16);
  assert_int_equal(plan.split_keys, 1024);
  /* the same at head_dim 64 (short splits: one block an SM) and 256 */
  p.head_dim = 64;
  EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_WIDE);
  assert_int_equal(plan_on(&H100, &p).num_splits, 16);
  p.head_dim = 256;
  EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_WIDE);
  p.head_dim = 128;
  /* bf16 alike */
  p.dtype = FD_DTYPE_BF16;
  EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_WIDE);
  p.dtype = FD_DTYPE_F16;

  /* The deterministic mode: always a 4-warp config (fixed 2048-key splits). */
  p.deterministic = 1;
  plan = plan_on(&H100, &p);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_4W);
  assert_int_equal(plan.num_splits, 16384 / FD_DETERMINISTIC_SPLIT_LEN);
  plan = plan_on(&SM86, &p);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_LEAN);
  assert_int_equal(plan.num_splits, 16384 / FD_DETERMINISTIC_SPLIT_LEN);
  p.deterministic = 0;

  /* An fp8 cache has no 8-warp instance: the 4-warp config. At 16k keys
   * still the one-block-an-SM count (16 splits of 1024 keys x head_dim 128
   * = FD_ONE_BLOCK_PER_SM_ELEMS); at 32k keys (16 of 2048 would exceed it)
   * the heuristic's count at the occupancy's 2 blocks an SM. */
  p.kv_dtype = FD_DTYPE_E4M3;
  plan = plan_on(&H100, &p);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_4W);
  assert_int_equal(plan.num_splits, 16);
  p.kv_capacity = 32768;
  plan = plan_on(&H100, &p);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_4W);
  assert_int_equal(plan.num_splits, fd_num_splits_heuristic(8, 32768 / 64, 132, 2));
  assert_int_not_equal(plan.num_splits, fd_num_splits_heuristic(8, 32768 / 64, 132, 1));
  p.kv_capacity = 16384;
  p.kv_dtype = FD_DTYPE_E5M2;
  EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_4W);
  p.kv_dtype = 0;

  /* fp32: the CUDA-core kernel, the heuristic at its occupancy. */
  p.dtype = FD_DTYPE_F32;
  plan = plan_on(&H100, &p);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_F32);
  assert_int_equal(plan.num_splits, fd_num_splits_heuristic(8, 16384 / 64, 132, 3));
  EXPECT_KERNEL(plan_on(&SM86, &p), FD_KERNEL_CUDA_F32);
  p.dtype = FD_DTYPE_F16;

  /* A grid larger than the GPU (B=64: 512 blocks unsplit): 4-warp. */
  fd_problem big = decode_problem(64, 4096);
  plan = plan_on(&H100, &big);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_4W);
  assert_int_equal(plan.num_splits, 1);
  /* Splits shorter than the 8-warp tile (128 keys): 4-warp. 1 kv head, 100
   * keys: 2 chunks, 2 splits of 64 keys. */
  fd_problem tiny = decode_problem(1, 100);
  tiny.num_heads_kv = 1, tiny.num_heads_q = 4;
  plan = plan_on(&H100, &tiny);
  assert_int_equal(plan.split_keys, 64);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_4W);
  /* The same grid on fewer SMs than blocks (sm_count 100 < 128): 4-warp. */
  p.num_splits = 16;
  p.sm_count = 100;
  EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_4W);
  p.sm_count = 0;
  EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_WIDE);
  p.num_splits = 0;

  /* No 8-warp config without its code (compute_80 PTX on an H100) or its
   * shared memory (A100: 163 KB a block; sm_86: 99 KB). */
  EXPECT_KERNEL(plan_on(&H100_PTX80, &p), FD_KERNEL_CUDA_MMA_4W);
  EXPECT_KERNEL(plan_on(&A100, &p), FD_KERNEL_CUDA_MMA_4W);
  EXPECT_KERNEL(plan_on(&SM86, &p), FD_KERNEL_CUDA_MMA_LEAN);
  p.head_dim = 64; /* the 4-warp block fits 99 KB at head_dim 64 */
  EXPECT_KERNEL(plan_on(&SM86, &p), FD_KERNEL_CUDA_MMA_4W);
  for (int32_t hd = 80; hd <= 256; hd = hd == 96 ? 128 : hd == 128 ? 256 : hd + 16) {
    p.head_dim = hd;
    EXPECT_KERNEL(plan_on(&SM86, &p), FD_KERNEL_CUDA_MMA_LEAN);
    EXPECT_KERNEL(plan_on(&A100, &p), FD_KERNEL_CUDA_MMA_4W);
    EXPECT_KERNEL(plan_on(&H100, &p), FD_KERNEL_CUDA_MMA_WIDE);
  }
  p.head_dim = 128;

  /* The rows kernel: non-causal, fp16/bf16 over the same cache dtype,
   * head_dim 64 or 128, >= FD_ROWS_MIN rows a kv head (4 x 16 = 64), and a
   * device that holds its block (114,880 B at head_dim 128: not sm_86's
   * 99 KB, which runs the lean split kernel). */
  fd_problem nc = decode_problem(2, 8192);
  nc.non_causal = 1, nc.q_len = 16;
  plan = plan_on(&H100, &nc);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_ROWS);
  EXPECT_KERNEL(plan_on(&A100, &nc), FD_KERNEL_CUDA_ROWS);
  EXPECT_KERNEL(plan_on(&SM86, &nc), FD_KERNEL_CUDA_MMA_LEAN);
  nc.deterministic = 1; /* the rows kernel's shapes run it in the deterministic mode too */
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_ROWS);
  nc.deterministic = 0;
  nc.head_dim = 64;
  EXPECT_KERNEL(plan_on(&SM86, &nc), FD_KERNEL_CUDA_ROWS);
  /* a device whose rows block does not fit (rows_blocks 0): the split kernel */
  {
    fd_cuda_fit f = fit_for(&H100, &nc);
    f.rows_blocks = 0;
    fd_error err;
    assert_int_equal(fd_plan_init_fit(&plan, &nc, &f, &err), FD_STATUS_OK);
    assert_int_not_equal(plan.kernel, FD_KERNEL_CUDA_ROWS);
  }
  /* more than 64 rows a kv head on Hopper with sm_90a code: the wgmma rows
   * kernel (128 rows a block: 2 x 8 x 1 row tiles); elsewhere the mma one */
  nc.q_len = 32;
  plan = plan_on(&H100, &nc);
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_ROWS_WGMMA);
  nc.head_dim = 128;
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_ROWS_WGMMA);
  EXPECT_KERNEL(plan_on(&A100, &nc), FD_KERNEL_CUDA_ROWS);
  EXPECT_KERNEL(plan_on(&H100_PTX80, &nc), FD_KERNEL_CUDA_ROWS);
  nc.non_causal = 0, nc.tree_mask = 1; /* a tree of 32 nodes, 4 heads a kv head */
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_ROWS_WGMMA);
  nc.q_len = 16; /* 64 rows: the mma rows kernel */
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_ROWS);
  nc.non_causal = 1, nc.tree_mask = 0;
  nc.head_dim = 96; /* no rows instance: the split kernel (2 x 8 x 8 splits fit the SMs) */
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_MMA_WIDE);
  nc.head_dim = 128;
  nc.q_len = 4; /* 16 rows a kv head: below FD_ROWS_MIN */
  plan = plan_on(&H100, &nc);
  assert_false(fd_rows_kernel_shape(&plan.problem));
  EXPECT_KERNEL(plan, FD_KERNEL_CUDA_MMA_WIDE);
  nc.q_len = 16;
  nc.kv_dtype = FD_DTYPE_E4M3; /* fp8 cache: no rows kernel */
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_MMA_4W);
  nc.kv_dtype = 0;
  nc.dtype = FD_DTYPE_F32;
  EXPECT_KERNEL(plan_on(&H100, &nc), FD_KERNEL_CUDA_F32);

  /* CPU and reference plans record their own kernels. */
  fd_problem c = problem(FD_BACKEND_CPU, 1, 8, 4096);
  c.num_threads = 4;
  EXPECT_KERNEL(plan_ok(&c), FD_KERNEL_CPU);
  c.backend = FD_BACKEND_REFERENCE;
  EXPECT_KERNEL(plan_ok(&c), FD_KERNEL_REFERENCE);
  /* A failed plan records none. */
  c.batch = 0;
  fd_error err;
  memset(&plan, 0x5a, sizeof plan);
  assert_int_equal(fd_plan_init(&plan, &c, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_int_equal(plan.kernel, FD_KERNEL_NONE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worked_values),         cmocka_unit_test(test_bounds_and_properties),
      cmocka_unit_test(test_monotonic_in_sm_count), cmocka_unit_test(test_degenerate_inputs),
      cmocka_unit_test(test_plan_cpu),              cmocka_unit_test(test_plan_explicit_and_hint),
      cmocka_unit_test(test_plan_cuda_simulated),   cmocka_unit_test(test_plan_kernel),
  };
  return cmocka_run_group_tests_name("heuristic", tests, NULL, NULL);
}
