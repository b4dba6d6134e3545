/*
 * merge_kernel.cu — fd_merge_states on the device: merges S attention states
 * (out_s, lse_s) of every row into out and lse.
 *
 * GRID  min(ceil(rows / 4), 2^24) blocks of 128 threads; one warp per row,
 *   rows = batch * q_len * num_heads in out's order, r = (b * q_len + t) *
 *   num_heads + h, grid-strided (row r, r + 4 * gridDim.x, ...). The row's
 *   lse index is li = (b * num_heads + h) * q_len + t; state s's lse is
 *   states_lse[s * rows + li], its out_s states_out[(s * rows + r) * D].
 *   Lane i holds columns d = VEC * (i + 32 c), c < ceil(D / (32 VEC)):
 *   VEC = 16 bytes of the input dtype (4 or 8) on the vector path, 1 on the
 *   scalar path (unaligned pointers, or D * element size not a multiple of
 *   16 bytes).
 *
 *   Two passes over the states, no per-row array of size S:
 *     1. lanes stride over s: m = max lse_s (warp butterfly) and whether any
 *        lse_s is NaN or +inf (then the whole row is NaN: out and lse);
 *        m = -inf (every state empty): out = 0, lse = -inf;
 *     2. per 32 states, lane i computes w = exp(lse_{s0+i} - m) (0 for an
 *        empty state, never (-inf) - (-inf)); a ballot of the non-empty
 *        states is walked in increasing s, each w broadcast by a shuffle,
 *        FD_MERGE_BATCH states' out_s loads issued before their sums:
 *        L += w_s, acc += w_s out_s, in that order (fp32, every lane the same
 *        L): out = acc / L, lse = m + log(L).
 *   Empty states' out_s are never read. Sums run in state order, so results
 *   are bitwise reproducible.
 *
 * PDL  (code built for sm_90+; see combine_kernel.cu) Launched with
 *   programmatic stream serialisation: it may start while
 *   the kernel before it on the stream (the combine of an fd_run, say) still
 *   runs; griddepcontrol.wait, before any memory access, returns once that
 *   grid has completed and its writes are visible (at once without the
 *   attribute). It triggers its own dependents at once: the library's
 *   kernels launched with PDL wait for it before reading anything.
 */
#include <math.h>
#include <string.h>

#include "device_util.cuh"
#include "flashdecode.h"
#include "merge.cuh"

#define FD_MERGE_THREADS 128
#define FD_MERGE_WARPS (FD_MERGE_THREADS / 32)
#define FD_MERGE_BATCH 8          /* out_s loads in flight per lane */
#define FD_MERGE_MAX_BLOCKS (1 << 24)
#define FD_FULL_MASK 0xffffffffu

/* ---- one element: dtype <-> float ---- */

static __device__ __forceinline__ float fd_to_float(float x) { return x; }
static __device__ __forceinline__ float fd_to_float(__half x) { return __half2float(x); }
static __device__ __forceinline__ float fd_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

static __device__ __forceinline__ void fd_store1(float *dst, float x) { *dst = x; }
static __device__ __forceinline__ void fd_store1(__half *dst, float x) { *dst = __float2half_rn(x); }
static __device__ __forceinline__ void fd_store1(__nv_bfloat16 *dst, float x) {
  *dst = __float2bfloat16_rn(x);
}

