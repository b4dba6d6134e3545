/*
 * sampler.h — picks the next token from the logits: greedy (temperature 0),
 * or sampling from softmax(logits / temperature), optionally restricted to
 * the smallest set of tokens whose probability reaches top_p (nucleus).
 * The random numbers come from a seeded xorshift generator, so a seed
 * reproduces a run.
 */
#ifndef FD_CLI_SAMPLER_H
#define FD_CLI_SAMPLER_H

#include <stdint.h>

typedef struct sampler_candidate {
  float prob;
  int id;
} sampler_candidate;

typedef struct sampler {
  int vocab_size;
  float temperature;             /* 0 = greedy */
  float top_p;                   /* in (0, 1) = nucleus sampling; otherwise the full distribution */
  uint64_t rng_state;            /* never 0 */
  sampler_candidate *candidates; /* [vocab_size] scratch for top-p */
} sampler;

/* Returns 0, or -1 when out of memory. */
int sampler_init(sampler *s, int vocab_size, float temperature, float top_p, uint64_t seed);
void sampler_free(sampler *s);

/* The next token. Overwrites logits with probabilities when sampling. */
int sampler_sample(sampler *s, float *logits /* [vocab_size] */);

/* Index of the largest value (the first one on ties). */
int sampler_argmax(const float *values /* [n] */, int n);

#endif /* FD_CLI_SAMPLER_H */
