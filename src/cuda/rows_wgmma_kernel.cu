/*
 * rows_wgmma_kernel.cu — the Hopper rows kernel (sm_90a: wgmma.mma_async):
 * the problem of rows_mma_kernel.cu (non-causal calls with many query rows
 * a kv head, and tree-mask verify calls; 16-bit caches of q's dtype,
 * head_dim 64 or 128) where gpu_select.h fd_rows_wgmma_ok says so: compute
 * capability 9.0 with sm_90a code and more than 64 rows a kv head. A
 * 64-node tree at group 4 is 256 rows a kv head: compute-bound, where
 * mma.sync reads each K / V fragment from shared memory once per 16 rows and
 * a warpgroup mma once per 64.
 *
 * GRID  (num_splits, num_heads_kv * row_tiles, batch), row_tiles =
 *   ceil(group * q_len / FD_ROWS_WG_ROWS); one block of FD_ROWS_WG_GROUPS
 *   warpgroups per (split s, kv head hk, row tile rt, sequence b), over keys
 *   [begin, end) of fd_seq_split (split.h). Warpgroup grp holds block rows
 *   64 grp .. + 63 (row r of the kv head: query head hk * group + r / q_len,
 *   token r % q_len; rows past group * q_len are zeros and write nothing; a
 *   warpgroup with none copies its share of each tile and computes
 *   nothing). Its warp w4 holds 16 of them, lane (g, qd) rows g and g + 8 of
 *   the warp's (the m16n8 accumulator layout, wgmma.cuh). Every row sees
 *   every key of the split, or, with a tree mask, every prefix key and the
 *   draft keys its mask names (rows_common.cuh).
 *
 * SHARED MEMORY  (1024-byte aligned; 128-byte swizzle, wgmma.cuh) Q [rows]
 *   [D] as D / 64 atom columns of 64 elements a warpgroup, STAGES stages of
 *   a K tile and a V tile [64 keys][D] in the same layout (16-byte chunk c of
 *   row r at (c / 8) 8192 + 128 r + 16 ((c % 8) ^ (r % 8))), key flags
 *   [STAGES][64]: FD_ROWS_WG_SMEM (gpu_select.h).
 *
 * TILE STEPS  (64 keys, one block barrier)
 *   Wait for the tile's copies (cp.async; proxy fence), barrier (the stage
 *   the previous tile used is free; whether this tile has a key on a bad
 *   page is OR-ed over the block), copies of tile i + STAGES - 1 into that
 *   stage: 8 threads a key, each 16-byte chunks s, s + 8, .. of its keys'
 *   K and V rows (s = thread % 8: a warp reads 128 contiguous bytes of each
 *   of 4 keys), page ids read a tile ahead; keys past the split's end, and
 *   keys on a page outside [0, num_pages) (num_pages known), zero-filled
 *   without a read and flagged. Then per warpgroup:
 *   S[64 rows][64 keys] = Q K^T: D / 16 wgmma m64n64k16 (Q and K from
 *     shared memory).
 *   Scale (softmax_scale log2(e)), soft-cap; mask only in tiles that need
 *   it (past the end, a bad page, draft keys); online softmax in base 2 as
 *   rows_mma_kernel.cu (a row's max over its 4 lanes; a row whose max is
 *   still -inf subtracts 0).
 *   O[64][D] += P V: P is S's accumulators rounded once to q's 16-bit dtype
 *     in place (the m16n8 C layout is the A fragment layout), 4 wgmma
 *     m64nDk16 with A from registers and V read as a transposed operand.
 *
 * OUTPUT  As rows_mma_kernel.cu (rows_common.cuh fd_rows_finish): num_splits
 *   > 1: unnormalised O, (m ln 2, l) into the partials for the combine;
 *   empty splits exit at once. num_splits == 1: out = O / l (the sink joining
 *   l), lse. A row whose O holds a NaN or Inf gets l = NaN.
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
#include "mma_primitives.cuh"
#include "rows_common.cuh"
#include "split.h"
#include "wgmma.cuh"

namespace {

/* The block's shape and its shared memory (byte offsets). */
template <int D>
struct rw {
  static constexpr int NWG = FD_ROWS_WG_GROUPS;
  static constexpr int THREADS = 128 * NWG;
  static constexpr int KT = 64;                    /* keys a tile */
  static constexpr int ST = FD_ROWS_WG_STAGES(D);  /* cp.async stages */
  static constexpr int AC = D / 64;                /* atom columns a row */
  static constexpr int ATOM = 64 * 128;            /* one atom column of 64 rows: 8192 B */
  static constexpr int TILE = AC * ATOM;           /* 64 rows of D: Q of a warpgroup, K or V */
  static constexpr int KPT = KT * 8 / THREADS;     /* keys a thread copies */
  static constexpr int OFF_Q = 0;
  static constexpr int OFF_K = NWG * TILE;
  static constexpr int OFF_V = OFF_K + ST * TILE;
  static constexpr int OFF_F = OFF_V + ST * TILE;
  static constexpr int USED = OFF_F + ST * KT;
  static_assert(USED + 1024 == FD_ROWS_WG_SMEM(D), "gpu_select.h sizes the kernel the same way");
  static_assert(D == 64 || D == 128, "head_dim");
  static_assert(KT == FD_ROWS_KEYS, "rows_common.cuh's tile");
  static_assert(OFF_Q == 0 && OFF_K % 1024 == 0 && OFF_V % 1024 == 0,
                "operand tiles start on swizzle atoms");
  static_assert(KPT >= 1 && KPT * THREADS == KT * 8, "8 threads a key");
  static_assert(ST >= 2 && ST <= 8, "stages (one bit each in the bad-page queue)");
};

