/* GGUF writer: metadata entries are serialized as they are set; tensor data is borrowed. */
#include "formats/gguf.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct wbuf {
    unsigned char *p;
    size_t len, cap;
} wbuf;

typedef struct wkv {
    char *key;
    wbuf val; /* u32 type + payload, as in the file */
} wkv;

typedef struct wtensor {
    char *name;
    int32_t type, n_dims;
    int64_t ne[FL_GGUF_MAX_DIMS];
    const void *data;
    uint64_t size;
    fl_gguf_fill_fn fill; /* or its bytes made at write time */
    fl_gguf_fill_at_fn fill_at; /* or made in pieces of `chunk` bytes */
    size_t chunk;
    void *fill_ud;
} wtensor;

struct fl_gguf_writer {
    wkv *kv;
    int64_t n_kv, cap_kv;
    wtensor *t;
    int64_t n_t, cap_t;
    uint32_t alignment, version;
};

static fl_status wb_put(wbuf *b, const void *d, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap *= 2;
        unsigned char *p = fl_realloc(FL_MEM_MISC, b->p, b->cap, cap, 8);
        if (!p) return FL_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    return FL_OK;
}
static void wb_free(wbuf *b) { fl_free(FL_MEM_MISC, b->p, b->cap); memset(b, 0, sizeof *b); }
static fl_status wb_u32(wbuf *b, uint32_t v) { return wb_put(b, &v, 4); }
static fl_status wb_u64(wbuf *b, uint64_t v) { return wb_put(b, &v, 8); }
static fl_status wb_str(wbuf *b, const char *s, uint64_t n) {
    fl_status st = wb_u64(b, n);
    return st ? st : wb_put(b, s, (size_t)n);
}

fl_gguf_writer *fl_gguf_writer_new(void) {
    fl_gguf_writer *w = fl_calloc(FL_MEM_MISC, 1, sizeof *w);
    if (w) {
        w->alignment = FL_GGUF_DEFAULT_ALIGNMENT;
        w->version = 3;
    }
    return w;
}

void fl_gguf_writer_free(fl_gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        fl_free(FL_MEM_MISC, w->kv[i].key, strlen(w->kv[i].key) + 1);
        wb_free(&w->kv[i].val);
    }
    fl_free(FL_MEM_MISC, w->kv, (size_t)w->cap_kv * sizeof *w->kv);
    for (int64_t i = 0; i < w->n_t; i++) fl_free(FL_MEM_MISC, w->t[i].name, strlen(w->t[i].name) + 1);
    fl_free(FL_MEM_MISC, w->t, (size_t)w->cap_t * sizeof *w->t);
    fl_free(FL_MEM_MISC, w, sizeof *w);
}

fl_status fl_gguf_writer_set_alignment(fl_gguf_writer *w, uint32_t a) {
    if (!a || (a & (a - 1)) || a > (1u << 20))
        return fl_set_error(FL_ERR_INVALID, "gguf writer: alignment %u is not a power of two in [1, 1M]", a);
    w->alignment = a;
    return fl_gguf_writer_set_u32(w, "general.alignment", a);
}

/* The alignment the file will declare: general.alignment if set (as u32), else the default. */
static fl_status file_alignment(const fl_gguf_writer *w, uint32_t *out) {
    *out = FL_GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment")) continue;
        uint32_t type, a;
        if (w->kv[i].val.len != 8) return fl_set_error(FL_ERR_INVALID, "gguf writer: general.alignment is not a u32");
        memcpy(&type, w->kv[i].val.p, 4);
        memcpy(&a, w->kv[i].val.p + 4, 4);
        if (type != FL_GGUF_U32 || !a || (a & (a - 1)) || a > (1u << 20))
            return fl_set_error(FL_ERR_INVALID, "gguf writer: general.alignment is not a power-of-two u32");
        *out = a;
    }
    return FL_OK;
}
void fl_gguf_writer_set_version(fl_gguf_writer *w, uint32_t v) { w->version = v; }

/* The entry for key, created empty at the end if absent (its value buffer reset). */
static wkv *slot(fl_gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            w->kv[i].val.len = 0;
            return &w->kv[i];
        }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *p = fl_realloc(FL_MEM_MISC, w->kv, (size_t)w->cap_kv * sizeof *p, (size_t)cap * sizeof *p, 8);
        if (!p) return NULL;
        w->kv = p;
        w->cap_kv = cap;
    }
    wkv *e = &w->kv[w->n_kv];
    memset(e, 0, sizeof *e);
    e->key = fl_strdup(FL_MEM_MISC, key);
    if (!e->key) return NULL;
    w->n_kv++;
    return e;
}

