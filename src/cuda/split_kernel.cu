/*
 * split_kernel.cu — the flash-decoding split kernel (CUDA cores, sm_80 and newer).
 *
 * GRID  (num_splits, num_heads_kv, batch); one block of 128 threads per
 *   (split s, kv head hk, sequence b). The block runs the online softmax over
 *   keys [begin, end) of fd_seq_split (split.h: whole chunks from w0 =
 *   fd_window_start, 0 without a sliding window),
 *   for EVERY query row of kv head hk, so each key and value is read from HBM
 *   once per block. Rows of the block: r = gi * q_len + t for query head
 *   h = hk * group + gi and query token t (head-major, the order of the
 *   partial arrays, so partial row = (b * num_heads_q + hk * group) * q_len + r).
 *   Rows are done fd_rows_per_pass (4 for float, which keeps four blocks an
 *   SM; else FD_ROWS_PER_PASS, 8) at a time; more rows take more passes
 *   over the split's K/V (the re-reads mostly hit L2).
 *
 * THREADS  A key row of head_dim elements is cut into 16-byte vectors
 *   (VEC = 16 / sizeof(T) elements). THREADS_PER_KEY = min(head_dim / VEC, 32)
 *   consecutive lanes cover one key; a lane owns NVEC = head_dim / VEC /
 *   THREADS_PER_KEY vectors (2 only for float, head_dim 256), i.e. ELEMS
 *   elements at d = (lane_in_key + THREADS_PER_KEY * v) * VEC + e. The 128
 *   threads form KEY_GROUPS = 128 / THREADS_PER_KEY key groups; in a tile of
 *   KEYS_PER_TILE keys, key group g takes keys g, g + KEY_GROUPS, ...
 *   Each thread keeps, for the rows of the pass (<= 8), its q slice (float,
 *   pre-multiplied by softmax_scale * log2(e), so exp2f gives exp) and its
 *   O slice (fp32).
 *
 * PER TILE (three barriers)
 *   1. QK: per key, the pass's partial dots over the lane's slice, then a
 *      reduce-scatter over the THREADS_PER_KEY lanes (7 shuffles reduce 8 rows
 *      over 8 lanes, one more per further doubling) leaves each row's full
 *      score in one lane, which writes it to the score tile S (-inf if masked).
 *   2. Softmax: warp w owns rows w and w + 4 (in 8-row passes); its lanes hold
 *      the row's running max m and sum l (base-2 units). It takes the tile max, rescales
 *      (alpha = 2^(m_old - m_new)), overwrites S with p = 2^(s - m_new) and
 *      adds the tile's sum to l. One (m, l) per row for the whole block, so the
 *      key groups' O slices add up without any rescaling at the end.
 *   3. PV: each thread scales its O by alpha[row] and adds p * v for its keys
 *      (p of all rows of a key: one or two 16-byte shared loads).
 *   Variants: a row sees keys [lo, hi) of fd_row_keys (device_util.cuh:
 *   causal, a sliding window, or non-causal); a pass reads keys from the
 *   first one any of its rows sees (earlier ones are zero-filled, not read);
 *   the soft-cap applies to each score before its mask. head_dim 80 and 96
 *   run in the 128 instance's rows (template D = 128, DV = head_dim), their
 *   columns past DV zero-filled without a read.
 *   A row whose running max is still -inf uses 0 in place of the max, so
 *   p = 0 and alpha = 0 (never (-inf) - (-inf)).
 *   The pass body is unrolled for NR = 8, 4, 2 or 1 rows (block-uniform choice
 *   from the pass's row count; the few phantom rows have q = 0 and every key
 *   masked), so the inner loops carry no per-row branches.
 *
 * PIPELINE  K and V tiles go global -> shared by cp.async.cg (16 bytes per
 *   copy, src-size 0 = zero-fill and no read for keys out of range or on a bad
 *   page), FD_STAGES (3) stages, KEYS_PER_TILE = min(64, tile bytes / key row
 *   bytes), tile bytes 8 KB for float up to head_dim 128 (four blocks an SM),
 *   else 16 KB: 64 keys (16-bit, head_dim <= 128), 32 (16-bit 256; float 64),
 *   16 (float 128 and 256). Split boundaries are multiples of chunk_len (64), so tiles
 *   never straddle two splits; every key is still bounds-checked.
 *   Paged caches look up block_table per key when its copy is issued; a page id
 *   outside [0, num_pages) (num_pages > 0) zero-fills and flags the key masked.
 *   All address arithmetic is 64-bit.
 *
 * SHARED MEMORY (dynamic)  K stages | V stages | S [KEYS_PER_TILE][NR] fp32 |
 *   alpha, m, l [8] | key-valid flags [stages][KEYS_PER_TILE]. 3 x 2 x 16 KB
 *   + ~2 KB = ~98 KB (two blocks an SM) for 16-bit head_dim 128/256 and float
 *   256; 3 x 2 x 8 KB + ~1 KB = ~49 KB (four blocks an SM) for float head_dim
 *   64/128 (and 16-bit head_dim 64). No row padding: every 8-lane phase of a 16-byte
 *   access touches 128 contiguous bytes of one row, which is conflict-free.
 *   After the last tile, the K/V area holds the key groups' O slices
 *   [KEY_GROUPS][NR][head_dim] fp32, summed in key-group order (deterministic).
 *
 * STEPS  A pass (fd_split_pass): fd_split_pass_keys (the keys it reads, the
 *   lane's row bounds), fd_split_load_q, the prologue's copies (fd_load_tile),
 *   then per tile: wait, barrier, refill, fd_split_scores (1), barrier,
 *   fd_split_softmax (2), barrier, fd_split_pv (3); after the last tile
 *   fd_split_publish and fd_store_pass.
 *
 * OUTPUT  (fd_store_pass, pass_output.cuh) num_splits > 1: O (unnormalised), m
 *   (natural-log units: m_log2 * ln 2)
 *   and l into the workspace partials; empty splits (begin >= end) exit at once
 *   (the combine reads only fd_seq_active_splits splits); rows that see none of an
 *   active split's keys write m = -inf, l = 0, O = 0. num_splits == 1: out = O / l
 *   in the dtype and lse = m + ln l; a row with no visible key gets out = 0,
 *   lse = -inf.
 */
