/*
 * test_gpu_select.c — which tensor-core split-kernel config each GPU class
 * runs (src/gpu_select.h), as a pure function of the budgets the CUDA
 * runtime reports for them (cudaDevAttrMaxSharedMemoryPerBlockOptin,
 * ...PerMultiprocessor, ReservedSharedMemoryPerBlock; the CUDA programming
 * guide's table per compute capability): no GPU needed. The same numbers are
 * the README's table of configs per GPU.
 *
 * Checked: the configs' shared memory (the kernel's fd_mma_cfg
 * static_asserts the same sizes); per GPU class and head_dim the 4-warp
 * config (FD_MMA_4W or FD_MMA_LEAN), its blocks per SM, whether the 8-warp
 * config may run, and PDL; code JIT-compiled from compute_80 PTX on a newer
 * GPU gets neither the 8-warp config nor PDL; FD_CUDA_SMEM_LIMIT_KB=100
 * makes an H200 plan exactly like an sm_86/89.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_select.h"

#define KB 1024

/* name, cc, SMs, smem a block (opt-in), smem an SM, reserved a block, code arch */
typedef struct gpu {
  const char *name;
  fd_gpu_budget g;
} gpu;

static const gpu A100 = {"A100 (sm_80)", {8, 0, 108, 163 * KB, 164 * KB, KB, 80}};
static const gpu ORIN = {"Jetson AGX Orin (sm_87)", {8, 7, 16, 163 * KB, 164 * KB, KB, 80}};
static const gpu A10 = {"A10 (sm_86)", {8, 6, 72, 99 * KB, 100 * KB, KB, 80}};
static const gpu L40S = {"L40S (sm_89)", {8, 9, 142, 99 * KB, 100 * KB, KB, 80}};
static const gpu H200 = {"H200 (sm_90a SASS)", {9, 0, 132, 227 * KB, 228 * KB, KB, 90}};
static const gpu H200_PTX80 = {"H200 running compute_80 PTX", {9, 0, 132, 227 * KB, 228 * KB, KB, 80}};
static const gpu B200_PTX80 = {"B200 (sm_100) running compute_80 PTX", {10, 0, 148, 227 * KB, 228 * KB, KB, 80}};
static const gpu RTX5090_PTX80 = {"RTX 5090 (sm_120) running compute_80 PTX", {12, 0, 170, 99 * KB, 100 * KB, KB, 80}};

static const int32_t HEAD_DIMS[] = {64, 80, 96, 128, 256};
#define NDIMS (sizeof HEAD_DIMS / sizeof *HEAD_DIMS)

static void test_config_sizes(void **state) {
  (void)state;
  /* bytes a block: K/V stages + Q + (m, l) + (M, L) + key flags */
  assert_int_equal(fd_mma_smem_bytes(64, FD_MMA_4W), 68480);   /* 4 stages of 64 keys */
  assert_int_equal(fd_mma_smem_bytes(80, FD_MMA_4W), 103232);  /* 128-wide rows */
  assert_int_equal(fd_mma_smem_bytes(96, FD_MMA_4W), 103232);
  assert_int_equal(fd_mma_smem_bytes(128, FD_MMA_4W), 103232); /* 3 stages of 64 keys */
  assert_int_equal(fd_mma_smem_bytes(256, FD_MMA_4W), 106976); /* 3 stages of 32 keys */
  assert_int_equal(fd_mma_smem_bytes(64, FD_MMA_WIDE), 200576);
  assert_int_equal(fd_mma_smem_bytes(128, FD_MMA_WIDE), 202240);
  assert_int_equal(fd_mma_smem_bytes(256, FD_MMA_WIDE), 205632);
  assert_int_equal(fd_mma_smem_bytes(64, FD_MMA_LEAN), 0);     /* no lean instance */
  assert_int_equal(fd_mma_smem_bytes(128, FD_MMA_LEAN), 70400);
  assert_int_equal(fd_mma_smem_bytes(256, FD_MMA_LEAN), 74176);
  assert_int_equal(fd_mma_smem_bytes(100, FD_MMA_4W), 0); /* no CUDA head_dim */
  /* every config fits Hopper's 227 KB a block; no 8-warp one fits an sm_80's 163 KB */
  for (size_t i = 0; i < NDIMS; i++) {
    assert_true(fd_mma_smem_bytes(HEAD_DIMS[i], FD_MMA_WIDE) <= 227 * KB);
    assert_true(fd_mma_smem_bytes(HEAD_DIMS[i], FD_MMA_WIDE) > 163 * KB);
    /* lean fits 99 KB a block; the 3-stage 4-warp block from head_dim 80 does not */
    if (HEAD_DIMS[i] != 64) {
      assert_true(fd_mma_smem_bytes(HEAD_DIMS[i], FD_MMA_LEAN) <= 99 * KB);
      assert_true(fd_mma_smem_bytes(HEAD_DIMS[i], FD_MMA_4W) > 99 * KB);
    }
  }
}

