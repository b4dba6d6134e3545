/*
 * plan.c — fd_plan_init: checks the problem, resolves its defaults, chooses
 * the backend, the kernel and its configuration, the split count, and lays
 * out the workspace. Every choice fd_run follows is made here and recorded
 * in the plan (fd_plan.kernel, num_splits, split_keys); the backends decide
 * nothing.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Keys per chunk: split boundaries fall on multiples of this, and the CUDA
 * kernels' key tiles (16 to 128 keys) start on them. */
#define FD_CHUNK_LEN 64
/* Auto splits stop at this many (FlashAttention-2 uses the same bound). */
#define FD_MAX_AUTO_SPLITS 128
/* CUDA: keys x head_dim a split may hold for one block per multiprocessor
 * to be preferred over the occupancy count when the 8-warp config does not
 * apply (auto_splits). */
#define FD_ONE_BLOCK_PER_SM_ELEMS (1024 * 128)
/* The automatic split count takes the smallest count whose wave efficiency
 * is at least this fraction of the best count's. */
#define FD_WAVE_EFFICIENCY 0.95

int32_t fd_num_splits_heuristic(int64_t work_items, int64_t max_chunks, int32_t sm_count,
                                int32_t blocks_per_sm) {
  if (max_chunks <= 1 || work_items <= 0 || sm_count <= 0) return 1;
  if (blocks_per_sm < 1) blocks_per_sm = 1;
  /* Keep every product below in range (the function is public). */
  if (blocks_per_sm > 1024) blocks_per_sm = 1024;
  if (sm_count > (1 << 20)) sm_count = 1 << 20;
  if (work_items > ((int64_t)1 << 40)) work_items = (int64_t)1 << 40;
  if (max_chunks > ((int64_t)1 << 40)) max_chunks = (int64_t)1 << 40;
  int64_t slots = (int64_t)sm_count * blocks_per_sm;
  /* Enough blocks already fill most of the machine: splitting only adds the
   * combine's cost. */
  if (work_items * 10 >= slots * 8) return 1;
  int64_t limit = max_chunks;
  if (limit > FD_MAX_AUTO_SPLITS) limit = FD_MAX_AUTO_SPLITS;
  /* Efficiency of s splits: the work over what the slots spend on it, with
   * per = ceil(chunks / s) chunks a split (a block's time) and the splits that
   * hold keys once chunks are shared out, ceil(chunks / per). Counting whole
   * splits only (waves / ceil(waves)) would rate 61 splits of 34 chunks as
   * high as 64 of 32 at 2048 chunks, though each block runs 6 % longer. */
  double eff[FD_MAX_AUTO_SPLITS + 1];
  double best = 0.0;
  for (int64_t s = 1; s <= limit; s++) {
    int64_t per = (max_chunks + s - 1) / s;
    int64_t active = (max_chunks + per - 1) / per;
    double waves = (double)(work_items * active) / (double)slots;
    eff[s] = (double)work_items * (double)max_chunks / (ceil(waves) * (double)slots * (double)per);
    if (eff[s] > best) best = eff[s];
  }
  /* The smallest count within FD_WAVE_EFFICIENCY of the best: at long
   * contexts a wave with a third of its slots idle costs about 10 %, so the
   * bar is higher than FlashAttention-2's 85 %. */
  for (int64_t s = 1; s <= limit; s++) {
    if (eff[s] >= FD_WAVE_EFFICIENCY * best) return (int32_t)s;
  }
  return 1;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static size_t align_up(size_t x, size_t a) { return fd_align_up(x, a); }

/* Keys the splits of a sequence of kv_len keys cover: all of them, or with
 * a window at most window_left + q_len past a chunk boundary
 * (fd_window_start in split.h), so the split count is planned for those. */
static int64_t keys_read(const fd_problem *p, int64_t kv_len) {
  if (p->window_left < 0) return kv_len;
  const int64_t span = (int64_t)p->window_left + p->q_len + FD_CHUNK_LEN - 1;
  return kv_len < span ? kv_len : span;
}

/* The keys the plan is sized for (keys_read of each sequence): the longest
 * sequence's and the batch's total. */
typedef struct plan_lengths {
  int64_t longest, total;
} plan_lengths;

/* The machine the split count is planned for. */
typedef struct plan_machine {
  int32_t slots;         /* CUDA: multiprocessors; CPU, reference: threads */
  int32_t blocks_per_sm; /* CUDA: blocks of the chosen kernel a multiprocessor holds */
  int wide_ok;           /* CUDA: the 8-warp config may run (device, dtypes, kernel) */
  int64_t row_tiles;     /* CUDA MLA: blocks a (sequence, split) (row tiles); else 1 */
} plan_machine;

/* Multi-head latent attention (rope_dim > 0; flashdecode.h, MLA): the rope
 * part's width and element type, one kv head, a given softmax_scale, none
 * of the variants. Called last by check_problem (dtype, kv_dtype and the
 * rest are checked). */
static fd_status check_mla(const fd_problem *p, fd_error *err) {
  if (p->rope_dim < 0 || p->rope_dim > FD_MAX_ROPE_DIM)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "rope_dim: %d, must be 0 (standard attention) or 1..%d (MLA)", p->rope_dim,
                   FD_MAX_ROPE_DIM);
  if (p->rope_dim == 0) {
    if (p->rope_dtype != 0)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "rope_dtype: %d without rope_dim; it is MLA's (rope_dim > 0), leave it 0",
                     (int)p->rope_dtype);
    return FD_STATUS_OK;
  }
  if (p->head_dim < 1 || p->head_dim > FD_MAX_MLA_HEAD_DIM)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "head_dim: %d, must be 1..%d with rope_dim (MLA: the latent width)", p->head_dim,
                   FD_MAX_MLA_HEAD_DIM);
  if (p->num_heads_kv != 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "num_heads_kv: %d with rope_dim %d; MLA has one kv head (the latent), set 1",
                   p->num_heads_kv, p->rope_dim);
  if (p->softmax_scale == 0.0f)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "softmax_scale: 0 with rope_dim %d; MLA has no default scale (DeepSeek-V3: "
                   "1/sqrt(192), the head dim before absorption), set it",
                   p->rope_dim);
  if (p->has_window && p->window_left >= 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "window_left: %d with rope_dim %d; MLA takes no sliding window",
                   p->window_left, p->rope_dim);
  if (p->logits_soft_cap != 0.0f)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "logits_soft_cap: %g with rope_dim %d; MLA takes no soft-cap",
                   (double)p->logits_soft_cap, p->rope_dim);
  if (p->non_causal)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "non_causal: 1 with rope_dim %d; MLA rows are causal", p->rope_dim);
  const fd_dtype kv = p->kv_dtype == 0 ? p->dtype : p->kv_dtype;
  if (p->rope_dtype != 0 && p->rope_dtype != p->dtype && p->rope_dtype != kv)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "rope_dtype: %d, must be 0 (= kv_dtype), dtype (%s) or kv_dtype (%s)",
                   (int)p->rope_dtype, fd_dtype_name(p->dtype), fd_dtype_name(kv));
  return FD_STATUS_OK;
}

