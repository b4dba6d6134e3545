/*
 * cpu_mla.c — multi-head latent attention on the CPU (fd_problem.rope_dim >
 * 0; flashdecode.h, MLA): one kv head whose key is [c_kv (head_dim) | k_pe
 * (rope_dim)] and whose value is c_kv.
 *
 * Work items are (sequence b, split s, row tile): a tile is up to
 * FD_CPU_MLA_TILE_ROWS of the sequence's num_heads_q x q_len query rows
 * (row r: query head r / q_len, token r % q_len), so every query head of a
 * tile shares each key block read (16 heads at q_len 1: one tile, each
 * latent row read once). Threads take contiguous ranges of items cut by
 * their key counts, as cpu_decode.c does.
 *
 * A key block (FD_CPU_MLA_BLOCK keys) goes to the same SIMD kernels as
 * decode (cpu_kernels.h) in two calls with two views of one set of rows:
 * the scores call over head_dim + rope_dim columns (q rows hold q_nope then
 * q_pe), the values call over the first head_dim columns of the same rows.
 * The rows are
 *   - the cache's own rows when the rope part follows the latent in memory
 *     with the same dtype and strides (vLLM's and FlashMLA's 576-wide row:
 *     two views of one buffer), nothing copied;
 *   - else, for a bf16 cache whose tile's q the kernels packed (pack_q) and
 *     whose scores read the rope part from its own rows (rope_keys), the
 *     c_kv rows as keys and values and the k_pe rows as the keys' rope
 *     part (fd_cpu_block.rope), nothing copied;
 *   - else, for a 16-bit or float32 cache, c_kv and k_pe copied side by side
 *     into a block buffer (the latent read from memory once, then from L1);
 *   - for an fp8 latent, both parts widened to float32 into the buffer:
 *     c_kv * k_scale, k_pe * k_scale when the rope part is fp8, k_pe exactly
 *     when it is 16-bit (cpu_fp8.c, one rounding per element).
 * The values of a group of FD_CPU_MLA_GROUP blocks that every row sees whole
 * are one call over all of them: each block's p (relative to the running max
 * after that block) times the alphas of the group's later blocks, so all are
 * relative to the last max, and acc's alpha the product of the group's
 * (the kernels keep the sums of such a call in tiles or registers and touch
 * acc once). A block some row sees only in part (the causal end, a tree
 * mask) has its own values call. Sums as in decode, in float32 over a
 * group, then folded into double (fd_cpu_fold);
 * one split writes out and lse, several write partials that fd_cpu_combine
 * merges. An item's arithmetic does not depend on the thread or the batch,
 * so results are reproducible and, with fixed split lengths, batch-invariant.
 * Each thread's buffers are in the workspace (internal.h,
 * fd_cpu_mla_layout).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "row_keys.h"
#include "split.h"

/* Key blocks are summed in float32 over a group (FD_CPU_MLA_GROUP, 8 x 32
 * keys) before their sums are folded into the double ones (fd_cpu_fold). A
 * fold costs about what a block's P.V costs at 16 heads (rows x head_dim
 * double updates), so folding every block (decode's choice) spent ~11 % of
 * an MLA call; float32 sums over 256 keys still keep the error from growing
 * with kv_len. */
/* A work item's cost beyond its keys, in keys (set-up, outputs). */
#define FD_CPU_MLA_ITEM_OVERHEAD 32.0
/* Bytes of q packed by the kernels' pack_q for one tile: a tile's rows of
 * [latent | rope] columns in one bf16 piece, a 64-byte header and 64 bytes
 * of padding (the AMX layout; rows that need two pieces, or more bytes, run
 * unpacked). */
#define FD_CPU_MLA_QT_BYTES (128 + FD_CPU_MLA_TILE_ROWS * FD_MAX_ROW_DIM * 2)

