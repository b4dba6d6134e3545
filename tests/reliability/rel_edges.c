/*
 * rel_edges.c — the "edges" group: inputs at the ends of the float32 and
 * int32 ranges that must give the right answer (or a clean refusal) on
 * every backend, as flashdecode.h states:
 *
 *   softcap_below_flt_min_refused  logits_soft_cap in (0, FLT_MIN) (where
 *        1 / cap overflows float32 and a zero score became 0 * inf = NaN):
 *        fd_plan_init returns FD_STATUS_INVALID_ARGUMENT naming
 *        logits_soft_cap, on this backend and the reference
 *   softcap_smallest_caps_finite   caps FLT_MIN, 2 FLT_MIN, 1e-30, 1e-20 with
 *        scores that are exactly 0 and scores far above the cap: finite and
 *        right (every capped score is ~0: the mean of the values)
 *   fp8_scales_far_from_one        fp8 caches with TOKEN (and TENSOR / HEAD)
 *        k_scale and v_scale powers of two from 2^-125 to 2^100, the
 *        dequantized values finite: out (float32) and lse right. On CUDA
 *        this caught P v_scale overflowing (and underflowing) the fp16 P of
 *        the P V product
 *   qk_overflow_as_documented      a q.k of 1e39 with softmax_scale 0.01 (the
 *        scaled score 1e37 is finite): the CPU backend and CUDA's 16-bit
 *        kernels overflow the float32 dot product (NaN row, NaN lse); CUDA's
 *        float32 kernel, which scales q first, and the reference give the
 *        right row
 *   window_near_int32_max          windowed calls (bf16, f16, f32) whose
 *        sequences end within 200 keys of the largest kv_capacity (paged,
 *        2^23 - 1 pages a sequence; contiguous with one broadcast key up to
 *        kv_len INT32_MAX): out and lse equal the oracle of the window's keys
 *        alone. On CUDA this caught key0 + 64 wrapping past INT32_MAX (an
 *        unmasked key past kv_len).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "rel.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16

static double unit(fd_rng *r) { return fd_rng_uniform(r) * 2.0 - 1.0; }

static void *put_copy(fd_backend be, const void *host, size_t bytes) {
  void *d = rel_alloc(be, bytes);
  rel_put(be, d, host, bytes);
  return d;
}

static fd_problem base_problem(fd_backend be, fd_dtype dt, int32_t batch, int32_t q_len, int32_t hq,
                               int32_t hkv, int32_t d, int32_t cap) {
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = be;
  p.dtype = dt;
  p.batch = batch;
  p.q_len = q_len;
  p.num_heads_q = hq;
  p.num_heads_kv = hkv;
  p.head_dim = d;
  p.kv_capacity = cap;
  return p;
}

/* ---- soft-cap below FLT_MIN ------------------------------------------------------------ */

static void softcap_refused_on(fd_backend be) {
  const float caps[] = {1.4e-45f, 1e-40f, 2.9e-39f, 1e-38f, 1.1754942e-38f /* FLT_MIN's predecessor */};
  for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) {
    assert_true(caps[i] > 0.0f && caps[i] < FLT_MIN);
    fd_problem p = base_problem(be, F32, 1, 1, 4, 2, 64, 128);
    p.logits_soft_cap = caps[i];
    fd_plan plan;
    fd_error err;
    memset(&err, 0, sizeof err);
    const fd_status st = fd_plan_init(&plan, &p, &err);
    if (st != FD_STATUS_INVALID_ARGUMENT)
      fail_msg("%s: logits_soft_cap %g (below FLT_MIN): fd_plan_init returned %d, want "
               "FD_STATUS_INVALID_ARGUMENT",
               fd_backend_name(be), (double)caps[i], (int)st);
    if (!strstr(err.message, "logits_soft_cap"))
      fail_msg("%s: logits_soft_cap %g refused with a message that does not name it: %s", fd_backend_name(be),
               (double)caps[i], err.message);
  }
  /* FLT_MIN itself is accepted */
  fd_problem p = base_problem(be, F32, 1, 1, 4, 2, 64, 128);
  p.logits_soft_cap = FLT_MIN;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK)
    fail_msg("%s: logits_soft_cap FLT_MIN refused: %s", fd_backend_name(be), err.message);
}