static fd_status check_problem(const fd_problem *p, fd_error *err) {
  if (p->backend < FD_BACKEND_AUTO || p->backend > FD_BACKEND_REFERENCE)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "backend: %d is not an fd_backend", (int)p->backend);
  if (fd_dtype_size(p->dtype) == 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "dtype: %d is not FD_DTYPE_F32, FD_DTYPE_F16 or FD_DTYPE_BF16", (int)p->dtype);
  if (fd_dtype_is_fp8(p->dtype))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "dtype: %s is a cache type; q and out are FD_DTYPE_F16 or FD_DTYPE_BF16 "
                   "(set kv_dtype for an fp8 cache)", fd_dtype_name(p->dtype));
  if (p->kv_dtype != 0 && p->kv_dtype != p->dtype) {
    if (!fd_dtype_is_fp8(p->kv_dtype))
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "kv_dtype: %d, must be 0 (= dtype), dtype (%d), FD_DTYPE_E4M3 or FD_DTYPE_E5M2",
                     (int)p->kv_dtype, (int)p->dtype);
    if (p->dtype != FD_DTYPE_F16 && p->dtype != FD_DTYPE_BF16)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "kv_dtype: an fp8 cache (%s) needs dtype FD_DTYPE_F16 or FD_DTYPE_BF16, not %s",
                     fd_dtype_name(p->kv_dtype), fd_dtype_name(p->dtype));
  }
  if (p->kv_scale < FD_KV_SCALE_NONE || p->kv_scale > FD_KV_SCALE_TOKEN)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "kv_scale: %d is not an fd_kv_scale (0 none, 1 tensor, 2 head, 3 token)",
                   (int)p->kv_scale);
  if (p->kv_scale != FD_KV_SCALE_NONE && !fd_dtype_is_fp8(p->kv_dtype))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "kv_scale: %d needs an fp8 kv_dtype (FD_DTYPE_E4M3 or FD_DTYPE_E5M2)",
                   (int)p->kv_scale);
  if (p->batch < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "batch: %d, must be >= 1", p->batch);
  if (p->non_causal != 0 && p->non_causal != 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "non_causal: %d, must be 0 or 1", p->non_causal);
  if (p->tree_mask != 0 && p->tree_mask != 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "tree_mask: %d, must be 0 or 1", p->tree_mask);
  if (p->tree_mask && p->non_causal)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "tree_mask: 1 with non_causal; non-causal rows see every key, a tree mask "
                   "needs causal rows");
  if (p->tree_mask && (p->q_len < 0 || p->q_len > FD_MAX_Q_LEN_TREE))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "q_len: %d, must be 1..%d with tree_mask (0 = 1)", p->q_len, FD_MAX_Q_LEN_TREE);
  if (p->tree_mask && p->has_window && p->window_left >= 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "window_left: %d with tree_mask; a sliding window over a draft tree is not "
                   "supported",
                   p->window_left);
  if (!p->tree_mask && !p->non_causal && (p->q_len < 0 || p->q_len > FD_MAX_Q_LEN))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "q_len: %d, must be 1..%d (0 = 1; up to %d with non_causal)", p->q_len,
                   FD_MAX_Q_LEN, FD_MAX_Q_LEN_NON_CAUSAL);
  if (p->non_causal && (p->q_len < 0 || p->q_len > FD_MAX_Q_LEN_NON_CAUSAL))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "q_len: %d, must be 1..%d with non_causal (0 = 1)", p->q_len,
                   FD_MAX_Q_LEN_NON_CAUSAL);
  if (p->has_window != 0 && p->has_window != 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "has_window: %d, must be 0 or 1", p->has_window);
  if (p->window_left < -1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "window_left: %d, must be >= 0, or -1 for no window", p->window_left);
  if (p->has_window && p->window_left >= 0 && p->non_causal)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "window_left: %d with non_causal; a sliding window needs causal rows",
                   p->window_left);
  if (!(p->logits_soft_cap >= 0.0f) || isinf(p->logits_soft_cap))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "logits_soft_cap: %g, must be 0 (off) or a finite value > 0",
                   (double)p->logits_soft_cap);
  /* The kernels scale by 1 / cap (CUDA: 1 / (cap log2 e)), which overflows
   * float below ~3e-39 and turns a zero score into NaN: caps start at the
   * smallest normal float. */
  if (p->logits_soft_cap > 0.0f && p->logits_soft_cap < FLT_MIN)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "logits_soft_cap: %g, must be 0 (off) or >= %g (FLT_MIN; 1 / cap must be "
                   "a finite float)",
                   (double)p->logits_soft_cap, (double)FLT_MIN);
  if (p->no_pdl != 0 && p->no_pdl != 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "no_pdl: %d, must be 0 or 1", p->no_pdl);
  if (p->deterministic != 0 && p->deterministic != 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "deterministic: %d, must be 0 or 1",
                   p->deterministic);
  if (p->deterministic && p->num_splits != 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "num_splits: %d with deterministic; the deterministic mode fixes the split "
                   "length at %d keys (num_splits must be 0)",
                   p->num_splits, FD_DETERMINISTIC_SPLIT_LEN);
  if (p->out_dtype != 0) {
    if (fd_dtype_size(p->out_dtype) == 0)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "out_dtype: %d is not 0 (= dtype) or an fd_dtype", (int)p->out_dtype);
    if (fd_dtype_is_fp8(p->out_dtype))
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "out_dtype: %s is a cache type; out is dtype or FD_DTYPE_F32",
                     fd_dtype_name(p->out_dtype));
    if (p->out_dtype != FD_DTYPE_F32 && p->out_dtype != p->dtype)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "out_dtype: %d, must be 0, dtype (%d) or FD_DTYPE_F32", (int)p->out_dtype,
                     (int)p->dtype);
  }
  if (p->num_heads_q < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_heads_q: %d, must be >= 1", p->num_heads_q);
  if (p->num_heads_kv < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_heads_kv: %d, must be >= 1", p->num_heads_kv);
  if (p->num_heads_q % p->num_heads_kv != 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "num_heads_q: %d is not a multiple of num_heads_kv (%d)", p->num_heads_q,
                   p->num_heads_kv);
  if (p->rope_dim == 0 && (p->head_dim < 1 || p->head_dim > 256))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "head_dim: %d, must be 1..256", p->head_dim);
  if (p->page_size < 0 || p->page_size > 256)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "page_size: %d, must be 0 (contiguous) or 1..256", p->page_size);
  if (p->page_size > 0 && p->max_pages_per_seq < 1)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "max_pages_per_seq: %d, must be >= 1 for a paged cache", p->max_pages_per_seq);
  if (p->num_pages < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_pages: %d, must be >= 0", p->num_pages);
  if (p->kv_capacity < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "kv_capacity: %d, must be >= 0", p->kv_capacity);
  /* A contiguous cache left at 0 would only fail (CPU) or clamp every kv_len
   * to 0 (CUDA) at run time: name it here. */
  if (p->page_size == 0 && p->kv_capacity == 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "kv_capacity: 0 for a contiguous cache (page_size 0); set it to the cache's "
                   "second dimension");
  if (p->page_size > 0) {
    int64_t paged = (int64_t)p->max_pages_per_seq * p->page_size;
    if (paged > INT32_MAX)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "max_pages_per_seq: %d pages of %d keys exceed 2^31-1 keys", p->max_pages_per_seq,
                     p->page_size);
    if (p->kv_capacity > paged)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "kv_capacity: %d exceeds max_pages_per_seq * page_size = %lld", p->kv_capacity,
                     (long long)paged);
  }
  if (p->num_splits < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "num_splits: %d, must be >= 0 (0 = automatic)",
                   p->num_splits);
  if (!isfinite(p->softmax_scale))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "softmax_scale: not finite");
  if (p->softmax_scale == 0.0f && signbit(p->softmax_scale))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "softmax_scale: -0.0; only +0.0 means the default 1/sqrt(head_dim) (a negated "
                   "scale is not a default)");
  if (p->num_threads < 0 || p->num_threads > FD_MAX_THREADS)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "num_threads: %d, must be 0 (all cores) .. %d", p->num_threads, FD_MAX_THREADS);
  if (p->device < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "device: %d, must be >= 0", p->device);
  if (p->sm_count < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "sm_count: %d, must be >= 0", p->sm_count);
  return check_mla(p, err);
}

