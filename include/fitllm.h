/*
 * fitllm.h - the public C API of libfitllm.
 *
 * fitllm runs, serves and trains llama-family models in the memory you have, and accounts for
 * every byte.  This header is the only one users include.  It owns:
 *   - status codes (fl_status) and the thread-local last-error message;
 *   - memory categories and the accounting report;
 *   - (later sections) the engine API used by the CLI and the HTTP server.
 *
 * Conventions: functions that can fail because of input, files, memory or the network return
 * fl_status (FL_OK = 0, negative = error, positive = soft outcome); results go through
 * out-parameters.  fl_x_new() returns an owned object or NULL; fl_x_free(NULL) is a no-op.
 */
#ifndef FITLLM_H
#define FITLLM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ---- */
typedef enum fl_status {
    FL_OK = 0,
    FL_NO_KV_SPACE = 1,        /* soft: the KV pool has no room for this step */
    FL_ERR_INVALID = -1,       /* bad argument or input */
    FL_ERR_IO = -2,            /* file system error */
    FL_ERR_NOMEM = -3,         /* allocation failed (system out of memory) */
    FL_ERR_BUDGET = -4,        /* allocation refused: a memory budget would be exceeded */
    FL_ERR_FORMAT = -5,        /* malformed file contents */
    FL_ERR_UNSUPPORTED = -6,   /* valid but not supported (yet) */
    FL_ERR_RANGE = -7,         /* size/count/offset out of range or overflow */
    FL_ERR_INTERNAL = -8,      /* a bug: an invariant failed */
} fl_status;

/* Human-readable name of a status code ("ok", "invalid argument", ...). Never NULL. */
const char *fl_status_str(fl_status st);
/* The message recorded by the last failing call on this thread ("" if none). */
const char *fl_last_error(void);

/* ---- memory accounting ---- */
typedef enum fl_mem_cat {
    FL_MEM_WEIGHTS = 0, /* model weights held in RAM (dequantized / repacked / loaded) */
    FL_MEM_MAPPED,      /* file mappings (mmap of GGUF files) */
    FL_MEM_KV,          /* KV cache blocks */
    FL_MEM_ACT,         /* activations of forward/backward */
    FL_MEM_SCRATCH,     /* per-step scratch arenas, kernel workspaces */
    FL_MEM_GRAD,        /* gradients */
    FL_MEM_OPTIM,       /* optimizer states */
    FL_MEM_COMM,        /* communication buffers */
    FL_MEM_NET,         /* HTTP server buffers */
    FL_MEM_GUIDE,       /* requests' output constraints: compiled grammars, regexes and JSON schemas,
                         * their states, allowed_token_ids and bad_words (the engine's guide_mem) */
    FL_MEM_MISC,        /* everything else (tokenizer, metadata, bookkeeping) */
    FL_MEM_COUNT
} fl_mem_cat;

const char *fl_mem_cat_name(fl_mem_cat cat);
size_t fl_mem_current(fl_mem_cat cat);      /* bytes now */
size_t fl_mem_peak(fl_mem_cat cat);         /* high-water mark since start / last reset */
size_t fl_mem_current_total(void);
size_t fl_mem_peak_total(void);
void fl_mem_reset_peaks(void);              /* peak := current, all categories */
/* Budgets: 0 = unlimited. Allocations that would exceed a budget fail with FL_ERR_BUDGET. */
void fl_mem_set_budget(fl_mem_cat cat, size_t bytes);
void fl_mem_set_budget_total(size_t bytes);
size_t fl_mem_budget(fl_mem_cat cat);
/* Allocations refused so far because they would have passed cat's own budget (not the total's). */
size_t fl_mem_refused(fl_mem_cat cat);
/* Text report (one line per non-empty category + total). */
void fl_mem_report(FILE *out);
/* JSON report {"current":{cat:bytes,...,"total":n},"peak":{...}} written into buf (1024 bytes
 * always suffice); returns the length as snprintf does. */
int fl_mem_report_json(char *buf, size_t n);

