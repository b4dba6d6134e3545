/*
 * split_mma_kernel.cuh — the flash-decoding split kernel on tensor cores
 * (mma.sync.m16n8k16, ldmatrix, cp.async: sm_80 instructions; fp16 and bf16
 * K/V, or fp8 K/V with fp16/bf16 q (FP8 below); built for sm_80 and sm_90a,
 * see CMakeLists.txt FD_CUDA_ARCHS). fp32 keeps the CUDA-core kernel
 * (split_kernel.cu); both write the same partials for the combine.
 *
 * GRID  (num_splits, num_heads_kv, batch); one block of NW warps per (split
 *   s, kv head hk, sequence b), over keys [begin, end) of fd_seq_split
 *   (split.h: whole chunks from w0 = fd_window_start, 0 without a sliding
 *   window), for EVERY query row
 *   of kv head hk: rows r = gi * q_len + t for query head h = hk * group + gi
 *   and token t (head-major, the order of the partial arrays). Rows go 8 at a
 *   time (the n of the mma tile, TILE MATH below; a pass of fewer rows is
 *   zero-padded and its phantom rows see no key); more rows take more
 *   passes over the split's K/V (the re-reads mostly hit L2).
 *   Three configs (fd_mma_cfg, mma_config.cuh; which one a GPU runs:
 *   gpu_select.h): NW = 4, two blocks an SM where they fit (FD_MMA_4W); NW =
 *   8, one block an SM with twice the keys a tile and twice the bytes in
 *   flight, launched when the grid has no more blocks than the GPU has SMs
 *   (cuda_backend.cu), where four warps an SM left the schedulers idle
 *   (bench/NOTES.md), on GPUs with ~200 KB a block (FD_MMA_WIDE); NW = 4
 *   with 2 stages for GPUs with 99 KB a block (sm_86, sm_89, sm_120;
 *   FD_MMA_LEAN, head_dim >= 80).
 *
 * WARPS  Warp w is (kw, dw) = (w % KW, w / KW). A tile of KT = 16 * KW keys:
 *   warp kw takes keys 16 kw .. 16 kw + 15 of it and keeps its own running
 *   max m, sum l and O for the pass's rows, in mma accumulator layout (a lane
 *   holds rows 2 (lane % 4) and 2 (lane % 4) + 1). head_dim 64, 128: KW =
 *   NW, DW = 1 (64- or 128-key tiles). head_dim 256: KW = NW / 2, DW = 2
 *   (32- or 64-key tiles); the two warps of a key slice both compute its
 *   scores (identical, so identical m and l) and each accumulates half of
 *   O's columns.
 *
 * TILE MATH (one barrier a tile)  Keys are the mma's M side and query rows
 *   its N side: at most 8 rows a pass (a GQA group of 4 fills half of N,
 *   where as M it would fill a quarter: half the mma and half the scores a
 *   lane). Per warp and 16-key slice of a tile:
 *   S^T = K Q^T: K's A fragment by ldmatrix.x4 (matrix (key half, chunk
 *     half)), Q's B fragments (row g, columns 16 ks + 2 qd, + 8) read from
 *     sQ once a pass; fp32 accumulators: keys g, g + 8 x rows 2 qd, 2 qd + 1.
 *   Scale and mask: S in base-2 units (softmax_scale * log2(e), in fp32; q
 *     enters the mma unrounded), soft-capped when asked and masked to -inf
 *     for keys a row does not see: keys [lo_t, hi_t) of fd_row_keys
 *     (device_util.cuh: causal up to the row's position, from position -
 *     window_left with a window, every key when non-causal), within the
 *     split, and a bad page; a tile whose keys every row sees, on good
 *     pages, only scales (the loop's fast path). The lower bounds are
 *     recomputed only in the tiles before the pass's highest one (a
 *     window's first tiles), which keeps the registers of the causal loop.
 *   Online softmax in base 2: the row max over the 8 lanes of a qd; alpha =
 *     2^(m_old - m_new) (ex2.approx.ftz); a row whose max is still -inf
 *     uses 0 in its place (never (-inf) - (-inf)); O's rescale is skipped
 *     while no row max of the warp moved; l sums the unrounded p per lane,
 *     reduced once at the end.
 *   O^T += V^T P^T: P^T's B fragments are the accumulators in 16 bits (a hi
 *     and a lo part, two mma an m-tile; fp8: one fp16 part) transposed by
 *     movmatrix.trans; V^T's A fragment by ldmatrix.x4.trans (matrix
 *     (column half, key half)): m-tile j holds columns 16 j + g and
 *     16 j + 8 + g. Per warp and tile at head_dim 128: 24 mma (16 for fp8).
 *
 * HEAD_DIM  64, 128, 256 as themselves; 80 and 96 in the 128 instance's
 *   shared-memory rows (template D = 128, DV = 80 or 96): the columns past DV
 *   are zero-filled without a read, Q K^T runs DV / 16 k-steps and P V
 *   DV / 8 n-tiles.
 *
 * PIPELINE  K and V tiles go global -> shared by cp.async.cg (16 bytes a
 *   copy; src-size 0 = zero-fill and no read for keys out of range or on a bad
 *   page; 64-bit offsets), STAGES stages (head_dim 64: 4, or 6 at NW = 8;
 *   else 3); q is commit group 0, tile i group i + 1. Thread tid copies
 *   chunk tid % CH of the LOADS consecutive keys (tid / CH) * LOADS + n
 *   (fd_mma_copy). Contiguous caches: a running element offset per thread;
 *   a tile whose keys are all in range (all but a pass's first and last)
 *   copies without per-key tests, one pointer step a key. Paged caches:
 *   each thread reads the block_table entries of its keys one tile ahead of
 *   the copies that use them (the latency hides behind a tile of math): one
 *   id a tile when page_size is a power of two >= LOADS (its keys share a
 *   page: the PG 1 loader), else one a key (PG 2; CODE SIZE below); the ids
 *   of the first STAGES tiles are read together before the first copy. A
 *   key on a page id outside [0, num_pages) is flagged in shared memory and
 *   the tile's "bad page" bit travels with the loop's barrier
 *   (__syncthreads_or), so only such tiles test flags per score. The 16-byte
 *   chunk c of smem row k sits at chunk c ^ (k & 7), so every ldmatrix phase
 *   hits 8 different bank groups. Split boundaries are multiples of chunk_len
 *   (64), so tiles start at multiples of 64 keys (a pass starts at the 64-key
 *   boundary at or below the first key any of its rows sees; keys below that
 *   key are zero-filled, not read: they lie in the prologue's tiles, or, with
 *   2 stages of 32 keys, in the first two tiles, both zero-filling them); a
 *   128-key tile may run
 *   past its split's end, and every key is bounds-checked (not loaded, score
 *   -inf) unless the whole tile is inside every row's keys (the loop's fast
 *   path: no mask, only the scale). Bytes in flight: STAGES - 1 tiles of 32 KB (16 KB for head_dim 64)
 *   a block, 128 KB an SM at 2 blocks; NW = 8: 2 tiles of 64 KB (5 of 32 KB
 *   for head_dim 64) an SM. (Asking L2 for 3 tiles further ahead,
 *   cp.async.bulk.prefetch.L2, was measured slower: B=64 8k 602 against
 *   482 us on the H200, so it is not done.)
 *
 * SHARED MEMORY (dynamic)  K stages | V stages | Q [16][head_dim] | (m, l)
 *   [KW][16] | (M, L) [16] | key-valid flags [STAGES][KT]: NW = 4: ~67 KB
 *   (64), ~101 KB (128), ~105 KB (256), so two blocks fit per SM on sm_90
 *   (one on sm_80 from head_dim 80 on); NW = 8: ~196-201 KiB (200,576 to
 *   205,632 bytes), one block; lean: 70,400 B (128), 74,176 B (256). After the last
 *   tile the K/V area holds the warps' O [KW][16][head_dim + 8] fp32, rescaled
 *   to the block max and summed in kw order (deterministic).
 *
 * FP8  (template KV8 = 1: kv_dtype E4M3, KV8 = 2: E5M2 (a constant, so the
 *   widening issues one conversion); FD_MMA_4W and FD_MMA_LEAN only, never the 8-warp config: plan.c,
 *   cuda_backend.cu) The same grid, tiles, warps and shared memory
 *   (fd_mma_cfg::SMEM). A tile's fp8 bytes (KT rows of D bytes, chunk c of
 *   row k at c ^ fd_swz8) are copied by cp.async (16 values a copy:
 *   fd_mma_copy8_*, same keys per thread, same zero-fills) into ST8 = 2
 *   STAGES - 1 stages of KT * D bytes (twice the tiles in flight, less one;
 *   the last KT * D bytes of the K area hold the TOKEN scales and key-valid
 *   flags). They are widened in registers, not in shared memory (one
 *   barrier a tile, as 16-bit), by the hardware conversion (sm_89+) or exact
 *   bit arithmetic (fd_fp8x4_widen), into the TILE MATH above, all mma in
 *   fp16 (bf16 q scaled to fp16 by a power of two):
 *   S^T = K Q^T: ldmatrix (not .trans) on the fp8 rows as 16-bit pairs gives
 *     lane (g, qd) the 4 bytes of key g (and g + 8), head_dim 16 ks + 4 qd
 *     .. + 3, which widen to the A fragment whose logical k columns are 2 qd,
 *     2 qd + 1, 2 qd + 8, 2 qd + 9; Q's B fragments (row g) are read from sQ
 *     in that column order. The accumulators: keys g, g + 8 x rows 2 qd,
 *     2 qd + 1; row max and sum reduce over the 8 lanes of a qd.
 *   O^T += V^T P^T: P^T's B fragments are the fp16 accumulators transposed
 *     by movmatrix; V^T's A fragments come from ldmatrix.trans (a lane: keys
 *     2 qd, 2 qd + 1 x columns 2 g, 2 g + 1 of a 16-column chunk) and a byte
 *     permute: chunk j's m-tile rows are its even columns (g) and odd ones
 *     (g + 8), which the O store undoes.
 *   Scales, all fp32: TENSOR / HEAD: k_scale folds into the score scale
 *   (scale_log2 * k_scale), v_scale multiplies O at the merge (f0, f1);
 *   TOKEN: thread tid < KT copies key tid's k and v scale by cp.async into
 *   the tile's stage of sTok [ST8][2][KT], in the tile's commit group (the
 *   scales travel the pipeline with their keys; paged: through the
 *   block_table, the id read a tile ahead; keys the tile's copies zero-fill
 *   or on a bad page: 0, never read); each score is multiplied by its key's k_scale
 *   before the soft-cap and mask, and p by its v_scale before the 16-bit
 *   split (l sums the unscaled p). Masked keys stay -inf / p = 0.
 *
 * OUTPUT  (fd_store_pass, pass_output.cuh) As split_kernel.cu: num_splits > 1:
 *   unnormalised O, m (natural units) and l into the partials; empty splits exit at once; rows that see
 *   none of an active split's keys write m = -inf, l = 0, O = 0. num_splits ==
 *   1: out = O / l and lse = m + ln l (out = 0, lse = -inf for a row without
 *   keys).
 *
 * FILES  mma_config.cuh (the compile-time shape), mma_primitives.cuh (mma,
 *   ldmatrix, packing, swizzle), mma_loaders.cuh (global -> shared copies:
 *   contiguous, paged; fp8 copies and widening), pass_output.cuh (the
 *   epilogue); this file: the tile math (Q K^T, mask, online softmax, P V),
 *   the kernel and its per-instance launchers, compiled by three translation
 *   units that build in parallel: split_mma_kernel.cu (16-bit caches, the
 *   public launch, occupancy), split_mma_fp8.cu (e4m3) and split_mma_e5m2.cu
 *   (e5m2).
 *
 * CODE SIZE  The loader is a template constant (PG, fd_mma_loader_pg at
 *   launch, from page_size and LOADS of the config: 0 contiguous; 1 paged,
 *   page_size a power of two >= LOADS, one page id a tile; 2 paged, any
 *   other page_size, one id a key), so an instance holds one copy path: the
 *   contiguous bf16 head_dim 128 instance is ~55 KB of sm_90a SASS where one
 *   holding both loaders was 123 KB; its PG 1 instance ~60 KB where one
 *   holding both paged paths was 112 KB (PG 2: ~95 KB). Size is speed here:
 *   with two warps a scheduler, a larger tile loop stalled on instruction
 *   fetch (~5 cycles an instruction), worst in a model's stream where the
 *   GEMMs evict the code from L2 (bench/NOTES.md, 2026-12-02).
 *   tests/check_code_size.sh bounds it.
 *
 * PDL  Code built for sm_90+ is launched with programmatic stream
 *   serialisation (older targets lack griddepcontrol: compiled out, launched
 *   without the attribute, gpu_select.h fd_gpu_pdl_ok) unless the plan asks
 *   for plain launches (fd_problem.no_pdl: FD_PDL_COMBINE, kernel_params.cuh,
 *   where only the combine has the attribute):
 *   every block first waits in griddepcontrol.wait until the
 *   previous kernel in the stream has completed (a no-op without PDL), so
 *   only its launch overlaps that kernel. Then it executes
 *   griddepcontrol.launch_dependents, so the combine (also launched with PDL)
 *   is scheduled as soon as all split blocks are resident; it waits for this
 *   grid to complete before it reads the partials.
 */
