/*
 * problem.h — what `bench` and `check` share: their command-line flags
 * (one attention problem), and the problem's random host inputs in the
 * library's layouts, plus device copies of them for the CUDA backend.
 */
#ifndef FD_CLI_PROBLEM_H
#define FD_CLI_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

#define PROBLEM_MAX_KV_LENS 1024

/* problem_args.sinks */
enum { SINKS_NONE = 0, SINKS_RANDOM = 1, SINKS_VALUE = 2 };

typedef struct problem_args {
  fd_backend backend;  /* as given (AUTO resolved by problem_resolve_backend) */
  fd_dtype dtype;
  fd_dtype kv_dtype;   /* 0 = dtype; FD_DTYPE_E4M3 / E5M2: an fp8 cache */
  fd_kv_scale kv_scale; /* fp8 scales (default tensor with an fp8 cache) */
  int kv_scale_set;    /* --kv-scale given */
  int batch;
  int q_len;
  int num_heads_q;
  int num_heads_kv;
  int num_heads_kv_set; /* --num-heads-kv given */
  int head_dim;        /* MLA: the latent width (512) */
  int rope_dim;        /* 0 = standard attention; > 0: MLA with this rope width (64) */
  fd_dtype rope_dtype; /* MLA: the rope cache's type; 0 = the latent's (kv_dtype) */
  float softmax_scale; /* 0 = the library's default (1/sqrt(head_dim)); MLA: 1/sqrt(192) */
  int page_size;       /* 0 = contiguous cache */
  int num_splits;      /* 0 = automatic */
  int num_threads;     /* CPU: 0 = all cores */
  int iters;           /* bench: timed iterations (0 = the backend's default) */
  uint64_t seed;
  /* attention variants */
  int window_left;       /* -1 = no window (default) */
  float logits_soft_cap; /* 0 = off */
  int sinks;             /* SINKS_NONE, SINKS_RANDOM or SINKS_VALUE */
  float sinks_value;     /* SINKS_VALUE: every head's sink */
  int non_causal;        /* 1: every query row sees all kv_len keys */
  int tree;              /* > 0: --tree N, a random N-node draft tree (q_len = N, tree mask) */
  int no_pdl;            /* 1: the first CUDA kernel without programmatic dependent launch */
  int32_t kv_lens[PROBLEM_MAX_KV_LENS]; /* --kv-len list, repeated over the batch */
  int n_kv_lens;
} problem_args;

/* Parses the flags of `bench` or `check` (argv[0] is the subcommand).
 * Returns 0, 1 when --help was printed, or -1 (message printed). */
int problem_parse(problem_args *args, int argc, char **argv);

/* AUTO -> CUDA when it can run, else CPU. CUDA without a GPU: message on
 * stderr, -1. */
int problem_resolve_backend(problem_args *args);

/* One set of tensors; host or device pointers. */
typedef struct problem_tensors {
  void *q;              /* [batch][q_len][num_heads_q][head_dim] dtype (MLA: q_nope) */
  void *k_cache;        /* [batch][kv_capacity][num_heads_kv][head_dim] or [num_pages][page_size][...]
                           (MLA: the latent c_kv, one kv head) */
  void *v_cache;        /* same as k_cache; NULL for MLA (the values are the latent) */
  void *q_pe;           /* MLA: [batch][q_len][num_heads_q][rope_dim] dtype; else NULL */
  void *k_pe_cache;     /* MLA: as k_cache with rope_dim columns, rope dtype; else NULL */
  void *out;            /* [batch][q_len][num_heads_q][head_dim] dtype */
  float *lse;           /* [batch][num_heads_q][q_len] */
  int32_t *kv_len;      /* [batch] */
  int32_t *block_table; /* [batch][max_pages_per_seq]; paged only */
  float *k_scale;       /* fp8 scales: [1], [num_heads_kv] or the cache's shape without head_dim */
  float *v_scale;
  float *sinks;         /* [num_heads_q]; NULL without --sinks */
  uint64_t *tree_mask;  /* --tree: [batch][q_len]; else NULL */
} problem_tensors;

typedef struct problem {
  fd_problem fd;        /* backend resolved, kv_len_hint NULL */
  int32_t kv_capacity;  /* the longest kv_len */
  int32_t max_pages_per_seq, num_pages; /* paged only */
  size_t q_bytes, kv_bytes, out_bytes, lse_bytes, kv_len_bytes, table_bytes; /* kv_bytes: each of K, V */
  size_t v_bytes;       /* kv_bytes, or 0 for MLA (no V buffer) */
  size_t q_pe_bytes, k_pe_bytes; /* MLA: q_pe, k_pe_cache; else 0 */
  size_t scale_bytes;   /* each of k_scale, v_scale (0 without scales) */
  size_t v_scale_bytes; /* scale_bytes, or 0 for MLA (k_scale only) */
  size_t sinks_bytes;   /* 0 without sinks */
  problem_tensors host;
} problem;

/* Allocates the host tensors and fills q, K, V with random values (uniform,
 * unit variance, rounded to the dtype), kv_len from the args, and, when
 * paged, a block_table that hands out the pool's pages in a random order;
 * then the sinks (--sinks: one value for every head, or drawn per head). The
 * variant flags go into fd (has_window, window_left, logits_soft_cap,
 * non_causal). */
fd_status problem_make(problem *p, const problem_args *args, fd_error *err);
void problem_free(problem *p);

/* fd_tensors over a set (host or device) with every stride explicit. */
fd_tensors problem_fd_tensors(const problem *p, const problem_tensors *set);

/* Bytes of K and V a call reads: 2 * sum keys * num_heads_kv * head_dim * sizeof(kv dtype), keys =
 * kv_len, or with a window the keys some row sees, min(kv_len, window_left + q_len); plus 2 * 4
 * bytes per (key, kv head) for per-token fp8 scales. MLA: the cache once, sum keys * (head_dim *
 * sizeof(kv dtype) + rope_dim * sizeof(rope dtype)) (+ 4 bytes per key for per-token scales). */
double problem_kv_bytes_read(const problem *p);

/* Bytes of one set of call buffers: q (+ q_pe), the caches, out and lse. */
double problem_set_bytes(const problem *p);
/* Bytes of one set's caches (K, V or the MLA latent and rope caches). */
double problem_cache_bytes(const problem *p);

/* Fills the host out and lse with NaN. */
void problem_poison_outputs(problem *p);

/* Device sets (CUDA): allocate one; copy the host set into it. kv_len,
 * block_table, sinks and tree_mask may be shared: pass share = a set whose ones to reuse,
 * or NULL. */
fd_status problem_device_alloc(const problem *p, problem_tensors *dev, const problem_tensors *share,
                               fd_error *err);
fd_status problem_device_upload(const problem *p, problem_tensors *dev, void *stream, fd_error *err);
void problem_device_free(problem_tensors *dev, const problem_tensors *share);

/* One line "backend=.. dtype=.. batch=.. ..." describing the problem. */
void problem_describe(const problem *p, const problem_args *args, char *text, size_t text_size);

#endif /* FD_CLI_PROBLEM_H */
