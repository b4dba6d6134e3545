/*
 * cpu_decode.c — the CPU backend's split step: fd_cpu_run.
 *
 * Work items are (sequence b, kv head hk, split s), shared out to OpenMP
 * threads one at a time. An item runs FlashAttention's online softmax in
 * float32 over the keys of its split for every query row of its group
 * (num_heads_q / num_heads_kv heads times q_len tokens), so each key and
 * value is read once per item. Rows are taken in tiles (bounded stack
 * buffers); keys in blocks of FD_CPU_KEY_BLOCK: the scores of a block for all
 * rows of the tile, one max and one rescale per row and block, then the
 * weighted sum of the block's values.
 *
 * num_splits == 1: the item writes normalised out and lse. Otherwise it writes
 * its unnormalised partial (O, m, l) into the workspace and fd_cpu_combine
 * (cpu_combine.c) merges them. Every item's arithmetic is sequential and
 * independent of the thread that runs it, so results are bitwise
 * reproducible for any thread count.
 */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "split.h"

/* Floats of one row tile of q (or of the accumulators): rows * head_dim. */
#define FD_CPU_TILE_FLOATS 4096
/* Most rows in a tile (reached when head_dim <= 64). */
#define FD_CPU_MAX_TILE_ROWS 64

/* What every work item of a call reads. */
typedef struct cpu_call {
  const fd_plan *plan;
  const fd_tensors *t;
  fd_cpu_kernels kernels;
  size_t elem_size;  /* bytes per element of q, k, v, out */
  float *partial_o;  /* [rows][num_splits][head_dim], NULL when num_splits == 1 */
  float *partial_ml; /* [rows][num_splits][2], NULL when num_splits == 1 */
} cpu_call;

#if defined(__GNUC__) || defined(__clang__)
#define FD_PREFETCH(ptr) __builtin_prefetch(ptr)
#else
#define FD_PREFETCH(ptr) ((void)(ptr))
#endif

/* Asks the cache for the `bytes` bytes at row (one head_dim vector). */
static inline void prefetch_row(const void *row, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) FD_PREFETCH((const char *)row + off);
}

/* Address of position j of sequence b, kv head hk, in a K or V cache with
 * `strides` (contiguous {batch, position, head}; paged {page, position, head}
 * through the block table). */
static const void *kv_row(const cpu_call *c, const void *cache, const int64_t strides[3],
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
  return (const char *)cache + off * (int64_t)c->elem_size;
}

/* Rows [row0, row0 + rows) of the group of (b, hk) over the keys
 * [begin, end) of split `split`; local row r is query head
 * hk * group + r / q_len, token r % q_len. */
