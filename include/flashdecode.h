/*
 * flashdecode.h — decode-phase attention by flash decoding (split-KV).
 *
 * The one public header of libflashdecode. It compiles as C11 and as C++ and
 * needs no CUDA header: CUDA streams are passed as `void *` (a cudaStream_t,
 * NULL for the legacy default stream).
 *
 * WHAT IT COMPUTES
 *   For every sequence b, query row t (0 <= t < q_len) and query head h, with
 *   g = num_heads_q / num_heads_kv and kv head hk = h / g (MHA, GQA and MQA):
 *   row t sits at position p_t = kv_len[b] - q_len + t and sees the keys j
 *   with lo_t <= j <= p_t, where lo_t = 0, or with a sliding window
 *   (has_window, window_left = W) lo_t = max(0, p_t - W). In non-causal mode
 *   (non_causal = 1) every row sees all keys 0 .. kv_len[b] - 1; with a tree
 *   mask (tree_mask = 1) the prefix and the draft keys its bits name (TREE
 *   MASKS below). Then
 *
 *     x_j   = softmax_scale * dot(q[b,t,h,:], k[b,j,hk,:])
 *     s_j   = x_j,  or  cap * tanh(x_j / cap)  with logits_soft_cap = cap > 0
 *     Z     = sum_j exp(s_j)  (+ exp(sinks[h]) when sinks are given)
 *     lse   = log(Z)                                      (natural log)
 *     out   = sum_j exp(s_j - lse) * v[b,j,hk,:]
 *
 *   With an fp8 cache (fd_problem.kv_dtype FD_DTYPE_E4M3 or FD_DTYPE_E5M2),
 *   k and v above are the dequantized values k_cache * k_scale and
 *   v_cache * v_scale (see FP8 KV CACHE).
 *
 *   A row that sees no key (in particular kv_len[b] == 0) gets out = 0 and
 *   lse = -inf (lse = sinks[h] with sinks), never NaN. A sink is one extra
 *   logit per query head that joins the denominator and carries no value
 *   (gpt-oss). q_len > 1 is the speculative-decoding verify step: the K/V of
 *   the q_len new tokens are already in the cache. Sources: sliding window
 *   (Mistral 7B, Jiang et al. 2023; FlashInfer's window_left), soft-cap
 *   (Gemma 2, Gemma Team 2024), sinks (gpt-oss, OpenAI 2025; "Efficient
 *   Streaming Language Models with Attention Sinks", Xiao et al. 2023).
 *
 * HOW (the algorithm, and its sources)
 *   Flash decoding: "Flash-Decoding for long-context inference" (Dao, Haziza,
 *   Massa, Sizov, 2023); online softmax from FlashAttention-2 (Dao, 2023).
 *   For every (sequence, kv head) the keys are cut into num_splits splits.
 *   Each split runs the online softmax over its slice for every query row of
 *   that kv head's group (so K and V are read from memory once) and writes an
 *   unnormalised fp32 partial output O_s with its running max m_s and sum l_s.
 *   A combine step merges them:
 *       m* = max_s m_s,  l* = sum_s exp(m_s - m*) l_s,
 *       O  = sum_s exp(m_s - m*) O_s / l*,    lse = m* + log(l*).
 *   Empty splits are the neutral element (m = -inf, l = 0, O = 0).
 *
 *   Split boundaries are computed at run time from the kv_len the call
 *   really sees: with C = plan.chunk_len, S = plan.num_splits and
 *   L = kv_len[b], the keys are cut into ceil(L / C) chunks, each split takes
 *   ceil(chunks / S) consecutive chunks, and splits past the last key are
 *   empty. So a plan made for kv_capacity serves every kv_len up to it (CUDA
 *   graphs), and a plan made from the step's real lengths splits them well.
 *   With a sliding window the keys before the first row's window are never
 *   read: the splits cut keys [w0, L) instead, w0 = lo_0 rounded down to a
 *   multiple of C, and the split count is planned for at most
 *   window_left + q_len + C keys, so a windowed call costs what a call over
 *   the window's keys costs whatever kv_len is.
 *
 *   CUDA, many query rows: a kv head's rows (group x q_len) share its K and
 *   V. Decode calls take them 8 at a time in one block, re-reading the
 *   split's K/V (mostly from L2) once per 8 rows. Non-causal calls of 16-bit
 *   caches at head_dim 64 or 128 with 32 or more rows a kv head (a shared
 *   prefix's packed batch) instead run a kernel that puts the rows on the
 *   tensor cores' M side, 64 rows a block sharing each K/V tile (the
 *   FlashAttention-2 orientation); the plan counts its row tiles when it
 *   chooses num_splits. On Hopper (compute capability 9.0, a build with
 *   sm_90a code) calls of more than 64 such rows a kv head run its
 *   warpgroup-mma version, 128 rows a block, whose softmax weights enter
 *   P.V rounded once to q's 16-bit dtype (as in FlashAttention). Same
 *   results within the documented accuracy.
 *
 * FP8 KV CACHE
 *   k_cache and v_cache may hold 8-bit floats (fd_problem.kv_dtype) while q
 *   and out are fp16 or bf16 (fd_problem.dtype). Formats, from the OCP 8-bit
 *   Floating Point Specification (OFP8, rev. 1.0, 2023) and "FP8 Formats for
 *   Deep Learning" (Micikevicius et al., 2022):
 *     E4M3 (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn): sign, 4 exponent
 *       bits (bias 7), 3 mantissa bits. No infinities: S.1111.111 is NaN, so
 *       the largest finite value is 448 (S.1111.110); smallest subnormal 2^-9.
 *     E5M2 (torch.float8_e5m2, ml_dtypes.float8_e5m2): sign, 5 exponent bits
 *       (bias 15), 2 mantissa bits, IEEE-like: S.11111.00 is +-inf,
 *       S.11111.01-11 NaN; largest finite 57344; smallest subnormal 2^-16.
 *   Every value of both formats is exact in fp16 and in bf16.
 *   The attention reads k = k_cache * k_scale and v = v_cache * v_scale, the
 *   scales being float32 values > 0 chosen by fd_problem.kv_scale:
 *     FD_KV_SCALE_NONE    1.0 (k_scale and v_scale must be NULL)
 *     FD_KV_SCALE_TENSOR  k_scale[0], v_scale[0]
 *     FD_KV_SCALE_HEAD    k_scale[hk], v_scale[hk]: [num_heads_kv]
 *     FD_KV_SCALE_TOKEN   one per (position, kv head), laid out like the cache
 *                         without head_dim: contiguous [batch, kv_capacity,
 *                         num_heads_kv], paged [num_pages, page_size,
 *                         num_heads_kv] (fd_tensors.scale_strides)
 *   On CUDA the scales are read from device memory at run time, so a captured
 *   graph sees the values they hold when it replays. The sums are those of a
 *   16-bit cache: the CPU backend widens each key block to float32 with its
 *   scale (k_cache * k_scale rounded once to float32); the CUDA backend widens
 *   K and V to fp16 in registers (exact), multiplies on fp16 tensor cores
 *   with fp32 accumulation (never fp8 MMA) and applies the scales in fp32
 *   (k_scale to the scores, v_scale to the softmax weights or, per tensor or
 *   head, to the output). There a bf16 q enters as fp16 times a power of two
 *   (exact for every element within 2^-28 of the row group's largest |q|)
 *   and the softmax weights as fp16 (11 bits). The float64 reference computes
 *   on the exact dequantized values, so a 16-bit cache's accuracy applies.
 *   fd_append_kv writes new tokens into a cache, quantizing them for fp8.
 *
 * MULTI-HEAD LATENT ATTENTION (MLA)
 *   DeepSeek-V2/V3/R1, Kimi-K2 and GLM-5 decode in the absorbed form
 *   ("DeepSeek-V2", DeepSeek-AI 2024, section 2.1: W_UK folded into q, W_UV
 *   into the output projection): one kv head whose key is the latent c_kv
 *   followed by a rope part k_pe, and whose value is c_kv, the same bytes.
 *   Set fd_problem.rope_dim > 0. Then head_dim is the latent width D (512;
 *   448 in the DeepSeek-V4 style), rope_dim the rope width R (64),
 *   num_heads_kv must be 1, and for every sequence b, row t, head h:
 *
 *     x_j = softmax_scale * ( dot(q[b,t,h,:D], c_kv[b,j,:D])
 *                           + dot(q_pe[b,t,h,:R], k_pe[b,j,:R]) )
 *     out[b,t,h,:D] = sum_j exp(x_j - lse) * c_kv[b,j,:D]
 *
 *   with the keys a row sees, lse, q_len (1..16, causal; up to 64 with a
 *   tree mask, CPU and reference), splits, out_dtype,
 *   deterministic mode and CUDA graphs exactly as in decode. fd_tensors:
 *   q = q_nope [batch, q_len, num_heads_q, D]; q_pe [batch, q_len,
 *   num_heads_q, R]; k_cache = c_kv [batch, kv_capacity, 1, D] or paged
 *   [num_pages, page_size, 1, D]; k_pe_cache the same with R columns, its own
 *   strides (vLLM's and FlashMLA's one 576-wide row per token is two strided
 *   views of one buffer; FlashInfer's and SGLang's caches are two buffers);
 *   v_cache NULL. softmax_scale is required (0 refused; DeepSeek-V3 uses
 *   1/sqrt(192), the head dim before absorption). fp8: kv_dtype is c_kv's
 *   element type; rope_dtype is k_pe's (0 = kv_dtype; or dtype: a 16-bit
 *   rope part beside an fp8 latent, FlashMLA's fp8 layout). k_scale scales
 *   c_kv, and k_pe when it is fp8 (TENSOR or TOKEN; TOKEN scales are [..,
 *   position, 1] as for any cache of one kv head; HEAD, one scale for the one
 *   latent head, is the same as TENSOR); v_scale must be NULL: the
 *   values are c_kv * k_scale. Not combined with a window, soft-cap, sinks
 *   or non_causal. Backends: the reference and CPU take D 1..512, R 1..64;
 *   CUDA takes (D, R) = (512, 64) and (448, 64) with 16-bit q. CPU plans of
 *   MLA need a workspace even with one split (each thread's row buffers).
 *
 * TREE MASKS (speculative decoding)
 *   EAGLE ("EAGLE: Speculative Sampling Requires Rethinking Feature
 *   Uncertainty", Li et al. 2024; EAGLE-2's dynamic trees), Medusa ("Medusa:
 *   Simple LLM Inference Acceleration Framework with Multiple Decoding
 *   Heads", Cai et al. 2024) and SpecInfer ("SpecInfer: Accelerating Large
 *   Language Model Serving with Tree-based Speculative Inference and
 *   Verification", Miao et al. 2024) verify a tree of draft tokens in one
 *   attention call: the q_len draft tokens' K/V are appended to the cache,
 *   and each draft row sees the committed prefix plus its own ancestors.
 *   With fd_problem.tree_mask = 1, q_len may be 1..FD_MAX_Q_LEN_TREE (64)
 *   and for sequence b, with P = kv_len[b] - q_len:
 *     row t sees every prefix key 0 .. P - 1, and draft key j (key P + j,
 *     0 <= j < q_len) exactly when bit j of tree_mask[b][t] is set.
 *   Draft keys with P + j < 0 (kv_len[b] < q_len) do not exist and are not
 *   seen, as for causal rows. A chain (bits 0 .. t set in row t) is the
 *   causal call. The mask is a bit-packed q x q matrix (512 bytes a
 *   sequence at 64 drafts), FlashInfer's packed custom_mask restricted to
 *   the draft keys (the prefix is always fully visible), so no q x kv_len
 *   mask exists anywhere. Bits need not be lower-triangular (any order of
 *   the nodes works), but every row must see itself (bit t of row t set)
 *   and bits q_len .. 63 must be zero: the CPU and reference backends
 *   check both on the host (FD_STATUS_INVALID_ARGUMENT naming
 *   tree_mask[b][t]; nothing written). CUDA reads the mask in device
 *   memory and cannot check it: there bits q_len .. 63 are ignored and a
 *   row without its own bit sees only what its bits name (no key at all:
 *   out 0, lse -inf). The mask is read at run time (a captured call sees
 *   its current contents).
 *   Composes with paged and contiguous caches, GQA/MQA, soft-cap, sinks,
 *   lse (merge_states), out_dtype, forced splits and the deterministic
 *   mode on every backend; fp8 caches and MLA (rope_dim > 0: the same rows
 *   over the latent cache) on the CPU and reference backends. Refused
 *   (FD_STATUS_INVALID_ARGUMENT): non_causal (rows that see everything
 *   need no mask) and a sliding window (a tree row's position is its
 *   depth, not its index; not defined in this version).
 *   Backends: the reference and CPU for every shape; CUDA for fp16 / bf16
 *   q over a cache of the same dtype at head_dim 64 or 128, on GPUs whose
 *   blocks hold the rows kernel's shared memory (57,536 bytes at 64,
 *   114,880 at 128: every sm_80+ GPU at 64; A100, H100, H200, B200 at 128,
 *   not the 99 KB-a-block sm_86 / sm_89 / sm_120). Other CUDA plans with a
 *   tree mask are refused with FD_STATUS_UNSUPPORTED naming the argument:
 *   plan with FD_BACKEND_CPU. Both read each K/V block once for all rows
 *   of a kv head (CUDA: up to 64 rows a block on the tensor cores' M side,
 *   rows_mma_kernel.cu; 128 on Hopper, rows_wgmma_kernel.cu); the mask only sets the scores of hidden draft
 *   keys to -inf (weight zero; a NaN or Inf in a hidden key's V may still
 *   give a NaN row, as with other masked keys, see fd_run).
 *
 * USAGE
 *   fd_problem p = {0};            // zero = defaults everywhere
 *   p.dtype = FD_DTYPE_BF16; p.batch = 1; p.q_len = 1;
 *   p.num_heads_q = 32; p.num_heads_kv = 8; p.head_dim = 128;
 *   p.kv_capacity = 131072;
 *   fd_plan plan; fd_error err;
 *   if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) puts(err.message);
 *   // allocate plan.workspace_size bytes (device memory for CUDA), then per layer:
 *   fd_run(&plan, &tensors, workspace, plan.workspace_size, stream, &err);
 *
 * UNITS AND CONVENTIONS
 *   Shapes are in elements; strides are in elements (not bytes) of the
 *   tensor's own dtype; the head_dim dimension is always unit-stride. A tensor
 *   whose strides are all zero is taken as contiguous in its documented shape.
 *   Otherwise a zero stride on a dimension of extent > 1 is refused
 *   (FD_STATUS_INVALID_ARGUMENT naming the tensor and the stride index): a
 *   zero-initialised fd_tensors with one stride left unset would otherwise
 *   read the first batch / token / head for every index, silently. To
 *   broadcast an input on purpose (one query row for every head, a K/V cache
 *   shared by every sequence), pass FD_STRIDE_BROADCAST for that dimension;
 *   out and lse cannot be broadcast. A zero stride on a dimension of extent
 *   1 is accepted (it is never multiplied by a nonzero index); a paged pool
 *   of unknown size (num_pages 0) counts as more than one page.
 *   Pointers passed to fd_run for the CUDA backend are device pointers
 *   (kv_len and block_table included); for the CPU and reference backends,
 *   host pointers.
 *
 * DETERMINISM
 *   Every backend is run-to-run reproducible: the same plan and inputs give
 *   the same bits. With fd_problem.deterministic = 1 a sequence's out and lse
 *   are also bitwise identical whatever the batch around it, the other
 *   sequences' lengths, kv_capacity (up to FD_DETERMINISTIC_MAX_KEYS keys
 *   read a sequence), kv_len_hint, sm_count, the number of CPU threads, and
 *   CUDA-graph replay versus eager calls (batch-invariant inference, RL
 *   rollouts that must match training). It fixes the split length at
 *   FD_DETERMINISTIC_SPLIT_LEN keys (so num_splits must be 0) and runs one
 *   kernel variant whatever the grid. The cost: short single sequences get
 *   fewer splits (B = 1 at 16k keys: 8 splits instead of ~32); batches that
 *   fill the GPU run as fast (docs/performance.md has the measured cost).
 *   Results differ (different summation orders, all within the documented
 *   accuracy) between backends, between deterministic and default plans,
 *   and on CUDA between GPUs whose shared memory holds different kernels
 *   (the many-rows kernel, HOW below, needs ~115 KB a block at head_dim 128;
 *   Hopper runs its warpgroup version for more than 64 rows a kv head).
 *
 * THREAD SAFETY
 *   The library has no mutable global state. A plan is immutable after
 *   fd_plan_init and may be shared by threads; concurrent fd_run calls are
 *   safe when each has its own workspace and output buffers.
 *
 * CPU THREADS
 *   The CPU backend runs each fd_run on an OpenMP parallel region of up to
 *   plan.num_threads threads (fewer for a small call: about one per 256 KB of
 *   K/V), opened from the calling thread. fd_problem.num_threads = 0 takes
 *   OMP_NUM_THREADS when it is set to a positive integer (its first entry when
 *   it is a list, at most FD_MAX_THREADS), else the cores this process may
 *   run on (its affinity mask: taskset, cgroup CPU sets); the environment is
 *   read in fd_plan_init, so a plan keeps its count. A host that runs its own
 *   threads at the same time (its OpenMP regions, torch's intra-op pool,
 *   several fd_run calls from several threads) should share the cores
 *   between them, e.g. num_threads = cores / callers, or the threads
 *   oversubscribe the cores and every call slows down. libgomp serialises a
 *   parallel region nested inside another one unless nesting is enabled
 *   (OMP_MAX_ACTIVE_LEVELS), so fd_run called from inside the host's own
 *   OpenMP region runs on that one thread. With OMP_WAIT_POLICY unset,
 *   libgomp's idle workers spin for a while after each region, which shows
 *   as CPU time a host's other threads cannot use.
 *
 * CPU INSTRUCTION SETS
 *   The CPU backend runs the widest kernels the processor has: AMX-BF16
 *   (bf16 and fp8 caches' q.K and P.V on tiles, where the OS grants the tile
 *   state), AVX-512 BF16 (vdpbf16ps bf16 scores; chosen on AMD only),
 *   AVX-512 F/BW/VL, AVX2 + FMA + F16C, or portable C. The environment
 *   variable FD_CPU_ISA (auto, scalar, avx2, avx512, avx512_bf16, amx;
 *   unset or empty: auto), read in fd_plan_init, forces a
 *   narrower one (tests and CI run every path the machine has), or
 *   avx512_bf16 on an Intel CPU that has it; the plan
 *   records the choice in plan.cpu_isa. For a CPU plan, fd_plan_init returns
 *   FD_STATUS_INVALID_ARGUMENT for another value, FD_STATUS_UNSUPPORTED for a
 *   set this CPU or build lacks; other backends ignore it.
 *
 * ERRORS
 *   Every function that can fail returns an fd_status and, when `err` is not
 *   NULL, writes a one-line message naming the argument at fault and why.
 *   The library never prints, never exits and never aborts. See fd_plan_init
 *   and fd_run for what each status means there.
 */
