/* Tests for kernels/quant: dequantization of every GGUF block type against the synth256 files
 * (made by llama.cpp from synth256-F32.gguf), byte-identical legacy quantizers, K-quant
 * reconstruction error no worse than llama.cpp's, load-time NF4 / FP8 round trips. */
#include "test.h"

#include "core/dtype.h"
#include "core/status.h"
#include "formats/gguf.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <stdlib.h>
#include <string.h>

typedef struct { const char *file; int32_t type; double nmse_max; } type_case;

/* NMSE bounds: a few times the error of each format on Gaussian weights. */
static const type_case cases[] = {
    {"synth256-F16.gguf", FL_TYPE_F16, 1e-7},   {"synth256-BF16.gguf", FL_TYPE_BF16, 3e-5},
    {"synth256-Q8_0.gguf", FL_TYPE_Q8_0, 3e-5}, {"synth256-Q4_0.gguf", FL_TYPE_Q4_0, 1.5e-2},
    {"synth256-Q4_1.gguf", FL_TYPE_Q4_1, 1.2e-2}, {"synth256-Q5_0.gguf", FL_TYPE_Q5_0, 4e-3},
    {"synth256-Q5_1.gguf", FL_TYPE_Q5_1, 3e-3}, {"synth256-Q2_K.gguf", FL_TYPE_Q2_K, 0.15},
    {"synth256-Q3_K_M.gguf", FL_TYPE_Q3_K, 5e-2}, {"synth256-Q4_K_M.gguf", FL_TYPE_Q4_K, 1.2e-2},
    {"synth256-Q5_K_M.gguf", FL_TYPE_Q5_K, 3e-3}, {"synth256-Q6_K.gguf", FL_TYPE_Q6_K, 8e-4},
    {"synth256-IQ4_NL.gguf", FL_TYPE_IQ4_NL, 1.2e-2},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static fl_gguf *open_synth(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/synth256/%s", name);
    fl_gguf *g = NULL;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH(rel), &g), FL_OK);
    return g;
}

/* Dequantize a whole tensor into a tracked buffer of ne0*ne1 floats. */
static float *dequant_tensor(const fl_gguf_tensor *t) {
    const int64_t K = t->ne[0], N = t->ne[1];
    float *out = fl_alloc(FL_MEM_MISC, (size_t)(K * N) * 4, 64);
    assert_non_null(out);
    const size_t rs = fl_type_row_size(t->type, K);
    for (int64_t n = 0; n < N; n++) fl_dequant_row(t->type, (const char *)t->data + n * rs, out + n * K, K);
    return out;
}

static void test_dequant_all_types(void **state) {
    (void)state;
    NEED_SHARED();
    fl_gguf *f32 = open_synth("synth256-F32.gguf");
    for (size_t c = 0; c < N_CASES; c++) {
        fl_gguf *g = open_synth(cases[c].file);
        assert_int_equal(fl_matmul_supported(cases[c].type), FL_OK);
        int n_checked = 0;
        for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
            const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
            if (t->n_dims != 2) continue;
            assert_int_equal(t->type, cases[c].type);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
            const fl_gguf_tensor *r = fl_gguf_find_tensor(f32, name);
            assert_non_null(r);
            assert_int_equal(r->type, FL_TYPE_F32);
            const int64_t n = t->ne[0] * t->ne[1];
            float *got = dequant_tensor(t);
            double e = fl_test_nmse(r->data, got, n);
            if (!(e <= cases[c].nmse_max)) fail_msg("%s %s: NMSE %.3g > %.3g", cases[c].file, name, e, cases[c].nmse_max);
            fl_free(FL_MEM_MISC, got, (size_t)n * 4);
            n_checked++;
        }
        assert_true(n_checked >= 9);
        fl_gguf_free(g);
    }
    fl_gguf_free(f32);
    fl_test_mem_zero();
}

