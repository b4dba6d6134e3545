/*
 * rel_dispatch.c — dispatch coverage: every head_dim 1..256
 * x group ratio x dtype x backend either works (matches the float64 oracle,
 * through the harness) or returns FD_STATUS_UNSUPPORTED from fd_plan_init
 * with a message naming head_dim — never an abort, never a wrong answer.
 *   CPU: every head_dim works, with the best instruction set and with each
 *        other one this machine has (scalar, AVX2, AVX-512 kernels);
 *   reference: every head_dim works;
 *   CUDA: head_dim 64, 128 and 256 work, every other one is unsupported
 *        (fd_plan_init and fd_decode), and fd_decode leaves out untouched.
 *   FD_CPU_ISA: each set this machine has is recorded in plan.cpu_isa and
 *        runs through fd_run; empty means auto; another name (one line in
 *        the message, control characters not echoed) or a set it lacks is
 *        refused.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "rel.h"

/* query heads : kv heads — MHA, GQA 2, an odd ratio, GQA 8 (as MQA) */
static const int32_t ratios[][2] = {{1, 1}, {2, 1}, {3, 1}, {8, 1}};
#define NRATIOS ((int)(sizeof ratios / sizeof *ratios))
static const fd_dtype dtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};

/* A small case that still splits (2 chunks) and has a row that sees no key
 * (q_len 2, kv_len 1). Rows of fewer than 16 values may cancel to nearly
 * zero, where the relative floor means nothing: they may also be off by
 * 1e-6 absolute (float32 accumulation over 70 keys of unit-sized values). */
static fd_case small_case(const rel_env *env, fd_backend backend, fd_dtype dtype, int32_t head_dim, int r) {
  fd_case c = rel_case(env);
  c.backend = backend;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.num_heads_q = ratios[r][0];
  c.num_heads_kv = ratios[r][1];
  c.batch = 2;
  c.kv_len[0] = 65 + head_dim % 7, c.kv_len[1] = 1;
  c.q_len = 2;
  c.abs_floor = head_dim < 16 ? 1e-6f : 0.0f;
  c.page_size = (head_dim + r) % 3 == 0 ? 16 : 0;
  c.layout = (head_dim + r + (int)dtype) % 4 == 0 ? FD_LAYOUT_NONCONTIG : FD_LAYOUT_CONTIG;
  c.num_splits = backend == FD_BACKEND_REFERENCE ? 0 : 2;
  c.with_lse = 1;
  return c;
}

/* fd_case_run over a set of cases, one failure message per case; fails the
 * test at the end with the count. */
static void run_all(const rel_env *env, fd_case *cases, int n, const char *what) {
  int failed = 0;
  for (int i = 0; i < n; i++)
    if (fd_case_run(&cases[i], env->seed)) failed++;
  printf("  %s: %d cases, %d failed\n", what, n, failed);
  if (failed)
    fail_msg("%s: %d of %d cases failed (FD_TEST_SEED=%llu)", what, failed, n, (unsigned long long)env->seed);
}

static void cpu_every_head_dim_and_ratio(void **state) {
  const rel_env *env = REL_ENV(state);
  static fd_case cases[256 * NRATIOS * 3];
  int n = 0;
  for (int32_t d = 1; d <= 256; d++)
    for (int r = 0; r < NRATIOS; r++)
      for (int t = 0; t < 3; t++) cases[n++] = small_case(env, FD_BACKEND_CPU, dtypes[t], d, r);
  run_all(env, cases, n, "CPU, every head_dim x ratio x dtype");
}

static void cpu_every_isa_every_head_dim(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_cpu_isa best = fd_cpu_isa_detect();
  static fd_case cases[(FD_CPU_ISA_AMX + 1) * 256 * 3];
  int n = 0;
  for (int isa = FD_CPU_ISA_SCALAR; isa <= (int)best; isa++)
    for (int32_t d = 1; d <= 256; d++)
      for (int t = 0; t < 3; t++) {
        fd_case c = small_case(env, FD_BACKEND_CPU, dtypes[t], d, 1);
        c.cpu_isa = isa + 1;
        cases[n++] = c;
      }
  char what[64];
  snprintf(what, sizeof what, "CPU kernels scalar..%s, every head_dim x dtype",
           best == FD_CPU_ISA_AMX           ? "AMX"
           : best == FD_CPU_ISA_AVX512_BF16 ? "AVX-512 BF16"
           : best == FD_CPU_ISA_AVX512 ? "AVX-512"
           : best == FD_CPU_ISA_AVX2 ? "AVX2"
                                     : "scalar");
  run_all(env, cases, n, what);
}

/* The FD_CPU_ISA switch (read by fd_plan_init): unset, the best set; each
 * name of a set this machine has, that set, recorded in plan.cpu_isa, and a
 * few cases through fd_run (the harness plans them under it); a set above
 * the best UNSUPPORTED; another name INVALID_ARGUMENT, naming the variable. */
