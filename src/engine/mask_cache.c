/* Token masks by state key, least recently used out (mask_cache.h). */
#include "engine/mask_cache.h"
#include "core/alloc.h"
#include "core/status.h"

#include <string.h>

typedef struct slot {
    uint8_t key[16];
    int32_t prev, next; /* the recency list (-1 at its ends) */
    int32_t chain;      /* the next slot in its bucket, -1 */
    int32_t mask;       /* which of the n_masks + 1 masks is its */
} slot;

struct fl_mask_cache {
    size_t bytes, words;
    int32_t n_masks, n_kept, n_buckets;
    int32_t head, tail; /* most and least recently used */
    int32_t work;       /* the mask that is not a slot's */
    int64_t hits, misses, evictions;
    slot *slots;
    uint64_t *masks;
    int32_t *buckets;
};
_Static_assert(sizeof(struct fl_mask_cache) <= 128, "fl_mask_cache_bytes counts 128 B for the struct");
_Static_assert(sizeof(slot) == 32, "fl_mask_cache_bytes counts 32 B per slot");

fl_status fl_mask_cache_new(int32_t n_masks, int32_t n_vocab, fl_mask_cache **out) {
    *out = NULL;
    if (n_masks <= 0 || n_vocab <= 0 || n_masks > (1 << 24))
        return fl_set_error(FL_ERR_INVALID, "mask cache: %d masks of %d tokens", n_masks, n_vocab);
    const size_t bytes = (size_t)fl_mask_cache_bytes(n_masks, n_vocab);
    char *p = fl_alloc(FL_MEM_MISC, bytes, 64);
    if (!p) return fl_set_error(FL_ERR_NOMEM, "mask cache: no memory for %d masks (%zu bytes)", n_masks, bytes);
    fl_mask_cache *c = (fl_mask_cache *)p;
    memset(c, 0, sizeof *c);
    c->bytes = bytes;
    c->words = fl_mask_words(n_vocab);
    c->n_masks = n_masks;
    c->n_buckets = 16;
    while (c->n_buckets < 2 * n_masks) c->n_buckets *= 2;
    c->slots = (slot *)(p + 128);
    c->masks = (uint64_t *)(p + 128 + (size_t)n_masks * sizeof(slot));
    c->buckets = (int32_t *)(c->masks + ((size_t)n_masks + 1) * c->words);
    for (int32_t b = 0; b < c->n_buckets; b++) c->buckets[b] = -1;
    c->head = c->tail = -1;
    c->work = n_masks;
    *out = c;
    return FL_OK;
}

void fl_mask_cache_free(fl_mask_cache *c) {
    if (c) fl_free(FL_MEM_MISC, c, c->bytes);
}

static int32_t bucket_of(const fl_mask_cache *c, const uint8_t key[16]) {
    uint32_t h;
    memcpy(&h, key, sizeof h);
    return (int32_t)(h & (uint32_t)(c->n_buckets - 1));
}

static void unlink_recent(fl_mask_cache *c, int32_t i) {
    slot *s = &c->slots[i];
    if (s->prev >= 0) c->slots[s->prev].next = s->next;
    else c->head = s->next;
    if (s->next >= 0) c->slots[s->next].prev = s->prev;
    else c->tail = s->prev;
}

static void push_front(fl_mask_cache *c, int32_t i) {
    slot *s = &c->slots[i];
    s->prev = -1;
    s->next = c->head;
    if (c->head >= 0) c->slots[c->head].prev = i;
    c->head = i;
    if (c->tail < 0) c->tail = i;
}

static int32_t find(const fl_mask_cache *c, const uint8_t key[16]) {
    for (int32_t i = c->buckets[bucket_of(c, key)]; i >= 0; i = c->slots[i].chain)
        if (memcmp(c->slots[i].key, key, 16) == 0) return i;
    return -1;
}

const uint64_t *fl_mask_cache_get(fl_mask_cache *c, const uint8_t key[16]) {
    const int32_t i = find(c, key);
    if (i < 0) {
        c->misses++;
        return NULL;
    }
    c->hits++;
    unlink_recent(c, i);
    push_front(c, i);
    return c->masks + (size_t)c->slots[i].mask * c->words;
}

uint64_t *fl_mask_cache_work(fl_mask_cache *c) { return c->masks + (size_t)c->work * c->words; }

void fl_mask_cache_put(fl_mask_cache *c, const uint8_t key[16]) {
    int32_t i = find(c, key);
    if (i >= 0) unlink_recent(c, i); /* (kept already: the new mask replaces it; it is the same) */
    else {
        if (c->n_kept < c->n_masks) {
            i = c->n_kept++;
            c->slots[i].mask = i;
        } else { /* the least recently used makes room */
            i = c->tail;
            unlink_recent(c, i);
            int32_t *pp = &c->buckets[bucket_of(c, c->slots[i].key)];
            while (*pp != i) pp = &c->slots[*pp].chain;
            *pp = c->slots[i].chain;
            c->evictions++;
        }
        memcpy(c->slots[i].key, key, 16);
        const int32_t b = bucket_of(c, key);
        c->slots[i].chain = c->buckets[b];
        c->buckets[b] = i;
    }
    const int32_t m = c->slots[i].mask; /* the work mask becomes the slot's, the old one the work */
    c->slots[i].mask = c->work;
    c->work = m;
    push_front(c, i);
}

void fl_mask_cache_get_stats(const fl_mask_cache *c, fl_mask_cache_stats *s) {
    memset(s, 0, sizeof *s);
    if (!c) return;
    s->hits = c->hits;
    s->misses = c->misses;
    s->evictions = c->evictions;
    s->n_kept = c->n_kept;
    s->n_masks = c->n_masks;
}
