/*
 * mla_hopper.cuh — what the two Hopper MLA kernels share (mla_wgmma_kernel.cu,
 * mla_seesaw_kernel.cu): 64 query rows a block in 2 warpgroups, Q in shared
 * memory as 9 atom columns of 64 elements (latent 0..7, rope 8; 128-byte
 * swizzle, wgmma.cuh: 16-byte chunk c of row r at (c / 8) 8192 + 128 r +
 * 16 ((c % 8) ^ (r % 8))), O[64][512] in registers with columns 256 grp ..
 * in warpgroup grp (the wgmma accumulator layout: thread rows r0 = 16 w + g
 * and r1 = r0 + 8 of warp w of its group, columns 8 n + 2 qd, + 1).
 */
#ifndef FD_MLA_HOPPER_CUH
#define FD_MLA_HOPPER_CUH

#include <math.h>
#include <stdint.h>

#include "device_util.cuh"
#include "kernel_params.cuh"
#include "mma_primitives.cuh"
#include "pass_output.cuh"
#include "row_keys.h"

#define FD_MLA_HOPPER_ATOM (64 * 128) /* one atom column of 64 rows: 8192 B */

/* Keys [*lo, *hi) of the split [begin, end) that query row `row` of the
 * sequence sees (fd_row_keys); none (begin, begin) for rows past rows_total. */
__device__ __forceinline__ void fd_mla_hopper_row_keys(const fd_kernel_params &p, int row,
                                                       int rows_total, int kv, int begin, int end,
                                                       int *lo, int *hi) {
  *lo = *hi = begin;
  if (row < rows_total)
    fd_row_keys(row % p.q_len, p.q_len, kv, p.window_left, p.non_causal, begin, end, lo, hi);
}

/* Q rows row_base .. + 63 of sequence b (zeros past rows_total) into sQ by
 * cp.async (one group for the caller to commit): thread t of 256 takes rows
 * t / 8 and t / 8 + 32, chunks s, s + 8, .., s + 56 of q and chunk s of q_pe
 * (s = t % 8). */
template <typename T>
__device__ __forceinline__ void fd_mla_hopper_load_q(const fd_kernel_params &p, int b, int row_base,
                                                     int rows_total, unsigned char *sQ) {
  const int s = threadIdx.x & 7;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int r = (threadIdx.x >> 3) + 32 * hh;
    const int row = row_base + r;
    const bool live = row < rows_total;
    const int h = live ? row / p.q_len : 0;
    const int t = live ? row - h * p.q_len : 0;
    const T *ql = static_cast<const T *>(p.q) + (int64_t)b * p.q_strides[0] +
                  (int64_t)t * p.q_strides[1] + (int64_t)h * p.q_strides[2] + 8 * s;
    const T *qr = static_cast<const T *>(p.q_pe) + (int64_t)b * p.q_pe_strides[0] +
                  (int64_t)t * p.q_pe_strides[1] + (int64_t)h * p.q_pe_strides[2] + 8 * s;
    unsigned char *dst = sQ + r * 128 + ((s ^ (r & 7)) << 4);
#pragma unroll
    for (int j = 0; j < 8; j++)
      fd_cp_async16(dst + j * FD_MLA_HOPPER_ATOM, live ? (const void *)(ql + 64 * j) : p.q, live);
    fd_cp_async16(dst + 8 * FD_MLA_HOPPER_ATOM, live ? (const void *)qr : p.q, live);
  }
}

/* Columns d, d + 1 of row `row`: the partials (num_splits > 1) or out. */
template <typename T>
__device__ __forceinline__ void fd_mla_hopper_store2(const fd_kernel_params &p, int b, int split,
                                                     int row, int d, float x, float y, float inv) {
  const int h = row / p.q_len;
  const int t = row - h * p.q_len;
  if (p.num_splits > 1) {
    const int64_t prow = ((int64_t)b * p.num_heads_q + h) * p.q_len + t;
    *reinterpret_cast<float2 *>(p.partial_o + (prow * p.num_splits + split) * p.head_dim + d) =
        make_float2(x, y);
    return;
  }
  const int64_t off = (int64_t)b * p.out_strides[0] + (int64_t)t * p.out_strides[1] +
                      (int64_t)h * p.out_strides[2] + d;
  if (p.out_f32)
    *reinterpret_cast<float2 *>(static_cast<float *>(p.out) + off) = make_float2(x * inv, y * inv);
  else
    *reinterpret_cast<uint32_t *>(static_cast<T *>(p.out) + off) = fd_pack2<T>(x * inv, y * inv);
}

/* The epilogue: the thread's part l0, l1 of rows r0, r1's sums over the
 * quad, then over both groups through sX (float2 [2][64]; group 0's part
 * first: deterministic); out = O / l (num_splits 1) or the unnormalised
 * partials, and (m, l) of each row (m0, m1: its running max, base 2). A row
 * whose O holds a NaN or Inf gets l = NaN. Starts with a block barrier. */
template <typename T>
__device__ __forceinline__ void fd_mla_hopper_finish(const fd_kernel_params &p, int b, int split,
                                                     int row_base, int rows_total, const float (&o)[128],
                                                     float l0, float l1, float m0, float m1, float2 *sX,
                                                     int grp, int r0, int r1, int qd) {
  bool bad0 = false, bad1 = false;
#pragma unroll
  for (int n = 0; n < 32; n++) {
    bad0 = bad0 || !(isfinite(o[4 * n]) && isfinite(o[4 * n + 1]));
    bad1 = bad1 || !(isfinite(o[4 * n + 2]) && isfinite(o[4 * n + 3]));
  }
  fd_quad_sum_rows(l0, l1, bad0, bad1);
  __syncthreads(); /* every earlier read of sX is done */
  if (qd == 0) {
    sX[grp * 64 + r0] = make_float2(l0, bad0 ? 1.0f : 0.0f);
    sX[grp * 64 + r1] = make_float2(l1, bad1 ? 1.0f : 0.0f);
  }
  __syncthreads();
  const float2 x00 = sX[r0], x01 = sX[64 + r0], x10 = sX[r1], x11 = sX[64 + r1];
  const float lt0 = x00.x + x01.x, lt1 = x10.x + x11.x;
  const bool blown0 = x00.y != 0.0f || x01.y != 0.0f, blown1 = x10.y != 0.0f || x11.y != 0.0f;

  const int row0 = row_base + r0, row1 = row_base + r1;
  const bool live0 = row0 < rows_total, live1 = row1 < rows_total;
  const float inv0 = lt0 > 0.0f ? 1.0f / lt0 : 0.0f, inv1 = lt1 > 0.0f ? 1.0f / lt1 : 0.0f;
#pragma unroll
  for (int n = 0; n < 32; n++) {
    const int d = grp * 256 + 8 * n + 2 * qd;
    if (live0) fd_mla_hopper_store2<T>(p, b, split, row0, d, o[4 * n], o[4 * n + 1], inv0);
    if (live1) fd_mla_hopper_store2<T>(p, b, split, row1, d, o[4 * n + 2], o[4 * n + 3], inv1);
  }
  if (grp == 0 && qd == 0) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = hh ? row1 : row0;
      if (!(hh ? live1 : live0)) continue;
      const float l = (hh ? blown1 : blown0) ? __int_as_float(0x7fc00000) : (hh ? lt1 : lt0);
      const int h = row / p.q_len;
      fd_store_row_ml(p, b, h, row - h * p.q_len, split, hh ? m1 : m0, l, nullptr);
    }
  }
}

#endif /* FD_MLA_HOPPER_CUH */