static fl_status set_scalar(fl_gguf_writer *w, const char *key, int32_t type, const void *v) {
    wkv *e = slot(w, key);
    if (!e) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    fl_status st = wb_u32(&e->val, (uint32_t)type);
    return st ? st : wb_put(&e->val, v, fl_gguf_vtype_size(type));
}

fl_status fl_gguf_writer_set_u32(fl_gguf_writer *w, const char *k, uint32_t v) { return set_scalar(w, k, FL_GGUF_U32, &v); }
fl_status fl_gguf_writer_set_i32(fl_gguf_writer *w, const char *k, int32_t v) { return set_scalar(w, k, FL_GGUF_I32, &v); }
fl_status fl_gguf_writer_set_u64(fl_gguf_writer *w, const char *k, uint64_t v) { return set_scalar(w, k, FL_GGUF_U64, &v); }
fl_status fl_gguf_writer_set_f32(fl_gguf_writer *w, const char *k, float v) { return set_scalar(w, k, FL_GGUF_F32, &v); }
fl_status fl_gguf_writer_set_bool(fl_gguf_writer *w, const char *k, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, k, FL_GGUF_BOOL, &b);
}

fl_status fl_gguf_writer_set_str(fl_gguf_writer *w, const char *key, const char *v) {
    wkv *e = slot(w, key);
    if (!e) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    fl_status st = wb_u32(&e->val, FL_GGUF_STRING);
    return st ? st : wb_str(&e->val, v, strlen(v));
}

fl_status fl_gguf_writer_set_arr(fl_gguf_writer *w, const char *key, int32_t et, const void *data, uint64_t n) {
    size_t es = fl_gguf_vtype_size(et);
    if (!es) return fl_set_error(FL_ERR_INVALID, "gguf writer: %s is not a scalar element type", fl_gguf_vtype_name(et));
    wkv *e = slot(w, key);
    if (!e) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    fl_status st;
    if ((st = wb_u32(&e->val, FL_GGUF_ARRAY)) || (st = wb_u32(&e->val, (uint32_t)et)) || (st = wb_u64(&e->val, n))) return st;
    return wb_put(&e->val, data, (size_t)n * es);
}

fl_status fl_gguf_writer_set_arr_str(fl_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    wkv *e = slot(w, key);
    if (!e) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    fl_status st;
    if ((st = wb_u32(&e->val, FL_GGUF_ARRAY)) || (st = wb_u32(&e->val, FL_GGUF_STRING)) || (st = wb_u64(&e->val, n))) return st;
    for (uint64_t i = 0; i < n; i++)
        if ((st = wb_str(&e->val, strs[i], strlen(strs[i])))) return st;
    return FL_OK;
}

/* Serialize a parsed value's payload (without its own type tag). */
static fl_status put_payload(wbuf *b, const fl_gguf_value *v) {
    fl_status st;
    switch (v->type) {
    case FL_GGUF_STRING: return wb_str(b, v->v.str.data, v->v.str.len);
    case FL_GGUF_ARRAY: {
        if ((st = wb_u32(b, (uint32_t)v->v.arr.type)) || (st = wb_u64(b, v->v.arr.n))) return st;
        if (v->v.arr.raw) return wb_put(b, v->v.arr.raw, (size_t)v->v.arr.n * fl_gguf_vtype_size(v->v.arr.type));
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            if ((st = put_payload(b, &v->v.arr.items[i]))) return st;
        return FL_OK;
    }
    case FL_GGUF_F32: { float f = (float)v->v.f64; return wb_put(b, &f, 4); }
    case FL_GGUF_F64: return wb_put(b, &v->v.f64, 8);
    default: {
        /* integers and bool: the low bytes of the 64-bit value, little-endian */
        uint64_t u = v->v.u64;
        return wb_put(b, &u, fl_gguf_vtype_size(v->type));
    }
    }
}

