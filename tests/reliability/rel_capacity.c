/*
 * rel_capacity.c — capacity:
 *   - one sequence of 256k tokens on the CPU, 1M on the GPU (FD_TEST_QUICK:
 *     128k), against the float64 oracle, with automatic splits and with
 *     262144 splits asked for (clamped to FD_MAX_SPLITS);
 *   - split counts far beyond the chunks or FD_MAX_SPLITS clamp, for any
 *     capacity up to INT32_MAX;
 *   - sizes whose workspace would not fit in size_t are refused (or sized
 *     without wrapping), never a small wrapped workspace_size;
 *   - the split boundaries of split.h for lengths near INT32_MAX: every key
 *     in exactly one split, in order, no overflow.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rel.h"
#include "split.h"

static void long_sequence_matches_f64(void **state) {
  const rel_env *env = REL_ENV(state);
  const int cuda = env->backend == FD_BACKEND_CUDA;
  /* FD_TEST_QUICK (compute-sanitizer runs): 64k keys, no 1-split pass */
  const int32_t longest = rel_quick() ? 65536 : cuda ? 1048576 : 262144;
  const int32_t splits[3] = {0, 262144, 1};
  for (int si = 0; si < (rel_quick() ? 2 : 3); si++) {
    fd_case c = rel_case(env);
    c.dtype = si == 1 ? FD_DTYPE_BF16 : FD_DTYPE_F32;
    c.head_dim = cuda ? 128 : 64;
    c.num_heads_q = cuda ? 4 : 2;
    c.num_heads_kv = 1;
    c.batch = 1;
    c.kv_len[0] = longest - si; /* also a length that is not a whole chunk */
    c.q_len = si == 2 ? 2 : 1;
    c.page_size = si == 1 ? 256 : 0;
    c.num_splits = splits[si];
    c.with_lse = 1;
    /* the harness checks plan.num_splits == min(asked, chunks, FD_MAX_SPLITS) */
    rel_run_case(env, &c);
  }
}

static void expect_plan(const fd_problem *p, fd_status want, const char *what, fd_plan *plan) {
  fd_error err;
  memset(&err, 0, sizeof err);
  fd_status st = fd_plan_init(plan, p, &err);
  if (st != want)
    fail_msg("%s: fd_plan_init returned %s (%s), want %s", what, fd_status_name(st), err.message,
             fd_status_name(want));
  if (st != FD_STATUS_OK && !err.message[0]) fail_msg("%s: no message", what);
}

/* Bytes the plan's workspace must hold, in floating point (no wrap). */
static double workspace_needed(const fd_plan *plan) {
  const fd_problem *p = &plan->problem;
  if (plan->num_splits <= 1) return 0.0;
  const double rows = (double)p->batch * p->num_heads_q * p->q_len;
  return rows * plan->num_splits * (p->head_dim + 2) * 4.0;
}

static void split_count_clamped(void **state) {
  const rel_env *env = REL_ENV(state);
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = env->backend;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 1;
  p.num_heads_q = 8;
  p.num_heads_kv = 1;
  p.head_dim = 128;
  const int32_t caps[] = {262144, 1 << 20, INT32_MAX - 63, INT32_MAX};
  const int32_t asks[] = {262144, INT32_MAX, 1025, 1024, 0};
  for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++)
    for (size_t ai = 0; ai < sizeof asks / sizeof *asks; ai++) {
      p.kv_capacity = caps[ci];
      p.num_splits = asks[ai];
      fd_plan plan;
      char what[96];
      snprintf(what, sizeof what, "kv_capacity %d, num_splits %d", caps[ci], asks[ai]);
      expect_plan(&p, FD_STATUS_OK, what, &plan);
      const int64_t chunks = ((int64_t)caps[ci] + plan.chunk_len - 1) / plan.chunk_len;
      if (plan.num_splits < 1 || plan.num_splits > FD_MAX_SPLITS || plan.num_splits > chunks)
        fail_msg("%s: plan.num_splits %d outside [1, min(chunks %lld, FD_MAX_SPLITS)]", what, plan.num_splits,
                 (long long)chunks);
      if (asks[ai] >= FD_MAX_SPLITS && plan.num_splits != FD_MAX_SPLITS)
        fail_msg("%s: plan.num_splits %d, want FD_MAX_SPLITS", what, plan.num_splits);
      if ((double)plan.workspace_size < workspace_needed(&plan))
        fail_msg("%s: workspace_size %zu < the %.0f bytes the partials need", what, plan.workspace_size,
                 workspace_needed(&plan));
    }
}

