/*
 * test_tokenizer.c — the CLI's tokenizer (cli/tokenizer.c): byte fallback
 * stays inside the vocabulary (a tokenizer with fewer than 259 pieces has no
 * <0xNN> tokens: bytes become <unk>, never an id past the table), and the
 * bundled tok512.bin encodes text to ids inside its 512 pieces, with the
 * byte fallback <0xFF> = id 258 for a byte no piece covers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "tokenizer.h"

/* Writes a tokenizer.bin of `n` pieces; returns its path (static buffer). */
static const char *write_tokenizer(const char *const *pieces, int n) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/fd_test_tok_%d.bin", (int)getpid());
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  int32_t max_len = 0;
  for (int i = 0; i < n; i++)
    if ((int32_t)strlen(pieces[i]) > max_len) max_len = (int32_t)strlen(pieces[i]);
  fwrite(&max_len, sizeof max_len, 1, f);
  for (int i = 0; i < n; i++) {
    const float score = (float)-i;
    const int32_t len = (int32_t)strlen(pieces[i]);
    fwrite(&score, sizeof score, 1, f);
    fwrite(&len, sizeof len, 1, f);
    fwrite(pieces[i], 1, (size_t)len, f);
  }
  fclose(f);
  return path;
}

static void test_byte_fallback_in_a_tiny_vocabulary(void **state) {
  (void)state;
  const char *const pieces[] = {"<unk>", "<s>", "</s>", "a"};
  const char *path = write_tokenizer(pieces, 4);
  tokenizer t;
  char msg[256];
  assert_int_equal(tokenizer_load(&t, path, 4, msg, sizeof msg), 0);
  remove(path);
  const char *text = "a\xff\xc3\xa9z";
  int tokens[16], n = 0;
  assert_int_equal(tokenizer_encode(&t, text, 1, 1, tokens, &n), 0);
  assert_true(n >= 3);
  for (int i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= t.vocab_size)
      fail_msg("token %d of %d is %d, outside the vocabulary of %d", i, n, tokens[i], t.vocab_size);
  }
  tokenizer_free(&t);
}

static void test_bundled_tokenizer(void **state) {
  (void)state;
  tokenizer t;
  char msg[256];
  if (tokenizer_load(&t, FD_TEST_MODEL_DIR "/tok512.bin", 512, msg, sizeof msg) != 0)
    fail_msg("%s", msg);
  int tokens[64], n = 0;
  assert_int_equal(tokenizer_encode(&t, "Once upon a time\xff", 1, 0, tokens, &n), 0);
  assert_int_equal(tokens[0], TOKEN_BOS);
  for (int i = 0; i < n; i++) assert_true(tokens[i] >= 0 && tokens[i] < 512);
  assert_int_equal(tokens[n - 1], 0xff + 3); /* <0xFF> */
  tokenizer_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_fallback_in_a_tiny_vocabulary),
      cmocka_unit_test(test_bundled_tokenizer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