fl_status fl_gguf_writer_copy_kv(fl_gguf_writer *w, const fl_gguf_kv *kv) {
    char key[1024];
    if (kv->key.len >= sizeof key) return fl_set_error(FL_ERR_RANGE, "gguf writer: key too long");
    memcpy(key, kv->key.data, (size_t)kv->key.len);
    key[kv->key.len] = 0;
    wkv *e = slot(w, key);
    if (!e) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    fl_status st = wb_u32(&e->val, (uint32_t)kv->value.type);
    return st ? st : put_payload(&e->val, &kv->value);
}

fl_status fl_gguf_writer_remove(fl_gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            fl_free(FL_MEM_MISC, w->kv[i].key, strlen(w->kv[i].key) + 1);
            wb_free(&w->kv[i].val);
            memmove(&w->kv[i], &w->kv[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kv);
            w->n_kv--;
            return FL_OK;
        }
    return FL_OK;
}

fl_status fl_gguf_writer_add_tensor_fn(fl_gguf_writer *w, const char *name, int32_t type, int32_t n_dims,
                                       const int64_t *ne, fl_gguf_fill_fn fill, void *ud) {
    fl_status st = fl_gguf_writer_add_tensor(w, name, type, n_dims, ne, NULL);
    if (st) return st;
    w->t[w->n_t - 1].fill = fill;
    w->t[w->n_t - 1].fill_ud = ud;
    return FL_OK;
}

fl_status fl_gguf_writer_add_tensor_chunks(fl_gguf_writer *w, const char *name, int32_t type, int32_t n_dims,
                                           const int64_t *ne, fl_gguf_fill_at_fn fill_at, void *ud, size_t chunk) {
    if (chunk < 1) return fl_set_error(FL_ERR_INVALID, "tensor '%s': pieces of 0 bytes", name);
    fl_status st = fl_gguf_writer_add_tensor(w, name, type, n_dims, ne, NULL);
    if (st) return st;
    w->t[w->n_t - 1].fill_at = fill_at;
    w->t[w->n_t - 1].chunk = chunk;
    w->t[w->n_t - 1].fill_ud = ud;
    return FL_OK;
}

fl_status fl_gguf_writer_add_tensor(fl_gguf_writer *w, const char *name, int32_t type, int32_t n_dims,
                                    const int64_t *ne, const void *data) {
    const fl_type_info *ti = fl_type_get(type);
    if (!ti || type >= FL_TYPE_GGML_COUNT) return fl_set_error(FL_ERR_INVALID, "tensor '%s': type %d cannot be written to GGUF", name, type);
    if (n_dims < 1 || n_dims > FL_GGUF_MAX_DIMS) return fl_set_error(FL_ERR_INVALID, "tensor '%s': %d dims", name, n_dims);
    if (ne[0] % ti->blck_size) return fl_set_error(FL_ERR_INVALID, "tensor '%s': row not a multiple of the block size", name);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return fl_set_error(FL_ERR_INVALID, "tensor '%s' added twice", name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *p = fl_realloc(FL_MEM_MISC, w->t, (size_t)w->cap_t * sizeof *p, (size_t)cap * sizeof *p, 8);
        if (!p) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
        w->t = p;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = fl_strdup(FL_MEM_MISC, name);
    if (!t->name) return fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    t->type = type;
    t->n_dims = n_dims;
    uint64_t rows = 1;
    for (int d = 0; d < FL_GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        if (d > 0) rows *= (uint64_t)t->ne[d];
    }
    t->size = fl_type_row_size(type, t->ne[0]) * rows;
    t->data = data;
    w->n_t++;
    return FL_OK;
}

fl_status fl_gguf_writer_copy_all(fl_gguf_writer *w, const fl_gguf *g) {
    fl_status st;
    w->alignment = fl_gguf_alignment(g);
    w->version = fl_gguf_version(g);
    for (int64_t i = 0; i < fl_gguf_n_kv(g); i++)
        if ((st = fl_gguf_writer_copy_kv(w, fl_gguf_kv_at(g, i)))) return st;
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        char name[1024];
        if (t->name.len >= sizeof name) return fl_set_error(FL_ERR_RANGE, "tensor name too long");
        memcpy(name, t->name.data, (size_t)t->name.len);
        name[t->name.len] = 0;
        if ((st = fl_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data))) return st;
    }
    return FL_OK;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int fwrite_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

/* n zero bytes (padding can be up to the 1 MiB maximum alignment) */
static int fwrite_zeros(FILE *f, uint64_t n) {
    static const unsigned char zeros[4096];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite_all(f, zeros, k)) return -1;
        n -= k;
    }
    return 0;
}

