/* Tests for src/core: tracked allocator, budgets, failure injection, arenas, cpu, dtype. */
#include "test.h"

#include "core/alloc.h"
#include "core/arena.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/mmap.h"
#include "core/status.h"
#include "core/threads.h"
#include "core/utf8.h"
#include "kernels/convert.h"
#include "kernels/dispatch.h"

#include <pthread.h>
#include <stdint.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

static void test_alloc_counts(void **state) {
    (void)state;
    fl_mem_reset_peaks();
    void *a = fl_alloc(FL_MEM_KV, 1000, 64);
    void *b = fl_alloc(FL_MEM_ACT, 500, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(((uintptr_t)a & 63) == 0);
    assert_int_equal(fl_mem_current(FL_MEM_KV), 1000);
    assert_int_equal(fl_mem_current(FL_MEM_ACT), 500);
    assert_int_equal(fl_mem_current_total(), 1500);
    fl_free(FL_MEM_KV, a, 1000);
    assert_int_equal(fl_mem_current(FL_MEM_KV), 0);
    assert_int_equal(fl_mem_peak(FL_MEM_KV), 1000);
    assert_int_equal(fl_mem_peak_total(), 1500);
    fl_free(FL_MEM_ACT, b, 500);
    fl_test_mem_zero();
}

static void test_budget(void **state) {
    (void)state;
    fl_mem_set_budget(FL_MEM_KV, 4096);
    const size_t refused = fl_mem_refused(FL_MEM_KV), refused_misc = fl_mem_refused(FL_MEM_MISC);
    void *a = fl_alloc(FL_MEM_KV, 4000, 0);
    assert_non_null(a);
    assert_int_equal(fl_mem_refused(FL_MEM_KV), refused);
    void *b = fl_alloc(FL_MEM_KV, 200, 0);
    assert_null(b);
    assert_non_null(strstr(fl_last_error(), "budget"));
    assert_int_equal(fl_mem_refused(FL_MEM_KV), refused + 1);
    assert_int_equal(fl_mem_current(FL_MEM_KV), 4000); /* refused allocation left no trace */
    fl_free(FL_MEM_KV, a, 4000);
    fl_mem_set_budget(FL_MEM_KV, 0);
    fl_mem_set_budget_total(100);
    assert_null(fl_alloc(FL_MEM_MISC, 101, 0));
    assert_int_equal(fl_mem_current(FL_MEM_MISC), 0);
    assert_int_equal(fl_mem_refused(FL_MEM_MISC), refused_misc); /* (the total's refusal, not MISC's) */
    fl_mem_set_budget_total(0);
    /* the malloc-style pair with a context charges the context's category (NULL: MISC) */
    void *g = fl_mem_malloc_ctx(100, fl_mem_ctx(FL_MEM_GUIDE)), *m = fl_mem_malloc_ctx(50, NULL);
    assert_non_null(g);
    assert_non_null(m);
    assert_int_equal(fl_mem_current(FL_MEM_GUIDE), 116);
    assert_int_equal(fl_mem_current(FL_MEM_MISC), 66);
    fl_mem_free_ctx(g, fl_mem_ctx(FL_MEM_GUIDE));
    fl_mem_free_ctx(m, NULL);
    assert_int_equal(fl_mem_current(FL_MEM_GUIDE), 0);
    assert_string_equal(fl_mem_cat_name(FL_MEM_GUIDE), "guide");
    /* fl_mem_malloc charges this thread's category, and frees as charged whatever it is then */
    assert_int_equal(fl_mem_set_malloc_cat(FL_MEM_NET), FL_MEM_MISC);
    void *n1 = fl_mem_malloc(40);
    assert_int_equal(fl_mem_current(FL_MEM_NET), 56);
    assert_int_equal(fl_mem_set_malloc_cat(FL_MEM_MISC), FL_MEM_NET);
    void *m1 = fl_mem_malloc(10);
    assert_int_equal(fl_mem_current(FL_MEM_MISC), 26);
    fl_mem_free_any(n1); /* (MISC now: still NET's) */
    assert_int_equal(fl_mem_current(FL_MEM_NET), 0);
    assert_int_equal(fl_mem_current(FL_MEM_MISC), 26);
    fl_mem_free_any(m1);
    assert_int_equal(fl_mem_charge(FL_MEM_MAPPED, 10), FL_OK);
    fl_mem_uncharge(FL_MEM_MAPPED, 10);
    fl_test_mem_zero();
}

static void test_fail_injection(void **state) {
    (void)state;
    fl_mem_fail_after(2);
    void *a = fl_alloc(FL_MEM_MISC, 10, 0), *b = fl_alloc(FL_MEM_MISC, 10, 0);
    void *c = fl_alloc(FL_MEM_MISC, 10, 0), *d = fl_alloc(FL_MEM_MISC, 10, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c); /* the third allocation fails */
    assert_non_null(d);
    fl_mem_fail_after(-1);
    fl_free(FL_MEM_MISC, a, 10);
    fl_free(FL_MEM_MISC, b, 10);
    fl_free(FL_MEM_MISC, d, 10);
    assert_null(fl_alloc(FL_MEM_MISC, (size_t)1 << 60, 0)); /* impossible size: error, no crash */
    assert_null(fl_calloc(FL_MEM_MISC, SIZE_MAX / 2, 4));
    fl_test_mem_zero();
}

typedef struct { int iters; } thr_arg;
static void *thr_main(void *p) {
    thr_arg *a = p;
    for (int i = 0; i < a->iters; i++) {
        size_t n = (size_t)(i % 97) + 1;
        void *x = fl_alloc((fl_mem_cat)(i % FL_MEM_COUNT), n, 16);
        fl_free((fl_mem_cat)(i % FL_MEM_COUNT), x, n);
    }
    return NULL;
}

static void test_alloc_threads(void **state) {
    (void)state;
    pthread_t t[4];
    thr_arg a = {20000};
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, thr_main, &a);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    fl_test_mem_zero();
}

