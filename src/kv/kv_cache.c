/* The paged KV cache (see kv_cache.h). */
#include "kv/kv_cache.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kv/block_pool.h"
#include "kernels/convert.h"
#include "kv/block_table.h"
#include "kv/kv_quant.h"
#include "kv/paged_attn.h"
#include "kv/prefix_cache.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* First capacities of the growing arrays (fl_kv_seq_misc_bytes / fl_kv_step_misc_bytes follow them) */
#define TOK_CAP0 64  /* a sequence's token ids */
#define SLOT_CAP0 64 /* a step's slot arrays */
#define SEG_CAP0 16  /* a step's segments */

typedef struct seq {
    bool used, swapped;
    bool no_cache;       /* stop registering blocks (shifted, or fed without token ids) */
    int32_t n;           /* positions stored: 0 .. n-1 */
    fl_kv_table tab;     /* logical -> physical blocks */
    int32_t *tok;        /* [tok_cap] token id at each position */
    int32_t tok_cap;
    int32_t n_hashed;    /* leading full blocks whose chain hash is known */
    fl_kv_hash chain;    /* hash of block n_hashed-1, or the root */
    fl_kv_hash root;     /* the chain's root (the sequence's key) */
    int64_t *swap;       /* [swap_cap] swap slot of each table entry while swapped (-1 = null) */
    int32_t swap_cap;
    uint32_t batch_gen;  /* last prepare that named this sequence */
} seq;

struct fl_kv_cache {
    fl_kv_config cfg;
    void *key;            /* copy of cfg.hash_key */
    fl_kv_hash root;      /* chain root for the default key */
    int32_t bs, n_blocks, part_blocks, n_row;
    size_t row_bytes;     /* one token row of one layer's K (or V) */
    size_t block_bytes;   /* bs * row_bytes */
    size_t bytes_per_block;
    float scale_max;      /* fp8 max, 0 for unscaled types */
    uint8_t *data;        /* [n_layer][2][n_blocks-1][bs][row_bytes] */
    size_t data_bytes;
    float *scales;        /* fp8: [n_layer][2][n_blocks-1][n_head_kv] */
    size_t scales_bytes;
    fl_kv_pool *pool;
    fl_kv_prefix *prefix;
    seq *seqs;            /* [n_seq_max] */
    int32_t *drop;        /* [n_blocks] scratch: references a prepare will give up */
    /* the batch last prepared */
    int32_t b_n_tokens;
    uint32_t gen;
    int32_t *slot_blk, *slot_off;          /* [n_tokens] where each token's K/V go */
    int32_t slot_blk_cap, slot_off_cap;
    fl_paged_seq *segs;   /* [n_seg] one per sequence of the batch */
    int32_t *seg_seq;
    int32_t n_seg, seg_cap;
    void *ws;             /* attention workspace (FL_MEM_SCRATCH) */
    size_t ws_bytes;
    float *rowbuf;        /* [n_row] scratch for shift and fp8 re-encoding (MISC) */
    /* counters */
    int64_t hit, miss, cow, swap_outs, swap_ins, shifted;
    /* swap tier */
    int fd;
    int64_t swap_hw;      /* slots ever used in the file */
    int64_t *swap_free;   /* stack of free slots */
    int64_t n_swap_free, swap_free_cap;
};

/* ---- sizes and storage addressing ---- */

static size_t scale_bytes_of(const fl_kv_config *c) { return fl_kv_type_scaled(c->type) ? sizeof(float) * (size_t)c->n_head_kv : 0; }

size_t fl_kv_bytes_per_block(const fl_kv_config *c) {
    const int32_t bs = c->block_size > 0 ? c->block_size : 16;
    const size_t row = fl_kv_row_bytes(c->type, (int64_t)c->n_head_kv * c->head_dim);
    return (size_t)c->n_layer * 2 * ((size_t)bs * row + scale_bytes_of(c));
}

size_t fl_kv_bytes_per_token(const fl_kv_config *c) {
    const int32_t bs = c->block_size > 0 ? c->block_size : 16;
    return fl_kv_bytes_per_block(c) / (size_t)bs;
}

/* Row `slot` of block id in layer il, which = 0 (K) or 1 (V). */
static uint8_t *row_ptr(const fl_kv_cache *kv, int32_t il, int which, int32_t id, int32_t slot) {
    const size_t plane = (size_t)(kv->n_blocks - 1) * kv->block_bytes;
    return kv->data + ((size_t)il * 2 + (size_t)which) * plane + (size_t)(id - 1) * kv->block_bytes + (size_t)slot * kv->row_bytes;
}

/* The fp8 scales of block id (n_head_kv floats), or NULL for unscaled types. */
static float *scale_ptr(const fl_kv_cache *kv, int32_t il, int which, int32_t id) {
    if (!kv->scales) return NULL;
    const size_t plane = (size_t)(kv->n_blocks - 1) * (size_t)kv->cfg.n_head_kv;
    return kv->scales + ((size_t)il * 2 + (size_t)which) * plane + (size_t)(id - 1) * (size_t)kv->cfg.n_head_kv;
}

/* Encode one token row x[n_row] into row `slot` of block id.  fp8: per kv head, grow the
 * block's scale if x needs it, re-encoding the rows already in the block with the new one. */
static void write_row(fl_kv_cache *kv, int32_t il, int which, int32_t id, int32_t slot, const float *x) {
    uint8_t *dst = row_ptr(kv, il, which, id, slot);
    float *sc = scale_ptr(kv, il, which, id);
    if (!sc) {
        fl_kv_quant(kv->cfg.type, x, dst, kv->n_row, 1.0f);
        return;
    }
    const int32_t hd = kv->cfg.head_dim;
    for (int32_t h = 0; h < kv->cfg.n_head_kv; h++) {
        const float *xh = x + (size_t)h * (size_t)hd;
        float amax = 0.0f;
        for (int32_t d = 0; d < hd; d++) amax = fmaxf(amax, fabsf(xh[d]));
        const float need = amax / kv->scale_max;
        if (need > sc[h]) {
            if (sc[h] > 0.0f)
                for (int32_t j = 0; j < slot; j++) {
                    uint8_t *rj = row_ptr(kv, il, which, id, j);
                    fl_kv_dequant(kv->cfg.type, rj, (int64_t)h * hd, hd, sc[h], kv->rowbuf);
                    fl_kv_quant(kv->cfg.type, kv->rowbuf, rj + (size_t)h * (size_t)hd, hd, need);
                }
            sc[h] = need;
        }
        fl_kv_quant(kv->cfg.type, xh, dst + (size_t)h * (size_t)hd, hd, sc[h]);
    }
}

static void read_row(const fl_kv_cache *kv, int32_t il, int which, int32_t id, int32_t slot, float *x) {
    const float *sc = scale_ptr(kv, il, which, id);
    const int32_t hd = kv->cfg.head_dim;
    const uint8_t *src = row_ptr(kv, il, which, id, slot);
    if (!sc) {
        fl_kv_dequant(kv->cfg.type, src, 0, kv->n_row, 1.0f, x);
        return;
    }
    for (int32_t h = 0; h < kv->cfg.n_head_kv; h++)
        fl_kv_dequant(kv->cfg.type, src, (int64_t)h * hd, hd, sc[h], x + (size_t)h * (size_t)hd);
}

static void zero_scales(fl_kv_cache *kv, int32_t id) {
    if (!kv->scales) return;
    for (int32_t il = 0; il < kv->cfg.n_layer; il++)
        for (int w = 0; w < 2; w++) memset(scale_ptr(kv, il, w, id), 0, sizeof(float) * (size_t)kv->cfg.n_head_kv);
}