/* Step 1, resolve: the problem's defaults filled in. window_left ends >= 0
 * exactly when a window applies (has_window 1 and window_left >= 0) and -1
 * otherwise; everything after the plan reads only the resolved value. */
static void resolve_problem(fd_problem *p) {
  if (p->q_len == 0) p->q_len = 1;
  if (!p->has_window || p->window_left < 0) p->window_left = -1;
  p->has_window = p->window_left >= 0;
  if (p->out_dtype == 0) p->out_dtype = p->dtype;
  if (p->kv_dtype == 0) p->kv_dtype = p->dtype;
  if (p->rope_dim > 0 && p->rope_dtype == 0) p->rope_dtype = p->kv_dtype;
  if (p->page_size > 0 && p->kv_capacity == 0) p->kv_capacity = p->max_pages_per_seq * p->page_size;
  if (p->page_size == 0) {
    p->max_pages_per_seq = 0;
    p->num_pages = 0;
  }
  if (p->softmax_scale == 0.0f) p->softmax_scale = 1.0f / sqrtf((float)p->head_dim);
}

/* Step 2, size from hints: the lengths the plan is sized for, from
 * kv_len_hint when given (each value checked), else kv_capacity for every
 * sequence. The hint is not kept (the plan does not own it). */
static fd_status size_from_hints(fd_problem *p, plan_lengths *len, fd_error *err) {
  len->longest = keys_read(p, p->kv_capacity);
  len->total = len->longest * p->batch;
  if (!p->kv_len_hint) return FD_STATUS_OK;
  len->longest = 0;
  len->total = 0;
  for (int32_t b = 0; b < p->batch; b++) {
    const int32_t n = p->kv_len_hint[b];
    if (n < 0 || n > p->kv_capacity)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "kv_len_hint[%d]: %d is outside [0, kv_capacity = %d]", b, n, p->kv_capacity);
    if (keys_read(p, n) > len->longest) len->longest = keys_read(p, n);
    len->total += keys_read(p, n);
  }
  p->kv_len_hint = NULL;
  return FD_STATUS_OK;
}

