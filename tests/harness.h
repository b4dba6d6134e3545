/*
 * harness.h — one attention test case: every parameter it has, the name that
 * reproduces it, and the run that builds seeded random inputs, calls fd_run
 * and checks the result against the float64 oracle (fd_reference_f64).
 * Shared by test_grid (CPU), test_gpu_grid (CUDA) and tests/reliability,
 * which also use the lower-level fd_case_data (one case's tensors, run
 * several ways); the tolerance policy is documented at the top of harness.c.
 */
#ifndef FD_TEST_HARNESS_H
#define FD_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

#define FD_CASE_MAX_BATCH 64

/* How q, k_cache, v_cache, out and lse are laid out in memory. */
typedef enum fd_layout {
  FD_LAYOUT_CONTIG = 0,     /* documented shapes, all-zero strides passed */
  FD_LAYOUT_NONCONTIG = 1,  /* q [batch, heads, q_len, dim] with padding; k [batch, heads, kv,
                               dim] (paged: [page, heads, position, dim]); v and out padded;
                               lse [batch, q_len, heads]; block_table rows padded */
  FD_LAYOUT_HEAD_MAJOR = 2, /* dense, heads before tokens: q and out [batch, heads, q_len, dim],
                               k and v [batch, heads, kv, dim] (paged: [page, heads, position,
                               dim]), lse [batch, q_len, heads] */
  FD_LAYOUT_INTERLEAVED = 3 /* every tensor in the even slots of one twice as wide: q and out
                               heads 2h of [batch, q_len, 2 * heads, dim]; k and v heads 2hk of
                               [batch, kv, 2 * heads_kv, dim] (a fused buffer); lse element 2i of
                               [batch, heads, q_len, 2] */
} fd_layout;

typedef struct fd_case {
  fd_backend backend;
  fd_dtype dtype;
  int32_t head_dim;
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t batch;                       /* 1..FD_CASE_MAX_BATCH */
  int32_t kv_len[FD_CASE_MAX_BATCH];   /* [batch] */
  int32_t q_len;
  int32_t page_size;                   /* 0 = contiguous cache */
  fd_layout layout;
  int32_t num_splits;                  /* as fd_problem.num_splits (0 = automatic) */
  int with_lse;
  /* Optional; named only when not zero. */
  float softmax_scale;                 /* 0 = default 1/sqrt(head_dim) */
  int32_t num_threads;                 /* CPU worker threads, 0 = default */
  int32_t sm_count;                    /* CUDA: fd_problem.sm_count (0 = the device's). 1 makes
                                          every grid of more than one block run the 4-warp
                                          tensor-core kernel (two blocks an SM); it also changes
                                          the automatic split count (num_splits 0) */
  int32_t kv_capacity_pad;             /* kv_capacity = max kv_len + this */
  int32_t misalign;                    /* base pointers of q, k, v, out (and lse) moved this many
                                          elements past 64-byte alignment. CUDA: when that is not
                                          a 16-byte multiple the run must return
                                          FD_STATUS_UNSUPPORTED and write nothing */
  float input_scale;                   /* q and k drawn times this (0 = 1): large-norm inputs */
  int32_t cpu_isa;                     /* CPU: 0 = fd_run; 1 + fd_cpu_isa (1 scalar, 2 AVX2,
                                          3 AVX-512, 4 AVX-512 BF16, 5 AMX) = fd_cpu_run_isa with
                                          that set forced */
  int strict;                          /* out within floor(dtype) * max|ref| per row, without the
                                          K * plain term (for inputs whose softmax is one-hot) */
  float abs_floor;                     /* an absolute error also allowed per element (0 = none):
                                          rows of a few values can cancel to nearly 0, where the
                                          relative floor says nothing (head_dim < 16) */
  /* Attention variants (fd_problem's fields; zero = off, today's meaning). */
  int has_window;                      /* 1: fd_problem.has_window with window_left below */
  int32_t window_left;                 /* with has_window: >= 0, or -1 (= no window) */
  float logits_soft_cap;               /* 0 = off */
  int sinks;                           /* 1: fd_tensors.sinks, one float per query head drawn
                                          afresh: even heads in [-2, 4], odd heads in [4, 12]
                                          (a sink that dominates short rows) */
  int32_t nan_sink;                    /* with sinks: 1 + the query head whose sink is NaN (its
                                          rows must be NaN, every other row unaffected); 0 = none */
  int non_causal;                      /* fd_problem.non_causal: q_len up to 128 */
  int out_f32;                         /* fd_problem.out_dtype = FD_DTYPE_F32 (out is float32) */
  /* fp8 KV cache (fd_problem.kv_dtype / kv_scale; zero = a cache of dtype). K
   * and V are drawn as usual, divided by their scale and rounded to the fp8
   * type; scales are (1 + 3/4 u) 2^-k, k in 2..6 (TENSOR: one, HEAD: one a
   * head, TOKEN: one a (position, head), and the noncontig layout pads the
   * per-token array's rows). Positions past kv_len hold the fp8 NaN code and
   * NaN scales. */
  fd_dtype kv_dtype;
  fd_kv_scale kv_scale;
  /* Tree masks (fd_problem.tree_mask): NULL = none; else the caller's dense
   * [batch][q_len] masks (host memory, CPU and reference cases), named
   * "/tree<tree_name>". Rows see the prefix and the draft keys of their bits. */
  const uint64_t *tree_mask;
  const char *tree_name;
  /* Extra checks; they do not change the inputs. */
  int check_splits;      /* also run with num_splits = 1 (or 7 when the case has 1) and compare */
  int check_determinism; /* run twice (different workspace garbage), outputs bitwise equal */
} fd_case;

