/*
 * nccl_merge.c — flashdecode_nccl.h: the ranks' attention states gathered
 * with ncclAllGather into a workspace, merged there by fd_merge_states.
 *
 * Workspace (device memory of the communicator's GPU), byte offsets:
 *   ws_states_out  [nranks * L, batch, q_len, num_heads, head_dim] dtype
 *   ws_states_lse  float [nranks * L, batch, num_heads, q_len]
 *   ws_check       check_shapes only: 128 bytes per rank
 * each region aligned to 256 bytes; rank r's states are states r*L .. r*L+L-1,
 * which is where ncclAllGather puts rank r's send buffer (and where a send
 * buffer must sit for an in-place gather). The gather moves bytes
 * (ncclUint8): any dtype, no conversion. CUDA runtime calls go through
 * nccl_glue.h (tests run this file over host memory with a mock NCCL).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashdecode_nccl.h"
#include "nccl_glue.h"

#define PLAN_MAGIC 0x4644434Eu   /* "FDCN" */
#define CHECK_MAGIC 0x46444E43CE11ll
#define CHECK_SLOT 128           /* bytes of one rank's description */
#define MAX_BYTES 4503599627370496.0 /* 2^52, as fd_plan_init and fd_merge_states */

static fd_status failv(fd_error *err, fd_status st, const char *fmt, va_list ap) {
  if (err) {
    err->status = st;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
  }
  return st;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static fd_status fail(fd_error *err, fd_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  failv(err, st, fmt, ap);
  va_end(ap);
  return st;
}

static fd_status ok(fd_error *err) {
  if (err) {
    err->status = FD_STATUS_OK;
    err->message[0] = '\0';
  }
  return FD_STATUS_OK;
}

/* An NCCL call failed: FD_STATUS_BACKEND_ERROR naming it, with NCCL's text
 * and its last error (which says more, e.g. which peer). */
static fd_status nccl_fail(fd_error *err, const char *call, ncclResult_t r, ncclComm_t comm) {
  const char *last = comm ? ncclGetLastError(comm) : NULL;
  if (last && *last)
    return fail(err, FD_STATUS_BACKEND_ERROR, "%s: %s (%s)", call, ncclGetErrorString(r), last);
  return fail(err, FD_STATUS_BACKEND_ERROR, "%s: %s", call, ncclGetErrorString(r));
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static int valid_dtype(fd_dtype d) { return fd_dtype_size(d) != 0; }

/* ---- Plan ----------------------------------------------------------------- */

static fd_status check_problem(const fd_nccl_problem *p, fd_error *err) {
  if (!valid_dtype(p->dtype))
    return fail(err, FD_STATUS_INVALID_ARGUMENT,
                "dtype: %d is not FD_DTYPE_F32, FD_DTYPE_F16 or FD_DTYPE_BF16", (int)p->dtype);
  if (p->out_dtype != 0 && !valid_dtype(p->out_dtype))
    return fail(err, FD_STATUS_INVALID_ARGUMENT,
                "out_dtype: %d is not 0 (= dtype), FD_DTYPE_F32, FD_DTYPE_F16 or FD_DTYPE_BF16",
                (int)p->out_dtype);
  if (p->batch < 1) return fail(err, FD_STATUS_INVALID_ARGUMENT, "batch: %d, must be >= 1", p->batch);
  if (p->q_len < 0)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "q_len: %d, must be >= 1 (0 = 1)", p->q_len);
  if (p->num_heads < 1)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "num_heads: %d, must be >= 1", p->num_heads);
  if (p->head_dim < 1 || p->head_dim > 256)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "head_dim: %d, must be 1..256", p->head_dim);
  if (p->num_local_states < 0 || p->num_local_states > FD_MAX_MERGE_STATES)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "num_local_states: %d, must be 1..%d (0 = 1)",
                p->num_local_states, FD_MAX_MERGE_STATES);
  if (p->check_shapes != 0 && p->check_shapes != 1)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "check_shapes: %d, must be 0 or 1", p->check_shapes);
  return FD_STATUS_OK;
}

