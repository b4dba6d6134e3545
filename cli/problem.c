/*
 * problem.c — the flags of `bench` and `check`, and the random inputs they
 * run on (see problem.h).
 */
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "dtype.h"
#include "gpu.h"
#include "problem.h"

static void print_usage(const char *command) {
  printf(
      "usage: flashdecode %s [options]\n"
      "\n"
      "%s"
      "\n"
      "problem:\n"
      "  --batch N            sequences (default 1)\n"
      "  --num-heads-q N      query heads (default 32)\n"
      "  --num-heads-kv N     key/value heads, divides --num-heads-q (default 8; 1 with --rope-dim)\n"
      "  --head-dim N         1..256 (CUDA: 64, 80, 96, 128, 256) (default 128); with --rope-dim\n"
      "                       the latent width, up to 512 (CUDA: 512 or 448)\n"
      "  --kv-len N[,N...]    keys per sequence; a list is repeated over the batch (default 4096)\n"
      "  --q-len N            query rows per sequence, 1..16, 1..128 with --non-causal (default 1)\n"
      "  --dtype T            f32, f16 or bf16 (default bf16)\n"
      "  --kv-dtype T         e4m3 or e5m2: an fp8 K/V cache (with --dtype f16 or bf16);\n"
      "                       same (default) = --dtype\n"
      "  --kv-scale S         fp8 scales: none, tensor (default), head or token\n"
      "  --rope-dim N         multi-head latent attention (MLA, DeepSeek-V3): N rope columns (64)\n"
      "                       beside the --head-dim latent (512); one kv head whose key is\n"
      "                       [latent | rope] and whose value is the latent; q as q_nope + q_pe\n"
      "                       (0 = standard attention, the default)\n"
      "  --rope-dtype T       MLA: the rope cache's type: same (default: --kv-dtype's) or the\n"
      "                       --dtype (e.g. --kv-dtype e4m3 --rope-dtype bf16: a 16-bit rope part\n"
      "                       beside an fp8 latent, FlashMLA's layout); fp8 scales: k_scale only\n"
      "  --softmax-scale X    the scores' scale (default 1/sqrt(head_dim); with --rope-dim\n"
      "                       1/sqrt(192), DeepSeek-V3's: the head dim before absorption)\n"
      "  --page-size N        0 = contiguous cache (default), 1..256 = paged cache\n"
      "  --num-splits N       0 = automatic (default), 1 = no split, N = N splits\n"
      "  --backend B          cpu, cuda or auto (default auto: cuda when a GPU is present)\n"
      "  --threads N          CPU worker threads (default all cores)\n"
      "  --no-pdl             CUDA: the first kernel launched plainly (no PDL)\n"
      "  --seed N             random inputs' seed (default 1234)\n"
      "%s"
      "\n"
      "attention variants (default: none):\n"
      "  --window-left N      sliding window: the row at position p sees keys p-N..p; -1 = none\n"
      "                       (a model's sliding_window of W keys is N = W - 1)\n"
      "  --logits-soft-cap X  soft-cap: scores become X * tanh(score / X); 0 = off\n"
      "  --sinks [VALUE]      attention sinks (one extra logit per query head, no value): VALUE\n"
      "                       for every head, or, without VALUE, drawn per head uniform in\n"
      "                       [0, 1.5 ln(1 + longest kv_len)) (from no weight to most of a row)\n"
      "  --non-causal         every query row sees all kv_len keys (the shared prefix of\n"
      "                       cascade decoding); --q-len up to 128; not with --window-left\n"
      "  --tree N             speculative decoding: a random EAGLE-shaped tree of N draft tokens\n"
      "                       (1..64; q_len = N) verified with a tree mask: each row sees the\n"
      "                       prefix and its ancestors; CPU and reference backends only\n"
      "\n"
      "  -h, --help           this text\n",
      command,
      strcmp(command, "bench") == 0
          ? "Times one decode-attention call on random inputs and prints one line:\n"
            "us (median microseconds per call; CUDA: CUDA-graph replay timed with events,\n"
            "rotating over enough buffer sets to exceed twice the L2, at least 2 x 60 MiB;\n"
            "us_eager: the same with plain launches),\n"
            "gbps (K/V bytes read / time, bytes = 2 * sum keys * num_heads_kv * head_dim *\n"
            "sizeof(dtype), keys = kv_len, with --window-left the keys some row sees:\n"
            "min(kv_len, window_left + q_len); MLA: the cache once, sum kv_len * (head_dim *\n"
            "sizeof(kv dtype) + rope_dim * sizeof(rope dtype))), num_splits (the split count used), us_split1 (the same with\n"
            "--num-splits 1: us itself when num_splits is 1) and, when num_splits > 1,\n"
            "speedup = us_split1 / us. CUDA adds sets (buffer sets\n"
            "rotated). CPU adds threads (worker threads), sets (input sets rotated, together\n"
            "over 4 x the last-level cache, so K/V come from memory), read_gbps (this\n"
            "machine's read bandwidth, measured in the same run by a multithreaded read\n"
            "loop), read_streams (the streams per thread of its best measurement),\n"
            "pct_read = 100 * gbps / read_gbps, and iters.\n"
          : "Runs the backend on random inputs (outputs poisoned with NaN first) and the\n"
            "float64 reference, and prints one line:\n"
            "max_abs  = max |out - ref|\n"
            "max_err  = max |out - ref| / (1 + |ref|)   (per element, absolute-relative)\n"
            "rel_l2   = ||out - ref||_2 / ||ref||_2\n"
            "lse_err  = max |lse - ref| / (1 + |ref|)   (rows that see no key: lse must be -inf,\n"
            "                                            and out 0; with --sinks lse = the sink)\n"
            "PASS when max_err and lse_err are <= the dtype's tolerance (f32 1e-5, f16 2e-3,\n"
            "bf16 1.6e-2) and nothing is NaN. Exit code 0 on PASS, 1 on FAIL.\n",
      strcmp(command, "bench") == 0
          ? "  --iters N            timed iterations (default CPU 20, CUDA 100)\n"
          : "");
}

