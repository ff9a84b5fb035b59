/* Tests for kernels/matmul: every weight type through fl_matmul against fl_matmul_ref (f32
 * activations: tight NMSE; 8-bit activations: NMSE bound), the integer tiles of every ISA the
 * CPU has against the scalar reference on odd shapes and tails, GEMV vs GEMM consistency. */
#include "test.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/threads.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 88172645463325252ULL;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * 0x1.0p-53 * 2 - 1);
}

typedef struct { fl_tensor W; void *data; size_t bytes; } qmat;

/* the AMX-INT8 tiles on the R8 groups (fl_amx_r8_gemm16) run here */
static bool r8_amx_ok(void) { return fl_amx_usable() && fl_cpu()->avx512vbmi; }

/* rows [0, N) of a Q4_0 / Q8_0 matrix at data (N % 8 == 0) into the R8 groups of rtype, in place */
static void repack_r8(int32_t rtype, char *data, size_t ldw, int64_t N, int64_t K) {
    char *tmp = fl_alloc(FL_MEM_MISC, (size_t)FL_R8_ROWS * ldw, 64);
    for (int64_t r = 0; r < N; r += FL_R8_ROWS) fl_r8_repack(rtype, data + r * ldw, ldw, K, tmp);
    fl_free(FL_MEM_MISC, tmp, (size_t)FL_R8_ROWS * ldw);
}

static void qmat_make(qmat *q, int32_t type, int64_t N, int64_t K) {
    float *f = fl_alloc(FL_MEM_MISC, (size_t)(N * K) * 4, 64);
    assert_non_null(f);
    for (int64_t i = 0; i < N * K; i++) f[i] = frand() * 0.1f;
    q->bytes = fl_quantize_size(type, N, K);
    assert_true(q->bytes > 0);
    q->data = fl_alloc(FL_MEM_MISC, q->bytes, 64);
    assert_int_equal(fl_quantize_tensor(type, f, N, K, q->data), FL_OK);
    fl_free(FL_MEM_MISC, f, (size_t)(N * K) * 4);
    const int64_t ne[2] = {K, N};
    assert_true(fl_tensor_init(&q->W, type, 2, ne, q->data) != 0);
}

static void qmat_free(qmat *q) { fl_free(FL_MEM_MISC, q->data, q->bytes); }

static float *frand_buf(int64_t n) {
    float *x = fl_alloc(FL_MEM_MISC, (size_t)n * 4, 64);
    for (int64_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

/* n floats of a fixed pattern (no draw from frand: the data the tests draw after stays the same) */
static float *fpattern_buf(int64_t n) {
    float *x = fl_alloc(FL_MEM_MISC, (size_t)n * 4, 64);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 13) - 6.5f;
    return x;
}

static const int32_t all_types[] = {
    FL_TYPE_F32, FL_TYPE_F16, FL_TYPE_BF16, FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_1, FL_TYPE_Q5_0,
    FL_TYPE_Q5_1, FL_TYPE_Q2_K, FL_TYPE_Q3_K, FL_TYPE_Q4_K, FL_TYPE_Q5_K, FL_TYPE_Q6_K, FL_TYPE_IQ4_NL,
    FL_TYPE_NF4, FL_TYPE_FP8_E4M3,
};

static void check_type(int32_t type, int64_t N, int64_t K, int64_t M) {
    qmat q;
    qmat_make(&q, type, N, K);
    float *x = frand_buf(M * K), *ref = frand_buf(M * N), *got = frand_buf(M * N);
    fl_matmul_ref(&q.W, x, ref, M);
    fl_matmul_set_f32_act(true);
    fl_matmul(&q.W, x, got, M);
    double e = fl_test_nmse(ref, got, M * N);
    if (!(e <= 1e-10)) fail_msg("%s N=%lld K=%lld M=%lld f32 act: NMSE %.3g", fl_type_name(type), (long long)N, (long long)K, (long long)M, e);
    fl_matmul_set_f32_act(false);
    fl_matmul(&q.W, x, got, M);
    e = fl_test_nmse(ref, got, M * N);
    /* 8-bit activations (Q8_0/Q4_0) add ~1e-5 relative error; other types stay f32 */
    if (!(e <= 1e-4)) fail_msg("%s N=%lld K=%lld M=%lld int8 act: NMSE %.3g", fl_type_name(type), (long long)N, (long long)K, (long long)M, e);
    fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
    fl_free(FL_MEM_MISC, ref, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, got, (size_t)(M * N) * 4);
    qmat_free(&q);
}

static void test_all_types_vs_ref(void **state) {
    (void)state;
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++) {
        fl_isa_set((fl_isa)isa);
        for (size_t i = 0; i < sizeof all_types / sizeof all_types[0]; i++) {
            const int32_t t = all_types[i];
            const int64_t blk = fl_type_get(t)->blck_size;
            const int64_t K = blk >= 64 ? 768 : 416; /* 416 = 13 blocks of 32: odd block count */
            check_type(t, 37, K, 1);
            check_type(t, 37, K, 7);
        }
    }
    fl_isa_set(fl_isa_best());
    fl_test_mem_zero();
}

/* Integer tiles of each ISA against the scalar reference: exact int sums, float order only. */
static void test_gemm_q8_parity(void **state) {
    (void)state;
    const int32_t types[2] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0};
    const int64_t Ks[4] = {32, 96, 320, 2048}; /* 1 block, odd count (tail), 8 blocks + a tail (the GEMV scales), long */
    for (int ti = 0; ti < 2; ti++)
        for (int ki = 0; ki < 4; ki++) {
            const int64_t K = Ks[ki], N = 6, M = 5;
            qmat q;
            qmat_make(&q, types[ti], N, K);
            float *x = frand_buf(M * K);
            fl_act_q8 a;
            assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
            for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
            float ref[4 * 4], got[4 * 4];
            const int shapes[][2] = {{4, 4}, {4, 1}, {3, 2}, {1, 1}, {2, 3}};
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const int nr = shapes[s][0], nt = shapes[s][1];
                fl_gemm_q8_ref(types[ti], (const char *)q.data + q.W.nb[1], q.W.nb[1], nr, &a, 1, nt, ref, 4);
                fl_gemm_q8_fn fns[2] = {fl_cpu()->avx2 && fl_cpu()->fma ? fl_gemm_q8_avx2 : NULL,
                                        fl_isa_best() == FL_ISA_AVX512 ? fl_gemm_q8_avx512 : NULL};
                for (int f = 0; f < 2; f++) {
                    if (!fns[f]) continue;
                    memset(got, 0, sizeof got);
                    fns[f](types[ti], (const char *)q.data + q.W.nb[1], q.W.nb[1], nr, &a, 1, nt, got, 4);
                    for (int t = 0; t < nt; t++)
                        for (int r = 0; r < nr; r++)
                            if (!(fabsf(got[t * 4 + r] - ref[t * 4 + r]) <= 1e-4 * (1 + fabsf(ref[t * 4 + r]))))
                                fail_msg("%s K=%lld isa fn %d tile %dx%d (r %d t %d): %.6g vs ref %.6g", fl_type_name(types[ti]),
                                         (long long)K, f, nr, nt, r, t, got[t * 4 + r], ref[t * 4 + r]);
                    for (int t = 0; t < nt; t++)
                        for (int r = 0; r < nr; r++) CHECK_NEAR(got[t * 4 + r], ref[t * 4 + r], 1e-4 * (1 + fabsf(ref[t * 4 + r])));
                    /* the AVX2 tiles sum each lane and block in llama.cpp's AVX2 order: its bits */
                    if (f == 0)
                        for (int t = 0; t < nt; t++)
                            for (int r = 0; r < nr; r++) {
                                const float want = fl_dot_q8_llama(types[ti], (const char *)q.data + (size_t)(1 + r) * q.W.nb[1], &a, 1 + t);
                                if (memcmp(&got[t * 4 + r], &want, sizeof want) != 0)
                                    fail_msg("%s K=%lld avx2 tile %dx%d (r %d t %d): %.9g, llama order %.9g", fl_type_name(types[ti]),
                                             (long long)K, nr, nt, r, t, got[t * 4 + r], want);
                            }
                }
            }
            /* the 8-bit activations: scale * code within half a step of x (plus the f16 rounding
             * of the scale: 127 * 2^-11 of a step) */
            for (int64_t i = 0; i < M * K; i++) CHECK_NEAR(a.d[i / 32] * a.qs[i], x[i], 0.57 * a.d[i / 32] + 1e-7);
            fl_act_q8_free(&a);
            fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
            qmat_free(&q);
        }
    fl_test_mem_zero();
}

/* GEMM (M > 1) rows equal GEMV (M = 1) of each token, with 1 and 2 threads. */
/* A 9-token step agrees with one-token calls; steps of up to fl_matmul_gemv_max_tokens give
 * every token the one-token bits (on AVX2 the few-token GEMV, Q4_0 up to 3 tokens, Q8_0 up to 4,
 * and the row dots, Q4_K and Q5_K up to 3, Q6_K up to 2, Q3_K and Q2_K up to 4, Q4_1 one; 69 rows
 * leave tails of the 4- and 2-row passes, K = 320 a block tail of 8 + 2; the K-quants take K = 512). */
static void test_gemm_vs_gemv(void **state) {
    (void)state;
    const int64_t N = 69, M = 9, MM = 16;
    const int32_t types[8] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q5_K, FL_TYPE_Q6_K, FL_TYPE_Q3_K, FL_TYPE_Q2_K, FL_TYPE_Q4_1};
    const int64_t want[8] = {4, 3, 3, 3, 2, 4, 4, 1};
    for (int ti = 0; ti < 8; ti++) {
        const int64_t K = ti < 2 || ti == 7 ? 320 : 512;
        qmat q;
        qmat_make(&q, types[ti], N, K);
        float *x = frand_buf(MM * K), *a = frand_buf(MM * N), *b = frand_buf(N);
        fl_isa_set(FL_ISA_REF);
        assert_int_equal(fl_matmul_gemv_max_tokens(types[ti]), 1);
        fl_isa_set(fl_isa_best());
        if (fl_isa_get() == FL_ISA_AVX2) assert_int_equal(fl_matmul_gemv_max_tokens(types[ti]), want[ti]);
        for (int nth = 1; nth <= 2; nth++) {
            fl_threads_set(nth);
            { /* int8 both ways (past the few-token steps the panels: AVX-512's own for Q8_0 / Q4_0 / Q4_K,
               * the AVX2 ones for the rest, on AVX2 and AVX-512 CPUs alike) */
                fl_matmul(&q.W, x, a, M);
                for (int64_t m = 0; m < M; m++) {
                    fl_matmul(&q.W, x + m * K, b, 1);
                    for (int64_t n = 0; n < N; n++) CHECK_NEAR(a[m * N + n], b[n], 1e-5 * (1 + fabsf(b[n])));
                }
            }
            for (int64_t mm = 2; mm <= fl_matmul_gemv_max_tokens(types[ti]); mm++) {
                fl_matmul(&q.W, x, a, mm);
                for (int64_t m = 0; m < mm; m++) {
                    fl_matmul(&q.W, x + m * K, b, 1);
                    if (memcmp(a + m * N, b, (size_t)N * sizeof(float)) != 0)
                        fail_msg("%s M=%lld nth=%d: token %lld differs from a one-token call", fl_type_name(types[ti]),
                                 (long long)mm, nth, (long long)m);
                }
            }
        }
        fl_threads_set(0);
        fl_free(FL_MEM_MISC, x, (size_t)(MM * K) * 4);
        fl_free(FL_MEM_MISC, a, (size_t)(MM * N) * 4);
        fl_free(FL_MEM_MISC, b, (size_t)N * 4);
        qmat_free(&q);
    }
    assert_int_equal(fl_matmul_supported(FL_TYPE_IQ2_XXS), FL_ERR_UNSUPPORTED);
    fl_test_mem_zero();
}

typedef void (*panel_pack_fn)(int32_t, const void *, size_t, int, int64_t, void *);
typedef void (*panel_gemm_fn)(int32_t, const void *, int, const fl_act_q8 *, int64_t, int, float *, int64_t);

/* Row panels (Q8_0, Q4_0, Q4_K and Q5_K with their mins, Q6_K, Q3_K, Q2_K with half-block scales, Q4_1,
 * Q5_0, Q5_1 with mins words, IQ4_NL with its table values): the
 * AVX2 and AVX-512 packers are byte-identical to the reference packer, the reference panel
 * product equals the integer tile reference (f32 order only), and the AVX2 / AVX-512 panel
 * products match it on partial panels (nr < 16, nr < 8), every token tail of the 4- and 8-token
 * tiles, odd block counts.  (Only Q8_0, Q4_0 and Q4_K panels exist on AVX-512.) */
