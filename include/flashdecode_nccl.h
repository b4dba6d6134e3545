/*
 * flashdecode_nccl.h — decode attention over a KV cache spread across GPUs:
 * the merge of the ranks' attention states through NCCL.
 *
 * A separate library, libflashdecode_nccl, on top of libflashdecode
 * (flashdecode.h, which needs neither NCCL nor CUDA headers). This header
 * includes <nccl.h> (and through it <cuda_runtime.h>). Link with
 * -lflashdecode_nccl -lflashdecode -lnccl. CMake builds the library when
 * NCCL is found (FD_NCCL=AUTO, the default; ON makes it required).
 *
 * WHAT IT DOES
 *   Each rank of an NCCL communicator holds part of every sequence's keys
 *   (any part: pages spread across GPUs, a prefix on one and the rest on
 *   another; a rank may hold none) and runs fd_run over it with an lse,
 *   which gives it an attention state (out_r, lse_r) per query row. The
 *   attention over all the keys is the merge of the states (fd_merge_states):
 *       m = max_r lse_r,  w_r = exp(lse_r - m),
 *       out = sum_r w_r out_r / sum_r w_r,  lse = m + log(sum_r w_r).
 *   fd_nccl_merge all-gathers the states into a workspace on every rank
 *   (ncclAllGather, one group: two gathers, states and lse) and merges them
 *   there with fd_merge_states, so every rank ends with the same out and lse
 *   (bitwise: the same states merged in rank order by the same kernel on
 *   the same GPU model). A rank whose keys are none (kv_len 0 everywhere)
 *   has lse = -inf: the neutral state, a valid case.
 *   Traffic per rank: (nranks - 1) x rows x (head_dim x element size + 4)
 *   bytes received, rows = batch x q_len x num_heads; fp32 states of B = 8,
 *   32 heads, head_dim 128: 129 KiB per rank per layer and step.
 *
 * USAGE (one rank; every rank makes the same calls)
 *   fd_nccl_problem np = {0};
 *   np.dtype = FD_DTYPE_F32;            // the states: fd_problem.out_dtype = F32
 *   np.out_dtype = FD_DTYPE_BF16;       // the merged out
 *   np.batch = B; np.num_heads = Hq; np.head_dim = D;   // q_len 1 by default
 *   fd_nccl_plan mp;
 *   fd_nccl_plan_init(&mp, &np, comm, &err);            // host queries only
 *   cudaMalloc(&ws, mp.workspace_size);                 // once
 *   // per layer: the local attention, written straight into this rank's
 *   // slot of the workspace (the gather is then in place: no copy) ...
 *   fd_nccl_local_slot(&mp, ws, &slot_out, &slot_lse, &err);
 *   tensors.out = slot_out; tensors.lse = slot_lse;
 *   fd_run(&plan, &tensors, fd_ws, plan.workspace_size, stream, &err);
 *   // ... then the exchange and the merge, enqueued on the same stream:
 *   fd_nccl_merge(&mp, comm, slot_out, slot_lse, ws, mp.workspace_size,
 *                 out, lse, stream, &err);
 *   Any other local out / lse buffer works too (it is then copied by the
 *   gather). The local states must be dense: out [L, batch, q_len,
 *   num_heads, head_dim] and lse [L, batch, num_heads, q_len] with L =
 *   num_local_states (1: exactly what fd_run writes with default strides).
 *
 * ONE THREAD DRIVING SEVERAL GPUS (ncclCommInitAll)
 *   NCCL needs the collectives of all the ranks a thread drives inside one
 *   ncclGroupStart / ncclGroupEnd, and a group enqueues nothing before its
 *   end. So do not call fd_nccl_merge there (its merge would be enqueued
 *   before the gather): call fd_nccl_gather for every rank inside the
 *   group, then fd_nccl_merge_gathered for every rank after it
 *   (examples/multi_gpu_decode.c). fd_nccl_merge is fd_nccl_gather (in its
 *   own group) followed by fd_nccl_merge_gathered, for one rank per thread
 *   or process.
 *
 * CUDA GRAPHS, ALLOCATION
 *   fd_nccl_plan_init reads the communicator (ncclCommCount,
 *   ncclCommUserRank, ncclCommCuDevice) and allocates nothing. fd_nccl_gather,
 *   fd_nccl_merge_gathered and fd_nccl_merge allocate nothing, do not
 *   synchronise and can be captured in a CUDA graph (NCCL collectives are
 *   capturable; see NCCL's documentation on CUDA graphs), except with
 *   check_shapes = 1 (below), which synchronises and is refused during a
 *   capture.
 *
 * MISMATCHED CALLS (what cannot be detected without communication)
 *   Every rank must call with the same dtype, batch, q_len, num_heads,
 *   head_dim and num_local_states (out_dtype and the pointers may differ).
 *   A rank cannot see another's shapes without communicating, and NCCL does
 *   not check: gathers of different sizes hang or corrupt memory. Each call
 *   checks what is local (the plan against the communicator's size, rank
 *   and device; the pointers, alignment and overlaps). With check_shapes = 1
 *   each fd_nccl_gather / fd_nccl_merge first all-gathers a 128-byte
 *   description of every rank's problem, waits for it on the host, and
 *   returns FD_STATUS_INVALID_ARGUMENT on every rank (nothing gathered,
 *   nothing written) when any differs, naming the rank and the field. It
 *   costs one small collective and a host synchronisation per call, so use
 *   it while developing or at a configuration change (a plan with
 *   check_shapes = 1 called once, outside any graph), not per layer.
 *   check_shapes itself must be the same on every rank (it changes the
 *   collectives), and it needs a thread or a process per rank: inside a
 *   caller's ncclGroupStart (one thread, several GPUs) its gather is not run
 *   before it waits, and it fails ("rank N sent no description").
 *
 * ERRORS AND TIMEOUTS
 *   An NCCL call that fails returns FD_STATUS_BACKEND_ERROR with a message
 *   naming the call (e.g. "ncclAllGather (states out): unhandled cuda
 *   error ...", NCCL's last error appended); a failed CUDA call likewise.
 *   Errors that happen later on the GPU (a peer died, a network error) are
 *   NCCL's asynchronous errors: ncclCommGetAsyncError reports them.
 *   A rank that never reaches the matching call leaves the others waiting:
 *   inside the NCCL kernels on the stream (the host calls return;
 *   cudaStreamSynchronize never does) or, at the first collective of a
 *   communicator (connection set-up), inside ncclGroupEnd. NCCL has no
 *   timeout of its own for this; the caller gives one with fd_nccl_wait
 *   (and takes care of the set-up with a non-blocking communicator):
 *     - fd_nccl_wait(comm, stream, timeout_s, 1, &err) polls the stream and
 *       ncclCommGetAsyncError instead of cudaStreamSynchronize, and after
 *       timeout_s calls ncclCommAbort(comm), which stops the pending NCCL
 *       kernels, frees the communicator (the handle must not be used again:
 *       make a new one, e.g. ncclCommInitRank) and leaves out / lse
 *       undefined; it returns FD_STATUS_BACKEND_ERROR saying so;
 *     - a communicator made non-blocking (ncclConfig_t.blocking = 0,
 *       ncclCommInitRankConfig) returns ncclInProgress from NCCL calls
 *       instead of blocking; fd_nccl_gather then polls
 *       ncclCommGetAsyncError until its group is enqueued before it returns,
 *       so that the merge is never enqueued ahead of the gather. That poll
 *       has no timeout of its own (at a communicator's first collective it
 *       includes connecting to the peers): warm a communicator up with one
 *       call under your own watch before relying on it.
 *   A call that fails on one rank before its gather (a local error) leaves
 *   the other ranks waiting in theirs: handle any error as fatal for the
 *   step on every rank (abort the communicator, or time out as above).
 *   torch.distributed does the same from Python (its NCCL process groups
 *   take a timeout and abort the communicator).
 */