_Static_assert(FD_CPU_MLA_BLOCK == FD_CPU_KEY_BLOCK, "the kernels' scratch rows are a key block");
_Static_assert(FD_CPU_MLA_TILE_ROWS <= FD_CPU_MAX_ROWS, "a tile is one kernel call's rows");
_Static_assert(FD_CPU_MLA_GROUP * FD_CPU_MLA_BLOCK <= FD_CPU_SMALL_BLOCK,
               "a group's keys are one values call's (stride up to FD_CPU_SMALL_BLOCK)");

/* How a key block reaches the kernels (above). */
typedef enum mla_rows {
  MLA_ROWS_DIRECT = 0, /* the cache's rows: k_pe right after c_kv, same dtype */
  MLA_ROWS_COPY = 1,   /* c_kv and k_pe copied side by side (16-bit, float32) */
  MLA_ROWS_WIDEN = 2   /* widened to float32 with their scales (fp8 latent) */
} mla_rows;

typedef struct mla_call {
  const fd_plan *plan;
  const fd_tensors *t;
  fd_cpu_kernels kernels;
  fd_dtype kernel_dtype; /* the rows' dtype as the kernels read them */
  mla_rows rows_mode;
  fd_cpu_isa isa;
  const float *lut;      /* fp8 latent: [256] its codes' values */
  const float *rope_lut; /* fp8 rope part: [256] its codes' values, else NULL */
  size_t e_q, e_kv, e_rope;
  float *partial_o, *partial_ml; /* num_splits > 1 */
  char *scratch;                 /* the threads' buffers */
  fd_cpu_mla_scratch_layout lay;
  int tile_rows, tiles;
  int ahead; /* 1: the kernels ask L2 for the next group's rows (set_ahead) */
} mla_call;

/* Byte address of position j of sequence b in a cache of one kv head with
 * `strides` and e-byte elements (contiguous or through the block table). */
static const char *row_at(const mla_call *c, const void *cache, const int64_t s[3], size_t e,
                          int32_t b, int32_t j) {
  const int32_t P = c->plan->problem.page_size;
  int64_t off;
  if (P == 0) {
    off = (int64_t)b * s[0] + (int64_t)j * s[1];
  } else {
    const int32_t page = c->t->block_table[(int64_t)b * c->t->block_table_stride + j / P];
    off = (int64_t)page * s[0] + (int64_t)(j % P) * s[1];
  }
  return (const char *)cache + off * (int64_t)e;
}

/* The scale of key j of sequence b (1 without scales). */
static float key_scale(const mla_call *c, int32_t b, int32_t j) {
  const fd_plan *plan = c->plan;
  if (plan->problem.kv_scale == FD_KV_SCALE_NONE) return 1.0f;
  return c->t->k_scale[fd_scale_index(plan, c->t->block_table, c->t->block_table_stride,
                                      c->t->scale_strides, b, j, 0)];
}

/* Rows asked for ahead of their use (fd_cpu_block.ahead: into L2, a line at
 * a time through the kernels' work): the next group's keys, 24 of them
 * through each of the group's 8 scores calls and the last 64 through its
 * values call. More during the values call slows it: its own reads of the
 * value rows from L2 wait for fill buffers that the requests hold. */
#define FD_CPU_MLA_AHEAD_SCORES 24
#define FD_CPU_MLA_AHEAD_VALUES (FD_CPU_MLA_GROUP * (FD_CPU_MLA_BLOCK - FD_CPU_MLA_AHEAD_SCORES))

/* blk->ahead: the c_kv rows (and the k_pe rows when they are apart) of keys
 * [j, min(j + n, end)) of sequence b, when the caches are contiguous with
 * rows close together (c->ahead), else none. */
static void set_ahead(const mla_call *c, fd_cpu_block *blk, int32_t b, int32_t j, int32_t n,
                      int32_t end) {
  const fd_tensors *t = c->t;
  blk->ahead[0] = blk->ahead[1] = NULL;
  if (j + n > end) n = end - j;
  if (!c->ahead || n <= 0) return;
  blk->ahead[0] = row_at(c, t->k_cache, t->k_strides, c->e_kv, b, j);
  blk->ahead_bytes[0] = (ptrdiff_t)n * (ptrdiff_t)(t->k_strides[1] * (int64_t)c->e_kv);
  if (c->rows_mode != MLA_ROWS_DIRECT) {
    blk->ahead[1] = row_at(c, t->k_pe_cache, t->k_pe_strides, c->e_rope, b, j);
    blk->ahead_bytes[1] = (ptrdiff_t)n * (ptrdiff_t)(t->k_pe_strides[1] * (int64_t)c->e_rope);
  }
}

