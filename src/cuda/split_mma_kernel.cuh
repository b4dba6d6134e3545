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
 *   (cuda_backend.cu), where four warps an SM leave the schedulers idle,
 *   on GPUs with ~200 KB a block (FD_MMA_WIDE); NW = 4
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
 *   path: no mask, only the scale). Bytes in flight: STAGES - 1 tiles of
 *   32 KB (16 KB for head_dim 64) a block, 128 KB an SM at 2 blocks; NW = 8:
 *   2 tiles of 64 KB (5 of 32 KB for head_dim 64) an SM. (Asking L2 for 3
 *   tiles further ahead, cp.async.bulk.prefetch.L2, runs ~25 % slower at 64
 *   sequences of 8k keys, so it is not done.)
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
 *   (fd_mma_cfg::SMEM); the policy fd_kv8 (mma_format.cuh). A tile's fp8 bytes (KT rows of D bytes, chunk c of
 *   row k at c ^ fd_swz8) are copied by cp.async (16 values a copy, by the
 *   same loaders: same keys per thread, same zero-fills) into ST8 = 2
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
 *   Scales, all fp32: k_scale multiplies each score after the score scale
 *   ((s * scale_log2) * k_scale: their product may overflow where no score
 *   does); TENSOR / HEAD: v_scale multiplies O at the merge (f0, f1);
 *   TOKEN: thread tid < KT copies key tid's k and v scale by cp.async into
 *   the tile's stage of sTok [ST8][2][KT], in the tile's commit group (the
 *   scales travel the pipeline with their keys; paged: through the
 *   block_table, the id read a tile ahead; keys the tile's copies zero-fill
 *   or on a bad page: 0, never read); each score is multiplied by its
 *   key's k_scale before the soft-cap and mask; O runs relative to
 *   2^(m + ev), ev the running max of (s - m) + e (v_scale = f 2^e, f in
 *   [1, 2)), so P = 2^((s - m) + e - ev) f in [0, 2) is the fp16 B operand
 *   for any finite scales (fd_kv8::token_p), l sums the unscaled p, and the
 *   merge applies 2^((m - bm) + ev). Masked keys stay -inf / P = 0.
 *
 * OUTPUT  (fd_store_pass, pass_output.cuh) As split_kernel.cu: num_splits > 1:
 *   unnormalised O, m (natural units) and l into the partials; empty splits exit at once; rows that see
 *   none of an active split's keys write m = -inf, l = 0, O = 0. num_splits ==
 *   1: out = O / l and lse = m + ln l (out = 0, lse = -inf for a row without
 *   keys).
 *
 * STRUCTURE  The pass (fd_split_mma_pass) is a short sequence of steps,
 *   each a function of this file, written once for every element format:
 *     fd_mma_pass_rows     the pass's key ranges (which keys are read, the
 *                          fast-path range, the lane's row bounds);
 *     fd_mma_load_q        q rows -> shared memory (commit group 0);
 *     fd_mma_prologue      page ids, the first ST - 1 tiles, the barrier;
 *     F::q_frags           Q's B fragments, once a pass;
 *     per tile: fd_mma_wait_refill (wait, barrier, refill a stage), F::qk
 *     (S^T = K Q^T), fd_mma_mask (scale, soft-cap, mask), fd_mma_softmax
 *     (online softmax, O's rescale), F::pv (O^T += V^T P^T);
 *     fd_mma_merge_warps   the key warps' (m, l) and O into the block's;
 *     fd_store_pass        the outputs (pass_output.cuh).
 *   F is the element format's policy (mma_format.cuh: fd_kv16, fd_kv8 with
 *   its fp8 scales): stage geometry, Q fragments, the K fragment and Q K^T
 *   slice, the P V slice, the O store layout. A new cache format (MLA: a
 *   576-wide K whose first 512 columns are V) adds a policy, not a pass.
 *
 * FILES  mma_config.cuh (the compile-time shape: fd_mma_cfg, fd_mma_shape),
 *   mma_format.cuh (the element formats), mma_primitives.cuh (mma,
 *   ldmatrix, packing, swizzle), mma_loaders.cuh (global -> shared copies:
 *   one loader a layout, contiguous, paged one id a tile, paged one id a
 *   key, for 16-bit and fp8 elements), pass_output.cuh (the epilogue); this
 *   file: the pass's steps, the kernel and its per-instance launchers,
 *   compiled by three translation units that build in parallel:
 *   split_mma_kernel.cu (16-bit caches, the public launch, occupancy),
 *   split_mma_fp8.cu (e4m3) and split_mma_e5m2.cu (e5m2).
 *
 * CODE SIZE  The loader is a template constant (PG, fd_mma_loader_pg at
 *   launch, from page_size and LOADS of the config: 0 contiguous; 1 paged,
 *   page_size a power of two >= LOADS, one page id a tile; 2 paged, any
 *   other page_size, one id a key), so an instance holds one copy path: the
 *   contiguous bf16 head_dim 128 instance is ~55 KB of sm_90a SASS where one
 *   holding both loaders was 123 KB; its PG 1 instance ~60 KB where one
 *   holding both paged paths was 112 KB (PG 2: ~95 KB). Size is speed here:
 *   with two warps a scheduler, a larger tile loop stalls on instruction
 *   fetch (~5 cycles an instruction), worst in a model's stream where the
 *   GEMMs evict the code from L2. tests/check_code_size.sh bounds it.
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
#include "mma_format.cuh"
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
                                                      int key0, int t, int pass_end) {
  /* t >= pass_end - key0, not key0 + t >= pass_end: key0 + t may pass INT32_MAX */
  if (PG == 0 || !mine || t >= pass_end - key0) return -1;
  const int j = key0 + t;
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

/* A score s in base-2 units: times `scale` (softmax_scale log2(e)), then
 * times kmul (1 for 16-bit caches; fp8: k_scale, per key for TOKEN scales:
 * scale * k_scale may overflow where the score does not), soft-capped when
 * the call asks (block-uniform). */
static __device__ __forceinline__ float fd_mma_score(const fd_kernel_params &p, float s,
                                                     float scale, float kmul) {
  const float x = (s * scale) * kmul;
  return p.cap_out != 0.0f ? fd_soft_cap_fast(x, p.cap_in, p.cap_out) : x;
}

/* ---- The pass, step by step ---- */

/* Shared memory of a pass (fd_mma_cfg::SMEM sizes it): K stages | V stages |
 * Q [16][D] | (m, l) [KW][16] | (M, L) [16] | 16-bit: key-valid flags
 * [STAGES][KT]; fp8 keeps its flags and TOKEN scales in the K area
 * (mma_format.cuh). After the last tile the K/V area holds the warps' O
 * [KW][16][OSTRIDE] fp32. */
template <typename F, typename S>
struct fd_mma_bufs {
  unsigned char *k, *v; /* [ST][SB] bytes each */
  typename F::Q *q;     /* [16][D] */
  float2 *ml;           /* [KW][16] (m, l) of the key warps */
  float2 *fin;          /* [16] (M, L) of the block */
  unsigned char *valid; /* [ST][KT] key-valid flags */
  float *tok;           /* fp8 TOKEN: [ST][2][KT] k, v scales */
  float *o;             /* [KW][16][OSTRIDE], after the last tile */
};

template <typename F, typename S>
static __device__ __forceinline__ fd_mma_bufs<F, S> fd_mma_carve(unsigned char *smem) {
  using T = typename F::Q;
  fd_mma_bufs<F, S> s;
  T *sK = reinterpret_cast<T *>(smem);
  T *sV = sK + S::STAGES * S::KT * S::D;
  s.k = smem;
  s.v = reinterpret_cast<unsigned char *>(sV);
  s.q = sV + S::STAGES * S::KT * S::D;
  s.ml = reinterpret_cast<float2 *>(s.q + S::ROWS * S::D);
  s.fin = s.ml + S::KW * S::ROWS;
  s.tok = F::token_scales(smem);
  s.valid = F::valid_flags(reinterpret_cast<unsigned char *>(s.fin + S::ROWS), smem);
  s.o = reinterpret_cast<float *>(smem);
  return s;
}

/* A thread's place: warp (kw, dw) = (warp % KW, warp / KW); lane (g, qd):
 * accumulator rows (keys) g, g + 8 and columns (query rows) 2 qd, 2 qd + 1. */
typedef struct fd_mma_thread {
  int tid, lane, kw, dw, g, qd;
} fd_mma_thread;

template <typename S>
static __device__ __forceinline__ fd_mma_thread fd_mma_thread_of(void) {
  fd_mma_thread t;
  t.tid = threadIdx.x;
  t.lane = t.tid & 31;
  const int warp = t.tid >> 5;
  t.kw = warp % S::KW;
  t.dw = warp / S::KW;
  t.g = t.lane >> 2;
  t.qd = t.lane & 3;
  return t;
}

/* The keys of a pass: [pass_lo, pass_end) some row sees (no other key is
 * read); tiles start at kbeg, the 64-key boundary at or below pass_lo;
 * [all_lo, all_hi) every row sees (empty when a row sees none: tiles inside
 * it need no mask, the loop's fast path); lo_max: the highest lower bound;
 * lim0, lim1: the upper bounds of this lane's rows 2 qd, 2 qd + 1. */
typedef struct fd_mma_rows {
  int row0, pass_rows, kv, begin, end;
  int pass_lo, pass_end, lo_max, all_lo, all_hi, kbeg, lim0, lim1, num_tiles;
} fd_mma_rows;

template <int KT>
static __device__ __forceinline__ fd_mma_rows fd_mma_pass_rows(const fd_kernel_params &p, int row0,
                                                               int pass_rows, int kv, int begin,
                                                               int end, int qd) {
  fd_mma_rows R;
  R.row0 = row0;
  R.pass_rows = pass_rows;
  R.kv = kv;
  R.begin = begin;
  R.end = end;
  R.pass_lo = end;
  R.pass_end = begin;
  R.lo_max = begin;
  R.all_lo = INT_MIN;
  R.all_hi = INT_MAX;
  for (int r = 0; r < pass_rows; r++) {
    int lo, hi;
    fd_pass_row_keys(p, r, row0, pass_rows, kv, begin, end, &lo, &hi);
    R.all_lo = max(R.all_lo, lo);
    R.all_hi = min(R.all_hi, hi);
    if (hi > lo) {
      R.pass_lo = min(R.pass_lo, lo);
      R.lo_max = max(R.lo_max, lo);
      R.pass_end = max(R.pass_end, hi);
    }
  }
  if (R.pass_lo > R.pass_end) R.pass_lo = R.pass_end;
  R.kbeg = begin + (R.pass_lo - begin) / 64 * 64;
  /* the lower bounds matter only in tiles before lo_max (a window's first
   * tiles) and are recomputed there (fd_mma_mask), which keeps the loop's
   * registers those of the causal kernel */
  int lo_unused;
  fd_pass_row_keys(p, 2 * qd, row0, pass_rows, kv, begin, end, &lo_unused, &R.lim0);
  fd_pass_row_keys(p, 2 * qd + 1, row0, pass_rows, kv, begin, end, &lo_unused, &R.lim1);
  const int span = R.pass_end - R.kbeg;
  R.num_tiles = (span + KT - 1) / KT;
  return R;
}

/* The q rows of the pass (zeros for phantom rows) into sQ: commit group 0. */
template <typename T, typename S>
static __device__ __forceinline__ void fd_mma_load_q(const fd_kernel_params &p, int b, int hk,
                                                     int row0, int pass_rows, T *sQ) {
#pragma unroll
  for (int idx = threadIdx.x; idx < S::ROWS * S::CH; idx += S::THREADS) {
    const int r = idx / S::CH;
    const int c = idx % S::CH;
    const T *src = static_cast<const T *>(p.q);
    const bool ok = r < pass_rows && (S::DV == S::D || c < S::DV / 8);
    if (ok) {
      const int gi = (row0 + r) / p.q_len;
      const int t = (row0 + r) - gi * p.q_len;
      const int64_t h = (int64_t)hk * p.group + gi;
      src += (int64_t)b * p.q_strides[0] + (int64_t)t * p.q_strides[1] + h * p.q_strides[2] +
             c * 8;
    }
    fd_cp_async16(sQ + r * S::D + ((c ^ (r & 7)) << 3), src, ok);
  }
  fd_cp_async_commit();
}

/* The copy pipeline's state. Contiguous (PG 0): the running element offsets
 * of this thread's first key of the next tile to issue (off), a tile's step
 * (off_tile). Paged: the page ids of the next tile to issue (pg; fp8 TOKEN:
 * tpg, key tid's), fetched one iteration ahead. bad_tiles (check_pages),
 * block-uniform: bit i is set when tile it + i (it: the loop's tile) may
 * have a key on a page id outside [0, num_pages); bad_pend: this thread's
 * keys of the last tile it copied. */
template <int LOADS>
struct fd_mma_pipe {
  int64_t off[2], off_tile[2];
  int pg[LOADS];
  int tpg;
  int pshift;
  const int32_t *bt_row;
  bool check_pages;
  int load_stage;
  unsigned bad_tiles;
  bool bad_pend;
};

/* One tile's copies (K, V; fp8 TOKEN: the scales) into stage `stage`: keys
 * key0 .. key0 + min(KT, pass_end - key0) - 1, those below key0 + klo
 * zero-filled; returns whether one of this thread's keys is on a bad page. */
template <typename F, typename S, int PG>
static __device__ __forceinline__ bool fd_mma_issue_tile(
    const fd_kernel_params &p, int b, int hk, const typename F::KV *k_head,
    const typename F::KV *v_head, const fd_mma_bufs<F, S> &sm,
    fd_mma_pipe<fd_mma_copy<S::D, S::NW>::LOADS> &pp, const int (&pg)[fd_mma_copy<S::D, S::NW>::LOADS],
    int tpg, bool tok, int stage, int key0, int klo, int pass_end) {
  const bool bad = fd_mma_copy_tile<typename F::KV, S::D, S::NW, S::DV, PG>(
      p, k_head, v_head, pp.pshift, key0, klo, min(S::KT, pass_end - key0), pg,
      sm.k + stage * F::SB, sm.v + stage * F::SB, sm.valid + stage * S::KT, pp.off, pp.off_tile);
  if constexpr (F::TOKEN)
    if (tok)
      fd_mma_copy_tok<S::KT, PG>(p, pp.pshift, pp.check_pages, b, hk, key0, klo,
                                 min(S::KT, pass_end - key0), tpg, sm.tok + stage * 2 * S::KT);
  return bad;
}

/* Pipeline prologue: the page ids of tiles 0 .. ST-1 together (one
 * block_table round trip, not one a tile), tiles 0 .. ST-2 copied (a commit
 * group each, empty or not), the wait for Q (group 0) and the block barrier
 * that ORs the prologue tiles' bad pages. */
template <typename F, typename S, int PG>
static __device__ __forceinline__ void fd_mma_prologue(
    const fd_kernel_params &p, int b, int hk, const fd_mma_rows &R, bool tok,
    const typename F::KV *k_head, const typename F::KV *v_head, const fd_mma_bufs<F, S> &sm,
    fd_mma_pipe<fd_mma_copy<S::D, S::NW>::LOADS> &pp) {
  constexpr int ST = F::ST, KT = S::KT, LOADS = fd_mma_copy<S::D, S::NW>::LOADS;
  /* PG (a template constant, fd_mma_loader_pg at launch): each instance
   * holds one loader, so the contiguous kernel carries no page code and
   * the PG 1 kernel (page_size a power of two >= LOADS: a thread's LOADS
   * keys of a tile on one page, one id a tile) no per-key page code */
  constexpr bool paged = PG != 0;
  constexpr bool one_page = PG == 1;
  const int tid = threadIdx.x;
  pp.check_pages = paged && p.num_pages > 0;
  pp.pshift = fd_mma_page_shift<PG>(p.page_size);
  pp.bt_row = paged ? p.block_table + (int64_t)b * p.block_table_stride : nullptr;
  if constexpr (!paged) fd_mma_contig_offsets<typename F::KV, S::D, S::NW>(p, b, R.kbeg, pp.off, pp.off_tile);
#pragma unroll
  for (int n = 0; n < LOADS; n++) pp.pg[n] = -1;
  int pgp[ST][LOADS];
  /* fp8 TOKEN, paged: the page id of key tid of tiles 0 .. ST-1 */
  int tpgp[ST];
  const bool tok_pages = F::TOKEN && tok && paged;
#pragma unroll
  for (int s = 0; s < ST; s++) {
#pragma unroll
    for (int n = 0; n < LOADS; n++) pgp[s][n] = -1;
    tpgp[s] = -1;
    if (paged && s < R.num_tiles) {
      const int key0 = R.kbeg + s * KT;
      fd_mma_page_ids<S::D, S::NW, one_page>(pp.bt_row, p.page_size, pp.pshift, key0,
                                             min(KT, R.pass_end - key0), pgp[s]);
      if (tok_pages)
        tpgp[s] = fd_mma_tok_page<PG>(p, pp.bt_row, pp.pshift, tid < KT, key0, tid, R.pass_end);
    }
  }
  /* bad_early / bad_last: this thread's keys on bad pages in tiles
   * 0 .. ST-3 / ST-2 */
  bool bad_early = false, bad_last = false;
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < R.num_tiles) {
      const int key0 = R.kbeg + s * KT;
      const bool bad = fd_mma_issue_tile<F, S, PG>(p, b, hk, k_head, v_head, sm, pp, pgp[s],
                                                   tpgp[s], tok, s, key0,
                                                   R.pass_lo - key0 /* keys before it: zero-filled */,
                                                   R.pass_end);
      if (s < ST - 2) bad_early = bad_early || bad;
      else bad_last = bad;
    }
    fd_cp_async_commit();
  }
