/* Scheduler block accounting over the paged cache or contiguous slots (see kv_adapter.h). */
#include "engine/kv_adapter.h"

#include "core/alloc.h"
#include "core/status.h"

#include <string.h>

struct fl_kv_adapter {
    int paged;
    fl_kv_cache *kv;          /* paged */
    void *slots_kv;           /* contiguous */
    void (*clear)(void *kv, int32_t slot);
    int32_t n_ctx;            /* contiguous: tokens per slot */
    int32_t n_ids;            /* sequence ids (paged) or slots (contiguous) */
    int32_t *free_ids;        /* stack of free ids */
    int32_t n_free_ids;
    int32_t *promised;        /* [n_ids] blocks promised this step, per id */
    int64_t promised_total;
    int32_t *tokens;          /* [n_ids] contiguous: tokens in each slot */
};

static int32_t take_id(fl_kv_adapter *a) { return a->n_free_ids ? a->free_ids[--a->n_free_ids] : -1; }
static void put_id(fl_kv_adapter *a, int32_t id) { a->free_ids[a->n_free_ids++] = id; }

static void drop_promise(fl_kv_adapter *a, int32_t id) {
    a->promised_total -= a->promised[id];
    a->promised[id] = 0;
}

/* ---- paged ---- */

static int64_t pg_n_free(void *ctx) {
    fl_kv_adapter *a = ctx;
    return fl_kv_blocks_free(a->kv) - a->promised_total; /* O(1); fl_kv_stats_get walks every table */
}

static fl_status pg_seq_begin(void *ctx, fl_request *r, int32_t *n_cached) {
    fl_kv_adapter *a = ctx;
    int32_t id = take_id(a);
    if (id < 0) return FL_NO_KV_SPACE;
    /* prompt logprobs need every prompt position's logits, a mean-pooled embedding every
     * position's state: no cached prefix (the blocks it computes are still cached for others) */
    const int32_t n_match = fl_request_plp_pending(r) || r->pooling == FL_POOLING_MEAN ? 1 : r->n_tokens; /* (mean
                                                                                                          * pooling: every state) */
    fl_status st = r->cache_salt
                       ? fl_kv_seq_add_keyed(a->kv, id, r->tokens, n_match, &r->cache_salt, sizeof r->cache_salt, n_cached)
                       : fl_kv_seq_add(a->kv, id, r->tokens, n_match, n_cached);
    if (st != FL_OK) {
        put_id(a, id);
        return st;
    }
    r->kv_seq = id;
    return FL_OK;
}

static int64_t pg_n_needed(void *ctx, const fl_request *r, int32_t n_total) {
    fl_kv_adapter *a = ctx;
    int32_t id = (int32_t)r->kv_seq;
    if (fl_kv_seq_swapped(a->kv, id)) {
        /* swap-in blocks, plus the growth past the swapped tokens */
        int64_t bs = fl_kv_adapter_block_size(a);
        int64_t grow = (n_total + bs - 1) / bs - (r->n_computed + bs - 1) / bs;
        return fl_kv_seq_blocks_needed(a->kv, id, 0) + (grow > 0 ? grow : 0);
    }
    int32_t len = fl_kv_seq_len(a->kv, id);
    int64_t need = fl_kv_seq_blocks_needed(a->kv, id, n_total - (len > 0 ? len : 0)) - a->promised[id];
    return need > 0 ? need : 0;
}

static fl_status pg_reserve(void *ctx, fl_request *r, int32_t n_total) {
    fl_kv_adapter *a = ctx;
    int64_t need = pg_n_needed(ctx, r, n_total);
    if (need > pg_n_free(ctx)) return FL_NO_KV_SPACE;
    a->promised[r->kv_seq] += (int32_t)need;
    a->promised_total += need;
    return FL_OK;
}

static void pg_seq_end(void *ctx, fl_request *r) {
    fl_kv_adapter *a = ctx;
    int32_t id = (int32_t)r->kv_seq;
    fl_kv_seq_free(a->kv, id);
    drop_promise(a, id);
    put_id(a, id);
    r->kv_seq = -1;
}

