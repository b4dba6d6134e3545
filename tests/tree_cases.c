/*
 * tree_cases.c — speculative-decoding draft trees for the tests: the mask
 * generators (EAGLE-shaped, the same shuffled, Medusa-like wide, chains,
 * rows that see only themselves) and the harness grids that test_tree (CPU
 * and reference backends) and test_gpu_tree (CUDA) run against the float64
 * oracle: q_len 1, 5, 9, 16, 37 and 64; ragged batches with kv_len ==
 * q_len (no prefix) and kv_len < q_len.
 */
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "harness.h"

/* ---- Trees ---------------------------------------------------------------------- */

/* An EAGLE-shaped tree of n nodes in topological order: node 0 the root, node
 * t's parent a random earlier node biased to recent ones (deep, bushy). Row
 * t's mask holds t and its ancestors. */
void fd_tree_eagle(fd_rng *r, int n, uint64_t *mask) {
  for (int t = 0; t < n; t++) {
    if (t == 0) {
      mask[0] = 1;
      continue;
    }
    const int lo = t > 8 ? t - 8 : 0;
    const int parent = lo + (int)fd_rng_below(r, (uint64_t)(t - lo));
    mask[t] = mask[parent] | ((uint64_t)1 << t);
  }
}

/* The same tree with its nodes renumbered by a random permutation (masks no
 * longer lower-triangular). */
void fd_tree_shuffle(fd_rng *r, int n, uint64_t *mask) {
  int perm[64];
  uint64_t out[64];
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    const int j = (int)fd_rng_below(r, (uint64_t)i + 1), x = perm[i];
    perm[i] = perm[j];
    perm[j] = x;
  }
  for (int t = 0; t < n; t++) {
    uint64_t m = 0;
    for (int j = 0; j < n; j++)
      if ((mask[t] >> j) & 1u) m |= (uint64_t)1 << perm[j];
    out[perm[t]] = m;
  }
  memcpy(mask, out, (size_t)n * sizeof *mask);
}

/* Medusa-like: a root, then heads of width w each continuing node (t-1)/w. */
void fd_tree_wide(int n, int w, uint64_t *mask) {
  mask[0] = 1;
  for (int t = 1; t < n; t++) mask[t] = mask[(t - 1) / w] | ((uint64_t)1 << t);
}

void fd_tree_chain(int n, uint64_t *mask) {
  for (int t = 0; t < n; t++) mask[t] = t == 63 ? ~(uint64_t)0 : ((uint64_t)1 << (t + 1)) - 1;
}

void fd_tree_self(int n, uint64_t *mask) {
  for (int t = 0; t < n; t++) mask[t] = (uint64_t)1 << t;
}

/* ---- The grids ------------------------------------------------------------------- */

/* q_len and kind (0 eagle, 1 shuffled, 2 wide, 3 chain, 4 self) of each tree */
static const struct {
  int q_len, kind;
} trees[] = {{1, 0}, {5, 0}, {16, 1}, {37, 2}, {64, 0}, {64, 1}, {16, 3}, {64, 3}, {9, 4}, {64, 4}};
#define TREES ((int)(sizeof trees / sizeof trees[0]))
static const char *kind_name[] = {"eagle", "shuffled", "wide", "chain", "self"};

/* The masks the cases point at (test data, one grid a process). */
static uint64_t g_masks[FD_TREE_MAX_CASES][FD_CASE_MAX_BATCH * 64];

static void fill_masks(fd_rng *r, int kind, int T, int batch, uint64_t *m) {
  for (int b = 0; b < batch; b++) {
    uint64_t *row = m + b * T;
    switch (kind) {
      case 0: fd_tree_eagle(r, T, row); break;
      case 1: fd_tree_eagle(r, T, row), fd_tree_shuffle(r, T, row); break;
      case 2: fd_tree_wide(T, 4, row); break;
      case 3: fd_tree_chain(T, row); break;
      default: fd_tree_self(T, row); break;
    }
  }
}

/* CPU: f32, f16, bf16 and fp8 caches, head_dim 40/64/128, MHA/GQA/MQA,
 * every instruction set, then the reference backend through fd_run. */
