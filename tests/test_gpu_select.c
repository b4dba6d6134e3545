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
 *
 * `test_gpu_select device` (ctest test_gpu_select_device, label gpu; exits
 * 77 without a usable GPU): the facts of device 0 as the CUDA backend reads
 * them, printed, and checked against the build: the loaded code's
 * architecture is the one FD_CUDA_ARCHS gives this GPU (e.g. 80 for an
 * 80-virtual build on an H200: JIT-compiled PTX), PDL only for sm_90+ code,
 * the budget capped by FD_CUDA_SMEM_LIMIT_KB, and the plan's config and
 * blocks per SM for every dtype and head_dim (the lean config from head_dim
 * 80 at a 100 KB cap).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "flashdecode.h"
#include "gpu_select.h"
#include "internal.h"

#ifndef FD_TEST_CUDA_ARCHS
#define FD_TEST_CUDA_ARCHS ""
#endif
#ifndef FD_TEST_SMEM_LIMIT_KB
#define FD_TEST_SMEM_LIMIT_KB 0
#endif

#define KB 1024

/* name, cc, SMs, smem a block (opt-in), smem an SM, reserved a block, code arch */
typedef struct gpu {
  const char *name;
  fd_gpu_budget g;
} gpu;

static const gpu A100 = {"A100 (sm_80)", {8, 0, 108, 163 * KB, 164 * KB, KB, 80, 0}};
static const gpu ORIN = {"Jetson AGX Orin (sm_87)", {8, 7, 16, 163 * KB, 164 * KB, KB, 80, 0}};
static const gpu A10 = {"A10 (sm_86)", {8, 6, 72, 99 * KB, 100 * KB, KB, 80, 0}};
static const gpu L40S = {"L40S (sm_89)", {8, 9, 142, 99 * KB, 100 * KB, KB, 80, 0}};
static const gpu H200 = {"H200 (sm_90a SASS)", {9, 0, 132, 227 * KB, 228 * KB, KB, 90, 1}};
static const gpu H200_PTX80 = {"H200 running compute_80 PTX", {9, 0, 132, 227 * KB, 228 * KB, KB, 80, 0}};
static const gpu B200_PTX80 = {"B200 (sm_100) running compute_80 PTX", {10, 0, 148, 227 * KB, 228 * KB, KB, 80, 0}};
static const gpu RTX5090_PTX80 = {"RTX 5090 (sm_120) running compute_80 PTX", {12, 0, 170, 99 * KB, 100 * KB, KB, 80, 0}};

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

/* ---- device 0 (`test_gpu_select device`) ---- */

/* The virtual architecture the CUDA runtime loads on a GPU of compute
 * capability cc (e.g. 90) from FD_CUDA_ARCHS ("80,90a-real"): the newest
 * SASS of the same major version not above it ('a'/'f' SASS: the same
 * version only), else the newest PTX not above it ('a' PTX: the same version
 * only); 0 when none. */
static int expected_code_arch(const char *archs, int cc) {
  int sass = 0, ptx = 0;
  const char *p = archs;
  while (*p) {
    char item[32];
    size_t n = strcspn(p, ",;");
    if (n >= sizeof item) n = sizeof item - 1;
    memcpy(item, p, n);
    item[n] = 0;
    p += n;
    if (*p) p++;
    int num = 0;
    const char *q = item;
    while (*q >= '0' && *q <= '9') num = num * 10 + (*q++ - '0');
    const int specific = *q == 'a' || *q == 'f';
    if (specific) q++;
    const int real = strcmp(q, "-virtual") != 0;
    const int virt = strcmp(q, "-real") != 0;
    if (num == 0 || num > cc || (specific && num != cc)) continue;
    if (real && num / 10 == cc / 10 && num > sass) sass = num;
    if (virt && num > ptx) ptx = num;
  }
  return sass ? sass : ptx;
}

