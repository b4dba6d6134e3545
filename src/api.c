/*
 * api.c — the public entry points besides fd_plan_init: version, names,
 * fd_run's argument checks and dispatch, and the one-call fd_decode.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "split.h"

const char *fd_version(void) { return FD_VERSION_STRING; }

int fd_version_number(void) { return FD_VERSION_NUMBER; }

size_t fd_struct_size(const char *name) {
  if (!name) return 0;
  if (!strcmp(name, "fd_problem")) return sizeof(fd_problem);
  if (!strcmp(name, "fd_plan")) return sizeof(fd_plan);
  if (!strcmp(name, "fd_tensors")) return sizeof(fd_tensors);
  if (!strcmp(name, "fd_error")) return sizeof(fd_error);
  if (!strcmp(name, "fd_merge_problem")) return sizeof(fd_merge_problem);
  if (!strcmp(name, "fd_append_tensors")) return sizeof(fd_append_tensors);
  return 0;
}

const char *fd_backend_name(fd_backend backend) {
  switch (backend) {
    case FD_BACKEND_AUTO: return "auto";
    case FD_BACKEND_CPU: return "cpu";
    case FD_BACKEND_CUDA: return "cuda";
    case FD_BACKEND_REFERENCE: return "reference";
  }
  return "unknown";
}

int fd_backend_available(fd_backend backend) {
  switch (backend) {
    case FD_BACKEND_AUTO:
    case FD_BACKEND_CPU:
    case FD_BACKEND_REFERENCE: return 1;
    case FD_BACKEND_CUDA: return fd_cuda_available(0);
  }
  return 0;
}

static int all_zero(const int64_t s[3]) { return s[0] == 0 && s[1] == 0 && s[2] == 0; }

/* A tensor's three outer dimensions as fd_run sees them: their extents (-1:
 * unknown, taken as more than one: a paged pool of num_pages 0) and their
 * names, for messages. */
typedef struct dims3 {
  int64_t n[3];
  const char *what[3]; /* the dimensions' names, for messages */
} dims3;

/* Resolves a tensor's strides into dst: all zero = contiguous (dense in the
 * documented shape, head_dim elements per row); else each stride as given,
 * FD_STRIDE_BROADCAST as 0 (inputs only), a literal 0 only on a dimension of
 * extent 1, nothing negative. `check_zeros` 0: sign only (lse when NULL). */
static fd_status resolve3(int64_t dst[3], const int64_t src[3], const dims3 *d, int64_t head_dim,
                          const char *name, int inputs, int check_zeros, fd_error *err) {
  if (all_zero(src)) {
    dst[2] = head_dim;
    dst[1] = d->n[2] * head_dim;
    dst[0] = d->n[1] * d->n[2] * head_dim;
    return FD_STATUS_OK;
  }
  for (int i = 0; i < 3; i++) {
    if (src[i] == FD_STRIDE_BROADCAST) {
      if (!inputs)
        return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                       "%s: stride %d is FD_STRIDE_BROADCAST; only the inputs (q, k_cache, v_cache, "
                       "q_pe, k_pe_cache) can be broadcast (an output's elements would overlap)",
                       name, i);
      dst[i] = 0;
      continue;
    }
    if (src[i] < 0)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: stride %d is %lld, must be >= 0", name,
                     i, (long long)src[i]);
    if (src[i] == 0 && check_zeros && d->n[i] != 1)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "%s: stride %d (%s) is 0 beside nonzero strides; pass every stride (all "
                     "zero = contiguous)%s",
                     name, i, d->what[i],
                     inputs ? ", or FD_STRIDE_BROADCAST to broadcast that dimension" : "");
    dst[i] = src[i];
  }
  return FD_STATUS_OK;
}

/* A tensor's bytes [lo, hi) and its name, for the overlap checks. */
typedef struct span {
  uintptr_t lo, hi;
  const char *name;
} span;

/* a * b, or UINT64_MAX when it does not fit */
static uint64_t mul_sat(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
  return a * b;
}

