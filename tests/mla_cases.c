/*
 * mla_cases.c — the MLA cases test_mla (CPU) and the GPU MLA test run
 * (fd_mla_grid_cases). Covering, not the cross product:
 *   (head_dim, rope_dim) (512, 64), (448, 64) and, CPU only, (480, 64), (40, 8);
 *   dtype f32 (CPU), f16, bf16; out f32; heads 1, 4, 16, 128;
 *   kv_len 0, 1, odd, 4099+ and ragged batches; q_len 1, 2, 3, 7, 16 (and
 *   q_len > kv_len: rows that see no key); contiguous and paged caches
 *   (page 1, 16, 64) with shuffled pages; c_kv and k_pe as two buffers (rows
 *   padded or not) and as two views of one row; q_nope and q_pe likewise;
 *   fp8 e4m3 / e5m2 latent, TENSOR / HEAD / TOKEN scales, rope part fp8 or
 *   16-bit; forced split counts 1..N (sweep), the automatic count, the
 *   deterministic mode; NaN in a key a row sees.
 */
#include "mla_fixture.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16
#define E4M3 FD_DTYPE_E4M3
#define E5M2 FD_DTYPE_E5M2
#define TENSOR FD_KV_SCALE_TENSOR
#define HEAD FD_KV_SCALE_HEAD
#define TOKEN FD_KV_SCALE_TOKEN

/* Shapes every backend runs ((512, 64), (448, 64), 16-bit q). */
static const fd_mla_case common[] = {
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 3, .kv_len = {0, 1, 97}, .q_len = 1, .with_lse = 1, .sweep_splits = 2, .check_determinism = 1},
    {.dtype = F16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {130, 63}, .q_len = 2, .page_size = 16, .combined = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 448, .rope_dim = 64, .num_heads_q = 128, .batch = 1, .kv_len = {100}, .q_len = 1, .page_size = 64, .combined = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 1, .kv_len = {40}, .q_len = 16, .with_lse = 1, .q_combined = 1},
    {.dtype = F16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 4, .batch = 2, .kv_len = {300, 2}, .q_len = 3, .page_size = 1, .combined = 1, .q_combined = 1, .with_lse = 1, .sweep_splits = 5},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 1, .kv_len = {77}, .q_len = 2, .out_f32 = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {5000, 3}, .q_len = 1, .page_size = 64, .deterministic = 1, .with_lse = 1, .check_determinism = 1},
    {.dtype = F16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 1, .kv_len = {4099}, .q_len = 1, .page_size = 64, .combined = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {50, 20}, .q_len = 2, .with_lse = 1, .nan_key = 1, .num_splits = 2},
    /* fp8 latent */
    {.dtype = BF16, .kv_dtype = E4M3, .rope_dtype = BF16, .kv_scale = TENSOR, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {97, 1}, .q_len = 1, .page_size = 64, .combined = 1, .with_lse = 1, .sweep_splits = 2},
    {.dtype = BF16, .kv_dtype = E4M3, .kv_scale = TOKEN, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {200, 33}, .q_len = 1, .page_size = 16, .with_lse = 1},
    {.dtype = F16, .kv_dtype = E4M3, .rope_dtype = F16, .kv_scale = TOKEN, .head_dim = 448, .rope_dim = 64, .num_heads_q = 16, .batch = 1, .kv_len = {129}, .q_len = 2, .combined = 1, .with_lse = 1},
    {.dtype = BF16, .kv_dtype = E4M3, .kv_scale = TENSOR, .head_dim = 512, .rope_dim = 64, .num_heads_q = 128, .batch = 1, .kv_len = {65}, .q_len = 1, .page_size = 64, .with_lse = 1},
    {.dtype = F16, .kv_dtype = E5M2, .kv_scale = TOKEN, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {70, 0}, .q_len = 1, .with_lse = 1},
};