/* Exact decoding rules on hand-built blocks (independent of ggml's loop structure). */
static void test_dequant_exact(void **state) {
    (void)state;
    fl_block_q8_0 b8;
    b8.d = fl_f32_to_f16(0.5f);
    for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j * 7 - 100);
    float y[256];
    fl_dequant_q8_0(&b8, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == 0.5f * (float)(j * 7 - 100));

    fl_block_q4_0 b4;
    b4.d = fl_f32_to_f16(-0.25f);
    for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    fl_dequant_q4_0(&b4, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == -0.25f * (float)(j - 8));
        assert_true(y[j + 16] == -0.25f * (float)(7 - j));
    }

    fl_block_q5_0 b5;
    b5.d = fl_f32_to_f16(1.0f);
    memset(b5.qs, 0, 16);
    uint32_t qh = (1u << 3) | (1u << 20); /* element 3 and element 20 get the 5th bit */
    memcpy(b5.qh, &qh, 4);
    fl_dequant_q5_0(&b5, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == ((j == 3 || j == 20) ? 0.0f : -16.0f));

    fl_block_iq4_nl bi;
    bi.d = fl_f32_to_f16(2.0f);
    for (int j = 0; j < 16; j++) bi.qs[j] = (uint8_t)(j | (j << 4));
    fl_dequant_iq4_nl(&bi, y, 32);
    for (int j = 0; j < 16; j++) assert_true(y[j] == 2.0f * fl_iq4nl_values[j] && y[j + 16] == y[j]);

    /* q4_K: sub-block 5 with scale 37 and min 11 (uses the packed high bits), code 9 */
    fl_block_q4_K bk;
    memset(&bk, 0, sizeof bk);
    bk.d = fl_f32_to_f16(0.125f);
    bk.dmin = fl_f32_to_f16(0.5f);
    bk.scales[5 + 4] = (uint8_t)((37 & 0xF) | ((11 & 0xF) << 4));
    bk.scales[5 - 4] = (uint8_t)((37 >> 4) << 6);
    bk.scales[5] = (uint8_t)((11 >> 4) << 6);
    for (int l = 0; l < 32; l++) bk.qs[2 * 32 + l] = 9 << 4; /* pair 2 high nibble = sub-block 5 */
    fl_dequant_q4_K(&bk, y, 256);
    for (int e = 0; e < 256; e++) {
        float want = (e >= 160 && e < 192) ? 0.125f * 37 * 9 - 0.5f * 11 : 0.0f;
        if (e / 32 == 1 || e / 32 == 4) want = 0; /* other sub-blocks touched by the high bits: sc=0 */
        CHECK_NEAR(y[e], want, 1e-6);
    }

    /* q6_K: element 200 = second half, l = 8, third quarter (ql high nibble, qh bits 4-5) */
    fl_block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = fl_f32_to_f16(0.5f);
    for (int j = 0; j < 16; j++) b6.scales[j] = (int8_t)(j - 8);
    for (int j = 0; j < 128; j++) b6.ql[j] = 0x88; /* code 8 | 0 high bits -> q = -24 everywhere */
    b6.ql[64 + 8] = 0x5 << 4 | 0x8;
    b6.qh[32 + 8] = 2 << 4;       /* element 200: q = (5 | 2 << 4) - 32 = 5 */
    fl_dequant_q6_K(&b6, y, 256);
    CHECK_NEAR(y[200], 0.5f * (float)(12 - 8) * 5, 0);
    CHECK_NEAR(y[0], 0.5f * (float)(0 - 8) * -24, 0);
    CHECK_NEAR(y[255], 0.5f * (float)(15 - 8) * -24, 0);
    fl_test_mem_zero();
}

