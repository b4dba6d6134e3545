/*
 * cpu_simd_amx.h — the tile steps of the AMX kernels (cpu_kernels_amx.c):
 * q.K and P.V of one key block of one kv head on AMX-BF16 tiles, for bf16
 * keys and values (a bf16 cache, or an fp8 cache widened to bf16) with
 * head_dim % 32 == 0. Included after cpu_simd_avx512.h (FD_V_AMX 1) and
 * before cpu_kernel_body.h, whose scores and values steps call them; the
 * online softmax between them is the body's, except for blocks of whole
 * 16-row chunks with q in one piece (MQA-like groups), which amx_scores
 * runs on the transposed scores (amx_softmax_t). The steps ask L1 for the
 * driver's next call's rows (fd_cpu_block.next) a part at a time through
 * their work.
 *
 * tdpbf16ps C[M][N] += sum_k A[M][2k..2k+1] . B[k][2n..2n+1] multiplies
 * bf16 pairs exactly and adds in float32 (bf16 subnormal inputs count as 0,
 * subnormal sums are flushed). Its inputs are 16 rows of 64 bytes at most:
 *
 * - Scores, transposed: A = 16 keys as stored (32 columns of each; the last
 *   rope_dim columns from their own rows where fd_cpu_block.rope is set), B = q
 *   packed once per pass by amx_pack_q ([column pair][row piece]), C =
 *   [key][row piece] float32. A q that is not bf16 (fp16 q over an fp8 cache)
 *   goes in as two pieces, hi = bf16(q) and lo = q - hi (both bf16: exact for
 *   fp16 values), summed after the product; a q that two pieces do not hold
 *   (float32) is not packed and the body's FMA scores run instead.
 * - Values, up to 8 rows: B = 16 value rows as stored (32 columns: 16
 *   column pairs), A = [row, parity, piece][key pairs] with P's piece of key
 *   k in the pair's even slot (parity 0) or odd slot (parity 1), the other
 *   slot 0: row (r, 0) of C collects the even columns of 32, (r, 1) the odd
 *   ones, which is the paired order of cpu_kernels.h. More rows: V relaid
 *   out into B tiles of key pairs (amx_values_vnni), A = 16 rows of P's
 *   piece, C = [row][column] in the paired order. P (float32) goes in as two
 *   bf16 pieces, hi = bf16(p) and lo = bf16(p - hi): |p - hi - lo| <= 2^-17 p.
 *
 * Key and value rows are read in place, as two 16-row tiles, when each half
 * of the block's 32 rows is evenly spaced (the driver's key_step /
 * value_step: a contiguous cache, pages of 16 or more keys that the halves
 * do not cross, fp8 widened rows); else (a short block, a page boundary
 * inside a half) they are copied to a local block first. The steps configure the tiles when the thread's configuration is
 * not theirs (amx_configure); the driver releases them after a thread's last
 * kernel call of a run (fd_cpu_kernels.finish), so no tile state outlives
 * fd_run.
 */
#ifndef FD_CPU_SIMD_AMX_H
#define FD_CPU_SIMD_AMX_H

#include <string.h>

#include "dtype.h"

/* The tile configuration (palette 1) that ldtilecfg reads. */
typedef struct amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

/* Every tile of the kernels is 16 rows of 64 bytes (the largest operand):
 * one configuration for both steps, loaded once per thread and run
 * (fd_cpu_kernels.start) and released after (finish). Rows or columns past
 * the ones a step uses hold whatever the loads bring in: a product's row m
 * depends only on A's row m and its column n only on B's column n, so those
 * results are discarded unread. */
