/*
 * replay_main.c — runs fuzz_api.c's LLVMFuzzerTestOneInput over files and
 * directories of inputs (the committed corpus, or a crash libFuzzer saved),
 * without libFuzzer: `fuzz_replay tests/fuzz/corpus [more files or dirs]`.
 * Exits 0 when every input ran (a failed check aborts).
 *
 * The target's contract is the libFuzzer build's: no GPU (the CUDA backend
 * there is src/cuda_stub.c). Inputs that pick the CUDA or automatic backend
 * hand it host buffers and expect a refusal, which only holds without a
 * device: main hides every GPU (CUDA_VISIBLE_DEVICES=-1) before the first
 * CUDA call, so a CUDA build on a GPU machine replays what CI replays.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  uint8_t *buf = NULL;
  size_t size = 0, cap = 0;
  for (;;) {
    if (size == cap) {
      cap = cap ? 2 * cap : 4096;
      uint8_t *grown = realloc(buf, cap);
      if (!grown) {
        free(buf);
        fclose(f);
        return -1;
      }
      buf = grown;
    }
    const size_t got = fread(buf + size, 1, cap - size, f);
    if (got == 0) break;
    size += got;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, size);
  free(buf);
  return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    (*count)++;
    return run_file(path);
  }
  DIR *dir = opendir(path);
  if (!dir) {
    perror(path);
    return -1;
  }
  char **names = NULL;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char **grown = realloc(names, (n + 1) * sizeof *names);
    if (!grown) break;
    names = grown;
    const size_t len = strlen(path) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n]) break;
    snprintf(names[n], len, "%s/%s", path, e->d_name);
    n++;
  }
  closedir(dir);
  qsort(names, n, sizeof *names, cmp); /* a fixed order */
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    if (run_path(names[i], count)) rc = -1;
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <input file or directory>...\n", argv[0]);
    return 2;
  }
  if (setenv("CUDA_VISIBLE_DEVICES", "-1", 1) != 0) {
    perror("setenv CUDA_VISIBLE_DEVICES");
    return 2;
  }
  int count = 0, rc = 0;
  for (int i = 1; i < argc; i++)
    if (run_path(argv[i], &count)) rc = 1;
  printf("fuzz_replay: %d inputs run\n", count);
  return rc;
}