#if FD_WGMMA_ON
/* The page ids of the thread's keys of the tile at key0 (n keys before the
 * split's end): read here, used by rw_issue a tile later. */
template <int D>
__device__ __forceinline__ void rw_page_ids(const fd_kernel_params &p, int b, int key0, int n,
                                            int (&pg)[rw<D>::KPT]) {
  using C = rw<D>;
#pragma unroll
  for (int j = 0; j < C::KPT; j++) {
    const int key = (threadIdx.x >> 3) + j * (C::THREADS / 8);
    pg[j] = key < n ? __ldg(p.block_table + (int64_t)b * p.block_table_stride +
                            (key0 + key) / p.page_size)
                    : 0;
  }
}

/* One tile's copies: keys key0 .. key0 + 63 (n of them before the split's
 * end; pg their page ids when paged) of kv head hk into `stage`, their flags
 * into `flags`. Returns whether one of this thread's keys is on a bad page. */
template <typename T, int D>
__device__ __forceinline__ bool rw_issue(const fd_kernel_params &p, int b, int hk, int key0, int n,
                                         const int (&pg)[rw<D>::KPT], unsigned char *sk,
                                         unsigned char *sv, unsigned char *flags) {
  using C = rw<D>;
  const T *kc = static_cast<const T *>(p.k_cache);
  const T *vc = static_cast<const T *>(p.v_cache);
  const int s = threadIdx.x & 7;
  bool bad = false;
#pragma unroll
  for (int j = 0; j < C::KPT; j++) {
    const int key = (threadIdx.x >> 3) + j * (C::THREADS / 8);
    const int kj = key0 + key;
    bool ok = key < n;
    int64_t base = b, pos = kj;
    if (p.page_size > 0) {
      const bool good = p.num_pages <= 0 || (pg[j] >= 0 && pg[j] < p.num_pages);
      bad = bad || (ok && !good);
      ok = ok && good;
      base = pg[j];
      pos = kj % p.page_size;
    }
    const T *kr = kc, *vr = vc;
    if (ok) {
      kr = kc + base * p.k_strides[0] + pos * p.k_strides[1] + hk * p.k_strides[2] + 8 * s;
      vr = vc + base * p.v_strides[0] + pos * p.v_strides[1] + hk * p.v_strides[2] + 8 * s;
    }
    /* chunk s + 8 a of the key's row: atom column a, swizzled position s ^ (key % 8) */
    const int dst = key * 128 + ((s ^ (key & 7)) << 4);
#pragma unroll
    for (int a = 0; a < C::AC; a++) {
      fd_cp_async16(sk + dst + a * C::ATOM, ok ? (const void *)(kr + 64 * a) : p.k_cache, ok);
      fd_cp_async16(sv + dst + a * C::ATOM, ok ? (const void *)(vr + 64 * a) : p.v_cache, ok);
    }
    if (s == 0) flags[key] = ok ? 1 : 0;
  }
  return bad;
}