static fl_status pg_swap_out(void *ctx, fl_request *r) {
    fl_kv_adapter *a = ctx;
    fl_status st = fl_kv_seq_swap_out(a->kv, (int32_t)r->kv_seq);
    if (st == FL_OK) drop_promise(a, (int32_t)r->kv_seq);
    return st;
}

static fl_status pg_swap_in(void *ctx, fl_request *r) {
    fl_kv_adapter *a = ctx;
    if (fl_kv_seq_blocks_needed(a->kv, (int32_t)r->kv_seq, 0) > pg_n_free(ctx)) return FL_NO_KV_SPACE;
    return fl_kv_seq_swap_in(a->kv, (int32_t)r->kv_seq);
}

static fl_status pg_fork(void *ctx, fl_request *parent, fl_request *child, int32_t n_tokens) {
    fl_kv_adapter *a = ctx;
    if (fl_kv_seq_len(a->kv, (int32_t)parent->kv_seq) != n_tokens) return FL_ERR_UNSUPPORTED;
    int32_t id = take_id(a);
    if (id < 0) return FL_NO_KV_SPACE;
    fl_status st = fl_kv_seq_fork(a->kv, (int32_t)parent->kv_seq, id);
    if (st != FL_OK) {
        put_id(a, id);
        return st;
    }
    child->kv_seq = id;
    return FL_OK;
}

static fl_status pg_truncate(void *ctx, fl_request *r, int32_t n_total) {
    fl_kv_adapter *a = ctx;
    return fl_kv_seq_truncate(a->kv, (int32_t)r->kv_seq, n_total);
}

/* ---- contiguous slots ---- */

static int64_t sl_n_free(void *ctx) {
    fl_kv_adapter *a = ctx;
    return a->n_free_ids;
}
static fl_status sl_seq_begin(void *ctx, fl_request *r, int32_t *n_cached) {
    fl_kv_adapter *a = ctx;
    int32_t id = take_id(a);
    if (id < 0) return FL_NO_KV_SPACE;
    a->clear(a->slots_kv, id);
    a->tokens[id] = 0;
    r->kv_seq = id;
    *n_cached = 0;
    return FL_OK;
}
static int64_t sl_n_needed(void *ctx, const fl_request *r, int32_t n_total) {
    (void)ctx;
    (void)r;
    (void)n_total;
    return 0; /* the slot taken at seq_begin holds the whole sequence */
}
static fl_status sl_reserve(void *ctx, fl_request *r, int32_t n_total) {
    fl_kv_adapter *a = ctx;
    return n_total <= a->n_ctx ? FL_OK : FL_NO_KV_SPACE;
}
static void sl_seq_end(void *ctx, fl_request *r) {
    fl_kv_adapter *a = ctx;
    a->clear(a->slots_kv, (int32_t)r->kv_seq);
    put_id(a, (int32_t)r->kv_seq);
    r->kv_seq = -1;
}

/* ---- common ---- */

size_t fl_kv_adapter_misc_bytes(int32_t n_ids) { return sizeof(fl_kv_adapter) + 3 * sizeof(int32_t) * (size_t)n_ids; }

static fl_status adapter_new(int32_t n_ids, fl_kv_adapter **out) {
    fl_kv_adapter *a = fl_calloc(FL_MEM_MISC, 1, sizeof *a);
    if (!a) return FL_ERR_NOMEM;
    a->n_ids = n_ids;
    a->free_ids = fl_calloc(FL_MEM_MISC, (size_t)n_ids, sizeof(int32_t));
    a->promised = fl_calloc(FL_MEM_MISC, (size_t)n_ids, sizeof(int32_t));
    a->tokens = fl_calloc(FL_MEM_MISC, (size_t)n_ids, sizeof(int32_t));
    if (!a->free_ids || !a->promised || !a->tokens) {
        fl_kv_adapter_free(a);
        return FL_ERR_NOMEM;
    }
    for (int32_t i = n_ids - 1; i >= 0; i--) put_id(a, i); /* id 0 handed out first */
    *out = a;
    return FL_OK;
}

