/*
 * mma_loaders.cuh — the loaders of the tensor-core split kernel: how a tile
 * of K and V goes global -> shared (cp.async, 16 bytes a copy, swizzled
 * rows) from a contiguous cache or through a block_table, which thread
 * copies which keys, and which keys are zero-filled instead of read (past
 * the pass's keys, before its first visible key, head_dim padding, a page id
 * outside the pool). One loader a layout (contiguous; paged with one page id
 * a tile; paged with one id a key), each for 16-bit and fp8 elements (one or
 * two 16-byte streams a thread, fd_mma_lane); the tensor-core split kernel
 * (split_mma_kernel.cuh) and the rows kernel (rows_mma_kernel.cu) read the
 * tiles. Internal to src/cuda.
 */
#ifndef FD_CUDA_MMA_LOADERS_CUH
#define FD_CUDA_MMA_LOADERS_CUH

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device_util.cuh"
#include "kernel_params.cuh"
#include "mma_config.cuh"
#include "mma_primitives.cuh"

/* The copy mapping of a tile: thread tid copies 16-byte chunk c = tid % CH of
 * the LOADS consecutive keys kr * LOADS + n (n < LOADS), kr = tid / CH, of
 * both K and V. A warp's copy instruction still covers whole rows (its 32
 * threads are 4, 2 or 1 kr by CH = 8, 16 or 32 chunks), and a thread's keys
 * of a tile sit on one page whenever page_size is a power of two >= LOADS
 * (the PG 1 loader, fd_mma_loader_pg; with keys RSTEP rows apart each
 * would need its own page lookup, ~28 instructions a key). */
template <int D, int NW>
struct fd_mma_copy {
  static constexpr int RSTEP = fd_mma_cfg<D, NW>::THREADS / fd_mma_cfg<D, NW>::CH; /* row groups */
  static constexpr int LOADS = fd_mma_cfg<D, NW>::KT / RSTEP; /* keys per thread */
  static_assert(LOADS == 4 || LOADS == 8, "keys per thread: tiles start at multiples of LOADS");
};

/* The loader of a launch, the kernels' template constant PG, from page_size
 * and the config's keys per thread (loads = fd_mma_copy<D, NW>::LOADS):
 *   0  contiguous cache (page_size <= 0);
 *   1  paged, page_size a power of two >= loads: a thread's keys of a tile
 *      share a page, one page id a tile (ONE_PAGE below);
 *   2  paged, any other page_size (not a power of two, or below loads): a
 *      page id a key, its position by a shift or a division.
 * Each instance holds one of the three copy paths (split_mma_kernel.cuh CODE
 * SIZE). */
static inline int fd_mma_loader_pg(int page_size, int loads) {
  if (page_size <= 0) return 0;
  return (page_size & (page_size - 1)) == 0 && page_size >= loads ? 1 : 2;
}

/* log2(page_size) when it is a power of two (always so under PG 1), else -1
 * (PG 0: unused). */
