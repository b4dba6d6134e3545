/*
 * attention.c — the model's paged KV cache and its fd_plan_init / fd_run
 * calls, on the host (CPU, REFERENCE) or the device (CUDA). See attention.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "gpu.h"
#include "dtype.h"
#include "internal.h" /* fd_reference_f64 */

static fd_status fail(fd_error *err, fd_status status, const char *message) {
  if (err) {
    err->status = status;
    snprintf(err->message, sizeof err->message, "%s", message);
  }
  return status;
}

/* The problem every step shares; backend and head_dim given. */
static fd_problem base_problem(const attention *a, fd_backend backend, int head_dim) {
  const attention_config *c = &a->config;
  fd_problem p = {0};
  p.backend = backend;
  p.dtype = FD_DTYPE_F32;
  p.batch = 1;
  p.q_len = 1;
  p.num_heads_q = c->num_heads_q;
  p.num_heads_kv = c->num_heads_kv;
  p.head_dim = head_dim;
  p.kv_capacity = c->capacity;
  p.page_size = c->page_size;
  p.max_pages_per_seq = a->max_pages_per_seq;
  p.num_pages = a->num_pages;
  p.num_splits = c->num_splits;
  p.num_threads = c->num_threads;
  p.softmax_scale = 1.0f / sqrtf((float)c->head_dim); /* of the model's head, padded or not */
  if (c->kv_dtype != 0 && backend != FD_BACKEND_REFERENCE) {
    p.dtype = FD_DTYPE_BF16;
    p.kv_dtype = c->kv_dtype;
    p.kv_scale = c->kv_dtype == FD_DTYPE_BF16 ? FD_KV_SCALE_NONE : FD_KV_SCALE_TOKEN;
  }
  return p;
}

/* Tensors for batch 1, q_len 1, with every stride explicit (fd_reference_f64
 * is an internal entry point and takes them as they are). */
static fd_tensors make_tensors(const attention *a, int layer, int head_dim, const void *q,
                               const void *k_cache, const void *v_cache, const int32_t *kv_len,
                               const int32_t *block_table, void *out) {
  const attention_config *c = &a->config;
  const int64_t row = (int64_t)c->num_heads_q * head_dim;
  const int64_t page = (int64_t)c->page_size * c->num_heads_kv * head_dim;
  fd_tensors t = {0};
  t.q = q;
  t.q_strides[0] = row, t.q_strides[1] = row, t.q_strides[2] = head_dim;
  t.k_cache = k_cache;
  t.k_strides[0] = page, t.k_strides[1] = (int64_t)c->num_heads_kv * head_dim,
  t.k_strides[2] = head_dim;
  t.v_cache = v_cache;
  memcpy(t.v_strides, t.k_strides, sizeof t.v_strides);
  t.kv_len = kv_len;
  t.block_table = block_table + (size_t)layer * a->max_pages_per_seq;
  t.block_table_stride = a->max_pages_per_seq;
  t.out = out;
  memcpy(t.out_strides, t.q_strides, sizeof t.out_strides);
  t.lse = NULL;
  return t;
}

static int padded_head_dim(int head_dim) {
  if (head_dim <= 64) return 64;
  if (head_dim <= 128) return 128;
  return 256;
}

