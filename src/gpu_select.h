/*
 * gpu_select.h — which configuration of the tensor-core split kernel
 * (src/cuda/split_mma_kernel.cu) a GPU runs, from its shared-memory budget
 * and the code this build loaded on it. Plain C (the plan, the CUDA backend,
 * the kernel's static checks and a CPU unit test share it); not installed.
 * fd_plan_init chooses the config from these functions and records it
 * (fd_plan.kernel); the CUDA backend launches what the plan recorded.
 *
 * CONFIGS (fp16/bf16; shared memory a block, FD_MMA_SMEM)
 *   FD_MMA_4W    4 warps, 3 stages (4 at head_dim 64): 68,480 B (64),
 *                103,232 B (80/96/128), 106,976 B (256); two blocks an SM
 *                on sm_90/sm_100 (228 KB), one on sm_80/87 (164 KB) at
 *                head_dim >= 80, two at 64.
 *   FD_MMA_WIDE  8 warps, one block an SM, twice the keys a tile: 200,576 to
 *                205,632 B. Only where a block may have that much (compute
 *                capability 9.0 and 10.x: 227 KB; never 8.x: 163 KB at most)
 *                and only in code built for compute capability 9.0 or newer
 *                (the sm_80 code omits it).
 *   FD_MMA_LEAN  4 warps, 2 stages, for head_dim >= 80 where even one
 *                FD_MMA_4W block does not fit (sm_86, sm_89, sm_120: 99 KB a
 *                block, 100 KB an SM): 70,400 B (80/96/128), 74,176 B (256).
 *                One block an SM there; the same tiles and warp partition as
 *                FD_MMA_4W, so the same sums in the same order (bitwise equal
 *                results; the deterministic mode runs either).
 *   head_dim 64 fits FD_MMA_4W on every GPU from sm_80 on; no lean instance.
 *   An fp8 cache runs FD_MMA_4W or FD_MMA_LEAN with these same sizes (its
 *   fp8 stages lie in the 16-bit stage area); it has no FD_MMA_WIDE.
 *
 * The budget is the device's own (cudaDevAttrMaxSharedMemoryPerBlockOptin,
 * cudaDevAttrMaxSharedMemoryPerMultiprocessor,
 * cudaDevAttrReservedSharedMemoryPerBlock), or lower with the CMake option
 * FD_CUDA_SMEM_LIMIT_KB (the multiprocessor's bytes capped at that many KB,
 * a block's at that less the reserved 1 KB: 100 gives an sm_86's budget on
 * any GPU).
 */
#ifndef FD_GPU_SELECT_H
#define FD_GPU_SELECT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One device as the CUDA backend plans for it. */
typedef struct fd_gpu_budget {
  int32_t cc_major, cc_minor; /* compute capability */
  int32_t sm_count;           /* multiprocessors */
  int32_t smem_block;         /* bytes of shared memory a block may opt into */
  int32_t smem_sm;            /* bytes of shared memory a multiprocessor has */
  int32_t smem_reserved;      /* bytes the system keeps for each resident block */
  int32_t code_arch;          /* virtual architecture of the kernels loaded on
                                 it (cudaFuncAttributes.ptxVersion: 80 for the
                                 sm_80 SASS or compute_80 PTX, 90 for sm_90a);
                                 below 90: no programmatic dependent launch and
                                 no 8-warp config */
  int32_t wgmma;              /* 1: compute capability 9.0 and this build's
                                 sm_90a code (the Hopper kernels,
                                 mla_wgmma_kernel.cu and
                                 rows_wgmma_kernel.cu); 0 otherwise */
} fd_gpu_budget;

/* The tensor-core split kernel's configurations (values passed to
 * fd_split_mma_launch; 0 and 1 keep the meaning of its old `wide` flag). */
typedef enum fd_mma_config {
  FD_MMA_4W = 0,
  FD_MMA_WIDE = 1,
  FD_MMA_LEAN = 2
} fd_mma_config;