static void test_panel_parity(void **state) {
    (void)state;
    const int32_t types[11] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q5_K, FL_TYPE_Q6_K, FL_TYPE_Q4_1,
                               FL_TYPE_Q5_0, FL_TYPE_Q5_1, FL_TYPE_IQ4_NL, FL_TYPE_Q3_K, FL_TYPE_Q2_K};
    const int64_t Ks[3] = {32, 416, 2048}, Ks_k[3] = {256, 768, 2048};
    const panel_gemm_fn gemms[2] = {fl_panel_gemm_avx2, fl_panel_gemm_avx512};
    for (int ti = 0; ti < 11; ti++)
        for (int ki = 0; ki < 3; ki++) {
            const bool kq = types[ti] == FL_TYPE_Q4_K || types[ti] == FL_TYPE_Q5_K || types[ti] == FL_TYPE_Q6_K || types[ti] == FL_TYPE_Q3_K ||
                            types[ti] == FL_TYPE_Q2_K;
            const bool avx2_only = ti >= 3; /* Q5_K, Q6_K and the other 32-blocks have AVX2 panels only */
            const panel_pack_fn packs[2] = {fl_isa_best() >= FL_ISA_AVX2 ? fl_panel_pack_avx2 : NULL,
                                            fl_isa_best() == FL_ISA_AVX512 && !avx2_only ? fl_panel_pack_avx512 : NULL};
            const int64_t K = kq ? Ks_k[ki] : Ks[ki], N = 21, M = 19;
            qmat q;
            qmat_make(&q, types[ti], N, K);
            float *x = frand_buf(M * K);
            fl_act_q8 a;
            assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
            for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
            const size_t pb = fl_panel_bytes_for(types[ti], K);
            assert_int_equal(pb, (size_t)(K / 32) * (16 * 4 + 16 * 32 + (types[ti] == FL_TYPE_Q6_K || types[ti] == FL_TYPE_Q3_K ? 16 * 8
                                                                        : types[ti] == FL_TYPE_Q2_K ? 16 * 20
                                                                        : fl_panel_has_mins(types[ti]) ? 16 * 4 : 0)));
            char *p0 = fl_alloc(FL_MEM_MISC, pb, 64), *p1 = fl_alloc(FL_MEM_MISC, pb, 64);
            float *ref = frand_buf(M * 16), *pr = frand_buf(M * 16), *got = frand_buf(M * 16);
            const int nrs[4] = {16, 11, 5, 1};
            for (int ni = 0; ni < 4; ni++) {
                const int nr = nrs[ni];
                const char *w = (const char *)q.data + 3 * q.W.nb[1]; /* rows 3 .. 3 + nr */
                memset(p0, 0x5A, pb);
                fl_panel_pack_ref(types[ti], w, q.W.nb[1], nr, K, p0);
                fl_gemm_q8_ref(types[ti], w, q.W.nb[1], nr, &a, 0, (int)M, ref, 16);
                fl_panel_gemm_ref(types[ti], p0, nr, &a, 0, (int)M, pr, 16);
                for (int64_t t = 0; t < M; t++)
                    for (int r = 0; r < nr; r++) CHECK_NEAR(pr[t * 16 + r], ref[t * 16 + r], 1e-4 * (1 + fabsf(ref[t * 16 + r])));
                for (int v = 0; v < 2; v++) {
                if (!packs[v]) continue;
                memset(p1, 0xA5, pb);
                packs[v](types[ti], w, q.W.nb[1], nr, K, p1);
                assert_memory_equal(p0, p1, pb);
                for (int nt = 1; nt <= (int)M; nt += 3) { /* 1, 4, 7, ..., 19: tails of the 4- and 8-token tiles */
                    for (int64_t i = 0; i < M * 16; i++) got[i] = -12345.0f;
                    gemms[v](types[ti], p1, nr, &a, M - nt, nt, got, 16);
                    for (int t = 0; t < nt; t++) {
                        for (int r = 0; r < nr; r++) {
                            const float e = pr[(M - nt + t) * 16 + r];
                            CHECK_NEAR(got[t * 16 + r], e, 1e-4 * (1 + fabsf(e)));
                        }
                        for (int r = nr; r < 16; r++) assert_true(got[t * 16 + r] == -12345.0f); /* rows past nr untouched */
                    }
                }
                if (v == 1) { /* 9-16 tokens per pass from the 16-token records: the 8-token tiles' bits */
                    const size_t rb = fl_act16_bytes(16, K);
                    char *rec = fl_alloc(FL_MEM_MISC, rb, 64);
                    for (int64_t m = 0; m < 16; m++) fl_act16_pack_row(&a, m, rec);
                    for (int nt = 9; nt <= 16; nt++) {
                        for (int64_t i = 0; i < M * 16; i++) got[i] = -12345.0f;
                        gemms[1](types[ti], p1, nr, &a, 0, nt, ref, 16);
                        fl_panel_gemm16_avx512(types[ti], p1, nr, rec, K / 32, nt, got, 16);
                        for (int t = 0; t < nt; t++) {
                            if (memcmp(got + t * 16, ref + t * 16, sizeof(float) * (size_t)nr))
                                fail_msg("%s K=%lld nr=%d nt=%d token %d: the 16-token panel tile is not the 8-token tiles' bits",
                                         fl_type_name(types[ti]), (long long)K, nr, nt, t);
                            for (int r = nr; r < 16; r++) assert_true(got[t * 16 + r] == -12345.0f);
                        }
                    }
                    fl_free(FL_MEM_MISC, rec, rb);
                }
                }
            }
            fl_free(FL_MEM_MISC, p0, pb);
            fl_free(FL_MEM_MISC, p1, pb);
            fl_free(FL_MEM_MISC, ref, (size_t)(M * 16) * 4);
            fl_free(FL_MEM_MISC, pr, (size_t)(M * 16) * 4);
            fl_free(FL_MEM_MISC, got, (size_t)(M * 16) * 4);
            fl_act_q8_free(&a);
            fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
            qmat_free(&q);
        }
    fl_test_mem_zero();
}

/* The AVX2 panel tile's integer bounds: Q4_0 rows of codes all 15 or all 0 against activation
 * codes all +127 or -127 (int16 lanes from -8 x 16 x 127 = -16256 at the start, fl_act_q8.o4, to
 * 7 x 16 x 127 or staying at -16256), Q8_0 codes -128 and 127 against -127 / +127 (pairs
 * of 2 x 128 x 127 = 32512), Q5_K codes 31 or 0 (lanes of sum (q - 16) x: 15 or -16 x 16 x 127)
 * with scales 63, Q6_K codes 63 or 0 (per half, sum (q - 32) x: 31 or -32 x 8 x 127) with scales
 * 127 or -128, Q5_0 codes 31 or 0 (as Q5_K), IQ4_NL values 113 or -127 (pairs of 2 x 127 x
 * 127), Q3_K codes 3 or -4 with scales 31 or -32 (its row dots' scale words 256 x sc) and Q2_K
 * codes 3 or 0 with scales and mins 15 give the exact integer results, as the reference does;
 * so do the one- / few-token kernels (fl_gemm_q8_avx2: the GEMV and the row dots). */
static void test_panel_extremes(void **state) {
    (void)state;
    if (fl_isa_best() < FL_ISA_AVX2) skip();
    const int64_t K = 256, N = 16, M = 4;
    const int32_t types[8] = {FL_TYPE_Q4_0, FL_TYPE_Q8_0, FL_TYPE_Q5_K, FL_TYPE_Q6_K, FL_TYPE_Q5_0, FL_TYPE_IQ4_NL, FL_TYPE_Q3_K, FL_TYPE_Q2_K};
    for (int ti = 0; ti < 8; ti++) {
        qmat q;
        qmat_make(&q, types[ti], N, K);
        const uint16_t one = 0x3C00, zero = 0; /* f16 1.0, 0.0 */
        for (int64_t n = 0; n < N; n++) {
            char *row = (char *)q.data + n * q.W.nb[1];
            if (types[ti] == FL_TYPE_Q5_K) { /* d 1, dmin 0, every scale 63, codes 31 or 0 */
                fl_block_q5_K *blk = (fl_block_q5_K *)row;
                memcpy(&blk->d, &one, 2);
                memcpy(&blk->dmin, &zero, 2);
                memset(blk->scales, 0xFF, sizeof blk->scales);
                memset(blk->qh, n % 2 ? 0x00 : 0xFF, sizeof blk->qh);
                memset(blk->qs, n % 2 ? 0x00 : 0xFF, sizeof blk->qs);
                continue;
            }
            if (types[ti] == FL_TYPE_Q6_K) { /* d 1, scales 127 (rows 0, 1 mod 4) or -128, codes 63 or 0 */
                fl_block_q6_K *blk = (fl_block_q6_K *)row;
                memcpy(&blk->d, &one, 2);
                memset(blk->scales, n % 4 < 2 ? 0x7F : 0x80, sizeof blk->scales);
                memset(blk->ql, n % 2 ? 0x00 : 0xFF, sizeof blk->ql);
                memset(blk->qh, n % 2 ? 0x00 : 0xFF, sizeof blk->qh);
                continue;
            }
            if (types[ti] == FL_TYPE_Q3_K) { /* d 1, scales 31 (rows 0, 1 mod 4) or -32, codes 3 or -4 */
                fl_block_q3_K *blk = (fl_block_q3_K *)row;
                memcpy(&blk->d, &one, 2);
                memset(blk->scales, n % 4 < 2 ? 0xFF : 0x00, sizeof blk->scales);
                memset(blk->hmask, n % 2 ? 0x00 : 0xFF, sizeof blk->hmask);
                memset(blk->qs, n % 2 ? 0x00 : 0xFF, sizeof blk->qs);
                continue;
            }
            if (types[ti] == FL_TYPE_Q2_K) { /* d 1, dmin 1, scales and mins 15, codes 3 or 0: 45 - 15 or -15 */
                fl_block_q2_K *blk = (fl_block_q2_K *)row;
                memcpy(&blk->d, &one, 2);
                memcpy(&blk->dmin, &one, 2);
                memset(blk->scales, 0xFF, sizeof blk->scales);
                memset(blk->qs, n % 2 ? 0x00 : 0xFF, sizeof blk->qs);
                continue;
            }
            if (types[ti] == FL_TYPE_Q5_0) { /* codes 31 or 0: q - 16 = 15 or -16 */
                for (int64_t b = 0; b < K / 32; b++) {
                    fl_block_q5_0 *blk = (fl_block_q5_0 *)row + b;
                    memcpy(&blk->d, &one, 2);
                    memset(blk->qh, n % 2 ? 0x00 : 0xFF, sizeof blk->qh);
                    memset(blk->qs, n % 2 ? 0x00 : 0xFF, sizeof blk->qs);
                }
                continue;
            }
            for (int64_t b = 0; b < K / 32; b++) { /* (IQ4_NL: codes 0 or 15, values -127 or 113) */
                char *blk = row + b * (types[ti] == FL_TYPE_Q8_0 ? 34 : 18);
                memcpy(blk, &one, 2);
                if (types[ti] == FL_TYPE_Q4_0 || types[ti] == FL_TYPE_IQ4_NL) memset(blk + 2, n % 2 ? 0x00 : 0xFF, 16); /* w - 8 = -8 or 7 */
                else memset(blk + 2, n % 2 ? 0x80 : 0x7F, 32); /* -128 or 127 */
            }
        }
        float *x = frand_buf(M * K);
        for (int64_t i = 0; i < M * K; i++) x[i] = (i / K) % 2 ? -1.0f : 1.0f; /* codes +-127 */
        fl_act_q8 a;
        assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
        for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
        const size_t pb = fl_panel_bytes_for(types[ti], K);
        char *p = fl_alloc(FL_MEM_MISC, pb, 64);
        float ref[M * N], got[M * N], dots[M * N];
        fl_gemm_q8_ref(types[ti], q.data, q.W.nb[1], (int)N, &a, 0, (int)M, ref, N);
        fl_panel_pack_avx2(types[ti], q.data, q.W.nb[1], (int)N, K, p);
        fl_panel_gemm_avx2(types[ti], p, (int)N, &a, 0, (int)M, got, N);
        /* and the one- / few-token kernels (GEMV, row dots) */
        fl_gemm_q8_avx2(types[ti], q.data, q.W.nb[1], (int)N, &a, 0, (int)M, dots, N);
        for (int64_t i = 0; i < M * N; i++) {
            /* the integer sum times d_x = 1/127 (f16), exactly representable: e.g. Q4_0 7 x 127 x 256 */
            const int64_t n = i % N;
            const double w = types[ti] == FL_TYPE_Q4_0   ? (n % 2 ? -8 : 7)
                             : types[ti] == FL_TYPE_Q8_0 ? (n % 2 ? -128 : 127)
                             : types[ti] == FL_TYPE_Q5_K ? 63 * (n % 2 ? 0 : 31)
                             : types[ti] == FL_TYPE_Q6_K ? (n % 4 < 2 ? 127 : -128) * (n % 2 ? -32 : 31)
                             : types[ti] == FL_TYPE_Q5_0 ? (n % 2 ? -16 : 15)
                             : types[ti] == FL_TYPE_Q3_K ? (n % 4 < 2 ? 31 : -32) * (n % 2 ? -4 : 3)
                             : types[ti] == FL_TYPE_Q2_K ? (n % 2 ? -15 : 30)
                                                         : (n % 2 ? -127 : 113);
            const double want = w * ((i / N) % 2 ? -127 : 127) * (double)K * (double)a.d[(i / N) * a.nb];
            CHECK_NEAR(ref[i], want, 1e-6 * fabs(want));
            CHECK_NEAR(got[i], want, 1e-6 * fabs(want));
            CHECK_NEAR(dots[i], want, 1e-6 * fabs(want));
        }
        fl_free(FL_MEM_MISC, p, pb);
        fl_act_q8_free(&a);
        fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
        qmat_free(&q);
    }
    fl_test_mem_zero();
}

/* The dot of dequantized weight row n with token m's dequantized 8-bit activations, in double:
 * what every integer path computes up to f32 rounding. */
static double deq_dot(const qmat *q, int64_t n, const fl_act_q8 *a, int64_t m) {
    const int64_t K = q->W.ne[0];
    float *w = fl_alloc(FL_MEM_MISC, (size_t)K * 4, 64);
    fl_dequant_row(q->W.type, (const char *)q->data + n * q->W.nb[1], w, K);
    double s = 0;
    for (int64_t k = 0; k < K; k++) s += (double)w[k] * (double)a->d[m * a->nb + k / 32] * (double)a->qs[m * K + k];
    fl_free(FL_MEM_MISC, w, (size_t)K * 4);
    return s;
}

/* AMX-INT8 GEMM: the AVX-512 panel packer is byte-identical to the reference packer; the scalar
 * product on packed data (fl_amx_gemm_ref) equals the dequantized product in double and, where
 * it exists, the integer tile reference (f32 order only), on partial panels, a partial second
 * token tile and odd block counts; and where the OS grants AMX the tile kernel matches it. */
