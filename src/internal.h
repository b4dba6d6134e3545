/*
 * internal.h — what the backends and api.c share; not installed.
 *
 * api.c checks every argument that can be checked without reading device
 * memory, fills in default strides, and hands the backends a fd_tensors whose
 * strides are all explicit. Backends trust those and never re-check them.
 */
#ifndef FD_INTERNAL_H
#define FD_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "flashdecode.h"
#include "gpu_select.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Write a message to err (if not NULL) and return status. printf format. */
fd_status fd_fail(fd_error *err, fd_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Mark err (if not NULL) as success and return FD_STATUS_OK. */
fd_status fd_ok(fd_error *err);

/* 1 for the fp8 cache types. */
static inline int fd_dtype_is_fp8(fd_dtype dtype) {
  return dtype == FD_DTYPE_E4M3 || dtype == FD_DTYPE_E5M2;
}

/* The dtype's name in messages ("FD_DTYPE_E4M3"), "an invalid dtype" otherwise. */
const char *fd_dtype_name(fd_dtype dtype);

/* Index into k_scale / v_scale of position j of sequence b, kv head hk, for
 * a plan with kv_scale set (t->scale_strides resolved by api.c): 0 (TENSOR),
 * hk (HEAD), or the per-token slot through the block table (TOKEN). */
static inline int64_t fd_scale_index(const fd_plan *plan, const int32_t *block_table,
                                     int64_t block_table_stride, const int64_t strides[3],
                                     int32_t b, int32_t j, int32_t hk) {
  const fd_problem *p = &plan->problem;
  if (p->kv_scale == FD_KV_SCALE_TENSOR) return 0;
  if (p->kv_scale == FD_KV_SCALE_HEAD) return hk;
  if (p->page_size == 0) return (int64_t)b * strides[0] + (int64_t)j * strides[1] + (int64_t)hk * strides[2];
  const int32_t page = block_table[(int64_t)b * block_table_stride + j / p->page_size];
  return (int64_t)page * strides[0] + (int64_t)(j % p->page_size) * strides[1] +
         (int64_t)hk * strides[2];
}

/* MLA (fd_problem.rope_dim > 0): the widest rope part, the widest latent
 * (head_dim) the CPU and reference backends take, and the most columns of
 * any row a backend holds (an MLA key: latent and rope part). */
#define FD_MAX_ROPE_DIM 64
#define FD_MAX_MLA_HEAD_DIM 512
#define FD_MAX_ROW_DIM (FD_MAX_MLA_HEAD_DIM + FD_MAX_ROPE_DIM)

/* CPU backend, MLA: query rows one work item runs (a tile of the
 * sequence's num_heads_q x q_len rows sharing each key block read), and the
 * keys of one block (FD_CPU_KEY_BLOCK). */
#define FD_CPU_MLA_TILE_ROWS 64
#define FD_CPU_MLA_BLOCK 32
/* Key blocks of one group: their values summed by one kernel call, then
 * folded into the double sums together (cpu_mla.c). */
#define FD_CPU_MLA_GROUP 8

static inline int32_t fd_cpu_mla_tile_rows(const fd_problem *p) {
  const int32_t rows = p->num_heads_q * p->q_len;
  return rows < FD_CPU_MLA_TILE_ROWS ? rows : FD_CPU_MLA_TILE_ROWS;
}

static inline size_t fd_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The per-thread scratch of a CPU MLA call, in the workspace: T =
 * fd_cpu_mla_tile_rows rows of q ([T][head_dim + rope_dim] floats), of the
 * float sums ([T][head_dim]), of the double sums ([T][head_dim]), the
 * softmax scratch (each block of a group's p, [FD_CPU_MLA_GROUP][T]
 * [FD_CPU_MLA_BLOCK], then the group's p together, [T][FD_CPU_MLA_GROUP *
 * FD_CPU_MLA_BLOCK]) and a group's key blocks as the kernels read them
 * ([FD_CPU_MLA_GROUP * FD_CPU_MLA_BLOCK][head_dim + rope_dim] floats), each
 * 64-byte aligned. */
typedef struct fd_cpu_mla_scratch_layout {
  size_t q, acc, outer, scratch, keys, bytes; /* offsets; bytes: one thread's total */
} fd_cpu_mla_scratch_layout;