#include <math.h>

#include "flashdecode.h"
#include "kernel_params.cuh"
#include "device_util.cuh"
#include "pass_output.cuh"
#include "split.h"

#define FD_SPLIT_THREADS 128
#define FD_ROWS_PER_PASS 8
#define FD_STAGES 3
/* Keys per tile, at most (= plan's chunk_len, so tiles align with splits). */
#define FD_MAX_KEYS_PER_TILE 64

/* Blocks an SM the kernel's registers are sized for: four for fp32 rows of
 * head_dim <= 128 (16 warps an SM: 4 rows a pass fit 127 registers,
 * fd_rows_per_pass; with half the warps the schedulers mostly wait on
 * shared-memory and shuffle results), else one (the shared memory allows
 * two). */
template <typename T, int D>
__host__ __device__ constexpr int fd_split_min_blocks() {
  return sizeof(T) == 4 && D <= 128 ? 4 : 1;
}

/* Rows a pass holds: 8, or 4 for float (o, its compensation and q of 8
 * rows take 168 registers at head_dim 128: three blocks an SM; 4 rows take
 * 127, four blocks, the occupancy of the kernel before the compensated sums;
 * head_dim 256 would not fit 8 rows at all). */
template <typename T, int D>
__host__ __device__ constexpr int fd_rows_per_pass() {
  return sizeof(T) == 4 ? 4 : FD_ROWS_PER_PASS;
}

/* Bytes of K (and as many of V) per stage, at most: 8 KB for float rows of
 * head_dim <= 128 (four blocks' stages fit an SM), else 16 KB. */
template <typename T, int D>
__host__ __device__ constexpr int fd_tile_bytes() {
  return sizeof(T) == 4 && D <= 128 ? 8192 : 16384;
}

template <typename T, int D>
__host__ __device__ constexpr int fd_keys_per_tile() {
  return fd_tile_bytes<T, D>() / (D * (int)sizeof(T)) < FD_MAX_KEYS_PER_TILE
             ? fd_tile_bytes<T, D>() / (D * (int)sizeof(T))
             : FD_MAX_KEYS_PER_TILE;
}

/* Dynamic shared memory of one block; the carve-up in fd_split_kernel matches. */
template <typename T, int D>
__host__ __device__ constexpr size_t fd_split_smem_bytes() {
  return 2 * (size_t)FD_STAGES * fd_keys_per_tile<T, D>() * D * sizeof(T) /* K, V stages */
         + (size_t)fd_keys_per_tile<T, D>() * FD_ROWS_PER_PASS * sizeof(float) /* S */
         + 3 * (size_t)FD_ROWS_PER_PASS * sizeof(float)               /* alpha, m, l */
         + (size_t)FD_STAGES * fd_keys_per_tile<T, D>();              /* key-valid flags */
}

/* Sums v[0..R) over the TPK lanes of a key group, scattering the rows: after
 * the call, v[0] of lane lt holds row fd_scatter_row<R>(lt) summed over all TPK
 * lanes. R <= TPK, both powers of two; every lane of the warp must call it. */
