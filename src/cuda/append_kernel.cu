/*
 * append_kernel.cu — fd_append_kv on CUDA (flashdecode.h): one warp per new
 * (token, kv head) row writes its k and its v into the cache, copied (16-bit
 * or fp32 cache) or quantized with fp8.h's rounding (the host code's, so both
 * write the same bits). Per-token scales: the warp's max of the row's finite
 * |x| (a shuffle reduction), then lane 0 stores the scale.
 *
 * Graph-capturable: no allocation, no synchronisation; kv_len, block_table
 * and the scales are read on the device only. A row whose position is
 * negative or >= kv_capacity, or whose page id is outside [0, num_pages)
 * (negative, or >= num_pages when known), writes nothing.
 *
 * One kernel for every dtype pair: the branches on dtype are uniform across
 * the grid, and the data moved (num_new tokens) is small next to the
 * attention that follows; no template instances to compile.
 *
 * MLA (rope_dim > 0, one kv head): append_mla_kernel, one warp per new
 * token, writes its latent c_kv (head_dim values) and its rope part k_pe
 * (rope_dim values): copied when 16-bit; an fp8 latent quantized with the
 * scale (TOKEN: amax / max_finite over the latent and, when the rope part is
 * fp8 too, over it), an fp8 rope part with the same scale, a 16-bit rope
 * part beside an fp8 latent copied.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "fp8.h"
#include "internal.h"

#define FD_APPEND_WARPS 4 /* rows per block */

typedef struct append_params {
  const void *src[2];        /* k_new, v_new: [batch, n, heads, head_dim] dtype */
  int64_t src_strides[2][3]; /* {batch, token, head} */
  void *cache[2];            /* k_cache, v_cache */
  int64_t cache_strides[2][3];
  float *scale[2];           /* k_scale, v_scale (NULL: none) */
  int64_t scale_strides[3];
  const int32_t *kv_len;
  const int32_t *block_table;
  int64_t block_table_stride;
  int32_t dtype, kv_dtype, kv_scale;
  int32_t batch, num_new, heads, head_dim;
  int32_t page_size, num_pages, kv_capacity;
  /* MLA: the rope part (k_pe_new -> k_pe_cache), rope_dim > 0 */
  const void *pe_src;
  int64_t pe_src_strides[3];
  void *pe_cache;
  int64_t pe_cache_strides[3];
  int32_t rope_dim, rope_dtype;
} append_params;

/* Element i of a row of dtype, widened to float (exact). */
static __device__ __forceinline__ float load_elem(const void *row, int32_t dtype, int i) {
  if (dtype == FD_DTYPE_F32) return static_cast<const float *>(row)[i];
  const unsigned short u = static_cast<const unsigned short *>(row)[i];
  if (dtype == FD_DTYPE_F16) {
    /* cvt.f32.f16 turns every NaN into the canonical 0x7fffffff; keep the
     * sign so a negative NaN quantizes to 0xff as on the host */
    if ((u & 0x7fffu) > 0x7c00u) return __uint_as_float(((uint32_t)(u & 0x8000u) << 16) | 0x7fc00000u);
    return __half2float(__ushort_as_half(u));
  }
  return __uint_as_float((uint32_t)u << 16); /* bf16 */
}