/* Copy block src's contents (all layers, K and V, scales) into block dst. */
static void copy_block(fl_kv_cache *kv, int32_t dst, int32_t src) {
    for (int32_t il = 0; il < kv->cfg.n_layer; il++)
        for (int w = 0; w < 2; w++) {
            memcpy(row_ptr(kv, il, w, dst, 0), row_ptr(kv, il, w, src, 0), kv->block_bytes);
            if (kv->scales) memcpy(scale_ptr(kv, il, w, dst), scale_ptr(kv, il, w, src), sizeof(float) * (size_t)kv->cfg.n_head_kv);
        }
}

/* ---- creation ---- */

static void cfg_defaults(fl_kv_config *c) {
    if (c->block_size == 0) c->block_size = 16;
    if (c->n_seq_max == 0) c->n_seq_max = 256;
}

/* Blocks of the pool, the null block included (cfg with its defaults). */
static int64_t pool_blocks(const fl_kv_config *c, size_t bpb) {
    int64_t nb = c->mem_bytes ? (int64_t)(c->mem_bytes / bpb) + 1 : c->n_blocks;
    return nb > INT32_MAX / 2 ? INT32_MAX / 2 : nb;
}

static const char *swap_dir_of(const fl_kv_config *cfg) { return cfg->swap_dir ? cfg->swap_dir : getenv("TMPDIR"); }

size_t fl_kv_misc_bytes(const fl_kv_config *cfg) {
    fl_kv_config c = *cfg;
    cfg_defaults(&c);
    const size_t bpb = fl_kv_bytes_per_block(&c);
    const int64_t nb = bpb ? pool_blocks(&c, bpb) : 0;
    if (nb < 2) return 0;
    const char *dir = swap_dir_of(cfg);
    return sizeof(fl_kv_cache) + (c.hash_key && c.hash_key_len ? c.hash_key_len : 0) + fl_kv_pool_misc_bytes((int32_t)nb) +
           (c.prefix_cache ? fl_kv_prefix_misc_bytes((int32_t)nb, c.block_size) : 0) + sizeof(seq) * (size_t)c.n_seq_max +
           sizeof(int32_t) * (size_t)nb + sizeof(float) * (size_t)c.n_head_kv * (size_t)c.head_dim + (dir ? strlen(dir) + 1 : 0);
}

size_t fl_kv_seq_misc_bytes(const fl_kv_config *cfg, int32_t n_pos) {
    const int32_t bs = cfg->block_size ? cfg->block_size : 16;
    if (n_pos < 1) n_pos = 1;
    return sizeof(int32_t) * (size_t)fl_cap_double(TOK_CAP0, n_pos) + sizeof(int32_t) * (size_t)fl_cap_double(FL_KV_TABLE_CAP0, (n_pos + bs - 1) / bs);
}

size_t fl_kv_step_misc_bytes(int32_t n_tokens) {
    if (n_tokens < 1) return 0;
    return 2 * sizeof(int32_t) * (size_t)fl_cap_double(SLOT_CAP0, n_tokens) + (sizeof(fl_paged_seq) + sizeof(int32_t)) * (size_t)fl_cap_double(SEG_CAP0, n_tokens);
}

size_t fl_kv_block_misc_bytes(const fl_kv_config *cfg) {
    const int32_t bs = cfg->block_size ? cfg->block_size : 16;
    return fl_kv_pool_block_misc_bytes() + sizeof(int32_t) /* drop */ +
           (cfg->prefix_cache ? fl_kv_prefix_misc_bytes(1, bs) - fl_kv_prefix_misc_bytes(0, bs) : 0);
}

fl_kv_cache *fl_kv_new(const fl_kv_config *cfg) {
    if (!cfg) {
        fl_set_error(FL_ERR_INVALID, "%s: no configuration", __func__);
        return NULL;
    }
    fl_kv_config c = *cfg;
    cfg_defaults(&c);
    if (c.n_rot == 0) c.n_rot = c.head_dim;
    if (c.rope_base == 0.0f) c.rope_base = 10000.0f;
    if (c.part_tokens == 0) c.part_tokens = 256;
    if (c.attn_scale == 0.0f && c.head_dim > 0) c.attn_scale = 1.0f / sqrtf((float)c.head_dim);
    if (c.n_layer < 1 || c.n_head_kv < 1 || c.head_dim < 1 || c.head_dim > 512 || c.n_head < c.n_head_kv ||
        c.n_head % c.n_head_kv || c.block_size < 1 || c.block_size > 1024 || c.n_seq_max < 1 || c.n_ctx < 0 ||
        c.window < 0 || c.n_rot < 0 || c.n_rot > c.head_dim || c.n_rot % 2 || c.part_tokens < 1) {
        fl_set_error(FL_ERR_INVALID, "%s: bad configuration (n_layer %d, n_head %d, n_head_kv %d, head_dim %d, block_size %d, "
                     "n_seq_max %d, window %d, n_rot %d)", __func__, c.n_layer, c.n_head, c.n_head_kv, c.head_dim,
                     c.block_size, c.n_seq_max, c.window, c.n_rot);
        return NULL;
    }
    if (!fl_kv_type_ok(c.type)) {
        fl_set_error(FL_ERR_UNSUPPORTED, "%s: KV type %s not supported (f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0)", __func__, fl_type_name(c.type));
        return NULL;
    }
    const size_t row = fl_kv_row_bytes(c.type, (int64_t)c.n_head_kv * c.head_dim);
    if (!row) {
        fl_set_error(FL_ERR_INVALID, "%s: a KV row of %d elements does not fit %s groups of 32", __func__, c.n_head_kv * c.head_dim, fl_type_name(c.type));
        return NULL;
    }
    const size_t bpb = fl_kv_bytes_per_block(&c);
    const int64_t nb = pool_blocks(&c, bpb);
    if (nb < 2) {
        fl_set_error(FL_ERR_BUDGET, "%s: KV budget of %zu bytes holds no block (one block = %zu bytes)", __func__, c.mem_bytes, bpb);
        return NULL;
    }
    fl_kv_cache *kv = fl_calloc(FL_MEM_MISC, 1, sizeof *kv);
    if (!kv) return NULL;
    kv->fd = -1;
    kv->cfg = c;
    kv->bs = c.block_size;
    kv->n_blocks = (int32_t)nb;
    kv->part_blocks = (c.part_tokens + c.block_size - 1) / c.block_size;
    kv->n_row = c.n_head_kv * c.head_dim;
    kv->row_bytes = row;
    kv->block_bytes = row * (size_t)c.block_size;
    kv->bytes_per_block = bpb;
    kv->scale_max = fl_kv_type_max(c.type);
    if (c.hash_key && c.hash_key_len) {
        kv->key = fl_alloc(FL_MEM_MISC, c.hash_key_len, 0);
        if (!kv->key) goto fail;
        memcpy(kv->key, c.hash_key, c.hash_key_len);
        kv->cfg.hash_key = kv->key;
    } else {
        kv->cfg.hash_key = NULL;
        kv->cfg.hash_key_len = 0;
    }
    kv->cfg.swap_dir = NULL; /* not kept: read at creation only */
    kv->root = fl_kv_prefix_root(kv->key, kv->cfg.hash_key_len);
    kv->data_bytes = (size_t)c.n_layer * 2 * (size_t)(nb - 1) * kv->block_bytes;
    kv->data = fl_alloc(FL_MEM_KV, kv->data_bytes, 64);
    if (!kv->data) goto fail;
    if (c.prefault) memset(kv->data, 0, kv->data_bytes); /* (cfg.prefault: every page now, none mid-step) */
    if (fl_kv_type_scaled(c.type)) {
        kv->scales_bytes = (size_t)c.n_layer * 2 * (size_t)(nb - 1) * scale_bytes_of(&c);
        kv->scales = fl_alloc(FL_MEM_KV, kv->scales_bytes, 64);
        if (!kv->scales) goto fail;
        memset(kv->scales, 0, kv->scales_bytes);
    }
    kv->pool = fl_kv_pool_new(kv->n_blocks);
    kv->prefix = c.prefix_cache ? fl_kv_prefix_new(kv->n_blocks, kv->bs) : NULL;
    kv->seqs = fl_calloc(FL_MEM_MISC, (size_t)c.n_seq_max, sizeof(seq));
    kv->drop = fl_calloc(FL_MEM_MISC, (size_t)kv->n_blocks, sizeof(int32_t));
    kv->rowbuf = fl_alloc(FL_MEM_MISC, sizeof(float) * (size_t)kv->n_row, 64);
    if (!kv->pool || (c.prefix_cache && !kv->prefix) || !kv->seqs || !kv->drop || !kv->rowbuf) goto fail;
    if (swap_dir_of(cfg)) {
        /* remembered for the lazy swap-file creation */
        kv->cfg.swap_dir = fl_strdup(FL_MEM_MISC, swap_dir_of(cfg));
        if (!kv->cfg.swap_dir) goto fail;
    }
    return kv;
fail:
    fl_kv_free(kv);
    return NULL;
}