#ifndef FLASHDECODE_H
#define FLASHDECODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported functions (the shared library hides everything else). */
#if defined(FD_BUILDING_LIBRARY) && defined(__GNUC__)
#define FD_API __attribute__((visibility("default")))
#else
#define FD_API
#endif

/* ---- Version ------------------------------------------------------------ */

#define FD_VERSION_MAJOR 0
#define FD_VERSION_MINOR 1
#define FD_VERSION_PATCH 0
#define FD_VERSION_STRING "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define FD_VERSION_NUMBER \
  (FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH)

/* The library's version string ("0.1.0"); compare with FD_VERSION_STRING to
 * check that the header and the library match. */
FD_API const char *fd_version(void);
/* The library's FD_VERSION_NUMBER. */
FD_API int fd_version_number(void);

/* sizeof the public struct named `name` ("fd_problem", "fd_plan",
 * "fd_tensors", "fd_error", "fd_merge_problem", "fd_append_tensors") as the
 * library was built, 0 for another name.
 * Lets bindings (ctypes, other languages) check their mirror of the layout. */
FD_API size_t fd_struct_size(const char *name);

/* ---- Status codes ------------------------------------------------------- */

typedef enum fd_status {
  FD_STATUS_OK = 0,                  /* success */
  FD_STATUS_INVALID_ARGUMENT = 1,    /* an argument is wrong (NULL, bad shape, out of range) */
  FD_STATUS_UNSUPPORTED = 2,         /* valid, but not supported by this backend or build */
  FD_STATUS_WORKSPACE_TOO_SMALL = 3, /* workspace_size < plan.workspace_size */
  FD_STATUS_OUT_OF_MEMORY = 4,       /* an allocation failed (only fd_decode allocates) */
  FD_STATUS_BACKEND_ERROR = 5        /* the CUDA runtime or the thread runtime failed */
} fd_status;