/* ---- engine: continuous batching over one model (src/engine) ----
 *
 * An engine owns a model, a KV cache and a scheduler.  Requests are added at any time (from any
 * thread: add/cancel/poll are thread-safe); fl_engine_step() runs one iteration (schedule ->
 * one packed batch -> forward -> sample -> commit) and is called by one driver thread.
 * Generated tokens are read back with fl_engine_poll() as they are produced (streaming).
 */
typedef struct fl_engine fl_engine;

typedef enum fl_kv_layout { FL_KV_PAGED = 0, FL_KV_CONTIGUOUS = 1 } fl_kv_layout;
typedef enum fl_preempt_mode { FL_PREEMPT_RECOMPUTE = 0, FL_PREEMPT_SWAP = 1 } fl_preempt_mode;
/* The order in which requests are admitted, take each step's token budget and are kept when KV
 * runs out: FCFS by arrival, or by fl_request_params.priority (lower first) then arrival, where a
 * waiting request preempts running ones of lower priority to get in (vLLM's priority policy). */
typedef enum fl_sched_policy { FL_SCHED_FCFS = 0, FL_SCHED_PRIORITY = 1 } fl_sched_policy;

typedef struct fl_engine_params {
    const char *model_path;
    int32_t n_threads;          /* 0 = all cores */
    int32_t n_ctx;              /* max tokens per sequence; 0 = model's training context */
    int32_t max_seqs;           /* concurrent running sequences (default 16) */
    int32_t max_batch_tokens;   /* token budget per step (default 512); also the prefill chunk cap */
    int64_t kv_mem;             /* bytes for the KV pool; 0 = derive from mem_total or a default (256 MiB) */
    int64_t mem_total;          /* total budget (kv_mem 0): KV pool sized by the plan, enforced; FL_ERR_BUDGET if it cannot fit */
    int32_t kv_block_size;      /* tokens per KV block (default 16) */
    const char *kv_type;        /* "f32","f16","bf16","fp8_e4m3","fp8_e5m2","q8_0","q4_0" (default f16) */
    const char *weights_type;   /* load-time quantization: NULL, "nf4","fp8","q8_0","q4_0" */
    int32_t prefix_cache;       /* 1 = on (default), 0 = off */
    fl_kv_layout kv_layout;     /* paged (default) or contiguous max-length reservation (baseline) */
    fl_preempt_mode preempt;    /* recompute (default) or swap to swap_path */
    fl_sched_policy sched_policy; /* FCFS (default) or priority */
    const char *swap_path;      /* directory of the swap file for swapped-out KV blocks (default: $TMPDIR or /tmp) */
    int32_t seed;               /* default seed for requests that give none */
    int32_t no_mmap;            /* 1 = read the model file into anonymous memory (huge pages where the
                                 * kernel grants them) instead of mapping it; same MAPPED bytes */
    int32_t no_repack;          /* 1 = keep Q4_0 / Q8_0 matrices as in the file; 0 (default): on AVX2 they are
                                 * rewritten in place in groups of 8 rows for its GEMV (same bytes) */
    const char *const *lora_paths; /* n_loras LoRA adapters applied at run time, unmerged (fitllm train
                                 * --lora's OUT.lora.gguf or llama.cpp adapters; F32/F16/BF16, at most
                                 * 16): each request picks one (fl_request_params.lora) or none */
    const float *lora_scales;   /* their scales (NULL: 1 each) */
    int32_t n_loras;
    int32_t lora_slots;         /* adapter slots after those, empty, for fl_engine_lora_load (vLLM's
                                 * run-time loading); n_loras + lora_slots <= FL_ENGINE_MAX_LORAS.
                                 * Each reserves what an adapter of rank max_lora_rank may take */
    int32_t max_lora_rank;      /* with lora_slots: the largest rank they take (vLLM's; default 16) */
    int32_t max_logprobs;       /* the most alternatives a request may ask with top_logprobs (default
                                 * FL_MAX_TOP_LOGPROBS); -1: no logprobs.  The plan reserves
                                 * 8 x (1 + max_logprobs) + 4 bytes per token of context per sequence */
    int32_t guide_masks;        /* token masks kept for regex- and grammar-constrained requests' states, shared by
                                 * requests with the same pattern or grammar (default 256; 0: none, every mask
                                 * computed, but for a grammar's the last one, reused while the state it
                                 * was computed for comes again); each n_vocab / 8 bytes, allocated with
                                 * the engine */
    int32_t regex_pcre2;        /* 1: guided_regex always runs on PCRE2's matcher; 0 (default): a pattern of
                                 * the common subset (docs/SERVER.md) runs as a grammar, whose masks are kept
                                 * by canonical state and which offers byte tokens */
    int64_t guide_mem;          /* bytes for the output constraints of all queued and running requests
                                 * (FL_MEM_GUIDE: compiled grammars, regexes and JSON schemas, their states,
                                 * allowed_token_ids, bad_words), in the plan and enforced (a process-wide
                                 * budget while the engine lives): a request that does not fit is refused
                                 * (FL_ERR_BUDGET while others hold it, FL_ERR_INVALID when it alone needs
                                 * more), one whose state outgrows it finishes with FL_FINISH_ERROR.
                                 * -1 (default): FL_GUIDE_MEM_DEFAULT, or mem_total / 16 when that is less;
                                 * 0: no constrained requests */
    int64_t net_mem;            /* bytes the host program's server buffers may hold (FL_MEM_NET: request
                                 * bodies, replies, their JSON), in the plan and set as that category's
                                 * budget while the engine lives; 0 (default): none planned, no budget */
    int32_t embeddings;         /* 1: the engine takes embedding requests (fl_request_params.pooling); the
                                 * plan counts their buffers (the step's final hidden states, a pooled
                                 * vector per sequence).  0 (default): they are refused */
    const char *chat_template;  /* chat template text in place of the GGUF's tokenizer.chat_template
                                 * (copied; fl_engine_chat_template returns it); NULL: the file's */
    int32_t spec_tokens;        /* speculative decoding by n-gram lookup (vLLM's method "ngram", llama.cpp's
                                 * lookup decoding): each decoding sequence whose last spec_ngram_max ..
                                 * spec_ngram_min tokens occurred before in its prompt or output drafts up
                                 * to this many of the tokens that followed there, and one forward verifies
                                 * them: a draft token is kept while it is the token the request's own
                                 * sampler picks from that position's logits, so the output is the same as
                                 * without (greedy and seeded alike; the logits are bit for bit a decode
                                 * step's but with no_repack Q8_0 / Q4_0), in fewer steps.  Drafts use what the
                                 * step's token budget, rows and free KV blocks leave.  0 (default): off;
                                 * at most FL_SPEC_MAX; needs the paged KV cache.  The plan counts the
                                 * logits rows: max_seqs x (1 + spec_tokens), at most max_batch_tokens +
                                 * max_seqs.  (fp8 KV: a dropped draft row may have raised its block's
                                 * scale; the kept rows are then a little coarser.) */
    int32_t spec_ngram_min;     /* the shortest n-gram looked up (0: 2) */
    int32_t spec_ngram_max;     /* the longest (0: 4; at most FL_SPEC_MAX) */
    const char *spec_draft_model; /* speculative decoding with a draft model (llama.cpp's -md, vLLM's draft
                                 * model) in place of n-gram lookup: a small GGUF with the same vocabulary
                                 * drafts spec_tokens tokens per sequence greedily, from its own paged KV
                                 * cache (the same block size and type, room for max_seqs whole contexts);
                                 * verified as n-gram drafts are, so the output is the same.  Its weights,
                                 * cache and buffers are in the plan.  NULL (default): none */
    float spec_draft_p_min;     /* with a draft model: a sequence's draft stops at the first token the draft
                                 * model gives less than this probability (llama.cpp's --draft-p-min: an
                                 * unlikely draft is likely dropped, and costs a verified token; default
                                 * 0.75; 0: always spec_tokens) */
    int32_t spec_disable_batch; /* no drafts in a step while more than this many requests run (vLLM's
                                 * disable_by_batch_size: a large batch is compute-bound, and a draft
                                 * that is dropped costs what a decoded token does); 0: always draft */
} fl_engine_params;
#define FL_SPEC_MAX 16
#define FL_ENGINE_MAX_LORAS 16 /* adapters an engine holds (fl_engine_params.n_loras) */
#define FL_GUIDE_MEM_DEFAULT ((int64_t)16 << 20)

