/*
 * check_kernels.cu — standalone GPU check of the split and combine kernels
 * (not part of the library; outside src/, CMake does not build it). Each case fills
 * random q/K/V, runs fd_split_launch (+ fd_combine_launch) directly with a
 * workspace and out pre-filled with NaN, and compares out and lse with a
 * float64 reference written from the header's definition; then runs again and
 * checks that the outputs are bitwise identical. Prints one line per case and
 * exits 1 on any failure.
 *
 * The split kernel is chosen as fd_cuda_run does: fp32 -> fd_split_launch
 * (CUDA cores), fp16/bf16 -> fd_split_mma_launch (tensor cores, the 4-warp
 * variant only: the library's GPU test grid runs both variants); the combine
 * is launched with programmatic dependent launch. Cases run on a created
 * stream; a few run on the legacy default stream as well.
 *
 * Build and run from the repository root on an sm_90 GPU:
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
 *     -Iinclude -Isrc dev/cuda/check_kernels.cu src/cuda/split_kernel.cu \
 *     src/cuda/split_mma_kernel.cu src/cuda/combine_kernel.cu -o /tmp/fd_check && /tmp/fd_check
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernel_params.cuh"
#include "dtype.h"
#include "flashdecode.h"

typedef struct check_case {
  const char *name;
  fd_dtype dtype;
  int head_dim, batch, q_len, num_heads_q, num_heads_kv;
  int capacity;   /* kv_capacity */
  int page_size;  /* 0 = contiguous */
  int num_splits;
  int kv_len[4];  /* [batch]; may exceed capacity (the kernel clamps) */
  int bad_pages;  /* paged: put invalid page ids into sequence 0's table */
  int head_major; /* contiguous: K/V stored [batch, heads, capacity, head_dim] */
} check_case;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rand_uniform(void) { /* [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Rounds x to the dtype, stores it at element i of buf, returns the stored value. */
static float store_elem(void *buf, int64_t i, fd_dtype dt, float x) {
  if (dt == FD_DTYPE_F32) {
    ((float *)buf)[i] = x;
    return x;
  }
  uint16_t h = dt == FD_DTYPE_F16 ? fd_f32_to_f16(x) : fd_f32_to_bf16(x);
  ((uint16_t *)buf)[i] = h;
  return dt == FD_DTYPE_F16 ? fd_f16_to_f32(h) : fd_bf16_to_f32(h);
}

static float load_elem(const void *buf, int64_t i, fd_dtype dt) {
  if (dt == FD_DTYPE_F32) return ((const float *)buf)[i];
  uint16_t h = ((const uint16_t *)buf)[i];
  return dt == FD_DTYPE_F16 ? fd_f16_to_f32(h) : fd_bf16_to_f32(h);
}

#define CK(call)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(2);                                                                     \
    }                                                                              \
  } while (0)

/* The split kernel fd_cuda_run would launch for kp's dtype. */
static cudaError_t launch_split(const fd_kernel_params *kp, cudaStream_t stream) {
  /* the 4-warp tensor-core kernel only; the library's test grid runs both */
  return kp->dtype == FD_DTYPE_F32 ? fd_split_launch(kp, stream) : fd_split_mma_launch(kp, 0, stream);
}

/* Runs one case on `stream`; prints its line (only on failure when quiet);
 * raises worst[dtype] to the case's worst output error (x tolerance). */
