/*
 * combine_kernel.cu — merges the split kernel's partial states into out and lse.
 *
 * GRID  ceil(rows / 4) blocks of 128 threads, one warp per partial row
 *   row = (b * num_heads_q + h) * q_len + t. Lane i covers d = 4 * i + 128 * k.
 *   Only splits s < fd_active_splits(kv_len[b], chunk_len, num_splits) are
 *   read (the split kernel never writes the others):
 *     m* = max_s m_s,  w_s = exp(m_s - m*),  l* = sum_s w_s l_s,
 *     out = (sum_s w_s O_s) / l*,  lse = m* + log(l*).
 *   m_s is in natural-log units. A row with m* = -inf (no visible key) gets
 *   out = 0 and lse = -inf; w_s is never computed from (-inf) - (-inf). A
 *   split whose m or l is NaN (the split kernels make l NaN for a blow-up)
 *   makes the row NaN. Sinks join l* in the last step (fd_finish_row).
 *   Sums run in a fixed order (lane-strided, then a butterfly; splits in
 *   order per element), so results are bitwise reproducible.
 *
 *   The partial O loads of FD_COMBINE_BATCH splits are issued before their
 *   sums (one L2 round trip per batch, not per split), the first batch
 *   together with the (m, l) loads.
 *
 * PDL  (code built for sm_90+; older targets compile griddepcontrol out
 *   and are launched without the attribute: gpu_select.h, fd_gpu_pdl_ok)
 *   Launched with programmatic stream serialisation: the grid may start
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
#define FD_COMBINE_ROWS_PER_BLOCK (FD_COMBINE_THREADS / 32)
#define FD_COMBINE_BATCH 16 /* partial O loads in flight per lane */

template <typename T>
__global__ void __launch_bounds__(FD_COMBINE_THREADS)
    fd_combine_kernel(const __grid_constant__ fd_kernel_params p) {
  __shared__ float s_w[FD_COMBINE_ROWS_PER_BLOCK][FD_MAX_SPLITS]; /* w_s per warp's row */
  fd_pdl_launch_dependents();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = (int64_t)p.batch * p.num_heads_q * p.q_len;
  const int64_t row = (int64_t)blockIdx.x * FD_COMBINE_ROWS_PER_BLOCK + warp;
  if (row >= rows) return; /* whole warp; no block barrier below */

  const int t = (int)(row % p.q_len);
  const int h = (int)((row / p.q_len) % p.num_heads_q);
  const int b = (int)(row / ((int64_t)p.q_len * p.num_heads_q));
  const int S = p.num_splits;
  const int D = p.head_dim;

  int kv = p.kv_len[b];
  kv = kv < 0 ? 0 : (kv > p.kv_capacity ? p.kv_capacity : kv);
  const int active =
      fd_seq_active_splits(kv, p.q_len, p.window_left, p.chunk_len, S, p.split_len_fixed);

  /* The partials are the split kernel's: wait for its grid (no-op without PDL). */
  fd_pdl_wait();

  const float *ml = p.partial_ml + row * S * 2;
  const float *po = p.partial_o + row * S * D;
  float *w = s_w[warp];

  /* The first batch of partial O (columns d = 4 lane, the first
   * FD_COMBINE_BATCH splits) is loaded together with (m, l): one L2 round
   * trip before the sums instead of two. */
  float4 x[FD_COMBINE_BATCH];
#pragma unroll
  for (int i = 0; i < FD_COMBINE_BATCH; i++)
    if (lane * 4 < D && i < active)
      x[i] = *reinterpret_cast<const float4 *>(po + (int64_t)i * D + lane * 4);

  float2 ms0 = make_float2(-INFINITY, 0.0f); /* (m, l) of split `lane` (the common case) */
  if (lane < active) ms0 = *reinterpret_cast<const float2 *>(ml + 2 * lane);
  float m = ms0.x;
  bool blown = isnan(ms0.x) || isnan(ms0.y); /* a split's blow-up: the row is NaN */
  for (int s = lane + 32; s < active; s += 32) {
    const float2 ms = *reinterpret_cast<const float2 *>(ml + 2 * s);
    m = fmaxf(m, ms.x);
    blown = blown || isnan(ms.x) || isnan(ms.y);
  }
  m = fd_warp_max(m);
  blown = __any_sync(0xffffffffu, blown);

  float l = 0.0f;
  if (m != -INFINITY) {
    for (int s = lane; s < active; s += 32) {
      const float2 ms = s == lane ? ms0 : *reinterpret_cast<const float2 *>(ml + 2 * s);
      const float ws = expf(ms.x - m); /* m_s = -inf gives 0 */
      w[s] = ws;
      l += ws * ms.y;
    }
  }
  l = fd_warp_sum(l);
  if (blown) l = __int_as_float(0x7fc00000);
  __syncwarp();

  /* the row's last step (the sink joins l when there is one) */
  float inv, lse;
  fd_finish_row(m, l, p.sinks != nullptr, p.sinks ? p.sinks[h] : 0.0f, &inv, &lse);
  T *out = static_cast<T *>(p.out) + (int64_t)b * p.out_strides[0] +
           (int64_t)t * p.out_strides[1] + (int64_t)h * p.out_strides[2];
  for (int d = lane * 4; d < D; d += 128) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (l > 0.0f && inv == inv) {
      for (int s0 = 0; s0 < active; s0 += FD_COMBINE_BATCH) {
        if (s0 != 0 || d != lane * 4) { /* else loaded above */
#pragma unroll
          for (int i = 0; i < FD_COMBINE_BATCH; i++)
            if (s0 + i < active)
              x[i] = *reinterpret_cast<const float4 *>(po + (int64_t)(s0 + i) * D + d);
        }
#pragma unroll
        for (int i = 0; i < FD_COMBINE_BATCH; i++) {
          if (s0 + i < active) { /* splits in order: the same sums as one at a time */
            const float ws = w[s0 + i];
            acc.x = fmaf(ws, x[i].x, acc.x);
            acc.y = fmaf(ws, x[i].y, acc.y);
            acc.z = fmaf(ws, x[i].z, acc.z);
            acc.w = fmaf(ws, x[i].w, acc.w);
          }
        }
      }
    }
    const float4 v = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    fd_store4(out + d, v);
  }
  if (lane == 0 && p.lse)
    p.lse[(int64_t)b * p.lse_strides[0] + (int64_t)h * p.lse_strides[1] +
          (int64_t)t * p.lse_strides[2]] = lse;
}

template <typename T>
static cudaError_t fd_combine_launch_instance(const fd_kernel_params *p, cudaStream_t stream) {
  const int64_t rows = (int64_t)p->batch * p->num_heads_q * p->q_len;
  const int64_t blocks = (rows + FD_COMBINE_ROWS_PER_BLOCK - 1) / FD_COMBINE_ROWS_PER_BLOCK;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return fd_launch(fd_combine_kernel<T>, *p, dim3((unsigned)blocks), dim3(FD_COMBINE_THREADS), 0,
                   stream, p->pdl);
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
