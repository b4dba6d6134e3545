/*
 * cpu_kernels_amx.c — the CPU kernels for AMX-BF16 (contract in
 * cpu_kernels.h): those of cpu_kernels_avx512.c, except that bf16 keys and
 * values with head_dim % 32 == 0 (a bf16 cache, or an fp8 cache widened to
 * bf16) multiply on AMX tiles (cpu_simd_amx.h): q.K where the driver packed
 * q (pack_q: q bf16, or fp16 as two bf16 pieces), P.V (P as two bf16
 * pieces) where every row sees every key of the block. The online softmax,
 * float32 and fp16 caches and the masked blocks run the AVX-512 code. Built
 * with default flags: the target attribute enables the instructions per
 * function, and dispatch calls these only when the CPU has them and the OS
 * granted the tile state (cpu_dispatch.c).
 */
#include "cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AMX_KERNELS 1
#define FD_V_AMX 1
#include "cpu_simd_avx512.h"
#include "cpu_simd_amx.h"
#include "cpu_kernel_body.h"
#endif

int fd_cpu_kernels_amx(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AMX_KERNELS
  return fill_kernels(dtype, k);
#else
  (void)dtype;
  (void)k;
  return 0;
#endif
}
