/*
 * cpu_kernel_body.h — the CPU kernel (contract in cpu_kernels.h), written
 * once over a vector-primitive layer. A per-instruction-set file includes
 * its primitives (cpu_simd_avx2.h: 8 floats a vector; cpu_simd_avx512.h: 16)
 * and then this file, which defines the kernels and
 * fill_kernels(dtype, k), the getter's body. The primitive layer supplies:
 *
 *   FD_V_W         floats a vector (vf); vmask selects lanes, vi integers
 *   FD_VFN         the storage class of inline helpers (with the target
 *                  attribute); FD_VKERNEL that of the kernels
 *   FD_V_VALUE_DT  most vectors of columns in one values tile row
 *   FD_V_PREFETCH  1: prefetch key and value rows (v_prefetch_row)
 *   FD_V_PAIRED    1: bf16 with head_dim % 32 == 0 runs in the paired
 *                  column order (needs FD_V_W 16, v_loadi, v_bf16_even/odd,
 *                  v_split_pairs)
 *   FD_V_DPBF16    1: and its scores by vdpbf16ps where q is bf16
 *                  (v_bf16_pack, v_not_bf16, v_dot_bf16, v_storei)
 *   v_* arithmetic, loads that widen a dtype (v_load, v_load_part), masked
 *   float loads/stores, reductions (v_reduce: W vectors to one, v_hmax,
 *   v_hsum, v_all_max, v_all_sum), v_exp; for head_dim <= 8 the 8-float row
 *   type hf with h_* and v_keys_t (W keys transposed into lanes).
 *
 * Scores: register tiles of RT rows x KT keys (RT * KT = W accumulators:
 * 4 x W/4, 2 x W/2, 1 x W for the last rows) over head_dim, summed by one
 * W-to-1 tree. Online softmax: a key block is 32 / W vectors, a polynomial
 * exp. Values: register tiles of up to 4 rows x FD_V_VALUE_DT vectors of
 * columns, each value vector loaded and widened once for the tile's rows,
 * key sets so that at least 8 FMA chains are in flight. head_dim <= 8 has its
 * own steps (the small_* of cpu_kernels.h; see that section below).
 */
#ifndef FD_CPU_KERNEL_BODY_H
#define FD_CPU_KERNEL_BODY_H

#if FD_CPU_KEY_BLOCK % 16 != 0
#error "the softmax below holds a key block in whole vectors"
#endif
#if FD_V_PAIRED && FD_V_W != 16
#error "the paired order (cpu_kernels.h) is 32 columns: two 16-float vectors"
#endif

/* Independent key sets for a tile of A accumulators: at least 8 FMA chains
 * in flight (an FMA's latency is 4 cycles, two issue per cycle). */
#define FD_KEY_SETS(A) ((A) >= 8 ? 1 : (A) >= 4 ? 2 : 4)
/* Value rows are prefetched this many keys ahead (FD_V_PREFETCH). */
#define FD_VALUE_PREFETCH 8

/* Key j of the block (padded to a multiple of 32 keys: see cpu_kernels.h). */
FD_VFN const char *key_at(const fd_cpu_block *b, int j) {
  return (const char *)b->keys[j] + b->key_off;
}

static inline int elem_bytes(fd_dtype dtype) { return dtype == FD_DTYPE_F32 ? 4 : 2; }

/* ---- scores ---------------------------------------------------------------- */

/* Scores of rows [r0, r0 + RT) for every key of the block, KT = W / RT keys
 * at a time, into scratch; head_dim tails through masked loads. */
FD_VFN void scores_tile(const fd_cpu_block *b, int r0, const int RT, fd_dtype dtype) {
  const int KT = FD_V_W / RT;
  const int head_dim = b->head_dim, nk = b->num_keys, full = head_dim & ~(FD_V_W - 1);
  const int tail = head_dim - full;
  const vmask tmask = v_mask_first(tail);
  const float *qp[4];
  for (int r = 0; r < RT; r++) qp[r] = b->q + (ptrdiff_t)(r0 + r) * head_dim;
  for (int j0 = 0; j0 < nk; j0 += KT) {
    const char *kp[FD_V_W];
    for (int i = 0; i < KT; i++) /* past the last key: repeat it, discard the score */
      kp[i] = key_at(b, j0 + i < nk ? j0 + i : nk - 1);
    if (FD_V_PREFETCH)
      for (int i = 0; i < KT && j0 + KT + i < nk; i++)
        v_prefetch_row(key_at(b, j0 + KT + i), head_dim * elem_bytes(dtype));
    if (r0 == 0) /* b->next, a part per KT keys of the first tile */
      fd_cpu_prefetch_next(b, j0 / KT, (nk + KT - 1) / KT);
    vf acc[FD_V_W];
    for (int i = 0; i < FD_V_W; i++) acc[i] = v_zero();
    for (int d = 0; d < full; d += FD_V_W) {
      if (RT == 1) {
        const vf qv = v_loadf(qp[0] + d);
        for (int i = 0; i < KT; i++) acc[i] = v_fma(qv, v_load(kp[i], d, dtype), acc[i]);
      } else {
        vf kv[FD_V_W];
        for (int i = 0; i < KT; i++) kv[i] = v_load(kp[i], d, dtype);
        for (int r = 0; r < RT; r++) {
          const vf qv = v_loadf(qp[r] + d);
          for (int i = 0; i < KT; i++) acc[r * KT + i] = v_fma(qv, kv[i], acc[r * KT + i]);
        }
      }
    }
    if (tail) {
      vf kv[FD_V_W];
      for (int i = 0; i < KT; i++) kv[i] = v_load_part(kp[i], full, tmask, tail, dtype);
      for (int r = 0; r < RT; r++) {
        const vf qv = v_loadf_mask(tmask, qp[r] + full);
        for (int i = 0; i < KT; i++) acc[r * KT + i] = v_fma(qv, kv[i], acc[r * KT + i]);
      }
    }
    /* lane r * KT + i: row r, key j0 + i */
    const vf sums = v_mul(v_reduce(acc), v_set1(b->scale));
    const int valid = nk - j0 < KT ? nk - j0 : KT;
    for (int r = 0; r < RT; r++)
      v_store_lanes(b->scratch + (ptrdiff_t)(r0 + r) * FD_CPU_KEY_BLOCK + j0 - r * KT, r * KT, valid,
                    sums);
  }
}

