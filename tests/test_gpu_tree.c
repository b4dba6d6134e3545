/*
 * test_gpu_tree.c — speculative-decoding tree masks on the CUDA backend (the
 * rows kernel) against the float64 oracle, over the grid of tree_cases.c
 * (random EAGLE-shaped, shuffled, wide trees, chains, rows that see only
 * themselves; q_len 1..64; Llama-8B, gpt-oss, MQA and MHA heads; paged and
 * contiguous; forced splits); every case also runs twice and must give
 * bitwise identical output. Then the plan's refusals: the shapes the CUDA
 * backend does not take with a tree mask name their argument.
 * Exits 77 (ctest: skipped) when no usable GPU is present.
 */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "internal.h"

#define MAX_CASES 96

/* A CUDA plan with a tree mask that must be refused, naming `arg`. */
static int refused(const char *what, fd_problem p, const char *arg) {
  fd_plan plan;
  fd_error err;
  memset(&err, 0, sizeof err);
  const fd_status st = fd_plan_init(&plan, &p, &err);
  if (st == FD_STATUS_UNSUPPORTED && strstr(err.message, arg) == err.message) return 0;
  fprintf(stderr, "FAIL %s: status %d, message \"%s\" (expected UNSUPPORTED naming %s)\n", what,
          (int)st, err.message, arg);
  return 1;
}

static int plan_checks(void) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = FD_BACKEND_CUDA;
  p.dtype = FD_DTYPE_BF16;
  p.batch = 1;
  p.q_len = 8;
  p.num_heads_q = 32;
  p.num_heads_kv = 8;
  p.head_dim = 128;
  p.kv_capacity = 4096;
  p.tree_mask = 1;
  fd_plan plan;
  fd_error err;
  int failed = 0;
  if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK || plan.kernel != FD_KERNEL_CUDA_ROWS) {
    fprintf(stderr, "FAIL plan: bf16 d128 tree: %s (kernel %d)\n", err.message, (int)plan.kernel);
    failed++;
  }
  /* 64 nodes x 4 heads = 256 rows a kv head: the wgmma rows kernel where the
   * device runs sm_90a code (gpu_select.h fd_rows_wgmma_ok) */
  fd_gpu_budget g;
  if (fd_cuda_device_budget(0, &g, &err) == FD_STATUS_OK) {
    fd_problem w = p;
    w.q_len = 64;
    const fd_kernel want = g.wgmma ? FD_KERNEL_CUDA_ROWS_WGMMA : FD_KERNEL_CUDA_ROWS;
    if (fd_plan_init(&plan, &w, &err) != FD_STATUS_OK || plan.kernel != want) {
      fprintf(stderr, "FAIL plan: bf16 d128 64-node tree: %s (kernel %d, want %d)\n", err.message,
              (int)plan.kernel, (int)want);
      failed++;
    }
  }
  fd_problem q = p;
  q.dtype = FD_DTYPE_F32;
  failed += refused("f32", q, "dtype:");
  q = p;
  q.kv_dtype = FD_DTYPE_E4M3;
  q.kv_scale = FD_KV_SCALE_TENSOR;
  failed += refused("fp8 cache", q, "kv_dtype:");
  q = p;
  q.head_dim = 256;
  failed += refused("head_dim 256", q, "head_dim:");
  q = p;
  q.num_heads_q = 16;
  q.num_heads_kv = 1;
  q.head_dim = 512;
  q.rope_dim = 64;
  q.softmax_scale = 0.0721687836f; /* 1/sqrt(192): MLA has no default */
  failed += refused("MLA", q, "tree_mask:");
  if (!failed) printf("tree plan checks: ok\n");
  return failed;
}

int main(void) {
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  static fd_case cases[MAX_CASES];
  const int n = fd_tree_cases(FD_BACKEND_CUDA, fd_test_seed(), cases, MAX_CASES);
  int failed = fd_run_case_group("gpu_tree", cases, n);
  failed |= plan_checks() != 0;
  return failed ? 1 : 0;
}
