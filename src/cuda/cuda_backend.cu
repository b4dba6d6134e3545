/*
 * cuda_backend.cu — the CUDA backend's entry points (declared in internal.h):
 * device queries (the facts fd_plan_init decides from: fd_cuda_device_fit;
 * each device's are read once, device_facts), stream-ordered allocation for
 * fd_decode, and fd_cuda_run, which fills one fd_kernel_params and enqueues
 * the kernel the plan chose (fd_plan.kernel: CUDA cores for fp32, the
 * tensor-core split kernel in its 4-warp, 8-warp or lean config, or the rows
 * kernel) and, when the plan splits, the combine kernel (programmatic
 * dependent launch where the code is sm_90+). fd_cuda_run chooses nothing,
 * allocates nothing, never synchronises and never reads kv_len or
 * block_table on the host, so it can be captured in a CUDA graph.
 *
 * Every runtime call that fails is followed by cudaGetLastError() so that the
 * error does not linger for the caller; without a driver or GPU the queries
 * simply report "unavailable".
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include <mutex>

#include <cuda_runtime.h>

#include "gpu_select.h"
#include "internal.h"
#include "kernel_params.cuh"

/* CMake: the targets the kernels were built for (FD_CUDA_ARCHS) and the cap
 * on the shared-memory budget (FD_CUDA_SMEM_LIMIT_KB, 0 = the device's own). */
#ifndef FD_CUDA_ARCHS_STR
#define FD_CUDA_ARCHS_STR "?"
#endif
#ifndef FD_CUDA_SMEM_LIMIT_KB
#define FD_CUDA_SMEM_LIMIT_KB 0
#endif

/* Turns a failed runtime call into FD_STATUS_BACKEND_ERROR (clearing it). */
static fd_status cuda_fail(fd_error *err, const char *what, cudaError_t e) {
  (void)cudaGetLastError();
  return fd_fail(err, FD_STATUS_BACKEND_ERROR, "%s: %s", what, cudaGetErrorString(e));
}

/* ---- Devices: what each can run, read once per device and process ---- */

/* One device's facts, or why it cannot run the backend. */
typedef struct fd_device_facts {
  fd_status status; /* FD_STATUS_OK: usable */
  char why[320];    /* the message when not */
  fd_gpu_budget g;
  void *tma_encode; /* the driver's cuTensorMapEncodeTiled (wgmma devices), or NULL */
} fd_device_facts;

#define FD_CACHED_DEVICES 64
static std::once_flag fd_device_once[FD_CACHED_DEVICES];
static fd_device_facts fd_device_cache[FD_CACHED_DEVICES];

static void device_name(int device, char *name, size_t n) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    snprintf(name, n, "%s", prop.name);
  } else {
    (void)cudaGetLastError();
    snprintf(name, n, "?");
  }
}

/* The runtime says "driver version is insufficient" both when the driver is
 * too old and when there is no NVIDIA driver at all (cudaDriverGetVersion
 * then reports 0), so the two are told apart here. */