fd_status attention_init(attention *a, const attention_config *config, fd_error *err) {
  memset(a, 0, sizeof *a);
  a->config = *config;
  const attention_config *c = &a->config;
  if (c->backend != FD_BACKEND_CPU && c->backend != FD_BACKEND_CUDA &&
      c->backend != FD_BACKEND_REFERENCE)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "attention: backend must be cpu, cuda or reference");
  if (c->page_size < 1 || c->page_size > 256)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "page_size: must be 1..256 for the paged cache");
  const int cuda = c->backend == FD_BACKEND_CUDA;
  if (cuda && c->kv_dtype != 0)
    return fail(err, FD_STATUS_UNSUPPORTED,
                "kv_dtype: a bf16 / fp8 cache runs on the CPU backend here (--backend cpu)");
  if (cuda && !gpu_available())
    return fail(err, FD_STATUS_UNSUPPORTED, "backend cuda: no CUDA GPU is visible (or built without CUDA)");

  a->lib_head_dim = cuda ? padded_head_dim(c->head_dim) : c->head_dim;
  a->max_pages_per_seq = (c->capacity + c->page_size - 1) / c->page_size;
  a->num_pages = c->n_layers * a->max_pages_per_seq;
  const size_t slots = (size_t)a->num_pages * c->page_size * c->num_heads_kv;
  a->block_table = calloc((size_t)c->n_layers * a->max_pages_per_seq, sizeof(int32_t));
  a->k_host = calloc(slots * c->head_dim, sizeof(float));
  a->v_host = calloc(slots * c->head_dim, sizeof(float));
  a->reference_out = calloc((size_t)c->num_heads_q * c->head_dim, sizeof(float));
  if (!a->block_table || !a->k_host || !a->v_host || !a->reference_out) {
    attention_free(a);
    return fail(err, FD_STATUS_OUT_OF_MEMORY, "attention: out of host memory for the KV cache");
  }
  if (c->kv_dtype != 0) {
    const size_t e = fd_dtype_size(c->kv_dtype);
    a->kq_host = calloc(slots * c->head_dim, e);
    a->vq_host = calloc(slots * c->head_dim, e);
    a->ks_host = calloc(slots, sizeof(float));
    a->vs_host = calloc(slots, sizeof(float));
    a->k16 = calloc((size_t)c->num_heads_kv * c->head_dim, sizeof(uint16_t));
    a->v16 = calloc((size_t)c->num_heads_kv * c->head_dim, sizeof(uint16_t));
    a->q16 = calloc((size_t)c->num_heads_q * c->head_dim, sizeof(uint16_t));
    a->out16 = calloc((size_t)c->num_heads_q * c->head_dim, sizeof(uint16_t));
    if (!e || !a->kq_host || !a->vq_host || !a->ks_host || !a->vs_host || !a->k16 || !a->v16 ||
        !a->q16 || !a->out16) {
      attention_free(a);
      return fail(err, FD_STATUS_OUT_OF_MEMORY, "attention: out of host memory for the KV cache");
    }
  }

  /* The oracle's plan over the host cache; also checks the shapes early. */
  fd_problem rp = base_problem(a, FD_BACKEND_REFERENCE, c->head_dim);
  fd_status st = fd_plan_init(&a->reference_plan, &rp, err);
  if (st != FD_STATUS_OK) {
    attention_free(a);
    return st;
  }
  if (!cuda) return FD_STATUS_OK;

  const size_t D = (size_t)a->lib_head_dim;
  a->q_pad = calloc((size_t)c->num_heads_q * D, sizeof(float));
  a->out_pad = calloc((size_t)c->num_heads_q * D, sizeof(float));
  a->k_pad = calloc((size_t)c->num_heads_kv * D, sizeof(float));
  a->v_pad = calloc((size_t)c->num_heads_kv * D, sizeof(float));
  if (!a->q_pad || !a->out_pad || !a->k_pad || !a->v_pad) {
    attention_free(a);
    return fail(err, FD_STATUS_OUT_OF_MEMORY, "attention: out of host memory");
  }
  if ((st = gpu_stream_create(&a->stream, err)) ||
      (st = gpu_malloc((void **)&a->k_dev, slots * D * sizeof(float), err)) ||
      (st = gpu_malloc((void **)&a->v_dev, slots * D * sizeof(float), err)) ||
      (st = gpu_malloc((void **)&a->block_table_dev,
                       (size_t)c->n_layers * a->max_pages_per_seq * sizeof(int32_t), err)) ||
      (st = gpu_malloc((void **)&a->kv_len_dev, sizeof(int32_t), err)) ||
      (st = gpu_malloc((void **)&a->q_dev, (size_t)c->num_heads_q * D * sizeof(float), err)) ||
      (st = gpu_malloc((void **)&a->out_dev, (size_t)c->num_heads_q * D * sizeof(float), err))) {
    attention_free(a);
    return st;
  }
  return FD_STATUS_OK;
}

void attention_free(attention *a) {
  free(a->kq_host);
  free(a->vq_host);
  free(a->ks_host);
  free(a->vs_host);
  free(a->k16);
  free(a->v16);
  free(a->q16);
  free(a->out16);
  free(a->block_table);
  free(a->k_host);
  free(a->v_host);
  free(a->reference_out);
  free(a->q_pad);
  free(a->out_pad);
  free(a->k_pad);
  free(a->v_pad);
  if (a->config.backend == FD_BACKEND_CUDA) {
    gpu_free(a->workspace);
    gpu_free(a->k_dev);
    gpu_free(a->v_dev);
    gpu_free(a->block_table_dev);
    gpu_free(a->kv_len_dev);
    gpu_free(a->q_dev);
    gpu_free(a->out_dev);
    gpu_stream_destroy(a->stream);
  } else {
    free(a->workspace);
  }
  memset(a, 0, sizeof *a);
}

