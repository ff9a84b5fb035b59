/*
 * prefix_cache.h - content addressing of full KV blocks for prefix reuse.
 *
 * A full block's hash is chained: h_i = XXH3-128(h_{i-1} || token ids of block i), with
 * h_{-1} = the root, XXH3-128 of an optional extra key (adapter id, tenant salt; empty key ->
 * a fixed root).  So a hash names the whole prefix up to the end of its block, and two
 * requests with different keys never share blocks.  The pool's map finds the block of a hash;
 * this module also keeps each cached block's token ids and parent hash, and a hit is accepted
 * only if both compare equal (no trust in the hash alone).
 *
 * Memory: FL_MEM_MISC, [n_blocks][block_size] token ids + [n_blocks] parent hashes.
 * Not thread-safe (driven by kv_cache).
 */
#ifndef FL_PREFIX_CACHE_H
#define FL_PREFIX_CACHE_H

#include "kv/block_pool.h"

#include <stddef.h>

typedef struct fl_kv_prefix fl_kv_prefix;

fl_kv_prefix *fl_kv_prefix_new(int32_t n_blocks, int32_t block_size);
/* MISC bytes fl_kv_prefix_new allocates (the engine-exact plan counts them). */
size_t fl_kv_prefix_misc_bytes(int32_t n_blocks, int32_t block_size);
void fl_kv_prefix_free(fl_kv_prefix *pc); /* NULL ok */

/* Root of a chain for an extra key (key may be NULL with len 0). */
fl_kv_hash fl_kv_prefix_root(const void *key, size_t key_len);
/* Hash of one full block (block_size token ids) whose parent hash is parent. */
fl_kv_hash fl_kv_prefix_hash(const fl_kv_prefix *pc, const fl_kv_hash *parent, const int32_t *tokens);

/* Block id has just been filled with tokens; register it under its hash h (computed from
 * parent and tokens).  Returns true if registered, false if the block already had a hash or
 * another block holds h (duplicate content: it simply stays uncached). */
bool fl_kv_prefix_commit(fl_kv_prefix *pc, fl_kv_pool *pool, int32_t id, const fl_kv_hash *parent,
                         const fl_kv_hash *h, const int32_t *tokens);

/* Longest chain of cached full blocks for tokens[0 .. n_blocks*block_size) starting at root:
 * writes the block ids (not referenced: the caller refs them) and the hash of the last matched
 * block into *last (root if none), returns how many matched. */
int32_t fl_kv_prefix_match(const fl_kv_prefix *pc, const fl_kv_pool *pool, const fl_kv_hash *root,
                           const int32_t *tokens, int32_t n_blocks, int32_t *ids, fl_kv_hash *last);

#endif
