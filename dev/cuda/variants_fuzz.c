/*
 * variants_fuzz.c — a lab check (not a ctest; the test grids are the
 * evidence): random problems with every attention variant (sliding window,
 * soft-cap, sinks, non-causal rows up to q_len 128, fp32 out, head_dim 64 /
 * 80 / 96 / 128 / 256, paged and contiguous, forced and automatic splits),
 * the CUDA backend against the float64 reference through the public API.
 * Outputs are poisoned with NaN before each call; prints failing problems
 * and exits 1 on any. Build from the repository root after `make`:
 *   cc -O2 -Iinclude dev/cuda/variants_fuzz.c build/libflashdecode.a tests/gpu_mem.c \
 *     -Itests -fopenmp -lm -L$CUDA_HOME/lib64 -lcudart -lstdc++ -o /tmp/vfuzz
 *   /tmp/vfuzz [trials] [seed]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashdecode.h"
#include "gpu_mem.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}
static int irand(int n) { return (int)(next_u32() % (uint32_t)n); }
static float frand(void) { return (float)(next_u32() % 2000001) / 1000000.0f - 1.0f; }

static uint16_t to_half_bits(float f, fd_dtype dt) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (dt == FD_DTYPE_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  /* fp16 for |f| < 8, normal range only (inputs are small) */
  uint32_t sign = (u >> 16) & 0x8000u;
  int e = (int)((u >> 23) & 0xff) - 127 + 15;
  if (e <= 0) return (uint16_t)sign;
  uint32_t m = u & 0x7fffffu;
  uint32_t r = ((uint32_t)e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}
