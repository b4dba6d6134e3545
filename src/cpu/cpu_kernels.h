/*
 * cpu_kernels.h — internal to src/cpu: the CPU backend's inner loops (one
 * key block of one kv head: scores and online softmax; weighted sum of the
 * values), one pair per instruction set and dtype, chosen at run time; and
 * the small row helpers the CPU files share.
 *
 * Kernels read K and V in the plan's dtype and widen fp16/bf16 to float32
 * exactly; all arithmetic is float32. (The AMX kernels multiply bf16 K and V
 * as stored, with q and P split into bf16 pieces; see cpu_simd_amx.h.)
 */
#ifndef FD_CPU_KERNELS_H
#define FD_CPU_KERNELS_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include "dtype.h"
#include "internal.h"

/* Instruction sets with kernels, in increasing order. */
typedef enum fd_cpu_isa {
  FD_CPU_ISA_SCALAR = 0, /* plain C: what non-x86 machines run */
  FD_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
  FD_CPU_ISA_AVX512 = 2, /* AVX-512 F, BW, VL (+ FMA, F16C) */
  FD_CPU_ISA_AVX512_BF16 = 3, /* and AVX-512 BF16: bf16 scores by vdpbf16ps (AMD only:
                                 fd_cpu_isa_detect) */
  FD_CPU_ISA_AMX = 4 /* AVX-512 + AVX-512 BF16 + AMX-BF16: bf16 (and fp8) caches' q.K and
                        P.V on tiles (cpu_simd_amx.h); the OS must grant the tile state */
} fd_cpu_isa;

/* Keys per kernel call (the key block). */
#define FD_CPU_KEY_BLOCK 32
/* Query rows per kernel call, at most. */
#define FD_CPU_MAX_ROWS 64
/* Query rows of one pass (all its heads together), at most: what a
 * small_softmax call may get. */
#define FD_CPU_PASS_ROWS 256
/* Keys per call of the small_* steps, at most (a multiple of 32). */
#define FD_CPU_SMALL_BLOCK 256

/*
 * One key block of one kv head, for `rows` query rows of its group: the
 * online-softmax step of FlashAttention-2, in two calls. For every row r
 * that sees n = count ? count[r] : num_keys keys of the block (n > 0; keys
 * 0 .. n-1):
 *
 *   scores:  s_j   = scale * dot(q[r], key j)                  j < n
 *            m'    = max(m[r], max_j s_j)
 *            alpha[r] = exp(m[r] - m')                         (0 when m[r] = -inf)
 *            p[r][j]  = exp(s_j - m')  (into scratch; 0 for j >= n)
 *            l[r]  = alpha[r] * l[r] + sum_j p[r][j];   m[r] = m'
 *   values:  acc[r] = alpha[r] * acc[r] + sum_{j < n} p[r][j] * value j
 *
 * Rows with n == 0 are left as they are (alpha[r] = 1). The driver may run
 * the scores of several heads before their values (each head has its own
 * scratch and alpha). q holds the query as given, widened exactly to float.
 * acc rows are in natural column order, except with kernels whose `paired`
 * is set, for bf16 and head_dim a multiple of 32: then each 32 columns
 * 32c .. 32c+31 are held as the 16 even ones then the 16 odd ones
 * (fd_cpu_unpair_row restores the order).
 *
 * Key j is at (const char *)keys[j] + key_off (head_dim elements of the
 * plan's dtype), value j at (const char *)values[j] + value_off: the block's
 * pointers are those of the pass's first kv head, the offsets select this
 * head, so every head of a pass shares one pointer array. Both arrays are
 * padded to a multiple of 32 entries: entries num_keys .. (num_keys rounded
 * up to 32) - 1 repeat the last key's (a kernel may read them and discard
 * what it computes).
 *
 * Scratch rows are `stride` floats apart: FD_CPU_KEY_BLOCK for `scores`;
 * for `values` and the small_* steps below a multiple of 32 up to
 * FD_CPU_SMALL_BLOCK, and num_keys <= stride (longer blocks: fewer
 * reductions and calls per key). A `values` call over several key blocks
 * takes their p already relative to one max (the caller rescales them) and
 * one alpha per row.
 */