/* Expected per head_dim (64, 80, 96, 128, 256): config, blocks an SM. */
typedef struct expect {
  int cfg[NDIMS];
  int blocks[NDIMS];
  int wide; /* the 8-warp config may run (every head_dim alike) */
  int pdl;
} expect;

static void check_gpu(const gpu *d, const expect *e) {
  for (size_t i = 0; i < NDIMS; i++) {
    const int32_t hd = HEAD_DIMS[i];
    const int cfg = fd_mma_config_4w(&d->g, hd);
    if (cfg != e->cfg[i]) fail_msg("%s head_dim %d: config %d, expected %d", d->name, hd, cfg, e->cfg[i]);
    const int32_t blocks = fd_gpu_blocks_fit(&d->g, fd_mma_smem_bytes(hd, (fd_mma_config)cfg));
    if (blocks != e->blocks[i])
      fail_msg("%s head_dim %d: %d blocks an SM, expected %d", d->name, hd, blocks, e->blocks[i]);
    if (fd_mma_wide_ok(&d->g, hd) != e->wide)
      fail_msg("%s head_dim %d: 8-warp config %d, expected %d", d->name, hd, fd_mma_wide_ok(&d->g, hd), e->wide);
  }
  if (fd_gpu_pdl_ok(&d->g) != e->pdl) fail_msg("%s: PDL %d, expected %d", d->name, fd_gpu_pdl_ok(&d->g), e->pdl);
}

#define W FD_MMA_4W
#define L FD_MMA_LEAN

static void test_gpu_classes(void **state) {
  (void)state;
  /* sm_80 / sm_87: 164 KB an SM. 4-warp 3-stage everywhere; two blocks at
   * head_dim 64 (2 x 69,504 B), one from 80 on (2 x 104,256 B > 164 KB). */
  const expect ampere_big = {{W, W, W, W, W}, {2, 1, 1, 1, 1}, 0, 0};
  check_gpu(&A100, &ampere_big);
  check_gpu(&ORIN, &ampere_big);
  /* sm_86 / sm_89: 99 KB a block. head_dim 64: the 4-warp block (68,480 B),
   * one an SM; from 80 on the 3-stage block does not fit: lean, one an SM. */
  const expect small = {{W, L, L, L, L}, {1, 1, 1, 1, 1}, 0, 0};
  check_gpu(&A10, &small);
  check_gpu(&L40S, &small);
  check_gpu(&RTX5090_PTX80, &small);
  /* sm_90a: two 4-warp blocks an SM, the 8-warp config, PDL. */
  const expect hopper = {{W, W, W, W, W}, {3, 2, 2, 2, 2}, 1, 1};
  check_gpu(&H200, &hopper);
  /* compute_80 PTX JIT-compiled on a 228 KB GPU: the budget holds the 8-warp
   * block, but the code has no 8-warp body and no griddepcontrol. */
  const expect ptx80_big = {{W, W, W, W, W}, {3, 2, 2, 2, 2}, 0, 0};
  check_gpu(&H200_PTX80, &ptx80_big);
  check_gpu(&B200_PTX80, &ptx80_big);
}

static void test_limit(void **state) {
  (void)state;
  /* FD_CUDA_SMEM_LIMIT_KB=100 gives an H200 an sm_86's budget exactly. */
  fd_gpu_budget g = H200.g;
  fd_gpu_budget_limit(&g, 100);
  assert_int_equal(g.smem_sm, A10.g.smem_sm);
  assert_int_equal(g.smem_block, A10.g.smem_block);
  const gpu capped = {"H200 capped at 100 KB", g};
  const expect small_pdl = {{W, L, L, L, L}, {1, 1, 1, 1, 1}, 0, 1};
  check_gpu(&capped, &small_pdl);
  /* 164 gives an sm_80's */
  g = H200.g;
  fd_gpu_budget_limit(&g, 164);
  assert_int_equal(g.smem_sm, A100.g.smem_sm);
  assert_int_equal(g.smem_block, A100.g.smem_block);
  /* 0 and limits above the device's change nothing */
  g = A10.g;
  fd_gpu_budget_limit(&g, 0);
  assert_memory_equal(&g, &A10.g, sizeof g);
  fd_gpu_budget_limit(&g, 228);
  assert_memory_equal(&g, &A10.g, sizeof g);
  /* a budget below every config: none fits (the plan reports UNSUPPORTED) */
  g = H200.g;
  fd_gpu_budget_limit(&g, 64);
  assert_int_equal(fd_mma_config_4w(&g, 128), -1);
  assert_int_equal(fd_mma_config_4w(&g, 64), -1); /* 68,480 B > 63 KB */
  assert_int_equal(fd_mma_wide_ok(&g, 64), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_sizes),
      cmocka_unit_test(test_gpu_classes),
      cmocka_unit_test(test_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
