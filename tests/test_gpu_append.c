/*
 * test_gpu_append.c — fd_append_kv on CUDA writes the same bytes (cache and
 * per-token scales) as the host code, for both fp8 formats, every scale
 * granularity, contiguous and paged caches, NaN (either sign: the code keeps
 * it) / inf / huge inputs and 16-bit copies; rows outside the cache (past
 * kv_capacity, or a page id outside [0, num_pages)) are skipped on the
 * device with nothing else written; and a captured CUDA graph replays the
 * append at new kv_len values. Exits 77 (ctest: skipped) when no usable GPU
 * is present.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#ifdef FD_TEST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "append_fixture.h"
#include "gpu_mem.h"

/* Device copies of f's tensors; f->t then points at them (the host arrays
 * stay as they were). */
typedef struct device_copy {
  void *k_new, *v_new, *k_cache, *v_cache, *k_scale, *v_scale, *kv_len, *block_table;
} device_copy;

static void upload(void **dst, const void *src, size_t n) {
  if (fd_gpu_malloc(dst, n) || fd_gpu_upload(*dst, src, n)) fail_msg("device copy failed");
}

static void to_device(append_fixture *f, device_copy *d) {
  upload(&d->k_new, f->k_new, sizeof f->k_new);
  upload(&d->v_new, f->v_new, sizeof f->v_new);
  upload(&d->k_cache, f->k_cache, sizeof f->k_cache);
  upload(&d->v_cache, f->v_cache, sizeof f->v_cache);
  upload(&d->k_scale, f->k_scale, sizeof f->k_scale);
  upload(&d->v_scale, f->v_scale, sizeof f->v_scale);
  upload(&d->kv_len, f->kv_len, sizeof f->kv_len);
  upload(&d->block_table, f->block_table, sizeof f->block_table);
  f->t.k_new = d->k_new;
  f->t.v_new = d->v_new;
  f->t.k_cache = d->k_cache;
  f->t.v_cache = d->v_cache;
  f->t.kv_len = d->kv_len;
  if (f->t.block_table) f->t.block_table = d->block_table;
  if (f->t.k_scale) f->t.k_scale = d->k_scale, f->t.v_scale = d->v_scale;
}

static void from_device(append_fixture *f, device_copy *d) {
  if (fd_gpu_synchronize() || fd_gpu_download(f->k_cache, d->k_cache, sizeof f->k_cache) ||
      fd_gpu_download(f->v_cache, d->v_cache, sizeof f->v_cache) ||
      fd_gpu_download(f->k_scale, d->k_scale, sizeof f->k_scale) ||
      fd_gpu_download(f->v_scale, d->v_scale, sizeof f->v_scale))
    fail_msg("device copy back failed (kernel error?)");
  void *all[8] = {d->k_new, d->v_new, d->k_cache, d->v_cache, d->k_scale, d->v_scale, d->kv_len, d->block_table};
  for (int i = 0; i < 8; i++) fd_gpu_free(all[i]);
}

/* Appends host's tensors on the host (reference backend) and dev's (the same
 * values) on CUDA: equal bytes. */
static void append_both(append_fixture *host, append_fixture *dev) {
  fd_error err;
  if (fd_append_kv(&host->plan, &host->t, AMAXNEW, NULL, &err) != FD_STATUS_OK)
    fail_msg("host append: %s", err.message);
  device_copy d = {0};
  to_device(dev, &d);
  if (fd_append_kv(&dev->plan, &dev->t, AMAXNEW, NULL, &err) != FD_STATUS_OK) fail_msg("cuda append: %s", err.message);
  from_device(dev, &d);
  assert_memory_equal(host->k_cache, dev->k_cache, sizeof host->k_cache);
  assert_memory_equal(host->v_cache, dev->v_cache, sizeof host->v_cache);
  assert_memory_equal(host->k_scale, dev->k_scale, sizeof host->k_scale);
  assert_memory_equal(host->v_scale, dev->v_scale, sizeof host->v_scale);
}

/* Host (reference backend) and CUDA append of the same fixture: equal bytes. */
static void compare(fd_dtype dtype, fd_dtype kv_dtype, fd_kv_scale scale, int paged) {
  static append_fixture host, dev;
  fd_error err;
  if (append_fixture_init(&host, FD_BACKEND_REFERENCE, dtype, kv_dtype, scale, paged, 1, 77, &err) ||
      append_fixture_init(&dev, FD_BACKEND_CUDA, dtype, kv_dtype, scale, paged, 1, 77, &err))
    fail_msg("fd_plan_init: %s", err.message);
  append_both(&host, &dev);
}