void fl_engine_params_default(fl_engine_params *p);

typedef struct fl_sampling_params {
    float temperature;          /* 0 = greedy */
    int32_t top_k;              /* 0 = off */
    float top_p;                /* 1 = off (0, as in a zeroed struct, also = off) */
    float min_p;                /* 0 = off */
    float repeat_penalty;       /* 1 = off (0 also = off) */
    float presence_penalty;     /* 0 = off */
    float frequency_penalty;    /* 0 = off */
    int32_t penalty_last_n;     /* window for penalties (default 64) */
    uint64_t seed;              /* per-request RNG seed (0 = derived from the engine seed and the request id) */
} fl_sampling_params;

void fl_sampling_params_default(fl_sampling_params *p);

typedef struct fl_logit_bias {
    int32_t token;
    float bias;                 /* added to the token's logit before sampling (-100: never, in effect) */
} fl_logit_bias;

#define FL_MAX_STOP_STRINGS 4
#define FL_MAX_STOP_TOKEN_IDS 16
#define FL_MAX_TOP_LOGPROBS 20
#define FL_MAX_BAD_WORDS 128
#define FL_MAX_BAD_WORD_TOKENS 32
/* An embedding request's pooling of the final hidden states (after the output norm, before the
 * output projection) of its prompt's tokens. */
