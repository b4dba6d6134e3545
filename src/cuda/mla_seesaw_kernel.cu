/*
 * mla_seesaw_kernel.cu — the Hopper MLA kernel for caches whose 64-key
 * tiles TMA can copy whole (sm_90a: wgmma.mma_async, cp.async.bulk.tensor):
 * contiguous caches and pages of a multiple of 64 keys, splits of at least
 * FD_MLA_SS_MIN_SPLIT_KEYS keys (gpu_select.h fd_mla_seesaw_ok; the backend
 * falls back to mla_wgmma_kernel.cu when the driver refuses the tensors'
 * layout). FlashMLA's "seesaw" schedule ("A Deep-Dive Into the New Flash
 * MLA Kernel", DeepSeek, 2025). Same problem, split / combine contract and
 * row / key rules as mla_kernel.cu.
 *
 * GRID  (row_tiles, num_splits, batch) as mla_wgmma_kernel.cu: one block of
 *   2 warpgroups (256 threads) for 64 query rows of one sequence over keys
 *   [begin, end) of split s (fd_seq_split; begins on multiples of 64 keys).
 *
 * STEP  (two 64-key tiles: tile 2j in buffer K0, 2j + 1 in K1) Warpgroup 0
 *   holds O's columns 0..255 and computes S of the even tiles, warpgroup 1
 *   columns 256..511 and S of the odd ones (wgmma m64n64k16; Q's rope atom
 *   column from registers, so that its shared-memory column holds group 1's
 *   P). Group 0: softmax of S0 against the shared running max sM, its factor
 *   -> sSc0 [SC0]; O_L += P0 V0L (P0 from registers); [after SC1] O_L, l and
 *   P0 times group 1's factor sSc1, P0 -> sP0 [P0]; [after P1] O_L += P1 V1L
 *   (sP1); S of tile 2j + 2. Group 1: [after SC0] softmax of S1 against sM,
 *   O_R times sSc0 and its own factor -> sSc1 [SC1]; P1 -> sP1; O_R += P1
 *   V1R; [after P0] O_R += P0 V0R (sP0) [P1]; S of tile 2j + 3. [X]: a named
 *   barrier between the groups (bar.arrive by one, bar.sync by the other).
 *
 * COPIES  TMA boxes of 64 keys x 64 columns, one mbarrier each (9 a
 *   buffer), so S starts on the first column that lands. A buffer's columns
 *   are refilled as soon as their last reader is done: 0..3 (V's left half)
 *   by group 0 after its P V on them, 4..8 by group 1. Boxes outside the
 *   cache (pages outside [0, num_pages), positions past kv_capacity) read
 *   as zeros. The last tile's V rows past the split's end are zeroed in
 *   shared memory before P V (the cache there may hold anything).
 *
 * SHARED MEMORY  (1024-byte aligned) Q [64][576] (atom column 8 -> sP1
 *   once its values are in registers), K0, K1 [64][576], sP0 [64][64], sM,
 *   sSc0, sSc1 float [64], float2 [2][64] for the epilogue, 18 mbarriers:
 *   FD_MLA_SS_SMEM (gpu_select.h), one block an SM.
 *
 * OUTPUT and PDL as mla_wgmma_kernel.cu (mla_hopper.cuh's epilogue; m is
 *   sM's final value).
 *
 * Built for every target; the body exists only in sm_90a passes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "device_util.cuh"
#include "flashdecode.h"
#include "gpu_select.h"
#include "kernel_params.cuh"
#include "mla_hopper.cuh"
#include "mma_primitives.cuh"
#include "row_keys.h"
#include "split.h"
#include "tma.cuh"
#include "wgmma.cuh"

namespace {

/* The launch's tensor maps (tma.cuh): the latent and rope caches as 3-D
 * views {columns, positions of a page (contiguous: of a sequence), pages
 * (sequences)}, boxes of 64 columns x 64 keys. */
