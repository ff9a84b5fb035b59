/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader and writer.
 *
 * Each input is parsed with fl_gguf_open_mem.  When it parses, every getter is called on every
 * key and tensor (typed getters on all keys, scalar-array element reads, value formatting,
 * lookups by name, first/last byte of every tensor's data), and the parsed file is written back
 * with the writer (to a tmpfs file when /dev/shm exists) and re-read: the copy must parse and
 * hold the same keys and tensors.  Any crash, sanitizer report, leak of tracked memory or
 * failed invariant aborts.
 *
 * Build: cmake -DFITLLM_FUZZ=ON -DCMAKE_C_COMPILER=clang (see tests/cli_fuzz.sh).
 */
#include "core/alloc.h"
#include "core/status.h"
#include "formats/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_gguf: invariant failed: %s (%s)\n", what, fl_last_error());
        abort();
    }
}

static void touch_value(const fl_gguf_value *v) {
    char buf[160];
    fl_gguf_value_str(v, buf, sizeof buf);
    sink += (unsigned)strlen(buf);
    if (v->type != FL_GGUF_ARRAY) return;
    if (v->v.arr.raw && v->v.arr.n) {
        uint64_t n = v->v.arr.n;
        uint64_t idx[3] = {0, n / 2, n - 1};
        for (int k = 0; k < 3; k++) {
            sink += (unsigned)fl_gguf_arr_i64(v, idx[k]);
            double d = fl_gguf_arr_f64(v, idx[k]);
            sink += d == d ? 1u : 2u;
        }
    }
    if (v->v.arr.items)
        for (uint64_t i = 0; i < v->v.arr.n && i < 64; i++) touch_value(&v->v.arr.items[i]);
}

static void touch_all(const fl_gguf *g) {
    sink += fl_gguf_version(g) + fl_gguf_alignment(g);
    check(fl_gguf_data_offset(g) <= fl_gguf_file_size(g) || fl_gguf_n_tensors(g) == 0, "data offset within the file");
    for (int64_t i = 0; i < fl_gguf_n_kv(g); i++) {
        const fl_gguf_kv *kv = fl_gguf_kv_at(g, i);
        check(kv != NULL, "kv_at in range");
        char key[256];
        size_t n = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.data, n);
        key[n] = 0;
        uint32_t u;
        int64_t i64;
        float f;
        bool b;
        char s[64];
        (void)fl_gguf_get_u32(g, key, &u);
        (void)fl_gguf_get_i64(g, key, &i64);
        (void)fl_gguf_get_f32(g, key, &f);
        (void)fl_gguf_get_bool(g, key, &b);
        (void)fl_gguf_get_str(g, key, s, sizeof s);
        const fl_gguf_value *arr = fl_gguf_get_arr(g, key);
        if (arr) touch_value(arr);
        if (!memchr(kv->key.data, 0, (size_t)kv->key.len) && kv->key.len < sizeof key)
            check(fl_gguf_find(g, key) != NULL, "find finds every key");
        touch_value(&kv->value);
    }
    check(fl_gguf_kv_at(g, fl_gguf_n_kv(g)) == NULL, "kv_at past the end is NULL");
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        check(t != NULL, "tensor_at in range");
        const unsigned char *base = fl_gguf_base(g);
        const unsigned char *p = t->data;
        check(p >= base && (uint64_t)(p - base) + t->size <= fl_gguf_file_size(g), "tensor data inside the file");
        if (t->size) sink += p[0] + p[t->size - 1];
        char name[256];
        size_t n = t->name.len < sizeof name - 1 ? (size_t)t->name.len : sizeof name - 1;
        memcpy(name, t->name.data, n);
        name[n] = 0;
        (void)fl_gguf_find_tensor(g, name);
    }
    (void)fl_gguf_find(g, "general.architecture");
    (void)fl_gguf_find_tensor(g, "token_embd.weight");
}

/* Write g back and re-read the copy: it must parse and hold the same counts. */
static void roundtrip(const fl_gguf *g) {
    static char path[256];
    if (!path[0]) {
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(path, sizeof path, "%s/fuzz_gguf.%ld.gguf", dir, (long)getpid());
    }
    fl_gguf_writer *w = fl_gguf_writer_new();
    check(w != NULL, "writer_new");
    fl_status st = fl_gguf_writer_copy_all(w, g);
    if (st == FL_OK) st = fl_gguf_writer_write(w, path, NULL, NULL);
    fl_gguf_writer_free(w);
    /* keys/tensors with names >= 1024 bytes are refused by the writer: that is fine */
    if (st != FL_OK) return;
    fl_gguf *g2 = NULL;
    st = fl_gguf_open(path, &g2);
    check(st == FL_OK, "the written copy parses");
    check(fl_gguf_n_kv(g2) == fl_gguf_n_kv(g) && fl_gguf_n_tensors(g2) == fl_gguf_n_tensors(g), "copy has the same counts");
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *a = fl_gguf_tensor_at(g, i), *b = fl_gguf_tensor_at(g2, i);
        check(a->size == b->size && a->type == b->type && (!a->size || !memcmp(a->data, b->data, (size_t)a->size)),
              "copy has the same tensor data");
    }
    fl_gguf_free(g2);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fl_gguf *g = NULL;
    fl_status st = fl_gguf_open_mem(data, size, &g);
    if (st == FL_OK) {
        check(g != NULL, "open_mem returns a reader on FL_OK");
        touch_all(g);
        roundtrip(g);
        fl_gguf_free(g);
    } else {
        check(g == NULL, "no reader on failure");
        check(st < 0 && fl_last_error()[0] != 0, "failure has a message");
    }
    check(fl_mem_all_zero(), "tracked memory back at zero");
    return 0;
}
