/*
 * mla_wgmma_kernel.cu — the Hopper MLA kernel (sm_90a: wgmma.mma_async) for
 * many query rows a sequence (gpu_select.h fd_mla_wgmma_ok: 16-bit caches
 * of q's dtype, head_dim 512, rope 64, >= 64 rows a sequence, compute
 * capability 9.0 with sm_90a code) whose tiles mla_seesaw_kernel.cu cannot
 * copy by TMA (pages of other sizes, layouts the driver refuses). Same
 * problem, split / combine contract and row / key rules as mla_kernel.cu,
 * which runs every other case. Copies by cp.async, any page size.
 *
 * GRID  (row_tiles, num_splits, batch): one block of 2 warpgroups (256
 *   threads) for 64 query rows (row tile rt: rows 64 rt .. + 63 of the
 *   sequence's num_heads_q * q_len rows; row r is head r / q_len, token
 *   r % q_len; rows past the last are zeros and write nothing) over keys
 *   [begin, end) of split s (fd_seq_split). Row tiles vary fastest so the
 *   blocks of one (sequence, split) run together and share its keys in L2.
 *   Causal rows see keys [lo, hi) of fd_row_keys (row_keys.h).
 *
 * SHARED MEMORY  (1024-byte aligned; 128-byte swizzle, wgmma.cuh) Q [64
 *   rows][576] as 9 atom columns of 64 elements (latent 0..7, rope 8), 2
 *   stages of a 64-key tile [64 keys][576] in the same layout, P [64][64]
 *   16-bit, the row maxima (then row sums) of each warpgroup, key flags;
 *   16-byte chunk c (0 .. 71) of row r at (c / 8) 8192 + 128 r +
 *   16 ((c % 8) ^ (r % 8)):
 *   FD_MLA_WG_SMEM (gpu_select.h), one block an SM.
 *
 * TILE STEPS  (64 keys; three block barriers)
 *   B1: the tile's copies landed (cp.async, proxy fence). Warpgroup grp
 *   computes S[64 rows][32 keys 32 grp ..] = Q K^T over the 576 columns (36
 *   wgmma m64n32k16, Q and K from shared memory); meanwhile every thread
 *   issues its copies of the next tile into the other stage (8 threads a
 *   key, its row offsets computed once: wg_issue; paged caches through
 *   the block_table, any page_size; keys past the split's end or on a page outside [0,
 *   num_pages) are zero-filled and flagged, their scores -inf). Scale,
 *   mask, the rows' maxima over the group's 32 keys -> shared memory.
 *   B2: the row maximum over both groups; online softmax in base 2 (both
 *   groups compute the same m); P (16-bit, q's dtype) -> shared memory;
 *   O rescaled. B3: O[64][256 columns 256 grp ..] += P V (4 wgmma
 *   m64n256k16, V = the tile's first 512 columns read as a transposed
 *   operand: no second copy).
 *
 * OUTPUT  num_splits > 1: unnormalised O and (m ln 2, l) into the partials
 *   [row][split][D] for the combine (combine_kernel.cu); empty splits exit
 *   at once. num_splits == 1: out = O / l, lse. A row whose O holds a NaN
 *   or Inf gets l = NaN. l is the sum of group 0's part and group 1's, in
 *   that order (deterministic).
 *
 * PDL  As the split kernels: wait for the previous kernel, then let the
 *   combine be scheduled.
 *
 * Built for every target; the body exists only in sm_90a passes.
 */
#include <math.h>
#include <stdint.h>

#include "device_util.cuh"
#include "flashdecode.h"
#include "gpu_select.h"
#include "kernel_params.cuh"
#include "mla_hopper.cuh"
#include "mma_primitives.cuh"
#include "pass_output.cuh"
#include "row_keys.h"
#include "split.h"
#include "wgmma.cuh"