static void test_amx_parity(void **state) {
    (void)state;
    const int32_t types[11] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_1, FL_TYPE_Q5_0, FL_TYPE_Q5_1, FL_TYPE_IQ4_NL,
                               FL_TYPE_Q4_K, FL_TYPE_Q5_K, FL_TYPE_Q6_K, FL_TYPE_Q3_K, FL_TYPE_Q2_K};
    const int64_t Ks[3] = {32, 416, 2048}, Ks_k[3] = {256, 768, 2048};
    const bool fast = fl_isa_best() == FL_ISA_AVX512, amx = fast && fl_cpu_amx_request();
    int amx_runs = 0;
    for (int ti = 0; ti < 11; ti++)
        for (int ki = 0; ki < 3; ki++) {
            const bool kq = types[ti] == FL_TYPE_Q4_K || types[ti] == FL_TYPE_Q5_K || types[ti] == FL_TYPE_Q6_K || types[ti] == FL_TYPE_Q3_K ||
                            types[ti] == FL_TYPE_Q2_K;
            const bool intref = types[ti] == FL_TYPE_Q8_0 || types[ti] == FL_TYPE_Q4_0 || types[ti] == FL_TYPE_Q4_K ||
                                types[ti] == FL_TYPE_Q6_K || types[ti] == FL_TYPE_Q3_K || types[ti] == FL_TYPE_Q2_K; /* fl_gemm_q8_ref has these */
            const int64_t K = kq ? Ks_k[ki] : Ks[ki], N = 21, M = 19;
            qmat q;
            qmat_make(&q, types[ti], N, K);
            float *x = frand_buf(M * K);
            fl_act_q8 a;
            assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
            for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
            const size_t ab = fl_amx_act_bytes(M, K);
            assert_int_equal(ab, (size_t)2 * (K / 32) * 768);
            char *act = fl_alloc(FL_MEM_MISC, ab, 64);
            memset(act, 0x77, ab);
            for (int64_t m = 0; m < 32; m++) fl_amx_act_pack_row(&a, m, act);
            if (fast) { /* the AVX-512 tile packer writes the same bytes */
                char *act2 = fl_alloc(FL_MEM_MISC, ab, 64);
                memset(act2, 0x33, ab);
                for (int64_t m = 0; m < 32; m++) fl_amx_act_pack_row_avx512(&a, m, act2);
                assert_memory_equal(act, act2, ab);
                memset(act2, 0x33, ab); /* and 8 tokens at a time where 8 are there */
                for (int64_t m = 0; m < 32; m += m + 8 <= M ? 8 : 1)
                    if (m + 8 <= M) fl_amx_act_pack8_avx512(&a, m, act2);
                    else fl_amx_act_pack_row_avx512(&a, m, act2);
                assert_memory_equal(act, act2, ab);
                fl_free(FL_MEM_MISC, act2, ab);
            }
            const size_t pb = fl_amx_panel_bytes(types[ti], K);
            assert_int_equal(pb, (size_t)(16 * K + (K / 32) * 64 * (types[ti] == FL_TYPE_Q2_K ? 4 : fl_amx_has_mins(types[ti]) || fl_amx_half(types[ti]) ? 2 : 1)));
            char *p0 = fl_alloc(FL_MEM_MISC, pb, 64), *p1 = fl_alloc(FL_MEM_MISC, pb, 64);
            float *ref = frand_buf(M * 16), *pr = frand_buf(M * 16), *got = frand_buf(M * 16);
            const int nrs[4] = {16, 11, 5, 1};
            for (int ni = 0; ni < 4; ni++) {
                const int nr = nrs[ni];
                const char *w = (const char *)q.data + 3 * q.W.nb[1]; /* rows 3 .. 3 + nr */
                memset(p0, 0x5A, pb);
                fl_amx_panel_pack_ref(types[ti], w, q.W.nb[1], nr, K, p0);
                if (intref) fl_gemm_q8_ref(types[ti], w, q.W.nb[1], nr, &a, 0, (int)M, ref, 16);
                else
                    for (int64_t t2 = 0; t2 < M; t2++)
                        for (int r = 0; r < nr; r++) ref[t2 * 16 + r] = (float)deq_dot(&q, 3 + r, &a, t2);
                for (int mt = 0; mt < 2; mt++) {
                    const int nt = mt == 0 ? 16 : (int)M - 16;
                    fl_amx_gemm_ref(types[ti], p0, K, act, mt, nt, pr + mt * 16 * 16, 16, nr);
                }
                for (int64_t t = 0; t < M; t++)
                    for (int r = 0; r < nr; r++) CHECK_NEAR(pr[t * 16 + r], ref[t * 16 + r], 1e-4 * (1 + fabsf(ref[t * 16 + r])));
                if (!fast) continue;
                memset(p1, 0xA5, pb);
                fl_amx_panel_pack_avx512(types[ti], w, q.W.nb[1], nr, K, p1);
                assert_memory_equal(p0, p1, pb);
                if (!amx) continue;
                /* one panel x two token tiles (tokens 0 .. 18), then one x one (the second tile alone) */
                for (int64_t i = 0; i < M * 16; i++) got[i] = -12345.0f;
                fl_amx_begin(types[ti]);
                fl_amx_gemm(types[ti], p1, pb, 1, K, act, 0, (int)M, got, 16, nr, NULL, 0);
                fl_amx_end();
                amx_runs++;
                for (int64_t t = 0; t < M; t++) {
                    for (int r = 0; r < nr; r++) CHECK_NEAR(got[t * 16 + r], pr[t * 16 + r], 1e-5 * (1 + fabsf(pr[t * 16 + r])));
                    for (int r = nr; r < 16; r++) assert_true(got[t * 16 + r] == -12345.0f); /* rows past nr untouched */
                }
                fl_amx_begin(types[ti]);
                fl_amx_gemm(types[ti], p1, pb, 1, K, act, 1, (int)M - 16, got, 16, nr, q.data, q.bytes); /* with a prefetch */
                fl_amx_end();
                for (int64_t t = 16; t < M; t++)
                    for (int r = 0; r < nr; r++) CHECK_NEAR(got[(t - 16) * 16 + r], pr[t * 16 + r], 1e-5 * (1 + fabsf(pr[t * 16 + r])));
                /* two panels (the full reference panel p0 first, this one second) x 1 and 2 token tiles */
                char *pp = fl_alloc(FL_MEM_MISC, 2 * pb, 64);
                fl_amx_panel_pack_ref(types[ti], (const char *)q.data, q.W.nb[1], 16, K, pp); /* rows 0 .. 15 */
                memcpy(pp + pb, p1, pb);
                float *ref0 = frand_buf(M * 16), *g2 = frand_buf(M * 32);
                if (intref) fl_gemm_q8_ref(types[ti], q.data, q.W.nb[1], 16, &a, 0, (int)M, ref0, 16);
                else
                    for (int64_t t2 = 0; t2 < M; t2++)
                        for (int r = 0; r < 16; r++) ref0[t2 * 16 + r] = (float)deq_dot(&q, r, &a, t2);
                for (int ntok = 16; ntok <= (int)M; ntok += (int)M - 16) {
                    for (int64_t i = 0; i < M * 32; i++) g2[i] = -12345.0f;
                    fl_amx_begin(types[ti]);
                    fl_amx_gemm(types[ti], pp, pb, 2, K, act, 0, ntok, g2, 32, nr, NULL, 0);
                    fl_amx_end();
                    for (int t = 0; t < (int)M; t++)
                        for (int r = 0; r < 32; r++) {
                            const float g = g2[t * 32 + r];
                            if (t >= ntok || (r >= 16 && r - 16 >= nr)) assert_true(g == -12345.0f);
                            else if (r < 16) CHECK_NEAR(g, ref0[t * 16 + r], 1e-4 * (1 + fabsf(ref0[t * 16 + r])));
                            else CHECK_NEAR(g, pr[t * 16 + r - 16], 1e-5 * (1 + fabsf(pr[t * 16 + r - 16])));
                        }
                }
                fl_free(FL_MEM_MISC, pp, 2 * pb);
                fl_free(FL_MEM_MISC, ref0, (size_t)(M * 16) * 4);
                fl_free(FL_MEM_MISC, g2, (size_t)(M * 32) * 4);
            }
            fl_free(FL_MEM_MISC, act, ab);
            fl_free(FL_MEM_MISC, p0, pb);
            fl_free(FL_MEM_MISC, p1, pb);
            fl_free(FL_MEM_MISC, ref, (size_t)(M * 16) * 4);
            fl_free(FL_MEM_MISC, pr, (size_t)(M * 16) * 4);
            fl_free(FL_MEM_MISC, got, (size_t)(M * 16) * 4);
            fl_act_q8_free(&a);
            fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
            qmat_free(&q);
        }
    if (amx) assert_int_equal(amx_runs, 11 * 3 * 4); /* types x Ks x nrs */
    fl_test_mem_zero();
}

/* The AMX-BF16 prefill: the bf16 rounding (nearest even, denormals to zero), the AVX-512
 * activation and panel packers byte-identical to the scalar ones (a second token tile partial),
 * the scalar tile product within bf16 rounding of a double dot of the f32 values, the tiles
 * against it (1 and 2 panels x 1 and 2 token tiles, rows past nr and tokens past ntok untouched,
 * the accumulating form), and fl_matmul through it (K across the 1024-value chunks, 1 .. 3
 * threads) against the f32 reference. */
static void test_amx_bf16(void **state) {
    (void)state;
    assert_int_equal(fl_amx_bf16_round(1.0f), 0x3F80);
    assert_int_equal(fl_amx_bf16_round(1.0f + 0x1p-8f), 0x3F80);  /* tie: to even */
    assert_int_equal(fl_amx_bf16_round(1.0f + 0x3p-8f), 0x3F82);  /* tie: up to even */
    assert_int_equal(fl_amx_bf16_round(-1.0f - 0x1p-7f), 0xBF81); /* exact */
    assert_int_equal(fl_amx_bf16_round(0x1p-130f), 0x0000);      /* denormal: zero */
    assert_int_equal(fl_amx_bf16_round(-0x1p-130f), 0x8000);
    const bool fast = fl_isa_best() == FL_ISA_AVX512 && fl_cpu()->avx512bf16;
    const bool amx = fast && fl_cpu()->amx_bf16 && fl_cpu_amx_request();
    const int32_t types[4] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q6_K};
    int amx_runs = 0;
    for (int ti = 0; ti < 4; ti++) {
        const int64_t K = fl_type_get(types[ti])->blck_size >= 64 ? 768 : 416, N = 21, M = 19;
        qmat q;
        qmat_make(&q, types[ti], N, K);
        float *x = frand_buf(M * K);
        x[5] = 0x1p-130f; /* a denormal activation, a tie */
        x[6] = 1.0f + 0x1p-8f;
        const size_t ab = fl_amx_bf16_act_bytes(M, K), pb = fl_amx_bf16_panel_bytes(K);
        assert_int_equal(ab, (size_t)2 * 16 * K * 2);
        assert_int_equal(pb, (size_t)16 * K * 2);
        uint16_t *act = fl_alloc(FL_MEM_MISC, ab, 64), *p0 = fl_alloc(FL_MEM_MISC, 2 * pb, 64), *p1 = fl_alloc(FL_MEM_MISC, 2 * pb, 64);
        memset(act, 0x77, ab);
        for (int mt = 0; mt < 2; mt++) fl_amx_bf16_act_pack_ref(x, M, K, mt, act);
        assert_true(act[16 * K + 3 * 2] == 0 && act[16 * K + 15 * 2 + 1] == 0 && act[16 * K + 2 * 2] != 0); /* tokens past M: zero */
        float *row = frand_buf(K), *deq = frand_buf(32 * K);
        memset(p0, 0x5A, 2 * pb);
        for (int r = 0; r < 32; r++) { /* two panels: rows 0 .. 20, then zeros */
            if (r < N) fl_dequant_row(types[ti], (const char *)q.data + r * q.W.nb[1], deq + r * K, K);
            fl_amx_bf16_panel_row_ref(r < N ? deq + r * K : NULL, K, p0 + (r / 16) * (pb / 2), r % 16);
        }
        if (fast) {
            uint16_t *act2 = fl_alloc(FL_MEM_MISC, ab, 64);
            memset(act2, 0x33, ab);
            for (int mt = 0; mt < 2; mt++) fl_amx_bf16_act_pack_avx512(x, M, K, mt, act2);
            assert_memory_equal(act, act2, ab);
            fl_free(FL_MEM_MISC, act2, ab);
            memset(p1, 0xA5, 2 * pb);
            for (int r = 0; r < 32; r++) {
                if (r < N) fl_amx_bf16_panel_row_avx512(deq + r * K, K, p1 + (r / 16) * (pb / 2), r % 16);
                else fl_amx_bf16_panel_row_ref(NULL, K, p1 + (r / 16) * (pb / 2), r % 16);
            }
            assert_memory_equal(p0, p1, 2 * pb);
            /* Q4_0 / Q8_0 straight from the blocks: the same bytes; other types decline */
            memset(p1, 0xA5, 2 * pb);
            bool direct = true;
            for (int r = 0; r < 32; r++) {
                if (r < N) direct = fl_amx_bf16_panel_row_q(types[ti], (const char *)q.data + r * q.W.nb[1], K, p1 + (r / 16) * (pb / 2), r % 16);
                else fl_amx_bf16_panel_row_ref(NULL, K, p1 + (r / 16) * (pb / 2), r % 16);
                if (!direct) break;
            }
            assert_true(direct == (types[ti] == FL_TYPE_Q4_0 || types[ti] == FL_TYPE_Q8_0));
            if (direct) assert_memory_equal(p0, p1, 2 * pb);
            if (direct) { /* the R8 groups of rows 0 .. 15, whole and from block 4 on: the same bytes */
                const int32_t rt = fl_r8_of(types[ti]);
                const size_t ldw = q.W.nb[1], gbytes = (size_t)FL_R8_ROWS * ldw;
                char *grp = fl_alloc(FL_MEM_MISC, 2 * gbytes, 64);
                for (int g = 0; g < 2; g++) fl_r8_pack(rt, (const char *)q.data + (size_t)g * gbytes, ldw, K, grp + (size_t)g * gbytes);
                for (int pass = 0; pass < 2; pass++) {
                    const int64_t k0 = pass ? 128 : 0, kn = K - k0;
                    const size_t ppb = fl_amx_bf16_panel_bytes(kn), goff = (size_t)(k0 / 32) * fl_r8_block_bytes(rt);
                    memset(p1, 0xA5, ppb);
                    memset(p1 + ppb / 2, 0x5A, ppb);
                    for (int r = 0; r < 16; r++)
                        assert_true(fl_amx_bf16_panel_row_q(types[ti], (const char *)q.data + r * ldw + fl_type_row_size(types[ti], k0), kn, p1, r));
                    for (int g = 0; g < 2; g++) assert_true(fl_amx_bf16_panel_r8(rt, grp + (size_t)g * gbytes + goff, kn, p1 + ppb / 2, 8 * g));
                    assert_memory_equal(p1, p1 + ppb / 2, ppb);
                }
                assert_false(fl_amx_bf16_panel_r8(types[ti], grp, K, p1, 0)); /* (the base type declines) */
                fl_free(FL_MEM_MISC, grp, 2 * gbytes);
            }
        }
        /* the scalar product: within bf16 rounding of the f32 values' dot */
        float *ref = frand_buf(M * 32), *got = frand_buf(M * 32);
        for (int p = 0; p < 2; p++)
            for (int mt = 0; mt < 2; mt++)
                fl_amx_bf16_gemm_ref(p0 + p * (pb / 2), K, act + mt * 16 * K, mt ? (int)M - 16 : 16, ref + mt * 16 * 32 + 16 * p,
                                     32, p ? (int)N - 16 : 16, false);
        for (int64_t t = 0; t < M; t++)
            for (int r = 0; r < N; r++) {
                double d = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    d += (double)deq[r * K + k] * x[t * K + k];
                    mag += fabs((double)deq[r * K + k] * x[t * K + k]);
                }
                CHECK_NEAR(ref[t * 32 + r], d, mag * 0x1p-7);
            }
        if (amx) {
            const int nrs[2] = {5, 1}, ntoks[3] = {19, 16, 3};
            for (int np = 1; np <= 2; np++)
                for (int ni = 0; ni < 2; ni++)
                    for (int ki = 0; ki < 3; ki++) {
                        const int nr = nrs[ni], ntok = ntoks[ki];
                        for (int64_t i = 0; i < M * 32; i++) got[i] = -12345.0f;
                        /* panel pair: (np == 2) rows 0 .. 15 then rows 16 .. 16 + nr; np == 1: the second panel alone */
                        const uint16_t *pp = np == 2 ? p0 : p0 + pb / 2;
                        fl_amx_bf16_begin();
                        fl_amx_bf16_gemm(pp, pb / 2, np, K, act, (size_t)16 * K, ntok, got, 32, nr, false);
                        fl_amx_end();
                        for (int t = 0; t < (int)M; t++)
                            for (int c = 0; c < 32; c++) {
                                const int r = np == 2 ? c : c + 16; /* the panel row this column is */
                                const bool written = t < ntok && c < 16 * np && (c < 16 * (np - 1) || c - 16 * (np - 1) < nr);
                                if (!written) assert_true(got[t * 32 + c] == -12345.0f);
                                else CHECK_NEAR(got[t * 32 + c], ref[t * 32 + r], 1e-5 * (1 + fabsf(ref[t * 32 + r])));
                            }
                        /* accumulating: y + the product */
                        for (int64_t i = 0; i < M * 32; i++) got[i] = 1.5f;
                        fl_amx_bf16_begin();
                        fl_amx_bf16_gemm(pp, pb / 2, np, K, act, (size_t)16 * K, ntok, got, 32, nr, true);
                        fl_amx_end();
                        for (int t = 0; t < ntok; t++)
                            for (int c = 0; c < 16 * (np - 1) + nr; c++) {
                                const int r = np == 2 ? c : c + 16;
                                CHECK_NEAR(got[t * 32 + c], ref[t * 32 + r] + 1.5f, 1e-5 * (1 + fabsf(ref[t * 32 + r])));
                            }
                        amx_runs++;
                    }
        }
        fl_free(FL_MEM_MISC, row, (size_t)K * 4);
        fl_free(FL_MEM_MISC, deq, (size_t)32 * K * 4);
        fl_free(FL_MEM_MISC, ref, (size_t)(M * 32) * 4);
        fl_free(FL_MEM_MISC, got, (size_t)(M * 32) * 4);
        fl_free(FL_MEM_MISC, act, ab);
        fl_free(FL_MEM_MISC, p0, 2 * pb);
        fl_free(FL_MEM_MISC, p1, 2 * pb);
        fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
        qmat_free(&q);
    }
    if (amx) assert_int_equal(amx_runs, 4 * 12);
    /* fl_matmul through the bf16 tiles: 70 tokens (5 tiles), K = 1280 (a 1024 chunk and a 256 one),
     * 37 rows; against the f32 reference, and against the int8 path */
    if (amx) {
        const int32_t mt_types[3] = {FL_TYPE_Q4_0, FL_TYPE_Q5_K, FL_TYPE_Q2_K};
        for (int ti = 0; ti < 3; ti++) {
            const int64_t N = 37, K = 1280, M = 70;
            qmat q;
            qmat_make(&q, mt_types[ti], N, K);
            float *x = frand_buf(M * K), *ref = frand_buf(M * N), *got = frand_buf(M * N);
            fl_matmul_ref(&q.W, x, ref, M);
            for (int nth = 1; nth <= 3; nth++) {
                fl_threads_set(nth);
                fl_matmul(&q.W, x, got, M);
                const double e = fl_test_nmse(ref, got, M * N);
                if (!(e <= 2e-5)) fail_msg("%s nth=%d bf16 tiles: NMSE %.3g", fl_type_name(mt_types[ti]), nth, e);
            }
            fl_threads_set(0);
            fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
            fl_free(FL_MEM_MISC, ref, (size_t)(M * N) * 4);
            fl_free(FL_MEM_MISC, got, (size_t)(M * N) * 4);
            qmat_free(&q);
        }
    }
    fl_test_mem_zero();
}