/* Q rows row_base .. + NWG 64 - 1 of kv head hk (zeros past rows_total) by
 * cp.async in rw_issue's pattern. */
template <typename T, int D>
__device__ __forceinline__ void rw_load_q(const fd_kernel_params &p, int b, int hk, int row_base,
                                          int rows_total, unsigned char *sq) {
  using C = rw<D>;
  const int s = threadIdx.x & 7;
#pragma unroll
  for (int j = 0; j < C::NWG * 64 * 8 / C::THREADS; j++) {
    const int r = (threadIdx.x >> 3) + j * (C::THREADS / 8); /* block row */
    const int row = row_base + r;
    const bool live = row < rows_total;
    const T *src = static_cast<const T *>(p.q);
    if (live) {
      const int gi = row / p.q_len;
      const int t = row - gi * p.q_len;
      src += (int64_t)b * p.q_strides[0] + (int64_t)t * p.q_strides[1] +
             ((int64_t)hk * p.group + gi) * p.q_strides[2] + 8 * s;
    }
    unsigned char *dst = sq + (r >> 6) * C::TILE + (r & 63) * 128 + ((s ^ (r & 7)) << 4);
#pragma unroll
    for (int a = 0; a < C::AC; a++)
      fd_cp_async16(dst + a * C::ATOM, live ? (const void *)(src + 64 * a) : p.q, live);
  }
}
#endif /* FD_WGMMA_ON */

template <typename T, int D>
__global__ void __launch_bounds__(rw<D>::THREADS, 2)
    fd_rows_wgmma_kernel(const __grid_constant__ fd_kernel_params p) {
#if FD_WGMMA_ON
  using C = rw<D>;
  constexpr int KT = C::KT, ST = C::ST;
  extern __shared__ __align__(1024) unsigned char fd_rows_wg_smem[];
  fd_pdl_wait();
  fd_pdl_launch_dependents();

  const int rows_total = p.group * p.q_len;
  const int row_tiles = (rows_total + 64 * C::NWG - 1) / (64 * C::NWG);
  const int split = blockIdx.x;
  const int hk = blockIdx.y / row_tiles;
  const int row_base = (blockIdx.y - hk * row_tiles) * 64 * C::NWG;
  const int b = blockIdx.z;
  int kv = fd_kv_len(p, b);
  int begin, end;
  fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
               &begin, &end);
  if (p.num_splits > 1 && begin >= end) return; /* past the last key: the combine skips it */

  const uint32_t raw_u = (uint32_t)__cvta_generic_to_shared(fd_rows_wg_smem);
  unsigned char *const sm = fd_rows_wg_smem + ((1024u - (raw_u & 1023u)) & 1023u);
  const uint32_t sm_u = (uint32_t)__cvta_generic_to_shared(sm);
  unsigned char *const sK = sm + C::OFF_K;
  unsigned char *const sV = sm + C::OFF_V;
  unsigned char *const sF = sm + C::OFF_F;

  const int tid = threadIdx.x, lane = tid & 31;
  const int grp = tid >> 7, w4 = (tid >> 5) & 3;
  const int g = lane >> 2, qd = lane & 3;
  const int row0 = row_base + 64 * grp + 16 * w4 + g; /* the thread's rows: row0, row0 + 8 */
  const bool live = row_base + 64 * grp < rows_total; /* warpgroup-uniform */
  const int num_tiles = (end - begin + KT - 1) / KT;
  const bool paged = p.page_size > 0;

  /* Prologue: Q with tile 0 in copy group 0, tiles 1 .. ST - 2 a group each;
   * the page ids of tile ST - 1 read. badq bit j: a key of tile i + j on a
   * bad page (i: the loop's tile). */
  rw_load_q<T, D>(p, b, hk, row_base, rows_total, sm + C::OFF_Q);
  int pg[C::KPT];
