/*
 * device_util.cuh — small device helpers shared by the CUDA kernels:
 * 16-byte loads converted to float, 4-wide stores converted from float,
 * cp.async wrappers and warp reductions. Internal to src/cuda.
 */
#ifndef FD_CUDA_DEVICE_UTIL_CUH
#define FD_CUDA_DEVICE_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

/* ---- 16 bytes of dtype -> float (4 floats or 8 halves/bfloat16s) ---- */

static __device__ __forceinline__ void fd_load16_to_float(const float *src, float *dst) {
  const float4 v = *reinterpret_cast<const float4 *>(src);
  dst[0] = v.x;
  dst[1] = v.y;
  dst[2] = v.z;
  dst[3] = v.w;
}

static __device__ __forceinline__ void fd_load16_to_float(const __half *src, float *dst) {
  const uint4 raw = *reinterpret_cast<const uint4 *>(src);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __half2 h;
    memcpy(&h, &w[i], sizeof h);
    const float2 f = __half22float2(h);
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

static __device__ __forceinline__ void fd_load16_to_float(const __nv_bfloat16 *src, float *dst) {
  const uint4 raw = *reinterpret_cast<const uint4 *>(src);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __nv_bfloat162 h;
    memcpy(&h, &w[i], sizeof h);
    const float2 f = __bfloat1622float2(h);
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

/* ---- 4 floats -> dtype, round to nearest even (dst 8- or 16-byte aligned) ---- */

static __device__ __forceinline__ void fd_store4(float *dst, float4 v) {
  *reinterpret_cast<float4 *>(dst) = v;
}

static __device__ __forceinline__ void fd_store4(__half *dst, float4 v) {
  const __half2 a = __floats2half2_rn(v.x, v.y);
  const __half2 b = __floats2half2_rn(v.z, v.w);
  uint2 raw;
  memcpy(&raw.x, &a, sizeof a);
  memcpy(&raw.y, &b, sizeof b);
  *reinterpret_cast<uint2 *>(dst) = raw;
}

static __device__ __forceinline__ void fd_store4(__nv_bfloat16 *dst, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y);
  const __nv_bfloat162 b = __floats2bfloat162_rn(v.z, v.w);
  uint2 raw;
  memcpy(&raw.x, &a, sizeof a);
  memcpy(&raw.y, &b, sizeof b);
  *reinterpret_cast<uint2 *>(dst) = raw;
}

/* ---- cp.async (global -> shared, 16 bytes, bypassing L1) ---- */

/* Copies 16 bytes from gmem to smem when `fill`, else writes 16 zero bytes and
 * reads nothing (src-size 0); gmem must still be a valid global address. */
static __device__ __forceinline__ void fd_cp_async16(void *smem, const void *gmem, bool fill) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int src_size = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_size)
               : "memory");
}

/* The same for 4 bytes (cp.async.ca: the 4-byte form goes through L1). */
static __device__ __forceinline__ void fd_cp_async4(void *smem, const void *gmem, bool fill) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int src_size = fill ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_size)
               : "memory");
}

static __device__ __forceinline__ void fd_cp_async_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most `pending` of this thread's committed groups are in flight. */
template <int pending>
static __device__ __forceinline__ void fd_cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

/* ---- Programmatic dependent launch (compute capability 9.0+) ---- */

/* griddepcontrol exists from sm_90 on. Code built for older targets (the
 * sm_80 SASS, compute_80 PTX that newer GPUs JIT-compile) leaves both out,
 * and the host then launches without the PDL attribute (gpu_select.h,
 * fd_gpu_pdl_ok), so stream order alone orders the kernels there. */

/* Waits until the grids this one depends on (launched before it, PDL) have
 * completed and their writes are visible; returns at once without PDL. */
static __device__ __forceinline__ void fd_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Lets a dependent grid launched with PDL be scheduled before this one ends. */
static __device__ __forceinline__ void fd_pdl_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* ---- Variants: a row's visible keys, soft-cap, the sink epilogue ---- */

/* fd_row_keys (row_keys.h, shared with the CPU backend and the reference):
 * keys [*lo, *hi) that query token t sees within a split's [begin, end). */
#include "row_keys.h"

/* The soft-cap on a base-2 score s: cap * tanh(x / cap) in natural units,
 * x = s ln 2, back in base 2 (cap_out = cap, cap_in = 1 / (cap log2 e); the
 * product with log2 e comes last, so caps up to FLT_MAX do not overflow). */
static __device__ __forceinline__ float fd_soft_cap(float s, float cap_in, float cap_out) {
  return (cap_out * tanhf(s * cap_in)) * 1.4426950408889634f;
}

/* 2^x by ex2.approx.ftz: one MUFU instead of exp2f's five instructions
 * (exp2f scales around the hardware's flush of subnormal results). Results
 * below 2^-126 are 0: in the tile loop's online softmax such a p or rescale
 * factor is 0 (exp2f gave a subnormal: 0 too in an fp16 P; a bf16 P keeps
 * subnormals, so a value ~2^130 times larger than the rest, weighted below
 * 2^-126, is lost: no real input). -inf -> 0, +inf -> +inf, NaN -> NaN. */
static __device__ __forceinline__ float fd_exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* x = f 2^e with f in [1, 2) (*f), e returned, for a finite x > 0
 * (subnormals included). Other x (0: a masked key's zero-filled scale, whose
 * score is -inf; NaN, inf, negative) give f = x, so a bad scale still shows. */
