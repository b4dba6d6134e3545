/*
 * harness.h — one attention test case: every parameter it has, the name that
 * reproduces it, and the run that builds seeded random inputs, calls fd_run
 * and checks the result against the float64 oracle (fd_reference_f64).
 * Shared by test_grid (CPU) and test_gpu_grid (CUDA); the tolerance policy is
 * documented at the top of harness.c.
 */
#ifndef FD_TEST_HARNESS_H
#define FD_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

#define FD_CASE_MAX_BATCH 16

/* How q, k_cache, v_cache, out and lse are laid out in memory. */
typedef enum fd_layout {
  FD_LAYOUT_CONTIG = 0,   /* documented shapes, all-zero strides passed */
  FD_LAYOUT_NONCONTIG = 1 /* q [batch, heads, q_len, dim] with padding; k [batch, heads, kv,
                             dim] (paged: [page, heads, position, dim]); v and out padded;
                             lse [batch, q_len, heads]; block_table rows padded */
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
  int32_t kv_capacity_pad;             /* kv_capacity = max kv_len + this */
  /* Extra checks; they do not change the inputs. */
  int check_splits;      /* also run with num_splits = 1 (or 7 when the case has 1) and compare */
  int check_determinism; /* run twice (different workspace garbage), outputs bitwise equal */
} fd_case;

/* Writes the case's reproducible name, e.g.
 * "cpu/bf16/d128/h32:8/b3/kv[0,1,4097]/q2/paged16/splits7/noncontig/lse". */
void fd_case_name(const fd_case *c, char *buf, size_t size);

/* The run's seed: FD_TEST_SEED from the environment when set, else fresh from
 * the clock. Each case derives its own seed from it and its name. */
uint64_t fd_test_seed(void);

/* Runs one case with inputs drawn from `seed`; prints every failed check to
 * stderr. Returns the number of failed checks (0 = pass). */
int fd_case_run(const fd_case *c, uint64_t seed);

/* Runs `cases` as one cmocka group (names from fd_case_name; FD_TEST_FILTER
 * in the environment selects cases by cmocka's wildcard pattern). Returns the
 * process exit code: 0 when every case passed. */
int fd_run_case_group(const char *group, const fd_case *cases, int count);

/* The grid of grid_cases.c for `backend` (FD_BACKEND_CPU or FD_BACKEND_CUDA):
 * writes up to `max` cases, returns how many. */
int fd_grid_cases(fd_backend backend, fd_case *cases, int max);

#endif /* FD_TEST_HARNESS_H */