/* ---- CUDA, MLA (rope_dim > 0) ---------------------------------------------
 * The CUDA backend's MLA kernel (FD_KERNEL_CUDA_MLA) and its split policy:
 * the shapes it is built for (check_cuda_mla), the device facts it plans
 * with (mla_device_fit: the budget, blocks per multiprocessor) and the
 * kernel choice (choose_mla_kernel). The split count then follows the
 * common steps (auto_plan with one work item a (sequence, split)). */

/* (head_dim, rope_dim) = (512, 64) or (448, 64) with 16-bit q. */
static fd_status check_cuda_mla(const fd_problem *p, fd_error *err) {
  if (p->rope_dim != 64 || (p->head_dim != 512 && p->head_dim != 448))
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: %d with rope_dim %d is not supported by the CUDA backend's MLA "
                   "kernel ((512, 64) or (448, 64))",
                   p->head_dim, p->rope_dim);
  if (p->dtype != FD_DTYPE_F16 && p->dtype != FD_DTYPE_BF16)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "dtype: %s with rope_dim %d; the CUDA backend's MLA kernel takes FD_DTYPE_F16 "
                   "or FD_DTYPE_BF16 q",
                   fd_dtype_name(p->dtype), p->rope_dim);
  return FD_STATUS_OK;
}

/* The device facts of an MLA plan: the budget, one block a multiprocessor. */
static fd_status mla_device_fit(const fd_problem *p, fd_cuda_fit *fit, fd_error *err) {
  memset(fit, 0, sizeof *fit);
  const fd_status st = fd_cuda_device_budget(p->device, &fit->g, err);
  if (st != FD_STATUS_OK) return st;
  /* its block (gpu_select.h FD_MLA_SMEM: RG 1 for up to 16 rows where it
   * fits, else RG 4) must fit: GPUs with 99 KB a block have none */
  const int64_t rows = (int64_t)p->num_heads_q * p->q_len;
  if (fd_mla_row_groups(&fit->g, p->head_dim, rows) < 1)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: MLA at head_dim %d needs %zu bytes of shared memory a block; device "
                   "%d (compute capability %d.%d) has %d%s",
                   p->head_dim, FD_MLA_SMEM(p->head_dim, 4), p->device, fit->g.cc_major,
                   fit->g.cc_minor, fit->g.smem_block,
                   fit->g.smem_block > 0 ? "" : " (none)");
  fit->split_blocks = 1;
  return FD_STATUS_OK;
}

/* FD_KERNEL_CUDA_MLA runs one of two kernels, both decided by gpu_select.h
 * (the backend asks the same functions): the Hopper wgmma kernel
 * (fd_mla_wgmma_ok: sm_90a code on 9.0, 16-bit caches, head_dim 512, >= 64
 * rows a sequence), else mla_kernel.cu (fd_mla_row_groups). */
static fd_kernel choose_mla_kernel(const fd_problem *p, const fd_cuda_fit *fit) {
  (void)p;
  (void)fit;
  return FD_KERNEL_CUDA_MLA;
}

/* A tree mask on CUDA runs on the rows kernel (rows_mma_kernel.cu), so it
 * needs that kernel's shapes (fd_rows_kernel_shape): no MLA, fp16 or bf16
 * q and cache, head_dim 64 or 128. */
static fd_status check_cuda_tree(const fd_problem *p, fd_error *err) {
  const char *cpu = "; plan with FD_BACKEND_CPU for this shape";
  if (p->rope_dim > 0)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "tree_mask: with rope_dim %d (MLA) on the CUDA backend is not supported%s",
                   p->rope_dim, cpu);
  if (p->dtype != FD_DTYPE_F16 && p->dtype != FD_DTYPE_BF16)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "dtype: %s with tree_mask; the CUDA backend takes tree masks with fp16 or bf16%s",
                   fd_dtype_name(p->dtype), cpu);
  if (p->kv_dtype != 0 && p->kv_dtype != p->dtype)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "kv_dtype: %s with tree_mask; the CUDA backend takes tree masks over a cache "
                   "of q's dtype%s",
                   fd_dtype_name(p->kv_dtype), cpu);
  if (p->head_dim != 64 && p->head_dim != 128)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: %d with tree_mask; the CUDA backend takes tree masks at head_dim 64 "
                   "or 128%s",
                   p->head_dim, cpu);
  if (!fd_rows_kernel_shape(p))
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "num_heads_kv: %d kv heads x %d row tiles exceed the CUDA grid's 65535 blocks "
                   "with tree_mask%s",
                   p->num_heads_kv,
                   fd_rows_tiles(p->num_heads_q / p->num_heads_kv, p->q_len, 16 * FD_ROWS_WARPS),
                   cpu);
  return FD_STATUS_OK;
}

