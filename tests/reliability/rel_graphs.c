/*
 * rel_graphs.c — CUDA only: fd_run captured in a CUDA graph
 * and replayed while the kv_len values in device memory change.
 *
 * Per case (batch 8, every cache filled to its capacity of 4096 keys) and per
 * plan (automatic splits for the capacity; 1 split; automatic from a
 * kv_len_hint shorter than later replays):
 *   1. eager: for every kv_len vector of the list, fd_run on a stream; the
 *      result is checked against the float64 oracle;
 *   2. capture: kv_len = [517, 1, 4096, 0, 0, 0, 0, 0] uploaded, two fd_run
 *      calls (two "layers", each with its own out and lse) captured with
 *      cudaStreamBeginCapture (global mode: any forbidden call inside fd_run
 *      fails the capture), instantiated;
 *   3. replay: for every vector (shorter, longer than at capture, up to
 *      capacity, all empty, back again), kv_len copied into the same device
 *      buffer, out and lse poisoned (NaN), the graph launched: both layers'
 *      out and lse bitwise equal to the eager run of that vector.
 * A fourth case has a sliding window of 127 keys (q_len 2), sinks and a
 * soft-cap: as kv_len grows across the replays (past the window, then one
 * token at a time) the window slides, and the splits, planned once for the
 * window, start wherever each replay's window does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_mem.h"
#include "rel.h"
#include "rel_cuda.h"

#define B 8
#define CAP 4096
#define NVEC 9

static const int32_t vectors[NVEC][B] = {
    {517, 1, 4096, 0, 0, 0, 0, 0},            /* the capture */
    {100, 1, 64, 0, 0, 0, 0, 0},              /* shorter */
    {4096, 4096, 4095, 4033, 2000, 1, 0, 63}, /* longer, up to capacity */
    {0, 0, 0, 0, 0, 0, 0, 0},                 /* nothing to see */
    {4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096},
    {1, 2, 3, 64, 65, 127, 128, 129}, /* chunk boundaries */
    {3000, 0, 17, 4096, 1, 2048, 999, 4000},
    {127, 128, 129, 130, 191, 192, 256, 1000}, /* around a window of 127 (+ q_len) ... */
    {128, 129, 130, 131, 192, 193, 257, 1001}, /* ... one token later: every window slides by one */
};

typedef struct gbufs {
  unsigned char *out[2];
  float *lse[2];
  unsigned char *ws;
  int32_t *kv_len;
  size_t out_bytes, lse_bytes;
} gbufs;

static void check(int rc, const char *what) {
  if (rc) fail_msg("%s failed", what);
}

/* Poison both layers' outputs on the stream. */
static void poison(const gbufs *g, void *stream) {
  for (int l = 0; l < 2; l++) {
    check(rel_cuda_memset_async(g->out[l], 0xff, g->out_bytes, stream), "cudaMemsetAsync out");
    check(rel_cuda_memset_async(g->lse[l], 0xff, g->lse_bytes, stream), "cudaMemsetAsync lse");
  }
}

/* The two layers' fd_run calls (captured or eager). */
static void enqueue(const fd_plan *plan, const fd_tensors *inputs, const gbufs *g, void *stream, int layers) {
  for (int l = 0; l < layers; l++) {
    fd_tensors t = *inputs;
    t.kv_len = g->kv_len;
    t.out = g->out[l];
    t.lse = g->lse[l];
    memset(t.out_strides, 0, sizeof t.out_strides);
    memset(t.lse_strides, 0, sizeof t.lse_strides);
    fd_error err;
    fd_status st = fd_run(plan, &t, g->ws, plan->workspace_size, stream, &err);
    if (st != FD_STATUS_OK) fail_msg("fd_run (layer %d): %s: %s", l, fd_status_name(st), err.message);
  }
}

