/* Flat batch checks (see batch.h). */
#include "model/batch.h"
#include "core/status.h"

int32_t fl_batch_n_logits(const fl_batch *b) {
    if (!b->logits) return b->n_tokens > 0 ? 1 : 0;
    int32_t n = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) n += b->logits[i] != 0;
    return n;
}

fl_status fl_batch_validate(const fl_batch *b, int32_t n_vocab) {
    if (b->n_tokens < 1 || !b->tokens || !b->pos || !b->seq_id)
        return fl_set_error(FL_ERR_INVALID, "%s: empty batch or missing arrays", __func__);
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= n_vocab)
            return fl_set_error(FL_ERR_INVALID, "%s: token %d: id %d outside the vocabulary [0, %d)", __func__, i,
                                b->tokens[i], n_vocab);
        if (b->pos[i] < 0 || b->seq_id[i] < 0)
            return fl_set_error(FL_ERR_INVALID, "%s: token %d: negative position %d or sequence %d", __func__, i,
                                b->pos[i], b->seq_id[i]);
        if (i > 0 && b->seq_id[i] == b->seq_id[i - 1] && b->pos[i] <= b->pos[i - 1])
            return fl_set_error(FL_ERR_INVALID, "%s: token %d: position %d does not follow %d in sequence %d",
                                __func__, i, b->pos[i], b->pos[i - 1], b->seq_id[i]);
        if (i > 0 && b->seq_id[i] != b->seq_id[i - 1])
            for (int32_t j = 0; j < i - 1; j++)
                if (b->seq_id[j] == b->seq_id[i])
                    return fl_set_error(FL_ERR_INVALID, "%s: token %d: sequence %d is not contiguous in the batch",
                                        __func__, i, b->seq_id[i]);
    }
    return FL_OK;
}