#ifndef FD_CUDA_SPLIT_MMA_KERNEL_CUH
#define FD_CUDA_SPLIT_MMA_KERNEL_CUH

#include <limits.h>
#include <math.h>
#include <string.h>

#include <type_traits>

#include "flashdecode.h"
#include "kernel_params.cuh"
#include "device_util.cuh"
#include "mma_config.cuh"
#include "mma_loaders.cuh"
#include "mma_primitives.cuh"
#include "pass_output.cuh"
#include "split.h"
#include "gpu_select.h"

/* Keys [*lo, *hi) row r (0..15) of the pass sees within the split (phantom
 * rows see nothing). */
static __device__ __forceinline__ void fd_pass_row_keys(const fd_kernel_params &p, int r, int row0,
                                                        int pass_rows, int kv, int begin, int end,
                                                        int *lo, int *hi) {
  *lo = *hi = begin;
  if (r < pass_rows)
    fd_row_keys((row0 + r) % p.q_len, p.q_len, kv, p.window_left, p.non_causal, begin, end, lo, hi);
}

/* fp8 TOKEN: the page id of key j for fd_mma_copy_tok (read a tile ahead of
 * the copy, as the tiles' ids), or -1: contiguous (PG 0), past pass_end, or
 * a thread past the tile's keys (t >= KT). PG 1: page_size is a power of
 * two, a shift; PG 2: a shift or a division (pshift < 0). */