static void test_same_bytes(void **state) {
  (void)state;
  const fd_dtype kv[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2}, q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  for (int k = 0; k < 2; k++)
    for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++)
      for (int paged = 0; paged < 2; paged++)
        for (int qi = 0; qi < 2; qi++) compare(q[qi], kv[k], (fd_kv_scale)s, paged);
  for (int paged = 0; paged < 2; paged++) {
    compare(FD_DTYPE_BF16, FD_DTYPE_BF16, FD_KV_SCALE_NONE, paged);
    compare(FD_DTYPE_F16, FD_DTYPE_F16, FD_KV_SCALE_NONE, paged);
  }
}

/* Byte offset of (sequence b, position j, kv head hk)'s row in f's fp8 cache. */
static size_t fp8_row(const append_fixture *f, int b, int j, int hk) {
  if (f->problem.page_size == 0) return (((size_t)b * ACAP + j) * AHKV + hk) * AD;
  const int page = f->block_table[b * APAGES + j / APAGE];
  return (((size_t)page * APAGE + j % APAGE) * AHKV + hk) * AD;
}

/* A NaN keeps its sign: +NaN -> 0x7f, -NaN -> 0xff (S.1111.111 / S.11111.11),
 * on the device as on the host, both formats, every scale granularity, both q
 * dtypes, contiguous and paged. The GPU's division returns the canonical NaN
 * 0x7fffffff for any NaN operand, so a quantizer that divided first wrote
 * 0x7f for a negative NaN where the CPU wrote 0xff: torch's bf16 NaN is
 * 0xffff, and tests/python/test_cuda_fp8.py's append cases all failed on the
 * H200 while this file's fixture (positive NaNs only) passed. */
static void test_nan_sign(void **state) {
  (void)state;
  static append_fixture host, dev;
  fd_error err;
  const fd_dtype kv[2] = {FD_DTYPE_E4M3, FD_DTYPE_E5M2}, q[2] = {FD_DTYPE_BF16, FD_DTYPE_F16};
  const uint16_t neg_nan[2] = {0xffffu, 0xfe00u}, pos_nan[2] = {0x7fc0u, 0x7e00u}; /* bf16, f16 */
  for (int k = 0; k < 2; k++)
    for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++)
      for (int paged = 0; paged < 2; paged++)
        for (int qi = 0; qi < 2; qi++) {
          if (append_fixture_init(&host, FD_BACKEND_REFERENCE, q[qi], kv[k], (fd_kv_scale)s, paged, 0, 21, &err) ||
              append_fixture_init(&dev, FD_BACKEND_CUDA, q[qi], kv[k], (fd_kv_scale)s, paged, 0, 21, &err))
            fail_msg("fd_plan_init: %s", err.message);
          append_fixture *both[2] = {&host, &dev};
          for (int f = 0; f < 2; f++) {
            both[f]->k_new[0] = neg_nan[qi]; /* b 0, token 0, kv head 0, d 0 */
            both[f]->k_new[1] = pos_nan[qi];
            both[f]->v_new[AD + 3] = neg_nan[qi]; /* kv head 1, d 3 */
          }
          append_both(&host, &dev);
          const size_t k0 = fp8_row(&dev, 0, dev.kv_len[0], 0), v1 = fp8_row(&dev, 0, dev.kv_len[0], 1);
          if (dev.k_cache[k0] != 0xff || dev.k_cache[k0 + 1] != 0x7f || dev.v_cache[v1 + 3] != 0xff)
            fail_msg("kv %d scale %d paged %d q %d: NaN codes k 0x%02x 0x%02x v 0x%02x, want 0xff 0x7f 0xff", k, s,
                     paged, qi, dev.k_cache[k0], dev.k_cache[k0 + 1], dev.v_cache[v1 + 3]);
        }
}

/* Rows the device must skip: sequence 2 three tokens from the end of the
 * cache (4 of 7 rows beyond it), sequence 1's second page id -1, sequence
 * 0's kv_len negative. Only sequence 1's first-page rows (positions 5..7)
 * and sequence 2's first 3 rows may be written. */
