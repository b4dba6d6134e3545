/*
 * cpu_decode.c — the CPU backend's split step: fd_cpu_run.
 *
 * Work items are (sequence b, split s, kv head hk), in that order, so that
 * consecutive items of one (b, s) are neighbouring heads of the same cache
 * positions. Every OpenMP thread takes one contiguous range of items, cut by
 * their key counts (so ragged batches balance), and runs the heads of each
 * (b, s) in its range together, key block by key block: one pass over a
 * block of FD_CPU_KEY_BLOCK positions reads the rows of all its heads, which
 * in a [position][head][head_dim] cache lie side by side: the keys of all
 * heads, then their values, then the next block. So each thread sweeps
 * through contiguous memory instead of gathering one head's rows at a
 * head-count stride, and the hardware prefetchers follow it (software
 * prefetches measured no better).
 *
 * For one head and key block, the kernel (cpu_kernels_*.c) runs
 * FlashAttention's online softmax in float32 for every query row of the
 * head's group (num_heads_q / num_heads_kv heads times q_len tokens), so each
 * key and value is read once per item. Groups too large for a pass are cut
 * into row tiles (bounded stack buffers). Small head_dims (kernels with
 * small_* steps) take longer key blocks, up to FD_CPU_SMALL_BLOCK, and one
 * softmax call for all heads of a pass.
 *
 * Tree masks (fd_problem.tree_mask): rows keep sharing every key block; a
 * row's keys end at its highest draft bit (fd_tree_row_keys), a block holding
 * draft keys gets the rows' masks (the kernels give hidden keys a score of
 * -inf, fd_cpu_adjust_row), and a row that sees none of a block's keys gets
 * count 0 there. Blocks of prefix keys run exactly as without a mask.
 *
 * fp8 caches (kv_dtype E4M3 / E5M2): before each kernel call the driver
 * widens the head's keys (or values) of the block into a buffer on the
 * thread's stack (cpu_fp8.c; the widening is exact): float32 times each
 * key's scale for per-token scales, else bf16 codes with the scale folded
 * into the score scale and the output, and runs the kernels of that type on
 * it. When the pass's heads sit side by side in each position's row (the
 * usual [.., heads, head_dim] layout) and their block fits 64 KB, the bf16
 * widening reads each row once for all heads before the heads' calls, not
 * in a strided pass a head, and the kernel calls between two widenings
 * prefetch the next one's rows. The query rows are widened from fp16/bf16 as
 * always.
 *
 * num_splits == 1: the item writes normalised out and lse. Otherwise it writes
 * its unnormalised partial (O, m, l) into the workspace and fd_cpu_combine
 * (cpu_combine.c) merges them. Every item's arithmetic is sequential and
 * independent of the thread that runs it and of the heads it is run with, so
 * results are bitwise reproducible for any thread count.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "row_keys.h"
#include "split.h"

/* Key blocks (FD_CPU_KEY_BLOCK) summed in float32 before fd_cpu_fold adds
 * them into the double sums (the small steps' longer blocks: every block). */
#define FD_CPU_FOLD_BLOCKS 4
/* Floats of q in one pass: heads * rows * head_dim (as many accumulators). */
#define FD_CPU_PASS_FLOATS 4096
/* Bytes of q packed by the kernels' pack_q for one pass (a pass whose heads
 * need more runs unpacked: the AMX packing of 4096 floats in two bf16
 * pieces, 64-byte headers and row-chunk padding stays below it). */
#define FD_CPU_QT_BYTES (40 * 1024)
/* A work item's cost beyond its keys, in keys (set-up, outputs). */
#define FD_CPU_ITEM_OVERHEAD 32.0

/* What every work item of a call reads. */
typedef struct cpu_call {
  const fd_plan *plan;
  const fd_tensors *t;
  fd_cpu_kernels kernels;
  size_t elem_size;   /* bytes per element of q */
  size_t kv_elem_size; /* bytes per element of k, v (kv_dtype) */
  fd_dtype kernel_dtype; /* the kernels' K/V dtype: kv_dtype; fp8: BF16 (widened unscaled,
                            scales folded) without per-token scales, else F32 (widened
                            times the scales) */
  const float *fp8_lut; /* fp8 caches: [256] the values of the kv_dtype's codes, else NULL */
  const uint16_t *fp8_lut16; /* fp8 widened to bf16: [256] the codes' bf16 bits */
  fd_cpu_isa isa;       /* the instruction set the call runs */
  float *partial_o;   /* [rows][num_splits][head_dim], NULL when num_splits == 1 */
  float *partial_ml;  /* [rows][num_splits][2], NULL when num_splits == 1 */
  int group_rows;     /* query rows of one kv head: group * q_len */
  int heads_per_pass; /* kv heads run together */
  int tile_rows;      /* rows per head in a pass (group_rows unless it needs tiles) */
  int small;          /* run the kernels' small_* steps (head_dim <= small_head_dim) */
  int prefetch_next;  /* before each kernel call, prefetch the next call's rows (16-bit
                         and fp8 caches: a call's own loads then hit L1; measured faster
                         there, not for float32) */
  int block;          /* keys per kernel call: FD_CPU_KEY_BLOCK, longer for the small steps */
} cpu_call;

/* Address of position j of sequence b, kv head hk, in a K or V cache with
 * `strides` (contiguous {batch, position, head}; paged {page, position, head}
 * through the block table). */