static void cpu_isa_environment_switch(void **state) {
  const rel_env *env = REL_ENV(state);
  static const char *const names[] = {"scalar", "avx2", "avx512", "avx512_bf16", "amx"};
  const fd_cpu_isa best = fd_cpu_isa_available();
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CPU;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 1;
  p.num_heads_q = 4;
  p.num_heads_kv = 1;
  p.head_dim = 128;
  p.kv_capacity = 64;
  fd_plan plan;
  fd_error err;
  unsetenv("FD_CPU_ISA");
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  assert_int_equal(plan.cpu_isa, (int32_t)fd_cpu_isa_detect());
  for (int i = 0; i < 5; i++) {
    setenv("FD_CPU_ISA", names[i], 1);
    memset(&plan, 0xff, sizeof plan);
    const fd_status st = fd_plan_init(&plan, &p, &err);
    if (i > (int)best) {
      assert_int_equal(st, FD_STATUS_UNSUPPORTED);
      continue;
    }
    assert_int_equal(st, FD_STATUS_OK);
    assert_int_equal(plan.cpu_isa, i);
    fd_case cases[3];
    for (int t = 0; t < 3; t++) cases[t] = small_case(env, FD_BACKEND_CPU, dtypes[t], 96 + 32 * t, 1 + t);
    char what[64];
    snprintf(what, sizeof what, "FD_CPU_ISA=%s, fd_run", names[i]);
    run_all(env, cases, 3, what);
  }
  setenv("FD_CPU_ISA", "avx9", 1);
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "FD_CPU_ISA"));
  /* a control character is not echoed: the message stays one line */
  setenv("FD_CPU_ISA", "amx\nscalar", 1);
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(err.message, "FD_CPU_ISA"));
  assert_null(strchr(err.message, '\n'));
  /* empty: auto */
  setenv("FD_CPU_ISA", "", 1);
  assert_int_equal(fd_plan_init(&plan, &p, &err), FD_STATUS_OK);
  assert_int_equal(plan.cpu_isa, (int32_t)fd_cpu_isa_detect());
  unsetenv("FD_CPU_ISA");
}

static void reference_every_head_dim(void **state) {
  const rel_env *env = REL_ENV(state);
  static fd_case cases[256 * 3];
  int n = 0;
  for (int32_t d = 1; d <= 256; d++)
    for (int t = 0; t < 3; t++)
      cases[n++] = small_case(env, FD_BACKEND_REFERENCE, dtypes[t], d, (d + 2 * t) % NRATIOS);
  run_all(env, cases, n, "reference, every head_dim x dtype");
}

/* CUDA: head_dim 64, 80, 96, 128 and 256 run; every other one is refused cleanly. */
static void cuda_head_dims_run_or_refused(void **state) {
  const rel_env *env = REL_ENV(state);
  static fd_case cases[5 * NRATIOS * 3];
  int n = 0, refused = 0;
  for (int32_t d = 1; d <= 257; d++)
    for (int r = 0; r < NRATIOS; r++)
      for (int t = 0; t < 3; t++) {
        const int supported = d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
        if (supported && rel_quick() && r != (d / 64 + t) % NRATIOS) continue; /* quick: one ratio each */
        if (supported) {
          cases[n++] = small_case(env, FD_BACKEND_CUDA, dtypes[t], d, r);
          continue;
        }
        fd_problem p;
        memset(&p, 0, sizeof p);
        p.backend = FD_BACKEND_CUDA;
        p.dtype = dtypes[t];
        p.batch = 2;
        p.num_heads_q = ratios[r][0];
        p.num_heads_kv = ratios[r][1];
        p.head_dim = d;
        p.kv_capacity = 100;
        const fd_status want = d == 257 ? FD_STATUS_INVALID_ARGUMENT : FD_STATUS_UNSUPPORTED;
        fd_plan plan;
        fd_error err;
        memset(&err, 0, sizeof err);
        fd_status st = fd_plan_init(&plan, &p, &err);
        if (st != want || !strstr(err.message, "head_dim"))
          fail_msg("CUDA head_dim %d: fd_plan_init returned %s (\"%s\"), want %s naming head_dim", d,
                   fd_status_name(st), err.message, fd_status_name(want));
        /* fd_decode refuses before touching any pointer: these are host pointers the device must not see */
        if (r == 0 && t == 0) {
          float dummy[4] = {0};
          int32_t kv_len[2] = {1, 1};
          fd_tensors tens;
          memset(&tens, 0, sizeof tens);
          tens.q = dummy, tens.k_cache = dummy, tens.v_cache = dummy, tens.kv_len = kv_len, tens.out = dummy;
          st = fd_decode(&p, &tens, NULL, &err);
          if (st != want)
            fail_msg("CUDA head_dim %d: fd_decode returned %s, want %s", d, fd_status_name(st),
                     fd_status_name(want));
        }
        refused++;
      }
  printf("  CUDA: %d head_dim x ratio x dtype refused as documented\n", refused);
  run_all(env, cases, n, "CUDA, head_dim 64/128/256 x ratio x dtype");
}

rel_group rel_group_dispatch(fd_backend backend) {
  static const struct CMUnitTest cpu[] = {
      {"cpu_every_head_dim_and_ratio", cpu_every_head_dim_and_ratio, NULL, NULL, NULL},
      {"cpu_every_isa_every_head_dim", cpu_every_isa_every_head_dim, NULL, NULL, NULL},
      {"cpu_isa_environment_switch", cpu_isa_environment_switch, NULL, NULL, NULL},
      {"reference_every_head_dim", reference_every_head_dim, NULL, NULL, NULL},
  };
  static const struct CMUnitTest cuda[] = {
      {"cuda_head_dims_run_or_refused", cuda_head_dims_run_or_refused, NULL, NULL, NULL},
  };
  rel_group g = {"dispatch", cpu, sizeof cpu / sizeof *cpu};
  rel_group gc = {"dispatch", cuda, sizeof cuda / sizeof *cuda};
  return backend == FD_BACKEND_CUDA ? gc : g;
}
