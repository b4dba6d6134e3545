/*
 * multi_gpu_decode.c — one decode step with the KV cache spread across GPUs:
 * one process drives every visible GPU (ncclCommInitAll), each sequence's
 * pages are cut into contiguous ranges, one range (a shard) per GPU, which
 * holds those pages only (its own page pool and block table), each GPU
 * runs fd_run over its shard (fp32 states, with lse) and flashdecode_nccl
 * gathers and merges the states, so that every GPU ends with the attention
 * over the whole cache. Checked against one GPU's fd_run over the whole
 * cache (and every GPU's result bitwise against GPU 0's).
 *
 * With one GPU the same code runs with a 1-rank communicator and four
 * shards on that GPU (num_local_states = 4): the gather is then a local
 * copy, and the merge of four states is checked the same way. Without a
 * GPU (or NCCL cannot start) it says so and exits 0 (--skip-status N: N).
 *
 *   build/tests/example_multi_gpu_decode [--batch B] [--kv-len N]
 *       [--shards-per-gpu S] [--graph] [--timeout SECONDS] [--skip-status N]
 *
 * --graph captures the step (fd_run, gather, merge; every GPU's stream) in
 * one CUDA graph per GPU and replays it on a grown kv_len, checked the same
 * way. fd_nccl_wait bounds every wait (--timeout, default 60 s): a GPU that
 * hangs makes the program abort the communicators and fail, not hang.
 *
 * Layouts (elements, row-major), as fd_run's:
 *   q      [batch, 1, Hq, D] bf16;  pool [pages, PAGE, Hkv, D] bf16 (k, v)
 *   block_table [batch, max_pages] int32; kv_len [batch] int32
 *   states [shards, batch, 1, Hq, D] fp32, lse [shards, batch, Hq] fp32
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <flashdecode_nccl.h>

enum { HQ = 32, HKV = 8, D = 128, PAGE = 16, MAX_GPUS = 16, MAX_SHARDS = 64, MAX_BATCH = 64 };

#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)
#define FD_OK(call)                                                                           \
  do {                                                                                        \
    fd_error err_;                                                                            \
    memset(&err_, 0, sizeof err_);                                                            \
    fd_status s_ = (call);                                                                    \
    if (s_ != FD_STATUS_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, fd_status_name(s_), err_.message); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)
#define NCCL_OK(call)                                                                        \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void *dev_copy(const void *host, size_t bytes) {
  void *d = NULL;
  CUDA_OK(cudaMalloc(&d, bytes ? bytes : 16));
  if (bytes) CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}

/* The whole cache on the host: sequence b's page i is page first[b] + i. */
typedef struct host_cache {
  int batch, num_pages;
  int32_t kv_len[MAX_BATCH];
  int first[MAX_BATCH];
  uint16_t *q, *k, *v;
} host_cache;

/* One shard: the pages [lo, hi) of every sequence (page indices within it). */
typedef struct shard {
  int lo[MAX_BATCH], hi[MAX_BATCH];
} shard;

static int pages_of(int32_t kv_len) { return (kv_len + PAGE - 1) / PAGE; }

/* Shard s of n: pages [P*s/n, P*(s+1)/n) of each sequence, P its pages at
 * capacity (`kv_cap`): a shard owns a fixed range of positions, and holds
 * the part of it the sequence has reached (the last shards fill up last). */
static void cut(const host_cache *c, const int32_t *kv_cap, int s, int n, shard *sh) {
  for (int b = 0; b < c->batch; b++) {
    const int p = pages_of(kv_cap[b]);
    sh->lo[b] = (int)((int64_t)p * s / n);
    sh->hi[b] = (int)((int64_t)p * (s + 1) / n);
  }
}

/* A shard's block table (its GPU's page ids: sequence b's page i is local
 * page base[b] + i - lo[b]) and key counts at lengths `kv_len`. */