static __device__ __forceinline__ int fd_frac_exp(float x, float *f) {
  const bool sub = x < 1.17549435e-38f; /* below FLT_MIN */
  const int u = __float_as_int(sub ? x * 18446744073709551616.0f : x); /* times 2^64 */
  *f = x > 0.0f && x <= 3.40282347e+38f ? __int_as_float((u & 0x007fffff) | 0x3f800000) : x;
  return ((u >> 23) & 0xff) - 127 - (sub ? 64 : 0);
}

/* The online softmax's step for one row whose tile max is mx: m becomes the
 * running max, *mu the value the tile's scores subtract (0 while the max
 * is still -inf: no (-inf) - (-inf)); returns the old O and sum's factor. */
static __device__ __forceinline__ float fd_softmax_step(float &m, float mx, float *mu) {
  const float mn = fmaxf(m, mx);
  *mu = mn == -INFINITY ? 0.0f : mn;
  const float a = fd_exp2_ftz(m - *mu);
  m = mn;
  return a;
}

/* The same for the 16-bit kernel: tanh(u) = sign(u) (1 - 2 / (e^(2|u|) + 1))
 * with one exp2 and one approximate division, no branch (tanhf is a longer
 * sequence with a branch: 6.4 % slower at head_dim 256, group 2). Relative error of the tanh ~2e-6 at |u| >= 1/16 (the
 * series below it), so cap * tanh carries ~2e-6 of the score's size: far
 * inside fp16 / bf16 rounding; |u| large: e^(2|u|) = inf, the division
 * gives 0, tanh = +-1; NaN stays NaN (the select keeps it). */
static __device__ __forceinline__ float fd_soft_cap_fast(float s, float cap_in, float cap_out) {
  const float u = s * cap_in;
  const float e = exp2f(fabsf(u) * 2.8853900817779268f); /* e^(2|u|) */
  const float t = copysignf(1.0f - __fdividef(2.0f, e + 1.0f), u);
  /* |u| < 1/16: the series (1 - 2/(e+1) cancels there, and a large cap
   * multiplies the cancellation's 1e-7 absolute error: cap 1e6, 0.1 on a
   * score, measured); relative error of the series < 1e-9 */
  const float u2 = u * u;
  const float ts = u * fmaf(u2, fmaf(u2, 0.13333333333f, -0.33333333333f), 1.0f);
  return (cap_out * (fabsf(u) < 0.0625f ? ts : t)) * 1.4426950408889634f;
}

/* A row's last step from its running max m (natural log units, -inf for no
 * key) and sum l: *scale multiplies the unnormalised O, *lse is the row's
 * log-sum-exp; a NaN m or l (a blow-up) gives NaN for both. With a sink (has_sink) it joins the sum: M = max(m, sink),
 * L = l e^(m - M) + e^(sink - M). A row without keys gets scale 0 and lse =
 * -inf or the sink; a NaN or +inf sink gives NaN. (src/cpu/cpu_kernels.h's
 * fd_cpu_finish_row is the same in double.) */
static __device__ __forceinline__ void fd_finish_row(float m, float l, bool has_sink, float sink,
                                                     float *scale, float *lse) {
  if (isnan(m) || isnan(l)) { /* a blow-up in the row's inputs */
    *scale = __int_as_float(0x7fc00000);
    *lse = __int_as_float(0x7fc00000);
    return;
  }
  if (!has_sink) {
    *scale = l > 0.0f ? 1.0f / l : 0.0f;
    *lse = l > 0.0f ? m + logf(l) : -INFINITY;
    return;
  }
  if (isnan(sink) || sink == INFINITY) {
    *scale = __int_as_float(0x7fc00000);
    *lse = __int_as_float(0x7fc00000);
    return;
  }
  if (!(l > 0.0f)) {
    m = -INFINITY;
    l = 0.0f;
  }
  const float M = fmaxf(m, sink);
  if (M == -INFINITY) {
    *scale = 0.0f;
    *lse = -INFINITY;
    return;
  }
  const float a = m == -INFINITY ? 0.0f : expf(m - M);
  const float L = fmaf(l, a, expf(sink - M));
  *scale = a / L;
  *lse = M + logf(L);
}

/* ---- Launch ---- */

/* Launches `kernel` over `grid` x `block` with `params` (and `more`, its
 * further arguments) by value on `stream`, with programmatic dependent launch
 * when `pdl` (only code that waits in griddepcontrol.wait may get it:
 * gpu_select.h, fd_gpu_pdl_ok). Returns the launch's error. */
template <typename P, typename... More>
static cudaError_t fd_launch(void (*kernel)(P, More...), const P &params, dim3 grid, dim3 block,
                             size_t smem, cudaStream_t stream, int pdl, const More &...more) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  memset(attr, 0, sizeof attr);
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, params, more...);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

/* ---- Warp reductions (butterfly: every lane gets the result, fixed order) ---- */

static __device__ __forceinline__ float fd_warp_max(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}

static __device__ __forceinline__ float fd_warp_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

/* Over the 4 lanes of a quad (the lanes of an mma fragment's row): the sums
 * l0, l1 of two rows and their flags bad0, bad1 (set in any lane). */
static __device__ __forceinline__ void fd_quad_sum_rows(float &l0, float &l1, bool &bad0,
                                                        bool &bad1) {
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    bad0 = __shfl_xor_sync(0xffffffffu, (int)bad0, off) != 0 || bad0;
    bad1 = __shfl_xor_sync(0xffffffffu, (int)bad1, off) != 0 || bad1;
  }
}

#endif /* FD_CUDA_DEVICE_UTIL_CUH */
