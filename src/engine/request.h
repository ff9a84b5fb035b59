/*
 * request.h - one generation request (one sample of it) and its state machine.
 *
 *   WAITING --admit--> RUNNING --finish--> FINISHED
 *                        |   ^
 *                 preempt|   |readmit (recompute from scratch, or swap its KV back in)
 *                        v   |
 *                      PREEMPTED
 *
 * Token bookkeeping (the vLLM v1 scheme): `tokens` holds the prompt followed by every generated
 * token; `n_computed` is how many of them have their K/V in the cache.  A step schedules some of
 * tokens[n_computed .. n_tokens) (a prefill chunk, or the single last sampled token of a decode);
 * when a step brings n_computed up to n_tokens the logits of the last token are sampled and the
 * new token is appended.  Preemption by recompute resets n_computed to 0 (the generated tokens
 * are kept and recomputed as if they were prompt); preemption by swap keeps n_computed and the
 * KV in the secondary tier.
 *
 * Text and stop strings (fl_stop_*): generated tokens are turned into text piece by piece; text
 * that could be the beginning of a stop string (or an incomplete UTF-8 sequence) is held back
 * until it is decided, so a stop string split across tokens is still found and never streamed.
 *
 * Ownership: a request owns its token array, stop strings, text and logprob buffers (FL_MEM_MISC),
 * and its output constraints (FL_MEM_GUIDE: the engine's guide_mem budget).
 * Not thread-safe: the engine guards requests with its mutex.
 */
#ifndef FL_REQUEST_H
#define FL_REQUEST_H

#include "fitllm.h"
#include "engine/json_fsm.h"
#include <stdbool.h>

/* Incremental text + stop-string matcher. */
typedef struct fl_stop_matcher {
    char *stop[FL_MAX_STOP_STRINGS]; /* owned copies; n_stop of them */
    int32_t n_stop;
    int32_t max_stop_len;
    char *text;        /* all generated text so far (NUL-terminated) */
    int64_t len, cap;  /* bytes in text, capacity */
    int64_t emitted;   /* bytes of text already released to the caller */
    bool stopped;      /* a stop string was found; text is cut before it (after it with include) */
    int32_t which;     /* stopped: the one found (index into stop) */
    bool include;      /* vLLM's include_stop_str_in_output: the stop string stays in the text */
} fl_stop_matcher;

/* Copies the NULL-terminated list stop[] (up to FL_MAX_STOP_STRINGS, empty strings ignored).
 * FL_ERR_NOMEM on allocation failure. */
fl_status fl_stop_init(fl_stop_matcher *m, const char *const *stop);
void fl_stop_deinit(fl_stop_matcher *m);
/* Append one piece of text.  Returns true when a stop string is now complete (the text is then
 * truncated right before the stop string, or right after it with include, and nothing after
 * that is ever released). */
fl_status fl_stop_push(fl_stop_matcher *m, const char *piece, int64_t n, bool *stopped);
/* Text that is safe to release now: [*start, *start + *n) of m->text.  With final = true
 * (generation ended) everything left is released.  Marks it as emitted. */
void fl_stop_release(fl_stop_matcher *m, bool final, int64_t *start, int64_t *n);

typedef struct fl_request fl_request;
struct fl_request {
    int64_t id;                 /* engine-wide request id (shared by the n samples) */
    int32_t sample;             /* sample index 0..n-1 */
    int64_t arrival;            /* monotonically increasing admission order key (FCFS) */
    int32_t priority;           /* FL_SCHED_PRIORITY: lower first, before arrival */
    int32_t lora_on;            /* 1: lora_mix applies (the engine set it from lora or lora_scales) */
    float lora_mix[FL_ENGINE_MAX_LORAS]; /* the scale of each adapter for this request */
    fl_request_state state;
    fl_finish_reason finish;

