/*
 * kernel_params.cuh — what cuda_backend.cu hands the CUDA kernels: one
 * parameter struct (passed to the kernels by value) and the launchers.
 * Internal to src/cuda; not installed.
 */
#ifndef FD_CUDA_KERNEL_PARAMS_CUH
#define FD_CUDA_KERNEL_PARAMS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* Everything one fd_run needs on the device. Strides are in elements and all
 * explicit (api.c resolved them); pointers are device pointers. */
typedef struct fd_kernel_params {
  const void *q;              /* [batch, q_len, num_heads_q, head_dim] dtype */
  int64_t q_strides[3];       /* {batch, token, head} */
  const void *k_cache;        /* contiguous [batch, kv_capacity, num_heads_kv, head_dim]
                                 or paged [num_pages, page_size, num_heads_kv, head_dim] */
  int64_t k_strides[3];       /* {batch or page, position, head} */
  const void *v_cache;        /* same shape as k_cache */
  int64_t v_strides[3];
  const int32_t *kv_len;      /* [batch] */
  const int32_t *block_table; /* [batch, max_pages_per_seq]; NULL when contiguous */
  int64_t block_table_stride; /* elements between block_table rows */
  void *out;                  /* [batch, q_len, num_heads_q, head_dim] dtype */
  int64_t out_strides[3];     /* {batch, token, head} */
  float *lse;                 /* [batch, num_heads_q, q_len] or NULL */
  int64_t lse_strides[3];     /* {batch, head, token} */
  float *partial_o;           /* [rows][num_splits][head_dim]; NULL when num_splits == 1 */
  float *partial_ml;          /* [rows][num_splits][2] = (m, l); NULL when num_splits == 1 */
  int32_t dtype;              /* fd_dtype */
  int32_t batch;
  int32_t q_len;
  int32_t num_heads_q;
  int32_t num_heads_kv;
  int32_t group;              /* num_heads_q / num_heads_kv */
  int32_t head_dim;           /* 64, 128 or 256 */
  int32_t page_size;          /* 0 = contiguous */
  int32_t num_pages;          /* 0 = unknown: page ids are not checked */
  int32_t kv_capacity;        /* kv_len is clamped to [0, kv_capacity] on the device */
  int32_t chunk_len;          /* plan->chunk_len (split.h) */
  int32_t num_splits;         /* plan->num_splits */
  int32_t split_len_fixed;    /* keys per split in the deterministic mode, else 0 (split.h) */
  float scale_log2;           /* softmax_scale * log2(e): scores in base-2 units */
  /* Variants (flashdecode.h, WHAT IT COMPUTES) */
  int32_t window_left;        /* -1 = no window */
  int32_t non_causal;         /* 1: every row sees keys [0, kv_len) */
  float cap_in, cap_out;      /* soft-cap on base-2 scores s: (cap_out * tanh(s * cap_in))
                                 * log2(e), cap_out = the cap, cap_in = 1 / (cap log2(e));
                                 cap_out = 0: off */
  const float *sinks;         /* [num_heads_q] natural-log units, or NULL */
  const uint64_t *tree_mask;  /* [batch][q_len] draft-key bits (flashdecode.h, TREE
                                 MASKS), tree_mask_stride masks apart; NULL: no tree.
                                 Only the rows kernel takes one */
  int64_t tree_mask_stride;
  int32_t out_f32;            /* out is float32 (fd_problem.out_dtype), else dtype */
  /* fp8 KV cache (flashdecode.h, FP8 KV CACHE). kv_dtype == dtype: a 16-bit
   * or fp32 cache, the fields below unused. Otherwise k_cache / v_cache hold
   * FD_DTYPE_E4M3 or FD_DTYPE_E5M2 bytes (strides in bytes = elements) and
   * dtype is F16 or BF16: widened to fp16 in registers (exact,
   * split_mma_kernel.cuh FP8), fp16 MMA with fp32 accumulation; key j of kv
   * head hk is k_fp8 * k_scale[i] and value j
   * v_fp8 * v_scale[i], i by kv_scale: TENSOR 0, HEAD hk, TOKEN (contiguous)
   * b * scale_strides[0] + j * scale_strides[1] + hk * scale_strides[2], or
   * (paged) page * scale_strides[0] + (j % page_size) * scale_strides[1] +
   * hk * scale_strides[2]. NONE: scale 1, pointers NULL. Scale values are
   * read on the device at run time (graphs replay new values) and are not
   * checked: positions at or past kv_len are never read. */
  int32_t kv_dtype;           /* fd_dtype of k_cache / v_cache */
  int32_t kv_scale;           /* fd_kv_scale */
  const float *k_scale;       /* device; NULL with FD_KV_SCALE_NONE */
  const float *v_scale;
  int64_t scale_strides[3];   /* TOKEN: {batch or page, position, head}, floats */
  /* MLA (rope_dim > 0; flashdecode.h, MULTI-HEAD LATENT ATTENTION): q is
   * q_nope [.., head_dim] and k_cache c_kv, which is also V (v_cache NULL);
   * q_pe [batch, q_len, num_heads_q, rope_dim] dtype and k_pe_cache (laid
   * out like k_cache, rope_dtype elements) give the rope part of the key. */
  const void *q_pe;
  int64_t q_pe_strides[3];
  const void *k_pe_cache;
  int64_t k_pe_strides[3];
  int32_t rope_dim;           /* 0: not MLA */
  int32_t rope_dtype;         /* fd_dtype of k_pe_cache */
  int32_t pdl;                /* host only: which kernels launch with programmatic
                                 dependent launch (the loaded code is sm_90+ and waits:
                                 gpu_select.h, fd_gpu_pdl_ok), FD_PDL_* below */
} fd_kernel_params;

