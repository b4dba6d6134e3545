/*
 * cmd_generate.c — `flashdecode generate`: writes a story with the bundled
 * stories260K model (llama2.c's run.c generation loop), its decode attention
 * running through libflashdecode on a paged KV cache.
 *
 * --check also compares, at every layer of every step, the backend's
 * attention output with the float64 reference over the same cache, and runs
 * a second decode whose attention is the reference backend, to tell whether
 * the tokens would have been the same.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "attention.h"
#include "commands.h"
#include "gpu.h"
#include "model.h"
#include "sampler.h"
#include "timer.h"
#include "tokenizer.h"

#ifndef FD_CLI_MODEL_DIR
#define FD_CLI_MODEL_DIR "models/stories260K"
#endif
#define MODEL_FILE "stories260K.bin"
#define TOKENIZER_FILE "tok512.bin"
/* --check: the largest |attention out - float64 reference| that passes (fp32). */
#define CHECK_TOLERANCE 1e-4

typedef struct generate_options {
  const char *model_path;     /* NULL = the bundled model */
  const char *tokenizer_path; /* NULL = the bundled tokenizer */
  const char *prompt;
  int steps;
  float temperature;
  float top_p;
  uint64_t seed;
  int seed_given;
  fd_backend backend;
  int num_splits;
  int page_size;
  int num_threads;
  int print_ids;
  int check;
  fd_dtype kv_dtype; /* 0: float32 attention; bf16, e4m3 or e5m2 cache (bf16 q) */
} generate_options;

static void print_usage(void) {
  printf(
      "usage: flashdecode generate [options]\n"
      "\n"
      "Writes a story with the stories260K model (Karpathy's llama2.c / tinyllamas, MIT);\n"
      "the decode attention of every layer runs through libflashdecode on a paged KV cache.\n"
      "Stops after --steps positions or when the model produces BOS.\n"
      "\n"
      "  --model PATH         llama2.c checkpoint (default: the bundled stories260K.bin)\n"
      "  --tokenizer PATH     llama2.c tokenizer (default: the bundled tok512.bin)\n"
      "  --prompt TEXT        text to start from (default empty)\n"
      "  --steps N            positions to run, prompt included (default 256; 0 = seq_len)\n"
      "  --temperature T      0 = greedy (default); otherwise sample from softmax(logits / T)\n"
      "  --top-p P            nucleus sampling when 0 < P < 1 (default 0.9; 1 = off)\n"
      "  --seed N             sampling seed (default: from the clock)\n"
      "  --backend B          cpu, cuda, reference or auto (default auto: cuda when a GPU is present)\n"
      "  --num-splits N       0 = automatic (default), 1 = no split, N = N splits\n"
      "  --page-size N        positions per KV-cache page, 1..256 (default 16)\n"
      "  --threads N          CPU backend worker threads (default all cores)\n"
      "  --ids                after the text, print 'ids: ' and the token ids (BOS first)\n"
      "  --check              also run the float64 reference attention at every layer and a\n"
      "                       second decode on the reference backend; report the largest\n"
      "                       attention difference and whether the tokens are identical\n"
      "                       (exit 1 when they differ or the difference exceeds %.0e)\n"
      "  --kv-dtype T         bf16, e4m3 or e5m2: the attention runs in bf16 on a KV cache of\n"
      "                       that type (fp8: per-token scales; rows written by fd_append_kv;\n"
      "                       CPU backend). e4m3 / e5m2 also run a bf16-cache decode and\n"
      "                       report how many generated tokens the two share before they\n"
      "                       first differ\n"
      "  -h, --help           this text\n"
      "\n"
      "Prints 'achieved tok/s: X' on stderr at the end (with --check the per-layer\n"
      "reference comparison is inside the timed steps).\n",
      CHECK_TOLERANCE);
}

enum {
  OPT_MODEL = 256,
  OPT_TOKENIZER,
  OPT_PROMPT,
  OPT_STEPS,
  OPT_TEMPERATURE,
  OPT_TOP_P,
  OPT_SEED,
  OPT_BACKEND,
  OPT_SPLITS,
  OPT_PAGE_SIZE,
  OPT_THREADS,
  OPT_IDS,
  OPT_CHECK,
  OPT_KV_DTYPE
};