static const char *kv_row(const cpu_call *c, const void *cache, const int64_t strides[3],
                          int32_t b, int32_t j, int32_t hk) {
  const int32_t page_size = c->plan->problem.page_size;
  int64_t off;
  if (page_size == 0) {
    off = (int64_t)b * strides[0] + (int64_t)j * strides[1] + (int64_t)hk * strides[2];
  } else {
    const int32_t page = c->t->block_table[(int64_t)b * c->t->block_table_stride + j / page_size];
    off = (int64_t)page * strides[0] + (int64_t)(j % page_size) * strides[1] +
          (int64_t)hk * strides[2];
  }
  return (const char *)cache + off * (int64_t)c->kv_elem_size;
}

/* rows[j] = the row of position j0 + j, head hk, of sequence b, j < n: in a
 * contiguous cache first + (j0 + j) * pos (first: position 0's row, pos: the
 * bytes between positions), in a paged one through the block table. */
static void block_rows(const cpu_call *c, const void *cache, const int64_t strides[3],
                       const char *first, ptrdiff_t pos, int32_t b, int32_t j0, int n, int32_t hk,
                       const void **rows) {
  for (int j = 0; j < n; j++)
    rows[j] = c->plan->problem.page_size == 0 ? first + (ptrdiff_t)(j0 + j) * pos
                                              : kv_row(c, cache, strides, b, j0 + j, hk);
}

/* *blk = the block of head h of a pass: `pass` describes head 0, whose
 * arrays continue with those of the next heads ([heads][rows]...; count too,
 * when set); k_head / v_head: bytes from one kv head's row to the next.
 * (Written in place: a returned copy cost store-forwarding stalls.) */
static void head_block(fd_cpu_block *blk, const fd_cpu_block *pass, int h, int rows,
                       ptrdiff_t k_head, ptrdiff_t v_head, const void *const *qt) {
  *blk = *pass;
  blk->qt = qt ? qt[h] : NULL;
  blk->q += (ptrdiff_t)h * rows * pass->head_dim;
  blk->acc += (ptrdiff_t)h * rows * pass->head_dim;
  blk->m += h * rows;
  blk->l += h * rows;
  blk->alpha += h * rows;
  blk->scratch += (ptrdiff_t)h * rows * pass->stride;
  if (blk->count) blk->count += h * rows;
  if (blk->first) blk->first += h * rows;
  blk->key_off = h * k_head;
  blk->value_off = h * v_head;
}

/* The widened fp8 block's buffer, 64 KB: one head's block in float32
 * (c->block * head_dim <= 32 x 256 floats) or every head's in bf16
 * (c->block * heads * head_dim <= FD_CPU_WIDE_ALL elements). */
#define FD_CPU_WIDE_FLOATS (FD_CPU_KEY_BLOCK * 512)
#define FD_CPU_WIDE_ALL (FD_CPU_WIDE_FLOATS * 2)

/* Points blk's keys (values with `values`) at the widened rows of one head's
 * block: wide holds blk->num_keys rows, `row` elements of `elem` bytes apart
 * (head_dim, or heads x head_dim when all heads were widened together);
 * wide_rows gets a row pointer per key, padded to 32 entries with the last
 * row (the kernel contract), and a whole 32-key block also gets its step. */
static void read_wide_rows(fd_cpu_block *blk, int values, const void *wide, ptrdiff_t row,
                           int elem, const void **wide_rows) {
  const int n = blk->num_keys;
  const int padded = (n + 31) & ~31;
  for (int j = 0; j < padded; j++)
    wide_rows[j] = (const char *)wide + (ptrdiff_t)(j < n ? j : n - 1) * row * elem;
  const ptrdiff_t step = n == 32 ? row * elem : 0;
  if (values) {
    blk->values = wide_rows;
    blk->value_off = 0;
    blk->value_step = step;
  } else {
    blk->keys = wide_rows;
    blk->key_off = 0;
    blk->key_step = step;
  }
}

/* bf16 codes of an fp8 cache: kv head hk's k_scale (per tensor or head)
 * folded into blk's score scale. */
static void fold_key_scale(const cpu_call *c, fd_cpu_block *blk, int hk) {
  const fd_plan *plan = c->plan;
  if (plan->problem.kv_scale != FD_KV_SCALE_NONE)
    blk->scale = plan->softmax_scale *
                 c->t->k_scale[plan->problem.kv_scale == FD_KV_SCALE_HEAD ? hk : 0];
}

/* fp8 caches: blk (head_block's, kv head hk) reads head hk's keys (values
 * with `values`) of the block at keys j0 .. j0 + blk->num_keys - 1 of
 * sequence b widened to float32 times their scales in wide[], through
 * wide_rows (padded to 32 entries as the kernel contract asks). */