struct ss_maps {
  CUtensorMap lat, rope;
};

struct ss {
  static constexpr int THREADS = 256;
  static constexpr int KT = 64;
  static constexpr int ATOM = FD_MLA_HOPPER_ATOM;
  static constexpr int TILE = 9 * ATOM;
  static constexpr int OFF_Q = 0;                 /* Q [64][576]; atom column 8 -> sP1 */
  static constexpr int OFF_K = OFF_Q + TILE;      /* K0, K1 */
  static constexpr int OFF_P0 = OFF_K + 2 * TILE; /* sP0 [64][64] */
  static constexpr int OFF_M = OFF_P0 + ATOM;     /* float [64] running max */
  static constexpr int OFF_SC0 = OFF_M + 256;     /* float [64] */
  static constexpr int OFF_SC1 = OFF_SC0 + 256;   /* float [64] */
  static constexpr int OFF_X = OFF_SC1 + 256;     /* float2 [2][64] */
  static constexpr int OFF_B = OFF_X + 1024;      /* uint64 [2][9] */
  static constexpr int USED = OFF_B + 18 * 8;
  static constexpr int SMEM = USED + 1024;
  enum { BAR_SC0 = 1, BAR_SC1 = 2, BAR_P0 = 3, BAR_P1 = 4, BAR_WG = 5 };
};
static_assert(ss::SMEM == FD_MLA_SS_SMEM, "gpu_select.h sizes the kernel the same way");

#if FD_WGMMA_ON
__device__ __forceinline__ void ss_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void ss_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void ss_hold_a(uint32_t (&a)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i++) asm volatile("" : "+r"(a[i])::"memory");
}

/* Where tile key0 of sequence b lies: box coordinates (c1, c2) and whether
 * its page is valid; n: its keys before the split's end (<= 64). */
struct ss_tile {
  int c1, c2, n;
  bool ok;
};
__device__ __forceinline__ ss_tile ss_locate(const fd_kernel_params &p, int b, int key0, int end) {
  ss_tile t;
  t.n = end - key0 < ss::KT ? end - key0 : ss::KT;
  if (p.page_size <= 0) {
    t.c1 = key0;
    t.c2 = b;
    t.ok = true;
  } else {
    const int page = __ldg(p.block_table + (int64_t)b * p.block_table_stride + key0 / p.page_size);
    t.c1 = key0 % p.page_size;
    t.c2 = page;
    t.ok = page >= 0 && (p.num_pages <= 0 || page < p.num_pages);
  }
  return t;
}

/* TMA of atom columns [a0, a1) of a tile into the buffer at buf_u, each
 * completing on its barrier (bars_u + 8 j). One thread. */
__device__ __forceinline__ void ss_tma(const ss_maps &m, uint32_t buf_u, uint32_t bars_u, int a0,
                                       int a1, const ss_tile &t) {
#pragma unroll
  for (int j = a0; j < a1; j++) {
    const uint32_t bar = bars_u + 8 * j;
    fd_mbar_arrive_expect_tx(bar, ss::ATOM);
    if (j < 8)
      fd_tma_load_3d(buf_u + j * ss::ATOM, &m.lat, 64 * j, t.c1, t.c2, bar);
    else
      fd_tma_load_3d(buf_u + 8 * ss::ATOM, &m.rope, 0, t.c1, t.c2, bar);
  }
}

/* s (+)= Q K^T over atom columns [a0, a1) of the tile at buf_u, each after
 * its barrier's phase `parity`; column 8 from q8 (registers). One commit
 * group per column. first: s = (not +=) at column a0. */