static int run_case(const check_case *c, cudaStream_t stream, int quiet, double worst_by_dtype[4]) {
  const fd_dtype dt = c->dtype;
  const size_t es = dt == FD_DTYPE_F32 ? 4 : 2;
  const int B = c->batch, Q = c->q_len, Hq = c->num_heads_q, Hk = c->num_heads_kv, D = c->head_dim;
  const int C = c->capacity, P = c->page_size, S = c->num_splits, G = Hq / Hk;
  const float scale = 1.0f / sqrtf((float)D);

  /* K/V storage and strides. */
  int max_pages = 0, num_pages = 0;
  int64_t kv_elems, ks[3];
  int32_t *table = NULL;
  if (P > 0) {
    max_pages = (C + P - 1) / P;
    num_pages = B * max_pages + 3;
    kv_elems = (int64_t)num_pages * P * Hk * D;
    ks[0] = (int64_t)P * Hk * D, ks[1] = (int64_t)Hk * D, ks[2] = D;
    table = (int32_t *)malloc(sizeof(int32_t) * B * max_pages);
    int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * num_pages);
    for (int i = 0; i < num_pages; i++) perm[i] = i;
    for (int i = num_pages - 1; i > 0; i--) { /* shuffle */
      int j = (int)((rand_uniform() + 1.0f) * 0.5f * (i + 1));
      if (j > i) j = i;
      int32_t x = perm[i];
      perm[i] = perm[j];
      perm[j] = x;
    }
    for (int i = 0; i < B * max_pages; i++) table[i] = perm[i];
    if (c->bad_pages) {
      table[0] = -1;
      if (max_pages > 2) table[2] = num_pages + 5;
    }
    free(perm);
  } else {
    kv_elems = (int64_t)B * C * Hk * D;
    if (c->head_major)
      ks[0] = (int64_t)Hk * C * D, ks[1] = D, ks[2] = (int64_t)C * D;
    else
      ks[0] = (int64_t)C * Hk * D, ks[1] = (int64_t)Hk * D, ks[2] = D;
  }
  const int64_t q_elems = (int64_t)B * Q * Hq * D;
  void *hq = malloc(q_elems * es), *hk = malloc(kv_elems * es), *hv = malloc(kv_elems * es);
  for (int64_t i = 0; i < q_elems; i++) store_elem(hq, i, dt, rand_uniform());
  for (int64_t i = 0; i < kv_elems; i++) {
    store_elem(hk, i, dt, rand_uniform());
    store_elem(hv, i, dt, rand_uniform());
  }

  /* Reference, float64. */
  double *ref_out = (double *)calloc(q_elems, sizeof(double));
  double *ref_lse = (double *)malloc(sizeof(double) * B * Hq * Q);
  double *sc = (double *)malloc(sizeof(double) * (C > 0 ? C : 1));
  for (int b = 0; b < B; b++) {
    int kv = c->kv_len[b] < 0 ? 0 : (c->kv_len[b] > C ? C : c->kv_len[b]);
    for (int t = 0; t < Q; t++) {
      for (int h = 0; h < Hq; h++) {
        const int hkv = h / G;
        const int n = kv - Q + t + 1;
        double mx = -INFINITY;
        for (int j = 0; j < n; j++) {
          int64_t base;
          sc[j] = -INFINITY;
          if (P > 0) {
            int32_t pg = table[b * max_pages + j / P];
            if (pg < 0 || pg >= num_pages) continue;
            base = pg * ks[0] + (int64_t)(j % P) * ks[1] + hkv * ks[2];
          } else {
            base = b * ks[0] + (int64_t)j * ks[1] + hkv * ks[2];
          }
          double dot = 0;
          for (int d = 0; d < D; d++)
            dot += (double)load_elem(hq, (((int64_t)b * Q + t) * Hq + h) * D + d, dt) *
                   (double)load_elem(hk, base + d, dt);
          sc[j] = (double)scale * dot;
          if (sc[j] > mx) mx = sc[j];
        }
        double *o = ref_out + (((int64_t)b * Q + t) * Hq + h) * D;
        double sum = 0;
        if (mx != -INFINITY) {
          for (int j = 0; j < n; j++) {
            if (sc[j] == -INFINITY) continue;
            double w = exp(sc[j] - mx);
            sum += w;
            int64_t base;
            if (P > 0)
              base = table[b * max_pages + j / P] * ks[0] + (int64_t)(j % P) * ks[1] + hkv * ks[2];
            else
              base = b * ks[0] + (int64_t)j * ks[1] + hkv * ks[2];
            for (int d = 0; d < D; d++) o[d] += w * (double)load_elem(hv, base + d, dt);
          }
          for (int d = 0; d < D; d++) o[d] /= sum;
        }
        ref_lse[((int64_t)b * Hq + h) * Q + t] = mx == -INFINITY ? -INFINITY : mx + log(sum);
      }
    }
  }

  /* Device buffers. */
  void *dq, *dk, *dv, *dout;
  float *dlse, *dpo = NULL, *dpml = NULL;
  int32_t *dkv, *dtable = NULL;
  const int64_t rows = (int64_t)B * Hq * Q;
  CK(cudaMalloc(&dq, q_elems * es));
  CK(cudaMalloc(&dk, kv_elems * es));
  CK(cudaMalloc(&dv, kv_elems * es));
  CK(cudaMalloc(&dout, q_elems * es));
  CK(cudaMalloc(&dlse, rows * sizeof(float)));
  CK(cudaMalloc(&dkv, B * sizeof(int32_t)));
  CK(cudaMemcpy(dq, hq, q_elems * es, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, hk, kv_elems * es, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv, kv_elems * es, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dkv, c->kv_len, B * sizeof(int32_t), cudaMemcpyHostToDevice));
  if (P > 0) {
    CK(cudaMalloc(&dtable, sizeof(int32_t) * B * max_pages));
    CK(cudaMemcpy(dtable, table, sizeof(int32_t) * B * max_pages, cudaMemcpyHostToDevice));
  }
  if (S > 1) {
    CK(cudaMalloc(&dpo, rows * S * D * sizeof(float)));
    CK(cudaMalloc(&dpml, rows * S * 2 * sizeof(float)));
  }

  fd_kernel_params kp;
  memset(&kp, 0, sizeof kp);
  kp.q = dq, kp.k_cache = dk, kp.v_cache = dv, kp.out = dout, kp.lse = dlse;
  kp.q_strides[0] = (int64_t)Q * Hq * D, kp.q_strides[1] = (int64_t)Hq * D, kp.q_strides[2] = D;
  memcpy(kp.out_strides, kp.q_strides, sizeof kp.q_strides);
  memcpy(kp.k_strides, ks, sizeof ks);
  memcpy(kp.v_strides, ks, sizeof ks);
  kp.lse_strides[0] = (int64_t)Hq * Q, kp.lse_strides[1] = Q, kp.lse_strides[2] = 1;
  kp.kv_len = dkv, kp.block_table = dtable, kp.block_table_stride = max_pages;
  kp.partial_o = dpo, kp.partial_ml = dpml;
  kp.dtype = dt, kp.batch = B, kp.q_len = Q, kp.num_heads_q = Hq, kp.num_heads_kv = Hk;
  kp.group = G, kp.head_dim = D, kp.page_size = P, kp.num_pages = P > 0 ? num_pages : 0;
  kp.kv_capacity = C, kp.chunk_len = 64, kp.num_splits = S;
  kp.scale_log2 = scale * 1.4426950408889634f;
  kp.pdl = 1; /* built for sm_90a only (see the nvcc line above): PDL as fd_run on an H200 */

  void *h_out[2];
  float *h_lse[2];
  for (int rep = 0; rep < 2; rep++) {
    CK(cudaMemset(dout, 0xff, q_elems * es)); /* NaN: every element must be written */
    CK(cudaMemset(dlse, 0xff, rows * sizeof(float)));
    if (S > 1) { /* NaN: unread by design where not written */
      CK(cudaMemset(dpo, 0xff, rows * S * D * sizeof(float)));
      CK(cudaMemset(dpml, 0xff, rows * S * 2 * sizeof(float)));
    }
    CK(launch_split(&kp, stream));
    if (S > 1) CK(fd_combine_launch(&kp, stream));
    CK(cudaStreamSynchronize(stream));
    h_out[rep] = malloc(q_elems * es);
    h_lse[rep] = (float *)malloc(rows * sizeof(float));
    CK(cudaMemcpy(h_out[rep], dout, q_elems * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h_lse[rep], dlse, rows * sizeof(float), cudaMemcpyDeviceToHost));
  }

  const double tol = dt == FD_DTYPE_F32 ? 1e-4 : (dt == FD_DTYPE_F16 ? 2e-3 : 1.6e-2);
  double worst = 0, worst_lse = 0;
  int bad = 0;
  for (int64_t i = 0; i < q_elems; i++) {
    double got = load_elem(h_out[0], i, dt), want = ref_out[i];
    double err = fabs(got - want) / (tol * (1.0 + fabs(want)));
    if (!(err <= 1.0)) bad++;
    if (err > worst || got != got) worst = got != got ? INFINITY : err;
  }
  for (int64_t i = 0; i < rows; i++) {
    double got = h_lse[0][i], want = ref_lse[i];
    double err;
    if (want == -INFINITY)
      err = got == -INFINITY ? 0 : INFINITY;
    else
      err = fabs(got - want) / (1e-4 * (1.0 + fabs(want)));
    if (!(err <= 1.0)) bad++;
    if (!(err <= worst_lse)) worst_lse = err;
  }
  if (!(worst <= worst_by_dtype[dt])) worst_by_dtype[dt] = worst;
  const int same = memcmp(h_out[0], h_out[1], q_elems * es) == 0 &&
                   memcmp(h_lse[0], h_lse[1], rows * sizeof(float)) == 0;
  if (!quiet || bad || !same)
    printf("%-4s %-34s dt=%d D=%3d B=%d q=%2d Hq=%2d Hkv=%d cap=%5d pg=%3d S=%4d%s "
         "out %.3f lse %.3f (x tol) %s\n",
         bad || !same ? "FAIL" : "ok", c->name, (int)dt, D, B, Q, Hq, Hk, C, P, S,
         stream ? "" : " legacy", worst, worst_lse, same ? "det" : "NOT DETERMINISTIC");

  for (int rep = 0; rep < 2; rep++) {
    free(h_out[rep]);
    free(h_lse[rep]);
  }
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dkv);
  if (dtable) cudaFree(dtable);
  if (dpo) cudaFree(dpo), cudaFree(dpml);
  free(hq), free(hk), free(hv), free(ref_out), free(ref_lse), free(sc), free(table);
  return bad == 0 && same;
}