/* The status's name, e.g. "FD_STATUS_UNSUPPORTED"; "FD_STATUS_UNKNOWN" for a
 * value that is not an fd_status. Never NULL. */
FD_API const char *fd_status_name(fd_status status);

/* Message buffer that failing calls fill (always NUL-terminated). */
typedef struct fd_error {
  fd_status status;
  char message[256];
} fd_error;

/* ---- Data types and backends -------------------------------------------- */

/* q, k_cache and v_cache share one dtype unless fd_problem.kv_dtype names an
 * fp8 cache; out has the dtype too unless fd_problem.out_dtype asks for
 * float32. lse, sinks and fp8 scales are always float32. Zero is "not set"
 * and is rejected. */
typedef enum fd_dtype {
  FD_DTYPE_F32 = 1,  /* IEEE binary32 */
  FD_DTYPE_F16 = 2,  /* IEEE binary16 */
  FD_DTYPE_BF16 = 3, /* bfloat16 (the top 16 bits of a binary32) */
  FD_DTYPE_E4M3 = 4, /* float8 e4m3fn (FP8 KV CACHE above); kv_dtype only */
  FD_DTYPE_E5M2 = 5  /* float8 e5m2 (FP8 KV CACHE above); kv_dtype only */
} fd_dtype;

/* Size in bytes of one element of `dtype` (1 for the fp8 types), 0 for an
 * invalid value. */
FD_API size_t fd_dtype_size(fd_dtype dtype);

typedef enum fd_backend {
  FD_BACKEND_AUTO = 0,      /* CUDA when built with it and a GPU is present, else CPU */
  FD_BACKEND_CPU = 1,       /* threaded SIMD CPU code; host pointers */
  FD_BACKEND_CUDA = 2,      /* CUDA kernels, GPUs of compute capability 8.0+; device pointers */
  FD_BACKEND_REFERENCE = 3  /* plain float64 accumulation, one thread; the test oracle */
} fd_backend;

/* The backend's name ("auto", "cpu", "cuda", "reference"), or "unknown". */
FD_API const char *fd_backend_name(fd_backend backend);

/* 1 when `backend` can run here: always for CPU and REFERENCE; for CUDA, when
 * the library was built with CUDA and device 0 has compute capability 8.0 or
 * newer (Ampere: A100, A10, RTX 30xx; Ada: L4, L40S, RTX 40xx; Hopper; and
 * newer GPUs through the build's PTX) with code for it in this build. 0
 * otherwise. AUTO: 1. */
FD_API int fd_backend_available(fd_backend backend);

