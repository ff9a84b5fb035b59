/* KV block pool: refcounts, LRU free list, hash map (see block_pool.h). */
#include "kv/block_pool.h"

#include "core/alloc.h"
#include "core/status.h"

#include <string.h>

typedef struct blk {
    int32_t ref;        /* reference count; 0 = on the free list */
    int32_t prev, next; /* free-list links (-1 = none) */
    int32_t hnext;      /* next block in the same hash bucket (-1 = end) */
    bool cached;        /* hash is valid and the block is in the map */
    fl_kv_hash hash;
} blk;

struct fl_kv_pool {
    int32_t n_blocks;
    int32_t n_free, n_cached;
    int32_t head, tail; /* free list: head = next to evict */
    int64_t evictions;
    uint32_t n_buckets; /* power of two */
    int32_t *buckets;   /* [n_buckets] first block of each chain, -1 = empty */
    blk *b;             /* [n_blocks] */
};

static uint32_t bucket_of(const fl_kv_pool *p, const fl_kv_hash *h) { return (uint32_t)(h->lo ^ (h->hi >> 7)) & (p->n_buckets - 1); }

static uint32_t n_buckets_for(int32_t n_blocks) { return (uint32_t)fl_cap_double(16, n_blocks); }

size_t fl_kv_pool_misc_bytes(int32_t n_blocks) {
    return n_blocks < 2 ? 0 : sizeof(fl_kv_pool) + sizeof(int32_t) * n_buckets_for(n_blocks) + sizeof(blk) * (size_t)n_blocks;
}

size_t fl_kv_pool_block_misc_bytes(void) { return sizeof(blk) + 2 * sizeof(int32_t); }

fl_kv_pool *fl_kv_pool_new(int32_t n_blocks) {
    if (n_blocks < 2) {
        fl_set_error(FL_ERR_INVALID, "%s: need at least 2 blocks (1 null + 1 usable), got %d", __func__, n_blocks);
        return NULL;
    }
    fl_kv_pool *p = fl_calloc(FL_MEM_MISC, 1, sizeof *p);
    if (!p) return NULL;
    p->n_blocks = n_blocks;
    p->n_buckets = n_buckets_for(n_blocks);
    p->buckets = fl_alloc(FL_MEM_MISC, sizeof(int32_t) * p->n_buckets, 0);
    p->b = fl_calloc(FL_MEM_MISC, (size_t)n_blocks, sizeof(blk));
    if (!p->buckets || !p->b) {
        fl_kv_pool_free(p);
        return NULL;
    }
    memset(p->buckets, 0xff, sizeof(int32_t) * p->n_buckets);
    /* block 0: the null block, permanently referenced, never on the free list */
    p->b[0] = (blk){.ref = 1, .prev = -1, .next = -1, .hnext = -1};
    for (int32_t i = 1; i < n_blocks; i++)
        p->b[i] = (blk){.ref = 0, .prev = i > 1 ? i - 1 : -1, .next = i + 1 < n_blocks ? i + 1 : -1, .hnext = -1};
    p->head = 1;
    p->tail = n_blocks - 1;
    p->n_free = n_blocks - 1;
    return p;
}

void fl_kv_pool_free(fl_kv_pool *p) {
    if (!p) return;
    fl_free(FL_MEM_MISC, p->buckets, sizeof(int32_t) * p->n_buckets);
    fl_free(FL_MEM_MISC, p->b, sizeof(blk) * (size_t)p->n_blocks);
    fl_free(FL_MEM_MISC, p, sizeof *p);
}

static void list_remove(fl_kv_pool *p, int32_t id) {
    blk *x = &p->b[id];
    if (x->prev >= 0) p->b[x->prev].next = x->next; else p->head = x->next;
    if (x->next >= 0) p->b[x->next].prev = x->prev; else p->tail = x->prev;
    x->prev = x->next = -1;
    p->n_free--;
}

static void list_push_tail(fl_kv_pool *p, int32_t id) {
    blk *x = &p->b[id];
    x->prev = p->tail;
    x->next = -1;
    if (p->tail >= 0) p->b[p->tail].next = id; else p->head = id;
    p->tail = id;
    p->n_free++;
}

static void list_push_head(fl_kv_pool *p, int32_t id) {
    blk *x = &p->b[id];
    x->prev = -1;
    x->next = p->head;
    if (p->head >= 0) p->b[p->head].prev = id; else p->tail = id;
    p->head = id;
    p->n_free++;
}

void fl_kv_pool_drop_hash(fl_kv_pool *p, int32_t id) {
    FL_ASSERT(id > 0 && id < p->n_blocks);
    blk *x = &p->b[id];
    if (!x->cached) return;
    int32_t *link = &p->buckets[bucket_of(p, &x->hash)];
    while (*link != id) {
        FL_ASSERT(*link >= 0);
        link = &p->b[*link].hnext;
    }
    *link = x->hnext;
    x->hnext = -1;
    x->cached = false;
    p->n_cached--;
}