#pragma unroll
  for (int n = 0; n < LOADS; n++) pp.pg[n] = pgp[ST - 1][n];
  pp.tpg = tpgp[ST - 1];
  pp.load_stage = ST - 1;
  /* Q landed (group 0: at most ST - 1 younger groups pending). Tiles
   * 0 .. ST-3 share one bad-page bit value here. */
  fd_cp_async_wait<ST - 1>();
  pp.bad_tiles = 0;
  pp.bad_pend = bad_last;
  if (pp.check_pages) {
    if (__syncthreads_or(bad_early)) pp.bad_tiles = (1u << (ST - 2)) - 1;
  } else {
    __syncthreads();
  }
}

/* The top of tile it: wait for its copies, the block barrier (everyone's
 * copies landed; tile it-1 fully consumed; the bad-page bit of tile
 * it + ST - 2, copied last iteration, OR-ed in), then the refill of the
 * stage tile it-1 used with tile it + ST - 1 and the page ids a tile ahead. */
template <typename F, typename S, int PG>
static __device__ __forceinline__ void fd_mma_wait_refill(
    const fd_kernel_params &p, int b, int hk, const fd_mma_rows &R, int it, bool tok,
    const typename F::KV *k_head, const typename F::KV *v_head, const fd_mma_bufs<F, S> &sm,
    fd_mma_pipe<fd_mma_copy<S::D, S::NW>::LOADS> &pp) {
  constexpr int ST = F::ST, KT = S::KT;
  /* pass_lo - kbeg < 64 <= (ST - 1) * KT: only prologue tiles hold keys
   * below pass_lo (not so with 2 stages of 32 keys: then this tile's keys
   * below it are zero-filled, not read) */
  constexpr bool PRE_LO = (ST - 1) * KT < 64;
  constexpr bool paged = PG != 0;
  constexpr bool one_page = PG == 1;
  fd_cp_async_wait<ST - 2>(); /* this thread's copies of tile `it` landed */
  if (pp.check_pages) {
    if (__syncthreads_or(pp.bad_pend)) pp.bad_tiles |= 1u << (ST - 2);
  } else {
    __syncthreads();
  }
  pp.bad_pend = false;
  const int nt = it + ST - 1;
  if (nt < R.num_tiles) {
    const int nkey0 = R.kbeg + nt * KT;
    pp.bad_pend = fd_mma_issue_tile<F, S, PG>(p, b, hk, k_head, v_head, sm, pp, pp.pg, pp.tpg,
                                              tok, pp.load_stage, nkey0,
                                              PRE_LO ? R.pass_lo - nkey0 : 0, R.pass_end);
    if (paged && nt + 1 < R.num_tiles) {
      fd_mma_page_ids<S::D, S::NW, one_page>(pp.bt_row, p.page_size, pp.pshift, nkey0 + KT,
                                             min(KT, R.pass_end - (nkey0 + KT)), pp.pg);
      if (F::TOKEN && tok && paged)
        pp.tpg = fd_mma_tok_page<PG>(p, pp.bt_row, pp.pshift, (int)threadIdx.x < KT,
                                     nkey0 + KT, (int)threadIdx.x, R.pass_end);
    }
  }
  fd_cp_async_commit();
  pp.load_stage = pp.load_stage + 1 == ST ? 0 : pp.load_stage + 1;
}

