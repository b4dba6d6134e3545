/*
 * tokenizer.c — loading, encoding and decoding of llama2.c's tokenizer.bin:
 * int32 max_token_length, then per token: float32 score, int32 length and
 * that many bytes.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static int compare_entries(const void *a, const void *b) {
  return strcmp(((const tokenizer_entry *)a)->text, ((const tokenizer_entry *)b)->text);
}

int tokenizer_load(tokenizer *t, const char *path, int vocab_size, char *msg, size_t msg_size) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < 256; i++) {
    t->byte_pieces[i][0] = (char)i;
    t->byte_pieces[i][1] = '\0';
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(msg, msg_size, "%s: cannot open the tokenizer file", path);
    return -1;
  }
  t->vocab_size = vocab_size;
  t->vocab = calloc((size_t)vocab_size, sizeof(char *));
  t->scores = calloc((size_t)vocab_size, sizeof(float));
  t->sorted = calloc((size_t)vocab_size, sizeof(tokenizer_entry));
  if (!t->vocab || !t->scores || !t->sorted) {
    snprintf(msg, msg_size, "%s: out of memory", path);
    goto fail;
  }
  int32_t max_len;
  if (fread(&max_len, sizeof max_len, 1, f) != 1 || max_len <= 0) {
    snprintf(msg, msg_size, "%s: bad header", path);
    goto fail;
  }
  t->max_token_length = max_len;
  for (int i = 0; i < vocab_size; i++) {
    int32_t len;
    if (fread(&t->scores[i], sizeof(float), 1, f) != 1 || fread(&len, sizeof len, 1, f) != 1 ||
        len < 0 || len > max_len) {
      snprintf(msg, msg_size, "%s: token %d is cut short or malformed", path, i);
      goto fail;
    }
    t->vocab[i] = malloc((size_t)len + 1);
    if (!t->vocab[i]) {
      snprintf(msg, msg_size, "%s: out of memory", path);
      goto fail;
    }
    if (fread(t->vocab[i], 1, (size_t)len, f) != (size_t)len) {
      snprintf(msg, msg_size, "%s: token %d is cut short", path, i);
      goto fail;
    }
    t->vocab[i][len] = '\0';
    t->sorted[i].text = t->vocab[i];
    t->sorted[i].id = i;
  }
  fclose(f);
  qsort(t->sorted, (size_t)vocab_size, sizeof(tokenizer_entry), compare_entries);
  return 0;
fail:
  fclose(f);
  tokenizer_free(t);
  return -1;
}

void tokenizer_free(tokenizer *t) {
  if (t->vocab)
    for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
  free(t->vocab);
  free(t->scores);
  free(t->sorted);
  memset(t, 0, sizeof *t);
}

int tokenizer_lookup(const tokenizer *t, const char *text) {
  tokenizer_entry key = {text, -1};
  const tokenizer_entry *hit =
      bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof(tokenizer_entry), compare_entries);
  return hit ? hit->id : -1;
}

/* Appends the ids of one code point's bytes: its piece, or one <0xNN> per byte. */
static void push_code_point(const tokenizer *t, const char *bytes, int len, int *tokens, int *n) {
  char piece[8];
  memcpy(piece, bytes, (size_t)len);
  piece[len] = '\0';
  int id = tokenizer_lookup(t, piece);
  if (id >= 0) {
    tokens[(*n)++] = id;
    return;
  }
  /* byte fallback: ids 3..258 are <0x00>..<0xFF>; a vocabulary too small to
   * hold them gets <unk> (0) */
  for (int i = 0; i < len; i++) {
    const int b = (unsigned char)bytes[i] + 3;
    tokens[(*n)++] = b < t->vocab_size ? b : 0;
  }
}

int tokenizer_encode(const tokenizer *t, const char *text, int bos, int eos, int *tokens,
                     int *n_tokens) {
  int n = 0;
  if (bos) tokens[n++] = TOKEN_BOS;
  if (text[0] != '\0') push_code_point(t, " ", 1, tokens, &n); /* the dummy prefix */

  for (const char *p = text; *p;) {
    int len = 1; /* a lead byte and up to 3 continuation bytes (10xxxxxx) */
    while (len < 4 && (p[len] & 0xC0) == 0x80) len++;
    push_code_point(t, p, len, tokens, &n);
    p += len;
  }

  /* Merge the best-scoring adjacent pair until no pair is a piece. */
  char *pair = malloc((size_t)t->max_token_length * 2 + 1);
  if (!pair) return -1;
  for (;;) {
    float best_score = 0.0f;
    int best_id = -1, best_at = -1;
    for (int i = 0; i + 1 < n; i++) {
      const char *a = t->vocab[tokens[i]], *b = t->vocab[tokens[i + 1]];
      size_t la = strlen(a), lb = strlen(b);
      memcpy(pair, a, la);
      memcpy(pair + la, b, lb + 1);
      int id = tokenizer_lookup(t, pair);
      if (id >= 0 && (best_at < 0 || t->scores[id] > best_score)) {
        best_score = t->scores[id];
        best_id = id;
        best_at = i;
      }
    }
    if (best_at < 0) break;
    tokens[best_at] = best_id;
    memmove(tokens + best_at + 1, tokens + best_at + 2, (size_t)(n - best_at - 2) * sizeof(int));
    n--;
  }
  free(pair);

  if (eos) tokens[n++] = TOKEN_EOS;
  *n_tokens = n;
  return 0;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

const char *tokenizer_decode(const tokenizer *t, int prev_token, int token) {
  const char *piece = t->vocab[token];
  if (prev_token == TOKEN_BOS && piece[0] == ' ') piece++;
  /* "<0xNN>" is the raw byte NN */
  if (strlen(piece) == 6 && piece[0] == '<' && piece[1] == '0' && piece[2] == 'x' &&
      piece[5] == '>') {
    int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
    if (hi >= 0 && lo >= 0) return t->byte_pieces[hi * 16 + lo];
  }
  return piece;
}

int tokenizer_printable(const char *piece) {
  if (piece[0] == '\0') return 0;
  if (piece[1] == '\0') {
    unsigned char c = (unsigned char)piece[0];
    return isprint(c) || isspace(c) || c >= 0x80; /* bytes of UTF-8 sequences pass */
  }
  return 1;
}
