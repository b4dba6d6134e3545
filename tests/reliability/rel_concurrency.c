/*
 * rel_concurrency.c — several threads calling the library at once get
 * bitwise the results of serial calls (the header's THREAD SAFETY promise).
 * CPU: 4 pthreads, each with its own out, lse and workspace, share the
 * inputs and the plans (const) and run every plan several times in a
 * rotating order, so calls with different split counts overlap; each also
 * makes its own plans concurrently (equal to the main thread's, byte for
 * byte). CUDA: the same, every thread on its own stream (one the legacy
 * default stream, one a blocking stream, the others non-blocking).
 * Threads never call cmocka (its failures longjmp); they count mismatches
 * and the main thread asserts.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_mem.h"
#include "rel.h"
#include "rel_cuda.h"

#define THREADS 4
#define ROUNDS 6
#define PLANS 3

typedef struct shared {
  fd_backend backend;
  fd_problem problem; /* of the case, backend set */
  fd_plan plans[PLANS];
  int32_t splits[PLANS];
  fd_tensors inputs; /* explicit strides; backend-side pointers */
  size_t out_bytes, lse_bytes;
  unsigned char *serial_out[PLANS]; /* host copies of the serial results */
  float *serial_lse[PLANS];
} shared;

typedef struct worker {
  const shared *sh;
  int id;
  void *stream;       /* CUDA: this thread's stream (NULL = legacy default) */
  unsigned char *out; /* backend side */
  float *lse;
  unsigned char *ws[PLANS];
  unsigned char *host_out; /* host copies */
  float *host_lse;
  int mismatches, errors, plan_differs;
  char first_error[320];
} worker;

static void note_error(worker *w, const char *what, const char *msg) {
  if (w->errors++ == 0) snprintf(w->first_error, sizeof w->first_error, "%s: %s", what, msg);
}

static int same_plan(const fd_plan *a, const fd_plan *b) {
  return a->backend == b->backend && a->softmax_scale == b->softmax_scale &&
         a->kv_capacity == b->kv_capacity && a->num_splits == b->num_splits && a->chunk_len == b->chunk_len &&
         a->sm_count == b->sm_count && a->num_threads == b->num_threads &&
         a->workspace_size == b->workspace_size && a->ws_partial_o == b->ws_partial_o &&
         a->ws_partial_ml == b->ws_partial_ml && a->ws_counters == b->ws_counters &&
         a->split_keys == b->split_keys;
}

static void *work(void *arg) {
  worker *w = arg;
  const shared *sh = w->sh;
  const int cuda = sh->backend == FD_BACKEND_CUDA;
  /* plans made concurrently equal the main thread's */
  for (int i = 0; i < PLANS; i++) {
    fd_problem p = sh->problem;
    p.num_splits = sh->splits[i];
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK)
      note_error(w, "fd_plan_init", err.message);
    else if (!same_plan(&plan, &sh->plans[i]))
      w->plan_differs++;
  }
  const int rounds = rel_quick() ? 1 : ROUNDS;
  for (int round = 0; round < rounds; round++)
    for (int k = 0; k < PLANS; k++) {
      const int i = (k + w->id + round) % PLANS;
      const fd_plan *plan = &sh->plans[i];
      fd_tensors t = sh->inputs;
      t.out = w->out;
      t.lse = w->lse;
      memset(t.out_strides, 0, sizeof t.out_strides);
      memset(t.lse_strides, 0, sizeof t.lse_strides);
      fd_error err;
      if (cuda) {
        if (rel_cuda_memset_async(w->out, 0xff, sh->out_bytes, w->stream) ||
            rel_cuda_memset_async(w->lse, 0xff, sh->lse_bytes, w->stream) ||
            (plan->workspace_size &&
             rel_cuda_memset_async(w->ws[i], 0xff, plan->workspace_size, w->stream))) {
          note_error(w, "memset", "cudaMemsetAsync failed");
          continue;
        }
      } else {
        memset(w->out, 0xff, sh->out_bytes);
        memset(w->lse, 0xff, sh->lse_bytes);
        if (plan->workspace_size) memset(w->ws[i], 0xff, plan->workspace_size);
      }
      fd_status st = fd_run(plan, &t, w->ws[i], plan->workspace_size, w->stream, &err);
      if (st != FD_STATUS_OK) {
        note_error(w, "fd_run", err.message);
        continue;
      }
      if (cuda) {
        if (rel_cuda_download_async(w->host_out, w->out, sh->out_bytes, w->stream) ||
            rel_cuda_download_async(w->host_lse, w->lse, sh->lse_bytes, w->stream) ||
            rel_cuda_stream_sync(w->stream)) {
          note_error(w, "download", "copy back or stream synchronize failed");
          continue;
        }
      } else {
        memcpy(w->host_out, w->out, sh->out_bytes);
        memcpy(w->host_lse, w->lse, sh->lse_bytes);
      }
      if (memcmp(w->host_out, sh->serial_out[i], sh->out_bytes) != 0 ||
          memcmp(w->host_lse, sh->serial_lse[i], sh->lse_bytes) != 0)
        w->mismatches++;
    }
  return NULL;
}