static void shard_tables(const host_cache *c, const int32_t *kv_len, const shard *sh,
                         const int32_t *base, int max_pages, int32_t *bt, int32_t *kv) {
  for (int b = 0; b < c->batch; b++) {
    const int p = pages_of(kv_len[b]);
    const int end = sh->hi[b] < p ? sh->hi[b] : p;
    kv[b] = 0;
    for (int i = sh->lo[b]; i < end; i++) {
      bt[b * max_pages + (i - sh->lo[b])] = base[b] + i - sh->lo[b];
      kv[b] += (i == p - 1) ? kv_len[b] - PAGE * i : PAGE;
    }
  }
}

/* Everything one GPU holds: its shards' pages only (its own pool), their
 * tables, the plans and buffers. */
typedef struct gpu {
  int device;
  cudaStream_t stream;
  void *q, *k, *v;                          /* k, v: [num_pages, PAGE, HKV, D], this GPU's pages */
  int num_pages;
  int32_t base[MAX_SHARDS][MAX_BATCH];      /* local page id of each shard's first page */
  int32_t *bt[MAX_SHARDS], *kv[MAX_SHARDS]; /* per local shard */
  fd_plan plan;
  void *fd_ws;
  fd_nccl_plan nplan;
  void *nccl_ws;
  float *out, *lse;
  cudaGraphExec_t graph;
} gpu;

static int g_gpus, g_local, g_max_pages;
static int32_t g_kv_cap[MAX_BATCH]; /* the lengths the shards are cut for */
static void *g_ref_k, *g_ref_v;     /* GPU 0: the whole pool, for the single-GPU reference */
static double g_timeout = 60.0;

/* Upload every local shard's tables for lengths `kv_len`. */
static void upload_tables(gpu *g, const host_cache *c, const int32_t *kv_len, int rank) {
  int32_t *bt = calloc((size_t)c->batch * g_max_pages, sizeof(int32_t));
  int32_t kv[MAX_BATCH];
  if (!bt) exit(1);
  for (int l = 0; l < g_local; l++) {
    shard sh;
    cut(c, g_kv_cap, rank * g_local + l, g_gpus * g_local, &sh);
    shard_tables(c, kv_len, &sh, g->base[l], g_max_pages, bt, kv);
    CUDA_OK(cudaMemcpyAsync(g->bt[l], bt, (size_t)c->batch * g_max_pages * sizeof(int32_t),
                            cudaMemcpyHostToDevice, g->stream));
    CUDA_OK(cudaMemcpyAsync(g->kv[l], kv, (size_t)c->batch * sizeof(int32_t), cudaMemcpyHostToDevice,
                            g->stream));
    CUDA_OK(cudaStreamSynchronize(g->stream));
  }
  free(bt);
}

/* The local attention of every shard of GPU g, into its workspace slot. */
static void local_attention(gpu *g) {
  void *slot_out;
  float *slot_lse;
  FD_OK(fd_nccl_local_slot(&g->nplan, g->nccl_ws, &slot_out, &slot_lse, &err_));
  const size_t rows = (size_t)g->plan.problem.batch * HQ;
  for (int l = 0; l < g_local; l++) {
    fd_tensors t;
    memset(&t, 0, sizeof t);
    t.q = g->q;
    t.k_cache = g->k;
    t.v_cache = g->v;
    t.kv_len = g->kv[l];
    t.block_table = g->bt[l];
    t.out = (float *)slot_out + l * rows * D;
    t.lse = slot_lse + l * rows;
    FD_OK(fd_run(&g->plan, &t, g->fd_ws, g->plan.workspace_size, g->stream, &err_));
  }
}

/* One step on every GPU: local attention, then the gathers in one group
 * (one thread drives every rank), then the merges. */
static void step(gpu *gs, ncclComm_t *comms) {
  for (int r = 0; r < g_gpus; r++) {
    CUDA_OK(cudaSetDevice(gs[r].device));
    local_attention(&gs[r]);
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < g_gpus; r++) {
    void *slot_out;
    float *slot_lse;
    FD_OK(fd_nccl_local_slot(&gs[r].nplan, gs[r].nccl_ws, &slot_out, &slot_lse, &err_));
    FD_OK(fd_nccl_gather(&gs[r].nplan, comms[r], slot_out, slot_lse, gs[r].nccl_ws,
                         gs[r].nplan.workspace_size, gs[r].stream, &err_));
  }
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < g_gpus; r++)
    FD_OK(fd_nccl_merge_gathered(&gs[r].nplan, gs[r].nccl_ws, gs[r].nplan.workspace_size, gs[r].out,
                                 gs[r].lse, gs[r].stream, &err_));
}