template <int PG>
static __device__ __forceinline__ int fd_mma_tok_page(const fd_kernel_params &p,
                                                      const int32_t *bt_row, int pshift, bool mine,
                                                      int j, int pass_end) {
  if (PG == 0 || !mine || j >= pass_end) return -1;
  return __ldg(bt_row + (PG == 1 || pshift >= 0 ? j >> pshift : j / p.page_size));
}

/* fp8 TOKEN: thread t < KT copies the k and v scale of the tile's key
 * key0 + t into dst[t], dst[KT + t] by cp.async, in the tile's commit group
 * (the scales travel the pipeline with their keys); zero-filled, not read,
 * for keys outside [key0 + klo, key0 + nk) (as the tile's copies) or on a
 * page id outside [0, num_pages): such a key is masked and its p is 0.
 * page: the key's id from fd_mma_tok_page (paged caches: PG 1, 2). */
template <int KT, int PG>
static __device__ __forceinline__ void fd_mma_copy_tok(const fd_kernel_params &p, int pshift,
                                                       bool check_pages, int b, int hk, int key0,
                                                       int klo, int nk, int page, float *dst) {
  const int t = (int)threadIdx.x;
  if (t >= KT) return;
  const int j = key0 + t;
  bool ok = t >= klo && t < nk;
  int64_t at;
  if constexpr (PG != 0) {
    const int pos = PG == 1 || pshift >= 0 ? (j & (p.page_size - 1)) : j % p.page_size;
    if (check_pages && (page < 0 || page >= p.num_pages)) ok = false;
    at = (int64_t)page * p.scale_strides[0] + (int64_t)pos * p.scale_strides[1];
  } else {
    at = (int64_t)b * p.scale_strides[0] + (int64_t)j * p.scale_strides[1];
  }
  at += (int64_t)hk * p.scale_strides[2];
  fd_cp_async4(dst + t, ok ? p.k_scale + at : p.k_scale, ok);
  fd_cp_async4(dst + KT + t, ok ? p.v_scale + at : p.v_scale, ok);
}

/* A score s in base-2 units: times `scale` (softmax_scale log2(e); fp8: with
 * k_scale, per key for TOKEN scales), soft-capped when the call asks
 * (block-uniform). */
static __device__ __forceinline__ float fd_mma_score(const fd_kernel_params &p, float s,
                                                     float scale) {
  const float x = s * scale;
  return p.cap_out != 0.0f ? fd_soft_cap_fast(x, p.cap_in, p.cap_out) : x;
}

/* fp8: the byte offset fd_swz8<D>(row, c + sub) for an even chunk c, from
 * base = row * D and y = sub ^ (the row's swizzle bits): the swizzle
 * touches the low 3 bits of c (c >= 8 at head_dim 256), so one xor with a
 * per-lane constant a load. */
static __device__ __forceinline__ uint32_t fd_swz8_even(uint32_t base, int y, int c) {
  return base + (uint32_t)(((c & ~7) | ((c & 7) ^ y)) << 4);
}

/* One pass: rows row0 .. row0 + pass_rows - 1 (pass_rows <= 16) over the
 * split's keys, then the pass's outputs. Ends with a block barrier. */