static void softcap_below_flt_min_refused(void **state) {
  const rel_env *env = REL_ENV(state);
  softcap_refused_on(env->backend);
  if (env->backend == FD_BACKEND_CPU) softcap_refused_on(FD_BACKEND_REFERENCE);
}

static void softcap_smallest_caps_finite(void **state) {
  const rel_env *env = REL_ENV(state);
  const float caps[] = {FLT_MIN, 2.0f * FLT_MIN, 1e-30f, 1e-20f};
  const fd_dtype dtypes[] = {F32, BF16, F16};
  /* input_scale 1e-30: q.k underflows to exactly 0 (every score 0); 4: scores
   * of ~+-30, far above every cap (tanh at +-1) */
  const float input_scales[] = {1e-30f, 4.0f};
  for (size_t ci = 0; ci < sizeof caps / sizeof *caps; ci++)
    for (size_t di = 0; di < 3; di++)
      for (size_t ii = 0; ii < 2; ii++) {
        if (dtypes[di] == F16 && ii == 0) continue; /* 1e-30 is 0 in fp16: nothing new */
        if (rel_quick() && (di != ci % 3)) continue;
        fd_case c = rel_case(env);
        c.dtype = dtypes[di];
        c.head_dim = 64;
        c.num_heads_q = 8;
        c.num_heads_kv = 2;
        c.batch = 2;
        c.kv_len[0] = 300, c.kv_len[1] = 70;
        c.q_len = 2;
        c.page_size = ci % 2 ? 16 : 0;
        c.num_splits = (int32_t)((ci + ii) % 3 == 0 ? 1 : (ci + ii) % 3 == 1 ? 3 : 0);
        c.with_lse = 1;
        c.logits_soft_cap = caps[ci];
        c.input_scale = input_scales[ii];
        rel_run_case(env, &c);
      }
}

/* ---- fp8 scales far from 1 ---------------------------------------------------------------- */

#define F8_B 2
#define F8_HQ 8
#define F8_HKV 2
#define F8_CAP 320

/* One fp8 problem: codes random over the format's finite values (|x| up to
 * max / 2), scales 2^e with e per `mode`:
 *   0  TOKEN, k and v exponents spread over [-125, 100] per (position, head);
 *      one key a sequence has k_scale 2^90 (a score of ~1e27: one-hot or
 *      weight 0)
 *   1  TOKEN, every exponent in [-125, -110] (tiny values, finite outputs
 *      ~1e-31)
 *   2  TOKEN, every v exponent in [90, 100], k exponents in [-8, -4]
 *   3  TENSOR, k 2^-120, v 2^100
 *   4  HEAD, per head k 2^-100 / 2^-6, v 2^-120 / 2^96
 *   5  TOKEN, softmax_scale 16, k exponents in [-14, -10], v in [-4, 4];
 *      one key a sequence all zero codes with k_scale 2^126 (its score is 0;
 *      softmax_scale * k_scale overflows float32)
 *   6  TENSOR, softmax_scale 16, k 2^126 over keys of codes below 2^-9
 *      (E4M3: 0 or its smallest subnormal): scores ~1e33 or 0
 * out is float32 (the values are beyond fp16's range); checked against the
 * float64 oracle with 1, 3 and automatic splits. */