static void seq_release(fl_kv_cache *kv, seq *s);

void fl_kv_free(fl_kv_cache *kv) {
    if (!kv) return;
    if (kv->seqs)
        for (int32_t i = 0; i < kv->cfg.n_seq_max; i++)
            if (kv->seqs[i].used) seq_release(kv, &kv->seqs[i]);
    fl_free(FL_MEM_MISC, kv->seqs, sizeof(seq) * (size_t)kv->cfg.n_seq_max);
    fl_kv_pool_free(kv->pool);
    fl_kv_prefix_free(kv->prefix);
    fl_free(FL_MEM_KV, kv->data, kv->data_bytes);
    fl_free(FL_MEM_KV, kv->scales, kv->scales_bytes);
    fl_free(FL_MEM_MISC, kv->drop, sizeof(int32_t) * (size_t)kv->n_blocks);
    fl_free(FL_MEM_MISC, kv->rowbuf, sizeof(float) * (size_t)kv->n_row);
    fl_free(FL_MEM_MISC, kv->key, kv->cfg.hash_key_len);
    if (kv->cfg.swap_dir) fl_free(FL_MEM_MISC, (void *)kv->cfg.swap_dir, strlen(kv->cfg.swap_dir) + 1);
    fl_free(FL_MEM_MISC, kv->slot_blk, sizeof(int32_t) * (size_t)kv->slot_blk_cap);
    fl_free(FL_MEM_MISC, kv->slot_off, sizeof(int32_t) * (size_t)kv->slot_off_cap);
    fl_free(FL_MEM_MISC, kv->segs, sizeof(fl_paged_seq) * (size_t)kv->seg_cap);
    fl_free(FL_MEM_MISC, kv->seg_seq, sizeof(int32_t) * (size_t)kv->seg_cap);
    fl_free(FL_MEM_SCRATCH, kv->ws, kv->ws_bytes);
    fl_free(FL_MEM_MISC, kv->swap_free, sizeof(int64_t) * (size_t)kv->swap_free_cap);
    if (kv->fd >= 0) close(kv->fd);
    fl_free(FL_MEM_MISC, kv, sizeof *kv);
}

const fl_kv_config *fl_kv_config_get(const fl_kv_cache *kv) { return &kv->cfg; }
int32_t fl_kv_blocks_free(const fl_kv_cache *kv) { return fl_kv_pool_n_free(kv->pool); }
int32_t fl_kv_blocks_total(const fl_kv_cache *kv) { return fl_kv_pool_n_total(kv->pool); }
int32_t fl_kv_block_size(const fl_kv_cache *kv) { return kv->bs; }

/* ---- sequences ---- */

static fl_status tok_reserve(seq *s, int32_t n) {
    if (n <= s->tok_cap) return FL_OK;
    const int32_t cap = (int32_t)fl_cap_double(s->tok_cap ? s->tok_cap : TOK_CAP0, n);
    int32_t *t = fl_realloc(FL_MEM_MISC, s->tok, sizeof(int32_t) * (size_t)s->tok_cap, sizeof(int32_t) * (size_t)cap, 0);
    if (!t) return FL_ERR_NOMEM;
    s->tok = t;
    s->tok_cap = cap;
    return FL_OK;
}

static void swap_slot_put(fl_kv_cache *kv, int64_t slot);

/* Drop every reference and buffer of s (last blocks first, so a chain's head outlives its
 * tail in the LRU). */
static void seq_release(fl_kv_cache *kv, seq *s) {
    if (s->swapped) {
        for (int32_t i = 0; i < s->tab.n; i++)
            if (s->swap[i] >= 0) swap_slot_put(kv, s->swap[i]);
    } else {
        for (int32_t i = s->tab.n - 1; i >= 0; i--)
            if (s->tab.ids[i] > 0) fl_kv_pool_unref(kv->pool, s->tab.ids[i]);
    }
    fl_kv_table_deinit(&s->tab);
    fl_free(FL_MEM_MISC, s->tok, sizeof(int32_t) * (size_t)s->tok_cap);
    fl_free(FL_MEM_MISC, s->swap, sizeof(int64_t) * (size_t)s->swap_cap);
    memset(s, 0, sizeof *s);
}

static int32_t blocks_for(const fl_kv_cache *kv, int32_t n) { return (n + kv->bs - 1) / kv->bs; }

static seq *get_seq(const fl_kv_cache *kv, int32_t id) {
    return id >= 0 && id < kv->cfg.n_seq_max && kv->seqs[id].used ? &kv->seqs[id] : NULL;
}

fl_status fl_kv_seq_add_keyed(fl_kv_cache *kv, int32_t id, const int32_t *tokens, int32_t n, const void *key,
                              size_t key_len, int32_t *n_cached) {
    if (n_cached) *n_cached = 0;
    if (id < 0 || id >= kv->cfg.n_seq_max || kv->seqs[id].used)
        return fl_set_error(FL_ERR_INVALID, "%s: sequence %d out of range [0, %d) or already present", __func__, id, kv->cfg.n_seq_max);
    if (n < 0 || (n > 0 && !tokens)) return fl_set_error(FL_ERR_INVALID, "%s: bad prompt (n = %d)", __func__, n);
    seq *s = &kv->seqs[id];
    const fl_kv_hash root = key && key_len ? fl_kv_prefix_root(key, key_len) : kv->root;
    int32_t max_blocks = kv->prefix && n > 1 ? (n - 1) / kv->bs : 0; /* keep >= 1 token to compute */
    if (fl_kv_table_reserve(&s->tab, max_blocks > 0 ? max_blocks : 1) != FL_OK || tok_reserve(s, n > 0 ? n : 1) != FL_OK) {
        fl_kv_table_deinit(&s->tab);
        fl_free(FL_MEM_MISC, s->tok, sizeof(int32_t) * (size_t)s->tok_cap);
        memset(s, 0, sizeof *s);
        return fl_set_error(FL_ERR_NOMEM, "%s: out of memory for sequence %d", __func__, id);
    }
    s->used = true;
    s->no_cache = !kv->prefix;
    s->chain = root;
    s->root = root;
    int32_t hit = 0;
    if (max_blocks > 0) hit = fl_kv_prefix_match(kv->prefix, kv->pool, &root, tokens, max_blocks, s->tab.ids, &s->chain);
    for (int32_t i = 0; i < hit; i++) fl_kv_pool_ref(kv->pool, s->tab.ids[i]);
    s->tab.n = hit;
    s->n = hit * kv->bs;
    s->n_hashed = hit;
    if (s->n) memcpy(s->tok, tokens, sizeof(int32_t) * (size_t)s->n);
    kv->hit += s->n;
    kv->miss += n - s->n;
    if (n_cached) *n_cached = s->n;
    return FL_OK;
}

