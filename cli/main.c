/*
 * main.c — the flashdecode command-line tool: dispatches to the subcommands
 * generate, bench and check; --version and help.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "flashdecode.h"
#include "gpu.h"

static void print_help(void) {
  printf(
      "flashdecode %s — decode-phase attention by flash decoding (split-KV)\n"
      "\n"
      "usage: flashdecode <command> [options]     (flashdecode <command> --help for its options)\n"
      "\n"
      "commands:\n"
      "  generate   write a story with the bundled stories260K model, its attention\n"
      "             running through the library on a paged KV cache\n"
      "  bench      time one attention problem (µs per call, GB/s, split count, speedup\n"
      "             over --num-splits 1)\n"
      "  check      compare one attention problem with the float64 reference (PASS/FAIL)\n"
      "  help       this text\n"
      "\n"
      "  --version  the version, and whether CUDA is built in and a GPU is present\n"
      "\n"
      "examples:\n"
      "  flashdecode generate --backend cpu --ids\n"
      "  flashdecode generate --prompt \"Once upon a time\" --temperature 0.8 --seed 42\n"
      "  flashdecode bench --batch 1 --num-heads-q 32 --num-heads-kv 8 --head-dim 128 \\\n"
      "                    --kv-len 16384 --dtype bf16 --backend cuda\n"
      "  flashdecode check --kv-len 1000,3000 --batch 4 --page-size 16 --dtype f16\n"
      "  flashdecode check --num-heads-q 64 --num-heads-kv 8 --head-dim 64 --kv-len 5000 \\\n"
      "                    --window-left 127 --sinks           (gpt-oss's sliding layers)\n",
      fd_version());
}

static void print_version(void) {
  char device[256];
  gpu_describe(device, sizeof device);
  printf("flashdecode %s (library %s; CUDA backend: %s; GPU: %s)\n", FD_VERSION_STRING,
         fd_version(), fd_backend_available(FD_BACKEND_CUDA) ? "available" : "unavailable",
         device);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_help();
    return 2;
  }
  const char *command = argv[1];
  if (!strcmp(command, "generate")) {
    /* The executable's own path, to find the bundled model beside it. */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = '\0';
    else snprintf(exe, sizeof exe, "%s", argv[0]);
    return cmd_generate(argc - 1, argv + 1, exe);
  }
  if (!strcmp(command, "bench")) return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(command, "check")) return cmd_check(argc - 1, argv + 1);
  if (!strcmp(command, "help") || !strcmp(command, "--help") || !strcmp(command, "-h")) {
    print_help();
    return 0;
  }
  if (!strcmp(command, "--version") || !strcmp(command, "-V") || !strcmp(command, "version")) {
    print_version();
    return 0;
  }
  fprintf(stderr, "flashdecode: unknown command '%s' (see flashdecode help)\n", command);
  return 2;
}