/* fl_matmul_n gives the bits of separate fl_matmul calls: three matrices of different row counts
 * (one of them under a chunk), one token (GEMV), 2-4 (the AVX2 few-token GEMV), 16 (the AMX rows or the panels), 30 (the panels), 70 (the
 * AMX-BF16 tiles), 1-3 threads, fused types and ones that are not (F16, a mixed triple); its
 * scratch is no more than one call's. */
static void test_matmul_n(void **state) {
    (void)state;
    const int32_t types[5] = {FL_TYPE_Q4_0, FL_TYPE_Q8_0, FL_TYPE_Q4_K, FL_TYPE_Q6_K, FL_TYPE_F16};
    const int64_t Ms[7] = {1, 2, 3, 4, 16, 30, 70}, Ns[3] = {37, 8, 80}, K = 256;
    for (int ti = 0; ti < 6; ti++) {
        qmat q[3];
        for (int i = 0; i < 3; i++) qmat_make(&q[i], ti < 5 ? types[ti] : types[i], Ns[i], K); /* ti 5: Q4_0, Q8_0, Q4_K */
        float *x = frand_buf(70 * K), *ref[3], *got[3];
        for (int i = 0; i < 3; i++) {
            ref[i] = frand_buf(70 * Ns[i]);
            got[i] = frand_buf(70 * Ns[i]);
        }
        const fl_tensor *W[3] = {&q[0].W, &q[1].W, &q[2].W};
        for (int nth = 1; nth <= 3; nth++) {
            fl_threads_set(nth);
            for (int mi = 0; mi < 7; mi++) {
                const int64_t M = Ms[mi];
                size_t single = 0;
                for (int i = 0; i < 3; i++) {
                    fl_matmul(W[i], x, ref[i], M);
                    const size_t b = fl_matmul_scratch_bytes(W[i], M, nth);
                    single = b > single ? b : single;
                }
                for (int i = 0; i < 3; i++) memset(got[i], 0x7F, (size_t)(M * Ns[i]) * 4);
                const size_t before = fl_mem_current(FL_MEM_SCRATCH);
                fl_mem_reset_peaks();
                fl_matmul_n(3, W, got, x, M);
                assert_true(fl_mem_peak(FL_MEM_SCRATCH) - before <= single);
                for (int i = 0; i < 3; i++)
                    if (memcmp(ref[i], got[i], (size_t)(M * Ns[i]) * 4) != 0)
                        fail_msg("type set %d M=%lld nth=%d: matrix %d differs from fl_matmul", ti, (long long)M, nth, i);
            }
        }
        fl_threads_set(0);
        fl_matmul_n(0, W, got, x, 1); /* nothing */
        for (int i = 0; i < 3; i++) {
            fl_free(FL_MEM_MISC, ref[i], (size_t)(70 * Ns[i]) * 4);
            fl_free(FL_MEM_MISC, got[i], (size_t)(70 * Ns[i]) * 4);
            qmat_free(&q[i]);
        }
        fl_free(FL_MEM_MISC, x, (size_t)(70 * K) * 4);
    }
    fl_test_mem_zero();
}

/* AMX steps of up to 16 tokens, Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K (fl_amx_gemm_rows: rows unpacked per block into
 * L1, Q8_0 with 16 real rows loaded straight from them): 32, 20 (second panel partial), 16 and 5
 * rows, 16, 13 and 1 tokens, odd block counts, equal the integer reference; rows past nr and
 * tokens past ntok are not written. */
static void test_amx_rows(void **state) {
    (void)state;
    if (fl_isa_best() != FL_ISA_AVX512 || !fl_cpu_amx_request()) skip();
    const int32_t types[5] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q6_K, FL_TYPE_Q5_K};
    const int64_t Ks[3] = {32, 416, 2048}, Ks_k[3] = {256, 768, 2048}, N = 40, LD = 40;
    const int nrs[4] = {32, 20, 16, 5}, Ms[3] = {16, 13, 1};
    int runs = 0;
    for (int ti = 0; ti < 5; ti++)
        for (int ki = 0; ki < 3; ki++) {
            const int64_t K = ti >= 2 ? Ks_k[ki] : Ks[ki]; /* K-quants: whole super-blocks */
            qmat q;
            qmat_make(&q, types[ti], N, K);
            for (int mi = 0; mi < 3; mi++) {
                const int64_t M = Ms[mi];
                float *x = frand_buf(M * K);
                fl_act_q8 a;
                assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
                for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
                const size_t ab = fl_amx_act_bytes(M, K);
                char *act = fl_alloc(FL_MEM_MISC, ab, 64);
                for (int64_t m = 0; m < 16; m++) fl_amx_act_pack_row(&a, m, act);
                float *ref = frand_buf(16 * LD), *got = frand_buf(16 * LD);
                for (int ni = 0; ni < 4; ni++) {
                    const int nr = nrs[ni];
                    const char *w = (const char *)q.data + 3 * q.W.nb[1]; /* rows 3 .. 3 + nr */
                    fl_gemm_q8_ref(types[ti], w, q.W.nb[1], nr, &a, 0, (int)M, ref, LD);
                    for (int64_t i = 0; i < 16 * LD; i++) got[i] = -12345.0f;
                    fl_amx_begin(types[ti]);
                    fl_amx_gemm_rows(types[ti], w, q.W.nb[1], nr, K, act, (int)M, got, LD, ni ? q.data : NULL, ni ? q.bytes : 0);
                    fl_amx_end();
                    runs++;
                    for (int64_t t = 0; t < 16; t++)
                        for (int r = 0; r < LD; r++) {
                            if (t >= M || r >= nr) assert_true(got[t * LD + r] == -12345.0f);
                            else CHECK_NEAR(got[t * LD + r], ref[t * LD + r], 1e-4 * (1 + fabsf(ref[t * LD + r])));
                        }
                }
                fl_free(FL_MEM_MISC, ref, (size_t)(16 * LD) * 4);
                fl_free(FL_MEM_MISC, got, (size_t)(16 * LD) * 4);
                fl_free(FL_MEM_MISC, act, ab);
                fl_act_q8_free(&a);
                fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
            }
            qmat_free(&q);
        }
    assert_int_equal(runs, 180);
    fl_test_mem_zero();
}

/* Whole-matrix GEMM through fl_matmul (panels on AVX-512, AMX tiles from 13 tokens) on shapes with row and token tails
 * against the scalar integer tiles of the reference ISA. */
static void test_gemm_shapes_vs_ref_isa(void **state) {
    (void)state;
    const int32_t types[2] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0};
    const int64_t shapes[][3] = {{33, 96, 2}, {16, 64, 8}, {47, 352, 17}, {5, 32, 3}, {40, 128, 13}, {18, 96, 12}, {70, 160, 16}}; /* N, K, M */
    for (int ti = 0; ti < 2; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t N = shapes[si][0], K = shapes[si][1], M = shapes[si][2];
            qmat q;
            qmat_make(&q, types[ti], N, K);
            float *x = frand_buf(M * K), *ref = frand_buf(M * N), *got = frand_buf(M * N);
            fl_isa_set(FL_ISA_REF);
            fl_matmul(&q.W, x, ref, M);
            fl_isa_set(fl_isa_best());
            for (int nth = 1; nth <= 3; nth++) {
                fl_threads_set(nth);
                fl_matmul(&q.W, x, got, M);
                for (int64_t i = 0; i < M * N; i++) CHECK_NEAR(got[i], ref[i], 1e-4 * (1 + fabsf(ref[i])));
            }
            fl_threads_set(0);
            fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
            fl_free(FL_MEM_MISC, ref, (size_t)(M * N) * 4);
            fl_free(FL_MEM_MISC, got, (size_t)(M * N) * 4);
            qmat_free(&q);
        }
    fl_test_mem_zero();
}

/* The AVX2 and AVX-512 activation quantizers equal the scalar reference bit for bit: codes, scales, sums
 * and the derived lanes; blocks of zeros, tiny (f16-subnormal scale) and large magnitudes, ties. */
static void test_act_quant_parity(void **state) {
    (void)state;
    if (fl_isa_best() == FL_ISA_REF) skip();
    /* 45 blocks a row: the AVX-512 quantizer's runs of 16 blocks and a tail; the special blocks
     * in both (blocks 1-4 and 21-24) */
    const int64_t M = 3, K = 45 * 32;
    float *x = frand_buf(M * K);
    for (int64_t o = 32; o <= 32 * 21; o += 32 * 20) {
        for (int j = 0; j < 32; j++) x[o + j] = 0.0f;           /* all-zero block */
        for (int j = 0; j < 32; j++) x[o + 32 + j] *= 1e-7f;    /* scale below the f16 normal range */
        for (int j = 0; j < 32; j++) x[o + 64 + j] *= 3e4f;     /* large */
        for (int j = 0; j < 31; j++) x[o + 96 + j] = (float)j - 15.5f; /* amax 127: id = 1, codes are .5 ties */
        x[o + 96 + 31] = 127.0f;
    }
    fl_act_q8 a, b;
    assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
    assert_int_equal(fl_act_q8_alloc(&b, M, K), FL_OK);
    memset(a.mem, 0, a.bytes);
    memset(b.mem, 0xEE, b.bytes);
    for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
    void (*quant[2])(fl_act_q8 *, int64_t, const float *) = {fl_act_q8_quantize_row_avx2,
                                                             fl_isa_best() == FL_ISA_AVX512 ? fl_act_q8_quantize_row_avx512 : NULL};
    for (int v = 0; v < 2; v++) {
        if (!quant[v]) continue;
        memset(b.mem, 0xEE, b.bytes);
        for (int64_t m = 0; m < M; m++) quant[v](&b, m, x + m * K);
        assert_memory_equal(a.qs, b.qs, (size_t)(M * K));
        assert_memory_equal(a.d, b.d, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.s, b.s, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.ms, b.ms, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.dv, b.dv, (size_t)(M * a.nb) * 32);
        assert_memory_equal(a.sv, b.sv, (size_t)(M * a.nb) * 32);
        assert_memory_equal(a.o4, b.o4, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.o6, b.o6, (size_t)(M * a.nb) * 8);
    }
    if (fl_isa_best() == FL_ISA_AVX512) { /* by block ranges straight into the 16-token records, the lean fields only */
        const size_t rb = fl_act16_bytes(M, K);
        char *r0 = fl_alloc(FL_MEM_MISC, rb, 64), *r1 = fl_alloc(FL_MEM_MISC, rb, 64);
        assert_non_null(r0);
        assert_non_null(r1);
        memset(r0, 0xEE, rb);
        memset(r1, 0xEE, rb);
        for (int64_t m = 0; m < M; m++) fl_act16_pack_row(&a, m, r0);
        memset(b.mem, 0xEE, b.bytes);
        for (int64_t m = 0; m < M; m++) {
            fl_act_q8_quantize_blocks_avx512(&b, m, x + m * K, 4, b.nb, false, true, r1);
            fl_act_q8_quantize_blocks_avx512(&b, m, x + m * K, 0, 4, false, true, r1);
        }
        assert_memory_equal(a.qs, b.qs, (size_t)(M * K));
        assert_memory_equal(a.d, b.d, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.s, b.s, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.ms, b.ms, (size_t)(M * a.nb) * 4);
        assert_memory_equal(r0, r1, rb);
        assert_int_equal((unsigned char)((char *)b.sv)[0], 0xEE); /* (left unset: all false) */
        /* the rows alone (a one-token GEMV's), by ranges that start off a run of 16 */
        memset(b.mem, 0xEE, b.bytes);
        for (int64_t m = 0; m < M; m++) {
            fl_act_q8_quantize_blocks_avx512(&b, m, x + m * K, 0, 7, false, true, NULL);
            fl_act_q8_quantize_blocks_avx512(&b, m, x + m * K, 7, 40, false, true, NULL);
            fl_act_q8_quantize_blocks_avx512(&b, m, x + m * K, 40, b.nb, false, true, NULL);
        }
        assert_memory_equal(a.qs, b.qs, (size_t)(M * K));
        assert_memory_equal(a.d, b.d, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.s, b.s, (size_t)(M * a.nb) * 4);
        assert_memory_equal(a.ms, b.ms, (size_t)(M * a.nb) * 4);
        /* rows false: the same records, and nothing of the rows written (all true or not) */
        for (int all = 0; all < 2; all++) {
            memset(r1, 0xEE, rb);
            memset(b.mem, 0xEE, b.bytes);
            for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_blocks_avx512(&b, m, x + m * K, 0, b.nb, all, false, r1);
            assert_memory_equal(r0, r1, rb);
            for (size_t i = 0; i < b.bytes; i++)
                if (((unsigned char *)b.mem)[i] != 0xEE) fail_msg("rows false wrote byte %zu of the rows", i);
        }
        fl_free(FL_MEM_MISC, r0, rb);
        fl_free(FL_MEM_MISC, r1, rb);
    }
    /* o6: per half, -32 x the same two sums */
    for (int64_t i = 0; i < M * a.nb; i++)
        for (int h = 0; h < 2; h++) {
            int lo = 0, hi = 0;
            for (int j = 16 * h; j < 16 * h + 16; j++) *(j % 4 < 2 ? &lo : &hi) += a.qs[i * 32 + j];
            assert_int_equal((int16_t)(a.o6[i * 2 + h] & 0xFFFF), -32 * lo);
            assert_int_equal((int16_t)((uint32_t)a.o6[i * 2 + h] >> 16), -32 * hi);
        }
    /* o4: -8 x the sums of the codes k % 4 < 2 (low int16) and k % 4 >= 2 (high) */
    for (int64_t i = 0; i < M * a.nb; i++) {
        int lo = 0, hi = 0;
        for (int j = 0; j < 32; j++) *(j % 4 < 2 ? &lo : &hi) += a.qs[i * 32 + j];
        assert_int_equal((int16_t)(a.o4[i] & 0xFFFF), -8 * lo);
        assert_int_equal((int16_t)((uint32_t)a.o4[i] >> 16), -8 * hi);
    }
    fl_act_q8_free(&a);
    fl_act_q8_free(&b);
    fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
    fl_test_mem_zero();
}

