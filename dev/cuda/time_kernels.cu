/*
 * time_kernels.cu — standalone GPU timing of the split kernels (not part of
 * the library; outside src/, CMake does not build it). For each shape it makes the
 * library's plan (fd_plan_init, automatic splits), then times
 *   new: fd_cuda_run (fp16/bf16 -> tensor-core split kernel + PDL combine)
 *   old: the CUDA-core split kernel (fd_split_launch) + the same combine
 * as CUDA graphs of R back-to-back calls rotating over buffer sets that
 * together exceed 256 MB (cold L2), CUDA events around each replay, median of
 * the replays. It first measures the read ceiling (16-byte loads over 4 GB)
 * and checks, on the timed configuration, that new and old agree and that new
 * is bitwise reproducible. Prints one line per shape.
 *
 * Build and run from the repository root on an sm_90 GPU:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
 *     -Iinclude -Isrc dev/cuda/time_kernels.cu src/cuda/split_kernel.cu \
 *     src/cuda/split_mma_kernel.cu src/cuda/combine_kernel.cu src/cuda/cuda_backend.cu \
 *     src/plan.c src/errors.c -o /tmp/fd_time && /tmp/fd_time
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernel_params.cuh"
#include "flashdecode.h"
#include "internal.h"

#define CK(call)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(2);                                                                        \
    }                                                                                 \
  } while (0)

/* plan.c needs these (api.c and the CPU backend are not linked in). */
extern "C" int fd_cpu_default_threads(void) { return 1; }
extern "C" size_t fd_dtype_size(fd_dtype dtype) {
  return dtype == FD_DTYPE_F32 ? 4 : (dtype == FD_DTYPE_F16 || dtype == FD_DTYPE_BF16 ? 2 : 0);
}

#define ROTATION_BYTES (256.0 * 1048576.0)
#define MIN_CALLS 50
#define REPLAYS 9

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* ---- random fill and the read ceiling ---- */

__global__ void fill_random16(uint16_t *dst, size_t n, uint32_t seed, int bf16) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float f = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f; /* [-1, 1) */
    uint16_t h;
    if (bf16) {
      const __nv_bfloat16 v = __float2bfloat16_rn(f);
      memcpy(&h, &v, 2);
    } else {
      const __half v = __float2half_rn(f);
      memcpy(&h, &v, 2);
    }
    dst[i] = h;
  }
}

