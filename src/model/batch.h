/*
 * batch.h - the flat batch of one forward step.
 *
 * Any mix of sequences: a prefill of many tokens, single-token decodes, several sequences at
 * once.  Invariant: the tokens of one sequence are contiguous in the batch and in increasing
 * position order (the engine builds batches this way; fl_batch_validate checks it).  No padding.
 */
#ifndef FL_BATCH_H
#define FL_BATCH_H

#include "fitllm.h"
#include <stdint.h>

typedef struct fl_batch {
    int32_t n_tokens;
    const int32_t *tokens;  /* [n_tokens] token ids */
    const int32_t *pos;     /* [n_tokens] position of each token in its sequence */
    const int32_t *seq_id;  /* [n_tokens] sequence of each token */
    const int8_t *logits;   /* [n_tokens] 1 = compute logits for this token; NULL = last token only */
    const int32_t *lora;    /* [n_tokens] the LoRA adapter of each token: 0 none, k the model's adapter k
                             * (fl_model_params.lora_paths[k - 1]); NULL: the model's lora_default */
    const int8_t *hidden;   /* [n_tokens] 1 = write this token's final hidden state (after the output norm)
                             * into hidden_out, rows in batch order; NULL: none */
    float *hidden_out;      /* [rows][n_embd] */
    const float *lora_mix;  /* adapter mixes (llama.cpp's per-request "lora" scales): with it, lora[t] = m
                             * (1..n_lora_mix) applies every adapter a of the model at the scale
                             * lora_mix[(m - 1) * n_loras + a - 1] (0: not at all; alpha / r on top, as
                             * for a loaded scale), and lora[t] = 0 none; NULL: lora[t] names one adapter,
                             * applied at the scale it was loaded with */
    int32_t n_lora_mix;
} fl_batch;

/* Number of logit rows the batch asks for (logits == NULL: 1 when n_tokens > 0). */
int32_t fl_batch_n_logits(const fl_batch *b);
/* FL_OK if the batch is well formed for a vocabulary of n_vocab: n_tokens >= 1, ids in range,
 * pos >= 0, seq_id >= 0, the tokens of one sequence contiguous and in increasing position order.
 * Otherwise FL_ERR_INVALID with a message naming the first bad token. (model/batch.c) */
fl_status fl_batch_validate(const fl_batch *b, int32_t n_vocab);

#endif