/* One-token GEMV (M == 1): the quantizers fill the Q4_0-order copy qs4 identically, and the
 * AVX-512 GEMV (the VBMI kernel on qs4 when the CPU has it, the pairwise one without qs4) matches
 * the scalar reference for block counts with 4- and 16-block tails; Q4_K and Q6_K (their own GEMVs,
 * 1 to 8 super-blocks) too. */
/* The GEMVs' prefetch distances change no bit of a one-token product (the same kernels read the
 * same blocks), and FL_GEMV_PF sets them when the kernels are chosen, a malformed value leaving
 * the CPU's defaults. */
static void test_gemv_prefetch(void **state) {
    (void)state;
    /* (the R8 types' one-token tile prefetches where fl_gemv_pf_far is set) */
    const int32_t types[7] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q6_K, FL_TYPE_IQ4_NL, FL_TYPE_Q8_0_R8, FL_TYPE_Q4_0_R8};
    const int64_t K = 1024;
    const int d_near = fl_gemv_pf_near, d_far = fl_gemv_pf_far;
    const int cfg[4][2] = {{0, 0}, {4096, 0}, {1024, 8192}, {64, 64}};
    for (int ti = 0; ti < 7; ti++) {
        const bool r8 = fl_r8_base(types[ti]) >= 0;
        const int64_t N = r8 ? 72 : 70;
        qmat q;
        qmat_make(&q, r8 ? fl_r8_base(types[ti]) : types[ti], N, K);
        if (r8) { /* repacked in place */
            repack_r8(types[ti], q.data, q.W.nb[1], N, K);
            const int64_t ne[2] = {K, N};
            assert_true(fl_tensor_init(&q.W, types[ti], 2, ne, q.data) != 0);
        }
        float *x = frand_buf(K), *ref = frand_buf(N), *got = frand_buf(N);
        fl_matmul(&q.W, x, ref, 1);
        for (int c = 0; c < 4; c++) {
            fl_gemv_pf_near = cfg[c][0];
            fl_gemv_pf_far = cfg[c][1];
            memset(got, 0x7F, (size_t)N * 4);
            fl_matmul(&q.W, x, got, 1);
            if (memcmp(ref, got, (size_t)N * 4)) fail_msg("type %d: prefetch %d,%d changed the product", types[ti], cfg[c][0], cfg[c][1]);
        }
        fl_gemv_pf_near = d_near;
        fl_gemv_pf_far = d_far;
        fl_free(FL_MEM_MISC, x, (size_t)K * 4);
        fl_free(FL_MEM_MISC, ref, (size_t)N * 4);
        fl_free(FL_MEM_MISC, got, (size_t)N * 4);
        qmat_free(&q);
    }
    const fl_isa isa = fl_isa_get();
    setenv("FL_GEMV_PF", "512,2048", 1);
    fl_isa_set(isa);
    assert_int_equal(fl_gemv_pf_near, 512);
    assert_int_equal(fl_gemv_pf_far, 2048);
    setenv("FL_GEMV_PF", "512;x", 1); /* not understood: the defaults */
    fl_isa_set(isa);
    unsetenv("FL_GEMV_PF");
    assert_int_equal(fl_gemv_pf_near, fl_cpu()->intel ? 1024 : 4096);
    assert_int_equal(fl_gemv_pf_far, fl_cpu()->intel ? 8192 : 0);
    fl_isa_set(isa);
    assert_int_equal(fl_gemv_pf_near, d_near);
    fl_test_mem_zero();
}

static void test_gemv_parity(void **state) {
    (void)state;
    if (fl_isa_best() == FL_ISA_REF) skip();
    const bool avx512 = fl_isa_best() == FL_ISA_AVX512;
    const int32_t types[11] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q6_K, FL_TYPE_Q5_K, FL_TYPE_Q3_K,
                               FL_TYPE_Q2_K, FL_TYPE_Q4_1, FL_TYPE_Q5_0, FL_TYPE_Q5_1, FL_TYPE_IQ4_NL};
    const int64_t Ks[8] = {32, 96, 128, 160, 512, 544, 2048, 2080};
    for (int ti = 0; ti < 11; ti++)
        for (int ki = 0; ki < 8; ki++) {
            const int64_t K = ti >= 2 && ti <= 6 ? 256 * (ki + 1) : Ks[ki], N = 7;
            qmat q;
            qmat_make(&q, types[ti], N, K);
            float *x = frand_buf(K);
            fl_act_q8 a, b;
            assert_int_equal(fl_act_q8_alloc(&a, 1, K), FL_OK);
            assert_int_equal(fl_act_q8_alloc(&b, 1, K), FL_OK);
            assert_non_null(a.qs4);
            memset(a.mem, 0, a.bytes);
            memset(b.mem, 0, b.bytes);
            fl_act_q8_quantize_row(&a, 0, x);
            float ref[7], got[7], pair[7];
            fl_gemm_q8_ref(types[ti], q.data, q.W.nb[1], (int)N, &a, 0, 1, ref, 7);
            /* AVX2: maddubs tiles (Q8_0 / Q4_0) and row dots (the others) */
            for (int r = 0; r < N; r++) got[r] = NAN;
            fl_gemm_q8_avx2(types[ti], q.data, q.W.nb[1], (int)N, &a, 0, 1, got, 7);
            for (int r = 0; r < N; r++)
                if (!(fabsf(got[r] - ref[r]) <= 1e-4f * (1 + fabsf(ref[r]))))
                    fail_msg("%s K=%lld row %d: AVX2 %.7g vs ref %.7g", fl_type_name(types[ti]), (long long)K, r, got[r], ref[r]);
            if (!avx512) {
                fl_act_q8_free(&a);
                fl_act_q8_free(&b);
                fl_free(FL_MEM_MISC, x, (size_t)K * 4);
                qmat_free(&q);
                continue;
            }
            fl_act_q8_quantize_row_avx512(&b, 0, x);
            assert_memory_equal(a.mem, b.mem, a.bytes);
            for (int64_t g = 0; g + 4 <= a.nb; g += 4) /* spot-check the order */
                for (int k = 0; k < 4; k++) {
                    assert_int_equal(a.qs4[g * 32 + k * 16 + 5], a.qs[(g + k) * 32 + 5]);
                    assert_int_equal(a.qs4[g * 32 + 64 + k * 16 + 9], a.qs[(g + k) * 32 + 25]);
                }
            fl_gemm_q8_avx512(types[ti], q.data, q.W.nb[1], (int)N, &b, 0, 1, got, 7);
            int8_t *keep = b.qs4;
            b.qs4 = NULL;
            fl_gemm_q8_avx512(types[ti], q.data, q.W.nb[1], (int)N, &b, 0, 1, pair, 7);
            b.qs4 = keep;
            for (int r = 0; r < N; r++) {
                if (!(fabsf(got[r] - ref[r]) <= 1e-4f * (1 + fabsf(ref[r]))))
                    fail_msg("%s K=%lld row %d: GEMV %.7g vs ref %.7g", fl_type_name(types[ti]), (long long)K, r, got[r], ref[r]);
                CHECK_NEAR(pair[r], ref[r], 1e-4 * (1 + fabsf(ref[r])));
            }
            fl_act_q8_free(&a);
            fl_act_q8_free(&b);
            fl_free(FL_MEM_MISC, x, (size_t)K * 4);
            qmat_free(&q);
        }
    /* Q2_K / Q3_K rows longer than one pass of their per-call activation sums (64 super-blocks):
     * 65 and 130 super-blocks, two tokens */
    for (int ti = 0; ti < 2 && avx512; ti++)
        for (int64_t K = 65 * 256; K <= 130 * 256; K += 65 * 256) {
            const int32_t type = ti ? FL_TYPE_Q3_K : FL_TYPE_Q2_K;
            const int64_t N = 3;
            qmat q;
            qmat_make(&q, type, N, K);
            float *x = frand_buf(2 * K);
            fl_act_q8 a;
            assert_int_equal(fl_act_q8_alloc(&a, 2, K), FL_OK);
            for (int64_t m = 0; m < 2; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
            float ref[6], got[6];
            fl_gemm_q8_ref(type, q.data, q.W.nb[1], (int)N, &a, 0, 2, ref, 3);
            fl_gemm_q8_avx512(type, q.data, q.W.nb[1], (int)N, &a, 0, 2, got, 3);
            for (int i = 0; i < 6; i++)
                if (!(fabsf(got[i] - ref[i]) <= 1e-4f * (1 + fabsf(ref[i]))))
                    fail_msg("%s K=%lld %d: GEMV %.7g vs ref %.7g", fl_type_name(type), (long long)K, i, got[i], ref[i]);
            fl_act_q8_free(&a);
            fl_free(FL_MEM_MISC, x, (size_t)(2 * K) * 4);
            qmat_free(&q);
        }
    fl_test_mem_zero();
}

/* AVX2 row dots over several tokens (fl_gemm_q8_avx2 runs each row for every token) against the
 * reference on partial row / token counts: the K-quants, and Q4_1, Q5_0, Q5_1, IQ4_NL with a tail
 * of 7 blocks past the 8-block scale groups. */
static void test_avx2_kquant_tiles(void **state) {
    (void)state;
    if (fl_isa_best() == FL_ISA_REF) skip();
    const int32_t types[9] = {FL_TYPE_Q4_K, FL_TYPE_Q6_K, FL_TYPE_Q5_K, FL_TYPE_Q3_K, FL_TYPE_Q2_K,
                              FL_TYPE_Q4_1, FL_TYPE_Q5_0, FL_TYPE_Q5_1, FL_TYPE_IQ4_NL};
    for (int ti = 0; ti < 9; ti++) {
        const int64_t K = ti < 5 ? 768 : 736, N = 5, M = 3;
        qmat q;
        qmat_make(&q, types[ti], N, K);
        float *x = frand_buf(M * K);
        fl_act_q8 a;
        assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
        for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
        float ref[15], got[15];
        for (int i = 0; i < 15; i++) got[i] = -1.0f;
        fl_gemm_q8_ref(types[ti], q.data, q.W.nb[1], (int)N, &a, 0, (int)M, ref, N);
        fl_gemm_q8_avx2(types[ti], q.data, q.W.nb[1], (int)N, &a, 0, (int)M, got, N);
        for (int i = 0; i < M * N; i++) CHECK_NEAR(got[i], ref[i], 1e-4 * (1 + fabsf(ref[i])));
        /* two rows of the last token only */
        for (int i = 0; i < 15; i++) got[i] = -1.0f;
        fl_gemm_q8_avx2(types[ti], (const char *)q.data + 3 * q.W.nb[1], q.W.nb[1], 2, &a, 2, 1, got, N);
        CHECK_NEAR(got[0], ref[2 * N + 3], 1e-4 * (1 + fabsf(ref[2 * N + 3])));
        CHECK_NEAR(got[1], ref[2 * N + 4], 1e-4 * (1 + fabsf(ref[2 * N + 4])));
        assert_true(got[2] == -1.0f);
        fl_act_q8_free(&a);
        fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
        qmat_free(&q);
    }
    fl_test_mem_zero();
}

/* The AVX2 and AVX-512 dequantizers give the scalar specification's floats bit for bit, every type. */
static void test_dequant_simd(void **state) {
    (void)state;
    if (fl_isa_best() == FL_ISA_REF) skip();
    const bool avx512 = fl_isa_best() == FL_ISA_AVX512;
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++) {
        const int32_t t = all_types[ti];
        const int64_t N = 3, K = 768; /* 3 super-blocks of 256, 24 blocks of 32 */
        qmat q;
        qmat_make(&q, t, N, K);
        float *a = frand_buf(K), *b = frand_buf(K);
        for (int64_t n = 0; n < N; n++) {
            const char *row = (const char *)q.data + n * q.W.nb[1];
            fl_dequant_row(t, row, a, K);
            fl_dequant_row_avx2(t, row, b, K);
            if (memcmp(a, b, (size_t)K * 4) != 0) fail_msg("%s row %lld: AVX2 dequant differs", fl_type_name(t), (long long)n);
            if (!avx512) continue;
            fl_dequant_row_avx512(t, row, b, K);
            if (memcmp(a, b, (size_t)K * 4) != 0) fail_msg("%s row %lld: AVX-512 dequant differs", fl_type_name(t), (long long)n);
        }
        fl_free(FL_MEM_MISC, a, (size_t)K * 4);
        fl_free(FL_MEM_MISC, b, (size_t)K * 4);
        qmat_free(&q);
    }
    fl_test_mem_zero();
}

/* fl_matmul_scratch_bytes equals the FL_MEM_SCRATCH high-water mark of a call (GEMV, GEMM, f32 path). */
/* matmul's f32 dots: AVX2 and the scalar llama-order code give the AVX-512 bits (llama.cpp's
 * order) for both f32 rows and rows of f16 values, and all stay near the plain reference. */
static void test_f32_dot_orders(void **state) {
    (void)state;
    if (fl_isa_best() == FL_ISA_REF) skip();
    const bool avx512 = fl_isa_best() == FL_ISA_AVX512;
    static const int64_t ns[] = {0, 1, 7, 16, 48, 63, 64, 100, 130, 256, 2048, 5635};
    float *a = fl_alloc(FL_MEM_SCRATCH, sizeof(float) * 5635, 64), *b = fl_alloc(FL_MEM_SCRATCH, sizeof(float) * 5635, 64);
    assert_non_null(a);
    assert_non_null(b);
    for (int i = 0; i < 5635; i++) {
        a[i] = frand();
        b[i] = fl_f16_to_f32(fl_f32_to_f16(frand())); /* f16 values, as the f16 rows hold */
    }
    int differ = 0; /* lengths where llama's order and the plain one give other bits */
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int64_t n = ns[k];
        const float r = fl_mm_dot_f32_ref(a, b, n), v = fl_mm_dot_f32_avx2(a, b, n), h = fl_mm_dot_f16vals_avx2(a, b, n);
        /* the scalar code of the same order: the same bits */
        const float vr = fl_mm_dot_ggml_ref(a, b, n, false), hr = fl_mm_dot_ggml_ref(a, b, n, true);
        if (memcmp(&v, &vr, 4) || memcmp(&h, &hr, 4))
            fail_msg("n %lld: avx2 %.9g / %.9g, scalar llama order %.9g / %.9g", (long long)n, (double)v, (double)h, (double)vr, (double)hr);
        double mag = 0;
        for (int64_t i = 0; i < n; i++) mag += fabs((double)a[i] * b[i]);
        assert_true(fabs((double)v - r) <= 1e-6 * mag + 1e-30);
        assert_true(fabs((double)h - r) <= 1e-6 * mag + 1e-30);
        if (v != r) differ++;
        if (avx512) {
            const float v5 = fl_mm_dot_f32_avx512(a, b, n), h5 = fl_mm_dot_f16vals_avx512(a, b, n);
            if (memcmp(&v, &v5, 4) || memcmp(&h, &h5, 4))
                fail_msg("n %lld: avx2 %.9g / %.9g, avx512 %.9g / %.9g", (long long)n, (double)v, (double)h, (double)v5, (double)h5);
        }
    }
    assert_true(differ > 0); /* the orders are not the plain one (else this test shows nothing) */
    fl_free(FL_MEM_SCRATCH, a, sizeof(float) * 5635);
    fl_free(FL_MEM_SCRATCH, b, sizeof(float) * 5635);
}

