/* The trainer's f32 GEMM (kernels/sgemm.h) against its reference: every transpose and
 * accumulate flag, odd shapes and strides, every ISA this CPU has, 1 and 2 threads; C's
 * padding untouched; the scratch it allocates equal to fl_sgemm_scratch_bytes; the fallback
 * without scratch giving the same bits. */
#include "test.h"

#include "core/threads.h"
#include "kernels/dispatch.h"
#include "kernels/sgemm.h"

#include <stdlib.h>
#include <string.h>

static uint32_t rng_state = 12345;
static float frand(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef struct {
    int64_t M, N, K;
} shape;

static const shape shapes[] = {{1, 1, 1},     {12, 32, 256}, {13, 37, 300}, {5, 70, 513},  {64, 33, 17},
                               {25, 100, 600}, {3, 300, 40},  {40, 4, 64},   {130, 48, 257}, {7, 16, 1000}};
#define SENT 1234.5f

/* A, B of op shapes with padded strides; C with ldc > N filled with SENT */
typedef struct {
    int64_t lda, ldb, ldc, arows, brows;
    float *A, *B, *C, *R;
    size_t abytes, bbytes, cbytes;
} bufs;

static void make(bufs *b, int flags, shape s) {
    const int64_t ar = flags & FL_SGEMM_TA ? s.K : s.M, ac = flags & FL_SGEMM_TA ? s.M : s.K;
    const int64_t br = flags & FL_SGEMM_TB ? s.N : s.K, bc = flags & FL_SGEMM_TB ? s.K : s.N;
    b->lda = ac + 3;
    b->ldb = bc + 5;
    b->ldc = s.N + 7;
    b->arows = ar;
    b->brows = br;
    b->abytes = (size_t)(ar * b->lda) * sizeof(float);
    b->bbytes = (size_t)(br * b->ldb) * sizeof(float);
    b->cbytes = (size_t)((s.M + 1) * b->ldc) * sizeof(float); /* one spare row after C */
    b->A = malloc(b->abytes);
    b->B = malloc(b->bbytes);
    b->C = malloc(b->cbytes);
    b->R = malloc(b->cbytes);
    assert_non_null(b->A);
    assert_non_null(b->B);
    assert_non_null(b->C);
    assert_non_null(b->R);
    for (size_t i = 0; i < b->abytes / sizeof(float); i++) b->A[i] = frand();
    for (size_t i = 0; i < b->bbytes / sizeof(float); i++) b->B[i] = frand();
    for (size_t i = 0; i < b->cbytes / sizeof(float); i++) b->C[i] = SENT;
    for (int64_t i = 0; i < s.M; i++)
        for (int64_t j = 0; j < s.N; j++) b->C[i * b->ldc + j] = frand();
    memcpy(b->R, b->C, b->cbytes);
}

static void drop(bufs *b) {
    free(b->A);
    free(b->B);
    free(b->C);
    free(b->R);
}

/* |got - ref| within a few ulps of the sum of |products| (+ |C| under ACC), for every element;
 * the padding of every row and the spare row still SENT */
static void check(const bufs *b, int flags, shape s, const float *got, const float *ref, const char *what) {
    const int64_t rsa = flags & FL_SGEMM_TA ? 1 : b->lda, csa = flags & FL_SGEMM_TA ? b->lda : 1;
    const int64_t rsb = flags & FL_SGEMM_TB ? 1 : b->ldb, csb = flags & FL_SGEMM_TB ? b->ldb : 1;
    for (int64_t i = 0; i < s.M; i++) {
        for (int64_t j = 0; j < s.N; j++) {
            double mag = flags & FL_SGEMM_ACC ? fabs((double)b->R[i * b->ldc + j]) : 0.0;
            for (int64_t k = 0; k < s.K; k++) mag += fabs((double)b->A[i * rsa + k * csa] * b->B[k * rsb + j * csb]);
            const double d = fabs((double)got[i * b->ldc + j] - ref[i * b->ldc + j]);
            if (!(d <= 4e-7 * mag * (1.0 + (double)s.K / 64.0) + 1e-30))
                fail_msg("%s flags %d M %ld N %ld K %ld: C[%ld][%ld] %.9g vs ref %.9g (|products| %.3g)", what, flags,
                         (long)s.M, (long)s.N, (long)s.K, (long)i, (long)j, got[i * b->ldc + j], ref[i * b->ldc + j], mag);
        }
        for (int64_t j = s.N; j < b->ldc; j++)
            if (got[i * b->ldc + j] != SENT) fail_msg("%s: C[%ld][%ld] past N written", what, (long)i, (long)j);
    }
    for (int64_t j = 0; j < b->ldc; j++)
        if (got[s.M * b->ldc + j] != SENT) fail_msg("%s: the row after C written", what);
}

static void test_against_ref(void **state) {
    (void)state;
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++) {
        fl_isa_set((fl_isa)isa);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int flags = 0; flags < 8; flags++) {
                const shape s = shapes[si];
                bufs b;
                make(&b, flags, s);
                float *ref = malloc(b.cbytes);
                assert_non_null(ref);
                memcpy(ref, b.R, b.cbytes);
                fl_sgemm_ref(flags, s.M, s.N, s.K, b.A, b.lda, b.B, b.ldb, ref, b.ldc);
                float *one = malloc(b.cbytes);
                assert_non_null(one);
                for (int nth = 1; nth <= 2; nth++) {
                    fl_threads_set(nth);
                    memcpy(b.C, b.R, b.cbytes);
                    fl_mem_reset_peaks();
                    const size_t before = fl_mem_current(FL_MEM_SCRATCH);
                    fl_sgemm(flags, s.M, s.N, s.K, b.A, b.lda, b.B, b.ldb, b.C, b.ldc);
                    assert_int_equal(fl_mem_peak(FL_MEM_SCRATCH) - before, fl_sgemm_scratch_bytes(s.M, s.N, s.K, nth));
                    assert_int_equal(fl_mem_current(FL_MEM_SCRATCH), before);
                    check(&b, flags, s, b.C, ref, fl_isa_name((fl_isa)isa));
                    /* the same bits on any number of threads */
                    if (nth == 1) memcpy(one, b.C, b.cbytes);
                    else assert_memory_equal(one, b.C, b.cbytes);
                }
                free(one);
                free(ref);
                drop(&b);
            }
    }
    fl_isa_set(fl_isa_best());
    fl_threads_set(2);
    fl_test_mem_zero();
}

