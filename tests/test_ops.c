/* Parity of the forward ops: every ISA variant against the scalar reference (kernels/ops.h),
 * on sizes with tails, with guard regions after the outputs; plus the reference ops' maths. */
#include "test.h"

#include "core/cpu.h"
#include "kernels/dispatch.h"
#include "kernels/ops.h"

#include <math.h>
#include <string.h>

#define GUARD 16
static const int64_t sizes[] = {1, 7, 15, 16, 17, 31, 64, 100, 172, 257, 1000};

static void fill(float *x, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 8.0f;
    }
}

static void check_guard(const float *y, int64_t n) {
    for (int64_t i = n; i < n + GUARD; i++) assert_true(y[i] == 1234.5f);
}

typedef struct variant {
    const char *name;
    fl_isa isa;
    void (*rmsnorm_row)(float *, const float *, const float *, int64_t, float);
    void (*swiglu)(float *, const float *, const float *, int64_t);
    float (*dot)(const float *, const float *, int64_t);
    void (*axpy)(float *, float, const float *, int64_t);
    void (*scale)(float *, float, int64_t);
} variant;

static const variant variants[] = {
    {"avx2", FL_ISA_AVX2, fl_rmsnorm_row_avx2, fl_swiglu_avx2, fl_dot_f32_avx2, fl_axpy_f32_avx2, fl_scale_f32_avx2},
    {"avx512", FL_ISA_AVX512, fl_rmsnorm_row_avx512, fl_swiglu_avx512, fl_dot_f32_avx512, fl_axpy_f32_avx512,
     fl_scale_f32_avx512},
};

static void test_parity(void **state) {
    (void)state;
    float a[1000 + GUARD], b[1000 + GUARD], w[1000], yr[1000 + GUARD], yv[1000 + GUARD];
    int ran = 0;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const variant *k = &variants[v];
        if (fl_isa_best() < k->isa) {
            fprintf(stderr, "skip %s: not supported by this CPU\n", k->name);
            continue;
        }
        ran++;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const int64_t n = sizes[si];
            fill(a, n, 1 + (unsigned)n);
            fill(b, n, 2 + (unsigned)n);
            fill(w, n, 3 + (unsigned)n);
            for (int i = 0; i < GUARD; i++) yr[n + i] = yv[n + i] = 1234.5f;
            fl_rmsnorm_row_ref(yr, a, w, n, 1e-5f);
            k->rmsnorm_row(yv, a, w, n, 1e-5f);
            CHECK_NMSE(yr, yv, n, 1e-10);
            check_guard(yv, n);
            /* same arithmetic in both (llama.cpp's): equal bit for bit */
            assert_memory_equal(yr, yv, (size_t)n * sizeof(float));
            fl_swiglu_ref(yr, a, b, n);
            k->swiglu(yv, a, b, n);
            assert_memory_equal(yr, yv, (size_t)n * sizeof(float));
            check_guard(yv, n);
            CHECK_NEAR(fl_dot_f32_ref(a, b, n), k->dot(a, b, n), 1e-4 * (double)n);
            memcpy(yr, b, (size_t)n * 4);
            memcpy(yv, b, (size_t)n * 4);
            fl_axpy_f32_ref(yr, 0.37f, a, n);
            k->axpy(yv, 0.37f, a, n);
            CHECK_NMSE(yr, yv, n, 1e-12);
            check_guard(yv, n);
            fl_scale_f32_ref(yr, -1.5f, n);
            k->scale(yv, -1.5f, n);
            CHECK_NMSE(yr, yv, n, 1e-12);
            check_guard(yv, n);
        }
    }
    fprintf(stderr, "%d variant(s) compared\n", ran);
    fl_test_mem_zero();
}

/* The reference ops' maths on hand-checked values. */
/* fl_argmax_f32: the AVX2 and AVX-512 versions give the reference loop's index (the first of the
 * largest; NaN never larger, x[0] NaN gives 0) on lengths with every tail, ties, signed zeros,
 * infinities and NaNs, and 32000 logits. */