    int32_t *tokens;            /* [cap] prompt then generated tokens */
    int32_t n_prompt, n_tokens, cap;
    int32_t n_computed;         /* tokens whose K/V is in the cache (or swapped out) */
    int32_t n_cached_prompt;    /* prompt tokens served by the prefix cache at first admission */
    int32_t max_tokens;
    int32_t ignore_eos;
    int32_t special_text; /* fl_request_params.special_text */
    int32_t min_tokens;
    int32_t stop_ids[FL_MAX_STOP_TOKEN_IDS], n_stop_ids;
    uint64_t *allowed;          /* allowed_token_ids as a bitmask of allowed_words words (the engine's), or NULL */
    int32_t allowed_words;
    int32_t *bad;               /* bad_words: n_bad sequences, each its length then its tokens (the engine's), or NULL */
    int32_t n_bad, bad_ints;
    uint64_t cache_salt;
    fl_sampling_params sampling;
    uint64_t rng;               /* per-request RNG state (seeded from sampling.seed + sample) */
    void *sampler;              /* sampler state owned by the engine backend (may be NULL) */
    bool logprobs;              /* report log-probabilities (fl_request_params.logprobs / top_logprobs) */
    int32_t n_top;              /* alternatives per generated token, 0..FL_MAX_TOP_LOGPROBS */
    fl_token_logprob *lp;       /* [max_tokens][1 + n_top] per generated token: itself, then the n_top
                                 * most likely at its position (allocated with the request, as tokens) */
    fl_pooling pooling;         /* an embedding request: its prompt pooled into embd, nothing generated */
    float *embd;                /* [n_embd] the pooled sum / vector (the engine's, FL_MEM_MISC), or NULL */
    int32_t n_embd, n_pooled;   /* its length; prompt positions pooled so far (in order; kept over preemption) */
    bool json;                  /* output constrained to one JSON object or schema value (json_fsm.h) */
    struct fl_json_schema *schema; /* the request's compiled json_schema (owned), or NULL */
    fl_json_fsm *json_fsm;      /* json: the bytes generated so far (allocated with the request: ~4 KiB,
                                 * only for JSON requests; GUIDE) */
    struct fl_regex_guide *regex; /* output constrained to a match of fl_request_params.regex (owned), or NULL */
    struct fl_grammar_guide *grammar; /* output constrained to a sentence of fl_request_params.grammar (owned), or NULL */
    struct fl_triggers *triggers; /* a lazy grammar's (owned), or NULL */
    bool lazy;                  /* a lazy grammar not yet triggered: the output is free */
    bool lazy_repeat;           /* and free again where its sentence ends (fl_request_params.lazy_repeat) */
    char *ltext;                /* then the output so far (GUIDE), ltext_len of ltext_cap bytes */
    size_t ltext_len, ltext_cap;
    bool prompt_logprobs;       /* prompt positions get logits rows too (sample 0 only) */
    fl_token_logprob *plp;      /* [n_prompt - 1][1 + n_top]: prompt token j + 1 given tokens 0..j */
    int32_t *plp_rank;          /* [n_prompt - 1]: that token's rank in the vocabulary (1: the most likely) */
    int32_t n_plp;              /* prompt positions 0 .. n_plp - 1 recorded (in order; kept over preemption) */
    int32_t n_plp_sent;         /* of those, handed out by poll (as they come: a step makes at most
                                 * max_seqs records) */

    char error[192];            /* why it finished with FL_FINISH_ERROR, where known ("" else) */
    int32_t stop_token;         /* FL_FINISH_STOP by one of stop_ids: that token; else -1 */

    fl_stop_matcher stop;
    bool swapped;               /* PREEMPTED with its KV in the swap tier */
    bool cancel;                /* cancellation requested */
    bool kv_live;               /* holds a KV sequence (blocks or swap slots) */
    bool done_polled;           /* its final event was returned by poll */
    fl_request *fork_parent;    /* n > 1: sample 0 whose prompt KV this sample forks (or NULL) */
    int64_t kv_seq;             /* sequence handle of the KV side (meaning up to the adapter) */
    int32_t kv_tokens;          /* tokens the KV side reserved room for (adapter bookkeeping) */
    bool in_sched;              /* queued or running in the scheduler (the engine may not free it) */
    bool padding;               /* static mode: finished, kept as a padding row of its batch */

    /* streaming: produced but not yet polled */
    int32_t n_streamed;         /* generated tokens already handed out by poll */
    int64_t text_pending_start, text_pending_len; /* in stop.text */
    bool event_pending;

    /* timing (seconds, engine clock) */
    double t_arrival, t_first_token, t_last_token, t_finish;
    int32_t n_preempted;
    /* speculative decoding: tokens proposed to follow the last one (the engine's n-gram lookup),
     * verified in the next step's forward; those that the sampler would have picked are kept */
    int32_t draft[FL_SPEC_MAX], n_draft;
    int32_t spec_max, spec_min; /* this request's draft tokens per step (0: none) and shortest draft */
    float spec_p_min;           /* its draft model threshold */
};

/* A new WAITING request with a copy of p's prompt and stop strings (capacity for the whole
 * generation).  FL_ERR_INVALID for an empty prompt or max_tokens < 1, FL_ERR_NOMEM. */
fl_status fl_request_new(const fl_request_params *p, int64_t id, int32_t sample, int64_t arrival,
                         fl_request **out);
void fl_request_free(fl_request *r);
static inline int32_t fl_request_n_generated(const fl_request *r) { return r->n_tokens - r->n_prompt; }
/* Tokens still to compute before the next sample (>= 1 for any unfinished request). */
static inline int32_t fl_request_n_uncomputed(const fl_request *r) { return r->n_tokens - r->n_computed; }
/* Append a sampled token (capacity is guaranteed by max_tokens). */
void fl_request_append(fl_request *r, int32_t token);
/* Prompt positions still waiting for their logprob record (prompt_logprobs). */
static inline bool fl_request_plp_pending(const fl_request *r) { return r->prompt_logprobs && r->n_plp < r->n_prompt - 1; }

const char *fl_request_state_name(fl_request_state s);
const char *fl_finish_reason_name(fl_finish_reason f);

#endif
