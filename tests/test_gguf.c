/* Tests for src/formats/gguf: byte-exact round trips of every shared file, bad input (each case
 * checks the status and the message), typed getters on a real file, a seeded mutation run. */
#include "test.h"

#include "core/alloc.h"
#include "core/status.h"
#include "formats/gguf.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- round trip: read + copy_all + write == the original bytes ---- */

static int roundtrip_dir(const char *dir, const char *tmpdir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".gguf")) continue;
        char src[1024], dst[1024];
        snprintf(src, sizeof src, "%s/%s", dir, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", tmpdir, e->d_name);
        fl_gguf *g = NULL;
        fl_status st = fl_gguf_open(src, &g);
        if (st != FL_OK) fail_msg("%s: %s", src, fl_last_error());
        fl_gguf_writer *w = fl_gguf_writer_new();
        assert_non_null(w);
        assert_int_equal(fl_gguf_writer_copy_all(w, g), FL_OK);
        st = fl_gguf_writer_write(w, dst, NULL, NULL);
        if (st != FL_OK) fail_msg("%s: %s", dst, fl_last_error());
        fl_gguf_writer_free(w);
        fl_gguf_free(g);
        size_t na, nb;
        char *a = fl_test_read_file(src, &na), *b = fl_test_read_file(dst, &nb);
        assert_non_null(a);
        assert_non_null(b);
        if (na != nb) fail_msg("%s: copy has %zu bytes, original %zu", e->d_name, nb, na);
        if (memcmp(a, b, na)) {
            size_t i = 0;
            while (a[i] == b[i]) i++;
            fail_msg("%s: copy differs from the original at byte %zu", e->d_name, i);
        }
        fl_test_free_file(a, na);
        fl_test_free_file(b, nb);
        unlink(dst);
        n++;
    }
    closedir(d);
    return n;
}

static void test_roundtrip_all_shared(void **state) {
    (void)state;
    NEED_SHARED();
    char tmpdir[] = "/tmp/fl_test_gguf_XXXXXX";
    assert_non_null(mkdtemp(tmpdir));
    int n = roundtrip_dir(FL_SHARED_PATH("models"), tmpdir);
    n += roundtrip_dir(FL_SHARED_PATH("models/synth256"), tmpdir);
    n += roundtrip_dir(FL_SHARED_PATH("vocab"), tmpdir);
    rmdir(tmpdir);
    assert_true(n >= 6 + 14 + 10); /* every shared file was read and rewritten */
    fl_test_mem_zero();
}

/* ---- a tiny byte builder for hand-made (and broken) files ---- */

typedef struct bb {
    unsigned char p[8192];
    size_t n;
} bb;