/* Step 3, choose the backend: AUTO is CUDA where a usable device is (or a
 * device's facts were given), else CPU. CUDA needs a usable device (not
 * built in, no such device, below compute capability 8.0, or no code for it
 * in this build: the message says which) and one of its head_dims. */
static fd_status choose_backend(fd_problem *p, const fd_cuda_fit *given, fd_error *err) {
  if (p->backend == FD_BACKEND_AUTO)
    p->backend = given || fd_cuda_available(p->device) ? FD_BACKEND_CUDA : FD_BACKEND_CPU;
  if (p->backend != FD_BACKEND_CUDA) return FD_STATUS_OK;
  if (p->tree_mask) {
    const fd_status st = check_cuda_tree(p, err);
    if (st != FD_STATUS_OK) return st;
  }
  if (!given) {
    const fd_status st = fd_cuda_check_device(p->device, err);
    if (st != FD_STATUS_OK) return st;
  }
  if (p->rope_dim > 0) return check_cuda_mla(p, err);
  if (p->head_dim != 64 && p->head_dim != 80 && p->head_dim != 96 && p->head_dim != 128 &&
      p->head_dim != 256)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: %d is not supported by the CUDA backend (64, 80, 96, 128 or 256)",
                   p->head_dim);
  return FD_STATUS_OK;
}

/* Whether a rows-kernel problem runs the Hopper rows kernel
 * (rows_wgmma_kernel.cu) on the device of `fit`. */
static int rows_wgmma(const fd_problem *p, const fd_cuda_fit *fit) {
  return fd_rows_wgmma_ok(&fit->g, p->head_dim,
                          (int64_t)(p->num_heads_q / p->num_heads_kv) * p->q_len) &&
         fit->rows_wg_blocks > 0;
}

/* Step 4, the device: CUDA reads what its multiprocessors hold of each
 * kernel (fd_cuda_device_fit; `given` instead when set) and plans for
 * problem.sm_count multiprocessors, or the device's; CPU and reference plan
 * for their threads. */
static fd_status read_device(fd_problem *p, const fd_cuda_fit *given, fd_cuda_fit *fit,
                             fd_plan *plan, fd_error *err) {
  memset(fit, 0, sizeof *fit);
  if (p->backend != FD_BACKEND_CUDA) {
    if (p->num_threads == 0) p->num_threads = fd_cpu_default_threads();
    plan->num_threads = p->num_threads;
    plan->sm_count = p->num_threads;
    if (p->backend == FD_BACKEND_CPU) return fd_cpu_isa_choose(getenv("FD_CPU_ISA"), &plan->cpu_isa, err);
    return FD_STATUS_OK;
  }
  if (given) {
    *fit = *given;
    if (fit->split_blocks < 1 || fit->g.sm_count < 1)
      return fd_fail(err, FD_STATUS_UNSUPPORTED,
                     "device: the given facts hold no split-kernel block (%d an SM, %d SMs)",
                     fit->split_blocks, fit->g.sm_count);
  } else if (p->rope_dim > 0) {
    const fd_status st = mla_device_fit(p, fit, err);
    if (st != FD_STATUS_OK) return st;
  } else {
    const fd_status st =
        fd_cuda_device_fit(p->device, p->dtype, p->head_dim, fd_rows_kernel_shape(p), fit, err);
    if (st != FD_STATUS_OK) return st;
  }
  if (p->tree_mask && fit->rows_blocks < 1 && !rows_wgmma(p, fit))
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "tree_mask: this device holds no block of the CUDA kernel that takes tree "
                   "masks (%zu bytes of shared memory at head_dim %d); plan with FD_BACKEND_CPU",
                   (size_t)FD_ROWS_SMEM(p->head_dim), p->head_dim);
  plan->sm_count = p->sm_count > 0 ? p->sm_count : fit->g.sm_count;
  return FD_STATUS_OK;
}

/* Step 5, choose the kernel: the reference or the CPU kernels; on CUDA,
 * fp32 on the CUDA cores; the rows kernel for its shapes
 * (fd_rows_kernel_shape: non-causal, many rows a kv head) where the device
 * holds its block; else the tensor-core split kernel in the 4-warp config
 * the device holds (FD_MMA_4W, or FD_MMA_LEAN where a 4W block does not
 * fit). Whether the 8-warp config replaces the 4-warp one depends on the
 * split count: choose_config, after it. */
static fd_kernel choose_kernel(const fd_problem *p, const fd_cuda_fit *fit) {
  if (p->backend == FD_BACKEND_REFERENCE) return FD_KERNEL_REFERENCE;
  if (p->backend != FD_BACKEND_CUDA) return FD_KERNEL_CPU;
  if (p->rope_dim > 0) return choose_mla_kernel(p, fit);
  if (p->dtype == FD_DTYPE_F32) return FD_KERNEL_CUDA_F32;
  if (fd_rows_kernel_shape(p) && rows_wgmma(p, fit)) return FD_KERNEL_CUDA_ROWS_WGMMA;
  if (fd_rows_kernel_shape(p) && fit->rows_blocks > 0) return FD_KERNEL_CUDA_ROWS;
  return fd_mma_config_4w(&fit->g, p->head_dim) == FD_MMA_LEAN ? FD_KERNEL_CUDA_MMA_LEAN
                                                                : FD_KERNEL_CUDA_MMA_4W;
}