/* Points keys[0 .. padded) at the nb rows of the block at key j0 (padding
 * repeats the last, as the kernel contract asks), building them in buf
 * unless the cache's rows serve; with rope (separate 16-bit caches whose
 * rope part the kernels read in place), keys at the c_kv rows and rope at
 * the k_pe rows. */
static void build_block(const mla_call *c, int32_t b, int32_t j0, int nb, char *buf,
                        const void **keys, const void **rope) {
  const fd_problem *p = &c->plan->problem;
  const fd_tensors *t = c->t;
  const int D = p->head_dim, R = p->rope_dim, W = D + R;
  for (int j = 0; j < nb; j++) {
    const char *kv = row_at(c, t->k_cache, t->k_strides, c->e_kv, b, j0 + j);
    if (c->rows_mode == MLA_ROWS_DIRECT) {
      keys[j] = kv;
      continue;
    }
    const char *pe = row_at(c, t->k_pe_cache, t->k_pe_strides, c->e_rope, b, j0 + j);
    if (rope) {
      keys[j] = kv;
      rope[j] = pe;
      continue;
    }
    if (c->rows_mode == MLA_ROWS_COPY) {
      char *dst = buf + (size_t)j * W * c->e_kv;
      memcpy(dst, kv, (size_t)D * c->e_kv);
      memcpy(dst + (size_t)D * c->e_kv, pe, (size_t)R * c->e_kv);
      keys[j] = dst;
      continue;
    }
    float *dst = (float *)buf + (size_t)j * W;
    const float s = key_scale(c, b, j0 + j);
    const int e5m2 = p->kv_dtype == FD_DTYPE_E5M2;
    const void *one[1] = {kv};
    fd_cpu_widen_fp8(dst, one, 0, 1, D, c->lut, NULL, s, c->isa, e5m2);
    if (c->rope_lut) {
      const void *pe_one[1] = {pe};
      fd_cpu_widen_fp8(dst + D, pe_one, 0, 1, R, c->rope_lut, NULL, s, c->isa,
                       p->rope_dtype == FD_DTYPE_E5M2);
    } else {
      fd_cpu_load_row(dst + D, pe, p->rope_dtype, R);
    }
    keys[j] = dst;
  }
  for (int j = nb; j < ((nb + 31) & ~31); j++) {
    keys[j] = keys[nb - 1];
    if (rope) rope[j] = rope[nb - 1];
  }
}

/* The values step of the n blocks of a group in slots [first, first + n),
 * all seen whole by every row (blk: the scores call's fields): one block as
 * it is; several through p rescaled to the last block's max in `all` ([rows]
 * [n * FD_CPU_MLA_BLOCK]) with acc's alpha the product of theirs. */
