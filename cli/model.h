/*
 * model.h — a Llama-2 decoder in llama2.c's checkpoint format (the bundled
 * stories260K): loading the weights and one token's forward pass.
 *
 * The model code knows nothing about the KV cache: at every layer the forward
 * pass hands the new q, k and v rows to a caller-supplied attention function,
 * which stores k and v and returns the attention output (the CLI's is the
 * library's decode attention over a paged cache).
 */
#ifndef FD_CLI_MODEL_H
#define FD_CLI_MODEL_H

#include <stddef.h>

#include "flashdecode.h"

typedef struct model_config {
  int dim;          /* model width */
  int hidden_dim;   /* FFN width */
  int n_layers;
  int n_heads;      /* query heads */
  int n_kv_heads;   /* key/value heads (GQA: n_heads is a multiple) */
  int vocab_size;
  int seq_len;      /* most positions */
  int head_size;    /* dim / n_heads */
  int kv_dim;       /* n_kv_heads * head_size */
} model_config;

typedef struct model_weights {
  const float *token_embedding; /* [vocab_size][dim] */
  const float *rms_att;         /* [n_layers][dim] */
  const float *wq;              /* [n_layers][dim][dim]        (row-major [out][in]) */
  const float *wk;              /* [n_layers][kv_dim][dim] */
  const float *wv;              /* [n_layers][kv_dim][dim] */
  const float *wo;              /* [n_layers][dim][dim] */
  const float *rms_ffn;         /* [n_layers][dim] */
  const float *w1;              /* [n_layers][hidden_dim][dim]  gate */
  const float *w2;              /* [n_layers][dim][hidden_dim]  down */
  const float *w3;              /* [n_layers][hidden_dim][dim]  up */
  const float *rms_final;       /* [dim] */
  const float *classifier;      /* [vocab_size][dim] (the embedding when shared) */
} model_weights;

typedef struct model {
  model_config config;
  model_weights weights;
  float *data; /* the whole checkpoint after the header; the weights point into it */
} model;

/* Scratch of one forward pass (one sequence). */
typedef struct model_state {
  float *x;      /* [dim] residual stream */
  float *xb;     /* [dim] normalised input of a block / FFN output */
  float *xb2;    /* [dim] attention block output */
  float *hb;     /* [hidden_dim] gate */
  float *hb2;    /* [hidden_dim] up */
  float *q;      /* [n_heads][head_size] this position's query */
  float *k;      /* [n_kv_heads][head_size] this position's key */
  float *v;      /* [n_kv_heads][head_size] this position's value */
  float *att;    /* [n_heads][head_size] attention output */
  float *logits; /* [vocab_size] */
} model_state;

/* Attention of one layer at position pos: store k, v (the new rows) in the
 * cache, attend q over positions 0..pos, write out. Returns FD_STATUS_OK or
 * fills err. */
typedef fd_status (*model_attend_fn)(void *ctx, int layer, int pos,
                                     const float *q,   /* [n_heads][head_size] */
                                     const float *k,   /* [n_kv_heads][head_size] */
                                     const float *v,   /* [n_kv_heads][head_size] */
                                     float *out,       /* [n_heads][head_size] */
                                     fd_error *err);

/* Reads a llama2.c version-0 checkpoint. Returns 0, or -1 with a message. */
int model_load(model *m, const char *path, char *msg, size_t msg_size);
void model_free(model *m);

/* Returns 0, or -1 when out of memory. */
int model_state_init(model_state *s, const model_config *c);
void model_state_free(model_state *s);

/* One token at position pos; the logits land in s->logits. */
fd_status model_forward(const model *m, model_state *s, int token, int pos,
                        model_attend_fn attend, void *attend_ctx, fd_error *err);

#endif /* FD_CLI_MODEL_H */