fd_status fd_nccl_plan_init(fd_nccl_plan *plan, const fd_nccl_problem *problem, ncclComm_t comm,
                            fd_error *err) {
  if (!plan) return fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  memset(plan, 0, sizeof *plan);
  if (!problem) return fail(err, FD_STATUS_INVALID_ARGUMENT, "problem: NULL");
  fd_status st = check_problem(problem, err);
  if (st != FD_STATUS_OK) return st;
  if (!comm) return fail(err, FD_STATUS_INVALID_ARGUMENT, "comm: NULL");

  fd_nccl_problem p = *problem;
  if (p.q_len == 0) p.q_len = 1;
  if (p.num_local_states == 0) p.num_local_states = 1;
  if (p.out_dtype == 0) p.out_dtype = p.dtype;

  int nranks = 0, rank = 0, device = 0;
  ncclResult_t r;
  if ((r = ncclCommCount(comm, &nranks)) != ncclSuccess) return nccl_fail(err, "ncclCommCount", r, comm);
  if ((r = ncclCommUserRank(comm, &rank)) != ncclSuccess)
    return nccl_fail(err, "ncclCommUserRank", r, comm);
  if ((r = ncclCommCuDevice(comm, &device)) != ncclSuccess)
    return nccl_fail(err, "ncclCommCuDevice", r, comm);
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(err, FD_STATUS_BACKEND_ERROR, "comm: NCCL reports rank %d of %d", rank, nranks);
  if ((int64_t)nranks * p.num_local_states > FD_MAX_MERGE_STATES)
    return fail(err, FD_STATUS_INVALID_ARGUMENT,
                "num_local_states: %d states on each of %d ranks is above FD_MAX_MERGE_STATES (%d)",
                p.num_local_states, nranks, FD_MAX_MERGE_STATES);

  const double rows = (double)p.batch * p.q_len * p.num_heads;
  const double states = (double)nranks * p.num_local_states;
  const double total = states * rows * ((double)p.head_dim * fd_dtype_size(p.dtype) + 4.0);
  if (total > MAX_BYTES)
    return fail(err, FD_STATUS_INVALID_ARGUMENT,
                "problem: %d states x batch %d x q_len %d x num_heads %d x head_dim %d is %.3g "
                "bytes, beyond what can be addressed",
                (int)states, p.batch, p.q_len, p.num_heads, p.head_dim, total);

  const size_t rows_z = (size_t)p.batch * p.q_len * p.num_heads;
  plan->problem = p;
  plan->nranks = nranks;
  plan->rank = rank;
  plan->device = device;
  plan->num_states = nranks * p.num_local_states;
  plan->local_out_bytes = (size_t)p.num_local_states * rows_z * p.head_dim * fd_dtype_size(p.dtype);
  plan->local_lse_bytes = (size_t)p.num_local_states * rows_z * sizeof(float);
  plan->ws_states_out = 0;
  plan->ws_states_lse = round_up(plan->local_out_bytes * nranks, 256);
  plan->ws_check = round_up(plan->ws_states_lse + plan->local_lse_bytes * nranks, 256);
  plan->workspace_size = plan->ws_check + (p.check_shapes ? (size_t)CHECK_SLOT * nranks : 0);
  plan->magic = PLAN_MAGIC;
  return ok(err);
}

static fd_status check_plan(const fd_nccl_plan *plan, fd_error *err) {
  if (!plan) return fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: NULL");
  if (plan->magic != PLAN_MAGIC)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "plan: not made by fd_nccl_plan_init");
  return FD_STATUS_OK;
}

static fd_status check_workspace(const fd_nccl_plan *plan, const void *ws, size_t ws_size,
                                 fd_error *err) {
  if (!ws) return fail(err, FD_STATUS_WORKSPACE_TOO_SMALL, "workspace: NULL (the plan needs %zu bytes)",
                       plan->workspace_size);
  if (ws_size < plan->workspace_size)
    return fail(err, FD_STATUS_WORKSPACE_TOO_SMALL, "workspace_size: %zu bytes, the plan needs %zu",
                ws_size, plan->workspace_size);
  if ((uintptr_t)ws % 16)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "workspace: %p is not 16-byte aligned", ws);
  return FD_STATUS_OK;
}

fd_status fd_nccl_local_slot(const fd_nccl_plan *plan, void *workspace, void **out, float **lse,
                             fd_error *err) {
  fd_status st = check_plan(plan, err);
  if (st != FD_STATUS_OK) return st;
  if (!workspace) return fail(err, FD_STATUS_INVALID_ARGUMENT, "workspace: NULL");
  char *ws = (char *)workspace;
  if (out) *out = ws + plan->ws_states_out + (size_t)plan->rank * plan->local_out_bytes;
  if (lse) *lse = (float *)(ws + plan->ws_states_lse + (size_t)plan->rank * plan->local_lse_bytes);
  return ok(err);
}

/* ---- Gather ---------------------------------------------------------------- */