template <int PG>
static __device__ __forceinline__ int fd_mma_page_shift(int page_size) {
  if constexpr (PG == 1) return __ffs(page_size) - 1;
  else if constexpr (PG == 2) return (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  else return -1;
}

/* Paged cache: the page ids of this thread's keys of the tile at key0 (-1 for
 * keys >= nkeys), loaded one tile ahead of their use so that the
 * block_table latency hides behind a tile of math. ONE_PAGE (PG 1: page_size
 * a power of two >= LOADS, a template constant): the thread's keys share one
 * page, only pg[0] is loaded. pshift = log2(page_size) when it is a power of
 * two, else -1 (fd_mma_page_shift). */
template <int D, int NW, bool ONE_PAGE>
static __device__ __forceinline__ void fd_mma_page_ids(const int32_t *bt_row, int page_size,
                                                       int pshift, int key0, int nkeys,
                                                       int (&pg)[fd_mma_copy<D, NW>::LOADS]) {
  using M = fd_mma_copy<D, NW>;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
#pragma unroll
  for (int n = 0; n < M::LOADS; n++) pg[n] = -1;
  if constexpr (ONE_PAGE) {
    if (k0 < nkeys) pg[0] = __ldg(bt_row + ((key0 + k0) >> pshift));
  } else {
#pragma unroll
    for (int n = 0; n < M::LOADS; n++) {
      const int j = key0 + k0 + n;
      if (k0 + n < nkeys) pg[n] = __ldg(bt_row + (pshift >= 0 ? j >> pshift : j / page_size));
    }
  }
}

/* LOADS key-valid flags of one page (1 or 0 each) in one store. */
template <int LOADS>
static __device__ __forceinline__ void fd_mma_page_flags(unsigned char *valid, bool page_ok) {
  if constexpr (LOADS == 8)
    *reinterpret_cast<uint64_t *>(valid) = page_ok ? 0x0101010101010101ull : 0ull;
  else
    *reinterpret_cast<uint32_t *>(valid) = page_ok ? 0x01010101u : 0u;
}

/* ---- The three loaders, one a layout, for every element format ----
 *
 * An element E of the cache: the 16-bit T (fp16, bf16) or the fp8 byte. A
 * copy moves 16 bytes, VEC = 16 / sizeof(E) elements; a row of D elements
 * has D / VEC such chunks. Thread tid has the chunk c = tid % CH of a
 * 16-bit row (CH = D / 8) and the keys k0 = tid / CH * LOADS .. + LOADS - 1:
 *   16-bit  two streams: K's chunk c and V's chunk c;
 *   fp8     a row has CH / 2 chunks: one stream, K's chunk c (c < CH / 2) or
 *           V's chunk c - CH / 2.
 * Chunks past DV / VEC (head_dim 80, 96 in 128-wide rows), keys before klo
 * or past nkeys and keys on a page id outside [0, num_pages) are zero-filled
 * without a read. 16-bit chunk f of row k sits at fd_swz (f ^ (k & 7)), fp8
 * at fd_swz8, so every ldmatrix phase hits 8 different bank groups. */

/* One stream of a thread's copies: the cache head (kv head included), its
 * key-row and page strides in elements, and the stage buffer. */
template <typename E>
struct fd_mma_stream {
  const E *head;
  int64_t row;  /* elements from one key to the next (strides[1]) */
  int64_t page; /* elements from one page (paged) or sequence to the next (strides[0]) */
  E *dst;       /* the stage buffer */
};

/* This thread's part of a tile's copies for the element E (see above). */
template <typename E, int D, int NW>
struct fd_mma_lane {
  static constexpr int CH = fd_mma_cfg<D, NW>::CH;
  static constexpr int VEC = 16 / (int)sizeof(E); /* elements a copy */
  static constexpr int CHR = D / VEC;             /* chunks a row of E */
  static constexpr int NS = CHR == CH ? 2 : 1;    /* streams: K and V, or one of them */
  static constexpr int LOADS = fd_mma_copy<D, NW>::LOADS;
  static_assert(CHR == CH || 2 * CHR == CH, "16-bit or fp8 elements");
  int k0;    /* the thread's first key of a tile */
  int f;     /* its chunk of a row of E */
  bool col_ok; /* the chunk holds head_dim columns (else zeros, no read) */
  bool is_v;   /* fp8: the stream is V's */
  fd_mma_stream<E> st[NS];
};

/* The copy role of this thread for the stage buffers dK, dV. */
template <typename E, int D, int NW, int DV>
static __device__ __forceinline__ fd_mma_lane<E, D, NW> fd_mma_lane_of(
    const fd_kernel_params &p, const E *k_head, const E *v_head, unsigned char *dK,
    unsigned char *dV) {
  using L = fd_mma_lane<E, D, NW>;
  L l;
  const int c = (int)threadIdx.x % L::CH;
  l.k0 = (int)threadIdx.x / L::CH * L::LOADS;
  const fd_mma_stream<E> k = {k_head, p.k_strides[1], p.k_strides[0], reinterpret_cast<E *>(dK)};
  const fd_mma_stream<E> v = {v_head, p.v_strides[1], p.v_strides[0], reinterpret_cast<E *>(dV)};
  if constexpr (L::NS == 2) {
    l.f = c;
    l.is_v = false;
    l.st[0] = k;
    l.st[1] = v;
  } else {
    l.is_v = c >= L::CHR;
    l.f = l.is_v ? c - L::CHR : c;
    l.st[0].head = l.is_v ? v.head : k.head;
    l.st[0].row = l.is_v ? v.row : k.row;
    l.st[0].page = l.is_v ? v.page : k.page;
    l.st[0].dst = l.is_v ? v.dst : k.dst;
  }
  l.col_ok = DV == D || l.f < DV / L::VEC;
  return l;
}

/* Offset (elements of E) of chunk f of tile row kl in a stage buffer
 * (unsigned for fp8, as fd_swz8 gives it). */
template <typename E, int D>
static __device__ __forceinline__ auto fd_mma_tile_off(int kl, int f) {
  if constexpr (sizeof(E) == 1) return fd_swz8<D>(kl, f);
  else return kl * D + ((f ^ (kl & 7)) << 3);
}

/* (The loaders below take a thread's one or two streams by constant index,
 * not in a loop over them: the copies' inline assembly clobbers memory, and
 * stream fields read in a loop were reloaded a key, ~2 % more code.) */

/* A full tile's LOADS keys of this thread: stream 0 (and 1) from src0
 * (src1), stepping the stream's row stride a key; nothing read (zeros)
 * unless ok. */
template <typename E, int D, int NW>
static __device__ __forceinline__ void fd_mma_copy_keys(const fd_mma_lane<E, D, NW> &l,
                                                        const E *src0, const E *src1, bool ok) {
  using L = fd_mma_lane<E, D, NW>;
#pragma unroll
  for (int n = 0; n < L::LOADS; n++) {
    const auto soff = fd_mma_tile_off<E, D>(l.k0 + n, l.f);
    fd_cp_async16(l.st[0].dst + soff, ok ? src0 : l.st[0].head, ok);
    if constexpr (L::NS == 2) fd_cp_async16(l.st[1].dst + soff, ok ? src1 : l.st[1].head, ok);
    src0 += l.st[0].row;
    if constexpr (L::NS == 2) src1 += l.st[1].row;
  }
}

/* Keys kl = k0 + n with klo <= kl < nkeys (and ok_all): stream 0 (and 1)
 * from element offset off0 (off1) + n * row. */
template <typename E, int D, int NW>
static __device__ __forceinline__ void fd_mma_copy_some(const fd_mma_lane<E, D, NW> &l,
                                                        int64_t off0, int64_t off1, int klo,
                                                        int nkeys, bool ok_all) {
  using L = fd_mma_lane<E, D, NW>;
#pragma unroll
  for (int n = 0; n < L::LOADS; n++) {
    const int kl = l.k0 + n;
    const bool ok = kl < nkeys && kl >= klo && ok_all;
    const auto soff = fd_mma_tile_off<E, D>(kl, l.f);
    fd_cp_async16(l.st[0].dst + soff, ok ? l.st[0].head + (off0 + n * l.st[0].row) : l.st[0].head,
                  ok);
    if constexpr (L::NS == 2)
      fd_cp_async16(l.st[1].dst + soff, ok ? l.st[1].head + (off1 + n * l.st[1].row) : l.st[1].head,
                    ok);
  }
}

/* Contiguous cache: the tile whose first key of this thread sits at element
 * offsets off[0] of k_head and off[1] of v_head (the chunk included); keys
 * before klo or past nkeys are zero-filled, not read. */
template <typename E, int D, int NW>
static __device__ __forceinline__ void fd_mma_copy_contig(const fd_mma_lane<E, D, NW> &l,
                                                          const int64_t (&off)[2], int klo,
                                                          int nkeys) {
  using L = fd_mma_lane<E, D, NW>;
  const int64_t off0 = L::NS == 1 && l.is_v ? off[1] : off[0], off1 = off[1];
  if (klo <= 0 && nkeys >= fd_mma_cfg<D, NW>::KT) { /* every key (block-uniform): no per-key test */
    fd_mma_copy_keys<E, D, NW>(l, l.st[0].head + off0, l.st[L::NS - 1].head + off1, l.col_ok);
    return;
  }
  fd_mma_copy_some<E, D, NW>(l, off0, off1, klo, nkeys, l.col_ok);
}

/* Paged cache, one page id a tile (PG 1: page_size a power of two >= LOADS,
 * so this thread's keys of the tile share the page pg[0]); flags and return
 * value as fd_mma_copy_page_keys. */
template <typename E, int D, int NW>
static __device__ __forceinline__ bool fd_mma_copy_page_tile(
    const fd_kernel_params &p, const fd_mma_lane<E, D, NW> &l, int key0, int klo, int nkeys,
    const int (&pg)[fd_mma_copy<D, NW>::LOADS], unsigned char *valid) {
  using L = fd_mma_lane<E, D, NW>;
  const bool flags = p.num_pages > 0;
  const bool first = (int)threadIdx.x % L::CH == 0; /* writes the flags of its keys */
  const int page = pg[0];
  const bool page_ok = !flags || (page >= 0 && page < p.num_pages);
  const int pos = (key0 + l.k0) & (p.page_size - 1);
  const int64_t off0 = (int64_t)page * l.st[0].page + (int64_t)pos * l.st[0].row + l.f * L::VEC;
  const int64_t off1 = (int64_t)page * l.st[L::NS - 1].page + (int64_t)pos * l.st[L::NS - 1].row +
                       l.f * L::VEC;
  if (klo <= 0 && nkeys >= fd_mma_cfg<D, NW>::KT) { /* every key (block-uniform): no per-key test */
    fd_mma_copy_keys<E, D, NW>(l, l.st[0].head + off0, l.st[L::NS - 1].head + off1,
                               page_ok && l.col_ok);
    if (flags && first) fd_mma_page_flags<L::LOADS>(valid + l.k0, page_ok);
    return !page_ok;
  }
  fd_mma_copy_some<E, D, NW>(l, off0, off1, klo, nkeys, page_ok && l.col_ok);
  if (flags && first) fd_mma_page_flags<L::LOADS>(valid + l.k0, page_ok);
  return l.k0 < nkeys && l.k0 + L::LOADS > klo && !page_ok;
}

/* Paged cache, one page id a key (PG 2: page_size not a power of two, or
 * below LOADS): the tile at key0 with the ids pg from fd_mma_page_ids; a key
 * past nkeys or on a page id outside [0, num_pages) (num_pages > 0) is
 * zero-filled and reads nothing. With num_pages > 0 the keys' validity goes
 * to the byte flags `valid` (a score reads them only in a tile with a bad
 * page); returns whether one of this thread's keys sits on a bad page. */
template <typename E, int D, int NW>
static __device__ __forceinline__ bool fd_mma_copy_page_keys(
    const fd_kernel_params &p, const fd_mma_lane<E, D, NW> &l, int pshift, int key0, int klo,
    int nkeys, const int (&pg)[fd_mma_copy<D, NW>::LOADS], unsigned char *valid) {
  using L = fd_mma_lane<E, D, NW>;
  const bool flags = p.num_pages > 0;
  const bool first = (int)threadIdx.x % L::CH == 0;
  bool bad = false;
#pragma unroll
  for (int n = 0; n < L::LOADS; n++) {
    const int kl = l.k0 + n;
    const int j = key0 + kl;
    const int page = pg[n];
    const bool page_ok = !flags || (page >= 0 && page < p.num_pages);
    const bool ok = kl < nkeys && kl >= klo && page_ok && l.col_ok;
    bad = bad || (kl < nkeys && kl >= klo && !page_ok);
    const int pos = pshift >= 0 ? (j & (p.page_size - 1)) : j % p.page_size;
    const int64_t off0 = (int64_t)page * l.st[0].page + (int64_t)pos * l.st[0].row + l.f * L::VEC;
    const int64_t off1 = (int64_t)page * l.st[L::NS - 1].page +
                         (int64_t)pos * l.st[L::NS - 1].row + l.f * L::VEC;
    const auto soff = fd_mma_tile_off<E, D>(kl, l.f);
    fd_cp_async16(l.st[0].dst + soff, ok ? l.st[0].head + off0 : l.st[0].head, ok);
    if constexpr (L::NS == 2)
      fd_cp_async16(l.st[1].dst + soff, ok ? l.st[1].head + off1 : l.st[1].head, ok);
    if (flags && first) valid[kl] = page_ok ? 1 : 0;
  }
  return bad;
}

/* One tile's copies into the stage buffers dK / dV (a [KT][D] tile of the
 * cache element E: T, or the fp8 byte): keys key0 .. key0 + nk - 1, those
 * below klo zero-filled; paged (PG 1, 2: fd_mma_loader_pg): through the page
 * ids pg (returns whether one of this thread's keys is on a bad page; flags
 * into `valid`), else (PG 0) from the running offsets off (this thread's
 * first key in K, V: fd_mma_contig_offsets), then advanced a tile.
 * PG is a template constant, so a kernel instance holds one loader (the
 * kernels' code size is their speed: split_mma_kernel.cuh CODE SIZE). */
template <typename E, int D, int NW, int DV, int PG>
static __device__ __forceinline__ bool fd_mma_copy_tile(
    const fd_kernel_params &p, const E *k_head, const E *v_head, int pshift, int key0, int klo,
    int nk, const int (&pg)[fd_mma_copy<D, NW>::LOADS], unsigned char *dK, unsigned char *dV,
    unsigned char *valid, int64_t (&off)[2], const int64_t (&off_tile)[2]) {
  static_assert(PG >= 0 && PG <= 2, "loader: fd_mma_loader_pg");
  using L = fd_mma_lane<E, D, NW>;
  const L l = fd_mma_lane_of<E, D, NW, DV>(p, k_head, v_head, dK, dV);
  if constexpr (PG == 1) {
    return fd_mma_copy_page_tile<E, D, NW>(p, l, key0, klo, nk, pg, valid);
  } else if constexpr (PG == 2) {
    return fd_mma_copy_page_keys<E, D, NW>(p, l, pshift, key0, klo, nk, pg, valid);
  } else {
    fd_mma_copy_contig<E, D, NW>(l, off, klo, nk);
    off[0] += off_tile[0];
    off[1] += off_tile[1];
    return false;
  }
}

/* The contiguous loader's running offsets for a pass whose tiles start at
 * key kbeg: this thread's first key and chunk in K (off[0]) and V (off[1]),
 * and their step a tile (KT keys). */
template <typename E, int D, int NW>
static __device__ __forceinline__ void fd_mma_contig_offsets(const fd_kernel_params &p, int b,
                                                             int kbeg, int64_t (&off)[2],
                                                             int64_t (&off_tile)[2]) {
  using L = fd_mma_lane<E, D, NW>;
  const int c = (int)threadIdx.x % L::CH;
  const int key = kbeg + (int)threadIdx.x / L::CH * L::LOADS;
  const int f = L::NS == 1 && c >= L::CHR ? c - L::CHR : c;
  const int64_t k_off = (int64_t)b * p.k_strides[0] + (int64_t)key * p.k_strides[1] + f * L::VEC;
  const int64_t v_off = (int64_t)b * p.v_strides[0] + (int64_t)key * p.v_strides[1] + f * L::VEC;
  const int64_t k_tile = (int64_t)fd_mma_cfg<D, NW>::KT * p.k_strides[1];
  const int64_t v_tile = (int64_t)fd_mma_cfg<D, NW>::KT * p.v_strides[1];
  off[0] = k_off;
  off[1] = v_off;
  off_tile[0] = k_tile;
  off_tile[1] = v_tile;
}

#endif /* FD_CUDA_MMA_LOADERS_CUH */