static void test_expected_code_arch(void **state) {
  (void)state;
  /* the default build */
  assert_int_equal(expected_code_arch("80,90a-real", 90), 90);  /* H100/H200: sm_90a SASS */
  assert_int_equal(expected_code_arch("80,90a-real", 80), 80);  /* A100 */
  assert_int_equal(expected_code_arch("80,90a-real", 86), 80);  /* sm_80 SASS runs on 8.6, 8.9 */
  assert_int_equal(expected_code_arch("80,90a-real", 89), 80);
  assert_int_equal(expected_code_arch("80,90a-real", 100), 80); /* B200: compute_80 PTX */
  assert_int_equal(expected_code_arch("80,90a-real", 120), 80); /* RTX 50xx */
  assert_int_equal(expected_code_arch("80,90a-real", 75), 0);
  /* other builds */
  assert_int_equal(expected_code_arch("80-virtual", 90), 80);
  assert_int_equal(expected_code_arch("90a-real", 80), 0);
  assert_int_equal(expected_code_arch("90a-real", 100), 0);     /* 'a' SASS: 9.0 only */
  assert_int_equal(expected_code_arch("86-real", 80), 0);       /* no SASS runs on an older minor */
  assert_int_equal(expected_code_arch("80-real,90-virtual", 100), 90);
  assert_int_equal(expected_code_arch("80;100a-real", 103), 80);
}

static const char *config_name(int cfg) {
  switch (cfg) {
    case FD_MMA_4W: return "4-warp";
    case FD_MMA_WIDE: return "8-warp";
    case FD_MMA_LEAN: return "4-warp lean (2 stages)";
  }
  return "none";
}