static void fp8_scales_case(const rel_env *env, fd_dtype qdt, fd_dtype kvdt, int32_t d, int mode) {
  const fd_backend be = env->backend;
  const int32_t kv_len[F8_B] = {300, 77};
  const int32_t T = mode == 1 ? 2 : 1;
  fd_rng r = {env->seed ^ (0xf8f8ull + (uint64_t)mode * 977u + (uint64_t)kvdt * 13u + (uint64_t)d)};
  const size_t qn = (size_t)F8_B * T * F8_HQ * d, kvn = (size_t)F8_B * F8_CAP * F8_HKV * d;
  const size_t sn = (size_t)F8_B * F8_CAP * F8_HKV;
  const size_t qes = fd_dtype_size(qdt);
  void *q = malloc(qn * qes);
  unsigned char *k = malloc(kvn), *v = malloc(kvn);
  float *ks = malloc(sn * sizeof(float)), *vs = malloc(sn * sizeof(float));
  assert_true(q && k && v && ks && vs);
  const int e5m2 = kvdt == FD_DTYPE_E5M2;
  const double half_max = e5m2 ? 28672.0 : 224.0;
  for (size_t i = 0; i < qn; i++) rel_store(qdt, q, (int64_t)i, unit(&r));
  for (size_t i = 0; i < kvn; i++) {
    /* log-uniform magnitudes: small codes (subnormals included) and large ones */
    const double kx = copysign(half_max * pow(2.0, -12.0 * fd_rng_uniform(&r)), unit(&r));
    const double vx = copysign(half_max * pow(2.0, -12.0 * fd_rng_uniform(&r)), unit(&r));
    k[i] = e5m2 ? fd_f32_to_e5m2((float)(kx / half_max * 4.0)) : fd_f32_to_e4m3((float)(kx / half_max * 4.0));
    v[i] = e5m2 ? fd_f32_to_e5m2((float)vx) : fd_f32_to_e4m3((float)vx);
  }
  fd_kv_scale kind = FD_KV_SCALE_TOKEN;
  size_t scale_count = sn;
  for (size_t i = 0; i < sn; i++) {
    int ek, ev;
    switch (mode) {
      case 0:
        ek = -125 + (int)fd_rng_below(&r, 226);
        ev = -125 + (int)fd_rng_below(&r, 226);
        if (ek > 0) ek -= 100; /* scores within float32: k exponents up to ~0 (one key gets 2^90 below) */
        break;
      case 1:
        ek = -125 + (int)fd_rng_below(&r, 16);
        ev = -125 + (int)fd_rng_below(&r, 16);
        break;
      case 5:
        ek = -14 + (int)fd_rng_below(&r, 5);
        ev = -4 + (int)fd_rng_below(&r, 9);
        break;
      default:
        ek = -8 + (int)fd_rng_below(&r, 5);
        ev = 90 + (int)fd_rng_below(&r, 11);
        break;
    }
    ks[i] = ldexpf(1.0f, ek);
    vs[i] = ldexpf(1.0f, ev);
  }
  if (mode == 0) /* key 41 of sequence 0 and key 20 of sequence 1, kv head 0 */
    ks[(size_t)(0 * F8_CAP + 41) * F8_HKV] = ldexpf(1.0f, 90), ks[(size_t)(1 * F8_CAP + 20) * F8_HKV] = ldexpf(1.0f, 90);
  if (mode == 5) /* key 41 of sequence 0, key 20 of sequence 1, kv head 0: zero codes, k_scale 2^126 */
    for (int b = 0; b < F8_B; b++) {
      const size_t at = ((size_t)b * F8_CAP + (b ? 20 : 41)) * F8_HKV;
      memset(k + at * d, 0, (size_t)d);
      ks[at] = ldexpf(1.0f, 126);
    }
  if (mode == 6) {
    kind = FD_KV_SCALE_TENSOR, scale_count = 1;
    ks[0] = ldexpf(1.0f, 126), vs[0] = 0.5f;
    for (size_t i = 0; i < kvn; i++) k[i] = (unsigned char)(i % 7 == 0 ? 0x01 : i % 7 == 1 ? 0x81 : 0x00);
    if (e5m2) /* E5M2's 0x01 is 2^-16: the same idea */
      for (size_t i = 0; i < kvn; i++) k[i] = (unsigned char)(k[i] & 0x81);
  }
  if (mode == 3) {
    kind = FD_KV_SCALE_TENSOR, scale_count = 1;
    ks[0] = ldexpf(1.0f, -120), vs[0] = ldexpf(1.0f, 100);
  } else if (mode == 4) {
    kind = FD_KV_SCALE_HEAD, scale_count = F8_HKV;
    ks[0] = ldexpf(1.0f, -100), ks[1] = ldexpf(1.0f, -6);
    vs[0] = ldexpf(1.0f, -120), vs[1] = ldexpf(1.0f, 96);
  }
  /* positions past kv_len: the fp8 NaN code and NaN scales (never read) */
  for (int b = 0; b < F8_B; b++)
    for (int32_t j = kv_len[b]; j < F8_CAP; j++)
      for (int h = 0; h < F8_HKV; h++) {
        const size_t at = ((size_t)b * F8_CAP + j) * F8_HKV + h;
        memset(k + at * d, 0x7f, (size_t)d);
        memset(v + at * d, 0x7f, (size_t)d);
        if (kind == FD_KV_SCALE_TOKEN) ks[at] = vs[at] = NAN;
      }

  fd_problem p = base_problem(be, qdt, F8_B, T, F8_HQ, F8_HKV, d, F8_CAP);
  p.kv_dtype = kvdt;
  p.kv_scale = kind;
  p.out_dtype = F32;
  if (mode >= 5) p.softmax_scale = 16.0f;
  fd_tensors host;
  memset(&host, 0, sizeof host);
  const int64_t q3[3] = {(int64_t)T * F8_HQ * d, (int64_t)F8_HQ * d, d},
                k3[3] = {(int64_t)F8_CAP * F8_HKV * d, (int64_t)F8_HKV * d, d};
  memcpy(host.q_strides, q3, sizeof q3);
  memcpy(host.k_strides, k3, sizeof k3);
  memcpy(host.v_strides, k3, sizeof k3);
  if (kind == FD_KV_SCALE_TOKEN) { /* explicit: the oracle reads the strides as given */
    const int64_t s3[3] = {(int64_t)F8_CAP * F8_HKV, F8_HKV, 1};
    memcpy(host.scale_strides, s3, sizeof s3);
  }
  host.q = q, host.k_cache = k, host.v_cache = v, host.kv_len = kv_len, host.k_scale = ks, host.v_scale = vs;
  double *ref, *ref_lse;
  rel_oracle(&p, &host, &ref, &ref_lse);
  fd_tensors t = host;
  t.q = put_copy(be, q, qn * qes);
  t.k_cache = put_copy(be, k, kvn);
  t.v_cache = put_copy(be, v, kvn);
  t.kv_len = put_copy(be, kv_len, sizeof kv_len);
  t.k_scale = put_copy(be, ks, scale_count * sizeof(float));
  t.v_scale = put_copy(be, vs, scale_count * sizeof(float));
  const size_t rows = (size_t)F8_B * T * F8_HQ;
  float *out = malloc(rows * d * sizeof(float)), lse[F8_B * 2 * F8_HQ];
  assert_non_null(out);
  const int32_t splits[3] = {1, 3, 0};
  for (int si = rel_quick() ? 1 : 0; si < (rel_quick() ? 2 : 3); si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    if (rel_run_private(&plan, &t, 0xff, NULL, out, lse, &err) != FD_STATUS_OK)
      fail_msg("fd_run: %s", err.message);
    char what[160];
    snprintf(what, sizeof what, "fp8 %s, q %s, d%d, scales mode %d, %d splits", e5m2 ? "e5m2" : "e4m3",
             qdt == BF16 ? "bf16" : "f16", d, mode, plan.num_splits);
    /* the fp8 floor is q's dtype's: twice it (P in fp16 on CUDA, the values' own rounding) */
    if (rel_check_dense(&p, kv_len, out, lse, ref, ref_lse, 2.0, 0.0, 0.0, what))
      fail_msg("%s: wrong result", what);
  }
  rel_free(be, (void *)t.q);
  rel_free(be, (void *)t.k_cache);
  rel_free(be, (void *)t.v_cache);
  rel_free(be, (void *)t.kv_len);
  rel_free(be, (void *)t.k_scale);
  rel_free(be, (void *)t.v_scale);
  free(ref), free(ref_lse), free(out);
  free(q), free(k), free(v), free(ks), free(vs);
}

