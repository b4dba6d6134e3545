/*
 * combine_row.cuh — merging the split partials of one query row (one warp),
 * and the split kernels' last step that does it for a (sequence, kv head)
 * once its last split block has finished (the combine inside the split
 * kernel: one launch per call). Used by combine_kernel.cu (the separate
 * combine, -DFD_FUSED_COMBINE=0) and by split_kernel.cu /
 * split_mma_kernel.cuh (fd_split_tail). Internal to src/cuda.
 *
 * Per row, over the active splits s (fd_seq_active_splits):
 *   m* = max_s m_s,  w_s = exp(m_s - m*),  l* = sum_s w_s l_s,
 *   out = (sum_s w_s O_s) / l*,  lse = m* + log(l*).
 * m_s is in natural-log units. A row with m* = -inf (no visible key) gets
 * out = 0 and lse = -inf; w_s is never computed from (-inf) - (-inf). A
 * split whose m or l is NaN (the split kernels make l NaN for a blow-up)
 * makes the row NaN. Sinks join l* in the last step (fd_finish_row). Sums
 * run in a fixed order (lane-strided, then a butterfly; splits in order per
 * element), so results are bitwise reproducible whichever block merges.
 * Partials are read with ld.global.cg (L2, not L1): in the fused tail they
 * were written by other blocks of the same grid.
 */
#ifndef FD_CUDA_COMBINE_ROW_CUH
#define FD_CUDA_COMBINE_ROW_CUH

#include <math.h>

#include "flashdecode.h"
#include "kernel_params.cuh"
#include "device_util.cuh"
#include "split.h"

#define FD_COMBINE_BATCH 16 /* partial O loads in flight per lane */

/* Splits of sequence b with keys (the others write no partials). */
static __device__ __forceinline__ int fd_combine_active(const fd_kernel_params &p, int b) {
  int kv = __ldg(p.kv_len + b);
  kv = kv < 0 ? 0 : (kv > p.kv_capacity ? p.kv_capacity : kv);
  return fd_seq_active_splits(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits,
                              p.split_len_fixed);
}

/* Partial row `row` = (b * num_heads_q + h) * q_len + t of `active` splits
 * into out (TO: the out type) and lse. One whole warp calls it; w: the
 * warp's FD_MAX_SPLITS floats of shared memory. No block barrier. */
