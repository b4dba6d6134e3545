/*
 * attention.h — the model's decode attention through libflashdecode, for one
 * sequence, over a PAGED KV cache.
 *
 * Pages of page_size positions come from one pool shared by all layers and
 * are handed out on demand, so each layer's block_table row is a scattered
 * list of page ids (layer l's i-th page is page i * n_layers + l).
 * Every step: attention_begin_step (one fd_plan_init, with kv_len_hint = the
 * step's kv_len); every layer: attention_layer (store the new k/v rows, one
 * fd_run).
 *
 * Backends: CPU and REFERENCE run on the host cache. CUDA keeps the cache in
 * device memory: each layer copies q and the new k/v rows in, runs the
 * kernels and copies the output back. The CUDA kernels take head_dim 64, 128
 * or 256 only, so a smaller head is zero-padded on the device (zeros change
 * no dot product and add only zero columns to the output; the softmax scale
 * stays 1/sqrt(head_dim)). The host cache is kept in every case, so the
 * float64 reference can be run over the same keys (attention_reference).
 * With config.kv_dtype (CPU, REFERENCE): q and out pass through bf16 and the
 * cache the library reads is bf16 or fp8 (per-token scales), written by
 * fd_append_kv.
 */
#ifndef FD_CLI_ATTENTION_H
#define FD_CLI_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

typedef struct attention_config {
  fd_backend backend; /* CPU, CUDA or REFERENCE (not AUTO) */
  int n_layers;
  int num_heads_q;
  int num_heads_kv;
  int head_dim;
  int capacity;       /* most positions */
  int page_size;      /* positions per page, 1..256 */
  int num_splits;     /* 0 = automatic */
  int num_threads;    /* CPU: 0 = all cores */
  fd_dtype kv_dtype;  /* 0: float32 q and cache (the default path); FD_DTYPE_BF16: bf16 q and
                         cache; FD_DTYPE_E4M3 / E5M2: bf16 q, fp8 cache with per-token scales.
                         Non-zero: CPU and REFERENCE backends; new rows go in through
                         fd_append_kv */
} attention_config;

typedef struct attention {
  attention_config config;
  int lib_head_dim;       /* head_dim the library sees (CUDA: padded to 64/128/256) */
  int max_pages_per_seq;  /* columns of block_table */
  int num_pages;          /* pages in the pool: n_layers * max_pages_per_seq */
  int pages_per_layer;    /* pages handed out to each layer so far */
  int32_t kv_len;         /* keys the current step sees (pos + 1) */
  int32_t *block_table;   /* [n_layers][max_pages_per_seq] page ids, host */
  float *k_host;          /* [num_pages][page_size][num_heads_kv][head_dim] */
  float *v_host;          /* [num_pages][page_size][num_heads_kv][head_dim] */
  fd_plan plan;           /* the current step's plan */
  fd_plan reference_plan; /* REFERENCE plan over the host cache, for attention_reference */
  float *reference_out;   /* [num_heads_q][head_dim] the float out fd_reference_f64 is handed (unused) */
  void *workspace;        /* plan.workspace_size bytes or more (device memory for CUDA) */
  size_t workspace_capacity;
  /* CUDA only */
  void *stream;
  float *k_dev;           /* [num_pages][page_size][num_heads_kv][lib_head_dim] device */
  float *v_dev;           /* [num_pages][page_size][num_heads_kv][lib_head_dim] device */
  int32_t *block_table_dev; /* [n_layers][max_pages_per_seq] device */
  int32_t *kv_len_dev;    /* [1] device */
  float *q_dev;           /* [num_heads_q][lib_head_dim] device */
  float *out_dev;         /* [num_heads_q][lib_head_dim] device */
  float *q_pad;           /* [num_heads_q][lib_head_dim] host staging, zero padded */
  float *k_pad;           /* [num_heads_kv][lib_head_dim] host staging */
  float *v_pad;           /* [num_heads_kv][lib_head_dim] host staging */
  float *out_pad;         /* [num_heads_q][lib_head_dim] host staging */
  int table_dirty;        /* block_table changed since it was last copied to the device */
  /* kv_dtype set (host only) */
  void *kq_host, *vq_host; /* [num_pages][page_size][num_heads_kv][head_dim] kv_dtype */
  float *ks_host, *vs_host; /* fp8: [num_pages][page_size][num_heads_kv] per-token scales */
  uint16_t *k16, *v16;    /* [num_heads_kv][head_dim] the new row in bf16 */
  uint16_t *q16, *out16;  /* [num_heads_q][head_dim] bf16 */
} attention;

fd_status attention_init(attention *a, const attention_config *config, fd_error *err);
void attention_free(attention *a);

/* Start position pos: hand out a page per layer when pos opens one, set
 * kv_len = pos + 1, make the step's plan (kv_len_hint = kv_len). */
fd_status attention_begin_step(attention *a, int pos, fd_error *err);

/* Store k, v at position pos of `layer` and attend q over positions 0..pos. */
fd_status attention_layer(attention *a, int layer, int pos,
                          const float *q, /* [num_heads_q][head_dim] */
                          const float *k, /* [num_heads_kv][head_dim] */
                          const float *v, /* [num_heads_kv][head_dim] */
                          float *out,     /* [num_heads_q][head_dim] */
                          fd_error *err);

/* The float64 oracle (fd_reference_f64) for q over the host copy of `layer`'s
 * cache, positions 0..kv_len-1 (call after attention_layer stored them). */
fd_status attention_reference(attention *a, int layer,
                              const float *q, /* [num_heads_q][head_dim] */
                              double *out64,  /* [num_heads_q][head_dim] */
                              fd_error *err);

#endif /* FD_CLI_ATTENTION_H */
