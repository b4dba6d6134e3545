/*
 * combine_kernel.cu — merges the split kernel's partial states into out and lse.
 *
 * GRID  ceil(rows / (4 / WPR)) blocks of 128 threads; a row is merged by WPR
 *   warps of one block (WPR = 1, 2 or 4, chosen at launch: more warps a row
 *   for few rows or many splits), row = (b * num_heads_q + h) * q_len + t.
 *   Lane i covers d = 4 * i + 128 * k; warp sub (0..WPR-1) of a row reads
 *   splits s = sub + WPR j, 16 of them in one L2 round trip (the first batch
 *   together with the row's (m, l)), so up to 16 WPR splits cost one round
 *   trip. Only splits s < fd_seq_active_splits(kv_len[b], ...) (split.h)
 *   are read (the split kernel never writes the others):
 *     m* = max_s m_s,  w_s = exp(m_s - m*),  l* = sum_s w_s l_s,
 *     out = (sum_s w_s O_s) / l*,  lse = m* + log(l*).
 *   m_s is in natural-log units. A row with m* = -inf (no visible key) gets
 *   out = 0 and lse = -inf; w_s is never computed from (-inf) - (-inf). A
 *   split whose m or l is NaN (the split kernels make l NaN for a blow-up)
 *   makes the row NaN. Sinks join l* in the last step (fd_finish_row).
 *   Sums run in a fixed order whatever WPR: l* lane-strided, then a
 *   butterfly; O per element as four classes s % 4, each its splits in
 *   order, then class 0 + 1 + 2 + 3. So results are bitwise reproducible and
 *   do not depend on the batch size (the deterministic mode relies on it).
 *   Shared memory: w_s, 4 x num_splits floats (dynamic), and the classes'
 *   sums when WPR > 1 (2-4 KB).
 *
 * PDL  (code built for sm_90+; older targets compile griddepcontrol out
 *   and are launched without the attribute: gpu_select.h, fd_gpu_pdl_ok)
 *   Launched with programmatic stream serialisation (also for plans with
 *   fd_problem.no_pdl, whose split kernel alone launches plainly: faster
 *   inside a model's stream): the grid may start
 *   while the split kernel before it still runs (once all split blocks have
 *   executed griddepcontrol.launch_dependents or exited). Everything up to
 *   griddepcontrol.wait reads only inputs of the call (kv_len), which were
 *   complete before the split kernel started; the wait returns once the split
 *   grid has completed and its writes are visible. Without the attribute the
 *   wait returns at once, so the kernel is correct either way. The kernel
 *   itself triggers its dependents at once, so a following kernel launched
 *   with PDL (the next call's tensor-core split kernel, which waits for this
 *   grid before reading anything) is staged early.
 */
#include <math.h>
#include <string.h>

#include "flashdecode.h"
#include "kernel_params.cuh"
#include "device_util.cuh"
#include "split.h"

#define FD_COMBINE_THREADS 128
#define FD_COMBINE_WARPS (FD_COMBINE_THREADS / 32)
#define FD_COMBINE_BATCH 16 /* partial O loads in flight a lane */
#define FD_COMBINE_GROUPS 4 /* split classes s % 4, summed apart, then in order */

/* One row's merge, by WPR warps of a block (WPR = 1, 2 or 4; 4 / WPR rows a
 * block): warp sub = warp % WPR of the row sums the splits s = sub + WPR i,
 * FD_COMBINE_BATCH of them a round trip. */