template <typename T>
__device__ __forceinline__ void ss_scores(float (&s)[32], uint32_t sQ_u, uint32_t buf_u,
                                          uint32_t bars_u, uint32_t parity, const uint32_t (&q8)[16],
                                          int a0, int a1, bool first) {
#pragma unroll
  for (int j = a0; j < a1; j++) {
    fd_mbar_wait(bars_u + 8 * j, parity);
    fd_wgmma_fence();
    if (j < 8) {
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        fd_wgmma_m64n64k16_ss<T>(s, fd_wgmma_desc(sQ_u + j * ss::ATOM + kk * 32, 16, 1024),
                                 fd_wgmma_desc(buf_u + j * ss::ATOM + kk * 32, 16, 1024),
                                 (first && j == a0 && kk == 0) ? 0 : 1);
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; kk++) {
        const uint32_t a[4] = {q8[4 * kk], q8[4 * kk + 1], q8[4 * kk + 2], q8[4 * kk + 3]};
        fd_wgmma_m64k16_rs<T, 64, 0>(s, a, fd_wgmma_desc(buf_u + 8 * ss::ATOM + kk * 32, 16, 1024),
                                 (first && j == a0 && kk == 0) ? 0 : 1);
      }
    }
    fd_wgmma_commit();
  }
}

/* Scores of the tile at key0 (t: its place) for rows r0 (s[4 i + c]) and r1
 * (s[4 i + 2 + c]), key 8 i + 2 qd + c: scaled to base 2, -inf where the row
 * does not see the key; the rows' maxima -> mx0, mx1 (over the quad). */
__device__ __forceinline__ void ss_mask(float (&s)[32], float scale, int key0, const ss_tile &t,
                                        int lo0, int hi0, int lo1, int hi1, int qd, float &mx0,
                                        float &mx1) {
  const int n = t.ok ? t.n : 0;
  const int a0lo = lo0 - key0, a0hi = hi0 - key0, a1lo = lo1 - key0, a1hi = hi1 - key0;
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int c = 0; c < 2; c++) {
      const int kl = 8 * i + 2 * qd + c;
      const bool in = kl < n;
      const bool v0 = in && kl >= a0lo && kl < a0hi, v1 = in && kl >= a1lo && kl < a1hi;
      s[4 * i + c] = v0 ? s[4 * i + c] * scale : -INFINITY;
      s[4 * i + 2 + c] = v1 ? s[4 * i + 2 + c] * scale : -INFINITY;
      mx0 = fmaxf(mx0, s[4 * i + c]);
      mx1 = fmaxf(mx1, s[4 * i + 2 + c]);
    }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
}

/* p = 2^(s - mu) in place (rows r0: mu0, r1: mu1), their 16-bit A fragments
 * times f0 / f1 -> pb (k-step kk: pb[4 kk .. 4 kk + 3]); returns the
 * unscaled sums in *ps0, *ps1. */
template <typename T>
__device__ __forceinline__ void ss_exp(float (&s)[32], float mu0, float mu1, uint32_t (&pb)[16],
                                       float *ps0, float *ps1) {
  float a = 0.0f, c = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    s[4 * i + 0] = fd_exp2_ftz(s[4 * i + 0] - mu0);
    s[4 * i + 1] = fd_exp2_ftz(s[4 * i + 1] - mu0);
    s[4 * i + 2] = fd_exp2_ftz(s[4 * i + 2] - mu1);
    s[4 * i + 3] = fd_exp2_ftz(s[4 * i + 3] - mu1);
    a += s[4 * i + 0] + s[4 * i + 1];
    c += s[4 * i + 2] + s[4 * i + 3];
  }
  *ps0 = a;
  *ps1 = c;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    pb[2 * i + 0] = fd_pack2<T>(s[4 * i + 0], s[4 * i + 1]); /* row g, keys 8 i + 2 qd */
    pb[2 * i + 1] = fd_pack2<T>(s[4 * i + 2], s[4 * i + 3]); /* row g + 8 */
  }
}