static void run_tile(const cpu_call *c, int32_t b, int32_t hk, int32_t split, int32_t begin,
                     int32_t end, int row0, int rows) {
  const fd_problem *p = &c->plan->problem;
  const fd_tensors *t = c->t;
  const int head_dim = p->head_dim, q_len = p->q_len;
  const int group = p->num_heads_q / p->num_heads_kv;
  const int32_t kv_len = t->kv_len[b];
  const int32_t num_splits = c->plan->num_splits;

  float q_tile[FD_CPU_TILE_FLOATS]; /* [rows][head_dim] */
  float acc[FD_CPU_TILE_FLOATS];    /* [rows][head_dim] unnormalised output */
  float scores[FD_CPU_MAX_TILE_ROWS * FD_CPU_KEY_BLOCK]; /* [rows][FD_CPU_KEY_BLOCK] */
  float m[FD_CPU_MAX_TILE_ROWS], l[FD_CPU_MAX_TILE_ROWS], alpha[FD_CPU_MAX_TILE_ROWS];
  int32_t limit[FD_CPU_MAX_TILE_ROWS]; /* row r sees keys [begin, limit[r]) */
  int count[FD_CPU_MAX_TILE_ROWS];
  const void *keys[FD_CPU_KEY_BLOCK], *values[FD_CPU_KEY_BLOCK];

  int32_t tile_end = begin;
  for (int r = 0; r < rows; r++) {
    const int h = hk * group + (row0 + r) / q_len, tok = (row0 + r) % q_len;
    const int32_t visible = kv_len - q_len + tok + 1; /* keys 0 .. visible-1; may be <= 0 */
    limit[r] = visible < end ? visible : end;
    if (limit[r] < begin) limit[r] = begin;
    if (limit[r] > tile_end) tile_end = limit[r];
    const int64_t q_off = (int64_t)b * t->q_strides[0] + (int64_t)tok * t->q_strides[1] +
                          (int64_t)h * t->q_strides[2];
    fd_cpu_load_row(q_tile + r * head_dim, (const char *)t->q + q_off * (int64_t)c->elem_size,
                    p->dtype, head_dim);
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  memset(acc, 0, (size_t)rows * head_dim * sizeof *acc);

  const size_t row_bytes = (size_t)head_dim * c->elem_size;
  int nb; /* keys in this block; j0 + nb never overflows (<= tile_end) */
  for (int32_t j0 = begin; j0 < tile_end; j0 += nb) {
    nb = tile_end - j0 < FD_CPU_KEY_BLOCK ? tile_end - j0 : FD_CPU_KEY_BLOCK;
    for (int j = 0; j < nb; j++) {
      keys[j] = kv_row(c, t->k_cache, t->k_strides, b, j0 + j, hk);
      values[j] = kv_row(c, t->v_cache, t->v_strides, b, j0 + j, hk);
    }
    /* the rows are scattered (head and page strides): ask for the next block
     * while this one computes */
    int64_t next_end = (int64_t)j0 + nb + FD_CPU_KEY_BLOCK;
    if (next_end > tile_end) next_end = tile_end;
    for (int32_t j = j0 + nb; j < next_end; j++) {
      prefetch_row(kv_row(c, t->k_cache, t->k_strides, b, j, hk), row_bytes);
      prefetch_row(kv_row(c, t->v_cache, t->v_strides, b, j, hk), row_bytes);
    }
    c->kernels.scores(q_tile, head_dim, rows, keys, nb, head_dim, c->plan->softmax_scale, scores,
                      FD_CPU_KEY_BLOCK);
    /* online softmax: one new max and one rescale per row and block */
    for (int r = 0; r < rows; r++) {
      int n = limit[r] - j0;
      if (n > nb) n = nb;
      if (n < 0) n = 0;
      count[r] = n;
      alpha[r] = 1.0f;
      if (n == 0) continue;
      float *s = scores + r * FD_CPU_KEY_BLOCK;
      float block_max = s[0];
      for (int j = 1; j < n; j++)
        if (s[j] > block_max) block_max = s[j];
      const float m_new = block_max > m[r] ? block_max : m[r]; /* finite */
      alpha[r] = expf(m[r] - m_new); /* m[r] == -inf: exp(-inf) = 0 */
      float sum = 0.0f;
      for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m_new);
        sum += s[j];
      }
      l[r] = l[r] * alpha[r] + sum;
      m[r] = m_new;
    }
    c->kernels.accumulate(acc, head_dim, rows, alpha, scores, FD_CPU_KEY_BLOCK, count, values,
                          head_dim);
  }

  for (int r = 0; r < rows; r++) {
    const int h = hk * group + (row0 + r) / q_len, tok = (row0 + r) % q_len;
    float *a = acc + r * head_dim;
    if (num_splits == 1) {
      /* the only split: normalise and write out, lse */
      if (l[r] > 0.0f)
        for (int d = 0; d < head_dim; d++) a[d] /= l[r];
      const int64_t out_off = (int64_t)b * t->out_strides[0] + (int64_t)tok * t->out_strides[1] +
                              (int64_t)h * t->out_strides[2];
      fd_cpu_store_row((char *)t->out + out_off * (int64_t)c->elem_size, p->dtype, a, head_dim);
      if (t->lse)
        t->lse[(int64_t)b * t->lse_strides[0] + (int64_t)h * t->lse_strides[1] +
               (int64_t)tok * t->lse_strides[2]] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    } else {
      /* a partial; rows that saw no key write the neutral (-inf, 0, 0) */
      const int64_t slot = (((int64_t)b * p->num_heads_q + h) * q_len + tok) * num_splits + split;
      memcpy(c->partial_o + slot * head_dim, a, (size_t)head_dim * sizeof *a);
      c->partial_ml[slot * 2 + 0] = m[r];
      c->partial_ml[slot * 2 + 1] = l[r];
    }
  }
}