#if FD_V_PAIRED
/* bf16 scores, head_dim % 32 == 0, in the paired order: q rows go into
 * [16 even columns][16 odd columns] per 32 (a local copy), each 64-byte load
 * of a key widens with one shift (even columns) and one and (odd ones), and
 * the dot product sums both halves. Tiles as scores_tile. */
FD_VFN void scores_tile_pairs(const fd_cpu_block *b, int r0, const int RT) {
  const int KT = FD_V_W / RT;
  const int head_dim = b->head_dim, nk = b->num_keys;
  float qp[4][FD_MAX_ROW_DIM] __attribute__((aligned(64))); /* rows in the paired order */
  for (int r = 0; r < RT; r++) {
    const float *qr = b->q + (ptrdiff_t)(r0 + r) * head_dim;
    for (int c = 0; c < head_dim; c += 32) {
      vf even, odd;
      v_split_pairs(v_loadf(qr + c), v_loadf(qr + c + 16), &even, &odd);
      v_storef(qp[r] + c, even);
      v_storef(qp[r] + c + 16, odd);
    }
  }
  for (int j0 = 0; j0 < nk; j0 += KT) {
    const char *kp[FD_V_W];
    for (int i = 0; i < KT; i++) /* past the last key: repeat it, discard the score */
      kp[i] = key_at(b, j0 + i < nk ? j0 + i : nk - 1);
    for (int i = 0; i < KT && j0 + KT + i < nk; i++) v_prefetch_row(key_at(b, j0 + KT + i), 2 * head_dim);
    vf acc[FD_V_W];
    for (int i = 0; i < FD_V_W; i++) acc[i] = v_zero();
    for (int d = 0; d < head_dim; d += 32) {
      if (RT == 1) {
        const vf qe = v_loadf(qp[0] + d), qo = v_loadf(qp[0] + d + 16);
        for (int i = 0; i < KT; i++) {
          const vi x = v_loadi(kp[i] + 2 * d);
          acc[i] = v_fma(qe, v_bf16_even(x), acc[i]);
          acc[i] = v_fma(qo, v_bf16_odd(x), acc[i]);
        }
      } else {
        vf ke[FD_V_W], ko[FD_V_W];
        for (int i = 0; i < KT; i++) {
          const vi x = v_loadi(kp[i] + 2 * d);
          ke[i] = v_bf16_even(x);
          ko[i] = v_bf16_odd(x);
        }
        for (int r = 0; r < RT; r++) {
          const vf qe = v_loadf(qp[r] + d), qo = v_loadf(qp[r] + d + 16);
          for (int i = 0; i < KT; i++) {
            acc[r * KT + i] = v_fma(qe, ke[i], acc[r * KT + i]);
            acc[r * KT + i] = v_fma(qo, ko[i], acc[r * KT + i]);
          }
        }
      }
    }
    const vf sums = v_mul(v_reduce(acc), v_set1(b->scale));
    const int valid = nk - j0 < KT ? nk - j0 : KT;
    for (int r = 0; r < RT; r++)
      v_store_lanes(b->scratch + (ptrdiff_t)(r0 + r) * FD_CPU_KEY_BLOCK + j0 - r * KT, r * KT, valid,
                    sums);
  }
}

#if FD_V_DPBF16
/* bf16 scores by vdpbf16ps (AVX-512 BF16), head_dim % 32 == 0: one
 * instruction multiplies 16 column pairs of q and a key as stored (no
 * widening) and adds them to float32 lanes; q is packed to bf16 once per
 * tile. That is exact only when q's rows are bf16 values (a bf16 plan's q,
 * not an fp16 q over an fp8 cache widened to bf16): returns 0, computing
 * nothing, for a tile whose rows are not, and scores_tile_pairs takes it.
 * Products of bf16 subnormals count as 0 (vdpbf16ps ignores MXCSR; below
 * 2^-126 the terms are far under the tolerance of a float32 score). Tiles
 * as scores_tile. */