static int device_main(void) {
  fd_error err;
  fd_gpu_budget g;
  if (fd_cuda_device_budget(0, &g, &err) != FD_STATUS_OK) {
    printf("%s\n", err.message);
    /* a GPU this build should run but cannot: a failure; no (usable) GPU: skipped */
    if (strstr(err.message, "holds no kernels") || strstr(err.message, "cannot load")) return 1;
    printf("SKIP: no GPU the CUDA backend can use\n");
    return 77;
  }
  int fails = 0;
#define CHECK(cond, ...)                \
  do {                                  \
    if (!(cond)) {                      \
      printf("FAIL: " __VA_ARGS__);     \
      printf("\n");                     \
      fails++;                          \
    }                                   \
  } while (0)
  const int cc = g.cc_major * 10 + g.cc_minor;
  printf("device 0: compute capability %d.%d, %d SMs; shared memory %d B a block, %d B an SM, "
         "%d B reserved a block%s\n",
         g.cc_major, g.cc_minor, g.sm_count, g.smem_block, g.smem_sm, g.smem_reserved,
         FD_TEST_SMEM_LIMIT_KB > 0 ? " (FD_CUDA_SMEM_LIMIT_KB applied)" : "");
  printf("build: FD_CUDA_ARCHS=%s, FD_CUDA_SMEM_LIMIT_KB=%d; loaded code: compute_%d; PDL %s, "
         "8-warp config %s\n",
         FD_TEST_CUDA_ARCHS, FD_TEST_SMEM_LIMIT_KB, g.code_arch, fd_cuda_pdl(0) ? "on" : "off",
         fd_mma_wide_ok(&g, 128) ? "available" : "not available");
  const int want_arch = expected_code_arch(FD_TEST_CUDA_ARCHS, cc);
  CHECK(g.code_arch == want_arch, "loaded code compute_%d, FD_CUDA_ARCHS gives compute_%d here",
        g.code_arch, want_arch);
  CHECK(fd_cuda_pdl(0) == (g.code_arch >= 90), "PDL %d with code compute_%d", fd_cuda_pdl(0),
        g.code_arch);
  if (FD_TEST_SMEM_LIMIT_KB > 0) {
    CHECK(g.smem_sm <= FD_TEST_SMEM_LIMIT_KB * 1024, "%d B an SM above the %d KB cap", g.smem_sm,
          FD_TEST_SMEM_LIMIT_KB);
    CHECK(g.smem_block <= FD_TEST_SMEM_LIMIT_KB * 1024 - g.smem_reserved,
          "%d B a block above the cap", g.smem_block);
  }
  const fd_dtype dtypes[] = {FD_DTYPE_F16, FD_DTYPE_BF16, FD_DTYPE_F32};
  for (size_t di = 0; di < 3; di++) {
    for (size_t i = 0; i < NDIMS; i++) {
      const int32_t hd = HEAD_DIMS[i];
      fd_cuda_fit fit;
      const fd_status st = fd_cuda_device_fit(0, dtypes[di], hd, 1, &fit, &err);
      CHECK(st == FD_STATUS_OK, "dtype %d head_dim %d: %s", (int)dtypes[di], hd, err.message);
      if (st != FD_STATUS_OK) continue;
      const int32_t bps = fit.split_blocks;
      /* the 8-warp config: 16-bit q and cache where the device holds it */
      const int wide = dtypes[di] != FD_DTYPE_F32 && fd_mma_wide_ok(&fit.g, hd);
      CHECK(memcmp(&fit.g, &g, sizeof g) == 0, "dtype %d head_dim %d: another budget",
            (int)dtypes[di], hd);
      if (dtypes[di] != FD_DTYPE_F32 && (hd == 64 || hd == 128))
        CHECK(fit.rows_blocks == 0 || fit.rows_blocks <= fd_gpu_blocks_fit(&g, FD_ROWS_SMEM(hd)),
              "head_dim %d: %d rows-kernel blocks an SM", hd, fit.rows_blocks);
      CHECK(bps >= 1, "dtype %d head_dim %d: %d blocks an SM", (int)dtypes[di], hd, bps);
      if (dtypes[di] == FD_DTYPE_F32) {
        if (di == 2 && i == 0) printf("  float32 (CUDA cores):");
        printf(" d%d %d/SM%s", hd, bps, i + 1 == NDIMS ? "\n" : ";");
        CHECK(!wide, "float32 head_dim %d: 8-warp config", hd);
        continue;
      }
      const int cfg = fd_mma_config_4w(&g, hd);
      const size_t smem = fd_mma_smem_bytes(hd, (fd_mma_config)cfg);
      if (di == 1)
        printf("  16-bit head_dim %3d: %s, %zu B, %d block(s) an SM; 8-warp (%zu B) %s\n", hd,
               config_name(cfg), smem, bps, fd_mma_smem_bytes(hd, FD_MMA_WIDE),
               wide ? "for grids <= SMs" : "no");
      CHECK(cfg >= 0 && bps <= fd_gpu_blocks_fit(&g, smem), "head_dim %d: %d blocks an SM", hd, bps);
      CHECK(wide == fd_mma_wide_ok(&g, hd), "head_dim %d: 8-warp %d", hd, wide);
      if (FD_TEST_SMEM_LIMIT_KB == 100) /* an sm_86/89 budget */
        CHECK(bps == 1 && cfg == (hd == 64 ? FD_MMA_4W : FD_MMA_LEAN),
              "head_dim %d at a 100 KB cap: %s, %d blocks an SM (expected %s, 1)", hd,
              config_name(cfg), bps, config_name(hd == 64 ? FD_MMA_4W : FD_MMA_LEAN));
      /* a plan for it */
      fd_problem p;
      memset(&p, 0, sizeof p);
      p.backend = FD_BACKEND_CUDA;
      p.dtype = dtypes[di];
      p.batch = 1;
      p.num_heads_q = 8;
      p.num_heads_kv = 2;
      p.head_dim = hd;
      p.kv_capacity = 4096;
      fd_plan plan;
      CHECK(fd_plan_init(&plan, &p, &err) == FD_STATUS_OK, "plan, head_dim %d: %s", hd, err.message);
    }
  }
#undef CHECK
  printf(fails ? "%d check(s) failed\n" : "PASS\n", fails);
  return fails ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "device") == 0) return device_main();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_sizes),
      cmocka_unit_test(test_gpu_classes),
      cmocka_unit_test(test_limit),
      cmocka_unit_test(test_expected_code_arch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