#ifdef __CUDACC__
/* Sequence b's kv_len as every kernel reads it: clamped to [0, kv_capacity]
 * (device memory the host does not check). */
static __device__ __forceinline__ int fd_kv_len(const fd_kernel_params &p, int b) {
  const int kv = __ldg(p.kv_len + b);
  return kv < 0 ? 0 : (kv > p.kv_capacity ? p.kv_capacity : kv);
}
#endif

/* fd_kernel_params.pdl. FD_PDL_ALL: the tensor-core split kernels and the
 * combine (the call's first kernel overlaps the previous one in the stream).
 * FD_PDL_COMBINE (fd_problem.no_pdl): the split kernel plain, the combine
 * with PDL behind it (the call's own kernels only). FD_PDL_NONE: plain
 * launches (code without griddepcontrol). */
#define FD_PDL_NONE 0
#define FD_PDL_ALL 1
#define FD_PDL_COMBINE 2

/* Launch the split kernel (split_kernel.cu) for p->dtype and p->head_dim on
 * `stream`. Returns the launch's error (cudaErrorInvalidValue for a dtype or
 * head_dim without a kernel). */
cudaError_t fd_split_launch(const fd_kernel_params *p, cudaStream_t stream);

/* Launch the tensor-core split kernel (split_mma_kernel.cu) for p->dtype
 * (FD_DTYPE_F16 or FD_DTYPE_BF16 only; p->kv_dtype the same or an fp8 type,
 * which has no FD_MMA_WIDE instance) and p->head_dim on `stream` in
 * configuration `cfg` (gpu_select.h's fd_mma_config; the caller checked that
 * the device runs it): FD_MMA_4W (0) 4-warp blocks, two per SM where they
 * fit; FD_MMA_WIDE (1) 8-warp blocks with deeper stages, one per SM (for
 * grids no larger than the GPU); FD_MMA_LEAN (2) 4-warp blocks of 2 stages
 * (head_dim 80..256, GPUs with 99 KB a block). cudaErrorInvalidValue for a
 * combination without an instance. */
cudaError_t fd_split_mma_launch(const fd_kernel_params *p, int cfg, cudaStream_t stream);

/* Its fp8-cache instances (e4m3: split_mma_fp8.cu, e5m2:
 * split_mma_e5m2.cu), called by fd_split_mma_launch when p->kv_dtype is an
 * fp8 type: FD_MMA_4W or FD_MMA_LEAN. */
cudaError_t fd_split_mma_launch_fp8(const fd_kernel_params *p, int cfg, cudaStream_t stream);
cudaError_t fd_split_mma_launch_e5m2(const fd_kernel_params *p, int cfg, cudaStream_t stream);