#ifndef FLASHDECODE_NCCL_H
#define FLASHDECODE_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include <nccl.h>

#include "flashdecode.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported functions (the shared library hides everything else). */
#if defined(FD_BUILDING_NCCL_LIBRARY) && defined(__GNUC__)
#define FD_NCCL_API __attribute__((visibility("default")))
#else
#define FD_NCCL_API
#endif

/* The shapes of one merge across the ranks. Zero-initialise, then set. */
typedef struct fd_nccl_problem {
  fd_dtype dtype;           /* dtype of the local states' out (required); FD_DTYPE_F32
                               recommended (fd_problem.out_dtype = FD_DTYPE_F32): 16-bit
                               states halve the traffic but round each rank's out */
  fd_dtype out_dtype;       /* dtype of the merged out; 0 = dtype */
  int32_t batch;            /* >= 1 */
  int32_t q_len;            /* query rows per sequence, default 1 */
  int32_t num_heads;        /* query heads, >= 1 */
  int32_t head_dim;         /* 1..256 */
  int32_t num_local_states; /* states each rank contributes, default 1 (e.g. shards
                               of the cache on one GPU, or its cache in several parts);
                               nranks x num_local_states <= FD_MAX_MERGE_STATES */
  int32_t check_shapes;     /* 1: every gather first checks that all ranks agree
                               (MISMATCHED CALLS above); 0 = off (default) */
} fd_nccl_problem;