template <typename T, int D, int NW, int DV, int LEAN, int KV8, int PG>
static __device__ __forceinline__ void fd_split_mma_pass(const fd_kernel_params &p, int b, int hk,
                                                         int split, int kv, int begin, int end,
                                                         int row0, int pass_rows,
                                                         unsigned char *smem) {
  using C = fd_mma_cfg<D, NW, LEAN>;
  constexpr int KW = C::KW, KT = C::KT, NT = C::NT;
  /* pipeline stages: fp8 tiles are half the bytes, so ST8 of them (twice the
   * tiles in flight, less one) */
  constexpr int ST = KV8 != 0 ? C::ST8 : C::STAGES;
  constexpr int SB = KV8 != 0 ? KT * D : KT * D * 2; /* bytes a stage */
  constexpr bool PRE_LO = (ST - 1) * KT < 64;
  /* DV < D (head_dim 80, 96 in 128-wide storage): the columns past DV are
   * zeros in shared memory and skipped by the mma loops */
  constexpr int KS = DV / 16;          /* k-steps of Q K^T */
  constexpr int NTV = DV == D ? NT : DV / 8; /* O n-tiles computed per warp */
  static_assert(DV == D || (C::DW == 1 && DV % 16 == 0 && DV < D), "padded head_dim");
  constexpr int ROWS = FD_MMA_ROWS;
  constexpr int OSTRIDE = D + FD_MMA_OPAD;

  /* Carve-up; fd_mma_cfg<D, NW, LEAN>::SMEM sizes it. */
  T *sK = reinterpret_cast<T *>(smem);                                   /* [STAGES][KT][D] */
  T *sV = sK + C::STAGES * KT * D;                                       /* [STAGES][KT][D] */
  T *sQ = sV + C::STAGES * KT * D;                                       /* [16][D] */
  float2 *sML = reinterpret_cast<float2 *>(sQ + ROWS * D);               /* [KW][16] (m, l) */
  float2 *sFin = sML + KW * ROWS;                                        /* [16] (M, L) */
  unsigned char *sValid = reinterpret_cast<unsigned char *>(sFin + ROWS); /* [STAGES][KT] */
  float *sO = reinterpret_cast<float *>(smem); /* [KW][16][OSTRIDE], after the last tile */
  /* fp8: the last KT * D bytes of the K area (past the ST8 stages) hold the
   * TOKEN scales, a stage's worth per stage ([ST8][2][KT] floats: stage,
   * k / v), then the key-valid flags [ST8][KT] */
  float *sTok = reinterpret_cast<float *>(smem + (size_t)ST * SB);
  if constexpr (KV8 != 0) sValid = reinterpret_cast<unsigned char *>(sTok + 2 * ST * KT);
  static_assert(KV8 == 0 || 8 * ST * KT + ST * KT <= KT * D, "fp8 scales and flags fit");

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int kw = warp % KW;
  const int dw = warp / KW;
  const int g = lane >> 2; /* accumulator rows (keys) g and g + 8 */
  const int qd = lane & 3; /* accumulator columns (query rows) 2 qd, 2 qd + 1 */
  const int q_len = p.q_len;
  /* the cache's element: T, or the fp8 byte (KV8; strides in bytes) */
  using KV = typename std::conditional<KV8 != 0, unsigned char, T>::type;
  const KV *k_head = static_cast<const KV *>(p.k_cache) + (int64_t)hk * p.k_strides[2];
  const KV *v_head = static_cast<const KV *>(p.v_cache) + (int64_t)hk * p.v_strides[2];

  /* [pass_lo, pass_end): the keys some row of the pass sees (no other key is
   * read); tiles start at kbeg, the 64-key boundary at or below pass_lo. */
  int pass_lo = end, pass_end = begin, lo_max = begin;
  /* [all_lo, all_hi): the keys every row of the pass sees (empty when a row
   * sees none): tiles inside it need no mask (the loop's fast path) */
  int all_lo = INT_MIN, all_hi = INT_MAX;
  for (int r = 0; r < pass_rows; r++) {
    int lo, hi;
    fd_pass_row_keys(p, r, row0, pass_rows, kv, begin, end, &lo, &hi);
    all_lo = max(all_lo, lo);
    all_hi = min(all_hi, hi);
    if (hi > lo) {
      pass_lo = min(pass_lo, lo);
      lo_max = max(lo_max, lo);
      pass_end = max(pass_end, hi);
    }
  }
  if (pass_lo > pass_end) pass_lo = pass_end;
  const int kbeg = begin + (pass_lo - begin) / 64 * 64;
  /* rows r0 and r1 (2 qd, 2 qd + 1) see [lo, lim); the lower bounds matter
   * only in tiles before lo_max (a window's first tiles) and are recomputed
   * there, which keeps the loop's registers those of the causal kernel */
  int lo_unused, lim0, lim1;
  const int r0 = 2 * qd, r1 = 2 * qd + 1; /* this lane's rows (TILE MATH) */
  fd_pass_row_keys(p, r0, row0, pass_rows, kv, begin, end, &lo_unused, &lim0);
  fd_pass_row_keys(p, r1, row0, pass_rows, kv, begin, end, &lo_unused, &lim1);
  const int span = pass_end - kbeg;
  const int num_tiles = (span + KT - 1) / KT;
  float scale = p.scale_log2;
  /* fp8 scales (KV8): TENSOR / HEAD fold k_scale into the score scale and
   * v_scale into O at the merge (l sums the unscaled p); TOKEN reads one per
   * key and tile (sTok below). */
  float v_mul = 1.0f;
  bool tok = false;
  if constexpr (KV8 != 0) {
    if (p.kv_scale == FD_KV_SCALE_TENSOR || p.kv_scale == FD_KV_SCALE_HEAD) {
      const int i = p.kv_scale == FD_KV_SCALE_HEAD ? hk : 0;
      scale *= __ldg(p.k_scale + i);
      v_mul = __ldg(p.v_scale + i);
    }
    tok = p.kv_scale == FD_KV_SCALE_TOKEN;
  }

  /* O^T accumulators: one m-tile per 16-column chunk (TILE MATH above) */
  constexpr int NO = NTV / 2;
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  /* running max of rows r0, r1 (base 2; uniform over the lanes sharing them) */
  float m0 = -INFINITY, m1 = -INFINITY;
  float l0 = 0.0f, l1 = 0.0f;           /* this lane's part of the running sums */

  if (num_tiles > 0) { /* block-uniform */
    using M = fd_mma_copy<D, NW>;
    const uint32_t sK_u = (uint32_t)__cvta_generic_to_shared(sK);
    const uint32_t sV_u = (uint32_t)__cvta_generic_to_shared(sV);

    /* q rows of the pass (zeros for phantom rows): commit group 0. */
#pragma unroll
    for (int idx = tid; idx < ROWS * C::CH; idx += C::THREADS) {
      const int r = idx / C::CH;
      const int c = idx % C::CH;
      const T *src = static_cast<const T *>(p.q);
      const bool ok = r < pass_rows && (DV == D || c < DV / 8);
      if (ok) {
        const int gi = (row0 + r) / q_len;
        const int t = (row0 + r) - gi * q_len;
        const int64_t h = (int64_t)hk * p.group + gi;
        src += (int64_t)b * p.q_strides[0] + (int64_t)t * p.q_strides[1] + h * p.q_strides[2] +
               c * 8;
      }
      fd_cp_async16(sQ + r * D + ((c ^ (r & 7)) << 3), src, ok);
    }
    fd_cp_async_commit();

    /* Copy state. Contiguous: element offsets of this thread's first key of
     * the next tile to issue, advanced a tile at a time. Paged: the page ids
     * of the next tile to issue, fetched one iteration ahead. */
    /* PG (a template constant, fd_mma_loader_pg at launch): each instance
     * holds one loader, so the contiguous kernel carries no page code and
     * the PG 1 kernel (page_size a power of two >= LOADS: a thread's LOADS
     * keys of a tile on one page, one id a tile) no per-key page code */
    constexpr bool paged = PG != 0;
    constexpr bool one_page = PG == 1;
    const bool check_pages = paged && p.num_pages > 0;
    const int pshift = fd_mma_page_shift<PG>(p.page_size);
    const int32_t *bt_row = paged ? p.block_table + (int64_t)b * p.block_table_stride : nullptr;
    int64_t off[2], off_tile[2];
    if constexpr (!paged) fd_mma_contig_offsets<KV, D, NW>(p, b, kbeg, off, off_tile);
    int pg[M::LOADS];
#pragma unroll
    for (int n = 0; n < M::LOADS; n++) pg[n] = -1;
    /* Paged: the page ids of tiles 0 .. STAGES-1 are loaded together before
     * any copy (one block_table round trip, not one per prologue tile). */
    int pgp[ST][M::LOADS];
    /* fp8 TOKEN, paged: the page id of key tid of tiles 0 .. ST-1 (tpgp), then
     * of the next tile to issue (tpg) */
    int tpgp[ST];
    const bool tok_pages = KV8 != 0 && tok && paged;
#pragma unroll
    for (int s = 0; s < ST; s++) {
#pragma unroll
      for (int n = 0; n < M::LOADS; n++) pgp[s][n] = -1;
      tpgp[s] = -1;
      if (paged && s < num_tiles) {
        const int key0 = kbeg + s * KT;
        fd_mma_page_ids<D, NW, one_page>(bt_row, p.page_size, pshift, key0,
                                         min(KT, pass_end - key0), pgp[s]);
        if (tok_pages)
          tpgp[s] = fd_mma_tok_page<PG>(p, bt_row, pshift, tid < KT, key0 + tid, pass_end);
      }
    }

    unsigned char *const sK8 = reinterpret_cast<unsigned char *>(sK);
    unsigned char *const sV8 = reinterpret_cast<unsigned char *>(sV);
    /* Prologue: tiles 0 .. ST-2, one commit group each (empty or not).
     * bad_early / bad_last: this thread's keys on bad pages in tiles
     * 0 .. ST-3 / ST-2. */
    bool bad_early = false, bad_last = false;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
      if (s < num_tiles) {
        const int key0 = kbeg + s * KT;
        const bool bad = fd_mma_copy_tile<KV, D, NW, DV, PG>(
            p, k_head, v_head, pshift, key0,
            pass_lo - key0 /* keys before it: zero-filled, not read */, min(KT, pass_end - key0),
            pgp[s], sK8 + s * SB, sV8 + s * SB, sValid + s * KT, off, off_tile);
        if constexpr (KV8 != 0)
          if (tok)
            fd_mma_copy_tok<KT, PG>(p, pshift, check_pages, b, hk, key0, pass_lo - key0,
                                    min(KT, pass_end - key0), tpgp[s], sTok + s * 2 * KT);
        if (s < ST - 2) bad_early = bad_early || bad;
        else bad_last = bad;
      }
      fd_cp_async_commit();
    }
#pragma unroll
    for (int n = 0; n < M::LOADS; n++) pg[n] = pgp[ST - 1][n];
    int tpg = tpgp[ST - 1];
    /* Q fragments, once per pass (group 0: at most ST - 1 younger groups pending). */
    fd_cp_async_wait<ST - 1>();
    /* Bad-page bits (check_pages), block-uniform: bit i is set when tile
     * it + i (it: the loop's tile) may have a key on a page id outside
     * [0, num_pages); the loop's barrier ORs in the tile copied one iteration
     * earlier. Tiles 0 .. STAGES-3 share one bit value here. */
    unsigned bad_tiles = 0;
    bool bad_pend = bad_last; /* this thread's keys of the last tile it copied */
    if (check_pages) {
      if (__syncthreads_or(bad_early)) bad_tiles = (1u << (ST - 2)) - 1;
    } else {
      __syncthreads();
    }
    uint32_t qa[KS][2]; /* Q is the B operand (row g) */
    if constexpr (KV8 != 0) {
      /* fp8: k-step ks's logical columns 2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9
       * are head_dim columns 16 ks + 4 qd + 0..3, the order in which a K
       * fragment arrives (FP8 above): 8 bytes a row from the swizzled sQ */
#pragma unroll
      for (int ks = 0; ks < KS; ks++) {
        const int c = 2 * ks + (qd >> 1), e = 4 * (qd & 1);
        const uint2 x0 = *reinterpret_cast<const uint2 *>(sQ + g * D + ((c ^ (g & 7)) << 3) + e);
        qa[ks][0] = x0.x; /* b0: logical k 2 qd, 2 qd + 1 */
        qa[ks][1] = x0.y; /* b1: 2 qd + 8, 2 qd + 9 */
      }
      /* fp8 runs its mma in fp16 (fp8 widens to fp16 in one conversion; P
       * is in [0, 1]): bf16 q becomes fp16 times 2^qe, its largest |q| in
       * (2^14, 2^15] (a power of two: exact for every q whose fp16 is
       * normal, i.e. within 2^-28 of that largest), and the score scale
       * takes 2^-qe. Every warp holds all of Q: a warp max suffices. */
      if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        float mq = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
          for (int i = 0; i < 2; i++) {
            const float2 f = fd_unpack2<__nv_bfloat16>(qa[ks][i]);
            mq = fmaxf(mq, fmaxf(fabsf(f.x), fabsf(f.y)));
          }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mq = fmaxf(mq, __shfl_xor_sync(0xffffffffu, mq, off));
        int qe = 0;
        if (mq > 0.0f && mq <= 3.40282346638528859812e+38f) { /* else (0, inf, NaN): as is */
          int ex;
          (void)frexpf(mq, &ex); /* mq = f 2^ex, f in [0.5, 1) */
          qe = 15 - ex;
        }
        const float up = ldexpf(1.0f, qe);
        scale = ldexpf(scale, -qe);
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
          for (int i = 0; i < 2; i++) {
            const float2 f = fd_unpack2<__nv_bfloat16>(qa[ks][i]);
            qa[ks][i] = fd_pack2<__half>(f.x * up, f.y * up);
          }
      }
    } else {
      /* B fragments of row g: columns 16 ks + 2 qd, + 1 (b0) and + 8 (b1) */
#pragma unroll
      for (int ks = 0; ks < KS; ks++) {
        qa[ks][0] = *reinterpret_cast<const uint32_t *>(sQ + g * D + (((2 * ks) ^ (g & 7)) << 3) + 2 * qd);
        qa[ks][1] =
            *reinterpret_cast<const uint32_t *>(sQ + g * D + (((2 * ks + 1) ^ (g & 7)) << 3) + 2 * qd);
      }
    }

    /* ldmatrix rows of this lane (TILE MATH): K (and fp8's V): key kw * 16 +
     * (lane & 7) + 8 ((lane >> 3) & 1), chunk + (lane >> 4); 16-bit V^T
     * (.trans): key kw * 16 + (lane & 7) + 8 (lane >> 4), chunk +
     * ((lane >> 3) & 1) */
    const int kr_row = kw * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
    const int kr_sub = lane >> 4;
    const int vt_row = kw * 16 + (lane & 7) + ((lane >> 4) << 3);
    const int vt_sub = (lane >> 3) & 1;
    /* fp8: fd_swz8<D>(kr_row, c + kr_sub) = fd_swz8_even(k8_base, k8_y, c) */
    const uint32_t k8_base = (uint32_t)(kr_row * D);
    const int k8_y = kr_sub ^ (D == 64 ? (kr_row >> 1) & 3 : kr_row & 7);

    int stage = 0;
    int load_stage = ST - 1;
    for (int it = 0; it < num_tiles; it++) {
      const int key0 = kbeg + it * KT;
      fd_cp_async_wait<ST - 2>(); /* this thread's copies of tile `it` landed */
      /* everyone's did; tile it-1 fully consumed (and the bad-page bit of
       * tile it + ST - 2, copied last iteration) */
      if (check_pages) {
        if (__syncthreads_or(bad_pend)) bad_tiles |= 1u << (ST - 2);
      } else {
        __syncthreads();
      }
      bad_pend = false;
      {
        const int nt = it + ST - 1; /* refill the stage tile it-1 used */
        if (nt < num_tiles) {
          const int nkey0 = kbeg + nt * KT;
          /* pass_lo - kbeg < 64 <= (ST - 1) * KT: only prologue tiles hold
           * keys below pass_lo (not so with 2 stages of 32 keys: then this
           * tile's keys below it are zero-filled, not read) */
          bad_pend = fd_mma_copy_tile<KV, D, NW, DV, PG>(
              p, k_head, v_head, pshift, nkey0, PRE_LO ? pass_lo - nkey0 : 0,
              min(KT, pass_end - nkey0), pg, sK8 + load_stage * SB, sV8 + load_stage * SB,
              sValid + load_stage * KT, off, off_tile);
          if constexpr (KV8 != 0)
            if (tok)
              fd_mma_copy_tok<KT, PG>(p, pshift, check_pages, b, hk, nkey0,
                                      PRE_LO ? pass_lo - nkey0 : 0, min(KT, pass_end - nkey0),
                                      tpg, sTok + load_stage * 2 * KT);
          if (paged && nt + 1 < num_tiles) {
            fd_mma_page_ids<D, NW, one_page>(bt_row, p.page_size, pshift, nkey0 + KT,
                                             min(KT, pass_end - (nkey0 + KT)), pg);
            if (tok_pages)
              tpg = fd_mma_tok_page<PG>(p, bt_row, pshift, tid < KT, nkey0 + KT + tid, pass_end);
          }
        }
        fd_cp_async_commit();
        load_stage = load_stage + 1 == ST ? 0 : load_stage + 1;
      }
      const float *tTok = sTok + stage * 2 * KT; /* fp8 TOKEN: this tile's k, v scales */
      constexpr bool e5m2 = KV8 == 2; /* the format: a template constant */

      /* ---- keys as the mma's M side (TILE MATH above) ----
       * S^T = K Q^T: per k-step the A fragment is K (keys g, g + 8 of the
       * warp's 16), the B fragment Q (row g). fp8: head_dim in the
       * permuted column order of the ldmatrix bytes, one ldmatrix.x4 for
       * two k-steps: matrix (key half, chunk) = (m & 1, m >> 1). sc[e]: key
       * kw * 16 + g + 8 (e >> 1) of row 2 qd + (e & 1). */
      const uint32_t kt_u = sK_u + (uint32_t)(stage * SB);
      float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (KV8 == 0) {
        /* 16-bit: K's A fragment by ldmatrix.x4, matrix (key half, chunk
         * half) = (m & 1, m >> 1) */
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
          uint32_t ka[4];
          fd_ldmatrix_x4(ka, kt_u + fd_swz<D>(kr_row, 2 * ks + kr_sub));
          fd_mma16816<T>(sc, ka, qa[ks][0], qa[ks][1]);
        }
      } else {
#pragma unroll
        for (int kp = 0; kp < (KS + 1) / 2; kp++) {
          uint32_t kr[4]; /* chunks 2 kp, 2 kp + 1 */
          fd_ldmatrix_x4(kr, kt_u + fd_swz8_even(k8_base, k8_y, 2 * kp));
#pragma unroll
          for (int h = 0; h < 2; h++) {
            if (2 * kp + h < KS) { /* odd KS (head_dim 80): the last chunk is padding */
              uint32_t ka[4];
              fd_fp8x4_widen<__half>(kr[2 * h], e5m2, ka[0], ka[2]);     /* key g */
              fd_fp8x4_widen<__half>(kr[2 * h + 1], e5m2, ka[1], ka[3]); /* key g + 8 */
              fd_mma16816<__half>(sc, ka, qa[2 * kp + h][0], qa[2 * kp + h][1]);
            }
          }
        }
      }

      /* Scale to base-2 units and mask (TILE MATH above). */
      const bool bad_pages = (bad_tiles & 1u) != 0; /* block-uniform */
      const int kl0 = kw * 16 + g;                  /* tile-local key of sc[0] */
      if (key0 >= all_lo && key0 + KT <= all_hi && !bad_pages) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float x = fd_mma_score(p, sc[e], KV8 != 0 && tok ? scale * tTok[kl0 + 8 * (e >> 1)] : scale);
          sc[e] = 2 * qd + (e & 1) < pass_rows ? x : -INFINITY;
        }
      } else {
        const unsigned char *tValid = sValid + stage * KT;
        int lo0 = INT_MIN, lo1 = INT_MIN, unused;
        if (key0 < lo_max) { /* block-uniform */
          fd_pass_row_keys(p, 2 * qd, row0, pass_rows, kv, begin, end, &lo0, &unused);
          fd_pass_row_keys(p, 2 * qd + 1, row0, pass_rows, kv, begin, end, &lo1, &unused);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int kl = kl0 + 8 * (e >> 1);
          const int j = key0 + kl;
          bool vis = (e & 1) == 0 ? (j < lim0 && j >= lo0) : (j < lim1 && j >= lo1);
          if (bad_pages) vis = vis && tValid[kl] != 0;
          const float x = fd_mma_score(p, sc[e], KV8 != 0 && tok ? scale * tTok[kl] : scale);
          sc[e] = vis ? x : -INFINITY;
        }
      }

      /* Online softmax, rows 2 qd (sc[0], sc[2]) and 2 qd + 1 (sc[1],
       * sc[3]): the max over the warp's 16 keys across the lanes of one qd. */
      float mx0 = fmaxf(sc[0], sc[2]), mx1 = fmaxf(sc[1], sc[3]);
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      float mu0, mu1;
      const float a0 = fd_softmax_step(m0, mx0, &mu0), a1 = fd_softmax_step(m1, mx1, &mu1);
      sc[0] = fd_exp2_ftz(sc[0] - mu0);
      sc[2] = fd_exp2_ftz(sc[2] - mu0);
      sc[1] = fd_exp2_ftz(sc[1] - mu1);
      sc[3] = fd_exp2_ftz(sc[3] - mu1);
      l0 = l0 * a0 + (sc[0] + sc[2]);
      l1 = l1 * a1 + (sc[1] + sc[3]);
      /* O^T's columns are the rows: c0, c2 row 2 qd, c1, c3 row 2 qd + 1;
       * skipped while no row max of the warp moved */
      if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
        for (int n = 0; n < NO; n++) {
          o[n][0] *= a0;
          o[n][1] *= a1;
          o[n][2] *= a0;
          o[n][3] *= a1;
        }
      }
      if (KV8 != 0 && tok) { /* p times its key's v_scale in fp32 (l summed the unscaled p) */
        const float v0 = tTok[KT + kl0], v1 = tTok[KT + kl0 + 8];
        sc[0] *= v0;
        sc[1] *= v0;
        sc[2] *= v1;
        sc[3] *= v1;
      }

      /* O^T += V^T P^T. B = P^T: the accumulators (key g / g + 8, rows 2 qd,
       * 2 qd + 1) in 16 bits (fp8: fp16, one part: 11 bits, far below the
       * cache's rounding; 16-bit: a hi and a lo part) are an 8x8 fragment each; movmatrix.trans makes them
       * (keys 2 qd, 2 qd + 1 / + 8, + 9; row g), b0 and b1. A = V^T: one
       * ldmatrix.x4.trans takes 16 keys x 2 chunks of 16 head_dim columns,
       * matrix (key half, chunk) = (m & 1, m >> 1), a register holding keys
       * 2 qd, 2 qd + 1 x columns 2 g, 2 g + 1: bytes (0, 2) and (1, 3) are
       * the even and odd column's keys, so chunk j's m-tile rows are its
       * even columns (g) and odd ones (g + 8). */
      const uint32_t vt_u = sV_u + (uint32_t)(stage * SB);
      if constexpr (KV8 == 0) {
        /* 16-bit: P in a hi and a lo part (fd_pack2_split), each
         * transposed by movmatrix into B fragments; V^T's A fragment by
         * ldmatrix.x4.trans, matrix (column half, key half) = (m & 1,
         * m >> 1): m-tile j holds columns 16 j + g (c0, c1) and
         * 16 j + 8 + g (c2, c3) of the warp's columns */
        uint32_t ph0, pl0, ph1, pl1;
        fd_pack2_split<T>(sc[0], sc[1], ph0, pl0);
        fd_pack2_split<T>(sc[2], sc[3], ph1, pl1);
        ph0 = fd_movmatrix_trans(ph0);
        pl0 = fd_movmatrix_trans(pl0);
        ph1 = fd_movmatrix_trans(ph1);
        pl1 = fd_movmatrix_trans(pl1);
#pragma unroll
        for (int j = 0; j < NO; j++) {
          uint32_t va[4];
          fd_ldmatrix_x4_trans(va, vt_u + fd_swz<D>(vt_row, dw * NT + 2 * j + vt_sub));
          fd_mma16816<T>(o[j], va, ph0, ph1);
          fd_mma16816<T>(o[j], va, pl0, pl1);
        }
      } else {
        const uint32_t pb0 = fd_movmatrix_trans(fd_pack2<__half>(sc[0], sc[1]));
        const uint32_t pb1 = fd_movmatrix_trans(fd_pack2<__half>(sc[2], sc[3]));
#pragma unroll
        for (int cp = 0; cp < (NO + 1) / 2; cp++) {
          uint32_t vr[4];
          /* chunks dw * (C::DPW / 16) + 2 cp, + 1 */
          fd_ldmatrix_x4_trans(vr, vt_u + fd_swz8_even(k8_base, k8_y, dw * (C::DPW / 16) + 2 * cp));
#pragma unroll
          for (int h = 0; h < 2; h++) {
            if (2 * cp + h < NO) { /* odd NO (head_dim 80): the last chunk is padding */
              uint32_t va[4];
              fd_fp8x4_widen<__half>(__byte_perm(vr[2 * h], vr[2 * h + 1], 0x6420), e5m2, va[0], va[2]);
              fd_fp8x4_widen<__half>(__byte_perm(vr[2 * h], vr[2 * h + 1], 0x7531), e5m2, va[1], va[3]);
              fd_mma16816<__half>(o[2 * cp + h], va, pb0, pb1);
            }
          }
        }
      }
      stage = stage + 1 == ST ? 0 : stage + 1;
      bad_tiles >>= 1;
    }
  }
  fd_cp_async_wait<0>(); /* only empty groups can remain; drain them */
  /* l: the lane parts of rows r0, r1 (the 8 lanes of a qd) */
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads(); /* K/V area free for the merge */

  /* Merge the KW key warps: publish (m, l), rescale O to the block max, sum in kw order. */
  if (dw == 0 && g == 0) {
    sML[kw * ROWS + r0] = make_float2(m0, l0);
    sML[kw * ROWS + r1] = make_float2(m1, l1);
  }
  if (dw == 0 && g == 1) { /* rows 8..15 are not in the pass */
    sML[kw * ROWS + 8 + 2 * qd] = make_float2(-INFINITY, 0.0f);
    sML[kw * ROWS + 9 + 2 * qd] = make_float2(-INFINITY, 0.0f);
  }
  __syncthreads();
  float bm0 = -INFINITY, bm1 = -INFINITY;
