/*
 * append_fixture.h — one fd_append_kv problem and its host tensors, shared by
 * test_append (CPU, reference) and test_gpu_append (CUDA against the host
 * result): B sequences of a cache of CAP positions (contiguous, or paged in
 * pages of PAGE through a reversed block table), HKV kv heads of head_dim D,
 * new tokens drawn in the q dtype, every cache byte and scale a sentinel.
 */
#ifndef FD_TEST_APPEND_FIXTURE_H
#define FD_TEST_APPEND_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "flashdecode.h"

enum { AB = 3, AHKV = 2, AD = 64, ACAP = 40, APAGE = 8, APAGES = ACAP / APAGE, AMAXNEW = 7 };
#define CACHE_SENTINEL 0xa5u
#define SCALE_SENTINEL (-7.0f)

typedef struct append_fixture {
  fd_problem problem;
  fd_plan plan;
  uint16_t k_new[AB * AMAXNEW * AHKV * AD], v_new[AB * AMAXNEW * AHKV * AD]; /* 16-bit q dtype */
  uint8_t k_cache[AB * ACAP * AHKV * AD * 4], v_cache[AB * ACAP * AHKV * AD * 4]; /* any kv dtype */
  float k_scale[AB * ACAP * AHKV], v_scale[AB * ACAP * AHKV];
  int32_t kv_len[AB];
  int32_t block_table[AB * APAGES];
  fd_append_tensors t;
} append_fixture;

static uint64_t fixture_rng(uint64_t *s) {
  *s += 0x9e3779b97f4a7c15ull;
  uint64_t z = *s;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Fills f for `backend`, q dtype, kv dtype and scales; paged or contiguous.
 * New values: normal-ish with a spread of magnitudes (2^-12 .. 2^6 times a
 * uniform), a few specials (NaN, a negative NaN with a full payload as
 * torch's bf16 NaN 0xffff, +-inf, huge) when `specials`. Returns 0, or -1
 * when fd_plan_init fails (err filled). */
static int append_fixture_init(append_fixture *f, fd_backend backend, fd_dtype dtype, fd_dtype kv_dtype,
                               fd_kv_scale kv_scale, int paged, int specials, uint64_t seed,
                               fd_error *err) {
  memset(f, 0, sizeof *f);
  fd_problem *p = &f->problem;
  p->backend = backend;
  p->dtype = dtype;
  p->kv_dtype = kv_dtype;
  p->kv_scale = kv_scale;
  p->batch = AB;
  p->num_heads_q = 2 * AHKV;
  p->num_heads_kv = AHKV;
  p->head_dim = AD;
  p->kv_capacity = ACAP;
  p->num_splits = 1;
  if (paged) {
    p->page_size = APAGE;
    p->max_pages_per_seq = APAGES;
    p->num_pages = AB * APAGES;
  }
  if (fd_plan_init(&f->plan, p, err) != FD_STATUS_OK) return -1;
  uint64_t s = seed;
  for (size_t i = 0; i < sizeof f->k_new / sizeof *f->k_new; i++) {
    for (int w = 0; w < 2; w++) {
      const double u = (double)(fixture_rng(&s) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
      const int e = (int)(fixture_rng(&s) % 19) - 12;
      float x = (float)ldexp(u, e);
      if (specials && fixture_rng(&s) % 50 == 0) {
        const float sp[5] = {NAN, fd_bits_to_f32(0xffff0000u), INFINITY, -INFINITY,
                             dtype == FD_DTYPE_F16 ? 60000.0f : 1e30f};
        x = sp[fixture_rng(&s) % 5];
      }
      uint16_t *dst = w ? f->v_new : f->k_new;
      dst[i] = dtype == FD_DTYPE_F16 ? fd_f32_to_f16(x) : fd_f32_to_bf16(x);
    }
  }
  memset(f->k_cache, CACHE_SENTINEL, sizeof f->k_cache);
  memset(f->v_cache, CACHE_SENTINEL, sizeof f->v_cache);
  for (size_t i = 0; i < sizeof f->k_scale / sizeof *f->k_scale; i++) f->k_scale[i] = f->v_scale[i] = SCALE_SENTINEL;
  if (kv_scale == FD_KV_SCALE_TENSOR || kv_scale == FD_KV_SCALE_HEAD)
    for (int h = 0; h < AHKV; h++) {
      f->k_scale[h] = 0.013f * (float)(h + 1);
      f->v_scale[h] = 0.75f / (float)(h + 1);
    }
  f->kv_len[0] = 0;
  f->kv_len[1] = 5;  /* crosses a page boundary with 7 new tokens */
  f->kv_len[2] = ACAP - AMAXNEW;
  for (int b = 0; b < AB; b++)
    for (int i = 0; i < APAGES; i++) f->block_table[b * APAGES + i] = (AB - 1 - b) * APAGES + (APAGES - 1 - i);
  f->t.k_new = f->k_new;
  f->t.v_new = f->v_new;
  f->t.k_cache = f->k_cache;
  f->t.v_cache = f->v_cache;
  f->t.kv_len = f->kv_len;
  f->t.block_table = paged ? f->block_table : NULL;
  if (kv_scale != FD_KV_SCALE_NONE) {
    f->t.k_scale = f->k_scale;
    f->t.v_scale = f->v_scale;
  }
  return 0;
}

#endif /* FD_TEST_APPEND_FIXTURE_H */