/* The shape behind FD_MMA_SMEM, in the terms of split_mma_kernel.cu's
 * fd_mma_cfg (which static_asserts that its sizes equal these). D is the
 * shared-memory row width: head_dim, or 128 for head_dim 80 and 96. */
#define FD_MMA_KW(D, NW) ((D) == 256 ? (NW) / 2 : (NW))              /* key warps */
#define FD_MMA_KT(D, NW) (16 * FD_MMA_KW(D, NW))                     /* keys a tile */
#define FD_MMA_STAGES(D, NW, LEAN) ((LEAN) ? 2 : (D) == 64 ? ((NW) == 4 ? 4 : 6) : 3)
/* K and V stages | Q [16][D] | (m, l) [KW][16] | (M, L) [16] | key flags [STAGES][KT] */
#define FD_MMA_SMEM(D, NW, LEAN)                                                         \
  (2 * (size_t)FD_MMA_STAGES(D, NW, LEAN) * FD_MMA_KT(D, NW) * (D) * 2 + (size_t)16 * (D) * 2 + \
   (size_t)FD_MMA_KW(D, NW) * 16 * 8 + (size_t)16 * 8 +                                   \
   (size_t)FD_MMA_STAGES(D, NW, LEAN) * FD_MMA_KT(D, NW))

/* The rows kernel (rows_mma_kernel.cu: many query rows a kv head, rows as
 * the mma's M side): FD_ROWS_WARPS warps of 16 rows a block, FD_ROWS_KEYS
 * keys a tile, FD_ROWS_STAGES cp.async stages; its shared memory: K and V
 * stages | Q [16 * FD_ROWS_WARPS][D] | key flags [STAGES][KEYS]. */
#define FD_ROWS_WARPS 4
#define FD_ROWS_KEYS 64
#define FD_ROWS_STAGES 3
#define FD_ROWS_SMEM(D)                                                                 \
  (2 * (size_t)FD_ROWS_STAGES * FD_ROWS_KEYS * (D) * 2 + (size_t)16 * FD_ROWS_WARPS * (D) * 2 + \
   (size_t)FD_ROWS_STAGES * FD_ROWS_KEYS)

/* The Hopper rows kernel (rows_wgmma_kernel.cu, sm_90a wgmma): the same
 * problem with FD_ROWS_WG_GROUPS warpgroups of 64 rows a block sharing each
 * 64-key K/V tile, FD_ROWS_WG_STAGES(D) cp.async stages. Its shared memory:
 * Q [rows][D] | K and V stages [STAGES][64][D] each | key flags
 * [STAGES][64] | 1024 bytes of alignment slack: 99,456 B (128), 83,200 B
 * (64); two blocks an SM (registers: 128 a thread). */
#define FD_ROWS_WG_GROUPS 2
#define FD_ROWS_WG_ROWS (64 * FD_ROWS_WG_GROUPS)
#define FD_ROWS_WG_STAGES(D) ((D) == 64 ? 4 : 2)
#define FD_ROWS_WG_SMEM(D)                                                           \
  ((size_t)FD_ROWS_WG_ROWS * (D) * 2 + 2 * (size_t)FD_ROWS_WG_STAGES(D) * 64 * (D) * 2 + \
   (size_t)FD_ROWS_WG_STAGES(D) * 64 + 1024)

/* Row tiles (blocks along y for each kv head) of a rows kernel whose
 * blocks take block_rows rows (16 FD_ROWS_WARPS, or FD_ROWS_WG_ROWS), for
 * group * q_len rows a kv head. */
static inline int32_t fd_rows_tiles(int32_t group, int32_t q_len, int32_t block_rows) {
  const int64_t rows = (int64_t)group * q_len;
  return (int32_t)((rows + block_rows - 1) / block_rows);
}

/* The shared-memory row width of a CUDA head_dim (80 and 96 live in 128-wide rows). */
static inline int32_t fd_mma_row_width(int32_t head_dim) {
  return head_dim == 80 || head_dim == 96 ? 128 : head_dim;
}