extern "C" void fd_cuda_no_device_reason(int code, char *text, size_t size) {
  const cudaError_t e = (cudaError_t)code;
  int driver = 0, runtime = 0;
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  if (!have_driver)
    snprintf(text, size, "no NVIDIA driver found: libcuda is not installed or not loadable");
  else if (e == cudaErrorInsufficientDriver)
    snprintf(text, size, "the NVIDIA driver supports CUDA %d.%d; this build needs CUDA %d.%d or newer",
             driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  else if (e == cudaSuccess || e == cudaErrorNoDevice)
    snprintf(text, size, "the NVIDIA driver sees no CUDA device");
  else
    snprintf(text, size, "the CUDA runtime says: %s", cudaGetErrorString(e));
}

/* Reads device `device`'s compute capability, multiprocessors and
 * shared-memory budget (capped by FD_CUDA_SMEM_LIMIT_KB), and the
 * architecture of the code this build loads on it. */
static void query_device(int device, fd_device_facts *f) {
  memset(f, 0, sizeof *f);
  f->status = FD_STATUS_UNSUPPORTED;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    char reason[200];
    fd_cuda_no_device_reason((int)e, reason, sizeof reason);
    snprintf(f->why, sizeof f->why, "backend: no CUDA device can be used (%s)", reason);
    return;
  }
  if (device < 0 || device >= count) {
    snprintf(f->why, sizeof f->why, "backend: CUDA device %d does not exist (%d visible)", device,
             count);
    return;
  }
  fd_gpu_budget *g = &f->g;
  int v[6] = {0, 0, 0, 0, 0, 0};
  const cudaDeviceAttr attrs[6] = {
      cudaDevAttrComputeCapabilityMajor,         cudaDevAttrComputeCapabilityMinor,
      cudaDevAttrMultiProcessorCount,            cudaDevAttrMaxSharedMemoryPerBlockOptin,
      cudaDevAttrMaxSharedMemoryPerMultiprocessor, cudaDevAttrReservedSharedMemoryPerBlock};
  for (int i = 0; i < 6; i++) {
    e = cudaDeviceGetAttribute(&v[i], attrs[i], device);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      f->status = FD_STATUS_BACKEND_ERROR;
      snprintf(f->why, sizeof f->why, "backend: device %d: attribute query failed: %s", device,
               cudaGetErrorString(e));
      return;
    }
  }
  g->cc_major = v[0];
  g->cc_minor = v[1];
  g->sm_count = v[2];
  g->smem_block = v[3];
  g->smem_sm = v[4];
  g->smem_reserved = v[5];
  char name[256];
  if (g->cc_major < 8) {
    device_name(device, name, sizeof name);
    snprintf(f->why, sizeof f->why,
             "backend: device %d (%s) has compute capability %d.%d; the CUDA backend needs 8.0 "
             "or newer (sm_80: Ampere and later GPUs)",
             device, name, g->cc_major, g->cc_minor);
    return;
  }
  /* The code this build loads on the device (needs it current). */
  int current = 0;
  e = cudaGetDevice(&current);
  if (e == cudaSuccess && current != device) e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = fd_split_mma_code_arch(&g->code_arch);
    if (current != device) (void)cudaSetDevice(current);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    device_name(device, name, sizeof name);
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction)
      snprintf(f->why, sizeof f->why,
               "backend: this build holds no kernels device %d (%s, compute capability %d.%d) "
               "can run (built with FD_CUDA_ARCHS=%s)",
               device, name, g->cc_major, g->cc_minor, FD_CUDA_ARCHS_STR);
    else
      snprintf(f->why, sizeof f->why,
               "backend: device %d (%s, compute capability %d.%d) cannot load the kernels: %s",
               device, name, g->cc_major, g->cc_minor, cudaGetErrorString(e));
    return;
  }
  /* The Hopper MLA kernel: its body exists only in this build's sm_90a code,
   * which a 9.0 device loads (code_arch 90) when FD_CUDA_ARCHS names 90a. */
  g->wgmma = g->cc_major == 9 && g->cc_minor == 0 && g->code_arch >= 90 &&
                 strstr(FD_CUDA_ARCHS_STR, "90a") != nullptr;
  f->tma_encode = nullptr;
  if (g->wgmma) {
    /* the TMA maps' encoder, through the runtime: the library does not link libcuda */
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f->tma_encode, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f->tma_encode = nullptr;
    }
  }
  fd_gpu_budget_limit(g, FD_CUDA_SMEM_LIMIT_KB);
  f->status = FD_STATUS_OK;
}

static void query_cached(int device) { query_device(device, &fd_device_cache[device]); }

/* The facts of `device` (cached for devices 0..63; `tmp` holds others). */
static const fd_device_facts *device_facts(int device, fd_device_facts *tmp) {
  if (device < 0 || device >= FD_CACHED_DEVICES) {
    query_device(device, tmp);
    return tmp;
  }
  std::call_once(fd_device_once[device], query_cached, device);
  return &fd_device_cache[device];
}

extern "C" fd_status fd_cuda_check_device(int device, fd_error *err) {
  fd_device_facts tmp;
  const fd_device_facts *f = device_facts(device, &tmp);
  if (f->status != FD_STATUS_OK) return fd_fail(err, f->status, "%s", f->why);
  return fd_ok(err);
}

extern "C" fd_status fd_cuda_device_budget(int device, fd_gpu_budget *budget, fd_error *err) {
  fd_device_facts tmp;
  const fd_device_facts *f = device_facts(device, &tmp);
  *budget = f->g;
  if (f->status != FD_STATUS_OK) return fd_fail(err, f->status, "%s", f->why);
  return fd_ok(err);
}

extern "C" int fd_cuda_available(int device) {
  return fd_cuda_check_device(device, NULL) == FD_STATUS_OK;
}

