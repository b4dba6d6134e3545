/*
 * rel_common.c — the helpers of rel.h: quick mode, case runners that fail the
 * cmocka test, backend-side memory, private-output runs, dense comparisons
 * with the float64 oracle.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gpu_mem.h"
#include "internal.h"
#include "rel.h"
#include "rel_cuda.h"

int rel_quick(void) {
  const char *q = getenv("FD_TEST_QUICK");
  return q && *q && strcmp(q, "0") != 0;
}

fd_case rel_case(const rel_env *env) {
  fd_case c;
  memset(&c, 0, sizeof c);
  c.backend = env->backend;
  c.q_len = 1;
  return c;
}

void rel_run_case(const rel_env *env, const fd_case *c) {
  int fails = fd_case_run(c, env->seed);
  if (fails) {
    char name[1024];
    fd_case_name(c, name, sizeof name);
    fail_msg("%s: %d check(s) failed (FD_TEST_SEED=%llu reproduces)", name, fails,
             (unsigned long long)env->seed);
  }
}

fd_case_data *rel_data(const rel_env *env, const fd_case *c) {
  fd_case_data *d = fd_case_data_new(c, env->seed);
  if (!d) {
    char name[1024];
    fd_case_name(c, name, sizeof name);
    fail_msg("%s: could not build the case's tensors", name);
  }
  return d;
}

fd_plan rel_plan(const fd_case_data *d, int32_t num_splits) {
  fd_plan plan;
  if (fd_case_data_plan(d, num_splits, &plan))
    fail_msg("%s: no plan for num_splits %d", fd_case_data_name(d), num_splits);
  return plan;
}

void rel_data_run(fd_case_data *d, const fd_plan *plan, unsigned char ws_fill, const char *what,
                  fd_case_output *o) {
  int fails = fd_case_data_run(d, plan, ws_fill, what, o);
  if (fails) fail_msg("%s: %s: %d check(s) failed", fd_case_data_name(d), what, fails);
  if (o && !o->out) fail_msg("%s: %s: no output", fd_case_data_name(d), what);
}

/* ---- Memory ------------------------------------------------------------------ */