static void values_held(const mla_call *c, const fd_cpu_block *blk, int first, int n,
                        float *slot_p, float (*alphas)[FD_CPU_MLA_TILE_ROWS],
                        const int *slot_keys, const void *const *keys, float *all, int32_t seq,
                        int32_t ahead_j, int32_t end) {
  if (n == 0) return;
  const int rows = blk->rows;
  const int S = n * FD_CPU_MLA_BLOCK, B = FD_CPU_MLA_BLOCK;
  fd_cpu_block v = *blk;
  float alpha[FD_CPU_MLA_TILE_ROWS];
  v.count = NULL;
  v.values = keys + (ptrdiff_t)first * B;
  v.num_keys = (n - 1) * B + slot_keys[first + n - 1];
  /* a contiguous cache's rows, and the block buffer's (slots side by side),
   * are evenly spaced across the group's blocks */
  v.value_step = fd_cpu_even_step(v.values, v.num_keys, c->plan->problem.page_size == 0);
  v.head_dim = c->plan->problem.head_dim;
  v.tree = NULL;
  set_ahead(c, &v, seq, ahead_j, FD_CPU_MLA_AHEAD_VALUES, end);
  if (n == 1) {
    v.scratch = slot_p + (ptrdiff_t)first * rows * B;
    v.alpha = alphas[first];
    v.stride = B;
  } else {
    for (int r = 0; r < rows; r++) {
      float s = 1.0f;
      for (int i = n - 1; i >= 0; i--) {
        const float *src = slot_p + ((ptrdiff_t)(first + i) * rows + r) * B;
        float *dst = all + (ptrdiff_t)r * S + i * B;
        const int nk = slot_keys[first + i];
        for (int k = 0; k < nk; k++) dst[k] = src[k] * s;
        for (int k = nk; k < B; k++) dst[k] = 0.0f;
        s *= alphas[first + i][r];
      }
      alpha[r] = s;
    }
    v.scratch = all;
    v.alpha = alpha;
    v.stride = S;
  }
  c->kernels.values(&v);
}

/* One item: rows [row0, row0 + rows) of sequence b over the keys [begin,
 * end) of split `split`, with one thread's buffers. */
