/*
 * rows_mma_kernel.cu — the tensor-core split kernel for calls with many query
 * rows a kv head: non-causal calls (a shared prefix, flashdecode.h) whose
 * group * q_len rows number FD_ROWS_MIN or more, and every call with a tree
 * mask (speculative-decoding verify, flashdecode.h TREE MASKS); 16-bit
 * caches, head_dim 64 or 128 (fd_rows_kernel_shape, internal.h). The split kernel
 * (split_mma_kernel.cuh) takes rows 8 at a time as the mma's N side and
 * re-reads its split's K/V once per 8 rows; here rows are the mma's M side
 * (the FlashAttention-2 orientation) and 64 rows share each K/V tile.
 *
 * GRID  (num_splits, num_heads_kv * row_tiles, batch), row_tiles =
 *   ceil(group * q_len / 64); one block of 4 warps per (split s, kv head hk,
 *   row tile rt, sequence b), over keys [begin, end) of fd_seq_split (split.h,
 *   as the split kernel), for rows r = 64 rt .. 64 rt + 63 of kv head hk (row
 *   r: query head hk * group + r / q_len, token r % q_len; rows past
 *   group * q_len are zeros and write nothing). Warp w holds rows
 *   64 rt + 16 w .. + 15. Every row sees every key of the split (non-causal),
 *   or, with a tree mask, every prefix key and the draft keys its mask's bits
 *   name (each lane holds the masks of its two rows; only tiles that hold
 *   draft keys test them).
 *
 * TILES  64 keys a tile, the split kernel's 4-warp tiles: K and V go global
 *   -> shared through its loaders (mma_loaders.cuh, fd_mma_copy_tile:
 *   cp.async, chunk c of row k at c ^ (k & 7); paged caches through page
 *   ids read a tile ahead) in 3 stages, one barrier a tile; keys past the
 *   split's end, and (paged, num_pages known) keys on a page id outside
 *   [0, num_pages), are zero-filled without a read and masked (score -inf;
 *   a tile's bad pages are OR-ed at its barrier, so only such tiles read the
 *   key flags). Per warp and tile, mma.sync.m16n8k16 with fp32 accumulators:
 *   S = Q K^T: Q's A fragments (16 rows x head_dim) are loaded once from
 *     shared memory into registers; K's B fragments by ldmatrix.x4 (keys
 *     x chunk pairs). Lane (g, qd) = (lane / 4, lane % 4) holds rows g and
 *     g + 8, keys 8 n + 2 qd, + 1 of each 8-key n-tile.
 *   Online softmax in base 2 (softmax_scale * log2(e) in fp32, soft-capped
 *   when asked), a row's max over its 4 lanes; a row whose max is still
 *   -inf subtracts 0 (never (-inf) - (-inf)); l sums the fp32 p per lane,
 *   reduced at the end.
 *   O += P V: P's A fragments are the score accumulators packed to 16 bits
 *     in place (the m16n8 C layout is the m16n8k16 A layout), in a hi and a
 *     lo part (two mma: P keeps ~16 bits, as in the split kernel);
 *     V's B fragments by ldmatrix.x4.trans.
 *
 * OUTPUT  From registers, as pass_output.cuh writes the split kernel's:
 *   num_splits > 1: unnormalised O, (m ln 2, l) into the partials for the
 *   combine (combine_kernel.cu); empty splits exit at once. num_splits == 1:
 *   out = O / l (the sink joining l), lse. A row whose O holds a NaN or Inf
 *   gets l = NaN in its partial / lse.
 *
 * STEPS  fd_rows_load_q (Q -> shared memory), fd_rows_prologue (page ids,
 *   the first tiles), Q's A fragments, then per tile fd_rows_wait_refill
 *   (wait, barrier, refill a stage), fd_rows_qk, fd_rows_mask,
 *   fd_rows_softmax, fd_rows_pv; fd_rows_finish (sums, NaN flags, the
 *   rows' outputs).
 *
 * CODE SIZE  As the split kernel's: the loader is a template constant (PG,
 *   fd_mma_loader_pg at launch: 0 contiguous, 1 paged with page_size a power
 *   of two >= the 8 or 4 keys a thread copies a tile, one page id a tile, 2
 *   any other page_size, one id a key), one copy path an instance
 *   (tests/check_code_size.sh bounds each).
 *
 * SHARED MEMORY  K stages [3][64][D] | V stages [3][64][D] | Q [64][D] | key
 *   flags [3][64]: 57,536 bytes (64), 114,880 (128); FD_ROWS_SMEM
 *   (gpu_select.h) sizes it for the host.
 *
 * PDL  As the split kernel: wait for the previous kernel, then let the
 *   combine be scheduled.
 */
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "device_util.cuh"
#include "flashdecode.h"
#include "gpu_select.h"
#include "kernel_params.cuh"
#include "mma_loaders.cuh"
#include "mma_primitives.cuh"
#include "rows_common.cuh"
#include "split.h"

