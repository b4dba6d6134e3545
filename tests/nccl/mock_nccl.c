/*
 * mock_nccl.c — see mock_nccl.h. Collectives execute at the outermost
 * ncclGroupEnd (or at once outside a group): the calling thread posts the
 * gathers of the ranks it drives, waits until every rank of the world has
 * posted (a barrier counting ranks, not threads), copies every rank's send
 * buffer into its own ranks' receive buffers, and waits again so that no
 * send buffer changes while another rank reads it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock_nccl.h"
#include "nccl_glue.h"

mock_controls mock;

#define MAX_OPS 8

typedef struct op {
  const void *send;
  void *recv;
  size_t bytes;
} op;

typedef struct mock_world {
  int nranks;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned gen;
  op ops[MOCK_MAX_RANKS][MAX_OPS];
  int nops[MOCK_MAX_RANKS];
} mock_world;

struct ncclComm {
  mock_world *world;
  int rank;
  int polls_left;
};

/* The calling thread's open group: its depth and the gathers posted. */
static _Thread_local int group_depth;
static _Thread_local struct pending {
  ncclComm_t comm;
  op o;
} pending[MOCK_MAX_RANKS * MAX_OPS];
static _Thread_local int npending;
static _Thread_local char last_error[128];

void mock_world_create(ncclComm_t *comms, int nranks) {
  memset(&mock, 0, sizeof mock);
  mock_world *w = calloc(1, sizeof *w);
  if (!w || nranks < 1 || nranks > MOCK_MAX_RANKS) abort();
  w->nranks = nranks;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  for (int r = 0; r < nranks; r++) {
    comms[r] = calloc(1, sizeof(struct ncclComm));
    if (!comms[r]) abort();
    comms[r]->world = w;
    comms[r]->rank = r;
  }
}

void mock_world_destroy(ncclComm_t *comms, int nranks) {
  mock_world *w = comms[0]->world;
  for (int r = 0; r < nranks; r++) free(comms[r]);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

/* Blocks until `count` more ranks have arrived and the world is complete. */
static void barrier(mock_world *w, int count) {
  pthread_mutex_lock(&w->mu);
  const unsigned gen = w->gen;
  w->arrived += count;
  if (w->arrived == w->nranks) {
    w->arrived = 0;
    w->gen++;
    pthread_cond_broadcast(&w->cv);
  } else {
    while (gen == w->gen) pthread_cond_wait(&w->cv, &w->mu);
  }
  pthread_mutex_unlock(&w->mu);
}

static void execute_pending(void) {
  if (npending == 0) return;
  mock_world *w = pending[0].comm->world;
  int mine[MOCK_MAX_RANKS] = {0}, count = 0;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < npending; i++) {
    const int r = pending[i].comm->rank;
    if (!mine[r]) count++;
    mine[r] = 1;
    if (w->nops[r] < MAX_OPS) w->ops[r][w->nops[r]++] = pending[i].o;
  }
  pthread_mutex_unlock(&w->mu);
  barrier(w, count);
  for (int r = 0; r < w->nranks; r++) {
    if (!mine[r]) continue;
    for (int k = 0; k < w->nops[r]; k++) {
      const op *o = &w->ops[r][k];
      for (int s = 0; s < w->nranks; s++) {
        if (w->nops[s] != w->nops[r] || w->ops[s][k].bytes != o->bytes) {
          __atomic_store_n(&mock.mismatched, 1, __ATOMIC_RELAXED); /* real NCCL: hang or corruption */
          continue;
        }
        memmove((char *)o->recv + (size_t)s * o->bytes, w->ops[s][k].send, o->bytes);
      }
    }
  }
  barrier(w, count);
  pthread_mutex_lock(&w->mu);
  for (int r = 0; r < w->nranks; r++)
    if (mine[r]) w->nops[r] = 0;
  pthread_mutex_unlock(&w->mu);
  npending = 0;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  (void)stream;
  __atomic_add_fetch(&mock.allgathers, 1, __ATOMIC_RELAXED);
  if (mock.fail_allgather != ncclSuccess) {
    if (mock.fail_allgather_index-- == 0) {
      const ncclResult_t r = mock.fail_allgather;
      mock.fail_allgather = ncclSuccess;
      snprintf(last_error, sizeof last_error, "mock: injected ncclAllGather failure");
      return r;
    }
  }
  if (!comm || !sendbuff || !recvbuff || datatype != ncclUint8) return ncclInvalidArgument;
  if (npending == MOCK_MAX_RANKS * MAX_OPS) return ncclInternalError;
  pending[npending].comm = comm;
  pending[npending].o.send = sendbuff;
  pending[npending].o.recv = recvbuff;
  pending[npending].o.bytes = sendcount;
  npending++;
  if (group_depth == 0) execute_pending();
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  if (mock.fail_group_end != ncclSuccess) {
    const ncclResult_t r = mock.fail_group_end;
    mock.fail_group_end = ncclSuccess;
    npending = 0;
    snprintf(last_error, sizeof last_error, "mock: injected ncclGroupEnd failure");
    return r;
  }
  if (mock.in_progress_polls > 0 && npending > 0) {
    for (int i = 0; i < npending; i++) pending[i].comm->polls_left = mock.in_progress_polls;
    execute_pending(); /* the data moves now; the comm says "in progress" a while */
    return ncclInProgress;
  }
  execute_pending();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (mock.fail_comm_count != ncclSuccess) return mock.fail_comm_count;
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->world->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
  if (!comm || !state) return ncclInvalidArgument;
  if (comm->polls_left > 0) {
    comm->polls_left--;
    *state = ncclInProgress;
    return ncclSuccess;
  }
  *state = mock.async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  (void)comm;
  mock.aborts++;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

/* ---- nccl_glue.h over host memory ---------------------------------------- */

fd_status fd_nccl_glue_capturing(int device, void *stream, int *capturing, fd_error *err) {
  (void)device, (void)stream, (void)err;
  *capturing = mock.capturing;
  return FD_STATUS_OK;
}

fd_status fd_nccl_glue_upload(int device, void *dst, const void *src, size_t bytes, void *stream,
                              fd_error *err) {
  (void)device, (void)stream, (void)err;
  memcpy(dst, src, bytes);
  return FD_STATUS_OK;
}

fd_status fd_nccl_glue_download_sync(int device, void *dst, const void *src, size_t bytes,
                                     void *stream, fd_error *err) {
  (void)device, (void)stream, (void)err;
  memcpy(dst, src, bytes);
  return FD_STATUS_OK;
}

fd_status fd_nccl_glue_stream_done(void *stream, int *done, fd_error *err) {
  (void)stream, (void)err;
  *done = !mock.stream_busy;
  return FD_STATUS_OK;
}

fd_backend fd_nccl_glue_merge_backend(void) { return FD_BACKEND_CPU; }