/* The machine the split count is planned for, given the kernel: the 8-warp
 * config is possible for the 16-bit split kernel over a cache of its own
 * dtype (an fp8 cache has no 8-warp instance) where the device holds it. */
static plan_machine machine_for(const fd_problem *p, const fd_plan *plan, fd_kernel kernel,
                                const fd_cuda_fit *fit) {
  plan_machine m = {plan->sm_count, 1, 0, 1};
  if (p->backend != FD_BACKEND_CUDA) return m;
  if (kernel == FD_KERNEL_CUDA_MLA) { /* one block an SM (its shared memory: gpu_select.h) */
    const int64_t rows = (int64_t)p->num_heads_q * p->q_len;
    const int rg = fd_mla_row_groups(&fit->g, p->head_dim, rows); /* 0: facts given by a test */
    m.row_tiles = fd_mla_row_tiles(rg > 0 ? rg : 4, rows);
    /* the Hopper kernel (gpu_select.h fd_mla_wgmma_ok): 64 rows a block */
    if (fd_mla_wgmma_ok(&fit->g, p->head_dim, p->dtype, p->kv_dtype, p->rope_dtype, rows))
      m.row_tiles = (rows + 63) / 64;
    return m;
  }
  m.blocks_per_sm = kernel == FD_KERNEL_CUDA_ROWS          ? fit->rows_blocks
                    : kernel == FD_KERNEL_CUDA_ROWS_WGMMA ? fit->rows_wg_blocks
                                                          : fit->split_blocks;
  m.wide_ok = kernel == FD_KERNEL_CUDA_MMA_4W && p->kv_dtype == p->dtype &&
              fd_mma_wide_ok(&fit->g, p->head_dim);
  return m;
}

/* The automatic split count for `items` work items of `chunks` chunks each:
 * the public heuristic with the kernel's blocks per SM. On CUDA the
 * tensor-core split kernel takes the count for one block per multiprocessor
 * instead when that count's blocks run the 8-warp config at head_dim >= 128
 * (its grid fits the SMs with splits of >= 128 keys: one wide block an SM
 * keeps twice the bytes in flight of two 4-warp ones, ~2 % faster at 8k to
 * 32k keys, B=16), or when each split is short (at most
 * FD_ONE_BLOCK_PER_SM_ELEMS keys x head_dim: a few long blocks beat twice
 * as many half-length ones there, paged caches too). The fp32 and rows
 * kernels keep the heuristic's count. */
static int32_t auto_splits(const fd_problem *p, fd_kernel kernel, const plan_machine *m,
                           int64_t items, int64_t chunks) {
  int32_t splits = fd_num_splits_heuristic(items, chunks, m->slots, m->blocks_per_sm);
  const int mma = kernel == FD_KERNEL_CUDA_MMA_4W || kernel == FD_KERNEL_CUDA_MMA_LEAN;
  if (mma && m->blocks_per_sm > 1) {
    const int32_t one = fd_num_splits_heuristic(items, chunks, m->slots, 1);
    const int64_t keys = ceil_div(chunks, one) * FD_CHUNK_LEN;
    const int wide = m->wide_ok && fd_cuda_wide_kernel(items * one, m->slots, keys);
    if ((p->head_dim >= 128 && wide) ||
        (one > 1 && keys * p->head_dim <= FD_ONE_BLOCK_PER_SM_ELEMS))
      splits = one;
  }
  return splits;
}

/* CPU: the (sequence, split) items the automatic count aims for. At most
 * the threads that will run (fd_cpu_run wakes one per 256 KB of K/V), and
 * from 8 threads on, half the threads: two threads per (sequence, split),
 * each on half of its kv heads (at B=1, 32/8 heads, 16 splits on 16 threads
 * ran 1.7-3x slower than 8 at 4k-16k keys). */
static int32_t cpu_slots(int32_t threads, double kv_bytes) {
  int32_t slots = threads >= 8 ? threads / 2 : threads;
  const double busy = floor(kv_bytes / (256.0 * 1024.0)) + 1.0;
  if (busy < slots) slots = (int32_t)busy;
  return slots < 1 ? 1 : slots;
}

/* The automatic split count (num_splits 0). A work item is one (sequence,
 * kv head, split) on CUDA (the rows kernel: one a row tile too); the CPU
 * backend runs all kv heads of a (sequence, split) in one thread, streaming
 * through their side-by-side rows (a thread on one head of 8 reads a third
 * as fast), so there an item is a (sequence, split). */