static void test_report_json(void **state) {
    (void)state;
    void *a = fl_alloc(FL_MEM_WEIGHTS, 12345, 0);
    char buf[1024];
    int n = fl_mem_report_json(buf, sizeof buf);
    assert_true(n > 0 && n < (int)sizeof buf);
    assert_non_null(strstr(buf, "\"weights\":12345"));
    assert_non_null(strstr(buf, "\"peak\":{"));
    fl_free(FL_MEM_WEIGHTS, a, 12345);
    fl_test_mem_zero();
}

static void test_arena(void **state) {
    (void)state;
    fl_arena ar;
    assert_int_equal(fl_arena_init(&ar, FL_MEM_SCRATCH, 1024), FL_OK);
    assert_int_equal(fl_mem_current(FL_MEM_SCRATCH), 1024);
    void *p = fl_arena_alloc(&ar, 100, 64);
    assert_non_null(p);
    size_t m = fl_arena_mark(&ar);
    void *q = fl_arena_alloc(&ar, 800, 64);
    assert_non_null(q);
    assert_null(fl_arena_alloc(&ar, 200, 64)); /* full: NULL, no growth */
    fl_arena_rewind(&ar, m);
    assert_ptr_equal(fl_arena_alloc(&ar, 800, 64), q);
    assert_int_equal(ar.high, 128 + 800);
    fl_arena_deinit(&ar);
    fl_test_mem_zero();
}

/* Exhaustive: every f16 / bf16 encoding decodes to a value that re-encodes to itself. */
static void test_f16_bf16_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fl_f16_to_f32((uint16_t)h);
        int exp = (h >> 10) & 31, man = h & 1023;
        if (exp == 31 && man) {
            assert_true(isnan(f));
            assert_true(fl_f32_to_f16(f) >= 0x7C01 && (fl_f32_to_f16(f) & 0x7FFF) >= 0x7E00);
            continue;
        }
        /* reference value from the definition */
        double ref = exp == 0 ? ldexp(man, -24) : exp == 31 ? INFINITY : ldexp(1024 + man, exp - 25);
        if (h & 0x8000) ref = -ref;
        assert_true((double)f == ref);
        assert_int_equal(fl_f32_to_f16(f), h);
        float g = fl_bf16_to_f32((uint16_t)h);
        if (isnan(g)) continue;
        assert_int_equal(fl_f32_to_bf16(g), h);
    }
}

/* RNE at every midpoint between adjacent f16 values, plus overflow. */
static void test_f16_rounding(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x7BFF; h++) { /* finite neighbours */
        double a = fl_f16_to_f32((uint16_t)h), b = fl_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2); /* exact in f32 */
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(fl_f32_to_f16(mid), want);
        assert_int_equal(fl_f32_to_f16(nextafterf(mid, 0)), h);
        assert_int_equal(fl_f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
    }
    assert_int_equal(fl_f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(fl_f32_to_f16(65520.0f), 0x7C00);
    assert_int_equal(fl_f32_to_f16(1e10f), 0x7C00);
    assert_int_equal(fl_f32_to_f16(-INFINITY), 0xFC00);
    /* bf16 midpoints */
    assert_int_equal(fl_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);              /* tie -> even */
    assert_int_equal(fl_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-9f), 0x3F81);
    assert_int_equal(fl_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);          /* tie -> even (up) */
}