template <int D>
struct fd_rows_cfg {
  static constexpr int NW = FD_ROWS_WARPS;
  static constexpr int THREADS = 32 * NW;
  static constexpr int BM = 16 * NW;          /* rows a block */
  static constexpr int KT = FD_ROWS_KEYS;     /* keys a tile */
  static constexpr int STAGES = FD_ROWS_STAGES;
  static constexpr int CH = D / 8;            /* 16-byte chunks a row */
  static constexpr int KS = D / 16;           /* k-steps of Q K^T */
  static constexpr int NK = KT / 8;           /* score n-tiles */
  static constexpr int ND = D / 8;            /* O n-tiles */
  static constexpr size_t SMEM = FD_ROWS_SMEM(D);
  static_assert(SMEM == 2 * (size_t)STAGES * KT * D * 2 + (size_t)BM * D * 2 + (size_t)STAGES * KT,
                "gpu_select.h sizes the kernel the same way");
  static_assert(D == 64 || D == 128, "head_dim");
  /* K/V tiles are the split kernel's 4-warp tiles (keys a tile, threads,
   * swizzled rows): its loaders (mma_loaders.cuh) copy them */
  static_assert(fd_mma_cfg<D, NW>::KT == KT && fd_mma_cfg<D, NW>::THREADS == THREADS &&
                    fd_mma_cfg<D, NW>::CH == CH,
                "the loaders' tile");
};

/* Shared memory: K stages [ST][KT][D] | V stages [ST][KT][D] | Q [BM][D] |
 * key flags [ST][KT]. */
template <typename T, int D>
struct fd_rows_bufs {
  T *k, *v, *q;
  unsigned char *valid;
};

template <typename T, int D>
static __device__ __forceinline__ fd_rows_bufs<T, D> fd_rows_carve(unsigned char *smem) {
  using C = fd_rows_cfg<D>;
  fd_rows_bufs<T, D> sm;
  sm.k = reinterpret_cast<T *>(smem);
  sm.v = sm.k + C::STAGES * C::KT * D;
  sm.q = sm.v + C::STAGES * C::KT * D;
  sm.valid = reinterpret_cast<unsigned char *>(sm.q + C::BM * D);
  return sm;
}

/* Q rows row_base .. + BM - 1 of the block (zeros past rows_total) into sQ:
 * commit group 0. */
template <typename T, int D>
static __device__ __forceinline__ void fd_rows_load_q(const fd_kernel_params &p, int b, int hk,
                                                      int row_base, int rows_total, T *sQ) {
  using C = fd_rows_cfg<D>;
  for (int idx = threadIdx.x; idx < C::BM * C::CH; idx += C::THREADS) {
    const int r = idx / C::CH, c = idx % C::CH;
    const int row = row_base + r;
    const bool ok = row < rows_total;
    const T *src = static_cast<const T *>(p.q);
    if (ok) {
      const int gi = row / p.q_len;
      const int t = row - gi * p.q_len;
      src += (int64_t)b * p.q_strides[0] + (int64_t)t * p.q_strides[1] +
             ((int64_t)hk * p.group + gi) * p.q_strides[2] + c * 8;
    }
    fd_cp_async16(sQ + r * D + ((c ^ (r & 7)) << 3), src, ok);
  }
  fd_cp_async_commit();
}