FD_VFN void amx_start(void) {
  _Alignas(64) amx_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  /* ldtilecfg with the whole struct as its operand (GCC 12's
   * _tile_loadconfig names only 8 bytes of it, so the stores above could be
   * dropped as dead) */
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* amx_pack_q's header: the packed rows follow it. */
typedef struct amx_qhdr {
  int32_t pieces; /* bf16 pieces per q element: 1 (q is bf16) or 2 (hi, lo) */
  int32_t cols;   /* B columns per row chunk: rows * pieces, at most 16 */
  int32_t chunks; /* row chunks: rows / (cols / pieces) rounded up */
  int32_t pad[13];
} amx_qhdr;

/* Bytes amx_pack_q writes for `rows` rows of head_dim columns (head_dim %
 * 32 == 0) with `pieces`: a multiple of 64. */
static inline size_t amx_q_bytes(int rows, int head_dim, int pieces) {
  const int cols = rows * pieces < 16 ? rows * pieces : 16, per = cols / pieces;
  const int chunks = (rows + per - 1) / per;
  return sizeof(amx_qhdr) + (size_t)chunks * cols * head_dim * 2 + 64; /* 64: see amx_scores */
}
_Static_assert(sizeof(amx_qhdr) == 64, "the packed rows start 64-byte aligned");

/* fd_cpu_kernels.pack_q for the AMX scores: q rows [rows][head_dim]
 * (head_dim % 32 == 0) as B tiles [chunk][head_dim / 32][16 column pairs]
 * [cols] of 32-bit (bf16 of column 2k, of 2k + 1), column (r % per) *
 * pieces + piece of chunk r / per holding row r's piece (zero columns past
 * the last row). Returns the bytes written (fd_cpu_kernels.pack_q). */
FD_VFN size_t amx_pack_q(const float *q, int rows, int head_dim, void *dst, size_t cap) {
  if (head_dim % 32 != 0) return 0;
  int pieces = 1;
  for (int i = 0; i < rows * head_dim; i += 16) {
    const vf x = v_loadf(q + i);
    if (!v_not_bf16(x)) continue;
    pieces = 2; /* then the rest x - bf16(x) must be a bf16 value */
    const __m256bh h = _mm512_cvtneps_pbh(x);
    const vf hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
    if (v_not_bf16(v_sub(x, hi))) return 0;
  }
  if (amx_q_bytes(rows, head_dim, pieces) > cap) return 0;
  const int cols = rows * pieces < 16 ? rows * pieces : 16, per = cols / pieces;
  const int chunks = (rows + per - 1) / per, steps = head_dim / 32;
  amx_qhdr *h = (amx_qhdr *)dst;
  memset(h, 0, amx_q_bytes(rows, head_dim, pieces));
  h->pieces = pieces;
  h->cols = cols;
  h->chunks = chunks;
  uint16_t *t = (uint16_t *)(h + 1);
  for (int r = 0; r < rows; r++)
    for (int d = 0; d < head_dim; d++) {
      const float x = q[(ptrdiff_t)r * head_dim + d];
      const uint16_t hi = fd_f32_to_bf16(x);
      const uint16_t lo = fd_f32_to_bf16(x - fd_bf16_to_f32(hi));
      const int chunk = r / per, col = (r % per) * pieces;
      const ptrdiff_t i = (((ptrdiff_t)chunk * steps + d / 32) * 16 + (d % 32) / 2) * cols + col;
      t[2 * i + (d & 1)] = hi;
      if (pieces == 2) t[2 * (i + 1) + (d & 1)] = lo;
    }
  return amx_q_bytes(rows, head_dim, pieces);
}

/* The block's 32 rows (keys or values: `rows`, at byte offset off, each
 * head_dim bf16) as two tiles of 16, rows 0-15 at the returned base + j *
 * *stride and rows 16-31 at *second + j * *stride: in place when the driver
 * says each 16-row run is evenly spaced by `even` bytes
 * (fd_cpu_block.key_step / value_step, nonzero only for full blocks), else
 * copied into buf [32][head_dim] (rows past n repeat row n - 1). */
FD_VFN const char *amx_rows(const void *const *rows, ptrdiff_t off, int n, ptrdiff_t even,
                            int head_dim, uint16_t *buf, ptrdiff_t *stride, const char **second) {
  if (even != 0 && n == 32) {
    *stride = even;
    *second = (const char *)rows[16] + off;
    return (const char *)rows[0] + off;
  }
  for (int j = 0; j < 32; j++)
    memcpy(buf + (ptrdiff_t)j * head_dim, (const char *)rows[j < n ? j : n - 1] + off,
           (size_t)head_dim * 2);
  *stride = (ptrdiff_t)head_dim * 2;
  *second = (const char *)(buf + 16 * (ptrdiff_t)head_dim);
  return (const char *)buf;
}

/* 16 floats of P as two bf16 pieces: hi = bf16(x), lo = bf16(x - hi)
 * (|x - hi - lo| <= 2^-17 |x|). */
FD_VFN void amx_p_pieces(vf x, __m256i *hi, __m256i *lo) {
  *hi = (__m256i)_mm512_cvtneps_pbh(x);
  const vf hif = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(*hi), 16));
  *lo = (__m256i)_mm512_cvtneps_pbh(v_sub(x, hif));
}