/* Bytes of shared memory a block of `cfg` takes at head_dim, 0 when that
 * config has no instance there (lean at head_dim 64). */
static inline size_t fd_mma_smem_bytes(int32_t head_dim, fd_mma_config cfg) {
  const int32_t d = fd_mma_row_width(head_dim);
  if (d != 64 && d != 128 && d != 256) return 0;
  switch (cfg) {
    case FD_MMA_4W: return FD_MMA_SMEM(d, 4, 0);
    case FD_MMA_WIDE: return FD_MMA_SMEM(d, 8, 0);
    case FD_MMA_LEAN: return d == 64 ? 0 : FD_MMA_SMEM(d, 4, 1);
  }
  return 0;
}

/* Blocks of `smem` bytes one multiprocessor holds within the budget (0 when
 * a block does not fit at all); registers and threads may allow fewer (the
 * occupancy calculator says). */
static inline int32_t fd_gpu_blocks_fit(const fd_gpu_budget *g, size_t smem) {
  if (smem == 0 || smem > (size_t)g->smem_block) return 0;
  return (int32_t)((size_t)g->smem_sm / (smem + (size_t)g->smem_reserved));
}

/* The MLA kernel (mla_kernel.cu: rope_dim > 0, one kv head, K = [c_kv (D) |
 * k_pe (64)], V = c_kv): FD_MLA_WARPS warps a block and RG row groups of 16
 * query rows (RG 1: up to 16 rows a block, RG 2: up to 32, both 64-key
 * tiles; RG 4: up to 64 rows, 32-key tiles), FD_MLA_ST(RG) cp.async stages
 * (RG 1: 3, two tiles in flight while one is computed; else 2; RG 1 over an
 * fp8 cache: 5 of its half-size tiles, 4 at D 448). Its shared memory for head_dim D
 * (16-bit cache; fp8 instances take no more): K stages
 * [ST][KT][2D + 128] | Q [16 RG][2D + 128] (RG 1: none, Q passes through
 * the last stage into registers) | P hi, lo [16 RG][KT] 16-bit | row maxima
 * [8][16] float2 | key offsets [ST][KT][3] int64 | token scales [ST][KT] |
 * row scales [16 RG] | key flags [ST][KT]. D 512: 231,936 B (RG 1),
 * 197,376 B (RG 2), 158,784 B (RG 4). */
#define FD_MLA_WARPS 8
#define FD_MLA_ST(RG) ((RG) == 1 ? 3 : 2)
#define FD_MLA_KT(RG) ((RG) <= 2 ? 64 : 32)
#define FD_MLA_QBYTES(D, RG) ((RG) == 1 ? (size_t)0 : (size_t)16 * (RG) * (2 * (D) + 128))
#define FD_MLA_SMEM(D, RG)                                                                      \
  ((size_t)FD_MLA_ST(RG) * FD_MLA_KT(RG) * (2 * (D) + 128) + FD_MLA_QBYTES(D, RG) +              \
   (size_t)2 * 16 * (RG) * FD_MLA_KT(RG) * 2 + (size_t)FD_MLA_WARPS * 16 * 8 +                  \
   (size_t)FD_MLA_ST(RG) * FD_MLA_KT(RG) * 24 + (size_t)FD_MLA_ST(RG) * FD_MLA_KT(RG) * 4 +      \
   (size_t)16 * (RG) * 4 + (size_t)FD_MLA_ST(RG) * FD_MLA_KT(RG))

/* The MLA kernel's row groups for `rows` query rows a sequence (num_heads_q
 * x q_len) on a device of budget g: 1 for up to 16 rows and 2 for up to 32
 * where its block fits (GPUs with ~227 KB a block), else 4 (~155 KB:
 * compute capability 8.0 and 9.0+); 0 when none fits (GPUs with 99 KB a
 * block: no MLA kernel). */