static __global__ void __launch_bounds__(FD_APPEND_WARPS * 32) append_kernel(const append_params p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * FD_APPEND_WARPS + (threadIdx.x >> 5);
  const int64_t rows = (int64_t)p.batch * p.num_new * p.heads;
  if (row >= rows) return; /* whole warps leave together */
  const int32_t hk = (int32_t)(row % p.heads);
  const int32_t i = (int32_t)((row / p.heads) % p.num_new);
  const int32_t b = (int32_t)(row / ((int64_t)p.heads * p.num_new));
  const int32_t len = p.kv_len[b];
  const int64_t pos = (int64_t)len + i;
  if (len < 0 || pos >= p.kv_capacity) return;
  int64_t block = b, at = pos; /* contiguous: sequence b, position pos */
  if (p.page_size > 0) {
    const int32_t page = p.block_table[(int64_t)b * p.block_table_stride + pos / p.page_size];
    if (page < 0 || (p.num_pages > 0 && page >= p.num_pages)) return;
    block = page;
    at = pos % p.page_size;
  }
  const int64_t scale_at =
      p.kv_scale == FD_KV_SCALE_TENSOR ? 0
      : p.kv_scale == FD_KV_SCALE_HEAD ? hk
      : block * p.scale_strides[0] + at * p.scale_strides[1] + (int64_t)hk * p.scale_strides[2];
  const int D = p.head_dim;
  for (int w = 0; w < 2; w++) { /* k, then v */
    const int64_t *ss = p.src_strides[w], *cs = p.cache_strides[w];
    const int64_t src_off = (int64_t)b * ss[0] + (int64_t)i * ss[1] + (int64_t)hk * ss[2];
    const int64_t dst_off = block * cs[0] + at * cs[1] + (int64_t)hk * cs[2];
    if (p.kv_dtype == p.dtype) { /* copy */
      if (p.dtype == FD_DTYPE_F32) {
        const float *s = static_cast<const float *>(p.src[w]) + src_off;
        float *o = static_cast<float *>(p.cache[w]) + dst_off;
        for (int d = lane; d < D; d += 32) o[d] = s[d];
      } else {
        const unsigned short *s = static_cast<const unsigned short *>(p.src[w]) + src_off;
        unsigned short *o = static_cast<unsigned short *>(p.cache[w]) + dst_off;
        for (int d = lane; d < D; d += 32) o[d] = s[d];
      }
      continue;
    }
    const char *src = static_cast<const char *>(p.src[w]) + src_off * (p.dtype == FD_DTYPE_F32 ? 4 : 2);
    float x[8]; /* head_dim <= 256: lane's elements d = lane + 32 k */
#pragma unroll
    for (int k = 0; k < 8; k++) x[k] = lane + 32 * k < D ? load_elem(src, p.dtype, lane + 32 * k) : 0.0f;
    const int e5m2 = p.kv_dtype == FD_DTYPE_E5M2;
    float s = 1.0f;
    if (p.kv_scale == FD_KV_SCALE_TOKEN) {
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; k++) amax = fmaxf(amax, fd_fp8_finite_abs(x[k]));
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      s = fd_fp8_token_scale(amax, e5m2 ? FD_E5M2_MAX : FD_E4M3_MAX);
      if (lane == 0) p.scale[w][scale_at] = s;
    } else if (p.kv_scale != FD_KV_SCALE_NONE) {
      s = p.scale[w][scale_at];
    }
    uint8_t *o = static_cast<uint8_t *>(p.cache[w]) + dst_off;
#pragma unroll
    for (int k = 0; k < 8; k++)
      if (lane + 32 * k < D) o[lane + 32 * k] = fd_fp8_quantize(x[k], s, e5m2);
  }
}

/* MLA: one warp per new (sequence, token) (a latent row of head_dim <= 512
 * values, a rope row of rope_dim <= 64). */
