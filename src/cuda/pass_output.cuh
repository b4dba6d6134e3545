/*
 * pass_output.cuh — the last step of a pass of either split kernel
 * (split_kernel.cu, split_mma_kernel.cu): the block's partial sums of O for
 * rows row0 .. row0 + pass_rows - 1 of (sequence b, kv head hk, split) are
 * summed in slot order and written, with the rows' running max m (base 2)
 * and sum l, as
 *   num_splits > 1: unnormalised O into partial_o and (m ln 2, l) into
 *                   partial_ml, for the combine kernel;
 *   num_splits == 1: out = O / l and lse = m ln 2 + ln l (out = 0 and
 *                   lse = -inf for a row without keys), the sink joining l
 *                   when there is one (fd_finish_row); out in float32 when
 *                   p.out_f32.
 * A row whose summed O holds a NaN or Inf gets l = NaN (so lse, and the
 * combine, show it). Two block barriers; every thread of the block calls it.
 * Row r (0 .. pass_rows - 1) is query head hk * group + (row0 + r) / q_len,
 * token (row0 + r) % q_len. Internal to src/cuda.
 */
#ifndef FD_CUDA_PASS_OUTPUT_CUH
#define FD_CUDA_PASS_OUTPUT_CUH

#include <math.h>

#include "kernel_params.cuh"
#include "device_util.cuh"

/* The (m, l) of query row (b, h, token t) for one split: m the running max
 * (base 2), l its sum (NaN: the row blew up). num_splits > 1: (m ln 2, l)
 * into partial_ml; one split: lse = m ln 2 + ln l (the sink joining l when
 * sinks, NULL = none, is given) when lse is wanted. */
static __device__ __forceinline__ void fd_store_row_ml(const fd_kernel_params &p, int b,
                                                       int64_t h, int t, int split, float m2,
                                                       float lr, const float *sinks) {
  const float ln2 = 0.69314718055994531f;
  if (p.num_splits > 1) {
    const int64_t prow = ((int64_t)b * p.num_heads_q + h) * p.q_len + t;
    float *ml = p.partial_ml + (prow * p.num_splits + split) * 2;
    *reinterpret_cast<float2 *>(ml) = make_float2(m2 * ln2, lr); /* -inf stays -inf */
  } else if (p.lse) {
    float scale, lse;
    fd_finish_row(m2 * ln2, lr, sinks != nullptr, sinks ? sinks[h] : 0.0f, &scale, &lse);
    p.lse[(int64_t)b * p.lse_strides[0] + h * p.lse_strides[1] + (int64_t)t * p.lse_strides[2]] =
        lse;
  }
}

/* Shared memory: slot k of row r at o + (k * SLOT_ROWS + r) * ROW_STRIDE
 * (D floats, 16-byte aligned); m and l of row r at m[r * ML_STRIDE] and
 * l[r * ML_STRIDE]. NTHREADS threads (the block) share the work; no barrier. */
template <typename T, int D, int SLOTS, int SLOT_ROWS, int ROW_STRIDE, int ML_STRIDE, int NTHREADS>
static __device__ __forceinline__ void fd_store_pass(const fd_kernel_params &p, int b, int hk,
                                                     int split, int row0, int pass_rows,
                                                     const float *o, const float *m,
                                                     const float *l) {
  const int tid = threadIdx.x;
  const int q_len = p.q_len;
  const int64_t prow_base = ((int64_t)b * p.num_heads_q + (int64_t)hk * p.group) * q_len + row0;
  /* rows whose O holds a NaN or Inf (from a value they see): their l becomes
   * NaN, so lse (and a later combine) show the blow-up */
  __shared__ int s_blown[16];
  if (tid < 16) s_blown[tid] = 0;
  __syncthreads();
  for (int item = tid; item < pass_rows * (D / 4); item += NTHREADS) {
    const int r = item / (D / 4);
    const int d = (item % (D / 4)) * 4;
    float4 acc = *reinterpret_cast<const float4 *>(o + r * ROW_STRIDE + d);
#pragma unroll
    for (int k = 1; k < SLOTS; k++) {
      const float4 x = *reinterpret_cast<const float4 *>(o + (k * SLOT_ROWS + r) * ROW_STRIDE + d);
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
    if (!(isfinite(acc.x) && isfinite(acc.y) && isfinite(acc.z) && isfinite(acc.w))) s_blown[r] = 1;
    if (p.num_splits > 1) {
      float *dst = p.partial_o + ((prow_base + r) * p.num_splits + split) * D + d;
      *reinterpret_cast<float4 *>(dst) = acc;
    } else {
      const int row = row0 + r;
      const int gi = row / q_len;
      const int t = row - gi * q_len;
      const int64_t h = (int64_t)hk * p.group + gi;
      const float lr = l[r * ML_STRIDE];
      float inv = lr > 0.0f ? 1.0f / lr : 0.0f, lse_unused;
      if (p.sinks)
        fd_finish_row(m[r * ML_STRIDE] * 0.69314718055994531f, lr, true, p.sinks[h], &inv,
                      &lse_unused);
      const int64_t off = (int64_t)b * p.out_strides[0] + (int64_t)t * p.out_strides[1] +
                          h * p.out_strides[2] + d;
      const float4 v = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (p.out_f32)
        fd_store4(static_cast<float *>(p.out) + off, v);
      else
        fd_store4(static_cast<T *>(p.out) + off, v);
    }
  }
  __syncthreads();
  if (tid < pass_rows) {
    const int row = row0 + tid;
    const int gi = row / q_len;
    const int64_t h = (int64_t)hk * p.group + gi;
    fd_store_row_ml(p, b, h, row - gi * q_len, split, m[tid * ML_STRIDE],
                    s_blown[tid] ? __int_as_float(0x7fc00000) : l[tid * ML_STRIDE], p.sinks);
  }
}

#endif /* FD_CUDA_PASS_OUTPUT_CUH */