#pragma unroll
  for (int j = 0; j < C::KPT; j++) pg[j] = 0;
  uint32_t badq = 0;
#pragma unroll
  for (int t = 0; t < ST - 1; t++) {
    if (t < num_tiles) {
      if (paged) rw_page_ids<D>(p, b, begin + t * KT, end - begin - t * KT, pg);
      if (rw_issue<T, D>(p, b, hk, begin + t * KT, end - begin - t * KT, pg, sK + t * C::TILE,
                         sV + t * C::TILE, sF + t * KT))
        badq |= 1u << t;
    }
    fd_cp_async_commit();
  }
  if (paged && ST - 1 < num_tiles)
    rw_page_ids<D>(p, b, begin + (ST - 1) * KT, end - begin - (ST - 1) * KT, pg);

  fd_rows_tree tree = fd_rows_tree_load(p, b, row0, rows_total);
  const int prefix = kv - p.q_len; /* keys before it are seen by every tree row */

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY; /* rows row0, row0 + 8 (base 2) */
  float l0 = 0.0f, l1 = 0.0f;           /* this lane's part of their sums */
  const float scale = p.scale_log2;
  const bool capped = p.cap_out != 0.0f;
  const uint32_t sQ_u = sm_u + C::OFF_Q + grp * C::TILE;

  for (int i = 0; i < num_tiles; i++) {
    const int stage = i % ST;
    fd_cp_async_wait<ST - 2>(); /* tile i landed (this thread's copies) */
    fd_fence_proxy_async();
    const bool bad_tile = __syncthreads_or((int)(badq & 1u)) != 0;
    badq >>= 1;
    { /* tile i + ST - 1 into the stage tile i - 1 used; the next tile's page ids */
      const int nt = i + ST - 1;
      if (nt < num_tiles) {
        const int ns = nt % ST;
        if (rw_issue<T, D>(p, b, hk, begin + nt * KT, end - begin - nt * KT, pg,
                           sK + ns * C::TILE, sV + ns * C::TILE, sF + ns * KT))
          badq |= 1u << (ST - 2);
        if (paged && nt + 1 < num_tiles)
          rw_page_ids<D>(p, b, begin + (nt + 1) * KT, end - begin - (nt + 1) * KT, pg);
      }
      fd_cp_async_commit();
    }
    if (!live) continue;

    /* S = Q K^T */
    const uint32_t k_u = sm_u + C::OFF_K + stage * C::TILE;
    float s[32];
#pragma unroll
    for (int e = 0; e < 32; e++) s[e] = 0.0f;
    fd_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      const uint32_t off = (ks >> 2) * C::ATOM + (ks & 3) * 32;
      fd_wgmma_m64n64k16_ss<T>(s, fd_wgmma_desc(sQ_u + off, 16, 1024),
                               fd_wgmma_desc(k_u + off, 16, 1024), ks > 0);
    }
    fd_wgmma_commit();
    fd_wgmma_wait<0>();
    fd_wgmma_hold(s);

    /* scale, soft-cap, mask (only tiles that need it); online softmax, O rescaled */
    const int key0 = begin + i * KT;
    const int nk = min(KT, end - key0);
    tree.on = p.tree_mask != nullptr && key0 + nk > prefix;
    tree.d0 = key0 - prefix;
    float(&s4)[KT / 8][4] = *reinterpret_cast<float(*)[KT / 8][4]>(s);
    fd_rows_mask<D, false>(p, scale, capped, qd, nk, bad_tile, sF + stage * KT, tree, s4);
    fd_rows_softmax<D>(s4, *reinterpret_cast<float(*)[D / 8][4]>(o), m0, m1, l0, l1);

    /* O += P V: P's A fragments for keys 16 kk .. + 15 are S's n-tiles 2 kk, 2 kk + 1 */
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      pa[kk][0] = fd_pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = fd_pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = fd_pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = fd_pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
    const uint32_t v_u = sm_u + C::OFF_V + stage * C::TILE;
    fd_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      fd_wgmma_m64k16_rs<T, D, 1>(o, pa[kk], fd_wgmma_desc(v_u + kk * 16 * 128, C::ATOM, 1024), 1);
    fd_wgmma_commit();
    fd_wgmma_wait<0>(); /* the stage and pa are free once P V has read them */
    fd_wgmma_hold(o);
  }
  fd_cp_async_wait<0>(); /* only empty groups can remain */
  fd_rows_finish<T, D>(p, b, hk, split, row0, rows_total,
                       *reinterpret_cast<const float(*)[D / 8][4]>(o), m0, m1, l0, l1);