typedef enum fl_pooling {
    FL_POOLING_NONE = 0,        /* a generation request */
    FL_POOLING_MEAN,            /* the mean over every prompt token */
    FL_POOLING_LAST             /* the last prompt token's */
} fl_pooling;

typedef struct fl_request_params {
    const int32_t *prompt;      /* token ids (BOS included if wanted); copied */
    int32_t n_prompt;
    int32_t max_tokens;         /* generated tokens limit (<= 0: up to the context) */
    fl_sampling_params sampling;
    const char *stop[FL_MAX_STOP_STRINGS]; /* stop strings (NULL-terminated list); copied */
    int32_t include_stop_str_in_output; /* 1 = the stop string that ended the output stays in its text (vLLM's) */
    int32_t ignore_eos;
    int32_t min_tokens;         /* no end of generation (EOS or a stop token id) before this many tokens */
    int32_t stop_token_ids[FL_MAX_STOP_TOKEN_IDS]; /* more tokens that end the generation like EOS */
    int32_t n_stop_token_ids;
    int32_t n;                  /* parallel samples sharing the prompt's KV blocks (copy-on-write); default 1 */
    uint64_t cache_salt;        /* extra prefix-cache key (tenant / adapter); 0 = none */
    int32_t logprobs;           /* 1 = report each generated token's log-probability (0 = off) */
    int32_t top_logprobs;       /* with logprobs: also the k most likely tokens at each step,
                                 * 0..FL_MAX_TOP_LOGPROBS.  Both are of the model's distribution,
                                 * log softmax of the raw logits, before penalties and temperature */
    const fl_logit_bias *logit_bias; /* n_logit_bias entries (copied); a token listed twice gets both */
    int32_t n_logit_bias;
    int32_t json_object;        /* 1 = constrain the output to one JSON object (RFC 8259; leading
                                 * whitespace allowed) and finish (FL_FINISH_STOP) when it closes */
    const char *json_schema;    /* a JSON Schema (text; compiled when added, so a schema the engine
                                 * cannot follow fails fl_engine_add with FL_ERR_INVALID naming
                                 * the keyword): the output is one value of it, and the request
                                 * finishes (FL_FINISH_STOP) when the value is complete.  NULL: none */
    const char *const *choices; /* vLLM's guided_choice: the output is exactly one of these n_choices
                                 * texts (1..64, plain text; copied when added); it finishes with STOP
                                 * when no other can follow, or at end-of-generation where one is
                                 * complete and a longer one could go on.  Not with json_* */
    int32_t n_choices;
    const char *regex;          /* vLLM's guided_regex: the whole output is one match of this PCRE2
                                 * pattern (UTF-8; anchored at both ends; no backreferences, as it
                                 * runs as a DFA; compiled when added, FL_ERR_INVALID naming the
                                 * offset otherwise); end-of-generation only where the text is a
                                 * match, STOP where no continuation can extend it.  Not with the
                                 * other constraints */
    int32_t prompt_logprobs;    /* 1 = also the log-probability of each prompt token after the first
                                 * given the ones before it (with top_logprobs alternatives): every
                                 * prompt position then needs a logits row, so the prompt is computed
                                 * in chunks of at most max_seqs rows and skips the prefix cache */
    int32_t priority;           /* FL_SCHED_PRIORITY: lower runs first (ties by arrival); must be 0 under FCFS */
    int32_t lora;               /* the engine's LoRA adapter k (1..n_loras) applied to this request at the
                                 * scale it was loaded with, 0 none (not with lora_scales); its prompt
                                 * blocks are cached apart from other adapters' */
    const float *lora_scales;   /* llama.cpp's per-request "lora": [{id, scale}]: fl_engine_n_loras
                                 * scales, adapter k applied at lora_scales[k - 1] (0: not applied;
                                 * alpha / r on top, as for a loaded scale), mixed in the one request;
                                 * copied when added.  Finite, |scale| <= 1e6.  Requests of different
                                 * mixes batch together; the prompt's blocks are cached under the mix */
    const int32_t *allowed_token_ids; /* vLLM's allowed_token_ids: only these n_allowed_token_ids tokens
                                 * may be sampled (end-of-generation too only if listed; with a
                                 * constraint, those of them it allows); NULL: any.  Kept as a
                                 * bitmask of n_vocab bits with the request */
    int32_t n_allowed_token_ids;
    const int32_t *bad_words_ids; /* vLLM's bad_words as token sequences, one after another (copied):
                                 * sequence k, bad_words_lens[k] tokens long, never completes in the
                                 * output (its last token is masked where the tokens generated
                                 * last are the rest of it; a one-token sequence always) */
    const int32_t *bad_words_lens;
    int32_t n_bad_words;        /* at most FL_MAX_BAD_WORDS sequences of FL_MAX_BAD_WORD_TOKENS tokens */
    const char *grammar;        /* llama.cpp's grammar (vLLM's guided_grammar in GBNF): the whole output
                                 * is one sentence of this GBNF grammar, from its rule root (compiled
                                 * when added, FL_ERR_INVALID naming the line and column otherwise);
                                 * end-of-generation only where the text is a sentence, STOP where no
                                 * token can extend it.  Not with the other constraints */
    const struct fl_grammar_trigger *grammar_triggers; /* with grammar: a lazy grammar (llama.cpp's grammar_lazy):
                                 * the output is free until one of these n_grammar_triggers (1..16)
                                 * fires, and from where it names on it follows the grammar (whose root
                                 * then matches from there; the request fails where it cannot) */
    int32_t n_grammar_triggers;
    int32_t lazy_after_think;   /* a lazy grammar's triggers look at: 0 the whole output; 1 not at its
                                 * reasoning (an output that starts, after spaces, with <think> only
                                 * past its first </think>); 2 only past the first </think> (the
                                 * prompt opened the reasoning) */
    int32_t lazy_repeat;        /* 1: where a lazy grammar's sentence ends (nothing can follow) the output
                                 * is free again, until a trigger fires again (vLLM's structural_tag);
                                 * 0: the request stops there */
    fl_pooling pooling;         /* != NONE: an embedding request (the engine made with embeddings): the
                                 * prompt is computed, nothing generated, and the request finishes
                                 * (FL_FINISH_STOP) with fl_request_output.embedding; n 1, no sampling,
                                 * logprobs or constraints.  Its prompt is not served from the prefix
                                 * cache (every token's state is computed) */
    int32_t special_text;       /* 1: special (control) tokens generated keep their text in the output
                                 * ("<|im_start|>"; vLLM's skip_special_tokens false); 0: they add none.
                                 * The end of generation ends it either way, without its text */
    /* speculative decoding for this request (llama.cpp's speculative.n_max / n_min / p_min), within
     * the engine's spec_tokens: */
    int32_t spec_max;           /* draft tokens per step: 0 the engine's spec_tokens, -1 none for this
                                 * request, k at most k (more than spec_tokens is cut to it) */
    int32_t spec_min;           /* a draft shorter than this is not verified (0: any); 0..FL_SPEC_MAX */
    int32_t spec_p_min_set;     /* 1: spec_p_min replaces the engine's spec_draft_p_min (draft model) */
    float spec_p_min;           /* 0..1 */
} fl_request_params;