template <int R, int TPK>
static __device__ __forceinline__ float fd_reduce_scatter(float (&v)[R], int lt) {
#pragma unroll
  for (int h = R / 2, m = 1; h > 0; h >>= 1, m <<= 1) {
    const bool upper = (lt & m) != 0;
#pragma unroll
    for (int i = 0; i < h; i++) {
      const float send = upper ? v[i] : v[i + h];
      const float keep = upper ? v[i + h] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
    }
  }
#pragma unroll
  for (int m = R; m < TPK; m <<= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], m);
  return v[0];
}

/* The row fd_reduce_scatter leaves in lane lt: bit s of lt adds R >> (s + 1). */
template <int R>
static __device__ __forceinline__ int fd_scatter_row(int lt) {
  int row = 0;
#pragma unroll
  for (int s = 0, h = R / 2; h > 0; s++, h >>= 1)
    if ((lt >> s) & 1) row += h;
  return row;
}

/* Issues the cp.async copies of one K/V tile: keys key0 .. key0 + nkeys - 1
 * of sequence b (nkeys <= KT); the rest of the tile is zero-filled.
 * k_base/v_base already include the kv head's offset. sK/sV/valid: this stage. */
template <typename T, int D, int DV>
static __device__ __forceinline__ void fd_load_tile(const fd_kernel_params &p, const T *k_base,
                                                    const T *v_base, T *sK, T *sV,
                                                    unsigned char *valid, int b, int key0,
                                                    int klo, int nkeys) {
  constexpr int VEC = 16 / (int)sizeof(T);
  constexpr int VECS = D / VEC;
  constexpr int KT = fd_keys_per_tile<T, D>();
  constexpr int LOADS = KT * VECS / FD_SPLIT_THREADS;
  const int piece = threadIdx.x % VECS; /* the same for every copy of this thread */
  const bool col_ok = DV == D || piece * VEC < DV; /* padded columns: zeros, no read */
#pragma unroll
  for (int n = 0; n < LOADS; n++) {
    const int kl = (int)(threadIdx.x + n * FD_SPLIT_THREADS) / VECS;
    bool ok = kl < nkeys && kl >= klo;
    int64_t k_off = 0, v_off = 0;
    if (ok) {
      const int j = key0 + kl;
      int64_t outer, pos;
      if (p.page_size > 0) {
        const int page_idx = j / p.page_size;
        const int32_t page = __ldg(p.block_table + (int64_t)b * p.block_table_stride + page_idx);
        ok = p.num_pages <= 0 || (page >= 0 && page < p.num_pages);
        outer = page;
        pos = j - page_idx * p.page_size;
      } else {
        outer = b;
        pos = j;
      }
      k_off = outer * p.k_strides[0] + pos * p.k_strides[1] + piece * VEC;
      v_off = outer * p.v_strides[0] + pos * p.v_strides[1] + piece * VEC;
    }
    if (piece == 0) valid[kl] = ok ? 1 : 0;
    ok = ok && col_ok;
    fd_cp_async16(sK + kl * D + piece * VEC, k_base + (ok ? k_off : 0), ok);
    fd_cp_async16(sV + kl * D + piece * VEC, v_base + (ok ? v_off : 0), ok);
  }
}

/* Where a block works: the same for all its passes. */
typedef struct fd_block_pos {
  int b;          /* sequence */
  int hk;         /* kv head */
  int split;      /* split index */
  int kv;         /* kv_len[b], clamped to [0, kv_capacity] */
  int begin, end; /* the split's keys [begin, end) */
} fd_block_pos;

/* Loads row values [0, NR) of one key from the score tile (16/8/4-byte loads). */
template <int NR>
static __device__ __forceinline__ void fd_load_rows(const float *src, float (&dst)[NR]) {
  if constexpr (NR % 4 == 0) {
#pragma unroll
    for (int i = 0; i < NR / 4; i++) {
      const float4 x = reinterpret_cast<const float4 *>(src)[i];
      dst[4 * i] = x.x;
      dst[4 * i + 1] = x.y;
      dst[4 * i + 2] = x.z;
      dst[4 * i + 3] = x.w;
    }
  } else if constexpr (NR == 2) {
    const float2 x = *reinterpret_cast<const float2 *>(src);
    dst[0] = x.x;
    dst[1] = x.y;
  } else {
    dst[0] = src[0];
  }
}

/* The compile-time shape of a pass of NR rows (8, 4, 2 or 1) for element
 * T and shared-memory row width D (THREADS above). */