#pragma unroll
  for (int k = 0; k < KW; k++) {
    bm0 = fmaxf(bm0, sML[k * ROWS + r0].x);
    bm1 = fmaxf(bm1, sML[k * ROWS + r1].x);
  }
  /* 0 when m0 = -inf; fp8 TENSOR / HEAD: times v_scale (1 otherwise) */
  const float f0 = exp2f(m0 - (bm0 == -INFINITY ? 0.0f : bm0)) * v_mul;
  const float f1 = exp2f(m1 - (bm1 == -INFINITY ? 0.0f : bm1)) * v_mul;
  if constexpr (KV8 != 0) {
    /* fp8: O^T's m-tile j holds columns 16 j + 2 g (c0: row 2 qd, c1: row
     * 2 qd + 1) and 16 j + 2 g + 1 (c2, c3) */
    float *dst0 = sO + (kw * ROWS + r0) * OSTRIDE + dw * C::DPW + 2 * g;
    float *dst1 = dst0 + OSTRIDE;
#pragma unroll
    for (int j = 0; j < NO; j++) {
      *reinterpret_cast<float2 *>(dst0 + j * 16) = make_float2(o[j][0] * f0, o[j][2] * f0);
      *reinterpret_cast<float2 *>(dst1 + j * 16) = make_float2(o[j][1] * f1, o[j][3] * f1);
    }
  } else {
    /* 16-bit: m-tile j holds columns 16 j + g (c0, c1) and
     * 16 j + 8 + g (c2, c3), rows r0 (c0, c2) and r1 (c1, c3) */
    float *dst0 = sO + (kw * ROWS + r0) * OSTRIDE + dw * C::DPW + g;
    float *dst1 = dst0 + OSTRIDE;
#pragma unroll
    for (int j = 0; j < NO; j++) {
      dst0[j * 16] = o[j][0] * f0;
      dst0[j * 16 + 8] = o[j][2] * f0;
      dst1[j * 16] = o[j][1] * f1;
      dst1[j * 16 + 8] = o[j][3] * f1;
    }
  }
  if (tid < ROWS) {
    float bm = -INFINITY;
#pragma unroll
    for (int k = 0; k < KW; k++) bm = fmaxf(bm, sML[k * ROWS + tid].x);
    const float mu = bm == -INFINITY ? 0.0f : bm;
    float bl = 0.0f;
#pragma unroll
    for (int k = 0; k < KW; k++) {
      const float2 ml = sML[k * ROWS + tid];
      bl += ml.y * exp2f(ml.x - mu);
    }
    sFin[tid] = make_float2(bm, bl);
  }
  __syncthreads();

  fd_store_pass<T, DV, KW, ROWS, OSTRIDE, 2, C::THREADS>(p, b, hk, split, row0, pass_rows, sO,
                                                            &sFin[0].x, &sFin[0].y);
  __syncthreads(); /* smem is reused by the next pass */
}