int32_t fl_kv_prefix_probe(const fl_kv_cache *kv, const int32_t *tokens, int32_t n, const void *key, size_t key_len) {
    if (!kv->prefix || n <= 1 || !tokens) return 0;
    const fl_kv_hash root = key && key_len ? fl_kv_prefix_root(key, key_len) : kv->root;
    const fl_kv_pool *pool = kv->pool;
    fl_kv_hash last;
    int32_t hit = 0, ids[64];
    /* match in pieces of 64 blocks (no allocation), continuing the chain */
    for (int32_t max_blocks = (n - 1) / kv->bs; hit < max_blocks;) {
        const int32_t want = max_blocks - hit < 64 ? max_blocks - hit : 64;
        const fl_kv_hash r = hit ? last : root;
        const int32_t got = fl_kv_prefix_match(kv->prefix, pool, &r, tokens + (size_t)hit * (size_t)kv->bs, want, ids, &last);
        hit += got;
        if (got < want) break;
    }
    return hit * kv->bs;
}

void fl_kv_clear(fl_kv_cache *kv) {
    for (int32_t i = 0; i < kv->cfg.n_seq_max; i++)
        if (kv->seqs[i].used) seq_release(kv, &kv->seqs[i]);
}

fl_status fl_kv_seq_add(fl_kv_cache *kv, int32_t id, const int32_t *tokens, int32_t n, int32_t *n_cached) {
    return fl_kv_seq_add_keyed(kv, id, tokens, n, NULL, 0, n_cached);
}

fl_status fl_kv_seq_fork(fl_kv_cache *kv, int32_t src, int32_t dst) {
    seq *a = get_seq(kv, src);
    if (!a || a->swapped) return fl_set_error(FL_ERR_INVALID, "%s: source sequence %d absent or swapped out", __func__, src);
    if (dst < 0 || dst >= kv->cfg.n_seq_max || kv->seqs[dst].used)
        return fl_set_error(FL_ERR_INVALID, "%s: target sequence %d out of range or present", __func__, dst);
    seq *b = &kv->seqs[dst];
    if (fl_kv_table_copy(&b->tab, &a->tab) != FL_OK || tok_reserve(b, a->n > 0 ? a->n : 1) != FL_OK) {
        fl_kv_table_deinit(&b->tab);
        fl_free(FL_MEM_MISC, b->tok, sizeof(int32_t) * (size_t)b->tok_cap);
        memset(b, 0, sizeof *b);
        return fl_set_error(FL_ERR_NOMEM, "%s: out of memory", __func__);
    }
    if (a->n) memcpy(b->tok, a->tok, sizeof(int32_t) * (size_t)a->n);
    b->used = true;
    b->no_cache = a->no_cache;
    b->n = a->n;
    b->n_hashed = a->n_hashed;
    b->chain = a->chain;
    b->root = a->root;
    for (int32_t i = 0; i < b->tab.n; i++)
        if (b->tab.ids[i] > 0) fl_kv_pool_ref(kv->pool, b->tab.ids[i]);
    return FL_OK;
}

void fl_kv_seq_free(fl_kv_cache *kv, int32_t id) {
    seq *s = get_seq(kv, id);
    if (s) seq_release(kv, s);
}

bool fl_kv_seq_exists(const fl_kv_cache *kv, int32_t id) { return get_seq(kv, id) != NULL; }

int32_t fl_kv_seq_len(const fl_kv_cache *kv, int32_t id) {
    const seq *s = get_seq(kv, id);
    return s ? s->n : -1;
}

const int32_t *fl_kv_seq_blocks(const fl_kv_cache *kv, int32_t id, int32_t *n_blocks) {
    const seq *s = get_seq(kv, id);
    *n_blocks = s ? s->tab.n : 0;
    return s ? s->tab.ids : NULL;
}

const int32_t *fl_kv_seq_tokens(const fl_kv_cache *kv, int32_t id, int32_t *n) {
    const seq *s = get_seq(kv, id);
    *n = s ? s->n : 0;
    return s ? s->tok : NULL;
}

fl_status fl_kv_seq_truncate(fl_kv_cache *kv, int32_t id, int32_t n) {
    seq *s = get_seq(kv, id);
    if (!s || s->swapped) return fl_set_error(FL_ERR_INVALID, "%s: sequence %d absent or swapped out", __func__, id);
    if (n < 0 || n > s->n) return fl_set_error(FL_ERR_INVALID, "%s: sequence %d: keep %d of %d positions", __func__, id, n, s->n);
    if (n == s->n) return FL_OK;
    const int32_t keep = blocks_for(kv, n);
    /* the block that keeps positions below n and loses the rest: its contents will change, so
     * its hash goes (unless another sequence shares it: the next write copies it first) */
    if (n % kv->bs) {
        const int32_t last = s->tab.ids[n / kv->bs];
        if (last > 0 && fl_kv_pool_refcount(kv->pool, last) == 1) fl_kv_pool_drop_hash(kv->pool, last);
    }
    for (int32_t bi = s->tab.n - 1; bi >= keep; bi--) { /* the blocks past it go back (last first) */
        const int32_t b = s->tab.ids[bi];
        if (b <= 0) continue;
        if (fl_kv_pool_refcount(kv->pool, b) == 1) fl_kv_pool_drop_hash(kv->pool, b); /* tokens that were not kept */
        fl_kv_pool_unref(kv->pool, b);
        s->tab.ids[bi] = 0;
    }
    if (s->tab.n > keep) s->tab.n = keep;
    s->n = n;
    if (s->n_hashed > n / kv->bs) { /* the chain back to the last whole block kept */
        s->n_hashed = n / kv->bs;
        s->chain = s->root;
        for (int32_t bi = 0; !s->no_cache && bi < s->n_hashed; bi++)
            s->chain = fl_kv_prefix_hash(kv->prefix, &s->chain, s->tok + (size_t)bi * (size_t)kv->bs);
    }
    return FL_OK;
}


int32_t fl_kv_seq_blocks_needed(const fl_kv_cache *kv, int32_t id, int32_t n_new) {
    const seq *s = get_seq(kv, id);
    if (!s) return blocks_for(kv, n_new);
    if (s->swapped) {
        int32_t c = 0;
        for (int32_t i = 0; i < s->tab.n; i++) c += s->swap[i] >= 0;
        return c;
    }
    int32_t need = blocks_for(kv, s->n + n_new) - s->tab.n;
    if (n_new > 0 && s->n % kv->bs && fl_kv_pool_refcount(kv->pool, s->tab.ids[s->tab.n - 1]) > 1) need++;
    return need;
}

/* ---- prepare / store / attend ---- */

static fl_status grow_i32(int32_t **p, int32_t *cap, int32_t n, size_t elem) {
    if (n <= *cap) return FL_OK;
    const int32_t c = (int32_t)fl_cap_double(*cap ? *cap : SLOT_CAP0, n);
    void *q = fl_realloc(FL_MEM_MISC, *p, elem * (size_t)*cap, elem * (size_t)c, 0);
    if (!q) return FL_ERR_NOMEM;
    *p = q;
    *cap = c;
    return FL_OK;
}

static fl_status reserve_batch(fl_kv_cache *kv, int32_t n_tokens) {
    if (grow_i32(&kv->slot_blk, &kv->slot_blk_cap, n_tokens, sizeof(int32_t)) != FL_OK ||
        grow_i32(&kv->slot_off, &kv->slot_off_cap, n_tokens, sizeof(int32_t)) != FL_OK)
        return FL_ERR_NOMEM;
    if (n_tokens > kv->seg_cap) {
        const int32_t c = (int32_t)fl_cap_double(kv->seg_cap ? kv->seg_cap : SEG_CAP0, n_tokens);
        fl_paged_seq *sg = fl_alloc(FL_MEM_MISC, sizeof(fl_paged_seq) * (size_t)c, 0);
        int32_t *ss = fl_alloc(FL_MEM_MISC, sizeof(int32_t) * (size_t)c, 0);
        if (!sg || !ss) {
            fl_free(FL_MEM_MISC, sg, sg ? sizeof(fl_paged_seq) * (size_t)c : 0);
            fl_free(FL_MEM_MISC, ss, ss ? sizeof(int32_t) * (size_t)c : 0);
            return FL_ERR_NOMEM;
        }
        /* contents need not survive: segments are rebuilt by every prepare */
        fl_free(FL_MEM_MISC, kv->segs, sizeof(fl_paged_seq) * (size_t)kv->seg_cap);
        fl_free(FL_MEM_MISC, kv->seg_seq, sizeof(int32_t) * (size_t)kv->seg_cap);
        kv->segs = sg;
        kv->seg_seq = ss;
        kv->seg_cap = c;
    }
    return FL_OK;
}

