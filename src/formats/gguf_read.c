/* GGUF reader: parses the header of a mapped file with every read bounds-checked. */
#include "formats/gguf.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/mmap.h"
#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NESTING 8

struct fl_gguf {
    fl_mmap map;         /* owned mapping (empty when opened from memory) */
    const unsigned char *base;
    size_t size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    fl_gguf_kv *kv;            /* n_kv */
    int64_t n_tensors;
    fl_gguf_tensor *tensors;   /* n_tensors */
    /* bookkeeping for the parsed string/array item tables */
    struct item_block { fl_gguf_value *items; size_t bytes; } *blocks;
    int64_t n_blocks, cap_blocks;
};

typedef struct cursor {
    const unsigned char *p;
    size_t left;
    size_t off; /* from file start, for messages */
} cursor;

static const size_t vtype_sizes[FL_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const vtype_names[FL_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

const char *fl_gguf_vtype_name(int32_t t) { return t >= 0 && t < FL_GGUF_VTYPE_COUNT ? vtype_names[t] : "?"; }
size_t fl_gguf_vtype_size(int32_t t) { return t >= 0 && t < FL_GGUF_VTYPE_COUNT ? vtype_sizes[t] : 0; }

bool fl_gguf_str_eq(fl_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.data, c, n) == 0;
}

static fl_status need(cursor *c, size_t n, const char *what) {
    if (n > c->left)
        return fl_set_error(FL_ERR_FORMAT, "truncated file: %s at offset %zu needs %zu bytes, %zu left", what, c->off, n, c->left);
    return FL_OK;
}

static void skip(cursor *c, size_t n) {
    c->p += n;
    c->left -= n;
    c->off += n;
}

static fl_status rd(cursor *c, void *dst, size_t n, const char *what) {
    fl_status s = need(c, n, what);
    if (s) return s;
    memcpy(dst, c->p, n);
    skip(c, n);
    return FL_OK;
}

static fl_status rd_str(cursor *c, fl_gguf_str *s, const char *what) {
    uint64_t len;
    fl_status st = rd(c, &len, 8, what);
    if (st) return st;
    if (len > c->left)
        return fl_set_error(FL_ERR_FORMAT, "%s at offset %zu: string length %llu exceeds the %zu bytes left",
                            what, c->off - 8, (unsigned long long)len, c->left);
    s->data = (const char *)c->p;
    s->len = len;
    skip(c, (size_t)len);
    return FL_OK;
}

/* Item tables for string/array arrays: one tracked allocation per table, remembered for free. */
static fl_gguf_value *new_items(fl_gguf *g, uint64_t n) {
    if (n > SIZE_MAX / sizeof(fl_gguf_value)) return NULL;
    if (g->n_blocks == g->cap_blocks) {
        int64_t cap = g->cap_blocks ? g->cap_blocks * 2 : 16;
        struct item_block *nb = fl_realloc(FL_MEM_MISC, g->blocks, (size_t)g->cap_blocks * sizeof *nb,
                                           (size_t)cap * sizeof *nb, 8);
        if (!nb) return NULL;
        g->blocks = nb;
        g->cap_blocks = cap;
    }
    size_t bytes = n ? (size_t)n * sizeof(fl_gguf_value) : 1;
    fl_gguf_value *items = fl_alloc(FL_MEM_MISC, bytes, 8);
    if (!items) return NULL;
    g->blocks[g->n_blocks].items = items;
    g->blocks[g->n_blocks++].bytes = bytes;
    return items;
}

static fl_status rd_value(fl_gguf *g, cursor *c, int32_t type, fl_gguf_value *v, int depth, const char *what) {
    fl_status st;
    memset(v, 0, sizeof *v);
    v->type = type;
    if (type < 0 || type >= FL_GGUF_VTYPE_COUNT)
        return fl_set_error(FL_ERR_FORMAT, "%s at offset %zu: unknown value type %d", what, c->off, (int)type);
    if (type == FL_GGUF_STRING) return rd_str(c, &v->v.str, what);
    if (type != FL_GGUF_ARRAY) {
        size_t n = vtype_sizes[type];
        unsigned char b[8] = {0};
        if ((st = rd(c, b, n, what))) return st;
        switch (type) {
        case FL_GGUF_U8: v->v.u64 = b[0]; break;
        case FL_GGUF_I8: v->v.i64 = (int8_t)b[0]; break;
        case FL_GGUF_U16: { uint16_t x; memcpy(&x, b, 2); v->v.u64 = x; break; }
        case FL_GGUF_I16: { int16_t x; memcpy(&x, b, 2); v->v.i64 = x; break; }
        case FL_GGUF_U32: { uint32_t x; memcpy(&x, b, 4); v->v.u64 = x; break; }
        case FL_GGUF_I32: { int32_t x; memcpy(&x, b, 4); v->v.i64 = x; break; }
        case FL_GGUF_F32: { float x; memcpy(&x, b, 4); v->v.f64 = x; break; }
        case FL_GGUF_BOOL:
            if (b[0] > 1) return fl_set_error(FL_ERR_FORMAT, "%s at offset %zu: bool value %u is not 0 or 1", what, c->off - 1, b[0]);
            v->v.u64 = b[0];
            break;
        case FL_GGUF_U64: memcpy(&v->v.u64, b, 8); break;
        case FL_GGUF_I64: memcpy(&v->v.i64, b, 8); break;
        case FL_GGUF_F64: memcpy(&v->v.f64, b, 8); break;
        }
        return FL_OK;
    }
    /* array */
    if (depth >= MAX_NESTING) return fl_set_error(FL_ERR_FORMAT, "%s: arrays nested deeper than %d", what, MAX_NESTING);
    int32_t et;
    uint64_t n;
    if ((st = rd(c, &et, 4, what)) || (st = rd(c, &n, 8, what))) return st;
    if (et < 0 || et >= FL_GGUF_VTYPE_COUNT)
        return fl_set_error(FL_ERR_FORMAT, "%s at offset %zu: unknown array element type %d", what, c->off - 12, (int)et);
    v->v.arr.type = et;
    v->v.arr.n = n;
    if (et != FL_GGUF_STRING && et != FL_GGUF_ARRAY) {
        size_t es = vtype_sizes[et];
        if (n > c->left / es)
            return fl_set_error(FL_ERR_FORMAT, "%s at offset %zu: array of %llu x %zu-byte elements exceeds the %zu bytes left",
                                what, c->off - 12, (unsigned long long)n, es, c->left);
        v->v.arr.raw = c->p;
        if (et == FL_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (c->p[i] > 1) return fl_set_error(FL_ERR_FORMAT, "%s: bool array element %llu is %u", what, (unsigned long long)i, c->p[i]);
        skip(c, (size_t)(n * es));
        return FL_OK;
    }
    /* every string element needs >= 8 bytes, every array element >= 12 */
    size_t min_el = et == FL_GGUF_STRING ? 8 : 12;
    if (n > c->left / min_el)
        return fl_set_error(FL_ERR_FORMAT, "%s at offset %zu: array count %llu cannot fit in the %zu bytes left",
                            what, c->off - 12, (unsigned long long)n, c->left);
    fl_gguf_value *items = new_items(g, n);
    if (!items) return fl_set_error(FL_ERR_NOMEM, "%s: cannot allocate %llu array items", what, (unsigned long long)n);
    v->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++)
        if ((st = rd_value(g, c, et, &items[i], depth + 1, what))) return st;
    return FL_OK;
}

static int cmp_str(fl_gguf_str a, fl_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int r = memcmp(a.data, b.data, n);
    return r ? r : (a.len < b.len ? -1 : a.len > b.len);
}

static int cmp_kv_ptr(const void *a, const void *b) {
    return cmp_str((*(const fl_gguf_kv *const *)a)->key, (*(const fl_gguf_kv *const *)b)->key);
}
static int cmp_tensor_name(const void *a, const void *b) {
    return cmp_str((*(const fl_gguf_tensor *const *)a)->name, (*(const fl_gguf_tensor *const *)b)->name);
}
static int cmp_tensor_off(const void *a, const void *b) {
    uint64_t x = (*(const fl_gguf_tensor *const *)a)->offset, y = (*(const fl_gguf_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Sort pointers with a tracked scratch array and report the first adjacent duplicate/overlap. */
static fl_status check_unique(fl_gguf *g) {
    fl_status st = FL_OK;
    int64_t n = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    if (n < 2) return FL_OK;
    const void **ptrs = fl_alloc(FL_MEM_MISC, (size_t)n * sizeof *ptrs, 8);
    if (!ptrs) return fl_set_error(FL_ERR_NOMEM, "cannot allocate the duplicate check");
    for (int64_t i = 0; i < g->n_kv; i++) ptrs[i] = &g->kv[i];
    qsort(ptrs, (size_t)g->n_kv, sizeof *ptrs, cmp_kv_ptr);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const fl_gguf_kv *a = ptrs[i - 1], *b = ptrs[i];
        if (!cmp_str(a->key, b->key)) {
            st = fl_set_error(FL_ERR_FORMAT, "duplicate key '%.*s'", (int)(a->key.len > 200 ? 200 : a->key.len), a->key.data);
            goto done;
        }
    }
    for (int64_t i = 0; i < g->n_tensors; i++) ptrs[i] = &g->tensors[i];
    qsort(ptrs, (size_t)g->n_tensors, sizeof *ptrs, cmp_tensor_name);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const fl_gguf_tensor *a = ptrs[i - 1], *b = ptrs[i];
        if (!cmp_str(a->name, b->name)) {
            st = fl_set_error(FL_ERR_FORMAT, "duplicate tensor name '%.*s'", (int)(a->name.len > 200 ? 200 : a->name.len), a->name.data);
            goto done;
        }
    }
    qsort(ptrs, (size_t)g->n_tensors, sizeof *ptrs, cmp_tensor_off);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const fl_gguf_tensor *a = ptrs[i - 1], *b = ptrs[i];
        if (a->size && b->size && a->offset + a->size > b->offset) {
            st = fl_set_error(FL_ERR_FORMAT, "tensors '%.*s' and '%.*s' overlap (offsets %llu+%llu > %llu)",
                              (int)(a->name.len > 100 ? 100 : a->name.len), a->name.data,
                              (int)(b->name.len > 100 ? 100 : b->name.len), b->name.data,
                              (unsigned long long)a->offset, (unsigned long long)a->size, (unsigned long long)b->offset);
            goto done;
        }
    }
done:
    fl_free(FL_MEM_MISC, ptrs, (size_t)n * sizeof *ptrs);
    return st;
}

static fl_status parse(fl_gguf *g) {
    cursor c = {g->base, g->size, 0};
    fl_status st;
    char magic[4];
    if ((st = rd(&c, magic, 4, "magic"))) return st;
    if (memcmp(magic, "GGUF", 4)) return fl_set_error(FL_ERR_FORMAT, "bad magic: not a GGUF file");
    if ((st = rd(&c, &g->version, 4, "version"))) return st;
    if (g->version == 1) return fl_set_error(FL_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xFFFF) == 0 && g->version != 0)
            return fl_set_error(FL_ERR_UNSUPPORTED, "GGUF version %u looks byte-swapped: big-endian files are not supported", g->version);
        return fl_set_error(FL_ERR_UNSUPPORTED, "unsupported GGUF version %u (only 2 and 3)", g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((st = rd(&c, &n_tensors, 8, "tensor count")) || (st = rd(&c, &n_kv, 8, "kv count"))) return st;
    /* a kv needs >= 8 (key len) + 4 (type) + 1 bytes; a tensor info >= 8 + 4 + 4 + 8 */
    if (n_kv > c.left / 13) return fl_set_error(FL_ERR_FORMAT, "kv count %llu cannot fit in a %zu-byte file", (unsigned long long)n_kv, g->size);
    if (n_tensors > c.left / 24) return fl_set_error(FL_ERR_FORMAT, "tensor count %llu cannot fit in a %zu-byte file", (unsigned long long)n_tensors, g->size);
    /* each count is set with its table (fl_gguf_free frees a table by its count) */
    if ((g->kv = fl_calloc(FL_MEM_MISC, n_kv ? (size_t)n_kv : 1, sizeof *g->kv))) g->n_kv = (int64_t)n_kv;
    if ((g->tensors = fl_calloc(FL_MEM_MISC, n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors))) g->n_tensors = (int64_t)n_tensors;
    if (!g->kv || !g->tensors) return fl_set_error(FL_ERR_NOMEM, "cannot allocate the GGUF index");

    g->alignment = FL_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        fl_gguf_kv *kv = &g->kv[i];
        char what[64];
        snprintf(what, sizeof what, "kv %llu", (unsigned long long)i);
        if ((st = rd_str(&c, &kv->key, what))) return st;
        if (kv->key.len == 0) return fl_set_error(FL_ERR_FORMAT, "%s has an empty key", what);
        if (memchr(kv->key.data, 0, (size_t)kv->key.len))
            return fl_set_error(FL_ERR_FORMAT, "%s: key contains a NUL byte", what);
        int32_t type;
        if ((st = rd(&c, &type, 4, what))) return st;
        if ((st = rd_value(g, &c, type, &kv->value, 0, what))) {
            fl_add_error_context("key '%.*s'", (int)(kv->key.len > 100 ? 100 : kv->key.len), kv->key.data);
            return st;
        }
        if (fl_gguf_str_eq(kv->key, "general.alignment")) {
            if (type != FL_GGUF_U32) return fl_set_error(FL_ERR_FORMAT, "general.alignment has type %s, expected u32", fl_gguf_vtype_name(type));
            uint64_t a = kv->value.v.u64;
            if (a == 0 || (a & (a - 1)) || a > (1u << 20))
                return fl_set_error(FL_ERR_FORMAT, "general.alignment %llu is not a power of two in [1, 1M]", (unsigned long long)a);
            g->alignment = (uint32_t)a;
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        fl_gguf_tensor *t = &g->tensors[i];
        char what[64];
        snprintf(what, sizeof what, "tensor info %llu", (unsigned long long)i);
        if ((st = rd_str(&c, &t->name, what))) return st;
        if (t->name.len == 0) return fl_set_error(FL_ERR_FORMAT, "%s has an empty name", what);
        if (memchr(t->name.data, 0, (size_t)t->name.len))
            return fl_set_error(FL_ERR_FORMAT, "%s: tensor name contains a NUL byte", what);
        uint32_t n_dims;
        if ((st = rd(&c, &n_dims, 4, what))) return st;
        if (n_dims < 1 || n_dims > FL_GGUF_MAX_DIMS)
            return fl_set_error(FL_ERR_FORMAT, "tensor '%.*s': %u dimensions (1..%d allowed)", (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data, n_dims, FL_GGUF_MAX_DIMS);
        t->n_dims = (int32_t)n_dims;
        int64_t nel = 1;
        for (int d = 0; d < FL_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            if ((st = rd(&c, &t->ne[d], 8, what))) return st;
            if (t->ne[d] < 0) return fl_set_error(FL_ERR_FORMAT, "tensor '%.*s': negative dimension %lld", (int)t->name.len, t->name.data, (long long)t->ne[d]);
            if (t->ne[d] && nel > INT64_MAX / t->ne[d])
                return fl_set_error(FL_ERR_RANGE, "tensor '%.*s': element count overflows", (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data);
            nel *= t->ne[d];
        }
        if ((st = rd(&c, &t->type, 4, what)) || (st = rd(&c, &t->offset, 8, what))) return st;
        const fl_type_info *ti = t->type >= 0 && t->type < FL_TYPE_GGML_COUNT ? fl_type_get(t->type) : NULL;
        if (!ti) return fl_set_error(FL_ERR_FORMAT, "tensor '%.*s': unknown tensor type %d", (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data, (int)t->type);
        if (t->ne[0] % ti->blck_size)
            return fl_set_error(FL_ERR_FORMAT, "tensor '%.*s': row of %lld elements is not a multiple of the %s block size %d",
                                (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data, (long long)t->ne[0], ti->name, ti->blck_size);
        /* size = rows * row bytes, with overflow checks */
        uint64_t row = (uint64_t)(t->ne[0] / ti->blck_size) * (uint64_t)ti->type_size;
        uint64_t rows = (uint64_t)(nel / (t->ne[0] ? t->ne[0] : 1));
        if (t->ne[0] == 0) rows = 0;
        if (rows && row > UINT64_MAX / rows) return fl_set_error(FL_ERR_RANGE, "tensor '%.*s': byte size overflows", (int)t->name.len, t->name.data);
        t->size = row * rows;
        if (t->offset % g->alignment)
            return fl_set_error(FL_ERR_FORMAT, "tensor '%.*s': offset %llu is not a multiple of the alignment %u",
                                (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data, (unsigned long long)t->offset, g->alignment);
    }
    /* data section starts at the next multiple of the alignment */
    uint64_t hdr = c.off;
    g->data_offset = (hdr + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors && g->data_offset > g->size)
        return fl_set_error(FL_ERR_FORMAT, "truncated file: data section would start at %llu, file has %zu bytes", (unsigned long long)g->data_offset, g->size);
    uint64_t data_size = g->size > g->data_offset ? g->size - g->data_offset : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        fl_gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_size || t->size > data_size - t->offset)
            return fl_set_error(FL_ERR_FORMAT, "tensor '%.*s' (offset %llu, %llu bytes) ends past the end of the file (%llu data bytes)",
                                (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data, (unsigned long long)t->offset,
                                (unsigned long long)t->size, (unsigned long long)data_size);
        t->data = g->base + g->data_offset + t->offset;
    }
    return check_unique(g);
}

static fl_status open_common(fl_gguf *g, fl_gguf **out) {
    fl_status st = parse(g);
    if (st != FL_OK) {
        fl_gguf_free(g);
        return st;
    }
    *out = g;
    return FL_OK;
}

fl_status fl_gguf_open_mem(const void *data, size_t size, fl_gguf **out) {
    *out = NULL;
    fl_gguf *g = fl_calloc(FL_MEM_MISC, 1, sizeof *g);
    if (!g) return FL_ERR_NOMEM;
    g->base = data;
    g->size = size;
    return open_common(g, out);
}

fl_status fl_gguf_open(const char *path, fl_gguf **out) { return fl_gguf_open_ex(path, false, out); }

fl_status fl_gguf_set_writable(fl_gguf *g, bool writable) {
    if (!g->map.data) return fl_set_error(FL_ERR_UNSUPPORTED, "gguf opened from memory: its tensors cannot be rewritten");
    return fl_mmap_protect(&g->map, writable);
}

fl_status fl_gguf_open_ex(const char *path, bool no_mmap, fl_gguf **out) {
    *out = NULL;
    fl_gguf *g = fl_calloc(FL_MEM_MISC, 1, sizeof *g);
    if (!g) return FL_ERR_NOMEM;
    fl_status st = no_mmap ? fl_mmap_open_read(&g->map, path) : fl_mmap_open(&g->map, path);
    if (st != FL_OK) {
        fl_free(FL_MEM_MISC, g, sizeof *g);
        return st;
    }
    g->base = g->map.data;
    g->size = g->map.size;
    st = open_common(g, out);
    if (st != FL_OK) fl_add_error_context("%s", path);
    return st;
}

size_t fl_gguf_index_bytes(const fl_gguf *g) {
    size_t n = sizeof *g + (size_t)g->cap_blocks * sizeof *g->blocks;
    for (int64_t i = 0; i < g->n_blocks; i++) n += g->blocks[i].bytes;
    if (g->kv) n += (g->n_kv ? (size_t)g->n_kv : 1) * sizeof *g->kv;
    if (g->tensors) n += (g->n_tensors ? (size_t)g->n_tensors : 1) * sizeof *g->tensors;
    return n;
}

size_t fl_gguf_index_bound(int64_t n_kv, int64_t n_tensors, int64_t n_items) {
    const size_t kv = (size_t)(n_kv > 1 ? n_kv : 1), nt = (size_t)(n_tensors > 1 ? n_tensors : 1);
    size_t cap = 16; /* the item tables' bookkeeping doubles from 16 (while it grows, old and new) */
    while (cap < kv) cap *= 2;
    return sizeof(fl_gguf) + kv * sizeof(fl_gguf_kv) + nt * sizeof(fl_gguf_tensor) +
           ((size_t)n_items + kv) * sizeof(fl_gguf_value) + cap * 3 / 2 * sizeof(struct item_block) +
           (kv > nt ? kv : nt) * sizeof(void *); /* (the duplicate check's scratch, freed before it returns) */
}

void fl_gguf_free(fl_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_blocks; i++) fl_free(FL_MEM_MISC, g->blocks[i].items, g->blocks[i].bytes);
    fl_free(FL_MEM_MISC, g->blocks, (size_t)g->cap_blocks * sizeof *g->blocks);
    if (g->kv) fl_free(FL_MEM_MISC, g->kv, (g->n_kv ? (size_t)g->n_kv : 1) * sizeof *g->kv);
    if (g->tensors) fl_free(FL_MEM_MISC, g->tensors, (g->n_tensors ? (size_t)g->n_tensors : 1) * sizeof *g->tensors);
    fl_mmap_close(&g->map);
    fl_free(FL_MEM_MISC, g, sizeof *g);
}

uint32_t fl_gguf_version(const fl_gguf *g) { return g->version; }
uint32_t fl_gguf_alignment(const fl_gguf *g) { return g->alignment; }
uint64_t fl_gguf_data_offset(const fl_gguf *g) { return g->data_offset; }
size_t fl_gguf_file_size(const fl_gguf *g) { return g->size; }
const void *fl_gguf_base(const fl_gguf *g) { return g->base; }
int64_t fl_gguf_n_kv(const fl_gguf *g) { return g->n_kv; }
const fl_gguf_kv *fl_gguf_kv_at(const fl_gguf *g, int64_t i) { return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL; }
int64_t fl_gguf_n_tensors(const fl_gguf *g) { return g->n_tensors; }
const fl_gguf_tensor *fl_gguf_tensor_at(const fl_gguf *g, int64_t i) { return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL; }

const fl_gguf_kv *fl_gguf_find(const fl_gguf *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++)
        if (fl_gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const fl_gguf_tensor *fl_gguf_find_tensor(const fl_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (fl_gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static bool is_unsigned(int32_t t) { return t == FL_GGUF_U8 || t == FL_GGUF_U16 || t == FL_GGUF_U32 || t == FL_GGUF_U64 || t == FL_GGUF_BOOL; }
static bool is_signed(int32_t t) { return t == FL_GGUF_I8 || t == FL_GGUF_I16 || t == FL_GGUF_I32 || t == FL_GGUF_I64; }

static fl_status get_int(const fl_gguf *g, const char *key, int64_t lo, uint64_t hi, int64_t *out) {
    const fl_gguf_kv *kv = fl_gguf_find(g, key);
    if (!kv) return fl_set_error(FL_ERR_INVALID, "key '%s' not found", key);
    int32_t t = kv->value.type;
    if (is_unsigned(t) && t != FL_GGUF_BOOL) {
        if (kv->value.v.u64 > hi) return fl_set_error(FL_ERR_RANGE, "key '%s' value %llu out of range", key, (unsigned long long)kv->value.v.u64);
        *out = (int64_t)kv->value.v.u64;
        return FL_OK;
    }
    if (is_signed(t)) {
        if (kv->value.v.i64 < lo || (kv->value.v.i64 > 0 && (uint64_t)kv->value.v.i64 > hi))
            return fl_set_error(FL_ERR_RANGE, "key '%s' value %lld out of range", key, (long long)kv->value.v.i64);
        *out = kv->value.v.i64;
        return FL_OK;
    }
    return fl_set_error(FL_ERR_INVALID, "key '%s' has type %s, expected an integer", key, fl_gguf_vtype_name(t));
}

fl_status fl_gguf_get_u32(const fl_gguf *g, const char *key, uint32_t *out) {
    int64_t v;
    fl_status st = get_int(g, key, 0, UINT32_MAX, &v);
    if (st == FL_OK) *out = (uint32_t)v;
    return st;
}

fl_status fl_gguf_get_i64(const fl_gguf *g, const char *key, int64_t *out) {
    return get_int(g, key, INT64_MIN, INT64_MAX, out);
}

fl_status fl_gguf_get_f32(const fl_gguf *g, const char *key, float *out) {
    const fl_gguf_kv *kv = fl_gguf_find(g, key);
    if (!kv) return fl_set_error(FL_ERR_INVALID, "key '%s' not found", key);
    int32_t t = kv->value.type;
    if (t == FL_GGUF_F32 || t == FL_GGUF_F64) *out = (float)kv->value.v.f64;
    else if (is_signed(t)) *out = (float)kv->value.v.i64;
    else if (is_unsigned(t) && t != FL_GGUF_BOOL) *out = (float)kv->value.v.u64;
    else return fl_set_error(FL_ERR_INVALID, "key '%s' has type %s, expected a number", key, fl_gguf_vtype_name(t));
    return FL_OK;
}

fl_status fl_gguf_get_bool(const fl_gguf *g, const char *key, bool *out) {
    const fl_gguf_kv *kv = fl_gguf_find(g, key);
    if (!kv) return fl_set_error(FL_ERR_INVALID, "key '%s' not found", key);
    if (kv->value.type != FL_GGUF_BOOL) return fl_set_error(FL_ERR_INVALID, "key '%s' has type %s, expected bool", key, fl_gguf_vtype_name(kv->value.type));
    *out = kv->value.v.u64 != 0;
    return FL_OK;
}

fl_status fl_gguf_get_str(const fl_gguf *g, const char *key, char *buf, size_t cap) {
    const fl_gguf_kv *kv = fl_gguf_find(g, key);
    if (!kv) return fl_set_error(FL_ERR_INVALID, "key '%s' not found", key);
    if (kv->value.type != FL_GGUF_STRING) return fl_set_error(FL_ERR_INVALID, "key '%s' has type %s, expected string", key, fl_gguf_vtype_name(kv->value.type));
    if (kv->value.v.str.len >= cap) return fl_set_error(FL_ERR_RANGE, "key '%s': string of %llu bytes too long", key, (unsigned long long)kv->value.v.str.len);
    memcpy(buf, kv->value.v.str.data, (size_t)kv->value.v.str.len);
    buf[kv->value.v.str.len] = 0;
    return FL_OK;
}

const fl_gguf_value *fl_gguf_get_arr(const fl_gguf *g, const char *key) {
    const fl_gguf_kv *kv = fl_gguf_find(g, key);
    return kv && kv->value.type == FL_GGUF_ARRAY ? &kv->value : NULL;
}

/* double -> int64 truncating toward zero, saturating (NaN -> 0) instead of undefined */
static int64_t f64_to_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775807.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

int64_t fl_gguf_arr_i64(const fl_gguf_value *a, uint64_t i) {
    FL_ASSERT(i < a->v.arr.n && a->v.arr.raw);
    const unsigned char *p = a->v.arr.raw + i * vtype_sizes[a->v.arr.type];
    switch (a->v.arr.type) {
    case FL_GGUF_U8: case FL_GGUF_BOOL: return p[0];
    case FL_GGUF_I8: return (int8_t)p[0];
    case FL_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case FL_GGUF_I16: { int16_t x; memcpy(&x, p, 2); return x; }
    case FL_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case FL_GGUF_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    case FL_GGUF_U64: case FL_GGUF_I64: { int64_t x; memcpy(&x, p, 8); return x; }
    case FL_GGUF_F32: { float x; memcpy(&x, p, 4); return f64_to_i64(x); }
    case FL_GGUF_F64: { double x; memcpy(&x, p, 8); return f64_to_i64(x); }
    }
    return 0;
}

double fl_gguf_arr_f64(const fl_gguf_value *a, uint64_t i) {
    FL_ASSERT(i < a->v.arr.n && a->v.arr.raw);
    const unsigned char *p = a->v.arr.raw + i * vtype_sizes[a->v.arr.type];
    if (a->v.arr.type == FL_GGUF_F32) { float x; memcpy(&x, p, 4); return x; }
    if (a->v.arr.type == FL_GGUF_F64) { double x; memcpy(&x, p, 8); return x; }
    if (a->v.arr.type == FL_GGUF_U64) { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    return (double)fl_gguf_arr_i64(a, i);
}

void fl_gguf_value_str(const fl_gguf_value *v, char *buf, size_t cap) {
    switch (v->type) {
    case FL_GGUF_STRING: {
        int n = v->v.str.len > 60 ? 60 : (int)v->v.str.len;
        char tmp[64];
        int k = 0;
        for (int i = 0; i < n; i++) {
            char ch = v->v.str.data[i];
            tmp[k++] = (ch == '\n' || ch == '\r' || ch == '\t') ? ' ' : ch;
        }
        tmp[k] = 0;
        snprintf(buf, cap, "\"%s\"%s", tmp, v->v.str.len > 60 ? "..." : "");
        break;
    }
    case FL_GGUF_ARRAY:
        snprintf(buf, cap, "[%s x %llu]", fl_gguf_vtype_name(v->v.arr.type), (unsigned long long)v->v.arr.n);
        break;
    case FL_GGUF_F32: case FL_GGUF_F64: snprintf(buf, cap, "%g", v->v.f64); break;
    case FL_GGUF_BOOL: snprintf(buf, cap, "%s", v->v.u64 ? "true" : "false"); break;
    default:
        if (is_signed(v->type)) snprintf(buf, cap, "%lld", (long long)v->v.i64);
        else snprintf(buf, cap, "%llu", (unsigned long long)v->v.u64);
    }
}