static int32_t auto_plan(const fd_problem *p, fd_kernel kernel, plan_machine m,
                         const plan_lengths *len) {
  const int64_t hint_chunks = ceil_div(len->longest, FD_CHUNK_LEN);
  int64_t heads_per_item = p->backend == FD_BACKEND_CPU ? 1 : p->num_heads_kv;
  if (p->backend == FD_BACKEND_CPU)
    m.slots = cpu_slots(m.slots, p->rope_dim > 0
                                     ? (double)len->total * (p->head_dim + p->rope_dim) *
                                           (double)fd_dtype_size(p->kv_dtype)
                                     : 2.0 * (double)len->total * p->num_heads_kv * p->head_dim *
                                           (double)fd_dtype_size(p->kv_dtype));
  if (kernel == FD_KERNEL_CUDA_ROWS || kernel == FD_KERNEL_CUDA_ROWS_WGMMA)
    heads_per_item *= fd_rows_tiles(p->num_heads_q / p->num_heads_kv, p->q_len,
                                    kernel == FD_KERNEL_CUDA_ROWS ? 16 * FD_ROWS_WARPS
                                                                  : FD_ROWS_WG_ROWS);
  if (kernel == FD_KERNEL_CUDA_MLA) heads_per_item *= m.row_tiles; /* one block a row tile */
  int32_t splits = auto_splits(p, kernel, &m, (int64_t)p->batch * heads_per_item, hint_chunks);
  /* Ragged batches (the longest hint above 1.5x the mean): the longest
   * sequence's splits are the critical path. Cut it so that each of its
   * splits holds about half the keys (whole chunks) an even share of the
   * machine would: splits = ceil(2 * longest / even), even = heads_per_item
   * * total / (slots * blocks_per_sm) keys; but never more splits than that
   * sequence would get alone (a batch of one long and a few tiny sequences
   * is planned like the long one). */
  if (len->total > 0 && len->longest * 2 * p->batch > 3 * len->total) {
    const double even =
        (double)heads_per_item * (double)len->total / ((double)m.slots * m.blocks_per_sm);
    double want = ceil(2.0 * (double)len->longest / even);
    const int32_t alone = auto_splits(p, kernel, &m, heads_per_item, hint_chunks);
    if (want > alone) want = alone;
    if (want > FD_MAX_AUTO_SPLITS) want = FD_MAX_AUTO_SPLITS;
    if (want > hint_chunks) want = (double)hint_chunks;
    if (want > splits) splits = (int32_t)want;
  }
  return splits;
}

/* Step 6, choose the splits: 1 for the reference (the oracle never splits);
 * fixed-length splits for the deterministic mode, enough for the longest
 * sequence the plan serves; the automatic count; or num_splits as given.
 * Then bounded: tensor-core splits of at most FD_MMA_MAX_SPLIT_KEYS keys
 * (FD_ROWS_MAX_SPLIT_KEYS for the rows kernel's shapes, whichever kernel
 * the device runs them on, so the count does not follow shared memory),
 * never more splits than chunks, at most FD_MAX_SPLITS. Sets num_splits and
 * split_keys, the keys a split of the longest sequence holds. */
static fd_status choose_splits(const fd_problem *p, fd_kernel kernel, const plan_machine *m,
                               const plan_lengths *len, fd_plan *plan, fd_error *err) {
  const int64_t keys_cap = keys_read(p, p->kv_capacity);
  int64_t max_chunks = ceil_div(keys_cap, FD_CHUNK_LEN);
  if (max_chunks < 1) max_chunks = 1;
  int32_t splits;
  if (p->deterministic && keys_cap > FD_DETERMINISTIC_MAX_KEYS) /* every backend, the reference too */
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "kv_capacity: %d keys read a sequence exceed the deterministic mode's %d "
                   "(FD_DETERMINISTIC_MAX_KEYS)",
                   p->kv_capacity, FD_DETERMINISTIC_MAX_KEYS);
  if (p->backend == FD_BACKEND_REFERENCE) {
    splits = 1;
  } else if (p->deterministic) {
    splits = (int32_t)ceil_div(keys_cap > 0 ? keys_cap : 1, FD_DETERMINISTIC_SPLIT_LEN);
  } else if (p->num_splits == 0) {
    splits = auto_plan(p, kernel, *m, len);
  } else {
    splits = p->num_splits;
  }
  if (p->backend == FD_BACKEND_CUDA && p->dtype != FD_DTYPE_F32 && !p->deterministic) {
    const int64_t need = ceil_div(len->longest, fd_rows_kernel_shape(p) || p->rope_dim > 0
                                                    ? FD_ROWS_MAX_SPLIT_KEYS
                                                    : FD_MMA_MAX_SPLIT_KEYS);
    if (need > splits) splits = need > FD_MAX_SPLITS ? FD_MAX_SPLITS : (int32_t)need;
  }
  if (splits > max_chunks) splits = (int32_t)max_chunks;
  if (splits > FD_MAX_SPLITS) splits = FD_MAX_SPLITS;
  if (splits < 1) splits = 1;
  plan->num_splits = splits;
  const int64_t chunks = ceil_div(len->longest, FD_CHUNK_LEN);
  const int64_t keys = ceil_div(chunks > 0 ? chunks : 1, splits) * FD_CHUNK_LEN;
  plan->split_keys = keys > INT32_MAX ? INT32_MAX : (int32_t)keys;
  return FD_STATUS_OK;
}

/* Step 7, the configuration: the 4-warp tensor-core kernel becomes the
 * 8-warp one where the device runs it and the grid is no larger than the
 * GPU, with splits of at least its 128-key tile (fd_cuda_wide_kernel): one
 * block an SM either way, twice the bytes in flight. Never in the
 * deterministic mode, whose config must not follow the grid (the 8-warp
 * key-warp partition sums in another order; FD_MMA_4W and FD_MMA_LEAN sum
 * alike). */
