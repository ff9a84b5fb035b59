/* The f32 GEMM's AVX-512 register tile (12 rows x 32 columns: 24 accumulators, two B vectors,
 * one broadcast of A per row and k) and the transposing pack of op(B) = B^T (16 x 16 blocks
 * transposed in registers).  fl_sgemm_tile_generic (kernels/ref/sgemm_ref.c) is the plain
 * version of the tile, fl_sgemm_ref the specification. */
#include "kernels/sgemm.h"

#include <immintrin.h>

#define MR 12
#define NR 32

/* rows MRC (a constant once inlined) of the tile; A by rows (csa == 1) or by columns (rsa == 1) */
static inline __attribute__((always_inline)) void tile_rows(const int MRC, const int by_cols, int64_t kc, const float *a,
                                                            int64_t rsa, int64_t csa, const float *bp, float *C,
                                                            int64_t ldc, int nr, int acc) {
    __m512 c0[MR], c1[MR];
    #pragma GCC unroll 16
    for (int r = 0; r < MRC; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    if (by_cols) {
        for (int64_t k = 0; k < kc; k++) {
            const __m512 b0 = _mm512_load_ps(bp + k * NR), b1 = _mm512_load_ps(bp + k * NR + 16);
            const float *ak = a + k * csa;
            #pragma GCC unroll 16
            for (int r = 0; r < MRC; r++) {
                const __m512 x = _mm512_set1_ps(ak[r]);
                c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
                c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
            }
        }
    } else {
        const float *ar[MR];
        #pragma GCC unroll 16
        for (int r = 0; r < MRC; r++) ar[r] = a + r * rsa;
        for (int64_t k = 0; k < kc; k++) {
            const __m512 b0 = _mm512_load_ps(bp + k * NR), b1 = _mm512_load_ps(bp + k * NR + 16);
            #pragma GCC unroll 16
            for (int r = 0; r < MRC; r++) {
                const __m512 x = _mm512_set1_ps(ar[r][k]);
                c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
                c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
            }
        }
    }
    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : (__mmask16)0;
    #pragma GCC unroll 16
    for (int r = 0; r < MRC; r++) {
        float *p = C + r * ldc;
        if (acc) {
            c0[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, p), c0[r]);
            c1[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, p + 16), c1[r]);
        }
        _mm512_mask_storeu_ps(p, m0, c0[r]);
        _mm512_mask_storeu_ps(p + 16, m1, c1[r]);
    }
}

#define TILE_FNS(n)                                                                                                    \
    static void tile##n##_r(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C,           \
                            int64_t ldc, int nr, int acc) {                                                            \
        tile_rows(n, 0, kc, a, rsa, csa, bp, C, ldc, nr, acc);                                                         \
    }                                                                                                                  \
    static void tile##n##_c(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C,           \
                            int64_t ldc, int nr, int acc) {                                                            \
        tile_rows(n, 1, kc, a, rsa, csa, bp, C, ldc, nr, acc);                                                         \
    }
TILE_FNS(12)
TILE_FNS(8)
TILE_FNS(4)
TILE_FNS(2)
TILE_FNS(1)

void fl_sgemm_tile_avx512(int64_t kc, const float *a, int64_t rsa, int64_t csa, const float *bp, float *C, int64_t ldc,
                          int mr, int nr, int acc) {
    const int by_cols = rsa == 1 && csa != 1;
    /* a full tile, else the rows in pieces of 8, 4, 2, 1 (each its own pass over the panel) */
    static void (*const fr[5])(int64_t, const float *, int64_t, int64_t, const float *, float *, int64_t, int, int) = {
        tile12_r, tile8_r, tile4_r, tile2_r, tile1_r};
    static void (*const fc[5])(int64_t, const float *, int64_t, int64_t, const float *, float *, int64_t, int, int) = {
        tile12_c, tile8_c, tile4_c, tile2_c, tile1_c};
    static const int rows[5] = {12, 8, 4, 2, 1};
    int r0 = 0;
    for (int s = 0; s < 5 && r0 < mr; s++)
        while (mr - r0 >= rows[s]) {
            (by_cols ? fc : fr)[s](kc, a + r0 * rsa, rsa, csa, bp, C + r0 * ldc, ldc, nr, acc);
            r0 += rows[s];
        }
}

/* 16 x 16 transpose of r[0..15] in place */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4q + e] now holds, in each 128-bit lane L, rows 4q..4q+3's elements 4L + e */
    for (int i = 0; i < 4; i++) { /* lanes 0,1 of r[i], r[i+4] and of r[i+8], r[i+12] */
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);       /* lanes 0,2 of each */
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);   /* lanes 1,3 */
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

void fl_sgemm_pack_bt_avx512(int64_t kc, int nr, const float *B, int64_t ldb, float *dst, int nrw) {
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16)
        for (int j0 = 0; j0 < nrw; j0 += 16) {
            __m512 r[16];
            for (int j = 0; j < 16; j++)
                r[j] = j0 + j < nr ? _mm512_loadu_ps(B + (j0 + j) * ldb + k) : _mm512_setzero_ps();
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_store_ps(dst + (k + i) * nrw + j0, r[i]);
        }
    for (; k < kc; k++) {
        float *d = dst + k * nrw;
        for (int j = 0; j < nr; j++) d[j] = B[j * ldb + k];
        for (int j = nr; j < nrw; j++) d[j] = 0.0f;
    }
}