/* Returns 0, 1 when --help was printed, -1 on a bad option. */
static int parse_options(generate_options *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->prompt = "";
  o->steps = 256;
  o->top_p = 0.9f;
  o->backend = FD_BACKEND_AUTO;
  o->page_size = 16;
  static const struct option options[] = {
      {"model", required_argument, NULL, OPT_MODEL},
      {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
      {"prompt", required_argument, NULL, OPT_PROMPT},
      {"steps", required_argument, NULL, OPT_STEPS},
      {"temperature", required_argument, NULL, OPT_TEMPERATURE},
      {"top-p", required_argument, NULL, OPT_TOP_P},
      {"seed", required_argument, NULL, OPT_SEED},
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"num-splits", required_argument, NULL, OPT_SPLITS},
      {"page-size", required_argument, NULL, OPT_PAGE_SIZE},
      {"threads", required_argument, NULL, OPT_THREADS},
      {"ids", no_argument, NULL, OPT_IDS},
      {"check", no_argument, NULL, OPT_CHECK},
      {"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int c, bad = 0;
  opterr = 0; /* args_option_error reports, pointing to --help */
  while (!bad && (c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
    switch (c) {
      case OPT_MODEL: o->model_path = optarg; break;
      case OPT_TOKENIZER: o->tokenizer_path = optarg; break;
      case OPT_PROMPT: o->prompt = optarg; break;
      case OPT_STEPS: bad = args_int("--steps", optarg, 0, 1 << 30, &o->steps); break;
      case OPT_TEMPERATURE: bad = args_float("--temperature", optarg, 0.0, 100.0, &o->temperature); break;
      case OPT_TOP_P: bad = args_float("--top-p", optarg, 0.0, 1.0, &o->top_p); break;
      case OPT_SEED:
        bad = args_u64("--seed", optarg, &o->seed);
        o->seed_given = 1;
        break;
      case OPT_BACKEND: bad = args_backend("--backend", optarg, 1, &o->backend); break;
      case OPT_SPLITS: bad = args_int("--num-splits", optarg, 0, FD_MAX_SPLITS, &o->num_splits); break;
      case OPT_PAGE_SIZE: bad = args_int("--page-size", optarg, 1, 256, &o->page_size); break;
      case OPT_THREADS: bad = args_int("--threads", optarg, 0, FD_MAX_THREADS, &o->num_threads); break;
      case OPT_IDS: o->print_ids = 1; break;
      case OPT_CHECK: o->check = 1; break;
      case OPT_KV_DTYPE:
        if (!strcmp(optarg, "bf16") || !strcmp(optarg, "bfloat16")) o->kv_dtype = FD_DTYPE_BF16;
        else bad = args_kv_dtype("--kv-dtype", optarg, &o->kv_dtype);
        if (!bad && o->kv_dtype == 0) {
          fprintf(stderr, "flashdecode generate: --kv-dtype: bf16, e4m3 or e5m2\n");
          bad = -1;
        }
        break;
      case 'h': print_usage(); return 1;
      default: bad = args_option_error("generate", c, argv, optind, optopt, options); break;
    }
  }
  if (bad) return -1;
  if (o->kv_dtype && o->check) {
    fprintf(stderr, "flashdecode generate: --check compares the float32 attention; not with "
                    "--kv-dtype\n");
    return -1;
  }
  if (optind < argc) {
    fprintf(stderr, "flashdecode generate: unexpected argument '%s' (use --prompt TEXT)\n",
            argv[optind]);
    return -1;
  }
  return 0;
}

/* ---- locating the bundled model ---- */

static int readable(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  fclose(f);
  return 1;
}

/* <exe dir>/../models/stories260K/<name>, <exe dir>/models/stories260K/<name>,
 * then the source tree's copy. Returns 0 and the path, or -1. */
static int find_bundled(const char *exe_path, const char *name, char *path, size_t path_size) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", exe_path ? exe_path : "");
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  else snprintf(dir, sizeof dir, ".");
  int n = snprintf(path, path_size, "%s/../models/stories260K/%s", dir, name);
  if (n > 0 && (size_t)n < path_size && readable(path)) return 0;
  n = snprintf(path, path_size, "%s/models/stories260K/%s", dir, name);
  if (n > 0 && (size_t)n < path_size && readable(path)) return 0;
  n = snprintf(path, path_size, "%s/%s", FD_CLI_MODEL_DIR, name);
  return n > 0 && (size_t)n < path_size && readable(path) ? 0 : -1;
}

/* ---- one decode (the main one, or the --check reference one) ---- */

typedef struct decoder {
  model_state state;
  attention attn;
  sampler sampler;
  int *ids;  /* [steps + 1] the sequence: BOS (prompt) first, then one id per step */
  int n_ids;
  int pos;   /* the next position to run */
  int done;
} decoder;

static fd_status decoder_init(decoder *d, const model *m, const attention_config *ac, int steps,
                              const generate_options *o, uint64_t seed, int first_token,
                              fd_error *err) {
  memset(d, 0, sizeof *d);
  d->ids = malloc(((size_t)steps + 1) * sizeof(int));
  if (!d->ids || model_state_init(&d->state, &m->config) ||
      sampler_init(&d->sampler, m->config.vocab_size, o->temperature, o->top_p, seed)) {
    snprintf(err->message, sizeof err->message, "out of host memory");
    return err->status = FD_STATUS_OUT_OF_MEMORY;
  }
  d->ids[0] = first_token;
  d->n_ids = 1;
  return attention_init(&d->attn, ac, err);
}

static void decoder_free(decoder *d) {
  free(d->ids);
  model_state_free(&d->state);
  attention_free(&d->attn);
  sampler_free(&d->sampler);
}

/* One position: forward the last id, then take the prompt's next id or
 * sample one. Done at `steps` positions or when the next id is BOS. */
static fd_status decoder_step(decoder *d, const model *m, const int *prompt, int n_prompt,
                              int steps, model_attend_fn attend, void *attend_ctx, fd_error *err) {
  int token = d->ids[d->n_ids - 1];
  fd_status st = attention_begin_step(&d->attn, d->pos, err);
  if (st == FD_STATUS_OK) st = model_forward(m, &d->state, token, d->pos, attend, attend_ctx, err);
  if (st != FD_STATUS_OK) return st;
  int next = d->pos + 1 < n_prompt ? prompt[d->pos + 1] : sampler_sample(&d->sampler, d->state.logits);
  d->pos++;
  if (next == TOKEN_BOS) d->done = 1;
  else d->ids[d->n_ids++] = next;
  if (d->pos >= steps) d->done = 1;
  return FD_STATUS_OK;
}

/* The main decode's attention: the backend, and with --check the float64
 * reference over the same cache and q. */
typedef struct checked_attention {
  attention *attn;
  int check;
  double *out64;   /* [n_heads][head_size] */
  double max_diff; /* largest |out - out64| seen */
  long calls;
} checked_attention;

static fd_status attend_checked(void *ctx, int layer, int pos, const float *q, const float *k,
                                const float *v, float *out, fd_error *err) {
  checked_attention *ca = ctx;
  fd_status st = attention_layer(ca->attn, layer, pos, q, k, v, out, err);
  if (st != FD_STATUS_OK || !ca->check) return st;
  st = attention_reference(ca->attn, layer, q, ca->out64, err);
  if (st != FD_STATUS_OK) return st;
  const int n = ca->attn->config.num_heads_q * ca->attn->config.head_dim;
  for (int i = 0; i < n; i++) {
    double d = fabs((double)out[i] - ca->out64[i]);
    if (!(d <= ca->max_diff)) ca->max_diff = d; /* NaN sticks */
  }
  ca->calls++;
  return FD_STATUS_OK;
}

static fd_status attend_plain(void *ctx, int layer, int pos, const float *q, const float *k,
                              const float *v, float *out, fd_error *err) {
  return attention_layer(ctx, layer, pos, q, k, v, out, err);
}

/* Prints the check's verdict; returns 1 when it passes. */
static int report_check(const decoder *main_dec, const decoder *ref_dec, const checked_attention *ca) {
  int same = main_dec->n_ids == ref_dec->n_ids;
  int first_diff = -1;
  int n = main_dec->n_ids < ref_dec->n_ids ? main_dec->n_ids : ref_dec->n_ids;
  for (int i = 0; i < n; i++) {
    if (main_dec->ids[i] != ref_dec->ids[i]) {
      same = 0;
      first_diff = i;
      break;
    }
  }
  if (same) {
    printf("check: tokens identical to the float64-reference decode (%d ids)\n", main_dec->n_ids);
  } else if (first_diff >= 0) {
    printf("check: tokens DIFFER from the float64-reference decode at index %d (ours %d, reference %d)\n",
           first_diff, main_dec->ids[first_diff], ref_dec->ids[first_diff]);
  } else {
    printf("check: tokens DIFFER: %d ids here, %d in the float64-reference decode\n", main_dec->n_ids,
           ref_dec->n_ids);
  }
  int close = ca->max_diff <= CHECK_TOLERANCE;
  printf("check: max |attention out - float64 reference| = %.3e over %ld layer calls (tolerance %.0e)\n",
         ca->max_diff, ca->calls, CHECK_TOLERANCE);
  printf("check: %s\n", same && close ? "PASS" : "FAIL");
  return same && close;
}

int cmd_generate(int argc, char **argv, const char *exe_path) {
  generate_options o;
  int r = parse_options(&o, argc, argv);
  if (r != 0) return r > 0 ? 0 : 2;

  char model_path[4096], tokenizer_path[4096], msg[512];
  if (o.model_path) snprintf(model_path, sizeof model_path, "%s", o.model_path);
  else if (find_bundled(exe_path, MODEL_FILE, model_path, sizeof model_path)) {
    fprintf(stderr, "flashdecode generate: cannot find the bundled %s (use --model)\n", MODEL_FILE);
    return 1;
  }
  if (o.tokenizer_path) snprintf(tokenizer_path, sizeof tokenizer_path, "%s", o.tokenizer_path);
  else if (find_bundled(exe_path, TOKENIZER_FILE, tokenizer_path, sizeof tokenizer_path)) {
    fprintf(stderr, "flashdecode generate: cannot find the bundled %s (use --tokenizer)\n",
            TOKENIZER_FILE);
    return 1;
  }

  if (o.backend == FD_BACKEND_AUTO)
    o.backend = fd_backend_available(FD_BACKEND_CUDA) && gpu_available() ? FD_BACKEND_CUDA
                                                                          : FD_BACKEND_CPU;
  if (o.backend == FD_BACKEND_CUDA && !(gpu_available() && fd_backend_available(FD_BACKEND_CUDA))) {
    gpu_describe(msg, sizeof msg);
    fprintf(stderr, "flashdecode generate: --backend cuda: no usable GPU (GPU: %s; CUDA backend %s)\n",
            msg, fd_backend_available(FD_BACKEND_CUDA) ? "available" : "unavailable");
    return 1;
  }

  model m;
  tokenizer tok;
  if (model_load(&m, model_path, msg, sizeof msg)) {
    fprintf(stderr, "flashdecode generate: %s\n", msg);
    return 1;
  }
  if (tokenizer_load(&tok, tokenizer_path, m.config.vocab_size, msg, sizeof msg)) {
    fprintf(stderr, "flashdecode generate: %s\n", msg);
    model_free(&m);
    return 1;
  }
  const model_config *mc = &m.config;
  int steps = o.steps <= 0 || o.steps > mc->seq_len ? mc->seq_len : o.steps;
  uint64_t seed = o.seed_given ? o.seed : (uint64_t)time(NULL);
  if (o.temperature > 0.0f && !o.seed_given)
    fprintf(stderr, "seed: %llu\n", (unsigned long long)seed);

  int status = 1;
  fd_error err = {0};
  decoder main_dec, ref_dec;
  memset(&main_dec, 0, sizeof main_dec);
  memset(&ref_dec, 0, sizeof ref_dec);
  checked_attention ca = {0};
  int *prompt = malloc((strlen(o.prompt) + 3) * sizeof(int));
  int n_prompt = 0;
  if (!prompt || tokenizer_encode(&tok, o.prompt, 1, 0, prompt, &n_prompt)) {
    fprintf(stderr, "flashdecode generate: out of memory\n");
    goto done;
  }

  attention_config ac = {0};
  ac.backend = o.backend;
  ac.n_layers = mc->n_layers;
  ac.num_heads_q = mc->n_heads;
  ac.num_heads_kv = mc->n_kv_heads;
  ac.head_dim = mc->head_size;
  ac.capacity = mc->seq_len;
  ac.page_size = o.page_size;
  ac.num_splits = o.num_splits;
  ac.num_threads = o.num_threads;
  ac.kv_dtype = o.kv_dtype;
  if (decoder_init(&main_dec, &m, &ac, steps, &o, seed, prompt[0], &err)) goto fail;
  const int compare_bf16 = o.kv_dtype == FD_DTYPE_E4M3 || o.kv_dtype == FD_DTYPE_E5M2;
  if (compare_bf16) { /* the same decode on a bf16 cache, in lockstep */
    attention_config bc = ac;
    bc.kv_dtype = FD_DTYPE_BF16;
    if (decoder_init(&ref_dec, &m, &bc, steps, &o, seed, prompt[0], &err)) goto fail;
  } else if (o.check) {
    attention_config rc = ac;
    rc.backend = FD_BACKEND_REFERENCE;
    if (decoder_init(&ref_dec, &m, &rc, steps, &o, seed, prompt[0], &err)) goto fail;
    ca.out64 = malloc((size_t)mc->dim * sizeof(double));
    if (!ca.out64) {
      snprintf(err.message, sizeof err.message, "out of host memory");
      goto fail;
    }
  } else {
    ref_dec.done = 1;
  }
  ca.attn = &main_dec.attn;
  ca.check = o.check;

  char device[256] = "";
  if (o.backend == FD_BACKEND_CUDA) gpu_describe(device, sizeof device);
  char splits[32] = "automatic";
  if (o.num_splits) snprintf(splits, sizeof splits, "%d (fixed)", o.num_splits);
  fprintf(stderr, "backend: %s%s%s%s, page_size %d, num_splits %s\n", fd_backend_name(o.backend),
          device[0] ? " (" : "", device, device[0] ? ")" : "", o.page_size, splits);

  double elapsed = 0.0;
  int timed_steps = 0;
  while (!main_dec.done || !ref_dec.done) {
    if (!main_dec.done) {
      int before = main_dec.n_ids;
      double t0 = timer_seconds();
      if (decoder_step(&main_dec, &m, prompt, n_prompt, steps, attend_checked, &ca, &err)) goto fail;
      if (main_dec.pos == 1) args_report_splits("generate", o.num_splits, &main_dec.attn.plan);
      if (main_dec.pos > 1) { /* as run.c: the clock starts after the first step */
        elapsed += timer_seconds() - t0;
        timed_steps++;
      }
      if (main_dec.n_ids > before) {
        const char *piece = tokenizer_decode(&tok, main_dec.ids[main_dec.n_ids - 2],
                                             main_dec.ids[main_dec.n_ids - 1]);
        if (tokenizer_printable(piece)) fputs(piece, stdout);
        fflush(stdout);
      }
    }
    if (!ref_dec.done &&
        decoder_step(&ref_dec, &m, prompt, n_prompt, steps, attend_plain, &ref_dec.attn, &err))
      goto fail;
  }
  printf("\n");
  if (o.print_ids) {
    printf("ids:");
    for (int i = 0; i < main_dec.n_ids; i++) printf(" %d", main_dec.ids[i]);
    printf("\n");
  }
  status = 0;
  if (o.check && !report_check(&main_dec, &ref_dec, &ca)) status = 1;
  if (compare_bf16) {
    /* the common prefix of the two sequences, counted in generated tokens (after the
     * prompt, BOS included, which both share) */
    int same = 0, n = main_dec.n_ids < ref_dec.n_ids ? main_dec.n_ids : ref_dec.n_ids;
    while (same < n && main_dec.ids[same] == ref_dec.ids[same]) same++;
    int gen_same = same > n_prompt ? same - n_prompt : 0;
    int gen_here = main_dec.n_ids > n_prompt ? main_dec.n_ids - n_prompt : 0;
    int gen_ref = ref_dec.n_ids > n_prompt ? ref_dec.n_ids - n_prompt : 0;
    if (same == main_dec.n_ids && same == ref_dec.n_ids)
      printf("kv_dtype %s: the %d generated tokens are those of the bf16-cache decode "
             "(identical)\n", args_dtype_name(o.kv_dtype), gen_here);
    else
      printf("kv_dtype %s: the first %d generated tokens are those of the bf16-cache decode, "
             "then the sequences diverge (%d generated tokens here, %d there)\n",
             args_dtype_name(o.kv_dtype), gen_same, gen_here, gen_ref);
  }
  fflush(stdout);
  if (timed_steps > 0)
    fprintf(stderr, "achieved tok/s: %f\n", (double)timed_steps / elapsed);
  goto done;
fail:
  fflush(stdout);
  fprintf(stderr, "\nflashdecode generate: %s: %s\n", fd_status_name(err.status), err.message);
done:
  free(ca.out64);
  free(prompt);
  decoder_free(&main_dec);
  decoder_free(&ref_dec);
  tokenizer_free(&tok);
  model_free(&m);
  return status;
}