template <typename T, int D, int NR>
struct fd_split_shape {
  static constexpr int VEC = 16 / (int)sizeof(T);       /* elements per 16-byte vector */
  static constexpr int VECS = D / VEC;                  /* vectors per key row */
  static constexpr int TPK = VECS < 32 ? VECS : 32;     /* THREADS_PER_KEY */
  static constexpr int NVEC = VECS / TPK;               /* vectors per thread */
  static constexpr int ELEMS = NVEC * VEC;              /* elements per thread */
  static constexpr int KG = FD_SPLIT_THREADS / TPK;     /* KEY_GROUPS */
  static constexpr int KT = fd_keys_per_tile<T, D>();   /* KEYS_PER_TILE */
  static constexpr int KPG = KT / KG;                   /* keys per key group per tile */
  static constexpr int NWARPS = FD_SPLIT_THREADS / 32;
  static constexpr int RPW = (NR + NWARPS - 1) / NWARPS; /* softmax rows per warp */
  static constexpr int SPL = (KT + 31) / 32;            /* scores per lane in the softmax */
  static constexpr int STAGES = FD_STAGES;
  static constexpr int RMAX = FD_ROWS_PER_PASS;
  static_assert(VECS % TPK == 0 && FD_SPLIT_THREADS % TPK == 0, "thread mapping");
  static_assert(KT % KG == 0 && (KT * VECS) % FD_SPLIT_THREADS == 0, "tile mapping");
  static_assert(FD_MAX_KEYS_PER_TILE % KT == 0, "tiles must align with 64-key chunks");
  static_assert(NR <= RMAX && NR <= TPK && (NR & (NR - 1)) == 0, "row mapping");
  static_assert((size_t)KG * NR * D * sizeof(float) <= 2 * (size_t)STAGES * KT * D * sizeof(T),
                "O merge buffer must fit in the K/V stages");
};

/* Shared memory of a pass; fd_split_smem_bytes sizes it. */
template <typename T>
struct fd_split_bufs {
  T *k, *v;             /* [STAGES][KT][D] each */
  float *s;             /* [KT][NR] scores, then p */
  float *alpha, *m, *l; /* [NR] each: the tile's rescale, running max (base 2) and sum */
  unsigned char *valid; /* [STAGES][KT] key-valid flags */
  float *red;           /* [KG][NR][D], after the last tile */
};

template <typename T, int D, int KT>
static __device__ __forceinline__ fd_split_bufs<T> fd_split_carve(unsigned char *smem) {
  constexpr int RMAX = FD_ROWS_PER_PASS;
  fd_split_bufs<T> sm;
  sm.k = reinterpret_cast<T *>(smem);
  sm.v = sm.k + FD_STAGES * KT * D;
  sm.s = reinterpret_cast<float *>(sm.v + FD_STAGES * KT * D);
  sm.alpha = sm.s + KT * RMAX;
  sm.m = sm.alpha + RMAX;
  sm.l = sm.m + RMAX;
  sm.valid = reinterpret_cast<unsigned char *>(sm.l + RMAX);
  sm.red = reinterpret_cast<float *>(smem);
  return sm;
}

/* The keys of a pass: row (row0 + r) is token t = (row0 + r) % q_len and
 * sees keys [lo, hi) (fd_row_keys: causal, windowed or not, or
 * non-causal). [pass_lo, pass_end): the keys some row of the pass sees (no
 * other key is read); tiles start at kbeg, the 64-key boundary at or below
 * pass_lo. my_row: the row whose scores this lane writes; it sees
 * [my_lo, my_limit). */
typedef struct fd_split_keys {
  int pass_lo, pass_end, kbeg, my_row, my_lo, my_limit, num_tiles;
} fd_split_keys;

template <int NR, int TPK, int KT>
static __device__ __forceinline__ fd_split_keys fd_split_pass_keys(const fd_kernel_params &p,
                                                                   const fd_block_pos &bp,
                                                                   int row0, int pass_rows,
                                                                   int lt) {
  const int q_len = p.q_len, kv = bp.kv, begin = bp.begin, end = bp.end;
  fd_split_keys K;
  K.pass_lo = end;
  K.pass_end = begin;
#pragma unroll
  for (int r = 0; r < NR; r++) {
    if (r < pass_rows) {
      int lo, hi;
      fd_row_keys((row0 + r) % q_len, q_len, kv, p.window_left, p.non_causal, begin, end, &lo, &hi);
      if (hi > lo) {
        K.pass_lo = min(K.pass_lo, lo);
        K.pass_end = max(K.pass_end, hi);
      }
    }
  }
  if (K.pass_lo > K.pass_end) K.pass_lo = K.pass_end;
  K.kbeg = begin + (K.pass_lo - begin) / FD_MAX_KEYS_PER_TILE * FD_MAX_KEYS_PER_TILE;
  K.my_row = fd_scatter_row<NR>(lt);
  K.my_lo = begin; /* phantom rows see nothing */
  K.my_limit = begin;
  if (K.my_row < pass_rows)
    fd_row_keys((row0 + K.my_row) % q_len, q_len, kv, p.window_left, p.non_causal, begin, end,
                &K.my_lo, &K.my_limit);
  const int span = K.pass_end - K.kbeg;
  K.num_tiles = span / KT + (span % KT != 0);
  return K;
}

