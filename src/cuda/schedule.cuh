/*
 * schedule.cuh — the longest-first order of a ragged batch's work items, for
 * the persistent split kernel (split_mma_kernel.cu, plans with
 * sched_blocks > 0; see plan.c and flashdecode.h, HOW).
 *
 * ITEMS  Sequence b has S_b = fd_seq_splits(kv_len[b], num_splits,
 *   split_len) splits of about the same length, so num_heads_kv * S_b items
 *   (kv head hk, split s) of kv_len[b] / S_b keys each. The items are laid
 *   out sequence by sequence, the sequences in decreasing order of their
 *   item length (bucketed to split_len / 32 keys; ties in batch order), and
 *   within a sequence item hk * S_b + s.
 *
 * BUILD  Every block builds the same order from kv_len in its own shared
 *   memory (warp 0; a counting sort over 64 buckets, stable, so every block
 *   gets the identical order): order[i] = the i-th sequence, prefix[i] = the
 *   items before it, prefix[batch] = all items. O(batch / 32) warp steps:
 *   ~1 us a block at batch 512, once per persistent block.
 *
 * ASSIGNMENT  (fd_sched_index) Persistent block j of G takes items
 *   j, 2G - 1 - j, 2G + j, 4G - 1 - j, ... (row r of G items left to right
 *   when r is even, right to left when odd): with the items sorted longest
 *   first, each block gets a near-equal share of the work without an atomic
 *   counter (which would need a workspace zeroed before every call). Every
 *   item computes the same result whichever block runs it.
 *
 * Internal to src/cuda.
 */
#ifndef FD_CUDA_SCHEDULE_CUH
#define FD_CUDA_SCHEDULE_CUH

#include <stdint.h>

#include "kernel_params.cuh"
#include "split.h"

#define FD_SCHED_BUCKETS 64

/* Shared-memory ints of the schedule: order[FD_SCHED_MAX_BATCH],
 * prefix[FD_SCHED_MAX_BATCH + 1], bucket counts[FD_SCHED_BUCKETS], then the
 * block's current item (b, hk, split) at FD_SCHED_ITEM_OFFSET. */
#define FD_SCHED_ITEM_OFFSET (2 * FD_SCHED_MAX_BATCH + 1 + FD_SCHED_BUCKETS)
#define FD_SCHED_SMEM_BYTES ((FD_SCHED_ITEM_OFFSET + 3) * 4)

/* kv_len[b] clamped to [0, kv_capacity], as every kernel reads it. */
static __device__ __forceinline__ int fd_sched_kv(const fd_kernel_params &p, int b) {
  const int kv = __ldg(p.kv_len + b);
  return kv < 0 ? 0 : (kv > p.kv_capacity ? p.kv_capacity : kv);
}

/* Sort key of sequence b (0 = longest items first): its item length in units
 * of split_len / 32, longest bucket 0; lengths past 2 * split_len (a kv_len
 * above the plan's hint) share bucket 0. */
static __device__ __forceinline__ int fd_sched_key(const fd_kernel_params &p, int kv) {
  const int s = fd_seq_splits(kv, p.num_splits, p.split_len);
  const int64_t len = kv > 0 ? fd_split_len(kv, p.chunk_len, s) : 0;
  int64_t bucket = len * 32 / p.split_len;
  if (bucket > FD_SCHED_BUCKETS - 1) bucket = FD_SCHED_BUCKETS - 1;
  return FD_SCHED_BUCKETS - 1 - (int)bucket;
}

static __device__ __forceinline__ int fd_sched_items(const fd_kernel_params &p, int kv) {
  return fd_seq_splits(kv, p.num_splits, p.split_len) * p.num_heads_kv;
}

/* Builds order and prefix (smem, FD_SCHED_SMEM_BYTES at `smem`) for the whole
 * block; returns the number of items. Contains one __syncthreads. */
static __device__ __forceinline__ int fd_sched_build(const fd_kernel_params &p, int *smem) {
  int *order = smem;
  int *prefix = order + FD_SCHED_MAX_BATCH;
  int *count = prefix + FD_SCHED_MAX_BATCH + 1;
  const int B = p.batch;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    for (int i = lane; i < FD_SCHED_BUCKETS; i += 32) count[i] = 0;
    __syncwarp();
    for (int b = lane; b < B; b += 32) atomicAdd(&count[fd_sched_key(p, fd_sched_kv(p, b))], 1);
    __syncwarp();
    /* Exclusive prefix of the counts: lane holds buckets 2 lane, 2 lane + 1. */
    const int c0 = count[2 * lane], c1 = count[2 * lane + 1];
    int incl = c0 + c1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    __syncwarp();
    count[2 * lane] = incl - c0 - c1;
    count[2 * lane + 1] = incl - c1;
    __syncwarp();
    /* Stable scatter, 32 sequences a step in batch order. */
    const unsigned lt = (1u << lane) - 1u;
    for (int b0 = 0; b0 < B; b0 += 32) {
      const int b = b0 + lane;
      const int key = b < B ? fd_sched_key(p, fd_sched_kv(p, b)) : FD_SCHED_BUCKETS;
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      const int rank = __popc(peers & lt);
      const int base = key < FD_SCHED_BUCKETS ? count[key] : 0;
      __syncwarp();
      if (key < FD_SCHED_BUCKETS) {
        order[base + rank] = b;
        if (rank == 0) count[key] = base + __popc(peers);
      }
      __syncwarp();
    }
    /* Items before each sequence of the order. */
    int carry = 0;
    if (lane == 0) prefix[0] = 0;
    for (int i0 = 0; i0 < B; i0 += 32) {
      const int i = i0 + lane;
      int n = i < B ? fd_sched_items(p, fd_sched_kv(p, order[i])) : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, n, o);
        if (lane >= o) n += y;
      }
      if (i < B) prefix[i + 1] = carry + n;
      carry += __shfl_sync(0xffffffffu, n, 31);
    }
  }
  __syncthreads();
  return prefix[B];
}

/* Item index of round `round` of persistent block `block` of `blocks`. */
static __device__ __forceinline__ int64_t fd_sched_index(int round, int block, int blocks) {
  return (int64_t)round * blocks + ((round & 1) ? blocks - 1 - block : block);
}

/* The (sequence b, kv head hk, split s, the sequence's split count) of item
 * `item` (< the item count). Binary search of prefix. */
static __device__ __forceinline__ void fd_sched_item(const fd_kernel_params &p, const int *smem,
                                                     int item, int *b, int *hk, int *s,
                                                     int *splits) {
  const int *order = smem;
  const int *prefix = order + FD_SCHED_MAX_BATCH;
  int lo = 0, hi = p.batch - 1; /* the last i with prefix[i] <= item */
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (prefix[mid] <= item) lo = mid;
    else hi = mid - 1;
  }
  const int seq = order[lo];
  const int n = fd_seq_splits(fd_sched_kv(p, seq), p.num_splits, p.split_len);
  const int local = item - prefix[lo];
  *b = seq;
  *hk = local / n;
  *s = local - *hk * n;
  *splits = n;
}

#endif /* FD_CUDA_SCHEDULE_CUH */