enum {
  OPT_BATCH = 256,
  OPT_HEADS_Q,
  OPT_HEADS_KV,
  OPT_HEAD_DIM,
  OPT_KV_LEN,
  OPT_Q_LEN,
  OPT_DTYPE,
  OPT_PAGE_SIZE,
  OPT_SPLITS,
  OPT_BACKEND,
  OPT_THREADS,
  OPT_SEED,
  OPT_ITERS,
  OPT_KV_DTYPE,
  OPT_KV_SCALE,
  OPT_WINDOW_LEFT,
  OPT_SOFT_CAP,
  OPT_SINKS,
  OPT_NON_CAUSAL,
  OPT_TREE,
  OPT_NO_PDL,
  OPT_ROPE_DIM,
  OPT_ROPE_DTYPE,
  OPT_SOFTMAX_SCALE
};

/* --rope-dtype: same (0: the latent's type), a 16-bit or f32 name, or an fp8 name. */
static int parse_rope_dtype(const char *text, fd_dtype *value) {
  static const char *const names[] = {"same", "f32", "f16", "bf16", "e4m3", "e5m2"};
  static const fd_dtype types[] = {(fd_dtype)0, FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16,
                                   FD_DTYPE_E4M3, FD_DTYPE_E5M2};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(text, names[i])) {
      *value = types[i];
      return 0;
    }
  fprintf(stderr, "flashdecode: --rope-dtype: '%s' is not same, f32, f16, bf16, e4m3 or e5m2\n",
          text);
  return -1;
}

/* "--sinks VALUE" as "--sinks=VALUE" (getopt takes an optional argument only in
 * the second form): when the word after --sinks reads as a number, the two are
 * joined. argv is copied into *out (freed by free_joined). */
static int join_optional_values(int argc, char **argv, char ***out, char **joined) {
  char **args = malloc(((size_t)argc + 1) * sizeof *args);
  if (!args) return -1;
  int n = 0;
  *joined = NULL;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--sinks") && i + 1 < argc && !*joined) {
      char *end = NULL;
      (void)strtod(argv[i + 1], &end);
      if (end != argv[i + 1] && *end == '\0') {
        size_t len = strlen("--sinks=") + strlen(argv[i + 1]) + 1;
        *joined = malloc(len);
        if (!*joined) {
          free(args);
          return -1;
        }
        snprintf(*joined, len, "--sinks=%s", argv[i + 1]);
        args[n++] = *joined;
        i++;
        continue;
      }
    }
    args[n++] = argv[i];
  }
  args[n] = NULL;
  *out = args;
  return n;
}

static int parse_flags(problem_args *a, int argc, char **argv);

int problem_parse(problem_args *a, int argc, char **argv) {
  char **args = NULL, *joined = NULL;
  int n = join_optional_values(argc, argv, &args, &joined);
  if (n < 0) {
    fprintf(stderr, "flashdecode %s: out of memory\n", argv[0]);
    return -1;
  }
  int r = parse_flags(a, n, args);
  free(joined);
  free(args);
  return r;
}