/* q slices of the pass's rows, scaled into base-2 units; zero for phantom
 * rows and padded columns. */
template <typename T, int D, int NR, int DV>
static __device__ __forceinline__ void fd_split_load_q(
    const fd_kernel_params &p, int b, int hk, int row0, int pass_rows, int lt,
    float (&qf)[NR][fd_split_shape<T, D, NR>::ELEMS]) {
  using S = fd_split_shape<T, D, NR>;
  constexpr int VEC = S::VEC, TPK = S::TPK, NVEC = S::NVEC, ELEMS = S::ELEMS;
  const int q_len = p.q_len;
#pragma unroll
  for (int r = 0; r < NR; r++) {
    if (r < pass_rows) {
      const int row = row0 + r;
      const int gi = row / q_len;
      const int t = row - gi * q_len;
      const int64_t h = (int64_t)hk * p.group + gi;
      const T *qp = static_cast<const T *>(p.q) + (int64_t)b * p.q_strides[0] +
                    (int64_t)t * p.q_strides[1] + h * p.q_strides[2];
#pragma unroll
      for (int v = 0; v < NVEC; v++) {
        if (DV == D || (lt + TPK * v) * VEC < DV) {
          fd_load16_to_float(qp + (lt + TPK * v) * VEC, &qf[r][v * VEC]);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; e++) qf[r][v * VEC + e] = 0.0f; /* padded columns */
        }
      }
#pragma unroll
      for (int e = 0; e < ELEMS; e++) qf[r][e] *= p.scale_log2;
    } else {
#pragma unroll
      for (int e = 0; e < ELEMS; e++) qf[r][e] = 0.0f;
    }
  }
}

/* Step 1, QK: scores of this key group's keys of the tile for all rows -> S
 * (-inf where masked; soft-capped first when asked). */
template <typename T, int D, int NR>
static __device__ __forceinline__ void fd_split_scores(
    const fd_kernel_params &p, const fd_split_keys &K, const T *tK, const unsigned char *tValid,
    float *sS, int key0, int kg, int lt, bool capped,
    const float (&qf)[NR][fd_split_shape<T, D, NR>::ELEMS]) {
  using S = fd_split_shape<T, D, NR>;
  constexpr int VEC = S::VEC, TPK = S::TPK, NVEC = S::NVEC, ELEMS = S::ELEMS, KG = S::KG;
#pragma unroll
  for (int n = 0; n < S::KPG; n++) {
    const int kl = kg + KG * n;
    float kf[ELEMS];
#pragma unroll
    for (int v = 0; v < NVEC; v++) fd_load16_to_float(tK + kl * D + (lt + TPK * v) * VEC, &kf[v * VEC]);
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < ELEMS; e++)
#pragma unroll
      for (int r = 0; r < NR; r++) acc[r] = fmaf(qf[r][e], kf[e], acc[r]);
    float score = fd_reduce_scatter<NR, TPK>(acc, lt);
    if (lt < NR) {
      const bool visible = kl < K.my_limit - key0 && kl >= K.my_lo - key0 && tValid[kl];
      if (capped) score = fd_soft_cap(score, p.cap_in, p.cap_out);
      sS[kl * NR + K.my_row] = visible ? score : -INFINITY;
    }
  }
}

/* Step 2, online softmax over the tile, one warp a row (phantom rows too:
 * all their scores are -inf, so they get p = 0 and alpha = 0): S becomes p,
 * alpha goes to sAlpha; l is a compensated sum (lc). */
template <int NR, int KT, int RPW>
static __device__ __forceinline__ void fd_split_softmax(float *sS, float *sAlpha, int warp,
                                                        int lane, float (&m_run)[RPW],
                                                        float (&l_run)[RPW], float (&lc)[RPW]) {
  constexpr int NWARPS = FD_SPLIT_THREADS / 32;
  constexpr int SPL = (KT + 31) / 32;
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    const int r = warp + NWARPS * i;
    if (r < NR) {
      float s[SPL];
      float tile_max = -INFINITY;
#pragma unroll
      for (int k = 0; k < SPL; k++) {
        const int c = lane + 32 * k;
        s[k] = c < KT ? sS[c * NR + r] : -INFINITY;
        tile_max = fmaxf(tile_max, s[k]);
      }
      tile_max = fd_warp_max(tile_max);
      const float m_new = fmaxf(m_run[i], tile_max);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* no (-inf) - (-inf) */
      const float alpha = exp2f(m_run[i] - m_use);
      float psum = 0.0f;
#pragma unroll
      for (int k = 0; k < SPL; k++) {
        const int c = lane + 32 * k;
        if (c < KT) {
          const float pk = exp2f(s[k] - m_use);
          sS[c * NR + r] = pk;
          psum += pk;
        }
      }
      psum = fd_warp_sum(psum);
      {
        const float base = l_run[i] * alpha, y = psum - lc[i] * alpha;
        const float sum = base + y;
        lc[i] = (sum - base) - y;
        l_run[i] = sum;
      }
      m_run[i] = m_new;
      if (lane == 0) sAlpha[r] = alpha;
    }
  }
}

