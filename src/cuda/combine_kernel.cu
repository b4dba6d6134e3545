/*
 * combine_kernel.cu — merges the split kernel's partial states into out and lse.
 *
 * GRID  ceil(rows / 4) blocks of 128 threads, one warp per partial row
 *   row = (b * num_heads_q + h) * q_len + t. Lane i covers d = 4 * i + 128 * k.
 *   Only splits s < fd_active_splits(kv_len[b], chunk_len, num_splits) are
 *   read (the split kernel never writes the others):
 *     m* = max_s m_s,  w_s = exp(m_s - m*),  l* = sum_s w_s l_s,
 *     out = (sum_s w_s O_s) / l*,  lse = m* + log(l*).
 *   m_s is in natural-log units. A row with m* = -inf (no visible key) gets
 *   out = 0 and lse = -inf; w_s is never computed from (-inf) - (-inf).
 *   Sums run in a fixed order (lane-strided, then a butterfly; splits in
 *   order per element), so results are bitwise reproducible.
 */
#include <math.h>

#include "flashdecode.h"
#include "kernel_params.cuh"
#include "device_util.cuh"
#include "split.h"

#define FD_COMBINE_THREADS 128
#define FD_COMBINE_ROWS_PER_BLOCK (FD_COMBINE_THREADS / 32)

template <typename T>
__global__ void __launch_bounds__(FD_COMBINE_THREADS)
    fd_combine_kernel(const __grid_constant__ fd_kernel_params p) {
  __shared__ float s_w[FD_COMBINE_ROWS_PER_BLOCK][FD_MAX_SPLITS]; /* w_s per warp's row */
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = (int64_t)p.batch * p.num_heads_q * p.q_len;
  const int64_t row = (int64_t)blockIdx.x * FD_COMBINE_ROWS_PER_BLOCK + warp;
  if (row >= rows) return; /* whole warp; no block barrier below */

  const int t = (int)(row % p.q_len);
  const int h = (int)((row / p.q_len) % p.num_heads_q);
  const int b = (int)(row / ((int64_t)p.q_len * p.num_heads_q));
  const int S = p.num_splits;
  const int D = p.head_dim;

  int kv = p.kv_len[b];
  kv = kv < 0 ? 0 : (kv > p.kv_capacity ? p.kv_capacity : kv);
  const int active = fd_active_splits(kv, p.chunk_len, S);

  const float *ml = p.partial_ml + row * S * 2;
  const float *po = p.partial_o + row * S * D;
  float *w = s_w[warp];

  float m = -INFINITY;
  for (int s = lane; s < active; s += 32) m = fmaxf(m, ml[2 * s]);
  m = fd_warp_max(m);

  float l = 0.0f;
  if (m != -INFINITY) {
    for (int s = lane; s < active; s += 32) {
      const float ws = expf(ml[2 * s] - m); /* m_s = -inf gives 0 */
      w[s] = ws;
      l += ws * ml[2 * s + 1];
    }
  }
  l = fd_warp_sum(l);
  __syncwarp();

  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T *out = static_cast<T *>(p.out) + (int64_t)b * p.out_strides[0] +
           (int64_t)t * p.out_strides[1] + (int64_t)h * p.out_strides[2];
  for (int d = lane * 4; d < D; d += 128) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (l > 0.0f) {
#pragma unroll 4
      for (int s = 0; s < active; s++) {
        const float ws = w[s];
        const float4 x = *reinterpret_cast<const float4 *>(po + (int64_t)s * D + d);
        acc.x = fmaf(ws, x.x, acc.x);
        acc.y = fmaf(ws, x.y, acc.y);
        acc.z = fmaf(ws, x.z, acc.z);
        acc.w = fmaf(ws, x.w, acc.w);
      }
    }
    fd_store4(out + d, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
  }
  if (lane == 0 && p.lse)
    p.lse[(int64_t)b * p.lse_strides[0] + (int64_t)h * p.lse_strides[1] +
          (int64_t)t * p.lse_strides[2]] = l > 0.0f ? m + logf(l) : -INFINITY;
}

template <typename T>
static cudaError_t fd_combine_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  const int64_t rows = (int64_t)p->batch * p->num_heads_q * p->q_len;
  const int64_t blocks = (rows + FD_COMBINE_ROWS_PER_BLOCK - 1) / FD_COMBINE_ROWS_PER_BLOCK;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  fd_combine_kernel<T><<<(unsigned)blocks, FD_COMBINE_THREADS, 0, stream>>>(*p);
  return cudaGetLastError();
}

cudaError_t fd_combine_launch(const fd_kernel_params *p, cudaStream_t stream) {
  switch (p->dtype) {
    case FD_DTYPE_F32: return fd_combine_launch_instance<float>(p, stream);
    case FD_DTYPE_F16: return fd_combine_launch_instance<__half>(p, stream);
    case FD_DTYPE_BF16: return fd_combine_launch_instance<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}