/* Legacy quantizers on synth256-F32 give the very bytes of llama.cpp's files. */
static void test_legacy_byte_identical(void **state) {
    (void)state;
    NEED_SHARED();
    static const struct { const char *file; int32_t type; } lc[] = {
        {"synth256-Q8_0.gguf", FL_TYPE_Q8_0}, {"synth256-Q4_0.gguf", FL_TYPE_Q4_0},
        {"synth256-Q4_1.gguf", FL_TYPE_Q4_1}, {"synth256-Q5_0.gguf", FL_TYPE_Q5_0},
        {"synth256-Q5_1.gguf", FL_TYPE_Q5_1},
    };
    fl_gguf *f32 = open_synth("synth256-F32.gguf");
    for (size_t c = 0; c < sizeof lc / sizeof lc[0]; c++) {
        fl_gguf *g = open_synth(lc[c].file);
        for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
            const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
            if (t->n_dims != 2) continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
            const fl_gguf_tensor *r = fl_gguf_find_tensor(f32, name);
            const size_t sz = fl_quantize_size(lc[c].type, t->ne[1], t->ne[0]);
            assert_int_equal(sz, t->size);
            void *buf = fl_alloc(FL_MEM_MISC, sz, 64);
            assert_int_equal(fl_quantize_tensor(lc[c].type, r->data, t->ne[1], t->ne[0], buf), FL_OK);
            if (memcmp(buf, t->data, sz)) {
                size_t at = 0;
                while (((const uint8_t *)buf)[at] == ((const uint8_t *)t->data)[at]) at++;
                fail_msg("%s %s: first differing byte at %zu", lc[c].file, name, at);
            }
            fl_free(FL_MEM_MISC, buf, sz);
        }
        fl_gguf_free(g);
    }
    fl_gguf_free(f32);
    fl_test_mem_zero();
}

static double sq_err(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s;
}

/* K-quants and IQ4_NL: our reconstruction error over all weights <= llama.cpp's files. */
static void test_kquant_error(void **state) {
    (void)state;
    NEED_SHARED();
    static const struct { const char *file; int32_t type; } kc[] = {
        {"synth256-Q6_K.gguf", FL_TYPE_Q6_K},   {"synth256-Q5_K_M.gguf", FL_TYPE_Q5_K},
        {"synth256-Q4_K_M.gguf", FL_TYPE_Q4_K}, {"synth256-Q3_K_M.gguf", FL_TYPE_Q3_K},
        {"synth256-Q2_K.gguf", FL_TYPE_Q2_K},   {"synth256-IQ4_NL.gguf", FL_TYPE_IQ4_NL},
    };
    fl_gguf *f32 = open_synth("synth256-F32.gguf");
    for (size_t c = 0; c < sizeof kc / sizeof kc[0]; c++) {
        fl_gguf *g = open_synth(kc[c].file);
        double e_ref = 0, e_ours = 0;
        for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
            const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
            if (t->n_dims != 2) continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
            const fl_gguf_tensor *r = fl_gguf_find_tensor(f32, name);
            const int64_t K = t->ne[0], N = t->ne[1];
            const size_t sz = fl_quantize_size(kc[c].type, N, K);
            void *buf = fl_alloc(FL_MEM_MISC, sz, 64);
            assert_int_equal(fl_quantize_tensor(kc[c].type, r->data, N, K, buf), FL_OK);
            float *theirs = dequant_tensor(t);
            fl_gguf_tensor mine = *t;
            mine.data = buf;
            float *ours = dequant_tensor(&mine);
            e_ref += sq_err(r->data, theirs, K * N);
            e_ours += sq_err(r->data, ours, K * N);
            fl_free(FL_MEM_MISC, theirs, (size_t)(K * N) * 4);
            fl_free(FL_MEM_MISC, ours, (size_t)(K * N) * 4);
            fl_free(FL_MEM_MISC, buf, sz);
        }
        fprintf(stderr, "%-22s squared error: llama.cpp %.6g, fitllm %.6g (ratio %.4f)\n", kc[c].file, e_ref, e_ours, e_ours / e_ref);
        if (!(e_ours <= e_ref)) fail_msg("%s: error %.6g > llama.cpp's %.6g", kc[c].file, e_ours, e_ref);
        fl_gguf_free(g);
    }
    fl_gguf_free(f32);
    fl_test_mem_zero();
}

