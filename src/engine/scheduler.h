/*
 * scheduler.h - continuous batching policy: which tokens of which requests run in the next step.
 *
 * Pure policy over an abstract KV block budget (fl_sched_kv below): the scheduler never touches
 * K/V storage, it asks the KV side how many blocks are free, how many a sequence needs to grow,
 * and tells it to reserve, release, swap or fork.  The engine plugs the paged cache (or the
 * contiguous one, where a "block" is a whole max-length slot) behind these callbacks; the
 * scheduler test plugs a fake that only counts.
 *
 * One call to fl_sched_schedule() produces the step's entries {request, n tokens from
 * r->n_computed}, at most max_batch_tokens tokens in total, at most max_seqs running requests:
 *   1. one decode token for every running request whose prefill is done (oldest first);
 *   2. prefill chunks of running requests that are still prefilling (chunked prefill: a chunk is
 *      whatever is left of the token budget, so decodes keep flowing beside long prompts);
 *   3. admissions from the waiting queue in scheduling order (preempted requests keep their rank
 *      and so go first), only while the blocks the first chunk needs are free above the
 *      watermark; a request whose prompt starts with cached blocks starts with those tokens
 *      computed.  No admissions in a step that had to preempt to grow (avoids thrashing).
 * The scheduling order (fl_sched_policy) is FCFS, by arrival, or FL_SCHED_PRIORITY: by
 * fl_request.priority, lower first, then by arrival (vLLM's --scheduling-policy priority).  Both
 * lists are kept in it, so decodes and prefill chunks take the step's budget in that order too.
 * Under FL_SCHED_PRIORITY the head of the waiting queue that finds no KV or no slot preempts the
 * last running request if that one's priority is strictly lower, until it fits.
 *   4. speculative decoding: a decode whose request holds draft tokens (r->draft, proposed by
 *      the engine) runs them after its token, as many as what the above left of the budget, the
 *      rows and the free KV blocks allows (drafts never preempt, never delay a prefill).
 * Every step has at most max_rows logits rows: one per entry that reaches its last token, one per
 * draft token, plus, for a request with prompt logprobs, one per prompt position of its chunk (its
 * chunks are cut to the rows left).
 * When a running request cannot grow, the last running request in scheduling order is preempted
 * (possibly the one growing): by recompute (its blocks are freed, n_computed := 0) or, in swap mode, by
 * swapping its blocks to the secondary tier (falling back to recompute if that fails).
 * Static mode (the --baseline static comparison): a new batch is formed only when the previous
 * one has completely finished; finished members stay as padding rows until then.
 *
 * Invariants (checked by fl_sched_check): every RUNNING request holds KV (kv_live), no WAITING or
 * recompute-PREEMPTED request does, both lists are in scheduling order, running <= max_seqs.
 * Not thread-safe: owned by the engine's driver thread (under the engine mutex).
 */
#ifndef FL_SCHEDULER_H
#define FL_SCHEDULER_H

#include "engine/request.h"

typedef struct fl_sched_kv {
    void *ctx;
    /* blocks that can be allocated now (free + evictable cached blocks) */
    int64_t (*n_free)(void *ctx);
    /* Start r's KV sequence; attach the longest cached prefix of r->tokens[0, n_tokens) and return
     * its length in *n_cached (0 without prefix caching).  Must leave at least one token to
     * compute (*n_cached < r->n_tokens).  FL_NO_KV_SPACE (soft): no sequence id or slot free now;
     * other errors are hard (the step fails). */
    fl_status (*seq_begin)(void *ctx, fl_request *r, int32_t *n_cached);
    /* Additional blocks r needs to hold n_total tokens (counting swapped-out blocks as needed). */
    int64_t (*n_needed)(void *ctx, const fl_request *r, int32_t n_total);
    /* Make r hold n_total tokens; FL_NO_KV_SPACE (nothing changed) when the pool is out. */
    fl_status (*reserve)(void *ctx, fl_request *r, int32_t n_total);
    /* Drop r's sequence: blocks back to the pool (computed full blocks stay prefix-cached). */
    void (*seq_end)(void *ctx, fl_request *r);
    /* Optional (NULL = unsupported): move r's blocks to / from the swap tier. */
    fl_status (*swap_out)(void *ctx, fl_request *r);
    fl_status (*swap_in)(void *ctx, fl_request *r);
    /* Optional: child shares all of parent's n_tokens tokens of KV (copy-on-write). */
    fl_status (*fork)(void *ctx, fl_request *parent, fl_request *child, int32_t n_tokens);
    /* Optional (NULL: no speculative decoding): r keeps its first n_total computed tokens and gives
     * back the rest (draft tokens that were not accepted). */
    fl_status (*truncate)(void *ctx, fl_request *r, int32_t n_total);
} fl_sched_kv;