static void wait_all(gpu *gs, ncclComm_t *comms) {
  for (int r = 0; r < g_gpus; r++) {
    fd_error err;
    if (fd_nccl_wait(comms[r], gs[r].stream, g_timeout, 1, &err) != FD_STATUS_OK) {
      fprintf(stderr, "GPU %d: %s\n", gs[r].device, err.message);
      for (int q = 0; q < g_gpus; q++)
        if (q != r) (void)ncclCommAbort(comms[q]); /* comms[r] is aborted already */
      exit(1);
    }
  }
}

/* Single-GPU decode of the whole cache on GPU 0 (the oracle), at `kv_len`. */
static void whole_cache(const host_cache *c, const int32_t *kv_len, gpu *g0, float *out, float *lse) {
  CUDA_OK(cudaSetDevice(g0->device));
  int max_pages = 1;
  for (int b = 0; b < c->batch; b++)
    if (pages_of(kv_len[b]) > max_pages) max_pages = pages_of(kv_len[b]);
  int32_t *bt = calloc((size_t)c->batch * max_pages, sizeof(int32_t));
  if (!bt) exit(1);
  for (int b = 0; b < c->batch; b++)
    for (int i = 0; i < pages_of(kv_len[b]); i++) bt[b * max_pages + i] = c->first[b] + i;
  int32_t *d_bt = dev_copy(bt, (size_t)c->batch * max_pages * sizeof(int32_t));
  int32_t *d_kv = dev_copy(kv_len, (size_t)c->batch * sizeof(int32_t));
  float *d_out, *d_lse;
  const size_t rows = (size_t)c->batch * HQ;
  CUDA_OK(cudaMalloc((void **)&d_out, rows * D * sizeof(float)));
  CUDA_OK(cudaMalloc((void **)&d_lse, rows * sizeof(float)));
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CUDA;
  p.device = g0->device;
  p.dtype = FD_DTYPE_BF16;
  p.out_dtype = FD_DTYPE_F32;
  p.batch = c->batch;
  p.num_heads_q = HQ;
  p.num_heads_kv = HKV;
  p.head_dim = D;
  p.page_size = PAGE;
  p.max_pages_per_seq = max_pages;
  p.num_pages = c->num_pages;
  fd_tensors t;
  memset(&t, 0, sizeof t);
  t.q = g0->q;
  t.k_cache = g_ref_k;
  t.v_cache = g_ref_v;
  t.kv_len = d_kv;
  t.block_table = d_bt;
  t.out = d_out;
  t.lse = d_lse;
  FD_OK(fd_decode(&p, &t, NULL, &err_));
  CUDA_OK(cudaMemcpy(out, d_out, rows * D * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse, d_lse, rows * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(d_bt));
  CUDA_OK(cudaFree(d_kv));
  CUDA_OK(cudaFree(d_out));
  CUDA_OK(cudaFree(d_lse));
  free(bt);
}

/* Every GPU's merged out / lse against the whole-cache decode; 0 = pass. */
static int check(const char *what, const host_cache *c, const int32_t *kv_len, gpu *gs) {
  const size_t rows = (size_t)c->batch * HQ, n = rows * D;
  float *want = malloc(n * sizeof(float)), *want_lse = malloc(rows * sizeof(float));
  float *got = malloc(n * sizeof(float)), *got_lse = malloc(rows * sizeof(float));
  float *first = malloc(n * sizeof(float));
  if (!want || !want_lse || !got || !got_lse || !first) exit(1);
  whole_cache(c, kv_len, &gs[0], want, want_lse);
  int fails = 0;
  double worst = 0, worst_lse = 0;
  for (int r = 0; r < g_gpus; r++) {
    CUDA_OK(cudaSetDevice(gs[r].device));
    CUDA_OK(cudaMemcpy(got, gs[r].out, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_lse, gs[r].lse, rows * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
      const double e = fabs((double)got[i] - want[i]);
      if (!(e <= worst)) worst = e; /* NaN shows */
    }
    for (size_t i = 0; i < rows; i++) {
      if (isinf(want_lse[i]) && want_lse[i] < 0) { /* a sequence with no key */
        if (!(isinf(got_lse[i]) && got_lse[i] < 0)) worst_lse = INFINITY;
        continue;
      }
      const double e = fabs((double)got_lse[i] - want_lse[i]);
      if (!(e <= worst_lse)) worst_lse = e;
    }
    if (r == 0) memcpy(first, got, n * sizeof(float));
    else if (memcmp(first, got, n * sizeof(float)) != 0) {
      printf("%s: GPU %d's merged out differs from GPU 0's (must be bitwise equal)\n", what, r);
      fails++;
    }
  }
  /* fp32 states and out: the two results differ only by fp32 summation
   * order (|V| <= 1, so absolute errors). */
  const double tol = 1e-4, tol_lse = 1e-4;
  printf("%s: %d GPU(s) x %d shard(s), batch %d, kv_len %d..%d: max |out - whole| = %.3g, "
         "max |lse - whole| = %.3g (tolerance %.0e)\n",
         what, g_gpus, g_local, c->batch, kv_len[c->batch - 1], kv_len[0], worst, worst_lse, tol);
  if (!(worst <= tol) || !(worst_lse <= tol_lse)) fails++;
  free(want);
  free(want_lse);
  free(got);
  free(got_lse);
  free(first);
  return fails;
}

static int parse_int(const char *flag, const char *s, int lo, int hi) {
  char *end;
  const long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "%s: '%s' is not an integer in %d..%d\n", flag, s, lo, hi);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  int batch = 4, kv_max = 8192, shards_per_gpu = 0, use_graph = 0, skip_status = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--batch")) batch = parse_int(a, v, 1, MAX_BATCH), i++;
    else if (!strcmp(a, "--kv-len")) kv_max = parse_int(a, v, 1, 1 << 22), i++;
    else if (!strcmp(a, "--shards-per-gpu")) shards_per_gpu = parse_int(a, v, 1, MAX_SHARDS), i++;
    else if (!strcmp(a, "--timeout")) g_timeout = parse_int(a, v, 1, 86400), i++;
    else if (!strcmp(a, "--skip-status")) skip_status = parse_int(a, v, 0, 255), i++;
    else if (!strcmp(a, "--graph")) use_graph = 1;
    else {
      fprintf(stderr, "usage: %s [--batch B] [--kv-len N] [--shards-per-gpu S] [--graph] "
                      "[--timeout SECONDS] [--skip-status N]\n", argv[0]);
      return 2;
    }
  }

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    printf("multi_gpu_decode: no GPU visible: nothing to run (needs 1+ GPUs of compute capability 8.0+; 2+ to "
           "exercise the exchange between GPUs)\n");
    return skip_status;
  }
  g_gpus = count < MAX_GPUS ? count : MAX_GPUS;
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    printf("multi_gpu_decode: the CUDA backend is not available here (a GPU below compute capability 8.0, or "
           "built without CUDA): nothing to run\n");
    return skip_status;
  }
  g_local = shards_per_gpu ? shards_per_gpu : (g_gpus == 1 ? 4 : 1);
  if (g_gpus == 1)
    printf("multi_gpu_decode: 1 GPU: the exchange between GPUs is not exercised; %d shards on GPU "
           "0 through a 1-rank communicator (the same code path)\n", g_local);

  /* The cache: sequence lengths from kv_max down, the last one empty when
   * batch >= 3 (every shard of it empty: lse -inf, a valid state). */
  host_cache c;
  memset(&c, 0, sizeof c);
  c.batch = batch;
  for (int b = 0; b < batch; b++)
    c.kv_len[b] = (batch >= 3 && b == batch - 1) ? 0 : (int32_t)((int64_t)kv_max * (batch - b) / batch);
  /* --graph replays on longer sequences: room for 1.25x in every one */
  int32_t kv_grow[MAX_BATCH];
  for (int b = 0; b < batch; b++) kv_grow[b] = c.kv_len[b] + c.kv_len[b] / 4 + (c.kv_len[b] ? 7 : 0);
  for (int b = 0; b < batch; b++) {
    c.first[b] = c.num_pages;
    c.num_pages += pages_of(kv_grow[b]) > 0 ? pages_of(kv_grow[b]) : 1;
  }
  const size_t pool = (size_t)c.num_pages * PAGE * HKV * D, nq = (size_t)batch * HQ * D;
  c.q = malloc(nq * 2);
  c.k = malloc(pool * 2);
  c.v = malloc(pool * 2);
  if (!c.q || !c.k || !c.v) return 1;
  for (size_t i = 0; i < nq; i++) c.q[i] = to_bf16(frand());
  for (size_t i = 0; i < pool; i++) c.k[i] = to_bf16(frand()), c.v[i] = to_bf16(frand());

  /* Shard tables are sized for the grown lengths (the graph's replay). */
  g_max_pages = 1;
  memcpy(g_kv_cap, kv_grow, sizeof g_kv_cap);
  for (int s = 0; s < g_gpus * g_local; s++) {
    shard sh;
    cut(&c, g_kv_cap, s, g_gpus * g_local, &sh);
    for (int b = 0; b < batch; b++)
      if (sh.hi[b] - sh.lo[b] > g_max_pages) g_max_pages = sh.hi[b] - sh.lo[b];
  }

  int devs[MAX_GPUS];
  for (int r = 0; r < g_gpus; r++) devs[r] = r;
  ncclComm_t comms[MAX_GPUS];
  const ncclResult_t nr = ncclCommInitAll(comms, g_gpus, devs);
  if (nr != ncclSuccess) {
    printf("multi_gpu_decode: ncclCommInitAll over %d GPU(s) failed: %s: nothing to run\n", g_gpus,
           ncclGetErrorString(nr));
    return skip_status ? skip_status : 1;
  }

  gpu gs[MAX_GPUS];
  memset(gs, 0, sizeof gs);
  for (int r = 0; r < g_gpus; r++) {
    gpu *g = &gs[r];
    g->device = r;
    CUDA_OK(cudaSetDevice(r));
    CUDA_OK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    g->q = dev_copy(c.q, nq * 2);
    /* this GPU's pool: the pages of its shards, shard after shard */
    const size_t page_elems = (size_t)PAGE * HKV * D;
    uint16_t *hk = malloc(pool * 2), *hv = malloc(pool * 2);
    if (!hk || !hv) return 1;
    g->num_pages = 0;
    for (int l = 0; l < g_local; l++) {
      shard sh;
      cut(&c, g_kv_cap, r * g_local + l, g_gpus * g_local, &sh);
      for (int b = 0; b < batch; b++) {
        g->base[l][b] = g->num_pages;
        for (int i = sh.lo[b]; i < sh.hi[b]; i++, g->num_pages++) {
          memcpy(hk + (size_t)g->num_pages * page_elems, c.k + (size_t)(c.first[b] + i) * page_elems, page_elems * 2);
          memcpy(hv + (size_t)g->num_pages * page_elems, c.v + (size_t)(c.first[b] + i) * page_elems, page_elems * 2);
        }
      }
    }
    g->k = dev_copy(hk, (size_t)g->num_pages * page_elems * 2);
    g->v = dev_copy(hv, (size_t)g->num_pages * page_elems * 2);
    free(hk);
    free(hv);
    if (r == 0) { /* the reference's copy of the whole cache */
      g_ref_k = dev_copy(c.k, pool * 2);
      g_ref_v = dev_copy(c.v, pool * 2);
    }
    for (int l = 0; l < g_local; l++) {
      CUDA_OK(cudaMalloc((void **)&g->bt[l], (size_t)batch * g_max_pages * sizeof(int32_t)));
      CUDA_OK(cudaMalloc((void **)&g->kv[l], (size_t)batch * sizeof(int32_t)));
    }
    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = FD_BACKEND_CUDA;
    p.device = r;
    p.dtype = FD_DTYPE_BF16;
    p.out_dtype = FD_DTYPE_F32; /* fp32 states: the merge loses nothing to rounding */
    p.batch = batch;
    p.num_heads_q = HQ;
    p.num_heads_kv = HKV;
    p.head_dim = D;
    p.page_size = PAGE;
    p.max_pages_per_seq = g_max_pages;
    p.num_pages = g->num_pages > 0 ? g->num_pages : 1;
    FD_OK(fd_plan_init(&g->plan, &p, &err_));
    CUDA_OK(cudaMalloc(&g->fd_ws, g->plan.workspace_size ? g->plan.workspace_size : 16));
    fd_nccl_problem np;
    memset(&np, 0, sizeof np);
    np.dtype = FD_DTYPE_F32;
    np.out_dtype = FD_DTYPE_F32; /* a server would ask for bf16 here */
    np.batch = batch;
    np.num_heads = HQ;
    np.head_dim = D;
    np.num_local_states = g_local;
    FD_OK(fd_nccl_plan_init(&g->nplan, &np, comms[r], &err_));
    CUDA_OK(cudaMalloc(&g->nccl_ws, g->nplan.workspace_size));
    CUDA_OK(cudaMalloc((void **)&g->out, (size_t)batch * HQ * D * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&g->lse, (size_t)batch * HQ * sizeof(float)));
    upload_tables(g, &c, c.kv_len, r);
  }

  /* fd_nccl_problem.check_shapes is not used here: its check synchronises
   * each rank's stream inside fd_nccl_gather, which a thread driving every
   * GPU from inside one group cannot do (it needs a thread or a process per
   * rank). The shapes agree by construction. */

  int fails = 0;
  step(gs, comms);
  wait_all(gs, comms);
  fails += check("eager", &c, c.kv_len, gs);

  if (use_graph) {
    /* Capture the step on every GPU's stream, then replay it on grown lengths. */
    for (int r = 0; r < g_gpus; r++) {
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaStreamBeginCapture(gs[r].stream, cudaStreamCaptureModeRelaxed));
    }
    step(gs, comms);
    for (int r = 0; r < g_gpus; r++) {
      cudaGraph_t graph;
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaStreamEndCapture(gs[r].stream, &graph));
      CUDA_OK(cudaGraphInstantiate(&gs[r].graph, graph, 0));
      CUDA_OK(cudaGraphDestroy(graph));
    }
    for (int r = 0; r < g_gpus; r++) {
      CUDA_OK(cudaSetDevice(r));
      upload_tables(&gs[r], &c, kv_grow, r);
      CUDA_OK(cudaMemsetAsync(gs[r].out, 0xff, (size_t)batch * HQ * D * sizeof(float), gs[r].stream));
    }
    for (int r = 0; r < g_gpus; r++) {
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaGraphLaunch(gs[r].graph, gs[r].stream));
    }
    wait_all(gs, comms);
    fails += check("graph replay, grown kv_len", &c, kv_grow, gs);
  }

  for (int r = 0; r < g_gpus; r++) {
    gpu *g = &gs[r];
    CUDA_OK(cudaSetDevice(r));
    if (g->graph) CUDA_OK(cudaGraphExecDestroy(g->graph));
    for (int l = 0; l < g_local; l++) {
      CUDA_OK(cudaFree(g->bt[l]));
      CUDA_OK(cudaFree(g->kv[l]));
    }
    CUDA_OK(cudaFree(g->q));
    CUDA_OK(cudaFree(g->k));
    CUDA_OK(cudaFree(g->v));
    if (r == 0) {
      CUDA_OK(cudaFree(g_ref_k));
      CUDA_OK(cudaFree(g_ref_v));
    }
    CUDA_OK(cudaFree(g->fd_ws));
    CUDA_OK(cudaFree(g->nccl_ws));
    CUDA_OK(cudaFree(g->out));
    CUDA_OK(cudaFree(g->lse));
    CUDA_OK(cudaStreamDestroy(g->stream));
    NCCL_OK(ncclCommDestroy(comms[r]));
  }
  free(c.q);
  free(c.k);
  free(c.v);
  printf("%s\n", fails ? "FAIL" : "PASS");
  return fails ? 1 : 0;
}