template <typename Tin, typename Tout, bool VECTOR>
__global__ void __launch_bounds__(FD_MERGE_THREADS)
    fd_merge_kernel(const __grid_constant__ fd_merge_params p) {
  fd_pdl_wait();
  fd_pdl_launch_dependents();
  constexpr int VEC = VECTOR ? (int)(16 / sizeof(Tin)) : 1;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t rows = p.rows;
  const int S = p.num_states;
  const int D = p.head_dim;
  const int64_t H = p.num_heads, T = p.q_len;
  const int chunks = (D + 32 * VEC - 1) / (32 * VEC);
  const Tin *states = static_cast<const Tin *>(p.states_out);

  /* warp-uniform loop: every lane of a warp has the same row */
  for (int64_t r = (int64_t)blockIdx.x * FD_MERGE_WARPS + warp; r < rows;
       r += (int64_t)gridDim.x * FD_MERGE_WARPS) {
    const int64_t h = r % H, t = (r / H) % T, b = r / (H * T);
    const int64_t li = (b * H + h) * T + t;
    const float *lse_col = p.states_lse + li; /* state s at lse_col[s * rows] */
    Tout *o = static_cast<Tout *>(p.out) + r * D;

    /* Pass 1: the max, and whether any lse_s is NaN or +inf. */
    float m = -INFINITY;
    bool bad = false;
    for (int s = lane; s < S; s += 32) {
      const float x = lse_col[(int64_t)s * rows];
      bad |= !(x < INFINITY);
      m = fmaxf(m, x); /* fmaxf drops a NaN; `bad` keeps it */
    }
    m = fd_warp_max(m);
    bad = __any_sync(FD_FULL_MASK, bad);
    if (bad || m == -INFINITY) { /* warp-uniform */
      const float fill = bad ? __int_as_float(0x7fc00000) : 0.0f;
      for (int d = lane; d < D; d += 32) fd_store1(o + d, fill);
      if (lane == 0 && p.lse) p.lse[li] = bad ? __int_as_float(0x7fc00000) : -INFINITY;
      continue;
    }

    /* Pass 2, per column chunk (the weights are recomputed per chunk: the
     * same operations, so the same L in every chunk and lane). */
    for (int c = 0; c < chunks; c++) {
      const int d0 = (c * 32 + lane) * VEC;
      const bool on = d0 < D;
      float acc[VEC];
#pragma unroll
      for (int v = 0; v < VEC; v++) acc[v] = 0.0f;
      float L = 0.0f;
      for (int s0 = 0; s0 < S; s0 += 32) {
        const float x = s0 + lane < S ? lse_col[(int64_t)(s0 + lane) * rows] : -INFINITY;
        const float w = expf(x - m); /* m finite; x = -inf gives 0 */
        unsigned live = __ballot_sync(FD_FULL_MASK, x != -INFINITY);
        while (live) { /* warp-uniform */
          float wb[FD_MERGE_BATCH];
          bool vb[FD_MERGE_BATCH];
          uint4 raw[FD_MERGE_BATCH]; /* vector path: 16 bytes of Tin */
          Tin one[FD_MERGE_BATCH];   /* scalar path */
#pragma unroll
          for (int j = 0; j < FD_MERGE_BATCH; j++) {
            const int i = __ffs(live) - 1; /* -1 when none is left */
            vb[j] = live != 0;
            live &= live - 1;
            wb[j] = __shfl_sync(FD_FULL_MASK, w, i & 31);
            if (vb[j] && on) {
              const Tin *src = states + ((int64_t)(s0 + i) * rows + r) * D + d0;
              if constexpr (VECTOR)
                raw[j] = *reinterpret_cast<const uint4 *>(src);
              else
                one[j] = *src;
            }
          }
#pragma unroll
          for (int j = 0; j < FD_MERGE_BATCH; j++) {
            if (!vb[j]) continue;
            L += wb[j];
            if (!on) continue;
            float f[VEC];
            if constexpr (VECTOR)
              fd_load16_to_float(reinterpret_cast<const Tin *>(&raw[j]), f);
            else
              f[0] = fd_to_float(one[j]);
#pragma unroll
            for (int v = 0; v < VEC; v++) acc[v] = fmaf(wb[j], f[v], acc[v]);
          }
        }
      }
      /* L >= 1: the state holding the max has w = exp(0) = 1. */
      if (on) {
        if constexpr (VECTOR) {
#pragma unroll
          for (int v = 0; v < VEC; v += 4)
            fd_store4(o + d0 + v, make_float4(acc[v] / L, acc[v + 1] / L, acc[v + 2] / L, acc[v + 3] / L));
        } else {
          fd_store1(o + d0, acc[0] / L);
        }
      }
      if (c == 0 && lane == 0 && p.lse) p.lse[li] = m + logf(L);
    }
  }
}

template <typename Tin, typename Tout, bool VECTOR>
static cudaError_t launch_instance(const fd_merge_params *p, cudaStream_t stream) {
  int64_t blocks = (p->rows + FD_MERGE_WARPS - 1) / FD_MERGE_WARPS;
  if (blocks > FD_MERGE_MAX_BLOCKS) blocks = FD_MERGE_MAX_BLOCKS; /* the kernel grid-strides */
  return fd_launch(fd_merge_kernel<Tin, Tout, VECTOR>, *p, dim3((unsigned)blocks),
                   dim3(FD_MERGE_THREADS), 0, stream, p->pdl);
}

/* The vector path: 16-byte loads of states_out, 4-element stores of out. */
static bool vector_ok(const fd_merge_params *p, size_t in_size, size_t out_size) {
  return (uintptr_t)p->states_out % 16 == 0 && ((size_t)p->head_dim * in_size) % 16 == 0 &&
         (uintptr_t)p->out % (4 * out_size) == 0;
}

template <typename Tin>
static cudaError_t launch_out(const fd_merge_params *p, cudaStream_t stream) {
  switch (p->out_dtype) {
    case FD_DTYPE_F32:
      return vector_ok(p, sizeof(Tin), 4) ? launch_instance<Tin, float, true>(p, stream)
                                          : launch_instance<Tin, float, false>(p, stream);
    case FD_DTYPE_F16:
      return vector_ok(p, sizeof(Tin), 2) ? launch_instance<Tin, __half, true>(p, stream)
                                          : launch_instance<Tin, __half, false>(p, stream);
    case FD_DTYPE_BF16:
      return vector_ok(p, sizeof(Tin), 2) ? launch_instance<Tin, __nv_bfloat16, true>(p, stream)
                                          : launch_instance<Tin, __nv_bfloat16, false>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t fd_merge_launch(const fd_merge_params *p, cudaStream_t stream) {
  if (p->rows < 1) return cudaSuccess;
  switch (p->dtype) {
    case FD_DTYPE_F32: return launch_out<float>(p, stream);
    case FD_DTYPE_F16: return launch_out<__half>(p, stream);
    case FD_DTYPE_BF16: return launch_out<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}