/* Shapes whose partials exceed any address space: refused with
 * FD_STATUS_INVALID_ARGUMENT (or planned with a workspace_size that did not
 * wrap around); never a small wrapped size that fd_run would write past, and
 * (in the UBSan build) no signed overflow on the way. */
static void workspace_size_never_wraps(void **state) {
  const rel_env *env = REL_ENV(state);
  const struct {
    int32_t batch, q_len, heads_q, heads_kv, head_dim, splits;
  } shapes[] = {
      {1 << 30, 16, 1 << 30, 1, 256, 2},          /* rows = 2^64: wraps to 0 */
      {INT32_MAX, 16, INT32_MAX, 1, 256, 1024},   /* rows ~ 2^66 */
      {1 << 20, 16, 1 << 20, 1 << 20, 256, 1024}, /* rows 2^44, bytes ~ 2^74 */
      {1 << 16, 16, 1 << 12, 1 << 12, 256, 1024}, /* bytes ~ 2^62: fits size_t, huge */
      {INT32_MAX, 16, INT32_MAX, INT32_MAX, 256, 0}, /* automatic: work items batch * heads_kv ~ 2^62 */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = env->backend;
    p.dtype = FD_DTYPE_F32;
    p.batch = shapes[i].batch;
    p.q_len = shapes[i].q_len;
    p.num_heads_q = shapes[i].heads_q;
    p.num_heads_kv = shapes[i].heads_kv;
    p.head_dim = shapes[i].head_dim;
    p.kv_capacity = 1 << 20;
    p.num_splits = shapes[i].splits;
    p.sm_count = 132;
    fd_plan plan;
    fd_error err;
    memset(&err, 0, sizeof err);
    fd_status st = fd_plan_init(&plan, &p, &err);
    char what[160];
    snprintf(what, sizeof what, "batch %d, q_len %d, heads %d:%d, head_dim %d, num_splits %d", p.batch,
             p.q_len, p.num_heads_q, p.num_heads_kv, p.head_dim, p.num_splits);
    if (st == FD_STATUS_OK) {
      if (plan.num_splits > 1 && (double)plan.workspace_size < workspace_needed(&plan))
        fail_msg(
            "%s: fd_plan_init returned OK with workspace_size %zu bytes, but the partials need %.4g bytes "
            "(the size wrapped around)",
            what, plan.workspace_size, workspace_needed(&plan));
    } else if (st != FD_STATUS_INVALID_ARGUMENT && st != FD_STATUS_UNSUPPORTED) {
      fail_msg("%s: fd_plan_init returned %s (%s)", what, fd_status_name(st), err.message);
    } else if (!err.message[0]) {
      fail_msg("%s: refused without a message", what);
    }
  }
}

/* split.h for every length near INT32_MAX (kv_capacity may be INT32_MAX). */
static void split_ranges_near_int32_max(void **state) {
  (void)state;
  const int32_t lens[] = {INT32_MAX,      INT32_MAX - 1, INT32_MAX - 63, INT32_MAX - 64,
                          INT32_MAX - 65, 1 << 30,       262144,         1};
  const int32_t counts[] = {1, 2, 7, 1000, FD_MAX_SPLITS};
  for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      const int32_t L = lens[li], S = counts[ci], chunk = 64;
      /* what split.h must give, computed in 64 bits */
      const int64_t chunks = ((int64_t)L + chunk - 1) / chunk, per = (chunks + S - 1) / S * chunk;
      const int64_t active = ((int64_t)L + per - 1) / per;
      if (fd_seq_active_splits(L, 1, -1, chunk, S, 0) != active)
        fail_msg("fd_seq_active_splits(%d, %d, %d) = %d, want %lld", L, chunk, S,
                 fd_seq_active_splits(L, 1, -1, chunk, S, 0),
                 (long long)active);
      int64_t next = 0;
      for (int32_t s = 0; s < S; s++) {
        int32_t b, e;
        fd_seq_split(L, 1, -1, chunk, S, 0, s, &b, &e);
        const int64_t want_b = s < active ? (int64_t)s * per : L,
                      want_e = s < active ? (int64_t)(s + 1) * per : L;
        if (b != want_b || e != (want_e < L ? want_e : L) || b != next)
          fail_msg("fd_seq_split(kv_len %d, chunk %d, %d splits, split %d) = [%d, %d), want [%lld, %lld)",
                   L, chunk, S, s, b, e, (long long)want_b, (long long)(want_e < L ? want_e : L));
        next = e;
      }
      if (next != L)
        fail_msg("fd_seq_split(kv_len %d, %d splits): the splits end at %lld", L, S, (long long)next);
    }
}