fl_status fl_kv_adapter_new_paged(fl_kv_cache *kv, int32_t n_seq_max, fl_kv_adapter **out) {
    *out = NULL;
    if (!kv || n_seq_max < 1) return fl_set_error(FL_ERR_INVALID, "%s: no cache or n_seq_max < 1", __func__);
    fl_status st = adapter_new(n_seq_max, out);
    if (st != FL_OK) return st;
    (*out)->paged = 1;
    (*out)->kv = kv;
    return FL_OK;
}

fl_status fl_kv_adapter_new_slots(void *kv, int32_t n_slots, int32_t n_ctx, void (*clear)(void *kv, int32_t slot),
                                  fl_kv_adapter **out) {
    *out = NULL;
    if (!kv || n_slots < 1 || n_ctx < 1 || !clear)
        return fl_set_error(FL_ERR_INVALID, "%s: bad slots (%d x %d tokens)", __func__, n_slots, n_ctx);
    fl_status st = adapter_new(n_slots, out);
    if (st != FL_OK) return st;
    (*out)->slots_kv = kv;
    (*out)->n_ctx = n_ctx;
    (*out)->clear = clear;
    return FL_OK;
}

void fl_kv_adapter_free(fl_kv_adapter *a) {
    if (!a) return;
    fl_free(FL_MEM_MISC, a->free_ids, (size_t)a->n_ids * sizeof(int32_t));
    fl_free(FL_MEM_MISC, a->promised, (size_t)a->n_ids * sizeof(int32_t));
    fl_free(FL_MEM_MISC, a->tokens, (size_t)a->n_ids * sizeof(int32_t));
    fl_free(FL_MEM_MISC, a, sizeof *a);
}

fl_sched_kv fl_kv_adapter_iface(fl_kv_adapter *a) {
    if (a->paged) return (fl_sched_kv){a, pg_n_free, pg_seq_begin, pg_n_needed, pg_reserve, pg_seq_end,
                                       pg_swap_out, pg_swap_in, pg_fork, pg_truncate};
    return (fl_sched_kv){a, sl_n_free, sl_seq_begin, sl_n_needed, sl_reserve, sl_seq_end, NULL, NULL, NULL, NULL};
}

void fl_kv_adapter_step_done(fl_kv_adapter *a) {
    memset(a->promised, 0, (size_t)a->n_ids * sizeof(int32_t));
    a->promised_total = 0;
}

int64_t fl_kv_adapter_n_blocks(const fl_kv_adapter *a) {
    if (!a->paged) return a->n_ids;
    fl_kv_stats st;
    fl_kv_stats_get(a->kv, &st);
    return st.n_blocks_total;
}

int32_t fl_kv_adapter_block_size(const fl_kv_adapter *a) {
    return a->paged ? fl_kv_config_get(a->kv)->block_size ? fl_kv_config_get(a->kv)->block_size : 16 : a->n_ctx;
}

void fl_kv_adapter_stats(fl_kv_adapter *a, fl_backend_kv_stats *o) {
    memset(o, 0, sizeof *o);
    if (a->paged) {
        fl_kv_stats st;
        fl_kv_stats_get(a->kv, &st);
        o->blocks_total = st.n_blocks_total;
        o->blocks_used = st.n_blocks_used;
        o->blocks_free = st.n_blocks_free;
        o->blocks_cached = st.n_blocks_cached;
        o->slots_allocated = st.slots_allocated;
        o->tokens_live = st.tokens_live;
        o->evictions = st.evictions;
        o->bytes_total = st.bytes_total;
        return;
    }
    o->blocks_total = a->n_ids;
    o->blocks_used = a->n_ids - a->n_free_ids;
    o->blocks_free = a->n_free_ids;
    o->slots_allocated = o->blocks_used * (int64_t)a->n_ctx;
}