/* Work item (b, hk, split): every row tile of the group. */
static void run_item(const cpu_call *c, int32_t b, int32_t hk, int32_t split) {
  const fd_plan *plan = c->plan;
  const fd_problem *p = &plan->problem;
  int32_t begin, end;
  fd_split_range(c->t->kv_len[b], plan->chunk_len, plan->num_splits, split, &begin, &end);
  /* An empty split lies past the last key: the combine never reads it. */
  if (plan->num_splits > 1 && begin == end) return;
  const int group_rows = p->num_heads_q / p->num_heads_kv * p->q_len;
  int tile_rows = FD_CPU_TILE_FLOATS / p->head_dim;
  if (tile_rows > FD_CPU_MAX_TILE_ROWS) tile_rows = FD_CPU_MAX_TILE_ROWS;
  for (int row0 = 0; row0 < group_rows; row0 += tile_rows) {
    const int rows = group_rows - row0 < tile_rows ? group_rows - row0 : tile_rows;
    run_tile(c, b, hk, split, begin, end, row0, rows);
  }
}

fd_status fd_cpu_run_isa(const fd_plan *plan, const fd_tensors *t, void *workspace,
                         fd_cpu_isa isa, fd_error *err) {
  const fd_problem *p = &plan->problem;
  if (isa > fd_cpu_isa_detect())
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "cpu: instruction set %d is not available here",
                   (int)isa);
  cpu_call c;
  memset(&c, 0, sizeof c);
  if (!fd_cpu_kernels_get(isa, p->dtype, &c.kernels))
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "cpu: no kernels for instruction set %d, dtype %d",
                   (int)isa, (int)p->dtype);
  c.plan = plan;
  c.t = t;
  c.elem_size = fd_dtype_size(p->dtype);
  const int32_t num_splits = plan->num_splits;
  if (num_splits > 1) {
    c.partial_o = (float *)((char *)workspace + plan->ws_partial_o);
    c.partial_ml = (float *)((char *)workspace + plan->ws_partial_ml);
  }

  /* item = (b * num_heads_kv + hk) * num_splits + split */
  const int64_t items = (int64_t)p->batch * p->num_heads_kv * num_splits;
  /* Threads: no more than the items, and about one per 256 KB of K/V, so a
   * tiny call (a small model's decode step) does not pay to wake them all. */
  int64_t kv_bytes = 0;
  for (int32_t b = 0; b < p->batch; b++) kv_bytes += t->kv_len[b];
  kv_bytes *= 2 * (int64_t)p->num_heads_kv * p->head_dim * (int64_t)c.elem_size;
  int64_t threads = kv_bytes / (256 * 1024) + 1;
  if (threads > items) threads = items;
  if (threads > plan->num_threads) threads = plan->num_threads;
  if (threads < 1) threads = 1;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < items; i++) {
    const int32_t split = (int32_t)(i % num_splits);
    const int64_t bh = i / num_splits;
    run_item(&c, (int32_t)(bh / p->num_heads_kv), (int32_t)(bh % p->num_heads_kv), split);
  }

  if (num_splits > 1) return fd_cpu_combine(plan, t, c.partial_o, c.partial_ml, err);
  return fd_ok(err);
}

fd_status fd_cpu_run(const fd_plan *plan, const fd_tensors *t, void *workspace, fd_error *err) {
  return fd_cpu_run_isa(plan, t, workspace, fd_cpu_isa_detect(), err);
}