/* Which configs the code for this target holds (gpu_select.h decides which
 * one a GPU runs). The 8-warp config needs ~200 KB of shared memory a block,
 * which no compute capability 8.x GPU has (163 KB at most): code for targets
 * below sm_90 omits its body (the host launches it only where
 * cudaFuncAttributes.ptxVersion >= 90, fd_mma_wide_ok). The lean config is
 * for GPUs with 99 KB a block; sm_90a code runs only on compute capability
 * 9.0 (227 KB), so it omits the lean body unless the build caps the budget
 * (FD_CUDA_SMEM_LIMIT_KB) and so may choose it. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FD_MMA_WIDE_BUILT 0
#else
#define FD_MMA_WIDE_BUILT 1
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !(FD_CUDA_SMEM_LIMIT_KB > 0)
#define FD_MMA_LEAN_BUILT 0
#else
#define FD_MMA_LEAN_BUILT 1
#endif

template <typename T, int D, int NW, int DV, int LEAN, int KV8, int PG>
__global__ void __launch_bounds__(32 * NW, NW == 4 ? 2 : 1)
    fd_split_mma_kernel(const __grid_constant__ fd_kernel_params p) {
  extern __shared__ __align__(128) unsigned char fd_mma_smem[];
  if constexpr ((NW == 8 && !FD_MMA_WIDE_BUILT) || (LEAN && !FD_MMA_LEAN_BUILT)) {
    __trap(); /* not in this target's code; the host never launches it here */
  } else {
    /* Launched with PDL (sm_90 code): wait until the previous kernel in the
     * stream has completed and its writes are visible (returns at once
     * otherwise). */
    fd_pdl_wait();
    /* Let the combine grid be scheduled once every block of this grid runs; it
     * waits for this grid's completion (griddepcontrol.wait) before reading. */
    fd_pdl_launch_dependents();

    const int split = blockIdx.x;
    const int hk = blockIdx.y;
    const int b = blockIdx.z;
    int kv = __ldg(p.kv_len + b);
    kv = kv < 0 ? 0 : (kv > p.kv_capacity ? p.kv_capacity : kv);
    int begin, end; /* split.h: a window skips the keys before it */
    fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
                 &begin, &end);
    if (p.num_splits > 1 && begin >= end) return; /* past the last key: the combine skips it */

    const int rows_total = p.group * p.q_len;
    constexpr int PR = 8; /* rows a pass: the mma's N (TILE MATH) */
    for (int row0 = 0; row0 < rows_total; row0 += PR)
      fd_split_mma_pass<T, D, NW, DV, LEAN, KV8, PG>(p, b, hk, split, kv, begin, end, row0,
                                            min(PR, rows_total - row0), fd_mma_smem);
  }
}

