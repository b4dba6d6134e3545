// bench/peers/ggml_fa_bench.c — llama.cpp's CPU flash attention (ggml_flash_attn_ext) timed on
// one decode shape, for bench/bench_cpu.py's llama.cpp peer rows.
//
// Built by bench/peers/fetch_llamacpp.sh against the ggml that llama-cpp-python's sdist vendors.
//
// What it runs (the way llama.cpp's src/llama-graph.cpp calls it for decode):
//   q     [head_dim, 1 (q_len), num_heads_q, batch]  f32
//   K, V  stored as llama.cpp's cache stores them, [head_dim, num_heads_kv, kv_len, batch]
//         (one sequence = one stream; rows of a token's heads adjacent, i.e. the same memory
//         order as flashdecode's [batch, kv_len, num_heads_kv, head_dim]), of type f16 or q8_0,
//         seen through ggml_permute(0, 2, 1, 3) as [head_dim, kv_len, num_heads_kv, batch]
//   mask  none by default (ggml's CPU op takes NULL: full attention); --mask passes an all-zero
//         f16 mask [kv_len, 1, 1, batch] as llama.cpp always does
//   scale 1/sqrt(head_dim), no ALiBi, no soft-cap; precision GGML_PREC_F32 (as llama.cpp sets)
//   out   [head_dim, num_heads_q, 1, batch] f32
// Inputs: normal random values (K/V rounded to f16 or quantized to q8_0 by ggml's own routines).
//
// Timing: one graph of the one op, computed with ggml_graph_compute and a threadpool made once
// (--threads; ggml built with OpenMP, as llama.cpp's default build). The K/V pointers rotate over
// --sets copies of the inputs (default: K+V over the copies >= max(4 x LLC, 32 MiB), at most 64,
// as bench_cpu.py's set_count), so they come from memory on every call. Warm-up: one call per set
// (at least 3); then as bench_cpu.py's time_rotation: the number of calls from --budget-s and the
// first call's time (at least 7, at most max(20, 2 x sets) and 200); the median is reported.
// bytes = K+V as ggml stores them: 2 x batch x kv_len x num_heads_kv x ggml_row_size(type,
// head_dim) (f16 2 bytes an element, q8_0 34 bytes per 32 elements); gbps = bytes / median.
//
// Output: one line of key=value fields (us= median µs a call, us_min=, bytes=, gbps=, ...).
// --check instead runs small shapes of both types (B=1 over the split-KV path, B=2 over the
// row-chunk path) against a float64 attention over the dequantized K/V and the f32 q, prints the
// largest error relative to max|ref| per case, and exits 1 when one exceeds its tolerance.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ggml.h"
#include "ggml-cpu.h"

#define MIB (1024.0 * 1024.0)
#define MAX_SETS 64

struct opts {
    enum ggml_type type;
    int batch, hq, hkv, d, n, threads, sets, mask;
    double budget_s;
};