/* Scores to base-2 units and mask (TILE MATH): sc[e] is key kl0 + 8 (e >> 1)
 * of the tile (kl0 = kw * 16 + g), row 2 qd + (e & 1). A tile whose keys
 * every row sees, on good pages, only scales. */
template <typename F, typename S>
static __device__ __forceinline__ void fd_mma_mask(const fd_kernel_params &p, const fd_mma_rows &R,
                                                   int qd, int kl0, int key0, bool bad_pages,
                                                   float scale, float k_mul, bool tok,
                                                   const float *tTok,
                                                   const unsigned char *tValid, float (&sc)[4]) {
  /* key0 + KT and key0 + kl may pass INT32_MAX in a sequence's last tile */
  if (key0 >= R.all_lo && key0 <= R.all_hi - S::KT && !bad_pages) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float x = fd_mma_score(p, sc[e], scale, F::key_scale(k_mul, tok, tTok, kl0 + 8 * (e >> 1)));
      sc[e] = 2 * qd + (e & 1) < R.pass_rows ? x : -INFINITY;
    }
  } else {
    /* in tile-local keys (key0 + kl may pass INT32_MAX): rows 2 qd, 2 qd + 1
     * see kl in [lo0, hi0), [lo1, hi1) */
    int lo0 = INT_MIN, lo1 = INT_MIN, unused;
    if (key0 < R.lo_max) { /* block-uniform */
      fd_pass_row_keys(p, 2 * qd, R.row0, R.pass_rows, R.kv, R.begin, R.end, &lo0, &unused);
      fd_pass_row_keys(p, 2 * qd + 1, R.row0, R.pass_rows, R.kv, R.begin, R.end, &lo1, &unused);
      lo0 -= key0;
      lo1 -= key0;
    }
    const int hi0 = R.lim0 - key0, hi1 = R.lim1 - key0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int kl = kl0 + 8 * (e >> 1);
      bool vis = (e & 1) == 0 ? (kl < hi0 && kl >= lo0) : (kl < hi1 && kl >= lo1);
      if (bad_pages) vis = vis && tValid[kl] != 0;
      const float x = fd_mma_score(p, sc[e], scale, F::key_scale(k_mul, tok, tTok, kl));
      sc[e] = vis ? x : -INFINITY;
    }
  }
}