static void concurrent_case(const rel_env *env, const fd_case *c) {
  const fd_backend be = env->backend;
  const int cuda = be == FD_BACKEND_CUDA;
  fd_case_data *d = rel_data(env, c);
  static shared sh;
  memset(&sh, 0, sizeof sh);
  sh.backend = be;
  sh.inputs = fd_case_data_tensors(d);
  const int32_t splits[PLANS] = {1, 7, 0};
  for (int i = 0; i < PLANS; i++) {
    sh.splits[i] = splits[i];
    sh.plans[i] = rel_plan(d, splits[i]);
  }
  sh.problem = sh.plans[0].problem; /* resolved defaults: the same plans again */
  const size_t rows = (size_t)c->batch * c->q_len * c->num_heads_q;
  sh.out_bytes = rows * c->head_dim * fd_dtype_size(c->dtype);
  sh.lse_bytes = rows * sizeof(float);
  /* serial results, one call at a time */
  for (int i = 0; i < PLANS; i++) {
    sh.serial_out[i] = malloc(sh.out_bytes);
    sh.serial_lse[i] = malloc(sh.lse_bytes);
    assert_true(sh.serial_out[i] && sh.serial_lse[i]);
    fd_error err;
    if (rel_run_private(&sh.plans[i], &sh.inputs, 0xff, NULL, sh.serial_out[i], sh.serial_lse[i], &err) !=
        FD_STATUS_OK)
      fail_msg("serial run: %s", err.message);
  }
  worker w[THREADS];
  memset(w, 0, sizeof w);
  for (int k = 0; k < THREADS; k++) {
    w[k].sh = &sh;
    w[k].id = k;
    if (cuda && k > 0 && rel_cuda_stream_create(&w[k].stream, k > 1)) fail_msg("stream create failed");
    w[k].out = rel_alloc(be, sh.out_bytes);
    w[k].lse = rel_alloc(be, sh.lse_bytes);
    for (int i = 0; i < PLANS; i++)
      w[k].ws[i] = sh.plans[i].workspace_size ? rel_alloc(be, sh.plans[i].workspace_size) : NULL;
    w[k].host_out = malloc(sh.out_bytes);
    w[k].host_lse = malloc(sh.lse_bytes);
    assert_true(w[k].host_out && w[k].host_lse);
  }
  pthread_t tid[THREADS];
  for (int k = 0; k < THREADS; k++)
    if (pthread_create(&tid[k], NULL, work, &w[k])) fail_msg("pthread_create failed");
  for (int k = 0; k < THREADS; k++) pthread_join(tid[k], NULL);
  rel_sync(be);
  int mismatches = 0, errors = 0, plan_differs = 0;
  for (int k = 0; k < THREADS; k++) {
    mismatches += w[k].mismatches;
    errors += w[k].errors;
    plan_differs += w[k].plan_differs;
    if (w[k].errors) fprintf(stderr, "thread %d: %s\n", k, w[k].first_error);
    if (w[k].stream) rel_cuda_stream_destroy(w[k].stream);
    rel_free(be, w[k].out);
    rel_free(be, w[k].lse);
    for (int i = 0; i < PLANS; i++) rel_free(be, w[k].ws[i]);
    free(w[k].host_out);
    free(w[k].host_lse);
  }
  for (int i = 0; i < PLANS; i++) free(sh.serial_out[i]), free(sh.serial_lse[i]);
  printf("  %s: %d threads x %d runs: %d differ from the serial result\n", fd_case_data_name(d), THREADS,
         (rel_quick() ? 1 : ROUNDS) * PLANS, mismatches);
  if (errors) fail_msg("%s: %d concurrent calls failed", fd_case_data_name(d), errors);
  if (plan_differs)
    fail_msg("%s: %d plans made concurrently differ from the serial plan", fd_case_data_name(d),
             plan_differs);
  if (mismatches)
    fail_msg("%s: %d concurrent runs are not bitwise equal to the serial run", fd_case_data_name(d),
             mismatches);
  fd_case_data_free(d);
}

static void concurrent_calls(void **state) {
  const rel_env *env = REL_ENV(state);
  fd_case c = rel_case(env);
  c.dtype = FD_DTYPE_BF16;
  c.head_dim = 128;
  c.num_heads_q = 16;
  c.num_heads_kv = 4;
  c.batch = 4;
  c.kv_len[0] = 3000, c.kv_len[1] = 1, c.kv_len[2] = 0, c.kv_len[3] = 777;
  c.q_len = 2;
  c.page_size = 16;
  c.with_lse = 1;
  concurrent_case(env, &c);
  if (rel_quick()) return;
  fd_case c2 = rel_case(env);
  c2.dtype = FD_DTYPE_F32;
  c2.head_dim = 64;
  c2.num_heads_q = 8;
  c2.num_heads_kv = 8;
  c2.batch = 2;
  c2.kv_len[0] = 5000, c2.kv_len[1] = 130;
  c2.q_len = 1;
  c2.layout = FD_LAYOUT_NONCONTIG;
  c2.with_lse = 1;
  concurrent_case(env, &c2);
}

rel_group rel_group_concurrency(fd_backend backend) {
  (void)backend;
  static const struct CMUnitTest tests[] = {
      {"concurrent_calls", concurrent_calls, NULL, NULL, NULL},
  };
  rel_group g = {"concurrency", tests, sizeof tests / sizeof *tests};
  return g;
}