static void put(bb *b, const void *d, size_t n) {
    FL_ASSERT(b->n + n <= sizeof b->p);
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void u32(bb *b, uint32_t v) { put(b, &v, 4); }
static void u64(bb *b, uint64_t v) { put(b, &v, 8); }
static void str(bb *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
static void kv_u32(bb *b, const char *key, uint32_t v) {
    str(b, key);
    u32(b, FL_GGUF_U32);
    u32(b, v);
}
static void tinfo(bb *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) u64(b, (uint64_t)ne[d]);
    u32(b, type);
    u64(b, off);
}
/* pad to the alignment, then `data` zero bytes */
static void data(bb *b, size_t align, size_t nbytes) {
    while (b->n % align) b->p[b->n++] = 0;
    FL_ASSERT(b->n + nbytes <= sizeof b->p);
    memset(b->p + b->n, 0, nbytes);
    b->n += nbytes;
}

/* Parse b (copied into an exact-size heap block so ASan catches any overread) and check the
 * status and that the message contains `msg`. */
static void expect(const bb *b, fl_status want, const char *msg) {
    unsigned char *copy = malloc(b->n ? b->n : 1); /* exact size on purpose, not tracked */
    assert_non_null(copy);
    memcpy(copy, b->p, b->n);
    fl_gguf *g = (fl_gguf *)1;
    fl_clear_error();
    fl_status st = fl_gguf_open_mem(copy, b->n, &g);
    if (st != want) fail_msg("status %d (%s), want %d; message: %s", st, fl_status_str(st), want, fl_last_error());
    if (want == FL_OK) {
        assert_non_null(g);
        fl_gguf_free(g);
    } else {
        assert_null(g);
        if (!strstr(fl_last_error(), msg)) fail_msg("message '%s' lacks '%s'", fl_last_error(), msg);
    }
    free(copy);
    fl_test_mem_zero();
}

/* A valid file: 2 kvs, 2 f32 tensors of 8 elements (32 bytes each). */
static void good(bb *b) {
    int64_t ne[1] = {8};
    hdr(b, 3, 2, 2);
    kv_u32(b, "a.x", 1);
    kv_u32(b, "a.y", 2);
    tinfo(b, "t0", 1, ne, 0, 0);
    tinfo(b, "t1", 1, ne, 0, 32);
    data(b, 32, 64);
}

static void test_bad_header(void **state) {
    (void)state;
    bb b;
    good(&b);
    expect(&b, FL_OK, "");
    b.p[0] = 'X';
    expect(&b, FL_ERR_FORMAT, "bad magic");
    good(&b);
    memcpy(b.p + 4, &(uint32_t){1}, 4);
    expect(&b, FL_ERR_UNSUPPORTED, "version 1");
    memcpy(b.p + 4, &(uint32_t){4}, 4);
    expect(&b, FL_ERR_UNSUPPORTED, "version 4");
    memcpy(b.p + 4, &(uint32_t){0x03000000u}, 4); /* 3, big-endian */
    expect(&b, FL_ERR_UNSUPPORTED, "byte-swapped");
    memcpy(b.p + 4, &(uint32_t){2}, 4);
    expect(&b, FL_OK, "");
    good(&b);
    memcpy(b.p + 16, &(uint64_t){1ull << 62}, 8);
    expect(&b, FL_ERR_FORMAT, "kv count");
    good(&b);
    memcpy(b.p + 8, &(uint64_t){UINT64_MAX}, 8);
    expect(&b, FL_ERR_FORMAT, "tensor count");
    /* empty and tiny inputs */
    b.n = 0;
    expect(&b, FL_ERR_FORMAT, "truncated");
    hdr(&b, 3, 0, 0);
    b.n = 20;
    expect(&b, FL_ERR_FORMAT, "truncated");
}

static void test_bad_strings_arrays(void **state) {
    (void)state;
    bb b;
    /* huge key length */
    hdr(&b, 3, 0, 1);
    u64(&b, 1ull << 60);
    put(&b, "abc", 3);
    data(&b, 1, 32);
    expect(&b, FL_ERR_FORMAT, "string length");
    /* huge string value length */
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, FL_GGUF_STRING);
    u64(&b, UINT64_MAX);
    data(&b, 1, 32);
    expect(&b, FL_ERR_FORMAT, "string length");
    /* huge scalar array count (n * 4 overflows 64 bits) */
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, FL_GGUF_ARRAY);
    u32(&b, FL_GGUF_U32);
    u64(&b, 1ull << 62);
    u32(&b, 0);
    data(&b, 1, 32);
    expect(&b, FL_ERR_FORMAT, "exceeds the");
    /* huge string array count */
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, FL_GGUF_ARRAY);
    u32(&b, FL_GGUF_STRING);
    u64(&b, 1ull << 40);
    str(&b, "x");
    data(&b, 1, 32);
    expect(&b, FL_ERR_FORMAT, "cannot fit");
    /* arrays nested deeper than 8 */
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, FL_GGUF_ARRAY);
    for (int i = 0; i < 12; i++) {
        u32(&b, FL_GGUF_ARRAY);
        u64(&b, 1);
    }
    u32(&b, FL_GGUF_U8);
    u64(&b, 0);
    data(&b, 1, 64);
    expect(&b, FL_ERR_FORMAT, "nested deeper");
    /* 8 levels is fine */
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, FL_GGUF_ARRAY);
    for (int i = 0; i < 7; i++) {
        u32(&b, FL_GGUF_ARRAY);
        u64(&b, 1);
    }
    u32(&b, FL_GGUF_U8);
    u64(&b, 0);
    expect(&b, FL_OK, "");
    /* unknown value type, bad bool */
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, 13);
    u64(&b, 0);
    data(&b, 1, 32);
    expect(&b, FL_ERR_FORMAT, "unknown value type");
    hdr(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, FL_GGUF_BOOL);
    put(&b, "\x02", 1);
    expect(&b, FL_ERR_FORMAT, "bool");
    /* duplicate keys, empty key, key with a NUL */
    hdr(&b, 3, 0, 3);
    kv_u32(&b, "a.x", 1);
    kv_u32(&b, "a.y", 1);
    kv_u32(&b, "a.x", 2);
    expect(&b, FL_ERR_FORMAT, "duplicate key 'a.x'");
    hdr(&b, 3, 0, 1);
    kv_u32(&b, "", 1);
    expect(&b, FL_ERR_FORMAT, "empty key");
    hdr(&b, 3, 0, 1);
    u64(&b, 3);
    put(&b, "a\0b", 3);
    u32(&b, FL_GGUF_U32);
    u32(&b, 1);
    expect(&b, FL_ERR_FORMAT, "NUL");
}