typedef struct fd_cpu_block {
  const float *q;            /* [rows][head_dim] query rows */
  float *acc;                /* [rows][head_dim] unnormalised output, in/out */
  float *m;                  /* [rows] running max of the scores, in/out */
  float *l;                  /* [rows] running sum of exp(s - m), in/out */
  float *alpha;              /* [rows] scores -> values: the rescale factors */
  float *scratch;            /* [rows][stride] scores -> values: p */
  const int *count;          /* [rows] keys of the block each row sees, or NULL: all */
  const void *const *keys;   /* [num_keys padded], see above */
  const void *const *values; /* [num_keys padded] */
  ptrdiff_t key_off, value_off; /* bytes */
  ptrdiff_t key_step, value_step; /* bytes from key (value) j to j + 1 within each run of
                                     16 entries (16 i .. 16 i + 15; the runs may lie
                                     anywhere) when every run is evenly spaced by it
                                     (num_keys a multiple of 32: no padding entries), else
                                     0 (a hint: kernels may ignore it) */
  const int *first;          /* [rows] first key of the block each row sees (keys
                                before it are masked: a sliding window), or NULL: 0 */
  const uint64_t *tree;      /* [rows] tree masks (row_keys.h), or NULL: key j of the
                                block is draft key j - tree_off; a draft key whose bit
                                is clear is masked */
  int tree_off;              /* the block index of draft key 0 (may be < 0 or past
                                the block) */
  const void *qt;            /* the rows of q as the kernels' pack_q wrote them, or
                                NULL (not packed: the kernel reads q) */
  const void *const *rope;   /* [num_keys padded] or NULL: for kernels with rope_keys and
                                with qt set, the scores read key j's last rope_dim
                                columns at (const char *)rope[j] + rope_off and its
                                first head_dim - rope_dim at keys[j] + key_off (MLA's
                                rope part in its own cache; padded as keys) */
  ptrdiff_t rope_off, rope_step; /* bytes; rope_step: as key_step, for rope */
  int rope_dim;              /* columns read through rope (% 32 == 0), with rope set */
  const void *const *next;   /* rows the step asks L1 for while it runs (the driver's
                                next call's, kernels with spreads_next), or NULL */
  ptrdiff_t next_off;        /* bytes: row j is at (const char *)next[j] + next_off */
  int next_n, next_bytes;    /* rows, bytes of each */
  const char *ahead[2];      /* up to two byte ranges (NULL: none) that the AMX steps ask
                                L2 for one 64-byte line at a time, evenly through their
                                work (fd_cpu_prefetch_ahead): a later call's rows, still
                                in memory, fetched while this call computes */
  ptrdiff_t ahead_bytes[2];

  float scale;               /* softmax_scale */
  float soft_cap;            /* logits_soft_cap: s = cap * tanh(s / cap); 0 = off */
  int rows, num_keys, head_dim; /* rows 1..FD_CPU_MAX_ROWS, num_keys 1..stride */
  int stride;                /* floats from one scratch row to the next, see above */
} fd_cpu_block;

typedef void (*fd_cpu_step_fn)(const fd_cpu_block *blk);

/* The variants' step between the scores and the online softmax, on row r's
 * n scaled scores s[0..n): the soft-cap, then the window's mask (keys before
 * first[r] get -inf; the driver makes first[r] < n or n = 0, so every row
 * that reaches the softmax keeps a finite score), then the tree mask (draft
 * keys whose bit is clear get -inf; the driver makes n = 0 for a row that
 * sees none of the block's keys). Every kernel calls it
 * (fd_cpu_adjust_scores) after writing scores and before their max. */
static inline void fd_cpu_adjust_row(const fd_cpu_block *b, int r, float *s, int n) {
  if (b->soft_cap > 0.0f) {
    const float cap = b->soft_cap, inv = 1.0f / b->soft_cap;
    for (int j = 0; j < n; j++) s[j] = cap * tanhf(s[j] * inv);
  }
  if (b->first) {
    const int f = b->first[r] < n ? b->first[r] : n;
    for (int j = 0; j < f; j++) s[j] = -INFINITY;
  }
  if (b->tree) { /* draft keys the row's mask hides (the driver keeps one key it sees) */
    const uint64_t mask = b->tree[r];
    for (int j = b->tree_off > 0 ? b->tree_off : 0; j < n; j++)
      if (!((mask >> (j - b->tree_off)) & 1u)) s[j] = -INFINITY;
  }
}

/* fd_cpu_adjust_row for every row of the block (scratch rows `stride` apart). */
static inline void fd_cpu_adjust_scores(const fd_cpu_block *b, int stride) {
  if (b->soft_cap == 0.0f && !b->first && !b->tree) return;
  for (int r = 0; r < b->rows; r++) {
    const int n = b->count ? b->count[r] : b->num_keys;
    if (n > 0) fd_cpu_adjust_row(b, r, b->scratch + (ptrdiff_t)r * stride, n);
  }
}