extern "C" int fd_cuda_pdl(int device) {
  fd_device_facts tmp;
  const fd_device_facts *f = device_facts(device, &tmp);
  return f->status == FD_STATUS_OK && fd_gpu_pdl_ok(&f->g);
}

/* Blocks of the split kernel dtype runs at head_dim that a multiprocessor
 * of budget g holds: fp32 the CUDA-core kernel, fp16/bf16 the tensor-core
 * kernel in its 4-warp config; the smaller of the budget's count and the
 * occupancy calculator's (registers), the budget's when that query fails.
 * 0 and the shared memory asked for (*smem) when no block fits. */
static int32_t split_blocks(int device, const fd_gpu_budget *g, fd_dtype dtype, int32_t head_dim,
                            size_t *smem) {
  int cfg = FD_MMA_4W;
  if (dtype == FD_DTYPE_F32) {
    *smem = fd_split_smem(head_dim);
  } else {
    cfg = fd_mma_config_4w(g, head_dim);
    *smem = fd_mma_smem_bytes(head_dim, cfg < 0 ? FD_MMA_LEAN : (fd_mma_config)cfg);
    if (*smem == 0) *smem = fd_mma_smem_bytes(head_dim, FD_MMA_4W);
  }
  const int32_t fit = fd_gpu_blocks_fit(g, *smem);
  if (fit < 1 || cfg < 0) return 0;
  int current = 0, n = 0;
  cudaError_t e = cudaGetDevice(&current);
  if (e == cudaSuccess && current != device) e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = dtype == FD_DTYPE_F32 ? fd_split_occupancy(head_dim, &n)
                              : fd_split_mma_occupancy_config((int)dtype, head_dim, cfg, &n);
    if (current != device) (void)cudaSetDevice(current);
  }
  if (e != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    n = fit;
  }
  return n < fit ? n : fit;
}

/* Blocks of a rows kernel (fp16/bf16, head_dim 64 or 128; shared memory
 * smem a block, `occupancy` its occupancy query) a multiprocessor of budget
 * g holds: shared memory and the occupancy calculator; 0 when none fits or
 * the query fails (then it is not run). */
static int32_t rows_kernel_blocks(int device, const fd_gpu_budget *g, fd_dtype dtype,
                                  int32_t head_dim, size_t smem,
                                  cudaError_t (*occupancy)(int, int, int *)) {
  if ((dtype != FD_DTYPE_F16 && dtype != FD_DTYPE_BF16) || (head_dim != 64 && head_dim != 128))
    return 0;
  const int32_t fit = fd_gpu_blocks_fit(g, smem);
  if (fit < 1) return 0;
  int current = 0, n = 0;
  cudaError_t e = cudaGetDevice(&current);
  if (e == cudaSuccess && current != device) e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = occupancy((int)dtype, head_dim, &n);
    if (current != device) (void)cudaSetDevice(current);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n < fit ? n : fit;
}

extern "C" fd_status fd_cuda_device_fit(int device, fd_dtype dtype, int32_t head_dim, int rows,
                                        fd_cuda_fit *fit, fd_error *err) {
  memset(fit, 0, sizeof *fit);
  fd_device_facts tmp;
  const fd_device_facts *f = device_facts(device, &tmp);
  if (f->status != FD_STATUS_OK) return fd_fail(err, f->status, "%s", f->why);
  const fd_gpu_budget *g = &f->g;
  fit->g = *g;
  size_t smem = 0;
  fit->split_blocks = split_blocks(device, g, dtype, head_dim, &smem);
  if (fit->split_blocks < 1)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: %d needs %zu bytes of shared memory a block; device %d (compute "
                   "capability %d.%d) has %d a block and %d a multiprocessor%s",
                   head_dim, smem, device, g->cc_major, g->cc_minor, g->smem_block, g->smem_sm,
                   FD_CUDA_SMEM_LIMIT_KB > 0 ? " (capped by FD_CUDA_SMEM_LIMIT_KB)" : "");
  if (rows) {
    fit->rows_blocks = rows_kernel_blocks(device, g, dtype, head_dim, FD_ROWS_SMEM(head_dim),
                                          fd_rows_mma_occupancy);
    /* the Hopper rows kernel, where the device runs it */
    if (g->wgmma)
      fit->rows_wg_blocks = rows_kernel_blocks(device, g, dtype, head_dim,
                                               FD_ROWS_WG_SMEM(head_dim), fd_rows_wgmma_occupancy);
  }
  return fd_ok(err);
}