static void test_bad_alignment(void **state) {
    (void)state;
    bb b;
    int64_t ne[1] = {8};
    uint32_t bad[] = {0, 3, 48, 1u << 30};
    for (int i = 0; i < 4; i++) {
        hdr(&b, 3, 1, 1);
        kv_u32(&b, "general.alignment", bad[i]);
        tinfo(&b, "t", 1, ne, 0, 0);
        data(&b, 64, 32);
        expect(&b, FL_ERR_FORMAT, "not a power of two");
    }
    hdr(&b, 3, 1, 1);
    str(&b, "general.alignment");
    u32(&b, FL_GGUF_U64);
    u64(&b, 64);
    tinfo(&b, "t", 1, ne, 0, 0);
    data(&b, 64, 32);
    expect(&b, FL_ERR_FORMAT, "expected u32");
    hdr(&b, 3, 1, 1);
    kv_u32(&b, "general.alignment", 64);
    tinfo(&b, "t", 1, ne, 0, 0);
    data(&b, 64, 32);
    expect(&b, FL_OK, "");
    /* offset 32 is misaligned under alignment 64 */
    hdr(&b, 3, 1, 1);
    kv_u32(&b, "general.alignment", 64);
    tinfo(&b, "t", 1, ne, 0, 32);
    data(&b, 64, 128);
    expect(&b, FL_ERR_FORMAT, "not a multiple of the alignment 64");
}

static void test_bad_tensors(void **state) {
    (void)state;
    bb b;
    int64_t ne[5] = {8, 1, 1, 1, 1};
    /* misaligned offset */
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, ne, 0, 4);
    data(&b, 32, 64);
    expect(&b, FL_ERR_FORMAT, "not a multiple of the alignment");
    /* overlapping tensors */
    hdr(&b, 3, 2, 0);
    int64_t ne16[1] = {16};
    tinfo(&b, "a", 1, ne16, 0, 0);  /* 64 bytes at 0 */
    tinfo(&b, "b", 1, ne, 0, 32);   /* 32 bytes at 32 */
    data(&b, 32, 128);
    expect(&b, FL_ERR_FORMAT, "overlap");
    /* tensor ending past EOF */
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, ne16, 0, 0);
    data(&b, 32, 63);
    expect(&b, FL_ERR_FORMAT, "ends past the end");
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, ne, 0, 1ull << 63);
    data(&b, 32, 32);
    expect(&b, FL_ERR_FORMAT, "ends past the end");
    /* unknown tensor types: a removed ggml number, one past the table, negative */
    uint32_t types[] = {4, 5, 99, 0x80000000u};
    for (int i = 0; i < 4; i++) {
        hdr(&b, 3, 1, 0);
        tinfo(&b, "t", 1, ne, types[i], 0);
        data(&b, 32, 32);
        expect(&b, FL_ERR_FORMAT, "unknown tensor type");
    }
    /* row not a multiple of the block size (q8_0 blocks of 32) */
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, ne, 8, 0);
    data(&b, 32, 64);
    expect(&b, FL_ERR_FORMAT, "block size");
    /* n_dims 0 and 5 */
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 0, ne, 0, 0);
    data(&b, 32, 32);
    expect(&b, FL_ERR_FORMAT, "dimensions");
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 5, ne, 0, 0);
    data(&b, 32, 32);
    expect(&b, FL_ERR_FORMAT, "dimensions");
    /* element count overflow: 2^40 x 2^40 */
    int64_t big[2] = {1ll << 40, 1ll << 40};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 2, big, 0, 0);
    data(&b, 32, 32);
    expect(&b, FL_ERR_RANGE, "overflows");
    /* bytes overflow: 2^61 f32 elements = 2^63 bytes fit int64 elements but not the file */
    int64_t big2[2] = {1ll << 31, 1ll << 30};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 2, big2, 0, 0);
    data(&b, 32, 32);
    expect(&b, FL_ERR_FORMAT, "ends past the end");
    /* negative dimension */
    int64_t neg[1] = {-8};
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, neg, 0, 0);
    data(&b, 32, 32);
    expect(&b, FL_ERR_FORMAT, "negative dimension");
    /* duplicate tensor names */
    hdr(&b, 3, 2, 0);
    tinfo(&b, "w", 1, ne, 0, 0);
    tinfo(&b, "w", 1, ne, 0, 32);
    data(&b, 32, 64);
    expect(&b, FL_ERR_FORMAT, "duplicate tensor name 'w'");
    /* empty tensors may share an offset */
    int64_t ne0[2] = {0, 4};
    hdr(&b, 3, 2, 0);
    tinfo(&b, "e", 2, ne0, 0, 0);
    tinfo(&b, "t", 1, ne, 0, 0);
    data(&b, 32, 32);
    expect(&b, FL_OK, "");
}

/* ---- truncation of a real file at every header offset and a sample of data offsets ---- */