static void test_argmax(void **state) {
    (void)state;
    int64_t (*fn[2])(const float *, int64_t) = {fl_isa_best() >= FL_ISA_AVX2 ? fl_argmax_f32_avx2 : NULL,
                                                fl_isa_best() >= FL_ISA_AVX512 ? fl_argmax_f32_avx512 : NULL};
    static float x[32000];
    fill(x, 32000, 5);
    assert_int_equal(fl_argmax_f32_ref(x, 1), 0);
    x[3] = 5.0f, x[7] = 5.0f; /* a tie above everything (fill gives [-4, 4)): the first */
    assert_int_equal(fl_argmax_f32_ref(x, 40), 3);
    for (int c = 0; c < 7; c++)
        for (int64_t n = 1; n <= 70; n++) {
            fill(x, n, 11 + c * 70 + (int)n);
            const int64_t j = (n * 7 + c) % n, k = (n * 3 + 1) % n;
            if (c == 1) x[j] = x[k] = 5.0f;                     /* ties */
            if (c == 2) { for (int64_t i = 0; i < n; i++) x[i] = -0.0f; x[k] = 0.0f; } /* signed zeros */
            if (c == 3) { for (int64_t i = 0; i < n; i++) x[i] = -INFINITY; }
            if (c == 4) x[j] = NAN;                              /* a NaN anywhere */
            if (c == 5) x[0] = NAN;                              /* first: index 0 */
            if (c == 6) x[j] = INFINITY;
            const int64_t want = fl_argmax_f32_ref(x, n);
            if (c == 1) assert_int_equal(x[want], 5.0f);
            if (c == 5) assert_int_equal(want, 0);
            for (int v = 0; v < 2; v++)
                if (fn[v] && fn[v](x, n) != want) fail_msg("argmax variant %d, case %d, n %lld: %lld, want %lld", v, c, (long long)n, (long long)fn[v](x, n), (long long)want);
        }
    fill(x, 32000, 99);
    x[31999] = 9.0f;
    for (int v = 0; v < 2; v++)
        if (fn[v]) assert_int_equal(fn[v](x, 32000), 31999);
    x[12345] = 9.0f;
    for (int v = 0; v < 2; v++)
        if (fn[v]) assert_int_equal(fn[v](x, 32000), 12345);
    assert_int_equal(fl_argmax_f32_ref(x, 32000), 12345);
}

/* fl_expf_poly: within 2 ulp of libm's expf from -87 to 88, 0 far below, inf far above. */
static void test_expf_poly(void **state) {
    (void)state;
    int worst = 0;
    for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
        const float e = expf(x), p = fl_expf_poly(x);
        int32_t ie, ip;
        memcpy(&ie, &e, 4);
        memcpy(&ip, &p, 4);
        const int ulp = ie > ip ? ie - ip : ip - ie;
        if (ulp > worst) worst = ulp;
    }
    fprintf(stderr, "fl_expf_poly: worst %d ulp against expf over [-87, 88]\n", worst);
    assert_true(worst <= 2);
    /* the row kernels give the same bits as the scalar function */
    float x[1000], yr[1000], yv[1000];
    fill(x, 1000, 77);
    for (int i = 0; i < 1000; i++) x[i] *= 25.0f; /* [-100, 100]: saturation included */
    fl_expf_poly_row_ref(yr, x, 1000);
    for (int i = 0; i < 1000; i++) assert_true(yr[i] == fl_expf_poly(x[i]));
    if (fl_isa_best() >= FL_ISA_AVX2) {
        fl_expf_poly_row_avx2(yv, x, 999);
        assert_memory_equal(yr, yv, 999 * sizeof(float));
    }
    if (fl_isa_best() >= FL_ISA_AVX512) {
        fl_expf_poly_row_avx512(yv, x, 999);
        assert_memory_equal(yr, yv, 999 * sizeof(float));
    }
    /* results below 2^-126 (ldexpf's rounding into the denormals) and at the saturation edges */
    for (int i = 0; i < 1000; i++) x[i] = -80.0f - 0.05f * (float)i;
    fl_expf_poly_row_ref(yr, x, 1000);
    if (fl_isa_best() >= FL_ISA_AVX2) {
        fl_expf_poly_row_avx2(yv, x, 1000);
        assert_memory_equal(yr, yv, 1000 * sizeof(float));
    }
    assert_true(fl_expf_poly(0.0f) == 1.0f);
    assert_true(fl_expf_poly(-200.0f) == 0.0f);
    assert_true(isinf(fl_expf_poly(200.0f)));
}