/* The last step of a row: out = acc * *scale and lse from the row's running
 * max m and sum l (NaN m or l: NaN scale and lse), with the attention sink
 * (has_sink) joining the sum:
 * M = max(m, sink), L = l e^(m - M) + e^(sink - M), scale = e^(m - M) / L,
 * lse = M + ln L. A row without keys (l = 0) gets scale 0 and lse = sink
 * (-inf without a sink); a NaN or +inf sink gives NaN (scale and lse). */
static inline void fd_cpu_finish_row(double m, double l, int has_sink, double sink, double *scale,
                                     double *lse) {
  if (isnan(m) || isnan(l)) { /* a blow-up (NaN in the inputs, an overflowing score) */
    *scale = NAN;
    *lse = NAN;
    return;
  }
  if (!has_sink) {
    *scale = l > 0.0 ? 1.0 / l : 0.0;
    *lse = l > 0.0 ? m + log(l) : -INFINITY;
    return;
  }
  if (isnan(sink) || sink == INFINITY) {
    *scale = NAN;
    *lse = NAN;
    return;
  }
  if (!(l > 0.0)) m = -INFINITY, l = 0.0;
  const double M = m > sink ? m : sink;
  if (M == -INFINITY) { /* no key, sink -inf */
    *scale = 0.0;
    *lse = -INFINITY;
    return;
  }
  const double a = m == -INFINITY ? 0.0 : exp(m - M);
  const double L = l * a + exp(sink - M);
  *scale = a / L;
  *lse = M + log(L);
}

typedef struct fd_cpu_kernels {
  fd_cpu_step_fn scores; /* scores and online softmax */
  fd_cpu_step_fn values; /* weighted sum of the values */
  int paired; /* acc in the paired order (see above) for bf16, head_dim % 32 == 0 */
  /*
   * Optional (small_head_dim 0: none), for head_dim <= small_head_dim: the
   * same step in three calls, over longer key blocks (stride up to
   * FD_CPU_SMALL_BLOCK). At small head_dims the per-row work of the online
   * softmax (reductions, the exp of alpha) and each call's set-up outweigh
   * the dot products; longer blocks pay them once per more keys, and one
   * softmax call for every head of a pass lets the rows' chains overlap.
   * small_scores writes s_j = scale * dot(q[r], key j) into scratch for
   * j < num_keys (what it writes past a row's n is ignored); small_softmax
   * does the rest of `scores` on those (m, l, alpha, p), for blk->rows up to
   * FD_CPU_PASS_ROWS, reading no key (q, keys, values NULL); small_values
   * is `values`. acc rows are in natural column order.
   */
  fd_cpu_step_fn small_scores, small_softmax, small_values;
  int small_head_dim;
  /*
   * Optional (NULL: none): packs the `rows` query rows q [rows][head_dim]
   * (float) into dst (64-byte aligned), at most `cap` bytes, in the layout
   * the kernels' scores step reads through fd_cpu_block.qt (the driver packs
   * once per pass, not per key block). Returns the bytes used, a multiple of
   * 64; 0 when the rows cannot be packed exactly or do not fit (the kernels
   * then read q).
   */
  size_t (*pack_q)(const float *q, int rows, int head_dim, void *dst, size_t cap);
  /* Optional (NULL: none): what a thread calls before its first kernel call
   * of a run (the AMX kernels configure the tiles; the steps need it), and
   * after its last (they release the tile state). */
  void (*start)(void);
  void (*finish)(void);
  /* 1: the steps prefetch fd_cpu_block.next themselves, a part at a time
   * through their work (fd_cpu_prefetch_next), so that waits for fill
   * buffers overlap the work instead of preceding it; 0: the driver
   * prefetches before the call. */
  int spreads_next;
  /* 1: the scores step reads fd_cpu_block.rope (where the driver packed q
   * with pack_q); 0: keys hold all head_dim columns. */
  int rope_keys;
} fd_cpu_kernels;

/* fd_cpu_block.key_step / value_step of the n rows rows[0 .. n): the bytes
 * from row j to row j + 1 when each run of 16 rows (16 i .. 16 i + 15) is
 * evenly spaced by that (a contiguous cache; a paged one whose pages of 16
 * or more keys the runs do not cross) and n is a multiple of 32 (no padding
 * entries), else 0. even: the rows are known to be evenly spaced (a
 * contiguous cache's), so only the first two are read. */