/* pb = 16-bit (p times f0 / f1): the A fragments of P V. */
template <typename T>
__device__ __forceinline__ void ss_pack_scaled(const float (&s)[32], float f0, float f1,
                                               uint32_t (&pb)[16]) {
#pragma unroll
  for (int i = 0; i < 8; i++) {
    pb[2 * i + 0] = fd_pack2<T>(s[4 * i + 0] * f0, s[4 * i + 1] * f0);
    pb[2 * i + 1] = fd_pack2<T>(s[4 * i + 2] * f1, s[4 * i + 3] * f1);
  }
}

/* pb -> the P tile at sP (K-major, 128-byte swizzle): chunk i of rows r0, r1. */
__device__ __forceinline__ void ss_store_p(unsigned char *sP, const uint32_t (&pb)[16], int r0,
                                           int r1, int qd) {
#pragma unroll
  for (int i = 0; i < 8; i++) {
    *reinterpret_cast<uint32_t *>(sP + r0 * 128 + ((i ^ (r0 & 7)) << 4) + 4 * qd) = pb[2 * i];
    *reinterpret_cast<uint32_t *>(sP + r1 * 128 + ((i ^ (r1 & 7)) << 4) + 4 * qd) = pb[2 * i + 1];
  }
}

/* The A fragment of k-step kk from pb (wgmma.cuh: a[0] row g keys 16 kk +
 * 2 qd; a[1] row g + 8; a[2], a[3] keys + 8): chunks 2 kk and 2 kk + 1. */
__device__ __forceinline__ void ss_frag(const uint32_t (&pb)[16], int kk, uint32_t (&a)[4]) {
  a[0] = pb[4 * kk + 0];
  a[1] = pb[4 * kk + 1];
  a[2] = pb[4 * kk + 2];
  a[3] = pb[4 * kk + 3];
}

/* O[64][256] (+)= P V for the group's columns (atom columns 4 grp ..): P
 * from registers (pb) or from shared memory (sP_u). One commit group. */
template <typename T>
__device__ __forceinline__ void ss_pv_regs(float (&o)[128], const uint32_t (&pb)[16],
                                           uint32_t buf_u, int grp) {
  fd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    uint32_t a[4];
    ss_frag(pb, kk, a);
    fd_wgmma_m64k16_rs<T, 256, 1>(
        o, a, fd_wgmma_desc(buf_u + grp * 4 * ss::ATOM + kk * 16 * 128, ss::ATOM, 1024), 1);
  }
  fd_wgmma_commit();
}
template <typename T>
__device__ __forceinline__ void ss_pv_smem(float (&o)[128], uint32_t sP_u, uint32_t buf_u, int grp) {
  fd_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
    fd_wgmma_m64n256k16_tb<T>(o, fd_wgmma_desc(sP_u + kk * 32, 16, 1024),
                              fd_wgmma_desc(buf_u + grp * 4 * ss::ATOM + kk * 16 * 128, ss::ATOM, 1024),
                              1);
  fd_wgmma_commit();
}

/* Zeros in V rows n .. 63 of the group's atom columns (keys past the split's
 * end: the cache there may hold anything, and 0 x NaN is NaN), then the
 * proxy fence and the group's barrier. No-op (block-uniform) for n >= 64. */
__device__ __forceinline__ void ss_zero_tail(unsigned char *buf, int n, int grp, int wtid) {
  if (n >= ss::KT) return;
  if (n < 0) n = 0;
  const int count = (ss::KT - n) * 4 * 8; /* 16-byte chunks */
  for (int idx = wtid; idx < count; idx += 128) {
    const int row = n + idx / 32, atom = 4 * grp + (idx >> 3) % 4, ch = idx & 7;
    *reinterpret_cast<uint4 *>(buf + atom * ss::ATOM + row * 128 + ch * 16) = make_uint4(0, 0, 0, 0);
  }
  fd_fence_proxy_async();
  ss_sync(ss::BAR_WG + grp, 128);
}

