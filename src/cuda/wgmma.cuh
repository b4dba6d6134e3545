/*
 * wgmma.cuh — Hopper warpgroup matrix multiply-accumulate (wgmma.mma_async,
 * sm_90a only) as PTX wrappers, and the shared-memory matrix descriptors
 * they read their operands through.
 *
 * A warpgroup is 4 consecutive warps starting at a warp index divisible by
 * 4; all 128 threads issue each wgmma together. One wgmma.m64nNk16 computes
 * D[64][N] (+)= A[64][16] B[16][N] with fp32 D in registers: thread t of
 * the group (warp w = t / 32, lane = 32 w + 4 g + q) holds, for each
 * 8-column chunk i of N, d[4 i + 0, 1] = D[16 w + g][8 i + 2 q, + 1] and
 * d[4 i + 2, 3] = D[16 w + g + 8][8 i + 2 q, + 1] (the mma.sync m16n8
 * accumulator layout, one 16-row slab a warp).
 *
 * B operands (and A, except where a wrapper takes A from registers: the
 * m16n8k16 A fragment of each warp's 16-row slab, which is how an S
 * accumulator becomes P without shared memory) come from shared memory
 * through 64-bit descriptors
 * (fd_wgmma_desc): the start address, the leading and stride byte offsets
 * (LBO, SBO) and the swizzle mode. Here every operand uses the 128-byte
 * swizzle: rows of 128 bytes (64 16-bit elements) in atoms of 8 rows (1024
 * bytes, 1024-byte aligned), 16-byte chunk c of row r stored at chunk
 * c ^ (r % 8).
 *   K-major (the reduction dimension contiguous: Q and K for S = Q K^T, P
 *   for O = P V): an operand's rows are its M (or N) rows; SBO = 1024 (the
 *   next 8 rows), LBO unused (1); k-step k16 of a 64-column atom column
 *   starts 32 k bytes into it (the hardware swizzles the address).
 *   MN-major (transposed B: V[keys][columns] for O = P V): the atom's 128
 *   bytes are 64 N columns, its 8 rows 8 keys; LBO = the byte distance to
 *   the next 64 columns, SBO = the distance to the next 8 keys.
 *
 * Ordering: fd_wgmma_fence before the first wgmma that reads registers
 * (accumulators) written by other instructions; fd_wgmma_commit closes a
 * group of issued wgmma; fd_wgmma_wait<N> waits until at most N groups are
 * pending. The compiler sees the accumulators as written when the wgmma
 * statement issues; fd_wgmma_hold(d) after the wait keeps it from reading
 * them earlier. Shared memory written by ordinary stores (or cp.async) that
 * a wgmma reads next needs fd_fence_proxy_async in each writing thread
 * before the barrier.
 *
 * Outside sm_90a passes (__CUDA_ARCH_FEAT_SM90_ALL undefined) the wrappers
 * compile to nothing: callers must not run there (the plan chooses the
 * wgmma kernel only on compute capability 9.0 with sm_90a code).
 */
#ifndef FD_WGMMA_CUH
#define FD_WGMMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FD_WGMMA_ON 1
#else
#define FD_WGMMA_ON 0
#endif

/* A shared-memory matrix descriptor, 128-byte swizzle: start address (a
 * shared-window byte address), LBO and SBO in bytes (multiples of 16). */
static __device__ __forceinline__ uint64_t fd_wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= (uint64_t)((addr & 0x3FFFFu) >> 4);
  d |= (uint64_t)((lbo >> 4) & 0x3FFFu) << 16;
  d |= (uint64_t)((sbo >> 4) & 0x3FFFu) << 32;
  d |= (uint64_t)1 << 62; /* layout type 1: 128-byte swizzle; base offset 0 (aligned atoms) */
  return d;
}

