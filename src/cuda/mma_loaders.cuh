/*
 * mma_loaders.cuh — the loaders of the tensor-core split kernel: how a tile
 * of K and V goes global -> shared (cp.async, 16 bytes a copy, swizzled
 * rows) from a contiguous cache or through a block_table, which thread
 * copies which keys, and which keys are zero-filled instead of read (past
 * the pass's keys, before its first visible key, head_dim padding, a page id
 * outside the pool). A new cache format (fp8) is a new loader here; the tile
 * math in split_mma_kernel.cu reads the same shared-memory tiles. Internal
 * to src/cuda.
 */
#ifndef FD_CUDA_MMA_LOADERS_CUH
#define FD_CUDA_MMA_LOADERS_CUH

#include <stdint.h>

#include "device_util.cuh"
#include "kernel_params.cuh"
#include "mma_config.cuh"

/* The copy mapping of a tile: thread tid copies 16-byte chunk c = tid % CH of
 * the LOADS consecutive keys kr * LOADS + n (n < LOADS), kr = tid / CH, of
 * both K and V. A warp's copy instruction still covers whole rows (its 32
 * threads are 4, 2 or 1 kr by CH = 8, 16 or 32 chunks), and a thread's keys
 * of a tile sit on one page whenever page_size is a power of two >= LOADS
 * (measured: with keys RSTEP rows apart each needed its own page lookup,
 * ~28 instructions a key, bench/NOTES.md). */
template <int D, int NW>
struct fd_mma_copy {
  static constexpr int RSTEP = fd_mma_cfg<D, NW>::THREADS / fd_mma_cfg<D, NW>::CH; /* row groups */
  static constexpr int LOADS = fd_mma_cfg<D, NW>::KT / RSTEP; /* keys per thread */
  static_assert(LOADS == 4 || LOADS == 8, "keys per thread: tiles start at multiples of LOADS");
};

/* Contiguous cache: copies the tile whose key kr * LOADS (this thread's
 * first key) sits at element offsets k_off / v_off of k_head / v_head (chunk
 * included); key rows are k_row / v_row elements apart; keys >= nkeys are
 * zero-filled and not read. */
template <typename T, int D, int NW, int DV>
static __device__ __forceinline__ void fd_mma_copy_contig(const T *k_head, const T *v_head,
                                                          int64_t k_off, int64_t v_off,
                                                          int64_t k_row, int64_t v_row, T *sK,
                                                          T *sV, int klo, int nkeys) {
  using M = fd_mma_copy<D, NW>;
  const int c = (int)threadIdx.x % fd_mma_cfg<D, NW>::CH;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
  const bool col_ok = DV == D || c < DV / 8; /* padded columns: zeros, no read */
#pragma unroll
  for (int n = 0; n < M::LOADS; n++) {
    const int kl = k0 + n;
    const bool ok = kl < nkeys && kl >= klo && col_ok;
    const int soff = kl * D + ((c ^ (kl & 7)) << 3);
    fd_cp_async16(sK + soff, ok ? k_head + (k_off + n * k_row) : k_head, ok);
    fd_cp_async16(sV + soff, ok ? v_head + (v_off + n * v_row) : v_head, ok);
  }
}

/* Paged cache: the page ids of this thread's keys of the tile at key0 (-1 for
 * keys >= nkeys), loaded one tile ahead of their use so that the
 * block_table latency hides behind a tile of math. one_page (page_size a
 * power of two >= LOADS): the thread's keys share one page, only pg[0] is
 * loaded. pshift = log2(page_size) when it is a power of two, else -1. */
template <int D, int NW>
static __device__ __forceinline__ void fd_mma_page_ids(const int32_t *bt_row, int page_size,
                                                       int pshift, bool one_page, int key0,
                                                       int nkeys,
                                                       int (&pg)[fd_mma_copy<D, NW>::LOADS]) {
  using M = fd_mma_copy<D, NW>;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
#pragma unroll
  for (int n = 0; n < M::LOADS; n++) pg[n] = -1;
  if (one_page) {
    if (k0 < nkeys) pg[0] = __ldg(bt_row + ((key0 + k0) >> pshift));
    return;
  }
#pragma unroll
  for (int n = 0; n < M::LOADS; n++) {
    const int j = key0 + k0 + n;
    if (k0 + n < nkeys) pg[n] = __ldg(bt_row + (pshift >= 0 ? j >> pshift : j / page_size));
  }
}