FD_VFN int scores_tile_dp(const fd_cpu_block *b, int r0, const int RT) {
  const int KT = FD_V_W / RT;
  const int head_dim = b->head_dim, nk = b->num_keys;
  uint32_t qp[4][FD_MAX_ROW_DIM / 2] __attribute__((aligned(64))); /* rows as bf16 column pairs */
  int inexact = 0;
  for (int r = 0; r < RT; r++) {
    const float *qr = b->q + (ptrdiff_t)(r0 + r) * head_dim;
    for (int c = 0; c < head_dim; c += 32) {
      const vf lo = v_loadf(qr + c), hi = v_loadf(qr + c + 16);
      inexact |= v_not_bf16(lo) | v_not_bf16(hi);
      v_storei(qp[r] + c / 2, v_bf16_pack(lo, hi));
    }
  }
  if (inexact) return 0;
  for (int j0 = 0; j0 < nk; j0 += KT) {
    const char *kp[FD_V_W];
    for (int i = 0; i < KT; i++) /* past the last key: repeat it, discard the score */
      kp[i] = key_at(b, j0 + i < nk ? j0 + i : nk - 1);
    /* one-row tiles (MHA) prefetch nothing: 16 key rows asked for at once
     * slowed them (cold, ~3 %) once the multiplies got this fast */
    if (RT > 1)
      for (int i = 0; i < KT && j0 + KT + i < nk; i++) v_prefetch_row(key_at(b, j0 + KT + i), 2 * head_dim);
    vf acc[FD_V_W];
    for (int i = 0; i < FD_V_W; i++) acc[i] = v_zero();
    for (int d = 0; d < head_dim; d += 32) {
      if (RT == 1) {
        const vi qv = v_loadi(qp[0] + d / 2);
        for (int i = 0; i < KT; i++) acc[i] = v_dot_bf16(acc[i], qv, v_loadi(kp[i] + 2 * d));
      } else {
        vi kx[FD_V_W];
        for (int i = 0; i < KT; i++) kx[i] = v_loadi(kp[i] + 2 * d);
        for (int r = 0; r < RT; r++) {
          const vi qv = v_loadi(qp[r] + d / 2);
          for (int i = 0; i < KT; i++) acc[r * KT + i] = v_dot_bf16(acc[r * KT + i], qv, kx[i]);
        }
      }
    }
    const vf sums = v_mul(v_reduce(acc), v_set1(b->scale));
    const int valid = nk - j0 < KT ? nk - j0 : KT;
    for (int r = 0; r < RT; r++)
      v_store_lanes(b->scratch + (ptrdiff_t)(r0 + r) * FD_CPU_KEY_BLOCK + j0 - r * KT, r * KT, valid,
                    sums);
  }
  return 1;
}

/* 1 when the n floats at q (n % 16 == 0) are all bf16 values. */
FD_VFN int row_is_bf16(const float *q, int n) {
  int inexact = 0;
  for (int c = 0; c < n; c += 16) inexact |= v_not_bf16(v_loadf(q + c));
  return !inexact;
}
#endif

/* The bf16 scores of rows [r0, r0 + RT), head_dim % 32 == 0; dp: try
 * scores_tile_dp first. */
FD_VFN void scores_tile_bf16(const fd_cpu_block *b, int r0, const int RT, int dp) {
#if FD_V_DPBF16
  if (dp && scores_tile_dp(b, r0, RT)) return;
#endif
  (void)dp;
  scores_tile_pairs(b, r0, RT);
}
#endif

/* Online softmax of every row: scores -> exp(s - m') in scratch (0 past the
 * row's keys), m, l updated, alpha[r] = exp(m - m') (1 for rows that see no
 * key of the block). */
FD_VFN void softmax_rows(const fd_cpu_block *b) {
  enum { NV = FD_CPU_KEY_BLOCK / FD_V_W };
  float *alpha = b->alpha;
  const vf neg_inf = v_set1(-INFINITY);
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count ? b->count[r] : b->num_keys;
    if (n <= 0) {
      alpha[r] = 1.0f;
      continue;
    }
    float *s = b->scratch + (ptrdiff_t)r * FD_CPU_KEY_BLOCK;
    vf sv[NV]; /* lanes past the row's keys: -inf */
    for (int i = 0; i < NV; i++) sv[i] = v_loadf_or(neg_inf, n - FD_V_W * i, s + FD_V_W * i);
    vf mx = sv[0];
    for (int i = 1; i < NV; i++) mx = v_max(mx, sv[i]);
    const float block_max = v_hmax(mx);
    const float m_old = b->m[r];
    const float m_new = block_max > m_old ? block_max : m_old;
    const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* never (-inf) - (-inf) */
    const vf mv = v_set1(m_use);
    vf sum = v_zero();
    for (int i = 0; i < NV; i++) {
      const vf p = v_exp(v_sub(sv[i], mv));
      v_storef(s + FD_V_W * i, p);
      sum = i == 0 ? p : v_add(sum, p);
    }
    alpha[r] = expf(m_old - m_use); /* m_old = -inf: 0 */
    b->l[r] = b->l[r] * alpha[r] + v_hsum(sum);
    b->m[r] = m_new;
  }
}