/* fd_seq_split (THE cut of every backend): the active splits tile [w0, kv_len)
 * in whole chunks from w0, in order, each of fd_seq_split_len keys but the
 * last; the splits past them empty; the deterministic mode's fixed pieces
 * exact. Lengths near INT32_MAX, windows, 1..FD_MAX_SPLITS splits. */
static void seq_split_tiles_window_and_keys(void **state) {
  (void)state;
  const int32_t lens[] = {1, 63, 64, 65, 1000, 8192, 8193, 8202, 32769, 32768 + 64 * 15 + 1,
                          131073, 1 << 30, INT32_MAX - 65, INT32_MAX};
  const int32_t counts[] = {1, 2, 7, 16, 33, 1000, FD_MAX_SPLITS};
  const int32_t windows[] = {-1, 0, 127, 4095};
  const int32_t chunk = 64;
  for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
      for (size_t wi = 0; wi < sizeof windows / sizeof *windows; wi++)
        for (int fixed = 0; fixed <= 1; fixed++) {
          const int32_t L = lens[li], S = counts[ci], W = windows[wi], q_len = 3;
          const int32_t fixed_len = fixed ? FD_DETERMINISTIC_SPLIT_LEN : 0;
          if (fixed && (int64_t)L > (int64_t)fixed_len * S) continue;
          const int32_t w0 = fd_window_start(L, q_len, W, chunk);
          const int64_t len = (int64_t)L - w0;
          const int64_t per = fd_seq_split_len((int32_t)len, chunk, S, fixed_len);
          const int32_t active = fd_seq_active_splits(L, q_len, W, chunk, S, fixed_len);
          if (w0 % chunk || active != (len + per - 1) / per || active > S)
            fail_msg("kv_len %d, %d splits, window %d: w0 %d, %d active (per %lld)", L, S, W, w0,
                     active, (long long)per);
          int64_t next = w0;
          for (int32_t s = 0; s < S; s++) {
            int32_t b, e;
            fd_seq_split(L, q_len, W, chunk, S, fixed_len, s, &b, &e);
            const int64_t n = e - b;
            if (b != next || (s < active) != (n > 0) || n > per || (n > 0 && (b - w0) % chunk) ||
                (s < active && e < L && n != per) || (fixed && per != fixed_len))
              fail_msg("kv_len %d, %d splits, window %d, fixed %d: split %d = [%d, %d) after %lld "
                       "(per %lld, %d active)",
                       L, S, W, fixed_len, s, b, e, (long long)next, (long long)per, active);
            next = e;
          }
          if (next != L) fail_msg("kv_len %d, %d splits, window %d: the splits end at %lld", L, S, W,
                                  (long long)next);
        }
}

rel_group rel_group_capacity(fd_backend backend) {
  static const struct CMUnitTest tests[] = {
      {"long_sequence_matches_f64", long_sequence_matches_f64, NULL, NULL, NULL},
      {"split_count_clamped", split_count_clamped, NULL, NULL, NULL},
      {"workspace_size_never_wraps", workspace_size_never_wraps, NULL, NULL, NULL},
      {"split_ranges_near_int32_max", split_ranges_near_int32_max, NULL, NULL, NULL},
      {"seq_split_tiles_window_and_keys", seq_split_tiles_window_and_keys, NULL, NULL, NULL},
  };
  /* split.h is host code: its two tests (the last two) run once, with the CPU group */
  rel_group g = {"capacity", tests, sizeof tests / sizeof *tests - 2 * (backend == FD_BACKEND_CUDA)};
  return g;
}