/* Paged cache: copies the tile at key0 with the page ids from
 * fd_mma_page_ids; a key past nkeys or on a page id outside [0, num_pages)
 * (num_pages > 0) is zero-filled and reads nothing. With num_pages > 0 the
 * keys' validity goes to the byte flags `valid` (a score reads them only in a
 * tile with a bad page) and the return value says whether any of this
 * thread's keys sits on a bad page. */
template <typename T, int D, int NW, int DV>
static __device__ __forceinline__ bool fd_mma_copy_paged(const fd_kernel_params &p,
                                                         const T *k_head, const T *v_head,
                                                         int pshift, bool one_page, int key0,
                                                         int klo, int nkeys,
                                                         const int (&pg)[fd_mma_copy<D, NW>::LOADS],
                                                         T *sK, T *sV, unsigned char *valid) {
  using M = fd_mma_copy<D, NW>;
  const int c = (int)threadIdx.x % fd_mma_cfg<D, NW>::CH;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
  const bool flags = p.num_pages > 0;
  const bool col_ok = DV == D || c < DV / 8; /* padded columns: zeros, no read */
  if (one_page) {
    const int page = pg[0];
    const bool page_ok = !flags || (page >= 0 && page < p.num_pages);
    const int pos = (key0 + k0) & (p.page_size - 1);
    const int64_t k_off = (int64_t)page * p.k_strides[0] + (int64_t)pos * p.k_strides[1] + c * 8;
    const int64_t v_off = (int64_t)page * p.v_strides[0] + (int64_t)pos * p.v_strides[1] + c * 8;
#pragma unroll
    for (int n = 0; n < M::LOADS; n++) {
      const int kl = k0 + n;
      const bool ok = kl < nkeys && kl >= klo && page_ok && col_ok;
      const int soff = kl * D + ((c ^ (kl & 7)) << 3);
      fd_cp_async16(sK + soff, ok ? k_head + (k_off + n * p.k_strides[1]) : k_head, ok);
      fd_cp_async16(sV + soff, ok ? v_head + (v_off + n * p.v_strides[1]) : v_head, ok);
    }
    if (flags && c == 0) { /* LOADS flags of 1 or 0 in one store */
      if constexpr (M::LOADS == 8)
        *reinterpret_cast<uint64_t *>(valid + k0) = page_ok ? 0x0101010101010101ull : 0ull;
      else
        *reinterpret_cast<uint32_t *>(valid + k0) = page_ok ? 0x01010101u : 0u;
    }
    return k0 < nkeys && k0 + M::LOADS > klo && !page_ok;
  }
  bool bad = false;
#pragma unroll
  for (int n = 0; n < M::LOADS; n++) {
    const int kl = k0 + n;
    const int j = key0 + kl;
    const int page = pg[n];
    const bool page_ok = !flags || (page >= 0 && page < p.num_pages);
    const bool ok = kl < nkeys && kl >= klo && page_ok && col_ok;
    bad = bad || (kl < nkeys && kl >= klo && !page_ok);
    const int pos = pshift >= 0 ? (j & (p.page_size - 1)) : j % p.page_size;
    const int64_t k_off = (int64_t)page * p.k_strides[0] + (int64_t)pos * p.k_strides[1] + c * 8;
    const int64_t v_off = (int64_t)page * p.v_strides[0] + (int64_t)pos * p.v_strides[1] + c * 8;
    const int soff = kl * D + ((c ^ (kl & 7)) << 3);
    fd_cp_async16(sK + soff, ok ? k_head + k_off : k_head, ok);
    fd_cp_async16(sV + soff, ok ? v_head + v_off : v_head, ok);
    if (flags && c == 0) valid[kl] = page_ok ? 1 : 0;
  }
  return bad;
}

#endif /* FD_CUDA_MMA_LOADERS_CUH */
