/*
 * fp8_cases.c — the fp8 KV-cache cases that test_fp8_grid (CPU) and
 * test_gpu_fp8_grid (CUDA) run against the float64 oracle (which reads the
 * dequantized cache: harness.c). A covering subset:
 *   kv_dtype e4m3, e5m2 with q fp16 and bf16; scales none, tensor, head,
 *   token (dense and, in the noncontig layout, padded per-token rows)
 *   head_dim 8 (the CPU's small steps), 40, 64, 80, 100, 128, 256
 *   (CUDA: 8/40 -> 64, 100 -> 128); GQA 1, 2, 4, 8, MQA 16:1
 *   kv_len 0, 1, 63, 64, 65, 97, 4097, 4099, 40000; q_len 1, 2, 4, 8, 16, 32
 *   (non-causal); contiguous, paged 16/64/256, noncontig and head-major;
 *   splits 1, 2, 7, 128 and automatic; window, soft-cap, sinks, non-causal,
 *   fp32 out; large inputs that saturate e4m3 when quantized.
 * Cache positions past kv_len hold the fp8 NaN code and NaN scales.
 */
#include "cpu/cpu_kernels.h"
#include "harness.h"

#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16
#define E4M3 .kv_dtype = FD_DTYPE_E4M3
#define E5M2 .kv_dtype = FD_DTYPE_E5M2
#define TENSOR .kv_scale = FD_KV_SCALE_TENSOR
#define HEAD .kv_scale = FD_KV_SCALE_HEAD
#define TOKEN .kv_scale = FD_KV_SCALE_TOKEN
#define NONCONTIG FD_LAYOUT_NONCONTIG
#define WIN(w) .has_window = 1, .window_left = (w)

/* backend is filled in by fd_fp8_grid_cases. */
static const fd_case fp8[] = {
    /* every scale granularity with both formats */
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 8, .batch = 3, .kv_len = {0, 1, 4097}, .q_len = 1, .page_size = 16, .num_splits = 7, .with_lse = 1, .check_splits = 1, E4M3, TOKEN},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 64}, .q_len = 2, .num_splits = 2, .with_lse = 1, .check_determinism = 1, E4M3, TENSOR},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 4, .batch = 1, .kv_len = {65}, .q_len = 1, .with_lse = 1, E5M2},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 16, .num_heads_kv = 4, .batch = 2, .kv_len = {4099, 63}, .q_len = 2, .page_size = 64, .layout = NONCONTIG, .num_splits = 7, .with_lse = 1, .check_splits = 1, E5M2, TOKEN},
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 16, .num_heads_kv = 1, .batch = 2, .kv_len = {97, 65}, .q_len = 4, .num_splits = 2, .with_lse = 1, E4M3, HEAD},
    {.dtype = F16, .head_dim = 80, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {300, 5}, .q_len = 1, .with_lse = 1, .kv_capacity_pad = 100, .num_threads = 3, E4M3},
    {.dtype = BF16, .head_dim = 100, .num_heads_q = 8, .num_heads_kv = 4, .batch = 2, .kv_len = {97, 1}, .q_len = 2, .layout = FD_LAYOUT_HEAD_MAJOR, .with_lse = 1, E5M2, TENSOR},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 8, .batch = 1, .kv_len = {777}, .q_len = 1, .page_size = 256, .num_splits = 1, .with_lse = 1, .check_splits = 1, E5M2, HEAD},
    /* head_dim 8: the CPU's small steps (longer key blocks) */
    {.dtype = F16, .head_dim = 8, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {130, 5}, .q_len = 8, .with_lse = 1, E5M2, HEAD},
    {.dtype = BF16, .head_dim = 8, .num_heads_q = 16, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 33, 1000}, .q_len = 8, .page_size = 16, .layout = NONCONTIG, .num_splits = 7, .with_lse = 1, .check_splits = 1, E4M3, TOKEN},
    /* q_len 16; MQA 16:1 with 128 splits; a long sequence */
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 1, .batch = 1, .kv_len = {97}, .q_len = 16, .page_size = 16, .num_splits = 7, .with_lse = 1, E5M2, TENSOR},
    {.dtype = F16, .head_dim = 40, .num_heads_q = 16, .num_heads_kv = 1, .batch = 2, .kv_len = {4099, 65}, .q_len = 1, .page_size = 64, .num_splits = 128, .with_lse = 1, .check_splits = 1, E4M3, TOKEN},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 1, .num_heads_kv = 1, .batch = 1, .kv_len = {40000}, .q_len = 2, .page_size = 256, .num_splits = 128, .with_lse = 1, E4M3, TOKEN},
    /* the variants */
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {300, 1000}, .q_len = 2, .num_splits = 7, .with_lse = 1, .check_splits = 1, WIN(100), E4M3, TOKEN},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {500}, .q_len = 2, .num_splits = 2, .with_lse = 1, .logits_soft_cap = 30.0f, .input_scale = 4.0f, E5M2, HEAD},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 2, 97}, .q_len = 4, .page_size = 16, .num_splits = 7, .with_lse = 1, .sinks = 1, E4M3, TENSOR},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {64, 300}, .q_len = 32, .non_causal = 1, .with_lse = 1, E5M2, TOKEN},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {300, 5}, .q_len = 1, .with_lse = 1, .out_f32 = 1, E4M3, HEAD},
    /* large inputs: k drawn x8, many values saturate at 448 when quantized */
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {1000}, .q_len = 1, .page_size = 16, .num_splits = 7, .with_lse = 1, .input_scale = 8.0f, E4M3, TENSOR},
};

/* CPU only: fp8 runs with the instruction set forced (the float32 kernels of
 * each set read the widened blocks). */
static const fd_case fp8_isa[] = {
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 200}, .q_len = 2, .page_size = 16, .num_splits = 2, .with_lse = 1, E4M3, TOKEN},
    {.dtype = F16, .head_dim = 8, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {5, 300}, .q_len = 4, .num_splits = 2, .with_lse = 1, E5M2, HEAD},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

int fd_fp8_grid_cases(fd_backend backend, fd_case *cases, int max) {
  int n = 0;
  for (int i = 0; i < COUNT(fp8) && n < max; i++) {
    fd_case c = fp8[i];
    c.backend = backend;
    if (backend == FD_BACKEND_CUDA) {
      if (c.head_dim < 64) c.head_dim = 64;
      else if (c.head_dim > 64 && c.head_dim < 128 && c.head_dim != 80 && c.head_dim != 96) c.head_dim = 128;
      c.num_threads = 0;
      c.check_determinism = 1;
    }
    cases[n++] = c;
  }
  if (backend == FD_BACKEND_CPU) {
    const fd_cpu_isa best = fd_cpu_isa_detect();
    for (int isa = FD_CPU_ISA_SCALAR; isa < (int)best; isa++)
      for (int i = 0; i < COUNT(fp8_isa) && n < max; i++) {
        fd_case c = fp8_isa[i];
        c.backend = backend;
        c.cpu_isa = 1 + isa;
        cases[n++] = c;
      }
  }
  if (backend == FD_BACKEND_CUDA) {
    /* again with sm_count 1: the 4-warp tensor-core kernel (grid_cases.c) */
    const int base = n;
    for (int i = 0; i < base && n < max; i++) {
      fd_case c = cases[i];
      c.sm_count = 1;
      cases[n++] = c;
    }
  }
  return n;
}