/* Which fp8 scales fd_tensors.k_scale / v_scale hold (FP8 KV CACHE above). */
typedef enum fd_kv_scale {
  FD_KV_SCALE_NONE = 0,   /* no scales: 1.0 */
  FD_KV_SCALE_TENSOR = 1, /* one float per tensor: [1] */
  FD_KV_SCALE_HEAD = 2,   /* one per kv head: [num_heads_kv] */
  FD_KV_SCALE_TOKEN = 3   /* one per (position, kv head): the cache's shape without head_dim */
} fd_kv_scale;

/* ---- Problem and plan ----------------------------------------------------- */

/* The kernel a plan runs (fd_plan.kernel): chosen by fd_plan_init from the
 * problem, the backend and the device, and recorded for inspection only;
 * fd_run runs it. Informational and read-only: a plan whose kernel was
 * changed by hand is refused or runs wrongly. */
typedef enum fd_kernel {
  FD_KERNEL_NONE = 0,       /* not a plan made by fd_plan_init */
  FD_KERNEL_CPU = 1,        /* the CPU backend's SIMD kernels */
  FD_KERNEL_REFERENCE = 2,  /* the float64 reference */
  FD_KERNEL_CUDA_F32 = 3,   /* CUDA: fp32 q and cache on the CUDA cores */
  FD_KERNEL_CUDA_MMA_4W = 4,   /* CUDA tensor cores (fp16, bf16 q): 4 warps a block */
  FD_KERNEL_CUDA_MMA_WIDE = 5, /* 8 warps, one block an SM (16-bit caches on GPUs
                                  with 227 KB of shared memory a block, grids no
                                  larger than the GPU) */
  FD_KERNEL_CUDA_MMA_LEAN = 6, /* 4 warps, 2 stages (GPUs with 99 KB a block) */
  FD_KERNEL_CUDA_ROWS = 7,  /* tensor cores, rows as the mma's M side: non-causal
                               calls with many query rows a kv head */
  FD_KERNEL_CUDA_MLA = 8,   /* CUDA: multi-head latent attention (rope_dim > 0) */
  FD_KERNEL_CUDA_ROWS_WGMMA = 9 /* ROWS on Hopper (compute capability 9.0, sm_90a
                                   code) with warpgroup mma: more than 64 query
                                   rows a kv head (trees of 16+ nodes at GQA) */
} fd_kernel;

/* The shapes a plan is made for. Zero-initialise, then set the fields; every
 * field left zero takes the default stated beside it. */
typedef struct fd_problem {
  fd_backend backend;    /* default FD_BACKEND_AUTO */
  fd_dtype dtype;        /* required */
  int32_t batch;         /* sequences, >= 1 */
  int32_t q_len;         /* query rows per sequence, 1..16 (default 1);
                            non_causal: 1..FD_MAX_Q_LEN_NON_CAUSAL;
                            tree_mask: 1..FD_MAX_Q_LEN_TREE */
  int32_t num_heads_q;   /* query heads, >= 1 */
  int32_t num_heads_kv;  /* kv heads, >= 1, divides num_heads_q */
  int32_t head_dim;      /* CPU/reference: 1..256 (MLA: 1..512); CUDA: 64, 80,
                            96, 128 or 256 (MLA: 512 or 448) */
  int32_t kv_capacity;   /* the largest kv_len any run may see. Contiguous
                            caches: the cache's second dimension, >= 1
                            (required: 0 is refused). Paged caches: 0 means
                            max_pages_per_seq * page_size, else at most that. */
  int32_t page_size;     /* 0 = contiguous cache; 1..256 = paged cache */
  int32_t max_pages_per_seq; /* paged: columns of block_table, >= 1 */
  int32_t num_pages;     /* paged: pages in the pool; block_table ids must be
                            in [0, num_pages). 0 = unknown (not checked) */
  int32_t num_splits;    /* 0 = automatic; 1 = no split (one block per
                            (sequence, kv head)); N = N splits, clamped to the
                            chunks of kv_capacity and to FD_MAX_SPLITS.
                            CUDA with fp16/bf16 q raises it (automatic or
                            given) so that no split of the longest expected
                            sequence (kv_capacity, or kv_len_hint when
                            given) holds more than 131072 keys (see fd_run,
                            accuracy of long sums); plan.num_splits is the
                            count used */
  float softmax_scale;   /* default (+0.0) 1/sqrt(head_dim); must be finite;
                            -0.0 is refused (not taken for the default) */
  int32_t num_threads;   /* CPU: worker threads, at most FD_MAX_THREADS;
                            0 = OMP_NUM_THREADS when set, else the cores this
                            process may use (see CPU THREADS above) */
  int32_t device;        /* CUDA: device ordinal, default 0 */
  int32_t sm_count;      /* CUDA: multiprocessors to plan for; 0 = ask the
                            device (tests set it to simulate other GPUs) */
  const int32_t *kv_len_hint; /* optional host array [batch]: the kv_len the
                            next runs will see. The automatic split count is
                            then sized from these lengths instead of
                            kv_capacity, and a ragged batch (longest > 1.5x
                            the mean) gets enough splits that each split of
                            the longest sequence holds about half an even
                            share of the keys (whole 64-key chunks), but no
                            more than that sequence would get alone; runs stay
                            correct for any kv_len up to kv_capacity. Read
                            only inside fd_plan_init. */
  /* ---- Attention variants (zero = off) ---- */
  int32_t has_window;    /* 1: sliding window of window_left keys (below); 0 = none */
  int32_t window_left;   /* with has_window (checked >= -1 always): a row at position p sees keys
                            p - window_left .. p; >= 0, or -1 = no window
                            (FlashInfer's window_left; flash-attn's
                            window_size = (window_left, 0); a model's
                            "sliding_window" of W keys is window_left = W - 1) */
  float logits_soft_cap; /* 0 = off; else finite and >= FLT_MIN (1.18e-38;
                            1 / cap must be a float): scores become
                            cap * tanh(score / cap) (Gemma 2, Grok) */
  int32_t non_causal;    /* 1: every query row sees all kv_len keys (the shared
                            prefix of cascade decoding, rows of several
                            sequences packed as q_len rows); q_len up to
                            FD_MAX_Q_LEN_NON_CAUSAL; no window. 0 = causal */
  fd_dtype out_dtype;    /* 0 = dtype; FD_DTYPE_F32 for any dtype (states merged
                            later lose nothing to 16-bit rounding) */
  int32_t deterministic; /* 1: batch-invariant results (DETERMINISM below);
                            0 = off (fastest) */
  /* ---- fp8 KV cache (zero = the cache has dtype) ---- */
  fd_dtype kv_dtype;     /* element type of k_cache and v_cache: 0 = dtype;
                            FD_DTYPE_E4M3 or FD_DTYPE_E5M2 with dtype
                            FD_DTYPE_F16 or FD_DTYPE_BF16 */
  fd_kv_scale kv_scale;  /* which scales fd_tensors.k_scale / v_scale hold;
                            only with an fp8 kv_dtype. 0 = none (1.0) */
  /* ---- Launch (zero = default) ---- */
  int32_t no_pdl;        /* CUDA, compute capability 9.0+: 0 = the kernels are
                            launched with programmatic dependent launch (PDL:
                            a call's first kernel is scheduled while the
                            previous kernel in the stream ends; faster back to
                            back, ~0.3 us a call on an H200); 1 = the call's
                            first kernel is launched plainly, after the
                            previous kernel has ended; its combine kernel
                            (when the call splits) still starts early behind
                            it. Inside a model, between PyTorch's and cuBLAS's
                            kernels, 1 measured up to 0.7 % faster a decode
                            step on an H200, most at batch 1.
                            Same results either way. */
  /* ---- Multi-head latent attention (zero = off; MLA above) ---- */
  int32_t rope_dim;      /* 0 = standard attention; > 0: MLA with a rope part
                            of rope_dim columns (64 in DeepSeek-V3); head_dim
                            is then the latent width (512) */
  fd_dtype rope_dtype;   /* MLA: element type of k_pe_cache: 0 = kv_dtype;
                            else dtype (a 16-bit rope part beside an fp8
                            latent) */
  /* ---- Speculative-decoding trees (zero = off; TREE MASKS above) ---- */
  int32_t tree_mask;     /* 1: the q_len draft rows of a sequence see the
                            committed prefix and the draft keys that
                            fd_tensors.tree_mask gives them; q_len up to
                            FD_MAX_Q_LEN_TREE. CUDA: fp16 / bf16, head_dim
                            64 or 128 (TREE MASKS). 0 = causal rows */
} fd_problem;