static inline fd_cpu_mla_scratch_layout fd_cpu_mla_layout(const fd_problem *p) {
  fd_cpu_mla_scratch_layout l;
  const size_t T = (size_t)fd_cpu_mla_tile_rows(p), D = (size_t)p->head_dim;
  const size_t W = D + (size_t)p->rope_dim;
  size_t off = 0;
  l.q = off;
  off = fd_align_up(off + T * W * sizeof(float), 64);
  l.acc = off;
  off = fd_align_up(off + T * D * sizeof(float), 64);
  l.outer = off;
  off = fd_align_up(off + T * D * sizeof(double), 64);
  l.scratch = off;
  off = fd_align_up(off + 2 * T * FD_CPU_MLA_GROUP * FD_CPU_MLA_BLOCK * sizeof(float), 64);
  l.keys = off;
  off = fd_align_up(off + FD_CPU_MLA_GROUP * FD_CPU_MLA_BLOCK * W * sizeof(float), 64);
  l.bytes = fd_align_up(off, 256);
  return l;
}

/* Where the CPU MLA threads' scratch starts in the workspace: after the
 * split arrays (plan.c lays it out: scratches of
 * fd_cpu_mla_layout(p).bytes, one for each thread that can have work:
 * min(num_threads, batch x num_splits x row tiles)). */
static inline size_t fd_cpu_mla_scratch_offset(const fd_problem *p, const fd_plan *plan) {
  if (plan->num_splits <= 1) return 0;
  return fd_align_up(plan->ws_counters + (size_t)p->batch * p->num_heads_kv * sizeof(uint32_t), 256);
}

/* Rows of the partial arrays: one per (sequence, query head, query row).
 * Row index = (b * num_heads_q + h) * q_len + t. */
static inline int64_t fd_num_rows(const fd_plan *plan) {
  return (int64_t)plan->problem.batch * plan->problem.num_heads_q * plan->problem.q_len;
}

/* Checks the host-side kv_len and block_table values for the CPU and
 * reference backends (every kv_len in [0, kv_capacity]; every page id a
 * sequence uses in [0, num_pages) when num_pages > 0). */
fd_status fd_check_host_lengths(const fd_plan *plan, const fd_tensors *t, fd_error *err);

/* fp8 scales (scales.c): k_scale / v_scale present exactly when the plan's
 * kv_scale asks for them, float-aligned; scale strides checked for sign and
 * resolved into `strides` (all zero: dense per-token layout). */
fd_status fd_check_scale_args(const fd_plan *plan, const float *k_scale, const float *v_scale,
                              const int64_t strides_in[3], int64_t strides[3], fd_error *err);
/* CPU and reference: every scale value fd_run will read is finite and > 0
 * (t has resolved strides and checked kv_len / block_table). */
fd_status fd_check_host_scale_values(const fd_plan *plan, const fd_tensors *t, fd_error *err);
/* The most keys one split of the CUDA tensor-core kernel (fp16, bf16 q)
 * sums: its P V accumulates on the tensor cores in float32, whose error
 * grows with the additions a warp makes (one 8-warp block over 4M identical
 * fp16 keys is off by 3.9e-3 of max|V|: ~2^-23 for each 16 keys a warp
 * adds). plan.c raises the split count so that no split of the longest
 * expected sequence holds more: at most 8192 additions a warp (head_dim
 * 256, 2 key warps), ~1e-3 of max|V| in that worst case, 2-4x less at
 * head_dim <= 128; the combine then sums at most FD_MAX_SPLITS partials.
 * 131072 leaves plans for caches up to 128k keys unchanged. */
#define FD_MMA_MAX_SPLIT_KEYS 131072
/* The same bound for the rows kernel (rows_mma_kernel.cu; the MLA kernel,
 * mla_kernel.cu, too), whose every warp
 * adds every key of its split (the split kernel's warps add 1 / 4 or 1 / 8
 * of them): 32768 keys, 4096 additions a warp (a hi and a lo mma a 16-key
 * step), as the split kernel's at head_dim 128. */
#define FD_ROWS_MAX_SPLIT_KEYS 32768

/* The fixed split length of a resolved problem (split.h), 0 = derived. */
static inline int32_t fd_split_len_fixed(const fd_problem *p) {
  return p->deterministic ? FD_DETERMINISTIC_SPLIT_LEN : 0;
}

/* fd_append_kv after its argument checks (append.c), with explicit strides:
 * the host code of the CPU and reference backends (cpu/cpu_append.c: checks
 * kv_len, block_table and TENSOR / HEAD scale values, then writes), and the
 * CUDA kernel's launch (cuda/append_kernel.cu; stub without CUDA). */
fd_status fd_host_append(const fd_plan *plan, const fd_append_tensors *t, int32_t num_new,
                         fd_error *err);
/* 1 when fd_cuda_append writes MLA caches (rope_dim > 0: k_new the latent,
 * k_pe_new the rope part, v_new / v_cache / v_scale NULL, TOKEN scales over
 * the latent and an fp8 rope part together, as cpu_append.c); fd_append_kv
 * refuses CUDA MLA plans (UNSUPPORTED) while it is 0. */
#define FD_CUDA_APPEND_MLA 1
fd_status fd_cuda_append(const fd_plan *plan, const fd_append_tensors *t, int32_t num_new,
                         void *stream, fd_error *err);