static fl_paged_kv layer_view(const fl_kv_cache *kv, int32_t il) {
    fl_paged_kv v = {.type = kv->cfg.type, .block_size = kv->bs, .n_head_kv = kv->cfg.n_head_kv, .head_dim = kv->cfg.head_dim,
                     .row_bytes = kv->row_bytes, .block_bytes = kv->block_bytes};
    v.k = row_ptr(kv, il, 0, 1, 0);
    v.v = row_ptr(kv, il, 1, 1, 0);
    v.k_scale = scale_ptr(kv, il, 0, 1);
    v.v_scale = scale_ptr(kv, il, 1, 1);
    return v;
}

static fl_paged_attn_params attn_params(const fl_kv_cache *kv) {
    return (fl_paged_attn_params){.n_head = kv->cfg.n_head, .scale = kv->cfg.attn_scale, .window = kv->cfg.window,
                                  .part_blocks = kv->part_blocks};
}

/* f16 K/V: the queries are rounded to f16 before attention, as llama.cpp's f16 K . q product
 * and kv_contig do; the rounded copy lives in the workspace after the kernel's part. */
static size_t q_round_bytes(const fl_kv_cache *kv) {
    return kv->cfg.type == FL_TYPE_F16 ? sizeof(float) * (size_t)kv->b_n_tokens * (size_t)kv->cfg.n_head * (size_t)kv->cfg.head_dim : 0;
}
static size_t q_round_off(const fl_kv_cache *kv) {
    const fl_paged_kv v = layer_view(kv, 0);
    const fl_paged_attn_params pp = attn_params(kv);
    return (fl_paged_attn_ws_size(&v, kv->segs, kv->n_seg, &pp, fl_threads_get()) + 63) & ~(size_t)63;
}

static fl_status reserve_ws(fl_kv_cache *kv) {
    const size_t need = q_round_off(kv) + q_round_bytes(kv);
    if (need <= kv->ws_bytes) return FL_OK;
    size_t cap = kv->ws_bytes ? kv->ws_bytes : 65536;
    while (cap < need) cap *= 2;
    void *w = fl_alloc(FL_MEM_SCRATCH, cap, 64);
    if (!w) return FL_ERR_NOMEM;
    fl_free(FL_MEM_SCRATCH, kv->ws, kv->ws_bytes);
    kv->ws = w;
    kv->ws_bytes = cap;
    return FL_OK;
}

/* Register the chain hashes of s's blocks that became full. */
static void register_full(fl_kv_cache *kv, seq *s) {
    while (!s->no_cache && (s->n_hashed + 1) * kv->bs <= s->n) {
        const int32_t *t = s->tok + (size_t)s->n_hashed * (size_t)kv->bs;
        const fl_kv_hash h = fl_kv_prefix_hash(kv->prefix, &s->chain, t);
        const int32_t id = s->tab.ids[s->n_hashed];
        if (id > 0 && !fl_kv_pool_has_hash(kv->pool, id)) fl_kv_prefix_commit(kv->prefix, kv->pool, id, &s->chain, &h, t);
        s->chain = h;
        s->n_hashed++;
    }
}

/* A failed prepare forgets the sequences it was about to create (their buffers included) and
 * the batch. */
static void drop_unborn(fl_kv_cache *kv) {
    for (int32_t g = 0; g < kv->n_seg; g++) {
        seq *s = &kv->seqs[kv->seg_seq[g]];
        if (!s->used) seq_release(kv, s);
    }
    kv->n_seg = 0;
}

fl_status fl_kv_prepare(fl_kv_cache *kv, const fl_batch *b) {
    kv->b_n_tokens = 0;
    kv->n_seg = 0;
    if (!b || b->n_tokens < 1 || !b->pos || !b->seq_id) return fl_set_error(FL_ERR_INVALID, "%s: empty or incomplete batch", __func__);
    fl_status st = reserve_batch(kv, b->n_tokens);
    if (st != FL_OK) return fl_set_error(st, "%s: out of memory for the batch", __func__);
    if (++kv->gen == 0) kv->gen = 1;
    /* 1. validate and cut the batch into per-sequence segments */
    for (int32_t i = 0; i < b->n_tokens;) {
        const int32_t id = b->seq_id[i];
        int32_t j = i;
        while (j < b->n_tokens && b->seq_id[j] == id) j++;
        if (id < 0 || id >= kv->cfg.n_seq_max) return fl_set_error(FL_ERR_INVALID, "%s: sequence id %d out of range [0, %d)", __func__, id, kv->cfg.n_seq_max);
        seq *s = &kv->seqs[id];
        if (s->batch_gen == kv->gen)
            return fl_set_error(FL_ERR_INVALID, "%s: tokens of sequence %d are not contiguous in the batch", __func__, id);
        if (s->swapped) return fl_set_error(FL_ERR_INVALID, "%s: sequence %d is swapped out", __func__, id);
        const int32_t base = s->used ? s->n : 0;
        for (int32_t k = i; k < j; k++)
            if (b->pos[k] != base + (k - i))
                return fl_set_error(FL_ERR_INVALID, "%s: sequence %d: token %d has position %d, expected %d", __func__, id, k, b->pos[k], base + (k - i));
        if (kv->cfg.n_ctx && base + (j - i) > kv->cfg.n_ctx)
            return fl_set_error(FL_ERR_RANGE, "%s: sequence %d would exceed the context of %d positions", __func__, id, kv->cfg.n_ctx);
        s->batch_gen = kv->gen;
        kv->segs[kv->n_seg] = (fl_paged_seq){.q0 = i, .n_q = j - i, .pos0 = base, .blocks = NULL};
        kv->seg_seq[kv->n_seg++] = id;
        i = j;
    }
    /* 2. release blocks that slid out of the window; reserve tables and token arrays */
    for (int32_t g = 0; g < kv->n_seg; g++) {
        seq *s = &kv->seqs[kv->seg_seq[g]];
        const fl_paged_seq *sg = &kv->segs[g];
        if (s->used && kv->cfg.window > 0) {
            const int32_t lo = sg->pos0 - kv->cfg.window + 1;
            for (int32_t bi = 0; lo > 0 && bi < lo / kv->bs && bi < s->tab.n; bi++)
                if (s->tab.ids[bi] > 0) {
                    fl_kv_pool_unref(kv->pool, s->tab.ids[bi]);
                    s->tab.ids[bi] = 0;
                }
        }
        if (fl_kv_table_reserve(&s->tab, blocks_for(kv, sg->pos0 + sg->n_q)) != FL_OK || tok_reserve(s, sg->pos0 + sg->n_q) != FL_OK) {
            drop_unborn(kv);
            return fl_set_error(FL_ERR_NOMEM, "%s: out of memory for block tables", __func__);
        }
    }
    /* 3. count the blocks needed: new boundaries + copy-on-write of shared last blocks */
    int64_t need = 0;
    for (int32_t g = 0; g < kv->n_seg; g++) {
        seq *s = &kv->seqs[kv->seg_seq[g]];
        const fl_paged_seq *sg = &kv->segs[g];
        const int32_t have = s->used ? s->tab.n : 0;
        need += blocks_for(kv, sg->pos0 + sg->n_q) - have;
        if (s->used && s->n % kv->bs) {
            const int32_t last = s->tab.ids[s->tab.n - 1];
            if (fl_kv_pool_refcount(kv->pool, last) - kv->drop[last] > 1) {
                need++;
                kv->drop[last]++;
            }
        }
    }
    for (int32_t g = 0; g < kv->n_seg; g++) {
        seq *s = &kv->seqs[kv->seg_seq[g]];
        if (s->used && s->tab.n) kv->drop[s->tab.ids[s->tab.n - 1]] = 0;
    }
    if (need > fl_kv_pool_n_free(kv->pool)) {
        drop_unborn(kv);
        return FL_NO_KV_SPACE;
    }
    /* 4. apply: create, copy-on-write, append blocks, record tokens and slots, hash */
    for (int32_t g = 0; g < kv->n_seg; g++) {
        seq *s = &kv->seqs[kv->seg_seq[g]];
        fl_paged_seq *sg = &kv->segs[g];
        if (!s->used) {
            s->used = true;
            s->no_cache = !kv->prefix;
            s->chain = kv->root;
            s->root = kv->root;
            s->batch_gen = kv->gen;
            kv->miss += sg->n_q;
        }
        if (s->n % kv->bs) {
            const int32_t li = s->tab.n - 1, last = s->tab.ids[li];
            if (fl_kv_pool_refcount(kv->pool, last) > 1) {
                const int32_t nb = fl_kv_pool_alloc(kv->pool);
                FL_ASSERT(nb > 0);
                copy_block(kv, nb, last);
                fl_kv_pool_unref(kv->pool, last);
                s->tab.ids[li] = nb;
                kv->cow++;
            }
        }
        while (s->tab.n < blocks_for(kv, sg->pos0 + sg->n_q)) {
            const int32_t nb = fl_kv_pool_alloc(kv->pool);
            FL_ASSERT(nb > 0);
            zero_scales(kv, nb);
            s->tab.ids[s->tab.n++] = nb;
        }
        for (int32_t k = 0; k < sg->n_q; k++) {
            const int32_t p = sg->pos0 + k;
            s->tok[p] = b->tokens ? b->tokens[sg->q0 + k] : -1;
            kv->slot_blk[sg->q0 + k] = s->tab.ids[p / kv->bs];
            kv->slot_off[sg->q0 + k] = p % kv->bs;
        }
        if (!b->tokens) s->no_cache = true;
        s->n += sg->n_q;
        sg->blocks = s->tab.ids;
    }
    kv->b_n_tokens = b->n_tokens;
    st = reserve_ws(kv);
    if (st != FL_OK) return fl_set_error(st, "%s: out of memory for the attention workspace", __func__);
    return FL_OK;
}