static uint64_t add_sat(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

/* The span of a tensor of extents n[0..2] (n[i] >= 1), resolved strides
 * s[0..2] (>= 0) and `inner` contiguous elements of `elem` bytes each. Fails
 * when it passes the end of the address space. */
static fd_status make_span(span *out, const void *base, const int64_t n[3], const int64_t s[3],
                           int64_t inner, size_t elem, const char *name, fd_error *err) {
  uint64_t last = 0; /* offset of the last element, in elements */
  for (int i = 0; i < 3; i++) last = add_sat(last, mul_sat((uint64_t)(n[i] - 1), (uint64_t)s[i]));
  const uint64_t bytes = mul_sat(add_sat(last, (uint64_t)inner), elem);
  const uintptr_t lo = (uintptr_t)base;
  if (bytes > (uint64_t)(UINTPTR_MAX - lo))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "%s: its strides reach past the end of the address space from base %p", name,
                   base);
  out->lo = lo;
  out->hi = lo + (uintptr_t)bytes;
  out->name = name;
  return FD_STATUS_OK;
}

static int overlap(const span *a, const span *b) { return a->lo < b->hi && b->lo < a->hi; }

static fd_status fail_overlap(const span *a, const span *b, fd_error *err) {
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                 "%s: its bytes [%p, %p) overlap %s's [%p, %p); out and lse need memory of their "
                 "own",
                 a->name, (void *)a->lo, (void *)a->hi, b->name, (void *)b->lo, (void *)b->hi);
}

/* out and lse (t's resolved strides) against every input, the workspace and
 * each other, from their address ranges (nothing is read). */
static fd_status check_overlaps(const fd_plan *plan, const fd_tensors *t, const void *workspace,
                                fd_error *err) {
  const fd_problem *p = &plan->problem;
  const size_t e = fd_dtype_size(p->dtype), ekv = fd_dtype_size(p->kv_dtype);
  const int64_t D = p->head_dim;
  span in[13], out, lse;
  int n_in = 0;
  fd_status st;
  const int64_t q3[3] = {p->batch, p->q_len, p->num_heads_q};
  if ((st = make_span(&in[n_in++], t->q, q3, t->q_strides, D, e, "q", err))) return st;
  /* paged with num_pages unknown: the first page, the least the pool holds */
  const int64_t blocks = p->page_size > 0 ? (p->num_pages > 0 ? p->num_pages : 1) : p->batch;
  const int64_t kv3[3] = {blocks, p->page_size > 0 ? p->page_size : plan->kv_capacity,
                          p->num_heads_kv};
  if ((st = make_span(&in[n_in++], t->k_cache, kv3, t->k_strides, D, ekv, "k_cache", err))) return st;
  if (p->rope_dim > 0) { /* MLA: q_pe and k_pe_cache; no v_cache */
    const int64_t R = p->rope_dim;
    if ((st = make_span(&in[n_in++], t->q_pe, q3, t->q_pe_strides, R, e, "q_pe", err))) return st;
    if ((st = make_span(&in[n_in++], t->k_pe_cache, kv3, t->k_pe_strides, R,
                        fd_dtype_size(p->rope_dtype), "k_pe_cache", err)))
      return st;
  } else if ((st = make_span(&in[n_in++], t->v_cache, kv3, t->v_strides, D, ekv, "v_cache", err))) {
    return st;
  }
  const int64_t one[3] = {1, 1, 1}, none[3] = {0, 0, 0};
  if (p->kv_scale != FD_KV_SCALE_NONE) { /* fp8 scales: [1], [num_heads_kv], or per token */
    const int tok = p->kv_scale == FD_KV_SCALE_TOKEN;
    const int64_t count = tok ? 1 : p->kv_scale == FD_KV_SCALE_HEAD ? p->num_heads_kv : 1;
    const float *sc[2] = {t->k_scale, t->v_scale};
    const char *names[2] = {"k_scale", "v_scale"};
    for (int w = 0; w < (p->rope_dim > 0 ? 1 : 2); w++)
      if ((st = make_span(&in[n_in++], sc[w], tok ? kv3 : one, tok ? t->scale_strides : none, count,
                          sizeof(float), names[w], err)))
        return st;
  }
  if ((st = make_span(&in[n_in++], t->kv_len, one, none, p->batch, sizeof(int32_t), "kv_len", err)))
    return st;
  if (t->block_table) {
    const int64_t rows[3] = {p->batch, 1, 1}, stride[3] = {t->block_table_stride, 0, 0};
    if ((st = make_span(&in[n_in++], t->block_table, rows, stride, p->max_pages_per_seq,
                        sizeof(int32_t), "block_table", err)))
      return st;
  }
  if (t->tree_mask) { /* [batch] rows of q_len masks, tree_mask_stride apart */
    const int64_t rows[3] = {p->batch, 1, 1}, stride[3] = {t->tree_mask_stride, 0, 0};
    if ((st = make_span(&in[n_in++], t->tree_mask, rows, stride, p->q_len, sizeof(uint64_t),
                        "tree_mask", err)))
      return st;
  }
  if (t->sinks &&
      (st = make_span(&in[n_in++], t->sinks, one, none, p->num_heads_q, sizeof(float), "sinks", err)))
    return st;
  if (workspace && plan->workspace_size > 0 &&
      (st = make_span(&in[n_in++], workspace, one, none, (int64_t)plan->workspace_size, 1,
                      "workspace", err)))
    return st;
  if ((st = make_span(&out, t->out, q3, t->out_strides, D, fd_dtype_size(p->out_dtype), "out", err)))
    return st;
  for (int i = 0; i < n_in; i++)
    if (overlap(&out, &in[i])) return fail_overlap(&out, &in[i], err);
  if (t->lse) {
    const int64_t l3[3] = {p->batch, p->num_heads_q, p->q_len};
    if ((st = make_span(&lse, t->lse, l3, t->lse_strides, 1, sizeof(float), "lse", err))) return st;
    for (int i = 0; i < n_in; i++)
      if (overlap(&lse, &in[i])) return fail_overlap(&lse, &in[i], err);
    if (overlap(&lse, &out)) return fail_overlap(&lse, &out, err);
  }
  return FD_STATUS_OK;
}

