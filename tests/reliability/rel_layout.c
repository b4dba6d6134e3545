/*
 * rel_layout.c — the tests about addresses (CPU and CUDA):
 *   page_offsets_past_2_32_elements, batch_stride_past_2_32_elements:
 *      64-bit offsets: page ids * page stride beyond 2^31 (and 2^32) elements,
 *      a batch stride of 2^30 elements, a KV pool above 4 GiB. The CPU maps
 *      the huge tensors with mmap(MAP_NORESERVE): only the pages the test
 *      writes (and the kernels read) are ever touched. Each huge-layout run
 *      must equal bitwise the same data in a compact layout, and the oracle.
 *   strided_out_lse_layouts, misaligned_bases_work_or_unsupported,
 *   each_pointer_misaligned_alone: output addressing: four strided layouts
 *      of out and lse (and of the inputs), base pointers moved off alignment
 *      (CPU: any element-aligned pointer works; CUDA: a clean
 *      FD_STATUS_UNSUPPORTED, nothing written); then one pointer or one
 *      stride at a time misaligned: CPU results bitwise equal to the aligned
 *      run; CUDA unsupported (lse, which needs no alignment, must still work).
 *   bad_page_ids_skipped_or_refused: block_table ids outside [0, num_pages):
 *      CUDA skips their keys (checked against the oracle without those
 *      pages); CPU refuses the call.
 */
#define _GNU_SOURCE /* MAP_NORESERVE, MAP_ANONYMOUS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rel.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16

/* ---- output layouts and misaligned pointers (through the harness) --------------- */

static void strided_out_lse_layouts(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_layout layouts[4] = {FD_LAYOUT_CONTIG, FD_LAYOUT_NONCONTIG, FD_LAYOUT_HEAD_MAJOR,
                                FD_LAYOUT_INTERLEAVED};
  const fd_dtype dtypes[3] = {F32, F16, BF16};
  for (int li = 0; li < 4; li++)
    for (int di = 0; di < 3; di++) {
      if (rel_quick() && di != li % 3) continue;
      const int n = li * 3 + di;
      fd_case c = rel_case(env);
      c.dtype = dtypes[di];
      c.layout = layouts[li];
      c.head_dim = n % 2 ? 64 : 128;
      c.num_heads_q = 8;
      c.num_heads_kv = n % 3 ? 2 : 8;
      c.batch = 3;
      c.kv_len[0] = 0, c.kv_len[1] = 97, c.kv_len[2] = 300 + n;
      c.q_len = n % 4 == 1 ? 3 : 1;
      c.page_size = n % 2 ? 16 : 0;
      c.num_splits = n % 3 == 2 ? 1 : 7;
      c.with_lse = n % 5 != 4;
      c.kv_capacity_pad = 40;
      rel_run_case(env, &c);
    }
}

static void misaligned_bases_work_or_unsupported(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_dtype dtypes[3] = {F32, F16, BF16};
  for (int di = 0; di < 3; di++) {
    const int32_t aligned_shift = (int32_t)(16 / fd_dtype_size(dtypes[di])); /* 16 bytes: CUDA runs it */
    const int32_t shifts[3] = {1, 3, aligned_shift};
    for (int si = 0; si < 3; si++) {
      if (rel_quick() && si != di) continue;
      fd_case c = rel_case(env);
      c.dtype = dtypes[di];
      c.misalign = shifts[si];
      c.layout = si == 1 ? FD_LAYOUT_NONCONTIG : FD_LAYOUT_CONTIG;
      c.head_dim = 64;
      c.num_heads_q = 4;
      c.num_heads_kv = 2;
      c.batch = 2;
      c.kv_len[0] = 130, c.kv_len[1] = 5;
      c.q_len = 2;
      c.page_size = si == 2 ? 16 : 0;
      c.num_splits = si == 0 ? 1 : 3;
      c.with_lse = 1;
      rel_run_case(env, &c); /* CUDA with a non-16-byte shift: unsupported, nothing written */
    }
  }
}

/* One pointer or one stride at a time off 16-byte alignment. */
typedef enum which {
  W_NONE,
  W_Q,
  W_K,
  W_V,
  W_OUT,
  W_LSE,
  W_WORKSPACE,
  W_Q_STRIDE,
  W_K_STRIDE,
  W_V_STRIDE,
  W_OUT_STRIDE,
  W_COUNT
} which;
static const char *which_name[W_COUNT] = {"aligned",   "q",        "k_cache",  "v_cache",  "out",       "lse",
                                          "workspace", "q stride", "k stride", "v stride", "out stride"};

/* dst (strides s, elements) <- dense src [n0][n1][n2][D] */
static void relayout(fd_dtype dt, void *dst, const int64_t s[3], const void *src, int64_t n0, int64_t n1,
                     int64_t n2, int64_t D) {
  const size_t es = fd_dtype_size(dt);
  for (int64_t a = 0; a < n0; a++)
    for (int64_t b = 0; b < n1; b++)
      for (int64_t c = 0; c < n2; c++)
        memcpy((char *)dst + (a * s[0] + b * s[1] + c * s[2]) * es,
               (const char *)src + (((a * n1 + b) * n2 + c) * D) * es, (size_t)D * es);
}