/* fd_plan.magic of a plan made by fd_plan_init. */
#define FD_PLAN_MAGIC 0x66645031u

/* What fd_plan_init needs to know of a CUDA device to choose the kernel and
 * the split count of one problem (its dtype, head_dim and shape): the
 * device's budget and how many blocks of each kernel a multiprocessor holds.
 * fd_cuda_device_fit reads them from the device. */
typedef struct fd_cuda_fit {
  fd_gpu_budget g;      /* budget, multiprocessors (g.sm_count), loaded code */
  int32_t split_blocks; /* blocks a multiprocessor holds of the split kernel
                           the dtype runs: fp16/bf16 the tensor-core kernel in
                           its 4-warp config (fd_mma_config_4w: FD_MMA_4W or
                           FD_MMA_LEAN), fp32 the CUDA-core kernel; the
                           smaller of the budget's and the occupancy
                           calculator's counts, >= 1 */
  int32_t rows_blocks;  /* the same for the rows kernel (asked for only for
                           fd_rows_kernel_shape problems); 0: it does not fit
                           or was not asked for */
  int32_t rows_wg_blocks; /* the same for the Hopper rows kernel
                           (rows_wgmma_kernel.cu), where the device runs it
                           (gpu_select.h fd_rows_wgmma_ok); else 0 */
} fd_cuda_fit;

/* fd_plan_init with the CUDA device's facts given instead of read (`fit`
 * NULL: read them, as fd_plan_init does). With `fit`, a CUDA problem (or
 * AUTO) is planned for that made-up device without asking the CUDA runtime:
 * the CPU unit tests (test_heuristic.c) plan for GPUs they do not have. */
fd_status fd_plan_init_fit(fd_plan *plan, const fd_problem *problem, const fd_cuda_fit *fit,
                           fd_error *err);

/* ---- CPU backend (src/cpu) ---- */
/* Threads the CPU backend uses by default (fd_problem.num_threads 0):
 * OMP_NUM_THREADS when set to a positive integer (the first of a list; at
 * most FD_MAX_THREADS), else the cores this process may use. */
int fd_cpu_default_threads(void);
/* OMP_NUM_THREADS's value as fd_cpu_default_threads reads it: the thread
 * count (1..FD_MAX_THREADS), or 0 when `value` is NULL or not a positive
 * integer. Exposed for tests. */
int fd_cpu_env_threads(const char *value);
/* The CPU instruction set a plan runs (cpu_dispatch.c): FD_CPU_ISA's value
 * `env` (NULL, "" or "auto": the best this machine has; else scalar, avx2,
 * avx512, avx512_bf16 (also on Intel CPUs that have it, where the default
 * leaves it off) or amx) into *isa (an fd_cpu_isa). INVALID_ARGUMENT for another
 * name, UNSUPPORTED for a set this CPU or build lacks. */
fd_status fd_cpu_isa_choose(const char *env, int32_t *isa, fd_error *err);
fd_status fd_cpu_run(const fd_plan *plan, const fd_tensors *t, void *workspace, fd_error *err);

/* Merges num_splits partial states for `rows` rows into out (dtype of the
 * plan) and lse (may be NULL). partial_o: float [rows][num_splits][head_dim];
 * partial_ml: float [rows][num_splits][2] holding (m, l) with m in the units
 * of the scaled scores (natural-log base). Empty splits have m = -inf, l = 0;
 * only the first active_splits(row) entries of a row are read, where the
 * count comes from kv_len and the plan (see split.h). Exposed for tests. */
fd_status fd_cpu_combine(const fd_plan *plan, const fd_tensors *t, const float *partial_o,
                         const float *partial_ml, fd_error *err);

/* fd_merge_states on the CPU (src/cpu/cpu_merge.c; the reference backend runs
 * it too). merge.c has checked every argument; p->out_dtype is resolved
 * (never 0). Synchronous. */
fd_status fd_cpu_merge(const fd_merge_problem *p, const void *states_out, const float *states_lse,
                       void *out, float *lse, fd_error *err);

/* ---- Reference backend (src/reference) ---- */
fd_status fd_reference_run(const fd_plan *plan, const fd_tensors *t, fd_error *err);

/* The float64 oracle: out64 [batch][q_len][num_heads_q][head_dim] and
 * lse64 [batch][num_heads_q][q_len] (may be NULL), both dense, in double. */
fd_status fd_reference_f64(const fd_plan *plan, const fd_tensors *t, double *out64,
                           double *lse64, fd_error *err);