static inline ptrdiff_t fd_cpu_even_step(const void *const *rows, int n, int even) {
  if (n % 32 != 0) return 0;
  const ptrdiff_t step = (const char *)rows[1] - (const char *)rows[0];
  for (int j = 2; !even && j < n; j++)
    if (j % 16 != 0 && (const char *)rows[j] - (const char *)rows[j - 1] != step) return 0;
  return step;
}

/* Asks L1 for part `part` of `parts` of the rows b->next (none when NULL). */
static inline void fd_cpu_prefetch_next(const fd_cpu_block *b, int part, int parts) {
  if (!b->next) return;
  const int j1 = (int)((int64_t)b->next_n * (part + 1) / parts);
  for (int j = (int)((int64_t)b->next_n * part / parts); j < j1; j++)
    for (int x = 0; x < b->next_bytes; x += 64)
      __builtin_prefetch((const char *)b->next[j] + b->next_off + x, 0, 3);
}

/* A kernel call's walk over b->ahead: `parts` calls of fd_cpu_ahead_step
 * spread through its work ask L2 (prefetcht2) for every line of the ranges
 * once, the same number of lines each (the last ones may ask for none). */
typedef struct fd_cpu_ahead {
  const char *at[2]; /* the next line to ask for */
  ptrdiff_t left[2]; /* bytes of lines not yet asked for (0 for no range) */
  ptrdiff_t per[2];  /* bytes a step */
} fd_cpu_ahead;

static inline fd_cpu_ahead fd_cpu_ahead_init(const fd_cpu_block *b, int parts) {
  fd_cpu_ahead a;
  for (int i = 0; i < 2; i++) {
    const ptrdiff_t lines = b->ahead[i] ? (b->ahead_bytes[i] + 63) / 64 : 0;
    a.at[i] = b->ahead[i];
    a.left[i] = 64 * lines;
    a.per[i] = 64 * ((lines + parts - 1) / (parts > 0 ? parts : 1));
  }
  return a;
}

static inline void fd_cpu_ahead_step(fd_cpu_ahead *a) {
  for (int i = 0; i < 2; i++) {
    const ptrdiff_t n = a->per[i] < a->left[i] ? a->per[i] : a->left[i];
    if (n <= 0) continue;
    for (ptrdiff_t x = 0; x < n; x += 64) __builtin_prefetch(a->at[i] + x, 0, 1);
    a->at[i] += n;
    a->left[i] -= n;
  }
}

/* 1 when acc rows of `k` for dtype and head_dim are in the paired order. */
static inline int fd_cpu_acc_paired(const fd_cpu_kernels *k, fd_dtype dtype, int head_dim) {
  return k->paired && dtype == FD_DTYPE_BF16 && head_dim % 32 == 0;
}

/* dst = src with the paired order undone: src[32c + j] is column 32c + 2j,
 * src[32c + 16 + j] column 32c + 2j + 1 (j < 16). head_dim % 32 == 0. */
static inline void fd_cpu_unpair_row(float *dst, const float *src, int head_dim) {
  for (int c = 0; c < head_dim; c += 32)
    for (int j = 0; j < 16; j++) {
      dst[c + 2 * j] = src[c + j];
      dst[c + 2 * j + 1] = src[c + 16 + j];
    }
}

/* The instruction set fd_run takes by default: the best this machine (and
 * build) has, AVX-512 BF16 without AMX only on AMD; AMX where the CPU has
 * AMX-BF16 and the OS grants this process the tile state. */
fd_cpu_isa fd_cpu_isa_detect(void);
/* The widest set this machine can run (AVX-512 BF16 wherever the CPU has
 * it): what FD_CPU_ISA and fd_cpu_run_isa may force. */
fd_cpu_isa fd_cpu_isa_available(void);

/* Kernels of `isa` for `dtype` into *k. Returns 0 when this build has no
 * kernels for isa (non-x86), 1 otherwise. Does not check the machine. */
int fd_cpu_kernels_get(fd_cpu_isa isa, fd_dtype dtype, fd_cpu_kernels *k);

/* One getter per instruction set (cpu_kernels_*.c); same contract. */
int fd_cpu_kernels_scalar(fd_dtype dtype, fd_cpu_kernels *k);
int fd_cpu_kernels_avx2(fd_dtype dtype, fd_cpu_kernels *k);
int fd_cpu_kernels_avx512(fd_dtype dtype, fd_cpu_kernels *k);
int fd_cpu_kernels_avx512_bf16(fd_dtype dtype, fd_cpu_kernels *k);
int fd_cpu_kernels_amx(fd_dtype dtype, fd_cpu_kernels *k);