namespace {

/* The block's shape and its shared memory (byte offsets). */
struct wg {
  static constexpr int THREADS = 256;
  static constexpr int ROWS = 64;                /* query rows a block */
  static constexpr int KT = 64;                  /* keys a tile */
  static constexpr int D = 512;                  /* latent columns */
  static constexpr int CPK = (D + 64) / 8;       /* 16-byte chunks a key / Q row: 72 */
  static constexpr int ATOM = FD_MLA_HOPPER_ATOM; /* one atom column of 64 rows: 8192 B */
  static constexpr int TILE = 9 * ATOM;          /* Q or one K stage: 73,728 B */
  static constexpr int OFF_Q = 0;
  static constexpr int OFF_K = TILE;
  static constexpr int OFF_P = OFF_K + 2 * TILE;
  static constexpr int OFF_X = OFF_P + ATOM;     /* float2 [2][64] */
  static constexpr int OFF_F = OFF_X + 2 * 64 * 8; /* flags [2][64] */
  static constexpr int USED = OFF_F + 2 * 64;
};
static_assert(wg::USED + 1024 == FD_MLA_WG_SMEM, "gpu_select.h sizes the kernel the same way");
static_assert(wg::THREADS == 8 * 32 && wg::KT == 64 && wg::CPK == 72,
              "wg_issue: 8 threads a key, 2 keys a thread, 9 chunks a key each");
static_assert(wg::OFF_Q % 1024 == 0 && wg::OFF_K % 1024 == 0 && wg::OFF_P % 1024 == 0,
              "operand tiles start on swizzle atoms");

#if FD_WGMMA_ON
/* One tile's copies: keys key0 .. key0 + 63 of sequence b (n of them
 * before the split's end) into `stage`, their flags into `flags`. Thread t
 * takes keys t / 8 and t / 8 + 32 and, of each, the 16-byte chunks s, s + 8,
 * .., s + 56 of the latent row and chunk s of the rope row (s = t % 8: a
 * warp's copy reads 128 contiguous bytes of each of 4 keys); a key's row
 * offsets (page lookup, division) are computed once. */
__device__ __forceinline__ void wg_issue(const fd_kernel_params &p, int b, int key0, int n,
                                         unsigned char *stage, unsigned char *flags) {
  const unsigned char *ckv = static_cast<const unsigned char *>(p.k_cache);
  const unsigned char *kpe = static_cast<const unsigned char *>(p.k_pe_cache);
  const int s = threadIdx.x & 7;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int key = (threadIdx.x >> 3) + 32 * h;
    const int kj = key0 + key;
    bool ok = key < n;
    int64_t base = b, pos = kj;
    if (p.page_size > 0) {
      const int page = ok ? __ldg(p.block_table + (int64_t)b * p.block_table_stride + kj / p.page_size) : 0;
      ok = ok && (p.num_pages <= 0 || (page >= 0 && page < p.num_pages));
      base = page;
      pos = kj % p.page_size;
    }
    const unsigned char *lat = ckv, *rope = kpe;
    if (ok) {
      lat = ckv + (base * p.k_strides[0] + pos * p.k_strides[1]) * 2 + 16 * s;
      rope = kpe + (base * p.k_pe_strides[0] + pos * p.k_pe_strides[1]) * 2 + 16 * s;
    }
    /* chunk s + 8 j of the key's row: atom column j, swizzled position s ^ (key % 8) */
    unsigned char *dst = stage + key * 128 + ((s ^ (key & 7)) << 4);
#pragma unroll
    for (int j = 0; j < 8; j++) fd_cp_async16(dst + j * wg::ATOM, ok ? lat + 128 * j : ckv, ok);
    fd_cp_async16(dst + 8 * wg::ATOM, rope, ok);
    if (s == 0) flags[key] = ok ? 1 : 0;
  }
}

#endif /* FD_WGMMA_ON */