static int misaligned(const void *ptr, const int64_t strides[3], size_t elem, size_t align) {
  if ((uintptr_t)ptr % align) return 1;
  for (int i = 0; i < 3; i++)
    if (((uint64_t)strides[i] * elem) % align) return 1;
  return 0;
}

/* The pointers that depend on rope_dim: MLA (rope_dim > 0) needs q_pe and
 * k_pe_cache, aligned to their elements, and takes no v_cache (its values
 * are k_cache's rows) and no sinks; standard attention needs v_cache and
 * takes neither rope part. v_scale is scales.c's. */
static fd_status check_mla_pointers(const fd_problem *p, const fd_tensors *in, fd_error *err) {
  if (p->rope_dim == 0) {
    if (!in->v_cache) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "v_cache: NULL");
    if (in->q_pe)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "q_pe: given, but the plan's rope_dim is 0 (q_pe is MLA's; pass NULL)");
    if (in->k_pe_cache)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "k_pe_cache: given, but the plan's rope_dim is 0 (k_pe_cache is MLA's; pass "
                     "NULL)");
    return FD_STATUS_OK;
  }
  if (!in->q_pe)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "q_pe: NULL, but the plan's rope_dim is %d",
                   p->rope_dim);
  if (!in->k_pe_cache)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "k_pe_cache: NULL, but the plan's rope_dim is %d", p->rope_dim);
  if (in->v_cache)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "v_cache: given with rope_dim %d; MLA's values are k_cache's rows (c_kv), pass "
                   "NULL",
                   p->rope_dim);
  if (in->sinks)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "sinks: given with rope_dim %d; MLA takes no attention sinks", p->rope_dim);
  return FD_STATUS_OK;
}

/* The tensors' pointers aligned to their elements: every backend reads them
 * as arrays of their element type (NULL ones are checked elsewhere; the
 * scales by scales.c, tree_mask by check_tree_pointer). */
