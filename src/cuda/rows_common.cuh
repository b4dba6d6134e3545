/*
 * rows_common.cuh — what the two rows kernels (rows_mma_kernel.cu: mma.sync,
 * every GPU; rows_wgmma_kernel.cu: Hopper wgmma) share: a tree mask's view
 * of one key tile, the masking and online softmax of a tile's scores, and the
 * epilogue that writes a thread's two rows.
 *
 * Both hold S and O in the m16n8 accumulator layout: lane (g, qd) = (lane / 4,
 * lane % 4) of a warp's 16-row slab holds rows g and g + 8, columns
 * 8 n + 2 qd, + 1 of each 8-column n-tile (o[n][0..1] row g, o[n][2..3]
 * row g + 8).
 */
#ifndef FD_ROWS_COMMON_CUH
#define FD_ROWS_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include "device_util.cuh"
#include "gpu_select.h"
#include "kernel_params.cuh"
#include "mma_primitives.cuh"

/* A tree mask's view of one tile (flashdecode.h, TREE MASKS): on, when the
 * tile holds draft keys (block-uniform); d0, the draft index of its first key
 * (negative for prefix keys); m0 and m1, the masks of rows g and g + 8. */
struct fd_rows_tree {
  bool on;
  int d0;
  uint64_t m0, m1;
};

/* The masks of rows r0 and r0 + 8 (block rows; 0 past rows_total: no draft
 * key) of sequence b, when the call has a tree mask. */
static __device__ __forceinline__ fd_rows_tree fd_rows_tree_load(const fd_kernel_params &p, int b,
                                                                 int r0, int rows_total) {
  fd_rows_tree t = {false, 0, 0, 0};
  if (p.tree_mask != nullptr) {
    const uint64_t *tm = p.tree_mask + (int64_t)b * p.tree_mask_stride;
    if (r0 < rows_total) t.m0 = __ldg(reinterpret_cast<const unsigned long long *>(tm + r0 % p.q_len));
    if (r0 + 8 < rows_total)
      t.m1 = __ldg(reinterpret_cast<const unsigned long long *>(tm + (r0 + 8) % p.q_len));
  }
  return t;
}

/* Whether row g (e < 2) or g + 8 (e >= 2) sees key kl of a tile whose tree
 * view is t (t.on): a prefix key (draft index < 0), or a draft key whose bit
 * is set in the row's mask. */
static __device__ __forceinline__ bool fd_rows_tree_sees(const fd_rows_tree &t, int kl, int e) {
  const int d = t.d0 + kl;
  const uint64_t m = e < 2 ? t.m0 : t.m1;
  return d < 0 || (d < 64 && ((m >> d) & 1u) != 0);
}

/* A tile of FD_ROWS_KEYS keys, scores s[n][e] (n-tile n: keys 8 n + 2 qd
 * + (e & 1) of row g (e < 2) or g + 8): scale, soft-cap, mask (keys past nk; keys on bad pages; draft keys a
 * row's tree mask hides). SPLIT (the contiguous loader's instances): a full
 * tile on good pages without draft keys (all but a split's last,
 * block-uniform) takes its own path, with no per-score test; the paged
 * instances keep one loop, which keeps their larger code within the bounds
 * of tests/check_code_size.sh. */
template <int D, bool SPLIT>
static __device__ __forceinline__ void fd_rows_mask(const fd_kernel_params &p, float scale,
                                                    bool capped, int qd, int nk, bool bad_tile,
                                                    const unsigned char *tValid,
                                                    const fd_rows_tree &tree,
                                                    float (&s)[FD_ROWS_KEYS / 8][4]) {
  const bool full = nk == FD_ROWS_KEYS && !bad_tile && !tree.on; /* block-uniform */
  if (SPLIT && full) {
#pragma unroll
    for (int n = 0; n < FD_ROWS_KEYS / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[n][e] * scale;
        if (capped) x = fd_soft_cap_fast(x, p.cap_in, p.cap_out);
        s[n][e] = x;
      }
    return;
  }
#pragma unroll
  for (int n = 0; n < FD_ROWS_KEYS / 8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float x = s[n][e] * scale;
      if (capped) x = fd_soft_cap_fast(x, p.cap_in, p.cap_out);
      if (!full) {
        const int kl = 8 * n + 2 * qd + (e & 1);
        bool vis = kl < nk && (!bad_tile || tValid[kl] != 0);
        if (tree.on) vis = vis && fd_rows_tree_sees(tree, kl, e);
        x = vis ? x : -INFINITY;
      }
      s[n][e] = x;
    }
  }
}

/* Online softmax, rows g (e 0, 1) and g + 8 (e 2, 3): a row's max over its
 * 4 lanes; s becomes p; O rescaled unless no row max of the warp moved. */