template <typename T, int D, int NW, int DV, int LEAN, int KV8, int PG>
static cudaError_t fd_split_mma_prepare(void) {
  constexpr size_t smem = fd_mma_cfg<D, NW, LEAN>::SMEM;
  cudaError_t e = cudaFuncSetAttribute(fd_split_mma_kernel<T, D, NW, DV, LEAN, KV8, PG>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  /* All of the unified L1/shared array as shared memory (two 4-warp blocks
   * or one 8-warp block per SM). */
  return cudaFuncSetAttribute(fd_split_mma_kernel<T, D, NW, DV, LEAN, KV8, PG>,
                              cudaFuncAttributePreferredSharedMemoryCarveout,
                              (int)cudaSharedmemCarveoutMaxShared);
}

template <typename T, int D, int NW, int DV, int LEAN, int KV8, int PG>
static cudaError_t fd_split_mma_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  const cudaError_t e = fd_split_mma_prepare<T, D, NW, DV, LEAN, KV8, PG>();
  if (e != cudaSuccess) return e;
  return fd_launch(fd_split_mma_kernel<T, D, NW, DV, LEAN, KV8, PG>, *p,
                   dim3((unsigned)p->num_splits, (unsigned)p->num_heads_kv, (unsigned)p->batch),
                   dim3(fd_mma_cfg<D, NW, LEAN>::THREADS), fd_mma_cfg<D, NW, LEAN>::SMEM, stream,
                   p->pdl == FD_PDL_ALL);
}