/* ---- CUDA backend (src/cuda; stubs in src/cuda_stub.c without CUDA) ---- */
/* FD_STATUS_OK when built with CUDA and device `device` can run the
 * backend: it exists, has compute capability 8.0 or newer, and this build
 * holds code it runs (FD_CUDA_ARCHS); else FD_STATUS_UNSUPPORTED (or
 * BACKEND_ERROR for a failed query) with a message that names the device,
 * its compute capability and what is missing. Read once per device. */
fd_status fd_cuda_check_device(int device, fd_error *err);
/* 1 when fd_cuda_check_device(device) is FD_STATUS_OK. */
int fd_cuda_available(int device);
/* Why no CUDA device can be used, in words, from cudaGetDeviceCount's error
 * code (a cudaError_t; cudaSuccess for a count of 0): no driver, a driver
 * older than the runtime, no device, or the runtime's own message. The CLI
 * says the same. CUDA builds only. */
void fd_cuda_no_device_reason(int code, char *text, size_t size);
/* 1 when device's kernels are launched with programmatic dependent launch
 * (code built for sm_90+; gpu_select.h, fd_gpu_pdl_ok). */
int fd_cuda_pdl(int device);
/* The budget the backend plans with for `device` (FD_CUDA_SMEM_LIMIT_KB
 * applied; code_arch: the loaded code's), or fd_cuda_check_device's error. */
fd_status fd_cuda_device_budget(int device, fd_gpu_budget *budget, fd_error *err);
/* The facts fd_plan_init plans with for dtype q and head_dim on `device`
 * (fd_cuda_fit; rows_blocks only when `rows` is 1), or fd_cuda_check_device's
 * error; FD_STATUS_UNSUPPORTED when no split-kernel config fits the budget. */
fd_status fd_cuda_device_fit(int device, fd_dtype dtype, int32_t head_dim, int rows,
                             fd_cuda_fit *fit, fd_error *err);
/* Runs the plan's kernel (fd_plan.kernel) and, when it splits, the combine.
 * Chooses nothing: refuses a plan whose kernel the device cannot run. */
fd_status fd_cuda_run(const fd_plan *plan, const fd_tensors *t, void *workspace, void *stream,
                      fd_error *err);
/* Whether a grid of the 8-warp tensor-core config (one block an SM) suits
 * a call: `blocks` no more than the SMs, splits of at least its 128-key tile
 * (shorter ones leave half its warps idle: ~8 % slower at 1k keys in 16
 * splits). fd_plan_init asks it, where the device has the config. */
static inline int fd_cuda_wide_kernel(int64_t blocks, int32_t sm_count, int64_t split_keys) {
  return blocks <= sm_count && split_keys >= 128;
}
/* The fewest query rows a kv head (group x q_len) for which a non-causal
 * call runs the rows kernel (rows_mma_kernel.cu): below it the split
 * kernel's 8-row passes re-read little. */
#define FD_ROWS_MIN 32
/* Whether a resolved CUDA problem's shape runs the rows kernel: non-causal
 * with at least FD_ROWS_MIN rows a kv head, or a tree mask (the only CUDA
 * kernels that take one; on Hopper, rows_wgmma_kernel.cu where
 * fd_rows_wgmma_ok says so); fp16 or bf16 q over a cache of the same dtype,
 * head_dim 64 or 128, a grid within CUDA's 65535 blocks in y. The device
 * must hold its block too (fd_cuda_fit.rows_blocks); fd_plan_init decides,
 * and refuses a tree mask on CUDA without it. */
static inline int fd_rows_kernel_shape(const fd_problem *p) {
  const fd_dtype kv = p->kv_dtype == 0 ? p->dtype : p->kv_dtype;
  const int64_t rows = (int64_t)(p->num_heads_q / p->num_heads_kv) * p->q_len;
  return ((p->non_causal && rows >= FD_ROWS_MIN) || p->tree_mask) &&
         (p->dtype == FD_DTYPE_F16 || p->dtype == FD_DTYPE_BF16) && kv == p->dtype &&
         (p->head_dim == 64 || p->head_dim == 128) &&
         (int64_t)p->num_heads_kv *
                 fd_rows_tiles(p->num_heads_q / p->num_heads_kv, p->q_len, 16 * FD_ROWS_WARPS) <=
             65535;
}
/* fd_merge_states on device p->device (src/cuda/merge_backend.cu): checked
 * arguments as for fd_cpu_merge; enqueues one kernel on `stream`, no
 * allocation, no synchronisation. */
fd_status fd_cuda_merge(const fd_merge_problem *p, const void *states_out, const float *states_lse,
                        void *out, float *lse, void *stream, fd_error *err);
/* Stream-ordered allocation for fd_decode. */
fd_status fd_cuda_malloc_async(void **ptr, size_t bytes, void *stream, fd_error *err);
fd_status fd_cuda_free_async(void *ptr, void *stream, fd_error *err);

#ifdef __cplusplus
}
#endif

#endif /* FD_INTERNAL_H */