static void out_of_range(append_fixture *f) {
  f->kv_len[0] = -4;
  f->kv_len[2] = ACAP - 3;
  f->block_table[1 * APAGES + 1] = -1;
}

static void test_skipped_rows(void **state) {
  (void)state;
  static append_fixture dev;
  fd_error err;
  for (int s = FD_KV_SCALE_NONE; s <= FD_KV_SCALE_TOKEN; s++) {
    if (append_fixture_init(&dev, FD_BACKEND_CUDA, FD_DTYPE_BF16, FD_DTYPE_E4M3, (fd_kv_scale)s, 1, 0, 3, &err))
      fail_msg("fd_plan_init: %s", err.message);
    out_of_range(&dev);
    device_copy d = {0};
    to_device(&dev, &d);
    if (fd_append_kv(&dev.plan, &dev.t, AMAXNEW, NULL, &err) != FD_STATUS_OK) fail_msg("cuda append: %s", err.message);
    from_device(&dev, &d);
    /* count written rows of k: (page, position, head) blocks of AD bytes not all sentinel */
    int written = 0;
    for (size_t r = 0; r < sizeof dev.k_cache / AD; r++) {
      int any = 0;
      for (int i = 0; i < AD; i++) any |= dev.k_cache[r * AD + i] != CACHE_SENTINEL;
      written += any;
    }
    /* sequence 1: positions 5, 6, 7 (first page); sequence 2: 3 rows; x AHKV heads */
    if (written != (3 + 3) * AHKV) fail_msg("scale %d: %d rows written, want %d", s, written, 6 * AHKV);
  }
}

#ifdef FD_TEST_HAVE_CUDA
/* Capture one append, then replay it at two kv_len values set in device memory. */
static void test_graph(void **state) {
  (void)state;
  static append_fixture host, dev;
  fd_error err;
  assert_int_equal(append_fixture_init(&dev, FD_BACKEND_CUDA, FD_DTYPE_BF16, FD_DTYPE_E5M2, FD_KV_SCALE_TOKEN, 1, 0, 11, &err), 0);
  assert_int_equal(append_fixture_init(&host, FD_BACKEND_REFERENCE, FD_DTYPE_BF16, FD_DTYPE_E5M2, FD_KV_SCALE_TOKEN, 1, 0, 11, &err), 0);
  device_copy d = {0};
  to_device(&dev, &d);
  cudaStream_t stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  assert_int_equal(cudaStreamCreate(&stream), cudaSuccess);
  assert_int_equal(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  assert_int_equal(fd_append_kv(&dev.plan, &dev.t, 2, stream, &err), FD_STATUS_OK);
  assert_int_equal(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const int32_t lens[2][AB] = {{0, 5, 20}, {2, 7, 22}};
  static uint16_t k2[AB * 2 * AHKV * AD], v2[AB * 2 * AHKV * AD];
  for (int step = 0; step < 2; step++) {
    assert_int_equal(cudaMemcpy(d.kv_len, lens[step], sizeof lens[step], cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(exec, stream), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    /* the host: the same 2 tokens a sequence at those lengths (k_new is
     * [AB, 2, ...] for the captured call: its first 2 * AHKV * AD values a sequence) */
    memcpy(host.kv_len, lens[step], sizeof host.kv_len);
    memcpy(k2, host.k_new, sizeof k2);
    memcpy(v2, host.v_new, sizeof v2);
    fd_append_tensors t = host.t;
    t.k_new = k2;
    t.v_new = v2;
    assert_int_equal(fd_append_kv(&host.plan, &t, 2, NULL, &err), FD_STATUS_OK);
  }
  from_device(&dev, &d);
  assert_memory_equal(host.k_cache, dev.k_cache, sizeof host.k_cache);
  assert_memory_equal(host.v_scale, dev.v_scale, sizeof host.v_scale);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif

int main(void) {
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    printf("SKIP: the CUDA backend is not available (not built with CUDA, or no GPU of compute capability 8.0+)\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_bytes),
      cmocka_unit_test(test_nan_sign),
      cmocka_unit_test(test_skipped_rows),
#ifdef FD_TEST_HAVE_CUDA
      cmocka_unit_test(test_graph),
#endif
  };
  return cmocka_run_group_tests_name("gpu_append", tests, NULL, NULL);
}