/* Step 3, PV: rescale O, add p * v for this key group's keys into oc, then
 * fold the tile into the running sum (Fast2Sum: oc keeps what rounding
 * dropped). */
template <typename T, int D, int NR>
static __device__ __forceinline__ void fd_split_pv(
    const T *tV, const float *sS, const float *sAlpha, int kg, int lt,
    float (&o)[NR][fd_split_shape<T, D, NR>::ELEMS],
    float (&oc)[NR][fd_split_shape<T, D, NR>::ELEMS]) {
  using S = fd_split_shape<T, D, NR>;
  constexpr int VEC = S::VEC, TPK = S::TPK, NVEC = S::NVEC, ELEMS = S::ELEMS, KG = S::KG;
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const float a = sAlpha[r];
#pragma unroll
    for (int e = 0; e < ELEMS; e++) {
      o[r][e] *= a;
      oc[r][e] *= a;
    }
  }
#pragma unroll
  for (int n = 0; n < S::KPG; n++) {
    const int kl = kg + KG * n;
    float vf[ELEMS];
#pragma unroll
    for (int v = 0; v < NVEC; v++) fd_load16_to_float(tV + kl * D + (lt + TPK * v) * VEC, &vf[v * VEC]);
    float pr[NR];
    fd_load_rows<NR>(sS + kl * NR, pr);
#pragma unroll
    for (int e = 0; e < ELEMS; e++)
#pragma unroll
      for (int r = 0; r < NR; r++) oc[r][e] = fmaf(pr[r], vf[e], oc[r][e]); /* the tile's p v */
  }
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int e = 0; e < ELEMS; e++) {
      const float sum = o[r][e] + oc[r][e];
      oc[r][e] -= sum - o[r][e];
      o[r][e] = sum;
    }
}

/* After the last tile: publish (m, l) and the key groups' O slices to sRed
 * (the K/V area), for fd_store_pass to sum in key-group order. */
template <typename T, int D, int NR>
static __device__ __forceinline__ void fd_split_publish(
    const fd_split_bufs<T> &sm, int warp, int lane, int kg, int lt,
    const float (&m_run)[fd_split_shape<T, D, NR>::RPW],
    const float (&l_run)[fd_split_shape<T, D, NR>::RPW],
    const float (&o)[NR][fd_split_shape<T, D, NR>::ELEMS]) {
  using S = fd_split_shape<T, D, NR>;
  constexpr int VEC = S::VEC, TPK = S::TPK, NVEC = S::NVEC;
#pragma unroll
  for (int i = 0; i < S::RPW; i++) {
    const int r = warp + S::NWARPS * i;
    if (lane == 0 && r < NR) {
      sm.m[r] = m_run[i];
      sm.l[r] = l_run[i];
    }
  }
#pragma unroll
  for (int r = 0; r < NR; r++) {
#pragma unroll
    for (int v = 0; v < NVEC; v++) {
      float *dst = sm.red + (kg * NR + r) * D + (lt + TPK * v) * VEC;
#pragma unroll
      for (int e = 0; e < VEC; e += 4)
        *reinterpret_cast<float4 *>(dst + e) =
            make_float4(o[r][v * VEC + e], o[r][v * VEC + e + 1], o[r][v * VEC + e + 2],
                        o[r][v * VEC + e + 3]);
    }
  }
}

/* One pass: rows row0 .. row0 + pass_rows - 1 (pass_rows <= NR) over the
 * split's keys, then the pass's outputs. NR (8, 4, 2 or 1) is the row count the
 * loops are unrolled for; rows pass_rows .. NR-1 are phantoms (q = 0, every key
 * masked, never written out). Ends with a block barrier. */
