/*
 * cmd_bench.c — `flashdecode bench`: times one decode-attention problem on
 * random inputs, with the requested split count and, when that splits, with
 * num_splits = 1.
 * CPU: clock_gettime around each call, the calls rotating over input sets
 * that together exceed 4x the last-level cache (so K and V come from
 * memory, as in a model whose layers each have their own cache), and the
 * machine's read bandwidth measured in the same run by a plain read loop
 * (membw.c). CUDA: events around a rotation over buffer sets that together
 * exceed twice the L2, replayed as a CUDA graph (and launched plainly,
 * "eager"). Medians over the iterations.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "gpu.h"
#include "membw.h"
#include "problem.h"
#include "timer.h"

/* The buffer sets of one rotation exceed twice the L2: the device's, and at
 * least the H200's 60 MiB. */
#define L2_FLOOR_BYTES (60.0 * 1048576.0)
#define MAX_SETS 1024
/* CPU: the input sets' K and V exceed SETS_LLC_MULT x the last-level cache
 * (at least LLC_FLOOR_BYTES); they take at most a quarter of physical memory.
 * 4x: with 2x, a cache that does not evict in LRU order may still hold part
 * of a set when its turn comes again. */
#define SETS_LLC_MULT 4.0
#define LLC_FLOOR_BYTES (32.0 * 1048576.0)
/* CPU: timed passes of the read-bandwidth loop. */
#define MEMBW_PASSES 7

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *values, int n) {
  qsort(values, (size_t)n, sizeof(double), compare_doubles);
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/* ---- CPU ---- */

/* Median µs of one call; call i runs on set i % n_sets (sets[0] = the
 * problem's own tensors). Warm-up: one call per set, at least two. */
static fd_status time_cpu(const fd_plan *plan, const fd_tensors *sets, int n_sets, void *ws,
                          int iters, double *us, fd_error *err) {
  double *times = malloc((size_t)iters * sizeof(double));
  if (!times) {
    snprintf(err->message, sizeof err->message, "out of host memory");
    return err->status = FD_STATUS_OUT_OF_MEMORY;
  }
  fd_status st = FD_STATUS_OK;
  const int warm = n_sets > 2 ? n_sets : 2;
  for (int i = 0; i < warm && !st; i++)
    st = fd_run(plan, &sets[i % n_sets], ws, plan->workspace_size, NULL, err);
  for (int i = 0; i < iters && !st; i++) {
    const fd_tensors *t = &sets[(i + warm) % n_sets];
    double t0 = timer_seconds();
    st = fd_run(plan, t, ws, plan->workspace_size, NULL, err);
    times[i] = (timer_seconds() - t0) * 1e6;
  }
  if (!st) *us = median(times, iters);
  free(times);
  return st;
}

/* Input sets for the CPU rotation: enough that their K and V exceed
 * SETS_LLC_MULT x the last-level cache (within a quarter of physical memory). */
static int cpu_set_count(const problem *p) {
  double llc = (double)membw_llc_bytes();
  double want = SETS_LLC_MULT * (llc > LLC_FLOOR_BYTES ? llc : LLC_FLOOR_BYTES);
  const double cache = problem_cache_bytes(p); /* K + V, or the MLA latent + rope caches */
  double set_bytes = cache + (double)p->q_bytes + (double)p->q_pe_bytes + (double)p->out_bytes;
  if (set_bytes < 1.0) set_bytes = 1.0;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double cap = pages > 0 && page > 0 ? 0.25 * (double)pages * (double)page : 4.0 * want;
  int n = (int)ceil(want / (cache > 1.0 ? cache : 1.0));
  if (n > MAX_SETS) n = MAX_SETS;
  while (n > 1 && n * set_bytes > cap) n--;
  return n < 1 ? 1 : n;
}

/* The CPU measurement: read bandwidth, then both plans on rotating sets. */
static fd_status bench_cpu(problem *p, const problem_args *a, const fd_plan *plan,
                           const fd_plan *plan1, void *ws, int iters, double *us, double *us1,
                           membw_result *bw, int *n_sets_out, fd_error *err) {
  if (membw_measure(plan->num_threads, MEMBW_PASSES, bw) != 0)
    fprintf(stderr, "flashdecode bench: read-bandwidth buffer: out of memory; not measured\n");
  const int n_sets = cpu_set_count(p);
  problem *extra = n_sets > 1 ? calloc((size_t)n_sets - 1, sizeof *extra) : NULL;
  fd_tensors *sets = calloc((size_t)n_sets, sizeof *sets);
  int made = 0;
  fd_status st = FD_STATUS_OK;
  if (!sets || (n_sets > 1 && !extra)) {
    snprintf(err->message, sizeof err->message, "out of host memory");
    st = err->status = FD_STATUS_OUT_OF_MEMORY;
  }
  if (!st) sets[0] = problem_fd_tensors(p, &p->host);
  for (int s = 1; s < n_sets && !st; s++) {
    problem_args as = *a;
    as.seed = a->seed + (uint64_t)s;
    if ((st = problem_make(&extra[s - 1], &as, err))) break;
    made = s;
    sets[s] = problem_fd_tensors(&extra[s - 1], &extra[s - 1].host);
  }
  if (!st && !(st = time_cpu(plan, sets, n_sets, ws, iters, us, err))) {
    if (plan->num_splits == 1) *us1 = *us; /* the plan is the split-1 plan: timed once */
    else st = time_cpu(plan1, sets, n_sets, ws, iters, us1, err);
  }
  for (int s = 0; s < made; s++) problem_free(&extra[s]);
  free(extra);
  free(sets);
  *n_sets_out = n_sets;
  return st;
}

/* ---- CUDA ---- */

typedef struct cuda_bench {
  void *stream;
  void *start, *stop;  /* events */
  problem_tensors *sets; /* [n_sets] device buffer sets */
  fd_tensors *tensors;   /* [n_sets] */
  int n_sets;
  void *workspace;       /* device, the larger plan's size */
  int iters;
} cuda_bench;

/* One rotation: a call on every set. */
static fd_status enqueue_rotation(const cuda_bench *cb, const fd_plan *plan, fd_error *err) {
  for (int s = 0; s < cb->n_sets; s++) {
    fd_status st = fd_run(plan, &cb->tensors[s], cb->workspace, plan->workspace_size, cb->stream, err);
    if (st != FD_STATUS_OK) return st;
  }
  return FD_STATUS_OK;
}

/* Median µs per call over iters timed rotations, plain launches
 * (graph_exec NULL) or graph replays. */
static fd_status time_rotations(const cuda_bench *cb, const fd_plan *plan, void *graph_exec,
                                double *us, fd_error *err) {
  double *times = malloc((size_t)cb->iters * sizeof(double));
  if (!times) {
    snprintf(err->message, sizeof err->message, "out of host memory");
    return err->status = FD_STATUS_OUT_OF_MEMORY;
  }
  fd_status st = FD_STATUS_OK;
  for (int i = -1; i < cb->iters && !st; i++) { /* i = -1: warm-up */
    float ms = 0.0f;
    if ((st = gpu_event_record(cb->start, cb->stream, err))) break;
    st = graph_exec ? gpu_graph_launch(graph_exec, cb->stream, err) : enqueue_rotation(cb, plan, err);
    if (st || (st = gpu_event_record(cb->stop, cb->stream, err)) ||
        (st = gpu_event_elapsed_ms(cb->start, cb->stop, &ms, err)))
      break;
    if (i >= 0) times[i] = 1000.0 * ms / cb->n_sets;
  }
  if (!st) *us = median(times, cb->iters);
  free(times);
  return st;
}

/* Graph replay timing; *us = NAN (and a note on stderr) when capture fails. */
static fd_status time_graph(const cuda_bench *cb, const fd_plan *plan, double *us, fd_error *err) {
  *us = NAN;
  void *exec = NULL;
  fd_error cap = {0};
  fd_status st = gpu_capture_begin(cb->stream, &cap);
  if (!st) {
    fd_status run = enqueue_rotation(cb, plan, &cap);
    st = gpu_capture_end(cb->stream, &exec, run ? NULL : &cap);
    if (run) st = run;
  }
  if (st) {
    fprintf(stderr, "flashdecode bench: CUDA graph capture failed (%s); graph time not measured\n",
            cap.message);
    gpu_graph_destroy(exec);
    return FD_STATUS_OK;
  }
  st = time_rotations(cb, plan, exec, us, err);
  gpu_graph_destroy(exec);
  return st;
}

static void free_cuda_bench(cuda_bench *cb) {
  /* set 0 owns the shared kv_len and block_table: free it last */
  for (int s = cb->n_sets - 1; s >= 0; s--) problem_device_free(&cb->sets[s], s ? &cb->sets[0] : NULL);
  free(cb->sets);
  free(cb->tensors);
  gpu_free(cb->workspace);
  gpu_event_destroy(cb->start);
  gpu_event_destroy(cb->stop);
  gpu_stream_destroy(cb->stream);
  memset(cb, 0, sizeof *cb);
}

static fd_status setup_cuda_bench(cuda_bench *cb, problem *p, size_t ws_bytes, int iters,
                                  fd_error *err) {
  memset(cb, 0, sizeof *cb);
  cb->iters = iters;
  double set_bytes = problem_set_bytes(p);
  double l2 = (double)gpu_l2_cache_bytes();
  double flush = 2.0 * (l2 > L2_FLOOR_BYTES ? l2 : L2_FLOOR_BYTES);
  int n = set_bytes >= flush ? 1 : (int)(flush / set_bytes) + 1;
  if (n > MAX_SETS) n = MAX_SETS;
  fd_status st;
  if ((st = gpu_stream_create(&cb->stream, err)) || (st = gpu_event_create(&cb->start, err)) ||
      (st = gpu_event_create(&cb->stop, err)))
    return st;
  if (ws_bytes && (st = gpu_malloc(&cb->workspace, ws_bytes, err))) return st;
  cb->sets = calloc((size_t)n, sizeof *cb->sets);
  cb->tensors = calloc((size_t)n, sizeof *cb->tensors);
  if (!cb->sets || !cb->tensors) {
    snprintf(err->message, sizeof err->message, "out of host memory");
    return err->status = FD_STATUS_OUT_OF_MEMORY;
  }
  /* Set 0 owns kv_len and block_table; the others share them. */
  for (int s = 0; s < n; s++) {
    if ((st = problem_device_alloc(p, &cb->sets[s], s ? &cb->sets[0] : NULL, err))) return st;
    cb->n_sets = s + 1;
    if ((st = problem_device_upload(p, &cb->sets[s], cb->stream, err))) return st;
    cb->tensors[s] = problem_fd_tensors(p, &cb->sets[s]);
  }
  return FD_STATUS_OK;
}

int cmd_bench(int argc, char **argv) {
  problem_args a;
  int r = problem_parse(&a, argc, argv);
  if (r != 0) return r > 0 ? 0 : 2;
  if (problem_resolve_backend(&a)) return 1;
  const int cuda = a.backend == FD_BACKEND_CUDA;
  const int iters = a.iters > 0 ? a.iters : cuda ? 100 : 20;

  problem p;
  fd_error err = {0};
  if (problem_make(&p, &a, &err)) {
    fprintf(stderr, "flashdecode bench: %s\n", err.message);
    return 1;
  }
  int status = 1;
  fd_plan plan, plan1;
  fd_problem fp = p.fd;
  fp.kv_len_hint = p.host.kv_len; /* automatic splits sized from the real lengths */
  fd_problem fp1 = fp;
  fp1.num_splits = 1;
  double us = NAN, us1 = NAN, us_eager = NAN, us1_eager = NAN;
  cuda_bench cb;
  memset(&cb, 0, sizeof cb);
  membw_result bw;
  memset(&bw, 0, sizeof bw);
  int cpu_sets = 0;
  void *ws = NULL;
  if (fd_plan_init(&plan, &fp, &err) || fd_plan_init(&plan1, &fp1, &err)) goto fail;
  args_report_splits("bench", a.num_splits, &plan);
  size_t ws_bytes = plan.workspace_size > plan1.workspace_size ? plan.workspace_size
                                                               : plan1.workspace_size;
  if (!cuda) {
    ws = ws_bytes ? malloc(ws_bytes) : NULL;
    if (ws_bytes && !ws) {
      snprintf(err.message, sizeof err.message, "workspace: out of host memory");
      goto fail;
    }
    if (bench_cpu(&p, &a, &plan, &plan1, ws, iters, &us, &us1, &bw, &cpu_sets, &err)) goto fail;
  } else {
    const int split1 = plan.num_splits == 1; /* the plan is the split-1 plan: timed once */
    if (setup_cuda_bench(&cb, &p, ws_bytes, iters, &err) ||
        time_rotations(&cb, &plan, NULL, &us_eager, &err) ||
        (!split1 && time_rotations(&cb, &plan1, NULL, &us1_eager, &err)) ||
        time_graph(&cb, &plan, &us, &err) || (!split1 && time_graph(&cb, &plan1, &us1, &err)))
      goto fail;
    if (split1) {
      us1_eager = us_eager;
      us1 = us;
    }
    if (isnan(us) || isnan(us1)) { /* no graph: report the plain launches */
      us = us_eager;
      us1 = us1_eager;
    }
  }

  char text[512];
  problem_describe(&p, &a, text, sizeof text);
  const double gbps = problem_kv_bytes_read(&p) / (us * 1e-6) / 1e9;
  printf("bench %s num_splits=%d us=%.2f gbps=%.1f us_split1=%.2f", text, plan.num_splits, us,
         gbps, us1);
  /* a speedup over num_splits = 1 only where the plan splits (else it is that plan) */
  if (plan.num_splits > 1) printf(" speedup=%.2f", us1 / us);
  if (cuda)
    printf(" us_eager=%.2f us_split1_eager=%.2f sets=%d", us_eager, us1_eager, cb.n_sets);
  else
    printf(" threads=%d sets=%d read_gbps=%.1f read_streams=%d pct_read=%.1f", plan.num_threads,
           cpu_sets, bw.read_gbps, bw.streams,
           bw.read_gbps > 0.0 ? 100.0 * gbps / bw.read_gbps : NAN);
  printf(" iters=%d\n", iters);
  status = 0;
  goto done;
fail:
  fprintf(stderr, "flashdecode bench: %s: %s\n", fd_status_name(err.status), err.message);
done:
  free(ws);
  free_cuda_bench(&cb);
  problem_free(&p);
  return status;
}
