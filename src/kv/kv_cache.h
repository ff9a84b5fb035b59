/*
 * kv_cache.h - the paged KV cache: block pool + per-sequence block tables + K/V storage,
 * prefix caching, quantised K/V, sliding window, sink+window shifting and swap.
 *
 * Storage (one fl_alloc in FL_MEM_KV, sized from a byte budget):
 *     [n_layer][K, V][n_blocks - 1][block_size][row]      row = n_head_kv * head_dim elements
 * in the cache type (kv_quant.h), token-major inside a block, so one token's K for all kv heads
 * is contiguous (the layout store() receives) and q8_0/q4_0 groups of 32 run along the row.
 * fp8 types add [n_layer][K, V][n_blocks - 1][n_head_kv] f32 scales (per block and kv head;
 * when a new row needs a larger scale, the block's earlier rows of that head are re-encoded).
 * Block 0 is the null block (no storage).  Bookkeeping (tables, token ids, pool) is FL_MEM_MISC,
 * attention workspace FL_MEM_SCRATCH (grown on demand, kept).
 *
 * Sequences: ids in [0, n_seq_max).  A sequence holds positions 0 .. len-1; each prepared batch
 * appends positions len, len+1, ... (the batch's tokens of one sequence are contiguous and in
 * order).  Blocks are taken from the pool only when a sequence crosses a block boundary; a
 * write into a block shared with another sequence first copies it (copy-on-write).
 *
 * Prefix caching (cfg.prefix_cache): each full block gets a chained XXH3-128 hash of its
 * tokens (prefix_cache.h) with the cache's or the sequence's extra key.  fl_kv_seq_add() reuses
 * the longest chain of cached full blocks, always leaving at least the last prompt token to be
 * computed; freed cached blocks stay reusable until the LRU evicts them.  A block is registered
 * when the store() of the last layer has filled it (never half-written).  Sequences that were
 * shifted or fed without token ids stop registering blocks.
 *
 * The fl_kv_iface (kv_iface.h): prepare() validates the batch and makes room; it returns
 * FL_NO_KV_SPACE with nothing changed when the pool can't hold it (blocks that slid out of
 * the window are released before that check; releasing them changes nothing attention sees).
 * A sequence the batch names that does not exist yet is created on the fly if its first
 * position is 0 (no prefix lookup).  store()/attend() act on the batch last prepared (same
 * pointer contents) and must follow it, once per layer.
 *
 * Errors: functions returning fl_status set fl_last_error.  Not thread-safe: one engine thread
 * drives a cache, queries included (fl_kv_stats_get and fl_kv_check use internal scratch
 * despite their const argument); attend() threads internally with fl_parallel.
 */
#ifndef FL_KV_CACHE_H
#define FL_KV_CACHE_H

#include "kv/kv_iface.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fl_kv_config {
    int32_t n_layer;
    int32_t n_head;       /* query heads (attend) */
    int32_t n_head_kv;
    int32_t head_dim;     /* <= 512 */
    int32_t type;         /* fl_type of K and V: f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0 */
    int32_t block_size;   /* tokens per block; 0 -> 16 */
    size_t mem_bytes;     /* K/V storage budget: n_blocks = mem_bytes / bytes_per_block + 1 */
    int32_t n_blocks;     /* used when mem_bytes == 0: blocks including the null block */
    int32_t n_seq_max;    /* sequence ids are 0 .. n_seq_max-1; 0 -> 256 */
    int32_t n_ctx;        /* max positions per sequence, 0 = no limit */
    int32_t window;       /* sliding window in tokens (Mistral/Gemma style), 0 = none */
    float attn_scale;     /* 0 -> 1/sqrt(head_dim) */
    int32_t part_tokens;  /* split-K partition length in tokens; 0 -> 256 (rounded to blocks) */
    /* RoPE of the stored keys, for fl_kv_seq_shift: 'normal' pairing (x[2i], x[2i+1]) of the
     * first n_rot dims of each head rotated by pos * rope_base^(-2i/n_rot). */
    int32_t n_rot;        /* 0 -> head_dim */
    float rope_base;      /* 0 -> 10000 */
    bool prefix_cache;
    const void *hash_key; /* default extra key of the prefix hashes (copied), may be NULL */
    size_t hash_key_len;
    const char *swap_dir; /* directory of the swap file; NULL -> $TMPDIR or /tmp */
    bool prefault;        /* touch (zero) the whole K/V storage at creation, as llama.cpp clears its
                           * cache buffer: no page faults in the steps that first reach a block (in
                           * `fitllm bench serve`, 16 sequences, they were ~1% of the decode time),
                           * and where an overcommitted system cannot back the pool, its OOM
                           * killer strikes at start-up, not mid-request.  The engine sets it;
                           * else pages arrive on first use. */
} fl_kv_config;