static inline int fd_mla_row_groups(const fd_gpu_budget *g, int32_t head_dim, int64_t rows) {
  if (head_dim != 512 && head_dim != 448) return 0;
  if (rows <= 16 && fd_gpu_blocks_fit(g, FD_MLA_SMEM(head_dim, 1)) >= 1) return 1;
  if (rows <= 32 && fd_gpu_blocks_fit(g, FD_MLA_SMEM(head_dim, 2)) >= 1) return 2;
  if (fd_gpu_blocks_fit(g, FD_MLA_SMEM(head_dim, 4)) >= 1) return 4;
  return 0;
}

/* Row tiles (blocks along y) of the MLA kernel: ceil(rows / (16 rg)). */
static inline int64_t fd_mla_row_tiles(int rg, int64_t rows) {
  return rg > 0 ? (rows + 16 * rg - 1) / (16 * rg) : 0;
}

/* The Hopper MLA kernel (mla_wgmma_kernel.cu, sm_90a wgmma): 2 warpgroups
 * and 64 query rows a block, 64-key tiles. Its shared memory: Q and 2
 * stages of K [64][576] 16-bit, P [64][64], row maxima / sums [2][64]
 * float2, key flags [2][64], 1024 bytes of alignment slack: 231,552 B. */
#define FD_MLA_WG_SMEM ((size_t)3 * 64 * 576 * 2 + 64 * 64 * 2 + 2 * 64 * 8 + 2 * 64 + 1024)

/* The Hopper MLA seesaw kernel (mla_seesaw_kernel.cu): Q and 2 buffers of
 * a 64-key tile [64][576] 16-bit, P [64][64] 16-bit, the running max and
 * the two groups' factors float [3][64], float2 [2][64], 18 mbarriers, 1024
 * bytes of alignment slack: 232,336 B. */
#define FD_MLA_SS_SMEM \
  ((size_t)3 * 64 * 576 * 2 + 64 * 64 * 2 + 3 * 64 * 4 + 2 * 64 * 8 + 18 * 8 + 1024)

/* 1 when the MLA plan on budget g runs the Hopper kernel instead of
 * mla_kernel.cu: sm_90a code on compute capability 9.0 (g->wgmma),
 * head_dim 512, latent and rope caches of q's 16-bit dtype (kv_dtype and
 * rope_dtype as fd_problem: 0 = the one before), at least 64 query rows a
 * sequence (rows = num_heads_q x q_len: the compute-bound shapes; a block
 * takes 64 rows, as mla_kernel.cu's RG 4, so the row tiles are the same)
 * and a block fits. Plan and backend both decide by it. */
static inline int fd_mla_wgmma_ok(const fd_gpu_budget *g, int32_t head_dim, int32_t dtype,
                                  int32_t kv_dtype, int32_t rope_dtype, int64_t rows) {
  const int32_t kv = kv_dtype == 0 ? dtype : kv_dtype;
  const int32_t rope = rope_dtype == 0 ? kv : rope_dtype;
  return g->wgmma && head_dim == 512 && kv == dtype && rope == dtype && rows >= 64 &&
         fd_gpu_blocks_fit(g, FD_MLA_WG_SMEM) >= 1;
}

/* Keys a split must hold for the seesaw kernel: it refills each tile's
 * buffer as soon as its readers are done, which pays over long splits, but
 * its ramp-up is longer than mla_wgmma_kernel.cu's. Measured on an H100
 * (128 heads, bf16, CUDA-graph replay), its time against the other's:
 * 0.80-0.95x at 2048 keys a split and more, 0.85-1.06x at 1024, 1.13-1.14x
 * at 512 and 128. */
#define FD_MLA_SS_MIN_SPLIT_KEYS 2048

/* 1 when a call that fd_mla_wgmma_ok gives the Hopper kernels runs the
 * seesaw one (mla_seesaw_kernel.cu, TMA copies of whole 64-key tiles):
 * a contiguous cache (page_size 0) or pages of a multiple of 64 keys,
 * splits on multiples of 64 keys (chunk_len, and split_len_fixed when the
 * deterministic mode fixes it) of at least FD_MLA_SS_MIN_SPLIT_KEYS keys
 * (split_len_fixed, else the plan's split_keys) and a block fits; the
 * backend still falls back to mla_wgmma_kernel.cu when the driver refuses
 * the caches' layout (addresses or strides not multiples of 16 bytes). */