/* The reference itself, against sums in double on a small case, and K = 0 */
static void test_ref_and_edges(void **state) {
    (void)state;
    const shape s = {3, 5, 7};
    bufs b;
    make(&b, FL_SGEMM_ACC, s);
    memcpy(b.C, b.R, b.cbytes);
    fl_sgemm_ref(FL_SGEMM_ACC, s.M, s.N, s.K, b.A, b.lda, b.B, b.ldb, b.C, b.ldc);
    for (int64_t i = 0; i < s.M; i++)
        for (int64_t j = 0; j < s.N; j++) {
            double d = b.R[i * b.ldc + j];
            for (int64_t k = 0; k < s.K; k++) d += (double)b.A[i * b.lda + k] * b.B[k * b.ldb + j];
            CHECK_NEAR(b.C[i * b.ldc + j], d, 1e-5);
        }
    /* K = 0: C zeroed, or left as it is under ACC */
    memcpy(b.C, b.R, b.cbytes);
    fl_sgemm(FL_SGEMM_ACC, s.M, s.N, 0, b.A, b.lda, b.B, b.ldb, b.C, b.ldc);
    assert_memory_equal(b.C, b.R, b.cbytes);
    fl_sgemm(0, s.M, s.N, 0, b.A, b.lda, b.B, b.ldb, b.C, b.ldc);
    for (int64_t i = 0; i < s.M; i++)
        for (int64_t j = 0; j < b.ldc; j++) assert_true(b.C[i * b.ldc + j] == (j < s.N ? 0.0f : SENT));
    assert_int_equal(fl_sgemm_scratch_bytes(s.M, s.N, 0, 2), 0);
    drop(&b);
}

/* No scratch: the same bits as with it, on every ISA, and nothing left allocated */
static void test_no_scratch(void **state) {
    (void)state;
    const shape s = {30, 70, 300};
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++) {
        fl_isa_set((fl_isa)isa);
        for (int flags = 0; flags < 8; flags++) {
            bufs b;
            make(&b, flags, s);
            float *fast = malloc(b.cbytes);
            assert_non_null(fast);
            memcpy(fast, b.R, b.cbytes);
            fl_sgemm(flags, s.M, s.N, s.K, b.A, b.lda, b.B, b.ldb, fast, b.ldc);
            memcpy(b.C, b.R, b.cbytes);
            fl_mem_reset_peaks();
            const size_t before = fl_mem_current(FL_MEM_SCRATCH);
            fl_mem_fail_after(0); /* the next fl_alloc fails */
            fl_sgemm(flags, s.M, s.N, s.K, b.A, b.lda, b.B, b.ldb, b.C, b.ldc);
            fl_mem_fail_after(-1);
            assert_int_equal(fl_mem_peak(FL_MEM_SCRATCH), before); /* it ran without its scratch */
            assert_memory_equal(b.C, fast, b.cbytes);
            free(fast);
            drop(&b);
        }
    }
    fl_isa_set(fl_isa_best());
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_ref),
        cmocka_unit_test(test_ref_and_edges),
        cmocka_unit_test(test_no_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