static void fp8_scales_far_from_one(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int mode = 0; mode < 7; mode++)
    for (int variant = 0; variant < 4; variant++) {
      if (rel_quick() && variant != mode % 4) continue;
      const fd_dtype kvdt = variant & 1 ? FD_DTYPE_E5M2 : FD_DTYPE_E4M3;
      const fd_dtype qdt = variant & 2 ? BF16 : F16;
      fp8_scales_case(env, qdt, kvdt, (mode + variant) % 2 ? 128 : 64, mode);
    }
}

/* ---- q.k beyond float32 ------------------------------------------------------------------- */

#define QK_B 2
#define QK_HQ 4
#define QK_HKV 2
#define QK_T 2
#define QK_D 64
#define QK_CAP 256

/* q element 7 of the rows of (sequence 0, kv head 0) is 1e20, k element 7 of
 * key 100 there 1e19: that key's q.k is 1e39 (+inf in float32), its score
 * with softmax_scale 0.01 1e37 (finite); every other key of those rows scores
 * ~1e18 or less, so the exact softmax picks key 100 alone. `nan_rows`: the
 * backend overflows the dot product (those rows NaN, out and lse), else it
 * must give the oracle's rows. Every other row is finite and right. */
static void qk_overflow_case(const rel_env *env, fd_backend be, fd_dtype dt, int nan_rows) {
  const int32_t kv_len[QK_B] = {200, 150};
  const size_t es = fd_dtype_size(dt);
  const size_t qn = (size_t)QK_B * QK_T * QK_HQ * QK_D, kvn = (size_t)QK_B * QK_CAP * QK_HKV * QK_D;
  fd_rng r = {env->seed ^ (0x9e39ull + (uint64_t)dt)};
  void *q = malloc(qn * es), *k = malloc(kvn * es), *v = malloc(kvn * es);
  assert_true(q && k && v);
  for (size_t i = 0; i < qn; i++) rel_store(dt, q, (int64_t)i, unit(&r));
  for (size_t i = 0; i < kvn; i++) rel_store(dt, k, (int64_t)i, unit(&r)), rel_store(dt, v, (int64_t)i, unit(&r));
  for (int t = 0; t < QK_T; t++)
    for (int h = 0; h < QK_HQ / QK_HKV; h++) rel_store(dt, q, (((int64_t)0 * QK_T + t) * QK_HQ + h) * QK_D + 7, 1e20);
  rel_store(dt, k, (((int64_t)0 * QK_CAP + 100) * QK_HKV + 0) * QK_D + 7, 1e19);
  fd_problem p = base_problem(be, dt, QK_B, QK_T, QK_HQ, QK_HKV, QK_D, QK_CAP);
  p.softmax_scale = 0.01f;
  fd_tensors host;
  memset(&host, 0, sizeof host);
  const int64_t q3[3] = {QK_T * QK_HQ * QK_D, QK_HQ * QK_D, QK_D}, k3[3] = {QK_CAP * QK_HKV * QK_D, QK_HKV * QK_D, QK_D};
  memcpy(host.q_strides, q3, sizeof q3);
  memcpy(host.k_strides, k3, sizeof k3);
  memcpy(host.v_strides, k3, sizeof k3);
  host.q = q, host.k_cache = k, host.v_cache = v, host.kv_len = kv_len;
  double *ref, *ref_lse;
  rel_oracle(&p, &host, &ref, &ref_lse);
  fd_tensors t = host;
  t.q = put_copy(be, q, qn * es);
  t.k_cache = put_copy(be, k, kvn * es);
  t.v_cache = put_copy(be, v, kvn * es);
  t.kv_len = put_copy(be, kv_len, sizeof kv_len);
  const size_t rows = (size_t)QK_B * QK_T * QK_HQ;
  unsigned char *out = malloc(rows * QK_D * es);
  float lse[QK_B * QK_T * QK_HQ];
  assert_non_null(out);
  const int32_t splits[3] = {1, 3, 0};
  for (int si = 0; si < (be == FD_BACKEND_REFERENCE ? 1 : 3); si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    if (rel_run_private(&plan, &t, 0xff, NULL, out, lse, &err) != FD_STATUS_OK)
      fail_msg("fd_run: %s", err.message);
    char what[128];
    snprintf(what, sizeof what, "q.k 1e39, score 1e37, %s %s, %d splits", fd_backend_name(be),
             dt == F32 ? "f32" : "bf16", plan.num_splits);
    for (int b = 0; b < QK_B; b++)
      for (int tt = 0; tt < QK_T; tt++)
        for (int h = 0; h < QK_HQ; h++) {
          const int64_t row = ((int64_t)b * QK_T + tt) * QK_HQ + h, lrow = ((int64_t)b * QK_HQ + h) * QK_T + tt;
          const int hit = b == 0 && h / (QK_HQ / QK_HKV) == 0;
          int all_nan = 1, right = 1;
          for (int i = 0; i < QK_D; i++) {
            const double o = rel_load(dt, out, row * QK_D + i), want = ref[row * QK_D + i];
            all_nan &= isnan(o) != 0;
            right &= fabs(o - want) <= 2.0 * fd_tol_out_floor(dt) * 1.0 + 1e-6;
          }
          const double l = lse[lrow];
          right &= fabs(l - ref_lse[lrow]) <= fd_tol_lse(dt) * fmax(1.0, fabs(ref_lse[lrow]));
          if (hit && nan_rows && !(all_nan && isnan(l)))
            fail_msg("%s: row b%d t%d h%d (its q.k overflows float32 here) is not NaN (lse %g)", what, b, tt, h,
                     l);
          if ((!hit || !nan_rows) && !right)
            fail_msg("%s: row b%d t%d h%d is not the oracle's (lse %.9g vs %.9g)", what, b, tt, h, l,
                     ref_lse[lrow]);
        }
  }
  rel_free(be, (void *)t.q);
  rel_free(be, (void *)t.k_cache);
  rel_free(be, (void *)t.v_cache);
  rel_free(be, (void *)t.kv_len);
  free(ref), free(ref_lse), free(out), free(q), free(k), free(v);
}