extern "C" fd_status fd_cuda_malloc_async(void **ptr, size_t bytes, void *stream, fd_error *err) {
  *ptr = NULL;
  const cudaError_t e = cudaMallocAsync(ptr, bytes, (cudaStream_t)stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *ptr = NULL;
    return fd_fail(err,
                   e == cudaErrorMemoryAllocation ? FD_STATUS_OUT_OF_MEMORY
                                                  : FD_STATUS_BACKEND_ERROR,
                   "workspace: cudaMallocAsync of %zu bytes failed: %s", bytes,
                   cudaGetErrorString(e));
  }
  return fd_ok(err);
}

extern "C" fd_status fd_cuda_free_async(void *ptr, void *stream, fd_error *err) {
  const cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)stream);
  if (e != cudaSuccess) return cuda_fail(err, "workspace: cudaFreeAsync failed", e);
  return fd_ok(err);
}

/* The kernel parameters of one call (t has explicit strides, from api.c). */
static void fill_params(fd_kernel_params *kp, const fd_plan *plan, const fd_tensors *t,
                        void *workspace) {
  const fd_problem *pr = &plan->problem;
  memset(kp, 0, sizeof *kp);
  kp->q = t->q;
  kp->k_cache = t->k_cache;
  kp->v_cache = t->v_cache;
  kp->out = t->out;
  kp->lse = t->lse;
  for (int i = 0; i < 3; i++) {
    kp->q_strides[i] = t->q_strides[i];
    kp->k_strides[i] = t->k_strides[i];
    kp->v_strides[i] = t->v_strides[i];
    kp->out_strides[i] = t->out_strides[i];
    kp->lse_strides[i] = t->lse_strides[i];
  }
  kp->kv_len = t->kv_len;
  kp->block_table = pr->page_size > 0 ? t->block_table : NULL;
  kp->block_table_stride = t->block_table_stride;
  if (plan->num_splits > 1) {
    kp->partial_o = (float *)((char *)workspace + plan->ws_partial_o);
    kp->partial_ml = (float *)((char *)workspace + plan->ws_partial_ml);
  }
  kp->dtype = (int32_t)pr->dtype;
  kp->batch = pr->batch;
  kp->q_len = pr->q_len;
  kp->num_heads_q = pr->num_heads_q;
  kp->num_heads_kv = pr->num_heads_kv;
  kp->group = pr->num_heads_q / pr->num_heads_kv;
  kp->head_dim = pr->head_dim;
  kp->page_size = pr->page_size;
  kp->num_pages = pr->page_size > 0 ? pr->num_pages : 0;
  kp->kv_capacity = plan->kv_capacity;
  kp->chunk_len = plan->chunk_len;
  kp->num_splits = plan->num_splits;
  kp->split_len_fixed = fd_split_len_fixed(pr);
  kp->scale_log2 = plan->softmax_scale * 1.4426950408889634f; /* log2(e) */
  kp->window_left = pr->window_left;
  kp->non_causal = pr->non_causal;
  if (pr->logits_soft_cap > 0.0f) { /* in double: cap * log2(e) overflows float near 2.4e38 */
    kp->cap_in = (float)(1.0 / ((double)pr->logits_soft_cap * 1.4426950408889634));
    kp->cap_out = pr->logits_soft_cap;
  }
  kp->sinks = t->sinks;
  if (pr->tree_mask) {
    kp->tree_mask = t->tree_mask;
    kp->tree_mask_stride = t->tree_mask_stride;
  }
  kp->out_f32 = pr->out_dtype == FD_DTYPE_F32 && pr->dtype != FD_DTYPE_F32;
  kp->kv_dtype = (int32_t)pr->kv_dtype;
  kp->kv_scale = (int32_t)pr->kv_scale;
  kp->k_scale = t->k_scale;
  kp->v_scale = t->v_scale;
  for (int i = 0; i < 3; i++) kp->scale_strides[i] = t->scale_strides[i];
  kp->rope_dim = pr->rope_dim;
  if (pr->rope_dim > 0) {
    kp->rope_dtype = (int32_t)(pr->rope_dtype == 0 ? pr->kv_dtype : pr->rope_dtype);
    kp->q_pe = t->q_pe;
    kp->k_pe_cache = t->k_pe_cache;
    for (int i = 0; i < 3; i++) {
      kp->q_pe_strides[i] = t->q_pe_strides[i];
      kp->k_pe_strides[i] = t->k_pe_strides[i];
    }
  }
}