static void graph_case(const rel_env *env, const fd_case *c) {
  fd_case_data *d = rel_data(env, c);
  const fd_tensors inputs = fd_case_data_tensors(d);
  fd_tensors host = fd_case_data_host_tensors(d);
  void *stream = NULL;
  check(rel_cuda_stream_create(&stream, 1), "cudaStreamCreate");
  gbufs g;
  memset(&g, 0, sizeof g);
  const size_t rows = (size_t)B * c->q_len * c->num_heads_q;
  g.out_bytes = rows * c->head_dim * fd_dtype_size(c->out_f32 ? FD_DTYPE_F32 : c->dtype);
  g.lse_bytes = rows * sizeof(float);
  for (int l = 0; l < 2; l++) {
    g.out[l] = rel_alloc(FD_BACKEND_CUDA, g.out_bytes);
    g.lse[l] = rel_alloc(FD_BACKEND_CUDA, g.lse_bytes);
  }
  g.kv_len = rel_alloc(FD_BACKEND_CUDA, B * sizeof(int32_t));
  unsigned char *eager_out = malloc(NVEC * g.out_bytes), *got = malloc(g.out_bytes);
  float *eager_lse = malloc(NVEC * g.lse_bytes), *got_lse = malloc(g.lse_bytes);
  assert_true(eager_out && got && eager_lse && got_lse);

  const fd_problem *problem = NULL;
  fd_plan plans[3];
  plans[0] = rel_plan(d, 0);
  plans[1] = rel_plan(d, 1);
  {
    fd_problem p = plans[0].problem;
    p.num_splits = 0;
    p.kv_len_hint = vectors[1]; /* short: few splits, then replayed with longer lengths */
    fd_error err;
    if (fd_plan_init(&plans[2], &p, &err) != FD_STATUS_OK) fail_msg("hinted plan: %s", err.message);
  }
  problem = &plans[0].problem;
  const char *plan_names[3] = {"automatic", "1 split", "hinted short"};
  for (int pi = 0; pi < 3; pi++) {
    if (rel_quick() && pi == 1) continue; /* quick: the two split plans */
    const fd_plan *plan = &plans[pi];
    g.ws = plan->workspace_size ? rel_alloc(FD_BACKEND_CUDA, plan->workspace_size) : NULL;
    char what[1300];
    /* 1. eager runs */
    for (int vi = 0; vi < NVEC; vi++) {
      check(rel_cuda_upload_async(g.kv_len, vectors[vi], B * sizeof(int32_t), stream), "kv_len upload");
      poison(&g, stream);
      if (g.ws) check(rel_cuda_memset_async(g.ws, 0xff, plan->workspace_size, stream), "workspace memset");
      enqueue(plan, &inputs, &g, stream, 1);
      check(rel_cuda_download_async(eager_out + vi * g.out_bytes, g.out[0], g.out_bytes, stream), "download");
      check(rel_cuda_download_async((char *)eager_lse + vi * g.lse_bytes, g.lse[0], g.lse_bytes, stream),
            "download");
      check(rel_cuda_stream_sync(stream), "stream synchronize (eager run)");
      double *ref, *ref_lse;
      host.kv_len = vectors[vi];
      rel_oracle(problem, &host, &ref, &ref_lse);
      snprintf(what, sizeof what, "%s, %s plan (%d splits), eager, kv_len vector %d", fd_case_data_name(d),
               plan_names[pi], plan->num_splits, vi);
      if (rel_check_dense_sinks(problem, vectors[vi], host.sinks, eager_out + vi * g.out_bytes,
                                (const float *)((char *)eager_lse + vi * g.lse_bytes), ref, ref_lse, 3.0, 0.0,
                                0.0, what))
        fail_msg("%s: wrong result", what);
      free(ref);
      free(ref_lse);
    }
    /* 2. capture two layers with the capture lengths in place */
    check(rel_cuda_upload_async(g.kv_len, vectors[0], B * sizeof(int32_t), stream), "kv_len upload");
    check(rel_cuda_stream_sync(stream), "stream synchronize");
    check(rel_cuda_capture_begin(stream), "cudaStreamBeginCapture");
    enqueue(plan, &inputs, &g, stream, 2);
    if (rel_cuda_is_capturing(stream) != 1)
      fail_msg("%s plan: the stream stopped capturing inside fd_run", plan_names[pi]);
    void *exec = NULL;
    check(rel_cuda_capture_end(stream, &exec), "cudaStreamEndCapture / cudaGraphInstantiate");
    /* 3. replays */
    const int order[] = {1, 2, 0, 3, 4, 5, 7, 8, 6, 1, 1};
    for (size_t oi = 0; oi < sizeof order / sizeof *order; oi++) {
      const int vi = order[oi];
      check(rel_cuda_upload_async(g.kv_len, vectors[vi], B * sizeof(int32_t), stream), "kv_len upload");
      poison(&g, stream);
      if (g.ws) check(rel_cuda_memset_async(g.ws, 0xff, plan->workspace_size, stream), "workspace memset");
      check(rel_cuda_graph_launch(exec, stream), "cudaGraphLaunch");
      for (int l = 0; l < 2; l++) {
        check(rel_cuda_download_async(got, g.out[l], g.out_bytes, stream), "download");
        check(rel_cuda_download_async(got_lse, g.lse[l], g.lse_bytes, stream), "download");
        check(rel_cuda_stream_sync(stream), "stream synchronize (replay)");
        snprintf(what, sizeof what, "%s, %s plan (%d splits), replay %zu (kv_len vector %d), layer %d: out",
                 fd_case_data_name(d), plan_names[pi], plan->num_splits, oi, vi, l);
        rel_assert_same(eager_out + vi * g.out_bytes, got, g.out_bytes, what);
        snprintf(what, sizeof what, "%s, %s plan, replay %zu (kv_len vector %d), layer %d: lse",
                 fd_case_data_name(d), plan_names[pi], oi, vi, l);
        rel_assert_same((char *)eager_lse + vi * g.lse_bytes, got_lse, g.lse_bytes, what);
      }
    }
    check(rel_cuda_graph_destroy(exec), "cudaGraphExecDestroy");
    rel_free(FD_BACKEND_CUDA, g.ws);
    g.ws = NULL;
    printf("  %s: %s plan (%d splits): %zu replays equal the eager runs\n", fd_case_data_name(d),
           plan_names[pi], plan->num_splits, sizeof order / sizeof *order);
  }
  for (int l = 0; l < 2; l++) rel_free(FD_BACKEND_CUDA, g.out[l]), rel_free(FD_BACKEND_CUDA, g.lse[l]);
  rel_free(FD_BACKEND_CUDA, g.kv_len);
  check(rel_cuda_stream_destroy(stream), "cudaStreamDestroy");
  free(eager_out), free(got), free(eager_lse), free(got_lse);
  fd_case_data_free(d);
}

