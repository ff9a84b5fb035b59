/*
 * mask_cache.h - token masks of constrained requests, kept by the state they were computed in.
 *
 * A guided request's mask (which tokens of the vocabulary may come next) is a function of its
 * recognizer's state: for a regex, the pattern and the DFA state after the text so far
 * (fl_regex_guide_key).  A permissive pattern meets the same state at almost every token, and
 * requests with the same pattern meet the same states, so the engine keeps masks by a 128-bit
 * key of that state: a state met again costs one lookup instead of a check per token (vLLM and
 * outlines build such an index from states to token sets ahead of time; this one fills as the
 * states are met and keeps the most recently used).
 *
 * Bounded: n_masks masks of n_vocab bits, in one block allocated with the cache (MISC), so the
 * plan counts it exactly (fl_mask_cache_bytes); the least recently used mask makes room.  Keys
 * are 128-bit hashes (XXH3): two states are taken as the same where their keys are equal.
 * Not thread-safe: owned by the engine's driver thread.
 */
#ifndef FL_MASK_CACHE_H
#define FL_MASK_CACHE_H

#include "fitllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FL_MASK_CACHE_DEFAULT 256 /* masks an engine keeps unless told (fl_engine_params.guide_masks) */

typedef struct fl_mask_cache fl_mask_cache;

/* 64-bit words of one mask */
static inline size_t fl_mask_words(int32_t n_vocab) { return ((size_t)n_vocab + 63) / 64; }

/* What a cache of n_masks masks over n_vocab tokens allocates (0 for n_masks <= 0): the struct,
 * the slots (key, links), the masks, one working mask and the hash buckets (a power of two >= 2 x
 * n_masks, 4 B each). */
static inline uint64_t fl_mask_cache_bytes(int32_t n_masks, int32_t n_vocab) {
    if (n_masks <= 0) return 0;
    uint64_t nb = 16;
    while (nb < 2 * (uint64_t)n_masks) nb *= 2;
    return 128 + (uint64_t)n_masks * 32 + ((uint64_t)n_masks + 1) * fl_mask_words(n_vocab) * 8 + nb * 4;
}

fl_status fl_mask_cache_new(int32_t n_masks, int32_t n_vocab, fl_mask_cache **out);
void fl_mask_cache_free(fl_mask_cache *c);

/* The mask kept for key (bit t of word t / 64: token t may come next), now the most recently
 * used; NULL where none is. */
const uint64_t *fl_mask_cache_get(fl_mask_cache *c, const uint8_t key[16]);

/* A mask to compute into (fl_mask_words(n_vocab) words, contents undefined), then
 * fl_mask_cache_put(c, key) keeps it under key (the least recently used mask making room); the
 * working mask stays valid until the next put. */
uint64_t *fl_mask_cache_work(fl_mask_cache *c);
void fl_mask_cache_put(fl_mask_cache *c, const uint8_t key[16]);

typedef struct fl_mask_cache_stats {
    int64_t hits, misses, evictions;
    int32_t n_kept, n_masks;
} fl_mask_cache_stats;
void fl_mask_cache_get_stats(const fl_mask_cache *c, fl_mask_cache_stats *s);

#endif