/* Online softmax, rows 2 qd (sc[0], sc[2]) and 2 qd + 1 (sc[1], sc[3]): the
 * max over the warp's 16 keys across the lanes of one qd; *a0, *a1 = 2^(m_old
 * - m_new), the factors of the old O and l; sc becomes p; l sums the lane's
 * p. */
static __device__ __forceinline__ void fd_mma_softmax(float (&sc)[4], float &m0, float &m1,
                                                      float &l0, float &l1, float &a0, float &a1) {
  float mx0 = fmaxf(sc[0], sc[2]), mx1 = fmaxf(sc[1], sc[3]);
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  float mu0, mu1;
  a0 = fd_softmax_step(m0, mx0, &mu0);
  a1 = fd_softmax_step(m1, mx1, &mu1);
  sc[0] = fd_exp2_ftz(sc[0] - mu0);
  sc[2] = fd_exp2_ftz(sc[2] - mu0);
  sc[1] = fd_exp2_ftz(sc[1] - mu1);
  sc[3] = fd_exp2_ftz(sc[3] - mu1);
  l0 = l0 * a0 + (sc[0] + sc[2]);
  l1 = l1 * a1 + (sc[1] + sc[3]);
}

/* O^T's rescale by the online softmax's factors a0 (row 2 qd: columns c0,
 * c2) and a1 (row 2 qd + 1: c1, c3), skipped while no factor of the warp
 * differs from 1. */
