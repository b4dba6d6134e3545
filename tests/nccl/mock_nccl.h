/*
 * mock_nccl.h — the NCCL calls src/nccl/nccl_merge.c makes, implemented over
 * host memory (a "world" of ranks driven by threads, or by one thread inside
 * ncclGroupStart / ncclGroupEnd, as with real NCCL), and nccl_glue.h over
 * host memory (the merge then runs on the CPU backend). Lets test_nccl_mock
 * run the multi-GPU merge's logic in CI, where there is no GPU. The controls
 * below inject failures and the states a real communicator can be in.
 */
#ifndef FD_TEST_MOCK_NCCL_H
#define FD_TEST_MOCK_NCCL_H

#include <nccl.h>

#define MOCK_MAX_RANKS 8

/* Make `nranks` communicators of one world (comms[r] is rank r, device r). */
void mock_world_create(ncclComm_t *comms, int nranks);
void mock_world_destroy(ncclComm_t *comms, int nranks);

/* Controls (reset by mock_world_create): */
typedef struct mock_controls {
  ncclResult_t fail_allgather;   /* returned by the next ncclAllGather (ncclSuccess: none) */
  int fail_allgather_index;      /* ... the n-th call from now (0 = the next) */
  ncclResult_t fail_group_end;   /* returned by the next outermost ncclGroupEnd */
  ncclResult_t fail_comm_count;  /* returned by ncclCommCount */
  int in_progress_polls;         /* > 0: ncclGroupEnd returns ncclInProgress and
                                    ncclCommGetAsyncError reports ncclInProgress this
                                    many times before ncclSuccess (non-blocking comm) */
  ncclResult_t async_error;      /* what ncclCommGetAsyncError reports once the polls are done */
  int capturing;                 /* the glue's stream-capture status */
  int stream_busy;               /* the glue's stream never finishes */
  int aborts;                    /* ncclCommAbort calls so far (output) */
  int allgathers;                /* ncclAllGather calls so far (output) */
  int mismatched;                /* a gather whose ranks disagreed on its size (output) */
} mock_controls;
extern mock_controls mock;

#endif /* FD_TEST_MOCK_NCCL_H */
