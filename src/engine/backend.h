/*
 * backend.h - what the engine needs from a model + KV cache + tokenizer (internal).
 *
 * fl_engine_new() builds the real backend (engine_model.c: the llama forward over the paged or
 * contiguous KV cache, the GGUF tokenizer).  Tests build fakes (a deterministic toy model that
 * hashes each sequence's cached tokens) and run the same engine over them with
 * fl_engine_new_backend(), so batching, chunking, preemption and streaming are checked
 * independently of the numerics.
 *
 * Ownership: the engine takes the backend (it calls free(ctx) in fl_engine_free, also when
 * fl_engine_new_backend fails).  All callbacks run on the engine's driver thread under its
 * mutex, except forward(), which runs without the mutex (one forward at a time).
 */
#ifndef FL_ENGINE_BACKEND_H
#define FL_ENGINE_BACKEND_H

#include "engine/scheduler.h"
#include "model/batch.h"

typedef struct fl_backend_kv_stats {
    int64_t blocks_total, blocks_used, blocks_free, blocks_cached;
    int64_t slots_allocated, tokens_live; /* token slots in used blocks / filled slots */
    int64_t evictions, bytes_total;
} fl_backend_kv_stats;

typedef struct fl_engine_backend {
    void *ctx;
    int32_t n_vocab;
    int32_t n_embd;           /* the final hidden state's length (embeddings; 0: the backend has none) */
    int32_t n_ctx;            /* max tokens per sequence */
    int32_t block_size;       /* tokens per KV block (contiguous: n_ctx) */
    int64_t n_blocks;         /* allocatable blocks in the pool */
    fl_sched_kv kv;           /* block accounting for the scheduler; kv.ctx == ctx */
    /* One step: logits [rows][n_vocab] for the tokens flagged in b->logits, in batch order (and
     * the final hidden states of those flagged in b->hidden into b->hidden_out).
     * The scheduler has reserved room for every token, so FL_NO_KV_SPACE means a bug. */
    fl_status (*forward)(void *ctx, const fl_batch *b, float *logits);
    /* After forward and before the next schedule (release per-step promises). May be NULL. */
    void (*step_done)(void *ctx);
    bool (*is_eog)(void *ctx, int32_t token);
    /* Text of one generated token; returns its length (<= cap) or < 0. */
    int32_t (*piece)(void *ctx, int32_t token, char *buf, int32_t cap);
    /* The same with special tokens as their own text (fl_engine_token_text); NULL: piece. */
    int32_t (*token_text)(void *ctx, int32_t token, char *buf, int32_t cap);
    fl_status (*tokenize)(void *ctx, const char *text, size_t len, int add_special, int32_t *out, int64_t cap,
                          int64_t *n_out);  /* may be NULL */
    int64_t (*detokenize)(void *ctx, const int32_t *ids, int64_t n, char *buf, int64_t cap); /* may be NULL */
    /* Speculative decoding with a draft model (NULL: none; the engine then looks up n-grams):
     * draft_add queues a decoding request for at most k draft tokens (under the engine mutex;
     * false: no room, it gets none), draft_run drafts them all into r->draft / r->n_draft,
     * without the mutex (the requests are the driver's: nothing else changes their tokens). */
    bool (*draft_add)(void *ctx, fl_request *r, int32_t k);
    void (*draft_run)(void *ctx);
    /* Adapters loaded at run time (NULL: none): lora_open opens path within a slot's reservation
     * (file I/O: called without the engine mutex), lora_put puts h (NULL: none) in slot k and gives
     * back what was there (the mutex held; no batch in flight applies slot k), lora_close frees one. */
    fl_status (*lora_open)(void *ctx, const char *path, float scale, void **h);
    fl_status (*lora_put)(void *ctx, int32_t k, void *h, void **old);
    void (*lora_close)(void *ctx, void *h);
    /* The vocabulary's special tokens fl_engine_special_token names (-1: none); may be NULL */
    int32_t (*special)(void *ctx, fl_special_token which);
    void (*kv_stats)(void *ctx, fl_backend_kv_stats *st);
    void (*free)(void *ctx);
    const char *name;          /* model name (borrowed from ctx) */
    const char *chat_template; /* or NULL */
} fl_engine_backend;

/* Engine over an explicit backend (tests, and fl_engine_new itself).  Takes ownership of be. */
fl_status fl_engine_new_backend(const fl_engine_params *p, const fl_engine_backend *be, fl_engine **out);

#endif