static void test_truncation(void **state) {
    (void)state;
    NEED_SHARED();
    size_t n;
    char *file = fl_test_read_file(FL_SHARED_PATH("models/stories260K-q4_0.gguf"), &n);
    assert_non_null(file);
    fl_gguf *g;
    assert_int_equal(fl_gguf_open_mem(file, n, &g), FL_OK);
    size_t data_off = (size_t)fl_gguf_data_offset(g);
    fl_gguf_free(g);
    assert_true(data_off > 1000 && data_off < n);
    int n_cut = 0;
    for (size_t cut = 0; cut < n; cut = cut < data_off ? cut + 1 : cut + 997) {
        unsigned char *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
        assert_non_null(copy);
        memcpy(copy, file, cut);
        g = (fl_gguf *)1;
        fl_clear_error();
        fl_status st = fl_gguf_open_mem(copy, cut, &g);
        if (st == FL_OK) fail_msg("file cut at %zu of %zu bytes parsed", cut, n);
        assert_null(g);
        assert_true(st == FL_ERR_FORMAT);
        const char *m = fl_last_error();
        if (!strstr(m, "truncated") && !strstr(m, "exceeds the") && !strstr(m, "cannot fit") && !strstr(m, "ends past the end"))
            fail_msg("cut at %zu: unclear message '%s'", cut, m);
        if (cut >= data_off && !strstr(m, "ends past the end")) fail_msg("cut at %zu in the data: '%s'", cut, m);
        free(copy);
        n_cut++;
    }
    assert_true((size_t)n_cut > data_off);
    fl_test_free_file(file, n);
    fl_test_mem_zero();
}

/* ---- typed getters on stories260K ---- */

static void test_getters(void **state) {
    (void)state;
    NEED_SHARED();
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH("models/stories260K.gguf"), &g), FL_OK);
    assert_int_equal(fl_gguf_version(g), 3);
    assert_int_equal(fl_gguf_alignment(g), 32);
    assert_int_equal(fl_gguf_n_kv(g), 19);
    assert_int_equal(fl_gguf_n_tensors(g), 48);
    uint32_t u;
    int64_t i;
    float f;
    bool b;
    char s[64];
    assert_int_equal(fl_gguf_get_u32(g, "llama.block_count", &u), FL_OK);
    assert_int_equal(u, 5);
    assert_int_equal(fl_gguf_get_i64(g, "llama.embedding_length", &i), FL_OK);
    assert_int_equal(i, 64);
    assert_int_equal(fl_gguf_get_u32(g, "llama.feed_forward_length", &u), FL_OK);
    assert_int_equal(u, 172);
    assert_int_equal(fl_gguf_get_u32(g, "llama.attention.head_count", &u), FL_OK);
    assert_int_equal(u, 8);
    assert_int_equal(fl_gguf_get_u32(g, "llama.attention.head_count_kv", &u), FL_OK);
    assert_int_equal(u, 4);
    assert_int_equal(fl_gguf_get_u32(g, "llama.context_length", &u), FL_OK);
    assert_int_equal(u, 2048);
    assert_int_equal(fl_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), FL_OK);
    CHECK_NEAR(f, 1e-5, 1e-12);
    assert_int_equal(fl_gguf_get_f32(g, "llama.block_count", &f), FL_OK); /* integers read as numbers */
    CHECK_NEAR(f, 5, 0);
    assert_int_equal(fl_gguf_get_str(g, "general.architecture", s, sizeof s), FL_OK);
    assert_string_equal(s, "llama");
    assert_int_equal(fl_gguf_get_str(g, "general.architecture", s, 5), FL_ERR_RANGE); /* "llama" + NUL needs 6 */
    assert_int_equal(fl_gguf_get_u32(g, "tokenizer.ggml.seperator_token_id", &u), FL_OK);
    assert_int_equal(u, 4294967295u);
    /* errors name the key */
    assert_int_equal(fl_gguf_get_u32(g, "no.such.key", &u), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "no.such.key"));
    assert_int_equal(fl_gguf_get_bool(g, "llama.block_count", &b), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "expected bool"));
    assert_int_equal(fl_gguf_get_u32(g, "general.name", &u), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "expected an integer"));
    assert_int_equal(fl_gguf_get_str(g, "llama.block_count", s, sizeof s), FL_ERR_INVALID);
    /* arrays */
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    assert_non_null(toks);
    assert_int_equal(toks->v.arr.type, FL_GGUF_STRING);
    assert_int_equal(toks->v.arr.n, 512);
    assert_true(fl_gguf_str_eq(toks->v.arr.items[1].v.str, "<s>"));
    const fl_gguf_value *tt = fl_gguf_get_arr(g, "tokenizer.ggml.token_type");
    assert_non_null(tt);
    assert_int_equal(tt->v.arr.type, FL_GGUF_I32);
    assert_int_equal(fl_gguf_arr_i64(tt, 0), 2); /* <unk> is UNKNOWN (2) */
    assert_int_equal(fl_gguf_arr_i64(tt, 1), 3); /* <s> is CONTROL (3) */
    const fl_gguf_value *sc = fl_gguf_get_arr(g, "tokenizer.ggml.scores");
    assert_non_null(sc);
    assert_int_equal(sc->v.arr.type, FL_GGUF_F32);
    assert_null(fl_gguf_get_arr(g, "general.name"));
    /* tensors */
    const fl_gguf_tensor *t = fl_gguf_find_tensor(g, "blk.4.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 172);
    assert_int_equal(t->ne[1], 64);
    assert_int_equal(t->size, 172 * 64 * 4);
    assert_true((const char *)t->data >= (const char *)fl_gguf_base(g) + fl_gguf_data_offset(g));
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)fl_gguf_base(g)) % 32, 0);
    assert_null(fl_gguf_find_tensor(g, "blk.5.ffn_down.weight"));
    uint64_t total = 0;
    for (int64_t k = 0; k < fl_gguf_n_tensors(g); k++) total += fl_gguf_tensor_at(g, k)->size;
    assert_int_equal(total, fl_gguf_file_size(g) - fl_gguf_data_offset(g)); /* f32: no padding between */
    assert_null(fl_gguf_tensor_at(g, 48));
    assert_null(fl_gguf_kv_at(g, -1));
    char v[128];
    fl_gguf_value_str(&fl_gguf_find(g, "llama.block_count")->value, v, sizeof v);
    assert_string_equal(v, "5");
    fl_gguf_value_str(toks, v, sizeof v);
    assert_string_equal(v, "[string x 512]");
    fl_gguf_free(g);
    fl_test_mem_zero();
}

