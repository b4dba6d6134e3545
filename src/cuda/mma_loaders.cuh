/*
 * mma_loaders.cuh — the loaders of the tensor-core split kernel: how a tile
 * of K and V goes global -> shared (cp.async, 16 bytes a copy, swizzled
 * rows) from a contiguous cache or through a block_table, which thread
 * copies which keys, and which keys are zero-filled instead of read (past
 * the pass's keys, before its first visible key, head_dim padding, a page id
 * outside the pool). fp8 caches have their own loaders (end of file); the tile
 * math in split_mma_kernel.cuh reads the same shared-memory tiles. Internal
 * to src/cuda.
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
 * (the PG 1 loader, fd_mma_loader_pg; measured: with keys RSTEP rows apart
 * each needed its own page lookup, ~28 instructions a key, bench/NOTES.md). */
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

/* A full tile's LOADS keys of this thread, chunk c: K from kp, V from vp,
 * stepping k_row / v_row elements a key; nothing read (zeros) unless ok. */
template <typename T, int D, int NW>
static __device__ __forceinline__ void fd_mma_copy_keys(T *sK, T *sV, int k0, int c, const T *kp,
                                                        const T *vp, int64_t k_row, int64_t v_row,
                                                        bool ok, const T *k_head, const T *v_head) {
#pragma unroll
  for (int n = 0; n < fd_mma_copy<D, NW>::LOADS; n++) {
    const int kl = k0 + n;
    const int soff = kl * D + ((c ^ (kl & 7)) << 3);
    fd_cp_async16(sK + soff, ok ? kp : k_head, ok);
    fd_cp_async16(sV + soff, ok ? vp : v_head, ok);
    kp += k_row;
    vp += v_row;
  }
}

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
  if (klo <= 0 && nkeys >= fd_mma_cfg<D, NW>::KT) { /* every key (block-uniform): no per-key test */
    fd_mma_copy_keys<T, D, NW>(sK, sV, k0, c, k_head + k_off, v_head + v_off, k_row, v_row, col_ok,
                               k_head, v_head);
    return;
  }
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

/* Paged cache: copies the tile at key0 with the page ids from
 * fd_mma_page_ids; a key past nkeys or on a page id outside [0, num_pages)
 * (num_pages > 0) is zero-filled and reads nothing. With num_pages > 0 the
 * keys' validity goes to the byte flags `valid` (a score reads them only in a
 * tile with a bad page) and the return value says whether any of this
 * thread's keys sits on a bad page. ONE_PAGE as in fd_mma_page_ids: an
 * instance holds either the one-page copy or the per-key one. */