/* A plan: plain data, no destroy function. Read-only for the caller. */
typedef struct fd_nccl_plan {
  fd_nccl_problem problem;  /* copy, defaults resolved */
  int32_t nranks;           /* ncclCommCount of the communicator */
  int32_t rank;             /* ncclCommUserRank */
  int32_t device;           /* ncclCommCuDevice: where the workspace and buffers live */
  int32_t num_states;       /* nranks x num_local_states: states merged */
  size_t workspace_size;    /* bytes of device memory (on `device`) the calls need */
  size_t local_out_bytes;   /* bytes of one rank's states out (all its local states) */
  size_t local_lse_bytes;   /* bytes of one rank's states lse */
  /* (internal) workspace layout, byte offsets */
  size_t ws_states_out;     /* [num_states, batch, q_len, num_heads, head_dim] dtype */
  size_t ws_states_lse;     /* float [num_states, batch, num_heads, q_len] */
  size_t ws_check;          /* check_shapes: 128 bytes per rank */
  uint32_t magic;           /* (internal) set by fd_nccl_plan_init */
} fd_nccl_plan;

/*
 * Make a plan for `problem` on this rank of `comm`: checks the problem,
 * reads the communicator's size, rank and device and sizes the workspace.
 * No communication, no allocation.
 * Returns FD_STATUS_OK, FD_STATUS_INVALID_ARGUMENT (NULL plan, problem or
 * comm; a field out of range, as in fd_merge_problem; num_local_states < 0;
 * check_shapes not 0 or 1; nranks x num_local_states above
 * FD_MAX_MERGE_STATES; sizes beyond 2^52 bytes) or FD_STATUS_BACKEND_ERROR
 * (an NCCL query failed; the message names it).
 */
FD_NCCL_API fd_status fd_nccl_plan_init(fd_nccl_plan *plan, const fd_nccl_problem *problem,
                                        ncclComm_t comm, fd_error *err);

/*
 * Where this rank's states sit in `workspace`: *out (dtype) and *lse
 * (float), dense [num_local_states, ...]. fd_run may write its out and lse
 * there (fd_problem.out_dtype = the plan's dtype); fd_nccl_gather then
 * gathers in place. Either pointer argument may be NULL.
 * Returns FD_STATUS_OK or FD_STATUS_INVALID_ARGUMENT (plan not made by
 * fd_nccl_plan_init, workspace NULL).
 */
FD_NCCL_API fd_status fd_nccl_local_slot(const fd_nccl_plan *plan, void *workspace, void **out,
                                         float **lse, fd_error *err);

