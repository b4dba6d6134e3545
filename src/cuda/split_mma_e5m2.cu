/*
 * split_mma_e5m2.cu — the tensor-core split kernel's e5m2-cache instances
 * (KV8 = 2: kv_dtype FD_DTYPE_E5M2 with fp16 or bf16 q; FD_MMA_4W and
 * FD_MMA_LEAN, split_mma_kernel.cuh FP8), reached through
 * fd_split_mma_launch_fp8 (split_mma_fp8.cu).
 */
#include "split_mma_kernel.cuh"

cudaError_t fd_split_mma_launch_e5m2(const fd_kernel_params *p, int cfg, cudaStream_t stream) {
  switch (p->dtype) {
    case FD_DTYPE_F16: return fd_split_mma_launch_dim<__half, 2>(p, cfg, stream);
    case FD_DTYPE_BF16: return fd_split_mma_launch_dim<__nv_bfloat16, 2>(p, cfg, stream);
  }
  return cudaErrorInvalidValue;
}
