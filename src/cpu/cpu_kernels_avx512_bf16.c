/*
 * cpu_kernels_avx512_bf16.c — the CPU kernels for AVX-512 F/BW/VL with
 * AVX-512 BF16 (contract in cpu_kernels.h): those of cpu_kernels_avx512.c,
 * except that bf16 scores with head_dim % 32 == 0 multiply q and the keys by
 * vdpbf16ps, 32 products an instruction with no widening, where q's rows are
 * bf16 values (cpu_kernel_body.h, scores_tile_dp). Built with default flags:
 * the target attribute enables the instructions per function, and dispatch
 * calls these only when the CPU has them.
 */
#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_HAVE_AVX512_BF16_KERNELS 1
#define FD_V_DPBF16 1
#include "cpu_simd_avx512.h"
#include "cpu_kernel_body.h"
#endif

int fd_cpu_kernels_avx512_bf16(fd_dtype dtype, fd_cpu_kernels *k) {
#ifdef FD_HAVE_AVX512_BF16_KERNELS
  return fill_kernels(dtype, k);
#else
  (void)dtype;
  (void)k;
  return 0;
#endif
}