static inline int fd_mla_seesaw_ok(const fd_gpu_budget *g, int32_t page_size, int32_t chunk_len,
                                   int32_t split_len_fixed, int32_t split_keys) {
  const int32_t keys = split_len_fixed > 0 ? split_len_fixed : split_keys;
  return (page_size == 0 || page_size % 64 == 0) && chunk_len % 64 == 0 &&
         split_len_fixed % 64 == 0 && keys >= FD_MLA_SS_MIN_SPLIT_KEYS &&
         fd_gpu_blocks_fit(g, FD_MLA_SS_SMEM) >= 1;
}

/* 1 when a rows-kernel problem (internal.h fd_rows_kernel_shape) on
 * budget g runs the Hopper rows kernel instead of rows_mma_kernel.cu:
 * sm_90a code on compute capability 9.0 (g->wgmma), more than 64 rows a
 * kv head (rows = group x q_len: fewer leave a warpgroup idle, and are
 * memory-bound, where rows_mma_kernel.cu's 3 stages keep more bytes in
 * flight) and a block fits. Plan and backend both decide by it. */
static inline int fd_rows_wgmma_ok(const fd_gpu_budget *g, int32_t head_dim, int64_t rows) {
  return g->wgmma && (head_dim == 64 || head_dim == 128) && rows > 64 &&
         fd_gpu_blocks_fit(g, FD_ROWS_WG_SMEM(head_dim)) >= 1;
}

/* The 4-warp config a device runs at head_dim: FD_MMA_4W where one block of
 * it fits (two where they fit), else FD_MMA_LEAN; -1 when neither fits. */
static inline int fd_mma_config_4w(const fd_gpu_budget *g, int32_t head_dim) {
  if (fd_gpu_blocks_fit(g, fd_mma_smem_bytes(head_dim, FD_MMA_4W)) >= 1) return FD_MMA_4W;
  if (fd_gpu_blocks_fit(g, fd_mma_smem_bytes(head_dim, FD_MMA_LEAN)) >= 1) return FD_MMA_LEAN;
  return -1;
}

/* 1 when the device may run the 8-warp config at head_dim: the loaded code
 * has it (built for compute capability 9.0 or newer) and a block fits. */
static inline int fd_mma_wide_ok(const fd_gpu_budget *g, int32_t head_dim) {
  return g->code_arch >= 90 && fd_gpu_blocks_fit(g, fd_mma_smem_bytes(head_dim, FD_MMA_WIDE)) >= 1;
}

/* 1 when the loaded code may be launched with programmatic dependent launch:
 * only code built for compute capability 9.0 or newer executes
 * griddepcontrol.wait (older targets compile it out, and a kernel launched
 * with the attribute that does not wait could read its predecessor's output
 * early). A plan may still ask for plain launches (fd_problem.no_pdl). */
static inline int fd_gpu_pdl_ok(const fd_gpu_budget *g) { return g->code_arch >= 90; }

/* Applies a limit of `limit_kb` KB a multiprocessor (0: none) to a budget:
 * the multiprocessor's bytes capped at it, a block's at it less the reserved
 * bytes (the sm_86 budget, 100 KB an SM and 99 KB a block, from 100). */
static inline void fd_gpu_budget_limit(fd_gpu_budget *g, int32_t limit_kb) {
  if (limit_kb <= 0) return;
  const int32_t sm = limit_kb * 1024;
  if (g->smem_sm > sm) g->smem_sm = sm;
  if (g->smem_block > g->smem_sm - g->smem_reserved) g->smem_block = g->smem_sm - g->smem_reserved;
}

#ifdef __cplusplus
}
#endif

#endif /* FD_GPU_SELECT_H */