FD_VFN void scores_body(const fd_cpu_block *b, fd_dtype dtype) {
  int r = 0;
#if FD_V_AMX
  if (dtype == FD_DTYPE_BF16 && b->qt) { /* q packed by pack_q: q.K on tiles, which
                                             prefetch b->next through their work */
    if (amx_scores(b)) return; /* the softmax too */
    r = b->rows;
  }
#endif
#if FD_V_PAIRED
  if (r == 0 && dtype == FD_DTYPE_BF16 && b->head_dim % 32 == 0) {
    fd_cpu_prefetch_next(b, 0, 1); /* all before the work */
    /* vdpbf16ps where q is bf16; the first row decides for the call whether
     * to try (an fp16 q over an fp8 cache skips the packing) */
#if FD_V_DPBF16
    const int dp = row_is_bf16(b->q, b->head_dim);
#else
    const int dp = 0;
#endif
    for (; r + 4 <= b->rows; r += 4) scores_tile_bf16(b, r, 4, dp);
    for (; r + 2 <= b->rows; r += 2) scores_tile_bf16(b, r, 2, dp);
    for (; r < b->rows; r++) scores_tile_bf16(b, r, 1, dp);
  } else
#endif
  { /* (scores_tile spreads b->next through its first tile) */
    for (; r + 4 <= b->rows; r += 4) scores_tile(b, r, 4, dtype);
    for (; r + 2 <= b->rows; r += 2) scores_tile(b, r, 2, dtype);
    for (; r < b->rows; r++) scores_tile(b, r, 1, dtype);
  }
  fd_cpu_adjust_scores(b, FD_CPU_KEY_BLOCK);
  softmax_rows(b);
}

/* ---- values ---------------------------------------------------------------- */

/* acc = alpha * acc + P V for rows [r0, r0 + RT) that all see every key of
 * the block, columns [d0, d0 + W * DT) (RT * DT accumulators; small tiles
 * keep U sets of them, for keys j = u mod U, added up in order at the end).
 * FULL: all those columns exist (plain loads); else lanes past head_dim are
 * masked off. */
FD_VFN void values_cols(const fd_cpu_block *b, int r0, int d0, const int RT, const int DT,
                        const int FULL, fd_dtype dtype) {
  const int head_dim = b->head_dim, nk = b->num_keys;
  const int A = RT * DT, U = FD_KEY_SETS(A);
  const float *alpha = b->alpha;
  const int elem = elem_bytes(dtype);
  vmask cols[4];
  int ncols[4];
  for (int i = 0; i < DT; i++) {
    ncols[i] = head_dim - d0 - FD_V_W * i;
    cols[i] = v_mask_first(ncols[i]);
  }
  vf acc[16]; /* [u][r][i] */
  for (int r = 0; r < RT; r++) {
    const vf al = v_set1(alpha[r0 + r]);
    const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < DT; i++)
      acc[r * DT + i] =
          v_mul(FULL ? v_loadf(a + FD_V_W * i) : v_loadf_mask(cols[i], a + FD_V_W * i), al);
  }
  for (int i = A; i < U * A; i++) acc[i] = v_zero();
  const float *p = b->scratch + (ptrdiff_t)r0 * b->stride;
  const ptrdiff_t ps = b->stride, off = b->value_off + (ptrdiff_t)d0 * elem;
  int j = 0;
  for (; j + U <= nk; j += U) {
    if (r0 == 0 && d0 == 0) /* b->next, a part per U keys of the first tile */
      fd_cpu_prefetch_next(b, j / U, nk / U);
    for (int u = 0; u < U; u++) {
      const char *v = (const char *)b->values[j + u] + off;
      if (FD_V_PREFETCH && j + u + FD_VALUE_PREFETCH < nk)
        v_prefetch_row((const char *)b->values[j + u + FD_VALUE_PREFETCH] + off, DT * FD_V_W * elem);
      vf vv[4];
      for (int i = 0; i < DT; i++)
        vv[i] = FULL ? v_load(v, FD_V_W * i, dtype) : v_load_part(v, FD_V_W * i, cols[i], ncols[i], dtype);
      for (int r = 0; r < RT; r++) {
        const vf pj = v_set1(p[r * ps + j + u]);
        for (int i = 0; i < DT; i++) acc[u * A + r * DT + i] = v_fma(pj, vv[i], acc[u * A + r * DT + i]);
      }
    }
  }
  for (; j < nk; j++) {
    const char *v = (const char *)b->values[j] + off;
    vf vv[4];
    for (int i = 0; i < DT; i++)
      vv[i] = FULL ? v_load(v, FD_V_W * i, dtype) : v_load_part(v, FD_V_W * i, cols[i], ncols[i], dtype);
    for (int r = 0; r < RT; r++) {
      const vf pj = v_set1(p[r * ps + j]);
      for (int i = 0; i < DT; i++) acc[r * DT + i] = v_fma(pj, vv[i], acc[r * DT + i]);
    }
  }
  for (int u = 1; u < U; u++)
    for (int i = 0; i < A; i++) acc[i] = v_add(acc[i], acc[u * A + i]);
  for (int r = 0; r < RT; r++) {
    float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < DT; i++) {
      if (FULL)
        v_storef(a + FD_V_W * i, acc[r * DT + i]);
      else
        v_storef_mask(a + FD_V_W * i, cols[i], acc[r * DT + i]);
    }
  }
}