#define FD_APPEND_MLA_LAT 16 /* latent values a lane (512 / 32) */
#define FD_APPEND_MLA_ROPE 2 /* rope values a lane (64 / 32) */
static __global__ void __launch_bounds__(FD_APPEND_WARPS * 32)
    append_mla_kernel(const append_params p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * FD_APPEND_WARPS + (threadIdx.x >> 5);
  if (row >= (int64_t)p.batch * p.num_new) return; /* whole warps leave together */
  const int32_t i = (int32_t)(row % p.num_new);
  const int32_t b = (int32_t)(row / p.num_new);
  const int32_t len = p.kv_len[b];
  const int64_t pos = (int64_t)len + i;
  if (len < 0 || pos >= p.kv_capacity) return;
  int64_t block = b, at = pos;
  if (p.page_size > 0) {
    const int32_t page = p.block_table[(int64_t)b * p.block_table_stride + pos / p.page_size];
    if (page < 0 || (p.num_pages > 0 && page >= p.num_pages)) return;
    block = page;
    at = pos % p.page_size;
  }
  const int D = p.head_dim, R = p.rope_dim;
  const int64_t *ss = p.src_strides[0], *cs = p.cache_strides[0];
  const int64_t src_off = (int64_t)b * ss[0] + (int64_t)i * ss[1];
  const int64_t dst_off = block * cs[0] + at * cs[1];
  const int64_t pe_src_off = (int64_t)b * p.pe_src_strides[0] + (int64_t)i * p.pe_src_strides[1];
  const int64_t pe_dst_off = block * p.pe_cache_strides[0] + at * p.pe_cache_strides[1];
  const bool rope8 = p.rope_dtype == FD_DTYPE_E4M3 || p.rope_dtype == FD_DTYPE_E5M2;
  if (p.kv_dtype == p.dtype) { /* 16-bit: copies */
    const unsigned short *s = static_cast<const unsigned short *>(p.src[0]) + src_off;
    unsigned short *o = static_cast<unsigned short *>(p.cache[0]) + dst_off;
    for (int d = lane; d < D; d += 32) o[d] = s[d];
  }
  if (!rope8) { /* a 16-bit rope part: a copy */
    const unsigned short *s = static_cast<const unsigned short *>(p.pe_src) + pe_src_off;
    unsigned short *o = static_cast<unsigned short *>(p.pe_cache) + pe_dst_off;
    for (int d = lane; d < R; d += 32) o[d] = s[d];
  }
  if (p.kv_dtype == p.dtype) return;
  const char *src = static_cast<const char *>(p.src[0]) + src_off * 2;
  const char *pe = static_cast<const char *>(p.pe_src) + pe_src_off * 2;
  float x[FD_APPEND_MLA_LAT], y[FD_APPEND_MLA_ROPE];
#pragma unroll
  for (int k = 0; k < FD_APPEND_MLA_LAT; k++)
    x[k] = lane + 32 * k < D ? load_elem(src, p.dtype, lane + 32 * k) : 0.0f;
#pragma unroll
  for (int k = 0; k < FD_APPEND_MLA_ROPE; k++)
    y[k] = rope8 && lane + 32 * k < R ? load_elem(pe, p.dtype, lane + 32 * k) : 0.0f;
  const int e5m2 = p.kv_dtype == FD_DTYPE_E5M2;
  float s = 1.0f;
  if (p.kv_scale == FD_KV_SCALE_TOKEN) {
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < FD_APPEND_MLA_LAT; k++) amax = fmaxf(amax, fd_fp8_finite_abs(x[k]));
#pragma unroll
    for (int k = 0; k < FD_APPEND_MLA_ROPE; k++) amax = fmaxf(amax, fd_fp8_finite_abs(y[k]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    s = fd_fp8_token_scale(amax, e5m2 ? FD_E5M2_MAX : FD_E4M3_MAX);
    if (lane == 0) p.scale[0][block * p.scale_strides[0] + at * p.scale_strides[1]] = s;
  } else if (p.kv_scale != FD_KV_SCALE_NONE) {
    s = p.scale[0][0]; /* TENSOR, HEAD: one kv head */
  }
  uint8_t *o = static_cast<uint8_t *>(p.cache[0]) + dst_off;
#pragma unroll
  for (int k = 0; k < FD_APPEND_MLA_LAT; k++)
    if (lane + 32 * k < D) o[lane + 32 * k] = fd_fp8_quantize(x[k], s, e5m2);
  if (rope8) {
    uint8_t *po = static_cast<uint8_t *>(p.pe_cache) + pe_dst_off;
#pragma unroll
    for (int k = 0; k < FD_APPEND_MLA_ROPE; k++)
      if (lane + 32 * k < R) po[lane + 32 * k] = fd_fp8_quantize(y[k], s, e5m2);
  }
}

extern "C" fd_status fd_cuda_append(const fd_plan *plan, const fd_append_tensors *t, int32_t num_new,
                                    void *stream, fd_error *err) {
  const fd_problem *pr = &plan->problem;
  append_params p;
  memset(&p, 0, sizeof p);
  p.src[0] = t->k_new;
  p.src[1] = t->v_new;
  p.cache[0] = t->k_cache;
  p.cache[1] = t->v_cache;
  p.scale[0] = t->k_scale;
  p.scale[1] = t->v_scale;
  for (int i = 0; i < 3; i++) {
    p.src_strides[0][i] = t->k_new_strides[i];
    p.src_strides[1][i] = t->v_new_strides[i];
    p.cache_strides[0][i] = t->k_strides[i];
    p.cache_strides[1][i] = t->v_strides[i];
    p.scale_strides[i] = t->scale_strides[i];
  }
  p.kv_len = t->kv_len;
  p.block_table = pr->page_size > 0 ? t->block_table : NULL;
  p.block_table_stride = t->block_table_stride;
  p.dtype = (int32_t)pr->dtype;
  p.kv_dtype = (int32_t)pr->kv_dtype;
  p.kv_scale = (int32_t)pr->kv_scale;
  p.batch = pr->batch;
  p.num_new = num_new;
  p.heads = pr->num_heads_kv;
  p.head_dim = pr->head_dim;
  p.page_size = pr->page_size;
  p.num_pages = pr->page_size > 0 ? pr->num_pages : 0;
  p.kv_capacity = plan->kv_capacity;
  const int mla = pr->rope_dim > 0;
  if (mla) {
    if (pr->head_dim > 32 * FD_APPEND_MLA_LAT || pr->rope_dim > 32 * FD_APPEND_MLA_ROPE ||
        pr->dtype == FD_DTYPE_F32)
      return fd_fail(err, FD_STATUS_UNSUPPORTED,
                     "head_dim: the CUDA append of an MLA cache takes head_dim <= %d, rope_dim <= "
                     "%d and 16-bit dtype (%d, %d)",
                     32 * FD_APPEND_MLA_LAT, 32 * FD_APPEND_MLA_ROPE, pr->head_dim, pr->rope_dim);
    p.pe_src = t->k_pe_new;
    p.pe_cache = t->k_pe_cache;
    for (int i = 0; i < 3; i++) {
      p.pe_src_strides[i] = t->k_pe_new_strides[i];
      p.pe_cache_strides[i] = t->k_pe_strides[i];
    }
    p.rope_dim = pr->rope_dim;
    p.rope_dtype = (int32_t)(pr->rope_dtype == 0 ? pr->kv_dtype : pr->rope_dtype);
  }

  int prev = 0;
  cudaError_t e = cudaGetDevice(&prev);
  if (e == cudaSuccess && prev != pr->device) e = cudaSetDevice(pr->device);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fd_fail(err, FD_STATUS_BACKEND_ERROR, "device: selecting device %d failed: %s",
                   pr->device, cudaGetErrorString(e));
  }
  const int64_t rows = (int64_t)pr->batch * num_new * (mla ? 1 : pr->num_heads_kv);
  const unsigned blocks = (unsigned)((rows + FD_APPEND_WARPS - 1) / FD_APPEND_WARPS);
  if (mla)
    append_mla_kernel<<<blocks, FD_APPEND_WARPS * 32, 0, (cudaStream_t)stream>>>(p);
  else
    append_kernel<<<blocks, FD_APPEND_WARPS * 32, 0, (cudaStream_t)stream>>>(p);
  e = cudaGetLastError();
  if (prev != pr->device) {
    const cudaError_t r = cudaSetDevice(prev);
    if (e == cudaSuccess) e = r;
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fd_fail(err, FD_STATUS_BACKEND_ERROR, "append kernel launch failed: %s",
                   cudaGetErrorString(e));
  }
  return fd_ok(err);
}
