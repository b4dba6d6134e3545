/*
 * cpu_dispatch.c — picks the CPU kernels at run time: the widest instruction
 * set the processor (and the operating system, for the AVX register state)
 * supports. Nothing is cached here: the answer comes from
 * __builtin_cpu_supports, which reads what the compiler runtime found at
 * start-up (no cpuid per call: under a hypervisor every cpuid traps, several
 * microseconds each). Only clang builds on machines without AVX-512 still ask
 * cpuid for F16C (clang's __builtin_cpu_supports does not know "f16c"), and
 * for AMX.
 *
 * AMX (tile registers) needs, besides the CPU bits, the operating system's
 * tile state (XCR0 bits 17 and 18) and, on Linux, the process's permission
 * to use it (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA): asked for here
 * every time AMX is considered. The request is idempotent and process-wide
 * (every thread may then run tile instructions), so fd_plan_init, which
 * records the set in the plan, has made AMX usable before fd_run runs it.
 */
#define _DEFAULT_SOURCE /* syscall */
#include <stdio.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu_kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FD_X86 1
#if defined(__clang__)
#include <cpuid.h>

static int has_f16c(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  return (ecx & bit_F16C) != 0;
}
#else
static int has_f16c(void) { return __builtin_cpu_supports("f16c"); }
#endif

/* AMX-TILE and AMX-BF16 in the CPU (CPUID leaf 7: EDX bits 24 and 22). */
#if defined(__clang__)
static int cpu_has_amx(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return 0;
  return (edx >> 22 & 1u) && (edx >> 24 & 1u);
}
#else
static int cpu_has_amx(void) {
  return __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16");
}
#endif

/* 1 when this process may run AMX-BF16 tile instructions: the CPU has them,
 * the OS saves tile state (XCR0 bits 17, 18) and grants the permission. */
static int amx_usable(void) {
#if defined(__linux__) && defined(__x86_64__)
  /* (the AMX set's fp8 widening uses AVX-512 VBMI, which every AMX CPU has) */
  if (!cpu_has_amx() || !__builtin_cpu_supports("avx512bf16") ||
      !__builtin_cpu_supports("avx512vbmi"))
    return 0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* OSXSAVE: implied by AVX2 use */
  if ((lo & (3u << 17)) != (3u << 17)) return 0;
  enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return 0; /* other systems: no tile-state permission protocol known here */
#endif
}
#endif

/* The widest set this machine can run; amd_only_bf16: AVX-512 BF16 (without
 * AMX) only on AMD. */
static fd_cpu_isa widest(int amd_only_bf16) {
#ifdef FD_X86
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return FD_CPU_ISA_SCALAR;
  /* the AVX-512 kernels widen fp16 with the AVX-512 F forms of vcvtph2ps */
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    /* AMX-BF16 tiles for the bf16 (and fp8) products, AVX-512 for the rest */
    if (amx_usable()) return FD_CPU_ISA_AMX;
    /* vdpbf16ps (the bf16 scores of FD_CPU_ISA_AVX512_BF16) made them faster
     * than the FMA kernel on AMD Zen 4; on Intel Sapphire Rapids it issued at
     * half the FMA rate and did not */
    if (__builtin_cpu_supports("avx512bf16") && (!amd_only_bf16 || __builtin_cpu_is("amd")))
      return FD_CPU_ISA_AVX512_BF16;
    return FD_CPU_ISA_AVX512;
  }
  return has_f16c() ? FD_CPU_ISA_AVX2 : FD_CPU_ISA_SCALAR;
#else
  (void)amd_only_bf16;
  return FD_CPU_ISA_SCALAR;
#endif
}

fd_cpu_isa fd_cpu_isa_detect(void) { return widest(1); }

fd_cpu_isa fd_cpu_isa_available(void) { return widest(0); }

int fd_cpu_kernels_get(fd_cpu_isa isa, fd_dtype dtype, fd_cpu_kernels *k) {
  memset(k, 0, sizeof *k); /* optional entries a getter leaves out: none */
  switch (isa) {
    case FD_CPU_ISA_AMX: return fd_cpu_kernels_amx(dtype, k);
    case FD_CPU_ISA_AVX512_BF16: return fd_cpu_kernels_avx512_bf16(dtype, k);
    case FD_CPU_ISA_AVX512: return fd_cpu_kernels_avx512(dtype, k);
    case FD_CPU_ISA_AVX2: return fd_cpu_kernels_avx2(dtype, k);
    case FD_CPU_ISA_SCALAR: return fd_cpu_kernels_scalar(dtype, k);
  }
  return 0;
}

static const char *const isa_names[] = {"scalar", "avx2", "avx512", "avx512_bf16", "amx"};

fd_status fd_cpu_isa_choose(const char *env, int32_t *isa, fd_error *err) {
  const fd_cpu_isa best = fd_cpu_isa_available();
  *isa = (int32_t)fd_cpu_isa_detect();
  if (!env || !*env || !strcmp(env, "auto")) return FD_STATUS_OK;
  for (int i = 0; i < (int)(sizeof isa_names / sizeof isa_names[0]); i++) {
    if (strcmp(env, isa_names[i]) != 0) continue;
    if (i > (int)best)
      return fd_fail(err, FD_STATUS_UNSUPPORTED,
                     "FD_CPU_ISA: %s is not available on this CPU or build (best: %s)", env,
                     isa_names[best]);
    *isa = i;
    return FD_STATUS_OK;
  }
  for (const char *c = env; *c; c++)
    if (*c < 0x20 || *c > 0x7e) /* the message stays one line */
      return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                     "FD_CPU_ISA: a value with a control or non-ASCII character is not auto, "
                     "scalar, avx2, avx512, avx512_bf16 or amx");
  return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                 "FD_CPU_ISA: '%.40s' is not auto, scalar, avx2, avx512, avx512_bf16 or amx",
                 env);
}