static void graph_replay_follows_kv_len(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int variant = 0; variant < 4; variant++) {
    if (rel_quick() && variant != 0 && variant != 3) continue; /* quick: one plain, the window */
    fd_case c = rel_case(env);
    c.batch = B;
    for (int b = 0; b < B; b++) c.kv_len[b] = CAP; /* every key real: later replays may read up to capacity */
    c.with_lse = 1;
    switch (variant) {
      case 0:
        c.dtype = FD_DTYPE_BF16, c.head_dim = 128, c.num_heads_q = 16, c.num_heads_kv = 2;
        break;
      case 1:
        c.dtype = FD_DTYPE_F16, c.head_dim = 64, c.num_heads_q = 8, c.num_heads_kv = 1, c.q_len = 2,
        c.page_size = 16;
        break;
      case 2:
        c.dtype = FD_DTYPE_F32, c.head_dim = 256, c.num_heads_q = 4, c.num_heads_kv = 4;
        break;
      default: /* the window slides across the replays */
        c.dtype = FD_DTYPE_BF16, c.head_dim = 128, c.num_heads_q = 16, c.num_heads_kv = 2, c.q_len = 2,
        c.page_size = 16, c.has_window = 1, c.window_left = 127, c.sinks = 1, c.logits_soft_cap = 30.0f,
        c.out_f32 = 1;
        break;
    }
    graph_case(env, &c);
  }
}

rel_group rel_group_graphs(fd_backend backend) {
  static const struct CMUnitTest tests[] = {
      {"graph_replay_follows_kv_len", graph_replay_follows_kv_len, NULL, NULL, NULL},
  };
  rel_group g = {"graphs", tests, backend == FD_BACKEND_CUDA ? sizeof tests / sizeof *tests : 0};
  return g;
}