typedef struct fl_sched_params {
    int32_t max_seqs;          /* running requests at most */
    int32_t max_batch_tokens;  /* tokens per step at most */
    int32_t watermark_blocks;  /* blocks kept free at admission */
    fl_preempt_mode preempt;
    int32_t static_batch;      /* 1 = static batching baseline */
    fl_sched_policy policy;    /* FCFS (default) or priority */
    int32_t max_rows;          /* logits rows per step (0: max_seqs); speculative decoding needs
                                * one per draft token besides one per sequence */
} fl_sched_params;

typedef struct fl_sched_entry {
    fl_request *r;
    int32_t n;      /* tokens r->tokens[n_computed, n_computed + n) run this step */
    int32_t pad;    /* static mode: a padding row of a finished request (1 dummy token) */
    int32_t spec;   /* of the n, draft tokens r->draft[0 .. spec) after the decode token (each
                     * gets a logits row; fl_sched_commit counts only n - spec as computed) */
} fl_sched_entry;

typedef struct fl_sched_out {
    fl_sched_entry *e;  /* owned by the scheduler, valid until the next schedule */
    int32_t n_entries;
    int32_t n_tokens;
    int32_t n_preempted, n_admitted, n_swapped_in, n_swapped_out;
} fl_sched_out;

typedef struct fl_sched_stats {
    int64_t preemptions, swaps_out, swaps_in, admissions, steps;
    int64_t prefix_hit_tokens, prefix_miss_tokens;
    int32_t max_running;       /* most requests running at once */
} fl_sched_stats;

typedef struct fl_sched fl_sched;

fl_status fl_sched_new(const fl_sched_params *p, const fl_sched_kv *kv, fl_sched **out);
/* MISC bytes of a scheduler for max_seqs with n_waiting requests queued at most (the
 * engine-exact plan counts them). */
size_t fl_sched_misc_bytes(int32_t max_seqs, int32_t n_waiting);
/* Frees the scheduler only (requests belong to the engine; call fl_sched_remove first). */
void fl_sched_free(fl_sched *s);
/* Queue a WAITING request (kept in scheduling order). */
fl_status fl_sched_add(fl_sched *s, fl_request *r);
/* Take r off the scheduler (finished, cancelled, failed): its KV sequence is released.  In static
 * mode a request that finished normally stays as a padding row until its batch is done. */
void fl_sched_remove(fl_sched *s, fl_request *r, bool keep_as_padding);
/* Plan the next step (see above).  FL_OK, or a hard error from the KV callbacks. */
fl_status fl_sched_schedule(fl_sched *s, fl_sched_out *out);
/* After the step's forward: r's scheduled tokens are now computed (the engine calls this); an
 * entry's draft tokens are not: the engine counts the accepted ones and truncates the KV. */
void fl_sched_commit(fl_sched *s, const fl_sched_out *out);

/* n > 1: right after parent's prompt was computed (its logits row not yet consumed), child
 * (a WAITING sample with the same prompt) takes a copy-on-write fork of the parent's blocks and
 * becomes RUNNING with its whole prompt computed; the caller samples its first token from the
 * parent's logits.  FL_NO_KV_SPACE (soft) when forking is unsupported or max_seqs is reached:
 * the child then waits and is admitted normally (sharing full blocks via the prefix cache). */
fl_status fl_sched_admit_fork(fl_sched *s, fl_request *parent, fl_request *child);

int32_t fl_sched_n_waiting(const fl_sched *s);
int32_t fl_sched_n_running(const fl_sched *s);   /* includes padding rows */
int32_t fl_sched_n_preempted(const fl_sched *s); /* waiting requests that were preempted */
fl_request *fl_sched_running_at(const fl_sched *s, int32_t i);
fl_request *fl_sched_waiting_at(const fl_sched *s, int32_t i);
void fl_sched_stats_get(const fl_sched *s, fl_sched_stats *st);
/* Check the invariants above; FL_ERR_INTERNAL with a message when one fails. */
fl_status fl_sched_check(const fl_sched *s);

#endif