#endif
}

template <typename T, int D>
cudaError_t rw_launch(const fd_kernel_params *p, cudaStream_t stream) {
  const size_t smem = FD_ROWS_WG_SMEM(D);
  cudaError_t e = cudaFuncSetAttribute(fd_rows_wgmma_kernel<T, D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(fd_rows_wgmma_kernel<T, D>, cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  const int64_t grid_y =
      (int64_t)p->num_heads_kv * fd_rows_tiles(p->group, p->q_len, FD_ROWS_WG_ROWS);
  if (grid_y > 65535 || p->batch > 65535)
    return cudaErrorInvalidValue;
  return fd_launch(fd_rows_wgmma_kernel<T, D>, *p,
                   dim3((unsigned)p->num_splits, (unsigned)grid_y, (unsigned)p->batch),
                   dim3(rw<D>::THREADS), smem, stream, p->pdl == FD_PDL_ALL);
}

template <typename T, int D>
cudaError_t rw_occupancy(int *blocks_per_sm) {
  const size_t smem = FD_ROWS_WG_SMEM(D);
  const cudaError_t e = cudaFuncSetAttribute(fd_rows_wgmma_kernel<T, D>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, fd_rows_wgmma_kernel<T, D>,
                                                       rw<D>::THREADS, smem);
}

} /* namespace */

cudaError_t fd_rows_wgmma_launch(const fd_kernel_params *p, cudaStream_t stream) {
  if (p->kv_dtype != 0 && p->kv_dtype != p->dtype) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case FD_DTYPE_F16:
      if (p->head_dim == 64) return rw_launch<__half, 64>(p, stream);
      if (p->head_dim == 128) return rw_launch<__half, 128>(p, stream);
      break;
    case FD_DTYPE_BF16:
      if (p->head_dim == 64) return rw_launch<__nv_bfloat16, 64>(p, stream);
      if (p->head_dim == 128) return rw_launch<__nv_bfloat16, 128>(p, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t fd_rows_wgmma_occupancy(int dtype, int head_dim, int *blocks_per_sm) {
  *blocks_per_sm = 0;
  const bool bf16 = dtype == FD_DTYPE_BF16;
  if (dtype != FD_DTYPE_F16 && !bf16) return cudaErrorInvalidValue;
  if (head_dim == 64)
    return bf16 ? rw_occupancy<__nv_bfloat16, 64>(blocks_per_sm)
                : rw_occupancy<__half, 64>(blocks_per_sm);
  if (head_dim == 128)
    return bf16 ? rw_occupancy<__nv_bfloat16, 128>(blocks_per_sm)
                : rw_occupancy<__half, 128>(blocks_per_sm);
  return cudaErrorInvalidValue;
}