static void qk_overflow_as_documented(void **state) {
  const rel_env *env = REL_ENV(state);
  if (env->backend == FD_BACKEND_CPU) {
    qk_overflow_case(env, FD_BACKEND_CPU, F32, 1);
    qk_overflow_case(env, FD_BACKEND_CPU, BF16, 1);
    qk_overflow_case(env, FD_BACKEND_REFERENCE, F32, 0);
    qk_overflow_case(env, FD_BACKEND_REFERENCE, BF16, 0);
  } else {
    qk_overflow_case(env, env->backend, F32, 0);  /* q scaled by softmax_scale log2(e) first */
    qk_overflow_case(env, env->backend, BF16, 1); /* the tensor cores' float32 q.k overflows */
  }
}

/* ---- windows near INT32_MAX -------------------------------------------------------------- */

#define WN_HQ 8
#define WN_HKV 2
#define WN_D 64
#define WN_PAGE 256
#define WN_B 2

/* A windowed call (window W, q_len T) whose sequences end near INT32_MAX,
 * against the oracle of a short contiguous cache of the window's keys alone
 * (kv_len W + T, the same window):
 *   paged      page_size 256, kv_capacity 2^31 - 256 (the largest whole
 *              number of pages), 2^23 - 1 block_table columns a sequence:
 *              the pages that hold a key at or after the first row's window
 *              start rounded down to 64 get their own pool pages, every
 *              other entry names page 0, which holds NaN (never read);
 *   broadcast  a contiguous cache of kv_capacity INT32_MAX whose position
 *              stride is FD_STRIDE_BROADCAST: every key of a sequence is
 *              one key, so out is its value and lse counts the keys (a key
 *              too many or too few moves lse by ~1 / W). kv_len reaches
 *              INT32_MAX, where the last 64-key tile ends at 2^31. */