/* fd_cpu_run with the instruction set forced (tests run every one).
 * FD_STATUS_UNSUPPORTED when the machine or the build lacks it. */
fd_status fd_cpu_run_isa(const fd_plan *plan, const fd_tensors *t, void *workspace,
                         fd_cpu_isa isa, fd_error *err);

/* fp8 caches (cpu_fp8.c). lut[i] = the value of code i of `dtype` (E4M3 or
 * E5M2). */
void fd_cpu_fp8_table(fd_dtype dtype, float lut[256]);
/* dst [n][head_dim] = lut[code] * (scales ? scales[j] : scale) for the
 * head_dim codes at (const uint8_t *)rows[j] + off, j < n: one rounding to
 * float32 per element, the same bits whichever isa (AVX2 + F16C from
 * FD_CPU_ISA_AVX2 on, e4m3 with AVX-512 BW from FD_CPU_ISA_AVX512; e5m2: the
 * codes are E5M2's, else E4M3's). */
void fd_cpu_widen_fp8(float *dst, const void *const *rows, ptrdiff_t off, int n, int head_dim,
                      const float *lut, const float *scales, float scale, fd_cpu_isa isa,
                      int e5m2);

/* lut16[i] = the bf16 bits of lut[i] (exact for fp8 values). */
void fd_cpu_fp8_table_bf16(const float lut[256], uint16_t lut16[256]);
/* dst [n][head_dim] = the bf16 bits of the head_dim codes at (const uint8_t
 * *)rows[j] + off, j < n, unscaled (exact; the same bits whichever isa). */
void fd_cpu_widen_fp8_bf16(uint16_t *dst, const void *const *rows, ptrdiff_t off, int n,
                           int head_dim, const uint16_t *lut16, fd_cpu_isa isa, int e5m2);

/* Adds a key block's float sums (acc [all_rows][head_dim], l, relative to
 * the running max m) into the double ones (outer, l_out, relative to m_out),
 * then clears the float sums and moves m_out to m (cpu_decode.c). */
/* Writes one query row's result of one split: out and lse when the plan has
 * one split, else its partial (cpu_decode.c; `natural` NULL when `a` is in
 * column order already). */
void fd_cpu_emit_row(const fd_plan *plan, const fd_tensors *t, float *partial_o,
                     float *partial_ml, int32_t b, int hq, int tok, int32_t split, float *natural,
                     float *a, float m, double l, int has_sink, double sink);
void fd_cpu_fold(float *acc, float *l, const float *m, double *outer, double *l_out, float *m_out,
                 int all_rows, int head_dim, fd_cpu_isa isa);

/* MLA (rope_dim > 0) on instruction set `isa` (cpu_mla.c): fd_cpu_run's
 * contract. */
fd_status fd_cpu_mla_run(const fd_plan *plan, const fd_tensors *t, void *workspace,
                         fd_cpu_isa isa, fd_error *err);

/* dst[i] = src[i] widened to float32, i < n. src: [n] elements of dtype. */
static inline void fd_cpu_load_row(float *dst, const void *src, fd_dtype dtype, int n) {
  if (dtype == FD_DTYPE_F32) {
    const float *s = (const float *)src;
    for (int i = 0; i < n; i++) dst[i] = s[i];
  } else if (dtype == FD_DTYPE_F16) {
    const uint16_t *s = (const uint16_t *)src;
    for (int i = 0; i < n; i++) dst[i] = fd_f16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src;
    for (int i = 0; i < n; i++) dst[i] = fd_bf16_to_f32(s[i]);
  }
}

/* dst[i] = src[i] narrowed to dtype (round to nearest even), i < n. */
static inline void fd_cpu_store_row(void *dst, fd_dtype dtype, const float *src, int n) {
  if (dtype == FD_DTYPE_F32) {
    float *o = (float *)dst;
    for (int i = 0; i < n; i++) o[i] = src[i];
  } else if (dtype == FD_DTYPE_F16) {
    uint16_t *o = (uint16_t *)dst;
    for (int i = 0; i < n; i++) o[i] = fd_f32_to_f16(src[i]);
  } else {
    uint16_t *o = (uint16_t *)dst;
    for (int i = 0; i < n; i++) o[i] = fd_f32_to_bf16(src[i]);
  }
}

#endif /* FD_CPU_KERNELS_H */