/*
 * Enqueue on `stream` the all-gather of every rank's states into the
 * workspace (one ncclGroupStart / ncclGroupEnd around two ncclAllGather).
 * Collective: every rank of the communicator calls it. Inside a caller's
 * group (one thread, several GPUs) nothing is enqueued until the caller's
 * ncclGroupEnd.
 *   local_out  [num_local_states, batch, q_len, num_heads, head_dim] dtype, dense
 *   local_lse  [num_local_states, batch, num_heads, q_len] float32, dense
 * on the plan's device; either exactly this rank's slot (fd_nccl_local_slot)
 * or outside the workspace. workspace: plan->workspace_size bytes of device
 * memory on the plan's device, 16-byte aligned, used by one call at a time.
 * Returns FD_STATUS_OK, FD_STATUS_INVALID_ARGUMENT (a NULL or misaligned
 * pointer; local_out / local_lse overlapping the workspace other than as
 * the slot; comm NULL or not the plan's (size, rank, device); with
 * check_shapes: ranks that disagree), FD_STATUS_WORKSPACE_TOO_SMALL,
 * FD_STATUS_UNSUPPORTED (check_shapes while `stream` is capturing),
 * FD_STATUS_BACKEND_ERROR (an NCCL or CUDA call failed; named).
 */
FD_NCCL_API fd_status fd_nccl_gather(const fd_nccl_plan *plan, ncclComm_t comm,
                                     const void *local_out, const float *local_lse,
                                     void *workspace, size_t workspace_size, void *stream,
                                     fd_error *err);

/*
 * Enqueue on `stream` the merge of the gathered states (fd_merge_states,
 * CUDA backend, on the plan's device): out [batch, q_len, num_heads,
 * head_dim] out_dtype and lse [batch, num_heads, q_len] float32 (optional,
 * NULL), dense. out / lse must not overlap the workspace; they may be the
 * local states' buffers (those are read by the gather, before). Local: no
 * communication.
 * Returns fd_merge_states's statuses; FD_STATUS_INVALID_ARGUMENT for a plan
 * not made by fd_nccl_plan_init; FD_STATUS_WORKSPACE_TOO_SMALL.
 */
FD_NCCL_API fd_status fd_nccl_merge_gathered(const fd_nccl_plan *plan, const void *workspace,
                                             size_t workspace_size, void *out, float *lse,
                                             void *stream, fd_error *err);

/*
 * fd_nccl_gather then fd_nccl_merge_gathered: the merged out / lse of all
 * the ranks' states, on every rank. For one rank per thread or process (not
 * inside a caller's ncclGroupStart / ncclGroupEnd: see above). Statuses:
 * those of the two calls.
 */
FD_NCCL_API fd_status fd_nccl_merge(const fd_nccl_plan *plan, ncclComm_t comm,
                                    const void *local_out, const float *local_lse,
                                    void *workspace, size_t workspace_size, void *out,
                                    float *lse, void *stream, fd_error *err);

/*
 * Wait for `stream` (cudaStreamQuery, polled every ~50 us) while watching
 * `comm` (ncclCommGetAsyncError). timeout_s <= 0: no timeout. On timeout,
 * with abort_on_timeout = 1, calls ncclCommAbort(comm) (the handle is then
 * gone: do not use or destroy it again) and returns FD_STATUS_BACKEND_ERROR
 * ("timed out ... ncclCommAbort called"); with 0 it returns the same status
 * and leaves the communicator alone. An asynchronous NCCL error also
 * returns FD_STATUS_BACKEND_ERROR (named, communicator not aborted: the
 * caller's ncclCommAbort). Returns FD_STATUS_OK when the stream's work is
 * done. Host-side: not for use inside a graph capture.
 */
FD_NCCL_API fd_status fd_nccl_wait(ncclComm_t comm, void *stream, double timeout_s,
                                   int abort_on_timeout, fd_error *err);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHDECODE_NCCL_H */