/* The calling rank's comm must be the plan's. Host queries only. */
static fd_status check_comm(const fd_nccl_plan *plan, ncclComm_t comm, fd_error *err) {
  if (!comm) return fail(err, FD_STATUS_INVALID_ARGUMENT, "comm: NULL");
  int nranks = 0, rank = 0, device = 0;
  ncclResult_t r;
  if ((r = ncclCommCount(comm, &nranks)) != ncclSuccess) return nccl_fail(err, "ncclCommCount", r, comm);
  if ((r = ncclCommUserRank(comm, &rank)) != ncclSuccess)
    return nccl_fail(err, "ncclCommUserRank", r, comm);
  if ((r = ncclCommCuDevice(comm, &device)) != ncclSuccess)
    return nccl_fail(err, "ncclCommCuDevice", r, comm);
  if (nranks != plan->nranks || rank != plan->rank || device != plan->device)
    return fail(err, FD_STATUS_INVALID_ARGUMENT,
                "comm: rank %d of %d on device %d, but the plan was made for rank %d of %d on device %d",
                rank, nranks, device, plan->rank, plan->nranks, plan->device);
  return FD_STATUS_OK;
}

/* A local buffer is either exactly its slot in the workspace or outside it. */
static fd_status check_local(const char *name, const void *ptr, size_t align, size_t bytes,
                             const void *slot, const void *ws, size_t ws_size, fd_error *err) {
  if (!ptr) return fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: NULL", name);
  if ((uintptr_t)ptr % align)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "%s: %p is not aligned to its %zu-byte elements",
                name, ptr, align);
  if (ptr == slot) return FD_STATUS_OK;
  const uintptr_t lo = (uintptr_t)ptr, hi = lo + bytes;
  const uintptr_t wlo = (uintptr_t)ws, whi = wlo + ws_size;
  if (lo < whi && wlo < hi)
    return fail(err, FD_STATUS_INVALID_ARGUMENT,
                "%s: overlaps the workspace but is not this rank's slot (fd_nccl_local_slot)", name);
  return FD_STATUS_OK;
}

/* Wait until a non-blocking communicator has enqueued its group (or failed). */
static fd_status wait_enqueued(ncclComm_t comm, const char *call, fd_error *err) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return nccl_fail(err, "ncclCommGetAsyncError", r, comm);
    if (state == ncclSuccess) return FD_STATUS_OK;
    if (state != ncclInProgress) return nccl_fail(err, call, state, comm);
    const struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

/* The description of this rank's problem that check_shapes compares. */
enum { D_MAGIC, D_RANK, D_NRANKS, D_DTYPE, D_BATCH, D_QLEN, D_HEADS, D_HEAD_DIM, D_LOCAL, D_COUNT };
static const char *const D_NAMES[D_COUNT] = {"magic", "rank", "nranks", "dtype", "batch",
                                             "q_len", "num_heads", "head_dim", "num_local_states"};

static void describe(const fd_nccl_plan *plan, int64_t *d) {
  memset(d, 0, CHECK_SLOT);
  d[D_MAGIC] = CHECK_MAGIC;
  d[D_RANK] = plan->rank;
  d[D_NRANKS] = plan->nranks;
  d[D_DTYPE] = plan->problem.dtype;
  d[D_BATCH] = plan->problem.batch;
  d[D_QLEN] = plan->problem.q_len;
  d[D_HEADS] = plan->problem.num_heads;
  d[D_HEAD_DIM] = plan->problem.head_dim;
  d[D_LOCAL] = plan->problem.num_local_states;
}