__device__ __forceinline__ void ss_scale_o(float (&o)[128], float f0, float f1) {
  if (__any_sync(0xffffffffu, f0 != 1.0f || f1 != 1.0f)) {
#pragma unroll
    for (int n = 0; n < 32; n++) {
      o[4 * n + 0] *= f0;
      o[4 * n + 1] *= f0;
      o[4 * n + 2] *= f1;
      o[4 * n + 3] *= f1;
    }
  }
}
#endif /* FD_WGMMA_ON */

template <typename T>
__global__ void __launch_bounds__(ss::THREADS, 1)
    fd_mla_seesaw_kernel(const __grid_constant__ fd_kernel_params p, const __grid_constant__ ss_maps m) {
#if FD_WGMMA_ON
  extern __shared__ __align__(1024) unsigned char fd_mla_ss_smem[];
  fd_pdl_wait();
  fd_pdl_launch_dependents();

  const int rows_total = p.num_heads_q * p.q_len;
  const int row_base = blockIdx.x * 64;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int kv = fd_kv_len(p, b);
  int begin, end;
  fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
               &begin, &end);
  if (p.num_splits > 1 && begin >= end) return;

  const uint32_t raw_u = (uint32_t)__cvta_generic_to_shared(fd_mla_ss_smem);
  unsigned char *const sm = fd_mla_ss_smem + ((1024u - (raw_u & 1023u)) & 1023u);
  const uint32_t sm_u = (uint32_t)__cvta_generic_to_shared(sm);
  unsigned char *const sQ = sm + ss::OFF_Q;
  unsigned char *const sP1 = sQ + 8 * ss::ATOM;
  unsigned char *const sP0 = sm + ss::OFF_P0;
  float *const sM = reinterpret_cast<float *>(sm + ss::OFF_M);
  float *const sSc0 = reinterpret_cast<float *>(sm + ss::OFF_SC0);
  float *const sSc1 = reinterpret_cast<float *>(sm + ss::OFF_SC1);
  float2 *const sX = reinterpret_cast<float2 *>(sm + ss::OFF_X);
  const uint32_t sQ_u = sm_u + ss::OFF_Q, sP1_u = sQ_u + 8 * ss::ATOM, sP0_u = sm_u + ss::OFF_P0;
  const uint32_t K_u[2] = {sm_u + ss::OFF_K, sm_u + ss::OFF_K + ss::TILE};
  const uint32_t B_u[2] = {sm_u + ss::OFF_B, sm_u + ss::OFF_B + 9 * 8};

  const int tid = threadIdx.x, lane = tid & 31;
  /* the warpgroup, warp-uniform as the compiler sees it (a shuffle from lane 0) */
  const int grp = __shfl_sync(0xffffffffu, tid >> 7, 0), wtid = tid & 127, w4 = (tid >> 5) & 3;
  const int g = lane >> 2, qd = lane & 3;
  const int r0 = 16 * w4 + g, r1 = r0 + 8;
  const bool leader = wtid == 0; /* issues the group's TMA */
  const float scale = p.scale_log2;
  const int nt = (end - begin + ss::KT - 1) / ss::KT;

  if (tid == 0) {
    for (int i = 0; i < 18; i++) fd_mbar_init(B_u[0] + 8 * i, 1);
    fd_mbar_init_fence();
  }
  if (tid < 64) sM[tid] = -INFINITY;
  __syncthreads();

  fd_mla_hopper_load_q<T>(p, b, row_base, rows_total, sQ);
  fd_cp_async_commit();
  if (tid == 0) {
    if (nt > 0) ss_tma(m, K_u[0], B_u[0], 0, 9, ss_locate(p, b, begin, end));
    if (nt > 1) ss_tma(m, K_u[1], B_u[1], 0, 9, ss_locate(p, b, begin + ss::KT, end));
  }

  int lo0, hi0, lo1, hi1;
  fd_mla_hopper_row_keys(p, row_base + r0, rows_total, kv, begin, end, &lo0, &hi0);
  fd_mla_hopper_row_keys(p, row_base + r1, rows_total, kv, begin, end, &lo1, &hi1);

  fd_cp_async_wait<0>();
  fd_fence_proxy_async();
  __syncthreads(); /* Q landed */

  /* Q's rope columns (atom column 8) as A fragments: k-step kk, rows r0 / r1,
   * columns 16 kk + 2 qd (+ 8) */
  uint32_t q8[16];
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int c = 2 * kk + h; /* 16-byte chunk of the row */
      q8[4 * kk + 2 * h + 0] =
          *reinterpret_cast<const uint32_t *>(sQ + 8 * ss::ATOM + r0 * 128 + ((c ^ (r0 & 7)) << 4) + 4 * qd);
      q8[4 * kk + 2 * h + 1] =
          *reinterpret_cast<const uint32_t *>(sQ + 8 * ss::ATOM + r1 * 128 + ((c ^ (r1 & 7)) << 4) + 4 * qd);
    }
  __syncthreads(); /* every q8 read before sP1 overwrites the column */

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; i++) o[i] = 0.0f;
  float s[32];
  uint32_t pb[16];
  float l0 = 0.0f, l1 = 0.0f;

  /* prologue: S of tile 0 (group 0) and tile 1 (group 1) */
  if (grp == 0) {
    if (nt > 0) ss_scores<T>(s, sQ_u, K_u[0], B_u[0], 0, q8, 0, 9, true);
  } else {
    if (nt > 1) ss_scores<T>(s, sQ_u, K_u[1], B_u[1], 0, q8, 0, 9, true);
  }
  fd_wgmma_wait<0>();
  fd_wgmma_hold(s);

  for (int j = 0; 2 * j < nt; j++) {
    const int t0 = 2 * j;
    const bool t1v = t0 + 1 < nt, n0v = t0 + 2 < nt, n1v = t0 + 3 < nt;
    const uint32_t par = (uint32_t)((j + 1) & 1); /* the next tiles' phase */
    const int key0 = begin + t0 * ss::KT, key1 = key0 + ss::KT;
    if (grp == 0) {
      /* softmax of tile 2j; O_L += P0 V0L */
      const ss_tile tt = ss_locate(p, b, key0, end);
      float mx0, mx1;
      ss_mask(s, scale, key0, tt, lo0, hi0, lo1, hi1, qd, mx0, mx1);
      float m0 = sM[r0], m1 = sM[r1];
      __syncwarp();
      float mu0, mu1;
      const float a0 = fd_softmax_step(m0, mx0, &mu0), a1 = fd_softmax_step(m1, mx1, &mu1);
      if (qd == 0) {
        sM[r0] = m0;
        sM[r1] = m1;
        sSc0[r0] = a0;
        sSc0[r1] = a1;
      }
      ss_scale_o(o, a0, a1);
      float ps0, ps1;
      ss_exp<T>(s, mu0, mu1, pb, &ps0, &ps1);
      l0 = l0 * a0 + ps0;
      l1 = l1 * a1 + ps1;
      ss_arrive(ss::BAR_SC0);
      ss_zero_tail(sm + ss::OFF_K, tt.n, 0, wtid);
      ss_pv_regs<T>(o, pb, K_u[0], 0);
      fd_wgmma_wait<0>();
      fd_wgmma_hold(o);
      ss_hold_a(pb);

      ss_sync(ss::BAR_SC1, 256); /* group 1's step: sSc1, sM */
      if (leader && n0v) ss_tma(m, K_u[0], B_u[0], 0, 4, ss_locate(p, b, key0 + 2 * ss::KT, end));
      const float f0 = sSc1[r0], f1 = sSc1[r1];
      ss_pack_scaled<T>(s, f0, f1, pb);
      ss_store_p(sP0, pb, r0, r1, qd);
      fd_fence_proxy_async();
      ss_arrive(ss::BAR_P0);

      ss_scale_o(o, f0, f1);
      l0 *= f0;
      l1 *= f1;
      if (t1v) {
        ss_zero_tail(sm + ss::OFF_K + ss::TILE, end - key1, 0, wtid);
        ss_sync(ss::BAR_P1, 256); /* sP1 written */
        ss_pv_smem<T>(o, sP1_u, K_u[1], 0);
      }
      if (n0v) ss_scores<T>(s, sQ_u, K_u[0], B_u[0], par, q8, 0, 4, true);
      if (t1v && n1v) {
        if (n0v) fd_wgmma_wait<4>();
        else fd_wgmma_wait<0>();
        ss_sync(ss::BAR_WG + 0, 128); /* the group's P V on K1 done in all 4 warps */
        if (leader) ss_tma(m, K_u[1], B_u[1], 0, 4, ss_locate(p, b, key1 + 2 * ss::KT, end));
      }
      if (n0v) ss_scores<T>(s, sQ_u, K_u[0], B_u[0], par, q8, 4, 9, false);
      fd_wgmma_wait<0>();
      fd_wgmma_hold(o);
      fd_wgmma_hold(s);
    } else {
      /* softmax of tile 2j + 1; O_R += P1 V1R + P0 V0R */
      ss_sync(ss::BAR_SC0, 256); /* group 0's step: sSc0, sM */
      float mx0 = -INFINITY, mx1 = -INFINITY;
      if (t1v) {
        const ss_tile tt = ss_locate(p, b, key1, end);
        ss_mask(s, scale, key1, tt, lo0, hi0, lo1, hi1, qd, mx0, mx1);
      }
      float m0 = sM[r0], m1 = sM[r1];
      const float c0 = sSc0[r0], c1 = sSc0[r1];
      __syncwarp();
      float mu0, mu1;
      const float a0 = fd_softmax_step(m0, mx0, &mu0), a1 = fd_softmax_step(m1, mx1, &mu1);
      if (qd == 0) {
        sM[r0] = m0;
        sM[r1] = m1;
        sSc1[r0] = a0;
        sSc1[r1] = a1;
      }
      float ps0 = 0.0f, ps1 = 0.0f;
      if (t1v) ss_exp<T>(s, mu0, mu1, pb, &ps0, &ps1);
      ss_scale_o(o, a0 * c0, a1 * c1);
      l0 = l0 * (a0 * c0) + ps0;
      l1 = l1 * (a1 * c1) + ps1;
      ss_arrive(ss::BAR_SC1);

      if (t1v) {
        ss_store_p(sP1, pb, r0, r1, qd);
        fd_fence_proxy_async();
        ss_zero_tail(sm + ss::OFF_K + ss::TILE, end - key1, 1, wtid);
        ss_pv_regs<T>(o, pb, K_u[1], 1);
      }
      ss_sync(ss::BAR_P0, 256); /* sP0 written */
      ss_zero_tail(sm + ss::OFF_K, end - key0, 1, wtid);
      ss_pv_smem<T>(o, sP0_u, K_u[0], 1);
      if (t1v) ss_arrive(ss::BAR_P1);
      if (t1v && n1v) {
        fd_wgmma_wait<1>();
        ss_sync(ss::BAR_WG + 1, 128); /* the group's P1 V1R done in all 4 warps */
        if (leader) ss_tma(m, K_u[1], B_u[1], 4, 9, ss_locate(p, b, key1 + 2 * ss::KT, end));
      }
      fd_wgmma_wait<0>();
      fd_wgmma_hold(o);
      ss_hold_a(pb);
      if (n0v) {
        ss_sync(ss::BAR_WG + 1, 128); /* the group's P0 V0R done in all 4 warps */
        if (leader) ss_tma(m, K_u[0], B_u[0], 4, 9, ss_locate(p, b, key0 + 2 * ss::KT, end));
      }
      if (n1v) {
        /* columns 4..8 first: 0..3 are refilled last (group 0, after its P1 V1L) */
        ss_scores<T>(s, sQ_u, K_u[1], B_u[1], par, q8, 4, 9, true);
        ss_scores<T>(s, sQ_u, K_u[1], B_u[1], par, q8, 0, 4, false);
        fd_wgmma_wait<0>();
        fd_wgmma_hold(s);
      }
    }
  }

  /* Epilogue (mla_hopper.cuh); the rows' final max is sM's */
  __syncthreads();
  const float mf0 = sM[r0], mf1 = sM[r1];
  fd_mla_hopper_finish<T>(p, b, split, row_base, rows_total, o, l0, l1, mf0, mf1, sX, grp, r0, r1,
                          qd);