static void run_item(const mla_call *c, char *mem, int32_t b, int32_t split, int32_t begin,
                     int32_t end, int row0, int rows) {
  const fd_plan *plan = c->plan;
  const fd_problem *p = &plan->problem;
  const fd_tensors *t = c->t;
  const int D = p->head_dim, R = p->rope_dim, W = D + R, q_len = p->q_len;
  const int32_t kv_len = t->kv_len[b];
  float *q = (float *)(mem + c->lay.q);           /* [rows][W] */
  float *acc = (float *)(mem + c->lay.acc);       /* [rows][D] */
  double *outer = (double *)(mem + c->lay.outer); /* [rows][D] */
  float *slot_p = (float *)(mem + c->lay.scratch); /* [group block][rows][block] */
  float *all_p = slot_p + (size_t)FD_CPU_MLA_GROUP * rows * FD_CPU_MLA_BLOCK;
  char *buf = mem + c->lay.keys;
  const size_t block_bytes =
      (size_t)FD_CPU_MLA_BLOCK * W * (c->rows_mode == MLA_ROWS_WIDEN ? sizeof(float) : c->e_kv);
  float m[FD_CPU_MLA_TILE_ROWS] = {0}, l[FD_CPU_MLA_TILE_ROWS];
  float m_out[FD_CPU_MLA_TILE_ROWS];
  double l_out[FD_CPU_MLA_TILE_ROWS];
  int32_t limit[FD_CPU_MLA_TILE_ROWS];
  int count[FD_CPU_MLA_TILE_ROWS];
  const void *keys[FD_CPU_MLA_GROUP * FD_CPU_MLA_BLOCK]; /* the group's blocks */
  const void *rope_rows[FD_CPU_MLA_BLOCK];                /* this block's k_pe rows */
  float alphas[FD_CPU_MLA_GROUP][FD_CPU_MLA_TILE_ROWS];
  int slot_keys[FD_CPU_MLA_GROUP];

  /* rows see keys [begin, limit[r]) (causal: fd_row_keys; with a tree mask
   * fd_tree_row_keys, the mask hiding draft keys inside the blocks) */
  int32_t tile_end = begin;
  uint64_t tree[FD_CPU_MLA_TILE_ROWS];
  const int32_t prefix = kv_len - q_len; /* draft key 0 */
  for (int r = 0; r < rows; r++) {
    int lo, hi;
    if (p->tree_mask) {
      tree[r] = t->tree_mask[(int64_t)b * t->tree_mask_stride + (row0 + r) % q_len];
      fd_tree_row_keys(tree[r], q_len, kv_len, begin, end, &lo, &hi);
    } else {
      fd_row_keys((row0 + r) % q_len, q_len, kv_len, -1, 0, begin, end, &lo, &hi);
    }
    limit[r] = hi;
    if (hi > tile_end) tile_end = hi;
    const int h = (row0 + r) / q_len, tok = (row0 + r) % q_len;
    const int64_t qo = (int64_t)b * t->q_strides[0] + (int64_t)tok * t->q_strides[1] +
                       (int64_t)h * t->q_strides[2];
    const int64_t po = (int64_t)b * t->q_pe_strides[0] + (int64_t)tok * t->q_pe_strides[1] +
                       (int64_t)h * t->q_pe_strides[2];
    fd_cpu_load_row(q + (ptrdiff_t)r * W, (const char *)t->q + qo * (int64_t)c->e_q, p->dtype, D);
    fd_cpu_load_row(q + (ptrdiff_t)r * W + D, (const char *)t->q_pe + po * (int64_t)c->e_q,
                    p->dtype, R);
    m[r] = m_out[r] = -INFINITY;
    l[r] = 0.0f;
    l_out[r] = 0.0;
  }
  memset(acc, 0, (size_t)rows * D * sizeof *acc);
  memset(outer, 0, (size_t)rows * D * sizeof *outer);
  /* q packed once for the kernels' scores (pack_q: the AMX tiles' layout),
   * or NULL: the kernels read q */
  _Alignas(64) unsigned char qt[FD_CPU_MLA_QT_BYTES];
  const void *q_packed = NULL;
  if (c->kernels.pack_q && c->kernels.pack_q(q, rows, W, qt, sizeof qt) > 0) q_packed = qt;
  /* separate caches: the kernels' scores read the k_pe rows in place */
  const void **rope = c->rows_mode == MLA_ROWS_COPY && q_packed && c->kernels.rope_keys &&
                              D % 32 == 0 && R % 32 == 0 && R <= FD_MAX_ROPE_DIM
                          ? rope_rows
                          : NULL;

  int32_t group_j0 = begin; /* the group's first key */
  int nb, slot = 0; /* the group's blocks so far */
  int held = 0;      /* of them, the last ones whose values wait for the group's call */
  for (int32_t j0 = begin; j0 < tile_end; j0 += nb) {
    nb = tile_end - j0 < FD_CPU_MLA_BLOCK ? tile_end - j0 : FD_CPU_MLA_BLOCK;
    int every = 1;
    for (int r = 0; r < rows; r++) {
      int n = limit[r] - j0;
      if (n > nb) n = nb;
      if (n < 0) n = 0;
      if (p->tree_mask && n > 0 && !fd_tree_sees_any(tree[r], q_len, kv_len, j0, j0 + n)) n = 0;
      count[r] = n;
      every &= n == nb;
    }
    if (slot == 0) group_j0 = j0;
    /* the next group's first key, and the first of its keys the values call
     * asks for */
    const int32_t next_j = group_j0 + FD_CPU_MLA_GROUP * FD_CPU_MLA_BLOCK;
    const int32_t next_half = next_j + FD_CPU_MLA_GROUP * FD_CPU_MLA_AHEAD_SCORES;
    const void **bk = keys + slot * FD_CPU_MLA_BLOCK;
    build_block(c, b, j0, nb, buf + slot * block_bytes, bk, rope);
    const ptrdiff_t step = fd_cpu_even_step(bk, nb, p->page_size == 0);
    /* scores over [c_kv | k_pe], then the values over c_kv: the same rows */
    fd_cpu_block scores = {
        .q = q,
        .qt = q_packed,
        .acc = acc,
        .m = m,
        .l = l,
        .alpha = alphas[slot],
        .scratch = slot_p + (size_t)slot * rows * FD_CPU_MLA_BLOCK,
        .count = every ? NULL : count,
        .keys = bk,
        .values = bk,
        .key_step = step,
        .value_step = step,
        .rope = rope,
        .rope_step = rope ? fd_cpu_even_step(rope, nb, p->page_size == 0) : 0,
        .rope_dim = rope ? R : 0,
        .tree = p->tree_mask && j0 + nb > prefix ? tree : NULL,
        .tree_off = prefix - j0,
        .scale = plan->softmax_scale,
        .rows = rows,
        .num_keys = nb,
        .head_dim = W,
        .stride = FD_CPU_MLA_BLOCK,
    };
    set_ahead(c, &scores, b, next_j + slot * FD_CPU_MLA_AHEAD_SCORES, FD_CPU_MLA_AHEAD_SCORES,
              tile_end);
    c->kernels.scores(&scores);
    slot_keys[slot] = nb;
    if (every) {
      held++;
    } else { /* the held blocks' values first, then this one's over each row's keys */
      values_held(c, &scores, slot - held, held, slot_p, alphas, slot_keys, keys, all_p, b,
                  next_half, tile_end);
      held = 0;
      fd_cpu_block values = scores;
      values.ahead[0] = values.ahead[1] = NULL;
      values.head_dim = D;
      c->kernels.values(&values);
    }
    if (++slot == FD_CPU_MLA_GROUP || j0 + nb >= tile_end) {
      values_held(c, &scores, slot - held, held, slot_p, alphas, slot_keys, keys, all_p, b,
                  next_half, tile_end);
      held = 0;
      slot = 0;
      fd_cpu_fold(acc, l, m, outer, l_out, m_out, rows, D, c->isa);
    }
  }

  const int paired = fd_cpu_acc_paired(&c->kernels, c->kernel_dtype, D);
  float natural[FD_MAX_MLA_HEAD_DIM];
  for (int r = 0; r < rows; r++) {
    const int h = (row0 + r) / q_len, tok = (row0 + r) % q_len;
    float *a = acc + (ptrdiff_t)r * D;
    for (int d = 0; d < D; d++) a[d] = (float)outer[(ptrdiff_t)r * D + d];
    fd_cpu_emit_row(plan, t, c->partial_o, c->partial_ml, b, h, tok, split,
                    paired ? natural : NULL, a, m_out[r], l_out[r], 0, 0.0);
  }
}