/* A lazy grammar's trigger (llama.cpp's common_grammar_trigger; engine/triggers.h) */
typedef enum fl_trigger_type {
    FL_TRIGGER_TOKEN = 0,       /* the token `token` is generated: from its first byte */
    FL_TRIGGER_WORD = 1,        /* the text `value` appears: from its first byte */
    FL_TRIGGER_PATTERN = 2,     /* the PCRE2 pattern `value` matches somewhere: from its first group, or the match */
    FL_TRIGGER_PATTERN_FULL = 3 /* the pattern matches the whole output: likewise */
} fl_trigger_type;
typedef struct fl_grammar_trigger {
    int32_t type;               /* fl_trigger_type */
    const char *value;          /* the word or pattern (copied when added) */
    int32_t token;              /* FL_TRIGGER_TOKEN's */
} fl_grammar_trigger;

typedef enum fl_request_state {
    FL_REQ_WAITING = 0, FL_REQ_RUNNING, FL_REQ_PREEMPTED, FL_REQ_FINISHED
} fl_request_state;

typedef enum fl_finish_reason {
    FL_FINISH_NONE = 0, FL_FINISH_EOS, FL_FINISH_LENGTH, FL_FINISH_STOP, FL_FINISH_CANCELLED, FL_FINISH_ERROR
} fl_finish_reason;

