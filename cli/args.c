/*
 * args.c — option value parsers (see args.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

int args_int(const char *option, const char *text, long min, long max, int *value) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end != '\0' || v < min || v > max) {
    fprintf(stderr, "flashdecode: %s: '%s' is not an integer in %ld..%ld\n", option, text, min, max);
    return -1;
  }
  *value = (int)v;
  return 0;
}

int args_u64(const char *option, const char *text, uint64_t *value) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || end == text || *end != '\0' || text[0] == '-') {
    fprintf(stderr, "flashdecode: %s: '%s' is not a non-negative integer\n", option, text);
    return -1;
  }
  *value = (uint64_t)v;
  return 0;
}

int args_float(const char *option, const char *text, double min, double max, float *value) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end != '\0' || !isfinite(v) || v < min || v > max) {
    fprintf(stderr, "flashdecode: %s: '%s' is not a number in %g..%g\n", option, text, min, max);
    return -1;
  }
  *value = (float)v;
  return 0;
}

int args_backend(const char *option, const char *text, int allow_reference, fd_backend *value) {
  if (strcmp(text, "cpu") == 0) *value = FD_BACKEND_CPU;
  else if (strcmp(text, "cuda") == 0) *value = FD_BACKEND_CUDA;
  else if (strcmp(text, "auto") == 0) *value = FD_BACKEND_AUTO;
  else if (allow_reference && strcmp(text, "reference") == 0) *value = FD_BACKEND_REFERENCE;
  else {
    fprintf(stderr, "flashdecode: %s: '%s' is not cpu, cuda%s or auto\n", option, text,
            allow_reference ? ", reference" : "");
    return -1;
  }
  return 0;
}

int args_dtype(const char *option, const char *text, fd_dtype *value) {
  if (!strcmp(text, "f32") || !strcmp(text, "fp32") || !strcmp(text, "float32"))
    *value = FD_DTYPE_F32;
  else if (!strcmp(text, "f16") || !strcmp(text, "fp16") || !strcmp(text, "float16"))
    *value = FD_DTYPE_F16;
  else if (!strcmp(text, "bf16") || !strcmp(text, "bfloat16"))
    *value = FD_DTYPE_BF16;
  else {
    fprintf(stderr, "flashdecode: %s: '%s' is not f32, f16 or bf16\n", option, text);
    return -1;
  }
  return 0;
}

const char *args_dtype_name(fd_dtype dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_E4M3: return "e4m3";
    case FD_DTYPE_E5M2: return "e5m2";
  }
  return "unknown";
}

int args_kv_dtype(const char *option, const char *text, fd_dtype *value) {
  if (!strcmp(text, "e4m3") || !strcmp(text, "float8_e4m3fn") || !strcmp(text, "fp8"))
    *value = FD_DTYPE_E4M3;
  else if (!strcmp(text, "e5m2") || !strcmp(text, "float8_e5m2"))
    *value = FD_DTYPE_E5M2;
  else if (!strcmp(text, "same"))
    *value = (fd_dtype)0;
  else {
    fprintf(stderr, "flashdecode: %s: '%s' is not e4m3, e5m2 or same (the q dtype)\n", option, text);
    return -1;
  }
  return 0;
}

int args_kv_scale(const char *option, const char *text, fd_kv_scale *value) {
  static const char *names[] = {"none", "tensor", "head", "token"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(text, names[i])) {
      *value = (fd_kv_scale)i;
      return 0;
    }
  fprintf(stderr, "flashdecode: %s: '%s' is not none, tensor, head or token\n", option, text);
  return -1;
}

const char *args_kv_scale_name(fd_kv_scale scale) {
  static const char *names[] = {"none", "tensor", "head", "token"};
  return (unsigned)scale < 4 ? names[scale] : "unknown";
}

int args_int_list(const char *option, const char *text, int32_t *values, int max_count, int *count) {
  int n = 0;
  const char *p = text;
  for (;;) {
    char *end = NULL;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0') ||
        n == max_count) {
      fprintf(stderr,
              "flashdecode: %s: '%s' is not a list of at most %d non-negative integers "
              "separated by commas\n",
              option, text, max_count);
      return -1;
    }
    values[n++] = (int32_t)v;
    if (*end == '\0') break;
    p = end + 1;
  }
  *count = n;
  return 0;
}

int args_option_error(const char *command, int c, char *const *argv, int argind, int optopt_value,
                      const struct option *options) {
  const char *text = argind > 0 ? argv[argind - 1] : NULL;
  if (text && strncmp(text, "--", 2) == 0) {
    const char *name = text + 2;
    const size_t len = strcspn(name, "=");
    int exact = -1, prefixed = 0;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; options[i].name; i++) {
      if (strncmp(options[i].name, name, len) != 0) continue;
      if (strlen(options[i].name) == len) exact = i;
      prefixed++;
      if (used < sizeof list)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s--%s", used ? ", " : "",
                                 options[i].name);
    }
    if (c == ':')
      fprintf(stderr, "flashdecode %s: --%.*s needs a value", command, (int)len, name);
    else if (exact >= 0 && options[exact].has_arg == no_argument && name[len] == '=')
      fprintf(stderr, "flashdecode %s: --%.*s takes no value ('%s')", command, (int)len, name, text);
    else if (exact < 0 && prefixed > 1)
      fprintf(stderr, "flashdecode %s: ambiguous option '%s' (%s)", command, text, list);
    else
      fprintf(stderr, "flashdecode %s: unknown option '%s'", command, text);
  } else if (c == ':') {
    fprintf(stderr, "flashdecode %s: -%c needs a value", command, optopt_value);
  } else if (optopt_value > 32 && optopt_value < 127) {
    fprintf(stderr, "flashdecode %s: unknown option '-%c'", command, optopt_value);
  } else {
    fprintf(stderr, "flashdecode %s: unknown option '%s'", command, text ? text : "?");
  }
  fprintf(stderr, " (see flashdecode %s --help)\n", command);
  return -1;
}

void args_report_splits(const char *command, int requested, const fd_plan *plan) {
  if (requested <= 0 || plan->num_splits == requested) return;
  const long long chunks =
      plan->chunk_len > 0 ? ((long long)plan->kv_capacity + plan->chunk_len - 1) / plan->chunk_len : 0;
  if (plan->num_splits == chunks)
    fprintf(stderr,
            "flashdecode %s: --num-splits %d runs as %d splits: a split holds whole chunks of %d "
            "keys, and kv_capacity %d has %lld\n",
            command, requested, plan->num_splits, plan->chunk_len, plan->kv_capacity, chunks);
  else /* a window: the keys a sequence reads are fewer than kv_capacity */
    fprintf(stderr,
            "flashdecode %s: --num-splits %d runs as %d splits: a split holds whole chunks of %d "
            "keys, and the window reads at most %d chunks\n",
            command, requested, plan->num_splits, plan->chunk_len, plan->num_splits);
}