static fd_status check_element_alignment(const fd_problem *p, const fd_tensors *in,
                                         fd_error *err) {
  const struct {
    const void *ptr;
    size_t elem;
    const char *name;
  } a[] = {{in->q, fd_dtype_size(p->dtype), "q"},
           {in->q_pe, fd_dtype_size(p->dtype), "q_pe"},
           {in->k_cache, fd_dtype_size(p->kv_dtype), "k_cache"},
           {in->k_pe_cache, fd_dtype_size(p->rope_dtype), "k_pe_cache"},
           {in->v_cache, fd_dtype_size(p->kv_dtype), "v_cache"},
           {in->out, fd_dtype_size(p->out_dtype), "out"},
           {in->lse, sizeof(float), "lse"},
           {in->sinks, sizeof(float), "sinks"},
           {in->kv_len, sizeof(int32_t), "kv_len"},
           {p->page_size > 0 ? in->block_table : NULL, sizeof(int32_t), "block_table"}};
  for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
    if (a[i].ptr && (uintptr_t)a[i].ptr % a[i].elem)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: not aligned to its %zu-byte elements",
                     a[i].name, a[i].elem);
  return FD_STATUS_OK;
}

/* The tree mask's pointer and stride (resolved into t): given exactly when
 * the plan has tree_mask, 8-byte aligned, stride >= 0 (0 = q_len) or
 * FD_STRIDE_BROADCAST (0: every sequence reads row 0's masks). */
static fd_status check_tree_pointer(const fd_problem *p, const fd_tensors *in, fd_tensors *t,
                                    fd_error *err) {
  if (!p->tree_mask) {
    if (in->tree_mask)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "tree_mask: given, but the plan's tree_mask is 0 (plan with tree_mask = 1, or "
                     "pass NULL)");
    t->tree_mask_stride = 0;
    return FD_STATUS_OK;
  }
  if (!in->tree_mask)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "tree_mask: NULL, but the plan was made with tree_mask = 1");
  if ((uintptr_t)in->tree_mask % sizeof(uint64_t))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "tree_mask: not aligned to a uint64");
  if (in->tree_mask_stride == FD_STRIDE_BROADCAST) {
    t->tree_mask_stride = 0;
  } else if (in->tree_mask_stride < 0) {
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "tree_mask_stride: %lld, must be >= 0 (0 = q_len) or FD_STRIDE_BROADCAST",
                   (long long)in->tree_mask_stride);
  } else {
    t->tree_mask_stride = in->tree_mask_stride == 0 ? p->q_len : in->tree_mask_stride;
  }
  return FD_STATUS_OK;
}

/* Host-side (CPU, reference): every row sees itself and no bit names a
 * draft key beyond q_len. */
static fd_status check_host_tree(const fd_plan *plan, const fd_tensors *t, fd_error *err) {
  const fd_problem *p = &plan->problem;
  if (!p->tree_mask) return FD_STATUS_OK;
  for (int32_t b = 0; b < p->batch; b++)
    for (int32_t r = 0; r < p->q_len; r++) {
      const uint64_t m = t->tree_mask[(int64_t)b * t->tree_mask_stride + r];
      if (!((m >> r) & 1u))
        return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                       "tree_mask[%d][%d]: 0x%llx lacks bit %d; every row must see its own draft "
                       "key",
                       b, r, (unsigned long long)m, r);
      if (p->q_len < 64 && (m >> p->q_len) != 0)
        return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                       "tree_mask[%d][%d]: 0x%llx has bits at or above q_len = %d (draft keys that "
                       "do not exist)",
                       b, r, (unsigned long long)m, p->q_len);
    }
  return FD_STATUS_OK;
}