typedef struct store_task {
    fl_kv_cache *kv;
    int32_t il;
    const float *k, *v;
} store_task;

/* The rows of tokens [i0, i1). */
static void store_rows(fl_kv_cache *kv, int32_t il, const float *k, const float *v, int32_t i0, int32_t i1) {
    for (int32_t i = i0; i < i1; i++) {
        write_row(kv, il, 0, kv->slot_blk[i], kv->slot_off[i], k + (size_t)i * (size_t)kv->n_row);
        write_row(kv, il, 1, kv->slot_blk[i], kv->slot_off[i], v + (size_t)i * (size_t)kv->n_row);
    }
}

/* Whole sequences per thread: after prepare no two sequences write one block (shared ones were
 * copied), so the threads' rows never meet in a block. */
static void store_task_fn(void *p, int ith, int nth) {
    const store_task *t = p;
    int64_t lo, hi;
    fl_split_range(t->kv->n_seg, ith, nth, &lo, &hi);
    for (int64_t g = lo; g < hi; g++)
        store_rows(t->kv, t->il, t->k, t->v, t->kv->segs[g].q0, t->kv->segs[g].q0 + t->kv->segs[g].n_q);
}

void fl_kv_store(fl_kv_cache *kv, int32_t il, const fl_batch *b, const float *k, const float *v) {
    FL_ASSERT(b->n_tokens == kv->b_n_tokens && il >= 0 && il < kv->cfg.n_layer);
    /* a batch of many sequences (a decode step) over the threads, whole sequences each (each
     * row lands in a block of its own, a cache miss apart).  Not for the fp8 types: their
     * re-encode of a block shares kv->rowbuf. */
    if (!kv->scales && kv->n_seg >= 8) {
        store_task t = {kv, il, k, v};
        fl_parallel(store_task_fn, &t);
    } else
        store_rows(kv, il, k, v, 0, b->n_tokens);
    /* blocks that became full are offered to the prefix cache only once every layer's K/V is
     * in them (the last layer's store), so a hit never finds a half-written block */
    if (kv->prefix && il == kv->cfg.n_layer - 1)
        for (int32_t g = 0; g < kv->n_seg; g++) register_full(kv, &kv->seqs[kv->seg_seq[g]]);
}

/* The queries rounded to f16 and back (f16 K: the dot products take f16 operands, as
 * llama.cpp's), in runs of 512 split over the threads (16 decode rows x 32 heads: done on one
 * thread it was 6% of the attention and the other thread waited meanwhile). */
typedef struct q_round_task {
    const float *q;
    float *qr;
    int64_t n;
} q_round_task;

static void q_round(void *p, int ith, int nth) {
    const q_round_task *t = p;
    const fl_convert_kernels *cv = fl_convert_kernels_get();
    int64_t lo, hi;
    fl_split_range((t->n + 511) / 512, ith, nth, &lo, &hi);
    uint16_t tmp[512];
    for (int64_t c = lo; c < hi; c++) {
        const int64_t i = c * 512, n = t->n - i < 512 ? t->n - i : 512;
        cv->f32_to_f16(t->q + i, tmp, n);
        cv->f16_to_f32(tmp, t->qr + i, n);
    }
}

void fl_kv_attend(fl_kv_cache *kv, int32_t il, const fl_batch *b, const float *q, float *out) {
    FL_ASSERT(b->n_tokens == kv->b_n_tokens && il >= 0 && il < kv->cfg.n_layer);
    if (reserve_ws(kv) != FL_OK) fl_abort(__FILE__, __LINE__, "%s", fl_last_error()); /* thread count changed after prepare */
    const fl_paged_kv v = layer_view(kv, il);
    const fl_paged_attn_params pp = attn_params(kv);
    if (kv->cfg.type == FL_TYPE_F16) {
        q_round_task t = {q, (float *)((uint8_t *)kv->ws + q_round_off(kv)), (int64_t)b->n_tokens * kv->cfg.n_head * kv->cfg.head_dim};
        if (t.n < 8192) q_round(&t, 0, 1);
        else fl_parallel(q_round, &t);
        q = t.qr;
    }
    fl_paged_attn(&v, kv->segs, kv->n_seg, &pp, q, out, kv->ws);
}

static fl_status iface_prepare(void *ctx, const fl_batch *b) { return fl_kv_prepare(ctx, b); }
static void iface_store(void *ctx, int32_t il, const fl_batch *b, const float *k, const float *v) { fl_kv_store(ctx, il, b, k, v); }
static void iface_attend(void *ctx, int32_t il, const fl_batch *b, const float *q, float *out) { fl_kv_attend(ctx, il, b, q, out); }

fl_kv_iface fl_kv_iface_get(void) { return (fl_kv_iface){iface_prepare, iface_store, iface_attend}; }

fl_status fl_kv_seq_read(const fl_kv_cache *kv, int32_t id, int32_t il, int32_t pos, float *k, float *v) {
    const seq *s = get_seq(kv, id);
    if (!s || s->swapped || il < 0 || il >= kv->cfg.n_layer || pos < 0 || pos >= s->n || s->tab.ids[pos / kv->bs] == 0)
        return fl_set_error(FL_ERR_INVALID, "%s: sequence %d layer %d position %d not readable", __func__, id, il, pos);
    const int32_t blk = s->tab.ids[pos / kv->bs];
    if (k) read_row(kv, il, 0, blk, pos % kv->bs, k);
    if (v) read_row(kv, il, 1, blk, pos % kv->bs, v);
    return FL_OK;
}