/* y[m][r] (M x nr) against the scalar llama-order dot of row r of w and x[m], bit for bit */
static void check_wrows(const char *what, int isa, int32_t type, const float *w, const float *x, const float *y, int64_t nr,
                        int64_t M, int64_t K) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < nr; r++) {
            const float e = fl_mm_dot_ggml_ref(w + r * K, x + m * K, K, false);
            if (memcmp(&e, &y[m * nr + r], 4))
                fail_msg("%s %s %s K %lld M %lld: y[%lld][%lld] %.9g, the dot %.9g", what, fl_isa_name((fl_isa)isa), fl_type_name(type),
                         (long long)K, (long long)M, (long long)m, (long long)r, (double)y[m * nr + r], (double)e);
        }
}

/* F32 / F16 / BF16 / NF4 / FP8 rows read as they are (fl_mm_wrows_avx512: 4 rows x 6 tokens; fl_mm_wrows_avx2:
 * 2 x 3; tokens in chunks; one token: rows r and r + nr / 2 together) give each output the bits of the
 * scalar dot in llama.cpp's order (fl_mm_dot_ggml_ref, whose bits the ISAs' f32 dots have: see
 * test_f32_dot_orders) on the row dequantized by the scalar code; and fl_matmul on such a matrix the same
 * (x rounded to f16 for F16 weights). */
static void test_f32_wrows(void **state) {
    (void)state;
    if (fl_isa_best() == FL_ISA_REF) skip();
    const int32_t types[5] = {FL_TYPE_F32, FL_TYPE_F16, FL_TYPE_BF16, FL_TYPE_NF4, FL_TYPE_FP8_E4M3};
    /* one step; 7 steps; 2048: chunks of 60 (AVX-512) / 63 tokens; 4112 (and NF4's 4160, 16640): one
     * token's x more than FL_WROWS_X_L1, four rows at a time; NF4: one block, 3, 65 and 260 (two
     * groups of scales) */
    const int64_t Ks[4] = {16, 112, 2048, 4112}, Ks_nf4[4] = {64, 192, 64 * 65, 64 * 260};
    const int64_t Ms[7] = {1, 2, 3, 6, 7, 13, 131}; /* 131: three chunks at K = 2048 */
    const int64_t nr = 11; /* one token: 5 pairs and a lone row (or 2 quarters' quads and 3 rows); tokens: AVX-512 two 4-row blocks and 3 */
    for (int isa = FL_ISA_AVX2; isa <= (int)fl_isa_best(); isa++) {
        fl_isa_set((fl_isa)isa);
        void (*wrows)(int32_t, const void *, size_t, int64_t, const float *, int64_t, int64_t, float *, int64_t) =
            isa == FL_ISA_AVX512 ? fl_mm_wrows_avx512 : fl_mm_wrows_avx2;
        for (int ti = 0; ti < 5; ti++)
            for (int ki = 0; ki < 4; ki++) {
                const int64_t K = types[ti] == FL_TYPE_NF4 ? Ks_nf4[ki] : Ks[ki], MX = 131;
                qmat q;
                qmat_make(&q, types[ti], nr, K);
                float *w = frand_buf(nr * K), *x = frand_buf(MX * K), *y = frand_buf(MX * nr), *xr = frand_buf(MX * K);
                for (int64_t r = 0; r < nr; r++) fl_dequant_row(types[ti], (const char *)q.data + r * q.W.nb[1], w + r * K, K);
                for (int mi = 0; mi < 7; mi++) {
                    const int64_t M = Ms[mi];
                    memset(y, 0xFF, (size_t)(MX * nr) * 4);
                    wrows(types[ti], q.data, q.W.nb[1], nr, x, M, K, y, nr);
                    check_wrows("wrows", isa, types[ti], w, x, y, nr, M, K);
                    /* through fl_matmul (2 threads where there are 2: each takes its rows) */
                    fl_matmul(&q.W, x, y, M);
                    for (int64_t i = 0; i < M * K; i++) xr[i] = types[ti] == FL_TYPE_F16 ? fl_f16_to_f32(fl_f32_to_f16(x[i])) : x[i];
                    check_wrows("fl_matmul", isa, types[ti], w, xr, y, nr, M, K);
                }
                fl_free(FL_MEM_MISC, w, (size_t)(nr * K) * 4);
                fl_free(FL_MEM_MISC, x, (size_t)(MX * K) * 4);
                fl_free(FL_MEM_MISC, xr, (size_t)(MX * K) * 4);
                fl_free(FL_MEM_MISC, y, (size_t)(MX * nr) * 4);
                qmat_free(&q);
            }
    }
    fl_isa_set(fl_isa_best());
    fl_test_mem_zero();
}

static void test_scratch_bytes(void **state) {
    (void)state;
    const int32_t types[5] = {FL_TYPE_Q8_0, FL_TYPE_Q4_0, FL_TYPE_Q4_K, FL_TYPE_Q5_0, FL_TYPE_Q6_K};
    const int64_t Ms[7] = {1, 2, 3, 4, 5, 17, 70}; /* 2-4: the AVX2 few-token GEMV; 70: the AMX-BF16 prefill where the CPU has it */
    for (int ti = 0; ti < 10; ti++) {
        fl_matmul_set_llama_order(ti >= 5); /* the llama.cpp-order path (Q5_0 goes int8 there) */
        const int64_t N = 40, K = 256;
        qmat q;
        qmat_make(&q, types[ti % 5], N, K);
        float *x = frand_buf(70 * K), *y = frand_buf(70 * N);
        for (int nth = 1; nth <= 2; nth++) {
            fl_threads_set(nth);
            for (int mi = 0; mi < 7; mi++) {
                const size_t before = fl_mem_current(FL_MEM_SCRATCH);
                fl_mem_reset_peaks();
                fl_matmul(&q.W, x, y, Ms[mi]);
                const size_t used = fl_mem_peak(FL_MEM_SCRATCH) - before, want = fl_matmul_scratch_bytes(&q.W, Ms[mi], nth);
                if (used != want)
                    fail_msg("%s M=%lld nth=%d: scratch %zu, fl_matmul_scratch_bytes %zu", fl_type_name(types[ti % 5]),
                             (long long)Ms[mi], nth, used, want);
                assert_true(want > 0);
            }
        }
        fl_threads_set(0);
        fl_free(FL_MEM_MISC, x, (size_t)(70 * K) * 4);
        fl_free(FL_MEM_MISC, y, (size_t)(70 * N) * 4);
        qmat_free(&q);
    }
    fl_matmul_set_llama_order(false);
    fl_test_mem_zero();
}

/* fl_matmul_n over three copies of W gives fl_matmul's bits for each, at each of the nm token
 * counts Ms (x: that many rows of W->ne[0]) on 1-3 threads: where the threads take shares of
 * 32-row units (AVX-512, the repacked groups), those run across the matrices' ends. */
static void check_matmul_n_same(const fl_tensor *W, const float *x, const int64_t *Ms, int nm) {
    const int64_t N = W->ne[1];
    for (int nth = 1; nth <= 3; nth++)
        for (int mi = 0; mi < nm; mi++) {
            const int64_t M = Ms[mi];
            fl_threads_set(nth);
            const fl_tensor *W3[3] = {W, W, W};
            float *ref = frand_buf(M * N), *y3[3] = {frand_buf(M * N), frand_buf(M * N), frand_buf(M * N)};
            fl_matmul(W, x, ref, M);
            fl_matmul_n(3, W3, y3, x, M);
            for (int i = 0; i < 3; i++) {
                if (memcmp(ref, y3[i], sizeof(float) * (size_t)(M * N)))
                    fail_msg("%s fl_matmul_n M=%lld nth=%d: matrix %d not fl_matmul's bits", fl_type_name(W->type), (long long)M, nth, i);
                fl_free(FL_MEM_MISC, y3[i], (size_t)(M * N) * 4);
            }
            fl_free(FL_MEM_MISC, ref, (size_t)(M * N) * 4);
        }
    fl_threads_set(0);
}

/* Q4_0_R8 / Q8_0_R8 (8 interleaved rows): the repack is a permutation (rows come back byte for
 * byte, the f32 rows are the base type's), the reference integer dot takes the same bits as on
 * the base rows, the AVX2 GEMV and its panel pack against them (tails of 1-5 tokens, codes and
 * activations at their limits), the AVX-512 tile against the packed panels and the reference, and fl_matmul on both layouts for every ISA the CPU has, with and
 * without 8-bit activations, and its scratch as fl_matmul_scratch_bytes says. */