typedef struct fl_kv_cache fl_kv_cache;

/* Bytes of one block (all layers, K and V, scales included) and of one token slot. */
size_t fl_kv_bytes_per_block(const fl_kv_config *cfg);
size_t fl_kv_bytes_per_token(const fl_kv_config *cfg);

/* The cache's bookkeeping (FL_MEM_MISC), for the engine-exact plan (plan/plan_engine.h): fl_kv_misc_bytes, what
 * fl_kv_new(cfg) allocates (0 for a config that holds no block); fl_kv_seq_misc_bytes, one
 * sequence's token ids and block table at n_pos positions; fl_kv_step_misc_bytes, the arrays
 * fl_kv_prepare keeps for a step of n_tokens. */
size_t fl_kv_misc_bytes(const fl_kv_config *cfg);
size_t fl_kv_seq_misc_bytes(const fl_kv_config *cfg, int32_t n_pos);
size_t fl_kv_step_misc_bytes(int32_t n_tokens);
/* What one more block of the pool adds to fl_kv_misc_bytes, at most. */
size_t fl_kv_block_misc_bytes(const fl_kv_config *cfg);

/* New cache, or NULL with the error set (bad config, budget smaller than 1 block, no memory). */
fl_kv_cache *fl_kv_new(const fl_kv_config *cfg);
void fl_kv_free(fl_kv_cache *kv); /* NULL ok */

/* The interface for the model's forward; ctx = the fl_kv_cache *. */
fl_kv_iface fl_kv_iface_get(void);
fl_status fl_kv_prepare(fl_kv_cache *kv, const fl_batch *b);
void fl_kv_store(fl_kv_cache *kv, int32_t il, const fl_batch *b, const float *k, const float *v);
void fl_kv_attend(fl_kv_cache *kv, int32_t il, const fl_batch *b, const float *q, float *out);

/* ---- sequences ---- */

/* Start sequence seq for a prompt: reuse the longest chain of cached full blocks of
 * tokens[0..n) (never all n tokens) and report how many are already cached in *n_cached; the
 * engine then feeds tokens n_cached .. n-1 at those positions.  FL_ERR_INVALID if seq is out
 * of range or exists. */
fl_status fl_kv_seq_add(fl_kv_cache *kv, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_cached);
/* Same with a per-sequence extra key for the hashes (adapter id, tenant salt). */
fl_status fl_kv_seq_add_keyed(fl_kv_cache *kv, int32_t seq, const int32_t *tokens, int32_t n, const void *key,
                              size_t key_len, int32_t *n_cached);
/* How many leading tokens of tokens[0..n) a fl_kv_seq_add(_keyed) would find cached right now
 * (same rule: full blocks, at least one token left), without taking anything.  For admission
 * decisions; 0 when prefix caching is off. */
int32_t fl_kv_prefix_probe(const fl_kv_cache *kv, const int32_t *tokens, int32_t n, const void *key, size_t key_len);
/* Free every sequence (cached blocks stay reusable). */
void fl_kv_clear(fl_kv_cache *kv);
/* dst becomes a copy of src sharing all its blocks (copy-on-write later).  dst must not exist. */
fl_status fl_kv_seq_fork(fl_kv_cache *kv, int32_t src, int32_t dst);
/* Release the sequence's blocks (cached full blocks stay reusable).  No-op if it doesn't exist. */
void fl_kv_seq_free(fl_kv_cache *kv, int32_t seq);
bool fl_kv_seq_exists(const fl_kv_cache *kv, int32_t seq);
int32_t fl_kv_seq_len(const fl_kv_cache *kv, int32_t seq); /* positions stored; -1 if none */
/* Read-only view of the block table (valid until the next call that changes the cache). */
const int32_t *fl_kv_seq_blocks(const fl_kv_cache *kv, int32_t seq, int32_t *n_blocks);

/* Keep positions 0 .. n-1 of the sequence and drop the rest (speculative tokens that were not
 * accepted, llama.cpp's seq_rm of a tail): blocks wholly past n go back to the pool, and the
 * block that keeps part of its positions loses its prefix-cache registration (its tail will be
 * rewritten); the sequence continues at position n.  fp8 types keep the block scales the dropped
 * rows raised.  FL_ERR_INVALID if absent, swapped out or n is not in [0, len]. */
