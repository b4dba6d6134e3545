/*
 * cpu_dispatch.c — picks the CPU kernels at run time: the widest instruction
 * set the processor (and the operating system, for the AVX register state)
 * supports. Nothing is cached: the check is a few loads and one cpuid, done
 * once per call.
 */
#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_X86 1
#include <cpuid.h>

/* F16C by cpuid (clang's __builtin_cpu_supports does not know "f16c"). */
static int has_f16c(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  return (ecx & bit_F16C) != 0;
}
#endif

fd_cpu_isa fd_cpu_isa_detect(void) {
#ifdef FD_X86
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !has_f16c())
    return FD_CPU_ISA_SCALAR;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return FD_CPU_ISA_AVX512;
  return FD_CPU_ISA_AVX2;
#else
  return FD_CPU_ISA_SCALAR;
#endif
}

int fd_cpu_kernels_get(fd_cpu_isa isa, fd_dtype dtype, fd_cpu_kernels *k) {
  switch (isa) {
    case FD_CPU_ISA_AVX512: return fd_cpu_kernels_avx512(dtype, k);
    case FD_CPU_ISA_AVX2: return fd_cpu_kernels_avx2(dtype, k);
    case FD_CPU_ISA_SCALAR: return fd_cpu_kernels_scalar(dtype, k);
  }
  return 0;
}