template <int NO>
static __device__ __forceinline__ void fd_mma_rescale_o(float (&o)[NO][4], float a0, float a1) {
  if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
    for (int n = 0; n < NO; n++) {
      o[n][0] *= a0;
      o[n][1] *= a1;
      o[n][2] *= a0;
      o[n][3] *= a1;
    }
  }
}

/* After the last tile: the KW key warps' (m, l) published, O rescaled to the
 * block max (fp8 TENSOR / HEAD: times v_mul; TOKEN: from 2^(m + ev)) into the
 * merge buffer, the
 * block's (M, L) a row into sFin. l0, l1: the lane parts, summed here. */
template <typename F, typename S>
static __device__ __forceinline__ void fd_mma_merge_warps(const fd_mma_bufs<F, S> &sm,
                                                          const fd_mma_thread &th,
                                                          float (&o)[S::NO][4], float m0,
                                                          float m1, float l0, float l1,
                                                          float v_mul, bool tok, float ev0,
                                                          float ev1) {
  constexpr int ROWS = S::ROWS, KW = S::KW;
  const int r0 = 2 * th.qd, r1 = 2 * th.qd + 1;
  /* l: the lane parts of rows r0, r1 (the 8 lanes of a qd) */
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads(); /* K/V area free for the merge */
  if (th.dw == 0 && th.g == 0) {
    sm.ml[th.kw * ROWS + r0] = make_float2(m0, l0);
    sm.ml[th.kw * ROWS + r1] = make_float2(m1, l1);
  }
  if (th.dw == 0 && th.g == 1) { /* rows 8..15 are not in the pass */
    sm.ml[th.kw * ROWS + 8 + 2 * th.qd] = make_float2(-INFINITY, 0.0f);
    sm.ml[th.kw * ROWS + 9 + 2 * th.qd] = make_float2(-INFINITY, 0.0f);
  }
  __syncthreads();
  float bm0 = -INFINITY, bm1 = -INFINITY;
#pragma unroll
  for (int k = 0; k < KW; k++) {
    bm0 = fmaxf(bm0, sm.ml[k * ROWS + r0].x);
    bm1 = fmaxf(bm1, sm.ml[k * ROWS + r1].x);
  }
  /* 0 when m0 = -inf; fp8 TOKEN: O runs relative to 2^(m + ev)
   * (F::token_p), and 2^((m - bm) + ev) (2^127 down to 2^-149) is applied as
   * two equal factors, each a normal float, one after the other */
  float f0, f1;
  if (F::TOKEN && tok) {
    f0 = exp2f(0.5f * ((m0 - (bm0 == -INFINITY ? 0.0f : bm0)) + ev0));
    f1 = exp2f(0.5f * ((m1 - (bm1 == -INFINITY ? 0.0f : bm1)) + ev1));
#pragma unroll
    for (int n = 0; n < S::NO; n++) {
      o[n][0] *= f0;
      o[n][1] *= f1;
      o[n][2] *= f0;
      o[n][3] *= f1;
    }
  } else {
    f0 = exp2f(m0 - (bm0 == -INFINITY ? 0.0f : bm0)) * v_mul;
    f1 = exp2f(m1 - (bm1 == -INFINITY ? 0.0f : bm1)) * v_mul;
  }
  F::store_o(sm.o + (th.kw * ROWS + r0) * S::OSTRIDE + th.dw * S::DPW, th.g, o, f0, f1);
  if (th.tid < ROWS) {
    float bm = -INFINITY;
#pragma unroll
    for (int k = 0; k < KW; k++) bm = fmaxf(bm, sm.ml[k * ROWS + th.tid].x);
    const float mu = bm == -INFINITY ? 0.0f : bm;
    float bl = 0.0f;
#pragma unroll
    for (int k = 0; k < KW; k++) {
      const float2 ml = sm.ml[k * ROWS + th.tid];
      bl += ml.y * exp2f(ml.x - mu);
    }
    sm.fin[th.tid] = make_float2(bm, bl);
  }
  __syncthreads();
}

