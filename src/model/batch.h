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
} fl_batch;

#endif