template <typename T, int D, int NR, int DV>
static __device__ __forceinline__ void fd_split_pass(const fd_kernel_params &p,
                                                     const fd_block_pos &bp, int row0,
                                                     int pass_rows, unsigned char *smem) {
  using S = fd_split_shape<T, D, NR>;
  constexpr int KT = S::KT, STAGES = S::STAGES, ELEMS = S::ELEMS, RPW = S::RPW;
  const fd_split_bufs<T> sm = fd_split_carve<T, D, KT>(smem);
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int kg = tid / S::TPK; /* key group */
  const int lt = tid % S::TPK; /* lane within the key group */
  const int b = bp.b, hk = bp.hk;
  const T *k_base = static_cast<const T *>(p.k_cache) + (int64_t)hk * p.k_strides[2];
  const T *v_base = static_cast<const T *>(p.v_cache) + (int64_t)hk * p.v_strides[2];
  const fd_split_keys K = fd_split_pass_keys<NR, S::TPK, KT>(p, bp, row0, pass_rows, lt);
  const bool capped = p.cap_out != 0.0f; /* soft-cap (uniform) */

  float qf[NR][ELEMS];
  fd_split_load_q<T, D, NR, DV>(p, b, hk, row0, pass_rows, lt, qf);
  /* O and l are two-level compensated sums, so their error does not grow
   * with the number of keys (4M identical keys: within 2e-6 of max|V|).
   * O: oc collects the tile's p v (KPG fused multiply-adds a key, as a plain
   * sum) on top of what the running sum o lost before; at the end of each
   * tile it is folded into o by Fast2Sum (o is the larger term once a few
   * tiles are in), leaving in oc the part of the fold that rounding dropped.
   * Per key and element one FMA, per tile five operations (a Kahan update
   * per key costs four a key and ran the fp32 rows ~2x slower). l: the
   * tile's p summed over the warp, added once a tile with Kahan's
   * compensation lc. */
  float o[NR][ELEMS], oc[NR][ELEMS];
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int e = 0; e < ELEMS; e++) o[r][e] = oc[r][e] = 0.0f;
  float m_run[RPW], l_run[RPW], lc[RPW]; /* rows warp + NWARPS * i; the same in every lane */
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    m_run[i] = -INFINITY;
    l_run[i] = lc[i] = 0.0f;
  }

  /* Prologue: tiles 0 .. STAGES-2 in flight (one commit group per tile, empty or not). */
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < K.num_tiles) {
      const int key0 = K.kbeg + s * KT;
      fd_load_tile<T, D, DV>(p, k_base, v_base, sm.k + s * KT * D, sm.v + s * KT * D,
                             sm.valid + s * KT, b, key0, K.pass_lo - key0,
                             min(KT, K.pass_end - key0));
    }
    fd_cp_async_commit();
  }

  for (int it = 0; it < K.num_tiles; it++) {
    const int stage = it % STAGES;
    const int key0 = K.kbeg + it * KT;
    fd_cp_async_wait<STAGES - 2>(); /* this thread's copies of tile `it` landed */
    __syncthreads();                 /* everyone's did; tile it-1 fully consumed */
    {
      const int nt = it + STAGES - 1; /* refill the stage tile it-1 used */
      if (nt < K.num_tiles) {
        const int ns = nt % STAGES;
        const int nkey0 = K.kbeg + nt * KT;
        fd_load_tile<T, D, DV>(p, k_base, v_base, sm.k + ns * KT * D, sm.v + ns * KT * D,
                               sm.valid + ns * KT, b, nkey0, K.pass_lo - nkey0,
                               min(KT, K.pass_end - nkey0));
      }
      fd_cp_async_commit();
    }
    fd_split_scores<T, D, NR>(p, K, sm.k + stage * KT * D, sm.valid + stage * KT, sm.s, key0, kg,
                              lt, capped, qf);
    __syncthreads();
    fd_split_softmax<NR, KT, RPW>(sm.s, sm.alpha, warp, lane, m_run, l_run, lc);
    __syncthreads();
    fd_split_pv<T, D, NR>(sm.v + stage * KT * D, sm.s, sm.alpha, kg, lt, o, oc);
  }
  /* the compensated sums' values */
#pragma unroll
  for (int r = 0; r < NR; r++)
#pragma unroll
    for (int e = 0; e < ELEMS; e++) o[r][e] += oc[r][e];
#pragma unroll
  for (int i = 0; i < RPW; i++) l_run[i] -= lc[i];
  fd_cp_async_wait<0>(); /* only empty groups can remain; drain them */
  __syncthreads();      /* K/V area free for the merge */
  fd_split_publish<T, D, NR>(sm, warp, lane, kg, lt, m_run, l_run, o);
  __syncthreads();
  fd_store_pass<T, DV, S::KG, NR, D, 1, FD_SPLIT_THREADS>(p, b, hk, bp.split, row0, pass_rows,
                                                          sm.red, sm.m, sm.l);
  __syncthreads(); /* sRed / sM / sL / the K/V stages are reused by the next pass */
}