/* Makes sure the workspace holds `bytes`. */
static fd_status reserve_workspace(attention *a, size_t bytes, fd_error *err) {
  if (bytes <= a->workspace_capacity) return FD_STATUS_OK;
  if (a->config.backend == FD_BACKEND_CUDA) {
    gpu_free(a->workspace); /* cudaFree waits for the work that may still use it */
    a->workspace = NULL;
    a->workspace_capacity = 0;
    fd_status st = gpu_malloc(&a->workspace, bytes, err);
    if (st != FD_STATUS_OK) return st;
  } else {
    free(a->workspace);
    a->workspace = malloc(bytes);
    a->workspace_capacity = 0;
    if (!a->workspace) return fail(err, FD_STATUS_OUT_OF_MEMORY, "attention: workspace malloc failed");
  }
  a->workspace_capacity = bytes;
  return FD_STATUS_OK;
}

fd_status attention_begin_step(attention *a, int pos, fd_error *err) {
  const attention_config *c = &a->config;
  if (pos < 0 || pos >= c->capacity)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "attention: position outside the cache");
  /* Open a page in every layer when pos is the first position of one. */
  while (a->pages_per_layer <= pos / c->page_size) {
    for (int l = 0; l < c->n_layers; l++)
      a->block_table[(size_t)l * a->max_pages_per_seq + a->pages_per_layer] =
          a->pages_per_layer * c->n_layers + l;
    a->pages_per_layer++;
    a->table_dirty = 1;
  }
  a->kv_len = pos + 1;

  fd_problem p = base_problem(a, c->backend, a->lib_head_dim);
  p.kv_len_hint = &a->kv_len;
  fd_status st = fd_plan_init(&a->plan, &p, err);
  if (st != FD_STATUS_OK) return st;
  if ((st = reserve_workspace(a, a->plan.workspace_size, err))) return st;

  if (c->backend == FD_BACKEND_CUDA) {
    if (a->table_dirty) {
      st = gpu_copy_to_device(a->block_table_dev, a->block_table,
                              (size_t)c->n_layers * a->max_pages_per_seq * sizeof(int32_t),
                              a->stream, err);
      if (st != FD_STATUS_OK) return st;
      a->table_dirty = 0;
    }
    /* kv_len lives in a member, so the asynchronous copy's source stays put */
    st = gpu_copy_to_device(a->kv_len_dev, &a->kv_len, sizeof(int32_t), a->stream, err);
    if (st != FD_STATUS_OK) return st;
  }
  return FD_STATUS_OK;
}

/* Offset, in rows of num_heads_kv * head_dim, of position pos of `layer`. */
static size_t slot_of(const attention *a, int layer, int pos) {
  const attention_config *c = &a->config;
  int32_t page = a->block_table[(size_t)layer * a->max_pages_per_seq + pos / c->page_size];
  return (size_t)page * c->page_size + (size_t)(pos % c->page_size);
}

/* Copies rows of `width` floats into rows of `padded` floats (zeros kept). */
static void pad_rows(float *dst, const float *src, int rows, int width, int padded) {
  for (int r = 0; r < rows; r++)
    memcpy(dst + (size_t)r * padded, src + (size_t)r * width, (size_t)width * sizeof(float));
}

static void unpad_rows(float *dst, const float *src, int rows, int width, int padded) {
  for (int r = 0; r < rows; r++)
    memcpy(dst + (size_t)r * width, src + (size_t)r * padded, (size_t)width * sizeof(float));
}

static void to_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = fd_f32_to_bf16(src[i]);
}

/* attention_layer with config.kv_dtype: the new row appended by fd_append_kv
 * (bf16 copy, or fp8 with its per-token scale), then fd_run in bf16. */