fd_status fd_check_host_lengths(const fd_plan *plan, const fd_tensors *t, fd_error *err) {
  const fd_problem *p = &plan->problem;
  for (int32_t b = 0; b < p->batch; b++) {
    int32_t n = t->kv_len[b];
    if (n < 0 || n > plan->kv_capacity)
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "kv_len[%d]: %d is outside [0, kv_capacity = %d]",
                     b, n, plan->kv_capacity);
    if (p->page_size > 0 && p->num_pages > 0) {
      int64_t pages = ((int64_t)n + p->page_size - 1) / p->page_size;
      const int32_t *row = t->block_table + (int64_t)b * t->block_table_stride;
      /* pages wholly before a window's first key are never read (an engine
       * may have freed them): not checked */
      const int64_t first = fd_window_start(n, p->q_len, p->window_left, plan->chunk_len) / p->page_size;
      for (int64_t i = first; i < pages; i++)
        if (row[i] < 0 || row[i] >= p->num_pages)
          return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                         "block_table[%d][%lld]: page id %d is outside [0, num_pages = %d)", b, (long long)i, row[i],
                         p->num_pages);
    }
  }
  return FD_STATUS_OK;
}

fd_status fd_run(const fd_plan *plan, const fd_tensors *tensors, void *workspace,
                 size_t workspace_size, void *stream, fd_error *err) {
  if (!plan) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  if (plan->magic != FD_PLAN_MAGIC)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: not made by fd_plan_init (or it failed)");
  if (!tensors) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "tensors: NULL");
  const fd_problem *p = &plan->problem;
  const fd_tensors *in = tensors;
  fd_status st;
  if (!in->q) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "q: NULL");
  if (!in->k_cache) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "k_cache: NULL");
  if ((st = check_mla_pointers(p, in, err))) return st;
  if (!in->kv_len) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "kv_len: NULL");
  if (!in->out) return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "out: NULL");
  if ((st = check_element_alignment(p, in, err))) return st;
  if (p->page_size > 0 && !in->block_table)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "block_table: NULL for a paged cache");
  if (in->block_table_stride < 0)
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "block_table_stride: %lld, must be >= 0",
                   (long long)in->block_table_stride);

  fd_tensors t = *in;
  const int64_t D = p->head_dim;
  const dims3 qd = {{p->batch, p->q_len, p->num_heads_q}, {"batch", "token", "head"}};
  const dims3 ld = {{p->batch, p->num_heads_q, p->q_len}, {"batch", "head", "token"}};
  const dims3 kd = p->page_size > 0
                       ? (dims3){{p->num_pages > 0 ? p->num_pages : -1, p->page_size, p->num_heads_kv},
                                 {"page", "position", "head"}}
                       : (dims3){{p->batch, plan->kv_capacity, p->num_heads_kv},
                                 {"batch", "position", "head"}};
  if ((st = resolve3(t.q_strides, in->q_strides, &qd, D, "q_strides", 1, 1, err))) return st;
  if ((st = resolve3(t.out_strides, in->out_strides, &qd, D, "out_strides", 0, 1, err))) return st;
  if ((st = resolve3(t.k_strides, in->k_strides, &kd, D, "k_strides", 1, 1, err))) return st;
  if (p->rope_dim > 0) { /* MLA: the rope parts; v_cache is k_cache */
    if ((st = resolve3(t.q_pe_strides, in->q_pe_strides, &qd, p->rope_dim, "q_pe_strides", 1, 1,
                       err)))
      return st;
    if ((st = resolve3(t.k_pe_strides, in->k_pe_strides, &kd, p->rope_dim, "k_pe_strides", 1, 1,
                       err)))
      return st;
    for (int i = 0; i < 3; i++) t.v_strides[i] = 0;
  } else if ((st = resolve3(t.v_strides, in->v_strides, &kd, D, "v_strides", 1, 1, err))) {
    return st;
  }
  if ((st = resolve3(t.lse_strides, in->lse_strides, &ld, 1, "lse_strides", 0, in->lse != NULL,
                     err)))
    return st;
  if (p->page_size > 0 && t.block_table_stride == 0) t.block_table_stride = p->max_pages_per_seq;
  if (p->page_size == 0) t.block_table = NULL;
  if ((st = check_tree_pointer(p, in, &t, err))) return st;
  if ((st = fd_check_scale_args(plan, in->k_scale, in->v_scale, in->scale_strides, t.scale_strides,
                                err)))
    return st;

  if (plan->workspace_size > 0 && (!workspace || workspace_size < plan->workspace_size))
    return fd_fail(err, FD_STATUS_WORKSPACE_TOO_SMALL,
                   "workspace_size: %zu bytes%s, the plan needs %zu", workspace ? workspace_size : 0,
                   workspace ? "" : " (workspace NULL)", plan->workspace_size);
  if ((st = check_overlaps(plan, &t, workspace, err))) return st;

  switch (plan->backend) {
    case FD_BACKEND_CPU:
      if ((st = fd_check_host_lengths(plan, &t, err))) return st;
      if ((st = fd_check_host_scale_values(plan, &t, err))) return st;
      if ((st = check_host_tree(plan, &t, err))) return st;
      return fd_cpu_run(plan, &t, workspace, err);
    case FD_BACKEND_REFERENCE:
      if ((st = fd_check_host_lengths(plan, &t, err))) return st;
      if ((st = fd_check_host_scale_values(plan, &t, err))) return st;
      if ((st = check_host_tree(plan, &t, err))) return st;
      return fd_reference_run(plan, &t, err);
    case FD_BACKEND_CUDA: {
      const size_t e = fd_dtype_size(p->dtype), ekv = fd_dtype_size(p->kv_dtype);
      if (misaligned(t.q, t.q_strides, e, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED, "q: CUDA needs 16-byte aligned base and strides");
      if (misaligned(t.k_cache, t.k_strides, ekv, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "k_cache: CUDA needs 16-byte aligned base and strides");
      if (p->rope_dim == 0 && misaligned(t.v_cache, t.v_strides, ekv, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "v_cache: CUDA needs 16-byte aligned base and strides");
      if (p->rope_dim > 0 && misaligned(t.q_pe, t.q_pe_strides, e, 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "q_pe: CUDA needs 16-byte aligned base and strides");
      if (p->rope_dim > 0 &&
          misaligned(t.k_pe_cache, t.k_pe_strides, fd_dtype_size(p->rope_dtype), 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED,
                       "k_pe_cache: CUDA needs 16-byte aligned base and strides");
      if (misaligned(t.out, t.out_strides, fd_dtype_size(p->out_dtype), 16))
        return fd_fail(err, FD_STATUS_UNSUPPORTED, "out: CUDA needs 16-byte aligned base and strides");
      if ((uintptr_t)workspace % 16)
        return fd_fail(err, FD_STATUS_UNSUPPORTED, "workspace: CUDA needs a 16-byte aligned base");
      return fd_cuda_run(plan, &t, workspace, stream, err);
    }
    default: break;
  }
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: backend %d is not runnable", (int)plan->backend);
}

fd_status fd_decode(const fd_problem *problem, const fd_tensors *tensors, void *stream,
                    fd_error *err) {
  fd_plan plan;
  fd_status st = fd_plan_init(&plan, problem, err);
  if (st != FD_STATUS_OK) return st;
  void *ws = NULL;
  if (plan.workspace_size > 0) {
    if (plan.backend == FD_BACKEND_CUDA) {
      st = fd_cuda_malloc_async(&ws, plan.workspace_size, stream, err);
      if (st != FD_STATUS_OK) return st;
    } else {
      ws = malloc(plan.workspace_size);
      if (!ws)
        return fd_fail(err, FD_STATUS_OUT_OF_MEMORY, "workspace: malloc of %zu bytes failed",
                       plan.workspace_size);
    }
  }
  st = fd_run(&plan, tensors, ws, plan.workspace_size, stream, err);
  if (ws) {
    if (plan.backend == FD_BACKEND_CUDA) {
      fd_error ferr;
      fd_status fst = fd_cuda_free_async(ws, stream, &ferr);
      if (st == FD_STATUS_OK && fst != FD_STATUS_OK) {
        if (err) *err = ferr;
        st = fst;
      }
    } else {
      free(ws);
    }
  }
  return st;
}
