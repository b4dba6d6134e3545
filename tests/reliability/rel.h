/*
 * rel.h — what the reliability tests share: the test environment
 * (backend, seed, quick mode), memory on the backend's side of the bus, a
 * case runner that fails the cmocka test, and output comparisons.
 *
 * Every test function takes the cmocka state `rel_env *`: the same test body
 * runs for the CPU backend (test_reliability cpu <group>) and for the CUDA
 * backend (test_reliability cuda <group>, which exits 77 without a GPU).
 */
#ifndef FD_TEST_REL_H
#define FD_TEST_REL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "flashdecode.h"
#include "harness.h"

typedef struct rel_env {
  fd_backend backend; /* FD_BACKEND_CPU or FD_BACKEND_CUDA */
  uint64_t seed;      /* fd_test_seed() of the run */
} rel_env;

#define REL_ENV(state) ((const rel_env *)*(state))

/* FD_TEST_QUICK=1 in the environment: shrink the huge cases (1M tokens, pools
 * above 4 GiB) for the compute-sanitizer runs. */
int rel_quick(void);

/* A case's backend: env's, with head_dim as given (callers pick CUDA ones). */
fd_case rel_case(const rel_env *env);

/* fd_case_run; fails the cmocka test (with the reproducing seed) on failure. */
void rel_run_case(const rel_env *env, const fd_case *c);

/* fd_case_data_new, or fail the test. */
fd_case_data *rel_data(const rel_env *env, const fd_case *c);
/* A plan for d with num_splits, or fail the test. */
fd_plan rel_plan(const fd_case_data *d, int32_t num_splits);
/* fd_case_data_run; fails the test when a check failed or o->out is missing. */
void rel_data_run(fd_case_data *d, const fd_plan *plan, unsigned char ws_fill, const char *what,
                  fd_case_output *o);

/* ---- Memory where the backend computes: host (CPU, reference) or device ---- */
void *rel_alloc(fd_backend backend, size_t bytes); /* fails the test when out of memory */
void rel_free(fd_backend backend, void *ptr);
void rel_put(fd_backend backend, void *dst, const void *src_host, size_t bytes);
void rel_get(fd_backend backend, void *dst_host, const void *src, size_t bytes);
void rel_fill(fd_backend backend, void *dst, unsigned char byte, size_t bytes);
/* Waits for the device (CUDA) and fails the test on an asynchronous error. */
void rel_sync(fd_backend backend);

/* fd_run with private out, lse and workspace (allocated on the backend's
 * side, NaN-poisoned, workspace `ws_fill`): t's out/lse are replaced by them,
 * with dense strides. The raw results come back in host buffers out_host
 * (batch*q_len*num_heads_q*head_dim elements of the out dtype) and lse_host
 * (batch*num_heads_q*q_len floats). Returns fd_run's status. */
fd_status rel_run_private(const fd_plan *plan, const fd_tensors *t, unsigned char ws_fill, void *stream,
                          void *out_host, float *lse_host, fd_error *err);

/* Element i of a buffer of `dtype` as double. */
double rel_load(fd_dtype dtype, const void *base, int64_t i);
void rel_store(fd_dtype dtype, void *base, int64_t i, double x);

/* Out of problem p (dense [batch][q_len][num_heads_q][head_dim], its
 * out_dtype, 0 = dtype) vs the float64 oracle, per row within
 * factor * floor(dtype) * max|ref| + abs_tol, and lse (dense
 * [batch][num_heads_q][q_len], may be NULL) within
 * tol_lse(dtype) * max(1, |ref|) + lse_abs_tol; rows that see no key (causal,
 * window and non_causal as p says) exactly 0 and -inf; everything finite.
 * Returns failures (printed, with `what`). */
int rel_check_dense(const fd_problem *p, const int32_t *kv_len_host, const void *out, const float *lse,
                    const double *ref, const double *ref_lse, double factor, double abs_tol,
                    double lse_abs_tol, const char *what);
/* rel_check_dense for a problem with sinks (sinks_host [num_heads_q], or
 * NULL): a row that sees no key has lse = its sink. Both read the window and
 * non_causal fields of p, and out in p's out_dtype. */
int rel_check_dense_sinks(const fd_problem *p, const int32_t *kv_len_host, const float *sinks_host,
                          const void *out, const float *lse, const double *ref, const double *ref_lse,
                          double factor, double abs_tol, double lse_abs_tol, const char *what);

/* The keys row t of a sequence of kv_len keys sees under problem p (window,
 * non_causal): [*lo, *lo + return value), <= 0 for none. */
int32_t rel_visible(const fd_problem *p, int32_t kv_len, int32_t t, int32_t *lo);

/* Runs the float64 oracle over host tensors `t` (explicit strides) for
 * problem p (backend ignored) into malloc'ed ref / ref_lse. */
void rel_oracle(const fd_problem *p, const fd_tensors *t, double **ref, double **ref_lse);

/* Bitwise equality of n bytes; fails the test naming `what` and the first
 * differing byte. */
void rel_assert_same(const void *a, const void *b, size_t n, const char *what);

/* ---- Test groups (test_reliability.c) ---- */
typedef struct rel_group {
  const char *name;
  const struct CMUnitTest *tests;
  size_t count;
} rel_group;

rel_group rel_group_numerics(fd_backend backend);    /* values: empty rows, splits, padding, lse, logits */
rel_group rel_group_layout(fd_backend backend);      /* 64-bit offsets, strides, alignment, page ids */
rel_group rel_group_capacity(fd_backend backend);    /* long sequences, split and workspace limits */
rel_group rel_group_dispatch(fd_backend backend);    /* every head_dim, ratio, dtype, CPU ISA */
rel_group rel_group_concurrency(fd_backend backend); /* threads (CPU) / threads on streams (CUDA) */
rel_group rel_group_graphs(fd_backend backend);      /* CUDA graph replay (CUDA only) */
rel_group rel_group_trust(fd_backend backend);       /* long sums, NaN, deterministic mode */
rel_group rel_group_variants(fd_backend backend);    /* the attention variants, deterministic mode */
rel_group rel_group_edges(fd_backend backend);       /* float32 / int32 range ends, refused soft-caps */

/* The programs' main: runs group argv[1] (or every group) for backend. */
int rel_main(fd_backend backend, int argc, char **argv);

#endif /* FD_TEST_REL_H */