/* The online softmax (the body's softmax_rows) of the 16 rows r0 .. r0 + 15,
 * every one seeing every key, on their unscaled scores st [key][row] (32
 * keys: the two C tiles of amx_scores with one column a row): 16 rows a
 * vector, so no horizontal reductions and one vector exp for the rows'
 * alpha. Leaves p (0 past num_keys) in st, [key][row]. */
FD_VFN void amx_softmax_t(const fd_cpu_block *b, float *st, int r0) {
  const vf scale = v_set1(b->scale);
  const int nk = b->num_keys;
  vf mx = v_set1(-INFINITY), mx2 = mx; /* two chains */
  int k = 0;
  for (; k + 2 <= nk; k += 2) {
    mx = v_max(v_mul(v_loadf(st + 16 * k), scale), mx);
    mx2 = v_max(v_mul(v_loadf(st + 16 * (k + 1)), scale), mx2);
  }
  if (k < nk) mx = v_max(v_mul(v_loadf(st + 16 * k), scale), mx);
  const vf m_old = _mm512_loadu_ps(b->m + r0);
  /* m' = max(block max, m): a NaN score leaves m (the scalar form's rule) */
  const vf m_new = v_max(v_max(mx, mx2), m_old);
  const vf m_use = v_ninf_to_zero(m_new); /* never (-inf) - (-inf) */
  vf sum = v_zero(), sum2 = v_zero();
  for (k = 0; k + 2 <= nk; k += 2) {
    const vf p0 = v_exp(v_sub(v_mul(v_loadf(st + 16 * k), scale), m_use));
    const vf p1 = v_exp(v_sub(v_mul(v_loadf(st + 16 * (k + 1)), scale), m_use));
    v_storef(st + 16 * k, p0);
    v_storef(st + 16 * (k + 1), p1);
    sum = v_add(sum, p0);
    sum2 = v_add(sum2, p1);
  }
  if (k < nk) {
    const vf p0 = v_exp(v_sub(v_mul(v_loadf(st + 16 * k), scale), m_use));
    v_storef(st + 16 * k, p0);
    sum = v_add(sum, p0);
    k++;
  }
  for (; k < FD_CPU_KEY_BLOCK; k++) v_storef(st + 16 * k, v_zero());
  const vf alpha = v_exp(v_sub(m_old, m_use)); /* m = -inf: 0 */
  _mm512_storeu_ps(b->alpha + r0, alpha);
  _mm512_storeu_ps(b->l + r0, v_fma(_mm512_loadu_ps(b->l + r0), alpha, v_add(sum, sum2)));
  _mm512_storeu_ps(b->m + r0, m_new);
}

/* Steps ahead of the current one whose key rows amx_scores asks L1 for when
 * the driver streams rows ahead (fd_cpu_block.ahead). */
#define FD_AMX_L1_STEPS 4

/* Scores of every row of the block into scratch (rows FD_CPU_KEY_BLOCK
 * floats apart): s = scale * q . k by tiles (contract of the body's
 * scores_tile; keys past num_keys are scored and ignored), the key's last
 * rope_dim columns from b->rope's rows where it is set. b->qt is
 * amx_pack_q's. Returns 1 when it ran the online softmax as well (then
 * scratch holds p, and m, l, alpha are updated: amx_softmax_t, for q in one
 * piece, whole 16-row chunks, every row seeing every key and no score
 * adjustments), else 0. */