static void widen_block(const cpu_call *c, fd_cpu_block *blk, int values, int32_t b, int32_t j0,
                        int hk, float *wide, const void **wide_rows) {
  const fd_plan *plan = c->plan;
  const fd_tensors *t = c->t;
  const int n = blk->num_keys, head_dim = plan->problem.head_dim;
  const float *scale = values ? t->v_scale : t->k_scale;
  const int e5m2 = plan->problem.kv_dtype == FD_DTYPE_E5M2;
  if (c->kernel_dtype == FD_DTYPE_BF16) {
    /* unscaled bf16 codes; k_scale folds into the score scale here, v_scale
     * into the output (run_pass) */
    uint16_t *w16 = (uint16_t *)wide;
    fd_cpu_widen_fp8_bf16(w16, values ? blk->values : blk->keys,
                          values ? blk->value_off : blk->key_off, n, head_dim, c->fp8_lut16,
                          c->isa, e5m2);
    read_wide_rows(blk, values, w16, head_dim, 2, wide_rows);
    if (!values) fold_key_scale(c, blk, hk);
    return;
  }
  float s = 1.0f, token[FD_CPU_SMALL_BLOCK];
  const float *per_token = NULL;
  switch (plan->problem.kv_scale) {
    case FD_KV_SCALE_NONE: break;
    case FD_KV_SCALE_TENSOR: s = scale[0]; break;
    case FD_KV_SCALE_HEAD: s = scale[hk]; break;
    case FD_KV_SCALE_TOKEN:
      for (int j = 0; j < n; j++)
        token[j] = scale[fd_scale_index(plan, t->block_table, t->block_table_stride,
                                        t->scale_strides, b, j0 + j, hk)];
      per_token = token;
      break;
  }
  fd_cpu_widen_fp8(wide, values ? blk->values : blk->keys, values ? blk->value_off : blk->key_off, n,
                   head_dim, c->fp8_lut, per_token, s, c->isa, e5m2);
  read_wide_rows(blk, values, wide, head_dim, 4, wide_rows);
}

/* Asks L1 for the `bytes` bytes at rows[j] + off, j < n. */
static void prefetch_rows(const void *const *rows, ptrdiff_t off, int n, int bytes) {
  for (int j = 0; j < n; j++)
    for (int x = 0; x < bytes; x += 64) __builtin_prefetch((const char *)rows[j] + off + x, 0, 3);
}

/* What the kernel call of head h (of `heads`; step 0: scores, 1: values) of
 * a key block asks the cache for, for the calls after it: head h + 1's rows
 * of this step; after the last head's scores head 0's values; kernels that
 * spread the prefetches through their work (spreads_next) also get, after
 * the last head's values, the next block's keys of head 0 (contiguous and
 * paged caches; before the kernels spread them: measured no faster). Heads widened
 * together (row_heads, fp8) were read before the first head's call: each
 * head's call asks for its part of the next widening's rows instead (the
 * block's values, then the next block's keys), so that the widening finds
 * them in cache (its own loads would wait on memory with nothing to overlap).
 * keys, values: the block's nb rows of head 0; next_keys: the next block's
 * next_nb rows of head 0; k_head, v_head: the bytes between heads. */