fl_status fl_gguf_writer_write(fl_gguf_writer *w, const char *path,
                               void (*progress)(uint64_t, uint64_t, void *), void *ud) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return fl_set_error(FL_ERR_INVALID, "output path too long");
    FILE *f = fopen(tmp, "wb");
    if (!f) return fl_set_error(FL_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    wbuf h = {0};
    uint64_t total = 0;
    fl_status st = file_alignment(w, &w->alignment);
    if (st) goto fail;
    /* header + kv + tensor infos in one buffer */
    if ((st = wb_put(&h, "GGUF", 4)) || (st = wb_u32(&h, w->version)) || (st = wb_u64(&h, (uint64_t)w->n_t)) ||
        (st = wb_u64(&h, (uint64_t)w->n_kv)))
        goto fail;
    for (int64_t i = 0; i < w->n_kv; i++)
        if ((st = wb_str(&h, w->kv[i].key, strlen(w->kv[i].key))) || (st = wb_put(&h, w->kv[i].val.p, w->kv[i].val.len))) goto fail;
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        if ((st = wb_str(&h, t->name, strlen(t->name))) || (st = wb_u32(&h, (uint32_t)t->n_dims))) goto fail;
        for (int d = 0; d < t->n_dims; d++)
            if ((st = wb_u64(&h, (uint64_t)t->ne[d]))) goto fail;
        if ((st = wb_u32(&h, (uint32_t)t->type)) || (st = wb_u64(&h, off))) goto fail;
        off = align_up(off + t->size, w->alignment);
        total += t->size;
    }
    if (fwrite_all(f, h.p, h.len)) goto io_fail;
    uint64_t pos = h.len, pad = align_up(pos, w->alignment) - pos;
    if (w->n_t && fwrite_zeros(f, pad)) goto io_fail;
    uint64_t done = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        if (t->fill && t->size) { /* made now, one tensor in memory at a time */
            void *buf = fl_alloc(FL_MEM_MISC, (size_t)t->size, 64);
            if (!buf) {
                st = fl_set_error(FL_ERR_NOMEM, "gguf writer: no memory for tensor '%s'", t->name);
                goto fail;
            }
            st = t->fill(t->fill_ud, buf, (size_t)t->size);
            const int bad = st || fwrite_all(f, buf, (size_t)t->size);
            fl_free(FL_MEM_MISC, buf, (size_t)t->size);
            if (st) goto fail;
            if (bad) goto io_fail;
        } else if (t->fill_at && t->size) { /* made in pieces into one buffer */
            const size_t cap = t->size < t->chunk ? (size_t)t->size : t->chunk;
            void *buf = fl_alloc(FL_MEM_MISC, cap, 64);
            if (!buf) {
                st = fl_set_error(FL_ERR_NOMEM, "gguf writer: no memory for a piece of tensor '%s'", t->name);
                goto fail;
            }
            int bad = 0;
            for (uint64_t o = 0; o < t->size && !st && !bad; o += cap) {
                const size_t k = t->size - o < cap ? (size_t)(t->size - o) : cap;
                st = t->fill_at(t->fill_ud, buf, o, k);
                bad = st || fwrite_all(f, buf, k);
            }
            fl_free(FL_MEM_MISC, buf, cap);
            if (st) goto fail;
            if (bad) goto io_fail;
        } else if (t->size && fwrite_all(f, t->data, (size_t)t->size)) goto io_fail;
        uint64_t p2 = align_up(t->size, w->alignment) - t->size;
        if (fwrite_zeros(f, p2)) goto io_fail;
        done += t->size;
        if (progress) progress(done, total, ud);
    }
    if (fflush(f) || fsync(fileno(f))) goto io_fail;
    if (fclose(f)) {
        f = NULL;
        goto io_fail;
    }
    f = NULL;
    if (rename(tmp, path)) {
        st = fl_set_error(FL_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        unlink(tmp);
    }
    wb_free(&h);
    return st;
io_fail:
    st = fl_set_error(FL_ERR_IO, "writing '%s' failed: %s", path, strerror(errno));
fail:
    if (st == FL_ERR_NOMEM) fl_set_error(FL_ERR_NOMEM, "gguf writer: out of memory");
    if (f) fclose(f);
    unlink(tmp);
    wb_free(&h);
    return st;
}