void *rel_alloc(fd_backend backend, size_t bytes) {
  void *p = NULL;
  if (bytes == 0) bytes = 16;
  if (backend == FD_BACKEND_CUDA) {
    if (fd_gpu_malloc(&p, bytes)) p = NULL;
  } else {
    p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  if (!p) fail_msg("out of memory: %zu bytes (%s)", bytes, fd_backend_name(backend));
  return p;
}

void rel_free(fd_backend backend, void *ptr) {
  if (!ptr) return;
  if (backend == FD_BACKEND_CUDA)
    fd_gpu_free(ptr);
  else
    free(ptr);
}

void rel_put(fd_backend backend, void *dst, const void *src_host, size_t bytes) {
  if (backend == FD_BACKEND_CUDA) {
    if (fd_gpu_upload(dst, src_host, bytes)) fail_msg("device upload of %zu bytes failed", bytes);
  } else {
    memcpy(dst, src_host, bytes);
  }
}

void rel_get(fd_backend backend, void *dst_host, const void *src, size_t bytes) {
  if (backend == FD_BACKEND_CUDA) {
    if (fd_gpu_download(dst_host, src, bytes)) fail_msg("device download of %zu bytes failed", bytes);
  } else {
    memcpy(dst_host, src, bytes);
  }
}

void rel_fill(fd_backend backend, void *dst, unsigned char byte, size_t bytes) {
  if (backend == FD_BACKEND_CUDA) {
    if (rel_cuda_memset_async(dst, byte, bytes, NULL) || fd_gpu_synchronize())
      fail_msg("device memset of %zu bytes failed", bytes);
  } else {
    memset(dst, byte, bytes);
  }
}

void rel_sync(fd_backend backend) {
  if (backend == FD_BACKEND_CUDA && fd_gpu_synchronize())
    fail_msg("cudaDeviceSynchronize reported an error (kernel fault?)");
}

/* ---- Runs with private outputs -------------------------------------------------- */

fd_status rel_run_private(const fd_plan *plan, const fd_tensors *t, unsigned char ws_fill, void *stream,
                          void *out_host, float *lse_host, fd_error *err) {
  const fd_problem *p = &plan->problem;
  const fd_backend be = plan->backend;
  const size_t rows = (size_t)p->batch * p->q_len * p->num_heads_q;
  const fd_dtype out_dtype = p->out_dtype ? p->out_dtype : p->dtype;
  const size_t out_bytes = rows * p->head_dim * fd_dtype_size(out_dtype), lse_bytes = rows * sizeof(float);
  void *out = rel_alloc(be, out_bytes);
  float *lse = rel_alloc(be, lse_bytes);
  void *ws = plan->workspace_size ? rel_alloc(be, plan->workspace_size) : NULL;
  rel_fill(be, out, 0xff, out_bytes);
  rel_fill(be, lse, 0xff, lse_bytes);
  if (ws) rel_fill(be, ws, ws_fill, plan->workspace_size);
  fd_tensors mine = *t;
  mine.out = out;
  mine.lse = lse;
  memset(mine.out_strides, 0, sizeof mine.out_strides);
  memset(mine.lse_strides, 0, sizeof mine.lse_strides);
  fd_status st = fd_run(plan, &mine, ws, plan->workspace_size, stream, err);
  if (be == FD_BACKEND_CUDA && stream && rel_cuda_stream_sync(stream)) fail_msg("stream synchronize failed");
  rel_sync(be);
  rel_get(be, out_host, out, out_bytes);
  rel_get(be, lse_host, lse, lse_bytes);
  rel_free(be, out);
  rel_free(be, lse);
  rel_free(be, ws);
  return st;
}

/* ---- Values and comparisons --------------------------------------------------------- */

double rel_load(fd_dtype dtype, const void *base, int64_t i) { return fd_load_elem(base, dtype, i); }

void rel_store(fd_dtype dtype, void *base, int64_t i, double x) {
  fd_store_elem(base, dtype, i, (float)x);
}

int32_t rel_visible(const fd_problem *p, int32_t kv_len, int32_t t, int32_t *lo) {
  const int32_t T = p->q_len > 0 ? p->q_len : 1;
  *lo = 0;
  if (p->non_causal) return kv_len;
  const int32_t pos = kv_len - T + t;
  if (pos < 0) return pos + 1;
  if (p->has_window && p->window_left >= 0 && pos - p->window_left > 0) *lo = pos - p->window_left;
  return pos + 1 - *lo;
}

int rel_check_dense(const fd_problem *p, const int32_t *kv_len_host, const void *out, const float *lse,
                    const double *ref, const double *ref_lse, double factor, double abs_tol,
                    double lse_abs_tol, const char *what) {
  return rel_check_dense_sinks(p, kv_len_host, NULL, out, lse, ref, ref_lse, factor, abs_tol, lse_abs_tol, what);
}

int rel_check_dense_sinks(const fd_problem *p, const int32_t *kv_len_host, const float *sinks_host,
                          const void *out, const float *lse, const double *ref, const double *ref_lse,
                          double factor, double abs_tol, double lse_abs_tol, const char *what) {
  int fails = 0;
  const int32_t D = p->head_dim, T = p->q_len > 0 ? p->q_len : 1;
  const fd_dtype out_dtype = p->out_dtype ? p->out_dtype : p->dtype;
  const double floor_rel = fd_tol_out_floor(p->dtype) * factor, ltol = fd_tol_lse(p->dtype);
  for (int32_t b = 0; b < p->batch; b++)
    for (int32_t t = 0; t < T; t++)
      for (int32_t h = 0; h < p->num_heads_q; h++) {
        const int64_t row = ((int64_t)b * T + t) * p->num_heads_q + h;
        const int64_t lrow = ((int64_t)b * p->num_heads_q + h) * T + t;
        int32_t lo;
        const int32_t visible = rel_visible(p, kv_len_host[b], t, &lo);
        /* a NaN or +inf sink makes its rows NaN (out and lse), nothing else */
        if (sinks_host && (isnan(sinks_host[h]) || sinks_host[h] == INFINITY)) {
          int all_nan = !lse || isnan(lse[lrow]), any_nan = 0;
          for (int32_t i = 0; i < D; i++) any_nan |= isnan(rel_load(out_dtype, out, row * D + i));
          if (!(all_nan && any_nan) && fails++ < 8)
            fprintf(stderr, "FAIL %s: row b=%d t=%d h=%d has a NaN/+inf sink but is not NaN\n", what,
                    b, t, h);
          continue;
        }
        double ref_max = 0.0, err = 0.0;
        int finite = 1, worst = 0;
        for (int32_t i = 0; i < D; i++) {
          const double o = rel_load(out_dtype, out, row * D + i), r = ref[row * D + i];
          if (!isfinite(o)) finite = 0;
          if (fabs(r) > ref_max) ref_max = fabs(r);
          if (fabs(o - r) > err) err = fabs(o - r), worst = i;
          if (visible <= 0 && !(o == 0.0)) finite = 0;
        }
        const double l = lse ? lse[lrow] : 0.0;
        int bad = !finite || !(err <= floor_rel * ref_max + abs_tol);
        if (lse) {
          if (visible <= 0 && sinks_host) /* the sink (-inf: no sink) */
            bad |= !(l == sinks_host[h] || fabs(l - sinks_host[h]) <= ltol * fmax(1.0, fabs(sinks_host[h])));
          else if (visible <= 0)
            bad |= !(isinf(l) && l < 0);
          else
            bad |= !isfinite(l) ||
                   !(fabs(l - ref_lse[lrow]) <= ltol * fmax(1.0, fabs(ref_lse[lrow])) + lse_abs_tol);
        }
        if (bad && fails++ < 8)
          fprintf(stderr,
                  "FAIL %s: row b=%d t=%d h=%d (sees %d keys): out[%d] = %.9g vs oracle %.9g (max err "
                  "%.3g, tol %.3g%s), lse %.9g vs %.9g\n",
                  what, b, t, h, visible, worst, rel_load(out_dtype, out, row * D + worst),
                  ref[row * D + worst], err, floor_rel * ref_max + abs_tol,
                  finite ? "" : ", NOT FINITE or not 0", l, lse ? ref_lse[lrow] : 0.0);
      }
  return fails;
}

void rel_oracle(const fd_problem *p, const fd_tensors *t, double **ref, double **ref_lse) {
  fd_problem rp = *p;
  rp.backend = FD_BACKEND_REFERENCE;
  rp.kv_len_hint = NULL;
  rp.num_splits = 0;
  fd_plan plan;
  fd_error err;
  if (fd_plan_init(&plan, &rp, &err) != FD_STATUS_OK) fail_msg("reference plan: %s", err.message);
  const size_t rows = (size_t)plan.problem.batch * plan.problem.q_len * plan.problem.num_heads_q;
  *ref = malloc(rows * plan.problem.head_dim * sizeof **ref);
  *ref_lse = malloc(rows * sizeof **ref_lse);
  if (!*ref || !*ref_lse) fail_msg("out of memory for the oracle");
  fd_tensors ht = *t;
  if (fd_reference_f64(&plan, &ht, *ref, *ref_lse, &err) != FD_STATUS_OK) fail_msg("oracle: %s", err.message);
}

void rel_assert_same(const void *a, const void *b, size_t n, const char *what) {
  const unsigned char *x = a, *y = b;
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i]) fail_msg("%s: not bitwise equal (first difference at byte %zu of %zu)", what, i, n);
}