static void each_pointer_misaligned_alone(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  const fd_dtype dtypes[2] = {BF16, F32};
  for (int di = 0; di < (rel_quick() ? 1 : 2); di++) {
    const fd_dtype dt = dtypes[di];
    const size_t es = fd_dtype_size(dt);
    enum { B = 2, T = 2, HQ = 4, HKV = 2, D = 64, CAP = 200 };
    fd_case c = rel_case(env);
    c.backend = FD_BACKEND_CPU; /* only the host tensors are used */
    c.dtype = dt, c.head_dim = D, c.num_heads_q = HQ, c.num_heads_kv = HKV, c.batch = B, c.q_len = T;
    c.kv_len[0] = CAP, c.kv_len[1] = 77;
    fd_case_data *d = rel_data(env, &c);
    const fd_tensors host = fd_case_data_host_tensors(d);
    const int32_t kv_len[B] = {CAP, 77};
    /* dense copies of the inputs */
    const size_t q_elems = (size_t)B * T * HQ * D, kv_elems = (size_t)B * CAP * HKV * D;
    unsigned char *q = malloc(q_elems * es), *k = malloc(kv_elems * es), *v = malloc(kv_elems * es);
    assert_true(q && k && v);
    memcpy(q, host.q, q_elems * es); /* CONTIG: the host tensors are dense */
    memcpy(k, host.k_cache, kv_elems * es);
    memcpy(v, host.v_cache, kv_elems * es);
    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = be, p.dtype = dt, p.batch = B, p.q_len = T, p.num_heads_q = HQ, p.num_heads_kv = HKV;
    p.head_dim = D, p.kv_capacity = CAP, p.num_splits = 3;
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    assert_true(plan.workspace_size > 0);

    unsigned char *ref_out = malloc(q_elems * es), *got = malloc(q_elems * es);
    float ref_lse[B * HQ * T], got_lse[B * HQ * T];
    assert_true(ref_out && got);
    for (int w = W_NONE; w < W_COUNT; w++) {
      /* element shift (one element: 2 or 4 bytes) of the misaligned pointer */
      const int64_t shift = 1;
      const int64_t qs3[3] = {T * HQ * D, HQ * D, D}, kvs3[3] = {CAP * HKV * D, HKV * D, D};
      int64_t q3[3], k3[3], v3[3], o3[3];
      memcpy(q3, qs3, sizeof q3), memcpy(o3, qs3, sizeof o3), memcpy(k3, kvs3, sizeof k3),
          memcpy(v3, kvs3, sizeof v3);
      /* a stride one element longer (per head): not a multiple of 16 bytes */
      if (w == W_Q_STRIDE) q3[2] = D + 1, q3[1] = HQ * (D + 1), q3[0] = T * HQ * (D + 1);
      if (w == W_K_STRIDE) k3[2] = D + 1, k3[1] = HKV * (D + 1), k3[0] = CAP * HKV * (D + 1);
      if (w == W_V_STRIDE) v3[2] = D + 1, v3[1] = HKV * (D + 1), v3[0] = CAP * HKV * (D + 1);
      if (w == W_OUT_STRIDE) o3[2] = D + 1, o3[1] = HQ * (D + 1), o3[0] = T * HQ * (D + 1);
      const size_t qb = (size_t)(B * q3[0]) * es + 64, kb = (size_t)(B * k3[0]) * es + 64,
                   vb = (size_t)(B * v3[0]) * es + 64;
      const size_t ob = (size_t)(B * o3[0]) * es + 64, lb = sizeof ref_lse + 64,
                   wb = plan.workspace_size + 64;
      const size_t q_off = w == W_Q ? shift * es : 0, k_off = w == W_K ? shift * es : 0,
                   v_off = w == W_V ? shift * es : 0;
      const size_t o_off = w == W_OUT ? shift * es : 0, l_off = w == W_LSE ? 4 : 0,
                   w_off = w == W_WORKSPACE ? 4 : 0;
      unsigned char *hq = calloc(1, qb), *hk = calloc(1, kb), *hv = calloc(1, vb), *ho = malloc(ob);
      assert_true(hq && hk && hv && ho);
      relayout(dt, hq + q_off, q3, q, B, T, HQ, D);
      relayout(dt, hk + k_off, k3, k, B, CAP, HKV, D);
      relayout(dt, hv + v_off, v3, v, B, CAP, HKV, D);
      unsigned char *dq = rel_alloc(be, qb), *dk = rel_alloc(be, kb), *dv = rel_alloc(be, vb),
                    *dout = rel_alloc(be, ob);
      unsigned char *dl = rel_alloc(be, lb), *dw = rel_alloc(be, wb);
      int32_t *dkv = rel_alloc(be, sizeof kv_len);
      rel_put(be, dq, hq, qb);
      rel_put(be, dk, hk, kb);
      rel_put(be, dv, hv, vb);
      rel_put(be, dkv, kv_len, sizeof kv_len);
      rel_fill(be, dout, 0xff, ob);
      rel_fill(be, dl, 0xff, lb);
      rel_fill(be, dw, 0xff, wb);
      fd_tensors t;
      memset(&t, 0, sizeof t);
      t.q = dq + q_off, t.k_cache = dk + k_off, t.v_cache = dv + v_off, t.kv_len = dkv;
      t.out = dout + o_off, t.lse = (float *)(dl + l_off);
      memcpy(t.q_strides, q3, sizeof q3), memcpy(t.k_strides, k3, sizeof k3),
          memcpy(t.v_strides, v3, sizeof v3);
      memcpy(t.out_strides, o3, sizeof o3);
      memset(&err, 0, sizeof err);
      const fd_status st = fd_run(&plan, &t, dw + w_off, plan.workspace_size, NULL, &err);
      rel_sync(be);
      rel_get(be, ho, dout, ob);
      unsigned char hl[sizeof ref_lse + 64];
      rel_get(be, hl, dl, lb);
      const int cuda_rejects = be == FD_BACKEND_CUDA && w != W_NONE && w != W_LSE;
      char what[96];
      snprintf(what, sizeof what, "%s %s misaligned", dt == BF16 ? "bf16" : "f32", which_name[w]);
      if (cuda_rejects) {
        if (st != FD_STATUS_UNSUPPORTED)
          fail_msg("%s: fd_run returned %s (%s), want FD_STATUS_UNSUPPORTED", what, fd_status_name(st),
                   err.message);
        if (!err.message[0]) fail_msg("%s: no message", what);
        for (size_t i = 0; i < ob; i++)
          if (ho[i] != 0xff) fail_msg("%s: a rejected run wrote out (byte %zu)", what, i);
        for (size_t i = 0; i < lb; i++)
          if (hl[i] != 0xff) fail_msg("%s: a rejected run wrote lse (byte %zu)", what, i);
      } else {
        if (st != FD_STATUS_OK) fail_msg("%s: fd_run returned %s: %s", what, fd_status_name(st), err.message);
        /* out: every element written, nothing else (padding and the bytes around) */
        unsigned char *mark = calloc(1, ob);
        assert_non_null(mark);
        for (int b = 0; b < B; b++)
          for (int tt = 0; tt < T; tt++)
            for (int h = 0; h < HQ; h++) {
              const size_t at = o_off + (size_t)(b * o3[0] + tt * o3[1] + h * o3[2]) * es;
              memset(mark + at, 1, (size_t)D * es);
              memcpy(got + (((size_t)b * T + tt) * HQ + h) * D * es, ho + at, (size_t)D * es);
            }
        for (size_t i = 0; i < ob; i++)
          if (!mark[i] && ho[i] != 0xff)
            fail_msg("%s: byte %zu of the out buffer written outside out", what, i);
        free(mark);
        for (size_t i = 0; i < lb; i++)
          if ((i < l_off || i >= l_off + sizeof got_lse) && hl[i] != 0xff)
            fail_msg("%s: lse buffer byte %zu written", what, i);
        memcpy(got_lse, hl + l_off, sizeof got_lse);
        if (w == W_NONE) {
          memcpy(ref_out, got, q_elems * es);
          memcpy(ref_lse, got_lse, sizeof ref_lse);
          double *ref, *rl;
          fd_tensors ht = host;
          ht.kv_len = kv_len;
          rel_oracle(&p, &ht, &ref, &rl);
          if (rel_check_dense(&p, kv_len, got, got_lse, ref, rl, 2.0, 0.0, 0.0, what))
            fail_msg("%s: wrong result", what);
          free(ref);
          free(rl);
        } else {
          rel_assert_same(ref_out, got, q_elems * es, what);
          rel_assert_same(ref_lse, got_lse, sizeof ref_lse, what);
        }
      }
      rel_free(be, dq), rel_free(be, dk), rel_free(be, dv), rel_free(be, dout), rel_free(be, dl),
          rel_free(be, dw);
      rel_free(be, dkv);
      free(hq), free(hk), free(hv), free(ho);
    }
    free(ref_out), free(got), free(q), free(k), free(v);
    fd_case_data_free(d);
  }
}