/* Launch the rows kernel (rows_mma_kernel.cu: non-causal calls with many
 * query rows a kv head; internal.h, fd_rows_kernel_shape) for p->dtype
 * (fp16 or bf16, the cache the same) and p->head_dim (64 or 128) on
 * `stream`; it writes what the split kernel writes (the combine follows when
 * p->num_splits > 1). cudaErrorInvalidValue for a combination without an
 * instance. Its blocks resident a multiprocessor: fd_rows_mma_occupancy. */
cudaError_t fd_rows_mma_launch(const fd_kernel_params *p, cudaStream_t stream);
cudaError_t fd_rows_mma_occupancy(int dtype, int head_dim, int *blocks_per_sm);
/* The Hopper rows kernel (rows_wgmma_kernel.cu: the same problem, sm_90a
 * wgmma; where gpu_select.h fd_rows_wgmma_ok says so) and its blocks
 * resident a multiprocessor. */
cudaError_t fd_rows_wgmma_launch(const fd_kernel_params *p, cudaStream_t stream);
cudaError_t fd_rows_wgmma_occupancy(int dtype, int head_dim, int *blocks_per_sm);

/* Launch the MLA kernel (mla_kernel.cu) with `row_groups` (1, 2 or 4:
 * gpu_select.h, fd_mla_row_groups) for p->dtype (fp16, bf16), p->head_dim
 * (512, 448), p->kv_dtype (dtype, e4m3, e5m2) and p->rope_dtype (dtype, or
 * kv_dtype when fp8) on `stream`; it writes what the split kernel writes (the
 * combine follows when p->num_splits > 1). cudaErrorInvalidValue for a
 * combination without an instance. */
cudaError_t fd_mla_launch(const fd_kernel_params *p, int row_groups, cudaStream_t stream);
/* The Hopper MLA kernel (mla_wgmma_kernel.cu; where gpu_select.h
 * fd_mla_wgmma_ok says so). */
cudaError_t fd_mla_wgmma_launch(const fd_kernel_params *p, cudaStream_t stream);
/* The Hopper MLA seesaw kernel (mla_seesaw_kernel.cu; where gpu_select.h
 * fd_mla_seesaw_ok says so). tma_encode: the driver's cuTensorMapEncodeTiled.
 * cudaErrorNotSupported, nothing launched: no encoder, or it refused the
 * caches' layout (the caller runs fd_mla_wgmma_launch). */
cudaError_t fd_mla_seesaw_launch(const fd_kernel_params *p, void *tma_encode, cudaStream_t stream);

/* Blocks of the CUDA-core split kernel (fp32) resident per multiprocessor
 * for `head_dim`. */
cudaError_t fd_split_occupancy(int head_dim, int *blocks_per_sm);

/* Blocks of the (4-warp) tensor-core split kernel resident per multiprocessor for
 * `dtype` (fd_dtype, 16-bit) and `head_dim` (for planning and checks), in
 * configuration FD_MMA_4W, or `cfg` (FD_MMA_4W or FD_MMA_LEAN). */
cudaError_t fd_split_mma_occupancy(int dtype, int head_dim, int *blocks_per_sm);
cudaError_t fd_split_mma_occupancy_config(int dtype, int head_dim, int cfg, int *blocks_per_sm);

/* The virtual architecture the current device runs this library's kernels
 * from (cudaFuncAttributes.ptxVersion of one of them: 80 for sm_80 SASS or
 * JIT-compiled compute_80 PTX, 90 for sm_90a; every .cu file is built for
 * the same targets). cudaErrorNoKernelImageForDevice when the build holds no
 * code the device can run. */
cudaError_t fd_split_mma_code_arch(int *arch);

/* Bytes of dynamic shared memory the CUDA-core split kernel (fp32) takes a
 * block at `head_dim` (0 for a head_dim without an instance). */
size_t fd_split_smem(int head_dim);

/* Launch the combine kernel (combine_kernel.cu); only for p->num_splits > 1.
 * It is launched with programmatic dependent launch: it may start while the
 * split kernel before it on `stream` still runs, and waits for that kernel's
 * completion (griddepcontrol.wait) before reading the partials. */
cudaError_t fd_combine_launch(const fd_kernel_params *p, cudaStream_t stream);

#endif /* FD_CUDA_KERNEL_PARAMS_CUH */