/* The deterministic mode's split length, and the most keys (after a
 * window) it serves: FD_MAX_SPLITS splits. */
#define FD_DETERMINISTIC_SPLIT_LEN 2048
#define FD_DETERMINISTIC_MAX_KEYS (FD_DETERMINISTIC_SPLIT_LEN * 1024)

/* Most query rows per sequence: causal, non-causal. */
#define FD_MAX_Q_LEN 16
#define FD_MAX_Q_LEN_NON_CAUSAL 128
/* Most query rows per sequence with a tree mask (one uint64 a row). */
#define FD_MAX_Q_LEN_TREE 64

/* A stride value (fd_tensors) that broadcasts an input tensor along that
 * dimension: every index reads index 0's elements. Only for q, k_cache,
 * v_cache, q_pe and k_pe_cache (and tree_mask_stride); a literal 0 is refused unless all three strides are 0 (contiguous)
 * or the dimension has extent 1 (see UNITS AND CONVENTIONS). */
#define FD_STRIDE_BROADCAST INT64_MIN

/* Most splits a plan will use. */
#define FD_MAX_SPLITS 1024
/* Most CPU worker threads a plan accepts. */
#define FD_MAX_THREADS 1024

/* A plan: everything fd_run needs besides the tensors. Plain data: copy it,
 * keep it on the stack; no destroy function. Fields are read-only for the
 * caller; those marked (internal) may change between versions. */
typedef struct fd_plan {
  fd_problem problem;     /* copy, with defaults resolved (kv_len_hint = NULL,
                             kv_dtype and out_dtype set; window_left -1 and
                             has_window 0 unless a window applies) */
  fd_backend backend;     /* resolved backend (never AUTO) */
  float softmax_scale;    /* resolved scale */
  int32_t kv_capacity;    /* resolved capacity */
  int32_t num_splits;     /* splits per (sequence, kv head) */
  int32_t chunk_len;      /* split boundaries are multiples of this many keys */
  int32_t sm_count;       /* CUDA: multiprocessors planned for; CPU: threads */
  int32_t num_threads;    /* CPU: worker threads */
  fd_kernel kernel;       /* the kernel fd_run runs (informational, read-only) */
  size_t workspace_size;  /* bytes fd_run needs (0 when num_splits == 1 may
                             need none); device memory for CUDA */
  uint32_t magic;         /* (internal) set by fd_plan_init */
  int32_t split_keys;     /* (internal) keys a split of the longest sequence
                             holds as planned (kv_len_hint, else kv_capacity);
                             the plan chose `kernel` with it. Runs still split
                             the actual kv_len (any kernel is exact) */
  /* (internal) workspace layout, byte offsets */
  size_t ws_partial_o;    /* float [batch*num_heads_q*q_len][num_splits][head_dim] */
  size_t ws_partial_ml;   /* float [batch*num_heads_q*q_len][num_splits][2] (m, l) */
  size_t ws_counters;     /* uint32 [batch*num_heads_kv] */
  int32_t cpu_isa;        /* CPU: the instruction set fd_run runs (0 portable C, 1 AVX2,
                             2 AVX-512, 3 AVX-512 BF16, 4 AMX; see CPU INSTRUCTION SETS);
                             informational, read-only */
} fd_plan;

/*
 * Make a plan for `problem`. Chooses the kernel (recorded in plan->kernel)
 * and the split count, and computes the workspace size; for CUDA, queries
 * the device's multiprocessor count (unless sm_count is set) and what its
 * shared memory holds, but allocates nothing and launches nothing.
 *
 * Returns FD_STATUS_OK, or:
 *   FD_STATUS_INVALID_ARGUMENT  plan/problem NULL; dtype unset; batch < 1;
 *       q_len outside 0..16 (0 means 1; 0..64 with tree_mask); heads < 1 or num_heads_q not a multiple of
 *       num_heads_kv; head_dim outside 1..256; kv_capacity < 0, 0 for a
 *       contiguous cache, or above the paged capacity; page_size outside
 *       0..256; max_pages_per_seq < 1 when paged; num_pages < 0; num_splits
 *       < 0; softmax_scale not finite, or -0.0;
 *       num_threads outside 0..FD_MAX_THREADS; device or sm_count < 0; backend
 *       not an fd_backend; a kv_len_hint value < 0 or > kv_capacity; a shape
 *       whose workspace would exceed 2^52 bytes; has_window not 0 or 1;
 *       window_left < -1; logits_soft_cap negative, not finite, or above 0
 *       and below FLT_MIN; non_causal
 *       not 0 or 1, or with a window; q_len above FD_MAX_Q_LEN_NON_CAUSAL in
 *       non-causal mode; out_dtype not 0 or an fd_dtype, or a 16-bit
 *       out_dtype other than dtype; deterministic not 0 or 1, with num_splits
 *       set, or with a kv_capacity (windowed: window_left + q_len + 63)
 *       above FD_DETERMINISTIC_MAX_KEYS; dtype or out_dtype an fp8 type
 *       (they are cache types: set kv_dtype); kv_dtype not 0, dtype,
 *       FD_DTYPE_E4M3 or FD_DTYPE_E5M2, or fp8 with a dtype other than fp16
 *       or bf16; kv_scale not an fd_kv_scale, or set without an fp8
 *       kv_dtype; no_pdl not 0 or 1; rope_dim outside 0..64; rope_dtype set
 *       with rope_dim 0; tree_mask not 0 or 1, or set with non_causal or a
 *       window; q_len above FD_MAX_Q_LEN_TREE with tree_mask. With rope_dim > 0 (MLA): head_dim outside 1..512,
 *       num_heads_kv not 1, softmax_scale 0 (MLA has no default), a window
 *       (has_window with window_left >= 0), logits_soft_cap or non_causal
 *       set, rope_dtype not 0, dtype or kv_dtype.
 *   FD_STATUS_UNSUPPORTED  the backend is not built in or has no device; CUDA
 *       with head_dim not 64, 80, 96, 128 or 256 (MLA: (head_dim, rope_dim)
 *       not (512, 64) or (448, 64), or dtype not fp16 / bf16), tree_mask set
 *       with MLA, a dtype other than fp16 / bf16, an fp8 cache, a head_dim
 *       other than 64 or 128 or a device that does not hold the kernel
 *       (TREE MASKS; the message names the argument), a device below compute
 *       capability 8.0 (the message names its compute capability), one this
 *       build holds no code for, or one whose shared memory holds no kernel
 *       configuration for the head_dim (never for a real GPU of 8.0+).
 *   FD_STATUS_BACKEND_ERROR  a CUDA query failed.
 */
FD_API fd_status fd_plan_init(fd_plan *plan, const fd_problem *problem, fd_error *err);

/* ---- Tensors -------------------------------------------------------------- */