template <typename T, int D, int NW, int DV, bool ONE_PAGE>
static __device__ __forceinline__ bool fd_mma_copy_paged(const fd_kernel_params &p,
                                                         const T *k_head, const T *v_head,
                                                         int pshift, int key0, int klo, int nkeys,
                                                         const int (&pg)[fd_mma_copy<D, NW>::LOADS],
                                                         T *sK, T *sV, unsigned char *valid) {
  using M = fd_mma_copy<D, NW>;
  const int c = (int)threadIdx.x % fd_mma_cfg<D, NW>::CH;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
  const bool flags = p.num_pages > 0;
  const bool col_ok = DV == D || c < DV / 8; /* padded columns: zeros, no read */
  if constexpr (ONE_PAGE) {
    const int page = pg[0];
    const bool page_ok = !flags || (page >= 0 && page < p.num_pages);
    const int pos = (key0 + k0) & (p.page_size - 1);
    const int64_t k_off = (int64_t)page * p.k_strides[0] + (int64_t)pos * p.k_strides[1] + c * 8;
    const int64_t v_off = (int64_t)page * p.v_strides[0] + (int64_t)pos * p.v_strides[1] + c * 8;
    if (klo <= 0 && nkeys >= fd_mma_cfg<D, NW>::KT) { /* every key (block-uniform): no per-key test */
      fd_mma_copy_keys<T, D, NW>(sK, sV, k0, c, k_head + k_off, v_head + v_off, p.k_strides[1],
                                 p.v_strides[1], page_ok && col_ok, k_head, v_head);
      if (flags && c == 0) fd_mma_page_flags<M::LOADS>(valid + k0, page_ok);
      return !page_ok;
    }
#pragma unroll
    for (int n = 0; n < M::LOADS; n++) {
      const int kl = k0 + n;
      const bool ok = kl < nkeys && kl >= klo && page_ok && col_ok;
      const int soff = kl * D + ((c ^ (kl & 7)) << 3);
      fd_cp_async16(sK + soff, ok ? k_head + (k_off + n * p.k_strides[1]) : k_head, ok);
      fd_cp_async16(sV + soff, ok ? v_head + (v_off + n * p.v_strides[1]) : v_head, ok);
    }
    if (flags && c == 0) fd_mma_page_flags<M::LOADS>(valid + k0, page_ok);
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

/* ---- fp8 caches (kv_dtype FD_DTYPE_E4M3 / FD_DTYPE_E5M2) ----
 *
 * STAGES  An fp8 tile is KT rows of D bytes, half a 16-bit tile, so the K
 *   (and V) stage area of the 16-bit instance (fd_mma_cfg::SMEM) holds
 *   fd_mma_cfg::ST8 = 2 STAGES - 1 fp8 stages, twice the tiles in flight
 *   minus one; the last KT * D bytes of the K area hold the TOKEN scales and
 *   the key-valid flags (split_mma_kernel.cuh). 16-byte chunk c of row k
 *   sits at chunk c ^ fd_swz8_key<D>(k) (fd_swz8), so that each ldmatrix
 *   phase (8 rows, one chunk) hits 8 different bank groups.
 * COPIES  The same keys per thread as the 16-bit loaders (k0 = tid / CH *
 *   LOADS, LOADS keys, the same page ids), but an fp8 row has CH / 2 chunks
 *   of 16 bytes (16 elements): thread chunk c < CH / 2 copies K's fp8 chunk
 *   c, c >= CH / 2 copies V's fp8 chunk c - CH / 2. Chunks past DV / 16
 *   (head_dim 80, 96 in 128-byte rows), keys before klo or past nkeys and
 *   keys on a bad page are zero-filled without a read.
 * WIDENING  In registers, never in shared memory: the tile math loads the
 *   fp8 bytes with ldmatrix (K) and ldmatrix.trans (V) as if they were
 *   16-bit pairs and widens each fragment (fd_fp8x4_widen; the fragment
 *   layouts are in split_mma_kernel.cuh, FP8). Exact: every e4m3 and e5m2
 *   value is an fp16 and a bf16 value (NaN stays NaN). */

/* A full tile's LOADS keys of this thread, fp8 chunk f: from src, stepping
 * `step` bytes a key, into the swizzled dst; nothing read (zeros) unless ok
 * (fp8's fd_mma_copy_keys). */
template <int D, int NW>
static __device__ __forceinline__ void fd_mma_copy8_keys(unsigned char *dst, int k0, int f,
                                                         const unsigned char *src, int64_t step,
                                                         bool ok, const unsigned char *head) {
#pragma unroll
  for (int n = 0; n < fd_mma_copy<D, NW>::LOADS; n++) {
    fd_cp_async16(dst + fd_swz8<D>(k0 + n, f), ok ? src : head, ok);
    src += step;
  }
}

/* Contiguous fp8 cache: as fd_mma_copy_contig; k_off / v_off hold the
 * thread's column byte (c % (CH / 2)) * 16, k_row / v_row are bytes; dK / dV
 * are the fp8 stage buffers ([KT][D] bytes, swizzled). */
template <int D, int NW, int DV>
static __device__ __forceinline__ void fd_mma_copy8_contig(const unsigned char *k_head,
                                                           const unsigned char *v_head,
                                                           int64_t k_off, int64_t v_off,
                                                           int64_t k_row, int64_t v_row,
                                                           unsigned char *dK, unsigned char *dV,
                                                           int klo, int nkeys) {
  using M = fd_mma_copy<D, NW>;
  constexpr int CH8 = D / 16; /* fp8 chunks a row */
  const int c = (int)threadIdx.x % fd_mma_cfg<D, NW>::CH;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
  const bool is_v = c >= CH8;
  const int f = is_v ? c - CH8 : c;
  const bool col_ok = DV == D || f < DV / 16; /* padded columns: zeros, no read */
  const unsigned char *head = is_v ? v_head : k_head;
  const int64_t off = is_v ? v_off : k_off;
  const int64_t row = is_v ? v_row : k_row;
  unsigned char *dst = is_v ? dV : dK;
  if (klo <= 0 && nkeys >= fd_mma_cfg<D, NW>::KT) { /* every key (block-uniform): no per-key test */
    fd_mma_copy8_keys<D, NW>(dst, k0, f, head + off, row, col_ok, head);
    return;
  }
#pragma unroll
  for (int n = 0; n < M::LOADS; n++) {
    const int kl = k0 + n;
    const bool ok = kl < nkeys && kl >= klo && col_ok;
    fd_cp_async16(dst + fd_swz8<D>(kl, f), ok ? head + (off + n * row) : head, ok);
  }
}

/* Paged fp8 cache: as fd_mma_copy_paged (same page ids, ONE_PAGE, flags and
 * return value), fp8 chunks as in fd_mma_copy8_contig. */
template <int D, int NW, int DV, bool ONE_PAGE>
static __device__ __forceinline__ bool fd_mma_copy8_paged(
    const fd_kernel_params &p, const unsigned char *k_head, const unsigned char *v_head,
    int pshift, int key0, int klo, int nkeys,
    const int (&pg)[fd_mma_copy<D, NW>::LOADS], unsigned char *dK, unsigned char *dV,
    unsigned char *valid) {
  using M = fd_mma_copy<D, NW>;
  constexpr int CH8 = D / 16;
  const int c = (int)threadIdx.x % fd_mma_cfg<D, NW>::CH;
  const int k0 = (int)threadIdx.x / fd_mma_cfg<D, NW>::CH * M::LOADS;
  const bool flags = p.num_pages > 0;
  const bool is_v = c >= CH8;
  const int f = is_v ? c - CH8 : c;
  const bool col_ok = DV == D || f < DV / 16;
  const unsigned char *head = is_v ? v_head : k_head;
  const int64_t s0 = is_v ? p.v_strides[0] : p.k_strides[0];
  const int64_t s1 = is_v ? p.v_strides[1] : p.k_strides[1];
  unsigned char *dst = is_v ? dV : dK;
  if constexpr (ONE_PAGE) {
    const int page = pg[0];
    const bool page_ok = !flags || (page >= 0 && page < p.num_pages);
    const int pos = (key0 + k0) & (p.page_size - 1);
    const int64_t off = (int64_t)page * s0 + (int64_t)pos * s1 + f * 16;
    if (klo <= 0 && nkeys >= fd_mma_cfg<D, NW>::KT) { /* every key (block-uniform): no per-key test */
      fd_mma_copy8_keys<D, NW>(dst, k0, f, head + off, s1, page_ok && col_ok, head);
      if (flags && c == 0) fd_mma_page_flags<M::LOADS>(valid + k0, page_ok);
      return !page_ok;
    }
#pragma unroll
    for (int n = 0; n < M::LOADS; n++) {
      const int kl = k0 + n;
      const bool ok = kl < nkeys && kl >= klo && page_ok && col_ok;
      fd_cp_async16(dst + fd_swz8<D>(kl, f), ok ? head + (off + n * s1) : head, ok);
    }
    if (flags && c == 0) fd_mma_page_flags<M::LOADS>(valid + k0, page_ok);
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
    const int64_t off = (int64_t)page * s0 + (int64_t)pos * s1 + f * 16;
    fd_cp_async16(dst + fd_swz8<D>(kl, f), ok ? head + off : head, ok);
    if (flags && c == 0) valid[kl] = page_ok ? 1 : 0;
  }
  return bad;
}

/* Four fp8 values (bytes 0..3 of x, element 0 in the low byte) -> four
 * 16-bit T values, two a register (element 0 in the low half of lo). Exact:
 * e5m2 is the top byte of an fp16; e4m3 (bias 7) moved into fp16's field
 * layout and multiplied by 2^8 (fp16 multiplication by a power of two,
 * exact; e4m3 subnormals become normal fp16), its NaN code (S.1111.111)
 * replaced by fp16 NaN; bf16 through float32 (both exact). sm_89+ code uses
 * the hardware conversion (cvt.rn.f16x2.e4m3x2 / e5m2x2). */
template <typename T>
static __device__ __forceinline__ void fd_fp8x4_widen(uint32_t x, bool e5m2, uint32_t &lo,
                                                      uint32_t &hi) {
  uint32_t h0, h1; /* fp16 pairs */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  /* the halves split in PTX (mov.b32 {l, h}) rather than by a shift in C,
   * so that ptxas can read the upper half in place */
  if (e5m2)
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n"
        " cvt.rn.f16x2.e5m2x2 %1, h;\n}" : "=r"(h0), "=r"(h1) : "r"(x));
  else
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}" : "=r"(h0), "=r"(h1) : "r"(x));
#else
  h0 = __byte_perm(x, 0u, 0x1404u); /* (b0 << 8) | (b1 << 24) */
  h1 = __byte_perm(x, 0u, 0x3424u); /* (b2 << 8) | (b3 << 24) */
  if (!e5m2) {
    const uint32_t n0 = __vcmpeq2(h0 & 0x7F007F00u, 0x7F007F00u); /* NaN codes */
    const uint32_t n1 = __vcmpeq2(h1 & 0x7F007F00u, 0x7F007F00u);
    h0 = (h0 & 0x80008000u) | ((h0 >> 1) & 0x3F803F80u);
    h1 = (h1 & 0x80008000u) | ((h1 >> 1) & 0x3F803F80u);
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(h0) : "r"(h0), "r"(0x5C005C00u)); /* x 2^8 */
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(h1) : "r"(h1), "r"(0x5C005C00u));
    h0 = (h0 & ~n0) | (0x7FFF7FFFu & n0);
    h1 = (h1 & ~n1) | (0x7FFF7FFFu & n1);
  }