/* Reference fp8 decode from the definition. */
static double fp8_ref(int v, int ebits, int mbits, int bias) {
    int e = (v >> mbits) & ((1 << ebits) - 1), m = v & ((1 << mbits) - 1);
    double r = e == 0 ? ldexp(m, 1 - bias - mbits) : ldexp((1 << mbits) + m, e - bias - mbits);
    return (v & 0x80) ? -r : r;
}

static void test_fp8_exhaustive(void **state) {
    (void)state;
    for (int v = 0; v < 256; v++) {
        /* e4m3fn: only S.1111.111 is NaN */
        float f = fl_fp8_e4m3_to_f32((uint8_t)v);
        if ((v & 0x7F) == 0x7F) {
            assert_true(isnan(f));
        } else {
            assert_true((double)f == fp8_ref(v, 4, 3, 7));
            assert_int_equal(fl_f32_to_fp8_e4m3(f), v);
        }
        /* e5m2: exponent 31 is inf/NaN */
        float g = fl_fp8_e5m2_to_f32((uint8_t)v);
        int e = (v >> 2) & 31;
        if (e == 31) {
            assert_true((v & 3) ? isnan(g) : isinf(g));
            if (!(v & 3)) assert_int_equal(fl_f32_to_fp8_e5m2(g), v);
        } else {
            assert_true((double)g == fp8_ref(v, 5, 2, 15));
            assert_int_equal(fl_f32_to_fp8_e5m2(g), v);
        }
    }
    assert_true(fl_fp8_e4m3_to_f32(0x7E) == 448.0f);
    assert_int_equal(fl_f32_to_fp8_e4m3(1000.0f), 0x7E);   /* saturate */
    assert_int_equal(fl_f32_to_fp8_e4m3(-INFINITY), 0xFE);
    assert_int_equal(fl_f32_to_fp8_e4m3(NAN) & 0x7F, 0x7F);
    assert_int_equal(fl_f32_to_fp8_e5m2(60000.0f), 0x7B);
    assert_int_equal(fl_f32_to_fp8_e5m2(INFINITY), 0x7C);
    /* ties to even: 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39) in e4m3 */
    assert_int_equal(fl_f32_to_fp8_e4m3(1.0625f), 0x38);
    assert_int_equal(fl_f32_to_fp8_e4m3(1.1875f), 0x3A);
    /* smallest subnormal e4m3 = 2^-9; half of it rounds to 0 (even), just above to 1 */
    assert_int_equal(fl_f32_to_fp8_e4m3(0x1p-10f), 0x00);
    assert_int_equal(fl_f32_to_fp8_e4m3(0x1.01p-10f), 0x01);
    /* midpoints between every pair of adjacent finite e4m3 values */
    for (int v = 0; v < 0x7E; v++) {
        double a = fl_fp8_e4m3_to_f32((uint8_t)v), b = fl_fp8_e4m3_to_f32((uint8_t)(v + 1));
        float mid = (float)((a + b) / 2);
        assert_int_equal(fl_f32_to_fp8_e4m3(mid), (v & 1) ? v + 1 : v);
    }
}

/* SIMD row conversions are bit-identical to the scalar reference over all encodings. */
static void test_convert_rows(void **state) {
    (void)state;
    enum { N = 65536 + 7 };
    uint16_t *h = malloc(N * 2), *h2 = malloc(N * 2), *h3 = malloc(N * 2);
    float *f = malloc(N * 4), *g = malloc(N * 4);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)(i * 1 + (i >> 16) * 13);
    fl_isa best = fl_isa_best();
    for (int isa = FL_ISA_REF; isa <= (int)best; isa++) {
        fl_isa_set((fl_isa)isa);
        const fl_convert_kernels *k = fl_convert_kernels_get();
        k->f16_to_f32(h, f, N);
        fl_f16_to_f32_row_ref(h, g, N);
        assert_memory_equal(f, g, N * 4);
        k->f32_to_f16(f, h2, N);
        fl_f32_to_f16_row_ref(f, h3, N);
        assert_memory_equal(h2, h3, N * 2);
        k->bf16_to_f32(h, f, N);
        fl_bf16_to_f32_row_ref(h, g, N);
        assert_memory_equal(f, g, N * 4);
        /* random f32 bit patterns through bf16 encode */
        srand(7);
        for (int i = 0; i < N; i++) {
            uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
            memcpy(&f[i], &u, 4);
        }
        k->f32_to_bf16(f, h2, N);
        fl_f32_to_bf16_row_ref(f, h3, N);
        assert_memory_equal(h2, h3, N * 2);
        k->f32_to_f16(f, h2, N);
        fl_f32_to_f16_row_ref(f, h3, N);
        for (int i = 0; i < N; i++) { /* NaN payloads may differ between F16C and ref; both NaN */
            if ((h2[i] & 0x7C00) == 0x7C00 && (h2[i] & 0x3FF) && (h3[i] & 0x7C00) == 0x7C00 && (h3[i] & 0x3FF)) continue;
            assert_int_equal(h2[i], h3[i]);
        }
    }
    fl_isa_set(best);
    free(h); free(h2); free(h3); free(f); free(g);
}