/* The K/V copy pipeline (mma_loaders.cuh, fd_mma_copy_tile): contiguous
 * from running offsets (off), paged through page ids read a tile ahead
 * (pg). badq bit j: one of this thread's keys of tile i + j (i: the loop's
 * tile) is on a bad page; OR-ed over the block at tile i's barrier. */
template <int LOADS>
struct fd_rows_pipe {
  int64_t off[2], off_tile[2];
  int pg[LOADS];
  int pshift;
  const int32_t *bt_row;
  uint32_t badq;
};

/* Tile nt's copies into stage ns; sets badq bit `bit` when one of this
 * thread's keys is on a bad page. */
template <typename T, int D, int PG>
static __device__ __forceinline__ void fd_rows_issue(const fd_kernel_params &p,
                                                     const fd_rows_bufs<T, D> &sm, const T *k_head,
                                                     const T *v_head, int begin, int end, int nt,
                                                     int ns, const int (&pg)[fd_mma_copy<D, FD_ROWS_WARPS>::LOADS],
                                                     fd_rows_pipe<fd_mma_copy<D, FD_ROWS_WARPS>::LOADS> &pp,
                                                     int bit) {
  using C = fd_rows_cfg<D>;
  constexpr int KT = C::KT;
  if (fd_mma_copy_tile<T, D, C::NW, D, PG>(
          p, k_head, v_head, pp.pshift, begin + nt * KT, 0, min(KT, end - (begin + nt * KT)), pg,
          reinterpret_cast<unsigned char *>(sm.k + ns * KT * D),
          reinterpret_cast<unsigned char *>(sm.v + ns * KT * D), sm.valid + ns * KT, pp.off,
          pp.off_tile))
    pp.badq |= 1u << bit;
}

/* Pipeline prologue: the page ids of tiles 0 .. ST-1 (one block_table round
 * trip), tiles 0 .. ST-2 copied, a commit group each (empty or not). */
template <typename T, int D, int PG>
static __device__ __forceinline__ void fd_rows_prologue(
    const fd_kernel_params &p, int b, int begin, int end, int num_tiles,
    const fd_rows_bufs<T, D> &sm, const T *k_head, const T *v_head,
    fd_rows_pipe<fd_mma_copy<D, FD_ROWS_WARPS>::LOADS> &pp) {
  using C = fd_rows_cfg<D>;
  constexpr int KT = C::KT, ST = C::STAGES, LOADS = fd_mma_copy<D, C::NW>::LOADS;
  /* the loader, a template constant (fd_mma_loader_pg): PG 1 reads one page
   * id a tile, PG 2 one a key */
  constexpr bool paged = PG != 0;
  constexpr bool one_page = PG == 1;
  pp.pshift = fd_mma_page_shift<PG>(p.page_size);
  pp.bt_row = paged ? p.block_table + (int64_t)b * p.block_table_stride : nullptr;
  if constexpr (!paged) fd_mma_contig_offsets<T, D, C::NW>(p, b, begin, pp.off, pp.off_tile);
  int pgp[ST][LOADS];
#pragma unroll
  for (int s = 0; s < ST; s++) {
#pragma unroll
    for (int n = 0; n < LOADS; n++) pgp[s][n] = -1;
    if (paged && s < num_tiles)
      fd_mma_page_ids<D, C::NW, one_page>(pp.bt_row, p.page_size, pp.pshift, begin + s * KT,
                                          min(KT, end - (begin + s * KT)), pgp[s]);
  }
  pp.badq = 0;
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < num_tiles) fd_rows_issue<T, D, PG>(p, sm, k_head, v_head, begin, end, s, s, pgp[s], pp, s);
    fd_cp_async_commit();
  }
#pragma unroll
  for (int n = 0; n < LOADS; n++) pp.pg[n] = pgp[ST - 1][n];
}

/* The top of tile i: wait for its copies; the block barrier (the stage tile
 * i - 1 used is free; returns whether tile i has a bad page); the next tile
 * into the freed stage and its successor's page ids. */
