/*
 * sampling.h - next-token choice from a logit vector: greedy, temperature, top-k, top-p, min-p,
 * repetition / frequency / presence penalties, with a seeded RNG per request.
 *
 * Order (llama.cpp's default chain): logit biases -> penalties -> (temp <= 0: argmax) -> top-k -> top-p ->
 * min-p -> temperature -> draw from the softmax.  Penalties look at the last penalty_last_n
 * tokens of the history (-1 = all, 0 = none): a logit l of a token seen c > 0 times becomes
 * (l > 0 ? l / repeat : l * repeat) - c * frequency - presence.
 *
 * RNG: xoshiro256** (Blackman & Vigna), state seeded with splitmix64(seed); uniform floats
 * from the top 24 bits.  The same seed and inputs always give the same tokens.
 *
 * Ownership: fl_sampler_new allocates the sampler and an n_vocab candidate buffer (FL_MEM_MISC);
 * the logits are only read.  A sampler belongs to one request: not thread-safe.
 */
#ifndef FL_SAMPLING_H
#define FL_SAMPLING_H

#include "fitllm.h"
#include <stdint.h>

typedef struct fl_sampler_params {
    float temp;           /* <= 0: greedy */
    int32_t top_k;        /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    float freq_penalty;   /* 0: off */
    float presence_penalty;
    int32_t penalty_last_n; /* window of history for penalties; -1 = all */
    uint64_t seed;
    const fl_logit_bias *bias; /* n_bias (token, bias) pairs added to the logits first; copied by fl_sampler_new */
    int32_t n_bias;
} fl_sampler_params;

typedef struct fl_sampler fl_sampler;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties (window 64), seed 0. */
fl_sampler_params fl_sampler_default_params(void);
/* FL_ERR_INVALID for n_vocab < 1, a NaN / negative parameter that has no meaning, or a bias of a
 * token outside the vocabulary or not finite. */
fl_status fl_sampler_new(const fl_sampler_params *p, int32_t n_vocab, fl_sampler **out);
/* The sampler's own struct (its buffers apart): what the engine-exact plan counts per request. */
size_t fl_sampler_struct_bytes(void);
void fl_sampler_free(fl_sampler *s);
/* Restart the RNG from seed (a new request reusing the sampler). */
void fl_sampler_reseed(fl_sampler *s, uint64_t seed);
/* Choose a token.  history: the request's tokens so far (prompt and generated), may be NULL. */
int32_t fl_sample(fl_sampler *s, const float *logits, int32_t n_vocab, const int32_t *history, int64_t n_history);

/* The model's log-probabilities at one step, log softmax(logits) of the raw logits (before
 * penalties and temperature, as vLLM reports them): *lp_tok = log p(tok), and top[0..k) the k
 * most likely tokens, most likely first (equal logits: lower id first).  0 <= k <= n_vocab. */
void fl_logprobs(const float *logits, int32_t n_vocab, int32_t tok, int32_t k, float *lp_tok, fl_token_logprob *top);
/* tok's rank among the n_vocab logits: 1 + the number of tokens with a larger logit (vLLM's rank;
 * NaN counts as smallest). */
int32_t fl_logit_rank(const float *logits, int32_t n_vocab, int32_t tok);

/* The RNG alone (exposed for tests): next 64 bits / a float in [0, 1). */
uint64_t fl_sampler_rand_u64(fl_sampler *s);
float fl_sampler_rand_float(fl_sampler *s);

#endif