/* ---- 64-bit offsets --------------------------------------------------------------------- */

/* A huge zero-cost reservation: CPU mmap(MAP_NORESERVE) (untouched pages cost
 * nothing), CUDA cudaMalloc. */
static void *huge_alloc(fd_backend be, size_t bytes) {
  if (be == FD_BACKEND_CUDA) return rel_alloc(be, bytes);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail_msg("mmap of %zu bytes (MAP_NORESERVE) failed", bytes);
  return p;
}

static void huge_free(fd_backend be, void *p, size_t bytes) {
  if (be == FD_BACKEND_CUDA)
    rel_free(be, p);
  else
    munmap(p, bytes);
}

static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return ((double)(next_u64(s) >> 11) + 0.5) * 0x1.0p-53 * 2.0 - 1.0; }

/* Runs plan on t, returns out (dense, dtype) and lse in host buffers. */
static void run_dense_out(const fd_plan *plan, const fd_tensors *t, void *out, float *lse, const char *what) {
  fd_error err;
  if (rel_run_private(plan, t, 0xff, NULL, out, lse, &err) != FD_STATUS_OK)
    fail_msg("%s: fd_run: %s", what, err.message);
}

/* Paged: page ids spread over [0, num_pages) with num_pages > 2^21: page id
 * * page stride (2048 elements) passes 2^31 and 2^32 elements; the pool is
 * 8 GiB (bf16) / 16 GiB (f32, CPU only). FD_TEST_QUICK: 2^16 pages (256 MiB),
 * the same code paths without the 64-bit offsets. */