/* Load-time types: NF4 (double-quantized scales) and FP8 e4m3 per-row scale. */
static void test_loadtime_types(void **state) {
    (void)state;
    const int64_t N = 3, K = 64 * 300; /* 300 blocks per row: two scale groups (256 + 44) */
    const size_t n = (size_t)(N * K);
    float *x = fl_alloc(FL_MEM_MISC, n * 4, 64), *y = fl_alloc(FL_MEM_MISC, n * 4, 64);
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        double u1 = 0, u2 = 0;
        s = s * 6364136223846793005ULL + 1442695040888963407ULL; u1 = ((s >> 11) + 1) * 0x1.0p-53;
        s = s * 6364136223846793005ULL + 1442695040888963407ULL; u2 = (s >> 11) * 0x1.0p-53;
        x[i] = (float)(0.05 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    assert_int_equal(fl_quantize_size(FL_TYPE_NF4, N, K), (size_t)N * (300 * 33 + 2 * 4));
    assert_int_equal(fl_quantize_size(FL_TYPE_FP8_E4M3, N, K), (size_t)N * (size_t)(K + 4));
    const int32_t types[2] = {FL_TYPE_NF4, FL_TYPE_FP8_E4M3};
    const double bounds[2] = {1.2e-2, 1.5e-3};
    for (int t = 0; t < 2; t++) {
        const size_t sz = fl_quantize_size(types[t], N, K), rs = fl_type_row_size(types[t], K);
        void *q = fl_alloc(FL_MEM_MISC, sz, 64);
        assert_int_equal(fl_quantize_tensor(types[t], x, N, K, q), FL_OK);
        for (int64_t r = 0; r < N; r++) fl_dequant_row(types[t], (char *)q + r * rs, y + r * K, K);
        double e = fl_test_nmse(x, y, (int64_t)n);
        fprintf(stderr, "%s: NMSE %.3g, %.3f bits/weight\n", fl_type_name(types[t]), e, 8.0 * sz / n);
        CHECK_NMSE(x, y, (int64_t)n, bounds[t]);
        fl_free(FL_MEM_MISC, q, sz);
    }
    /* NF4 exactness: a block holding exactly the code book times its absmax round-trips */
    float blk[64], out[64];
    uint8_t qb[33 + 4];
    for (int j = 0; j < 64; j++) blk[j] = 2.0f * fl_nf4_values[j % 16];
    assert_int_equal(fl_quantize_row(FL_TYPE_NF4, blk, qb, 64), FL_OK);
    fl_dequant_row(FL_TYPE_NF4, qb, out, 64);
    for (int j = 0; j < 64; j++) CHECK_NEAR(out[j], blk[j], 1e-6);
    assert_int_equal(fl_quantize_tensor(FL_TYPE_Q4_0, x, 1, 33, y), FL_ERR_INVALID);
    assert_int_equal(fl_quantize_tensor(FL_TYPE_IQ2_XS, x, 1, 256, y), FL_ERR_UNSUPPORTED);
    fl_free(FL_MEM_MISC, x, n * 4);
    fl_free(FL_MEM_MISC, y, n * 4);
    fl_test_mem_zero();
}

/* The NF4 quantizer's code search against the specification (nearest of all 16, the lower on a
 * tie): every float of magnitude below 4 at a stride of 61 bit patterns (about 35 million),
 * each value and midpoint +- 8 ulps, and the special values. */
static void check_nf4(float v) {
    const uint8_t a = fl_nf4_code(v), b = fl_nf4_code_ref(v);
    if (a != b) fail_msg("NF4 code of %.9g: %d, the specification %d", v, a, b);
}

static void test_nf4_code(void **state) {
    (void)state;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t u = 0; u < 0x40800000u; u += 61) { /* 0 .. 4.0 */
            float v;
            const uint32_t bits = u | sign << 31;
            memcpy(&v, &bits, sizeof v);
            check_nf4(v);
        }
    for (int c = 0; c < 16; c++) {
        const float pts[2] = {fl_nf4_values[c], c < 15 ? 0.5f * (fl_nf4_values[c] + fl_nf4_values[c + 1]) : 1.0f};
        for (int p = 0; p < 2; p++)
            for (int d = -8; d <= 8; d++) {
                float v = pts[p];
                uint32_t bits;
                memcpy(&bits, &v, sizeof v);
                bits += (uint32_t)d;
                memcpy(&v, &bits, sizeof v);
                check_nf4(v);
                check_nf4(-v);
            }
    }
    const float special[] = {0.0f, -0.0f, 2.0f, -2.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) check_nf4(special[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_exact),
        cmocka_unit_test(test_dequant_all_types),
        cmocka_unit_test(test_legacy_byte_identical),
        cmocka_unit_test(test_kquant_error),
        cmocka_unit_test(test_loadtime_types),
        cmocka_unit_test(test_nf4_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