static __device__ __forceinline__ void fd_wgmma_fence(void) {
#if FD_WGMMA_ON
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void fd_wgmma_commit(void) {
#if FD_WGMMA_ON
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
static __device__ __forceinline__ void fd_wgmma_wait(void) {
#if FD_WGMMA_ON
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/* Generic-proxy shared-memory writes (st.shared, cp.async) made visible to
 * the async proxy (wgmma operand reads); then a barrier. */
static __device__ __forceinline__ void fd_fence_proxy_async(void) {
#if FD_WGMMA_ON
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* The registers of d are (re)defined here: reads of them stay after it. */
template <int N>
static __device__ __forceinline__ void fd_wgmma_hold(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* The instruction for element type TY ("bf16" or "f16"), operands as below. */
#define FD_WGMMA_ASM_M64N32K16(TY) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

/* d[16] (+)= A[64][16] B[16][32]; both K-major. scale_d 0: d = A B. */
template <typename T>
static __device__ __forceinline__ void fd_wgmma_m64n32k16(float (&d)[16], uint64_t desc_a,
                                                          uint64_t desc_b, int scale_d) {
#if FD_WGMMA_ON
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    FD_WGMMA_ASM_M64N32K16("bf16");
  else
    FD_WGMMA_ASM_M64N32K16("f16");
#else
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
#endif
}

/* The 128 fp32 accumulators of an m64n256 instruction: their operands %0 ..
 * %127 in the instruction text, and their constraints (d[0 .. 127]). */
#define FD_WGMMA_D128_REGS \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \

#define FD_WGMMA_D128_OUT \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \

/* The instruction for element type TY ("bf16" or "f16"), operands as below. */
#define FD_WGMMA_ASM_M64N256K16_TB(TY) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
      "{" \
      FD_WGMMA_D128_REGS \
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n" \
      : FD_WGMMA_D128_OUT \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

/* d[128] (+)= A[64][16] B[16][256]; A K-major, B MN-major (transposed:
 * B's 256 columns contiguous in its rows). scale_d 0: d = A B. */
template <typename T>
static __device__ __forceinline__ void fd_wgmma_m64n256k16_tb(float (&d)[128], uint64_t desc_a,
                                                              uint64_t desc_b, int scale_d) {
#if FD_WGMMA_ON
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    FD_WGMMA_ASM_M64N256K16_TB("bf16");
  else
    FD_WGMMA_ASM_M64N256K16_TB("f16");
#else
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
#endif
}

#undef FD_WGMMA_ASM_M64N32K16
#undef FD_WGMMA_ASM_M64N256K16_TB

/* The instruction for element type TY ("bf16" or "f16"), operands as below. */
#define FD_WGMMA_ASM_M64N64K16_SS(TY) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

/* The instructions with A from registers, for element type TY ("bf16" or
 * "f16") and B's layout TB ("0": K-major, "1": MN-major), operands as below. */
#define FD_WGMMA_ASM_M64N64K16_RS(TY, TB) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, " TB ";\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

#define FD_WGMMA_ASM_M64N128K16_RS(TY, TB) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
      "%56, %57, %58, %59, %60, %61, %62, %63" \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, " TB ";\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
      "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
      "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
      "+f"(d[63]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

#define FD_WGMMA_ASM_M64N256K16_RS(TY, TB) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
      "{" \
      FD_WGMMA_D128_REGS \
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, " TB ";\n}\n" \
      : FD_WGMMA_D128_OUT \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

/* d[32] (+)= A[64][16] B[16][64]; both K-major from shared memory (S = Q K^T
 * for 64 keys). scale_d 0: d = A B. */
template <typename T>
static __device__ __forceinline__ void fd_wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a,
                                                             uint64_t desc_b, int scale_d) {
#if FD_WGMMA_ON
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    FD_WGMMA_ASM_M64N64K16_SS("bf16");
  else
    FD_WGMMA_ASM_M64N64K16_SS("f16");
#else
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
#endif
}

/* d[N / 2] (+)= A[64][16] B[16][N], N = 64, 128 or 256: A from registers (the
 * m16n8k16 A fragment of the thread's warp slab: a[0] rows g, columns 2 q,
 * + 1; a[1] rows g + 8; a[2], a[3] the same at columns + 8), B from shared
 * memory, K-major (TRANS_B 0: S += Q K^T with Q's columns in registers) or
 * MN-major (TRANS_B 1: O += P V, V[keys][columns] read transposed). */
template <typename T, int N, int TRANS_B>
static __device__ __forceinline__ void fd_wgmma_m64k16_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                                          uint64_t desc_b, int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "N");
#if FD_WGMMA_ON
  constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
#define FD_WGMMA_RS(M)                  \
  do {                                  \
    if constexpr (bf16 && TRANS_B)      \
      M("bf16", "1");                   \
    else if constexpr (bf16)            \
      M("bf16", "0");                   \
    else if constexpr (TRANS_B)         \
      M("f16", "1");                    \
    else                                \
      M("f16", "0");                    \
  } while (0)
  if constexpr (N == 64)
    FD_WGMMA_RS(FD_WGMMA_ASM_M64N64K16_RS);
  else if constexpr (N == 128)
    FD_WGMMA_RS(FD_WGMMA_ASM_M64N128K16_RS);
  else
    FD_WGMMA_RS(FD_WGMMA_ASM_M64N256K16_RS);
#undef FD_WGMMA_RS
#else
  (void)d, (void)a, (void)desc_b, (void)scale_d;
#endif
}

#undef FD_WGMMA_ASM_M64N64K16_SS
#undef FD_WGMMA_ASM_M64N64K16_RS
#undef FD_WGMMA_ASM_M64N128K16_RS
#undef FD_WGMMA_ASM_M64N256K16_RS
#undef FD_WGMMA_D128_REGS
#undef FD_WGMMA_D128_OUT

#endif /* FD_WGMMA_CUH */