#endif
}

/* The launch's tensor maps; 0 when made, -1 when the driver (or its
 * absence: encode NULL) refuses the caches' layout. Pages unknown
 * (num_pages 0): the block table is trusted, as by mla_wgmma_kernel.cu. */
static int ss_make_maps(const fd_kernel_params *p, void *encode, ss_maps *m) {
  memset(m, 0, sizeof *m);
  if (!encode || (p->page_size > 0 && p->page_size % ss::KT != 0)) return -1;
  const bool paged = p->page_size > 0;
  const uint64_t rows = paged ? (uint64_t)p->page_size : (uint64_t)p->kv_capacity;
  const uint64_t outer = paged ? (p->num_pages > 0 ? (uint64_t)p->num_pages : (uint64_t)INT32_MAX)
                               : (uint64_t)p->batch;
  if (p->k_strides[0] < 0 || p->k_strides[1] < 0 || p->k_pe_strides[0] < 0 ||
      p->k_pe_strides[1] < 0)
    return -1;
  if (fd_tma_encode_3d(encode, &m->lat, p->k_cache, 512, rows, outer,
                       (uint64_t)p->k_strides[1] * 2, (uint64_t)p->k_strides[0] * 2, ss::KT) != 0 ||
      fd_tma_encode_3d(encode, &m->rope, p->k_pe_cache, 64, rows, outer,
                       (uint64_t)p->k_pe_strides[1] * 2, (uint64_t)p->k_pe_strides[0] * 2,
                       ss::KT) != 0)
    return -1;
  return 0;
}