// ---- random inputs ----------------------------------------------------------

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double next_uniform(void) {  // xorshift64*, in (0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}

static float next_normal(void) {  // Box-Muller
    double u = next_uniform(), v = next_uniform();
    return (float) (sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static void fill_normal(float * x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = next_normal();
}

// rows of head_dim floats -> type (f16 or q8_0), with ggml's own conversion
static void encode_rows(enum ggml_type type, const float * src, void * dst, int64_t rows, int d) {
    if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(src, (ggml_fp16_t *) dst, rows * d);
    } else {
        ggml_quantize_chunk(type, src, dst, 0, rows, d, NULL);
    }
}

static void * xalloc(size_t bytes) {
    void * p = aligned_alloc(64, (bytes + 63) & ~(size_t) 63);
    if (!p) {
        fprintf(stderr, "ggml_fa_bench: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void * a, const void * b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

// ---- the graph ----------------------------------------------------------------

// One flash-attention op over tensors whose data pointers the caller sets (no_alloc context).
struct fa_graph {
    struct ggml_context * ctx;
    struct ggml_cgraph * gf;
    struct ggml_tensor *q, *kc, *vc, *k, *v, *mask, *out;
    struct ggml_threadpool * tp;
    struct ggml_cplan plan;
    void * work;
};

static void graph_init(struct fa_graph * g, const struct opts * o) {
    struct ggml_init_params ip = {
        .mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead(),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    g->ctx = ggml_init(ip);
    g->q = ggml_new_tensor_4d(g->ctx, GGML_TYPE_F32, o->d, 1, o->hq, o->batch);
    // the caches as llama.cpp stores them, then its permute to [d, kv_len, hkv, batch]
    g->kc = ggml_new_tensor_4d(g->ctx, o->type, o->d, o->hkv, o->n, o->batch);
    g->vc = ggml_new_tensor_4d(g->ctx, o->type, o->d, o->hkv, o->n, o->batch);
    g->k = ggml_permute(g->ctx, g->kc, 0, 2, 1, 3);
    g->v = ggml_permute(g->ctx, g->vc, 0, 2, 1, 3);
    g->mask = o->mask ? ggml_new_tensor_4d(g->ctx, GGML_TYPE_F16, o->n, 1, 1, o->batch) : NULL;
    g->out = ggml_flash_attn_ext(g->ctx, g->q, g->k, g->v, g->mask, 1.0f / sqrtf((float) o->d),
                                 0.0f, 0.0f);
    ggml_prec_set_acc(g->out, GGML_PREC_F32);
    g->gf = ggml_new_graph(g->ctx);
    ggml_build_forward_expand(g->gf, g->out);

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(o->threads);
    g->tp = ggml_threadpool_new(&tpp);
    g->plan = ggml_graph_plan(g->gf, o->threads, g->tp);
    g->work = g->plan.work_size ? xalloc(g->plan.work_size) : NULL;
    g->plan.work_data = g->work;
}

static void graph_free(struct fa_graph * g) {
    ggml_threadpool_free(g->tp);
    free(g->work);
    ggml_free(g->ctx);
}

// Points the op at one set of K/V (the permuted views start at their sources' data).
static void graph_bind(struct fa_graph * g, void * k, void * v) {
    g->kc->data = k;
    g->k->data = k;
    g->vc->data = v;
    g->v->data = v;
}

static void graph_run(struct fa_graph * g) {
    enum ggml_status st = ggml_graph_compute(g->gf, &g->plan);
    if (st != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "ggml_fa_bench: ggml_graph_compute failed (%d)\n", (int) st);
        exit(2);
    }
}

// ---- timing -------------------------------------------------------------------

static long llc_bytes(void) {
#ifdef _SC_LEVEL3_CACHE_SIZE
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v > 0) return v;
#endif
    return 32L << 20;
}

static int bench(const struct opts * o) {
    const size_t row = ggml_row_size(o->type, o->d);
    const size_t rows = (size_t) o->batch * o->n * o->hkv;  // rows of K (and of V)
    const size_t half = rows * row;                          // bytes of K (and of V)
    const double bytes = 2.0 * (double) half;
    int sets = o->sets;
    if (sets <= 0) {  // bench_cpu.py's set_count: K+V over the sets >= max(4 x LLC, 32 MiB)
        double want = fmax(4.0 * (double) llc_bytes(), 32.0 * MIB);
        sets = (int) ceil(want / bytes);
        if (sets > MAX_SETS) sets = MAX_SETS;
        if (sets < 1) sets = 1;
    }

    struct fa_graph g;
    graph_init(&g, o);
    float * q = xalloc((size_t) o->batch * o->hq * o->d * sizeof(float));
    float * out = xalloc((size_t) o->batch * o->hq * o->d * sizeof(float));
    fill_normal(q, (size_t) o->batch * o->hq * o->d);
    g.q->data = q;
    g.out->data = out;
    if (g.mask) {
        g.mask->data = xalloc(ggml_nbytes(g.mask));
        memset(g.mask->data, 0, ggml_nbytes(g.mask));  // f16 +0: every key visible
    }

    // set 0 from random rows (in chunks, to bound the float scratch), the others copies of it
    void ** ks = calloc(sets, sizeof(void *));
    void ** vs = calloc(sets, sizeof(void *));
    const size_t chunk_rows = 65536;
    float * tmp = xalloc(chunk_rows * o->d * sizeof(float));
    for (int s = 0; s < sets; s++) {
        ks[s] = xalloc(half);
        vs[s] = xalloc(half);
    }
    for (int which = 0; which < 2; which++) {
        char * dst = which ? vs[0] : ks[0];
        for (size_t r = 0; r < rows; r += chunk_rows) {
            size_t nr = rows - r < chunk_rows ? rows - r : chunk_rows;
            fill_normal(tmp, nr * o->d);
            encode_rows(o->type, tmp, dst + r * row, (int64_t) nr, o->d);
        }
    }
    free(tmp);
    for (int s = 1; s < sets; s++) {
        memcpy(ks[s], ks[0], half);
        memcpy(vs[s], vs[0], half);
    }

    // warm-up: one call per set, at least 3
    for (int i = 0; i < (sets > 3 ? sets : 3); i++) {
        graph_bind(&g, ks[i % sets], vs[i % sets]);
        graph_run(&g);
    }
    graph_bind(&g, ks[0], vs[0]);
    double t0 = now_s();
    graph_run(&g);
    double first = now_s() - t0;
    long iters = (long) (o->budget_s / fmax(first, 1e-6));
    long cap = 2L * sets > 20 ? 2L * sets : 20;
    if (cap > 200) cap = 200;
    if (iters > cap) iters = cap;
    if (iters < 7) iters = 7;
    double * t = calloc(iters, sizeof(double));
    for (long i = 0; i < iters; i++) {
        int s = (int) ((i + 1) % sets);
        graph_bind(&g, ks[s], vs[s]);
        t0 = now_s();
        graph_run(&g);
        t[i] = now_s() - t0;
    }
    qsort(t, iters, sizeof(double), cmp_double);
    double med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);

    printf("type=%s batch=%d hq=%d hkv=%d d=%d n=%d threads=%d sets=%d iters=%ld mask=%d "
           "us=%.2f us_min=%.2f bytes=%.0f gbps=%.3f\n",
           ggml_type_name(o->type), o->batch, o->hq, o->hkv, o->d, o->n, o->threads, sets, iters,
           o->mask, med * 1e6, t[0] * 1e6, bytes, bytes / med / 1e9);

    for (int s = 0; s < sets; s++) {
        free(ks[s]);
        free(vs[s]);
    }
    free(ks);
    free(vs);
    free(t);
    free(q);
    free(out);
    free(g.mask ? g.mask->data : NULL);
    graph_free(&g);
    return 0;
}

// ---- correctness: against float64 over what ggml reads ------------------------------

static double check_case(enum ggml_type type, int batch, int hq, int hkv, int d, int n, int threads,
                         int mask) {
    struct opts o = {type, batch, hq, hkv, d, n, threads, 1, mask, 0.0};
    struct fa_graph g;
    graph_init(&g, &o);
    const size_t row = ggml_row_size(type, d);
    const size_t rows = (size_t) batch * n * hkv;
    float * q = xalloc((size_t) batch * hq * d * sizeof(float));
    float * out = xalloc((size_t) batch * hq * d * sizeof(float));
    float * kf = xalloc(rows * d * sizeof(float));
    float * vf = xalloc(rows * d * sizeof(float));
    char * k = xalloc(rows * row);
    char * v = xalloc(rows * row);
    fill_normal(q, (size_t) batch * hq * d);
    fill_normal(kf, rows * d);
    fill_normal(vf, rows * d);
    encode_rows(type, kf, k, (int64_t) rows, d);
    encode_rows(type, vf, v, (int64_t) rows, d);
    // the reference reads the stored (rounded / quantized) values back through ggml's to_float
    const struct ggml_type_traits * tt = ggml_get_type_traits(type);
    tt->to_float(k, kf, (int64_t) rows * d);
    tt->to_float(v, vf, (int64_t) rows * d);
    g.q->data = q;
    g.out->data = out;
    if (g.mask) {
        g.mask->data = xalloc(ggml_nbytes(g.mask));
        memset(g.mask->data, 0, ggml_nbytes(g.mask));
    }
    graph_bind(&g, k, v);
    graph_run(&g);

    // out[b][h][:] = softmax(q[b][h] . K[b][:, h / group] * scale) @ V[b][:, h / group]
    const int group = hq / hkv;
    const double scale = 1.0 / sqrt((double) d);
    double * s = malloc(n * sizeof(double));
    double * acc = malloc(d * sizeof(double));
    double max_err = 0.0, max_ref = 0.0;
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < hq; h++) {
            const float * qr = q + ((size_t) b * hq + h) * d;
            const int kh = h / group;
            double m = -INFINITY, sum = 0.0;
            for (int j = 0; j < n; j++) {
                const float * kr = kf + (((size_t) b * n + j) * hkv + kh) * d;
                double dot = 0.0;
                for (int c = 0; c < d; c++) dot += (double) qr[c] * kr[c];
                s[j] = dot * scale;
                if (s[j] > m) m = s[j];
            }
            for (int c = 0; c < d; c++) acc[c] = 0.0;
            for (int j = 0; j < n; j++) {
                const double p = exp(s[j] - m);
                const float * vr = vf + (((size_t) b * n + j) * hkv + kh) * d;
                sum += p;
                for (int c = 0; c < d; c++) acc[c] += p * vr[c];
            }
            // ggml's out is [d, hq, 1, batch]
            const float * orow = out + ((size_t) b * hq + h) * d;
            for (int c = 0; c < d; c++) {
                const double ref = acc[c] / sum;
                if (fabs(ref) > max_ref) max_ref = fabs(ref);
                if (fabs(orow[c] - ref) > max_err) max_err = fabs(orow[c] - ref);
            }
        }
    }
    free(s);
    free(acc);
    free(q);
    free(out);
    free(kf);
    free(vf);
    free(k);
    free(v);
    free(g.mask ? g.mask->data : NULL);
    graph_free(&g);
    printf("check type=%s batch=%d hq=%d hkv=%d d=%d n=%d threads=%d mask=%d max_abs_err=%.3e "
           "max_ref=%.3e rel_err=%.3e\n",
           ggml_type_name(type), batch, hq, hkv, d, n, threads, mask, max_err, max_ref,
           max_err / max_ref);
    return max_err / max_ref;
}

static int check(int threads) {
    // tolerance relative to max|ref|: ggml rounds q to f16 (f16 caches) or quantizes it to q8_0
    // (q8_0 caches) before the dot products, and for f16 V accumulates P.V in an f16 vector
    // (ops.cpp VKQ16): 3e-3..1.2e-2 measured; a wrong head mapping or layout gives ~1
    const enum ggml_type types[2] = {GGML_TYPE_F16, GGML_TYPE_Q8_0};
    const double tol[2] = {3e-2, 3e-2};
    int bad = 0;
    for (int t = 0; t < 2; t++) {
        // B=1, 1000 keys: the split-KV path (kv_len >= 512, one sequence, f16 only); B=2: chunks
        bad += check_case(types[t], 1, 32, 8, 128, 1000, threads, 0) > tol[t];
        bad += check_case(types[t], 2, 8, 2, 128, 300, threads, 0) > tol[t];
        bad += check_case(types[t], 2, 8, 2, 128, 300, threads, 1) > tol[t];
    }
    printf("check: %s\n", bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}

// ---- main ---------------------------------------------------------------------

static void usage(void) {
    fprintf(stderr,
            "usage: ggml_fa_bench [--type f16|q8_0] [--batch B] [--hq H] [--hkv H] [--d D] [--n N]\n"
            "                     [--threads T] [--sets S] [--budget-s S] [--mask]\n"
            "       ggml_fa_bench --check [--threads T]\n");
}

int main(int argc, char ** argv) {
    struct opts o = {GGML_TYPE_F16, 1, 32, 8, 128, 4096, 1, 0, 0, 2.0};
    int do_check = 0;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        const char * val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) { do_check = 1; continue; }
        if (!strcmp(a, "--mask")) { o.mask = 1; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); return 0; }
        if (!val) { usage(); return 2; }
        i++;
        if (!strcmp(a, "--type")) {
            if (!strcmp(val, "f16")) o.type = GGML_TYPE_F16;
            else if (!strcmp(val, "q8_0")) o.type = GGML_TYPE_Q8_0;
            else { usage(); return 2; }
        } else if (!strcmp(a, "--batch")) o.batch = atoi(val);
        else if (!strcmp(a, "--hq")) o.hq = atoi(val);
        else if (!strcmp(a, "--hkv")) o.hkv = atoi(val);
        else if (!strcmp(a, "--d")) o.d = atoi(val);
        else if (!strcmp(a, "--n")) o.n = atoi(val);
        else if (!strcmp(a, "--threads")) o.threads = atoi(val);
        else if (!strcmp(a, "--sets")) o.sets = atoi(val);
        else if (!strcmp(a, "--budget-s")) o.budget_s = atof(val);
        else { usage(); return 2; }
    }
    if (o.batch < 1 || o.hq < 1 || o.hkv < 1 || o.hq % o.hkv || o.d < 1 || o.n < 1 ||
        o.threads < 1 || (o.type == GGML_TYPE_Q8_0 && o.d % 32)) {
        fprintf(stderr, "ggml_fa_bench: bad shape (hq %% hkv == 0; q8_0 needs d %% 32 == 0)\n");
        return 2;
    }
    // ggml_init once first: it sets up ggml's f16 tables before any conversion
    struct ggml_init_params ip = {.mem_size = 1024, .mem_buffer = NULL, .no_alloc = true};
    ggml_free(ggml_init(ip));
    ggml_cpu_init();
    return do_check ? check(o.threads) : bench(&o);
}
