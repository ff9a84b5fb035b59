/* Chained XXH3-128 block hashes with token verification (see prefix_cache.h). */
#include "kv/prefix_cache.h"

#include "core/alloc.h"
#include "core/status.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

struct fl_kv_prefix {
    int32_t n_blocks, block_size;
    int32_t *tokens;     /* [n_blocks][block_size] ids of each cached block */
    fl_kv_hash *parent;  /* [n_blocks] parent hash of each cached block */
};

size_t fl_kv_prefix_misc_bytes(int32_t n_blocks, int32_t block_size) {
    return sizeof(fl_kv_prefix) + sizeof(int32_t) * (size_t)n_blocks * (size_t)block_size + sizeof(fl_kv_hash) * (size_t)n_blocks;
}

fl_kv_prefix *fl_kv_prefix_new(int32_t n_blocks, int32_t block_size) {
    fl_kv_prefix *pc = fl_calloc(FL_MEM_MISC, 1, sizeof *pc);
    if (!pc) return NULL;
    pc->n_blocks = n_blocks;
    pc->block_size = block_size;
    pc->tokens = fl_calloc(FL_MEM_MISC, (size_t)n_blocks * (size_t)block_size, sizeof(int32_t));
    pc->parent = fl_calloc(FL_MEM_MISC, (size_t)n_blocks, sizeof(fl_kv_hash));
    if (!pc->tokens || !pc->parent) {
        fl_kv_prefix_free(pc);
        return NULL;
    }
    return pc;
}

void fl_kv_prefix_free(fl_kv_prefix *pc) {
    if (!pc) return;
    fl_free(FL_MEM_MISC, pc->tokens, sizeof(int32_t) * (size_t)pc->n_blocks * (size_t)pc->block_size);
    fl_free(FL_MEM_MISC, pc->parent, sizeof(fl_kv_hash) * (size_t)pc->n_blocks);
    fl_free(FL_MEM_MISC, pc, sizeof *pc);
}

static fl_kv_hash from_xxh(XXH128_hash_t x) { return (fl_kv_hash){x.low64, x.high64}; }

fl_kv_hash fl_kv_prefix_root(const void *key, size_t key_len) {
    static const char tag[] = "fitllm-kv-root";
    if (!key || !key_len) return from_xxh(XXH3_128bits(tag, sizeof tag - 1));
    return from_xxh(XXH3_128bits_withSeed(key, key_len, 0x6b76u));
}

fl_kv_hash fl_kv_prefix_hash(const fl_kv_prefix *pc, const fl_kv_hash *parent, const int32_t *tokens) {
    XXH3_state_t st; /* on the stack: no untracked malloc */
    XXH3_128bits_reset(&st);
    const uint64_t ph[2] = {parent->lo, parent->hi};
    XXH3_128bits_update(&st, ph, sizeof ph);
    XXH3_128bits_update(&st, tokens, sizeof(int32_t) * (size_t)pc->block_size);
    return from_xxh(XXH3_128bits_digest(&st));
}

bool fl_kv_prefix_commit(fl_kv_prefix *pc, fl_kv_pool *pool, int32_t id, const fl_kv_hash *parent,
                         const fl_kv_hash *h, const int32_t *tokens) {
    FL_ASSERT(id > 0 && id < pc->n_blocks);
    if (!fl_kv_pool_set_hash(pool, id, h)) return false;
    memcpy(pc->tokens + (size_t)id * (size_t)pc->block_size, tokens, sizeof(int32_t) * (size_t)pc->block_size);
    pc->parent[id] = *parent;
    return true;
}

int32_t fl_kv_prefix_match(const fl_kv_prefix *pc, const fl_kv_pool *pool, const fl_kv_hash *root,
                           const int32_t *tokens, int32_t n_blocks, int32_t *ids, fl_kv_hash *last) {
    fl_kv_hash parent = *root;
    *last = *root;
    const size_t bs = (size_t)pc->block_size;
    for (int32_t i = 0; i < n_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        const fl_kv_hash h = fl_kv_prefix_hash(pc, &parent, t);
        const int32_t id = fl_kv_pool_lookup(pool, &h);
        if (id < 0) return i;
        /* verify: same parent, same tokens (a 128-bit collision must not corrupt output) */
        if (pc->parent[id].lo != parent.lo || pc->parent[id].hi != parent.hi ||
            memcmp(pc->tokens + (size_t)id * bs, t, sizeof(int32_t) * bs) != 0)
            return i;
        ids[i] = id;
        *last = h;
        parent = h;
    }
    return n_blocks;
}
