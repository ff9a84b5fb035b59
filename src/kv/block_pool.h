/*
 * block_pool.h - the physical KV blocks: reference counts, a free list in eviction order and
 * the hash -> block map of the prefix cache.
 *
 * Blocks are numbered 0 .. n_blocks-1.  Block 0 is the null block: never allocated, never
 * freed, it stands for "no block" in block tables (positions that slid out of a window).
 * Every other block is either used (refcount >= 1) or free (refcount 0, on the free list).
 *
 * Free list = eviction (LRU) order: fl_kv_pool_alloc() takes the head.  A block whose refcount
 * drops to 0 goes to the tail if it holds a prefix-cache hash (so it stays reusable as long as
 * possible), to the head if it does not (nothing worth keeping).  A free cached block can be
 * revived by fl_kv_pool_ref() (a prefix hit), which takes it off the free list.  Allocating a
 * cached block evicts it: its hash leaves the map and the eviction counter goes up.
 *
 * Invariants (fl_kv_pool_check): n_free + n_used == n_blocks - 1; every refcount >= 0; the
 * free list holds exactly the refcount-0 blocks; the map holds exactly the blocks with a hash
 * and each hash at most once.
 *
 * Bookkeeping memory is charged to FL_MEM_MISC (the K/V storage itself lives in kv_cache).
 * Not thread-safe: the owner (kv_cache, driven by one engine thread) serialises calls.
 */
#ifndef FL_BLOCK_POOL_H
#define FL_BLOCK_POOL_H

#include "fitllm.h"

#include <stdbool.h>
#include <stdint.h>

/* A 128-bit block hash (XXH3-128). */
typedef struct fl_kv_hash {
    uint64_t lo, hi;
} fl_kv_hash;

typedef struct fl_kv_pool fl_kv_pool;

/* A pool of n_blocks blocks (including the null block; n_blocks >= 2).  NULL on bad size or
 * allocation failure (error set). */
fl_kv_pool *fl_kv_pool_new(int32_t n_blocks);
void fl_kv_pool_free(fl_kv_pool *p); /* NULL ok */
/* MISC bytes fl_kv_pool_new(n_blocks) allocates (the engine-exact plan counts them). */
size_t fl_kv_pool_misc_bytes(int32_t n_blocks);
/* What one more block adds to it, at most (its entry and up to two hash buckets). */
size_t fl_kv_pool_block_misc_bytes(void);

/* Take the head of the free list with refcount 1; -1 if no block is free.  Evicts the block's
 * hash if it had one. */
int32_t fl_kv_pool_alloc(fl_kv_pool *p);
/* refcount += 1; a free block (prefix hit) leaves the free list. */
void fl_kv_pool_ref(fl_kv_pool *p, int32_t id);
/* refcount -= 1; at 0 the block joins the free list (tail if cached, head if not). */
void fl_kv_pool_unref(fl_kv_pool *p, int32_t id);
int32_t fl_kv_pool_refcount(const fl_kv_pool *p, int32_t id);

int32_t fl_kv_pool_n_total(const fl_kv_pool *p); /* usable blocks: n_blocks - 1 */
int32_t fl_kv_pool_n_free(const fl_kv_pool *p);  /* refcount 0 (cached ones included) */
int32_t fl_kv_pool_n_used(const fl_kv_pool *p);
int32_t fl_kv_pool_n_cached(const fl_kv_pool *p); /* blocks holding a hash (used or free) */
int64_t fl_kv_pool_evictions(const fl_kv_pool *p);

/* Register hash h for block id.  Returns false (and does nothing) if the block already has a
 * hash or another block holds h. */
bool fl_kv_pool_set_hash(fl_kv_pool *p, int32_t id, const fl_kv_hash *h);
/* Forget block id's hash (its contents are about to change).  No-op if it has none. */
void fl_kv_pool_drop_hash(fl_kv_pool *p, int32_t id);
/* Block holding h, or -1. */
int32_t fl_kv_pool_lookup(const fl_kv_pool *p, const fl_kv_hash *h);
bool fl_kv_pool_has_hash(const fl_kv_pool *p, int32_t id);

/* Check every invariant above; FL_OK or FL_ERR_INTERNAL with the first violation. O(n). */
fl_status fl_kv_pool_check(const fl_kv_pool *p);

#endif
