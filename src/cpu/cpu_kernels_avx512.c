/*
 * cpu_kernels_avx512.c — the CPU kernels for AVX-512 F/BW/VL (contract in
 * cpu_kernels.h): the algorithm of cpu_kernel_body.h over the 16-float
 * primitives of cpu_simd_avx512.h (score tiles 4 rows x 4 keys, 2 x 8,
 * 1 x 16, the next tile's key rows prefetched; value tiles up to 4 rows x 64
 * columns; bf16 with head_dim % 32 == 0 in the paired column order;
 * head_dim <= 8: 16 keys a vector). Built with default flags: the target
 * attribute enables the instructions per function, and dispatch calls these
 * only when the CPU has them.
 */
#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX512_KERNELS 1
#include "cpu_simd_avx512.h"
#include "cpu_kernel_body.h"
#endif

int fd_cpu_kernels_avx512(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX512_KERNELS
  return fill_kernels(dtype, k);
#else
  (void)dtype;
  (void)k;
  return 0;
#endif
}