__global__ void read_ceiling_kernel(const uint4 *src, size_t n, uint32_t *sink) {
  uint32_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
           d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = src[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

static double read_ceiling(cudaStream_t stream, int sms) {
  const size_t bytes = (size_t)4 << 30;
  void *buf;
  uint32_t *sink;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(buf, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float t[REPLAYS];
  for (int r = -2; r < REPLAYS; r++) {
    CK(cudaEventRecord(e0, stream));
    read_ceiling_kernel<<<sms * 4, 512, 0, stream>>>((const uint4 *)buf, bytes / 16, sink);
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
  }
  qsort(t, REPLAYS, sizeof(float), cmp_float);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(buf));
  CK(cudaFree(sink));
  return bytes / (t[REPLAYS / 2] * 1e-3) / 1e12;
}

/* ---- one shape ---- */

typedef struct shape {
  const char *name;
  fd_dtype dtype;
  int batch, num_heads_q, num_heads_kv, head_dim, kv_len, page_size;
} shape;

typedef struct shape_bufs {
  int n_sets;
  fd_tensors *t;       /* [n_sets] */
  fd_kernel_params *kp; /* [n_sets], the old path's parameters */
} shape_bufs;

/* What fd_cuda_run puts into the kernel parameters (cuda_backend.cu). */
static void fill_params(fd_kernel_params *kp, const fd_plan *plan, const fd_tensors *t,
                        void *workspace) {
  const fd_problem *pr = &plan->problem;
  memset(kp, 0, sizeof *kp);
  kp->q = t->q, kp->k_cache = t->k_cache, kp->v_cache = t->v_cache;
  kp->out = t->out, kp->lse = t->lse;
  for (int i = 0; i < 3; i++) {
    kp->q_strides[i] = t->q_strides[i], kp->k_strides[i] = t->k_strides[i];
    kp->v_strides[i] = t->v_strides[i], kp->out_strides[i] = t->out_strides[i];
    kp->lse_strides[i] = t->lse_strides[i];
  }
  kp->kv_len = t->kv_len;
  kp->block_table = pr->page_size > 0 ? t->block_table : NULL;
  kp->block_table_stride = t->block_table_stride;
  if (plan->num_splits > 1) {
    kp->partial_o = (float *)((char *)workspace + plan->ws_partial_o);
    kp->partial_ml = (float *)((char *)workspace + plan->ws_partial_ml);
  }
  kp->dtype = (int32_t)pr->dtype, kp->batch = pr->batch, kp->q_len = pr->q_len;
  kp->num_heads_q = pr->num_heads_q, kp->num_heads_kv = pr->num_heads_kv;
  kp->group = pr->num_heads_q / pr->num_heads_kv, kp->head_dim = pr->head_dim;
  kp->page_size = pr->page_size, kp->num_pages = pr->page_size > 0 ? pr->num_pages : 0;
  kp->kv_capacity = plan->kv_capacity, kp->chunk_len = plan->chunk_len;
  kp->num_splits = plan->num_splits;
  kp->scale_log2 = plan->softmax_scale * 1.4426950408889634f;
  kp->pdl = 1; /* built for sm_90a only: PDL as fd_run on an H200 */
}

/* One call. mode 0: the library path (fd_cuda_run); 1: old = CUDA-core
 * split + combine; 2: the tensor-core split kernel alone (no combine). */
static void call(int mode, const fd_plan *plan, const fd_tensors *t,
                 const fd_kernel_params *kp, void *ws, cudaStream_t stream) {
  if (mode == 1) {
    CK(fd_split_launch(kp, stream));
    if (kp->num_splits > 1) CK(fd_combine_launch(kp, stream));
  } else if (mode == 2) {
    CK(fd_split_mma_launch(kp, 0, stream));
  } else {
    fd_error err;
    if (fd_cuda_run(plan, t, ws, stream, &err) != FD_STATUS_OK) {
      printf("fd_cuda_run: %s\n", err.message);
      exit(2);
    }
  }
}

/* Median µs per call over REPLAYS replays of a graph of `calls` calls. */
static double time_graph(int mode, const fd_plan *plan, const shape_bufs *sb, void *ws,
                         int calls, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; i++)
    call(mode, plan, &sb->t[i % sb->n_sets], &sb->kp[i % sb->n_sets], ws, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float ms[REPLAYS];
  for (int r = -1; r < REPLAYS; r++) {
    CK(cudaEventRecord(e0, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    if (r >= 0) CK(cudaEventElapsedTime(&ms[r], e0, e1));
  }
  qsort(ms, REPLAYS, sizeof(float), cmp_float);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms[REPLAYS / 2] * 1e3 / calls;
}

static double max_abs_diff16(const uint16_t *a, const uint16_t *b, size_t n, int bf16) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    float x, y;
    if (bf16) {
      uint32_t ux = (uint32_t)a[i] << 16, uy = (uint32_t)b[i] << 16;
      memcpy(&x, &ux, 4);
      memcpy(&y, &uy, 4);
    } else {
      __half hx, hy;
      memcpy(&hx, &a[i], 2);
      memcpy(&hy, &b[i], 2);
      x = __half2float(hx);
      y = __half2float(hy);
    }
    const double d = fabs((double)x - (double)y);
    if (!(d <= worst)) worst = d; /* NaN propagates */
  }
  return worst;
}

static void run_shape(const shape *sh, double ceiling, int sms, cudaStream_t stream,
                      int forced_splits, int sweep) {
  const int B = sh->batch, Hq = sh->num_heads_q, Hk = sh->num_heads_kv, D = sh->head_dim;
  const int N = sh->kv_len, P = sh->page_size;
  const int bf16 = sh->dtype == FD_DTYPE_BF16;
  const size_t es = 2;

  fd_problem pr;
  memset(&pr, 0, sizeof pr);
  pr.backend = FD_BACKEND_CUDA;
  pr.dtype = sh->dtype;
  pr.batch = B;
  pr.q_len = 1;
  pr.num_heads_q = Hq;
  pr.num_heads_kv = Hk;
  pr.head_dim = D;
  pr.kv_capacity = N;
  pr.num_splits = forced_splits;
  int pages_per_seq = 0;
  if (P > 0) {
    pages_per_seq = (N + P - 1) / P;
    pr.page_size = P;
    pr.max_pages_per_seq = pages_per_seq;
    pr.num_pages = B * pages_per_seq;
  }
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &pr, &err) != FD_STATUS_OK) {
    printf("%s: fd_plan_init: %s\n", sh->name, err.message);
    exit(2);
  }

  /* K+V bytes of one call, as the benchmark counts them. */
  const double kv_bytes = 2.0 * B * (double)N * Hk * D * es;
  const size_t cache_elems = P > 0 ? (size_t)B * pages_per_seq * P * Hk * D : (size_t)B * N * Hk * D;
  const size_t set_bytes = 2 * cache_elems * es;
  int n_sets = (int)ceil(ROTATION_BYTES / (double)set_bytes);
  if (n_sets < 2) n_sets = 2;
  const int calls = n_sets > MIN_CALLS ? n_sets : (MIN_CALLS + n_sets - 1) / n_sets * n_sets;

  char *pool;
  CK(cudaMalloc(&pool, set_bytes * n_sets));
  fill_random16<<<sms * 8, 256, 0, stream>>>((uint16_t *)pool, set_bytes * n_sets / 2, 12345u, bf16);
  const size_t q_elems = (size_t)B * Hq * D;
  void *q, *out_new, *out_old, *ws = NULL;
  float *lse;
  int32_t *kv_len, *table = NULL;
  CK(cudaMalloc(&q, q_elems * es));
  CK(cudaMalloc(&out_new, q_elems * es));
  CK(cudaMalloc(&out_old, q_elems * es));
  CK(cudaMalloc(&lse, (size_t)B * Hq * sizeof(float)));
  CK(cudaMalloc(&kv_len, B * sizeof(int32_t)));
  fill_random16<<<64, 256, 0, stream>>>((uint16_t *)q, q_elems, 777u, bf16);
  if (plan.workspace_size) CK(cudaMalloc(&ws, plan.workspace_size));
  {
    int32_t *h = (int32_t *)malloc(B * sizeof(int32_t));
    for (int b = 0; b < B; b++) h[b] = N;
    CK(cudaMemcpy(kv_len, h, B * sizeof(int32_t), cudaMemcpyHostToDevice));
    free(h);
  }
  if (P > 0) { /* a shuffled page pool */
    const int np = B * pages_per_seq;
    int32_t *h = (int32_t *)malloc(np * sizeof(int32_t));
    for (int i = 0; i < np; i++) h[i] = i;
    uint64_t st = 0x243f6a8885a308d3ull;
    for (int i = np - 1; i > 0; i--) {
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      const int j = (int)(st % (uint64_t)(i + 1));
      const int32_t x = h[i];
      h[i] = h[j];
      h[j] = x;
    }
    CK(cudaMalloc(&table, np * sizeof(int32_t)));
    CK(cudaMemcpy(table, h, np * sizeof(int32_t), cudaMemcpyHostToDevice));
    free(h);
  }

  shape_bufs sb;
  sb.n_sets = n_sets;
  sb.t = (fd_tensors *)calloc(n_sets, sizeof(fd_tensors));
  sb.kp = (fd_kernel_params *)calloc(n_sets, sizeof(fd_kernel_params));
  for (int i = 0; i < n_sets; i++) {
    fd_tensors *t = &sb.t[i];
    t->q = q;
    t->q_strides[0] = (int64_t)Hq * D, t->q_strides[1] = (int64_t)Hq * D, t->q_strides[2] = D;
    t->k_cache = pool + set_bytes * i;
    t->v_cache = pool + set_bytes * i + set_bytes / 2;
    const int64_t rows = P > 0 ? P : N;
    t->k_strides[0] = rows * Hk * D, t->k_strides[1] = (int64_t)Hk * D, t->k_strides[2] = D;
    memcpy(t->v_strides, t->k_strides, sizeof t->k_strides);
    t->kv_len = kv_len;
    t->block_table = table;
    t->block_table_stride = pages_per_seq;
    t->out = out_new;
    memcpy(t->out_strides, t->q_strides, sizeof t->q_strides);
    t->lse = lse;
    t->lse_strides[0] = Hq, t->lse_strides[1] = 1, t->lse_strides[2] = 1;
    fill_params(&sb.kp[i], &plan, t, ws);
    sb.kp[i].out = out_old;
  }
  CK(cudaStreamSynchronize(stream));

  /* Correctness of the timed configuration: new vs old, new twice. */
  uint16_t *h_new = (uint16_t *)malloc(q_elems * es), *h_new2 = (uint16_t *)malloc(q_elems * es);
  uint16_t *h_old = (uint16_t *)malloc(q_elems * es);
  call(0, &plan, &sb.t[0], &sb.kp[0], ws, stream);
  CK(cudaMemcpyAsync(h_new, out_new, q_elems * es, cudaMemcpyDeviceToHost, stream));
  call(1, &plan, &sb.t[0], &sb.kp[0], ws, stream);
  CK(cudaMemcpyAsync(h_old, out_old, q_elems * es, cudaMemcpyDeviceToHost, stream));
  CK(cudaMemsetAsync(out_new, 0xff, q_elems * es, stream));
  call(0, &plan, &sb.t[0], &sb.kp[0], ws, stream);
  CK(cudaMemcpyAsync(h_new2, out_new, q_elems * es, cudaMemcpyDeviceToHost, stream));
  CK(cudaStreamSynchronize(stream));
  const double diff = max_abs_diff16(h_new, h_old, q_elems, bf16);
  const int det = memcmp(h_new, h_new2, q_elems * es) == 0;

  const double us_new = time_graph(0, &plan, &sb, ws, calls, stream);
  const double us_old = sweep ? 0.0 : time_graph(1, &plan, &sb, ws, calls, stream);
  const double us_split = sweep ? 0.0 : time_graph(2, &plan, &sb, ws, calls, stream);
  const double tb_new = kv_bytes / (us_new * 1e-6) / 1e12;
  const double tb_old = sweep ? 0.0 : kv_bytes / (us_old * 1e-6) / 1e12;
  if (sweep)
    printf("  %-28s S=%4d new %8.2f us %5.2f TB/s %5.1f%%\n", sh->name, plan.num_splits, us_new,
           tb_new, 100.0 * tb_new / ceiling);
  else
    printf("%-26s %7.1fMB S=%4d old %8.2fus %5.2fTB/s | new %8.2fus %5.2fTB/s %5.1f%% "
           "(split only %8.2fus) floor %7.2fus | diff %.1e %s\n",
           sh->name, kv_bytes / 1e6, plan.num_splits, us_old, tb_old, us_new, tb_new,
           100.0 * tb_new / ceiling, us_split, kv_bytes / (ceiling * 1e12) * 1e6, diff,
           det && diff < 2e-2 ? "ok" : (det ? "DIFF" : "NONDET"));
  fflush(stdout);

  free(h_new), free(h_new2), free(h_old), free(sb.t), free(sb.kp);
  CK(cudaFree(pool));
  CK(cudaFree(q));
  CK(cudaFree(out_new));
  CK(cudaFree(out_old));
  CK(cudaFree(lse));
  CK(cudaFree(kv_len));
  if (ws) CK(cudaFree(ws));
  if (table) CK(cudaFree(table));
}