template <typename T, int D, int PG>
static __device__ __forceinline__ bool fd_rows_wait_refill(
    const fd_kernel_params &p, int i, int begin, int end, int num_tiles,
    const fd_rows_bufs<T, D> &sm, const T *k_head, const T *v_head,
    fd_rows_pipe<fd_mma_copy<D, FD_ROWS_WARPS>::LOADS> &pp) {
  using C = fd_rows_cfg<D>;
  constexpr int KT = C::KT, ST = C::STAGES;
  constexpr bool paged = PG != 0;
  constexpr bool one_page = PG == 1;
  fd_cp_async_wait<ST - 2>(); /* tile i landed (this thread's copies) */
  const bool bad_tile = __syncthreads_or((int)(pp.badq & 1u)) != 0;
  const int nt = i + ST - 1;
  if (nt < num_tiles)
    fd_rows_issue<T, D, PG>(p, sm, k_head, v_head, begin, end, nt, nt % ST, pp.pg, pp, ST - 1);
  fd_cp_async_commit();
  pp.badq >>= 1;
  if (paged && nt + 1 < num_tiles) /* the next copy's ids, a tile ahead */
    fd_mma_page_ids<D, C::NW, one_page>(pp.bt_row, p.page_size, pp.pshift, begin + (nt + 1) * KT,
                                        min(KT, end - (begin + (nt + 1) * KT)), pp.pg);
  return bad_tile;
}

/* S = Q K^T for the warp's 16 rows and the tile's KT keys: K's B fragments
 * by ldmatrix.x4 (keys x chunk pairs). */
template <typename T, int D>
static __device__ __forceinline__ void fd_rows_qk(uint32_t kt_u, int lane,
                                                  const uint32_t (&qa)[D / 16][4],
                                                  float (&s)[fd_rows_cfg<D>::NK][4]) {
  using C = fd_rows_cfg<D>;
  const int mi = lane >> 3;
  const int k_row = (mi >> 1) * 8 + (lane & 7); /* keys (n-tile pair half), chunk + (mi & 1) */
#pragma unroll
  for (int n = 0; n < C::NK; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < C::KS; ks++) {
#pragma unroll
    for (int np = 0; np < C::NK / 2; np++) {
      uint32_t kb[4];
      fd_ldmatrix_x4(kb, kt_u + fd_swz<D>(np * 16 + k_row, 2 * ks + (mi & 1)));
      fd_mma16816<T>(s[2 * np], qa[ks], kb[0], kb[1]);
      fd_mma16816<T>(s[2 * np + 1], qa[ks], kb[2], kb[3]);
    }
  }
}

/* O += P V, k-step kk = keys 16 kk .. + 15 (score n-tiles 2 kk, 2 kk + 1):
 * P's A fragments are the score accumulators packed in place (hi and lo
 * parts), V's B fragments by ldmatrix.x4.trans. */