/* ---- writer: set/replace/remove, types, alignment, version ---- */

static void test_writer(void **state) {
    (void)state;
    char path[] = "/tmp/fl_test_gguf_w_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    float t0[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ne[2] = {4, 2};
    const char *strs[] = {"a", "", "ccc"};
    int32_t ints[3] = {-1, 0, 7};
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(fl_gguf_writer_set_str(w, "general.architecture", "llama"), FL_OK);
    assert_int_equal(fl_gguf_writer_set_u32(w, "x.u32", 7), FL_OK);
    assert_int_equal(fl_gguf_writer_set_i32(w, "x.i32", -3), FL_OK);
    assert_int_equal(fl_gguf_writer_set_u64(w, "x.u64", 1ull << 40), FL_OK);
    assert_int_equal(fl_gguf_writer_set_f32(w, "x.f32", 0.25f), FL_OK);
    assert_int_equal(fl_gguf_writer_set_bool(w, "x.bool", true), FL_OK);
    assert_int_equal(fl_gguf_writer_set_arr_str(w, "x.strs", strs, 3), FL_OK);
    assert_int_equal(fl_gguf_writer_set_arr(w, "x.ints", FL_GGUF_I32, ints, 3), FL_OK);
    assert_int_equal(fl_gguf_writer_set_arr(w, "x.bad", FL_GGUF_STRING, ints, 3), FL_ERR_INVALID);
    assert_int_equal(fl_gguf_writer_set_u32(w, "x.u32", 9), FL_OK); /* replace keeps the position */
    assert_int_equal(fl_gguf_writer_set_u32(w, "x.gone", 1), FL_OK);
    assert_int_equal(fl_gguf_writer_remove(w, "x.gone"), FL_OK);
    assert_int_equal(fl_gguf_writer_set_alignment(w, 48), FL_ERR_INVALID);
    assert_int_equal(fl_gguf_writer_set_alignment(w, 64), FL_OK);
    fl_gguf_writer_set_version(w, 2);
    assert_int_equal(fl_gguf_writer_add_tensor(w, "t0", 0, 2, ne, t0), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor(w, "t1", 0, 1, ne, t0 + 4), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor(w, "t1", 0, 1, ne, t0), FL_ERR_INVALID);
    assert_int_equal(fl_gguf_writer_add_tensor(w, "q", 8, 1, ne, t0), FL_ERR_INVALID); /* 4 % 32 */
    assert_int_equal(fl_gguf_writer_add_tensor(w, "z", 0, 5, ne, t0), FL_ERR_INVALID);
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    fl_gguf_writer_free(w);
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    assert_int_equal(fl_gguf_version(g), 2);
    assert_int_equal(fl_gguf_alignment(g), 64); /* set_alignment wrote general.alignment */
    assert_int_equal(fl_gguf_n_kv(g), 9);
    assert_int_equal(fl_gguf_get_u32(g, "general.alignment", &(uint32_t){0}), FL_OK);
    assert_true(fl_gguf_str_eq(fl_gguf_kv_at(g, 1)->key, "x.u32"));
    uint32_t u;
    int64_t i;
    float f;
    bool b;
    assert_int_equal(fl_gguf_get_u32(g, "x.u32", &u), FL_OK);
    assert_int_equal(u, 9);
    assert_int_equal(fl_gguf_get_i64(g, "x.i32", &i), FL_OK);
    assert_int_equal(i, -3);
    assert_int_equal(fl_gguf_get_u32(g, "x.i32", &u), FL_ERR_RANGE);
    assert_int_equal(fl_gguf_get_u32(g, "x.u64", &u), FL_ERR_RANGE);
    assert_int_equal(fl_gguf_get_i64(g, "x.u64", &i), FL_OK);
    assert_int_equal(i, 1ll << 40);
    assert_int_equal(fl_gguf_get_f32(g, "x.f32", &f), FL_OK);
    CHECK_NEAR(f, 0.25, 0);
    assert_int_equal(fl_gguf_get_bool(g, "x.bool", &b), FL_OK);
    assert_true(b);
    assert_null(fl_gguf_find(g, "x.gone"));
    const fl_gguf_value *a = fl_gguf_get_arr(g, "x.strs");
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 3);
    assert_true(fl_gguf_str_eq(a->v.arr.items[2].v.str, "ccc"));
    assert_true(fl_gguf_str_eq(a->v.arr.items[1].v.str, ""));
    a = fl_gguf_get_arr(g, "x.ints");
    assert_int_equal(fl_gguf_arr_i64(a, 0), -1);
    CHECK_NEAR(fl_gguf_arr_f64(a, 2), 7, 0);
    const fl_gguf_tensor *t = fl_gguf_find_tensor(g, "t1");
    assert_non_null(t);
    assert_int_equal(t->size, 16);
    assert_int_equal(t->offset, 64); /* t0 (32 bytes) padded to the writer's alignment */
    assert_memory_equal(t->data, t0 + 4, 16);
    fl_gguf_free(g);
    /* a bad path fails cleanly and leaves nothing behind */
    w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_write(w, "/nonexistent-dir/x.gguf", NULL, NULL), FL_ERR_IO);
    assert_non_null(strstr(fl_last_error(), "/nonexistent-dir/x.gguf"));
    fl_gguf_writer_free(w);
    unlink(path);
    fl_test_mem_zero();
}