/*
 * The tensors of one call. Strides are in elements; the last (head_dim)
 * dimension is unit-stride. All-zero strides mean contiguous; otherwise a
 * zero stride needs a dimension of extent 1, and FD_STRIDE_BROADCAST
 * broadcasts an input along a dimension (UNITS AND CONVENTIONS).
 *
 *   q        [batch, q_len, num_heads_q, head_dim]      dtype   strides {batch, token, head}
 *   k_cache, v_cache, contiguous (page_size == 0):
 *            [batch, kv_capacity, num_heads_kv, head_dim] kv_dtype strides {batch, position, head}
 *            (a [batch, num_heads_kv, kv_capacity, head_dim] buffer works
 *            too: pass its strides in this order)
 *   k_cache, v_cache, paged (page_size > 0):
 *            [num_pages, page_size, num_heads_kv, head_dim] kv_dtype strides {page, position, head}
 *   block_table [batch, max_pages_per_seq] int32, row stride block_table_stride
 *            (0 = max_pages_per_seq); key j of sequence b lives in page
 *            block_table[b][j / page_size] at position j % page_size. Paged only.
 *            With a sliding window, the entries of pages wholly before the
 *            first row's window (rounded down to 64 keys) are neither read
 *            nor checked: a server may have freed those pages.
 *   kv_len   [batch] int32, 0 <= kv_len[b] <= kv_capacity (cache_seqlens)
 *   out      [batch, q_len, num_heads_q, head_dim]      out_dtype strides {batch, token, head}
 *   sinks    [num_heads_q] float32, optional (NULL), contiguous
 *   lse      [batch, num_heads_q, q_len] float32, natural log, optional (NULL)
 *                                                         strides {batch, head, token}
 *   k_scale, v_scale  float32, by fd_problem.kv_scale (FP8 KV CACHE):
 *            NONE: NULL; TENSOR: [1]; HEAD: [num_heads_kv] (contiguous);
 *            TOKEN: contiguous cache [batch, kv_capacity, num_heads_kv],
 *            paged [num_pages, page_size, num_heads_kv], both with
 *            scale_strides {batch or page, position, head} (all zero =
 *            dense). Device memory on CUDA. Values must be finite and > 0
 *            where a key is read (positions below kv_len); any such value
 *            works, however far from 1 (fd_run: non-finite values).
 * out and lse must not overlap q, k_cache, v_cache, kv_len, block_table,
 * sinks, k_scale, v_scale, the workspace or each other. fd_run checks this from addresses and
 * strides alone (no memory is read, so CUDA device pointers are checked the
 * same way): each tensor spans the bytes from its base to its last element,
 * base + (sum over dims of (extent - 1) * stride + head_dim) * element size,
 * and two tensors whose spans intersect are refused even when their elements
 * interleave without sharing a byte (out in the odd slots of a buffer whose
 * even slots hold q: give out a buffer of its own). The spans: the cache
 * [batch, kv_capacity, ...] when contiguous, [num_pages, page_size, ...]
 * when paged (num_pages 0, unknown: the first page only); block_table
 * [batch] rows of max_pages_per_seq; kv_len [batch]; sinks [num_heads_q];
 * the workspace plan.workspace_size bytes.
 */
typedef struct fd_tensors {
  const void *q;
  int64_t q_strides[3];
  const void *k_cache;
  int64_t k_strides[3];
  const void *v_cache;
  int64_t v_strides[3];
  const int32_t *kv_len;
  const int32_t *block_table;
  int64_t block_table_stride;
  void *out;
  int64_t out_strides[3];
  float *lse;
  int64_t lse_strides[3];
  const float *sinks;    /* optional [num_heads_q] float32 (device memory for
                            CUDA): one extra logit per query head (see WHAT IT
                            COMPUTES); NULL = none. A NaN sink gives NaN rows.
                            In cascade decoding give it to one of the merged
                            calls only. */
  const float *k_scale;  /* fp8 caches: see above; NULL with FD_KV_SCALE_NONE */
  const float *v_scale;
  int64_t scale_strides[3]; /* FD_KV_SCALE_TOKEN: {batch or page, position, head}
                            in floats, shared by k_scale and v_scale; all zero
                            = dense. Ignored (sign still checked) otherwise */
  /* MLA only (fd_problem.rope_dim > 0; NULL otherwise): */
  const void *q_pe;      /* [batch, q_len, num_heads_q, rope_dim] dtype,
                            strides {batch, token, head} */
  int64_t q_pe_strides[3];
  const void *k_pe_cache; /* laid out like k_cache with rope_dim columns,
                            rope_dtype; strides {batch or page, position, head} */
  int64_t k_pe_strides[3];
  /* Tree masks only (fd_problem.tree_mask = 1; NULL otherwise): */
  const uint64_t *tree_mask; /* [batch, q_len] (TREE MASKS above): bit j of
                            tree_mask[b][t] set = row t of sequence b sees
                            draft key j (key kv_len[b] - q_len + j); host
                            memory for the CPU and reference, device memory
                            for CUDA */
  int64_t tree_mask_stride; /* uint64s from one sequence's rows to the next;
                            0 = q_len (dense); FD_STRIDE_BROADCAST = one
                            tree for every sequence */
} fd_tensors;