FD_VFN int amx_scores(const fd_cpu_block *b) {
  const amx_qhdr *h = (const amx_qhdr *)b->qt;
  const int head_dim = b->head_dim, steps = head_dim / 32, cols = h->cols, pieces = h->pieces;
  const int per = cols / pieces;
  const int fused = pieces == 1 && b->rows % 16 == 0 && !b->count && b->soft_cap == 0.0f &&
                    !b->first && !b->tree;
  _Alignas(64) uint16_t kbuf[32 * FD_MAX_ROW_DIM], rbuf[32 * FD_MAX_ROPE_DIM];
  _Alignas(64) float st[32 * 16]; /* [key][column]: columns past cols discarded */
  /* the first ksteps 32-column steps from the key rows, the rest from the
   * rope rows (b->rope: MLA's rope part in its own cache) */
  const int ksteps = b->rope ? (head_dim - b->rope_dim) / 32 : steps;
  ptrdiff_t ks, rs = 0;
  const char *k1, *r1 = NULL; /* keys 16-31 */
  const char *k0 =
      amx_rows(b->keys, b->key_off, b->num_keys, b->key_step, 32 * ksteps, kbuf, &ks, &k1);
  const char *r0 = b->rope ? amx_rows(b->rope, b->rope_off, b->num_keys, b->rope_step,
                                      b->rope_dim, rbuf, &rs, &r1)
                           : NULL;
  /* C: tiles 0, 1 (keys 0-15, 16-31); B (q): 4; A (keys): 2, 3 (and below) */
  const uint32_t *qt = (const uint32_t *)(h + 1);
  const vf scale = v_set1(b->scale);
  const __m512i key = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192,
                                         208, 224, 240);
  /* the next call's rows: a part before the first step, a part after each
   * step's products */
  const int parts = (h->chunks + 1) / 2 * steps + 1;
  fd_cpu_prefetch_next(b, 0, parts);
  /* b->ahead: four parts a step (after each tile load and after the
   * products) and one per row written out; with b->ahead set, L1 is also
   * asked for the key rows FD_AMX_L1_STEPS steps ahead (from L2, where the
   * driver's earlier calls brought them) */
  fd_cpu_ahead ahead = fd_cpu_ahead_init(b, 4 * ((h->chunks + 1) / 2 * steps) + b->rows);
  const int l1_steps = b->ahead[0] ? FD_AMX_L1_STEPS : 0;
  /* two row chunks at a time where there are two (C: tiles 0, 1 and 5, 6;
   * B: 4 and 7): each key tile loaded once for both, two independent
   * product chains */
  for (int c = 0; c < h->chunks; c += 2) {
    const int pair = c + 1 < h->chunks;
    _tile_zero(0);
    _tile_zero(1);
    if (pair) {
      _tile_zero(5);
      _tile_zero(6);
    }
    for (int s = 0; s < steps; s++) {
      /* q rows cols * 4 bytes apart, 64 read: columns past cols are the next
       * rows' (64 bytes of slack after the last) */
      _tile_loadd(4, qt + ((ptrdiff_t)c * steps + s) * 16 * cols, cols * 4);
      fd_cpu_ahead_step(&ahead);
      const char *kb = s < ksteps ? k0 + 64 * s : r0 + 64 * (s - ksteps);
      const char *kb1 = s < ksteps ? k1 + 64 * s : r1 + 64 * (s - ksteps);
      const ptrdiff_t kst = s < ksteps ? ks : rs;
      if (l1_steps && s + l1_steps < steps) {
        const int sp = s + l1_steps;
        const char *pb = sp < ksteps ? k0 + 64 * sp : r0 + 64 * (sp - ksteps);
        const char *pb1 = sp < ksteps ? k1 + 64 * sp : r1 + 64 * (sp - ksteps);
        const ptrdiff_t pst = sp < ksteps ? ks : rs;
        for (int j = 0; j < 16; j++) {
          __builtin_prefetch(pb + j * pst, 0, 3);
          __builtin_prefetch(pb1 + j * pst, 0, 3);
        }
      }
      _tile_loadd(2, kb, kst);
      fd_cpu_ahead_step(&ahead);
      _tile_loadd(3, kb1, kst);
      fd_cpu_ahead_step(&ahead);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 3, 4);
      if (pair) {
        _tile_loadd(7, qt + ((ptrdiff_t)(c + 1) * steps + s) * 16 * cols, cols * 4);
        _tile_dpbf16ps(5, 2, 7);
        _tile_dpbf16ps(6, 3, 7);
      }
      fd_cpu_prefetch_next(b, c / 2 * steps + s + 1, parts);
      fd_cpu_ahead_step(&ahead);
    }
    for (int u = 0; u <= pair; u++) {
      if (u == 0) {
        _tile_stored(0, st, 64);
        _tile_stored(1, st + 16 * 16, 64);
      } else {
        _tile_stored(5, st, 64);
        _tile_stored(6, st + 16 * 16, 64);
      }
      const int cu = c + u;
      if (fused) amx_softmax_t(b, st, cu * per);
      for (int i = 0; i < per && cu * per + i < b->rows; i++) {
        float *out = b->scratch + (ptrdiff_t)(cu * per + i) * FD_CPU_KEY_BLOCK;
        fd_cpu_ahead_step(&ahead);
        for (int half = 0; half < 2; half++) {
          const float *base = st + half * 16 * 16 + i * pieces;
          vf sc = _mm512_i32gather_ps(key, base, 4);
          if (pieces == 2) sc = v_add(sc, _mm512_i32gather_ps(key, base + 1, 4));
          v_storef(out + 16 * half, fused ? sc : v_mul(sc, scale));
        }
      }
    }
  }
  return fused;
}

