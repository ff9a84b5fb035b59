/* The f32 GEMM's specification (fl_sgemm_ref) and its portable register tile, 4 x 16, which the
 * ref ISA runs (plain C; the compiler vectorizes the 16 columns). */
#include "kernels/sgemm.h"

#include <string.h>

void fl_sgemm_ref(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                  float *C, int64_t ldc) {
    const int64_t rsa = flags & FL_SGEMM_TA ? 1 : lda, csa = flags & FL_SGEMM_TA ? lda : 1;
    const int64_t rsb = flags & FL_SGEMM_TB ? 1 : ldb, csb = flags & FL_SGEMM_TB ? ldb : 1; /* op(B)[k][j] at k * rsb + j * csb */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += A[i * rsa + k * csa] * B[k * rsb + j * csb];
            C[i * ldc + j] = flags & FL_SGEMM_ACC ? C[i * ldc + j] + s : s;
        }
}

#define GMR 4
#define GNR 16

void fl_sgemm_tile_generic(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc,
                           int mr, int nr, int acc) {
    float c[GMR][GNR];
    memset(c, 0, sizeof c);
    for (int64_t k = 0; k < kc; k++) {
        const float *b = bp + k * GNR;
        for (int r = 0; r < mr; r++) {
            const float x = a[r * rsa + k * csa];
            for (int j = 0; j < GNR; j++) c[r][j] += x * b[j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) C[r * ldc + j] = acc ? C[r * ldc + j] + c[r][j] : c[r][j];
}
