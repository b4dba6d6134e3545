/*
 * mma_config.cuh — the compile-time shape of the tensor-core split kernel
 * (split_mma_kernel.cuh) for one head_dim and warp count: warps along keys
 * and head_dim, key tile, pipeline depth, shared-memory carve-up sizes.
 * Internal to src/cuda.
 */
#ifndef FD_CUDA_MMA_CONFIG_CUH
#define FD_CUDA_MMA_CONFIG_CUH

#include <stddef.h>

#include "gpu_select.h"

#define FD_MMA_ROWS 16 /* rows of the Q / (m, l) / O buffers (a pass uses 8: split_mma_kernel.cuh) */
#define FD_MMA_OPAD 8  /* floats of padding per row of the O merge buffer */


/* Compile-time shape of the kernel for one head_dim and NW warps a block:
 * NW = 4 (two blocks an SM) or NW = 8 (one block an SM, twice the keys a
 * tile, ~196 KB of stages; launched when the grid has no more blocks than
 * the GPU has SMs). LEAN (NW = 4 only): 2 stages, for GPUs whose 99 KB a
 * block hold no 3-stage block (gpu_select.h, FD_MMA_LEAN); tiles and warps
 * as without it. */
template <int D, int NW, int LEAN = 0>
struct fd_mma_cfg {
  static constexpr int THREADS = 32 * NW;
  static constexpr int KW = D == 256 ? NW / 2 : NW; /* warps along the keys of a tile */
  static constexpr int DW = NW / KW;                /* warps along head_dim in P V */
  static constexpr int KT = 16 * KW;                /* keys per tile */
  static constexpr int STAGES = FD_MMA_STAGES(D, NW, LEAN); /* pipeline depth (gpu_select.h) */
  /* fp8 caches: stages of KT * D bytes in the same K / V areas, one fewer
   * than fit (the last KT * D bytes of the K area: TOKEN scales and flags) */
  static constexpr int ST8 = 2 * STAGES - 1;
  static constexpr int DPW = D / DW;               /* O columns per warp */
  static constexpr int NT = DPW / 8;               /* O n-tiles (8 columns) per warp */
  static constexpr int KS = D / 16;                /* k-steps of Q K^T */
  static constexpr int CH = D / 8;                 /* 16-byte chunks per row */
  static constexpr size_t KV_BYTES = 2 * (size_t)STAGES * KT * D * 2; /* K and V stages */
  static constexpr size_t Q_BYTES = (size_t)FD_MMA_ROWS * D * 2;
  static constexpr size_t ML_BYTES = (size_t)KW * FD_MMA_ROWS * sizeof(float2);
  static constexpr size_t FIN_BYTES = (size_t)FD_MMA_ROWS * sizeof(float2);
  static constexpr size_t VALID_BYTES = (size_t)STAGES * KT; /* paged: key-valid flags */
  static constexpr size_t SMEM = KV_BYTES + Q_BYTES + ML_BYTES + FIN_BYTES + VALID_BYTES;
  static_assert(D == 64 || D == 128 || D == 256, "head_dim");
  static_assert(NT % 2 == 0, "P V takes n-tiles in pairs");
  /* sm_90: 227 KiB of shared memory a block, 228 KiB an SM (1 KiB reserved a block). */
  static_assert(SMEM <= 232448 && (NW == 8 || 2 * (SMEM + 1024) <= 233472), "shared memory");
  static_assert(NW == 4 || NW == 8, "warps");
  static_assert(!LEAN || (NW == 4 && D != 64), "lean: 4 warps, head_dim 80..256");
  static_assert(SMEM == FD_MMA_SMEM(D, NW, LEAN), "gpu_select.h sizes the configs the same way");
  static_assert(64 % KT == 0 || KT % 64 == 0, "tiles start at multiples of 64 keys");
  /* Keys below a pass's first visible key lie in the prologue's tiles, except
   * with 2 stages of 32 keys (lean, head_dim 256), where the loop zero-fills
   * them too (PRE_LO, split_mma_kernel.cuh). */
  static constexpr bool PRE_LO = (STAGES - 1) * KT < 64;
  static_assert((size_t)KW * FD_MMA_ROWS * (D + FD_MMA_OPAD) * sizeof(float) <= KV_BYTES,
                "O merge buffer must fit in the K/V stages");
};

/* The shape of one kernel instance: the config plus the head_dim DV its
 * rows hold (DV < D: 80 and 96 in 128-wide rows, whose columns past DV are
 * zeros in shared memory and skipped by the mma loops). */
template <int D_, int NW_, int LEAN_, int DV_>
struct fd_mma_shape : fd_mma_cfg<D_, NW_, LEAN_> {
  using C = fd_mma_cfg<D_, NW_, LEAN_>;
  static constexpr int D = D_, NW = NW_, LEAN = LEAN_, DV = DV_;
  static constexpr int KSV = DV / 16;                    /* k-steps of Q K^T */
  static constexpr int NTV = DV == D ? C::NT : DV / 8;  /* O n-tiles a warp computes */
  static constexpr int NO = NTV / 2;                     /* O^T m-tiles (16 columns) a warp */
  static constexpr int ROWS = FD_MMA_ROWS;
  static constexpr int OSTRIDE = D + FD_MMA_OPAD;       /* floats a row of the O merge buffer */
  static_assert(DV == D || (C::DW == 1 && DV % 16 == 0 && DV < D), "padded head_dim");
};

#endif /* FD_CUDA_MMA_CONFIG_CUH */