/* One pass: rows row0 .. row0 + pass_rows - 1 (pass_rows <= 8) over the
 * split's keys, then the pass's outputs; F: the element format
 * (mma_format.cuh), S: the shape (mma_config.cuh), PG: the loader. Ends
 * with a block barrier. */
template <typename F, typename S, int PG>
static __device__ __forceinline__ void fd_split_mma_pass(const fd_kernel_params &p, int b, int hk,
                                                         int split, int kv, int begin, int end,
                                                         int row0, int pass_rows,
                                                         unsigned char *smem) {
  constexpr int KT = S::KT;
  const fd_mma_bufs<F, S> sm = fd_mma_carve<F, S>(smem);
  const fd_mma_thread th = fd_mma_thread_of<S>();
  const typename F::KV *k_head =
      static_cast<const typename F::KV *>(p.k_cache) + (int64_t)hk * p.k_strides[2];
  const typename F::KV *v_head =
      static_cast<const typename F::KV *>(p.v_cache) + (int64_t)hk * p.v_strides[2];
  const fd_mma_rows R = fd_mma_pass_rows<KT>(p, row0, pass_rows, kv, begin, end, th.qd);
  fd_mma_scales scl = F::scales(p, hk);

  /* O^T accumulators: one m-tile a 16-column chunk; the running max of rows
   * 2 qd, 2 qd + 1 (base 2; uniform over the lanes sharing them) and this
   * lane's part of their sums */
  float o[S::NO][4];
#pragma unroll
  for (int n = 0; n < S::NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;
  float l0 = 0.0f, l1 = 0.0f;
  /* fp8 TOKEN: O's rows run relative to 2^(m + ev) (F::token_p); unused
   * otherwise */
  float ev0 = -INFINITY, ev1 = -INFINITY;

  if (R.num_tiles > 0) { /* block-uniform */
    const uint32_t sK_u = (uint32_t)__cvta_generic_to_shared(sm.k);
    const uint32_t sV_u = (uint32_t)__cvta_generic_to_shared(sm.v);
    fd_mma_load_q<typename F::Q, S>(p, b, hk, row0, pass_rows, sm.q);
    fd_mma_pipe<fd_mma_copy<S::D, S::NW>::LOADS> pp;
    fd_mma_prologue<F, S, PG>(p, b, hk, R, scl.tok, k_head, v_head, sm, pp);
    uint32_t qa[S::KSV][2]; /* Q is the B operand (row g), once a pass */
    F::q_frags(sm.q, th.g, th.qd, qa, scl.scale);
    const fd_mma_lanes la = fd_mma_lanes_of<S::D>(th.lane, th.kw);

    int stage = 0;
    for (int it = 0; it < R.num_tiles; it++) {
      const int key0 = R.kbeg + it * KT;
      fd_mma_wait_refill<F, S, PG>(p, b, hk, R, it, scl.tok, k_head, v_head, sm, pp);
      const float *tTok = sm.tok + stage * 2 * KT; /* fp8 TOKEN: this tile's k, v scales */
      const int kl0 = th.kw * 16 + th.g;           /* tile-local key of sc[0] */
      float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      F::qk(sK_u + (uint32_t)(stage * F::SB), la, qa, sc);
      fd_mma_mask<F, S>(p, R, th.qd, kl0, key0, (pp.bad_tiles & 1u) != 0, scl.scale, scl.k_mul,
                        scl.tok, tTok, sm.valid + stage * KT, sc);
      /* fp8 TOKEN: P is made from the scores and the old maxima */
      const float s0[4] = {sc[0], sc[1], sc[2], sc[3]}, m_old0 = m0, m_old1 = m1;
      float a0, a1;
      fd_mma_softmax(sc, m0, m1, l0, l1, a0, a1);
      F::token_p(sc, s0, scl.tok, tTok, kl0, m_old0, m_old1, m0, m1, ev0, ev1, a0, a1);
      fd_mma_rescale_o<S::NO>(o, a0, a1);
      F::pv(sV_u + (uint32_t)(stage * F::SB), la, th.dw, sc, o);
      stage = stage + 1 == F::ST ? 0 : stage + 1;
      pp.bad_tiles >>= 1;
    }
  }
  fd_cp_async_wait<0>(); /* only empty groups can remain; drain them */
  fd_mma_merge_warps<F, S>(sm, th, o, m0, m1, l0, l1, scl.v_mul, scl.tok, ev0, ev1);
  fd_store_pass<typename F::Q, S::DV, S::KW, S::ROWS, S::OSTRIDE, 2, S::THREADS>(
      p, b, hk, split, row0, pass_rows, sm.o, &sm.fin[0].x, &sm.fin[0].y);
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
    int kv = fd_kv_len(p, b);
    int begin, end; /* split.h: a window skips the keys before it */
    fd_seq_split(kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed, split,
                 &begin, &end);
    if (p.num_splits > 1 && begin >= end) return; /* past the last key: the combine skips it */

    using S = fd_mma_shape<D, NW, LEAN, DV>;
    using F = typename fd_kv_format<T, S, KV8>::type;
    const int rows_total = p.group * p.q_len;
    constexpr int PR = 8; /* rows a pass: the mma's N (TILE MATH) */
    for (int row0 = 0; row0 < rows_total; row0 += PR)
      fd_split_mma_pass<F, S, PG>(p, b, hk, split, kv, begin, end, row0,
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