/* Share `share` of `shares` (thread `share`'s buffers): the items whose
 * cost midpoint falls in its range, walking (b, split, tile) in order;
 * empty splits of a split plan are skipped (the combine never reads them).
 * Returns the total cost when share < 0 (nothing run). */
static double run_share(const mla_call *c, int share, int shares, double total) {
  const fd_plan *plan = c->plan;
  const fd_problem *p = &plan->problem;
  const int32_t num_splits = plan->num_splits;
  const int all_rows = p->num_heads_q * p->q_len;
  char *mem = share < 0 ? NULL : c->scratch + (size_t)share * c->lay.bytes;
  double prefix = 0.0;
  for (int32_t b = 0; b < p->batch; b++) {
    for (int32_t s = 0; s < num_splits; s++) {
      int32_t begin, end;
      fd_seq_split(c->t->kv_len[b], p->q_len, -1, plan->chunk_len, num_splits,
                   fd_split_len_fixed(p), s, &begin, &end);
      if (num_splits > 1 && begin == end) continue;
      const double cost = (double)(end - begin) + FD_CPU_MLA_ITEM_OVERHEAD;
      for (int tile = 0; tile < c->tiles; tile++) {
        const double mid = prefix + 0.5 * cost;
        prefix += cost;
        if (share < 0) continue;
        int owner = (int)(mid * shares / total);
        if (owner >= shares) owner = shares - 1;
        if (owner != share) continue;
        const int row0 = tile * c->tile_rows;
        const int rows = all_rows - row0 < c->tile_rows ? all_rows - row0 : c->tile_rows;
        run_item(c, mem, b, s, begin, end, row0, rows);
      }
    }
  }
  return prefix;
}

