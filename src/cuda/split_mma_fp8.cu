/*
 * split_mma_fp8.cu — the tensor-core split kernel's e4m3-cache instances
 * (KV8 = 1: kv_dtype FD_DTYPE_E4M3 with fp16 or bf16 q; FD_MMA_4W and
 * FD_MMA_LEAN, split_mma_kernel.cuh FP8) and the fp8 dispatch; the e5m2
 * instances (KV8 = 2) are in split_mma_e5m2.cu. The format is a template
 * constant, not a run-time flag: chosen at run time, each widening issued
 * both conversions, one predicated off. Their own translation units, so that
 * they compile in parallel with the 16-bit ones (split_mma_kernel.cu).
 */
#include "split_mma_kernel.cuh"

cudaError_t fd_split_mma_launch_fp8(const fd_kernel_params *p, int cfg, cudaStream_t stream) {
  if (p->kv_dtype == FD_DTYPE_E5M2) return fd_split_mma_launch_e5m2(p, cfg, stream);
  if (p->kv_dtype != FD_DTYPE_E4M3) return cudaErrorInvalidValue;
  switch (p->dtype) {
    case FD_DTYPE_F16: return fd_split_mma_launch_dim<__half, 1>(p, cfg, stream);
    case FD_DTYPE_BF16: return fd_split_mma_launch_dim<__nv_bfloat16, 1>(p, cfg, stream);
  }
  return cudaErrorInvalidValue;
}