int32_t fl_kv_pool_alloc(fl_kv_pool *p) {
    const int32_t id = p->head;
    if (id < 0) return -1;
    list_remove(p, id);
    if (p->b[id].cached) {
        fl_kv_pool_drop_hash(p, id);
        p->evictions++;
    }
    p->b[id].ref = 1;
    return id;
}

void fl_kv_pool_ref(fl_kv_pool *p, int32_t id) {
    FL_ASSERT(id > 0 && id < p->n_blocks);
    if (p->b[id].ref++ == 0) list_remove(p, id);
}

void fl_kv_pool_unref(fl_kv_pool *p, int32_t id) {
    FL_ASSERT(id > 0 && id < p->n_blocks && p->b[id].ref > 0);
    if (--p->b[id].ref == 0) {
        if (p->b[id].cached) list_push_tail(p, id);
        else list_push_head(p, id);
    }
}

int32_t fl_kv_pool_refcount(const fl_kv_pool *p, int32_t id) {
    FL_ASSERT(id >= 0 && id < p->n_blocks);
    return p->b[id].ref;
}

int32_t fl_kv_pool_n_total(const fl_kv_pool *p) { return p->n_blocks - 1; }
int32_t fl_kv_pool_n_free(const fl_kv_pool *p) { return p->n_free; }
int32_t fl_kv_pool_n_used(const fl_kv_pool *p) { return p->n_blocks - 1 - p->n_free; }
int32_t fl_kv_pool_n_cached(const fl_kv_pool *p) { return p->n_cached; }
int64_t fl_kv_pool_evictions(const fl_kv_pool *p) { return p->evictions; }

int32_t fl_kv_pool_lookup(const fl_kv_pool *p, const fl_kv_hash *h) {
    for (int32_t id = p->buckets[bucket_of(p, h)]; id >= 0; id = p->b[id].hnext)
        if (p->b[id].hash.lo == h->lo && p->b[id].hash.hi == h->hi) return id;
    return -1;
}

bool fl_kv_pool_set_hash(fl_kv_pool *p, int32_t id, const fl_kv_hash *h) {
    FL_ASSERT(id > 0 && id < p->n_blocks);
    blk *x = &p->b[id];
    if (x->cached || fl_kv_pool_lookup(p, h) >= 0) return false;
    const uint32_t bk = bucket_of(p, h);
    x->hash = *h;
    x->cached = true;
    x->hnext = p->buckets[bk];
    p->buckets[bk] = id;
    p->n_cached++;
    return true;
}

bool fl_kv_pool_has_hash(const fl_kv_pool *p, int32_t id) {
    FL_ASSERT(id >= 0 && id < p->n_blocks);
    return p->b[id].cached;
}

fl_status fl_kv_pool_check(const fl_kv_pool *p) {
    if (p->b[0].ref != 1 || p->b[0].cached) return fl_set_error(FL_ERR_INTERNAL, "%s: null block touched", __func__);
    int32_t n_zero = 0, n_list = 0, n_cached = 0, n_chained = 0;
    for (int32_t i = 1; i < p->n_blocks; i++) {
        if (p->b[i].ref < 0) return fl_set_error(FL_ERR_INTERNAL, "%s: block %d refcount %d", __func__, i, p->b[i].ref);
        n_zero += p->b[i].ref == 0;
        n_cached += p->b[i].cached;
    }
    for (int32_t id = p->head, prev = -1; id >= 0; prev = id, id = p->b[id].next) {
        if (p->b[id].ref != 0) return fl_set_error(FL_ERR_INTERNAL, "%s: block %d on free list with ref %d", __func__, id, p->b[id].ref);
        if (p->b[id].prev != prev) return fl_set_error(FL_ERR_INTERNAL, "%s: free list broken at %d", __func__, id);
        if (++n_list > p->n_blocks) return fl_set_error(FL_ERR_INTERNAL, "%s: free list cycle", __func__);
    }
    if (n_list != n_zero || n_list != p->n_free)
        return fl_set_error(FL_ERR_INTERNAL, "%s: free list %d, refcount-0 blocks %d, n_free %d", __func__, n_list, n_zero, p->n_free);
    if (p->n_free + fl_kv_pool_n_used(p) != p->n_blocks - 1) return fl_set_error(FL_ERR_INTERNAL, "%s: free + used != total", __func__);
    for (uint32_t bk = 0; bk < p->n_buckets; bk++)
        for (int32_t id = p->buckets[bk]; id >= 0; id = p->b[id].hnext) {
            if (!p->b[id].cached || bucket_of(p, &p->b[id].hash) != bk)
                return fl_set_error(FL_ERR_INTERNAL, "%s: block %d misplaced in the hash map", __func__, id);
            if (fl_kv_pool_lookup(p, &p->b[id].hash) != id)
                return fl_set_error(FL_ERR_INTERNAL, "%s: hash of block %d held twice", __func__, id);
            if (++n_chained > p->n_blocks) return fl_set_error(FL_ERR_INTERNAL, "%s: hash chain cycle", __func__);
        }
    if (n_chained != n_cached || n_cached != p->n_cached)
        return fl_set_error(FL_ERR_INTERNAL, "%s: map holds %d blocks, %d flagged, count %d", __func__, n_chained, n_cached, p->n_cached);
    return FL_OK;
}
