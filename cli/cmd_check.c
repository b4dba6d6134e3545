/*
 * cmd_check.c — `flashdecode check`: one backend call on random inputs
 * against the float64 reference (fd_reference_f64), with a verdict.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "dtype.h"
#include "gpu.h"
#include "internal.h" /* fd_reference_f64 */
#include "problem.h"

/* Tolerance on max |out - ref| / (1 + |ref|) and on the lse error. */
static double tolerance(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 1e-5;
    case FD_DTYPE_F16: return 2e-3;
    case FD_DTYPE_BF16: return 1.6e-2;
    case FD_DTYPE_E4M3:
    case FD_DTYPE_E5M2: break; /* a cache type: the tolerance is the q dtype's */
  }
  return 0.0;
}

/* The backend's out and lse, in p->host (CPU: computed there; CUDA: copied back). */
static fd_status run_backend(problem *p, const fd_plan *plan, fd_error *err) {
  fd_status st;
  if (plan->backend != FD_BACKEND_CUDA) {
    void *ws = plan->workspace_size ? malloc(plan->workspace_size) : NULL;
    if (plan->workspace_size && !ws) {
      snprintf(err->message, sizeof err->message, "workspace: out of host memory");
      return err->status = FD_STATUS_OUT_OF_MEMORY;
    }
    fd_tensors t = problem_fd_tensors(p, &p->host);
    st = fd_run(plan, &t, ws, plan->workspace_size, NULL, err);
    free(ws);
    return st;
  }
  void *stream = NULL, *ws = NULL;
  problem_tensors dev;
  memset(&dev, 0, sizeof dev);
  if ((st = gpu_stream_create(&stream, err))) return st;
  if ((st = problem_device_alloc(p, &dev, NULL, err))) goto done;
  if ((st = problem_device_upload(p, &dev, stream, err))) goto done;
  if (plan->workspace_size && (st = gpu_malloc(&ws, plan->workspace_size, err))) goto done;
  fd_tensors t = problem_fd_tensors(p, &dev);
  if ((st = fd_run(plan, &t, ws, plan->workspace_size, stream, err))) goto done;
  if ((st = gpu_copy_to_host(p->host.out, dev.out, p->out_bytes, stream, err)) ||
      (st = gpu_copy_to_host(p->host.lse, dev.lse, p->lse_bytes, stream, err)) ||
      (st = gpu_stream_sync(stream, err)))
    goto done;
done:
  gpu_free(ws);
  problem_device_free(&dev, NULL);
  gpu_stream_destroy(stream);
  return st;
}