static fd_kernel choose_config(const fd_problem *p, fd_kernel kernel, const plan_machine *m,
                               const fd_plan *plan) {
  const int64_t blocks = (int64_t)plan->num_splits * p->num_heads_kv * p->batch;
  if (kernel == FD_KERNEL_CUDA_MMA_4W && m->wide_ok && !p->deterministic &&
      fd_cuda_wide_kernel(blocks, plan->sm_count, plan->split_keys))
    return FD_KERNEL_CUDA_MMA_WIDE;
  return kernel;
}

/* CPU, MLA: each thread's scratch (internal.h, fd_cpu_mla_layout) after
 * the split arrays: the rows of a work item are too many for a thread's
 * stack. */
static fd_status lay_out_mla_scratch(const fd_problem *p, fd_plan *plan, fd_error *err) {
  if (p->rope_dim == 0 || p->backend != FD_BACKEND_CPU) return FD_STATUS_OK;
  const size_t off = fd_cpu_mla_scratch_offset(p, plan);
  /* one scratch a thread that can have work: at most the work items */
  const int64_t tile_rows = fd_cpu_mla_tile_rows(p);
  const int64_t items = (int64_t)p->batch * plan->num_splits *
                        (((int64_t)p->num_heads_q * p->q_len + tile_rows - 1) / tile_rows);
  const int64_t threads = items < plan->num_threads ? items : plan->num_threads;
  const double need = (double)off + (double)threads * (double)fd_cpu_mla_layout(p).bytes;
  if (need > (double)((size_t)1 << 52))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "num_threads: %lld threads' MLA scratch needs a %.3g-byte workspace",
                   (long long)threads, need);
  plan->workspace_size = off + (size_t)threads * fd_cpu_mla_layout(p).bytes;
  return FD_STATUS_OK;
}

/* Step 8, lay out the workspace (splits > 1 only): partial outputs, their
 * (m, l) pairs and the combine's counters, each 256-byte aligned. */
static fd_status lay_out_workspace(const fd_problem *p, fd_plan *plan, fd_error *err) {
  const int32_t splits = plan->num_splits;
  if (splits <= 1) return lay_out_mla_scratch(p, plan, err);
  /* rows * splits * (head_dim + 2) floats must fit a size_t (and be sane);
   * checked in double before any integer product can overflow. */
  const double need =
      (double)p->batch * p->num_heads_q * p->q_len * splits * (p->head_dim + 2) * 4.0;
  if (need > (double)((size_t)1 << 52))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "batch: %d x num_heads_q %d x q_len %d x num_splits %d needs a %.3g-byte "
                   "workspace, beyond what can be addressed",
                   p->batch, p->num_heads_q, p->q_len, splits, need);
  const int64_t rows = (int64_t)p->batch * p->num_heads_q * p->q_len;
  size_t off = 0;
  plan->ws_partial_o = off;
  off += (size_t)rows * splits * p->head_dim * sizeof(float);
  off = align_up(off, 256);
  plan->ws_partial_ml = off;
  off += (size_t)rows * splits * 2 * sizeof(float);
  off = align_up(off, 256);
  plan->ws_counters = off;
  off += (size_t)p->batch * p->num_heads_kv * sizeof(uint32_t);
  plan->workspace_size = align_up(off, 256);
  return lay_out_mla_scratch(p, plan, err);
}

/* The steps in order; *plan is written only when all succeed (zeroed
 * otherwise, so a failed plan cannot be run: magic 0). */
static fd_status make_plan(fd_plan *plan, const fd_problem *problem, const fd_cuda_fit *fit,
                           fd_error *err) {
  fd_status st = check_problem(problem, err);
  if (st != FD_STATUS_OK) return st;

  fd_problem p = *problem;
  resolve_problem(&p);
  plan_lengths len;
  if ((st = size_from_hints(&p, &len, err)) != FD_STATUS_OK) return st;
  if ((st = choose_backend(&p, fit, err)) != FD_STATUS_OK) return st;
  fd_cuda_fit dev;
  if ((st = read_device(&p, fit, &dev, plan, err)) != FD_STATUS_OK) return st;
  fd_kernel kernel = choose_kernel(&p, &dev);
  const plan_machine m = machine_for(&p, plan, kernel, &dev);
  if ((st = choose_splits(&p, kernel, &m, &len, plan, err)) != FD_STATUS_OK) return st;
  kernel = choose_config(&p, kernel, &m, plan);
  if ((st = lay_out_workspace(&p, plan, err)) != FD_STATUS_OK) return st;

  plan->backend = p.backend;
  plan->kernel = kernel;
  plan->softmax_scale = p.softmax_scale;
  plan->kv_capacity = p.kv_capacity;
  plan->chunk_len = FD_CHUNK_LEN;
  plan->problem = p;
  plan->magic = FD_PLAN_MAGIC;
  return fd_ok(err);
}

fd_status fd_plan_init_fit(fd_plan *plan, const fd_problem *problem, const fd_cuda_fit *fit,
                           fd_error *err) {
  if (!plan) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  memset(plan, 0, sizeof *plan);
  if (!problem) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "problem: NULL");
  fd_plan made;
  memset(&made, 0, sizeof made);
  const fd_status st = make_plan(&made, problem, fit, err);
  if (st == FD_STATUS_OK) *plan = made;
  return st;
}

fd_status fd_plan_init(fd_plan *plan, const fd_problem *problem, fd_error *err) {
  return fd_plan_init_fit(plan, problem, NULL, err);
}