template <typename T>
cudaError_t ss_launch(const fd_kernel_params *p, void *encode, cudaStream_t stream) {
  ss_maps m;
  if (ss_make_maps(p, encode, &m) != 0) return cudaErrorNotSupported;
  cudaError_t e = cudaFuncSetAttribute(fd_mla_seesaw_kernel<T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ss::SMEM);
  if (e != cudaSuccess) return e;
  const int64_t tiles = ((int64_t)p->num_heads_q * p->q_len + 63) / 64;
  if (tiles > 0x7fffffff || p->num_splits > 65535 || p->batch > 65535) return cudaErrorInvalidValue;
  return fd_launch(fd_mla_seesaw_kernel<T>, *p,
                   dim3((unsigned)tiles, (unsigned)p->num_splits, (unsigned)p->batch),
                   dim3(ss::THREADS), ss::SMEM, stream, p->pdl == FD_PDL_ALL, m);
}

} /* namespace */

cudaError_t fd_mla_seesaw_launch(const fd_kernel_params *p, void *tma_encode, cudaStream_t stream) {
  if (p->rope_dim != 64 || p->head_dim != 512 || p->chunk_len % ss::KT != 0 ||
      p->split_len_fixed % ss::KT != 0)
    return cudaErrorInvalidValue;
  const int kv = p->kv_dtype == 0 ? p->dtype : p->kv_dtype;
  const int rope = p->rope_dtype == 0 ? kv : p->rope_dtype;
  if (kv != p->dtype || rope != p->dtype) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case FD_DTYPE_F16: return ss_launch<__half>(p, tma_encode, stream);
    case FD_DTYPE_BF16: return ss_launch<__nv_bfloat16>(p, tma_encode, stream);
  }
  return cudaErrorInvalidValue;
}
