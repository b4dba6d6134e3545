/*
 * cpu_kernels_avx2.c — the CPU kernels for AVX2 + FMA + F16C (contract in
 * cpu_kernels.h): the algorithm of cpu_kernel_body.h over the 8-float
 * primitives of cpu_simd_avx2.h (score tiles 4 rows x 2 keys, 2 x 4, 1 x 8;
 * value tiles 4 rows x 16 columns; head_dim <= 8: 8 keys a vector).
 * Built with default flags: the target attribute enables the instructions
 * per function, and dispatch calls these only when the CPU has them.
 */
#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX2_KERNELS 1
#include "cpu_simd_avx2.h"
#include "cpu_kernel_body.h"
#endif

int fd_cpu_kernels_avx2(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX2_KERNELS
  return fill_kernels(dtype, k);
#else
  (void)dtype;
  (void)k;
  return 0;
#endif
}