/*
 * Run one decode-attention call with `plan`.
 *
 * CUDA: enqueues the kernels on `stream` and returns; it allocates nothing,
 * never synchronises and never reads kv_len or block_table on the host, so a
 * sequence of fd_run calls can be captured in a CUDA graph and replayed while
 * the values in kv_len change (up to kv_capacity). Device-side, kv_len is
 * clamped to [0, kv_capacity] and block_table ids outside [0, num_pages) (when
 * num_pages is known) read no memory: such keys are skipped. Checking those
 * values is the caller's job on this backend.
 * CPU / reference: computes synchronously (stream ignored) and checks every
 * kv_len and block_table value first (FD_STATUS_INVALID_ARGUMENT, nothing
 * written, on a bad one).
 *
 * The workspace needs no initialisation and is scratch between calls; one
 * workspace must not be used by two calls at once.
 *
 * Returns FD_STATUS_OK, or (on any status but FD_STATUS_OK and
 * FD_STATUS_BACKEND_ERROR nothing was written: out, lse and the workspace are
 * untouched):
 *   FD_STATUS_INVALID_ARGUMENT  plan/tensors NULL or the plan not made by
 *       fd_plan_init; a required pointer NULL; block_table NULL for a paged
 *       plan; q, q_pe, k_cache, k_pe_cache, v_cache, out, lse, sinks,
 *       kv_len or block_table not aligned to its element type (every
 *       backend); a negative stride (other than FD_STRIDE_BROADCAST on q,
 *       k_cache or v_cache); a zero stride beside nonzero ones on a
 *       dimension of extent > 1; a tensor whose span passes the end of the
 *       address space;
 *       out or lse overlapping an input, the workspace or each other (the
 *       message names both); k_scale or v_scale NULL while kv_scale is
 *       set, or given with FD_KV_SCALE_NONE, or not float-aligned;
 *       host-side checks of kv_len / block_table (CPU, reference) and of the
 *       scales that will be read (CPU, reference: a scale that is zero,
 *       negative, NaN or infinite, named with its index). MLA (rope_dim >
 *       0): q_pe or k_pe_cache NULL or not aligned to its element type;
 *       v_cache, v_scale or sinks given (the values are k_cache's rows,
 *       times k_scale); q_pe_strides / k_pe_strides as q's and k_cache's
 *       (FD_STRIDE_BROADCAST allowed); out or lse overlapping q_pe or
 *       k_pe_cache. Standard plans (rope_dim 0): q_pe or k_pe_cache given.
 *       Tree plans: tree_mask NULL, not 8-byte aligned, a negative
 *       tree_mask_stride (other than FD_STRIDE_BROADCAST), out or lse
 *       overlapping it; host-side (CPU, reference) a row whose own bit is
 *       clear or with bits at or above q_len (named tree_mask[b][t]).
 *       Plans without tree_mask: tree_mask given.
 *   FD_STATUS_WORKSPACE_TOO_SMALL  workspace_size < plan->workspace_size, or
 *       workspace NULL while plan->workspace_size > 0.
 *   FD_STATUS_UNSUPPORTED  CUDA: q, k_cache, v_cache (MLA: q_pe and
 *       k_pe_cache instead), out or the workspace not aligned to 16 bytes,
 *       or a stride of one of those tensors that is not a multiple of 16
 *       bytes (lse needs only float alignment; for an fp8
 *       cache, elements are bytes: 16 fp8 values); batch or num_heads_kv
 *       above 65535. The CPU and reference backends take any pointer aligned
 *       to its element type and any non-negative strides.
 *   FD_STATUS_OUT_OF_MEMORY  reference backend only: its float64 scratch
 *       (head_dim and the longest kv_len doubles) could not be allocated.
 *   FD_STATUS_BACKEND_ERROR  a kernel launch failed (message from CUDA).
 *
 * Non-finite values and float32's range, on every backend and split count
 * (a row "sees" the keys that WHAT IT COMPUTES, at the top of this file, gives it):
 *   - A NaN in q, in a K element a row sees, or in its sink, a +inf sink,
 *     and a score that is NaN, or +inf without a soft-cap, give that row NaN
 *     in all of out and in lse. A score of -inf is a key of weight zero: a
 *     row whose every score is -inf gets out = 0 and lse = -inf (its sink,
 *     with sinks), as a row without keys. An infinite K element gives its
 *     key a score of +-inf or NaN (by q's element there). With a soft-cap,
 *     +-inf scores become +-cap.
 *   - A NaN or +-inf in a V element a row sees (its weight zero included)
 *     gives that row lse = NaN and makes its out non-finite (NaN or +-inf) in
 *     that element's column. Which other elements of the row are non-finite
 *     is backend-defined (the CPU backend and CUDA calls with splits: all of
 *     them, NaN; the reference and CUDA calls of one split: that column).
 *     V values so large that a row's weighted sum over a split overflows
 *     float32 (|V| within a factor of the keys summed of 3.4e38; the
 *     reference sums in double) count as +-inf in V. An out value beyond
 *     its dtype's range (fp16: 65504) is +-inf, with a finite lse.
 *   - Scores are float32 on the CPU and CUDA backends; the reference
 *     computes in double and rounds only out and lse. The CPU backend and
 *     CUDA's 16-bit and fp8 kernels form the dot product q.k, then multiply
 *     it by softmax_scale (fp8 on CUDA: the dot product of q with the codes,
 *     times softmax_scale, then times k_scale); CUDA's float32 kernel
 *     multiplies q by softmax_scale * log2(e) first. A product or sum along
 *     the way that overflows float32 gives a score of +-inf (with the
 *     outcomes above), even where the exact score is within float32: a
 *     float32 row whose q.k overflows while softmax_scale * q.k does not is
 *     NaN on the CPU backend and right on CUDA when softmax_scale * log2(e)
 *     < 1. An overflow never gives a finite wrong row, except through a
 *     score of -inf (weight zero) that the exact score would not have.
 *   - fp8 scales: every finite k_scale, v_scale > 0 (subnormal to
 *     FLT_MAX) gives the results of the dequantized values
 *     k_cache * k_scale and v_cache * v_scale, as long as those are finite
 *     (and the scores and sums above stay within float32), with a 16-bit
 *     cache's accuracy.
 * Keys at or beyond kv_len, before a window's first key, and pages no
 * sequence uses are never read, so NaN or Inf there does not matter (fp8
 * NaN codes and per-token scales there included); a row that does not see
 * a key another row of the same call sees may still get NaN from a NaN or
 * Inf in that key's V (the kernels multiply it by a zero weight).
 *
 * Accuracy of long sums: the error does not grow with kv_len. The CPU
 * backend sums up to 128 keys (head_dim <= 8: one block of up to 256; MLA:
 * a group of 256) in float32 and those sums in double; the
 * CUDA float32 kernel keeps compensated sums (each tile's p v folded into
 * the running sum by Fast2Sum, the dropped part carried); the fp16/bf16 kernel
 * sums P V on tensor cores in float32, whose error grows with the keys one
 * block sums, so its plans cut sequences into splits of at most 131072 keys
 * (plan.num_splits may exceed a given num_splits; with kv_len_hint, a
 * sequence longer than its hint may get longer splits) and the combine adds
 * at most FD_MAX_SPLITS partials. At 4M identical keys the float32 out is
 * within 2e-6 of max|V| and the 16-bit outs within their dtype's test floor
 * (tests/reliability/rel_trust.c). CUDA does not check fp8 scale values
 * (they are in device memory): a zero, negative, NaN or infinite scale that
 * a key needs gives wrong or NaN rows. Strides of unused tensors (lse when NULL,
 * block_table for a contiguous cache) are checked for sign only. Strides
 * under which out or lse alias their own elements (e.g. a head stride smaller
 * than head_dim) are not detected and make the result unspecified.
 */
FD_API fd_status fd_run(const fd_plan *plan, const fd_tensors *tensors, void *workspace,
                 size_t workspace_size, void *stream, fd_error *err);

/*
 * One call: fd_plan_init, allocate the workspace, fd_run, free. CPU and
 * reference: synchronous, workspace from malloc. CUDA: the workspace comes
 * from cudaMallocAsync/cudaFreeAsync on `stream` (not capturable in a graph
 * on drivers without stream-ordered allocation; use plan/run for graphs).
 * Statuses: those of fd_plan_init and fd_run, plus FD_STATUS_OUT_OF_MEMORY.
 */
FD_API fd_status fd_decode(const fd_problem *problem, const fd_tensors *tensors, void *stream,
                    fd_error *err);

/* ---- Appending to the KV cache ------------------------------------------ */

/*
 * The tensors of an fd_append_kv call. Strides are in elements, as in
 * fd_tensors; all-zero strides mean contiguous.
 *
 *   k_new, v_new [batch, num_new, num_heads_kv, head_dim]  dtype (the q dtype)
 *                strides {batch, token, head}
 *   k_cache, v_cache, kv_len, block_table: as in fd_tensors (written, not
 *                read, except kv_len and block_table)
 *   k_scale, v_scale  by kv_scale, as in fd_tensors: TENSOR and HEAD scales
 *                are read (the scale each token is quantized with); TOKEN
 *                scales are written, one per new (position, kv head)
 */
typedef struct fd_append_tensors {
  const void *k_new;
  int64_t k_new_strides[3];
  const void *v_new;
  int64_t v_new_strides[3];
  void *k_cache;
  int64_t k_strides[3];
  void *v_cache;
  int64_t v_strides[3];
  const int32_t *kv_len;      /* [batch] keys in the cache BEFORE this call */
  const int32_t *block_table; /* paged: [batch, max_pages_per_seq]; NULL when contiguous */
  int64_t block_table_stride; /* 0 = max_pages_per_seq */
  float *k_scale;             /* NONE: NULL; TENSOR/HEAD: read; TOKEN: written */
  float *v_scale;
  int64_t scale_strides[3];   /* TOKEN: as fd_tensors.scale_strides */
  /* MLA (plan made with rope_dim > 0; NULL otherwise): k_new is the new
     latent c_kv [batch, num_new, 1, head_dim] and k_cache the latent cache;
     v_new, v_cache and v_scale are NULL. A TOKEN scale is computed over the
     latent and, when rope_dtype is fp8, the rope part together. */
  const void *k_pe_new;       /* [batch, num_new, 1, rope_dim] dtype */
  int64_t k_pe_new_strides[3];
  void *k_pe_cache;           /* as fd_tensors.k_pe_cache (written) */
  int64_t k_pe_strides[3];
} fd_append_tensors;

