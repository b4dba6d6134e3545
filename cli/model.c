/*
 * model.c — the Llama-2 forward pass of llama2.c's run.c, written out plainly
 * in float32: RMSNorm (eps 1e-5), RoPE on adjacent pairs, grouped-query
 * attention (delegated to the caller), SwiGLU FFN, shared classifier.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define HEADER_INTS 7

static int fail(char *msg, size_t msg_size, const char *what, const char *path) {
  snprintf(msg, msg_size, "%s: %s", path, what);
  return -1;
}

int model_load(model *m, const char *path, char *msg, size_t msg_size) {
  memset(m, 0, sizeof *m);
  FILE *f = fopen(path, "rb");
  if (!f) return fail(msg, msg_size, "cannot open the model file", path);
  int32_t header[HEADER_INTS];
  if (fread(header, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS) {
    fclose(f);
    return fail(msg, msg_size, "too short for a llama2.c header", path);
  }
  model_config *c = &m->config;
  c->dim = header[0];
  c->hidden_dim = header[1];
  c->n_layers = header[2];
  c->n_heads = header[3];
  c->n_kv_heads = header[4];
  int shared_classifier = header[5] > 0; /* llama2.c: a negative vocab_size means a separate one */
  c->vocab_size = header[5] == INT_MIN ? 0 : abs(header[5]); /* 0: refused below */
  c->seq_len = header[6];
  if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 ||
      c->n_kv_heads <= 0 || c->vocab_size <= 0 || c->seq_len <= 0 || c->dim % c->n_heads != 0 ||
      c->n_heads % c->n_kv_heads != 0 || (c->dim / c->n_heads) % 2 != 0) {
    fclose(f);
    return fail(msg, msg_size, "the header does not describe a llama2.c model", path);
  }
  c->head_size = c->dim / c->n_heads;
  c->kv_dim = c->n_kv_heads * c->head_size;

  /* Floats the tensors take, in file order. */
  const size_t L = (size_t)c->n_layers, D = (size_t)c->dim, H = (size_t)c->hidden_dim,
               KV = (size_t)c->kv_dim, V = (size_t)c->vocab_size;
  size_t freq_cis = (size_t)c->seq_len * (size_t)c->head_size; /* legacy real + imag tables */
  size_t need = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D +
                D + freq_cis + (shared_classifier ? 0 : V * D);
  float *data = malloc(need * sizeof(float));
  if (!data) {
    fclose(f);
    return fail(msg, msg_size, "out of memory", path);
  }
  size_t got = fread(data, sizeof(float), need, f);
  fclose(f);
  if (got != need) {
    free(data);
    return fail(msg, msg_size, "shorter than its header says", path);
  }

  model_weights *w = &m->weights;
  const float *p = data;
  w->token_embedding = p; p += V * D;
  w->rms_att = p;         p += L * D;
  w->wq = p;              p += L * D * D;
  w->wk = p;              p += L * KV * D;
  w->wv = p;              p += L * KV * D;
  w->wo = p;              p += L * D * D;
  w->rms_ffn = p;         p += L * D;
  w->w1 = p;              p += L * H * D;
  w->w2 = p;              p += L * D * H;
  w->w3 = p;              p += L * H * D;
  w->rms_final = p;       p += D;
  p += freq_cis; /* RoPE is computed on the fly */
  w->classifier = shared_classifier ? w->token_embedding : p;
  m->data = data;
  return 0;
}

void model_free(model *m) {
  free(m->data);
  memset(m, 0, sizeof *m);
}

int model_state_init(model_state *s, const model_config *c) {
  memset(s, 0, sizeof *s);
  s->x = calloc((size_t)c->dim, sizeof(float));
  s->xb = calloc((size_t)c->dim, sizeof(float));
  s->xb2 = calloc((size_t)c->dim, sizeof(float));
  s->hb = calloc((size_t)c->hidden_dim, sizeof(float));
  s->hb2 = calloc((size_t)c->hidden_dim, sizeof(float));
  s->q = calloc((size_t)c->dim, sizeof(float));
  s->k = calloc((size_t)c->kv_dim, sizeof(float));
  s->v = calloc((size_t)c->kv_dim, sizeof(float));
  s->att = calloc((size_t)c->dim, sizeof(float));
  s->logits = calloc((size_t)c->vocab_size, sizeof(float));
  if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->k || !s->v || !s->att ||
      !s->logits) {
    model_state_free(s);
    return -1;
  }
  return 0;
}