template <typename T>
__global__ void __launch_bounds__(wg::THREADS, 1)
    fd_mla_wgmma_kernel(const __grid_constant__ fd_kernel_params p) {
#if FD_WGMMA_ON
  extern __shared__ __align__(1024) unsigned char fd_mla_wg_smem[];
  fd_pdl_wait();
  fd_pdl_launch_dependents();

  const int rows_total = p.num_heads_q * p.q_len;
  const int row_base = blockIdx.x * wg::ROWS;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int kv = fd_kv_len(p, b);
  int begin, end;
  fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
               &begin, &end);
  if (p.num_splits > 1 && begin >= end) return; /* past the last key: the combine skips it */

  const uint32_t raw_u = (uint32_t)__cvta_generic_to_shared(fd_mla_wg_smem);
  unsigned char *const sm = fd_mla_wg_smem + ((1024u - (raw_u & 1023u)) & 1023u);
  const uint32_t sm_u = (uint32_t)__cvta_generic_to_shared(sm);
  unsigned char *const sQ = sm + wg::OFF_Q;
  unsigned char *const sK = sm + wg::OFF_K;
  unsigned char *const sP = sm + wg::OFF_P;
  float2 *const sX = reinterpret_cast<float2 *>(sm + wg::OFF_X);
  unsigned char *const sF = sm + wg::OFF_F;

  const int tid = threadIdx.x, lane = tid & 31;
  const int grp = tid >> 7, w4 = (tid >> 5) & 3;
  const int g = lane >> 2, qd = lane & 3;
  const int r0 = 16 * w4 + g, r1 = r0 + 8; /* the thread's rows in the block */
  const float scale = p.scale_log2;
  const int num_tiles = (end - begin + wg::KT - 1) / wg::KT;

  /* Prologue: Q and tile 0 in one copy group. */
  fd_mla_hopper_load_q<T>(p, b, row_base, rows_total, sQ);
  if (num_tiles > 0) wg_issue(p, b, begin, end - begin, sK, sF);
  fd_cp_async_commit();

  /* the rows' visible keys [lo, hi) */
  int lo0, hi0, lo1, hi1;
  fd_mla_hopper_row_keys(p, row_base + r0, rows_total, kv, begin, end, &lo0, &hi0);
  fd_mla_hopper_row_keys(p, row_base + r1, rows_total, kv, begin, end, &lo1, &hi1);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; i++) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY; /* running max (base 2), both groups the same */
  float l0 = 0.0f, l1 = 0.0f;           /* this thread's part of the sums */

  const uint32_t sQ_u = sm_u + wg::OFF_Q, sP_u = sm_u + wg::OFF_P;

  for (int i = 0; i < num_tiles; i++) {
    const int stage = i & 1;
    const int key0 = begin + i * wg::KT;
    fd_cp_async_wait<0>();
    fd_fence_proxy_async();
    __syncthreads(); /* B1: tile i landed; stage i - 1 and P are free */

    /* S for the group's 32 keys */
    const uint32_t st_u = sm_u + wg::OFF_K + stage * wg::TILE;
    float s[16];
#pragma unroll
    for (int e = 0; e < 16; e++) s[e] = 0.0f;
    fd_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 36; ks++) {
      const uint32_t off = (ks >> 2) * wg::ATOM + (ks & 3) * 32;
      fd_wgmma_m64n32k16<T>(s, fd_wgmma_desc(sQ_u + off, 16, 1024),
                            fd_wgmma_desc(st_u + off + grp * 32 * 128, 16, 1024), ks > 0);
    }
    fd_wgmma_commit();

    /* the next tile's copies into the other stage */
    if (i + 1 < num_tiles)
      wg_issue(p, b, key0 + wg::KT, end - key0 - wg::KT, sK + (stage ^ 1) * wg::TILE,
               sF + (stage ^ 1) * wg::KT);
    fd_cp_async_commit();

    fd_wgmma_wait<0>();
    fd_wgmma_hold(s);

    /* scale, mask; the group's row maxima */
    const unsigned char *tF = sF + stage * wg::KT;
    const int a0lo = lo0 - key0, a0hi = hi0 - key0, a1lo = lo1 - key0, a1hi = hi1 - key0;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int kl = grp * 32 + 8 * n + 2 * qd + c;
        const bool fl = tF[kl] != 0;
        const bool v0 = fl && kl >= a0lo && kl < a0hi, v1 = fl && kl >= a1lo && kl < a1hi;
        s[4 * n + c] = v0 ? s[4 * n + c] * scale : -INFINITY;
        s[4 * n + 2 + c] = v1 ? s[4 * n + 2 + c] * scale : -INFINITY;
        mx0 = fmaxf(mx0, s[4 * n + c]);
        mx1 = fmaxf(mx1, s[4 * n + 2 + c]);
      }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    if (qd == 0) {
      sX[grp * 64 + r0].x = mx0;
      sX[grp * 64 + r1].x = mx1;
    }
    __syncthreads(); /* B2 */
    mx0 = fmaxf(sX[r0].x, sX[64 + r0].x);
    mx1 = fmaxf(sX[r1].x, sX[64 + r1].x);

    /* online softmax; P -> shared memory; O rescaled */
    float mu0, mu1;
    const float a0 = fd_softmax_step(m0, mx0, &mu0), a1 = fd_softmax_step(m1, mx1, &mu1);
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; n++) {
      const float p0 = fd_exp2_ftz(s[4 * n + 0] - mu0), p1 = fd_exp2_ftz(s[4 * n + 1] - mu0);
      const float p2 = fd_exp2_ftz(s[4 * n + 2] - mu1), p3 = fd_exp2_ftz(s[4 * n + 3] - mu1);
      ps0 += p0 + p1;
      ps1 += p2 + p3;
      const int ch = grp * 4 + n; /* the 8-key chunk of the P row */
      *reinterpret_cast<uint32_t *>(sP + r0 * 128 + ((ch ^ (r0 & 7)) << 4) + 4 * qd) =
          fd_pack2<T>(p0, p1);
      *reinterpret_cast<uint32_t *>(sP + r1 * 128 + ((ch ^ (r1 & 7)) << 4) + 4 * qd) =
          fd_pack2<T>(p2, p3);
    }
    l0 = l0 * a0 + ps0;
    l1 = l1 * a1 + ps1;
    if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) { /* the max moved: O rescaled */
#pragma unroll
      for (int n = 0; n < 32; n++) {
        o[4 * n + 0] *= a0;
        o[4 * n + 1] *= a0;
        o[4 * n + 2] *= a1;
        o[4 * n + 3] *= a1;
      }
    }
    fd_fence_proxy_async();
    __syncthreads(); /* B3: P complete */

    /* O += P V for the group's 256 columns */
    fd_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ks++)
      fd_wgmma_m64n256k16_tb<T>(o, fd_wgmma_desc(sP_u + ks * 32, 16, 1024),
                                fd_wgmma_desc(st_u + grp * 4 * wg::ATOM + ks * 16 * 128, wg::ATOM, 1024),
                                1);
    fd_wgmma_commit();
    fd_wgmma_wait<0>();
    fd_wgmma_hold(o);
  }
  fd_cp_async_wait<0>(); /* only empty groups can remain */

  /* Epilogue (mla_hopper.cuh): l over the quad, then over both groups */
  fd_mla_hopper_finish<T>(p, b, split, row_base, rows_total, o, l0, l1, m0, m1, sX, grp, r0, r1, qd);