static int cpu_cases(uint64_t seed, fd_case *cases, int max) {
  fd_rng r = {fd_mix64(seed ^ 0x7472656573ull)};
  int n = 0;
  const fd_dtype dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int i = 0; i < TREES; i++)
    for (int v = 0; v < 4 && n < max; v++) {
      fd_case c;
      memset(&c, 0, sizeof c);
      const int T = trees[i].q_len;
      c.backend = FD_BACKEND_CPU;
      c.dtype = dtypes[(i + v) % 3];
      c.head_dim = v == 3 ? 64 : (i % 2 ? 128 : 40);
      c.num_heads_q = v == 1 ? 8 : 4;
      c.num_heads_kv = v == 1 ? 2 : (v == 2 ? 1 : 4);
      c.batch = 3;
      c.kv_len[0] = T + 300 + 17 * i;     /* a prefix over several blocks */
      c.kv_len[1] = T;                     /* no prefix */
      c.kv_len[2] = v == 0 ? T / 2 : 1000; /* kv_len < q_len (drafts cut off), or longer */
      c.q_len = T;
      c.page_size = v % 2 ? 16 : 0;
      c.num_splits = v == 0 ? 0 : (v == 1 ? 7 : (v == 2 ? 1 : 3));
      c.with_lse = 1;
      c.layout = v == 2 ? FD_LAYOUT_NONCONTIG : FD_LAYOUT_CONTIG;
      c.check_splits = v == 1;
      if (v == 2) c.logits_soft_cap = 20.0f;
      if (v == 3) c.sinks = 1;
      if (v == 3 && c.dtype != FD_DTYPE_F32) {
        c.kv_dtype = FD_DTYPE_E4M3;
        c.kv_scale = i % 2 ? FD_KV_SCALE_TOKEN : FD_KV_SCALE_TENSOR;
      }
      if (i == 4 && v == 0) c.cpu_isa = 1; /* the scalar kernels */
      if (i == 5 && v == 0 && fd_cpu_isa_detect() > FD_CPU_ISA_AVX2) c.cpu_isa = 2; /* AVX2 forced */
      fill_masks(&r, trees[i].kind, T, c.batch, g_masks[n]);
      c.tree_mask = g_masks[n];
      c.tree_name = kind_name[trees[i].kind];
      cases[n++] = c;
    }
  /* the reference backend through fd_run */
  for (int i = 0; i < 2 && n < max; i++) {
    cases[n] = cases[4 * i + 1];
    cases[n].backend = FD_BACKEND_REFERENCE;
    cases[n].num_splits = 0;
    cases[n].check_splits = 0;
    n++;
  }
  return n;
}

/* CUDA (the rows kernel: fp16 / bf16, head_dim 64 and 128): Llama-8B heads
 * (32:8, d128), gpt-oss heads (64:8, d64), MQA, MHA; contiguous, strided
 * and paged (16: one page id a tile; 1 and 3: one a key; 64); automatic,
 * one and forced split counts; keys past one split; soft-cap, sinks, fp32
 * out. Every case also runs twice (bitwise equal). */
static int cuda_cases(uint64_t seed, fd_case *cases, int max) {
  fd_rng r = {fd_mix64(seed ^ 0x6375646174726565ull)};
  int n = 0;
  for (int i = 0; i < TREES; i++)
    for (int v = 0; v < 5 && n < max; v++) {
      fd_case c;
      memset(&c, 0, sizeof c);
      const int T = trees[i].q_len;
      c.backend = FD_BACKEND_CUDA;
      c.dtype = (i + v) % 2 ? FD_DTYPE_F16 : FD_DTYPE_BF16;
      static const int shapes[5][3] = {{128, 32, 8}, {64, 64, 8}, {128, 8, 1}, {128, 4, 4}, {64, 16, 2}};
      c.head_dim = shapes[v][0];
      c.num_heads_q = shapes[v][1];
      c.num_heads_kv = shapes[v][2];
      c.batch = 3;
      c.kv_len[0] = T + 300 + 17 * i;
      c.kv_len[1] = T;
      c.kv_len[2] = v == 0 ? T / 2 : 1000;
      if (v == 4) c.kv_len[0] = 5000 + T, c.kv_len[1] = 2 * T + 1;
      c.q_len = T;
      static const int pages[5] = {0, 16, 0, 1, 64};
      c.page_size = pages[v] == 1 && i % 2 ? 3 : pages[v];
      c.num_splits = v == 0 ? 0 : (v == 1 ? 7 : (v == 2 ? 1 : (v == 3 ? 3 : 0)));
      c.with_lse = 1;
      c.layout = v == 2 ? FD_LAYOUT_NONCONTIG : FD_LAYOUT_CONTIG;
      c.check_splits = v == 1;
      c.check_determinism = 1;
      if (v == 2) c.logits_soft_cap = 20.0f;
      if (v == 3) c.sinks = 1;
      if (v == 4) c.out_f32 = 1;
      fill_masks(&r, trees[i].kind, T, c.batch, g_masks[n]);
      c.tree_mask = g_masks[n];
      c.tree_name = kind_name[trees[i].kind];
      cases[n++] = c;
    }
  return n;
}

int fd_tree_cases(fd_backend backend, uint64_t seed, fd_case *cases, int max) {
  if (max > FD_TREE_MAX_CASES) max = FD_TREE_MAX_CASES;
  return backend == FD_BACKEND_CUDA ? cuda_cases(seed, cases, max) : cpu_cases(seed, cases, max);
}