static void check_r8(int32_t base) {
    const int32_t rtype = fl_r8_of(base);
    const bool q8 = base == FL_TYPE_Q8_0;
    const int64_t N = 40, K = 160, nb = K / 32;
    qmat q;
    qmat_make(&q, base, N, K);
    const size_t ldw = q.W.nb[1];
    /* rows 16..23: codes at the extremes (Q4_0 0 and 15, Q8_0 -127 and 127, alternating by
     * block), scale 1 */
    for (int64_t r = 16; r < 24; r++)
        for (int64_t b = 0; b < nb; b++) {
            unsigned char *blk = (unsigned char *)q.data + r * ldw + b * (q8 ? 34 : 18);
            const uint16_t one = fl_f32_to_f16(1.0f);
            memcpy(blk, &one, 2);
            memset(blk + 2, (b + r) % 2 ? (q8 ? 0x7F : 0xFF) : (q8 ? 0x81 : 0x00), q8 ? 32 : 16);
        }
    char *r8 = fl_alloc(FL_MEM_MISC, q.bytes, 64), *row = fl_alloc(FL_MEM_MISC, ldw, 64);
    memcpy(r8, q.data, q.bytes);
    repack_r8(rtype, r8, ldw, N, K);
    assert_memory_not_equal(r8, q.data, 8 * ldw);
    float *fa = frand_buf(K), *fb = frand_buf(K);
    for (int64_t r = 0; r < N; r++) {
        fl_r8_unpack_row(rtype, r8 + (r / 8) * 8 * ldw, (int)(r % 8), K, row);
        assert_memory_equal(row, (char *)q.data + r * ldw, ldw);
        fl_r8_dequant_row(rtype, r8, ldw, r, fa, K);
        fl_dequant_row(base, (char *)q.data + r * ldw, fb, K);
        assert_memory_equal(fa, fb, (size_t)K * 4);
    }
    /* activations: token 0 at +-127 (the extreme rows' int16 bounds), the rest random */
    const int64_t M = 5;
    float *x = frand_buf(M * K);
    for (int64_t k = 0; k < K; k++) x[k] = k % 3 ? -1.0f : 1.0f;
    fl_act_q8 a;
    assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
    for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
    float *y0 = frand_buf(M * N), *y1 = frand_buf(M * N);
    fl_gemm_q8_ref(base, q.data, ldw, (int)N, &a, 0, (int)M, y0, N);
    fl_gemm_q8_ref(rtype, r8, ldw, (int)N, &a, 0, (int)M, y1, N);
    assert_memory_equal(y0, y1, (size_t)(M * N) * 4);
    for (int64_t r = 16; r < 24; r++) { /* exact: integer sums times d_x = 1 / 127 per block */
        double want = 0;
        for (int64_t k = 0; k < K; k++)
            want += (double)(((k / 32) + r) % 2 ? (q8 ? 127 : 7) : (q8 ? -127 : -8)) * (k % 3 ? -127 : 127);
        assert_true(fabs(y0[r] * 127.0 - want) < 1e-3 * fabs(want) + 1e-3);
    }
    if (fl_cpu()->avx2 && fl_cpu()->fma && fl_cpu()->f16c) {
        for (int nt = 1; nt <= (int)M; nt++) {
            fl_gemm_q8_avx2(rtype, r8, ldw, (int)N, &a, 0, nt, y1, N);
            for (int64_t i = 0; i < nt * N; i++)
                if (fabsf(y1[i] - y0[i]) > 1e-5f * (fabsf(y0[i]) + 1.0f)) fail_msg("%s GEMV nt=%d: [%lld] %g vs %g", fl_type_name(rtype), nt, (long long)i, y1[i], y0[i]);
            for (int64_t r = 16; r < 24; r++) assert_true(y1[r] == y0[r]); /* integer-valued: exact */
        }
        const size_t pb = fl_panel_bytes_for(base, K);
        char *p0 = fl_alloc(FL_MEM_MISC, pb, 64), *p1 = fl_alloc(FL_MEM_MISC, pb, 64);
        for (int nr = 8; nr <= 16; nr += 8) {
            memset(p0, 0x55, pb);
            memset(p1, 0xAA, pb);
            fl_panel_pack_ref(base, (char *)q.data + 16 * ldw, ldw, nr, K, p0);
            fl_panel_pack_avx2(rtype, r8 + 16 * ldw, ldw, nr, K, p1);
            assert_memory_equal(p0, p1, pb);
            if (q8 || nr == 16) /* the tile straight on the groups (Q4_0: whole panels): the packed panel's bits */
                for (int nt = 1; nt <= (int)M; nt++) {
                    float ya[5 * 16], yb[5 * 16];
                    fl_panel_gemm_avx2(base, p0, nr, &a, 0, nt, ya, 16);
                    fl_r8_gemm_avx2_pf(rtype, r8 + 16 * ldw, ldw, nr, &a, 0, nt, yb, 16, NULL, 0);
                    for (int t = 0; t < nt; t++) assert_memory_equal(ya + t * 16, yb + t * 16, sizeof(float) * (size_t)nr);
                }
        }
        fl_free(FL_MEM_MISC, p0, pb);
        fl_free(FL_MEM_MISC, p1, pb);
    }
    if (fl_isa_best() == FL_ISA_AVX512) { /* the AVX-512 tile on the groups: the packed panel's bits */
        const size_t pb = fl_panel_bytes_for(base, K);
        char *p0 = fl_alloc(FL_MEM_MISC, pb, 64);
        fl_act_q8 a5;
        assert_int_equal(fl_act_q8_alloc(&a5, M, K), FL_OK);
        for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row_avx512(&a5, m, x + m * K);
        for (int nr = 8; nr <= 16; nr += 8) {
            fl_panel_pack_ref(base, (char *)q.data + 16 * ldw, ldw, nr, K, p0);
            for (int nt = 1; nt <= (int)M; nt++) {
                float ya[5 * 16], yb[5 * 16];
                fl_panel_gemm_avx512(base, p0, nr, &a5, 0, nt, ya, 16);
                fl_r8_gemm_avx512(rtype, r8 + 16 * ldw, ldw, nr, &a5, 0, nt, yb, 16);
                for (int t = 0; t < nt; t++)
                    if (memcmp(ya + t * 16, yb + t * 16, sizeof(float) * (size_t)nr))
                        fail_msg("%s AVX-512 tile nr=%d nt=%d token %d: not the panel's bits", fl_type_name(rtype), nr, nt, t);
            }
        }
        /* all 40 rows (2 pairs of groups and a lone one) against the reference, 1-5 tokens */
        for (int nt = 1; nt <= (int)M; nt++) {
            fl_gemm_q8_avx512(rtype, r8, ldw, (int)N, &a5, 0, nt, y1, N);
            for (int64_t i = 0; i < nt * N; i++)
                if (fabsf(y1[i] - y0[i]) > 1e-5f * (fabsf(y0[i]) + 1.0f)) fail_msg("%s AVX-512 nt=%d: [%lld] %g vs %g", fl_type_name(rtype), nt, (long long)i, y1[i], y0[i]);
            for (int64_t r = 16; r < 24; r++) assert_true(y1[r] == y0[r]); /* integer-valued: exact */
            /* the 32-row tiles of 3 or more tokens (four groups; at 24 rows the third twice, 8
             * rows stored): the bits of the 16-row tiles, and no row past nr written */
            for (int nr = 24; nr <= (int)N; nr += 8) {
                float *yp = fpattern_buf(M * N), *yq = fpattern_buf(M * N);
                memcpy(yq, yp, sizeof(float) * (size_t)(M * N));
                for (int r = 0; r < nr; r += 16)
                    fl_r8_gemm_avx512(rtype, r8 + (size_t)r * ldw, ldw, nr - r < 16 ? nr - r : 16, &a5, 0, nt, yp + r, N);
                fl_r8_gemm_avx512(rtype, r8, ldw, nr, &a5, 0, nt, yq, N);
                if (memcmp(yp, yq, sizeof(float) * (size_t)(M * N)))
                    fail_msg("%s AVX-512 32-row tile nr=%d nt=%d: not the 16-row tiles' bits", fl_type_name(rtype), nr, nt);
                fl_free(FL_MEM_MISC, yp, (size_t)(M * N) * 4);
                fl_free(FL_MEM_MISC, yq, (size_t)(M * N) * 4);
            }
        }
        /* 9-16 tokens per pass from the 16-token records (fl_act16_pack_row): the packed panel's
         * bits, and all 40 rows against the reference */
        const int64_t M16 = 16;
        fl_act_q8 a16;
        assert_int_equal(fl_act_q8_alloc(&a16, M16, K), FL_OK);
        float *x16 = frand_buf(M16 * K);
        memcpy(x16, x, sizeof(float) * (size_t)K); /* token 0 at the extremes */
        for (int64_t m = 0; m < M16; m++) fl_act_q8_quantize_row_avx512(&a16, m, x16 + m * K);
        const size_t rb = fl_act16_bytes(M16, K);
        assert_true(rb == fl_act16_bytes(1, K) && rb >= (size_t)(M16 * K)); /* one record group */
        char *rec = fl_alloc(FL_MEM_MISC, rb, 64);
        for (int64_t m = M16 - 1; m >= 0; m--) fl_act16_pack_row(&a16, m, rec);
        float *yr = frand_buf(M16 * N), *yw = frand_buf(M16 * N);
        fl_gemm_q8_ref(rtype, r8, ldw, (int)N, &a16, 0, (int)M16, yr, N);
        for (int nt = 9; nt <= (int)M16; nt++) {
            for (int nr = 8; nr <= 16; nr += 8) {
                float ya[16 * 16], yb[16 * 16];
                fl_panel_pack_ref(base, (char *)q.data + 16 * ldw, ldw, nr, K, p0);
                fl_panel_gemm_avx512(base, p0, nr, &a16, 0, nt, ya, 16);
                fl_r8_gemm16_avx512(rtype, r8 + 16 * ldw, ldw, nr, rec, nb, nt, yb, 16, true);
                for (int t = 0; t < nt; t++)
                    if (memcmp(ya + t * 16, yb + t * 16, sizeof(float) * (size_t)nr))
                        fail_msg("%s AVX-512 16-token tile nr=%d nt=%d token %d: not the panel's bits", fl_type_name(rtype), nr, nt, t);
            }
            /* the 32-row tiles (four groups; at 24 rows the third twice, 8 rows stored): the bits
             * of the 16-row tiles, and no row past nr written */
            for (int nr = 24; nr <= (int)N; nr += 8) {
                float *yp = fpattern_buf(M16 * N), *yq = fpattern_buf(M16 * N);
                memcpy(yq, yp, sizeof(float) * (size_t)(M16 * N));
                for (int r = 0; r < nr; r += 16)
                    fl_r8_gemm16_avx512(rtype, r8 + (size_t)r * ldw, ldw, nr - r < 16 ? nr - r : 16, rec, nb, nt, yp + r, N, true);
                fl_r8_gemm16_avx512(rtype, r8, ldw, nr, rec, nb, nt, yq, N, nr % 16 == 0);
                if (memcmp(yp, yq, sizeof(float) * (size_t)(M16 * N)))
                    fail_msg("%s AVX-512 32-row tile nr=%d nt=%d: not the 16-row tiles' bits", fl_type_name(rtype), nr, nt);
                fl_free(FL_MEM_MISC, yp, (size_t)(M16 * N) * 4);
                fl_free(FL_MEM_MISC, yq, (size_t)(M16 * N) * 4);
            }
            fl_r8_gemm16_avx512(rtype, r8, ldw, (int)N, rec, nb, nt, yw, N, true);
            for (int64_t i = 0; i < nt * N; i++)
                if (fabsf(yw[i] - yr[i]) > 1e-5f * (fabsf(yr[i]) + 1.0f)) fail_msg("%s AVX-512 16-token nt=%d: [%lld] %g vs %g", fl_type_name(rtype), nt, (long long)i, yw[i], yr[i]);
            for (int64_t r = 16; r < 24; r++) assert_true(yw[r] == yr[r]); /* integer-valued: exact */
            if (r8_amx_ok()) { /* the AMX-INT8 tiles on the groups: the VNNI tile's bits, all 40 rows */
                float *yx = frand_buf(M16 * N);
                fl_amx_r8_begin();
                fl_amx_r8_gemm16(rtype, r8, ldw, (int)N, rec, nb, nt, yx, N);
                fl_amx_end();
                for (int t = 0; t < nt; t++)
                    if (memcmp(yx + t * N, yw + t * N, sizeof(float) * (size_t)N))
                        fail_msg("%s AMX-INT8 16-token tile nt=%d token %d: not the VNNI tile's bits", fl_type_name(rtype), nt, t);
                fl_free(FL_MEM_MISC, yx, (size_t)(M16 * N) * 4);
            }
        }
        fl_free(FL_MEM_MISC, rec, rb);
        fl_act_q8_free(&a16);
        fl_free(FL_MEM_MISC, x16, (size_t)(M16 * K) * 4);
        fl_free(FL_MEM_MISC, yr, (size_t)(M16 * N) * 4);
        fl_free(FL_MEM_MISC, yw, (size_t)(M16 * N) * 4);
        fl_act_q8_free(&a5);
        fl_free(FL_MEM_MISC, p0, pb);
    }
    const int64_t ne[2] = {K, N};
    fl_tensor W8;
    assert_true(fl_tensor_init(&W8, rtype, 2, ne, r8) != 0);
    /* (AVX-512: 16-token passes for 12, 16 + 1, 16 + 16 + 8; 72: the AMX-BF16 tiles where usable,
     * on the groups, the last panel one group and zeros) */
    const int64_t Ms[9] = {1, 2, 3, 4, 5, 12, 17, 40, 72};
    float *xb = frand_buf(72 * K), *ya = frand_buf(72 * N), *yb = frand_buf(72 * N);
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++)
        for (int f32 = 0; f32 < 2; f32++)
            for (int nth = 1; nth <= 2; nth++) {
                fl_isa_set((fl_isa)isa);
                fl_matmul_set_f32_act(f32);
                fl_threads_set(nth);
                for (int mi = 0; mi < 9; mi++) {
                    fl_matmul(&q.W, xb, ya, Ms[mi]);
                    const size_t before = fl_mem_current(FL_MEM_SCRATCH);
                    fl_mem_reset_peaks();
                    fl_matmul(&W8, xb, yb, Ms[mi]);
                    const size_t used = fl_mem_peak(FL_MEM_SCRATCH) - before, want = fl_matmul_scratch_bytes(&W8, Ms[mi], nth);
                    if (used != want) fail_msg("%s %s M=%lld: scratch %zu, planned %zu", fl_type_name(rtype), fl_isa_name((fl_isa)isa), (long long)Ms[mi], used, want);
                    const double e = fl_test_nmse(ya, yb, Ms[mi] * N);
                    if (!(e <= (f32 ? 1e-12 : 1e-9)))
                        fail_msg("%s %s f32=%d M=%lld: NMSE %.3g against the base type", fl_type_name(rtype), fl_isa_name((fl_isa)isa), f32, (long long)Ms[mi], e);
                    if (Ms[mi] == 72 && isa == FL_ISA_AVX512 && !f32 && fl_amx_bf16_usable()) /* the same bf16 panels */
                        assert_memory_equal(ya, yb, sizeof(float) * (size_t)(72 * N));
                    if (Ms[mi] > 8 && Ms[mi] < 64 && isa == FL_ISA_AVX512 && !f32 && r8_amx_ok()) { /* AMX-INT8 = VNNI, bit for bit */
                        assert_string_equal(fl_matmul_kernel_name(rtype, Ms[mi]), "r8-amx");
                        fl_matmul_set_amx(false);
                        fl_matmul(&W8, xb, ya, Ms[mi]);
                        fl_matmul_set_amx(true);
                        assert_memory_equal(ya, yb, sizeof(float) * (size_t)(Ms[mi] * N));
                    }
                }
            }
    fl_threads_set(0);
    fl_matmul_set_f32_act(false);
    fl_isa_set(fl_isa_best());
    /* steps of 2-16 tokens on AVX-512 (2-8 from the rows, 9-16 from the records) */
    const int64_t M3s[4] = {2, 5, 9, 16};
    check_matmul_n_same(&W8, xb, M3s, 4);
    if (fl_isa_best() == FL_ISA_AVX512 && fl_amx_bf16_usable()) { /* K past one chunk of the bf16 panels (1024 + 1024 + 32) */
        const int64_t K2 = 2080, N2 = 24, M2 = 64;
        qmat q2;
        qmat_make(&q2, base, N2, K2);
        const size_t ld2 = q2.W.nb[1];
        char *g2 = fl_alloc(FL_MEM_MISC, q2.bytes, 64);
        memcpy(g2, q2.data, q2.bytes);
        repack_r8(rtype, g2, ld2, N2, K2);
        const int64_t ne2[2] = {K2, N2};
        fl_tensor W2;
        assert_true(fl_tensor_init(&W2, rtype, 2, ne2, g2) != 0);
        float *x2 = frand_buf(M2 * K2), *y2a = frand_buf(M2 * N2), *y2b = frand_buf(M2 * N2);
        fl_matmul(&q2.W, x2, y2a, M2);
        fl_matmul(&W2, x2, y2b, M2);
        assert_memory_equal(y2a, y2b, sizeof(float) * (size_t)(M2 * N2));
        fl_free(FL_MEM_MISC, x2, (size_t)(M2 * K2) * 4);
        fl_free(FL_MEM_MISC, y2a, (size_t)(M2 * N2) * 4);
        fl_free(FL_MEM_MISC, y2b, (size_t)(M2 * N2) * 4);
        fl_free(FL_MEM_MISC, g2, q2.bytes);
        qmat_free(&q2);
    }
    fl_act_q8_free(&a);
    fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
    fl_free(FL_MEM_MISC, y0, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, y1, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, xb, (size_t)(72 * K) * 4);
    fl_free(FL_MEM_MISC, ya, (size_t)(72 * N) * 4);
    fl_free(FL_MEM_MISC, yb, (size_t)(72 * N) * 4);
    fl_free(FL_MEM_MISC, fa, (size_t)K * 4);
    fl_free(FL_MEM_MISC, fb, (size_t)K * 4);
    fl_free(FL_MEM_MISC, r8, q.bytes);
    fl_free(FL_MEM_MISC, row, ldw);
    qmat_free(&q);
}

/* An allocation that fails inside fl_matmul (the activations, the 16-token records, the panel
 * scratch: each path has a fallback) still gives the product: 16 tokens, where the AVX-512
 * records had stood in for the rows, after a call on other activations that left its rows
 * behind in the allocator's memory. */
static void test_alloc_fallbacks(void **state) {
    (void)state;
    const int32_t types[3] = {FL_TYPE_Q4_K, FL_TYPE_Q8_0, FL_TYPE_Q6_K};
    const int64_t N = 48, K = 512, M = 16;
    for (int ti = 0; ti < 3; ti++) {
        qmat q;
        qmat_make(&q, types[ti], N, K);
        float *x = frand_buf(M * K), *x2 = frand_buf(M * K), *ref = frand_buf(M * N), *got = frand_buf(M * N);
        fl_matmul_ref(&q.W, x, ref, M);
        for (long n = 1; n <= 4; n++) {
            fl_matmul(&q.W, x2, got, M);
            fl_mem_fail_after(n);
            fl_matmul(&q.W, x, got, M);
            fl_mem_fail_after(-1);
            fl_clear_error();
            const double e = fl_test_nmse(ref, got, M * N);
            if (!(e <= 1e-4)) fail_msg("%s: allocation %ld failed: NMSE %.3g", fl_type_name(types[ti]), n, e);
        }
        fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
        fl_free(FL_MEM_MISC, x2, (size_t)(M * K) * 4);
        fl_free(FL_MEM_MISC, ref, (size_t)(M * N) * 4);
        fl_free(FL_MEM_MISC, got, (size_t)(M * N) * 4);
        qmat_free(&q);
    }
    fl_test_mem_zero();
}

static void test_r8(void **state) {
    (void)state;
    check_r8(FL_TYPE_Q4_0);
    check_r8(FL_TYPE_Q8_0);
    fl_test_mem_zero();
}

/* Q4_K_R16 / Q5_K_R16 / Q6_K_R16 / Q3_K_R16 / Q2_K_R16 (16 interleaved rows): the repack is a permutation (rows come back byte
 * for byte, the f32 rows are the base type's), the reference integer dot takes the base type's
 * bits, the AVX-512 kernels (GEMV and tiles of 2-8 tokens, passes over more) against the
 * reference with each token's bits the same in every step, and fl_matmul on the groups against
 * the reference for every ISA the CPU has, its scratch as fl_matmul_scratch_bytes says.  Rows
 * 16..31 carry every scale (and Q4_K / Q2_K min) pattern (random scale bytes) and rows 24..31 codes at
 * their ends (0 / 15, 0 / 63, 0 / 7, 0 / 3), so the planes' and the codes' unpacking is seen bit by bit. */
