/*
 * sp.h - sequence (context) parallelism: ring attention for long prefill, distributed KV.
 *
 * Every rank holds the whole model (replicated weights) and 1/N of one sequence's KV.
 *
 * Prefill of T tokens (T >= 2N) with N ranks: the sequence is cut into 2N chunks of
 * T/(2N) tokens (the first T % 2N chunks one longer); rank r takes chunks r and 2N-1-r, so
 * under the causal mask every rank has the same attention work (load balanced: chunk r is
 * cheap, chunk 2N-1-r expensive).  Each rank runs the model's forward on its own tokens (a
 * batch with their true positions); at every layer the attention is a ring: N steps, at step s
 * a rank attends its queries to the K/V block of rank (r - s) mod N (flash attention with
 * log-sum-exp, kernels/attn.h; a key chunk entirely before a query chunk: full attention, the
 * same chunk: causal, a later chunk: skipped), merges the partial result with fl_attn_merge,
 * and passes the block to rank r+1 (fl_comm_isendrecv started before the step's attention and
 * waited for after it: the transfer overlaps the compute).
 * Per layer a rank sends (N-1) blocks of its ~T/N tokens' K and V.  The last token is in
 * chunk 2N-1 (rank 0): its logits are broadcast to every rank.
 *
 * Decode (one token per step): every rank runs the same token through the model; the new K/V
 * row is kept by one rank, round robin (rank = position-count mod N), so the KV stays split
 * evenly; each rank attends the query to its own keys and the N partial (out, lse) are
 * all-gathered and merged in rank order (every rank gets identical logits).
 *
 * Memory: K and V of up to cap = ceil(n_ctx / N) + 2 tokens per rank and layer in kv_type
 * (F32 or F16), one FL_MEM_KV block (fl_sp_kv_bytes); two ring buffers of one layer's block
 * (FL_MEM_COMM); partial outputs / lse (FL_MEM_SCRATCH, grown on demand and kept).
 *
 * Limits: one sequence; prefill only into an empty cache (fl_sp_clear); no sliding window.
 * Errors: FL_ERR_INVALID for bad params / T < 2N; FL_NO_KV_SPACE when a rank's share is full;
 * FL_ERR_IO from the communicator.  Collective: every rank calls the same functions with the
 * same tokens.  Not thread-safe.
 */
#ifndef FL_SP_H
#define FL_SP_H

#include "dist/dist.h"
#include "model/llama.h"

typedef struct fl_sp_params {
    int32_t n_layer, n_head, n_head_kv, head_dim;
    int32_t n_ctx;   /* total positions of the sequence */
    int32_t kv_type; /* FL_TYPE_F32 or FL_TYPE_F16 */
    int32_t impl;    /* kernels/attn.h fl_attn_impl: 0 auto (flash), 1 naive, 2 flash only */
} fl_sp_params;

typedef struct fl_sp fl_sp;

/* [*lo, *hi) of chunk c of a sequence of T tokens cut into n_chunks. */
void fl_sp_chunk(int64_t T, int32_t n_chunks, int32_t c, int64_t *lo, int64_t *hi);
/* Tokens rank r holds after a prefill of T tokens over n ranks. */
int64_t fl_sp_local_tokens(int64_t T, int32_t n, int32_t r);
/* Exact FL_MEM_KV bytes per rank. */
size_t fl_sp_kv_bytes(const fl_sp_params *p, int32_t n_ranks);

fl_status fl_sp_new(fl_comm *comm, const fl_sp_params *p, fl_sp **out);
void fl_sp_free(fl_sp *s);
void fl_sp_clear(fl_sp *s);
int32_t fl_sp_n_local(const fl_sp *s); /* tokens this rank holds */
int32_t fl_sp_n_total(const fl_sp *s); /* tokens of the sequence */

/* The kv interface the model's forward uses (ctx = the fl_sp *); driven by the two calls
 * below, which set the mode.  Raw use (tests): fl_sp_begin_prefill / fl_sp_begin_decode, then
 * prepare/store/attend, then fl_sp_commit. */
const fl_kv_iface *fl_sp_iface(void);
fl_status fl_sp_begin_prefill(fl_sp *s, int32_t T);
fl_status fl_sp_begin_decode(fl_sp *s);
void fl_sp_commit(fl_sp *s);
fl_status fl_sp_status(const fl_sp *s); /* first communicator error since the last begin */

/* Prefill tokens[0..T) (all ranks pass the whole prompt); logits [n_vocab] of the last token on
 * every rank.  The model's workspace must hold fl_sp_local_tokens(T, N, r) tokens. */
fl_status fl_sp_prefill(fl_sp *s, fl_model *m, const int32_t *tokens, int32_t T, float *logits);
/* One decode step of token at the next position; logits [n_vocab] on every rank. */
fl_status fl_sp_decode(fl_sp *s, fl_model *m, int32_t token, float *logits);

#endif