/*
 * Writes num_new new tokens of every sequence into the cache: token i of
 * sequence b (k_new[b][i], v_new[b][i], all kv heads) goes to position
 * kv_len[b] + i, contiguous or through the block table, for i < num_new.
 * kv_len holds the lengths BEFORE the append and is not changed: the caller
 * adds num_new afterwards (the usual order: append, bump kv_len, fd_run; a
 * speculative verify step appends q_len tokens, then runs with q_len rows).
 * Only the named positions (and their per-token scales) are written; k_new
 * and v_new must not overlap the cache or the scales.
 *
 * The plan is the one made for fd_run (its backend, dtype, kv_dtype,
 * kv_scale, batch, num_heads_kv, head_dim, paging and kv_capacity apply; the
 * q-side fields do not). A 16-bit or fp32 cache (kv_dtype == dtype) gets an
 * exact copy (NaN included). An fp8 cache gets each value x (widened exactly
 * to float32) as fp8(x / s), the quotient in float32 rounded to the nearest
 * fp8 value (ties to even), saturating: values beyond the largest finite
 * value, +-inf included, become +-448 (E4M3) or +-57344 (E5M2), never inf
 * or NaN; NaN stays NaN with its sign (S.1111.111 E4M3, S.11111.11 E5M2, S
 * the sign of x, the same on every backend). The scale s:
 *   NONE: 1; TENSOR: k_scale[0] / v_scale[0]; HEAD: the kv head's;
 *   TOKEN: computed per new (token, kv head), separately for k and v, as
 *     amax / max_finite in float32 (amax = largest finite |x| of its
 *     head_dim values; max_finite 448 or 57344), raised to at least
 *     FLT_MIN (2^-126), 1 when amax is 0 or no value is finite; written to
 *     k_scale / v_scale at (b or page, position, head).
 *
 * CUDA: enqueued on `stream`; allocates nothing, never synchronises and
 * reads kv_len / block_table / the scales on the device only, so it can be
 * captured in a CUDA graph. Device-side, a token whose position is negative
 * or at or beyond kv_capacity, or whose page id is negative or not below
 * num_pages (when num_pages is known), is not written (nor its scale);
 * TENSOR / HEAD scale values are not checked (a zero scale saturates, a NaN
 * one writes NaN). CPU and reference (the same host code): synchronous
 * (stream ignored); kv_len, block_table and the scales are checked first,
 * and on any error nothing is written.
 *
 * Returns FD_STATUS_OK (num_new == 0: nothing to do), or:
 *   FD_STATUS_INVALID_ARGUMENT  plan/tensors NULL or the plan not made by
 *       fd_plan_init; num_new < 0; a required pointer NULL (k_new, v_new,
 *       k_cache, v_cache, kv_len; block_table when paged; k_scale and
 *       v_scale when kv_scale is set) or a scale given with
 *       FD_KV_SCALE_NONE; a negative stride; k_new, v_new, k_cache or v_cache
 *       not aligned to its element size. MLA (rope_dim > 0): k_pe_new or
 *       k_pe_cache NULL or misaligned, v_new, v_cache or v_scale given (v_new
 *       / v_cache / v_scale are required without rope_dim, and k_pe_new /
 *       k_pe_cache refused). Host-side (CPU, reference): kv_len[b]
 *       < 0 or kv_len[b] + num_new > kv_capacity; a page id the new tokens
 *       need outside [0, num_pages) (negative ids always); a TENSOR / HEAD
 *       scale that is zero, negative, NaN or infinite.
 *   FD_STATUS_UNSUPPORTED  CUDA: batch * num_new * num_heads_kv above 2^31 - 1;
 *       an MLA plan (rope_dim > 0) in a build whose CUDA append kernel does
 *       not write MLA caches; CUDA not built in.
 *   FD_STATUS_BACKEND_ERROR  the CUDA launch failed.
 */
FD_API fd_status fd_append_kv(const fd_plan *plan, const fd_append_tensors *tensors,
                              int32_t num_new, void *stream, fd_error *err);

/* ---- Merging attention states ------------------------------------------ */

/*
 * The shapes of an fd_merge_states call. Zero-initialise, then set.
 */
typedef struct fd_merge_problem {
  fd_backend backend;   /* default AUTO (CUDA when available, else CPU); REFERENCE
                           runs the CPU code */
  fd_dtype dtype;       /* dtype of the states' outputs (required) */
  fd_dtype out_dtype;   /* dtype of the merged out; 0 = dtype */
  int32_t num_states;   /* S, 1..FD_MAX_MERGE_STATES */
  int32_t batch;        /* >= 1 */
  int32_t q_len;        /* >= 1 */
  int32_t num_heads;    /* >= 1 */
  int32_t head_dim;     /* 1..512 (512: MLA states) */
  int32_t device;       /* CUDA: device ordinal */
} fd_merge_problem;

#define FD_MAX_MERGE_STATES 65536

/*
 * Merges S attention states over disjoint key sets of the same queries (the
 * flash-decoding combine, public: cascade / shared-prefix decoding, KV split
 * between devices, KV on GPU and CPU). Every tensor is dense (contiguous):
 *   states_out [S, batch, q_len, num_heads, head_dim]  dtype
 *   states_lse [S, batch, num_heads, q_len]            float32, natural log
 *   out        [batch, q_len, num_heads, head_dim]     out_dtype
 *   lse        [batch, num_heads, q_len]               float32, optional (NULL)
 * each state being (out_s, lse_s) as fd_run writes them. Per row:
 *   m = max_s lse_s,  w_s = exp(lse_s - m),  L = sum_s w_s,
 *   out = sum_s w_s out_s / L,  lse = m + log(L).
 * A state with lse_s = -inf (it saw no key) is the neutral element and its
 * out_s is not read; all states empty gives out = 0 and lse = -inf (never
 * (-inf) - (-inf)). A NaN lse_s gives a NaN row; lse_s = +inf is taken as
 * NaN. Every other state's out_s is read (NaN or inf there propagates, even
 * where its weight underflows to 0). Sums run in state order in fp32 (CUDA)
 * or double (CPU), so results are reproducible.
 * CUDA: device pointers, enqueued on `stream`, no allocation, no host sync:
 * graph-capturable; 16-byte loads when states_out is 16-byte aligned,
 * head_dim * element size is a multiple of 16 bytes and out is aligned to 4
 * of its elements; element loads otherwise (slower, same results). CPU / reference: host pointers,
 * synchronous, `stream` ignored. Pointers must be aligned to their element
 * type; out and lse must not overlap each other or the inputs (checked from
 * their address ranges).
 * Returns FD_STATUS_OK, or FD_STATUS_INVALID_ARGUMENT (a NULL pointer or
 * problem, a field out of range, a misaligned pointer, an overlap; message
 * names it; nothing written), FD_STATUS_UNSUPPORTED (CUDA not built in, or
 * the device cannot run it: below compute capability 8.0, or no code for it
 * in this build), FD_STATUS_BACKEND_ERROR (a launch failed).
 */
FD_API fd_status fd_merge_states(const fd_merge_problem *problem, const void *states_out,
                                 const float *states_lse, void *out, float *lse, void *stream,
                                 fd_error *err);

/*
 * The automatic split count, as a pure function (what fd_plan_init uses).
 *   work_items   batch * num_heads_kv: blocks per split
 *   max_chunks   ceil(longest kv_len / chunk_len) (kv_capacity or hint)
 *   sm_count     multiprocessors (CPU: threads)
 *   blocks_per_sm  blocks of the split kernel resident per multiprocessor
 * Returns a count in [1, min(max_chunks, FD_MAX_SPLITS)] (1 when max_chunks
 * <= 1). Wave quantisation after FlashAttention-2's num_splits_heuristic,
 * counting the chunks a split really gets: with c = ceil(max_chunks / s)
 * chunks a split, s' = ceil(max_chunks / c) splits hold keys, waves =
 * work_items * s' / (sm_count * blocks_per_sm), and efficiency(s) =
 * work_items * max_chunks / (ceil(waves) * sm_count * blocks_per_sm * c)
 * (the work over the slots' time; waves / ceil(waves) when s divides the
 * chunks); 1 when work_items alone fill 80 % of the slots; else the smallest
 * s (at most 128) whose efficiency is at least 95 % of the best
 * (FlashAttention-2 uses 85 % and counts whole splits only; both measured
 * slower on the H200).
 * Worked example: 8 kv heads, 16384 keys (256 chunks of 64), 132 SMs x 2:
 * s = 32 gives 256 blocks of 264 slots, 0.97 -> 32 splits of 512 keys.
 */
FD_API int32_t fd_num_splits_heuristic(int64_t work_items, int64_t max_chunks, int32_t sm_count,
                                int32_t blocks_per_sm);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHDECODE_H */