/* The MLA kernel's row groups on budget g for the plan (0: none fits). */
static int mla_row_groups(const fd_gpu_budget *g, const fd_problem *pr) {
  return fd_mla_row_groups(g, pr->head_dim, (int64_t)pr->num_heads_q * pr->q_len);
}

/* 1 when the base or a stride (elements of `elem` bytes) of an MLA input is
 * not a multiple of 16 bytes. */
static bool mla_misaligned(const void *ptr, const int64_t strides[3], size_t elem) {
  if ((uintptr_t)ptr % 16) return true;
  for (int i = 0; i < 3; i++)
    if (((uint64_t)strides[i] * elem) % 16) return true;
  return false;
}

/* Whether device budget g runs the plan's kernel for its dtype and
 * head_dim: the plan chose it for this device; this guards the launch. */
static bool kernel_runs(const fd_gpu_budget *g, const fd_plan *plan) {
  const fd_problem *pr = &plan->problem;
  const bool mma = pr->dtype == FD_DTYPE_F16 || pr->dtype == FD_DTYPE_BF16;
  switch (plan->kernel) {
    case FD_KERNEL_CUDA_F32: return pr->dtype == FD_DTYPE_F32;
    case FD_KERNEL_CUDA_ROWS:
      return fd_rows_kernel_shape(pr) && fd_gpu_blocks_fit(g, FD_ROWS_SMEM(pr->head_dim)) >= 1;
    case FD_KERNEL_CUDA_ROWS_WGMMA:
      return fd_rows_kernel_shape(pr) &&
             fd_rows_wgmma_ok(g, pr->head_dim,
                              (int64_t)(pr->num_heads_q / pr->num_heads_kv) * pr->q_len);
    case FD_KERNEL_CUDA_MMA_4W:
      return mma && fd_gpu_blocks_fit(g, fd_mma_smem_bytes(pr->head_dim, FD_MMA_4W)) >= 1;
    case FD_KERNEL_CUDA_MMA_LEAN:
      return mma && fd_gpu_blocks_fit(g, fd_mma_smem_bytes(pr->head_dim, FD_MMA_LEAN)) >= 1;
    case FD_KERNEL_CUDA_MMA_WIDE:
      return mma && pr->kv_dtype == pr->dtype && fd_mma_wide_ok(g, pr->head_dim);
    case FD_KERNEL_CUDA_MLA: return mma && pr->rope_dim == 64 && mla_row_groups(g, pr) > 0;
    default: return false;
  }
}

