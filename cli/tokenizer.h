/*
 * tokenizer.h — the byte-pair tokenizer of llama2.c's tokenizer.bin format
 * (the bundled tok512.bin): encode text to token ids, decode ids to text.
 */
#ifndef FD_CLI_TOKENIZER_H
#define FD_CLI_TOKENIZER_H

#include <stddef.h>

#define TOKEN_BOS 1 /* beginning of sequence; generation stops when it is produced */
#define TOKEN_EOS 2

typedef struct tokenizer_entry {
  const char *text; /* points into vocab */
  int id;
} tokenizer_entry;

typedef struct tokenizer {
  int vocab_size;
  int max_token_length;      /* longest piece, bytes */
  char **vocab;              /* [vocab_size] NUL-terminated pieces */
  float *scores;             /* [vocab_size] merge priority, higher first */
  tokenizer_entry *sorted;   /* [vocab_size] pieces sorted by text, for lookups */
  char byte_pieces[256][2];  /* one-byte strings for <0xNN> tokens */
} tokenizer;

/* Reads vocab_size records. Returns 0, or -1 with a message. */
int tokenizer_load(tokenizer *t, const char *path, int vocab_size, char *msg, size_t msg_size);
void tokenizer_free(tokenizer *t);

/* Id of a piece, -1 when it is not in the vocabulary. */
int tokenizer_lookup(const tokenizer *t, const char *text);

/* Text to ids as SentencePiece (and run.c) does: BOS first when bos, a
 * dummy-prefix space before non-empty text, one piece per UTF-8 code point
 * (bytes as <0xNN> when the code point is not a piece), then merging the
 * adjacent pair whose merge has the highest score until none is left; EOS
 * last when eos. tokens must hold strlen(text) + 3 ids. Returns 0, or -1 when
 * out of memory. */
int tokenizer_encode(const tokenizer *t, const char *text, int bos, int eos,
                     int *tokens, /* [strlen(text) + 3] */
                     int *n_tokens);

/* The text of `token` following `prev_token`: a leading space is dropped
 * after BOS, and <0xNN> pieces become the byte NN. */
const char *tokenizer_decode(const tokenizer *t, int prev_token, int token);

/* 1 when a piece is worth printing: not empty and not a lone ASCII control
 * byte (lone bytes >= 0x80 pass: they are parts of UTF-8 characters). */
int tokenizer_printable(const char *piece);

#endif /* FD_CLI_TOKENIZER_H */