/* values_cols over every column of rows [r0, r0 + RT). */
FD_VFN void values_tile(const fd_cpu_block *b, int r0, const int RT, const int DT, fd_dtype dtype) {
  int d0 = 0;
  for (; d0 + FD_V_W * DT <= b->head_dim; d0 += FD_V_W * DT) values_cols(b, r0, d0, RT, DT, 1, dtype);
  if (d0 < b->head_dim) values_cols(b, r0, d0, RT, DT, 0, dtype);
}

/* Rows with DT vectors of columns per tile: 4 at a time, then 2, then 1. */
FD_VFN void values_rows(const fd_cpu_block *b, const int DT, fd_dtype dtype) {
  int r = 0;
  for (; r + 4 <= b->rows; r += 4) values_tile(b, r, 4, DT, dtype);
  for (; r + 2 <= b->rows; r += 2) values_tile(b, r, 2, DT, dtype);
  for (; r < b->rows; r++) values_tile(b, r, 1, DT, dtype);
}

#if FD_V_PAIRED
/* bf16 values, paired order (cpu_kernels.h), head_dim % 32 == 0: acc =
 * alpha * acc + P V for rows [r0, r0 + RT) that see every key of the block,
 * columns [d0, d0 + 32 * CT) (key sets as in values_cols). A 64-byte load of
 * 32 bf16 widens with one shift (the even columns) and one and (the odd
 * ones). */
FD_VFN void values_pairs(const fd_cpu_block *b, int r0, int d0, const int RT, const int CT) {
  const int head_dim = b->head_dim, nk = b->num_keys;
  const int A = RT * 2 * CT, U = FD_KEY_SETS(A);
  const float *alpha = b->alpha;
  vf acc[16]; /* [u][r][c][even, odd] */
  for (int r = 0; r < RT; r++) {
    const vf al = v_set1(alpha[r0 + r]);
    const float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < 2 * CT; i++) acc[r * 2 * CT + i] = v_mul(v_loadf(a + 16 * i), al);
  }
  for (int i = A; i < U * A; i++) acc[i] = v_zero();
  const float *p = b->scratch + (ptrdiff_t)r0 * b->stride;
  const ptrdiff_t ps = b->stride, off = b->value_off + (ptrdiff_t)d0 * 2;
  for (int j = 0; j < nk; j += U) {
    for (int u = 0; u < U && j + u < nk; u++) {
      const char *v = (const char *)b->values[j + u] + off;
      if (j + u + FD_VALUE_PREFETCH < nk)
        v_prefetch_row((const char *)b->values[j + u + FD_VALUE_PREFETCH] + off, 64 * CT);
      vf vv[8];
      for (int c = 0; c < CT; c++) {
        const vi x = v_loadi(v + 64 * c);
        vv[2 * c] = v_bf16_even(x);
        vv[2 * c + 1] = v_bf16_odd(x);
      }
      for (int r = 0; r < RT; r++) {
        const vf pj = v_set1(p[r * ps + j + u]);
        for (int i = 0; i < 2 * CT; i++)
          acc[u * A + r * 2 * CT + i] = v_fma(pj, vv[i], acc[u * A + r * 2 * CT + i]);
      }
    }
  }
  for (int u = 1; u < U; u++)
    for (int i = 0; i < A; i++) acc[i] = v_add(acc[i], acc[u * A + i]);
  for (int r = 0; r < RT; r++) {
    float *a = b->acc + (ptrdiff_t)(r0 + r) * head_dim + d0;
    for (int i = 0; i < 2 * CT; i++) v_storef(a + 16 * i, acc[r * 2 * CT + i]);
  }
}

/* values_pairs over every column of rows [r0, r0 + RT): CT chunks at a time,
 * then 2, then 1. */
FD_VFN void values_pairs_tile(const fd_cpu_block *b, int r0, const int RT, const int CT) {
  int d0 = 0;
  for (; d0 + 32 * CT <= b->head_dim; d0 += 32 * CT) values_pairs(b, r0, d0, RT, CT);
  if (CT > 2)
    for (; d0 + 64 <= b->head_dim; d0 += 64) values_pairs(b, r0, d0, RT, 2);
  for (; d0 < b->head_dim; d0 += 32) values_pairs(b, r0, d0, RT, 1);
}
#endif