extern "C" fd_status fd_cuda_run(const fd_plan *plan, const fd_tensors *t, void *workspace,
                                 void *stream, fd_error *err) {
  const fd_problem *pr = &plan->problem;
  const bool mla = pr->rope_dim > 0;
  if (mla && (pr->rope_dim != 64 || (pr->head_dim != 512 && pr->head_dim != 448)))
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: MLA on the CUDA backend takes (head_dim, rope_dim) = (512, 64) or "
                   "(448, 64), not (%d, %d)",
                   pr->head_dim, pr->rope_dim);
  if (!mla && pr->head_dim != 64 && pr->head_dim != 80 && pr->head_dim != 96 &&
      pr->head_dim != 128 && pr->head_dim != 256)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "head_dim: %d is not supported by the CUDA backend (64, 80, 96, 128 or 256)",
                   pr->head_dim);
  if (mla) { /* q, k_cache, out, the workspace: api.c */
    const fd_dtype rope = pr->rope_dtype == 0 ? pr->kv_dtype : pr->rope_dtype;
    if (mla_misaligned(t->q_pe, t->q_pe_strides, fd_dtype_size(pr->dtype)))
      return fd_fail(err, FD_STATUS_UNSUPPORTED, "q_pe: CUDA needs 16-byte aligned base and strides");
    if (mla_misaligned(t->k_pe_cache, t->k_pe_strides, fd_dtype_size(rope)))
      return fd_fail(err, FD_STATUS_UNSUPPORTED,
                     "k_pe_cache: CUDA needs 16-byte aligned base and strides");
  }
  if (pr->batch > 65535)
    return fd_fail(err, FD_STATUS_UNSUPPORTED, "batch: %d exceeds the CUDA backend's 65535",
                   pr->batch);
  if (pr->num_heads_kv > 65535)
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "num_heads_kv: %d exceeds the CUDA backend's 65535", pr->num_heads_kv);
  /* An fp8 cache: the tensor-core kernel widens it (fp16/bf16 q only; the
   * plan refuses other pairs, this guards the launch). Alignment: api.c (16
   * bytes: base and strides of k_cache / v_cache in bytes). */
  if (pr->kv_dtype != pr->dtype &&
      ((pr->kv_dtype != FD_DTYPE_E4M3 && pr->kv_dtype != FD_DTYPE_E5M2) ||
       (pr->dtype != FD_DTYPE_F16 && pr->dtype != FD_DTYPE_BF16)))
    return fd_fail(err, FD_STATUS_UNSUPPORTED,
                   "kv_dtype: the CUDA backend reads an fp8 cache (e4m3, e5m2) with fp16 or "
                   "bf16 q only (kv_dtype %d, dtype %d)",
                   (int)pr->kv_dtype, (int)pr->dtype);

  fd_device_facts tmp;
  const fd_device_facts *f = device_facts(pr->device, &tmp);
  if (f->status != FD_STATUS_OK) return fd_fail(err, f->status, "%s", f->why);
  if (!kernel_runs(&f->g, plan))
    return fd_fail(err, FD_STATUS_INVALID_ARGUMENT,
                   "plan: kernel %d does not run %s on device %d (a plan made for another "
                   "device, or changed by hand)",
                   (int)plan->kernel, fd_dtype_name(pr->dtype), pr->device);

  fd_kernel_params kp;
  fill_params(&kp, plan, t, workspace);
  kp.pdl = !fd_gpu_pdl_ok(&f->g) ? FD_PDL_NONE : pr->no_pdl ? FD_PDL_COMBINE : FD_PDL_ALL;

  /* Launch on the plan's device; restore the caller's current device after. */
  int prev = 0;
  cudaError_t e = cudaGetDevice(&prev);
  if (e != cudaSuccess) return cuda_fail(err, "device: cudaGetDevice failed", e);
  if (prev != pr->device) {
    e = cudaSetDevice(pr->device);
    if (e != cudaSuccess) return cuda_fail(err, "device: cudaSetDevice failed", e);
  }

  const cudaStream_t s = (cudaStream_t)stream;
  const char *what = "split kernel launch failed";
  switch (plan->kernel) {
    case FD_KERNEL_CUDA_F32: e = fd_split_launch(&kp, s); break;
    case FD_KERNEL_CUDA_ROWS: e = fd_rows_mma_launch(&kp, s); break;
    case FD_KERNEL_CUDA_ROWS_WGMMA: e = fd_rows_wgmma_launch(&kp, s); break;
    case FD_KERNEL_CUDA_MMA_4W: e = fd_split_mma_launch(&kp, FD_MMA_4W, s); break;
    case FD_KERNEL_CUDA_MMA_WIDE: e = fd_split_mma_launch(&kp, FD_MMA_WIDE, s); break;
    case FD_KERNEL_CUDA_MMA_LEAN: e = fd_split_mma_launch(&kp, FD_MMA_LEAN, s); break;
    case FD_KERNEL_CUDA_MLA:
      if (!fd_mla_wgmma_ok(&f->g, pr->head_dim, pr->dtype, pr->kv_dtype, pr->rope_dtype,
                           (int64_t)pr->num_heads_q * pr->q_len)) {
        e = fd_mla_launch(&kp, mla_row_groups(&f->g, pr), s);
        break;
      }
      /* the seesaw kernel where TMA copies whole tiles; cudaErrorNotSupported:
       * the driver refused the caches' layout */
      e = fd_mla_seesaw_ok(&f->g, kp.page_size, kp.chunk_len, kp.split_len_fixed, plan->split_keys)
              ? fd_mla_seesaw_launch(&kp, f->tma_encode, s)
              : cudaErrorNotSupported;
      if (e == cudaErrorNotSupported) {
        (void)cudaGetLastError();
        e = fd_mla_wgmma_launch(&kp, s);
      }
      break;
    default: e = cudaErrorInvalidConfiguration; break; /* refused above */
  }
  if (e == cudaSuccess && plan->num_splits > 1) {
    what = "combine kernel launch failed";
    e = fd_combine_launch(&kp, s);
  }
  if (e != cudaSuccess) (void)cudaGetLastError();

  if (prev != pr->device) {
    const cudaError_t r = cudaSetDevice(prev);
    if (r != cudaSuccess && e == cudaSuccess) {
      what = "device: restoring the current device failed";
      e = r;
    }
  }
  if (e != cudaSuccess) return cuda_fail(err, what, e);
  return fd_ok(err);
}