template <int D>
static __device__ __forceinline__ void fd_rows_softmax(float (&s)[FD_ROWS_KEYS / 8][4],
                                                       float (&o)[D / 8][4], float &m0, float &m1,
                                                       float &l0, float &l1) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < FD_ROWS_KEYS / 8; n++) {
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  float mu0, mu1;
  const float a0 = fd_softmax_step(m0, mx0, &mu0), a1 = fd_softmax_step(m1, mx1, &mu1);
  float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
  for (int n = 0; n < FD_ROWS_KEYS / 8; n++) {
    s[n][0] = fd_exp2_ftz(s[n][0] - mu0);
    s[n][1] = fd_exp2_ftz(s[n][1] - mu0);
    s[n][2] = fd_exp2_ftz(s[n][2] - mu1);
    s[n][3] = fd_exp2_ftz(s[n][3] - mu1);
    ps0 += s[n][0] + s[n][1];
    ps1 += s[n][2] + s[n][3];
  }
  l0 = l0 * a0 + ps0;
  l1 = l1 * a1 + ps1;
  fd_mma_rescale_rows<D / 8>(o, a0, a1);
}

/* Writes one row's results (lane (g, qd) holds columns 8 n + 2 qd, + 1 of
 * o[n][e0], o[n][e0 + 1]); m in base 2, l the row's full sum, blown: its O
 * holds a NaN or Inf. */
template <typename T, int D>
static __device__ __forceinline__ void fd_rows_store(const fd_kernel_params &p, int b, int hk,
                                                     int split, int row, const float (&o)[D / 8][4],
                                                     int e0, float m, float l, bool blown) {
  const int qd = (int)threadIdx.x & 3;
  const int gi = row / p.q_len;
  const int t = row - gi * p.q_len;
  const int64_t h = (int64_t)hk * p.group + gi;
  const float ln2 = 0.69314718055994531f;
  const float l_out = blown ? __int_as_float(0x7fc00000) : l;
  if (p.num_splits > 1) {
    const int64_t prow = ((int64_t)b * p.num_heads_q + h) * p.q_len + t;
    float *dst = p.partial_o + (prow * p.num_splits + split) * D + 2 * qd;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *reinterpret_cast<float2 *>(dst + 8 * n) = make_float2(o[n][e0], o[n][e0 + 1]);
    if (qd == 0)
      *reinterpret_cast<float2 *>(p.partial_ml + (prow * p.num_splits + split) * 2) =
          make_float2(m * ln2, l_out); /* -inf stays -inf */
    return;
  }
  const bool has_sink = p.sinks != nullptr;
  const float sink = has_sink ? p.sinks[h] : 0.0f;
  float inv = l > 0.0f ? 1.0f / l : 0.0f, lse;
  if (has_sink) fd_finish_row(m * ln2, l, true, sink, &inv, &lse);
  const int64_t off = (int64_t)b * p.out_strides[0] + (int64_t)t * p.out_strides[1] +
                      h * p.out_strides[2] + 2 * qd;
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    const float x = o[n][e0] * inv, y = o[n][e0 + 1] * inv;
    if (p.out_f32) {
      *reinterpret_cast<float2 *>(static_cast<float *>(p.out) + off + 8 * n) = make_float2(x, y);
    } else {
      const uint32_t v = fd_pack2<T>(x, y);
      *reinterpret_cast<uint32_t *>(static_cast<T *>(p.out) + off + 8 * n) = v;
    }
  }
  if (p.lse != nullptr && qd == 0) {
    float scale_unused;
    fd_finish_row(m * ln2, l_out, has_sink, sink, &scale_unused, &lse);
    p.lse[(int64_t)b * p.lse_strides[0] + h * p.lse_strides[1] + (int64_t)t * p.lse_strides[2]] =
        lse;
  }
}

/* The epilogue: the rows' sums and NaN / Inf flags over their 4 lanes, then
 * rows g and g + 8 of the warp written (fd_rows_store). */
template <typename T, int D>
static __device__ __forceinline__ void fd_rows_finish(const fd_kernel_params &p, int b, int hk,
                                                      int split, int row0, int rows_total,
                                                      const float (&o)[D / 8][4], float m0,
                                                      float m1, float l0, float l1) {
  bool bad0 = false, bad1 = false;
#pragma unroll
  for (int n = 0; n < D / 8; n++) {
    bad0 = bad0 || !(isfinite(o[n][0]) && isfinite(o[n][1]));
    bad1 = bad1 || !(isfinite(o[n][2]) && isfinite(o[n][3]));
  }
  fd_quad_sum_rows(l0, l1, bad0, bad1);
  if (row0 < rows_total) fd_rows_store<T, D>(p, b, hk, split, row0, o, 0, m0, l0, bad0);
  if (row0 + 8 < rows_total) fd_rows_store<T, D>(p, b, hk, split, row0 + 8, o, 2, m1, l1, bad1);
}

#endif /* FD_ROWS_COMMON_CUH */
