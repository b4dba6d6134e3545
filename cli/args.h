/*
 * args.h — parsing of option values shared by the subcommands: integers and
 * floats with range checks, backend and dtype names, kv_len lists. Each
 * parser prints "flashdecode: --name: why" to stderr and returns -1 on a bad
 * value, 0 on success.
 */
#ifndef FD_CLI_ARGS_H
#define FD_CLI_ARGS_H

#include <getopt.h>
#include <stdint.h>

#include "flashdecode.h"

int args_int(const char *option, const char *text, long min, long max, int *value);
int args_u64(const char *option, const char *text, uint64_t *value);
int args_float(const char *option, const char *text, double min, double max, float *value);
/* "cpu", "cuda", "auto" (and "reference" when allow_reference). */
int args_backend(const char *option, const char *text, int allow_reference, fd_backend *value);
/* "f32", "f16", "bf16" (also "fp32", "fp16", "float32", "float16", "bfloat16"). */
int args_dtype(const char *option, const char *text, fd_dtype *value);
/* --kv-dtype: e4m3 (or float8_e4m3fn, fp8), e5m2 (float8_e5m2), same (0 = the
 * q dtype). --kv-scale: none, tensor, head, token. 0 or -1 (printed). */
int args_kv_dtype(const char *option, const char *text, fd_dtype *value);
int args_kv_scale(const char *option, const char *text, fd_kv_scale *value);
const char *args_kv_scale_name(fd_kv_scale scale);
/* Short name of a dtype: "f32", "f16", "bf16". */
const char *args_dtype_name(fd_dtype dtype);
/* Comma-separated non-negative integers, at most max_count. */
int args_int_list(const char *option, const char *text, int32_t *values, int max_count, int *count);

/* The subcommands parse with getopt_long(argc, argv, ":h", options, NULL)
 * and opterr = 0; getopt_long's '?' or ':' goes here, with optind and optopt
 * as it left them. Prints "flashdecode <command>: <option>: why" (an unknown,
 * ambiguous or valueless option, a missing value) and where the options are
 * (flashdecode <command> --help) to stderr; returns -1. */
int args_option_error(const char *command, int c, char *const *argv, int argind, int optopt_value,
                      const struct option *options);

/* When --num-splits N (N > 0) did not become N splits in `plan` (the library
 * clamps it to the chunks kv_capacity holds), says so on stderr. */
void args_report_splits(const char *command, int requested, const fd_plan *plan);

#endif /* FD_CLI_ARGS_H */