/* Writes the case's reproducible name, e.g.
 * "cpu/bf16/d128/h32:8/b3/kv[0,1,4097]/q2/paged16/splits7/noncontig/lse". */
void fd_case_name(const fd_case *c, char *buf, size_t size);

/* The keys query row t of sequence b sees: [*lo, *lo + return value); the
 * return value is <= 0 for a row that sees none (causal rows past kv_len, or
 * kv_len 0). Causal: position p = kv_len[b] - q_len + t, keys max(0, p - W) ..
 * p with a window W (has_window, window_left >= 0), 0 .. p without; non-causal:
 * 0 .. kv_len[b] - 1. */
int32_t fd_case_visible(const fd_case *c, int32_t b, int32_t t, int32_t *lo);
/* Whether row t of sequence b sees key j of [lo, lo + fd_case_visible): every
 * key but the draft keys a tree mask hides. */
int fd_case_sees(const fd_case *c, int32_t b, int32_t t, int32_t j);

/* The run's seed: FD_TEST_SEED from the environment when set, else fresh from
 * the clock. Each case derives its own seed from it and its name. */
uint64_t fd_test_seed(void);

/* The tests' random numbers: splitmix64 (Steele, Lea, Flood 2014). */
typedef struct fd_rng {
  uint64_t state;
} fd_rng;
uint64_t fd_mix64(uint64_t z);
uint64_t fd_rng_next(fd_rng *r);
double fd_rng_uniform(fd_rng *r);          /* in (0, 1), never 0 or 1 */
double fd_rng_normal(fd_rng *r);           /* standard normal (Box-Muller) */
uint64_t fd_rng_below(fd_rng *r, uint64_t n); /* in [0, n), 0 for n = 0 */

/* Runs one case with inputs drawn from `seed`; prints every failed check to
 * stderr. Returns the number of failed checks (0 = pass). */
int fd_case_run(const fd_case *c, uint64_t seed);

/* Runs `cases` as one cmocka group (names from fd_case_name; FD_TEST_FILTER
 * in the environment selects cases by cmocka's wildcard pattern, FD_TEST_SHARD=k/n
 * keeps the cases whose index is k modulo n), each with fd_case_run. Returns the
 * process exit code: 0 when every case passed. */
int fd_run_case_group(const char *group, const fd_case *cases, int count);
/* The same with `run` in place of fd_case_run (same contract: the number of
 * failed checks, printed to stderr). */
typedef int (*fd_case_fn)(const fd_case *c, uint64_t seed);
int fd_run_case_group_with(const char *group, const fd_case *cases, int count, fd_case_fn run);

/* The grid of grid_cases.c for `backend` (FD_BACKEND_CPU or FD_BACKEND_CUDA):
 * writes up to `max` cases, returns how many. */
int fd_grid_cases(fd_backend backend, fd_case *cases, int max);
/* The fp8 KV-cache cases of fp8_cases.c for `backend`, the same contract. */
int fd_fp8_grid_cases(fd_backend backend, fd_case *cases, int max);

/* Draft trees (tree_cases.c): row t's mask in mask[t] for n <= 64 nodes.
 * EAGLE-shaped (node t's parent a random earlier node, biased to recent
 * ones); the same renumbered by a random permutation (not lower-triangular);
 * Medusa-like (heads of width w); a chain (the causal rows); each row only
 * itself. */