static void window_int32_case(const rel_env *env, fd_dtype dt, int32_t W, int32_t T, int broadcast) {
  const fd_backend be = env->backend;
  const int32_t maxp = broadcast ? 0 : INT32_MAX / WN_PAGE;
  const int32_t cap = broadcast ? INT32_MAX : maxp * WN_PAGE;
  const int32_t kvs[3][WN_B] = {{cap, cap - 1}, {cap - 62, cap - 63}, {cap - 64, cap - 200}};
  const size_t es = fd_dtype_size(dt);
  const int32_t Ls = W + T; /* keys of the short equivalent */
  const int32_t span_pages = (Ls + 64) / WN_PAGE + 2; /* pages of [lo - 64, kv) */
  const int32_t pool = broadcast ? WN_B : 1 + WN_B * span_pages;
  const size_t page_elems = broadcast ? (size_t)WN_HKV * WN_D : (size_t)WN_PAGE * WN_HKV * WN_D;
  fd_rng r = {env->seed ^ (0x7fffull * (uint64_t)W + (uint64_t)dt + 31u * (uint64_t)T + 7u * (uint64_t)broadcast)};
  int32_t *bt = broadcast ? NULL : calloc((size_t)WN_B * maxp, sizeof *bt);
  unsigned char *k = malloc(pool * page_elems * es), *v = malloc(pool * page_elems * es);
  const size_t qn = (size_t)WN_B * T * WN_HQ * WN_D, sn = (size_t)WN_B * Ls * WN_HKV * WN_D;
  void *q = malloc(qn * es);
  unsigned char *ks = malloc(sn * es), *vs = malloc(sn * es);
  float *out = malloc(qn * sizeof(float)), lse[WN_B * WN_HQ * 4];
  assert_true((broadcast || bt) && k && v && q && ks && vs && out && T <= 4);
  const size_t first_real = broadcast ? 0 : page_elems; /* page 0: NaN (paged) */
  for (size_t i = 0; i < first_real; i++) rel_store(dt, k, (int64_t)i, NAN), rel_store(dt, v, (int64_t)i, NAN);
  for (size_t i = first_real; i < pool * page_elems; i++)
    rel_store(dt, k, (int64_t)i, unit(&r) * 2.0), rel_store(dt, v, (int64_t)i, unit(&r));
  for (size_t i = 0; i < qn; i++) rel_store(dt, q, (int64_t)i, unit(&r) * 2.0);

  for (int round = 0; round < 3; round++) {
    const int32_t *kv = kvs[round];
    if (!broadcast) memset(bt, 0, (size_t)WN_B * maxp * sizeof *bt);
    int32_t next = 1;
    for (int b = 0; b < WN_B; b++) {
      if (!broadcast) /* the pages from the first key read to the last */
        for (int64_t pg = ((int64_t)kv[b] - Ls - 64) / WN_PAGE; pg <= ((int64_t)kv[b] - 1) / WN_PAGE; pg++) {
          assert_true(next < pool);
          bt[(int64_t)b * maxp + pg] = next++;
        }
      /* the short cache: key i is key kv - Ls + i */
      for (int32_t i = 0; i < Ls; i++) {
        const int64_t j = (int64_t)kv[b] - Ls + i;
        const size_t at = broadcast ? (size_t)b * page_elems
                                    : (size_t)bt[(int64_t)b * maxp + j / WN_PAGE] * page_elems +
                                          (size_t)(j % WN_PAGE) * WN_HKV * WN_D;
        memcpy(ks + ((size_t)b * Ls + i) * WN_HKV * WN_D * es, k + at * es, (size_t)WN_HKV * WN_D * es);
        memcpy(vs + ((size_t)b * Ls + i) * WN_HKV * WN_D * es, v + at * es, (size_t)WN_HKV * WN_D * es);
      }
    }
    /* the oracle: the short problem */
    fd_problem ps = base_problem(be, dt, WN_B, T, WN_HQ, WN_HKV, WN_D, Ls);
    ps.has_window = 1;
    ps.window_left = W;
    ps.out_dtype = F32;
    const int32_t kv_short[WN_B] = {Ls, Ls};
    fd_tensors hs;
    memset(&hs, 0, sizeof hs);
    const int64_t q3[3] = {(int64_t)T * WN_HQ * WN_D, WN_HQ * WN_D, WN_D},
                  s3[3] = {(int64_t)Ls * WN_HKV * WN_D, WN_HKV * WN_D, WN_D};
    memcpy(hs.q_strides, q3, sizeof q3);
    memcpy(hs.k_strides, s3, sizeof s3);
    memcpy(hs.v_strides, s3, sizeof s3);
    hs.q = q, hs.k_cache = ks, hs.v_cache = vs, hs.kv_len = kv_short;
    double *ref, *ref_lse;
    rel_oracle(&ps, &hs, &ref, &ref_lse);

    /* the call near INT32_MAX */
    fd_problem p = ps;
    p.kv_capacity = cap;
    fd_tensors t;
    memset(&t, 0, sizeof t);
    if (broadcast) {
      const int64_t b3[3] = {(int64_t)WN_HKV * WN_D, FD_STRIDE_BROADCAST, WN_D};
      memcpy(t.q_strides, q3, sizeof q3);
      memcpy(t.k_strides, b3, sizeof b3);
      memcpy(t.v_strides, b3, sizeof b3);
    } else {
      p.page_size = WN_PAGE;
      p.max_pages_per_seq = maxp;
      p.num_pages = pool;
    }
    t.q = put_copy(be, q, qn * es);
    t.k_cache = put_copy(be, k, pool * page_elems * es);
    t.v_cache = put_copy(be, v, pool * page_elems * es);
    t.kv_len = put_copy(be, kv, WN_B * sizeof *kv);
    if (!broadcast) t.block_table = put_copy(be, bt, (size_t)WN_B * maxp * sizeof *bt);
    const int32_t splits[3] = {1, 3, 0};
    for (int si = rel_quick() ? 2 : 0; si < 3; si++) {
      p.num_splits = splits[si];
      fd_plan plan;
      fd_error err;
      if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
      if (rel_run_private(&plan, &t, 0xff, NULL, out, lse, &err) != FD_STATUS_OK)
        fail_msg("fd_run: %s", err.message);
      char what[160];
      snprintf(what, sizeof what, "%s %s, window %d, q_len %d, kv_len %d and %d, %d splits",
               broadcast ? "broadcast" : "paged", dt == F32 ? "f32" : dt == F16 ? "f16" : "bf16", W, T, kv[0],
               kv[1], plan.num_splits);
      if (rel_check_dense(&ps, kv_short, out, lse, ref, ref_lse, 2.0, 0.0, 0.0, what))
        fail_msg("%s: wrong result", what);
    }
    rel_free(be, (void *)t.q);
    rel_free(be, (void *)t.k_cache);
    rel_free(be, (void *)t.v_cache);
    rel_free(be, (void *)t.kv_len);
    if (!broadcast) rel_free(be, (void *)t.block_table);
    free(ref), free(ref_lse);
  }
  free(bt), free(k), free(v), free(q), free(ks), free(vs), free(out);
}

static void window_near_int32_max(void **state) {
  const rel_env *env = REL_ENV(state);
  for (int broadcast = 0; broadcast < 2; broadcast++) {
    window_int32_case(env, BF16, 200, 1, broadcast);
    window_int32_case(env, BF16, 4095, 3, broadcast);
    if (!rel_quick()) {
      window_int32_case(env, F16, 127, 2, broadcast);
      window_int32_case(env, F32, 200, 1, broadcast);
    }
  }
}

rel_group rel_group_edges(fd_backend backend) {
  (void)backend;
  static const struct CMUnitTest tests[] = {
      {"softcap_below_flt_min_refused", softcap_below_flt_min_refused, NULL, NULL, NULL},
      {"softcap_smallest_caps_finite", softcap_smallest_caps_finite, NULL, NULL, NULL},
      {"fp8_scales_far_from_one", fp8_scales_far_from_one, NULL, NULL, NULL},
      {"qk_overflow_as_documented", qk_overflow_as_documented, NULL, NULL, NULL},
      {"window_near_int32_max", window_near_int32_max, NULL, NULL, NULL},
  };
  rel_group g = {"edges", tests, sizeof tests / sizeof *tests};
  return g;
}
