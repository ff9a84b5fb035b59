/*
 * engine.h - internal extras of the engine (the public API is in include/fitllm.h).
 *
 * The engine (engine.c) owns a backend (backend.h: model + KV cache + tokenizer), a scheduler
 * (scheduler.h) and every request (request.h) until its final event has been polled.  Thread
 * safety: fl_engine_add / cancel / poll / stats_get may be called from any thread; step from one
 * driver thread at a time.
 */
#ifndef FL_ENGINE_H
#define FL_ENGINE_H

#include "fitllm.h"

/* Seconds spent inside the backend's forward since the engine was created (driver thread). */
double fl_engine_forward_seconds(const fl_engine *e);

/* The engine-exact plan's input (plan/plan_engine.h) for these engine params: the same defaults
 * fl_engine_new applies (KV f16, block 16, kv_mem 256 MiB when 0).  FL_ERR_INVALID for unknown
 * type names.  fl_engine_new with mem_total > 0 and kv_mem == 0 sizes kv_mem with
 * fl_plan_engine_kv_mem over this input and sets the allocator's total budget to mem_total
 * (cleared when the engine is freed). */
struct fl_plan_engine_in;
/* MISC bytes the engine itself keeps with max_seqs requests queued or running, polled every
 * step (its struct, the scheduler, the request table, the poll's buffers for a step's tokens
 * and text at piece_bytes per token, and its logprob records' first buffer when
 * max_logprobs < 0; with logprobs the plan counts that buffer with the records); and the real
 * backend's (engine_model.c: its struct and the paged cache's sequence-id adapter). */
size_t fl_engine_misc_bytes(int32_t max_seqs, int32_t rows, int32_t max_logprobs, double piece_bytes);
/* Logits rows of a step (rows: also the most tokens a step generates): one per sequence, and one
 * per draft token with speculative decoding, within the step's tokens */
static inline int32_t fl_engine_rows(int32_t max_seqs, int32_t spec_tokens, int32_t max_batch_tokens) {
    const int64_t r = (int64_t)max_seqs * (1 + (int64_t)spec_tokens), t = (int64_t)max_batch_tokens + max_seqs;
    return (int32_t)(r < t ? r : t);
}
/* The n-gram lengths speculative decoding looks up by default (fl_engine_params.spec_ngram_*) */
#define FL_SPEC_NGRAM_MIN 2
#define FL_SPEC_NGRAM_MAX 4
/* Speculative decoding's proposer: the tokens that followed the latest earlier occurrence of the
 * last g tokens of t[0, n), for the longest g in [g_min, g_max] that occurs before; at most k of
 * them into out.  Returns how many (0: no match). */
int32_t fl_spec_ngram(const int32_t *t, int32_t n, int32_t g_min, int32_t g_max, int32_t k, int32_t *out);
/* The paged cache's sequence ids (its n_seq_max): a request holds one, forks and preempted ones more */
#define FL_ENGINE_SEQ_IDS(max_seqs) ((max_seqs) * 8 + 64)
size_t fl_engine_model_misc_bytes(int32_t max_seqs);
/* Speculative decoding's draft model (engine_model.c): its struct and per-request arrays (MISC),
 * its batch arrays (SCRATCH), and its cache's blocks: max_seqs whole contexts + the null block. */
size_t fl_engine_draft_misc_bytes(int32_t max_seqs);
size_t fl_engine_draft_scratch_bytes(int32_t max_batch_tokens);
#define FL_ENGINE_DRAFT_BLOCKS(max_seqs, n_ctx, block_size) ((max_seqs) * (((n_ctx) + (block_size) - 1) / (block_size)) + 1)
/* The output constraints' budget p asks for (fl_engine_params.guide_mem, -1 resolved). */
int64_t fl_engine_guide_mem(const fl_engine_params *p);
fl_status fl_engine_plan_input(const fl_engine_params *p, struct fl_plan_engine_in *pi);

#endif
