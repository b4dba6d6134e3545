/*
 * split_mma_kernel.cu — the tensor-core split kernel's 16-bit-cache
 * instances, the launch entry point (fd_split_mma_launch: fp8 caches go to
 * split_mma_fp8.cu), occupancy and code-architecture queries. The kernel,
 * its design notes and its per-instance launchers: split_mma_kernel.cuh.
 */
#include "split_mma_kernel.cuh"

cudaError_t fd_split_mma_launch(const fd_kernel_params *p, int cfg, cudaStream_t stream) {
  /* an fp8 cache: split_mma_fp8.cu (kv_dtype 0 = dtype, as dev/cuda's callers leave it) */
  if (p->kv_dtype != 0 && p->kv_dtype != p->dtype) return fd_split_mma_launch_fp8(p, cfg, stream);
  switch (p->dtype) {
    case FD_DTYPE_F16: return fd_split_mma_launch_dim<__half, 0>(p, cfg, stream);
    case FD_DTYPE_BF16: return fd_split_mma_launch_dim<__nv_bfloat16, 0>(p, cfg, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T, int D, int DV>
static cudaError_t fd_split_mma_occupancy_cfg(int cfg, int *blocks_per_sm) {
  if (cfg == FD_MMA_4W) return fd_split_mma_occupancy_instance<T, D, DV, 0>(blocks_per_sm);
  if constexpr (D != 64)
    if (cfg == FD_MMA_LEAN) return fd_split_mma_occupancy_instance<T, D, DV, 1>(blocks_per_sm);
  return cudaErrorInvalidValue;
}

template <typename T>
static cudaError_t fd_split_mma_occupancy_dim(int head_dim, int cfg, int *blocks_per_sm) {
  switch (head_dim) {
    case 64: return fd_split_mma_occupancy_cfg<T, 64, 64>(cfg, blocks_per_sm);
    case 80: return fd_split_mma_occupancy_cfg<T, 128, 80>(cfg, blocks_per_sm);
    case 96: return fd_split_mma_occupancy_cfg<T, 128, 96>(cfg, blocks_per_sm);
    case 128: return fd_split_mma_occupancy_cfg<T, 128, 128>(cfg, blocks_per_sm);
    case 256: return fd_split_mma_occupancy_cfg<T, 256, 256>(cfg, blocks_per_sm);
  }
  return cudaErrorInvalidValue;
}

cudaError_t fd_split_mma_occupancy_config(int dtype, int head_dim, int cfg, int *blocks_per_sm) {
  *blocks_per_sm = 0;
  switch (dtype) {
    case FD_DTYPE_F16: return fd_split_mma_occupancy_dim<__half>(head_dim, cfg, blocks_per_sm);
    case FD_DTYPE_BF16:
      return fd_split_mma_occupancy_dim<__nv_bfloat16>(head_dim, cfg, blocks_per_sm);
  }
  return cudaErrorInvalidValue;
}

cudaError_t fd_split_mma_occupancy(int dtype, int head_dim, int *blocks_per_sm) {
  return fd_split_mma_occupancy_config(dtype, head_dim, FD_MMA_4W, blocks_per_sm);
}

cudaError_t fd_split_mma_code_arch(int *arch) {
  *arch = 0;
  cudaFuncAttributes a;
  memset(&a, 0, sizeof a);
  const cudaError_t e = cudaFuncGetAttributes(&a, fd_split_mma_kernel<__half, 64, 4, 64, 0, 0, 0>);
  if (e == cudaSuccess) *arch = a.ptxVersion;
  return e;
}