template <typename T, int WPR>
__global__ void __launch_bounds__(FD_COMBINE_THREADS)
    fd_combine_kernel(const __grid_constant__ fd_kernel_params p) {
  constexpr int RPB = FD_COMBINE_WARPS / WPR;   /* rows a block */
  constexpr int G = FD_COMBINE_GROUPS / WPR;    /* split classes a warp sums */
  constexpr int STEP = FD_COMBINE_BATCH * WPR;  /* splits a round trip, per row */
  __shared__ float4 s_o[WPR > 1 ? RPB * FD_COMBINE_GROUPS : 1][32]; /* classes' sums */
  extern __shared__ float s_w[]; /* [FD_COMBINE_WARPS][num_splits]: w_s, a warp's row */
  fd_pdl_launch_dependents();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int sub = warp % WPR;
  const int64_t rows = (int64_t)p.batch * p.num_heads_q * p.q_len;
  const int64_t row = (int64_t)blockIdx.x * RPB + warp / WPR;
  const bool live = row < rows; /* a dead row's warps still meet the barrier (WPR > 1) */
  if (WPR == 1 && !live) return;

  const int t = live ? (int)(row % p.q_len) : 0;
  const int h = live ? (int)((row / p.q_len) % p.num_heads_q) : 0;
  const int b = live ? (int)(row / ((int64_t)p.q_len * p.num_heads_q)) : 0;
  const int S = p.num_splits;
  const int D = p.head_dim;
  int active = 0;
  if (live) {
    const int kv = fd_kv_len(p, b);
    active = fd_seq_active_splits(kv, p.q_len, p.window_left, p.chunk_len, S, p.split_len_fixed);
  }
  const bool has_sink = p.sinks != nullptr;
  const float sink = has_sink && live ? p.sinks[h] : 0.0f;

  /* The partials are the split kernel's: wait for its grid (no-op without PDL). */
  fd_pdl_wait();

  const float *ml = p.partial_ml + (live ? row : 0) * S * 2;
  const float *po = p.partial_o + (live ? row : 0) * S * D;
  float2 ms0 = make_float2(-INFINITY, 0.0f); /* (m, l) of split `lane`, for m* and l* */
  if (lane < active) ms0 = *reinterpret_cast<const float2 *>(ml + 2 * lane);

  float *w = s_w + warp * S; /* w_s of the warp's row */
  float m = -INFINITY, l = 0.0f, inv = 0.0f, lse = -INFINITY;
  bool first = true;
  T *out = static_cast<T *>(p.out) + (int64_t)b * p.out_strides[0] +
           (int64_t)t * p.out_strides[1] + (int64_t)h * p.out_strides[2];
  for (int d0 = 0; d0 < D; d0 += 128) {
    const int d = d0 + lane * 4;
    const bool col = d < D;
    const float *pod = po + (col ? d : 0); /* lanes past head_dim read column 0 */
    float4 acc[G];
#pragma unroll
    for (int g = 0; g < G; g++) acc[g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = sub;; s0 += STEP) {
      /* One round trip for the batch's O (the first batch's together with
       * the row's (m, l) above). */
      float4 x[FD_COMBINE_BATCH];
#pragma unroll
      for (int i = 0; i < FD_COMBINE_BATCH; i++) {
        x[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (s0 + WPR * i < active) /* 32-bit offsets: S <= FD_MAX_SPLITS, D <= 512 */
          x[i] = *reinterpret_cast<const float4 *>(pod + (s0 + WPR * i) * D);
      }
      if (first) { /* m* = max_s m_s, w_s and l* = sum_s w_s l_s, once a row */
        first = false;
        m = ms0.x;
        bool blown = isnan(ms0.x) || isnan(ms0.y); /* a split's blow-up: the row is NaN */
        for (int s = lane + 32; s < active; s += 32) {
          const float2 v = *reinterpret_cast<const float2 *>(ml + 2 * s);
          m = fmaxf(m, v.x);
          blown = blown || isnan(v.x) || isnan(v.y);
        }
        m = fd_warp_max(m);
        blown = __any_sync(0xffffffffu, blown);
        float part = 0.0f;
        if (m != -INFINITY) {
          for (int s = lane; s < active; s += 32) {
            const float2 v = s == lane ? ms0 : *reinterpret_cast<const float2 *>(ml + 2 * s);
            const float ws = expf(v.x - m); /* m_s = -inf gives 0 */
            w[s] = ws;
            part += ws * v.y;
          }
        }
        l = fd_warp_sum(part);
        if (blown) l = __int_as_float(0x7fc00000);
        fd_finish_row(m, l, has_sink, sink, &inv, &lse); /* the sink joins l here */
        __syncwarp();
      }
      if (l > 0.0f && inv == inv) {
#pragma unroll
        for (int i = 0; i < FD_COMBINE_BATCH; i++) {
          /* split s0 + WPR i is of class sub + WPR (i % G): each class's
           * splits in order, whatever WPR; past active nothing is added */
          if (s0 + WPR * i < active) {
            const float ws = w[s0 + WPR * i];
            float4 &a = acc[i % G];
            a.x = fmaf(ws, x[i].x, a.x);
            a.y = fmaf(ws, x[i].y, a.y);
            a.z = fmaf(ws, x[i].z, a.z);
            a.w = fmaf(ws, x[i].w, a.w);
          }
        }
      }
      if (s0 + STEP >= active) break; /* this warp's last batch of the row */
    }
    /* The classes' sums in class order: the same bits for every WPR. */
    float4 c[FD_COMBINE_GROUPS];
    if constexpr (WPR == 1) {
#pragma unroll
      for (int g = 0; g < FD_COMBINE_GROUPS; g++) c[g] = acc[g];
    } else {
      const int r = warp / WPR;
#pragma unroll
      for (int j = 0; j < G; j++) s_o[r * FD_COMBINE_GROUPS + sub + WPR * j][lane] = acc[j];
      __syncthreads();
#pragma unroll
      for (int g = 0; g < FD_COMBINE_GROUPS; g++) c[g] = s_o[r * FD_COMBINE_GROUPS + g][lane];
      if (d0 + 128 < D) __syncthreads(); /* s_o is rewritten for the next columns (uniform) */
    }
    if (live && sub == 0 && col) {
      float4 v;
      v.x = __fmul_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0].x, c[1].x), c[2].x), c[3].x), inv);
      v.y = __fmul_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0].y, c[1].y), c[2].y), c[3].y), inv);
      v.z = __fmul_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0].z, c[1].z), c[2].z), c[3].z), inv);
      v.w = __fmul_rn(__fadd_rn(__fadd_rn(__fadd_rn(c[0].w, c[1].w), c[2].w), c[3].w), inv);
      fd_store4(out + d, v);
    }
  }
  if (live && sub == 0 && lane == 0 && p.lse)
    p.lse[(int64_t)b * p.lse_strides[0] + (int64_t)h * p.lse_strides[1] +
          (int64_t)t * p.lse_strides[2]] = lse;
}