typedef struct fl_token_logprob {
    int32_t token;
    float logprob;
} fl_token_logprob;

/* One streamed event: tokens generated since the last poll for one request (and sample index). */
typedef struct fl_request_output {
    int64_t request_id;
    int32_t sample;             /* 0..n-1 */
    int32_t n_new;
    const int32_t *new_tokens;  /* valid until the next poll on this engine */
    const char *new_text;       /* detokenized text of new_tokens (stop strings trimmed) */
    const fl_token_logprob *new_logprobs; /* logprobs requested: [n_new][1 + n_top], for each new
                                 * token itself, then the n_top most likely tokens at its position,
                                 * most likely first; else NULL */
    int32_t n_top;
    const fl_token_logprob *prompt_logprobs; /* prompt_logprobs requested: [n_prompt_logprobs][1 + n_top]
                                 * records of prompt tokens prompt_logprobs_from + 1 .. (token j + 1
                                 * given tokens 0..j), as the prompt is computed; else NULL */
    int32_t prompt_logprobs_from, n_prompt_logprobs;
    const int32_t *prompt_ranks; /* with prompt_logprobs: [n_prompt_logprobs] each prompt token's rank among
                                 * the vocabulary at its position (1: the most likely; vLLM's rank) */
    fl_finish_reason finish;    /* != NONE once this sample is done */
    int32_t n_prompt, n_generated, n_cached_prompt;
    double ttft_s;              /* time to first token (set once the first token exists) */
    const char *error;          /* finish == FL_FINISH_ERROR: why, where known (valid until the next poll); else NULL */
    const char *stop_str;       /* finish == FL_FINISH_STOP by a stop string: that string (valid until the next poll); else NULL */
    int32_t stop_token;         /* finish == FL_FINISH_STOP by one of stop_token_ids: that id; else -1 */
    const float *embedding;     /* an embedding request's finish: [n_embd] its pooled vector (not normalized;
                                 * valid until the next poll); else NULL */
    int32_t n_embd;
} fl_request_output;

typedef struct fl_engine_stats {
    int64_t steps, requests_finished, tokens_generated, tokens_prefilled;
    int32_t n_waiting, n_running, n_preempted;
    int64_t preemptions, swaps_out, swaps_in;
    int64_t kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached;
    int64_t prefix_hit_tokens, prefix_miss_tokens, kv_evictions;
    double kv_utilization;      /* live tokens / allocated token slots */
    double kv_waste;            /* (allocated slots - live tokens) / allocated slots */
    int64_t guide_mask_hits, guide_mask_misses; /* regex and grammar requests' token masks found kept / computed */
    int64_t spec_drafts;           /* speculative decoding: drafts verified (a sequence's in a step), */
    int64_t spec_draft_tokens;     /* their tokens, */
    int64_t spec_accepted_tokens;  /* and of those, kept */
} fl_engine_stats;

