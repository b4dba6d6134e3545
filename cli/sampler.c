/*
 * sampler.c — greedy, multinomial and top-p sampling over the logits.
 */
#include <math.h>
#include <stdlib.h>

#include "sampler.h"

int sampler_init(sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed) {
  s->vocab_size = vocab_size;
  s->temperature = temperature;
  s->top_p = top_p;
  s->rng_state = seed != 0 ? seed : 0x9E3779B97F4A7C15ull; /* xorshift must not start at 0 */
  s->candidates = malloc((size_t)vocab_size * sizeof(sampler_candidate));
  return s->candidates ? 0 : -1;
}

void sampler_free(sampler *s) {
  free(s->candidates);
  s->candidates = NULL;
}

/* xorshift64* (Marsaglia; Vigna's multiplier): 32 random bits. */
static uint32_t next_u32(uint64_t *state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Uniform in [0, 1). */
static float next_unit(uint64_t *state) { return (float)(next_u32(state) >> 8) / 16777216.0f; }

int sampler_argmax(const float *values, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (values[i] > values[best]) best = i;
  return best;
}

/* In-place softmax. */
static void softmax(float *x, int n) {
  float max = x[sampler_argmax(x, n)];
  float sum = 0.0f;
  for (int i = 0; i < n; i++) {
    x[i] = expf(x[i] - max);
    sum += x[i];
  }
  for (int i = 0; i < n; i++) x[i] /= sum;
}

/* Index drawn from probs by the uniform number u. */
static int sample_multinomial(const float *probs, int n, float u) {
  float cdf = 0.0f;
  for (int i = 0; i < n; i++) {
    cdf += probs[i];
    if (u < cdf) return i;
  }
  return n - 1; /* rounding left cdf a little below 1 */
}

static int by_prob_descending(const void *a, const void *b) {
  float pa = ((const sampler_candidate *)a)->prob, pb = ((const sampler_candidate *)b)->prob;
  return (pa < pb) - (pa > pb);
}

/* Nucleus sampling: the smallest set of most probable tokens whose mass
 * exceeds top_p, renormalised. */
static int sample_top_p(const float *probs, int n, float top_p, sampler_candidate *cand, float u) {
  /* Tokens below (1 - top_p) / (n - 1) cannot be in the nucleus: drop them
   * before sorting. */
  const float cutoff = (1.0f - top_p) / (float)(n - 1);
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (probs[i] >= cutoff) {
      cand[m].prob = probs[i];
      cand[m].id = i;
      m++;
    }
  }
  if (m == 0) return sampler_argmax(probs, n); /* a tiny top_p: the most probable token */
  qsort(cand, (size_t)m, sizeof *cand, by_prob_descending);
  float mass = 0.0f;
  int last = m - 1;
  for (int i = 0; i < m; i++) {
    mass += cand[i].prob;
    if (mass > top_p) {
      last = i;
      break;
    }
  }
  float r = u * mass;
  float cdf = 0.0f;
  for (int i = 0; i <= last; i++) {
    cdf += cand[i].prob;
    if (r < cdf) return cand[i].id;
  }
  return cand[last].id;
}

int sampler_sample(sampler *s, float *logits) {
  if (s->temperature == 0.0f) return sampler_argmax(logits, s->vocab_size);
  for (int i = 0; i < s->vocab_size; i++) logits[i] /= s->temperature;
  softmax(logits, s->vocab_size);
  float u = next_unit(&s->rng_state);
  if (s->top_p > 0.0f && s->top_p < 1.0f)
    return sample_top_p(logits, s->vocab_size, s->top_p, s->candidates, u);
  return sample_multinomial(logits, s->vocab_size, u);
}