/* acc = (first ? alpha : 1) * acc + P V for every row over the keys [k0,
 * k0 + 32) of the block (past num_keys: P 0), 4 rows a pass: B = 16 value
 * rows as stored (32 columns: 16 column pairs), A = [row, parity, piece][key
 * pairs] with P's piece of key k in the pair's even slot (parity 0) or odd
 * slot (parity 1), the other slot 0, so that row (r, 0) of C collects the
 * even columns of 32 and (r, 1) the odd ones: the paired order. Needs no
 * relayout of V; for up to 8 rows (amx_values). */
FD_VFN void amx_values_parity(const fd_cpu_block *b, int k0, int first) {
  enum { PIECES = 2, PER = 16 / (2 * PIECES) }; /* rows per A tile */
  const int head_dim = b->head_dim, rows = b->rows, ps = b->stride;
  const int nk = b->num_keys - k0 < 32 ? b->num_keys - k0 : 32;
  _Alignas(64) uint16_t vbuf[32 * FD_MAX_ROW_DIM];
  _Alignas(64) uint32_t a[2][16][16]; /* [key half][row, parity, piece][key] */
  _Alignas(64) float ct[4][16][16];   /* [column chunk][row, parity, piece][column pair] */
  ptrdiff_t vs;
  const char *v1_0; /* keys 16-31 */
  const char *v0 =
      amx_rows(b->values + k0, b->value_off, nk, b->value_step, head_dim, vbuf, &vs, &v1_0);

  /* the next call's rows: a part before the first products, a part after
   * each 32 columns' products */
  const int parts = (rows + PER - 1) / PER * (head_dim / 32) + 1;
  int part = 0;
  if (k0 == 0) fd_cpu_prefetch_next(b, part++, parts);
  /* C: tiles 0-3 (32 columns each); A (P): 4, 5; B (values): 6, 7 */
  for (int r0 = 0; r0 < rows; r0 += PER) {
    const int nr = rows - r0 < PER ? rows - r0 : PER;
    if (nr < PER) memset(a, 0, sizeof a);
    for (int i = 0; i < nr; i++) {
      const float *p = b->scratch + (ptrdiff_t)(r0 + i) * ps + k0;
      for (int half = 0; half < 2; half++) {
        __m256i hi, lo;
        amx_p_pieces(v_loadf_or(v_zero(), nk - 16 * half, p + 16 * half), &hi, &lo);
        const __m512i h32 = _mm512_cvtepu16_epi32(hi), l32 = _mm512_cvtepu16_epi32(lo);
        /* row (i, parity, piece) = (2 i + parity) * PIECES + piece */
        _mm512_store_si512(a[half][4 * i + 0], h32);
        _mm512_store_si512(a[half][4 * i + 1], l32);
        _mm512_store_si512(a[half][4 * i + 2], _mm512_slli_epi32(h32, 16));
        _mm512_store_si512(a[half][4 * i + 3], _mm512_slli_epi32(l32, 16));
      }
    }
    _tile_loadd(4, a[0], 64);
    _tile_loadd(5, a[1], 64);
    for (int d0 = 0; d0 < head_dim; d0 += 128) {
      const int nc = (head_dim - d0) / 32 < 4 ? (head_dim - d0) / 32 : 4;
      const char *v = v0 + (ptrdiff_t)d0 * 2, *v1 = v1_0 + (ptrdiff_t)d0 * 2;
#define FD_AMX_PV(C)                              \
  do {                                            \
    _tile_zero(C);                                \
    _tile_loadd(6, v + 64 * (C), vs);             \
    _tile_dpbf16ps(C, 4, 6);                      \
    _tile_loadd(7, v1 + 64 * (C), vs);            \
    _tile_dpbf16ps(C, 5, 7);                      \
    if (k0 == 0) fd_cpu_prefetch_next(b, part++, parts); \
  } while (0)
      FD_AMX_PV(0);
      if (nc > 1) FD_AMX_PV(1);
      if (nc > 2) FD_AMX_PV(2);
      if (nc > 3) FD_AMX_PV(3);
#undef FD_AMX_PV
      _tile_stored(0, ct[0], 64);
      if (nc > 1) _tile_stored(1, ct[1], 64);
      if (nc > 2) _tile_stored(2, ct[2], 64);
      if (nc > 3) _tile_stored(3, ct[3], 64);
      for (int i = 0; i < nr; i++) {
        const vf al = v_set1(first ? b->alpha[r0 + i] : 1.0f);
        float *acc = b->acc + (ptrdiff_t)(r0 + i) * head_dim + d0;
        for (int c = 0; c < nc; c++) {
          const vf even = v_add(v_loadf(ct[c][4 * i + 0]), v_loadf(ct[c][4 * i + 1]));
          const vf odd = v_add(v_loadf(ct[c][4 * i + 2]), v_loadf(ct[c][4 * i + 3]));
          v_storef(acc + 32 * c, v_fma(v_loadf(acc + 32 * c), al, even));
          v_storef(acc + 32 * c + 16, v_fma(v_loadf(acc + 32 * c + 16), al, odd));
        }
      }
    }
  }
}
/* Keys of one span of amx_values_vnni: its C tiles sum all of them. */
#define FD_AMX_SPAN 128