/* CPU (and reference) only: float32, odd small shapes. */
static const fd_mla_case cpu_only[] = {
    {.dtype = F32, .head_dim = 512, .rope_dim = 64, .num_heads_q = 1, .batch = 2, .kv_len = {65, 300}, .q_len = 1, .page_size = 1, .combined = 1, .q_combined = 1, .num_splits = 7, .with_lse = 1, .sweep_splits = 5},
    {.dtype = F32, .head_dim = 40, .rope_dim = 8, .num_heads_q = 16, .batch = 3, .kv_len = {0, 33, 200}, .q_len = 3, .page_size = 16, .with_lse = 1, .sweep_splits = 4, .check_determinism = 1},
    {.dtype = F16, .head_dim = 40, .rope_dim = 8, .num_heads_q = 1, .batch = 1, .kv_len = {1}, .q_len = 1},
    {.dtype = BF16, .head_dim = 40, .rope_dim = 8, .num_heads_q = 16, .batch = 2, .kv_len = {5, 17}, .q_len = 16, .with_lse = 1, .combined = 1},
    {.dtype = F32, .head_dim = 40, .rope_dim = 8, .num_heads_q = 2, .batch = 1, .kv_len = {9}, .q_len = 7, .with_lse = 1, .combined = 1, .q_combined = 1},
    {.dtype = BF16, .kv_dtype = E5M2, .kv_scale = TENSOR, .head_dim = 40, .rope_dim = 8, .num_heads_q = 4, .batch = 2, .kv_len = {65, 0}, .q_len = 1, .with_lse = 1, .sweep_splits = 2},
    {.dtype = F16, .kv_dtype = E4M3, .kv_scale = HEAD, .rope_dtype = F16, .head_dim = 40, .rope_dim = 8, .num_heads_q = 4, .batch = 1, .kv_len = {31}, .q_len = 2, .page_size = 16, .combined = 1, .with_lse = 1},
    {.dtype = F32, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {40, 90}, .q_len = 1, .page_size = 16, .nan_key = 1, .with_lse = 1},
    {.dtype = F32, .head_dim = 5, .rope_dim = 3, .num_heads_q = 3, .batch = 2, .kv_len = {70, 4}, .q_len = 2, .with_lse = 1, .num_splits = 2},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 4, .kv_len = {700, 1, 0, 333}, .q_len = 1, .page_size = 16, .num_threads = 2, .with_lse = 1, .check_determinism = 1},
    /* every split count of a long sequence (65 chunks); float32 sums over long splits */
    {.dtype = F32, .head_dim = 40, .rope_dim = 8, .num_heads_q = 4, .batch = 2, .kv_len = {4099, 130}, .q_len = 2, .page_size = 64, .combined = 1, .with_lse = 1, .sweep_splits = 66},
    {.dtype = F32, .head_dim = 512, .rope_dim = 64, .num_heads_q = 4, .batch = 1, .kv_len = {4099}, .q_len = 1, .num_splits = 1, .with_lse = 1},
    /* bf16 values over several key blocks a call: 4 rows (AMX: the parity tiles, 32 keys
     * at a time), 12 rows (AMX: V relaid out, a part row chunk; 480 columns: a 32-column
     * tail), 64 rows */
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 4, .batch = 2, .kv_len = {300, 77}, .q_len = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 480, .rope_dim = 64, .num_heads_q = 4, .batch = 1, .kv_len = {600}, .q_len = 3, .page_size = 16, .with_lse = 1},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 64, .batch = 1, .kv_len = {1000}, .q_len = 1, .combined = 1, .with_lse = 1},
    /* separate caches whose rows are not 64-byte multiples apart (c_kv 1040 bytes, k_pe
     * 160), contiguous (AMX: the scores' tiles read both in place, full blocks) and paged
     * (page 16: blocks copied); q_len 2 (a causal last block); 128 heads (two row tiles) */
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {300, 41}, .q_len = 2, .row_pad = 8, .with_lse = 1},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 1, .kv_len = {150}, .q_len = 1, .page_size = 16, .row_pad = 8, .with_lse = 1, .num_splits = 2},
    {.dtype = BF16, .head_dim = 448, .rope_dim = 64, .num_heads_q = 128, .batch = 1, .kv_len = {200}, .q_len = 1, .row_pad = 8, .with_lse = 1},
    /* every instruction set's kernels (skipped where the machine lacks one) */
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {97, 33}, .q_len = 2, .page_size = 16, .combined = 1, .with_lse = 1, .num_splits = 2, .cpu_isa = 1},
    {.dtype = F16, .kv_dtype = E4M3, .kv_scale = TOKEN, .head_dim = 448, .rope_dim = 64, .num_heads_q = 8, .batch = 1, .kv_len = {70}, .q_len = 1, .with_lse = 1, .cpu_isa = 1},
    {.dtype = F32, .head_dim = 40, .rope_dim = 8, .num_heads_q = 4, .batch = 1, .kv_len = {50}, .q_len = 3, .with_lse = 1, .cpu_isa = 1},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {97, 33}, .q_len = 2, .page_size = 16, .combined = 1, .with_lse = 1, .num_splits = 2, .cpu_isa = 2},
    {.dtype = BF16, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {97, 33}, .q_len = 2, .with_lse = 1, .num_splits = 2, .cpu_isa = 3},
    {.dtype = BF16, .head_dim = 448, .rope_dim = 64, .num_heads_q = 16, .batch = 2, .kv_len = {97, 33}, .q_len = 2, .page_size = 16, .combined = 1, .with_lse = 1, .cpu_isa = 4},
    {.dtype = F16, .kv_dtype = E4M3, .kv_scale = TOKEN, .head_dim = 512, .rope_dim = 64, .num_heads_q = 16, .batch = 1, .kv_len = {70}, .q_len = 1, .with_lse = 1, .cpu_isa = 3},
};

int fd_mla_grid_cases(fd_backend backend, fd_mla_case *cases, int max) {
  int n = 0;
  for (size_t i = 0; i < sizeof common / sizeof *common && n < max; i++) {
    cases[n] = common[i];
    cases[n++].backend = backend;
  }
  if (backend == FD_BACKEND_CUDA) return n;
  for (size_t i = 0; i < sizeof cpu_only / sizeof *cpu_only && n < max; i++) {
    cases[n] = cpu_only[i];
    cases[n++].backend = backend;
  }
  return n;
}