/* acc = alpha * acc + P V row by row, over each row's own key count. */
FD_VFN void values_counted(const fd_cpu_block *b, fd_dtype dtype) {
  const float *alpha = b->alpha;
  const int head_dim = b->head_dim;
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count[r];
    if (n <= 0) continue;
    const float *p = b->scratch + (ptrdiff_t)r * b->stride;
    float *a = b->acc + (ptrdiff_t)r * head_dim;
#if FD_V_PAIRED
    if (dtype == FD_DTYPE_BF16 && head_dim % 32 == 0) { /* paired order */
      for (int d = 0; d < head_dim; d += 32) {
        const vf al = v_set1(alpha[r]);
        vf even = v_mul(v_loadf(a + d), al), odd = v_mul(v_loadf(a + d + 16), al);
        for (int j = 0; j < n; j++) {
          const vi x = v_loadi((const char *)b->values[j] + b->value_off + (ptrdiff_t)d * 2);
          const vf pj = v_set1(p[j]);
          even = v_fma(pj, v_bf16_even(x), even);
          odd = v_fma(pj, v_bf16_odd(x), odd);
        }
        v_storef(a + d, even);
        v_storef(a + d + 16, odd);
      }
      continue;
    }
#endif
    for (int d = 0; d < head_dim; d += FD_V_W) {
      const int c = head_dim - d;
      const vmask cols = v_mask_first(c);
      vf acc = v_mul(v_loadf_mask(cols, a + d), v_set1(alpha[r]));
      for (int j = 0; j < n; j++) {
        const char *v = (const char *)b->values[j] + b->value_off;
        acc = v_fma(v_set1(p[j]), c >= FD_V_W ? v_load(v, d, dtype) : v_load_part(v, d, cols, c, dtype),
                    acc);
      }
      v_storef_mask(a + d, cols, acc);
    }
  }
}

/* The values step after the softmax. */
FD_VFN void values_body(const fd_cpu_block *b, fd_dtype dtype) {
#if FD_V_AMX
  if (!b->count && dtype == FD_DTYPE_BF16 && b->head_dim % 32 == 0) { /* P.V on tiles,
                                              which prefetch b->next through their work */
    amx_values(b);
    return;
  }
#endif
  if (b->count) {
    fd_cpu_prefetch_next(b, 0, 1); /* all before the work */
    values_counted(b, dtype);
    return;
  }
#if FD_V_PAIRED
  if (dtype == FD_DTYPE_BF16 && b->head_dim % 32 == 0) {
    fd_cpu_prefetch_next(b, 0, 1); /* all before the work */
    int r = 0;
    for (; r + 4 <= b->rows; r += 4) values_pairs_tile(b, r, 4, 2);
    for (; r + 2 <= b->rows; r += 2) values_pairs_tile(b, r, 2, 4);
    for (; r < b->rows; r++) values_pairs_tile(b, r, 1, 4);
    return;
  }
#endif
  /* (values_cols spreads b->next through its first tile) */
  if (b->head_dim <= FD_V_W)
    values_rows(b, 1, dtype);
  else if (FD_V_VALUE_DT <= 2 || b->head_dim <= 2 * FD_V_W)
    values_rows(b, 2, dtype);
  else
    values_rows(b, FD_V_VALUE_DT, dtype);
}

/* ---- head_dim <= 8: keys in lanes -------------------------------------------
 * A W-lane dot product over 8 columns would leave lanes empty and need a
 * reduction per score. Instead W keys are transposed in registers
 * (v_keys_t) so that t[d] holds column d of W keys: a row's W scores are
 * then head_dim FMAs with q[r][d] broadcast, no reduction. The softmax runs
 * over blocks of up to FD_CPU_SMALL_BLOCK keys, W rows' alpha one vector
 * exp; the values step keeps each row's 8 accumulators in one 8-float row
 * (one FMA per key and row). */

/* small_scores: scale * q . k of every row for every key of the block into
 * scratch, W keys at a time, two FMA chains (even and odd columns).
 * head_dim <= 8; FULL: head_dim == 8. */
FD_VFN void scores_small(const fd_cpu_block *b, const int FULL, fd_dtype dtype) {
  const int head_dim = FULL ? 8 : b->head_dim, nk = b->num_keys, rows = b->rows;
  const vf scale = v_set1(b->scale);
  for (int j0 = 0; j0 < nk; j0 += FD_V_W) {
    vf t[8];
    v_keys_t(b, j0, t, FULL, dtype);
    for (int r = 0; r < rows; r++) {
      const float *q = b->q + (ptrdiff_t)r * head_dim;
      vf s0 = v_mul(v_set1(q[0]), t[0]), s1 = v_zero();
      for (int d = 1; d + 1 < head_dim; d += 2) {
        s1 = v_fma(v_set1(q[d]), t[d], s1);
        s0 = v_fma(v_set1(q[d + 1]), t[d + 1], s0);
      }
      if (head_dim % 2 == 0) s1 = v_fma(v_set1(q[head_dim - 1]), t[head_dim - 1], s1);
      /* j0 + W <= stride: lanes past the row's keys land in its scratch row
       * and the softmax ignores them */
      v_storef(b->scratch + (ptrdiff_t)r * b->stride + j0, v_mul(v_add(s0, s1), scale));
    }
  }
}