/* fill callbacks: the bytes they make land where add_tensor's would; a failing fill fails the
 * write with its error and leaves the previous file in place */
static int g_fills;
static fl_status fill_ramp(void *ud, void *dst, size_t n) {
    const float base = *(const float *)ud;
    for (size_t k = 0; k < n / sizeof(float); k++) ((float *)dst)[k] = base + (float)k;
    g_fills++;
    return FL_OK;
}
static fl_status fill_fail(void *ud, void *dst, size_t n) {
    (void)ud, (void)dst, (void)n;
    return fl_set_error(FL_ERR_INVALID, "fill_fail: no bytes today");
}

/* pieces: each float is its index into the tensor plus the base, whatever the piece */
static uint64_t g_last_off;
static fl_status fill_at_ramp(void *ud, void *dst, uint64_t off, size_t n) {
    const float base = *(const float *)ud;
    assert_int_equal(off % sizeof(float), 0);
    assert_true(off == 0 || off > g_last_off);
    g_last_off = off;
    for (size_t k = 0; k < n / sizeof(float); k++) ((float *)dst)[k] = base + (float)(off / sizeof(float) + k);
    g_fills++;
    return FL_OK;
}
static fl_status fill_at_fail(void *ud, void *dst, uint64_t off, size_t n) {
    (void)ud, (void)dst, (void)n;
    if (off >= 8) return fl_set_error(FL_ERR_IO, "fill_at_fail: piece at %llu lost", (unsigned long long)off);
    return FL_OK;
}