#endif
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __half2 a, b;
    memcpy(&a, &h0, sizeof a);
    memcpy(&b, &h1, sizeof b);
    const float2 fa = __half22float2(a), fb = __half22float2(b);
    const __nv_bfloat162 ba = __floats2bfloat162_rn(fa.x, fa.y);
    const __nv_bfloat162 bb = __floats2bfloat162_rn(fb.x, fb.y);
    memcpy(&lo, &ba, sizeof lo);
    memcpy(&hi, &bb, sizeof hi);
  } else {
    lo = h0;
    hi = h1;
  }
}

/* One tile's copies into the stage buffers dK / dV (bytes: a [KT][D] T tile,
 * or an fp8 [KT][D] byte tile when KV8): keys key0 .. key0 + nk - 1, those
 * below klo zero-filled; paged (PG 1, 2: fd_mma_loader_pg): through the page
 * ids pg (returns whether one of this thread's keys is on a bad page; flags
 * into `valid`), else (PG 0) from the running offsets k_off / v_off, then
 * advanced a tile. PG is a template constant, so a kernel instance holds one
 * copy path (the kernels' PG: their code size is their speed,
 * split_mma_kernel.cuh CODE SIZE). */
template <typename T, int D, int NW, int DV, int KV8, int PG>
static __device__ __forceinline__ bool fd_mma_copy_tile(
    const fd_kernel_params &p, const void *k_head, const void *v_head, int pshift, int key0,
    int klo, int nk, const int (&pg)[fd_mma_copy<D, NW>::LOADS], unsigned char *dK,
    unsigned char *dV, unsigned char *valid, int64_t &k_off, int64_t &v_off, int64_t k_tile,
    int64_t v_tile) {
  using U8 = const unsigned char *;
  static_assert(PG >= 0 && PG <= 2, "loader: fd_mma_loader_pg");
  if constexpr (PG != 0) {
    constexpr bool ONE_PAGE = PG == 1;
    if constexpr (KV8 != 0)
      return fd_mma_copy8_paged<D, NW, DV, ONE_PAGE>(p, static_cast<U8>(k_head),
                                                     static_cast<U8>(v_head), pshift, key0, klo,
                                                     nk, pg, dK, dV, valid);
    else
      return fd_mma_copy_paged<T, D, NW, DV, ONE_PAGE>(
          p, static_cast<const T *>(k_head), static_cast<const T *>(v_head), pshift, key0, klo, nk,
          pg, reinterpret_cast<T *>(dK), reinterpret_cast<T *>(dV), valid);
  }
  if constexpr (KV8 != 0)
    fd_mma_copy8_contig<D, NW, DV>(static_cast<U8>(k_head), static_cast<U8>(v_head), k_off, v_off,
                                   p.k_strides[1], p.v_strides[1], dK, dV, klo, nk);
  else
    fd_mma_copy_contig<T, D, NW, DV>(static_cast<const T *>(k_head), static_cast<const T *>(v_head),
                                     k_off, v_off, p.k_strides[1], p.v_strides[1],
                                     reinterpret_cast<T *>(dK), reinterpret_cast<T *>(dV), klo, nk);
  k_off += k_tile;
  v_off += v_tile;
  return false;
}

#endif /* FD_CUDA_MMA_LOADERS_CUH */