static fd_status check_shapes(const fd_nccl_plan *plan, ncclComm_t comm, char *ws, void *stream,
                              fd_error *err) {
  int capturing = 0;
  fd_status st = fd_nccl_glue_capturing(plan->device, stream, &capturing, err);
  if (st != FD_STATUS_OK) return st;
  if (capturing)
    return fail(err, FD_STATUS_UNSUPPORTED,
                "check_shapes: it synchronises the stream, which is being captured; check with a "
                "check_shapes plan outside the graph and capture with check_shapes = 0");
  /* The whole check region is uploaded, zeros but for this rank's slot, so
   * that a gather that did not run (inside a caller's group, where nothing
   * is enqueued before the group ends) shows as ranks with no description
   * rather than as a stale, passing check. */
  const size_t words = CHECK_SLOT / sizeof(int64_t);
  int64_t *all = (int64_t *)calloc((size_t)plan->nranks, CHECK_SLOT);
  if (!all)
    return fail(err, FD_STATUS_OUT_OF_MEMORY, "check_shapes: %d x %d bytes of host memory",
                plan->nranks, CHECK_SLOT);
  int64_t *mine = all + (size_t)plan->rank * words;
  describe(plan, mine);
  char *slots = ws + plan->ws_check;
  const size_t bytes = (size_t)plan->nranks * CHECK_SLOT;
  st = fd_nccl_glue_upload(plan->device, slots, all, bytes, stream, err);
  if (st == FD_STATUS_OK) {
    const ncclResult_t r = ncclAllGather(slots + (size_t)plan->rank * CHECK_SLOT, slots, CHECK_SLOT,
                                         ncclUint8, comm, (cudaStream_t)stream);
    if (r == ncclInProgress)
      st = wait_enqueued(comm, "ncclAllGather (check_shapes)", err);
    else if (r != ncclSuccess)
      st = nccl_fail(err, "ncclAllGather (check_shapes)", r, comm);
  }
  int64_t want[CHECK_SLOT / sizeof(int64_t)];
  memcpy(want, mine, CHECK_SLOT);
  if (st == FD_STATUS_OK) st = fd_nccl_glue_download_sync(plan->device, all, slots, bytes, stream, err);
  for (int q = 0; st == FD_STATUS_OK && q < plan->nranks; q++) {
    const int64_t *d = all + (size_t)q * words;
    if (d[D_MAGIC] != CHECK_MAGIC || d[D_RANK] != q || d[D_NRANKS] != plan->nranks) {
      st = fail(err, FD_STATUS_INVALID_ARGUMENT,
                "check_shapes: rank %d sent no description (check_shapes set on some ranks only? "
                "inside a caller's ncclGroupStart, where it cannot work?)", q);
      break;
    }
    for (int f = D_DTYPE; f < D_COUNT; f++)
      if (d[f] != want[f]) {
        st = fail(err, FD_STATUS_INVALID_ARGUMENT,
                  "check_shapes: rank %d has %s %lld, this rank (%d) has %lld: every rank must "
                  "merge the same shapes", q, D_NAMES[f], (long long)d[f], plan->rank,
                  (long long)want[f]);
        break;
      }
  }
  free(all);
  return st;
}

fd_status fd_nccl_gather(const fd_nccl_plan *plan, ncclComm_t comm, const void *local_out,
                         const float *local_lse, void *workspace, size_t workspace_size,
                         void *stream, fd_error *err) {
  fd_status st;
  if ((st = check_plan(plan, err)) != FD_STATUS_OK) return st;
  if ((st = check_workspace(plan, workspace, workspace_size, err)) != FD_STATUS_OK) return st;
  if ((st = check_comm(plan, comm, err)) != FD_STATUS_OK) return st;
  void *slot_out = NULL;
  float *slot_lse = NULL;
  fd_nccl_local_slot(plan, workspace, &slot_out, &slot_lse, NULL);
  if ((st = check_local("local_out", local_out, fd_dtype_size(plan->problem.dtype),
                        plan->local_out_bytes, slot_out, workspace, workspace_size, err)) != FD_STATUS_OK)
    return st;
  if ((st = check_local("local_lse", local_lse, sizeof(float), plan->local_lse_bytes, slot_lse,
                        workspace, workspace_size, err)) != FD_STATUS_OK)
    return st;
  char *ws = (char *)workspace;
  if (plan->problem.check_shapes && (st = check_shapes(plan, comm, ws, stream, err)) != FD_STATUS_OK)
    return st;

  /* One group: NCCL runs both gathers as one operation. */
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return nccl_fail(err, "ncclGroupStart", r, comm);
  const char *call = "ncclAllGather (states out)";
  r = ncclAllGather(local_out, ws + plan->ws_states_out, plan->local_out_bytes, ncclUint8, comm,
                    (cudaStream_t)stream);
  if (r == ncclSuccess || r == ncclInProgress) {
    call = "ncclAllGather (states lse)";
    r = ncclAllGather(local_lse, ws + plan->ws_states_lse, plan->local_lse_bytes, ncclUint8, comm,
                      (cudaStream_t)stream);
  }
  const ncclResult_t end = ncclGroupEnd(); /* always: the group must be closed */
  if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(err, call, r, comm);
  if (end == ncclInProgress) {
    if ((st = wait_enqueued(comm, "ncclGroupEnd (states gather)", err)) != FD_STATUS_OK) return st;
  } else if (end != ncclSuccess) {
    return nccl_fail(err, "ncclGroupEnd (states gather)", end, comm);
  }
  return ok(err);
}

/* ---- Merge ------------------------------------------------------------------- */

/* out / lse: aligned, and clear of the whole workspace (fd_merge_states
 * checks them against the states it reads, not against the rest). */