static float from_bits(const void *base, fd_dtype dt, size_t i) {
  if (dt == FD_DTYPE_F32) return ((const float *)base)[i];
  uint16_t h = ((const uint16_t *)base)[i];
  uint32_t u;
  if (dt == FD_DTYPE_BF16) {
    u = (uint32_t)h << 16;
  } else {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
      float v = (float)m * 5.9604644775390625e-08f;
      return (h & 0x8000u) ? -v : v;
    }
    u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int main(int argc, char **argv) {
  const int trials = argc > 1 ? atoi(argv[1]) : 400;
  if (argc > 2) rng ^= (uint64_t)strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull;
  if (!fd_backend_available(FD_BACKEND_CUDA)) {
    puts("variants_fuzz: no CUDA device, skipped");
    return 0;
  }
  const int dims[5] = {64, 80, 96, 128, 256};
  int fails = 0;
  for (int trial = 0; trial < trials; trial++) {
    const fd_dtype dt = (fd_dtype)(1 + irand(3));
    const int D = dims[irand(5)];
    const int nc = irand(6) == 0;
    const int Hkv = 1 + irand(3), g = 1 + irand(8), Hq = Hkv * g;
    const int B = 1 + irand(3);
    const int T = nc ? 1 + irand(128) : 1 + irand(16);
    const int cap = 1 + irand(irand(4) == 0 ? 9000 : 900);
    int32_t kv[3];
    for (int b = 0; b < B; b++) kv[b] = irand(5) == 0 ? cap : irand(cap + 1);
    const int W = nc || irand(2) ? -1 : irand(4) ? irand(300) : irand(3);
    const float sc = irand(2) ? (float)(1 + irand(50)) : 0.0f;
    const int sinks = irand(2), out32 = dt != FD_DTYPE_F32 && irand(3) == 0;
    const int splits = irand(4) ? 1 + irand(12) : 0;
    const int ps = irand(2) ? (irand(4) ? 1 << irand(8) : 1 + irand(100)) : 0;
    const int mp = ps ? (cap + ps - 1) / ps : 0, npages = ps ? B * mp + 3 : 0;
    const size_t es = fd_dtype_size(dt), oes = out32 ? 4 : es;
    const size_t qn = (size_t)B * T * Hq * D;
    const size_t kvn = ps ? (size_t)npages * ps * Hkv * D : (size_t)B * cap * Hkv * D;

    fd_problem p = {0};
    p.backend = FD_BACKEND_CUDA;
    p.dtype = dt;
    p.batch = B;
    p.q_len = T;
    p.num_heads_q = Hq;
    p.num_heads_kv = Hkv;
    p.head_dim = D;
    p.kv_capacity = cap;
    p.page_size = ps;
    p.max_pages_per_seq = mp;
    p.num_pages = npages;
    p.num_splits = splits;
    p.has_window = W >= 0;
    p.window_left = W;
    p.logits_soft_cap = sc;
    p.non_causal = nc;
    p.out_dtype = out32 ? FD_DTYPE_F32 : 0;
    fd_plan plan, rplan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err)) {
      printf("trial %d plan: %s\n", trial, err.message);
      fails++;
      continue;
    }
    fd_problem rp = p;
    rp.backend = FD_BACKEND_REFERENCE;
    fd_plan_init(&rplan, &rp, &err);

    void *hq = malloc(qn * es), *hk = malloc(kvn * es), *hv = malloc(kvn * es);
    float *hs = malloc(4 * (size_t)Hq);
    int32_t *bt = malloc(4 * ((size_t)B * mp + 1));
    const float qs = irand(3) == 0 ? 6.0f : 1.5f;
    for (size_t i = 0; i < qn; i++) {
      float x = frand() * qs;
      if (dt == FD_DTYPE_F32) ((float *)hq)[i] = x; else ((uint16_t *)hq)[i] = to_half_bits(x, dt);
    }
    for (size_t i = 0; i < kvn; i++) {
      float x = frand(), y = frand();
      if (dt == FD_DTYPE_F32) {
        ((float *)hk)[i] = x;
        ((float *)hv)[i] = y;
      } else {
        ((uint16_t *)hk)[i] = to_half_bits(x, dt);
        ((uint16_t *)hv)[i] = to_half_bits(y, dt);
      }
    }
    for (int h = 0; h < Hq; h++) hs[h] = frand() * 4.0f;
    /* pages in a shuffled order, ids past the first three */
    for (int i = 0; i < B * mp; i++) bt[i] = 3 + i;
    for (int i = B * mp - 1; i > 0; i--) {
      int j = irand(i + 1), t = bt[i];
      bt[i] = bt[j];
      bt[j] = t;
    }
    const size_t on = qn, ln = (size_t)B * Hq * T;
    void *ho = malloc(on * oes), *hr = malloc(on * oes);
    float *hl = malloc(4 * ln), *hrl = malloc(4 * ln);

    fd_tensors ht = {0};
    ht.q = hq;
    ht.k_cache = hk;
    ht.v_cache = hv;
    ht.kv_len = kv;
    ht.block_table = ps ? bt : NULL;
    ht.out = hr;
    ht.lse = hrl;
    ht.sinks = sinks ? hs : NULL;
    void *rws = malloc(rplan.workspace_size + 16);
    if (fd_run(&rplan, &ht, rws, rplan.workspace_size, NULL, &err)) {
      printf("trial %d reference: %s\n", trial, err.message);
      fails++;
    }
    free(rws);

    void *dq, *dk, *dv, *ds, *dkv, *dbt, *dout, *dlse, *dws = NULL;
    fd_gpu_malloc(&dq, qn * es);
    fd_gpu_malloc(&dk, kvn * es);
    fd_gpu_malloc(&dv, kvn * es);
    fd_gpu_malloc(&ds, 4 * (size_t)Hq);
    fd_gpu_malloc(&dkv, 12);
    fd_gpu_malloc(&dbt, 4 * ((size_t)B * mp + 1));
    fd_gpu_malloc(&dout, on * oes);
    fd_gpu_malloc(&dlse, 4 * ln);
    if (plan.workspace_size) fd_gpu_malloc(&dws, plan.workspace_size);
    fd_gpu_upload(dq, hq, qn * es);
    fd_gpu_upload(dk, hk, kvn * es);
    fd_gpu_upload(dv, hv, kvn * es);
    fd_gpu_upload(ds, hs, 4 * (size_t)Hq);
    fd_gpu_upload(dkv, kv, 4 * (size_t)B);
    fd_gpu_upload(dbt, bt, 4 * ((size_t)B * mp + 1));
    memset(ho, 0xff, on * oes); /* NaN poison */
    memset(hl, 0xff, 4 * ln);
    fd_gpu_upload(dout, ho, on * oes);
    fd_gpu_upload(dlse, hl, 4 * ln);
    fd_tensors dt_ = ht;
    dt_.q = dq;
    dt_.k_cache = dk;
    dt_.v_cache = dv;
    dt_.kv_len = dkv;
    dt_.block_table = ps ? dbt : NULL;
    dt_.out = dout;
    dt_.lse = dlse;
    dt_.sinks = sinks ? ds : NULL;
    int st = fd_run(&plan, &dt_, dws, plan.workspace_size, NULL, &err);
    if (st || fd_gpu_synchronize()) {
      printf("trial %d run: %s\n", trial, st ? err.message : "sync failed");
      fails++;
    }
    fd_gpu_download(ho, dout, on * oes);
    fd_gpu_download(hl, dlse, 4 * ln);

    const fd_dtype odt = out32 ? FD_DTYPE_F32 : dt;
    const double tol = dt == FD_DTYPE_F32 ? 2e-5 : dt == FD_DTYPE_F16 ? 4e-3 : 2.5e-2;
    double worst = 0.0, worst_l = 0.0;
    for (size_t i = 0; i < on; i++) {
      const double a = from_bits(ho, odt, i), r = from_bits(hr, odt, i);
      const double e = fabs(a - r);
      if (!(e <= worst)) worst = isnan(e) ? 1e30 : e;
    }
    for (size_t i = 0; i < ln; i++) {
      if (isinf(hl[i]) && hl[i] == hrl[i]) continue;
      const double e = fabs((double)hl[i] - hrl[i]);
      if (!(e <= worst_l)) worst_l = isnan(e) ? 1e30 : e;
    }
    if (worst > tol || worst_l > tol * 4) {
      printf("FAIL trial %d: %s d%d h%d:%d b%d q%d cap%d kv[%d,%d,%d] W%d cap%g sinks%d nc%d out32 %d "
             "splits%d(plan %d) ps%d: out err %.3g lse err %.3g\n",
             trial, dt == FD_DTYPE_F32 ? "f32" : dt == FD_DTYPE_F16 ? "f16" : "bf16", D, Hq, Hkv, B,
             T, cap, kv[0], B > 1 ? kv[1] : -1, B > 2 ? kv[2] : -1, W, sc, sinks, nc, out32, splits,
             plan.num_splits, ps, worst, worst_l);
      fails++;
    }
    fd_gpu_free(dq);
    fd_gpu_free(dk);
    fd_gpu_free(dv);
    fd_gpu_free(ds);
    fd_gpu_free(dkv);
    fd_gpu_free(dbt);
    fd_gpu_free(dout);
    fd_gpu_free(dlse);
    if (dws) fd_gpu_free(dws);
    free(hq);
    free(hk);
    free(hv);
    free(hs);
    free(bt);
    free(ho);
    free(hr);
    free(hl);
    free(hrl);
  }
  printf("variants_fuzz: %d trials, %d failed\n", trials, fails);
  return fails != 0;
}