static void test_type_table(void **state) {
    (void)state;
    assert_int_equal(fl_type_get(FL_TYPE_Q4_K)->type_size, 144);
    assert_int_equal(fl_type_get(FL_TYPE_Q6_K)->type_size, 210);
    assert_null(fl_type_get(4)); /* removed Q4_2 */
    assert_null(fl_type_get(1000));
    assert_int_equal(fl_type_row_size(FL_TYPE_Q8_0, 64), 68);
    assert_int_equal(fl_type_row_size(FL_TYPE_Q8_0, 65), 0);
    assert_int_equal(fl_type_from_name("Q4_K"), FL_TYPE_Q4_K);
    assert_int_equal(fl_type_from_name("nope"), -1);
    CHECK_NEAR(fl_type_bits_per_weight(FL_TYPE_Q6_K), 6.5625, 1e-9);
    CHECK_NEAR(fl_type_bits_per_weight(FL_TYPE_Q4_0), 4.5, 1e-9);
}

static void test_cpu_and_errors(void **state) {
    (void)state;
    const fl_cpu_features *f = fl_cpu();
    assert_non_null(f);
    if (f->avx512f) assert_true(f->avx2 && f->fma);
    fl_mmap m;
    assert_int_equal(fl_mmap_open(&m, "/nonexistent/file.gguf"), FL_ERR_IO);
    assert_non_null(strstr(fl_last_error(), "/nonexistent/file.gguf"));
    assert_int_equal(fl_mmap_open_read(&m, "/nonexistent/file.gguf"), FL_ERR_IO);
    assert_int_equal(fl_mem_current(FL_MEM_MAPPED), 0);
}

/* fl_utf8_sanitize: valid text unchanged; each ill-formed byte (a lone continuation byte, a
 * truncated sequence, an overlong form, a surrogate, past U+10FFFF) becomes U+FFFD. */
static void test_utf8_sanitize(void **state) {
    (void)state;
    static const struct { const char *in, *out; } cases[] = {
        {"plain \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", "plain \xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"},
        {"a\x9A" "b", "a\xEF\xBF\xBD" "b"},
        {"x\xE2\x82", "x\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xC0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xED\xA0\x80!", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD!"},
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t n = strlen(cases[i].in);
        char out[64];
        const size_t m = fl_utf8_sanitize(cases[i].in, n, out);
        assert_int_equal(m, strlen(cases[i].out));
        assert_memory_equal(out, cases[i].out, m);
        assert_int_equal(fl_utf8_is_valid(cases[i].in, n), i == 0 || i == 6);
        assert_true(fl_utf8_is_valid(out, m));
    }
    /* fl_utf8_decode: each length's code point; ill-formed and incomplete starts give 0 */
    static const struct { const char *s; size_t len; uint32_t cp; } dec[] = {
        {"A", 1, 0x41}, {"\xC3\xA9", 2, 0xE9}, {"\xE2\x82\xAC", 3, 0x20AC}, {"\xF0\x9F\x98\x80", 4, 0x1F600},
        {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF}, {"\xC0\x80", 0, 0}, {"\xED\xA0\x80", 0, 0}, {"\xE2\x82", 0, 0}, {"\x9A", 0, 0},
    };
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) {
        uint32_t cp = 0xFFFFFFFF;
        assert_int_equal(fl_utf8_decode(dec[i].s, strlen(dec[i].s), &cp), dec[i].len);
        if (dec[i].len) assert_int_equal(cp, dec[i].cp);
    }
    uint32_t cp;
    assert_int_equal(fl_utf8_decode("\xC3\xA9", 1, &cp), 0); /* cut by n */
    assert_int_equal(fl_utf8_decode("", 0, &cp), 0);
}

/* fl_mmap_open_read (--no-mmap): the same bytes as the mapping, charged to MAPPED alike, in
 * 2 MiB-aligned anonymous memory; uncharged on close; a file past 2 MiB and one of 1 byte. */