static int parse_flags(problem_args *a, int argc, char **argv) {
  memset(a, 0, sizeof *a);
  a->backend = FD_BACKEND_AUTO;
  a->dtype = FD_DTYPE_BF16;
  a->batch = 1;
  a->q_len = 1;
  a->num_heads_q = 32;
  a->num_heads_kv = 8;
  a->head_dim = 128;
  a->seed = 1234;
  a->kv_lens[0] = 4096;
  a->n_kv_lens = 1;
  a->window_left = -1;
  const int is_bench = strcmp(argv[0], "bench") == 0;

  static const struct option options[] = {
      {"batch", required_argument, NULL, OPT_BATCH},
      {"num-heads-q", required_argument, NULL, OPT_HEADS_Q},
      {"num-heads-kv", required_argument, NULL, OPT_HEADS_KV},
      {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
      {"kv-len", required_argument, NULL, OPT_KV_LEN},
      {"q-len", required_argument, NULL, OPT_Q_LEN},
      {"dtype", required_argument, NULL, OPT_DTYPE},
      {"page-size", required_argument, NULL, OPT_PAGE_SIZE},
      {"num-splits", required_argument, NULL, OPT_SPLITS},
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"threads", required_argument, NULL, OPT_THREADS},
      {"seed", required_argument, NULL, OPT_SEED},
      {"iters", required_argument, NULL, OPT_ITERS},
      {"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
      {"kv-scale", required_argument, NULL, OPT_KV_SCALE},
      {"window-left", required_argument, NULL, OPT_WINDOW_LEFT},
      {"logits-soft-cap", required_argument, NULL, OPT_SOFT_CAP},
      {"sinks", optional_argument, NULL, OPT_SINKS},
      {"non-causal", no_argument, NULL, OPT_NON_CAUSAL},
      {"tree", required_argument, NULL, OPT_TREE},
      {"no-pdl", no_argument, NULL, OPT_NO_PDL},
      {"rope-dim", required_argument, NULL, OPT_ROPE_DIM},
      {"rope-dtype", required_argument, NULL, OPT_ROPE_DTYPE},
      {"softmax-scale", required_argument, NULL, OPT_SOFTMAX_SCALE},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int c, bad = 0;
  opterr = 0; /* args_option_error reports, pointing to --help */
  while (!bad && (c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
    switch (c) {
      case OPT_BATCH: bad = args_int("--batch", optarg, 1, 1 << 20, &a->batch); break;
      case OPT_HEADS_Q: bad = args_int("--num-heads-q", optarg, 1, 4096, &a->num_heads_q); break;
      case OPT_HEADS_KV:
        bad = args_int("--num-heads-kv", optarg, 1, 4096, &a->num_heads_kv);
        a->num_heads_kv_set = 1;
        break;
      case OPT_HEAD_DIM: bad = args_int("--head-dim", optarg, 1, 512, &a->head_dim); break;
      case OPT_ROPE_DIM: bad = args_int("--rope-dim", optarg, 0, 512, &a->rope_dim); break;
      case OPT_ROPE_DTYPE: bad = parse_rope_dtype(optarg, &a->rope_dtype); break;
      case OPT_SOFTMAX_SCALE:
        bad = args_float("--softmax-scale", optarg, FLT_MIN, FLT_MAX, &a->softmax_scale);
        break;
      case OPT_KV_LEN:
        bad = args_int_list("--kv-len", optarg, a->kv_lens, PROBLEM_MAX_KV_LENS, &a->n_kv_lens);
        break;
      case OPT_Q_LEN: bad = args_int("--q-len", optarg, 1, FD_MAX_Q_LEN_NON_CAUSAL, &a->q_len); break;
      case OPT_DTYPE: bad = args_dtype("--dtype", optarg, &a->dtype); break;
      case OPT_KV_DTYPE: bad = args_kv_dtype("--kv-dtype", optarg, &a->kv_dtype); break;
      case OPT_KV_SCALE:
        bad = args_kv_scale("--kv-scale", optarg, &a->kv_scale);
        a->kv_scale_set = 1;
        break;
      case OPT_PAGE_SIZE: bad = args_int("--page-size", optarg, 0, 256, &a->page_size); break;
      case OPT_SPLITS: bad = args_int("--num-splits", optarg, 0, FD_MAX_SPLITS, &a->num_splits); break;
      case OPT_BACKEND: bad = args_backend("--backend", optarg, 0, &a->backend); break;
      case OPT_THREADS: bad = args_int("--threads", optarg, 0, FD_MAX_THREADS, &a->num_threads); break;
      case OPT_SEED: bad = args_u64("--seed", optarg, &a->seed); break;
      case OPT_ITERS:
        if (!is_bench) {
          fprintf(stderr, "flashdecode: --iters is an option of bench\n");
          bad = -1;
        } else {
          bad = args_int("--iters", optarg, 1, 1000000, &a->iters);
        }
        break;
      case OPT_WINDOW_LEFT:
        bad = args_int("--window-left", optarg, -1, INT32_MAX, &a->window_left);
        break;
      case OPT_SOFT_CAP:
        bad = args_float("--logits-soft-cap", optarg, 0.0, FLT_MAX, &a->logits_soft_cap);
        break;
      case OPT_SINKS:
        a->sinks = SINKS_RANDOM;
        if (optarg) {
          a->sinks = SINKS_VALUE;
          bad = args_float("--sinks", optarg, -FLT_MAX, FLT_MAX, &a->sinks_value);
        }
        break;
      case OPT_NON_CAUSAL: a->non_causal = 1; break;
      case OPT_TREE: bad = args_int("--tree", optarg, 1, FD_MAX_Q_LEN_TREE, &a->tree); break;
      case OPT_NO_PDL: a->no_pdl = 1; break;
      case 'h': print_usage(argv[0]); return 1;
      default: bad = args_option_error(argv[0], c, argv, optind, optopt, options); break;
    }
  }
  if (bad) return -1;
  if (optind < argc) {
    fprintf(stderr, "flashdecode %s: unexpected argument '%s' (see flashdecode %s --help)\n",
            argv[0], argv[optind], argv[0]);
    return -1;
  }
  const int fp8 = a->kv_dtype == FD_DTYPE_E4M3 || a->kv_dtype == FD_DTYPE_E5M2;
  if (fp8 && !a->kv_scale_set) a->kv_scale = FD_KV_SCALE_TENSOR;
  if (!fp8 && a->kv_scale != FD_KV_SCALE_NONE) {
    fprintf(stderr, "flashdecode: --kv-scale needs --kv-dtype e4m3 or e5m2\n");
    return -1;
  }
  if (a->rope_dim > 0) { /* MLA: one kv head */
    if (a->num_heads_kv_set && a->num_heads_kv != 1) {
      fprintf(stderr,
              "flashdecode: --num-heads-kv %d with --rope-dim %d: MLA has one kv head (the "
              "latent); leave --num-heads-kv out or give 1\n",
              a->num_heads_kv, a->rope_dim);
      return -1;
    }
    a->num_heads_kv = 1;
    if (a->softmax_scale == 0.0f) a->softmax_scale = 0.07216878f; /* 1/sqrt(192) */
  } else {
    if (a->head_dim > 256) {
      fprintf(stderr,
              "flashdecode: --head-dim %d: above 256 only with --rope-dim (the MLA latent "
              "width)\n",
              a->head_dim);
      return -1;
    }
    if (a->rope_dtype != 0) {
      fprintf(stderr, "flashdecode: --rope-dtype needs --rope-dim (MLA)\n");
      return -1;
    }
  }
  if (a->n_kv_lens > a->batch) {
    fprintf(stderr,
            "flashdecode: --kv-len has %d lengths but --batch is %d: give at most --batch lengths "
            "(one per sequence; a shorter list is repeated over the batch)\n",
            a->n_kv_lens, a->batch);
    return -1;
  }
  if (a->num_heads_q % a->num_heads_kv != 0) {
    fprintf(stderr, "flashdecode: --num-heads-q %d is not a multiple of --num-heads-kv %d\n",
            a->num_heads_q, a->num_heads_kv);
    return -1;
  }
  if (a->tree > 0) {
    if (a->q_len != 1 && a->q_len != a->tree) {
      fprintf(stderr, "flashdecode: --q-len %d with --tree %d: the tree's nodes are the query rows "
                      "(leave --q-len out)\n", a->q_len, a->tree);
      return -1;
    }
    if (a->non_causal || a->window_left >= 0) {
      fprintf(stderr, "flashdecode: --tree with --non-causal or --window-left is not supported\n");
      return -1;
    }
    a->q_len = a->tree;
  }
  if (!a->non_causal && a->tree == 0 && a->q_len > FD_MAX_Q_LEN) {
    fprintf(stderr, "flashdecode: --q-len %d: above %d needs --non-causal\n", a->q_len,
            FD_MAX_Q_LEN);
    return -1;
  }
  if (a->non_causal && a->window_left >= 0) {
    fprintf(stderr,
            "flashdecode: --window-left %d with --non-causal: a sliding window needs causal rows\n",
            a->window_left);
    return -1;
  }
  return 0;
}

int problem_resolve_backend(problem_args *a) {
  if (a->backend == FD_BACKEND_AUTO)
    a->backend = fd_backend_available(FD_BACKEND_CUDA) && gpu_available() ? FD_BACKEND_CUDA
                                                                           : FD_BACKEND_CPU;
  if (a->backend == FD_BACKEND_CUDA && !(gpu_available() && fd_backend_available(FD_BACKEND_CUDA))) {
    char text[256];
    gpu_describe(text, sizeof text);
    fprintf(stderr, "flashdecode: --backend cuda: no usable GPU (GPU: %s; CUDA backend %s)\n", text,
            fd_backend_available(FD_BACKEND_CUDA) ? "available" : "unavailable");
    return -1;
  }
  return 0;
}

/* ---- random inputs ---- */

/* splitmix64 (Steele, Lea, Flood): 64 random bits per call. */
static uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* n values uniform in [-sqrt(3), sqrt(3)) (unit variance), in `dtype`; fp8
 * caches hold them divided by their scale (`fp8_scale`: FP8_SCALE, or 1
 * without scales). */
#define FP8_SCALE (1.0f / 64.0f)
static void fill_random(void *dst, size_t n, fd_dtype dtype, float fp8_scale, uint64_t *state) {
  const float scale = 1.7320508f / 8388608.0f; /* sqrt(3) / 2^23 */
  for (size_t i = 0; i < n; i += 2) {
    uint64_t bits = next_u64(state);
    for (size_t j = i; j < i + 2 && j < n; j++, bits >>= 32) {
      float x = (float)((int32_t)(bits & 0xFFFFFFu) - 8388608) * scale;
      switch (dtype) {
        case FD_DTYPE_F32: ((float *)dst)[j] = x; break;
        case FD_DTYPE_F16: ((uint16_t *)dst)[j] = fd_f32_to_f16(x); break;
        case FD_DTYPE_BF16: ((uint16_t *)dst)[j] = fd_f32_to_bf16(x); break;
        case FD_DTYPE_E4M3: ((uint8_t *)dst)[j] = fd_f32_to_e4m3(x / fp8_scale); break;
        case FD_DTYPE_E5M2: ((uint8_t *)dst)[j] = fd_f32_to_e5m2(x / fp8_scale); break;
      }
    }
  }
}

static void *alloc_bytes(size_t bytes) { return malloc(bytes > 0 ? bytes : 1); }

fd_status problem_make(problem *p, const problem_args *a, fd_error *err) {
  memset(p, 0, sizeof *p);
  const size_t elem = fd_dtype_size(a->dtype);
  const fd_dtype kv_dtype = a->kv_dtype != 0 ? a->kv_dtype : a->dtype;
  const size_t kv_elem = fd_dtype_size(kv_dtype);
  const size_t B = (size_t)a->batch, Hq = (size_t)a->num_heads_q, Hkv = (size_t)a->num_heads_kv,
               D = (size_t)a->head_dim, T = (size_t)a->q_len, R = (size_t)a->rope_dim;
  const int mla = a->rope_dim > 0;
  const fd_dtype rope_dtype = a->rope_dtype != 0 ? a->rope_dtype : kv_dtype;
  const size_t rope_elem = fd_dtype_size(rope_dtype);

  p->host.kv_len = alloc_bytes(B * sizeof(int32_t));
  if (!p->host.kv_len) goto oom;
  int32_t longest = 0;
  for (size_t b = 0; b < B; b++) {
    p->host.kv_len[b] = a->kv_lens[b % (size_t)a->n_kv_lens];
    if (p->host.kv_len[b] > longest) longest = p->host.kv_len[b];
  }
  p->kv_capacity = longest > 0 ? longest : 1; /* the library refuses a contiguous capacity 0 */

  size_t kv_rows; /* positions the cache holds */
  if (a->page_size > 0) {
    const int32_t ps = a->page_size;
    int64_t pages = 0;
    for (size_t b = 0; b < B; b++) pages += ((int64_t)p->host.kv_len[b] + ps - 1) / ps;
    if (pages > INT32_MAX) {
      snprintf(err->message, sizeof err->message, "too many pages");
      err->status = FD_STATUS_INVALID_ARGUMENT;
      return err->status;
    }
    p->num_pages = pages > 0 ? (int32_t)pages : 1;
    p->max_pages_per_seq = longest > 0 ? (int32_t)(((int64_t)longest + ps - 1) / ps) : 1;
    kv_rows = (size_t)p->num_pages * (size_t)ps;
  } else {
    kv_rows = B * (size_t)p->kv_capacity;
  }

  p->q_bytes = B * T * Hq * D * elem;
  p->out_bytes = p->q_bytes;
  p->kv_bytes = kv_rows * Hkv * D * kv_elem;
  p->v_bytes = mla ? 0 : p->kv_bytes;
  p->q_pe_bytes = mla ? B * T * Hq * R * elem : 0;
  p->k_pe_bytes = mla ? kv_rows * R * rope_elem : 0;
  p->scale_bytes = a->kv_scale == FD_KV_SCALE_TENSOR ? sizeof(float)
                   : a->kv_scale == FD_KV_SCALE_HEAD  ? Hkv * sizeof(float)
                   : a->kv_scale == FD_KV_SCALE_TOKEN ? kv_rows * Hkv * sizeof(float)
                                                      : 0;
  p->v_scale_bytes = mla ? 0 : p->scale_bytes; /* MLA: the values are the latent (k_scale) */
  p->lse_bytes = B * Hq * T * sizeof(float);
  p->kv_len_bytes = B * sizeof(int32_t);
  p->table_bytes = a->page_size > 0 ? B * (size_t)p->max_pages_per_seq * sizeof(int32_t) : 0;
  p->host.q = alloc_bytes(p->q_bytes);
  p->host.out = alloc_bytes(p->out_bytes);
  p->host.k_cache = alloc_bytes(p->kv_bytes);
  p->host.v_cache = mla ? NULL : alloc_bytes(p->kv_bytes);
  p->host.lse = alloc_bytes(p->lse_bytes);
  if (!p->host.q || !p->host.out || !p->host.k_cache || (!mla && !p->host.v_cache) || !p->host.lse)
    goto oom;
  if (mla) {
    p->host.q_pe = alloc_bytes(p->q_pe_bytes);
    p->host.k_pe_cache = alloc_bytes(p->k_pe_bytes);
    if (!p->host.q_pe || !p->host.k_pe_cache) goto oom;
  }
  if (p->scale_bytes > 0) {
    p->host.k_scale = alloc_bytes(p->scale_bytes);
    p->host.v_scale = mla ? NULL : alloc_bytes(p->scale_bytes);
    if (!p->host.k_scale || (!mla && !p->host.v_scale)) goto oom;
    for (size_t i = 0; i < p->scale_bytes / sizeof(float); i++) {
      p->host.k_scale[i] = FP8_SCALE;
      if (!mla) p->host.v_scale[i] = FP8_SCALE;
    }
  }

  uint64_t state = a->seed;
  const float fp8_scale = a->kv_scale != FD_KV_SCALE_NONE ? FP8_SCALE : 1.0f;
  fill_random(p->host.q, p->q_bytes / elem, a->dtype, 1.0f, &state);
  fill_random(p->host.k_cache, p->kv_bytes / kv_elem, kv_dtype, fp8_scale, &state);
  if (mla) {
    /* an fp8 rope part is scaled by k_scale too; a 16-bit one is not */
    const int rope_fp8 = rope_dtype == FD_DTYPE_E4M3 || rope_dtype == FD_DTYPE_E5M2;
    fill_random(p->host.q_pe, p->q_pe_bytes / elem, a->dtype, 1.0f, &state);
    fill_random(p->host.k_pe_cache, p->k_pe_bytes / rope_elem, rope_dtype,
                rope_fp8 ? fp8_scale : 1.0f, &state);
  } else {
    fill_random(p->host.v_cache, p->kv_bytes / kv_elem, kv_dtype, fp8_scale, &state);
  }
  memset(p->host.out, 0, p->out_bytes);
  memset(p->host.lse, 0, p->lse_bytes);

  if (a->page_size > 0) {
    /* The pool's pages in a random order (Fisher-Yates), handed out in turn. */
    int32_t *order = alloc_bytes((size_t)p->num_pages * sizeof(int32_t));
    p->host.block_table = calloc(B * (size_t)p->max_pages_per_seq, sizeof(int32_t));
    if (!order || !p->host.block_table) {
      free(order);
      goto oom;
    }
    for (int32_t i = 0; i < p->num_pages; i++) order[i] = i;
    for (int32_t i = p->num_pages - 1; i > 0; i--) {
      int32_t j = (int32_t)(next_u64(&state) % (uint64_t)(i + 1));
      int32_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    int32_t next = 0;
    for (size_t b = 0; b < B; b++) {
      int32_t pages = (p->host.kv_len[b] + a->page_size - 1) / a->page_size;
      for (int32_t i = 0; i < pages; i++)
        p->host.block_table[b * (size_t)p->max_pages_per_seq + (size_t)i] = order[next++];
    }
    free(order);
  }

  if (a->sinks != SINKS_NONE) {
    /* last, so the other inputs are those of the same seed without --sinks */
    p->sinks_bytes = Hq * sizeof(float);
    p->host.sinks = alloc_bytes(p->sinks_bytes);
    if (!p->host.sinks) goto oom;
    const double top = 1.5 * log(1.0 + (double)longest);
    for (size_t h = 0; h < Hq; h++)
      p->host.sinks[h] = a->sinks == SINKS_VALUE
                             ? a->sinks_value
                             : (float)(top * (double)(next_u64(&state) >> 11) * 0x1.0p-53);
  }

  fd_problem *f = &p->fd;
  f->backend = a->backend;
  f->dtype = a->dtype;
  f->batch = a->batch;
  f->q_len = a->q_len;
  f->num_heads_q = a->num_heads_q;
  f->num_heads_kv = a->num_heads_kv;
  f->head_dim = a->head_dim;
  f->kv_capacity = p->kv_capacity;
  f->page_size = a->page_size;
  f->max_pages_per_seq = p->max_pages_per_seq;
  f->num_pages = p->num_pages;
  f->num_splits = a->num_splits;
  f->num_threads = a->num_threads;
  f->kv_dtype = a->kv_dtype;
  f->kv_scale = a->kv_scale;
  f->has_window = a->window_left >= 0;
  f->window_left = a->window_left;
  f->logits_soft_cap = a->logits_soft_cap;
  f->non_causal = a->non_causal;
  f->no_pdl = a->no_pdl;
  f->rope_dim = a->rope_dim;
  f->rope_dtype = a->rope_dtype;
  f->softmax_scale = a->softmax_scale;
  if (a->tree > 0) {
    /* an EAGLE-shaped tree per sequence: node t (t >= 1) hangs off one of the
     * last 6 nodes; row t sees t and its ancestors */
    f->tree_mask = 1;
    p->host.tree_mask = calloc((size_t)a->batch * a->q_len, sizeof(uint64_t));
    if (!p->host.tree_mask) goto oom;
    for (size_t b = 0; b < (size_t)a->batch; b++) {
      uint64_t *m = p->host.tree_mask + b * (size_t)a->q_len;
      for (int t = 0; t < a->q_len; t++) {
        const int lo = t > 6 ? t - 6 : 0;
        const uint64_t parent = t ? m[lo + (int)(next_u64(&state) % (uint64_t)(t - lo))] : 0;
        m[t] = parent | ((uint64_t)1 << t);
      }
    }
  }
  return FD_STATUS_OK;
oom:
  problem_free(p);
  snprintf(err->message, sizeof err->message, "out of host memory for the inputs");
  err->status = FD_STATUS_OUT_OF_MEMORY;
  return err->status;
}

void problem_free(problem *p) {
  free(p->host.q);
  free(p->host.k_cache);
  free(p->host.v_cache);
  free(p->host.q_pe);
  free(p->host.k_pe_cache);
  free(p->host.out);
  free(p->host.lse);
  free(p->host.kv_len);
  free(p->host.block_table);
  free(p->host.k_scale);
  free(p->host.v_scale);
  free(p->host.sinks);
  free(p->host.tree_mask);
  memset(p, 0, sizeof *p);
}

fd_tensors problem_fd_tensors(const problem *p, const problem_tensors *set) {
  const fd_problem *f = &p->fd;
  const int64_t D = f->head_dim, Hq = f->num_heads_q, Hkv = f->num_heads_kv, T = f->q_len;
  const int64_t rows = f->page_size > 0 ? f->page_size : p->kv_capacity;
  fd_tensors t = {0};
  t.q = set->q;
  t.q_strides[0] = T * Hq * D, t.q_strides[1] = Hq * D, t.q_strides[2] = D;
  t.k_cache = set->k_cache;
  t.k_strides[0] = rows * Hkv * D, t.k_strides[1] = Hkv * D, t.k_strides[2] = D;
  t.v_cache = set->v_cache;
  if (set->v_cache) memcpy(t.v_strides, t.k_strides, sizeof t.v_strides);
  if (f->rope_dim > 0) { /* MLA: q_pe and the rope cache, one kv head */
    const int64_t R = f->rope_dim;
    t.q_pe = set->q_pe;
    t.q_pe_strides[0] = T * Hq * R, t.q_pe_strides[1] = Hq * R, t.q_pe_strides[2] = R;
    t.k_pe_cache = set->k_pe_cache;
    t.k_pe_strides[0] = rows * Hkv * R, t.k_pe_strides[1] = Hkv * R, t.k_pe_strides[2] = R;
  }
  t.kv_len = set->kv_len;
  t.block_table = f->page_size > 0 ? set->block_table : NULL;
  t.block_table_stride = f->page_size > 0 ? p->max_pages_per_seq : 0;
  t.out = set->out;
  memcpy(t.out_strides, t.q_strides, sizeof t.out_strides);
  t.lse = set->lse;
  t.lse_strides[0] = Hq * T, t.lse_strides[1] = T, t.lse_strides[2] = 1;
  t.k_scale = set->k_scale; /* dense per-token layout: scale_strides all zero */
  t.v_scale = set->v_scale;
  t.sinks = set->sinks;
  t.tree_mask = set->tree_mask;
  t.tree_mask_stride = set->tree_mask ? p->fd.q_len : 0;
  return t;
}

double problem_kv_bytes_read(const problem *p) {
  double keys = 0.0;
  for (int32_t b = 0; b < p->fd.batch; b++) {
    double n = (double)p->host.kv_len[b];
    if (p->fd.window_left >= 0 && !p->fd.non_causal) {
      double seen = (double)p->fd.window_left + (double)p->fd.q_len;
      if (seen < n) n = seen;
    }
    keys += n;
  }
  const fd_dtype kv = p->fd.kv_dtype != 0 ? p->fd.kv_dtype : p->fd.dtype;
  const double scale = p->fd.kv_scale == FD_KV_SCALE_TOKEN ? 4.0 : 0.0; /* a float per key a head */
  if (p->fd.rope_dim > 0) { /* MLA: [latent | rope] once; the values are the latent's bytes */
    const fd_dtype rope = p->fd.rope_dtype != 0 ? p->fd.rope_dtype : kv;
    return keys * (p->fd.head_dim * (double)fd_dtype_size(kv) +
                   p->fd.rope_dim * (double)fd_dtype_size(rope) + scale);
  }
  return 2.0 * keys * p->fd.num_heads_kv * (p->fd.head_dim * (double)fd_dtype_size(kv) + scale);
}

double problem_cache_bytes(const problem *p) {
  return (double)p->kv_bytes + (double)p->v_bytes + (double)p->k_pe_bytes;
}

double problem_set_bytes(const problem *p) {
  return (double)p->q_bytes + (double)p->q_pe_bytes + problem_cache_bytes(p) +
         (double)p->out_bytes + (double)p->lse_bytes;
}

void problem_poison_outputs(problem *p) {
  const size_t n = p->out_bytes / fd_dtype_size(p->fd.dtype);
  for (size_t i = 0; i < n; i++) {
    switch (p->fd.dtype) {
      case FD_DTYPE_F32: ((float *)p->host.out)[i] = NAN; break;
      case FD_DTYPE_F16: ((uint16_t *)p->host.out)[i] = 0x7E00u; break;
      case FD_DTYPE_BF16: ((uint16_t *)p->host.out)[i] = 0x7FC0u; break;
      case FD_DTYPE_E4M3:
      case FD_DTYPE_E5M2: break; /* never an out dtype */
    }
  }
  for (size_t i = 0; i < p->lse_bytes / sizeof(float); i++) p->host.lse[i] = NAN;
}

/* Bytes of the --tree masks: one uint64 a row of each sequence. */
static size_t tree_bytes(const problem *p) {
  return (size_t)p->fd.batch * (size_t)p->fd.q_len * sizeof(uint64_t);
}

fd_status problem_device_alloc(const problem *p, problem_tensors *dev, const problem_tensors *share,
                               fd_error *err) {
  memset(dev, 0, sizeof *dev);
  fd_status st;
  if ((st = gpu_malloc(&dev->q, p->q_bytes, err)) ||
      (st = gpu_malloc(&dev->k_cache, p->kv_bytes, err)) ||
      (p->v_bytes > 0 && (st = gpu_malloc(&dev->v_cache, p->v_bytes, err))) ||
      (p->q_pe_bytes > 0 && (st = gpu_malloc(&dev->q_pe, p->q_pe_bytes, err))) ||
      (p->k_pe_bytes > 0 && (st = gpu_malloc(&dev->k_pe_cache, p->k_pe_bytes, err))) ||
      (st = gpu_malloc(&dev->out, p->out_bytes, err)) ||
      (st = gpu_malloc((void **)&dev->lse, p->lse_bytes, err)))
    goto fail;
  if ((p->scale_bytes > 0 && (st = gpu_malloc((void **)&dev->k_scale, p->scale_bytes, err))) ||
      (p->v_scale_bytes > 0 && (st = gpu_malloc((void **)&dev->v_scale, p->v_scale_bytes, err))))
    goto fail;
  if (share) {
    dev->kv_len = share->kv_len;
    dev->block_table = share->block_table;
    dev->sinks = share->sinks;
    dev->tree_mask = share->tree_mask;
  } else if ((st = gpu_malloc((void **)&dev->kv_len, p->kv_len_bytes, err)) ||
             (p->table_bytes > 0 &&
              (st = gpu_malloc((void **)&dev->block_table, p->table_bytes, err))) ||
             (p->sinks_bytes > 0 && (st = gpu_malloc((void **)&dev->sinks, p->sinks_bytes, err))) ||
             (p->host.tree_mask &&
              (st = gpu_malloc((void **)&dev->tree_mask, tree_bytes(p), err)))) {
    goto fail;
  }
  return FD_STATUS_OK;
fail:
  problem_device_free(dev, share);
  return st;
}

fd_status problem_device_upload(const problem *p, problem_tensors *dev, void *stream, fd_error *err) {
  fd_status st;
  if ((st = gpu_copy_to_device(dev->q, p->host.q, p->q_bytes, stream, err)) ||
      (st = gpu_copy_to_device(dev->k_cache, p->host.k_cache, p->kv_bytes, stream, err)) ||
      (p->v_bytes > 0 &&
       (st = gpu_copy_to_device(dev->v_cache, p->host.v_cache, p->v_bytes, stream, err))) ||
      (p->q_pe_bytes > 0 &&
       (st = gpu_copy_to_device(dev->q_pe, p->host.q_pe, p->q_pe_bytes, stream, err))) ||
      (p->k_pe_bytes > 0 &&
       (st = gpu_copy_to_device(dev->k_pe_cache, p->host.k_pe_cache, p->k_pe_bytes, stream, err))) ||
      (st = gpu_copy_to_device(dev->out, p->host.out, p->out_bytes, stream, err)) ||
      (st = gpu_copy_to_device(dev->lse, p->host.lse, p->lse_bytes, stream, err)) ||
      (p->scale_bytes > 0 &&
       (st = gpu_copy_to_device(dev->k_scale, p->host.k_scale, p->scale_bytes, stream, err))) ||
      (p->v_scale_bytes > 0 &&
       (st = gpu_copy_to_device(dev->v_scale, p->host.v_scale, p->v_scale_bytes, stream, err))) ||
      (st = gpu_copy_to_device(dev->kv_len, p->host.kv_len, p->kv_len_bytes, stream, err)) ||
      (p->table_bytes > 0 && (st = gpu_copy_to_device(dev->block_table, p->host.block_table,
                                                      p->table_bytes, stream, err))) ||
      (p->sinks_bytes > 0 &&
       (st = gpu_copy_to_device(dev->sinks, p->host.sinks, p->sinks_bytes, stream, err))) ||
      (dev->tree_mask &&
       (st = gpu_copy_to_device(dev->tree_mask, p->host.tree_mask, tree_bytes(p), stream, err))))
    return st;
  return gpu_stream_sync(stream, err);
}

void problem_device_free(problem_tensors *dev, const problem_tensors *share) {
  gpu_free(dev->q);
  gpu_free(dev->k_cache);
  gpu_free(dev->v_cache);
  gpu_free(dev->q_pe);
  gpu_free(dev->k_pe_cache);
  gpu_free(dev->out);
  gpu_free(dev->lse);
  gpu_free(dev->k_scale);
  gpu_free(dev->v_scale);
  if (!share) {
    gpu_free(dev->kv_len);
    gpu_free(dev->block_table);
    gpu_free(dev->sinks);
    gpu_free(dev->tree_mask);
  }
  memset(dev, 0, sizeof *dev);
}

void problem_describe(const problem *p, const problem_args *a, char *text, size_t text_size) {
  char lens[128];
  size_t used = 0;
  lens[0] = '\0';
  int i = 0;
  for (; i < a->n_kv_lens && used + 16 < sizeof lens; i++)
    used += (size_t)snprintf(lens + used, sizeof lens - used, "%s%d", i ? "," : "", (int)a->kv_lens[i]);
  if (i < a->n_kv_lens) snprintf(lens + used, sizeof lens - used, ",...");
  int n = snprintf(text, text_size,
                   "backend=%s dtype=%s batch=%d q_len=%d num_heads_q=%d num_heads_kv=%d "
                   "head_dim=%d kv_len=%s page_size=%d",
                   fd_backend_name(p->fd.backend), args_dtype_name(p->fd.dtype), p->fd.batch,
                   p->fd.q_len, p->fd.num_heads_q, p->fd.num_heads_kv, p->fd.head_dim, lens,
                   p->fd.page_size);
  /* the variants, only when set (lines without them read as before) */
  size_t at = n > 0 && (size_t)n < text_size ? (size_t)n : text_size;
  if (a->window_left >= 0 && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " window_left=%d", a->window_left);
  if (a->logits_soft_cap > 0.0f && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " logits_soft_cap=%g",
                           (double)a->logits_soft_cap);
  if (a->sinks == SINKS_RANDOM && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " sinks=random");
  if (a->sinks == SINKS_VALUE && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " sinks=%g", (double)a->sinks_value);
  if (a->non_causal && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " non_causal=1");
  if (a->tree > 0 && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " tree=%d", a->tree);
  if (a->no_pdl && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " no_pdl=1");
  if (a->softmax_scale > 0.0f && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " softmax_scale=%g", (double)a->softmax_scale);
  if (p->fd.rope_dim > 0 && at < text_size)
    at += (size_t)snprintf(text + at, text_size - at, " rope_dim=%d%s%s", p->fd.rope_dim,
                           p->fd.rope_dtype ? " rope_dtype=" : "",
                           p->fd.rope_dtype ? args_dtype_name(p->fd.rope_dtype) : "");
  if (p->fd.kv_dtype && at < text_size)
    snprintf(text + at, text_size - at, " kv_dtype=%s kv_scale=%s", args_dtype_name(p->fd.kv_dtype),
             args_kv_scale_name(p->fd.kv_scale));
}