fl_status fl_engine_new(const fl_engine_params *p, fl_engine **out);
void fl_engine_free(fl_engine *e);
/* Tokenize text with the model's tokenizer.  flags: FL_TOKENIZE_ADD_SPECIAL adds BOS as the
 * model asks; FL_TOKENIZE_PARSE_SPECIAL reads special-token texts ("<|eot_id|>") as tokens. */
#define FL_TOKENIZE_ADD_SPECIAL 1
#define FL_TOKENIZE_PARSE_SPECIAL 2
fl_status fl_engine_tokenize(fl_engine *e, const char *text, size_t len, int add_special,
                             int32_t *out, int64_t cap, int64_t *n_out);
int64_t fl_engine_detokenize(fl_engine *e, const int32_t *ids, int64_t n, char *buf, int64_t cap);
/* The text of one token as it stands in generated text, except that special tokens give their
 * own text ("</s>"): the name a logprobs listing shows.  Returns its byte length (written
 * NUL-terminated, cut to cap - 1), or -1 for an id outside the vocabulary. */
int32_t fl_engine_token_text(fl_engine *e, int32_t token, char *buf, int32_t cap);
/* A special token of the model's vocabulary: BOS, and the fill-in-the-middle tokens of code models
 * (prefix, suffix, middle, pad, repository name, file separator: /infill) from the GGUF's
 * tokenizer.ggml.* ids or the texts their families use; -1 if the vocabulary has none.
 * FL_SPECIAL_ADD_BOS gives 1 when prompts start with BOS (tokenizer.ggml.add_bos_token), else 0. */
typedef enum fl_special_token {
    FL_SPECIAL_FIM_PRE, FL_SPECIAL_FIM_SUF, FL_SPECIAL_FIM_MID, FL_SPECIAL_FIM_PAD, FL_SPECIAL_FIM_REP, FL_SPECIAL_FIM_SEP,
    FL_SPECIAL_BOS, FL_SPECIAL_ADD_BOS
} fl_special_token;
int32_t fl_engine_special_token(fl_engine *e, fl_special_token which);
int32_t fl_engine_n_ctx(const fl_engine *e);
int32_t fl_engine_n_vocab(const fl_engine *e);
int32_t fl_engine_n_embd(const fl_engine *e); /* the length of an embedding */
int32_t fl_engine_embeddings(const fl_engine *e); /* made with embeddings (1) */
fl_sched_policy fl_engine_sched_policy(const fl_engine *e);
int32_t fl_engine_max_seqs(const fl_engine *e); /* sequences a step runs at most (max_seqs) */
int32_t fl_engine_n_loras(const fl_engine *e); /* adapter slots: the files', then the run-time ones */
int32_t fl_engine_lora_slots(const fl_engine *e); /* of them, the run-time ones (fl_engine_params.lora_slots) */
/* Load the LoRA adapter at path (F32/F16/BF16, rank <= max_lora_rank) into a free run-time slot at
 * scale; *k receives its number, which requests then apply (fl_request_params.lora, lora_scales).
 * Its file and tables must fit the slot's reservation (model/lora.h fl_lora_slot_caps; the plan
 * counts it): FL_ERR_BUDGET otherwise, and when no slot is free.  The file is opened without the
 * engine lock; steps go on meanwhile. */
fl_status fl_engine_lora_load(fl_engine *e, const char *path, float scale, int32_t *k);
/* Unload adapter k: requests added from now on may not apply it, and it is freed (its file
 * unmapped) once the requests that apply it have finished. */
