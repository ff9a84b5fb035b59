/* The f32 GEMM's AVX2 register tile: 6 rows x 16 columns (12 accumulators, two B vectors, one
 * broadcast of A per row and k).  fl_sgemm_tile_generic is its plain version. */
#include "kernels/sgemm.h"

#include <immintrin.h>

#define MR 6
#define NR 16

static inline __attribute__((always_inline)) void tile_rows(const int MRC, int64_t kc, const float *a, int64_t rsa,
                                                            int64_t csa, const float *bp, float *C, int64_t ldc, int nr,
                                                            int acc) {
    __m256 c0[MR], c1[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MRC; r++) c0[r] = c1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(bp + k * NR), b1 = _mm256_load_ps(bp + k * NR + 8);
        #pragma GCC unroll 16
        for (int r = 0; r < MRC; r++) {
            const __m256 x = _mm256_broadcast_ss(a + r * rsa + k * csa);
            c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MRC; r++) {
        float *p = C + r * ldc;
        if (nr == NR) {
            if (acc) {
                c0[r] = _mm256_add_ps(_mm256_loadu_ps(p), c0[r]);
                c1[r] = _mm256_add_ps(_mm256_loadu_ps(p + 8), c1[r]);
            }
            _mm256_storeu_ps(p, c0[r]);
            _mm256_storeu_ps(p + 8, c1[r]);
        } else {
            float t[NR];
            _mm256_storeu_ps(t, c0[r]);
            _mm256_storeu_ps(t + 8, c1[r]);
            for (int j = 0; j < nr; j++) p[j] = acc ? p[j] + t[j] : t[j];
        }
    }
}

static void tile6(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc, int nr,
                  int acc) {
    tile_rows(6, kc, a, rsa, csa, bp, C, ldc, nr, acc);
}
static void tile4(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc, int nr,
                  int acc) {
    tile_rows(4, kc, a, rsa, csa, bp, C, ldc, nr, acc);
}
static void tile1(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc, int nr,
                  int acc) {
    tile_rows(1, kc, a, rsa, csa, bp, C, ldc, nr, acc);
}

void fl_sgemm_tile_avx2(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc,
                        int mr, int nr, int acc) {
    int r0 = 0;
    if (mr == MR) {
        tile6(kc, a, rsa, csa, bp, C, ldc, nr, acc);
        return;
    }
    if (mr - r0 >= 4) {
        tile4(kc, a, rsa, csa, bp, C, ldc, nr, acc);
        r0 = 4;
    }
    for (; r0 < mr; r0++) tile1(kc, a + r0 * rsa, rsa, csa, bp, C + r0 * ldc, ldc, nr, acc);
}
