/*
 * mla_fixture.h — one multi-head latent attention (MLA) test case: seeded
 * random q_nope, q_pe, c_kv and k_pe in the layouts engines use, one fd_run
 * on any backend, and every check against the float64 oracle
 * (fd_reference_f64). Backend-agnostic: the tensors fd_run reads live in
 * memory from an fd_mla_mem (fd_mla_host_mem for the CPU and reference
 * backends; a GPU test passes device functions, e.g. gpu_mem.h's).
 *
 * What a run checks: out and lse NaN-poisoned before the call, 64 guard
 * bytes around out, lse and the workspace intact after it, the inputs
 * unchanged (compared byte for byte with the host copies), cache positions
 * past kv_len and unused pages NaN (a backend that reads them fails), rows
 * that see no key out 0 / lse -inf, rows whose keys hold a NaN all NaN, the
 * others within the tolerance (per row, max|ours - ref| <= floor(dtype) *
 * max|ref|, fd_tol_out_floor; lse within fd_tol_lse) of the oracle.
 */
#ifndef FD_TEST_MLA_FIXTURE_H
#define FD_TEST_MLA_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"

#define FD_MLA_MAX_BATCH 16

/* Where fd_run's tensors live. Every function returns 0 on success. */
typedef struct fd_mla_mem {
  int (*alloc)(void **ptr, size_t bytes);
  int (*release)(void *ptr);
  int (*upload)(void *dst, const void *src_host, size_t bytes);
  int (*download)(void *dst_host, const void *src, size_t bytes);
  int (*sync)(void); /* after fd_run: waits, reports asynchronous errors */
} fd_mla_mem;

/* Host memory (malloc, memcpy). */
extern const fd_mla_mem fd_mla_host_mem;

typedef struct fd_mla_case {
  fd_backend backend;
  fd_dtype dtype;      /* q_nope, q_pe */
  fd_dtype kv_dtype;   /* 0 = dtype; fp8: c_kv quantized with the scales */
  fd_dtype rope_dtype; /* 0 = kv_dtype; else dtype (16-bit rope beside an fp8 latent) */
  fd_kv_scale kv_scale;
  int out_f32;         /* out_dtype FD_DTYPE_F32 */
  int32_t head_dim, rope_dim, num_heads_q, q_len, batch;
  int32_t kv_len[FD_MLA_MAX_BATCH];
  int32_t seq_id[FD_MLA_MAX_BATCH]; /* sequence b's inputs are drawn from (seed, seq_id[b]);
                                       all 0 = 0, 1, 2, ... (batch-invariance tests
                                       give one sequence the same id in two cases) */
  int32_t page_size;   /* 0 = contiguous; paged pools have scattered, shuffled pages */
  int combined;        /* c_kv and k_pe as two strided views of one [.., head_dim +
                          rope_dim] row per token (vLLM, FlashMLA); else two buffers */
  int q_combined;      /* q_nope and q_pe as views of one [.., heads, D + R] buffer */
  int32_t kv_capacity_pad; /* kv_capacity = longest kv_len + this (+1 when 0) */
  int32_t row_pad;     /* separate caches: c_kv rows this many elements longer, k_pe rows
                          twice this many (rows of unequal, unaligned strides) */
  int32_t num_splits;  /* fd_problem.num_splits */
  int deterministic;
  int with_lse;
  int32_t num_threads; /* CPU */
  int32_t cpu_isa;     /* CPU: 0 = fd_run; 1 + fd_cpu_isa (1 scalar, 2 AVX2, 3 AVX-512, 4 AVX-512
                          BF16) = fd_cpu_run_isa with that set forced (skipped where the
                          machine lacks it) */
  int nan_key;         /* 1: one latent element of sequence 0's key 0 is NaN: every row
                          of sequence 0 that sees a key must be NaN (out and lse) */
  int sweep_splits;    /* also run num_splits = 1 .. this many (each checked) */
  int check_determinism; /* run twice (fresh poison), bitwise equal */
} fd_mla_case;

void fd_mla_case_name(const fd_mla_case *c, char *buf, size_t size);

/* One case's tensors (host copies and the fd_mla_mem ones) and its oracle. */
typedef struct fd_mla_data fd_mla_data;
fd_mla_data *fd_mla_data_new(const fd_mla_case *c, uint64_t seed, const fd_mla_mem *mem);
void fd_mla_data_free(fd_mla_data *d);
/* The case's problem (num_splits as given, 0 = automatic). */
fd_problem fd_mla_data_problem(const fd_mla_data *d, int32_t num_splits);
/* fd_run's tensors (fd_mla_mem pointers, explicit strides) without out / lse. */
fd_tensors fd_mla_data_tensors(const fd_mla_data *d);
/* One checked fd_run with `plan`; out_bytes / lse_bytes (may be NULL) get a
 * malloc'd copy of what it wrote (dense; lse only with_lse). Returns the
 * number of failed checks (printed with `what`). */
int fd_mla_data_run(fd_mla_data *d, const fd_plan *plan, const char *what,
                    unsigned char **out_bytes, unsigned char **lse_bytes);
/* Bytes of one sequence's out / lse in those copies, and where sequence b's begin. */
size_t fd_mla_data_seq_out_bytes(const fd_mla_data *d);
size_t fd_mla_data_seq_lse_bytes(const fd_mla_data *d);

/* The whole case: the plan's run, the split sweep, determinism. Returns
 * failed checks. */
int fd_mla_case_run(const fd_mla_case *c, uint64_t seed, const fd_mla_mem *mem);
/* The cases as one cmocka group (FD_TEST_FILTER selects by name); the
 * process exit code. */
int fd_mla_run_group(const char *group, const fd_mla_case *cases, int count,
                     const fd_mla_mem *mem);

/* The MLA case grid of mla_cases.c for `backend` (CPU: every shape; CUDA:
 * its (512, 64) and (448, 64) shapes, 16-bit q); writes up to max cases. */
int fd_mla_grid_cases(fd_backend backend, fd_mla_case *cases, int max);

#endif /* FD_TEST_MLA_FIXTURE_H */