fl_status fl_engine_lora_unload(fl_engine *e, int32_t k);
/* 1 when adapter k is loaded (requests may apply it), 0 otherwise; *scale its scale as loaded. */
int32_t fl_engine_lora_loaded(fl_engine *e, int32_t k, float *scale);
const char *fl_engine_model_name(const fl_engine *e);
/* Chat template text: fl_engine_params.chat_template, else the GGUF's (tokenizer.chat_template), or NULL. */
const char *fl_engine_chat_template(const fl_engine *e);
/* Queue a request; *id receives its id. FL_ERR_INVALID for prompts over the context etc. */
fl_status fl_engine_add(fl_engine *e, const fl_request_params *p, int64_t *id);
/* Cancel: frees its KV blocks at the next step boundary (or at once if not running). */
fl_status fl_engine_cancel(fl_engine *e, int64_t id);
/* Run one iteration. *n_active = requests not yet finished. FL_OK even when idle. */
fl_status fl_engine_step(fl_engine *e, int32_t *n_active);
/* Drain up to cap output events produced since the last poll. Returns the count. */
int32_t fl_engine_poll(fl_engine *e, fl_request_output *out, int32_t cap);
void fl_engine_stats_get(fl_engine *e, fl_engine_stats *s);

/* ---- OpenAI-compatible HTTP server (src/server) ----
 * Serves one engine over HTTP with libmicrohttpd: /v1/completions, /v1/chat/completions,
 * /v1/models, /tokenize, /detokenize, /health, /metrics, /lora-adapters and the rest of
 * docs/SERVER.md.  fl_server_start binds and returns; requests are served by
 * connection threads and one engine driver thread.  fl_server_stop stops accepting, cancels
 * what is still running, and joins everything. */
typedef struct fl_server fl_server;

typedef struct fl_server_params {
    const char *host;           /* default "127.0.0.1" */
    int32_t port;               /* default 8080; 0 = pick a free port (see fl_server_port) */
    const char *api_key;        /* NULL = no auth; else "Authorization: Bearer KEY" required */
    int64_t max_body_bytes;     /* default 1 MiB */
    int32_t max_tokens_limit;   /* largest max_tokens accepted (default 4096) */
    int32_t max_connections;    /* concurrent connections (default 256) */
    int32_t max_queue;          /* waiting requests before 503 (default 256) */
    int32_t max_n;              /* largest n (default 8) */
    const char *model_name;     /* name reported in responses (default: file name) */
    const char *const *lora_names; /* names of the engine's LoRA adapters 1..n_lora_names (vLLM's
                                 * --lora-modules): a request whose "model" is one of them gets it */
    int32_t n_lora_names;
    const float *lora_scales;   /* [fl_engine_n_loras] the adapters' scales for a request that names neither an
                                 * adapter (lora_names) nor its own "lora" scales: llama.cpp's --lora
                                 * (every adapter at its scale; 0: not applied); POST /lora-adapters
                                 * sets them.  NULL: 0 each */
    const char *const *lora_paths; /* [fl_engine_n_loras] the adapters' files, as GET /lora-adapters lists
                                 * them (NULL: empty) */
    int32_t pooling;            /* /v1/embeddings (the engine made with embeddings): FL_POOLING_MEAN (default)
                                 * or FL_POOLING_LAST */
    int32_t reasoning_format;   /* chat: 1 (default, llama.cpp's "deepseek"): an output's <think>...</think>
                                 * goes to message.reasoning_content (docs/SERVER.md); 0: all of it is content */
    int32_t spm_infill;         /* /infill lays the prompt out suffix first (llama.cpp's --spm-infill); 0 (default):
                                 * prefix first */
    int64_t responses_mem;      /* /v1/responses: the most bytes of stored responses (previous_response_id, GET);
                                 * default 16 MiB, 0 none; charged to FL_MEM_NET (with its budget, at most a quarter) */
    const char *ssl_key_file;   /* HTTPS (llama-server's --ssl-key-file, vLLM's --ssl-keyfile): a PEM private key */
    const char *ssl_cert_file;  /* and its PEM certificate (chain); both or neither (NULL: plain HTTP) */
} fl_server_params;

void fl_server_params_default(fl_server_params *p);
/* The engine is borrowed and must outlive the server. */
fl_status fl_server_start(fl_engine *e, const fl_server_params *p, fl_server **out);
int32_t fl_server_port(const fl_server *s);
/* Stop accepting; wait up to grace_ms for in-flight requests, then cancel the rest; free. */
void fl_server_stop(fl_server *s, int32_t grace_ms);

#ifdef __cplusplus
}
#endif
#endif /* FITLLM_H */