static void test_writer_fill(void **state) {
    (void)state;
    char path[] = "/tmp/fl_test_gguf_f_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    float direct[6] = {9, 8, 7, 6, 5, 4}, b0 = 100.0f, b1 = -3.0f;
    const int64_t ne[2] = {3, 2};
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_add_tensor_fn(w, "a", 0, 2, ne, fill_ramp, &b0), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor(w, "b", 0, 2, ne, direct), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor_fn(w, "c", 0, 1, ne, fill_ramp, &b1), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor_fn(w, "a", 0, 1, ne, fill_ramp, &b1), FL_ERR_INVALID);
    g_fills = 0;
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    assert_int_equal(g_fills, 2);
    fl_gguf_writer_free(w);
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    const float want_a[6] = {100, 101, 102, 103, 104, 105}, want_c[3] = {-3, -2, -1};
    assert_memory_equal(fl_gguf_find_tensor(g, "a")->data, want_a, sizeof want_a);
    assert_memory_equal(fl_gguf_find_tensor(g, "b")->data, direct, sizeof direct);
    assert_memory_equal(fl_gguf_find_tensor(g, "c")->data, want_c, sizeof want_c);
    fl_gguf_free(g);
    w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_add_tensor(w, "b", 0, 2, ne, direct), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor_fn(w, "x", 0, 2, ne, fill_fail, NULL), FL_OK);
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "no bytes today"));
    fl_gguf_writer_free(w);
    assert_int_equal(fl_gguf_open(path, &g), FL_OK); /* the first file, untouched */
    assert_non_null(fl_gguf_find_tensor(g, "c"));
    fl_gguf_free(g);
    /* in pieces: 10 floats in pieces of 12 bytes (3, 3, 3, 1), 6 in one piece of 64 */
    const int64_t ne10[1] = {10};
    w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_add_tensor_chunks(w, "p", 0, 1, ne10, fill_at_ramp, &b0, 12), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor(w, "b", 0, 2, ne, direct), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor_chunks(w, "q", 0, 2, ne, fill_at_ramp, &b1, 64), FL_OK);
    assert_int_equal(fl_gguf_writer_add_tensor_chunks(w, "z", 0, 2, ne, fill_at_ramp, &b1, 0), FL_ERR_INVALID);
    g_fills = 0;
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    assert_int_equal(g_fills, 5);
    fl_gguf_writer_free(w);
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    const float want_p[10] = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109}, want_q[6] = {-3, -2, -1, 0, 1, 2};
    assert_memory_equal(fl_gguf_find_tensor(g, "p")->data, want_p, sizeof want_p);
    assert_memory_equal(fl_gguf_find_tensor(g, "b")->data, direct, sizeof direct);
    assert_memory_equal(fl_gguf_find_tensor(g, "q")->data, want_q, sizeof want_q);
    fl_gguf_free(g);
    /* a piece that fails fails the write and leaves that file */
    w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_add_tensor_chunks(w, "p", 0, 1, ne10, fill_at_fail, NULL, 8), FL_OK);
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_ERR_IO);
    assert_non_null(strstr(fl_last_error(), "piece at 8 lost"));
    fl_gguf_writer_free(w);
    assert_int_equal(fl_gguf_open(path, &g), FL_OK);
    assert_non_null(fl_gguf_find_tensor(g, "q"));
    fl_gguf_free(g);
    unlink(path);
    fl_test_mem_zero();
}

/* Every value type (nested and string arrays included) survives read + copy_all + write
 * byte for byte, with a non-default alignment and version 2. */
static void test_roundtrip_all_types(void **state) {
    (void)state;
    bb b;
    int64_t ne[2] = {8, 2};
    hdr(&b, 2, 2, 16);
    kv_u32(&b, "general.alignment", 64);
    const struct { const char *k; uint32_t t; uint64_t v; size_t n; } sc[] = {
        {"a.u8", FL_GGUF_U8, 0xAB, 1},   {"a.i8", FL_GGUF_I8, 0xFE, 1},      {"a.u16", FL_GGUF_U16, 0xBEEF, 2},
        {"a.i16", FL_GGUF_I16, 0x8001, 2}, {"a.u32", FL_GGUF_U32, 0xDEADBEEF, 4}, {"a.i32", FL_GGUF_I32, 0xFFFFFFF0, 4},
        {"a.f32", FL_GGUF_F32, 0x3FC00000, 4}, {"a.bool", FL_GGUF_BOOL, 1, 1}, {"a.u64", FL_GGUF_U64, 0x0123456789ABCDEFull, 8},
        {"a.i64", FL_GGUF_I64, 0xFFFFFFFFFFFFFFFEull, 8}, {"a.f64", FL_GGUF_F64, 0x400921FB54442D18ull, 8},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        str(&b, sc[i].k);
        u32(&b, sc[i].t);
        put(&b, &sc[i].v, sc[i].n);
    }
    str(&b, "a.str");
    u32(&b, FL_GGUF_STRING);
    str(&b, "h\xc3\xa9llo\n");
    str(&b, "a.arr_f32");
    u32(&b, FL_GGUF_ARRAY);
    u32(&b, FL_GGUF_F32);
    u64(&b, 3);
    float f3[3] = {1.5f, -0.0f, 1e30f};
    put(&b, f3, sizeof f3);
    str(&b, "a.arr_str");
    u32(&b, FL_GGUF_ARRAY);
    u32(&b, FL_GGUF_STRING);
    u64(&b, 3);
    str(&b, "x");
    str(&b, "");
    str(&b, "yz");
    str(&b, "a.arr_nested"); /* [[u16 x 2], [], [[string]]] as arrays of arrays */
    u32(&b, FL_GGUF_ARRAY);
    u32(&b, FL_GGUF_ARRAY);
    u64(&b, 2);
    u32(&b, FL_GGUF_U16);
    u64(&b, 2);
    put(&b, "\x01\x02\x03\x04", 4);
    u32(&b, FL_GGUF_ARRAY);
    u64(&b, 1);
    u32(&b, FL_GGUF_STRING);
    u64(&b, 1);
    str(&b, "deep");
    tinfo(&b, "w0", 2, ne, FL_GGUF_F32 - 6 /* f32 */, 0);
    tinfo(&b, "w1", 1, ne, 1 /* f16 */, 64);
    data(&b, 64, 128);
    for (size_t i = b.n - 128; i < b.n - 48; i++) b.p[i] = (unsigned char)(i * 7 + 1);
    /* w1 is 16 bytes: the file ends with its zero padding to 64, as writers pad every tensor */

    fl_gguf *g;
    if (fl_gguf_open_mem(b.p, b.n, &g) != FL_OK) fail_msg("%s", fl_last_error());
    assert_int_equal(fl_gguf_alignment(g), 64);
    const fl_gguf_value *nested = fl_gguf_get_arr(g, "a.arr_nested");
    assert_non_null(nested);
    assert_int_equal(nested->v.arr.items[0].v.arr.n, 2);
    assert_true(fl_gguf_str_eq(nested->v.arr.items[1].v.arr.items[0].v.arr.items[0].v.str, "deep"));
    char path[] = "/tmp/fl_test_gguf_t_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    fl_gguf_writer *w = fl_gguf_writer_new();
    assert_int_equal(fl_gguf_writer_copy_all(w, g), FL_OK);
    assert_int_equal(fl_gguf_writer_write(w, path, NULL, NULL), FL_OK);
    fl_gguf_writer_free(w);
    fl_gguf_free(g);
    size_t n;
    char *copy = fl_test_read_file(path, &n);
    assert_non_null(copy);
    assert_int_equal(n, b.n);
    assert_memory_equal(copy, b.p, n);
    fl_test_free_file(copy, n);
    unlink(path);
    fl_test_mem_zero();
}