static void test_ref_maths(void **state) {
    (void)state;
    /* rmsnorm of (3, 4): rms = sqrt(12.5) */
    float x[2] = {3, 4}, w[2] = {1, 2}, y[2];
    fl_rmsnorm_forward(y, x, w, 1, 2, 0.0f);
    CHECK_NEAR(y[0], 3 / sqrt(12.5), 1e-6);
    CHECK_NEAR(y[1], 8 / sqrt(12.5), 1e-6);
    /* rope normal pairing: pos 1, head_dim 4, rope_dim 4, base 10000: pair 0 turns by 1 rad,
     * pair 1 by 10000^(-1/2) = 0.01 rad */
    float q[4] = {1, 0, 1, 0}, r[4];
    int32_t pos = 1;
    fl_rope_forward(r, q, &pos, 1, 1, 4, 4, 10000.0f, 1.0f);
    CHECK_NEAR(r[0], cos(1.0), 1e-6);
    CHECK_NEAR(r[1], sin(1.0), 1e-6);
    CHECK_NEAR(r[2], cos(0.01), 1e-6);
    CHECK_NEAR(r[3], sin(0.01), 1e-6);
    /* rope_dim 2 leaves dims 2..3 alone */
    fl_rope_forward(r, q, &pos, 1, 1, 4, 2, 10000.0f, 1.0f);
    assert_true(r[2] == 1.0f && r[3] == 0.0f);
    /* softmax, silu, swiglu, add */
    float s_in[3] = {0, 1, 2}, s[3];
    fl_softmax_forward(s, s_in, 1, 3);
    const double z = 1 + exp(1.0) + exp(2.0);
    CHECK_NEAR(s[2], exp(2.0) / z, 1e-6);
    fl_silu_forward(s, s_in, 3);
    CHECK_NEAR(s[1], 1 / (1 + exp(-1.0)), 1e-6);
    float g[1] = {2}, u[1] = {3}, o[1];
    fl_swiglu_forward(o, g, u, 1);
    CHECK_NEAR(o[0], 2 / (1 + exp(-2.0)) * 3, 1e-5);
    fl_add_forward(s, s_in, s_in, 3);
    assert_true(s[2] == 4.0f);
    fl_test_mem_zero();
}

/* mm_smallk (LoRA's B: K = the rank): AVX-512 against the reference, odd shapes and tails; the
 * output's padding between rows and past N untouched; K past the kernel's 64 falls back. */
static void test_mm_smallk(void **state) {
    (void)state;
    if (fl_isa_best() < FL_ISA_AVX512) {
        fprintf(stderr, "skip mm_smallk avx512: not supported by this CPU\n");
        skip();
    }
    enum { MM = 9, NN = 70, KK = 80, LD = NN + 5 };
    static float x[MM * KK], W[NN * KK], yr[MM * LD], yv[MM * LD];
    fill(x, MM * KK, 11);
    fill(W, NN * KK, 12);
    const int64_t Ks[] = {1, 2, 4, 5, 8, 16, 17, 32, 64, 80}, Ns[] = {1, 15, 16, 17, 33, 70}, Ms[] = {1, 2, 9};
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t K = Ks[ki], N = Ns[ni], M = Ms[mi];
                for (int i = 0; i < MM * LD; i++) yr[i] = yv[i] = 777.0f;
                fl_mm_smallk_f32_ref(yr, LD, x, M, W, N, K);
                fl_mm_smallk_f32_avx512(yv, LD, x, M, W, N, K);
                for (int64_t m = 0; m < MM; m++)
                    for (int64_t c = 0; c < LD; c++) {
                        const float r = yr[m * LD + c], v = yv[m * LD + c];
                        if (m >= M || c >= N) {
                            assert_true(r == 777.0f && v == 777.0f);
                            continue;
                        }
                        double want = 0; /* and both against double sums */
                        for (int64_t j = 0; j < K; j++) want += (double)x[m * K + j] * W[c * K + j];
                        if (fabs(v - r) > 1e-5 * (1 + fabs(want)) || fabs(r - want) > 1e-5 * (1 + fabs(want)))
                            fail_msg("K %lld N %lld M %lld: [%lld][%lld] ref %g avx512 %g double %g", (long long)K, (long long)N,
                                     (long long)M, (long long)m, (long long)c, r, v, want);
                    }
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parity), cmocka_unit_test(test_expf_poly), cmocka_unit_test(test_argmax),
                                       cmocka_unit_test(test_ref_maths), cmocka_unit_test(test_mm_smallk)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