/* ---- shift with RoPE re-rotation ---- */

/* Rotate each head's first n_rot dims of x (adjacent pairs) by delta positions. */
static void rerotate(const fl_kv_cache *kv, float *x, int32_t delta) {
    const int32_t hd = kv->cfg.head_dim, nr = kv->cfg.n_rot;
    for (int32_t i = 0; i < nr / 2; i++) {
        const double theta = (double)delta * pow((double)kv->cfg.rope_base, -2.0 * i / nr);
        const float c = (float)cos(theta), s = (float)sin(theta);
        for (int32_t h = 0; h < kv->cfg.n_head_kv; h++) {
            float *p = x + (size_t)h * (size_t)hd + 2 * (size_t)i;
            const float x0 = p[0], x1 = p[1];
            p[0] = x0 * c - x1 * s;
            p[1] = x0 * s + x1 * c;
        }
    }
}

fl_status fl_kv_seq_shift(fl_kv_cache *kv, int32_t id, int32_t n_keep, int32_t n_discard) {
    seq *s = get_seq(kv, id);
    if (!s || s->swapped) return fl_set_error(FL_ERR_INVALID, "%s: sequence %d absent or swapped out", __func__, id);
    if (kv->cfg.window > 0) return fl_set_error(FL_ERR_UNSUPPORTED, "%s: shifting a sliding-window cache", __func__);
    if (n_keep < 0 || n_discard < 0 || (int64_t)n_keep + n_discard > s->n)
        return fl_set_error(FL_ERR_INVALID, "%s: keep %d + discard %d exceed the %d stored positions", __func__, n_keep, n_discard, s->n);
    if (n_discard == 0) return FL_OK;
    const int32_t n_new = s->n - n_discard, bt = n_keep / kv->bs, b_end = blocks_for(kv, n_new);
    int32_t need = 0;
    for (int32_t bi = bt; bi < b_end; bi++) need += fl_kv_pool_refcount(kv->pool, s->tab.ids[bi]) > 1;
    if (need > fl_kv_pool_n_free(kv->pool)) return FL_NO_KV_SPACE;
    /* make the destination blocks private; their contents change, so they leave the cache */
    for (int32_t bi = bt; bi < b_end; bi++) {
        const int32_t old = s->tab.ids[bi];
        if (fl_kv_pool_refcount(kv->pool, old) > 1) {
            const int32_t nb = fl_kv_pool_alloc(kv->pool);
            FL_ASSERT(nb > 0);
            copy_block(kv, nb, old);
            fl_kv_pool_unref(kv->pool, old);
            s->tab.ids[bi] = nb;
            kv->cow++;
        }
        fl_kv_pool_drop_hash(kv->pool, s->tab.ids[bi]);
    }
    /* move rows down (increasing order: a source is never overwritten before it is read) */
    const int32_t bs = kv->bs;
    for (int32_t il = 0; il < kv->cfg.n_layer; il++)
        for (int32_t p = n_keep + n_discard; p < s->n; p++) {
            const int32_t d = p - n_discard;
            const int32_t sb = s->tab.ids[p / bs], db = s->tab.ids[d / bs];
            read_row(kv, il, 0, sb, p % bs, kv->rowbuf);
            rerotate(kv, kv->rowbuf, -n_discard);
            write_row(kv, il, 0, db, d % bs, kv->rowbuf);
            if (kv->scales) {
                read_row(kv, il, 1, sb, p % bs, kv->rowbuf);
                write_row(kv, il, 1, db, d % bs, kv->rowbuf);
            } else {
                memcpy(row_ptr(kv, il, 1, db, d % bs), row_ptr(kv, il, 1, sb, p % bs), kv->row_bytes);
            }
        }
    memmove(s->tok + n_keep, s->tok + n_keep + n_discard, sizeof(int32_t) * (size_t)(s->n - n_keep - n_discard));
    for (int32_t bi = s->tab.n - 1; bi >= b_end; bi--)
        if (s->tab.ids[bi] > 0) fl_kv_pool_unref(kv->pool, s->tab.ids[bi]);
    s->tab.n = b_end;
    kv->shifted += s->n - n_keep - n_discard;
    s->n = n_new;
    s->no_cache = true; /* later keys were computed with the dropped tokens in context */
    if (s->n_hashed > bt) s->n_hashed = bt;
    return FL_OK;
}

fl_status fl_kv_seq_stream(fl_kv_cache *kv, int32_t id, int32_t n_sink, int32_t n_recent) {
    const seq *s = get_seq(kv, id);
    if (!s || n_sink < 0 || n_recent < 0) return fl_set_error(FL_ERR_INVALID, "%s: no sequence %d or negative sizes", __func__, id);
    if ((int64_t)n_sink + n_recent >= s->n) return FL_OK;
    return fl_kv_seq_shift(kv, id, n_sink, s->n - n_sink - n_recent);
}

/* ---- swap tier ---- */

static fl_status swap_open(fl_kv_cache *kv) {
    if (kv->fd >= 0) return FL_OK;
    char path[1024];
    snprintf(path, sizeof path, "%s/fitllm-kv-swap-XXXXXX", kv->cfg.swap_dir ? kv->cfg.swap_dir : "/tmp");
    kv->fd = mkstemp(path);
    if (kv->fd < 0) return fl_set_error(FL_ERR_IO, "%s: cannot create swap file %s: %s", __func__, path, strerror(errno));
    unlink(path); /* anonymous: disappears with the cache */
    return FL_OK;
}

static fl_status swap_slot_get(fl_kv_cache *kv, int64_t *slot) {
    if (kv->n_swap_free) {
        *slot = kv->swap_free[--kv->n_swap_free];
        return FL_OK;
    }
    /* make sure put() never needs to allocate: capacity for every slot ever handed out */
    if (kv->swap_hw + 1 > kv->swap_free_cap) {
        int64_t c = kv->swap_free_cap ? kv->swap_free_cap * 2 : 256;
        int64_t *f = fl_realloc(FL_MEM_MISC, kv->swap_free, sizeof(int64_t) * (size_t)kv->swap_free_cap, sizeof(int64_t) * (size_t)c, 0);
        if (!f) return FL_ERR_NOMEM;
        kv->swap_free = f;
        kv->swap_free_cap = c;
    }
    *slot = kv->swap_hw++;
    return FL_OK;
}

static void swap_slot_put(fl_kv_cache *kv, int64_t slot) {
    FL_ASSERT(kv->n_swap_free < kv->swap_free_cap);
    kv->swap_free[kv->n_swap_free++] = slot;
}

/* Block id <-> swap slot: the record is every layer's K and V block then their scales. */
static fl_status swap_io(fl_kv_cache *kv, int32_t id, int64_t slot, bool out) {
    off_t off = (off_t)((size_t)slot * kv->bytes_per_block);
    for (int32_t il = 0; il < kv->cfg.n_layer; il++)
        for (int w = 0; w < 2; w++) {
            void *pieces[2] = {row_ptr(kv, il, w, id, 0), scale_ptr(kv, il, w, id)};
            const size_t sizes[2] = {kv->block_bytes, kv->scales ? sizeof(float) * (size_t)kv->cfg.n_head_kv : 0};
            for (int k = 0; k < 2; k++) {
                if (!sizes[k]) continue;
                const ssize_t r = out ? pwrite(kv->fd, pieces[k], sizes[k], off) : pread(kv->fd, pieces[k], sizes[k], off);
                if (r != (ssize_t)sizes[k])
                    return fl_set_error(FL_ERR_IO, "%s: swap %s failed: %s", __func__, out ? "write" : "read", r < 0 ? strerror(errno) : "short transfer");
                off += (off_t)sizes[k];
            }
        }
    return FL_OK;
}