fd_status fd_cpu_mla_run(const fd_plan *plan, const fd_tensors *t, void *workspace, fd_cpu_isa isa,
                         fd_error *err) {
  const fd_problem *p = &plan->problem;
  mla_call c;
  memset(&c, 0, sizeof c);
  c.plan = plan;
  c.t = t;
  c.isa = isa;
  c.e_q = fd_dtype_size(p->dtype);
  c.e_kv = fd_dtype_size(p->kv_dtype);
  c.e_rope = fd_dtype_size(p->rope_dtype);
  float lut[256], rope_lut[256];
  if (fd_dtype_is_fp8(p->kv_dtype)) {
    fd_cpu_fp8_table(p->kv_dtype, lut);
    c.lut = lut;
    if (fd_dtype_is_fp8(p->rope_dtype)) {
      fd_cpu_fp8_table(p->rope_dtype, rope_lut);
      c.rope_lut = rope_lut;
    }
    c.rows_mode = MLA_ROWS_WIDEN;
    c.kernel_dtype = FD_DTYPE_F32;
  } else {
    /* 16-bit or float32: rope_dtype is kv_dtype (plan.c) */
    c.kernel_dtype = p->kv_dtype;
    const int follows = (const char *)t->k_pe_cache ==
                            (const char *)t->k_cache + (size_t)p->head_dim * c.e_kv &&
                        t->k_pe_strides[0] == t->k_strides[0] &&
                        t->k_pe_strides[1] == t->k_strides[1];
    c.rows_mode = follows ? MLA_ROWS_DIRECT : MLA_ROWS_COPY;
    /* rows asked for ahead: contiguous caches whose token stride is the
     * row's (no gaps fetched) */
    const int64_t row = (int64_t)(p->head_dim + (follows ? p->rope_dim : 0)) * (int64_t)c.e_kv;
    c.ahead = p->page_size == 0 && t->k_strides[1] * (int64_t)c.e_kv == row &&
              (follows || t->k_pe_strides[1] == (int64_t)p->rope_dim);
  }
  if (!fd_cpu_kernels_get(isa, c.kernel_dtype, &c.kernels))
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "cpu: no kernels for instruction set %d, dtype %d",
                   (int)isa, (int)c.kernel_dtype);
  if (plan->num_splits > 1) {
    c.partial_o = (float *)((char *)workspace + plan->ws_partial_o);
    c.partial_ml = (float *)((char *)workspace + plan->ws_partial_ml);
  }
  c.lay = fd_cpu_mla_layout(p);
  c.scratch = (char *)workspace + fd_cpu_mla_scratch_offset(p, plan);
  c.tile_rows = fd_cpu_mla_tile_rows(p);
  c.tiles = (p->num_heads_q * p->q_len + c.tile_rows - 1) / c.tile_rows;

  const int64_t items = (int64_t)p->batch * plan->num_splits * c.tiles;
  /* Threads: no more than the items (or the plan's), about one per 256 KB
   * of keys read. */
  int64_t bytes = 0;
  for (int32_t b = 0; b < p->batch; b++) bytes += t->kv_len[b];
  bytes *= (int64_t)c.tiles * (p->head_dim * (int64_t)c.e_kv + p->rope_dim * (int64_t)c.e_rope);
  int64_t threads = bytes / (256 * 1024) + 1;
  if (threads > items) threads = items;
  if (threads > plan->num_threads) threads = plan->num_threads;
  if (threads < 1) threads = 1;
  const double total = run_share(&c, -1, 1, 0.0);
  if (total <= 0.0) {
    /* no item holds keys (every split empty): the combine writes the rows */
  } else if (threads == 1) {
    if (c.kernels.start) c.kernels.start();
    run_share(&c, 0, 1, total);
    if (c.kernels.finish) c.kernels.finish();
  } else {
#pragma omp parallel num_threads((int)threads)
    {
      if (c.kernels.start) c.kernels.start();
      run_share(&c, omp_get_thread_num(), omp_get_num_threads(), total);
      if (c.kernels.finish) c.kernels.finish(); /* (the AMX kernels' tile state) */
    }
  }
  if (plan->num_splits > 1) return fd_cpu_combine(plan, t, c.partial_o, c.partial_ml, err);
  return fd_ok(err);
}