/* small_softmax (contract in cpu_kernels.h), for blocks of up to
 * FD_CPU_SMALL_BLOCK keys: a row's block max is a running vector max and one
 * butterfly, its sum likewise; lane i of a W-row chunk collects row i's m,
 * m' and sum, so alpha = exp(m - m') of W rows is one vector exp (m = -inf
 * gives 0) and l = l * alpha + sum follows W rows at a time. The same results
 * as softmax_rows up to rounding. */
FD_VFN void softmax_small(const fd_cpu_block *b) {
  const vf neg_inf = v_set1(-INFINITY);
  for (int r0 = 0; r0 < b->rows; r0 += FD_V_W) {
    const int nr = b->rows - r0 < FD_V_W ? b->rows - r0 : FD_V_W;
    /* lane i: row r0 + i; rows that see no key keep m_old = m_use = sum =
     * 0, so alpha = exp(0) = 1 and l stays l */
    vf m_old = v_zero(), m_use = v_zero(), sum = v_zero(), l_old = v_zero();
    for (int i = 0; i < nr; i++) {
      const int r = r0 + i, n = b->count ? b->count[r] : b->num_keys;
      l_old = v_put_lane(l_old, i, v_set1(b->l[r]));
      if (n <= 0) continue;
      float *s = b->scratch + (ptrdiff_t)r * b->stride;
      const int full = n & ~(FD_V_W - 1), tail = n & (FD_V_W - 1);
      vf mx = neg_inf, mx2 = neg_inf; /* two chains */
      int j = 0;
      for (; j + 2 * FD_V_W <= full; j += 2 * FD_V_W) {
        mx = v_max(mx, v_loadf(s + j));
        mx2 = v_max(mx2, v_loadf(s + j + FD_V_W));
      }
      if (j < full) mx = v_max(mx, v_loadf(s + j));
      /* the last n % W scores, lanes past n -inf */
      vf st = neg_inf;
      if (tail) {
        st = v_loadf_or(neg_inf, tail, s + full);
        mx2 = v_max(mx2, st);
      }
      const vf mo = v_set1(b->m[r]);
      /* m' = max(block max, m) (a NaN block max keeps m, as the scalar form) */
      const vf mn = v_max(v_all_max(v_max(mx, mx2)), mo);
      const vf mu = v_ninf_to_zero(mn); /* never (-inf) - (-inf) */
      vf sm = v_zero(), sm2 = v_zero();
      for (j = 0; j + 2 * FD_V_W <= full; j += 2 * FD_V_W) {
        const vf p0 = v_exp(v_sub(v_loadf(s + j), mu));
        const vf p1 = v_exp(v_sub(v_loadf(s + j + FD_V_W), mu));
        v_storef(s + j, p0);
        v_storef(s + j + FD_V_W, p1);
        sm = v_add(sm, p0);
        sm2 = v_add(sm2, p1);
      }
      if (j < full) {
        const vf p0 = v_exp(v_sub(v_loadf(s + j), mu));
        v_storef(s + j, p0);
        sm = v_add(sm, p0);
      }
      if (tail) { /* lanes past n: exp(-inf) = 0, stored (n rounded up to W
                     is at most the stride: the row has room) */
        const vf p1 = v_exp(v_sub(st, mu));
        v_storef(s + full, p1);
        sm2 = v_add(sm2, p1);
      }
      m_old = v_put_lane(m_old, i, mo);
      m_use = v_put_lane(m_use, i, mu);
      sum = v_put_lane(sum, i, v_all_sum(v_add(sm, sm2)));
      b->m[r] = v_first(mn);
    }
    /* alpha and l through whole-vector stores and scalar copies: the
     * values step and the next block load them as scalars, which a masked
     * store would not forward to */
    float al[FD_V_W], l_new[FD_V_W];
    const vf a = v_exp(v_sub(m_old, m_use));
    v_storef(al, a);
    v_storef(l_new, v_add(v_mul(l_old, a), sum));
    for (int i = 0; i < nr; i++) {
      b->alpha[r0 + i] = al[i];
      b->l[r0 + i] = l_new[i];
    }
  }
}

/* acc = alpha * acc + P V for rows [r0, r0 + RT) over keys [0, n), one
 * 8-float accumulator per row, U sets of them for keys j = u mod U (added up
 * in order at the end) so that RT * U = 8 FMA chains are in flight. */