static void test_mmap_read(void **state) {
    (void)state;
    char path[] = "/tmp/fitllm_test_mmap_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    const size_t sizes[2] = {((size_t)5 << 20) + 4097, 1};
    for (int i = 0; i < 2; i++) {
        const size_t n = sizes[i];
        unsigned char *buf = malloc(n);
        for (size_t j = 0; j < n; j++) buf[j] = (unsigned char)(j * 2654435761u >> 13);
        assert_int_equal(ftruncate(fd, 0), 0);
        assert_int_equal(pwrite(fd, buf, n, 0), (ssize_t)n);
        fl_mmap a, b;
        assert_int_equal(fl_mmap_open(&a, path), FL_OK);
        assert_int_equal(fl_mmap_open_read(&b, path), FL_OK);
        assert_int_equal(b.size, n);
        assert_int_equal((uintptr_t)b.data % ((uintptr_t)2 << 20), 0);
        assert_memory_equal(a.data, buf, n);
        assert_memory_equal(b.data, buf, n);
        assert_int_equal(fl_mem_current(FL_MEM_MAPPED), 2 * n);
        fl_mmap_close(&b);
        assert_int_equal(fl_mem_current(FL_MEM_MAPPED), n);
        fl_mmap_close(&a);
        assert_int_equal(fl_mem_current(FL_MEM_MAPPED), 0);
        free(buf);
    }
    close(fd);
    unlink(path);
    assert_string_equal(fl_status_str(FL_ERR_BUDGET), "memory budget exceeded");
}

static void sum_task(void *ctx, int ith, int nth) {
    int64_t lo, hi;
    fl_split_range(1000, ith, nth, &lo, &hi);
    long s = 0;
    for (int64_t i = lo; i < hi; i++) s += i;
    __atomic_fetch_add((long *)ctx, s, __ATOMIC_RELAXED);
}

static void nested_task(void *ctx, int ith, int nth) {
    (void)ith; (void)nth;
    long local = 0;
    fl_parallel_n(sum_task, &local, 2); /* nested: runs serially on this thread, still covers all */
    __atomic_fetch_add((long *)ctx, local, __ATOMIC_RELAXED);
}

typedef struct once_ctx {
    int nth, it, bad;
    int runs[32];
} once_ctx;

static void once_task(void *ctx, int ith, int nth) {
    once_ctx *o = ctx;
    if (nth != o->nth || ith < 0 || ith >= nth) {
        __atomic_store_n(&o->bad, nth, __ATOMIC_RELAXED);
        return;
    }
    volatile long spin = 0;
    for (int k = 0; k < ((ith * 7 + o->it) % 5) * 2000; k++) spin += k; /* (some iths longer than others) */
    __atomic_fetch_add(&o->runs[ith], 1, __ATOMIC_RELAXED);
}

static void test_threads(void **state) {
    (void)state;
    long s = 0;
    fl_parallel_n(sum_task, &s, 3);
    assert_int_equal(s, 999 * 1000 / 2);
    /* many short regions with changing team sizes: no lost wake-ups, every ith runs once */
    for (int it = 0; it < 20000; it++) {
        long t = 0;
        fl_parallel_n(sum_task, &t, 1 + it % 4);
        if (t != 999 * 1000 / 2) fail_msg("iteration %d: sum %ld", it, t);
    }
    long n = 0;
    fl_parallel_n(nested_task, &n, 3);
    assert_int_equal(n, 3L * 999 * 1000 / 2);
    /* more threads than cores, uneven work: whoever claims an ith (a worker, or the caller once
     * its own is done), each runs exactly once per call */
    for (int it = 0; it < 3000; it++) {
        once_ctx o = {.nth = 2 + it % 31, .it = it};
        memset(o.runs, 0, sizeof o.runs);
        fl_parallel_n(once_task, &o, o.nth);
        for (int i = 0; i < o.nth; i++)
            if (o.runs[i] != 1) fail_msg("iteration %d (nth %d): ith %d ran %d times", it, o.nth, i, o.runs[i]);
        if (o.bad) fail_msg("iteration %d: a task saw nth %d", it, o.bad);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_counts),  cmocka_unit_test(test_budget),
        cmocka_unit_test(test_fail_injection), cmocka_unit_test(test_alloc_threads),
        cmocka_unit_test(test_report_json),   cmocka_unit_test(test_arena),
        cmocka_unit_test(test_f16_bf16_exhaustive), cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_fp8_exhaustive), cmocka_unit_test(test_convert_rows),
        cmocka_unit_test(test_type_table),    cmocka_unit_test(test_cpu_and_errors), cmocka_unit_test(test_mmap_read), cmocka_unit_test(test_utf8_sanitize),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