template <typename T, int D, int DV>
__global__ void __launch_bounds__(FD_SPLIT_THREADS, fd_split_min_blocks<T, D>())
    fd_split_kernel(const __grid_constant__ fd_kernel_params p) {
  extern __shared__ __align__(16) unsigned char fd_smem[];

  fd_block_pos bp;
  bp.split = blockIdx.x;
  bp.hk = blockIdx.y;
  bp.b = blockIdx.z;
  bp.kv = fd_kv_len(p, bp.b);
  fd_seq_split(bp.kv, p.q_len, p.window_left, p.chunk_len, p.num_splits, p.split_len_fixed,
               bp.split, &bp.begin, &bp.end);
  if (p.num_splits > 1 && bp.begin >= bp.end) return; /* past the last key: the combine skips it */

  /* Block-uniform dispatch on the pass's row count, so the inner loops have no
   * per-row branches (full instruction-level parallelism across rows). */
  const int rows_total = p.group * p.q_len;
  for (int row0 = 0; row0 < rows_total; row0 += fd_rows_per_pass<T, D>()) {
    const int pass_rows = min(fd_rows_per_pass<T, D>(), rows_total - row0);
    if (fd_rows_per_pass<T, D>() == 8 && pass_rows > 4)
      fd_split_pass<T, D, fd_rows_per_pass<T, D>(), DV>(p, bp, row0, pass_rows, fd_smem);
    else if (pass_rows > 2)
      fd_split_pass<T, D, 4, DV>(p, bp, row0, pass_rows, fd_smem);
    else if (pass_rows > 1)
      fd_split_pass<T, D, 2, DV>(p, bp, row0, pass_rows, fd_smem);
    else
      fd_split_pass<T, D, 1, DV>(p, bp, row0, pass_rows, fd_smem);
  }
}

template <typename T, int D, int DV>
static cudaError_t fd_split_prepare(void) {
  constexpr size_t smem = fd_split_smem_bytes<T, D>();
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        fd_split_kernel<T, D, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
  /* All of the unified L1/shared array as shared memory (2 or 4 blocks). */
  return cudaFuncSetAttribute(fd_split_kernel<T, D, DV>,
                              cudaFuncAttributePreferredSharedMemoryCarveout,
                              (int)cudaSharedmemCarveoutMaxShared);
}

template <typename T, int D, int DV>
static cudaError_t fd_split_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  constexpr size_t smem = fd_split_smem_bytes<T, D>();
  const cudaError_t e = fd_split_prepare<T, D, DV>();
  if (e != cudaSuccess) return e;
  const dim3 grid((unsigned)p->num_splits, (unsigned)p->num_heads_kv, (unsigned)p->batch);
  fd_split_kernel<T, D, DV><<<grid, FD_SPLIT_THREADS, smem, stream>>>(*p);
  return cudaGetLastError();
}

/* D: the shared-memory row width; DV: head_dim (80 and 96 in rows of 128). */
template <typename T>
static cudaError_t fd_split_launch_dim(const fd_kernel_params *p, cudaStream_t stream) {
  switch (p->head_dim) {
    case 64: return fd_split_launch_instance<T, 64, 64>(p, stream);
    case 80: return fd_split_launch_instance<T, 128, 80>(p, stream);
    case 96: return fd_split_launch_instance<T, 128, 96>(p, stream);
    case 128: return fd_split_launch_instance<T, 128, 128>(p, stream);
    case 256: return fd_split_launch_instance<T, 256, 256>(p, stream);
  }
  return cudaErrorInvalidValue;
}

/* fp32 only: fp16/bf16 run the tensor-core kernel (split_mma_kernel.cu), so
 * this kernel is not instantiated for them (build time). */
cudaError_t fd_split_launch(const fd_kernel_params *p, cudaStream_t stream) {
  if (p->dtype == FD_DTYPE_F32) return fd_split_launch_dim<float>(p, stream);
  return cudaErrorInvalidValue;
}

size_t fd_split_smem(int head_dim) {
  switch (head_dim) {
    case 64: return fd_split_smem_bytes<float, 64>();
    case 80:
    case 96:
    case 128: return fd_split_smem_bytes<float, 128>();
    case 256: return fd_split_smem_bytes<float, 256>();
  }
  return 0;
}

template <int D, int DV>
static cudaError_t fd_split_occupancy_f32(int *blocks_per_sm) {
  const cudaError_t e = fd_split_prepare<float, D, DV>();
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, fd_split_kernel<float, D, DV>,
                                                       FD_SPLIT_THREADS,
                                                       fd_split_smem_bytes<float, D>());
}

cudaError_t fd_split_occupancy(int head_dim, int *blocks_per_sm) {
  *blocks_per_sm = 0;
  switch (head_dim) {
    case 64: return fd_split_occupancy_f32<64, 64>(blocks_per_sm);
    case 80: return fd_split_occupancy_f32<128, 80>(blocks_per_sm);
    case 96: return fd_split_occupancy_f32<128, 96>(blocks_per_sm);
    case 128: return fd_split_occupancy_f32<128, 128>(blocks_per_sm);
    case 256: return fd_split_occupancy_f32<256, 256>(blocks_per_sm);
  }
  return cudaErrorInvalidValue;
}