FD_VFN void values_small_tile(const fd_cpu_block *b, int r0, int n, const int RT, const int U,
                              const int FULL, fd_dtype dtype) {
  const int head_dim = b->head_dim;
  hf acc[8]; /* [u][r] */
  for (int r = 0; r < RT; r++)
    acc[r] = h_mul(h_load_acc(b->acc + (ptrdiff_t)(r0 + r) * head_dim, head_dim, FULL),
                   h_set1(b->alpha[r0 + r]));
  for (int i = RT; i < RT * U; i++) acc[i] = h_zero();
  const float *p = b->scratch + (ptrdiff_t)r0 * b->stride;
  const ptrdiff_t ps = b->stride;
  int j = 0;
  for (; j + U <= n; j += U)
    for (int u = 0; u < U; u++) {
      const hf v = h_load_row((const char *)b->values[j + u] + b->value_off, head_dim, FULL, dtype);
      for (int r = 0; r < RT; r++) acc[u * RT + r] = h_fma(h_set1(p[r * ps + j + u]), v, acc[u * RT + r]);
    }
  for (; j < n; j++) {
    const hf v = h_load_row((const char *)b->values[j] + b->value_off, head_dim, FULL, dtype);
    for (int r = 0; r < RT; r++) acc[r] = h_fma(h_set1(p[r * ps + j]), v, acc[r]);
  }
  for (int u = 1; u < U; u++)
    for (int r = 0; r < RT; r++) acc[r] = h_add(acc[r], acc[u * RT + r]);
  for (int r = 0; r < RT; r++) h_store_acc(b->acc + (ptrdiff_t)(r0 + r) * head_dim, head_dim, FULL, acc[r]);
}

/* small_values: head_dim <= 8 (FULL: == 8). */
FD_VFN void values_small(const fd_cpu_block *b, const int FULL, fd_dtype dtype) {
  if (b->count) { /* rows see different key counts: one at a time */
    for (int r = 0; r < b->rows; r++)
      if (b->count[r] > 0) values_small_tile(b, r, b->count[r], 1, 8, FULL, dtype);
    return;
  }
  const int nk = b->num_keys;
  int r = 0;
  for (; r + 4 <= b->rows; r += 4) values_small_tile(b, r, nk, 4, 2, FULL, dtype);
  for (; r + 2 <= b->rows; r += 2) values_small_tile(b, r, nk, 2, 4, FULL, dtype);
  for (; r < b->rows; r++) values_small_tile(b, r, nk, 1, 8, FULL, dtype);
}

/* ---- the kernels: one instance per dtype, so the load switches fold away;
 * the small steps branch once on head_dim == 8 (no partial rows) ---------- */
#define FD_BODY_KERNELS(suffix, dtype)                                                     \
  FD_VKERNEL void scores_##suffix(const fd_cpu_block *b) { scores_body(b, dtype); }       \
  FD_VKERNEL void values_##suffix(const fd_cpu_block *b) { values_body(b, dtype); }       \
  FD_VKERNEL void small_scores_##suffix(const fd_cpu_block *b) {                          \
    if (b->head_dim == 8)                                                                 \
      scores_small(b, 1, dtype);                                                          \
    else                                                                                  \
      scores_small(b, 0, dtype);                                                          \
  }                                                                                       \
  FD_VKERNEL void small_values_##suffix(const fd_cpu_block *b) {                          \
    if (b->head_dim == 8)                                                                 \
      values_small(b, 1, dtype);                                                          \
    else                                                                                  \
      values_small(b, 0, dtype);                                                          \
  }

FD_BODY_KERNELS(f32, FD_DTYPE_F32)
FD_BODY_KERNELS(f16, FD_DTYPE_F16)
FD_BODY_KERNELS(bf16, FD_DTYPE_BF16)

FD_VKERNEL void small_softmax(const fd_cpu_block *b) { softmax_small(b); }

#if FD_V_AMX
FD_VKERNEL size_t pack_q_bf16(const float *q, int rows, int head_dim, void *dst, size_t cap) {
  return amx_pack_q(q, rows, head_dim, dst, cap);
}
FD_VKERNEL void start_tiles(void) { amx_start(); }
FD_VKERNEL void finish_tiles(void) { amx_release(); }
#endif

/* The getter's body (contract: fd_cpu_kernels_get). */
static int fill_kernels(fd_dtype dtype, fd_cpu_kernels *k) {
  k->small_softmax = small_softmax;
  k->small_head_dim = 8;
  k->paired = 0;
#if FD_V_AMX
  k->start = start_tiles;
  k->finish = finish_tiles;
#endif
  switch (dtype) {
    case FD_DTYPE_F32:
      k->scores = scores_f32, k->values = values_f32;
      k->small_scores = small_scores_f32, k->small_values = small_values_f32;
      return 1;
    case FD_DTYPE_F16:
      k->scores = scores_f16, k->values = values_f16;
#if FD_V_AMX
      k->spreads_next = 1;
#endif
      k->small_scores = small_scores_f16, k->small_values = small_values_f16;
      return 1;
    case FD_DTYPE_BF16:
      k->scores = scores_bf16, k->values = values_bf16, k->paired = FD_V_PAIRED;
#if FD_V_AMX
      k->pack_q = pack_q_bf16;
      k->spreads_next = 1;
      k->rope_keys = 1;
#endif
      k->small_scores = small_scores_bf16, k->small_values = small_values_bf16;
      return 1;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* fp8 caches: cpu_decode.c widens them first */
  }
  return 0;
}

#endif /* FD_CPU_KERNEL_BODY_H */