/* acc = alpha * acc + P V for every row (more than 8: amx_values) over all
 * the block's keys, FD_AMX_SPAN keys a span. Per span, P goes into A tiles
 * [row chunk of 16][32 keys][piece] (bf16 pieces hi = bf16(p), lo = bf16(p -
 * hi), 0 past num_keys and past the last row), and per 64 columns V is
 * relaid out once into B tiles [key pair][16 columns] (tdpbf16ps's pairs
 * along the keys): for each 64 bytes of a key pair's rows, one tile of the
 * even columns and one of the odd ones, so a C tile's rows are acc's paired
 * order (cpu_kernels.h) as they are. Each row chunk's four C tiles (64
 * columns) collect the span's hi and lo products against the same V tile;
 * acc is read and written once a span. */
FD_VFN void amx_values_vnni(const fd_cpu_block *b) {
  const int head_dim = b->head_dim, rows = b->rows, ps = b->stride, nk = b->num_keys;
  const int chunks = (rows + 15) / 16, col_chunks = (head_dim + 63) / 64;
  _Alignas(64) uint16_t a[FD_CPU_MAX_ROWS / 16][FD_AMX_SPAN / 32][2][16][32];
  _Alignas(64) uint32_t vt[FD_AMX_SPAN / 32][4][16][16]; /* [group][tile][key pair][column] */
  _Alignas(64) float ct[4][16][16];                       /* [tile][row][column] */
  const __mmask32 odd_words = 0xAAAAAAAAu;
  const int parts = (nk + FD_AMX_SPAN - 1) / FD_AMX_SPAN * col_chunks + 1;
  int part = 0;
  fd_cpu_prefetch_next(b, part++, parts);
  /* b->ahead: a part per key pair of the relayout and per row chunk's 32
   * columns of products */
  fd_cpu_ahead ahead = fd_cpu_ahead_init(
      b, ((nk + 31) / 32 * 16 + (nk + FD_AMX_SPAN - 1) / FD_AMX_SPAN * chunks * 2) * col_chunks);
  for (int k0 = 0; k0 < nk; k0 += FD_AMX_SPAN) {
    const int groups = (nk - k0 < FD_AMX_SPAN ? nk - k0 + 31 : FD_AMX_SPAN) / 32;
    /* A: P rows as bf16 pieces, 32 keys a tile row */
    for (int c = 0; c < chunks; c++)
      for (int i = 0; i < 16; i++) {
        const int r = 16 * c + i;
        for (int g = 0; g < groups; g++) {
          const int k = k0 + 32 * g;
          if (r >= rows) {
            memset(a[c][g][0][i], 0, 64);
            memset(a[c][g][1][i], 0, 64);
            continue;
          }
          const float *p = b->scratch + (ptrdiff_t)r * ps + k;
          for (int half = 0; half < 2; half++) {
            __m256i hi, lo;
            amx_p_pieces(v_loadf_or(v_zero(), nk - k - 16 * half, p + 16 * half), &hi, &lo);
            _mm256_store_si256((__m256i *)&a[c][g][0][i][16 * half], hi);
            _mm256_store_si256((__m256i *)&a[c][g][1][i][16 * half], lo);
          }
        }
      }
    for (int d0 = 0; d0 < head_dim; d0 += 64) {
      const int tiles = head_dim - d0 >= 64 ? 4 : 2; /* head_dim % 32 == 0 */
      const ptrdiff_t off = b->value_off + (ptrdiff_t)d0 * 2;
      /* B: key pairs (2 k, 2 k + 1) as dwords (bf16 of key 2 k low, 2 k + 1
       * high); keys past num_keys are the padding entries (P 0 there) */
      for (int g = 0; g < groups; g++)
        for (int k = 0; k < 16; k++) {
          const char *x0 = (const char *)b->values[k0 + 32 * g + 2 * k] + off;
          const char *y0 = (const char *)b->values[k0 + 32 * g + 2 * k + 1] + off;
          for (int h = 0; h < tiles / 2; h++) {
            const __m512i x = _mm512_loadu_si512(x0 + 64 * h), y = _mm512_loadu_si512(y0 + 64 * h);
            _mm512_store_si512(vt[g][2 * h][k],
                               _mm512_mask_blend_epi16(odd_words, x, _mm512_slli_epi32(y, 16)));
            _mm512_store_si512(vt[g][2 * h + 1][k],
                               _mm512_mask_blend_epi16(odd_words, _mm512_srli_epi32(x, 16), y));
          }
          fd_cpu_ahead_step(&ahead);
        }
      fd_cpu_prefetch_next(b, part++, parts);
      /* per row chunk and 32 columns: C tiles 0 (hi x even columns), 1 (lo x
       * even), 2 (hi x odd), 3 (lo x odd), each updated once per 4 products
       * (no product waits for the one before it); A (P hi, lo): 4, 5; B (V
       * even, odd): 6, 7 */
      for (int c = 0; c < chunks; c++)
        for (int h = 0; h < tiles / 2; h++) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int g = 0; g < groups; g++) {
            _tile_loadd(4, a[c][g][0], 64);
            _tile_loadd(5, a[c][g][1], 64);
            _tile_loadd(6, vt[g][2 * h], 64);
            _tile_loadd(7, vt[g][2 * h + 1], 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
          fd_cpu_ahead_step(&ahead);
          _tile_stored(0, ct[0], 64);
          _tile_stored(1, ct[1], 64);
          _tile_stored(2, ct[2], 64);
          _tile_stored(3, ct[3], 64);
          const int nr = rows - 16 * c < 16 ? rows - 16 * c : 16;
          for (int i = 0; i < nr; i++) {
            const int r = 16 * c + i;
            float *acc = b->acc + (ptrdiff_t)r * head_dim + d0 + 32 * h;
            const vf even = v_add(v_loadf(ct[0][i]), v_loadf(ct[1][i]));
            const vf odd = v_add(v_loadf(ct[2][i]), v_loadf(ct[3][i]));
            if (k0 == 0) {
              const vf al = v_set1(b->alpha[r]);
              v_storef(acc, v_fma(v_loadf(acc), al, even));
              v_storef(acc + 16, v_fma(v_loadf(acc + 16), al, odd));
            } else {
              v_storef(acc, v_add(v_loadf(acc), even));
              v_storef(acc + 16, v_add(v_loadf(acc + 16), odd));
            }
          }
        }
    }
  }
}

/* acc = alpha * acc + P V for every row of the block, all of which see every
 * key (count NULL): the body's values step for bf16 in the paired order, P
 * (scratch, rows `stride` apart) in two bf16 pieces. More than 8 rows:
 * amx_values_vnni (V relaid out once for all the rows); else
 * amx_values_parity, 32 keys at a time. */
FD_VFN void amx_values(const fd_cpu_block *b) {
  if (b->rows > 8) {
    amx_values_vnni(b);
    return;
  }
  for (int k0 = 0; k0 < b->num_keys; k0 += 32) amx_values_parity(b, k0, k0 == 0);
}

/* Returns the thread's tiles to their initial state (fd_cpu_kernels.finish). */
FD_VFN void amx_release(void) { _tile_release(); }

#endif /* FD_CPU_SIMD_AMX_H */