fl_status fl_kv_seq_truncate(fl_kv_cache *kv, int32_t seq, int32_t n);
/* The token ids of the sequence's positions (*n of them; borrowed, valid until the cache changes),
 * or NULL with *n = 0 if it is absent. */
const int32_t *fl_kv_seq_tokens(const fl_kv_cache *kv, int32_t seq, int32_t *n);

/* Decoded K and V rows (n_head_kv * head_dim floats each, either may be NULL) of position pos
 * of sequence seq in layer il, as attention sees them.  FL_ERR_INVALID if absent, swapped,
 * out of range or released by the window.  (Tests, debugging, exporting a cache.) */
fl_status fl_kv_seq_read(const fl_kv_cache *kv, int32_t seq, int32_t il, int32_t pos, float *k, float *v);

/* StreamingLLM / context shift: drop positions [n_keep, n_keep + n_discard) and move the later
 * ones down by n_discard, re-rotating their keys with RoPE to the new positions.  The sequence
 * continues at position len - n_discard.  Blocks it touches are made private first (may need
 * free blocks: FL_NO_KV_SPACE, nothing changed).  Quantised types re-encode the moved rows. */
fl_status fl_kv_seq_shift(fl_kv_cache *kv, int32_t seq, int32_t n_keep, int32_t n_discard);

/* StreamingLLM policy on top of fl_kv_seq_shift: if the sequence holds more than
 * n_sink + n_recent positions, keep the first n_sink and the last n_recent (the sequence then
 * continues at position n_sink + n_recent).  No-op otherwise.  Same errors as the shift. */
fl_status fl_kv_seq_stream(fl_kv_cache *kv, int32_t seq, int32_t n_sink, int32_t n_recent);

/* Swap to the file-backed secondary tier: swap_out writes the sequence's blocks (all layers,
 * shared ones copied) to the swap file and releases them; swap_in takes fresh blocks and reads
 * them back (FL_NO_KV_SPACE if the pool can't hold them; nothing changed).  Swapped blocks
 * lose their prefix-cache registration.  A swapped sequence can be freed but not prepared. */
fl_status fl_kv_seq_swap_out(fl_kv_cache *kv, int32_t seq);
fl_status fl_kv_seq_swap_in(fl_kv_cache *kv, int32_t seq);
bool fl_kv_seq_swapped(const fl_kv_cache *kv, int32_t seq);
/* Blocks a swap-in / a prepare of n_new more tokens would take from the pool right now. */
int32_t fl_kv_seq_blocks_needed(const fl_kv_cache *kv, int32_t seq, int32_t n_new);

/* ---- accounting ---- */

typedef struct fl_kv_seq_stats {
    int32_t n_tokens;     /* positions stored */
    int32_t n_blocks;     /* blocks held (null entries not counted) */
    int32_t slack;        /* free token slots in the last block */
    int64_t bytes_held;   /* n_blocks * bytes_per_block */
    int64_t bytes_shared; /* bytes of held blocks that other sequences also hold */
    bool swapped;
} fl_kv_seq_stats;

typedef struct fl_kv_stats {
    int32_t block_size;
    int32_t n_blocks_total, n_blocks_used, n_blocks_free, n_blocks_cached;
    int32_t n_seqs;
    int64_t bytes_per_block, bytes_total;
    int64_t slots_allocated; /* n_blocks_used * block_size */
    int64_t tokens_live;     /* filled slots of used blocks, each physical block once */
    int64_t tokens_logical;  /* sum of sequence lengths (shared tokens counted per sequence) */
    double utilization;      /* n_blocks_used / n_blocks_total */
    double waste;            /* (slots_allocated - tokens_live) / slots_allocated */
    int64_t hit_tokens, miss_tokens, evictions;
    int64_t cow_copies, swap_outs, swap_ins, shifted_tokens;
} fl_kv_stats;

fl_status fl_kv_seq_stats_get(const fl_kv_cache *kv, int32_t seq, fl_kv_seq_stats *out);
void fl_kv_stats_get(const fl_kv_cache *kv, fl_kv_stats *out);
const fl_kv_config *fl_kv_config_get(const fl_kv_cache *kv); /* defaults filled in */
int32_t fl_kv_blocks_free(const fl_kv_cache *kv);  /* allocatable now (cached free ones included), O(1) */
int32_t fl_kv_blocks_total(const fl_kv_cache *kv); /* usable blocks (null block excluded) */
int32_t fl_kv_block_size(const fl_kv_cache *kv);
/* Check pool invariants and that refcounts equal the references held by block tables.
 * FL_OK or FL_ERR_INTERNAL with a message. */
fl_status fl_kv_check(const fl_kv_cache *kv);

#endif
