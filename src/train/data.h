/*
 * data.h - training text as token documents, and the batches cut from them.
 *
 * A corpus is split into documents at blank lines ("\n\n", "\r\n\r\n"); each document is
 * tokenized as [BOS] tokens [EOS] and all are concatenated into one id stream (FL_MEM_MISC),
 * doc_off[d] being where document d starts.  Targets never cross a document: the target of a
 * token whose successor is a BOS is -1 (not scored).
 *
 * Batchers (fl_batcher), two modes:
 *   pack    (default) each row is the next ctx tokens of the stream (wrapping at the end: an
 *           epoch), several documents per row; every document start begins a new sequence of
 *           the varlen batch (block-diagonal attention) and positions restart at 0 there.
 *   bucket  one document per sequence (cut to ctx tokens), documents sorted by length and
 *           grouped so a batch holds at most batch*ctx tokens: similar lengths together, no
 *           padding (varlen); batch order shuffled per epoch with the batcher's RNG.
 * A batcher's whole state is (pos, epoch, rng): restoring them replays the same batches.
 * Not thread-safe.
 */
#ifndef FL_TRAIN_DATA_H
#define FL_TRAIN_DATA_H

#include "fitllm.h"
#include "model/tokenizer.h"
#include "train/model.h"
#include "train/rng.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct fl_train_data {
    int32_t *ids;     /* (n_ids) */
    int64_t n_ids;
    int64_t *doc_off; /* (n_docs + 1) */
    int64_t n_docs;
    int32_t bos, eos;
} fl_train_data;

/* Tokenize text into documents.  FL_ERR_INVALID on invalid UTF-8 (message has the offset). */
fl_status fl_train_data_from_text(const fl_tokenizer *tok, const char *text, size_t len, fl_train_data *out);
/* one_doc: the whole text is ONE document (blank lines kept as text): training windows are then
 * plain slices of the running text, as llama.cpp's perplexity reads it. */
fl_status fl_train_data_from_text_ex(const fl_tokenizer *tok, const char *text, size_t len, bool one_doc,
                                     fl_train_data *out);
/* From ready token documents (tests): docs[i] of lens[i] ids each, BOS/EOS not added. */
fl_status fl_train_data_from_ids(const int32_t *const *docs, const int64_t *lens, int64_t n_docs, int32_t bos,
                                 int32_t eos, fl_train_data *out);
/* Move the last `frac` of the documents (at least one) into *held (split for validation). */
fl_status fl_train_data_split(fl_train_data *d, double frac, fl_train_data *held);
void fl_train_data_free(fl_train_data *d);
/* Scored target tokens of the whole stream (what a perplexity over the data averages). */
int64_t fl_train_data_n_scored(const fl_train_data *d);

typedef enum fl_batch_mode { FL_BATCH_PACK = 0, FL_BATCH_BUCKET = 1 } fl_batch_mode;

typedef struct fl_batcher {
    const fl_train_data *d;
    int mode;
    int64_t ctx, batch; /* tokens per row, rows per batch */
    int64_t pos;        /* pack: stream offset; bucket: index into the shuffled batch order */
    int64_t epoch;
    fl_rng rng;
    /* buffers (FL_MEM_MISC) for one batch of up to batch*ctx tokens */
    int32_t *tok, *tgt, *posv, *cu;
    int64_t cap_seq;
    /* bucket mode */
    int64_t *order;     /* documents sorted by length */
    int64_t *bstart;    /* (n_batches + 1) offsets into order */
    int64_t *perm;      /* (n_batches) batch order of the current epoch */
    int64_t n_batches;
} fl_batcher;

fl_status fl_batcher_init(fl_batcher *b, const fl_train_data *d, int mode, int64_t ctx, int64_t batch, uint64_t seed);
void fl_batcher_deinit(fl_batcher *b);
/* Next batch (arrays valid until the next call).  Never fails for a non-empty corpus. */
void fl_batcher_next(fl_batcher *b, fl_train_batch *out);
/* Count of scored targets of a batch. */
int64_t fl_batch_n_scored(const fl_train_batch *b);

/* Mean loss over a whole dataset in packed rows of ctx tokens, `batch` rows per forward, in
 * order without wrapping (max_tokens > 0 caps the tokens read).  exp(*mean_loss) = perplexity. */
fl_status fl_train_eval(fl_train_model *m, const fl_train_data *d, int64_t ctx, int64_t batch, int64_t max_tokens,
                        double *mean_loss, int64_t *n_scored);

/* Unigram baseline: token frequencies of train (add-one smoothing over n_vocab), mean
 * -log p over the scored targets of held (the first max_tokens inputs when > 0, as
 * fl_train_eval reads them). */
double fl_train_unigram_loss(const fl_train_data *train, const fl_train_data *held, int32_t n_vocab, int64_t max_tokens);

#endif