static fd_status layer_kv_dtype(attention *a, int layer, int pos, const float *q, const float *k,
                                const float *v, float *out, fd_error *err) {
  const attention_config *c = &a->config;
  const size_t row = (size_t)c->num_heads_kv * c->head_dim, qrow = (size_t)c->num_heads_q * c->head_dim;
  to_bf16(a->k16, k, row);
  to_bf16(a->v16, v, row);
  to_bf16(a->q16, q, qrow);
  const int fp8 = c->kv_dtype != FD_DTYPE_BF16;
  fd_tensors t = make_tensors(a, layer, c->head_dim, a->q16, a->kq_host, a->vq_host, &a->kv_len,
                              a->block_table, a->out16);
  fd_append_tensors ap = {0};
  const int32_t before = pos; /* kv_len before the append: positions 0 .. pos - 1 */
  ap.k_new = a->k16;
  ap.v_new = a->v16;
  ap.k_cache = a->kq_host;
  ap.v_cache = a->vq_host;
  memcpy(ap.k_strides, t.k_strides, sizeof ap.k_strides);
  memcpy(ap.v_strides, t.v_strides, sizeof ap.v_strides);
  ap.kv_len = &before;
  ap.block_table = t.block_table;
  ap.block_table_stride = t.block_table_stride;
  if (fp8) {
    ap.k_scale = a->ks_host;
    ap.v_scale = a->vs_host;
    t.k_scale = a->ks_host;
    t.v_scale = a->vs_host;
  }
  fd_status st = fd_append_kv(&a->plan, &ap, 1, NULL, err);
  if (st == FD_STATUS_OK) st = fd_run(&a->plan, &t, a->workspace, a->workspace_capacity, NULL, err);
  if (st != FD_STATUS_OK) return st;
  for (size_t i = 0; i < qrow; i++) out[i] = fd_bf16_to_f32(a->out16[i]);
  return FD_STATUS_OK;
}

fd_status attention_layer(attention *a, int layer, int pos, const float *q, const float *k,
                          const float *v, float *out, fd_error *err) {
  const attention_config *c = &a->config;
  const int Hq = c->num_heads_q, Hkv = c->num_heads_kv, D = c->head_dim;
  const size_t row = (size_t)Hkv * D;
  const size_t slot = slot_of(a, layer, pos);
  memcpy(a->k_host + slot * row, k, row * sizeof(float));
  memcpy(a->v_host + slot * row, v, row * sizeof(float));

  if (c->kv_dtype != 0) return layer_kv_dtype(a, layer, pos, q, k, v, out, err);
  if (c->backend != FD_BACKEND_CUDA) {
    fd_tensors t = make_tensors(a, layer, D, q, a->k_host, a->v_host, &a->kv_len, a->block_table, out);
    return fd_run(&a->plan, &t, a->workspace, a->workspace_capacity, NULL, err);
  }

  /* CUDA: new k/v rows and q to the device (zero-padded), run, output back. */
  const int PD = a->lib_head_dim;
  const size_t dev_row = (size_t)Hkv * PD;
  pad_rows(a->k_pad, k, Hkv, D, PD);
  pad_rows(a->v_pad, v, Hkv, D, PD);
  pad_rows(a->q_pad, q, Hq, D, PD);
  fd_status st;
  if ((st = gpu_copy_to_device(a->k_dev + slot * dev_row, a->k_pad, dev_row * sizeof(float),
                               a->stream, err)) ||
      (st = gpu_copy_to_device(a->v_dev + slot * dev_row, a->v_pad, dev_row * sizeof(float),
                               a->stream, err)) ||
      (st = gpu_copy_to_device(a->q_dev, a->q_pad, (size_t)Hq * PD * sizeof(float), a->stream, err)))
    return st;
  fd_tensors t = make_tensors(a, layer, PD, a->q_dev, a->k_dev, a->v_dev, a->kv_len_dev,
                              a->block_table_dev, a->out_dev);
  if ((st = fd_run(&a->plan, &t, a->workspace, a->workspace_capacity, a->stream, err))) return st;
  if ((st = gpu_copy_to_host(a->out_pad, a->out_dev, (size_t)Hq * PD * sizeof(float), a->stream,
                             err)) ||
      (st = gpu_stream_sync(a->stream, err)))
    return st;
  unpad_rows(out, a->out_pad, Hq, D, PD);
  return FD_STATUS_OK;
}

fd_status attention_reference(attention *a, int layer, const float *q, double *out64,
                              fd_error *err) {
  const attention_config *c = &a->config;
  fd_tensors t = make_tensors(a, layer, c->head_dim, q, a->k_host, a->v_host, &a->kv_len,
                              a->block_table, a->reference_out);
  return fd_reference_f64(&a->reference_plan, &t, out64, NULL, err);
}