fl_status fl_kv_seq_swap_out(fl_kv_cache *kv, int32_t id) {
    seq *s = get_seq(kv, id);
    if (!s || s->swapped) return fl_set_error(FL_ERR_INVALID, "%s: sequence %d absent or already swapped out", __func__, id);
    fl_status st = swap_open(kv);
    if (st != FL_OK) return st;
    if (s->tab.n > s->swap_cap) {
        int64_t *w = fl_realloc(FL_MEM_MISC, s->swap, sizeof(int64_t) * (size_t)s->swap_cap, sizeof(int64_t) * (size_t)s->tab.cap, 0);
        if (!w) return fl_set_error(FL_ERR_NOMEM, "%s: out of memory", __func__);
        s->swap = w;
        s->swap_cap = s->tab.cap;
    }
    int32_t done = 0;
    for (; done < s->tab.n; done++) {
        s->swap[done] = -1;
        if (s->tab.ids[done] == 0) continue;
        st = swap_slot_get(kv, &s->swap[done]);
        if (st == FL_OK) st = swap_io(kv, s->tab.ids[done], s->swap[done], true);
        if (st != FL_OK) {
            if (s->swap[done] >= 0) swap_slot_put(kv, s->swap[done]);
            for (int32_t i = 0; i < done; i++)
                if (s->swap[i] >= 0) swap_slot_put(kv, s->swap[i]);
            return st == FL_ERR_NOMEM ? fl_set_error(st, "%s: out of memory", __func__) : st;
        }
    }
    for (int32_t i = s->tab.n - 1; i >= 0; i--)
        if (s->tab.ids[i] > 0) fl_kv_pool_unref(kv->pool, s->tab.ids[i]);
    s->swapped = true;
    kv->swap_outs++;
    return FL_OK;
}

fl_status fl_kv_seq_swap_in(fl_kv_cache *kv, int32_t id) {
    seq *s = get_seq(kv, id);
    if (!s || !s->swapped) return fl_set_error(FL_ERR_INVALID, "%s: sequence %d is not swapped out", __func__, id);
    if (fl_kv_seq_blocks_needed(kv, id, 0) > fl_kv_pool_n_free(kv->pool)) return FL_NO_KV_SPACE;
    for (int32_t i = 0; i < s->tab.n; i++) {
        if (s->swap[i] < 0) {
            s->tab.ids[i] = 0;
            continue;
        }
        const int32_t nb = fl_kv_pool_alloc(kv->pool);
        FL_ASSERT(nb > 0);
        const fl_status st = swap_io(kv, nb, s->swap[i], false);
        if (st != FL_OK) {
            fl_kv_pool_unref(kv->pool, nb);
            for (int32_t k = 0; k < i; k++)
                if (s->swap[k] >= 0) fl_kv_pool_unref(kv->pool, s->tab.ids[k]);
            return st;
        }
        s->tab.ids[i] = nb;
    }
    for (int32_t i = 0; i < s->tab.n; i++)
        if (s->swap[i] >= 0) swap_slot_put(kv, s->swap[i]);
    s->swapped = false;
    kv->swap_ins++;
    return FL_OK;
}

bool fl_kv_seq_swapped(const fl_kv_cache *kv, int32_t id) {
    const seq *s = get_seq(kv, id);
    return s && s->swapped;
}

/* ---- accounting ---- */

fl_status fl_kv_seq_stats_get(const fl_kv_cache *kv, int32_t id, fl_kv_seq_stats *o) {
    const seq *s = get_seq(kv, id);
    memset(o, 0, sizeof *o);
    if (!s) return fl_set_error(FL_ERR_INVALID, "%s: no sequence %d", __func__, id);
    o->n_tokens = s->n;
    o->swapped = s->swapped;
    if (s->swapped) return FL_OK;
    for (int32_t i = 0; i < s->tab.n; i++) {
        if (s->tab.ids[i] == 0) continue;
        o->n_blocks++;
        if (fl_kv_pool_refcount(kv->pool, s->tab.ids[i]) > 1) o->bytes_shared += (int64_t)kv->bytes_per_block;
    }
    o->slack = s->tab.n * kv->bs - s->n;
    o->bytes_held = (int64_t)o->n_blocks * (int64_t)kv->bytes_per_block;
    return FL_OK;
}

void fl_kv_stats_get(const fl_kv_cache *kv, fl_kv_stats *o) {
    memset(o, 0, sizeof *o);
    o->block_size = kv->bs;
    o->n_blocks_total = fl_kv_pool_n_total(kv->pool);
    o->n_blocks_used = fl_kv_pool_n_used(kv->pool);
    o->n_blocks_free = fl_kv_pool_n_free(kv->pool);
    o->n_blocks_cached = fl_kv_pool_n_cached(kv->pool);
    o->bytes_per_block = (int64_t)kv->bytes_per_block;
    o->bytes_total = (int64_t)kv->bytes_per_block * o->n_blocks_total;
    o->slots_allocated = (int64_t)o->n_blocks_used * kv->bs;
    /* filled slots per physical block = the most any holder has written into it (kv->drop is
     * all zeros between prepares; borrowed here as a per-block counter and zeroed again) */
    int32_t *fill = kv->drop;
    for (int32_t i = 0; i < kv->cfg.n_seq_max; i++) {
        const seq *s = &kv->seqs[i];
        if (!s->used) continue;
        o->n_seqs++;
        o->tokens_logical += s->n;
        if (s->swapped) continue;
        for (int32_t bi = 0; bi < s->tab.n; bi++) {
            const int32_t id = s->tab.ids[bi], f = s->n - bi * kv->bs < kv->bs ? s->n - bi * kv->bs : kv->bs;
            if (id > 0 && f > fill[id]) fill[id] = f;
        }
    }
    for (int32_t i = 0; i < kv->cfg.n_seq_max; i++) {
        const seq *s = &kv->seqs[i];
        if (!s->used || s->swapped) continue;
        for (int32_t bi = 0; bi < s->tab.n; bi++) {
            const int32_t id = s->tab.ids[bi];
            o->tokens_live += fill[id];
            fill[id] = 0;
        }
    }
    o->utilization = o->n_blocks_total ? (double)o->n_blocks_used / o->n_blocks_total : 0.0;
    o->waste = o->slots_allocated ? (double)(o->slots_allocated - o->tokens_live) / (double)o->slots_allocated : 0.0;
    o->hit_tokens = kv->hit;
    o->miss_tokens = kv->miss;
    o->evictions = fl_kv_pool_evictions(kv->pool);
    o->cow_copies = kv->cow;
    o->swap_outs = kv->swap_outs;
    o->swap_ins = kv->swap_ins;
    o->shifted_tokens = kv->shifted;
}

fl_status fl_kv_check(const fl_kv_cache *kv) {
    fl_status st = fl_kv_pool_check(kv->pool);
    if (st != FL_OK) return st;
    int32_t *cnt = kv->drop; /* zero between prepares; restored below */
    for (int32_t i = 0; i < kv->cfg.n_seq_max; i++) {
        const seq *s = &kv->seqs[i];
        if (!s->used || s->swapped) continue;
        if (s->tab.n != blocks_for(kv, s->n)) {
            st = fl_set_error(FL_ERR_INTERNAL, "%s: sequence %d has %d positions in %d blocks", __func__, i, s->n, s->tab.n);
            break;
        }
        for (int32_t bi = 0; bi < s->tab.n; bi++)
            if (s->tab.ids[bi] > 0) cnt[s->tab.ids[bi]]++;
    }
    for (int32_t id = 1; id < kv->n_blocks; id++) {
        if (st == FL_OK && cnt[id] != fl_kv_pool_refcount(kv->pool, id))
            st = fl_set_error(FL_ERR_INTERNAL, "%s: block %d has refcount %d but %d table references", __func__, id,
                              fl_kv_pool_refcount(kv->pool, id), cnt[id]);
        cnt[id] = 0;
    }
    return st;
}