int main(int argc, char **argv) {
  /* -q: print failures and the summary only; -s: also only the tensor-core
   * cases of small size (for compute-sanitizer runs); -r: a handful of
   * those (racecheck is slow). */
  const int race = argc > 1 && strcmp(argv[1], "-r") == 0; /* a handful, for racecheck */
  const int subset = race || (argc > 1 && strcmp(argv[1], "-s") == 0);
  const int quiet = subset || (argc > 1 && strcmp(argv[1], "-q") == 0);
  double worst[4] = {0, 0, 0, 0};
  static const fd_dtype dts[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  static const int dims[3] = {64, 128, 256};
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int fails = 0, total = 0;
#define RUN(c, st)                                  \
  do {                                              \
    total++;                                        \
    fails += !run_case(&(c), (st), quiet, worst);   \
  } while (0)
  for (int i = 0; i < 3 && !subset; i++) {
    for (int j = 0; j < 3; j++) {
      for (int s = 1; s <= 4; s += 3) {
        check_case c = {"base gqa4", dts[i], dims[j], 2, 1, 8, 2, 1000, 0, s, {1000, 517}, 0, 0};
        RUN(c, stream);
        check_case cp = {"paged16 q_len3", dts[i], dims[j], 2, 3, 8, 2, 700, 16, s, {700, 130}, 0, 0};
        RUN(cp, stream);
      }
    }
  }
  const check_case edge[] = {
      {"kv_len 0 and 1, no split", FD_DTYPE_BF16, 128, 2, 1, 8, 2, 256, 0, 1, {0, 1}, 0, 0},
      {"kv_len 0 and 1, 8 splits", FD_DTYPE_BF16, 128, 2, 1, 8, 2, 512, 0, 8, {0, 1}, 0, 0},
      {"kv_len 63/64/65", FD_DTYPE_F16, 128, 3, 1, 4, 4, 300, 0, 3, {63, 64, 65}, 0, 0},
      {"q_len 3, rows without keys", FD_DTYPE_BF16, 128, 2, 3, 8, 2, 300, 0, 2, {2, 65}, 0, 0},
      {"q_len 16, 128 rows (16 passes)", FD_DTYPE_BF16, 128, 2, 16, 8, 1, 400, 0, 2, {100, 16}, 0, 0},
      {"q_len 16 no split", FD_DTYPE_F32, 64, 2, 16, 4, 1, 400, 0, 1, {100, 7}, 0, 0},
      {"group 12 (2 passes)", FD_DTYPE_F16, 256, 1, 1, 12, 1, 900, 0, 3, {900}, 0, 0},
      {"MHA", FD_DTYPE_BF16, 128, 2, 1, 4, 4, 2000, 0, 5, {2000, 1999}, 0, 0},
      {"page_size 1", FD_DTYPE_BF16, 128, 2, 1, 8, 2, 300, 1, 3, {300, 130}, 0, 0},
      {"page_size 256", FD_DTYPE_F16, 128, 2, 2, 8, 2, 1100, 256, 3, {1100, 255}, 0, 0},
      {"page_size 48 (not a tile multiple)", FD_DTYPE_F32, 256, 2, 1, 4, 2, 500, 48, 4, {500, 97}, 0, 0},
      {"bad page ids masked", FD_DTYPE_BF16, 128, 2, 1, 8, 2, 400, 16, 2, {400, 100}, 1, 0},
      {"bad page ids, no split", FD_DTYPE_F32, 64, 1, 1, 2, 1, 40, 16, 1, {40}, 1, 0},
      {"splits > chunks", FD_DTYPE_BF16, 128, 2, 1, 8, 2, 200, 0, 64, {200, 10}, 0, 0},
      {"1024 splits", FD_DTYPE_F32, 128, 1, 1, 8, 1, 70000, 0, 1024, {65537}, 0, 0},
      {"kv_len > capacity clamps", FD_DTYPE_BF16, 64, 2, 1, 8, 8, 300, 0, 2, {350, -5}, 0, 0},
      {"head-major K/V layout", FD_DTYPE_F16, 128, 2, 2, 8, 2, 500, 0, 3, {500, 333}, 0, 1},
      {"long, group 8", FD_DTYPE_BF16, 128, 1, 1, 32, 4, 9000, 0, 7, {8999}, 0, 0},
      {"f32 d256 long", FD_DTYPE_F32, 256, 1, 1, 16, 2, 5000, 0, 6, {4999}, 0, 0},
  };
  for (size_t i = 0; i < sizeof edge / sizeof edge[0] && !subset; i++) RUN(edge[i], stream);

  /* Tensor-core kernel: every 16-bit dtype x head_dim over groups 1/4/8/12,
   * q_len 1/3/16, pages 1/16/256, splits 1/4/>chunks/1024, kv_len 0/1/63/65. */
  for (int i = 1; i < 3; i++) {
    for (int j = 0; j < 3; j++) {
      const fd_dtype dt = dts[i];
      const int D = dims[j];
      const check_case mc[] = {
          {"mma g8 q1 no split", dt, D, 2, 1, 16, 2, 1000, 0, 1, {1000, 333}, 0, 0},
          {"mma g8 q1 4 splits", dt, D, 2, 1, 16, 2, 1000, 0, 4, {1000, 333}, 0, 0},
          {"mma MHA g1 q1", dt, D, 2, 1, 4, 4, 700, 0, 3, {700, 64}, 0, 0},
          {"mma g12 q1 paged16", dt, D, 1, 1, 12, 1, 900, 16, 5, {900}, 0, 0},
          {"mma g1 q16 paged256", dt, D, 2, 16, 2, 2, 1100, 256, 3, {1100, 20}, 0, 0},
          {"mma g8 q3 (2 passes) page1", dt, D, 2, 3, 16, 2, 300, 1, 2, {300, 70}, 0, 0},
          {"mma g4 q3 kv 0/1/63/65", dt, D, 4, 3, 8, 2, 200, 0, 4, {0, 1, 63, 65}, 0, 0},
          {"mma g4 q1 kv 0/1/63/65 no split", dt, D, 4, 1, 8, 2, 200, 0, 1, {0, 1, 63, 65}, 0, 0},
          {"mma bad pages q2", dt, D, 2, 2, 8, 2, 400, 16, 2, {400, 100}, 1, 0},
          {"mma bad pages no split", dt, D, 1, 1, 8, 1, 100, 16, 1, {100}, 1, 0},
          {"mma splits > chunks", dt, D, 2, 1, 8, 1, 200, 0, 64, {200, 10}, 0, 0},
          {"mma head-major q2", dt, D, 2, 2, 8, 2, 500, 0, 3, {500, 333}, 0, 1},
          {"mma long no split", dt, D, 1, 1, 8, 1, 5000, 0, 1, {4999}, 0, 0},
          {"mma g8 q16 (8 passes) 3 splits", dt, D, 1, 16, 8, 1, 600, 0, 3, {600}, 0, 0},
      };
      for (size_t k = 0; k < sizeof mc / sizeof mc[0]; k++) {
        /* racecheck: 4 splits, 2 passes + page 1, bad pages; bf16 and f16 d128 */
        if (race && !(k == 1 || k == 5 || k == 8) && !(i == 1 && j == 1 && k == 4)) continue;
        if (race && i == 1 && j != 1) continue;
        RUN(mc[k], stream);
      }
    }
  }
  const check_case big[] = {
      {"mma 1024 splits bf16", FD_DTYPE_BF16, 128, 1, 1, 8, 1, 70000, 0, 1024, {65537}, 0, 0},
      {"mma 1024 splits f16 d256 q2", FD_DTYPE_F16, 256, 1, 2, 4, 1, 66000, 0, 1024, {65600}, 0, 0},
      {"mma long g4 d64 paged64", FD_DTYPE_BF16, 64, 2, 1, 16, 4, 20000, 64, 9, {20000, 12345}, 0, 0},
  };
  if (!subset) {
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) RUN(big[i], stream);
    /* The legacy default stream (PDL attribute there too). */
    RUN(edge[1], (cudaStream_t)0);
    check_case c = {"mma legacy stream", FD_DTYPE_F16, 128, 2, 2, 8, 2, 900, 16, 4, {900, 500}, 0, 0};
    RUN(c, (cudaStream_t)0);
  }
#undef RUN
  printf("%d of %d cases passed; worst out error (x tol): f32 %.3f f16 %.3f bf16 %.3f\n",
         total - fails, total, worst[FD_DTYPE_F32], worst[FD_DTYPE_F16], worst[FD_DTYPE_BF16]);
  CK(cudaStreamDestroy(stream));
  return fails ? 1 : 0;
}