template <typename T, int D>
static __device__ __forceinline__ void fd_rows_pv(uint32_t vt_u, int lane,
                                                  const float (&s)[fd_rows_cfg<D>::NK][4],
                                                  float (&o)[D / 8][4]) {
  using C = fd_rows_cfg<D>;
  const int mi = lane >> 3;
  const int v_row = (mi & 1) * 8 + (lane & 7); /* keys (k half), chunk + (mi >> 1) */
#pragma unroll
  for (int kk = 0; kk < C::KT / 16; kk++) {
    uint32_t ph[4], pl[4];
    fd_pack2_split<T>(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
    fd_pack2_split<T>(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
    fd_pack2_split<T>(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
    fd_pack2_split<T>(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
    for (int dp = 0; dp < C::ND / 2; dp++) {
      uint32_t vb[4];
      fd_ldmatrix_x4_trans(vb, vt_u + fd_swz<D>(kk * 16 + v_row, 2 * dp + (mi >> 1)));
      fd_mma16816<T>(o[2 * dp], ph, vb[0], vb[1]);
      fd_mma16816<T>(o[2 * dp + 1], ph, vb[2], vb[3]);
      fd_mma16816<T>(o[2 * dp], pl, vb[0], vb[1]);
      fd_mma16816<T>(o[2 * dp + 1], pl, vb[2], vb[3]);
    }
  }
}

template <typename T, int D, int PG>
__global__ void __launch_bounds__(32 * FD_ROWS_WARPS, 2)
    fd_rows_mma_kernel(const __grid_constant__ fd_kernel_params p) {
  using C = fd_rows_cfg<D>;
  constexpr int KT = C::KT, ST = C::STAGES;
  extern __shared__ __align__(128) unsigned char fd_rows_smem[];
  fd_pdl_wait();
  fd_pdl_launch_dependents();

  const int rows_total = p.group * p.q_len;
  const int row_tiles = (rows_total + C::BM - 1) / C::BM;
  const int split = blockIdx.x;
  const int hk = blockIdx.y / row_tiles;
  const int row_base = (blockIdx.y - hk * row_tiles) * C::BM;
  const int b = blockIdx.z;
  int kv = fd_kv_len(p, b);
  int begin, end;
  fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
               &begin, &end);
  if (p.num_splits > 1 && begin >= end) return; /* past the last key: the combine skips it */

  const fd_rows_bufs<T, D> sm = fd_rows_carve<T, D>(fd_rows_smem);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, qd = lane & 3;
  const T *k_head = static_cast<const T *>(p.k_cache) + (int64_t)hk * p.k_strides[2];
  const T *v_head = static_cast<const T *>(p.v_cache) + (int64_t)hk * p.v_strides[2];

  fd_rows_load_q<T, D>(p, b, hk, row_base, rows_total, sm.q);
  const int num_tiles = (end - begin + KT - 1) / KT;
  fd_rows_pipe<fd_mma_copy<D, C::NW>::LOADS> pp;
  fd_rows_prologue<T, D, PG>(p, b, begin, end, num_tiles, sm, k_head, v_head, pp);

  /* Q's A fragments: rows 16 warp + (g, g + 8), k-step ks */
  fd_cp_async_wait<ST - 1>(); /* group 0 (Q) landed for this thread */
  __syncthreads();
  uint32_t qa[C::KS][4];
  {
    const uint32_t sQ_u = (uint32_t)__cvta_generic_to_shared(sm.q);
    const int mi = lane >> 3;
    const int r = warp * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
    for (int ks = 0; ks < C::KS; ks++) {
      fd_ldmatrix_x4(qa[ks], sQ_u + fd_swz<D>(r, 2 * ks + (mi >> 1)));
    }
  }

  /* a tree mask: the masks of rows g and g + 8 */
  fd_rows_tree tree = fd_rows_tree_load(p, b, row_base + warp * 16 + g, rows_total);
  const int prefix = kv - p.q_len; /* keys before it are seen by every tree row */

  float o[C::ND][4];
#pragma unroll
  for (int n = 0; n < C::ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY; /* rows g, g + 8 (base 2) */
  float l0 = 0.0f, l1 = 0.0f;           /* this lane's part of their sums */
  const float scale = p.scale_log2;
  const bool capped = p.cap_out != 0.0f;
  const uint32_t sK_u = (uint32_t)__cvta_generic_to_shared(sm.k);
  const uint32_t sV_u = (uint32_t)__cvta_generic_to_shared(sm.v);

  int stage = 0;
  for (int i = 0; i < num_tiles; i++) {
    const bool bad_tile =
        fd_rows_wait_refill<T, D, PG>(p, i, begin, end, num_tiles, sm, k_head, v_head, pp);
    const int key0 = begin + i * KT;
    const int nk = min(KT, end - key0);
    float s[C::NK][4];
    fd_rows_qk<T, D>(sK_u + (uint32_t)(stage * KT * D * 2), lane, qa, s);
    tree.on = p.tree_mask != nullptr && key0 + nk > prefix;
    tree.d0 = key0 - prefix;
    fd_rows_mask<D, PG == 0>(p, scale, capped, qd, nk, bad_tile, sm.valid + stage * KT, tree, s);
    fd_rows_softmax<D>(s, o, m0, m1, l0, l1);
    fd_rows_pv<T, D>(sV_u + (uint32_t)(stage * KT * D * 2), lane, s, o);
    stage = stage + 1 == ST ? 0 : stage + 1;
  }
  fd_cp_async_wait<0>(); /* only empty groups can remain */
  fd_rows_finish<T, D>(p, b, hk, split, row_base + warp * 16 + g, rows_total, o, m0, m1, l0, l1);
}

template <typename T, int D, int PG>
static cudaError_t fd_rows_mma_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  using C = fd_rows_cfg<D>;
  cudaError_t e = cudaFuncSetAttribute(fd_rows_mma_kernel<T, D, PG>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(fd_rows_mma_kernel<T, D, PG>, cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  const int row_tiles = (p->group * p->q_len + C::BM - 1) / C::BM;
  return fd_launch(fd_rows_mma_kernel<T, D, PG>, *p,
                   dim3((unsigned)p->num_splits, (unsigned)(p->num_heads_kv * row_tiles),
                        (unsigned)p->batch),
                   dim3(C::THREADS), C::SMEM, stream, p->pdl == FD_PDL_ALL);
}

/* The loader as a template constant (PG, fd_mma_loader_pg): contiguous,
 * paged with one page id a tile (page_size a power of two >= the tiles' keys
 * per thread), or paged with one a key. */
template <typename T, int D>
static cudaError_t fd_rows_mma_launch_layout(const fd_kernel_params *p, cudaStream_t stream) {
  switch (fd_mma_loader_pg(p->page_size, fd_mma_copy<D, fd_rows_cfg<D>::NW>::LOADS)) {
    case 0: return fd_rows_mma_launch_instance<T, D, 0>(p, stream);
    case 1: return fd_rows_mma_launch_instance<T, D, 1>(p, stream);
    case 2: return fd_rows_mma_launch_instance<T, D, 2>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t fd_rows_mma_launch(const fd_kernel_params *p, cudaStream_t stream) {
  if (p->kv_dtype != 0 && p->kv_dtype != p->dtype) return cudaErrorInvalidValue;
  const int64_t grid_y = (int64_t)p->num_heads_kv * fd_rows_tiles(p->group, p->q_len, 16 * FD_ROWS_WARPS);
  if (grid_y > 65535) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case FD_DTYPE_F16:
      if (p->head_dim == 64) return fd_rows_mma_launch_layout<__half, 64>(p, stream);
      if (p->head_dim == 128) return fd_rows_mma_launch_layout<__half, 128>(p, stream);
      break;
    case FD_DTYPE_BF16:
      if (p->head_dim == 64) return fd_rows_mma_launch_layout<__nv_bfloat16, 64>(p, stream);
      if (p->head_dim == 128) return fd_rows_mma_launch_layout<__nv_bfloat16, 128>(p, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

template <typename T, int D>
static cudaError_t fd_rows_mma_occupancy_instance(int *blocks_per_sm) {
  using C = fd_rows_cfg<D>;
  const cudaError_t e = cudaFuncSetAttribute(
      fd_rows_mma_kernel<T, D, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM);
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, fd_rows_mma_kernel<T, D, 0>,
                                                       C::THREADS, C::SMEM);
}

cudaError_t fd_rows_mma_occupancy(int dtype, int head_dim, int *blocks_per_sm) {
  *blocks_per_sm = 0;
  const bool bf16 = dtype == FD_DTYPE_BF16;
  if (dtype != FD_DTYPE_F16 && !bf16) return cudaErrorInvalidValue;
  if (head_dim == 64)
    return bf16 ? fd_rows_mma_occupancy_instance<__nv_bfloat16, 64>(blocks_per_sm)
                : fd_rows_mma_occupancy_instance<__half, 64>(blocks_per_sm);
  if (head_dim == 128)
    return bf16 ? fd_rows_mma_occupancy_instance<__nv_bfloat16, 128>(blocks_per_sm)
                : fd_rows_mma_occupancy_instance<__half, 128>(blocks_per_sm);
  return cudaErrorInvalidValue;
}
