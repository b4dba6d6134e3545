/*
 * mma_primitives.cuh — the tensor-core instructions the split kernel uses
 * (mma.sync.m16n8k16 for fp16/bf16 with fp32 accumulators, ldmatrix, packing
 * floats into 16-bit pairs) and the swizzled shared-memory addressing of a
 * [rows][D] tile. Internal to src/cuda.
 */
#ifndef FD_CUDA_MMA_PRIMITIVES_CUH
#define FD_CUDA_MMA_PRIMITIVES_CUH

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- mma.sync / ldmatrix wrappers ---- */

/* c += a * b for one m16n8k16 tile: a = 4 registers of 16-bit pairs (A, row
 * major), b = 2 (B, "col"), c = 4 fp32. */
template <typename T>
static __device__ __forceinline__ void fd_mma16816(float (&c)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/* Four 8x8 16-bit matrices from shared memory; lane l gives row l % 8 of matrix l / 8. */
static __device__ __forceinline__ void fd_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Two floats -> hi + lo registers of two 16-bit values each, hi = RN(x) and
 * lo = RN(x - hi): P = hi + lo carries ~16 significant bits, so P·V done as
 * two mma keeps the weights as exact as the fp32 sum l they are divided by
 * (one 16-bit P alone costs 2^-9 relative per weight in bf16). */
template <typename T>
static __device__ __forceinline__ void fd_pack2_split(float lo_val, float hi_val, uint32_t &hi,
                                                      uint32_t &lo) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo_val, hi_val);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(lo_val - hf.x, hi_val - hf.y);
    memcpy(&hi, &h, sizeof hi);
    memcpy(&lo, &l, sizeof lo);
  } else {
    const __half2 h = __floats2half2_rn(lo_val, hi_val);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(lo_val - hf.x, hi_val - hf.y);
    memcpy(&hi, &h, sizeof hi);
    memcpy(&lo, &l, sizeof lo);
  }
}

/* The same, each matrix transposed. */
static __device__ __forceinline__ void fd_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Two floats -> one register of two 16-bit values (lo in the low half), RN. */
template <typename T>
static __device__ __forceinline__ uint32_t fd_pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, sizeof r);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, sizeof r);
  }
  return r;
}

/* Two 16-bit T values of a register (element 0 in the low half) as floats;
 * the inverse of fd_pack2 for values it rounds exactly. */
template <typename T>
static __device__ __forceinline__ float2 fd_unpack2(uint32_t x) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __nv_bfloat162 h;
    memcpy(&h, &x, sizeof h);
    return __bfloat1622float2(h);
  } else {
    __half2 h;
    memcpy(&h, &x, sizeof h);
    return __half22float2(h);
  }
}

/* An 8x8 16-bit matrix in mma fragment layout (lane: row lane / 4, columns
 * 2 (lane % 4), + 1 in one register), transposed across the warp
 * (movmatrix, sm_75+). */
static __device__ __forceinline__ uint32_t fd_movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/* O += P V accumulators with query rows on the mma's M side (o[n][0..1]: row
 * g, o[n][2..3]: row g + 8) rescaled by the online softmax's factors a0, a1,
 * unless no factor of the warp differs from 1. */
template <int N>
static __device__ __forceinline__ void fd_mma_rescale_rows(float (&o)[N][4], float a0, float a1) {
  if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
    for (int n = 0; n < N; n++) {
      o[n][0] *= a0;
      o[n][1] *= a0;
      o[n][2] *= a1;
      o[n][3] *= a1;
    }
  }
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] tile. */
template <int D>
static __device__ __forceinline__ uint32_t fd_swz(int row, int chunk) {
  return (uint32_t)((row * (D / 8) + (chunk ^ (row & 7))) * 16);
}

/* Byte offset of 16-byte chunk `chunk` (16 fp8 values) of row `row` in a
 * swizzled fp8 [rows][D] tile: chunk ^ (row & 7), or for D = 64 (64-byte
 * rows, two in a 128-byte bank line) chunk ^ ((row >> 1) & 3); either way the
 * 8 rows of an ldmatrix phase hit 8 different bank groups. */
template <int D>
static __device__ __forceinline__ uint32_t fd_swz8(int row, int chunk) {
  const int x = D == 64 ? (row >> 1) & 3 : row & 7;
  return (uint32_t)(row * D + ((chunk ^ x) << 4));
}

#endif /* FD_CUDA_MMA_PRIMITIVES_CUH */