#endif
}

template <typename T>
cudaError_t wg_launch(const fd_kernel_params *p, cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(fd_mla_wgmma_kernel<T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)FD_MLA_WG_SMEM);
  if (e != cudaSuccess) return e;
  const int64_t tiles = ((int64_t)p->num_heads_q * p->q_len + wg::ROWS - 1) / wg::ROWS;
  if (tiles > 0x7fffffff || p->num_splits > 65535 || p->batch > 65535) return cudaErrorInvalidValue;
  return fd_launch(fd_mla_wgmma_kernel<T>, *p,
                   dim3((unsigned)tiles, (unsigned)p->num_splits, (unsigned)p->batch),
                   dim3(wg::THREADS), FD_MLA_WG_SMEM, stream, p->pdl == FD_PDL_ALL);
}

} /* namespace */

cudaError_t fd_mla_wgmma_launch(const fd_kernel_params *p, cudaStream_t stream) {
  if (p->rope_dim != 64 || p->head_dim != wg::D) return cudaErrorInvalidValue;
  const int kv = p->kv_dtype == 0 ? p->dtype : p->kv_dtype;
  const int rope = p->rope_dtype == 0 ? kv : p->rope_dtype;
  if (kv != p->dtype || rope != p->dtype) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case FD_DTYPE_F16: return wg_launch<__half>(p, stream);
    case FD_DTYPE_BF16: return wg_launch<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}