static void page_offsets_past_2_32_elements(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  /* FD_TEST_QUICK (compute-sanitizer runs): a 256 MiB pool instead */
  const int quick = rel_quick();
  const fd_dtype dtypes[2] = {BF16, F32};
  const int ndt = be == FD_BACKEND_CUDA ? 1 : 2;
  enum { B = 3, HQ = 8, HKV = 2, D = 64, P = 16, MAXP = 64 };
  const int32_t kv_len[B] = {300, 1000, 17};
  for (int di = 0; di < ndt; di++) {
    const fd_dtype dt = dtypes[di];
    const size_t es = fd_dtype_size(dt), page_elems = (size_t)P * HKV * D;
    const int32_t num_pages = (quick ? (1 << 16) : (1 << 21)) + 1024;
    const size_t pool_bytes = (size_t)num_pages * page_elems * es;
    uint64_t rng = env->seed ^ 0x6464ull ^ (uint64_t)di;
    /* block tables: compact ids 0.. for the reference layout; for the huge
     * one, used page u goes to region u % 4 (128 ids each): the top of the
     * pool, past 2^31 elements, across 2^32 elements (quick: low), the bottom */
    const int32_t region[4] = {num_pages - 128, quick ? (1 << 15) : (1 << 20) + 512, quick ? 5000 : (1 << 21) - 64, 0};
    int32_t bt_small[B * MAXP], bt_huge[B * MAXP];
    int32_t used = 0, max_id = 0;
    for (int b = 0; b < B; b++)
      for (int i = 0; i < MAXP; i++) {
        const int live = i < (kv_len[b] + P - 1) / P;
        bt_small[b * MAXP + i] = live ? used : 0;
        bt_huge[b * MAXP + i] = live ? region[used % 4] + used : 0;
        if (live && bt_huge[b * MAXP + i] > max_id) max_id = bt_huge[b * MAXP + i];
        if (live) used++;
      }
    assert_true(used < 128);
    unsigned char *small = malloc((size_t)used * page_elems * es * 2), *q = malloc((size_t)B * HQ * D * es);
    assert_true(small && q);
    unsigned char *small_k = small, *small_v = small + (size_t)used * page_elems * es;
    for (size_t i = 0; i < (size_t)used * page_elems; i++) {
      rel_store(dt, small_k, (int64_t)i, next_unit(&rng) * 2.0);
      rel_store(dt, small_v, (int64_t)i, next_unit(&rng));
    }
    for (size_t i = 0; i < (size_t)B * HQ * D; i++) rel_store(dt, q, (int64_t)i, next_unit(&rng) * 2.0);
    /* the huge pools: copy every used page to its huge id */
    unsigned char *hk = huge_alloc(be, pool_bytes), *hv = huge_alloc(be, pool_bytes);
    for (int b = 0; b < B; b++)
      for (int i = 0; i < (kv_len[b] + P - 1) / P; i++) {
        const size_t from = (size_t)bt_small[b * MAXP + i] * page_elems * es,
                     to = (size_t)bt_huge[b * MAXP + i] * page_elems * es;
        rel_put(be, hk + to, small_k + from, page_elems * es);
        rel_put(be, hv + to, small_v + from, page_elems * es);
      }
    void *dsk = rel_alloc(be, (size_t)used * page_elems * es),
         *dsv = rel_alloc(be, (size_t)used * page_elems * es);
    void *dq = rel_alloc(be, (size_t)B * HQ * D * es);
    int32_t *dbs = rel_alloc(be, sizeof bt_small), *dbh = rel_alloc(be, sizeof bt_huge),
            *dkv = rel_alloc(be, sizeof kv_len);
    rel_put(be, dsk, small_k, (size_t)used * page_elems * es);
    rel_put(be, dsv, small_v, (size_t)used * page_elems * es);
    rel_put(be, dq, q, (size_t)B * HQ * D * es);
    rel_put(be, dbs, bt_small, sizeof bt_small);
    rel_put(be, dbh, bt_huge, sizeof bt_huge);
    rel_put(be, dkv, kv_len, sizeof kv_len);

    fd_problem p;
    memset(&p, 0, sizeof p);
    p.backend = be, p.dtype = dt, p.batch = B, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = D;
    p.page_size = P, p.max_pages_per_seq = MAXP;
    fd_tensors ts;
    memset(&ts, 0, sizeof ts);
    ts.q = dq, ts.k_cache = dsk, ts.v_cache = dsv, ts.kv_len = dkv, ts.block_table = dbs;
    fd_tensors th = ts;
    th.k_cache = hk, th.v_cache = hv, th.block_table = dbh;
    fd_tensors host = ts; /* explicit strides for the oracle */
    const int64_t q3[3] = {HQ * D, HQ * D, D}, k3[3] = {(int64_t)page_elems, HKV * D, D};
    memcpy(host.q_strides, q3, sizeof q3), memcpy(host.k_strides, k3, sizeof k3),
        memcpy(host.v_strides, k3, sizeof k3);
    host.block_table_stride = MAXP;
    host.q = q, host.k_cache = small_k, host.v_cache = small_v, host.kv_len = kv_len,
    host.block_table = bt_small;
    double *ref, *ref_lse;
    rel_oracle(&p, &host, &ref, &ref_lse);
    const size_t out_bytes = (size_t)B * HQ * D * es;
    unsigned char *o_small = malloc(out_bytes), *o_huge = malloc(out_bytes);
    float l_small[B * HQ], l_huge[B * HQ];
    assert_true(o_small && o_huge);
    const int32_t splits[3] = {1, 7, 0};
    for (int si = rel_quick() ? 1 : 0; si < (rel_quick() ? 2 : 3); si++) {
      p.num_splits = splits[si];
      fd_plan plan_small, plan_huge;
      fd_error err;
      p.num_pages = used;
      if (fd_plan_init(&plan_small, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
      p.num_pages = num_pages;
      if (fd_plan_init(&plan_huge, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
      char what[128];
      snprintf(what, sizeof what, "%s page ids up to %d (%d splits)", dt == BF16 ? "bf16" : "f32", max_id,
               plan_huge.num_splits);
      run_dense_out(&plan_small, &ts, o_small, l_small, what);
      run_dense_out(&plan_huge, &th, o_huge, l_huge, what);
      if (rel_check_dense(&p, kv_len, o_huge, l_huge, ref, ref_lse, 2.0, 0.0, 0.0, what))
        fail_msg("%s: wrong result", what);
      rel_assert_same(o_small, o_huge, out_bytes, what);
      rel_assert_same(l_small, l_huge, sizeof l_small, what);
    }
    printf("  %s: pool of %d pages, %.1f GiB, ids up to %d (element offset %.3g)\n",
           dt == BF16 ? "bf16" : "f32", num_pages, (double)pool_bytes / 1073741824.0, max_id,
           (double)max_id * (double)page_elems);
    free(ref), free(ref_lse), free(o_small), free(o_huge), free(small), free(q);
    huge_free(be, hk, pool_bytes);
    huge_free(be, hv, pool_bytes);
    rel_free(be, dsk), rel_free(be, dsv), rel_free(be, dq), rel_free(be, dbs), rel_free(be, dbh),
        rel_free(be, dkv);
  }
}

/* Paged, CUDA: block_table ids outside [0, num_pages) are skipped (the
 * header's contract: no memory read, the keys left out of the softmax). The
 * oracle runs on the same keys without the bad pages: q_len 1 (every row sees
 * every key), so leaving a page out equals dropping its column from the block
 * table and its keys from kv_len. Bad ids -1, num_pages, INT32_MAX and
 * INT32_MIN; the pool holds 3 pages of NaN past num_pages, so reading the id
 * num_pages (even under a masked score: 0 * NaN) fails the check. Sequence 0
 * has a bad page in its first tile, a run of >= 64 bad keys in the middle
 * (so that a zero-filled but unmasked key would move lse past its tolerance
 * even at page_size 1), one at key 520 (a later tile of split 0, the first of
 * split 1 at 3 splits) and its last page; sequence 1 its first page; sequence
 * 2 all its pages (out 0, lse -inf). Page sizes with one block_table read a
 * thread a tile (16, 64, 8) and one a key (1, 48: below the tensor-core
 * kernels' 4 or 8 keys a thread, or not a power of two); head_dim 64, 128
 * and 256 (32 query heads on one kv head: two 16-row passes); one split, 3
 * and automatic; the 8-warp and (sm_count 1) 4-warp tensor-core kernels and
 * the fp32 kernel; and non-causal calls of 16 rows a query head (64 a kv
 * head: the rows kernel, rows_mma_kernel.cu), where every row sees every key
 * too. CPU: the same call is refused (FD_STATUS_INVALID_ARGUMENT). */
static void bad_page_ids_skipped_or_refused(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  enum { B = 3 };
  const int32_t kv_len[B] = {1500, 777, 100};
  const struct { fd_dtype dt; int d, hq, hkv, ql; } kinds[6] = {
      {BF16, 128, 8, 2, 1}, {F16, 64, 8, 2, 1},   {F32, 128, 8, 2, 1},
      {BF16, 256, 32, 1, 1}, {BF16, 128, 8, 2, 16}, {F16, 64, 8, 2, 16}};
  const int32_t page_sizes[5] = {16, 64, 1, 8, 48};
  const int32_t bad_vals[4] = {-1, 0 /* num_pages */, INT32_MAX, INT32_MIN};
  int runs = 0;
  for (int ki = 0; ki < 6; ki++)
    for (int pi = 0; pi < 5; pi++) {
      const fd_dtype dt = kinds[ki].dt;
      const int D = kinds[ki].d, HQ = kinds[ki].hq, HKV = kinds[ki].hkv, P = page_sizes[pi];
      const int QL = kinds[ki].ql; /* > 1: non-causal */
      /* FD_TEST_QUICK (compute-sanitizer runs, CUDA): page_size 16 and 1
       * (bf16 head_dim 128), 16 (the others) */
      if (rel_quick() && be == FD_BACKEND_CUDA && !(pi == 0 || (pi == 2 && ki == 0))) continue;
      const size_t es = fd_dtype_size(dt), page_elems = (size_t)P * HKV * D;
      const int32_t maxp = (kv_len[0] + P - 1) / P;
      uint64_t rng = env->seed ^ 0xbadbadull ^ (uint64_t)(ki * 8 + pi);
      int32_t *bt = malloc((size_t)B * maxp * sizeof *bt), *bt_ref = malloc((size_t)B * maxp * sizeof *bt);
      int32_t kv_ref[B];
      assert_true(bt && bt_ref);
      int32_t good = 0;
      for (int b = 0; b < B; b++) {
        const int32_t np = (kv_len[b] + P - 1) / P;
        const int32_t mid = np / 2, run = P >= 64 ? 1 : 64 / P; /* the middle run of bad pages */
        int32_t nref = 0;
        kv_ref[b] = 0;
        for (int32_t c = 0; c < maxp; c++) {
          bt[b * maxp + c] = 0;
          bt_ref[b * maxp + c] = 0;
          if (c >= np) continue;
          const int bad = (b == 0 && (c == 1 || (c >= mid && c < mid + run) || c == 520 / P || c == np - 1)) ||
                          (b == 1 && c == 0) || b == 2;
          const int32_t keys = kv_len[b] - c * P < P ? kv_len[b] - c * P : P;
          if (bad) {
            bt[b * maxp + c] = -2; /* set below, once num_pages is known */
          } else {
            bt[b * maxp + c] = good;
            bt_ref[b * maxp + nref++] = good;
            kv_ref[b] += keys;
            good++;
          }
        }
      }
      const int32_t num_pages = good; /* pages good .. good+2 exist and hold NaN */
      int nbad = 0;
      for (int i = 0; i < B * maxp; i++)
        if (bt[i] == -2) {
          const int32_t v = bad_vals[nbad++ % 4];
          bt[i] = v == 0 ? num_pages : v;
        }
      const size_t pool_elems = (size_t)(good + 3) * page_elems;
      unsigned char *k = malloc(pool_elems * es), *v = malloc(pool_elems * es), *q = malloc((size_t)B * QL * HQ * D * es);
      assert_true(k && v && q);
      for (size_t i = 0; i < pool_elems; i++) {
        const int spare = i >= (size_t)good * page_elems;
        rel_store(dt, k, (int64_t)i, spare ? NAN : next_unit(&rng) * 2.0);
        rel_store(dt, v, (int64_t)i, spare ? NAN : next_unit(&rng));
      }
      for (size_t i = 0; i < (size_t)B * QL * HQ * D; i++) rel_store(dt, q, (int64_t)i, next_unit(&rng) * 2.0);

      fd_problem p;
      memset(&p, 0, sizeof p);
      p.backend = be, p.dtype = dt, p.batch = B, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = D;
      p.page_size = P, p.max_pages_per_seq = maxp, p.num_pages = num_pages;
      p.q_len = QL, p.non_causal = QL > 1;
      fd_tensors host;
      memset(&host, 0, sizeof host);
      const int64_t q3[3] = {(int64_t)QL * HQ * D, (int64_t)HQ * D, D}, k3[3] = {(int64_t)page_elems, (int64_t)HKV * D, D};
      memcpy(host.q_strides, q3, sizeof q3), memcpy(host.k_strides, k3, sizeof k3),
          memcpy(host.v_strides, k3, sizeof k3);
      host.block_table_stride = maxp;
      host.q = q, host.k_cache = k, host.v_cache = v, host.kv_len = kv_ref, host.block_table = bt_ref;
      double *ref, *ref_lse;
      rel_oracle(&p, &host, &ref, &ref_lse);

      void *dk = rel_alloc(be, pool_elems * es), *dv = rel_alloc(be, pool_elems * es);
      void *dq = rel_alloc(be, (size_t)B * QL * HQ * D * es);
      int32_t *dbt = rel_alloc(be, (size_t)B * maxp * sizeof *bt), *dkv = rel_alloc(be, sizeof kv_len);
      rel_put(be, dk, k, pool_elems * es);
      rel_put(be, dv, v, pool_elems * es);
      rel_put(be, dq, q, (size_t)B * QL * HQ * D * es);
      rel_put(be, dbt, bt, (size_t)B * maxp * sizeof *bt);
      rel_put(be, dkv, kv_len, sizeof kv_len);
      fd_tensors t;
      memset(&t, 0, sizeof t);
      t.q = dq, t.k_cache = dk, t.v_cache = dv, t.kv_len = dkv, t.block_table = dbt;
      unsigned char *out = malloc((size_t)B * QL * HQ * D * es);
      float *lse = malloc((size_t)B * QL * HQ * sizeof *lse);
      assert_true(out && lse);
      const int32_t splits[3] = {1, 3, 0};
      for (int si = 0; si < 3; si++)
        for (int sm = 0; sm < 2; sm++) {
          if (be != FD_BACKEND_CUDA && (si > 0 || sm > 0)) continue;
          if (be == FD_BACKEND_CUDA && rel_quick() && si != 1) continue;
          p.num_splits = splits[si];
          p.sm_count = sm ? 1 : 0;
          fd_plan plan;
          fd_error err;
          if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
          char what[160];
          snprintf(what, sizeof what, "%s d%d %d/%d heads page_size %d, %d bad pages, %d splits%s%s",
                   dt == F32 ? "f32" : dt == F16 ? "f16" : "bf16", D, HQ, HKV, P, nbad, plan.num_splits,
                   sm ? ", sm_count 1" : "", QL > 1 ? ", non-causal q_len 16" : "");
          const fd_status st = rel_run_private(&plan, &t, 0xff, NULL, out, lse, &err);
          if (be != FD_BACKEND_CUDA) {
            if (st != FD_STATUS_INVALID_ARGUMENT || !strstr(err.message, "block_table"))
              fail_msg("%s: CPU gave %s (%s), not a block_table refusal", what, fd_status_name(st), err.message);
            continue;
          }
          if (st != FD_STATUS_OK) fail_msg("%s: fd_run: %s", what, err.message);
          if (rel_check_dense(&p, kv_ref, out, lse, ref, ref_lse, 2.0, 0.0, 0.0, what))
            fail_msg("%s: wrong result", what);
          runs++;
        }
      free(out), free(lse), free(ref), free(ref_lse), free(k), free(v), free(q), free(bt), free(bt_ref);
      rel_free(be, dk), rel_free(be, dv), rel_free(be, dq), rel_free(be, dbt), rel_free(be, dkv);
    }
  if (be == FD_BACKEND_CUDA) printf("  %d runs with bad page ids matched the oracle without those pages\n", runs);
}

/* Dense: batch stride 2^30 elements for k and v (CPU: q, out and lse too),
 * batch 5 on the CPU (offsets past 2^32 elements), 3 on CUDA (past 2^31,
 * 12 GiB of device memory). FD_TEST_QUICK: batch stride 2^24. */
static void batch_stride_past_2_32_elements(void **state) {
  const rel_env *env = REL_ENV(state);
  const fd_backend be = env->backend;
  const int cpu = be != FD_BACKEND_CUDA;
  enum { T = 2, HQ = 4, HKV = 2, D = 64, CAP = 700 };
  const int32_t B = cpu ? 5 : 3;
  /* FD_TEST_QUICK (compute-sanitizer runs): batch stride 2^24, not 2^30 */
  const int64_t big = (int64_t)1 << (rel_quick() ? 24 : 30);
  const fd_dtype dt = BF16;
  const size_t es = fd_dtype_size(dt);
  const int32_t kv_all[5] = {700, 1, 333, 0, 650};
  int32_t kv_len[5];
  memcpy(kv_len, kv_all, sizeof kv_len);
  uint64_t rng = env->seed ^ 0x3030ull;
  const size_t q_elems = (size_t)B * T * HQ * D, kv_elems = (size_t)B * CAP * HKV * D;
  unsigned char *q = malloc(q_elems * es), *k = malloc(kv_elems * es), *v = malloc(kv_elems * es);
  assert_true(q && k && v);
  for (size_t i = 0; i < kv_elems; i++)
    rel_store(dt, k, (int64_t)i, next_unit(&rng) * 2.0), rel_store(dt, v, (int64_t)i, next_unit(&rng));
  for (size_t i = 0; i < q_elems; i++) rel_store(dt, q, (int64_t)i, next_unit(&rng) * 2.0);
  /* compact copies on the backend */
  void *dq = rel_alloc(be, q_elems * es), *dk = rel_alloc(be, kv_elems * es),
       *dv = rel_alloc(be, kv_elems * es);
  int32_t *dkv = rel_alloc(be, (size_t)B * sizeof(int32_t));
  rel_put(be, dq, q, q_elems * es);
  rel_put(be, dk, k, kv_elems * es);
  rel_put(be, dv, v, kv_elems * es);
  rel_put(be, dkv, kv_len, (size_t)B * sizeof(int32_t));
  /* huge copies: sequence b at element offset b * 2^30 */
  const size_t kv_huge = (size_t)B * (size_t)big * es, q_huge = cpu ? kv_huge : 0,
               lse_huge = cpu ? (size_t)B * (size_t)big * sizeof(float) : 0;
  unsigned char *hk = huge_alloc(be, kv_huge), *hv = huge_alloc(be, kv_huge);
  unsigned char *hq = cpu ? huge_alloc(be, q_huge) : NULL, *ho = cpu ? huge_alloc(be, q_huge) : NULL;
  float *hl = cpu ? huge_alloc(be, lse_huge) : NULL;
  const size_t seq_kv = (size_t)CAP * HKV * D * es, seq_q = (size_t)T * HQ * D * es;
  for (int32_t b = 0; b < B; b++) {
    rel_put(be, hk + (size_t)b * big * es, k + b * seq_kv, seq_kv);
    rel_put(be, hv + (size_t)b * big * es, v + b * seq_kv, seq_kv);
    if (cpu) memcpy(hq + (size_t)b * big * es, q + b * seq_q, seq_q);
  }
  fd_problem p;
  memset(&p, 0, sizeof p);
  p.backend = be, p.dtype = dt, p.batch = B, p.q_len = T, p.num_heads_q = HQ, p.num_heads_kv = HKV,
  p.head_dim = D;
  p.kv_capacity = CAP;
  fd_tensors ts;
  memset(&ts, 0, sizeof ts);
  ts.q = dq, ts.k_cache = dk, ts.v_cache = dv, ts.kv_len = dkv;
  fd_tensors host = ts;
  const int64_t q3[3] = {T * HQ * D, HQ * D, D}, k3[3] = {(int64_t)CAP * HKV * D, HKV * D, D};
  memcpy(host.q_strides, q3, sizeof q3), memcpy(host.k_strides, k3, sizeof k3),
      memcpy(host.v_strides, k3, sizeof k3);
  host.q = q, host.k_cache = k, host.v_cache = v, host.kv_len = kv_len;
  double *ref, *ref_lse;
  rel_oracle(&p, &host, &ref, &ref_lse);
  unsigned char *o_small = malloc(q_elems * es), *o_huge = malloc(q_elems * es);
  float *l_small = malloc((size_t)B * HQ * T * sizeof(float)),
        *l_huge = malloc((size_t)B * HQ * T * sizeof(float));
  assert_true(o_small && o_huge && l_small && l_huge);
  const int32_t splits[2] = {1, 7};
  for (int si = rel_quick() ? 1 : 0; si < 2; si++) {
    p.num_splits = splits[si];
    fd_plan plan;
    fd_error err;
    if (fd_plan_init(&plan, &p, &err) != FD_STATUS_OK) fail_msg("plan: %s", err.message);
    char what[96];
    snprintf(what, sizeof what, "batch stride 2^30, batch %d, %d splits", B, plan.num_splits);
    run_dense_out(&plan, &ts, o_small, l_small, what);
    fd_tensors th = ts;
    th.k_cache = hk, th.v_cache = hv;
    th.k_strides[0] = big, th.k_strides[1] = HKV * D, th.k_strides[2] = D;
    memcpy(th.v_strides, th.k_strides, sizeof th.v_strides);
    if (cpu) {
      /* q, out and lse with batch stride 2^30 as well, written in place */
      th.q = hq;
      th.q_strides[0] = big, th.q_strides[1] = HQ * D, th.q_strides[2] = D;
      th.out = ho;
      memcpy(th.out_strides, th.q_strides, sizeof th.out_strides);
      th.lse = hl;
      th.lse_strides[0] = big, th.lse_strides[1] = T, th.lse_strides[2] = 1;
      void *ws = plan.workspace_size ? malloc(plan.workspace_size) : NULL;
      if (fd_run(&plan, &th, ws, plan.workspace_size, NULL, &err) != FD_STATUS_OK)
        fail_msg("%s: %s", what, err.message);
      free(ws);
      for (int32_t b = 0; b < B; b++) {
        memcpy(o_huge + b * seq_q, ho + (size_t)b * big * es, seq_q);
        memcpy(l_huge + (size_t)b * HQ * T, hl + (size_t)b * big, (size_t)HQ * T * sizeof(float));
      }
    } else {
      run_dense_out(&plan, &th, o_huge, l_huge, what);
    }
    if (rel_check_dense(&p, kv_len, o_huge, l_huge, ref, ref_lse, 2.0, 0.0, 0.0, what))
      fail_msg("%s: wrong result", what);
    rel_assert_same(o_small, o_huge, q_elems * es, what);
    rel_assert_same(l_small, l_huge, (size_t)B * HQ * T * sizeof(float), what);
  }
  printf("  batch stride 2^%d: batch %d, largest element offset %.3g (%s)\n", rel_quick() ? 24 : 30, B,
         (double)(B - 1) * (double)big + CAP * HKV * D, cpu ? "q, k, v, out, lse" : "k, v");
  huge_free(be, hk, kv_huge);
  huge_free(be, hv, kv_huge);
  if (cpu) huge_free(be, hq, q_huge), huge_free(be, ho, q_huge), huge_free(be, hl, lse_huge);
  rel_free(be, dq), rel_free(be, dk), rel_free(be, dv), rel_free(be, dkv);
  free(q), free(k), free(v), free(o_small), free(o_huge), free(l_small), free(l_huge), free(ref),
      free(ref_lse);
}

rel_group rel_group_layout(fd_backend backend) {
  (void)backend;
  static const struct CMUnitTest tests[] = {
      {"strided_out_lse_layouts", strided_out_lse_layouts, NULL, NULL, NULL},
      {"misaligned_bases_work_or_unsupported", misaligned_bases_work_or_unsupported, NULL, NULL, NULL},
      {"each_pointer_misaligned_alone", each_pointer_misaligned_alone, NULL, NULL, NULL},
      {"page_offsets_past_2_32_elements", page_offsets_past_2_32_elements, NULL, NULL, NULL},
      {"batch_stride_past_2_32_elements", batch_stride_past_2_32_elements, NULL, NULL, NULL},
      {"bad_page_ids_skipped_or_refused", bad_page_ids_skipped_or_refused, NULL, NULL, NULL},
  };
  rel_group g = {"layout", tests, sizeof tests / sizeof *tests};
  return g;
}