/* Warps a row: one round trip for up to FD_COMBINE_BATCH * WPR splits; few
 * rows (small batches) spread over more SMs. At one sequence, 16 splits run
 * 0.2-0.6 us faster on one warp than on four (no block barrier, no
 * shared-memory sum), 24-64 splits 0.1-1 us faster on four. Results do not
 * depend on it. */
static int fd_combine_wpr(int64_t rows, int num_splits) {
  if (num_splits <= FD_COMBINE_BATCH) return 1; /* one warp: one trip, no block barrier */
  return rows < 1024 || num_splits > 2 * FD_COMBINE_BATCH ? 4 : 2;
}

template <typename T, int WPR>
static cudaError_t fd_combine_launch_wpr(const fd_kernel_params *p, int64_t rows,
                                         cudaStream_t stream) {
  constexpr int RPB = FD_COMBINE_WARPS / WPR;
  const int64_t blocks = (rows + RPB - 1) / RPB;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  /* the split kernels' carveout (all shared memory): the SMs need not
   * reconfigure their L1 / shared memory split between the two kernels */
  const cudaError_t e = cudaFuncSetAttribute(fd_combine_kernel<T, WPR>,
                                             cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  return fd_launch(fd_combine_kernel<T, WPR>, *p, dim3((unsigned)blocks),
                   dim3(FD_COMBINE_THREADS),
                   (size_t)FD_COMBINE_WARPS * (size_t)p->num_splits * sizeof(float), stream,
                   p->pdl != FD_PDL_NONE);
}

template <typename T>
static cudaError_t fd_combine_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  const int64_t rows = (int64_t)p->batch * p->num_heads_q * p->q_len;
  switch (fd_combine_wpr(rows, p->num_splits)) {
    case 1: return fd_combine_launch_wpr<T, 1>(p, rows, stream);
    case 2: return fd_combine_launch_wpr<T, 2>(p, rows, stream);
    default: return fd_combine_launch_wpr<T, 4>(p, rows, stream);
  }
}

cudaError_t fd_combine_launch(const fd_kernel_params *p, cudaStream_t stream) {
  /* templated on the out dtype (the partials are float32) */
  switch (p->out_f32 ? (int)FD_DTYPE_F32 : p->dtype) {
    case FD_DTYPE_F32: return fd_combine_launch_instance<float>(p, stream);
    case FD_DTYPE_F16: return fd_combine_launch_instance<__half>(p, stream);
    case FD_DTYPE_BF16: return fd_combine_launch_instance<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}