static void ask_next(const cpu_call *c, fd_cpu_block *blk, int step, int h, int heads,
                     int row_heads, const void *const *keys, const void *const *values, int nb,
                     const void *const *next_keys, int next_nb, ptrdiff_t k_head,
                     ptrdiff_t v_head) {
  const void *const *next = NULL;
  ptrdiff_t next_off = 0;
  int next_n = nb;
  if (row_heads) {
    if (step == 0)
      next = values, next_off = v_head * h;
    else if (next_nb > 0)
      next = next_keys, next_n = next_nb, next_off = k_head * h;
  } else if (h + 1 < heads) {
    next = step ? values : keys, next_off = (step ? v_head : k_head) * (h + 1);
  } else if (step == 0) {
    next = values;
  } else if (c->kernels.spreads_next && next_nb > 0) {
    next = next_keys, next_n = next_nb;
  }
  if (!next) return;
  const int bytes = c->plan->problem.head_dim * (int)c->kv_elem_size;
  if (c->kernels.spreads_next) {
    blk->next = next;
    blk->next_off = next_off;
    blk->next_n = next_n;
    blk->next_bytes = bytes;
  } else {
    prefetch_rows(next, next_off, next_n, bytes);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FD_FOLD_AVX512 1
/* o[d] = o[d] * f + a[d], then a[d] = 0, for d < n (a multiple of 8), 8
 * doubles a step: the scalar loop's arithmetic (a product rounded, then a
 * sum), so the same bits. */
__attribute__((target("avx512f"))) static void fold_row_avx512(double *o, float *a, double f,
                                                               int n) {
  const __m512d fv = _mm512_set1_pd(f);
  for (int d = 0; d < n; d += 8) {
    const __m512d x = _mm512_cvtps_pd(_mm256_loadu_ps(a + d));
    _mm512_storeu_pd(o + d, _mm512_add_pd(_mm512_mul_pd(_mm512_loadu_pd(o + d), fv), x));
    _mm256_storeu_ps(a + d, _mm256_setzero_ps());
  }
}
#endif

/* Adds a key block's float sums (acc, l, relative to the running max m) into
 * the double ones (outer, l_out, relative to m_out), then clears the float
 * sums and moves m_out to m. Rows without a key yet (m = -inf, l = 0) are
 * left; all-NaN scores leave m = -inf with l = NaN, which is folded. isa:
 * the run's instruction set (AVX-512 folds 8 doubles a step). */
void fd_cpu_fold(float *acc, float *l, const float *m, double *outer, double *l_out, float *m_out,
                 int all_rows, int head_dim, fd_cpu_isa isa) {
  (void)isa;
  for (int i = 0; i < all_rows; i++) {
    if (m[i] == -INFINITY && l[i] == 0.0f) continue; /* (a NaN l with m = -inf is folded) */
    /* m_out = -inf (the first fold): nothing to rescale; m_out <= m else */
    const double f = m_out[i] == -INFINITY ? 0.0 : exp((double)m_out[i] - (double)m[i]);
    double *o = outer + (ptrdiff_t)i * head_dim;
    float *a = acc + (ptrdiff_t)i * head_dim;
    int d = 0;
#ifdef FD_FOLD_AVX512
    if (isa >= FD_CPU_ISA_AVX512) {
      d = head_dim & ~7;
      fold_row_avx512(o, a, f, d);
    }
#endif
    for (; d < head_dim; d++) {
      o[d] = o[d] * f + (double)a[d];
      a[d] = 0.0f;
    }
    l_out[i] = l_out[i] * f + (double)l[i];
    l[i] = 0.0f;
    m_out[i] = m[i];
  }
}

/* One pass: kv heads [h0, h0 + heads) of sequence b, rows [row0, row0 + rows)
 * of each head's group, over the keys [begin, end) of split `split`. Local
 * row r of head h0 + h is query head (h0 + h) * group + (row0 + r) / q_len,
 * token (row0 + r) % q_len. */
/* Emits one query row's sums of one split: `a` [head_dim] the row's output
 * sums (column-paired when `natural` is given, which then receives them in
 * column order), m its max, l its sum. A non-finite output (NaN or Inf in a
 * value the row sees) makes the row's sum NaN, so its lse shows the blow-up
 * too. The only split (num_splits == 1): normalised (the sink joins the sum)
 * and written to out and lse in double exactly as fd_cpu_combine does for
 * one split, so a sequence's bits do not depend on the plan's split count
 * when its keys fit one split (the deterministic mode). Otherwise a partial:
 * rows that saw no key write the neutral (-inf, 0, 0). */
void fd_cpu_emit_row(const fd_plan *plan, const fd_tensors *t, float *partial_o,
                     float *partial_ml, int32_t b, int hq, int tok, int32_t split, float *natural,
                     float *a, float m, double l, int has_sink, double sink) {
  const fd_problem *p = &plan->problem;
  const int head_dim = p->head_dim, q_len = p->q_len, num_splits = plan->num_splits;
  if (natural) {
    fd_cpu_unpair_row(natural, a, head_dim);
    a = natural;
  }
  float row_l = (float)l;
  for (int d = 0; d < head_dim; d++)
    if (!isfinite(a[d])) row_l = NAN;
  if (num_splits == 1) {
    double f, lse;
    fd_cpu_finish_row(m, row_l, has_sink, sink, &f, &lse);
    for (int d = 0; d < head_dim; d++) a[d] = (float)((double)a[d] * f);
    if (t->lse)
      t->lse[(int64_t)b * t->lse_strides[0] + (int64_t)hq * t->lse_strides[1] +
             (int64_t)tok * t->lse_strides[2]] = (float)lse;
    const int64_t out_off = (int64_t)b * t->out_strides[0] + (int64_t)tok * t->out_strides[1] +
                            (int64_t)hq * t->out_strides[2];
    fd_cpu_store_row((char *)t->out + out_off * (int64_t)fd_dtype_size(p->out_dtype),
                     p->out_dtype, a, head_dim);
    return;
  }
  const int64_t slot = (((int64_t)b * p->num_heads_q + hq) * q_len + tok) * num_splits + split;
  memcpy(partial_o + slot * head_dim, a, (size_t)head_dim * sizeof *a);
  partial_ml[slot * 2 + 0] = m;
  partial_ml[slot * 2 + 1] = row_l;
}

static void run_pass(const cpu_call *c, int32_t b, int32_t split, int32_t begin, int32_t end,
                     int h0, int heads, int row0, int rows) {
  const fd_plan *plan = c->plan;
  const fd_problem *p = &plan->problem;
  const fd_tensors *t = c->t;
  const int head_dim = p->head_dim, q_len = p->q_len;
  const int group = p->num_heads_q / p->num_heads_kv;
  const int32_t kv_len = t->kv_len[b];
  const int all_rows = heads * rows;

  /* (64-byte aligned: a vector store that splits a cache line does not
   * forward its data to the loads that follow it) */
  _Alignas(64) float q[FD_CPU_PASS_FLOATS];   /* [heads][rows][head_dim] */
  _Alignas(64) float acc[FD_CPU_PASS_FLOATS]; /* [heads][rows][head_dim] unnormalised output */
  _Alignas(64) float scratch[FD_CPU_PASS_ROWS * FD_CPU_KEY_BLOCK]; /* [heads][rows][c->block] */
  float m[FD_CPU_PASS_ROWS], l[FD_CPU_PASS_ROWS], alpha[FD_CPU_PASS_ROWS]; /* [heads][rows] */
  int32_t limit[FD_CPU_MAX_ROWS]; /* row r sees keys [lower[r], limit[r]) (all heads alike) */
  int32_t lower[FD_CPU_MAX_ROWS];
  int count[FD_CPU_PASS_ROWS];    /* [rows]; [heads][rows] for small_softmax */
  int first[FD_CPU_PASS_ROWS];    /* [rows] (window); [heads][rows] for the small steps */
  const void *keys[FD_CPU_SMALL_BLOCK], *values[FD_CPU_SMALL_BLOCK];
  const void *next_keys[FD_CPU_SMALL_BLOCK]; /* the next block's keys (<= c->block), for prefetches */
  /* fp8 caches: one head's keys or values of the block, widened, or (bf16
   * codes, heads side by side) every head's, widened in one pass */
  _Alignas(64) float wide[FD_CPU_WIDE_FLOATS];
  const void *wide_rows[FD_CPU_SMALL_BLOCK];

  /* Row r sees keys [lower[r], limit[r]) of the split (fd_row_keys,
   * row_keys.h: the same rule as the CUDA kernels and the reference). Keys
   * before the lowest lower bound are not read (tile_begin). */
  int32_t tile_end = begin, tile_begin = end;
  int windowed = 0; /* some row's lower bound is inside the keys read */
  /* tree masks (row_keys.h): each row's mask; the prefix keys are every
   * row's, so only blocks holding draft keys are masked */
  uint64_t tree[FD_CPU_MAX_ROWS];
  const int32_t prefix = kv_len - q_len; /* draft key 0 */
  for (int r = 0; r < rows; r++) {
    int lo, hi;
    if (p->tree_mask) {
      tree[r] = t->tree_mask[(int64_t)b * t->tree_mask_stride + (row0 + r) % q_len];
      fd_tree_row_keys(tree[r], q_len, kv_len, begin, end, &lo, &hi);
    } else {
      fd_row_keys((row0 + r) % q_len, q_len, kv_len, p->window_left, p->non_causal, begin, end,
                  &lo, &hi);
    }
    limit[r] = hi;
    lower[r] = lo;
    if (hi > lo && lo < tile_begin) tile_begin = lo;
    if (limit[r] > tile_end) tile_end = limit[r];
  }
  if (tile_begin > tile_end) tile_begin = tile_end;
  for (int r = 0; r < rows; r++) windowed |= limit[r] > lower[r] && lower[r] > tile_begin;
  /* q packed for the kernels' scores (pack_q), per head; qt_head NULL when
   * the kernels have no pack_q or some head's rows did not pack */
  _Alignas(64) unsigned char qt[FD_CPU_QT_BYTES];
  const void *qt_ptr[FD_CPU_PASS_ROWS];
  const void *const *qt_head = NULL;
  size_t qt_used = 0;
  int packed = c->kernels.pack_q != NULL;
  for (int h = 0; h < heads; h++) {
    float *qh = q + (ptrdiff_t)h * rows * head_dim;
    for (int r = 0; r < rows; r++) {
      const int hq = (h0 + h) * group + (row0 + r) / q_len, tok = (row0 + r) % q_len;
      const int64_t q_off = (int64_t)b * t->q_strides[0] + (int64_t)tok * t->q_strides[1] +
                            (int64_t)hq * t->q_strides[2];
      fd_cpu_load_row(qh + (ptrdiff_t)r * head_dim,
                      (const char *)t->q + q_off * (int64_t)c->elem_size, p->dtype, head_dim);
    }
    if (packed) {
      /* (GCC cannot see that the loop above wrote the rows pack_q reads) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
      const size_t n = c->kernels.pack_q(qh, rows, head_dim, qt + qt_used, sizeof qt - qt_used);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
      qt_ptr[h] = qt + qt_used;
      qt_used += n;
      packed = n > 0;
    }
  }
  if (packed) qt_head = qt_ptr;
  /* Two-level sums: the kernels add key blocks into acc and l (float), which
   * fd_cpu_fold() then adds into outer and l_out (double, relative to m_out)
   * and clears every FD_CPU_FOLD_BLOCKS blocks, so float sums never run over
   * more than 128 keys and the error does not grow with the split's length. */
  _Static_assert(FD_CPU_PASS_FLOATS <= 4096, "outer fits the stack");
  double outer[FD_CPU_PASS_FLOATS]; /* [heads][rows][head_dim] */
  double l_out[FD_CPU_PASS_ROWS];
  float m_out[FD_CPU_PASS_ROWS];
  for (int i = 0; i < all_rows; i++) {
    l_out[i] = 0.0;
    m_out[i] = -INFINITY;
  }
  memset(outer, 0, (size_t)all_rows * head_dim * sizeof *outer);
  for (int i = 0; i < all_rows; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  memset(acc, 0, (size_t)all_rows * head_dim * sizeof *acc);

  const ptrdiff_t k_head = (ptrdiff_t)t->k_strides[2] * (ptrdiff_t)c->kv_elem_size;
  const ptrdiff_t v_head = (ptrdiff_t)t->v_strides[2] * (ptrdiff_t)c->kv_elem_size;
  /* contiguous caches: position 0 of head h0, and the bytes between positions */
  const char *k_first = NULL, *v_first = NULL;
  ptrdiff_t k_pos = 0, v_pos = 0;
  if (p->page_size == 0) {
    k_first = kv_row(c, t->k_cache, t->k_strides, b, 0, h0);
    v_first = kv_row(c, t->v_cache, t->v_strides, b, 0, h0);
    k_pos = (ptrdiff_t)t->k_strides[1] * (ptrdiff_t)c->kv_elem_size;
    v_pos = (ptrdiff_t)t->v_strides[1] * (ptrdiff_t)c->kv_elem_size;
  }
  int pending = 0; /* key blocks summed in float since the last fold */
  int nb; /* keys in this block; j0 + nb never overflows (<= tile_end) */
  for (int32_t j0 = tile_begin; j0 < tile_end; j0 += nb) {
    nb = tile_end - j0 < c->block ? tile_end - j0 : c->block;
    block_rows(c, t->k_cache, t->k_strides, k_first, k_pos, b, j0, nb, h0, keys);
    block_rows(c, t->v_cache, t->v_strides, v_first, v_pos, b, j0, nb, h0, values);
    for (int j = nb; j < ((nb + 31) & ~31); j++) { /* the contract's padding */
      keys[j] = keys[nb - 1];
      values[j] = values[nb - 1];
    }
    /* evenly spaced runs of 16 rows of a full block (fd_cpu_block.key_step):
     * always in a contiguous cache, in a paged one when no page boundary
     * falls inside a run */
    const ptrdiff_t key_step = fd_cpu_even_step(keys, nb, p->page_size == 0);
    const ptrdiff_t value_step = fd_cpu_even_step(values, nb, p->page_size == 0);
    int every = 1; /* every row sees every key of the block */
    int masked = 0; /* some row's window starts inside the block */
    for (int r = 0; r < rows; r++) {
      int n = limit[r] - j0;
      if (n > nb) n = nb;
      if (n < 0) n = 0;
      int f = 0;
      if (windowed && lower[r] > j0) f = lower[r] - j0 < nb ? lower[r] - j0 : nb;
      if (f >= n) n = 0, f = 0; /* the row sees none of the block's keys */
      if (p->tree_mask && n > 0 && !fd_tree_sees_any(tree[r], q_len, kv_len, j0, j0 + n)) n = 0;
      count[r] = n;
      first[r] = f;
      every &= n == nb && f == 0;
      masked |= f > 0;
    }
    /* the scores of every head, then the values of every head: the block's
     * keys are read as one sweep, then its values */
    const fd_cpu_block pass = {
        .q = q,
        .acc = acc,
        .m = m,
        .l = l,
        .alpha = alpha,
        .scratch = scratch,
        .count = every ? NULL : count,
        .first = masked ? first : NULL,
        .tree = p->tree_mask && j0 + nb > prefix ? tree : NULL,
        .tree_off = prefix - j0,
        .keys = keys,
        .values = values,
        .key_step = key_step,
        .value_step = value_step,
        .scale = plan->softmax_scale,
        .soft_cap = p->logits_soft_cap,
        .rows = rows,
        .num_keys = nb,
        .head_dim = head_dim,
        .stride = c->block,
    };
    if (c->small) {
      /* scores of every head, the softmax of all their rows in one call,
       * then the values; count per head and row */
      for (int i = rows; !every && i < all_rows; i++) count[i] = count[i % rows];
      for (int i = rows; masked && i < all_rows; i++) first[i] = first[i % rows];
      for (int h = 0; h < heads; h++) {
        fd_cpu_block blk;
        head_block(&blk, &pass, h, rows, k_head, v_head, qt_head);
        if (c->fp8_lut) widen_block(c, &blk, 0, b, j0, h0 + h, wide, wide_rows);
        c->kernels.small_scores(&blk);
        fd_cpu_adjust_scores(&blk, blk.stride);
      }
      fd_cpu_block all = pass;
      all.rows = all_rows;
      all.q = NULL;
      all.keys = all.values = NULL;
      c->kernels.small_softmax(&all);
      for (int h = 0; h < heads; h++) {
        fd_cpu_block blk;
        head_block(&blk, &pass, h, rows, k_head, v_head, qt_head);
        if (c->fp8_lut) widen_block(c, &blk, 1, b, j0, h0 + h, wide, wide_rows);
        c->kernels.small_values(&blk);
      }
      fd_cpu_fold(acc, l, m, outer, l_out, m_out, all_rows, head_dim, c->isa);
      continue;
    }
    /* the next block's keys (prefetched during this one's calls) */
    const int next_nb = tile_end - j0 - nb < c->block ? tile_end - j0 - nb : c->block;
    if (c->prefetch_next && next_nb > 0 && (c->fp8_lut || c->kernels.spreads_next))
      block_rows(c, t->k_cache, t->k_strides, k_first, k_pos, b, j0 + nb, next_nb, h0, next_keys);
    for (int step = 0; step < 2; step++) {
      /* fp8 to bf16 with the heads side by side in each position's row: all
       * heads widened at once (one read of each row, not a strided pass a head) */
      const int row_heads = c->fp8_lut && c->kernel_dtype == FD_DTYPE_BF16 && heads > 1 &&
                            (step ? v_head : k_head) == (ptrdiff_t)head_dim &&
                            (int64_t)c->block * heads * head_dim <= FD_CPU_WIDE_ALL;
      if (row_heads)
        fd_cpu_widen_fp8_bf16((uint16_t *)wide, step ? values : keys, 0, nb, heads * head_dim,
                              c->fp8_lut16, c->isa, p->kv_dtype == FD_DTYPE_E5M2);
      for (int h = 0; h < heads; h++) {
        fd_cpu_block blk;
        head_block(&blk, &pass, h, rows, k_head, v_head, qt_head);
        blk.count = pass.count; /* [rows], all heads alike */
        blk.first = pass.first;
        if (row_heads) {
          read_wide_rows(&blk, step, (const uint16_t *)wide + (ptrdiff_t)h * head_dim,
                         (ptrdiff_t)heads * head_dim, 2, wide_rows);
          if (!step) fold_key_scale(c, &blk, h0 + h);
        } else if (c->fp8_lut) {
          widen_block(c, &blk, step, b, j0, h0 + h, wide, wide_rows);
        }
        if (c->prefetch_next)
          ask_next(c, &blk, step, h, heads, row_heads, keys, values, nb, next_keys, next_nb,
                   k_head, v_head);
        if (step == 0)
          c->kernels.scores(&blk);
        else
          c->kernels.values(&blk);
      }
    }
    if (++pending == FD_CPU_FOLD_BLOCKS) {
      fd_cpu_fold(acc, l, m, outer, l_out, m_out, all_rows, head_dim, c->isa);
      pending = 0;
    }
  }
  if (pending) fd_cpu_fold(acc, l, m, outer, l_out, m_out, all_rows, head_dim, c->isa);

  const int paired = fd_cpu_acc_paired(&c->kernels, c->kernel_dtype, head_dim);
  float natural[256]; /* [head_dim] one row of acc in column order */
  for (int h = 0; h < heads; h++) {
    double v_fold = 1.0;
    if (c->fp8_lut16 && p->kv_scale != FD_KV_SCALE_NONE)
      v_fold = (double)t->v_scale[p->kv_scale == FD_KV_SCALE_HEAD ? h0 + h : 0];
    for (int r = 0; r < rows; r++) {
      const int hq = (h0 + h) * group + (row0 + r) / q_len, tok = (row0 + r) % q_len;
      const int i = h * rows + r;
      /* the row's sums, rounded once to float (as a partial stores them);
       * fp8 widened to bf16: times the folded v_scale first */
      float *a = acc + (ptrdiff_t)i * head_dim;
      if (v_fold != 1.0)
        for (int d = 0; d < head_dim; d++) a[d] = (float)(outer[(ptrdiff_t)i * head_dim + d] * v_fold);
      else
        for (int d = 0; d < head_dim; d++) a[d] = (float)outer[(ptrdiff_t)i * head_dim + d];
      fd_cpu_emit_row(c->plan, t, c->partial_o, c->partial_ml, b, hq, tok, split,
                      paired ? natural : NULL, a, m_out[i], l_out[i], t->sinks != NULL,
                      t->sinks ? t->sinks[hq] : 0.0);
    }
  }
}

/* Items (b, split, hk) for hk in [h_begin, h_end): every head and row tile. */
static void run_segment(const cpu_call *c, int32_t b, int32_t split, int32_t begin, int32_t end,
                        int h_begin, int h_end) {
  if (c->tile_rows == c->group_rows) {
    for (int h = h_begin; h < h_end; h += c->heads_per_pass) {
      const int heads = h_end - h < c->heads_per_pass ? h_end - h : c->heads_per_pass;
      run_pass(c, b, split, begin, end, h, heads, 0, c->group_rows);
    }
    return;
  }
  for (int h = h_begin; h < h_end; h++)
    for (int row0 = 0; row0 < c->group_rows; row0 += c->tile_rows) {
      const int rows = c->group_rows - row0 < c->tile_rows ? c->group_rows - row0 : c->tile_rows;
      run_pass(c, b, split, begin, end, h, 1, row0, rows);
    }
}

/*
 * Share `share` of `shares`: the items whose cost midpoint falls in
 * [total * share / shares, total * (share + 1) / shares), walking the items
 * in (b, split, hk) order with cost = keys + FD_CPU_ITEM_OVERHEAD (empty
 * splits of a split plan cost nothing and are skipped: the combine never
 * reads them). Every share walks the same sums, so each item lands in exactly
 * one share. Returns the total cost when share < 0 (nothing run).
 */
static double run_share(const cpu_call *c, int share, int shares, double total) {
  const fd_plan *plan = c->plan;
  const int32_t num_heads_kv = plan->problem.num_heads_kv, num_splits = plan->num_splits;
  const double lo = share < 0 ? 0.0 : total * share / shares;
  const double hi = share < 0 ? 0.0 : total * (share + 1) / shares;
  double prefix = 0.0;
  for (int32_t b = 0; b < plan->problem.batch; b++) {
    for (int32_t s = 0; s < num_splits; s++) {
      int32_t begin, end;
      const int32_t kv = c->t->kv_len[b];
      fd_seq_split(kv, plan->problem.q_len, plan->problem.window_left, plan->chunk_len, num_splits,
                   fd_split_len_fixed(&plan->problem), s, &begin, &end);
      if (num_splits > 1 && begin == end) continue;
      const double cost = (double)(end - begin) + FD_CPU_ITEM_OVERHEAD;
      const double span = cost * num_heads_kv;
      if (share >= 0 && prefix < hi && prefix + span > lo) {
        double first = ceil((lo - prefix) / cost - 0.5), last = ceil((hi - prefix) / cost - 0.5);
        if (first < 0.0) first = 0.0;
        if (last > num_heads_kv) last = num_heads_kv;
        if (first < last) run_segment(c, b, s, begin, end, (int)first, (int)last);
      }
      prefix += span;
      if (share >= 0 && prefix >= hi) return total;
    }
  }
  return prefix;
}

/* TENSOR / HEAD fp8 scales fold into the bf16 kernels' score scale
 * (softmax_scale * k_scale) only when that product is finite for every
 * scale: past float32's range (softmax_scale 16, k_scale 2^126) a zero q.k
 * would score 0 * inf = NaN. Else the keys are widened to float32 times
 * their scale, as with TOKEN scales. */
static int fp8_scales_fold(const fd_plan *plan, const fd_tensors *t) {
  const fd_problem *p = &plan->problem;
  if (p->kv_scale == FD_KV_SCALE_NONE) return 1;
  if (p->kv_scale == FD_KV_SCALE_TOKEN) return 0;
  const int n = p->kv_scale == FD_KV_SCALE_HEAD ? p->num_heads_kv : 1;
  for (int i = 0; i < n; i++)
    if (!isfinite(plan->softmax_scale * t->k_scale[i])) return 0;
  return 1;
}

/* fd_cpu_run_isa once isa is known to run here. */
static fd_status run_isa(const fd_plan *plan, const fd_tensors *t, void *workspace, fd_cpu_isa isa,
                         fd_error *err) {
  const fd_problem *p = &plan->problem;
  if (p->rope_dim > 0) return fd_cpu_mla_run(plan, t, workspace, isa, err);
  cpu_call c;
  memset(&c, 0, sizeof c);
  float lut[256];
  uint16_t lut16[256];
  c.kernel_dtype = p->kv_dtype;
  if (fd_dtype_is_fp8(p->kv_dtype)) {
    fd_cpu_fp8_table(p->kv_dtype, lut);
    c.fp8_lut = lut;
    c.kernel_dtype = FD_DTYPE_F32;
    if (fp8_scales_fold(plan, t)) { /* scales fold: the bf16 kernels */
      fd_cpu_fp8_table_bf16(lut, lut16);
      c.fp8_lut16 = lut16;
      c.kernel_dtype = FD_DTYPE_BF16;
    }
  }
  if (!fd_cpu_kernels_get(isa, c.kernel_dtype, &c.kernels))
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "cpu: no kernels for instruction set %d, dtype %d",
                   (int)isa, (int)c.kernel_dtype);
  c.plan = plan;
  c.t = t;
  c.isa = isa;
  c.small = c.kernels.small_head_dim > 0 && p->head_dim <= c.kernels.small_head_dim;
  c.prefetch_next = !c.small && fd_dtype_size(p->kv_dtype) <= 2;
  c.elem_size = fd_dtype_size(p->dtype);
  c.kv_elem_size = fd_dtype_size(p->kv_dtype);
  const int32_t num_splits = plan->num_splits;
  if (num_splits > 1) {
    c.partial_o = (float *)((char *)workspace + plan->ws_partial_o);
    c.partial_ml = (float *)((char *)workspace + plan->ws_partial_ml);
  }
  /* Pass shape: whole groups of as many heads as the buffers hold, or row
   * tiles of one head when a group alone is too large. */
  c.group_rows = p->num_heads_q / p->num_heads_kv * p->q_len;
  if (c.group_rows <= FD_CPU_MAX_ROWS && c.group_rows * p->head_dim <= FD_CPU_PASS_FLOATS) {
    int heads = FD_CPU_PASS_FLOATS / (c.group_rows * p->head_dim);
    if (heads > FD_CPU_PASS_ROWS / c.group_rows) heads = FD_CPU_PASS_ROWS / c.group_rows;
    if (heads > p->num_heads_kv) heads = p->num_heads_kv;
    c.heads_per_pass = heads;
    c.tile_rows = c.group_rows;
  } else {
    c.heads_per_pass = 1;
    c.tile_rows = FD_CPU_PASS_FLOATS / p->head_dim;
    if (c.tile_rows > FD_CPU_MAX_ROWS) c.tile_rows = FD_CPU_MAX_ROWS;
  }

  /* Key blocks: FD_CPU_KEY_BLOCK; for the small steps as long as the
   * scratch buffer allows for the largest pass (the same for every pass, so
   * that a head's arithmetic does not depend on the heads it runs with). */
  c.block = FD_CPU_KEY_BLOCK;
  if (c.small) {
    c.block = (FD_CPU_PASS_ROWS * FD_CPU_KEY_BLOCK / (c.heads_per_pass * c.tile_rows)) & ~31;
    if (c.block > FD_CPU_SMALL_BLOCK) c.block = FD_CPU_SMALL_BLOCK;
  }
  if (c.fp8_lut && (int64_t)c.block * p->head_dim > FD_CPU_WIDE_FLOATS) /* (never: 32 x 256, 256 x 8) */
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "cpu: an fp8 block of %d keys x head_dim %d is too large",
                   c.block, p->head_dim);

  const int64_t items = (int64_t)p->batch * p->num_heads_kv * num_splits;
  /* Threads: no more than the items, and about one per 256 KB of K/V, so a
   * tiny call (a small model's decode step) does not pay to wake them all. */
  int64_t kv_bytes = 0;
  for (int32_t b = 0; b < p->batch; b++) kv_bytes += t->kv_len[b];
  kv_bytes *= 2 * (int64_t)p->num_heads_kv * p->head_dim * (int64_t)c.kv_elem_size;
  int64_t threads = kv_bytes / (256 * 1024) + 1;
  if (threads > items) threads = items;
  if (threads > plan->num_threads) threads = plan->num_threads;
  if (threads < 1) threads = 1;
  const double total = run_share(&c, -1, 1, 0.0);
  if (threads == 1) {
    /* no parallel region: even an if(0) one costs libgomp a team
     * allocation and a futex call (~0.2 us, a tenth of a small call) */
    if (c.kernels.start) c.kernels.start();
    run_share(&c, 0, 1, total);
    if (c.kernels.finish) c.kernels.finish();
  } else {
#pragma omp parallel num_threads((int)threads)
    {
      if (c.kernels.start) c.kernels.start();
      run_share(&c, omp_get_thread_num(), omp_get_num_threads(), total);
      if (c.kernels.finish) c.kernels.finish();
    }
  }

  if (num_splits > 1) return fd_cpu_combine(plan, t, c.partial_o, c.partial_ml, err);
  return fd_ok(err);
}

fd_status fd_cpu_run_isa(const fd_plan *plan, const fd_tensors *t, void *workspace,
                         fd_cpu_isa isa, fd_error *err) {
  if (isa > fd_cpu_isa_available())
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "cpu: instruction set %d is not available here",
                   (int)isa);
  return run_isa(plan, t, workspace, isa, err);
}

fd_status fd_cpu_run(const fd_plan *plan, const fd_tensors *t, void *workspace, fd_error *err) {
  return run_isa(plan, t, workspace, (fd_cpu_isa)plan->cpu_isa, err); /* fd_plan_init checked it */
}