template <typename TO>
static __device__ __forceinline__ void fd_combine_row(const fd_kernel_params &p, int64_t row,
                                                      int active, float *w) {
  const int lane = threadIdx.x & 31;
  const int t = (int)(row % p.q_len);
  const int h = (int)((row / p.q_len) % p.num_heads_q);
  const int b = (int)(row / ((int64_t)p.q_len * p.num_heads_q));
  const int S = p.num_splits;
  const int D = p.head_dim;
  const float *ml = p.partial_ml + row * S * 2;
  const float *po = p.partial_o + row * S * D;

  /* The first batch of partial O (columns d = 4 lane, the first
   * FD_COMBINE_BATCH splits) is loaded together with (m, l): one L2 round
   * trip before the sums instead of two. */
  float4 x[FD_COMBINE_BATCH];
#pragma unroll
  for (int i = 0; i < FD_COMBINE_BATCH; i++)
    if (lane * 4 < D && i < active)
      x[i] = __ldcg(reinterpret_cast<const float4 *>(po + (int64_t)i * D + lane * 4));

  float2 ms0 = make_float2(-INFINITY, 0.0f); /* (m, l) of split `lane` (the common case) */
  if (lane < active) ms0 = __ldcg(reinterpret_cast<const float2 *>(ml + 2 * lane));
  float m = ms0.x;
  bool blown = isnan(ms0.x) || isnan(ms0.y); /* a split's blow-up: the row is NaN */
  for (int s = lane + 32; s < active; s += 32) {
    const float2 ms = __ldcg(reinterpret_cast<const float2 *>(ml + 2 * s));
    m = fmaxf(m, ms.x);
    blown = blown || isnan(ms.x) || isnan(ms.y);
  }
  m = fd_warp_max(m);
  blown = __any_sync(0xffffffffu, blown);

  float l = 0.0f;
  __syncwarp(); /* the warp's previous row has read w */
  if (m != -INFINITY) {
    for (int s = lane; s < active; s += 32) {
      const float2 ms = s == lane ? ms0 : __ldcg(reinterpret_cast<const float2 *>(ml + 2 * s));
      const float ws = expf(ms.x - m); /* m_s = -inf gives 0 */
      w[s] = ws;
      l += ws * ms.y;
    }
  }
  l = fd_warp_sum(l);
  if (blown) l = __int_as_float(0x7fc00000);
  __syncwarp();

  /* the row's last step (the sink joins l when there is one) */
  float inv, lse;
  fd_finish_row(m, l, p.sinks != nullptr, p.sinks ? p.sinks[h] : 0.0f, &inv, &lse);
  TO *out = static_cast<TO *>(p.out) + (int64_t)b * p.out_strides[0] +
            (int64_t)t * p.out_strides[1] + (int64_t)h * p.out_strides[2];
  for (int d = lane * 4; d < D; d += 128) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (l > 0.0f && inv == inv) {
      for (int s0 = 0; s0 < active; s0 += FD_COMBINE_BATCH) {
        if (s0 != 0 || d != lane * 4) { /* else loaded above */
#pragma unroll
          for (int i = 0; i < FD_COMBINE_BATCH; i++)
            if (s0 + i < active)
              x[i] = __ldcg(reinterpret_cast<const float4 *>(po + (int64_t)(s0 + i) * D + d));
        }
#pragma unroll
        for (int i = 0; i < FD_COMBINE_BATCH; i++) {
          if (s0 + i < active) { /* splits in order: the same sums as one at a time */
            const float ws = w[s0 + i];
            acc.x = fmaf(ws, x[i].x, acc.x);
            acc.y = fmaf(ws, x[i].y, acc.y);
            acc.z = fmaf(ws, x[i].z, acc.z);
            acc.w = fmaf(ws, x[i].w, acc.w);
          }
        }
      }
    }
    const float4 v = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    fd_store4(out + d, v);
  }
  if (lane == 0 && p.lse)
    p.lse[(int64_t)b * p.lse_strides[0] + (int64_t)h * p.lse_strides[1] +
          (int64_t)t * p.lse_strides[2]] = lse;
}

/* The fused combine (p.counters set, num_splits > 1): called by every block
 * of a split kernel after its last pass (every thread; NTHREADS of them;
 * smem: at least NTHREADS / 32 * FD_MAX_SPLITS floats the block no longer
 * needs). A block whose split has keys counts itself in the (b, hk)
 * counter; the one that completes the count (atomicInc wraps it back to 0:
 * the counters are zero again when the call ends) merges the rows of
 * (b, hk), one warp a row. A sequence without active splits (no keys) has
 * its rows written (out 0, lse -inf, or the sink's) by split 0's block,
 * which counts nothing. has_keys: this block's split had keys. */
template <typename T, int NTHREADS>
static __device__ __noinline__ void fd_split_tail(const fd_kernel_params &p, int b, int hk,
                                                     int split, bool has_keys, float *smem) {
  __shared__ int s_last;
  const int active = fd_combine_active(p, b);
  if (active == 0) {
    if (split != 0) return; /* block-uniform */
  } else {
    if (!has_keys) return; /* block-uniform: no partials, not counted */
    __syncthreads();       /* every thread's partials written */
    if (threadIdx.x == 0) {
      __threadfence(); /* ... and visible GPU-wide before the count */
      unsigned *cnt = p.counters + (int64_t)b * p.num_heads_kv + hk;
      s_last = atomicInc(cnt, (unsigned)(active - 1)) == (unsigned)(active - 1);
      if (s_last) __threadfence(); /* the other blocks' partials before our reads */
    }
    __syncthreads();
    if (!s_last) return; /* block-uniform */
  }
  const int warp = threadIdx.x >> 5;
  const int rows = p.group * p.q_len;
  const int64_t row0 = ((int64_t)b * p.num_heads_q + (int64_t)hk * p.group) * p.q_len;
  float *w = smem + warp * FD_MAX_SPLITS;
  for (int r = warp; r < rows; r += NTHREADS / 32) {
    if (p.out_f32)
      fd_combine_row<float>(p, row0 + r, active, w);
    else
      fd_combine_row<T>(p, row0 + r, active, w);
  }
}

#endif /* FD_CUDA_COMBINE_ROW_CUH */