int main(int argc, char **argv) {
  /* -n TAG: the tensor-core path only, every shape, no sweep (build variants). */
  const int new_only = argc > 1 && strcmp(argv[1], "-n") == 0;
  const char *tag = new_only && argc > 2 ? argv[2] : "";
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double ceiling = read_ceiling(stream, sms);
  printf("%sread ceiling %.3f TB/s (4 GB, 16-byte loads), %d SMs\n", tag, ceiling, sms);
  if (!new_only) {
    int occ[2][3];
    const int dims[3] = {64, 128, 256};
    for (int d = 0; d < 3; d++) {
      CK(fd_split_mma_occupancy(FD_DTYPE_F16, dims[d], &occ[0][d]));
      CK(fd_split_mma_occupancy(FD_DTYPE_BF16, dims[d], &occ[1][d]));
    }
    printf("mma kernel blocks/SM: f16 d64/128/256 = %d/%d/%d, bf16 = %d/%d/%d\n", occ[0][0],
           occ[0][1], occ[0][2], occ[1][0], occ[1][1], occ[1][2]);
  }
  const shape shapes[] = {
      {"B1 32/8 d128 1k", FD_DTYPE_BF16, 1, 32, 8, 128, 1024, 0},
      {"B1 32/8 d128 4k", FD_DTYPE_BF16, 1, 32, 8, 128, 4096, 0},
      {"B1 32/8 d128 16k", FD_DTYPE_BF16, 1, 32, 8, 128, 16384, 0},
      {"B1 32/8 d128 64k", FD_DTYPE_BF16, 1, 32, 8, 128, 65536, 0},
      {"B1 32/8 d128 128k", FD_DTYPE_BF16, 1, 32, 8, 128, 131072, 0},
      {"B1 64/8 d128 32k", FD_DTYPE_BF16, 1, 64, 8, 128, 32768, 0},
      {"B64 32/8 d128 8k", FD_DTYPE_BF16, 64, 32, 8, 128, 8192, 0},
      {"B1 32/32 d128 16k (MHA)", FD_DTYPE_BF16, 1, 32, 32, 128, 16384, 0},
      {"B16 8/1 d128 32k (MQA)", FD_DTYPE_BF16, 16, 8, 1, 128, 32768, 0},
      {"B1 16/8 d256 16k", FD_DTYPE_BF16, 1, 16, 8, 256, 16384, 0},
      {"B1 32/32 d64 16k", FD_DTYPE_BF16, 1, 32, 32, 64, 16384, 0},
      {"B1 32/8 d128 16k f16", FD_DTYPE_F16, 1, 32, 8, 128, 16384, 0},
      {"B1 32/8 d128 16k paged16", FD_DTYPE_BF16, 1, 32, 8, 128, 16384, 16},
      {"B8 32/8 d128 8k", FD_DTYPE_BF16, 8, 32, 8, 128, 8192, 0},
      {"B32 32/8 d128 4k", FD_DTYPE_BF16, 32, 32, 8, 128, 4096, 0},
      {"B128 32/8 d128 1k", FD_DTYPE_BF16, 128, 32, 8, 128, 1024, 0},
      {"B1 32/8 d128 16k paged64", FD_DTYPE_BF16, 1, 32, 8, 128, 16384, 64},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    if (new_only) printf("%s", tag);
    run_shape(&shapes[i], ceiling, sms, stream, 0, new_only);
  }
  if (!new_only) {
    /* Forced split counts (new path): the automatic count against one that
     * fills every slot of 2 blocks per SM, and a few others. */
    printf("split sweep (new):\n");
    const int sweep[][2] = {{1, 16}, {1, 32}, {2, 16}, {2, 33}, {2, 40}, {3, 33}, {3, 66},
                            {4, 33}, {4, 66}, {5, 33}, {7, 8}, {8, 16}, {9, 33}, {0, 8}};
    for (size_t i = 0; i < sizeof sweep / sizeof sweep[0]; i++)
      run_shape(&shapes[sweep[i][0]], ceiling, sms, stream, sweep[i][1], 1);
  }
  CK(cudaStreamDestroy(stream));
  return 0;
}