/* ---- seeded mutations of a real file: byte flips, runs of 0xFF/0x00, truncations ---- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void test_mutations(void **state) {
    (void)state;
    NEED_SHARED();
    size_t n;
    char *orig = fl_test_read_file(FL_SHARED_PATH("models/stories260K-q4_0.gguf"), &n);
    assert_non_null(orig);
    fl_gguf *g;
    assert_int_equal(fl_gguf_open_mem(orig, n, &g), FL_OK);
    size_t hdr_len = (size_t)fl_gguf_data_offset(g);
    fl_gguf_free(g);
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    memcpy(buf, orig, n);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int n_ok = 0, n_err = 0;
    for (int it = 0; it < 4000; it++) {
        int n_mut = 1 + (int)(rng_next(&seed) % 4);
        size_t pos[4];
        for (int k = 0; k < n_mut; k++) {
            /* mostly in the header, sometimes the 24-byte fixed part */
            size_t p = rng_next(&seed) % 8 == 0 ? rng_next(&seed) % 24 : rng_next(&seed) % hdr_len;
            pos[k] = p;
            uint64_t r = rng_next(&seed);
            switch (r % 4) {
            case 0: buf[p] ^= (unsigned char)(1u << (r >> 8) % 8); break;
            case 1: buf[p] = (unsigned char)(r >> 16); break;
            case 2: buf[p] = 0xFF; break;
            default: buf[p] = 0; break;
            }
        }
        size_t len = rng_next(&seed) % 4 == 0 ? (size_t)(rng_next(&seed) % n) : n;
        fl_clear_error();
        fl_status st = fl_gguf_open_mem(buf, len, &g);
        if (st == FL_OK) {
            /* anything that parses must be self-consistent */
            for (int64_t t = 0; t < fl_gguf_n_tensors(g); t++) {
                const fl_gguf_tensor *ti = fl_gguf_tensor_at(g, t);
                assert_true((const unsigned char *)ti->data + ti->size <= buf + len);
            }
            char v[128];
            for (int64_t k = 0; k < fl_gguf_n_kv(g); k++) fl_gguf_value_str(&fl_gguf_kv_at(g, k)->value, v, sizeof v);
            fl_gguf_free(g);
            n_ok++;
        } else {
            assert_true(st < 0);
            assert_true(fl_last_error()[0] != 0);
            n_err++;
        }
        for (int k = 0; k < n_mut; k++) buf[pos[k]] = (unsigned char)orig[pos[k]];
    }
    assert_true(n_err > 1000); /* the mutations did hit the parser's checks */
    assert_true(n_ok > 0);     /* and some (e.g. in string bytes) are harmless */
    free(buf);
    fl_test_free_file(orig, n);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_shared),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_strings_arrays),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_writer_fill),
        cmocka_unit_test(test_roundtrip_all_types),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