static fd_status check_outputs(const fd_nccl_plan *plan, const void *workspace, const void *out,
                               const float *lse, fd_error *err) {
  const fd_nccl_problem *p = &plan->problem;
  const size_t rows = (size_t)p->batch * p->q_len * p->num_heads;
  const size_t out_size = fd_dtype_size(p->out_dtype);
  if (!out) return fail(err, FD_STATUS_INVALID_ARGUMENT, "out: NULL");
  if ((uintptr_t)out % out_size)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "out: %p is not aligned to its %zu-byte elements",
                out, out_size);
  if ((uintptr_t)lse % sizeof(float))
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "lse: %p is not aligned to its 4-byte elements",
                (const void *)lse);
  const uintptr_t wlo = (uintptr_t)workspace, whi = wlo + plan->workspace_size;
  if ((uintptr_t)out < whi && wlo < (uintptr_t)out + rows * p->head_dim * out_size)
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "out: its bytes overlap the workspace's");
  if (lse && (uintptr_t)lse < whi && wlo < (uintptr_t)lse + rows * sizeof(float))
    return fail(err, FD_STATUS_INVALID_ARGUMENT, "lse: its bytes overlap the workspace's");
  return FD_STATUS_OK;
}

fd_status fd_nccl_merge_gathered(const fd_nccl_plan *plan, const void *workspace,
                                 size_t workspace_size, void *out, float *lse, void *stream,
                                 fd_error *err) {
  fd_status st;
  if ((st = check_plan(plan, err)) != FD_STATUS_OK) return st;
  if ((st = check_workspace(plan, workspace, workspace_size, err)) != FD_STATUS_OK) return st;
  if ((st = check_outputs(plan, workspace, out, lse, err)) != FD_STATUS_OK) return st;
  const fd_nccl_problem *p = &plan->problem;
  fd_merge_problem mp;
  memset(&mp, 0, sizeof mp);
  mp.backend = fd_nccl_glue_merge_backend();
  mp.dtype = p->dtype;
  mp.out_dtype = p->out_dtype;
  mp.num_states = plan->num_states;
  mp.batch = p->batch;
  mp.q_len = p->q_len;
  mp.num_heads = p->num_heads;
  mp.head_dim = p->head_dim;
  mp.device = plan->device;
  const char *ws = (const char *)workspace;
  return fd_merge_states(&mp, ws + plan->ws_states_out, (const float *)(ws + plan->ws_states_lse),
                         out, lse, stream, err);
}

fd_status fd_nccl_merge(const fd_nccl_plan *plan, ncclComm_t comm, const void *local_out,
                        const float *local_lse, void *workspace, size_t workspace_size, void *out,
                        float *lse, void *stream, fd_error *err) {
  /* Every local check before the gather, so that a bad argument is refused
   * before this rank takes part in any collective. */
  fd_status st;
  if ((st = check_plan(plan, err)) != FD_STATUS_OK) return st;
  if ((st = check_workspace(plan, workspace, workspace_size, err)) != FD_STATUS_OK) return st;
  if ((st = check_outputs(plan, workspace, out, lse, err)) != FD_STATUS_OK) return st;
  st = fd_nccl_gather(plan, comm, local_out, local_lse, workspace, workspace_size, stream, err);
  if (st != FD_STATUS_OK) return st;
  return fd_nccl_merge_gathered(plan, workspace, workspace_size, out, lse, stream, err);
}

/* ---- Waiting with a timeout ------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fd_status fd_nccl_wait(ncclComm_t comm, void *stream, double timeout_s, int abort_on_timeout,
                       fd_error *err) {
  if (!comm) return fail(err, FD_STATUS_INVALID_ARGUMENT, "comm: NULL");
  const double start = now_s();
  for (;;) {
    int done = 0;
    fd_status st = fd_nccl_glue_stream_done(stream, &done, err);
    if (st != FD_STATUS_OK) return st;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return nccl_fail(err, "ncclCommGetAsyncError", r, comm);
    if (state != ncclSuccess && state != ncclInProgress)
      return nccl_fail(err, "NCCL asynchronous error (ncclCommGetAsyncError)", state, comm);
    if (done) return ok(err);
    const double waited = now_s() - start;
    if (timeout_s > 0 && waited > timeout_s) {
      if (!abort_on_timeout)
        return fail(err, FD_STATUS_BACKEND_ERROR,
                    "timed out after %.3g s waiting for the stream (communicator left as is)", waited);
      const ncclResult_t a = ncclCommAbort(comm);
      return fail(err, FD_STATUS_BACKEND_ERROR,
                  "timed out after %.3g s waiting for the stream: ncclCommAbort called (%s); the "
                  "communicator is gone and out / lse are undefined",
                  waited, ncclGetErrorString(a));
    }
    const struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}