void model_state_free(model_state *s) {
  free(s->x);
  free(s->xb);
  free(s->xb2);
  free(s->hb);
  free(s->hb2);
  free(s->q);
  free(s->k);
  free(s->v);
  free(s->att);
  free(s->logits);
  memset(s, 0, sizeof *s);
}

/* out = weight * x / rms(x), eps 1e-5. */
static void rmsnorm(float *out,          /* [n] */
                    const float *x,      /* [n] */
                    const float *weight, /* [n] */
                    int n) {
  float ss = 0.0f;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  ss = ss / (float)n + 1e-5f;
  ss = 1.0f / sqrtf(ss);
  for (int i = 0; i < n; i++) out[i] = weight[i] * (ss * x[i]);
}

/* out = w x. */
static void matmul(float *out,     /* [rows] */
                   const float *x, /* [cols] */
                   const float *w, /* [rows][cols] */
                   int rows, int cols) {
  for (int i = 0; i < rows; i++) {
    const float *row = w + (size_t)i * cols;
    float sum = 0.0f;
    for (int j = 0; j < cols; j++) sum += row[j] * x[j];
    out[i] = sum;
  }
}

/* Rotates adjacent pairs (v[2i], v[2i+1]) of every head by pos * theta_i,
 * theta_i = 10000^(-2i / head_size). */
static void rope(float *v, /* [n_heads][head_size] */
                 int n_heads, int head_size, int pos) {
  for (int h = 0; h < n_heads; h++) {
    float *head = v + (size_t)h * head_size;
    for (int i = 0; i < head_size; i += 2) {
      float freq = 1.0f / powf(10000.0f, (float)i / (float)head_size);
      float angle = (float)pos * freq;
      float c = cosf(angle), s = sinf(angle);
      float a = head[i], b = head[i + 1];
      head[i] = a * c - b * s;
      head[i + 1] = a * s + b * c;
    }
  }
}

fd_status model_forward(const model *m, model_state *s, int token, int pos,
                        model_attend_fn attend, void *attend_ctx, fd_error *err) {
  const model_config *c = &m->config;
  const model_weights *w = &m->weights;
  const int dim = c->dim, hidden = c->hidden_dim, kv_dim = c->kv_dim;

  memcpy(s->x, w->token_embedding + (size_t)token * dim, (size_t)dim * sizeof(float));

  for (int l = 0; l < c->n_layers; l++) {
    /* attention block */
    rmsnorm(s->xb, s->x, w->rms_att + (size_t)l * dim, dim);
    matmul(s->q, s->xb, w->wq + (size_t)l * dim * dim, dim, dim);
    matmul(s->k, s->xb, w->wk + (size_t)l * kv_dim * dim, kv_dim, dim);
    matmul(s->v, s->xb, w->wv + (size_t)l * kv_dim * dim, kv_dim, dim);
    rope(s->q, c->n_heads, c->head_size, pos);
    rope(s->k, c->n_kv_heads, c->head_size, pos);
    fd_status st = attend(attend_ctx, l, pos, s->q, s->k, s->v, s->att, err);
    if (st != FD_STATUS_OK) return st;
    matmul(s->xb2, s->att, w->wo + (size_t)l * dim * dim, dim, dim);
    for (int i = 0; i < dim; i++) s->x[i] += s->xb2[i];

    /* SwiGLU feed-forward block: w2(silu(w1 x) * w3 x) */
    rmsnorm(s->xb, s->x, w->rms_ffn + (size_t)l * dim, dim);
    matmul(s->hb, s->xb, w->w1 + (size_t)l * hidden * dim, hidden, dim);
    matmul(s->hb2, s->xb, w->w3 + (size_t)l * hidden * dim, hidden, dim);
    for (int i = 0; i < hidden; i++) {
      float g = s->hb[i];
      s->hb[i] = g * (1.0f / (1.0f + expf(-g))) * s->hb2[i];
    }
    matmul(s->xb, s->hb, w->w2 + (size_t)l * dim * hidden, dim, hidden);
    for (int i = 0; i < dim; i++) s->x[i] += s->xb[i];
  }

  rmsnorm(s->x, s->x, w->rms_final, dim);
  matmul(s->logits, s->x, w->classifier, c->vocab_size, dim);
  return FD_STATUS_OK;
}