void fd_tree_eagle(fd_rng *r, int n, uint64_t *mask);
void fd_tree_shuffle(fd_rng *r, int n, uint64_t *mask);
void fd_tree_wide(int n, int w, uint64_t *mask);
void fd_tree_chain(int n, uint64_t *mask);
void fd_tree_self(int n, uint64_t *mask);
/* The tree-mask grid for `backend` (FD_BACKEND_CPU: CPU and reference
 * cases; FD_BACKEND_CUDA) from `seed`: up to min(max, FD_TREE_MAX_CASES)
 * cases, whose masks live in tree_cases.c until the next call. */
#define FD_TREE_MAX_CASES 96
int fd_tree_cases(fd_backend backend, uint64_t seed, fd_case *cases, int max);

/* ---- Lower level: one case's tensors, run several ways (tests/reliability) -------- */

/* A case's tensors, built from a seed exactly as fd_case_run builds them (and
 * copied to the device for CUDA cases), with the float64 oracle's result. */
typedef struct fd_case_data fd_case_data;

/* NULL when out of memory or a device copy fails (printed to stderr). The
 * case must outlive the data. */
fd_case_data *fd_case_data_new(const fd_case *c, uint64_t seed);
void fd_case_data_free(fd_case_data *d);

/* A plan for the case's problem with num_splits replaced (0 = automatic).
 * Returns 0, or -1 (printed). */
int fd_case_data_plan(const fd_case_data *d, int32_t num_splits, fd_plan *plan);

/* The case's tensors with explicit strides, as fd_run gets them: device
 * pointers for CUDA. out and lse are the case's own buffers; tests that need
 * private outputs replace them (and their strides). */
fd_tensors fd_case_data_tensors(const fd_case_data *d);
/* The same tensors' host copies (what the oracle reads). */
fd_tensors fd_case_data_host_tensors(const fd_case_data *d);

/* What every cache element that no sequence may read holds (positions at or
 * past kv_len, unused pages, gaps between rows; with a window, the keys
 * before each sequence's first window start rounded down to chunk_len). */
typedef enum fd_pad_fill {
  FD_PAD_NAN = 0,      /* the quiet-NaN poison (what fd_case_data_new writes) */
  FD_PAD_ZERO = 1,     /* +0 */
  FD_PAD_NONFINITE = 2 /* NaN, +inf, -inf in turn */
} fd_pad_fill;
/* Rewrites the padding of k_cache and v_cache (and the device copies). */
int fd_case_data_fill_padding(fd_case_data *d, fd_pad_fill fill);

/* One run's result. */
typedef struct fd_case_output {
  double *out;              /* dense [batch][q_len][num_heads_q][head_dim] */
  double *lse;              /* dense [batch][num_heads_q][q_len] (when the case has lse) */
  unsigned char *out_bytes; /* raw copy of out (padding and guards excluded) */
  unsigned char *lse_bytes; /* raw copy of lse */
  size_t out_size, lse_size;
} fd_case_output;
void fd_case_output_free(fd_case_output *o);

/* One fd_run with `plan` as fd_case_run makes it: out and lse poisoned, the
 * workspace filled with `ws_fill` bytes; guard bytes, padding and the inputs
 * checked; out and lse compared with the oracle (tolerances of harness.c).
 * The result goes to *o (may be NULL). Returns the number of failed checks,
 * printed to stderr with `what`. */
int fd_case_data_run(fd_case_data *d, const fd_plan *plan, unsigned char ws_fill,
                     const char *what, fd_case_output *o);

/* The oracle's out (dense [batch][q_len][num_heads_q][head_dim]) and lse
 * (dense [batch][num_heads_q][q_len]). */
const double *fd_case_data_ref_out(const fd_case_data *d);
const double *fd_case_data_ref_lse(const fd_case_data *d);
/* The out check of fd_case_data_run alone, on a dense out (as
 * fd_case_output.out), without printing: the number of rows that fail it
 * (tests/test_tolerance.c, which shows the bound can fail). */
int fd_case_data_check_out(const fd_case_data *d, const double *out);
/* The case's name (as fd_case_name). */
const char *fd_case_data_name(const fd_case_data *d);

/* Size of one unit in the last place of `dtype` at magnitude |x| (for x = 0,
 * the smallest normal's). */
double fd_dtype_ulp(fd_dtype dtype, double x);

/* The tolerances of harness.c: the fixed floor of out (relative to a row's
 * largest |ref|) and the lse tolerance (relative to max(1, |ref|)). */
double fd_tol_out_floor(fd_dtype dtype);
double fd_tol_lse(fd_dtype dtype);

#endif /* FD_TEST_HARNESS_H */
