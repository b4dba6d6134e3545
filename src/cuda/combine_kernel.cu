/*
 * combine_kernel.cu — merges the split kernel's partial states into out and lse.
 *
 * The separate combine, used when the split kernel does not merge (built
 * with -DFD_FUSED_COMBINE=0, for A/B runs; by default the last split block of
 * each (sequence, kv head) merges: combine_row.cuh fd_split_tail).
 *
 * GRID  ceil(rows / 4) blocks of 128 threads, one warp per partial row
 *   row = (b * num_heads_q + h) * q_len + t (fd_combine_row, combine_row.cuh:
 *   the merge, its NaN and sink rules). Lane i covers d = 4 * i + 128 * k.
 *   Only splits s < fd_seq_active_splits(...) are read (the split kernel
 *   never writes the others).
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
#include "combine_row.cuh"
#include "split.h"

#define FD_COMBINE_THREADS 128
#define FD_COMBINE_ROWS_PER_BLOCK (FD_COMBINE_THREADS / 32)

template <typename T>
__global__ void __launch_bounds__(FD_COMBINE_THREADS)
    fd_combine_kernel(const __grid_constant__ fd_kernel_params p) {
  __shared__ float s_w[FD_COMBINE_ROWS_PER_BLOCK][FD_MAX_SPLITS]; /* w_s per warp's row */
  fd_pdl_launch_dependents();
  const int warp = threadIdx.x / 32;
  const int64_t rows = (int64_t)p.batch * p.num_heads_q * p.q_len;
  const int64_t row = (int64_t)blockIdx.x * FD_COMBINE_ROWS_PER_BLOCK + warp;
  if (row >= rows) return; /* whole warp; no block barrier below */
  const int b = (int)(row / ((int64_t)p.q_len * p.num_heads_q));
  const int active = fd_combine_active(p, b);
  /* The partials are the split kernel's: wait for its grid (no-op without PDL). */
  fd_pdl_wait();
  fd_combine_row<T>(p, row, active, s_w[warp]);
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