template <typename T, int D, int DV, int LEAN>
static cudaError_t fd_split_mma_occupancy_instance(int *blocks_per_sm) {
  const cudaError_t e = fd_split_mma_prepare<T, D, 4, DV, LEAN, 0, 0>();
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm,
                                                       fd_split_mma_kernel<T, D, 4, DV, LEAN, 0, 0>,
                                                       fd_mma_cfg<D, 4, LEAN>::THREADS,
                                                       fd_mma_cfg<D, 4, LEAN>::SMEM);
}

/* The loader as a template constant (PG, fd_mma_loader_pg): contiguous,
 * paged with one page id a tile (page_size a power of two >= the config's
 * keys per thread, fd_mma_copy<D, NW>::LOADS), or paged with one a key. */
template <typename T, int D, int NW, int DV, int LEAN, int KV8>
static cudaError_t fd_split_mma_launch_loader(const fd_kernel_params *p, cudaStream_t stream) {
  switch (fd_mma_loader_pg(p->page_size, fd_mma_copy<D, NW>::LOADS)) {
    case 0: return fd_split_mma_launch_instance<T, D, NW, DV, LEAN, KV8, 0>(p, stream);
    case 1: return fd_split_mma_launch_instance<T, D, NW, DV, LEAN, KV8, 1>(p, stream);
    case 2: return fd_split_mma_launch_instance<T, D, NW, DV, LEAN, KV8, 2>(p, stream);
  }
  return cudaErrorInvalidValue;
}

/* D: the shared-memory row width; DV: head_dim (DV < D: 80 and 96 in rows of
 * 128). head_dim 64 has no lean instance (its 4-warp block fits every GPU).
 * KV8 (an fp8 cache, either format: the kernel reads p->kv_dtype): FD_MMA_4W
 * and FD_MMA_LEAN only (cuda_backend.cu never picks the 8-warp config for
 * it), the shared memory of the 16-bit instance. */
template <typename T, int D, int DV, int KV8>
static cudaError_t fd_split_mma_launch_cfg(const fd_kernel_params *p, int cfg,
                                           cudaStream_t stream) {
  switch (cfg) {
    case FD_MMA_4W: return fd_split_mma_launch_loader<T, D, 4, DV, 0, KV8>(p, stream);
    case FD_MMA_WIDE:
      if constexpr (KV8 == 0) return fd_split_mma_launch_loader<T, D, 8, DV, 0, 0>(p, stream);
      break;
    case FD_MMA_LEAN:
      if constexpr (D != 64) return fd_split_mma_launch_loader<T, D, 4, DV, 1, KV8>(p, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

template <typename T, int KV8>
static cudaError_t fd_split_mma_launch_dim(const fd_kernel_params *p, int cfg,
                                           cudaStream_t stream) {
  switch (p->head_dim) {
    case 64: return fd_split_mma_launch_cfg<T, 64, 64, KV8>(p, cfg, stream);
    case 80: return fd_split_mma_launch_cfg<T, 128, 80, KV8>(p, cfg, stream);
    case 96: return fd_split_mma_launch_cfg<T, 128, 96, KV8>(p, cfg, stream);
    case 128: return fd_split_mma_launch_cfg<T, 128, 128, KV8>(p, cfg, stream);
    case 256: return fd_split_mma_launch_cfg<T, 256, 256, KV8>(p, cfg, stream);
  }
  return cudaErrorInvalidValue;
}

#endif /* FD_CUDA_SPLIT_MMA_KERNEL_CUH */