static void check_k16(int32_t base) {
    const bool q6 = base == FL_TYPE_Q6_K, q5 = base == FL_TYPE_Q5_K, q3 = base == FL_TYPE_Q3_K, q2 = base == FL_TYPE_Q2_K;
    const bool b32 = base == FL_TYPE_Q4_1 || base == FL_TYPE_Q5_0 || base == FL_TYPE_Q5_1 || base == FL_TYPE_IQ4_NL;
    const int32_t rtype = q6 ? FL_TYPE_Q6_K_R16 : q5 ? FL_TYPE_Q5_K_R16 : q3 ? FL_TYPE_Q3_K_R16 : q2 ? FL_TYPE_Q2_K_R16
                          : base == FL_TYPE_Q4_1 ? FL_TYPE_Q4_1_R16 : base == FL_TYPE_Q5_0 ? FL_TYPE_Q5_0_R16
                          : base == FL_TYPE_Q5_1 ? FL_TYPE_Q5_1_R16 : base == FL_TYPE_IQ4_NL ? FL_TYPE_IQ4_NL_R16 : FL_TYPE_Q4_K_R16;
    assert_int_equal(fl_k16_base(rtype), base);
    assert_int_equal(fl_b16_type(rtype), b32);
    const int64_t N = 48, K = 768, nsb = K / 256;
    qmat q;
    qmat_make(&q, base, N, K);
    const size_t ldw = q.W.nb[1];
    if (b32) /* rows 24..31: codes (and fifth bits) at their ends, block by block */
        for (int64_t r = 24; r < 32; r++)
            for (int64_t b = 0; b < K / 32; b++) {
                const size_t bs = fl_type_row_size(base, 32), qs = base == FL_TYPE_Q4_1 ? 4 : base == FL_TYPE_Q5_0 ? 6 : base == FL_TYPE_Q5_1 ? 8 : 2;
                unsigned char *blk = (unsigned char *)q.data + r * ldw + b * bs;
                memset(blk + qs, (r + b) % 2 ? 0xFF : 0x00, 16);
                if (base == FL_TYPE_Q5_0 || base == FL_TYPE_Q5_1) memset(blk + qs - 4, (r + b) % 2 ? 0xFF : 0x00, 4);
            }
    for (int64_t r = 16; r < 32 && !b32; r++)
        for (int64_t b = 0; b < nsb; b++) {
            if (q6) {
                fl_block_q6_K *blk = (fl_block_q6_K *)((char *)q.data + r * ldw) + b;
                for (int k = 0; k < 16; k++) blk->scales[k] = (int8_t)(frand() * 127);
                if (r >= 24) {
                    memset(blk->ql, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->ql);
                    memset(blk->qh, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->qh);
                }
                continue;
            }
            if (q3) {
                fl_block_q3_K *blk = (fl_block_q3_K *)((char *)q.data + r * ldw) + b;
                for (int k = 0; k < 12; k++) blk->scales[k] = (uint8_t)(frand() * 128 + 128);
                if (r >= 24) {
                    memset(blk->qs, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->qs);
                    memset(blk->hmask, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->hmask);
                }
                continue;
            }
            if (q2) {
                fl_block_q2_K *blk = (fl_block_q2_K *)((char *)q.data + r * ldw) + b;
                for (int k = 0; k < 16; k++) blk->scales[k] = (uint8_t)(frand() * 128 + 128);
                if (r >= 24) memset(blk->qs, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->qs);
                continue;
            }
            if (q5) {
                fl_block_q5_K *blk = (fl_block_q5_K *)((char *)q.data + r * ldw) + b;
                for (int k = 0; k < 12; k++) blk->scales[k] = (uint8_t)(frand() * 128 + 128);
                if (r >= 24) {
                    memset(blk->qs, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->qs);
                    memset(blk->qh, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->qh);
                }
                continue;
            }
            fl_block_q4_K *blk = (fl_block_q4_K *)((char *)q.data + r * ldw) + b;
            for (int k = 0; k < 12; k++) blk->scales[k] = (uint8_t)(frand() * 128 + 128);
            if (r >= 24) memset(blk->qs, (r + b) % 2 ? 0xFF : 0x00, sizeof blk->qs);
        }
    char *g = fl_alloc(FL_MEM_MISC, q.bytes, 64), *row = fl_alloc(FL_MEM_MISC, ldw, 64), *tmp = fl_alloc(FL_MEM_MISC, 16 * ldw, 64);
    memcpy(g, q.data, q.bytes);
    assert_int_equal(fl_r8_group_rows(rtype), 16);
    assert_int_equal(fl_r8_group_rows(FL_TYPE_Q4_K), 0);
    for (int64_t r = 0; r < N; r += 16) fl_r8_repack(rtype, g + r * ldw, ldw, K, tmp);
    assert_memory_not_equal(g, q.data, 16 * ldw);
    float *fa = frand_buf(K), *fb = frand_buf(K);
    for (int64_t r = 0; r < N; r++) {
        fl_r8_unpack_row(rtype, g + (r / 16) * 16 * ldw, (int)(r % 16), K, row);
        assert_memory_equal(row, (char *)q.data + r * ldw, ldw);
        fl_r8_dequant_row(rtype, g, ldw, r, fa, K);
        fl_dequant_row(base, (char *)q.data + r * ldw, fb, K);
        assert_memory_equal(fa, fb, (size_t)K * 4);
    }
    const int64_t M = 40;
    float *x = frand_buf(M * K);
    for (int64_t k = 0; k < K; k++) x[k] = k % 3 ? -1.0f : 1.0f; /* token 0: codes at +-127 */
    fl_act_q8 a;
    assert_int_equal(fl_act_q8_alloc(&a, M, K), FL_OK);
    for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row(&a, m, x + m * K);
    float *y0 = frand_buf(M * N), *y1 = frand_buf(M * N);
    fl_gemm_q8_ref(base, q.data, ldw, (int)N, &a, 0, (int)M, y0, N);
    fl_gemm_q8_ref(rtype, g, ldw, (int)N, &a, 0, (int)M, y1, N);
    assert_memory_equal(y0, y1, (size_t)(M * N) * 4);
    if (fl_isa_best() == FL_ISA_AVX512) {
        fl_act_q8 a5;
        assert_int_equal(fl_act_q8_alloc(&a5, M, K), FL_OK);
        for (int64_t m = 0; m < M; m++) fl_act_q8_quantize_row_avx512(&a5, m, x + m * K);
        float *yall = frand_buf(M * N);
        fl_k16_gemm_avx512(rtype, g, ldw, (int)N, &a5, 0, (int)M, yall, N); /* passes of 8 */
        for (int64_t i = 0; i < M * N; i++) {
            double mag = 0; /* the sum of |w x| bounds what f32 order can move */
            const int64_t m = i / N, r = i % N;
            fl_dequant_row(base, (char *)q.data + r * ldw, fb, K);
            for (int64_t k = 0; k < K; k++) mag += fabs((double)fb[k] * a5.d[m * a5.nb + k / 32] * a5.qs[m * K + k]);
            if (!(fabs((double)yall[i] - y0[i]) <= 1e-5 * mag + 1e-7))
                fail_msg("%s AVX-512 token %lld row %lld: %.9g vs reference %.9g (|wx| %.3g)", fl_type_name(rtype), (long long)m, (long long)r, yall[i], y0[i], mag);
        }
        for (int nt = 1; nt <= 10; nt++) /* each token's bits in every step: alone, and from every start */
            for (int64_t m0 = 0; m0 + nt <= M; m0 += 3) {
                float *yp = fpattern_buf(M * N), *yq = fpattern_buf(M * N);
                fl_k16_gemm_avx512(rtype, g + 16 * ldw, ldw, 32, &a5, m0, nt, yp + 16, N);
                for (int t = 0; t < nt; t++)
                    if (memcmp(yp + t * N + 16, yall + (m0 + t) * N + 16, 32 * sizeof(float)))
                        fail_msg("%s AVX-512 nt=%d m0=%lld token %d: not the bits of the 40-token step", fl_type_name(rtype), nt, (long long)m0, t);
                for (int64_t i = 0; i < M * N; i++) /* nothing outside rows 16..47 of tokens < nt written */
                    if ((i % N < 16 || i / N >= nt) && yp[i] != yq[i]) fail_msg("%s nt=%d: y[%lld] written", fl_type_name(rtype), nt, (long long)i);
                fl_free(FL_MEM_MISC, yp, (size_t)(M * N) * 4);
                fl_free(FL_MEM_MISC, yq, (size_t)(M * N) * 4);
            }
        /* the base type's panel packed from a group (Q4_K: AVX-512's, Q5_K / Q6_K: AVX2's): the bytes
         * packed from its 16 rows (the blocks of 32 have no panels: their tiles take every step) */
        const size_t pb = fl_panel_bytes_for(base, K);
        void (*pack)(int32_t, const void *, size_t, int, int64_t, void *) = base != FL_TYPE_Q4_K ? fl_panel_pack_avx2 : fl_panel_pack_avx512;
        for (int64_t r = 0; r < N && !b32; r += 16) {
            char *p0 = fl_alloc(FL_MEM_MISC, pb, 64), *p1 = fl_alloc(FL_MEM_MISC, pb, 64);
            assert_int_equal(fl_panel_bytes_for(rtype, K), pb);
            memset(p0, 0x55, pb);
            memset(p1, 0xAA, pb);
            pack(base, (char *)q.data + r * ldw, ldw, 16, K, p0);
            pack(rtype, g + r * ldw, ldw, 16, K, p1);
            if (memcmp(p0, p1, pb)) fail_msg("%s panel of rows %lld..: not the bytes packed from the rows", fl_type_name(rtype), (long long)r);
            fl_free(FL_MEM_MISC, p0, pb);
            fl_free(FL_MEM_MISC, p1, pb);
        }
        fl_free(FL_MEM_MISC, yall, (size_t)(M * N) * 4);
        fl_act_q8_free(&a5);
    }
    /* fl_matmul on the groups, every ISA the CPU has (AVX2 / the reference: f32 rows), int8 and f32 activations */
    qmat rq = q;
    rq.W.type = rtype;
    rq.W.data = g;
    float *ref = frand_buf(M * N), *got = frand_buf(M * N);
    const int64_t Ms[8] = {1, 2, 5, 8, 9, 17, 33, 40}; /* 33, 40: the Q4_K panels packed from the groups */
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++) {
        fl_isa_set((fl_isa)isa);
        for (int nth = 1; nth <= 2; nth++) {
            fl_threads_set(nth);
            for (int mi = 0; mi < 8; mi++) {
                fl_matmul_ref(&q.W, x, ref, Ms[mi]);
                for (int f32 = 0; f32 < 2; f32++) {
                    fl_matmul_set_f32_act(f32);
                    const size_t before = fl_mem_current(FL_MEM_SCRATCH);
                    fl_mem_reset_peaks();
                    fl_matmul(&rq.W, x, got, Ms[mi]);
                    const size_t used = fl_mem_peak(FL_MEM_SCRATCH) - before, want = fl_matmul_scratch_bytes(&rq.W, Ms[mi], nth);
                    if (used != want) fail_msg("%s isa %d M=%lld nth=%d: scratch %zu, planned %zu", fl_type_name(rtype), isa, (long long)Ms[mi], nth, used, want);
                    const double e = fl_test_nmse(ref, got, Ms[mi] * N);
                    if (!(e <= (f32 ? 1e-10 : 1e-4)))
                        fail_msg("%s isa %d M=%lld nth=%d f32 act %d: NMSE %.3g", fl_type_name(rtype), isa, (long long)Ms[mi], nth, f32, e);
                }
                fl_matmul_set_f32_act(false);
            }
        }
    }
    fl_isa_set(fl_isa_best());
    /* steps of 2-8 tokens on AVX-512 */
    const int64_t M3s[3] = {2, 5, 8};
    check_matmul_n_same(&rq.W, x, M3s, 3);
    fl_threads_set(0);
    /* the loader's choice: AVX-512 without AMX, whole groups, not with f32 activations */
    const bool k16 = fl_isa_get() == FL_ISA_AVX512 && !fl_amx_usable();
    assert_int_equal(fl_r8_load_type(base, 48, true), k16 ? rtype : base);
    assert_int_equal(fl_r8_load_type(base, 40, true), base);
    assert_int_equal(fl_r8_load_type(base, 48, false), base);
    fl_matmul_set_f32_act(true);
    assert_int_equal(fl_r8_load_type(base, 48, true), base);
    fl_matmul_set_f32_act(false);
    fl_free(FL_MEM_MISC, ref, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, got, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, x, (size_t)(M * K) * 4);
    fl_free(FL_MEM_MISC, y0, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, y1, (size_t)(M * N) * 4);
    fl_free(FL_MEM_MISC, fa, (size_t)K * 4);
    fl_free(FL_MEM_MISC, fb, (size_t)K * 4);
    fl_free(FL_MEM_MISC, tmp, 16 * ldw);
    fl_free(FL_MEM_MISC, row, ldw);
    fl_free(FL_MEM_MISC, g, q.bytes);
    fl_act_q8_free(&a);
    qmat_free(&q);
}

static void test_k16(void **state) {
    (void)state;
    check_k16(FL_TYPE_Q4_K);
    check_k16(FL_TYPE_Q5_K);
    check_k16(FL_TYPE_Q6_K);
    check_k16(FL_TYPE_Q3_K);
    check_k16(FL_TYPE_Q2_K);
    check_k16(FL_TYPE_Q4_1);
    check_k16(FL_TYPE_Q5_0);
    check_k16(FL_TYPE_Q5_1);
    check_k16(FL_TYPE_IQ4_NL);
    fl_test_mem_zero();
}

/* fl_matmul_kernel_name follows the dispatch's switches (the benchmarks' labels) */
static void test_kernel_name(void **state) {
    (void)state;
    assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q8_0, 0), "none");
    fl_matmul_set_f32_act(true);
    assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q8_0, 16), "f32");
    fl_matmul_set_f32_act(false);
    assert_string_equal(fl_matmul_kernel_name(FL_TYPE_F16, 16), "f32");
    fl_matmul_set_llama_order(true);
    assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_0, 16), "llama-order");
    fl_matmul_set_llama_order(false);
    fl_isa_set(FL_ISA_REF);
    assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q8_0_R8, 16), "r8-ref");
    fl_isa_set(fl_isa_best());
    if (fl_isa_get() == FL_ISA_AVX512) {
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_0_R8, 16), r8_amx_ok() ? "r8-amx" : "r8-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_0_R8, 10), "r8-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q8_0, 1), "gemv");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K_R16, 1), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K_R16, 32), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K_R16, 33), "panels");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q6_K_R16, 16), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q6_K_R16, 512), "panels");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q5_K_R16, 1), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q3_K_R16, 32), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q2_K_R16, 1), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q2_K_R16, 33), "panels");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q5_0_R16, 1), "r16-vnni");
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_1_R16, 512), "r16-vnni"); /* (no panels: every step) */
        if (fl_amx_bf16_usable()) {
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_0_R8, 512), "amx-bf16");
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K, 64), "amx-bf16");
            fl_matmul_set_amx_bf16(false);
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_0_R8, 512), r8_amx_ok() ? "r8-amx" : "r8-vnni");
            fl_matmul_set_amx_bf16(true);
        }
        if (fl_amx_usable()) {
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K, 32), "amx-int8");
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q8_0, 16), "amx-int8-rows");
            fl_matmul_set_amx(false);
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K, 32), "panels");
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q8_0_R8, 16), "r8-vnni");
            fl_matmul_set_amx(true);
        } else
            assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_K, 32), "panels");
    } else if (fl_isa_get() == FL_ISA_AVX2)
        assert_string_equal(fl_matmul_kernel_name(FL_TYPE_Q4_0_R8, 16), "r8-avx2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_q8_parity),
        cmocka_unit_test(test_alloc_fallbacks),
        cmocka_unit_test(test_f32_dot_orders),
        cmocka_unit_test(test_f32_wrows),
        cmocka_unit_test(test_all_types_vs_ref),
        cmocka_unit_test(test_gemm_vs_gemv),
        cmocka_unit_test(test_panel_parity),
        cmocka_unit_test(test_panel_extremes),
        cmocka_unit_test(test_amx_parity),
        cmocka_unit_test(test_amx_rows),
        cmocka_unit_test(test_amx_bf16),
        cmocka_unit_test(test_matmul_n),
        cmocka_unit_test(test_act_quant_parity),
        cmocka_unit_test(test_gemv_parity),
        cmocka_unit_test(test_gemv_prefetch),
        cmocka_unit_test(test_avx2_kquant_tiles),
        cmocka_unit_test(test_dequant_simd),
        cmocka_unit_test(test_scratch_bytes),
        cmocka_unit_test(test_r8),
        cmocka_unit_test(test_k16),
        cmocka_unit_test(test_kernel_name),
        cmocka_unit_test(test_gemm_shapes_vs_ref_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