int cmd_check(int argc, char **argv) {
  problem_args a;
  int r = problem_parse(&a, argc, argv);
  if (r != 0) return r > 0 ? 0 : 2;
  if (problem_resolve_backend(&a)) return 1;

  problem p;
  fd_error err = {0};
  if (problem_make(&p, &a, &err)) {
    fprintf(stderr, "flashdecode check: %s\n", err.message);
    return 1;
  }
  problem_poison_outputs(&p);

  int status = 1;
  double *out64 = NULL, *lse64 = NULL;
  void *ref_out = NULL;
  float *ref_lse = NULL;
  fd_plan plan, ref_plan;
  fd_problem fp = p.fd;
  fp.kv_len_hint = p.host.kv_len;
  if (fd_plan_init(&plan, &fp, &err) == FD_STATUS_OK) args_report_splits("check", a.num_splits, &plan);
  if (err.status || run_backend(&p, &plan, &err)) {
    fprintf(stderr, "flashdecode check: %s: %s\n", fd_status_name(err.status), err.message);
    goto done;
  }

  /* The oracle, on the same host inputs (its own output buffers). */
  const fd_problem *f = &p.fd;
  const size_t D = (size_t)f->head_dim, Hq = (size_t)f->num_heads_q, T = (size_t)f->q_len;
  const size_t n_out = (size_t)f->batch * T * Hq * D, n_rows = (size_t)f->batch * Hq * T;
  out64 = malloc(n_out * sizeof(double));
  lse64 = malloc(n_rows * sizeof(double));
  ref_out = malloc(p.out_bytes);
  ref_lse = malloc(p.lse_bytes);
  if (!out64 || !lse64 || !ref_out || !ref_lse) {
    fprintf(stderr, "flashdecode check: out of host memory for the reference\n");
    goto done;
  }
  fd_problem rp = p.fd;
  rp.backend = FD_BACKEND_REFERENCE;
  problem_tensors ref_set = p.host;
  ref_set.out = ref_out;
  ref_set.lse = ref_lse;
  fd_tensors rt = problem_fd_tensors(&p, &ref_set);
  if (fd_plan_init(&ref_plan, &rp, &err) || fd_reference_f64(&ref_plan, &rt, out64, lse64, &err)) {
    fprintf(stderr, "flashdecode check: reference: %s: %s\n", fd_status_name(err.status), err.message);
    goto done;
  }

  /* Compare. out [b][t][h][d], lse [b][h][t], both dense. */
  double max_abs = 0.0, max_err = 0.0, sum_d2 = 0.0, sum_r2 = 0.0, lse_err = 0.0;
  size_t nan_out = 0, nan_lse = 0, bad_empty = 0, worst = 0;
  for (size_t i = 0; i < n_out; i++) {
    double o = fd_load_elem(p.host.out, f->dtype, i), ref = out64[i];
    if (isnan(o)) {
      nan_out++;
      continue;
    }
    double d = fabs(o - ref), e = d / (1.0 + fabs(ref));
    if (d > max_abs) max_abs = d;
    if (e > max_err) {
      max_err = e;
      worst = i;
    }
    sum_d2 += d * d;
    sum_r2 += ref * ref;
  }
  for (size_t row = 0; row < n_rows; row++) {
    double l = p.host.lse[row], ref = lse64[row];
    if (isnan(l)) {
      nan_lse++;
    } else if (isinf(ref) && ref < 0) {
      /* a row that sees no key: lse = -inf and out = 0 exactly */
      size_t b = row / (Hq * T), h = row / T % Hq, t = row % T;
      size_t base = ((b * T + t) * Hq + h) * D;
      int zero = 1;
      for (size_t d = 0; d < D; d++) zero &= fd_load_elem(p.host.out, f->dtype, base + d) == 0.0;
      if (!(isinf(l) && l < 0) || !zero) bad_empty++;
    } else {
      double e = fabs(l - ref) / (1.0 + fabs(ref));
      if (!(e <= lse_err)) lse_err = e; /* also catches inf - finite */
    }
  }
  if (nan_out) max_abs = max_err = NAN; /* print nan rather than the finite part */
  if (nan_lse) lse_err = NAN;
  const double tol = tolerance(f->dtype);
  const double rel_l2 = nan_out ? NAN : sum_r2 > 0.0 ? sqrt(sum_d2 / sum_r2) : sqrt(sum_d2);
  const int pass = bad_empty == 0 && max_err <= tol && lse_err <= tol; /* false for NaN */

  char text[512];
  problem_describe(&p, &a, text, sizeof text);
  printf("check %s num_splits=%d max_abs=%.3e max_err=%.3e rel_l2=%.3e lse_err=%.3e tol=%.1e %s\n",
         text, plan.num_splits, max_abs, max_err, rel_l2, lse_err, tol, pass ? "PASS" : "FAIL");
  if (!pass) {
    size_t d = worst % D, h = worst / D % Hq, t = worst / (D * Hq) % T, b = worst / (D * Hq * T);
    printf("  nan_out=%zu nan_lse=%zu bad_empty_rows=%zu worst: b=%zu t=%zu h=%zu d=%zu out=%.8g ref=%.8g\n",
           nan_out, nan_lse, bad_empty, b, t, h, d, fd_load_elem(p.host.out, f->dtype, worst), out64[worst]);
  }
  status = pass ? 0 : 1;
done:
  free(out64);
  free(lse64);
  free(ref_out);
  free(ref_lse);
  problem_free(&p);
  return status;
}
